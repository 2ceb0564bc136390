//! Latency benchmarks that need percentiles rather than criterion's means: embedding throughput with
//! micro-batching at concurrency 1/8/32, HNSW search p50/p99 at 10k and 100k vectors (whole index and
//! one partition of it), and gateway start-up with 100k stored entries (index reload vs rebuild).
//!
//! Run: `cargo bench -p reprise-benches --bench latency` (needs `scripts/provision-models.sh` for the
//! embedding and start-up parts; fixed seeds throughout).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reprise_server::config::Config;
use reprise_server::embed::{EmbedConfig, Embedder};
use reprise_server::entry::{Entry, EntryId, RequestSummary};
use reprise_server::index::{HnswIndex, VectorIndex};
use reprise_server::key::{CacheKey, PartitionKey};
use reprise_server::semantic::{Semantic, Status};
use reprise_server::store::{SledStore, Store};
use reprise_server::timing::{percentile, Phases};

const DIM: usize = 384;

fn models_dir() -> PathBuf {
    std::env::var_os("REPRISE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")))
}

fn unit(rng: &mut StdRng) -> Vec<f32> {
    let mut v: Vec<f32> = (0..DIM).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

fn near(rng: &mut StdRng, base: &[f32]) -> Vec<f32> {
    let mut v: Vec<f32> = base
        .iter()
        .map(|x| x + rng.random_range(-0.02f32..0.02))
        .collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn report(name: &str, samples: &[f64]) {
    println!(
        "{name:<52} p50 {:>8.3} ms   p99 {:>8.3} ms   (n={})",
        percentile(samples, 0.5).unwrap_or(0.0),
        percentile(samples, 0.99).unwrap_or(0.0),
        samples.len()
    );
}

fn embedding(runtime: &tokio::runtime::Runtime) {
    let models = models_dir();
    let config = EmbedConfig {
        model_dir: models.join("all-MiniLM-L6-v2"),
        ort_lib: models.join("onnxruntime/libonnxruntime.so"),
        deadline: Duration::from_secs(30),
        ..EmbedConfig::default()
    };
    let embedder = match Embedder::load(&config) {
        Ok(e) => Arc::new(e),
        Err(err) => {
            println!("embedding: skipped ({err}); run scripts/provision-models.sh");
            return;
        }
    };
    println!(
        "\n## Embedding (all-MiniLM-L6-v2 int8, micro-batching, max_batch {})",
        config.max_batch
    );
    for concurrency in [1usize, 8, 32] {
        let rounds = 256 / concurrency.max(1) * concurrency.max(1);
        let started = Instant::now();
        let latencies = runtime.block_on(async {
            let mut all = Vec::new();
            let mut sent = 0;
            while sent < rounds {
                let mut tasks = Vec::new();
                for i in 0..concurrency {
                    let e = embedder.clone();
                    let text = format!("how do I reset my password, variant {}", sent + i);
                    tasks.push(tokio::spawn(async move {
                        let t = Instant::now();
                        e.embed(&text).await.map(|_| ms(t.elapsed()))
                    }));
                }
                for t in tasks {
                    if let Ok(Ok(l)) = t.await {
                        all.push(l);
                    }
                }
                sent += concurrency;
            }
            all
        });
        let wall = started.elapsed().as_secs_f64();
        report(&format!("embed, concurrency {concurrency}"), &latencies);
        println!("{:<52} {:>8.1} texts/s", "", latencies.len() as f64 / wall);
    }
}

fn search() {
    println!("\n## HNSW search (dimension {DIM}, k=4, near-duplicate queries)");
    let mut rng = StdRng::seed_from_u64(7);
    for size in [10_000usize, 100_000] {
        let items: Vec<(u64, [u8; 32], Vec<f32>)> = (0..size)
            .map(|i| {
                // Two partitions: half the index each, so partition search is filtered search.
                let partition = [(i % 2) as u8; 32];
                (i as u64 + 1, partition, unit(&mut rng))
            })
            .collect();
        let queries: Vec<(usize, Vec<f32>)> = (0..500)
            .map(|_| {
                let i = rng.random_range(0..size);
                (i, near(&mut rng, &items[i].2))
            })
            .collect();
        let built = Instant::now();
        let index = HnswIndex::build(reprise_server::semantic::index_config(DIM), items.clone());
        println!(
            "{:<52} {:>8.1} s",
            format!("build {size} vectors"),
            built.elapsed().as_secs_f64()
        );
        let mut latencies = Vec::new();
        let mut correct = 0;
        for (i, q) in &queries {
            let t = Instant::now();
            let found = index.search(&items[*i].1, q, 4);
            latencies.push(ms(t.elapsed()));
            if found.first().map(|n| n.id) == Some(items[*i].0) {
                correct += 1;
            }
        }
        report(
            &format!("search {size} (partition of {})", size / 2),
            &latencies,
        );
        println!(
            "{:<52} {:>8.3}",
            "recall@1",
            correct as f64 / queries.len() as f64
        );
    }
}

fn startup() {
    let models = models_dir();
    if !models.join("all-MiniLM-L6-v2/model.onnx").exists() {
        println!("\nstart-up: skipped (no model); run scripts/provision-models.sh");
        return;
    }
    const N: usize = 100_000;
    println!("\n## Start-up with {N} stored entries");
    let dir = tempfile::tempdir().expect("tempdir");
    let store: Arc<dyn Store> = Arc::new(SledStore::open(dir.path()).expect("store"));
    let mut rng = StdRng::seed_from_u64(11);
    let filled = Instant::now();
    for i in 0..N {
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let entry = Entry {
            id: EntryId(0),
            key: CacheKey(key),
            partition: PartitionKey([(i % 16) as u8; 32]),
            summary: RequestSummary {
                route: "chat.completions".into(),
                model: "m".into(),
                namespace: None,
                tenant: "t".into(),
                prompt: format!("prompt {i}"),
                stream: false,
            },
            events: Vec::new(),
            body: serde_json::json!({"choices": [{"message": {"content": "answer"}, "finish_reason": "stop"}]}),
            usage: None,
            phases: Phases::default(),
            created_at_ms: reprise_server::timing::unix_ms(),
            ttl_ms: 86_400_000,
            hit_count: 0,
            last_hit_ms: 0,
            vector: Some(unit(&mut rng)),
            hit_history: Vec::new(),
            warmed: false,
        };
        store.put(entry).expect("put");
    }
    store.flush().expect("flush");
    println!(
        "{:<52} {:>8.1} s",
        "filling the store",
        filled.elapsed().as_secs_f64()
    );
    let config = Config {
        data_dir: dir.path().to_owned(),
        model_dir: models.join("all-MiniLM-L6-v2"),
        ort_lib: models.join("onnxruntime/libonnxruntime.so"),
        ..Config::default()
    };
    for label in ["rebuild (no index dump)", "reload (index dump present)"] {
        let started = Instant::now();
        let semantic = match Semantic::start(&config, &store, None, None) {
            Status::Ready(s) => s,
            Status::Disabled(why) => {
                println!("start-up: semantic disabled: {why}");
                return;
            }
        };
        let serving = started.elapsed();
        // A rebuild runs in the background: the gateway serves (exact matches) before it ends.
        while semantic.index.is_building() {
            std::thread::sleep(Duration::from_millis(50));
        }
        let elapsed = started.elapsed();
        println!(
            "{:<52} {:>8.1} s  (serving after {:.1} s; {} vectors)",
            format!("index ready, {label}"),
            elapsed.as_secs_f64(),
            serving.as_secs_f64(),
            semantic.index.len()
        );
        // Stopping saves the dump the second start loads.
        semantic.stop();
    }
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // REPRISE_BENCH_ONLY=embedding|search|startup runs one part.
    let only = std::env::var("REPRISE_BENCH_ONLY").unwrap_or_default();
    let wants = |part: &str| only.is_empty() || only == part;
    if wants("embedding") {
        embedding(&runtime);
    }
    if wants("search") {
        search();
    }
    if wants("startup") {
        startup();
    }
}
