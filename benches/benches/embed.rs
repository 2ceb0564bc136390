//! Criterion bench of one embedding, the floor of a semantic hit (issue 22): the model call alone
//! (tokenizer, ONNX Runtime run, pooling; no thread hop) at one thread per core and at one thread,
//! against the same text through the embedding queue as a lone request sees it, at the gateway's
//! default thread count (the worker thread, the gathering rule, the reply). The gap between the
//! queue and the model at the same thread count is what the queue adds.
//!
//! Run: `cargo bench -p reprise-benches --bench embed` (needs `scripts/provision-models.sh`).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use reprise_server::embed::{EmbedConfig, EmbedModel, Embedder, FastembedModel};

fn config(threads: Option<usize>) -> EmbedConfig {
    let models = std::env::var_os("REPRISE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")));
    EmbedConfig {
        model_dir: models.join("all-MiniLM-L6-v2"),
        ort_lib: models.join("onnxruntime/libonnxruntime.so"),
        deadline: Duration::from_secs(60),
        threads,
        ..EmbedConfig::default()
    }
}

fn embedding(c: &mut Criterion) {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let text = "How do I reset my password if I no longer have access to my email?".to_owned();
    let mut group = c.benchmark_group("embed");
    for threads in [cores, 1] {
        let mut model = match FastembedModel::load(&config(Some(threads))) {
            Ok(m) => m,
            Err(err) => {
                eprintln!("embedding benches skipped ({err}); run scripts/provision-models.sh");
                return;
            }
        };
        let texts = vec![text.clone()];
        group.bench_function(format!("model/one text/{threads} threads"), |b| {
            b.iter(|| model.embed(black_box(&texts)))
        });
    }
    // The gateway's own choice: the model's default (one thread for a model run one text at a time).
    let embedder = match Embedder::load(&config(None)) {
        Ok(e) => e,
        Err(err) => {
            eprintln!("embedding benches skipped ({err})");
            return;
        }
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    group.bench_function("queue/one text, lone caller/default threads", |b| {
        b.iter(|| runtime.block_on(embedder.embed(black_box(&text))))
    });
    group.finish();
}

criterion_group!(benches, embedding);
criterion_main!(benches);
