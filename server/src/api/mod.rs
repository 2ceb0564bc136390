//! One adapter per API: what differs between chat completions, legacy completions, embeddings and
//! the Responses API (so far: which body fields are in the keys and what a request says about
//! caching) lives in one file each, behind the small [`Api`] trait. Stages ask `api::of(route)`; they
//! do not match on [`Route`]. This wing must not import above floor 2 (entries, keys, ingress,
//! policy and the ground floor): the cache and the renderer below the pipeline call it.
//!
//! The adapters are trait objects (`&'static dyn Api`), not an enum with a `match` per method: a
//! new API (Anthropic's Messages next) is then one new file, one arm in [`of`], a [`Route`] variant
//! and a router line, and no stage or method body changes. The calls are a few per request, so the
//! indirect call costs nothing that shows.
//!
//! What stays on [`Route`] in `ingress.rs`: its name, upstream path and the fields ingress checks,
//! because ingress, below this floor, needs them.

mod adapter;
pub mod chat;
pub mod completions;
pub mod embeddings;
pub mod responses;

pub use adapter::Api;

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
    }
}

/// Builds both keys and the prompt of a request under its route's rules ([`crate::key`]).
pub fn keys(input: &KeyInput<'_>) -> Result<Keys, GatewayError> {
    let api = of(input.route);
    crate::key::build(input, &|body, partition| api.turn(body, partition))
}
