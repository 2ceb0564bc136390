//! The client-facing HTTP server: accepts connections, serves HTTP/1.1 and h2c through the router,
//! and drops clients that stall. It knows nothing of routes or caching.
//!
//! `axum::serve` has no timeouts and no connection cap, so this is an accept loop over hyper-util's
//! connection builder with, per connection, a watcher task that enforces:
//! - the header timeout, from a new connection's accept or a request head's first byte until the
//!   head is complete (hyper's own `header_read_timeout` also runs while a keep-alive connection
//!   idles between requests, so it cannot tell a slow head from an idle connection); on HTTP/2,
//!   from accept until the first request's header block, and from a HEADERS frame's arrival until
//!   its END_HEADERS, open streams or not (a block in progress blocks the whole connection);
//! - the keep-alive timeout, how long a connection may sit idle between requests;
//! - the body timeout, inside the request body ([`BodyTimeout`](crate::error::BodyTimeout)
//!   becomes an OpenAI-shaped 408);
//! - the send timeout, how long a write may wait for room in the client's socket (a client that
//!   stopped reading). Closing the connection drops its response bodies, and a streaming miss's
//!   pump then sees its client gone and drops the upstream request (or reads on within the
//!   disconnect budget to cache the answer).
//!
//! A semaphore caps the connections served at once (by default from the open-file limit). At the
//! cap the loop closes, to make room, connections whose request head has been arriving for 500 ms
//! or more (a trickle meant to hold the slot), then idle keep-alive connections, as nginx does;
//! otherwise new connections wait in the kernel's backlog. All of it is counted and logged,
//! rate-limited.
//!
//! Every HTTP/1.1 request head is checked with httparse before hyper sees it: hyper answers a
//! malformed, too long or too large head itself with an empty-bodied 400, 414 or 431, so the
//! checks here are stricter than hyper's and answer first, in the OpenAI error shape. To find each
//! head the socket wrapper follows the messages as hyper does (Content-Length and chunked framing,
//! so pipelined requests and heads after a chunked body are checked too), and holds an incomplete
//! head back from hyper until it is whole. A refused head is replaced by a stand-in request that
//! hyper answers, in order after the requests before it, with the refusal and `connection: close`;
//! what the client sends after it is read and dropped. HTTP/2 connections have no heads to check.
//!
//! The head checks and the framing they follow are in `heads.rs`; the socket and body wrappers that
//! feed them and time the client are in `io.rs`.

mod heads;
mod io;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use axum::Router;
use http::{header, HeaderValue};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::config::Config;
use crate::error::GatewayError;
use crate::lock::lock;
use crate::stats::Stats;
use heads::{Messages, Plan, MAX_HEADER_FIELDS};
use io::{TimedBody, TrackedBody, WatchedIo};

/// Descriptors kept for everything but sockets: the store, the model, the runtime, the logs.
const RESERVED_FDS: u64 = 128;
/// The derived connection cap never goes below this, whatever the open-file limit.
const MIN_DERIVED_CONNECTIONS: usize = 16;
/// A connection must have been idle this long before it is closed to make room: a client that
/// just connected or just got its answer is most likely about to send a request.
const MIN_IDLE_TO_RECLAIM: Duration = Duration::from_millis(500);
/// Idle connections closed at once when accepting runs out of descriptors.
const EMFILE_RECLAIM: usize = 16;
/// At most one warning per this interval for the connection limit and for accept errors.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The client-side limits, resolved once at start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub send_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub max_connections: usize,
}

impl Limits {
    /// How often a connection's watcher looks at its phase. A deadline is a phase change plus a
    /// timeout of at least this period, so the last check before it comes after the change and
    /// sleeps until the deadline exactly.
    fn check_every(&self) -> Duration {
        self.header_timeout
            .min(self.keepalive_timeout)
            .min(self.send_timeout)
    }

    /// Takes the configured values; an unset `max_connections` is derived from the open-file limit.
    pub(crate) fn for_config(config: &Config) -> Self {
        let nofile = open_file_limit();
        let derived = derived_max_connections(nofile);
        let max_connections = match config.max_connections {
            Some(n) => {
                if n > derived {
                    tracing::warn!(
                        open_file_limit = nofile,
                        max_connections = n,
                        "max_connections leaves too few descriptors for upstream sockets and the \
                         store (at most {derived} would): accepting may fail under load"
                    );
                }
                n
            }
            None => {
                tracing::info!(
                    open_file_limit = nofile,
                    max_connections = derived,
                    "client connection cap derived from the open-file limit"
                );
                derived
            }
        };
        Self {
            header_timeout: config.client_header_timeout(),
            body_timeout: config.client_body_timeout(),
            send_timeout: config.client_send_timeout(),
            keepalive_timeout: config.keepalive_timeout(),
            max_connections,
        }
    }
}

/// Half of what is left after the reserve: every client connection may hold an upstream socket
/// too (nginx counts its `worker_connections` the same way).
pub(crate) fn derived_max_connections(nofile: u64) -> usize {
    let half = nofile.saturating_sub(RESERVED_FDS) / 2;
    usize::try_from(half)
        .unwrap_or(usize::MAX)
        .max(MIN_DERIVED_CONNECTIONS)
}

/// The soft open-file limit, first raised to the hard one (as Go's runtime does at start): the
/// soft default of 1024 is a relic, and the hard limit is what the operator actually allowed.
fn open_file_limit() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    // Linux refuses a soft limit above fs.nr_open, whose default is 2^20.
    const CEILING: u64 = 1 << 20;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    let wanted = hard.min(CEILING);
    if wanted > soft && setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).is_ok() {
        return wanted;
    }
    soft
}

/// Connection counters, registered in the gateway's Prometheus registry.
#[derive(Clone)]
pub(crate) struct ConnMetrics {
    open: IntGauge,
    closed: IntCounterVec,
    limit_waits: IntCounter,
}

impl ConnMetrics {
    pub(crate) fn new(stats: &Stats) -> Self {
        let metrics = Self {
            open: IntGauge::new("reprise_client_connections", "Client connections open now.")
                .unwrap_or_else(invalid_metric),
            closed: IntCounterVec::new(
                Opts::new(
                    "reprise_client_connections_closed_total",
                    "Client connections the gateway ended, by reason: header_timeout, \
                     body_timeout, send_timeout (the client stopped reading), keepalive_timeout, \
                     reclaimed (idle, at the connection limit), reclaimed_slow_head (its request \
                     head incomplete for 500 ms or more, at the connection limit), bad_request (a \
                     malformed, too long or too large request head).",
                ),
                &["reason"],
            )
            .unwrap_or_else(invalid_metric),
            limit_waits: IntCounter::new(
                "reprise_connection_limit_waits_total",
                "New connections accepted while at the connection limit.",
            )
            .unwrap_or_else(invalid_metric),
        };
        stats.register(Box::new(metrics.open.clone()));
        stats.register(Box::new(metrics.closed.clone()));
        stats.register(Box::new(metrics.limit_waits.clone()));
        metrics
    }

    fn closed(&self, reason: &str) {
        self.closed.with_label_values(&[reason]).inc();
    }
}

/// Metric constructors only fail on invalid names, which are constants here.
fn invalid_metric<T>(err: prometheus::Error) -> T {
    panic!("invalid metric definition: {err}")
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then stops accepting, asks every
/// connection to finish (in-flight requests complete, idle connections close) and returns when
/// all have. Dropping the future drops every connection.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    metrics: ConnMetrics,
    shutdown: CancellationToken,
) {
    let pool = Arc::new(Pool {
        conns: Mutex::new(BTreeMap::new()),
        idle: Notify::new(),
        metrics,
        limits,
        last_limit_warning: Mutex::new(None),
        last_accept_warning: Mutex::new(None),
    });
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // The watcher times heads; see the module comment.
        .header_read_timeout(None)
        .max_headers(2 * MAX_HEADER_FIELDS);
    builder.http2().timer(TokioTimer::new());
    let mut connections = JoinSet::new();
    let mut next_id = 0u64;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(err) => {
                pool.accept_failed(err).await;
                continue;
            }
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => match pool.make_room(&permits, &shutdown).await {
                Some(permit) => permit,
                None => break,
            },
        };
        // Small SSE writes must leave at once, not wait on Nagle's algorithm.
        let _ = stream.set_nodelay(true);
        next_id += 1;
        let track = Arc::new(Track {
            pool: pool.clone(),
            state: Mutex::new(TrackState::new()),
            changed: Notify::new(),
            reclaim: AtomicBool::new(false),
        });
        lock(&pool.conns).insert(next_id, track.clone());
        pool.metrics.open.inc();
        let slot = Slot {
            pool: pool.clone(),
            id: next_id,
            _permit: permit,
        };
        connections.spawn(serve_connection(
            stream,
            router.clone(),
            track,
            slot,
            shutdown.clone(),
            builder.clone(),
        ));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// State shared by the accept loop and all connections.
struct Pool {
    /// Open connections by accept order, so the oldest idle one is reclaimed first.
    conns: Mutex<BTreeMap<u64, Arc<Track>>>,
    /// Signalled when a connection goes idle: the accept loop may reclaim it.
    idle: Notify,
    metrics: ConnMetrics,
    limits: Limits,
    last_limit_warning: Mutex<Option<Instant>>,
    last_accept_warning: Mutex<Option<Instant>>,
}

impl Pool {
    /// At the connection limit with a new connection in hand: closes connections that serve no
    /// request until a slot frees up, first those stuck on an incomplete request head (longest
    /// first), then idle keep-alive ones (oldest first). Connections busy with a request are never
    /// touched.
    async fn make_room(
        &self,
        permits: &Arc<Semaphore>,
        shutdown: &CancellationToken,
    ) -> Option<OwnedSemaphorePermit> {
        self.metrics.limit_waits.inc();
        if due(&self.last_limit_warning) {
            let reclaimed = |reason| self.metrics.closed.with_label_values(&[reason]).get();
            tracing::warn!(
                max_connections = self.limits.max_connections,
                waits = self.metrics.limit_waits.get(),
                reclaimed = reclaimed("reclaimed"),
                reclaimed_slow_head = reclaimed("reclaimed_slow_head"),
                "client connection limit reached: new connections wait, connections stuck on a \
                 request head and idle keep-alive connections are closed to make room (raise \
                 --max-connections or the open-file limit)"
            );
        }
        loop {
            let next_try = self.reclaim_one();
            tokio::select! {
                permit = permits.clone().acquire_owned() => return permit.ok(),
                () = self.idle.notified() => {}
                () = sleep_until(next_try.map(|at| (at, "reclaim"))) => {}
                () = shutdown.cancelled() => return None,
            }
        }
    }

    /// Connections that may be closed for room now, best first; and, when there are none, when
    /// the first one becomes eligible.
    fn candidates(conns: &BTreeMap<u64, Arc<Track>>) -> (Vec<&Arc<Track>>, Option<Instant>) {
        let now = Instant::now();
        let mut eligible = Vec::new();
        let mut next_try: Option<Instant> = None;
        for track in conns.values() {
            let Some((kind, since)) = track.spare() else {
                continue;
            };
            let at = since + MIN_IDLE_TO_RECLAIM;
            if at <= now {
                eligible.push((kind, since, track));
            } else {
                next_try = Some(next_try.map_or(at, |t| t.min(at)));
            }
        }
        eligible.sort_by_key(|(kind, since, _)| (*kind, *since));
        (eligible.into_iter().map(|(_, _, t)| t).collect(), next_try)
    }

    /// Asks the best candidate to close, unless one is already closing for room. Returns when to
    /// try again if no connection is eligible yet.
    fn reclaim_one(&self) -> Option<Instant> {
        let conns = lock(&self.conns);
        if conns.values().any(|t| t.reclaim.load(Ordering::Acquire)) {
            return None;
        }
        let (eligible, next_try) = Self::candidates(&conns);
        match eligible.first() {
            Some(track) => {
                track.reclaim.store(true, Ordering::Release);
                track.changed.notify_one();
                None
            }
            None => next_try,
        }
    }

    /// Asks up to `n` candidates to close.
    fn reclaim_many(&self, n: usize) {
        let conns = lock(&self.conns);
        for track in Self::candidates(&conns).0.into_iter().take(n) {
            track.reclaim.store(true, Ordering::Release);
            track.changed.notify_one();
        }
    }

    /// Accept errors other than a client giving up (descriptors or memory exhausted) repeat at
    /// once while the listener stays readable: log them rate-limited and pause briefly.
    async fn accept_failed(&self, err: std::io::Error) {
        if matches!(
            err.kind(),
            ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
        ) {
            return;
        }
        if due(&self.last_accept_warning) {
            tracing::warn!(error = %err, "accepting a client connection failed; retrying");
        }
        // Out of descriptors (a --max-connections above what the open-file limit allows): free
        // some held by idle connections, as nginx does, so that accepted requests can still open
        // their upstream socket.
        if matches!(
            err.raw_os_error(),
            Some(nix::libc::EMFILE | nix::libc::ENFILE)
        ) {
            self.reclaim_many(EMFILE_RECLAIM);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// True at most once per [`WARN_EVERY`] for one slot.
fn due(slot: &Mutex<Option<Instant>>) -> bool {
    let mut last = lock(slot);
    let now = Instant::now();
    if last.is_some_and(|at| now < at + WARN_EVERY) {
        return false;
    }
    *last = Some(now);
    true
}

/// A connection's place in the pool; dropping it (the task ends or is aborted) frees the slot.
struct Slot {
    pool: Arc<Pool>,
    id: u64,
    _permit: OwnedSemaphorePermit,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.pool.conns).remove(&self.id);
        self.pool.metrics.open.dec();
    }
}

/// One connection's progress, shared by its socket wrapper, its requests and its watcher.
struct Track {
    pool: Arc<Pool>,
    state: Mutex<TrackState>,
    /// Wakes the watcher when a reclaim is asked. Phase changes do not wake it: it checks every
    /// [`Limits::check_every`], which is enough to meet every deadline on time (see there).
    changed: Notify,
    /// The accept loop asks this connection (idle, or stuck on a head) to close to make room.
    reclaim: AtomicBool,
}

/// Why a connection serving no request may be closed for room; the first kinds go first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Spare {
    /// Its request head has been arriving for a while: a head takes milliseconds, so this is a
    /// trickle, most likely meant to hold the slot.
    SlowHead,
    /// An idle keep-alive connection (or a new one that sent nothing): its client reconnects.
    Idle,
}

impl Spare {
    fn reason(self) -> &'static str {
        match self {
            Self::SlowHead => "reclaimed_slow_head",
            Self::Idle => "reclaimed",
        }
    }
}

struct TrackState {
    /// Requests (h2: streams) between the head and the end of both bodies.
    open: usize,
    /// When the connection was accepted or last went idle.
    since: Instant,
    /// The first byte of the request head (h2: header block) now arriving, while it is incomplete.
    head_started: Option<Instant>,
    /// No request has been served yet.
    fresh: bool,
    /// The client's byte stream, followed to find and check each head.
    messages: Messages,
    /// Requests hyper began, counted against [`Messages::heads`]: hyper answers heads in order, so
    /// the n-th head is the n-th request.
    begun: u64,
    /// Since when a write to the client has been waiting for room in its socket.
    write_blocked: Option<Instant>,
}

impl TrackState {
    fn new() -> Self {
        Self {
            open: 0,
            since: Instant::now(),
            head_started: None,
            fresh: true,
            messages: Messages::new(),
            begun: 0,
            write_blocked: None,
        }
    }
}

impl Track {
    /// A request begins; `Some` when it is a refused head's stand-in, to be answered with the error.
    fn begin_request(self: &Arc<Self>) -> (Arc<InFlight>, Option<GatewayError>) {
        let refused = {
            let mut s = lock(&self.state);
            s.open += 1;
            s.begun += 1;
            let begun = s.begun;
            match s.messages.refusal.take() {
                Some((n, err)) if n == begun => Some(err),
                other => {
                    s.messages.refusal = other;
                    None
                }
            }
        };
        let flight = Arc::new(InFlight {
            track: self.clone(),
        });
        (flight, refused)
    }

    /// Whether this connection serves no request and may be closed for room, and since when.
    fn spare(&self) -> Option<(Spare, Instant)> {
        let s = lock(&self.state);
        // A complete head hyper has not begun yet is a request.
        if s.open > 0 || s.messages.heads > s.begun {
            return None;
        }
        Some(match s.head_started {
            Some(at) => (Spare::SlowHead, at),
            None => (Spare::Idle, s.since),
        })
    }

    /// Spare long enough to be closed to make room.
    fn reclaimable(&self) -> Option<Spare> {
        self.spare()
            .filter(|(_, since)| *since + MIN_IDLE_TO_RECLAIM <= Instant::now())
            .map(|(kind, _)| kind)
    }

    /// When the connection is due to be closed, and why: a write stalled for the send timeout, a
    /// head incomplete for the header timeout, or (when no request is in flight) idle for the
    /// keep-alive timeout.
    fn deadline(&self) -> Option<(Instant, &'static str)> {
        let s = lock(&self.state);
        let limits = &self.pool.limits;
        let mut due: Option<(Instant, &'static str)> = None;
        let mut consider = |at: Instant, reason| {
            if due.is_none_or(|(d, _)| at < d) {
                due = Some((at, reason));
            }
        };
        if let Some(at) = s.write_blocked {
            consider(at + limits.send_timeout, "send_timeout");
        }
        if s.messages.h2() {
            // A header block blocks the whole connection (RFC 9113 section 6.10), busy or not.
            if let Some(at) = s.head_started {
                consider(at + limits.header_timeout, "header_timeout");
            }
        }
        if s.open == 0 {
            match s.head_started {
                Some(at) => consider(at + limits.header_timeout, "header_timeout"),
                // A new connection owes its first head within the header timeout (nginx does the
                // same), on HTTP/2 too.
                None if s.fresh => consider(s.since + limits.header_timeout, "header_timeout"),
                None => consider(s.since + limits.keepalive_timeout, "keepalive_timeout"),
            }
        }
        due
    }

    /// Looks at bytes just read, before hyper does (see [`Messages::read`]).
    fn on_read(&self, bytes: &[u8]) -> Plan {
        let now = Instant::now();
        let mut guard = lock(&self.state);
        let s = &mut *guard;
        s.messages.read(bytes, now, &mut s.head_started)
    }
}

/// One request in progress; the last clone dropped (request body and response body both done)
/// makes the connection idle again.
struct InFlight {
    track: Arc<Track>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let idle = {
            let mut s = lock(&self.track.state);
            s.open -= 1;
            if s.open == 0 {
                let now = Instant::now();
                s.since = now;
                s.fresh = false;
                // An HTTP/1.1 head that began while the request was answered (pipelined, or a
                // refused head lingering) is timed from now: hyper reads it only now.
                if !s.messages.h2() && s.head_started.is_some() {
                    s.head_started = Some(now);
                }
            }
            s.open == 0
        };
        if idle {
            self.track.pool.idle.notify_one();
        }
    }
}

/// Serves one connection until it ends, times out, is reclaimed, or is dropped with the pool.
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    track: Arc<Track>,
    _slot: Slot,
    shutdown: CancellationToken,
    builder: auto::Builder<TokioExecutor>,
) {
    let io = TokioIo::new(WatchedIo::new(stream, track.clone()));
    let service = hyper::service::service_fn({
        let track = track.clone();
        move |request: hyper::Request<Incoming>| {
            let (flight, refused) = track.begin_request();
            let router = router.clone();
            let timeout = track.pool.limits.body_timeout;
            async move {
                let response = match refused {
                    Some(err) => {
                        let mut response = err.into_response();
                        response
                            .headers_mut()
                            .insert(header::CONNECTION, HeaderValue::from_static("close"));
                        response
                    }
                    None => {
                        let request = request
                            .map(|body| Body::new(TimedBody::new(body, timeout, flight.clone())));
                        match router.oneshot(request).await {
                            Ok(response) => response,
                            Err(never) => match never {},
                        }
                    }
                };
                Ok::<_, Infallible>(response.map(|body| TrackedBody::new(body, flight)))
            }
        }
    });
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        if track.reclaim.load(Ordering::Acquire) {
            if let Some(kind) = track.reclaimable() {
                tracing::debug!(
                    reason = kind.reason(),
                    "closing a client connection for room"
                );
                track.pool.metrics.closed(kind.reason());
                return;
            }
            // A request arrived meanwhile: let the accept loop pick another connection.
            track.reclaim.store(false, Ordering::Release);
            track.pool.idle.notify_one();
        }
        // Sleeping at most one check period keeps the watcher off the request path: no wake-up per
        // request, yet every deadline is met on time (see `Limits::check_every`).
        let next_check = Instant::now() + track.pool.limits.check_every();
        let due = match track.deadline() {
            Some((at, reason)) if at < next_check => Some((at, reason)),
            _ => Some((next_check, "check")),
        };
        tokio::select! {
            // The connection first: bytes that already arrived are read before a deadline is
            // judged, even when a busy worker comes back to this task late.
            biased;
            result = conn.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "client connection ended with an error");
                }
                return;
            }
            () = track.changed.notified() => {}
            () = sleep_until(due) => {
                if let Some((at, reason)) = track.deadline() {
                    if at <= Instant::now() {
                        tracing::debug!(reason, "closing a client connection");
                        track.pool.metrics.closed(reason);
                        // Dropping the connection drops the response bodies in flight, and with
                        // them their upstream requests (a stream's pump sees its client gone).
                        return;
                    }
                }
            }
            () = shutdown.cancelled(), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

async fn sleep_until(due: Option<(Instant, &'static str)>) {
    match due {
        Some((at, _)) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_cap_leaves_room_for_upstream_sockets() {
        assert_eq!(derived_max_connections(1024), 448);
        assert_eq!(derived_max_connections(256), 64);
        assert_eq!(derived_max_connections(10), MIN_DERIVED_CONNECTIONS);
    }
}
