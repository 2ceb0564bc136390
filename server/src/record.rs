//! The last stage of every request: what happened and how long each phase took, kept in a bounded
//! in-memory log that `GET /admin/requests` reads; and the `x-reprise-*` response headers that name
//! a request, its outcome ([`CacheOutcome`], from the ground floor's `outcome.rs`) and what the
//! lookup found.
//!
//! Records carry no prompt, no response and no credential: only the route, model, outcome and timings.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::Response;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::downstream::{Delivered, Delivery, Source};
use crate::entry::EntryId;
use crate::error::{ErrorShape, GatewayError};
use crate::guard::Guard;
use crate::outcome::{CacheOutcome, Completion};
use crate::stats::Stats;
use crate::timing::{unix_ms, PhaseClock};

/// The record itself is the wire contract's (`GET /admin/requests`), shared with the client.
pub use reprise_wire::RequestRecord;

/// A bounded ring of recent requests (the oldest is dropped when full), and the counters every
/// finished request adds to.
pub struct RequestLog {
    pub stats: Stats,
    capacity: usize,
    records: Mutex<VecDeque<RequestRecord>>,
    next_id: AtomicU64,
    /// Random per process, so ids from two runs do not collide in someone's notes.
    prefix: u32,
}

impl RequestLog {
    pub fn new(capacity: usize) -> Self {
        let seed = blake3::hash(&unix_ms().to_le_bytes());
        let prefix = u32::from_le_bytes([
            seed.as_bytes()[0],
            seed.as_bytes()[1],
            seed.as_bytes()[2],
            seed.as_bytes()[3],
        ]);
        Self {
            stats: Stats::new(),
            capacity,
            records: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            next_id: AtomicU64::new(1),
            prefix,
        }
    }

    /// A fresh request id, also sent to the client as `x-reprise-request-id`.
    pub fn next_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("req_{:08x}{:08x}", self.prefix, n)
    }

    pub fn push(&self, record: RequestRecord) {
        self.stats.observe(&record);
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.len() == self.capacity {
            records.pop_front();
        }
        records.push_back(record);
    }

    /// Up to `limit` records, newest first.
    pub fn recent(&self, limit: usize) -> Vec<RequestRecord> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.iter().rev().take(limit).cloned().collect()
    }
}

/// What the record of a request needs besides its clock.
pub struct RecordMeta {
    pub id: String,
    pub started_at_ms: u64,
    pub method: String,
    pub route: String,
    pub model: Option<String>,
    pub stream: bool,
    pub cache: CacheOutcome,
    /// Set when an entry served the request.
    pub served: Option<Served>,
    /// What the semantic stage found on a miss.
    pub nearest: Nearest,
    /// `code` of the gateway's error response, if it sent one.
    pub error: Option<&'static str>,
    /// Why a clean answer was not stored (`too_large`).
    pub store_skipped: Option<&'static str>,
    /// The request's trace context when traces are exported; its spans are built at the end.
    pub trace: Option<crate::otel::RequestTrace>,
    /// The request's namespace (`x-reprise-namespace`).
    pub namespace: Option<String>,
}

/// The best semantic candidate of a miss: its similarity, and the guard that refused it; or why
/// semantic matching was skipped (`x-reprise-semantic`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Nearest {
    pub similarity: Option<f32>,
    /// The guard that refused a candidate at or above the similarity the search looked from (the
    /// threshold, or the judge's floor) and left the request without a match: the refusal that
    /// `guard_refusals` counts, named in `x-reprise-guard` and the record.
    pub guard: Option<Guard>,
    /// The guard that refuses the best candidate whatever its similarity (`x-reprise-nearest-guard`):
    /// what the evaluation's threshold sweep needs below the threshold, never counted as a refusal.
    pub nearest_guard: Option<Guard>,
    /// The fallback reason of a lookup that got no vector (`overload`, `deadline`, `failed`) or no
    /// search (`scan_busy`).
    pub skipped: Option<&'static str>,
}

/// What a hit adds to its record.
pub struct Served {
    pub entry: EntryId,
    pub similarity: Option<f32>,
    pub ttft_saved_ms: Option<f64>,
    /// The tokens (and money) the entry's answer cost upstream; `None` for a coalesced request,
    /// which waited for its leader's upstream call.
    pub saved: Option<reprise_wire::TokensSaved>,
}

impl RecordMeta {
    pub fn finish(self, log: &RequestLog, status: u16, completion: Completion, clock: &PhaseClock) {
        let record = RequestRecord {
            id: self.id,
            started_at_ms: self.started_at_ms,
            method: self.method,
            route: self.route,
            model: self.model,
            stream: self.stream,
            status,
            cache: self.cache,
            completion,
            phases: clock.phases(clock.delivered.unwrap_or_else(Instant::now)),
            entry: self.served.as_ref().map(|s| s.entry.to_string()),
            similarity: self.served.as_ref().and_then(|s| s.similarity),
            nearest: self.nearest.similarity,
            guard: self.nearest.guard.map(|g| g.name().to_owned()),
            semantic_skipped: self.nearest.skipped.map(str::to_owned),
            ttft_saved_ms: self.served.as_ref().and_then(|s| s.ttft_saved_ms),
            error: self.error.map(str::to_owned),
            store_skipped: self.store_skipped.map(str::to_owned),
            namespace: self.namespace,
            saved: self.served.and_then(|s| s.saved),
        };
        if let Some(trace) = self.trace {
            trace.end(&record, clock);
        }
        log.push(record);
    }
}

/// The one end of every response path that sends a body: the body goes to the client through
/// [`Finisher::body`] (or [`Finisher::channel`] for one a task feeds), and the request's record is
/// written once, when the client took the last byte or left, with the completion that follows from
/// how delivery ended. A response the gateway refuses before any body is recorded by
/// [`RecordMeta::finish`] directly.
pub(crate) struct Finisher {
    log: Arc<RequestLog>,
    /// What the record says besides its completion and clock; a path may still fill it in (a
    /// stream's `store_skipped` is known only at its end).
    pub(crate) meta: RecordMeta,
    status: u16,
    /// The body is the upstream's own, relayed as it arrives (a pass-through): the moment the
    /// client took its last byte is also when the upstream's last byte arrived.
    relayed: bool,
}

impl Finisher {
    pub(crate) fn new(log: Arc<RequestLog>, meta: RecordMeta, status: u16) -> Self {
        Self {
            log,
            meta,
            status,
            relayed: false,
        }
    }

    /// Marks the body as the upstream's own stream, relayed as it arrives.
    pub(crate) fn relayed(mut self) -> Self {
        self.relayed = true;
        self
    }

    /// The body of `source`; the request is recorded when its delivery ends: `done` when the client
    /// took it whole, `broken` when the source failed on the way, a disconnect when it was dropped.
    pub(crate) fn body(
        self,
        source: Source,
        mut clock: PhaseClock,
        done: Completion,
        broken: Completion,
    ) -> Body {
        Delivery::new(source, move |how| {
            let completion = self.settle(Some(how), done, broken, &mut clock);
            self.write(completion, &clock);
        })
        .into_body()
    }

    /// The body of a channel a task feeds (a stream pump, a follower), and the receiver of how its
    /// delivery ended, which the task hands to [`Finisher::after`] once it sent the last chunk.
    pub(crate) fn channel(rx: mpsc::Receiver<Bytes>) -> (Body, oneshot::Receiver<Delivered>) {
        let (tx, delivered) = oneshot::channel();
        let delivery = Delivery::new(Source::Channel(rx), move |how| {
            let _ = tx.send(how);
        });
        (delivery.into_body(), delivered)
    }

    /// Records the request once the channel's body ended: `done` when the client took it whole;
    /// a client that left, or one that took nothing within `wait`, is a disconnect.
    pub(crate) async fn after(
        self,
        delivered: oneshot::Receiver<Delivered>,
        wait: Option<Duration>,
        mut clock: PhaseClock,
        done: Completion,
    ) {
        let how = match wait {
            Some(wait) => tokio::time::timeout(wait, delivered).await.ok(),
            None => Some(delivered.await),
        }
        .and_then(Result::ok);
        let completion = self.settle(how, done, Completion::ClientDisconnected, &mut clock);
        self.write(completion, &clock);
    }

    fn settle(
        &self,
        how: Option<Delivered>,
        done: Completion,
        broken: Completion,
        clock: &mut PhaseClock,
    ) -> Completion {
        match how {
            Some(Delivered::Complete(at)) => {
                clock.delivered = Some(at);
                if self.relayed {
                    clock.last_upstream_byte = Some(at);
                }
                done
            }
            Some(Delivered::Failed) => broken,
            Some(Delivered::Dropped) | None => Completion::ClientDisconnected,
        }
    }

    fn write(self, completion: Completion, clock: &PhaseClock) {
        self.meta.finish(&self.log, self.status, completion, clock);
    }
}

/// Sets `x-reprise-request-id`, the key of the request's record in `/admin/requests`.
pub fn set_request_id(headers: &mut HeaderMap, request_id: &str) {
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.insert(HeaderName::from_static("x-reprise-request-id"), value);
    }
}

/// Names a response the gateway made itself (a hit, a follower, an error of its own) to the client's
/// SDK too: OpenAI's SDKs read a response's id from `x-request-id` and Anthropic's from
/// `request-id` (`_request_id`, and in their errors). A relayed response carries the upstream's
/// id there; this one carries the gateway's, the id `/admin/requests` and feedback know it by.
pub fn set_own_request_id(headers: &mut HeaderMap, request_id: &str, shape: ErrorShape) {
    set_request_id(headers, request_id);
    let name = match shape {
        ErrorShape::OpenAi => "x-request-id",
        ErrorShape::Anthropic => "request-id",
    };
    set_header(headers, name, request_id.to_owned());
}

/// Sets `x-reprise-cache`; pass-through routes, which the cache never sees, get none.
pub fn set_cache_outcome(headers: &mut HeaderMap, cache: CacheOutcome) {
    if cache != CacheOutcome::Pass {
        headers.insert(
            HeaderName::from_static("x-reprise-cache"),
            HeaderValue::from_static(cache.as_str()),
        );
    }
}

/// Sets a response header whose value the gateway formatted (a number, an id): one that is not a
/// valid header value is left out rather than failing the response.
pub fn set_header(headers: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// An error response in `shape` that still names its request.
pub fn error_response(err: GatewayError, shape: ErrorShape, request_id: &str) -> Response {
    let mut response = err.into_response_for(shape);
    set_own_request_id(response.headers_mut(), request_id, shape);
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::Phases;

    fn record(id: &str) -> RequestRecord {
        RequestRecord {
            id: id.into(),
            started_at_ms: 0,
            method: "POST".into(),
            route: "chat".into(),
            model: None,
            stream: false,
            status: 200,
            cache: CacheOutcome::Pass,
            completion: Completion::Complete,
            phases: Phases::default(),
            entry: None,
            similarity: None,
            nearest: None,
            guard: None,
            semantic_skipped: None,
            ttft_saved_ms: None,
            error: None,
            store_skipped: None,
            namespace: None,
            saved: None,
        }
    }

    #[test]
    fn keeps_the_newest_within_capacity() {
        let log = RequestLog::new(2);
        for id in ["a", "b", "c"] {
            log.push(record(id));
        }
        let ids: Vec<_> = log.recent(10).into_iter().map(|r| r.id).collect();
        assert_eq!(ids, ["c", "b"]);
        assert_eq!(log.recent(1).len(), 1);
        assert_ne!(log.next_id(), log.next_id());
    }
}
