//! The entries of a response the provider deleted are forgotten: a hit must not hand out an id
//! that no longer resolves. The Responses API's own rules (keys, never-store, shapes of an answer)
//! are its adapter's, `api/responses.rs`; this file must not grow them back.

use std::sync::Arc;

use serde_json::Value;

use super::Cache;
use crate::api::Api;

/// The response id of `DELETE /v1/responses/{id}` (not of its sub-paths), when that is the request.
pub fn deleted_response(method: &http::Method, path: &str) -> Option<String> {
    let id = path.strip_prefix("/v1/responses/")?;
    (method == http::Method::DELETE && !id.is_empty() && !id.contains('/')).then(|| id.to_owned())
}

/// Drops the entries that serve response `id` to `tenant` (its label), once the provider deleted
/// it: a hit would hand out an id that no longer resolves, and a conversation continued from it
/// would fail. Scans the store (deleting a response is rare), so it runs on a blocking thread.
pub fn forget_deleted(cache: &Arc<Cache>, tenant: &str, id: &str) -> usize {
    let route = crate::api::responses::Responses.route().name();
    let mut doomed = Vec::new();
    let mut after = None;
    loop {
        let page = match cache.store.list(after, 256) {
            Ok(page) => page,
            Err(err) => {
                tracing::warn!(error = %err, "could not scan the store for a deleted response");
                return 0;
            }
        };
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        doomed.extend(
            page.iter()
                .filter(|e| e.summary.route == route && e.summary.tenant == tenant)
                .filter(|e| e.body.get("id").and_then(Value::as_str) == Some(id))
                .map(|e| e.id),
        );
    }
    let mut removed = 0;
    for entry in doomed {
        if cache.store.delete(entry).unwrap_or(false) {
            removed += 1;
        }
        if let Some(index) = &cache.index {
            index.remove(entry.0);
        }
    }
    tracing::debug!(removed, "forgot the entries of a response deleted upstream");
    removed
}
