//! The simulated judge over HTTP, as a gateway's `--verify judge` calls it (the protocol in the
//! README's "The judge call"): verdicts from labels, the answer's shape streamed or not, the
//! counters in `/stats`, the latency, and requests that only look like judge calls.

use std::time::{Duration, Instant};

use reprise_sim::{JudgeLabels, SimConfig, SimHandle};
use serde_json::{json, Value};

async fn sim_with(config: SimConfig) -> SimHandle {
    reprise_sim::spawn(SimConfig {
        ttft_ms: 0.0,
        itl_ms: 0.0,
        ..config
    })
    .await
    .expect("spawn sim")
}

fn labels() -> JudgeLabels {
    JudgeLabels::parse(concat!(
        r#"{"a": "How do I reset my password?", "b": "How can I reset my password?", "same_answer": true}"#,
        "\n",
        r#"{"a": "Is aspirin safe for children?", "b": "Is aspirin safe for adults?", "same_answer": false}"#,
        "\n",
    ))
    .expect("labels")
}

/// The body a gateway sends for one judged pair (judge-protocol v1).
fn judge_body(cached: &str, new: &str, stream: bool) -> Value {
    let block =
        json!({"reprise_judge": 1, "system": null, "context": null, "cached": cached, "new": new});
    json!({
        "model": "sim-judge",
        "temperature": 0,
        "max_tokens": 16,
        "stream": stream,
        "stream_options": {"include_usage": true},
        "response_format": {"type": "json_schema", "json_schema": {"name": "reprise_verdict", "strict": true,
            "schema": {"type": "object", "properties": {"verdict": {"type": "string", "enum": ["same", "different", "unsure"]}},
                       "required": ["verdict"], "additionalProperties": false}}},
        "messages": [
            {"role": "system", "content": "You check whether a cached answer can be reused."},
            {"role": "user", "content": format!("```json\n{block}\n```")}
        ]
    })
}

async fn post(sim: &SimHandle, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/chat/completions", sim.base_url()))
        .header("x-reprise-judge", "1")
        .bearer_auth("sk-judge")
        .json(body)
        .send()
        .await
        .expect("send")
}

async fn verdict_of(sim: &SimHandle, cached: &str, new: &str) -> String {
    let response = post(sim, &judge_body(cached, new, false)).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    let content = body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    let parsed: Value = serde_json::from_str(content).expect("verdict JSON");
    parsed["verdict"].as_str().expect("verdict").to_owned()
}

#[tokio::test]
async fn a_labeled_pair_is_answered_as_a_chat_completion_and_counted_apart() {
    let sim = sim_with(SimConfig {
        judge_labels: Some(labels()),
        ..SimConfig::default()
    })
    .await;
    let response = post(
        &sim,
        &judge_body(
            "How can I reset my password?",
            "How do I   reset my password?",
            false,
        ),
    )
    .await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "sim-judge");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        r#"{"verdict":"same"}"#
    );
    let usage = &body["usage"];
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().expect("prompt tokens"),
        usage["completion_tokens"]
            .as_u64()
            .expect("completion tokens"),
    );
    assert!(prompt > 20, "the instruction and the block count: {usage}");
    assert!((4..=6).contains(&completion), "{usage}");
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt + completion));

    assert_eq!(
        verdict_of(
            &sim,
            "Is aspirin safe for adults?",
            "Is aspirin safe for children?"
        )
        .await,
        "different"
    );
    assert_eq!(
        verdict_of(&sim, "never seen", "nor this").await,
        "different",
        "an unknown pair"
    );
    let stats = sim.stats.snapshot();
    assert_eq!(
        (
            stats.judge.calls,
            stats.judge.same,
            stats.judge.different,
            stats.judge.unsure
        ),
        (3, 1, 2, 0)
    );
    // Judge calls are not generation requests: a gateway's tests still see whether it went upstream.
    assert_eq!((stats.requests, stats.chat_completions), (0, 0));
    assert!(stats.last_headers.is_empty());
    let header = |name: &str| {
        stats
            .judge
            .last_headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(header("x-reprise-judge").as_deref(), Some("1"));
    assert_eq!(header("authorization").as_deref(), Some("Bearer sk-judge"));
}

#[tokio::test]
async fn without_labels_every_judge_call_is_different() {
    let sim = sim_with(SimConfig::default()).await;
    assert_eq!(
        verdict_of(
            &sim,
            "How do I reset my password?",
            "How can I reset my password?"
        )
        .await,
        "different"
    );
    assert_eq!(sim.stats.snapshot().judge.different, 1);
}

#[tokio::test]
async fn a_streamed_judge_call_streams_the_same_verdict() {
    let sim = sim_with(SimConfig {
        judge_labels: Some(labels()),
        ..SimConfig::default()
    })
    .await;
    let response = post(
        &sim,
        &judge_body(
            "How do I reset my password?",
            "How can I reset my password?",
            true,
        ),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .starts_with("text/event-stream"));
    let text = response.text().await.expect("body");
    let events: Vec<&str> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{text}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk JSON"))
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, r#"{"verdict":"same"}"#);
    assert!(chunks
        .iter()
        .any(|c| c["choices"][0]["finish_reason"] == "stop"));
    let usage = &chunks.last().expect("usage chunk")["usage"];
    assert!(usage["completion_tokens"].as_u64().is_some(), "{text}");
    assert_eq!(sim.stats.snapshot().judge.same, 1);
}

#[tokio::test]
async fn the_judge_waits_its_latency() {
    let sim = sim_with(SimConfig {
        judge_latency_ms: 150.0,
        ..SimConfig::default()
    })
    .await;
    let started = Instant::now();
    verdict_of(&sim, "a", "b").await;
    // Only the lower bound: a sleep never ends early, a busy machine may make it later.
    assert!(started.elapsed() >= Duration::from_millis(145));
}

#[tokio::test]
async fn a_malformed_block_is_an_ordinary_chat_request() {
    let sim = sim_with(SimConfig::default()).await;
    let mut body = judge_body("a", "b", false);
    body["messages"][1]["content"] =
        json!("```json\n{\"reprise_judge\": 1, \"cached\": \"a\", \"new\": \n```");
    let response = post(&sim, &body).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.expect("json");
    let content = answer["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(!content.contains("verdict"), "{content}");
    let stats = sim.stats.snapshot();
    assert_eq!((stats.chat_completions, stats.judge.calls), (1, 0));
}

#[tokio::test]
async fn early_faults_reach_the_judge_too() {
    let sim = sim_with(SimConfig {
        fault: Some(reprise_sim::Fault::parse("status=503").expect("fault")),
        ..SimConfig::default()
    })
    .await;
    let response = post(&sim, &judge_body("a", "b", false)).await;
    assert_eq!(response.status(), 503);
}
