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
//! - `reprise:index`: the registry of entries, a hash (field: the id; value: its expiry in unix ms,
//!   0 for none, its encoded size and its exact key's hex), what listing, counting, eviction and
//!   clear read instead of scanning the keyspace (`SCAN` sees one node of a cluster only);
//! - `reprise:probe:<replica>`: a write that tells a replica Redis accepts writes again, after it
//!   refused them (full, read-only); it expires after a minute;
//! - `reprise:flight:<hex of the cache key>`: the token of the replica asking the upstream for that
//!   key (single flight across replicas, see [`Claim`]): set `NX` with a short `PX` expiry, renewed
//!   and released only by a script that first checks the token.
//!
//! Every key of an entry expires with it (`PXAT` its expiry), so Redis drops expired entries
//! itself; the sweep prunes their registry rows. An entry's two halves are written in one
//! `MULTI`/`EXEC`, so no reader sees half an entry; its registry row and then its key row are set
//! after them (they live in other slots), so neither names an entry not yet written, and a row
//! whose entry is gone reads as a miss.
//!
//! Cluster mode (`redis+cluster://`, see [`super::connect`]): every `MULTI`, pipeline and
//! multi-key command here touches one slot (an entry's halves share its hash tag; the registry is
//! one key); work over many entries goes per entry, or through [`Conn::batch`], which splits by slot.
//!
//! Calls are synchronous (the [`Store`] trait is: the writer thread and the request path's blocking
//! section call it), on pooled connections with short connect and I/O timeouts, so a slow or dead
//! Redis costs a request a few milliseconds and a miss, never a hang. [`ResilientStore`] wraps it:
//! a failure marks the store degraded, and until a `PING` succeeds again (tried by the writer
//! thread) lookups miss without calling Redis at all. A server that answers and refuses writes
//! ([`StoreError::RedisRefusesWrites`]: full under `noeviction`, read-only) degrades writes only.
//!
//! Every put, delete and clear is also published on the change feed ([`super::feed`]), which
//! the other replicas follow to keep their vector indexes in step. Over the caps, eviction is least
//! recently used first across replicas: the registry row of an entry carries its last use, moved
//! by the hit bookkeeping of every replica.
//!
//! [`ResilientStore`]: super::ResilientStore

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::sync::Arc;

use ::redis::{Cmd, Commands, RedisError, Value};
use tracing::debug;

use super::codec::{decode, decode_replay, encode_cold, encode_replay};
use super::connect::{Conn, Connector, Timeouts};
use super::feed::{Change, Feed, RedisFeed};
use super::ledger::{self, lru_order, recency_ms, Held};
use super::listing::{Listing, GONE_BEFORE_READ};
use super::recount::{self, Read, Recounts, Scan, RECOUNT_EVERY, SLICE};
use super::{Claim, ClaimToken, Coordination, Store, StoreError, Upkeep};
use crate::entry::{Entry, EntryId, HitEvent, Replay};
use crate::key::CacheKey;

/// Connecting to Redis on the request path: the TCP handshake and the client's setup round trip
/// (`CLIENT SETINFO`), two round trips in all. A loopback or same-zone server answers in well under
/// a millisecond, so a connect slower than this is a server in trouble, and the request goes
/// upstream. At 25 ms, a link with 10 ms each way failed most new connections, and every failure
/// empties the pool, so the store fell into degraded mode while each command still had time.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(50);
/// One command's reply: a large replay is a few hundred kB; past this the request goes upstream.
const IO_TIMEOUT: Duration = Duration::from_millis(50);
/// An entry that lives longer than this (a TTL of a century) is stored without an expiry: Redis
/// refuses an expiry time past what its clock arithmetic holds.
const NO_EXPIRY_AFTER_MS: u64 = 100 * 365 * 24 * 3600 * 1000;
/// Idle connections kept for reuse (the request path's blocking threads and the writer).
const POOL: usize = 16;
/// Registry rows asked per `HSCAN` step and entries per batch of deletes, so no command (or
/// reply) blocks Redis for long.
const BATCH: usize = 256;
/// Entries a listing's page reads at least per round trip: a page that lacks a few entries also
/// meets some that are gone.
const PAGE_BATCH: usize = 16;
const TIMEOUTS: Timeouts = Timeouts {
    connect: CONNECT_TIMEOUT,
    read: IO_TIMEOUT,
    write: IO_TIMEOUT,
};

const IDS: &str = "reprise:ids";
/// The registry of entries (see the module doc).
const INDEX: &str = "reprise:index";

/// Deletes `KEYS[1]` only while it holds `ARGV[1]`: a key row that still names its entry, a claim
/// its holder releases.
const DEL_IF_EQUAL: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
/// Sets field `ARGV[1]` of hash `KEYS[1]` to `ARGV[2]` only while it exists: a registry row's new
/// size, never a row for an entry deleted meanwhile.
const HSET_IF_EXISTS: &str = "if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end return -1";
/// Sets `KEYS[1]` to expire in `ARGV[2]` ms only while it holds `ARGV[1]`: a claim its holder renews.
/// An exact hit in one round trip on one server (or the master behind Sentinels): the key row,
/// then the replay it names. It reads a key it does not declare, which a standalone server allows
/// and a cluster does not (there the two reads stay two: the row and the replay live in different
/// slots).
const HIT: &str = "local id = redis.call('GET', KEYS[1]) if not id then return false end \
local replay = redis.call('GET', 'reprise:{' .. id .. '}:replay') if not replay then return false end \
return {id, replay}";
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

/// An entry's row in the registry (`reprise:index`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    /// Unix ms; 0: never.
    expires_at_ms: u64,
    /// Both halves, encoded.
    size: u64,
    /// The exact key, stored as its hex (its key row is `reprise:key:<hex>`); held as bytes, as
    /// a recount holds every row at once (a million of them on a big cache).
    key: CacheKey,
    /// Unix ms of the entry's last use (stored, or its latest hit recorded by any replica): the
    /// eviction order over the caps, least recently used first.
    used_ms: u64,
}

impl Row {
    fn render(&self) -> String {
        format!(
            "{} {} {} {}",
            self.expires_at_ms,
            self.size,
            self.key.to_hex(),
            self.used_ms
        )
    }

    /// A row; one without its last use (written before it was kept) reads as never used.
    fn parse(raw: &str) -> Option<Self> {
        let mut parts = raw.split(' ');
        let row = Row {
            expires_at_ms: parts.next()?.parse().ok()?,
            size: parts.next()?.parse().ok()?,
            // 64 hex digits: blake3's decoder (the key is a blake3 hash).
            key: CacheKey(*blake3::Hash::from_hex(parts.next()?).ok()?.as_bytes()),
            used_ms: match parts.next() {
                Some(used) => used.parse().ok()?,
                None => 0,
            },
        };
        parts.next().is_none().then_some(row)
    }

    fn expired(&self, now_ms: u64) -> bool {
        self.expires_at_ms != 0 && self.expires_at_ms <= now_ms
    }
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
        if let Some(refusal) = write_refusal(&e) {
            return StoreError::RedisRefusesWrites(refusal);
        }
        // Never the URL: it may carry a password.
        StoreError::Redis(format!("{}: {e}", e.category()))
    }
}

/// Error codes of a server that answers and refuses writes: full under `noeviction` (`OOM`), a
/// replica or a demoted master (`READONLY`), a failed RDB save with `stop-writes-on-bgsave-error`
/// (`MISCONF`), too few replicas for `min-replicas-to-write` (`NOREPLICAS`).
const REFUSES_WRITES: [&str; 4] = ["OOM", "READONLY", "MISCONF", "NOREPLICAS"];

/// The server's reply (`OOM command not allowed when used memory > 'maxmemory'.`) when `e` is
/// a write refusal, also inside a pipeline or an aborted `MULTI`.
fn write_refusal(e: &RedisError) -> Option<String> {
    let errors = e.clone().into_server_errors()?;
    errors
        .iter()
        .map(|(_, error)| error)
        .find(|error| REFUSES_WRITES.contains(&error.code()))
        .map(|error| match error.details() {
            Some(detail) => format!("{} {detail}", error.code()),
            None => error.code().to_owned(),
        })
}

/// An entry's encoded cold half and replay.
type Halves = (Vec<u8>, Vec<u8>);

pub struct RedisStore {
    connector: Arc<Connector>,
    pool: Mutex<Vec<Conn>>,
    /// Registry rows at the last sweep (every replica's writes, and the rows of expired entries
    /// until a recount prunes them) and their size estimated as [`Recounts::estimate`] does, plus
    /// what this replica wrote since: `len`/`bytes` must be O(1).
    len: AtomicUsize,
    bytes: AtomicU64,
    /// The recount under way and what the last one found; its lock also keeps two sweeps apart.
    recounts: Mutex<Recounts<(EntryId, Row)>>,
    /// The ids listings page over; its lock also keeps two reads of the registry for it apart.
    listing: Mutex<Option<Listing>>,
    feed: RedisFeed,
    /// This replica's name: with `claims`, makes every claim token unique across replicas.
    replica: String,
    claims: AtomicU64,
    /// Entries this replica removed or found expired since [`Store::take_dropped`] last took them.
    dropped: Mutex<Vec<EntryId>>,
    /// [`HIT`], hashed once.
    hit: ::redis::Script,
}

impl RedisStore {
    /// A store on `url` (any form [`super::connect`] reads: one server, a cluster, or Sentinels),
    /// for a replica named by [`default_replica`]; connects on first use.
    pub fn new(url: &str) -> Result<Self, StoreError> {
        Self::named(url, &default_replica())
    }

    /// A store on `url` for the replica named `replica` in the change feed and `/admin/stats`.
    pub fn named(url: &str, replica: &str) -> Result<Self, StoreError> {
        let connector = Arc::new(Connector::open(url)?);
        Ok(Self {
            feed: RedisFeed::new(connector.clone(), replica.to_owned()),
            connector,
            pool: Mutex::new(Vec::new()),
            len: AtomicUsize::new(0),
            bytes: AtomicU64::new(0),
            recounts: Mutex::new(Recounts::new(RECOUNT_EVERY)),
            listing: Mutex::new(None),
            replica: replica.to_owned(),
            claims: AtomicU64::new(0),
            dropped: Mutex::new(Vec::new()),
            hit: ::redis::Script::new(HIT),
        })
    }

    /// The same store with routine recounts of the registry at least `every` apart (default
    /// [`RECOUNT_EVERY`]; see [`super::recount`]).
    pub fn recount_every(self, every: Duration) -> Self {
        *self.recounts.lock().unwrap_or_else(|e| e.into_inner()) = Recounts::new(every);
        self
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

    /// Recounts the entries and their size (what `len`/`bytes` report), reading the whole
    /// registry now.
    pub fn refresh_counts(&self) -> Result<(), StoreError> {
        let mut recounts = self.recounts.lock().unwrap_or_else(|e| e.into_inner());
        let live = self.count(self.rows()?)?;
        recounts.counted(held_by(&live));
        Ok(())
    }

    /// Ok when the server answers.
    pub fn ping(&self) -> Result<(), StoreError> {
        self.with(|c| ::redis::cmd("PING").query::<String>(c))
            .map(drop)
    }

    /// Ok when the server accepts a write: a small key of this replica's, gone after a minute
    /// (how a store that Redis refused writes learns it has room again).
    pub fn probe_write(&self) -> Result<(), StoreError> {
        self.with(|c| {
            ::redis::cmd("SET")
                .arg(format!("reprise:probe:{}", self.replica))
                .arg(crate::timing::unix_ms())
                .arg("PX")
                .arg(60_000)
                .query::<()>(c)
        })
    }

    /// Forgets every pooled connection (after a failure: they may all be dead), and behind
    /// Sentinels, which server is the master.
    pub fn reset(&self) {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.connector.forget();
    }

    fn connection(&self) -> Result<Conn, RedisError> {
        if let Some(c) = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(c);
        }
        self.connector.connect(TIMEOUTS)
    }

    /// Runs `op` on a pooled connection; the connection goes back to the pool only after a
    /// success (after an error it may hold half a reply).
    fn with<T>(
        &self,
        op: impl FnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, StoreError> {
        let mut c = self.connection().inspect_err(|_| self.connector.forget())?;
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
                // Behind Sentinels, a master that failed over answers `READONLY` or not at all.
                self.connector.forget();
                Err(e.into())
            }
        }
    }

    /// Every row of the registry, by `HSCAN` (bounded steps), sorted by id, expired ones too.
    fn rows(&self) -> Result<Vec<(EntryId, Row)>, StoreError> {
        let mut scan = Scan::default();
        self.scan_for(&mut scan, None)?;
        Ok(sorted(scan.rows))
    }

    /// Goes on reading the registry into `scan` by `HSCAN` steps, for about `budget` (to the end
    /// without one); true once it is read to the end. A failed step leaves `scan` where the last
    /// good one left it: `HSCAN`'s cursor holds no state on the server, so a later call resumes.
    fn scan_for(
        &self,
        scan: &mut Scan<(EntryId, Row)>,
        budget: Option<Duration>,
    ) -> Result<bool, StoreError> {
        let started = Instant::now();
        while !scan.done {
            if budget.is_some_and(|budget| started.elapsed() >= budget) {
                return Ok(false);
            }
            let (next, flat): (u64, Vec<String>) = self.with(|c| {
                ::redis::cmd("HSCAN")
                    .arg(INDEX)
                    .arg(scan.cursor)
                    .arg("COUNT")
                    .arg(BATCH)
                    .query(c)
            })?;
            for pair in flat.chunks_exact(2) {
                match (pair[0].parse().map(EntryId), Row::parse(&pair[1])) {
                    (Ok(id), Some(row)) => scan.rows.push((id, row)),
                    _ => debug!(field = %pair[0], "skipping an unreadable registry row"),
                }
            }
            scan.cursor = next;
            scan.done = next == 0;
        }
        Ok(true)
    }

    /// The ids of the entries not yet expired, in order.
    fn live_ids(&self) -> Result<Vec<EntryId>, StoreError> {
        let now = crate::timing::unix_ms();
        Ok(self
            .rows()?
            .into_iter()
            .filter(|(_, row)| !row.expired(now))
            .map(|(id, _)| id)
            .collect())
    }

    /// The ids listings page over, ascending: every live entry's, and some of entries gone since
    /// (see [`super::listing`]). The registry is read when `read` says so, or at most every
    /// [`super::listing::READ_EVERY`]; in between, one `GET` of the id counter adds the ids taken
    /// since, by any replica.
    fn listing(&self, read: bool) -> Result<Arc<Vec<EntryId>>, StoreError> {
        let counter: Option<u64> = self.with(|c| c.get(IDS))?;
        let counter = counter.unwrap_or(0);
        let mut listing = self.listing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(listing) = listing.as_mut().filter(|listing| !read && listing.fresh()) {
            if listing.catch_up(counter) {
                return Ok(listing.ids());
            }
        }
        let read = Listing::read(self.live_ids()?, counter);
        let ids = read.ids();
        *listing = Some(read);
        Ok(ids)
    }

    fn read_entry(&self, id: EntryId) -> Result<Option<Entry>, StoreError> {
        self.halves_of(&[id])?
            .pop()
            .flatten()
            .map(|halves| whole(id, &halves))
            .transpose()
    }

    /// The value of each of `keys` (`None`: not there), in one round trip per node: a `GET`
    /// each, as a cluster pipeline refuses `MGET` even where the keys share a slot.
    fn get_each(
        &self,
        keys: impl Iterator<Item = String>,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let cmds = keys
            .map(|key| {
                let mut get = ::redis::cmd("GET");
                get.arg(key);
                get
            })
            .collect();
        self.with(|c| c.batch(cmds))?
            .into_iter()
            .map(|reply| match reply {
                Value::BulkString(raw) => Ok(Some(raw)),
                Value::Nil => Ok(None),
                _ => Err(StoreError::Redis("an unexpected reply to GET".into())),
            })
            .collect()
    }

    /// Both halves of each of `ids`, if both are there (expired or deleted since the ids were
    /// read, else), in one round trip per node.
    fn halves_of(&self, ids: &[EntryId]) -> Result<Vec<Option<Halves>>, StoreError> {
        let mut values = self
            .get_each(ids.iter().flat_map(|id| [cold_key(*id), replay_key(*id)]))?
            .into_iter();
        Ok(ids
            .iter()
            .map(|_| values.next().flatten().zip(values.next().flatten()))
            .collect())
    }

    /// The id the exact-key row names.
    fn id_for_key(&self, key: &CacheKey) -> Result<Option<EntryId>, StoreError> {
        let id: Option<u64> = self.with(|c| c.get(exact_key(key)))?;
        Ok(id.map(EntryId))
    }

    /// Rewrites entry `id`'s cold half through `change`, keeping its expiry; false when the entry
    /// is gone or `change` declined. A concurrent writer on another replica may be overwritten
    /// (hit bookkeeping only: the answer is in the replay, which this never touches).
    /// Sets an entry's vector (only a missing one unless `replace`) and publishes the change.
    fn write_vector(&self, id: EntryId, vector: &[f32], replace: bool) -> Result<bool, StoreError> {
        let mut partition = None;
        let filled = self.update(id, |entry| {
            partition = Some(entry.partition.0);
            if replace {
                entry.vector = Some(vector.to_vec());
                true
            } else {
                entry.fill_vector(vector)
            }
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
        let used_before = entry.last_hit_ms;
        if !change(&mut entry) {
            return Ok(false);
        }
        let encoded = encode_cold(&entry)?;
        let grew = encoded.len() as i64 - raw.len() as i64;
        let used = (entry.last_hit_ms > used_before).then_some(entry.last_hit_ms);
        // XX: never resurrect an entry deleted meanwhile; KEEPTTL: it expires as before.
        let written: Option<String> = self.with(|c| {
            ::redis::cmd("SET")
                .arg(cold_key(id))
                .arg(encoded)
                .arg("XX")
                .arg("KEEPTTL")
                .query(c)
        })?;
        if written.is_some() && (grew != 0 || used.is_some()) {
            self.refresh_row(id, grew, used)?;
        }
        Ok(written.is_some())
    }

    /// Adds `grew` bytes to entry `id`'s size in the registry (a vector or hits added) and moves
    /// its last use to `used` (a hit), never back.
    fn refresh_row(&self, id: EntryId, grew: i64, used: Option<u64>) -> Result<(), StoreError> {
        let raw: Option<String> = self.with(|c| c.hget(INDEX, id.0))?;
        let Some(mut row) = raw.as_deref().and_then(Row::parse) else {
            return Ok(());
        };
        row.size = row.size.saturating_add_signed(grew);
        row.used_ms = row.used_ms.max(used.unwrap_or(0));
        let script = ::redis::Script::new(HSET_IF_EXISTS);
        self.with(|c| {
            script
                .key(INDEX)
                .arg(id.0)
                .arg(row.render())
                .invoke::<i64>(c)
        })?;
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_add_signed(grew))
            });
        Ok(())
    }

    /// The key row (`reprise:key:<hex>`) of entry `id`: from the registry, else from its cold half.
    fn key_row_of(&self, id: EntryId) -> Result<Option<String>, StoreError> {
        let raw: Option<String> = self.with(|c| c.hget(INDEX, id.0))?;
        if let Some(row) = raw.as_deref().and_then(Row::parse) {
            return Ok(Some(exact_key(&row.key)));
        }
        let raw: Option<Vec<u8>> = self.with(|c| c.get(cold_key(id)))?;
        Ok(raw
            .and_then(|raw| decode(id, &raw, false).ok())
            .map(|e| exact_key(&e.key)))
    }

    /// Deletes the entries of `victims` (each with its key row), in batches; how many were there.
    fn remove(&self, victims: &[(EntryId, String)]) -> Result<usize, StoreError> {
        let mut removed = 0;
        for batch in victims.chunks(BATCH) {
            let gone = self.erase(batch)?;
            for ((id, _), there) in batch.iter().zip(gone) {
                if there {
                    self.publish(Change::Delete(*id));
                    removed += 1;
                }
            }
            super::note_dropped(&self.dropped, batch.iter().map(|(id, _)| *id));
        }
        let _ = self
            .len
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(removed))
            });
        Ok(removed)
    }

    /// Deletes each entry of `batch`: both halves, its registry row and its key row while that
    /// still names it (a newer entry may own the key now). Per entry, whether its halves were there.
    /// Each command touches one slot; the batch goes in one round trip per node.
    fn erase(&self, batch: &[(EntryId, String)]) -> Result<Vec<bool>, StoreError> {
        let mut cmds: Vec<Cmd> = Vec::with_capacity(batch.len() * 3);
        for (id, key_row) in batch {
            let mut del = ::redis::cmd("DEL");
            del.arg(cold_key(*id)).arg(replay_key(*id));
            let mut hdel = ::redis::cmd("HDEL");
            hdel.arg(INDEX).arg(id.0);
            let mut unlink_row = ::redis::cmd("EVAL");
            unlink_row.arg(DEL_IF_EQUAL).arg(1).arg(key_row).arg(id.0);
            cmds.extend([del, hdel, unlink_row]);
        }
        let replies = self.with(|c| c.batch(cmds))?;
        replies
            .chunks(3)
            .map(|r| match r.first() {
                Some(Value::Int(n)) => Ok(*n > 0),
                _ => Err(StoreError::Redis("an unexpected reply to DEL".into())),
            })
            .collect()
    }

    /// Deletes entry `id` and, if `key_row` still names it, its key row. True if the entry was there.
    fn delete_one(&self, id: EntryId, key_row: String) -> Result<bool, StoreError> {
        Ok(self.remove(&[(id, key_row)])? > 0)
    }

    /// Counts the entries and their encoded size from `rows` (the registry, sorted by id),
    /// pruning the rows of expired entries (Redis dropped their keys itself). The live rows,
    /// oldest first.
    fn count(&self, rows: Vec<(EntryId, Row)>) -> Result<Vec<(EntryId, Row)>, StoreError> {
        let now = crate::timing::unix_ms();
        let (expired, live): (Vec<_>, Vec<_>) =
            rows.into_iter().partition(|(_, row)| row.expired(now));
        // Redis dropped their keys at their expiry without a word to anyone.
        super::note_dropped(&self.dropped, expired.iter().map(|(id, _)| *id));
        for batch in expired.chunks(BATCH) {
            self.with(|c| {
                let mut hdel = ::redis::cmd("HDEL");
                hdel.arg(INDEX);
                for (id, _) in batch {
                    hdel.arg(id.0);
                }
                hdel.query::<i64>(c)
            })?;
        }
        let held = held_by(&live);
        self.len.store(held.len, Ordering::Relaxed);
        self.bytes.store(held.bytes, Ordering::Relaxed);
        Ok(live)
    }

    /// A page that `page` reads from the listing's ids, allowing it [`GONE_BEFORE_READ`] ids of
    /// entries gone; past that (many deleted or expired since the listing's read: a flush, an
    /// invalidation, a TTL), it reads the registry again and pages from that, unbounded.
    fn listed(
        &self,
        page: impl Fn(&[EntryId], Option<usize>) -> Result<Option<Vec<Entry>>, StoreError>,
    ) -> Result<Vec<Entry>, StoreError> {
        if let Some(found) = page(&self.listing(false)?, Some(GONE_BEFORE_READ))? {
            return Ok(found);
        }
        Ok(page(&self.listing(true)?, None)?.unwrap_or_default())
    }

    /// Up to `limit` entries of `ids`, in their order; `None` once more than `gone` of them are
    /// missing (expired or deleted since they were listed). Read in batches of what the page still
    /// needs (at least [`PAGE_BATCH`]), one round trip each.
    fn page(
        &self,
        ids: impl Iterator<Item = EntryId>,
        limit: usize,
        gone: Option<usize>,
    ) -> Result<Option<Vec<Entry>>, StoreError> {
        let mut ids = ids.fuse();
        let mut out = Vec::new();
        let mut missing = 0;
        while out.len() < limit {
            let want = (limit - out.len()).clamp(PAGE_BATCH, BATCH);
            let batch: Vec<EntryId> = ids.by_ref().take(want).collect();
            if batch.is_empty() {
                break;
            }
            for (&id, halves) in batch.iter().zip(self.halves_of(&batch)?) {
                if out.len() >= limit {
                    break;
                }
                let Some(halves) = halves else {
                    missing += 1;
                    if gone.is_some_and(|gone| missing > gone) {
                        return Ok(None);
                    }
                    continue;
                };
                match whole(id, &halves) {
                    Ok(entry) => out.push(entry),
                    Err(StoreError::Corrupt { id, reason }) => {
                        debug!(%id, reason, "skipping a corrupt entry in redis");
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(Some(out))
    }
}

/// The entry `id` whose two halves are `halves`.
fn whole(id: EntryId, (cold, replay): &Halves) -> Result<Entry, StoreError> {
    let entry = decode(id, cold, false)?;
    let replay = decode_replay(id, replay, false)?;
    entry
        .with_answer(&replay)
        .map_err(|reason| StoreError::Corrupt { id, reason })
}

/// Registry rows as a scan read them, sorted by id, each once (`HSCAN` may return a row twice).
fn sorted(mut rows: Vec<(EntryId, Row)>) -> Vec<(EntryId, Row)> {
    rows.sort_unstable_by_key(|(id, _)| *id);
    rows.dedup_by_key(|(id, _)| *id);
    rows
}

/// How many entries `rows` are, and their encoded size.
fn held_by(rows: &[(EntryId, Row)]) -> Held {
    Held {
        len: rows.len(),
        bytes: rows.iter().map(|(_, row)| row.size).sum(),
    }
}

/// Entries of the registry that a newer entry for the same exact key replaced without deleting
/// them: their writer died between writing them and naming them (or between naming the newer one
/// and deleting the old), and another replica answered the same prompt since. Unnamed, they would
/// stay listed and counted until their TTL. Each comes with its key row, which the removal
/// deletes only while it still names that entry.
fn superseded(rows: &[(EntryId, Row)]) -> Vec<(EntryId, String)> {
    let mut newest: std::collections::HashMap<&CacheKey, EntryId> =
        std::collections::HashMap::with_capacity(rows.len());
    for (id, row) in rows {
        let slot = newest.entry(&row.key).or_insert(*id);
        *slot = (*slot).max(*id);
    }
    rows.iter()
        .filter(|(id, row)| newest.get(&row.key) != Some(id))
        .map(|(id, row)| (*id, exact_key(&row.key)))
        .collect()
}

impl Store for RedisStore {
    fn coordination(&self) -> Option<&dyn Coordination> {
        Some(self)
    }

    fn feed(&self) -> Option<&dyn Feed> {
        Some(&self.feed)
    }

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
        if !self.connector.is_cluster() {
            let found: Option<(u64, Vec<u8>)> =
                self.with(|c| self.hit.key(exact_key(key)).invoke(c))?;
            return found
                .map(|(id, raw)| decode_replay(EntryId(id), &raw, false))
                .transpose()
                .map(|replay| replay.filter(|replay| replay.key() == *key));
        }
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
        let row = Row {
            expires_at_ms: if expiry.is_empty() {
                0
            } else {
                entry.expires_at_ms().max(1)
            },
            size,
            key: entry.key,
            used_ms: recency_ms(entry.created_at_ms, entry.last_hit_ms),
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
        // After the entry (another slot), so listing never finds a row without its entry.
        self.with(|c| c.hset::<_, _, _, ()>(INDEX, id.0, row.render()))?;
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
            // Its key row names this entry now: only the old halves and registry row go.
            self.delete_one(EntryId(old), exact_key(&entry.key))?;
        }
        Ok(id)
    }

    fn delete(&self, id: EntryId) -> Result<bool, StoreError> {
        // No key row known: the halves and the registry row still go (nothing names `-`).
        let key_row = self
            .key_row_of(id)?
            .unwrap_or_else(|| "reprise:key:-".into());
        self.delete_one(id, key_row)
    }

    fn touch(&self, id: EntryId, hits: u64, recent: &[HitEvent]) -> Result<(), StoreError> {
        ledger::touch(hits, recent, |record| self.update(id, record))
    }

    fn set_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.write_vector(id, vector, false)
    }

    /// Shared stores are never re-embedded (replicas agree on one model instead), but the
    /// operation means the same here.
    fn replace_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.write_vector(id, vector, true)
    }

    fn list_newest(&self, before: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let below = |id: &EntryId| before.is_none_or(|b| *id < b);
        self.listed(|ids, gone| self.page(ids.iter().rev().copied().filter(below), limit, gone))
    }

    fn list(&self, after: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let above = |id: &EntryId| after.is_none_or(|a| *id > a);
        self.listed(|ids, gone| self.page(ids.iter().copied().filter(above), limit, gone))
    }

    fn ids(&self) -> Result<Vec<EntryId>, StoreError> {
        self.live_ids()
    }

    fn take_dropped(&self) -> Vec<EntryId> {
        std::mem::take(&mut *self.dropped.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// One round trip per node for the whole page (a `GET` per cold half, split by slot), instead
    /// of a listing that reads the registry again for every page.
    fn cold(&self, ids: &[EntryId]) -> Result<Vec<Entry>, StoreError> {
        let values = self.get_each(ids.iter().map(|id| cold_key(*id)))?;
        let mut out = Vec::with_capacity(ids.len());
        for (&id, raw) in ids.iter().zip(values) {
            // Expired or deleted since the ids were read.
            let Some(raw) = raw else { continue };
            match decode(id, &raw, false) {
                Ok(entry) => out.push(entry),
                Err(e) => debug!(%id, error = %e, "skipping a corrupt entry in redis"),
            }
        }
        Ok(out)
    }

    fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl Upkeep for RedisStore {
    /// Redis expires entries itself (`PXAT`), so `expired` is always 0. Over a cap, the least
    /// recently used entries go first (stored or last hit, on any replica; the hit bookkeeping
    /// reaches Redis in the writer's batches), down to a hundredth below the cap. What it reads of
    /// the registry is paced as [`super::recount`] says: `HLEN` at every sweep, a slice of a
    /// routine recount (which prunes the rows of expired and superseded entries), or the whole
    /// registry when a cap is exceeded.
    fn sweep(
        &self,
        _now_ms: u64,
        max_entries: usize,
        max_bytes: u64,
    ) -> Result<(usize, usize), StoreError> {
        let mut recounts = self.recounts.lock().unwrap_or_else(|e| e.into_inner());
        let rows: usize = self.with(|c| c.hlen(INDEX))?;
        let estimate = recounts.estimate(rows);
        if let Some(held) = estimate {
            self.len.store(held.len, Ordering::Relaxed);
            self.bytes.store(held.bytes, Ordering::Relaxed);
        }
        let budget = match recounts.read(estimate, max_entries, max_bytes) {
            Read::Nothing => return Ok((0, 0)),
            Read::Slice => Some(SLICE),
            Read::Whole => None,
        };
        if !self.scan_for(recounts.scan(), budget)? {
            return Ok((0, 0));
        }
        let rows = sorted(recounts.take_done().unwrap_or_default());
        let mut live = self.count(rows)?;
        let superseded = superseded(&live);
        if !superseded.is_empty() {
            let gone: HashSet<EntryId> = superseded.iter().map(|(id, _)| *id).collect();
            live.retain(|(id, _)| !gone.contains(id));
            debug!(
                entries = superseded.len(),
                "removing entries superseded for their key"
            );
            self.remove(&superseded)?;
        }
        let mut held = held_by(&live);
        let mut victims = Vec::new();
        if held.over(max_entries, max_bytes) {
            // Least recently used first, across replicas: every replica's hits move `used_ms`.
            // Every row is at hand, so the order is exact where sled's ledger samples.
            live.sort_unstable_by_key(|(id, row)| lru_order(row.used_ms, id.0));
            let (entries_floor, bytes_floor) = recount::floor(max_entries, max_bytes);
            for (id, row) in &live {
                if !held.over(entries_floor, bytes_floor) {
                    break;
                }
                victims.push((*id, exact_key(&row.key)));
                held.shed(row.size);
            }
        }
        let evicted = self.remove(&victims)?;
        recounts.counted(held);
        self.len.store(held.len, Ordering::Relaxed);
        self.bytes.store(held.bytes, Ordering::Relaxed);
        Ok((0, evicted))
    }

    /// Durability is the Redis server's (its AOF/RDB settings): nothing to do here.
    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Deletes every entry the registry names (with its key row, while that names it), not the
    /// id counter, the feed, its histories or the flight locks. No `SCAN`: it would see one node
    /// of a cluster only.
    fn clear(&self) -> Result<usize, StoreError> {
        let rows = self.rows()?;
        let mut n = 0;
        for batch in rows.chunks(BATCH) {
            let victims: Vec<(EntryId, String)> = batch
                .iter()
                .map(|(id, row)| (*id, exact_key(&row.key)))
                .collect();
            n += self
                .erase(&victims)?
                .into_iter()
                .filter(|gone| *gone)
                .count();
        }
        self.len.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
        // Every id it holds is gone.
        *self.listing.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.publish(Change::Clear);
        Ok(n)
    }
}

impl Coordination for RedisStore {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_rows_read_back_as_written_and_expire_at_their_time() {
        let row = Row {
            expires_at_ms: 1_700_000_000_000,
            size: 2_048,
            key: CacheKey([0xab; 32]),
            used_ms: 1_600_000_000_000,
        };
        assert_eq!(Row::parse(&row.render()), Some(row.clone()));
        let unused = format!("1 2 {}", "ab".repeat(32));
        assert_eq!(Row::parse(&unused).map(|r| r.used_ms), Some(0));
        assert!(!row.expired(row.expires_at_ms - 1));
        assert!(row.expired(row.expires_at_ms));
        let forever = Row {
            expires_at_ms: 0,
            ..row
        };
        assert!(!forever.expired(u64::MAX));
        for damaged in ["", "1 2", "x 2 ab", "1 2 ab x", "1 2 ab 3 extra"] {
            assert_eq!(Row::parse(damaged), None, "{damaged}");
        }
    }
}
