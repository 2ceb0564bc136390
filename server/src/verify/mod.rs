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

use http::{HeaderName, HeaderValue};
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::entry::Entry;
use crate::feedback::{Encounter, Feedback, Met};
use crate::pipeline::Exchange;
use crate::AppState;
use budget::Decision;
use judge::{Judge, Pair, Target, Unsure, Verdict};
use settings::{VerifyMode, VerifyPlan};

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

/// What the stage decided for a candidate.
pub enum Check {
    /// Serve it; how it was verified, when it was.
    Serve(Option<Verified>),
    /// Go upstream.
    Refuse,
}

/// A pair waiting for a background verdict.
struct Job {
    target: Target,
    pair: Pair,
    encounter: Encounter,
    /// The shadow decision the verdict is written into, for a shadowed request.
    shadow: Option<u64>,
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
    fn enqueue(
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
fn apply(feedback: &Feedback, encounter: &Encounter, verdict: Verdict) {
    match verdict {
        Verdict::Same => feedback.judged(encounter, true),
        Verdict::Different => feedback.judged(encounter, false),
        Verdict::Unsure(_) => {}
    }
}

/// Decides whether `entry`, found at `similarity` and passed by the guards, may be served to `ex`.
pub(crate) async fn check(
    state: &AppState,
    ex: &mut Exchange,
    entry: &Entry,
    similarity: f32,
) -> Check {
    let plan = ex.verify_plan().clone();
    if !plan.judges() {
        return if similarity >= ex.threshold {
            Check::Serve(None)
        } else {
            Check::Refuse
        };
    }
    // The very same prompt in the same partition is the exact key: an exact lookup that ran just
    // before its entry was written finds it here. Nothing to judge.
    if entry.summary.prompt == ex.keys.prompt {
        return Check::Serve(None);
    }
    let namespace = ex.policy.namespace.clone().unwrap_or_default();
    // The client's own stricter threshold is a floor the judge does not lower.
    if similarity < plan.floor || (ex.policy.threshold.is_some() && similarity < ex.threshold) {
        return Check::Refuse;
    }
    let decision = state.feedback.observations.decide(
        &namespace,
        entry.id,
        similarity,
        plan.max_wrong,
        ex.threshold,
        rand::random::<f64>(),
    );
    let why = match decision {
        Decision::Serve { bound } => return Check::Serve(bound.map(|_| Verified::Budget)),
        Decision::Judge(why) => why,
    };
    tracing::debug!(entry = %entry.id, similarity, why = why.name(), "judging a near match");
    let encounter = Encounter {
        met: Met::NearMiss,
        entry: entry.id,
        partition: ex.keys.partition,
        prompt: ex.prompt_key(),
        preview: crate::feedback::preview(&ex.keys.prompt),
        similarity: Some(similarity),
        namespace: ex.policy.namespace.clone(),
    };
    let pair = pair(ex, entry);
    let Some(target) = target(state, ex, &plan) else {
        ex.misses.verify = Some(Verdict::Unsure(Unsure::NotConfigured).header());
        warn_unconfigured(&plan);
        return Check::Refuse;
    };
    match plan.mode {
        VerifyMode::Sync => {
            let judged = state.verifier.judge.ask(&target, &pair).await;
            ex.ingress.clock.judge_ms = Some(judged.ms);
            ex.misses.verify = Some(judged.verdict.header());
            // sled writes, off the async workers; awaited, so the next request sees the verdict.
            let feedback = state.feedback.clone();
            let verdict = judged.verdict;
            let _ =
                tokio::task::spawn_blocking(move || apply(&feedback, &encounter, verdict)).await;
            match judged.verdict {
                Verdict::Same => Check::Serve(Some(Verified::Judge)),
                Verdict::Different | Verdict::Unsure(_) => Check::Refuse,
            }
        }
        VerifyMode::Async => {
            let job = Job {
                target,
                pair,
                encounter,
                shadow: None,
            };
            let queued =
                state
                    .verifier
                    .enqueue(&state.feedback, &state.tasks, &state.shutdown, job);
            ex.misses.verify = Some(if queued { "queued" } else { "dropped" }.to_owned());
            Check::Refuse
        }
    }
}

/// Shadow mode with a judge: the candidate `on` would have judged or served is judged in the
/// background (a shadowed request never waits), and the verdict is written next to the decision,
/// kept as `on` would keep it (approval or veto, and an observation). A candidate the guards or
/// the operators' verdicts refuse, or one below the floor, is not judged: `on` would not serve it.
pub(crate) fn shadow(
    state: &AppState,
    ex: &Exchange,
    entry: &Entry,
    similarity: f32,
    decision: &mut crate::shadow::ShadowDecision,
) {
    let mut plan = ex.verify_plan().clone();
    let refused = decision.guards.iter().any(|g| g.enabled && g.refuses);
    if !plan.judges() || refused || similarity < plan.floor {
        return;
    }
    plan.mode = VerifyMode::Async;
    let mut note = |verdict: String| {
        state
            .feedback
            .shadow
            .set_verdict(decision.id, verdict.clone());
        decision.verdict = Some(verdict);
    };
    match target(state, ex, &plan) {
        None => note(Verdict::Unsure(Unsure::NotConfigured).header()),
        Some(target) => {
            // Written before the job can land, so that the verdict is never overwritten.
            note("queued".to_owned());
            let job = Job {
                target,
                pair: pair(ex, entry),
                encounter: Encounter {
                    met: Met::Shadow,
                    entry: entry.id,
                    partition: ex.keys.partition,
                    prompt: ex.prompt_key(),
                    preview: crate::feedback::preview(&ex.keys.prompt),
                    similarity: Some(similarity),
                    namespace: ex.policy.namespace.clone(),
                },
                shadow: Some(decision.id),
            };
            if !state
                .verifier
                .enqueue(&state.feedback, &state.tasks, &state.shutdown, job)
            {
                note("dropped".to_owned());
            }
        }
    }
}

/// Says once per process that a judge call had no credential to use.
fn warn_unconfigured(plan: &VerifyPlan) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        tracing::warn!(
            mode = plan.mode.name(),
            "a judge call has no credential: set judge_api_key (background calls cannot use the request's); candidates are not served meanwhile"
        );
    });
}

/// Where the judge call of `plan` goes, with which credential; `None` when it has none to use.
fn target(state: &AppState, ex: &Exchange, plan: &VerifyPlan) -> Option<Target> {
    let config = &state.config;
    let url = plan
        .url
        .clone()
        .unwrap_or_else(|| config.upstream_url.clone());
    let to_upstream = url.trim_end_matches('/') == config.upstream_url;
    let mut headers = Vec::new();
    if let Some(key) = config.judge_credential(plan) {
        let value = HeaderValue::from_str(&format!("Bearer {}", key.expose())).ok()?;
        headers.push((http::header::AUTHORIZATION, value));
    } else if plan.mode == VerifyMode::Sync && to_upstream {
        // The request's own credential, to the host it was sent to anyway; never to another one.
        for name in crate::key::CREDENTIAL_HEADERS {
            if let Some(value) = ex.ingress.headers.get(name) {
                headers.push((HeaderName::from_static(name), value.clone()));
            }
        }
    } else if plan.mode == VerifyMode::Async {
        return None;
    }
    Some(Target {
        url,
        model: plan.model.clone()?,
        headers,
        timeout: plan.timeout,
    })
}

/// What the judge is shown: the system prompt and the earlier turns (the context both prompts
/// share, being in one partition), and the two prompts semantic matching compared.
fn pair(ex: &Exchange, entry: &Entry) -> Pair {
    let body = &ex.ingress.body;
    let mut system = Vec::new();
    if let Some(text) = body.get("instructions").and_then(Value::as_str) {
        system.push(text.to_owned());
    }
    let turns = body
        .get("messages")
        .or_else(|| body.get("input"))
        .and_then(Value::as_array);
    let mut context = Vec::new();
    if let Some(turns) = turns {
        // The final user turn is the prompt itself.
        let last_user = turns
            .iter()
            .rposition(|m| m.get("role").and_then(Value::as_str) == Some("user"));
        for (i, turn) in turns.iter().enumerate() {
            if Some(i) == last_user {
                continue;
            }
            let role = turn.get("role").and_then(Value::as_str).unwrap_or("item");
            let text = text_of(turn);
            match role {
                "system" | "developer" => system.push(text),
                _ => context.push(format!("{role}: {text}")),
            }
        }
    }
    let joined = |parts: Vec<String>| (!parts.is_empty()).then(|| parts.join("\n"));
    Pair {
        system: joined(system).map(|s| judge::newest(&s, judge::MAX_CONTEXT_CHARS)),
        context: joined(context).map(|c| judge::newest(&c, judge::MAX_CONTEXT_CHARS)),
        cached: entry.summary.prompt.clone(),
        new: ex.keys.prompt.clone(),
    }
}

/// A message's text: a string content, its text parts, else the item as JSON (tool calls).
fn text_of(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p.get("text").and_then(Value::as_str) {
                Some(t) => t.to_owned(),
                None => format!(
                    "[{}]",
                    p.get("type").and_then(Value::as_str).unwrap_or("part")
                ),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => message.to_string(),
    }
}

/// The judge's work so far (`/admin/stats` `judge`).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct JudgeStats {
    /// Calls that reached the judge, by verdict (`unsure`: it said so, timed out, failed or
    /// answered something else).
    pub calls: u64,
    pub same: u64,
    pub different: u64,
    pub unsure: u64,
    pub timeouts: u64,
    pub failures: u64,
    /// Candidates not judged: the rate budget was spent, or a prompt was too long to show whole.
    pub over_budget: u64,
    pub too_long: u64,
    /// Background mode: pairs queued, dropped because the queue was full, waiting now.
    pub queued: u64,
    pub dropped: u64,
    pub queue_depth: u64,
    /// Tokens the judge calls cost, as the judge reported them.
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// Latency of the newest calls.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Verdicts observed per namespace (judge and operators), the error budget's evidence.
    pub namespaces: Vec<budget::NamespaceBudget>,
}

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
