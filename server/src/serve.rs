//! The client-facing HTTP server: accepts connections, serves HTTP/1.1 and h2c through the router,
//! and drops clients that stall. It knows nothing of routes or caching.
//!
//! `axum::serve` has no timeouts and no connection cap, so this is an accept loop over hyper-util's
//! connection builder with, per connection, a watcher task that enforces:
//! - the header timeout, from a new connection's accept or a request head's first byte until the
//!   head is complete (hyper's own `header_read_timeout` also runs while a keep-alive connection
//!   idles between requests, so it cannot tell a slow head from an idle connection);
//! - the keep-alive timeout, how long a connection may sit idle between requests;
//! - the body timeout, inside the request body ([`BodyTimeout`] becomes an OpenAI-shaped 408).
//!
//! A semaphore caps the connections served at once (by default from the open-file limit). At the
//! cap the loop closes idle keep-alive connections to make room, as nginx does, and otherwise
//! lets new connections wait in the kernel's backlog; both are counted and logged, rate-limited.
//!
//! Request heads are checked with httparse before hyper reads them: hyper answers a malformed,
//! too long or too large head itself with an empty-bodied 400, 414 or 431, so the checks here
//! are stricter than hyper's and answer first, in the OpenAI error shape.
//!
//! What these checks cannot see is left to hyper: after a pipelined request or a chunked body on a
//! connection, where the next head starts is unknown, so that connection's bad heads get hyper's
//! bare answers. HTTP/2 connections have no heads to check or time; the keep-alive timeout closes
//! them when no stream is open.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus::{IntCounter, IntCounterVec, IntGauge, Opts};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::config::Config;
use crate::error::GatewayError;
use crate::stats::Stats;

/// Longest request target accepted (hyper's own limit is 64 KiB, answered with an empty 414).
pub(crate) const MAX_URI_BYTES: usize = 16 * 1024;
/// Longest request head accepted (hyper's own limit is about 400 KB, answered with an empty 431).
pub(crate) const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Most header fields accepted; hyper is given twice as many so that this check always answers.
pub(crate) const MAX_HEADER_FIELDS: usize = 100;
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
/// A head arriving in more reads than this (each ending a line) is refused: a trickle, not a client.
const MAX_HEAD_PARSES: u32 = 4 * MAX_HEADER_FIELDS as u32;
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The client-side limits, resolved once at start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub keepalive_timeout: Duration,
    pub max_connections: usize,
}

impl Limits {
    /// How often a connection's watcher looks at its phase. A deadline is a phase change plus a
    /// timeout of at least this period, so the last check before it comes after the change and
    /// sleeps until the deadline exactly.
    fn check_every(&self) -> Duration {
        self.header_timeout.min(self.keepalive_timeout)
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
                     body_timeout, keepalive_timeout, reclaimed (idle, at the connection limit), \
                     bad_request (a malformed, too long or too large request head).",
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

/// The error a request body yields when the client sent nothing for the body timeout.
#[derive(Debug, thiserror::Error)]
#[error("the client sent no part of the request body for {timeout_ms} ms")]
pub(crate) struct BodyTimeout {
    pub timeout_ms: u64,
}

impl BodyTimeout {
    /// The body timeout behind `err`, however deeply the body's consumer wrapped it.
    pub(crate) fn in_chain<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        let mut source = Some(err);
        while let Some(e) = source {
            if let Some(stalled) = e.downcast_ref::<Self>() {
                return Some(stalled);
            }
            source = e.source();
        }
        None
    }
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
    /// At the connection limit with a new connection in hand: closes idle keep-alive connections
    /// (oldest first) until a slot frees up. Connections busy with a request are never touched.
    async fn make_room(
        &self,
        permits: &Arc<Semaphore>,
        shutdown: &CancellationToken,
    ) -> Option<OwnedSemaphorePermit> {
        self.metrics.limit_waits.inc();
        if due(&self.last_limit_warning) {
            tracing::warn!(
                max_connections = self.limits.max_connections,
                waits = self.metrics.limit_waits.get(),
                reclaimed = self.metrics.closed.with_label_values(&["reclaimed"]).get(),
                "client connection limit reached: new connections wait, idle keep-alive \
                 connections are closed to make room (raise --max-connections or the open-file limit)"
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

    /// Asks the oldest idle connection to close, unless one is already closing for room. Returns
    /// when to try again if no connection has been idle long enough yet.
    fn reclaim_one(&self) -> Option<Instant> {
        let conns = lock(&self.conns);
        if conns.values().any(|t| t.reclaim.load(Ordering::Acquire)) {
            return None;
        }
        let now = Instant::now();
        let mut next_try: Option<Instant> = None;
        for track in conns.values() {
            let Some(idle_since) = track.idle_since() else {
                continue;
            };
            let eligible = idle_since + MIN_IDLE_TO_RECLAIM;
            if eligible <= now {
                track.reclaim.store(true, Ordering::Release);
                track.changed.notify_one();
                return None;
            }
            next_try = Some(next_try.map_or(eligible, |t| t.min(eligible)));
        }
        next_try
    }

    /// Asks up to `n` connections idle long enough to close.
    fn reclaim_many(&self, n: usize) {
        let conns = lock(&self.conns);
        for track in conns.values().filter(|t| t.reclaimable()).take(n) {
            track.reclaim.store(true, Ordering::Release);
            track.changed.notify_one();
        }
    }

    /// Accept errors other than a client giving up (descriptors or memory exhausted) repeat at
    /// once while the listener stays readable: log them rate-limited and pause briefly.
    async fn accept_failed(&self, err: io::Error) {
        if matches!(
            err.kind(),
            io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
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
    /// The accept loop asks this idle connection to close to make room.
    reclaim: AtomicBool,
}

struct TrackState {
    /// Requests (h2: streams) between the head and the end of both bodies.
    open: usize,
    /// Request bodies still being received.
    bodies_open: usize,
    /// Bytes arrived after every request body ended but before the answer did: a pipelined next
    /// head, which hyper already holds, so the checks cannot see its start.
    pipelined: bool,
    /// Bytes read since the current head's first byte.
    seen: u64,
    /// Head plus body length of the current request, when its head was checked and it is not
    /// chunked: more bytes than that were a pipelined next request.
    expected: Option<u64>,
    /// Heads are no longer checked on this connection (after pipelining or a chunked body, where
    /// the start of the next head is unknown); hyper answers bad ones itself.
    unchecked: bool,
    /// When the connection was accepted or last went idle.
    since: Instant,
    /// The first byte of the next request head, while it is incomplete.
    head_started: Option<Instant>,
    /// No request has been served yet.
    fresh: bool,
    /// The client spoke the HTTP/2 preface: frames, not heads, follow.
    h2: bool,
    /// A copy of the head so far, for the checks.
    head: Vec<u8>,
    /// The current head was checked (passed or refused): later bytes are not looked at.
    head_checked: bool,
    head_parses: u32,
}

impl TrackState {
    fn new() -> Self {
        Self {
            open: 0,
            bodies_open: 0,
            pipelined: false,
            seen: 0,
            expected: None,
            unchecked: false,
            since: Instant::now(),
            head_started: None,
            fresh: true,
            h2: false,
            head: Vec::new(),
            head_checked: false,
            head_parses: 0,
        }
    }
}

impl Track {
    fn begin_request(self: &Arc<Self>) -> (Arc<InFlight>, Receiving) {
        {
            let mut s = lock(&self.state);
            s.open += 1;
            s.bodies_open += 1;
            s.head_started = None;
        }
        let flight = Arc::new(InFlight {
            track: self.clone(),
        });
        let receiving = Receiving {
            track: self.clone(),
        };
        (flight, receiving)
    }

    /// Since when the connection has been idle between requests with no byte of a next head.
    fn idle_since(&self) -> Option<Instant> {
        let s = lock(&self.state);
        (s.open == 0 && s.head_started.is_none()).then_some(s.since)
    }

    /// Idle long enough to be closed to make room.
    fn reclaimable(&self) -> bool {
        self.idle_since()
            .is_some_and(|since| since + MIN_IDLE_TO_RECLAIM <= Instant::now())
    }

    /// When the connection is due to be closed, and why; `None` while a request is in flight.
    fn deadline(&self) -> Option<(Instant, &'static str)> {
        let s = lock(&self.state);
        if s.open > 0 {
            return None;
        }
        let limits = &self.pool.limits;
        Some(match s.head_started {
            Some(at) => (at + limits.header_timeout, "header_timeout"),
            // A new connection owes its first head within the header timeout (nginx does the same).
            None if s.fresh && !s.h2 => (s.since + limits.header_timeout, "header_timeout"),
            None => (s.since + limits.keepalive_timeout, "keepalive_timeout"),
        })
    }

    /// Looks at bytes just read, before hyper does: starts the header timer on a head's first byte
    /// and checks the head; `Some` is the error to answer instead of handing the bytes to hyper.
    fn on_read(&self, bytes: &[u8]) -> Option<GatewayError> {
        let mut s = lock(&self.state);
        if s.h2 {
            return None;
        }
        s.seen += bytes.len() as u64;
        if s.open > 0 {
            if s.bodies_open == 0 {
                s.pipelined = true;
            }
            return None;
        }
        if s.head_started.is_none() {
            s.head_started = Some(Instant::now());
        }
        // Body bytes, or the rest of a head already checked (or not to be checked).
        if s.head_checked || s.unchecked {
            return None;
        }
        let room = (MAX_HEAD_BYTES + 1).saturating_sub(s.head.len());
        s.head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        if s.fresh {
            let start = &s.head[..s.head.len().min(H2_PREFACE.len())];
            if H2_PREFACE.starts_with(start) {
                if start.len() == H2_PREFACE.len() {
                    s.h2 = true;
                    s.head = Vec::new();
                    s.head_started = None;
                    s.since = Instant::now();
                }
                return None;
            }
        }
        // Parse again only when a line ended or a limit may be crossed: a head trickling in one
        // byte per read must not cost a parse per byte.
        let line_ended = bytes.contains(&b'\n');
        if !line_ended && s.head.len() <= MAX_URI_BYTES + 64 {
            return None;
        }
        s.head_parses += 1;
        let verdict = if s.head_parses > MAX_HEAD_PARSES {
            Check::Reject(too_large())
        } else {
            check_head(&s.head)
        };
        match verdict {
            Check::Partial => None,
            Check::Complete { head, body } => {
                s.expected = body.map(|body| head as u64 + body);
                s.head_checked = true;
                s.head = Vec::new();
                None
            }
            Check::Reject(err) => {
                s.head_checked = true;
                Some(err)
            }
        }
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
                s.head.clear();
                s.head_parses = 0;
                // A pipelined head is left to hyper; its header timer runs from now.
                let pipelined = s.pipelined || s.expected.is_some_and(|e| s.seen > e);
                if pipelined || s.expected.is_none() {
                    s.unchecked = true;
                }
                s.head_checked = false;
                s.head_started = pipelined.then_some(now);
                s.pipelined = false;
                s.seen = 0;
                s.expected = None;
            }
            s.open == 0
        };
        if idle {
            self.track.pool.idle.notify_one();
        }
    }
}

/// A request body still being received; dropped at its end, on error, or with the body.
struct Receiving {
    track: Arc<Track>,
}

impl Drop for Receiving {
    fn drop(&mut self) {
        let mut s = lock(&self.track.state);
        s.bodies_open = s.bodies_open.saturating_sub(1);
    }
}

enum Check {
    Partial,
    /// The head's length, and its body's when known (`None`: chunked).
    Complete {
        head: usize,
        body: Option<u64>,
    },
    Reject(GatewayError),
}

/// The checks hyper makes on a request head, with lower limits, so that hyper never refuses a
/// head these accepted.
fn check_head(head: &[u8]) -> Check {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADER_FIELDS];
    let mut request = httparse::Request::new(&mut fields);
    match request.parse(head) {
        Ok(httparse::Status::Complete(len)) => {
            if request.path.is_some_and(|p| p.len() > MAX_URI_BYTES) {
                return Check::Reject(GatewayError::UriTooLong {
                    limit: MAX_URI_BYTES,
                });
            }
            if len > MAX_HEAD_BYTES {
                return Check::Reject(too_large());
            }
            match body_length(&request) {
                Err(why) => Check::Reject(malformed(why)),
                Ok(body) => Check::Complete { head: len, body },
            }
        }
        Ok(httparse::Status::Partial) => {
            let request_line_done = head.contains(&b'\n');
            let uri_too_long = match request.path {
                Some(path) => path.len() > MAX_URI_BYTES,
                None => !request_line_done && head.len() > MAX_URI_BYTES + 64,
            };
            if uri_too_long {
                Check::Reject(GatewayError::UriTooLong {
                    limit: MAX_URI_BYTES,
                })
            } else if head.len() > MAX_HEAD_BYTES {
                Check::Reject(too_large())
            } else {
                Check::Partial
            }
        }
        Err(httparse::Error::TooManyHeaders) => Check::Reject(too_large()),
        Err(err) => Check::Reject(malformed(&err.to_string())),
    }
}

/// The body's length (`None`: chunked), or what hyper would refuse after httparse accepted the
/// head: the target, and the body framing.
fn body_length(request: &httparse::Request<'_, '_>) -> Result<Option<u64>, &'static str> {
    if request
        .path
        .is_some_and(|p| p.parse::<http::Uri>().is_err())
    {
        return Err("invalid request target");
    }
    let http11 = request.version == Some(1);
    let mut chunked = None;
    let mut length: Option<u64> = None;
    for field in request.headers.iter() {
        if field.name.eq_ignore_ascii_case("transfer-encoding") {
            if !http11 {
                return Err("Transfer-Encoding is not allowed in HTTP/1.0");
            }
            let last = field.value.rsplit(|b| *b == b',').next().unwrap_or(b"");
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if field.name.eq_ignore_ascii_case("content-length") && chunked.is_none() {
            let parsed = std::str::from_utf8(field.value)
                .ok()
                .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|v| v.parse::<u64>().ok());
            match (parsed, length) {
                (None, _) => return Err("invalid Content-Length"),
                (Some(new), Some(old)) if new != old => {
                    return Err("conflicting Content-Length headers")
                }
                (Some(new), _) => length = Some(new),
            }
        }
    }
    match chunked {
        Some(false) => Err("Transfer-Encoding must end with chunked"),
        Some(true) => Ok(None),
        None => Ok(Some(length.unwrap_or(0))),
    }
}

fn malformed(why: &str) -> GatewayError {
    GatewayError::InvalidRequest {
        message: format!("The request is not valid HTTP/1.1: {why}."),
        param: None,
        code: "malformed_request",
    }
}

fn too_large() -> GatewayError {
    GatewayError::HeadersTooLarge {
        max_fields: MAX_HEADER_FIELDS,
        max_bytes: MAX_HEAD_BYTES,
    }
}

/// The whole HTTP/1.1 response for a refused head, written by the socket wrapper itself since
/// hyper never saw the request.
fn raw_reply(err: &GatewayError) -> Bytes {
    err.log();
    let status = err.status();
    let body = err.body().to_string();
    Bytes::from(format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len(),
    ))
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
    let io = TokioIo::new(WatchedIo {
        inner: stream,
        track: track.clone(),
        reply: None,
    });
    let service = hyper::service::service_fn({
        let track = track.clone();
        move |request: hyper::Request<Incoming>| {
            let (flight, receiving) = track.begin_request();
            let router = router.clone();
            let timeout = track.pool.limits.body_timeout;
            async move {
                let request = request.map(|body| {
                    // An empty body is received already: later bytes belong to the next request.
                    let receiving = (!body.is_end_stream()).then_some(receiving);
                    Body::new(TimedBody {
                        inner: body,
                        timeout,
                        sleep: None,
                        stale: false,
                        flight: Some(flight.clone()),
                        receiving,
                        timed_out: false,
                    })
                });
                let response = match router.oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                };
                Ok::<_, Infallible>(response.map(|body| TrackedBody {
                    inner: body,
                    flight: Some(flight),
                }))
            }
        }
    });
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        if track.reclaim.load(Ordering::Acquire) {
            if track.reclaimable() {
                track.pool.metrics.closed("reclaimed");
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

/// The client's socket, watched: reads feed the connection's [`Track`], and a refused head is
/// answered here, followed by a clean close.
struct WatchedIo {
    inner: TcpStream,
    track: Arc<Track>,
    reply: Option<Reply>,
}

struct Reply {
    bytes: Bytes,
    written: usize,
    shut: bool,
}

impl Reply {
    /// Writes the reply, half-closes, then reads and discards until the client closes: closing
    /// with unread bytes would reset the connection and could destroy the reply in flight.
    /// Resolves to end-of-file for hyper, which then closes quietly.
    fn poll_send(&mut self, io: &mut TcpStream, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.bytes.len() {
            let n = ready!(Pin::new(&mut *io).poll_write(cx, &self.bytes[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Ok(()));
            }
            self.written += n;
        }
        if !self.shut {
            ready!(Pin::new(&mut *io).poll_shutdown(cx))?;
            self.shut = true;
        }
        let mut scratch = [0u8; 2048];
        // A bounded number of reads per poll, so a client that keeps sending cannot hog a worker;
        // the header timeout ends the connection if it never stops.
        for _ in 0..16 {
            let mut sink = ReadBuf::new(&mut scratch);
            ready!(Pin::new(&mut *io).poll_read(cx, &mut sink))?;
            if sink.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if let Some(reply) = &mut this.reply {
                return reply.poll_send(&mut this.inner, cx);
            }
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let fresh = &buf.filled()[before..];
            if fresh.is_empty() {
                return Poll::Ready(Ok(()));
            }
            match this.track.on_read(fresh) {
                None => return Poll::Ready(Ok(())),
                Some(err) => {
                    // hyper never sees the refused bytes.
                    buf.set_filled(before);
                    this.track.pool.metrics.closed("bad_request");
                    this.reply = Some(Reply {
                        bytes: raw_reply(&err),
                        written: 0,
                        shut: false,
                    });
                }
            }
        }
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The client's request body, failing with [`BodyTimeout`] when no part of it arrives for the
/// body timeout. The timer runs only while the body is read, and restarts with every frame.
struct TimedBody {
    inner: Incoming,
    timeout: Duration,
    /// Made on the first wait only: most bodies arrive whole and never need a timer.
    sleep: Option<Pin<Box<Sleep>>>,
    /// A frame arrived since the timer was set: restart it before the next wait.
    stale: bool,
    flight: Option<Arc<InFlight>>,
    receiving: Option<Receiving>,
    timed_out: bool,
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.timed_out {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.stale = true;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                this.flight = None;
                this.receiving = None;
                Poll::Ready(Some(Err(err.into())))
            }
            Poll::Ready(None) => {
                this.flight = None;
                this.receiving = None;
                Poll::Ready(None)
            }
            Poll::Pending => {
                let deadline = Instant::now() + this.timeout;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if std::mem::take(&mut this.stale) {
                    sleep.as_mut().reset(deadline);
                }
                ready!(sleep.as_mut().poll(cx));
                this.timed_out = true;
                if let Some(flight) = &this.flight {
                    flight.track.pool.metrics.closed("body_timeout");
                }
                let timeout_ms = u64::try_from(this.timeout.as_millis()).unwrap_or(u64::MAX);
                Poll::Ready(Some(Err(Box::new(BodyTimeout { timeout_ms }))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.timed_out || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The response body, holding its request in flight until the last frame is taken.
struct TrackedBody {
    inner: Body,
    flight: Option<Arc<InFlight>>,
}

impl HttpBody for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if !matches!(frame, Some(Ok(_))) {
            this.flight = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(head: &[u8]) -> Result<bool, u16> {
        match check_head(head) {
            Check::Partial => Ok(false),
            Check::Complete { .. } => Ok(true),
            Check::Reject(err) => Err(err.status().as_u16()),
        }
    }

    #[test]
    fn heads_are_checked_like_hyper_with_lower_limits() {
        assert_eq!(
            verdict(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
            Ok(true)
        );
        assert_eq!(verdict(b"\r\nGET / HTTP/1.1\r\n\r\n"), Ok(true));
        assert_eq!(verdict(b"POST /v1/chat HTTP/1.1\r\nHost: x\r\n"), Ok(false));
        assert_eq!(verdict(b"GARBAGE\r\n\r\n"), Err(400));
        assert_eq!(verdict(b"GET / HTTP/1.1\r\nbad header\r\n\r\n"), Err(400));
        assert_eq!(verdict(b"GET / HTTP/9.9\r\n\r\n"), Err(400));
        let conflicting = b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n";
        assert_eq!(verdict(conflicting), Err(400));
        assert_eq!(
            verdict(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"),
            Err(400)
        );
        assert_eq!(
            verdict(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
            Ok(true)
        );
        let long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_URI_BYTES));
        assert_eq!(verdict(long.as_bytes()), Err(414));
        let unfinished = format!("GET /{}", "a".repeat(MAX_URI_BYTES + 100));
        assert_eq!(verdict(unfinished.as_bytes()), Err(414));
        let many: String = (0..=MAX_HEADER_FIELDS)
            .map(|i| format!("x-{i}: 1\r\n"))
            .collect();
        assert_eq!(
            verdict(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes()),
            Err(431)
        );
        let big = format!("GET / HTTP/1.1\r\nx: {}\r\n", "b".repeat(MAX_HEAD_BYTES));
        assert_eq!(verdict(big.as_bytes()), Err(431));
    }

    #[test]
    fn derived_cap_leaves_room_for_upstream_sockets() {
        assert_eq!(derived_max_connections(1024), 448);
        assert_eq!(derived_max_connections(256), 64);
        assert_eq!(derived_max_connections(10), MIN_DERIVED_CONNECTIONS);
    }
}
