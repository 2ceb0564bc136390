//! Sending one request and measuring it from the client's side ([`measure`]): time to first
//! token, the gaps between content chunks, total time, and what the gateway's headers and timing
//! comment say. One request at a time; scheduling is the runner's. Both APIs the gateway serves
//! are measured here (`--api`): OpenAI's `data:` chunks and Anthropic's named events differ only
//! in which lines carry a token and which one ends the stream.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

use super::prompts::body;
use super::timing::Phases;
use super::workload::Planned;
use super::{outcome_of, skipped_reason, Api, BenchConfig, Sample};

/// Sends one request and measures it from the client's side.
pub async fn measure(
    client: &reqwest::Client,
    config: &BenchConfig,
    target: usize,
    index: usize,
    planned: &Planned,
) -> Sample {
    let body = body(config, &planned.item);
    let mut sample = Sample::new(target, index, planned.kind);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let base = config.url_of(target, index);
    let mut request = config.api.post(client, base, &config.api_key).json(&body);
    if let Some(namespace) = &config.namespace {
        request = request.header("x-reprise-namespace", namespace);
    }
    if let Some(value) = planned.item.cache_control {
        request = request.header("cache-control", value);
    }
    let started = Instant::now();
    let response = match request.send().await {
        Ok(r) => r,
        Err(err) => {
            sample.error = Some(err.to_string());
            sample.total_ms = ms(started.elapsed());
            return sample;
        }
    };
    sample.status = response.status().as_u16();
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok());
    sample.outcome = outcome_of(header("x-reprise-cache"));
    sample.ttft_saved_ms = header("x-reprise-ttft-saved-ms").and_then(|v| v.trim().parse().ok());
    sample.similarity = header("x-reprise-similarity").and_then(|v| v.trim().parse().ok());
    sample.semantic_skipped = skipped_reason(header("x-reprise-semantic"));
    sample.phases = header("server-timing").and_then(Phases::from_server_timing);
    let text = |name: &str| {
        header(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    sample.entry = text("x-reprise-entry");
    sample.verified = text("x-reprise-verified");
    sample.verify = text("x-reprise-verify");
    sample.judge_ms = header("x-reprise-judge-ms").and_then(|v| v.trim().parse().ok());
    if !response.status().is_success() {
        sample.error = Some(format!("HTTP {}", sample.status));
        sample.total_ms = ms(started.elapsed());
        return sample;
    }
    if config.stream {
        let mut bytes = response.bytes_stream();
        let mut buffer = Vec::new();
        let mut last_token: Option<Instant> = None;
        // Anthropic's `message_stop` (or an `error` event) ends the answer: the sample ends there,
        // not when the server closes the connection, which it need not do at once.
        let mut stopped = false;
        while !stopped {
            let Some(chunk) = bytes.next().await else {
                break;
            };
            let chunk = match chunk {
                Ok(c) => c,
                Err(err) => {
                    sample.error = Some(err.to_string());
                    break;
                }
            };
            // Everything in one read arrived together: its tokens share one instant.
            let now = Instant::now();
            buffer.extend_from_slice(&chunk);
            // Whole lines only: an event may be split across reads.
            while let Some(pos) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=pos).collect();
                let data = line.strip_prefix(b"data: ");
                let token = match (config.api, data) {
                    (Api::Openai, Some(data)) => has_content(data),
                    (Api::Anthropic, Some(data)) => match anthropic_event(data) {
                        AnthropicEvent::Token => true,
                        AnthropicEvent::Other => false,
                        AnthropicEvent::Stop => {
                            stopped = true;
                            false
                        }
                        AnthropicEvent::Error(message) => {
                            sample.error = Some(message);
                            stopped = true;
                            false
                        }
                    },
                    (_, None) => false,
                };
                if token {
                    sample.tokens += 1;
                    sample
                        .ttft_ms
                        .get_or_insert_with(|| ms(now.saturating_duration_since(started)));
                    if let Some(previous) = last_token {
                        sample
                            .gaps_ms
                            .push(ms(now.saturating_duration_since(previous)));
                    }
                    last_token = Some(now);
                } else if let Some(phases) = Phases::from_sse_line(&line) {
                    sample.phases = Some(phases);
                }
            }
        }
    } else {
        match response.bytes().await {
            Ok(body) => {
                sample.ttft_ms = Some(ms(started.elapsed()));
                if config.api == Api::Anthropic {
                    sample.tokens = anthropic_tokens(&body);
                }
            }
            Err(err) => sample.error = Some(err.to_string()),
        }
    }
    sample.total_ms = ms(started.elapsed());
    sample
}

fn has_content(data: &[u8]) -> bool {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return false;
    };
    value
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(|choices| {
            choices.iter().any(|c| {
                c.pointer("/delta/content")
                    .or_else(|| c.get("text"))
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty())
            })
        })
}

/// What one `data:` line of a Messages API stream means to the measurement.
#[derive(Debug, PartialEq)]
enum AnthropicEvent {
    /// A `content_block_delta` with content: one token arrived.
    Token,
    /// `message_stop`: the answer is complete.
    Stop,
    /// An `error` event mid-stream (e.g. `overloaded_error`): the request failed after its 200.
    Error(String),
    /// Anything else (`message_start`, `ping`, a block's start or stop, `message_delta`).
    Other,
}

/// Reads one Messages API event from its `data:` line. The event's `type` is in its data as well
/// as its `event:` line, so the data alone decides. A delta without content (the empty piece that
/// opens a tool's input, a thinking block's signature) is not a token, as an OpenAI chunk without
/// content is not.
fn anthropic_event(data: &[u8]) -> AnthropicEvent {
    let Ok(value) = serde_json::from_slice::<Value>(data) else {
        return AnthropicEvent::Other;
    };
    match value["type"].as_str() {
        Some("content_block_delta") => {
            let delta = &value["delta"];
            let content = ["text", "thinking", "partial_json"]
                .iter()
                .find_map(|field| delta[field].as_str());
            if content.is_some_and(|c| !c.is_empty()) {
                AnthropicEvent::Token
            } else {
                AnthropicEvent::Other
            }
        }
        Some("message_stop") => AnthropicEvent::Stop,
        Some("error") => AnthropicEvent::Error(
            value
                .pointer("/error/type")
                .and_then(Value::as_str)
                .unwrap_or("error event")
                .to_owned(),
        ),
        _ => AnthropicEvent::Other,
    }
}

/// The tokens of a non-streamed `message`: `usage.output_tokens` as the server counted them, or,
/// from a server that sends no usage, the words of `content[0].text`.
fn anthropic_tokens(body: &[u8]) -> usize {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return 0;
    };
    if let Some(n) = value
        .pointer("/usage/output_tokens")
        .and_then(Value::as_u64)
    {
        return n as usize;
    }
    value
        .pointer("/content/0/text")
        .and_then(Value::as_str)
        .map_or(0, |text| text.split_whitespace().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_events_count_content_deltas_and_stop_at_message_stop() {
        let event = |s: &str| anthropic_event(s.as_bytes());
        assert_eq!(
            event(
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#
            ),
            AnthropicEvent::Token
        );
        assert_eq!(
            event(
                r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":""}}"#
            ),
            AnthropicEvent::Other
        );
        assert_eq!(event(r#"{"type":"ping"}"#), AnthropicEvent::Other);
        assert_eq!(event(r#"{"type":"message_stop"}"#), AnthropicEvent::Stop);
        assert_eq!(
            event(r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#),
            AnthropicEvent::Error("overloaded_error".into())
        );
        assert_eq!(
            anthropic_tokens(br#"{"content":[{"type":"text","text":"a b c"}]}"#),
            3
        );
        assert_eq!(
            anthropic_tokens(br#"{"content":[],"usage":{"output_tokens":7}}"#),
            7
        );
    }

    #[test]
    fn content_detection_ignores_role_and_finish_chunks() {
        assert!(has_content(br#"{"choices":[{"delta":{"content":"x"}}]}"#));
        assert!(!has_content(
            br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(!has_content(b"[DONE]"));
        assert!(has_content(br#"{"choices":[{"text":"x"}]}"#));
    }
}
