//! Lookup, the stage between the key and the upstream: decides whether a request is served from an
//! entry ([`Decision::Hit`]), waits for an identical miss already in flight ([`Decision::Follow`]),
//! or goes upstream ([`Decision::Miss`]).
//!
//! In order: the exact key; a paraphrase served before (the alias memory, or a match an operator
//! approved); semantic matching (embed the prompt, search its partition, let the guards and the
//! operators' verdicts veto candidates); single flight, across replicas too when they share a
//! store ([`crate::cache::remote`]: another replica's answer to the same miss is waited for). With
//! `semantic_overlap` on, the semantic search is started but not awaited: the miss stage races it
//! against the upstream's first byte.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::task::JoinHandle;

use super::exchange::{Found, How};
use super::Exchange;
use crate::cache::remote::{self, Across};
use crate::cache::{Flight, Join};
use crate::entry::{EntryId, Replay};
use crate::feedback::{self, Encounter, Met};
use crate::guard::Guards;
use crate::ingress::Route;
use crate::semantic::{self, Query, Semantic};
use crate::shadow;
use crate::state::AppState;
use crate::timing::unix_ms;

/// What the lookup decided for a request.
pub(crate) enum Decision {
    /// Serve this entry.
    Hit(Found),
    /// An identical miss is in flight: wait for its answer.
    Follow(Arc<Flight>),
    /// Go upstream; `flight` is set when this request leads identical ones, `search` when semantic
    /// matching still runs beside the upstream request (`semantic_overlap`).
    Miss {
        flight: Option<Arc<Flight>>,
        search: Option<PendingSearch>,
    },
}

/// What the semantic stage produced: the prompt's vector (to store with the answer) and, when it
/// searched, what it found.
#[derive(Default)]
pub(crate) struct Searched {
    pub vector: Option<Vec<f32>>,
    pub embed_ms: Option<f64>,
    /// When the embedding began (a trace places the embed and search phases from it).
    pub began: Option<Instant>,
    pub outcome: Option<semantic::Outcome>,
    /// Why the search did not run although it was meant to (no vector in time, busy scans).
    pub skipped: Option<semantic::FallbackReason>,
}

/// A semantic search running beside the upstream request. Its vector also lands in `vector` when
/// it is done, so that an answer recorded later can be stored with it.
pub(crate) struct PendingSearch {
    pub task: JoinHandle<Searched>,
    pub vector: Arc<OnceLock<Vec<f32>>>,
}

/// Runs the lookup for `ex`.
pub(crate) async fn decide(state: &AppState, ex: &mut Exchange) -> Decision {
    if ex.browser.is_some() && ex.cors.is_none() && ex.policy.lookup {
        // A browser's request whose CORS answer the upstream has not given yet (see `cors.rs`):
        // nothing the gateway answers itself would reach the page. It goes upstream, which
        // teaches the answer, and stores only where no entry would be replaced (the entry that
        // would have served it keeps its id, hits and verdicts). No search, no judge, no wait
        // for another replica's answer.
        if state
            .cache
            .lookup(&ex.keys.exact, &ex.policy)
            .await
            .is_some()
        {
            ex.policy.store = false;
        }
        ex.policy.lookup = false;
        ex.misses.cors_unknown = true;
    }
    if let Some(found) = exact(state, ex).await {
        return Decision::Hit(found);
    }
    let mut search = None;
    if let Some((semantic, plan)) = semantic_plan(state, ex) {
        let overlap = state.config.semantic_overlap && !plan.shadow && plan.search;
        if overlap {
            search = Some(start_search(state, semantic, ex, plan));
        } else {
            let searched = run_search(semantic, state.cache.store.clone(), ex, plan).await;
            if let Some(found) = apply_search(state, ex, searched, plan.shadow).await {
                return Decision::Hit(found);
            }
        }
    }
    ex.ingress.clock.looked_up = Some(Instant::now());
    let (policy, stream) = (&ex.policy, ex.stream);
    if !(policy.lookup || policy.store) {
        return Decision::Miss {
            flight: None,
            search,
        };
    }
    match state.cache.join(ex.keys.exact, stream, policy.store) {
        Some(Join::Follower(leader)) if policy.lookup => {
            if let Some(pending) = search {
                // The leader's answer serves this request; its search is the leader's to run.
                pending.task.abort();
            }
            Decision::Follow(leader)
        }
        Some(Join::Leader(flight)) => lead(state, ex, flight, search).await,
        _ => Decision::Miss {
            flight: None,
            search,
        },
    }
}

/// This request leads its replica's flight: with a shared store, another replica may already be
/// asking the upstream, and its stored answer serves this request (see [`remote`]).
async fn lead(
    state: &AppState,
    ex: &mut Exchange,
    flight: Arc<Flight>,
    search: Option<PendingSearch>,
) -> Decision {
    let wait = ex.policy.lookup;
    let across = remote::lead(
        &state.cache,
        &state.tasks,
        ex.keys.exact,
        &flight,
        &ex.policy,
        wait,
    )
    .await;
    match across {
        Across::Answered(hit) => {
            if let Some(pending) = search {
                pending.task.abort();
            }
            state.requests.stats.replica_wait("answered");
            // The wait was single flight's, as a local follower's is, not the lookup's.
            let looked_up = ex.ingress.clock.looked_up;
            let found = found(state, ex, hit.replay, hit.age_s, How::Coalesced);
            ex.ingress.clock.looked_up = looked_up;
            Decision::Hit(found)
        }
        Across::Lead { waited } => {
            if let Some(end) = waited {
                state.requests.stats.replica_wait(end.as_str());
            }
            Decision::Miss {
                flight: Some(flight),
                search,
            }
        }
    }
}

/// The exact key, then a paraphrase served before (an alias the operator approved, or one the alias
/// memory kept).
async fn exact(state: &AppState, ex: &mut Exchange) -> Option<Found> {
    if !ex.policy.lookup {
        return None;
    }
    if let Some(hit) = state.cache.lookup(&ex.keys.exact, &ex.policy).await {
        if lacks_usage(state, ex, &hit.replay) {
            // Its miss replaces the entry with one that has usage.
            return None;
        }
        return Some(found(state, ex, hit.replay, hit.age_s, How::Exact));
    }
    if !(ex.policy.semantic && state.semantic.is_some()) {
        return None;
    }
    // A paraphrase served before: the same answer, without embedding it again. The guards are
    // checked again: they may have been turned on since the alias was made. An alias an operator
    // approved is served as it is (a veto of the same pair withdraws the approval); a remembered
    // one only while feedback allows the pair.
    let prompt = ex.prompt_key();
    let approved =
        feedback::approved_hit(&state.feedback, &state.cache, &ex.keys, &prompt, &ex.policy).await;
    let mut verified = None;
    let (hit, similarity) = match approved {
        Some((hit, similarity, source)) => {
            if source == crate::verify::budget::Source::Judge {
                verified = Some(crate::verify::Verified::Judge);
            }
            (hit, similarity)
        }
        None => state
            .cache
            .lookup_alias(&ex.keys.exact, &ex.keys.partition, ex.threshold, &ex.policy)
            .await
            .filter(|(hit, similarity)| {
                ex.settings
                    .semantic_guards
                    .refuses_texts(&ex.keys.prompt, &hit.entry.summary.prompt)
                    .is_none()
                    && state.feedback.allows(hit.entry.id, &prompt, *similarity)
            })?,
    };
    let replay = replay_of(state, &hit.entry).await;
    if lacks_usage(state, ex, &replay) {
        return None;
    }
    let mut found = found(state, ex, replay, hit.age_s, How::Similar(similarity));
    found.verified = verified;
    Some(found)
}

/// Whether `replay` cannot serve `ex` as the upstream would: a stream that asks for usage
/// (`stream_options.include_usage`, which OpenAI always answers with a usage chunk) from an entry
/// recorded from an upstream stream that asked for none. Before, such a hit ended without usage,
/// and token counters (LangChain's, the Agents SDK's) read nothing; now it is a miss, whose answer
/// is stored in its place. Not for an entry no upstream made (warmed: no TTFT was timed for it),
/// which an operator chose and which has no usage to give, nor once the upstream has shown that it
/// ignores the option: its answer would have none either, and every such request would miss.
fn lacks_usage(state: &AppState, ex: &Exchange, replay: &Replay) -> bool {
    ex.stream
        && ex.include_usage
        && matches!(
            ex.ingress.route,
            Route::ChatCompletions | Route::Completions
        )
        && replay.ttft_cost_ms().is_some()
        && !replay.has_usage()
        && !state.cache.upstream_ignores_usage()
}

/// What the semantic stage will do for a request.
#[derive(Debug, Clone, Copy)]
struct Plan {
    /// Search for a candidate (else only embed, to store the vector with the answer).
    search: bool,
    /// Shadow mode: search at any similarity, unguarded, and only record what `on` would serve.
    shadow: bool,
}

fn semantic_plan<'a>(state: &'a AppState, ex: &Exchange) -> Option<(&'a Arc<Semantic>, Plan)> {
    let semantic = state
        .semantic
        .as_ref()
        .filter(|_| crate::api::of(ex.route()).semantic())?;
    let policy = &ex.policy;
    let shadow = policy.lookup && policy.shadow;
    let search = (policy.lookup && policy.semantic) || shadow;
    (search || policy.store).then_some((semantic, Plan { search, shadow }))
}

fn query(ex: &Exchange, plan: Plan) -> Query {
    let (threshold, guards) = if plan.shadow {
        (f32::NEG_INFINITY, Guards::default())
    } else {
        (search_threshold(ex), ex.settings.semantic_guards)
    };
    Query {
        partition: ex.keys.partition.0,
        prompt: ex.keys.prompt.clone(),
        threshold,
        serve_at: ex.threshold,
        guards,
        max_age_s: ex.policy.max_age_s,
    }
}

/// The lowest similarity a candidate is looked for at: with a judge, its floor (the verify stage
/// decides between it and the threshold); a client's own stricter threshold is never lowered.
fn search_threshold(ex: &Exchange) -> f32 {
    let plan = ex.verify_plan();
    if plan.judges() && ex.policy.threshold.is_none() {
        plan.floor.min(ex.threshold)
    } else {
        ex.threshold
    }
}

async fn search(
    semantic: Arc<Semantic>,
    store: Arc<dyn crate::store::Store>,
    query: Query,
    search: bool,
) -> Searched {
    let began = Instant::now();
    let (vector, embed_ms) = match semantic.embed(&query.prompt).await {
        Ok(Some(embedded)) => embedded,
        Ok(None) => return Searched::default(),
        // Said on the response and in the record only when a search was meant to run.
        Err(reason) => {
            return Searched {
                skipped: search.then_some(reason),
                ..Searched::default()
            }
        }
    };
    let outcome = if search {
        Some(semantic.search(&store, vector.clone(), query).await)
    } else {
        None
    };
    Searched {
        vector: Some(vector),
        embed_ms: Some(embed_ms),
        began: Some(began),
        skipped: outcome.as_ref().and_then(|o| o.skipped),
        outcome,
    }
}

async fn run_search(
    semantic: &Arc<Semantic>,
    store: Arc<dyn crate::store::Store>,
    ex: &Exchange,
    plan: Plan,
) -> Searched {
    search(semantic.clone(), store, query(ex, plan), plan.search).await
}

fn start_search(
    state: &AppState,
    semantic: &Arc<Semantic>,
    ex: &Exchange,
    plan: Plan,
) -> PendingSearch {
    let vector = Arc::new(OnceLock::new());
    let slot = vector.clone();
    let running = search(
        semantic.clone(),
        state.cache.store.clone(),
        query(ex, plan),
        plan.search,
    );
    let task = state.tasks.spawn(async move {
        let searched = running.await;
        if let Some(v) = &searched.vector {
            let _ = slot.set(v.clone());
        }
        searched
    });
    PendingSearch { task, vector }
}

/// Takes in what the semantic stage found: the nearest candidate and the guard that refused it
/// (for the miss's headers), a shadow decision, an operator's veto, the vector. Returns the hit to
/// serve, if any.
pub(crate) async fn apply_search(
    state: &AppState,
    ex: &mut Exchange,
    searched: Searched,
    shadow: bool,
) -> Option<Found> {
    ex.ingress.clock.embed_ms = searched.embed_ms;
    ex.ingress.clock.semantic_began = searched.began;
    ex.vector = searched.vector;
    ex.misses.nearest.skipped = searched.skipped.map(semantic::FallbackReason::name);
    let mut outcome = searched.outcome?;
    ex.ingress.clock.search_ms = outcome.search_ms;
    let prompt = ex.prompt_key();
    if let (Some(entry), Some(similarity), false) = (outcome.nearest_entry, outcome.nearest, shadow)
    {
        // Noted as a near miss; a hit below overwrites it.
        note(state, ex, Met::NearMiss, entry, Some(similarity));
    }
    if shadow {
        if let Some(hit) = outcome.hit.take() {
            let mut decision = record_shadow(state, ex, &hit).await;
            if let Some(decision) = &mut decision {
                super::verify::shadow(state, ex, &hit.entry, hit.similarity, decision);
            }
            ex.misses.shadowed = decision;
            note(state, ex, Met::Shadow, hit.entry.id, Some(hit.similarity));
        }
    }
    // A pair an operator said was wrong is never served again.
    if let Some(hit) = outcome
        .hit
        .take_if(|hit| !state.feedback.allows(hit.entry.id, &prompt, hit.similarity))
    {
        ex.misses.vetoed = Some(hit.entry.id);
        tracing::debug!(entry = %hit.entry.id, similarity = hit.similarity, "semantic hit vetoed by feedback");
    }
    ex.misses.nearest.similarity = outcome.nearest;
    // Named on the miss exactly when counted: a refusal at or above the floor the search used, not
    // the guard of a nearest candidate that scored far below it.
    ex.misses.nearest.guard = outcome.refused;
    ex.misses.nearest.nearest_guard = outcome.nearest_guard;
    if let Some(guard) = outcome.refused {
        state.requests.stats.guard_refused(guard);
    }
    let semantic::Hit {
        entry,
        similarity,
        replay,
    } = outcome.hit?;
    if lacks_usage(state, ex, &replay) {
        return None;
    }
    let verified = match super::verify::check(state, ex, &entry, similarity).await {
        super::verify::Check::Serve(verified) => verified,
        super::verify::Check::Refuse => return None,
    };
    if ex.policy.store {
        state
            .cache
            .remember_alias(ex.keys.exact, entry.id, similarity);
    }
    let age_s = entry.age_s(unix_ms());
    let mut found = found(state, ex, replay, age_s, How::Similar(similarity));
    found.verified = verified;
    found.verdict = ex.misses.verify.take();
    Some(found)
}

/// The replay an alias hit serves: read as an exact hit reads it (the alias memory decoded the
/// entry whole; its answer need not be serialized again), or built from the entry when the
/// store has none to give (it was replaced or dropped since).
async fn replay_of(state: &AppState, entry: &crate::entry::Entry) -> Arc<Replay> {
    let id = entry.id;
    let stored = state
        .cache
        .read(move |store| store.replay(id))
        .await
        .and_then(Result::ok)
        .flatten();
    Arc::new(stored.unwrap_or_else(|| Replay::of(entry)))
}

/// A hit: the lookup ends here, and feedback on this request will name the entry.
fn found(state: &AppState, ex: &mut Exchange, entry: Arc<Replay>, age_s: u64, how: How) -> Found {
    ex.ingress.clock.looked_up = Some(Instant::now());
    let met = match how {
        How::Exact => Met::Hit,
        How::Similar(_) | How::Coalesced => Met::SemanticHit,
    };
    note(state, ex, met, entry.id(), how.similarity());
    Found {
        entry,
        age_s,
        how,
        verified: None,
        verdict: None,
    }
}

/// What feedback on this request will need to know about the entry it met.
fn note(state: &AppState, ex: &Exchange, met: Met, entry: EntryId, similarity: Option<f32>) {
    state.feedback.note(
        &ex.id,
        Encounter {
            met,
            entry,
            partition: ex.keys.partition,
            prompt: ex.prompt_key(),
            preview: feedback::preview(&ex.keys.prompt),
            similarity,
            namespace: ex.policy.namespace.clone(),
        },
    );
}

/// Judges and records the candidate a shadowed request met; the decision, for its header. A
/// failure to record is logged, never the client's problem.
async fn record_shadow(
    state: &AppState,
    ex: &Exchange,
    hit: &semantic::Hit,
) -> Option<shadow::ShadowDecision> {
    let (candidate, similarity) = (&hit.entry, hit.similarity);
    let (keys, threshold, prompt) = (&ex.keys, ex.threshold, &ex.prompt_key());
    let guards = ex.settings.semantic_guards;
    let (mut would, mut verdicts) =
        shadow::ShadowDecision::judge(&keys.prompt, candidate, similarity, threshold, guards);
    // Feedback refuses like a guard: a vetoed pair, or a similarity under the entry's own
    // threshold, would not be served either.
    if !state.feedback.allows(candidate.id, prompt, similarity) {
        verdicts.push(shadow::GuardVerdict {
            guard: "feedback".to_owned(),
            enabled: true,
            refuses: true,
        });
        if would == shadow::Would::Hit {
            would = shadow::Would::Refuse;
        }
    }
    // What serving it would have saved, read as a hit reads it (from the entry's replay).
    let would_save = if would == shadow::Would::Hit {
        let saved = state.savings.saved(
            &hit.replay,
            &ex.ingress.body,
            &ex.ingress.model,
            ex.policy.namespace.as_deref(),
        );
        state.requests.stats.shadow_saved(&saved);
        Some(saved)
    } else {
        None
    };
    let decision = shadow::ShadowDecision {
        id: 0,
        at_ms: crate::timing::unix_ms(),
        request_id: ex.id.clone(),
        namespace: ex.policy.namespace.clone(),
        model: ex.ingress.model.clone(),
        // Heads only: 10,000 decisions must not keep 10,000 long prompts.
        prompt: crate::feedback::preview(&keys.prompt),
        would,
        entry: candidate.id.to_string(),
        entry_prompt: crate::feedback::preview(&candidate.summary.prompt),
        similarity,
        threshold,
        guards: verdicts,
        verdict: None,
        would_save,
    };
    match state.feedback.shadow.record(decision) {
        Ok(d) => Some(d),
        Err(err) => {
            tracing::warn!(error = %err, "recording a shadow decision failed");
            None
        }
    }
}
