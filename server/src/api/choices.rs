//! The `choices` half of chat and legacy completions answers, which the two adapters share: the
//! never-store rules over `choices`, and the two shapes of an answer made from each other (a
//! stream assembled into the body a non-streamed request would have received, a body re-chunked
//! into the events a streamed one would have), so either kind of hit can be served from either
//! kind of miss without re-deriving anything on the hit path. It must not know more of an API
//! than the `chat` flag says (chat objects, or legacy `text_completion` ones).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{pieces, Uncacheable};
use crate::entry::StoredEvent;

/// The never-store rules of an answer made of `choices` (chat and legacy completions): every
/// choice finished (not at its token limit unless `allow_length`, not at the content filter),
/// no `error` beside them, and tool-call arguments that are JSON.
pub(super) fn check_choices(body: &Value, allow_length: bool) -> Result<(), Uncacheable> {
    if body.get("error").is_some_and(|e| !e.is_null()) {
        return Err(Uncacheable::Error);
    }
    let choices = body
        .get("choices")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
        .ok_or(Uncacheable::NoChoices)?;
    for choice in choices {
        match choice.get("finish_reason").and_then(Value::as_str) {
            None => return Err(Uncacheable::NoFinishReason),
            Some("length") if !allow_length => return Err(Uncacheable::Length),
            Some("content_filter") => return Err(Uncacheable::ContentFilter),
            Some(_) => {}
        }
        let calls = choice
            .pointer("/message/tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|call| call.get("function"));
        // A legacy function call's arguments too.
        let legacy = choice.pointer("/message/function_call");
        for function in calls.chain(legacy) {
            let args = function
                .get("arguments")
                .and_then(Value::as_str)
                .unwrap_or("");
            if serde_json::from_str::<Value>(args).is_err() {
                return Err(Uncacheable::InvalidToolArguments);
            }
        }
    }
    Ok(())
}

#[derive(Default)]
struct ChoiceAcc {
    role: Option<Value>,
    content: String,
    has_content: bool,
    refusal: Option<String>,
    reasoning: Option<String>,
    /// Tool calls by their stream index.
    tool_calls: BTreeMap<u64, Map<String, Value>>,
    /// A legacy function call (`functions`/`function_call`, still served by OpenAI): its name and
    /// arguments, in fragments.
    function_call: Option<(String, String)>,
    /// Citations (`url_citation`, with web search) as they came.
    annotations: Option<Vec<Value>>,
    /// Chat: the `logprobs.content` entries; legacy completions: each array of `logprobs`
    /// (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`), joined across chunks.
    logprobs: Option<Vec<Value>>,
    legacy_logprobs: Option<Map<String, Value>>,
    finish_reason: Option<Value>,
}

/// Assembles the body a non-streamed request would have received from a stream's chunks: a chat
/// completion when `chat`, else a legacy `text_completion`.
pub(super) fn assemble_choices<'a>(
    chunks: impl IntoIterator<Item = &'a Value>,
    chat: bool,
) -> Value {
    let mut choices: BTreeMap<u64, ChoiceAcc> = BTreeMap::new();
    let mut usage = Value::Null;
    let mut head = Map::new();
    for chunk in chunks {
        for field in [
            "id",
            "created",
            "model",
            "system_fingerprint",
            "service_tier",
        ] {
            if let Some(v) = chunk.get(field).filter(|v| !v.is_null()) {
                head.entry(field).or_insert_with(|| v.clone());
            }
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            usage = u.clone();
        }
        for choice in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
            let acc = choices.entry(index).or_default();
            if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
                acc.finish_reason = Some(reason.clone());
            }
            if let Some(text) = choice.get("text").and_then(Value::as_str) {
                acc.content.push_str(text);
                acc.has_content = true;
            }
            if let Some(lp) = choice
                .pointer("/logprobs/content")
                .and_then(Value::as_array)
            {
                acc.logprobs
                    .get_or_insert_with(Vec::new)
                    .extend(lp.iter().cloned());
            }
            if !chat {
                if let Some(lp) = choice.get("logprobs").and_then(Value::as_object) {
                    let joined = acc.legacy_logprobs.get_or_insert_with(Map::new);
                    for (field, values) in lp {
                        let into = joined.entry(field.as_str());
                        match values.as_array() {
                            Some(values) => {
                                if let Some(into) = into.or_insert_with(|| json!([])).as_array_mut()
                                {
                                    into.extend(values.iter().cloned());
                                }
                            }
                            // `top_logprobs: null` when none were asked for.
                            None => {
                                into.or_insert_with(|| values.clone());
                            }
                        }
                    }
                }
            }
            let Some(delta) = choice.get("delta") else {
                continue;
            };
            if let Some(role) = delta.get("role").filter(|r| !r.is_null()) {
                acc.role.get_or_insert_with(|| role.clone());
            }
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                acc.content.push_str(text);
                acc.has_content = true;
            }
            if let Some(text) = delta.get("refusal").and_then(Value::as_str) {
                acc.refusal.get_or_insert_with(String::new).push_str(text);
            }
            if let Some(text) = delta.get("reasoning_content").and_then(Value::as_str) {
                acc.reasoning.get_or_insert_with(String::new).push_str(text);
            }
            if let Some(call) = delta.get("function_call").filter(|c| c.is_object()) {
                let (name, args) = acc.function_call.get_or_insert_with(Default::default);
                if let Some(part) = call.get("name").and_then(Value::as_str) {
                    name.push_str(part);
                }
                if let Some(part) = call.get("arguments").and_then(Value::as_str) {
                    args.push_str(part);
                }
            }
            if let Some(found) = delta.get("annotations").and_then(Value::as_array) {
                acc.annotations
                    .get_or_insert_with(Vec::new)
                    .extend(found.iter().cloned());
            }
            for call in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let call_index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                let slot = acc.tool_calls.entry(call_index).or_default();
                for field in ["id", "type"] {
                    if let Some(v) = call.get(field).filter(|v| !v.is_null()) {
                        slot.entry(field).or_insert_with(|| v.clone());
                    }
                }
                let function = slot
                    .entry("function")
                    .or_insert_with(|| json!({"name": "", "arguments": ""}));
                if let Some(name) = call.pointer("/function/name").and_then(Value::as_str) {
                    let current = function["name"].as_str().unwrap_or("").to_owned();
                    function["name"] = json!(current + name);
                }
                if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                    let current = function["arguments"].as_str().unwrap_or("").to_owned();
                    function["arguments"] = json!(current + args);
                }
            }
        }
    }
    let choices: Vec<Value> = choices
        .into_iter()
        .map(|(index, acc)| {
            let logprobs = acc.logprobs.map_or(Value::Null, |c| json!({"content": c}));
            if !chat {
                let logprobs = acc.legacy_logprobs.map_or(Value::Null, Value::Object);
                return json!({"text": acc.content, "index": index, "logprobs": logprobs, "finish_reason": acc.finish_reason});
            }
            let called = !acc.tool_calls.is_empty() || acc.function_call.is_some();
            let mut message = json!({
                "role": acc.role.unwrap_or_else(|| json!("assistant")),
                "content": if acc.has_content || !called { json!(acc.content) } else { Value::Null },
                "refusal": acc.refusal,
            });
            if let Some(r) = acc.reasoning {
                message["reasoning_content"] = json!(r);
            }
            if let Some(annotations) = acc.annotations {
                message["annotations"] = Value::Array(annotations);
            }
            if let Some((name, arguments)) = acc.function_call {
                message["function_call"] = json!({"name": name, "arguments": arguments});
            }
            if !acc.tool_calls.is_empty() {
                message["tool_calls"] = Value::Array(acc.tool_calls.into_values().map(Value::Object).collect());
            }
            json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": acc.finish_reason})
        })
        .collect();
    let mut body = Map::new();
    body.insert("id".into(), head.remove("id").unwrap_or(Value::Null));
    body.insert(
        "object".into(),
        json!(if chat {
            "chat.completion"
        } else {
            "text_completion"
        }),
    );
    for field in ["created", "model", "system_fingerprint", "service_tier"] {
        if let Some(v) = head.remove(field) {
            body.insert(field.into(), v);
        }
    }
    body.insert("choices".into(), Value::Array(choices));
    body.insert("usage".into(), usage);
    Value::Object(body)
}

/// The chunks a streamed request would have received for a non-streamed body (chat chunks when
/// `chat`, else legacy `text_completion` ones).
pub(super) fn rechunk_choices(body: &Value, decode_ms: f64, chat: bool) -> Vec<StoredEvent> {
    let mut head = json!({
        "id": body.get("id").cloned().unwrap_or(Value::Null),
        "object": if chat { "chat.completion.chunk" } else { "text_completion" },
        "created": body.get("created").cloned().unwrap_or(Value::Null),
        "model": body.get("model").cloned().unwrap_or(Value::Null),
    });
    for field in ["system_fingerprint", "service_tier"] {
        if let Some(value) = body.get(field) {
            head[field] = value.clone();
        }
    }
    let chunk = |choices: Value| {
        let mut c = head.clone();
        c["choices"] = choices;
        c
    };
    let mut chunks = Vec::new();
    let choices = body
        .get("choices")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for choice in &choices {
        let index = choice.get("index").cloned().unwrap_or(json!(0));
        let finish = choice.get("finish_reason").cloned().unwrap_or(Value::Null);
        // Token log probabilities (asked for with `logprobs`) ride on the first piece of text, all
        // of them: clients join every chunk's, so the whole answer's come out as in the body.
        let mut logprobs = choice.get("logprobs").filter(|lp| !lp.is_null()).cloned();
        if chat {
            let message = choice.get("message").cloned().unwrap_or(json!({}));
            // As OpenAI opens a call's stream: `content: null` where the body has none.
            let opening = if message.get("content").is_some_and(Value::is_null) {
                Value::Null
            } else {
                json!("")
            };
            chunks.push(chunk(json!([{"index": index, "delta": {"role": message.get("role").cloned().unwrap_or(json!("assistant")), "content": opening, "refusal": null}, "logprobs": null, "finish_reason": null}])));
            // Reasoning streams before the answer, as the providers that return it stream it.
            if let Some(reasoning) = message.get("reasoning_content").and_then(Value::as_str) {
                for piece in pieces(reasoning) {
                    chunks.push(chunk(json!([{"index": index, "delta": {"reasoning_content": piece}, "logprobs": null, "finish_reason": null}])));
                }
            }
            let text = message.get("content").and_then(Value::as_str).unwrap_or("");
            for piece in pieces(text) {
                let lp = logprobs.take().unwrap_or(Value::Null);
                chunks.push(chunk(json!([{"index": index, "delta": {"content": piece}, "logprobs": lp, "finish_reason": null}])));
            }
            if let Some(refusal) = message.get("refusal").and_then(Value::as_str) {
                let lp = logprobs.take().unwrap_or(Value::Null);
                chunks.push(chunk(json!([{"index": index, "delta": {"refusal": refusal}, "logprobs": lp, "finish_reason": null}])));
            }
            if let Some(annotations) = message
                .get("annotations")
                .and_then(Value::as_array)
                .filter(|a| !a.is_empty())
            {
                chunks.push(chunk(json!([{"index": index, "delta": {"annotations": annotations}, "logprobs": null, "finish_reason": null}])));
            }
            if let Some(call) = message.get("function_call").filter(|c| c.is_object()) {
                chunks.push(chunk(json!([{"index": index, "delta": {"function_call": call}, "logprobs": null, "finish_reason": null}])));
            }
            for (i, call) in message
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let mut call = call.clone();
                call["index"] = json!(i);
                chunks.push(chunk(json!([{"index": index, "delta": {"tool_calls": [call]}, "logprobs": null, "finish_reason": null}])));
            }
            let lp = logprobs.take().unwrap_or(Value::Null);
            chunks.push(chunk(
                json!([{"index": index, "delta": {}, "logprobs": lp, "finish_reason": finish}]),
            ));
        } else {
            let text = choice.get("text").and_then(Value::as_str).unwrap_or("");
            for piece in pieces(text) {
                let lp = logprobs.take().unwrap_or(Value::Null);
                chunks.push(chunk(
                    json!([{"text": piece, "index": index, "logprobs": lp, "finish_reason": null}]),
                ));
            }
            let lp = logprobs.take().unwrap_or(Value::Null);
            chunks.push(chunk(
                json!([{"text": "", "index": index, "logprobs": lp, "finish_reason": finish}]),
            ));
        }
    }
    if let Some(usage) = body.get("usage").filter(|u| !u.is_null()) {
        let mut last = chunk(json!([]));
        last["usage"] = usage.clone();
        chunks.push(last);
    }
    let steps = chunks.len().saturating_sub(1).max(1) as f64;
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, data)| StoredEvent {
            offset_ms: decode_ms * i as f64 / steps,
            data,
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ingress::Route;

    // The stage's view of the adapters, so the assertions read as the stages call them.
    fn assemble(route: Route, events: &[Value]) -> Value {
        super::super::of(route).assemble(events)
    }

    fn check_cacheable(route: Route, body: &Value, allow_length: bool) -> Result<(), Uncacheable> {
        super::super::of(route).check(body, allow_length)
    }

    fn rechunk(route: Route, body: &Value, decode_ms: f64) -> Vec<StoredEvent> {
        super::super::of(route).rechunk(body, decode_ms)
    }

    /// A streamed chat answer: role, two content chunks, the finish, and a usage-only chunk.
    pub(crate) fn chunks() -> Vec<Value> {
        vec![
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}),
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": null}]}),
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {"content": " world"}, "finish_reason": null}]}),
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
        ]
    }

    #[test]
    fn assembles_a_stream_into_a_body_and_back() {
        let body = assemble(Route::ChatCompletions, &chunks());
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["choices"][0]["message"]["content"], "Hello world");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"]["completion_tokens"], 2);
        let events = rechunk(Route::ChatCompletions, &body, 10.0);
        let data: Vec<Value> = events.iter().map(|e| e.data.clone()).collect();
        assert_eq!(assemble(Route::ChatCompletions, &data), body);
        assert_eq!(events.last().map(|e| e.offset_ms), Some(10.0));
    }

    #[test]
    fn tool_call_fragments_join_and_bad_arguments_are_refused() {
        let mk = |args: &str| {
            vec![
                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get", "arguments": ""}}]}}]}),
                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": args}}]}}]}),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
            ]
        };
        let good = assemble(Route::ChatCompletions, &mk("{\"q\": 1}"));
        assert_eq!(
            good["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{\"q\": 1}"
        );
        assert!(good["choices"][0]["message"]["content"].is_null());
        assert_eq!(
            check_cacheable(Route::ChatCompletions, &good, false),
            Ok(())
        );
        let bad = assemble(Route::ChatCompletions, &mk("{\"q\": "));
        assert_eq!(
            check_cacheable(Route::ChatCompletions, &bad, false),
            Err(Uncacheable::InvalidToolArguments)
        );
    }

    /// Found by an audit against a strict upstream: a hit served in the other shape than its
    /// miss lost a legacy function call (an empty answer), log probabilities, citations and the
    /// service tier. Each survives both ways now.
    #[test]
    fn function_calls_logprobs_and_citations_survive_either_shape() {
        let head = |c: Value| {
            let mut chunk = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "service_tier": "default"});
            chunk["choices"] = c;
            chunk
        };
        let streamed = vec![
            head(
                json!([{"index": 0, "delta": {"role": "assistant", "content": null, "function_call": {"name": "get_weather", "arguments": ""}}, "finish_reason": null}]),
            ),
            head(
                json!([{"index": 0, "delta": {"function_call": {"arguments": "{\"city\":"}}, "finish_reason": null}]),
            ),
            head(
                json!([{"index": 0, "delta": {"function_call": {"arguments": " \"Oslo\"}"}}, "finish_reason": null}]),
            ),
            head(json!([{"index": 0, "delta": {}, "finish_reason": "function_call"}])),
        ];
        let mut bad = streamed.clone();
        bad[2]["choices"][0]["delta"]["function_call"]["arguments"] = json!(" \"Os");
        assert_eq!(
            check_cacheable(
                Route::ChatCompletions,
                &assemble(Route::ChatCompletions, &bad),
                false
            ),
            Err(Uncacheable::InvalidToolArguments),
            "a cut legacy call is not stored"
        );
        let body = assemble(Route::ChatCompletions, &streamed);
        assert_eq!(
            check_cacheable(Route::ChatCompletions, &body, false),
            Ok(())
        );
        let message = &body["choices"][0]["message"];
        assert_eq!(
            message["function_call"],
            json!({"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"})
        );
        assert!(message["content"].is_null(), "{body}");
        assert_eq!(body["service_tier"], "default");
        let events = rechunk(Route::ChatCompletions, &body, 5.0);
        assert!(events.iter().all(|e| e.data["service_tier"] == "default"));
        let data: Vec<Value> = events.iter().map(|e| e.data.clone()).collect();
        assert_eq!(assemble(Route::ChatCompletions, &data), body);

        // A body with log probabilities and citations, as a non-streamed miss returns it.
        let token = |t: &str| json!({"token": t, "logprob": -0.5, "bytes": t.as_bytes(), "top_logprobs": []});
        let cited = json!({"type": "url_citation", "url_citation": {"url": "https://example.com", "title": "x", "start_index": 0, "end_index": 5}});
        let body = json!({"id": "c2", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello world", "refusal": null, "reasoning_content": "Greet them.", "annotations": [cited]},
                "logprobs": {"content": [token("Hello"), token(" world")]}, "finish_reason": "stop"}],
            "usage": null});
        let data: Vec<Value> = rechunk(Route::ChatCompletions, &body, 5.0)
            .into_iter()
            .map(|e| e.data)
            .collect();
        let back = assemble(Route::ChatCompletions, &data);
        assert_eq!(
            back["choices"][0]["logprobs"],
            body["choices"][0]["logprobs"]
        );
        assert_eq!(back["choices"][0]["message"]["annotations"], json!([cited]));
        assert_eq!(back["choices"][0]["message"]["content"], "Hello world");
        assert_eq!(
            back["choices"][0]["message"]["reasoning_content"],
            "Greet them."
        );

        // Legacy completions: each array of `logprobs`, either way.
        let legacy = |text: &str, tokens: Value| {
            json!({"id": "t1", "object": "text_completion", "created": 1, "model": "m",
                "choices": [{"text": text, "index": 0, "logprobs": {"tokens": tokens.clone(), "token_logprobs": [-0.1], "top_logprobs": null, "text_offset": [0]}, "finish_reason": null}]})
        };
        let mut last = legacy("", json!([]));
        last["choices"][0]["logprobs"] = Value::Null;
        last["choices"][0]["finish_reason"] = json!("stop");
        let streamed = vec![
            legacy("The", json!(["The"])),
            legacy(" sea", json!([" sea"])),
            last,
        ];
        let body = assemble(Route::Completions, &streamed);
        assert_eq!(
            body["choices"][0]["logprobs"],
            json!({"tokens": ["The", " sea"], "token_logprobs": [-0.1, -0.1], "top_logprobs": null, "text_offset": [0, 0]})
        );
        let data: Vec<Value> = rechunk(Route::Completions, &body, 5.0)
            .into_iter()
            .map(|e| e.data)
            .collect();
        assert_eq!(assemble(Route::Completions, &data), body);
    }

    #[test]
    fn never_store_rules() {
        let mut body = assemble(Route::ChatCompletions, &chunks()[..3]);
        assert_eq!(
            check_cacheable(Route::ChatCompletions, &body, false),
            Err(Uncacheable::NoFinishReason)
        );
        body["choices"][0]["finish_reason"] = json!("length");
        assert_eq!(
            check_cacheable(Route::ChatCompletions, &body, false),
            Err(Uncacheable::Length)
        );
        assert_eq!(check_cacheable(Route::ChatCompletions, &body, true), Ok(()));
        assert_eq!(
            check_cacheable(Route::ChatCompletions, &json!({"choices": []}), false),
            Err(Uncacheable::NoChoices)
        );
        // Any choice stopped by the content filter, even beside clean ones.
        let mut two = body.clone();
        two["choices"][0]["finish_reason"] = json!("stop");
        two["choices"]
            .as_array_mut()
            .expect("choices")
            .push(json!({"index": 1, "message": {"role": "assistant", "content": ""}, "finish_reason": "content_filter"}));
        assert_eq!(
            check_cacheable(Route::ChatCompletions, &two, true),
            Err(Uncacheable::ContentFilter)
        );
        assert_eq!(
            check_cacheable(
                Route::Completions,
                &json!({"choices": [{"text": "", "finish_reason": "content_filter"}]}),
                true
            ),
            Err(Uncacheable::ContentFilter)
        );
        body["error"] = json!({"message": "partial"});
        assert_eq!(
            check_cacheable(Route::ChatCompletions, &body, true),
            Err(Uncacheable::Error)
        );
    }
}
