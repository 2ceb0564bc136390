//! Criterion bench of the relay's per-event work: SSE framing plus classification of each event.
//! This is the CPU the gateway adds to every streamed chunk on a miss.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use reprise_benches::chat_stream;
use reprise_server::sse::{classify, SseFramer};

fn relay_work(c: &mut Criterion) {
    let mut group = c.benchmark_group("sse_relay");
    for (tokens, piece) in [(64usize, 1500usize), (512, 1500), (512, 64)] {
        let chunks = chat_stream(tokens, piece);
        group.throughput(Throughput::Elements(tokens as u64));
        group.bench_function(format!("frame+classify/{tokens}tok/{piece}B"), |b| {
            b.iter_batched(
                || chunks.clone(),
                |chunks| {
                    let mut framer = SseFramer::new();
                    let mut content = 0u32;
                    for chunk in &chunks {
                        for event in framer.push(chunk) {
                            if let reprise_server::sse::EventKind::Chunk { tokens, .. } =
                                classify(&event)
                            {
                                content += tokens;
                            }
                        }
                    }
                    assert_eq!(content as usize, tokens);
                    content
                },
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, relay_work);
criterion_main!(benches);
