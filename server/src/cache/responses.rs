//! The Responses API's shapes of an answer and its never-store rules: a stream's body is the
//! `response` of its `response.completed` event, and a body is re-streamed as the typed event
//! sequence the provider sends (`response.created` … `response.completed`, numbered by
//! `sequence_number`), so either kind of hit can be served from either kind of miss; and the entries
//! of a response the provider deleted are forgotten.

use std::sync::Arc;

use serde_json::{json, Value};

use super::cacheable::{pieces, Uncacheable};
use super::Cache;
use crate::entry::StoredEvent;
use crate::ingress::Route;

/// The response id of `DELETE /v1/responses/{id}` (not of its sub-paths), when that is the request.
pub fn deleted_response(method: &http::Method, path: &str) -> Option<String> {
    let id = path.strip_prefix("/v1/responses/")?;
    (method == http::Method::DELETE && !id.is_empty() && !id.contains('/')).then(|| id.to_owned())
}

/// Drops the entries that serve response `id` to `tenant` (its label), once the provider deleted
/// it: a hit would hand out an id that no longer resolves, and a conversation continued from it
/// would fail. Scans the store (deleting a response is rare), so it runs on a blocking thread.
pub fn forget_deleted(cache: &Arc<Cache>, tenant: &str, id: &str) -> usize {
    let route = Route::Responses.name();
    let mut doomed = Vec::new();
    let mut after = None;
    loop {
        let page = match cache.store.list(after, 256) {
            Ok(page) => page,
            Err(err) => {
                tracing::warn!(error = %err, "could not scan the store for a deleted response");
                return 0;
            }
        };
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        doomed.extend(
            page.iter()
                .filter(|e| e.summary.route == route && e.summary.tenant == tenant)
                .filter(|e| e.body.get("id").and_then(Value::as_str) == Some(id))
                .map(|e| e.id),
        );
    }
    let mut removed = 0;
    for entry in doomed {
        if cache.store.delete(entry).unwrap_or(false) {
            removed += 1;
        }
        if let Some(index) = &cache.index {
            index.remove(entry.0);
        }
    }
    tracing::debug!(removed, "forgot the entries of a response deleted upstream");
    removed
}

/// Only a `completed` response is an answer: `incomplete` (cut at `max_output_tokens` or by the
/// content filter), `failed`, `cancelled`, `queued` and `in_progress` never are. A response with an
/// `error`, a refusal, function-call arguments that are not JSON, or a tool the provider ran with
/// effects beyond the answer (`mcp_call`, `mcp_approval_request`, `code_interpreter_call`) is not
/// stored either.
pub fn check(body: &Value) -> Result<(), Uncacheable> {
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
pub fn assemble<'a>(events: impl IntoIterator<Item = &'a Value>) -> Value {
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
pub fn rechunk(body: &Value, decode_ms: f64) -> Vec<StoredEvent> {
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
    use super::*;

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
