//! Pass-through behaviour: relay fidelity, timing, faults, bad input, auth, admin and shutdown.

use std::time::Duration;

use reprise_server::config::Secret;
use reprise_sim::{self as sim, SimConfig};
use serde_json::{json, Value};

use crate::common::*;

#[tokio::test]
async fn streamed_chat_through_gateway_matches_direct_and_carries_timing() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let body = chat_body("Tell me about caches", true);

    let direct = client()
        .post(format!("{}/chat/completions", sim.base_url()))
        .json(&body)
        .send()
        .await
        .expect("direct");
    let direct_text = stream_text(direct).await;
    let via = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-client")
        .json(&body)
        .send()
        .await
        .expect("gateway");
    assert_eq!(via.status(), 200);
    assert!(via.headers()["content-type"]
        .to_str()
        .expect("ct")
        .starts_with("text/event-stream"));
    assert!(via.headers().contains_key("x-reprise-request-id"));
    let via_text = stream_text(via).await;

    let (direct_data, _) = parse_sse(&direct_text);
    let (via_data, comments) = parse_sse(&via_text);
    assert_eq!(direct_data.len(), via_data.len(), "{via_text}");
    assert_eq!(via_data.last().map(String::as_str), Some("[DONE]"));
    for (d, v) in direct_data
        .iter()
        .zip(&via_data)
        .filter(|(d, _)| *d != "[DONE]")
    {
        assert_eq!(normalized(d), normalized(v));
    }

    // The timing comment sits on the line right before `data: [DONE]`.
    let lines: Vec<&str> = via_text.lines().collect();
    let done_at = lines
        .iter()
        .position(|l| *l == "data: [DONE]")
        .expect("done line");
    assert!(
        lines[done_at - 1].starts_with(": reprise-timing {"),
        "{via_text}"
    );
    assert_eq!(comments.len(), 1);
    let timing: Value = serde_json::from_str(comments[0].trim_start_matches("reprise-timing "))
        .expect("timing json");
    let ttft = timing["ttft_ms"].as_f64().expect("ttft");
    assert!(
        ttft >= SIM_TTFT_MS,
        "ttft {ttft} below the simulator's {SIM_TTFT_MS}"
    );
    assert!(
        ttft < SIM_TTFT_MS + 2_000.0,
        "ttft {ttft} implausibly large"
    );
    assert_eq!(timing["tokens"], 8);
    // Decode is measured (first to last token as the gateway read them). No lower bound: on a busy
    // machine a late read takes several of the simulator's tokens at once, so the span it sees can
    // be far shorter than the 14 ms over which they left (a bound of 5 ms failed at 4.6 ms).
    let decode = timing["decode_ms"].as_f64().expect("decode");
    let total = timing["total_ms"].as_f64().expect("total");
    assert!(
        decode >= 0.0 && decode <= total,
        "decode {decode} of {total} ms"
    );
    assert!(total >= ttft);
    assert!(timing["itl_p50_ms"].as_f64().is_some());
    gw.shutdown().await.expect("clean shutdown");
}

#[tokio::test]
async fn non_streamed_answers_relay_body_and_server_timing() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let body = chat_body("Non-streamed please", false);
    let direct: Value = client()
        .post(format!("{}/chat/completions", sim.base_url()))
        .json(&body)
        .send()
        .await
        .expect("direct")
        .json()
        .await
        .expect("json");
    let via = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("gateway");
    assert_eq!(via.status(), 200);
    let timing = via.headers()["server-timing"]
        .to_str()
        .expect("header")
        .to_owned();
    let via: Value = via.json().await.expect("json");
    assert_eq!(direct["choices"], via["choices"]);
    assert_eq!(direct["usage"], via["usage"]);

    let ttft: f64 = timing
        .split(", ")
        .find_map(|p| p.strip_prefix("ttft;dur="))
        .expect("ttft in Server-Timing")
        .parse()
        .expect("number");
    assert!(ttft >= SIM_TTFT_MS, "{timing}");
    for phase in [
        "ingress;dur=",
        "upstream_send;dur=",
        "decode;dur=",
        "total;dur=",
    ] {
        assert!(timing.contains(phase), "{phase} missing from {timing}");
    }

    // Legacy completions and embeddings are forwarded too.
    let completion: Value = client()
        .post(gw.url("/v1/completions"))
        .json(&json!({"model": "sim-model", "prompt": "Say hi"}))
        .send()
        .await
        .expect("completions")
        .json()
        .await
        .expect("json");
    assert_eq!(completion["object"], "text_completion");
    let embedding: Value = client()
        .post(gw.url("/v1/embeddings"))
        .json(&json!({"model": "sim-embedding", "input": ["a", "b"]}))
        .send()
        .await
        .expect("embeddings")
        .json()
        .await
        .expect("json");
    assert_eq!(embedding["data"].as_array().map(Vec::len), Some(2));
    assert_eq!(sim.stats.snapshot().requests, 4);
}

#[tokio::test]
async fn authorization_is_passed_through_or_replaced_by_the_upstream_key() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-client-key")
        .json(&chat_body("hi", false))
        .send()
        .await
        .expect("send");
    assert_eq!(
        sim.stats.snapshot().last_authorization.as_deref(),
        Some("Bearer sk-client-key")
    );
    gw.shutdown().await.expect("shutdown");

    let mut config = config_for(sim.base_url());
    config.upstream_api_key = Some(Secret::new("sk-gateway-key"));
    let gw = start(config).await;
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-client-key")
        .json(&chat_body("hi", true))
        .send()
        .await
        .expect("send")
        .text()
        .await
        .expect("body");
    assert_eq!(
        sim.stats.snapshot().last_authorization.as_deref(),
        Some("Bearer sk-gateway-key")
    );
}

#[tokio::test]
async fn upstream_errors_are_relayed_with_status_and_body() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    for (status, stream) in [(503, false), (429, true), (400, false)] {
        let response = client()
            .post(gw.url("/v1/chat/completions"))
            .header("x-sim-fault", format!("status={status}"))
            .json(&chat_body("fail please", stream))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status().as_u16(), status);
        if status == 429 {
            assert_eq!(response.headers()["retry-after"], "1");
        }
        let body: Value = response.json().await.expect("json error body");
        assert_eq!(body["error"]["message"], "injected fault");
    }
}

async fn assert_still_serving(gw: &Gateway) {
    let ok = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&chat_body("still there?", false))
        .send()
        .await
        .expect("send");
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn hang_unreachable_and_broken_streams_give_documented_errors() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.first_byte_timeout_ms = 400;
    config.idle_timeout_ms = 400;
    let gw = start(config).await;

    // A hang before the first byte: 504 in OpenAI's shape.
    for stream in [false, true] {
        let response = client()
            .post(gw.url("/v1/chat/completions"))
            .header("x-sim-fault", "hang")
            .json(&chat_body("hang", stream))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 504);
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["code"], "upstream_timeout");
        assert_eq!(body["error"]["type"], "upstream_error");
    }
    assert_still_serving(&gw).await;

    // A stream that breaks after it began: the client gets the tokens sent so far, then an
    // OpenAI-shaped error event, and never a `[DONE]`.
    // An abort resets the connection: the gateway's kernel may drop chunks it had received but the
    // gateway had not read yet (a TCP reset discards them), so only a clean cut promises them all.
    // On a busy machine the reset can even beat the gateway's read of the response head: nothing
    // has been sent to the client then, so it gets the documented 502 instead of a stream.
    for (fault, code, delivered) in [
        ("cut=3", "upstream_invalid_response", 3),
        ("abort=3", "upstream_invalid_response", 0),
        ("malformed=3", "upstream_invalid_response", 3),
    ] {
        let response = client()
            .post(gw.url("/v1/chat/completions"))
            .header("x-sim-fault", fault)
            .json(&chat_body("break", true))
            .send()
            .await
            .expect("send");
        if fault.starts_with("abort") && response.status() == 502 {
            let body: Value = response.json().await.expect("json");
            assert_eq!(body["error"]["type"], "upstream_error", "{fault}: {body}");
            continue;
        }
        assert_eq!(response.status(), 200, "{fault}");
        let text = stream_text(response).await;
        let (data, _) = parse_sse(&text);
        assert!(!data.iter().any(|d| d == "[DONE]"), "{fault}: {text}");
        let last: Value = serde_json::from_str(data.last().expect("events")).expect("json");
        assert_eq!(last["error"]["code"], code, "{fault}: {text}");
        let tokens = data.iter().filter(|d| d.contains("\"content\":\"")).count();
        assert!(
            tokens >= delivered,
            "{fault}: tokens before the fault are delivered: {text}"
        );
        assert!(
            !text.contains("this is not json"),
            "malformed events are not relayed"
        );
    }
    // The upstream's own error event is relayed as it is.
    let text = stream_text(
        client()
            .post(gw.url("/v1/chat/completions"))
            .header("x-sim-fault", "error-event=2")
            .json(&chat_body("break", true))
            .send()
            .await
            .expect("send"),
    )
    .await;
    assert!(
        text.contains("The server had an error while processing your request."),
        "{text}"
    );
    assert_still_serving(&gw).await;

    // Unreachable upstream: 502.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let dead_url = format!("http://{}/v1", closed.local_addr().expect("addr"));
    drop(closed);
    let dead = start(config_for(dead_url)).await;
    let response = client()
        .post(dead.url("/v1/chat/completions"))
        .json(&chat_body("anyone?", true))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 502);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["error"]["code"], "upstream_unreachable");
    assert!(
        !body.to_string().contains("Connection refused"),
        "internal detail must stay in the log: {body}"
    );
}

#[tokio::test]
async fn bad_input_gets_openai_shaped_errors() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.max_body_bytes = 1024;
    let gw = start(config).await;
    let post = |body: String, ct: &'static str| {
        client()
            .post(gw.url("/v1/chat/completions"))
            .header("content-type", ct)
            .body(body)
            .send()
    };
    let cases = vec![
        (
            post("{\"model\":".into(), "application/json").await,
            400,
            None,
        ),
        (
            post(chat_body("x", false).to_string(), "text/plain").await,
            415,
            None,
        ),
        (
            post(
                chat_body(&"x".repeat(2000), false).to_string(),
                "application/json",
            )
            .await,
            413,
            None,
        ),
        (
            post(
                json!({"model": "m", "messages": "hi"}).to_string(),
                "application/json",
            )
            .await,
            400,
            Some("messages"),
        ),
        (
            post(
                json!({"messages": [{"role": "user", "content": "x"}]}).to_string(),
                "application/json",
            )
            .await,
            400,
            Some("model"),
        ),
    ];
    for (response, status, param) in cases {
        let response = response.expect("send");
        assert_eq!(response.status().as_u16(), status);
        let body: Value = response.json().await.expect("json");
        let error = &body["error"];
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert!(
            error["type"].is_string() && error["code"].is_string(),
            "{body}"
        );
        assert_eq!(error["param"].as_str(), param, "{body}");
    }
    let unknown = client().get(gw.url("/nope")).send().await.expect("send");
    assert_eq!(unknown.status(), 404);
    let body: Value = unknown.json().await.expect("json");
    assert_eq!(body["error"]["code"], "unknown_route");
    // Another method on a cached route passes through (`GET` lists stored completions): the
    // sim's own 405 here, not a chat request.
    let other_method = client()
        .get(gw.url("/v1/chat/completions"))
        .send()
        .await
        .expect("send");
    assert_eq!(other_method.status(), 405);
    // No chat request above reached the upstream (the `GET` did, and got its 405).
    assert_eq!(sim.stats.snapshot().requests, 0);
    assert_still_serving(&gw).await;
}

#[tokio::test]
async fn other_v1_routes_pass_through() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let direct: Value = client()
        .get(format!("{}/models", sim.base_url()))
        .send()
        .await
        .expect("direct")
        .json()
        .await
        .expect("json");
    let via: Value = client()
        .get(gw.url("/v1/models"))
        .bearer_auth("sk-x")
        .send()
        .await
        .expect("gateway")
        .json()
        .await
        .expect("json");
    assert_eq!(direct, via);
    assert_eq!(
        sim.stats.snapshot().last_authorization.as_deref(),
        Some("Bearer sk-x")
    );
    // Sized as the upstream sized it (it went out chunked before), and so is a `HEAD`.
    let length = |response: &reqwest::Response| header(response, "content-length");
    let direct = client()
        .get(format!("{}/models", sim.base_url()))
        .send()
        .await
        .expect("direct");
    let via = client()
        .get(gw.url("/v1/models"))
        .send()
        .await
        .expect("gateway");
    assert!(length(&direct).is_some());
    assert_eq!(length(&via), length(&direct));
    assert_eq!(header(&via, "transfer-encoding"), None);
    let head = client()
        .head(gw.url("/v1/models"))
        .send()
        .await
        .expect("head");
    assert_eq!(length(&head), length(&direct));
    // An upstream 404 for an unknown route is relayed, not replaced.
    let missing = client()
        .get(gw.url("/v1/files/xyz"))
        .send()
        .await
        .expect("send");
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn admin_requests_needs_the_token_and_lists_phases() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.admin_token = None;
    let closed = start(config).await;
    let response = client()
        .get(closed.url("/admin/requests"))
        .bearer_auth("anything")
        .send()
        .await
        .expect("send");
    assert_eq!(
        response.status(),
        404,
        "no token configured: admin disabled"
    );

    let gw = start(config_for(sim.base_url())).await;
    client()
        .post(gw.url("/v1/chat/completions"))
        .json(&chat_body("record me", true))
        .send()
        .await
        .expect("send")
        .text()
        .await
        .expect("body");
    for auth in [None, Some("wrong"), Some("admin-secre")] {
        let mut request = client().get(gw.url("/admin/requests"));
        if let Some(token) = auth {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("send");
        assert_eq!(response.status(), 401);
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["error"]["type"], "authentication_error");
    }
    // The stream's record is written when its delivery ends, just after the body.
    let mut records = Value::Null;
    for _ in 0..50 {
        records = admin_json(&gw, "/admin/requests?limit=10").await;
        if records["data"].as_array().is_some_and(|d| !d.is_empty()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let record = &records["data"][0];
    assert_eq!(record["route"], "chat.completions");
    assert_eq!(record["stream"], true);
    assert_eq!(record["completion"], "complete");
    assert_eq!(record["model"], "sim-model");
    let phases = &record["phases"];
    assert!(phases["ttft_ms"].as_f64().expect("ttft") >= SIM_TTFT_MS);
    assert!(phases["downstream_ms"].as_f64().expect("downstream") >= 0.0);
    assert_eq!(phases["tokens"], 8);
    assert!(
        !records.to_string().contains("record me"),
        "no prompt in the log"
    );
}

#[tokio::test]
async fn shutdown_lets_an_in_flight_stream_finish() {
    let sim = sim::spawn(SimConfig {
        ttft_ms: 50.0,
        itl_ms: 20.0,
        tokens: 20,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    let gw = start(config_for(sim.base_url())).await;
    let response = client()
        .post(gw.url("/v1/chat/completions"))
        .json(&chat_body("long one", true))
        .send()
        .await
        .expect("send");
    let reader = tokio::spawn(stream_text(response));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let addr = gw.addr;
    gw.shutdown().await.expect("run returns Ok");
    let text = reader.await.expect("reader");
    assert!(
        text.contains("data: [DONE]"),
        "in-flight stream completed: {text}"
    );
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}
