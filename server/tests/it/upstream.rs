//! Between the gateway and its upstream: redirects relayed and never followed, answers with an error
//! signal never cached, header hygiene on every route, and upstream failures named by what happened.

use std::time::Duration;

use reprise_server::config::Secret;
use reprise_server::record::RequestRecord;
use serde_json::{json, Value};

use crate::common::*;

const ADMIN: &str = "admin-secret";

/// Waits until the request's record is written: by then a clean answer has been handed to the
/// cache's writer, and draining the writer lands it.
async fn settled(gw: &Gateway, response: &reqwest::Response) -> RequestRecord {
    let id = header(response, "x-reprise-request-id").expect("x-reprise-request-id");
    for _ in 0..500 {
        if let Some(r) = gw
            .state
            .requests
            .recent(10_000)
            .into_iter()
            .find(|r| r.id == id)
        {
            let cache = gw.state.cache.clone();
            tokio::task::spawn_blocking(move || cache.drain())
                .await
                .expect("drain");
            return r;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("request {id} was never recorded");
}

#[tokio::test]
async fn redirects_are_relayed_as_they_are_and_never_cached() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    for stream in [false, true] {
        let prompt = format!("where did it go? stream={stream}");
        for attempt in 1..=2u64 {
            // A client that follows nothing, so it sees what the gateway answered.
            let response = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("client")
                .post(gw.url("/v1/chat/completions"))
                .header("x-sim-fault", "redirect")
                .json(&chat_body(&prompt, stream))
                .send()
                .await
                .expect("send");
            assert_eq!(response.status(), 302, "attempt {attempt}, stream={stream}");
            assert_eq!(
                header(&response, "location").as_deref(),
                Some("/v1/sim/redirected")
            );
            assert_eq!(outcome(&response), "miss", "a redirect is never a hit");
            let record = settled(&gw, &response).await;
            assert_eq!(record.status, 302);
            let body = response.text().await.expect("body");
            assert!(body.contains("moved to /v1/sim/redirected"), "{body}");
            assert!(!body.contains("You followed a redirect."), "{body}");
        }
    }
    assert_eq!(upstream_calls(&sim), 4, "every redirect went upstream");
    assert_eq!(gw.state.cache.store.len(), 0, "nothing stored");
}

/// The raw bytes of a response, whatever they are.
async fn raw(response: reqwest::Response) -> Vec<u8> {
    response.bytes().await.expect("body").to_vec()
}

#[tokio::test]
async fn answers_with_an_error_signal_are_relayed_but_never_cached() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let cases: [(&str, bool, &[u8]); 7] = [
        (
            "content-filter",
            false,
            b"\"finish_reason\":\"content_filter\"",
        ),
        (
            "content-filter",
            true,
            b"\"finish_reason\":\"content_filter\"",
        ),
        ("error-frame=2", true, b"event: error\n"),
        ("error-event=2", true, b"data: {\"error\""),
        ("bad-utf8=2", true, b"\xFF\xFE"),
        ("bad-utf8=0", true, b"\xFF\xFE"),
        ("bad-utf8", false, b"\xFF\xFE"),
    ];
    for (n, (fault, stream, sent)) in cases.into_iter().enumerate() {
        let prompt = format!("signal case {n}");
        for attempt in 1..=2 {
            let response = post(&gw, &chat_body(&prompt, stream), &[("x-sim-fault", fault)]).await;
            assert_eq!(response.status(), 200, "{fault}");
            assert_eq!(
                outcome(&response),
                "miss",
                "{fault} stream={stream}, attempt {attempt}: must not be served from the cache"
            );
            settled(&gw, &response).await;
            let body = raw(response).await;
            // The client still receives what the upstream sent, bad bytes included.
            assert!(
                body.windows(sent.len()).any(|w| w == sent),
                "{fault} stream={stream}: {}",
                String::from_utf8_lossy(&body)
            );
            assert_eq!(
                gw.state.cache.store.len(),
                0,
                "{fault} stream={stream} was stored"
            );
        }
    }
    // The same prompts without a fault are stored: the rules refuse the signal, not the prompt.
    let response = post(&gw, &chat_body("signal case 1", true), &[]).await;
    assert_eq!(outcome(&response), "miss");
    settled(&gw, &response).await;
    let _ = raw(response).await;
    wait_for_entries(&gw, 1).await;
}

/// Header names of the last request the simulator saw, with how often each came.
fn seen(sim: &reprise_sim::SimHandle) -> Vec<(String, String)> {
    sim.stats.snapshot().last_headers
}

fn values<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .collect()
}

#[tokio::test]
async fn upstream_gets_one_content_type_no_hop_headers_and_no_client_credential() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.upstream_api_key = Some(Secret::new("sk-gateway-key"));
    let gw = start(config).await;
    let routes = [
        ("/v1/chat/completions", chat_body("headers?", false)),
        (
            "/v1/chat/completions",
            chat_body("headers, streamed?", true),
        ),
        (
            "/v1/completions",
            json!({"model": "sim-model", "prompt": "headers?", "stream": false}),
        ),
        (
            "/v1/embeddings",
            json!({"model": "sim-embedding", "input": "headers?"}),
        ),
    ];
    for (path, body) in &routes {
        let response = client()
            .post(gw.url(path))
            .bearer_auth("sk-client-key")
            .header("api-key", "client-azure-key")
            .header("connection", "keep-alive, x-hop-secret")
            .header("x-hop-secret", "for the gateway only")
            .header("x-kept", "end to end")
            .json(body)
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 200, "{path}");
        let _ = response.bytes().await;
        let headers = seen(&sim);
        assert_eq!(
            values(&headers, "content-type"),
            ["application/json"],
            "{path}: exactly one Content-Type"
        );
        assert!(values(&headers, "x-hop-secret").is_empty(), "{path}");
        assert_eq!(values(&headers, "x-kept"), ["end to end"], "{path}");
        assert_eq!(values(&headers, "api-key"), ["sk-gateway-key"], "{path}");
        assert_eq!(
            values(&headers, "authorization"),
            ["Bearer sk-gateway-key"],
            "{path}"
        );
        let all = format!("{headers:?}");
        assert!(!all.contains("sk-client-key") && !all.contains("client-azure-key"));
    }
    // A pass-through route: same rules; a client without `api-key` does not get one added.
    let response = client()
        .get(gw.url("/v1/models"))
        .bearer_auth("sk-client-key")
        .header("connection", "x-hop-secret")
        .header("x-hop-secret", "for the gateway only")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    let headers = seen(&sim);
    assert!(values(&headers, "x-hop-secret").is_empty());
    assert!(values(&headers, "api-key").is_empty());
    assert_eq!(values(&headers, "authorization"), ["Bearer sk-gateway-key"]);
}

#[tokio::test]
async fn broken_upstream_http_is_a_protocol_error_not_a_connect_error() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let cases = [
        ("close-early", false),
        ("close-early", true),
        ("garbage-status", false),
        ("garbage-status", true),
        // A non-streamed body cut halfway: truncated HTTP, not a stream's fault.
        ("abort", false),
    ];
    for (fault, stream) in cases {
        let response = post(
            &gw,
            &chat_body(&format!("{fault} {stream}"), stream),
            &[("x-sim-fault", fault)],
        )
        .await;
        assert_eq!(response.status(), 502, "{fault}");
        let body: Value = response.json().await.expect("json error");
        assert_eq!(body["error"]["code"], "upstream_protocol_error", "{body}");
        // The message names what happened, in a fixed phrase (details stay in the log).
        let what = match fault {
            "garbage-status" => "head was malformed",
            _ => "closed the connection before the response was complete",
        };
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(what), "{body}");
        assert_eq!(body["error"]["type"], "upstream_error", "{body}");
        assert!(body["error"]["message"].is_string(), "{body}");
        assert!(body["error"].get("param").is_some(), "{body}");
    }
    // The simulator did answer each request's handler: the break was in its HTTP.
    assert_eq!(upstream_calls(&sim), 5);
    // Still serving, over fresh connections.
    let ok = post(&gw, &chat_body("after the breakage", false), &[]).await;
    assert_eq!(ok.status(), 200);

    // A refused connection is still what `connect` counts.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let dead_url = format!("http://{}/v1", closed.local_addr().expect("addr"));
    drop(closed);
    let dead = start(config_for(dead_url)).await;
    let response = post(&dead, &chat_body("anyone?", false), &[]).await;
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "upstream_unreachable");

    let stats = |gw: &Gateway| {
        let url = gw.url("/admin/stats");
        async move {
            client()
                .get(url)
                .bearer_auth(ADMIN)
                .send()
                .await
                .expect("stats")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    let errors = stats(&gw).await["upstream_errors"].clone();
    assert_eq!(errors["protocol"], 5, "{errors}");
    assert_eq!(errors["connect"], 0, "{errors}");
    let errors = stats(&dead).await["upstream_errors"].clone();
    assert_eq!(
        (errors["connect"].clone(), errors["protocol"].clone()),
        (json!(1), json!(0))
    );
    let metrics = client()
        .get(gw.url("/metrics"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("reprise_upstream_errors_total{kind=\"protocol\"} 5"),
        "{metrics}"
    );
    assert!(!metrics.contains("reprise_upstream_errors_total{kind=\"connect\"}"));
}
