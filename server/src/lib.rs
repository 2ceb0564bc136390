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
//! 5. [`replay`] on a hit: renders the entry's [`entry::Replay`] (its answer, pre-serialized) as a
//!    body or a paced SSE stream, or follows the identical miss in flight.
//! 6. [`forward`] on a miss: sends the request upstream over a pooled connection, waits for the first
//!    event within the first-byte deadline, then relays the body or the event stream (framed by
//!    [`sse`]) while timing tokens and feeding the [`cache::Recorder`]. With `semantic_overlap`, the
//!    semantic search of stage 4 runs during this wait, and a hit found first is served instead.
//! 7. [`downstream`]: hands the bytes to the client and notes when the last one was taken.
//! 8. [`record`]: the request's phases and its [`record::CacheOutcome`] go to the recent-requests
//!    log and the [`stats`]; a clean miss's answer goes to the store through the cache's writer
//!    thread, off the request path; one stored without a vector (its embedding was refused or late)
//!    is embedded later by the [`backfill`], when the model is idle. With tracing on, the request's
//!    spans (one per phase) go to the [`otel`] exporter, which sends them from its own thread.
//!
//! Around them: [`config`] (layered settings), [`error`] (the one error enum and its OpenAI-shaped
//! responses), [`admin`] (authenticated operator routes), [`shadow`] and [`feedback`] (what
//! semantic matching would have served in shadow mode, and operators' verdicts that veto or approve
//! matches; the lookup consults them), [`serve`] (connections: timeouts, the connection cap, refused
//! request heads), and [`app`]/[`run`] here.

#![warn(unreachable_pub)]

pub(crate) mod admin;
pub(crate) mod backfill;
pub mod cache;
pub mod config;
pub mod downstream;
pub mod embed;
pub mod entry;
pub(crate) mod error;
pub(crate) mod feedback;
pub(crate) mod forward;
pub mod guard;
pub mod index;
pub mod ingress;
pub mod key;
pub mod live;
pub(crate) mod otel;
pub mod outcome;
pub(crate) mod pipeline;
pub mod policy;
pub mod record;
pub mod replay;
pub mod replica;
pub mod semantic;
pub(crate) mod serve;
pub(crate) mod shadow;
pub mod sse;
pub(crate) mod stats;
pub mod store;
pub mod timing;
pub mod verify;

use std::future::Future;
use std::sync::Arc;

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
use crate::store::{ResilientStore, SledStore, Store, StoreError};

/// Shared state of the gateway: cheap to clone, one `Arc` per part.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub upstream: Arc<Upstream>,
    pub requests: Arc<RequestLog>,
    pub cache: Arc<Cache>,
    /// The settings operators can change while serving (thresholds, TTL, pacing, cache mode).
    pub live: Arc<live::CurrentSettings>,
    /// Embedder and vector index; `None` in exact-only mode (see `semantic_disabled`).
    pub semantic: Option<Arc<Semantic>>,
    /// Why semantic matching is off, when it is.
    pub semantic_disabled: Option<Arc<str>>,
    /// Operators' verdicts on semantic matches, and the shadow decisions.
    pub feedback: Arc<feedback::Feedback>,
    /// Background work that must finish before exit (stream pumps).
    pub tasks: TaskTracker,
    /// Cancelled when shutdown begins.
    pub shutdown: CancellationToken,
    /// The OpenTelemetry span exporter; `None` (the default) when traces are off.
    pub otel: Option<Arc<otel::Exporter>>,
    /// How this replica follows the shared store's change feed (`--store redis` only).
    pub replica: Option<Arc<replica::Follower>>,
    /// The judge of near matches and its background queue (`verify = judge`).
    pub verifier: Arc<verify::Verifier>,
}

/// Why the gateway could not start, worded for the operator who reads it on stderr.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the cache store: {0}")]
    Store(StoreError),
    #[error(
        "cannot open the cache store: {0}; refusing to start because --strict-store is set \
         (move the data directory aside, or start without --strict-store to do that automatically)"
    )]
    StrictStore(StoreError),
    #[error("cannot set up the upstream client: {0}")]
    Upstream(String),
    #[error("cannot open even a temporary feedback store: {0}")]
    Feedback(String),
    #[error("cannot set up trace export: {0}")]
    Tracing(String),
}

/// Opens the store in `config.data_dir`. A corrupt store is moved aside (unless `strict_store`),
/// and a disk that is full or failing starts the gateway degraded (answering, not caching) rather
/// than not at all. A path that is not a directory, cannot be written or is locked stops the start.
fn open_store(config: &Config) -> Result<ResilientStore, StartError> {
    if config.store == config::StoreKind::Redis {
        return open_redis(config);
    }
    let dir = &config.data_dir;
    match SledStore::open_or_recover(dir, config.strict_store) {
        Ok((store, _moved_aside)) => Ok(ResilientStore::new(dir, store)),
        Err(e) if e.is_corrupt() && config.strict_store => Err(StartError::StrictStore(e)),
        Err(
            e @ (StoreError::CorruptStore { .. }
            | StoreError::NotADirectory { .. }
            | StoreError::Unwritable { .. }
            | StoreError::Locked { .. }
            | StoreError::Migration(store::MigrationError::Newer { .. })
            | StoreError::CreateDir { .. }),
        ) => Err(StartError::Store(e)),
        // A full or failing disk may recover: serve meanwhile, and let the writer retry.
        Err(e) => {
            tracing::error!(error = %e, "CACHE STORE UNAVAILABLE at start: serving without caching until it opens");
            Ok(ResilientStore::unavailable(dir, &e))
        }
    }
}

/// Connects to the shared Redis store. An unreachable server starts the gateway degraded
/// (answering from upstream, not caching) rather than not at all: the writer thread keeps trying.
fn open_redis(config: &Config) -> Result<ResilientStore, StartError> {
    let url = config.redis_url.as_ref().map_or("", |u| u.expose());
    let replica = config
        .replica_id
        .clone()
        .unwrap_or_else(store::redis_default_replica);
    let redis = store::RedisStore::named(url, &replica).map_err(StartError::Store)?;
    let reached = redis.ping().and_then(|()| redis.refresh_counts());
    let store = ResilientStore::redis(redis);
    if let Err(e) = reached {
        tracing::error!(error = %e, "REDIS STORE UNAVAILABLE at start: serving without caching until it answers");
        store.fail(&e);
    }
    Ok(store)
}

/// Semantic matching on a shared store only with the model whose vectors the store holds: a
/// replica with another model (or another version of it) would compare vectors that do not
/// compare, and serve wrong answers at any threshold.
fn same_model(semantic: Arc<Semantic>, store: &dyn Store) -> semantic::Status {
    let Some(feed) = store.feed() else {
        return semantic::Status::Ready(semantic);
    };
    let mine = semantic.embedder.fingerprint().to_owned();
    match feed.agree_model(&mine) {
        Ok(None) => semantic::Status::Ready(semantic),
        Ok(Some(theirs)) => {
            semantic.stop();
            semantic::Status::Disabled(format!(
                "the shared store's vectors come from another embedding model (fingerprint {theirs}; this replica's model is {mine}), and vectors of two models cannot be compared. Run the same model on every replica; to switch models, flush the cache and delete the Redis key `reprise:model`, then start the replicas with the new model"
            ))
        }
        Err(e) => {
            // Unknown until Redis answers; the vectors this replica writes carry its own model.
            tracing::warn!(error = %e, "cannot check the shared store's embedding model at start");
            semantic::Status::Ready(semantic)
        }
    }
}

/// Opens the operators' verdicts and shadow decisions. Like the cache store, a full, failing or
/// corrupt disk must not stop the gateway from answering: the verdicts are then kept in a
/// temporary database until a restart, and the log says so once, loudly.
fn open_feedback(dir: &std::path::Path) -> Result<feedback::Feedback, StartError> {
    // sled can panic on a damaged file instead of returning an error.
    let opened = std::panic::catch_unwind(|| feedback::Feedback::open(dir)).unwrap_or_else(|_| {
        Err(sled::Error::Unsupported(
            "sled panicked while opening".into(),
        ))
    });
    match opened {
        Ok(feedback) => Ok(feedback),
        Err(e) => {
            tracing::error!(
                error = %e,
                dir = %dir.display(),
                "FEEDBACK STORE UNAVAILABLE: verdicts and shadow decisions are kept in memory until a restart"
            );
            feedback::Feedback::temporary().map_err(|e| StartError::Feedback(e.to_string()))
        }
    }
}

impl AppState {
    /// Opens the store in the configured data dir (running its migrations) and builds the state.
    pub fn new(config: Config) -> Result<Self, StartError> {
        Self::with_embedder(config, None)
    }

    /// As [`AppState::new`], with `embedder` in place of the configured model when given (tests
    /// drive the semantic stage with a fake model this way).
    pub fn with_embedder(
        config: Config,
        embedder: Option<Arc<embed::Embedder>>,
    ) -> Result<Self, StartError> {
        let store: Arc<dyn Store> = Arc::new(open_store(&config)?);
        Self::assemble(config, store, embedder)
    }

    /// As [`AppState::new`], with entries in `store` instead of the configured one: an embedding
    /// application's own [`Store`] (tests drive a slow or failing store this way).
    pub fn with_store(config: Config, store: Arc<dyn Store>) -> Result<Self, StartError> {
        Self::assemble(config, store, None)
    }

    /// Both of the above: the application's own store and embedding model.
    pub fn with_store_and_embedder(
        config: Config,
        store: Arc<dyn Store>,
        embedder: Option<Arc<embed::Embedder>>,
    ) -> Result<Self, StartError> {
        Self::assemble(config, store, embedder)
    }

    fn assemble(
        config: Config,
        store: Arc<dyn Store>,
        embedder: Option<Arc<embed::Embedder>>,
    ) -> Result<Self, StartError> {
        // Before the index loads from the store: changes made meanwhile are applied after it.
        let feed_start = store.feed().map(|feed| feed.tail()).and_then(|tail| {
            tail.inspect_err(|e| tracing::warn!(error = %e, "cannot read the change feed at start: this replica rebuilds from the store once Redis answers"))
                .ok()
        });
        let status = match Semantic::start(&config, &store, embedder) {
            semantic::Status::Ready(s) => same_model(s, store.as_ref()),
            disabled => disabled,
        };
        let (semantic, semantic_disabled) = match status {
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
        let feedback = Arc::new(open_feedback(&config.data_dir.join("feedback"))?);
        let requests = Arc::new(RequestLog::new(config.request_log_size));
        requests.stats.register(feedback.observations.collector());
        requests
            .stats
            .declare_skip_reasons(&semantic::FallbackReason::ALL.map(|r| r.name()));
        if let Some(s) = &semantic {
            s.embedder.observe_batches(requests.stats.embed_observer());
            s.embedder
                .observe_queue_waits(requests.stats.embed_wait_observer());
        }
        let otel = otel::Settings::resolve(config.otlp_endpoint.as_deref(), |name| {
            std::env::var(name).ok()
        })
        .map_err(StartError::Tracing)?
        .map(otel::Exporter::start)
        .transpose()
        .map_err(|e| StartError::Tracing(format!("cannot start the export thread: {e}")))?;
        let upstream = Upstream::new(&config).map_err(|e| match e {
            GatewayError::Internal { detail } => StartError::Upstream(detail),
            other => StartError::Upstream(other.to_string()),
        })?;
        let verifier = Arc::new(verify::Verifier::new(&config).map_err(StartError::Upstream)?);
        for collector in verifier.judge.counts.collectors() {
            requests.stats.register(collector);
        }
        let live = Arc::new(live::CurrentSettings::new(config.live.clone()));
        let shutdown = CancellationToken::new();
        let replica = replica::follow(
            replica::Parts {
                store: store.clone(),
                semantic: semantic.clone(),
                live: live.clone(),
                baseline: config.live.clone(),
                feedback: feedback.clone(),
                stop: shutdown.clone(),
            },
            feed_start,
        );
        Ok(Self {
            upstream: Arc::new(upstream),
            requests,
            cache: Cache::new(
                store,
                index,
                semantic.as_ref().map(|s| s.backfill.clone()),
                config.cache_settings(),
            ),
            live,
            semantic,
            semantic_disabled,
            feedback,
            config: Arc::new(config),
            tasks: TaskTracker::new(),
            shutdown,
            otel,
            replica,
            verifier,
        })
    }
}

/// The gateway's router.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        // `GET`/`DELETE /v1/responses/{id}` and its input items pass through below.
        .route("/v1/responses", post(responses))
        .route("/v1/{*rest}", any(passthrough))
        .route("/v1", any(passthrough))
        .route("/healthz", get(healthz))
        .merge(admin::routes(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(not_found)
        .with_state(state)
}

async fn chat_completions(State(state): State<AppState>, request: Request) -> Response {
    pipeline::handle(state, Route::ChatCompletions, request).await
}

async fn completions(State(state): State<AppState>, request: Request) -> Response {
    pipeline::handle(state, Route::Completions, request).await
}

async fn embeddings(State(state): State<AppState>, request: Request) -> Response {
    pipeline::handle(state, Route::Embeddings, request).await
}

async fn responses(State(state): State<AppState>, request: Request) -> Response {
    pipeline::handle(state, Route::Responses, request).await
}

#[tracing::instrument(name = "request", skip_all, fields(route = "passthrough", id))]
async fn passthrough(State(state): State<AppState>, request: Request) -> Response {
    let request_id = state.requests.next_id();
    tracing::Span::current().record("id", request_id.as_str());
    let deleted = cache::responses::deleted_response(request.method(), request.uri().path())
        .map(|id| (id, key::Tenant::from_headers(request.headers(), false)));
    let response = forward::passthrough(&state, request, request_id).await;
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
            // f32 → f64 would print 0.8999999761581421 for 0.9.
            "threshold": (f64::from(state.live.current().similarity_threshold) * 1e4).round() / 1e4,
            "guards": state.live.current().semantic_guards.to_string(),
            "fallbacks": s.fallbacks.load(std::sync::atomic::Ordering::Relaxed),
            "fallback_reasons": s.fallbacks(),
            // Entries stored without a vector (under overload) still waiting for the backfill.
            "backfill_pending": s.backfill.stats().pending,
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
