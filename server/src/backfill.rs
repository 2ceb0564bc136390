//! Backfill: gives a vector to every entry stored without one (its miss fell back to exact matching,
//! or it predates the model), off the request path. It must never compete with live requests for the
//! model: it sends work only while the embedder is idle, one batch at a time.
//!
//! The cache's writer thread names each entry it stores without a vector; at start the store's
//! entries without one are named too. One thread embeds their prompts, writes the vectors to the
//! store, then adds them to the index, so the entries become semantic candidates like any other.
//!
//! After a change of embedding model it also re-embeds a local store (see [`crate::reembed`]): the
//! entries whose stored vector is the old model's are named at start, and the same thread replaces
//! each of those vectors with the running model's before the entry enters the index.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::embed::{EmbedError, Embedder, Queued};
use crate::entry::{Entry, EntryId};
use crate::index::VectorIndex;
use crate::lock::lock;
use crate::reembed::{Migration, Reembedding};
use crate::store::Store;
use crate::timing::unix_ms;

/// How often the thread looks again while the embedder is busy.
const BUSY_POLL: Duration = Duration::from_millis(5);

/// How long after a request was refused the embedder the backfill leaves the model to requests:
/// about one live batch (gathering plus a model call), so under load they get every other turn
/// at least, and once load stops the backfill runs back to back.
const AFTER_REFUSAL: Duration = Duration::from_millis(25);

/// Whether an entry is meant to carry a vector: embeddings answers and empty prompts never do.
pub(crate) fn wants_vector(entry: &Entry) -> bool {
    entry.vector.is_none()
        && crate::api::named(&entry.summary.route).is_none_or(|api| api.semantic())
        && !entry.summary.prompt.trim().is_empty()
}

/// Counters of the backfill, for `/admin/stats`.
#[derive(Debug, Default, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct BackfillStats {
    /// Entries waiting for their vector.
    pub pending: u64,
    /// Entries given their vector after they were stored.
    pub embedded: u64,
    /// Entries whose embedding failed (left without a vector, exact matches only).
    pub failed: u64,
    /// The re-embedding of the store after a change of model, when this start began one.
    pub reembedding: Option<Reembedding>,
}

/// The handle: a channel to the backfill thread.
pub struct Backfill {
    tx: Mutex<Option<Sender<u64>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    counters: Arc<Counters>,
    migration: Option<Arc<Migration>>,
}

#[derive(Default)]
struct Counters {
    pending: AtomicU64,
    embedded: AtomicU64,
    failed: AtomicU64,
}

impl Backfill {
    /// Starts the thread with the ids of stored entries that still need a vector.
    pub fn start(
        embedder: Arc<Embedder>,
        index: Arc<dyn VectorIndex>,
        store: Arc<dyn Store>,
        initial: Vec<u64>,
    ) -> Arc<Self> {
        Self::start_reembedding(embedder, index, store, initial, BTreeSet::new(), None)
    }

    /// As [`Backfill::start`], and replaces the vectors of `stale` (entries whose vector is
    /// another model's, none of them in the index) with the running model's, reporting to
    /// `migration`.
    pub(crate) fn start_reembedding(
        embedder: Arc<Embedder>,
        index: Arc<dyn VectorIndex>,
        store: Arc<dyn Store>,
        initial: Vec<u64>,
        stale: BTreeSet<u64>,
        migration: Option<Arc<Migration>>,
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::channel();
        let counters = Arc::new(Counters::default());
        let pending: BTreeSet<u64> = initial.into_iter().chain(stale.iter().copied()).collect();
        counters
            .pending
            .store(pending.len() as u64, Ordering::Relaxed);
        let worker = Worker {
            embedder,
            index,
            store,
            counters: Arc::clone(&counters),
            pending,
            stale,
            migration: migration.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("reprise-backfill".into())
            .spawn(move || worker.run(rx))
            .map_err(|err| tracing::error!(error = %err, "could not start the backfill thread"))
            .ok();
        Arc::new(Self {
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(thread),
            counters,
            migration,
        })
    }

    /// Names a stored entry that has no vector yet.
    pub fn enqueue(&self, id: EntryId) {
        if let Some(tx) = lock(&self.tx).as_ref() {
            if tx.send(id.0).is_ok() {
                self.counters.pending.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub fn stats(&self) -> BackfillStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        BackfillStats {
            pending: get(&self.counters.pending),
            embedded: get(&self.counters.embedded),
            failed: get(&self.counters.failed),
            reembedding: self.migration.as_ref().map(|m| m.progress()),
        }
    }

    /// Stops the thread (shutdown); waits for at most the batch in progress. Entries still waiting
    /// are found again at the next start.
    pub fn stop(&self) {
        lock(&self.tx).take();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Backfill {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Worker {
    embedder: Arc<Embedder>,
    index: Arc<dyn VectorIndex>,
    store: Arc<dyn Store>,
    counters: Arc<Counters>,
    /// Ids in order: the oldest entries get their vectors first.
    pending: BTreeSet<u64>,
    /// Of those, the entries whose stored vector is another model's (a re-embedding).
    stale: BTreeSet<u64>,
    migration: Option<Arc<Migration>>,
}

/// A backfill batch in the embed queue or the model.
struct Sent {
    entries: Vec<Entry>,
    queued: Queued,
}

impl Worker {
    fn run(mut self, rx: Receiver<u64>) {
        // The batch whose vectors the model computes while the previous batch's are written: the
        // store and index writes cost about as much as the model call, and they need not wait for it.
        let mut in_model: Option<Sent> = None;
        loop {
            // Block for work when there is none; otherwise take what else has arrived.
            if self.pending.is_empty() && in_model.is_none() {
                match rx.recv() {
                    Ok(id) => self.take(id),
                    Err(_) => return,
                }
            }
            // Shutdown closes the channel: stop between batches, not after the whole backlog.
            loop {
                match rx.try_recv() {
                    Ok(id) => self.take(id),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            let done = match in_model.take() {
                None => None,
                Some(sent) => match sent.queued.wait() {
                    Ok(vectors) => Some((sent.entries, vectors)),
                    Err(err) => {
                        self.failed(&sent.entries, &err);
                        if let EmbedError::Closed = err {
                            return;
                        }
                        None
                    }
                },
            };
            // Low priority: a batch goes in only while no live text is queued or in the model, nor
            // was just refused, and never more than one at a time, so admission refuses live texts
            // for at most one call before they get the model back.
            if self.embedder.is_idle() && self.embedder.is_quiet(AFTER_REFUSAL) {
                match self.send_next() {
                    Ok(sent) => in_model = sent,
                    Err(_closed) => return,
                }
            }
            match done {
                Some((entries, vectors)) => self.write(&entries, vectors),
                None if in_model.is_none() && !self.pending.is_empty() => {
                    // The model is busy with live requests: look again soon.
                    match rx.recv_timeout(BUSY_POLL) {
                        Ok(id) => self.take(id),
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
                None => {}
            }
        }
    }

    /// `pending` counted the id when it was sent; a repeat is counted once.
    fn take(&mut self, id: u64) {
        if !self.pending.insert(id) {
            self.counters.pending.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Sends the next full batch of entries that still exist, are live and lack a vector, oldest
    /// first; `None` when none are left. Fails only when the embedder has stopped.
    fn send_next(&mut self) -> Result<Option<Sent>, EmbedError> {
        let now = unix_ms();
        let mut entries = Vec::new();
        while entries.len() < self.embedder.max_batch() {
            let Some(id) = self.pending.pop_first() else {
                break;
            };
            self.counters.pending.fetch_sub(1, Ordering::Relaxed);
            // The cold half alone: the answer is not needed, and a re-embedding reads every entry.
            let entry = match self.store.cold(&[EntryId(id)]) {
                Ok(mut read) => read.pop(),
                Err(err) => {
                    // Not read is not gone: a stale entry counted as settled would let the
                    // re-embedding finish with this entry's old vector still stored.
                    tracing::debug!(error = %err, id, "reading an entry to backfill failed; it stays exact-only");
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    if self.stale.remove(&id) {
                        self.settle(false);
                    }
                    continue;
                }
            };
            if self.stale.remove(&id) {
                // Every one, expired or not: no vector of the old model may stay in the store once
                // the record names the new one, or the next start would index it.
                match entry {
                    Some(entry) => entries.push(entry),
                    None => self.settle(true),
                }
            } else if let Some(entry) = entry {
                if wants_vector(&entry) && !entry.is_expired(now) {
                    entries.push(entry);
                }
            }
        }
        if entries.is_empty() {
            return Ok(None);
        }
        let prompts = entries.iter().map(|e| e.summary.prompt.clone()).collect();
        match self.embedder.embed_background(prompts) {
            Ok(queued) => Ok(Some(Sent { entries, queued })),
            Err(err) => {
                self.failed(&entries, &err);
                match err {
                    EmbedError::Closed => Err(err),
                    _ => Ok(None),
                }
            }
        }
    }

    fn failed(&self, entries: &[Entry], err: &EmbedError) {
        tracing::warn!(error = %err, entries = entries.len(), "backfilling vectors failed; those entries stay exact-only");
        self.counters
            .failed
            .fetch_add(entries.len() as u64, Ordering::Relaxed);
        for _ in entries.iter().filter(|e| e.vector.is_some()) {
            self.settle(false);
        }
    }

    /// Counts a stale entry as settled, when a re-embedding runs.
    fn settle(&self, ok: bool) {
        if let Some(migration) = &self.migration {
            migration.settle(ok, self.store.as_ref());
        }
    }

    /// Stores the vectors, then indexes them (the index names only entries the store holds).
    /// An entry that had a vector when it was read is a stale one: its vector is replaced.
    fn write(&self, entries: &[Entry], vectors: Vec<Vec<f32>>) {
        for (entry, vector) in entries.iter().zip(vectors) {
            let stale = entry.vector.is_some();
            let written = if stale {
                self.store.replace_vector(entry.id, &vector)
            } else {
                self.store.set_vector(entry.id, &vector)
            };
            match written {
                Ok(true) => {
                    self.index.insert(entry.id.0, entry.partition.0, &vector);
                    self.counters.embedded.fetch_add(1, Ordering::Relaxed);
                }
                // Deleted, replaced or given a vector meanwhile: nothing to add.
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(error = %err, id = %entry.id, "storing a backfilled vector failed");
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    if stale {
                        self.settle(false);
                    }
                    continue;
                }
            }
            if stale {
                self.settle(true);
            }
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "tests spawn clients and servers beside the code under test; none of it must outlive the test"
)]
mod tests {
    use std::sync::Condvar;

    use serde_json::{json, Value};

    use super::*;
    use crate::config::Config;
    use crate::embed::{EmbedConfig, EmbedModel};
    use crate::state::AppState;

    /// A fake model whose vectors depend only on a text's letters and digits (so `What is X?` and
    /// `what is x` are the same question), and that blocks while its gate is closed: the test decides
    /// when the model is busy.
    struct Gated {
        open: Arc<(Mutex<bool>, Condvar)>,
        /// Model calls begun (a test waits for the call it blocks to be running, not only queued).
        entered: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl EmbedModel for Gated {
        fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
            self.entered
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (open, changed) = &*self.open;
            let mut is_open = lock(open);
            while !*is_open {
                is_open = changed.wait(is_open).unwrap_or_else(|e| e.into_inner());
            }
            Ok(texts.iter().map(|t| vector(t)).collect())
        }

        fn dimension(&self) -> usize {
            8
        }
    }

    fn vector(text: &str) -> Vec<f32> {
        let canonical: String = text
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .map(|c| c.to_ascii_lowercase())
            .collect();
        let hash = blake3::hash(canonical.as_bytes());
        let v: Vec<f32> = hash.as_bytes()[..8]
            .iter()
            .map(|b| f32::from(*b) - 127.5)
            .collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        v.into_iter().map(|x| x / norm).collect()
    }

    fn set_gate(gate: &(Mutex<bool>, Condvar), open: bool) {
        *lock(&gate.0) = open;
        gate.1.notify_all();
    }

    async fn ask(client: &reqwest::Client, base: &str, prompt: &str) -> (String, Value) {
        let response = client
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth("sk-backfill")
            .json(&json!({"model": "sim-model", "messages": [{"role": "user", "content": prompt}]}))
            .send()
            .await
            .expect("send");
        let outcome = response
            .headers()
            .get("x-reprise-cache")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none")
            .to_owned();
        (outcome, response.json().await.expect("json"))
    }

    async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
        for _ in 0..1000 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never happened: {what}");
    }

    /// Issue 14: under an embedding overload, misses skip semantic matching at once (they finish
    /// while the model is still blocked), their entries are stored without a vector, and once the
    /// model is free the backfill embeds them, so their paraphrases become semantic hits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entries_stored_during_overload_get_their_vectors_later_and_become_semantic_hits() {
        let sim = reprise_sim::spawn(reprise_sim::SimConfig {
            ttft_ms: 1.0,
            itl_ms: 0.0,
            tokens: 4,
            ..Default::default()
        })
        .await
        .expect("sim");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config {
            upstream_url: sim.base_url(),
            data_dir: dir.path().to_owned(),
            embed_max_batch: 1,
            // Long enough that the admitted requests below never time out: only overload refuses.
            embed_deadline_ms: 60_000,
            admin_token: Some(crate::config::Secret::new("t")),
            ..Config::default()
        };
        config.validate().expect("valid config");
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let model = Gated {
            open: Arc::clone(&gate),
            entered: Arc::default(),
        };
        let embed_config = EmbedConfig {
            max_batch: config.embed_max_batch,
            deadline: Duration::from_millis(config.embed_deadline_ms),
            ..EmbedConfig::default()
        };
        let embedder =
            Arc::new(Embedder::with_model(Box::new(model), &embed_config).expect("fake"));
        let state = AppState::with_embedder(config, Some(embedder.clone())).expect("state");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(crate::run(listener, state.clone(), async move {
            let _ = stopped.await;
        }));
        let client = reqwest::Client::new();

        // One request keeps the model busy: every text arriving meanwhile would wait for it.
        let blocker = {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move { ask(&client, &base, "blocker").await })
        };
        eventually("the blocker's text in the model", || {
            embedder.stats().pending == 1
        })
        .await;

        // The burst: answered while the model is still blocked, so nobody waited for it.
        let prompts = [
            "What is overload 1?",
            "What is overload 2?",
            "What is overload 3?",
        ];
        for prompt in prompts {
            let (outcome, _) = ask(&client, &base, prompt).await;
            assert_eq!(outcome, "miss", "{prompt}");
        }
        let semantic = state.semantic.clone().expect("semantic stage");
        assert_eq!(semantic.fallbacks().overload, 3);
        assert_eq!(semantic.fallbacks().deadline, 0);
        eventually("three entries stored", || state.cache.store.len() == 3).await;
        let stored = state.cache.store.list(None, 10).expect("list");
        assert!(stored.iter().all(|e| e.vector.is_none()), "no vector yet");
        assert_eq!(
            embedder.stats().batches,
            0,
            "the model never finished a call"
        );

        // The model is free again: the blockers finish, then the backfill embeds the three.
        set_gate(&gate, true);
        assert_eq!(blocker.await.expect("task").0, "miss");
        eventually("the backfill embedded the three", || {
            semantic.backfill.stats().embedded == 3
        })
        .await;
        eventually("four entries stored", || state.cache.store.len() == 4).await;
        let stored = state.cache.store.list(None, 10).expect("list");
        assert!(
            stored.iter().all(|e| e.vector.is_some()),
            "every entry ends up with its vector"
        );
        for prompt in prompts {
            let paraphrase = prompt.to_uppercase().replace('?', "!!");
            let (outcome, _) = ask(&client, &base, &paraphrase).await;
            assert_eq!(outcome, "semantic-hit", "{paraphrase}");
        }
        // Operators see the reason and the backfill.
        let admin = |path: &str| client.get(format!("{base}{path}")).bearer_auth("t").send();
        let stats: Value = admin("/admin/stats")
            .await
            .expect("stats")
            .json()
            .await
            .expect("json");
        let embedding = &stats["embedding"];
        assert_eq!(embedding["fallback_reasons"]["overload"], 3, "{embedding}");
        assert_eq!(embedding["backfill"]["embedded"], 3, "{embedding}");
        let metrics = admin("/metrics")
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        assert!(
            metrics.contains("reprise_embedding_fallbacks_total{reason=\"overload\"} 3"),
            "{metrics}"
        );
        let _ = stop.send(());
        server.await.expect("server task").expect("server");
    }

    /// Issue 24: a miss that skipped semantic matching said so nowhere. Now the response, its
    /// record and a metric name the reason. And a paraphrase that arrives before its original's
    /// vector exists misses, but once the backfill lands that vector the same paraphrase is served.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_skipped_lookup_says_why_and_its_paraphrase_is_served_once_the_vector_lands() {
        let sim = reprise_sim::spawn(reprise_sim::SimConfig {
            ttft_ms: 1.0,
            itl_ms: 0.0,
            tokens: 4,
            ..Default::default()
        })
        .await
        .expect("sim");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config {
            upstream_url: sim.base_url(),
            data_dir: dir.path().to_owned(),
            embed_deadline_ms: 60_000,
            // Tiny: nothing may wait behind the blocked call below.
            embed_queue_budget_ms: 1,
            admin_token: Some(crate::config::Secret::new("t")),
            ..Config::default()
        };
        config.validate().expect("valid config");
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let embed_config = EmbedConfig {
            max_batch: config.embed_max_batch,
            deadline: Duration::from_millis(config.embed_deadline_ms),
            queue_budget: Duration::from_millis(config.embed_queue_budget_ms),
            ..EmbedConfig::default()
        };
        let entered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let model = Gated {
            open: Arc::clone(&gate),
            entered: Arc::clone(&entered),
        };
        let embedder =
            Arc::new(Embedder::with_model(Box::new(model), &embed_config).expect("fake"));
        let state = AppState::with_embedder(config, Some(embedder.clone())).expect("state");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(crate::run(listener, state.clone(), async move {
            let _ = stopped.await;
        }));
        let client = reqwest::Client::new();
        let send = |prompt: &str, no_store: bool| {
            let mut request = client
                .post(format!("{base}/v1/chat/completions"))
                .bearer_auth("sk-backfill")
                .json(&json!({"model": "sim-model", "messages": [{"role": "user", "content": prompt}]}));
            if no_store {
                request = request.header("cache-control", "no-store");
            }
            async move {
                let response = request.send().await.expect("send");
                let header = |name: &str| {
                    response
                        .headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let got = (
                    header("x-reprise-cache").unwrap_or_default(),
                    header("x-reprise-semantic"),
                    header("x-reprise-request-id").unwrap_or_default(),
                );
                let _ = response.bytes().await;
                got
            }
        };

        // A failed assertion must not leave the model blocked: dropping the embedder joins it.
        struct OpenOnDrop(Arc<(Mutex<bool>, Condvar)>);
        impl Drop for OpenOnDrop {
            fn drop(&mut self) {
                set_gate(&self.0, true);
            }
        }
        let _open = OpenOnDrop(Arc::clone(&gate));
        let blocker = tokio::spawn(send("blocker", false));
        // In the model, not only queued: a text queued beside a batch still being gathered would
        // join it (and wait for the gate) instead of being refused.
        eventually("the blocker's text in the model", || {
            embedder.stats().pending == 1 && entered.load(std::sync::atomic::Ordering::SeqCst) == 1
        })
        .await;
        let skipped = Some("skipped; reason=overload".to_owned());
        let (outcome, semantic, original_id) = send("What is the refund policy?", false).await;
        assert_eq!((outcome.as_str(), &semantic), ("miss", &skipped));
        // The paraphrase arrives before the original has a vector (and is not stored itself).
        let paraphrase = "what is THE refund policy";
        let (outcome, semantic, _) = send(paraphrase, true).await;
        assert_eq!((outcome.as_str(), &semantic), ("miss", &skipped));
        eventually("the original stored", || state.cache.store.len() == 1).await;

        // The record and the metric say it too.
        let admin = |path: &str| client.get(format!("{base}{path}")).bearer_auth("t").send();
        let records: Value = admin("/admin/requests")
            .await
            .expect("requests")
            .json()
            .await
            .expect("json");
        let record = records["data"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["id"] == original_id.as_str())
            .unwrap_or_else(|| panic!("no record {original_id} in {records}"));
        assert_eq!(record["semantic_skipped"], "overload", "{record}");
        let metrics = admin("/metrics")
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text");
        for line in [
            "reprise_semantic_skipped_total{reason=\"overload\"} 2",
            "reprise_semantic_skipped_total{reason=\"deadline\"} 0",
        ] {
            assert!(metrics.contains(line), "{line} in {metrics}");
        }

        // The model is free: the blocker's call ends, the backfill gives the original its vector,
        // and the same paraphrase is now served from it, without a skip.
        set_gate(&gate, true);
        assert_eq!(blocker.await.expect("task").0, "miss");
        let semantic = state.semantic.clone().expect("semantic stage");
        eventually("the backfill embedded the original", || {
            semantic.backfill.stats().embedded == 1
        })
        .await;
        let (outcome, skipped_now, _) = send(paraphrase, true).await;
        assert_eq!((outcome.as_str(), skipped_now), ("semantic-hit", None));
        let _ = stop.send(());
        server.await.expect("server task").expect("server");
    }

    /// A model that takes a while per batch.
    struct Slow;

    impl EmbedModel for Slow {
        fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
            std::thread::sleep(Duration::from_millis(20));
            Ok(texts.iter().map(|t| vector(t)).collect())
        }

        fn dimension(&self) -> usize {
            8
        }
    }

    /// An entry of `route` stored without a vector, in partition 1, under `key`.
    fn unembedded(route: &str, prompt: &str, key: [u8; 32]) -> Entry {
        let mut entry = Entry::for_test(prompt, key);
        entry.summary.route = route.into();
        entry
    }

    /// `n` chat entries without a vector, in one partition; their ids.
    fn stored_without_vectors(store: &Arc<dyn Store>, n: usize) -> Vec<u64> {
        (0..n)
            .map(|n| {
                let key = *blake3::hash(&[n as u8, (n >> 8) as u8]).as_bytes();
                let entry = unembedded("chat.completions", &format!("question {n}"), key);
                store.put(entry).expect("put").0
            })
            .collect()
    }

    /// Issue 14: after a load the backfill reached only 81% of the entries in 90 s. Once the load
    /// stops it must give every entry its vector, in full model calls (one per `max_batch` texts).
    #[test]
    fn a_backlog_is_embedded_in_full_batches_until_every_entry_has_its_vector() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> =
            Arc::new(crate::store::SledStore::open(dir.path()).expect("store"));
        let ids = stored_without_vectors(&store, 100);
        let config = EmbedConfig {
            max_batch: 16,
            ..EmbedConfig::default()
        };
        let embedder = Arc::new(Embedder::with_model(Box::new(Slow), &config).expect("fake"));
        let index: Arc<dyn VectorIndex> = Arc::new(crate::index::HnswIndex::new(
            crate::index::IndexConfig::new(8),
        ));
        let (first, rest) = ids.split_at(40);
        let backfill = Backfill::start(
            Arc::clone(&embedder),
            Arc::clone(&index),
            Arc::clone(&store),
            first.to_vec(),
        );
        // The rest arrive while it works, as the cache's writer names them.
        for id in rest {
            backfill.enqueue(EntryId(*id));
        }
        for _ in 0..1000 {
            if backfill.stats().embedded == 100 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let stats = backfill.stats();
        assert_eq!((stats.embedded, stats.pending, stats.failed), (100, 0, 0));
        for id in &ids {
            let entry = store.get(EntryId(*id)).expect("get").expect("entry");
            assert!(entry.vector.is_some(), "entry {id} has no vector");
        }
        assert_eq!(index.len(), 100);
        let sizes: Vec<usize> = embedder.recent_batches().iter().map(|b| b.size).collect();
        assert_eq!(sizes, vec![16, 16, 16, 16, 16, 16, 4], "full batches");
        backfill.stop();
    }

    /// A stale entry the store could not read is not gone: counted as settled, it let the
    /// re-embedding finish (and the record name the new model) with its old vector still stored.
    #[test]
    fn a_stale_entry_not_read_keeps_the_re_embedding_unfinished() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(crate::store::faulty::FaultyReads::new(
            crate::store::SledStore::open(&dir.path().join("db")).expect("store"),
        ));
        let ids: Vec<u64> = (0..3u8)
            .map(|n| {
                let mut entry = unembedded("chat.completions", &format!("question {n}"), [n; 32]);
                entry.vector = Some(vector("an old model's vector"));
                store.put(entry).expect("put").0
            })
            .collect();
        std::fs::write(
            dir.path().join(crate::reembed::MODEL_RECORD_FILE),
            "model-a\n",
        )
        .expect("record");
        let plan = crate::reembed::plan(dir.path(), "model-b", || {
            Ok((ids.iter().copied().collect(), Vec::new()))
        })
        .expect("plan");
        let crate::reembed::Plan::Reembed {
            migration, stale, ..
        } = plan
        else {
            panic!("a re-embedding");
        };
        store.fail(usize::MAX, 0);
        let embedder =
            Arc::new(Embedder::with_model(Box::new(Slow), &EmbedConfig::default()).expect("fake"));
        let index: Arc<dyn VectorIndex> = Arc::new(crate::index::HnswIndex::new(
            crate::index::IndexConfig::new(8),
        ));
        let backfill = Backfill::start_reembedding(
            embedder,
            index,
            store.clone(),
            Vec::new(),
            stale,
            Some(migration.clone()),
        );
        for _ in 0..1000 {
            if backfill.stats().pending == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        backfill.stop();
        let progress = migration.progress();
        assert_eq!((progress.done, progress.failed), (0, 3), "{progress:?}");
        assert!(!progress.finished);
        let record = std::fs::read_to_string(dir.path().join(crate::reembed::MODEL_RECORD_FILE))
            .expect("record");
        assert_eq!(
            record.trim(),
            "model-a",
            "the store is not recorded as re-embedded"
        );
    }

    /// Shutdown must not wait for the whole backlog (it once did, for minutes after a load test).
    #[test]
    fn stop_returns_after_the_batch_in_progress_not_the_backlog() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> =
            Arc::new(crate::store::SledStore::open(dir.path()).expect("store"));
        let ids = stored_without_vectors(&store, 500);
        let config = EmbedConfig {
            max_batch: 1,
            ..EmbedConfig::default()
        };
        let embedder = Arc::new(Embedder::with_model(Box::new(Slow), &config).expect("fake"));
        let index: Arc<dyn VectorIndex> = Arc::new(crate::index::HnswIndex::new(
            crate::index::IndexConfig::new(8),
        ));
        let backfill = Backfill::start(embedder, index, store, ids);
        while backfill.stats().embedded == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        backfill.stop();
        let stats = backfill.stats();
        // 500 batches of 20 ms would be 10 s; stop came after one or two of them.
        assert!(stats.embedded < 50, "{stats:?}");
    }

    #[test]
    fn old_entries_without_a_vector_are_embedded_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store: Arc<dyn Store> =
            Arc::new(crate::store::SledStore::open(dir.path()).expect("store"));
        let mut ids = Vec::new();
        for (n, (route, prompt)) in [
            ("chat.completions", "first question"),
            ("embeddings", "an embeddings input"),
            ("chat.completions", "   "),
            ("chat.completions", "second question"),
        ]
        .into_iter()
        .enumerate()
        {
            let entry = unembedded(route, prompt, [n as u8; 32]);
            ids.push(store.put(entry).expect("put"));
        }
        let gate = Arc::new((Mutex::new(true), Condvar::new()));
        let embedder = Arc::new(
            Embedder::with_model(
                Box::new(Gated {
                    open: gate,
                    entered: Arc::default(),
                }),
                &EmbedConfig::default(),
            )
            .expect("fake"),
        );
        let config = Config {
            data_dir: dir.path().to_owned(),
            ..Config::default()
        };
        let crate::semantic::Status::Ready(semantic) =
            crate::semantic::Semantic::start(&config, &store, Some(embedder), None)
        else {
            panic!("semantic stage did not start");
        };
        for _ in 0..1000 {
            if semantic.backfill.stats().embedded == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(semantic.backfill.stats().embedded, 2);
        let has_vector = |id: EntryId| store.get(id).expect("get").expect("entry").vector.is_some();
        assert!(has_vector(ids[0]) && has_vector(ids[3]));
        assert!(
            !has_vector(ids[1]) && !has_vector(ids[2]),
            "never meant to have one"
        );
        assert_eq!(crate::index::VectorIndex::len(&*semantic.index), 2);
        semantic.stop();
    }
}
