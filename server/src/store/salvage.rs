//! Salvages a corrupt store: what sled can still read of the files moved aside is copied into a
//! fresh database in the data directory, and the store then opens on that copy, keeping every
//! entry whose checksums verify. It must never write to the files moved aside (they stay as they
//! were, for inspection) and never hand out an entry that does not read back whole.
//!
//! Two kinds of damage are recovered:
//! - a snapshot sled refuses (`snap.*`, its page table): sled can rebuild the page table by
//!   scanning its whole log, as it does when the snapshot was deleted, so the log is opened without
//!   it (and without a `conf` it cannot parse: sled writes the default one this build uses);
//! - pages sled cannot read (a damaged range of its log): sled opens, and a read that reaches such
//!   a page fails. Every tree is copied key by key, and where a read fails the copy skips forward
//!   past the damaged page to the next key that reads; the entries whose halves or chunks were on
//!   the damaged pages fail their checksums, or miss a half, and are dropped when the store opens.
//!
//! The exact-key index is not copied but rebuilt from the entries (each names its key), so a
//! damaged index page loses no entry. A log that sled cannot open even without its snapshot (sled
//! 0.34 panics recovering a log whose damage leaves holes in its page table) is not salvaged, and
//! neither is a directory whose schema version cannot be read or is not this build's.

use std::ops::Bound;
use std::path::Path;

use tracing::{info, warn};

use super::sled::{open_db, ID_FLOOR_KEY};
use super::{StoreError, SCHEMA_VERSION};
use reprise_migrations::layout;

/// Where the damaged files are copied to be opened: sled writes to a log it recovers.
const SOURCE: &str = "salvage.src";
/// Probes of a skip past a damaged page, each twice as far as the last.
const SKIP_PROBES: u32 = 512;

/// What a salvage copied.
#[derive(Debug, Default)]
pub(super) struct Salvaged {
    pub rows: u64,
    /// Ranges of keys skipped because a read failed there.
    pub skipped_ranges: u64,
}

/// Copies what can be read of the store moved aside into `aside` into a fresh database in `dir`
/// (which holds no sled files). On an error `dir` is left without sled files.
pub(super) fn salvage_into(dir: &Path, aside: &Path) -> Result<Salvaged, StoreError> {
    let source = dir.join(SOURCE);
    let result = attempts(dir, aside, &source);
    let _ = std::fs::remove_dir_all(&source);
    if result.is_err() {
        super::sled::clear_sled_files(dir);
    }
    result
}

fn attempts(dir: &Path, aside: &Path, source: &Path) -> Result<Salvaged, StoreError> {
    let mut last = None;
    // As it was; without its snapshots; without its snapshots and its conf.
    for (snapshots, conf) in [(true, true), (false, true), (false, false)] {
        let _ = std::fs::remove_dir_all(source);
        std::fs::create_dir_all(source).map_err(|e| io("creating", source, e))?;
        copy_sled_files(aside, source, snapshots, conf).map_err(|e| io("copying", aside, e))?;
        let old = match open_catching_panics(source) {
            Ok(db) => db,
            Err(e) => {
                warn!(error = %e, snapshots, conf, "sled cannot open the damaged store's files");
                last = Some(e);
                continue;
            }
        };
        super::sled::clear_sled_files(dir);
        return copy_readable(&old, dir);
    }
    Err(last.unwrap_or(StoreError::CorruptStore {
        path: aside.to_owned(),
        reason: "nothing to salvage".to_owned(),
    }))
}

fn io(what: &str, path: &Path, source: std::io::Error) -> StoreError {
    StoreError::Io {
        what: format!("{what} {}", path.display()),
        source,
    }
}

/// Copies sled's files from `from` into `to`: `db` and `blobs/`, and its snapshots and `conf` if asked.
fn copy_sled_files(from: &Path, to: &Path, snapshots: bool, conf: bool) -> std::io::Result<()> {
    for item in std::fs::read_dir(from)? {
        let item = item?;
        let name = item.file_name().to_string_lossy().into_owned();
        let wanted = match name.as_str() {
            "db" | "blobs" => true,
            "conf" => conf,
            _ => snapshots && name.starts_with("snap.") && !name.ends_with(".generating"),
        };
        if !wanted {
            continue;
        }
        if item.path().is_dir() {
            std::fs::create_dir_all(to.join(&name))?;
            for inner in std::fs::read_dir(item.path())? {
                let inner = inner?;
                std::fs::copy(inner.path(), to.join(&name).join(inner.file_name()))?;
            }
        } else {
            std::fs::copy(item.path(), to.join(&name))?;
        }
    }
    Ok(())
}

/// Opens the database at `dir`, a panic inside sled (it asserts on some damaged logs) reported as
/// a corrupt store.
fn open_catching_panics(dir: &Path) -> Result<sled::Db, StoreError> {
    match std::panic::catch_unwind(|| open_db(dir)) {
        Ok(result) => result,
        Err(_) => Err(StoreError::CorruptStore {
            path: dir.to_owned(),
            reason: "sled panicked recovering it".to_owned(),
        }),
    }
}

/// Every readable row of every tree of `old` but the exact-key index, copied into a fresh
/// database in `dir`, with the id floor moved past every id `old` gave.
fn copy_readable(old: &sled::Db, dir: &Path) -> Result<Salvaged, StoreError> {
    let meta = old.open_tree(layout::META)?;
    let version = reprise_migrations::read_version(&meta)?;
    if version != Some(SCHEMA_VERSION) {
        return Err(StoreError::CorruptStore {
            path: dir.to_owned(),
            reason: format!("cannot salvage schema version {version:?}"),
        });
    }
    let new = open_db(dir)?;
    let mut salvaged = Salvaged::default();
    for name in [
        layout::META,
        layout::ENTRIES,
        layout::CHUNKS,
        layout::REPLAYS,
        layout::REPLAY_CHUNKS,
    ] {
        let (from, to) = match old.open_tree(name) {
            Ok(from) => (from, new.open_tree(name)?),
            Err(e) => {
                warn!(tree = ?name, error = %e, "a tree of the damaged store cannot be opened");
                salvaged.skipped_ranges += 1;
                continue;
            }
        };
        copy_tree(&from, &to, &mut salvaged)?;
    }
    let floor = super::sled::id_floor(&meta).unwrap_or(0);
    let given = old.generate_id().unwrap_or(0);
    let highest = new
        .open_tree(layout::ENTRIES)?
        .last()?
        .and_then(|(k, _)| super::sled::parse_id(&k))
        .unwrap_or(0);
    // Ids are never reused: past the generator, and past every entry kept, whichever is higher.
    let next = floor
        .saturating_add(given)
        .saturating_add(1)
        .max(highest.saturating_add(1));
    new.open_tree(layout::META)?
        .insert(ID_FLOOR_KEY, &next.to_be_bytes()[..])?;
    new.flush()?;
    info!(
        rows = salvaged.rows,
        skipped_ranges = salvaged.skipped_ranges,
        "copied what could be read of the damaged store"
    );
    Ok(salvaged)
}

/// Copies `from` into `to` in key order; where a read fails, skips to the next key that reads.
fn copy_tree(
    from: &sled::Tree,
    to: &sled::Tree,
    salvaged: &mut Salvaged,
) -> Result<(), StoreError> {
    let mut start: Bound<Vec<u8>> = Bound::Unbounded;
    // The furthest key read or probed: every skip starts past it, so the copy always moves on.
    let mut cursor: Option<Vec<u8>> = None;
    loop {
        let mut failed = false;
        for item in from.range::<Vec<u8>, _>((start.clone(), Bound::Unbounded)) {
            match item {
                Ok((k, v)) => {
                    to.insert(&k, v)?;
                    salvaged.rows += 1;
                    cursor = Some(k.to_vec());
                }
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        if !failed {
            return Ok(());
        }
        salvaged.skipped_ranges += 1;
        match skip_past(from, cursor.as_deref()) {
            Some(next) => {
                cursor = Some(next.clone());
                start = Bound::Included(next);
            }
            None => return Ok(()),
        }
    }
}

/// The first of ever further keys after `last` from which `tree` reads again; `None` when none
/// does.
fn skip_past(tree: &sled::Tree, last: Option<&[u8]>) -> Option<Vec<u8>> {
    // Keys here are fixed-width big-endian numbers (ids, id ++ chunk number): stepping ahead by
    // 2^k in the key's own width crosses any damaged page in a few dozen probes.
    let base = last.map_or_else(|| vec![0u8; 8], <[u8]>::to_vec);
    for k in 0..SKIP_PROBES.min(8 * base.len() as u32) {
        let probe = add_power_of_two(&base, k)?;
        match tree.range::<Vec<u8>, _>(probe.clone()..).next() {
            Some(Ok(_)) => return Some(probe),
            None => return None,
            Some(Err(_)) => continue,
        }
    }
    None
}

/// `key + 2^bit` as a big-endian number of the key's width; `None` on overflow.
fn add_power_of_two(key: &[u8], bit: u32) -> Option<Vec<u8>> {
    let mut out = key.to_vec();
    let byte = out.len().checked_sub(1 + (bit / 8) as usize)?;
    let mut carry = 1u16 << (bit % 8);
    for b in out[..=byte].iter_mut().rev() {
        let sum = u16::from(*b) + carry;
        *b = sum as u8;
        carry = sum >> 8;
        if carry == 0 {
            return Some(out);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_ahead_as_big_endian_numbers() {
        assert_eq!(add_power_of_two(&[0, 0], 0), Some(vec![0, 1]));
        assert_eq!(add_power_of_two(&[0, 0xff], 0), Some(vec![1, 0]));
        assert_eq!(add_power_of_two(&[0, 1], 9), Some(vec![2, 1]));
        assert_eq!(add_power_of_two(&[0xff, 0xff], 0), None);
        assert_eq!(add_power_of_two(&[1], 8), None);
    }
}
