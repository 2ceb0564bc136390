//! Incremental Server-Sent Events framing and classification of OpenAI stream events: chat and
//! completion chunks ending in `[DONE]`, and the Responses API's typed events ending in
//! `response.completed`.
//!
//! The relay must forward the upstream's bytes untouched, yet it needs to know where each event ends
//! (to insert the timing comment before `data: [DONE]`), which events carry tokens, and whether the
//! stream finished cleanly. This module only reads; it never rewrites an event.

use bytes::{Bytes, BytesMut};
use serde_json::Value;

/// Splits a byte stream into whole SSE events (each returned with its terminating blank line).
#[derive(Debug, Default)]
pub struct SseFramer {
    buf: BytesMut,
}

impl SseFramer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk; returns every event it completed, in order.
    pub fn push(&mut self, chunk: &[u8]) -> Vec<Bytes> {
        self.buf.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some(end) = event_end(&self.buf) {
            events.push(self.buf.split_to(end).freeze());
        }
        events
    }

    /// Bytes received after the last complete event (a stream that ends here was cut mid-event).
    pub fn remainder(&self) -> &[u8] {
        &self.buf
    }
}

/// Index just past the blank line ending the first complete event, if there is one.
/// Lines may end in `\n`, `\r\n` or `\r` (the SSE spec allows all three).
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut line_start = 0;
    let mut i = 0;
    while i < buf.len() {
        let terminator_len = match buf[i] {
            b'\n' => 1,
            b'\r' if i + 1 < buf.len() => {
                if buf[i + 1] == b'\n' {
                    2
                } else {
                    1
                }
            }
            // A trailing `\r` may be the first half of `\r\n`: wait for more bytes.
            b'\r' => return None,
            _ => {
                i += 1;
                continue;
            }
        };
        let line_empty = i == line_start;
        i += terminator_len;
        if line_empty && line_start > 0 {
            return Some(i);
        }
        if line_empty {
            // Blank lines before any field do not end an event; skip them with it.
            line_start = i;
            continue;
        }
        line_start = i;
    }
    None
}

/// What one SSE event means to the gateway.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// `data: [DONE]`: the clean end of an OpenAI stream.
    Done,
    /// A JSON chunk; `tokens` counts the choices that carry content in it.
    Chunk {
        tokens: u32,
        finish_reason: Option<String>,
        usage: Option<Value>,
        /// The parsed chunk, kept for recording.
        value: Value,
    },
    /// An event named `error` (`event: error`), or data that is a JSON object with an `error`
    /// member: the upstream failed mid-stream. Holds the data (JSON if it parses, else the text).
    Error(Value),
    /// Comments, `retry:` or other events without data.
    NoData,
    /// Data that is neither `[DONE]` nor JSON.
    Malformed(String),
}

/// Joined `data:` lines of an event, per the SSE spec (one leading space stripped).
pub fn event_data(event: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(event);
    let mut data: Option<String> = None;
    for line in text.split(['\n', '\r']) {
        let Some(rest) = line.strip_prefix("data") else {
            continue;
        };
        let value = match rest.strip_prefix(':') {
            Some(v) => v.strip_prefix(' ').unwrap_or(v),
            None if rest.is_empty() => "",
            None => continue, // a field named e.g. `database`
        };
        match &mut data {
            Some(d) => {
                d.push('\n');
                d.push_str(value);
            }
            None => data = Some(value.to_owned()),
        }
    }
    data
}

/// The `event:` field of an event (the last one wins, per the SSE spec), if it has one.
pub fn event_name(event: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(event);
    text.split(['\n', '\r'])
        .filter_map(|line| line.strip_prefix("event:"))
        .map(|name| name.strip_prefix(' ').unwrap_or(name).to_owned())
        .next_back()
}

pub fn classify(event: &[u8]) -> EventKind {
    // A named error event is an error whatever its data says: some servers send
    // `event: error` with a plain message, or with a body that has no `error` member.
    let named_error = event_name(event).as_deref() == Some("error");
    let Some(data) = event_data(event) else {
        return if named_error {
            EventKind::Error(Value::Null)
        } else {
            EventKind::NoData
        };
    };
    if named_error {
        return EventKind::Error(serde_json::from_str(&data).unwrap_or(Value::String(data)));
    }
    if data.trim() == "[DONE]" {
        return EventKind::Done;
    }
    let value: Value = match serde_json::from_str(&data) {
        Ok(v) => v,
        Err(_) => return EventKind::Malformed(data),
    };
    if value.get("error").is_some_and(|e| !e.is_null()) {
        return EventKind::Error(value);
    }
    if !value.is_object() {
        return EventKind::Malformed(data);
    }
    if let Some(kind) = typed_event(&value).map(str::to_owned) {
        return classify_typed(&kind, value);
    }
    let finish_reason = value
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("finish_reason").and_then(Value::as_str))
        .next_back()
        .map(str::to_owned);
    EventKind::Chunk {
        tokens: chunk_tokens(&value),
        finish_reason,
        usage: value.get("usage").filter(|u| !u.is_null()).cloned(),
        value,
    }
}

/// The `type` of a Responses API stream event (`response.output_text.delta`, `error`…).
fn typed_event(value: &Value) -> Option<&str> {
    let kind = value.get("type")?.as_str()?;
    (kind.starts_with("response.") || kind == "error").then_some(kind)
}

/// A Responses API event: `response.completed` (and `response.incomplete`, whose status the
/// never-store rules refuse) end the stream, with the response's status as the finish reason;
/// `response.failed` and `error` are failures; a text, refusal, reasoning or arguments delta is
/// about one token.
fn classify_typed(kind: &str, value: Value) -> EventKind {
    match kind {
        "error" | "response.failed" => return EventKind::Error(value),
        _ => {}
    }
    let finish_reason = matches!(kind, "response.completed" | "response.incomplete").then(|| {
        value
            .pointer("/response/status")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_owned()
    });
    let usage = finish_reason
        .as_ref()
        .and_then(|_| value.pointer("/response/usage"))
        .filter(|u| !u.is_null())
        .cloned();
    EventKind::Chunk {
        tokens: reprise_migrations::replay::named_event_tokens(&value),
        finish_reason,
        usage,
        value,
    }
}

/// Tokens a chunk carries: its choices with content (a chat delta with content, a refusal, reasoning
/// or tool-call arguments, or a legacy completion's text), about one token each on OpenAI-style
/// streams. One rule with the replay record's token counts, which the migrations crate owns.
pub use reprise_migrations::replay::chunk_tokens;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_events_split_across_chunks_and_line_endings() {
        let mut framer = SseFramer::new();
        assert!(framer.push(b"data: {\"a\"").is_empty());
        let events = framer.push(b":1}\n\ndata: x\r\n\r\ndata: y\r");
        assert_eq!(events.len(), 2);
        assert_eq!(&events[0][..], b"data: {\"a\":1}\n\n");
        assert_eq!(&events[1][..], b"data: x\r\n\r\n");
        let events = framer.push(b"\n\r\n: comment\n\n");
        assert_eq!(events.len(), 2);
        assert_eq!(&events[0][..], b"data: y\r\n\r\n");
        assert_eq!(&events[1][..], b": comment\n\n");
        assert!(framer.remainder().is_empty());
    }

    #[test]
    fn classifies_openai_events() {
        let chunk =
            br#"data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}

"#;
        assert!(matches!(
            classify(chunk),
            EventKind::Chunk {
                tokens: 1,
                finish_reason: None,
                usage: None,
                ..
            }
        ));
        let role_only = br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}

"#;
        assert!(matches!(
            classify(role_only),
            EventKind::Chunk { tokens: 0, .. }
        ));
        let last = br#"data: {"choices":[{"delta":{},"finish_reason":"stop"}]}

"#;
        assert!(
            matches!(classify(last), EventKind::Chunk { finish_reason: Some(r), .. } if r == "stop")
        );
        assert_eq!(classify(b"data: [DONE]\n\n"), EventKind::Done);
        assert!(matches!(
            classify(b"data: {\"error\":{\"message\":\"boom\"}}\n\n"),
            EventKind::Error(_)
        ));
        assert!(matches!(
            classify(b"data: {not json\n\n"),
            EventKind::Malformed(_)
        ));
        assert_eq!(classify(b": keep-alive\n\n"), EventKind::NoData);
        // A named error event, whatever its data.
        assert!(matches!(
            classify(b"event: error\ndata: {\"message\":\"overloaded\"}\n\n"),
            EventKind::Error(_)
        ));
        assert!(matches!(
            classify(b"event:error\ndata: overloaded\n\n"),
            EventKind::Error(Value::String(_))
        ));
        assert!(matches!(classify(b"event: error\n\n"), EventKind::Error(_)));
        assert!(matches!(
            classify(b"event: message\ndata: {\"choices\":[]}\n\n"),
            EventKind::Chunk { .. }
        ));
        let text = br#"data: {"choices":[{"text":"lo","index":0}]}

"#;
        assert!(matches!(classify(text), EventKind::Chunk { tokens: 1, .. }));
    }

    #[test]
    fn classifies_responses_api_events() {
        let delta = b"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":4,\"delta\":\"Hi\"}\n\n";
        assert!(matches!(
            classify(delta),
            EventKind::Chunk {
                tokens: 1,
                finish_reason: None,
                ..
            }
        ));
        let done = b"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"status\":\"completed\",\"usage\":{\"output_tokens\":3}}}\n\n";
        assert!(
            matches!(classify(done), EventKind::Chunk { finish_reason: Some(r), usage: Some(_), .. } if r == "completed")
        );
        let incomplete = b"event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\"}}\n\n";
        assert!(
            matches!(classify(incomplete), EventKind::Chunk { finish_reason: Some(r), .. } if r == "incomplete")
        );
        let failed = b"event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"status\":\"failed\"}}\n\n";
        assert!(matches!(classify(failed), EventKind::Error(_)));
        // Unnamed, an `error` typed event is still an error.
        assert!(matches!(
            classify(b"data: {\"type\":\"error\",\"code\":\"server_error\"}\n\n"),
            EventKind::Error(_)
        ));
        let created = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"status\":\"in_progress\"}}\n\n";
        assert!(matches!(
            classify(created),
            EventKind::Chunk {
                tokens: 0,
                finish_reason: None,
                ..
            }
        ));
    }

    #[test]
    fn multi_line_data_is_joined() {
        assert_eq!(
            event_data(b"event: x\ndata: {\"a\":\ndata:1}\n\n").as_deref(),
            Some("{\"a\":\n1}")
        );
    }
}
