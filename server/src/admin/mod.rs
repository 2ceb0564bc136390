//! Operator routes under `/admin` and `/metrics`: authentication, statistics, the live settings, the
//! OpenAPI document and the dashboard page; the entry routes live in [`entries`] and [`warm`].
//!
//! Without a configured token every admin route answers 404 (disabled, never open); a missing or
//! wrong token answers 401. Tokens are compared in constant time. Handlers are thin: blocking store
//! and index work runs on blocking threads.

pub(crate) mod entries;
pub(crate) mod json;
pub(crate) mod learn;
pub(crate) mod warm;

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::error::GatewayError;
use crate::live::{ConfigPatch, LiveSettings};
use crate::record::RequestRecord;
use crate::state::AppState;
use crate::stats::{
    latency_by_outcome, Gauges, GuardRefusals, OutcomeLatency, Rates, RequestCounts, Timeline,
    TtftHistogram, TtftSaved, UpstreamErrors,
};
use json::{from_value, AdminJson};

/// The dashboard: one self-contained page, no external assets (many deployments are offline).
const DASHBOARD: &str = include_str!("../../assets/dashboard.html");

/// The admin routes, every one behind the bearer token (the dashboard shell aside: it holds no
/// data and asks for the token itself).
pub(crate) fn routes(state: AppState) -> Router<AppState> {
    let protected = Router::new()
        .route("/admin/stats", get(stats))
        .route("/admin/entries", get(entries::list).post(warm::warm))
        .route(
            "/admin/entries/{id}",
            get(entries::show).delete(entries::delete),
        )
        .route(
            "/admin/invalidate",
            axum::routing::post(entries::invalidate),
        )
        .route("/admin/flush", axum::routing::post(entries::flush))
        .route("/admin/config", get(config).patch(patch_config))
        .route("/admin/requests", get(requests))
        .route("/admin/shadow", get(learn::shadow))
        .route(
            "/admin/feedback",
            get(learn::list_feedback).post(learn::post_feedback),
        )
        .route("/admin/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state, require_admin));
    protected.route("/admin/ui", get(dashboard))
}

async fn require_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, GatewayError> {
    authorize(&state, request.headers())?;
    Ok(next.run(request).await)
}

/// Checks `Authorization: Bearer <admin token>`.
pub(crate) fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), GatewayError> {
    let Some(expected) = &state.config.admin_token else {
        return Err(GatewayError::AdminDisabled);
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .unwrap_or("");
    // Hashing first makes the comparison constant-time in the length as well as the content.
    let a = blake3::hash(presented.as_bytes());
    let b = blake3::hash(expected.expose().as_bytes());
    if bool::from(a.as_bytes().ct_eq(b.as_bytes())) && !presented.is_empty() {
        Ok(())
    } else {
        Err(GatewayError::Unauthorized)
    }
}

/// Store size and health.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StoreStats {
    /// `ok`, or `degraded` when its disk failed and the gateway serves without caching (or Redis
    /// refuses writes: lookups go on, new answers are not stored).
    pub status: String,
    /// Why it is degraded; `null` when ok.
    pub degraded: Option<StoreDegraded>,
    pub entries: u64,
    pub bytes: u64,
}

/// Why the store stopped caching.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StoreDegraded {
    pub reason: String,
    /// Unix ms when caching stopped.
    pub since_ms: u64,
    /// Store operations failed or refused since then.
    pub failures: u64,
    /// True while lookups still reach the store: Redis refuses writes only.
    pub reads: bool,
}

/// Vector index size; `null` in exact-only mode.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct IndexStats {
    pub vectors: u64,
    pub tombstones: u64,
    /// A rebuild from the stored vectors runs in the background.
    pub rebuilding: bool,
    /// Partitions searched without a graph (past 32,768 rows by their rows' sketches, scanned
    /// exactly below) until their graph is built (after a rebuild from the store, which serves
    /// every vector before the graphs are done).
    pub graphs_pending: u64,
}

/// The embedding model's work; `null` in exact-only mode.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EmbeddingStats {
    /// Requests that fell back to exact matching, all reasons together.
    pub fallbacks: u64,
    /// The same by reason: `overload` (refused at once, the queue could not meet the deadline),
    /// `deadline` (queued, then late), `failed`; `scan_busy` (embedded, but its partition awaits
    /// its graph and every search thread was scanning one).
    pub fallback_reasons: crate::semantic::Fallbacks,
    /// Texts queued for or in the model right now.
    pub queued: u64,
    /// Longest a request's text waited for its model call to start (admission bounds it by
    /// `embed_max_wait_ms`; `reprise_embedding_queue_wait_seconds` has the distribution).
    pub max_queue_wait_ms: f64,
    /// Entries stored without a vector and embedded later, off the request path.
    pub backfill: crate::backfill::BackfillStats,
    pub batches: u64,
    pub texts: u64,
    pub mean_batch_size: Option<f64>,
    /// Model time per batch over the last batches.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// Phase percentiles of the recent requests, per cache outcome.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct LatencyWindow {
    /// How many recent requests the percentiles cover (the request log's size).
    pub window: usize,
    pub by_outcome: BTreeMap<String, OutcomeLatency>,
}

/// `GET /admin/stats`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StatsBody {
    pub object: String,
    pub version: String,
    pub uptime_s: f64,
    /// `semantic` or `exact-only`.
    pub mode: String,
    pub store: StoreStats,
    /// Which replica answers and how far behind the shared store's change feed it is
    /// (`--store redis` only).
    pub replica: Option<crate::replica::FeedStatus>,
    pub index: Option<IndexStats>,
    pub requests: RequestCounts,
    /// `requests` per route (`chat.completions`, `messages`, `passthrough`, …).
    pub by_route: std::collections::BTreeMap<String, RequestCounts>,
    pub rates: Rates,
    pub ttft_saved_ms: TtftSaved,
    /// Tokens and money hits saved (by route, model and namespace), shadow mode's would-be
    /// savings, the judge's cost against them, and the price table in force.
    pub savings: reprise_wire::Savings,
    pub embedding: Option<EmbeddingStats>,
    pub upstream_errors: UpstreamErrors,
    /// Semantic lookups that a literal guard left without a match (a candidate above the threshold
    /// refused, none served), by the first guard that refused: wrong answers not given.
    pub guard_refusals: GuardRefusals,
    /// Misses whose semantic search raced the upstream request (`semantic_overlap`).
    pub semantic_overlap: crate::stats::Overlap,
    /// Operators' verdicts (`POST /admin/feedback`), since the data dir was created.
    pub feedback: crate::feedback::FeedbackCounts,
    /// The judge of near matches (`verify = judge`) and the error budget's evidence.
    pub judge: crate::verify::JudgeStats,
    pub latency: LatencyWindow,
    pub ttft_histogram: TtftHistogram,
    pub timeline: Timeline,
}

/// Counts, rates, latency by outcome and prefill time saved.
#[utoipa::path(get, path = "/admin/stats", tag = "admin",
    responses((status = 200, body = StatsBody), (status = 401, description = "Missing or wrong admin token")),
    security(("admin_token" = [])))]
pub(crate) async fn stats(State(state): State<AppState>) -> Json<StatsBody> {
    let degraded = state.cache.store.degraded();
    let totals = state.requests.stats.totals();
    let recent = state.requests.recent(usize::MAX);
    let embedding = state.semantic.as_ref().map(|s| {
        let e = s.embedder.stats();
        let millis: Vec<f64> = s
            .embedder
            .recent_batches()
            .iter()
            .map(|b| b.millis)
            .collect();
        EmbeddingStats {
            fallbacks: s.fallbacks.load(std::sync::atomic::Ordering::Relaxed),
            fallback_reasons: s.fallbacks(),
            queued: e.pending,
            max_queue_wait_ms: e.max_queue_wait_us as f64 / 1e3,
            backfill: s.backfill.stats(),
            batches: e.batches,
            texts: e.batched_items,
            mean_batch_size: (e.batches > 0).then(|| e.batched_items as f64 / e.batches as f64),
            p50_ms: crate::timing::percentile(&millis, 0.50),
            p99_ms: crate::timing::percentile(&millis, 0.99),
        }
    });
    Json(StatsBody {
        object: "reprise.stats".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        uptime_s: state.requests.stats.uptime_s(),
        mode: mode(&state).to_owned(),
        store: StoreStats {
            status: if degraded.is_some() { "degraded" } else { "ok" }.to_owned(),
            degraded: degraded.map(|d| StoreDegraded {
                reason: d.reason,
                since_ms: d.since_ms,
                failures: d.failures,
                reads: d.reads,
            }),
            entries: state.cache.store.len() as u64,
            bytes: state.cache.store.bytes(),
        },
        replica: state
            .replica
            .as_ref()
            .map(|r| r.status(state.cache.store.as_ref())),
        index: state.semantic.as_ref().map(|s| {
            use crate::index::VectorIndex;
            IndexStats {
                vectors: s.index.len() as u64,
                tombstones: s.index.tombstones() as u64,
                rebuilding: s.index.is_building(),
                graphs_pending: s.index.current().graphs_pending() as u64,
            }
        }),
        requests: totals.requests,
        by_route: totals.by_route,
        rates: totals.rates,
        ttft_saved_ms: totals.ttft_saved_ms,
        savings: savings(&state),
        embedding,
        upstream_errors: totals.upstream_errors,
        guard_refusals: totals.guard_refusals,
        semantic_overlap: totals.overlap,
        feedback: state.feedback.counts(),
        judge: state.verifier.stats(&state.feedback),
        latency: LatencyWindow {
            window: state.config.request_log_size,
            by_outcome: latency_by_outcome(&recent),
        },
        ttft_histogram: totals.ttft_histogram,
        timeline: totals.timeline,
    })
}

/// What hits saved, less what the judge's calls cost, at the price table in force.
fn savings(state: &AppState) -> reprise_wire::Savings {
    let mut savings = state.requests.stats.savings();
    savings.judge = state.verifier.judge.counts.cost();
    savings.net_cost_usd = savings.total.cost_usd - savings.judge.cost_usd;
    savings.prices = state.savings.prices.info().clone();
    savings
}

fn mode(state: &AppState) -> &'static str {
    if state.semantic.is_some() {
        "semantic"
    } else {
        "exact-only"
    }
}

/// Prometheus text format.
#[utoipa::path(get, path = "/metrics", tag = "admin",
    responses((status = 200, description = "Prometheus text exposition format", content_type = "text/plain")),
    security(("admin_token" = [])))]
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    use crate::index::VectorIndex;
    let gauges = Gauges {
        entries: state.cache.store.len() as u64,
        store_bytes: state.cache.store.bytes(),
        index_vectors: state.semantic.as_ref().map_or(0, |s| s.index.len() as u64),
        index_tombstones: state
            .semantic
            .as_ref()
            .map_or(0, |s| s.index.tombstones() as u64),
        index_graphs_pending: state
            .semantic
            .as_ref()
            .map_or(0, |s| s.index.current().graphs_pending() as u64),
        embed_fallbacks: state
            .semantic
            .as_ref()
            .map(|s| s.fallbacks().counts())
            .unwrap_or_default(),
        store_errors: state.cache.store_errors().counts(),
        store_degraded: state.cache.store.degraded().is_some(),
        feed_behind_ms: state
            .replica
            .as_ref()
            .map_or(0, |r| r.status(state.cache.store.as_ref()).behind_ms),
    };
    let mut text = state.requests.stats.render_prometheus(&gauges);
    text.push_str(&state.feedback.render_prometheus());
    if let Some(otel) = &state.otel {
        text.push_str(&otel.counters.render_prometheus());
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct RequestsQuery {
    /// How many, newest first (default 100, at most the request log's size).
    pub limit: Option<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RequestsPage {
    pub object: String,
    pub data: Vec<RequestRecord>,
}

/// The most recent requests with their phases, newest first.
#[utoipa::path(get, path = "/admin/requests", tag = "admin", params(RequestsQuery),
    responses((status = 200, body = RequestsPage)), security(("admin_token" = [])))]
pub(crate) async fn requests(
    State(state): State<AppState>,
    query: Result<Query<RequestsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RequestsPage>, GatewayError> {
    let Query(query) =
        query.map_err(|e| GatewayError::invalid(format!("Invalid query: {e}."), Some("limit")))?;
    if query.limit == Some(0) {
        return Err(GatewayError::invalid(
            "`limit` must be at least 1.",
            Some("limit"),
        ));
    }
    // Above the log's size there is nothing more to give: the whole log, not an error.
    let limit = query
        .limit
        .unwrap_or(100)
        .min(state.config.request_log_size);
    Ok(Json(RequestsPage {
        object: "list".to_owned(),
        data: state.requests.recent(limit),
    }))
}

/// The settings that can change while the gateway serves.
#[utoipa::path(get, path = "/admin/config", tag = "admin",
    responses((status = 200, body = LiveSettings)), security(("admin_token" = [])))]
pub(crate) async fn config(State(state): State<AppState>) -> Json<LiveSettings> {
    Json(state.live.current().as_ref().clone())
}

/// Changes live settings (validated; nothing changes on error; logged). Lasts until restart.
#[utoipa::path(patch, path = "/admin/config", tag = "admin", request_body = ConfigPatch,
    responses((status = 200, body = LiveSettings), (status = 400, description = "Invalid value; names the field")),
    security(("admin_token" = [])))]
pub(crate) async fn patch_config(
    State(state): State<AppState>,
    AdminJson(body): AdminJson<serde_json::Value>,
) -> Result<Json<LiveSettings>, GatewayError> {
    let patch: ConfigPatch = from_value(body.clone())?;
    let applied = state.live.apply(patch)?;
    // Every replica sharing the store applies the same patch, in the order they were accepted.
    // Publishing is a Redis round trip: on a blocking thread, never on an async worker.
    let store = state.cache.store.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(feed) = store.feed() {
            let change = crate::store::Change::Config(body);
            if let Err(e) = feed.publish(&change) {
                tracing::error!(error = %e, "a config change could not be shared: it applies to this replica only");
            }
        }
    })
    .await;
    Ok(Json(applied.as_ref().clone()))
}

/// This document.
#[utoipa::path(get, path = "/admin/openapi.json", tag = "admin",
    responses((status = 200, description = "OpenAPI 3.1 document")), security(("admin_token" = [])))]
pub(crate) async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

/// The dashboard page (no data inside: its script asks for the token and calls the routes above).
pub(crate) async fn dashboard(State(state): State<AppState>) -> Result<Response, GatewayError> {
    if state.config.admin_token.is_none() {
        return Err(GatewayError::AdminDisabled);
    }
    let mut response = Response::new(Body::from(DASHBOARD));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    // The page runs only its own inline code and talks only to this gateway.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The admin API's OpenAPI document, generated from the handlers and types above, so it cannot
/// drift from the code.
#[derive(OpenApi)]
#[openapi(
    info(title = "Reprise admin API", description = "Operator routes of the Reprise gateway. Every route needs `Authorization: Bearer <admin token>`."),
    paths(
        stats, metrics, requests, config, patch_config, openapi,
        entries::list, entries::show, entries::delete, entries::invalidate, entries::flush,
        warm::warm, learn::shadow, learn::list_feedback, learn::post_feedback,
    ),
    modifiers(&BearerAuth),
    tags((name = "admin", description = "Cache statistics, entries and settings"))
)]
pub(crate) struct ApiDoc;
