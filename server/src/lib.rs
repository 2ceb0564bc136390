//! Reprise gateway library: an OpenAI-compatible proxy that times every latency phase of every request.
//!
//! A request passes these stages, one module each, in this order; [`pipeline::handle`] calls them
//! on one [`pipeline::Exchange`], the per-request context:
//!
//! 1. [`ingress`]: reads the client's body within the size limit, checks content type and the fields
//!    the gateway relies on; writes an [`ingress::Ingress`] (raw bytes kept untouched) and starts the
//!    [`timing::PhaseClock`].
//! 2. [`policy`]: reads `Cache-Control` and `x-reprise-*` headers into a [`policy::Policy`].
//! 3. [`key`]: canonicalizes the request into a partition and an exact [`key::CacheKey`] (blake3).
//! 4. [`pipeline::lookup`]: decides [`pipeline::Decision`]: `Hit` when the [`cache`] holds an
//!    unexpired entry under the exact key, or [`semantic`] matching finds one (it embeds the final
//!    user turn with [`embed`], searches the partition in the vector [`index`] and lets the
//!    [`guard`]s veto candidates that differ in numbers, negation, format, task, direction, an
//!    antonym, a name or one slot of a shared frame; with a judge, [`verify`] decides between
//!    serving, judging and going upstream); `Follow` when an identical miss is in flight; else `Miss`.
//! 5. `pipeline::replay` on a hit: renders the entry's [`entry::Replay`] (its answer,
//!    pre-serialized) with [`render`] as a body or a paced SSE stream, or follows the identical miss
//!    in flight; [`savings`] says what the hit saved (the entry's usage, or its text counted, at the
//!    price table's rates).
//! 6. `pipeline::forward` on a miss: sends the request upstream over the [`upstream`] client's
//!    pooled connections, waits for the first event within the first-byte deadline, then relays the
//!    body or the event stream (framed by [`sse`]) while timing tokens and feeding the
//!    [`cache::Recorder`]. With `semantic_overlap`, the semantic search of stage 4 runs during this
//!    wait, and a hit found first is served instead.
//! 7. [`downstream`]: hands the bytes to the client and notes when the last one was taken.
//! 8. [`record`]: every response body goes through its `Finisher`, which writes the request's
//!    phases and its [`outcome::CacheOutcome`] to the recent-requests log and the stats once the
//!    client took the last byte or left; a clean miss's answer goes to the store through the
//!    cache's writer thread, off the request path; one stored without a vector (its embedding was
//!    refused or late) is embedded later by the `backfill`, when the model is idle. With tracing
//!    on, the request's spans (one per phase) go to the `otel` exporter, which sends them from its
//!    own thread.
//!
//! The modules are built in floors that import downward only (ARCHITECTURE.md, "Floors", checked by
//! `server/tests/it/layers.rs`): small shared names at the bottom, the pipeline's stages near the
//! top, the router here.
//!
//! Around them: [`config`] (layered settings), [`error`] (the one error enum and its OpenAI-shaped
//! responses), [`admin`] (authenticated operator routes), [`shadow`] and [`feedback`] (what
//! semantic matching would have served in shadow mode, and operators' verdicts that veto or approve
//! matches; the lookup consults them), [`serve`] (connections: timeouts, the connection cap, refused
//! request heads), [`state`] (the shared `AppState` and how it is assembled at start), [`reembed`]
//! (a local store re-embedded at start after a change of embedding model), and
//! [`app`]/[`run`] here.

#![warn(unreachable_pub)]

pub(crate) mod admin;
pub mod api;
pub(crate) mod backfill;
pub mod cache;
pub mod config;
pub(crate) mod cors;
pub mod downstream;
pub mod embed;
pub mod entry;
pub(crate) mod error;
pub(crate) mod feedback;
pub mod guard;
pub mod index;
pub mod ingress;
pub mod key;
pub mod live;
pub(crate) mod lock;
pub(crate) mod otel;
pub mod outcome;
pub(crate) mod pipeline;
pub mod policy;
pub(crate) mod priority;
pub mod record;
pub mod reembed;
pub mod render;
pub mod replica;
pub mod savings;
pub mod semantic;
pub(crate) mod serve;
pub(crate) mod shadow;
pub mod sse;
pub mod state;
pub(crate) mod stats;
pub mod store;
pub mod timing;
pub(crate) mod upstream;
pub mod verify;

use std::future::Future;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::response::Response;
use axum::routing::{any, get};
use axum::{Json, Router};
use serde_json::json;
use tokio::net::TcpListener;

use crate::error::GatewayError;
use crate::index::VectorIndex;
use crate::ingress::Route;
pub use crate::state::{AppState, StartError};

/// The gateway's router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", any(chat_completions))
        .route("/v1/completions", any(completions))
        .route("/v1/embeddings", any(embeddings))
        // `GET`/`DELETE /v1/responses/{id}` and its input items pass through below.
        .route("/v1/responses", any(responses))
        // `/v1/messages/count_tokens` and the rest below it pass through to Anthropic's upstream.
        .route("/v1/messages", any(messages))
        .route("/v1/{*rest}", any(passthrough))
        .route("/v1", any(passthrough))
        .route("/healthz", get(healthz))
        .merge(admin::routes(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(not_found)
        .with_state(state)
}

/// A request to a cached route's path: only a `POST` is one the gateway reads. Any other method
/// (a browser's `OPTIONS` preflight, `GET /v1/chat/completions` listing stored completions) passes
/// through as on any other `/v1/*` path, rather than a 404 of the gateway's own; routed here
/// rather than as a method fallback, which would add an `Allow: POST` the upstream never sent.
async fn cached(state: AppState, route: Route, request: Request) -> Response {
    if request.method() == Method::POST {
        pipeline::handle(state, route, request).await
    } else {
        passthrough(State(state), request).await
    }
}

async fn chat_completions(State(state): State<AppState>, request: Request) -> Response {
    cached(state, Route::ChatCompletions, request).await
}

async fn completions(State(state): State<AppState>, request: Request) -> Response {
    cached(state, Route::Completions, request).await
}

async fn embeddings(State(state): State<AppState>, request: Request) -> Response {
    cached(state, Route::Embeddings, request).await
}

async fn responses(State(state): State<AppState>, request: Request) -> Response {
    cached(state, Route::Responses, request).await
}

async fn messages(State(state): State<AppState>, request: Request) -> Response {
    cached(state, Route::Messages, request).await
}

#[tracing::instrument(name = "request", skip_all, fields(route = "passthrough", id))]
async fn passthrough(State(state): State<AppState>, request: Request) -> Response {
    let request_id = state.requests.next_id();
    tracing::Span::current().record("id", request_id.as_str());
    let deleted = cache::responses::deleted_response(request.method(), request.uri().path())
        .map(|id| (id, key::Tenant::from_headers(request.headers(), false)));
    let response = pipeline::forward::passthrough(&state, request, request_id).await;
    if let Some((id, tenant)) = deleted.filter(|_| response.status().is_success()) {
        // Its entries would serve an id the provider no longer knows: forget them, off the path.
        // Entries of stored responses are kept per API key, whatever `share_across_keys` says.
        let cache = state.cache.clone();
        state
            .tasks
            .spawn_blocking(move || cache::responses::forget_deleted(&cache, &tenant.label(), &id));
    }
    response
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
            // Partitions searched flat (every vector served; past 32,768 rows by their rows'
            // sketches) until their graph is built.
            "index_graphs_pending": s.index.current().graphs_pending(),
            // f32 → f64 would print 0.8999999761581421 for 0.9.
            "threshold": (f64::from(state.live.current().similarity_threshold) * 1e4).round() / 1e4,
            "guards": state.live.current().semantic_guards.to_string(),
            "fallbacks": s.fallbacks.load(std::sync::atomic::Ordering::Relaxed),
            "fallback_reasons": s.fallbacks(),
            // Entries stored without a vector (under overload) still waiting for the backfill.
            "backfill_pending": s.backfill.stats().pending,
            // After a change of model: how far re-embedding the store got (null when none runs).
            "reembedding": s.backfill.stats().reembedding,
        }),
        (None, why) => json!({"status": "disabled", "detail": why.as_deref()}),
    };
    // Degraded still answers (every request passes through), so this stays a 200: a probe that
    // restarted the gateway would not bring the disk back.
    let degraded = state.cache.store.degraded();
    Json(json!({
        "status": if degraded.is_some() { "degraded" } else { "ok" },
        "version": env!("CARGO_PKG_VERSION"),
        "upstream": state.upstream.base_url(),
        "anthropic_upstream": state.upstream.anthropic_base_url(),
        "mode": if state.semantic.is_some() { "semantic" } else { "exact-only" },
        "store": match &degraded {
            None => json!({"status": "ok"}),
            // `reads`: lookups still reach the store (Redis refuses writes only).
            Some(d) => json!({"status": "degraded", "reason": d.reason, "since_ms": d.since_ms, "failures": d.failures, "reads": d.reads}),
        },
        "entries": state.cache.store.len(),
        "replica": state.replica.as_ref().map(|r| r.status(state.cache.store.as_ref())),
        "semantic": semantic,
        "admin": state.config.admin_token.is_some(),
        "tracing": state.otel.as_ref().map(|o| json!({
            "endpoint": o.endpoint,
            "exported": o.counters.exported.load(std::sync::atomic::Ordering::Relaxed),
            "dropped": o.counters.dropped.load(std::sync::atomic::Ordering::Relaxed),
            "failed": o.counters.failed.load(std::sync::atomic::Ordering::Relaxed),
            "failed_exports": o.counters.failed_exports.load(std::sync::atomic::Ordering::Relaxed),
        })),
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
    let token = state.shutdown.clone();
    let grace = state.config.shutdown_grace();
    let limits = serve::Limits::for_config(&state.config);
    let metrics = serve::ConnMetrics::new(&state.requests.stats);
    let serve = serve::serve(listener, app(state.clone()), limits, metrics, token.clone());
    let requested = {
        let token = token.clone();
        async move {
            shutdown.await;
            tracing::info!("shutdown requested: no new connections, finishing in-flight requests");
            token.cancel();
            std::future::pending::<()>().await;
        }
    };
    let bounded = async {
        token.cancelled().await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        () = serve => {}
        () = requested => {}
        () = bounded => tracing::warn!(grace_ms = grace.as_millis() as u64, "grace period over: dropping in-flight requests"),
    }
    state.tasks.close();
    if tokio::time::timeout(grace, state.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("background tasks still running at exit");
    }
    // Every record is finished by now: the spans still queued go out within the grace period.
    if let Some(otel) = &state.otel {
        otel.shutdown(grace).await;
    }
    // Pending cache writes land, and the store is flushed, before `run` returns; then the vector
    // index is saved so the next start can load it instead of rebuilding. A failing disk can stall
    // either: shutdown then goes on without them after the grace period, and the process exit
    // releases the store's lock so a replacement can start.
    let cache = state.cache.clone();
    let semantic = state.semantic.clone();
    let closing = tokio::task::spawn_blocking(move || {
        cache.close(grace);
        if let Some(s) = semantic {
            s.stop();
        }
    });
    if tokio::time::timeout(grace, closing).await.is_err() {
        tracing::warn!(
            grace_ms = grace.as_millis() as u64,
            "the store did not close within the grace period: exiting without it"
        );
    }
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
