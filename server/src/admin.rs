//! Admin routes under `/admin`: bearer-token authentication and the recent-requests view.
//!
//! Without a configured token every admin route answers 404 (disabled, never open); a missing or
//! wrong token answers 401. Tokens are compared in constant time.

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap};
use axum::Json;
use serde::Deserialize;
use subtle::ConstantTimeEq;

use crate::error::GatewayError;
use crate::record::RequestRecord;
use crate::AppState;

/// Checks `Authorization: Bearer <admin token>`.
pub fn authorize(state: &AppState, headers: &HeaderMap) -> Result<(), GatewayError> {
    let Some(expected) = &state.config.admin_token else {
        return Err(GatewayError::AdminDisabled);
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .unwrap_or("");
    // Hashing first makes the comparison constant-time in the length as well as the content.
    let a = blake3::hash(presented.as_bytes());
    let b = blake3::hash(expected.expose().as_bytes());
    if bool::from(a.as_bytes().ct_eq(b.as_bytes())) && !presented.is_empty() {
        Ok(())
    } else {
        Err(GatewayError::Unauthorized)
    }
}

#[derive(Debug, Deserialize)]
pub struct RequestsQuery {
    pub limit: Option<usize>,
}

#[derive(Debug, serde::Serialize)]
pub struct RequestsPage {
    pub object: &'static str,
    pub data: Vec<RequestRecord>,
}

/// `GET /admin/requests?limit=N`: the most recent requests with their phases, newest first.
pub async fn requests(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<RequestsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<RequestsPage>, GatewayError> {
    authorize(&state, &headers)?;
    let Query(query) =
        query.map_err(|e| GatewayError::invalid(format!("Invalid query: {e}."), Some("limit")))?;
    let limit = query
        .limit
        .unwrap_or(100)
        .clamp(1, state.config.request_log_size);
    Ok(Json(RequestsPage {
        object: "list",
        data: state.requests.recent(limit),
    }))
}
