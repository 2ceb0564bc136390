//! OpenTelemetry traces end to end: the gateway exports to a small OTLP/HTTP receiver started here,
//! and the test decodes what arrived: the request span joins the client's `traceparent`, its phase
//! spans sit inside it, its attributes name the outcome, and the upstream was handed the same
//! trace. With tracing off, nothing is sent and the client's `traceparent` passes untouched.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use bytes::Bytes;
use serde_json::Value;

use crate::common::*;
use crate::semantic::{models, semantic_config};

const QUESTION: &str = "how do I reset my password";
const PARAPHRASE: &str = "I forgot my password, how can I reset it";
const CLIENT_KEY: &str = "sk-tenant-otel-very-secret-0042";

/// The OTLP/HTTP receiver: keeps every body posted to `/v1/traces`.
pub(crate) struct Receiver {
    pub(crate) addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Bytes>>>,
}

impl Receiver {
    pub(crate) async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        Self::serve(listener)
    }

    /// Serves on `listener` (a socket the test kept bound).
    fn serve(listener: tokio::net::TcpListener) -> Self {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let kept = bodies.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            post(move |headers: axum::http::HeaderMap, body: Bytes| {
                let kept = kept.clone();
                async move {
                    assert_eq!(headers["content-type"], "application/json");
                    kept.lock().expect("lock").push(body);
                    "{}"
                }
            }),
        );
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { addr, bodies }
    }

    fn raw(&self) -> Vec<Bytes> {
        self.bodies.lock().expect("lock").clone()
    }

    /// Every exported span, with its resource's attributes checked on the way.
    pub(crate) fn spans(&self) -> Vec<Value> {
        let mut spans = Vec::new();
        for body in self.raw() {
            let v: Value = serde_json::from_slice(&body).expect("OTLP JSON");
            for rs in v["resourceSpans"].as_array().expect("resourceSpans") {
                let resource = attrs(&rs["resource"]);
                assert_eq!(resource["service.name"]["stringValue"], "reprise");
                for ss in rs["scopeSpans"].as_array().expect("scopeSpans") {
                    assert_eq!(ss["scope"]["name"], "reprise");
                    spans.extend(ss["spans"].as_array().expect("spans").iter().cloned());
                }
            }
        }
        spans
    }
}

/// A span's (or resource's) attributes as a map of key to OTLP `AnyValue`.
pub(crate) fn attrs(span: &Value) -> serde_json::Map<String, Value> {
    span["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            (
                a["key"].as_str().expect("key").to_owned(),
                a["value"].clone(),
            )
        })
        .collect()
}

fn nanos(span: &Value, field: &str) -> u128 {
    span[field]
        .as_str()
        .expect("nanos as a string")
        .parse()
        .expect("nanos")
}

/// The request span of `trace_id`, and its children, each checked to lie inside it.
pub(crate) fn request_tree<'a>(spans: &'a [Value], trace_id: &str) -> (&'a Value, Vec<&'a Value>) {
    let roots: Vec<&Value> = spans
        .iter()
        .filter(|s| s["traceId"] == trace_id && s["kind"] == 2)
        .collect();
    assert_eq!(roots.len(), 1, "one request span in trace {trace_id}");
    let root = roots[0];
    let children: Vec<&Value> = spans
        .iter()
        .filter(|s| s["parentSpanId"] == root["spanId"])
        .collect();
    let (start, end) = (
        nanos(root, "startTimeUnixNano"),
        nanos(root, "endTimeUnixNano"),
    );
    assert!(start <= end);
    for child in &children {
        assert_eq!(child["traceId"], trace_id);
        assert_eq!(child["kind"], 1, "{child}");
        let (a, b) = (
            nanos(child, "startTimeUnixNano"),
            nanos(child, "endTimeUnixNano"),
        );
        assert!(a <= b, "{child}");
        assert!(start <= a && b <= end, "{child} lies outside {root}");
    }
    (root, children)
}

pub(crate) fn names<'a>(children: &[&'a Value]) -> Vec<&'a str> {
    children
        .iter()
        .map(|c| c["name"].as_str().expect("name"))
        .collect()
}

/// The `traceparent` and `tracestate` of the last request the simulated upstream received.
fn upstream_context(sim: &reprise_sim::SimHandle) -> (Option<String>, Option<String>) {
    let headers = sim.stats.snapshot().last_headers;
    let get = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    (get("traceparent"), get("tracestate"))
}

async fn chat(
    gw: &Gateway,
    prompt: &str,
    stream: bool,
    extra: &[(&str, &str)],
) -> (String, String) {
    let mut request = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .json(&chat_body(prompt, stream));
    for (k, v) in extra {
        request = request.header(*k, *v);
    }
    let response = request.send().await.expect("send");
    assert_eq!(response.status(), 200);
    let id = header(&response, "x-reprise-request-id").expect("request id");
    let cache = outcome(&response);
    let _ = content(response, stream).await;
    (cache, id)
}

#[tokio::test]
async fn a_miss_and_its_hits_join_the_clients_trace_and_reach_the_collector() {
    let Some(models) = models() else { return };
    let receiver = Receiver::start().await;
    let sim = sim_default().await;
    let mut config = semantic_config(sim.base_url(), &models);
    config.otlp_endpoint = Some(format!("http://{}", receiver.addr));
    let gw = start(config).await;
    assert!(gw.state.semantic.is_some(), "model loaded");
    assert!(gw.state.otel.is_some(), "tracing on");

    // A streamed miss, joined to the client's trace.
    let miss_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let (cache, miss_id) = chat(
        &gw,
        QUESTION,
        true,
        &[
            ("traceparent", &format!("00-{miss_trace}-{client_span}-01")),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    assert_eq!(cache, "miss");
    let (sent, state) = upstream_context(&sim);
    let sent = sent.expect("the upstream received a traceparent");
    let parts: Vec<&str> = sent.split('-').collect();
    assert_eq!(parts.len(), 4, "{sent}");
    assert_eq!((parts[0], parts[1], parts[3]), ("00", miss_trace, "01"));
    assert_ne!(
        parts[2], client_span,
        "the upstream's parent is Reprise's span"
    );
    let upstream_parent = parts[2].to_owned();
    assert_eq!(state.as_deref(), Some("congo=t61rcWkgMzE"));

    // The exact repeat and a paraphrase are served from the cache, each in its own client trace.
    wait_for_entries(&gw, 1).await;
    for _ in 0..300 {
        let indexed = gw.state.semantic.as_ref().map_or(0, |s| {
            reprise_server::index::VectorIndex::len(s.index.as_ref())
        });
        if indexed > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hit_trace = "0af7651916cd43dd8448eb211c80319c";
    let (cache, hit_id) = chat(
        &gw,
        QUESTION,
        true,
        &[(
            "traceparent",
            &format!("00-{hit_trace}-b7ad6b7169203331-01"),
        )],
    )
    .await;
    assert_eq!(cache, "hit");
    let semantic_trace = "11111111111111111111111111111111";
    let (cache, _) = chat(
        &gw,
        PARAPHRASE,
        false,
        &[(
            "traceparent",
            &format!("00-{semantic_trace}-2222222222222222-01"),
        )],
    )
    .await;
    assert_eq!(cache, "semantic-hit");
    assert_eq!(upstream_calls(&sim), 1, "the hits never went upstream");

    // A client that does not sample: the context still goes upstream (not sampled), no span is sent.
    let unsampled = "33333333333333333333333333333333";
    let (cache, _) = chat(
        &gw,
        "what is the capital of France",
        false,
        &[(
            "traceparent",
            &format!("00-{unsampled}-4444444444444444-00"),
        )],
    )
    .await;
    assert_eq!(cache, "miss");
    let (sent, _) = upstream_context(&sim);
    let sent = sent.expect("traceparent");
    assert!(
        sent.starts_with(&format!("00-{unsampled}-")) && sent.ends_with("-00"),
        "{sent}"
    );

    // An upstream that fails: the request span is an error, named by the gateway's error code.
    let failed_trace = "55555555555555555555555555555555";
    let failed = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header(
            "traceparent",
            format!("00-{failed_trace}-6666666666666666-01"),
        )
        .header("x-sim-fault", "close-early")
        .json(&chat_body("a question the upstream drops", false))
        .send()
        .await
        .expect("send");
    assert_eq!(failed.status(), 502);
    let failed_body: Value = failed.json().await.expect("error body");
    let failed_code = failed_body["error"]["code"]
        .as_str()
        .expect("code")
        .to_owned();

    // A pass-through request without a traceparent starts a trace, and the upstream joins it.
    let models_response = client()
        .get(gw.url("/v1/models"))
        .bearer_auth(CLIENT_KEY)
        .send()
        .await
        .expect("models");
    assert_eq!(models_response.status(), 200);
    let _ = models_response.bytes().await;
    let (sent, _) = upstream_context(&sim);
    let sent = sent.expect("a new trace's traceparent");
    let new_trace = sent.split('-').nth(1).expect("trace id").to_owned();

    // Shutdown flushes what is queued.
    gw.shutdown().await.expect("shutdown");
    let spans = receiver.spans();

    let (root, children) = request_tree(&spans, miss_trace);
    assert_eq!(root["name"], "POST /v1/chat/completions");
    assert_eq!(root["parentSpanId"], client_span);
    assert_eq!(root["spanId"], upstream_parent.as_str());
    assert_eq!(root["traceState"], "congo=t61rcWkgMzE");
    let a = attrs(root);
    assert_eq!(a["reprise.cache"]["stringValue"], "miss");
    assert_eq!(a["reprise.request_id"]["stringValue"], miss_id.as_str());
    assert_eq!(a["http.response.status_code"]["intValue"], "200");
    assert_eq!(a["http.route"]["stringValue"], "/v1/chat/completions");
    assert_eq!(a["gen_ai.request.model"]["stringValue"], "sim-model");
    assert_eq!(a["reprise.stream"]["boolValue"], true);
    assert_eq!(a["reprise.completion"]["stringValue"], "complete");
    assert_ne!(a["reprise.tokens"]["intValue"], "0");
    assert!(a["reprise.ttft_ms"]["doubleValue"].as_f64().expect("ttft") > 0.0);
    assert!(!a.contains_key("reprise.entry_id"));
    assert!(root.get("status").is_none(), "not an error");
    let phases = names(&children);
    for phase in [
        "ingress",
        "lookup",
        "embed",
        "search",
        "upstream_send",
        "ttft",
        "decode",
        "downstream",
    ] {
        assert!(phases.contains(&phase), "{phase} missing from {phases:?}");
    }
    let ttft = children
        .iter()
        .find(|c| c["name"] == "ttft")
        .expect("ttft span");
    // The simulated upstream waits 60 ms before its first token.
    let ttft_ns = nanos(ttft, "endTimeUnixNano") - nanos(ttft, "startTimeUnixNano");
    assert!(ttft_ns >= 50_000_000, "{ttft}");

    let (root, children) = request_tree(&spans, hit_trace);
    assert_eq!(root["parentSpanId"], "b7ad6b7169203331");
    let a = attrs(root);
    assert_eq!(a["reprise.cache"]["stringValue"], "hit");
    assert_eq!(a["reprise.request_id"]["stringValue"], hit_id.as_str());
    assert!(a["reprise.entry_id"]["stringValue"].is_string());
    assert!(
        a["reprise.ttft_saved_ms"]["doubleValue"]
            .as_f64()
            .expect("saved")
            > 0.0
    );
    let phases = names(&children);
    assert!(
        phases.contains(&"lookup") && phases.contains(&"ttft"),
        "{phases:?}"
    );
    assert!(!phases.contains(&"upstream_send"), "{phases:?}");

    let (root, children) = request_tree(&spans, semantic_trace);
    let a = attrs(root);
    assert_eq!(a["reprise.cache"]["stringValue"], "semantic-hit");
    let similarity = a["reprise.similarity"]["doubleValue"]
        .as_f64()
        .expect("similarity");
    assert!(similarity > 0.5 && similarity <= 1.0, "{similarity}");
    assert_eq!(
        a["reprise.entry_id"],
        attrs(request_tree(&spans, hit_trace).0)["reprise.entry_id"]
    );
    let phases = names(&children);
    assert!(
        phases.contains(&"embed") && phases.contains(&"search"),
        "{phases:?}"
    );

    assert!(
        !spans.iter().any(|s| s["traceId"] == unsampled),
        "a span of an unsampled trace was exported"
    );
    let (root, _) = request_tree(&spans, failed_trace);
    assert_eq!(root["status"]["code"], 2, "{root}");
    let a = attrs(root);
    assert_eq!(a["error.type"]["stringValue"], failed_code.as_str());
    assert_eq!(a["http.response.status_code"]["intValue"], "502");
    assert_eq!(a["reprise.completion"]["stringValue"], "gateway_error");

    let (root, _) = request_tree(&spans, &new_trace);
    assert_eq!(root["name"], "GET /v1/{*rest}");
    assert!(
        root.get("parentSpanId").is_none(),
        "a new trace has no parent"
    );
    assert_eq!(attrs(root)["reprise.cache"]["stringValue"], "pass");

    // Never a prompt, a key or a credential in what was exported.
    let raw: Vec<u8> = receiver.raw().concat();
    let raw = String::from_utf8(raw).expect("utf-8");
    for secret in [
        QUESTION,
        PARAPHRASE,
        "capital of France",
        "the upstream drops",
        CLIENT_KEY,
        "admin-secret",
    ] {
        assert!(!raw.contains(secret), "`{secret}` was exported");
    }
}

#[tokio::test]
async fn with_tracing_off_nothing_is_sent_and_traceparent_passes_untouched() {
    let receiver = Receiver::start().await;
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.semantic = false;
    let gw = start(config).await;
    assert!(gw.state.otel.is_none(), "tracing is off by default");
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (cache, _) = chat(
        &gw,
        "hello there",
        false,
        &[
            ("traceparent", traceparent),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    assert_eq!(cache, "miss");
    assert_eq!(
        upstream_context(&sim),
        (
            Some(traceparent.to_owned()),
            Some("congo=t61rcWkgMzE".to_owned())
        )
    );
    let health = health(&gw).await;
    assert!(health["tracing"].is_null(), "{health}");
    gw.shutdown().await.expect("shutdown");
    assert!(receiver.raw().is_empty());
}

/// The value of the metric line that starts with `name` (labels included) in `/metrics`.
fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test]
async fn a_dead_collector_is_retried_with_backoff_and_gets_the_queued_spans_when_back() {
    // A port with nothing listening on it: every export is refused at connect. The socket stays
    // bound meanwhile, so no other test can take the port before the collector comes back on it.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let dead = socket.local_addr().expect("port");
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.semantic = false;
    config.otlp_endpoint = Some(format!("http://{dead}"));
    let gw = start(config).await;
    let (cache, _) = chat(&gw, QUESTION, false, &[]).await;
    assert_eq!(cache, "miss");
    wait_for_entries(&gw, 1).await;
    // More spans than the queue holds (2048 by default; a hit makes several), eight at a time.
    for _ in 0..100 {
        let rounds: Vec<_> = (0..8).map(|_| chat(&gw, QUESTION, false, &[])).collect();
        for (cache, _) in futures_util::future::join_all(rounds).await {
            assert_eq!(cache, "hit");
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let text = metrics(&gw).await;
    let attempts = metric(&text, "reprise_trace_export_failures_total").expect("metric");
    // Without a backoff every full batch (and every tick) was an attempt; with it a handful.
    assert!(
        (1..=15).contains(&attempts),
        "{attempts} failed exports\n{text}"
    );
    let dropped = metric(&text, "reprise_trace_spans_total{result=\"dropped\"}").expect("metric");
    assert!(dropped > 0, "{text}");
    let health = health(&gw).await;
    assert_eq!(health["tracing"]["dropped"], dropped, "{health}");
    assert_eq!(health["tracing"]["exported"], 0, "{health}");

    // The collector comes back on the same port: the queued spans reach it at the next retry.
    let receiver = Receiver::serve(socket.listen(1024).expect("listen"));
    let mut spans = 0;
    for _ in 0..600 {
        spans = receiver.spans().len();
        if spans > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(spans > 0, "exports never resumed");
    let mut exported = 0;
    for _ in 0..100 {
        let text = metrics(&gw).await;
        exported = metric(&text, "reprise_trace_spans_total{result=\"exported\"}").unwrap_or(0);
        if exported > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(exported > 0, "the exported spans were not counted");
    assert!(exported as usize <= receiver.spans().len());
}
