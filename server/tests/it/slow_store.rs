//! A slow store must slow only the requests that need it: store calls run off the async workers,
//! so while every lookup waits on the store, `/healthz` and a pass-through route are answered at
//! once (before, a blocking store call on each of the two workers held every request).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reprise_client::delay::DelayProxy;
use reprise_server::entry::{Entry, EntryId, HitEvent, Replay};
use reprise_server::key::CacheKey;
use reprise_server::store::{SledStore, Store, StoreError, Upkeep};
use reprise_server::AppState;

use crate::common::*;
use crate::redis::{ask, on_redis_url, RedisServer};

/// The sled store, with every exact-key read taking `delay` of wall time once `slow` is set: a
/// Redis behind a slow link, or a disk that stalls.
struct SlowReads {
    inner: SledStore,
    delay: Duration,
    slow: Arc<std::sync::atomic::AtomicBool>,
}

impl SlowReads {
    fn wait(&self) {
        if self.slow.load(Ordering::SeqCst) {
            std::thread::sleep(self.delay);
        }
    }
}

impl Store for SlowReads {
    fn get(&self, id: EntryId) -> Result<Option<Entry>, StoreError> {
        self.wait();
        self.inner.get(id)
    }

    fn get_by_key(&self, key: &CacheKey) -> Result<Option<Entry>, StoreError> {
        self.wait();
        self.inner.get_by_key(key)
    }

    fn replay_by_key(&self, key: &CacheKey) -> Result<Option<Replay>, StoreError> {
        self.wait();
        self.inner.replay_by_key(key)
    }

    fn replay(&self, id: EntryId) -> Result<Option<Replay>, StoreError> {
        self.wait();
        self.inner.replay(id)
    }

    fn put(&self, entry: Entry) -> Result<EntryId, StoreError> {
        self.inner.put(entry)
    }

    fn delete(&self, id: EntryId) -> Result<bool, StoreError> {
        self.inner.delete(id)
    }

    fn touch(&self, id: EntryId, hits: u64, recent: &[HitEvent]) -> Result<(), StoreError> {
        self.inner.touch(id, hits, recent)
    }

    fn set_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.inner.set_vector(id, vector)
    }

    fn replace_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.inner.replace_vector(id, vector)
    }

    fn list_newest(&self, before: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.inner.list_newest(before, limit)
    }

    fn list(&self, after: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.inner.list(after, limit)
    }

    fn ids(&self) -> Result<Vec<EntryId>, StoreError> {
        self.inner.ids()
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn bytes(&self) -> u64 {
        self.inner.bytes()
    }
}

impl Upkeep for SlowReads {
    fn sweep(
        &self,
        now_ms: u64,
        max_entries: usize,
        max_bytes: u64,
    ) -> Result<(usize, usize), StoreError> {
        self.inner.sweep(now_ms, max_entries, max_bytes)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush()
    }

    fn clear(&self) -> Result<usize, StoreError> {
        self.inner.clear()
    }
}

/// Asks until the answer is served from the cache (it is written off the request path).
async fn until_hit(gw: &Gateway, question: &str) {
    for _ in 0..200 {
        if header(&ask(gw, question).await, "x-reprise-cache").as_deref() == Some("hit") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the answer never became a hit: {}", health(gw).await);
}

/// Sends `lookups` identical cached requests and, while they wait on the store, `/healthz` and a
/// pass-through `GET /v1/models`. Returns how many lookups had finished when each answered, and
/// the lookups' outcomes.
async fn others_during_lookups(
    gw: &Arc<Gateway>,
    question: &str,
    lookups: usize,
) -> (usize, usize, Vec<Option<String>>) {
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..lookups)
        .map(|_| {
            let (gw, done, question) = (gw.clone(), done.clone(), question.to_owned());
            tokio::spawn(async move {
                let response = ask(&gw, &question).await;
                let outcome = header(&response, "x-reprise-cache");
                done.fetch_add(1, Ordering::SeqCst);
                outcome
            })
        })
        .collect();
    // Let the lookups reach the store.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let healthy = health(gw).await;
    assert!(healthy["status"].is_string(), "{healthy}");
    let done_at_health = done.load(Ordering::SeqCst);
    let models = client()
        .get(gw.url("/v1/models"))
        .bearer_auth("sk-a")
        .send()
        .await
        .expect("models");
    assert_eq!(models.status(), 200);
    let done_at_models = done.load(Ordering::SeqCst);
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.expect("lookup"));
    }
    (done_at_health, done_at_models, outcomes)
}

/// Two workers, as on a two-core machine, and exact-key reads that each take 150 ms (under the
/// 200 ms deadline of a store call): 16 lookups held both workers for 1.2 s before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_store_never_stalls_requests_that_do_not_need_it() {
    let sim = quick_sim().await;
    let mut config = config_for(sim.base_url());
    config.semantic = false;
    let slow = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = slow.clone();
    let gw = Arc::new(
        start_with(config, move |config| {
            let inner = SledStore::open(&config.data_dir).expect("sled");
            let store = SlowReads {
                inner,
                delay: Duration::from_millis(150),
                slow: flag,
            };
            AppState::with_store(config, Arc::new(store)).expect("state")
        })
        .await,
    );
    until_hit(&gw, "a question asked many times").await;
    slow.store(true, Ordering::SeqCst);
    let (at_health, at_models, outcomes) =
        others_during_lookups(&gw, "a question asked many times", 16).await;
    assert_eq!(
        (at_health, at_models),
        (0, 0),
        "/healthz and /v1/models waited for lookups stuck in the store: store calls are holding \
         the async workers"
    );
    assert!(
        outcomes.iter().all(|o| o.as_deref() == Some("hit")),
        "a slow store within the deadline still serves its hits: {outcomes:?}"
    );
}

fn redis_addr(redis: &RedisServer) -> SocketAddr {
    let url = redis.url();
    let host = url
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_owned();
    host.parse().expect("redis address")
}

/// The same through a real Redis whose every reply comes 10 ms late (5 ms each way through a
/// delaying proxy: below the store's 50 ms command timeout, so it stays `ok`): the requests that
/// need no store are answered while the lookups still wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_never_stalls_requests_that_do_not_need_it() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let proxy = DelayProxy::start(redis_addr(&redis), Duration::from_millis(5))
        .await
        .expect("delay proxy");
    let sim = quick_sim().await;
    let mut config = on_redis_url(
        format!("redis://{}/", proxy.addr),
        config_for(sim.base_url()),
    );
    config.semantic = false;
    let gw = Arc::new(start(config).await);
    until_hit(&gw, "a question asked many times").await;
    let (at_health, _, outcomes) =
        others_during_lookups(&gw, "a question asked many times", 16).await;
    // A loaded machine may push a round trip past the store's deadline: that lookup fails open
    // (a miss, or a follower of the local flight), the store still serves the others.
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o.as_deref(), Some("hit" | "miss" | "coalesced"))),
        "{outcomes:?}"
    );
    assert!(
        outcomes.iter().any(|o| o.as_deref() == Some("hit")),
        "a slow Redis still serves its hits: {outcomes:?}"
    );
    assert!(
        at_health < outcomes.len(),
        "/healthz waited for every Redis lookup"
    );
}
