//! One adapter per API: what differs between chat completions, legacy completions, embeddings and
//! the Responses API and Anthropic's Messages API (which body fields and headers are in the keys, what is never cached, how an answer is
//! assembled from a stream and re-chunked for a replay, which ids a hit renews, how an answer is
//! warmed) lives in one file each, behind the small [`Api`] trait. Stages ask `api::of(route)`; they
//! do not match on [`Route`]. This wing must not import above floor 2 (entries, keys, ingress,
//! policy and the ground floor): the cache and the renderer below the pipeline call it.
//!
//! The adapters are trait objects (`&'static dyn Api`), not an enum with a `match` per method: a
//! new API (Anthropic's Messages was one) is then one new file, one arm in [`of`], a [`Route`] variant
//! and a router line, and no stage or method body changes. The calls are a few per request, so the
//! indirect call costs nothing that shows.
//!
//! What stays on [`Route`] in `ingress.rs`: its name, upstream path, the fields ingress checks and
//! the SSE framing of its stream ([`crate::ingress::Framing`]), because files below this floor need
//! them (ingress itself, and the store rebuilding a replay record from an entry that knows its
//! route only by name).

mod adapter;
pub mod chat;
pub(crate) mod choices;
pub mod completions;
pub mod embeddings;
pub mod messages;
pub mod responses;

pub(crate) use adapter::pieces;
pub use adapter::{Api, Uncacheable, Warm};

use crate::error::GatewayError;
use crate::ingress::Route;
use crate::key::{KeyInput, Keys};

/// The adapter of a route.
pub fn of(route: Route) -> &'static dyn Api {
    match route {
        Route::ChatCompletions => &chat::Chat,
        Route::Completions => &completions::Completions,
        Route::Embeddings => &embeddings::Embeddings,
        Route::Responses => &responses::Responses,
        Route::Messages => &messages::Messages,
    }
}

/// The adapter of a route known by name (entries keep their route as a name).
pub fn named(name: &str) -> Option<&'static dyn Api> {
    Route::from_name(name).map(of)
}

/// Builds both keys and the prompt of a request under its route's rules ([`crate::key`]).
pub fn keys(input: &KeyInput<'_>) -> Result<Keys, GatewayError> {
    let api = of(input.route);
    crate::key::build(input, &|body, partition| {
        for name in api.key_headers() {
            partition.field(
                &format!("header.{name}"),
                header_value(input.headers, name).as_bytes(),
            );
        }
        api.turn(body, partition)
    })
}

/// A keyed header's canonical value: every value of the header, split at commas (a list header
/// such as `anthropic-beta` may come as one line or several, in any order), trimmed, sorted and
/// deduplicated; empty when the request does not send it.
fn header_value(headers: &http::HeaderMap, name: &str) -> String {
    let mut items: Vec<&str> = headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    items.sort_unstable();
    items.dedup();
    items.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_its_adapter_by_name() {
        for route in Route::ALL {
            assert_eq!(named(route.name()).map(|api| api.route()), Some(route));
            assert_eq!(of(route).route(), route);
        }
        assert!(named("passthrough").is_none());
    }
}
