//! The simulator's Anthropic Messages API: `POST /v1/messages` (a `message` object, or its stream of
//! named events) and `POST /v1/messages/count_tokens`, validated as strictly as Anthropic validates,
//! with prompt caching (`cache_control` markers) echoed in `usage`. It answers with deterministic
//! words, never a model's, and must not answer in OpenAI's shapes: every error here is Anthropic's
//! `{"type":"error","error":{"type","message"}}`.
//!
//! Tokens are counted as elsewhere in the sim, 4 characters a token, over the canonical JSON (keys
//! sorted, `cache_control` left out) of each tool, system block and message content block; the
//! answer's tokens are its words. The answer is `--tokens` words, cut to `max_tokens` (then
//! `stop_reason: "max_tokens"`).
//!
//! Markers: with `tools`, a `tool_choice` of `any` or `tool` (no text first), or one of `auto`/none
//! and the word `weather` in the last user message (a few words of text first), answers with a
//! `tool_use` block (`stop_reason: "tool_use"`); `thinking: {"type":"enabled"|"adaptive"}` puts a
//! `thinking` block (words, then a signature) before the rest. Prompt caching: each marker's prefix
//! (tools, then system, then messages) is a cache entry per API key and model, kept 5 minutes (or
//! `ttl: "1h"`) from its last use; the longest stored prefix is read, the rest up to the last
//! marker written. A top-level `cache_control` marks the last block. No minimum length applies.
//!
//! Faults: `status=CODE` (and `overloaded` = 529, `rate-limit` = 429 with `retry-after`) in
//! Anthropic's shape, `hang`, `redirect`; in a stream `cut[=N]` (clean end after N deltas, no
//! `message_delta` or `message_stop`), `abort[=N]` (connection broken; a non-streamed body breaks
//! halfway), `malformed[=N]`, `error-event[=N]` (`event: error` with an `overloaded_error`, then
//! stop), `bad-tool-args` (the `partial_json` pieces do not make JSON), `stall-at-done`
//! (`message_stop` sent, connection held open); `refusal` ends the answer with `stop_reason:
//! "refusal"`. The others do not apply here. `count_tokens` is answered at once, without faults.
//!
//! Roles: `user` and `assistant`; also `system` among the turns when `anthropic-beta` lists a
//! `per-turn-control-*` beta, as Anthropic accepts it (Claude Code sends one).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::text::{self, Event};
use crate::{broken_body, early_fault, jittered, plan, stream_response, Fault, Sim};

/// How long an entry lives after its last use, by the marker's `ttl`.
const TTL_DEFAULT: Duration = Duration::from_secs(5 * 60);
const TTL_HOUR: Duration = Duration::from_secs(60 * 60);
/// Anthropic refuses more cache breakpoints than this in one request.
const MAX_MARKERS: usize = 4;
/// The word in the last user message that makes the answer call a tool (`tool_choice` auto).
const TOOL_WORD: &str = "weather";

/// Anthropic's error types, each with the status it comes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorType {
    InvalidRequest,
    Authentication,
    Permission,
    NotFound,
    RequestTooLarge,
    RateLimit,
    Api,
    Overloaded,
}

impl ErrorType {
    fn name(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request_error",
            Self::Authentication => "authentication_error",
            Self::Permission => "permission_error",
            Self::NotFound => "not_found_error",
            Self::RequestTooLarge => "request_too_large",
            Self::RateLimit => "rate_limit_error",
            Self::Api => "api_error",
            Self::Overloaded => "overloaded_error",
        }
    }

    /// The type Anthropic sends with a status (an injected `status=CODE`).
    fn of_status(code: u16) -> Self {
        match code {
            401 => Self::Authentication,
            403 => Self::Permission,
            404 => Self::NotFound,
            413 => Self::RequestTooLarge,
            429 => Self::RateLimit,
            529 => Self::Overloaded,
            400..=499 => Self::InvalidRequest,
            _ => Self::Api,
        }
    }
}

/// A refusal in Anthropic's shape.
struct ApiError {
    status: StatusCode,
    kind: ErrorType,
    message: String,
}

impl ApiError {
    fn invalid(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: ErrorType::InvalidRequest,
            message: message.into(),
        }
    }

    fn injected(code: u16) -> Self {
        let kind = ErrorType::of_status(code);
        let message = match kind {
            ErrorType::Overloaded => "Overloaded",
            ErrorType::RateLimit => "This request would exceed your rate limit (injected fault).",
            _ => "injected fault",
        };
        Self {
            status: StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            kind,
            message: message.to_owned(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({"type": "error", "error": {"type": self.kind.name(), "message": self.message}});
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// Which endpoint a body is checked for: they take different fields.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Route {
    Create,
    CountTokens,
}

/// Top-level fields Anthropic accepts on `POST /v1/messages`; any other is refused, as
/// Anthropic refuses it, so a gateway that adds an OpenAI field is caught.
const CREATE_FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_k",
    "top_p",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
    "container",
    "cache_control",
    "diagnostics",
    "inference_geo",
    "output_config",
    "speed",
    "mcp_servers",
    "context_management",
];

/// The same for `count_tokens`, which takes no `max_tokens`, sampling or `stream`.
const COUNT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "thinking",
    "cache_control",
    "output_config",
    "speed",
    "mcp_servers",
    "context_management",
];

/// One cacheable piece of the prompt, in Anthropic's cache order (tools, system, messages).
struct Item {
    /// Canonical JSON of the piece with its place (`["message", 2, "user", block]`).
    canonical: String,
    tokens: u64,
    /// The marker's lifetime, when this piece carries `cache_control`.
    marker: Option<Duration>,
}

/// What thinking the request asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Thinking {
    Off,
    /// `enabled` with a budget, or `adaptive` (no budget: the answer's own length bounds it).
    On {
        budget: Option<u64>,
    },
}

/// A request that passed validation, reduced to what shapes the answer.
struct Request {
    model: String,
    max_tokens: u64,
    stream: bool,
    thinking: Thinking,
    /// The tool the answer calls, and whether `tool_choice` forced it.
    tool: Option<(String, bool)>,
    items: Vec<Item>,
}

fn type_error(path: &str, expected: &str) -> ApiError {
    ApiError::invalid(format!("{path}: Input should be {expected}"))
}

fn required(path: &str) -> ApiError {
    ApiError::invalid(format!("{path}: Field required"))
}

/// The marker on a block, checked: `{"type":"ephemeral"}`, optional `ttl` `5m` or `1h`.
fn marker(block: &Value, path: &str) -> Result<Option<Duration>, ApiError> {
    let Some(cc) = block.get("cache_control") else {
        return Ok(None);
    };
    if cc.is_null() {
        return Ok(None);
    }
    if cc.get("type").and_then(Value::as_str) != Some("ephemeral") {
        return Err(type_error(
            &format!("{path}.cache_control.type"),
            "'ephemeral'",
        ));
    }
    match cc.get("ttl") {
        None | Some(Value::Null) => Ok(Some(TTL_DEFAULT)),
        Some(t) if t == "5m" => Ok(Some(TTL_DEFAULT)),
        Some(t) if t == "1h" => Ok(Some(TTL_HOUR)),
        Some(_) => Err(type_error(
            &format!("{path}.cache_control.ttl"),
            "'5m' or '1h'",
        )),
    }
}

/// Canonical JSON: object keys sorted at every level, whatever order serde_json keeps.
fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// A prompt piece: its place and content (without the marker, which is not content) made canonical.
fn item(place: Value, block: &Value, path: &str) -> Result<Item, ApiError> {
    let marker = marker(block, path)?;
    let mut content = block.clone();
    if let Some(map) = content.as_object_mut() {
        map.remove("cache_control");
    }
    let mut canonical_text = String::new();
    let mut placed = place;
    if let Some(list) = placed.as_array_mut() {
        list.push(content);
    }
    canonical(&placed, &mut canonical_text);
    Ok(Item {
        tokens: text::estimate_tokens(&canonical_text),
        canonical: canonical_text,
        marker,
    })
}

fn text_block(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// One message's content as blocks, checked: a string, or an array of typed blocks.
fn content_blocks(content: &Value, path: &str) -> Result<Vec<Value>, ApiError> {
    match content {
        Value::String(s) => Ok(vec![text_block(s)]),
        Value::Array(blocks) => {
            for (j, block) in blocks.iter().enumerate() {
                let at = format!("{path}.{j}");
                if !block.is_object() {
                    return Err(type_error(&at, "a valid dictionary"));
                }
                match block.get("type").map(Value::as_str) {
                    None => return Err(required(&format!("{at}.type"))),
                    Some(None) => return Err(type_error(&format!("{at}.type"), "a valid string")),
                    Some(Some("text")) => match block.get("text") {
                        None => return Err(required(&format!("{at}.text"))),
                        Some(Value::String(t)) if t.is_empty() => {
                            return Err(ApiError::invalid(
                                "messages: text content blocks must be non-empty",
                            ))
                        }
                        Some(Value::String(_)) => {}
                        Some(_) => return Err(type_error(&format!("{at}.text"), "a valid string")),
                    },
                    Some(Some(_)) => {}
                }
            }
            Ok(blocks.clone())
        }
        Value::Null => Err(required(path)),
        _ => Err(type_error(path, "a valid string or a valid list")),
    }
}

/// The text of the last user message (its string, or its text blocks joined).
fn last_user_text(messages: &[Value]) -> String {
    let Some(last) = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))
    else {
        return String::new();
    };
    match last.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

impl Request {
    /// Checks a body the way Anthropic does, first failure wins, and keeps what the answer needs.
    /// `system_turns`: the request enables a beta that allows `system` messages among the turns.
    fn parse(body: &Value, route: Route, system_turns: bool) -> Result<Self, ApiError> {
        let Some(fields) = body.as_object() else {
            return Err(ApiError::invalid(
                "There was an error parsing the body of your request: it must be a JSON object",
            ));
        };
        let known = match route {
            Route::Create => CREATE_FIELDS,
            Route::CountTokens => COUNT_FIELDS,
        };
        if let Some(extra) = fields.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ApiError::invalid(format!(
                "{extra}: Extra inputs are not permitted"
            )));
        }
        let model = match fields.get("model") {
            None => return Err(required("model")),
            Some(Value::String(m)) => m.clone(),
            Some(_) => return Err(type_error("model", "a valid string")),
        };
        let max_tokens = match (route, fields.get("max_tokens")) {
            (Route::CountTokens, _) => 0,
            (Route::Create, None) => return Err(required("max_tokens")),
            (Route::Create, Some(v)) => match (v.as_u64(), v.as_i64()) {
                (Some(n), _) if n >= 1 => n,
                (_, Some(_)) => return Err(type_error("max_tokens", "greater than or equal to 1")),
                _ => return Err(type_error("max_tokens", "a valid integer")),
            },
        };
        let messages = match fields.get("messages") {
            None => return Err(required("messages")),
            Some(Value::Array(m)) => m.as_slice(),
            Some(_) => return Err(type_error("messages", "a valid list")),
        };
        if messages.is_empty() {
            return Err(ApiError::invalid(
                "messages: at least one message is required",
            ));
        }
        let stream = match fields.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(type_error("stream", "a valid boolean")),
        };
        let mut items = Vec::new();
        let tools = match fields.get("tools") {
            None | Some(Value::Null) => &[][..],
            Some(Value::Array(t)) => t.as_slice(),
            Some(_) => return Err(type_error("tools", "a valid list")),
        };
        for (i, tool) in tools.iter().enumerate() {
            let at = format!("tools.{i}");
            if !tool.is_object() {
                return Err(type_error(&at, "a valid dictionary"));
            }
            match tool.get("name") {
                Some(Value::String(_)) => {}
                None => return Err(required(&format!("{at}.name"))),
                Some(_) => return Err(type_error(&format!("{at}.name"), "a valid string")),
            }
            // A client tool (no type, or `custom`) needs its schema; server tools have a dated type.
            let custom = tool.get("type").is_none_or(|t| t == "custom");
            if custom && !tool.get("input_schema").is_some_and(Value::is_object) {
                return Err(required(&format!("{at}.input_schema")));
            }
            items.push(item(json!(["tool"]), tool, &at)?);
        }
        match fields.get("system") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => {
                items.push(item(json!(["system"]), &text_block(s), "system")?)
            }
            Some(Value::Array(blocks)) => {
                for (j, block) in blocks.iter().enumerate() {
                    let at = format!("system.{j}");
                    if block.get("type").and_then(Value::as_str) != Some("text") {
                        return Err(type_error(&format!("{at}.type"), "'text'"));
                    }
                    if !block.get("text").is_some_and(Value::is_string) {
                        return Err(required(&format!("{at}.text")));
                    }
                    items.push(item(json!(["system"]), block, &at)?);
                }
            }
            Some(_) => return Err(type_error("system", "a valid string or a valid list")),
        }
        let last = messages.len() - 1;
        for (i, message) in messages.iter().enumerate() {
            let at = format!("messages.{i}");
            if !message.is_object() {
                return Err(type_error(&at, "a valid dictionary"));
            }
            let role = match message.get("role").map(Value::as_str) {
                None => return Err(required(&format!("{at}.role"))),
                Some(Some(r @ ("user" | "assistant"))) => r,
                Some(Some(r @ "system")) if system_turns => r,
                Some(_) => return Err(type_error(&format!("{at}.role"), "'user' or 'assistant'")),
            };
            let content = message.get("content").unwrap_or(&Value::Null);
            let blocks = content_blocks(content, &format!("{at}.content"))?;
            // Only a final assistant turn (a prefill) may be empty.
            let empty = blocks.is_empty() || (content.as_str() == Some(""));
            if empty && !(i == last && role == "assistant") {
                return Err(ApiError::invalid(format!(
                    "{at}: all messages must have non-empty content except for the optional final assistant message"
                )));
            }
            for (j, block) in blocks.iter().enumerate() {
                items.push(item(
                    json!(["message", i, role]),
                    block,
                    &format!("{at}.content.{j}"),
                )?);
            }
        }
        // A top-level marker is automatic caching: it marks the last block.
        if let Some(cc) = fields.get("cache_control").filter(|c| !c.is_null()) {
            let ttl = marker(&json!({"cache_control": cc}), "")?;
            if let Some(last) = items.last_mut() {
                last.marker = ttl;
            }
        }
        let markers = items.iter().filter(|i| i.marker.is_some()).count();
        if markers > MAX_MARKERS {
            return Err(ApiError::invalid(format!(
                "A maximum of {MAX_MARKERS} blocks with cache_control may be provided. Found {markers}."
            )));
        }
        let thinking = match fields.get("thinking") {
            None | Some(Value::Null) => Thinking::Off,
            Some(t) => match t.get("type").and_then(Value::as_str) {
                Some("disabled") => Thinking::Off,
                Some("adaptive") => Thinking::On { budget: None },
                Some("enabled") => {
                    let budget = match t.get("budget_tokens") {
                        None => return Err(required("thinking.enabled.budget_tokens")),
                        Some(b) => b.as_u64().ok_or_else(|| {
                            type_error("thinking.enabled.budget_tokens", "a valid integer")
                        })?,
                    };
                    if budget < 1024 {
                        return Err(type_error(
                            "thinking.enabled.budget_tokens",
                            "greater than or equal to 1024",
                        ));
                    }
                    if route == Route::Create && max_tokens <= budget {
                        return Err(ApiError::invalid(
                            "`max_tokens` must be greater than `thinking.budget_tokens`",
                        ));
                    }
                    Thinking::On {
                        budget: Some(budget),
                    }
                }
                _ => {
                    return Err(type_error(
                        "thinking.type",
                        "'enabled', 'disabled' or 'adaptive'",
                    ))
                }
            },
        };
        let tool = Self::tool(fields, tools, messages, thinking)?;
        Ok(Self {
            model,
            max_tokens,
            stream,
            thinking,
            tool,
            items,
        })
    }

    /// The tool the answer calls (and whether it was forced), from `tool_choice` and the marker word.
    fn tool(
        fields: &Map<String, Value>,
        tools: &[Value],
        messages: &[Value],
        thinking: Thinking,
    ) -> Result<Option<(String, bool)>, ApiError> {
        let choice = match fields.get("tool_choice") {
            None | Some(Value::Null) => None,
            Some(c) => Some(c),
        };
        if choice.is_some() && tools.is_empty() {
            return Err(ApiError::invalid(
                "tool_choice may only be specified while providing tools.",
            ));
        }
        let first = tools
            .first()
            .and_then(|t| t.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let kind = choice.map(|c| c.get("type").and_then(Value::as_str));
        let forced = match kind {
            None | Some(Some("auto")) => false,
            Some(Some("none")) => return Ok(None),
            Some(Some("any")) => true,
            Some(Some("tool")) => {
                let name = choice
                    .and_then(|c| c.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| required("tool_choice.tool.name"))?;
                if !tools
                    .iter()
                    .any(|t| t.get("name").and_then(Value::as_str) == Some(name))
                {
                    return Err(ApiError::invalid(format!(
                        "tool_choice.name: Tool '{name}' not found in tools"
                    )));
                }
                if thinking != Thinking::Off {
                    return Err(ApiError::invalid(
                        "Thinking may not be enabled when tool_choice forces tool use.",
                    ));
                }
                return Ok(Some((name.to_owned(), true)));
            }
            Some(_) => {
                return Err(type_error(
                    "tool_choice.type",
                    "'auto', 'any', 'tool' or 'none'",
                ))
            }
        };
        if forced && thinking != Thinking::Off {
            return Err(ApiError::invalid(
                "Thinking may not be enabled when tool_choice forces tool use.",
            ));
        }
        let asked = last_user_text(messages).to_lowercase().contains(TOOL_WORD);
        Ok(first.filter(|_| forced || asked).map(|name| (name, forced)))
    }

    fn input_tokens(&self) -> u64 {
        self.items.iter().map(|i| i.tokens).sum()
    }

    /// The seed of the answer's words: the model and the whole prompt.
    fn seed(&self) -> blake3::Hash {
        let mut hasher = blake3::Hasher::new();
        hasher.update(self.model.as_bytes());
        for item in &self.items {
            hasher.update(b"\0").update(item.canonical.as_bytes());
        }
        hasher.finalize()
    }
}

/// Prompt-cache entries by prefix key, each with the instant it expires.
#[derive(Default)]
pub struct PromptCache {
    entries: Mutex<HashMap<[u8; 32], Instant>>,
}

/// One marker's prefix: its key, the tokens up to and including it, its lifetime.
struct Prefix {
    key: [u8; 32],
    tokens: u64,
    ttl: Duration,
}

/// Tokens read from and written to the prompt cache by one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CacheUse {
    read: u64,
    created: u64,
}

/// Every marker's prefix, in order, keyed by API key, model and the canonical pieces
/// (length-prefixed, so no two lists of pieces share a key).
fn prefixes(api_key: &str, request: &Request) -> Vec<Prefix> {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&(api_key.len() as u64).to_le_bytes());
    hasher.update(api_key.as_bytes());
    hasher.update(&(request.model.len() as u64).to_le_bytes());
    hasher.update(request.model.as_bytes());
    let mut tokens = 0;
    let mut out = Vec::new();
    for item in &request.items {
        hasher.update(&(item.canonical.len() as u64).to_le_bytes());
        hasher.update(item.canonical.as_bytes());
        tokens += item.tokens;
        if let Some(ttl) = item.marker {
            out.push(Prefix {
                key: *hasher.clone().finalize().as_bytes(),
                tokens,
                ttl,
            });
        }
    }
    out
}

impl PromptCache {
    /// What a request would read and write: the longest live prefix is read, the rest up to the
    /// last marker written.
    fn look(&self, prefixes: &[Prefix], now: Instant) -> CacheUse {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let read = prefixes
            .iter()
            .rev()
            .find(|p| entries.get(&p.key).is_some_and(|expiry| *expiry > now))
            .map_or(0, |p| p.tokens);
        let last = prefixes.last().map_or(0, |p| p.tokens);
        CacheUse {
            read,
            created: last - read,
        }
    }

    /// Stores or refreshes every marker's prefix (a read refreshes too, as Anthropic's does) and
    /// drops the expired entries.
    fn keep(&self, prefixes: &[Prefix], now: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries.retain(|_, expiry| *expiry > now);
        for prefix in prefixes {
            entries.insert(prefix.key, now + prefix.ttl);
        }
    }
}

/// One block of the answer.
enum Block {
    Thinking {
        words: Vec<String>,
        signature: String,
    },
    Text(Vec<String>),
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
}

/// The answer: its blocks and why it stopped.
struct Answer {
    blocks: Vec<Block>,
    stop_reason: &'static str,
}

impl Answer {
    /// `tokens` words of text, cut to `max_tokens` counting thinking words too; a tool call after a
    /// short preamble (none when forced); thinking first when asked.
    fn new(request: &Request, tokens: u32, id_number: u64, fault: Option<&Fault>) -> Self {
        let seed = request.seed();
        let reader = |label: &[u8]| {
            blake3::Hasher::new()
                .update(seed.as_bytes())
                .update(label)
                .finalize_xof()
        };
        let mut budget = request.max_tokens;
        let mut blocks = Vec::new();
        let mut cut = false;
        if let Thinking::On { budget: think } = request.thinking {
            let want = u64::from(tokens / 2).max(1).min(think.unwrap_or(u64::MAX));
            let n = want.min(budget);
            cut |= n < want;
            budget -= n;
            let words = text::words(&mut reader(b"thinking"), n as u32);
            let digest = blake3::hash(words.concat().as_bytes());
            let signature = base64::engine::general_purpose::STANDARD.encode(digest.as_bytes());
            blocks.push(Block::Thinking { words, signature });
        }
        let want = match &request.tool {
            Some((_, true)) => 0,
            Some((_, false)) => tokens.min(5),
            None => tokens,
        };
        let n = u64::from(want).min(budget);
        cut |= n < u64::from(want);
        budget -= n;
        let words = text::words(&mut reader(b"text"), n as u32);
        if n > 0 {
            blocks.push(Block::Text(words.clone()));
        }
        let mut called = false;
        if let Some((name, _)) = request.tool.as_ref().filter(|_| budget > 0) {
            let query = text::words(&mut reader(b"tool"), 3).concat().to_lowercase();
            blocks.push(Block::ToolUse {
                id: format!("toolu_sim{id_number:010}"),
                name: name.clone(),
                input: json!({"query": query, "count": 3}),
            });
            called = true;
        }
        let stop_reason = if cut || (request.tool.is_some() && !called) {
            "max_tokens"
        } else if called {
            "tool_use"
        } else if fault == Some(&Fault::Refusal) {
            "refusal"
        } else {
            "end_turn"
        };
        Self {
            blocks,
            stop_reason,
        }
    }

    fn output_tokens(&self) -> u64 {
        self.blocks
            .iter()
            .map(|b| match b {
                Block::Thinking { words, .. } | Block::Text(words) => words.len() as u64,
                Block::ToolUse { input, .. } => text::estimate_tokens(&input.to_string()),
            })
            .sum::<u64>()
            .max(1)
    }

    /// The streamed deltas of the answer: one per word, 8 characters of tool input at a time.
    fn delta_count(&self) -> u32 {
        self.blocks
            .iter()
            .map(|b| match b {
                Block::Thinking { words, .. } | Block::Text(words) => words.len() as u32,
                Block::ToolUse { input, .. } => pieces(&input.to_string()).len() as u32,
            })
            .sum()
    }

    fn block_json(block: &Block, full: bool) -> Value {
        match block {
            Block::Thinking { words, signature } if full => {
                json!({"type": "thinking", "thinking": words.concat(), "signature": signature})
            }
            Block::Thinking { .. } => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Block::Text(words) if full => json!({"type": "text", "text": words.concat()}),
            Block::Text(_) => json!({"type": "text", "text": ""}),
            Block::ToolUse { id, name, input } => json!({
                "type": "tool_use", "id": id, "name": name,
                "input": if full { input.clone() } else { json!({}) },
            }),
        }
    }
}

/// Tool input as Anthropic streams it: a few characters a piece.
fn pieces(json: &str) -> Vec<String> {
    let chars: Vec<char> = json.chars().collect();
    chars.chunks(8).map(|c| c.iter().collect()).collect()
}

/// What every object of one message shares.
struct Shape<'a> {
    id: String,
    model: &'a str,
    input_tokens: u64,
    cache: CacheUse,
}

impl Shape<'_> {
    fn usage(&self, output_tokens: u64) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": self.cache.created,
            "cache_read_input_tokens": self.cache.read,
        })
    }

    /// The `message` object; `full` for the whole answer, else as `message_start` carries it.
    fn message(&self, answer: &Answer, full: bool) -> Value {
        let content: Vec<Value> = if full {
            answer
                .blocks
                .iter()
                .map(|b| Answer::block_json(b, true))
                .collect()
        } else {
            Vec::new()
        };
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": if full { json!(answer.stop_reason) } else { Value::Null },
            "stop_sequence": null,
            // Anthropic's `message_start` already counts one output token.
            "usage": self.usage(if full { answer.output_tokens() } else { 1 }),
        })
    }

    /// The named-event stream, with any mid-stream fault applied.
    fn events(&self, answer: &Answer, fault: Option<&Fault>) -> Vec<Event> {
        let mut events = vec![Event::Immediate(named(
            &json!({"type": "message_start", "message": self.message(answer, false)}),
        ))];
        let mut sent = 0u32;
        for (index, block) in answer.blocks.iter().enumerate() {
            events.push(Event::Immediate(named(&json!({
                "type": "content_block_start", "index": index,
                "content_block": Answer::block_json(block, false),
            }))));
            if index == 0 {
                events.push(Event::Immediate(named(&json!({"type": "ping"}))));
            }
            let deltas: Vec<Value> = match block {
                Block::Thinking { words, .. } => words
                    .iter()
                    .map(|w| json!({"type": "thinking_delta", "thinking": w}))
                    .collect(),
                Block::Text(words) => words
                    .iter()
                    .map(|w| json!({"type": "text_delta", "text": w}))
                    .collect(),
                Block::ToolUse { input, .. } => {
                    let mut json_text = input.to_string();
                    if fault == Some(&Fault::BadToolArgs) {
                        json_text.truncate(json_text.len() / 2);
                    }
                    // Anthropic opens a tool block's input with an empty piece.
                    events.push(Event::Immediate(named(&json!({
                        "type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": ""},
                    }))));
                    pieces(&json_text)
                        .into_iter()
                        .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                        .collect()
                }
            };
            for delta in deltas {
                match fault {
                    Some(Fault::Cut(n)) if sent == *n => return events,
                    Some(Fault::Abort(n)) if sent == *n => {
                        events.push(Event::Abort);
                        return events;
                    }
                    Some(Fault::ErrorEvent(n)) if sent == *n => {
                        events.push(Event::Immediate(named(&json!({
                            "type": "error",
                            "error": {"type": "overloaded_error", "message": "Overloaded"},
                        }))));
                        return events;
                    }
                    Some(Fault::Malformed(n)) if sent == *n => {
                        events.push(Event::Immediate(Bytes::from_static(
                            b"event: content_block_delta\ndata: {\"type\": \"content_block_delta\", not json\n\n",
                        )));
                    }
                    _ => {}
                }
                events.push(Event::Token(named(&json!({
                    "type": "content_block_delta", "index": index, "delta": delta,
                }))));
                sent += 1;
            }
            if let Block::Thinking { signature, .. } = block {
                events.push(Event::Immediate(named(&json!({
                    "type": "content_block_delta", "index": index,
                    "delta": {"type": "signature_delta", "signature": signature},
                }))));
            }
            events.push(Event::Immediate(named(
                &json!({"type": "content_block_stop", "index": index}),
            )));
        }
        events.push(Event::Immediate(named(&json!({
            "type": "message_delta",
            "delta": {"stop_reason": answer.stop_reason, "stop_sequence": null},
            "usage": {"output_tokens": answer.output_tokens()},
        }))));
        events.push(Event::Immediate(named(&json!({"type": "message_stop"}))));
        if fault == Some(&Fault::StallAtDone) {
            events.push(Event::Stall);
        }
        events
    }
}

/// One SSE event named by its data's `type`, as Anthropic sends every event.
fn named(data: &Value) -> Bytes {
    let kind = data["type"].as_str().unwrap_or("");
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// The caller's API key (`x-api-key`, or a bearer token), after the `anthropic-version` check.
fn credentials(headers: &HeaderMap) -> Result<String, ApiError> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let key = header("x-api-key")
        .map(str::to_owned)
        .or_else(|| {
            header(header::AUTHORIZATION.as_str())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::to_owned)
        })
        .filter(|k| !k.trim().is_empty());
    let Some(key) = key else {
        return Err(ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: ErrorType::Authentication,
            message: "x-api-key header is required".to_owned(),
        });
    };
    if header("anthropic-version").is_none_or(|v| v.trim().is_empty()) {
        return Err(ApiError::invalid("anthropic-version: header is required"));
    }
    Ok(key)
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::invalid(format!(
            "There was an error parsing the body of your request: {e}"
        ))
    })
}

/// Adds Anthropic's `request-id` header.
fn with_request_id(mut response: Response, n: u64) -> Response {
    if let Ok(value) = HeaderValue::from_str(&format!("req_sim{n:010}")) {
        response.headers_mut().insert("request-id", value);
    }
    response
}

/// `POST /v1/messages`.
pub async fn create(State(sim): State<Sim>, headers: HeaderMap, body: Bytes) -> Response {
    sim.stats.messages.fetch_add(1, Ordering::SeqCst);
    sim.stats.note_auth(&headers);
    let n = sim.ids.fetch_add(1, Ordering::SeqCst);
    let response = match answer(&sim, &headers, &body, n).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    };
    with_request_id(response, n)
}

async fn answer(
    sim: &Sim,
    headers: &HeaderMap,
    body: &Bytes,
    n: u64,
) -> Result<Response, ApiError> {
    let api_key = credentials(headers)?;
    let request = Request::parse(&parse_json(body)?, Route::Create, system_turns(headers))?;
    let prefixes = prefixes(&api_key, &request);
    let cache = sim.prompt_cache.look(&prefixes, Instant::now());
    let total = request.input_tokens();
    // Prefill covers what the cache did not: a read makes the first token come sooner.
    let plan = plan(sim, headers, total - cache.read).map_err(ApiError::invalid)?;
    match &plan.fault {
        Some(Fault::Status(code)) => return Err(ApiError::injected(*code)),
        _ => {
            if let Some(response) = early_fault(&plan).await {
                return Ok(response);
            }
        }
    }
    sim.prompt_cache.keep(&prefixes, Instant::now());
    if cache.created > 0 {
        sim.stats.cache_creations.fetch_add(1, Ordering::SeqCst);
    }
    if cache.read > 0 {
        sim.stats.cache_reads.fetch_add(1, Ordering::SeqCst);
    }
    let answer = Answer::new(&request, plan.tokens, n, plan.fault.as_ref());
    let shape = Shape {
        id: format!("msg_sim{n:010}"),
        model: &request.model,
        input_tokens: total - cache.read - cache.created,
        cache,
    };
    if request.stream {
        return Ok(stream_response(
            shape.events(&answer, plan.fault.as_ref()),
            plan,
        ));
    }
    // A non-streamed answer arrives when its last token would have.
    let decode = plan.itl_ms * f64::from(answer.delta_count().saturating_sub(1));
    tokio::time::sleep(plan.ttft + jittered(decode, plan.jitter)).await;
    let body = shape.message(&answer, true);
    if matches!(plan.fault, Some(Fault::Abort(_))) {
        return Ok(broken_body(&body));
    }
    Ok((StatusCode::OK, Json(body)).into_response())
}

/// Whether the request's `anthropic-beta` list enables a `per-turn-control-*` beta, under which
/// Anthropic accepts `system` messages among the turns (Claude Code sends its environment so, after
/// the user's question); without it a `system` role is refused, as Anthropic refuses it.
fn system_turns(headers: &HeaderMap) -> bool {
    headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|beta| beta.trim().starts_with("per-turn-control-"))
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, counted as `usage` counts them.
pub async fn count_tokens(State(sim): State<Sim>, headers: HeaderMap, body: Bytes) -> Response {
    sim.stats.count_tokens.fetch_add(1, Ordering::SeqCst);
    let n = sim.ids.fetch_add(1, Ordering::SeqCst);
    let counted = credentials(&headers).and_then(|_| {
        Request::parse(
            &parse_json(&body)?,
            Route::CountTokens,
            system_turns(&headers),
        )
    });
    let response = match counted {
        Ok(request) => Json(json!({"input_tokens": request.input_tokens()})).into_response(),
        Err(error) => error.into_response(),
    };
    with_request_id(response, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> Request {
        match Request::parse(&body, Route::Create, false) {
            Ok(r) => r,
            Err(e) => panic!("{}", e.message),
        }
    }

    fn marked(question: &str) -> Request {
        request(json!({
            "model": "m", "max_tokens": 64,
            "system": [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": question}],
        }))
    }

    #[test]
    fn a_system_turn_needs_the_per_turn_control_beta() {
        // As Claude Code sends it: the question, then its environment as a `system` turn.
        let body = json!({"model": "m", "max_tokens": 64, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "how do I reset my password"}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
        ]});
        let refused = Request::parse(&body, Route::Create, false).err();
        assert!(
            refused.is_some_and(|e| e.message.contains("'user' or 'assistant'")),
            "a system turn without the beta is refused"
        );
        let mut headers = HeaderMap::new();
        headers.insert(
            "anthropic-beta",
            HeaderValue::from_static("claude-code-20250219, per-turn-control-2026-07-01"),
        );
        assert!(system_turns(&headers));
        assert!(Request::parse(&body, Route::Create, system_turns(&headers)).is_ok());
        headers.insert(
            "anthropic-beta",
            HeaderValue::from_static("claude-code-20250219"),
        );
        assert!(!system_turns(&headers));
    }

    #[test]
    fn a_prefix_expires_five_minutes_after_its_last_use() {
        let cache = PromptCache::default();
        let r = marked("one");
        let p = prefixes("k", &r);
        let t0 = Instant::now();
        let first = cache.look(&p, t0);
        assert_eq!(first.read, 0);
        assert!(first.created > 0);
        cache.keep(&p, t0);
        let later = t0 + Duration::from_secs(240);
        assert_eq!(cache.look(&p, later).read, first.created);
        cache.keep(&p, later);
        // Refreshed at 240 s, so still there at 480 s, gone at 541 s.
        assert_eq!(
            cache.look(&p, later + Duration::from_secs(240)).read,
            first.created
        );
        assert_eq!(cache.look(&p, later + Duration::from_secs(301)).read, 0);
    }

    #[test]
    fn the_key_is_per_api_key_and_model_and_ignores_what_follows_the_marker() {
        let cache = PromptCache::default();
        let t0 = Instant::now();
        cache.keep(&prefixes("k", &marked("one")), t0);
        assert!(cache.look(&prefixes("k", &marked("two")), t0).read > 0);
        assert_eq!(cache.look(&prefixes("other", &marked("one")), t0).read, 0);
        let mut other_model = marked("one");
        other_model.model = "n".into();
        assert_eq!(cache.look(&prefixes("k", &other_model), t0).read, 0);
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let mut a = String::new();
        canonical(&json!({"b": [{"y": 1, "x": 2}], "a": "s"}), &mut a);
        assert_eq!(a, r#"{"a":"s","b":[{"x":2,"y":1}]}"#);
    }
}
