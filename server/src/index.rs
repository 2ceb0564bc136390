//! Vector index stage: nearest live vectors of one partition, by cosine similarity (HNSW via `hnsw_rs`).
//!
//! It holds internal ids ([`VectorId`] = the store's `EntryId.0`), their partition and one compact
//! copy of their vector, never a payload: the store owns entries and is the source of truth. The
//! index must never return a removed id or an id of another partition, and must turn a missing or
//! bad dump into an [`IndexError`] (never a panic) so the caller rebuilds from the store.
//!
//! Design:
//! - Vectors are L2-normalized on the way in and held once, as f16 ([`quant`]): 768 bytes for a
//!   384-d vector instead of 1,536 twice, measured to keep recall@1 ≥ 0.99 against f32 where int8
//!   did not quite (`benches/results/2026-12-05-scale.md`). The query stays f32: a sealed graph
//!   scores the rows it keeps with the f32·f16 dot product (its walk reads int8 codes of them), a
//!   growing one's candidates are re-ranked by it.
//! - Every partition is searched on its own. A partition of at most `brute_force_below` live
//!   vectors is *flat*: ids and codes in two contiguous arrays, scanned exactly. A larger one gets a
//!   graph of its own, which holds its codes (the only copy); the index keeps, per graph point (a
//!   *slot*), the id it was inserted for. So a small partition inside a big index is never searched
//!   through a graph full of other partitions' points, and a graph search needs no filter.
//! - A larger partition is flat too until [`HnswIndex::maybe_rebuild`] gives it its graph: for
//!   seconds when it grows past the limit, for half an hour at a million vectors after
//!   [`HnswIndex::build_flat`] (a rebuild from the store serves every vector before the graphs are
//!   built). Past [`SCAN_CHUNK`] rows such a partition is searched by its rows' sign sketches
//!   ([`sketch`], 16 bytes a row, kept beside every flat row), as a recheck searches a sealed
//!   graph: the rows whose sketches differ least from the query's are scored exactly (a
//!   millisecond at 600k rows, where an exact scan took 20), with no permit. An exact scan of
//!   one (more than 64 results wanted, or the sketches off) takes a [`ScanPermit`] on the request
//!   path ([`VectorIndex::search_now`]), one per search thread: a lookup that finds none free is
//!   told so at once ([`ScansBusy`]) rather than queue. While its graph is built the partition's codes are held
//!   three times (the flat rows, the rows copied for the build, the graph's own), four while the
//!   graph is sealed (and its int8 walk codes, half a copy, computed then).
//! - A partition's graph is split into *segments* of at most `segment_points` points (2^20 by
//!   default), each a graph whose points carry the partition's slot numbers as their data ids.
//!   `hnsw_rs` builds every graph; a built one is *sealed* ([`sealed`]): the same points, links
//!   and layers read out into flat arrays (about 1 KB per 384-d vector in all instead of 3.0-4.2 KB,
//!   a search 4-5× cheaper, a dump read straight into its arrays:
//!   `benches/results/2026-12-06-sealed-segments.md`; 1.4 KB since its walk reads int8 codes of the
//!   rows, computed at sealing and loading: `benches/results/2026-12-07-int8-walk.md`), and the
//!   `hnsw_rs` graph freed. Inserts into
//!   a partition that has its graph go to a *growing* segment ([`growing`]), an `hnsw_rs` graph
//!   of at most `seal_points` points with a sign sketch per point beside it, by which it is
//!   searched (its graph is for its sealing), and which the maintenance seals once full.
//!   Segments' results are merged (two or more past [`SCAN_CHUNK`] points searched through a
//!   graph are searched in parallel), each segment costing about one search, so inserts that add
//!   more than [`SEGMENTS_BEFORE_MERGE`] of them get the partition rebuilt; the default keeps a
//!   partition of up to a million vectors in one built graph
//!   (`benches/results/2026-12-06-index-segments.md`).
//! - Per id, one 24-byte [`Placement`] (partition number, slot, version, code digest) in a flat hash
//!   map; no per-entry heap object outside a growing segment's `hnsw_rs` points.
//! - `hnsw_rs` cannot delete, so [`VectorIndex::remove`] only drops the id from the live map (a
//!   tombstone: a graph still routes through the point, results never include it), and
//!   [`HnswIndex::maybe_rebuild`] rebuilds one partition once its tombstones pass a ratio, gives a flat
//!   partition that grew past `brute_force_below` its graph, and makes a graph that shrank to half
//!   of it flat again.
//! - Locks: `state` (an `RwLock`) is read by searches; every change to it first takes `writer` (a
//!   `Mutex`), so a long reader that holds `writer` (save, rebuild snapshot) never has a writer queued
//!   behind it stalling searches. A graph insert runs outside the state lock; a rebuild builds its
//!   graph outside both locks and replays the inserts it missed before swapping.

mod growing;
mod pools;
pub mod quant;
pub mod sealed;
pub mod sketch;

use growing::Growing;
use pools::{on_build_threads, search_pool, search_threads};

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{BufWriter, Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use hnsw_rs::api::AnnT;
use hnsw_rs::hnsw::Hnsw;
use hnsw_rs::hnswio::{HnswIo, ReloadOptions};
use hnsw_rs::prelude::Distance;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::lock::lock;
use half::f16;
use quant::{dot_f32_f16, encode_f16, DistF16};
use sealed::Sealed;

/// The form a vector is held in (see [`quant`] for why f16).
type Code = f16;

/// An indexed vector's id: the store's `EntryId.0`.
pub type VectorId = u64;
/// The partition a vector belongs to: the request's `PartitionKey.0`.
pub type PartitionTag = [u8; 32];

/// One search result.
#[derive(Debug, Clone, PartialEq)]
pub struct Neighbor {
    pub id: VectorId,
    /// Cosine similarity with the query (the f32 query against the stored f16 vector).
    pub similarity: f32,
}

/// The vector index as the rest of the gateway sees it, so a shared backend can replace the embedded one.
pub trait VectorIndex: Send + Sync {
    /// Adds `id`, or replaces its vector and partition. A vector of the wrong dimension or with a
    /// non-finite value is refused with a warning (and any previous vector of `id` removed): the
    /// entry simply stays reachable by exact key only.
    fn insert(&self, id: VectorId, partition: PartitionTag, vector: &[f32]);
    /// Tombstones an id: never returned again (unless inserted again).
    fn remove(&self, id: VectorId);
    /// Best `k` neighbours among live ids of `partition` only, most similar first.
    fn search(&self, partition: &PartitionTag, query: &[f32], k: usize) -> Vec<Neighbor>;
    /// [`VectorIndex::search`] for the request path: `Err(ScansBusy)` at once, instead of a scan,
    /// when the partition is a large flat one (past 32,768 rows and `brute_force_below`: it awaits
    /// its graph after a rebuild from the store) to be scanned exactly (more than 64 results
    /// wanted, or the sketches off by [`IndexConfig::recheck_below`]) and as many such scans run
    /// as there are search threads (the request then goes on without semantic matching rather
    /// than queue); searched by its sketches, it needs no permit. A graph
    /// search whose best result is below `recheck_below` (the similarity the request is served at)
    /// or [`IndexConfig::recheck_below`], whichever is higher (at most 0.99), is rechecked for near
    /// duplicates it may have passed by (see [`sketch`]); a recheck of more than
    /// [`IndexConfig::sketch_chunk`] rows takes such a permit too, and is left out (the graph's
    /// results stand) when none is free.
    fn search_now(
        &self,
        partition: &PartitionTag,
        query: &[f32],
        k: usize,
        recheck_below: f32,
    ) -> Result<Vec<Neighbor>, ScansBusy> {
        let _ = recheck_below;
        Ok(self.search(partition, query, k))
    }
    /// Exact scan of every live vector, across partitions: at most `k` at or above
    /// `min_similarity`, most similar first. For operators (admin search and invalidation), not the
    /// request path.
    fn scan_all(&self, query: &[f32], min_similarity: f32, k: usize) -> Vec<Neighbor>;
    /// Live vectors.
    fn len(&self) -> usize;
    /// Graph points that no longer stand for a live vector (removed or replaced ids).
    fn tombstones(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why [`VectorIndex::search_now`] did not search: the partition is a large flat one awaiting
/// its graph, and as many exact scans of such partitions run as there are search threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScansBusy;

/// Index parameters; [`IndexConfig::new`] gives the defaults for a dimension.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexConfig {
    /// Length of every vector (at least 1).
    pub dimension: usize,
    /// HNSW `M`: links per point and layer (layer 0 keeps twice as many). At most 255.
    pub max_connections: usize,
    pub ef_construction: usize,
    /// Search width; raised to `k` when `k` is larger.
    pub ef_search: usize,
    /// Partitions with at most this many live vectors are held flat and scanned exactly; larger
    /// ones get a graph of their own.
    pub brute_force_below: usize,
    /// A partition's graph is split into graphs of at most this many points (segments), which
    /// load and are searched in parallel: a shorter load, for about one graph's search cost per
    /// segment.
    pub segment_points: usize,
    /// [`HnswIndex::maybe_rebuild`] rebuilds a partition's graph once its tombstones exceed this
    /// share of its points.
    pub rebuild_tombstone_ratio: f32,
    /// Inserts into a partition that has its graph go to an `hnsw_rs` segment of at most this many
    /// points (and `segment_points`), which the maintenance then seals (see [`sealed`]).
    pub seal_points: usize,
    /// A graph search whose best result is less similar than this is checked by a scan of the
    /// segments' sketches for near duplicates it missed (see [`sketch`], [`growing`]); the request path
    /// raises it to its own serving threshold. The default is the gateway's default threshold: a
    /// result above it already is a near duplicate. Below -1, never, and a large flat partition
    /// (awaiting its graph) is scanned exactly rather than searched by its sketches (benches
    /// compare).
    pub recheck_below: f32,
    /// Rows of sketches one task of a sketch search scans at most (4 MB of sketches at the
    /// default 2^18), in a sealed segment's recheck or a large flat partition: each keeps its own
    /// candidates, a million rows are four tasks shared with the search threads (see
    /// [`chunks_of`]), and a recheck of more rows than one task needs a [`ScanPermit`] on the
    /// request path (a flat partition's search needs none).
    pub sketch_chunk: usize,
}

impl IndexConfig {
    pub fn new(dimension: usize) -> Self {
        Self {
            dimension,
            max_connections: 16,
            ef_construction: 200,
            ef_search: 64,
            brute_force_below: 2_000,
            segment_points: 1 << 20,
            rebuild_tombstone_ratio: 0.2,
            seal_points: 1 << 16,
            recheck_below: 0.9,
            sketch_chunk: 1 << 18,
        }
    }

    /// Points a growing segment takes before a new one is started.
    fn growing_points(&self) -> usize {
        self.seal_points.min(self.segment_points)
    }

    /// Clamps values that cannot work: `hnsw_rs` exits the process above 256 connections and dumps
    /// the count as a u8; a width of 0 would find nothing; rows of dimension 0 cannot be sliced.
    fn sanitized(mut self) -> Self {
        self.dimension = self.dimension.max(1);
        self.max_connections = self.max_connections.clamp(2, 255);
        self.ef_construction = self.ef_construction.max(1);
        self.ef_search = self.ef_search.max(1);
        self.segment_points = self.segment_points.max(1);
        self.seal_points = self.seal_points.max(1);
        self.sketch_chunk = self.sketch_chunk.max(1);
        self
    }
}

/// Why a dump could not be loaded; every case means "rebuild from the store".
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("no index dump found")]
    Missing,
    #[error("index dump is corrupt: {0}")]
    Corrupt(String),
    #[error("index dump has dimension {found}, expected {expected}")]
    Dimension { expected: usize, found: usize },
    #[error("index i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Dot product, written so LLVM vectorizes it: 16 independent accumulators let it use SIMD adds
/// without reassociating floating-point sums, which it may not do on its own.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let n = a.len().min(b.len());
    let (chunks_a, tail_a) = a[..n].as_chunks::<LANES>();
    let (chunks_b, tail_b) = b[..n].as_chunks::<LANES>();
    let mut acc = [0.0f32; LANES];
    for (x, y) in chunks_a.iter().zip(chunks_b) {
        for ((s, x), y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    let tail: f32 = tail_a.iter().zip(tail_b).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// Cosine distance for unit f32 vectors, `1 - a·b`: the index's form before f16, kept as the
/// reference the compact forms are measured against (`benches/benches/scale.rs`).
///
/// Clamped at 0 because `hnsw_rs` asserts distances are non-negative (rounding can make `a·a`
/// exceed 1); `max` also maps a NaN to 0, on which `hnsw_rs` would panic.
#[derive(Debug, Clone, Copy, Default)]
pub struct DistDot;

impl Distance<f32> for DistDot {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        (1.0 - dot(a, b)).max(0.0)
    }
}

/// A partition's graph: `hnsw_rs` holds the f16 vectors, so the graph borrows nothing (`'static`).
type Graph = Hnsw<'static, Code, DistF16>;
/// A growing segment: such a graph and its points' sketches ([`growing`]).
type GrowingGraph = Growing<DistF16>;

/// `hnsw_rs` dumps can only be read back with this many layers.
const GRAPH_LAYERS: usize = 16;
/// Allocation hint for a graph that starts empty.
const MIN_CAPACITY: usize = 1_024;
/// A graph search that came back with fewer than `k` live points (tombstones crowd the query) is
/// retried this many times, `ef` multiplied by `WIDEN_FACTOR` each time, then the partition is scanned.
const WIDEN_ATTEMPTS: usize = 3;
const WIDEN_FACTOR: usize = 4;
/// Graph candidates re-ranked with the f32 query per wanted result: the f16 query that guides
/// the graph can swap two very close neighbours, the f32 query rarely does.
const RERANK_PER_RESULT: usize = 8;
/// The id of a graph slot that stands for nothing live (dumps leave removed slots unnamed).
const NO_ID: VectorId = VectorId::MAX;
/// Rows per task of a large flat scan (1-2 ms of dot products here), worth a hand-off to another
/// thread; also the size past which a flat scan needs a [`ScanPermit`] on the request path.
const SCAN_CHUNK: usize = 32_768;
/// A growing segment of at most this many points is scanned exactly instead of searched: at the
/// search width the gateway uses (128), `hnsw_rs`'s search of a graph this small visits most of its
/// points anyway, at several times a scan's cost per point, and a partition that has its graph
/// keeps inserting into a fresh growing segment, which every search of it reads.
const SCAN_GROWING_POINTS: usize = 4_096;

/// Segments a partition's inserts may add to those a rebuild would make before the maintenance
/// merges them (rebuilds the partition): each is searched beside the others.
const SEGMENTS_BEFORE_MERGE: usize = 8;
/// The highest similarity a graph search's best result must reach to skip the recheck, whatever
/// the threshold: a result this near is the query's neighbourhood already.
const RECHECK_AT_MOST: f32 = 0.99;

/// Hashes sequential ids with one multiplication (Fibonacci hashing): the live map is probed for
/// every graph result and SipHash would cost more than the probe.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(*byte));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type IdMap<V> = HashMap<VectorId, V, BuildHasherDefault<IdHasher>>;
type IdSet = HashSet<VectorId, BuildHasherDefault<IdHasher>>;

/// A live id: its partition (an index into [`State::parts`]), where its code sits, which insert put
/// it there, and a digest of the code (so re-inserting the same vector adds no graph point).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Placement {
    part: u32,
    /// Row of a flat partition, or graph slot (`hnsw_rs` data id) of a graph partition.
    slot: u32,
    /// Tells a rebuild's replay whether its logged insert is still the current one.
    version: u64,
    digest: u32,
}

/// FNV-1a of a code: equality check for re-inserts, not a security boundary.
fn digest(code: &[Code]) -> u32 {
    code.iter().fold(0x811c_9dc5u32, |h, c| {
        (h ^ u32::from(c.to_bits())).wrapping_mul(0x0100_0193)
    })
}

/// A small partition: row `i` is `ids[i]`'s code, contiguous for fast exact scans, and
/// `sketches[i]` its sign sketch, by which a large one awaiting its graph is searched (see
/// [`State::flat_near_duplicates`]).
#[derive(Default)]
struct Flat {
    ids: Vec<VectorId>,
    codes: Vec<Code>,
    sketches: Vec<sketch::Sketch>,
}

/// A large partition's own graph, in segments (oldest first); the point whose data id is `slot`,
/// in whichever segment, was inserted for `slots[slot]`.
struct OwnGraph {
    segments: Vec<Segment>,
    slots: Vec<VectorId>,
}

/// One graph of a partition's: an `hnsw_rs` graph while it takes inserts, then [`Sealed`] (the same
/// graph in flat arrays) once it is full or was built whole.
#[derive(Clone)]
enum Segment {
    Growing(Arc<GrowingGraph>),
    Sealed(Arc<Sealed>),
}

impl Segment {
    fn points(&self) -> usize {
        match self {
            Segment::Growing(g) => g.len(),
            Segment::Sealed(s) => s.len(),
        }
    }

    /// Calls `f(slot, code)` for every point.
    fn for_each_row(&self, mut f: impl FnMut(usize, &[Code])) {
        match self {
            Segment::Growing(g) => {
                sealed::each_point(g.graph(), |p| f(p.get_origin_id(), p.get_v()))
            }
            Segment::Sealed(s) => s.rows().for_each(|(slot, code)| f(slot, code)),
        }
    }

    /// The best `wanted` points for which `live(slot)` names an id, among the `ef` the graph search
    /// finds, scored with the f32 query. With the query's sketch, a growing segment that is not
    /// scanned exactly is searched by its points' sketches instead of `hnsw_rs`'s graph (see
    /// [`Segment::by_sketch`]).
    fn search(
        &self,
        Query {
            vector: query,
            code,
            sketch,
        }: Query<'_>,
        ef: usize,
        wanted: usize,
        live: impl Fn(usize) -> Option<VectorId>,
    ) -> Vec<Neighbor> {
        if wanted == 0 {
            return Vec::new();
        }
        match self {
            Segment::Growing(growing) if growing.len() <= SCAN_GROWING_POINTS => {
                let mut found = Vec::with_capacity(growing.len());
                self.for_each_row(|slot, code| {
                    if let Some(id) = live(slot) {
                        let similarity = dot_f32_f16(query, code);
                        found.push(Neighbor { id, similarity });
                    }
                });
                top_k(found, wanted)
            }
            Segment::Growing(growing) if let Some(sketch) = sketch => {
                let found = growing.near_duplicates(query, sketch, |slot| live(slot).is_some());
                named(found, &live).take(wanted).collect()
            }
            Segment::Growing(growing) => {
                let graph = growing.graph();
                let points = graph.get_point_indexation();
                graph
                    .search(code, ef, ef)
                    .into_iter()
                    .filter_map(|n| Some((live(n.d_id)?, n.p_id)))
                    .take(wanted)
                    .filter_map(|(id, p_id)| {
                        Some(Neighbor {
                            id,
                            similarity: dot_f32_f16(query, &points.get_point_data(&p_id)?),
                        })
                    })
                    .collect()
            }
            Segment::Sealed(sealed) => named(sealed.search(query, ef), &live)
                .take(wanted)
                .collect(),
        }
    }
}

/// A segment's `(slot, similarity)` results as neighbours, those whose slot `live` names an id.
fn named(
    found: Vec<(usize, f32)>,
    live: impl Fn(usize) -> Option<VectorId>,
) -> impl Iterator<Item = Neighbor> {
    found.into_iter().filter_map(move |(slot, similarity)| {
        Some(Neighbor {
            id: live(slot)?,
            similarity,
        })
    })
}

impl Segment {
    /// Whether a search given the query's sketch reads this segment by its sketches: a growing
    /// one larger than [`SCAN_GROWING_POINTS`]. `hnsw_rs`'s search of its graph (up to 65,536
    /// points) cost 2.4-2.7 ms p50 at ef 128 (60,000 points beside a sealed graph of 200,000),
    /// five times the sealed graph's, and made most of a search's time in a cache being written
    /// to; a scan of its sketches (1 MB) and the 64 candidates scored exactly cost a few hundredths
    /// of that and find the near duplicates a cache serves, as a large flat partition's search does
    /// (`benches/results/2026-12-07-growing-recheck.md`).
    fn by_sketch(&self) -> bool {
        matches!(self, Segment::Growing(g) if g.len() > SCAN_GROWING_POINTS)
    }
}

/// A query in the forms segments read it: the L2-normalized f32 vector rows are scored with, its
/// f16 code that guides `hnsw_rs`, and its sketch when large growing segments are searched by
/// their sketches.
#[derive(Clone, Copy)]
struct Query<'a> {
    vector: &'a [f32],
    code: &'a [Code],
    sketch: Option<sketch::Sketch>,
}

/// The segment of `segments` the next point goes to: the last one while it is growing and holds
/// fewer than `limit` points; `None` when a new one must be started.
fn open_segment(segments: &[Segment], limit: usize) -> Option<Arc<GrowingGraph>> {
    match segments.last() {
        Some(Segment::Growing(g)) if g.len() < limit => Some(Arc::clone(g)),
        _ => None,
    }
}

impl OwnGraph {
    /// Calls `f(slot, code)` for every point of every segment.
    fn for_each_row(&self, mut f: impl FnMut(usize, &[Code])) {
        for segment in &self.segments {
            segment.for_each_row(&mut f);
        }
    }

    /// The sealed segments: what a recheck scans the sketches of in chunks.
    fn sealed(&self) -> impl Iterator<Item = &Sealed> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Sealed(s) => Some(s.as_ref()),
            Segment::Growing(_) => None,
        })
    }

    /// The growing segments a search does not scan exactly: what a recheck scans the sketches of
    /// whole, on the caller's thread (65,536 rows at most, a few tens of microseconds), when the
    /// search went through their graphs.
    fn searched_growing(&self) -> impl Iterator<Item = &GrowingGraph> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Growing(g) if s.by_sketch() => Some(g.as_ref()),
            _ => None,
        })
    }

    /// Rows in sealed segments.
    fn sealed_rows(&self) -> usize {
        self.sealed().map(Sealed::len).sum()
    }
}

enum Body {
    Flat(Flat),
    Graph(OwnGraph),
}

struct Part {
    tag: PartitionTag,
    /// Live ids in this partition.
    live: usize,
    body: Body,
}

impl Part {
    /// Whether it is flat though past `limit` live vectors: it awaits the graph
    /// [`HnswIndex::maybe_rebuild`] gives it (what `graphs_pending` counts).
    fn awaits_graph(&self, limit: usize) -> bool {
        matches!(self.body, Body::Flat(_)) && self.live > limit
    }

    fn points(&self) -> usize {
        match &self.body {
            Body::Flat(_) => 0,
            Body::Graph(g) => g.slots.len(),
        }
    }
}

/// Live rows gathered for a rebuild: flat arrays, row `i` is `ids[i]`.
#[derive(Default)]
struct Rows {
    ids: Vec<VectorId>,
    versions: Vec<u64>,
    digests: Vec<u32>,
    codes: Vec<Code>,
    /// The rows' sketches when they are to be a flat partition, computed on the build threads
    /// before the state is locked; a row past them (an insert replayed after) is sketched by
    /// [`install`].
    sketches: Vec<sketch::Sketch>,
}

impl Rows {
    fn push(&mut self, id: VectorId, version: u64, digest: u32, code: &[Code]) {
        self.ids.push(id);
        self.versions.push(version);
        self.digests.push(digest);
        self.codes.extend_from_slice(code);
    }
}

struct State {
    dimension: usize,
    live: IdMap<Placement>,
    /// Partitions, never removed (an emptied one is a few bytes), so `Placement::part` stays valid.
    parts: Vec<Part>,
    part_of: HashMap<PartitionTag, u32>,
    next_version: u64,
}

impl State {
    fn empty(config: &IndexConfig) -> Self {
        Self {
            dimension: config.dimension,
            live: IdMap::default(),
            parts: Vec::new(),
            part_of: HashMap::new(),
            next_version: 0,
        }
    }

    fn tombstones(&self) -> usize {
        self.parts
            .iter()
            .map(|p| p.points().saturating_sub(p.live))
            .sum()
    }

    /// The partition's number, a new flat one if it has none yet.
    fn part_index(&mut self, tag: PartitionTag) -> u32 {
        if let Some(idx) = self.part_of.get(&tag) {
            return *idx;
        }
        let idx = u32::try_from(self.parts.len()).unwrap_or(u32::MAX);
        self.parts.push(Part {
            tag,
            live: 0,
            body: Body::Flat(Flat::default()),
        });
        self.part_of.insert(tag, idx);
        idx
    }

    fn part(&self, idx: u32) -> Option<&Part> {
        self.parts.get(idx as usize)
    }

    /// Records `id` as live at `slot` of partition `part` and returns the insert's version.
    fn place(&mut self, id: VectorId, part: u32, slot: u32, digest: u32) -> u64 {
        self.next_version += 1;
        let version = self.next_version;
        let placement = Placement {
            part,
            slot,
            version,
            digest,
        };
        if let Some(p) = self.parts.get_mut(part as usize) {
            p.live += 1;
        }
        self.live.insert(id, placement);
        version
    }

    /// Appends `id`'s code and its sketch to a flat partition; the caller has unset `id`.
    fn push_flat(&mut self, id: VectorId, part: u32, code: &[Code], sketch: sketch::Sketch) -> u64 {
        let Some(Body::Flat(flat)) = self.parts.get_mut(part as usize).map(|p| &mut p.body) else {
            return 0;
        };
        let slot = u32::try_from(flat.ids.len()).unwrap_or(u32::MAX);
        flat.ids.push(id);
        flat.codes.extend_from_slice(code);
        flat.sketches.push(sketch);
        self.place(id, part, slot, digest(code))
    }

    /// Drops `id` from the live map; a flat partition's last row moves into its row, a graph keeps
    /// the point as a tombstone.
    fn unset(&mut self, id: VectorId) {
        let Some(old) = self.live.remove(&id) else {
            return;
        };
        let dim = self.dimension;
        let Some(part) = self.parts.get_mut(old.part as usize) else {
            return;
        };
        part.live = part.live.saturating_sub(1);
        let Body::Flat(rows) = &mut part.body else {
            return;
        };
        let slot = old.slot as usize;
        let last = rows.ids.len().saturating_sub(1);
        debug_assert_eq!(rows.sketches.len(), rows.ids.len(), "a sketch per flat row");
        if slot < rows.ids.len() {
            rows.ids.swap_remove(slot);
            if slot < rows.sketches.len() {
                rows.sketches.swap_remove(slot);
            }
            if slot < last {
                rows.codes
                    .copy_within(last * dim..(last + 1) * dim, slot * dim);
                if let Some(moved) = self.live.get_mut(&rows.ids[slot]) {
                    moved.slot = old.slot;
                }
            }
            rows.codes.truncate(last * dim);
        }
    }

    /// Whether graph point `slot` of partition `part` is the current vector of a live id; the id.
    fn live_slot(&self, part: u32, graph: &OwnGraph, slot: usize) -> Option<VectorId> {
        let id = *graph.slots.get(slot)?;
        let live = self.live.get(&id)?;
        (live.part == part && live.slot as usize == slot).then_some(id)
    }

    /// The live rows of partition `part`, for a rebuild outside the lock.
    fn rows(&self, part: u32) -> Rows {
        let mut rows = Rows::default();
        let Some(p) = self.part(part) else {
            return rows;
        };
        let dim = self.dimension;
        let placed = |id: &VectorId| self.live.get(id).copied();
        match &p.body {
            Body::Flat(flat) => {
                for (id, code) in flat.ids.iter().zip(flat.codes.chunks_exact(dim)) {
                    if let Some(l) = placed(id) {
                        rows.push(*id, l.version, l.digest, code);
                    }
                }
            }
            Body::Graph(g) => {
                // A point whose code is not its id's (an insert that panicked half way leaves one
                // behind under the slot the next insert reuses) is left out, and each id taken once.
                let mut taken = IdSet::default();
                g.for_each_row(|slot, code| {
                    if let Some(id) = self.live_slot(part, g, slot) {
                        if let Some(l) = placed(&id) {
                            if l.digest == digest(code) && taken.insert(id) {
                                rows.push(id, l.version, l.digest, code);
                            }
                        }
                    }
                })
            }
        }
        rows
    }

    /// Exact scan of a flat partition. One larger than [`SCAN_CHUNK`] rows (a partition awaiting
    /// its graph after a rebuild from the store) is scanned in chunks in parallel on
    /// [`search_pool`].
    fn scan_flat(&self, rows: &Flat, query: &[f32], k: usize) -> Vec<Neighbor> {
        let dim = self.dimension;
        let scan = |(ids, codes): (&[VectorId], &[Code])| {
            best_k(
                ids.iter()
                    .zip(codes.chunks_exact(dim))
                    .map(|(id, code)| Neighbor {
                        id: *id,
                        similarity: dot_f32_f16(query, code),
                    }),
                k,
            )
        };
        if rows.ids.len() <= SCAN_CHUNK {
            return scan((&rows.ids, &rows.codes));
        }
        let chunks = rows
            .ids
            .chunks(SCAN_CHUNK)
            .zip(rows.codes.chunks(SCAN_CHUNK * dim));
        let found = match search_pool() {
            Some(pool) => pool.install(|| {
                chunks
                    .collect::<Vec<_>>()
                    .into_par_iter()
                    .flat_map_iter(scan)
                    .collect()
            }),
            None => chunks.flat_map(scan).collect(),
        };
        top_k(found, k)
    }

    /// Exact scan of a graph's live points (a fallback, and for operators).
    fn scan_graph(&self, part: u32, graph: &OwnGraph, query: &[f32], k: usize) -> Vec<Neighbor> {
        let mut found = Vec::new();
        graph.for_each_row(|slot, code| {
            if let Some(id) = self.live_slot(part, graph, slot) {
                found.push(Neighbor {
                    id,
                    similarity: dot_f32_f16(query, code),
                });
            }
        });
        top_k(found, k)
    }

    /// Graph search: live points only (a replaced vector's old point is skipped by its slot), the
    /// best `k · RERANK_PER_RESULT` of each segment scored with the f32 query; with the query's
    /// `sketch`, large growing segments searched by their sketches ([`Segment::by_sketch`]). Two or
    /// more large segments searched through a graph are searched in parallel on [`search_pool`].
    fn graph_search(
        &self,
        part: u32,
        graph: &OwnGraph,
        query: Query<'_>,
        k: usize,
        ef: usize,
    ) -> Vec<Neighbor> {
        let search = |segment: &Segment| -> Vec<Neighbor> {
            let wanted = k.saturating_mul(RERANK_PER_RESULT);
            let live = |slot| self.live_slot(part, graph, slot);
            top_k(segment.search(query, ef, wanted, live), k)
        };
        if let [one] = graph.segments.as_slice() {
            return search(one);
        }
        // A hand-off to the search threads costs more than the search of a growing segment of a
        // few thousand points, or of a large one by its sketches: only large segments searched
        // through a graph are worth searching side by side.
        let large = graph
            .segments
            .iter()
            .filter(|s| s.points() > SCAN_CHUNK && !(query.sketch.is_some() && s.by_sketch()))
            .count();
        let found = match search_pool() {
            Some(pool) if large > 1 => {
                pool.install(|| graph.segments.par_iter().flat_map_iter(search).collect())
            }
            _ => graph.segments.iter().flat_map(search).collect(),
        };
        top_k(found, k)
    }
}

/// Where a recheck looks: partition `part`'s `graph`, its sealed segments in tasks of at most
/// `chunk` rows.
#[derive(Clone, Copy)]
struct Recheck<'a> {
    part: u32,
    graph: &'a OwnGraph,
    chunk: usize,
}

impl State {
    /// The live near duplicates of `query` in `graph`'s segments, found by their sketches (see
    /// [`sketch`]): the recheck of a graph search that found nothing near. Sealed segments are
    /// scanned in chunks shared with the search threads. Growing ones larger than
    /// [`SCAN_GROWING_POINTS`] are scanned too, whole on this thread ([`growing`]), unless the
    /// search read them by their sketches already: then it passes the query's `searched` sketch,
    /// which is not computed twice. A smaller growing one was scanned exactly by the search.
    fn near_duplicates(
        &self,
        planes: &sketch::Planes,
        Recheck { part, graph, chunk }: Recheck<'_>,
        query: &[f32],
        k: usize,
        searched: Option<sketch::Sketch>,
    ) -> Vec<Neighbor> {
        let chunks: Vec<(&Sealed, std::ops::Range<usize>)> = graph
            .sealed()
            .flat_map(|s| {
                chunks_of(s.len(), chunk)
                    .into_iter()
                    .map(move |rows| (s, rows))
            })
            .collect();
        let growing: Vec<&GrowingGraph> = match searched {
            None => graph.searched_growing().collect(),
            Some(_) => Vec::new(),
        };
        if chunks.is_empty() && growing.is_empty() {
            return Vec::new();
        }
        let sketch = searched.unwrap_or_else(|| planes.sketch(query));
        let live = |slot| self.live_slot(part, graph, slot).is_some();
        let neighbors = |found: Vec<(usize, f32)>| {
            named(found, |slot| self.live_slot(part, graph, slot)).collect::<Vec<_>>()
        };
        let scan = |(sealed, rows): &(&Sealed, std::ops::Range<usize>)| {
            neighbors(sealed.near_duplicates(query, sketch, rows.clone(), live))
        };
        let mut found = shared(&chunks, graph.sealed_rows() > chunk, scan);
        for segment in growing {
            found.extend(neighbors(segment.near_duplicates(query, sketch, live)));
        }
        top_k(found, k)
    }

    /// The near duplicates of `query` among a flat partition's rows, found by their sketches as a
    /// recheck finds a graph's: each chunk of `chunk` rows keeps the [`sketch::CANDIDATES`] whose
    /// sketches differ least from the query's, scored exactly. For a large partition awaiting its
    /// graph (a gateway rebuilding a million vectors from its store has half an hour of them):
    /// 16 bytes read per row instead of a row's 768, so a search of 600k rows costs about a
    /// millisecond instead of 20. Like a graph search it is approximate: a near duplicate
    /// (cosine 0.9 or more: about 18 of 128 bits differ, against 64 for an unrelated row) is among
    /// the candidates, a row far from the query may not be. Every row of a flat partition is live
    /// (a removal moves the last row into its place), so no row is asked about.
    fn flat_near_duplicates(
        &self,
        planes: &sketch::Planes,
        flat: &Flat,
        query: &[f32],
        k: usize,
        chunk: usize,
    ) -> Vec<Neighbor> {
        let dim = self.dimension;
        let sketch = planes.sketch(query);
        let chunks = chunks_of(flat.sketches.len(), chunk);
        let scan = |rows: &std::ops::Range<usize>| {
            let (Some(sketches), Ok(first)) =
                (flat.sketches.get(rows.clone()), u32::try_from(rows.start))
            else {
                return Vec::new();
            };
            sketch::nearest(sketches, first, sketch, sketch::CANDIDATES, |_| true)
                .into_iter()
                .filter_map(|(_, row)| {
                    let row = row as usize;
                    Some(Neighbor {
                        id: *flat.ids.get(row)?,
                        similarity: dot_f32_f16(query, flat.codes.get(row * dim..(row + 1) * dim)?),
                    })
                })
                .collect()
        };
        top_k(shared(&chunks, flat.sketches.len() > chunk, scan), k)
    }
}

/// `0..len` as the tasks of a sketch search: ranges of at most `chunk` rows, as many as that
/// takes rounded up to a multiple of the search threads when there is more than one, and of one
/// size, so that the caller's share and each other thread's take as long ([`shared`]). In chunks
/// of 2^18 rows, 600k rows were 524k for the caller and 76k for the other thread.
fn chunks_of(len: usize, chunk: usize) -> Vec<std::ops::Range<usize>> {
    let threads = search_threads();
    let mut tasks = len.div_ceil(chunk.max(1));
    if tasks > 1 {
        tasks = tasks.div_ceil(threads) * threads;
    }
    let size = len.div_ceil(tasks.max(1)).max(1);
    (0..len)
        .step_by(size)
        .map(|start| start..(start + size).min(len))
        .collect()
}

/// Runs `scan` over `chunks` and gathers what it found: on this thread alone, or with `parallel`,
/// shared with the search threads, the caller scanning a share itself rather than sleeping while
/// they scan it all (a sketch scan is a few tenths of a millisecond of work, of which waking a
/// thread and being woken again took as much).
fn shared<C: Sync>(
    chunks: &[C],
    parallel: bool,
    scan: impl Fn(&C) -> Vec<Neighbor> + Sync,
) -> Vec<Neighbor> {
    let threads = search_threads();
    match search_pool() {
        Some(pool) if parallel && threads > 1 && !chunks.is_empty() => {
            let shares: Vec<&[C]> = chunks.chunks(chunks.len().div_ceil(threads)).collect();
            let mut found: Vec<Vec<Neighbor>> = vec![Vec::new(); shares.len()];
            let scan = &scan;
            pool.in_place_scope(|scope| {
                let (mine, theirs) = found.split_at_mut(1);
                for (out, share) in theirs.iter_mut().zip(&shares[1..]) {
                    scope.spawn(move |_| *out = share.iter().flat_map(scan).collect());
                }
                mine[0] = shares[0].iter().flat_map(scan).collect();
            });
            found.into_iter().flatten().collect()
        }
        _ => chunks.iter().flat_map(scan).collect(),
    }
}

/// `a` and `b` as one list, each id once (at its best similarity), most similar first, at most
/// `k`.
fn merged(mut a: Vec<Neighbor>, b: Vec<Neighbor>, k: usize) -> Vec<Neighbor> {
    a.extend(b);
    // An id found both ways is nearly always the same row with the same score, but a stale row an
    // interrupted insert left in another segment scores otherwise: keep the first, the best.
    a.sort_unstable_by(by_similarity);
    let mut seen = HashSet::with_capacity(a.len());
    a.retain(|n| seen.insert(n.id));
    a.truncate(k);
    a
}

/// What [`HnswIndex::seal_one`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seal {
    Done,
    Nothing,
    /// A segment of this partition could not be sealed.
    Failed(u32),
}

/// Whether a build makes the large partitions' graphs ([`HnswIndex::build`]) or leaves them to
/// [`HnswIndex::maybe_rebuild`] ([`HnswIndex::build_flat`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Graphs {
    Now,
    Later,
}

/// A rebuild in progress: its partition, and the inserts into it made meanwhile
/// (id, version, digest, code), replayed into the new body before the swap.
struct Replay {
    part: u32,
    log: Vec<(VectorId, u64, u32, Vec<Code>)>,
}

/// State of the graph writers, behind the `writer` mutex.
#[derive(Default)]
struct Writer {
    replay: Option<Replay>,
}

/// The embedded HNSW index. See the module comment for the locking scheme.
pub struct HnswIndex {
    config: IndexConfig,
    state: RwLock<State>,
    writer: Mutex<Writer>,
    /// Exact scans of partitions awaiting their graph that run now, for [`VectorIndex::search_now`].
    large_scans: AtomicUsize,
    /// The sketch planes of the configured dimension, for the queries of rechecks.
    planes: Arc<sketch::Planes>,
}

/// One of the exact scans of a partition awaiting its graph that may run at once (one per search
/// thread): a scan of 600k rows is milliseconds of every core, so more would only queue.
struct ScanPermit<'a>(&'a AtomicUsize);

impl<'a> ScanPermit<'a> {
    fn take(running: &'a AtomicUsize) -> Result<Self, ScansBusy> {
        let most = search_threads();
        running
            .fetch_update(AtomicOrdering::AcqRel, AtomicOrdering::Acquire, |n| {
                (n < most).then_some(n + 1)
            })
            .map(|_| Self(running))
            .map_err(|_| ScansBusy)
    }
}

impl Drop for ScanPermit<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AtomicOrdering::AcqRel);
    }
}

// A panic under a lock can only come from `hnsw_rs` internals during a graph insert, before the
// maps are touched, so the state behind a poisoned lock is still consistent.
fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}
fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
fn new_graph(config: &IndexConfig, capacity: usize) -> Graph {
    let mut graph = Hnsw::new(
        config.max_connections,
        capacity.max(MIN_CAPACITY),
        GRAPH_LAYERS,
        config.ef_construction,
        DistF16,
    );
    graph.set_extend_candidates(false);
    graph
}

/// Drops a replaced body or graph on the build threads: `hnsw_rs` frees a graph with a parallel
/// loop, which would otherwise take rayon's global pool at the requests' priority.
fn free_on_build_threads<T: Send>(old: T) {
    on_build_threads(move || drop(old));
}

/// Builds the segments of a graph whose slot `i` is row `i` of `codes`: as few as
/// `segment_points` allows, of equal size, each with `hnsw_rs`'s rayon-parallel insertion (all
/// cores, on the build threads), then sealed (the `hnsw_rs` graph freed there); one that cannot be
/// sealed (it is empty) is left growing.
fn build_graph(config: &IndexConfig, codes: &[Code]) -> Vec<Segment> {
    build_hnsw(config, codes)
        .into_iter()
        .map(|graph| match seal(config, &graph) {
            Some(sealed) => {
                free_on_build_threads(graph);
                Segment::Sealed(Arc::new(sealed))
            }
            None => Segment::Growing(Arc::new(Growing::new(graph, config.dimension))),
        })
        .collect()
}

/// [`build_graph`]'s `hnsw_rs` graphs, before they are sealed.
fn build_hnsw(config: &IndexConfig, codes: &[Code]) -> Vec<Graph> {
    let dim = config.dimension;
    let rows = codes.len() / dim;
    let per_segment = rows
        .div_ceil(rows.div_ceil(config.segment_points).max(1))
        .max(1);
    codes
        .chunks(per_segment * dim)
        .enumerate()
        .map(|(n, chunk)| {
            let first = n * per_segment;
            let batch: Vec<(&[Code], usize)> = chunk
                .chunks_exact(dim)
                .enumerate()
                .map(|(row, code)| (code, first + row))
                .collect();
            let graph = new_graph(config, batch.len());
            on_build_threads(|| graph.parallel_insert_slice(&batch));
            graph
        })
        .collect()
}

/// `graph` sealed (the conversion on the build threads); `None` if it cannot be (it is empty, or
/// repeats a slot).
fn seal(config: &IndexConfig, graph: &Graph) -> Option<Sealed> {
    on_build_threads(|| Sealed::from_graph(graph, config.dimension))
}

/// A new, empty growing segment.
fn new_growing(config: &IndexConfig) -> Arc<GrowingGraph> {
    let graph = new_graph(config, config.growing_points());
    Arc::new(Growing::new(graph, config.dimension))
}

/// Adds `code` as point `slot` to the open segment of `segments`, starting a new one when the
/// last is full or sealed.
fn append_point(config: &IndexConfig, segments: &mut Vec<Segment>, code: &[Code], slot: usize) {
    let segment = open_segment(segments, config.growing_points()).unwrap_or_else(|| {
        let segment = new_growing(config);
        segments.push(Segment::Growing(Arc::clone(&segment)));
        segment
    });
    segment.insert(code, slot);
}

/// Checks and L2-normalizes a vector; `None` when it cannot be indexed or searched.
fn normalized(vector: &[f32], dimension: usize) -> Option<Vec<f32>> {
    if vector.len() != dimension || !vector.iter().all(|x| x.is_finite()) {
        return None;
    }
    let norm = dot(vector, vector).sqrt();
    // A zero vector stays zero: similarity 0 to everything, rather than a division by zero.
    let scale = if norm > 0.0 && norm.is_finite() {
        1.0 / norm
    } else {
        1.0
    };
    Some(vector.iter().map(|x| x * scale).collect())
}

/// Most similar first; ties by id so results are deterministic.
fn by_similarity(a: &Neighbor, b: &Neighbor) -> Ordering {
    b.similarity
        .total_cmp(&a.similarity)
        .then_with(|| a.id.cmp(&b.id))
}

/// The best `k` of `found`, most similar first, in one pass holding at most `2k` of them (a flat
/// scan of hundreds of thousands of rows allocates nothing in proportion). `k` may be
/// `usize::MAX` (an operator's "every match": then it keeps them all).
fn best_k(found: impl Iterator<Item = Neighbor>, k: usize) -> Vec<Neighbor> {
    if k == 0 {
        return Vec::new();
    }
    let cut = k.saturating_mul(2);
    let mut best = Vec::with_capacity(cut.min(found.size_hint().0).min(1 << 16));
    // The k-th best so far, once `best` has been cut down to k: anything not better is skipped.
    let mut floor: Option<Neighbor> = None;
    for n in found {
        if floor
            .as_ref()
            .is_some_and(|f| by_similarity(&n, f) != Ordering::Less)
        {
            continue;
        }
        best.push(n);
        if best.len() >= cut {
            best.select_nth_unstable_by(k - 1, by_similarity);
            best.truncate(k);
            floor = best.get(k - 1).cloned();
        }
    }
    top_k(best, k)
}

fn top_k(mut found: Vec<Neighbor>, k: usize) -> Vec<Neighbor> {
    if found.len() > k {
        found.select_nth_unstable_by(k - 1, by_similarity);
        found.truncate(k);
    }
    found.sort_unstable_by(by_similarity);
    found
}

/// Puts `rows` into partition `part`, as `graph` when given (its slot `i` is row `i`), else flat,
/// and places every id of `rows` for which `keep(id, version)` holds.
fn install(
    config: &IndexConfig,
    state: &mut State,
    part: u32,
    rows: &Rows,
    graph: Option<Vec<Segment>>,
    keep: impl Fn(&State, VectorId, u64) -> bool,
) -> Option<Body> {
    let dim = config.dimension;
    let mut flat = Flat::default();
    let planes = sketch::Planes::of(dim);
    if graph.is_none() {
        // Sized once, with room for the inserts made until its graph is built: a large partition
        // left flat is hundreds of MB of codes, and growing it doubles and copies them under the
        // state's write lock, stalling every search for as long.
        let rows_wanted = rows.ids.len() + rows.ids.len() / 8 + 1024;
        flat.ids.reserve_exact(rows_wanted);
        flat.codes.reserve_exact(rows_wanted * dim);
        flat.sketches.reserve_exact(rows_wanted);
    }
    let mut placed = Vec::new();
    for (row, ((id, version), code)) in rows
        .ids
        .iter()
        .zip(&rows.versions)
        .zip(rows.codes.chunks_exact(dim))
        .enumerate()
    {
        if !keep(state, *id, *version) {
            continue;
        }
        let slot = if graph.is_some() {
            row
        } else {
            flat.ids.push(*id);
            flat.codes.extend_from_slice(code);
            let sketch = rows.sketches.get(row).copied();
            flat.sketches
                .push(sketch.unwrap_or_else(|| planes.sketch_row(code)));
            flat.ids.len() - 1
        };
        placed.push((
            *id,
            u32::try_from(slot).unwrap_or(u32::MAX),
            rows.digests[row],
        ));
    }
    let body = match graph {
        Some(segments) => Body::Graph(OwnGraph {
            segments,
            slots: rows.ids.clone(),
        }),
        None => Body::Flat(flat),
    };
    let p = state.parts.get_mut(part as usize)?;
    let old = std::mem::replace(&mut p.body, body);
    p.live = 0;
    for (id, slot, digest) in placed {
        if let Some(l) = state.live.get_mut(&id) {
            // An id placed before (a rebuild): same version, new slot.
            l.slot = slot;
            if let Some(p) = state.parts.get_mut(part as usize) {
                p.live += 1;
            }
        } else {
            state.place(id, part, slot, digest);
        }
    }
    Some(old)
}

impl HnswIndex {
    pub fn new(config: IndexConfig) -> Self {
        Self::from_state(config.sanitized(), None)
    }

    fn from_state(config: IndexConfig, state: Option<State>) -> Self {
        Self {
            state: RwLock::new(state.unwrap_or_else(|| State::empty(&config))),
            writer: Mutex::new(Writer::default()),
            large_scans: AtomicUsize::new(0),
            planes: sketch::Planes::of(config.dimension),
            config,
        }
    }

    /// Builds from `(id, partition, vector)` triples: each vector is encoded as it is consumed,
    /// then every large partition's graph is built with all cores. Invalid vectors are skipped as
    /// in [`VectorIndex::insert`]; a repeated id keeps its last vector.
    pub fn build(
        config: IndexConfig,
        items: impl IntoIterator<Item = (VectorId, PartitionTag, Vec<f32>)>,
    ) -> Self {
        Self::build_with(config, items, Graphs::Now)
    }

    /// [`HnswIndex::build`] with every partition flat: seconds where the graphs take half an hour at
    /// a million vectors, so a gateway that rebuilds from its store searches every vector (by the
    /// rows' sketches past 32,768 rows, see [`State::flat_near_duplicates`], exactly below) as soon
    /// as the store is read. [`HnswIndex::maybe_rebuild`] then gives each large partition
    /// its graph, the largest first, while the index serves.
    pub fn build_flat(
        config: IndexConfig,
        items: impl IntoIterator<Item = (VectorId, PartitionTag, Vec<f32>)>,
    ) -> Self {
        Self::build_with(config, items, Graphs::Later)
    }

    /// [`HnswIndex::build`] or [`HnswIndex::build_flat`], as `graphs` says.
    pub fn build_with(
        config: IndexConfig,
        items: impl IntoIterator<Item = (VectorId, PartitionTag, Vec<f32>)>,
        graphs: Graphs,
    ) -> Self {
        let config = config.sanitized();
        let mut state = State::empty(&config);
        let mut by_part: Vec<Rows> = Vec::new();
        let mut last: IdMap<(u32, usize)> = IdMap::default();
        for (id, partition, vector) in items {
            let Some(vector) = admit(&config, id, &vector) else {
                continue;
            };
            let code = encode_f16(&vector);
            let part = state.part_index(partition);
            if by_part.len() <= part as usize {
                by_part.resize_with(part as usize + 1, Rows::default);
            }
            let row = by_part[part as usize].ids.len();
            // A repeated id: its earlier row is kept but not placed (version 0 is never current).
            if let Some((p, row)) = last.insert(id, (part, row)) {
                by_part[p as usize].versions[row] = 0;
            }
            by_part[part as usize].push(id, 1, digest(&code), &code);
        }
        drop(last);
        for (part, mut rows) in by_part.into_iter().enumerate() {
            let part = u32::try_from(part).unwrap_or(u32::MAX);
            let graph = (graphs == Graphs::Now && rows.ids.len() > config.brute_force_below)
                .then(|| build_graph(&config, &rows.codes));
            if graph.is_none() {
                rows.sketches = sketch::sketch_all(&rows.codes, config.dimension);
            }
            install(&config, &mut state, part, &rows, graph, |_, _, v| v == 1);
        }
        Self::from_state(config, Some(state))
    }

    /// [`VectorIndex::search`]; with `permit`, a partition awaiting its graph is scanned only with
    /// a [`ScanPermit`] (`Err(ScansBusy)` when none is free).
    fn find(
        &self,
        partition: &PartitionTag,
        query: &[f32],
        k: usize,
        permit: bool,
        recheck_below: f32,
    ) -> Result<Vec<Neighbor>, ScansBusy> {
        if k == 0 {
            return Ok(Vec::new());
        }
        let Some(query) = normalized(query, self.config.dimension) else {
            return Ok(Vec::new());
        };
        let state = read(&self.state);
        let Some(&part) = state.part_of.get(partition) else {
            return Ok(Vec::new());
        };
        let Some(p) = state.part(part) else {
            return Ok(Vec::new());
        };
        match &p.body {
            Body::Flat(flat) => {
                // Only a scan worth a hand-off is rationed: a partition that just grew past
                // `brute_force_below` is still scanned inline (1-2 ms) until the maintenance
                // gives it its graph.
                let large = flat.ids.len() > SCAN_CHUNK.max(self.config.brute_force_below);
                // Awaiting its graph: searched by its rows' sketches, as a recheck searches a
                // sealed graph's, unless the recheck is off (benches then compare the two). That
                // costs about what a graph search does, so it is not rationed: a permit per
                // search thread, made for 20 ms scans, turned away most of a micro-batch's
                // lookups, whose embeddings finish together (23-27 of 90 skipped at c=8, 1M).
                if large && k <= sketch::CANDIDATES && self.config.recheck_below >= -1.0 {
                    let chunk = self.config.sketch_chunk;
                    return Ok(state.flat_near_duplicates(&self.planes, flat, &query, k, chunk));
                }
                let _permit = (permit && large)
                    .then(|| ScanPermit::take(&self.large_scans))
                    .transpose()?;
                Ok(state.scan_flat(flat, &query, k))
            }
            Body::Graph(graph) => {
                let wanted = k.min(p.live);
                if wanted == 0 {
                    return Ok(Vec::new());
                }
                let code = encode_f16(&query);
                // As a large flat partition is searched by its sketches (and on the same terms),
                // so is a large growing segment.
                let by_sketch = k <= sketch::CANDIDATES
                    && self.config.recheck_below >= -1.0
                    && graph.segments.iter().any(Segment::by_sketch);
                let sketch = by_sketch.then(|| self.planes.sketch(&query));
                // Too few live results means tombstones crowd the query: widen, then scan.
                let mut ef = self.config.ef_search.max(k);
                for _ in 0..WIDEN_ATTEMPTS {
                    let forms = Query {
                        vector: &query,
                        code: &code,
                        sketch,
                    };
                    let found = state.graph_search(part, graph, forms, k, ef);
                    if found.len() >= wanted {
                        // Nothing near: the greedy search may have passed a near duplicate by.
                        // Below the index's own bar too (a lenient threshold is no proof that
                        // nothing nearer exists), but never above RECHECK_AT_MOST, where an f16
                        // row's rounding alone could leave its own duplicate just under a strict
                        // request's threshold and make every search a scan.
                        let below = recheck_below
                            .max(self.config.recheck_below)
                            .min(RECHECK_AT_MOST);
                        if found.first().is_some_and(|n| n.similarity >= below) {
                            return Ok(found);
                        }
                        // A recheck on the search threads is rationed like a large scan; with
                        // every permit taken the graph's results stand, as before rechecks were.
                        let chunk = self.config.sketch_chunk;
                        let pooled = graph.sealed_rows() > chunk;
                        let Ok(_permit) = (permit && pooled)
                            .then(|| ScanPermit::take(&self.large_scans))
                            .transpose()
                        else {
                            return Ok(found);
                        };
                        let missed = state.near_duplicates(
                            &self.planes,
                            Recheck { part, graph, chunk },
                            &query,
                            k,
                            sketch,
                        );
                        return Ok(merged(found, missed, k));
                    }
                    ef = ef.saturating_mul(WIDEN_FACTOR);
                }
                Ok(state.scan_graph(part, graph, &query, k))
            }
        }
    }

    /// Takes every exact-scan permit until the guard drops: tests of what the request path does
    /// when every core scans.
    #[cfg(test)]
    pub(crate) fn hold_every_scan(&self) -> impl Drop + '_ {
        let held: Vec<ScanPermit<'_>> =
            std::iter::from_fn(|| ScanPermit::take(&self.large_scans).ok()).collect();
        held
    }

    /// The live ids, sorted.
    pub fn ids(&self) -> BTreeSet<VectorId> {
        read(&self.state).live.keys().copied().collect()
    }

    /// Whether `id` is held in `partition` with this vector, as the index encodes it (a loaded
    /// dump is checked against the store this way).
    pub fn holds(&self, id: VectorId, partition: &PartitionTag, vector: &[f32]) -> bool {
        let Some(vector) = normalized(vector, self.config.dimension) else {
            return false;
        };
        let digest = digest(&encode_f16(&vector));
        let state = read(&self.state);
        state.live.get(&id).is_some_and(|placed| {
            placed.digest == digest
                && state
                    .parts
                    .get(placed.part as usize)
                    .is_some_and(|part| part.tag == *partition)
        })
    }

    /// Changes the search width (benches compare widths on one graph without rebuilding it).
    pub fn set_ef_search(&mut self, ef_search: usize) {
        self.config.ef_search = ef_search.max(1);
    }

    /// Changes the similarity below which [`VectorIndex::search`] rechecks a graph search by the
    /// sketches (benches compare it on and off on one graph).
    pub fn set_recheck_below(&mut self, recheck_below: f32) {
        self.config.recheck_below = recheck_below;
    }

    /// The partition that most needs work, if any: a flat one past `brute_force_below` (gets a
    /// graph), a graph at or below half of it (goes flat), a graph whose tombstones pass the ratio,
    /// one with a segment larger than `segment_points` (loaded from a format 2 dump, which held
    /// a partition's graph whole: split once, so it loads on every core at the next start), or one
    /// whose inserts have added more than [`SEGMENTS_BEFORE_MERGE`] segments (each costs a search). The
    /// largest first: a flat partition's exact scan costs in proportion to its size, so after a
    /// [`HnswIndex::build_flat`] the costliest scans go first.
    fn part_needing_work(&self, state: &State) -> Option<u32> {
        let limit = self.config.brute_force_below;
        state
            .parts
            .iter()
            .enumerate()
            .filter(|(_, p)| match &p.body {
                Body::Flat(_) => p.awaits_graph(limit),
                Body::Graph(g) => {
                    let tombstones = g.slots.len().saturating_sub(p.live);
                    let whole = g.slots.len().div_ceil(self.config.segment_points).max(1);
                    p.live <= limit / 2
                        || (tombstones > 0
                            && tombstones as f32
                                > self.config.rebuild_tombstone_ratio * g.slots.len() as f32)
                        || g.segments
                            .iter()
                            .any(|s| s.points() > self.config.segment_points)
                        || g.segments.len() > whole + SEGMENTS_BEFORE_MERGE
                }
            })
            // Ties to the first, so the order is stable.
            .min_by_key(|(i, p)| (std::cmp::Reverse(p.live), *i))
            .and_then(|(i, _)| u32::try_from(i).ok())
    }

    /// Partitions searched flat until [`HnswIndex::maybe_rebuild`] gives them a graph (after a
    /// [`HnswIndex::build_flat`], or one that just grew past `brute_force_below`).
    pub fn graphs_pending(&self) -> usize {
        let limit = self.config.brute_force_below;
        read(&self.state)
            .parts
            .iter()
            .filter(|p| p.awaits_graph(limit))
            .count()
    }

    /// Seals one growing segment that takes no more inserts if there is one (see `seal_one`), else
    /// does the work one partition needs (see `part_needing_work`), and returns whether it did.
    /// Meant for a background thread: a new graph is built without any lock (searches, inserts and
    /// removes go on against the old body), the inserts made meanwhile are replayed into it, then it
    /// is swapped in under a short write lock.
    pub fn maybe_rebuild(&self) -> bool {
        let unsealable = match self.seal_one() {
            Seal::Done => return true,
            Seal::Nothing => None,
            Seal::Failed(part) => Some(part),
        };
        let (part, rows) = {
            let mut writer = lock(&self.writer);
            if writer.replay.is_some() {
                return false; // another rebuild is running
            }
            let state = read(&self.state);
            let Some(part) = unsealable.or_else(|| self.part_needing_work(&state)) else {
                return false;
            };
            writer.replay = Some(Replay {
                part,
                log: Vec::new(),
            });
            (part, state.rows(part))
        };
        let mut guard = RebuildInProgress {
            writer: &self.writer,
            armed: true,
        };
        let mut rows = rows;
        let mut graph = (rows.ids.len() > self.config.brute_force_below)
            .then(|| build_graph(&self.config, &rows.codes));
        if graph.is_none() {
            // Outside the locks, as the graph is built: `install` runs under the state's.
            rows.sketches = sketch::sketch_all(&rows.codes, self.config.dimension);
        }

        let mut writer = lock(&self.writer);
        guard.armed = false;
        let log = writer.replay.take().map(|r| r.log).unwrap_or_default();
        // Only the last insert of each id, and only if it is still the current one: a later
        // remove or replace already made it a tombstone.
        let replay: Vec<_> = {
            let state = read(&self.state);
            let mut seen = IdSet::default();
            log.into_iter()
                .rev()
                .filter(|(id, version, _, _)| {
                    let current = state
                        .live
                        .get(id)
                        .is_some_and(|l| l.part == part && l.version == *version);
                    seen.insert(*id) && current
                })
                .collect()
        };
        // `writer` is held: nothing changes the state until the swap.
        for (id, version, digest, code) in replay {
            if let Some(segments) = &mut graph {
                append_point(&self.config, segments, &code, rows.ids.len());
            }
            rows.push(id, version, digest, &code);
        }
        let mut state = write(&self.state);
        let old = install(&self.config, &mut state, part, &rows, graph, |s, id, v| {
            s.live
                .get(&id)
                .is_some_and(|l| l.part == part && l.version == v)
        });
        drop(state);
        drop(writer);
        // Freeing the old graph takes a while; no lock is held here.
        free_on_build_threads(old);
        true
    }

    /// Seals one growing segment that takes no more inserts (full, or not its partition's last), if
    /// there is one: converted on the build threads without a lock, swapped in under a short one if
    /// its partition still holds it.
    fn seal_one(&self) -> Seal {
        let limit = self.config.growing_points();
        // Chosen under `writer`, so no insert is half done in it: a segment that is full or not the
        // last then takes no more.
        let writer = lock(&self.writer);
        let found = read(&self.state)
            .parts
            .iter()
            .enumerate()
            .find_map(|(part, p)| {
                let Body::Graph(g) = &p.body else {
                    return None;
                };
                let last = g.segments.len().saturating_sub(1);
                g.segments.iter().enumerate().find_map(|(at, s)| match s {
                    Segment::Growing(graph) if at < last || graph.len() >= limit => {
                        Some((part, at, Arc::clone(graph)))
                    }
                    _ => None,
                })
            });
        drop(writer);
        let Some((part, at, graph)) = found else {
            return Seal::Nothing;
        };
        let Some(sealed) = seal(&self.config, graph.graph()) else {
            // Its points repeat a slot (an insert that panicked half way leaves its point behind
            // for the next to reuse the slot): only a rebuild from the live rows mends that.
            tracing::warn!(
                partition = part,
                segment = at,
                "an index graph segment could not be sealed; rebuilding its partition"
            );
            return u32::try_from(part).map_or(Seal::Nothing, Seal::Failed);
        };
        // `writer` keeps a rebuild from swapping the partition's body while this one is swapped.
        let swapped = {
            let _writer = lock(&self.writer);
            let mut state = write(&self.state);
            let segment = state.parts.get_mut(part).and_then(|p| match &mut p.body {
                Body::Graph(g) => g.segments.get_mut(at),
                Body::Flat(_) => None,
            });
            match segment {
                Some(segment @ Segment::Growing(_)) => {
                    let same = matches!(&*segment, Segment::Growing(current) if Arc::ptr_eq(current, &graph));
                    if same {
                        *segment = Segment::Sealed(Arc::new(sealed));
                    }
                    same
                }
                _ => false,
            }
        };
        // The graph's last reference, freed without a lock held.
        free_on_build_threads(graph);
        if swapped {
            Seal::Done
        } else {
            Seal::Nothing
        }
    }

    /// Dumps the index to `dir`, a directory it owns (other files named like ours are deleted).
    ///
    /// Files: `entries-<gen>.bin` (ours: partitions, then ids with their partition and slot, and
    /// the codes of flat partitions), per sealed segment `sealed-<gen>-<part>-<segment>.bin`
    /// ([`Sealed::write`]), per growing one `graph-<gen>-<part>-<segment>.hnsw.graph` and
    /// `.hnsw.data` (`hnsw_rs`'s dump, which holds the segment's codes), and `manifest.json` naming them with
    /// length and blake3. A generation's files stay unreferenced until `manifest.json.tmp` is
    /// renamed over `manifest.json`; that rename is the commit, so a crash leaves the previous dump
    /// whole. The previous generation's files are deleted afterwards.
    ///
    /// Inserts and removes wait while it runs (the dump must be one consistent state); searches do not.
    pub fn save(&self, dir: &Path) -> Result<(), IndexError> {
        let _writer = lock(&self.writer);
        // No writer can queue behind this read guard (they all take `writer` first), so holding it
        // for the whole dump never stalls searches.
        let state = read(&self.state);
        fs::create_dir_all(dir)?;
        // Never a generation with files on disk: `hnsw_rs` truncates the files it dumps to, and a
        // loaded graph's vectors are mapped from its data file, which truncating would pull from
        // under this process (SIGBUS). A manifest lost while serving could name one again.
        let mut generation = read_manifest(dir).map_or(1, |m| m.generation + 1);
        let taken = generations_on_disk(dir);
        while taken.contains(&generation) {
            generation += 1;
        }

        let mut order: Vec<(&VectorId, &Placement)> = state.live.iter().collect();
        order.sort_unstable_by_key(|(id, _)| **id);
        let entries = write_entries(
            &dir.join(format!("entries-{generation}.bin")),
            &state,
            &order,
        )?;

        let mut graphs = Vec::new();
        let mut sealeds = Vec::new();
        for (part, p) in state.parts.iter().enumerate() {
            let Body::Graph(g) = &p.body else {
                continue;
            };
            for (segment, graph) in g.segments.iter().enumerate() {
                let graph = match graph {
                    Segment::Growing(graph) => graph.graph(),
                    Segment::Sealed(sealed) => {
                        sealeds.push(SealedRef {
                            part: u32::try_from(part).unwrap_or(u32::MAX),
                            segment: u32::try_from(segment).unwrap_or(u32::MAX),
                            points: sealed.len(),
                            file: write_durable(
                                &dir.join(format!("sealed-{generation}-{part}-{segment}.bin")),
                                |out| Ok(sealed.write(out)?),
                            )?,
                        });
                        continue;
                    }
                };
                let basename = format!("graph-{generation}-{part}-{segment}");
                // `file_dump` panics when it cannot create its files; make that an error.
                let dumped = catch_unwind(AssertUnwindSafe(|| graph.file_dump(dir, &basename)))
                    .map_err(|_| std::io::Error::other("hnsw_rs panicked while dumping the graph"))?
                    .map_err(|e| std::io::Error::other(format!("hnsw_rs dump: {e}")))?;
                graphs.push(GraphRef {
                    part: u32::try_from(part).unwrap_or(u32::MAX),
                    segment: u32::try_from(segment).unwrap_or(u32::MAX),
                    points: graph.get_nb_point(),
                    graph: checksum_file(dir, &format!("{dumped}.hnsw.graph"))?,
                    data: checksum_file(dir, &format!("{dumped}.hnsw.data"))?,
                    basename: dumped,
                });
            }
        }

        let manifest = Manifest {
            format_version: FORMAT_VERSION,
            generation,
            dimension: state.dimension,
            count: order.len(),
            graph_points: state.parts.iter().map(Part::points).sum(),
            ids_fingerprint: fingerprint(order.iter().map(|(id, _)| **id)),
            distance: std::any::type_name::<DistF16>().to_string(),
            entries,
            graphs,
            sealed: sealeds,
        };
        drop(order);
        drop(state);
        let json = serde_json::to_vec_pretty(&manifest)
            .map_err(|e| std::io::Error::other(format!("manifest encoding: {e}")))?;
        let tmp = dir.join(MANIFEST_TMP);
        {
            let mut file = File::create(&tmp)?;
            file.write_all(&json)?;
            file.sync_all()?;
        }
        fs::rename(&tmp, dir.join(MANIFEST))?;
        sync_dir(dir)?;
        remove_other_generations(dir, generation);
        Ok(())
    }

    /// What the manifest of the dump in `dir` says of it (`None` without a readable one): what a
    /// caller can weigh before loading it.
    pub fn dump_summary(dir: &Path) -> Option<DumpSummary> {
        read_manifest(dir).map(|manifest| DumpSummary {
            vectors: manifest.count,
            dimension: manifest.dimension,
        })
    }

    /// The dimension of the vectors this index holds.
    pub fn dimension(&self) -> usize {
        self.config.dimension
    }

    /// Loads a dump made by [`HnswIndex::save`], whatever ids it holds: a dump saved some minutes
    /// before a crash, or by a replica of a shared store that others wrote to since, is brought up to
    /// date by its caller (the ids the store has and [`HnswIndex::ids`] lacks, and the reverse).
    ///
    /// Errors: [`IndexError::Missing`] without a manifest; [`IndexError::Dimension`] when made for
    /// another dimension; [`IndexError::Corrupt`] on a bad checksum, length, format or file name, or
    /// entries that do not match the manifest.
    /// A graph keeps the `max_connections`/`ef_construction` it was built with until its next rebuild.
    /// Growing graphs' vectors are mapped from their dump's data files, not copied (see
    /// `load_graph`); a sealed segment's file is read into its arrays.
    pub fn load(dir: &Path, config: IndexConfig) -> Result<Self, IndexError> {
        Self::load_as(dir, config, Vectors::Mapped)
    }

    /// [`HnswIndex::load`] with the graphs' vectors read into the heap, for a load that runs while
    /// something may move the dump (the store's open, which moves a corrupt store's index aside):
    /// `hnsw_rs` opens the data files again by path to map them, and exits the process when it
    /// cannot.
    pub fn load_in_memory(dir: &Path, config: IndexConfig) -> Result<Self, IndexError> {
        Self::load_as(dir, config, Vectors::InMemory)
    }

    fn load_as(dir: &Path, config: IndexConfig, vectors: Vectors) -> Result<Self, IndexError> {
        let config = config.sanitized();
        let manifest = match fs::read(dir.join(MANIFEST)) {
            Ok(bytes) => serde_json::from_slice::<Manifest>(&bytes)
                .map_err(|e| IndexError::Corrupt(format!("manifest: {e}")))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(IndexError::Missing),
            Err(e) => return Err(e.into()),
        };
        if !FORMATS_READ.contains(&manifest.format_version) {
            return Err(IndexError::Corrupt(format!(
                "format version {}, this build reads {FORMATS_READ:?}",
                manifest.format_version
            )));
        }
        if manifest.dimension != config.dimension {
            return Err(IndexError::Dimension {
                expected: config.dimension,
                found: manifest.dimension,
            });
        }
        if manifest.distance != std::any::type_name::<DistF16>() {
            return Err(IndexError::Corrupt(format!(
                "distance {}",
                manifest.distance
            )));
        }

        // `hnsw_rs` reads a graph on one thread: graphs load side by side, one thread per core,
        // while another reads and checks the entries file.
        let (graphs, entries) = std::thread::scope(|s| {
            let entries = s.spawn(|| read_checked(dir, &manifest.entries));
            let graphs = load_graphs(dir, &manifest, vectors);
            let entries = entries
                .join()
                .unwrap_or_else(|_| Err(IndexError::Corrupt("entries reader panicked".into())));
            (graphs, entries)
        });
        let mut state = State::empty(&config);
        read_entries(&manifest.entries, &entries?, &mut state, graphs?)?;
        let mut ids: Vec<VectorId> = state.live.keys().copied().collect();
        ids.sort_unstable();
        if state.live.len() != manifest.count
            || manifest.ids_fingerprint != fingerprint(ids.into_iter())
            || state.parts.iter().map(Part::points).sum::<usize>() != manifest.graph_points
        {
            return Err(IndexError::Corrupt(
                "entries do not match the manifest".into(),
            ));
        }
        Ok(Self::from_state(config, Some(state)))
    }
}

/// A dump as its manifest describes it: [`HnswIndex::dump_summary`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DumpSummary {
    /// Live vectors.
    pub vectors: usize,
    pub dimension: usize,
}

/// The normalized vector if `id` and `vector` can be indexed; warns otherwise.
fn admit(config: &IndexConfig, id: VectorId, vector: &[f32]) -> Option<Vec<f32>> {
    if id == NO_ID {
        tracing::warn!(id, "vector id is the index's reserved id; not indexed");
        return None;
    }
    let normalized = normalized(vector, config.dimension);
    if normalized.is_none() {
        tracing::warn!(
            id,
            len = vector.len(),
            dimension = config.dimension,
            "vector has the wrong dimension or a non-finite value; not indexed"
        );
    }
    normalized
}

/// Clears the replay log if a rebuild unwinds, so inserts stop logging and a later call can retry.
struct RebuildInProgress<'a> {
    writer: &'a Mutex<Writer>,
    armed: bool,
}

impl Drop for RebuildInProgress<'_> {
    fn drop(&mut self) {
        if self.armed {
            lock(self.writer).replay = None;
        }
    }
}

impl VectorIndex for HnswIndex {
    fn insert(&self, id: VectorId, partition: PartitionTag, vector: &[f32]) {
        let Some(vector) = admit(&self.config, id, vector) else {
            // An id must never be found by a vector that is not its current one.
            self.remove(id);
            return;
        };
        let code = encode_f16(&vector);
        let digest = digest(&code);
        let mut writer = lock(&self.writer);
        let (part, graph) = {
            let mut state = write(&self.state);
            let part = state.part_index(partition);
            let current = state.live.get(&id);
            if current.is_some_and(|l| l.part == part && l.digest == digest) {
                return; // already there
            }
            let graph = match state.part(part).map(|p| &p.body) {
                Some(Body::Graph(g)) => Some((
                    open_segment(&g.segments, self.config.growing_points()),
                    g.slots.len(),
                )),
                _ => None,
            };
            (part, graph)
        };
        let version = match graph {
            Some((open, slot)) => {
                // The slow part runs outside the state lock, so searches go on; the point stays
                // invisible to them until `slots` names it, and a new segment until it is added.
                // `writer` keeps the body from being swapped.
                let started = open.is_none();
                let segment = open.unwrap_or_else(|| new_growing(&self.config));
                segment.insert(&code, slot);
                let mut state = write(&self.state);
                state.unset(id);
                if let Some(Body::Graph(g)) =
                    state.parts.get_mut(part as usize).map(|p| &mut p.body)
                {
                    if started {
                        g.segments.push(Segment::Growing(segment));
                    }
                    g.slots.push(id);
                }
                state.place(id, part, u32::try_from(slot).unwrap_or(u32::MAX), digest)
            }
            None => {
                // Sketched before the lock: 2 µs that searches need not wait for.
                let sketch = self.planes.sketch_row(&code);
                let mut state = write(&self.state);
                state.unset(id);
                state.push_flat(id, part, &code, sketch)
            }
        };
        if let Some(replay) = writer.replay.as_mut().filter(|r| r.part == part) {
            replay.log.push((id, version, digest, code));
        }
    }

    fn remove(&self, id: VectorId) {
        let _writer = lock(&self.writer);
        write(&self.state).unset(id);
    }

    fn search(&self, partition: &PartitionTag, query: &[f32], k: usize) -> Vec<Neighbor> {
        self.find(partition, query, k, false, self.config.recheck_below)
            .unwrap_or_default()
    }

    fn search_now(
        &self,
        partition: &PartitionTag,
        query: &[f32],
        k: usize,
        recheck_below: f32,
    ) -> Result<Vec<Neighbor>, ScansBusy> {
        self.find(partition, query, k, true, recheck_below)
    }

    fn scan_all(&self, query: &[f32], min_similarity: f32, k: usize) -> Vec<Neighbor> {
        let Some(query) = normalized(query, self.config.dimension) else {
            return Vec::new();
        };
        if k == 0 {
            return Vec::new();
        }
        let state = read(&self.state);
        let found = (0..state.parts.len())
            .filter_map(|i| Some((u32::try_from(i).ok()?, &state.parts[i])))
            .flat_map(|(part, p)| match &p.body {
                Body::Flat(flat) => state.scan_flat(flat, &query, k),
                Body::Graph(graph) => state.scan_graph(part, graph, &query, k),
            })
            .filter(|n| n.similarity >= min_similarity)
            .collect();
        top_k(found, k)
    }

    fn len(&self) -> usize {
        read(&self.state).live.len()
    }

    fn tombstones(&self) -> usize {
        read(&self.state).tombstones()
    }
}

// ---------------------------------------------------------------------------------------------
// Persistence
// ---------------------------------------------------------------------------------------------

/// 4: sealed segments in files of ours beside `hnsw_rs`'s dumps of growing ones. 3 (every segment
/// an `hnsw_rs` dump) and 2 (one graph per large partition, which loads as a single segment) are
/// still read, their graphs growing until the maintenance seals them (each that is full or not
/// its partition's last; the last one below `seal_points` takes inserts until it is full); 1 held
/// f32 vectors and one shared graph. A build before format 4 cannot read it, and leaves its
/// `sealed-*` files on disk.
const FORMAT_VERSION: u32 = 4;
const FORMATS_READ: [u32; 3] = [2, 3, 4];
const MANIFEST: &str = "manifest.json";
const MANIFEST_TMP: &str = "manifest.json.tmp";
const ENTRIES_MAGIC: &[u8; 8] = b"RPXENT02";
/// Magic, dimension (u32), partitions (u32), entries (u64).
const ENTRIES_HEADER: usize = 8 + 4 + 4 + 8;
/// Per partition: tag, kind (0 flat, 1 graph).
const PART_RECORD: usize = 32 + 1;
/// Per entry: id (u64), partition (u32), slot (u32), digest (u32); a flat partition's f16 vector follows.
const ENTRY_RECORD: usize = 8 + 4 + 4 + 4;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format_version: u32,
    /// Incremented by every save into the same directory; names that save's files.
    generation: u64,
    dimension: usize,
    /// Live vectors.
    count: usize,
    /// Points in the graph dumps, tombstones included.
    graph_points: usize,
    /// blake3 of the sorted live ids: the entries file read must name exactly these.
    ids_fingerprint: String,
    /// The graphs' distance type; `hnsw_rs` refuses a dump made with another.
    distance: String,
    entries: FileRef,
    /// One per growing segment of each partition that has a graph.
    graphs: Vec<GraphRef>,
    /// One per sealed segment (format 4).
    #[serde(default)]
    sealed: Vec<SealedRef>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SealedRef {
    part: u32,
    segment: u32,
    /// Points in the segment, tombstones included.
    points: usize,
    file: FileRef,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRef {
    name: String,
    len: u64,
    blake3: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphRef {
    /// The partition's number in the entries file.
    part: u32,
    /// The segment's place among the partition's (format 2 has one, and no field).
    #[serde(default)]
    segment: u32,
    /// Points in the segment, tombstones included.
    points: usize,
    /// `hnsw_rs` reads `<basename>.hnsw.graph` and `<basename>.hnsw.data`.
    basename: String,
    graph: FileRef,
    data: FileRef,
}

fn read_manifest(dir: &Path) -> Option<Manifest> {
    let bytes = fs::read(dir.join(MANIFEST)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn fingerprint(ids: impl Iterator<Item = VectorId>) -> String {
    let mut hasher = blake3::Hasher::new();
    for id in ids {
        hasher.update(&id.to_le_bytes());
    }
    hasher.finalize().to_hex().to_string()
}

/// A writer that hashes and counts what passes through it.
struct HashingWriter<W> {
    inner: W,
    hasher: blake3::Hasher,
    len: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Entries file, little-endian: header; per partition its tag and kind; per live entry (by id)
/// `id: u64, partition: u32, slot: u32, digest: u32`, followed by its f16 vector when its partition
/// is flat (a graph's codes are in its sealed segment's file or its `hnsw_rs` dump).
fn write_entries(
    path: &Path,
    state: &State,
    order: &[(&VectorId, &Placement)],
) -> Result<FileRef, IndexError> {
    let dimension = state.dimension;
    let too_large = |what: &str| std::io::Error::other(format!("{what} too large"));
    let dimension32 = u32::try_from(dimension).map_err(|_| too_large("dimension"))?;
    let parts32 = u32::try_from(state.parts.len()).map_err(|_| too_large("partition count"))?;
    write_durable(path, |out| {
        out.write_all(ENTRIES_MAGIC)?;
        out.write_all(&dimension32.to_le_bytes())?;
        out.write_all(&parts32.to_le_bytes())?;
        out.write_all(&(order.len() as u64).to_le_bytes())?;
        for part in &state.parts {
            out.write_all(&part.tag)?;
            out.write_all(&[u8::from(matches!(part.body, Body::Graph(_)))])?;
        }
        let mut row = Vec::with_capacity(ENTRY_RECORD + dimension);
        for (id, live) in order {
            row.clear();
            row.extend_from_slice(&id.to_le_bytes());
            row.extend_from_slice(&live.part.to_le_bytes());
            row.extend_from_slice(&live.slot.to_le_bytes());
            row.extend_from_slice(&live.digest.to_le_bytes());
            if let Some(Body::Flat(flat)) = state.part(live.part).map(|p| &p.body) {
                let start = live.slot as usize * dimension;
                let code = flat
                    .codes
                    .get(start..start + dimension)
                    .ok_or_else(|| std::io::Error::other("flat row out of range"))?;
                row.extend(code.iter().flat_map(|c| c.to_le_bytes()));
            }
            out.write_all(&row)?;
        }
        Ok(())
    })
}

/// Writes a file of the dump through `write`, then makes it durable before the manifest names it:
/// its name, length and blake3.
fn write_durable(
    path: &Path,
    write: impl FnOnce(&mut HashingWriter<BufWriter<File>>) -> Result<(), IndexError>,
) -> Result<FileRef, IndexError> {
    let mut out = HashingWriter {
        inner: BufWriter::with_capacity(1 << 20, File::create(path)?),
        hasher: blake3::Hasher::new(),
        len: 0,
    };
    write(&mut out)?;
    out.flush()?;
    out.inner.get_ref().sync_all()?;
    Ok(FileRef {
        name: file_name(path),
        len: out.len,
        blake3: out.hasher.finalize().to_hex().to_string(),
    })
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Opens a file the manifest names. A name with a path in it, a missing file or a length other
/// than the manifest's means corruption.
fn open_named(dir: &Path, file: &FileRef) -> Result<File, IndexError> {
    let name = &file.name;
    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
        return Err(IndexError::Corrupt(format!("bad file name {name:?}")));
    }
    let handle = File::open(dir.join(name)).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => IndexError::Corrupt(format!("{name} is missing")),
        _ => IndexError::Io(e),
    })?;
    if handle.metadata()?.len() != file.len {
        return Err(IndexError::Corrupt(format!(
            "{name} is not {} bytes long",
            file.len
        )));
    }
    Ok(handle)
}

fn check_hash(file: &FileRef, hash: blake3::Hash) -> Result<(), IndexError> {
    if hash.to_hex().as_str() == file.blake3 {
        Ok(())
    } else {
        Err(IndexError::Corrupt(format!(
            "{} checksum mismatch",
            file.name
        )))
    }
}

/// Reads a whole file the manifest names, refusing it unless length and blake3 match.
fn read_checked(dir: &Path, file: &FileRef) -> Result<Vec<u8>, IndexError> {
    let mut handle = open_named(dir, file)?;
    let mut bytes = Vec::with_capacity(usize::try_from(file.len).unwrap_or(0));
    handle.read_to_end(&mut bytes)?;
    if bytes.len() as u64 != file.len {
        return Err(IndexError::Corrupt(format!(
            "{} changed while read",
            file.name
        )));
    }
    check_hash(file, blake3::hash(&bytes))?;
    Ok(bytes)
}

/// A reader that hashes what passes through it.
struct HashingReader<R> {
    inner: R,
    hasher: blake3::Hasher,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Reads a sealed segment's file straight into its arrays, refusing it unless length, blake3 and
/// structure are right.
fn load_sealed(dir: &Path, sealed_ref: &SealedRef, dimension: usize) -> Result<Sealed, IndexError> {
    let file = &sealed_ref.file;
    let mut input = HashingReader {
        inner: std::io::BufReader::with_capacity(1 << 20, open_named(dir, file)?),
        hasher: blake3::Hasher::new(),
    };
    let sealed = Sealed::read(&mut input, file.len, dimension);
    // The checksum first: a damaged file is reported as such whatever the parse made of it.
    check_hash(file, input.hasher.finalize())?;
    let sealed = sealed.map_err(|e| IndexError::Corrupt(format!("{}: {e}", file.name)))?;
    if sealed.len() != sealed_ref.points {
        return Err(IndexError::Corrupt(format!(
            "{}: point count differs from the manifest",
            file.name
        )));
    }
    Ok(sealed)
}

/// Streams a file the manifest names through blake3, for files `hnsw_rs` reads itself.
fn verify_file(dir: &Path, file: &FileRef) -> Result<(), IndexError> {
    let handle = open_named(dir, file)?;
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(&handle)?;
    check_hash(file, hasher.finalize())
}

/// Parses the entries file (`bytes`, checked against `file`) into `state`, giving each graph
/// partition its loaded graph.
fn read_entries(
    file: &FileRef,
    bytes: &[u8],
    state: &mut State,
    graphs: Vec<(u32, u32, Segment)>,
) -> Result<(), IndexError> {
    let corrupt = |what: &str| IndexError::Corrupt(format!("{}: {what}", file.name));
    let mut rest = bytes;
    let mut take = |n: usize| -> Result<&[u8], IndexError> {
        let (head, tail) = rest
            .split_at_checked(n)
            .ok_or_else(|| corrupt("truncated"))?;
        rest = tail;
        Ok(head)
    };
    let header = take(ENTRIES_HEADER)?;
    let (magic, header) = header.split_at(ENTRIES_MAGIC.len());
    if magic != ENTRIES_MAGIC {
        return Err(corrupt("bad magic"));
    }
    let le_u32 = |b: &[u8]| {
        b.try_into()
            .map(u32::from_le_bytes)
            .map_err(|_| corrupt("u32"))
    };
    let le_u64 = |b: &[u8]| {
        b.try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| corrupt("u64"))
    };
    let dimension = state.dimension;
    if usize::try_from(le_u32(&header[..4])?).ok() != Some(dimension) {
        return Err(corrupt("dimension differs from the manifest"));
    }
    let parts = le_u32(&header[4..8])?;
    let count = le_u64(&header[8..16])?;
    // Each graph partition's segments, in order: 0, 1, … with none missing or repeated.
    let mut graphs: HashMap<u32, Vec<(u32, Segment)>> =
        graphs
            .into_iter()
            .fold(HashMap::new(), |mut by_part, (part, segment, graph)| {
                by_part.entry(part).or_default().push((segment, graph));
                by_part
            });
    for part in 0..parts {
        let record = take(PART_RECORD)?;
        let tag: PartitionTag = record[..32].try_into().map_err(|_| corrupt("tag"))?;
        let body = match record[32] {
            0 => Body::Flat(Flat::default()),
            1 => {
                let mut segments = graphs
                    .remove(&part)
                    .ok_or_else(|| corrupt("a graph partition has no graph dump"))?;
                segments.sort_unstable_by_key(|(segment, _)| *segment);
                if segments
                    .iter()
                    .enumerate()
                    .any(|(n, (segment, _))| *segment as usize != n)
                {
                    return Err(corrupt("a graph's segments are not numbered 0, 1, …"));
                }
                let segments: Vec<Segment> = segments.into_iter().map(|(_, g)| g).collect();
                let points = holds_its_slots(&segments)
                    .ok_or_else(|| corrupt("a graph segment holds points of another"))?;
                Body::Graph(OwnGraph {
                    segments,
                    slots: vec![NO_ID; points],
                })
            }
            _ => return Err(corrupt("partition kind")),
        };
        if state.part_of.insert(tag, part).is_some() {
            return Err(corrupt("a partition is listed twice"));
        }
        state.parts.push(Part { tag, live: 0, body });
    }
    if !graphs.is_empty() {
        return Err(corrupt("a graph dump names a flat or missing partition"));
    }
    for _ in 0..count {
        let record = take(ENTRY_RECORD)?;
        let id = le_u64(&record[..8])?;
        let part = le_u32(&record[8..12])?;
        let slot = le_u32(&record[12..16])?;
        let digest = le_u32(&record[16..20])?;
        if state.live.contains_key(&id) || id == NO_ID {
            return Err(corrupt("an id is listed twice"));
        }
        let graph = match state.parts.get(part as usize).map(|p| &p.body) {
            None => return Err(corrupt("entry names a missing partition")),
            Some(Body::Graph(_)) => true,
            Some(Body::Flat(_)) => false,
        };
        if graph {
            let Some(Body::Graph(g)) = state.parts.get_mut(part as usize).map(|p| &mut p.body)
            else {
                return Err(corrupt("partition"));
            };
            let named = g
                .slots
                .get_mut(slot as usize)
                .ok_or_else(|| corrupt("slot beyond the graph"))?;
            *named = id;
            state.place(id, part, slot, digest);
        } else {
            let code: Vec<Code> = take(dimension * 2)?
                .as_chunks::<2>()
                .0
                .iter()
                .map(|b| f16::from_le_bytes(*b))
                .collect();
            if digest != self::digest(&code) {
                return Err(corrupt("a flat row does not match its digest"));
            }
            // Sketched below, every flat row at once on the build threads.
            state.push_flat(id, part, &code, [0; 2]);
        }
    }
    if !rest.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    for part in &mut state.parts {
        if let Body::Flat(flat) = &mut part.body {
            flat.sketches = sketch::sketch_all(&flat.codes, dimension);
        }
    }
    Ok(())
}

/// The points of a graph when each of its segments holds the slots that follow the previous
/// segment's, each once (as inserts and builds number them). `None` otherwise: a manifest that
/// names one dump twice, each with its right checksum, would else serve a point's vector for
/// another id.
fn holds_its_slots(segments: &[Segment]) -> Option<usize> {
    let total = segments.iter().map(Segment::points).sum();
    let mut seen = vec![false; total];
    let mut first = 0;
    let mut holds = true;
    for segment in segments {
        let end = first + segment.points();
        segment.for_each_row(|slot, _| {
            holds &= (first..end).contains(&slot) && !std::mem::replace(&mut seen[slot], true);
        });
        first = end;
    }
    holds.then_some(total)
}

fn checksum_file(dir: &Path, name: &str) -> Result<FileRef, IndexError> {
    let file = File::open(dir.join(name))?;
    // `hnsw_rs` only flushes its writers; make the dump durable before the manifest names it.
    file.sync_all()?;
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(&file)?;
    Ok(FileRef {
        name: name.to_string(),
        len: file.metadata()?.len(),
        blake3: hasher.finalize().to_hex().to_string(),
    })
}

/// Where a loaded graph's vectors are: see [`load_graph`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Vectors {
    Mapped,
    InMemory,
}

/// A segment the manifest names, in either form.
#[derive(Clone, Copy)]
enum SegmentRef<'a> {
    Growing(&'a GraphRef),
    Sealed(&'a SealedRef),
}

impl SegmentRef<'_> {
    fn place(&self) -> (u32, u32, usize) {
        match self {
            SegmentRef::Growing(g) => (g.part, g.segment, g.points),
            SegmentRef::Sealed(s) => (s.part, s.segment, s.points),
        }
    }
}

/// Loads every graph segment of the manifest as `(part, segment, segment)`, each checked against
/// the point count the manifest recorded, on as many threads as there are cores (and segments).
/// Each thread takes the largest segment left: the load ends when the last thread's does.
fn load_graphs(
    dir: &Path,
    manifest: &Manifest,
    vectors: Vectors,
) -> Result<Vec<(u32, u32, Segment)>, IndexError> {
    let mut queue: Vec<SegmentRef<'_>> = manifest
        .graphs
        .iter()
        .map(SegmentRef::Growing)
        .chain(manifest.sealed.iter().map(SegmentRef::Sealed))
        .collect();
    queue.sort_by_key(|r| std::cmp::Reverse(r.place().2));
    let threads = crate::priority::cores().clamp(1, queue.len().max(1));
    let next = AtomicUsize::new(0);
    // One bad segment fails the load: the other threads stop taking more.
    let failed = AtomicBool::new(false);
    let load_one = |segment_ref: SegmentRef<'_>| -> Result<Segment, IndexError> {
        match segment_ref {
            SegmentRef::Growing(graph_ref) => {
                let graph = load_graph(dir, graph_ref, vectors)?;
                if graph.get_nb_point() != graph_ref.points {
                    return Err(IndexError::Corrupt(
                        "graph point count differs from the manifest".into(),
                    ));
                }
                Ok(Segment::Growing(Arc::new(Growing::new(
                    graph,
                    manifest.dimension,
                ))))
            }
            SegmentRef::Sealed(sealed_ref) => Ok(Segment::Sealed(Arc::new(load_sealed(
                dir,
                sealed_ref,
                manifest.dimension,
            )?))),
        }
    };
    let load_share = || -> Result<Vec<(u32, u32, Segment)>, IndexError> {
        let mut loaded = Vec::new();
        while let Some(segment_ref) = queue.get(next.fetch_add(1, AtomicOrdering::Relaxed)) {
            if failed.load(AtomicOrdering::Relaxed) {
                break;
            }
            let segment = load_one(*segment_ref)
                .inspect_err(|_| failed.store(true, AtomicOrdering::Relaxed))?;
            let (part, at, _) = segment_ref.place();
            loaded.push((part, at, segment));
        }
        Ok(loaded)
    };
    std::thread::scope(|s| {
        let shares: Vec<_> = (0..threads).map(|_| s.spawn(load_share)).collect();
        let mut graphs = Vec::with_capacity(queue.len());
        for share in shares {
            let share = share
                .join()
                .unwrap_or_else(|_| Err(IndexError::Corrupt("graph loader panicked".into())));
            graphs.extend(share?);
        }
        Ok(graphs)
    })
}

/// Verifies the graph files, then has `hnsw_rs` read them. `hnsw_rs` asserts (and on a bad data
/// record even exits the process) instead of returning errors, so it must only ever see files whose
/// checksum matched; a panic left over is still caught and reported as corruption.
fn load_graph(dir: &Path, graph_ref: &GraphRef, vectors: Vectors) -> Result<Graph, IndexError> {
    let started = std::time::Instant::now();
    for file in [&graph_ref.graph, &graph_ref.data] {
        verify_file(dir, file)?;
    }
    let verified = started.elapsed();
    if graph_ref.graph.name != format!("{}.hnsw.graph", graph_ref.basename)
        || graph_ref.data.name != format!("{}.hnsw.data", graph_ref.basename)
    {
        return Err(IndexError::Corrupt(
            "graph file names do not match the basename".into(),
        ));
    }
    // Mapped, the vectors are read from the data file's pages rather than copied to the heap: at
    // a million vectors the loaded replica's anonymous memory went from 4.27 to 3.00 GB (the 768 MB of
    // vectors, and the holes `hnsw_rs`'s loader leaves in the heap when it frees its neighbour
    // lists, allocated amid the points), its resident set from 4.32 to 3.80 GB (the mapped
    // file's pages count, but the kernel can drop them under pressure), with the same load time
    // and search latency (`benches/results/2026-12-06-index-mmap.md`). A data file is never
    // written once saved (a save writes a new generation). `load_hnsw` ties the graph's lifetime
    // to its loader, which owns the mapping and `hnsw_rs`'s map of each point's place in the file
    // (about 40 MB at a million points): leaking it gives the `'static` graph the index stores,
    // without unsafe code, and keeps both until the process exits, the graph rebuilt or dropped
    // or not; a data file a later save deletes keeps its disk space until then too. `hnsw_rs`
    // opens the files again by path to map them, and exits the process if it cannot: the
    // semantic stage never deletes a dump while one loads, and a load beside the store's open
    // (which moves a corrupt store's index aside) reads them into the heap.
    let mut loader = HnswIo::new(dir, &graph_ref.basename);
    loader.set_options(ReloadOptions::default().set_mmap(vectors == Vectors::Mapped));
    let loader: &'static mut HnswIo = Box::leak(Box::new(loader));
    let mut graph = catch_unwind(AssertUnwindSafe(move || {
        let loader = loader;
        HnswIo::load_hnsw::<Code, DistF16>(loader)
    }))
    .map_err(|_| IndexError::Corrupt("hnsw_rs panicked while loading the graph".into()))?
    .map_err(|e| IndexError::Corrupt(format!("graph: {e}")))?;
    // The loader turns this on; keep inserts as cheap as in a freshly built graph.
    graph.set_extend_candidates(false);
    tracing::debug!(
        points = graph_ref.points,
        verify_ms = verified.as_millis() as u64,
        load_ms = (started.elapsed() - verified).as_millis() as u64,
        "index graph loaded"
    );
    Ok(graph)
}

/// Makes the manifest rename durable.
fn sync_dir(dir: &Path) -> Result<(), IndexError> {
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// The generation a file of ours belongs to: `entries-<gen>.bin`,
/// `sealed-<gen>-<part>-<segment>.bin`, `graph-<gen>-<part>-<segment>.hnsw.*` (format 2's
/// `graph-<gen>-<part>.hnsw.*`, format 1's `graph-<gen>.hnsw.*`).
fn generation_of(name: &str) -> Option<u64> {
    name.strip_prefix("entries-")
        .and_then(|rest| rest.strip_suffix(".bin"))
        .or_else(|| {
            let rest = name.strip_prefix("sealed-")?.strip_suffix(".bin")?;
            Some(rest.split_once('-').map_or(rest, |(g, _)| g))
        })
        .or_else(|| {
            let rest = name.strip_prefix("graph-")?;
            let rest = rest
                .strip_suffix(".hnsw.graph")
                .or_else(|| rest.strip_suffix(".hnsw.data"))?;
            Some(rest.split_once('-').map_or(rest, |(g, _)| g))
        })
        .and_then(|g| g.parse::<u64>().ok())
}

/// Our files in `dir`, with their generation.
fn our_files(dir: &Path) -> Vec<(u64, fs::DirEntry)> {
    let Ok(listing) = fs::read_dir(dir) else {
        return Vec::new();
    };
    listing
        .flatten()
        .filter_map(|entry| Some((generation_of(&entry.file_name().to_string_lossy())?, entry)))
        .collect()
}

/// The generations that have files in `dir`.
fn generations_on_disk(dir: &Path) -> BTreeSet<u64> {
    our_files(dir).into_iter().map(|(g, _)| g).collect()
}

/// Deletes our files of other generations. Best effort: a leftover file only costs disk space.
fn remove_other_generations(dir: &Path, keep: u64) {
    for (generation, entry) in our_files(dir) {
        if generation != keep {
            if let Err(e) = fs::remove_file(entry.path()) {
                let name = entry.file_name().to_string_lossy().into_owned();
                tracing::warn!(file = %name, error = %e, "could not delete an old index dump file");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    pub(super) fn unit(rng: &mut StdRng, dimension: usize) -> Vec<f32> {
        let v: Vec<f32> = (0..dimension)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / norm).collect()
    }

    /// Every item's own vector finds it first in its partition.
    fn finds_each<'a>(
        index: &HnswIndex,
        items: impl IntoIterator<Item = &'a (VectorId, PartitionTag, Vec<f32>)>,
    ) {
        for (id, p, v) in items {
            assert_eq!(index.search(p, v, 1)[0].id, *id, "lost {id}");
        }
    }

    fn tag(n: u8) -> PartitionTag {
        [n; 32]
    }

    /// `(id, partition, random unit vector)` for each id of `ids`.
    fn random_items(
        rng: &mut StdRng,
        ids: std::ops::Range<VectorId>,
        partition: PartitionTag,
        dimension: usize,
    ) -> Vec<(VectorId, PartitionTag, Vec<f32>)> {
        ids.map(|id| (id, partition, unit(rng, dimension)))
            .collect()
    }

    /// Exact best id by a naive scan of the items, for reference.
    fn naive_best(
        items: &[(VectorId, PartitionTag, Vec<f32>)],
        partition: &PartitionTag,
        q: &[f32],
    ) -> VectorId {
        let mut best = (f64::MIN, 0);
        for (id, _, v) in items.iter().filter(|(_, p, _)| p == partition) {
            let s: f64 = v
                .iter()
                .zip(q)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            if s > best.0 {
                best = (s, *id);
            }
        }
        best.1
    }

    fn small_config(dimension: usize) -> IndexConfig {
        // Smaller than production so debug-mode tests stay quick; the graph logic is the same.
        IndexConfig {
            max_connections: 8,
            ef_construction: 32,
            ..IndexConfig::new(dimension)
        }
    }

    #[test]
    fn dist_dot_is_one_minus_cosine() {
        let mut rng = StdRng::seed_from_u64(1);
        for dimension in [1, 7, 16, 37, 384] {
            for _ in 0..20 {
                let a = unit(&mut rng, dimension);
                let b = unit(&mut rng, dimension);
                let naive = |x: &[f32], y: &[f32]| {
                    let d: f64 = x
                        .iter()
                        .zip(y)
                        .map(|(p, q)| f64::from(*p) * f64::from(*q))
                        .sum();
                    let nx: f64 = x.iter().map(|p| f64::from(*p).powi(2)).sum::<f64>().sqrt();
                    let ny: f64 = y.iter().map(|p| f64::from(*p).powi(2)).sum::<f64>().sqrt();
                    (1.0 - d / (nx * ny)).max(0.0)
                };
                let got = f64::from(DistDot.eval(&a, &b));
                assert!(
                    (got - naive(&a, &b)).abs() < 1e-5,
                    "dim {dimension}: {got} vs {}",
                    naive(&a, &b)
                );
                assert!(DistDot.eval(&a, &a) >= 0.0 && DistDot.eval(&a, &a) < 1e-5);
            }
        }
        let neg: Vec<f32> = [0.6f32, 0.8].iter().map(|x| -x).collect();
        assert!((DistDot.eval(&[0.6, 0.8], &neg) - 2.0).abs() < 1e-6);
        assert_eq!(
            DistDot.eval(&[f32::NAN], &[1.0]),
            0.0,
            "NaN must not reach hnsw_rs"
        );
    }

    #[test]
    fn scan_all_crosses_partitions_and_honours_the_floor() {
        let dimension = 16;
        let mut rng = StdRng::seed_from_u64(9);
        let index = HnswIndex::new(small_config(dimension));
        let items: Vec<_> = (0..300u64)
            .map(|id| (id, tag((id % 7) as u8), unit(&mut rng, dimension)))
            .collect();
        for (id, p, v) in &items {
            index.insert(*id, *p, v);
        }
        index.remove(5);
        let query = items[5].2.clone();
        let all = index.scan_all(&query, -1.0, 300);
        assert_eq!(all.len(), 299, "every live vector, removed ones excluded");
        assert!(all.windows(2).all(|w| w[0].similarity >= w[1].similarity));
        let close = index.scan_all(&items[12].2, 0.999, 10);
        assert_eq!(close.iter().map(|n| n.id).collect::<Vec<_>>(), [12]);
        let floor = 0.3;
        let above = index.scan_all(&query, floor, 1000);
        let expected = all.iter().filter(|n| n.similarity >= floor).count();
        assert_eq!(above.len(), expected);
        assert_eq!(index.scan_all(&query, -1.0, 3).len(), 3);
    }

    /// 20k vectors in other partitions, a 3-vector partition and a 5k-vector partition.
    fn mixed_items(dimension: usize) -> Vec<(VectorId, PartitionTag, Vec<f32>)> {
        let mut rng = StdRng::seed_from_u64(2);
        let mut items = Vec::new();
        for id in 0..20_000u64 {
            items.push((id, tag((id % 4) as u8), unit(&mut rng, dimension)));
        }
        for id in 20_000..20_003u64 {
            items.push((id, tag(100), unit(&mut rng, dimension)));
        }
        for id in 30_000..35_000u64 {
            items.push((id, tag(200), unit(&mut rng, dimension)));
        }
        items
    }

    #[test]
    fn filtered_search_is_exact_for_tiny_and_accurate_for_medium_partitions() {
        let dimension = 16;
        let items = mixed_items(dimension);
        let config = IndexConfig {
            max_connections: 16,
            ef_construction: 32,
            ..IndexConfig::new(dimension)
        };
        let index = HnswIndex::build(config, items.clone());
        assert_eq!(index.len(), 25_003);
        let mut rng = StdRng::seed_from_u64(3);

        for _ in 0..50 {
            let q = unit(&mut rng, dimension);
            let found = index.search(&tag(100), &q, 1);
            assert_eq!(found.len(), 1);
            assert_eq!(found[0].id, naive_best(&items, &tag(100), &q));
            let all = index.search(&tag(100), &q, 5);
            assert_eq!(all.len(), 3, "only the partition's vectors");
            assert!(all.windows(2).all(|w| w[0].similarity >= w[1].similarity));
        }

        // 5k is above brute_force_below, so this goes through the filtered graph search.
        let mut hits = 0;
        for _ in 0..200 {
            let q = unit(&mut rng, dimension);
            let found = index.search(&tag(200), &q, 1);
            assert!(found.iter().all(|n| (30_000..35_000).contains(&n.id)));
            if found.first().map(|n| n.id) == Some(naive_best(&items, &tag(200), &q)) {
                hits += 1;
            }
        }
        let recall = f64::from(hits) / 200.0;
        println!("medium partition recall@1 = {recall}");
        assert!(recall >= 0.98, "recall@1 {recall}");
        assert!(index
            .search(&tag(9), &unit(&mut rng, dimension), 1)
            .is_empty());
    }

    #[test]
    fn a_partition_the_graph_misses_falls_back_to_an_exact_scan() {
        // brute_force_below 0 sends this 8-vector partition to the graph first; among 3000 other
        // vectors, 5 of its members almost never all make the unfiltered top-ef, so the search
        // widens, finds the graph no cheaper than a scan, and scans. Either way the answer is exact.
        let dimension = 16;
        let mut rng = StdRng::seed_from_u64(9);
        let mut items = random_items(&mut rng, 0..3_000, tag(1), dimension);
        items.extend(random_items(&mut rng, 5_000..5_008, tag(2), dimension));
        let config = IndexConfig {
            brute_force_below: 0,
            ..small_config(dimension)
        };
        let index = HnswIndex::build(config, items.clone());
        for _ in 0..50 {
            let q = unit(&mut rng, dimension);
            let mut expected: Vec<(f32, VectorId)> = items[3_000..]
                .iter()
                .map(|(id, _, v)| (dot(&q, v), *id))
                .collect();
            expected.sort_by(|a, b| b.0.total_cmp(&a.0));
            let found: Vec<VectorId> = index.search(&tag(2), &q, 5).iter().map(|n| n.id).collect();
            let expected: Vec<VectorId> = expected.iter().take(5).map(|(_, id)| *id).collect();
            assert_eq!(found, expected);
        }
    }

    #[test]
    fn removed_ids_are_never_returned_and_rebuild_compacts() {
        let dimension = 16;
        let mut rng = StdRng::seed_from_u64(4);
        let items = random_items(&mut rng, 0..3_000, tag(1), dimension);
        // brute_force_below 0 sends every search through the graph.
        let config = IndexConfig {
            brute_force_below: 0,
            ..small_config(dimension)
        };
        let index = HnswIndex::build(config, items.clone());
        let removed = |id: VectorId| id % 10 < 3;
        for (id, _, _) in items.iter().filter(|(id, _, _)| removed(*id)) {
            index.remove(*id);
        }
        index.remove(1_000_000); // unknown ids are ignored
        assert_eq!(index.len(), 2_100);
        assert_eq!(index.tombstones(), 900);
        for (id, p, v) in items.iter().filter(|(id, _, _)| removed(*id)).take(300) {
            let found = index.search(p, v, 10);
            assert_eq!(found.len(), 10);
            assert!(
                found.iter().all(|n| !removed(n.id)),
                "removed {id} came back"
            );
        }

        assert!(index.maybe_rebuild());
        assert_eq!(index.tombstones(), 0);
        assert_eq!(index.len(), 2_100);
        for (id, p, v) in items.iter().filter(|(id, _, _)| !removed(*id)) {
            assert_eq!(index.search(p, v, 1)[0].id, *id);
        }
        assert!(!index.maybe_rebuild(), "nothing left to compact");
    }

    #[test]
    fn inserts_during_a_rebuild_are_kept() {
        let dimension = 16;
        let mut rng = StdRng::seed_from_u64(5);
        let base = random_items(&mut rng, 0..3_000, tag(1), dimension);
        let extra = random_items(&mut rng, 10_000..10_300, tag(1), dimension);
        let config = IndexConfig {
            brute_force_below: 0,
            ..small_config(dimension)
        };
        let index = HnswIndex::build(config, base.clone());
        for id in 0..1_000 {
            index.remove(id);
        }
        std::thread::scope(|s| {
            let rebuilt = s.spawn(|| index.maybe_rebuild());
            for (id, p, v) in &extra {
                index.insert(*id, *p, v);
            }
            assert!(rebuilt.join().expect("rebuild thread"));
        });
        assert_eq!(index.len(), 2_300);
        assert_eq!(index.tombstones(), 0);
        finds_each(&index, base.iter().skip(1_000).chain(&extra));
    }

    #[test]
    fn a_growing_partition_gets_its_own_graph_and_a_shrunk_one_goes_flat() {
        let dimension = 16;
        let mut rng = StdRng::seed_from_u64(9);
        let config = IndexConfig {
            brute_force_below: 200,
            ..small_config(dimension)
        };
        let index = HnswIndex::new(config);
        let items: Vec<_> = (0..600u64)
            .map(|id| (id, tag(1 + (id % 3 == 0) as u8), unit(&mut rng, dimension)))
            .collect();
        for (id, p, v) in &items {
            index.insert(*id, *p, v);
        }
        assert_eq!(
            graph_kinds(&index),
            [false, false],
            "inserts never build a graph inline"
        );
        // Tag 1 (the second partition seen, id 0 is tag 2's) holds 400, past 200: it gets a
        // graph; tag 2 (200) stays flat.
        assert!(index.maybe_rebuild());
        assert!(!index.maybe_rebuild());
        assert_eq!(graph_kinds(&index), [false, true]);
        assert_eq!(index.len(), 600);
        finds_each(&index, &items);
        // Down to 100 live (half the limit): flat again, exact, no tombstones.
        for (id, _, _) in items.iter().filter(|(_, p, _)| *p == tag(1)).skip(100) {
            index.remove(*id);
        }
        assert_eq!(index.tombstones(), 300);
        assert!(index.maybe_rebuild());
        assert_eq!(graph_kinds(&index), [false, false]);
        assert_eq!((index.len(), index.tombstones()), (300, 0));
        finds_each(
            &index,
            items.iter().filter(|(_, p, _)| *p == tag(1)).take(100),
        );
    }

    /// Whether each partition (in the order first seen) has a graph.
    fn graph_kinds(index: &HnswIndex) -> Vec<bool> {
        read(&index.state)
            .parts
            .iter()
            .map(|p| matches!(p.body, Body::Graph(_)))
            .collect()
    }

    #[test]
    fn a_flat_build_serves_every_vector_exactly_and_graphs_follow_the_largest_first() {
        let dimension = 16;
        let mut rng = StdRng::seed_from_u64(21);
        // The production graph settings, whose self-queries `hnsw_rs` rarely gets wrong (below).
        let config = IndexConfig {
            brute_force_below: 100,
            ..IndexConfig::new(dimension)
        };
        // Seen first: the smallest large partition, so "largest first" is not "first seen".
        let mut items = random_items(&mut rng, 0..150, tag(1), dimension);
        items.extend(random_items(&mut rng, 150..550, tag(2), dimension));
        items.extend(random_items(&mut rng, 550..600, tag(3), dimension));
        let index = HnswIndex::build_flat(config, items.clone());
        assert_eq!(graph_kinds(&index), [false, false, false]);
        assert_eq!((index.len(), index.graphs_pending()), (600, 2));
        // An operator's "every match" (invalidation by meaning asks for `usize::MAX`).
        assert_eq!(index.scan_all(&items[0].2, -1.0, usize::MAX).len(), 600);
        let exact = |index: &HnswIndex| {
            for (id, p, v) in &items {
                let q: Vec<f32> = v.iter().map(|x| x + 0.05).collect();
                let found = index.search_now(p, &q, 1, 0.9).expect("a permit is free");
                assert_eq!(found[0].id, naive_best(&items, p, &q), "query near {id}");
            }
        };
        exact(&index);
        assert!(index.maybe_rebuild());
        assert_eq!(graph_kinds(&index), [false, true, false], "400 before 150");
        assert_eq!(index.graphs_pending(), 1);
        assert!(index.maybe_rebuild());
        assert_eq!(graph_kinds(&index), [true, true, false]);
        assert_eq!(index.graphs_pending(), 0);
        assert!(!index.maybe_rebuild());
        assert_eq!(index.len(), 600);
        assert_eq!(
            index.ids(),
            items.iter().map(|(id, _, _)| *id).collect::<BTreeSet<_>>()
        );
        // Through the graphs now: `hnsw_rs` leaves a point of a graph this small unreachable in
        // about one build in fifteen (seen here), so the self-queries are held to 99%.
        let found = items
            .iter()
            .filter(|(id, p, v)| index.search(p, v, 1)[0].id == *id)
            .count();
        assert!(found >= 594, "{found} of 600 found themselves");
        // The same as a build with its graphs at once.
        let built = HnswIndex::build(index.config.clone(), items.clone());
        assert_eq!(
            (graph_kinds(&built), built.graphs_pending()),
            (vec![true, true, false], 0)
        );
    }

    #[test]
    fn a_scan_awaiting_its_graph_is_refused_on_the_request_path_when_every_core_scans() {
        let dimension = 8;
        let mut rng = StdRng::seed_from_u64(22);
        // The sketches off: exact scans, which the permits ration (a search by sketches needs
        // none, see `a_large_flat_partition_is_searched_by_its_sketches`).
        let config = IndexConfig {
            brute_force_below: 50,
            recheck_below: -2.0,
            ..small_config(dimension)
        };
        // Past `brute_force_below`: one worth parallel chunks, one scanned inline (a partition
        // that just grew past the limit), and a small one.
        let large_rows = (SCAN_CHUNK + 100) as VectorId;
        let mut items = random_items(&mut rng, 0..large_rows, tag(1), dimension);
        items.extend(random_items(
            &mut rng,
            large_rows..large_rows + 200,
            tag(2),
            dimension,
        ));
        items.extend(random_items(
            &mut rng,
            large_rows + 200..large_rows + 220,
            tag(3),
            dimension,
        ));
        let index = HnswIndex::build_flat(config, items.clone());
        assert_eq!(index.graphs_pending(), 2);
        let (large, grown, small) = (
            &items[3],
            &items[large_rows as usize + 5],
            &items[large_rows as usize + 205],
        );
        let mut permits = Vec::new();
        while let Ok(permit) = ScanPermit::take(&index.large_scans) {
            permits.push(permit);
        }
        assert!(!permits.is_empty());
        assert_eq!(index.search_now(&large.1, &large.2, 1, 0.9), Err(ScansBusy));
        // Smaller partitions are scanned inline, as before; `search` (operators, tests) waits for none.
        for row in [grown, small] {
            assert_eq!(
                index.search_now(&row.1, &row.2, 1, 0.9).expect("inline")[0].id,
                row.0
            );
        }
        assert_eq!(index.search(&large.1, &large.2, 1)[0].id, large.0);
        permits.pop();
        assert_eq!(
            index
                .search_now(&large.1, &large.2, 1, 0.9)
                .expect("one free")[0]
                .id,
            large.0
        );
        drop(permits);
        assert_eq!(
            index.large_scans.load(AtomicOrdering::Relaxed),
            0,
            "every permit returned"
        );
        // Once the graph is built, no permit is needed.
        assert!(index.maybe_rebuild());
        let _all = index.hold_every_scan();
        // (Whether the graph finds this very point is `hnsw_rs`'s recall, not what is tested.)
        assert_eq!(
            index
                .search_now(&large.1, &large.2, 1, 0.9)
                .map(|found| found.len()),
            Ok(1)
        );
    }

    #[test]
    fn a_flat_scan_larger_than_a_chunk_is_exact() {
        let dimension = 8;
        let mut rng = StdRng::seed_from_u64(23);
        let n = (2 * SCAN_CHUNK + SCAN_CHUNK / 2) as VectorId;
        let items = random_items(&mut rng, 0..n, tag(1), dimension);
        let index = HnswIndex::build_flat(
            IndexConfig {
                brute_force_below: n as usize,
                ..small_config(dimension)
            },
            items.clone(),
        );
        for (id, p, v) in items.iter().step_by(9_973) {
            let found = index.search_now(p, v, 3, 0.9).expect("no large scan");
            assert_eq!(found[0].id, *id);
            assert_eq!(found.len(), 3);
            assert!(found.windows(2).all(|w| w[0].similarity >= w[1].similarity));
        }
    }

    /// A large flat partition (awaiting its graph) is searched by its rows' sketches: every
    /// paraphrase finds its source, as the exact scan does, after removals moved the last rows
    /// (and their sketches) into the removed ones' places and inserts appended rows; in one chunk,
    /// or in several shared with the search threads.
    #[test]
    fn a_large_flat_partition_is_searched_by_its_sketches() {
        let dimension = 64;
        let mut rng = StdRng::seed_from_u64(25);
        let n = (SCAN_CHUNK + 2_000) as VectorId;
        let items = random_items(&mut rng, 0..n, tag(1), dimension);
        let added = random_items(&mut rng, n..n + 300, tag(1), dimension);
        let removed = |id: VectorId| id % 97 == 3;
        // Paraphrases at cosine about 0.97, of rows from everywhere (moved ones among them).
        let queries: Vec<(VectorId, Vec<f32>)> = items
            .iter()
            .chain(&added)
            .step_by(89)
            .map(|(id, _, v)| {
                let noise = unit(&mut rng, dimension);
                (
                    *id,
                    v.iter().zip(&noise).map(|(v, n)| v + 0.25 * n).collect(),
                )
            })
            .collect();
        assert!(queries.iter().any(|(id, _)| removed(*id)));
        // -2: the sketches unused, the exact scan as before (the reference).
        for (recheck_below, sketch_chunk) in [(0.9, 1 << 18), (0.9, 5_000), (-2.0, 1 << 18)] {
            let config = IndexConfig {
                brute_force_below: 100,
                recheck_below,
                sketch_chunk,
                ..small_config(dimension)
            };
            let index = HnswIndex::build_flat(config, items.clone());
            for (id, _, _) in items.iter().filter(|(id, _, _)| removed(*id)) {
                index.remove(*id);
            }
            for (id, p, v) in &added {
                index.insert(*id, *p, v);
            }
            assert_eq!(index.graphs_pending(), 1, "still flat");
            // Every permit held: an exact scan is refused, a search by sketches needs none.
            let held = index.hold_every_scan();
            let (_, q) = &queries[0];
            let exact = recheck_below < -1.0;
            assert_eq!(index.search_now(&tag(1), q, 4, 0.9).is_err(), exact);
            assert_eq!(
                index.search_now(&tag(1), q, 65, 0.9).err(),
                Some(ScansBusy),
                "more than 64 wanted: scanned exactly"
            );
            drop(held);
            // As built and changed, then loaded from its dump (its flat rows sketched again).
            let dir = tempfile::tempdir().expect("tempdir");
            index.save(dir.path()).expect("save");
            let loaded = HnswIndex::load(dir.path(), index.config.clone()).expect("load");
            assert_eq!(loaded.graphs_pending(), 1, "loaded flat");
            for (index, how) in [(&index, "built"), (&loaded, "loaded")] {
                for (id, q) in &queries {
                    let found = index
                        .search_now(&tag(1), q, 4, 0.9)
                        .expect("a permit is free");
                    assert_eq!(found.len(), 4);
                    assert!(found.windows(2).all(|w| w[0].similarity >= w[1].similarity));
                    if removed(*id) {
                        assert!(found.iter().all(|f| f.id != *id), "removed {id} found");
                    } else {
                        assert_eq!(
                            found[0].id, *id,
                            "{how}, {recheck_below} {sketch_chunk}: near {id}"
                        );
                    }
                }
            }
        }
    }

    /// A graph that shrank is made flat by a rebuild, its rows sketched on the way (outside the
    /// lock); grown past 32,768 rows again before the maintenance gives it its graph back, it is
    /// searched by those sketches, and finds its old rows as its new ones.
    #[test]
    fn a_partition_made_flat_by_a_rebuild_keeps_a_sketch_per_row() {
        let dimension = 16;
        let mut rng = StdRng::seed_from_u64(26);
        let config = IndexConfig {
            brute_force_below: 100,
            ..small_config(dimension)
        };
        let items = random_items(&mut rng, 0..300, tag(1), dimension);
        let index = HnswIndex::build(config, items.clone());
        assert_eq!(graph_kinds(&index), [true]);
        for (id, _, _) in &items[40..] {
            index.remove(*id);
        }
        // (A segment left to seal is sealed first: each call does one piece of work.)
        for _ in 0..4 {
            index.maybe_rebuild();
        }
        assert_eq!(graph_kinds(&index), [false], "40 live rows: flat");
        let grown = random_items(
            &mut rng,
            300..300 + SCAN_CHUNK as VectorId,
            tag(1),
            dimension,
        );
        for (id, p, v) in &grown {
            index.insert(*id, *p, v);
        }
        {
            let state = read(&index.state);
            let Body::Flat(flat) = &state.parts[0].body else {
                panic!("flat");
            };
            assert_eq!(flat.sketches.len(), flat.ids.len());
            assert!(
                flat.ids.len() > SCAN_CHUNK,
                "large: searched by its sketches"
            );
        }
        let _held = index.hold_every_scan();
        for (id, _, v) in items[..40].iter().chain(grown.iter().step_by(997)) {
            let q: Vec<f32> = v.iter().map(|x| x + 0.02).collect();
            let found = index
                .search_now(&tag(1), &q, 1, 0.9)
                .expect("no permit needed");
            assert_eq!(found[0].id, *id);
        }
    }

    #[test]
    fn best_k_keeps_what_a_full_sort_keeps() {
        let mut rng = StdRng::seed_from_u64(24);
        for n in [0usize, 1, 5, 64, 1_000] {
            // Few distinct similarities, so ties (broken by id) are common.
            let found: Vec<Neighbor> = (0..n as VectorId)
                .map(|id| Neighbor {
                    id,
                    similarity: f32::from(rng.random_range(0u8..20)) / 20.0,
                })
                .collect();
            for k in [1usize, 2, 7, n, n + 3, usize::MAX] {
                if k == 0 {
                    continue;
                }
                assert_eq!(
                    best_k(found.iter().cloned(), k),
                    top_k(found.clone(), k),
                    "n {n}, k {k}"
                );
            }
            assert!(best_k(found.iter().cloned(), 0).is_empty());
        }
    }

    /// Partition `tag`'s graph segments, `S` sealed and `G` growing.
    fn segment_kinds(index: &HnswIndex, partition: PartitionTag) -> String {
        let state = read(&index.state);
        let part = state.part_of[&partition];
        match &state.parts[part as usize].body {
            Body::Graph(g) => g
                .segments
                .iter()
                .map(|s| match s {
                    Segment::Growing(_) => 'G',
                    Segment::Sealed(_) => 'S',
                })
                .collect(),
            Body::Flat(_) => String::new(),
        }
    }

    /// [`HnswIndex::build`] with its graphs left growing, as dumps of formats 2 and 3 hold them.
    fn build_growing(
        config: IndexConfig,
        items: Vec<(VectorId, PartitionTag, Vec<f32>)>,
    ) -> HnswIndex {
        let index = HnswIndex::build(config, items);
        {
            let mut state = write(&index.state);
            for part in 0..state.parts.len() {
                // Freshly built, no tombstones: row `i` is slot `i`.
                let rows = state.rows(part as u32);
                if let Body::Graph(g) = &mut state.parts[part].body {
                    g.segments = build_hnsw(&index.config, &rows.codes)
                        .into_iter()
                        .map(|graph| {
                            Segment::Growing(Arc::new(Growing::new(graph, index.config.dimension)))
                        })
                        .collect();
                }
            }
        }
        index
    }

    /// The sizes of partition `tag`'s graph segments.
    fn segment_sizes(index: &HnswIndex, partition: PartitionTag) -> Vec<usize> {
        let state = read(&index.state);
        let part = state.part_of[&partition];
        match &state.parts[part as usize].body {
            Body::Graph(g) => g.segments.iter().map(|s| s.points()).collect(),
            Body::Flat(_) => Vec::new(),
        }
    }

    #[test]
    fn a_large_partition_is_split_into_segments_that_search_load_and_rebuild_as_one_graph() {
        let dimension = 16;
        let mut rng = StdRng::seed_from_u64(12);
        let config = IndexConfig {
            brute_force_below: 100,
            segment_points: 400,
            ..small_config(dimension)
        };
        let mut items = random_items(&mut rng, 0..1_500, tag(1), dimension);
        let index = HnswIndex::build(config.clone(), items.clone());
        // As few segments as the limit allows, of equal size.
        assert_eq!(segment_sizes(&index, tag(1)), [375, 375, 375, 375]);
        finds_each(&index, &items);
        // Results merge across segments: the best of the partition, not of one segment.
        let mut exact = 0;
        for _ in 0..200 {
            let q = unit(&mut rng, dimension);
            exact +=
                usize::from(index.search(&tag(1), &q, 1)[0].id == naive_best(&items, &tag(1), &q));
        }
        assert!(exact >= 196, "recall@1 {exact}/200");

        // Built segments are sealed: inserts start a growing one, fill it to the limit, start
        // another, and the maintenance seals the full one.
        assert_eq!(segment_kinds(&index, tag(1)), "SSSS");
        let more = random_items(&mut rng, 1_500..2_000, tag(1), dimension);
        for (id, p, v) in &more {
            index.insert(*id, *p, v);
        }
        items.extend(more);
        assert_eq!(
            segment_sizes(&index, tag(1)),
            [375, 375, 375, 375, 400, 100]
        );
        assert_eq!(segment_kinds(&index, tag(1)), "SSSSGG");
        finds_each(&index, &items);
        assert!(index.maybe_rebuild());
        assert_eq!(segment_kinds(&index, tag(1)), "SSSSSG");
        assert!(!index.maybe_rebuild(), "the open segment stays growing");
        finds_each(&index, &items);

        // Removed ids are never returned, from any segment.
        for id in (0..2_000).step_by(3) {
            index.remove(id);
        }
        items.retain(|(id, _, _)| id % 3 != 0);
        finds_each(&index, &items);

        // A dump names every segment, and loads back as the same graph.
        let dir = tempfile::tempdir().expect("tempdir");
        index.save(dir.path()).expect("save");
        let manifest = read_manifest(dir.path()).expect("manifest");
        assert_eq!(manifest.format_version, FORMAT_VERSION);
        let sealed: Vec<(u32, usize)> = manifest
            .sealed
            .iter()
            .map(|s| (s.segment, s.points))
            .collect();
        assert_eq!(sealed, [(0, 375), (1, 375), (2, 375), (3, 375), (4, 400)]);
        let growing: Vec<(u32, usize)> = manifest
            .graphs
            .iter()
            .map(|g| (g.segment, g.points))
            .collect();
        assert_eq!(growing, [(5, 100)]);
        let loaded = HnswIndex::load(dir.path(), config.clone()).expect("load");
        assert_eq!(
            segment_sizes(&loaded, tag(1)),
            [375, 375, 375, 375, 400, 100]
        );
        assert_eq!(segment_kinds(&loaded, tag(1)), "SSSSSG");
        assert_eq!(
            (loaded.len(), loaded.tombstones()),
            (index.len(), index.tombstones())
        );
        for _ in 0..50 {
            let q = unit(&mut rng, dimension);
            assert_eq!(loaded.search(&tag(1), &q, 5), index.search(&tag(1), &q, 5));
        }
        finds_each(&loaded, &items);

        // A rebuild (a third are tombstones, past the ratio) splits the live rows afresh.
        assert!(loaded.maybe_rebuild());
        assert_eq!(loaded.tombstones(), 0);
        assert_eq!(segment_sizes(&loaded, tag(1)), [334, 334, 334, 331]);
        assert_eq!(segment_kinds(&loaded, tag(1)), "SSSS");
        finds_each(&loaded, &items);
    }

    /// The maintenance's next step rebuilds partition `tag(1)` into one sealed graph that finds
    /// every item, and leaves nothing more to do.
    fn rebuilds_into_one_sealed_graph(
        index: &HnswIndex,
        items: &[(VectorId, PartitionTag, Vec<f32>)],
    ) {
        assert!(index.maybe_rebuild());
        assert_eq!(segment_kinds(index, tag(1)), "S");
        assert!(!index.maybe_rebuild());
        finds_each(index, items);
    }

    /// A growing segment that cannot be sealed (two points with one slot, as an insert that panicked
    /// half way leaves) gets its partition rebuilt from the live rows instead.
    #[test]
    fn a_segment_that_cannot_be_sealed_gets_its_partition_rebuilt() {
        let dimension = 8;
        let mut rng = StdRng::seed_from_u64(22);
        let config = IndexConfig {
            brute_force_below: 50,
            seal_points: 100,
            ..small_config(dimension)
        };
        let items = random_items(&mut rng, 0..300, tag(1), dimension);
        let index = build_growing(config, items.clone());
        assert_eq!(segment_kinds(&index, tag(1)), "G");
        {
            let state = read(&index.state);
            let Body::Graph(g) = &state.parts[0].body else {
                panic!("a graph partition");
            };
            let Segment::Growing(graph) = &g.segments[0] else {
                panic!("growing");
            };
            graph.insert(&encode_f16(&unit(&mut rng, dimension)), 5);
        }
        assert_eq!(index.seal_one(), Seal::Failed(0));
        rebuilds_into_one_sealed_graph(&index, &items);
    }

    /// A growing segment of at most [`SCAN_GROWING_POINTS`] is scanned exactly, a larger one
    /// searched through `hnsw_rs`: either way only live points come back, most similar first.
    #[test]
    fn growing_segments_are_scanned_when_small_and_searched_when_large() {
        let dimension = 8;
        let mut rng = StdRng::seed_from_u64(23);
        for n in [SCAN_GROWING_POINTS / 8, SCAN_GROWING_POINTS + 500] {
            let items = random_items(&mut rng, 0..n as u64, tag(1), dimension);
            let config = IndexConfig {
                brute_force_below: 100,
                ..small_config(dimension)
            };
            let index = build_growing(config, items.clone());
            assert_eq!(segment_kinds(&index, tag(1)), "G");
            for (id, _, _) in items.iter().step_by(10) {
                index.remove(*id);
            }
            let live: Vec<_> = items
                .iter()
                .filter(|(id, ..)| id % 10 != 0)
                .cloned()
                .collect();
            let queries = 200;
            let mut exact = 0;
            for _ in 0..queries {
                let q = unit(&mut rng, dimension);
                let found = index.search(&tag(1), &q, 10);
                assert_eq!(found.len(), 10, "n={n}");
                assert!(
                    found.iter().all(|f| f.id % 10 != 0),
                    "n={n}: a removed point"
                );
                assert!(
                    found.windows(2).all(|w| w[0].similarity >= w[1].similarity),
                    "n={n}: not most similar first"
                );
                // Scores are f32 · f16: a tie within f16's rounding may go either way.
                let best = naive_best(&live, &tag(1), &q);
                let best_similarity = dot(
                    &q,
                    &live.iter().find(|(id, ..)| *id == best).expect("live").2,
                );
                exact += usize::from(
                    found[0].id == best || found[0].similarity >= best_similarity - 2e-3,
                );
            }
            if n <= SCAN_GROWING_POINTS {
                assert_eq!(exact, queries, "a scan is exact");
            } else {
                // `hnsw_rs` may miss now and then; the scan above may not.
                assert!(exact * 100 >= queries * 95, "n={n}: {exact} of {queries}");
            }
        }
    }

    /// A graph too sparse to navigate random vectors (2 links a point, a search 1 wide) misses
    /// most near duplicates; the recheck of its sealed segment's sketches finds every live one,
    /// never a removed point, nor a replaced vector's old row, nor an id twice: scanned whole on
    /// the caller's thread, or in chunks shared with the search threads. A recheck of more than
    /// one chunk finds no permit while every search thread scans, and the graph's results stand.
    #[test]
    fn a_search_that_found_nothing_near_is_rechecked_for_near_duplicates() {
        let dimension = 64;
        let mut rng = StdRng::seed_from_u64(29);
        let items = random_items(&mut rng, 0..3_000, tag(1), dimension);
        let sparse = |recheck_below, sketch_chunk| IndexConfig {
            max_connections: 2,
            ef_construction: 4,
            ef_search: 1,
            brute_force_below: 100,
            recheck_below,
            sketch_chunk,
            ..IndexConfig::new(dimension)
        };
        // A paraphrase of every tenth item, at cosine about 0.97 to it. Of those items, every
        // fifth is then removed, and every fifth after it given a new vector.
        let queries: Vec<(VectorId, Vec<f32>)> = items
            .iter()
            .step_by(10)
            .map(|(id, _, v)| {
                let noise = unit(&mut rng, dimension);
                let q: Vec<f32> = v.iter().zip(&noise).map(|(v, n)| v + 0.25 * n).collect();
                (*id, q)
            })
            .collect();
        let removed = |id: VectorId| id.is_multiple_of(50);
        let replaced = |id: VectorId| id % 50 == 10;
        let moved = random_items(&mut rng, 0..3_000, tag(1), dimension);
        // `request`: the threshold a request passes on the request path, beside the configured one;
        // `busy`: every scan permit held meanwhile.
        let found = |recheck_below, request: Option<f32>, chunk, busy: bool| {
            let index = HnswIndex::build(sparse(recheck_below, chunk), items.clone());
            let _held = busy.then(|| index.hold_every_scan());
            assert_eq!(segment_kinds(&index, tag(1)), "S");
            for (id, _) in &queries {
                if removed(*id) {
                    index.remove(*id);
                } else if replaced(*id) {
                    index.insert(*id, tag(1), &moved[*id as usize].2);
                }
            }
            queries
                .iter()
                .map(|(id, q)| {
                    let best = match request {
                        Some(at) => index.search_now(&tag(1), q, 4, at).expect("no scan"),
                        None => index.search(&tag(1), q, 4),
                    };
                    assert_eq!(best.len(), 4);
                    assert!(best.windows(2).all(|w| w[0].similarity >= w[1].similarity));
                    let ids: BTreeSet<VectorId> = best.iter().map(|n| n.id).collect();
                    assert_eq!(ids.len(), 4, "an id twice: {best:?}");
                    assert!(!ids.iter().any(|id| removed(*id)), "a removed point");
                    // A replaced id is far from its old vector now: found near it, it was its
                    // old row.
                    if replaced(*id) {
                        assert!(best.iter().all(|n| n.id != *id || n.similarity < 0.5));
                    }
                    usize::from(best[0].id == *id && !removed(*id) && !replaced(*id))
                })
                .sum::<usize>()
        };
        let live = queries
            .iter()
            .filter(|(id, _)| !removed(*id) && !replaced(*id))
            .count();
        // Off (every result counts as near): the sparse graph alone.
        let whole = 1 << 18;
        let graph_alone = found(-1.0, None, whole, false);
        assert!(
            graph_alone * 2 < live,
            "{graph_alone} of {live} without the recheck"
        );
        assert_eq!(found(0.9, None, whole, false), live);
        assert_eq!(
            found(-1.0, Some(0.95), whole, false),
            live,
            "a request's threshold raises the bar"
        );
        assert_eq!(
            found(0.9, Some(-1.0), whole, false),
            live,
            "a lenient request does not lower it"
        );
        // Six chunks of 500 rows, the caller's share and the search threads'.
        assert_eq!(found(0.9, None, 500, false), live, "in chunks");
        assert_eq!(
            found(0.9, Some(0.9), 500, false),
            live,
            "in chunks, request path"
        );
        assert_eq!(
            found(0.9, None, 500, true),
            live,
            "off the request path: no permit needed"
        );
        let busy = found(0.9, Some(0.9), 500, true);
        assert!(busy * 2 < live, "{busy} of {live} with every permit held");
        assert_eq!(
            found(0.9, Some(0.9), whole, true),
            live,
            "one chunk's recheck is not rationed"
        );
    }

    /// Inserts past a built graph go to a growing segment (here larger than
    /// [`SCAN_GROWING_POINTS`], with a `hnsw_rs` graph too sparse to navigate). It is searched by
    /// its points' sketches, or, for more results than a sketch search scores, through its graph
    /// and then rechecked by them: either way every live near duplicate among its points is found,
    /// never a removed point nor a replaced vector's old point; after a dump's load too, where its
    /// points are sketched again. With the sketches off, the graph alone misses most.
    #[test]
    fn a_growing_segment_is_searched_by_its_sketches() {
        let dimension = 64;
        let mut rng = StdRng::seed_from_u64(43);
        let built = 200;
        let total = built + SCAN_GROWING_POINTS as u64 + 1_000;
        let items = random_items(&mut rng, 0..total, tag(1), dimension);
        let queries: Vec<(VectorId, Vec<f32>)> = items[built as usize..]
            .iter()
            .step_by(25)
            .map(|(id, _, v)| {
                let noise = unit(&mut rng, dimension);
                (
                    *id,
                    v.iter().zip(&noise).map(|(v, n)| v + 0.25 * n).collect(),
                )
            })
            .collect();
        // Of the queried items (every 25th id from `built` on), every fourth is removed and every
        // fourth after it given a new vector.
        let removed = |id: VectorId| id >= built && id.is_multiple_of(100);
        let replaced = |id: VectorId| id >= built && id % 100 == 25;
        let moved = random_items(&mut rng, 0..total, tag(1), dimension);
        let live = queries
            .iter()
            .filter(|(id, _)| !removed(*id) && !replaced(*id))
            .count();
        let found = |index: &HnswIndex, k: usize| -> usize {
            queries
                .iter()
                .map(|(id, q)| {
                    let best = index.search(&tag(1), q, k);
                    assert_eq!(best.len(), k);
                    assert!(!best.iter().any(|n| removed(n.id)), "a removed point");
                    if replaced(*id) {
                        assert!(best.iter().all(|n| n.id != *id || n.similarity < 0.5));
                    }
                    usize::from(best[0].id == *id && !removed(*id) && !replaced(*id))
                })
                .sum()
        };
        for recheck_below in [-2.0, 0.9] {
            let config = IndexConfig {
                max_connections: 2,
                ef_construction: 4,
                ef_search: 1,
                brute_force_below: 100,
                recheck_below,
                ..IndexConfig::new(dimension)
            };
            let index = HnswIndex::build(config.clone(), items[..built as usize].to_vec());
            for (id, partition, v) in &items[built as usize..] {
                index.insert(*id, *partition, v);
            }
            for (id, _) in &queries {
                if removed(*id) {
                    index.remove(*id);
                } else if replaced(*id) {
                    index.insert(*id, tag(1), &moved[*id as usize].2);
                }
            }
            assert_eq!(segment_kinds(&index, tag(1)), "SG");
            if recheck_below < -1.0 {
                let graph_alone = found(&index, 4);
                assert!(
                    graph_alone * 2 < live,
                    "{graph_alone} of {live} by the graph"
                );
                continue;
            }
            assert_eq!(found(&index, 4), live, "by the sketches");
            let more = sketch::CANDIDATES + 1;
            assert_eq!(
                found(&index, more),
                live,
                "through the graph, then rechecked"
            );
            let dir = tempfile::tempdir().expect("tempdir");
            index.save(dir.path()).expect("save");
            let loaded = HnswIndex::load(dir.path(), config).expect("load");
            assert_eq!(segment_kinds(&loaded, tag(1)), "SG");
            assert_eq!(found(&loaded, 4), live, "after a load");
            assert_eq!(found(&loaded, more), live, "after a load, rechecked");
        }
    }

    /// Growing segments added by inserts past [`SEGMENTS_BEFORE_MERGE`] are merged by a rebuild.
    #[test]
    fn segments_added_by_inserts_are_merged_once_there_are_too_many() {
        let dimension = 8;
        let mut rng = StdRng::seed_from_u64(21);
        let config = IndexConfig {
            brute_force_below: 50,
            seal_points: 20,
            ..small_config(dimension)
        };
        let mut items = random_items(&mut rng, 0..200, tag(1), dimension);
        let index = HnswIndex::build(config, items.clone());
        let added = 20 * (SEGMENTS_BEFORE_MERGE + 1);
        let more = random_items(&mut rng, 200..200 + added as u64, tag(1), dimension);
        for (id, p, v) in &more {
            index.insert(*id, *p, v);
            while index.seal_one() == Seal::Done {}
        }
        items.extend(more);
        assert_eq!(
            segment_sizes(&index, tag(1)).len(),
            SEGMENTS_BEFORE_MERGE + 2
        );
        rebuilds_into_one_sealed_graph(&index, &items);
    }

    #[test]
    fn a_format_2_dump_loads_as_one_segment_and_grows_new_ones() {
        let dimension = 8;
        let mut rng = StdRng::seed_from_u64(13);
        let items = random_items(&mut rng, 0..500, tag(1), dimension);
        let config = IndexConfig {
            brute_force_below: 100,
            ..small_config(dimension)
        };
        let dir = tempfile::tempdir().expect("tempdir");
        build_growing(config.clone(), items.clone())
            .save(dir.path())
            .expect("save");
        // What the previous build wrote: format 2, `graph-<gen>-<part>` files, no segment field.
        let mut manifest: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.path().join(MANIFEST)).expect("read"))
                .expect("json");
        manifest["format_version"] = 2.into();
        let graph = &mut manifest["graphs"][0];
        graph.as_object_mut().expect("graph ref").remove("segment");
        graph["basename"] = "graph-1-0".into();
        for (field, ext) in [("graph", "graph"), ("data", "data")] {
            let name = format!("graph-1-0.hnsw.{ext}");
            fs::rename(
                dir.path().join(format!("graph-1-0-0.hnsw.{ext}")),
                dir.path().join(&name),
            )
            .expect("rename");
            graph[field]["name"] = name.into();
        }
        fs::write(
            dir.path().join(MANIFEST),
            serde_json::to_vec(&manifest).expect("json"),
        )
        .expect("write");

        let small_segments = IndexConfig {
            segment_points: 200,
            ..config
        };
        let loaded = HnswIndex::load(dir.path(), small_segments).expect("load");
        assert_eq!(segment_sizes(&loaded, tag(1)), [500]);
        assert_eq!(segment_kinds(&loaded, tag(1)), "G");
        // `hnsw_rs` leaves a point of a graph this small unreachable now and then (see
        // `a_flat_build_serves_every_vector_exactly_and_graphs_follow_the_largest_first`).
        let found = |index: &HnswIndex| {
            items
                .iter()
                .filter(|(id, p, v)| index.search(p, v, 1)[0].id == *id)
                .count()
        };
        assert!(found(&loaded) >= 495, "{} of 500", found(&loaded));
        let v = unit(&mut rng, dimension);
        loaded.insert(9_999, tag(1), &v);
        assert_eq!(segment_sizes(&loaded, tag(1)), [500, 1]);
        assert_eq!(loaded.search(&tag(1), &v, 1)[0].id, 9_999);
        // The maintenance seals the loaded graph (it takes no more inserts), then splits the
        // oversized segment once, by a rebuild.
        assert!(loaded.maybe_rebuild());
        assert_eq!(segment_kinds(&loaded, tag(1)), "SG");
        assert!(found(&loaded) >= 495, "{} of 500", found(&loaded));
        assert!(loaded.maybe_rebuild());
        assert_eq!(segment_sizes(&loaded, tag(1)), [167, 167, 167]);
        assert!(!loaded.maybe_rebuild());
        assert!(found(&loaded) >= 495, "{} of 500", found(&loaded));
        assert_eq!(loaded.search(&tag(1), &v, 1)[0].id, 9_999);
    }

    #[test]
    fn reinsert_replaces_the_vector_and_invalid_input_is_ignored() {
        let dimension = 8;
        let mut rng = StdRng::seed_from_u64(6);
        let index = HnswIndex::new(small_config(dimension));
        let a = unit(&mut rng, dimension);
        let b = unit(&mut rng, dimension);
        index.insert(1, tag(1), &a);
        index.insert(1, tag(1), &a); // idempotent
        assert_eq!(index.tombstones(), 0);
        index.insert(1, tag(1), &b);
        // A small partition is flat: the replaced row is overwritten, no tombstone.
        assert_eq!((index.len(), index.tombstones()), (1, 0));
        let found = index.search(&tag(1), &b, 5);
        assert_eq!(found.len(), 1);
        // f16: the cosine of a vector with its own f16 form is 1 within rounding error.
        assert!((found[0].similarity - 1.0).abs() < 1e-3);
        // Moving partitions keeps the id in exactly one.
        index.insert(1, tag(2), &b);
        assert!(index.search(&tag(1), &b, 5).is_empty());
        assert_eq!(index.search(&tag(2), &b, 5)[0].id, 1);

        index.insert(2, tag(2), &[1.0; 3]); // wrong dimension
        index.insert(3, tag(2), &[f32::NAN; 8]);
        assert_eq!(index.len(), 1);
        assert!(index.search(&tag(2), &[1.0; 3], 1).is_empty());
        assert!(index.search(&tag(2), &b, 0).is_empty());
        // Unnormalized input is normalized: similarity stays a cosine.
        let scaled: Vec<f32> = b.iter().map(|x| x * 7.0).collect();
        assert!((index.search(&tag(2), &scaled, 1)[0].similarity - 1.0).abs() < 1e-3);
        // A refused replacement does not leave the old vector findable.
        index.insert(4, tag(2), &a);
        index.insert(4, tag(2), &[1.0; 3]);
        assert!(index.search(&tag(2), &a, 5).iter().all(|n| n.id != 4));
        assert_eq!(index.len(), 1);

        // In a graph partition a replaced vector leaves a tombstone, never found again.
        let config = IndexConfig {
            brute_force_below: 2,
            ..small_config(dimension)
        };
        let items = random_items(&mut rng, 10..20, tag(1), dimension);
        let index = HnswIndex::build(config, items);
        index.insert(10, tag(1), &a);
        index.insert(10, tag(1), &a); // idempotent in a graph too
        assert_eq!((index.len(), index.tombstones()), (10, 1));
        assert_eq!(index.search(&tag(1), &a, 1)[0].id, 10);
        index.insert(10, tag(1), &b);
        assert_eq!((index.len(), index.tombstones()), (10, 2));
        let found = index.search(&tag(1), &a, 10);
        assert_eq!(found.iter().filter(|n| n.id == 10).count(), 1, "{found:?}");
        assert_eq!(index.search(&tag(1), &b, 1)[0].id, 10);
    }

    /// A rebuild keeps every core busy for minutes at scale: its threads must yield to requests.
    #[cfg(target_os = "linux")]
    #[test]
    fn builds_insert_on_threads_at_a_lower_priority() {
        let nice = || crate::priority::nice_of_this_thread().expect("a nice value");
        let caller = nice();
        let pool = pools::build_pool().expect("the build pool starts");
        let lowered: Vec<i32> = pool.broadcast(|_| nice());
        assert_eq!(lowered.len(), pool.current_num_threads());
        // 10, or the test's own when it already runs nicer (never raised).
        assert!(lowered.iter().all(|&n| n == caller.max(10)), "{lowered:?}");
        assert_eq!(nice(), caller, "the caller keeps its own");
        // rayon's shared pool, started before the first thread was lowered, is not lowered.
        let shared: Vec<i32> = rayon::broadcast(|_| nice());
        assert!(shared.iter().all(|&n| n == caller), "{shared:?}");
    }

    #[test]
    fn save_and_load_roundtrip() {
        let dimension = 16;
        let mut rng = StdRng::seed_from_u64(7);
        let mut items = random_items(&mut rng, 0..3_000, tag(1), dimension);
        items.extend(random_items(&mut rng, 5_000..5_010, tag(2), dimension));
        // A second graph, so the graphs load side by side.
        items.extend(random_items(&mut rng, 6_000..6_500, tag(3), dimension));
        let config = IndexConfig {
            brute_force_below: 100,
            ..small_config(dimension)
        };
        let index = HnswIndex::build(config.clone(), items.clone());
        for id in (0..3_000).step_by(7) {
            index.remove(id);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        index.save(dir.path()).expect("save");
        let loaded = HnswIndex::load(dir.path(), config.clone()).expect("load");
        assert_eq!(loaded.ids(), index.ids());
        assert_eq!(loaded.len(), index.len());
        assert_eq!(loaded.tombstones(), index.tombstones());
        for _ in 0..100 {
            let q = unit(&mut rng, dimension);
            for p in [tag(1), tag(2), tag(3)] {
                assert_eq!(loaded.search(&p, &q, 5), index.search(&p, &q, 5));
            }
        }

        // The loaded graph takes inserts, and a second save replaces the first generation's files.
        let v = unit(&mut rng, dimension);
        loaded.insert(9_999, tag(1), &v);
        assert_eq!(loaded.search(&tag(1), &v, 1)[0].id, 9_999);
        loaded.save(dir.path()).expect("second save");
        let again = HnswIndex::load(dir.path(), config).expect("second load");
        assert_eq!(again.search(&tag(1), &v, 1)[0].id, 9_999);
        let mut names: Vec<String> = fs::read_dir(dir.path())
            .expect("listing")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "entries-2.bin",
                "graph-2-0-1.hnsw.data",
                "graph-2-0-1.hnsw.graph",
                "manifest.json",
                "sealed-2-0-0.bin",
                "sealed-2-2-0.bin",
            ]
        );
    }

    /// A loaded graph's vectors are mapped from its data file. A save never dumps over a file
    /// on disk (even with the manifest gone, which would restart the generations at 1), and the
    /// loaded graph keeps serving from its data file once a later save has deleted it.
    #[test]
    fn a_loaded_graph_serves_from_its_data_file_and_no_save_writes_over_it() {
        let dimension = 16;
        let mut rng = StdRng::seed_from_u64(11);
        let items = random_items(&mut rng, 0..1_000, tag(1), dimension);
        let config = IndexConfig {
            brute_force_below: 100,
            ..small_config(dimension)
        };
        let built = build_growing(config.clone(), items);
        let dir = tempfile::tempdir().expect("tempdir");
        built.save(dir.path()).expect("save");
        let loaded = HnswIndex::load(dir.path(), config.clone()).expect("load");
        let data = dir.path().join("graph-1-0-0.hnsw.data");
        #[cfg(target_os = "linux")]
        {
            let maps = fs::read_to_string("/proc/self/maps").expect("maps");
            assert!(maps.contains(&*data.to_string_lossy()), "mapped, not read");
        }
        #[cfg(unix)]
        let before = {
            use std::os::unix::fs::MetadataExt;
            fs::metadata(&data).expect("generation 1's data file").ino()
        };
        fs::remove_file(dir.path().join(MANIFEST)).expect("manifest gone");
        loaded.save(dir.path()).expect("save without a manifest");
        assert_eq!(read_manifest(dir.path()).expect("manifest").generation, 2);
        assert!(!data.exists(), "generation 1 deleted once 2 is saved");
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let after = fs::metadata(dir.path().join("graph-2-0-0.hnsw.data")).expect("gen 2");
            assert_ne!(before, after.ino(), "a new file, not the old one rewritten");
        }
        for _ in 0..50 {
            let q = unit(&mut rng, dimension);
            assert_eq!(loaded.search(&tag(1), &q, 5), built.search(&tag(1), &q, 5));
        }
        let again = HnswIndex::load(dir.path(), config).expect("load generation 2");
        assert_eq!(again.ids(), built.ids());
    }

    #[test]
    fn empty_index_roundtrip() {
        let dir = tempfile::tempdir().expect("tempdir");
        HnswIndex::new(small_config(4))
            .save(dir.path())
            .expect("save");
        let loaded = HnswIndex::load(dir.path(), small_config(4)).expect("load");
        assert_eq!((loaded.len(), loaded.tombstones()), (0, 0));
        loaded.insert(1, tag(1), &[1.0, 0.0, 0.0, 0.0]);
        assert_eq!(loaded.search(&tag(1), &[1.0, 0.0, 0.0, 0.0], 1)[0].id, 1);
    }

    #[test]
    fn bad_dumps_are_reported_not_panicked_on() {
        let dimension = 8;
        let mut rng = StdRng::seed_from_u64(8);
        let items = random_items(&mut rng, 0..500, tag(1), dimension);
        let config = IndexConfig {
            brute_force_below: 100,
            ..small_config(dimension)
        };
        // Segment 0 sealed (built), 1 growing (inserted since).
        let index = HnswIndex::build(config.clone(), items);
        for (id, p, v) in random_items(&mut rng, 500..550, tag(1), dimension) {
            index.insert(id, p, &v);
        }
        assert_eq!(segment_kinds(&index, tag(1)), "SG");
        let root = tempfile::tempdir().expect("tempdir");

        let missing = root.path().join("nowhere");
        assert!(matches!(
            HnswIndex::load(&missing, config.clone()),
            Err(IndexError::Missing)
        ));

        let dir = root.path().join("dump");
        index.save(&dir).expect("save");
        assert!(matches!(
            HnswIndex::load(&dir, IndexConfig::new(9)),
            Err(IndexError::Dimension {
                expected: 9,
                found: 8
            })
        ));
        assert!(HnswIndex::load(&dir, config.clone()).is_ok());

        // Each corruption on a fresh copy of the dump.
        type Corruption = (&'static str, fn(&Path));
        let corruptions: [Corruption; 12] = [
            ("truncated entries", |d| {
                let p = d.join("entries-1.bin");
                let len = fs::metadata(&p).expect("meta").len();
                File::options()
                    .write(true)
                    .open(&p)
                    .expect("open")
                    .set_len(len / 2)
                    .expect("truncate");
            }),
            ("flipped graph byte", |d| {
                let p = d.join("graph-1-0-1.hnsw.graph");
                let mut bytes = fs::read(&p).expect("read");
                let mid = bytes.len() / 2;
                bytes[mid] ^= 0x55;
                fs::write(&p, bytes).expect("write");
            }),
            ("truncated graph data", |d| {
                let p = d.join("graph-1-0-1.hnsw.data");
                File::options()
                    .write(true)
                    .open(&p)
                    .expect("open")
                    .set_len(10)
                    .expect("truncate");
            }),
            ("deleted graph", |d| {
                fs::remove_file(d.join("graph-1-0-1.hnsw.graph")).expect("rm")
            }),
            ("flipped sealed byte", |d| {
                let p = d.join("sealed-1-0-0.bin");
                let mut bytes = fs::read(&p).expect("read");
                let mid = bytes.len() / 2;
                bytes[mid] ^= 0x55;
                fs::write(&p, bytes).expect("write");
            }),
            ("truncated sealed segment", |d| {
                let p = d.join("sealed-1-0-0.bin");
                let len = fs::metadata(&p).expect("meta").len();
                File::options()
                    .write(true)
                    .open(&p)
                    .expect("open")
                    .set_len(len - 4)
                    .expect("truncate");
            }),
            ("deleted sealed segment", |d| {
                fs::remove_file(d.join("sealed-1-0-0.bin")).expect("rm")
            }),
            ("one sealed segment named twice", |d| {
                let mut manifest = read_manifest(d).expect("manifest");
                let copy = serde_json::to_value(&manifest.sealed[0]).expect("json");
                let mut copy: SealedRef = serde_json::from_value(copy).expect("sealed ref");
                copy.segment = 2;
                manifest.sealed.push(copy);
                manifest.graph_points += manifest.sealed[0].points;
                fs::write(
                    d.join(MANIFEST),
                    serde_json::to_vec(&manifest).expect("json"),
                )
                .expect("write")
            }),
            ("garbage manifest", |d| {
                fs::write(d.join(MANIFEST), b"{ not json").expect("write")
            }),
            ("one dump named as two segments", |d| {
                let mut manifest = read_manifest(d).expect("manifest");
                let copy = serde_json::to_value(&manifest.graphs[0]).expect("json");
                let mut copy: GraphRef = serde_json::from_value(copy).expect("graph ref");
                copy.segment = 2;
                manifest.graph_points += copy.points;
                manifest.graphs.push(copy);
                fs::write(
                    d.join(MANIFEST),
                    serde_json::to_vec(&manifest).expect("json"),
                )
                .expect("write")
            }),
            ("a segment missing", |d| {
                let mut manifest = read_manifest(d).expect("manifest");
                manifest.graphs[0].segment = 2;
                fs::write(
                    d.join(MANIFEST),
                    serde_json::to_vec(&manifest).expect("json"),
                )
                .expect("write")
            }),
            ("manifest naming other ids", |d| {
                let mut manifest = read_manifest(d).expect("manifest");
                manifest.ids_fingerprint = fingerprint([1, 2, 3].into_iter());
                fs::write(
                    d.join(MANIFEST),
                    serde_json::to_vec(&manifest).expect("json"),
                )
                .expect("write")
            }),
        ];
        for (what, corrupt) in corruptions {
            let copy = root.path().join(what.replace(' ', "-"));
            fs::create_dir_all(&copy).expect("mkdir");
            for entry in fs::read_dir(&dir).expect("listing") {
                let entry = entry.expect("entry");
                fs::copy(entry.path(), copy.join(entry.file_name())).expect("copy");
            }
            corrupt(&copy);
            let result = HnswIndex::load(&copy, config.clone());
            assert!(
                matches!(result, Err(IndexError::Corrupt(_))),
                "{what}: {result:?}",
                result = result.err()
            );
        }
    }
}
