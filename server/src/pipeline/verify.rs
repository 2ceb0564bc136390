//! The verify stage of a request: whether a semantic candidate that passed the guards is served
//! (the error budget allows it, or the judge says `same`), judged in the background, or refused,
//! and the judge's background verdict on a shadowed request. The judge, the error budget and the
//! background queue live in [`crate::verify`]; this file holds what needs the request's
//! [`Exchange`]: its settings, the texts the judge is shown, and the credential it may use.

use http::{HeaderName, HeaderValue};
use serde_json::Value;

use crate::entry::Entry;
use crate::feedback::{Encounter, Met};
use crate::pipeline::Exchange;
use crate::state::AppState;
use crate::verify::budget::Decision;
use crate::verify::judge::{Pair, Target, Unsure, Verdict};
use crate::verify::settings::{VerifyMode, VerifyPlan};
use crate::verify::{apply, Job, Verified};

/// What the stage decided for a candidate.
pub(crate) enum Check {
    /// Serve it; how it was verified, when it was.
    Serve(Option<Verified>),
    /// Go upstream.
    Refuse,
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
    let encounter = encounter(ex, entry, similarity, Met::NearMiss);
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
                encounter: encounter(ex, entry, similarity, Met::Shadow),
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
        system: joined(system)
            .map(|s| crate::verify::judge::newest(&s, crate::verify::judge::MAX_CONTEXT_CHARS)),
        context: joined(context)
            .map(|c| crate::verify::judge::newest(&c, crate::verify::judge::MAX_CONTEXT_CHARS)),
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

/// What a verdict on `entry` for this request is kept as: the pair, its similarity, and how the
/// request met the entry.
fn encounter(ex: &Exchange, entry: &Entry, similarity: f32, met: Met) -> Encounter {
    Encounter {
        met,
        entry: entry.id,
        partition: ex.keys.partition,
        prompt: ex.prompt_key(),
        preview: crate::feedback::preview(&ex.keys.prompt),
        similarity: Some(similarity),
        namespace: ex.policy.namespace.clone(),
    }
}
