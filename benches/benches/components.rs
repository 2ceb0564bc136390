//! Criterion benches of the hot components on the request path, with fixed inputs and seeds:
//! key canonicalization and hashing (the store and rendering a hit are in `hit.rs`), the literal
//! guards (reading a prompt's literals, one candidate check, and a 2 KB lookup with every guard), embedding
//! (one text and batches; needs the provisioned model), and vector index search (exact partition
//! scan, filtered graph search, and the admin's cross-partition scan) at 10k and 100k vectors.
//!
//! The 100k graph takes minutes to build on two cores, so it is built once and its dump kept in
//! `target/bench-data/` (keyed by seed and size); later runs load it in seconds.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reprise_server::api::keys as build;
use reprise_server::embed::{EmbedConfig, Embedder};
use reprise_server::guard::{Guards, Literals};
use reprise_server::index::{HnswIndex, VectorIndex};
use reprise_server::ingress::Route;
use reprise_server::key::{KeyInput, Tenant};
use serde_json::{json, Map, Value};

fn chat_body(turns: usize) -> Map<String, Value> {
    let mut messages =
        vec![json!({"role": "system", "content": "You are a helpful assistant. Answer briefly."})];
    for i in 0..turns {
        messages.push(
            json!({"role": "user", "content": format!("Question number {i} about caching?")}),
        );
        messages.push(
            json!({"role": "assistant", "content": format!("Answer number {i}, kept short.")}),
        );
    }
    messages.push(json!({"role": "user", "content": "And how do I reset my password?"}));
    let body = json!({
        "model": "gpt-4o-mini", "temperature": 0.2, "max_tokens": 256, "stream": true,
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
        "messages": messages
    });
    match body {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn keys(c: &mut Criterion) {
    let mut group = c.benchmark_group("key");
    for turns in [0usize, 10] {
        let body = chat_body(turns);
        let headers = http::HeaderMap::new();
        group.bench_function(format!("canonicalize+blake3/{turns}turns"), |b| {
            b.iter(|| {
                let input = KeyInput {
                    route: Route::ChatCompletions,
                    body: black_box(&body),
                    headers: &headers,
                    tenant: Tenant::Key([7; 32]),
                    namespace: None,
                };
                build(&input).map(|k| k.exact)
            })
        });
    }
    group.finish();
}

/// A question and a 2 KB prompt (a pasted paragraph with numbers), as a semantic lookup reads them.
fn guard(c: &mut Criterion) {
    let question = "Can I book an appointment for 3pm tomorrow, or is Friday the earliest?";
    let paragraph = "Our clinic on 14 Station Road opened in 2019 and does not take walk-ins. \
        Appointments run from 9:00 to 17:30 on weekdays, and until 1pm on Saturdays. ";
    let long = paragraph.repeat(2048 / paragraph.len() + 1);
    let guards = Guards::ALL;
    let candidate =
        Literals::of("Can I book an appointment for 3pm on Friday, or is tomorrow out?");
    let mut group = c.benchmark_group("guard");
    group.bench_function("literals/question", |b| {
        b.iter(|| Literals::of(black_box(question)))
    });
    group.bench_function("literals/2KB", |b| {
        b.iter(|| Literals::of(black_box(&long)))
    });
    group.bench_function("check/question-vs-candidate", |b| {
        b.iter(|| guards.refuses(&Literals::of(black_box(question)), black_box(&candidate)))
    });
    // The worst case of a lookup: every guard runs (none refuses), aligning two 2 KB prompts that
    // differ in a few words; the request's literals are read once, the candidate's every time.
    let reworded = format!("Hello there. {long} Thanks a lot!");
    group.bench_function("lookup/2KB-all-guards-pass", |b| {
        b.iter(|| {
            let query = Literals::of(black_box(&long));
            let verdict = guards.refuses(&query, &Literals::of(black_box(&reworded)));
            assert!(verdict.is_none(), "{verdict:?}");
        })
    });
    group.finish();
}

fn unit(rng: &mut StdRng) -> Vec<f32> {
    let mut v: Vec<f32> = (0..384).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.iter_mut().for_each(|x| *x /= n);
    v
}

fn index(c: &mut Criterion) {
    let mut rng = StdRng::seed_from_u64(3);
    // Partition 0 is large (graph search with a filter); partition 1 is small (exact scan).
    let items: Vec<(u64, [u8; 32], Vec<f32>)> = (0..10_000u64)
        .map(|i| {
            (
                i + 1,
                if i < 9_000 { [0; 32] } else { [1; 32] },
                unit(&mut rng),
            )
        })
        .collect();
    let mut config = reprise_server::semantic::index_config(384);
    // Force the graph for the large partition so both paths are measured.
    config.brute_force_below = 2_000;
    let idx = HnswIndex::build(config, items.clone());
    let query = items[42].2.clone();
    let small_query = items[9_500].2.clone();
    let mut group = c.benchmark_group("index");
    group.bench_function("search/10k/graph-partition-9k", |b| {
        b.iter(|| idx.search(&[0; 32], black_box(&query), 4))
    });
    group.bench_function("search/10k/exact-partition-1k", |b| {
        b.iter(|| idx.search(&[1; 32], black_box(&small_query), 4))
    });
    group.finish();
}

/// 100k vectors: two 49.5k partitions (graph search with a partition filter) and one of 1k (scan).
fn index_100k(c: &mut Criterion) {
    const SIZE: u64 = 100_000;
    let mut rng = StdRng::seed_from_u64(11);
    let items: Vec<(u64, [u8; 32], Vec<f32>)> = (0..SIZE)
        .map(|i| {
            let partition = if i >= SIZE - 1_000 {
                [2; 32]
            } else {
                [(i % 2) as u8; 32]
            };
            (i + 1, partition, unit(&mut rng))
        })
        .collect();
    let config = reprise_server::semantic::index_config(384);
    let dir = std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/bench-data/index-100k-seed11"
    ));
    let ids: std::collections::BTreeSet<u64> = items.iter().map(|(id, _, _)| *id).collect();
    // A graph kept by an earlier run is used only when it holds exactly these vectors' ids.
    let idx = match HnswIndex::load(&dir, config.clone()) {
        Ok(idx) if idx.ids() == ids => idx,
        _ => {
            eprintln!(
                "building the 100k-vector graph once (minutes on 2 cores); kept in {}",
                dir.display()
            );
            let idx = HnswIndex::build(config, items.clone());
            if let Err(err) = idx.save(&dir) {
                eprintln!("could not keep the graph: {err}");
            }
            idx
        }
    };
    let big = items[4_242].clone();
    let small = items[(SIZE - 10) as usize].clone();
    let mut group = c.benchmark_group("index");
    group.bench_function("search/100k/graph-partition-49.5k", |b| {
        b.iter(|| idx.search(&big.1, black_box(&big.2), 4))
    });
    group.bench_function("search/100k/exact-partition-1k", |b| {
        b.iter(|| idx.search(&small.1, black_box(&small.2), 4))
    });
    group.sample_size(20);
    group.bench_function("scan_all/100k (admin search)", |b| {
        b.iter(|| idx.scan_all(black_box(&big.2), -1.0, 20))
    });
    group.finish();
}

/// The local model: one text (a lone request) and batches (what micro-batching forms under load).
fn embedding(c: &mut Criterion) {
    let models = std::env::var_os("REPRISE_MODELS_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models"))
        });
    let config = EmbedConfig {
        model_dir: models.join("all-MiniLM-L6-v2"),
        ort_lib: models.join("onnxruntime/libonnxruntime.so"),
        deadline: std::time::Duration::from_secs(60),
        ..EmbedConfig::default()
    };
    let embedder = match Embedder::load(&config) {
        Ok(e) => e,
        Err(err) => {
            eprintln!("embedding benches skipped ({err}); run scripts/provision-models.sh");
            return;
        }
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    let texts: Vec<String> = (0..32)
        .map(|i| {
            format!("How do I reset the password of account number {i} after the email changed?")
        })
        .collect();
    let mut group = c.benchmark_group("embed");
    group.bench_function("single", |b| {
        b.iter(|| runtime.block_on(embedder.embed(black_box(&texts[0]))))
    });
    for n in [8usize, 32] {
        group.bench_function(format!("batch/{n}"), |b| {
            b.iter(|| runtime.block_on(embedder.embed_many(black_box(texts[..n].to_vec()))))
        });
    }
    group.finish();
}

criterion_group!(benches, keys, guard, index, index_100k, embedding);
criterion_main!(benches);
