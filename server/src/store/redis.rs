//! The shared store (`--store redis`): cache entries in a Redis server that several gateway
//! replicas use at once, so an answer stored by one replica is an exact hit on every replica.
//!
//! Layout (core commands only, so it runs on any Redis 7, managed offerings included; the keys of
//! one entry share the hash tag `{<id>}`, so they live in one cluster slot):
//! - `reprise:ids`: the id counter (`INCR`); ids are never reused, as sled's;
//! - `reprise:{<id>}:replay`: the entry's encoded [`Replay`] (the hot read of a hit), in the same
//!   bytes as sled's `replays` tree;
//! - `reprise:{<id>}:cold`: the entry's encoded cold half (all but its answer), as sled's `entries`;
//! - `reprise:key:<hex of the cache key>`: the entry id (decimal) the exact key names;
//! - `reprise:flight:<hex of the cache key>`: the token of the replica asking the upstream for that
//!   key (single flight across replicas, see [`Claim`]): set `NX` with a short `PX` expiry, renewed
//!   and released only by a script that first checks the token.
//!
//! Every key of an entry expires with it (`PXAT` its expiry), so Redis drops expired entries
//! itself. An entry's two halves are written in one `MULTI`/`EXEC`, so no reader sees half an
//! entry; its key row is set after them (it lives in another slot), so a row never names an entry
//! not yet written, and a row whose entry is gone reads as a miss.
//!
//! Calls are synchronous (the [`Store`] trait is: the writer thread and the request path's blocking
//! section call it), on pooled connections with short connect and I/O timeouts, so a slow or dead
//! Redis costs a request a few milliseconds and a miss, never a hang. [`ResilientStore`] wraps it:
//! a failure marks the store degraded, and until a `PING` succeeds again (tried by the writer
//! thread) lookups miss without calling Redis at all.
//!
//! Every put, delete and clear is also published on the change feed ([`super::feed`]), which
//! the other replicas follow to keep their vector indexes in step. Not yet (see the README):
//! eviction over the caps is oldest-first, not LRU.
//!
//! [`ResilientStore`]: super::ResilientStore

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ::redis::{Client, Commands, Connection, RedisError, Value};
use tracing::debug;

use super::feed::{Change, Feed, RedisFeed};
use super::{
    decode, decode_replay, encode_cold, encode_replay, Claim, ClaimToken, Store, StoreError,
};
use crate::entry::{Entry, EntryId, HitEvent, Replay};
use crate::key::CacheKey;

/// Connecting to Redis on the request path: a loopback or same-zone server answers in well under
/// a millisecond, so a connect slower than this is a server in trouble, and the request goes upstream.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(25);
/// One command's reply: a large replay is a few hundred kB; past this the request goes upstream.
const IO_TIMEOUT: Duration = Duration::from_millis(50);
/// An entry that lives longer than this (a TTL of a century) is stored without an expiry: Redis
/// refuses an expiry time past what its clock arithmetic holds.
const NO_EXPIRY_AFTER_MS: u64 = 100 * 365 * 24 * 3600 * 1000;
/// Idle connections kept for reuse (the request path's blocking threads and the writer).
const POOL: usize = 16;
/// Least time between two full recounts by a sweep while this replica sees no cap exceeded: a
/// recount scans every key, and every replica sweeps each `sweep_interval_ms`.
const RECOUNT_EVERY: Duration = Duration::from_secs(10);
/// Keys asked per `SCAN` step and per `MGET`/`UNLINK` batch, so no command blocks Redis for long.
const BATCH: usize = 256;

const IDS: &str = "reprise:ids";
const COLD_PATTERN: &str = "reprise:{*}:cold";
/// What a clear deletes: the entries' halves and the exact-key rows, not the id counter, the
/// feed, its histories or the flight locks.
const ENTRY_PATTERNS: [&str; 2] = ["reprise:{*}:*", "reprise:key:*"];

/// Deletes `KEYS[1]` only while it holds `ARGV[1]`: a key row that still names its entry, a claim
/// its holder releases.
const DEL_IF_EQUAL: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
/// Sets `KEYS[1]` to expire in `ARGV[2]` ms only while it holds `ARGV[1]`: a claim its holder renews.
const PEXPIRE_IF_EQUAL: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0";

fn replay_key(id: EntryId) -> String {
    format!("reprise:{{{}}}:replay", id.0)
}

fn cold_key(id: EntryId) -> String {
    format!("reprise:{{{}}}:cold", id.0)
}

fn exact_key(key: &CacheKey) -> String {
    format!("reprise:key:{}", key.to_hex())
}

fn flight_key(key: &CacheKey) -> String {
    format!("reprise:flight:{}", key.to_hex())
}

/// The id in a `reprise:{<id>}:cold` key.
fn id_of_cold_key(key: &str) -> Option<EntryId> {
    let inner = key.strip_prefix("reprise:{")?.strip_suffix("}:cold")?;
    inner.parse().ok().map(EntryId)
}

/// A replica's name when none is configured: the host's name (a container's or pod's, where it
/// runs in one), the process id, and a random suffix, so a restarted replica is told apart.
pub fn default_replica() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "replica".into());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

impl From<RedisError> for StoreError {
    fn from(e: RedisError) -> Self {
        // Never the URL: it may carry a password.
        StoreError::Redis(format!("{}: {e}", e.category()))
    }
}

/// An entry's encoded cold half and replay.
type Halves = (Vec<u8>, Vec<u8>);

pub struct RedisStore {
    client: Client,
    pool: Mutex<Vec<Connection>>,
    /// Entries and their encoded size at the last sweep, plus what this replica wrote since
    /// (`len`/`bytes` must be O(1); other replicas' writes show at the next sweep).
    len: AtomicUsize,
    bytes: AtomicU64,
    /// When a sweep last recounted.
    counted_at: Mutex<Option<Instant>>,
    feed: RedisFeed,
    /// This replica's name: with `claims`, makes every claim token unique across replicas.
    replica: String,
    claims: AtomicU64,
}

impl RedisStore {
    /// A store on `url` (redis:// or rediss://), for a replica named by [`default_replica`];
    /// connects on first use.
    pub fn new(url: &str) -> Result<Self, StoreError> {
        Self::named(url, &default_replica())
    }

    /// A store on `url` for the replica named `replica` in the change feed and `/admin/stats`.
    pub fn named(url: &str, replica: &str) -> Result<Self, StoreError> {
        let client = Client::open(url)?;
        Ok(Self {
            feed: RedisFeed::new(client.clone(), replica.to_owned()),
            client,
            pool: Mutex::new(Vec::new()),
            len: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            counted_at: Mutex::new(None),
            replica: replica.to_owned(),
            claims: AtomicU64::new(0),
        })
    }

    /// The change feed this store publishes on.
    pub fn feed(&self) -> &RedisFeed {
        &self.feed
    }

    /// Publishes `change`; a failure is logged, not returned: the store's own write succeeded, and
    /// other replicas still serve the entry as an exact hit (they resync when they notice a gap).
    fn publish(&self, change: Change) {
        if let Err(e) = self.feed.publish(&change) {
            tracing::warn!(error = %e, "publishing a change on the feed failed; other replicas see it only as an exact hit until they resync");
        }
    }

    /// Recounts the entries and their size (what `len`/`bytes` report), by `SCAN`.
    pub fn refresh_counts(&self) -> Result<(), StoreError> {
        self.count().map(drop)
    }

    /// Ok when the server answers.
    pub fn ping(&self) -> Result<(), StoreError> {
        self.with(|c| ::redis::cmd("PING").query::<String>(c))
            .map(drop)
    }

    /// Forgets every pooled connection (after a failure: they may all be dead).
    pub fn reset(&self) {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn connection(&self) -> Result<Connection, RedisError> {
        if let Some(c) = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(c);
        }
        let c = self.client.get_connection_with_timeout(CONNECT_TIMEOUT)?;
        c.set_read_timeout(Some(IO_TIMEOUT))?;
        c.set_write_timeout(Some(IO_TIMEOUT))?;
        Ok(c)
    }

    /// Runs `op` on a pooled connection; the connection goes back to the pool only after a
    /// success (after an error it may hold half a reply).
    fn with<T>(
        &self,
        op: impl FnOnce(&mut Connection) -> Result<T, RedisError>,
    ) -> Result<T, StoreError> {
        let mut c = self.connection()?;
        match op(&mut c) {
            Ok(v) => {
                let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
                if pool.len() < POOL {
                    pool.push(c);
                }
                Ok(v)
            }
            Err(e) => {
                debug!(error = %e, "redis command failed");
                Err(e.into())
            }
        }
    }

    /// Every entry id in Redis, by `SCAN` (bounded steps, never `KEYS`), unsorted.
    fn scan_ids(&self) -> Result<Vec<EntryId>, StoreError> {
        self.with(|c| {
            let mut ids = Vec::new();
            let mut cursor: u64 = 0;
            loop {
                let (next, keys): (u64, Vec<String>) = ::redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(COLD_PATTERN)
                    .arg("COUNT")
                    .arg(BATCH)
                    .query(c)?;
                ids.extend(keys.iter().filter_map(|k| id_of_cold_key(k)));
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            // SCAN may return a key twice.
            ids.sort_unstable();
            ids.dedup();
            Ok(ids)
        })
    }

    /// Both halves of entry `id` in one read (the same slot), if both are there.
    fn halves(&self, id: EntryId) -> Result<Option<Halves>, StoreError> {
        let (cold, replay): (Option<Vec<u8>>, Option<Vec<u8>>) =
            self.with(|c| c.mget(&[cold_key(id), replay_key(id)]))?;
        Ok(cold.zip(replay))
    }

    fn read_entry(&self, id: EntryId) -> Result<Option<Entry>, StoreError> {
        let Some((cold, replay)) = self.halves(id)? else {
            return Ok(None);
        };
        let entry = decode(id, &cold, false)?;
        let replay = decode_replay(id, &replay, false)?;
        entry
            .with_answer(&replay)
            .map(Some)
            .map_err(|reason| StoreError::Corrupt { id, reason })
    }

    /// The id the exact-key row names.
    fn id_for_key(&self, key: &CacheKey) -> Result<Option<EntryId>, StoreError> {
        let id: Option<u64> = self.with(|c| c.get(exact_key(key)))?;
        Ok(id.map(EntryId))
    }

    /// Rewrites entry `id`'s cold half through `change`, keeping its expiry; false when the entry
    /// is gone or `change` declined. A concurrent writer on another replica may be overwritten
    /// (hit bookkeeping only: the answer is in the replay, which this never touches).
    fn update(
        &self,
        id: EntryId,
        change: impl FnOnce(&mut Entry) -> bool,
    ) -> Result<bool, StoreError> {
        let raw: Option<Vec<u8>> = self.with(|c| c.get(cold_key(id)))?;
        let Some(raw) = raw else {
            return Ok(false);
        };
        let mut entry = decode(id, &raw, false)?;
        if !change(&mut entry) {
            return Ok(false);
        }
        let encoded = encode_cold(&entry)?;
        // XX: never resurrect an entry deleted meanwhile; KEEPTTL: it expires as before.
        let written: Option<String> = self.with(|c| {
            ::redis::cmd("SET")
                .arg(cold_key(id))
                .arg(encoded)
                .arg("XX")
                .arg("KEEPTTL")
                .query(c)
        })?;
        Ok(written.is_some())
    }

    /// Deletes the entries `ids` (both halves and, when it still names them, their key rows).
    fn remove(&self, ids: &[EntryId]) -> Result<usize, StoreError> {
        let mut removed = 0;
        for batch in ids.chunks(BATCH) {
            let colds: Vec<String> = batch.iter().map(|id| cold_key(*id)).collect();
            let raws: Vec<Option<Vec<u8>>> = self.with(|c| c.mget(&colds))?;
            for (id, raw) in batch.iter().zip(raws) {
                let key = raw
                    .and_then(|raw| decode(*id, &raw, false).ok())
                    .map(|e| e.key);
                if self.delete_one(*id, key.as_ref())? {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Deletes entry `id` and, if it names `id`, its key row. True if the entry was there.
    fn delete_one(&self, id: EntryId, key: Option<&CacheKey>) -> Result<bool, StoreError> {
        let (gone,): (usize,) = self.with(|c| {
            ::redis::pipe()
                .atomic()
                .del(&[cold_key(id), replay_key(id)])
                .query(c)
        })?;
        if let Some(key) = key {
            // Only the row that still names this entry: a newer entry may own the key now.
            let script = ::redis::Script::new(DEL_IF_EQUAL);
            self.with(|c| script.key(exact_key(key)).arg(id.0).invoke::<i64>(c))?;
        }
        if gone > 0 {
            self.publish(Change::Delete(id));
            // Approximate until the next sweep recounts (bytes included): never below zero.
            let _ = self
                .len
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
        Ok(gone > 0)
    }

    /// Counts the entries and their encoded size (`STRLEN` of both halves), by `SCAN`.
    fn count(&self) -> Result<Vec<(EntryId, u64)>, StoreError> {
        let ids = self.scan_ids()?;
        let mut sized = Vec::with_capacity(ids.len());
        for batch in ids.chunks(BATCH) {
            let lens: Vec<u64> = self.with(|c| {
                let mut pipe = ::redis::pipe();
                for id in batch {
                    pipe.strlen(cold_key(*id)).strlen(replay_key(*id));
                }
                pipe.query(c)
            })?;
            for (id, pair) in batch.iter().zip(lens.chunks(2)) {
                let size: u64 = pair.iter().sum();
                // Both zero: expired between the scan and the read.
                if size > 0 {
                    sized.push((*id, size));
                }
            }
        }
        self.len.store(sized.len(), Ordering::Relaxed);
        self.bytes
            .store(sized.iter().map(|(_, s)| s).sum(), Ordering::Relaxed);
        Ok(sized)
    }

    fn page(
        &self,
        ids: impl Iterator<Item = EntryId>,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::new();
        for id in ids {
            if out.len() >= limit {
                break;
            }
            match self.read_entry(id) {
                Ok(Some(entry)) => out.push(entry),
                // Expired or deleted since the scan.
                Ok(None) => {}
                Err(StoreError::Corrupt { id, reason }) => {
                    debug!(%id, reason, "skipping a corrupt entry in redis");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }
}

impl Store for RedisStore {
    fn get(&self, id: EntryId) -> Result<Option<Entry>, StoreError> {
        self.read_entry(id)
    }

    fn get_by_key(&self, key: &CacheKey) -> Result<Option<Entry>, StoreError> {
        let Some(id) = self.id_for_key(key)? else {
            return Ok(None);
        };
        Ok(self.read_entry(id)?.filter(|entry| entry.key == *key))
    }

    fn replay_by_key(&self, key: &CacheKey) -> Result<Option<Replay>, StoreError> {
        let Some(id) = self.id_for_key(key)? else {
            return Ok(None);
        };
        Ok(self.replay(id)?.filter(|replay| replay.key() == *key))
    }

    fn replay(&self, id: EntryId) -> Result<Option<Replay>, StoreError> {
        let raw: Option<Vec<u8>> = self.with(|c| c.get(replay_key(id)))?;
        raw.map(|raw| decode_replay(id, &raw, false)).transpose()
    }

    fn put(&self, mut entry: Entry) -> Result<EntryId, StoreError> {
        let id: u64 = self.with(|c| c.incr(IDS, 1))?;
        entry.id = EntryId(id);
        let id = entry.id;
        let cold = encode_cold(&entry)?;
        let replay = encode_replay(&Replay::of(&entry));
        let size = (cold.len() + replay.len()) as u64;
        // `PXAT` the entry's expiry (one already past deletes the key at once, as it should).
        let expiry: Vec<String> = if entry.ttl_ms < NO_EXPIRY_AFTER_MS {
            vec!["PXAT".into(), entry.expires_at_ms().max(1).to_string()]
        } else {
            Vec::new()
        };
        self.with(|c| {
            ::redis::pipe()
                .atomic()
                .cmd("SET")
                .arg(replay_key(id))
                .arg(replay)
                .arg(&expiry)
                .ignore()
                .cmd("SET")
                .arg(cold_key(id))
                .arg(cold)
                .arg(&expiry)
                .ignore()
                .query::<()>(c)
        })?;
        // After the entry, so the row never names one not yet written; GET: the entry it replaces.
        let old: Option<u64> = self.with(|c| {
            ::redis::cmd("SET")
                .arg(exact_key(&entry.key))
                .arg(id.0)
                .arg(&expiry)
                .arg("GET")
                .query(c)
        })?;
        self.len.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(size, Ordering::Relaxed);
        self.publish(Change::Put {
            id,
            partition: entry.partition.0,
            vector: entry.vector.clone(),
        });
        if let Some(old) = old.filter(|old| *old != id.0) {
            self.delete_one(EntryId(old), None)?;
        }
        Ok(id)
    }

    fn delete(&self, id: EntryId) -> Result<bool, StoreError> {
        let raw: Option<Vec<u8>> = self.with(|c| c.get(cold_key(id)))?;
        let key = raw
            .and_then(|raw| decode(id, &raw, false).ok())
            .map(|e| e.key);
        self.delete_one(id, key.as_ref())
    }

    fn touch(&self, id: EntryId, hits: u64, recent: &[HitEvent]) -> Result<(), StoreError> {
        if hits == 0 && recent.is_empty() {
            return Ok(());
        }
        self.update(id, |entry| {
            entry.record_hits(hits, recent);
            true
        })?;
        Ok(())
    }

    fn set_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        let mut partition = None;
        let filled = self.update(id, |entry| {
            partition = Some(entry.partition.0);
            entry.fill_vector(vector)
        })?;
        if let (true, Some(partition)) = (filled, partition) {
            self.publish(Change::Put {
                id,
                partition,
                vector: Some(vector.to_vec()),
            });
        }
        Ok(filled)
    }

    fn list_newest(&self, before: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let ids = self.scan_ids()?;
        let below = |id: &EntryId| before.is_none_or(|b| *id < b);
        self.page(ids.into_iter().rev().filter(below), limit)
    }

    fn list(&self, after: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let ids = self.scan_ids()?;
        let above = |id: &EntryId| after.is_none_or(|a| *id > a);
        self.page(ids.into_iter().filter(above), limit)
    }

    fn ids(&self) -> Result<Vec<EntryId>, StoreError> {
        self.scan_ids()
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Redis expires entries itself (`PXAT`), so `expired` is always 0. Over a cap, the oldest
    /// entries go first (the ids are in insertion order): LRU across replicas needs the hit
    /// history in Redis, a later step. The recount behind it scans every key, so it runs at most
    /// every [`RECOUNT_EVERY`] unless this replica's own count is already over a cap.
    fn sweep(
        &self,
        _now_ms: u64,
        max_entries: usize,
        max_bytes: u64,
    ) -> Result<(usize, usize), StoreError> {
        let over = self.len() > max_entries || self.bytes() > max_bytes;
        {
            let mut at = self.counted_at.lock().unwrap_or_else(|e| e.into_inner());
            if !over && at.is_some_and(|at| at.elapsed() < RECOUNT_EVERY) {
                return Ok((0, 0));
            }
            *at = Some(Instant::now());
        }
        let sized = self.count()?;
        let mut len = sized.len();
        let mut bytes: u64 = sized.iter().map(|(_, s)| s).sum();
        let mut victims = Vec::new();
        for (id, size) in &sized {
            if len <= max_entries && bytes <= max_bytes {
                break;
            }
            victims.push(*id);
            len -= 1;
            bytes = bytes.saturating_sub(*size);
        }
        let evicted = self.remove(&victims)?;
        self.len.store(len, Ordering::Relaxed);
        self.bytes.store(bytes, Ordering::Relaxed);
        Ok((0, evicted))
    }

    /// Durability is the Redis server's (its AOF/RDB settings): nothing to do here.
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn clear(&self) -> Result<usize, StoreError> {
        let n = self.scan_ids()?.len();
        for pattern in ENTRY_PATTERNS {
            self.with(|c| {
                let mut cursor: u64 = 0;
                loop {
                    let (next, keys): (u64, Vec<String>) = ::redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pattern)
                        .arg("COUNT")
                        .arg(BATCH)
                        .query(c)?;
                    if !keys.is_empty() {
                        ::redis::cmd("UNLINK").arg(&keys).query::<Value>(c)?;
                    }
                    if next == 0 {
                        return Ok(());
                    }
                    cursor = next;
                }
            })?;
        }
        self.len.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
        self.publish(Change::Clear);
        Ok(n)
    }

    fn feed(&self) -> Option<&dyn Feed> {
        Some(&self.feed)
    }

    fn claim(&self, key: &CacheKey, ttl_ms: u64) -> Result<Claim, StoreError> {
        let n = self.claims.fetch_add(1, Ordering::Relaxed);
        let token = format!("{}-{n}", self.replica);
        let set: Option<String> = self.with(|c| {
            ::redis::cmd("SET")
                .arg(flight_key(key))
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms.max(1))
                .query(c)
        })?;
        Ok(match set {
            Some(_) => Claim::Led(ClaimToken(token)),
            None => Claim::Elsewhere,
        })
    }

    fn renew(&self, key: &CacheKey, token: &ClaimToken, ttl_ms: u64) -> Result<bool, StoreError> {
        let script = ::redis::Script::new(PEXPIRE_IF_EQUAL);
        let renewed: i64 = self.with(|c| {
            script
                .key(flight_key(key))
                .arg(&token.0)
                .arg(ttl_ms.max(1))
                .invoke(c)
        })?;
        Ok(renewed == 1)
    }

    fn release(&self, key: &CacheKey, token: &ClaimToken) -> Result<bool, StoreError> {
        let script = ::redis::Script::new(DEL_IF_EQUAL);
        let gone: i64 = self.with(|c| script.key(flight_key(key)).arg(&token.0).invoke(c))?;
        Ok(gone == 1)
    }

    fn claimed(&self, key: &CacheKey) -> Result<bool, StoreError> {
        self.with(|c| c.exists(flight_key(key)))
    }
}
