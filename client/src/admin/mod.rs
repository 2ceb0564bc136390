//! Typed async client for the gateway's admin REST API (`/admin/*` and `/metrics`).
//!
//! The types follow the admin API contract field for field; those the gateway and the client share
//! (outcomes, phases, request records, the stats counts) are the wire contract's (`reprise-wire`).
//! Responses are decoded leniently: unknown fields are ignored (a newer gateway may add some),
//! everything the contract allows to be `null` is an `Option`, and an outcome this client does not
//! know is kept as the gateway spelled it. Every call is also available untyped through [`AdminClient::call_json`] and byte
//! for byte through [`AdminClient::call_raw`] (what `reprise-client --json` prints), so nothing the
//! gateway sends is lost to the typed view.
//! This module only speaks HTTP; it renders nothing (see `admin_cli` for tables).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

/// Gateway root used when `REPRISE_URL` is not set.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";
/// Environment variable holding the gateway URL (with or without a trailing `/v1`).
pub const URL_ENV: &str = "REPRISE_URL";
/// Environment variable holding the admin bearer token.
pub const TOKEN_ENV: &str = "REPRISE_ADMIN_TOKEN";

/// Everything that can go wrong talking to the admin API. `Display` is one line meant for a person
/// at a terminal: it says what happened and, where there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The gateway URL could not be used.
    #[error("invalid gateway URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// The gateway answered with a non-2xx status; the fields come from its OpenAI-shaped error body
    /// (`message` falls back to the body text or the status reason when the body is not one).
    #[error("{}", describe_http(*.status, .message, .code.as_deref(), .param.as_deref()))]
    Http {
        status: u16,
        message: String,
        /// The error's `type` (e.g. `authentication_error`).
        kind: Option<String>,
        code: Option<String>,
        param: Option<String>,
    },
    /// The request did not get an HTTP answer (connection refused, DNS, timeout, reset).
    #[error("cannot reach the gateway at {url}: {detail}")]
    Transport {
        url: String,
        detail: String,
        #[source]
        source: reqwest::Error,
    },
    /// The gateway answered 2xx with a body that does not match the contract.
    #[error("unexpected response to {call}: {detail}")]
    Decode { call: String, detail: String },
}

impl AdminError {
    /// The HTTP status for [`AdminError::Http`].
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Http { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The OpenAI error `code` for [`AdminError::Http`] (e.g. `entry_not_found`).
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Http { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// The OpenAI error `param` for [`AdminError::Http`] (e.g. `limit`).
    pub fn param(&self) -> Option<&str> {
        match self {
            Self::Http { param, .. } => param.as_deref(),
            _ => None,
        }
    }
}

/// The one-line message of an HTTP error. Authentication and a disabled admin API get advice
/// instead of the server's wording, because those are the errors a new operator hits first.
fn describe_http(status: u16, message: &str, code: Option<&str>, param: Option<&str>) -> String {
    match (status, code) {
        (401, _) => format!(
            "the gateway rejected the admin token (HTTP 401{}): it is missing or wrong; set \
             {TOKEN_ENV} (or --admin-token) to the token the gateway was started with",
            code.map(|c| format!(" {c}")).unwrap_or_default()
        ),
        (404, Some("admin_disabled")) => format!(
            "the gateway's admin API is disabled (HTTP 404 admin_disabled): the gateway was \
             started without --admin-token ({TOKEN_ENV}); restart it with one"
        ),
        (404, Some("unknown_route")) => format!(
            "{message} (HTTP 404 unknown_route): this gateway does not serve that admin route; \
             is it an older version?"
        ),
        (404, None) => format!(
            "{message} (HTTP 404): no such route; is {URL_ENV} pointing at a Reprise gateway?"
        ),
        _ => {
            let mut detail = format!("HTTP {status}");
            if let Some(code) = code {
                detail.push_str(&format!(" {code}"));
            }
            if let Some(param) = param {
                detail.push_str(&format!(", param {param}"));
            }
            format!("{message} ({detail})")
        }
    }
}

/// Gateway root for admin routes: trailing `/` and `/v1` are removed, so the same `REPRISE_URL`
/// works for the OpenAI routes and for the admin client. A path prefix (reverse proxy) is kept.
pub fn admin_root(url: &str) -> Result<Url, AdminError> {
    let invalid = |reason: String| AdminError::InvalidUrl {
        url: url.to_owned(),
        reason,
    };
    let mut trimmed = url.trim().trim_end_matches('/');
    if let Some(rest) = trimmed.strip_suffix("/v1") {
        trimmed = rest.trim_end_matches('/');
    }
    if trimmed.is_empty() {
        return Err(invalid("it is empty".to_owned()));
    }
    let parsed = Url::parse(trimmed).map_err(|e| invalid(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "scheme {:?} is not http or https",
            parsed.scheme()
        )));
    }
    if parsed.cannot_be_a_base() || parsed.host_str().is_none() {
        return Err(invalid("it has no host".to_owned()));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid("it must not have a query or fragment".to_owned()));
    }
    Ok(parsed)
}

// ---------------------------------------------------------------------------------------------
// Contract types: GET /admin/stats
// ---------------------------------------------------------------------------------------------

// The parts the gateway and the client share are the wire contract's (`reprise-wire`): decoded
// leniently there, so an older or newer gateway's body still reads.
pub use reprise_wire::{CacheOutcome, Completion, Lenient};
pub use reprise_wire::{
    GuardRefusals, OutcomeLatency, Phases, Rates, RequestCounts, Summary, Timeline, TimelineBucket,
    TtftHistogram, TtftSaved, UpstreamErrors,
};

/// One recent request from `GET /admin/requests` (no prompt, no response, no credential); an
/// outcome or completion this client does not know is kept as the gateway spelled it.
pub type RequestRecord = reprise_wire::LenientRecord;

/// `GET /admin/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub object: String,
    pub version: String,
    pub uptime_s: f64,
    /// `semantic` or `exact-only`.
    pub mode: String,
    pub store: StoreStats,
    /// `None` in exact-only mode.
    pub index: Option<IndexStats>,
    pub requests: RequestCounts,
    pub rates: Rates,
    pub ttft_saved_ms: TtftSaved,
    pub embedding: Option<EmbeddingStats>,
    pub upstream_errors: UpstreamErrors,
    /// Semantic lookups a literal guard left without a match, by the first guard that refused
    /// (absent from older gateways, read as zeros).
    #[serde(default)]
    pub guard_refusals: GuardRefusals,
    /// Operators' verdicts (absent from gateways that predate feedback).
    #[serde(default)]
    pub feedback: Option<FeedbackCounts>,
    /// The judge of near matches (absent from gateways that predate `verify`).
    #[serde(default)]
    pub judge: Option<JudgeStats>,
    pub latency: Latency,
    pub ttft_histogram: TtftHistogram,
    pub timeline: Timeline,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreStats {
    pub entries: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexStats {
    pub vectors: u64,
    pub tombstones: u64,
    pub rebuilding: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingStats {
    pub fallbacks: u64,
    pub batches: u64,
    pub texts: u64,
    pub mean_batch_size: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// Verdicts received through `POST /admin/feedback`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FeedbackCounts {
    pub right: u64,
    pub wrong: u64,
    pub vetoes: u64,
    pub approvals: u64,
}

/// The judge's work (`verify = judge`) and the error budget's evidence per namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JudgeStats {
    /// Calls that reached the judge, by verdict.
    pub calls: u64,
    pub same: u64,
    pub different: u64,
    pub unsure: u64,
    pub timeouts: u64,
    pub failures: u64,
    /// Near matches not judged (and not served): rate budget spent, prompt too long.
    pub over_budget: u64,
    pub too_long: u64,
    /// Background mode: queued, dropped (queue full), waiting now.
    pub queued: u64,
    pub dropped: u64,
    pub queue_depth: u64,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub namespaces: Vec<NamespaceBudget>,
}

/// Verdicts observed in one namespace (`""`: requests without one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NamespaceBudget {
    pub namespace: String,
    pub observations: u64,
    pub wrong: u64,
    pub wrong_rate: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// How many recent requests the percentiles cover.
    pub window: u64,
    /// Only outcomes seen in the window (`hit`, `semantic-hit`, `coalesced`, `miss`).
    pub by_outcome: BTreeMap<String, OutcomeLatency>,
}

// ---------------------------------------------------------------------------------------------
// Contract types: entries
// ---------------------------------------------------------------------------------------------

/// One cached entry as listed by `GET /admin/entries`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntrySummary {
    pub id: String,
    pub object: String,
    /// `chat.completions` or `completions`.
    pub route: String,
    pub model: String,
    pub namespace: Option<String>,
    /// Tenant hash prefix, or `shared`.
    pub tenant: String,
    pub prompt: String,
    pub stream: bool,
    /// First 200 characters of the answer.
    pub answer_preview: String,
    pub created_at_ms: u64,
    pub expires_at_ms: Option<u64>,
    pub age_s: f64,
    pub hit_count: u64,
    /// `None` when never hit.
    pub last_hit_ms: Option<u64>,
    pub bytes: u64,
    /// What the miss that stored it waited for its first token.
    pub ttft_cost_ms: Option<f64>,
    pub tokens: u64,
    pub warmed: bool,
    /// Only present in search results (`q`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub similarity: Option<f64>,
}

/// `GET /admin/entries/{id}`: the summary fields plus the stored response and its history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryDetail {
    #[serde(flatten)]
    pub summary: EntrySummary,
    pub key: String,
    pub partition: String,
    pub answer: String,
    /// The OpenAI response object as stored.
    pub body: Value,
    /// Stream events recorded for replay.
    pub events: u64,
    pub usage: Option<Value>,
    /// Phases of the miss that stored it (`None` for warmed entries, which had no miss).
    pub phases: Option<Phases>,
    pub has_vector: bool,
    /// Newest last, at most 32.
    pub hit_history: Vec<HitEvent>,
    /// The verdicts (judge and operators) its near matches met (absent from older gateways).
    #[serde(default)]
    pub verdicts: Option<EntryVerdicts>,
    /// The entry's own floor, raised by operators' `wrong` verdicts.
    #[serde(default)]
    pub entry_threshold: Option<f32>,
}

/// An entry's verdicts and the threshold they set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryVerdicts {
    /// Newest last.
    pub observations: Vec<Observation>,
    /// Candidates at or below this similarity are always judged.
    pub judged_at_or_below: Option<f32>,
}

/// One verdict an entry met.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub similarity: f32,
    pub wrong: bool,
    /// `judge` or `operator`.
    pub source: String,
    pub at_ms: u64,
}

/// One time an entry served a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HitEvent {
    pub at_ms: u64,
    /// `hit`, `semantic-hit` or `coalesced`.
    pub kind: String,
    pub similarity: Option<f64>,
    pub request_id: Option<String>,
    pub ttft_ms: Option<f64>,
    pub ttft_saved_ms: Option<f64>,
}

/// One page of `GET /admin/entries`, newest first (or by similarity for a search).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryPage {
    pub object: String,
    pub data: Vec<EntrySummary>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// Query parameters of `GET /admin/entries`; `None` fields are not sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListQuery {
    pub namespace: Option<String>,
    pub model: Option<String>,
    /// Semantic search text (semantic mode only).
    pub q: Option<String>,
    /// 1..=200; the gateway defaults to 20.
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl ListQuery {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        let fields = [
            ("namespace", self.namespace.clone()),
            ("model", self.model.clone()),
            ("q", self.q.clone()),
            ("limit", self.limit.map(|l| l.to_string())),
            ("cursor", self.cursor.clone()),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                pairs.push((name, value));
            }
        }
        pairs
    }
}

/// Exact-match filters for a search.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryFilter {
    pub namespace: Option<String>,
    pub model: Option<String>,
}

/// `DELETE /admin/entries/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryDeleted {
    pub id: String,
    pub object: String,
    pub deleted: bool,
}

// ---------------------------------------------------------------------------------------------
// Contract types: warm, invalidate, flush
// ---------------------------------------------------------------------------------------------

/// One entry to pre-load with `POST /admin/entries`. Exactly one of `prompt`, `messages` and
/// `request` must be set; the constructors guarantee that.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// OpenAI chat messages, passed through as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Value>>,
    /// A whole OpenAI request body as the application sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Value>,
    pub response: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Tenant key (hashed by the gateway, never stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
}

impl WarmItem {
    /// A single user prompt for `model` answered by `response`.
    pub fn prompt(
        model: impl Into<String>,
        prompt: impl Into<String>,
        response: impl Into<String>,
    ) -> Self {
        Self {
            model: Some(model.into()),
            prompt: Some(prompt.into()),
            ..Self::empty(response.into())
        }
    }

    /// A chat conversation (`[{"role": .., "content": ..}, ..]`) answered by `response`.
    pub fn messages(
        model: impl Into<String>,
        messages: Vec<Value>,
        response: impl Into<String>,
    ) -> Self {
        Self {
            model: Some(model.into()),
            messages: Some(messages),
            ..Self::empty(response.into())
        }
    }

    /// A whole OpenAI request body (it carries the model) answered by `response`.
    pub fn request(request: Value, response: impl Into<String>) -> Self {
        Self {
            request: Some(request),
            ..Self::empty(response.into())
        }
    }

    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    pub fn with_route(mut self, route: impl Into<String>) -> Self {
        self.route = Some(route.into());
        self
    }

    pub fn with_api_key(mut self, api_key: impl Into<String>) -> Self {
        self.api_key = Some(api_key.into());
        self
    }

    pub fn with_ttl_s(mut self, ttl_s: u64) -> Self {
        self.ttl_s = Some(ttl_s);
        self
    }

    fn empty(response: String) -> Self {
        Self {
            model: None,
            prompt: None,
            messages: None,
            request: None,
            response,
            route: None,
            namespace: None,
            api_key: None,
            ttl_s: None,
        }
    }
}

/// `POST /admin/entries` -> 201.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmResult {
    pub object: String,
    pub created: u64,
    pub data: Vec<WarmedEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmedEntry {
    pub id: String,
    pub prompt: String,
}

/// How a raw warm body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmFormat {
    /// One item, an array of items, or `{"entries": [..]}`.
    Json,
    /// One item per line (blank lines ignored).
    JsonLines,
}

impl WarmFormat {
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::JsonLines => "application/x-ndjson",
        }
    }
}

/// `POST /admin/invalidate`: all set fields must match (AND); at least one is required.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InvalidateRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Tenant hash prefix or `shared`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub older_than_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub similar_to: Option<String>,
    /// Defaults (on the gateway) to the configured similarity threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_similarity: Option<f32>,
    /// Count the matches without deleting them.
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /admin/invalidate` -> 200.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Invalidation {
    pub object: String,
    pub matched: u64,
    pub deleted: u64,
    pub dry_run: bool,
}

/// `POST /admin/flush` -> 200.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flush {
    pub object: String,
    pub deleted: u64,
}

// ---------------------------------------------------------------------------------------------
// Contract types: config and requests
// ---------------------------------------------------------------------------------------------

/// `GET`/`PATCH /admin/config`: the settings that can change without a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveConfig {
    pub similarity_threshold: f32,
    pub namespace_thresholds: BTreeMap<String, f32>,
    /// `numbers,negation,direction,antonym`, some of them, or `none` (empty from gateways that predate the guards).
    #[serde(default)]
    pub semantic_guards: String,
    pub default_ttl_s: Option<u64>,
    /// `instant`, `recorded` or `tokens-per-second=N`.
    pub replay: String,
    /// `on`, `off`, `read-only`, `write-only`, `exact-only`, `shadow`.
    pub cache_mode: String,
    /// Default cache modes of namespaces (empty from gateways that predate them).
    #[serde(default)]
    pub namespace_modes: BTreeMap<String, String>,
}

/// `PATCH /admin/config` body: only set fields are sent. In `namespace_thresholds` a `None` value
/// is sent as `null`, which removes that namespace's threshold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub similarity_threshold: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_thresholds: Option<BTreeMap<String, Option<f32>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semantic_guards: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_ttl_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_modes: Option<BTreeMap<String, Option<String>>>,
}

impl ConfigPatch {
    /// True when nothing would change.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// One guard's verdict on a shadow candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardVerdict {
    pub guard: String,
    pub enabled: bool,
    pub refuses: bool,
}

/// What a request in shadow mode would have been served (`GET /admin/shadow`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowDecision {
    pub id: u64,
    pub at_ms: u64,
    pub request_id: String,
    pub namespace: Option<String>,
    pub model: String,
    pub prompt: String,
    /// `would-hit`, `would-refuse` or `would-miss`.
    pub would: String,
    pub entry: String,
    pub entry_prompt: String,
    pub similarity: f32,
    pub threshold: f32,
    pub guards: Vec<GuardVerdict>,
    /// The judge's verdict (`verify = judge`): `queued` until it lands.
    #[serde(default)]
    pub verdict: Option<String>,
}

/// `GET /admin/shadow`, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowPage {
    pub data: Vec<ShadowDecision>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// Filters of `GET /admin/shadow`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShadowQuery {
    pub namespace: Option<String>,
    /// `hit`, `refuse` or `miss` (or their `would-` forms).
    pub would: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

impl ShadowQuery {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        if let Some(n) = &self.namespace {
            pairs.push(("namespace", n.clone()));
        }
        if let Some(w) = &self.would {
            pairs.push(("would", w.clone()));
        }
        if let Some(l) = self.limit {
            pairs.push(("limit", l.to_string()));
        }
        if let Some(c) = &self.cursor {
            pairs.push(("cursor", c.clone()));
        }
        pairs
    }
}

/// `POST /admin/feedback`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackRequest {
    pub request_id: String,
    /// `right` or `wrong`.
    pub verdict: String,
}

/// A stored verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerdictRecord {
    pub id: u64,
    pub at_ms: u64,
    pub request_id: String,
    pub verdict: String,
    /// `hit`, `semantic-hit` or `shadow`.
    pub met: String,
    pub entry: String,
    pub prompt: String,
    pub similarity: Option<f32>,
    pub effect: String,
}

/// `GET /admin/feedback`, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackPage {
    pub data: Vec<VerdictRecord>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// `GET /admin/requests`, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestsPage {
    pub object: String,
    pub data: Vec<RequestRecord>,
}

// ---------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------

/// One admin API call with its parameters, for [`AdminClient::call_json`]. The typed methods build
/// these too, so the untyped path and the typed one send exactly the same request.
#[derive(Debug, Clone, PartialEq)]
pub enum AdminCall {
    Stats,
    /// List (or, with `q`, search) entries.
    Entries(ListQuery),
    Entry(String),
    DeleteEntry(String),
    Warm(Vec<WarmItem>),
    /// A warm body as it is (e.g. a file), sent with the format's content type.
    WarmRaw {
        body: Bytes,
        format: WarmFormat,
    },
    Invalidate(InvalidateRequest),
    Flush,
    Config,
    PatchConfig(ConfigPatch),
    Requests {
        limit: Option<u32>,
    },
    Shadow(ShadowQuery),
    Feedback(FeedbackRequest),
    FeedbackList {
        limit: Option<u32>,
        cursor: Option<String>,
    },
    OpenApi,
}

impl AdminCall {
    fn method(&self) -> Method {
        match self {
            Self::Stats
            | Self::Entries(_)
            | Self::Entry(_)
            | Self::Config
            | Self::Requests { .. }
            | Self::Shadow(_)
            | Self::FeedbackList { .. }
            | Self::OpenApi => Method::GET,
            Self::DeleteEntry(_) => Method::DELETE,
            Self::Warm(_)
            | Self::WarmRaw { .. }
            | Self::Invalidate(_)
            | Self::Flush
            | Self::Feedback(_) => Method::POST,
            Self::PatchConfig(_) => Method::PATCH,
        }
    }

    /// Path segments under the gateway root.
    fn segments(&self) -> Vec<&str> {
        match self {
            Self::Stats => vec!["admin", "stats"],
            Self::Entries(_) | Self::Warm(_) | Self::WarmRaw { .. } => vec!["admin", "entries"],
            Self::Entry(id) | Self::DeleteEntry(id) => vec!["admin", "entries", id],
            Self::Invalidate(_) => vec!["admin", "invalidate"],
            Self::Flush => vec!["admin", "flush"],
            Self::Config | Self::PatchConfig(_) => vec!["admin", "config"],
            Self::Requests { .. } => vec!["admin", "requests"],
            Self::Shadow(_) => vec!["admin", "shadow"],
            Self::Feedback(_) | Self::FeedbackList { .. } => vec!["admin", "feedback"],
            Self::OpenApi => vec!["admin", "openapi.json"],
        }
    }

    /// `GET /admin/stats`-style description for error messages.
    pub fn describe(&self) -> String {
        format!("{} /{}", self.method(), self.segments().join("/"))
    }
}

/// Async client for the admin API. Cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub struct AdminClient {
    http: reqwest::Client,
    root: Url,
    token: Option<String>,
}

impl std::fmt::Debug for AdminClient {
    // Written by hand so the token never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient")
            .field("root", &self.root.as_str())
            .field("token", &self.token.as_ref().map(|_| "*****"))
            .finish()
    }
}

impl AdminClient {
    /// A client for the gateway at `base_url` (with or without `/v1`), sending `token` as the
    /// admin bearer token.
    pub fn new(base_url: &str, token: Option<&str>) -> Result<Self, AdminError> {
        let root = admin_root(base_url)?;
        let http = reqwest::Client::builder()
            .user_agent(concat!("reprise-client/", env!("CARGO_PKG_VERSION")))
            // Only connecting is bounded: a flush or a large warm may legitimately take a while.
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| AdminError::InvalidUrl {
                url: base_url.to_owned(),
                reason: format!("cannot build an HTTP client: {e}"),
            })?;
        Ok(Self {
            http,
            root,
            token: token.filter(|t| !t.is_empty()).map(str::to_owned),
        })
    }

    /// A client from `REPRISE_URL` (default `http://127.0.0.1:8080`) and `REPRISE_ADMIN_TOKEN`.
    pub fn from_env() -> Result<Self, AdminError> {
        Self::from_vars(std::env::var(URL_ENV).ok(), std::env::var(TOKEN_ENV).ok())
    }

    /// `from_env` with the variables passed in, so it is testable without touching the process env.
    fn from_vars(url: Option<String>, token: Option<String>) -> Result<Self, AdminError> {
        let url = url
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_URL.to_owned());
        Self::new(&url, token.as_deref())
    }

    /// Use this `reqwest::Client` (e.g. one with a request timeout) instead of the default one.
    pub fn with_http_client(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// The gateway root the admin routes hang off (no trailing `/v1`).
    pub fn root(&self) -> &Url {
        &self.root
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.root.clone();
        // `admin_root` rejected URLs that cannot be a base, so the segments are always editable;
        // pushing segments one by one percent-encodes an id instead of letting it change the path.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, url);
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    /// Sends a request and returns the body of a 2xx answer, or the error the answer carried.
    async fn send(&self, builder: reqwest::RequestBuilder, url: &Url) -> Result<Bytes, AdminError> {
        let transport = |source: reqwest::Error| AdminError::Transport {
            url: self.root.as_str().trim_end_matches('/').to_owned(),
            detail: transport_detail(&source),
            source,
        };
        let response = builder.send().await.map_err(transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(transport)?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(http_error(status, &body, url))
        }
    }

    /// Performs `call` and returns the body of its 2xx answer, byte for byte.
    pub async fn call_raw(&self, call: &AdminCall) -> Result<Bytes, AdminError> {
        let url = self.url(&call.segments());
        let mut builder = self.request(call.method(), url.clone());
        match call {
            AdminCall::Entries(query) => builder = builder.query(&query.pairs()),
            AdminCall::Requests { limit: Some(limit) } => {
                builder = builder.query(&[("limit", limit)])
            }
            AdminCall::Warm(items) => builder = builder.json(items),
            AdminCall::WarmRaw { body, format } => {
                builder = builder
                    .header(reqwest::header::CONTENT_TYPE, format.content_type())
                    .body(body.clone())
            }
            AdminCall::Invalidate(request) => builder = builder.json(request),
            AdminCall::PatchConfig(patch) => builder = builder.json(patch),
            AdminCall::Shadow(query) => builder = builder.query(&query.pairs()),
            AdminCall::Feedback(request) => builder = builder.json(request),
            AdminCall::FeedbackList { limit, cursor } => {
                let mut pairs = Vec::new();
                if let Some(l) = limit {
                    pairs.push(("limit", l.to_string()));
                }
                if let Some(c) = cursor {
                    pairs.push(("cursor", c.clone()));
                }
                builder = builder.query(&pairs)
            }
            AdminCall::Stats
            | AdminCall::Entry(_)
            | AdminCall::DeleteEntry(_)
            | AdminCall::Flush
            | AdminCall::Config
            | AdminCall::Requests { limit: None }
            | AdminCall::OpenApi => {}
        }
        self.send(builder, &url).await
    }

    /// Performs `call` and returns its JSON answer untyped.
    pub async fn call_json(&self, call: &AdminCall) -> Result<Value, AdminError> {
        let body = self.call_raw(call).await?;
        decode(&body, &call.describe())
    }

    async fn call<T: DeserializeOwned>(&self, call: AdminCall) -> Result<T, AdminError> {
        let body = self.call_raw(&call).await?;
        decode(&body, &call.describe())
    }

    /// `GET /admin/stats`.
    pub async fn stats(&self) -> Result<Stats, AdminError> {
        self.call(AdminCall::Stats).await
    }

    /// `GET /admin/entries`: one page.
    pub async fn entries(&self, query: &ListQuery) -> Result<EntryPage, AdminError> {
        self.call(AdminCall::Entries(query.clone())).await
    }

    /// Every entry matching `query`, following `next_cursor` from `query.cursor` (or the start)
    /// to the last page. Pages are as large as the gateway allows unless `query.limit` is set.
    pub async fn entries_all(&self, query: &ListQuery) -> Result<Vec<EntrySummary>, AdminError> {
        let mut entries = Vec::new();
        for raw in self.entries_all_raw(query).await? {
            entries.push(decode(raw.get().as_bytes(), "GET /admin/entries")?);
        }
        Ok(entries)
    }

    /// Like [`AdminClient::entries_all`], untyped.
    pub async fn entries_all_json(&self, query: &ListQuery) -> Result<Vec<Value>, AdminError> {
        let mut entries = Vec::new();
        for raw in self.entries_all_raw(query).await? {
            entries.push(decode(raw.get().as_bytes(), "GET /admin/entries")?);
        }
        Ok(entries)
    }

    /// Like [`AdminClient::entries_all`], each entry exactly as the gateway sent it.
    pub async fn entries_all_raw(
        &self,
        query: &ListQuery,
    ) -> Result<Vec<Box<RawValue>>, AdminError> {
        /// Just what is needed to follow the cursor; the items stay as they were sent.
        #[derive(Deserialize)]
        struct RawPage {
            data: Vec<Box<RawValue>>,
            has_more: bool,
            next_cursor: Option<String>,
        }
        let mut page_query = query.clone();
        page_query.limit = Some(query.limit.unwrap_or(MAX_PAGE));
        let mut items = Vec::new();
        loop {
            let call = AdminCall::Entries(page_query.clone());
            let page: RawPage = decode(&self.call_raw(&call).await?, &call.describe())?;
            items.extend(page.data);
            match page.next_cursor {
                Some(next) if page.has_more => {
                    // A cursor that does not move would loop forever; report it instead.
                    if page_query.cursor.as_deref() == Some(next.as_str()) {
                        return Err(AdminError::Decode {
                            call: call.describe(),
                            detail: format!("next_cursor {next:?} did not advance"),
                        });
                    }
                    page_query.cursor = Some(next);
                }
                _ => return Ok(items),
            }
        }
    }

    /// Semantic search over cached prompts (`GET /admin/entries?q=`), most similar first.
    pub async fn search(
        &self,
        q: &str,
        limit: Option<u32>,
        filter: &EntryFilter,
    ) -> Result<EntryPage, AdminError> {
        self.entries(&ListQuery {
            namespace: filter.namespace.clone(),
            model: filter.model.clone(),
            q: Some(q.to_owned()),
            limit,
            cursor: None,
        })
        .await
    }

    /// `GET /admin/entries/{id}`.
    pub async fn entry(&self, id: &str) -> Result<EntryDetail, AdminError> {
        self.call(AdminCall::Entry(id.to_owned())).await
    }

    /// `DELETE /admin/entries/{id}`.
    pub async fn delete_entry(&self, id: &str) -> Result<EntryDeleted, AdminError> {
        self.call(AdminCall::DeleteEntry(id.to_owned())).await
    }

    /// `POST /admin/entries` with a JSON array of items.
    pub async fn warm(&self, items: &[WarmItem]) -> Result<WarmResult, AdminError> {
        self.call(AdminCall::Warm(items.to_vec())).await
    }

    /// `POST /admin/entries` with a JSON Lines body (one item per line).
    pub async fn warm_jsonl(&self, body: impl Into<Bytes>) -> Result<WarmResult, AdminError> {
        self.warm_raw(body, WarmFormat::JsonLines).await
    }

    /// `POST /admin/entries` with a body as it is (e.g. a file's contents).
    pub async fn warm_raw(
        &self,
        body: impl Into<Bytes>,
        format: WarmFormat,
    ) -> Result<WarmResult, AdminError> {
        self.call(AdminCall::WarmRaw {
            body: body.into(),
            format,
        })
        .await
    }

    /// `POST /admin/invalidate`.
    pub async fn invalidate(
        &self,
        request: &InvalidateRequest,
    ) -> Result<Invalidation, AdminError> {
        self.call(AdminCall::Invalidate(request.clone())).await
    }

    /// `POST /admin/flush`: deletes every entry.
    pub async fn flush(&self) -> Result<Flush, AdminError> {
        self.call(AdminCall::Flush).await
    }

    /// `GET /admin/config`.
    pub async fn config(&self) -> Result<LiveConfig, AdminError> {
        self.call(AdminCall::Config).await
    }

    /// `PATCH /admin/config`; returns the configuration after the change.
    pub async fn patch_config(&self, patch: &ConfigPatch) -> Result<LiveConfig, AdminError> {
        self.call(AdminCall::PatchConfig(patch.clone())).await
    }

    /// `GET /admin/requests`, newest first; `None` leaves the count to the gateway.
    pub async fn requests(&self, limit: Option<u32>) -> Result<RequestsPage, AdminError> {
        self.call(AdminCall::Requests { limit }).await
    }

    /// `GET /admin/shadow`: one page of shadow decisions.
    pub async fn shadow(&self, query: &ShadowQuery) -> Result<ShadowPage, AdminError> {
        self.call(AdminCall::Shadow(query.clone())).await
    }

    /// `POST /admin/feedback`: `right` or `wrong` on a request's match.
    pub async fn feedback(
        &self,
        request_id: &str,
        verdict: &str,
    ) -> Result<VerdictRecord, AdminError> {
        self.call(AdminCall::Feedback(FeedbackRequest {
            request_id: request_id.to_owned(),
            verdict: verdict.to_owned(),
        }))
        .await
    }

    /// `GET /admin/openapi.json`.
    pub async fn openapi(&self) -> Result<Value, AdminError> {
        self.call(AdminCall::OpenApi).await
    }

    /// `GET /metrics`: Prometheus text format.
    pub async fn metrics(&self) -> Result<String, AdminError> {
        let url = self.url(&["metrics"]);
        let body = self
            .send(self.request(Method::GET, url.clone()), &url)
            .await?;
        String::from_utf8(body.to_vec()).map_err(|e| AdminError::Decode {
            call: "GET /metrics".to_owned(),
            detail: format!("the body is not UTF-8 ({e})"),
        })
    }
}

/// The gateway's largest page size, used when following cursors.
const MAX_PAGE: u32 = 200;

/// Decodes a response body into its contract type, naming the failing field (`at latency.window`).
pub fn decode<T: DeserializeOwned>(body: &[u8], call: &str) -> Result<T, AdminError> {
    let fail = |detail: String| AdminError::Decode {
        call: call.to_owned(),
        detail,
    };
    let not_json = |e: &serde_json::Error| format!("the body is not JSON ({e})");
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        fail(if e.inner().is_syntax() || e.inner().is_eof() {
            not_json(e.inner())
        } else if e.path().to_string() == "." {
            e.inner().to_string()
        } else {
            format!("at {}: {}", e.path(), e.inner())
        })
    })?;
    // Trailing bytes after the document mean the body is not what it claims to be.
    deserializer.end().map_err(|e| fail(not_json(&e)))?;
    Ok(value)
}

/// Builds [`AdminError::Http`] from a non-2xx answer, reading the OpenAI error body when there is one.
fn http_error(status: StatusCode, body: &[u8], url: &Url) -> AdminError {
    #[derive(Deserialize)]
    struct Envelope {
        error: Body,
    }
    #[derive(Deserialize)]
    struct Body {
        message: Option<String>,
        #[serde(rename = "type")]
        kind: Option<String>,
        code: Option<String>,
        param: Option<String>,
    }
    let fallback = || {
        let text = String::from_utf8_lossy(body);
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.is_empty() {
            format!(
                "{} {}",
                status.canonical_reason().unwrap_or("error"),
                url.path()
            )
        } else {
            truncate_chars(&text, 200)
        }
    };
    match serde_json::from_slice::<Envelope>(body) {
        Ok(Envelope { error }) => AdminError::Http {
            status: status.as_u16(),
            message: error.message.unwrap_or_else(fallback),
            kind: error.kind,
            code: error.code,
            param: error.param,
        },
        Err(_) => AdminError::Http {
            status: status.as_u16(),
            message: fallback(),
            kind: None,
            code: None,
            param: None,
        },
    }
}

/// The most specific cause of a transport failure, which is what a person can act on
/// ("Connection refused") rather than reqwest's outer "error sending request".
fn transport_detail(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "the request timed out".to_owned();
    }
    let mut detail = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        detail = inner.to_string();
        source = inner.source();
    }
    detail
}

/// At most `max` characters of `text`, with an ellipsis when something was cut.
pub fn truncate_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A newer gateway: an outcome this client does not know, and a record without phases or
    /// completion, still decode (and print as the gateway spelled them).
    #[test]
    fn requests_of_a_newer_gateway_decode() {
        let body = br#"{"object":"list","data":[
            {"id":"req_1","route":"chat.completions","status":200,"cache":"prefetched"},
            {"id":"req_2","cache":"miss","completion":"complete","phases":{"total_ms":3.5}}]}"#;
        let page: RequestsPage = decode(body, "requests").expect("lenient decode");
        assert_eq!(page.data[0].cache, "prefetched");
        assert_eq!(page.data[0].cache.known(), None);
        assert_eq!(page.data[0].phases, Phases::default());
        assert!(page.data[1].cache.is(&CacheOutcome::Miss));
        assert!(page.data[1].completion.is(&Completion::Complete));
        assert_eq!(page.data[1].phases.total_ms, 3.5);
    }

    #[test]
    fn admin_root_strips_trailing_slash_and_v1() {
        for (input, expected) in [
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080/"),
            ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/"),
            ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/"),
            ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/"),
            (
                "  https://gw.example.invalid/v1//  ",
                "https://gw.example.invalid/",
            ),
            (
                "http://proxy.invalid/reprise/v1",
                "http://proxy.invalid/reprise",
            ),
            (
                "http://proxy.invalid/reprise/",
                "http://proxy.invalid/reprise",
            ),
            // Only a whole trailing `/v1` segment is stripped.
            ("http://h.invalid/apiv1", "http://h.invalid/apiv1"),
        ] {
            let root = admin_root(input).expect(input);
            assert_eq!(root.as_str(), expected, "for {input:?}");
        }
    }

    #[test]
    fn admin_root_rejects_unusable_urls() {
        for input in [
            "",
            "/v1",
            "127.0.0.1:8080",
            "ftp://h.invalid",
            "http://h.invalid/?x=1",
        ] {
            let err = admin_root(input).expect_err(input);
            assert!(
                matches!(err, AdminError::InvalidUrl { .. }),
                "{input:?}: {err}"
            );
            assert!(err.to_string().starts_with("invalid gateway URL"), "{err}");
        }
    }

    #[test]
    fn admin_urls_keep_the_prefix_and_encode_ids() {
        let client =
            AdminClient::new("http://proxy.invalid/reprise/v1/", Some("t")).expect("client");
        assert_eq!(
            client.url(&AdminCall::Stats.segments()).as_str(),
            "http://proxy.invalid/reprise/admin/stats"
        );
        let client = AdminClient::new("http://127.0.0.1:1234", Some("t")).expect("client");
        assert_eq!(
            client
                .url(&AdminCall::Entry("a/b?c".to_owned()).segments())
                .as_str(),
            "http://127.0.0.1:1234/admin/entries/a%2Fb%3Fc"
        );
        assert_eq!(
            client.url(&["metrics"]).as_str(),
            "http://127.0.0.1:1234/metrics"
        );
    }

    #[test]
    fn debug_never_shows_the_token() {
        let client = AdminClient::new("http://127.0.0.1:1234", Some("s3cret")).expect("client");
        let shown = format!("{client:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("*****"), "{shown}");
    }

    #[test]
    fn env_defaults_to_the_local_gateway() {
        let client = AdminClient::from_vars(None, None).expect("client");
        assert_eq!(client.root().as_str(), "http://127.0.0.1:8080/");
        assert!(client.token.is_none());
        let client =
            AdminClient::from_vars(Some("  ".to_owned()), Some("t".to_owned())).expect("client");
        assert_eq!(client.root().as_str(), "http://127.0.0.1:8080/");
        assert_eq!(client.token.as_deref(), Some("t"));
        let client = AdminClient::from_vars(Some("http://10.0.0.5:9000/v1".to_owned()), None)
            .expect("client");
        assert_eq!(client.root().as_str(), "http://10.0.0.5:9000/");
    }

    #[test]
    fn empty_token_counts_as_none() {
        let client = AdminClient::new("http://127.0.0.1:1234", Some("")).expect("client");
        assert!(client.token.is_none());
    }

    #[test]
    fn http_errors_read_the_openai_body() {
        let url = Url::parse("http://h.invalid/admin/entries").expect("url");
        let body = br#"{"error":{"message":"limit must be 1..=200","type":"invalid_request_error","param":"limit","code":"invalid_value"}}"#;
        let err = http_error(StatusCode::BAD_REQUEST, body, &url);
        assert_eq!(err.status(), Some(400));
        assert_eq!(err.param(), Some("limit"));
        assert_eq!(err.code(), Some("invalid_value"));
        assert_eq!(
            err.to_string(),
            "limit must be 1..=200 (HTTP 400 invalid_value, param limit)"
        );
    }

    #[test]
    fn auth_and_disabled_errors_give_advice() {
        let url = Url::parse("http://h.invalid/admin/stats").expect("url");
        let err = http_error(
            StatusCode::UNAUTHORIZED,
            br#"{"error":{"message":"Invalid admin token.","type":"authentication_error","param":null,"code":"invalid_admin_token"}}"#,
            &url,
        );
        let text = err.to_string();
        assert!(text.contains("admin token"), "{text}");
        assert!(text.contains("REPRISE_ADMIN_TOKEN"), "{text}");
        assert!(text.contains("401"), "{text}");

        let err = http_error(
            StatusCode::NOT_FOUND,
            br#"{"error":{"message":"Admin routes are disabled.","type":"invalid_request_error","param":null,"code":"admin_disabled"}}"#,
            &url,
        );
        let text = err.to_string();
        assert!(text.contains("started without --admin-token"), "{text}");
        assert_eq!(err.code(), Some("admin_disabled"));
    }

    #[test]
    fn non_json_error_bodies_are_kept_short() {
        let url = Url::parse("http://h.invalid/admin/stats").expect("url");
        let err = http_error(
            StatusCode::BAD_GATEWAY,
            b"<html>\n  bad   gateway\n</html>",
            &url,
        );
        assert_eq!(err.to_string(), "<html> bad gateway </html> (HTTP 502)");
        let err = http_error(StatusCode::NOT_FOUND, b"", &url);
        let text = err.to_string();
        assert!(
            text.starts_with("Not Found /admin/stats (HTTP 404)"),
            "{text}"
        );
        assert!(text.contains("REPRISE_URL"), "{text}");
        let long = "x".repeat(500);
        let err = http_error(StatusCode::INTERNAL_SERVER_ERROR, long.as_bytes(), &url);
        assert!(err.to_string().chars().count() < 230, "{err}");
    }

    #[test]
    fn decode_errors_name_the_field() {
        let body = br#"{"object": "reprise.flush", "deleted": "many"}"#;
        let err = decode::<Flush>(body, "POST /admin/flush").expect_err("bad type");
        let text = err.to_string();
        assert!(
            text.starts_with("unexpected response to POST /admin/flush: at deleted:"),
            "{text}"
        );
        let err = decode::<Flush>(b"<html>", "POST /admin/flush").expect_err("not JSON");
        assert!(err.to_string().contains("the body is not JSON"), "{err}");
        let err = decode::<Value>(b"{} {}", "POST /admin/flush").expect_err("two documents");
        assert!(err.to_string().contains("the body is not JSON"), "{err}");
    }

    #[test]
    fn config_patch_sends_null_to_remove_a_threshold() {
        let patch = ConfigPatch {
            namespace_thresholds: Some(BTreeMap::from([
                ("support".to_owned(), Some(0.95)),
                ("legal".to_owned(), None),
            ])),
            ..ConfigPatch::default()
        };
        let json = serde_json::to_value(&patch).expect("serialize");
        assert_eq!(
            json,
            serde_json::json!({"namespace_thresholds": {"legal": null, "support": 0.95_f32}})
        );
        assert!(!patch.is_empty());
        assert!(ConfigPatch::default().is_empty());
    }

    #[test]
    fn warm_items_send_only_what_is_set() {
        let item = WarmItem::prompt("gpt-4o-mini", "hi", "hello").with_namespace("support");
        assert_eq!(
            serde_json::to_value(&item).expect("serialize"),
            serde_json::json!({"model": "gpt-4o-mini", "prompt": "hi", "response": "hello", "namespace": "support"})
        );
        let item = WarmItem::request(serde_json::json!({"model": "m", "messages": []}), "a");
        assert_eq!(
            serde_json::to_value(&item).expect("serialize"),
            serde_json::json!({"request": {"model": "m", "messages": []}, "response": "a"})
        );
    }

    #[test]
    fn list_query_sends_only_set_parameters() {
        let query = ListQuery {
            model: Some("m".to_owned()),
            limit: Some(5),
            ..ListQuery::default()
        };
        assert_eq!(
            query.pairs(),
            vec![("model", "m".to_owned()), ("limit", "5".to_owned())]
        );
    }

    #[test]
    fn truncation_counts_characters() {
        assert_eq!(truncate_chars("héllo", 5), "héllo");
        assert_eq!(truncate_chars("héllo wörld", 6), "héllo…");
    }
}
