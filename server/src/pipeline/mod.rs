//! The request path as code. [`handle`] calls the stages in the order `lib.rs` lists them, on one
//! [`Exchange`]: ingress, policy and key ([`Exchange::new`]), lookup ([`lookup::decide`]), then
//! replay on a hit or forward on a miss; downstream and record run as the response is delivered.

pub(crate) mod exchange;
pub(crate) mod forward;
pub(crate) mod lookup;
pub(crate) mod replay;
pub(crate) mod verify;

use std::time::Instant;

use axum::extract::Request;
use axum::response::Response;

pub(crate) use exchange::Exchange;
pub(crate) use lookup::Decision;

use crate::cache::{Flight, Recorder};
use crate::cors::{self, Asker};
use crate::ingress::{self, Route};
use crate::record::error_response;
use crate::state::AppState;
use lookup::PendingSearch;

/// Runs one request on a cacheable route through the pipeline.
#[tracing::instrument(name = "request", skip_all, fields(route = route.name(), id))]
pub(crate) async fn handle(state: AppState, route: Route, request: Request) -> Response {
    let started = Instant::now();
    let id = state.requests.next_id();
    tracing::Span::current().record("id", id.as_str());
    // Errors take the shape of the API the client speaks, and carry the CORS answer the upstream
    // gave the asker (a browser reads an error's status and message only with it).
    let shape = route.provider().error_shape();
    let browser = Asker::of(route.provider(), request.headers());
    let fail = |err| {
        let mut response = error_response(err, shape, &id);
        let answer = browser.as_ref().and_then(|b| state.upstream.cors.answer(b));
        cors::apply(answer.as_ref(), response.headers_mut());
        response
    };
    // 1. ingress
    let ingress = match ingress::read(route, request, state.config.max_body_bytes, started).await {
        Ok(ingress) => ingress,
        Err(err) => return fail(err),
    };
    // 2. policy and 3. key
    let mut ex = match Exchange::new(&state, ingress, id.clone(), browser.clone()) {
        Ok(ex) => ex,
        Err(err) => return fail(err),
    };
    // 4. lookup, then 5. replay or 6. forward (7. downstream and 8. record follow the response).
    match lookup::decide(&state, &mut ex).await {
        Decision::Hit(found) => replay::serve(&state, &ex, found),
        Decision::Follow(flight) => match replay::follow(&state, &ex, &flight).await {
            Some(response) => response,
            // The leader's answer could not be cached: go upstream like any miss.
            None => miss(&state, ex, None, None).await,
        },
        Decision::Miss { flight, search } => miss(&state, ex, flight, search).await,
    }
}

/// The forward stage of a miss. With a semantic search still running (`semantic_overlap`), the
/// upstream request is raced against it: a hit found before the upstream's first byte is served and
/// the upstream request cancelled; otherwise the upstream's answer is relayed, and the search's
/// vector is stored with it if it is ready by then.
async fn miss(
    state: &AppState,
    mut ex: Exchange,
    flight: Option<std::sync::Arc<Flight>>,
    search: Option<PendingSearch>,
) -> Response {
    let mut recorder = (ex.policy.store || flight.is_some()).then(|| {
        let mut recorder = Recorder::new(
            state.cache.clone(),
            ex.route(),
            ex.keys.clone(),
            ex.summary(),
            ex.policy.ttl_s,
            flight,
            ex.policy.store,
        );
        recorder.asked_usage = ex.stream && ex.include_usage;
        recorder
    });
    let started = match search {
        None => forward::start(state, forward::prepare(state, &ex)).await,
        Some(PendingSearch { mut task, vector }) => {
            let upstream = forward::start(state, forward::prepare(state, &ex));
            tokio::pin!(upstream);
            tokio::select! {
                biased;
                started = &mut upstream => {
                    // The upstream answered first: the search goes on, and its vector is stored
                    // with the answer if it is ready when the answer is complete.
                    if let Some(r) = recorder.as_mut() {
                        r.vector_later = Some(vector);
                    }
                    state.requests.stats.overlap(false);
                    started
                }
                searched = &mut task => {
                    let searched = searched.unwrap_or_default();
                    if let Some(found) = lookup::apply_search(state, &mut ex, searched, false).await {
                        // Dropping `upstream` cancels the request: the hit is served instead.
                        state.requests.stats.overlap(true);
                        if let Some(r) = recorder {
                            r.served_instead(found.entry.clone());
                        }
                        return replay::serve(state, &ex, found);
                    }
                    upstream.await
                }
            }
        }
    };
    if let Some(r) = recorder.as_mut() {
        r.vector = ex.vector.take();
    }
    let mut notes = axum::http::HeaderMap::new();
    ex.misses.annotate(&mut notes);
    let mut response = forward::relay(state, ex, started, recorder).await;
    response.headers_mut().extend(notes);
    response
}
