//! Ingress, the first stage: read the client's body within the size limit, check its content type,
//! parse it, and check the few fields the gateway itself relies on.
//!
//! The raw bytes are kept and forwarded untouched: the gateway never drops or reorders fields it does
//! not understand. Validation stays minimal and names the failing field (`param`), as OpenAI does.

use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap};
use bytes::Bytes;
use serde_json::{Map, Value};

use crate::error::{ErrorShape, GatewayError};
use crate::timing::PhaseClock;

/// The JSON routes the gateway understands (and, later, caches). What each one means for the
/// stages is its adapter's (`crate::api::of`); kept here is what files below the adapters need: its
/// name, its upstream path, the fields ingress checks, and how its stream is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    ChatCompletions,
    Completions,
    Embeddings,
    /// `POST /v1/responses`, the Responses API.
    Responses,
    /// `POST /v1/messages`, Anthropic's Messages API (its own upstream: [`Provider::Anthropic`]).
    Messages,
}

/// The header every Anthropic client sends, and no OpenAI one.
const ANTHROPIC_VERSION: &str = "anthropic-version";

/// Which upstream a request goes to: OpenAI-shaped APIs to `upstream_url`, Anthropic's Messages
/// API (and every path below `/v1/messages`, such as `count_tokens`) to `anthropic_upstream_url`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    OpenAi,
    Anthropic,
}

impl Provider {
    /// The error shape this provider's clients understand.
    pub fn error_shape(self) -> ErrorShape {
        match self {
            Provider::OpenAi => ErrorShape::OpenAi,
            Provider::Anthropic => ErrorShape::Anthropic,
        }
    }

    /// The upstream of a pass-through request to `below_v1` (its path below `/v1`): Anthropic's
    /// for `/messages` and what lies below it (`/messages/count_tokens`, `/messages/batches`), and
    /// for every request of an Anthropic client, whatever its path (`/v1/models`, `/v1/files`):
    /// Anthropic's SDKs and Claude Code send `anthropic-version` on every call, and a browser's
    /// preflight names it among the headers its request will carry. The rest goes to the OpenAI
    /// upstream. Before, an Anthropic SDK's `models.list()` went to the OpenAI upstream with the
    /// client's Anthropic key.
    pub fn of_request(below_v1: &str, headers: &HeaderMap) -> Provider {
        // OpenAI's own cached paths stay with it whatever a client sends (their preflight too,
        // so that it goes where the request it clears will go).
        let openai_route = Route::ALL
            .iter()
            .any(|route| route.provider() == Provider::OpenAi && route.upstream_path() == below_v1);
        if openai_route {
            return Provider::OpenAi;
        }
        let messages = below_v1
            .strip_prefix("/messages")
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        let preflight_names_it = headers
            .get_all(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .iter()
            .filter_map(|value| value.to_str().ok())
            .flat_map(|value| value.split(','))
            .any(|name| name.trim().eq_ignore_ascii_case(ANTHROPIC_VERSION));
        if messages || headers.contains_key(ANTHROPIC_VERSION) || preflight_names_it {
            Provider::Anthropic
        } else {
            Provider::OpenAi
        }
    }
}

impl Route {
    /// Every route, for lookups by name.
    pub const ALL: [Route; 5] = [
        Self::ChatCompletions,
        Self::Completions,
        Self::Embeddings,
        Self::Responses,
        Self::Messages,
    ];

    /// The route of a [`Route::name`] (entries and operators name routes): `None` for another.
    pub fn from_name(name: &str) -> Option<Route> {
        Self::ALL.into_iter().find(|route| route.name() == name)
    }

    /// How this route's answers stream, which a replayed entry reproduces.
    pub fn framing(self) -> Framing {
        Framing {
            text_completion: self == Self::Completions,
            named_events: matches!(self, Self::Responses | Self::Messages),
            message_ids: self == Self::Messages,
        }
    }

    /// The upstream this route goes to.
    pub fn provider(self) -> Provider {
        match self {
            Self::ChatCompletions | Self::Completions | Self::Embeddings | Self::Responses => {
                Provider::OpenAi
            }
            Self::Messages => Provider::Anthropic,
        }
    }

    /// Path below the upstream base URL (which already ends in `/v1`).
    pub fn upstream_path(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/chat/completions",
            Self::Completions => "/completions",
            Self::Embeddings => "/embeddings",
            Self::Responses => "/responses",
            Self::Messages => "/messages",
        }
    }

    /// Short, stable name for logs, records and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chat.completions",
            Self::Completions => "completions",
            Self::Embeddings => "embeddings",
            Self::Responses => "responses",
            Self::Messages => "messages",
        }
    }
}

/// Every route's [`Route::name`], for what is keyed by route name below the adapters (the
/// metrics' `route` label).
pub fn route_names() -> [&'static str; 5] {
    Route::ALL.map(Route::name)
}

/// The `route` of a request outside the cached routes, forwarded as it is (always a `pass`).
pub const PASSTHROUGH: &str = "passthrough";

/// How a route's answers stream, which a replay record reproduces. It sits on the route rather than
/// in the adapters because the store, below them, rebuilds a replay record from a stored entry,
/// which knows its route only by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Framing {
    /// Chunks are legacy `text_completion` objects, not `chat.completion.chunk` ones.
    pub text_completion: bool,
    /// Events are named by their `type` (`event: …`) and the stream ends with its last event, not
    /// `data: [DONE]` (the Responses API, Anthropic's Messages API).
    pub named_events: bool,
    /// With `named_events`: the answer is an Anthropic message, whose `id` a hit renews (a
    /// Responses API hit keeps the stored response's ids).
    pub message_ids: bool,
}

impl Framing {
    /// The framing of the route named `name`; chat's (the default) for a name no route has.
    pub fn of_name(name: &str) -> Framing {
        Route::from_name(name)
            .map(Route::framing)
            .unwrap_or_default()
    }
}

/// A parsed client request, ready for the later stages.
#[derive(Debug)]
pub struct Ingress {
    pub route: Route,
    pub headers: HeaderMap,
    pub query: Option<String>,
    /// The body exactly as the client sent it.
    pub raw: Bytes,
    pub body: Map<String, Value>,
    pub model: String,
    pub stream: bool,
    pub clock: PhaseClock,
}

/// Reads and checks one JSON request. `started` is when the request reached the gateway.
pub async fn read(
    route: Route,
    request: Request,
    limit: usize,
    started: Instant,
) -> Result<Ingress, GatewayError> {
    let (parts, body) = request.into_parts();
    check_content_type(&parts.headers)?;
    let raw = read_limited(body, &parts.headers, limit).await?;
    let body = parse_object(&raw)?;
    let model = if prompt_names_the_model(route, &body) {
        String::new()
    } else {
        required_string(&body, "model")?
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(GatewayError::invalid(
                "`stream` must be a boolean.",
                Some("stream"),
            ))
        }
    };
    check_route_fields(route, &body)?;
    let mut clock = PhaseClock::start(started);
    clock.body_read = Some(Instant::now());
    Ok(Ingress {
        route,
        headers: parts.headers,
        query: parts.uri.query().map(str::to_owned),
        raw,
        body,
        model,
        stream,
        clock,
    })
}

/// A Responses API request without `model` that names a stored `prompt`: the prompt carries its
/// model (OpenAI's SDKs leave `model` out then), so the request is valid without one. The
/// gateway records its model as empty.
fn prompt_names_the_model(route: Route, body: &Map<String, Value>) -> bool {
    route == Route::Responses
        && body.get("model").is_none_or(Value::is_null)
        && body.get("prompt").is_some_and(|p| !p.is_null())
}

fn check_content_type(headers: &HeaderMap) -> Result<(), GatewayError> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mime = value.split(';').next().unwrap_or("").trim();
    if mime.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(GatewayError::UnsupportedMediaType {
            got: if value.is_empty() {
                "none".to_owned()
            } else {
                value.to_owned()
            },
        })
    }
}

/// Reads the whole body, refusing early when `Content-Length` already says it is too large.
pub async fn read_limited(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, GatewayError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(GatewayError::PayloadTooLarge { limit });
    }
    axum::body::to_bytes(body, limit).await.map_err(|err| {
        if is_length_limit(&err) {
            GatewayError::PayloadTooLarge { limit }
        } else if let Some(stalled) = crate::error::BodyTimeout::in_chain(&err) {
            GatewayError::RequestTimeout {
                timeout_ms: stalled.timeout_ms,
            }
        } else {
            GatewayError::invalid(format!("Could not read the request body: {err}."), None)
        }
    })
}

fn is_length_limit(err: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = e.source();
    }
    false
}

fn parse_object(raw: &[u8]) -> Result<Map<String, Value>, GatewayError> {
    let mut de = serde_json::Deserializer::from_slice(raw);
    let value: Value = serde_path_to_error::deserialize(&mut de).map_err(|err| {
        GatewayError::invalid(
            format!(
                "We could not parse the JSON body of your request ({}). The body must be a JSON object.",
                err.inner()
            ),
            None,
        )
    })?;
    de.end().map_err(|err| {
        GatewayError::invalid(
            format!("Trailing characters after the JSON body ({err})."),
            None,
        )
    })?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(GatewayError::invalid(
            "The request body must be a JSON object.",
            None,
        )),
    }
}

pub(crate) fn required_string(
    body: &Map<String, Value>,
    field: &'static str,
) -> Result<String, GatewayError> {
    match body.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) | None | Some(Value::Null) => Err(GatewayError::invalid(
            format!("You must provide a `{field}` parameter."),
            Some(field),
        )),
        Some(_) => Err(GatewayError::invalid(
            format!("`{field}` must be a string."),
            Some(field),
        )),
    }
}

pub(crate) fn check_route_fields(
    route: Route,
    body: &Map<String, Value>,
) -> Result<(), GatewayError> {
    match route {
        Route::ChatCompletions => {
            let Some(messages) = body.get("messages") else {
                return Err(GatewayError::invalid(
                    "You must provide a `messages` parameter.",
                    Some("messages"),
                ));
            };
            let Some(messages) = messages.as_array().filter(|m| !m.is_empty()) else {
                return Err(GatewayError::invalid(
                    "`messages` must be a non-empty array of message objects.",
                    Some("messages"),
                ));
            };
            for (i, message) in messages.iter().enumerate() {
                let role_ok = message
                    .get("role")
                    .and_then(Value::as_str)
                    .is_some_and(|r| !r.is_empty());
                if !role_ok {
                    return Err(GatewayError::invalid(
                        format!("`messages[{i}]` must be an object with a string `role`."),
                        Some(&format!("messages[{i}].role")),
                    ));
                }
            }
            Ok(())
        }
        Route::Completions => match body.get("prompt") {
            Some(Value::String(_) | Value::Array(_)) => Ok(()),
            _ => Err(GatewayError::invalid(
                "`prompt` must be a string or an array.",
                Some("prompt"),
            )),
        },
        Route::Embeddings => match body.get("input") {
            Some(Value::String(_) | Value::Array(_)) => Ok(()),
            _ => Err(GatewayError::invalid(
                "`input` must be a string or an array.",
                Some("input"),
            )),
        },
        // Anthropic's own checks are left to Anthropic; these are the fields the keys read.
        Route::Messages => {
            match body.get("messages") {
                Some(Value::Array(messages)) if !messages.is_empty() => {}
                _ => {
                    return Err(GatewayError::invalid(
                        "`messages` must be a non-empty array of message objects.",
                        Some("messages"),
                    ))
                }
            }
            match body.get("max_tokens") {
                Some(Value::Number(n)) if n.is_u64() => Ok(()),
                None | Some(Value::Null) => Err(GatewayError::invalid(
                    "You must provide a `max_tokens` parameter.",
                    Some("max_tokens"),
                )),
                Some(_) => Err(GatewayError::invalid(
                    "`max_tokens` must be a non-negative integer.",
                    Some("max_tokens"),
                )),
            }
        }
        // `input` may be left out when `previous_response_id` or a stored `prompt` carries it.
        Route::Responses => match body.get("input") {
            None | Some(Value::Null | Value::String(_) | Value::Array(_)) => Ok(()),
            Some(_) => Err(GatewayError::invalid(
                "`input` must be a string or an array of input items.",
                Some("input"),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Request as HttpRequest;

    fn request(content_type: Option<&str>, body: &str) -> Request {
        let mut builder = HttpRequest::builder()
            .method("POST")
            .uri("/v1/chat/completions");
        if let Some(ct) = content_type {
            builder = builder.header(header::CONTENT_TYPE, ct);
        }
        builder.body(Body::from(body.to_owned())).expect("request")
    }

    async fn read_chat(
        ct: Option<&str>,
        body: &str,
        limit: usize,
    ) -> Result<Ingress, GatewayError> {
        read(
            Route::ChatCompletions,
            request(ct, body),
            limit,
            Instant::now(),
        )
        .await
    }

    #[tokio::test]
    async fn a_responses_request_needs_a_string_or_list_input_when_it_has_one() {
        let read_responses = |body: &'static str| {
            read(
                Route::Responses,
                request(Some("application/json"), body),
                1024,
                Instant::now(),
            )
        };
        for ok in [
            r#"{"model":"m","input":"hi"}"#,
            r#"{"model":"m","input":[{"role":"user","content":"hi"}]}"#,
            r#"{"model":"m","previous_response_id":"resp_1"}"#,
            // A stored prompt names its model.
            r#"{"prompt":{"id":"pmpt_1"},"input":"hi"}"#,
        ] {
            read_responses(ok).await.expect(ok);
        }
        let err = read_responses(r#"{"model":"m","input":5}"#)
            .await
            .expect_err("number");
        assert_eq!(err.status().as_u16(), 400);
        assert_eq!(err.body()["error"]["param"], "input");
    }

    #[tokio::test]
    async fn a_messages_request_needs_messages_and_max_tokens() {
        let read_messages = |body: &'static str| {
            read(
                Route::Messages,
                request(Some("application/json"), body),
                1024,
                Instant::now(),
            )
        };
        let ok = r#"{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}],"stream":true}"#;
        assert!(read_messages(ok).await.expect("valid").stream);
        for (body, param) in [
            (
                r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
                "max_tokens",
            ),
            (
                r#"{"model":"m","max_tokens":"8","messages":[{"role":"user","content":"hi"}]}"#,
                "max_tokens",
            ),
            (r#"{"model":"m","max_tokens":8,"messages":[]}"#, "messages"),
            (
                r#"{"max_tokens":8,"messages":[{"role":"user","content":"hi"}]}"#,
                "model",
            ),
        ] {
            let err = read_messages(body).await.expect_err(body);
            assert_eq!(err.status().as_u16(), 400, "{body}");
            assert_eq!(err.body()["error"]["param"], param, "{body}");
        }
    }

    #[test]
    fn paths_below_messages_and_anthropic_clients_go_to_anthropic() {
        assert_eq!(Route::Messages.provider(), Provider::Anthropic);
        assert_eq!(Route::Responses.provider(), Provider::OpenAi);
        let none = HeaderMap::new();
        for path in [
            "/messages",
            "/messages/count_tokens",
            "/messages/batches/b1",
        ] {
            assert_eq!(
                Provider::of_request(path, &none),
                Provider::Anthropic,
                "{path}"
            );
        }
        for path in ["/models", "/messagesx", "/responses/resp_1", "/"] {
            assert_eq!(
                Provider::of_request(path, &none),
                Provider::OpenAi,
                "{path}"
            );
        }
        // An Anthropic SDK's `models.list()`, and a browser's preflight for it.
        let mut sdk = HeaderMap::new();
        sdk.insert("anthropic-version", "2023-06-01".parse().expect("value"));
        assert_eq!(Provider::of_request("/models", &sdk), Provider::Anthropic);
        let mut preflight = HeaderMap::new();
        preflight.insert(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "content-type, Anthropic-Version,x-api-key"
                .parse()
                .expect("value"),
        );
        assert_eq!(
            Provider::of_request("/files", &preflight),
            Provider::Anthropic
        );
        // A preflight for an OpenAI route goes where its request will, whatever it names.
        assert_eq!(
            Provider::of_request("/chat/completions", &preflight),
            Provider::OpenAi
        );
        assert_eq!(Provider::of_request("/responses", &sdk), Provider::OpenAi);
        // An OpenAI client's preflight.
        let mut openai = HeaderMap::new();
        openai.insert(
            header::ACCESS_CONTROL_REQUEST_HEADERS,
            "authorization,content-type,x-stainless-os"
                .parse()
                .expect("value"),
        );
        assert_eq!(Provider::of_request("/models", &openai), Provider::OpenAi);
    }

    #[tokio::test]
    async fn accepts_a_chat_request_and_keeps_raw_bytes() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"x_unknown":1}"#;
        let ingress = read_chat(Some("application/json; charset=utf-8"), body, 1024)
            .await
            .expect("valid");
        assert_eq!(ingress.raw, body.as_bytes());
        assert!(ingress.stream);
        assert_eq!(ingress.model, "m");
        assert!(ingress.clock.body_read.is_some());
    }

    #[tokio::test]
    async fn rejects_bad_input_with_the_right_status_and_param() {
        let ok_body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        // (content type, body, size limit, expected status, expected param)
        type Case<'a> = (Option<&'a str>, &'a str, usize, u16, Option<&'a str>);
        let cases: Vec<Case> = vec![
            (Some("text/plain"), ok_body, 1024, 415, None),
            (None, ok_body, 1024, 415, None),
            (Some("application/json"), ok_body, 10, 413, None),
            (Some("application/json"), "{\"model\":", 1024, 400, None),
            (Some("application/json"), "[1]", 1024, 400, None),
            (
                Some("application/json"),
                r#"{"messages":[]}"#,
                1024,
                400,
                Some("model"),
            ),
            (
                Some("application/json"),
                r#"{"model":"m","messages":[]}"#,
                1024,
                400,
                Some("messages"),
            ),
            (
                Some("application/json"),
                r#"{"model":"m","messages":[{"content":"x"}]}"#,
                1024,
                400,
                Some("messages[0].role"),
            ),
            (
                Some("application/json"),
                r#"{"model":"m","messages":[{"role":"user"}],"stream":"yes"}"#,
                1024,
                400,
                Some("stream"),
            ),
        ];
        for (ct, body, limit, status, param) in cases {
            let err = read_chat(ct, body, limit).await.expect_err(body);
            assert_eq!(err.status().as_u16(), status, "{body}: {err}");
            assert_eq!(err.body()["error"]["param"].as_str(), param, "{body}");
        }
    }
}
