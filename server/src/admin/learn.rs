//! `GET /admin/shadow` (what shadow mode would have served) and `GET|POST /admin/feedback`
//! (operators' verdicts on semantic matches). The logic lives in [`crate::shadow`] and
//! [`crate::feedback`]; these handlers parse, call it on a blocking thread and shape the page.

use axum::extract::{Query, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::json::AdminJson;
use crate::error::GatewayError;
use crate::feedback::{FeedbackRequest, VerdictRecord};
use crate::shadow::{ShadowDecision, ShadowFilter, Would};
use crate::state::AppState;

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 1000;

fn limit(value: Option<usize>) -> Result<usize, GatewayError> {
    let limit = value.unwrap_or(DEFAULT_LIMIT);
    if (1..=MAX_LIMIT).contains(&limit) {
        Ok(limit)
    } else {
        Err(GatewayError::invalid(
            format!("`limit` must be from 1 to {MAX_LIMIT}."),
            Some("limit"),
        ))
    }
}

fn cursor(value: Option<&str>) -> Result<Option<u64>, GatewayError> {
    value
        .map(|c| {
            c.trim().parse::<u64>().map_err(|_| {
                GatewayError::invalid(
                    format!("`cursor` must be the `next_cursor` of a previous page, not `{c}`."),
                    Some("cursor"),
                )
            })
        })
        .transpose()
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, GatewayError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| GatewayError::Internal {
            detail: format!("feedback task failed: {e}"),
        })
}

#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct ShadowQuery {
    /// Only decisions of this namespace.
    pub namespace: Option<String>,
    /// Only `would-hit`, `would-refuse` or `would-miss` decisions (`hit`, `refuse`, `miss` too).
    pub would: Option<String>,
    /// How many, newest first (default 50, at most 1000).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ShadowPage {
    pub object: String,
    pub data: Vec<ShadowDecision>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// What shadow mode would have served, newest first.
#[utoipa::path(get, path = "/admin/shadow", tag = "admin", params(ShadowQuery),
    responses((status = 200, body = ShadowPage), (status = 400, description = "Bad limit, cursor or filter")),
    security(("admin_token" = [])))]
pub(crate) async fn shadow(
    State(state): State<AppState>,
    query: Result<Query<ShadowQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<ShadowPage>, GatewayError> {
    let Query(query) = query.map_err(|e| {
        let param = e.body_text().contains("limit").then_some("limit");
        GatewayError::invalid(format!("Invalid query: {e}."), param)
    })?;
    let would = query
        .would
        .as_deref()
        .map(|w| {
            Would::parse(w.trim()).ok_or_else(|| {
                GatewayError::invalid(
                    format!("`would` must be would-hit, would-refuse or would-miss, not `{w}`."),
                    Some("would"),
                )
            })
        })
        .transpose()?;
    let namespace = query
        .namespace
        .as_deref()
        .map(|n| crate::policy::namespace(n, "namespace"))
        .transpose()?;
    let filter = ShadowFilter {
        namespace,
        would,
        before: cursor(query.cursor.as_deref())?,
        limit: limit(query.limit)?,
    };
    let feedback = state.feedback.clone();
    let (data, next) = blocking(move || feedback.shadow.list(&filter)).await?;
    Ok(Json(ShadowPage {
        object: "list".to_owned(),
        data,
        has_more: next.is_some(),
        next_cursor: next.map(|n| n.to_string()),
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct FeedbackQuery {
    /// How many, newest first (default 50, at most 1000).
    pub limit: Option<usize>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct FeedbackPage {
    pub object: String,
    pub data: Vec<VerdictRecord>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// The verdicts received, newest first.
#[utoipa::path(get, path = "/admin/feedback", tag = "admin", params(FeedbackQuery),
    responses((status = 200, body = FeedbackPage), (status = 400, description = "Bad limit or cursor")),
    security(("admin_token" = [])))]
pub(crate) async fn list_feedback(
    State(state): State<AppState>,
    query: Result<Query<FeedbackQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<FeedbackPage>, GatewayError> {
    let Query(query) = query.map_err(|e| {
        let param = e.body_text().contains("limit").then_some("limit");
        GatewayError::invalid(format!("Invalid query: {e}."), param)
    })?;
    let (before, limit) = (cursor(query.cursor.as_deref())?, limit(query.limit)?);
    let feedback = state.feedback.clone();
    let (data, next) = blocking(move || feedback.list(before, limit)).await?;
    Ok(Json(FeedbackPage {
        object: "list".to_owned(),
        data,
        has_more: next.is_some(),
        next_cursor: next.map(|n| n.to_string()),
    }))
}

/// Judges a semantic hit or a shadow decision by its `x-reprise-request-id`: `wrong` vetoes the
/// pair for good and raises the entry's threshold; `right` on a shadow decision approves the prompt
/// as an alias of the entry. 404 for a request the gateway does not remember, 400 for an exact hit.
#[utoipa::path(post, path = "/admin/feedback", tag = "admin", request_body = FeedbackRequest,
    responses((status = 200, body = VerdictRecord), (status = 400, description = "Invalid body, or an exact hit"),
        (status = 404, description = "Unknown request id")),
    security(("admin_token" = [])))]
pub(crate) async fn post_feedback(
    State(state): State<AppState>,
    AdminJson(request): AdminJson<FeedbackRequest>,
) -> Result<Json<VerdictRecord>, GatewayError> {
    let feedback = state.feedback.clone();
    let store = state.cache.store.clone();
    blocking(move || {
        let (record, encounter) = feedback.judge(&request)?;
        // Every replica sharing the store vetoes or approves the same pair.
        if let Some(feed) = store.feed() {
            let shared = crate::feedback::SharedVerdict {
                origin: feed.replica().to_owned(),
                encounter,
                record: record.clone(),
            };
            let change = crate::store::Change::Verdict(serde_json::to_value(&shared).unwrap_or_default());
            if let Err(e) = feed.publish(&change) {
                tracing::error!(error = %e, "a verdict could not be shared: other replicas do not apply it until it is sent again");
            }
        }
        Ok(record)
    })
    .await?
    .map(Json)
}
