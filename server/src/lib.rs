//! Reprise gateway library: an OpenAI-compatible proxy that times every latency phase of every request.
//!
//! A request passes these stages, one module each, in this order:
//!
//! 1. [`ingress`]: reads the client's body within the size limit, checks content type and the fields
//!    the gateway relies on; writes an [`ingress::Ingress`] (raw bytes kept untouched) and starts the
//!    [`timing::PhaseClock`].
//! 2. [`policy`]: reads `Cache-Control` and `x-reprise-*` headers into a [`policy::Policy`].
//! 3. [`key`]: canonicalizes the request into a partition and an exact [`key::CacheKey`] (blake3).
//! 4. [`lookup`]: finds an unexpired entry in the [`store`] (through [`cache`]) by exact key; else
//!    [`semantic`] embeds the final user turn ([`embed`]), searches the partition in the vector
//!    [`index`] and lets the literal [`guard`]s veto candidates whose numbers or negations differ;
//!    else joins an identical miss in flight, or starts one.
//! 5. [`replay`] on a hit: renders the stored [`entry::Entry`] as a body or a paced SSE stream.
//! 6. [`forward`] on a miss: sends the request upstream over a pooled connection, waits for the first
//!    event within the first-byte deadline, then relays the body or the event stream (framed by
//!    [`sse`]) while timing tokens and feeding the [`cache::Recorder`].
//! 7. [`downstream`]: hands the bytes to the client and notes when the last one was taken.
//! 8. [`record`]: the request's phases go to the recent-requests log; a clean miss's answer goes to
//!    the store through the cache's writer thread, off the request path; one stored without a vector
//!    (its embedding was refused or late) is embedded later by the [`backfill`], when the model is idle.
//!
//! Around them: [`config`] (layered settings), [`error`] (the one error enum and its OpenAI-shaped
//! responses), [`admin`] (authenticated operator routes), and [`app`]/[`run`] here.

pub mod admin;
pub mod backfill;
pub mod cache;
pub mod config;
pub mod downstream;
pub mod embed;
pub mod entry;
pub mod error;
pub mod forward;
pub mod guard;
pub mod index;
pub mod ingress;
pub mod key;
pub mod live;
pub mod lookup;
pub mod policy;
pub mod record;
pub mod replay;
pub mod semantic;
pub mod sse;
pub mod stats;
pub mod store;
pub mod timing;

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::response::Response;
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cache::Cache;
use crate::config::Config;
use crate::error::GatewayError;
use crate::forward::Upstream;
use crate::index::VectorIndex;
use crate::ingress::Route;
use crate::record::RequestLog;
use crate::semantic::Semantic;
use crate::store::{SledStore, Store};

/// Shared state of the gateway: cheap to clone, one `Arc` per part.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub upstream: Arc<Upstream>,
    pub requests: Arc<RequestLog>,
    pub cache: Arc<Cache>,
    /// The settings operators can change while serving (thresholds, TTL, pacing, cache mode).
    pub live: Arc<live::Live>,
    /// Embedder and vector index; `None` in exact-only mode (see `semantic_disabled`).
    pub semantic: Option<Arc<Semantic>>,
    /// Why semantic matching is off, when it is.
    pub semantic_disabled: Option<Arc<str>>,
    /// Background work that must finish before exit (stream pumps).
    pub tasks: TaskTracker,
    /// Cancelled when shutdown begins.
    pub shutdown: CancellationToken,
}

impl AppState {
    /// Opens the store in the configured data dir (running its migrations) and builds the state.
    pub fn new(config: Config) -> Result<Self, GatewayError> {
        Self::with_embedder(config, None)
    }

    /// As [`AppState::new`], with `embedder` in place of the configured model when given (tests
    /// drive the semantic stage with a fake model this way).
    pub fn with_embedder(
        config: Config,
        embedder: Option<Arc<embed::Embedder>>,
    ) -> Result<Self, GatewayError> {
        let store: Arc<dyn Store> =
            Arc::new(
                SledStore::open(&config.data_dir).map_err(|e| GatewayError::Internal {
                    detail: format!("opening the store in {}: {e}", config.data_dir.display()),
                })?,
            );
        let (semantic, semantic_disabled) = match Semantic::start(&config, &store, embedder) {
            semantic::Status::Ready(s) => (Some(s), None),
            semantic::Status::Disabled(why) => {
                // Loud on purpose: a cache silently without semantic matching is what users of
                // other gateways complain about.
                tracing::error!("SEMANTIC MATCHING DISABLED, serving exact matches only: {why}");
                (None, Some(Arc::from(why)))
            }
        };
        let index = semantic
            .as_ref()
            .map(|s| s.index.clone() as Arc<dyn VectorIndex>);
        let requests = Arc::new(RequestLog::new(config.request_log_size));
        if let Some(s) = &semantic {
            s.embedder.observe_batches(requests.stats.embed_observer());
        }
        Ok(Self {
            upstream: Arc::new(Upstream::new(&config)?),
            requests,
            cache: Cache::new(
                store,
                index,
                semantic.as_ref().map(|s| s.backfill.clone()),
                config.cache_settings(),
            ),
            live: Arc::new(live::Live::new(config.clone())),
            semantic,
            semantic_disabled,
            config: Arc::new(config),
            tasks: TaskTracker::new(),
            shutdown: CancellationToken::new(),
        })
    }
}

/// The gateway's router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/{*rest}", any(passthrough))
        .route("/v1", any(passthrough))
        .route("/healthz", get(healthz))
        .merge(admin::routes(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(not_found)
        .with_state(state)
}

async fn chat_completions(State(state): State<AppState>, request: Request) -> Response {
    proxy_json(state, Route::ChatCompletions, request).await
}

async fn completions(State(state): State<AppState>, request: Request) -> Response {
    proxy_json(state, Route::Completions, request).await
}

async fn embeddings(State(state): State<AppState>, request: Request) -> Response {
    proxy_json(state, Route::Embeddings, request).await
}

#[tracing::instrument(name = "request", skip_all, fields(route = route.name(), id))]
async fn proxy_json(state: AppState, route: Route, request: Request) -> Response {
    let started = Instant::now();
    let request_id = state.requests.next_id();
    tracing::Span::current().record("id", request_id.as_str());
    match ingress::read(route, request, state.config.max_body_bytes, started).await {
        Ok(ingress) => lookup::handle(&state, ingress, request_id).await,
        Err(err) => lookup::error_response(err, &request_id),
    }
}

#[tracing::instrument(name = "request", skip_all, fields(route = "passthrough", id))]
async fn passthrough(State(state): State<AppState>, request: Request) -> Response {
    let request_id = state.requests.next_id();
    tracing::Span::current().record("id", request_id.as_str());
    forward::passthrough(&state, request, request_id).await
}

async fn healthz(State(state): State<AppState>) -> Json<serde_json::Value> {
    let semantic = match (&state.semantic, &state.semantic_disabled) {
        (Some(s), _) => json!({
            "status": "ready",
            "model_dir": state.config.model_dir,
            "dimension": s.embedder.dimension(),
            "vectors": s.index.len(),
            "tombstones": s.index.tombstones(),
            // A rebuild from the stored vectors runs in the background after some starts.
            "index_rebuilding": s.index.is_building(),
            // f32 → f64 would print 0.8999999761581421 for 0.9.
            "threshold": (f64::from(state.live.current().config.similarity_threshold) * 1e4).round() / 1e4,
            "guards": state.live.current().config.semantic_guards,
            "fallbacks": s.fallbacks.load(std::sync::atomic::Ordering::Relaxed),
            "fallback_reasons": s.fallbacks(),
            // Entries stored without a vector (under overload) still waiting for the backfill.
            "backfill_pending": s.backfill.stats().pending,
        }),
        (None, why) => json!({"status": "disabled", "detail": why.as_deref()}),
    };
    Json(json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "upstream": state.upstream.base_url(),
        "mode": if state.semantic.is_some() { "semantic" } else { "exact-only" },
        "entries": state.cache.store.len(),
        "semantic": semantic,
        "admin": state.config.admin_token.is_some(),
    }))
}

async fn not_found(method: Method, request: Request) -> GatewayError {
    GatewayError::RouteNotFound {
        method: method.to_string(),
        path: request.uri().path().to_owned(),
    }
}

/// Serves until `shutdown` resolves, then stops accepting, lets in-flight requests finish within the
/// configured grace period, and returns.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::serve::ListenerExt;
    let token = state.shutdown.clone();
    let grace = state.config.shutdown_grace();
    // Small SSE writes must leave at once, not wait on Nagle's algorithm.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let serve = axum::serve(listener, app(state.clone())).with_graceful_shutdown({
        let token = token.clone();
        async move {
            shutdown.await;
            tracing::info!("shutdown requested: no new connections, finishing in-flight requests");
            token.cancel();
        }
    });
    let bounded = async {
        token.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        result = serve => result?,
        () = bounded => tracing::warn!(grace_ms = grace.as_millis() as u64, "grace period over: dropping in-flight requests"),
    }
    state.tasks.close();
    if tokio::time::timeout(grace, state.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("background tasks still running at exit");
    }
    // Pending cache writes land, and the store is flushed, before `run` returns; then the vector
    // index is saved so the next start can load it instead of rebuilding.
    let cache = state.cache.clone();
    let semantic = state.semantic.clone();
    let _ = tokio::task::spawn_blocking(move || {
        cache.close();
        if let Some(s) = semantic {
            s.stop();
        }
    })
    .await;
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
