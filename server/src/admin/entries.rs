//! Admin routes over stored entries: list (newest first, filtered, paginated), semantic search over
//! cached prompts, show one with its hit history, delete, invalidate by criteria, flush.
//!
//! Store and index work runs on blocking threads. A deletion removes the entry from the store and
//! its vector from the index, so it can never be served again.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::json::AdminJson;
use crate::embed::EmbedError;
use crate::entry::{Entry, EntryId, HitEvent};
use crate::error::GatewayError;
use crate::index::VectorIndex;
use crate::state::AppState;
use crate::store::Store;
use crate::timing::unix_ms;
use crate::timing::Phases;

const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 200;
/// Characters of the answer shown in listings.
const PREVIEW_CHARS: usize = 200;
/// Entries read per store call while filtering a listing.
const SCAN_PAGE: usize = 256;

#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct EntriesQuery {
    /// Only entries of this namespace.
    pub namespace: Option<String>,
    /// Only entries of this model.
    pub model: Option<String>,
    /// Semantic search over the cached prompts: results by similarity, no pagination.
    pub q: Option<String>,
    /// Page size, 1 to 200 (default 20).
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// One entry as listed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct EntrySummary {
    pub id: String,
    pub object: String,
    pub route: String,
    pub model: String,
    pub namespace: Option<String>,
    /// 16 hex digits of the client key's hash, or `shared`.
    pub tenant: String,
    pub prompt: String,
    pub stream: bool,
    /// The start of the answer.
    pub answer_preview: String,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub age_s: u64,
    pub hit_count: u64,
    /// `null` when never hit.
    pub last_hit_ms: Option<u64>,
    /// Encoded size in the store.
    pub bytes: u64,
    /// Network and prefill time of the miss that stored it: what each hit saves.
    pub ttft_cost_ms: Option<f64>,
    /// Content chunks of the answer.
    pub tokens: u64,
    /// Pre-loaded through `POST /admin/entries`.
    pub warmed: bool,
    /// Similarity to `q` (searches only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub similarity: Option<f32>,
}

/// One entry in full.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EntryDetail {
    #[serde(flatten)]
    pub summary: EntrySummary,
    /// The exact key and the semantic partition, hex.
    pub key: String,
    pub partition: String,
    pub answer: String,
    /// The answer as one OpenAI response object.
    #[schema(value_type = Object)]
    pub body: Value,
    /// Stream events stored.
    pub events: usize,
    #[schema(value_type = Option<Object>)]
    pub usage: Option<Value>,
    /// Phases of the miss that stored it.
    pub phases: Phases,
    pub has_vector: bool,
    /// The latest hits, oldest first.
    pub hit_history: Vec<HitEvent>,
    /// The verdicts (judge and operators) its near matches met, and the thresholds they set.
    pub verdicts: crate::verify::budget::EntryCurve,
    /// The entry's own floor, raised by operators' `wrong` verdicts: no candidate below it is
    /// served.
    pub entry_threshold: Option<f32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EntryPage {
    pub object: String,
    pub data: Vec<EntrySummary>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// The text of an answer: the first choice's message (or tool calls) or completion text.
pub(crate) fn answer_text(body: &Value) -> String {
    if body.get("object").and_then(Value::as_str) == Some("response") {
        return response_text(body);
    }
    let Some(choice) = body.pointer("/choices/0") else {
        return match body.get("data").and_then(Value::as_array) {
            Some(data) => format!("[{} embedding vector(s)]", data.len()),
            None => String::new(),
        };
    };
    if let Some(text) = choice.get("text").and_then(Value::as_str) {
        return text.to_owned();
    }
    let message = choice.get("message");
    match message
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
    {
        Some(text) if !text.is_empty() => text.to_owned(),
        _ => message
            .and_then(|m| m.get("tool_calls"))
            .map(|t| format!("[tool calls] {t}"))
            .unwrap_or_default(),
    }
}

/// A Responses API answer's text: its `output_text` parts, or its function calls.
fn response_text(body: &Value) -> String {
    let items = body.get("output").and_then(Value::as_array);
    let mut text = String::new();
    for item in items.into_iter().flatten() {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                let parts = item.get("content").and_then(Value::as_array);
                for part in parts.into_iter().flatten() {
                    text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
                }
            }
            Some("function_call") => text.push_str(&format!(
                "[function call] {}({})",
                item.get("name").and_then(Value::as_str).unwrap_or(""),
                item.get("arguments").and_then(Value::as_str).unwrap_or("")
            )),
            _ => {}
        }
    }
    text
}

fn summary(entry: &Entry, now: u64, similarity: Option<f32>) -> EntrySummary {
    let answer = answer_text(&entry.body);
    let preview = match answer.char_indices().nth(PREVIEW_CHARS) {
        Some((cut, _)) => format!("{}…", &answer[..cut]),
        None => answer,
    };
    let s = &entry.summary;
    EntrySummary {
        id: entry.id.to_string(),
        object: "reprise.entry".to_owned(),
        route: s.route.clone(),
        model: s.model.clone(),
        namespace: s.namespace.clone(),
        tenant: s.tenant.clone(),
        prompt: s.prompt.clone(),
        stream: s.stream,
        answer_preview: preview,
        created_at_ms: entry.created_at_ms,
        expires_at_ms: entry.expires_at_ms(),
        age_s: entry.age_s(now),
        hit_count: entry.hit_count,
        last_hit_ms: (entry.last_hit_ms > 0).then_some(entry.last_hit_ms),
        // The store's encoding is the JSON plus a 33-byte header.
        bytes: serde_json::to_vec(entry).map_or(0, |v| v.len() as u64 + 33),
        ttft_cost_ms: entry.ttft_cost_ms(),
        tokens: entry.phases.tokens.max(entry.events.len() as u64),
        warmed: entry.warmed,
        similarity,
    }
}

fn parse_id(raw: &str, param: &str) -> Result<EntryId, GatewayError> {
    raw.parse().map_err(|()| {
        GatewayError::invalid(
            format!("`{raw}` is not an entry id (they look like e_00000000002a)."),
            Some(param),
        )
    })
}

/// Runs blocking store work off the async workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, GatewayError> + Send + 'static,
) -> Result<T, GatewayError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| GatewayError::Internal {
            detail: format!("admin task failed: {e}"),
        })?
}

fn store_error(err: crate::store::StoreError) -> GatewayError {
    GatewayError::Internal {
        detail: format!("admin store access: {err}"),
    }
}

/// Embeds an operator's text with the gateway's own model.
async fn embed(
    state: &AppState,
    text: &str,
    param: &'static str,
) -> Result<Vec<f32>, GatewayError> {
    let Some(semantic) = &state.semantic else {
        return Err(GatewayError::SemanticDisabled {
            what: if param == "q" {
                "Searching entries by meaning"
            } else {
                "Invalidating by similarity"
            },
            why: state
                .semantic_disabled
                .as_deref()
                .unwrap_or("semantic matching is off")
                .to_owned(),
            param,
        });
    };
    if text.trim().is_empty() {
        return Err(GatewayError::invalid(
            format!("`{param}` must not be empty."),
            Some(param),
        ));
    }
    semantic.embedder.embed(text).await.map_err(|e| match e {
        // Busy now, not broken: a 503 the caller can retry, not a 500.
        EmbedError::Overloaded | EmbedError::Timeout => {
            GatewayError::EmbedderBusy { what: "the query" }
        }
        other => GatewayError::Internal {
            detail: format!("embedding an admin query: {other}"),
        },
    })
}

fn matches(entry: &Entry, namespace: Option<&str>, model: Option<&str>) -> bool {
    namespace.is_none_or(|n| entry.summary.namespace.as_deref() == Some(n))
        && model.is_none_or(|m| entry.summary.model == m)
}

/// Lists entries newest first, or searches them by meaning with `q`.
#[utoipa::path(get, path = "/admin/entries", tag = "admin", params(EntriesQuery),
    responses((status = 200, body = EntryPage), (status = 400, description = "Bad limit, cursor or query")),
    security(("admin_token" = [])))]
pub(crate) async fn list(
    State(state): State<AppState>,
    query: Result<Query<EntriesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EntryPage>, GatewayError> {
    let Query(query) = query.map_err(|e| {
        // Only the numeric field can fail to parse.
        let param = e.body_text().contains("limit").then_some("limit");
        GatewayError::invalid(format!("Invalid query: {e}."), param)
    })?;
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(GatewayError::invalid(
            format!("`limit` must be from 1 to {MAX_LIMIT}."),
            Some("limit"),
        ));
    }
    let store = state.cache.store.clone();
    let EntriesQuery {
        namespace,
        model,
        q,
        cursor,
        ..
    } = query;
    if let Some(q) = q {
        let vector = embed(&state, &q, "q").await?;
        let index = state.semantic.as_ref().map(|s| s.index.clone());
        let data = blocking(move || {
            let Some(index) = index else {
                return Ok(Vec::new());
            };
            let now = unix_ms();
            // Every vector is scored anyway; ranking them all lets filters, and vectors of entries
            // that are gone, drop candidates without shortening the page.
            let mut out = Vec::new();
            for n in index.scan_all(&vector, -1.0, index.len()) {
                let Some(entry) = store.get(EntryId(n.id)).map_err(store_error)? else {
                    index.remove(n.id);
                    continue;
                };
                if entry.is_expired(now) || !matches(&entry, namespace.as_deref(), model.as_deref())
                {
                    continue;
                }
                out.push(summary(&entry, now, Some(n.similarity)));
                if out.len() == limit {
                    break;
                }
            }
            Ok(out)
        })
        .await?;
        return Ok(Json(EntryPage {
            object: "list".to_owned(),
            data,
            has_more: false,
            next_cursor: None,
        }));
    }
    let mut before = cursor
        .as_deref()
        .map(|c| parse_id(c, "cursor"))
        .transpose()?;
    let (data, has_more) = blocking(move || {
        let now = unix_ms();
        let mut found: Vec<EntrySummary> = Vec::new();
        'scan: loop {
            let page = store.list_newest(before, SCAN_PAGE).map_err(store_error)?;
            let Some(last) = page.last() else {
                break;
            };
            before = Some(last.id);
            for entry in &page {
                if !entry.is_expired(now) && matches(entry, namespace.as_deref(), model.as_deref())
                {
                    found.push(summary(entry, now, None));
                    // One more than asked says whether there is a next page.
                    if found.len() > limit {
                        break 'scan;
                    }
                }
            }
        }
        let has_more = found.len() > limit;
        found.truncate(limit);
        Ok((found, has_more))
    })
    .await?;
    let next_cursor = has_more
        .then(|| data.last().map(|e| e.id.clone()))
        .flatten();
    Ok(Json(EntryPage {
        object: "list".to_owned(),
        data,
        has_more,
        next_cursor,
    }))
}

/// One entry with its answer, the phases of the miss that stored it and its latest hits.
#[utoipa::path(get, path = "/admin/entries/{id}", tag = "admin",
    params(("id" = String, Path, description = "Entry id, e.g. e_00000000002a")),
    responses((status = 200, body = EntryDetail), (status = 404, description = "No such entry")),
    security(("admin_token" = [])))]
pub(crate) async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<EntryDetail>, GatewayError> {
    let parsed = parse_id(&id, "id")?;
    let store = state.cache.store.clone();
    let entry = blocking(move || store.get(parsed).map_err(store_error))
        .await?
        .ok_or(GatewayError::EntryNotFound { id })?;
    let now = unix_ms();
    Ok(Json(EntryDetail {
        summary: summary(&entry, now, None),
        key: crate::key::hex(&entry.key.0),
        partition: crate::key::hex(&entry.partition.0),
        answer: answer_text(&entry.body),
        events: entry.events.len(),
        has_vector: entry.vector.is_some(),
        body: entry.body,
        usage: entry.usage,
        phases: entry.phases,
        hit_history: entry.hit_history,
        verdicts: state.feedback.observations.entry(entry.id),
        entry_threshold: state.feedback.entry_threshold(entry.id),
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Deleted {
    pub id: String,
    pub object: String,
    pub deleted: bool,
}

/// Deletes one entry (store and index).
#[utoipa::path(delete, path = "/admin/entries/{id}", tag = "admin",
    params(("id" = String, Path, description = "Entry id")),
    responses((status = 200, body = Deleted), (status = 404, description = "No such entry")),
    security(("admin_token" = [])))]
pub(crate) async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Deleted>, GatewayError> {
    let parsed = parse_id(&id, "id")?;
    let removed = delete_ids(&state, vec![parsed]).await?;
    if removed == 0 {
        return Err(GatewayError::EntryNotFound { id });
    }
    Ok(Json(Deleted {
        id: parsed.to_string(),
        object: "reprise.entry.deleted".to_owned(),
        deleted: true,
    }))
}

/// Removes entries from the store and their vectors from the index; returns how many existed.
async fn delete_ids(state: &AppState, ids: Vec<EntryId>) -> Result<usize, GatewayError> {
    let store = state.cache.store.clone();
    let index = state.cache.index.clone();
    blocking(move || {
        let mut removed = 0;
        for id in ids {
            if store.delete(id).map_err(store_error)? {
                removed += 1;
            }
            if let Some(index) = &index {
                index.remove(id.0);
            }
        }
        Ok(removed)
    })
    .await
}

/// Which entries to invalidate: every given criterion must hold.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct InvalidateRequest {
    pub namespace: Option<String>,
    pub model: Option<String>,
    /// Tenant label as listed (16 hex digits, or `shared`).
    pub tenant: Option<String>,
    /// Entries at least this old.
    pub older_than_s: Option<u64>,
    /// Entries whose prompt is at least `min_similarity` similar to this text.
    pub similar_to: Option<String>,
    /// Defaults to the global similarity threshold.
    pub min_similarity: Option<f32>,
    /// Count, delete nothing.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Invalidation {
    pub object: String,
    pub matched: usize,
    pub deleted: usize,
    pub dry_run: bool,
}

/// Deletes the entries that match every given criterion; returns how many.
#[utoipa::path(post, path = "/admin/invalidate", tag = "admin", request_body = InvalidateRequest,
    responses((status = 200, body = Invalidation), (status = 400, description = "No criterion, or an invalid one")),
    security(("admin_token" = [])))]
pub(crate) async fn invalidate(
    State(state): State<AppState>,
    AdminJson(request): AdminJson<InvalidateRequest>,
) -> Result<Json<Invalidation>, GatewayError> {
    let InvalidateRequest {
        namespace,
        model,
        tenant,
        older_than_s,
        similar_to,
        min_similarity,
        dry_run,
    } = request;
    if namespace.is_none()
        && model.is_none()
        && tenant.is_none()
        && older_than_s.is_none()
        && similar_to.is_none()
    {
        return Err(GatewayError::invalid(
            "Give at least one of namespace, model, tenant, older_than_s, similar_to (POST /admin/flush removes everything).",
            None,
        ));
    }
    let floor = min_similarity.unwrap_or(state.live.current().similarity_threshold);
    if !(-1.0..=1.0).contains(&floor) {
        return Err(GatewayError::invalid(
            "`min_similarity` must be from -1 to 1.",
            Some("min_similarity"),
        ));
    }
    // The entries close enough to the text, when that is a criterion.
    let similar: Option<HashMap<u64, f32>> = match &similar_to {
        Some(text) => {
            let vector = embed(&state, text, "similar_to").await?;
            let index = state.semantic.as_ref().map(|s| s.index.clone());
            Some(
                blocking(move || {
                    Ok(index.map_or_else(Vec::new, |i| i.scan_all(&vector, floor, usize::MAX)))
                })
                .await?
                .into_iter()
                .map(|n| (n.id, n.similarity))
                .collect(),
            )
        }
        None => None,
    };
    let store: Arc<dyn Store> = state.cache.store.clone();
    let cache = state.cache.clone();
    let ids = blocking(move || {
        // Answers recorded just before this call must not land after it unexamined.
        cache.drain();
        let now = unix_ms();
        let keep = |e: &Entry| {
            matches(e, namespace.as_deref(), model.as_deref())
                && tenant.as_deref().is_none_or(|t| e.summary.tenant == t)
                && older_than_s.is_none_or(|age| e.age_s(now) >= age)
        };
        let mut ids = Vec::new();
        if let Some(similar) = similar {
            // Only the index's candidates need reading.
            for id in similar.keys() {
                if let Some(e) = store.get(EntryId(*id)).map_err(store_error)? {
                    if keep(&e) {
                        ids.push(e.id);
                    }
                }
            }
            return Ok(ids);
        }
        let mut before = None;
        loop {
            let page = store.list_newest(before, SCAN_PAGE).map_err(store_error)?;
            let Some(last) = page.last() else {
                break;
            };
            before = Some(last.id);
            ids.extend(page.iter().filter(|e| keep(e)).map(|e| e.id));
        }
        Ok(ids)
    })
    .await?;
    let matched = ids.len();
    let deleted = if dry_run {
        0
    } else {
        delete_ids(&state, ids).await?
    };
    tracing::info!(matched, deleted, dry_run, "admin invalidation");
    Ok(Json(Invalidation {
        object: "reprise.invalidation".to_owned(),
        matched,
        deleted,
        dry_run,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Flushed {
    pub object: String,
    pub deleted: usize,
}

/// Removes every entry.
#[utoipa::path(post, path = "/admin/flush", tag = "admin",
    responses((status = 200, body = Flushed)), security(("admin_token" = [])))]
pub(crate) async fn flush(State(state): State<AppState>) -> Result<Json<Flushed>, GatewayError> {
    let store = state.cache.store.clone();
    let index = state.cache.index.clone();
    let cache = state.cache.clone();
    let deleted = blocking(move || {
        // Answers recorded just before the flush land first, then go with the rest.
        cache.drain();
        let ids = store.ids().map_err(store_error)?;
        let deleted = store.clear().map_err(store_error)?;
        if let Some(index) = &index {
            for id in ids {
                index.remove(id.0);
            }
        }
        Ok(deleted)
    })
    .await?;
    tracing::info!(deleted, "admin flush");
    Ok(Json(Flushed {
        object: "reprise.flush".to_owned(),
        deleted,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answer_text_reads_every_route_shape() {
        assert_eq!(
            answer_text(&json!({"choices": [{"message": {"content": "Paris."}}]})),
            "Paris."
        );
        assert_eq!(answer_text(&json!({"choices": [{"text": "ok"}]})), "ok");
        let tools = answer_text(&json!({"choices": [{"message": {"content": null,
            "tool_calls": [{"function": {"name": "f"}}]}}]}));
        assert!(tools.starts_with("[tool calls]") && tools.contains("\"f\""));
        assert_eq!(
            answer_text(&json!({"data": [{"embedding": [0.1]}, {"embedding": [0.2]}]})),
            "[2 embedding vector(s)]"
        );
    }
}
