//! Criterion benches of the exact-hit path, with fixed inputs: the store's reads (the whole entry,
//! and the hot read a hit makes, `replay_by_key`) and writes, and rendering a hit from its replay
//! (the SSE stream, the body, the first byte of an instant stream), building a replay and reading one
//! stored whole or compressed. Kept apart from `components.rs`, whose index and embedding groups
//! take minutes to set up.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use futures_util::StreamExt;
use reprise_server::downstream::Source;
use reprise_server::entry::{Entry, EntryId, Replay, RequestSummary};
use reprise_server::ingress::Route;
use reprise_server::key::{CacheKey, PartitionKey};
use reprise_server::policy::Pacing;
use reprise_server::render::{self as replay, Fresh};
use reprise_server::store::{SledStore, Store};
use reprise_server::timing::{PhaseClock, Phases};
use serde_json::{json, Value};

fn entry(i: u64, tokens: usize) -> Entry {
    let chunks: Vec<Value> = (0..tokens)
        .map(|t| json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": format!(" word{t}")}, "finish_reason": null}]}))
        .chain(std::iter::once(json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})))
        .collect();
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&i.to_le_bytes());
    Entry {
        id: EntryId(0),
        key: CacheKey(key),
        partition: PartitionKey([1; 32]),
        summary: RequestSummary {
            route: "chat.completions".into(),
            model: "m".into(),
            namespace: None,
            tenant: "t".into(),
            prompt: "p".into(),
            stream: true,
        },
        body: reprise_server::api::of(Route::ChatCompletions).assemble(&chunks),
        events: chunks
            .into_iter()
            .enumerate()
            .map(|(n, data)| reprise_server::entry::StoredEvent {
                offset_ms: n as f64,
                data,
            })
            .collect(),
        usage: None,
        phases: Phases::default(),
        created_at_ms: 0,
        ttl_ms: u64::MAX / 2,
        hit_count: 0,
        last_hit_ms: 0,
        vector: None,
        hit_history: Vec::new(),
        warmed: false,
    }
}

fn store(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("store");
    for i in 0..1000 {
        store.put(entry(i, 64)).expect("put");
    }
    for i in 0..100 {
        store.put(entry(100_000 + i, 512)).expect("put");
    }
    let probe = entry(500, 64).key;
    let probe_512 = entry(100_050, 512).key;
    let mut group = c.benchmark_group("store");
    // The whole entry (the cold read: admin, semantic candidates).
    group.bench_function("get_by_key/64tok", |b| {
        b.iter(|| store.get_by_key(black_box(&probe)))
    });
    // What an exact hit reads.
    group.bench_function("replay_by_key/64tok", |b| {
        b.iter(|| store.replay_by_key(black_box(&probe)))
    });
    group.bench_function("replay_by_key/512tok", |b| {
        b.iter(|| store.replay_by_key(black_box(&probe_512)))
    });
    let mut next = 10_000u64;
    group.bench_function("put/64tok", |b| {
        b.iter_batched(
            || {
                next += 1;
                entry(next, 64)
            },
            |e| store.put(e),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// Renders a hit and drains what it sends: every byte of the body or stream.
fn render_all(
    runtime: &tokio::runtime::Runtime,
    replay: &Arc<Replay>,
    stream: bool,
    include_usage: bool,
    pacing: Pacing,
) -> usize {
    let fresh = Fresh::new(Route::ChatCompletions);
    let mut clock = PhaseClock::start(Instant::now());
    let (source, _) = replay::render(
        replay.clone(),
        &fresh,
        stream,
        include_usage,
        pacing,
        &mut clock,
    );
    match source {
        Source::Once(body) => body.map_or(0, |b| b.len()),
        Source::Replay(events) => {
            runtime.block_on(events.map(|b| b.len()).fold(0, |a, n| async move { a + n }))
        }
        _ => 0,
    }
}

fn replay_encode(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    for tokens in [64usize, 512] {
        let e = entry(1, tokens);
        let replay = Arc::new(Replay::of(&e));
        // The whole answer as the client receives it, rendered from the stored replay (an instant
        // replay: the head, then the rest, the timing comment and `[DONE]`).
        group.bench_function(format!("sse_events/{tokens}tok"), |b| {
            b.iter(|| render_all(&runtime, black_box(&replay), true, false, Pacing::Instant))
        });
        group.bench_function(format!("sse_events+usage/{tokens}tok"), |b| {
            b.iter(|| render_all(&runtime, black_box(&replay), true, true, Pacing::Instant))
        });
        group.bench_function(format!("body/{tokens}tok"), |b| {
            b.iter(|| render_all(&runtime, black_box(&replay), false, false, Pacing::Instant))
        });
        // From the end of the lookup to the first byte ready for the socket: an instant replay
        // renders its head at once and the rest after the head is flushed.
        group.bench_function(format!("first_byte/{tokens}tok"), |b| {
            b.iter(|| {
                let fresh = Fresh::new(Route::ChatCompletions);
                let mut clock = PhaseClock::start(Instant::now());
                replay::render(
                    black_box(replay.clone()),
                    &fresh,
                    true,
                    false,
                    Pacing::Instant,
                    &mut clock,
                )
            })
        });
        // Building the replay: once per stored answer, on the writer thread.
        group.bench_function(format!("build/{tokens}tok"), |b| {
            b.iter(|| Replay::of(black_box(&e)))
        });
        // What a hit does with the bytes the store read, as `store/codec.rs` does it: the checksum
        // and decode of a record stored whole (schema version 3), against the checksum of the
        // compressed bytes, their decompression and the decode (version 4).
        let record = replay.encode();
        let block = lz4_flex::block::compress(&record);
        eprintln!(
            "replay record, {tokens} tokens: {} bytes whole, {} compressed",
            record.len(),
            block.len()
        );
        group.bench_function(format!("read_whole/{tokens}tok"), |b| {
            b.iter(|| {
                let sum = blake3::hash(black_box(&record));
                (sum, Replay::decode(&record).expect("record"))
            })
        });
        group.bench_function(format!("read_compressed/{tokens}tok"), |b| {
            b.iter(|| {
                let sum = blake3::hash(black_box(&block));
                let record = lz4_flex::block::decompress(&block, record.len()).expect("block");
                (sum, Replay::decode(&record).expect("record"))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, store, replay_encode);
criterion_main!(benches);
