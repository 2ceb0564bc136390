//! The gateway's one error enum and its exhaustive mappings to responses: OpenAI's shape, and
//! Anthropic's for the Messages API ([`ErrorShape`]).
//!
//! Every error a client can see is built here, so that status codes, `type`/`code` strings and the
//! body shapes `{"error":{"message","type","param","code"}}` (OpenAI) and
//! `{"type":"error","error":{"type","message"}}` (Anthropic) stay consistent. 5xx bodies never
//! carry internal details; those go to the log, once, when the response is built.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use std::path::PathBuf;

use serde_json::json;

/// Which API's error shape a client gets: each SDK raises its typed errors only from its own
/// provider's shape and statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorShape {
    /// `{"error":{"message","type","param","code"}}`, OpenAI's statuses.
    #[default]
    OpenAi,
    /// `{"type":"error","error":{"type","message"}}`, with the status Anthropic would answer.
    Anthropic,
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The client's request is malformed (bad JSON, a field of the wrong type, a missing field).
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
        code: &'static str,
    },
    #[error("Request body is larger than the gateway's limit of {limit} bytes.")]
    PayloadTooLarge { limit: usize },
    #[error("Content-Type must be application/json (got {got}).")]
    UnsupportedMediaType { got: String },
    /// The client stopped sending its request body (see `client_body_timeout_ms`).
    #[error("The request body stalled: no bytes arrived for {timeout_ms} ms.")]
    RequestTimeout { timeout_ms: u64 },
    #[error("The request target is longer than the gateway's limit of {limit} bytes.")]
    UriTooLong { limit: usize },
    #[error(
        "The request's header section is too large: at most {max_fields} fields and {max_bytes} bytes."
    )]
    HeadersTooLarge { max_fields: usize, max_bytes: usize },
    /// The upstream could not be reached (DNS, connect, TLS).
    #[error("The upstream at {upstream} could not be reached.")]
    UpstreamUnreachable { upstream: String, detail: String },
    /// The upstream accepted the request but sent no first byte in time.
    #[error("The upstream did not respond within {timeout_ms} ms.")]
    UpstreamTimeout { timeout_ms: u64 },
    /// The upstream answered something that is not a valid response for this route.
    #[error("The upstream sent an invalid response: {reason}.")]
    UpstreamProtocol {
        /// A fixed phrase safe to show the client.
        reason: &'static str,
        /// What exactly went wrong, for the log only.
        detail: String,
    },
    /// The upstream was reached but its answer was not valid HTTP: a malformed status line or head,
    /// or a connection closed or reset before the response was complete.
    #[error("The upstream's response was not valid HTTP: {reason}.")]
    UpstreamProtocolError {
        /// A fixed phrase safe to show the client.
        reason: &'static str,
        /// The client library's error chain, for the log only.
        detail: String,
    },
    #[error("Missing or invalid admin token. Send `Authorization: Bearer <admin token>`.")]
    Unauthorized,
    #[error("Admin routes are disabled: the gateway was started without an admin token.")]
    AdminDisabled,
    #[error("Unknown route {method} {path}.")]
    RouteNotFound { method: String, path: String },
    #[error("No cache entry {id}.")]
    EntryNotFound { id: String },
    /// Feedback names a request the gateway no longer (or never) knew.
    #[error("No recent request {id} that met a cached entry: feedback applies to the `x-reprise-request-id` of a semantic hit, a shadow decision or a miss with a candidate, among the last 10,000 since the gateway started.")]
    RequestNotFound { id: String },
    /// An admin operation needs the embedding model, and the gateway runs exact-only.
    #[error("{what} needs semantic matching, and this gateway runs exact-only: {why}")]
    SemanticDisabled {
        what: &'static str,
        why: String,
        param: &'static str,
    },
    #[error("The gateway is shutting down.")]
    ShuttingDown,
    /// An admin call that needs an embedding found the embedder too busy to meet its deadline
    /// (or past it): the caller may try again shortly.
    #[error("The embedding model is too busy to embed {what} now; try again shortly.")]
    EmbedderBusy { what: &'static str },
    #[error("The gateway hit an internal error.")]
    Internal { detail: String },
}

impl GatewayError {
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: param.map(str::to_owned),
            code: "invalid_request",
        }
    }

    /// Status, OpenAI `type` and `code` for each variant. No wildcard arm: a new variant must be mapped.
    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Self::InvalidRequest { code, .. } => {
                (StatusCode::BAD_REQUEST, "invalid_request_error", code)
            }
            Self::PayloadTooLarge { .. } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "payload_too_large",
            ),
            Self::UnsupportedMediaType { .. } => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "invalid_request_error",
                "unsupported_media_type",
            ),
            Self::RequestTimeout { .. } => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                "request_timeout",
            ),
            Self::UriTooLong { .. } => (
                StatusCode::URI_TOO_LONG,
                "invalid_request_error",
                "uri_too_long",
            ),
            Self::HeadersTooLarge { .. } => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "invalid_request_error",
                "request_header_fields_too_large",
            ),
            Self::UpstreamUnreachable { .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "upstream_unreachable",
            ),
            Self::UpstreamTimeout { .. } => (
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_error",
                "upstream_timeout",
            ),
            Self::UpstreamProtocol { .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "upstream_invalid_response",
            ),
            Self::UpstreamProtocolError { .. } => (
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "upstream_protocol_error",
            ),
            Self::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_admin_token",
            ),
            Self::AdminDisabled => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "admin_disabled",
            ),
            Self::RouteNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "unknown_route",
            ),
            Self::EntryNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "entry_not_found",
            ),
            Self::RequestNotFound { .. } => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "request_not_found",
            ),
            Self::SemanticDisabled { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "semantic_disabled",
            ),
            Self::ShuttingDown => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "shutting_down",
            ),
            Self::EmbedderBusy { .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "embedder_busy",
            ),
            Self::Internal { .. } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
            ),
        }
    }

    /// Anthropic's status and error `type` for each variant, among those Anthropic answers with
    /// (400, 401, 404, 413, 429, 500, 504, 529), so that its SDKs raise the matching error class
    /// and retry what they retry. No wildcard arm: a new variant must be mapped.
    fn anthropic_parts(&self) -> (StatusCode, &'static str) {
        const INVALID: (StatusCode, &str) = (StatusCode::BAD_REQUEST, "invalid_request_error");
        const TOO_LARGE: (StatusCode, &str) = (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large");
        const NOT_FOUND: (StatusCode, &str) = (StatusCode::NOT_FOUND, "not_found_error");
        const API: (StatusCode, &str) = (StatusCode::INTERNAL_SERVER_ERROR, "api_error");
        match self {
            Self::InvalidRequest { .. }
            | Self::UnsupportedMediaType { .. }
            | Self::SemanticDisabled { .. } => INVALID,
            // A stalled body is still the client's fault; the connection is closed (see below).
            Self::RequestTimeout { .. } => INVALID,
            Self::PayloadTooLarge { .. }
            | Self::UriTooLong { .. }
            | Self::HeadersTooLarge { .. } => TOO_LARGE,
            Self::UpstreamUnreachable { .. }
            | Self::UpstreamProtocol { .. }
            | Self::UpstreamProtocolError { .. }
            | Self::Internal { .. } => API,
            Self::UpstreamTimeout { .. } => (StatusCode::GATEWAY_TIMEOUT, "timeout_error"),
            Self::Unauthorized => (StatusCode::UNAUTHORIZED, "authentication_error"),
            Self::AdminDisabled
            | Self::RouteNotFound { .. }
            | Self::EntryNotFound { .. }
            | Self::RequestNotFound { .. } => NOT_FOUND,
            // Anthropic's "try again shortly": its SDKs retry a 529.
            Self::ShuttingDown | Self::EmbedderBusy { .. } => (
                StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                "overloaded_error",
            ),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.parts().0
    }

    /// The status of this error in `shape`.
    pub fn status_for(&self, shape: ErrorShape) -> StatusCode {
        match shape {
            ErrorShape::OpenAi => self.status(),
            ErrorShape::Anthropic => self.anthropic_parts().0,
        }
    }

    /// The JSON body of this error in `shape`.
    pub fn body_for(&self, shape: ErrorShape) -> serde_json::Value {
        match shape {
            ErrorShape::OpenAi => self.body(),
            ErrorShape::Anthropic => json!({"type": "error", "error": {
                "type": self.anthropic_parts().1,
                "message": self.to_string(),
            }}),
        }
    }

    /// [`Self::sse_event`] in `shape`: Anthropic's streams fail with a named `error` event.
    pub fn sse_event_for(&self, shape: ErrorShape) -> Bytes {
        match shape {
            ErrorShape::OpenAi => self.sse_event(),
            ErrorShape::Anthropic => {
                Bytes::from(format!("event: error\ndata: {}\n\n", self.body_for(shape)))
            }
        }
    }

    /// The response of this error in `shape`, logged once.
    pub fn into_response_for(self, shape: ErrorShape) -> Response {
        self.log();
        let mut response =
            (self.status_for(shape), axum::Json(self.body_for(shape))).into_response();
        if matches!(self, Self::Unauthorized) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        // The rest of a stalled body may still arrive: the connection cannot carry another request.
        if matches!(self, Self::RequestTimeout { .. }) {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }

    /// The OpenAI-shaped `code`, e.g. `upstream_timeout`.
    pub fn code(&self) -> &'static str {
        self.parts().2
    }

    /// The OpenAI-shaped JSON body.
    pub fn body(&self) -> serde_json::Value {
        let (_, kind, code) = self.parts();
        let param = match self {
            Self::InvalidRequest { param, .. } => param.clone(),
            Self::SemanticDisabled { param, .. } => Some((*param).to_owned()),
            Self::EntryNotFound { .. } => Some("id".to_owned()),
            Self::RequestNotFound { .. } => Some("request_id".to_owned()),
            _ => None,
        };
        json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
    }

    /// The same error as one SSE event, for failures after a stream has started: the official SDKs
    /// raise an `APIError` when a `data:` event carries an `error` object.
    pub fn sse_event(&self) -> Bytes {
        Bytes::from(format!("data: {}\n\n", self.body()))
    }

    /// Details that belong in the log but never in a client's response.
    fn detail(&self) -> Option<&str> {
        match self {
            Self::UpstreamUnreachable { detail, .. }
            | Self::UpstreamProtocol { detail, .. }
            | Self::UpstreamProtocolError { detail, .. }
            | Self::Internal { detail } => Some(detail),
            _ => None,
        }
    }

    /// Logs the error once, at a level that matches whose fault it is.
    pub fn log(&self) {
        let status = self.status();
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), detail = self.detail(), "{self}");
        } else {
            tracing::debug!(status = status.as_u16(), "{self}");
        }
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        self.into_response_for(ErrorShape::OpenAi)
    }
}

/// A setting that cannot be read or is invalid, named for the operator who set it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {}: {}", path.display(), parse_message(source))]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid value for `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// A TOML error at its line; one raised for the file as a whole (an unknown key, next to the
/// flattened live settings) has no line, and its message alone names the key.
fn parse_message(error: &toml::de::Error) -> String {
    match error.span() {
        Some(span) if span.is_empty() && span.start == 0 => error.message().to_owned(),
        _ => error.to_string(),
    }
}

/// The error a request body yields when the client sent nothing for the body timeout.
#[derive(Debug, thiserror::Error)]
#[error("the client sent no part of the request body for {timeout_ms} ms")]
pub(crate) struct BodyTimeout {
    pub timeout_ms: u64,
}

impl BodyTimeout {
    /// The body timeout behind `err`, however deeply the body's consumer wrapped it.
    pub(crate) fn in_chain<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Self> {
        let mut source = Some(err);
        while let Some(e) = source {
            if let Some(stalled) = e.downcast_ref::<Self>() {
                return Some(stalled);
            }
            source = e.source();
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape_and_hides_internal_detail() {
        let err = GatewayError::Internal {
            detail: "sled exploded at /secret/path".into(),
        };
        let body = err.body();
        assert_eq!(err.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["error"]["type"], "server_error");
        assert_eq!(body["error"]["code"], "internal_error");
        assert!(body["error"]["param"].is_null());
        assert!(!body.to_string().contains("/secret/path"));
    }

    #[test]
    fn anthropics_shape_has_its_statuses_and_types() {
        let cases = [
            (
                GatewayError::invalid("`max_tokens` is missing", Some("max_tokens")),
                400,
                "invalid_request_error",
            ),
            (
                GatewayError::UnsupportedMediaType {
                    got: "text/plain".into(),
                },
                400,
                "invalid_request_error",
            ),
            (GatewayError::Unauthorized, 401, "authentication_error"),
            (
                GatewayError::RouteNotFound {
                    method: "GET".into(),
                    path: "/x".into(),
                },
                404,
                "not_found_error",
            ),
            (
                GatewayError::PayloadTooLarge { limit: 1 },
                413,
                "request_too_large",
            ),
            (
                GatewayError::Internal {
                    detail: "/secret/path".into(),
                },
                500,
                "api_error",
            ),
            (
                GatewayError::UpstreamTimeout { timeout_ms: 5 },
                504,
                "timeout_error",
            ),
            (GatewayError::ShuttingDown, 529, "overloaded_error"),
            (
                GatewayError::EmbedderBusy { what: "the query" },
                529,
                "overloaded_error",
            ),
        ];
        for (err, status, kind) in cases {
            let body = err.body_for(ErrorShape::Anthropic);
            assert_eq!(
                err.status_for(ErrorShape::Anthropic).as_u16(),
                status,
                "{err}"
            );
            assert_eq!(body["type"], "error");
            assert_eq!(body["error"]["type"], kind, "{err}");
            assert_eq!(body["error"]["message"], err.to_string());
            assert!(!body.to_string().contains("/secret/path"));
            assert_eq!(err.body_for(ErrorShape::OpenAi), err.body());
        }
        let event = GatewayError::ShuttingDown.sse_event_for(ErrorShape::Anthropic);
        assert!(event.starts_with(b"event: error\ndata: {"), "{event:?}");
    }

    #[test]
    fn invalid_request_names_the_param() {
        let err = GatewayError::invalid("`messages` must be an array", Some("messages"));
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        assert_eq!(err.body()["error"]["param"], "messages");
        let event = err.sse_event();
        assert!(event.starts_with(b"data: {\"error\""));
        assert!(event.ends_with(b"\n\n"));
    }
}
