//! Lookup, the stage between the key and the upstream: serve a hit, join an identical miss already
//! in flight, or send the request upstream with a recorder that will store a clean answer.

use std::sync::Arc;
use std::time::Instant;

use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::cache::{Flight, Join, Recorder};
use crate::downstream::{Delivered, Delivery, Source};
use crate::entry::{Entry, HitEvent, HitKind, RequestSummary};
use crate::error::GatewayError;
use crate::feedback::{self, Encounter, Met, PromptKey};
use crate::forward::{self, set_cache_outcome, set_request_id, RecordMeta, Served};
use crate::guard::Guards;
use crate::ingress::{Ingress, Route};
use crate::key::Tenant;
use crate::policy::{self, Pacing};
use crate::record::{unix_ms, Completion};
use crate::replay::{self, Fresh};
use crate::timing::PhaseClock;
use crate::AppState;

/// Runs the cache stages for a parsed request and returns the response.
pub async fn handle(state: &AppState, mut ingress: Ingress, request_id: String) -> Response {
    let live = state.live.current();
    let policy = match policy::from_headers(&ingress.headers, &live.defaults_for(&ingress.headers))
    {
        Ok(p) => p,
        Err(err) => return error_response(err, &request_id),
    };
    let tenant = Tenant::from_headers(&ingress.headers, state.cache.settings.share_across_keys);
    let keys = match crate::key::build(&crate::key::KeyInput {
        route: ingress.route,
        body: &ingress.body,
        tenant,
        namespace: policy.namespace.as_deref(),
    }) {
        Ok(k) => k,
        Err(err) => return error_response(err, &request_id),
    };
    let include_usage = ingress
        .body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    // Embeddings are never streamed, whatever the body says.
    let stream = ingress.stream && ingress.route != Route::Embeddings;
    // A client may ask for stricter matching than the operator's floor, never for looser.
    let floor = live.threshold_floor(policy.namespace.as_deref());
    if let Some(t) = policy.threshold.filter(|t| *t < floor) {
        let err = GatewayError::invalid(
            format!("`x-reprise-threshold: {t}` is below the configured floor of {floor}; a request may only raise it."),
            Some("x-reprise-threshold"),
        );
        return error_response(err, &request_id);
    }
    let threshold = policy.threshold.unwrap_or(floor);

    // What feedback on this request will need to know about the entry it met. The prompt's
    // feedback key is hashed once, and only when a path needs it.
    let prompt_key = std::sync::OnceLock::new();
    let prompt_key = || *prompt_key.get_or_init(|| PromptKey::of(&keys.prompt));
    let note = |met, entry, similarity| {
        state.feedback.note(
            &request_id,
            Encounter {
                met,
                entry,
                partition: keys.partition,
                prompt: prompt_key(),
                preview: feedback::preview(&keys.prompt),
                similarity,
            },
        )
    };
    if policy.lookup {
        if let Some(hit) = state.cache.lookup(&keys.exact, &policy) {
            ingress.clock.looked_up = Some(Instant::now());
            note(Met::Hit, hit.entry.id, None);
            return respond_entry(
                state,
                &ingress,
                &request_id,
                &hit.entry,
                hit.age_s,
                Found::Exact,
                stream,
                include_usage,
                policy.pacing,
            );
        }
    }
    let semantic_lookup = policy.lookup && policy.semantic && state.semantic.is_some();
    if semantic_lookup {
        // A paraphrase served before: the same answer, without embedding it again.
        // The guards are checked again: they may have been turned on since the alias was made.
        // An alias an operator approved is served as it is (a veto of the same pair withdraws the
        // approval); a remembered one only while feedback allows the pair.
        let alias =
            feedback::approved_hit(&state.feedback, &state.cache, &keys, &prompt_key(), &policy)
                .or_else(|| {
                    state
                        .cache
                        .lookup_alias(&keys.exact, &keys.partition, threshold, &policy)
                        .filter(|(hit, similarity)| {
                            live.semantic_guards
                                .refuses_texts(&keys.prompt, &hit.entry.summary.prompt)
                                .is_none()
                                && state
                                    .feedback
                                    .allows(hit.entry.id, &prompt_key(), *similarity)
                        })
                });
        if let Some((hit, similarity)) = alias {
            ingress.clock.looked_up = Some(Instant::now());
            note(Met::SemanticHit, hit.entry.id, Some(similarity));
            return respond_entry(
                state,
                &ingress,
                &request_id,
                &hit.entry,
                hit.age_s,
                Found::Similar(similarity),
                stream,
                include_usage,
                policy.pacing,
            );
        }
    }
    // Semantic stage: embed for a search (lookup allowed) and/or to store the vector with the answer.
    let mut nearest = None;
    let mut nearest_guard = None;
    let mut vector = None;
    let mut shadowed = None;
    let mut vetoed = None;
    if let Some(semantic) = state
        .semantic
        .as_ref()
        .filter(|_| ingress.route != Route::Embeddings)
    {
        // Shadow mode searches for the nearest live candidate, at any similarity and unguarded,
        // and judges it below, to record what `on` would have done.
        let shadow = policy.lookup && policy.shadow;
        let search = (policy.lookup && policy.semantic) || shadow;
        if search || policy.store {
            let (floor, guards) = if shadow {
                (f32::NEG_INFINITY, Guards::default())
            } else {
                (threshold, live.semantic_guards)
            };
            let mut outcome = semantic
                .lookup(
                    &state.cache.store,
                    &keys,
                    floor,
                    guards,
                    search,
                    policy.max_age_s,
                )
                .await;
            if let (Some(entry), Some(similarity), false) =
                (outcome.nearest_entry, outcome.nearest, shadow)
            {
                // Noted as a near miss; a hit below overwrites it.
                note(Met::NearMiss, entry, Some(similarity));
            }
            if shadow {
                if let Some((entry, similarity)) = outcome.hit.take() {
                    shadowed = crate::shadow::record(
                        state,
                        &request_id,
                        &ingress,
                        &policy,
                        &keys,
                        &prompt_key(),
                        &entry,
                        similarity,
                        threshold,
                    );
                    note(Met::Shadow, entry.id, Some(similarity));
                }
            }
            // A pair an operator said was wrong is never served again.
            if let Some((entry, similarity)) = outcome
                .hit
                .take_if(|(e, s)| !state.feedback.allows(e.id, &prompt_key(), *s))
            {
                vetoed = Some(entry.id);
                tracing::debug!(entry = %entry.id, similarity, "semantic hit vetoed by feedback");
            }
            ingress.clock.embed_ms = outcome.embed_ms;
            ingress.clock.search_ms = outcome.search_ms;
            nearest = outcome.nearest;
            nearest_guard = outcome.nearest_guard;
            vector = outcome.vector;
            if let Some(guard) = outcome.refused {
                state.requests.stats.guard_refused(guard);
            }
            if let Some((entry, similarity)) = outcome.hit {
                let entry = Arc::new(entry);
                ingress.clock.looked_up = Some(Instant::now());
                note(Met::SemanticHit, entry.id, Some(similarity));
                if policy.store {
                    state.cache.remember_alias(keys.exact, entry.id, similarity);
                }
                let age_s = entry.age_s(unix_ms());
                return respond_entry(
                    state,
                    &ingress,
                    &request_id,
                    &entry,
                    age_s,
                    Found::Similar(similarity),
                    stream,
                    include_usage,
                    policy.pacing,
                );
            }
        }
    }
    ingress.clock.looked_up = Some(Instant::now());
    let summary = RequestSummary {
        route: ingress.route.name().to_owned(),
        model: ingress.model.clone(),
        namespace: policy.namespace.clone(),
        tenant: tenant.label(),
        prompt: keys.prompt.clone(),
        stream,
    };
    let mut flight = None;
    if policy.lookup || policy.store {
        match state.cache.join(keys.exact, stream, policy.store) {
            Some(Join::Follower(leader)) if policy.lookup => {
                if let Some(response) = follow(
                    state,
                    &ingress,
                    &request_id,
                    &leader,
                    stream,
                    include_usage,
                    policy.pacing,
                )
                .await
                {
                    return response;
                }
                // The leader's answer could not be cached: go upstream like any miss.
            }
            Some(Join::Leader(f)) => flight = Some(f),
            _ => {}
        }
    }
    let recorder = (policy.store || flight.is_some()).then(|| {
        let mut r = Recorder::new(
            state.cache.clone(),
            ingress.route,
            keys.clone(),
            summary,
            policy.ttl_s,
            flight,
            policy.store,
        );
        r.vector = vector;
        r
    });
    let mut response = forward::relay_json(
        state,
        ingress,
        request_id,
        policy::miss_outcome(&policy),
        forward::Nearest {
            similarity: nearest,
            guard: nearest_guard,
        },
        recorder,
    )
    .await;
    if let Some(nearest) = nearest {
        // What the best candidate scored, so thresholds can be tuned from real traffic.
        set_header(
            response.headers_mut(),
            "x-reprise-nearest",
            format!("{nearest:.4}"),
        );
    }
    if let Some(decision) = shadowed {
        // What `on` would have served: the response itself is the upstream's.
        set_header(
            response.headers_mut(),
            "x-reprise-shadow",
            decision.header(),
        );
    }
    if let Some(entry) = vetoed {
        set_header(
            response.headers_mut(),
            "x-reprise-vetoed",
            entry.to_string(),
        );
    }
    if let Some(guard) = nearest_guard {
        // A guard refuses the best candidate: no threshold would serve it.
        set_header(
            response.headers_mut(),
            "x-reprise-guard",
            guard.name().to_owned(),
        );
    }
    response
}

/// An error response that still names its request.
pub fn error_response(err: GatewayError, request_id: &str) -> Response {
    let mut response = err.into_response();
    set_request_id(response.headers_mut(), request_id);
    response
}

/// Waits for the leader of an identical miss. Streaming followers of a streaming leader get its
/// chunks as they arrive; the others get the stored answer once it lands. `None` when the leader's
/// answer could not be cached before anything was sent to this client.
async fn follow(
    state: &AppState,
    ingress: &Ingress,
    request_id: &str,
    flight: &Arc<Flight>,
    stream: bool,
    include_usage: bool,
    pacing: Pacing,
) -> Option<Response> {
    if !(stream && flight.leader_streams) {
        let entry = loop {
            let update = flight.next(usize::MAX).await;
            if let Some(done) = update.done {
                break done?;
            }
        };
        return Some(respond_entry(
            state,
            ingress,
            request_id,
            &entry,
            0,
            Found::Coalesced,
            stream,
            include_usage,
            pacing,
        ));
    }
    let first = flight.next(0).await;
    if first.chunks.is_empty() && matches!(first.done, Some(None)) {
        return None;
    }
    let fresh = Fresh::new(ingress.route);
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let mut clock = ingress.clock.clone();
    let mut meta = meta_for(ingress, request_id, "coalesced");
    let log = state.requests.clone();
    let cache = state.cache.clone();
    let flight = flight.clone();
    let (delivered_tx, delivered_rx) = tokio::sync::oneshot::channel::<Delivered>();
    state.tasks.spawn(async move {
        let mut update = first;
        let mut seen = 0;
        let completion = loop {
            seen += update.chunks.len();
            for chunk in &update.chunks {
                let now = Instant::now();
                clock.tokens(now, crate::sse::chunk_tokens(chunk));
                if clock.first_token.is_none() {
                    clock.first_token = Some(now);
                }
                if let Some(bytes) = replay::render_chunk(chunk, &fresh, include_usage) {
                    if tx.send(bytes).await.is_err() {
                        break;
                    }
                }
            }
            match update.done {
                Some(Some(entry)) => {
                    // A follower that joined mid-flight saved only part of the prefill: no claim.
                    meta.served = Some(Served {
                        entry: entry.id,
                        similarity: None,
                        ttft_saved_ms: None,
                    });
                    cache.note_hit(
                        entry.id,
                        HitEvent {
                            at_ms: unix_ms(),
                            kind: HitKind::Coalesced,
                            similarity: None,
                            request_id: meta.id.clone(),
                            ttft_ms: clock.phases(Instant::now()).ttft_ms,
                            ttft_saved_ms: None,
                        },
                    );
                    let mut tail = clock.phases(Instant::now()).sse_comment().to_vec();
                    tail.extend_from_slice(b"data: [DONE]\n\n");
                    let _ = tx.send(Bytes::from(tail)).await;
                    break Completion::Complete;
                }
                Some(None) => {
                    let err = GatewayError::UpstreamProtocol {
                        reason: "the stream broke off",
                        detail: "the coalesced leader's stream failed".into(),
                    };
                    let _ = tx.send(err.sse_event()).await;
                    break Completion::StreamFailed;
                }
                None => update = flight.next(seen).await,
            }
        };
        drop(tx);
        let completion = match delivered_rx.await {
            Ok(Delivered::Complete(at)) => {
                clock.delivered = Some(at);
                completion
            }
            _ => Completion::ClientDisconnected,
        };
        meta.finish(&log, 200, completion, &clock);
    });
    let delivery = Delivery::new(Source::Channel(rx), move |how| {
        let _ = delivered_tx.send(how);
    });
    let mut response = Response::new(delivery.into_body());
    let headers = response.headers_mut();
    sse_headers(headers);
    set_cache_outcome(headers, "coalesced");
    set_request_id(headers, request_id);
    Some(response)
}

fn meta_for(ingress: &Ingress, request_id: &str, cache: &'static str) -> RecordMeta {
    RecordMeta {
        id: request_id.to_owned(),
        started_at_ms: unix_ms().saturating_sub(ingress.clock.start.elapsed().as_millis() as u64),
        method: "POST".into(),
        route: ingress.route.name().to_owned(),
        model: Some(ingress.model.clone()),
        stream: ingress.stream,
        cache,
        served: None,
        nearest: forward::Nearest::default(),
        error: None,
    }
}

fn sse_headers(headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
}

fn set_header(headers: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// How a request came to be served from an entry.
#[derive(Clone, Copy)]
enum Found {
    Exact,
    Similar(f32),
    /// An identical miss in flight landed.
    Coalesced,
}

/// Serves a stored entry: a hit, or a coalesced request once its leader's answer landed.
#[allow(clippy::too_many_arguments)]
fn respond_entry(
    state: &AppState,
    ingress: &Ingress,
    request_id: &str,
    entry: &Arc<Entry>,
    age_s: u64,
    found: Found,
    stream: bool,
    include_usage: bool,
    pacing: Pacing,
) -> Response {
    let (kind, outcome, similarity) = match found {
        Found::Exact => (HitKind::Hit, "hit", None),
        Found::Similar(s) => (HitKind::SemanticHit, "semantic-hit", Some(s)),
        Found::Coalesced => (HitKind::Coalesced, "coalesced", None),
    };
    let fresh = Fresh::new(ingress.route);
    let mut clock: PhaseClock = ingress.clock.clone();
    let mut meta = meta_for(ingress, request_id, outcome);
    let log = state.requests.clone();
    let (source, content_type) = if stream {
        let events = replay::stream_events(entry, &fresh, include_usage, pacing);
        clock.first_token = Some(Instant::now());
        if matches!(pacing, Pacing::Instant) {
            // The first token leaves before the rest of a long answer is rendered: the head goes
            // out, the task yields once so the server flushes it, then the rest follows.
            let tokens: u32 = entry
                .events
                .iter()
                .map(|e| crate::sse::chunk_tokens(&e.data))
                .sum();
            clock.tokens(clock.first_token.unwrap_or_else(Instant::now), tokens);
            let split = replay::head_len(entry);
            let head = Bytes::from(replay::render_range(entry, &fresh, include_usage, 0, split));
            let (entry, clock_at_head) = (entry.clone(), clock.clone());
            let rest = async move {
                tokio::task::yield_now().await;
                let mut rest =
                    replay::render_range(&entry, &fresh, include_usage, split, entry.events.len());
                rest.extend_from_slice(&clock_at_head.phases(Instant::now()).sse_comment());
                rest.extend_from_slice(b"data: [DONE]\n\n");
                Bytes::from(rest)
            };
            let body = futures_util::stream::once(std::future::ready(head))
                .chain(futures_util::stream::once(rest))
                .boxed();
            (Source::Replay(body), "text/event-stream; charset=utf-8")
        } else {
            let clock_at_start = clock.clone();
            let tail = futures_util::stream::once(async move {
                let mut tail = clock_at_start.phases(Instant::now()).sse_comment().to_vec();
                tail.extend_from_slice(b"data: [DONE]\n\n");
                Bytes::from(tail)
            });
            (
                Source::Replay(replay::paced(events).chain(tail).boxed()),
                "text/event-stream; charset=utf-8",
            )
        }
    } else {
        let body = replay::body(entry, &fresh);
        clock.first_token = Some(Instant::now());
        clock.last_token = clock.first_token;
        (Source::Once(Some(body)), "application/json")
    };
    let phases = clock.phases(Instant::now());
    // A coalesced request waited for the upstream like its leader: it claims no saving.
    let saved = entry
        .ttft_cost_ms()
        .filter(|_| !matches!(found, Found::Coalesced))
        .map(|cost| (cost - phases.ttft_ms.unwrap_or(0.0)).max(0.0));
    meta.served = Some(Served {
        entry: entry.id,
        similarity,
        ttft_saved_ms: saved,
    });
    state.cache.note_hit(
        entry.id,
        HitEvent {
            at_ms: unix_ms(),
            kind,
            similarity,
            request_id: request_id.to_owned(),
            ttft_ms: phases.ttft_ms,
            ttft_saved_ms: saved,
        },
    );
    let delivery = Delivery::new(source, move |how| {
        let completion = match how {
            Delivered::Complete(at) => {
                clock.delivered = Some(at);
                Completion::Complete
            }
            _ => Completion::ClientDisconnected,
        };
        meta.finish(&log, 200, completion, &clock);
    });
    let mut response = Response::new(delivery.into_body());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if stream {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    } else {
        set_header(headers, "server-timing", phases.server_timing());
    }
    set_cache_outcome(headers, outcome);
    set_request_id(headers, request_id);
    set_header(headers, "x-reprise-entry", entry.id.to_string());
    set_header(headers, "age", age_s.to_string());
    if let Some(saved) = saved {
        set_header(headers, "x-reprise-ttft-saved-ms", format!("{saved:.1}"));
    }
    if let Some(similarity) = similarity {
        set_header(headers, "x-reprise-similarity", format!("{similarity:.4}"));
    }
    response
}
