//! Rebuilds the store's sled database into a fresh one beside it, so that files sled no longer
//! needs but never deleted (the `blobs/` of schema version 1), and log space its cleaner fell
//! behind on (past [`super::disk_budget`]), are reclaimed. It must never remove
//! the old files before the new copy is complete and durable, and must leave alone every file in
//! the data directory that is not sled's (the vector index).
//!
//! Steps: copy every tree into `rebuild.tmp/` and flush it; write `rebuild.ready` listing the new
//! files (from here the rebuild is committed); move each listed file over the old one and delete
//! the old sled files not listed; delete `rebuild.tmp/` and `rebuild.ready`. An open that finds
//! `rebuild.ready` finishes the moves; one that finds only `rebuild.tmp/` discards it.

use std::io::Write;
use std::path::Path;

use tracing::{info, warn};

use super::sled::{open_db, ID_FLOOR_KEY};
use super::StoreError;
use reprise_migrations::layout;

const STAGING: &str = "rebuild.tmp";
const READY: &str = "rebuild.ready";

/// True when sled's `blobs/` directory in `dir` holds any file.
pub(super) fn has_blobs(dir: &Path) -> bool {
    std::fs::read_dir(dir.join("blobs")).is_ok_and(|mut listing| listing.next().is_some())
}

/// sled's own files in a data directory.
fn is_sled_file(name: &str) -> bool {
    matches!(name, "conf" | "db" | "blobs") || name.starts_with("snap.")
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> StoreError {
    StoreError::Io {
        what: format!("{what} {}", path.display()),
        source: e,
    }
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn sync_dir(dir: &Path) {
    // Makes the renames durable; not every platform lets a directory be opened for this.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Finishes a committed rebuild, or discards one that never committed.
pub(super) fn finish_or_discard(dir: &Path) -> Result<(), StoreError> {
    if dir.join(READY).exists() {
        info!(dir = %dir.display(), "finishing an interrupted store rebuild");
        return finish(dir);
    }
    let staging = dir.join(STAGING);
    if staging.exists() {
        warn!(dir = %dir.display(), "discarding an unfinished store rebuild");
        remove_any(&staging).map_err(|e| io_error("removing", &staging, e))?;
    }
    Ok(())
}

/// Copies `old` into a fresh database and puts it in its place; returns the new database, opened.
/// When the copy cannot be made (a full disk), the old database is kept and returned.
pub(super) fn rebuild(dir: &Path, old: sled::Db) -> Result<sled::Db, StoreError> {
    let staging = dir.join(STAGING);
    remove_any(&staging).map_err(|e| io_error("removing", &staging, e))?;
    let bytes_before = old.size_on_disk().unwrap_or(0);
    if let Err(e) = copy_into(&old, &staging) {
        warn!(error = %e, dir = %dir.display(), "cannot rebuild the store; keeping it as it is");
        let _ = remove_any(&staging);
        return Ok(old);
    }
    drop(old);
    let names: Vec<String> = std::fs::read_dir(&staging)
        .map_err(|e| io_error("listing", &staging, e))?
        .flatten()
        .map(|item| item.file_name().to_string_lossy().into_owned())
        .filter(|name| is_sled_file(name))
        .collect();
    let ready = dir.join(READY);
    let mut file = std::fs::File::create(&ready).map_err(|e| io_error("writing", &ready, e))?;
    file.write_all(names.join("\n").as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| io_error("writing", &ready, e))?;
    sync_dir(dir);
    finish(dir)?;
    let db = open_db(dir)?;
    info!(
        dir = %dir.display(),
        bytes_before,
        bytes_after = db.size_on_disk().unwrap_or(0),
        "rebuilt the store into a fresh file"
    );
    Ok(db)
}

/// Every tree of `old`, copied into a new database at `staging` and flushed. Entry ids must keep
/// growing across the copy, so the new database's id floor is moved past every id `old` gave.
fn copy_into(old: &sled::Db, staging: &Path) -> Result<(), StoreError> {
    let new = sled::Config::new().path(staging).open()?;
    for name in old.tree_names() {
        let (from, to) = (old.open_tree(&name)?, new.open_tree(&name)?);
        for item in from.iter() {
            let (k, v) = item?;
            to.insert(k, v)?;
        }
    }
    let meta = new.open_tree(layout::META)?;
    let floor = super::sled::id_floor(&old.open_tree(layout::META)?)?;
    let next = floor.saturating_add(old.generate_id()?).saturating_add(1);
    meta.insert(ID_FLOOR_KEY, &next.to_be_bytes()[..])?;
    new.flush()?;
    Ok(())
}

/// Moves the files `rebuild.ready` lists from the staging directory over the old ones, deletes
/// the old sled files it does not list, then the staging directory and the list. Safe to repeat.
fn finish(dir: &Path) -> Result<(), StoreError> {
    let ready = dir.join(READY);
    let staging = dir.join(STAGING);
    let listed = std::fs::read_to_string(&ready).map_err(|e| io_error("reading", &ready, e))?;
    let names: Vec<&str> = listed.lines().filter(|n| is_sled_file(n)).collect();
    for name in &names {
        let from = staging.join(name);
        if from.exists() {
            let to = dir.join(name);
            remove_any(&to).map_err(|e| io_error("removing", &to, e))?;
            std::fs::rename(&from, &to).map_err(|e| io_error("moving", &from, e))?;
        }
    }
    let listing = std::fs::read_dir(dir).map_err(|e| io_error("listing", dir, e))?;
    for item in listing.flatten() {
        let name = item.file_name().to_string_lossy().into_owned();
        if is_sled_file(&name) && !names.contains(&name.as_str()) {
            remove_any(&item.path()).map_err(|e| io_error("removing", &item.path(), e))?;
        }
    }
    sync_dir(dir);
    remove_any(&staging).map_err(|e| io_error("removing", &staging, e))?;
    std::fs::remove_file(&ready).map_err(|e| io_error("removing", &ready, e))?;
    sync_dir(dir);
    Ok(())
}
