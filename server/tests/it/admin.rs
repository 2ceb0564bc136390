//! The admin API end to end: auth on every route, stats and `/metrics` consistent with the traffic
//! sent, entry listing and pagination, show with hit history, delete, warm-then-hit, invalidation
//! counts, flush, live configuration, the OpenAPI document, and semantic search with the real model.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

const TOKEN: &str = "admin-secret";

async fn admin_get(gw: &Gateway, path: &str) -> reqwest::Response {
    client()
        .get(gw.url(path))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("send")
}

async fn admin_send(
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let response = client()
        .request(method, gw.url(path))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    (status, response.json().await.expect("json"))
}

/// A quick gateway: writes and hit bookkeeping land within ~20 ms.
async fn gateway(sim: &reprise_sim::SimHandle) -> Gateway {
    let mut config = config_for(sim.base_url());
    config.sweep_interval_ms = 20;
    config.semantic = false;
    start(config).await
}

/// Sends `prompt` as a miss and waits until it is stored.
async fn store_prompt(gw: &Gateway, prompt: &str, headers: &[(&str, &str)]) {
    let before = gw.state.cache.store.len();
    let response = post(gw, &chat_body(prompt, false), headers).await;
    assert_eq!(outcome(&response), "miss", "{prompt}");
    let _ = response.bytes().await;
    wait_for_entries(gw, before + 1).await;
}

/// The `reprise_requests_total` value for a cache outcome, summed over routes.
fn requests_total(metrics: &str, cache: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("reprise_requests_total{") && l.contains(&format!("cache=\"{cache}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn every_admin_route_needs_the_token_and_is_off_without_one() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let routes: [(reqwest::Method, &str); 15] = [
        (reqwest::Method::GET, "/admin/stats"),
        (reqwest::Method::GET, "/admin/entries"),
        (reqwest::Method::POST, "/admin/entries"),
        (reqwest::Method::GET, "/admin/entries/e_000000000001"),
        (reqwest::Method::DELETE, "/admin/entries/e_000000000001"),
        (reqwest::Method::POST, "/admin/invalidate"),
        (reqwest::Method::POST, "/admin/flush"),
        (reqwest::Method::GET, "/admin/config"),
        (reqwest::Method::PATCH, "/admin/config"),
        (reqwest::Method::GET, "/admin/requests"),
        (reqwest::Method::GET, "/admin/shadow"),
        (reqwest::Method::GET, "/admin/feedback"),
        (reqwest::Method::POST, "/admin/feedback"),
        (reqwest::Method::GET, "/admin/openapi.json"),
        (reqwest::Method::GET, "/metrics"),
    ];
    for (method, path) in &routes {
        for token in [
            None,
            Some("wrong"),
            Some("admin-secre"),
            Some("admin-secret2"),
        ] {
            let mut request = client()
                .request(method.clone(), gw.url(path))
                .json(&json!({}));
            if let Some(t) = token {
                request = request.bearer_auth(t);
            }
            let response = request.send().await.expect("send");
            assert_eq!(response.status(), 401, "{method} {path} with {token:?}");
            assert_eq!(
                response
                    .headers()
                    .get("www-authenticate")
                    .map(|v| v.as_bytes()),
                Some(&b"Bearer"[..])
            );
            let body: Value = response.json().await.expect("json");
            assert_eq!(body["error"]["type"], "authentication_error");
            assert_eq!(body["error"]["code"], "invalid_admin_token");
        }
    }
    // Flush with a wrong token must not have flushed anything.
    store_prompt(&gw, "still here", &[]).await;
    let response = client()
        .post(gw.url("/admin/flush"))
        .bearer_auth("nope")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 401);
    assert_eq!(gw.state.cache.store.len(), 1);
    // The dashboard shell opens without the token (it asks for it) and carries no data.
    let page = client()
        .get(gw.url("/admin/ui"))
        .send()
        .await
        .expect("send");
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .starts_with("text/html"));
    assert!(page.headers().contains_key("content-security-policy"));
    assert!(!page.text().await.expect("text").contains("still here"));

    let mut config = config_for(sim.base_url());
    config.admin_token = None;
    config.semantic = false;
    let closed = start(config).await;
    for (method, path) in routes.iter().chain([&(reqwest::Method::GET, "/admin/ui")]) {
        let response = client()
            .request(method.clone(), closed.url(path))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("send");
        assert_eq!(
            response.status(),
            404,
            "{method} {path} without a configured token"
        );
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "admin_disabled");
    }
}

#[tokio::test]
async fn stats_and_metrics_agree_with_the_traffic_sent() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    for i in 0..3 {
        store_prompt(&gw, &format!("stats question {i}"), &[]).await;
    }
    // Two exact hits per prompt, one streamed and one not; one bypass; one bad request.
    for i in 0..3 {
        for stream in [true, false] {
            let response = post(&gw, &chat_body(&format!("stats question {i}"), stream), &[]).await;
            assert_eq!(outcome(&response), "hit");
            let _ = content(response, stream).await;
        }
    }
    let response = post(
        &gw,
        &chat_body("stats question 0", false),
        &[("cache-control", "no-store, no-cache")],
    )
    .await;
    assert_eq!(outcome(&response), "bypass");
    let _ = response.bytes().await;
    let bad = post(&gw, &json!({"model": "sim-model", "messages": "nope"}), &[]).await;
    assert_eq!(bad.status(), 400);
    // Records are written when the last byte is taken: give the delivery callbacks a moment.
    tokio::time::sleep(Duration::from_millis(100)).await;

    let stats = admin_json(&gw, "/admin/stats").await;
    assert_eq!(stats["object"], "reprise.stats");
    assert_eq!(stats["mode"], "exact-only");
    assert!(stats["index"].is_null() && stats["embedding"].is_null());
    let r = &stats["requests"];
    assert_eq!(
        (r["miss"].as_u64(), r["hit"].as_u64(), r["bypass"].as_u64()),
        (Some(3), Some(6), Some(1))
    );
    assert_eq!(r["semantic-hit"], 0);
    assert_eq!(stats["store"]["entries"], 3);
    let hit_rate = stats["rates"]["hit"].as_f64().expect("rate");
    assert!(
        (hit_rate - 0.6).abs() < 1e-9,
        "6 hits of 10 cacheable: {hit_rate}"
    );
    // Every hit saved the sim's prefill (60 ms) minus its own TTFT.
    let saved = &stats["ttft_saved_ms"];
    assert_eq!(saved["hits"], 6);
    assert!(
        saved["per_hit"].as_f64().expect("per hit") > SIM_TTFT_MS * 0.5,
        "{saved}"
    );
    let by = &stats["latency"]["by_outcome"];
    assert_eq!(by["hit"]["count"], 6);
    assert_eq!(by["miss"]["count"], 3);
    let hit_ttft = by["hit"]["phases"]["ttft_ms"]["p50"]
        .as_f64()
        .expect("hit ttft");
    let miss_ttft = by["miss"]["phases"]["ttft_ms"]["p50"]
        .as_f64()
        .expect("miss ttft");
    assert!(
        miss_ttft >= SIM_TTFT_MS && hit_ttft < miss_ttft,
        "{hit_ttft} vs {miss_ttft}"
    );
    assert!(
        by["hit"]["phases"]["upstream_send_ms"].is_null(),
        "a hit has no upstream"
    );
    assert_eq!(
        stats["ttft_histogram"]["by_outcome"]["hit"]
            .as_array()
            .map(|b| b.iter().filter_map(Value::as_u64).sum::<u64>()),
        Some(6)
    );
    let bucket = stats["timeline"]["buckets"]
        .as_array()
        .and_then(|b| b.last())
        .cloned()
        .expect("bucket");
    assert!(bucket["hit"].as_u64() >= Some(1));

    let response = admin_get(&gw, "/metrics").await;
    assert!(response.headers()["content-type"]
        .to_str()
        .expect("ascii")
        .starts_with("text/plain"));
    let metrics = response.text().await.expect("text");
    assert_eq!(requests_total(&metrics, "miss"), 3);
    assert_eq!(requests_total(&metrics, "hit"), 6);
    assert_eq!(requests_total(&metrics, "bypass"), 1);
    assert!(metrics.contains("reprise_cache_entries 3"), "{metrics}");
    assert!(
        metrics.contains("reprise_ttft_seconds_count{cache=\"hit\",route=\"chat.completions\"} 6")
    );
    let saved_s: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("reprise_ttft_saved_seconds_total "))
        .and_then(|v| v.parse().ok())
        .expect("saved counter");
    assert!((saved_s * 1e3 - saved["total"].as_f64().expect("total")).abs() < 1.0);
    // No prompt ever becomes a label.
    assert!(!metrics.contains("stats question"));
}

#[tokio::test]
async fn entries_page_newest_first_filter_show_and_delete() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    for i in 0..5 {
        store_prompt(&gw, &format!("page prompt {i}"), &[]).await;
    }
    store_prompt(
        &gw,
        "namespaced prompt",
        &[("x-reprise-namespace", "support")],
    )
    .await;

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/admin/entries?limit=2&cursor={c}"),
            None => "/admin/entries?limit=2".to_owned(),
        };
        let page = admin_json(&gw, &path).await;
        pages += 1;
        let data = page["data"].as_array().expect("data");
        assert!(data.len() <= 2);
        seen.extend(
            data.iter()
                .map(|e| e["prompt"].as_str().expect("prompt").to_owned()),
        );
        if page["has_more"] == false {
            assert!(page["next_cursor"].is_null());
            break;
        }
        cursor = page["next_cursor"].as_str().map(str::to_owned);
    }
    assert_eq!(pages, 3);
    assert_eq!(
        seen,
        [
            "namespaced prompt",
            "page prompt 4",
            "page prompt 3",
            "page prompt 2",
            "page prompt 1",
            "page prompt 0"
        ]
    );
    let support = admin_json(&gw, "/admin/entries?namespace=support").await;
    assert_eq!(support["data"].as_array().map(Vec::len), Some(1));
    assert_eq!(support["data"][0]["namespace"], "support");
    assert_eq!(
        admin_json(&gw, "/admin/entries?model=other").await["data"],
        json!([])
    );
    for (path, param) in [
        ("/admin/entries?limit=0", "limit"),
        ("/admin/entries?limit=201", "limit"),
        ("/admin/entries?limit=abc", "limit"),
        ("/admin/entries?cursor=zzz", "cursor"),
        ("/admin/entries/zzz", "id"),
    ] {
        let response = admin_get(&gw, path).await;
        assert_eq!(response.status(), 400, "{path}");
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["param"], param, "{path}");
    }
    // In exact-only mode a search by meaning is refused, not silently empty.
    let response = admin_get(&gw, "/admin/entries?q=password").await;
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "semantic_disabled");

    // Show: the whole record, and hits land in its history.
    let newest = admin_json(&gw, "/admin/entries?limit=6").await;
    let id = newest["data"][5]["id"].as_str().expect("id").to_owned();
    let hit = post(&gw, &chat_body("page prompt 0", true), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let request_id = hit.headers()["x-reprise-request-id"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let _ = content(hit, true).await;
    let mut detail = Value::Null;
    for _ in 0..100 {
        detail = admin_json(&gw, &format!("/admin/entries/{id}")).await;
        if detail["hit_count"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(detail["prompt"], "page prompt 0");
    assert_eq!(detail["hit_count"], 1, "{detail}");
    assert_eq!(detail["hit_history"][0]["kind"], "hit");
    assert_eq!(detail["hit_history"][0]["request_id"], request_id.as_str());
    assert!(detail["hit_history"][0]["ttft_saved_ms"].as_f64() > Some(0.0));
    assert!(detail["phases"]["ttft_ms"].as_f64() >= Some(SIM_TTFT_MS));
    assert!(!detail["answer"].as_str().expect("answer").is_empty());
    assert_eq!(detail["key"].as_str().map(str::len), Some(64));
    assert!(detail["events"].as_u64() > Some(1));

    // Delete: gone from the store, never served again.
    let (status, deleted) = admin_send(
        &gw,
        reqwest::Method::DELETE,
        &format!("/admin/entries/{id}"),
        json!({}),
    )
    .await;
    assert_eq!((status, &deleted["deleted"]), (200, &json!(true)));
    assert_eq!(
        admin_get(&gw, &format!("/admin/entries/{id}"))
            .await
            .status(),
        404
    );
    let (status, body) = admin_send(
        &gw,
        reqwest::Method::DELETE,
        &format!("/admin/entries/{id}"),
        json!({}),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("entry_not_found"))
    );
    let again = post(&gw, &chat_body("page prompt 0", false), &[]).await;
    assert_eq!(outcome(&again), "miss");
}

#[tokio::test]
async fn warmed_entries_are_served_without_an_upstream_call() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let items = "{\"model\": \"sim-model\", \"prompt\": \"What are your opening hours?\", \"response\": \"We are open 9 to 5.\", \"api_key\": \"sk-tenant-a\"}\n\n\
                 {\"model\": \"sim-model\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Refund policy?\"}], \"response\": \"30 days.\", \"api_key\": \"sk-tenant-a\", \"namespace\": \"support\", \"ttl_s\": 60}\n";
    let response = client()
        .post(gw.url("/admin/entries"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/x-ndjson")
        .body(items)
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 201);
    let warmed: Value = response.json().await.expect("json");
    assert_eq!(warmed["created"], 2);

    let calls = upstream_calls(&sim);
    for stream in [false, true] {
        let hit = post(&gw, &chat_body("What are your opening hours?", stream), &[]).await;
        assert_eq!(outcome(&hit), "hit");
        assert!(
            hit.headers().get("x-reprise-ttft-saved-ms").is_none(),
            "a warmed entry claims no saving"
        );
        assert_eq!(content(hit, stream).await, "We are open 9 to 5.");
    }
    let body = json!({"model": "sim-model", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Refund policy?"}]});
    let hit = post(&gw, &body, &[("x-reprise-namespace", "support")]).await;
    assert_eq!(outcome(&hit), "hit");
    assert_eq!(content(hit, false).await, "30 days.");
    // Another tenant does not see them.
    let other = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-tenant-b")
        .json(&chat_body("What are your opening hours?", false))
        .send()
        .await
        .expect("send");
    assert_eq!(outcome(&other), "miss");
    let _ = other.bytes().await;
    assert_eq!(
        upstream_calls(&sim),
        calls + 1,
        "only the other tenant went upstream"
    );
    let listed = admin_json(&gw, "/admin/entries?namespace=support").await;
    assert_eq!(listed["data"][0]["warmed"], true);

    // One bad item stores nothing, and the error names it.
    let entries = gw.state.cache.store.len();
    let (status, body) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/admin/entries",
        json!({"entries": [
            {"model": "sim-model", "prompt": "fine", "response": "ok", "api_key": "k"},
            {"model": "sim-model", "prompt": "no answer", "api_key": "k"}
        ]}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "entries[1].response", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .expect("message")
        .starts_with("entries[1]:"));
    let (status, body) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/admin/entries",
        json!({"model": "m", "prompt": "p", "response": "r"}),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["param"]),
        (400, &json!("entries[0].api_key")),
        "tenants kept apart need the key"
    );
    let (status, body) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/admin/entries",
        json!({"model": "m", "prompt": "p", "response": "r", "api_key": "k", "namespace": "has space"}),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["param"]),
        (400, &json!("entries[0].namespace")),
        "a namespace no request could send would never be served"
    );
    assert_eq!(gw.state.cache.store.len(), entries);
}

#[tokio::test]
async fn invalidate_counts_what_it_removes_and_flush_empties() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    for i in 0..3 {
        store_prompt(
            &gw,
            &format!("alpha {i}"),
            &[("x-reprise-namespace", "alpha")],
        )
        .await;
    }
    for i in 0..2 {
        store_prompt(
            &gw,
            &format!("beta {i}"),
            &[("x-reprise-namespace", "beta")],
        )
        .await;
    }
    let (status, dry) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/admin/invalidate",
        json!({"namespace": "alpha", "dry_run": true}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(
        (dry["matched"].as_u64(), dry["deleted"].as_u64()),
        (Some(3), Some(0))
    );
    assert_eq!(gw.state.cache.store.len(), 5);
    let (_, done) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/admin/invalidate",
        json!({"namespace": "alpha"}),
    )
    .await;
    assert_eq!(
        (done["matched"].as_u64(), done["deleted"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(gw.state.cache.store.len(), 2);
    let miss = post(
        &gw,
        &chat_body("alpha 0", false),
        &[("x-reprise-namespace", "alpha")],
    )
    .await;
    assert_eq!(outcome(&miss), "miss");
    let _ = miss.bytes().await;
    wait_for_entries(&gw, 3).await;
    // Criteria combine: old enough AND in beta matches nothing yet.
    let (_, none) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/admin/invalidate",
        json!({"namespace": "beta", "older_than_s": 3600}),
    )
    .await;
    assert_eq!(none["matched"], 0);
    let (_, by_tenant) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/admin/invalidate",
        json!({"tenant": "0000000000000000", "dry_run": true}),
    )
    .await;
    assert_eq!(by_tenant["matched"], 0);
    for (body, param) in [
        (json!({}), Value::Null),
        (json!({"dry_run": true}), Value::Null),
        (json!({"namespace": "a", "nope": 1}), json!("nope")),
    ] {
        let (status, err) = admin_send(&gw, reqwest::Method::POST, "/admin/invalidate", body).await;
        assert_eq!(status, 400);
        assert_eq!(err["error"]["param"], param);
    }
    let (_, similar) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/admin/invalidate",
        json!({"similar_to": "beta"}),
    )
    .await;
    assert_eq!(similar["error"]["code"], "semantic_disabled");

    let (status, flushed) = admin_send(&gw, reqwest::Method::POST, "/admin/flush", json!({})).await;
    assert_eq!((status, flushed["deleted"].as_u64()), (200, Some(3)));
    assert_eq!(gw.state.cache.store.len(), 0);
    assert_eq!(admin_json(&gw, "/admin/entries").await["data"], json!([]));
}

#[tokio::test]
async fn live_config_changes_take_effect_and_bad_ones_change_nothing() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let before = admin_json(&gw, "/admin/config").await;
    assert_eq!(before["cache_mode"], "on");
    assert_eq!(before["replay"], "instant");

    for (body, param) in [
        (json!({"similarity_threshold": 1.5}), "similarity_threshold"),
        (json!({"cache_mode": "sometimes"}), "cache_mode"),
        (json!({"replay": "tokens-per-second=0"}), "replay"),
        // Accepted before issue 14, after which every streamed hit panicked its worker.
        (json!({"replay": "tokens-per-second=1e-300"}), "replay"),
        (json!({"replay": "tokens-per-second=5e-324"}), "replay"),
        (
            json!({"similarity_threshold": 1e39}),
            "similarity_threshold",
        ),
        (
            json!({"similarity_threshold": -0.1}),
            "similarity_threshold",
        ),
        (
            json!({"namespace_thresholds": {"a": 2.0}}),
            "namespace_thresholds",
        ),
        (json!({"default_ttl_s": -1}), "default_ttl_s"),
        (json!({"default_ttl_s": 1e300}), "default_ttl_s"),
        (json!({"default_ttl_s": 315360001}), "default_ttl_s"),
        (json!({"default_ttl_s": 0}), "default_ttl_s"),
        (json!({"listen": "0.0.0.0:1"}), "listen"),
    ] {
        let (status, err) = admin_send(&gw, reqwest::Method::PATCH, "/admin/config", body).await;
        assert_eq!(status, 400);
        assert_eq!(err["error"]["param"], param);
    }
    assert_eq!(admin_json(&gw, "/admin/config").await, before);

    // read-only: lookups continue, new answers are not stored.
    let (status, now) = admin_send(
        &gw,
        reqwest::Method::PATCH,
        "/admin/config",
        json!({"cache_mode": "read-only", "namespace_thresholds": {"support": 0.97}}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(now["cache_mode"], "read-only");
    assert_eq!(now["namespace_thresholds"]["support"], 0.97);
    let miss = post(&gw, &chat_body("not stored while read-only", false), &[]).await;
    let _ = miss.bytes().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(gw.state.cache.store.len(), 0);
    // A request may not go below the new namespace floor.
    let low = post(
        &gw,
        &chat_body("x", false),
        &[
            ("x-reprise-namespace", "support"),
            ("x-reprise-threshold", "0.95"),
        ],
    )
    .await;
    assert_eq!(low.status(), 400);

    // Back on, with a short default TTL and paced replay.
    let (_, now) = admin_send(
        &gw,
        reqwest::Method::PATCH,
        "/admin/config",
        json!({"cache_mode": "on", "default_ttl_s": 1, "replay": "recorded"}),
    )
    .await;
    assert_eq!(
        (now["default_ttl_s"].as_u64(), now["replay"].as_str()),
        (Some(1), Some("recorded"))
    );
    store_prompt(&gw, "short lived", &[]).await;
    let entry = admin_json(&gw, "/admin/entries").await;
    let e = &entry["data"][0];
    assert_eq!(
        e["expires_at_ms"]
            .as_u64()
            .zip(e["created_at_ms"].as_u64())
            .map(|(x, c)| x - c),
        Some(1000)
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let expired = post(&gw, &chat_body("short lived", false), &[]).await;
    assert_eq!(outcome(&expired), "miss", "the live TTL applied");
}

#[tokio::test]
async fn namespace_names_no_request_can_carry_are_refused_in_config_as_in_requests() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let before = admin_json(&gw, "/admin/config").await;
    let long = "n".repeat(200);
    // Each refused in a request's `x-reprise-namespace` (or, padded, read as another name)...
    for name in [
        "",
        "   ",
        long.as_str(),
        "ö",
        "has space",
        " padded ",
        "tab\tin",
    ] {
        // ...so no setting may name it: to set it or to remove it.
        for body in [
            json!({"namespace_thresholds": {name: 0.95}}),
            json!({"namespace_modes": {name: "shadow"}}),
            json!({"namespace_thresholds": {name: null}}),
            json!({"namespace_modes": {name: null}}),
        ] {
            let field = body
                .as_object()
                .and_then(|o| o.keys().next().cloned())
                .expect("field");
            let (status, err) =
                admin_send(&gw, reqwest::Method::PATCH, "/admin/config", body.clone()).await;
            assert_eq!(status, 400, "{body} accepted: {err}");
            assert_eq!(err["error"]["param"], field.as_str(), "{err}");
            assert_eq!(err["error"]["type"], "invalid_request_error", "{err}");
            let message = err["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains("namespace"), "{message}");
        }
    }
    assert_eq!(admin_json(&gw, "/admin/config").await, before);
    // The names requests accept are accepted here too, up to the same length.
    let longest = "z".repeat(128);
    let (status, now) = admin_send(
        &gw,
        reqwest::Method::PATCH,
        "/admin/config",
        json!({"namespace_thresholds": {"team-a/b.c:d_e": 0.95, longest.as_str(): 0.96},
               "namespace_modes": {"Legal_2": "shadow"}}),
    )
    .await;
    assert_eq!(status, 200, "{now}");
    assert_eq!(now["namespace_thresholds"]["team-a/b.c:d_e"], 0.95);
    assert_eq!(now["namespace_modes"]["Legal_2"], "shadow");

    // At start-up, from the file: an error naming the table and the key.
    let dir = tempfile::tempdir().expect("tempdir");
    for (table, value) in [
        ("namespace_thresholds", "0.95"),
        ("namespace_modes", "\"shadow\""),
    ] {
        for key in ["\"\"", "\"ö\"", &format!("\"{long}\"")] {
            let path = dir.path().join("reprise.toml");
            std::fs::write(&path, format!("[{table}]\n{key} = {value}\n")).expect("write");
            let err = reprise_server::config::Config::from_file(&path)
                .and_then(|mut c| c.validate())
                .expect_err(key);
            let text = err.to_string();
            assert!(text.contains(table), "{text}");
            assert!(text.contains(key.trim_matches('"')), "{text}");
        }
    }
}

#[tokio::test]
async fn the_openapi_document_lists_every_admin_route() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    let doc = admin_json(&gw, "/admin/openapi.json").await;
    assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
    let paths = doc["paths"].as_object().expect("paths");
    for (path, method) in [
        ("/admin/stats", "get"),
        ("/admin/entries", "get"),
        ("/admin/entries", "post"),
        ("/admin/entries/{id}", "get"),
        ("/admin/entries/{id}", "delete"),
        ("/admin/invalidate", "post"),
        ("/admin/flush", "post"),
        ("/admin/config", "get"),
        ("/admin/config", "patch"),
        ("/admin/requests", "get"),
        ("/admin/shadow", "get"),
        ("/admin/feedback", "get"),
        ("/admin/feedback", "post"),
        ("/metrics", "get"),
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path}"
        );
    }
    let schemas = doc["components"]["schemas"].as_object().expect("schemas");
    assert!(schemas.contains_key("StatsBody") && schemas.contains_key("EntryDetail"));
    assert_eq!(
        doc["components"]["securitySchemes"]["admin_token"]["scheme"],
        "bearer"
    );
}

#[tokio::test]
async fn search_warm_and_invalidate_by_meaning_with_the_model() {
    let Some(models) = crate::semantic::models() else {
        return;
    };
    let sim = sim_default().await;
    let mut config = crate::semantic::semantic_config(sim.base_url(), &models);
    config.sweep_interval_ms = 20;
    let gw = start(config).await;
    for prompt in [
        "how do I reset my password",
        "what is the capital of France",
        "best pizza in Naples",
    ] {
        store_prompt(&gw, prompt, &[]).await;
    }
    let found = admin_json(&gw, "/admin/entries?q=I%20forgot%20my%20password&limit=3").await;
    let data = found["data"].as_array().expect("data");
    assert_eq!(data.len(), 3);
    assert_eq!(data[0]["prompt"], "how do I reset my password");
    let sims: Vec<f64> = data
        .iter()
        .filter_map(|e| e["similarity"].as_f64())
        .collect();
    assert!(sims.windows(2).all(|w| w[0] >= w[1]), "{sims:?}");
    assert!(sims[0] > 0.6 && sims[2] < 0.4, "{sims:?}");
    assert!(found["next_cursor"].is_null());

    // A warmed answer is found by a paraphrase, as a semantic hit.
    let (status, _) = admin_send(&gw, reqwest::Method::POST, "/admin/entries", json!([{"model": "sim-model", "prompt": "How can I cancel my subscription?", "response": "Settings, then Billing, then Cancel.", "api_key": "sk-tenant-a"}])).await;
    assert_eq!(status, 201);
    let calls = upstream_calls(&sim);
    let hit = post(
        &gw,
        &chat_body("how do I cancel my subscription", false),
        &[],
    )
    .await;
    assert_eq!(outcome(&hit), "semantic-hit");
    assert_eq!(
        content(hit, false).await,
        "Settings, then Billing, then Cancel."
    );
    assert_eq!(upstream_calls(&sim), calls);

    let (_, dry) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/admin/invalidate",
        json!({"similar_to": "forgotten password", "min_similarity": 0.6, "dry_run": true}),
    )
    .await;
    assert_eq!(dry["matched"], 1, "{dry}");
    let (_, done) = admin_send(
        &gw,
        reqwest::Method::POST,
        "/admin/invalidate",
        json!({"similar_to": "forgotten password", "min_similarity": 0.6}),
    )
    .await;
    assert_eq!(done["deleted"], 1);
    let gone = admin_json(&gw, "/admin/entries?q=password&limit=10").await;
    assert!(gone["data"]
        .as_array()
        .expect("data")
        .iter()
        .all(|e| e["prompt"] != "how do I reset my password"));
    let stats = admin_json(&gw, "/admin/stats").await;
    assert_eq!(stats["mode"], "semantic");
    assert_eq!(stats["index"]["vectors"], 3);
    assert_eq!(stats["requests"]["semantic-hit"], 1);
    assert!(stats["embedding"]["batches"].as_u64() >= Some(4));
}

/// The typed client of `reprise_client::admin` decodes every answer of the real gateway (the
/// contract cannot drift between the two crates unnoticed).
#[tokio::test]
async fn the_typed_admin_client_speaks_to_the_real_gateway() {
    use reprise_client::admin::{AdminClient, ConfigPatch, InvalidateRequest, ListQuery, WarmItem};
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    // A `/v1` suffix is accepted, as apps configure it.
    let admin = AdminClient::new(&gw.url("/v1"), Some(TOKEN)).expect("client");
    let warmed = admin
        .warm(&[
            WarmItem::prompt("sim-model", "typed one", "answer one").with_api_key("sk-tenant-a"),
            WarmItem::prompt("sim-model", "typed two", "answer two").with_api_key("sk-tenant-a"),
        ])
        .await
        .expect("warm");
    assert_eq!(warmed.created, 2);
    let hit = post(&gw, &chat_body("typed one", false), &[]).await;
    assert_eq!(outcome(&hit), "hit");
    let _ = hit.bytes().await;
    store_prompt(&gw, "typed three", &[]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    let stats = admin.stats().await.expect("stats");
    assert_eq!(stats.mode, "exact-only");
    assert_eq!(stats.store.entries, 3);
    let all = admin
        .entries_all(&ListQuery {
            limit: Some(1),
            ..ListQuery::default()
        })
        .await
        .expect("all pages");
    assert_eq!(
        all.iter().map(|e| e.prompt.as_str()).collect::<Vec<_>>(),
        ["typed three", "typed two", "typed one"]
    );
    let detail = admin.entry(&all[2].id).await.expect("detail");
    assert_eq!(detail.answer, "answer one");
    let page = admin.requests(Some(10)).await.expect("requests");
    assert!(page.data.iter().any(|r| r.cache == "hit"));
    let err = admin
        .search("anything", None, &Default::default())
        .await
        .expect_err("exact-only");
    assert_eq!(err.code(), Some("semantic_disabled"));
    let config = admin
        .patch_config(&ConfigPatch {
            similarity_threshold: Some(0.95),
            ..ConfigPatch::default()
        })
        .await
        .expect("patch");
    assert!((config.similarity_threshold - 0.95).abs() < 1e-6);
    let removed = admin
        .invalidate(&InvalidateRequest {
            model: Some("sim-model".into()),
            dry_run: true,
            ..InvalidateRequest::default()
        })
        .await
        .expect("invalidate");
    assert_eq!((removed.matched, removed.deleted), (3, 0));
    admin.delete_entry(&all[0].id).await.expect("delete");
    let missing = admin.entry(&all[0].id).await.expect_err("gone");
    assert_eq!(missing.status(), Some(404));
    assert!(admin
        .metrics()
        .await
        .expect("metrics")
        .contains("reprise_requests_total"));
    assert!(admin.openapi().await.expect("openapi")["paths"].is_object());
    assert_eq!(admin.flush().await.expect("flush").deleted, 2);
    let wrong = AdminClient::new(&gw.url(""), Some("nope")).expect("client");
    assert_eq!(wrong.stats().await.expect_err("401").status(), Some(401));
}

/// Issue 14's audit: every number an admin query carries is checked, a 400 naming it.
#[tokio::test]
async fn out_of_range_admin_query_numbers_are_400s_naming_them() {
    let sim = sim_default().await;
    let gw = gateway(&sim).await;
    for path in [
        "/admin/requests?limit=0",
        "/admin/requests?limit=-1",
        "/admin/requests?limit=1e3",
        "/admin/requests?limit=99999999999999999999999",
        "/admin/entries?limit=0",
        "/admin/entries?limit=201",
        "/admin/entries?limit=-5",
        "/admin/entries?limit=NaN",
    ] {
        let response = admin_get(&gw, path).await;
        assert_eq!(response.status(), 400, "{path}");
        let err: Value = response.json().await.expect("json");
        assert_eq!(err["error"]["param"], "limit", "{path}: {err}");
    }
    // Above the log's size is the whole log, as documented.
    let response = admin_get(&gw, "/admin/requests?limit=18446744073709551615").await;
    assert_eq!(response.status(), 200);
    for (body, param) in [
        (json!({"older_than_s": -1}), "older_than_s"),
        (json!({"older_than_s": 1.5}), "older_than_s"),
        (
            json!({"namespace": "a", "min_similarity": 1e39}),
            "min_similarity",
        ),
        (
            json!({"namespace": "a", "min_similarity": -2}),
            "min_similarity",
        ),
    ] {
        let (status, err) = admin_send(&gw, reqwest::Method::POST, "/admin/invalidate", body).await;
        assert_eq!(status, 400, "{err}");
        assert_eq!(err["error"]["param"], param, "{err}");
    }
    for ttl in [json!(0), json!(-1), json!(315_360_001u64), json!(1e300)] {
        let item =
            json!({"model": "m", "prompt": "p", "response": "r", "api_key": "", "ttl_s": ttl});
        let (status, err) = admin_send(&gw, reqwest::Method::POST, "/admin/entries", item).await;
        assert_eq!(status, 400, "{err}");
        assert!(
            err["error"]["param"]
                .as_str()
                .is_some_and(|p| p.ends_with("ttl_s")),
            "{err}"
        );
    }
}
