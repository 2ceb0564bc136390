//! Router-level tests of the stages that had no tests of their own: `forward` (upstream deadlines,
//! relayed upstream errors), `cache` (single flight, TTL, `max-age`) and the lookup (exact hits, the
//! `no-store` and `no-cache` controls). Each drives `reprise_server::app(state)` with `oneshot`
//! (no client socket, no `serve` loop) against an in-process `reprise-sim` on a loopback port.
//!
//! Deadlines run on tokio's clock, so those tests pause it (`start_paused`): the runtime then jumps
//! to the next timer whenever every task waits, and a 30 s first-byte timeout takes no real time.
//! The simulator runs on the same paused clock, so its pacing is virtual too. TTL and `max-age` are
//! checked against the wall clock (unix ms), which pausing cannot move: those tests wait for real.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use reprise_server::config::Config;
use reprise_server::AppState;
use reprise_sim::{self as sim, SimConfig, SimHandle};
use serde_json::Value;
use tower::ServiceExt;

use crate::common::{chat_body, config_for, parse_sse};

/// A gateway state in exact-only mode over a temporary data dir, in front of `sim`.
struct Gateway {
    state: AppState,
    _data: tempfile::TempDir,
}

fn gateway(sim: &SimHandle, tune: impl FnOnce(&mut Config)) -> Gateway {
    let data = tempfile::tempdir().expect("tempdir");
    let mut config = config_for(sim.base_url());
    config.data_dir = data.path().to_owned();
    // These tests are about the stages around the semantic one: no model, no embedding.
    config.semantic = false;
    tune(&mut config);
    config.validate().expect("valid config");
    Gateway {
        state: AppState::new(config).expect("state"),
        _data: data,
    }
}

async fn fast_sim() -> SimHandle {
    sim::spawn(SimConfig {
        ttft_ms: 10.0,
        itl_ms: 1.0,
        tokens: 6,
        ..SimConfig::default()
    })
    .await
    .expect("sim")
}

/// One chat request through the router, as tenant `sk-tenant-a`, with extra headers.
async fn send(gw: &Gateway, body: &Value, headers: &[(&str, &str)]) -> Response<Body> {
    let mut request = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-tenant-a");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Body::from(body.to_string())).expect("request");
    reprise_server::app(gw.state.clone())
        .oneshot(request)
        .await
        .expect("the router is infallible")
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> &'a str {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("none")
}

/// `x-reprise-cache`, or `none`.
fn outcome(response: &Response<Body>) -> String {
    header(response, "x-reprise-cache").to_owned()
}

/// Reads the whole body (the stream's end included) as text.
async fn text(response: Response<Body>) -> String {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    String::from_utf8(bytes.to_vec()).expect("utf-8 body")
}

/// The answer's text from a streamed or a non-streamed body.
fn answer(body: &str, stream: bool) -> String {
    if !stream {
        let v: Value = serde_json::from_str(body).expect("json body");
        return v
            .pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .expect("content")
            .to_owned();
    }
    let (data, _) = parse_sse(body);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{body}");
    data.iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .map(str::to_owned)
        })
        .collect()
}

/// Sends a request and reads its answer: (outcome, answer text).
async fn ask(gw: &Gateway, body: &Value, headers: &[(&str, &str)]) -> (String, String) {
    let stream = body["stream"] == true;
    let response = send(gw, body, headers).await;
    assert_eq!(response.status(), StatusCode::OK);
    let (o, id) = (outcome(&response), request_id(&response));
    let text = answer(&text(response).await, stream);
    settle(gw, &id).await;
    (o, text)
}

fn request_id(response: &Response<Body>) -> String {
    header(response, "x-reprise-request-id").to_owned()
}

/// Waits until the request is in the request log (its relay, and so any store write, is done),
/// then until the cache's writer thread has applied every write queued so far.
async fn settle(gw: &Gateway, request_id: &str) {
    for _ in 0..1000 {
        if gw
            .state
            .requests
            .recent(10_000)
            .iter()
            .any(|r| r.id == request_id)
        {
            let cache = gw.state.cache.clone();
            tokio::task::spawn_blocking(move || cache.drain())
                .await
                .expect("drain");
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("request {request_id} was never recorded");
}

fn upstream_calls(sim: &SimHandle) -> u64 {
    sim.stats.snapshot().chat_completions
}

fn entries(gw: &Gateway) -> usize {
    gw.state.cache.store.len()
}

// ---- forward ----

/// An upstream that never answers ends at the first-byte deadline (tokio time, paused: the 30 s
/// pass at once), as a 504 in OpenAI's shape, and leaves nothing in the store for that prompt:
/// whether no response head comes (`hang`), or a stream's head comes but its first event does not
/// (an hour's time to first token).
#[tokio::test(start_paused = true)]
async fn a_silent_upstream_ends_at_the_first_byte_deadline_and_nothing_is_stored() {
    let sim = fast_sim().await;
    let gw = gateway(&sim, |c| c.first_byte_timeout_ms = 30_000);
    let cases = [
        (false, ("x-sim-fault", "hang")),
        (true, ("x-sim-fault", "hang")),
        (true, ("x-sim-ttft-ms", "3600000")),
    ];
    for (stream, silence) in cases {
        let body = chat_body(&format!("silence: {silence:?}, stream {stream}"), stream);
        let stored = entries(&gw);
        let started = tokio::time::Instant::now();
        let response = send(&gw, &body, &[silence]).await;
        let waited = started.elapsed();
        assert_eq!(
            response.status(),
            StatusCode::GATEWAY_TIMEOUT,
            "{silence:?}"
        );
        assert_eq!(outcome(&response), "miss");
        let id = request_id(&response);
        let error: Value = serde_json::from_str(&text(response).await).expect("json");
        // The gateway's own timeout, not the simulator's "hang over" 504 an hour later.
        assert_eq!(error["error"]["code"], "upstream_timeout", "{error}");
        assert_eq!(error["error"]["type"], "upstream_error", "{error}");
        assert!(
            waited >= Duration::from_secs(30) && waited < Duration::from_secs(60),
            "ended after {waited:?} of tokio time, not at the 30 s deadline"
        );
        settle(&gw, &id).await;
        assert_eq!(entries(&gw), stored, "a timed-out request stored something");
        // The same prompt is still a miss, and an answered one is stored.
        let (o, _) = ask(&gw, &body, &[]).await;
        assert_eq!(o, "miss");
    }
    assert_eq!(entries(&gw), cases.len());
}

/// A stream that stalls after its whole answer and finish reason, before `[DONE]`, ends at the
/// idle timeout with an OpenAI-shaped error event and no `[DONE]`, and is not stored: the answer
/// looks complete, so only the timeout's verdict keeps it out of the store.
#[tokio::test(start_paused = true)]
async fn an_idle_timeout_mid_stream_ends_with_an_error_event_and_nothing_is_stored() {
    let sim = fast_sim().await;
    let gw = gateway(&sim, |c| c.idle_timeout_ms = 5_000);
    let body = chat_body("stall before done", true);
    let started = tokio::time::Instant::now();
    let response = send(&gw, &body, &[("x-sim-fault", "stall-at-done")]).await;
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "committed at the first event"
    );
    assert_eq!(outcome(&response), "miss");
    let id = request_id(&response);
    let stream = text(response).await;
    let waited = started.elapsed();
    let (data, _) = parse_sse(&stream);
    assert!(!data.iter().any(|d| d == "[DONE]"), "{stream}");
    assert!(
        data.iter()
            .any(|d| d.contains("\"finish_reason\":\"stop\"")),
        "the whole answer came through before the stall: {stream}"
    );
    let last: Value = serde_json::from_str(data.last().expect("events")).expect("json");
    assert_eq!(last["error"]["code"], "upstream_timeout", "{stream}");
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(60),
        "ended after {waited:?} of tokio time, not at the 5 s idle timeout"
    );
    settle(&gw, &id).await;
    assert_eq!(entries(&gw), 0, "a stream that timed out was stored");
    // Without the stall the same answer is stored: the timeout alone kept it out.
    let (o, _) = ask(&gw, &body, &[]).await;
    assert_eq!(o, "miss");
    assert_eq!(entries(&gw), 1);
}

/// An upstream 500 reaches the client with its status and body, and is never stored.
#[tokio::test]
async fn an_upstream_500_is_relayed_and_never_stored() {
    let sim = fast_sim().await;
    let gw = gateway(&sim, |_| {});
    for stream in [false, true] {
        let body = chat_body(&format!("fail, stream {stream}"), stream);
        let stored = entries(&gw);
        let response = send(&gw, &body, &[("x-sim-fault", "status=500")]).await;
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(outcome(&response), "miss");
        let id = request_id(&response);
        let error: Value = serde_json::from_str(&text(response).await).expect("json");
        assert_eq!(error["error"]["message"], "injected fault", "{error}");
        settle(&gw, &id).await;
        assert_eq!(entries(&gw), stored, "a 500 was stored");
        let calls = upstream_calls(&sim);
        assert_eq!(ask(&gw, &body, &[]).await.0, "miss");
        assert_eq!(upstream_calls(&sim), calls + 1);
        assert_eq!(
            entries(&gw),
            stored + 1,
            "the same prompt answered is stored"
        );
    }
}

// ---- cache ----

/// Identical misses that arrive together make one upstream call: one leader, the rest follow its
/// flight and get the same answer in their own shape. On a paused clock every request has joined
/// before the simulator's 1 s time to first token passes, so the count is exact.
#[tokio::test(start_paused = true)]
async fn concurrent_identical_misses_make_one_upstream_call() {
    let sim = sim::spawn(SimConfig {
        ttft_ms: 1_000.0,
        itl_ms: 5.0,
        tokens: 6,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    let gw = std::sync::Arc::new(gateway(&sim, |_| {}));
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let gw = gw.clone();
            tokio::spawn(async move {
                let stream = i % 2 == 0;
                let response = send(&gw, &chat_body("all at once", stream), &[]).await;
                assert_eq!(response.status(), StatusCode::OK);
                let o = outcome(&response);
                (o, answer(&text(response).await, stream))
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    let mut answers = Vec::new();
    for call in calls {
        let (o, a) = call.await.expect("request task");
        outcomes.push(o);
        answers.push(a);
    }
    assert_eq!(upstream_calls(&sim), 1, "{outcomes:?}");
    assert_eq!(
        outcomes.iter().filter(|o| *o == "miss").count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| *o == "coalesced").count(),
        7,
        "{outcomes:?}"
    );
    assert!(!answers[0].is_empty());
    assert!(answers.iter().all(|a| a == &answers[0]), "{answers:?}");
}

/// An entry past its TTL is a miss. The gateway's unix clock (`record::unix_ms`) follows tokio's,
/// so the test pauses it and moves it past the one-second TTL instead of waiting. Time is paused only
/// around that jump: while it is paused, a request to the (real, in-process) upstream would let
/// tokio jump to the first-byte deadline.
#[tokio::test]
async fn an_entry_past_its_ttl_is_a_miss() {
    let sim = fast_sim().await;
    // No sweep during the test: the expired entry stays in the store, so the lookup's own check
    // is what turns it into a miss.
    let gw = gateway(&sim, |c| c.sweep_interval_ms = 3_600_000);
    let body = chat_body("short-lived", false);
    assert_eq!(ask(&gw, &body, &[("x-reprise-ttl", "1")]).await.0, "miss");
    assert_eq!(
        ask(&gw, &body, &[]).await.0,
        "hit",
        "stored, within its TTL"
    );
    age_by(Duration::from_millis(1_100)).await;
    assert_eq!(entries(&gw), 1, "still stored, only expired");
    assert_eq!(
        ask(&gw, &body, &[]).await.0,
        "miss",
        "past its one-second TTL"
    );
    assert_eq!(upstream_calls(&sim), 2);
}

/// `Cache-Control: max-age=N` refuses an entry older than N seconds and accepts a younger one.
/// Ages are whole seconds; the entry is aged 1.1 s on tokio's clock (see the TTL test).
#[tokio::test]
async fn max_age_refuses_an_entry_older_than_asked_for() {
    let sim = fast_sim().await;
    let gw = gateway(&sim, |_| {});
    let body = chat_body("how old may it be", false);
    assert_eq!(ask(&gw, &body, &[]).await.0, "miss");
    age_by(Duration::from_millis(1_100)).await;
    let young_enough = ask(&gw, &body, &[("cache-control", "max-age=60")]).await;
    assert_eq!(young_enough.0, "hit");
    let too_old = ask(&gw, &body, &[("cache-control", "max-age=0")]).await;
    assert_eq!(
        too_old.0, "miss",
        "a one-second-old entry is older than max-age=0"
    );
    assert_eq!(upstream_calls(&sim), 2);
}

// ---- lookup ----

/// After a miss is stored, the identical request is an exact hit with the same answer and no
/// upstream call, streamed and not.
#[tokio::test]
async fn an_identical_request_after_a_miss_is_an_exact_hit() {
    let sim = fast_sim().await;
    let gw = gateway(&sim, |_| {});
    for stream in [false, true] {
        let body = chat_body(&format!("say it again, stream {stream}"), stream);
        let (first, original) = ask(&gw, &body, &[]).await;
        assert_eq!(first, "miss");
        let calls = upstream_calls(&sim);
        let (again, replayed) = ask(&gw, &body, &[]).await;
        assert_eq!(again, "hit");
        assert_eq!(replayed, original);
        assert!(!original.is_empty());
        assert_eq!(upstream_calls(&sim), calls, "a hit went upstream");
    }
}

/// `Cache-Control: no-store` gets an answer but stores none; it may still be served a stored one.
#[tokio::test]
async fn no_store_is_answered_but_stores_nothing() {
    let sim = fast_sim().await;
    let gw = gateway(&sim, |_| {});
    let body = chat_body("do not keep this", false);
    let no_store = [("cache-control", "no-store")];
    assert_eq!(ask(&gw, &body, &no_store).await.0, "miss");
    assert_eq!(entries(&gw), 0, "a no-store answer was stored");
    assert_eq!(ask(&gw, &body, &[]).await.0, "miss", "nothing was stored");
    assert_eq!(entries(&gw), 1);
    assert_eq!(
        ask(&gw, &body, &no_store).await.0,
        "hit",
        "no-store still reads"
    );
    assert_eq!(upstream_calls(&sim), 2);
}

/// `Cache-Control: no-cache` skips the lookup (upstream although an entry exists) and stores the
/// fresh answer in place of the old one. The refresh asks the simulator for a shorter answer, so
/// the next hit shows which of the two the store kept.
#[tokio::test]
async fn no_cache_skips_the_lookup_and_replaces_the_entry() {
    let sim = fast_sim().await;
    let gw = gateway(&sim, |_| {});
    let body = chat_body("tell me again, from the source", false);
    let (_, old) = ask(&gw, &body, &[]).await;
    let (refresh, fresh) = ask(
        &gw,
        &body,
        &[("cache-control", "no-cache"), ("x-sim-tokens", "2")],
    )
    .await;
    assert_eq!(refresh, "refresh");
    assert_eq!(upstream_calls(&sim), 2, "no-cache went upstream");
    assert_ne!(fresh, old);
    let (hit, served) = ask(&gw, &body, &[]).await;
    assert_eq!(hit, "hit");
    assert_eq!(served, fresh, "the refreshed answer replaced the old entry");
    assert_eq!(entries(&gw), 1);
}

/// Moves tokio's clock, and with it the gateway's unix clock, forward by `by` without waiting.
async fn age_by(by: Duration) {
    tokio::time::pause();
    tokio::time::advance(by).await;
    tokio::time::resume();
}
