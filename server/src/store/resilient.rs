//! A [`Store`] that keeps the gateway answering when the disk under the store fails (full, I/O
//! errors, a store that could not be opened at start): it reports itself degraded, reads as empty
//! (every lookup a miss, so requests pass through; a read of the whole store, for the vector
//! index, fails instead), refuses writes at once, logs the failure once
//! rather than per request, and reopens the store when space returns. It must never make a
//! request wait on recovery.
//!
//! Why reopen: after a failed write sled 0.34 keeps a global error and fails every later operation,
//! so the only way back is a fresh `sled::Db` on the same directory. [`ResilientStore::recover`]
//! does that; the cache's writer thread calls it while degraded, at most every [`RETRY`].
//!
//! A Redis that answers and refuses writes (full under `noeviction`, a read-only replica) degrades
//! writes only: lookups go on, writes are skipped and counted, and one is tried again at most every
//! [`RETRY`] (a real one, or the writer thread's probe): the first accepted ends the spell. A
//! `PING` would answer all along, so it proves nothing here.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::{Claim, ClaimToken, Coordination, RedisStore, SledStore, Store, StoreError, Upkeep};
use crate::entry::{Entry, EntryId, HitEvent, Replay};
use crate::key::CacheKey;

/// Shortest time between two attempts to reopen a failed store.
pub(super) const RETRY: Duration = Duration::from_secs(2);
/// Shortest time between two log lines about the same degraded spell.
const LOG_EVERY: Duration = Duration::from_secs(300);

/// Why the store is not caching, and since when.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Degraded {
    pub reason: String,
    /// Unix ms when caching stopped.
    pub since_ms: u64,
    /// Store operations that failed or were refused since then.
    pub failures: u64,
    /// True while lookups still reach the store: Redis refuses writes only (the reason says why).
    pub reads: bool,
}

pub struct ResilientStore {
    dir: PathBuf,
    /// `None` while the store is closed for recovery (or never opened).
    inner: RwLock<Option<Arc<SledStore>>>,
    /// Set for `--store redis`, in place of sled: it is never closed, but while degraded no call
    /// reaches it (a dead server must not cost each request its timeouts) until a `PING` answers.
    redis: Option<Arc<RedisStore>>,
    /// Whether the Redis store is degraded, read by every call without taking `state`'s lock.
    redis_down: AtomicBool,
    state: Mutex<State>,
    /// Since start: operations that failed on the store, and those not tried because it was
    /// degraded (`reprise_store_errors_total`).
    failed: AtomicU64,
    skipped: AtomicU64,
    /// The caps given to [`Upkeep::set_caps`], given again to every reopened sled store.
    caps: Mutex<Option<(usize, u64)>>,
}

#[derive(Default)]
struct State {
    degraded: Option<Degraded>,
    logged_at: Option<Instant>,
    attempted_at: Option<Instant>,
    /// Set while Redis refuses writes: until then writes are skipped, after it one is tried.
    writes_retry_at: Option<Instant>,
}

impl ResilientStore {
    /// An open store.
    pub fn new(dir: &Path, store: SledStore) -> Self {
        Self {
            dir: dir.to_owned(),
            inner: RwLock::new(Some(Arc::new(store))),
            redis: None,
            redis_down: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            failed: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            caps: Mutex::new(None),
        }
    }

    /// The shared Redis store; `dir` only names it in logs.
    pub fn redis(store: RedisStore) -> Self {
        Self {
            dir: PathBuf::from("redis"),
            inner: RwLock::new(None),
            redis: Some(Arc::new(store)),
            redis_down: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            failed: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            caps: Mutex::new(None),
        }
    }

    /// A store that could not be opened for a reason that may pass (a full disk): the gateway
    /// starts without caching, and [`ResilientStore::recover`] keeps trying to open it.
    pub fn unavailable(dir: &Path, why: &StoreError) -> Self {
        let this = Self {
            dir: dir.to_owned(),
            inner: RwLock::new(None),
            redis: None,
            redis_down: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            failed: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            caps: Mutex::new(None),
        };
        this.fail(why);
        this
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn current(&self) -> Option<Arc<SledStore>> {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Why the store is not caching, if it is not.
    pub fn degraded(&self) -> Option<Degraded> {
        self.lock_state().degraded.clone()
    }

    /// Notes a failed operation: the first one of a spell is logged, later ones only counted (one
    /// reminder per [`LOG_EVERY`]).
    pub(crate) fn fail(&self, why: &StoreError) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let mut state = self.lock_state();
        if self.redis.is_some() {
            self.redis_down.store(true, Ordering::Release);
        }
        let now = Instant::now();
        let quiet = state.logged_at.is_some_and(|at| now - at < LOG_EVERY);
        match &mut state.degraded {
            // Writes were refused; now reads fail too.
            Some(d) if d.reads => {
                d.reads = false;
                d.reason = why.to_string();
                d.failures += 1;
                warn!(error = %why, "CACHE STORE DEGRADED: serving without caching until the store answers again");
            }
            Some(d) => {
                d.failures += 1;
                if quiet {
                    return;
                }
                warn!(
                    reason = %d.reason,
                    failures = d.failures,
                    "cache store still degraded: serving without caching"
                );
            }
            None => {
                state.degraded = Some(Degraded {
                    reason: why.to_string(),
                    since_ms: crate::timing::unix_ms(),
                    failures: 1,
                    reads: false,
                });
                warn!(error = %why, dir = %self.dir.display(),
                    "CACHE STORE DEGRADED: serving without caching until the store can write again");
            }
        }
        state.logged_at = Some(now);
    }

    /// Runs `op` on the open store; a storage failure degrades the store, and `fallback` answers
    /// in its place (reads fail open), while an entry-level error passes through.
    fn with<T>(
        &self,
        fallback: impl FnOnce() -> Result<T, StoreError>,
        op: impl FnOnce(&dyn Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        if let Some(redis) = &self.redis {
            if self.redis_down.load(Ordering::Acquire) {
                self.skipped.fetch_add(1, Ordering::Relaxed);
                if let Some(d) = &mut self.lock_state().degraded {
                    d.failures += 1;
                }
                return fallback();
            }
            return match op(redis.as_ref()) {
                Err(e @ StoreError::RedisRefusesWrites(_)) => {
                    self.refuse_writes(&e);
                    fallback()
                }
                Err(e) if is_storage_failure(&e) => {
                    redis.reset();
                    self.fail(&e);
                    fallback()
                }
                other => other,
            };
        }
        let Some(store) = self.current() else {
            self.skipped.fetch_add(1, Ordering::Relaxed);
            if let Some(d) = &mut self.lock_state().degraded {
                d.failures += 1;
            }
            return fallback();
        };
        match op(store.as_ref()) {
            Err(e) if is_storage_failure(&e) => {
                self.fail(&e);
                fallback()
            }
            other => other,
        }
    }

    /// While degraded, and at most every [`RETRY`]: closes the store and opens it again. Returns
    /// true when the store is (again) healthy. Blocking; called by the cache's writer thread.
    pub fn recover(&self) -> bool {
        {
            let mut state = self.lock_state();
            if state.degraded.is_none() {
                return true;
            }
            if state.attempted_at.is_some_and(|at| at.elapsed() < RETRY) {
                return false;
            }
            state.attempted_at = Some(Instant::now());
        }
        if let Some(redis) = &self.redis {
            if !self.redis_down.load(Ordering::Acquire) {
                return self.probe_writes(redis);
            }
            return match redis.ping() {
                Ok(()) => {
                    self.recovered();
                    true
                }
                Err(e) => {
                    redis.reset();
                    if let Some(d) = &mut self.lock_state().degraded {
                        d.reason = e.to_string();
                    }
                    false
                }
            };
        }
        // Readers see no store from here (a miss each); sled's file lock goes with the last handle.
        let old = self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
        drop(old);
        match SledStore::open(&self.dir).and_then(|store| self.capped(store)) {
            Ok(store) => {
                *self.inner.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(store));
                self.recovered();
                true
            }
            Err(e) => {
                let mut state = self.lock_state();
                if let Some(d) = &mut state.degraded {
                    d.reason = e.to_string();
                }
                false
            }
        }
    }
}

impl ResilientStore {
    /// `store` holding the caps last set, for a store opened in place of the old one.
    fn capped(&self, store: SledStore) -> Result<SledStore, StoreError> {
        let caps = *self.caps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((max_entries, max_bytes)) = caps {
            store.set_caps(max_entries, max_bytes)?;
        }
        Ok(store)
    }

    fn recovered(&self) {
        let mut state = self.lock_state();
        self.redis_down.store(false, Ordering::Release);
        state.writes_retry_at = None;
        if let Some(d) = state.degraded.take() {
            info!(
                down_ms = crate::timing::unix_ms().saturating_sub(d.since_ms),
                refused = d.failures,
                "cache store recovered: caching again"
            );
        }
        state.logged_at = None;
    }

    /// Bytes sled's files take (0 while closed): what [`Self::enforce_disk_budget`] holds.
    pub fn size_on_disk(&self) -> u64 {
        self.current().map_or(0, |s| s.size_on_disk())
    }

    /// Rebuilds the store into a fresh file when sled's files outgrew
    /// [`super::disk_budget`]`(max_bytes)`. Lookups miss while it runs (about a second per
    /// 100 MB of live entries); a failure degrades the store, and recovery reopens it.
    pub fn enforce_disk_budget(&self, max_bytes: u64) -> bool {
        let Some(store) = self.current() else {
            return false;
        };
        let on_disk = store.size_on_disk();
        if on_disk <= super::disk_budget(max_bytes) {
            return false;
        }
        drop(store);
        let old = self.inner.write().unwrap_or_else(|e| e.into_inner()).take();
        drop(old);
        match SledStore::open_compacted(&self.dir).and_then(|store| self.capped(store)) {
            Ok(store) => {
                info!(
                    before = on_disk,
                    after = store.size_on_disk(),
                    entries = store.len(),
                    "rebuilt the cache store: its files had outgrown the disk budget"
                );
                *self.inner.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(store));
                true
            }
            Err(e) => {
                self.fail(&e);
                false
            }
        }
    }
}

/// Redis refusing writes (see the module doc).
impl ResilientStore {
    /// Runs the write `op` as [`Self::with`] does; while Redis refuses writes it is skipped
    /// (`fallback` answers) unless a retry is due, and an accepted one ends the refusal.
    fn write<T>(
        &self,
        fallback: impl FnOnce() -> Result<T, StoreError>,
        op: impl FnOnce(&dyn Store) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        {
            let mut state = self.lock_state();
            match state.writes_retry_at {
                None => {
                    drop(state);
                    return self.with(fallback, op);
                }
                Some(at) if Instant::now() < at => {
                    self.skipped.fetch_add(1, Ordering::Relaxed);
                    if let Some(d) = &mut state.degraded {
                        d.failures += 1;
                    }
                    drop(state);
                    return fallback();
                }
                // This write is the retry; the others keep skipping meanwhile.
                Some(_) => state.writes_retry_at = Some(Instant::now() + RETRY),
            }
        }
        let mut accepted = false;
        let result = self.with(fallback, |s| {
            let result = op(s);
            accepted = !matches!(&result, Err(e) if is_storage_failure(e));
            result
        });
        if accepted {
            self.writes_accepted();
        }
        result
    }

    /// Notes a refused write: the first of a spell is logged, later ones counted (one reminder
    /// per [`LOG_EVERY`]); the store stays readable.
    fn refuse_writes(&self, why: &StoreError) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut state = self.lock_state();
        state.writes_retry_at = Some(now + RETRY);
        let quiet = state.logged_at.is_some_and(|at| now - at < LOG_EVERY);
        match &mut state.degraded {
            Some(d) => {
                d.failures += 1;
                if d.reads {
                    d.reason = why.to_string();
                }
                if quiet {
                    return;
                }
                warn!(reason = %d.reason, failures = d.failures, "the cache store still refuses writes: answers are not stored");
            }
            None => {
                state.degraded = Some(Degraded {
                    reason: why.to_string(),
                    since_ms: crate::timing::unix_ms(),
                    failures: 1,
                    reads: true,
                });
                warn!(error = %why, "CACHE STORE REFUSES WRITES: lookups go on, new answers are not stored until it accepts writes again");
            }
        }
        state.logged_at = Some(now);
    }

    fn writes_accepted(&self) {
        let mut state = self.lock_state();
        state.writes_retry_at = None;
        if state.degraded.as_ref().is_some_and(|d| d.reads) {
            if let Some(d) = state.degraded.take() {
                info!(
                    refused_ms = crate::timing::unix_ms().saturating_sub(d.since_ms),
                    skipped = d.failures,
                    "the cache store accepts writes again: caching again"
                );
            }
            state.logged_at = None;
        }
    }

    /// The writer thread's retry while only writes are refused (rate-limited by `recover`).
    fn probe_writes(&self, redis: &RedisStore) -> bool {
        match redis.probe_write() {
            Ok(()) => {
                self.writes_accepted();
                true
            }
            Err(e @ StoreError::RedisRefusesWrites(_)) => {
                self.refuse_writes(&e);
                false
            }
            Err(e) => {
                redis.reset();
                self.fail(&e);
                false
            }
        }
    }
}

/// Errors of the disk or of sled, as opposed to one unreadable entry or an unencodable one.
fn is_storage_failure(e: &StoreError) -> bool {
    !matches!(
        e,
        StoreError::Corrupt { .. } | StoreError::Encode(_) | StoreError::TooLarge { .. }
    )
}

fn refused() -> StoreError {
    StoreError::Unavailable
}

impl Store for ResilientStore {
    /// A shared (Redis) store's claims, through the degraded-mode guard; none over sled.
    fn coordination(&self) -> Option<&dyn Coordination> {
        self.redis.as_ref().map(|_| self as &dyn Coordination)
    }

    /// Redis's feed as it is, not behind the degraded-mode guard (as before the contract was
    /// split): its users handle its failures themselves.
    fn feed(&self) -> Option<&dyn super::Feed> {
        self.redis.as_ref().map(|r| r.feed() as &dyn super::Feed)
    }

    fn get(&self, id: EntryId) -> Result<Option<Entry>, StoreError> {
        self.with(|| Ok(None), |s| s.get(id))
    }

    fn get_by_key(&self, key: &CacheKey) -> Result<Option<Entry>, StoreError> {
        self.with(|| Ok(None), |s| s.get_by_key(key))
    }

    fn replay_by_key(&self, key: &CacheKey) -> Result<Option<Replay>, StoreError> {
        self.with(|| Ok(None), |s| s.replay_by_key(key))
    }

    fn replay(&self, id: EntryId) -> Result<Option<Replay>, StoreError> {
        self.with(|| Ok(None), |s| s.replay(id))
    }

    fn put(&self, entry: Entry) -> Result<EntryId, StoreError> {
        self.write(|| Err(refused()), |s| s.put(entry))
    }

    fn delete(&self, id: EntryId) -> Result<bool, StoreError> {
        self.with(|| Err(refused()), |s| s.delete(id))
    }

    fn touch(&self, id: EntryId, hits: u64, recent: &[HitEvent]) -> Result<(), StoreError> {
        self.write(|| Err(refused()), |s| s.touch(id, hits, recent))
    }

    fn set_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.write(|| Err(refused()), |s| s.set_vector(id, vector))
    }

    fn replace_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.write(|| Err(refused()), |s| s.replace_vector(id, vector))
    }

    fn list_newest(&self, before: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.with(|| Ok(Vec::new()), |s| s.list_newest(before, limit))
    }

    fn list(&self, after: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        self.with(|| Ok(Vec::new()), |s| s.list(after, limit))
    }

    /// Unlike a lookup, a read of the whole store fails rather than reading as empty: a list
    /// missing the entries it could not read makes an index that lacks them (or empties one),
    /// and a dump saved of it replaces a whole one.
    fn ids(&self) -> Result<Vec<EntryId>, StoreError> {
        self.with(|| Err(refused()), |s| s.ids())
    }

    fn take_dropped(&self) -> Vec<EntryId> {
        match &self.redis {
            Some(redis) => redis.take_dropped(),
            None => self.current().map_or_else(Vec::new, |s| s.take_dropped()),
        }
    }

    /// Fails as [`ResilientStore::ids`] does: entries not read are not entries gone.
    fn cold(&self, ids: &[EntryId]) -> Result<Vec<Entry>, StoreError> {
        self.with(|| Err(refused()), |s| s.cold(ids))
    }

    fn vector_ids(&self) -> Option<(Vec<EntryId>, Vec<EntryId>)> {
        self.with(|| Ok(None), |s| Ok(s.vector_ids()))
            .ok()
            .flatten()
    }

    fn len(&self) -> usize {
        match &self.redis {
            Some(redis) => redis.len(),
            None => self.current().map_or(0, |s| s.len()),
        }
    }

    fn bytes(&self) -> u64 {
        match &self.redis {
            Some(redis) => redis.bytes(),
            None => self.current().map_or(0, |s| s.bytes()),
        }
    }
}

impl Upkeep for ResilientStore {
    fn sweep(
        &self,
        now_ms: u64,
        max_entries: usize,
        max_bytes: u64,
    ) -> Result<(usize, usize), StoreError> {
        self.with(
            || Err(refused()),
            |s| s.sweep(now_ms, max_entries, max_bytes),
        )
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.with(|| Err(refused()), |s| s.flush())
    }

    fn close(&self) -> Result<(), StoreError> {
        self.with(|| Err(refused()), |s| s.close())
    }

    fn set_caps(&self, max_entries: usize, max_bytes: u64) -> Result<(), StoreError> {
        *self.caps.lock().unwrap_or_else(|e| e.into_inner()) = Some((max_entries, max_bytes));
        self.with(|| Ok(()), |s| s.set_caps(max_entries, max_bytes))
    }

    fn clear(&self) -> Result<usize, StoreError> {
        self.with(|| Err(refused()), |s| s.clear())
    }

    fn degraded(&self) -> Option<Degraded> {
        ResilientStore::degraded(self)
    }

    fn errors(&self) -> super::StoreErrors {
        super::StoreErrors {
            failed: self.failed.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            timed_out: 0,
        }
    }

    fn recover(&self) -> bool {
        ResilientStore::recover(self)
    }

    fn enforce_disk_budget(&self, max_bytes: u64) -> bool {
        ResilientStore::enforce_disk_budget(self, max_bytes)
    }
}

/// Only a Redis-backed store hands this out ([`Store::coordination`]); each call passes the
/// degraded-mode guard as the entries' calls do.
impl Coordination for ResilientStore {
    /// Degraded, every claim is granted locally: the request goes upstream (fail-open).
    fn claim(&self, key: &CacheKey, ttl_ms: u64) -> Result<Claim, StoreError> {
        self.write(|| Ok(Claim::Local), |s| super::claim(s, key, ttl_ms))
    }

    fn renew(&self, key: &CacheKey, token: &ClaimToken, ttl_ms: u64) -> Result<bool, StoreError> {
        self.write(|| Ok(false), |s| super::renew(s, key, token, ttl_ms))
    }

    fn release(&self, key: &CacheKey, token: &ClaimToken) -> Result<bool, StoreError> {
        self.with(|| Ok(false), |s| super::release(s, key, token))
    }

    /// Degraded, no claim is seen: a waiting request stops waiting and goes upstream.
    fn claimed(&self, key: &CacheKey) -> Result<bool, StoreError> {
        self.with(|| Ok(false), |s| super::claimed(s, key))
    }
}
