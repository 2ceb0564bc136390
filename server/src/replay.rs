//! Replay, the stage that serves an entry: a hit (or a follower of an identical miss in flight)
//! gets a copy of the stored answer with a fresh `id`/`created`, as a body or an SSE stream paced
//! as asked. Both shapes are stored (see [`crate::cache::cacheable`]), so nothing is re-derived here.

use std::time::Duration;

use std::sync::Arc;
use std::time::Instant;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::cache::{Flight, FlightEnd};
use crate::downstream::{Delivered, Delivery, Source};
use crate::entry::{Entry, HitEvent, HitKind};
use crate::error::GatewayError;
use crate::ingress::Route;
use crate::pipeline::lookup::{Found, How};
use crate::pipeline::Exchange;
use crate::policy::Pacing;
use crate::record::{
    set_cache_outcome, set_header, set_request_id, unix_ms, CacheOutcome, Completion, Served,
};
use crate::timing::PhaseClock;
use crate::AppState;

/// The identity a replayed response carries instead of the original's.
#[derive(Debug, Clone)]
pub struct Fresh {
    pub id: String,
    pub created: u64,
}

impl Fresh {
    pub fn new(route: Route) -> Self {
        let prefix = match route {
            Route::ChatCompletions => "chatcmpl-",
            Route::Completions => "cmpl-",
            Route::Embeddings => "",
        };
        let seed = blake3::hash(&crate::record::unix_ms().to_le_bytes());
        let nonce: u64 = rand_u64() ^ u64::from_le_bytes(first8(seed.as_bytes()));
        Self {
            id: format!("{prefix}reprise{nonce:016x}"),
            created: crate::record::unix_ms() / 1000,
        }
    }
}

fn first8(b: &[u8; 32]) -> [u8; 8] {
    [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]
}

/// A process-wide counter mixed into ids: unique even within one millisecond.
fn rand_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
}

fn refresh_identity(value: &mut Value, fresh: &Fresh) {
    if let Some(obj) = value.as_object_mut() {
        if obj.contains_key("id") {
            obj.insert("id".into(), json!(fresh.id));
        }
        if obj.contains_key("created") {
            obj.insert("created".into(), json!(fresh.created));
        }
    }
}

/// Whether a chunk is the usage-only chunk sent when `stream_options.include_usage` was asked.
fn is_usage_chunk(chunk: &Value) -> bool {
    chunk.get("usage").is_some_and(|u| !u.is_null())
        && chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
}

/// One chunk as a client receives it from a hit or a coalesced flight: fresh identity, and usage
/// only when the client asked for it. `None` for a usage-only chunk it did not ask for.
pub fn render_chunk(chunk: &Value, fresh: &Fresh, include_usage: bool) -> Option<Bytes> {
    let mut chunk = chunk.clone();
    if is_usage_chunk(&chunk) {
        if !include_usage {
            return None;
        }
    } else if let Some(obj) = chunk.as_object_mut() {
        // `usage: null` appears on every chunk only when the client asked for usage.
        if include_usage {
            obj.entry("usage").or_insert(Value::Null);
        } else {
            obj.remove("usage");
        }
    }
    refresh_identity(&mut chunk, fresh);
    Some(Bytes::from(format!("data: {chunk}\n\n")))
}

/// The SSE events of a hit with their send offsets (ms after the first), `[DONE]` not included.
pub fn stream_events(
    entry: &Entry,
    fresh: &Fresh,
    include_usage: bool,
    pacing: Pacing,
) -> Vec<(f64, Bytes)> {
    let mut out = Vec::with_capacity(entry.events.len() + 1);
    let mut saw_usage = false;
    let mut content_index = 0u32;
    let mut last_offset = 0.0;
    for event in &entry.events {
        saw_usage |= is_usage_chunk(&event.data);
        let Some(bytes) = render_chunk(&event.data, fresh, include_usage) else {
            continue;
        };
        let offset = match pacing {
            Pacing::Instant => 0.0,
            Pacing::Recorded => event.offset_ms,
            Pacing::TokensPerSecond(rate) => {
                if crate::sse::chunk_tokens(&event.data) > 0 {
                    content_index += 1;
                }
                f64::from(content_index.saturating_sub(1)) * 1000.0 / rate
            }
        };
        last_offset = offset;
        out.push((offset, bytes));
    }
    if include_usage && !saw_usage {
        if let Some(chunk) = synthesized_usage(entry, fresh) {
            out.push((last_offset, chunk));
        }
    }
    out
}

/// The usage-only chunk for a client that asked for usage when the stream recorded none: the
/// assembled answer still has the upstream's usage.
fn synthesized_usage(entry: &Entry, fresh: &Fresh) -> Option<Bytes> {
    let usage = entry.usage.as_ref()?;
    let mut chunk = template_chunk(entry, fresh);
    chunk["choices"] = json!([]);
    chunk["usage"] = usage.clone();
    Some(Bytes::from(format!("data: {chunk}\n\n")))
}

/// For instant replay: how many stored events go out first (up to and including the first one with
/// content), so the first token leaves before the rest of a long answer is rendered.
pub fn head_len(entry: &Entry) -> usize {
    entry
        .events
        .iter()
        .position(|e| crate::sse::chunk_tokens(&e.data) > 0)
        .map_or(entry.events.len(), |p| p + 1)
}

/// Renders stored events `from..to` for an instant replay, with the synthesized usage chunk after
/// the last one when the client asked for usage and the stream recorded none.
pub fn render_range(
    entry: &Entry,
    fresh: &Fresh,
    include_usage: bool,
    from: usize,
    to: usize,
) -> Vec<u8> {
    let events = entry.events.get(from..to).unwrap_or_default();
    let mut out = Vec::with_capacity(events.len() * 160 + 256);
    for event in events {
        if let Some(bytes) = render_chunk(&event.data, fresh, include_usage) {
            out.extend_from_slice(&bytes);
        }
    }
    let at_end = to >= entry.events.len();
    if at_end && include_usage && !entry.events.iter().any(|e| is_usage_chunk(&e.data)) {
        if let Some(chunk) = synthesized_usage(entry, fresh) {
            out.extend_from_slice(&chunk);
        }
    }
    out
}

fn template_chunk(entry: &Entry, fresh: &Fresh) -> Value {
    let object = if entry.summary.route == Route::Completions.name() {
        "text_completion"
    } else {
        "chat.completion.chunk"
    };
    let mut chunk = json!({"id": fresh.id, "object": object, "created": fresh.created, "model": entry.body.get("model").cloned().unwrap_or(Value::Null)});
    if let Some(fp) = entry.body.get("system_fingerprint") {
        chunk["system_fingerprint"] = fp.clone();
    }
    chunk
}

/// The body of a non-streamed hit.
pub fn body(entry: &Entry, fresh: &Fresh) -> Bytes {
    let mut body = entry.body.clone();
    refresh_identity(&mut body, fresh);
    Bytes::from(body.to_string())
}

/// Sleeps until each event's offset (after the hit's near-zero first event) and yields it.
pub fn paced(events: Vec<(f64, Bytes)>) -> impl futures_util::Stream<Item = Bytes> + Send {
    let start = tokio::time::Instant::now();
    futures_util::stream::unfold(events.into_iter(), move |mut events| async move {
        let (offset, bytes) = events.next()?;
        let wait = offset_duration(offset);
        if !wait.is_zero() {
            // Saturating: an instant beyond the clock's range is simply never reached.
            match start.checked_add(wait) {
                Some(at) => tokio::time::sleep_until(at).await,
                None => tokio::time::sleep(MAX_OFFSET).await,
            }
        }
        Some((bytes, events))
    })
}

/// Longest wait between the start of a paced replay and one of its events. Rates are bounded when
/// parsed; this keeps the arithmetic itself from panicking whatever offset reaches it (a stored
/// entry's recorded timing included).
const MAX_OFFSET: Duration = Duration::from_secs(24 * 3600);

/// A send offset in milliseconds as a wait, never panicking: negative and NaN are no wait, anything
/// too large for a `Duration` (or above [`MAX_OFFSET`]) is [`MAX_OFFSET`].
fn offset_duration(offset_ms: f64) -> Duration {
    if offset_ms.is_nan() || offset_ms <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(offset_ms / 1000.0).map_or(MAX_OFFSET, |d| d.min(MAX_OFFSET))
}

/// Serves an entry: a hit, or a follower once its leader's answer landed.
pub fn serve(state: &AppState, ex: &Exchange, found: Found) -> Response {
    let Found { entry, age_s, how } = found;
    let (stream, include_usage, pacing) = (ex.stream, ex.include_usage, ex.policy.pacing);
    let outcome = how.outcome();
    let similarity = how.similarity();
    let fresh = Fresh::new(ex.route());
    let mut clock: PhaseClock = ex.ingress.clock.clone();
    let mut meta = ex.record(outcome);
    let log = state.requests.clone();
    let (source, content_type) = if stream {
        let events = stream_events(&entry, &fresh, include_usage, pacing);
        clock.first_token = Some(Instant::now());
        if matches!(pacing, Pacing::Instant) {
            // The first token leaves before the rest of a long answer is rendered: the head goes
            // out, the task yields once so the server flushes it, then the rest follows.
            let tokens: u32 = entry
                .events
                .iter()
                .map(|e| crate::sse::chunk_tokens(&e.data))
                .sum();
            clock.tokens(clock.first_token.unwrap_or_else(Instant::now), tokens);
            let split = head_len(&entry);
            let head = Bytes::from(render_range(&entry, &fresh, include_usage, 0, split));
            let (entry, clock_at_head) = (entry.clone(), clock.clone());
            let rest = async move {
                tokio::task::yield_now().await;
                let mut rest =
                    render_range(&entry, &fresh, include_usage, split, entry.events.len());
                rest.extend_from_slice(&clock_at_head.phases(Instant::now()).sse_comment());
                rest.extend_from_slice(b"data: [DONE]\n\n");
                Bytes::from(rest)
            };
            let body = futures_util::stream::once(std::future::ready(head))
                .chain(futures_util::stream::once(rest))
                .boxed();
            (Source::Replay(body), SSE)
        } else {
            let clock_at_start = clock.clone();
            let tail = futures_util::stream::once(async move {
                let mut tail = clock_at_start.phases(Instant::now()).sse_comment().to_vec();
                tail.extend_from_slice(b"data: [DONE]\n\n");
                Bytes::from(tail)
            });
            (Source::Replay(paced(events).chain(tail).boxed()), SSE)
        }
    } else {
        let body = body(&entry, &fresh);
        clock.first_token = Some(Instant::now());
        clock.last_token = clock.first_token;
        (Source::Once(Some(body)), "application/json")
    };
    let phases = clock.phases(Instant::now());
    // A coalesced request waited for the upstream like its leader: it claims no saving.
    let saved = entry
        .ttft_cost_ms()
        .filter(|_| !matches!(how, How::Coalesced))
        .map(|cost| (cost - phases.ttft_ms.unwrap_or(0.0)).max(0.0));
    meta.served = Some(Served {
        entry: entry.id,
        similarity,
        ttft_saved_ms: saved,
    });
    state.cache.note_hit(
        entry.id,
        HitEvent {
            at_ms: unix_ms(),
            kind: how.kind(),
            similarity,
            request_id: ex.id.clone(),
            ttft_ms: phases.ttft_ms,
            ttft_saved_ms: saved,
        },
    );
    let delivery = Delivery::new(source, move |how| {
        let completion = match how {
            Delivered::Complete(at) => {
                clock.delivered = Some(at);
                Completion::Complete
            }
            _ => Completion::ClientDisconnected,
        };
        meta.finish(&log, 200, completion, &clock);
    });
    let mut response = Response::new(delivery.into_body());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if stream {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    } else {
        set_header(headers, "server-timing", phases.server_timing());
    }
    set_cache_outcome(headers, outcome);
    set_request_id(headers, &ex.id);
    set_header(headers, "x-reprise-entry", entry.id.to_string());
    set_header(headers, "age", age_s.to_string());
    if let Some(saved) = saved {
        set_header(headers, "x-reprise-ttft-saved-ms", format!("{saved:.1}"));
    }
    if let Some(similarity) = similarity {
        set_header(headers, "x-reprise-similarity", format!("{similarity:.4}"));
    }
    response
}

const SSE: &str = "text/event-stream; charset=utf-8";

/// Follows the leader of an identical miss. Streaming followers of a streaming leader get its
/// chunks as they arrive; the others get the stored answer once it lands. `None` when the leader's
/// answer could not be cached before anything was sent to this client: it then goes upstream itself.
pub async fn follow(state: &AppState, ex: &Exchange, flight: &Arc<Flight>) -> Option<Response> {
    let coalesced = |entry| Found {
        entry,
        age_s: 0,
        how: How::Coalesced,
    };
    if !(ex.stream && flight.leader_streams) {
        return match flight.end().await {
            FlightEnd::Stored(entry) => Some(serve(state, ex, coalesced(entry))),
            FlightEnd::Uncacheable => None,
        };
    }
    let first = flight.next(0).await;
    if first.chunks.is_empty() {
        match &first.end {
            Some(FlightEnd::Uncacheable) => return None,
            // The flight ended before any chunk: the leader was served an entry instead (a semantic
            // hit found while its upstream request was in flight).
            Some(FlightEnd::Stored(entry)) => {
                return Some(serve(state, ex, coalesced(entry.clone())))
            }
            None => {}
        }
    }
    let fresh = Fresh::new(ex.route());
    let include_usage = ex.include_usage;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let mut clock = ex.ingress.clock.clone();
    let mut meta = ex.record(CacheOutcome::Coalesced);
    let log = state.requests.clone();
    let cache = state.cache.clone();
    let flight = flight.clone();
    let (delivered_tx, delivered_rx) = tokio::sync::oneshot::channel::<Delivered>();
    state.tasks.spawn(async move {
        let mut update = first;
        let mut seen = 0;
        let completion = loop {
            seen += update.chunks.len();
            for chunk in &update.chunks {
                let now = Instant::now();
                clock.tokens(now, crate::sse::chunk_tokens(chunk));
                if clock.first_token.is_none() {
                    clock.first_token = Some(now);
                }
                if let Some(bytes) = render_chunk(chunk, &fresh, include_usage) {
                    if tx.send(bytes).await.is_err() {
                        break;
                    }
                }
            }
            match update.end {
                Some(FlightEnd::Stored(entry)) => {
                    // A follower that joined mid-flight saved only part of the prefill: no claim.
                    meta.served = Some(Served {
                        entry: entry.id,
                        similarity: None,
                        ttft_saved_ms: None,
                    });
                    cache.note_hit(
                        entry.id,
                        HitEvent {
                            at_ms: unix_ms(),
                            kind: HitKind::Coalesced,
                            similarity: None,
                            request_id: meta.id.clone(),
                            ttft_ms: clock.phases(Instant::now()).ttft_ms,
                            ttft_saved_ms: None,
                        },
                    );
                    let mut tail = clock.phases(Instant::now()).sse_comment().to_vec();
                    tail.extend_from_slice(b"data: [DONE]\n\n");
                    let _ = tx.send(Bytes::from(tail)).await;
                    break Completion::Complete;
                }
                Some(FlightEnd::Uncacheable) => {
                    let err = GatewayError::UpstreamProtocol {
                        reason: "the stream broke off",
                        detail: "the coalesced leader's stream failed".into(),
                    };
                    let _ = tx.send(err.sse_event()).await;
                    break Completion::StreamFailed;
                }
                None => update = flight.next(seen).await,
            }
        };
        drop(tx);
        let completion = match delivered_rx.await {
            Ok(Delivered::Complete(at)) => {
                clock.delivered = Some(at);
                completion
            }
            _ => Completion::ClientDisconnected,
        };
        meta.finish(&log, 200, completion, &clock);
    });
    let delivery = Delivery::new(Source::Channel(rx), move |how| {
        let _ = delivered_tx.send(how);
    });
    let mut response = Response::new(delivery.into_body());
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(SSE));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    set_cache_outcome(headers, CacheOutcome::Coalesced);
    set_request_id(headers, &ex.id);
    Some(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::cacheable::assemble;
    use crate::entry::StoredEvent;

    fn chunks() -> Vec<Value> {
        vec![
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": null}]}),
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": " world"}, "finish_reason": null}]}),
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
        ]
    }

    #[test]
    fn pacing_offsets_never_panic_whatever_their_size() {
        // 1000 / 1e-300 ms overflowed `Duration::from_secs_f64` and panicked the worker (issue 14).
        for (offset_ms, want) in [
            (f64::NAN, Duration::ZERO),
            (-5.0, Duration::ZERO),
            (0.0, Duration::ZERO),
            (1500.0, Duration::from_millis(1500)),
            (1e303, MAX_OFFSET),
            (f64::INFINITY, MAX_OFFSET),
            (f64::MAX, MAX_OFFSET),
        ] {
            assert_eq!(offset_duration(offset_ms), want, "{offset_ms}");
        }
    }

    #[tokio::test]
    async fn a_paced_stream_with_an_absurd_offset_waits_instead_of_panicking() {
        use futures_util::StreamExt;
        let events = vec![(0.0, Bytes::from("a")), (1e303, Bytes::from("b"))];
        let mut stream = Box::pin(paced(events));
        assert_eq!(stream.next().await, Some(Bytes::from("a")));
        // The second event is due in (capped) hours: still pending, and no panic on the way.
        let second = tokio::time::timeout(Duration::from_millis(20), stream.next()).await;
        assert!(second.is_err(), "the far event must wait");
    }

    #[test]
    fn instant_head_and_rest_render_the_same_stream_as_the_paced_path() {
        let body = assemble(Route::ChatCompletions, &chunks());
        let entry = Entry {
            id: crate::entry::EntryId(1),
            key: crate::key::CacheKey([0; 32]),
            partition: crate::key::PartitionKey([0; 32]),
            summary: crate::entry::RequestSummary {
                route: Route::ChatCompletions.name().into(),
                model: "m".into(),
                namespace: None,
                tenant: "t".into(),
                prompt: "p".into(),
                stream: true,
            },
            events: chunks()[..4]
                .iter()
                .map(|c| StoredEvent {
                    offset_ms: 0.0,
                    data: c.clone(),
                })
                .collect(),
            usage: body.get("usage").cloned(),
            body,
            phases: crate::timing::Phases::default(),
            created_at_ms: 0,
            ttl_ms: 1,
            hit_count: 0,
            last_hit_ms: 0,
            vector: None,
            hit_history: Vec::new(),
            warmed: false,
        };
        let fresh = Fresh {
            id: "x".into(),
            created: 2,
        };
        // Role chunk and first content chunk go first.
        assert_eq!(head_len(&entry), 2);
        for include_usage in [false, true] {
            let split = head_len(&entry);
            let mut lazy = render_range(&entry, &fresh, include_usage, 0, split);
            lazy.extend(render_range(
                &entry,
                &fresh,
                include_usage,
                split,
                entry.events.len(),
            ));
            let paced: Vec<u8> = stream_events(&entry, &fresh, include_usage, Pacing::Instant)
                .into_iter()
                .flat_map(|(_, b)| b.to_vec())
                .collect();
            assert_eq!(lazy, paced);
            // Usage recorded only in the assembled body is synthesized when asked for.
            assert_eq!(
                String::from_utf8_lossy(&lazy).contains("completion_tokens"),
                include_usage
            );
        }
    }
}
