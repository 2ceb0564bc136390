//! The shared Redis store (`--store redis`) against a real `redis-server` on a loopback port: the
//! same store assertions as sled's, expiry by Redis itself, two gateways on one Redis serving each
//! other's answers, a Redis killed mid-test (requests still answered, `/healthz` degraded,
//! caching back once it restarts), and single flight across replicas (claims in Redis). Needs
//! Debian's redis-server (scripts/test.sh installs it); without it these tests skip locally and
//! fail in CI.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use reprise_server::config::{Config, Secret, StoreKind};
use reprise_server::entry::{
    Entry, EntryId, HitEvent, HitKind, Replay, RequestSummary, StoredEvent,
};
use reprise_server::key::{CacheKey, PartitionKey};
use reprise_server::store::{
    Claim, ClaimToken, Coordination, RedisStore, SledStore, Store, Upkeep,
};
use reprise_server::timing::Phases;
use serde_json::{json, Value};

use crate::common::*;
use crate::semantic::{models, semantic_config};

/// A `redis-server` on a free loopback port, without persistence, killed on drop.
pub(crate) struct RedisServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

/// The server binary: `REPRISE_TEST_REDIS_BINARY` when set (scripts/test.sh runs the suite a second
/// time with Valkey's `valkey-server`), else `redis-server` on PATH, or `None` (skip) when that is
/// missing outside CI.
pub(crate) fn redis_server_binary() -> Option<PathBuf> {
    if let Some(binary) = std::env::var_os("REPRISE_TEST_REDIS_BINARY") {
        let binary = PathBuf::from(binary);
        assert!(
            binary.is_file(),
            "REPRISE_TEST_REDIS_BINARY: no file at {binary:?}"
        );
        return Some(binary);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("redis-server"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "redis-server is missing: scripts/test.sh installs Debian's redis-server"
        );
        eprintln!("skipping: no redis-server on PATH (apt-get install redis-server)");
    }
    found
}

impl RedisServer {
    pub(crate) fn start() -> Option<Self> {
        let binary = redis_server_binary()?;
        // The port was free when picked, and may be another test's server's by now: a new one.
        for _ in 0..5 {
            let mut server = Self::unstarted()?;
            if server.try_spawn(&binary) {
                return Some(server);
            }
        }
        panic!("redis-server never started on a port of its own");
    }

    /// A free port and a folder, with no server on it yet.
    fn unstarted() -> Option<Self> {
        redis_server_binary()?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        Some(Self {
            port,
            dir: tempfile::tempdir().expect("tempdir"),
            child: None,
        })
    }

    fn spawn(&mut self, binary: &std::path::Path) {
        assert!(
            self.try_spawn(binary),
            "redis-server on port {} never answered",
            self.port
        );
    }

    /// Starts the server; false unless it is the one that answers on the port (a server that
    /// could not bind it exits, while another test's may answer there).
    fn try_spawn(&mut self, binary: &std::path::Path) -> bool {
        let child = Command::new(binary)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let pid = child.id();
        self.child = Some(child);
        let store = RedisStore::new(&self.url()).expect("url");
        for _ in 0..500 {
            if store.ping().is_ok() {
                return self.answering_pid() == Some(pid);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// The process id of the server answering on the port (`INFO server`).
    fn answering_pid(&self) -> Option<u32> {
        let client = ::redis::Client::open(self.url()).ok()?;
        let mut c = client.get_connection().ok()?;
        let info: String = ::redis::cmd("INFO").arg("server").query(&mut c).ok()?;
        info.lines()
            .find_map(|line| line.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the server: a stopped server still accepts
    /// connections (the kernel does) but never answers, as a hung or overloaded one.
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    pub(crate) fn restart(&mut self) {
        self.kill();
        self.spawn(&redis_server_binary().expect("redis-server"));
    }

    /// Writes what it holds to its folder and stops: [`RedisServer::start_again`] brings it back
    /// with its data, as a Redis with persistence after an outage.
    pub(crate) fn save_and_stop(&mut self) {
        use std::io::{Read, Write};
        // An inline command, as redis-cli would send it.
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        conn.write_all(b"SAVE\r\n").expect("send SAVE");
        let mut reply = [0u8; 5];
        conn.read_exact(&mut reply).expect("SAVE's reply");
        assert_eq!(&reply, b"+OK\r\n");
        self.kill();
    }

    pub(crate) fn start_again(&mut self) {
        self.spawn(&redis_server_binary().expect("redis-server"));
    }

    fn store(&self) -> RedisStore {
        let store = RedisStore::new(&self.url()).expect("url");
        store.refresh_counts().expect("reachable");
        store
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

pub(crate) fn key(n: u64) -> CacheKey {
    CacheKey(*blake3::hash(&n.to_le_bytes()).as_bytes())
}

pub(crate) fn entry(n: u64, ttl_ms: u64) -> Entry {
    Entry {
        id: EntryId(999_999),
        key: key(n),
        partition: PartitionKey([1; 32]),
        summary: RequestSummary {
            route: "chat.completions".into(),
            model: "sim-1".into(),
            namespace: None,
            tenant: "shared".into(),
            prompt: format!("question {n}"),
            stream: true,
        },
        events: vec![StoredEvent {
            offset_ms: 0.0,
            data: json!({"choices": [{"delta": {"content": format!("answer {n}")}}]}),
        }],
        body: json!({"choices": [{"message": {"content": format!("answer {n}")}}]}),
        usage: Some(json!({"completion_tokens": 2})),
        phases: Phases {
            ttft_ms: Some(120.0),
            total_ms: 150.0,
            ..Phases::default()
        },
        created_at_ms: reprise_server::timing::unix_ms(),
        ttl_ms,
        hit_count: 0,
        last_hit_ms: 0,
        vector: None,
        hit_history: Vec::new(),
        warmed: false,
    }
}

fn hit(at_ms: u64) -> HitEvent {
    HitEvent {
        at_ms,
        kind: HitKind::Hit,
        similarity: None,
        request_id: "req_1".into(),
        ttft_ms: Some(0.5),
        ttft_saved_ms: Some(100.0),
    }
}

/// The store contract both backends must keep, read through the trait alone.
pub(crate) fn round_trips(store: &dyn Store) {
    assert_eq!(store.clear().expect("clear"), 0);
    let hour = 3_600_000;
    let original = entry(1, hour);
    let id = store.put(original.clone()).expect("put");
    let stored = Entry { id, ..original };

    assert_eq!(store.get(id).expect("get"), Some(stored.clone()));
    assert_eq!(
        store.get_by_key(&key(1)).expect("get_by_key"),
        Some(stored.clone())
    );
    let replay = Replay::of(&stored);
    assert_eq!(
        store.replay_by_key(&key(1)).expect("replay_by_key"),
        Some(replay.clone())
    );
    assert_eq!(store.replay(id).expect("replay"), Some(replay));
    assert_eq!(store.replay_by_key(&key(2)).expect("other key"), None);
    assert_eq!(store.len(), 1);
    assert!(store.bytes() > 0);

    // Hits: counted, recency forward only, history kept.
    store.touch(id, 2, &[hit(5_000)]).expect("touch");
    store.touch(id, 1, &[hit(4_000)]).expect("touch");
    let touched = store.get(id).expect("get").expect("there");
    assert_eq!(touched.hit_count, 3);
    assert_eq!(touched.last_hit_ms, 5_000);
    assert_eq!(touched.hit_history.len(), 2);
    assert_eq!(touched.hit_history[0].at_ms, 4_000);

    // The backfill's vector: once.
    assert!(store.set_vector(id, &[0.5, 0.25]).expect("set_vector"));
    assert!(!store.set_vector(id, &[1.0, 0.0]).expect("set_vector"));
    assert_eq!(
        store.get(id).expect("get").expect("there").vector,
        Some(vec![0.5, 0.25])
    );
    assert!(!store
        .set_vector(EntryId(u64::MAX - 1), &[1.0])
        .expect("gone"));

    // A second answer under the same key replaces (and deletes) the first.
    let second = store.put(entry(1, hour)).expect("put again");
    assert!(second > id, "ids only grow");
    assert_eq!(store.get(id).expect("old"), None);
    assert_eq!(
        store
            .replay_by_key(&key(1))
            .expect("replaced")
            .map(|r| r.id()),
        Some(second)
    );
    let third = store.put(entry(3, hour)).expect("put");
    assert_eq!(store.ids().expect("ids"), vec![second, third]);
    let listed: Vec<EntryId> = store
        .list(None, 10)
        .expect("list")
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(listed, vec![second, third]);
    let after: Vec<EntryId> = store
        .list(Some(second), 10)
        .expect("list")
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(after, vec![third]);
    let newest: Vec<EntryId> = store
        .list_newest(None, 1)
        .expect("newest")
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(newest, vec![third]);

    assert!(store.delete(second).expect("delete"));
    assert!(!store.delete(second).expect("delete again"));
    assert_eq!(store.replay_by_key(&key(1)).expect("deleted"), None);
    assert_eq!(store.get_by_key(&key(1)).expect("deleted"), None);

    // Over the entry cap, a sweep evicts down to it.
    store.put(entry(4, hour)).expect("put");
    let (_, evicted) = store
        .sweep(reprise_server::timing::unix_ms(), 1, u64::MAX)
        .expect("sweep");
    assert_eq!(evicted, 1);
    assert_eq!(store.len(), 1);
    assert_eq!(store.ids().expect("ids").len(), 1);

    assert_eq!(store.clear().expect("clear"), 1);
    assert_eq!(store.len(), 0);
    assert!(store.ids().expect("ids").is_empty());
    // Ids are never reused, even after a clear.
    assert!(store.put(entry(5, hour)).expect("put") > third);
}

#[test]
fn the_redis_store_keeps_the_same_contract_as_sled() {
    let dir = tempfile::tempdir().expect("tempdir");
    round_trips(&SledStore::open(dir.path()).expect("sled"));
    let Some(redis) = RedisServer::start() else {
        return;
    };
    round_trips(&redis.store());
}

/// Over a cap, the least recently used entries go first, whichever replica recorded the hits.
#[test]
fn eviction_over_a_cap_is_least_recently_used_across_replicas() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = (redis.store(), redis.store());
    let hour = 3_600_000;
    let now = reprise_server::timing::unix_ms();
    let mut ids = Vec::new();
    for n in 1..=4 {
        // Stored a second apart, oldest first.
        let mut e = entry(n, hour);
        e.created_at_ms = now - 10_000 + n * 1_000;
        ids.push(a.put(e).expect("put"));
    }
    // The oldest is hit (recorded by the other replica): it is now the most recently used.
    b.touch(ids[0], 1, &[hit(now)]).expect("touch");

    let sweeper = redis.store();
    assert_eq!(sweeper.sweep(now, 2, u64::MAX).expect("sweep"), (0, 2));
    let left: Vec<EntryId> = sweeper
        .list(None, 10)
        .expect("list")
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(
        left,
        vec![ids[0], ids[3]],
        "the hit entry and the newest stay"
    );
}

/// A replica killed between writing an entry and naming it under its key leaves it in the registry;
/// once another replica stores an answer for the same key, the sweep removes the older one.
#[test]
fn a_sweep_removes_an_entry_superseded_for_its_key() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = redis.store();
    let hour = 3_600_000;
    let orphan = store.put(entry(1, hour)).expect("put");
    // As if its writer had died before naming it: its registry row names key 2, no key row does.
    let client = ::redis::Client::open(redis.url()).expect("url");
    let mut c = client.get_connection().expect("connect");
    let row: String = ::redis::cmd("HGET")
        .arg("reprise:index")
        .arg(orphan.0)
        .query(&mut c)
        .expect("registry row");
    let row = row.replace(&key(1).to_hex(), &key(2).to_hex());
    ::redis::cmd("HSET")
        .arg("reprise:index")
        .arg(orphan.0)
        .arg(&row)
        .query::<()>(&mut c)
        .expect("HSET");
    let named = store.put(entry(2, hour)).expect("put");
    let other = store.put(entry(3, hour)).expect("put");

    // Its routine recount due at once (it counted when it connected).
    let fresh = redis.store().recount_every(Duration::ZERO);
    // Not an eviction (no cap is exceeded): a clean-up.
    assert_eq!(fresh.sweep(0, 1_000, u64::MAX).expect("sweep"), (0, 0));
    assert_eq!(fresh.get(orphan).expect("get"), None);
    assert_eq!(
        fresh.get_by_key(&key(2)).expect("get").map(|e| e.id),
        Some(named)
    );
    assert_eq!(
        fresh.get_by_key(&key(3)).expect("get").map(|e| e.id),
        Some(other)
    );
    assert_eq!(fresh.len(), 2);
}

/// A replica counts what the others write at its next sweep (`HLEN`, without reading the
/// registry), and a cap their writes exceed evicts at once, down to the cap.
#[test]
fn other_replicas_writes_count_at_the_next_sweep_and_evict_over_a_cap() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = (redis.store(), redis.store());
    let hour = 3_600_000;
    a.put(entry(1, hour)).expect("put");
    assert_eq!(a.sweep(0, 100, u64::MAX).expect("sweep"), (0, 0));
    for n in 2..=5 {
        b.put(entry(n, hour)).expect("put");
    }
    // The last recount is a moment old: no new one is due, and the count is already right.
    assert_eq!(a.sweep(0, 100, u64::MAX).expect("sweep"), (0, 0));
    assert_eq!(a.len(), 5);
    // Their writes exceed a cap of 3: the two least recently used go now.
    assert_eq!(a.sweep(0, 3, u64::MAX).expect("sweep"), (0, 2));
    assert_eq!(a.len(), 3);
    assert_eq!(b.ids().expect("ids").len(), 3);
    assert_eq!(a.get_by_key(&key(1)).expect("get"), None, "the oldest went");
}

/// A routine recount reads the registry a slice per sweep (the writer thread stores answers in
/// between), and once it has read it all, the rows of expired entries are gone.
#[test]
fn a_routine_recount_spreads_over_sweeps_and_prunes_the_rows_of_expired_entries() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = redis.store().recount_every(Duration::ZERO);
    let kept = store.put(entry(1, 3_600_000)).expect("put");
    assert_eq!(store.sweep(0, usize::MAX, u64::MAX).expect("sweep"), (0, 0));
    // 200,000 rows, as other replicas' entries leave them (the recount reads rows only), the
    // last 1,000 of entries expired a minute ago.
    let client = ::redis::Client::open(redis.url()).expect("url");
    let mut c = client.get_connection().expect("connect");
    let expired_at = reprise_server::timing::unix_ms() - 60_000;
    let (live, expired) = (199_000u64, 1_000u64);
    for chunk in (0..live + expired).collect::<Vec<_>>().chunks(1_000) {
        let mut hset = ::redis::cmd("HSET");
        hset.arg("reprise:index");
        for &n in chunk {
            let expires = if n < live { 0 } else { expired_at };
            hset.arg(kept.0 + 1 + n)
                .arg(format!("{expires} 100 {n:064x} 0"));
        }
        hset.query::<i64>(&mut c).expect("HSET");
    }
    let rows = |c: &mut ::redis::Connection| -> u64 {
        ::redis::cmd("HLEN")
            .arg("reprise:index")
            .query(c)
            .expect("HLEN")
    };
    let mut sweeps = 0;
    while rows(&mut c) > live + 1 {
        assert_eq!(store.sweep(0, usize::MAX, u64::MAX).expect("sweep"), (0, 0));
        sweeps += 1;
        assert!(sweeps < 100_000, "the recount never ended");
    }
    assert!(sweeps > 1, "read whole in one sweep");
    assert_eq!(store.len() as u64, live + 1);
    assert!(store.get(kept).expect("get").is_some());
}

/// `HSCAN` steps the server has served: reads of the registry.
fn hscans(redis: &RedisServer) -> u64 {
    let client = ::redis::Client::open(redis.url()).expect("url");
    let mut c = client.get_connection().expect("connect");
    let info: String = ::redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut c)
        .expect("INFO");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_hscan:calls="))
        .map_or(0, |rest| {
            rest.split(',')
                .next()
                .expect("calls")
                .parse()
                .expect("a count")
        })
}

fn ids_of(entries: &[Entry]) -> Vec<EntryId> {
    entries.iter().map(|e| e.id).collect()
}

/// Listings page over one read of the registry: the pages after it, and what other replicas
/// store or delete meanwhile, cost a `GET` of the id counter, not another read of every row.
#[test]
fn listings_read_the_registry_once_and_still_list_what_any_replica_stores_since() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let (a, b) = (redis.store(), redis.store());
    let hour = 3_600_000;
    let mut ids: Vec<EntryId> = (1..=5)
        .map(|n| a.put(entry(n, hour)).expect("put"))
        .collect();
    let newest = |ids: &[EntryId]| ids.iter().rev().copied().collect::<Vec<_>>();
    assert_eq!(
        ids_of(&a.list_newest(None, 100).expect("list")),
        newest(&ids)
    );
    let read = hscans(&redis);

    ids.push(b.put(entry(6, hour)).expect("put"));
    ids.push(b.put(entry(7, hour)).expect("put"));
    assert!(b.delete(ids[1]).expect("delete"));
    ids.remove(1);
    assert_eq!(
        ids_of(&a.list_newest(None, 100).expect("list")),
        newest(&ids)
    );
    // Pages, both ways.
    assert_eq!(
        ids_of(&a.list_newest(Some(ids[3]), 2).expect("page")),
        vec![ids[2], ids[1]]
    );
    assert_eq!(
        ids_of(&a.list(Some(ids[3]), 10).expect("page")),
        vec![ids[4], ids[5]]
    );
    assert_eq!(hscans(&redis), read, "the registry was read again");

    // Flushed by the other replica, then one answer stored: a listing of ids that are nearly
    // all gone reads the registry again instead of trying each of them.
    for n in 8..=400 {
        b.put(entry(n, hour)).expect("put");
    }
    assert_eq!(a.list_newest(None, 1).expect("list").len(), 1);
    assert_eq!(b.clear().expect("clear"), 399);
    let last = b.put(entry(401, hour)).expect("put");
    let read = hscans(&redis);
    assert_eq!(ids_of(&a.list(None, 10).expect("list")), vec![last]);
    assert!(
        hscans(&redis) > read,
        "tried the flushed entries one by one"
    );
}

#[test]
fn redis_expires_an_entry_at_its_ttl() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let store = redis.store();
    let id = store.put(entry(1, 300)).expect("put");
    let kept = store.put(entry(2, 3_600_000)).expect("put");
    // A TTL past what Redis's expiry arithmetic holds is stored without one, not refused.
    let forever = store.put(entry(3, u64::MAX)).expect("put without expiry");
    assert!(store.replay(id).expect("replay").is_some());
    let mut gone = false;
    for _ in 0..500 {
        if store.replay_by_key(&key(1)).expect("read").is_none() {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(gone, "the entry outlived its TTL");
    // Every key of the entry went with it, the exact-key row too.
    assert_eq!(store.get(id).expect("get"), None);
    assert_eq!(store.ids().expect("ids"), vec![kept, forever]);
    assert!(store.replay(forever).expect("replay").is_some());
    store.refresh_counts().expect("count");
    assert_eq!(store.len(), 2);
}

fn redis_config(upstream: String, redis: &RedisServer) -> Config {
    on_redis(config_for(upstream), redis)
}

/// `config` with its entries in `redis`.
pub(crate) fn on_redis(config: Config, redis: &RedisServer) -> Config {
    on_redis_url(redis.url(), config)
}

/// `config` with its entries in the Redis at `url` (any form `--redis-url` takes).
pub(crate) fn on_redis_url(url: String, mut config: Config) -> Config {
    config.store = StoreKind::Redis;
    config.redis_url = Some(Secret::new(url));
    config.validate().expect("valid");
    config
}

pub(crate) async fn ask(gw: &Gateway, content: &str) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-a")
        .json(&chat_body(content, false))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("the gateway answers")
}

#[tokio::test]
async fn an_answer_cached_through_one_replica_is_an_exact_hit_on_another() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let a = start(redis_config(sim.base_url(), &redis)).await;
    let b = start(redis_config(sim.base_url(), &redis)).await;
    let miss = ask(&a, "what is the tallest mountain").await;
    assert_eq!(header(&miss, "x-reprise-cache").as_deref(), Some("miss"));
    let answer = content(miss, false).await;
    wait_for_entries(&a, 1).await;

    let hit = ask(&b, "what is the tallest mountain").await;
    assert_eq!(header(&hit, "x-reprise-cache").as_deref(), Some("hit"));
    assert_eq!(content(hit, false).await, answer);
    assert_eq!(
        upstream_calls(&sim),
        1,
        "one upstream call for both replicas"
    );
    assert_eq!(health(&b).await["store"]["status"], "ok");

    // A flush through A empties the shared store: B stops serving the answer at once.
    flush(&a).await;
    let after = ask(&b, "what is the tallest mountain").await;
    assert_eq!(header(&after, "x-reprise-cache").as_deref(), Some("miss"));
}

pub(crate) async fn flush(gw: &Gateway) {
    let response = client()
        .post(gw.url("/admin/flush"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .expect("flush");
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_replica_started_after_an_answer_serves_it_as_a_semantic_hit() {
    let Some(models) = models() else { return };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let with_redis =
        |models: &std::path::Path| on_redis(semantic_config(sim.base_url(), models), &redis);
    let a = start(with_redis(&models)).await;
    let miss = ask(&a, "how do I reset my password").await;
    assert_eq!(header(&miss, "x-reprise-cache").as_deref(), Some("miss"));
    let answer = content(miss, false).await;
    // Stored with its vector (or given it by the backfill).
    let mut embedded = false;
    for _ in 0..500 {
        let stored = a.state.cache.store.list(None, 10).expect("list");
        if stored.iter().any(|e| e.vector.is_some()) {
            embedded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(embedded, "the entry never got its vector");

    // B builds its index from what Redis holds at its start (the feed covers what comes after).
    let b = start(with_redis(&models)).await;
    for _ in 0..1000 {
        let h = health(&b).await;
        if h["semantic"]["vectors"] == 1 && h["semantic"]["index_rebuilding"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hit = ask(&b, "I forgot my password, how can I reset it").await;
    assert_eq!(
        header(&hit, "x-reprise-cache").as_deref(),
        Some("semantic-hit")
    );
    assert_eq!(content(hit, false).await, answer);
    assert_eq!(upstream_calls(&sim), 1);

    // Flushed through A: whatever B's index still names at that instant reads nothing
    // for it, so it is not served.
    flush(&a).await;
    let after = ask(&b, "I forgot my password, how can I reset it").await;
    assert_eq!(header(&after, "x-reprise-cache").as_deref(), Some("miss"));
}

#[tokio::test]
async fn a_dead_redis_fails_open_and_caching_resumes_when_it_returns() {
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let gw = start(redis_config(sim.base_url(), &redis)).await;
    ask(&gw, "question one").await;
    wait_for_entries(&gw, 1).await;
    assert_eq!(
        header(&ask(&gw, "question one").await, "x-reprise-cache").as_deref(),
        Some("hit")
    );

    redis.kill();
    // Every request is still answered (from upstream), none hangs on the dead store.
    for _ in 0..3 {
        let response = ask(&gw, "question one").await;
        assert_eq!(response.status(), 200);
        assert_eq!(
            header(&response, "x-reprise-cache").as_deref(),
            Some("miss")
        );
        assert!(!content(response, false).await.is_empty());
    }
    let h = health(&gw).await;
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(h["store"]["status"], "degraded", "{h}");
    assert!(
        h["store"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("redis"),
        "{h}"
    );

    // Back (empty: no persistence): the writer thread's retry brings the store back.
    redis.restart();
    let mut recovered = false;
    for _ in 0..1000 {
        if health(&gw).await["store"]["status"] == "ok" {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(recovered, "the store never left degraded mode");
    let miss = ask(&gw, "question two").await;
    assert_eq!(header(&miss, "x-reprise-cache").as_deref(), Some("miss"));
    let mut hit = None;
    for _ in 0..500 {
        let response = ask(&gw, "question two").await;
        if header(&response, "x-reprise-cache").as_deref() == Some("hit") {
            hit = Some(response);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(hit.is_some(), "caching never resumed after redis came back");
}

#[tokio::test]
async fn a_redis_that_stops_answering_costs_requests_a_timeout_not_a_hang() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let gw = start(redis_config(sim.base_url(), &redis)).await;
    ask(&gw, "question one").await;
    wait_for_entries(&gw, 1).await;

    redis.signal("STOP");
    // The pooled connections and any new one reach a server that never replies: the read
    // timeout ends the lookup, and the request is answered from upstream.
    let response = ask(&gw, "question one").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "x-reprise-cache").as_deref(),
        Some("miss")
    );
    let h = health(&gw).await;
    assert_eq!(h["store"]["status"], "degraded", "{h}");
    // Degraded: later requests do not wait on Redis at all.
    let response = ask(&gw, "question one").await;
    assert_eq!(response.status(), 200);

    redis.signal("CONT");
    let mut recovered = false;
    for _ in 0..1000 {
        if health(&gw).await["store"]["status"] == "ok" {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(recovered, "the store never left degraded mode");
    // The entry stored before the stall is still there (the server kept its data).
    assert_eq!(
        header(&ask(&gw, "question one").await, "x-reprise-cache").as_deref(),
        Some("hit")
    );
}

/// Runs one command on `redis` (a test's own connection, not the gateway's).
fn redis_command<T: ::redis::FromRedisValue>(redis: &RedisServer, args: &[&str]) -> T {
    let mut c = ::redis::Client::open(redis.url())
        .expect("url")
        .get_connection()
        .expect("connect");
    let mut cmd = ::redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut c).expect("command")
}

#[tokio::test]
async fn a_full_redis_refuses_writes_only_reads_go_on_and_healthz_says_so() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let gw = start(redis_config(sim.base_url(), &redis)).await;
    ask(&gw, "stored before the cap").await;
    wait_for_entries(&gw, 1).await;
    assert_eq!(
        header(&ask(&gw, "stored before the cap").await, "x-reprise-cache").as_deref(),
        Some("hit")
    );

    // Full: every write command is refused with an OOM error reply, reads still answer.
    let _: String = redis_command(&redis, &["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let _: String = redis_command(&redis, &["CONFIG", "SET", "maxmemory", "1"]);
    let calls = upstream_calls(&sim);
    for i in 0..3 {
        let response = ask(&gw, &format!("new question {i}")).await;
        assert_eq!(response.status(), 200);
        assert_eq!(outcome(&response), "miss");
        assert!(!content(response, false).await.is_empty(), "relayed");
    }
    assert_eq!(upstream_calls(&sim), calls + 3);
    // The writer has met the refusal once the store says so.
    let mut said = Value::Null;
    for _ in 0..500 {
        said = health(&gw).await;
        if said["store"]["status"] == "degraded" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(said["status"], "degraded", "{said}");
    let response = ask(&gw, "stored before the cap").await;
    assert_eq!(
        outcome(&response),
        "hit",
        "a lookup skipped on a full redis"
    );
    let reason = said["store"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("refuses writes") && reason.contains("OOM"),
        "{said}"
    );
    assert_eq!(said["store"]["reads"], true, "{said}");

    // Longer than the store's retry interval: reads go on, the state stays while writes are
    // refused (a PING answers, which is not a write being accepted).
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let mut hits = 0;
    while std::time::Instant::now() < until {
        let response = ask(&gw, "stored before the cap").await;
        assert_eq!(
            outcome(&response),
            "hit",
            "a lookup skipped on a full redis"
        );
        assert!(!content(response, false).await.is_empty());
        hits += 1;
        let again = ask(&gw, &format!("new question {}", hits % 3)).await;
        assert_eq!(outcome(&again), "miss", "an answer stored on a full redis?");
        let _ = again.bytes().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let h = health(&gw).await;
    assert_eq!(h["store"]["status"], "degraded", "{h}");
    assert_eq!(h["store"]["reads"], true, "{h}");
    assert!(h["store"]["failures"].as_u64().unwrap_or(0) >= 3, "{h}");
    let stats: Value = admin_json(&gw, "/admin/stats").await;
    assert_eq!(stats["store"]["status"], "degraded", "{stats}");
    assert_eq!(stats["store"]["degraded"]["reads"], true, "{stats}");
    let rows: u64 = redis_command(&redis, &["HLEN", "reprise:index"]);
    assert_eq!(rows, 1, "only the entry stored before the cap");

    // Room again: the next write goes through, and caching resumes without a restart.
    let _: String = redis_command(&redis, &["CONFIG", "SET", "maxmemory", "0"]);
    let mut recovered = false;
    for _ in 0..1000 {
        if health(&gw).await["store"]["status"] == "ok" {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(recovered, "writes never resumed after redis had room");
    ask(&gw, "stored after the cap").await;
    let mut hit = false;
    for _ in 0..500 {
        if outcome(&ask(&gw, "stored after the cap").await) == "hit" {
            hit = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(hit, "caching never resumed");
}

#[tokio::test]
async fn a_gateway_started_while_redis_is_down_serves_and_caches_once_it_is_up() {
    let Some(mut redis) = RedisServer::unstarted() else {
        return;
    };
    let sim = sim_default().await;
    let gw = start(redis_config(sim.base_url(), &redis)).await;
    let h = health(&gw).await;
    assert_eq!(h["store"]["status"], "degraded", "{h}");
    let response = ask(&gw, "question one").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(&response, "x-reprise-cache").as_deref(),
        Some("miss")
    );

    redis.restart();
    let mut recovered = false;
    for _ in 0..1000 {
        if health(&gw).await["store"]["status"] == "ok" {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(recovered, "the store never left degraded mode");
    ask(&gw, "question two").await;
    wait_for_entries(&gw, 1).await;
    assert_eq!(
        header(&ask(&gw, "question two").await, "x-reprise-cache").as_deref(),
        Some("hit")
    );
}

#[test]
fn a_claim_is_renewed_and_released_only_by_its_holder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sled = SledStore::open(dir.path()).expect("sled");
    // A store no other process shares has no claims to coordinate: every claim is granted here.
    assert!(sled.coordination().is_none());
    assert_eq!(
        reprise_server::store::claim(&sled, &key(1), 1_000).expect("claim"),
        Claim::Local
    );
    let Some(redis) = RedisServer::start() else {
        return;
    };
    // Two stores on one server: two replicas.
    let (a, b) = (redis.store(), redis.store());
    let Claim::Led(held) = a.claim(&key(1), 60_000).expect("claim") else {
        panic!("the first claim is granted");
    };
    assert_eq!(b.claim(&key(1), 60_000).expect("claim"), Claim::Elsewhere);
    assert_eq!(a.claim(&key(1), 60_000).expect("claim"), Claim::Elsewhere);
    assert!(b.claimed(&key(1)).expect("claimed"));
    assert!(!b.claimed(&key(2)).expect("claimed"));
    assert!(matches!(b.claim(&key(2), 60_000), Ok(Claim::Led(_))));

    // Another replica's token neither renews nor releases it.
    let foreign = ClaimToken("someone-else".into());
    assert!(!b.renew(&key(1), &foreign, 60_000).expect("renew"));
    assert!(!b.release(&key(1), &foreign).expect("release"));
    assert!(b.claimed(&key(1)).expect("claimed"));

    // The holder's does: renewed to a short life, the claim lapses by itself.
    assert!(a.renew(&key(1), &held, 100).expect("renew"));
    let mut lapsed = false;
    for _ in 0..500 {
        if !b.claimed(&key(1)).expect("claimed") {
            lapsed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(lapsed, "a claim outlived its expiry");
    // Once lapsed and taken by another, the old holder can neither renew nor release it.
    let Claim::Led(taken) = b.claim(&key(1), 60_000).expect("claim") else {
        panic!("a lapsed claim can be taken");
    };
    assert_ne!(taken, held, "tokens differ across replicas");
    assert!(!a.renew(&key(1), &held, 60_000).expect("renew"));
    assert!(!a.release(&key(1), &held).expect("release"));
    assert!(a.claimed(&key(1)).expect("claimed"));
    assert!(b.release(&key(1), &taken).expect("release"));
    assert!(!a.claimed(&key(1)).expect("claimed"));
    assert!(matches!(a.claim(&key(1), 60_000), Ok(Claim::Led(_))));
}

/// A sim slow enough that concurrent requests overlap with the first one's upstream call.
async fn slow_sim() -> reprise_sim::SimHandle {
    reprise_sim::spawn(reprise_sim::SimConfig {
        ttft_ms: 500.0,
        itl_ms: 20.0,
        tokens: 10,
        ..reprise_sim::SimConfig::default()
    })
    .await
    .expect("sim")
}

/// `reprise_replica_flight_waits_total{result}` on `gw`'s `/metrics`.
async fn replica_waits(gw: &Gateway, result: &str) -> u64 {
    let text = metrics(gw).await;
    let prefix = format!("reprise_replica_flight_waits_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().expect("a count"))
}

/// Sends `body` to `gw` in a task; returns its outcome and answer text (empty when it broke off).
fn spawn_request(
    gw: &Gateway,
    body: Value,
    fault: Option<&'static str>,
) -> tokio::task::JoinHandle<(u16, String, String)> {
    let url = gw.url("/v1/chat/completions");
    let stream = body["stream"] == true;
    tokio::spawn(async move {
        let mut request = client().post(url).bearer_auth("sk-tenant-a").json(&body);
        if let Some(fault) = fault {
            request = request.header("x-sim-fault", fault);
        }
        let response = request
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .expect("send");
        let status = response.status().as_u16();
        let outcome = outcome(&response);
        let text = if fault.is_some() {
            response.text().await.unwrap_or_default()
        } else {
            content(response, stream).await
        };
        (status, outcome, text)
    })
}

/// The single-flight claims held in Redis now.
fn flight_keys(redis: &RedisServer) -> Vec<String> {
    let mut c = ::redis::Client::open(redis.url())
        .expect("url")
        .get_connection()
        .expect("connect");
    ::redis::cmd("KEYS")
        .arg("reprise:flight:*")
        .query(&mut c)
        .expect("keys")
}

#[tokio::test]
async fn concurrent_identical_misses_on_two_replicas_make_one_upstream_call() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = slow_sim().await;
    let a = start(redis_config(sim.base_url(), &redis)).await;
    let b = start(redis_config(sim.base_url(), &redis)).await;
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let gw = if i % 2 == 0 { &a } else { &b };
            spawn_request(gw, chat_body("one question, two replicas", i % 4 < 2), None)
        })
        .collect();
    let mut outcomes = Vec::new();
    let mut texts = Vec::new();
    for task in tasks {
        let (status, outcome, text) = task.await.expect("task");
        assert_eq!(status, 200);
        outcomes.push(outcome);
        texts.push(text);
    }
    assert_eq!(upstream_calls(&sim), 1, "outcomes: {outcomes:?}");
    assert_eq!(
        outcomes.iter().filter(|o| *o == "miss").count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes
            .iter()
            .all(|o| ["miss", "coalesced", "hit"].contains(&o.as_str())),
        "{outcomes:?}"
    );
    assert!(
        texts.iter().all(|t| t == &texts[0] && !t.is_empty()),
        "{texts:?}"
    );
    // The other replica's local leader waited for the stored answer; its followers followed it.
    assert_eq!(
        replica_waits(&a, "answered").await + replica_waits(&b, "answered").await,
        1
    );
    // The leader released its claim once its answer was stored.
    let mut released = false;
    for _ in 0..200 {
        if flight_keys(&redis).is_empty() {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        released,
        "the claim was never released: {:?}",
        flight_keys(&redis)
    );
}

#[tokio::test]
async fn when_the_leading_replica_fails_the_others_go_upstream_themselves() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = slow_sim().await;
    let a = start(redis_config(sim.base_url(), &redis)).await;
    let b = start(redis_config(sim.base_url(), &redis)).await;
    // A leads, and its stream will break off after two tokens: nothing to store.
    let body = |stream| chat_body("a question whose first answer breaks", stream);
    let leader = spawn_request(&a, body(true), Some("cut=2"));
    let mut claimed = false;
    for _ in 0..500 {
        if !flight_keys(&redis).is_empty() {
            claimed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(claimed, "the leader never claimed the key");
    let followers: Vec<_> = (0..4)
        .map(|i| spawn_request(&b, body(i % 2 == 0), None))
        .collect();
    let (_, leader_outcome, _) = leader.await.expect("leader");
    assert_eq!(leader_outcome, "miss");
    let mut outcomes = Vec::new();
    let mut texts = Vec::new();
    for task in followers {
        let (status, outcome, text) = task.await.expect("task");
        assert_eq!(status, 200, "{outcome}");
        outcomes.push(outcome);
        texts.push(text);
    }
    // B's requests waited for A, saw its claim go without an answer, and asked once themselves.
    assert_eq!(upstream_calls(&sim), 2, "{outcomes:?}");
    assert_eq!(
        outcomes.iter().filter(|o| *o == "miss").count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| *o == "coalesced").count(),
        3,
        "{outcomes:?}"
    );
    assert!(
        texts.iter().all(|t| t == &texts[0] && !t.is_empty()),
        "{texts:?}"
    );
    assert_eq!(replica_waits(&b, "lapsed").await, 1);
    assert_eq!(replica_waits(&b, "answered").await, 0);
}

#[tokio::test]
async fn a_claim_left_by_a_dead_replica_delays_a_request_only_until_it_lapses() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let a = start(redis_config(sim.base_url(), &redis)).await;
    let body = chat_body("asked while a dead replica holds the key", false);
    // Learn the request's exact key from its entry, then empty the store.
    content(post(&a, &body, &[]).await, false).await;
    wait_for_entries(&a, 1).await;
    let stored = a.state.cache.store.list(None, 10).expect("list");
    let exact = stored[0].key;
    flush(&a).await;

    // A replica that died mid-flight left its claim, which lapses in a second.
    let mut c = ::redis::Client::open(redis.url())
        .expect("url")
        .get_connection()
        .expect("connect");
    let lock = format!("reprise:flight:{}", exact.to_hex());
    ::redis::cmd("SET")
        .arg(&lock)
        .arg("dead-replica-1")
        .arg("PX")
        .arg(1_000)
        .query::<()>(&mut c)
        .expect("set");
    let b = start(redis_config(sim.base_url(), &redis)).await;
    let began = std::time::Instant::now();
    let response = post(&b, &body, &[]).await;
    assert_eq!(response.status(), 200);
    assert_eq!(outcome(&response), "miss");
    assert!(!content(response, false).await.is_empty());
    // Well within the longest wait for a live claim (a minute): it went once the claim lapsed.
    assert!(
        began.elapsed() < Duration::from_secs(20),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(upstream_calls(&sim), 2);
    assert_eq!(replica_waits(&b, "lapsed").await, 1);
}

#[tokio::test]
async fn a_request_that_leaves_while_waiting_for_another_replica_strands_nobody() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = reprise_sim::spawn(reprise_sim::SimConfig {
        ttft_ms: 1_500.0,
        itl_ms: 5.0,
        tokens: 8,
        ..reprise_sim::SimConfig::default()
    })
    .await
    .expect("sim");
    let a = start(redis_config(sim.base_url(), &redis)).await;
    let b = start(redis_config(sim.base_url(), &redis)).await;
    let body = chat_body("asked on two replicas, abandoned on one", false);
    let leader = spawn_request(&a, body.clone(), None);
    let mut claimed = false;
    for _ in 0..500 {
        if !flight_keys(&redis).is_empty() {
            claimed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(claimed, "the leader never claimed the key");
    // B's first request leads B's flight and waits for A; its client gives up meanwhile.
    let gone = client()
        .post(b.url("/v1/chat/completions"))
        .bearer_auth("sk-tenant-a")
        .json(&body)
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(gone.is_err(), "answered before A's upstream call ended");
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The next one on B must not follow the abandoned flight forever: it waits for A's answer.
    let (status, outcome, text) = spawn_request(&b, body.clone(), None).await.expect("task");
    assert_eq!((status, outcome.as_str()), (200, "coalesced"));
    let (_, leader_outcome, answer) = leader.await.expect("leader");
    assert_eq!(leader_outcome, "miss");
    assert_eq!(text, answer);
    assert_eq!(upstream_calls(&sim), 1);
}
