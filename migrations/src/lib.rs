//! Schema versions of the data directory (a sled database) and the ordered steps that upgrade an
//! older one to [`CURRENT`]. It knows the on-disk layout only; it must not depend on the server's
//! types, so that a step still describes the data as its version wrote it after those types change.

use std::path::Path;

use sled::Transactional;

pub mod replay;

/// The schema version this build writes and reads.
pub const CURRENT: u32 = 4;

/// Where the version is recorded. These two names never change, whatever later versions do, because
/// every release must be able to read the version of a directory written by any other.
pub const META_TREE: &str = "meta";
pub const VERSION_KEY: &str = "schema_version";

/// Tree names of the layout at [`CURRENT`], for the store. Steps and fixtures spell their names out
/// instead, so that renaming a tree in a later version cannot silently change what an old step did.
pub mod layout {
    /// Entry id (u64 big-endian, so iteration is in id order) -> encoded entry.
    pub const ENTRIES: &str = "entries";
    /// Exact cache key (32 bytes) -> entry id (u64 big-endian).
    pub const EXACT: &str = "exact";
    /// Entry id (u64 BE) ++ chunk number (u32 BE) -> one piece of an encoded entry too long to
    /// keep in `entries` (version 2 on).
    pub const CHUNKS: &str = "chunks";
    /// Entry id (u64 BE) -> encoded replay record: what an exact hit reads (version 3 on).
    pub const REPLAYS: &str = "replays";
    /// Entry id (u64 BE) ++ chunk number (u32 BE) -> one piece of a replay record too long to keep
    /// in `replays` (version 3 on).
    pub const REPLAY_CHUNKS: &str = "replay_chunks";
    pub use super::META_TREE as META;
}

#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("data directory: {0}")]
    Sled(#[from] sled::Error),
    #[error(
        "data directory has schema version {found}, written by a newer Reprise; this build reads \
         versions up to {current}: upgrade Reprise or use another --data-dir"
    )]
    Newer { found: u32, current: u32 },
    #[error("data directory: meta[{VERSION_KEY}] is {len} bytes long, expected 4")]
    BadVersion { len: usize },
    #[error("migration to schema version {version} failed: {reason}")]
    Step { version: u32, reason: String },
}

/// One upgrade step: turns a directory at `version - 1` into one at `version`.
pub type Step = fn(&sled::Db) -> Result<(), MigrationError>;

/// Every step, in version order, from 1 up to [`CURRENT`] (a test checks that there is no gap).
/// A step may be run again after a crash interrupted it, so each must be safe to repeat.
pub static STEPS: &[(u32, Step)] = &[(1, v1), (2, v2), (3, v3), (4, v4)];

/// Brings `db` up to [`CURRENT`] and returns the version it found.
///
/// - A fresh, empty database is laid out by running every step, and reports [`CURRENT`] (there was
///   nothing to upgrade).
/// - A database with data but no recorded version predates versioning: it counts as version 0.
/// - A version above [`CURRENT`] is refused: this build would misread what a newer one wrote.
///
/// The version is stamped (and flushed) after each step, so an interrupted upgrade resumes with the
/// step that did not finish.
pub fn migrate(db: &sled::Db) -> Result<u32, MigrationError> {
    migrate_with(db, STEPS, CURRENT)
}

fn migrate_with(db: &sled::Db, steps: &[(u32, Step)], current: u32) -> Result<u32, MigrationError> {
    let meta = db.open_tree(META_TREE)?;
    let recorded = read_version(&meta)?;
    let fresh = recorded.is_none() && is_empty(db)?;
    let found = recorded.unwrap_or(0);
    if found > current {
        return Err(MigrationError::Newer { found, current });
    }
    for &(version, step) in steps {
        if version <= found || version > current {
            continue;
        }
        step(db)?;
        meta.insert(VERSION_KEY, &version.to_be_bytes()[..])?;
        // Durable before the next step starts: a crash then resumes after this one, not before it.
        db.flush()?;
    }
    Ok(if fresh { current } else { found })
}

/// The recorded version, `None` when there is none.
pub fn read_version(meta: &sled::Tree) -> Result<Option<u32>, MigrationError> {
    let Some(raw) = meta.get(VERSION_KEY)? else {
        return Ok(None);
    };
    let bytes: [u8; 4] = raw
        .as_ref()
        .try_into()
        .map_err(|_| MigrationError::BadVersion { len: raw.len() })?;
    Ok(Some(u32::from_be_bytes(bytes)))
}

/// True when no tree (the default one included) holds a single key.
fn is_empty(db: &sled::Db) -> Result<bool, MigrationError> {
    for name in db.tree_names() {
        if !db.open_tree(name)?.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Version 1, the exact-match cache store: trees `entries` (id u64 BE -> encoded entry), `exact`
/// (32-byte cache key -> id u64 BE) and `meta` (`schema_version` u32 BE). Nothing was persisted
/// before version 1, so there is no data to convert; any unknown tree is left alone.
fn v1(db: &sled::Db) -> Result<(), MigrationError> {
    for name in ["entries", "exact", "meta"] {
        db.open_tree(name)?;
    }
    Ok(())
}

/// Version 2: no value handed to sled is longer than 4096 bytes. sled 0.34 writes any page above
/// a quarter of its 512 KiB segment as a file under `blobs/`, and those files were not reclaimed
/// when the entry went, so disk use grew past `--max-bytes` without bound. A leaf page holds up to
/// about 20 values, so 4 KiB values keep every page well below that threshold.
///
/// An encoded entry longer than 4096 bytes moves to the new tree `chunks`, keyed by id (u64 BE)
/// ++ chunk number (u32 BE), 4096 bytes per chunk; `entries` then holds a 45-byte record
/// `[tag 2][blake3 of the whole encoded entry: 32 bytes][its length: u64 BE][chunk count: u32 BE]`.
/// Shorter entries stay as version 1 wrote them (tag 1). Each entry is rewritten in one
/// transaction, and a chunked record (tag 2) is never rewritten again, so the step can repeat.
fn v2(db: &sled::Db) -> Result<(), MigrationError> {
    const CHUNK: usize = 4096;
    let entries = db.open_tree("entries")?;
    let chunks = db.open_tree("chunks")?;
    for item in entries.iter() {
        let (id, value) = item?;
        if value.len() <= CHUNK {
            continue;
        }
        let record = v2_record(&value, CHUNK);
        (&entries, &chunks)
            .transaction(|(entries, chunks)| {
                for (n, piece) in value.chunks(CHUNK).enumerate() {
                    let mut key = id.to_vec();
                    key.extend_from_slice(&(n as u32).to_be_bytes());
                    chunks.insert(key, piece)?;
                }
                entries.insert(&id, record.as_slice())?;
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| MigrationError::Step {
                version: 2,
                reason: format!("{e:?}"),
            })?;
    }
    Ok(())
}

/// The version-2 `entries` record naming a value split into `chunk`-byte pieces.
fn v2_record(value: &[u8], chunk: usize) -> Vec<u8> {
    let mut record = Vec::with_capacity(45);
    record.push(2);
    record.extend_from_slice(blake3::hash(value).as_bytes());
    record.extend_from_slice(&(value.len() as u64).to_be_bytes());
    record.extend_from_slice(&(value.len().div_ceil(chunk) as u32).to_be_bytes());
    record
}

/// Version 3: what an exact hit reads is kept apart from what it does not, and its bytes are
/// ready for the socket. Each entry's encoded JSON is split in two:
///
/// - `entries` keeps the entry without its `events` and `body` (summary, usage, phases, hit counts
///   and history, vector: what listings, hit bookkeeping and semantic matching read), encoded and
///   chunked as in version 2 (`[tag 1][blake3][json]`, or a tag-2 record naming `chunks`);
/// - the new tree `replays` holds the [`replay::Record`] built from the events and body, encoded as
///   `[tag 3][blake3 of the record: 32 bytes][record]`, or, when longer than 4096 bytes, as a
///   tag-2 record (as in version 2) naming its pieces in the new tree `replay_chunks`.
///
/// An entry whose record is already in `replays` was converted (both halves are written in one
/// transaction), so the step can repeat. An entry that cannot be read is left as it is: the store
/// drops an entry without a replay record as unreadable when it opens.
fn v3(db: &sled::Db) -> Result<(), MigrationError> {
    const CHUNK: usize = 4096;
    let entries = db.open_tree("entries")?;
    let chunks = db.open_tree("chunks")?;
    let replays = db.open_tree("replays")?;
    let replay_chunks = db.open_tree("replay_chunks")?;
    for item in entries.iter() {
        let (id, value) = item?;
        let Ok(id_bytes) = <[u8; 8]>::try_from(id.as_ref()) else {
            continue;
        };
        if replays.contains_key(id_bytes)? {
            continue;
        }
        let old_chunks = v2_chunk_count(&value);
        let Some(encoded) = v2_value(&chunks, id_bytes, &value)? else {
            continue;
        };
        let Some((cold, record)) = v3_split(&encoded) else {
            continue;
        };
        let cold = tagged(1, &cold);
        let hot = tagged(3, &record.encode());
        (&entries, &chunks, &replays, &replay_chunks)
            .transaction(|(entries, chunks, replays, replay_chunks)| {
                for n in 0..old_chunks {
                    chunks.remove(&v3_chunk_key(id_bytes, n)[..])?;
                }
                for (tree, pieces, value) in
                    [(entries, chunks, &cold), (replays, replay_chunks, &hot)]
                {
                    if value.len() <= CHUNK {
                        tree.insert(&id_bytes[..], value.as_slice())?;
                        continue;
                    }
                    for (n, piece) in value.chunks(CHUNK).enumerate() {
                        pieces.insert(&v3_chunk_key(id_bytes, n as u32)[..], piece)?;
                    }
                    tree.insert(&id_bytes[..], v2_record(value, CHUNK))?;
                }
                Ok::<(), sled::transaction::ConflictableTransactionError<()>>(())
            })
            .map_err(|e| MigrationError::Step {
                version: 3,
                reason: format!("{e:?}"),
            })?;
    }
    Ok(())
}

/// Version 4: a replay record may be stored compressed, `[tag 4][blake3 of the rest, 32 bytes][the
/// record's length, u32 LE][the record as an LZ4 block]`, in `replays` (or chunked behind a tag-2
/// record, as in version 3). A record's stream events repeat all but a few bytes, so this cuts
/// what sled writes and Redis holds per entry by about half for short answers, more for long ones.
///
/// The step writes nothing: records of version 3 (tag 3) stay as they are, and the store reads
/// both. The version number exists for the builds that read tag 3 only: they would take a tag-4
/// record for a damaged entry and delete it when they open the store, and the stamp makes them
/// refuse the directory instead ("written by a newer Reprise").
fn v4(db: &sled::Db) -> Result<(), MigrationError> {
    db.open_tree("replays")?;
    Ok(())
}

fn v3_chunk_key(id: [u8; 8], n: u32) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&id);
    key[8..].copy_from_slice(&n.to_be_bytes());
    key
}

/// `[tag][blake3 of payload][payload]`.
fn tagged(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(33 + payload.len());
    out.push(tag);
    out.extend_from_slice(blake3::hash(payload).as_bytes());
    out.extend_from_slice(payload);
    out
}

/// Chunks a version-2 `entries` value names (0 for an inline value).
fn v2_chunk_count(value: &[u8]) -> u32 {
    match value {
        [2, rest @ ..] if rest.len() == 44 => {
            u32::from_be_bytes([rest[40], rest[41], rest[42], rest[43]])
        }
        _ => 0,
    }
}

/// The encoded entry a version-2 `entries` value stands for (joined from its chunks and checked
/// when chunked); `None` when its chunks do not add up.
fn v2_value(
    chunks: &sled::Tree,
    id: [u8; 8],
    value: &[u8],
) -> Result<Option<Vec<u8>>, MigrationError> {
    let count = v2_chunk_count(value);
    if count == 0 {
        return Ok(Some(value.to_vec()));
    }
    let mut joined = Vec::new();
    for n in 0..count {
        let Some(piece) = chunks.get(v3_chunk_key(id, n))? else {
            return Ok(None);
        };
        joined.extend_from_slice(&piece);
    }
    let len = u64::from_be_bytes(value[33..41].try_into().unwrap_or_default());
    let ok = joined.len() as u64 == len && blake3::hash(&joined).as_bytes()[..] == value[1..33];
    Ok(ok.then_some(joined))
}

/// Splits a version-2 encoded entry (`[tag 1][blake3][json]`) into the JSON of its cold part
/// and its replay record; `None` when it is unreadable.
fn v3_split(encoded: &[u8]) -> Option<(Vec<u8>, replay::Record)> {
    use serde_json::Value;
    let (&tag, rest) = encoded.split_first()?;
    let (hash, payload) = rest.split_at_checked(32)?;
    if tag != 1 || blake3::hash(payload).as_bytes()[..] != *hash {
        return None;
    }
    let Value::Object(mut entry) = serde_json::from_slice::<Value>(payload).ok()? else {
        return None;
    };
    let bytes32 = |v: Option<&Value>| -> Option<[u8; 32]> {
        let items = v?.as_array()?;
        let bytes: Vec<u8> = items
            .iter()
            .map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
            .collect::<Option<_>>()?;
        bytes.try_into().ok()
    };
    let events = entry.remove("events").unwrap_or(Value::Array(Vec::new()));
    let body = entry.remove("body").unwrap_or(Value::Null);
    let phases = entry.get("phases");
    let phase = |name: &str| phases.and_then(|p| p.get(name)).and_then(Value::as_f64);
    let mut stream = Vec::new();
    for event in events.as_array()? {
        stream.push((event.get("offset_ms")?.as_f64()?, event.get("data")?));
    }
    let record = replay::build(replay::Parts {
        id: entry.get("id")?.as_u64()?,
        key: bytes32(entry.get("key"))?,
        partition: bytes32(entry.get("partition"))?,
        created_at_ms: entry.get("created_at_ms")?.as_u64()?,
        ttl_ms: entry.get("ttl_ms")?.as_u64()?,
        ttft_cost_ms: phase("ttft_ms").map(|t| phase("upstream_send_ms").unwrap_or(0.0) + t),
        completions: entry.get("summary")?.get("route")?.as_str()? == "completions",
        // Entries older than version 3 predate the Responses API route.
        named_events: false,
        message_ids: false,
        events: stream,
        body: &body,
        usage: entry.get("usage").filter(|u| !u.is_null()),
    });
    let cold = serde_json::to_vec(&Value::Object(entry)).ok()?;
    Some((cold, record))
}

/// Writers of data directories exactly as a past version laid them out, for tests that open them
/// with the current code. Like the steps, they spell out their layout rather than use [`layout`].
pub mod fixtures {
    use super::Path;

    /// Opens `dir`, waiting up to five seconds for its lock: sled releases a dropped database's
    /// file lock from its flusher thread a moment later, so a writer (or a test) opening the
    /// directory right after another closed it would otherwise fail at random.
    pub fn open_when_free(dir: &Path) -> sled::Result<sled::Db> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match sled::open(dir) {
                Err(sled::Error::Io(e))
                    if (e.kind() == std::io::ErrorKind::WouldBlock
                        || e.to_string().contains("could not acquire lock"))
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                other => return other,
            }
        }
    }

    /// Writes a version-1 data directory at `dir` holding `entries` as (id, exact key, raw encoded
    /// value), with each key's index row, and flushes it. Version 1 assigns ids from sled's id
    /// generator, so the generator is advanced past the largest id given: keep fixture ids small.
    pub fn write_v1_data_dir(dir: &Path, entries: &[(u64, [u8; 32], Vec<u8>)]) -> sled::Result<()> {
        let db = open_when_free(dir)?;
        let entry_tree = db.open_tree("entries")?;
        let exact = db.open_tree("exact")?;
        let meta = db.open_tree("meta")?;
        for (id, key, value) in entries {
            entry_tree.insert(id.to_be_bytes(), value.as_slice())?;
            exact.insert(key, &id.to_be_bytes()[..])?;
        }
        meta.insert("schema_version", &1u32.to_be_bytes()[..])?;
        let max_id = entries.iter().map(|(id, _, _)| *id).max().unwrap_or(0);
        // The store assigns `generate_id() + 1`, so the generator must have passed every stored id.
        while db.generate_id()? < max_id {}
        db.flush()?;
        Ok(())
    }

    /// Writes a version-2 data directory at `dir` holding `entries` as (id, exact key, raw encoded
    /// value): values longer than 4096 bytes split into `chunks` behind a tag-2 record, and
    /// `meta["id_floor"]` set to `id_floor` (a rebuilt directory's generator restarts at zero).
    pub fn write_v2_data_dir(
        dir: &Path,
        entries: &[(u64, [u8; 32], Vec<u8>)],
        id_floor: u64,
    ) -> sled::Result<()> {
        const CHUNK: usize = 4096;
        let db = open_when_free(dir)?;
        let entry_tree = db.open_tree("entries")?;
        let chunks = db.open_tree("chunks")?;
        let exact = db.open_tree("exact")?;
        let meta = db.open_tree("meta")?;
        for (id, key, value) in entries {
            if value.len() <= CHUNK {
                entry_tree.insert(id.to_be_bytes(), value.as_slice())?;
            } else {
                for (n, piece) in value.chunks(CHUNK).enumerate() {
                    let mut chunk_key = id.to_be_bytes().to_vec();
                    chunk_key.extend_from_slice(&(n as u32).to_be_bytes());
                    chunks.insert(chunk_key, piece)?;
                }
                entry_tree.insert(id.to_be_bytes(), super::v2_record(value, CHUNK))?;
            }
            exact.insert(key, &id.to_be_bytes()[..])?;
        }
        meta.insert("schema_version", &2u32.to_be_bytes()[..])?;
        meta.insert("id_floor", &id_floor.to_be_bytes()[..])?;
        db.flush()?;
        Ok(())
    }

    /// Writes a version-3 data directory at `dir`: the version-2 directory of
    /// [`write_v2_data_dir`], upgraded by version 3's own step (every entry split into its cold half
    /// and an uncompressed, tag-3 replay record), as a directory of version 3 holds them.
    pub fn write_v3_data_dir(
        dir: &Path,
        entries: &[(u64, [u8; 32], Vec<u8>)],
        id_floor: u64,
    ) -> Result<(), super::MigrationError> {
        write_v2_data_dir(dir, entries, id_floor)?;
        let db = open_when_free(dir)?;
        super::v3(&db)?;
        db.open_tree("meta")?
            .insert("schema_version", &3u32.to_be_bytes()[..])?;
        db.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> sled::Db {
        fixtures::open_when_free(dir).expect("open sled")
    }

    fn version(db: &sled::Db) -> Option<u32> {
        let meta = db.open_tree(META_TREE).expect("meta tree");
        read_version(&meta).expect("read version")
    }

    #[test]
    fn steps_run_from_1_to_current_without_gaps() {
        let versions: Vec<u32> = STEPS.iter().map(|(v, _)| *v).collect();
        assert_eq!(versions, (1..=CURRENT).collect::<Vec<_>>());
    }

    #[test]
    fn fresh_db_is_laid_out_and_stamped_current() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(dir.path());
        assert_eq!(migrate(&db).expect("migrate"), CURRENT);
        assert_eq!(version(&db), Some(CURRENT));
        let names: Vec<Vec<u8>> = db.tree_names().iter().map(|n| n.to_vec()).collect();
        for tree in [
            layout::ENTRIES,
            layout::EXACT,
            layout::CHUNKS,
            layout::REPLAYS,
            layout::REPLAY_CHUNKS,
            layout::META,
        ] {
            assert!(
                names.contains(&tree.as_bytes().to_vec()),
                "missing tree {tree}"
            );
        }
        // A second start finds the current version and does nothing.
        assert_eq!(migrate(&db).expect("migrate again"), CURRENT);
    }

    #[test]
    fn unversioned_db_with_data_counts_as_version_0() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(dir.path());
        db.insert("left-by-an-old-build", "x").expect("insert");
        assert_eq!(migrate(&db).expect("migrate"), 0);
        assert_eq!(version(&db), Some(CURRENT));
        // Unknown data is left alone.
        assert!(db.get("left-by-an-old-build").expect("get").is_some());
    }

    #[test]
    fn newer_version_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(dir.path());
        let meta = db.open_tree(META_TREE).expect("meta");
        meta.insert(VERSION_KEY, &(CURRENT + 1).to_be_bytes()[..])
            .expect("stamp");
        let err = migrate(&db).expect_err("must refuse");
        let MigrationError::Newer { found, current } = err else {
            panic!("unexpected error {err}");
        };
        assert_eq!((found, current), (CURRENT + 1, CURRENT));
        assert!(err.to_string().contains("newer Reprise"), "{err}");
        // Refusing must not touch the stamp.
        assert_eq!(version(&db), Some(CURRENT + 1));
    }

    #[test]
    fn malformed_version_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(dir.path());
        let meta = db.open_tree(META_TREE).expect("meta");
        meta.insert(VERSION_KEY, "one").expect("stamp");
        assert!(matches!(
            migrate(&db),
            Err(MigrationError::BadVersion { len: 3 })
        ));
    }

    fn mark(db: &sled::Db, name: &str) -> Result<(), MigrationError> {
        db.insert(name, "done")?;
        Ok(())
    }
    fn step1(db: &sled::Db) -> Result<(), MigrationError> {
        mark(db, "step1")
    }
    fn step2(db: &sled::Db) -> Result<(), MigrationError> {
        // Fails until the test plants `allow2`: stands for a crash in the middle of the upgrade.
        if db.get("allow2")?.is_none() {
            return Err(MigrationError::Step {
                version: 2,
                reason: "interrupted".into(),
            });
        }
        mark(db, "step2")
    }
    fn step3(db: &sled::Db) -> Result<(), MigrationError> {
        assert!(db.get("step2")?.is_some(), "step 3 ran before step 2");
        mark(db, "step3")
    }

    #[test]
    fn interrupted_migration_resumes_at_the_failed_step() {
        let steps: &[(u32, Step)] = &[(1, step1), (2, step2), (3, step3)];
        let dir = tempfile::tempdir().expect("tempdir");
        let db = open(dir.path());
        db.insert("old-data", "x").expect("insert");

        let err = migrate_with(&db, steps, 3).expect_err("step 2 fails");
        assert!(matches!(err, MigrationError::Step { version: 2, .. }));
        assert_eq!(version(&db), Some(1), "step 1 stamped, step 2 not");

        // Step 1 must not run again: remove its mark and check it stays removed.
        db.remove("step1").expect("remove");
        db.insert("allow2", "y").expect("insert");
        assert_eq!(migrate_with(&db, steps, 3).expect("resume"), 1);
        assert_eq!(version(&db), Some(3));
        assert!(db.get("step1").expect("get").is_none());
        assert!(db.get("step3").expect("get").is_some());
    }

    #[test]
    fn v2_splits_long_values_into_chunks_and_can_repeat() {
        let dir = tempfile::tempdir().expect("tempdir");
        let long: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        fixtures::write_v1_data_dir(
            dir.path(),
            &[(3, [7; 32], b"short".to_vec()), (4, [8; 32], long.clone())],
        )
        .expect("write fixture");
        let db = open(dir.path());
        // Only the steps up to 2: the values are not entries, which step 3 would read.
        assert_eq!(migrate_with(&db, &STEPS[..2], 2).expect("migrate"), 1);
        assert_eq!(version(&db), Some(2));
        // Running the step again (a crash before the stamp) changes nothing.
        v2(&db).expect("repeat");
        let entries = db.open_tree("entries").expect("entries");
        let chunks = db.open_tree("chunks").expect("chunks");
        assert_eq!(
            entries.get(3u64.to_be_bytes()).expect("get").as_deref(),
            Some(&b"short"[..])
        );
        let record = entries
            .get(4u64.to_be_bytes())
            .expect("get")
            .expect("record");
        assert_eq!(record.as_ref(), v2_record(&long, 4096).as_slice());
        let joined: Vec<u8> = chunks
            .scan_prefix(4u64.to_be_bytes())
            .values()
            .flat_map(|v| v.expect("chunk").to_vec())
            .collect();
        assert_eq!(joined, long);
        assert_eq!(chunks.len(), 3);
    }

    /// A version-2 entry as the server wrote it (JSON spelled out), chunked when `pad` makes it long.
    fn v2_entry(id: u64, key: u8, pad: usize) -> Vec<u8> {
        let k: Vec<String> = std::iter::repeat_n(key.to_string(), 32).collect();
        let payload = format!(
            r#"{{"id":{id},"key":[{k}],"partition":[{k}],
            "summary":{{"route":"chat.completions","model":"m","namespace":null,"tenant":"shared","prompt":"p","stream":true}},
            "events":[{{"offset_ms":0.0,"data":{{"id":"c","created":5,"choices":[{{"index":0,"delta":{{"content":"{pad}"}}}}]}}}},
                {{"offset_ms":3.5,"data":{{"id":"c","created":5,"choices":[],"usage":{{"total_tokens":1}}}}}}],
            "body":{{"id":"c","created":5,"choices":[{{"index":0,"message":{{"content":"{pad}"}}}}]}},
            "usage":{{"total_tokens":1}},
            "phases":{{"upstream_send_ms":1.5,"ttft_ms":80.0,"total_ms":90.0,"tokens":1}},
            "created_at_ms":1000,"ttl_ms":60000,"hit_count":3,"last_hit_ms":2000,
            "hit_history":[{{"at_ms":2000,"kind":"hit","similarity":null,"request_id":"r","ttft_ms":1.0,"ttft_saved_ms":80.0}}]}}"#,
            k = k.join(","),
            pad = "x".repeat(pad),
        );
        tagged(1, payload.as_bytes())
    }

    #[test]
    fn v3_splits_each_entry_into_its_cold_part_and_a_replay_record_and_can_repeat() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rows = vec![
            (3, [3; 32], v2_entry(3, 3, 10)),
            (4, [4; 32], v2_entry(4, 4, 9_000)),
            (5, [5; 32], b"unreadable".to_vec()),
        ];
        fixtures::write_v2_data_dir(dir.path(), &rows, 0).expect("write fixture");
        let db = open(dir.path());
        assert_eq!(migrate(&db).expect("migrate"), 2);
        assert_eq!(version(&db), Some(CURRENT));
        let snapshot = |db: &sled::Db| -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
            ["entries", "chunks", "replays", "replay_chunks"]
                .iter()
                .map(|t| {
                    db.open_tree(t)
                        .expect("tree")
                        .iter()
                        .map(|kv| kv.map(|(k, v)| (k.to_vec(), v.to_vec())).expect("row"))
                        .collect()
                })
                .collect()
        };
        let after = snapshot(&db);
        // Running the step again (a crash before the stamp) changes nothing.
        v3(&db).expect("repeat");
        assert_eq!(snapshot(&db), after);
        let entries = db.open_tree("entries").expect("entries");
        let replays = db.open_tree("replays").expect("replays");
        // The unreadable value is left for the store to drop; the others have both halves.
        assert_eq!(entries.len(), 3);
        assert_eq!(replays.len(), 2);
        assert!(replays.get(5u64.to_be_bytes()).expect("get").is_none());
        let cold = entries.get(3u64.to_be_bytes()).expect("get").expect("cold");
        let cold: serde_json::Value = serde_json::from_slice(&cold[33..]).expect("cold json");
        assert!(cold.get("events").is_none() && cold.get("body").is_none());
        assert_eq!(cold["hit_history"][0]["request_id"], "r");
        let hot = replays.get(3u64.to_be_bytes()).expect("get").expect("hot");
        assert_eq!(
            (hot[0], &hot[1..33]),
            (3, &blake3::hash(&hot[33..]).as_bytes()[..])
        );
        let record = replay::Record::decode(&hot[33..]).expect("record");
        assert_eq!(
            (record.id, record.key, record.ttft_cost_ms),
            (3, [3; 32], Some(81.5))
        );
        let (events, body) = record.original().expect("original");
        assert_eq!(events[1].0, 3.5);
        assert_eq!(events[1].1["usage"]["total_tokens"], 1);
        assert_eq!(body["choices"][0]["message"]["content"], "x".repeat(10));
        // The long entry: both halves over 4096 bytes are chunked, its old chunks are gone.
        let chunked = replays.get(4u64.to_be_bytes()).expect("get").expect("hot");
        assert_eq!(chunked[0], 2);
        let replay_chunks = db.open_tree("replay_chunks").expect("tree");
        assert_eq!(
            replay_chunks.len(),
            v2_chunk_count(&chunked) as usize,
            "only the long record is chunked"
        );
        let chunks = db.open_tree("chunks").expect("tree");
        assert!(chunks.is_empty(), "the cold halves fit in one value");
    }

    #[test]
    fn v1_fixture_is_a_v1_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        fixtures::write_v1_data_dir(dir.path(), &[(3, [7; 32], b"value".to_vec())])
            .expect("write fixture");
        let db = open(dir.path());
        assert_eq!(version(&db), Some(1));
        let entries = db.open_tree("entries").expect("entries");
        let exact = db.open_tree("exact").expect("exact");
        assert_eq!(
            entries.get(3u64.to_be_bytes()).expect("get").as_deref(),
            Some(&b"value"[..])
        );
        assert_eq!(
            exact.get([7; 32]).expect("get").as_deref(),
            Some(&3u64.to_be_bytes()[..])
        );
        assert!(db.generate_id().expect("id") >= 3);
        assert_eq!(migrate(&db).expect("migrate"), 1);
        assert_eq!(version(&db), Some(CURRENT));
    }
}
