//! Replay, the stage that serves an entry: a hit (or a follower of an identical miss in flight)
//! gets a copy of the stored answer, rendered by [`crate::render`], with the response headers that
//! say what served it; the hit is noted on its entry and the request recorded once delivered.

use std::sync::Arc;
use std::time::Instant;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use tokio::sync::mpsc;

use crate::cache::{Flight, FlightEnd};
use crate::entry::{HitEvent, HitKind};
use crate::error::GatewayError;
use crate::outcome::{CacheOutcome, Completion};
use crate::pipeline::exchange::{Found, How};
use crate::pipeline::Exchange;
use crate::record::{set_cache_outcome, set_header, set_own_request_id, Finisher, Served};
use crate::render::{render, render_chunk, render_named, Fresh};
use crate::savings::{cost_header, tokens_header};
use crate::state::AppState;
use crate::timing::unix_ms;
use crate::timing::PhaseClock;

/// Serves an entry: a hit, or a follower once its leader's answer landed.
pub(crate) fn serve(state: &AppState, ex: &Exchange, found: Found) -> Response {
    let Found {
        entry,
        age_s,
        how,
        verified,
        verdict,
    } = found;
    let (stream, include_usage, pacing) = (ex.stream, ex.include_usage, ex.policy.pacing);
    let outcome = how.outcome();
    let similarity = how.similarity();
    let fresh = Fresh::new(ex.route());
    let mut clock: PhaseClock = ex.ingress.clock.clone();
    let mut meta = ex.record(outcome);
    let (id, ttft_cost_ms) = (entry.id(), entry.ttft_cost_ms());
    // The tokens the entry's answer cost upstream: what this hit did not spend. A coalesced
    // request waited for its leader's call, which was spent once for both.
    let tokens_saved = (!matches!(how, How::Coalesced)).then(|| {
        state.savings.saved(
            &entry,
            &ex.ingress.body,
            &ex.ingress.model,
            ex.policy.namespace.as_deref(),
        )
    });
    // The stored usage's completion tokens, as a miss's record takes them from the upstream's.
    clock.usage_tokens = tokens_saved
        .as_ref()
        .filter(|t| t.source == reprise_wire::TokenSource::Reported)
        .map(|t| t.output_tokens);
    let (source, content_type) = render(entry, &fresh, stream, include_usage, pacing, &mut clock);
    let phases = clock.phases(Instant::now());
    // A coalesced request waited for the upstream like its leader: it claims no saving.
    let saved = ttft_cost_ms
        .filter(|_| !matches!(how, How::Coalesced))
        .map(|cost| (cost - phases.ttft_ms.unwrap_or(0.0)).max(0.0));
    meta.served = Some(Served {
        entry: id,
        similarity,
        ttft_saved_ms: saved,
        saved: tokens_saved.clone(),
    });
    state.cache.note_hit(
        id,
        HitEvent {
            at_ms: unix_ms(),
            kind: how.kind(),
            similarity,
            request_id: ex.id.clone(),
            ttft_ms: phases.ttft_ms,
            ttft_saved_ms: saved,
        },
    );
    let body = Finisher::new(state.requests.clone(), meta, 200).body(
        source,
        clock,
        Completion::Complete,
        Completion::ClientDisconnected,
    );
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if stream {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    } else {
        set_header(headers, "server-timing", phases.server_timing());
    }
    set_cache_outcome(headers, outcome);
    set_own_request_id(headers, &ex.id, ex.route().provider().error_shape());
    crate::cors::apply(ex.cors.as_ref(), headers);
    set_header(headers, "x-reprise-entry", id.to_string());
    set_header(headers, "age", age_s.to_string());
    if let Some(saved) = saved {
        set_header(headers, "x-reprise-ttft-saved-ms", format!("{saved:.1}"));
    }
    if let Some(tokens) = &tokens_saved {
        set_header(headers, "x-reprise-tokens-saved", tokens_header(tokens));
        if let Some(cost) = tokens.cost_usd {
            set_header(headers, "x-reprise-cost-saved", cost_header(cost));
        }
    }
    if let Some(similarity) = similarity {
        set_header(headers, "x-reprise-similarity", format!("{similarity:.4}"));
    }
    if let Some(verified) = verified {
        set_header(headers, "x-reprise-verified", verified.name().to_owned());
    }
    if let Some(verdict) = verdict {
        set_header(headers, "x-reprise-verify", verdict);
    }
    if let Some(ms) = phases.judge_ms {
        // A streamed hit carries no Server-Timing header: the judge's wait is said here too.
        set_header(headers, "x-reprise-judge-ms", format!("{ms:.1}"));
    }
    response
}

const SSE: &str = "text/event-stream; charset=utf-8";

/// Follows the leader of an identical miss. Streaming followers of a streaming leader get its
/// chunks as they arrive; the others get the stored answer once it lands. `None` when the leader's
/// answer could not be cached before anything was sent to this client: it then goes upstream itself.
pub(crate) async fn follow(
    state: &AppState,
    ex: &Exchange,
    flight: &Arc<Flight>,
) -> Option<Response> {
    let coalesced = |entry| Found {
        entry,
        age_s: 0,
        how: How::Coalesced,
        verified: None,
        verdict: None,
    };
    if !(ex.stream && flight.leader_streams) {
        return match flight.end().await {
            FlightEnd::Stored(entry) => Some(serve(state, ex, coalesced(entry))),
            FlightEnd::Failed(_) | FlightEnd::Relayed(_) => None,
        };
    }
    let first = flight.next(0).await;
    // Joined a flight whose answer went over `max_entry_bytes` and let its start go: nothing was
    // sent yet, so this request goes upstream itself.
    if first.lagged {
        return None;
    }
    if first.chunks.is_empty() {
        match &first.end {
            Some(FlightEnd::Failed(_) | FlightEnd::Relayed(_)) => return None,
            // The flight ended before any chunk: the leader was served an entry instead (a semantic
            // hit found while its upstream request was in flight).
            Some(FlightEnd::Stored(entry)) => {
                return Some(serve(state, ex, coalesced(entry.clone())))
            }
            None => {}
        }
    }
    let fresh = Fresh::new(ex.route());
    let include_usage = ex.include_usage;
    let named = ex.route().framing().named_events;
    let api = crate::api::of(ex.route());
    // An Anthropic message's follower gets its own id, as a hit does.
    let renew = ex.route().framing().message_ids;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let mut clock = ex.ingress.clock.clone();
    let mut finisher = Finisher::new(
        state.requests.clone(),
        ex.record(CacheOutcome::Coalesced),
        200,
    );
    let cache = state.cache.clone();
    let flight = flight.clone();
    let (body, delivered) = Finisher::channel(rx);
    state.tasks.spawn(async move {
        let mut update = first;
        let mut seen = 0;
        // The last chunk sent, whose number an error event of a numbered stream follows.
        let mut last = None;
        let completion = loop {
            seen += update.chunks.len();
            if update.lagged {
                let err = GatewayError::UpstreamProtocol {
                    reason: "the stream broke off",
                    detail: "this client fell behind the coalesced leader's stream, which is too large to keep".into(),
                };
                let _ = tx.send(api.stream_error(&err, last.as_ref())).await;
                break Completion::StreamFailed;
            }
            for event in &update.chunks {
                let Some(chunk) = crate::cache::tape::chunk_of(event) else {
                    continue;
                };
                let chunk = &*last.insert(chunk);
                let now = Instant::now();
                let tokens = if named {
                    reprise_migrations::replay::named_event_tokens(chunk)
                } else {
                    crate::sse::chunk_tokens(chunk)
                };
                clock.tokens(now, tokens);
                if clock.first_token.is_none() {
                    clock.first_token = Some(now);
                }
                let rendered = if named {
                    Some(render_named(chunk, renew.then_some(&fresh)))
                } else {
                    render_chunk(chunk, &fresh, include_usage)
                };
                if let Some(bytes) = rendered {
                    if tx.send(bytes).await.is_err() {
                        break;
                    }
                }
            }
            match update.end {
                Some(FlightEnd::Stored(entry)) => {
                    // A follower that joined mid-flight saved only part of the prefill: no claim.
                    finisher.meta.served = Some(Served {
                        entry: entry.id(),
                        similarity: None,
                        ttft_saved_ms: None,
                        saved: None,
                    });
                    cache.note_hit(
                        entry.id(),
                        HitEvent {
                            at_ms: unix_ms(),
                            kind: HitKind::Coalesced,
                            similarity: None,
                            request_id: finisher.meta.id.clone(),
                            ttft_ms: clock.phases(Instant::now()).ttft_ms,
                            ttft_saved_ms: None,
                        },
                    );
                    let mut tail = clock.phases(Instant::now()).sse_comment().to_vec();
                    tail.extend_from_slice(if named { b"\n" } else { b"data: [DONE]\n\n" });
                    let _ = tx.send(Bytes::from(tail)).await;
                    break Completion::Complete;
                }
                Some(FlightEnd::Relayed(skipped)) => {
                    // The leader's answer was complete but not stored (too large, or refused by
                    // the rules): nothing served it.
                    finisher.meta.store_skipped = skipped;
                    let mut tail = clock.phases(Instant::now()).sse_comment().to_vec();
                    tail.extend_from_slice(if named { b"\n" } else { b"data: [DONE]\n\n" });
                    let _ = tx.send(Bytes::from(tail)).await;
                    break Completion::Complete;
                }
                Some(FlightEnd::Failed(error_events)) => {
                    // The error events the leader's client got, else one of the gateway's (its
                    // client left, or the answer could not be recorded).
                    let event = error_events.unwrap_or_else(|| {
                        let err = GatewayError::UpstreamProtocol {
                            reason: "the stream broke off",
                            detail: "the stream this request joined ended without a whole answer (its first client left, or it could not be recorded)".into(),
                        };
                        api.stream_error(&err, last.as_ref())
                    });
                    let _ = tx.send(event).await;
                    break Completion::StreamFailed;
                }
                None => update = flight.next(seen).await,
            }
        };
        drop(tx);
        finisher.after(delivered, None, clock, completion).await;
    });
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(SSE));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    set_cache_outcome(headers, CacheOutcome::Coalesced);
    set_own_request_id(headers, &ex.id, ex.route().provider().error_shape());
    crate::cors::apply(ex.cors.as_ref(), headers);
    Some(response)
}
