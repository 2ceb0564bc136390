//! The Responses API adapter (`POST /v1/responses`): its keys, what such a request says about
//! caching before it is sent (whether the provider will store the response: then a hit must serve
//! the stored response's own ids, so the entry is kept per API key and no longer than the provider
//! keeps it; and whether it must never be cached at all), its never-store rules, and its shapes of
//! an answer: a stream's body is the `response` of its `response.completed` event, and a body is
//! re-streamed as the typed event sequence the provider sends (`response.created` …
//! `response.completed`, numbered by `sequence_number`), so either kind of hit can be served from
//! either kind of miss. A hit keeps the stored response's ids. Nothing here reads the cache or the
//! store (forgetting the entries of a deleted response is `cache/responses.rs`).
//!
//! ## What goes into the keys
//!
//! - **Partition**: as for chat (tenant, namespace, route, model), and `instructions` (normalized
//!   like message text), `previous_response_id` (a request that continues a conversation is matched
//!   only against requests continuing the same one), `store`, `tools`, `tool_choice`, `text`
//!   (`text.format`, verbosity), `reasoning`, `temperature`, `top_p`, `top_logprobs`,
//!   `max_output_tokens`, `max_tool_calls`, `truncation`, `parallel_tool_calls`, `include`,
//!   `prompt` (a stored prompt template and its variables), `background` and `conversation`, every
//!   input item but the final user message (earlier turns, function calls and their outputs, and
//!   the items after the final user message), the non-text parts of the final user message, and
//!   every unknown field.
//! - **Left out**: `stream`, `stream_options`, `metadata`, `user`, `safety_identifier`,
//!   `prompt_cache_key`, `service_tier`.
//! - **Exact key**: the partition plus the final user message; **prompt**: its text.
//!
//! A string `input` is the one user message it stands for: `"input": "hi"` and
//! `"input": [{"role": "user", "content": "hi"}]` have the same keys, as do a message with and
//! without `"type": "message"`, and a content list of one `input_text` part and its string.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{pieces, Api, Uncacheable};
use crate::entry::StoredEvent;
use crate::error::GatewayError;
use crate::ingress::Route;
use crate::key::{final_turn, hash_fields, model_field, normalize_text, unreadable};
use crate::key::{FieldHasher, Ignored, Turn};
use crate::policy::Policy;

/// `POST /v1/responses`.
pub struct Responses;

impl Api for Responses {
    fn route(&self) -> Route {
        Route::Responses
    }

    fn turn(
        &self,
        body: &Map<String, Value>,
        partition: &mut FieldHasher,
    ) -> Result<Turn, GatewayError> {
        keys(body, partition)
    }

    fn rules(&self, body: &Map<String, Value>, policy: &mut Policy) -> bool {
        rules(body, policy)
    }

    fn check(&self, body: &Value, _allow_length: bool) -> Result<(), Uncacheable> {
        check(body)
    }

    fn assemble_events(&self, events: &mut dyn Iterator<Item = &Value>) -> Value {
        assemble(events)
    }

    fn rechunk(&self, body: &Value, decode_ms: f64) -> Vec<StoredEvent> {
        rechunk(body, decode_ms)
    }

    /// Never written into a Responses API hit, which keeps the stored response's ids.
    fn id_prefix(&self) -> &'static str {
        "resp_"
    }

    /// The Responses API's own `error` event, numbered after the last event sent: the SDKs read
    /// it as a typed event (`ResponseErrorEvent`), where a chunk-shaped `{"error":…}` would be
    /// raised as an untyped `APIError` by some and read as an unknown event by others.
    fn stream_error(&self, err: &GatewayError, last: Option<&Value>) -> bytes::Bytes {
        let body = err.body();
        let error = &body["error"];
        let sequence_number = last
            .and_then(|v| v.get("sequence_number"))
            .and_then(Value::as_u64)
            .map_or(0, |n| n + 1);
        let data = json!({
            "type": "error",
            "code": error["code"],
            "message": error["message"],
            "param": error["param"],
            "sequence_number": sequence_number,
        });
        bytes::Bytes::from(format!("event: error\ndata: {data}\n\n"))
    }
}

/// How long a provider keeps a stored response (OpenAI: 30 days): an entry that serves a stored
/// response's ids must not outlive it, or a hit would hand out ids that no longer resolve.
pub(crate) const STORED_RESPONSE_RETENTION_S: u64 = 30 * 24 * 3600;

/// The Responses API's own cache rules, applied to the policy; returns whether the entry may be
/// shared across API keys. A `background` or `conversation` request is neither looked up nor
/// stored. A response the provider stores is served on a hit with its original ids (so that
/// `previous_response_id` and `GET /v1/responses/{id}` keep working upstream): those ids belong to
/// the API key's organization, so such entries are never shared across keys, and live no longer
/// than the provider keeps the response. Nor are those of requests that name a previous response
/// or a stored prompt, which belong to one organization as well.
fn rules(body: &Map<String, Value>, policy: &mut Policy) -> bool {
    if let Some(why) = never_cached(body) {
        tracing::debug!(why, "a Responses API request that is never cached");
        policy.lookup = false;
        policy.store = false;
        policy.refresh = false;
        return true;
    }
    if stored_upstream(body) {
        policy.ttl_s = policy.ttl_s.min(STORED_RESPONSE_RETENTION_S);
        return false;
    }
    // A previous response or a stored prompt belongs to one organization too: the provider would
    // refuse another key's request for it, so a hit must not answer that key either.
    !refers_to_stored_state(body)
}

/// The known fields of `POST /responses`.
#[derive(Deserialize)]
struct ResponseFields {
    model: Option<Value>,
    input: Option<Value>,
    instructions: Option<Value>,
    background: Option<Value>,
    conversation: Option<Value>,
    include: Option<Value>,
    max_output_tokens: Option<Value>,
    max_tool_calls: Option<Value>,
    metadata: Ignored,
    parallel_tool_calls: Option<Value>,
    previous_response_id: Option<Value>,
    prompt: Option<Value>,
    prompt_cache_key: Ignored,
    reasoning: Option<Value>,
    safety_identifier: Ignored,
    service_tier: Ignored,
    store: Option<Value>,
    stream: Ignored,
    stream_options: Ignored,
    temperature: Option<Value>,
    text: Option<Value>,
    tool_choice: Option<Value>,
    tools: Option<Value>,
    top_logprobs: Option<Value>,
    top_p: Option<Value>,
    truncation: Option<Value>,
    user: Ignored,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

/// Whether the provider stores the response: `store` defaults to true on the Responses API.
fn stored_upstream(body: &Map<String, Value>) -> bool {
    body.get("store").and_then(Value::as_bool) != Some(false)
}

/// Whether the request names state the provider keeps per organization: a `previous_response_id`
/// or a stored `prompt` (template).
fn refers_to_stored_state(body: &Map<String, Value>) -> bool {
    ["previous_response_id", "prompt"]
        .iter()
        .any(|field| body.get(*field).is_some_and(|v| !v.is_null()))
}

/// Why a request must never be looked up or stored, if it must not: `background` runs it later
/// (the answer is a `queued` placeholder), and a `conversation` is server-side state the provider
/// appends each turn to, which a hit would not do.
fn never_cached(body: &Map<String, Value>) -> Option<&'static str> {
    if body.get("background").and_then(Value::as_bool) == Some(true) {
        return Some("background");
    }
    if body.get("conversation").is_some_and(|c| !c.is_null()) {
        return Some("conversation");
    }
    None
}

/// The Responses API keys (the rules are this module's documentation).
fn keys(body: &Map<String, Value>, partition: &mut FieldHasher) -> Result<Turn, GatewayError> {
    let fields = ResponseFields::deserialize(body).map_err(unreadable)?;
    // No `..`: a new field must be placed either in the key or among the ignored ones.
    let ResponseFields {
        model,
        input,
        instructions,
        background,
        conversation,
        include,
        max_output_tokens,
        max_tool_calls,
        metadata: _metadata,
        parallel_tool_calls,
        previous_response_id,
        prompt,
        prompt_cache_key: _prompt_cache_key,
        reasoning,
        safety_identifier: _safety_identifier,
        service_tier: _service_tier,
        store,
        stream: _stream,
        stream_options: _stream_options,
        temperature,
        text,
        tool_choice,
        tools,
        top_logprobs,
        top_p,
        truncation,
        user: _user,
        extra,
    } = fields;
    // Without a model, the stored `prompt` (in the partition below) names it.
    if model.as_ref().is_some_and(|m| !m.is_null()) || prompt.as_ref().is_none_or(Value::is_null) {
        model_field(partition, model.as_ref())?;
    }
    let instructions = match instructions {
        Some(Value::String(text)) => Some(Value::String(normalize_text(&text))),
        other => other,
    };
    // `store` is written as the provider reads it (absent is true): whether ids resolve upstream.
    let store = Some(Value::Bool(
        store.as_ref().and_then(Value::as_bool) != Some(false),
    ));
    hash_fields!(partition;
        instructions, background, conversation, include, max_output_tokens, max_tool_calls,
        parallel_tool_calls, previous_response_id, prompt, reasoning, store, temperature, text,
        tool_choice, tools, top_logprobs, top_p, truncation,
    );
    partition.extra(&extra);

    let items = match input {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(text)) => vec![user_message(text)],
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(GatewayError::invalid(
                "`input` must be a string or an array of input items.",
                Some("input"),
            ))
        }
    };
    let mut canonical = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        canonical.push(canonical_item(i, item)?);
    }
    Ok(final_turn(
        partition,
        ["input.before", "input.after"],
        &canonical,
        is_user_message,
        shape,
        text_of,
    ))
}

fn user_message(text: String) -> Value {
    let mut m = Map::new();
    m.insert("role".into(), Value::String("user".into()));
    m.insert("content".into(), Value::String(text));
    Value::Object(m)
}

fn is_user_message(item: &Map<String, Value>) -> bool {
    item.get("role").and_then(Value::as_str) == Some("user")
        && item.get("type").is_none_or(|t| t == "message")
}

/// Text parts of a message: `input_text` (and `output_text` in replayed assistant turns).
fn is_text_part(part: &Map<String, Value>) -> bool {
    matches!(
        part.get("type").and_then(Value::as_str),
        Some("input_text" | "output_text" | "text")
    )
}

/// An input item with its `null` fields dropped, `"type": "message"` dropped from messages (the
/// SDKs send it or not), and message text normalized.
fn canonical_item(i: usize, item: &Value) -> Result<Map<String, Value>, GatewayError> {
    let Some(fields) = item.as_object() else {
        return Err(GatewayError::invalid(
            format!("`input[{i}]` must be an input item object."),
            Some(&format!("input[{i}]")),
        ));
    };
    let message = fields.get("role").is_some_and(Value::is_string);
    let mut out = Map::new();
    for (name, value) in fields {
        if value.is_null() || (message && name == "type" && value == "message") {
            continue;
        }
        let value = match (message, name.as_str(), value) {
            (true, "content", Value::String(text)) => Value::String(normalize_text(text)),
            (true, "content", Value::Array(parts)) => canonical_parts(parts),
            _ => value.clone(),
        };
        out.insert(name.clone(), value);
    }
    Ok(out)
}

fn canonical_parts(parts: &[Value]) -> Value {
    let parts: Vec<Value> = parts
        .iter()
        .map(|part| match part.as_object() {
            Some(p) if is_text_part(p) => {
                let mut p = p.clone();
                if let Some(Value::String(text)) = p.get_mut("text") {
                    *text = normalize_text(text);
                }
                Value::Object(p)
            }
            _ => part.clone(),
        })
        .collect();
    // A lone bare `input_text` part is the string the SDKs also accept.
    if let [Value::Object(only)] = parts.as_slice() {
        if only.len() == 2 && only.get("type").and_then(Value::as_str) == Some("input_text") {
            if let Some(Value::String(text)) = only.get("text") {
                return Value::String(text.clone());
            }
        }
    }
    Value::Array(parts)
}

/// The final user message with its text taken out: what semantic matching must not cross.
fn shape(turn: &Map<String, Value>) -> Value {
    let mut shape = turn.clone();
    let text_part = || {
        let mut part = Map::new();
        part.insert("type".to_owned(), Value::String("input_text".to_owned()));
        Value::Object(part)
    };
    match shape.get_mut("content") {
        Some(content @ Value::String(_)) => *content = Value::Array(vec![text_part()]),
        Some(Value::Array(parts)) => {
            for part in parts.iter_mut().filter_map(Value::as_object_mut) {
                if is_text_part(part) {
                    part.remove("text");
                }
            }
        }
        _ => {}
    }
    Value::Object(shape)
}

fn text_of(turn: &Map<String, Value>) -> String {
    match turn.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(Value::as_object)
            .filter(|p| is_text_part(p))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Only a `completed` response is an answer: `incomplete` (cut at `max_output_tokens` or by the
/// content filter), `failed`, `cancelled`, `queued` and `in_progress` never are. A response with an
/// `error`, a refusal, function-call arguments that are not JSON, or a tool the provider ran with
/// effects beyond the answer (`mcp_call`, `mcp_approval_request`, `code_interpreter_call`) is not
/// stored either.
fn check(body: &Value) -> Result<(), Uncacheable> {
    if body.get("error").is_some_and(|e| !e.is_null()) {
        return Err(Uncacheable::Error);
    }
    match body.get("status").and_then(Value::as_str) {
        Some("completed") => {}
        Some(_) => return Err(Uncacheable::NotCompleted),
        None => return Err(Uncacheable::NoChoices),
    }
    let output = body
        .get("output")
        .and_then(Value::as_array)
        .filter(|o| !o.is_empty())
        .ok_or(Uncacheable::NoChoices)?;
    for item in output {
        // The provider ran these itself: a hit would skip the effect (a remote MCP server's action,
        // a container's state), or answer an approval request nobody gave.
        if matches!(
            item.get("type").and_then(Value::as_str),
            Some("mcp_call" | "mcp_approval_request" | "code_interpreter_call")
        ) {
            return Err(Uncacheable::ServerSideTool);
        }
        if item
            .get("status")
            .and_then(Value::as_str)
            .is_some_and(|s| s != "completed")
        {
            return Err(Uncacheable::NotCompleted);
        }
        let refused = item
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|part| part.get("type").and_then(Value::as_str) == Some("refusal"));
        if refused {
            return Err(Uncacheable::ContentFilter);
        }
        if item.get("type").and_then(Value::as_str) == Some("function_call") {
            let args = item.get("arguments").and_then(Value::as_str).unwrap_or("");
            if serde_json::from_str::<Value>(args).is_err() {
                return Err(Uncacheable::InvalidToolArguments);
            }
        }
    }
    Ok(())
}

/// The body of a stream: the `response` of its last `response.completed` (or
/// `response.incomplete`, which [`check`] refuses); `null` when it has neither.
fn assemble<'a>(events: impl IntoIterator<Item = &'a Value>) -> Value {
    let mut last = None;
    for e in events {
        if matches!(
            e.get("type").and_then(Value::as_str),
            Some("response.completed" | "response.incomplete")
        ) {
            last = Some(e);
        }
    }
    last.and_then(|e| e.get("response"))
        .cloned()
        .unwrap_or(Value::Null)
}

/// The typed events a streamed request would have received for a response body; offsets spread
/// the deltas over the original decode time.
fn rechunk(body: &Value, decode_ms: f64) -> Vec<StoredEvent> {
    let mut events: Vec<Value> = Vec::new();
    let mut start = body.clone();
    if let Some(obj) = start.as_object_mut() {
        obj.insert("status".into(), json!("in_progress"));
        obj.insert("output".into(), json!([]));
        obj.insert("usage".into(), Value::Null);
    }
    events.push(json!({"type": "response.created", "response": start}));
    events.push(json!({"type": "response.in_progress", "response": start}));
    let output = body
        .get("output")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (index, item) in output.iter().enumerate() {
        item_events(index, item, &mut events);
    }
    events.push(json!({"type": "response.completed", "response": body}));
    let steps = events.len().saturating_sub(1).max(1) as f64;
    events
        .into_iter()
        .enumerate()
        .map(|(i, mut data)| {
            data["sequence_number"] = json!(i);
            StoredEvent {
                offset_ms: decode_ms * i as f64 / steps,
                data,
            }
        })
        .collect()
}

/// `response.output_item.added` … `response.output_item.done` for one output item.
fn item_events(index: usize, item: &Value, events: &mut Vec<Value>) {
    let item_id = item.get("id").cloned().unwrap_or(Value::Null);
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
    let mut added = item.clone();
    if let Some(obj) = added.as_object_mut() {
        obj.insert("status".into(), json!("in_progress"));
        match kind {
            "message" | "reasoning" if obj.contains_key("content") => {
                obj.insert("content".into(), json!([]));
            }
            "function_call" => {
                obj.insert("arguments".into(), json!(""));
            }
            _ => {}
        }
        if kind == "reasoning" && obj.contains_key("summary") {
            obj.insert("summary".into(), json!([]));
        }
    }
    events
        .push(json!({"type": "response.output_item.added", "output_index": index, "item": added}));
    match kind {
        "message" => {
            let parts = item
                .get("content")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            for (content_index, part) in parts.iter().enumerate() {
                let at = json!({"item_id": item_id, "output_index": index, "content_index": content_index});
                let with = |fields: Value| {
                    let mut v = at.clone();
                    if let (Some(v), Some(f)) = (v.as_object_mut(), fields.as_object()) {
                        v.extend(f.clone());
                    }
                    v
                };
                let mut empty = part.clone();
                if let Some(text) = empty.get_mut("text") {
                    *text = json!("");
                }
                if let Some(annotations) = empty.get_mut("annotations") {
                    *annotations = json!([]);
                }
                events.push(with(
                    json!({"type": "response.content_part.added", "part": empty}),
                ));
                if let Some(text) = part.get("text").and_then(Value::as_str) {
                    for piece in pieces(text) {
                        events.push(with(json!({"type": "response.output_text.delta", "delta": piece, "logprobs": []})));
                    }
                    events.push(with(
                        json!({"type": "response.output_text.done", "text": text, "logprobs": []}),
                    ));
                }
                events.push(with(
                    json!({"type": "response.content_part.done", "part": part}),
                ));
            }
        }
        "function_call" => {
            let arguments = item.get("arguments").cloned().unwrap_or(json!(""));
            events.push(json!({"type": "response.function_call_arguments.delta", "item_id": item_id, "output_index": index, "delta": arguments}));
            events.push(json!({"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": index, "name": item.get("name").cloned().unwrap_or(Value::Null), "arguments": arguments}));
        }
        _ => {}
    }
    events.push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::key::{KeyInput, Keys, Tenant};

    fn keys(body: serde_json::Value) -> Keys {
        let body = body.as_object().expect("object").clone();
        super::super::keys(&KeyInput {
            route: Route::Responses,
            body: &body,
            headers: &http::HeaderMap::new(),
            tenant: Tenant::Shared,
            namespace: None,
        })
        .expect("keys")
    }

    #[test]
    fn spellings_of_one_input_share_keys() {
        let a = keys(json!({"model": "m", "input": "What is Rust?  "}));
        let b =
            keys(json!({"model": "m", "input": [{"role": "user", "content": "What is Rust?"}]}));
        let c = keys(
            json!({"model": "m", "stream": true, "metadata": {"k": "v"}, "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What is Rust?"}]}
            ]}),
        );
        assert_eq!(a.exact, b.exact);
        assert_eq!(a.exact, c.exact);
        assert_eq!(a.prompt, "What is Rust?");
    }

    #[test]
    fn what_changes_the_answer_changes_the_partition() {
        let base = json!({"model": "m", "input": "hi"});
        let p0 = keys(base.clone()).partition;
        let variants = [
            ("instructions", json!("Answer in French.")),
            (
                "tools",
                json!([{"type": "function", "name": "f", "parameters": {}}]),
            ),
            ("tool_choice", json!("required")),
            ("text", json!({"format": {"type": "json_object"}})),
            ("reasoning", json!({"effort": "high"})),
            ("temperature", json!(0.2)),
            ("max_output_tokens", json!(16)),
            ("previous_response_id", json!("resp_1")),
            ("store", json!(false)),
            ("truncation", json!("auto")),
            ("include", json!(["message.output_text.logprobs"])),
            ("x_unknown", json!(1)),
        ];
        for (field, value) in variants {
            let mut body = base.clone();
            body[field] = value;
            let k = keys(body);
            assert_ne!(k.partition, p0, "{field}");
            assert_eq!(k.prompt, "hi", "{field}");
        }
        // `store: true` is what an absent `store` means.
        let mut stored = base.clone();
        stored["store"] = json!(true);
        assert_eq!(keys(stored).partition, p0);
    }

    /// A stored prompt names its model, so a request may leave `model` out: its prompt (id,
    /// version, variables) partitions it, and one naming neither is still refused.
    #[test]
    fn a_stored_prompt_stands_for_the_model() {
        let prompt = |id: &str| json!({"prompt": {"id": id, "version": "2"}, "input": "hi"});
        let (a, b) = (keys(prompt("pmpt_a")), keys(prompt("pmpt_b")));
        assert_ne!(a.partition, b.partition);
        assert_eq!(a.prompt, "hi");
        let mut with_model = prompt("pmpt_a");
        with_model["model"] = json!("gpt-4.1");
        assert_ne!(keys(with_model).partition, a.partition);
        let body = json!({"input": "hi"});
        let refused = super::super::keys(&KeyInput {
            route: Route::Responses,
            body: body.as_object().expect("object"),
            headers: &http::HeaderMap::new(),
            tenant: Tenant::Shared,
            namespace: None,
        });
        assert!(refused.is_err());
    }

    #[test]
    fn earlier_turns_are_context_and_the_last_user_message_is_the_prompt() {
        let k = keys(json!({"model": "m", "input": [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": "second"}
        ]}));
        assert_eq!(k.prompt, "second");
        let other = keys(json!({"model": "m", "input": [
            {"role": "user", "content": "other"},
            {"role": "assistant", "content": "answer"},
            {"role": "user", "content": "second"}
        ]}));
        assert_ne!(k.partition, other.partition);
    }

    fn body(status: &str) -> Value {
        json!({"id": "resp_1", "object": "response", "created_at": 1, "status": status, "error": null,
            "model": "m", "store": true, "output": [{"id": "msg_1", "type": "message", "status": "completed",
            "role": "assistant", "content": [{"type": "output_text", "text": "Hello big world", "annotations": []}]}],
            "usage": {"input_tokens": 3, "output_tokens": 3, "total_tokens": 6}})
    }

    #[test]
    fn a_body_rechunks_into_typed_events_and_assembles_back() {
        let b = body("completed");
        let events = rechunk(&b, 9.0);
        let kinds: Vec<&str> = events
            .iter()
            .map(|e| e.data["type"].as_str().unwrap_or(""))
            .collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e.data["sequence_number"], json!(i));
        }
        assert_eq!(events[0].data["response"]["status"], "in_progress");
        assert_eq!(events.last().map(|e| e.offset_ms), Some(9.0));
        let data: Vec<Value> = events.iter().map(|e| e.data.clone()).collect();
        assert_eq!(assemble(&data), b);
        assert_eq!(check(&b), Ok(()));
    }

    #[test]
    fn never_store_rules() {
        for status in ["incomplete", "failed", "cancelled", "queued", "in_progress"] {
            assert_eq!(
                check(&body(status)),
                Err(Uncacheable::NotCompleted),
                "{status}"
            );
        }
        let mut refused = body("completed");
        refused["output"][0]["content"] = json!([{"type": "refusal", "refusal": "No."}]);
        assert_eq!(check(&refused), Err(Uncacheable::ContentFilter));
        let mut errored = body("completed");
        errored["error"] = json!({"code": "server_error"});
        assert_eq!(check(&errored), Err(Uncacheable::Error));
        let mut call = body("completed");
        call["output"] = json!([{"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "{\"q\": ", "status": "completed"}]);
        assert_eq!(check(&call), Err(Uncacheable::InvalidToolArguments));
        for kind in ["mcp_call", "mcp_approval_request", "code_interpreter_call"] {
            let mut ran = body("completed");
            ran["output"]
                .as_array_mut()
                .expect("output")
                .insert(0, json!({"type": kind, "id": "x_1", "status": "completed"}));
            assert_eq!(check(&ran), Err(Uncacheable::ServerSideTool), "{kind}");
        }
        // A web search's answer is an answer like any other (its staleness is the TTL's to bound).
        let mut searched = body("completed");
        searched["output"].as_array_mut().expect("output").insert(
            0,
            json!({"type": "web_search_call", "id": "ws_1", "status": "completed"}),
        );
        assert_eq!(check(&searched), Ok(()));
        assert_eq!(
            assemble(&[json!({"type": "response.created"})]),
            Value::Null
        );
        assert_eq!(check(&Value::Null), Err(Uncacheable::NoChoices));
    }
}
