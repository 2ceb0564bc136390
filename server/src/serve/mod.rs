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
//! - the body timeout, inside the request body ([`BodyTimeout`] becomes an OpenAI-shaped 408);
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

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use axum::Router;
use bytes::Bytes;
use http::{header, HeaderValue};
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
use crate::error::{BodyTimeout, GatewayError};
use crate::lock::lock;
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
    /// Where the client's byte stream is, message by message (HTTP/1.1).
    framing: Framing,
    /// The client spoke the HTTP/2 preface: frames, not heads, follow.
    h2: Option<H2Frames>,
    /// The incomplete head so far, held back from hyper until it is checked.
    head: Vec<u8>,
    head_parses: u32,
    /// HTTP/1.1 heads handed to hyper, and requests hyper began: hyper answers them in order, so
    /// the n-th head is the n-th request.
    heads: u64,
    begun: u64,
    /// The n-th request is a refused head's stand-in, answered with this error.
    refusal: Option<(u64, GatewayError)>,
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
            framing: Framing::Head,
            h2: None,
            head: Vec::new(),
            head_parses: 0,
            heads: 0,
            begun: 0,
            refusal: None,
            write_blocked: None,
        }
    }
}

/// What the HTTP/1.1 byte stream carries next. Heads are delimited by the body framing hyper uses
/// (RFC 9112 section 6), so every head is found and checked, however requests are pipelined.
enum Framing {
    /// A head, or nothing yet.
    Head,
    /// This many bytes of a Content-Length body.
    Body(u64),
    Chunked(Chunked),
    /// A chunked body hyper will refuse (it then ends the connection): nothing more is looked at.
    Blind,
}

impl Track {
    /// A request begins; `Some` when it is a refused head's stand-in, to be answered with the error.
    fn begin_request(self: &Arc<Self>) -> (Arc<InFlight>, Option<GatewayError>) {
        let refused = {
            let mut s = lock(&self.state);
            s.open += 1;
            s.begun += 1;
            let begun = s.begun;
            match s.refusal.take() {
                Some((n, err)) if n == begun => Some(err),
                other => {
                    s.refusal = other;
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
        if s.open > 0 || s.heads > s.begun {
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
        if s.h2.is_some() {
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

    /// Looks at bytes just read, before hyper does: follows the messages, times and checks each
    /// head, and says which of the bytes hyper gets now.
    fn on_read(&self, bytes: &[u8]) -> Plan {
        let now = Instant::now();
        let mut guard = lock(&self.state);
        let s = &mut *guard;
        let mut plan = Plan {
            before: None,
            pass: bytes.len(),
            refused: false,
        };
        if let Some(frames) = &mut s.h2 {
            frames.read(bytes, now, &mut s.head_started);
            return plan;
        }
        let mut i = 0;
        while i < bytes.len() {
            let rest = &bytes[i..];
            match &mut s.framing {
                Framing::Blind => break,
                Framing::Body(left) => {
                    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(rest.len());
                    *left -= n as u64;
                    i += n;
                    if *left == 0 {
                        s.framing = Framing::Head;
                    }
                }
                Framing::Chunked(chunked) => match chunked.read(rest) {
                    Chunk::More => break,
                    Chunk::Done(n) => {
                        i += n;
                        s.framing = Framing::Head;
                    }
                    Chunk::Invalid => s.framing = Framing::Blind,
                },
                Framing::Head => {
                    if s.head_started.is_none() {
                        s.head_started = Some(now);
                    }
                    match s.read_head(rest) {
                        Head::Incomplete => {
                            plan.pass = i;
                            break;
                        }
                        Head::Preface { held } => {
                            let mut frames = H2Frames::default();
                            let used = H2_PREFACE.len() - held.as_ref().map_or(0, Vec::len);
                            s.head_started = None;
                            frames.read(&rest[used..], now, &mut s.head_started);
                            s.h2 = Some(frames);
                            plan.before = held;
                            break;
                        }
                        Head::Complete { used, held, body } => {
                            // Only the first head of a read can have begun in an earlier one.
                            plan.before = held;
                            i += used;
                            s.heads += 1;
                            s.head_started = None;
                            s.head_parses = 0;
                            s.framing = match body {
                                None => Framing::Chunked(Chunked::default()),
                                Some(0) => Framing::Head,
                                Some(n) => Framing::Body(n),
                            };
                        }
                        Head::Reject(err) => {
                            s.heads += 1;
                            s.refusal = Some((s.heads, err));
                            s.framing = Framing::Blind;
                            plan.pass = i;
                            plan.refused = true;
                            break;
                        }
                    }
                }
            }
        }
        plan
    }
}

/// What the socket wrapper hands hyper of the bytes just read.
struct Plan {
    /// Bytes first: the start of a head held back over earlier reads, complete now.
    before: Option<Vec<u8>>,
    /// How many of the bytes read hyper gets; the rest are an incomplete head, held back until it
    /// is checked, or a refused head, dropped.
    pass: usize,
    /// A head was refused: hyper gets a stand-in request instead, and nothing after it.
    refused: bool,
}

enum Head {
    Incomplete,
    /// The HTTP/2 preface, with the part of it held back from earlier reads.
    Preface {
        held: Option<Vec<u8>>,
    },
    /// The head ends `used` bytes into this read; `held` is its start from earlier reads.
    Complete {
        used: usize,
        held: Option<Vec<u8>>,
        body: Option<u64>,
    },
    Reject(GatewayError),
}

impl TrackState {
    /// Reads `fresh`, which starts in a head (or in the bytes before one): a head read at once is
    /// parsed in place; an incomplete one is copied aside until it is whole.
    fn read_head(&mut self, fresh: &[u8]) -> Head {
        let prior = self.head.len();
        let room = (MAX_HEAD_BYTES + 1).saturating_sub(prior);
        let fresh_kept = &fresh[..fresh.len().min(room)];
        if prior > 0 {
            self.head.extend_from_slice(fresh_kept);
        }
        // The HTTP/2 preface can only open a connection.
        if self.heads == 0 && prior < H2_PREFACE.len() {
            let seen = if prior > 0 { &self.head[..] } else { fresh };
            let start = &seen[..seen.len().min(H2_PREFACE.len())];
            if H2_PREFACE.starts_with(start) {
                if start.len() == H2_PREFACE.len() {
                    let mut held = std::mem::take(&mut self.head);
                    held.truncate(prior);
                    return Head::Preface {
                        held: (prior > 0).then_some(held),
                    };
                }
                if prior == 0 {
                    self.head.extend_from_slice(fresh_kept);
                }
                return Head::Incomplete;
            }
        }
        let whole = if prior > 0 { &self.head[..] } else { fresh };
        // Parse again only when a line ended or a limit may be crossed: a head trickling in one
        // byte per read must not cost a parse per byte. (A head starting in this read is parsed at
        // once, without scanning what follows it: pipelined requests.)
        let trickle = prior > 0 && !fresh_kept.contains(&b'\n');
        let verdict = if trickle && whole.len() <= MAX_URI_BYTES + 64 {
            Check::Partial
        } else {
            self.head_parses += 1;
            if self.head_parses > MAX_HEAD_PARSES {
                Check::Reject(too_large())
            } else {
                check_head(whole)
            }
        };
        match verdict {
            Check::Partial => {
                if prior == 0 {
                    self.head.extend_from_slice(fresh_kept);
                }
                Head::Incomplete
            }
            Check::Complete { head, body } => {
                let mut held = std::mem::take(&mut self.head);
                held.truncate(prior);
                Head::Complete {
                    used: head.saturating_sub(prior),
                    held: (prior > 0).then_some(held),
                    body,
                }
            }
            Check::Reject(err) => {
                self.head = Vec::new();
                Head::Reject(err)
            }
        }
    }
}

/// A chunked request body, followed byte by byte as hyper decodes it (its `ChunkedState`), to
/// find where the next head starts. The size line is parsed by httparse.
#[derive(Default)]
struct Chunked {
    state: ChunkState,
    /// The chunk-size line so far.
    line: Vec<u8>,
}

#[derive(Default, Clone, Copy)]
enum ChunkState {
    #[default]
    Size,
    Data(u64),
    DataCr,
    DataLf,
    /// After the last chunk: a trailer line, or the final CRLF.
    EndCr,
    EndLf,
    Trailer,
    TrailerLf,
}

enum Chunk {
    More,
    /// The body ends this many bytes into the read.
    Done(usize),
    Invalid,
}

/// hyper's limit on chunk extensions, plus room for the size itself.
const MAX_CHUNK_LINE: usize = 16 * 1024 + 64;

impl Chunked {
    fn read(&mut self, bytes: &[u8]) -> Chunk {
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            self.state = match self.state {
                ChunkState::Data(left) => {
                    let n = usize::try_from(left)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len() - i);
                    i += n;
                    match left - n as u64 {
                        0 => ChunkState::DataCr,
                        left => ChunkState::Data(left),
                    }
                }
                ChunkState::Size => {
                    i += 1;
                    if self.line.len() >= MAX_CHUNK_LINE {
                        return Chunk::Invalid;
                    }
                    self.line.push(b);
                    if b != b'\n' {
                        continue;
                    }
                    let parsed = httparse::parse_chunk_size(&self.line);
                    self.line.clear();
                    match parsed {
                        Ok(httparse::Status::Complete((_, 0))) => ChunkState::EndCr,
                        Ok(httparse::Status::Complete((_, size))) => ChunkState::Data(size),
                        _ => return Chunk::Invalid,
                    }
                }
                state => {
                    i += 1;
                    match (state, b) {
                        (ChunkState::DataCr, b'\r') => ChunkState::DataLf,
                        (ChunkState::DataLf, b'\n') => ChunkState::Size,
                        (ChunkState::EndCr, b'\r') => ChunkState::EndLf,
                        (ChunkState::Trailer, b'\r') => ChunkState::TrailerLf,
                        (ChunkState::EndCr | ChunkState::Trailer, _) => ChunkState::Trailer,
                        (ChunkState::TrailerLf, b'\n') => ChunkState::EndCr,
                        (ChunkState::EndLf, b'\n') => return Chunk::Done(i),
                        _ => return Chunk::Invalid,
                    }
                }
            };
        }
        Chunk::More
    }
}

/// HTTP/2 frames, followed only to see when a request's header block is arriving: from the first
/// byte of a HEADERS frame until the end of the frame that carries END_HEADERS.
#[derive(Default)]
struct H2Frames {
    /// The frame header so far.
    header: [u8; 9],
    have: usize,
    /// Payload bytes of the current frame still to come.
    left: u32,
    /// The current frame is HEADERS or CONTINUATION.
    header_frame: bool,
    /// A header block without END_HEADERS yet: CONTINUATION frames are owed.
    in_block: bool,
}

impl H2Frames {
    const HEADERS: u8 = 0x1;
    const CONTINUATION: u8 = 0x9;
    const END_HEADERS: u8 = 0x4;

    fn in_head(&self) -> bool {
        self.in_block || (self.header_frame && self.left > 0)
    }

    /// Follows `bytes`; keeps `head_started` set while a header block is arriving, restarted when
    /// one ends and another begins within the read.
    fn read(&mut self, bytes: &[u8], now: Instant, head_started: &mut Option<Instant>) {
        let was_in_head = self.in_head();
        let mut ended = false;
        let mut i = 0;
        while i < bytes.len() {
            if self.left > 0 {
                let n = usize::try_from(self.left)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len() - i);
                i += n;
                self.left -= n as u32;
                ended |= self.left == 0 && self.header_frame && !self.in_block;
                continue;
            }
            self.header[self.have] = bytes[i];
            self.have += 1;
            i += 1;
            if self.have < self.header.len() {
                continue;
            }
            self.have = 0;
            let [l0, l1, l2, kind, flags, ..] = self.header;
            self.left = u32::from_be_bytes([0, l0, l1, l2]);
            self.header_frame = kind == Self::HEADERS || kind == Self::CONTINUATION;
            self.in_block = self.header_frame && flags & Self::END_HEADERS == 0;
            ended |= self.left == 0 && self.header_frame && !self.in_block;
        }
        if self.in_head() {
            if !was_in_head || ended {
                *head_started = Some(now);
            }
        } else {
            *head_started = None;
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
                // An HTTP/1.1 head that began while the request was answered (pipelined, or a
                // refused head lingering) is timed from now: hyper reads it only now.
                if s.h2.is_none() && s.head_started.is_some() {
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

/// The request hyper is given in place of a refused head: it is answered with the refusal (see
/// [`Track::begin_request`]), after every request before it, and hyper then closes.
const STAND_IN: &[u8] = b"GET / HTTP/1.1\r\nhost: reprise\r\nconnection: close\r\n\r\n";

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
        out: Bytes::new(),
        refused: false,
        client_done: false,
        shut: false,
        write_blocked: false,
    });
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
                        let request = request.map(|body| {
                            Body::new(TimedBody {
                                inner: body,
                                timeout,
                                sleep: None,
                                stale: false,
                                flight: Some(flight.clone()),
                                timed_out: false,
                            })
                        });
                        match router.oneshot(request).await {
                            Ok(response) => response,
                            Err(never) => match never {},
                        }
                    }
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

/// The client's socket, watched: reads feed the connection's [`Track`], which holds back
/// incomplete heads and replaces a refused one; stalled writes are timed.
struct WatchedIo {
    inner: TcpStream,
    track: Arc<Track>,
    /// Bytes for hyper before any more are read: a head held back until complete, or the stand-in.
    out: Bytes,
    /// A head was refused: what the client sends next is read and dropped.
    refused: bool,
    /// The client closed its side (seen while refused).
    client_done: bool,
    shut: bool,
    /// The last write found the socket full.
    write_blocked: bool,
}

impl WatchedIo {
    /// Reads and drops what the client sends, until it closes its side: closing with unread bytes
    /// would reset the connection and could destroy the reply in flight. A bounded number of reads
    /// per poll, so a client that keeps sending cannot hog a worker; the header timeout ends the
    /// connection if it never stops.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut scratch = [0u8; 2048];
        for _ in 0..16 {
            if self.client_done {
                return Poll::Ready(Ok(()));
            }
            let mut sink = ReadBuf::new(&mut scratch);
            ready!(Pin::new(&mut self.inner).poll_read(cx, &mut sink))?;
            self.client_done = sink.filled().is_empty();
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Notes whether a write found the socket full: the send timeout runs from then until a write
    /// makes progress.
    fn note_write<T>(&mut self, polled: &Poll<T>) {
        let blocked = polled.is_pending();
        if blocked != self.write_blocked {
            self.write_blocked = blocked;
            lock(&self.track.state).write_blocked = blocked.then(Instant::now);
        }
    }
}

impl AsyncRead for WatchedIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.refused {
                // Never end-of-file: hyper would drop the stand-in's answer (an HTTP/1.1
                // connection closes at once on end-of-file mid-request).
                ready!(this.poll_drain(cx))?;
                return Poll::Pending;
            }
            let before = buf.filled().len();
            ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
            let fresh = &buf.filled()[before..];
            if fresh.is_empty() {
                return Poll::Ready(Ok(()));
            }
            let plan = this.track.on_read(fresh);
            let stand_in: &[u8] = if plan.refused {
                this.refused = true;
                this.track.pool.metrics.closed("bad_request");
                STAND_IN
            } else {
                &[]
            };
            match plan.before {
                None => {
                    buf.set_filled(before + plan.pass);
                    this.out = Bytes::from_static(stand_in);
                }
                Some(mut held) => {
                    held.extend_from_slice(&fresh[..plan.pass]);
                    held.extend_from_slice(stand_in);
                    buf.set_filled(before);
                    this.out = Bytes::from(held);
                }
            }
            if buf.filled().len() > before {
                return Poll::Ready(Ok(()));
            }
            // Everything read is held back or dropped: read on (or hand hyper `out`).
        }
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.note_write(&polled);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.note_write(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    /// After a refusal's answer, half-closes and then waits for the client to close (see
    /// [`WatchedIo::poll_drain`]), bounded by the header timeout.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.shut {
            ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            this.shut = true;
        }
        if this.refused {
            ready!(this.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
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
                Poll::Ready(Some(Err(err.into())))
            }
            Poll::Ready(None) => {
                this.flight = None;
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

    /// Feeds `body` to a chunked framing in pieces of `step` bytes; where it ended, if it did.
    fn chunked_end(body: &[u8], step: usize) -> Result<Option<usize>, ()> {
        let mut chunked = Chunked::default();
        let mut at = 0;
        for piece in body.chunks(step) {
            match chunked.read(piece) {
                Chunk::More => at += piece.len(),
                Chunk::Done(n) => return Ok(Some(at + n)),
                Chunk::Invalid => return Err(()),
            }
        }
        Ok(None)
    }

    #[test]
    fn chunked_bodies_end_where_hyper_ends_them() {
        let body = b"5;ext=1\r\nhello\r\n3\r\nabc\r\n0\r\nx-trailer: t\r\n\r\nGET / HTTP/1.1";
        let end = body.len() - b"GET / HTTP/1.1".len();
        for step in [1, 2, 7, body.len()] {
            assert_eq!(chunked_end(body, step), Ok(Some(end)), "step {step}");
        }
        assert_eq!(chunked_end(b"0\r\n\r\n", 1), Ok(Some(5)));
        assert_eq!(chunked_end(b"a\r\n0123456789\r\n", 3), Ok(None));
        assert_eq!(chunked_end(b"zz\r\n", 1), Err(()));
        assert_eq!(chunked_end(b"3\r\nabcXY", 1), Err(()));
    }

    #[test]
    fn h2_header_blocks_are_timed_until_end_headers() {
        let frame = |kind: u8, flags: u8, payload: &[u8]| {
            let mut f = vec![0, 0, payload.len() as u8, kind, flags, 0, 0, 0, 1];
            f.extend_from_slice(payload);
            f
        };
        let now = Instant::now();
        let mut frames = H2Frames::default();
        let mut started = None;
        // SETTINGS, then HEADERS without END_HEADERS: a block is open.
        let mut bytes = frame(0x4, 0, &[]);
        bytes.extend(frame(0x1, 0x1, &[0x82]));
        frames.read(&bytes, now, &mut started);
        assert_eq!(started, Some(now));
        // Its CONTINUATION, with END_HEADERS, arrives in two pieces.
        let continuation = frame(0x9, 0x4, &[0x86, 0x84]);
        frames.read(&continuation[..4], now, &mut started);
        assert_eq!(started, Some(now));
        frames.read(&continuation[4..], now, &mut started);
        assert_eq!(started, None);
        // DATA frames are not heads, even cut short.
        frames.read(&frame(0x0, 0, b"abc")[..10], now, &mut started);
        assert_eq!(started, None);
    }

    #[test]
    fn derived_cap_leaves_room_for_upstream_sockets() {
        assert_eq!(derived_max_connections(1024), 448);
        assert_eq!(derived_max_connections(256), 64);
        assert_eq!(derived_max_connections(10), MIN_DERIVED_CONNECTIONS);
    }
}
