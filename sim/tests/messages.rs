//! The simulated Anthropic Messages API over HTTP, as a gateway's Messages tests will call it: the
//! message and its event stream, tool use and thinking, prompt caching in `usage`, Anthropic's
//! validation and error shape, and the faults. It checks the sim, not a real model.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use reprise_sim::{SimConfig, SimHandle};
use serde_json::{json, Value};

async fn sim() -> SimHandle {
    reprise_sim::spawn(SimConfig {
        ttft_ms: 0.0,
        itl_ms: 0.0,
        tokens: 8,
        ..SimConfig::default()
    })
    .await
    .expect("spawn sim")
}

fn body(question: &str) -> Value {
    json!({
        "model": "claude-sim",
        "max_tokens": 256,
        "messages": [{"role": "user", "content": question}],
    })
}

fn weather_tools() -> Value {
    json!([{
        "name": "get_weather",
        "description": "Current weather in a city",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
    }])
}

/// A request with Anthropic's headers (`x-api-key`, `anthropic-version`), a fault when given.
async fn post_as(
    sim: &SimHandle,
    key: &str,
    body: &Value,
    fault: Option<&str>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .post(format!("{}/messages", sim.base_url()))
        .header("x-api-key", key)
        .header("anthropic-version", "2023-06-01")
        .json(body);
    if let Some(fault) = fault {
        request = request.header("x-sim-fault", fault);
    }
    request.send().await.expect("send")
}

async fn post(sim: &SimHandle, body: &Value, fault: Option<&str>) -> reqwest::Response {
    post_as(sim, "sk-ant-test", body, fault).await
}

async fn message(sim: &SimHandle, body: &Value) -> Value {
    let response = post(sim, body, None).await;
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

/// The stream's events as (name, data), each checked to be named by its data's `type`.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut lines = block.lines();
            let name = lines
                .next()
                .and_then(|l| l.strip_prefix("event: "))
                .unwrap_or_else(|| panic!("an unnamed event: {block:?}"));
            let data = lines
                .next()
                .and_then(|l| l.strip_prefix("data: "))
                .unwrap_or_else(|| panic!("an event without data: {block:?}"));
            assert_eq!(lines.next(), None, "one data line per event: {block:?}");
            let data: Value = serde_json::from_str(data).expect("event JSON");
            assert_eq!(data["type"], name, "{block}");
            (name.to_owned(), data)
        })
        .collect()
}

async fn stream(sim: &SimHandle, body: &Value, fault: Option<&str>) -> Vec<(String, Value)> {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let response = post(sim, &body, fault).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .starts_with("text/event-stream"));
    events(&response.text().await.expect("body"))
}

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

/// The concatenated deltas of one kind (`text`, `thinking`, `partial_json`) in block `index`.
fn joined(events: &[(String, Value)], index: u64, field: &str) -> String {
    events
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && d["index"] == index)
        .filter_map(|(_, d)| d["delta"][field].as_str())
        .collect()
}

#[tokio::test]
async fn a_message_has_anthropics_shape_and_deterministic_text() {
    let sim = sim().await;
    let response = post(&sim, &body("What is a cache?"), None).await;
    assert_eq!(response.status(), 200);
    let request_id = response.headers()["request-id"].to_str().expect("ascii");
    assert!(request_id.starts_with("req_"), "{request_id}");
    let answer: Value = response.json().await.expect("json");
    assert!(answer["id"].as_str().expect("id").starts_with("msg_"));
    assert_eq!(answer["type"], "message");
    assert_eq!(answer["role"], "assistant");
    assert_eq!(answer["model"], "claude-sim");
    assert_eq!(answer["stop_reason"], "end_turn");
    assert!(answer["stop_sequence"].is_null());
    let content = answer["content"].as_array().expect("content");
    assert_eq!(content.len(), 1, "{answer}");
    assert_eq!(content[0]["type"], "text");
    let text = content[0]["text"].as_str().expect("text");
    assert_eq!(text.split(' ').count(), 8, "{text}");
    let usage = &answer["usage"];
    assert!(
        usage["input_tokens"].as_u64().expect("input") > 0,
        "{usage}"
    );
    assert_eq!(usage["output_tokens"], 8);
    assert_eq!(usage["cache_creation_input_tokens"], 0);
    assert_eq!(usage["cache_read_input_tokens"], 0);

    let again = message(&sim, &body("What is a cache?")).await;
    assert_eq!(again["content"], answer["content"]);
    assert_ne!(again["id"], answer["id"]);
    let other = message(&sim, &body("What is a queue?")).await;
    assert_ne!(other["content"], answer["content"]);
    let stats = sim.stats.snapshot();
    assert_eq!(
        (stats.messages, stats.requests, stats.chat_completions),
        (3, 3, 0)
    );
    let key = stats.last_headers.iter().find(|(n, _)| n == "x-api-key");
    assert_eq!(key.map(|(_, v)| v.as_str()), Some("sk-ant-test"));
}

#[tokio::test]
async fn a_stream_sends_anthropics_events_in_order() {
    let sim = sim().await;
    let question = body("What is a cache?");
    let whole = message(&sim, &question).await;
    let events = stream(&sim, &question, None).await;
    let mut expected = vec!["message_start", "content_block_start", "ping"];
    expected.extend(["content_block_delta"; 8]);
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names(&events), expected);

    let start = &events[0].1["message"];
    assert!(start["id"].as_str().expect("id").starts_with("msg_"));
    assert_eq!(start["type"], "message");
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["content"], json!([]));
    assert!(start["stop_reason"].is_null() && start["stop_sequence"].is_null());
    assert_eq!(
        start["usage"]["input_tokens"],
        whole["usage"]["input_tokens"]
    );
    assert_eq!(start["usage"]["cache_read_input_tokens"], 0);
    assert_eq!(
        events[1].1,
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    );
    assert!(events[3..11]
        .iter()
        .all(|(_, d)| d["index"] == 0 && d["delta"]["type"] == "text_delta"));
    assert_eq!(joined(&events, 0, "text"), whole["content"][0]["text"]);
    assert_eq!(
        events[11].1,
        json!({"type": "content_block_stop", "index": 0})
    );
    assert_eq!(
        events[12].1,
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 8}})
    );
    assert_eq!(events[13].1, json!({"type": "message_stop"}));
}

#[tokio::test]
async fn max_tokens_below_the_answer_stops_there() {
    let sim = sim().await;
    let mut short = body("Tell me everything.");
    short["max_tokens"] = json!(3);
    let answer = message(&sim, &short).await;
    assert_eq!(answer["stop_reason"], "max_tokens");
    assert_eq!(answer["usage"]["output_tokens"], 3);
    let text = answer["content"][0]["text"].as_str().expect("text");
    assert_eq!(text.split(' ').count(), 3, "{text}");
    let events = stream(&sim, &short, None).await;
    assert_eq!(joined(&events, 0, "text"), text);
    let delta = events
        .iter()
        .find(|(n, _)| n == "message_delta")
        .expect("delta");
    assert_eq!(delta.1["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta.1["usage"]["output_tokens"], 3);
}

#[tokio::test]
async fn tool_use_streams_pieces_that_make_the_same_input() {
    let sim = sim().await;
    let mut asked = body("What's the weather in Lisbon?");
    asked["tools"] = weather_tools();
    let answer = message(&sim, &asked).await;
    assert_eq!(answer["stop_reason"], "tool_use");
    let content = answer["content"].as_array().expect("content");
    assert_eq!(
        content.len(),
        2,
        "a short preamble, then the call: {answer}"
    );
    assert_eq!(content[0]["type"], "text");
    let call = &content[1];
    assert_eq!(call["type"], "tool_use");
    assert!(call["id"].as_str().expect("id").starts_with("toolu_"));
    assert_eq!(call["name"], "get_weather");
    assert!(call["input"]["query"].is_string(), "{call}");

    let events = stream(&sim, &asked, None).await;
    let start = events
        .iter()
        .find(|(n, d)| n == "content_block_start" && d["index"] == 1)
        .expect("tool block");
    let block = &start.1["content_block"];
    assert!(block["id"].as_str().expect("id").starts_with("toolu_"));
    assert_eq!(
        (&block["type"], &block["name"], &block["input"]),
        (&json!("tool_use"), &json!("get_weather"), &json!({}))
    );
    let pieces: Vec<&Value> = events
        .iter()
        .filter(|(_, d)| d["delta"]["type"] == "input_json_delta")
        .map(|(_, d)| d)
        .collect();
    assert!(pieces.len() > 2, "the input comes in pieces");
    assert!(pieces.iter().all(|d| d["index"] == 1));
    let input: Value =
        serde_json::from_str(&joined(&events, 1, "partial_json")).expect("input JSON");
    assert_eq!(input, call["input"]);
    let delta = events
        .iter()
        .find(|(n, _)| n == "message_delta")
        .expect("delta");
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");

    // `any` forces the call without a preamble; `none` and a question without the word do not call.
    let mut forced = body("Hello");
    forced["tools"] = weather_tools();
    forced["tool_choice"] = json!({"type": "any"});
    let answer = message(&sim, &forced).await;
    assert_eq!(names_of(&answer), ["tool_use"]);
    forced["tool_choice"] = json!({"type": "tool", "name": "get_weather"});
    assert_eq!(names_of(&message(&sim, &forced).await), ["tool_use"]);
    asked["tool_choice"] = json!({"type": "none"});
    let answer = message(&sim, &asked).await;
    assert_eq!(
        (names_of(&answer), answer["stop_reason"].clone()),
        (vec!["text"], json!("end_turn"))
    );
    let mut plain = body("Hello");
    plain["tools"] = weather_tools();
    assert_eq!(names_of(&message(&sim, &plain).await), ["text"]);
}

fn names_of(answer: &Value) -> Vec<&str> {
    answer["content"]
        .as_array()
        .expect("content")
        .iter()
        .map(|b| b["type"].as_str().expect("type"))
        .collect()
}

#[tokio::test]
async fn thinking_comes_first_with_its_signature() {
    let sim = sim().await;
    let mut thinking = body("Why is the sky blue?");
    thinking["max_tokens"] = json!(2048);
    thinking["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let answer = message(&sim, &thinking).await;
    assert_eq!(names_of(&answer), ["thinking", "text"]);
    let block = &answer["content"][0];
    let thought = block["thinking"].as_str().expect("thinking");
    let signature = block["signature"].as_str().expect("signature");
    assert!(!thought.is_empty() && !signature.is_empty(), "{block}");
    assert_eq!(answer["stop_reason"], "end_turn");

    let events = stream(&sim, &thinking, None).await;
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "thinking", "thinking": "", "signature": ""})
    );
    assert_eq!(joined(&events, 0, "thinking"), thought);
    // The signature arrives last in its block, just before the block's stop.
    let stop = events
        .iter()
        .position(|(n, d)| n == "content_block_stop" && d["index"] == 0)
        .expect("stop");
    assert_eq!(
        events[stop - 1].1["delta"],
        json!({"type": "signature_delta", "signature": signature})
    );
    assert_eq!(joined(&events, 1, "text"), answer["content"][1]["text"]);
    let ping = names(&events).iter().filter(|n| **n == "ping").count();
    assert_eq!(ping, 1);
}

fn usage_of(answer: &Value) -> (u64, u64, u64) {
    let usage = &answer["usage"];
    let n = |f: &str| {
        usage[f]
            .as_u64()
            .unwrap_or_else(|| panic!("{f} in {usage}"))
    };
    (
        n("input_tokens"),
        n("cache_creation_input_tokens"),
        n("cache_read_input_tokens"),
    )
}

fn marked_system(question: &str) -> Value {
    let mut request = body(question);
    request["system"] = json!([{
        "type": "text",
        "text": "You answer questions about caches, tersely, citing the manual by section.",
        "cache_control": {"type": "ephemeral"},
    }]);
    request
}

#[tokio::test]
async fn a_marked_prefix_is_written_then_read() {
    let sim = sim().await;
    let (input, created, read) = usage_of(&message(&sim, &marked_system("What is a hit?")).await);
    assert!(created > 0 && input > 0, "{input} {created} {read}");
    assert_eq!(read, 0);
    let total = input + created;

    // The same prefix again reads what the first wrote; so does another question behind it.
    let again = usage_of(&message(&sim, &marked_system("What is a hit?")).await);
    assert_eq!(again, (input, 0, created));
    let other = marked_system("And what is a miss, then, in a semantic cache?");
    let (other_input, other_created, other_read) = usage_of(&message(&sim, &other).await);
    assert_eq!((other_created, other_read), (0, created));
    assert!(
        other_input > input,
        "only the uncached rest counts as input"
    );

    // Another API key, or the system prompt changed, starts over.
    let answer: Value = post_as(&sim, "sk-ant-other", &marked_system("What is a hit?"), None)
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(usage_of(&answer), (input, created, 0));
    let mut changed = marked_system("What is a hit?");
    changed["system"][0]["text"] = json!("You answer questions about queues.");
    assert_eq!(usage_of(&message(&sim, &changed).await).2, 0);

    // A longer marked prefix reads the shorter one and writes only the rest.
    let mut longer = marked_system("What is a hit?");
    longer["messages"] = json!([{"role": "user", "content": [
        {"type": "text", "text": "Here is the manual: a hit is an answer served from the cache.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "What is a hit?"},
    ]}]);
    let (_, longer_created, longer_read) = usage_of(&message(&sim, &longer).await);
    assert_eq!(longer_read, created);
    assert!(longer_created > 0);

    // Streamed, the usage is in `message_start`; count_tokens counts all three parts together.
    let events = stream(&sim, &marked_system("What is a hit?"), None).await;
    assert_eq!(usage_of(&events[0].1["message"]), (input, 0, created));
    let mut count = marked_system("What is a hit?");
    count.as_object_mut().expect("object").remove("max_tokens");
    let counted = count_tokens(&sim, &count).await;
    assert_eq!(counted["input_tokens"].as_u64(), Some(total));

    let stats = sim.stats.snapshot();
    // Creations: first, other key, changed, longer. Reads: again, other, longer, streamed.
    assert_eq!((stats.cache_creations, stats.cache_reads), (4, 4));
}

#[tokio::test]
async fn unmarked_prompts_are_not_cached() {
    let sim = sim().await;
    for _ in 0..2 {
        let (input, created, read) = usage_of(&message(&sim, &body("What is a hit?")).await);
        assert!(input > 0);
        assert_eq!((created, read), (0, 0));
    }
}

async fn count_tokens(sim: &SimHandle, body: &Value) -> Value {
    let response = reqwest::Client::new()
        .post(format!("{}/messages/count_tokens", sim.base_url()))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    response.json().await.expect("json")
}

#[tokio::test]
async fn count_tokens_counts_what_usage_counts() {
    let sim = sim().await;
    let mut request = body("How many tokens is this?");
    request["tools"] = weather_tools();
    let input = usage_of(&message(&sim, &request).await).0;
    request
        .as_object_mut()
        .expect("object")
        .remove("max_tokens");
    let counted = count_tokens(&sim, &request).await;
    assert_eq!(counted, json!({"input_tokens": input}));
    let stats = sim.stats.snapshot();
    assert_eq!(
        (stats.count_tokens, stats.messages, stats.requests),
        (1, 1, 1)
    );
    // count_tokens takes no max_tokens, as Anthropic's does not.
    request["max_tokens"] = json!(10);
    let response = reqwest::Client::new()
        .post(format!("{}/messages/count_tokens", sim.base_url()))
        .header("x-api-key", "sk-ant-test")
        .header("anthropic-version", "2023-06-01")
        .json(&request)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 400);
}

fn remove(body: &mut Value, field: &str) {
    if let Some(fields) = body.as_object_mut() {
        fields.remove(field);
    }
}

/// Asserts Anthropic's error shape and returns the error's message.
async fn rejected(response: reqwest::Response, status: u16, kind: &str) -> String {
    assert_eq!(response.status(), status);
    assert!(response.headers().contains_key("request-id"));
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert_eq!(
        body["error"].as_object().map(|o| o.len()),
        Some(2),
        "{body}"
    );
    body["error"]["message"]
        .as_str()
        .expect("message")
        .to_owned()
}

/// A change that makes a valid body invalid.
type Edit = fn(&mut Value);

#[tokio::test]
async fn invalid_requests_are_refused_in_anthropics_shape() {
    let sim = sim().await;
    let edits: Vec<(&str, Edit)> = vec![
        ("model", |b| remove(b, "model")),
        ("max_tokens", |b| remove(b, "max_tokens")),
        ("max_tokens", |b| b["max_tokens"] = json!(0)),
        ("max_tokens", |b| b["max_tokens"] = json!("100")),
        ("messages", |b| b["messages"] = json!([])),
        ("messages", |b| b["messages"] = json!("hi")),
        ("messages.0.role", |b| {
            b["messages"][0]["role"] = json!("system")
        }),
        ("messages.0.content", |b| {
            remove(&mut b["messages"][0], "content")
        }),
        ("messages.0.content.0.type", |b| {
            b["messages"][0]["content"] = json!([{"text": "hi"}])
        }),
        ("messages.0", |b| b["messages"][0]["content"] = json!("")),
        ("system", |b| b["system"] = json!(42)),
        ("system.0.type", |b| {
            b["system"] = json!([{"type": "image", "text": "x"}])
        }),
        ("stream_options", |b| {
            b["stream_options"] = json!({"include_usage": true})
        }),
        ("budget_tokens", |b| {
            b["thinking"] = json!({"type": "enabled", "budget_tokens": 512})
        }),
        ("max_tokens", |b| {
            b["thinking"] = json!({"type": "enabled", "budget_tokens": 1024})
        }),
        ("tool_choice", |b| b["tool_choice"] = json!({"type": "any"})),
        ("tools.0.input_schema", |b| {
            b["tools"] = json!([{"name": "f"}])
        }),
        (
            "cache_control",
            |b| {
                b["system"] =
                    json!([{"type": "text", "text": "s", "cache_control": {"type": "forever"}}])
            },
        ),
        ("maximum of 4", |b| {
            let marked =
                json!({"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}});
            b["system"] = json!([marked, marked, marked, marked, marked]);
        }),
    ];
    for (field, edit) in edits {
        let mut request = body("hi");
        edit(&mut request);
        let message = rejected(
            post(&sim, &request, None).await,
            400,
            "invalid_request_error",
        )
        .await;
        assert!(message.contains(field), "{field}: {message}");
    }
    // Not JSON at all.
    let response = reqwest::Client::new()
        .post(format!("{}/messages", sim.base_url()))
        .header("x-api-key", "k")
        .header("anthropic-version", "2023-06-01")
        .body("{not json")
        .send()
        .await
        .expect("send");
    rejected(response, 400, "invalid_request_error").await;
}

#[tokio::test]
async fn the_version_header_and_a_key_are_required() {
    let sim = sim().await;
    let client = reqwest::Client::new();
    let url = format!("{}/messages", sim.base_url());
    let no_version = client
        .post(&url)
        .header("x-api-key", "k")
        .json(&body("hi"))
        .send()
        .await
        .expect("send");
    let message = rejected(no_version, 400, "invalid_request_error").await;
    assert!(message.contains("anthropic-version"), "{message}");
    let no_key = client
        .post(&url)
        .header("anthropic-version", "2023-06-01")
        .json(&body("hi"))
        .send()
        .await
        .expect("send");
    rejected(no_key, 401, "authentication_error").await;
    let bearer = client
        .post(&url)
        .header("anthropic-version", "2023-06-01")
        .bearer_auth("sk-ant-bearer")
        .json(&body("hi"))
        .send()
        .await
        .expect("send");
    assert_eq!(bearer.status(), 200);
    assert_eq!(
        sim.stats.snapshot().last_authorization.as_deref(),
        Some("Bearer sk-ant-bearer")
    );
}

#[tokio::test]
async fn load_faults_answer_anthropics_errors() {
    let sim = sim().await;
    let overloaded = post(&sim, &body("hi"), Some("overloaded")).await;
    rejected(overloaded, 529, "overloaded_error").await;
    let limited = post(&sim, &body("hi"), Some("rate-limit")).await;
    assert_eq!(limited.headers()["retry-after"], "1");
    rejected(limited, 429, "rate_limit_error").await;
    let failed = post(&sim, &body("hi"), Some("status=500")).await;
    rejected(failed, 500, "api_error").await;
    // A failed request writes no cache entry.
    let refused = post(&sim, &marked_system("q"), Some("overloaded")).await;
    assert_eq!(refused.status(), 529);
    assert_eq!(usage_of(&message(&sim, &marked_system("q")).await).2, 0);
}

#[tokio::test]
async fn stream_faults_take_anthropics_forms() {
    let sim = sim().await;
    let question = body("What is a cache?");

    let events = stream(&sim, &question, Some("error-event=2")).await;
    let last = events.last().expect("events");
    assert_eq!(
        last.1,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );
    assert_eq!(
        names(&events)
            .iter()
            .filter(|n| **n == "content_block_delta")
            .count(),
        2
    );
    assert!(!names(&events).contains(&"message_stop"));

    let events = stream(&sim, &question, Some("cut=3")).await;
    assert_eq!(names(&events).last(), Some(&"content_block_delta"));
    assert_eq!(joined(&events, 0, "text").split(' ').count(), 3);

    let mut streamed = question.clone();
    streamed["stream"] = json!(true);
    // The break may come before the head has left or after: either way no whole answer arrives.
    for (request, fault) in [(&streamed, "abort=2"), (&question, "abort")] {
        let sent = reqwest::Client::new()
            .post(format!("{}/messages", sim.base_url()))
            .header("x-api-key", "k")
            .header("anthropic-version", "2023-06-01")
            .header("x-sim-fault", fault)
            .json(request)
            .send()
            .await;
        let body = match sent {
            Ok(response) => response.text().await.ok(),
            Err(_) => None,
        };
        let whole = body.is_some_and(|b| {
            b.contains("message_stop") || serde_json::from_str::<Value>(&b).is_ok()
        });
        assert!(!whole, "{fault}: the connection breaks");
    }

    let text = post(&sim, &streamed, Some("malformed=1"))
        .await
        .text()
        .await
        .expect("body");
    let bad = text
        .split("\n\n")
        .filter_map(|b| b.lines().nth(1)?.strip_prefix("data: "))
        .filter(|d| serde_json::from_str::<Value>(d).is_err())
        .count();
    assert_eq!(bad, 1, "{text}");
    assert!(
        text.contains("event: message_stop"),
        "the stream carries on"
    );

    let answer = message(&sim, &question).await;
    let refusal: Value = post(&sim, &question, Some("refusal"))
        .await
        .json()
        .await
        .expect("json");
    assert_eq!(refusal["stop_reason"], "refusal");
    assert_eq!(answer["stop_reason"], "end_turn");

    let mut tools = body("weather?");
    tools["tools"] = weather_tools();
    let events = stream(&sim, &tools, Some("bad-tool-args")).await;
    assert!(serde_json::from_str::<Value>(&joined(&events, 1, "partial_json")).is_err());
    assert_eq!(names(&events).last(), Some(&"message_stop"));
}

#[tokio::test]
async fn stall_at_done_holds_the_connection_after_message_stop() {
    let sim = sim().await;
    let mut streamed = body("hi");
    streamed["stream"] = json!(true);
    let response = post(&sim, &streamed, Some("stall-at-done")).await;
    let mut chunks = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("event: message_stop") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), chunks.next())
            .await
            .expect("the answer arrives")
            .expect("not the end")
            .expect("bytes");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let after = tokio::time::timeout(Duration::from_millis(300), chunks.next()).await;
    assert!(after.is_err(), "the connection stays open: {after:?}");
}

#[tokio::test]
async fn the_first_token_waits_its_ttft() {
    let sim = sim().await;
    let started = Instant::now();
    let response = reqwest::Client::new()
        .post(format!("{}/messages", sim.base_url()))
        .header("x-api-key", "k")
        .header("anthropic-version", "2023-06-01")
        .header("x-sim-ttft-ms", "150")
        .json(&body("hi"))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    // Only the lower bound: a sleep never ends early, a busy machine may make it later.
    assert!(started.elapsed() >= Duration::from_millis(145));
}
