//! The embedded store (the default): one sled database in the data directory, its open, recovery
//! and salvage of a damaged directory, and the [`Store`] methods over it. It must never hand out a
//! corrupt or half-written entry, and must never hold its writer lock for more than one small batch
//! of sled writes: every put and delete shares that lock with eviction.
//!
//! On disk (schema version 4, laid out by `reprise-migrations`):
//! - `entries`: entry id as u64 big-endian (so iteration is in id order) -> the entry's encoded
//!   cold half (all but its answer), or the record of a chunked one;
//! - `chunks`: entry id (u64 BE) ++ chunk number (u32 BE) -> up to [`CHUNK`] bytes of an encoded
//!   cold half longer than [`CHUNK`];
//! - `replays`: entry id (u64 BE) -> the entry's encoded [`Replay`] (what an exact hit reads: the
//!   answer pre-serialized, LZ4-compressed since version 4), or the record of a chunked one;
//! - `replay_chunks`: as `chunks`, for replays;
//! - `exact`: 32-byte [`CacheKey`] -> entry id as u64 big-endian;
//! - `meta`: `schema_version` -> u32 big-endian.
//!
//! The encodings are `codec.rs`'s. An exact hit reads the replay alone and decodes no JSON; hit
//! bookkeeping and the backfill rewrite the cold half alone. No value handed to sled is longer than
//! [`CHUNK`]: sled 0.34 writes a page above a quarter of its segment as a file under `blobs/` that
//! it does not reliably delete, and a leaf page holds about 20 values, so small values keep every
//! page inline, where `--max-bytes` governs it. An entry's two halves, their chunks and its index
//! row are written and removed in one sled transaction, which sled recovers atomically after a
//! crash, so no index row can name a missing entry unless the entry was found corrupt and dropped;
//! readers treat such a row as absent and remove it.
//!
//! At open, a data directory whose `blobs/` holds files (written by an older version, or left
//! behind by sled) is rebuilt: every tree is copied into a fresh database beside it, which then
//! replaces the old files (see [`compact`]); an interrupted rebuild is finished or discarded at
//! the next open. While serving, the same rebuild runs when sled's files outgrow
//! [`disk_budget`] (see [`ResilientStore::enforce_disk_budget`]).
//!
//! Beside sled, the in-memory [`Ledger`] (`ledger.rs`) mirrors every entry's id, key, expiry,
//! recency, size and whether it has a vector, built by one scan at open, which reads every entry
//! and answer and cleans up what a crash or damage left. A clean close writes the ledger to a file
//! (`ledger_file.rs`) that the next open reads instead, when nothing has written to sled since.
//!
//! [`CHUNK`]: super::CHUNK
//! [`compact`]: super::compact
//! [`disk_budget`]: super::disk_budget
//! [`ResilientStore::enforce_disk_budget`]: super::ResilientStore::enforce_disk_budget

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use serde::Deserialize;
use sled::transaction::TransactionError;
use sled::Transactional;
use tracing::{debug, error, info, warn};

use super::codec::{
    decode, decode_replay, encode_cold, encode_replay, payload, remove_value, replay_payload,
    resolve, write_value, Resolved, TxResult, FORMAT_JSON,
};
use super::ledger::{self, recency_ms, Ledger, Slot};
use super::ledger_file;
use super::{compact, salvage, MigrationError, Store, StoreError, Upkeep, SCHEMA_VERSION};
use crate::entry::{Entry, EntryId, HitEvent, Replay};
use crate::key::CacheKey;

use reprise_migrations::layout;

/// `meta` key of the number added to sled's id generator (u64 BE, absent = 0): a rebuilt database
/// starts its generator at zero, and entry ids must never be reused.
pub(super) const ID_FLOOR_KEY: &str = "id_floor";

/// `meta` key of the token the last clean close wrote into its ledger file (see `ledger_file.rs`).
const LEDGER_TOKEN_KEY: &str = "ledger_token";

/// Entries removed per locked step of `sweep`, so that puts wait at most one small batch.
const SWEEP_BATCH: usize = 64;

/// The embedded store: one sled database in the data directory.
pub struct SledStore {
    db: sled::Db,
    entries: sled::Tree,
    chunks: sled::Tree,
    replays: sled::Tree,
    replay_chunks: sled::Tree,
    exact: sled::Tree,
    /// Taken by every write, so the ledger always mirrors sled; readers never take it.
    ledger: Mutex<Ledger>,
    /// Ids whose value failed to decode on a read. Readers must not write, so they leave the
    /// deletion to the next sweep; a lock of its own so that they never wait for a writer.
    quarantine: Mutex<HashSet<u64>>,
    /// Copies of the ledger's totals, for lock-free `len`/`bytes`.
    len: AtomicUsize,
    bytes: AtomicU64,
    /// Added to sled's id generator (see [`ID_FLOOR_KEY`]).
    id_floor: u64,
    /// The caps every write holds (see [`Upkeep::set_caps`]); unlimited until set.
    max_entries: AtomicUsize,
    max_bytes: AtomicU64,
    /// Entries removed since [`Store::take_dropped`] last took them.
    dropped: Mutex<Vec<EntryId>>,
    /// The data directory (where [`Upkeep::close`] writes the ledger file).
    dir: PathBuf,
    /// Set by [`Upkeep::close`]: the ledger file stands for the store, so the next write removes it.
    closed: AtomicBool,
    /// Whether the ledger came from the file a clean close wrote (else from a scan).
    ledger_from_file: bool,
}

/// The id floor recorded in `meta`.
pub(super) fn id_floor(meta: &sled::Tree) -> Result<u64, StoreError> {
    Ok(meta
        .get(ID_FLOOR_KEY)?
        .as_deref()
        .and_then(parse_id)
        .unwrap_or(0))
}

/// True for sled's "could not acquire lock" error: sled reports the lock held elsewhere as an
/// `Other` I/O error that carries the `WouldBlock` only in its message.
fn is_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.kind() == std::io::ErrorKind::WouldBlock
        || io.to_string().contains("could not acquire lock"))
}

/// Opens the sled database, waiting briefly for the lock (see [`open_waiting`]).
pub(super) fn open_db(dir: &Path) -> Result<sled::Db, StoreError> {
    Ok(open_waiting(
        sled::Config::new()
            .path(dir)
            .cache_capacity(128 * 1024 * 1024),
    )?)
}

/// Opens a sled database, waiting up to 5 s for its file lock: sled releases a closed database's
/// lock from its background flusher, a moment after the last handle is dropped (a restart in the
/// same process, or a supervisor restarting the gateway at once, would otherwise fail).
pub(crate) fn open_waiting(config: sled::Config) -> Result<sled::Db, sled::Error> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match config.open() {
            Err(e) if is_lock_error(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// [`SledStore::open`], with a panic inside sled (it asserts on some damaged files) reported as a
/// corrupt store instead of unwinding through start-up.
fn open_catching_panics(dir: &Path) -> Result<SledStore, StoreError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| SledStore::open(dir))) {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".to_owned());
            Err(StoreError::CorruptStore {
                path: dir.to_owned(),
                reason: format!("sled panicked reading it: {what}"),
            })
        }
    }
}

/// Moves everything in `dir` except earlier `corrupt-*` folders into a new `corrupt-<unix
/// seconds>` folder inside it (the vector index too: it names entries of the old store).
fn move_aside(dir: &Path) -> Result<PathBuf, StoreError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut aside = dir.join(format!("corrupt-{secs}"));
    let mut n = 1;
    while aside.exists() {
        aside = dir.join(format!("corrupt-{secs}-{n}"));
        n += 1;
    }
    let io = |what: &str, path: &Path, source| StoreError::Io {
        what: format!("{what} {}", path.display()),
        source,
    };
    std::fs::create_dir(&aside).map_err(|e| io("creating", &aside, e))?;
    for item in std::fs::read_dir(dir).map_err(|e| io("listing", dir, e))? {
        let item = item.map_err(|e| io("listing", dir, e))?;
        let name = item.file_name();
        if name.to_string_lossy().starts_with("corrupt-") {
            continue;
        }
        std::fs::rename(item.path(), aside.join(&name))
            .map_err(|e| io("moving", &item.path(), e))?;
    }
    Ok(aside)
}

/// What a store moved aside into `aside` can still give (see [`salvage`]): the store opened on a
/// copy of what sled can read of it, its exact-key index rebuilt from the entries. `None`, and
/// `dir` left without sled files, when nothing can be salvaged.
fn salvage(dir: &Path, aside: &Path) -> Option<SledStore> {
    let copied = match salvage::salvage_into(dir, aside) {
        Ok(copied) => copied,
        Err(e) => {
            warn!(error = %e, dir = %dir.display(), "cannot salvage the corrupt store");
            return None;
        }
    };
    match open_catching_panics(dir).and_then(|store| store.restore_index_rows().map(|()| store)) {
        Ok(store) => {
            info!(
                rows = copied.rows,
                skipped_ranges = copied.skipped_ranges,
                entries = store.len(),
                "salvaged the corrupt store"
            );
            Some(store)
        }
        Err(e) => {
            warn!(error = %e, dir = %dir.display(), "the salvaged copy does not open");
            clear_sled_files(dir);
            None
        }
    }
}

/// Removes sled's files from `dir` (a failed salvage), leaving every other file alone.
pub(super) fn clear_sled_files(dir: &Path) {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    for item in listing.flatten() {
        let name = item.file_name().to_string_lossy().into_owned();
        if matches!(name.as_str(), "conf" | "db" | "blobs") || name.starts_with("snap.") {
            let path = item.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
}

/// Deletes `snap.*.generating` files: sled writes a snapshot under that name and renames it when
/// complete, so one left behind (a crash, a full disk) is always unfinished, yet sled would pick it
/// as the newest snapshot and refuse to open the directory.
fn remove_unfinished_snapshots(dir: &Path) {
    let Ok(listing) = std::fs::read_dir(dir) else {
        return;
    };
    for item in listing.flatten() {
        let name = item.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            // At debug: a degraded store retrying its open would repeat this every few seconds.
            match std::fs::remove_file(item.path()) {
                Ok(()) => {
                    debug!(file = %item.path().display(), "removed an unfinished store snapshot")
                }
                Err(e) => {
                    warn!(file = %item.path().display(), error = %e, "cannot remove an unfinished store snapshot")
                }
            }
        }
    }
}

impl SledStore {
    /// Opens (creating if needed) the data directory, brings its schema up to [`SCHEMA_VERSION`],
    /// and rebuilds the ledger with one scan, dropping unreadable entries and dangling index rows.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_inner(dir).map_err(|e| {
            // sled may have started a snapshot it could not finish (a full disk): it would make
            // the directory unopenable later, so it goes now rather than at the next open.
            remove_unfinished_snapshots(dir);
            e.classify(dir)
        })
    }

    /// Opens the store like [`SledStore::open`], catching sled's panics on damaged files. A corrupt
    /// store is moved aside into `<dir>/corrupt-<unix seconds>/` (kept for inspection) and an empty
    /// one is opened in its place, unless `strict`. Returns the store and where the old files went.
    pub fn open_or_recover(
        dir: &Path,
        strict: bool,
    ) -> Result<(Self, Option<PathBuf>), StoreError> {
        let err = match open_catching_panics(dir) {
            Ok(store) => return Ok((store, None)),
            Err(err) => err,
        };
        if strict || !err.is_corrupt() {
            return Err(err);
        }
        let aside = move_aside(dir)?;
        if let Some(store) = salvage(dir, &aside) {
            error!(
                dir = %dir.display(),
                moved_to = %aside.display(),
                error = %err,
                entries = store.len(),
                "CACHE STORE CORRUPT: moved its files aside for inspection; kept the entries \
                 that read back whole from them"
            );
            return Ok((store, Some(aside)));
        }
        error!(
            dir = %dir.display(),
            moved_to = %aside.display(),
            error = %err,
            "CACHE STORE CORRUPT: moved its files aside for inspection; starting with an empty cache"
        );
        Ok((open_catching_panics(dir)?, Some(aside)))
    }

    /// Bytes sled's files take on disk (its log file and any blob files).
    pub fn size_on_disk(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }

    /// Opens the store in `dir` rebuilt into a fresh file (see [`compact`]), dropping the space
    /// sled's log has not cleaned. The caller must have closed every other handle on `dir`.
    pub fn open_compacted(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(dir, true).map_err(|e| e.classify(dir))
    }

    fn open_inner(dir: &Path) -> Result<Self, StoreError> {
        Self::open_with(dir, false)
    }

    fn open_with(dir: &Path, rebuild: bool) -> Result<Self, StoreError> {
        if dir.exists() && !dir.is_dir() {
            return Err(StoreError::NotADirectory {
                path: dir.to_owned(),
            });
        }
        std::fs::create_dir_all(dir).map_err(|source| match source.kind() {
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                StoreError::Unwritable {
                    path: dir.to_owned(),
                    source,
                }
            }
            std::io::ErrorKind::NotADirectory => StoreError::NotADirectory {
                path: dir.to_owned(),
            },
            _ => StoreError::CreateDir {
                path: dir.to_owned(),
                source,
            },
        })?;
        remove_unfinished_snapshots(dir);
        compact::finish_or_discard(dir)?;
        // Taken before sled opens (and may write): a crash from here on leaves no file to trust.
        let saved = ledger_file::take(dir).map_err(|source| StoreError::Io {
            what: "removing the ledger file".into(),
            source,
        })?;
        let mut db = open_db(dir)?;
        let found = reprise_migrations::migrate(&db)?;
        if found != SCHEMA_VERSION {
            info!(
                from = found,
                to = SCHEMA_VERSION,
                "upgraded data directory schema"
            );
        }
        // A migration or a rebuild rewrites what the file describes: scan.
        let mut saved = saved.filter(|_| found == SCHEMA_VERSION);
        if rebuild || compact::has_blobs(dir) {
            db = compact::rebuild(dir, db)?;
            saved = None;
        }
        let entries = db.open_tree(layout::ENTRIES)?;
        let chunks = db.open_tree(layout::CHUNKS)?;
        let replays = db.open_tree(layout::REPLAYS)?;
        let replay_chunks = db.open_tree(layout::REPLAY_CHUNKS)?;
        let exact = db.open_tree(layout::EXACT)?;
        let meta = db.open_tree(layout::META)?;
        let id_floor = id_floor(&meta)?;
        // The file must be this database's (the token its close wrote), and no entry may have
        // been stored since without it (the newest id). Either way the token goes: it was for
        // this open only.
        let token = meta.remove(LEDGER_TOKEN_KEY)?;
        let saved = match saved {
            Some((file_token, slots)) if token.as_deref() == Some(&file_token[..]) => {
                let newest_stored = entries.last()?.and_then(|(id, _)| parse_id(&id));
                let newest_known = slots.iter().map(|s| s.id).max();
                if newest_stored == newest_known {
                    Some(slots)
                } else {
                    warn!(
                        "entries were stored since the ledger file was written (by a version that \
                         does not know it?); scanning the store"
                    );
                    None
                }
            }
            Some(_) => {
                warn!("the ledger file is not this store's; scanning the store");
                None
            }
            None => None,
        };
        let trees = Trees {
            entries: &entries,
            chunks: &chunks,
            replays: &replays,
            replay_chunks: &replay_chunks,
        };
        let started = std::time::Instant::now();
        let ledger_from_file = saved.is_some();
        let ledger = match saved {
            Some(slots) => Ledger::from_slots(slots),
            None => load_ledger(&trees, &exact)?,
        };
        info!(
            dir = %dir.display(),
            entries = ledger.slots.len(),
            bytes = ledger.bytes,
            ledger = if ledger_from_file { "file" } else { "scan" },
            ledger_ms = started.elapsed().as_millis() as u64,
            "opened cache store"
        );
        Ok(Self {
            db,
            entries,
            chunks,
            replays,
            replay_chunks,
            exact,
            len: AtomicUsize::new(ledger.slots.len()),
            bytes: AtomicU64::new(ledger.bytes),
            id_floor,
            max_entries: AtomicUsize::new(usize::MAX),
            max_bytes: AtomicU64::new(u64::MAX),
            ledger: Mutex::new(ledger),
            quarantine: Mutex::new(HashSet::new()),
            dropped: Mutex::new(Vec::new()),
            dir: dir.to_owned(),
            closed: AtomicBool::new(false),
            ledger_from_file,
        })
    }

    /// Whether opening the store in `dir` will scan it: there is no ledger file, which a clean
    /// close writes (after a crash, or on the first start). At a million entries the scan takes a
    /// minute or more, which work that does not need the store can use.
    pub fn opens_by_scan(dir: &Path) -> bool {
        !dir.join(ledger_file::FILE).exists()
    }

    /// Whether this open read the ledger from the file a clean close wrote instead of scanning.
    pub fn ledger_from_file(&self) -> bool {
        self.ledger_from_file
    }

    /// Writes the exact-key row of every entry that has none (a salvage copies no index rows:
    /// the entries name their keys). A key held by two entries goes to the newer.
    fn restore_index_rows(&self) -> Result<(), StoreError> {
        let mut ledger = self.lock_ledger();
        let mut newest: HashMap<CacheKey, u64> = HashMap::new();
        let mut older = Vec::new();
        for slot in &ledger.slots {
            match newest.insert(slot.key, slot.id) {
                Some(other) if other > slot.id => {
                    newest.insert(slot.key, other);
                    older.push(slot.id);
                }
                Some(other) => older.push(other),
                None => {}
            }
        }
        self.remove_locked(&mut ledger, &older)?;
        for (key, id) in newest {
            self.exact.insert(key.0, &id.to_be_bytes()[..])?;
        }
        Ok(())
    }

    /// The ledger, for a write: every write takes it.
    fn lock_ledger(&self) -> MutexGuard<'_, Ledger> {
        // A panic while holding the lock cannot leave sled half-written (transactions), and the
        // ledger is at worst stale by one write, which sweep tolerates: keep going.
        let ledger = self
            .ledger
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // A write after the close: the file no longer stands for the store. The token goes
        // first, so that a file that cannot be removed is still not this store's.
        if self.closed.swap(false, Ordering::SeqCst) {
            let token_removed = self
                .db
                .open_tree(layout::META)
                .and_then(|meta| meta.remove(LEDGER_TOKEN_KEY));
            if let Err(e) = token_removed {
                error!(error = %e, "removing the ledger token after a late write failed");
            }
            if let Err(e) = ledger_file::remove(&self.dir) {
                error!(error = %e, "removing the ledger file after a late write failed");
            }
        }
        ledger
    }

    fn lock_quarantine(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.quarantine
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Up to `limit` readable entries from a range of the `entries` tree, in the range's order.
    /// Unreadable entries are skipped: a page is shorter only when the range ran out.
    fn decode_page(
        &self,
        rows: impl Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>>,
        limit: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::with_capacity(limit.min(1024));
        if limit == 0 {
            return Ok(out);
        }
        for item in rows {
            let (raw_id, raw) = item?;
            let Some(id) = parse_id(&raw_id) else {
                continue;
            };
            if let Some(entry) = self.read_entry(EntryId(id), raw)? {
                out.push(entry);
                if out.len() == limit {
                    break;
                }
            }
        }
        Ok(out)
    }

    /// Publishes the ledger's totals; called before releasing the ledger lock.
    /// Reads entry `id`, lets `change` edit it, and rewrites it (chunked when long, its old chunks
    /// removed in the same transaction). All under the ledger lock, so the write cannot bring back
    /// an entry deleted meanwhile. False when the entry is gone or `change` left it as it was.
    fn update(
        &self,
        id: EntryId,
        change: impl FnOnce(&mut Entry) -> bool,
    ) -> Result<bool, StoreError> {
        let mut ledger = self.lock_ledger();
        let Some(raw) = self.entries.get(id.0.to_be_bytes())? else {
            return Ok(false);
        };
        // The cold half alone: the answer is neither read nor rewritten.
        let Some((mut entry, old_len)) = self.read_cold(id, raw)? else {
            return Ok(false);
        };
        if !change(&mut entry) {
            return Ok(false);
        }
        let value = encode_cold(&entry)?;
        let replay_len = ledger
            .get(id.0)
            .map_or(0, |slot| slot.size.saturating_sub(old_len as u64));
        let slot = Slot::new(&entry, value.len() + replay_len as usize);
        if ledger.get(id.0).is_some_and(|old| slot.size > old.size) {
            self.make_room(&mut ledger, slot, Some(id.0))?;
        }
        (&self.entries, &self.chunks)
            .transaction(|(entries, chunks)| -> TxResult<()> {
                remove_value(entries, chunks, id.0)?;
                write_value(entries, chunks, id.0, &value)
            })
            .map_err(storage_error)?;
        ledger.insert(slot);
        self.publish(&ledger);
        Ok(true)
    }

    /// Evicts, before `slot` is written (replacing entry `replaces`, if any), what the store must
    /// shed to hold its caps with it; refuses a slot the caps cannot hold even in an empty store.
    /// Evicting first, under the lock the write holds, keeps the ledger within the caps at every
    /// moment: a crash between the two loses the evicted entries, which were going anyway.
    fn make_room(
        &self,
        ledger: &mut Ledger,
        slot: Slot,
        replaces: Option<u64>,
    ) -> Result<(), StoreError> {
        let max_entries = self.max_entries.load(Ordering::Relaxed);
        let max_bytes = self.max_bytes.load(Ordering::Relaxed);
        if slot.size > max_bytes || max_entries == 0 {
            return Err(StoreError::TooLarge {
                size: slot.size,
                max_bytes: if max_entries == 0 { 0 } else { max_bytes },
            });
        }
        let victims =
            ledger.victims_for(max_entries, max_bytes, Some((slot, replaces)), usize::MAX);
        self.remove_locked(ledger, &victims)?;
        Ok(())
    }

    fn publish(&self, ledger: &Ledger) {
        self.len.store(ledger.slots.len(), Ordering::Relaxed);
        self.bytes.store(ledger.bytes, Ordering::Relaxed);
    }

    /// Notes an unreadable entry: it reads as absent, and the next sweep deletes it.
    fn quarantine(&self, id: EntryId, reason: &str) {
        warn!(%id, reason, "unreadable cache entry read as absent; next sweep deletes it");
        self.lock_quarantine().insert(id.0);
    }

    /// The cold half that the `entries` record `raw` stands for (decoded in place, or joined from
    /// its chunks first), with its encoded length. Unreadable entries are quarantined and read as absent.
    fn read_cold(
        &self,
        id: EntryId,
        raw: sled::IVec,
    ) -> Result<Option<(Entry, usize)>, StoreError> {
        self.read_half(&self.entries, &self.chunks, id, raw, decode)
    }

    /// The replay that the `replays` record `raw` stands for. Unreadable ones are quarantined.
    fn read_replay(&self, id: EntryId, raw: sled::IVec) -> Result<Option<Replay>, StoreError> {
        let replay = self.read_half(&self.replays, &self.replay_chunks, id, raw, decode_replay)?;
        Ok(replay.map(|(replay, _)| replay))
    }

    /// One half of an entry from its tree (and chunk tree), decoded by `decode`, with its encoded
    /// length; an unreadable half is quarantined and read as absent.
    fn read_half<T>(
        &self,
        tree: &sled::Tree,
        chunks: &sled::Tree,
        id: EntryId,
        raw: sled::IVec,
        decode: fn(EntryId, &[u8], bool) -> Result<T, StoreError>,
    ) -> Result<Option<(T, usize)>, StoreError> {
        Ok(match resolve(tree, chunks, id.0, raw)? {
            Resolved::Value(value, checked) => match decode(id, &value, checked) {
                Ok(half) => Some((half, value.len())),
                Err(e) => {
                    self.quarantine(id, &e.to_string());
                    None
                }
            },
            Resolved::Gone => None,
            Resolved::Corrupt(reason) => {
                self.quarantine(id, &reason);
                None
            }
        })
    }

    /// The whole entry that the `entries` record `raw` stands for: its cold half and its answer,
    /// read back from its replay. Unreadable entries are quarantined and read as absent.
    fn read_entry(&self, id: EntryId, raw: sled::IVec) -> Result<Option<Entry>, StoreError> {
        let Some((cold, _)) = self.read_cold(id, raw)? else {
            return Ok(None);
        };
        let Some(raw) = self.replays.get(id.0.to_be_bytes())? else {
            // Written and removed together: deleted between the two reads.
            return Ok(None);
        };
        let Some(replay) = self.read_replay(id, raw)? else {
            return Ok(None);
        };
        match cold.with_answer(&replay) {
            Ok(entry) => Ok(Some(entry)),
            Err(reason) => {
                self.quarantine(id, &reason);
                Ok(None)
            }
        }
    }

    /// The id the exact-key index names for `key`, and `tree`'s record of it (`entries` or
    /// `replays`). A dangling or malformed row is removed and reads as absent.
    fn row_for_key(
        &self,
        key: &CacheKey,
        tree: &sled::Tree,
    ) -> Result<Option<(EntryId, sled::IVec)>, StoreError> {
        // Two rounds: a put may replace the entry between reading the row and reading the entry.
        for _ in 0..2 {
            let Some(row) = self.exact.get(key.0)? else {
                return Ok(None);
            };
            let Some(id) = parse_id(&row) else {
                warn!(?key, "malformed exact-key row removed");
                let _ = self
                    .exact
                    .compare_and_swap(key.0, Some(&row), None::<&[u8]>)?;
                return Ok(None);
            };
            let id = EntryId(id);
            let Some(raw) = tree.get(id.0.to_be_bytes())? else {
                // Ids are never reused and entry and row change together, so if the row is
                // unchanged the entry is gone for good (dropped as corrupt): remove the row. If
                // the row changed, a writer got there first: read again.
                if self
                    .exact
                    .compare_and_swap(key.0, Some(&row), None::<&[u8]>)?
                    .is_ok()
                {
                    debug!(?key, %id, "removed exact-key row naming a missing entry");
                    return Ok(None);
                }
                continue;
            };
            return Ok(Some((id, raw)));
        }
        Ok(None)
    }

    /// Removes `ids` (entries and the index rows that still name them) in one transaction, then
    /// from the ledger. Returns how many entries were actually on disk.
    fn remove_locked(&self, ledger: &mut Ledger, ids: &[u64]) -> Result<usize, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        // The ledger knows every stored entry's key, so no payload is read to find index rows.
        let targets: Vec<(u64, Option<CacheKey>)> = ids
            .iter()
            .map(|&id| (id, ledger.get(id).map(|slot| slot.key)))
            .collect();
        let removed = self
            .all_trees()
            .transaction(
                |(entries, chunks, replays, replay_chunks, exact)| -> TxResult<usize> {
                    let mut removed = 0;
                    for (id, key) in &targets {
                        let id_bytes = id.to_be_bytes();
                        remove_value(replays, replay_chunks, *id)?;
                        if remove_value(entries, chunks, *id)? {
                            removed += 1;
                        }
                        if let Some(key) = key {
                            // Only if the row still names this id: a newer entry may own the key.
                            if exact.get(key.0)?.as_deref() == Some(&id_bytes[..]) {
                                exact.remove(&key.0[..])?;
                            }
                        }
                    }
                    Ok(removed)
                },
            )
            .map_err(storage_error)?;
        for &id in ids {
            ledger.remove(id);
        }
        self.publish(ledger);
        super::note_dropped(&self.dropped, ids.iter().map(|&id| EntryId(id)));
        Ok(removed)
    }

    /// Every tree an entry lives in, for one transaction: entries, chunks, replays, replay chunks, exact.
    fn all_trees(
        &self,
    ) -> (
        &sled::Tree,
        &sled::Tree,
        &sled::Tree,
        &sled::Tree,
        &sled::Tree,
    ) {
        (
            &self.entries,
            &self.chunks,
            &self.replays,
            &self.replay_chunks,
            &self.exact,
        )
    }
}

impl Store for SledStore {
    fn get(&self, id: EntryId) -> Result<Option<Entry>, StoreError> {
        let Some(raw) = self.entries.get(id.0.to_be_bytes())? else {
            return Ok(None);
        };
        self.read_entry(id, raw)
    }

    fn get_by_key(&self, key: &CacheKey) -> Result<Option<Entry>, StoreError> {
        let Some((id, raw)) = self.row_for_key(key, &self.entries)? else {
            return Ok(None);
        };
        Ok(self.read_entry(id, raw)?.filter(|entry| entry.key == *key))
    }

    fn replay(&self, id: EntryId) -> Result<Option<Replay>, StoreError> {
        match self.replays.get(id.0.to_be_bytes())? {
            Some(raw) => self.read_replay(id, raw),
            None => Ok(None),
        }
    }

    fn replay_by_key(&self, key: &CacheKey) -> Result<Option<Replay>, StoreError> {
        let Some((id, raw)) = self.row_for_key(key, &self.replays)? else {
            return Ok(None);
        };
        Ok(self
            .read_replay(id, raw)?
            .filter(|replay| replay.key() == *key))
    }

    fn put(&self, mut entry: Entry) -> Result<EntryId, StoreError> {
        loop {
            // sled persists its id generator, so ids are unique across restarts and never reused;
            // +1 keeps 0 free to mean "none" wherever an id is packed into an integer.
            let id = self
                .id_floor
                .saturating_add(self.db.generate_id()?)
                .saturating_add(1);
            entry.id = EntryId(id);
            // Encode before taking the lock: every writer queues behind it.
            let value = encode_cold(&entry)?;
            let replay = encode_replay(&Replay::of(&entry));
            let slot = Slot::new(&entry, value.len() + replay.len());
            let mut ledger = self.lock_ledger();
            if ledger.get(id).is_some() {
                // Only possible if a data directory was written with ids the generator never gave.
                warn!(%entry.id, "generated entry id already in use; drawing another");
                continue;
            }
            // Under the lock only writers change index rows (readers remove rows naming nothing).
            let replaces = self.exact.get(entry.key.0)?.as_deref().and_then(parse_id);
            self.make_room(&mut ledger, slot, replaces)?;
            let id_bytes = id.to_be_bytes();
            let replaced = self
                .all_trees()
                .transaction(
                    |(entries, chunks, replays, replay_chunks, exact)| -> TxResult<Option<u64>> {
                        let old = exact.insert(&entry.key.0[..], &id_bytes[..])?;
                        let old_id = old.as_deref().and_then(parse_id);
                        if let Some(old_id) = old_id {
                            remove_value(entries, chunks, old_id)?;
                            remove_value(replays, replay_chunks, old_id)?;
                        }
                        write_value(entries, chunks, id, &value)?;
                        write_value(replays, replay_chunks, id, &replay)?;
                        Ok(old_id)
                    },
                )
                .map_err(storage_error)?;
            if let Some(old_id) = replaced {
                ledger.remove(old_id);
                super::note_dropped(&self.dropped, [EntryId(old_id)]);
            }
            ledger.insert(slot);
            self.publish(&ledger);
            return Ok(EntryId(id));
        }
    }

    fn delete(&self, id: EntryId) -> Result<bool, StoreError> {
        let mut ledger = self.lock_ledger();
        let removed = self.remove_locked(&mut ledger, &[id.0])?;
        drop(ledger);
        self.lock_quarantine().remove(&id.0);
        Ok(removed > 0)
    }

    fn touch(&self, id: EntryId, hits: u64, recent: &[HitEvent]) -> Result<(), StoreError> {
        ledger::touch(hits, recent, |record| self.update(id, record))
    }

    fn set_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.update(id, |entry| entry.fill_vector(vector))
    }

    fn replace_vector(&self, id: EntryId, vector: &[f32]) -> Result<bool, StoreError> {
        self.update(id, |entry| {
            entry.vector = Some(vector.to_vec());
            true
        })
    }

    fn list(&self, after: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let start = after.map_or(Bound::Unbounded, |id| Bound::Excluded(id.0.to_be_bytes()));
        self.decode_page(self.entries.range((start, Bound::Unbounded)), limit)
    }

    fn list_newest(&self, before: Option<EntryId>, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let end = before.map_or(Bound::Unbounded, |id| Bound::Excluded(id.0.to_be_bytes()));
        self.decode_page(self.entries.range((Bound::Unbounded, end)).rev(), limit)
    }

    fn ids(&self) -> Result<Vec<EntryId>, StoreError> {
        // From the ledger, which mirrors the `entries` tree: iterating the tree's keys would read
        // every cold half from disk.
        let ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let mut ids: Vec<EntryId> = ledger.slots.iter().map(|s| EntryId(s.id)).collect();
        drop(ledger);
        ids.sort_unstable();
        Ok(ids)
    }

    fn vector_ids(&self) -> Option<(Vec<EntryId>, Vec<EntryId>)> {
        let ledger = self.ledger.lock().unwrap_or_else(|p| p.into_inner());
        let (mut with, mut without): (Vec<EntryId>, Vec<EntryId>) = (Vec::new(), Vec::new());
        for slot in &ledger.slots {
            if slot.vector {
                with.push(EntryId(slot.id));
            } else {
                without.push(EntryId(slot.id));
            }
        }
        drop(ledger);
        with.sort_unstable();
        without.sort_unstable();
        Some((with, without))
    }

    fn take_dropped(&self) -> Vec<EntryId> {
        std::mem::take(&mut *crate::lock::lock(&self.dropped))
    }

    fn cold(&self, ids: &[EntryId]) -> Result<Vec<Entry>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for &id in ids {
            let Some(raw) = self.entries.get(id.0.to_be_bytes())? else {
                continue;
            };
            // The cold half alone: no replay read, no answer decoded.
            if let Some((entry, _)) = self.read_cold(id, raw)? {
                out.push(entry);
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

impl Upkeep for SledStore {
    fn sweep(
        &self,
        now_ms: u64,
        max_entries: usize,
        max_bytes: u64,
    ) -> Result<(usize, usize), StoreError> {
        // Each step below takes the lock for one batch at most and releases it before the next.
        let quarantined: Vec<u64> = self.lock_quarantine().drain().collect();
        for batch in quarantined.chunks(SWEEP_BATCH) {
            let mut ledger = self.lock_ledger();
            let removed = self.remove_locked(&mut ledger, batch)?;
            if removed > 0 {
                warn!(removed, "deleted unreadable cache entries");
            }
        }

        let mut expired = 0;
        loop {
            let mut ledger = self.lock_ledger();
            let batch = ledger.expired(now_ms, SWEEP_BATCH);
            if batch.is_empty() {
                break;
            }
            expired += self.remove_locked(&mut ledger, &batch)?;
        }

        let mut evicted = 0;
        loop {
            let mut ledger = self.lock_ledger();
            let batch = ledger.eviction_victims(max_entries, max_bytes, SWEEP_BATCH);
            if batch.is_empty() {
                break;
            }
            evicted += self.remove_locked(&mut ledger, &batch)?;
        }
        if expired + evicted > 0 {
            debug!(
                expired,
                evicted,
                len = self.len(),
                bytes = self.bytes(),
                "swept cache store"
            );
        }
        Ok((expired, evicted))
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }

    fn close(&self) -> Result<(), StoreError> {
        // Under the ledger lock: no write lands between the flush and the file.
        let ledger = self.lock_ledger();
        let token = ledger_file::new_token(ledger.slots.len());
        self.db
            .open_tree(layout::META)?
            .insert(LEDGER_TOKEN_KEY, &token[..])?;
        self.db.flush()?;
        let written = ledger_file::write(&self.dir, &token, &ledger.slots);
        match written {
            Ok(()) => {
                self.closed.store(true, Ordering::SeqCst);
                debug!(entries = ledger.slots.len(), "wrote the ledger file");
                Ok(())
            }
            Err(source) => {
                // No file, or a partial one the next open ignores: it scans, as after a crash.
                let _ = ledger_file::remove(&self.dir);
                Err(StoreError::Io {
                    what: "writing the ledger file".into(),
                    source,
                })
            }
        }
    }

    fn set_caps(&self, max_entries: usize, max_bytes: u64) -> Result<(), StoreError> {
        self.max_entries.store(max_entries, Ordering::Relaxed);
        self.max_bytes.store(max_bytes, Ordering::Relaxed);
        // Down to the caps now, in batches as `sweep` does, so no put has more than its own to shed.
        loop {
            let mut ledger = self.lock_ledger();
            let batch = ledger.eviction_victims(max_entries, max_bytes, SWEEP_BATCH);
            if batch.is_empty() {
                return Ok(());
            }
            self.remove_locked(&mut ledger, &batch)?;
        }
    }

    fn clear(&self) -> Result<usize, StoreError> {
        let mut ledger = self.lock_ledger();
        let count = ledger.slots.len();
        // Entries first: a crash in between leaves index rows naming nothing, which reads treat as
        // absent and remove; the other order would leave entries no key can reach.
        self.entries.clear()?;
        self.chunks.clear()?;
        self.replays.clear()?;
        self.replay_chunks.clear()?;
        self.exact.clear()?;
        *ledger = Ledger::new();
        self.publish(&ledger);
        drop(ledger);
        self.lock_quarantine().clear();
        Ok(count)
    }
}

impl Drop for SledStore {
    fn drop(&mut self) {
        // sled flushes when its last handle goes, but says nothing if that fails: say it here.
        if let Err(e) = self.db.flush() {
            error!(error = %e, "cache store: final flush failed; recent entries may be lost");
        }
    }
}

fn storage_error(e: TransactionError<Infallible>) -> StoreError {
    match e {
        TransactionError::Storage(e) => StoreError::Sled(e),
        TransactionError::Abort(never) => match never {},
    }
}

pub(super) fn parse_id(raw: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(raw.try_into().ok()?))
}

/// The fields the ledger needs, parsed without building the events and body.
#[derive(Deserialize)]
struct EntryHead {
    id: EntryId,
    key: CacheKey,
    created_at_ms: u64,
    ttl_ms: u64,
    last_hit_ms: u64,
    /// Present (and not null) when the entry has a vector; its value is not decoded.
    #[serde(default)]
    vector: Option<serde::de::IgnoredAny>,
}

/// The trees an entry's two halves live in.
struct Trees<'a> {
    entries: &'a sled::Tree,
    chunks: &'a sled::Tree,
    replays: &'a sled::Tree,
    replay_chunks: &'a sled::Tree,
}

/// The ledger head of the cold half behind `record`, with its length; `Err` when unreadable.
fn read_head(
    trees: &Trees<'_>,
    raw_id: &[u8],
    record: sled::IVec,
) -> Result<Result<Option<(EntryHead, usize)>, String>, StoreError> {
    let Some(id) = parse_id(raw_id) else {
        return Ok(Err(format!(
            "entry key is {} bytes, expected 8",
            raw_id.len()
        )));
    };
    let (raw, checked) = match resolve(trees.entries, trees.chunks, id, record)? {
        Resolved::Value(raw, checked) => (raw, checked),
        Resolved::Gone => return Ok(Ok(None)),
        Resolved::Corrupt(reason) => return Ok(Err(reason)),
    };
    let head = payload(EntryId(id), &raw, FORMAT_JSON, checked)
        .map_err(|e| e.to_string())
        .and_then(|p| serde_json::from_slice::<EntryHead>(p).map_err(|e| e.to_string()));
    Ok(match head {
        Ok(head) if head.id.0 == id => Ok(Some((head, raw.len()))),
        Ok(head) => Err(format!("payload names entry {}", head.id)),
        Err(e) => Err(e),
    })
}

/// Scans the trees once: a ledger of every readable entry; unreadable entries (a cold half that
/// does not decode, or no replay), replays and chunks no entry owns, and index rows that do not
/// name a readable entry of their key are deleted.
fn load_ledger(trees: &Trees<'_>, exact: &sled::Tree) -> Result<Ledger, StoreError> {
    let mut ledger = Ledger::new();
    let mut unreadable = Vec::new();
    for item in trees.entries.iter() {
        let (raw_id, record) = item?;
        let head = match read_head(trees, &raw_id, record)? {
            Ok(Some(head)) => head,
            Ok(None) => continue,
            Err(reason) => {
                warn!(reason, "deleting unreadable cache entry");
                unreadable.push(raw_id);
                continue;
            }
        };
        let (head, cold_len) = head;
        let replay_len = match trees.replays.get(&raw_id)? {
            Some(record) => match resolve(trees.replays, trees.replay_chunks, head.id.0, record)? {
                Resolved::Value(raw, checked) => replay_payload(head.id, &raw, checked)
                    .map(|_| raw.len())
                    .map_err(|e| e.to_string()),
                Resolved::Gone => continue,
                Resolved::Corrupt(reason) => Err(reason),
            },
            None => Err("no replay".to_owned()),
        };
        let replay_len = match replay_len {
            Ok(len) => len as u64,
            Err(reason) => {
                warn!(id = %head.id, reason, "deleting unreadable cache entry");
                unreadable.push(raw_id);
                continue;
            }
        };
        ledger.insert(Slot {
            id: head.id.0,
            key: head.key,
            expires_at_ms: head.created_at_ms.saturating_add(head.ttl_ms),
            recency_ms: recency_ms(head.created_at_ms, head.last_hit_ms),
            size: cold_len as u64 + replay_len,
            vector: head.vector.is_some(),
        });
    }
    for raw_id in unreadable {
        trees.entries.remove(raw_id)?;
    }
    // Replays and chunks no readable entry owns (their entry was unreadable, or a crash undid what
    // a failed write left half-done).
    let owned = |key: &[u8]| {
        key.get(..8)
            .and_then(parse_id)
            .is_some_and(|id| ledger.get(id).is_some())
    };
    let mut orphans = 0usize;
    for tree in [trees.replays, trees.chunks, trees.replay_chunks] {
        for key in tree.iter().keys() {
            let key = key?;
            if !owned(&key) {
                tree.remove(key)?;
                orphans += 1;
            }
        }
    }
    if orphans > 0 {
        warn!(
            orphans,
            "deleted replays and chunks that no readable entry owns"
        );
    }
    let mut dangling = 0usize;
    for item in exact.iter() {
        let (raw_key, row) = item?;
        let names_its_entry = parse_id(&row)
            .and_then(|id| ledger.get(id))
            .is_some_and(|slot| slot.key.0[..] == raw_key[..]);
        if !names_its_entry {
            exact.remove(raw_key)?;
            dangling += 1;
        }
    }
    if dangling > 0 {
        warn!(dangling, "deleted exact-key rows naming no readable entry");
    }
    Ok(ledger)
}

/// Test only: the bytes the files under `dir` take on disk, as `du` counts them, while they may be
/// moved or deleted meanwhile (a rebuild): a file or folder that goes while it is counted counts
/// as nothing. Shared by the store's and the writer's disk-bound tests.
#[cfg(test)]
pub(crate) fn disk_usage_racy(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(listing) = std::fs::read_dir(dir) else {
        return 0;
    };
    listing
        .flatten()
        .map(|item| match item.metadata() {
            Ok(meta) if meta.is_dir() => disk_usage_racy(&item.path()),
            Ok(meta) => meta.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

impl StoreError {
    /// Gives an error from opening the store in `dir` a cause a reader can act on.
    pub(super) fn classify(self, dir: &Path) -> Self {
        use std::io::ErrorKind;
        let path = dir.to_owned();
        let sled_error = match &self {
            Self::Sled(e) | Self::Migration(MigrationError::Sled(e)) => e,
            Self::Migration(MigrationError::BadVersion { .. }) => {
                return Self::CorruptStore {
                    path,
                    reason: self.to_string(),
                }
            }
            Self::Io { source, .. } if source.kind() == ErrorKind::StorageFull => {
                return Self::Full {
                    path,
                    source: std::io::Error::new(source.kind(), source.to_string()),
                }
            }
            _ => return self,
        };
        if is_lock_error(sled_error) {
            return Self::Locked { path };
        }
        match sled_error {
            sled::Error::Io(e) => match e.kind() {
                ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => Self::Unwritable {
                    path,
                    source: std::io::Error::new(e.kind(), e.to_string()),
                },
                ErrorKind::WouldBlock => Self::Locked { path },
                ErrorKind::StorageFull | ErrorKind::QuotaExceeded => Self::Full {
                    path,
                    source: std::io::Error::new(e.kind(), e.to_string()),
                },
                ErrorKind::NotADirectory => Self::NotADirectory { path },
                ErrorKind::InvalidData | ErrorKind::UnexpectedEof => Self::CorruptStore {
                    path,
                    reason: e.to_string(),
                },
                _ => self,
            },
            sled::Error::Corruption { .. }
            | sled::Error::ReportableBug(_)
            | sled::Error::Unsupported(_) => Self::CorruptStore {
                path,
                reason: sled_error.to_string(),
            },
            sled::Error::CollectionNotFound(_) => self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::codec::{
        chunk_key, decode_replay, encode_replay, pack, tagged, ChunkedRecord, CHUNK, FORMAT_REPLAY,
        FORMAT_REPLAY_LZ4,
    };
    use super::super::{disk_bound, disk_budget, rebuild_allowance, ResilientStore};
    use super::*;
    use crate::entry::{RequestSummary, StoredEvent, HIT_HISTORY};
    use crate::key::PartitionKey;
    use crate::timing::Phases;
    use serde_json::json;

    fn key(n: u64) -> CacheKey {
        CacheKey(*blake3::hash(&n.to_le_bytes()).as_bytes())
    }

    /// `n` exact hits at `at_ms`.
    fn hits(n: usize, at_ms: u64) -> Vec<HitEvent> {
        (0..n)
            .map(|i| HitEvent {
                at_ms,
                kind: crate::entry::HitKind::Hit,
                similarity: None,
                request_id: format!("req_{i}"),
                ttft_ms: Some(0.5),
                ttft_saved_ms: Some(100.0),
            })
            .collect()
    }

    fn entry(n: u64, created_at_ms: u64, ttl_ms: u64) -> Entry {
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
            created_at_ms,
            ttl_ms,
            hit_count: 0,
            last_hit_ms: 0,
            vector: None,
            hit_history: Vec::new(),
            warmed: false,
        }
    }

    fn open(dir: &Path) -> SledStore {
        SledStore::open(dir).expect("open store")
    }

    /// The counters agree with what is on disk, and every index row names an entry of its key.
    fn assert_consistent(store: &SledStore) {
        let mut len = 0;
        let mut bytes = 0;
        let mut chunks = 0;
        let mut replay_chunks = 0;
        for item in store.entries.iter() {
            let (raw_id, raw) = item.expect("iter");
            let id = parse_id(&raw_id).expect("8-byte id");
            chunks += ChunkedRecord::parse(&raw).map_or(0, |r| r.count as usize);
            let Resolved::Value(value, _) =
                resolve(&store.entries, &store.chunks, id, raw).expect("resolve")
            else {
                panic!("entry {id} does not resolve");
            };
            let raw = store
                .replays
                .get(&raw_id)
                .expect("get")
                .expect("its replay");
            replay_chunks += ChunkedRecord::parse(&raw).map_or(0, |r| r.count as usize);
            let Resolved::Value(replay, _) =
                resolve(&store.replays, &store.replay_chunks, id, raw).expect("resolve")
            else {
                panic!("replay {id} does not resolve");
            };
            len += 1;
            bytes += (value.len() + replay.len()) as u64;
        }
        assert_eq!(store.len(), len, "len counter");
        assert_eq!(store.bytes(), bytes, "bytes counter");
        assert_eq!(store.replays.len(), len, "every replay belongs to an entry");
        assert_eq!(
            store.chunks.len(),
            chunks,
            "every chunk belongs to an entry"
        );
        assert_eq!(
            store.replay_chunks.len(),
            replay_chunks,
            "every replay chunk belongs to a replay"
        );
        for item in store
            .entries
            .iter()
            .chain(store.chunks.iter())
            .chain(store.replays.iter())
            .chain(store.replay_chunks.iter())
        {
            let (_, value) = item.expect("iter");
            assert!(value.len() <= CHUNK, "a value sled would write as a blob");
        }
        for item in store.exact.iter() {
            let (raw_key, row) = item.expect("iter");
            let id = parse_id(&row).expect("8-byte row");
            let entry = store
                .get(EntryId(id))
                .expect("get")
                .expect("row names an entry");
            assert_eq!(entry.key.0[..], raw_key[..]);
        }
    }

    /// An entry whose answer is `size` bytes of text: its encoding is longer than a chunk.
    fn big_entry(n: u64, created_at_ms: u64, size: usize) -> Entry {
        let mut e = entry(n, created_at_ms, 1_000_000_000);
        // Letters in no pattern (xorshift), so that a replay stays about as long as its answer
        // when compressed and these entries are as large in the store as they are here.
        let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let text: String = (0..size)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (b'a' + (x % 26) as u8) as char
            })
            .collect();
        e.body = json!({"choices": [{"message": {"content": text}}]});
        e
    }

    /// Bytes the files under `dir` take on disk, as `du` counts them.
    fn disk_usage(dir: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let mut total = 0;
        for item in std::fs::read_dir(dir).expect("read dir").flatten() {
            let meta = item.metadata().expect("metadata");
            total += if meta.is_dir() {
                disk_usage(&item.path())
            } else {
                meta.blocks() * 512
            };
        }
        total
    }

    fn blob_files(dir: &Path) -> usize {
        std::fs::read_dir(dir.join("blobs")).map_or(0, |d| d.count())
    }

    #[test]
    fn large_entries_are_chunked_roundtrip_and_leave_nothing_behind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let small = store.put(entry(1, 1_000, 60_000)).expect("put");
        let big = store.put(big_entry(2, 1_000, 300_000)).expect("put");
        // The answer is in the replay: its chunks, not the cold half's.
        assert!(
            store.replay_chunks.len() > 70,
            "{} chunks",
            store.replay_chunks.len()
        );
        let read = store.get(big).expect("get").expect("present");
        assert_eq!(
            read,
            Entry {
                id: big,
                ..big_entry(2, 1_000, 300_000)
            }
        );
        assert_eq!(
            store.get_by_key(&key(2)).expect("by key").map(|e| e.id),
            Some(big)
        );
        // A touch rewrites the cold half alone; a replacement by a shorter answer removes every chunk.
        let replay_before = store.replays.get(big.0.to_be_bytes()).expect("get");
        store.touch(big, 2, &hits(2, 5_000)).expect("touch");
        assert_eq!(
            store.replays.get(big.0.to_be_bytes()).expect("get"),
            replay_before
        );
        assert_eq!(store.get(big).expect("get").map(|e| e.hit_count), Some(2));
        assert_consistent(&store);
        let replaced = store.put(big_entry(2, 2_000, 10_000)).expect("put");
        assert_eq!(store.get(big).expect("get"), None);
        assert_consistent(&store);
        assert!(store.delete(replaced).expect("delete"));
        assert_eq!(store.chunks.len(), 0, "chunks removed with their entry");
        assert_eq!(
            store.replay_chunks.len(),
            0,
            "chunks removed with their entry"
        );
        assert_eq!(store.get(small).expect("get").map(|e| e.id), Some(small));
        assert_consistent(&store);
        store.flush().expect("flush");
        drop(store);
        assert_eq!(blob_files(dir.path()), 0, "sled wrote a blob file");
        let store = open(dir.path());
        assert_eq!(store.len(), 1);
        assert_consistent(&store);
    }

    #[test]
    fn chunks_that_do_not_match_their_record_read_as_absent() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let damaged = store.put(big_entry(1, 1_000, 20_000)).expect("put");
        let kept = store.put(big_entry(2, 1_000, 20_000)).expect("put");
        let mut piece = store
            .replay_chunks
            .get(chunk_key(damaged.0, 1))
            .expect("get")
            .expect("chunk 1")
            .to_vec();
        piece[10] ^= 0x20;
        store
            .replay_chunks
            .insert(chunk_key(damaged.0, 1), piece)
            .expect("insert");
        // Neither the hot reads nor the whole entry hand it out.
        assert_eq!(store.replay_by_key(&key(1)).expect("replay"), None);
        assert_eq!(store.replay(damaged).expect("replay"), None);
        assert!(store.replay(kept).expect("replay").is_some());
        assert_eq!(store.get(damaged).expect("get"), None);
        assert!(store.get(kept).expect("get").is_some());
        store.sweep(2_000, 100, u64::MAX).expect("sweep");
        assert_eq!(store.len(), 1);
        assert_consistent(&store);

        // A missing chunk, found at open: the entry and its other chunks are deleted.
        store
            .replay_chunks
            .remove(chunk_key(kept.0, 0))
            .expect("remove");
        store.flush().expect("flush");
        drop(store);
        let store = open(dir.path());
        assert_eq!(store.len(), 0);
        assert_consistent(&store);
    }

    /// The issue's churn: many unique long answers under a small `max_bytes`. Before chunking,
    /// sled kept each evicted answer as a file under `blobs/`, and the directory grew without bound.
    #[test]
    fn churn_of_large_answers_keeps_the_data_dir_within_max_bytes() {
        const MAX_BYTES: u64 = 2_000_000;
        let dir = tempfile::tempdir().expect("tempdir");
        // As the gateway runs it: behind the resilient wrapper, which rebuilds past the budget.
        let store = ResilientStore::new(dir.path(), open(dir.path()));
        let mut peak = 0;
        for n in 0..1_500u64 {
            store.put(big_entry(n, 1_000 + n, 60_000)).expect("put");
            store.sweep(2_000, usize::MAX, MAX_BYTES).expect("sweep");
            store.enforce_disk_budget(MAX_BYTES);
            if n % 100 == 99 {
                store.flush().expect("flush");
                peak = peak.max(disk_usage(dir.path()));
            }
        }
        assert!(store.bytes() <= MAX_BYTES);
        store.flush().expect("flush");
        let used = disk_usage(dir.path());
        eprintln!(
            "churn: {} live entries, {} live bytes, data dir {used} bytes (peak {peak}), {} blob files",
            store.len(),
            store.bytes(),
            blob_files(dir.path())
        );
        assert_eq!(blob_files(dir.path()), 0);
        assert!(
            peak.max(used) <= disk_bound(MAX_BYTES),
            "data dir {} bytes > {} for max_bytes {MAX_BYTES}",
            peak.max(used),
            disk_bound(MAX_BYTES)
        );
    }

    /// The rebuild as the writer meets it: the files just past their budget (checked after every
    /// put), the live entries at the cap. Sampled while the copy is written beside the old file,
    /// the copy takes at most [`rebuild_allowance`] beside the old files.
    #[test]
    fn a_rebuild_at_the_budget_keeps_the_data_dir_within_the_stated_bound() {
        const MAX_BYTES: u64 = 2_000_000;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ResilientStore::new(dir.path(), open(dir.path()));
        // Uncapped, every answer stays: sled's file grows until it passes the budget (then the
        // caps evict down to the cap, which writes more).
        let mut n = 0;
        while store.size_on_disk() <= disk_budget(MAX_BYTES) {
            store.put(recorded_entry(n, 1_500)).expect("put");
            n += 1;
        }
        store.set_caps(usize::MAX, MAX_BYTES).expect("caps");
        store.flush().expect("flush");
        assert!(store.bytes() <= MAX_BYTES && store.bytes() > MAX_BYTES / 2);
        let kept: Vec<EntryId> = store.ids().expect("ids");
        let done = std::sync::atomic::AtomicBool::new(false);
        let before = disk_usage(dir.path());
        let peak = std::thread::scope(|scope| {
            let sampler = scope.spawn(|| {
                let mut peak = 0;
                while !done.load(Ordering::Relaxed) {
                    peak = peak.max(disk_usage_racy(dir.path()));
                }
                peak
            });
            assert!(store.enforce_disk_budget(MAX_BYTES), "rebuilt");
            done.store(true, Ordering::Relaxed);
            sampler.join().expect("sampler")
        });
        let after = disk_usage(dir.path());
        eprintln!(
            "rebuild of {} live bytes: data dir {before} -> peak {peak} -> {after} bytes",
            store.bytes()
        );
        assert!(
            peak <= before + rebuild_allowance(MAX_BYTES),
            "the copy took {} bytes beside the old files, more than {}",
            peak - before,
            rebuild_allowance(MAX_BYTES)
        );
        assert!(after <= rebuild_allowance(MAX_BYTES), "{after}");
        assert_eq!(store.ids().expect("ids"), kept, "every live entry kept");
    }

    /// sled does not shrink its file when entries go; past the budget the store is rebuilt into a
    /// fresh file holding only the live entries, which stay readable under their ids.
    #[test]
    fn store_over_its_disk_budget_is_rebuilt_keeping_live_entries() {
        const MAX_BYTES: u64 = 1_000_000;
        let dir = tempfile::tempdir().expect("tempdir");
        let store = ResilientStore::new(dir.path(), open(dir.path()));
        for n in 0..700u64 {
            store.put(big_entry(n, 1_000 + n, 60_000)).expect("put");
        }
        store.sweep(2_000, usize::MAX, MAX_BYTES).expect("sweep");
        store.flush().expect("flush");
        let kept: Vec<Entry> = store.list(None, 1_000).expect("list");
        assert!(!kept.is_empty());
        let before = disk_usage(dir.path());
        assert!(
            before > disk_budget(MAX_BYTES),
            "{before}: churn too small to test"
        );

        assert!(store.enforce_disk_budget(MAX_BYTES), "rebuilt");
        let after = disk_usage(dir.path());
        eprintln!("disk budget rebuild: {before} -> {after} bytes");
        assert!(after < disk_budget(MAX_BYTES), "{after}");
        assert!(!store.enforce_disk_budget(MAX_BYTES), "within budget now");
        assert_eq!(store.list(None, 1_000).expect("list"), kept);
        for e in &kept {
            assert_eq!(
                store.get_by_key(&e.key).expect("by key").map(|f| f.id),
                Some(e.id)
            );
        }
        let newest = kept.iter().map(|e| e.id).max().expect("some");
        assert!(store.put(entry(9_999, 5_000, 60_000)).expect("put") > newest);
        assert_eq!(store.degraded(), None);
    }

    #[test]
    fn unfinished_snapshot_left_by_a_full_disk_is_removed_at_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = open(dir.path());
            store.put(entry(1, 1_000, 60_000)).expect("put");
            store.flush().expect("flush");
        }
        // What sled leaves when it cannot write a snapshot: an empty file that sorts last.
        std::fs::write(dir.path().join("snap.FFFFFFFFFFFFFFF0.generating"), b"").expect("write");
        let store = open(dir.path());
        assert_eq!(store.len(), 1);
        assert!(!dir.path().join("snap.FFFFFFFFFFFFFFF0.generating").exists());
    }

    #[test]
    fn put_then_get_and_get_by_key_roundtrip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let original = entry(1, 1_000, 60_000);
        let id = store.put(original.clone()).expect("put");
        assert_ne!(id.0, 0);
        assert_ne!(id, original.id, "incoming id is ignored");

        let expected = Entry { id, ..original };
        assert_eq!(store.get(id).expect("get"), Some(expected.clone()));
        assert_eq!(store.get_by_key(&key(1)).expect("by key"), Some(expected));
        assert_eq!(store.get_by_key(&key(2)).expect("by key"), None);
        assert_eq!(store.get(EntryId(id.0 + 1000)).expect("get"), None);
        assert_eq!(store.len(), 1);
        assert_consistent(&store);
    }

    #[test]
    fn put_with_same_key_replaces_the_older_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let first = store.put(entry(1, 1_000, 60_000)).expect("put");
        let mut newer = entry(1, 2_000, 60_000);
        newer.body = json!({"newer": true});
        let second = store.put(newer).expect("put");

        assert_ne!(first, second);
        assert_eq!(store.get(first).expect("get"), None, "old entry deleted");
        let by_key = store.get_by_key(&key(1)).expect("by key").expect("present");
        assert_eq!(by_key.id, second);
        assert_eq!(by_key.body, json!({"newer": true}));
        assert_eq!(store.len(), 1);
        assert_consistent(&store);
    }

    #[test]
    fn delete_removes_entry_and_index_row() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let id = store.put(entry(1, 1_000, 60_000)).expect("put");
        let kept = store.put(entry(2, 1_000, 60_000)).expect("put");

        assert!(store.delete(id).expect("delete"));
        assert!(!store.delete(id).expect("delete again"), "already gone");
        assert_eq!(store.get(id).expect("get"), None);
        assert_eq!(store.get_by_key(&key(1)).expect("by key"), None);
        assert!(
            store.exact.get(key(1).0).expect("row").is_none(),
            "index row removed"
        );
        assert_eq!(store.get(kept).expect("get").map(|e| e.id), Some(kept));
        assert_eq!(store.len(), 1);
        assert_consistent(&store);
    }

    #[test]
    fn touch_adds_hits_and_moves_last_hit_forward() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let id = store.put(entry(1, 1_000, 60_000)).expect("put");
        store.touch(id, 2, &hits(2, 5_000)).expect("touch");
        store
            .touch(id, 3, &hits(3, 4_000))
            .expect("touch out of order");

        let touched = store.get(id).expect("get").expect("present");
        assert_eq!(touched.hit_count, 5);
        assert_eq!(
            touched.last_hit_ms, 5_000,
            "an older batch does not move it back"
        );
        // Touching an evicted entry is not an error.
        store
            .touch(EntryId(id.0 + 1000), 1, &hits(1, 6_000))
            .expect("touch missing");
        assert_consistent(&store);
    }

    #[test]
    fn set_vector_fills_a_missing_vector_once_and_never_revives_an_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let id = store.put(entry(1, 1_000, 60_000)).expect("put");
        assert!(store.set_vector(id, &[0.5, 0.5]).expect("set"));
        let got = store.get(id).expect("get").expect("present");
        assert_eq!(got.vector, Some(vec![0.5, 0.5]));
        assert!(
            !store.set_vector(id, &[1.0, 0.0]).expect("again"),
            "a vector already there is kept"
        );
        assert!(store.delete(id).expect("delete"));
        assert!(!store.set_vector(id, &[1.0, 0.0]).expect("gone"));
        assert!(store.get(id).expect("get").is_none());
        assert_consistent(&store);
    }

    #[test]
    fn list_paginates_in_id_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let ids: Vec<EntryId> = (0..25)
            .map(|n| store.put(entry(n, 1_000, 60_000)).expect("put"))
            .collect();

        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = store.list(after, 10).expect("list");
            assert!(page.len() <= 10);
            if page.is_empty() {
                break;
            }
            after = page.last().map(|e| e.id);
            seen.extend(page.into_iter().map(|e| e.id));
        }
        assert_eq!(seen, ids, "every entry once, in id order");
        assert_eq!(store.list(Some(ids[19]), 10).expect("list").len(), 5);
        assert!(store.list(None, 0).expect("list").is_empty());

        let mut newest = Vec::new();
        let mut before = None;
        loop {
            let page = store.list_newest(before, 10).expect("list newest");
            if page.is_empty() {
                break;
            }
            before = page.last().map(|e| e.id);
            newest.extend(page.into_iter().map(|e| e.id));
        }
        let mut reversed = ids.clone();
        reversed.reverse();
        assert_eq!(newest, reversed, "every entry once, newest first");
        assert_eq!(store.ids().expect("ids"), ids);
    }

    #[test]
    fn hit_history_keeps_the_latest_in_time_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let id = store.put(entry(1, 1_000, 60_000)).expect("put");
        store
            .touch(id, HIT_HISTORY as u64, &hits(HIT_HISTORY, 9_000))
            .expect("touch");
        store
            .touch(id, 3, &hits(3, 2_000))
            .expect("touch older batch");
        store.touch(id, 2, &hits(2, 10_000)).expect("touch");
        // A batch may count more hits than it carries events for (the writer keeps the latest).
        store
            .touch(id, 1_000, &hits(1, 9_500))
            .expect("touch a large batch");
        let e = store.get(id).expect("get").expect("present");
        assert_eq!(e.hit_count, HIT_HISTORY as u64 + 5 + 1_000);
        assert_eq!(e.hit_history.len(), HIT_HISTORY);
        assert!(e.hit_history.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert_eq!(e.hit_history.last().map(|h| h.at_ms), Some(10_000));
        assert!(
            e.hit_history.iter().all(|h| h.at_ms >= 9_000),
            "the oldest hits are the ones dropped"
        );
    }

    #[test]
    fn sweep_removes_expired_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        for n in 0..10u64 {
            // Even entries expire at 2_000, odd ones at 100_000.
            let ttl = if n.is_multiple_of(2) { 1_000 } else { 99_000 };
            store.put(entry(n, 1_000, ttl)).expect("put");
        }
        assert_eq!(store.sweep(1_999, 100, u64::MAX).expect("sweep"), (0, 0));
        assert_eq!(store.sweep(2_000, 100, u64::MAX).expect("sweep"), (5, 0));
        assert_eq!(store.len(), 5);
        for n in 0..10 {
            let present = store.get_by_key(&key(n)).expect("by key").is_some();
            assert_eq!(present, !n.is_multiple_of(2), "entry {n}");
        }
        assert_consistent(&store);
    }

    #[test]
    fn sweep_evicts_to_max_entries_keeping_recent_hits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let ids: Vec<EntryId> = (0..30)
            .map(|n| store.put(entry(n, 1_000 + n, 1_000_000)).expect("put"))
            .collect();
        // Five entries scattered through the id range were hit recently.
        let recent = [ids[0], ids[7], ids[13], ids[21], ids[29]];
        for id in recent {
            store.touch(id, 1, &hits(1, 50_000)).expect("touch");
        }

        let (expired, evicted) = store.sweep(10_000, 10, u64::MAX).expect("sweep");
        assert_eq!((expired, evicted), (0, 20));
        assert_eq!(store.len(), 10);
        // A sample of 16 always holds an entry that was not hit, so a hit one is never the oldest.
        for id in recent {
            assert!(store.get(id).expect("get").is_some(), "{id} was evicted");
        }
        assert_consistent(&store);
    }

    #[test]
    fn sweep_evicts_to_max_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        for n in 0..30 {
            store.put(entry(n, 1_000 + n, 1_000_000)).expect("put");
        }
        let cap = store.bytes() / 3;
        let (_, evicted) = store.sweep(10_000, usize::MAX, cap).expect("sweep");
        assert!(evicted >= 20, "evicted {evicted}");
        assert!(store.bytes() <= cap, "{} > {cap}", store.bytes());
        assert!(store.len() < 30);
        assert_consistent(&store);

        // Caps of zero empty the store.
        store.sweep(10_000, 0, u64::MAX).expect("sweep");
        assert_eq!((store.len(), store.bytes()), (0, 0));
        assert_consistent(&store);
    }

    #[test]
    fn corrupt_value_reads_as_absent_and_sweep_deletes_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let garbage = store.put(entry(1, 1_000, 60_000)).expect("put");
        let flipped = store.put(entry(2, 1_000, 60_000)).expect("put");
        let good = store.put(entry(3, 1_000, 60_000)).expect("put");

        // Garbage bytes, and a well-formed value with one payload byte flipped.
        store
            .entries
            .insert(garbage.0.to_be_bytes(), &b"\x00not an entry"[..])
            .expect("insert");
        let mut raw = store
            .entries
            .get(flipped.0.to_be_bytes())
            .expect("get")
            .expect("present")
            .to_vec();
        let last = raw.len() - 2;
        raw[last] ^= 0x01;
        store
            .entries
            .insert(flipped.0.to_be_bytes(), raw)
            .expect("insert");

        assert_eq!(store.get(garbage).expect("get"), None);
        assert_eq!(store.get_by_key(&key(2)).expect("by key"), None);
        let listed: Vec<EntryId> = store
            .list(None, 10)
            .expect("list")
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(listed, vec![good]);

        store.sweep(2_000, 100, u64::MAX).expect("sweep");
        assert_eq!(store.len(), 1);
        assert!(store.exact.get(key(1).0).expect("row").is_none());
        assert!(store.exact.get(key(2).0).expect("row").is_none());
        assert_consistent(&store);
    }

    #[test]
    fn index_row_naming_a_missing_entry_reads_as_absent_and_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        store
            .exact
            .insert(key(9).0, &12_345u64.to_be_bytes()[..])
            .expect("insert");
        assert_eq!(store.get_by_key(&key(9)).expect("by key"), None);
        assert!(store.exact.get(key(9).0).expect("row").is_none());
    }

    #[test]
    fn reopen_keeps_entries_len_and_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ids, bytes) = {
            let store = open(dir.path());
            let ids: Vec<EntryId> = (0..5)
                .map(|n| store.put(entry(n, 1_000, 60_000)).expect("put"))
                .collect();
            store.touch(ids[2], 4, &hits(4, 3_000)).expect("touch");
            store.flush().expect("flush");
            (ids, store.bytes())
        };
        let store = open(dir.path());
        assert_eq!(store.len(), 5);
        assert_eq!(store.bytes(), bytes);
        assert_eq!(
            store.get(ids[2]).expect("get").map(|e| e.hit_count),
            Some(4)
        );
        assert_eq!(
            store.get_by_key(&key(4)).expect("by key").map(|e| e.id),
            Some(ids[4])
        );
        // New ids keep increasing after a restart.
        let next = store.put(entry(9, 1_000, 60_000)).expect("put");
        assert!(ids.iter().all(|id| *id < next));
        assert_consistent(&store);
    }

    /// A store of five entries, the odd ones with a vector, one touched; closed. Its ids, bytes
    /// and the ledger as it was (id, expiry, recency, size, vector), in id order.
    #[allow(clippy::type_complexity)]
    fn closed_store(dir: &Path) -> (Vec<EntryId>, u64, Vec<(u64, u64, u64, u64, bool)>) {
        let store = open(dir);
        let ids: Vec<EntryId> = (0..5)
            .map(|n| {
                let mut e = entry(n, 1_000 + n, 60_000);
                e.vector = (n % 2 == 1).then(|| vec![0.5; 4]);
                store.put(e).expect("put")
            })
            .collect();
        store.touch(ids[2], 4, &hits(4, 3_000)).expect("touch");
        let slots = ledger_rows(&store);
        let bytes = store.bytes();
        store.close().expect("close");
        (ids, bytes, slots)
    }

    fn ledger_rows(store: &SledStore) -> Vec<(u64, u64, u64, u64, bool)> {
        let ledger = store.lock_ledger();
        let mut rows: Vec<_> = ledger
            .slots
            .iter()
            .map(|s| (s.id, s.expires_at_ms, s.recency_ms, s.size, s.vector))
            .collect();
        rows.sort_unstable();
        rows
    }

    #[test]
    fn a_clean_close_reopens_from_the_ledger_file_with_the_same_ledger() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (ids, bytes, before) = closed_store(dir.path());
        assert!(
            !SledStore::opens_by_scan(dir.path()),
            "told before the open"
        );
        let store = open(dir.path());
        assert!(store.ledger_from_file(), "read from the file, no scan");
        assert!(
            SledStore::opens_by_scan(dir.path()),
            "a crash from here scans"
        );
        assert!(
            !dir.path().join(ledger_file::FILE).exists(),
            "taken at open: a crash from here scans"
        );
        assert_eq!(ledger_rows(&store), before);
        assert_eq!((store.len(), store.bytes()), (5, bytes));
        assert_eq!(store.ids().expect("ids"), ids);
        let (with, without) = store.vector_ids().expect("sled knows");
        assert_eq!(with, vec![ids[1], ids[3]]);
        assert_eq!(without, vec![ids[0], ids[2], ids[4]]);
        // The ledger drives what follows: expiry, eviction (LRU: the touched one stays), puts.
        assert_eq!(store.sweep(61_001, 100, u64::MAX).expect("sweep"), (2, 0));
        assert_eq!(store.sweep(0, 2, u64::MAX).expect("sweep"), (0, 1));
        assert!(store.get(ids[2]).expect("get").is_some(), "recently hit");
        store.put(entry(9, 1_000, 60_000)).expect("put");
        assert_consistent(&store);
        drop(store);
        // Dropped without a close (a crash, as far as the file goes): the next open scans.
        let store = open(dir.path());
        assert!(!store.ledger_from_file());
        assert_eq!(store.len(), 3);
        assert_consistent(&store);
    }

    #[test]
    fn a_write_after_the_close_removes_the_ledger_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        store.put(entry(1, 1_000, 60_000)).expect("put");
        store.close().expect("close");
        assert!(dir.path().join(ledger_file::FILE).exists());
        let late = store.put(entry(2, 1_000, 60_000)).expect("a late put");
        assert!(!dir.path().join(ledger_file::FILE).exists());
        let token = store
            .db
            .open_tree(layout::META)
            .expect("meta")
            .get(LEDGER_TOKEN_KEY);
        assert!(token.expect("get").is_none(), "token gone too");
        drop(store);
        let store = open(dir.path());
        assert!(!store.ledger_from_file());
        assert_eq!(store.len(), 2);
        assert!(store.get(late).expect("get").is_some());
        assert_consistent(&store);
    }

    #[test]
    fn a_ledger_file_is_not_trusted_after_another_store_or_a_newer_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        closed_store(dir.path());
        let file = dir.path().join(ledger_file::FILE);
        let stale = std::fs::read(&file).expect("ledger file");
        let token = {
            let db = open_db(dir.path()).expect("sled");
            let meta = db.open_tree(layout::META).expect("meta");
            meta.get(LEDGER_TOKEN_KEY)
                .expect("get")
                .expect("the close wrote it")
        };
        // What a process that knows nothing of the file does (an older Reprise): opens, stores an
        // entry and leaves the token and the file as they were.
        {
            let store = open(dir.path());
            store.put(entry(7, 1_000, 60_000)).expect("put");
            store.flush().expect("flush");
        }
        std::fs::write(&file, &stale).expect("the file as it was");
        {
            let db = open_db(dir.path()).expect("sled");
            let meta = db.open_tree(layout::META).expect("meta");
            meta.insert(LEDGER_TOKEN_KEY, token)
                .expect("the token as it was");
            db.flush().expect("flush");
        }
        let store = open(dir.path());
        assert!(!store.ledger_from_file(), "an entry newer than the file");
        assert_eq!(store.len(), 6);
        assert_consistent(&store);
        store.close().expect("close");
        drop(store);
        // A file from another close of this store (its token was consumed by the open after it).
        std::fs::write(&file, &stale).expect("an old file");
        let store = open(dir.path());
        assert!(!store.ledger_from_file(), "not this store's token");
        assert_eq!(store.len(), 6);
    }

    #[test]
    fn concurrent_writers_keep_index_and_counters_exact() {
        let dir = tempfile::tempdir().expect("tempdir");
        let concrete = std::sync::Arc::new(open(dir.path()));
        // Used as the server will: shared behind the trait object.
        let store: std::sync::Arc<dyn Store> = concrete.clone();
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let store = &store;
                scope.spawn(move || {
                    for i in 0..100u64 {
                        // Threads share keys, so puts keep replacing each other's entries.
                        let id = store.put(entry(i % 20, 1_000 + i, 60_000)).expect("put");
                        match (t + i) % 4 {
                            0 => drop(store.delete(id).expect("delete")),
                            1 => store.touch(id, 1, &hits(1, 9_000 + i)).expect("touch"),
                            _ => drop(store.get_by_key(&key(i % 20)).expect("by key")),
                        }
                    }
                });
            }
            scope.spawn(|| {
                for _ in 0..20 {
                    store.sweep(2_000, 12, u64::MAX).expect("sweep");
                }
            });
        });
        assert!(store.len() <= 20, "one entry per key at most");
        assert_consistent(&concrete);
        for e in store.list(None, 100).expect("list") {
            let by_key = store.get_by_key(&e.key).expect("by key");
            assert_eq!(
                by_key.map(|f| f.id),
                Some(e.id),
                "every entry reachable by its key"
            );
        }
    }

    #[test]
    fn clear_removes_everything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        for n in 0..7 {
            store.put(entry(n, 1_000, 60_000)).expect("put");
        }
        assert_eq!(store.clear().expect("clear"), 7);
        assert_eq!((store.len(), store.bytes()), (0, 0));
        assert!(store.exact.is_empty());
        assert_eq!(store.get_by_key(&key(3)).expect("by key"), None);
    }

    #[test]
    fn newer_schema_version_refuses_to_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = sled::open(dir.path()).expect("sled");
            let meta = db.open_tree(reprise_migrations::META_TREE).expect("meta");
            meta.insert(
                reprise_migrations::VERSION_KEY,
                &(SCHEMA_VERSION + 1).to_be_bytes()[..],
            )
            .expect("stamp");
            db.flush().expect("flush");
        }
        let err = SledStore::open(dir.path())
            .err()
            .expect("a newer data directory must not open");
        assert!(matches!(
            err,
            StoreError::Migration(MigrationError::Newer { .. })
        ));
        assert!(err.to_string().contains("newer Reprise"), "{err}");
    }

    /// An entry as version 1 wrote it, spelled out rather than produced by today's encoder.
    #[test]
    fn opens_a_v1_data_dir() {
        let key = [0xab; 32];
        let key_json: Vec<String> = key.iter().map(u8::to_string).collect();
        let payload = format!(
            r#"{{"id":7,"key":[{k}],"partition":[{k}],
            "summary":{{"route":"chat.completions","model":"sim-1","namespace":"docs","tenant":"shared",
                "prompt":"What is sled?","stream":true}},
            "events":[{{"offset_ms":0.0,"data":{{"choices":[{{"delta":{{"content":"An embedded database."}}}}]}}}}],
            "body":{{"choices":[{{"message":{{"content":"An embedded database."}}}}]}},
            "usage":{{"completion_tokens":4}},
            "phases":{{"ingress_ms":0.2,"upstream_send_ms":1.5,"ttft_ms":80.0,"decode_ms":20.0,
                "downstream_ms":0.1,"total_ms":102.0,"tokens":4,"completion_tokens":4,
                "itl_p50_ms":6.0,"itl_p99_ms":8.0,"tokens_per_s":150.0}},
            "created_at_ms":1000,"ttl_ms":60000,"hit_count":3,"last_hit_ms":2000}}"#,
            k = key_json.join(",")
        );
        let mut value = vec![1u8];
        value.extend_from_slice(blake3::hash(payload.as_bytes()).as_bytes());
        value.extend_from_slice(payload.as_bytes());

        let dir = tempfile::tempdir().expect("tempdir");
        reprise_migrations::fixtures::write_v1_data_dir(dir.path(), &[(7, key, value.clone())])
            .expect("write v1 dir");

        let store = open(dir.path());
        let old = store
            .get_by_key(&CacheKey(key))
            .expect("by key")
            .expect("the v1 entry");
        assert_eq!(old.id, EntryId(7));
        assert_eq!(old.summary.namespace.as_deref(), Some("docs"));
        assert_eq!(old.events.len(), 1);
        assert_eq!(old.hit_count, 3);
        assert_eq!(old.ttft_cost_ms(), Some(81.5));
        assert_eq!(store.len(), 1);
        // The hot read serves it as the answer it stored.
        let replay = store
            .replay_by_key(&CacheKey(key))
            .expect("replay")
            .expect("the v1 entry's replay");
        assert_eq!(replay, Replay::of(&old));
        assert_eq!(replay.ttft_cost_ms(), Some(81.5));
        // The id generator was carried over: a new entry cannot collide with the old one.
        assert!(store.put(entry(42, 3_000, 60_000)).expect("put") > EntryId(7));
        assert_consistent(&store);
    }

    /// An entry encoded whole, as versions 1 and 2 stored it.
    fn encode_v2(e: &Entry) -> Vec<u8> {
        tagged(FORMAT_JSON, &serde_json::to_vec(e).expect("json"))
    }

    /// A row of a v1 or v2 fixture data dir: the entry under `id`, encoded as those versions wrote it.
    fn fixture_row(id: u64, e: Entry) -> (u64, [u8; 32], Vec<u8>) {
        let e = Entry {
            id: EntryId(id),
            ..e
        };
        (id, e.key.0, encode_v2(&e))
    }

    /// A directory as version 2 lays it out (a chunked entry, an id floor from a rebuild) opens
    /// with every entry, and new ids start above the floor.
    #[test]
    fn opens_a_v2_data_dir() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rows = vec![
            fixture_row(1_001, entry(1, 1_000, 60_000)),
            fixture_row(1_002, big_entry(2, 1_000, 30_000)),
        ];
        reprise_migrations::fixtures::write_v2_data_dir(dir.path(), &rows, 1_500)
            .expect("write v2 dir");
        let store = open(dir.path());
        assert_eq!(store.len(), 2);
        assert_eq!(
            store.get_by_key(&key(2)).expect("by key").map(|e| e.body),
            Some(big_entry(2, 1_000, 30_000).body)
        );
        assert!(store.put(entry(3, 2_000, 60_000)).expect("put") > EntryId(1_500));
        assert_consistent(&store);
    }

    /// An answer as a recorded stream leaves it: chunks with their id and `created`, `usage: null`
    /// on each and a usage-only chunk, a vector and a hit history; `words` long.
    fn recorded_entry(n: u64, words: usize) -> Entry {
        let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
            json!({"id": format!("chatcmpl-{n}"), "object": "chat.completion.chunk", "created": 1_700_000_000 + n,
                "model": "sim-1", "system_fingerprint": "fp_x", "usage": null,
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        };
        let mut chunks = vec![chunk(
            json!({"role": "assistant", "content": ""}),
            json!(null),
        )];
        for w in 0..words {
            chunks.push(chunk(json!({"content": format!(" word{w}")}), json!(null)));
        }
        chunks.push(chunk(json!({}), json!("stop")));
        let mut usage_chunk = chunk(json!({}), json!(null));
        usage_chunk["choices"] = json!([]);
        usage_chunk["usage"] =
            json!({"prompt_tokens": 5, "completion_tokens": words, "total_tokens": words + 5});
        chunks.push(usage_chunk);
        let body = crate::api::of(crate::ingress::Route::ChatCompletions).assemble(&chunks);
        let mut e = entry(n, 1_000, 60_000);
        e.usage = body.get("usage").cloned();
        e.body = body;
        e.events = chunks
            .into_iter()
            .enumerate()
            .map(|(i, data)| StoredEvent {
                offset_ms: 2.5 * i as f64,
                data,
            })
            .collect();
        e.vector = Some(vec![0.25; 384]);
        e.hit_count = 40;
        e.last_hit_ms = 9_000;
        e.hit_history = hits(32, 5_000);
        e.phases.upstream_send_ms = Some(1.25);
        e
    }

    /// The format tag of entry `id`'s encoded replay (joined from its chunks when chunked).
    fn replay_tag(store: &SledStore, id: u64) -> u8 {
        let raw = store
            .replays
            .get(id.to_be_bytes())
            .expect("get")
            .expect("a replay");
        match super::resolve(&store.replays, &store.replay_chunks, id, raw).expect("resolve") {
            Resolved::Value(raw, _) => raw[0],
            Resolved::Gone | Resolved::Corrupt(_) => panic!("replay of {id} unreadable"),
        }
    }

    /// Recorded answers written by versions 1, 2 and 3 (short and chunked) read back whole after
    /// the upgrade to version 4, and their replays are what a put writes today, so hits render them
    /// as before (`replay::tests` compares that rendering with the old one). The upgrade leaves
    /// their records uncompressed (tag 3); the same answers stored today are compressed (tag 4)
    /// and read back the same.
    #[test]
    fn recorded_answers_of_v1_v2_and_v3_dirs_read_back_whole_and_replay_as_written_today() {
        let originals = [
            recorded_entry(1, 3),
            recorded_entry(2, 40),
            recorded_entry(3, 600),
        ];
        let rows: Vec<_> = originals
            .iter()
            .enumerate()
            .map(|(i, e)| fixture_row(10 + i as u64, e.clone()))
            .collect();
        for version in [1, 2, 3] {
            let dir = tempfile::tempdir().expect("tempdir");
            match version {
                1 => reprise_migrations::fixtures::write_v1_data_dir(dir.path(), &rows)
                    .expect("write fixture"),
                2 => reprise_migrations::fixtures::write_v2_data_dir(dir.path(), &rows, 0)
                    .expect("write fixture"),
                _ => reprise_migrations::fixtures::write_v3_data_dir(dir.path(), &rows, 0)
                    .expect("write fixture"),
            }
            let store = open(dir.path());
            assert_eq!(store.len(), originals.len(), "v{version}");
            for (i, original) in originals.iter().enumerate() {
                let id = EntryId(10 + i as u64);
                let original = Entry {
                    id,
                    ..original.clone()
                };
                assert_eq!(
                    store.get(id).expect("get").as_ref(),
                    Some(&original),
                    "v{version} entry {i}"
                );
                let replay = store
                    .replay_by_key(&original.key)
                    .expect("replay")
                    .expect("present");
                assert_eq!(replay, Replay::of(&original), "v{version} entry {i}");
            }
            // The hit history and vector stay out of the replay: a touch leaves it as it was.
            let before = store.replays.get(10u64.to_be_bytes()).expect("get");
            store.touch(EntryId(10), 1, &hits(1, 9_500)).expect("touch");
            assert_eq!(store.replays.get(10u64.to_be_bytes()).expect("get"), before);
            for (i, original) in originals.iter().enumerate() {
                let old = EntryId(10 + i as u64);
                assert_eq!(
                    replay_tag(&store, old.0),
                    FORMAT_REPLAY,
                    "v{version} entry {i}"
                );
                // Stored again today, under a key of its own.
                let mut again = original.clone();
                again.key = CacheKey([200 + i as u8; 32]);
                let new = store.put(again.clone()).expect("put");
                let again = Entry { id: new, ..again };
                assert_eq!(store.get(new).expect("get").as_ref(), Some(&again));
                assert_eq!(
                    store.replay_by_key(&again.key).expect("replay"),
                    Some(Replay::of(&again))
                );
                // Even three words' chunks repeat their framing enough for LZ4.
                assert_eq!(
                    replay_tag(&store, new.0),
                    FORMAT_REPLAY_LZ4,
                    "entry {i} today"
                );
            }
            assert_consistent(&store);
            drop(store);
            // And still after a reopen, which reads every replay's header.
            let store = open(dir.path());
            assert_eq!(store.len(), 2 * originals.len(), "v{version}");
            assert_consistent(&store);
        }
    }

    /// A replay is stored compressed when that makes it shorter, whole when it does not (random
    /// bytes leave LZ4 nothing to match), and reads back the same. A compressed one that does not
    /// stand for its stated length reads as corrupt, before anything of that length is allocated,
    /// even when its checksum is intact (a writer's bug, or a hand in Redis).
    #[test]
    fn replays_are_compressed_when_that_saves_bytes_and_a_bad_length_reads_as_corrupt() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let noise: Vec<u8> = (0..2_000).map(|_| rng.random()).collect();
        let raw = pack(noise.clone());
        assert_eq!(
            (raw[0], &raw[1 + blake3::OUT_LEN..]),
            (FORMAT_REPLAY, &noise[..])
        );
        let recorded = Entry {
            id: EntryId(2),
            ..recorded_entry(2, 40)
        };
        let raw = encode_replay(&Replay::of(&recorded));
        assert_eq!(raw[0], FORMAT_REPLAY_LZ4);
        let replay = decode_replay(recorded.id, &raw, false).expect("decodes");
        assert_eq!(replay, Replay::of(&recorded));

        let whole = Replay::of(&recorded).encode().len();
        assert!(raw.len() * 3 < whole, "{} of {whole} bytes", raw.len());
        let packed = &raw[1 + blake3::OUT_LEN..];
        // `[stated length][block]`, checksummed again so only the length or the block is wrong.
        let restated = |len: u32, block: &[u8]| {
            let mut payload = len.to_le_bytes().to_vec();
            payload.extend_from_slice(block);
            tagged(FORMAT_REPLAY_LZ4, &payload)
        };
        let block = &packed[4..];
        let stated = u32::from_le_bytes(packed[..4].try_into().expect("4 bytes"));
        assert_eq!(stated as usize, whole);
        for (why, bad) in [
            ("four gigabytes stated", restated(u32::MAX, block)),
            ("a byte more stated", restated(stated + 1, block)),
            ("a byte less stated", restated(stated - 1, block)),
            (
                "its end cut off",
                restated(stated, &block[..block.len() / 2]),
            ),
            ("no length", tagged(FORMAT_REPLAY_LZ4, &[1, 2])),
        ] {
            let err = decode_replay(recorded.id, &bad, false).expect_err(why);
            assert!(matches!(err, StoreError::Corrupt { .. }), "{why}: {err}");
        }
        // Damage anywhere in the block, checksummed again, never panics: it decodes to some record
        // or reads as corrupt (the decoder checks every bound).
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for _ in 0..500 {
            let mut damaged = block.to_vec();
            for _ in 0..rng.random_range(1..4) {
                let at = rng.random_range(0..damaged.len());
                damaged[at] = rng.random();
            }
            match decode_replay(recorded.id, &restated(stated, &damaged), false) {
                Ok(_) | Err(StoreError::Corrupt { .. }) => {}
                Err(other) => panic!("damage read as {other}"),
            }
        }
        // And the checksum still guards the compressed bytes themselves.
        let mut flipped = raw.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let err = decode_replay(recorded.id, &flipped, false).expect_err("flipped");
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    /// A version-1 directory holding an entry above sled's blob threshold (so `blobs/` holds its
    /// file) opens as version 2: the entry is chunked, the blob file is gone, nothing is lost.
    #[test]
    fn opens_a_v1_data_dir_with_a_blob_and_reclaims_the_blob() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rows = vec![
            fixture_row(3, entry(1, 1_000, 60_000)),
            fixture_row(5, big_entry(2, 1_000, 400_000)),
            fixture_row(6, big_entry(3, 1_000, 9_000)),
        ];
        reprise_migrations::fixtures::write_v1_data_dir(dir.path(), &rows).expect("write v1 dir");
        // The index lives beside the store and must survive the rebuild untouched.
        std::fs::create_dir(dir.path().join("index")).expect("index dir");
        std::fs::write(dir.path().join("index/keep"), b"x").expect("index file");
        assert!(
            blob_files(dir.path()) > 0,
            "the fixture must hold a blob file"
        );

        let store = open(dir.path());
        assert_eq!(blob_files(dir.path()), 0, "blob files reclaimed");
        assert!(!dir.path().join("rebuild.tmp").exists());
        assert!(!dir.path().join("rebuild.ready").exists());
        assert_eq!(
            std::fs::read(dir.path().join("index/keep")).expect("kept"),
            b"x"
        );
        assert_eq!(store.len(), 3);
        for (n, id) in [(1, 3), (2, 5), (3, 6)] {
            let found = store
                .get_by_key(&key(n))
                .expect("by key")
                .expect("entry kept");
            assert_eq!(found.id, EntryId(id));
        }
        assert_eq!(
            store.get(EntryId(5)).expect("get").map(|e| e.body),
            Some(big_entry(2, 1_000, 400_000).body)
        );
        // Ids keep growing past the old ones though the rebuilt database's generator restarted.
        assert!(store.put(entry(9, 2_000, 60_000)).expect("put") > EntryId(6));
        assert_consistent(&store);
        drop(store);
        let store = open(dir.path());
        assert_eq!(store.len(), 4);
        assert_consistent(&store);
    }

    #[test]
    fn interrupted_rebuild_is_finished_or_discarded_at_open() {
        // Discarded: a staging copy without the ready list.
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let store = open(dir.path());
            store.put(entry(1, 1_000, 60_000)).expect("put");
        }
        std::fs::create_dir(dir.path().join("rebuild.tmp")).expect("staging");
        std::fs::write(dir.path().join("rebuild.tmp/db"), b"half a copy").expect("write");
        let store = open(dir.path());
        assert_eq!(store.len(), 1);
        assert!(!dir.path().join("rebuild.tmp").exists());
        drop(store);

        // Finished: a complete copy (another store's files) with its list is moved into place.
        let other = tempfile::tempdir().expect("tempdir");
        {
            let store = open(other.path());
            store.put(entry(7, 1_000, 60_000)).expect("put");
            store.put(entry(8, 1_000, 60_000)).expect("put");
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        let staging = dir.path().join("rebuild.tmp");
        std::fs::rename(other.path(), &staging).expect("stage");
        let names: Vec<String> = std::fs::read_dir(&staging)
            .expect("list")
            .flatten()
            .map(|i| i.file_name().to_string_lossy().into_owned())
            .collect();
        std::fs::write(dir.path().join("rebuild.ready"), names.join("\n")).expect("ready");
        let store = open(dir.path());
        assert_eq!(store.len(), 2);
        assert!(store.get_by_key(&key(7)).expect("by key").is_some());
        assert!(!staging.exists());
        assert!(!dir.path().join("rebuild.ready").exists());
    }

    /// A data dir with 40 entries (some chunked), flushed and closed.
    fn filled_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        for n in 0..40 {
            if n % 4 == 0 {
                store.put(big_entry(n, 1_000, 9_000)).expect("put");
            } else {
                store.put(entry(n, 1_000, 60_000)).expect("put");
            }
        }
        store.flush().expect("flush");
        drop(store);
        std::fs::create_dir(dir.path().join("index")).expect("index dir");
        dir
    }

    fn snapshot_file(dir: &Path) -> Option<PathBuf> {
        std::fs::read_dir(dir)
            .expect("list")
            .flatten()
            .map(|i| i.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("snap."))
            })
            .max()
    }

    /// The ways the issue damaged a data dir, each applied to a fresh copy.
    fn damage(kind: &str, dir: &Path) {
        let db = dir.join("db");
        match kind {
            "truncated db" => {
                let len = std::fs::metadata(&db).expect("db").len();
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&db)
                    .expect("open");
                f.set_len(len / 3).expect("truncate");
            }
            "garbage conf" => {
                std::fs::write(dir.join("conf"), b"\x00\xffgarbage\nsegment_size: banana\n")
                    .expect("write")
            }
            "corrupt snapshot" => {
                // Damage the newest snapshot; a store this small may not have written one yet, so
                // plant one that sorts last (the newest), as a torn write would leave it.
                let snap = snapshot_file(dir).unwrap_or_else(|| dir.join("snap.0FFFFFFFFFFFFFFF"));
                let mut bytes = std::fs::read(&snap).unwrap_or_else(|_| vec![7u8; 200]);
                for b in bytes.iter_mut().take(64) {
                    *b ^= 0x5a;
                }
                std::fs::write(&snap, bytes).expect("write");
            }
            "flipped bytes in db" => {
                let mut bytes = std::fs::read(&db).expect("read");
                let step = bytes.len() / 21;
                for k in 1..=20 {
                    bytes[k * step] ^= 0xff;
                }
                std::fs::write(&db, bytes).expect("write");
            }
            other => panic!("unknown damage {other}"),
        }
    }

    #[test]
    fn corrupt_store_is_moved_aside_and_an_empty_one_opened_unless_strict() {
        for kind in [
            "truncated db",
            "garbage conf",
            "corrupt snapshot",
            "flipped bytes in db",
        ] {
            let dir = filled_dir();
            damage(kind, dir.path());
            let strict = SledStore::open_or_recover(dir.path(), true);
            let detected = match &strict {
                Ok(_) => false,
                Err(e) => {
                    assert!(e.is_corrupt(), "{kind}: strict open failed with {e}");
                    true
                }
            };
            drop(strict);
            let (store, aside) =
                SledStore::open_or_recover(dir.path(), false).expect("opens whatever the damage");
            eprintln!(
                "{kind}: detected {detected}, aside {aside:?}, {} entries kept",
                store.len()
            );
            assert_eq!(aside.is_some(), detected, "{kind}");
            if let Some(aside) = aside {
                // What was salvaged is whole (checked below); nothing else is kept.
                assert!(store.len() <= 40, "{kind}");
                assert!(aside.starts_with(dir.path()));
                assert!(
                    aside.join("db").exists(),
                    "{kind}: old files kept for inspection"
                );
                assert!(
                    aside.join("index").exists(),
                    "{kind}: the old index goes with them"
                );
            }
            // Whatever survived is whole, and the store works.
            assert_consistent(&store);
            store
                .put(entry(99, 2_000, 60_000))
                .expect("put after recovery");
            assert!(store.get_by_key(&key(99)).expect("by key").is_some());
        }
    }

    /// A closed data dir of `n` entries (a third of them chunked) with a snapshot on disk, and
    /// the entries as stored.
    fn dir_with_snapshot(n: u64) -> (tempfile::TempDir, Vec<Entry>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let stored: Vec<Entry> = (0..n)
            .map(|k| {
                let e = if k % 3 == 0 {
                    big_entry(k, 1_000, 9_000)
                } else {
                    entry(k, 1_000, 60_000)
                };
                let id = store.put(e.clone()).expect("put");
                Entry { id, ..e }
            })
            .collect();
        store.flush().expect("flush");
        drop(store);
        // sled writes its snapshot when an open moves past the last one.
        drop(open(dir.path()));
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(snapshot_file(dir.path()).is_some(), "no snapshot written");
        (dir, stored)
    }

    /// Every entry `store` holds is one of `stored`, whole, and reachable by its key.
    fn served_whole(store: &SledStore, stored: &[Entry]) -> usize {
        assert_consistent(store);
        let mut kept = 0;
        for original in stored {
            if let Some(found) = store.get_by_key(&original.key).expect("by key") {
                assert_eq!(&found, original, "entry {} served changed", original.id);
                let replay = store.replay_by_key(&original.key).expect("replay");
                assert_eq!(replay, Some(Replay::of(original)));
                kept += 1;
            }
        }
        assert_eq!(kept, store.len(), "no entry that was never stored");
        kept
    }

    #[test]
    fn a_corrupt_snapshot_keeps_every_entry() {
        let (dir, stored) = dir_with_snapshot(300);
        let snap = snapshot_file(dir.path()).expect("snapshot");
        let mut bytes = std::fs::read(&snap).expect("read");
        let (middle, len) = (bytes.len() / 2, bytes.len());
        for b in &mut bytes[middle..(middle + 64).min(len)] {
            *b ^= 0x5a;
        }
        std::fs::write(&snap, bytes).expect("write");
        assert!(
            SledStore::open(dir.path()).is_err(),
            "sled opened a corrupt snapshot: the test damages nothing"
        );
        let (store, aside) = SledStore::open_or_recover(dir.path(), false).expect("open");
        let aside = aside.expect("the damaged files are kept aside");
        assert!(aside.join("db").exists());
        assert_eq!(served_whole(&store, &stored), stored.len(), "entries lost");
        // And it is a working store that keeps them across a restart.
        store.put(entry(9_999, 2_000, 60_000)).expect("put");
        drop(store);
        let store = open(dir.path());
        assert_eq!(store.len(), stored.len() + 1);
    }

    #[test]
    fn zeroed_log_range_keeps_the_entries_that_read_back_whole() {
        // Where live pages lie in the log varies from run to run (sled's flusher decides): try
        // ranges until one hits a page an open reads. A range on dead space changes nothing.
        for eighths in [4, 3, 5, 2, 6, 1, 7] {
            let (dir, stored) = dir_with_snapshot(300);
            let db = dir.path().join("db");
            let mut bytes = std::fs::read(&db).expect("read");
            let start = bytes.len() * eighths / 8;
            let end = (start + 64 * 1024).min(bytes.len());
            bytes[start..end].fill(0);
            std::fs::write(&db, bytes).expect("write");
            if SledStore::open(dir.path()).is_ok() {
                eprintln!("64 KiB zeroed at {eighths}/8 of the log: no live page there");
                continue;
            }
            let (store, aside) = SledStore::open_or_recover(dir.path(), false).expect("open");
            let kept = served_whole(&store, &stored);
            eprintln!(
                "64 KiB zeroed at {eighths}/8 of the log: {kept} of {} entries kept",
                stored.len()
            );
            // 64 KiB is under 2% of this log: the pages in it hold a few leaves of the trees
            // (about 20 values each), or an index page and the leaves the copy skips with it, so
            // most entries must come back (254 to 295 of 300 over six runs).
            assert!(
                kept >= stored.len() * 2 / 3,
                "only {kept} of {} entries salvaged",
                stored.len()
            );
            assert!(
                aside.is_some_and(|a| a.join("db").exists()),
                "damaged files kept aside"
            );
            return;
        }
        panic!("no zeroed range hit a live page: the test damages nothing");
    }

    #[test]
    fn unusable_paths_fail_naming_the_cause_and_touch_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("a-file");
        std::fs::write(&file, b"user data").expect("write");
        let err = SledStore::open_or_recover(&file, false)
            .err()
            .expect("not a directory");
        assert!(matches!(err, StoreError::NotADirectory { .. }), "{err}");
        assert!(err.to_string().contains("not a directory"), "{err}");
        assert_eq!(std::fs::read(&file).expect("kept"), b"user data");

        let under_file = file.join("data");
        let err = SledStore::open_or_recover(&under_file, false)
            .err()
            .expect("under a file");
        assert!(err.to_string().contains("not a directory"), "{err}");

        let held = open(&dir.path().join("held"));
        let err = SledStore::open_or_recover(&dir.path().join("held"), false)
            .err()
            .expect("locked");
        assert!(matches!(err, StoreError::Locked { .. }), "{err}");
        assert!(err.to_string().contains("locked"), "{err}");
        assert!(held.get_by_key(&key(1)).expect("still usable").is_none());
        let listing: Vec<_> = std::fs::read_dir(dir.path().join("held"))
            .expect("list")
            .flatten()
            .map(|i| i.file_name())
            .collect();
        assert!(
            listing
                .iter()
                .all(|n| !n.to_string_lossy().starts_with("corrupt-")),
            "a locked store is not corrupt: {listing:?}"
        );
    }

    /// Environment variable that turns [`crash_child_writer`] into the child of the crash test.
    const CRASH_DIR_ENV: &str = "REPRISE_STORE_CRASH_DIR";
    /// Entries the child writes and flushes before it signals the parent.
    const DURABLE: u64 = 50;

    /// The child half of `kill_9_leaves_no_dangling_index_row`, run in a separate process.
    #[test]
    #[ignore = "run by kill_9_leaves_no_dangling_index_row in a child process"]
    fn crash_child_writer() {
        let Some(dir) = std::env::var_os(CRASH_DIR_ENV) else {
            return;
        };
        let dir = PathBuf::from(dir);
        let store = open(&dir);
        for n in 0..DURABLE {
            store.put(entry(n, 1_000, 60_000)).expect("put");
        }
        store.flush().expect("flush");
        std::fs::write(dir.join("ready"), b"").expect("signal");
        // Replace, delete and touch until killed, bounded in case the parent is gone.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut n = DURABLE;
        while std::time::Instant::now() < deadline {
            let id = store
                .put(entry(DURABLE + n % 40, 1_000 + n, 60_000))
                .expect("put");
            if n.is_multiple_of(3) {
                store.delete(id).expect("delete");
            } else {
                store.touch(id, 1, &hits(1, 5_000 + n)).expect("touch");
            }
            n += 1;
        }
    }

    #[test]
    fn kill_9_leaves_no_dangling_index_row() {
        let dir = tempfile::tempdir().expect("tempdir");
        let test_name = module_path!()
            .split_once("::")
            .map_or("tests", |(_, rest)| rest)
            .to_owned()
            + "::crash_child_writer";
        let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                test_name.as_str(),
                "--exact",
                "--ignored",
                "--test-threads=1",
            ])
            .env(CRASH_DIR_ENV, dir.path())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn child");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !dir.path().join("ready").exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "child never got ready"
            );
            assert!(
                child.try_wait().expect("poll child").is_none(),
                "child exited early"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // Let it write for a while, past sled's periodic flush, then SIGKILL it mid-write.
        std::thread::sleep(std::time::Duration::from_millis(700));
        child.kill().expect("kill child");
        child.wait().expect("reap child");

        // Check the raw trees before `open` gets a chance to repair anything.
        {
            let db = sled::open(dir.path()).expect("reopen raw");
            let entries = db.open_tree(layout::ENTRIES).expect("entries");
            let replays = db.open_tree(layout::REPLAYS).expect("replays");
            let exact = db.open_tree(layout::EXACT).expect("exact");
            for item in exact.iter() {
                let (raw_key, row) = item.expect("iter");
                let id = parse_id(&row).expect("8-byte row");
                let raw = entries
                    .get(id.to_be_bytes())
                    .expect("get")
                    .expect("index row names a stored entry");
                let entry = decode(EntryId(id), &raw, false).expect("entry decodes");
                assert_eq!(entry.key.0[..], raw_key[..]);
                let raw = replays
                    .get(id.to_be_bytes())
                    .expect("get")
                    .expect("index row names a stored replay");
                let replay = decode_replay(EntryId(id), &raw, false).expect("replay decodes");
                assert_eq!(replay.key().0[..], raw_key[..]);
            }
            for item in entries.iter() {
                let (raw_id, raw) = item.expect("iter");
                let id = parse_id(&raw_id).expect("8-byte id");
                decode(EntryId(id), &raw, false).expect("no half-written entry");
                assert!(
                    replays.contains_key(&raw_id).expect("get"),
                    "no half-written entry"
                );
            }
        }
        let store = open(dir.path());
        for n in 0..DURABLE {
            assert!(
                store.get_by_key(&key(n)).expect("by key").is_some(),
                "flushed entry {n} lost"
            );
        }
        assert_consistent(&store);
    }
}
