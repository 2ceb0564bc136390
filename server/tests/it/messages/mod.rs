//! Anthropic's Messages API through the gateway, against the sim's `/v1/messages`: a repeat is a
//! hit in either shape (the named events rebuilt from a body, the body from the events) with a
//! fresh `msg_` id and the stored usage, a tool
//! call replays with its input, nothing failed, cut, refused or length-stopped is stored,
//! `cache_control` markers reach Anthropic, API keys (`x-api-key`) keep their answers apart, and
//! `/v1/messages/count_tokens` passes through to the Anthropic upstream. What applies to every
//! route (stats, metrics, traces, shadow mode, feedback, thresholds, Redis, warming, headers) is
//! checked on this one in `features.rs`; `reprise-client eval`/`calibrate --api anthropic` in
//! `clients.rs`.

mod clients;
mod features;

use serde_json::{json, Value};

use crate::common::*;
use crate::semantic::{models, semantic_config};

pub(super) fn upstream_messages(sim: &reprise_sim::SimHandle) -> u64 {
    sim.stats.snapshot().messages
}

/// A gateway whose OpenAI and Anthropic upstreams are both the sim.
pub(super) async fn gateway(sim: &reprise_sim::SimHandle) -> Gateway {
    let mut config = config_for(sim.base_url());
    config.anthropic_upstream_url = sim.base_url();
    config.validate().expect("valid");
    start(config).await
}

pub(super) fn ask(question: &str, stream: bool) -> Value {
    json!({"model": "claude-sim", "max_tokens": 256, "stream": stream,
        "messages": [{"role": "user", "content": question}]})
}

pub(super) async fn create(
    gw: &Gateway,
    key: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let auth = [("x-api-key", key), ("anthropic-version", "2023-06-01")];
    post_to(gw, "/v1/messages", body, &[&auth, headers].concat()).await
}

/// What a Messages API stream says, read from its events.
pub(super) trait MessagesStream {
    fn names_but_pings(&self) -> Vec<&str>;
    fn text(&self) -> String;
    fn message(&self) -> Value;
}

impl MessagesStream for Typed {
    /// The event names, `ping`s left out (Anthropic sends them as keep-alives, a replay need not).
    fn names_but_pings(&self) -> Vec<&str> {
        self.names().into_iter().filter(|n| *n != "ping").collect()
    }

    fn text(&self) -> String {
        self.events
            .iter()
            .filter_map(|(_, v)| v["delta"]["text"].as_str())
            .collect()
    }

    /// The message a non-streamed request gets, rebuilt by hand from the events.
    fn message(&self) -> Value {
        let (first, start) = &self.events[0];
        assert_eq!(first, "message_start");
        let mut message = start["message"].clone();
        let mut blocks: Vec<Value> = Vec::new();
        let mut inputs: Vec<String> = Vec::new();
        for (name, v) in &self.events {
            match name.as_str() {
                "content_block_start" => {
                    blocks.push(v["content_block"].clone());
                    inputs.push(String::new());
                }
                "content_block_delta" => {
                    let i = v["index"].as_u64().expect("index") as usize;
                    let delta = &v["delta"];
                    match delta["type"].as_str() {
                        Some("text_delta") => {
                            let text = blocks[i]["text"].as_str().unwrap_or("").to_owned();
                            blocks[i]["text"] = json!(text + delta["text"].as_str().unwrap_or(""));
                        }
                        Some("input_json_delta") => {
                            inputs[i].push_str(delta["partial_json"].as_str().unwrap_or(""))
                        }
                        other => panic!("unexpected delta {other:?}"),
                    }
                }
                "content_block_stop" => {
                    let i = v["index"].as_u64().expect("index") as usize;
                    if !inputs[i].is_empty() {
                        blocks[i]["input"] = serde_json::from_str(&inputs[i]).expect("input");
                    }
                }
                "message_delta" => {
                    message["stop_reason"] = v["delta"]["stop_reason"].clone();
                    message["usage"]["output_tokens"] = v["usage"]["output_tokens"].clone();
                }
                _ => {}
            }
        }
        message["content"] = json!(blocks);
        message
    }
}

/// What every Messages stream through the gateway must be: named events from `message_start` to
/// `message_stop`, the timing comment after the last one, and no `[DONE]`.
pub(super) fn check_stream(typed: &Typed, text: &str) {
    let names = typed.names_but_pings();
    assert_eq!(names.first(), Some(&"message_start"), "{text}");
    assert_eq!(
        names[names.len() - 2..],
        ["message_delta", "message_stop"],
        "{text}"
    );
    assert!(!text.contains("[DONE]"), "{text}");
    assert!(typed.tail.starts_with(": reprise-timing {"), "{text}");
}

pub(super) fn text_of(message: &Value) -> String {
    message["content"]
        .as_array()
        .expect("content")
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect()
}

#[tokio::test]
async fn a_repeat_is_a_hit_in_either_shape() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;

    // A non-streamed miss, then its non-streamed and streamed repeats.
    let miss = create(&gw, "sk-a", &ask("What is a cache?", false), &[]).await;
    assert_eq!(miss.status(), 200);
    assert_eq!(outcome(&miss), "miss");
    let original: Value = miss.json().await.expect("json");
    assert_eq!(original["type"], "message");
    assert_eq!(original["stop_reason"], "end_turn");
    wait_for_entries(&gw, 1).await;

    let hit = create(&gw, "sk-a", &ask("What is a cache?", false), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let replayed: Value = hit.json().await.expect("json");
    assert_eq!(replayed["content"], original["content"]);
    assert_eq!(replayed["usage"], original["usage"], "the stored usage");
    assert_eq!(replayed["stop_reason"], "end_turn");
    let fresh = |id: &Value| id.as_str().is_some_and(|id| id.starts_with("msg_"));
    assert!(fresh(&replayed["id"]), "{replayed}");
    assert_ne!(replayed["id"], original["id"], "a fresh id per hit");
    let again: Value = create(&gw, "sk-a", &ask("What is a cache?", false), &[])
        .await
        .json()
        .await
        .expect("json");
    assert_ne!(again["id"], replayed["id"], "a fresh id per hit");

    let streamed = create(&gw, "sk-a", &ask("What is a cache?", true), &[]).await;
    assert_eq!(outcome(&streamed), "hit");
    assert!(header(&streamed, "content-type").is_some_and(|c| c.starts_with("text/event-stream")));
    let text = streamed.text().await.expect("body");
    let typed = parse_typed(&text);
    check_stream(&typed, &text);
    assert_eq!(typed.text(), text_of(&original));
    assert_eq!(typed.message()["content"], original["content"]);
    assert_eq!(upstream_messages(&sim), 1);

    // A streamed miss, then its streamed and non-streamed repeats.
    let miss = create(&gw, "sk-a", &ask("What is a vector?", true), &[]).await;
    assert_eq!(outcome(&miss), "miss");
    let miss_text = miss.text().await.expect("body");
    let upstream = parse_typed(&miss_text);
    check_stream(&upstream, &miss_text);
    wait_for_entries(&gw, 2).await;

    let hit = create(&gw, "sk-a", &ask("What is a vector?", true), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    assert_eq!(header(&hit, "x-reprise-cache").as_deref(), Some("hit"));
    let text = hit.text().await.expect("body");
    let replayed = parse_typed(&text);
    check_stream(&replayed, &text);
    assert_eq!(
        replayed.names_but_pings(),
        upstream.names_but_pings(),
        "the same typed events, in order"
    );
    assert_eq!(replayed.message()["content"], upstream.message()["content"]);
    let start_id = |typed: &Typed| typed.events[0].1["message"]["id"].clone();
    assert!(fresh(&start_id(&replayed)));
    assert_ne!(
        start_id(&replayed),
        start_id(&upstream),
        "a fresh id per hit"
    );

    let hit = create(&gw, "sk-a", &ask("What is a vector?", false), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let body: Value = hit.json().await.expect("json");
    assert_eq!(body["content"], upstream.message()["content"]);
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(upstream_messages(&sim), 2);
    assert_ne!(body["id"], start_id(&upstream));
    assert!(fresh(&body["id"]));
}

#[tokio::test]
async fn a_tool_call_replays_with_the_same_input() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let mut body = ask("What is the weather in Paris?", true);
    body["tools"] = json!([{"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}]);

    let miss = create(&gw, "sk-a", &body, &[]).await;
    assert_eq!(outcome(&miss), "miss");
    let text = miss.text().await.expect("body");
    let called = parse_typed(&text).message();
    assert_eq!(called["stop_reason"], "tool_use", "{text}");
    let call = called["content"]
        .as_array()
        .expect("content")
        .iter()
        .find(|b| b["type"] == "tool_use")
        .cloned()
        .expect("a tool_use block");
    assert!(call["input"].is_object());
    wait_for_entries(&gw, 1).await;

    body["stream"] = json!(false);
    let hit = create(&gw, "sk-a", &body, &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let replayed: Value = hit.json().await.expect("json");
    assert_eq!(replayed["stop_reason"], "tool_use");
    assert_eq!(
        replayed["content"], called["content"],
        "the same call and input"
    );
    body["stream"] = json!(true);
    let hit = create(&gw, "sk-a", &body, &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let text = hit.text().await.expect("body");
    assert_eq!(parse_typed(&text).message()["content"], called["content"]);
    assert_eq!(upstream_messages(&sim), 1);
}

#[tokio::test]
async fn what_failed_was_cut_refused_or_stopped_at_max_tokens_is_never_stored() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let mut short = ask("Tell me a long story.", true);
    short["max_tokens"] = json!(2);
    let mut short_body = short.clone();
    short_body["stream"] = json!(false);
    // (case, body, fault): each request is sent twice and both must reach Anthropic.
    let mut tool = ask("What is the weather in Oslo?", true);
    tool["tools"] = json!([{"name": "get_weather", "input_schema": {"type": "object"}}]);
    let cases = [
        ("tool input that is not JSON", tool, Some("bad-tool-args")),
        (
            "error event",
            ask("What is an error?", true),
            Some("error-event"),
        ),
        ("cut stream", ask("What is a cut?", true), Some("cut")),
        (
            "overloaded",
            ask("What is a load?", false),
            Some("overloaded"),
        ),
        ("refusal", ask("What is a refusal?", false), Some("refusal")),
        (
            "refusal streamed",
            ask("What is a no?", true),
            Some("refusal"),
        ),
        ("max_tokens", short, None),
        ("max_tokens body", short_body, None),
    ];
    let mut calls = 0;
    for (case, body, fault) in cases {
        let headers: Vec<(&str, &str)> = fault.map(|f| ("x-sim-fault", f)).into_iter().collect();
        for attempt in 0..2 {
            let response = create(&gw, "sk-a", &body, &headers).await;
            assert_eq!(outcome(&response), "miss", "{case} #{attempt}");
            let status = response.status().as_u16();
            let text = response.text().await.expect("body");
            if case == "cut stream" {
                // The gateway ends a broken stream with Anthropic's error event.
                assert!(
                    text.contains("event: error\ndata: {\"error\":{\"message\":"),
                    "{text}"
                );
            }
            if case == "overloaded" {
                assert_eq!(status, 529, "{case}");
            }
            calls += 1;
            // Give a wrongly stored answer the time to land before the repeat.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_eq!(
            upstream_messages(&sim),
            calls,
            "{case}: both reached Anthropic"
        );
    }
    assert_eq!(gw.state.cache.store.len(), 0);
    // The same gateway stores a whole answer: the misses above were refused, not lost.
    let clean = create(&gw, "sk-a", &ask("What is a story?", true), &[]).await;
    let _ = clean.text().await;
    wait_for_entries(&gw, 1).await;
}

#[tokio::test]
async fn cache_control_markers_reach_anthropic() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let marked = |question: &str| {
        json!({"model": "claude-sim", "max_tokens": 64,
            "system": [{"type": "text", "text": "You are a terse assistant who answers in one line.",
                "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": question}]})
    };
    let first = create(&gw, "sk-a", &marked("What is a cache?"), &[]).await;
    assert_eq!(outcome(&first), "miss");
    let first: Value = first.json().await.expect("json");
    assert!(
        first["usage"]["cache_creation_input_tokens"].as_u64() > Some(0),
        "{first}"
    );
    // A different question behind the same marked system prompt: Anthropic reads its cache.
    let second = create(&gw, "sk-a", &marked("What is a queue?"), &[]).await;
    assert_eq!(outcome(&second), "miss");
    let second: Value = second.json().await.expect("json");
    assert!(
        second["usage"]["cache_read_input_tokens"].as_u64() > Some(0),
        "{second}"
    );
    assert_eq!(sim.stats.snapshot().cache_reads, 1);
}

#[tokio::test]
async fn one_api_keys_answer_is_not_served_to_another() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let miss = create(&gw, "sk-a", &ask("What is a tenant?", false), &[]).await;
    assert_eq!(outcome(&miss), "miss");
    let _ = miss.text().await;
    wait_for_entries(&gw, 1).await;
    let other = create(&gw, "sk-b", &ask("What is a tenant?", false), &[]).await;
    assert_eq!(outcome(&other), "miss", "sk-a's entry is not sk-b's");
    let _ = other.text().await;
    let again = create(&gw, "sk-a", &ask("What is a tenant?", false), &[]).await;
    assert_eq!(outcome(&again), "hit");
    assert_eq!(upstream_messages(&sim), 2);
}

#[tokio::test]
async fn count_tokens_passes_through_to_anthropic() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let response = client()
        .post(gw.url("/v1/messages/count_tokens"))
        .header("x-api-key", "sk-a")
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-sim", "messages": [{"role": "user", "content": "Hello there"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert!(body["input_tokens"].as_u64() > Some(0), "{body}");
    assert_eq!(sim.stats.snapshot().count_tokens, 1);
    assert_eq!(upstream_messages(&sim), 0);
}

/// An Anthropic client's calls off `/v1/messages` (`models.list()`, files) go to the Anthropic
/// upstream, not the OpenAI one with the client's Anthropic key; any method but `POST` on the
/// cached paths (a browser's preflight, `GET /v1/chat/completions` listing stored completions)
/// reaches the right upstream instead of a 404 of the gateway's own.
#[tokio::test]
async fn anthropic_clients_and_other_methods_reach_their_own_upstream() {
    let openai = sim_default().await;
    let anthropic = sim_default().await;
    let mut config = config_for(openai.base_url());
    config.anthropic_upstream_url = anthropic.base_url();
    config.validate().expect("valid");
    let gw = start(config).await;
    let models = |sim: &reprise_sim::SimHandle| sim.stats.snapshot().models;

    let response = client()
        .get(gw.url("/v1/models"))
        .header("x-api-key", "sk-ant-secret")
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    assert_eq!((models(&openai), models(&anthropic)), (0, 1));
    let seen = format!("{:?}", openai.stats.snapshot().last_headers);
    assert!(!seen.contains("sk-ant-secret"), "{seen}");
    let response = client()
        .get(gw.url("/v1/models"))
        .bearer_auth("sk-openai")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    assert_eq!((models(&openai), models(&anthropic)), (1, 1));

    // A browser's preflight gets the upstream's answer, and nothing the upstream did not send.
    for path in ["/v1/messages", "/v1/chat/completions", "/v1/responses"] {
        let response = client()
            .request(reqwest::Method::OPTIONS, gw.url(path))
            .header("origin", "https://app.example")
            .header("access-control-request-method", "POST")
            .header("access-control-request-headers", "content-type,x-api-key")
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 204, "OPTIONS {path}");
        assert_eq!(
            header(&response, "access-control-allow-origin").as_deref(),
            Some("*")
        );
        assert_eq!(header(&response, "allow"), None, "OPTIONS {path}");
    }
    // The sim answers these methods with its own 405; the gateway used to answer 404 itself.
    for (method, path) in [
        ("GET", "/v1/messages"),
        ("GET", "/v1/chat/completions?limit=2"),
        ("HEAD", "/v1/responses"),
        ("GET", "/v1/embeddings"),
        ("DELETE", "/v1/completions"),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let response = client()
            .request(method.clone(), gw.url(path))
            .send()
            .await
            .expect("send");
        assert_eq!(
            response.status(),
            405,
            "{method} {path}: the upstream's answer"
        );
        let _ = response.text().await;
    }
    assert_eq!(upstream_messages(&anthropic), 0);
    assert_eq!(openai.stats.snapshot().requests, 0);
}

#[tokio::test]
async fn the_gateways_own_errors_take_anthropics_shape() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    // A body without `max_tokens`, a body that is not JSON, and one of the wrong content type.
    let missing = json!({"model": "claude-sim", "messages": [{"role": "user", "content": "Hi"}]});
    let response = create(&gw, "sk-a", &missing, &[]).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_tokens")),
        "{body}"
    );
    for (content_type, raw) in [("application/json", "{\"model\":"), ("text/plain", "{}")] {
        let response = client()
            .post(gw.url("/v1/messages"))
            .header("x-api-key", "sk-a")
            .header("content-type", content_type)
            .body(raw)
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 400, "{content_type}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert!(
            body.get("error").and_then(|e| e.get("param")).is_none(),
            "{body}"
        );
    }
    // An upstream that is not there: Anthropic's 500 `api_error`, not OpenAI's 502.
    let mut config = config_for(sim.base_url());
    config.anthropic_upstream_url = "http://127.0.0.1:9/v1".to_owned();
    config.validate().expect("valid");
    let unreachable = start(config).await;
    let response = create(&unreachable, "sk-a", &ask("Hi", false), &[]).await;
    assert_eq!(response.status(), 500);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["type"], "api_error", "{body}");
    assert_eq!(upstream_messages(&sim), 0);
    // The OpenAI routes keep OpenAI's shape.
    let response = post(&gw, &json!({"model": "m", "messages": []}), &[]).await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["param"], "messages", "{body}");
}

#[tokio::test]
async fn the_gateways_openai_key_never_reaches_anthropic() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.anthropic_upstream_url = sim.base_url();
    config.upstream_api_key = Some(reprise_server::config::Secret::new("sk-gateway"));
    config.validate().expect("valid");
    let gw = start(config).await;
    let response = create(&gw, "sk-a", &ask("Whose key is this?", false), &[]).await;
    assert_eq!(
        response.status(),
        200,
        "the client's own x-api-key reached Anthropic"
    );
    let _ = response.text().await;
    assert_eq!(sim.stats.snapshot().last_authorization, None);
}

/// With `anthropic_api_key`, Anthropic gets the gateway's key as `x-api-key` and no client
/// credential, while the cache is still partitioned by the client's key.
#[tokio::test]
async fn the_gateways_anthropic_key_replaces_the_clients() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.anthropic_upstream_url = sim.base_url();
    config.anthropic_api_key = Some(reprise_server::config::Secret::new("sk-ant-gateway"));
    config.upstream_api_key = Some(reprise_server::config::Secret::new("sk-openai-gateway"));
    config.validate().expect("valid");
    let gw = start(config).await;
    let question = ask("Whose key goes upstream?", false);
    let response = create(&gw, "sk-a", &question, &[]).await;
    assert_eq!(response.status(), 200);
    assert_eq!(outcome(&response), "miss");
    let _ = response.text().await;
    let seen = sim.stats.snapshot().last_headers;
    let values = |name: &str| -> Vec<&str> {
        seen.iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    assert_eq!(values("x-api-key"), ["sk-ant-gateway"], "{seen:?}");
    assert!(values("authorization").is_empty(), "{seen:?}");
    wait_for_entries(&gw, 1).await;
    // The client's key still names its tenant: another key's client does not get sk-a's answer.
    let other = create(&gw, "sk-b", &question, &[]).await;
    assert_eq!(outcome(&other), "miss");
    let _ = other.text().await;
    let again = create(&gw, "sk-a", &question, &[]).await;
    assert_eq!(outcome(&again), "hit");
}

#[tokio::test]
async fn identical_requests_in_flight_share_one_call_each_with_its_own_id() {
    let sim = sim_default().await;
    let gw = std::sync::Arc::new(gateway(&sim).await);
    let mut tasks = Vec::new();
    for i in 0..4 {
        let gw = gw.clone();
        // Streaming and non-streaming followers, behind a slow first token so that they all join.
        let stream = i % 2 == 0;
        tasks.push(tokio::spawn(async move {
            let slow = [("x-sim-ttft-ms", "400")];
            let response = create(&gw, "sk-a", &ask("All at once?", stream), &slow).await;
            let outcome = outcome(&response);
            let text = response.text().await.expect("body");
            let message = if stream {
                let typed = parse_typed(&text);
                check_stream(&typed, &text);
                typed.message()
            } else {
                serde_json::from_str(&text).expect("json")
            };
            (outcome, message)
        }));
        if i == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let mut outcomes = Vec::new();
    let mut messages = Vec::new();
    for task in tasks {
        let (outcome, message) = task.await.expect("task");
        outcomes.push(outcome);
        messages.push(message);
    }
    assert_eq!(upstream_messages(&sim), 1, "{outcomes:?}");
    assert_eq!(
        outcomes.iter().filter(|o| *o == "coalesced").count(),
        3,
        "{outcomes:?}"
    );
    let mut ids: Vec<&str> = messages.iter().filter_map(|m| m["id"].as_str()).collect();
    assert!(
        messages
            .iter()
            .all(|m| m["content"] == messages[0]["content"]),
        "{messages:?}"
    );
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 4, "each client its own id: {messages:?}");
}

#[tokio::test]
async fn a_stream_ends_at_message_stop_even_when_the_upstream_holds_on() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.anthropic_upstream_url = sim.base_url();
    // Longer than the test waits: reaching it would mean the relay waited for the connection to close.
    config.idle_timeout_ms = 30_000;
    config.validate().expect("valid");
    let gw = start(config).await;
    let stall = [("x-sim-fault", "stall-at-done")];
    let started = std::time::Instant::now();
    let response = create(&gw, "sk-a", &ask("Are you done?", true), &stall).await;
    let text = response.text().await.expect("body");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "waited for the upstream"
    );
    check_stream(&parse_typed(&text), &text);
    wait_for_entries(&gw, 1).await;
    let hit = create(&gw, "sk-a", &ask("Are you done?", false), &[]).await;
    assert_eq!(outcome(&hit), "hit");
}

#[tokio::test]
async fn a_paraphrase_is_a_semantic_hit_with_the_stored_message() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let mut config = semantic_config(sim.base_url(), &models);
    config.anthropic_upstream_url = sim.base_url();
    config.validate().expect("valid");
    let gw = start(config).await;
    assert!(gw.state.semantic.is_some(), "model loaded");
    let seed = create(&gw, "sk-a", &ask("how do I reset my password", false), &[]).await;
    assert_eq!(outcome(&seed), "miss");
    let original: Value = seed.json().await.expect("json");
    wait_for_entries(&gw, 1).await;
    // The vector lands with the entry or shortly after (the backfill).
    let mut outcome_seen = String::new();
    for _ in 0..100 {
        let paraphrase = ask("I forgot my password, how can I reset it", true);
        let hit = create(&gw, "sk-a", &paraphrase, &[("cache-control", "no-store")]).await;
        outcome_seen = outcome(&hit);
        if outcome_seen == "semantic-hit" {
            let text = hit.text().await.expect("body");
            let typed = parse_typed(&text);
            check_stream(&typed, &text);
            assert_eq!(typed.message()["content"], original["content"]);
            break;
        }
        let _ = hit.bytes().await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(outcome_seen, "semantic-hit");
    let other = create(
        &gw,
        "sk-a",
        &ask("what is the capital of France", false),
        &[],
    )
    .await;
    assert_eq!(outcome(&other), "miss");
}
