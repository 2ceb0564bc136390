//! Exact-match cache behaviour end to end: hits, keys that must not collide, what is never stored,
//! persistence, TTL and max-age, single flight, eviction and disconnects.

use std::time::Duration;

use reprise_sim::{self as sim, SimConfig};
use serde_json::{json, Value};

use crate::common::*;

#[tokio::test]
async fn identical_requests_hit_and_either_shape_serves_the_other() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    for (stored, first_stream, second_stream, text) in [
        (true, true, "q1"),
        (true, false, "q2"),
        (false, true, "q3"),
        (false, false, "q4"),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (a, b, t))| (i + 1, a, b, t))
    {
        let before = upstream_calls(&sim);
        let body = |stream| chat_body(text, stream);
        let miss = post(&gw, &body(first_stream), &[]).await;
        assert_eq!(outcome(&miss), "miss");
        let original = content(miss, first_stream).await;
        wait_for_entries(&gw, stored).await;
        let hit = post(&gw, &body(second_stream), &[]).await;
        assert_eq!(outcome(&hit), "hit", "{text}");
        let entry = hit.headers()["x-reprise-entry"]
            .to_str()
            .expect("entry")
            .to_owned();
        assert!(entry.starts_with("e_"));
        assert!(hit.headers().contains_key("age"));
        let saved: f64 = hit.headers()["x-reprise-ttft-saved-ms"]
            .to_str()
            .expect("h")
            .parse()
            .expect("num");
        assert!(
            saved >= SIM_TTFT_MS * 0.5,
            "a hit saves about the simulator's TTFT, got {saved}"
        );
        assert_eq!(content(hit, second_stream).await, original, "{text}");
        assert_eq!(
            upstream_calls(&sim) - before,
            1,
            "{text}: upstream called once"
        );
    }
}

#[tokio::test]
async fn hits_get_fresh_ids_and_usage_as_asked() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let body = json!({"model": "sim-model", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "usage please"}]});
    let first = stream_text(post(&gw, &body, &[]).await).await;
    wait_for_entries(&gw, 1).await;
    let second = stream_text(post(&gw, &body, &[]).await).await;
    let id = |text: &str| -> String {
        let (data, _) = parse_sse(text);
        let v: Value = serde_json::from_str(&data[0]).expect("json");
        v["id"].as_str().expect("id").to_owned()
    };
    assert_ne!(id(&first), id(&second));
    assert!(
        second.contains("\"completion_tokens\":8"),
        "FIRST {first}\nSECOND {second}"
    );
    // The same entry without include_usage: no usage chunk at all.
    let plain = json!({"model": "sim-model", "stream": true, "messages": [{"role": "user", "content": "usage please"}]});
    let response = post(&gw, &plain, &[]).await;
    assert_eq!(outcome(&response), "hit");
    let text = stream_text(response).await;
    let (data, _) = parse_sse(&text);
    assert!(!data.iter().any(|d| d.contains("usage")), "{text}");

    // An entry recorded from a stream that asked for no usage cannot give a stream that asks for
    // it what OpenAI would (a usage chunk): a miss, whose answer replaces it; then a hit with usage.
    let question = "no usage recorded";
    let plain = json!({"model": "sim-model", "stream": true, "messages": [{"role": "user", "content": question}]});
    let _ = stream_text(post(&gw, &plain, &[]).await).await;
    wait_for_entries(&gw, 2).await;
    assert_eq!(outcome(&post(&gw, &plain, &[]).await), "hit");
    let mut asking = plain.clone();
    asking["stream_options"] = json!({"include_usage": true});
    let response = post(&gw, &asking, &[]).await;
    assert_eq!(outcome(&response), "miss", "before: a hit without usage");
    let text = stream_text(response).await;
    assert!(text.contains("\"completion_tokens\""), "{text}");
    let mut again = None;
    for _ in 0..200 {
        let response = post(&gw, &asking, &[]).await;
        if outcome(&response) == "hit" {
            again = Some(stream_text(response).await);
            break;
        }
        let _ = stream_text(response).await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let again = again.expect("the answer with usage is stored and served");
    assert!(again.contains("\"completion_tokens\""), "{again}");
    // And it serves the plain stream too, without the usage chunk.
    let response = post(&gw, &plain, &[]).await;
    assert_eq!(outcome(&response), "hit");
    let text = stream_text(response).await;
    let (data, _) = parse_sse(&text);
    assert!(!data.iter().any(|d| d.contains("usage")), "{text}");
}

/// An upstream that ignores `include_usage` (some OpenAI-compatible servers do) would make every
/// stream asking for usage miss, each answer replacing the last: once it has answered such a
/// stream without usage, entries without usage serve those streams.
#[tokio::test]
async fn streams_asking_for_usage_still_hit_when_the_upstream_ignores_it() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let ask = |question: &str, usage: bool| {
        let mut body = json!({"model": "sim-model", "stream": true,
            "messages": [{"role": "user", "content": question}]});
        if usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    };
    let ignoring = [("x-sim-usage", "ignore")];
    let _ = stream_text(post(&gw, &ask("first", false), &ignoring).await).await;
    wait_for_entries(&gw, 1).await;
    // The first stream asking for usage misses; its answer has none.
    let response = post(&gw, &ask("first", true), &ignoring).await;
    assert_eq!(outcome(&response), "miss");
    let text = stream_text(response).await;
    let (data, _) = parse_sse(&text);
    assert!(!data.iter().any(|d| d.contains("\"usage\"")), "{text}");
    // From then on an entry without usage serves such a stream, as the upstream would have.
    let _ = stream_text(post(&gw, &ask("second", false), &ignoring).await).await;
    wait_for_entries(&gw, 2).await;
    let mut outcomes = Vec::new();
    for _ in 0..50 {
        let response = post(&gw, &ask("second", true), &ignoring).await;
        outcomes.push(outcome(&response));
        let _ = stream_text(response).await;
        if outcomes.last().is_some_and(|o| o == "hit") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        outcomes.first().map(String::as_str),
        Some("hit"),
        "{outcomes:?}"
    );
}

/// Some servers put `"usage": null` on every chunk even when usage was not asked for. An entry
/// recorded from such a stream has no usage to give, so a stream asking for usage misses, and
/// the answer that replaces it (with its usage chunk) serves the next one with usage.
#[tokio::test]
async fn a_usage_member_of_null_on_every_chunk_is_not_usage() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let ask = |usage: bool| {
        let mut body = json!({"model": "sim-model", "stream": true,
            "messages": [{"role": "user", "content": "nulls"}]});
        if usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    };
    let nulls = [("x-sim-usage", "nulls")];
    let text = stream_text(post(&gw, &ask(false), &nulls).await).await;
    assert!(text.contains("\"usage\":null"), "{text}");
    wait_for_entries(&gw, 1).await;
    let response = post(&gw, &ask(true), &nulls).await;
    assert_eq!(outcome(&response), "miss");
    let text = stream_text(response).await;
    assert!(text.contains("\"completion_tokens\""), "{text}");
    let mut outcomes = Vec::new();
    for _ in 0..50 {
        let response = post(&gw, &ask(true), &nulls).await;
        outcomes.push(outcome(&response));
        let text = stream_text(response).await;
        if outcomes.last().is_some_and(|o| o == "hit") {
            assert!(text.contains("\"completion_tokens\""), "{text}");
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        outcomes.last().map(String::as_str),
        Some("hit"),
        "{outcomes:?}"
    );
}

#[tokio::test]
async fn requests_that_differ_in_what_shapes_the_answer_never_share_an_entry() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let base = json!({"model": "sim-model", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "First question"},
        {"role": "assistant", "content": "First answer"},
        {"role": "user", "content": "What is a cache?"}
    ]});
    let miss = post(&gw, &base, &[]).await;
    assert_eq!(outcome(&miss), "miss");
    content(miss, false).await;
    wait_for_entries(&gw, 1).await;
    // Whitespace at the ends of the final turn does not matter.
    let mut same = base.clone();
    same["messages"][3]["content"] = json!("  What is a cache?\r\n");
    assert_eq!(outcome(&post(&gw, &same, &[]).await), "hit");

    let mut variants: Vec<(&str, Value)> = Vec::new();
    let mut v = base.clone();
    v["messages"][0]["content"] = json!("Be verbose.");
    variants.push(("system prompt", v));
    let mut v = base.clone();
    v["messages"][2]["content"] = json!("Another answer");
    variants.push(("earlier turn", v));
    let mut v = base.clone();
    v["temperature"] = json!(0.2);
    variants.push(("temperature", v));
    let mut v = base.clone();
    v["tools"] = json!([{"type": "function", "function": {"name": "f", "parameters": {}}}]);
    variants.push(("tools", v.clone()));
    v["tool_choice"] = json!("none");
    variants.push(("tool_choice", v));
    let mut v = base.clone();
    v["model"] = json!("sim-model-2");
    variants.push(("model", v));
    for (what, body) in variants {
        let response = post(&gw, &body, &[]).await;
        assert_eq!(outcome(&response), "miss", "different {what} must miss");
        content(response, false).await;
    }
    // Another API key is another tenant.
    let other = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-tenant-b")
        .json(&base)
        .send()
        .await
        .expect("send");
    assert_eq!(outcome(&other), "miss", "another API key must miss");
    // A namespace separates entries too.
    assert_eq!(
        outcome(&post(&gw, &base, &[("x-reprise-namespace", "team-b")]).await),
        "miss"
    );
}

#[tokio::test]
async fn failed_partial_and_refused_answers_are_never_stored() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    // (what, request, headers of the first attempt)
    type Case<'a> = (&'a str, Value, Vec<(&'a str, &'a str)>);
    let cases: Vec<Case> = vec![
        (
            "upstream 500",
            chat_body("s1", false),
            vec![("x-sim-fault", "status=500")],
        ),
        (
            "cut stream",
            chat_body("s2", true),
            vec![("x-sim-fault", "cut=3")],
        ),
        (
            "aborted stream",
            chat_body("s3", true),
            vec![("x-sim-fault", "abort=3")],
        ),
        (
            "malformed event",
            chat_body("s4", true),
            vec![("x-sim-fault", "malformed=2")],
        ),
        (
            "error event",
            chat_body("s5", true),
            vec![("x-sim-fault", "error-event=2")],
        ),
        (
            "finish_reason length",
            json!({"model": "sim-model", "max_tokens": 3, "messages": [{"role": "user", "content": "s6"}]}),
            vec![],
        ),
        (
            "invalid tool arguments",
            json!({"model": "sim-model", "stream": true, "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}],
            "messages": [{"role": "user", "content": "s7"}]}),
            vec![("x-sim-fault", "bad-tool-args")],
        ),
        (
            "client said no-store",
            chat_body("s8", false),
            vec![("cache-control", "no-store")],
        ),
        (
            "cache mode off",
            chat_body("s9", true),
            vec![("x-reprise-cache-mode", "off")],
        ),
        (
            "cache mode read-only",
            chat_body("s10", false),
            vec![("x-reprise-cache-mode", "read-only")],
        ),
    ];
    for (what, body, headers) in cases {
        let stream = body["stream"].as_bool().unwrap_or(false);
        let first = post(&gw, &body, &headers).await;
        let _ = first.bytes().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = upstream_calls(&sim);
        let again = post(&gw, &body, &[]).await;
        assert_ne!(outcome(&again), "hit", "{what} must not have been stored");
        let _ = content(again, stream).await;
        assert_eq!(
            upstream_calls(&sim) - before,
            1,
            "{what}: went upstream again"
        );
    }
    // The one stored answer above is the clean retry of each case (a tool call with valid JSON and
    // the length-capped answer excluded), never the failed one.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for id in 0..gw.state.cache.store.len() as u64 + 20 {
        if let Ok(Some(entry)) = gw.state.cache.store.get(reprise_server::entry::EntryId(id)) {
            let reason = entry
                .body
                .pointer("/choices/0/finish_reason")
                .and_then(Value::as_str);
            assert!(
                matches!(reason, Some("stop" | "tool_calls")),
                "stored {reason:?}"
            );
        }
    }
}

#[tokio::test]
async fn length_answers_are_stored_when_configured() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.cache_length_finish = true;
    let gw = start(config).await;
    let body = json!({"model": "sim-model", "max_tokens": 3, "messages": [{"role": "user", "content": "len"}]});
    content(post(&gw, &body, &[]).await, false).await;
    wait_for_entries(&gw, 1).await;
    assert_eq!(outcome(&post(&gw, &body, &[]).await), "hit");
}

#[tokio::test]
async fn request_controls_refresh_bypass_ttl_and_max_age() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let body = chat_body("controls", false);
    content(post(&gw, &body, &[("x-reprise-ttl", "1")]).await, false).await;
    wait_for_entries(&gw, 1).await;
    assert_eq!(outcome(&post(&gw, &body, &[]).await), "hit");
    assert_eq!(
        outcome(&post(&gw, &body, &[("x-reprise-cache-mode", "off")]).await),
        "bypass"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Expired after its one-second TTL.
    let expired = post(&gw, &body, &[]).await;
    assert_eq!(outcome(&expired), "miss");
    content(expired, false).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(outcome(&post(&gw, &body, &[]).await), "hit");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // One second old: too old for max-age=0, fine without it.
    let strict = post(&gw, &body, &[("cache-control", "max-age=0")]).await;
    assert_eq!(outcome(&strict), "miss");
    content(strict, false).await;
    let before = upstream_calls(&sim);
    let refreshed = post(&gw, &body, &[("cache-control", "no-cache")]).await;
    assert_eq!(outcome(&refreshed), "refresh");
    content(refreshed, false).await;
    assert_eq!(upstream_calls(&sim) - before, 1);
    // Bad control values are the client's error, with the header named.
    let bad = post(&gw, &body, &[("x-reprise-ttl", "soon")]).await;
    assert_eq!(bad.status(), 400);
    let err: Value = bad.json().await.expect("json");
    assert_eq!(err["error"]["param"], "x-reprise-ttl");
}

#[tokio::test]
async fn entries_survive_a_restart_on_the_same_data_dir() {
    let sim = sim_default().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let gw = start(config_in(sim.base_url(), dir.path().to_owned())).await;
    let body = chat_body("persist me", true);
    let original = content(post(&gw, &body, &[]).await, true).await;
    wait_for_entries(&gw, 1).await;
    let store = std::sync::Arc::downgrade(&gw.state.cache.store);
    gw.shutdown().await.expect("shutdown");
    assert!(store.upgrade().is_none(), "shutdown releases the store");
    // A clean shutdown leaves the store's ledger, which the next start reads instead of every entry.
    assert!(
        dir.path().join("ledger").exists(),
        "ledger written at close"
    );
    let gw = start(config_in(sim.base_url(), dir.path().to_owned())).await;
    assert!(!dir.path().join("ledger").exists(), "taken at open");
    let before = upstream_calls(&sim);
    let hit = post(&gw, &body, &[]).await;
    assert_eq!(outcome(&hit), "hit");
    assert_eq!(content(hit, true).await, original);
    assert_eq!(upstream_calls(&sim), before);
}

#[tokio::test]
async fn concurrent_identical_requests_make_one_upstream_call() {
    let sim = sim::spawn(SimConfig {
        ttft_ms: 300.0,
        itl_ms: 5.0,
        tokens: 10,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    let gw = start(config_for(sim.base_url())).await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let url = gw.url("/v1/chat/completions");
        let stream = i % 2 == 0;
        tasks.push(tokio::spawn(async move {
            let response = client()
                .post(url)
                .bearer_auth("sk-tenant-a")
                .json(&chat_body("everyone at once", stream))
                .send()
                .await
                .expect("send");
            let o = outcome(&response);
            (o, content(response, stream).await)
        }));
    }
    let mut outcomes = Vec::new();
    let mut texts = Vec::new();
    for t in tasks {
        let (o, text) = t.await.expect("task");
        outcomes.push(o);
        texts.push(text);
    }
    assert_eq!(
        sim.stats.snapshot().chat_completions,
        1,
        "outcomes: {outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| *o == "miss").count(),
        1,
        "{outcomes:?}"
    );
    assert!(
        outcomes.iter().filter(|o| *o == "coalesced").count() >= 10,
        "{outcomes:?}"
    );
    assert!(texts.iter().all(|t| t == &texts[0] && !t.is_empty()));
}

/// A follower reading a leader's stream ends as the leader's client did: with the upstream's own
/// error event when the upstream sent one, and with a clean end when the stream was complete but
/// not stored (a `length` finish, which the default rules refuse).
#[tokio::test]
async fn a_follower_ends_its_stream_as_the_leaders_client_saw_it_end() {
    let sim = sim_default().await;
    let gw = std::sync::Arc::new(start(config_for(sim.base_url())).await);
    let mut length = chat_body("follow length", true);
    length["max_tokens"] = json!(4);
    let cases = [
        (
            "error event",
            chat_body("follow an error", true),
            Some(("x-sim-fault", "error-event=3")),
        ),
        ("length", length, None),
    ];
    for (case, body, fault) in cases {
        let mut headers = vec![("x-sim-ttft-ms", "300"), ("x-sim-itl-ms", "40")];
        headers.extend(fault);
        let mut tasks = Vec::new();
        for i in 0..2 {
            let (gw, headers, body) = (gw.clone(), headers.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                let response = post(&gw, &body, &headers).await;
                (outcome(&response), stream_text(response).await)
            }));
            if i == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        let mut seen = Vec::new();
        for t in tasks {
            seen.push(t.await.expect("task"));
        }
        // Whichever reached the flight first leads (the other was sent 50 ms later).
        seen.sort_by(|a, b| b.0.cmp(&a.0));
        let outcomes: Vec<&str> = seen.iter().map(|(o, _)| o.as_str()).collect();
        assert_eq!(outcomes, ["miss", "coalesced"], "{case}");
        let (data, _) = parse_sse(&seen[1].1);
        if case == "error event" {
            let last = data.last().expect("events");
            assert!(
                last.contains("The server had an error"),
                "{case}: {}",
                seen[1].1
            );
            assert!(!seen[1].1.contains("coalesced leader"), "{}", seen[1].1);
        } else {
            assert_eq!(
                data.last().map(String::as_str),
                Some("[DONE]"),
                "{}",
                seen[1].1
            );
            assert!(!seen[1].1.contains("\"error\""), "{}", seen[1].1);
        }
    }
}

/// A browser reads a cross-origin answer only with the upstream's CORS headers. A hit is the
/// gateway's own answer: it carries what the upstream last answered the request's origin (for
/// that key), and a request from an origin the upstream has not answered yet goes upstream to
/// learn it, storing nothing over the entry that would have served it. An error answer teaches
/// nothing. No origin, no CORS headers; an origin the upstream refused gets none on a hit either.
/// The gateway's own errors carry the same answer, so a browser can read them.
#[tokio::test]
async fn hits_carry_the_upstreams_cors_answer_to_the_requests_origin() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    // The hung upstream below is a gateway timeout in a second, not ten minutes.
    config.first_byte_timeout_ms = 1_000;
    let gw = start(config).await;
    let app = ("origin", "https://app.example");
    let allow = |r: &reqwest::Response| {
        r.headers()
            .get("access-control-allow-origin")
            .map(|v| v.to_str().expect("ascii").to_owned())
    };
    let entry = |r: &reqwest::Response| {
        r.headers()
            .get("x-reprise-entry")
            .map(|v| v.to_str().expect("ascii").to_owned())
    };
    let ask = |stream: bool| chat_body("asked from a browser", stream);
    let miss = post(&gw, &ask(false), &[app]).await;
    assert_eq!(
        (outcome(&miss), allow(&miss)),
        ("miss".into(), Some("*".into()))
    );
    content(miss, false).await;
    wait_for_entries(&gw, 1).await;
    let mut served = None;
    for stream in [false, true] {
        let hit = post(&gw, &ask(stream), &[app]).await;
        assert_eq!(outcome(&hit), "hit", "stream {stream}");
        // The id the page may read (the upstream exposes it) names the hit, as on a miss.
        assert!(header(&hit, "x-request-id").is_some_and(|id| id.starts_with("req_")));
        assert_eq!(
            header(&hit, "x-request-id"),
            header(&hit, "x-reprise-request-id")
        );
        assert_eq!(allow(&hit).as_deref(), Some("*"), "stream {stream}");
        assert_eq!(
            hit.headers()
                .get("access-control-expose-headers")
                .map(|v| v.as_bytes()),
            Some(&b"x-request-id"[..])
        );
        served = entry(&hit);
        content(hit, stream).await;
    }
    // No origin (the SDKs outside a browser): a hit, as before, with no CORS headers.
    let plain = post(&gw, &ask(false), &[]).await;
    assert_eq!((outcome(&plain), allow(&plain)), ("hit".into(), None));
    // The gateway's own errors, in OpenAI's shape, readable by the page: a body that is not JSON
    // (refused before anything else is read of it), and an upstream that never answers.
    let broken = client()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-tenant-a")
        .header("origin", "https://app.example")
        .header("content-type", "application/json")
        .body("{\"model\": ")
        .send()
        .await
        .expect("send");
    assert_eq!(broken.status(), 400);
    assert_eq!(allow(&broken).as_deref(), Some("*"));
    assert_eq!(
        header(&broken, "x-request-id"),
        header(&broken, "x-reprise-request-id")
    );
    let error: Value = broken.json().await.expect("json");
    assert!(error["error"]["message"].is_string(), "{error}");
    let hung = post(
        &gw,
        &chat_body("never answered", false),
        &[app, ("x-sim-fault", "hang")],
    )
    .await;
    assert_eq!(hung.status(), 504);
    assert_eq!(allow(&hung).as_deref(), Some("*"));
    let unread = post(
        &gw,
        &chat_body("never answered", false),
        &[("x-sim-fault", "hang")],
    )
    .await;
    assert_eq!(
        (unread.status().as_u16(), allow(&unread)),
        (504, None),
        "no origin"
    );
    // Another origin: an upstream error teaches nothing; then one miss to hear the upstream's
    // answer, which leaves the entry as it was; then hits.
    let other = ("origin", "https://other.example");
    let failed = post(&gw, &ask(false), &[other, ("x-sim-fault", "status=429")]).await;
    assert_eq!(failed.status(), 429);
    let calls = upstream_calls(&sim);
    let first = post(&gw, &ask(false), &[other]).await;
    assert_eq!(
        (outcome(&first), allow(&first)),
        ("miss".into(), Some("*".into()))
    );
    content(first, false).await;
    assert_eq!(upstream_calls(&sim), calls + 1);
    let again = post(&gw, &ask(false), &[other]).await;
    assert_eq!(
        (outcome(&again), allow(&again)),
        ("hit".into(), Some("*".into()))
    );
    assert_eq!(entry(&again), served, "the entry that served before");
    // Another key from the same origin is another asker: it learns for itself.
    let other_key = [app, ("authorization", "Bearer sk-tenant-b")];
    let first = post_to(&gw, "/v1/chat/completions", &ask(false), &other_key).await;
    assert_eq!(outcome(&first), "miss");
    content(first, false).await;
    // An origin the upstream grants nothing gets nothing from a hit either.
    let denied = [("origin", "https://denied.example"), ("x-sim-cors", "deny")];
    let first = post(&gw, &ask(false), &denied).await;
    assert_eq!((outcome(&first), allow(&first)), ("miss".into(), None));
    content(first, false).await;
    let again = post(&gw, &ask(false), &denied).await;
    assert_eq!((outcome(&again), allow(&again)), ("hit".into(), None));
}

#[tokio::test]
async fn eviction_keeps_the_store_under_its_caps() {
    let sim = sim::spawn(SimConfig {
        ttft_ms: 1.0,
        itl_ms: 0.0,
        tokens: 8,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    let mut config = config_for(sim.base_url());
    config.max_entries = 5;
    config.sweep_interval_ms = 20;
    let gw = start(config).await;
    for i in 0..15 {
        content(
            post(&gw, &chat_body(&format!("evict {i}"), false), &[]).await,
            false,
        )
        .await;
    }
    let mut len = usize::MAX;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        len = gw.state.cache.store.len();
        if len <= 5 {
            break;
        }
    }
    assert!(len <= 5, "store holds {len} entries, cap is 5");
    // The most recent answer is still there.
    assert_eq!(
        outcome(&post(&gw, &chat_body("evict 14", false), &[]).await),
        "hit"
    );
}

#[tokio::test]
async fn a_stream_whose_client_left_is_still_cached() {
    let sim = sim::spawn(SimConfig {
        ttft_ms: 20.0,
        itl_ms: 20.0,
        tokens: 15,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    let gw = start(config_for(sim.base_url())).await;
    let body = chat_body("leaving early", true);
    let mut response = post(&gw, &body, &[]).await;
    // Read the first bytes, then hang up.
    let _ = response.chunk().await.expect("first chunk");
    drop(response);
    wait_for_entries(&gw, 1).await;
    let before = upstream_calls(&sim);
    let hit = post(&gw, &body, &[]).await;
    assert_eq!(outcome(&hit), "hit");
    assert!(!content(hit, true).await.is_empty());
    assert_eq!(upstream_calls(&sim), before);
}

#[tokio::test]
async fn recorded_pacing_replays_the_original_rhythm() {
    let sim = sim::spawn(SimConfig {
        ttft_ms: 20.0,
        itl_ms: 15.0,
        tokens: 10,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    let gw = start(config_for(sim.base_url())).await;
    let body = chat_body("pace me", true);
    content(post(&gw, &body, &[]).await, true).await;
    wait_for_entries(&gw, 1).await;
    let started = std::time::Instant::now();
    let hit = post(&gw, &body, &[("x-reprise-replay", "recorded")]).await;
    assert_eq!(outcome(&hit), "hit");
    content(hit, true).await;
    // Nine gaps of 15 ms were recorded; a replay that ignored them would end at once.
    assert!(
        started.elapsed() >= Duration::from_millis(90),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn embeddings_and_legacy_completions_are_cached_too() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    for (path, body) in [
        (
            "/v1/embeddings",
            json!({"model": "sim-embedding", "input": ["a", "b"]}),
        ),
        (
            "/v1/completions",
            json!({"model": "sim-model", "prompt": "Once upon"}),
        ),
    ] {
        let send = || {
            client()
                .post(gw.url(path))
                .bearer_auth("sk-a")
                .json(&body)
                .send()
        };
        let first = send().await.expect("send");
        assert_eq!(outcome(&first), "miss");
        let first: Value = first.json().await.expect("json");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let second = send().await.expect("send");
        assert_eq!(outcome(&second), "hit", "{path}");
        let second: Value = second.json().await.expect("json");
        assert_eq!(first.get("data"), second.get("data"));
        assert_eq!(
            first.pointer("/choices/0/text"),
            second.pointer("/choices/0/text")
        );
    }
}

/// Issue 14: `x-reprise-replay: tokens-per-second=1e-300` on a streamed hit panicked the worker
/// (a `Duration` overflow in pacing) and the client got an empty reply. Now a 400 naming the
/// header, and the gateway keeps serving paced hits.
#[tokio::test]
async fn an_absurd_replay_rate_is_a_400_not_a_panic() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.semantic = false;
    let gw = start(config).await;
    let body = chat_body("pace me", true);
    let miss = post(&gw, &body, &[]).await;
    let original = content(miss, true).await;
    wait_for_entries(&gw, 1).await;
    for rate in ["1e-300", "5e-324", "1e-19"] {
        let value = format!("tokens-per-second={rate}");
        let hit = post(&gw, &body, &[("x-reprise-replay", &value)]).await;
        assert_eq!(hit.status(), 400, "{value}");
        let err: Value = hit.json().await.expect("json");
        assert_eq!(err["error"]["param"], "x-reprise-replay", "{err}");
        assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
    }
    let hit = post(
        &gw,
        &body,
        &[("x-reprise-replay", "tokens-per-second=1000")],
    )
    .await;
    assert_eq!(outcome(&hit), "hit");
    assert_eq!(content(hit, true).await, original);
}

/// An answer larger than `max_entry_bytes` reaches every client whole, and is not stored: not by
/// its leader (whose recording stops at the cap), nor through its flight. Followers already reading
/// the leader's stream finish it as it came; those waiting for the stored answer are told at the
/// cap that there will be none, and ask the upstream themselves. Before, the whole stream was kept
/// (as parsed JSON, twice) and stored however large it was.
#[tokio::test]
async fn an_answer_over_max_entry_bytes_is_relayed_whole_and_not_stored() {
    let sim = sim::spawn(SimConfig {
        // Long enough that all eight requests reach the gateway before the leader's first token
        // even on a loaded machine (at 300 ms, a busy CI box sent them one after another: eight
        // misses and no follower).
        ttft_ms: 1_500.0,
        // A follower that has not read its first chunk by the time the leader relayed the tape's
        // window (1 MiB, about 5,000 of these chunks) lags and goes upstream itself: at 0.2 ms a
        // chunk that left about a second, which full-suite runs beside other tests sometimes did
        // not give (eight misses); at 1 ms it is five.
        itl_ms: 1.0,
        tokens: 6_000,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    // The same answer straight from the upstream, for what "whole" means.
    let direct = client()
        .post(format!("{}/chat/completions", sim.base_url()))
        .json(&chat_body("a long answer", true))
        .send()
        .await
        .expect("send");
    let expected = content(direct, true).await;
    let expected_chunks = {
        let direct = client()
            .post(format!("{}/chat/completions", sim.base_url()))
            .json(&chat_body("a long answer", true))
            .send()
            .await
            .expect("send");
        let (data, _) = parse_sse(&stream_text(direct).await);
        data.iter()
            .filter(|d| *d != "[DONE]")
            .map(|d| normalized(d))
            .collect::<Vec<_>>()
    };
    let mut config = config_for(sim.base_url());
    // 6,000 chunks of about 200 bytes (a body of about 45 kB): both shapes are over the cap.
    config.max_entry_bytes = 20_000;
    let gw = start(config).await;
    let calls_before = upstream_calls(&sim);
    let mut tasks = Vec::new();
    for i in 0..8 {
        if i == 1 {
            // The streamed request leads (its flight is what streamed followers follow); with
            // all eight spawned at once a loaded machine sometimes let a non-streamed one lead.
            // The upstream takes 1.5 s to its first token: the others still arrive in flight.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let url = gw.url("/v1/chat/completions");
        let stream = i % 2 == 0;
        tasks.push(tokio::spawn(async move {
            let response = client()
                .post(url)
                .bearer_auth("sk-tenant-a")
                .json(&chat_body("a long answer", stream))
                .send()
                .await
                .expect("send");
            let status = response.status().as_u16();
            let o = outcome(&response);
            let store = header(&response, "x-reprise-store");
            if stream {
                let text = stream_text(response).await;
                let (data, _) = parse_sse(&text);
                assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{o}");
                let chunks: Vec<Value> = data
                    .iter()
                    .filter(|d| *d != "[DONE]")
                    .map(|d| normalized(d))
                    .collect();
                (status, o, store, Some(chunks))
            } else {
                let body: Value = response.json().await.expect("json");
                let text = body
                    .pointer("/choices/0/message/content")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                (status, o, store, Some(vec![json!(text)]))
            }
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.expect("task"));
    }
    for (i, (status, o, store, got)) in results.iter().enumerate() {
        assert_eq!(*status, 200, "request {i} ({o})");
        let got = got.as_ref().expect("answer");
        if i % 2 == 0 {
            // Streamed: every chunk of the upstream's, in order (the leader's bytes untouched; a
            // coalesced follower renders the same chunks with its own identity).
            assert_eq!(got, &expected_chunks, "request {i} ({o})");
        } else {
            assert_eq!(got, &vec![json!(expected.clone())], "request {i} ({o})");
            // A whole answer says it was not stored, and why.
            if o == "miss" {
                assert_eq!(store.as_deref(), Some("skipped; reason=too_large"));
            }
        }
    }
    let outcomes: Vec<&str> = results.iter().map(|r| r.1.as_str()).collect();
    // Followers were there (the upstream takes 1.5 s to its first token), and the non-streamed
    // ones, told there would be nothing stored, went upstream themselves.
    let calls = upstream_calls(&sim) - calls_before;
    assert!(calls > 1, "{outcomes:?}");
    assert!(
        outcomes.contains(&"coalesced"),
        "streamed followers follow the leader's stream: {outcomes:?}"
    );
    // Nothing was stored: not now, not later.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.state.cache.drain();
    assert_eq!(gw.state.cache.store.len(), 0, "{outcomes:?}");
    let again = post(&gw, &chat_body("a long answer", false), &[]).await;
    assert_eq!(outcome(&again), "miss");
    assert_eq!(content(again, false).await, expected);
    // Each request that recorded the answer counted it, and its record says so.
    let metrics = metrics(&gw).await;
    let skipped: u64 = metrics
        .lines()
        .find(|l| l.starts_with("reprise_store_skipped_total{reason=\"too_large\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert_eq!(skipped, calls + 1, "{metrics}");
    let records = gw.state.requests.recent(100);
    assert!(
        records
            .iter()
            .filter(|r| r.cache == reprise_server::outcome::CacheOutcome::Miss)
            .all(|r| r.store_skipped.as_deref() == Some("too_large")),
        "{records:?}"
    );
    // Below the cap the same answer is stored as before.
    let mut config = config_for(sim.base_url());
    config.max_entry_bytes = 8 << 20;
    let roomy = start(config).await;
    content(
        post(&roomy, &chat_body("a long answer", true), &[]).await,
        true,
    )
    .await;
    wait_for_entries(&roomy, 1).await;
    let hit = post(&roomy, &chat_body("a long answer", true), &[]).await;
    assert_eq!(outcome(&hit), "hit");
}
