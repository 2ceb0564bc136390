//! Forward, the upstream stage: send the request over a pooled connection, wait for the first event,
//! then relay the answer to the client (streamed event by event, or as one body) while timing it.
//!
//! The relay never rewrites the upstream's events. It only adds one SSE comment with the timings
//! just before `data: [DONE]` (after `response.completed` on the Responses API, where the stream
//! ends at that event), and, when the upstream fails after the stream has begun (cut, malformed
//! event, idle timeout), one OpenAI-shaped `error` event so that SDKs raise instead of hanging.
//! Redirects are never followed (a `3xx` is the upstream's answer, relayed and never cached), and a
//! failed exchange is named by what happened: no connection, no answer in time, or broken HTTP.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::time::timeout_at;

use crate::cache::Recorder;
use crate::cors::Asker;
use crate::downstream::Source;
use crate::error::{ErrorShape, GatewayError};
use crate::ingress::{Ingress, Provider, PASSTHROUGH};
use crate::outcome::{CacheOutcome, Completion};
use crate::pipeline::Exchange;
use crate::record::{
    set_cache_outcome, set_own_request_id, set_request_id, Finisher, Nearest, RecordMeta,
};
use crate::sse::{classify, EventKind, SseFramer};
use crate::state::AppState;
use crate::timing::unix_ms;
use crate::timing::PhaseClock;
use crate::upstream::{connection_named, error_chain, TimedBody, HOP_BY_HOP};

/// An upstream exchange that has begun: its response head arrived and, for an event stream, its
/// first whole event. Nothing has reached the client yet.
pub(crate) struct Started {
    response_status: reqwest::StatusCode,
    headers: HeaderMap,
    body: Body,
    /// When the client library took the request body for the socket (ends `upstream_send`).
    sent: Option<Instant>,
    head: Instant,
}

enum Body {
    /// A successful event stream, with the events read so far.
    Events {
        upstream: futures_util::stream::BoxStream<'static, Result<Bytes, reqwest::Error>>,
        framer: SseFramer,
        first_events: Vec<Bytes>,
        first_at: Instant,
    },
    /// Anything else, read whole by the relay.
    Whole(reqwest::Response),
}

/// A request ready to go upstream: built from the exchange, owned, so that it can be sent while the
/// exchange itself is still being worked on (a semantic search racing it).
pub(crate) struct Outgoing {
    request: reqwest::RequestBuilder,
    taken: Arc<OnceLock<Instant>>,
}

/// Builds the upstream request of a parsed JSON request: its raw body, unchanged, and the client's
/// headers as [`crate::upstream::Upstream::outgoing_headers`] passes them on.
pub(crate) fn prepare(state: &AppState, ex: &Exchange) -> Outgoing {
    let ingress = &ex.ingress;
    let upstream = &state.upstream;
    let taken = Arc::new(OnceLock::new());
    let body = reqwest::Body::wrap(TimedBody {
        data: Some(ingress.raw.clone()),
        taken: taken.clone(),
    });
    let mut headers = upstream.outgoing_headers(&ingress.headers, true, ingress.route.provider());
    if let Some(trace) = &ex.trace {
        trace.inject(&mut headers);
    }
    let request = upstream
        .client
        .post(upstream.url(
            ingress.route.provider(),
            ingress.route.upstream_path(),
            ingress.query.as_deref(),
        ))
        .headers(headers)
        .body(body);
    Outgoing { request, taken }
}

/// Sends a request upstream and waits for its first byte: the response head, and for a successful
/// event stream its first whole event, within the first-byte deadline. Dropping the future cancels
/// the upstream request (a semantic hit found meanwhile does that).
pub(crate) async fn start(state: &AppState, outgoing: Outgoing) -> Result<Started, GatewayError> {
    let Outgoing { request, taken } = outgoing;
    let upstream = &state.upstream;
    let deadline = tokio::time::Instant::now() + upstream.first_byte_timeout;
    let response = upstream.send(request, deadline).await?;
    let head = Instant::now();
    let status = response.status();
    let headers = relayed_headers(response.headers());
    let is_sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    let body = if status.is_success() && is_sse {
        let mut upstream_body = response.bytes_stream().boxed();
        let mut framer = SseFramer::new();
        let first_events = first_events(state, &mut upstream_body, &mut framer, deadline).await?;
        Body::Events {
            upstream: upstream_body,
            framer,
            first_events,
            first_at: Instant::now(),
        }
    } else {
        Body::Whole(response)
    };
    Ok(Started {
        response_status: status,
        headers,
        body,
        sent: taken.get().copied(),
        head,
    })
}

/// Reads a stream until its first whole event, within the first-byte deadline: until then a failure
/// can still be a proper HTTP error.
async fn first_events(
    state: &AppState,
    upstream: &mut futures_util::stream::BoxStream<'static, Result<Bytes, reqwest::Error>>,
    framer: &mut SseFramer,
    deadline: tokio::time::Instant,
) -> Result<Vec<Bytes>, GatewayError> {
    loop {
        match timeout_at(deadline, upstream.next()).await {
            Ok(Some(Ok(chunk))) => {
                let events = framer.push(&chunk);
                if !events.is_empty() {
                    return Ok(events);
                }
            }
            Ok(Some(Err(err))) => {
                return Err(GatewayError::UpstreamProtocol {
                    reason: "the stream broke off before its first event",
                    detail: error_chain(&err),
                })
            }
            Ok(None) => {
                return Err(GatewayError::UpstreamProtocol {
                    reason: "the stream ended before its first event",
                    detail: String::new(),
                })
            }
            Err(_) => return Err(state.upstream.timeout_error()),
        }
    }
}

/// The forward stage of a miss: relays what [`start`] began (the body, or the event stream from a
/// tracked task), timing it; `recorder` stores the answer when it ends cleanly.
pub(crate) async fn relay(
    state: &AppState,
    ex: Exchange,
    started: Result<Started, GatewayError>,
    recorder: Option<Recorder>,
) -> Response {
    let meta = ex.record(if ex.misses.cors_unknown {
        CacheOutcome::Miss
    } else {
        ex.policy.miss_outcome()
    });
    let route = ex.route();
    let shape = route.provider().error_shape();
    if let (Ok(started), Some(browser)) = (&started, &ex.browser) {
        let success = started.response_status.is_success();
        state
            .upstream
            .cors
            .learn(browser, success, &started.headers);
    }
    let Exchange {
        id: request_id,
        ingress: Ingress { mut clock, .. },
        cors,
        ..
    } = ex;
    let fail = |meta, clock, err| {
        fail_before_response(state, meta, clock, err, shape, &request_id, cors.as_ref())
    };
    let started = match started {
        Ok(s) => s,
        Err(err) => {
            if let Some(r) = recorder {
                r.abandon();
            }
            return fail(meta, clock, err);
        }
    };
    clock.upstream_head = Some(started.head);
    clock.upstream_sent = started.sent.or(clock.upstream_head);
    let status = started.response_status;
    let recorder = recorder.filter(|_| status == reqwest::StatusCode::OK);
    match started.body {
        Body::Events {
            upstream,
            framer,
            first_events,
            first_at,
        } => {
            clock.last_upstream_byte = Some(first_at);
            let stream = Stream {
                api: crate::api::of(route),
                status,
                headers: started.headers,
                upstream,
                framer,
                first_events,
            };
            relay_stream(state, meta, clock, stream, request_id, recorder)
        }
        Body::Whole(response) => {
            relay_whole(
                state,
                meta,
                clock,
                started.headers,
                response,
                request_id,
                recorder,
                shape,
                cors,
            )
            .await
        }
    }
}

/// Builds the response for an error raised before anything was sent to the client, with the CORS
/// answer the upstream gave its asker, and records it.
fn fail_before_response(
    state: &AppState,
    mut meta: RecordMeta,
    clock: PhaseClock,
    err: GatewayError,
    shape: ErrorShape,
    request_id: &str,
    cors: Option<&crate::cors::Answer>,
) -> Response {
    let cache = meta.cache;
    meta.error = Some(err.code());
    meta.finish(
        &state.requests,
        err.status_for(shape).as_u16(),
        Completion::GatewayError,
        &clock,
    );
    let mut response = err.into_response_for(shape);
    set_own_request_id(response.headers_mut(), request_id, shape);
    set_cache_outcome(response.headers_mut(), cache);
    crate::cors::apply(cors, response.headers_mut());
    response
}

/// Response headers of the upstream that the client should see.
fn relayed_headers(upstream: &HeaderMap) -> HeaderMap {
    let named = connection_named(upstream);
    let mut out = HeaderMap::with_capacity(upstream.len() + 2);
    for (name, value) in upstream {
        let n = name.as_str();
        if HOP_BY_HOP.contains(&n) || named.contains(name) || n == "content-length" {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

/// A non-streaming answer (or any non-2xx one): read it whole, then send it with `Server-Timing`.
#[allow(
    clippy::too_many_arguments,
    reason = "each is one part of the exchange, taken apart by `relay`; a struct would only rename them"
)]
async fn relay_whole(
    state: &AppState,
    mut meta: RecordMeta,
    mut clock: PhaseClock,
    mut headers: HeaderMap,
    response: reqwest::Response,
    request_id: String,
    recorder: Option<Recorder>,
    shape: ErrorShape,
    cors: Option<crate::cors::Answer>,
) -> Response {
    let fail = |meta, clock, err| {
        fail_before_response(state, meta, clock, err, shape, &request_id, cors.as_ref())
    };
    let status = response.status();
    let mut stream = response.bytes_stream();
    let mut body = Vec::new();
    let idle = state.upstream.idle_timeout;
    loop {
        match tokio::time::timeout(idle, stream.next()).await {
            Ok(Some(Ok(chunk))) => {
                let now = Instant::now();
                clock.first_token.get_or_insert(now);
                clock.last_token = Some(now);
                body.extend_from_slice(&chunk);
            }
            Ok(None) => break,
            Ok(Some(Err(err))) => {
                // A truncated or malformed body: the upstream's HTTP broke, not a stream's events.
                let err = state.upstream.error_for(&err, idle);
                if let Some(r) = recorder {
                    r.abandon();
                }
                return fail(meta, clock, err);
            }
            Err(_) => {
                let err = GatewayError::UpstreamTimeout {
                    timeout_ms: idle.as_millis() as u64,
                };
                if let Some(r) = recorder {
                    r.abandon();
                }
                return fail(meta, clock, err);
            }
        }
    }
    let now = Instant::now();
    clock.last_upstream_byte = Some(now);
    if clock.first_token.is_none() {
        // An empty body still has a moment it was complete.
        clock.first_token = Some(now);
        clock.last_token = Some(now);
    }
    clock.usage_tokens = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v.pointer("/usage/completion_tokens")
                .or_else(|| v.pointer("/usage/output_tokens"))
                .and_then(|t| t.as_u64())
        });
    let phases = clock.phases(now);
    if let Ok(value) = HeaderValue::from_str(&phases.server_timing()) {
        headers.insert(HeaderName::from_static("server-timing"), value);
    }
    set_request_id(&mut headers, &request_id);
    set_cache_outcome(&mut headers, meta.cache);
    if let Some(recorder) = recorder {
        // The answer is complete here; whether it is stored must not depend on the client reading it.
        meta.store_skipped = recorder.finish_body(&body, phases);
    }
    if let Some(reason) = meta.store_skipped {
        set_store_skipped(&mut headers, reason);
    }
    let completion = if status.is_success() {
        Completion::Complete
    } else {
        Completion::UpstreamError
    };
    let body = Finisher::new(state.requests.clone(), meta, status.as_u16()).body(
        Source::Once(Some(Bytes::from(body))),
        clock,
        completion,
        Completion::ClientDisconnected,
    );
    let mut out = Response::new(body);
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// Says on a response whose answer arrived whole that it was relayed but not stored, and why
/// (`x-reprise-store: skipped; reason=too_large`). A stream's headers leave before its size is
/// known: its record says so instead.
fn set_store_skipped(headers: &mut HeaderMap, reason: &str) {
    if let Ok(value) = HeaderValue::from_str(&format!("skipped; reason={reason}")) {
        headers.insert(HeaderName::from_static("x-reprise-store"), value);
    }
}

/// A successful event stream whose first event arrived: commit to the status and pump the rest from
/// a tracked task, so the client's first byte leaves as soon as the upstream's first event arrives.
fn relay_stream(
    state: &AppState,
    meta: RecordMeta,
    clock: PhaseClock,
    stream: Stream,
    request_id: String,
    recorder: Option<Recorder>,
) -> Response {
    let Stream {
        api,
        status,
        mut headers,
        upstream,
        framer,
        first_events,
    } = stream;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let (body, delivered) = Finisher::channel(rx);
    let keep_reading = recorder
        .as_ref()
        .is_some_and(|r| r.cache.settings.complete_on_disconnect);
    let disconnect_budget = recorder.as_ref().map_or(Duration::ZERO, |r| {
        Duration::from_millis(r.cache.settings.disconnect_budget_ms)
    });
    let pump = Pump {
        api,
        clock,
        framer,
        tx,
        idle_timeout: state.upstream.idle_timeout,
        saw_done: false,
        saw_finish: false,
        error_events: Vec::new(),
        last_chunk: None,
        invalid_utf8: false,
        failure: None,
        client_gone: false,
        recorder,
        keep_reading,
        disconnect_budget,
        gone_at: None,
    };
    let meta_cache = meta.cache;
    let idle_timeout = state.upstream.idle_timeout;
    let mut finisher = Finisher::new(state.requests.clone(), meta, status.as_u16());
    state.tasks.spawn(async move {
        let (clock, completion, store_skipped) = pump.run(first_events, upstream).await;
        finisher.meta.store_skipped = store_skipped;
        // A client that took nothing for the idle timeout after the last chunk has gone.
        finisher
            .after(delivered, Some(idle_timeout), clock, completion)
            .await;
    });

    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    set_request_id(&mut headers, &request_id);
    set_cache_outcome(&mut headers, meta_cache);
    let mut out = Response::new(body);
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// A successful upstream event stream, its first events read.
struct Stream {
    /// The route's adapter, which reads its events for the relay.
    api: &'static dyn crate::api::Api,
    status: reqwest::StatusCode,
    headers: HeaderMap,
    upstream: futures_util::stream::BoxStream<'static, Result<Bytes, reqwest::Error>>,
    framer: SseFramer,
    first_events: Vec<Bytes>,
}

/// The most error-event bytes kept for a stream's followers.
const MAX_ERROR_EVENTS_BYTES: usize = 64 * 1024;

/// The task that reads the upstream stream and feeds the client's channel.
struct Pump {
    /// The route's adapter: how this API's events read (tokens, usage, the clean end).
    api: &'static dyn crate::api::Api,
    clock: PhaseClock,
    framer: SseFramer,
    tx: mpsc::Sender<Bytes>,
    idle_timeout: Duration,
    saw_done: bool,
    saw_finish: bool,
    /// The error events of the client's stream, as sent: the upstream's, and the gateway's own
    /// when the upstream failed. Followers of this stream end theirs with them too.
    error_events: Vec<u8>,
    /// The last chunk relayed, whose number an error event of a numbered stream follows.
    last_chunk: Option<Bytes>,
    /// An event was not valid UTF-8: relayed as it came, but never stored (parsing it for the
    /// recording would replace the bad bytes and store an answer the upstream never sent).
    invalid_utf8: bool,
    failure: Option<GatewayError>,
    client_gone: bool,
    recorder: Option<Recorder>,
    /// After the client left, keep reading (to cache the answer) for at most `disconnect_budget`.
    keep_reading: bool,
    disconnect_budget: Duration,
    gone_at: Option<Instant>,
}

impl Pump {
    async fn run(
        mut self,
        first_events: Vec<Bytes>,
        mut upstream: futures_util::stream::BoxStream<'static, Result<Bytes, reqwest::Error>>,
    ) -> (PhaseClock, Completion, Option<&'static str>) {
        let mut more = self.handle(first_events).await;
        while more {
            let wait = match self.gone_at {
                Some(gone) => {
                    let left = self.disconnect_budget.saturating_sub(gone.elapsed());
                    // Checked here, not only by the timeout below: tokio polls the stream before
                    // the timer, so an upstream that always has a chunk ready would never let
                    // the budget fire, and a client that left would hold the upstream forever.
                    if left.is_zero() {
                        self.failure = Some(GatewayError::UpstreamTimeout {
                            timeout_ms: self.disconnect_budget.as_millis() as u64,
                        });
                        break;
                    }
                    self.idle_timeout.min(left)
                }
                None => self.idle_timeout,
            };
            match tokio::time::timeout(wait, upstream.next()).await {
                Ok(Some(Ok(chunk))) => {
                    self.clock.last_upstream_byte = Some(Instant::now());
                    let events = self.framer.push(&chunk);
                    more = self.handle(events).await;
                }
                Ok(None) => break,
                Ok(Some(Err(err))) => {
                    self.failure = Some(GatewayError::UpstreamProtocol {
                        reason: "the stream broke off",
                        detail: error_chain(&err),
                    });
                    break;
                }
                Err(_) => {
                    self.failure = Some(GatewayError::UpstreamTimeout {
                        timeout_ms: wait.as_millis() as u64,
                    });
                    break;
                }
            }
        }
        // Stop reading the upstream now: dropping it closes that request.
        drop(upstream);
        // A client that left gets nothing more; its followers then learn only that the stream
        // they read was dropped, not an upstream failure that did not happen.
        if !self.client_gone {
            self.close_stream().await;
        }
        let clean = self.failure.is_none()
            && self.error_events.is_empty()
            && !self.invalid_utf8
            && (self.saw_done || self.saw_finish)
            && self.framer.remainder().iter().all(u8::is_ascii_whitespace);
        let mut store_skipped = None;
        if let Some(recorder) = self.recorder.take() {
            if clean {
                store_skipped = recorder.finish_stream(self.clock.phases(Instant::now()));
            } else {
                let sent = (!self.error_events.is_empty()).then(|| self.error_events.clone());
                recorder.fail(sent.map(Bytes::from));
            }
        }
        let completion = if self.client_gone {
            Completion::ClientDisconnected
        } else if self.failure.is_some() || !self.error_events.is_empty() {
            Completion::StreamFailed
        } else {
            Completion::Complete
        };
        let Self { clock, tx, .. } = self;
        drop(tx);
        if let Some(first) = clock.first_token {
            tracing::debug!(ttft_ms = ?clock.upstream_sent.map(|s| first - s), "stream relayed");
        }
        (clock, completion, store_skipped)
    }

    /// Relays events; returns false when the stream should stop being read.
    async fn handle(&mut self, events: Vec<Bytes>) -> bool {
        for event in events {
            let now = Instant::now();
            self.invalid_utf8 |= std::str::from_utf8(&event).is_err();
            // A stream of named events ends with its finishing event (`response.completed` or
            // `.incomplete` on the Responses API, `message_stop` on Anthropic's).
            let mut last_event = false;
            let outgoing = match self.api.stream_event(classify(&event)) {
                EventKind::Chunk {
                    tokens,
                    finish_reason,
                    usage,
                    ..
                } => {
                    last_event = finish_reason.is_some() && self.api.route().framing().named_events;
                    if let Some(recorder) = &mut self.recorder {
                        recorder.chunk(now, &event);
                    }
                    self.last_chunk = Some(event.clone());
                    self.clock.tokens(now, tokens);
                    self.saw_finish |= finish_reason.is_some();
                    // `output_tokens` on the Responses API.
                    if let Some(t) = usage.and_then(|u| {
                        u.get("completion_tokens")
                            .or_else(|| u.get("output_tokens"))
                            .and_then(|t| t.as_u64())
                    }) {
                        self.clock.usage_tokens = Some(t);
                    }
                    event
                }
                EventKind::Done => {
                    self.saw_done = true;
                    let mut with_timing = self.clock.phases(now).sse_comment().to_vec();
                    with_timing.extend_from_slice(&event);
                    Bytes::from(with_timing)
                }
                EventKind::Error(_) => {
                    // An upstream that goes on sending them is still relayed; followers get the
                    // first 64 KiB.
                    if self.error_events.len() < MAX_ERROR_EVENTS_BYTES {
                        self.error_events.extend_from_slice(&event);
                    }
                    event
                }
                EventKind::NoData => event,
                EventKind::Malformed(data) => {
                    let preview: String = data.chars().take(80).collect();
                    self.failure = Some(GatewayError::UpstreamProtocol {
                        reason: "a stream event was not valid JSON",
                        detail: format!("malformed event data `{preview}`"),
                    });
                    return false;
                }
            };
            if !self.client_gone && self.tx.send(outgoing).await.is_err() {
                self.client_gone = true;
                self.gone_at = Some(Instant::now());
                if !self.keep_reading {
                    return false;
                }
                tracing::debug!("client left mid-stream; reading on to cache the answer");
            }
            if self.saw_done || last_event {
                return false;
            }
        }
        true
    }

    /// Ends the client's stream: an error event if the upstream failed (kept with the upstream's
    /// own, for the followers), else the timing comment when the upstream ended without `[DONE]`
    /// (it was already sent before `[DONE]` otherwise).
    async fn close_stream(&mut self) {
        if self.failure.is_none()
            && !self.saw_done
            && !self.saw_finish
            && self.error_events.is_empty()
        {
            self.failure = Some(GatewayError::UpstreamProtocol {
                reason: "the stream ended before completion",
                detail: "no finish_reason, no [DONE] and no response.completed".to_owned(),
            });
        }
        let tail = if let Some(failure) = &self.failure {
            failure.log();
            let last = self
                .last_chunk
                .as_deref()
                .and_then(crate::cache::tape::chunk_of);
            let event = self.api.stream_error(failure, last.as_ref());
            self.error_events.extend_from_slice(&event);
            event
        } else if !self.saw_done {
            let mut comment = self.clock.phases(Instant::now()).sse_comment().to_vec();
            comment.push(b'\n');
            Bytes::from(comment)
        } else {
            return;
        };
        if self.tx.send(tail).await.is_err() {
            self.client_gone = true;
        }
    }
}

/// Any other `/v1/*` route: method, path, query, headers and body pass through as they are,
/// streamed both ways.
pub(crate) async fn passthrough(
    state: &AppState,
    request: Request,
    request_id: String,
) -> Response {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let below_v1 = path.strip_prefix("/v1").unwrap_or(path);
    let provider = Provider::of_request(below_v1, &parts.headers);
    let mut clock = PhaseClock::start(started);
    clock.body_read = Some(started);
    let meta = RecordMeta {
        id: request_id.clone(),
        started_at_ms: unix_ms(),
        method: parts.method.to_string(),
        route: PASSTHROUGH.to_owned(),
        model: None,
        stream: false,
        cache: CacheOutcome::Pass,
        served: None,
        nearest: Nearest::default(),
        error: None,
        store_skipped: None,
        trace: state
            .otel
            .as_ref()
            .map(|otel| otel.begin(&parts.headers, "/v1/{*rest}".to_owned())),
        namespace: None,
    };
    let upstream = &state.upstream;
    let mut headers = upstream.outgoing_headers(&parts.headers, false, provider);
    if let Some(trace) = &meta.trace {
        trace.inject(&mut headers);
    }
    let method =
        reqwest::Method::from_bytes(parts.method.as_str().as_bytes()).unwrap_or(Method::GET);
    // A request without a body (a `DELETE`, a bodyless `POST .../cancel`) is sent without one: a
    // stream body would go out chunked, which it was not, and strict servers refuse a `DELETE`
    // with a body. Asked of the body itself, which also knows an HTTP/2 request's end.
    let has_body = !http_body::Body::is_end_stream(&body);
    // Without one, a method that carries a body still says its length is 0 (as a client sending
    // none over HTTP/2 or without `Content-Length` meant): servers that want a length refuse a
    // `POST` that gives none (411).
    let sized = headers.contains_key(header::CONTENT_LENGTH);
    if !has_body && !sized && matches!(parts.method, Method::POST | Method::PUT | Method::PATCH) {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    }
    let mut request = upstream
        .client
        .request(method, upstream.url(provider, below_v1, parts.uri.query()))
        .headers(headers);
    // A client whose body stalls makes the upstream send fail: that is the client's 408, not an
    // unreachable upstream.
    let stalled = Arc::new(OnceLock::new());
    if has_body {
        let seen = stalled.clone();
        let stream = futures_util::TryStreamExt::inspect_err(body.into_data_stream(), move |err| {
            if let Some(timeout) = crate::error::BodyTimeout::in_chain(err) {
                let _ = seen.set(timeout.timeout_ms);
            }
        });
        request = request.body(reqwest::Body::wrap_stream(stream));
    }
    let deadline = tokio::time::Instant::now() + upstream.first_byte_timeout;
    let response = match upstream.send(request, deadline).await {
        Ok(r) => r,
        Err(err) => {
            let err = match stalled.get() {
                Some(&timeout_ms) => GatewayError::RequestTimeout { timeout_ms },
                None => err,
            };
            let shape = provider.error_shape();
            let browser = Asker::of(provider, &parts.headers);
            let answer = browser.as_ref().and_then(|b| upstream.cors.answer(b));
            return fail_before_response(
                state,
                meta,
                clock,
                err,
                shape,
                &request_id,
                answer.as_ref(),
            );
        }
    };
    let now = Instant::now();
    clock.upstream_head = Some(now);
    clock.upstream_sent = Some(now);
    let status = response.status();
    let mut headers = relayed_headers(response.headers());
    // The body goes out byte for byte, so its length does too: a `HEAD`'s says what a `GET` would
    // carry, and a sized body would otherwise go out chunked.
    if let Some(length) = response.headers().get(header::CONTENT_LENGTH) {
        headers.insert(header::CONTENT_LENGTH, length.clone());
    }
    set_request_id(&mut headers, &request_id);
    let done = if status.is_success() {
        Completion::Complete
    } else {
        Completion::UpstreamError
    };
    let body = Finisher::new(state.requests.clone(), meta, status.as_u16())
        .relayed()
        .body(
            Source::Upstream(response.bytes_stream().boxed()),
            clock,
            done,
            Completion::StreamFailed,
        );
    let mut out = Response::new(body);
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Secret};
    use crate::upstream::Upstream;

    /// A client that left mid-stream frees the upstream within the disconnect budget even when the
    /// upstream always has a chunk ready: before, the budget was only a timeout on the next read,
    /// which tokio never fires while the read is ready, so the pump read on for as long as the
    /// upstream sent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_gone_clients_budget_ends_even_an_upstream_that_never_pauses() {
        let chunk = Bytes::from_static(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
        );
        let upstream = futures_util::stream::repeat_with(move || Ok(chunk.clone())).boxed();
        let (tx, rx) = mpsc::channel(1);
        drop(rx);
        let pump = Pump {
            api: &crate::api::chat::Chat,
            clock: PhaseClock::start(Instant::now()),
            framer: SseFramer::new(),
            tx,
            idle_timeout: Duration::from_secs(30),
            saw_done: false,
            saw_finish: false,
            error_events: Vec::new(),
            last_chunk: None,
            invalid_utf8: false,
            failure: None,
            client_gone: false,
            recorder: None,
            keep_reading: true,
            disconnect_budget: Duration::from_millis(50),
            gone_at: None,
        };
        #[allow(
            clippy::disallowed_methods,
            reason = "the test runs the pump on its own task to bound how long it may take"
        )]
        let running = tokio::spawn(pump.run(Vec::new(), upstream));
        let (_, completion, _) = tokio::time::timeout(Duration::from_secs(10), running)
            .await
            .expect("the pump stopped reading after its disconnect budget")
            .expect("pump task");
        assert_eq!(completion, Completion::ClientDisconnected);
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        map
    }

    #[test]
    fn connection_named_headers_stay_on_their_hop_both_ways() {
        let upstream = headers(&[
            ("connection", "close, X-Upstream-Hop"),
            ("connection", "x-other-hop"),
            ("x-upstream-hop", "1"),
            ("x-other-hop", "1"),
            ("x-request-id", "req-1"),
            ("content-length", "12"),
        ]);
        let relayed = relayed_headers(&upstream);
        let names: Vec<&str> = relayed.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["x-request-id"]);
    }

    #[test]
    fn outgoing_headers_have_one_content_type_and_no_client_credential() {
        let mut config = Config {
            upstream_api_key: Some(Secret::new("sk-gateway")),
            ..Config::default()
        };
        config.validate().expect("valid");
        let upstream = Upstream::new(&config).expect("upstream");
        let incoming = headers(&[
            ("content-type", "application/json; charset=utf-8"),
            ("content-length", "10"),
            ("authorization", "Bearer sk-client"),
            ("api-key", "client-azure"),
            ("x-api-key", "client-anthropic"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("x-reprise-cache", "no-store"),
            ("x-kept", "1"),
        ]);
        let out = upstream.outgoing_headers(&incoming, true, Provider::OpenAi);
        let all: Vec<(&str, &str)> = out
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap_or("?")))
            .collect();
        assert_eq!(
            out.get_all(header::CONTENT_TYPE).iter().count(),
            1,
            "{all:?}"
        );
        assert_eq!(out[header::CONTENT_TYPE], "application/json");
        assert_eq!(out[header::AUTHORIZATION], "Bearer sk-gateway");
        assert_eq!(out["api-key"], "sk-gateway");
        assert_eq!(out["x-api-key"], "sk-gateway");
        assert_eq!(out.get_all("x-api-key").iter().count(), 1);
        for gone in ["x-hop", "x-reprise-cache", "content-length", "connection"] {
            assert!(!out.contains_key(gone), "{gone}: {all:?}");
        }
        assert_eq!(out["x-kept"], "1");
        // Pass-through: the client's own framing stays; no `api-key` is invented.
        let plain = headers(&[("content-type", "text/plain"), ("content-length", "3")]);
        let out = upstream.outgoing_headers(&plain, false, Provider::OpenAi);
        assert_eq!(out[header::CONTENT_TYPE], "text/plain");
        assert_eq!(out[header::CONTENT_LENGTH], "3");
        assert!(!out.contains_key("api-key"));
        assert!(!out.contains_key("x-api-key"));
        // The gateway's key is the OpenAI upstream's: Anthropic gets the client's own.
        let out = upstream.outgoing_headers(&incoming, true, Provider::Anthropic);
        assert_eq!(out["x-api-key"], "client-anthropic");
        assert_eq!(out[header::AUTHORIZATION], "Bearer sk-client");
        assert!(!out.contains_key("x-reprise-cache"));
    }
}
