//! What every cached route has, checked on Anthropic's Messages API: `/healthz` names its upstream,
//! `/admin/stats`, `/metrics` and `/admin/requests` count it by route, the `x-reprise-*` response
//! headers and `Cache-Control` apply, control headers never reach Anthropic, warmed entries answer
//! it, OTel spans name it, shadow mode, feedback and namespace thresholds act on its paraphrases,
//! and the Redis store shares its answers and its single flight between replicas.

use std::time::Duration;

use serde_json::{json, Value};

use super::{ask, check_stream, create, gateway, text_of, upstream_messages, MessagesStream};
use crate::common::*;
use crate::otel::{attrs, names, request_tree, Receiver};
use crate::redis::{on_redis, RedisServer};
use crate::semantic::{models, semantic_config};

const QUESTION: &str = "how do I reset my password";
const PARAPHRASE: &str = "I forgot my password, how can I reset it";

async fn admin(gw: &Gateway, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
    let response = client()
        .request(method, gw.url(path))
        .bearer_auth("admin-secret")
        .json(&body)
        .send()
        .await
        .expect("admin");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// Reads a response to its end and gives its outcome.
async fn outcome_of(response: reqwest::Response) -> String {
    let cache = outcome(&response);
    let _ = response.bytes().await;
    cache
}

#[tokio::test]
async fn stats_metrics_headers_and_cache_control_apply_to_messages() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;

    // A streamed miss, its streamed repeat, with the headers every cached route sends.
    let miss = create(&gw, "sk-a", &ask(QUESTION, true), &[]).await;
    assert_eq!(outcome(&miss), "miss");
    let miss_id = header(&miss, "x-reprise-request-id").expect("request id");
    let miss_request = miss.headers().clone();
    let text = miss.text().await.expect("body");
    check_stream(&parse_typed(&text), &text);
    wait_for_entries(&gw, 1).await;
    let hit = create(&gw, "sk-a", &ask(QUESTION, true), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    assert!(header(&hit, "x-reprise-entry").is_some_and(|e| e.starts_with("e_")));
    // Anthropic's SDKs read a response's id from `request-id`: a miss relays the upstream's, a
    // hit gives the gateway's own (the one `/admin/requests` and feedback know it by).
    let relayed = miss_request.get("request-id").and_then(|v| v.to_str().ok());
    assert!(
        relayed.is_some_and(|id| id.starts_with("req_sim")),
        "{relayed:?}"
    );
    assert_eq!(
        header(&hit, "request-id"),
        header(&hit, "x-reprise-request-id")
    );
    assert!(header(&hit, "age").is_some_and(|a| a.parse::<u64>().is_ok()));
    let saved: f64 = header(&hit, "x-reprise-ttft-saved-ms")
        .expect("ttft saved")
        .parse()
        .expect("number");
    assert!(saved > 0.0, "the sim's TTFT was saved: {saved}");
    let text = hit.text().await.expect("body");
    check_stream(&parse_typed(&text), &text);

    // Cache-Control and the mode header: no-cache refreshes (upstream again), off bypasses.
    let calls = upstream_messages(&sim);
    let refresh = create(
        &gw,
        "sk-a",
        &ask(QUESTION, false),
        &[("cache-control", "no-cache")],
    )
    .await;
    assert_eq!(outcome_of(refresh).await, "refresh");
    let off = create(
        &gw,
        "sk-a",
        &ask(QUESTION, false),
        &[
            ("x-reprise-cache-mode", "off"),
            ("x-reprise-namespace", "n1"),
        ],
    )
    .await;
    assert_eq!(outcome_of(off).await, "bypass");
    assert_eq!(upstream_messages(&sim), calls + 2);
    // Control headers never reach Anthropic.
    let sent = sim.stats.snapshot().last_headers;
    assert!(
        sent.iter()
            .all(|(name, _)| !name.starts_with("x-reprise-") && name != "cache-control"),
        "{sent:?}"
    );
    assert!(sent.iter().any(|(name, _)| name == "anthropic-version"));

    // no-store: not stored. The writer is in order, so once a later answer is stored, this one
    // would have been too.
    let kept = gw.state.cache.store.len();
    let unstored = ask("what is the tallest mountain", false);
    let first = create(&gw, "sk-a", &unstored, &[("cache-control", "no-store")]).await;
    assert_eq!(outcome_of(first).await, "miss");
    let later = create(&gw, "sk-a", &ask("what is the deepest lake", false), &[]).await;
    assert_eq!(outcome_of(later).await, "miss");
    wait_for_entries(&gw, kept + 1).await;
    let again = create(&gw, "sk-a", &unstored, &[]).await;
    assert_eq!(outcome_of(again).await, "miss", "no-store kept it out");

    // Counted by route in the stats the dashboard reads, in the metrics and in the request log.
    let stats = admin_json(&gw, "/admin/stats").await;
    let messages = &stats["by_route"]["messages"];
    assert_eq!(
        (
            &messages["total"],
            &messages["hit"],
            &messages["miss"],
            &messages["refresh"],
            &messages["bypass"]
        ),
        (&json!(7), &json!(1), &json!(4), &json!(1), &json!(1)),
        "{stats}"
    );
    assert!(
        stats["by_route"].get("chat.completions").is_none(),
        "{stats}"
    );
    let text = metrics(&gw).await;
    for line in [
        "reprise_requests_total{cache=\"hit\",route=\"messages\"} 1",
        "reprise_requests_total{cache=\"miss\",route=\"messages\"} 4",
        "reprise_ttft_seconds_count{cache=\"hit\",route=\"messages\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing from /metrics");
    }
    let log = admin_json(&gw, "/admin/requests").await;
    let record = log["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|r| r["id"] == miss_id.as_str())
        .cloned()
        .expect("the miss is in the log");
    assert_eq!(
        (&record["route"], &record["cache"], &record["stream"]),
        (&json!("messages"), &json!("miss"), &json!(true))
    );
}

#[tokio::test]
async fn healthz_names_the_anthropic_upstream() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.anthropic_upstream_url = "http://127.0.0.1:9/anthropic/v1".into();
    config.validate().expect("valid");
    let gw = start(config).await;
    let health = health(&gw).await;
    assert_eq!(
        health["anthropic_upstream"], "http://127.0.0.1:9/anthropic/v1",
        "{health}"
    );
    assert_ne!(health["upstream"], health["anthropic_upstream"]);
    // Nothing listens there: the error names the upstream this route tried, not the OpenAI one.
    // Anthropic's own status for it (500 `api_error`, which its SDKs retry).
    let response = create(&gw, "sk-a", &ask("Hello", false), &[]).await;
    assert_eq!(response.status(), 500);
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        (&body["type"], &body["error"]["type"]),
        (&json!("error"), &json!("api_error")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("127.0.0.1:9/anthropic/v1"), "{message}");
    assert!(!message.contains(&sim.base_url()), "{message}");
}

#[tokio::test]
async fn warmed_entries_answer_messages_requests() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let warm = |item: Value| admin(&gw, reqwest::Method::POST, "/admin/entries", item);
    let answer = "At 100 °C at sea level.";
    let (status, body) = warm(json!({"route": "messages", "model": "claude-sim",
        "prompt": "What is the boiling point of water?", "max_tokens": 256, "response": answer,
        "api_key": "sk-a"}))
    .await;
    assert_eq!(status, 201, "{body}");
    // Stored once per `anthropic-version` Anthropic's clients send: Claude Code's and the SDKs'.
    assert_eq!(body["created"], 2, "{body}");

    // As Claude Code sends it (`anthropic-version: 2023-06-01`): a hit in both shapes.
    let question = ask("What is the boiling point of water?", false);
    let hit = create(&gw, "sk-a", &question, &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let message: Value = hit.json().await.expect("json");
    assert_eq!(text_of(&message), answer);
    assert_eq!(message["stop_reason"], "end_turn");
    let streamed = create(
        &gw,
        "sk-a",
        &ask("What is the boiling point of water?", true),
        &[],
    )
    .await;
    assert_eq!(outcome(&streamed), "hit");
    let text = streamed.text().await.expect("body");
    let typed = parse_typed(&text);
    check_stream(&typed, &text);
    assert_eq!(typed.text(), answer);
    // As the current SDKs send it: missed before, every SDK request skipping warmed entries.
    let sdk = [("anthropic-version", "2026-10-21")];
    let auth = [("x-api-key", "sk-a")];
    let hit = post_to(
        &gw,
        "/v1/messages",
        &question,
        &[&auth[..], &sdk[..]].concat(),
    )
    .await;
    assert_eq!(outcome(&hit), "hit");
    assert_eq!(text_of(&hit.json().await.expect("json")), answer);
    assert_eq!(upstream_messages(&sim), 0);

    // What is in the key still counts: another `max_tokens`, a beta the entry was not warmed for.
    let mut shorter = question.clone();
    shorter["max_tokens"] = json!(64);
    let other = create(&gw, "sk-a", &shorter, &[]).await;
    assert_eq!(outcome_of(other).await, "miss");
    let beta = [("anthropic-beta", "b1")];
    assert_eq!(
        outcome_of(create(&gw, "sk-a", &question, &beta).await).await,
        "miss"
    );
    // Warmed with that beta (a whole request, chat-shaped messages with a system message), it hits.
    let (status, body) = warm(json!({"route": "messages", "model": "claude-sim", "max_tokens": 256,
        "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Name a prime."}],
        "headers": {"anthropic-version": "2023-06-01", "anthropic-beta": "b1"}, "response": "7",
        "api_key": "sk-a"}))
    .await;
    assert_eq!(status, 201, "{body}");
    let mut terse = ask("Name a prime.", false);
    terse["system"] = json!("Be terse.");
    let hit = create(&gw, "sk-a", &terse, &beta).await;
    assert_eq!(outcome(&hit), "hit");
    assert_eq!(text_of(&hit.json().await.expect("json")), "7");

    // Through the typed client, as `reprise-client warm` sends it.
    let typed =
        reprise_client::admin::AdminClient::new(&gw.url(""), Some("admin-secret")).expect("client");
    let item = reprise_client::admin::WarmItem::prompt("claude-sim", "Name an even prime.", "2")
        .with_route("messages")
        .with_max_tokens(256)
        .with_header("anthropic-version", "2023-06-01")
        .with_header("anthropic-beta", "b1")
        .with_api_key("sk-a");
    assert_eq!(typed.warm(&[item]).await.expect("warm").created, 1);
    let hit = create(&gw, "sk-a", &ask("Name an even prime.", false), &beta).await;
    assert_eq!(outcome(&hit), "hit");
    assert_eq!(text_of(&hit.json().await.expect("json")), "2");

    // Clear refusals, naming the field: no max_tokens, a header this route does not key on, a
    // keyed header on a route that keys none.
    let refusals = [
        (
            json!({"route": "messages", "model": "m", "prompt": "p", "response": "r", "api_key": ""}),
            "entries[0].max_tokens",
        ),
        (
            json!({"route": "messages", "model": "m", "prompt": "p", "max_tokens": 8,
                "response": "r", "headers": {"x-other": "1"}, "api_key": ""}),
            "entries[0].headers.x-other",
        ),
        (
            json!({"model": "m", "prompt": "p", "response": "r", "api_key": "",
                "headers": {"anthropic-version": "2023-06-01"}}),
            "entries[0].headers.anthropic-version",
        ),
    ];
    for (item, param) in refusals {
        let (status, body) = warm(item).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["param"], param, "{body}");
    }
}

#[tokio::test]
async fn otel_spans_name_the_messages_route() {
    let receiver = Receiver::start().await;
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.anthropic_upstream_url = sim.base_url();
    config.otlp_endpoint = Some(format!("http://{}", receiver.addr));
    config.validate().expect("valid");
    let gw = start(config).await;
    let traced = |trace: &str| format!("00-{trace}-00f067aa0ba902b7-01");
    let miss_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let hit_trace = "0af7651916cd43dd8448eb211c80319c";
    let miss = create(
        &gw,
        "sk-a",
        &ask(QUESTION, true),
        &[("traceparent", &traced(miss_trace))],
    )
    .await;
    assert_eq!(outcome_of(miss).await, "miss");
    // Anthropic is handed the client's trace.
    let sent = sim.stats.snapshot().last_headers;
    let parent = sent
        .iter()
        .find(|(n, _)| n == "traceparent")
        .map(|(_, v)| v.clone())
        .expect("traceparent upstream");
    assert!(parent.starts_with(&format!("00-{miss_trace}-")), "{parent}");
    wait_for_entries(&gw, 1).await;
    let hit = create(
        &gw,
        "sk-a",
        &ask(QUESTION, true),
        &[("traceparent", &traced(hit_trace))],
    )
    .await;
    assert_eq!(outcome_of(hit).await, "hit");
    gw.shutdown().await.expect("shutdown");
    let spans = receiver.spans();
    for (trace, cache) in [(miss_trace, "miss"), (hit_trace, "hit")] {
        let (root, children) = request_tree(&spans, trace);
        assert_eq!(root["name"], "POST /v1/messages");
        let a = attrs(root);
        assert_eq!(a["http.route"]["stringValue"], "/v1/messages");
        assert_eq!(a["reprise.cache"]["stringValue"], cache);
        assert_eq!(a["gen_ai.request.model"]["stringValue"], "claude-sim");
        assert_eq!(a["reprise.completion"]["stringValue"], "complete");
        assert!(a["reprise.ttft_ms"]["doubleValue"].as_f64().expect("ttft") > 0.0);
        let phases = names(&children);
        let upstream = phases.contains(&"upstream_send");
        assert_eq!(upstream, cache == "miss", "{phases:?}");
    }
}

/// Sends `content` in `namespace` (no-store unless `store`) with `extra` headers.
async fn ask_in(
    gw: &Gateway,
    namespace: &str,
    content: &str,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    let mut headers = vec![("x-reprise-namespace", namespace)];
    headers.extend_from_slice(extra);
    create(gw, "sk-a", &ask(content, false), &headers).await
}

/// Stores the answer to `content` in `namespace` and waits for its vector.
async fn seed(gw: &Gateway, namespace: &str, content: &str) {
    let vectors = || {
        gw.state.semantic.as_ref().map_or(0, |s| {
            reprise_server::index::VectorIndex::len(s.index.as_ref())
        })
    };
    let before = vectors();
    assert_eq!(
        outcome_of(ask_in(gw, namespace, content, &[]).await).await,
        "miss"
    );
    for _ in 0..500 {
        if vectors() > before {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{content} never reached the index");
}

#[tokio::test]
async fn shadow_mode_feedback_and_namespace_thresholds_apply_to_messages() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let mut config = semantic_config(sim.base_url(), &models);
    config.anthropic_upstream_url = sim.base_url();
    config.validate().expect("valid");
    let gw = start(config).await;
    seed(&gw, "support", QUESTION).await;
    let no_store = ("cache-control", "no-store");

    // Shadow mode: the paraphrase goes upstream and says it would have been served.
    let calls = upstream_messages(&sim);
    let shadowed = ask_in(
        &gw,
        "support",
        PARAPHRASE,
        &[no_store, ("x-reprise-cache-mode", "shadow")],
    )
    .await;
    assert_eq!(outcome(&shadowed), "miss");
    let said = header(&shadowed, "x-reprise-shadow").expect("x-reprise-shadow");
    assert!(said.starts_with("would-hit;"), "{said}");
    let _ = shadowed.bytes().await;
    assert_eq!(upstream_messages(&sim), calls + 1);
    let page = admin_json(&gw, "/admin/shadow").await;
    assert_eq!(page["data"][0]["prompt"], PARAPHRASE, "{page}");
    assert_eq!(page["data"][0]["entry_prompt"], QUESTION);

    // Served, then vetoed by feedback: the next paraphrase goes upstream and names the veto.
    let hit = ask_in(&gw, "support", PARAPHRASE, &[no_store]).await;
    assert_eq!(outcome(&hit), "semantic-hit");
    let entry = header(&hit, "x-reprise-entry").expect("entry");
    let id = header(&hit, "x-reprise-request-id").expect("request id");
    let _ = hit.bytes().await;
    let (status, record) = admin(
        &gw,
        reqwest::Method::POST,
        "/admin/feedback",
        json!({"request_id": id, "verdict": "wrong"}),
    )
    .await;
    assert_eq!(status, 200, "{record}");
    let vetoed = ask_in(&gw, "support", PARAPHRASE, &[no_store]).await;
    assert_eq!(outcome(&vetoed), "miss");
    assert_eq!(header(&vetoed, "x-reprise-vetoed"), Some(entry));
    let _ = vetoed.bytes().await;

    // A namespace's own threshold: strict in `legal`, the global one elsewhere.
    let (status, body) = admin(
        &gw,
        reqwest::Method::PATCH,
        "/admin/config",
        json!({"namespace_thresholds": {"legal": 0.999}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    seed(&gw, "legal", QUESTION).await;
    seed(&gw, "sales", QUESTION).await;
    let strict = ask_in(&gw, "legal", PARAPHRASE, &[no_store]).await;
    assert_eq!(outcome_of(strict).await, "miss");
    let served = ask_in(&gw, "sales", PARAPHRASE, &[no_store]).await;
    assert_eq!(outcome_of(served).await, "semantic-hit");
}

#[tokio::test]
async fn replicas_on_redis_share_messages_answers_and_their_single_flight() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let replica = || {
        let mut config = config_for(sim.base_url());
        config.anthropic_upstream_url = sim.base_url();
        on_redis(config, &redis)
    };
    let a = std::sync::Arc::new(start(replica()).await);
    let b = std::sync::Arc::new(start(replica()).await);

    // A's miss is B's hit, with the same message.
    let miss = create(&a, "sk-a", &ask(QUESTION, false), &[]).await;
    assert_eq!(outcome(&miss), "miss");
    let original: Value = miss.json().await.expect("json");
    wait_for_entries(&a, 1).await;
    let hit = create(&b, "sk-a", &ask(QUESTION, true), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let text = hit.text().await.expect("body");
    let typed = parse_typed(&text);
    check_stream(&typed, &text);
    assert_eq!(typed.message()["content"], original["content"]);
    assert_eq!(upstream_messages(&sim), 1);

    // The same new question at both replicas at once, behind a slow first token: one call.
    let slow = [("x-sim-ttft-ms", "600")];
    let first = {
        let a = a.clone();
        tokio::spawn(async move {
            outcome_of(create(&a, "sk-a", &ask("All at once, twice?", true), &slow).await).await
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let second =
        outcome_of(create(&b, "sk-a", &ask("All at once, twice?", true), &slow).await).await;
    let first = first.await.expect("task");
    assert_eq!(upstream_messages(&sim), 2, "{first} {second}");
    assert_eq!(first, "miss");
    assert!(["coalesced", "hit"].contains(&second.as_str()), "{second}");
}
