//! The chat completions adapter (`POST /v1/chat/completions`): its keys (every answer-changing
//! field and every message but the final user turn in the partition), its answers (the `choices`
//! rules and shapes it shares with legacy completions, in `choices.rs`), its fresh ids and how it
//! is warmed. Nothing here reads the cache or the store: it only says what a request and an
//! answer are.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::choices::{assemble_choices, check_choices, rechunk_choices};
use super::{Api, Uncacheable, Warm};
use crate::entry::StoredEvent;
use crate::error::GatewayError;
use crate::ingress::Route;
use crate::key::{
    canonical_message, final_turn, hash_fields, model_field, normalize_text, unreadable,
};
use crate::key::{FieldHasher, Ignored, Turn};

/// `POST /v1/chat/completions`.
pub struct Chat;

impl Api for Chat {
    fn route(&self) -> Route {
        Route::ChatCompletions
    }

    fn turn(
        &self,
        body: &Map<String, Value>,
        partition: &mut FieldHasher,
    ) -> Result<Turn, GatewayError> {
        keys(body, partition)
    }

    fn check(&self, body: &Value, allow_length: bool) -> Result<(), Uncacheable> {
        check_choices(body, allow_length)
    }

    fn assemble_events(&self, events: &mut dyn Iterator<Item = &Value>) -> Value {
        assemble_choices(events, true)
    }

    fn rechunk(&self, body: &Value, decode_ms: f64) -> Vec<StoredEvent> {
        rechunk_choices(body, decode_ms, true)
    }

    fn id_prefix(&self) -> &'static str {
        "chatcmpl-"
    }

    fn warm(&self) -> Option<&dyn Warm> {
        Some(self)
    }
}

impl Warm for Chat {
    fn prompt(&self, prompt: String) -> Map<String, Value> {
        Map::from_iter([(
            "messages".to_owned(),
            json!([{"role": "user", "content": prompt}]),
        )])
    }

    fn messages(&self, messages: Vec<Value>) -> Result<Map<String, Value>, GatewayError> {
        Ok(Map::from_iter([(
            "messages".to_owned(),
            Value::Array(messages),
        )]))
    }

    fn answer(&self, model: String, response: String, now_s: u64) -> Value {
        json!({
            "id": format!("chatcmpl-warm-{now_s}"), "object": "chat.completion", "created": now_s,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": response, "refusal": null},
                         "logprobs": null, "finish_reason": "stop"}],
            // No upstream made it, so it counts nothing; a stream that asks for usage gets these.
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        })
    }
}

/// The known fields of `POST /chat/completions`.
#[derive(Deserialize)]
struct ChatFields {
    model: Option<Value>,
    messages: Option<Value>,
    audio: Option<Value>,
    frequency_penalty: Option<Value>,
    function_call: Option<Value>,
    functions: Option<Value>,
    logit_bias: Option<Value>,
    logprobs: Option<Value>,
    max_completion_tokens: Option<Value>,
    max_tokens: Option<Value>,
    metadata: Ignored,
    modalities: Option<Value>,
    n: Option<Value>,
    parallel_tool_calls: Option<Value>,
    prediction: Option<Value>,
    presence_penalty: Option<Value>,
    prompt_cache_key: Ignored,
    reasoning_effort: Option<Value>,
    response_format: Option<Value>,
    safety_identifier: Ignored,
    seed: Option<Value>,
    service_tier: Ignored,
    stop: Option<Value>,
    store: Ignored,
    stream: Ignored,
    stream_options: Ignored,
    temperature: Option<Value>,
    tool_choice: Option<Value>,
    tools: Option<Value>,
    top_logprobs: Option<Value>,
    top_p: Option<Value>,
    user: Ignored,
    verbosity: Option<Value>,
    web_search_options: Option<Value>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

/// The chat keys ([`crate::key`] has the rules): every field but the ignored ones in the
/// partition, and the messages split at the final user turn.
fn keys(body: &Map<String, Value>, partition: &mut FieldHasher) -> Result<Turn, GatewayError> {
    let fields = ChatFields::deserialize(body).map_err(unreadable)?;
    // No `..`: a new field must be placed either in the key or among the ignored ones.
    let ChatFields {
        model,
        messages,
        audio,
        frequency_penalty,
        function_call,
        functions,
        logit_bias,
        logprobs,
        max_completion_tokens,
        max_tokens,
        metadata: _metadata,
        modalities,
        n,
        parallel_tool_calls,
        prediction,
        presence_penalty,
        prompt_cache_key: _prompt_cache_key,
        reasoning_effort,
        response_format,
        safety_identifier: _safety_identifier,
        seed,
        service_tier: _service_tier,
        stop,
        store: _store,
        stream: _stream,
        stream_options: _stream_options,
        temperature,
        tool_choice,
        tools,
        top_logprobs,
        top_p,
        user: _user,
        verbosity,
        web_search_options,
        extra,
    } = fields;
    model_field(partition, model.as_ref())?;
    hash_fields!(partition;
        audio, frequency_penalty, function_call, functions, logit_bias, logprobs,
        max_completion_tokens, max_tokens, modalities, n, parallel_tool_calls, prediction,
        presence_penalty, reasoning_effort, response_format, seed, stop, temperature, tool_choice,
        tools, top_logprobs, top_p, verbosity, web_search_options,
    );
    partition.extra(&extra);

    let messages = match messages {
        Some(Value::Array(messages)) => messages,
        _ => {
            return Err(GatewayError::invalid(
                "`messages` must be a non-empty array of message objects.",
                Some("messages"),
            ))
        }
    };
    let mut canonical = Vec::with_capacity(messages.len());
    for (i, message) in messages.iter().enumerate() {
        canonical.push(canonical_message(i, message, |content| {
            canonical_content(i, content)
        })?);
    }
    Ok(final_turn(
        partition,
        ["messages.before", "messages.after"],
        &canonical,
        |m| m.get("role").and_then(Value::as_str) == Some("user"),
        turn_shape,
        turn_text,
    ))
}

fn canonical_content(i: usize, content: &Value) -> Result<Value, GatewayError> {
    let parts = match content {
        Value::String(text) => return Ok(Value::String(normalize_text(text))),
        Value::Array(parts) => parts,
        _ => {
            return Err(GatewayError::invalid(
                format!("`messages[{i}].content` must be a string or an array of content parts."),
                Some(&format!("messages[{i}].content")),
            ))
        }
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let Some(part) = part.as_object() else {
            return Err(GatewayError::invalid(
                format!("`messages[{i}].content[{j}]` must be a content part object."),
                Some(&format!("messages[{i}].content[{j}]")),
            ));
        };
        let mut part = part.clone();
        if part.get("type").and_then(Value::as_str) == Some("text") {
            match part.get_mut("text") {
                Some(Value::String(text)) => *text = normalize_text(text),
                _ => {
                    return Err(GatewayError::invalid(
                        format!("`messages[{i}].content[{j}].text` must be a string."),
                        Some(&format!("messages[{i}].content[{j}].text")),
                    ))
                }
            }
        }
        out.push(part);
    }
    // SDKs and frameworks send the same text either way; only a bare text part collapses, since
    // any extra key on the part (e.g. a cache hint) might matter upstream.
    if let [only] = out.as_slice() {
        if only.len() == 2 && only.get("type").and_then(Value::as_str) == Some("text") {
            if let Some(Value::String(text)) = only.get("text") {
                return Ok(Value::String(text.clone()));
            }
        }
    }
    Ok(Value::Array(out.into_iter().map(Value::Object).collect()))
}

/// The final user turn with its text taken out: what semantic matching must not cross.
fn turn_shape(turn: &Map<String, Value>) -> Value {
    let mut shape = turn.clone();
    let text_part = || {
        let mut part = Map::new();
        part.insert("type".to_owned(), Value::String("text".to_owned()));
        Value::Object(part)
    };
    match shape.get_mut("content") {
        // A string is one text part, so the string and array spellings keep one shape.
        Some(content @ Value::String(_)) => *content = Value::Array(vec![text_part()]),
        Some(Value::Array(parts)) => {
            for part in parts.iter_mut().filter_map(Value::as_object_mut) {
                if part.get("type").and_then(Value::as_str) == Some("text") {
                    part.remove("text");
                }
            }
        }
        _ => {}
    }
    Value::Object(shape)
}

/// The final turn's text parts, already normalized, joined with a newline.
fn turn_text(turn: &Map<String, Value>) -> String {
    match turn.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::key::tests::{assert_same, base, chat_keys, user_says, with};

    #[test]
    fn fields_that_do_not_change_the_answer_are_left_out() {
        let a = chat_keys(base());
        let ignored = [
            ("user", json!("u-42")),
            ("stream", json!(true)),
            ("stream_options", json!({"include_usage": true})),
            ("metadata", json!({"trace": "abc"})),
            ("store", json!(true)),
            ("service_tier", json!("flex")),
            ("prompt_cache_key", json!("pck")),
            ("safety_identifier", json!("sid")),
        ];
        for (field, value) in ignored {
            let b = chat_keys(with(|b| b[field] = value));
            assert_same(&a, &b, field);
        }
    }

    #[test]
    fn output_changing_chat_fields_change_the_partition() {
        let variants: Vec<(&str, Value)> = vec![
            ("model", with(|b| b["model"] = json!("gpt-y"))),
            ("temperature", with(|b| b["temperature"] = json!(0.3))),
            ("top_p", with(|b| b["top_p"] = json!(0.9))),
            ("seed", with(|b| b["seed"] = json!(7))),
            ("max_tokens", with(|b| b["max_tokens"] = json!(100))),
            ("stop", with(|b| b["stop"] = json!(["\n"]))),
            ("n", with(|b| b["n"] = json!(2))),
            (
                "response_format",
                with(|b| b["response_format"] = json!({"type": "json_object"})),
            ),
            (
                "tools",
                with(|b| b["tools"] = json!([{"type": "function", "function": {"name": "f"}}])),
            ),
            ("tool_choice", with(|b| b["tool_choice"] = json!("none"))),
            (
                "logit_bias",
                with(|b| b["logit_bias"] = json!({"50256": -100})),
            ),
            (
                "system prompt",
                with(|b| b["messages"][0]["content"] = json!("Be verbose.")),
            ),
            (
                "earlier turn",
                with(|b| b["messages"][1]["content"] = json!("Hello")),
            ),
            (
                "earlier turn's name",
                with(|b| b["messages"][1]["name"] = json!("alice")),
            ),
            ("unknown field", with(|b| b["x_vendor_flag"] = json!(true))),
        ];
        let base = chat_keys(base());
        let mut seen = vec![base.partition];
        for (what, body) in variants {
            let keys = chat_keys(body);
            assert_ne!(base.partition, keys.partition, "{what}: partition");
            assert_ne!(base.exact, keys.exact, "{what}: exact");
            assert_eq!(base.prompt, keys.prompt, "{what}: prompt");
            assert!(!seen.contains(&keys.partition), "{what}: collides");
            seen.push(keys.partition);
        }
    }

    #[test]
    fn system_prompt_text_is_normalized_too() {
        let a = chat_keys(base());
        let b = chat_keys(with(|b| {
            b["messages"][0]["content"] = json!("\r\nBe brief.   \r\n")
        }));
        assert_same(&a, &b, "system whitespace");
        let c = chat_keys(with(|b| {
            b["messages"][0]["content"] = json!([{"type": "text", "text": "Be brief."}])
        }));
        assert_same(&a, &c, "system as one text part");
    }

    #[test]
    fn one_text_part_equals_a_plain_string() {
        let plain = chat_keys(user_says(json!("hi")));
        let part = chat_keys(user_says(json!([{"type": "text", "text": "hi  \n"}])));
        assert_same(&plain, &part, "single text part");
        // A part carrying anything besides type and text is not collapsed.
        let hinted = chat_keys(user_says(
            json!([{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]),
        ));
        assert_ne!(plain.exact, hinted.exact);
    }

    #[test]
    fn non_text_parts_stay_out_of_the_prompt_but_split_the_keys() {
        let image = |url: &str| {
            user_says(json!([
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "  Be short. "}
            ]))
        };
        let a = chat_keys(image("https://x/a.png"));
        let b = chat_keys(image("https://x/b.png"));
        assert_eq!(a.prompt, "What is this?\nBe short.");
        assert_eq!(a.prompt, b.prompt);
        assert_ne!(a.exact, b.exact);
        // Different images must never be matched semantically against each other.
        assert_ne!(a.partition, b.partition);
        let text_only = chat_keys(user_says(json!("What is this?\nBe short.")));
        assert_ne!(a.partition, text_only.partition);
    }
}
