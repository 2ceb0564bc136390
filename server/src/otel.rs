//! OpenTelemetry traces: one server span per request with a child span per phase, exported over
//! OTLP/HTTP (JSON encoding) to the collector named by `--otlp-endpoint` or the standard
//! `OTEL_EXPORTER_OTLP_*` variables, and the W3C `traceparent` joined and passed upstream.
//!
//! Nothing here runs on the request path beyond parsing `traceparent` and drawing two ids: spans
//! are built after the fact from the [`PhaseClock`]'s instants when the request's record is
//! finished, handed to a bounded queue (a full queue drops and counts them, never waits), and
//! encoded and sent by a thread of their own. A failed export is retried after an exponential
//! backoff with jitter ([`BACKOFF_FIRST`] doubling to [`BACKOFF_MAX`]), the queue holding its spans
//! meanwhile: a dead collector costs a few requests a minute, not a busy thread. With tracing off no [`Exporter`] exists and no span is
//! built. Spans carry no prompt, no response, no header value and no credential: only the
//! attributes [`RequestTrace::end`] lists.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::outcome::Completion;
use crate::timing::PhaseClock;
use reprise_wire::RequestRecord;

/// The wait after a first failed export; each failure in a row doubles it, up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Least time between two log lines about the same spell of failed exports.
const LOG_EVERY: Duration = Duration::from_secs(60);

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// Where and how spans are exported, resolved once at start.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The full traces URL (`…/v1/traces`).
    pub endpoint: reqwest::Url,
    /// `OTEL_EXPORTER_OTLP_HEADERS` (and `_TRACES_HEADERS`), sent with every export; often a key.
    pub headers: HeaderMap,
    /// `resource` attributes: `service.name` first, then `OTEL_RESOURCE_ATTRIBUTES`.
    pub resource: Vec<(String, String)>,
    /// Spans waiting for export at most; more are dropped and counted (`OTEL_BSP_MAX_QUEUE_SIZE`).
    pub max_queue: usize,
    /// Spans per export request at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`).
    pub max_batch: usize,
    /// Longest a span waits before its batch is sent (`OTEL_BSP_SCHEDULE_DELAY`).
    pub delay: Duration,
    /// One export request's deadline (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`/`_TIMEOUT`).
    pub timeout: Duration,
}

impl Settings {
    /// Resolves the settings from the `--otlp-endpoint` value and the environment (`env` looks a
    /// variable up). `None`: tracing is off, the default. An invalid value is an error naming it.
    pub fn resolve(
        flag: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, String> {
        let var = |name: &str| env(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
        {
            return Ok(None);
        }
        // The flag and the generic variable name the collector; the traces variable is the URL.
        let endpoint = match (
            flag.filter(|f| !f.trim().is_empty()),
            var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            var("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(base), _, _) => traces_url(base, "otlp_endpoint", true)?,
            (None, Some(url), _) => traces_url(&url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", false)?,
            (None, None, Some(base)) => traces_url(&base, "OTEL_EXPORTER_OTLP_ENDPOINT", true)?,
            (None, None, None) => return Ok(None),
        };
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(p) = var(name).filter(|p| p.trim() != "http/json") {
                tracing::warn!(
                    "{name}={p}: Reprise exports traces as OTLP/HTTP with JSON (http/json), which \
                     OTLP/HTTP receivers accept on the same port as protobuf"
                );
                break;
            }
        }
        let mut headers = HeaderMap::new();
        for name in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            if let Some(list) = var(name) {
                for (key, value) in parse_headers(&list, name)? {
                    headers.insert(key, value);
                }
            }
        }
        let mut resource = Vec::new();
        if let Some(list) = var("OTEL_RESOURCE_ATTRIBUTES") {
            for pair in list.split(',').filter(|p| !p.trim().is_empty()) {
                let (k, v) = pair.split_once('=').ok_or_else(|| {
                    format!("OTEL_RESOURCE_ATTRIBUTES: `{pair}` is not key=value")
                })?;
                resource.push((percent_decode(k.trim()), percent_decode(v.trim())));
            }
        }
        let service = var("OTEL_SERVICE_NAME")
            .or_else(|| {
                resource
                    .iter()
                    .find(|(k, _)| k == "service.name")
                    .map(|(_, v)| v.clone())
            })
            .unwrap_or_else(|| "reprise".to_owned());
        resource.retain(|(k, _)| k != "service.name");
        resource.insert(0, ("service.name".to_owned(), service));
        if !resource.iter().any(|(k, _)| k == "service.version") {
            resource.push((
                "service.version".to_owned(),
                env!("CARGO_PKG_VERSION").to_owned(),
            ));
        }
        let number = |name: &str, default: u64| -> Result<u64, String> {
            match var(name) {
                None => Ok(default),
                Some(v) => v
                    .trim()
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("{name}: `{v}` is not a positive whole number")),
            }
        };
        let timeout = match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") {
            Some(_) => number("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 10_000)?,
            None => number("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)?,
        };
        let max_queue = number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)? as usize;
        Ok(Some(Self {
            endpoint,
            headers,
            resource,
            max_queue,
            max_batch: (number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)? as usize).min(max_queue),
            delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5000)?),
            timeout: Duration::from_millis(timeout),
        }))
    }
}

/// Checks an `otlp_endpoint` value the way [`Settings::resolve`] will read it (for `validate`).
pub(crate) fn check_endpoint(value: &str) -> Result<(), String> {
    traces_url(value, "otlp_endpoint", true).map(|_| ())
}

/// The traces URL of an endpoint: a collector's base URL gets `/v1/traces` appended (unless it
/// already ends so), as OTLP/HTTP specifies for `OTEL_EXPORTER_OTLP_ENDPOINT`.
fn traces_url(value: &str, name: &str, base: bool) -> Result<reqwest::Url, String> {
    let mut url = reqwest::Url::parse(value.trim())
        .map_err(|e| format!("{name}: `{value}` is not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{name}: the scheme must be http or https"));
    }
    if base && !url.path().ends_with("/v1/traces") {
        let path = format!("{}/v1/traces", url.path().trim_end_matches('/'));
        url.set_path(&path);
    }
    Ok(url)
}

/// `key=value,key2=value2`, values percent-encoded (the OTLP exporter's header list format).
fn parse_headers(list: &str, name: &str) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out = Vec::new();
    for pair in list.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("{name}: an entry is not key=value"))?;
        let key = HeaderName::from_bytes(percent_decode(k.trim()).as_bytes())
            .map_err(|_| format!("{name}: `{}` is not a header name", k.trim()))?;
        // The value is often a credential: never echoed in an error or a log.
        let mut value = HeaderValue::from_str(&percent_decode(v.trim()))
            .map_err(|_| format!("{name}: the value of `{key}` is not a valid header value"))?;
        value.set_sensitive(true);
        out.push((key, value));
    }
    Ok(out)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let (h, l) = (hex(h).unwrap_or(0), hex(l).unwrap_or(0));
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A W3C trace context as received in `traceparent` (and `tracestate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parent {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub sampled: bool,
    pub trace_state: Option<String>,
}

impl Parent {
    /// The client's context, when it sent exactly one valid `traceparent` (W3C Trace Context
    /// level 1: lowercase hex, ids not all zero, version `ff` invalid, a later version's extra
    /// fields ignored). An invalid one starts a new trace, and its `tracestate` is dropped with it.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let mut values = headers.get_all(TRACEPARENT).iter();
        let value = values.next()?.to_str().ok()?.trim();
        if values.next().is_some() {
            return None;
        }
        let b = value.as_bytes();
        let version = hex_bytes::<1>(b.get(0..2)?)?[0];
        let well_formed = match version {
            0xff => false,
            0 => b.len() == 55,
            _ => b.len() == 55 || (b.len() > 55 && b[55] == b'-'),
        };
        if !well_formed || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let trace_id = hex_bytes::<16>(&b[3..35]).filter(|t| *t != [0; 16])?;
        let span_id = hex_bytes::<8>(&b[36..52]).filter(|s| *s != [0; 8])?;
        let flags = hex_bytes::<1>(&b[53..55])?[0];
        let states: Vec<&str> = headers
            .get_all(TRACESTATE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .collect();
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
            trace_state: (!states.is_empty()).then(|| states.join(",")),
        })
    }
}

/// Lowercase hex only, as `traceparent` requires.
fn hex_bytes<const N: usize>(text: &[u8]) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in text.chunks_exact(2).enumerate() {
        out[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// Counters of the export, shown in `/healthz`.
#[derive(Debug, Default)]
pub struct Counters {
    pub exported: AtomicU64,
    /// Dropped because the queue was full (or the exporter had stopped).
    pub dropped: AtomicU64,
    /// Lost because the collector refused them for good (a 4xx other than 429, or unanswered at
    /// shutdown).
    pub failed: AtomicU64,
    /// Export requests that failed (unreachable, timed out, or not a 2xx), each followed by a backoff.
    pub failed_exports: AtomicU64,
}

impl Counters {
    /// The Prometheus text of these counters (appended to `/metrics` while tracing is on).
    pub fn render_prometheus(&self) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "# HELP reprise_trace_spans_total Spans by what became of them: exported, dropped (the export queue was full) or failed (refused by the collector).\n\
             # TYPE reprise_trace_spans_total counter\n\
             reprise_trace_spans_total{{result=\"exported\"}} {}\n\
             reprise_trace_spans_total{{result=\"dropped\"}} {}\n\
             reprise_trace_spans_total{{result=\"failed\"}} {}\n\
             # HELP reprise_trace_export_failures_total Export requests to the OTLP collector that failed, each followed by a backoff.\n\
             # TYPE reprise_trace_export_failures_total counter\n\
             reprise_trace_export_failures_total {}\n",
            get(&self.exported),
            get(&self.dropped),
            get(&self.failed),
            get(&self.failed_exports),
        )
    }
}

enum Message {
    Spans(Vec<SpanData>),
    /// Send what is queued, then stop; answered when done.
    Shutdown(oneshot::Sender<()>),
}

/// The running exporter: a bounded queue in front of a thread that batches and sends.
pub struct Exporter {
    tx: mpsc::UnboundedSender<Message>,
    /// Spans queued or held by the thread and not yet sent: the queue's bound is kept on this count.
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    pub counters: Arc<Counters>,
    pub endpoint: String,
}

impl Exporter {
    /// Starts the export thread (it has a small runtime of its own, so that exporting competes
    /// with no request for the gateway's workers and works whatever runtime the caller runs).
    pub fn start(settings: Settings) -> std::io::Result<Arc<Self>> {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let counters = Arc::new(Counters::default());
        let endpoint = settings.endpoint.to_string();
        let max_queue = settings.max_queue;
        let worker = Worker {
            rx,
            queued: queued.clone(),
            counters: counters.clone(),
            resource: resource_json(&settings.resource),
            settings,
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("reprise-otlp".into())
            .spawn(move || runtime.block_on(worker.run()))?;
        tracing::info!(endpoint = %endpoint, "exporting traces over OTLP/HTTP");
        Ok(Arc::new(Self {
            tx,
            queued,
            max_queue,
            counters,
            endpoint,
        }))
    }

    /// The trace context of a request that just arrived: joined to the client's `traceparent`
    /// when it sent a valid one, else a new trace. `http_route` is the route's template.
    pub fn begin(self: &Arc<Self>, headers: &HeaderMap, http_route: String) -> RequestTrace {
        let parent = Parent::from_headers(headers);
        RequestTrace {
            exporter: self.clone(),
            trace_id: parent.as_ref().map_or_else(new_trace_id, |p| p.trace_id),
            span_id: new_span_id(),
            sampled: parent.as_ref().is_none_or(|p| p.sampled),
            parent,
            http_route,
        }
    }

    /// Queues one request's spans, or drops and counts them when the queue is full: the request
    /// that produced them never waits for the exporter.
    fn submit(&self, spans: Vec<SpanData>) {
        let n = spans.len();
        let before = self.queued.fetch_add(n, Ordering::AcqRel);
        if before + n > self.max_queue {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            self.drop_spans(n);
            return;
        }
        if self.tx.send(Message::Spans(spans)).is_err() {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            self.drop_spans(n);
        }
    }

    fn drop_spans(&self, n: usize) {
        let before = self.counters.dropped.fetch_add(n as u64, Ordering::Relaxed);
        // Loud once, then at every power of two, so a long overload does not flood the log.
        let after = before + n as u64;
        if before == 0 || (before.leading_zeros() != after.leading_zeros()) {
            tracing::warn!(
                dropped = after,
                "trace export queue full: spans dropped (the collector is slow or unreachable)"
            );
        }
    }

    /// Sends every queued span, waiting at most `grace`; spans finished later are dropped.
    pub async fn shutdown(&self, grace: Duration) {
        let (done_tx, done_rx) = oneshot::channel();
        if self.tx.send(Message::Shutdown(done_tx)).is_err() {
            return;
        }
        if tokio::time::timeout(grace, done_rx).await.is_err() {
            tracing::warn!(
                grace_ms = grace.as_millis() as u64,
                "traces not flushed within the grace period"
            );
        }
    }
}

/// The trace context of one request, carried from arrival to its record.
#[derive(Clone)]
pub struct RequestTrace {
    exporter: Arc<Exporter>,
    pub trace_id: [u8; 16],
    /// The request span's id: the upstream's parent.
    pub span_id: [u8; 8],
    /// False when the client's `traceparent` says not sampled: the context is still passed on
    /// (with the flag), but the spans are not exported.
    pub sampled: bool,
    pub parent: Option<Parent>,
    http_route: String,
}

impl RequestTrace {
    /// The `traceparent` sent upstream: this trace, with the request span as the parent.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{}",
            hex(&self.trace_id),
            hex(&self.span_id),
            if self.sampled { "01" } else { "00" }
        )
    }

    /// Replaces the client's `traceparent` (and `tracestate`) in the upstream request's headers.
    pub fn inject(&self, headers: &mut HeaderMap) {
        headers.remove(TRACESTATE);
        if let Ok(v) = HeaderValue::from_str(&self.traceparent()) {
            headers.insert(HeaderName::from_static(TRACEPARENT), v);
        }
        if let Some(state) = self.parent.as_ref().and_then(|p| p.trace_state.as_deref()) {
            if let Ok(v) = HeaderValue::from_str(state) {
                headers.insert(HeaderName::from_static(TRACESTATE), v);
            }
        }
    }

    /// Builds the request's spans from its record and clock and queues them for export: the
    /// request span (kind server) and one child per phase that happened, at the instants measured.
    pub fn end(self, record: &RequestRecord, clock: &PhaseClock) {
        let method = record.method.as_str();
        if !self.sampled {
            return;
        }
        let at = Timeline::now();
        let end = clock.delivered.unwrap_or_else(Instant::now);
        let mut attrs = vec![
            ("http.request.method", json!(method)),
            ("http.route", json!(self.http_route)),
            ("http.response.status_code", int(u64::from(record.status))),
            ("reprise.request_id", json!(record.id)),
            ("reprise.route", json!(record.route)),
            ("reprise.stream", json!(record.stream)),
            ("reprise.cache", json!(record.cache.as_str())),
            (
                "reprise.completion",
                json!(completion_name(record.completion)),
            ),
            ("reprise.tokens", int(record.phases.tokens)),
        ];
        let optional = [
            (
                "gen_ai.request.model",
                record.model.as_ref().map(|m| json!(m)),
            ),
            ("reprise.entry_id", record.entry.as_ref().map(|e| json!(e))),
            (
                "reprise.similarity",
                record.similarity.map(|s| json!(round4(s))),
            ),
            ("reprise.nearest", record.nearest.map(|s| json!(round4(s)))),
            ("reprise.guard", record.guard.as_ref().map(|g| json!(g))),
            ("reprise.ttft_ms", record.phases.ttft_ms.map(|t| json!(t))),
            (
                "reprise.ttft_saved_ms",
                record.ttft_saved_ms.map(|t| json!(t)),
            ),
            (
                "gen_ai.usage.output_tokens",
                record.phases.completion_tokens.map(int),
            ),
            ("error.type", record.error.as_ref().map(|e| json!(e))),
        ];
        attrs.extend(optional.into_iter().filter_map(|(k, v)| Some((k, v?))));
        let failed = record.status >= 500 || record.completion == Completion::StreamFailed;
        let mut spans = Vec::with_capacity(9);
        spans.push(SpanData {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent.as_ref().map(|p| p.span_id),
            trace_state: self.parent.and_then(|p| p.trace_state),
            name: format!("{method} {}", self.http_route),
            kind: SERVER,
            start_ns: at.unix_ns(clock.start),
            end_ns: at.unix_ns(end),
            attrs,
            error: failed.then(|| {
                record
                    .error
                    .clone()
                    .unwrap_or_else(|| completion_name(record.completion).to_owned())
            }),
        });
        for (name, from, to) in phases(clock, end) {
            spans.push(SpanData {
                trace_id: self.trace_id,
                span_id: new_span_id(),
                parent: Some(self.span_id),
                trace_state: None,
                name: name.to_owned(),
                kind: INTERNAL,
                start_ns: at.unix_ns(from),
                end_ns: at.unix_ns(to),
                attrs: if name == "decode" {
                    vec![("reprise.tokens", int(record.phases.tokens))]
                } else {
                    Vec::new()
                },
                error: None,
            });
        }
        self.exporter.submit(spans);
    }
}

/// The phases that happened, with the instants [`PhaseClock::phases`] measures them between.
fn phases(clock: &PhaseClock, end: Instant) -> Vec<(&'static str, Instant, Instant)> {
    let pair = |from: Option<Instant>, to: Option<Instant>| from.zip(to).filter(|(a, b)| a <= b);
    let after_lookup = clock.looked_up.or(clock.body_read);
    // Embedding and search are timed as durations, back to back from when the semantic stage began.
    // Checked all the way: this runs where a panic would lose the request's record.
    let after = |from: Instant, ms: f64| {
        let d = Duration::try_from_secs_f64(ms / 1000.0).ok()?;
        Some((from, from.checked_add(d)?))
    };
    let embed = clock
        .semantic_began
        .zip(clock.embed_ms)
        .and_then(|(began, ms)| after(began, ms));
    let search = embed
        .zip(clock.search_ms)
        .and_then(|((_, from), ms)| after(from, ms));
    [
        ("ingress", pair(Some(clock.start), clock.body_read)),
        ("lookup", pair(clock.body_read, clock.looked_up)),
        ("embed", embed),
        ("search", search),
        ("upstream_send", pair(after_lookup, clock.upstream_sent)),
        (
            "ttft",
            pair(clock.upstream_sent.or(clock.body_read), clock.first_token),
        ),
        ("decode", pair(clock.first_token, clock.last_token)),
        ("downstream", pair(clock.last_upstream_byte, Some(end))),
    ]
    .into_iter()
    .filter_map(|(name, span)| span.map(|(a, b)| (name, a, b)))
    .collect()
}

fn completion_name(c: Completion) -> &'static str {
    match c {
        Completion::Complete => "complete",
        Completion::GatewayError => "gateway_error",
        Completion::UpstreamError => "upstream_error",
        Completion::StreamFailed => "stream_failed",
        Completion::ClientDisconnected => "client_disconnected",
    }
}

fn round4(x: f32) -> f64 {
    // f32 → f64 would print 0.8999999761581421 for 0.9.
    (f64::from(x) * 1e4).round() / 1e4
}

/// OTLP/JSON carries 64-bit integers as strings (the protobuf JSON mapping).
fn int(n: u64) -> Value {
    json!({ "intValue": n.to_string() })
}

fn new_trace_id() -> [u8; 16] {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return id;
        }
    }
}

fn new_span_id() -> [u8; 8] {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return id;
        }
    }
}

/// Maps the monotonic instants of a clock to Unix time, from one reading of both clocks.
struct Timeline {
    instant: Instant,
    unix_ns: u64,
}

impl Timeline {
    fn now() -> Self {
        let unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Self {
            instant: Instant::now(),
            unix_ns,
        }
    }

    fn unix_ns(&self, at: Instant) -> u64 {
        match at.checked_duration_since(self.instant) {
            Some(ahead) => self.unix_ns.saturating_add(ahead.as_nanos() as u64),
            None => self
                .unix_ns
                .saturating_sub(self.instant.duration_since(at).as_nanos() as u64),
        }
    }
}

const INTERNAL: u8 = 1;
const SERVER: u8 = 2;

/// One finished span, ready to encode.
struct SpanData {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    trace_state: Option<String>,
    name: String,
    kind: u8,
    start_ns: u64,
    end_ns: u64,
    /// Attribute values already in OTLP/JSON's `AnyValue` shape, or plain JSON to wrap.
    attrs: Vec<(&'static str, Value)>,
    /// Set when the span ended in error (status code ERROR), with its message.
    error: Option<String>,
}

impl SpanData {
    fn to_json(&self) -> Value {
        let attributes: Vec<Value> = self
            .attrs
            .iter()
            .map(|(key, value)| json!({"key": key, "value": any_value(value)}))
            .collect();
        let mut span = json!({
            "traceId": hex(&self.trace_id),
            "spanId": hex(&self.span_id),
            "name": self.name,
            "kind": self.kind,
            "startTimeUnixNano": self.start_ns.to_string(),
            "endTimeUnixNano": self.end_ns.to_string(),
            "attributes": attributes,
        });
        if let Some(parent) = self.parent {
            span["parentSpanId"] = json!(hex(&parent));
        }
        if let Some(state) = &self.trace_state {
            span["traceState"] = json!(state);
        }
        if let Some(message) = &self.error {
            span["status"] = json!({"code": 2, "message": message});
        }
        span
    }
}

fn any_value(value: &Value) -> Value {
    match value {
        Value::Object(o) if o.contains_key("intValue") => value.clone(),
        Value::String(s) => json!({ "stringValue": s }),
        Value::Bool(b) => json!({ "boolValue": b }),
        Value::Number(n) => json!({ "doubleValue": n.as_f64() }),
        other => json!({ "stringValue": other.to_string() }),
    }
}

fn resource_json(resource: &[(String, String)]) -> Value {
    let attributes: Vec<Value> = resource
        .iter()
        .map(|(k, v)| json!({"key": k, "value": {"stringValue": v}}))
        .collect();
    json!({ "attributes": attributes })
}

/// The export thread's side of the queue.
struct Worker {
    rx: mpsc::UnboundedReceiver<Message>,
    queued: Arc<AtomicUsize>,
    counters: Arc<Counters>,
    resource: Value,
    settings: Settings,
}

/// How one export request went.
enum Sent {
    Ok,
    /// Worth trying again later (unreachable, timed out, 429, 502, 503, 504, as OTLP/HTTP
    /// specifies), after at least the collector's `Retry-After` when it sent one.
    Retry(String, Option<Duration>),
    /// Refused for good: the batch is dropped (and the next one still waits out a backoff).
    Refused(String),
}

/// When the next export may be tried, after failures in a row.
struct Backoff {
    delay: Duration,
    until: Option<Instant>,
    /// Failed export requests in the current spell, and when it was last logged.
    failures: u64,
    logged_at: Option<Instant>,
}

impl Backoff {
    fn new() -> Self {
        Self {
            delay: BACKOFF_FIRST,
            until: None,
            failures: 0,
            logged_at: None,
        }
    }

    fn ready(&self) -> bool {
        self.until.is_none_or(|until| Instant::now() >= until)
    }

    /// After a failure: waits half to all of the current delay (jitter, so that replicas that lost
    /// the same collector do not retry in step), at least `at_least`, then doubles the delay.
    fn failed(&mut self, at_least: Option<Duration>) -> Duration {
        let wait = self
            .delay
            .mul_f64(rand::random_range(0.5..=1.0))
            .max(at_least.unwrap_or_default())
            .min(BACKOFF_MAX);
        self.until = Some(Instant::now() + wait);
        self.delay = (self.delay * 2).min(BACKOFF_MAX);
        self.failures += 1;
        wait
    }

    /// Whether to log this failure: the first of a spell, then one a [`LOG_EVERY`].
    fn should_log(&mut self) -> bool {
        let now = Instant::now();
        if self.logged_at.is_some_and(|at| now - at < LOG_EVERY) {
            return false;
        }
        self.logged_at = Some(now);
        true
    }

    /// After a success: the spell, if any, ends; returns how many failures it had.
    fn succeeded(&mut self) -> u64 {
        let failures = self.failures;
        *self = Self::new();
        failures
    }
}

impl Worker {
    async fn run(mut self) {
        let client = match reqwest::Client::builder()
            .timeout(self.settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
        {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "cannot build the trace exporter's client: traces are dropped");
                return;
            }
        };
        let mut pending: VecDeque<SpanData> = VecDeque::new();
        let mut backoff = Backoff::new();
        let mut tick = tokio::time::interval(self.settings.delay);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Backing off with spans to send: wake when the wait is over.
            let retry_at = backoff.until.filter(|_| !pending.is_empty());
            let retry = tokio::time::sleep_until(retry_at.unwrap_or_else(Instant::now).into());
            tokio::select! {
                message = self.rx.recv() => match message {
                    Some(Message::Spans(spans)) => {
                        pending.extend(spans);
                        while pending.len() >= self.settings.max_batch && backoff.ready() {
                            self.export(&client, &mut pending, &mut backoff).await;
                        }
                    }
                    Some(Message::Shutdown(done)) => {
                        // What was queued before the shutdown goes out, then nothing more.
                        self.rx.close();
                        while let Ok(Message::Spans(spans)) = self.rx.try_recv() {
                            pending.extend(spans);
                        }
                        // One try, without waiting out a backoff (the grace period is short):
                        // a collector that fails now loses what is left.
                        backoff.until = None;
                        while !pending.is_empty() && backoff.ready() {
                            self.export(&client, &mut pending, &mut backoff).await;
                        }
                        let lost = pending.len();
                        self.take(&mut pending, lost);
                        self.counters.failed.fetch_add(lost as u64, Ordering::Relaxed);
                        let _ = done.send(());
                        return;
                    }
                    None => return,
                },
                _ = tick.tick() => {
                    while !pending.is_empty() && backoff.ready() {
                        self.export(&client, &mut pending, &mut backoff).await;
                    }
                }
                _ = retry, if retry_at.is_some() => {
                    while !pending.is_empty() && backoff.ready() {
                        self.export(&client, &mut pending, &mut backoff).await;
                    }
                }
            }
        }
    }

    /// Removes `n` spans from the front of `pending`, freeing their room in the queue.
    fn take(&self, pending: &mut VecDeque<SpanData>, n: usize) {
        pending.drain(..n);
        self.queued.fetch_sub(n, Ordering::AcqRel);
    }

    /// Sends up to one batch from the front of `pending`. A batch worth retrying stays at the
    /// front (the queue's bound holds it with the rest: what arrives beyond it is dropped); a
    /// batch refused for good is counted and dropped. Any failure starts or extends the backoff.
    async fn export(
        &self,
        client: &reqwest::Client,
        pending: &mut VecDeque<SpanData>,
        backoff: &mut Backoff,
    ) {
        let n = pending.len().min(self.settings.max_batch);
        let spans: Vec<Value> = pending.iter().take(n).map(SpanData::to_json).collect();
        let body = json!({
            "resourceSpans": [{
                "resource": self.resource,
                "scopeSpans": [{
                    "scope": {"name": "reprise", "version": env!("CARGO_PKG_VERSION")},
                    "spans": spans,
                }],
            }],
        });
        let sent = client
            .post(self.settings.endpoint.clone())
            .headers(self.settings.headers.clone())
            .header(axum::http::header::CONTENT_TYPE, "application/json")
            .body(body.to_string())
            .send()
            .await;
        let outcome = match sent {
            Ok(r) if r.status().is_success() => Sent::Ok,
            Ok(r) => {
                let why = format!("the collector answered {}", r.status());
                match r.status().as_u16() {
                    429 | 502 | 503 | 504 => Sent::Retry(why, retry_after(r.headers())),
                    _ => Sent::Refused(why),
                }
            }
            Err(e) => Sent::Retry(e.to_string(), None),
        };
        let why = match outcome {
            Sent::Ok => {
                self.take(pending, n);
                self.counters
                    .exported
                    .fetch_add(n as u64, Ordering::Relaxed);
                let failures = backoff.succeeded();
                if failures > 0 {
                    tracing::info!(endpoint = %self.settings.endpoint, failures, "trace export works again");
                }
                return;
            }
            Sent::Refused(why) => {
                self.take(pending, n);
                self.counters.failed.fetch_add(n as u64, Ordering::Relaxed);
                backoff.failed(None);
                why
            }
            Sent::Retry(why, at_least) => {
                backoff.failed(at_least);
                why
            }
        };
        let failures = self.counters.failed_exports.fetch_add(1, Ordering::Relaxed) + 1;
        if backoff.should_log() {
            tracing::warn!(
                endpoint = %self.settings.endpoint,
                failures,
                queued = self.queued.load(Ordering::Relaxed),
                "trace export failed: {why}; retrying with backoff (up to {}s), spans beyond the queue are dropped",
                BACKOFF_MAX.as_secs()
            );
        }
    }
}

/// A `Retry-After` in seconds (the form collectors send), capped by [`BACKOFF_MAX`].
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(BACKOFF_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        map
    }

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_is_parsed_per_w3c() {
        let p = Parent::from_headers(&headers(&[
            ("traceparent", VALID),
            ("tracestate", "congo=t61rcWkgMzE"),
            ("tracestate", "rojo=00f067aa0ba902b7"),
        ]))
        .expect("valid");
        assert_eq!(hex(&p.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&p.span_id), "00f067aa0ba902b7");
        assert!(p.sampled);
        assert_eq!(
            p.trace_state.as_deref(),
            Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        );
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(
            !Parent::from_headers(&headers(&[("traceparent", unsampled)]))
                .expect("valid")
                .sampled
        );
        // A later version may append fields after a dash.
        let future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        assert!(Parent::from_headers(&headers(&[("traceparent", future)])).is_some());
        for bad in [
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "garbage",
        ] {
            assert!(
                Parent::from_headers(&headers(&[("traceparent", bad)])).is_none(),
                "{bad}"
            );
        }
        // Two traceparents: ambiguous, so a new trace.
        assert!(
            Parent::from_headers(&headers(&[("traceparent", VALID), ("traceparent", VALID)]))
                .is_none()
        );
    }

    #[test]
    fn settings_follow_the_flag_then_the_standard_variables() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert!(Settings::resolve(None, env(&[])).expect("ok").is_none());
        let s = Settings::resolve(Some("http://127.0.0.1:4318"), env(&[]))
            .expect("ok")
            .expect("on");
        assert_eq!(s.endpoint.as_str(), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(s.resource[0], ("service.name".into(), "reprise".into()));
        let s = Settings::resolve(
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/base/"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "x-honeycomb-team=abc%3D,x-b=2",
                ),
                ("OTEL_SERVICE_NAME", "gateway-eu"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "deployment.environment=prod,service.name=x",
                ),
                ("OTEL_BSP_SCHEDULE_DELAY", "200"),
            ]),
        )
        .expect("ok")
        .expect("on");
        assert_eq!(s.endpoint.as_str(), "http://collector:4318/base/v1/traces");
        assert_eq!(s.headers["x-honeycomb-team"], "abc=");
        assert!(s.headers["x-honeycomb-team"].is_sensitive());
        assert_eq!(
            s.resource,
            vec![
                ("service.name".to_owned(), "gateway-eu".to_owned()),
                ("deployment.environment".to_owned(), "prod".to_owned()),
                (
                    "service.version".to_owned(),
                    env!("CARGO_PKG_VERSION").to_owned()
                ),
            ]
        );
        assert_eq!(s.delay, Duration::from_millis(200));
        // The traces variable is the whole URL; the SDK switch turns everything off.
        let s = Settings::resolve(
            None,
            env(&[
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom"),
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:1"),
            ]),
        )
        .expect("ok")
        .expect("on");
        assert_eq!(s.endpoint.as_str(), "http://c:4318/custom");
        assert!(Settings::resolve(
            Some("http://127.0.0.1:4318"),
            env(&[("OTEL_SDK_DISABLED", "true")])
        )
        .expect("ok")
        .is_none());
        for bad in [
            Settings::resolve(Some("not a url"), env(&[])),
            Settings::resolve(Some("ftp://x"), env(&[])),
            Settings::resolve(
                Some("http://x"),
                env(&[("OTEL_BSP_MAX_QUEUE_SIZE", "lots")]),
            ),
        ] {
            assert!(bad.is_err());
        }
        // A header value is never echoed in the error: it is often a key.
        let err = Settings::resolve(
            Some("http://x"),
            env(&[(
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=sk-secret%0Amore",
            )]),
        )
        .expect_err("invalid");
        assert!(!err.contains("sk-secret"), "{err}");
    }

    fn span() -> SpanData {
        SpanData {
            trace_id: new_trace_id(),
            span_id: new_span_id(),
            parent: None,
            trace_state: None,
            name: "POST /v1/chat/completions".into(),
            kind: SERVER,
            start_ns: 1,
            end_ns: 2,
            attrs: Vec::new(),
            error: None,
        }
    }

    #[test]
    fn a_full_queue_drops_and_counts_spans_instead_of_waiting() {
        // A collector that accepts connections and never answers: the export thread is stuck on
        // its first batch, so what follows piles up in the queue.
        let collector = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let settings = Settings::resolve(
            Some(&format!("http://{}", collector.local_addr().expect("addr"))),
            |name| match name {
                "OTEL_BSP_MAX_QUEUE_SIZE" => Some("3".into()),
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" => Some("1".into()),
                "OTEL_EXPORTER_OTLP_TIMEOUT" => Some("60000".into()),
                _ => None,
            },
        )
        .expect("settings")
        .expect("on");
        let exporter = Exporter::start(settings).expect("start");
        for _ in 0..10 {
            exporter.submit(vec![span()]);
        }
        // 3 queued, and at most 1 more taken by the stuck thread: the rest were dropped.
        let dropped = exporter.counters.dropped.load(Ordering::Relaxed);
        assert!((6..=7).contains(&dropped), "dropped {dropped}");
        assert!(exporter.queued.load(Ordering::Relaxed) <= 3);
        assert_eq!(exporter.counters.exported.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    #[allow(
        clippy::disallowed_methods,
        reason = "the test's collector is a server beside the code under test and ends with it"
    )]
    async fn shutdown_sends_what_is_queued_without_waiting_for_the_schedule() {
        let received = Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
        let kept = received.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                let kept = kept.clone();
                async move {
                    kept.lock().expect("lock").push(body);
                    "{}"
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        // A schedule far longer than the test: only the shutdown can have sent the spans.
        let settings = Settings::resolve(Some(&format!("http://{addr}")), |name| {
            (name == "OTEL_BSP_SCHEDULE_DELAY").then(|| "3600000".to_owned())
        })
        .expect("settings")
        .expect("on");
        let exporter = Exporter::start(settings).expect("start");
        // The interval's first tick is immediate: let it pass before queueing.
        tokio::time::sleep(Duration::from_millis(50)).await;
        for _ in 0..3 {
            exporter.submit(vec![span(), span()]);
        }
        exporter.shutdown(Duration::from_secs(10)).await;
        let received = received.lock().expect("lock");
        let spans: usize = received
            .iter()
            .map(|body| {
                body["resourceSpans"][0]["scopeSpans"][0]["spans"]
                    .as_array()
                    .map_or(0, Vec::len)
            })
            .sum();
        assert_eq!(spans, 6);
        assert_eq!(exporter.counters.exported.load(Ordering::Relaxed), 6);
        assert_eq!(
            received[0]["resourceSpans"][0]["resource"]["attributes"][0],
            json!({"key": "service.name", "value": {"stringValue": "reprise"}})
        );
        // After shutdown nothing more is queued: a late span is counted as dropped.
        exporter.submit(vec![span()]);
        assert_eq!(exporter.counters.dropped.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    #[allow(
        clippy::disallowed_methods,
        reason = "the test's collector is a server beside the code under test and ends with it"
    )]
    async fn a_failing_collector_is_retried_with_backoff_and_exports_resume_when_it_is_back() {
        use std::sync::atomic::AtomicBool;
        // A collector answering 503 until told otherwise, counting every export request and
        // every span it accepted.
        let attempts = Arc::new(AtomicU64::new(0));
        let accepted = Arc::new(AtomicU64::new(0));
        let healthy = Arc::new(AtomicBool::new(false));
        let (a, s, h) = (attempts.clone(), accepted.clone(), healthy.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                let (a, s, h) = (a.clone(), s.clone(), h.clone());
                async move {
                    a.fetch_add(1, Ordering::Relaxed);
                    if !h.load(Ordering::Relaxed) {
                        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, "busy");
                    }
                    let n = body["resourceSpans"][0]["scopeSpans"][0]["spans"]
                        .as_array()
                        .map_or(0, Vec::len);
                    s.fetch_add(n as u64, Ordering::Relaxed);
                    (axum::http::StatusCode::OK, "{}")
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let settings = Settings::resolve(Some(&format!("http://{addr}")), |name| match name {
            "OTEL_BSP_MAX_QUEUE_SIZE" => Some("50".into()),
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE" => Some("1".into()),
            "OTEL_BSP_SCHEDULE_DELAY" => Some("10".into()),
            _ => None,
        })
        .expect("settings")
        .expect("on");
        let exporter = Exporter::start(settings).expect("start");
        // Two seconds of a span a millisecond: each one a full batch, so without a backoff each
        // would be an export request of its own.
        let began = Instant::now();
        let mut submitted = 0u64;
        while began.elapsed() < Duration::from_secs(2) {
            exporter.submit(vec![span()]);
            submitted += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let tried = attempts.load(Ordering::Relaxed);
        assert!(
            (1..=12).contains(&tried),
            "{tried} export requests for {submitted} spans in 2 s: no backoff"
        );
        // The queue held at most its cap meanwhile; what came beyond it was dropped and counted.
        let dropped = exporter.counters.dropped.load(Ordering::Relaxed);
        assert!(
            dropped >= submitted - 50 - tried,
            "dropped {dropped} of {submitted}"
        );
        assert_eq!(exporter.counters.exported.load(Ordering::Relaxed), 0);

        // Back: the spans kept in the queue go out at the next retry, new ones after them.
        healthy.store(true, Ordering::Relaxed);
        exporter.submit(vec![span()]);
        let mut resumed = false;
        for _ in 0..4000 {
            if accepted.load(Ordering::Relaxed) > 0 {
                resumed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(resumed, "exports never resumed");
        exporter.shutdown(Duration::from_secs(10)).await;
        let c = &exporter.counters;
        let (exported, dropped, failed) = (
            c.exported.load(Ordering::Relaxed),
            c.dropped.load(Ordering::Relaxed),
            c.failed.load(Ordering::Relaxed),
        );
        assert_eq!(exported, accepted.load(Ordering::Relaxed));
        assert!(
            exported >= 2,
            "the queued spans were kept for the retry: {exported}"
        );
        assert_eq!(
            exported + dropped + failed,
            submitted + 1,
            "every span is exported, dropped or failed"
        );
    }

    #[test]
    fn an_invalid_otlp_endpoint_stops_the_start_naming_the_field() {
        let mut config = crate::config::Config {
            otlp_endpoint: Some("collector:4318".into()),
            ..crate::config::Config::default()
        };
        let err = config.validate().expect_err("invalid").to_string();
        assert!(err.contains("otlp_endpoint"), "{err}");
        config.otlp_endpoint = Some("http://127.0.0.1:4318".into());
        config.validate().expect("valid");
    }

    #[test]
    fn spans_encode_as_otlp_json() {
        let mut s = span();
        s.parent = Some([0xab; 8]);
        s.trace_state = Some("congo=t61rcWkgMzE".into());
        s.attrs = vec![
            ("reprise.cache", json!("hit")),
            ("reprise.stream", json!(true)),
            ("reprise.similarity", json!(0.93)),
            ("http.response.status_code", int(200)),
        ];
        s.error = Some("upstream_timeout".into());
        let v = s.to_json();
        assert_eq!(v["traceId"], hex(&s.trace_id));
        assert_eq!(v["parentSpanId"], "abababababababab");
        assert_eq!(v["traceState"], "congo=t61rcWkgMzE");
        assert_eq!(v["kind"], 2);
        assert_eq!(v["startTimeUnixNano"], "1");
        assert_eq!(
            v["attributes"],
            json!([
                {"key": "reprise.cache", "value": {"stringValue": "hit"}},
                {"key": "reprise.stream", "value": {"boolValue": true}},
                {"key": "reprise.similarity", "value": {"doubleValue": 0.93}},
                {"key": "http.response.status_code", "value": {"intValue": "200"}},
            ])
        );
        assert_eq!(
            v["status"],
            json!({"code": 2, "message": "upstream_timeout"})
        );
    }

    #[test]
    fn phase_spans_use_the_measured_instants() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut clock = PhaseClock::start(t0);
        clock.body_read = Some(at(1));
        clock.semantic_began = Some(at(2));
        clock.embed_ms = Some(3.0);
        clock.search_ms = Some(1.0);
        clock.looked_up = Some(at(7));
        clock.upstream_sent = Some(at(9));
        clock.tokens(at(50), 1);
        clock.tokens(at(60), 1);
        clock.last_upstream_byte = Some(at(61));
        let spans = phases(&clock, at(62));
        let named: Vec<(&str, Duration, Duration)> = spans
            .iter()
            .map(|(n, a, b)| (*n, *a - t0, *b - t0))
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(
            named,
            vec![
                ("ingress", ms(0), ms(1)),
                ("lookup", ms(1), ms(7)),
                ("embed", ms(2), ms(5)),
                ("search", ms(5), ms(6)),
                ("upstream_send", ms(7), ms(9)),
                ("ttft", ms(9), ms(50)),
                ("decode", ms(50), ms(60)),
                ("downstream", ms(61), ms(62)),
            ]
        );
    }
}
