//! The simulator's Responses API: `POST /v1/responses` (a `response` object, or its typed event
//! stream), and the server-side state a real provider keeps for stored responses: `GET` and
//! `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, and `previous_response_id`
//! checked against the responses it stored. It answers with deterministic words, never a model's.
//!
//! Faults: `status=CODE`, `hang`, `redirect` as on the other routes; `cut[=N]` (the stream stops
//! cleanly after N deltas, without `response.completed`), `abort[=N]` (the connection breaks),
//! `malformed[=N]`, `error-event[=N]` (an `event: error`, then stop), `failed[=N]` (a
//! `response.failed` event, status `failed`), `content-filter` (status `incomplete`, reason
//! `content_filter`), `refusal` (a `refusal` content part instead of text), `bad-tool-args`.
//! A `max_output_tokens` below the answer's length ends it `incomplete` (`max_output_tokens`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde_json::{json, Value};

use crate::text::{self, Event};
use crate::{
    broken_body, early_fault, error_response, jittered, parse_body, plan, stream_response, Fault,
    Sim,
};

/// Responses the simulator stored (`store` not false), by id, with their input items.
#[derive(Default)]
pub struct Stored {
    responses: Mutex<HashMap<String, (Value, Vec<Value>)>>,
}

impl Stored {
    fn get(&self, id: &str) -> Option<(Value, Vec<Value>)> {
        self.lock().get(id).cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Value, Vec<Value>)>> {
        self.responses.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn not_found(message: String, param: Option<&str>, code: Option<&str>) -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}})),
    )
        .into_response()
}

/// `GET /v1/responses/{id}`.
pub async fn get_response(State(sim): State<Sim>, Path(id): Path<String>) -> Response {
    match sim.stored.get(&id) {
        Some((response, _)) => Json(response).into_response(),
        None => not_found(format!("No response found with id '{id}'."), None, None),
    }
}

/// `DELETE /v1/responses/{id}`. Strict, as some servers and proxies are: a `DELETE` that comes
/// with a body, or chunked (the framing of one), is refused, since a gateway must not add one.
pub async fn delete_response(
    State(sim): State<Sim>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let sized = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|n| n != "0");
    if sized || headers.contains_key(axum::http::header::TRANSFER_ENCODING) {
        return error_response(
            StatusCode::BAD_REQUEST,
            "a DELETE request takes no body (it came with Content-Length or Transfer-Encoding)",
        );
    }
    match sim.stored.lock().remove(&id) {
        Some(_) => Json(json!({"id": id, "object": "response", "deleted": true})).into_response(),
        None => not_found(format!("No response found with id '{id}'."), None, None),
    }
}

/// `GET /v1/responses/{id}/input_items`.
pub async fn input_items(State(sim): State<Sim>, Path(id): Path<String>) -> Response {
    match sim.stored.get(&id) {
        Some((_, items)) => Json(json!({
            "object": "list",
            "data": items,
            "first_id": items.first().and_then(|i| i.get("id")).cloned(),
            "last_id": items.last().and_then(|i| i.get("id")).cloned(),
            "has_more": false,
        }))
        .into_response(),
        None => not_found(format!("No response found with id '{id}'."), None, None),
    }
}

/// The input as a list of items, each with an id (a string input is one user message).
fn input_list(input: Option<&Value>, response_n: u64) -> Vec<Value> {
    let items = match input {
        Some(Value::String(s)) => {
            vec![
                json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": s}]}),
            ]
        }
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, mut item)| {
            if let Some(obj) = item.as_object_mut() {
                obj.entry("id")
                    .or_insert_with(|| json!(format!("msg_simin{response_n:08}{i:04}")));
            }
            item
        })
        .collect()
}

/// The function the answer must call: `tool_choice: "required"` (the first tool) or
/// `{"type":"function","name":…}`.
fn forced_tool(request: &Value) -> Option<String> {
    let first = request
        .get("tools")?
        .as_array()?
        .iter()
        .find(|t| t.get("type").and_then(Value::as_str) == Some("function"))?
        .get("name")?
        .as_str()?
        .to_owned();
    match request.get("tool_choice") {
        Some(Value::String(s)) if s == "required" => Some(first),
        Some(Value::Object(o)) => o.get("name").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

/// What the answer is made of.
enum Output {
    Text(Vec<String>),
    Refusal(String),
    Call { name: String, arguments: String },
}

/// `POST /v1/responses`.
pub async fn create(State(sim): State<Sim>, headers: HeaderMap, body: Bytes) -> Response {
    sim.stats.responses.fetch_add(1, Ordering::SeqCst);
    sim.stats.note_auth(&headers);
    let request = match parse_body(&body) {
        Ok(v) => v,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    // A stored prompt (`prompt.id`) carries its model; the sim's prompts all name `sim-model`.
    let from_prompt = || {
        request
            .pointer("/prompt/id")
            .and_then(Value::as_str)
            .map(|_| "sim-model".to_owned())
    };
    let Some(model) = request
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(from_prompt)
    else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "you must provide a model parameter",
        );
    };
    let previous = request
        .get("previous_response_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    if let Some(previous) = &previous {
        if sim.stored.get(previous).is_none() {
            return not_found(
                format!("Previous response with id '{previous}' not found."),
                Some("previous_response_id"),
                Some("previous_response_not_found"),
            );
        }
    }
    let prompt_text = format!(
        "{}\0{}\0{}",
        request.get("instructions").unwrap_or(&Value::Null),
        request.get("input").unwrap_or(&Value::Null),
        previous.as_deref().unwrap_or("")
    );
    let prompt_tokens = text::estimate_tokens(&prompt_text);
    let plan = match plan(&sim, &headers, prompt_tokens) {
        Ok(p) => p,
        Err(message) => return error_response(StatusCode::BAD_REQUEST, &message),
    };
    if let Some(response) = early_fault(&plan).await {
        return response;
    }
    let n = sim.ids.fetch_add(1, Ordering::SeqCst);
    let seed = blake3::Hasher::new()
        .update(model.as_bytes())
        .update(b"\0")
        .update(prompt_text.as_bytes())
        .finalize();
    let max = request
        .get("max_output_tokens")
        .and_then(Value::as_u64)
        .map_or(plan.tokens, |m| m.min(u64::from(plan.tokens)) as u32);
    let mut reader = blake3::Hasher::new().update(seed.as_bytes()).finalize_xof();
    let words = text::words(&mut reader, max);
    let fault = plan.fault.clone();
    let output = match (forced_tool(&request), &fault) {
        (Some(name), _) => {
            let query: String = words.iter().take(3).map(String::as_str).collect();
            let mut arguments = json!({"query": query.trim()}).to_string();
            if fault == Some(Fault::BadToolArgs) {
                arguments.truncate(arguments.len() / 2);
            }
            Output::Call { name, arguments }
        }
        (None, Some(Fault::Refusal)) => {
            Output::Refusal("I'm sorry, I cannot help with that.".to_owned())
        }
        (None, _) => Output::Text(words),
    };
    let incomplete = if fault == Some(Fault::ContentFilter) {
        Some("content_filter")
    } else if max < plan.tokens && matches!(output, Output::Text(_)) {
        Some("max_output_tokens")
    } else {
        None
    };
    let background = request.get("background").and_then(Value::as_bool) == Some(true);
    let store = request.get("store").and_then(Value::as_bool) != Some(false);
    let shape = Shape {
        id: format!("resp_sim{n:010}"),
        item_id: format!("msg_sim{n:010}"),
        created_at: text::unix_now(),
        request: &request,
        model: &model,
        prompt_tokens,
    };
    let status = match (background, incomplete) {
        (true, _) => "queued",
        (false, Some(_)) => "incomplete",
        (false, None) => "completed",
    };
    let done = shape.response(status, &output, incomplete, true);
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    let failed = matches!(fault, Some(Fault::Failed(_)));
    if store && !failed {
        let items = input_list(request.get("input"), n);
        sim.stored
            .lock()
            .insert(shape.id.clone(), (done.clone(), items));
    }
    if !stream {
        let decode = plan.itl_ms * f64::from(max.saturating_sub(1));
        tokio::time::sleep(plan.ttft + jittered(decode, plan.jitter)).await;
        if matches!(fault, Some(Fault::Abort(_))) {
            return broken_body(&done);
        }
        if failed {
            let mut body = shape.response("failed", &output, None, false);
            body["error"] = json!({"code": "server_error", "message": "injected failure"});
            return (StatusCode::OK, Json(body)).into_response();
        }
        return (StatusCode::OK, Json(done)).into_response();
    }
    stream_response(shape.events(&output, incomplete, fault.as_ref()), plan)
}

/// What every object of one response shares.
struct Shape<'a> {
    id: String,
    item_id: String,
    created_at: u64,
    request: &'a Value,
    model: &'a str,
    prompt_tokens: u64,
}

impl Shape<'_> {
    fn item(&self, output: &Output, status: &str, full: bool) -> Value {
        match output {
            Output::Call { name, arguments } => json!({
                "id": format!("fc_{}", &self.item_id[4..]),
                "type": "function_call",
                "status": status,
                "call_id": format!("call_{}", &self.item_id[4..]),
                "name": name,
                "arguments": if full { arguments.as_str() } else { "" },
            }),
            Output::Text(_) | Output::Refusal(_) => json!({
                "id": self.item_id,
                "type": "message",
                "status": status,
                "role": "assistant",
                "content": if full { vec![self.part(output, true)] } else { Vec::new() },
            }),
        }
    }

    fn part(&self, output: &Output, full: bool) -> Value {
        match output {
            Output::Refusal(text) => {
                json!({"type": "refusal", "refusal": if full { text.as_str() } else { "" }})
            }
            Output::Text(words) => {
                let text: String = if full { words.concat() } else { String::new() };
                json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
            }
            Output::Call { .. } => Value::Null,
        }
    }

    fn output_tokens(output: &Output) -> u64 {
        match output {
            Output::Text(words) => words.len() as u64,
            Output::Refusal(_) => 8,
            Output::Call { arguments, .. } => text::estimate_tokens(arguments),
        }
    }

    /// The `response` object; `full` includes its output and usage.
    fn response(
        &self,
        status: &str,
        output: &Output,
        incomplete: Option<&str>,
        full: bool,
    ) -> Value {
        let r = self.request;
        let field = |name: &str, default: Value| r.get(name).cloned().unwrap_or(default);
        let out_tokens = Self::output_tokens(output);
        let done = full && status != "queued";
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": field("background", json!(false)),
            "error": null,
            "incomplete_details": incomplete.map(|reason| json!({"reason": reason})),
            "instructions": field("instructions", Value::Null),
            "max_output_tokens": field("max_output_tokens", Value::Null),
            "model": self.model,
            "output": if done { vec![self.item(output, if status == "completed" { "completed" } else { "incomplete" }, true)] } else { Vec::new() },
            "parallel_tool_calls": field("parallel_tool_calls", json!(true)),
            "previous_response_id": field("previous_response_id", Value::Null),
            "reasoning": field("reasoning", json!({"effort": null, "summary": null})),
            "store": r.get("store").and_then(Value::as_bool) != Some(false),
            "temperature": field("temperature", json!(1.0)),
            "text": field("text", json!({"format": {"type": "text"}})),
            "tool_choice": field("tool_choice", json!("auto")),
            "tools": field("tools", json!([])),
            "top_p": field("top_p", json!(1.0)),
            "truncation": field("truncation", json!("disabled")),
            "usage": if done { json!({
                "input_tokens": self.prompt_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": out_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": self.prompt_tokens + out_tokens,
            }) } else { Value::Null },
            "user": null,
            "metadata": field("metadata", json!({})),
        })
    }

    /// The typed event stream, with any mid-stream fault applied.
    fn events(
        &self,
        output: &Output,
        incomplete: Option<&str>,
        fault: Option<&Fault>,
    ) -> Vec<Event> {
        let mut seq = 0u64;
        let mut events = Vec::new();
        let mut push = |events: &mut Vec<Event>, mut data: Value, token: bool| {
            let kind = data["type"].as_str().unwrap_or("").to_owned();
            data["sequence_number"] = json!(seq);
            seq += 1;
            let bytes = Bytes::from(format!("event: {kind}\ndata: {data}\n\n"));
            events.push(if token {
                Event::Token(bytes)
            } else {
                Event::Immediate(bytes)
            });
        };
        let start = self.response("in_progress", output, None, false);
        push(
            &mut events,
            json!({"type": "response.created", "response": start}),
            false,
        );
        push(
            &mut events,
            json!({"type": "response.in_progress", "response": start}),
            false,
        );
        push(
            &mut events,
            json!({"type": "response.output_item.added", "output_index": 0, "item": self.item(output, "in_progress", false)}),
            false,
        );
        let item_id = self.item(output, "in_progress", false)["id"].clone();
        // Deltas: words of text, the refusal whole, argument fragments of a call.
        let (deltas, delta_type): (Vec<String>, &str) = match output {
            Output::Text(words) => (words.clone(), "response.output_text.delta"),
            Output::Refusal(text) => (vec![text.clone()], "response.refusal.delta"),
            Output::Call { arguments, .. } => {
                let chars: Vec<char> = arguments.chars().collect();
                (
                    chars.chunks(8).map(|c| c.iter().collect()).collect(),
                    "response.function_call_arguments.delta",
                )
            }
        };
        let is_message = !matches!(output, Output::Call { .. });
        if is_message {
            push(
                &mut events,
                json!({"type": "response.content_part.added", "item_id": item_id, "output_index": 0, "content_index": 0, "part": self.part(output, false)}),
                false,
            );
        }
        for (i, delta) in deltas.iter().enumerate() {
            let sent = i as u32;
            match fault {
                Some(Fault::Cut(at)) if sent == *at => return events,
                Some(Fault::Abort(at)) if sent == *at => {
                    events.push(Event::Abort);
                    return events;
                }
                Some(Fault::Malformed(at)) if sent == *at => events.push(Event::Immediate(
                    Bytes::from_static(b"event: response.output_text.delta\ndata: {not json\n\n"),
                )),
                Some(Fault::ErrorEvent(at)) if sent == *at => {
                    push(
                        &mut events,
                        json!({"type": "error", "code": "server_error", "message": "injected error event", "param": null}),
                        false,
                    );
                    return events;
                }
                Some(Fault::Failed(at)) if sent == *at => {
                    let mut failed = self.response("failed", output, None, false);
                    failed["error"] =
                        json!({"code": "server_error", "message": "injected failure"});
                    push(
                        &mut events,
                        json!({"type": "response.failed", "response": failed}),
                        false,
                    );
                    return events;
                }
                _ => {}
            }
            let mut data =
                json!({"type": delta_type, "item_id": item_id, "output_index": 0, "delta": delta});
            if is_message {
                data["content_index"] = json!(0);
            }
            if delta_type == "response.output_text.delta" {
                data["logprobs"] = json!([]);
            }
            push(&mut events, data, true);
        }
        match output {
            Output::Text(words) => push(
                &mut events,
                json!({"type": "response.output_text.done", "item_id": item_id, "output_index": 0, "content_index": 0, "text": words.concat(), "logprobs": []}),
                false,
            ),
            Output::Refusal(text) => push(
                &mut events,
                json!({"type": "response.refusal.done", "item_id": item_id, "output_index": 0, "content_index": 0, "refusal": text}),
                false,
            ),
            Output::Call { name, arguments } => push(
                &mut events,
                json!({"type": "response.function_call_arguments.done", "item_id": item_id, "output_index": 0, "name": name, "arguments": arguments}),
                false,
            ),
        }
        if is_message {
            push(
                &mut events,
                json!({"type": "response.content_part.done", "item_id": item_id, "output_index": 0, "content_index": 0, "part": self.part(output, true)}),
                false,
            );
        }
        let status = if incomplete.is_some() {
            "incomplete"
        } else {
            "completed"
        };
        push(
            &mut events,
            json!({"type": "response.output_item.done", "output_index": 0, "item": self.item(output, status, true)}),
            false,
        );
        let done = self.response(status, output, incomplete, true);
        let kind = if incomplete.is_some() {
            "response.incomplete"
        } else {
            "response.completed"
        };
        push(&mut events, json!({"type": kind, "response": done}), false);
        if fault == Some(&Fault::StallAtDone) {
            // The last event is out, and the connection stays open.
            events.push(Event::Stall);
        }
        events
    }
}
