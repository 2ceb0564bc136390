//! Schema versions of the data directory (a sled database) and the ordered steps that upgrade an
//! older one to [`CURRENT`]. It knows the on-disk layout only; it must not depend on the server's
//! types, so that a step still describes the data as its version wrote it after those types change.

use std::path::Path;

use sled::Transactional;

/// The schema version this build writes and reads.
pub const CURRENT: u32 = 2;

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
pub static STEPS: &[(u32, Step)] = &[(1, v1), (2, v2)];

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

/// Writers of data directories exactly as a past version laid them out, for tests that open them
/// with the current code. Like the steps, they spell out their layout rather than use [`layout`].
pub mod fixtures {
    use super::Path;

    /// Writes a version-1 data directory at `dir` holding `entries` as (id, exact key, raw encoded
    /// value), with each key's index row, and flushes it. Version 1 assigns ids from sled's id
    /// generator, so the generator is advanced past the largest id given: keep fixture ids small.
    pub fn write_v1_data_dir(dir: &Path, entries: &[(u64, [u8; 32], Vec<u8>)]) -> sled::Result<()> {
        let db = sled::open(dir)?;
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
        let db = sled::open(dir)?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &Path) -> sled::Db {
        sled::open(dir).expect("open sled")
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
        for tree in [layout::ENTRIES, layout::EXACT, layout::CHUNKS, layout::META] {
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
        assert_eq!(migrate(&db).expect("migrate"), 1);
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
