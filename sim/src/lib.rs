//! `reprise-sim`: a simulated OpenAI-compatible upstream for tests, demos and benchmarks.
//!
//! It answers `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/models` and the
//! Responses API (`/v1/responses`, with stored responses: see [`responses`]) and Anthropic's
//! Messages API (`/v1/messages`, with prompt caching echoed in `usage`: see [`messages`]) with
//! deterministic text (a hash of the prompt picks the words), paced like a real server: a time to
//! first token that grows with prompt length (prefill) and a fixed inter-token latency (decode),
//! both with optional jitter. Faults can be injected globally (`--fault`) or per request with the
//! `x-sim-fault` header, and `GET /stats` counts what was served (and keeps the last request's
//! headers) so tests can prove whether and how a gateway called upstream. It is not a model and
//! must never be mistaken for one.
//!
//! Faults (`x-sim-fault: NAME`, or `--fault NAME` for all requests): `status=CODE` (`overloaded`
//! and `rate-limit` name 529 and 429), `hang`,
//! `cut[=N]`, `abort[=N]` (a non-streamed body breaks halfway), `malformed[=N]`, `error-event[=N]` (a `data: {"error":…}` event, then
//! stop), `bad-tool-args`, `redirect` (a 302 to `/v1/sim/redirected`, which answers a `GET` with a
//! complete chat answer), `content-filter` (the last choice stops with `content_filter`),
//! `error-frame[=N]` (an `event: error` frame, then a clean end), `bad-utf8[=N]` (bytes that are not
//! UTF-8 in the answer's text), `stall-at-done` (a stream stops before `[DONE]`, finish reason sent,
//! connection open), and the transport faults, header only: `close-early` (the request is
//! read, then the connection closes without a response) and `garbage-status` (a status line that is
//! not HTTP, then close). N counts the content tokens sent before the fault (default 2).
//! `x-sim-usage: ignore` answers a stream as a server that ignores `stream_options.include_usage`;
//! `x-sim-usage: nulls`, as one that puts `"usage": null` on every chunk even when not asked.
//! A request with `Origin` gets CORS headers (any origin), unless it says `x-sim-cors: deny`.
//!
//! A chat completion that carries a gateway's judge block is answered by [`judge`] instead, from
//! labeled pairs at a stated accuracy (`judge_labels`, `judge_accuracy`, `judge_seed`,
//! `judge_latency_ms`).

mod fault;
pub mod judge;
mod messages;
mod responses;
mod text;
mod transport;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use bytes::Bytes;
use futures_util::stream;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::time::Instant;

pub use fault::Fault;
pub use judge::{JudgeLabels, Verdict};
use text::Generation;

/// Latency presets taken from public figures for different classes of serving stacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// Wafer-scale inference: ~1,000 tok/s decode, ~80 ms TTFT.
    WaferScale,
    /// A cloud GPU API: ~120 tok/s, ~400 ms TTFT.
    CloudGpu,
    /// A reasoning model: ~80 tok/s, several seconds before the first visible token.
    Reasoning,
    /// A local quantized model: ~60 tok/s, ~200 ms TTFT.
    LocalQuantized,
}

impl Profile {
    /// (base TTFT ms, inter-token latency ms, prefill tokens/s).
    fn figures(self) -> (f64, f64, f64) {
        match self {
            Self::WaferScale => (80.0, 1.0, 20_000.0),
            Self::CloudGpu => (400.0, 1000.0 / 120.0, 5_000.0),
            Self::Reasoning => (4_000.0, 12.5, 2_000.0),
            Self::LocalQuantized => (200.0, 1000.0 / 60.0, 500.0),
        }
    }
}

/// How the simulator paces and shapes its answers.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Time to first token before prefill is added, in ms.
    pub ttft_ms: f64,
    /// Inter-token latency in ms.
    pub itl_ms: f64,
    /// Completion tokens per answer (capped by the request's `max_tokens`).
    pub tokens: u32,
    /// Prefill speed: TTFT grows by prompt_tokens / this (0 turns prefill off).
    pub prefill_tokens_per_s: f64,
    /// Each delay is scaled by a random factor in [1 - jitter, 1 + jitter].
    pub jitter: f64,
    /// A fault applied to every request without an `x-sim-fault` header.
    pub fault: Option<Fault>,
    /// Dimensions of `/v1/embeddings` vectors when the request does not set `dimensions`.
    pub embedding_dims: usize,
    /// Labeled pairs that judge calls are answered from (see [`judge`]); `None`: every judged pair
    /// is unknown, so `different`.
    pub judge_labels: Option<JudgeLabels>,
    /// Share of known pairs judged right; the others are flipped same <-> different.
    pub judge_accuracy: f64,
    /// Seed of the deterministic per-pair draw that decides the flips.
    pub judge_seed: u64,
    /// Delay before a judge call is answered, in ms.
    pub judge_latency_ms: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            ttft_ms: 50.0,
            itl_ms: 5.0,
            tokens: 32,
            prefill_tokens_per_s: 0.0,
            jitter: 0.0,
            fault: None,
            embedding_dims: 32,
            judge_labels: None,
            judge_accuracy: 1.0,
            judge_seed: 0,
            judge_latency_ms: 0.0,
        }
    }
}

impl SimConfig {
    pub fn from_profile(profile: Profile) -> Self {
        let (ttft_ms, itl_ms, prefill) = profile.figures();
        Self {
            ttft_ms,
            itl_ms,
            prefill_tokens_per_s: prefill,
            tokens: 64,
            ..Self::default()
        }
    }
}

/// Counters behind `GET /stats`.
#[derive(Debug, Default)]
pub struct SimStats {
    chat: AtomicU64,
    completions: AtomicU64,
    embeddings: AtomicU64,
    models: AtomicU64,
    responses: AtomicU64,
    messages: AtomicU64,
    count_tokens: AtomicU64,
    cache_creations: AtomicU64,
    cache_reads: AtomicU64,
    last_authorization: Mutex<Option<String>>,
    last_headers: Mutex<Vec<(String, String)>>,
    judge_same: AtomicU64,
    judge_different: AtomicU64,
    judge_unsure: AtomicU64,
    judge_last_headers: Mutex<Vec<(String, String)>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Generation requests served (chat + completions + embeddings).
    pub requests: u64,
    pub chat_completions: u64,
    pub completions: u64,
    pub embeddings: u64,
    pub models: u64,
    /// `POST /v1/responses` requests (counted in `requests` too).
    #[serde(default)]
    pub responses: u64,
    /// `POST /v1/messages` requests (counted in `requests` too).
    #[serde(default)]
    pub messages: u64,
    /// `POST /v1/messages/count_tokens` requests (not in `requests`: nothing is generated).
    #[serde(default)]
    pub count_tokens: u64,
    /// Messages requests that wrote a prompt-cache entry (`cache_creation_input_tokens` > 0).
    #[serde(default)]
    pub cache_creations: u64,
    /// Messages requests that read one (`cache_read_input_tokens` > 0).
    #[serde(default)]
    pub cache_reads: u64,
    /// The `Authorization` header of the last request, so tests can check what a gateway forwarded.
    pub last_authorization: Option<String>,
    /// Every header of the last generation request, in order, repeated names included.
    #[serde(default)]
    pub last_headers: Vec<(String, String)>,
    /// Judge calls, counted here only (not in `requests` or `chat_completions`).
    #[serde(default)]
    pub judge: JudgeSnapshot,
}

/// Judge calls answered, by verdict, and the headers of the last one (a gateway's judge credential
/// and `x-reprise-judge` are checked there, apart from the generation requests').
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct JudgeSnapshot {
    pub calls: u64,
    pub same: u64,
    pub different: u64,
    pub unsure: u64,
    pub last_headers: Vec<(String, String)>,
}

impl SimStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let chat = self.chat.load(Ordering::SeqCst);
        let completions = self.completions.load(Ordering::SeqCst);
        let embeddings = self.embeddings.load(Ordering::SeqCst);
        let responses = self.responses.load(Ordering::SeqCst);
        let messages = self.messages.load(Ordering::SeqCst);
        let (same, different, unsure) = (
            self.judge_same.load(Ordering::SeqCst),
            self.judge_different.load(Ordering::SeqCst),
            self.judge_unsure.load(Ordering::SeqCst),
        );
        StatsSnapshot {
            requests: chat + completions + embeddings + responses + messages,
            responses,
            messages,
            count_tokens: self.count_tokens.load(Ordering::SeqCst),
            cache_creations: self.cache_creations.load(Ordering::SeqCst),
            cache_reads: self.cache_reads.load(Ordering::SeqCst),
            chat_completions: chat,
            completions,
            embeddings,
            models: self.models.load(Ordering::SeqCst),
            last_authorization: self
                .last_authorization
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            last_headers: self
                .last_headers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            judge: JudgeSnapshot {
                calls: same + different + unsure,
                same,
                different,
                unsure,
                last_headers: self
                    .judge_last_headers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
            },
        }
    }

    fn reset(&self) {
        for counter in [
            &self.chat,
            &self.completions,
            &self.embeddings,
            &self.models,
            &self.responses,
            &self.messages,
            &self.count_tokens,
            &self.cache_creations,
            &self.cache_reads,
            &self.judge_same,
            &self.judge_different,
            &self.judge_unsure,
        ] {
            counter.store(0, Ordering::SeqCst);
        }
    }

    fn note_verdict(&self, verdict: Verdict, headers: &HeaderMap) {
        let counter = match verdict {
            Verdict::Same => &self.judge_same,
            Verdict::Different => &self.judge_different,
            Verdict::Unsure => &self.judge_unsure,
        };
        counter.fetch_add(1, Ordering::SeqCst);
        *self
            .judge_last_headers
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = header_list(headers);
    }

    fn note_auth(&self, headers: &HeaderMap) {
        let auth = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        *self
            .last_authorization
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = auth;
        *self.last_headers.lock().unwrap_or_else(|e| e.into_inner()) = header_list(headers);
    }
}

fn header_list(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_owned(), value)
        })
        .collect()
}

#[derive(Clone)]
struct Sim {
    config: Arc<SimConfig>,
    stats: Arc<SimStats>,
    ids: Arc<AtomicU64>,
    stored: Arc<responses::Stored>,
    prompt_cache: Arc<messages::PromptCache>,
}

/// The simulator's router and its counters.
pub fn router(config: SimConfig) -> (Router, Arc<SimStats>) {
    let stats = Arc::new(SimStats::default());
    let sim = Sim {
        config: Arc::new(config),
        stats: stats.clone(),
        ids: Arc::new(AtomicU64::new(1)),
        stored: Arc::default(),
        prompt_cache: Arc::default(),
    };
    let router = Router::new()
        .route("/v1/chat/completions", post(chat).options(preflight))
        .route("/v1/completions", post(completions).options(preflight))
        .route("/v1/embeddings", post(embeddings).options(preflight))
        .route("/v1/models", get(models))
        .route("/v1/responses", post(responses::create).options(preflight))
        .route(
            "/v1/responses/{id}",
            get(responses::get_response).delete(responses::delete_response),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/messages", post(messages::create).options(preflight))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/sim/redirected", get(redirected))
        .route("/stats", get(stats_handler))
        .route("/stats/reset", post(stats_reset))
        .route("/healthz", get(|| async { "ok" }))
        .layer(axum::middleware::from_fn(cors_answer))
        .with_state(sim);
    (router, stats)
}

/// A browser's actual request (one with `Origin`) is answered with the CORS headers that let the
/// page read it, as the providers do: any origin, `x-request-id` readable. `x-sim-cors: deny`
/// plays an upstream that grants that origin nothing.
async fn cors_answer(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let browser = request.headers().contains_key(header::ORIGIN);
    let deny = request
        .headers()
        .get("x-sim-cors")
        .is_some_and(|v| v.as_bytes() == b"deny");
    let is_preflight = request.method() == axum::http::Method::OPTIONS;
    let mut response = next.run(request).await;
    if browser && !deny && !is_preflight {
        let out = response.headers_mut();
        out.insert(
            header::ACCESS_CONTROL_ALLOW_ORIGIN,
            HeaderValue::from_static("*"),
        );
        out.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("x-request-id"),
        );
    }
    response
}

/// Serves the simulator until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    config: SimConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (router, _) = router(config);
    axum::serve(transport::FaultListener::new(listener), router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// A simulator running in this process (for tests): its address and counters.
pub struct SimHandle {
    pub addr: SocketAddr,
    pub stats: Arc<SimStats>,
    task: tokio::task::JoinHandle<()>,
}

impl SimHandle {
    /// Base URL including `/v1`, as a gateway's `--upstream-url` wants it.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a simulator on an ephemeral loopback port.
pub async fn spawn(config: SimConfig) -> std::io::Result<SimHandle> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (router, stats) = router(config);
    let listener = transport::FaultListener::new(listener);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(SimHandle { addr, stats, task })
}

async fn stats_handler(State(sim): State<Sim>) -> Json<StatsSnapshot> {
    Json(sim.stats.snapshot())
}

/// A browser's CORS preflight, answered as the providers do: any origin may `POST` with the
/// headers it names.
async fn preflight(headers: HeaderMap) -> Response {
    let asked = headers
        .get("access-control-request-headers")
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("*"));
    let mut response = StatusCode::NO_CONTENT.into_response();
    let out = response.headers_mut();
    out.insert("access-control-allow-origin", HeaderValue::from_static("*"));
    out.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("POST, OPTIONS"),
    );
    out.insert("access-control-allow-headers", asked);
    out.insert("access-control-max-age", HeaderValue::from_static("86400"));
    response
}

async fn stats_reset(State(sim): State<Sim>) -> StatusCode {
    sim.stats.reset();
    StatusCode::NO_CONTENT
}

async fn models(State(sim): State<Sim>, headers: HeaderMap) -> Json<Value> {
    sim.stats.models.fetch_add(1, Ordering::SeqCst);
    sim.stats.note_auth(&headers);
    Json(json!({
        "object": "list",
        "data": [
            {"id": "sim-model", "object": "model", "created": 1_700_000_000, "owned_by": "reprise-sim"},
            {"id": "sim-embedding", "object": "model", "created": 1_700_000_000, "owned_by": "reprise-sim"}
        ]
    }))
}

/// Per-request settings: the configuration, overridden by `x-sim-*` headers.
struct Plan {
    ttft: Duration,
    itl_ms: f64,
    jitter: f64,
    fault: Option<Fault>,
    tokens: u32,
}

fn header_f64(headers: &HeaderMap, name: &str) -> Option<f64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

fn plan(sim: &Sim, headers: &HeaderMap, prompt_tokens: u64) -> Result<Plan, String> {
    let config = &sim.config;
    let fault = match headers.get("x-sim-fault").and_then(|v| v.to_str().ok()) {
        Some(spec) => Some(Fault::parse(spec)?),
        None => config.fault.clone(),
    };
    let ttft_ms = header_f64(headers, "x-sim-ttft-ms").unwrap_or(config.ttft_ms);
    let prefill_ms = if config.prefill_tokens_per_s > 0.0 {
        prompt_tokens as f64 * 1000.0 / config.prefill_tokens_per_s
    } else {
        0.0
    };
    let jitter = config.jitter.clamp(0.0, 1.0);
    Ok(Plan {
        ttft: jittered(ttft_ms + prefill_ms, jitter),
        itl_ms: header_f64(headers, "x-sim-itl-ms").unwrap_or(config.itl_ms),
        jitter,
        fault,
        tokens: header_f64(headers, "x-sim-tokens").map_or(config.tokens, |t| t as u32),
    })
}

fn jittered(ms: f64, jitter: f64) -> Duration {
    let factor = if jitter > 0.0 {
        rand::rng().random_range((1.0 - jitter)..=(1.0 + jitter))
    } else {
        1.0
    };
    Duration::from_secs_f64((ms * factor).max(0.0) / 1000.0)
}

fn error_response(status: StatusCode, message: &str) -> Response {
    let kind = if status.is_server_error() {
        "server_error"
    } else {
        "invalid_request_error"
    };
    let mut response = (
        status,
        Json(json!({"error": {"message": message, "type": kind, "param": null, "code": null}})),
    )
        .into_response();
    if status == StatusCode::TOO_MANY_REQUESTS {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

fn parse_body(body: &Bytes) -> Result<Value, String> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .filter(Value::is_object)
        .ok_or_else(|| "body must be a JSON object".to_owned())
}

/// Faults that end the request before any byte: an error status or a hang.
async fn early_fault(plan: &Plan) -> Option<Response> {
    match &plan.fault {
        Some(Fault::Status(code)) => {
            let status = StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Some(error_response(status, "injected fault"))
        }
        Some(Fault::Redirect) => {
            let mut response = error_response(StatusCode::FOUND, "moved to /v1/sim/redirected");
            response.headers_mut().insert(
                header::LOCATION,
                HeaderValue::from_static("/v1/sim/redirected"),
            );
            Some(response)
        }
        Some(Fault::Hang) => {
            // Long enough for any test or client timeout; the connection closing ends it.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Some(error_response(StatusCode::GATEWAY_TIMEOUT, "hang over"))
        }
        _ => None,
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

async fn chat(State(sim): State<Sim>, headers: HeaderMap, body: Bytes) -> Response {
    let request = parse_body(&body);
    // Judge calls are counted apart, so `chat_completions` keeps meaning answers generated.
    let call = request.as_ref().ok().and_then(judge::judge_call);
    match (request, call) {
        (Ok(request), Some(call)) => judge_answer(sim, headers, request, call).await,
        (request, _) => {
            sim.stats.chat.fetch_add(1, Ordering::SeqCst);
            generate(sim, headers, request, Kind::Chat).await
        }
    }
}

async fn completions(State(sim): State<Sim>, headers: HeaderMap, body: Bytes) -> Response {
    sim.stats.completions.fetch_add(1, Ordering::SeqCst);
    generate(sim, headers, parse_body(&body), Kind::Completion).await
}

/// A judge call: the verdict from the labels, after `judge_latency_ms`, as a chat completion (or
/// its stream, when asked). Only the faults that end a request early (`status`, `hang`,
/// `redirect`) apply, so `--fault status=503` also makes the judge fail.
async fn judge_answer(
    sim: Sim,
    headers: HeaderMap,
    request: Value,
    call: judge::JudgeCall,
) -> Response {
    let generation = match Generation::from_request(&request, true) {
        Ok(g) => g,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    let plan = match plan(&sim, &headers, generation.prompt_tokens) {
        Ok(p) => p,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    if let Some(response) = early_fault(&plan).await {
        return response;
    }
    let config = &sim.config;
    let verdict = judge::verdict(
        &call,
        config.judge_labels.as_ref(),
        config.judge_accuracy,
        config.judge_seed,
    );
    sim.stats.note_verdict(verdict, &headers);
    let ids = text::Ids {
        id: format!(
            "chatcmpl-simjudge{:010}",
            sim.ids.fetch_add(1, Ordering::SeqCst)
        ),
        created: text::unix_now(),
        model: generation.model.clone(),
    };
    // The binary checks the flag; a library caller's NaN or infinity must not panic here.
    let latency =
        Duration::try_from_secs_f64(config.judge_latency_ms / 1000.0).unwrap_or(Duration::ZERO);
    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        let include_usage = request
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let events = judge::stream_events(verdict, &ids, generation.prompt_tokens, include_usage);
        let pacing = Plan {
            ttft: latency,
            itl_ms: 0.0,
            jitter: 0.0,
            fault: None,
            tokens: 1,
        };
        return stream_response(events, pacing);
    }
    tokio::time::sleep(latency).await;
    Json(judge::full_body(verdict, &ids, generation.prompt_tokens)).into_response()
}

async fn generate(
    sim: Sim,
    headers: HeaderMap,
    request: Result<Value, String>,
    kind: Kind,
) -> Response {
    sim.stats.note_auth(&headers);
    let request = match request {
        Ok(v) => v,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    let generation = match Generation::from_request(&request, kind == Kind::Chat) {
        Ok(g) => g,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    let plan = match plan(&sim, &headers, generation.prompt_tokens) {
        Ok(p) => p,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    if let Some(response) = early_fault(&plan).await {
        return response;
    }
    let id_number = sim.ids.fetch_add(1, Ordering::SeqCst);
    let answer = generation.answer(plan.tokens, plan.fault.as_ref());
    let stream = request
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    // `x-sim-usage: ignore` plays an OpenAI-compatible server that ignores the option, `nulls`
    // one that puts `"usage": null` on every chunk, asked or not.
    let usage_mode = headers.get("x-sim-usage").map(|v| v.as_bytes());
    let asked_usage = request
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let usage = if asked_usage && usage_mode != Some(b"ignore") {
        text::StreamUsage::Chunk
    } else if usage_mode == Some(b"nulls") {
        text::StreamUsage::Nulls
    } else {
        text::StreamUsage::Omitted
    };
    let ids = text::Ids {
        id: match kind {
            Kind::Chat => format!("chatcmpl-sim{id_number:010}"),
            Kind::Completion => format!("cmpl-sim{id_number:010}"),
        },
        created: text::unix_now(),
        model: generation.model.clone(),
    };
    if stream {
        let events = answer.stream_events(&ids, kind == Kind::Chat, usage, plan.fault.as_ref());
        stream_response(events, plan)
    } else {
        // A non-streamed answer arrives when the last token would have.
        let decode = plan.itl_ms * f64::from(answer.token_count().saturating_sub(1));
        tokio::time::sleep(plan.ttft + jittered(decode, plan.jitter)).await;
        let body = answer.full_body(&ids, kind == Kind::Chat);
        if matches!(plan.fault, Some(Fault::Abort(_))) {
            return broken_body(&body);
        }
        if matches!(plan.fault, Some(Fault::BadUtf8(_))) {
            let bytes = text::with_bad_utf8(body.to_string().as_bytes());
            return ([(header::CONTENT_TYPE, "application/json")], bytes).into_response();
        }
        (StatusCode::OK, Json(body)).into_response()
    }
}

/// Half a JSON body, then a broken connection: a truncated response, not a stream's fault (the
/// `abort` fault on a non-streamed answer).
fn broken_body(body: &Value) -> Response {
    let bytes = Bytes::from(body.to_string());
    let parts: Vec<Result<Bytes, std::io::Error>> = vec![
        Ok(bytes.slice(..bytes.len() / 2)),
        Err(std::io::Error::other("injected abort")),
    ];
    let mut response = Response::new(Body::from_stream(stream::iter(parts)));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// Paces pre-built SSE events on absolute deadlines, so inter-token gaps do not drift: every event
/// waits for the current deadline, and each token moves the deadline one inter-token latency on.
fn stream_response(events: Vec<text::Event>, plan: Plan) -> Response {
    let first_at = Instant::now() + plan.ttft;
    let itl_ms = plan.itl_ms;
    let jitter = plan.jitter;
    let body = stream::unfold(
        (events.into_iter(), first_at),
        move |(mut events, next_at)| async move {
            let event = events.next()?;
            tokio::time::sleep_until(next_at).await;
            match event {
                text::Event::Token(bytes) => {
                    let next_at = next_at + jittered(itl_ms, jitter);
                    Some((Ok(bytes), (events, next_at)))
                }
                text::Event::Immediate(bytes) => Some((Ok(bytes), (events, next_at))),
                text::Event::Abort => Some((
                    Err(std::io::Error::other("injected abort")),
                    (Vec::new().into_iter(), next_at),
                )),
                text::Event::Stall => {
                    // Long enough for any test or client idle timeout; the connection closing ends it.
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    None
                }
            }
        },
    );
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Where the `redirect` fault points: a complete, cacheable-looking chat answer to a `GET`, so a
/// client that follows the redirect gets an answer to a question it never sent here.
async fn redirected() -> Json<Value> {
    Json(json!({
        "id": "chatcmpl-simredirected",
        "object": "chat.completion",
        "created": text::unix_now(),
        "model": "sim-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "You followed a redirect.", "refusal": null}, "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 5, "total_tokens": 5}
    }))
}

async fn embeddings(State(sim): State<Sim>, headers: HeaderMap, body: Bytes) -> Response {
    sim.stats.embeddings.fetch_add(1, Ordering::SeqCst);
    sim.stats.note_auth(&headers);
    let request = match parse_body(&body) {
        Ok(v) => v,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    let inputs: Vec<String> = match request.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items.iter().map(|i| i.to_string()).collect(),
        _ => {
            return error_response(
                StatusCode::BAD_REQUEST,
                "`input` must be a string or an array",
            )
        }
    };
    let plan = match plan(
        &sim,
        &headers,
        inputs.iter().map(|s| text::estimate_tokens(s)).sum(),
    ) {
        Ok(p) => p,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    if let Some(response) = early_fault(&plan).await {
        return response;
    }
    tokio::time::sleep(plan.ttft).await;
    let dims = request
        .get("dimensions")
        .and_then(Value::as_u64)
        .map_or(sim.config.embedding_dims, |d| d as usize)
        .clamp(1, 4096);
    let base64 = request.get("encoding_format").and_then(Value::as_str) == Some("base64");
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, input)| {
            let vector = text::pseudo_embedding(input, dims);
            let embedding = if base64 {
                let bytes: Vec<u8> = vector.iter().flat_map(|f| f.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(vector)
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let tokens: u64 = inputs.iter().map(|s| text::estimate_tokens(s)).sum();
    Json(json!({
        "object": "list",
        "data": data,
        "model": request.get("model").cloned().unwrap_or(Value::Null),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}
    }))
    .into_response()
}
