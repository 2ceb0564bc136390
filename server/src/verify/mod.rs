//! Verify, the stage between the guards and serving a semantic candidate: with `verify = judge`,
//! a candidate at or above `verify_floor` that passed the guards is served without a judge call
//! only where the error budget ([`budget`]) allows it; elsewhere it is judged ([`judge`]) before
//! answering (`sync`) or in the background for the next request (`async`).
//!
//! A verdict is kept through the feedback store: `same` approves the prompt as an alias of the
//! entry, `different` vetoes the pair, and each is an observation of the entry's curve. So the same
//! pair is never judged twice, and judge calls per lookup fall as verdicts accumulate.
//!
//! Credentials: a judge call carries `judge_api_key`, else the upstream's key when the judge is the
//! upstream, else (sync only, and only when the judge is the upstream) the request's own
//! credential headers; never a stored or logged one. The judge only sees the texts of the
//! request's partition (the cached prompt, the new one, and the context they share).

pub mod budget;
pub mod judge;
pub mod settings;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::feedback::{Encounter, Feedback};
use judge::{Judge, Pair, Target, Verdict};

/// How a served candidate was verified (`x-reprise-verified`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// The judge said `same`, on this request or on an earlier one with this prompt.
    Judge,
    /// The error budget allowed it without a judge call.
    Budget,
}

impl Verified {
    pub fn name(self) -> &'static str {
        match self {
            Verified::Judge => "judge",
            Verified::Budget => "budget",
        }
    }
}

/// A pair waiting for a background verdict.
pub(crate) struct Job {
    pub(crate) target: Target,
    pub(crate) pair: Pair,
    pub(crate) encounter: Encounter,
    /// The shadow decision the verdict is written into, for a shadowed request.
    pub(crate) shadow: Option<u64>,
}

/// The judge and the background queue, one per gateway.
pub struct Verifier {
    pub judge: Judge,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    capacity: usize,
    max_concurrency: usize,
    /// Pairs sent to the background queue (those dropped because it was full are counted with
    /// the judge's skipped candidates).
    pub queued: AtomicU64,
}

impl Verifier {
    pub fn new(config: &Config) -> Result<Self, String> {
        let prompt: Arc<str> = match &config.judge_prompt {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read judge_prompt {}: {e}", path.display()))?
                .into(),
            None => judge::DEFAULT_PROMPT.into(),
        };
        Ok(Self {
            judge: Judge::new(
                prompt,
                config.judge_max_concurrency,
                config.judge_rate,
                config.connect_timeout(),
            )?,
            queue: Mutex::new(None),
            capacity: config.judge_queue,
            max_concurrency: config.judge_max_concurrency,
            queued: AtomicU64::new(0),
        })
    }

    /// Queues a background judgement; false when the queue is full. The worker starts with the
    /// first job (inside the runtime), tracked so that shutdown waits for its calls.
    pub(crate) fn enqueue(
        self: &Arc<Self>,
        feedback: &Arc<Feedback>,
        tasks: &TaskTracker,
        stop: &CancellationToken,
        job: Job,
    ) -> bool {
        let mut slot = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let tx = slot.get_or_insert_with(|| {
            let (tx, rx) = mpsc::channel(self.capacity);
            tasks.spawn(work(
                self.clone(),
                feedback.clone(),
                tasks.clone(),
                stop.clone(),
                rx,
                self.max_concurrency,
            ));
            tx
        });
        let sent = tx.try_send(job).is_ok();
        if sent {
            self.queued.fetch_add(1, Ordering::Relaxed);
            self.judge.counts.queue_depth.inc();
        } else {
            self.judge.counts.skip("dropped");
        }
        sent
    }
}

/// The background worker: at most `max_concurrency` verdicts at once; stops at shutdown.
async fn work(
    verifier: Arc<Verifier>,
    feedback: Arc<Feedback>,
    tasks: TaskTracker,
    stop: CancellationToken,
    mut rx: mpsc::Receiver<Job>,
    max_concurrency: usize,
) {
    let slots = Arc::new(Semaphore::new(max_concurrency.max(1)));
    loop {
        let job = tokio::select! {
            _ = stop.cancelled() => break,
            job = rx.recv() => match job {
                Some(job) => job,
                None => break,
            },
        };
        verifier.judge.counts.queue_depth.dec();
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let (verifier, feedback) = (verifier.clone(), feedback.clone());
        tasks.spawn(async move {
            let judged = verifier.judge.ask(&job.target, &job.pair).await;
            // sled writes, off the async workers.
            let _ = tokio::task::spawn_blocking(move || {
                apply(&feedback, &job.encounter, judged.verdict);
                if let Some(id) = job.shadow {
                    feedback.shadow.set_verdict(id, judged.verdict.header());
                }
            })
            .await;
            drop(slot);
        });
    }
}

/// Keeps a verdict (see [`Feedback::judged`]); `unsure` changes nothing.
pub(crate) fn apply(feedback: &Feedback, encounter: &Encounter, verdict: Verdict) {
    match verdict {
        Verdict::Same => feedback.judged(encounter, true),
        Verdict::Different => feedback.judged(encounter, false),
        Verdict::Unsure(_) => {}
    }
}

/// The judge's work so far (`/admin/stats` `judge`): the wire contract's, which the client reads.
pub use reprise_wire::JudgeStats;

impl Verifier {
    pub fn stats(&self, feedback: &Feedback) -> JudgeStats {
        let c = &self.judge.counts;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (p50_ms, p99_ms) = c.latency();
        JudgeStats {
            calls: c.calls(),
            same: c.verdicts("same"),
            different: c.verdicts("different"),
            unsure: c.verdicts("unsure"),
            timeouts: get(&c.timeouts),
            failures: get(&c.failures),
            over_budget: c.skipped("over_budget"),
            too_long: c.skipped("too_long"),
            queued: get(&self.queued),
            dropped: c.skipped("dropped"),
            queue_depth: c.queue_depth.get().max(0) as u64,
            prompt_tokens: c.tokens("prompt"),
            completion_tokens: c.tokens("completion"),
            p50_ms,
            p99_ms,
            namespaces: feedback.observations.summary(),
        }
    }
}
