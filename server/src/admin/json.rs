//! The admin routes' JSON bodies: read within a larger limit than a chat request's, and serde's
//! rejections turned into OpenAI-shaped 400s that name the failing field. Every admin handler takes
//! its body through here; it knows nothing of the routes.

use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use crate::error::GatewayError;

/// A JSON body for admin routes: serde's rejections become OpenAI-shaped 400s naming the field.
pub(crate) struct AdminJson<T>(pub T);

/// Admin bodies (warm files) may be much larger than a chat request.
pub(crate) const ADMIN_MAX_BODY: usize = 64 * 1024 * 1024;

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for AdminJson<T> {
    type Rejection = GatewayError;

    async fn from_request(request: Request, _: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = request.into_parts();
        let raw = crate::ingress::read_limited(body, &parts.headers, ADMIN_MAX_BODY).await?;
        parse_json(&raw).map(AdminJson)
    }
}

/// Parses `raw` as `T`, naming the failing field in the error.
pub(crate) fn parse_json<T: DeserializeOwned>(raw: &[u8]) -> Result<T, GatewayError> {
    deserialize(&mut serde_json::Deserializer::from_slice(raw))
}

/// Reads an already parsed JSON value as `T`, with the same errors as [`parse_json`].
pub(crate) fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, GatewayError> {
    deserialize(value)
}

fn deserialize<'de, D, T>(de: D) -> Result<T, GatewayError>
where
    D: serde::Deserializer<'de, Error = serde_json::Error>,
    T: serde::Deserialize<'de>,
{
    serde_path_to_error::deserialize(de).map_err(|err| {
        let path = err.path().to_string();
        let mut message = err.inner().to_string();
        // Positions mean little in a small admin body.
        if let Some(at) = message.rfind(" at line ") {
            message.truncate(at);
        }
        // A missing field is reported at its parent: name the field itself.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next());
        let param = match (path.as_str(), missing) {
            (".", field) => field.map(str::to_owned),
            (parent, Some(field)) => Some(format!("{parent}.{field}")),
            (parent, None) => Some(parent.to_owned()),
        };
        GatewayError::invalid(format!("Invalid JSON body: {message}."), param.as_deref())
    })
}
