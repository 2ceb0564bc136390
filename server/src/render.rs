//! How an entry's answer is rendered for the client: a hit (or a follower of an identical miss in
//! flight) gets a copy of the stored answer with a fresh `id`/`created` (an Anthropic message a fresh `msg_` id; a Responses API
//! answer keeps its original ids: see [`crate::api::responses`]), as a body or an SSE stream paced as asked. Both shapes are stored (each API's adapter in [`crate::api`] makes one from the other), so nothing is re-derived here.
//!
//! A hit renders from the entry's [`Replay`]: its events and body are stored serialized, with
//! holes for the fresh identity and spans for `include_usage`, so rendering copies bytes and parses
//! no JSON. Only a coalesced follower of a streaming leader renders chunks one by one
//! ([`render_chunk`]), as they arrive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use reprise_migrations::replay::Identity;
use serde_json::{json, Value};

use crate::downstream::Source;
use crate::entry::Replay;
use crate::ingress::Route;
use crate::policy::Pacing;
use crate::timing::PhaseClock;

/// The identity a replayed response carries instead of the original's.
#[derive(Debug, Clone)]
pub struct Fresh {
    pub id: String,
    pub created: u64,
}

impl Fresh {
    pub fn new(route: Route) -> Self {
        let prefix = crate::api::of(route).id_prefix();
        let seed = blake3::hash(&crate::timing::unix_ms().to_le_bytes());
        let nonce: u64 = rand_u64() ^ u64::from_le_bytes(first8(seed.as_bytes()));
        Self {
            id: format!("{prefix}reprise{nonce:016x}"),
            created: crate::timing::unix_ms() / 1000,
        }
    }
}

impl Fresh {
    /// The JSON of the id and of `created`, as they fill a replay's holes.
    fn identity_json(&self) -> (Vec<u8>, Vec<u8>) {
        let id = serde_json::to_vec(&self.id).unwrap_or_default();
        (id, self.created.to_string().into_bytes())
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

/// A fresh identity ready to fill a replay's holes.
struct Filled {
    id: Vec<u8>,
    created: Vec<u8>,
}

impl Filled {
    fn of(fresh: &Fresh) -> Self {
        let (id, created) = fresh.identity_json();
        Self { id, created }
    }

    fn identity(&self) -> Identity<'_> {
        Identity::Fresh {
            id: &self.id,
            created: &self.created,
        }
    }
}

/// The SSE events of a hit with their send offsets (ms after the first), `[DONE]` not included.
fn stream_events(
    replay: &Replay,
    fresh: &Filled,
    include_usage: bool,
    pacing: Pacing,
) -> Vec<(f64, Bytes)> {
    let record = &replay.record;
    let mut out = Vec::with_capacity(record.events.len() + 1);
    let mut content_index = 0u32;
    let mut last_offset = 0.0;
    let mut bytes = Vec::new();
    for (i, event) in record.events.iter().enumerate() {
        let (text, holes) = record.event_ranges(i, i + 1);
        record
            .stream
            .render(text, holes, include_usage, fresh.identity(), &mut bytes);
        // Empty only for a usage-only chunk the client did not ask for.
        if bytes.is_empty() {
            continue;
        }
        let offset = match pacing {
            Pacing::Instant => 0.0,
            Pacing::Recorded => event.offset_ms,
            Pacing::TokensPerSecond(rate) => {
                if event.tokens > 0 {
                    content_index += 1;
                }
                f64::from(content_index.saturating_sub(1)) * 1000.0 / rate
            }
        };
        last_offset = offset;
        out.push((offset, Bytes::from(std::mem::take(&mut bytes))));
    }
    if include_usage {
        if let Some(usage) = &record.usage_chunk {
            out.push((
                last_offset,
                Bytes::from(usage.render_all(true, fresh.identity())),
            ));
        }
    }
    out
}

/// For instant replay: how many stored events go out first (up to and including the first one with
/// content), so the first token leaves before the rest of a long answer is rendered.
fn head_len(replay: &Replay) -> usize {
    let events = &replay.record.events;
    events
        .iter()
        .position(|e| e.tokens > 0)
        .map_or(events.len(), |p| p + 1)
}

/// Renders stored events `from..to` for an instant replay, with the synthesized usage chunk after
/// the last one when the client asked for usage and the stream recorded none.
fn render_range(
    replay: &Replay,
    fresh: &Filled,
    include_usage: bool,
    from: usize,
    to: usize,
    out: &mut Vec<u8>,
) {
    let record = &replay.record;
    let (text, holes) = record.event_ranges(from, to);
    out.reserve(text.len() + 256);
    record
        .stream
        .render(text, holes, include_usage, fresh.identity(), out);
    if to >= record.events.len() && include_usage {
        if let Some(usage) = &record.usage_chunk {
            let all = 0..usage.text.len();
            usage.render(all, 0..usage.holes.len(), true, fresh.identity(), out);
        }
    }
}

/// The body of a non-streamed hit.
fn body(replay: &Replay, fresh: &Filled) -> Bytes {
    Bytes::from(replay.record.body.render_all(false, fresh.identity()))
}

/// What a hit sends, and its content type: the body, or the SSE stream paced as asked (the phase
/// comment and `[DONE]` at its end). Notes the first (and, for a body, last) token on `clock`.
pub fn render(
    replay: Arc<Replay>,
    fresh: &Fresh,
    stream: bool,
    include_usage: bool,
    pacing: Pacing,
    clock: &mut PhaseClock,
) -> (Source, &'static str) {
    let fresh = Filled::of(fresh);
    // The answer's content tokens, all sent at once: a body carries as many as the stream would,
    // and its record must not say 0 (it did before: only streamed hits counted them).
    let tokens: u32 = replay.record.events.iter().map(|e| e.tokens).sum();
    if !stream {
        let body = body(&replay, &fresh);
        let first = Instant::now();
        clock.first_token = Some(first);
        clock.tokens(first, tokens);
        clock.last_token = clock.first_token;
        return (Source::Once(Some(body)), "application/json");
    }
    const SSE: &str = "text/event-stream; charset=utf-8";
    if !matches!(pacing, Pacing::Instant) {
        let events = stream_events(&replay, &fresh, include_usage, pacing);
        clock.first_token = Some(Instant::now());
        let clock_at_start = clock.clone();
        let end = stream_end(&replay);
        let tail = futures_util::stream::once(async move {
            let mut tail = clock_at_start.phases(Instant::now()).sse_comment().to_vec();
            tail.extend_from_slice(end);
            Bytes::from(tail)
        });
        return (Source::Replay(paced(events).chain(tail).boxed()), SSE);
    }
    // The first token leaves before the rest of a long answer is rendered: the head goes out, the
    // task yields once so the server flushes it, then the rest follows.
    let first = Instant::now();
    clock.first_token = Some(first);
    clock.tokens(first, tokens);
    let split = head_len(&replay);
    let mut head = Vec::new();
    render_range(&replay, &fresh, include_usage, 0, split, &mut head);
    let clock_at_head = clock.clone();
    let rest = async move {
        tokio::task::yield_now().await;
        let mut rest = Vec::new();
        let to = replay.events();
        render_range(&replay, &fresh, include_usage, split, to, &mut rest);
        rest.extend_from_slice(&clock_at_head.phases(Instant::now()).sse_comment());
        rest.extend_from_slice(stream_end(&replay));
        Bytes::from(rest)
    };
    let body = futures_util::stream::once(std::future::ready(Bytes::from(head)))
        .chain(futures_util::stream::once(rest))
        .boxed();
    (Source::Replay(body), SSE)
}

/// What follows the timing comment at the end of a hit's stream: `data: [DONE]`, or for a
/// Responses API stream (which ends with its `response.completed` event) the blank line that
/// closes the comment.
fn stream_end(replay: &Replay) -> &'static [u8] {
    if replay.record.named_events() {
        b"\n"
    } else {
        b"data: [DONE]\n\n"
    }
}

/// A named event as a coalesced follower receives it: named by its type, as the leader received
/// it, except that an Anthropic message's `message_start` carries the follower's own id when
/// `renew` is given (a Responses API follower keeps the ids, see [`reprise_migrations::replay`]).
pub(crate) fn render_named(event: &Value, renew: Option<&Fresh>) -> Bytes {
    let kind = event
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match renew {
        Some(fresh) if kind == "message_start" && event.pointer("/message/id").is_some() => {
            let mut event = event.clone();
            event["message"]["id"] = json!(fresh.id);
            Bytes::from(format!("event: {kind}\ndata: {event}\n\n"))
        }
        _ => Bytes::from(format!("event: {kind}\ndata: {event}\n\n")),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::choices::tests::chunks;

    fn assemble(route: Route, events: &[Value]) -> Value {
        crate::api::of(route).assemble(events)
    }

    fn rechunk(route: Route, body: &Value, decode_ms: f64) -> Vec<StoredEvent> {
        crate::api::of(route).rechunk(body, decode_ms)
    }
    use crate::entry::StoredEvent;

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

    /// Today's rendering before schema v3, from the decoded entry: the reference a replay's bytes
    /// must equal (fresh identity apart, which both take from the same `Fresh`).
    mod oracle {
        use super::super::*;
        use crate::entry::Entry;

        /// The SSE events of a hit with their send offsets (ms after the first), `[DONE]` not included.
        pub(super) fn stream_events(
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
        pub(super) fn synthesized_usage(entry: &Entry, fresh: &Fresh) -> Option<Bytes> {
            let usage = entry.usage.as_ref()?;
            let mut chunk = template_chunk(entry, fresh);
            chunk["choices"] = json!([]);
            chunk["usage"] = usage.clone();
            Some(Bytes::from(format!("data: {chunk}\n\n")))
        }

        /// For instant replay: how many stored events go out first (up to and including the first one with
        /// content), so the first token leaves before the rest of a long answer is rendered.
        pub(super) fn head_len(entry: &Entry) -> usize {
            entry
                .events
                .iter()
                .position(|e| crate::sse::chunk_tokens(&e.data) > 0)
                .map_or(entry.events.len(), |p| p + 1)
        }

        /// Renders stored events `from..to` for an instant replay, with the synthesized usage chunk after
        /// the last one when the client asked for usage and the stream recorded none.
        pub(super) fn render_range(
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

        pub(super) fn template_chunk(entry: &Entry, fresh: &Fresh) -> Value {
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
        pub(super) fn body(entry: &Entry, fresh: &Fresh) -> Bytes {
            let mut body = entry.body.clone();
            refresh_identity(&mut body, fresh);
            Bytes::from(body.to_string())
        }
    }

    use crate::entry::Entry;

    fn stored(route: Route, events: Vec<Value>, body: Value, usage: Option<Value>) -> Entry {
        Entry {
            id: crate::entry::EntryId(1),
            key: crate::key::CacheKey([0; 32]),
            partition: crate::key::PartitionKey([0; 32]),
            summary: crate::entry::RequestSummary {
                route: route.name().into(),
                model: "m".into(),
                namespace: None,
                tenant: "t".into(),
                prompt: "p".into(),
                stream: true,
            },
            events: events
                .into_iter()
                .enumerate()
                .map(|(i, data)| StoredEvent {
                    offset_ms: 7.5 * i as f64,
                    data,
                })
                .collect(),
            usage,
            body,
            phases: crate::timing::Phases::default(),
            created_at_ms: 0,
            ttl_ms: 1,
            hit_count: 0,
            last_hit_ms: 0,
            vector: None,
            hit_history: Vec::new(),
            warmed: false,
        }
    }

    /// Stored answers of every shape a hit replays: chat and completions, streamed (with and
    /// without a recorded usage chunk, with `usage: null` on each chunk) and re-chunked from a
    /// body, tool calls, a system fingerprint, embeddings.
    fn answers() -> Vec<Entry> {
        let with_usage_chunk = chunks();
        let body = assemble(Route::ChatCompletions, &with_usage_chunk);
        let usage = body.get("usage").cloned();
        let mut out = vec![
            stored(
                Route::ChatCompletions,
                with_usage_chunk.clone(),
                body.clone(),
                usage.clone(),
            ),
            stored(
                Route::ChatCompletions,
                with_usage_chunk[..4].to_vec(),
                body.clone(),
                usage.clone(),
            ),
            stored(
                Route::ChatCompletions,
                with_usage_chunk[..4].to_vec(),
                body.clone(),
                None,
            ),
        ];
        let nulls: Vec<Value> = with_usage_chunk
            .iter()
            .map(|c| {
                let mut c = c.clone();
                c["system_fingerprint"] = json!("fp_1");
                c.as_object_mut()
                    .map(|o| o.entry("usage").or_insert(Value::Null));
                c
            })
            .collect();
        let nulls_body = assemble(Route::ChatCompletions, &nulls);
        out.push(stored(
            Route::ChatCompletions,
            nulls.clone(),
            nulls_body,
            usage.clone(),
        ));
        let tool = json!({"id": "t1", "object": "chat.completion", "created": 9, "model": "m", "system_fingerprint": "fp",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get", "arguments": "{\"q\": \"\\u0001 \u{e9}\"}"}}]}, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
        let data =
            |events: Vec<StoredEvent>| events.into_iter().map(|e| e.data).collect::<Vec<_>>();
        out.push(stored(
            Route::ChatCompletions,
            data(rechunk(Route::ChatCompletions, &tool, 40.0)),
            tool.clone(),
            tool.get("usage").cloned(),
        ));
        let text = json!({"id": "cmpl-1", "object": "text_completion", "created": 9, "model": "m",
            "choices": [{"text": "Once upon  a time", "index": 0, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}});
        let text_events = data(rechunk(Route::Completions, &text, 12.0));
        out.push(stored(
            Route::Completions,
            text_events.clone(),
            text.clone(),
            text.get("usage").cloned(),
        ));
        // A completions stream that recorded no usage chunk: the usage one is synthesized.
        let no_usage: Vec<Value> = text_events
            .into_iter()
            .filter(|c| !is_usage_chunk(c))
            .collect();
        out.push(stored(
            Route::Completions,
            no_usage,
            text.clone(),
            text.get("usage").cloned(),
        ));
        let embedding = json!({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -1.25e-7]}], "model": "e", "usage": {"prompt_tokens": 2, "total_tokens": 2}});
        out.push(stored(Route::Embeddings, Vec::new(), embedding, None));
        out
    }

    #[test]
    fn a_replay_renders_byte_for_byte_what_the_decoded_entry_rendered() {
        let fresh = Fresh::new(Route::ChatCompletions);
        let filled = Filled::of(&fresh);
        for (n, entry) in answers().into_iter().enumerate() {
            // Through its stored form, as a hit reads it.
            let replay = Replay::decode(&Replay::of(&entry).encode()).expect("decode");
            assert_eq!(
                body(&replay, &filled),
                oracle::body(&entry, &fresh),
                "answer {n}: body"
            );
            assert_eq!(head_len(&replay), oracle::head_len(&entry), "answer {n}");
            for include_usage in [false, true] {
                for pacing in [
                    Pacing::Instant,
                    Pacing::Recorded,
                    Pacing::TokensPerSecond(33.0),
                ] {
                    assert_eq!(
                        stream_events(&replay, &filled, include_usage, pacing),
                        oracle::stream_events(&entry, &fresh, include_usage, pacing),
                        "answer {n}, include_usage {include_usage}, {pacing:?}"
                    );
                }
                let (len, split) = (entry.events.len(), head_len(&replay));
                for (from, to) in [(0, split), (split, len), (0, len)] {
                    let mut ours = Vec::new();
                    render_range(&replay, &filled, include_usage, from, to, &mut ours);
                    assert_eq!(
                        String::from_utf8_lossy(&ours),
                        String::from_utf8_lossy(&oracle::render_range(
                            &entry,
                            &fresh,
                            include_usage,
                            from,
                            to
                        )),
                        "answer {n}, include_usage {include_usage}, events {from}..{to}"
                    );
                }
            }
        }
    }

    /// What `render` sends for a streamed hit, the timing comment left out.
    async fn sent(replay: Replay, include_usage: bool, pacing: Pacing) -> (String, Fresh) {
        let fresh = Fresh::new(Route::ChatCompletions);
        let mut clock = PhaseClock::start(Instant::now());
        let (source, content_type) = render(
            Arc::new(replay),
            &fresh,
            true,
            include_usage,
            pacing,
            &mut clock,
        );
        assert_eq!(content_type, "text/event-stream; charset=utf-8");
        assert!(clock.first_token.is_some());
        let Source::Replay(stream) = source else {
            panic!("a streamed hit is a replay");
        };
        let bytes: Vec<u8> = stream.collect::<Vec<_>>().await.concat();
        let text = String::from_utf8(bytes).expect("utf-8");
        let without_comment: String = text
            .split_inclusive('\n')
            .filter(|l| !l.starts_with(": reprise-timing"))
            .collect();
        (without_comment, fresh)
    }

    #[tokio::test]
    async fn a_streamed_hit_sends_the_old_events_then_done_whatever_the_pacing() {
        for entry in answers().into_iter().filter(|e| !e.events.is_empty()) {
            for include_usage in [false, true] {
                for pacing in [Pacing::Instant, Pacing::TokensPerSecond(1e6)] {
                    let (text, fresh) = sent(Replay::of(&entry), include_usage, pacing).await;
                    let want: Vec<u8> =
                        oracle::stream_events(&entry, &fresh, include_usage, pacing)
                            .into_iter()
                            .flat_map(|(_, b)| b.to_vec())
                            .chain(b"data: [DONE]\n\n".iter().copied())
                            .collect();
                    assert_eq!(text, String::from_utf8_lossy(&want));
                    assert!(text.contains(&fresh.id));
                }
            }
        }
    }

    #[test]
    fn usage_recorded_only_in_the_body_is_synthesized_when_asked_for() {
        let entry = &answers()[1];
        let fresh = Fresh {
            id: "x".into(),
            created: 2,
        };
        let replay = Replay::of(entry);
        let filled = Filled::of(&fresh);
        // Role chunk and first content chunk go first.
        assert_eq!(head_len(&replay), 2);
        for include_usage in [false, true] {
            let mut all = Vec::new();
            render_range(
                &replay,
                &filled,
                include_usage,
                0,
                entry.events.len(),
                &mut all,
            );
            assert_eq!(
                String::from_utf8_lossy(&all).contains("completion_tokens"),
                include_usage
            );
        }
    }
}
