//! A finished graph segment held in flat arrays: the graph `hnsw_rs` built, read out once through
//! its public API, then searched here with the same algorithm.
//!
//! Why: `hnsw_rs` holds each point as its own allocation with sixteen layer lists and one `Arc` per
//! link, about 2.2 KB of graph per vector at M 16 beside the 768-byte f16 vector, and a search
//! follows three pointers per candidate; its dump loads on one thread (9 s for 600k points here).
//! Once a segment takes no more inserts, the same graph is a `u32` per link in contiguous arrays:
//! about 110 bytes of links per vector, a search that reads rows and links without pointer chasing,
//! and a dump that is read straight into those arrays. qdrant serves its graphs the same way (a
//! locked builder while a graph is built, immutable link arrays once it is done).
//!
//! Nothing about the graph changes: its points, links and layers are the ones `hnsw_rs` chose
//! (its insertion and neighbour selection). The search is HNSW's (Malkov & Yashunin 2018,
//! algorithms 2 and 5): greedy descent through the upper layers from the entry point, then a
//! best-first search of layer 0 that keeps the `ef` most similar rows seen.
//!
//! The walk scores rows by int8 codes (a per-row step, as `quant` encodes them), then scores the
//! `ef` rows it kept from their f16 codes, the f32 query's dot product as before. Why: at a million
//! vectors a walk reads a few thousand rows, nearly all from memory, and its time is those reads; an
//! int8 code is half an f16 row's bytes. The rows kept are ranked and reported from their f16 codes,
//! so a result's similarity is what it was. In a sealed graph of 998k clustered vectors a search
//! (graph alone, `ef` 128) took 0.61-0.76x the time in four of five pairs alternated with the f16
//! walk, at recall@1 0.990 against 0.988; in a 1M-entry gateway the search phase of a semantic hit
//! was 0.80-0.91x in seven of eight. It costs 388 bytes more per row (code and step), 0.39 GB for a
//! million rows (`benches/results/2026-12-07-int8-walk.md`).
//!
//! A sealed segment never changes; the index inserts into an `hnsw_rs` segment and seals it once
//! it is full or rebuilt.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};
use std::io::{Read, Write};
use std::ops::Range;

use std::sync::Arc;

use half::f16;
use hnsw_rs::hnsw::{Hnsw, Point};
use hnsw_rs::prelude::Distance;
use rayon::prelude::*;

use super::quant::{dot_f32_f16, dot_f32_i8, encode_i8_f16};
use super::sketch::{nearest, Planes, Sketch, CANDIDATES};

const MAGIC: &[u8; 8] = b"RPXSEAL1";
/// Magic, dimension, rows, layers, entry row: what [`Sealed::read`] checks before it allocates.
const HEADER: usize = 8 + 4 * 4;

/// One layer's links in CSR form: row `members[i]`'s neighbours are
/// `links[offsets[i]..offsets[i + 1]]` (rows, not slots). Layer 0 holds every row and leaves
/// `members` empty (member `i` is row `i`).
#[derive(Debug, Default, PartialEq)]
struct Layer {
    members: Vec<u32>,
    offsets: Vec<u32>,
    links: Vec<u32>,
}

impl Layer {
    /// The neighbours of `row` in this layer; none when it is not in the layer.
    fn neighbours(&self, row: u32) -> &[u32] {
        let at = if self.members.is_empty() {
            Some(row as usize)
        } else {
            self.members.binary_search(&row).ok()
        };
        at.and_then(|i| {
            let (start, end) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
            self.links.get(start as usize..end as usize)
        })
        .unwrap_or(&[])
    }
}

/// Calls `f` with every point of an `hnsw_rs` graph, layer by layer, each layer read under one
/// guard. `hnsw_rs`'s own iterator over every layer takes a second read guard while it holds the
/// first, which an insert's write queued in between (`parking_lot` lets no reader pass a waiting
/// writer) turns into a deadlock, and it panics on an empty graph.
pub(super) fn each_point<'b, D>(graph: &Hnsw<'b, f16, D>, mut f: impl FnMut(&Arc<Point<'b, f16>>))
where
    D: Distance<f16> + Send + Sync,
{
    if graph.get_nb_point() == 0 {
        return;
    }
    let indexation = graph.get_point_indexation();
    for layer in 0..=usize::from(indexation.get_max_level_observed()) {
        for point in indexation.get_layer_iterator(layer) {
            f(&point);
        }
    }
}

/// A read-only HNSW graph over rows of f16 codes (see the module comment).
#[derive(Debug, PartialEq)]
pub struct Sealed {
    dim: usize,
    /// Row `i`'s slot: the partition's point number, which `hnsw_rs` knew as the data id.
    slots: Vec<u32>,
    /// Row `i` is `codes[i * dim..(i + 1) * dim]`.
    codes: Vec<f16>,
    /// Layer 0 first.
    layers: Vec<Layer>,
    /// Where every search starts: a row of the top layer.
    entry: u32,
    /// Row `i`'s sign sketch, for [`Sealed::near_duplicates`]: computed from the codes whenever
    /// the segment is made or read, never saved.
    sketches: Vec<Sketch>,
    /// Row `i`'s int8 code, `walk[i * dim..(i + 1) * dim]`, and its step `steps[i]`: what the
    /// graph walk scores rows by (see [`Sealed::search`]). Computed from the codes whenever the
    /// segment is made or read, like the sketches; never saved.
    walk: Vec<i8>,
    steps: Vec<f32>,
}

/// What a segment derives from its f16 rows whenever it is made or read, never saved: every row's
/// sign sketch and its int8 walk code and step ([`encode_i8_f16`]). One pass over the rows (768 MB
/// at a million), on the build threads.
fn derived(codes: &[f16], dim: usize) -> (Vec<Sketch>, Vec<i8>, Vec<f32>) {
    let dim = dim.max(1);
    let rows = codes.len() / dim;
    let planes = Planes::of(dim);
    let derive = || {
        let mut sketches: Vec<Sketch> = vec![Sketch::default(); rows];
        let mut walk = vec![0i8; rows * dim];
        let mut steps = vec![0.0f32; rows];
        sketches
            .par_iter_mut()
            .zip(walk.par_chunks_exact_mut(dim))
            .zip(steps.par_iter_mut())
            .zip(codes.par_chunks_exact(dim))
            .with_min_len(1_024)
            .for_each(|(((sketch, out), step), row)| {
                *sketch = planes.sketch_row(row);
                *step = encode_i8_f16(row, out);
            });
        (sketches, walk, steps)
    };
    super::pools::on_build_threads(derive)
}

/// Reads one value from every cache line of `rows` of `values` (rows of `dim`) before any of them
/// is scored. In a graph bigger than the CPU's caches nearly every row is a miss to memory; scored
/// one after another, a row's misses start only once the row before it is done. These loads depend
/// on nothing, so the CPU keeps a whole neighbourhood's misses in flight at once, and the scoring
/// that follows finds its rows in cache. (A prefetch instruction would say the same without the
/// loads, but needs `unsafe`.)
fn touch<T: bytemuck::Pod>(values: &[T], dim: usize, rows: impl IntoIterator<Item = u32>) {
    let per_line = (64 / std::mem::size_of::<T>()).max(1);
    let mut acc = 0u8;
    for row in rows {
        let start = row as usize * dim;
        if let Some(row) = values.get(start..start + dim) {
            // And the last value: a row that does not start on a line spans one line more.
            for v in row.iter().step_by(per_line).chain(row.last()) {
                acc ^= bytemuck::bytes_of(v)[0];
            }
        }
    }
    std::hint::black_box(acc);
}

/// A row and its similarity to the query, ordered by similarity (then row, so the order is total).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Scored {
    similarity: f32,
    row: u32,
}

impl Eq for Scored {}

impl Ord for Scored {
    fn cmp(&self, other: &Self) -> Ordering {
        self.similarity
            .total_cmp(&other.similarity)
            .then_with(|| other.row.cmp(&self.row))
    }
}

impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Rows already scored by one search: a bit per row.
struct Visited(Vec<u64>);

impl Visited {
    fn new(rows: usize) -> Self {
        Self(vec![0; rows.div_ceil(64)])
    }

    /// Marks `row`; whether it was new.
    fn insert(&mut self, row: u32) -> bool {
        let (word, bit) = (row as usize / 64, 1u64 << (row % 64));
        match self.0.get_mut(word) {
            Some(w) if *w & bit == 0 => {
                *w |= bit;
                true
            }
            _ => false,
        }
    }
}

impl Sealed {
    /// Reads the graph out of `graph`, whose points carry distinct slots as data ids. `None` for an
    /// empty graph, or one whose slots do not fit a `u32` or repeat.
    pub fn from_graph<D>(graph: &Hnsw<'_, f16, D>, dim: usize) -> Option<Self>
    where
        D: Distance<f16> + Send + Sync,
    {
        let indexation = graph.get_point_indexation();
        let mut points = Vec::with_capacity(graph.get_nb_point());
        each_point(graph, |p| points.push(Arc::clone(p)));
        points.sort_unstable_by_key(|p| p.get_origin_id());
        let rows = points.len();
        if rows == 0 || u32::try_from(rows).is_err() {
            return None;
        }
        let mut row_of: HashMap<usize, u32> = HashMap::with_capacity(rows);
        let mut slots = Vec::with_capacity(rows);
        let mut codes = Vec::with_capacity(rows * dim);
        for (row, point) in points.iter().enumerate() {
            let slot = point.get_origin_id();
            let row = row as u32;
            if row_of.insert(slot, row).is_some() {
                return None;
            }
            slots.push(u32::try_from(slot).ok()?);
            let code = point.get_v();
            if code.len() != dim {
                return None;
            }
            codes.extend_from_slice(code);
        }
        let top = usize::from(indexation.get_max_level_observed());
        let mut layers: Vec<Layer> = (0..=top).map(|_| Layer::default()).collect();
        for layer in &mut layers {
            layer.offsets.push(0);
        }
        // A point's links up to its own level. Above it `hnsw_rs` also keeps the points its insert
        // passed on the way down; the point is not in those layers, so they are left out (a link to
        // a row outside a layer leads nowhere: it has no neighbours there).
        for (row, point) in points.iter().enumerate() {
            let level = usize::from(point.get_point_id().0).min(top);
            let neighbourhood = point.get_neighborhood_id();
            for (l, layer) in layers.iter_mut().enumerate().take(level + 1) {
                if l > 0 {
                    layer.members.push(row as u32);
                }
                let around = neighbourhood.get(l).map_or(&[][..], Vec::as_slice);
                layer.links.extend(
                    around
                        .iter()
                        .filter_map(|n| row_of.get(&n.get_origin_id()).copied())
                        .filter(|n| *n as usize != row),
                );
                layer.offsets.push(u32::try_from(layer.links.len()).ok()?);
            }
        }
        // Any point of the top layer leads down to all others: the first one listed there
        // (`hnsw_rs`'s own entry point is the first to finish its insert at that level).
        let entry = indexation
            .get_layer_iterator(top)
            .next()
            .and_then(|p| row_of.get(&p.get_origin_id()).copied())
            .unwrap_or(0);
        for layer in &mut layers {
            layer.members.shrink_to_fit();
            layer.offsets.shrink_to_fit();
            layer.links.shrink_to_fit();
        }
        let (sketches, walk, steps) = derived(&codes, dim);
        Some(Self {
            dim,
            slots,
            codes,
            layers,
            entry,
            sketches,
            walk,
            steps,
        })
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Every row as `(slot, code)`.
    pub fn rows(&self) -> impl Iterator<Item = (usize, &[f16])> + '_ {
        self.slots
            .iter()
            .map(|s| *s as usize)
            .zip(self.codes.chunks_exact(self.dim))
    }

    fn similarity(&self, query: &[f32], row: u32) -> f32 {
        let start = row as usize * self.dim;
        self.codes
            .get(start..start + self.dim)
            .map_or(f32::NEG_INFINITY, |code| dot_f32_f16(query, code))
    }

    /// Reads one value from every cache line of `rows`' f16 codes before any of them is scored.
    fn touch(&self, rows: impl IntoIterator<Item = u32>) {
        touch(&self.codes, self.dim, rows);
    }

    /// [`Sealed::similarity`] from the row's int8 code: half the bytes, within a few thousandths.
    fn walk_scored(&self, query: &[f32], row: u32) -> Scored {
        let start = row as usize * self.dim;
        let similarity = match (
            self.walk.get(start..start + self.dim),
            self.steps.get(row as usize),
        ) {
            (Some(code), Some(step)) => dot_f32_i8(query, code) * step,
            _ => f32::NEG_INFINITY,
        };
        Scored { similarity, row }
    }

    fn scored(&self, query: &[f32], row: u32) -> Scored {
        Scored {
            similarity: self.similarity(query, row),
            row,
        }
    }

    /// The (up to) `ef` rows found most similar to `query` (L2-normalized f32), as
    /// `(slot, similarity)`, most similar first; found by their int8 codes, scored and ranked by
    /// their f16 codes.
    pub fn search(&self, query: &[f32], ef: usize) -> Vec<(usize, f32)> {
        if self.is_empty() || ef == 0 || query.len() != self.dim {
            return Vec::new();
        }
        // Greedy descent: in each upper layer, move to a more similar neighbour while there is one.
        let mut at = self.walk_scored(query, self.entry);
        for layer in self.layers.iter().skip(1).rev() {
            loop {
                let best = layer
                    .neighbours(at.row)
                    .iter()
                    .map(|n| self.walk_scored(query, *n))
                    .max();
                match best {
                    Some(b) if b > at => at = b,
                    _ => break,
                }
            }
        }
        // Layer 0: best-first from there, keeping the `ef` best rows seen.
        let mut visited = Visited::new(self.len());
        visited.insert(at.row);
        let mut candidates = BinaryHeap::with_capacity(ef * 2);
        let mut found = BinaryHeap::with_capacity(ef + 1);
        candidates.push(at);
        found.push(std::cmp::Reverse(at));
        let layer0 = &self.layers[0];
        let mut fresh = Vec::new();
        while let Some(c) = candidates.pop() {
            let worst = found.peek().map_or(f32::NEG_INFINITY, |w| w.0.similarity);
            if found.len() >= ef && c.similarity < worst {
                break;
            }
            fresh.clear();
            fresh.extend(
                layer0
                    .neighbours(c.row)
                    .iter()
                    .copied()
                    .filter(|n| visited.insert(*n)),
            );
            touch(&self.walk, self.dim, fresh.iter().copied());
            for &n in &fresh {
                let s = self.walk_scored(query, n);
                let worst = found.peek().map_or(f32::NEG_INFINITY, |w| w.0.similarity);
                if found.len() < ef || s.similarity > worst {
                    candidates.push(s);
                    found.push(std::cmp::Reverse(s));
                    if found.len() > ef {
                        found.pop();
                    }
                }
            }
        }
        let mut found: Vec<Scored> = found.into_iter().map(|r| r.0).collect();
        // The walk's similarities are the int8 codes' (within a few thousandths): the rows found
        // are scored again from their f16 codes, so results are ranked and reported as exactly as
        // before, and a threshold never meets the int8 form.
        self.touch(found.iter().map(|s| s.row));
        for s in &mut found {
            *s = self.scored(query, s.row);
        }
        found.sort_unstable_by(|a, b| b.cmp(a));
        found
            .into_iter()
            .map(|s| (self.slots[s.row as usize] as usize, s.similarity))
            .collect()
    }

    /// The near duplicates of `query` among rows `rows` (a chunk of a larger scan, or all of them):
    /// the [`CANDIDATES`] rows whose sketches differ least from `sketch` (the query's), of those
    /// whose slots `live` accepts, scored exactly, as `(slot, similarity)`, most similar first. A
    /// scan of 16 bytes per row; see [`sketch`](super::sketch) for why it finds the near
    /// duplicates a graph search can miss.
    pub fn near_duplicates(
        &self,
        query: &[f32],
        sketch: Sketch,
        rows: Range<usize>,
        live: impl Fn(usize) -> bool,
    ) -> Vec<(usize, f32)> {
        let Some(sketches) = self.sketches.get(rows.clone()) else {
            return Vec::new();
        };
        if query.len() != self.dim {
            return Vec::new();
        }
        // Rows are u32 throughout (see `from_graph`); a range past them holds none.
        let Ok(first) = u32::try_from(rows.start) else {
            return Vec::new();
        };
        let live_row = |row: u32| {
            self.slots
                .get(row as usize)
                .is_some_and(|slot| live(*slot as usize))
        };
        // Liveness is a lookup that misses the cache (slot, then id): asked of the few hundred
        // rows that enter the kept set on the way, it cost more than the scan. Asked of the
        // kept rows only, it costs little; a scan again that asks of every entrant is needed
        // only when removed rows took most places (copies of one prompt, removed one by one).
        let rows_of = |kept: Vec<(u32, u32)>| kept.into_iter().map(|(_, row)| row);
        let kept = nearest(sketches, first, sketch, CANDIDATES, |_| true);
        let all = kept.len();
        let mut picked: Vec<u32> = rows_of(kept).filter(|row| live_row(*row)).collect();
        if all - picked.len() > CANDIDATES / 2 {
            picked = rows_of(nearest(sketches, first, sketch, CANDIDATES, live_row)).collect();
        }
        self.touch(picked.iter().copied());
        let mut found: Vec<Scored> = picked.iter().map(|r| self.scored(query, *r)).collect();
        found.sort_unstable_by(|a, b| b.cmp(a));
        found
            .into_iter()
            .map(|s| (self.slots[s.row as usize] as usize, s.similarity))
            .collect()
    }

    /// Writes the segment, little-endian: header, slots, codes, then per layer its member count,
    /// link count, members (none for layer 0), offsets and links.
    pub fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        let too_large = || std::io::Error::other("sealed segment too large");
        let u32_of = |n: usize| u32::try_from(n).map_err(|_| too_large());
        out.write_all(MAGIC)?;
        for n in [self.dim, self.len(), self.layers.len()] {
            out.write_all(&u32_of(n)?.to_le_bytes())?;
        }
        out.write_all(&self.entry.to_le_bytes())?;
        write_u32s(out, &self.slots)?;
        for chunk in self.codes.chunks(1 << 16) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|c| c.to_le_bytes()).collect();
            out.write_all(&bytes)?;
        }
        for layer in &self.layers {
            out.write_all(&u32_of(layer.members.len())?.to_le_bytes())?;
            out.write_all(&u32_of(layer.links.len())?.to_le_bytes())?;
            write_u32s(out, &layer.members)?;
            write_u32s(out, &layer.offsets)?;
            write_u32s(out, &layer.links)?;
        }
        Ok(())
    }

    /// Reads what [`Sealed::write`] wrote, `len` bytes in all, checking every count against `len`
    /// before allocating and every link, member and offset against the rows, so a damaged file is
    /// an error, never a panic or an out-of-bounds search.
    pub fn read(input: &mut impl Read, len: u64, dim: usize) -> Result<Self, String> {
        let mut left = len;
        let mut take = |bytes: u64| -> Result<(), String> {
            left = left
                .checked_sub(bytes)
                .ok_or_else(|| "truncated".to_string())?;
            Ok(())
        };
        take(HEADER as u64)?;
        let mut header = [0u8; HEADER];
        input.read_exact(&mut header).map_err(|e| e.to_string())?;
        let (magic, header) = header.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err("bad magic".into());
        }
        let field = |i: usize| {
            let bytes: [u8; 4] = header[i * 4..i * 4 + 4].try_into().unwrap_or_default();
            u32::from_le_bytes(bytes)
        };
        let (file_dim, rows, layers, entry) = (field(0) as usize, field(1), field(2), field(3));
        if file_dim != dim {
            return Err(format!("dimension {file_dim}, expected {dim}"));
        }
        if rows == 0 || entry >= rows || layers == 0 || layers > 64 {
            return Err("bad header".into());
        }
        take(u64::from(rows) * 4 + u64::from(rows) * dim as u64 * 2)?;
        let slots = read_u32s(input, rows as usize)?;
        let mut codes = vec![f16::ZERO; rows as usize * dim];
        input
            .read_exact(bytemuck::cast_slice_mut(&mut codes))
            .map_err(|e| e.to_string())?;
        for c in &mut codes {
            *c = f16::from_bits(u16::from_le(c.to_bits()));
        }
        let mut parsed = Vec::with_capacity(layers as usize);
        let mut previous: Option<Vec<u32>> = None;
        for l in 0..layers {
            take(8)?;
            let counts = read_u32s(input, 2)?;
            let (members, links) = (counts[0], counts[1]);
            let entries = if l == 0 { rows } else { members };
            if (l == 0 && members != 0) || (l > 0 && (members == 0 || members > rows)) {
                return Err("bad layer size".into());
            }
            take((u64::from(members) + u64::from(entries) + 1 + u64::from(links)) * 4)?;
            let layer = Layer {
                members: read_u32s(input, members as usize)?,
                offsets: read_u32s(input, entries as usize + 1)?,
                links: read_u32s(input, links as usize)?,
            };
            let sorted = layer.members.windows(2).all(|w| w[0] < w[1]);
            // A layer's members are members of the layer below (layer 0 holds every row).
            let nested = previous.as_ref().is_none_or(|below| {
                below.is_empty() || layer.members.iter().all(|m| below.binary_search(m).is_ok())
            });
            let offsets_ok = layer.offsets.first() == Some(&0)
                && layer.offsets.last() == Some(&links)
                && layer.offsets.windows(2).all(|w| w[0] <= w[1]);
            if !sorted
                || !nested
                || !offsets_ok
                || layer.members.iter().chain(&layer.links).any(|r| *r >= rows)
            {
                return Err(format!("layer {l} is malformed"));
            }
            previous = Some(layer.members.clone());
            parsed.push(layer);
        }
        if left != 0 {
            return Err("trailing bytes".into());
        }
        let top = parsed.last().filter(|t| !t.members.is_empty());
        if top.is_some_and(|t| t.members.binary_search(&entry).is_err()) {
            return Err("the entry row is not in the top layer".into());
        }
        // Rows are in slot order ([`Sealed::from_graph`]), so a repeated slot shows as a step down.
        if !slots.windows(2).all(|w| w[0] < w[1]) {
            return Err("slots are not in order".into());
        }
        let (sketches, walk, steps) = derived(&codes, dim);
        Ok(Self {
            dim,
            slots,
            codes,
            layers: parsed,
            entry,
            sketches,
            walk,
            steps,
        })
    }
}

fn write_u32s(out: &mut impl Write, values: &[u32]) -> std::io::Result<()> {
    for chunk in values.chunks(1 << 16) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
        out.write_all(&bytes)?;
    }
    Ok(())
}

fn read_u32s(input: &mut impl Read, n: usize) -> Result<Vec<u32>, String> {
    let mut values = vec![0u32; n];
    input
        .read_exact(bytemuck::cast_slice_mut(&mut values))
        .map_err(|e| e.to_string())?;
    for v in &mut values {
        *v = u32::from_le(*v);
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::quant::{encode_f16, DistF16};
    use crate::index::sketch::Planes;
    use crate::index::tests::unit;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// An `hnsw_rs` graph of `n` random unit vectors whose slots start at `first`, and the vectors.
    fn graph(
        rng: &mut StdRng,
        n: usize,
        dim: usize,
        first: usize,
    ) -> (Hnsw<'static, f16, DistF16>, Vec<Vec<f32>>) {
        let vectors: Vec<Vec<f32>> = (0..n).map(|_| unit(rng, dim)).collect();
        let codes: Vec<Vec<f16>> = vectors.iter().map(|v| encode_f16(v)).collect();
        let graph = Hnsw::new(8, n, 16, 48, DistF16);
        let batch: Vec<(&[f16], usize)> = codes
            .iter()
            .enumerate()
            .map(|(i, c)| (c.as_slice(), first + i))
            .collect();
        graph.parallel_insert_slice(&batch);
        (graph, vectors)
    }

    fn written(sealed: &Sealed) -> Vec<u8> {
        let mut bytes = Vec::new();
        sealed.write(&mut bytes).expect("write");
        bytes
    }

    /// A recheck reads rows by their sketches in any range of rows (the index scans a large
    /// segment in chunks) and answers slots, not rows.
    #[test]
    fn near_duplicates_are_found_by_slot_in_any_range_of_rows() {
        let mut rng = StdRng::seed_from_u64(31);
        let dim = 32;
        let (graph, vectors) = graph(&mut rng, 3_000, dim, 100);
        let sealed = Sealed::from_graph(&graph, dim).expect("sealed");
        let planes = Planes::of(dim);
        for source in (0..3_000).step_by(97) {
            let noise = unit(&mut rng, dim);
            let query: Vec<f32> = vectors[source]
                .iter()
                .zip(&noise)
                .map(|(v, n)| v + 0.25 * n)
                .collect();
            let norm = query.iter().map(|x| x * x).sum::<f32>().sqrt();
            let query: Vec<f32> = query.into_iter().map(|x| x / norm).collect();
            let sketch = planes.sketch(&query);
            let whole = sealed.near_duplicates(&query, sketch, 0..3_000, |_| true);
            assert_eq!(whole.len(), CANDIDATES);
            assert_eq!(whole[0].0, source + 100, "the source, as its slot");
            let exact = dot_f32_f16(&query, &encode_f16(&vectors[source]));
            assert_eq!(whole[0].1, exact);
            assert!(whole.windows(2).all(|w| w[0].1 >= w[1].1));
            let chunk = source / 1_000 * 1_000;
            let own = sealed.near_duplicates(&query, sketch, chunk..chunk + 1_000, |_| true);
            assert_eq!(own[0], whole[0], "in its own chunk of rows");
            let gone =
                sealed.near_duplicates(&query, sketch, 0..3_000, |slot| slot != source + 100);
            assert_eq!(
                gone.len(),
                CANDIDATES - 1,
                "a removed row is left out, not scored"
            );
            assert!(gone.iter().all(|(slot, _)| *slot != source + 100));
            // Most rows removed: the scan asks of every entrant, so live rows take the places.
            let few = sealed.near_duplicates(&query, sketch, 0..3_000, |slot| slot % 4 == 0);
            assert_eq!(few.len(), CANDIDATES);
            assert!(few.iter().all(|(slot, _)| slot % 4 == 0));
            let other = (chunk + 1_000) % 3_000;
            let elsewhere = sealed.near_duplicates(&query, sketch, other..other + 1_000, |_| true);
            assert!(elsewhere
                .iter()
                .all(|(slot, _)| (other + 100..other + 1_100).contains(slot)));
        }
        let query = unit(&mut rng, dim);
        let sketch = planes.sketch(&query);
        assert!(sealed
            .near_duplicates(&query, sketch, 2_990..3_001, |_| true)
            .is_empty());
        assert!(sealed
            .near_duplicates(&query[1..], sketch, 0..10, |_| true)
            .is_empty());
    }

    #[test]
    fn holds_the_graph_hnsw_rs_built_and_finds_what_an_exact_scan_finds() {
        let mut rng = StdRng::seed_from_u64(3);
        let dim = 16;
        let (graph, vectors) = graph(&mut rng, 2_000, dim, 100);
        let sealed = Sealed::from_graph(&graph, dim).expect("sealed");
        assert_eq!(sealed.len(), 2_000);
        // Every row is its slot's code, rows in slot order.
        let slots: Vec<usize> = sealed.rows().map(|(slot, _)| slot).collect();
        assert_eq!(slots, (100..2_100).collect::<Vec<_>>());
        for (slot, code) in sealed.rows() {
            assert_eq!(code, encode_f16(&vectors[slot - 100]).as_slice());
        }
        // The links are hnsw_rs's, layer by layer, up to the point's level: above it `hnsw_rs` keeps
        // the points its insert passed on the way down, which no search can reach it by.
        let mut links = 0;
        for point in graph.get_point_indexation() {
            let row = point.get_origin_id() as u32 - 100;
            let level = usize::from(point.get_point_id().0);
            for (l, around) in point
                .get_neighborhood_id()
                .iter()
                .enumerate()
                .take(level + 1)
            {
                let mut theirs: Vec<u32> = around
                    .iter()
                    .map(|n| n.get_origin_id() as u32 - 100)
                    .filter(|n| *n != row)
                    .collect();
                let mut ours = sealed
                    .layers
                    .get(l)
                    .map_or(Vec::new(), |layer| layer.neighbours(row).to_vec());
                theirs.sort_unstable();
                ours.sort_unstable();
                assert_eq!(ours, theirs, "row {row} layer {l}");
                links += ours.len();
            }
        }
        assert!(links > 2_000 * 8, "{links} links");

        // Queries near a vector and random ones: the best row is the exact scan's.
        let mut exact = 0;
        let queries = 300;
        for q in 0..queries {
            let query = if q % 2 == 0 {
                let near: Vec<f32> = vectors[rng.random_range(0..2_000)]
                    .iter()
                    .map(|x| x + rng.random_range(-0.05f32..0.05))
                    .collect();
                let norm = near.iter().map(|x| x * x).sum::<f32>().sqrt();
                near.into_iter().map(|x| x / norm).collect()
            } else {
                unit(&mut rng, dim)
            };
            let found = sealed.search(&query, 64);
            assert_eq!(found.len(), 64);
            assert!(found.windows(2).all(|w| w[0].1 >= w[1].1), "best first");
            // Walked by int8 codes, reported from the f16 ones.
            for (slot, similarity) in &found {
                let code = encode_f16(&vectors[slot - 100]);
                assert_eq!(*similarity, dot_f32_f16(&query, &code), "slot {slot}");
            }
            let best = sealed
                .rows()
                .map(|(slot, code)| (slot, dot_f32_f16(&query, code)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
                .expect("rows");
            exact += usize::from(found[0].0 == best.0);
        }
        assert!(exact >= queries * 98 / 100, "recall@1 {exact}/{queries}");
        assert!(sealed.search(&[0.0; 3], 64).is_empty(), "wrong dimension");
        assert!(sealed.search(&vectors[0], 0).is_empty());
    }

    #[test]
    fn writes_and_reads_back_the_same_segment() {
        let mut rng = StdRng::seed_from_u64(4);
        let (graph, vectors) = graph(&mut rng, 700, 8, 0);
        let sealed = Sealed::from_graph(&graph, 8).expect("sealed");
        let bytes = written(&sealed);
        let read = Sealed::read(&mut bytes.as_slice(), bytes.len() as u64, 8).expect("read");
        assert_eq!(read, sealed);
        assert_eq!(read.search(&vectors[5], 16), sealed.search(&vectors[5], 16));
        assert!(matches!(
            Sealed::read(&mut bytes.as_slice(), bytes.len() as u64, 9),
            Err(e) if e.contains("dimension")
        ));
    }

    /// Every truncation is refused, and no flipped byte panics the reader or a search of what it
    /// accepted (a flipped code byte is still a well-formed segment; a flipped count, offset, link
    /// or slot is not).
    #[test]
    fn a_damaged_file_is_an_error_never_a_panic() {
        let mut rng = StdRng::seed_from_u64(5);
        let (graph, vectors) = graph(&mut rng, 120, 4, 0);
        let sealed = Sealed::from_graph(&graph, 4).expect("sealed");
        let bytes = written(&sealed);
        for cut in 0..bytes.len() {
            let short = &bytes[..cut];
            assert!(
                Sealed::read(&mut &short[..], short.len() as u64, 4).is_err(),
                "cut at {cut}"
            );
            // A reader told the full length, but handed fewer bytes.
            assert!(Sealed::read(&mut &short[..], bytes.len() as u64, 4).is_err());
        }
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x5a;
            match Sealed::read(&mut damaged.as_slice(), damaged.len() as u64, 4) {
                Ok(read) => {
                    // Magic, dimension, row and layer counts never read as another valid file.
                    assert!(at >= HEADER - 4, "header byte {at} went unnoticed");
                    read.search(&vectors[0], 8);
                }
                // The codes follow the header and the 120 slots: 120 rows of 4 f16.
                Err(_) => assert!(
                    !(HEADER + 120 * 4..HEADER + 120 * 12).contains(&at),
                    "code byte {at}"
                ),
            }
        }
    }

    #[test]
    fn an_empty_graph_has_no_sealed_form() {
        let graph: Hnsw<'static, f16, DistF16> = Hnsw::new(8, 10, 16, 48, DistF16);
        assert!(Sealed::from_graph(&graph, 4).is_none());
    }
}
