//! The gateway's shared state ([`AppState`]: one `Arc` per part, cheap to clone) and how it is
//! assembled at start: the store opened (or started degraded), semantic matching started with the
//! store's model, the feedback store, the request log and its metrics, the upstream client, the
//! judge and the replica's feed follower. It wires parts together; it holds no request logic.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cache::Cache;
use crate::config::{self, Config};
use crate::error::GatewayError;
use crate::index::VectorIndex;
use crate::record::RequestLog;
use crate::semantic::{self, Semantic};
use crate::store::{self, ResilientStore, SledStore, Store, StoreError};
use crate::upstream::Upstream;
use crate::{embed, feedback, live, otel, replica, savings, verify};

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
    /// The price table and what each entry's answer cost in tokens: what a hit saved.
    pub savings: Arc<savings::Accounting>,
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
    #[error("cannot read the price table: {0}")]
    Prices(String),
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

pub use crate::reembed::{MODEL_RECORD_FILE, UNRECORDED_STORE_MODEL};

/// Semantic matching only with the model whose vectors the store holds: a gateway with another
/// model (or another version of it, such as another quantization of the same weights) would compare
/// vectors that do not compare, and serve wrong answers at any threshold.
///
/// A store no other process shares was checked as the stage started: one whose vectors are
/// another model's is re-embedded ([`crate::reembed`]). Replicas sharing a store cannot do that
/// one by one, so they refuse semantic matching until the operator switches them all.
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
        // When the store's open will scan it (after a crash: 75-100 s at a million entries), the
        // index dump loads meanwhile (10-14 s) instead of after it. After a clean close the open
        // takes a second or two of the same cores, and loading beside it only made the gateway
        // listen later (measured at a million entries), so the load waits for it then.
        let preload = (config.store == config::StoreKind::Sled
            && SledStore::opens_by_scan(&config.data_dir))
        .then(|| semantic::DumpPreload::start(&config))
        .flatten();
        let store: Arc<dyn Store> = Arc::new(open_store(&config)?);
        Self::assemble(config, store, embedder, preload)
    }

    /// As [`AppState::new`], with entries in `store` instead of the configured one: an embedding
    /// application's own [`Store`] (tests drive a slow or failing store this way).
    pub fn with_store(config: Config, store: Arc<dyn Store>) -> Result<Self, StartError> {
        Self::assemble(config, store, None, None)
    }

    /// Both of the above: the application's own store and embedding model.
    pub fn with_store_and_embedder(
        config: Config,
        store: Arc<dyn Store>,
        embedder: Option<Arc<embed::Embedder>>,
    ) -> Result<Self, StartError> {
        Self::assemble(config, store, embedder, None)
    }

    fn assemble(
        config: Config,
        store: Arc<dyn Store>,
        embedder: Option<Arc<embed::Embedder>>,
        preload: Option<semantic::DumpPreload>,
    ) -> Result<Self, StartError> {
        // Before the index loads from the store: changes made meanwhile are applied after it.
        let feed_start = store.feed().map(|feed| feed.tail()).and_then(|tail| {
            tail.inspect_err(|e| tracing::warn!(error = %e, "cannot read the change feed at start: this replica rebuilds from the store once Redis answers"))
                .ok()
        });
        let status = match Semantic::start(&config, &store, embedder, preload) {
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
        let savings = Arc::new(
            savings::Accounting::load(config.prices.as_ref(), &config.namespace_prices)
                .map_err(StartError::Prices)?,
        );
        let verifier = Arc::new(verify::Verifier::new(&config).map_err(StartError::Upstream)?);
        // Judge calls are a cost against what hits save, priced with the same table.
        verifier.judge.counts.price_with(savings.clone());
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
            savings,
        })
    }
}
