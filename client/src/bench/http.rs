//! Sending one request and measuring it from the client's side ([`measure`]): time to first
//! token, the gaps between content chunks, total time, and what the gateway's headers and timing
//! comment say. One request at a time; scheduling is the runner's.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

use super::prompts::body;
use super::timing::Phases;
use super::workload::Planned;
use super::{outcome_of, skipped_reason, BenchConfig, Sample};

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
    let mut request = client
        .post(format!("{}/chat/completions", config.url_of(target, index)))
        .bearer_auth(&config.api_key)
        .json(&body);
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
        while let Some(chunk) = bytes.next().await {
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
                if line.starts_with(b"data: ") && has_content(&line[6..]) {
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
            Ok(_) => sample.ttft_ms = Some(ms(started.elapsed())),
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

#[cfg(test)]
mod tests {
    use super::*;

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
