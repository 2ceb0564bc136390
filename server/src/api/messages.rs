//! Anthropic's Messages API adapter (`POST /v1/messages`): its keys, its never-store rules, and its
//! shapes of an answer (a `message` object, or the named events `message_start` …
//! `message_stop` that stream it), so that either kind of hit is served from either kind of miss.
//! It must not change what is forwarded: the request, `cache_control` markers included, goes to
//! Anthropic byte for byte; nothing here reads the cache or the store.
//!
//! ## What goes into the keys
//!
//! - **Partition**: as for chat (tenant, namespace, route, model), the `anthropic-version` and
//!   `anthropic-beta` headers (a beta can change the answer's shape; values split at commas, sorted),
//!   `system` (a string, or text blocks, normalized like message text), `tools`, `tool_choice`,
//!   `max_tokens`, `temperature`, `top_p`, `top_k`, `stop_sequences`, `thinking`, every message but
//!   the final user turn (earlier turns, and the assistant turns and tool results after it), the
//!   final user turn's blocks other than text (images, documents), and every unknown field.
//! - **Left out**: `stream`, `metadata` (its `user_id` names the end user, not the answer),
//!   `service_tier` (the capacity that serves the request, not what it answers), and every
//!   `cache_control` marker, the top-level one and those on tools, system blocks and content
//!   blocks. A marker only tells Anthropic where to cache the prompt's prefix: the same prompt with
//!   or without it gets the same answer, so requests that differ only in markers share an entry.
//!   The markers themselves still reach Anthropic, since the raw body is forwarded.
//! - **Exact key**: the partition plus the final user turn: the last `user` message that has text
//!   and no `tool_result` (a message of tool results answers a tool call; it is context, not a
//!   question). **Prompt** (the semantic text): the turn's last text block, which is what the user
//!   typed; blocks before it (Claude Code's `<system-reminder>` blocks: the working folder, the
//!   date, the tools and skills on offer) are context, so they go into the partition with the
//!   turn's other blocks, and two turns share a partition only when that context is the same.
//! - **Billing line**: a `system` text block that is a single `x-anthropic-billing-header: ...`
//!   line is left out. It is attribution metadata Anthropic reads off the request (Claude Code
//!   sends its version, entry point and a suffix that changes with every prompt), not an
//!   instruction to the model: keeping it would give each prompt a partition of its own.
//!
//! A string `content` equals a content list of one text block, and `system` likewise.
//!
//! ## Warming
//!
//! `POST /admin/entries` with `route: "messages"`: a `prompt`, chat-shaped `messages` (a system
//! message becomes `system`) or a whole `request`; `max_tokens` as the app sends it (it is in the
//! key), and stored under each `anthropic-version` Anthropic's clients send (`2023-06-01`,
//! `2026-10-21`) unless the item's `headers` say otherwise.
//!
//! ## Ids and usage on a hit
//!
//! A hit carries a fresh `msg_` id; the rest of the message (content, `stop_reason`, `usage`) is
//! the stored one: `usage` tells what the answer cost when it was made, prompt-cache reads
//! included, not what the hit cost (nothing upstream).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{pieces, Api, Uncacheable, Warm};
use crate::entry::StoredEvent;
use crate::error::GatewayError;
use crate::ingress::Route;
use crate::key::{
    canonical_message, final_turn, hash_fields, model_field, normalize_text, unreadable,
};
use crate::key::{FieldHasher, Ignored, Turn};
use crate::sse::EventKind;

/// `POST /v1/messages`.
pub struct Messages;

impl Api for Messages {
    fn route(&self) -> Route {
        Route::Messages
    }

    fn key_headers(&self) -> &'static [&'static str] {
        &["anthropic-version", "anthropic-beta"]
    }

    fn turn(
        &self,
        body: &Map<String, Value>,
        partition: &mut FieldHasher,
    ) -> Result<Turn, GatewayError> {
        keys(body, partition)
    }

    fn check(&self, body: &Value, allow_length: bool) -> Result<(), Uncacheable> {
        check(body, allow_length)
    }

    fn assemble_events(&self, events: &mut dyn Iterator<Item = &Value>) -> Value {
        assemble(events)
    }

    fn rechunk(&self, body: &Value, decode_ms: f64) -> Vec<StoredEvent> {
        rechunk(body, decode_ms)
    }

    fn stream_event(&self, kind: EventKind) -> EventKind {
        stream_event(kind)
    }

    fn id_prefix(&self) -> &'static str {
        "msg_"
    }

    fn warm(&self) -> Option<&dyn Warm> {
        Some(self)
    }
}

/// The `anthropic-version`s Anthropic's clients send: Claude Code (and most examples) the first,
/// the current SDKs (`anthropic` 2.17, `@anthropic-ai/sdk` 1.17) the second. It is in the key, so a
/// warmed item is stored under each.
const ANTHROPIC_VERSIONS: [&str; 2] = ["2023-06-01", "2026-10-21"];

impl Warm for Messages {
    fn prompt(&self, prompt: String) -> Map<String, Value> {
        Map::from_iter([(
            "messages".to_owned(),
            json!([{"role": "user", "content": prompt}]),
        )])
    }

    fn messages(&self, messages: Vec<Value>) -> Result<Map<String, Value>, GatewayError> {
        // `system` is a top-level field of this API: a warmed conversation in chat's shape (a
        // leading system message) becomes the request its app would send.
        let (system, turns): (Vec<Value>, Vec<Value>) = messages
            .into_iter()
            .partition(|m| m.get("role").and_then(Value::as_str) == Some("system"));
        let mut body = Map::from_iter([("messages".to_owned(), Value::Array(turns))]);
        let texts: Vec<&str> = system
            .iter()
            .filter_map(|m| m.get("content").and_then(Value::as_str))
            .collect();
        if texts.len() != system.len() {
            return Err(GatewayError::invalid(
                "A system message warmed for the Messages API must have string `content` (or give a whole `request` with `system`).",
                Some("messages"),
            ));
        }
        if !texts.is_empty() {
            body.insert("system".to_owned(), Value::from(texts.join("\n\n")));
        }
        Ok(body)
    }

    /// A finished message; `usage` counts nothing, since no upstream made it.
    fn answer(&self, model: String, response: String, now_s: u64) -> Value {
        json!({
            "id": format!("msg_warm{now_s}"), "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": response}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        })
    }

    fn default_headers(&self) -> &'static [&'static [(&'static str, &'static str)]] {
        &[
            &[("anthropic-version", ANTHROPIC_VERSIONS[0])],
            &[("anthropic-version", ANTHROPIC_VERSIONS[1])],
        ]
    }
}

/// The fields of `POST /v1/messages`.
#[derive(Deserialize)]
struct MessagesFields {
    model: Option<Value>,
    messages: Option<Value>,
    system: Option<Value>,
    max_tokens: Option<Value>,
    stop_sequences: Option<Value>,
    temperature: Option<Value>,
    top_p: Option<Value>,
    top_k: Option<Value>,
    thinking: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    cache_control: Ignored,
    metadata: Ignored,
    service_tier: Ignored,
    stream: Ignored,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

/// The content block types of a message, as the keys treat them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockKind {
    /// Its `text` is normalized; in the final user turn it is the prompt.
    Text,
    /// Kept as sent (media, or a call and its id): in the partition.
    Image,
    Document,
    ToolUse,
    /// Its `content` (a string or blocks) is canonical like a message's.
    ToolResult,
    /// Kept as sent: the signature must match the text it signs.
    Thinking,
    RedactedThinking,
    /// A block type this gateway does not know: kept whole, so nothing is dropped from the key.
    Other,
}

impl BlockKind {
    fn of(block: &Map<String, Value>) -> Self {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => Self::Text,
            Some("image") => Self::Image,
            Some("document") => Self::Document,
            Some("tool_use") => Self::ToolUse,
            Some("tool_result") => Self::ToolResult,
            Some("thinking") => Self::Thinking,
            Some("redacted_thinking") => Self::RedactedThinking,
            _ => Self::Other,
        }
    }
}

/// The Messages API keys (the rules are this module's documentation).
fn keys(body: &Map<String, Value>, partition: &mut FieldHasher) -> Result<Turn, GatewayError> {
    let fields = MessagesFields::deserialize(body).map_err(unreadable)?;
    // No `..`: a new field must be placed either in the key or among the ignored ones.
    let MessagesFields {
        model,
        messages,
        system,
        max_tokens,
        stop_sequences,
        temperature,
        top_p,
        top_k,
        thinking,
        tools,
        tool_choice,
        cache_control: _cache_control,
        metadata: _metadata,
        service_tier: _service_tier,
        stream: _stream,
        extra,
    } = fields;
    model_field(partition, model.as_ref())?;
    let system = system.map(|s| canonical_content(&without_billing_line(s)));
    let tools = tools.map(|t| match t {
        Value::Array(tools) => Value::Array(tools.iter().map(without_marker).collect()),
        other => other,
    });
    hash_fields!(partition;
        system, max_tokens, stop_sequences, temperature, top_p, top_k, thinking, tools, tool_choice,
    );
    partition.extra(&extra);

    let Some(Value::Array(messages)) = messages else {
        return Err(GatewayError::invalid(
            "`messages` must be an array of message objects.",
            Some("messages"),
        ));
    };
    let mut canonical = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        canonical.push(canonical_message(i, message, |content| {
            Ok(canonical_content(content))
        })?);
    }
    Ok(final_turn(
        partition,
        ["messages.before", "messages.after"],
        &canonical,
        is_user_question,
        shape,
        text_of,
    ))
}

/// The line prefix of Anthropic's attribution metadata in `system` (see the module documentation).
const BILLING_HEADER: &str = "x-anthropic-billing-header:";

/// `system` without its billing line: a text block whose text is one line that starts with
/// [`BILLING_HEADER`].
fn without_billing_line(system: Value) -> Value {
    let is_billing = |block: &Value| {
        block.get("type").and_then(Value::as_str) == Some("text")
            && block
                .get("text")
                .and_then(Value::as_str)
                .is_some_and(|t| t.trim().starts_with(BILLING_HEADER) && !t.trim().contains('\n'))
    };
    match system {
        Value::Array(blocks) => {
            Value::Array(blocks.into_iter().filter(|b| !is_billing(b)).collect())
        }
        other => other,
    }
}

/// A copy of a block without its `cache_control` marker (see the module documentation).
fn without_marker(block: &Value) -> Value {
    match block {
        Value::Object(fields) => Value::Object(
            fields
                .iter()
                .filter(|(name, value)| *name != "cache_control" && !value.is_null())
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Message content (or `system`, or a tool result's content): a string normalized, blocks without
/// their markers and with their text normalized, and a lone bare text block as the string it
/// stands for.
fn canonical_content(content: &Value) -> Value {
    let Value::Array(blocks) = content else {
        return match content {
            Value::String(text) => Value::String(normalize_text(text)),
            other => other.clone(),
        };
    };
    let blocks: Vec<Value> = blocks.iter().map(canonical_block).collect();
    if let [Value::Object(only)] = blocks.as_slice() {
        if only.len() == 2 && BlockKind::of(only) == BlockKind::Text {
            if let Some(Value::String(text)) = only.get("text") {
                return Value::String(text.clone());
            }
        }
    }
    Value::Array(blocks)
}

fn canonical_block(block: &Value) -> Value {
    let mut block = without_marker(block);
    if let Some(fields) = block.as_object_mut() {
        match BlockKind::of(fields) {
            BlockKind::Text => {
                if let Some(Value::String(text)) = fields.get_mut("text") {
                    *text = normalize_text(text);
                }
            }
            BlockKind::ToolResult => {
                if let Some(content) = fields.get_mut("content") {
                    *content = canonical_content(content);
                }
            }
            BlockKind::Image
            | BlockKind::Document
            | BlockKind::ToolUse
            | BlockKind::Thinking
            | BlockKind::RedactedThinking
            | BlockKind::Other => {}
        }
    }
    block
}

fn blocks_of(message: &Map<String, Value>) -> impl Iterator<Item = &Map<String, Value>> {
    message
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object)
}

/// A user message that asks something: it has text and carries no tool results.
fn is_user_question(message: &Map<String, Value>) -> bool {
    if message.get("role").and_then(Value::as_str) != Some("user") {
        return false;
    }
    match message.get("content") {
        Some(Value::String(_)) => true,
        Some(Value::Array(_)) => {
            let kinds: Vec<BlockKind> = blocks_of(message).map(BlockKind::of).collect();
            kinds.contains(&BlockKind::Text) && !kinds.contains(&BlockKind::ToolResult)
        }
        _ => false,
    }
}

/// The final user turn with the prompt (its last text) taken out: what semantic matching must not
/// cross, earlier text blocks included.
fn shape(turn: &Map<String, Value>) -> Value {
    let mut shape = turn.clone();
    match shape.get_mut("content") {
        Some(content @ Value::String(_)) => *content = json!([{"type": "text"}]),
        Some(Value::Array(blocks)) => {
            let last_text = blocks
                .iter_mut()
                .filter_map(Value::as_object_mut)
                .rfind(|block| BlockKind::of(block) == BlockKind::Text);
            if let Some(block) = last_text {
                block.remove("text");
            }
        }
        _ => {}
    }
    Value::Object(shape)
}

/// The prompt: the turn's last text block (the module documentation says why not all of them).
fn text_of(turn: &Map<String, Value>) -> String {
    match turn.get("content") {
        Some(Value::String(text)) => text.clone(),
        _ => blocks_of(turn)
            .filter(|b| BlockKind::of(b) == BlockKind::Text)
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .last()
            .unwrap_or_default()
            .to_owned(),
    }
}

/// Blocks whose `input` streams as `input_json_delta`s.
fn streams_input(block: &Value) -> bool {
    matches!(
        block.get("type").and_then(Value::as_str),
        Some("tool_use" | "server_tool_use" | "mcp_tool_use")
    )
}

/// Only a whole, finished message is an answer: an error, a message without a `stop_reason` (a
/// stream that never reached `message_stop` assembles to nothing), one cut at `max_tokens` (or at
/// the context window) unless the operator allows length-stopped answers, a `refusal`, a
/// `pause_turn` (a long server-side turn the client must continue: not an answer yet), and a tool
/// call whose input is not a JSON object (its streamed pieces did not parse) are never stored.
fn check(body: &Value, allow_length: bool) -> Result<(), Uncacheable> {
    if body.get("type").and_then(Value::as_str) == Some("error")
        || body.get("error").is_some_and(|e| !e.is_null())
    {
        return Err(Uncacheable::Error);
    }
    if body.get("type").and_then(Value::as_str) != Some("message") {
        return Err(Uncacheable::NoChoices);
    }
    match body.get("stop_reason").and_then(Value::as_str) {
        None => return Err(Uncacheable::NoFinishReason),
        Some("max_tokens" | "model_context_window_exceeded") if !allow_length => {
            return Err(Uncacheable::Length)
        }
        Some("refusal") => return Err(Uncacheable::ContentFilter),
        Some("pause_turn") => return Err(Uncacheable::NotCompleted),
        Some(_) => {}
    }
    let content = body
        .get("content")
        .and_then(Value::as_array)
        .ok_or(Uncacheable::NoChoices)?;
    for block in content {
        if streams_input(block) && !block.get("input").is_some_and(Value::is_object) {
            return Err(Uncacheable::InvalidToolArguments);
        }
    }
    Ok(())
}

/// The message a non-streamed request would have received, from a stream's events: the
/// `message_start` message, each block built from its start and deltas (a tool call's input
/// parsed from its `input_json_delta` pieces, kept as the raw text when it does not parse, which
/// [`check`] refuses), `stop_reason` and the final usage from `message_delta`. `null` for a stream
/// that did not reach `message_stop`; an `error` event's body for one that failed.
fn assemble<'a>(events: impl IntoIterator<Item = &'a Value>) -> Value {
    let mut message: Option<Map<String, Value>> = None;
    let mut blocks: Vec<Value> = Vec::new();
    let mut inputs: BTreeMap<usize, String> = BTreeMap::new();
    let mut stopped = false;
    for event in events {
        let index = event
            .get("index")
            .and_then(Value::as_u64)
            .map(|i| i as usize);
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                message = event.get("message").and_then(Value::as_object).cloned()
            }
            Some("content_block_start") => {
                let (Some(i), Some(block)) = (index, event.get("content_block")) else {
                    continue;
                };
                if blocks.len() <= i {
                    blocks.resize(i + 1, Value::Null);
                }
                blocks[i] = block.clone();
            }
            Some("content_block_delta") => {
                let (Some(block), Some(delta)) =
                    (index.and_then(|i| blocks.get_mut(i)), event.get("delta"))
                else {
                    continue;
                };
                let append = |block: &mut Value, field: &str, piece: Option<&Value>| {
                    let piece = piece.and_then(Value::as_str).unwrap_or("");
                    if let Some(Value::String(text)) = block.get_mut(field) {
                        text.push_str(piece);
                    } else {
                        block[field] = json!(piece);
                    }
                };
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => append(block, "text", delta.get("text")),
                    Some("thinking_delta") => append(block, "thinking", delta.get("thinking")),
                    Some("signature_delta") => {
                        block["signature"] = delta.get("signature").cloned().unwrap_or(Value::Null)
                    }
                    Some("input_json_delta") => {
                        let piece = delta
                            .get("partial_json")
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        inputs
                            .entry(index.unwrap_or(0))
                            .or_default()
                            .push_str(piece);
                    }
                    Some("citations_delta") => {
                        let citation = delta.get("citation").cloned().unwrap_or(Value::Null);
                        match block.get_mut("citations") {
                            Some(Value::Array(citations)) => citations.push(citation),
                            _ => block["citations"] = json!([citation]),
                        }
                    }
                    _ => {}
                }
            }
            Some("content_block_stop") => {
                let Some(i) = index else { continue };
                if let (Some(text), Some(block)) = (inputs.remove(&i), blocks.get_mut(i)) {
                    // Anthropic streams an empty input as no pieces, or as one empty piece.
                    block["input"] = if text.trim().is_empty() {
                        json!({})
                    } else {
                        serde_json::from_str(&text).unwrap_or(Value::String(text))
                    };
                }
            }
            Some("message_delta") => {
                let Some(message) = message.as_mut() else {
                    continue;
                };
                if let Some(delta) = event.get("delta").and_then(Value::as_object) {
                    message.extend(delta.clone());
                }
                // Beside `delta`, the event may carry the message's own fields (the context
                // management beta's `context_management`), which the SDKs copy into it.
                let fields = event.as_object().into_iter().flatten();
                for (field, value) in
                    fields.filter(|(f, _)| !matches!(f.as_str(), "type" | "delta" | "usage"))
                {
                    message.insert(field.clone(), value.clone());
                }
                if let Some(usage) = event.get("usage").and_then(Value::as_object) {
                    match message.get_mut("usage") {
                        Some(Value::Object(total)) => total.extend(usage.clone()),
                        _ => {
                            message.insert("usage".into(), Value::Object(usage.clone()));
                        }
                    }
                }
            }
            Some("message_stop") => stopped = true,
            Some("error") => return event.clone(),
            _ => {}
        }
    }
    match message {
        Some(mut message) if stopped => {
            message.insert("content".into(), Value::Array(blocks));
            Value::Object(message)
        }
        _ => Value::Null,
    }
}

/// The named events a streamed request would have received for a message; offsets spread the
/// events over the original decode time.
fn rechunk(body: &Value, decode_ms: f64) -> Vec<StoredEvent> {
    let mut events: Vec<Value> = Vec::new();
    let mut start = body.clone();
    if let Some(obj) = start.as_object_mut() {
        obj.insert("content".into(), json!([]));
        obj.insert("stop_reason".into(), Value::Null);
        obj.insert("stop_sequence".into(), Value::Null);
        // Anthropic's `message_start` counts the first output token only; the rest is in
        // `message_delta`.
        if let Some(Value::Object(usage)) = obj.get_mut("usage") {
            let first = usage
                .get("output_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0)
                .min(1);
            usage.insert("output_tokens".into(), json!(first));
        }
    }
    events.push(json!({"type": "message_start", "message": start}));
    let content = body
        .get("content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (index, block) in content.iter().enumerate() {
        block_events(index, block, &mut events);
    }
    events.push(json!({
        "type": "message_delta",
        "delta": {
            "stop_reason": body.get("stop_reason").cloned().unwrap_or(Value::Null),
            "stop_sequence": body.get("stop_sequence").cloned().unwrap_or(Value::Null),
        },
        "usage": body.get("usage").cloned().unwrap_or(json!({})),
    }));
    events.push(json!({"type": "message_stop"}));
    let steps = events.len().saturating_sub(1).max(1) as f64;
    events
        .into_iter()
        .enumerate()
        .map(|(i, data)| StoredEvent {
            offset_ms: decode_ms * i as f64 / steps,
            data,
        })
        .collect()
}

/// `content_block_start`, its deltas and `content_block_stop` for one block.
fn block_events(index: usize, block: &Value, events: &mut Vec<Value>) {
    let delta =
        |delta: Value| json!({"type": "content_block_delta", "index": index, "delta": delta});
    let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
    let mut start = block.clone();
    let mut deltas = Vec::new();
    let text = |field: &str| {
        block
            .get(field)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    match kind {
        "text" => {
            start["text"] = json!("");
            deltas.extend(
                pieces(&text("text"))
                    .into_iter()
                    .map(|p| delta(json!({"type": "text_delta", "text": p}))),
            );
            if let Some(Value::Array(citations)) = block.get("citations") {
                start["citations"] = json!([]);
                deltas.extend(
                    citations
                        .iter()
                        .map(|c| delta(json!({"type": "citations_delta", "citation": c}))),
                );
            }
        }
        "thinking" => {
            start["thinking"] = json!("");
            start["signature"] = json!("");
            deltas.extend(
                pieces(&text("thinking"))
                    .into_iter()
                    .map(|p| delta(json!({"type": "thinking_delta", "thinking": p}))),
            );
            if let Some(signature) = block.get("signature") {
                deltas.push(delta(
                    json!({"type": "signature_delta", "signature": signature}),
                ));
            }
        }
        _ if streams_input(block) => {
            start["input"] = json!({});
            let input = block.get("input").cloned().unwrap_or(json!({}));
            deltas.push(delta(
                json!({"type": "input_json_delta", "partial_json": input.to_string()}),
            ));
        }
        // Redacted thinking and server tool results arrive whole in their start event.
        _ => {}
    }
    events.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
    events.extend(deltas);
    events.push(json!({"type": "content_block_stop", "index": index}));
}

/// How the relay reads this API's events: a content delta that carries text, thinking or tool
/// input is about one token (the first one is the time to first token), `message_delta` carries
/// the usage, and `message_stop` is the clean end of the stream (`message_delta`'s `stop_reason`
/// alone is not: a stream cut before `message_stop` is incomplete).
fn stream_event(kind: EventKind) -> EventKind {
    let EventKind::Chunk { value, .. } = kind else {
        return kind;
    };
    let kind = value.get("type").and_then(Value::as_str).unwrap_or("");
    let finish_reason = (kind == "message_stop").then(|| "message_stop".to_owned());
    let usage = (kind == "message_delta")
        .then(|| value.get("usage").filter(|u| !u.is_null()).cloned())
        .flatten();
    EventKind::Chunk {
        tokens: reprise_migrations::replay::named_event_tokens(&value),
        finish_reason,
        usage,
        value,
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};
    use serde_json::json;

    use super::*;
    use crate::key::{KeyInput, Keys, Tenant};

    fn keys_with(body: Value, headers: &HeaderMap) -> Keys {
        let body = body.as_object().expect("object").clone();
        super::super::keys(&KeyInput {
            route: Route::Messages,
            body: &body,
            headers,
            tenant: Tenant::Shared,
            namespace: None,
        })
        .expect("keys")
    }

    fn keys(body: Value) -> Keys {
        keys_with(body, &HeaderMap::new())
    }

    fn base() -> Value {
        json!({"model": "claude", "max_tokens": 64, "messages": [{"role": "user", "content": "What is Rust?"}]})
    }

    #[test]
    fn spellings_of_one_question_share_keys_and_markers_are_left_out() {
        let a = keys(base());
        let b = keys(json!({"model": "claude", "max_tokens": 64, "stream": true,
        "metadata": {"user_id": "u1"}, "service_tier": "auto",
        "cache_control": {"type": "ephemeral"},
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is Rust?  ", "cache_control": {"type": "ephemeral"}}
        ]}]}));
        assert_eq!(a.exact, b.exact);
        assert_eq!(a.prompt, "What is Rust?");
        let marked = |marker: bool| {
            let mut system = json!({"type": "text", "text": "Be terse."});
            let mut tool = json!({"name": "f", "input_schema": {"type": "object"}});
            if marker {
                system["cache_control"] = json!({"type": "ephemeral", "ttl": "1h"});
                tool["cache_control"] = json!({"type": "ephemeral"});
            }
            let mut body = base();
            body["system"] = json!([system]);
            body["tools"] = json!([tool]);
            keys(body)
        };
        assert_eq!(marked(true).exact, marked(false).exact);
        // A lone system text block is the string it stands for.
        let mut plain = base();
        plain["system"] = json!("Be terse.");
        plain["tools"] = json!([{"name": "f", "input_schema": {"type": "object"}}]);
        assert_eq!(keys(plain).exact, marked(false).exact);
    }

    #[test]
    fn what_changes_the_answer_changes_the_partition() {
        let p0 = keys(base()).partition;
        let variants = [
            ("system", json!("Answer in French.")),
            ("tools", json!([{"name": "f", "input_schema": {}}])),
            ("tool_choice", json!({"type": "any"})),
            ("max_tokens", json!(16)),
            ("temperature", json!(0.2)),
            ("top_p", json!(0.5)),
            ("top_k", json!(5)),
            ("stop_sequences", json!(["END"])),
            (
                "thinking",
                json!({"type": "enabled", "budget_tokens": 1024}),
            ),
            ("x_unknown", json!(1)),
        ];
        for (field, value) in variants {
            let mut body = base();
            body[field] = value;
            let k = keys(body);
            assert_ne!(k.partition, p0, "{field}");
            assert_eq!(k.prompt, "What is Rust?", "{field}");
        }
        let header = |name: &'static str, value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.append(name, HeaderValue::from_static(value));
            keys_with(base(), &headers).partition
        };
        assert_ne!(header("anthropic-version", "2023-06-01"), p0);
        assert_ne!(header("anthropic-beta", "a"), header("anthropic-beta", "b"));
        assert_eq!(
            header("anthropic-beta", "a, b"),
            header("anthropic-beta", "b,a")
        );
        assert_eq!(header("x-other", "1"), p0);
    }

    #[test]
    fn tool_results_and_images_are_context_and_the_last_question_is_the_prompt() {
        let k = keys(json!({"model": "claude", "max_tokens": 64, "messages": [
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "text", "text": "What is the weather?"}
            ]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}
        ]}));
        assert_eq!(k.prompt, "What is the weather?");
        let other = keys(json!({"model": "claude", "max_tokens": 64, "messages": [
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "text", "text": "What is the weather?"}
            ]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "rain"}]}
        ]}));
        assert_ne!(k.partition, other.partition);
    }

    /// A request `claude -p` sent (recorded against reprise-sim): its keyed headers and body.
    fn recorded(text: &str) -> (HeaderMap, Value) {
        let recording: Value = serde_json::from_str(text).expect("recording");
        let mut headers = HeaderMap::new();
        for (name, value) in recording["headers"].as_object().expect("headers") {
            let value = HeaderValue::from_str(value.as_str().expect("str")).expect("value");
            headers.insert(
                http::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                value,
            );
        }
        (headers, recording["body"].clone())
    }

    #[test]
    fn claude_codes_paraphrase_shares_the_partition_of_its_question() {
        let (headers, question) = recorded(include_str!(
            "../../tests/fixtures/claude-code/question.json"
        ));
        let (other_headers, paraphrase) = recorded(include_str!(
            "../../tests/fixtures/claude-code/paraphrase.json"
        ));
        assert_eq!(headers, other_headers);
        // What makes the recordings worth testing: a billing line that differs per prompt, and
        // ~10 KB of context blocks before the typed text.
        let billing = |body: &Value| body["system"][0]["text"].as_str().map(str::to_owned);
        assert!(billing(&question).is_some_and(|b| b.starts_with(BILLING_HEADER)));
        assert_ne!(billing(&question), billing(&paraphrase));
        let turn = &question["messages"][0]["content"];
        assert!(turn[0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("<system-reminder>")));

        let q = keys_with(question.clone(), &headers);
        let p = keys_with(paraphrase, &headers);
        assert_eq!(q.prompt, "how do I reset my password");
        assert_eq!(p.prompt, "I forgot my password, how can I reset it");
        assert_eq!(q.partition, p.partition, "one partition for both prompts");
        assert_ne!(q.exact, p.exact);

        // The context is still in the partition: another reminder, another system block, or the
        // billing line with an instruction after it, each makes another partition.
        let changed = |edit: &dyn Fn(&mut Value)| {
            let mut body = question.clone();
            edit(&mut body);
            keys_with(body, &headers).partition
        };
        let last = turn.as_array().map_or(0, Vec::len) - 1;
        assert_ne!(
            changed(&|b| b["messages"][0]["content"][0]["text"] =
                json!("<system-reminder>\nToday's date is 2027-01-01.\n</system-reminder>")),
            q.partition
        );
        assert_ne!(
            changed(&|b| b["system"][1]["text"] = json!("You are a pirate.")),
            q.partition
        );
        assert_ne!(
            changed(&|b| b["system"][0]["text"] = json!(format!(
                "{}\nAnswer in French.",
                billing(&question).unwrap_or_default()
            ))),
            q.partition
        );
        // The typed text is the prompt even when the turn has no reminders.
        let mut bare = question.clone();
        bare["messages"][0]["content"] = json!([turn[last].clone()]);
        assert_eq!(keys_with(bare, &headers).prompt, q.prompt);
    }

    fn message(content: Value, stop_reason: &str) -> Value {
        json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": content, "stop_reason": stop_reason, "stop_sequence": null,
            "usage": {"input_tokens": 5, "output_tokens": 7, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 3}})
    }

    #[test]
    fn a_message_rechunks_into_typed_events_and_assembles_back() {
        let body = message(
            json!([
                {"type": "thinking", "thinking": "Let me see.", "signature": "c2ln"},
                {"type": "text", "text": "Hello big world"},
                {"type": "tool_use", "id": "toolu_1", "name": "w", "input": {"q": "x", "n": 3}}
            ]),
            "tool_use",
        );
        let events = rechunk(&body, 9.0);
        let kinds: Vec<&str> = events
            .iter()
            .map(|e| e.data["type"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(kinds.first(), Some(&"message_start"));
        assert_eq!(kinds[kinds.len() - 2..], ["message_delta", "message_stop"]);
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == "content_block_start")
                .count(),
            3
        );
        assert_eq!(events[0].data["message"]["content"], json!([]));
        assert_eq!(events.last().map(|e| e.offset_ms), Some(9.0));
        let data: Vec<Value> = events.iter().map(|e| e.data.clone()).collect();
        assert_eq!(assemble(&data), body);
        assert_eq!(check(&body, false), Ok(()));
        // The relay counts the content deltas as tokens and ends at `message_stop`.
        let read = |v: &Value| {
            stream_event(EventKind::Chunk {
                tokens: 0,
                finish_reason: None,
                usage: None,
                value: v.clone(),
            })
        };
        let tokens: u32 = data
            .iter()
            .map(|v| match read(v) {
                EventKind::Chunk { tokens, .. } => tokens,
                _ => 0,
            })
            .sum();
        // Three thinking pieces, three text pieces, one piece of tool input; not the signature.
        assert_eq!(tokens, 3 + 3 + 1);
        assert!(matches!(
            read(&data[data.len() - 1]),
            EventKind::Chunk {
                finish_reason: Some(_),
                ..
            }
        ));
        assert!(matches!(
            read(&data[data.len() - 2]),
            EventKind::Chunk {
                finish_reason: None,
                usage: Some(_),
                ..
            }
        ));
    }

    /// Found by an audit: a non-streamed hit built from a streamed miss lost the fields
    /// `message_delta` carries beside `delta` (`context_management`, a beta's).
    #[test]
    fn the_message_deltas_own_fields_reach_the_assembled_message() {
        let applied = json!({"applied_edits": [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2}]});
        let mut body = message(json!([{"type": "text", "text": "Done."}]), "end_turn");
        let mut events: Vec<Value> = rechunk(&body, 1.0).into_iter().map(|e| e.data).collect();
        let delta = events.len() - 2;
        events[delta]["context_management"] = applied.clone();
        body["context_management"] = applied;
        assert_eq!(assemble(&events), body);
    }

    #[test]
    fn never_store_rules() {
        let text = json!([{"type": "text", "text": "Hi"}]);
        assert_eq!(check(&message(text.clone(), "end_turn"), false), Ok(()));
        assert_eq!(
            check(&message(text.clone(), "stop_sequence"), false),
            Ok(())
        );
        assert_eq!(
            check(&message(text.clone(), "max_tokens"), false),
            Err(Uncacheable::Length)
        );
        assert_eq!(check(&message(text.clone(), "max_tokens"), true), Ok(()));
        assert_eq!(
            check(&message(text.clone(), "refusal"), false),
            Err(Uncacheable::ContentFilter)
        );
        assert_eq!(
            check(&message(text.clone(), "pause_turn"), false),
            Err(Uncacheable::NotCompleted)
        );
        let mut open = message(text, "end_turn");
        open["stop_reason"] = Value::Null;
        assert_eq!(check(&open, false), Err(Uncacheable::NoFinishReason));
        let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        assert_eq!(check(&error, false), Err(Uncacheable::Error));
        assert_eq!(check(&Value::Null, false), Err(Uncacheable::NoChoices));

        // Streams: an error event, no `message_stop`, tool input that does not parse.
        let body = message(
            json!([{"type": "tool_use", "id": "t", "name": "w", "input": {"q": 1}}]),
            "tool_use",
        );
        let mut data: Vec<Value> = rechunk(&body, 0.0).into_iter().map(|e| e.data).collect();
        let whole = data.clone();
        data.pop();
        assert_eq!(assemble(&data), Value::Null);
        let mut failed = whole[..3].to_vec();
        failed.push(error.clone());
        assert_eq!(check(&assemble(&failed), false), Err(Uncacheable::Error));
        let mut broken = whole.clone();
        for event in &mut broken {
            if event["delta"]["type"] == "input_json_delta" {
                event["delta"]["partial_json"] = json!("{\"q\": ");
            }
        }
        assert_eq!(
            check(&assemble(&broken), false),
            Err(Uncacheable::InvalidToolArguments)
        );
    }
}
