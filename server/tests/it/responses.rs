//! The Responses API through the gateway: `POST /v1/responses` is cached like chat (miss, exact and
//! semantic hits, stream ↔ non-stream both ways with the typed events rebuilt), a hit serves the
//! stored response with its original ids so that `previous_response_id` and
//! `GET /v1/responses/{id}` keep working upstream, and nothing incomplete, failed, refused,
//! background or conversation-bound is ever stored.

use serde_json::{json, Value};

use crate::common::*;
use crate::semantic::{models, semantic_config};

fn upstream_responses(sim: &reprise_sim::SimHandle) -> u64 {
    sim.stats.snapshot().responses
}

fn ask(input: &str, stream: bool) -> Value {
    json!({"model": "sim-model", "input": input, "stream": stream})
}

async fn create(
    gw: &Gateway,
    key: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let bearer = format!("Bearer {key}");
    let auth = [("authorization", bearer.as_str())];
    post_to(gw, "/v1/responses", body, &[&auth, headers].concat()).await
}

/// What a Responses API stream says, read from its events.
trait ResponsesStream {
    fn text(&self) -> String;
    fn completed(&self) -> &Value;
}

impl ResponsesStream for Typed {
    fn text(&self) -> String {
        self.events
            .iter()
            .filter(|(n, _)| n == "response.output_text.delta")
            .filter_map(|(_, v)| v["delta"].as_str())
            .collect()
    }

    fn completed(&self) -> &Value {
        let (name, last) = self.events.last().expect("events");
        assert_eq!(name, "response.completed");
        &last["response"]
    }
}

fn output_text(body: &Value) -> String {
    body["output"][0]["content"][0]["text"]
        .as_str()
        .expect("output text")
        .to_owned()
}

const TYPED: [&str; 4] = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
];

/// The checks every Responses stream must pass: typed events in order, numbered from 0, the
/// timing comment after the last one, and no `[DONE]`.
fn check_stream(typed: &Typed, text: &str) {
    assert_eq!(&typed.names()[..4], TYPED, "{text}");
    for (i, (_, v)) in typed.events.iter().enumerate() {
        assert_eq!(v["sequence_number"], json!(i), "{text}");
    }
    assert!(!text.contains("[DONE]"), "{text}");
    assert!(typed.tail.starts_with(": reprise-timing {"), "{text}");
}

#[tokio::test]
async fn a_repeat_is_a_hit_with_the_stored_response_in_either_shape() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;

    // A non-streamed miss, then the same request again, streamed and not.
    let miss = create(&gw, "sk-a", &ask("What is a cache?", false), &[]).await;
    assert_eq!(outcome(&miss), "miss");
    let original: Value = miss.json().await.expect("json");
    assert_eq!(original["status"], "completed");
    wait_for_entries(&gw, 1).await;

    let hit = create(&gw, "sk-a", &ask("What is a cache?", false), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    assert!(header(&hit, "x-reprise-entry").is_some());
    let replayed: Value = hit.json().await.expect("json");
    assert_eq!(replayed, original, "the stored response, ids included");

    let streamed = create(&gw, "sk-a", &ask("What is a cache?", true), &[]).await;
    assert_eq!(outcome(&streamed), "hit");
    assert!(header(&streamed, "content-type").is_some_and(|c| c.starts_with("text/event-stream")));
    let text = streamed.text().await.expect("body");
    let typed = parse_typed(&text);
    check_stream(&typed, &text);
    assert_eq!(typed.text(), output_text(&original));
    assert_eq!(typed.completed(), &original);
    assert_eq!(upstream_responses(&sim), 1);

    // A streamed miss, then its non-streamed and streamed repeats.
    let miss = create(&gw, "sk-a", &ask("What is a vector?", true), &[]).await;
    assert_eq!(outcome(&miss), "miss");
    let miss_text = miss.text().await.expect("body");
    let upstream = parse_typed(&miss_text);
    assert!(!miss_text.contains("[DONE]"), "{miss_text}");
    assert!(
        upstream.tail.starts_with(": reprise-timing {"),
        "{miss_text}"
    );
    let stored = upstream.completed().clone();
    wait_for_entries(&gw, 2).await;

    let hit = create(&gw, "sk-a", &ask("What is a vector?", false), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    assert_eq!(hit.json::<Value>().await.expect("json"), stored);
    let hit = create(&gw, "sk-a", &ask("What is a vector?", true), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let text = hit.text().await.expect("body");
    let replayed = parse_typed(&text);
    check_stream(&replayed, &text);
    assert_eq!(
        replayed.events, upstream.events,
        "the upstream's events, in order, as they came"
    );
    // Paced, the same events.
    let paced = [("x-reprise-replay", "tokens-per-second=2000")];
    let hit = create(&gw, "sk-a", &ask("What is a vector?", true), &paced).await;
    assert_eq!(outcome(&hit), "hit");
    let text = hit.text().await.expect("body");
    let replayed = parse_typed(&text);
    check_stream(&replayed, &text);
    assert_eq!(replayed.events, upstream.events);
    assert_eq!(upstream_responses(&sim), 2);

    // Stats and metrics count the route by name.
    let metrics = client()
        .get(gw.url("/metrics"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("reprise_requests_total{cache=\"hit\",route=\"responses\"} 5"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_conversation_continues_from_the_id_a_hit_returned() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let first = create(&gw, "sk-a", &ask("Name a river.", false), &[]).await;
    assert_eq!(outcome(&first), "miss");
    let first: Value = first.json().await.expect("json");
    wait_for_entries(&gw, 1).await;
    let hit = create(&gw, "sk-a", &ask("Name a river.", false), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let id = hit.json::<Value>().await.expect("json")["id"]
        .as_str()
        .expect("id")
        .to_owned();
    assert_eq!(id, first["id"].as_str().expect("id"));

    // The provider knows the id a hit returned: a follow-up chains from it.
    let follow_up =
        json!({"model": "sim-model", "input": "And another one?", "previous_response_id": id});
    let next = create(&gw, "sk-a", &follow_up, &[]).await;
    assert_eq!(next.status(), 200);
    assert_eq!(outcome(&next), "miss");
    let next: Value = next.json().await.expect("json");
    assert_eq!(next["previous_response_id"], json!(id));
    // Stored under its own previous_response_id: the same follow-up is a hit, another chain is not.
    wait_for_entries(&gw, 2).await;
    assert_eq!(outcome(&create(&gw, "sk-a", &follow_up, &[]).await), "hit");

    // GET, input items and DELETE pass through to the provider's stored response.
    let got = client()
        .get(gw.url(&format!("/v1/responses/{id}")))
        .bearer_auth("sk-a")
        .send()
        .await
        .expect("get");
    assert_eq!(got.status(), 200);
    assert!(
        got.headers().get("x-reprise-cache").is_none(),
        "pass-through"
    );
    assert_eq!(got.json::<Value>().await.expect("json")["id"], json!(id));
    let items = client()
        .get(gw.url(&format!("/v1/responses/{id}/input_items")))
        .bearer_auth("sk-a")
        .send()
        .await
        .expect("items");
    assert_eq!(items.status(), 200);
    let items: Value = items.json().await.expect("json");
    assert_eq!(items["data"][0]["content"][0]["text"], "Name a river.");

    // An unknown id is the provider's 404, relayed.
    let unknown = json!({"model": "sim-model", "input": "hi", "previous_response_id": "resp_nope"});
    let refused = create(&gw, "sk-a", &unknown, &[]).await;
    assert_eq!(refused.status(), 404);
    let err: Value = refused.json().await.expect("json");
    assert_eq!(err["error"]["code"], "previous_response_not_found");

    // Deleted upstream, the response is forgotten here too: the repeat goes upstream for a new id.
    let entries = gw.state.cache.store.len();
    let deleted = client()
        .delete(gw.url(&format!("/v1/responses/{id}")))
        .bearer_auth("sk-a")
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 200);
    for _ in 0..200 {
        if gw.state.cache.store.len() < entries {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(gw.state.cache.store.len(), entries - 1);
    let again = create(&gw, "sk-a", &ask("Name a river.", false), &[]).await;
    assert_eq!(outcome(&again), "miss");
    let again: Value = again.json().await.expect("json");
    assert_ne!(again["id"], json!(id));
    // The chained follow-up's entry is untouched.
    assert_eq!(outcome(&create(&gw, "sk-a", &follow_up, &[]).await), "hit");
}

#[tokio::test]
async fn stored_responses_stay_with_their_api_key_even_when_keys_share() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.share_across_keys = true;
    // Longer than the provider keeps a stored response.
    config.live.default_ttl_s = 90 * 24 * 3600;
    let gw = start(config).await;

    // `store` defaults to true: the response's id belongs to key A's organization.
    assert_eq!(
        outcome(&create(&gw, "sk-a", &ask("Name a planet.", false), &[]).await),
        "miss"
    );
    wait_for_entries(&gw, 1).await;
    assert_eq!(
        outcome(&create(&gw, "sk-a", &ask("Name a planet.", false), &[]).await),
        "hit"
    );
    assert_eq!(
        outcome(&create(&gw, "sk-b", &ask("Name a planet.", false), &[]).await),
        "miss"
    );

    // With `store: false` nothing is kept upstream, so the entry is shared as configured.
    let mut unstored = ask("Name a metal.", false);
    unstored["store"] = json!(false);
    let first = create(&gw, "sk-a", &unstored, &[]).await;
    assert_eq!(outcome(&first), "miss");
    let first: Value = first.json().await.expect("json");
    assert_eq!(first["store"], json!(false));
    wait_for_entries(&gw, 3).await;
    let other = create(&gw, "sk-b", &unstored, &[]).await;
    assert_eq!(outcome(&other), "hit");
    assert_eq!(other.json::<Value>().await.expect("json"), first);

    // A request naming key A's previous response stays with key A, even unstored: the provider
    // would refuse it to another organization.
    let planet: Value = create(&gw, "sk-a", &ask("Name a planet.", false), &[])
        .await
        .json()
        .await
        .expect("json");
    let mut chained = ask("And its moon?", false);
    chained["store"] = json!(false);
    chained["previous_response_id"] = planet["id"].clone();
    assert_eq!(outcome(&create(&gw, "sk-a", &chained, &[]).await), "miss");
    wait_for_entries(&gw, 4).await;
    assert_eq!(outcome(&create(&gw, "sk-a", &chained, &[]).await), "hit");
    assert_eq!(outcome(&create(&gw, "sk-b", &chained, &[]).await), "miss");
    wait_for_entries(&gw, 5).await;

    // A stored response's entry lives no longer than the provider keeps it (30 days).
    let listing: Value = admin_json(&gw, "/admin/entries").await;
    let entries = listing["data"].as_array().expect("entries");
    // Key B's misses were stored too, under key B.
    assert_eq!(entries.len(), 5, "{listing}");
    for entry in entries.iter().filter(|e| e["prompt"] != "And its moon?") {
        assert_eq!(entry["route"], "responses");
        let ttl_s = (entry["expires_at_ms"].as_u64().expect("expires")
            - entry["created_at_ms"].as_u64().expect("created"))
            / 1000;
        let stored = entry["tenant"] != "shared";
        let want = if stored {
            30 * 24 * 3600
        } else {
            90 * 24 * 3600
        };
        assert_eq!(ttl_s, want, "{entry}");
        assert!(
            !entry["answer_preview"].as_str().unwrap_or("").is_empty(),
            "{entry}"
        );
    }
}

#[tokio::test]
async fn what_changes_the_answer_is_another_partition() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let base = ask("Summarize the plan.", false);
    assert_eq!(outcome(&create(&gw, "sk-a", &base, &[]).await), "miss");
    wait_for_entries(&gw, 1).await;
    let variants = [
        ("instructions", json!("Answer in one word.")),
        (
            "tools",
            json!([{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]),
        ),
        ("text", json!({"format": {"type": "json_object"}})),
        ("reasoning", json!({"effort": "low"})),
        ("max_output_tokens", json!(200)),
    ];
    for (i, (field, value)) in variants.into_iter().enumerate() {
        let mut body = base.clone();
        body[field] = value;
        assert_eq!(
            outcome(&create(&gw, "sk-a", &body, &[]).await),
            "miss",
            "{field}"
        );
        wait_for_entries(&gw, i + 2).await;
        assert_eq!(
            outcome(&create(&gw, "sk-a", &body, &[]).await),
            "hit",
            "{field}"
        );
    }
    // The same input, spelled as an item list, is the same request.
    let items = json!({"model": "sim-model", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Summarize the plan."}]}
    ]});
    assert_eq!(outcome(&create(&gw, "sk-a", &items, &[]).await), "hit");
    // The cache controls apply as on chat: a namespace is its own partition, `no-cache` refreshes.
    let other = [("x-reprise-namespace", "other")];
    assert_eq!(outcome(&create(&gw, "sk-a", &base, &other).await), "miss");
    let refresh = [("cache-control", "no-cache")];
    assert_eq!(
        outcome(&create(&gw, "sk-a", &base, &refresh).await),
        "refresh"
    );
    let off = [("x-reprise-cache-mode", "off")];
    assert_eq!(outcome(&create(&gw, "sk-a", &base, &off).await), "bypass");
}

/// A stored prompt names its model: a request without `model` is forwarded (it got the gateway's
/// own 400 before) and cached under its prompt; another prompt is another partition.
#[tokio::test]
async fn a_request_naming_a_stored_prompt_needs_no_model() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let prompt = |id: &str| json!({"prompt": {"id": id, "variables": {"city": "Oslo"}}, "input": "Plan my day.", "store": false});
    let miss = create(&gw, "sk-a", &prompt("pmpt_1"), &[]).await;
    assert_eq!(miss.status(), 200);
    assert_eq!(outcome(&miss), "miss");
    let first = output_text(&miss.json().await.expect("json"));
    wait_for_entries(&gw, 1).await;
    let hit = create(&gw, "sk-a", &prompt("pmpt_1"), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    assert_eq!(output_text(&hit.json().await.expect("json")), first);
    assert_eq!(
        outcome(&create(&gw, "sk-a", &prompt("pmpt_2"), &[]).await),
        "miss"
    );
    // Neither a model nor a prompt: the gateway's own 400, naming `model`.
    let refused = create(&gw, "sk-a", &json!({"input": "Plan my day."}), &[]).await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["error"]["param"], "model", "{body}");
    assert_eq!(upstream_responses(&sim), 2);
}

#[tokio::test]
async fn a_forced_function_call_is_cached_and_replayed_as_typed_events() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let body = json!({"model": "sim-model", "input": "Weather in Paris?", "tool_choice": "required",
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}]});
    let miss = create(&gw, "sk-a", &body, &[]).await;
    assert_eq!(outcome(&miss), "miss");
    let original: Value = miss.json().await.expect("json");
    assert_eq!(original["output"][0]["type"], "function_call");
    wait_for_entries(&gw, 1).await;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let hit = create(&gw, "sk-a", &streamed, &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let text = hit.text().await.expect("body");
    let typed = parse_typed(&text);
    assert!(
        typed
            .names()
            .contains(&"response.function_call_arguments.done"),
        "{text}"
    );
    assert_eq!(typed.completed(), &original);
}

#[tokio::test]
async fn incomplete_failed_refused_cut_background_and_conversation_answers_are_never_stored() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    // (case, body, fault header): each request is sent twice; both must reach the provider.
    let cases: Vec<(&str, Value, Option<&str>)> = vec![
        (
            "incomplete (max_output_tokens)",
            json!({"model": "sim-model", "input": "a", "max_output_tokens": 2}),
            None,
        ),
        (
            "incomplete streamed",
            json!({"model": "sim-model", "input": "b", "max_output_tokens": 2, "stream": true}),
            None,
        ),
        ("content filter", ask("c", false), Some("content-filter")),
        (
            "content filter streamed",
            ask("d", true),
            Some("content-filter"),
        ),
        ("failed", ask("e", false), Some("failed")),
        ("response.failed event", ask("f", true), Some("failed=2")),
        ("error event", ask("g", true), Some("error-event=2")),
        ("cut stream", ask("h", true), Some("cut=2")),
        ("refusal", ask("i", false), Some("refusal")),
        ("refusal streamed", ask("j", true), Some("refusal")),
        (
            "background",
            json!({"model": "sim-model", "input": "k", "background": true}),
            None,
        ),
        (
            "conversation",
            json!({"model": "sim-model", "input": "l", "conversation": "conv_1"}),
            None,
        ),
    ];
    for (case, body, fault) in cases {
        let before = upstream_responses(&sim);
        let headers: Vec<(&str, &str)> = fault.map(|f| ("x-sim-fault", f)).into_iter().collect();
        for attempt in 0..2 {
            let response = create(&gw, "sk-a", &body, &headers).await;
            let expected = if case == "background" || case == "conversation" {
                "bypass"
            } else {
                "miss"
            };
            assert_eq!(outcome(&response), expected, "{case}, attempt {attempt}");
            // Read it all, so the gateway has seen the whole answer before the retry.
            let _ = response.bytes().await;
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        }
        assert_eq!(upstream_responses(&sim) - before, 2, "{case}");
    }
    // Writes land off the request path: give a wrongly stored answer the time to show up.
    let cache = gw.state.cache.clone();
    tokio::task::spawn_blocking(move || cache.drain())
        .await
        .expect("drain");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(gw.state.cache.store.len(), 0);
}

#[tokio::test]
async fn a_paraphrase_is_a_semantic_hit_with_the_stored_response() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    assert!(gw.state.semantic.is_some(), "model loaded");
    let seed = create(&gw, "sk-a", &ask("how do I reset my password", false), &[]).await;
    assert_eq!(outcome(&seed), "miss");
    let original: Value = seed.json().await.expect("json");
    wait_for_entries(&gw, 1).await;
    // The vector lands with the entry or shortly after (the backfill).
    let mut outcome_seen = String::new();
    for _ in 0..100 {
        let hit = create(
            &gw,
            "sk-a",
            &ask("I forgot my password, how can I reset it", true),
            &[("cache-control", "no-store")],
        )
        .await;
        outcome_seen = outcome(&hit);
        if outcome_seen == "semantic-hit" {
            assert!(header(&hit, "x-reprise-similarity").is_some());
            let text = hit.text().await.expect("body");
            let typed = parse_typed(&text);
            check_stream(&typed, &text);
            assert_eq!(typed.completed(), &original);
            break;
        }
        let _ = hit.bytes().await;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(outcome_seen, "semantic-hit");
    // An unrelated question is not served the stored answer.
    let other = create(
        &gw,
        "sk-a",
        &ask("what is the capital of France", false),
        &[],
    )
    .await;
    assert_eq!(outcome(&other), "miss");
}

#[tokio::test]
async fn identical_requests_in_flight_share_one_upstream_call_with_typed_events() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let gw = std::sync::Arc::new(gw);
    let mut tasks = Vec::new();
    for i in 0..6 {
        let gw = gw.clone();
        // Streaming and non-streaming followers, behind a slow first token so that they all join.
        let stream = i % 2 == 0;
        tasks.push(tokio::spawn(async move {
            let response = create(
                &gw,
                "sk-a",
                &ask("All at once?", stream),
                &[("x-sim-ttft-ms", "400")],
            )
            .await;
            (
                outcome(&response),
                stream,
                response.text().await.expect("body"),
            )
        }));
        if i == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let mut texts = Vec::new();
    let mut outcomes = Vec::new();
    for t in tasks {
        let (o, stream, text) = t.await.expect("task");
        let answer = if stream {
            let typed = parse_typed(&text);
            check_stream(&typed, &text);
            typed.text()
        } else {
            output_text(&serde_json::from_str(&text).expect("json"))
        };
        outcomes.push(o);
        texts.push(answer);
    }
    assert_eq!(upstream_responses(&sim), 1, "{outcomes:?}");
    assert_eq!(
        outcomes.iter().filter(|o| *o == "coalesced").count(),
        5,
        "{outcomes:?}"
    );
    assert!(
        texts.iter().all(|t| t == &texts[0] && !t.is_empty()),
        "{texts:?}"
    );
}

/// A Responses stream that fails after it began ends with the API's own typed `error` event,
/// numbered after the last event sent (the SDKs read it as a `ResponseErrorEvent`), never with a
/// chunk-shaped `{"error":…}`; and a follower of that stream ends with the same event.
#[tokio::test]
async fn a_broken_stream_ends_with_a_typed_error_event_and_so_do_its_followers() {
    let sim = sim_default().await;
    let gw = std::sync::Arc::new(start(config_for(sim.base_url())).await);
    for fault in ["abort=3", "cut=3"] {
        let question = format!("Break at {fault}?");
        let headers = [
            ("x-sim-fault", fault),
            ("x-sim-ttft-ms", "300"),
            ("x-sim-itl-ms", "40"),
        ];
        let mut tasks = Vec::new();
        for i in 0..2 {
            let (gw, question) = (gw.clone(), question.clone());
            tasks.push(tokio::spawn(async move {
                let response = create(&gw, "sk-a", &ask(&question, true), &headers).await;
                (outcome(&response), response.text().await.expect("body"))
            }));
            if i == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        let mut outcomes = Vec::new();
        let mut errors = Vec::new();
        for t in tasks {
            let (o, text) = t.await.expect("task");
            let typed = parse_typed(&text);
            let ((name, error), before) = typed
                .events
                .split_last()
                .map(|(last, before)| (last.clone(), before.to_vec()))
                .expect("events");
            assert_eq!(name, "error", "{fault}: {text}");
            assert_eq!(
                error["code"], "upstream_invalid_response",
                "{fault}: {text}"
            );
            assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
            let previous = before.last().expect("events before the error").1["sequence_number"]
                .as_u64()
                .expect("numbered");
            assert_eq!(
                error["sequence_number"],
                json!(previous + 1),
                "{fault}: {text}"
            );
            assert!(!text.contains("data: {\"error\""), "{fault}: {text}");
            outcomes.push(o);
            errors.push(error);
        }
        // Whichever reached the flight first leads (the other was sent 50 ms later).
        outcomes.sort();
        assert_eq!(outcomes, ["coalesced", "miss"], "{fault}");
        assert_eq!(
            errors[0], errors[1],
            "{fault}: the follower ends as the leader did"
        );
    }
}

#[tokio::test]
async fn a_stream_ends_at_response_completed_even_when_the_upstream_holds_on() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    // Longer than the test waits: reaching it would mean the relay waited for the connection to close.
    config.idle_timeout_ms = 30_000;
    let gw = start(config).await;
    let stall = [("x-sim-fault", "stall-at-done")];
    let response = create(&gw, "sk-a", &ask("Hold the line?", true), &stall).await;
    assert_eq!(outcome(&response), "miss");
    let text = tokio::time::timeout(std::time::Duration::from_secs(10), response.text())
        .await
        .expect("the stream ends at response.completed")
        .expect("body");
    let typed = parse_typed(&text);
    assert_eq!(typed.completed()["status"], "completed");
    assert!(typed.tail.starts_with(": reprise-timing {"), "{text}");
    // No error event after it (an unnamed one would have failed `parse_typed`).
    assert!(!typed.names().contains(&"error"), "{text}");
    wait_for_entries(&gw, 1).await;
    assert_eq!(
        outcome(&create(&gw, "sk-a", &ask("Hold the line?", true), &stall).await),
        "hit"
    );
}
