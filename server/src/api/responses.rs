//! The Responses API adapter (`POST /v1/responses`): its keys, and what such a request says about
//! caching before it is sent: whether the provider will store the response (then a hit must serve
//! the stored response's own ids, so the entry is kept per API key and no longer than the provider
//! keeps it), and whether it must never be cached at all. Nothing here reads the cache or the store.
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
use serde_json::{Map, Value};

use super::Api;
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
    model_field(partition, model.as_ref())?;
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::ingress::Route;
    use crate::key::{KeyInput, Keys, Tenant};

    fn keys(body: serde_json::Value) -> Keys {
        let body = body.as_object().expect("object").clone();
        super::super::keys(&KeyInput {
            route: Route::Responses,
            body: &body,
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
}
