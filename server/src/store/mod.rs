//! The store's contract: the traits every backend implements, their errors, the disk budget the
//! sled store keeps, and the family's public names. It must hold no backend's code: sled lives in
//! `sled.rs` (its encodings in `codec.rs`, its in-memory ledger, and the bookkeeping both stores
//! share, in `ledger.rs`), Redis in `redis.rs` (with `feed.rs`, `claim.rs`, `connect.rs`), the
//! degraded-mode wrapper in `resilient.rs`.
//!
//! A store holds payloads and the exact-key index only (the vector index lives elsewhere). It must
//! never hand out a corrupt or half-written entry.
//!
//! # Three concerns
//! - [`Store`]: entries and listing (get, replay, put, delete, touch, set_vector, list, cold
//!   halves for the index, counts).
//!   It keeps the name because it is what callers name: `Arc<dyn Store>` is the handle passed
//!   around, and the other halves are reached from it, so no call site names a second trait.
//! - [`Upkeep`]: sweep, flush, caps, clear, health and recovery, the disk budget: the writer
//!   thread's and admin's. A supertrait of [`Store`], so a `dyn Store` reaches it without an
//!   import; code that calls it on a concrete store (`SledStore` in tests) imports `Upkeep`.
//! - [`Coordination`]: single-flight claims across replicas, reached through
//!   [`Store::coordination`], which only a shared store (Redis) answers; [`claim`], [`renew`],
//!   [`release`] and [`claimed`] give the answer of a store no other process shares. The change
//!   feed is reached the same way, by [`Store::feed`].
//!
//! # Blocking, and never on an async worker
//! Every method of these traits is blocking: a sled read may wait on the disk, a Redis call is a
//! network round trip. No store call may run on an async worker (with two workers, one slow Redis
//! round trip on each stalls every request of the process, `/healthz` included). The async half is
//! [`offload`]: the request path (exact and alias lookups, replays by id, approved hits,
//! cross-replica claims) reaches the store only through [`Offload`] (`Cache::read`), which runs
//! each call on tokio's blocking pool, at most [`offload::MAX_CALLS`] (16) at once, and gives it up
//! after [`offload::CALL_DEADLINE`] (200 ms) as a miss. Everything else calls the store from
//! threads of its own (the cache's writer thread, the backfill, the feed follower) or inside
//! `spawn_blocking` (admin routes, semantic search). Only `len`, `bytes`, `errors` and `degraded`,
//! which read counters and never wait on I/O, are called from async code directly.

use std::path::PathBuf;

use crate::entry::{Entry, EntryId, HitEvent, Replay};
use crate::key::CacheKey;

pub use reprise_migrations::MigrationError;

mod claim;
mod codec;
mod compact;
pub mod connect;
#[cfg(test)]
pub(crate) mod faulty;
pub mod feed;
mod ledger;
mod ledger_file;
mod listing;
pub mod offload;
mod recount;
mod redis;
mod resilient;
mod salvage;
mod sled;
#[cfg(test)]
pub(crate) mod stalled;

pub use self::redis::{default_replica as redis_default_replica, RedisStore};
#[cfg(test)]
pub(crate) use self::sled::disk_usage_racy;
pub(crate) use self::sled::open_waiting;
pub use self::sled::SledStore;
pub use claim::{Claim, ClaimToken};
pub use codec::CHUNK;
pub use feed::{Change, Feed};
pub use offload::Offload;
pub use resilient::{Degraded, ResilientStore};

/// The most dropped ids a store keeps for [`Store::take_dropped`]: a store that nobody drains (a
/// tool, a test) must not grow without bound; past it the oldest go (their vectors then stay in
/// the index until a search meets them, as before).
pub const DROPPED_KEPT: usize = 1 << 20;

/// Notes `ids` as dropped, for [`Store::take_dropped`].
pub(crate) fn note_dropped(
    dropped: &std::sync::Mutex<Vec<EntryId>>,
    ids: impl IntoIterator<Item = EntryId>,
) {
    let mut dropped = crate::lock::lock(dropped);
    dropped.extend(ids);
    let excess = dropped.len().saturating_sub(DROPPED_KEPT);
    dropped.drain(..excess);
}

/// The data-directory schema version this build reads and writes.
pub const SCHEMA_VERSION: u32 = reprise_migrations::CURRENT;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store: {0}")]
    Sled(#[from] ::sled::Error),
    #[error("entry {id} is corrupt: {reason}")]
    Corrupt { id: EntryId, reason: String },
    #[error(transparent)]
    Migration(#[from] MigrationError),
    #[error("cannot create data directory {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode entry: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("data directory {} exists and is not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("data directory {} is not writable: {source}", path.display())]
    Unwritable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "data directory {} is locked by another process (is another Reprise running on it?)",
        path.display()
    )]
    Locked { path: PathBuf },
    #[error("no space left on the disk of data directory {}: {source}", path.display())]
    Full {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the cache store in {} is corrupt: {reason}", path.display())]
    CorruptStore { path: PathBuf, reason: String },
    #[error("the cache store is unavailable (degraded) and not caching")]
    Unavailable,
    /// An entry larger than the whole `--max-bytes` cap: relayed, never stored.
    #[error("entry of {size} bytes is larger than the store's cap of {max_bytes} bytes")]
    TooLarge { size: u64, max_bytes: u64 },
    /// A Redis command failed (unreachable, timed out, refused): never names the URL.
    #[error("redis: {0}")]
    Redis(String),
    /// Redis answered, and refuses writes (`OOM` when full under `noeviction`, `READONLY`,
    /// `MISCONF`, `NOREPLICAS`): reads still work.
    #[error("redis refuses writes: {0}")]
    RedisRefusesWrites(String),
}

impl StoreError {
    /// True when the store's files cannot be read as a store: moving them aside may help, unlike
    /// a permission, a lock, a full disk or a newer schema.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Self::CorruptStore { .. })
    }
}

/// Store operations that did not reach the store, since start: `failed` (an I/O error, a Redis
/// timeout or refusal), `skipped` (not tried while the store was degraded: each is a lookup
/// that missed or a write that was dropped) and `timed_out` (a call from the request path given
/// up at its deadline, see [`offload`]: a lookup that missed).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct StoreErrors {
    pub failed: u64,
    pub skipped: u64,
    pub timed_out: u64,
}

impl StoreErrors {
    /// By kind, as `/metrics` labels them.
    pub fn counts(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("failed", self.failed),
            ("skipped", self.skipped),
            ("timed_out", self.timed_out),
        ]
    }
}

/// Storage of cache entries: what the request path, the writer and admin read and write. Blocking
/// (see the module doc). The entries half keeps the name `Store` because it is what nearly every
/// caller names; its upkeep ([`Upkeep`]) is a supertrait, so an `Arc<dyn Store>` reaches both, and
/// a shared store's [`Coordination`] is reached through [`Store::coordination`].
pub trait Store: Upkeep {
    fn get(&self, id: EntryId) -> Result<Option<Entry>, StoreError>;
    /// The entry the exact-key index names for `key`.
    fn get_by_key(&self, key: &CacheKey) -> Result<Option<Entry>, StoreError>;
    /// The hot read, for exact hits: the [`Replay`] of the entry the exact-key index names for
    /// `key`, read without the rest of the entry and without decoding JSON.
    fn replay_by_key(&self, key: &CacheKey) -> Result<Option<Replay>, StoreError>;
    /// The [`Replay`] of entry `id`, for a hit that found its entry by id (semantic matching, an
    /// alias): the same read as an exact hit's, where the store keeps replays apart. The default
    /// builds it from the whole entry.
    fn replay(&self, id: EntryId) -> Result<Option<Replay>, StoreError> {
        Ok(self.get(id)?.map(|entry| Replay::of(&entry)))
    }
    /// Assigns `entry.id` (the incoming id is ignored) and writes the entry and its exact-key index
    /// row atomically, replacing (and deleting) any older entry with the same key. Returns the id.
    fn put(&self, entry: Entry) -> Result<EntryId, StoreError>;
    /// Removes the entry and its index row atomically; false if there was no such entry.
    fn delete(&self, id: EntryId) -> Result<bool, StoreError>;
    /// Records hits: adds `hits` to `hit_count`, the `recent` ones (the latest of them) to the
    /// bounded `hit_history`, and moves `last_hit_ms` forward (never back). Meant for off the request path; a missing entry is not an error (it
    /// may have been evicted).
    fn touch(&self, id: EntryId, hits: u64, recent: &[HitEvent]) -> Result<(), StoreError>;
    /// Gives an entry stored without a vector its vector (the backfill). False, and nothing
    /// written, when the entry is gone or already has one.
    fn set_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError>;
    /// Replaces an entry's vector, whatever it was (re-embedding after a change of model). False,
    /// and nothing written, when the entry is gone.
    fn replace_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError>;
    /// Entries newest first, with ids below `before` (exclusive), at most `limit`: admin listing.
    fn list_newest(&self, before: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError>;
    /// Entries in id order after `after` (exclusive), at most `limit`: for paginated admin listing.
    fn list(&self, after: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError>;
    /// Every stored entry id, without decoding the entries.
    fn ids(&self) -> Result<Vec<EntryId>, StoreError>;
    /// The stored ids with a vector and those without, in id order, when the store knows them
    /// without reading entries (sled's ledger); `None` otherwise, and the caller reads [`Store::cold`].
    fn vector_ids(&self) -> Option<(Vec<EntryId>, Vec<EntryId>)> {
        None
    }
    /// Entries `ids` without their answers (`events` and `body` left empty), in `ids`' order,
    /// skipping those gone or unreadable: what start-up and a rebuild of the vector index read
    /// (vector, partition, route, prompt), a page at a time, so that a million entries are never
    /// held at once and no answer is read, and what a semantic search reads of each candidate.
    /// The default reads each whole entry and drops its answer.
    fn cold(&self, ids: &[EntryId]) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            if let Some(mut entry) = self.get(id)? {
                entry.events = Vec::new();
                entry.body = serde_json::Value::Null;
                out.push(entry);
            }
        }
        Ok(out)
    }
    /// The ids of entries this store dropped on its own since the last call: the older entry a put
    /// of the same key replaced, entries evicted to hold the caps, expired or found unreadable (and
    /// deleted ones). Whoever mirrors the store drains them: the cache's writer removes them from
    /// the vector index, which would otherwise keep them until a search met them, and would dump
    /// an id set the store no longer has, so the next start rebuilt the whole index instead of
    /// loading its dump. At most [`DROPPED_KEPT`] are kept between two calls.
    fn take_dropped(&self) -> Vec<EntryId> {
        Vec::new()
    }
    /// Number of entries, O(1).
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Sum of the stored (encoded) entry sizes, O(1).
    fn bytes(&self) -> u64;
    /// Single flight across replicas, when replicas share this store; `None` for a store no other
    /// process shares (sled), whose callers act as if every claim were granted ([`Claim::Local`])
    /// and none were held: [`claim`] and the other helpers below do that.
    fn coordination(&self) -> Option<&dyn Coordination> {
        None
    }
    /// The change feed, when replicas share this store: what they change is published there (the
    /// store publishes its own puts and deletes), and what others change is read from it. Reached
    /// like [`Store::coordination`], beside it rather than in it: [`ResilientStore`] hands out
    /// Redis's feed as it is, while its claims pass its degraded-mode guard.
    fn feed(&self) -> Option<&dyn Feed> {
        None
    }
}

/// Keeping a store within its caps and healthy: what the cache's writer thread and admin call, never
/// the request path. Blocking (see the module doc).
pub trait Upkeep: Send + Sync + 'static {
    /// Deletes entries expired at `now_ms`, then evicts by approximate LRU while over `max_entries`
    /// or `max_bytes`. Also deletes entries that reads found corrupt. Returns (expired, evicted).
    fn sweep(
        &self,
        now_ms: u64,
        max_entries: usize,
        max_bytes: u64,
    ) -> Result<(usize, usize), StoreError>;
    /// Makes every write so far durable.
    fn flush(&self) -> Result<(), StoreError>;
    /// The last call at shutdown, after the last write: flushes, and may leave what makes the next
    /// open fast (sled: its ledger, so the next open reads no entry). A write after it is still
    /// safe, only that shortcut is lost.
    fn close(&self) -> Result<(), StoreError> {
        self.flush()
    }
    /// Caps the store holds at every write from now on: a put (or a rewrite that grows an entry)
    /// first evicts, by the same approximate LRU as `sweep`, what it needs to stay within both,
    /// and an entry larger than `max_bytes` alone is refused ([`StoreError::TooLarge`]). Evicts
    /// down to the caps at once. A store without it leaves the caps to `sweep`.
    fn set_caps(&self, _max_entries: usize, _max_bytes: u64) -> Result<(), StoreError> {
        Ok(())
    }
    /// Removes every entry; returns how many there were.
    fn clear(&self) -> Result<usize, StoreError>;
    /// Why the store is not caching (its disk failed), if it is not.
    fn degraded(&self) -> Option<Degraded> {
        None
    }
    /// Operations that failed or were skipped since start (see [`StoreErrors`]).
    fn errors(&self) -> StoreErrors {
        StoreErrors::default()
    }
    /// Tries to bring a degraded store back (blocking, rate-limited); true when it is healthy.
    fn recover(&self) -> bool {
        true
    }
    /// Rebuilds the store when its files take more than [`disk_budget`]`(max_bytes)`; true if
    /// it did. Blocking; called by the cache's writer thread after a sweep.
    fn enforce_disk_budget(&self, _max_bytes: u64) -> bool {
        false
    }
}

/// What replicas sharing one store agree through it: who asks the upstream for a key (single flight
/// across replicas, see [`Claim`]). Reached through [`Store::coordination`] only, so a store no
/// other process shares implements none of it. Blocking (see the module doc).
pub trait Coordination: Send + Sync {
    /// Claims the right to ask the upstream for `key`, for `ttl_ms` unless renewed (single flight
    /// across replicas, see [`Claim`]).
    fn claim(&self, key: &CacheKey, ttl_ms: u64) -> Result<Claim, StoreError>;
    /// Extends a held claim to `ttl_ms` from now; false when `token` no longer holds it.
    fn renew(&self, key: &CacheKey, token: &ClaimToken, ttl_ms: u64) -> Result<bool, StoreError>;
    /// Gives up a claim if `token` still holds it; true if it did.
    fn release(&self, key: &CacheKey, token: &ClaimToken) -> Result<bool, StoreError>;
    /// Whether any replica holds a claim on `key`.
    fn claimed(&self, key: &CacheKey) -> Result<bool, StoreError>;
}

/// [`Coordination::claim`] on `store`'s coordination; a store no other process shares grants
/// every claim locally.
pub fn claim(store: &dyn Store, key: &CacheKey, ttl_ms: u64) -> Result<Claim, StoreError> {
    store
        .coordination()
        .map_or(Ok(Claim::Local), |c| c.claim(key, ttl_ms))
}

/// [`Coordination::renew`]; false on a store no other process shares (no claim to renew).
pub fn renew(
    store: &dyn Store,
    key: &CacheKey,
    token: &ClaimToken,
    ttl_ms: u64,
) -> Result<bool, StoreError> {
    store
        .coordination()
        .map_or(Ok(false), |c| c.renew(key, token, ttl_ms))
}

/// [`Coordination::release`]; false on a store no other process shares.
pub fn release(store: &dyn Store, key: &CacheKey, token: &ClaimToken) -> Result<bool, StoreError> {
    store
        .coordination()
        .map_or(Ok(false), |c| c.release(key, token))
}

/// [`Coordination::claimed`]; false on a store no other process shares (nobody else to hold one).
pub fn claimed(store: &dyn Store, key: &CacheKey) -> Result<bool, StoreError> {
    store.coordination().map_or(Ok(false), |c| c.claimed(key))
}

/// The most the store's files may take before they are rebuilt for a cap of `max_bytes`: sled
/// cleans a log segment only once less than half of it is live and only in its flusher's spare
/// time, so under a steady stream of long answers its file grew to 20x the live data and more.
/// A rebuild copies the live data (at most `max_bytes`) into a fresh file, so the data dir stays
/// within `disk_budget(max_bytes) + max_bytes` plus a few segments.
pub fn disk_budget(max_bytes: u64) -> u64 {
    max_bytes.saturating_mul(3).saturating_add(32 << 20)
}

/// What a rebuild's fresh copy of the live entries (at most `max_bytes`) takes beside the old
/// files until they go: sled rewrites each leaf as it fills, so the copy takes about 2.5x the live
/// bytes plus a few segments (measured: 1.7 MB live -> 5.2 MB, 4.6 MB -> 11.4 MB).
pub fn rebuild_allowance(max_bytes: u64) -> u64 {
    max_bytes.saturating_mul(3).saturating_add(4 << 20)
}

/// The most the data directory (every file in it, as `du` counts them, the vector index aside)
/// takes for a cap of `max_bytes`, at every moment: what the README states. The writer checks the
/// budget after every put, so the old files pass it by one answer's writes (and what sled still
/// buffers) at most, 4 MiB here, before a rebuild writes its copy beside them.
pub fn disk_bound(max_bytes: u64) -> u64 {
    disk_budget(max_bytes)
        .saturating_add(rebuild_allowance(max_bytes))
        .saturating_add(4 << 20)
}
