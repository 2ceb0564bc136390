//! One replica among several on a shared store: follows the change feed so that what this replica
//! keeps in memory (its vector index, its live settings, its feedback) stays in step with what the
//! others change, and shares what its requests met so verdicts can be sent to any replica.
//!
//! A replica takes the feed's end before it loads its index from the store, then applies every
//! change after it: inserts and deletes to the index, a flush as a rebuild, config patches and
//! verdicts as they were accepted elsewhere. Its own changes are skipped (already applied). When the
//! feed no longer holds its position (it was down for longer than the feed keeps, or Redis came
//! back empty), it rebuilds: the index from the store's vectors, the settings from its start-up
//! settings plus every shared patch, and every shared verdict (applied once each).

use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;
use utoipa::ToSchema;

use crate::feedback::{Encounter, Feedback, Shared, SharedVerdict};
use crate::index::VectorIndex;
use crate::live::{ConfigPatch, CurrentSettings, LiveSettings};
use crate::semantic::{Rebuild, Semantic};
use crate::store::feed::{Cursor, FeedError};
use crate::store::{Change, Store};
use crate::timing::unix_ms;

/// Longest block of one feed read: also how long shutdown may wait for the follower.
const READ_WAIT: Duration = Duration::from_secs(1);
/// Pause after a failed read (Redis down): the store's own health check decides when it is back.
const RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two resyncs that could not read the shared store whole.
const MOST_PATIENT: Duration = Duration::from_secs(60);
/// Notes waiting to be shared; beyond this they are dropped (feedback on those requests is then
/// accepted only by the replica that served them).
const NOTE_QUEUE: usize = 4096;
const NOTE_BATCH: usize = 256;

/// How this replica follows the feed (`/admin/stats` `replica`).
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct FeedStatus {
    /// This replica's name in the feed (`--replica-id`).
    pub replica: String,
    /// The last change applied (a stream id), `None` before the first read.
    pub position: Option<String>,
    /// How far behind the feed this replica is: 0 when its last read reached the end, else the
    /// age of the last change it applied.
    pub behind_ms: u64,
    /// Changes of other replicas applied since start.
    pub applied: u64,
    /// Changes this replica published.
    pub published: u64,
    /// Rebuilds from the store after losing its place in the feed (Redis restarted empty, or
    /// this replica was behind by more than the feed keeps), or after starting without Redis.
    pub resyncs: u64,
    /// The last error reading the feed, while it lasts.
    pub error: Option<String>,
}

/// The follower's shared status.
#[derive(Default)]
pub struct Follower {
    status: Mutex<FeedStatus>,
}

impl Follower {
    pub fn status(&self, store: &dyn Store) -> FeedStatus {
        let mut status = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        status.published = store.feed().map_or(0, |f| f.published());
        status
    }

    fn update(&self, change: impl FnOnce(&mut FeedStatus)) {
        change(&mut self.status.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// What the follower applies changes to.
pub(crate) struct Parts {
    pub store: Arc<dyn Store>,
    pub semantic: Option<Arc<Semantic>>,
    pub live: Arc<CurrentSettings>,
    /// The settings the replica started with, under the shared patches.
    pub baseline: LiveSettings,
    pub feedback: Arc<Feedback>,
    pub stop: CancellationToken,
}

/// Starts following the feed from `start` (taken before the index was loaded; `None` when the
/// feed could not be read then: the follower rebuilds once it can). `None` without a feed.
pub(crate) fn follow(parts: Parts, start: Option<Cursor>) -> Option<Arc<Follower>> {
    let feed = parts.store.feed()?;
    let follower = Arc::new(Follower::default());
    follower.update(|s| s.replica = feed.replica().to_owned());
    parts
        .feedback
        .share(Box::new(Notes::start(parts.store.clone())));
    let running = follower.clone();
    let spawned = std::thread::Builder::new()
        .name("reprise-feed".into())
        .spawn(move || run(&parts, &running, start));
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the change-feed thread: this replica will not see other replicas' changes");
    }
    Some(follower)
}

fn run(parts: &Parts, follower: &Follower, start: Option<Cursor>) {
    let Some(feed) = parts.store.feed() else {
        return;
    };
    // Changes to settings and verdicts made before this replica started.
    let mut position = start.inspect(|_| catch_up(parts));
    while !parts.stop.is_cancelled() {
        let Some(cursor) = position else {
            match feed.tail() {
                Ok(tail) => {
                    resync(parts);
                    follower.update(|s| s.resyncs += 1);
                    position = Some(tail);
                }
                Err(e) => {
                    follower.update(|s| s.error = Some(e.to_string()));
                    std::thread::sleep(RETRY);
                }
            }
            continue;
        };
        match feed.read(cursor, READ_WAIT) {
            Ok(batch) => {
                for change in &batch.changes {
                    apply(parts, change);
                }
                let behind = if batch.caught_up {
                    0
                } else {
                    unix_ms().saturating_sub(batch.cursor.ms)
                };
                follower.update(|s| {
                    s.applied += batch.changes.len() as u64;
                    s.position = Some(batch.cursor.to_string());
                    s.behind_ms = behind;
                    s.error = None;
                });
                position = Some(batch.cursor);
            }
            Err(FeedError::Lost(why)) => {
                tracing::warn!(
                    why,
                    "this replica lost its place in the change feed: rebuilding from the shared store"
                );
                position = None;
            }
            Err(FeedError::Store(e)) => {
                follower.update(|s| s.error = Some(e.to_string()));
                std::thread::sleep(RETRY);
            }
        }
    }
}

/// Applies one change of another replica.
fn apply(parts: &Parts, change: &Change) {
    match change {
        Change::Put {
            id,
            partition,
            vector: Some(vector),
        } => {
            if let Some(semantic) = parts
                .semantic
                .as_ref()
                .filter(|s| s.embedder.dimension() == vector.len())
            {
                semantic.index.insert(id.0, *partition, vector);
            }
        }
        // Stored without a vector (embedding overloaded there): its vector comes as another put.
        Change::Put { vector: None, .. } => {}
        Change::Delete(id) => {
            if let Some(semantic) = &parts.semantic {
                semantic.index.remove(id.0);
            }
        }
        Change::Clear => {
            if let Some(semantic) = &parts.semantic {
                if let Rebuild::Incomplete(err) = semantic.resync(parts.store.as_ref()) {
                    // The entries cleared are not served meanwhile: a search checks the store.
                    tracing::warn!(error = %err, "rebuilding the vector index after a clear failed; it keeps the cleared entries until the next rebuild");
                }
            }
        }
        Change::Config(body) => apply_patch(&parts.live, body.clone()),
        Change::Verdict(body) => apply_verdict(&parts.feedback, body.clone()),
    }
}

fn apply_patch(live: &CurrentSettings, body: serde_json::Value) {
    let applied = serde_json::from_value::<ConfigPatch>(body)
        .map_err(|e| e.to_string())
        .and_then(|patch| live.apply(patch).map_err(|e| e.to_string()));
    if let Err(e) = applied {
        tracing::warn!(error = %e, "a config change from another replica does not apply here");
    }
}

fn apply_verdict(feedback: &Feedback, body: serde_json::Value) {
    let applied = serde_json::from_value::<SharedVerdict>(body)
        .map_err(|e| e.to_string())
        .and_then(|v| feedback.apply_shared(&v).map_err(|e| e.to_string()));
    if let Err(e) = applied {
        tracing::warn!(error = %e, "a verdict from another replica could not be applied");
    }
}

/// Applies every shared config patch over the start-up settings, and every shared verdict.
fn catch_up(parts: &Parts) {
    let Some(feed) = parts.store.feed() else {
        return;
    };
    match feed.history() {
        Ok((patches, verdicts)) => {
            if !patches.is_empty() {
                parts.live.replace(parts.baseline.clone());
                for patch in patches {
                    apply_patch(&parts.live, patch);
                }
            }
            for verdict in verdicts {
                apply_verdict(&parts.feedback, verdict);
            }
        }
        Err(e) => tracing::warn!(error = %e, "reading the shared config and verdicts failed"),
    }
}

/// Rebuilds what this replica keeps from the shared store.
fn resync(parts: &Parts) {
    if let Some(semantic) = &parts.semantic {
        let mut wait = RETRY;
        while !parts.stop.is_cancelled() {
            match semantic.resync(parts.store.as_ref()) {
                Rebuild::Done(_) => break,
                // The start's rebuild reads the store itself, but from before the feed's gap.
                Rebuild::Busy => std::thread::sleep(Duration::from_millis(200)),
                Rebuild::Incomplete(err) => {
                    tracing::warn!(error = %err, retry_in_s = wait.as_secs(), "rebuilding the vector index from the shared store failed");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(MOST_PATIENT);
                }
            }
        }
    }
    catch_up(parts);
}

/// Shares what requests met through the store, off the request path (see [`Shared`]).
struct Notes {
    tx: SyncSender<(String, Vec<u8>)>,
    store: Arc<dyn Store>,
}

impl Notes {
    fn start(store: Arc<dyn Store>) -> Self {
        let (tx, rx) = sync_channel(NOTE_QUEUE);
        let writer = store.clone();
        let spawned = std::thread::Builder::new()
            .name("reprise-notes".into())
            .spawn(move || write_notes(&*writer, &rx));
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the notes thread: feedback only on the replica that served");
        }
        Self { tx, store }
    }
}

fn write_notes(store: &dyn Store, rx: &Receiver<(String, Vec<u8>)>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < NOTE_BATCH {
            match rx.try_recv() {
                Ok(note) => batch.push(note),
                Err(_) => break,
            }
        }
        // While the store is degraded nothing reaches Redis: the notes are dropped, not queued.
        if store.degraded().is_some() {
            continue;
        }
        if let Some(Err(e)) = store.feed().map(|f| f.remember(&batch)) {
            tracing::debug!(error = %e, "sharing request notes failed");
        }
    }
}

impl Shared for Notes {
    fn remember(&self, request_id: &str, encounter: &Encounter) {
        let Ok(bytes) = serde_json::to_vec(encounter) else {
            return;
        };
        if let Err(TrySendError::Full(_)) = self.tx.try_send((request_id.to_owned(), bytes)) {
            tracing::debug!("request notes queue full: dropping one");
        }
    }

    fn recall(&self, request_id: &str) -> Option<Encounter> {
        let raw = self.store.feed()?.recall(request_id).ok()??;
        serde_json::from_slice(&raw).ok()
    }
}
