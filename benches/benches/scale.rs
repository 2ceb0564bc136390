//! The vector index at scale, for `benches/scale.sh` (issue 22): which compact vector form keeps
//! recall (`quant`), what the int8 distances cost per call (`dist`), and build, search p50/p99 and
//! recall@1, dump and load at 100k–1M vectors for a list of HNSW parameters (`index`). `embed`
//! turns a text file into MiniLM vectors for `quant` (needs the provisioned model).
//!
//! Not a criterion bench: each run prints one Markdown block whose ratios all come from that run.
//! Usage: `cargo bench -p reprise-benches --bench scale -- <command> [--flag value]...`.

use std::collections::{BTreeSet, HashMap};
use std::hint::black_box;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cpu_time::ProcessTime;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reprise_server::embed::{EmbedConfig, Embedder};
use reprise_server::index::quant::{
    cosine_f16, cosine_f32_i8, cosine_i8, dot_f16, dot_f32_f16, dot_f32_i8, encode_f16, encode_i8,
    encode_i8_f16, portable_dot_f16, portable_dot_f32_f16, DistF16, DistI8,
};
use reprise_server::index::sketch::{nearest, Planes, Sketch, CANDIDATES};
use reprise_server::index::{dot, Graphs, HnswIndex, IndexConfig, VectorIndex};

// The gateway's allocator (server/src/main.rs), so RSS per vector and the cost of `hnsw_rs`'s many
// small allocations are what a replica sees.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

type Args = HashMap<String, String>;
/// Similarity of vector `q` to vector `j` in one form.
type Score<'a> = Box<dyn Fn(usize, usize) -> f32 + 'a>;

fn args() -> (String, Args) {
    let mut it = std::env::args().skip(1).filter(|a| a != "--bench");
    let command = it.next().unwrap_or_default();
    let mut flags = Args::new();
    while let Some(flag) = it.next() {
        if let Some(name) = flag.strip_prefix("--") {
            flags.insert(name.to_owned(), it.next().unwrap_or_default());
        }
    }
    (command, flags)
}

fn flag<T: std::str::FromStr>(flags: &Args, name: &str, default: T) -> T {
    flags
        .get(name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A comma-separated flag's values; one that does not parse ends the run (it would otherwise
/// leave a row out of the tables without a word).
fn list<T: std::str::FromStr>(flags: &Args, name: &str, default: &str) -> Vec<T> {
    flags
        .get(name)
        .map_or(default, String::as_str)
        .split(',')
        .map(|v| {
            v.trim().parse().unwrap_or_else(|_| {
                eprintln!("--{name}: {v:?} is not a value");
                std::process::exit(2)
            })
        })
        .collect()
}

fn normalize(mut v: Vec<f32>) -> Vec<f32> {
    let n = dot(&v, &v).sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
    v
}

/// Standard normal by Box-Muller (rand's distributions crate is not a dependency).
fn gauss(rng: &mut StdRng) -> f32 {
    let u: f32 = rng.random_range(f32::EPSILON..1.0);
    let v: f32 = rng.random_range(0.0..1.0);
    (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
}

fn random_unit(rng: &mut StdRng, dim: usize) -> Vec<f32> {
    normalize((0..dim).map(|_| gauss(rng)).collect())
}

/// Vectors shaped like prompt embeddings: topics (cluster centres) whose members share about half
/// their direction (MiniLM puts unrelated prompts at cosine 0–0.3 and same-topic ones at 0.4–0.7).
struct Clusters {
    centres: Vec<Vec<f32>>,
}

impl Clusters {
    fn new(rng: &mut StdRng, dim: usize, topics: usize) -> Self {
        Self {
            centres: (0..topics).map(|_| random_unit(rng, dim)).collect(),
        }
    }
    fn sample(&self, rng: &mut StdRng) -> Vec<f32> {
        let c = &self.centres[rng.random_range(0..self.centres.len())];
        let noise = random_unit(rng, c.len());
        normalize(c.iter().zip(&noise).map(|(c, n)| c + n).collect())
    }
}

/// A paraphrase of `v`: `v` plus noise of norm `noise`, renormalized (0.3 gives cosine ≈ 0.95).
fn near(rng: &mut StdRng, v: &[f32], noise: f32) -> Vec<f32> {
    let n = random_unit(rng, v.len());
    normalize(v.iter().zip(&n).map(|(v, n)| v + noise * n).collect())
}

fn vectors(kind: &str, n: usize, dim: usize, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    match kind {
        "clustered" => {
            let clusters = Clusters::new(&mut rng, dim, (n / 100).max(10));
            (0..n).map(|_| clusters.sample(&mut rng)).collect()
        }
        _ => (0..n).map(|_| random_unit(&mut rng, dim)).collect(),
    }
}

/// Exact best of `queries` over `base` (f32, both sides unit), on every core.
fn exact_best(base: &[Vec<f32>], queries: &[Vec<f32>], skip_self: bool) -> Vec<usize> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = queries.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = queries
            .chunks(chunk)
            .enumerate()
            .map(|(c, qs)| {
                s.spawn(move || {
                    qs.iter()
                        .enumerate()
                        .map(|(i, q)| {
                            let me = c * chunk + i;
                            let mut best = (f32::MIN, 0);
                            for (j, v) in base.iter().enumerate() {
                                if skip_self && j == me {
                                    continue;
                                }
                                let s = dot(q, v);
                                if s > best.0 {
                                    best = (s, j);
                                }
                            }
                            best.1
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// Recall@1 of a compact form against f32 by exact scans: each vector queries all the others.
fn quant_recall(name: &str, base: &[Vec<f32>]) {
    let n = base.len();
    let truth = exact_best(base, base, true);
    let codes: Vec<Vec<i8>> = base.iter().map(|v| encode_i8(v)).collect();
    let halves: Vec<_> = base.iter().map(|v| encode_f16(v)).collect();
    let argmax = |score: &Score<'_>, q: usize| -> usize {
        (0..n)
            .filter(|j| *j != q)
            .max_by(|a, b| score(q, *a).total_cmp(&score(q, *b)))
            .unwrap_or(0)
    };
    let forms: [(&str, Score<'_>); 4] = [
        (
            "f32 query · f16 (re-rank, scan)",
            Box::new(|q, j| dot_f32_f16(&base[q], &halves[j])),
        ),
        (
            "f16 ↔ f16 (768 B, graph)",
            Box::new(|q, j| cosine_f16(&halves[q], &halves[j])),
        ),
        (
            "int8 ↔ int8 (384 B, graph)",
            Box::new(|q, j| cosine_i8(&codes[q], &codes[j])),
        ),
        (
            "f32 query · int8 (re-rank, scan)",
            Box::new(|q, j| cosine_f32_i8(&base[q], &codes[j])),
        ),
    ];
    for (form, score) in forms {
        let hits = (0..n).filter(|q| argmax(&score, *q) == truth[*q]).count();
        println!("| {name} | {n} | {form} | {:.4} |", hits as f64 / n as f64);
    }
}

fn read_f32s(path: &PathBuf, dim: usize) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(path).unwrap_or_default();
    bytes
        .as_chunks::<4>()
        .0
        .iter()
        .map(|b| f32::from_le_bytes(*b))
        .collect::<Vec<_>>()
        .chunks_exact(dim)
        .map(<[f32]>::to_vec)
        .collect()
}

fn quant(flags: &Args) {
    let dim = flag(flags, "dim", 384usize);
    let n = flag(flags, "n", 3000usize);
    println!("| vectors | n | form | recall@1 vs f32 |\n|---|---|---|---|");
    if let Some(path) = flags.get("vectors") {
        let real = read_f32s(&PathBuf::from(path), dim);
        quant_recall("MiniLM-L6 embeddings of fow-cache texts", &real);
    }
    quant_recall("random unit", &vectors("random", n, dim, 1));
    quant_recall("clustered", &vectors("clustered", n, dim, 2));
}

/// Nanoseconds per call of each distance on 384-d vectors, and of the f32 one for reference.
fn dist(flags: &Args) {
    use hnsw_rs::prelude::Distance;
    let dim = flag(flags, "dim", 384usize);
    let rounds = flag(flags, "rounds", 2_000_000usize);
    let mut rng = StdRng::seed_from_u64(3);
    let a = random_unit(&mut rng, dim);
    let b = random_unit(&mut rng, dim);
    let (ia, ib) = (encode_i8(&a), encode_i8(&b));
    let (ha, hb) = (encode_f16(&a), encode_f16(&b));
    let time = |f: &dyn Fn() -> f32| {
        let t = Instant::now();
        let mut sum = 0.0;
        for _ in 0..rounds {
            sum += f();
        }
        black_box(sum);
        t.elapsed().as_nanos() as f64 / rounds as f64
    };
    let mut walk = vec![0i8; dim];
    let step = encode_i8_f16(&hb, &mut walk);
    println!("| distance ({dim}-d) | ns per call |\n|---|---|");
    println!(
        "| f32 dot (before) | {:.1} |",
        time(&|| dot(black_box(&a), black_box(&b)))
    );
    println!(
        "| int8 ↔ int8 cosine (`DistI8`, graph) | {:.1} |",
        time(&|| DistI8.eval(black_box(&ia), black_box(&ib)))
    );
    println!(
        "| f32 · int8 cosine (scan, re-rank) | {:.1} |",
        time(&|| cosine_f32_i8(black_box(&a), black_box(&ib)))
    );
    // Before/after alternating, so a change of load hits both sides.
    for round in 1..=2 {
        println!(
            "| f16 · f16, baseline x86-64 loop (before), round {round} | {:.1} |",
            time(&|| portable_dot_f16(black_box(&ha), black_box(&hb)))
        );
        println!(
            "| f16 · f16 (`DistF16`, graph), run-time dispatch, round {round} | {:.1} |",
            time(&|| DistF16.eval(black_box(&ha), black_box(&hb)))
        );
        println!(
            "| f32 · f16, baseline x86-64 loop (before), round {round} | {:.1} |",
            time(&|| portable_dot_f32_f16(black_box(&a), black_box(&hb)))
        );
        println!(
            "| f32 · f16 (scan, re-rank), run-time dispatch, round {round} | {:.1} |",
            time(&|| dot_f32_f16(black_box(&a), black_box(&hb)))
        );
        println!(
            "| f32 · int8 × step (a sealed graph's walk), run-time dispatch, round {round} | {:.1} |",
            time(&|| dot_f32_i8(black_box(&a), black_box(&walk)) * step)
        );
    }
    // The recheck's parts: one row's sketch (at seal and load, per row) and the scan of a
    // million sketches for the 64 nearest (per recheck of a million-row segment, one thread).
    let planes = Planes::of(dim);
    println!(
        "| sketch of one f16 row (128 planes, at seal and load) | {:.1} |",
        time(&|| planes.sketch_row(black_box(&hb))[0] as f32)
    );
    let sketches: Vec<Sketch> = (0..1_000_000u64)
        .map(|i| {
            [
                i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                i.rotate_left(17) ^ 0x5555,
            ]
        })
        .collect();
    // In cache (16 MB of a 32 MB L3, as in `scale index`, where little else runs between
    // searches) and out of it (64 MB read between scans, as an embedding's weights do in the
    // gateway): the first is the kernel's speed, the second the memory's.
    let scans = 20;
    let other: Vec<u64> = vec![1; 8 << 20];
    for cold in [false, true] {
        let mut spent = std::time::Duration::ZERO;
        for _ in 0..scans {
            if cold {
                black_box(other.iter().step_by(8).sum::<u64>());
            }
            let t = Instant::now();
            black_box(nearest(black_box(&sketches), 0, [1, 2], CANDIDATES, |_| {
                true
            }));
            spent += t.elapsed();
        }
        println!(
            "| scan of 1M sketches for the {CANDIDATES} nearest (one thread, {}) | {:.0} |",
            if cold {
                "after reading 64 MB"
            } else {
                "in cache"
            },
            spent.as_nanos() as f64 / scans as f64
        );
    }
    let (exact, fast) = (dot(&a, &b), dot_f16(&ha, &hb));
    println!(
        "\nf16 · f16 {fast} against f32 {exact} (difference {:.1e})",
        (fast - exact).abs()
    );
}

/// Embeds one text per line of `--texts` with the provisioned model into `--out` (f32 LE rows).
fn embed(flags: &Args) {
    let texts: Vec<String> = std::fs::File::open(flags.get("texts").map_or("", String::as_str))
        .map(|f| {
            std::io::BufReader::new(f)
                .lines()
                .map_while(Result::ok)
                .collect()
        })
        .unwrap_or_default();
    let mut config = EmbedConfig::default();
    if let Some(dir) = flags.get("models") {
        let dir = PathBuf::from(dir);
        config.model_dir = dir.join("all-MiniLM-L6-v2");
        config.ort_lib = dir
            .join("onnxruntime")
            .join(config.ort_lib.file_name().unwrap_or_default());
    }
    config.deadline = Duration::from_secs(60);
    let embedder = match Embedder::load(&config) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("embed: model not loaded: {e}");
            std::process::exit(1);
        }
    };
    let mut out = Vec::new();
    for batch in texts.chunks(32) {
        match embedder.embed_blocking(batch.to_vec()) {
            Ok(vs) => vs
                .iter()
                .flatten()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Err(e) => {
                eprintln!("embed: {e}");
                std::process::exit(1);
            }
        }
    }
    let path = flags.get("out").map_or("vectors.f32", String::as_str);
    if let Err(e) = std::fs::File::create(path).and_then(|mut f| f.write_all(&out)) {
        eprintln!("embed: {path}: {e}");
        std::process::exit(1);
    }
    eprintln!("embed: {} texts → {path}", texts.len());
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The resident set once the allocator has given back what was freed (jemalloc's background
/// threads return dirty pages after about 10 s): polled each second until it has not fallen for
/// three, at most 40 s. A build frees its `hnsw_rs` graph once sealed; RSS read at once would count it.
fn settled_rss() -> u64 {
    let mut lowest = rss_bytes();
    let mut steady = 0;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_secs(1));
        let now = rss_bytes();
        if now + (1 << 20) >= lowest {
            steady += 1;
            if steady >= 3 {
                break;
            }
        } else {
            steady = 0;
        }
        lowest = lowest.min(now);
    }
    lowest
}

fn percentile(times: &mut [Duration], f: f64) -> Duration {
    times.sort();
    times
        .get(((times.len().saturating_sub(1)) as f64 * f).round() as usize)
        .copied()
        .unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Build (all cores), search p50/p99 and recall@1 of paraphrase queries in one big partition and
/// one small one inside the same index, then dump and load.
fn index(flags: &Args) {
    let n = flag(flags, "n", 100_000usize);
    let dim = flag(flags, "dim", 384usize);
    let kind = flags
        .get("kind")
        .map_or("random", String::as_str)
        .to_owned();
    let queries_n = flag(flags, "queries", 500usize);
    let noise = flag(flags, "noise", 0.3f32);
    let small = flag(flags, "small", 2_000usize).min(n / 2);
    // Partitions up to this many vectors are scanned exactly (`brute_force_below`).
    let flat = flag(flags, "flat", 10_000usize);
    // Points per graph segment (`segment_points`; the gateway's default unless given).
    let segment = flag(flags, "segment", IndexConfig::new(dim).segment_points);
    let ms_list: Vec<usize> = list(flags, "m", "16");
    let efc_list: Vec<usize> = list(flags, "efc", "200");
    let ef_list: Vec<usize> = list(flags, "ef", "64,128");
    // `--recheck 0.9,-2`: each width is searched once per value, alternately on one graph, with
    // the sketch recheck below that similarity (-2: never, the graph alone), so the recheck's
    // recall and cost are measured side by side in one run.
    let recheck_list: Vec<f32> = list(
        flags,
        "recheck",
        &IndexConfig::new(dim).recheck_below.to_string(),
    );
    let dump_dir = flags.get("dump").map(PathBuf::from);
    // Passes over the queries per width (more samples for p99, a longer window for a profiler).
    let rounds = flag(flags, "rounds", 1usize).max(1);
    // `--growing N`: the big partition's last N vectors are inserted one at a time after the build,
    // as a gateway stores entries into a partition that has its graph: into a growing `hnsw_rs`
    // segment (one while N is at most `seal_points`), searched beside the sealed graph.
    let growing = flag(flags, "growing", 0usize).min(n - small);

    let t = Instant::now();
    let base = vectors(&kind, n, dim, 42);
    let big: [u8; 32] = [1; 32];
    let little: [u8; 32] = [2; 32];
    // The last `small` vectors form a small partition inside the same index.
    let tag_of = |i: usize| if i >= n - small { little } else { big };
    let mut rng = StdRng::seed_from_u64(7);
    let sources: Vec<usize> = (0..queries_n).map(|_| rng.random_range(0..n)).collect();
    let queries: Vec<Vec<f32>> = sources
        .iter()
        .map(|i| near(&mut rng, &base[*i], noise))
        .collect();
    // Truth per query within its own partition (exact f32 scan).
    let (big_range, small_range) = (0..n - small, n - small..n);
    let growing_range = n - small - growing..n - small;
    let truth: Vec<usize> = {
        let in_big: Vec<usize> = exact_best(&base[big_range.clone()], &queries, false);
        let in_small: Vec<usize> = exact_best(&base[small_range.clone()], &queries, false);
        sources
            .iter()
            .enumerate()
            .map(|(q, s)| {
                if small_range.contains(s) {
                    in_small[q] + small_range.start
                } else {
                    in_big[q]
                }
            })
            .collect()
    };
    let self_hits = sources.iter().zip(&truth).filter(|(s, t)| s == t).count();
    eprintln!(
        "index: {n} {kind} vectors and exact answers in {:.1?} ({self_hits}/{queries_n} queries' nearest is their source)",
        t.elapsed()
    );
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "\n{n} {kind} vectors of {dim} dims in graph segments of at most {segment}, {queries_n} paraphrase queries (noise {noise}: cosine ≈ {:.2} to their source), {threads} threads, load {}",
        1.0 / (1.0 + noise * noise).sqrt(),
        load_average()
    );
    println!("\n| M | ef_construction | build s | build CPU s | index RSS MB | B/vector | ef_search | recheck below | partition | recall@1 | p50 ms | p99 ms | CPU p50 ms | CPU p99 ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &m in &ms_list {
        for &efc in &efc_list {
            let config = IndexConfig {
                max_connections: m,
                ef_construction: efc,
                brute_force_below: flat,
                segment_points: segment,
                ..IndexConfig::new(dim)
            };
            let before = rss_bytes();
            // CPU time of all threads: under load, wall time says how long the build waited for a
            // core, this what it costs.
            let cpu_before = ProcessTime::now();
            let t = Instant::now();
            // `--load DIR`: search a dump made by an earlier run (same n, kind; `--dump DIR`)
            // instead of building, so widths can be swept on one graph; "build s" is then the load.
            let index = match flags.get("load") {
                Some(dir) => {
                    let ids: BTreeSet<u64> = (0..n as u64).collect();
                    match HnswIndex::load(&PathBuf::from(dir), config.clone()) {
                        Ok(index) if index.ids() == ids => index,
                        Ok(_) => {
                            eprintln!("load {dir}: the dump holds other ids (another --n?)");
                            std::process::exit(1);
                        }
                        Err(e) => {
                            eprintln!("load {dir}: {e}");
                            std::process::exit(1);
                        }
                    }
                }
                // `--graphs later`: every partition left flat, as a gateway rebuilding from its
                // store serves them until their graphs are built; a large one is then searched
                // by its sketches (recheck on) or scanned exactly (`--recheck -2`).
                None => {
                    let index = HnswIndex::build_with(
                        config.clone(),
                        base.iter()
                            .enumerate()
                            .filter(|(i, _)| !growing_range.contains(i))
                            .map(|(i, v)| (i as u64, tag_of(i), v.clone())),
                        if flags.get("graphs").is_some_and(|g| g == "later") {
                            Graphs::Later
                        } else {
                            Graphs::Now
                        },
                    );
                    let t = Instant::now();
                    for i in growing_range.clone() {
                        index.insert(i as u64, big, &base[i]);
                    }
                    if growing > 0 {
                        eprintln!(
                            "index: {growing} vectors inserted one at a time in {:.1?}",
                            t.elapsed()
                        );
                    }
                    index
                }
            };
            let build = t.elapsed();
            let build_cpu = cpu_before.elapsed().as_secs_f64();
            let grown = settled_rss().saturating_sub(before);
            eprintln!(
                "index: M {m} ef_construction {efc} built in {build:.1?} (pid {}), searching",
                std::process::id()
            );
            let mut index = index;
            for (&ef, &recheck) in ef_list
                .iter()
                .flat_map(|ef| recheck_list.iter().map(move |r| (ef, r)))
            {
                index.set_ef_search(ef);
                index.set_recheck_below(recheck);
                let searcher = &index;
                let growing_rows = (growing > 0).then_some((
                    "big, its growing segment's rows",
                    big,
                    &growing_range,
                ));
                for (label, tag, range) in [
                    ("big", big, &big_range),
                    (
                        if small > flat {
                            "small (graph)"
                        } else {
                            "small (flat)"
                        },
                        little,
                        &small_range,
                    ),
                ]
                .into_iter()
                .chain(growing_rows)
                {
                    let mut times = Vec::new();
                    // The process's CPU time over each search (nothing else runs meanwhile): what
                    // a query costs when it is not waiting for a core, which on a loaded machine
                    // wall time hides. A partition in several segments is searched on the index's
                    // search threads, not this one; their brief spin once done counts too, so this
                    // is an upper bound.
                    let mut cpu_times = Vec::new();
                    let mut hits = 0usize;
                    for (q, query) in (0..rounds).flat_map(|_| queries.iter().enumerate()) {
                        if !range.contains(&sources[q]) {
                            continue;
                        }
                        let (t, cpu) = (Instant::now(), ProcessTime::now());
                        let found = searcher.search(&tag, query, 1);
                        times.push(t.elapsed());
                        cpu_times.push(cpu.elapsed());
                        hits += usize::from(found.first().map(|f| f.id as usize) == Some(truth[q]));
                    }
                    if times.is_empty() {
                        continue;
                    }
                    let count = times.len();
                    println!(
                        "| {m} | {efc} | {:.1} | {build_cpu:.0} | {:.0} | {:.0} | {ef} | {recheck} | {label} ({}) | {:.4} | {:.3} | {:.3} | {:.3} | {:.3} |",
                        build.as_secs_f64(),
                        grown as f64 / 1e6,
                        grown as f64 / n as f64,
                        range.len(),
                        hits as f64 / count as f64,
                        ms(percentile(&mut times, 0.5)),
                        ms(percentile(&mut times, 0.99)),
                        ms(percentile(&mut cpu_times, 0.5)),
                        ms(percentile(&mut cpu_times, 0.99)),
                    );
                }
            }
            if let Some(dir) = &dump_dir {
                let t = Instant::now();
                if let Err(e) = index.save(dir) {
                    eprintln!("save: {e}");
                }
                let save = t.elapsed();
                let ids: BTreeSet<u64> = (0..n as u64).collect();
                drop(index);
                let before = settled_rss();
                let t = Instant::now();
                let loaded = HnswIndex::load(dir, config.clone())
                    .map_err(|e| e.to_string())
                    .and_then(|i| {
                        if i.ids() == ids {
                            Ok(i)
                        } else {
                            Err("other ids than were saved".into())
                        }
                    });
                let load = t.elapsed();
                let grown = settled_rss().saturating_sub(before);
                println!(
                    "\nM {m}, ef_construction {efc}: dump written in {:.1} s ({} MB), loaded in {:.1} s ({}; RSS +{} MB, {:.0} B/vector)",
                    save.as_secs_f64(),
                    dir_size(dir) / 1_000_000,
                    load.as_secs_f64(),
                    match &loaded {
                        Ok(i) => format!("{} vectors", i.len()),
                        Err(e) => format!("failed: {e}"),
                    },
                    grown / 1_000_000,
                    grown as f64 / n as f64,
                );
                println!("\n| M | ef_construction | build s | build CPU s | index RSS MB | B/vector | ef_search | recheck below | partition | recall@1 | p50 ms | p99 ms | CPU p50 ms | CPU p99 ms |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
            }
        }
    }
}

fn dir_size(dir: &PathBuf) -> u64 {
    std::fs::read_dir(dir)
        .map(|l| {
            l.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let (command, flags) = args();
    match command.as_str() {
        "quant" => quant(&flags),
        "dist" => dist(&flags),
        "embed" => embed(&flags),
        "index" => index(&flags),
        _ => {
            eprintln!("usage: scale <quant|dist|embed|index> [--flag value]...");
            std::process::exit(2);
        }
    }
}
