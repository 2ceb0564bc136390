//! Property-based fuzz of the whole router (issue 14): random JSON-ish bodies (valid and broken),
//! random values for every `x-reprise-*` header and `Cache-Control`, random paths and methods, sent
//! with `oneshot` to a gateway whose upstream is unreachable. It must never panic, never answer a 5xx
//! of its own (only 502/504 for the upstream), and every 4xx must carry OpenAI's error shape with a
//! message.
//!
//! A fixed seed makes every run send the same requests. `PROPTEST_CASES` sets how many
//! (`scripts/test.sh` runs 100,000); a plain `cargo test` runs [`DEFAULT_CASES`].

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderName, HeaderValue, Method, Request, StatusCode};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngAlgorithm, TestRng, TestRunner};
use reprise_server::config::{Config, Secret};
use reprise_server::AppState;
use serde_json::{json, Map, Value};
use tower::ServiceExt;

/// Cases of a plain `cargo test` run: enough to cover every generator branch many times.
const DEFAULT_CASES: u32 = 5_000;
/// The seed of every run (any fixed 32 bytes).
const SEED: [u8; 32] = *b"reprise issue 14 fuzz, fixed one";
const TOKEN: &str = "fuzz-admin-token";
/// Prompts warmed into the cache before the run, so that some requests are hits and exercise replay
/// (and its pacing) with the fuzzed headers.
const WARMED: [&str; 3] = ["warm one", "warm two", "warm three"];

/// A header as generated: its name and raw value bytes (possibly not a valid header value).
type RawHeader = (HeaderName, Vec<u8>);

/// One generated request.
#[derive(Clone)]
struct Case {
    method: Method,
    path: String,
    headers: Vec<RawHeader>,
    body: Vec<u8>,
}

impl std::fmt::Debug for Case {
    /// Text where the bytes are text, so a failing case can be read (and replayed with curl).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let headers: Vec<(String, String)> = self
            .headers
            .iter()
            .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v).into_owned()))
            .collect();
        f.debug_struct("Case")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("headers", &headers)
            .field("body", &String::from_utf8_lossy(&self.body))
            .finish()
    }
}

fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<f64>().prop_map(|f| f.to_string()),
        any::<f32>().prop_map(|f| format!("{f:e}")),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        (0u32..100).prop_map(|n| n.to_string()),
        (0.0f64..2.0).prop_map(|f| f.to_string()),
        "[0-9]{18,40}",
        prop::sample::select(vec![
            "NaN", "nan", "inf", "-inf", "infinity", "1e-300", "5e-324", "1e-19", "1e308", "-0",
            "0", "0.1", "1e6", "1000001", "", " 5 ", "+5", "0x10", "1_000",
        ])
        .prop_map(str::to_owned),
    ]
}

/// Bytes of a header value: mostly meaningful for the header, sometimes anything a client could send.
fn header_value(name: &'static str) -> BoxedStrategy<Vec<u8>> {
    let meaningful: BoxedStrategy<String> = match name {
        "x-reprise-cache-mode" => prop_oneof![
            prop::sample::select(vec![
                "on",
                "off",
                "read-only",
                "write-only",
                "exact-only",
                "ON ",
                "sometimes"
            ])
            .prop_map(str::to_owned),
            "[a-z-]{0,12}",
        ]
        .boxed(),
        "x-reprise-replay" => prop_oneof![
            prop::sample::select(vec!["instant", "recorded", "Recorded", "tokens-per-second"])
                .prop_map(str::to_owned),
            number_text().prop_map(|n| format!("tokens-per-second={n}")),
        ]
        .boxed(),
        "x-reprise-namespace" => prop_oneof!["[a-zA-Z0-9_.:/-]{0,140}", ".{0,20}"].boxed(),
        "cache-control" => prop::collection::vec(
            prop_oneof![
                number_text().prop_map(|n| format!("max-age={n}")),
                number_text().prop_map(|n| format!("s-maxage={n}")),
                number_text().prop_map(|n| format!("max-age=\"{n}\"")),
                prop::sample::select(vec!["no-cache", "no-store", "private", "max-age", "=", ""])
                    .prop_map(str::to_owned),
            ],
            0..4,
        )
        .prop_map(|d| d.join(", "))
        .boxed(),
        "authorization" => prop_oneof![
            Just(format!("Bearer {TOKEN}")),
            "Bearer [a-z0-9-]{0,20}",
            ".{0,20}",
        ]
        .boxed(),
        "content-type" => prop_oneof![
            6 => Just("application/json".to_owned()),
            1 => Just("application/json; charset=utf-8".to_owned()),
            1 => "[a-z/+;= -]{0,30}",
        ]
        .boxed(),
        // ttl, threshold and anything numeric.
        _ => number_text().boxed(),
    };
    prop_oneof![
        8 => meaningful.prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..24),
    ]
    .boxed()
}

fn headers() -> impl Strategy<Value = Vec<RawHeader>> {
    let names = [
        "x-reprise-cache-mode",
        "x-reprise-ttl",
        "x-reprise-replay",
        "x-reprise-threshold",
        "x-reprise-namespace",
        "cache-control",
        "authorization",
        "content-type",
    ];
    let each: Vec<BoxedStrategy<Option<RawHeader>>> = names
        .into_iter()
        .map(|name| {
            // Without a JSON content type the API routes stop at 415: send one most of the time.
            let p = if name == "content-type" { 0.9 } else { 0.15 };
            prop::option::weighted(p, header_value(name))
                .prop_map(move |v| v.map(|v| (HeaderName::from_static(name), v)))
                .boxed()
        })
        .collect();
    let extra = prop::option::weighted(
        0.1,
        (
            "x-reprise-[a-z]{1,10}",
            prop::collection::vec(any::<u8>(), 0..16),
        ),
    );
    (each, extra).prop_map(|(each, extra)| {
        let mut headers: Vec<RawHeader> = each.into_iter().flatten().collect();
        if let Some((name, value)) = extra {
            if let Ok(name) = HeaderName::try_from(name) {
                headers.push((name, value));
            }
        }
        headers
    })
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,24}".prop_map(Value::String),
        prop::sample::select(WARMED.to_vec()).prop_map(|p| json!(p)),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "model",
            "messages",
            "stream",
            "prompt",
            "input",
            "role",
            "content",
            "stream_options",
            "include_usage",
            "n",
            "temperature",
            "max_tokens",
            "tools",
            "user",
            "similarity_threshold",
            "replay",
            "default_ttl_s",
            "older_than_s",
            "min_similarity",
            "ttl_s",
            "response",
        ])
        .prop_map(str::to_owned),
        "[a-z_]{1,10}",
    ]
}

/// A request body shaped like a chat or completions call, with fuzzed parts.
fn api_body() -> impl Strategy<Value = Value> {
    let content = prop_oneof![
        3 => prop::sample::select(WARMED.to_vec()).prop_map(|p| json!(p)),
        2 => ".{0,40}".prop_map(Value::String),
        1 => json_value(),
    ];
    let message = (
        prop_oneof![
            4 => Just(json!("user")),
            1 => prop::sample::select(vec!["system", "assistant", "tool", "developer", ""]).prop_map(|r| json!(r)),
            1 => json_value(),
        ],
        content.clone(),
    )
        .prop_map(|(role, content)| json!({"role": role, "content": content}));
    (
        prop_oneof![4 => Just(json!("sim-model")), 1 => json_value()],
        prop::collection::vec(message, 0..4),
        prop_oneof![2 => any::<bool>().prop_map(Value::Bool), 1 => json_value()],
        content,
        prop::collection::btree_map(key(), json_value(), 0..3),
        0u8..4,
    )
        .prop_map(|(model, messages, stream, prompt, extra, shape)| {
            let mut body = Map::new();
            body.insert("model".into(), model);
            match shape {
                0 => {
                    body.insert("messages".into(), Value::Array(messages));
                }
                1 => {
                    body.insert("prompt".into(), prompt.clone());
                }
                2 => {
                    body.insert("input".into(), prompt);
                }
                _ => {
                    body.insert("messages".into(), Value::Array(messages));
                    body.insert("prompt".into(), prompt);
                }
            }
            body.insert("stream".into(), stream);
            body.extend(extra);
            Value::Object(body)
        })
}

/// Exactly a warmed request (stream or not, with or without usage): a hit, so replay and its pacing
/// meet the fuzzed headers.
fn hit_body() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(WARMED.to_vec()),
        prop::option::of(any::<bool>()),
        prop::option::of(json_value()),
    )
        .prop_map(|(prompt, stream, usage)| {
            let mut body = json!({"model": "sim-model", "messages": [{"role": "user", "content": prompt}], "stream": stream.unwrap_or(true)});
            if let Some(usage) = usage {
                body["stream_options"] = json!({"include_usage": usage});
            }
            body
        })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let valid = prop_oneof![3 => api_body(), 3 => hit_body(), 1 => json_value()]
        .prop_map(|v| serde_json::to_vec(&v).unwrap_or_default());
    prop_oneof![
        6 => valid.clone(),
        // Broken: cut short, or one byte changed.
        2 => (valid.clone(), any::<prop::sample::Index>())
            .prop_map(|(b, at)| b[..at.index(b.len() + 1)].to_vec()),
        1 => (valid, any::<prop::sample::Index>(), any::<u8>()).prop_map(|(mut b, at, byte)| {
            if !b.is_empty() {
                let i = at.index(b.len());
                b[i] = byte;
            }
            b
        }),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec![
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/embeddings",
        ])
        .prop_map(str::to_owned),
        2 => prop::sample::select(vec![
            "/v1/models",
            "/v1",
            "/healthz",
            "/metrics",
            "/admin/stats",
            "/admin/entries",
            "/admin/entries/e_0000000000000001",
            "/admin/invalidate",
            "/admin/config",
            "/admin/requests",
            "/admin/openapi.json",
            "/admin/ui",
        ])
        .prop_map(str::to_owned),
        1 => (
            prop::sample::select(vec!["/admin/requests", "/admin/entries"]),
            prop_oneof![
                number_text().prop_map(|n| format!("limit={n}")),
                ".{0,12}".prop_map(|q| format!("q={q}")),
                "[a-z]{0,6}=[a-z0-9]{0,6}",
            ],
        )
            .prop_map(|(p, q)| format!("{p}?{q}")),
        1 => "/[ -~]{0,40}",
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![
            8 => Just(Method::POST),
            1 => prop::sample::select(vec![
                Method::GET,
                Method::PUT,
                Method::DELETE,
                Method::PATCH,
                Method::HEAD,
                Method::OPTIONS,
            ]),
        ],
        path(),
        headers(),
        body(),
    )
        .prop_map(|(method, path, headers, body)| Case {
            method,
            path,
            headers,
            body,
        })
}

fn request(case: &Case) -> Request<Body> {
    let mut builder = Request::builder().method(case.method.clone());
    // A path the URI grammar refuses never reaches a server: try it, else fall back to `/`.
    builder = match axum::http::Uri::try_from(case.path.as_str()) {
        Ok(uri) => builder.uri(uri),
        Err(_) => builder.uri("/"),
    };
    for (name, value) in &case.headers {
        // Bytes a client cannot put in a header (control characters) never reach the server either.
        if let Ok(value) = HeaderValue::from_bytes(value) {
            builder = builder.header(name, value);
        }
    }
    builder
        .body(Body::from(case.body.clone()))
        .unwrap_or_else(|_| Request::new(Body::empty()))
}

async fn check(app: axum::Router, case: &Case) -> Result<(), TestCaseError> {
    let response = app
        .oneshot(request(case))
        .await
        .unwrap_or_else(|never| match never {});
    let status = response.status();
    if response
        .headers()
        .get("x-reprise-cache")
        .is_some_and(|v| v == "hit")
    {
        HITS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    // A paced hit may stream for minutes at a slow rate: its head is enough. An error body is
    // whole at once, and must arrive.
    let wait = if status.is_success() {
        Duration::from_millis(20)
    } else {
        Duration::from_secs(10)
    };
    let body =
        tokio::time::timeout(wait, axum::body::to_bytes(response.into_body(), 64 << 20)).await;
    prop_assert!(
        !status.is_server_error()
            || status == StatusCode::BAD_GATEWAY
            || status == StatusCode::GATEWAY_TIMEOUT,
        "{status} of the gateway's own for {case:?}"
    );
    // A HEAD answer has no body, by definition (axum drops it).
    if (status.is_client_error() || status.is_server_error()) && case.method != Method::HEAD {
        let Ok(Ok(body)) = body else {
            return Err(TestCaseError::fail(format!(
                "{status}: the error body did not arrive for {case:?}"
            )));
        };
        let error: Value = serde_json::from_slice(&body).map_err(|e| {
            TestCaseError::fail(format!(
                "{status}: body is not JSON ({e}): {:?} for {case:?}",
                String::from_utf8_lossy(&body)
            ))
        })?;
        let shape = &error["error"];
        prop_assert!(
            shape["message"]
                .as_str()
                .is_some_and(|m| !m.trim().is_empty())
                && shape["type"].is_string()
                && shape.get("param").is_some()
                && shape.get("code").is_some(),
            "{status}: not OpenAI's error shape: {error} for {case:?}"
        );
    }
    Ok(())
}

/// Requests served from the warmed entries (printed, so a change that stops hits is seen).
static HITS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Panics on this test's threads, spawned tasks included (their panics never reach `oneshot`).
static PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn the_router_never_panics_and_answers_every_error_in_openai_shape() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // Other tests of this binary run alongside: count only this test's threads.
        if std::thread::current()
            .name()
            .is_some_and(|n| n.contains("fuzz"))
        {
            PANICS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        previous(info);
    }));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("fuzz-runtime")
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let app = runtime.block_on(async {
        let mut config = Config {
            // Nothing listens on the discard port: every miss is a fast 502.
            upstream_url: "http://127.0.0.1:9/v1".into(),
            data_dir: dir.path().to_owned(),
            admin_token: Some(Secret::new(TOKEN)),
            semantic: false,
            share_across_keys: true,
            connect_timeout_ms: 500,
            request_log_size: 100,
            ..Config::default()
        };
        config.validate().expect("valid config");
        let app = reprise_server::app(AppState::new(config).expect("state"));
        let items: Vec<Value> = WARMED
            .iter()
            .map(|p| json!({"model": "sim-model", "prompt": p, "response": format!("{p}: a warmed answer of several words")}))
            .collect();
        let warm = Request::post("/admin/entries")
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(Body::from(json!({"entries": items}).to_string()))
            .expect("warm request");
        let warmed = app.clone().oneshot(warm).await.expect("warm");
        let status = warmed.status();
        let body = axum::body::to_bytes(warmed.into_body(), 1 << 20).await;
        assert!(status.is_success(), "warming the cache: {status} {body:?}");
        app
    });
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(DEFAULT_CASES);
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED));
    let started = std::time::Instant::now();
    let result = runner.run(&case(), |case| runtime.block_on(check(app.clone(), &case)));
    eprintln!(
        "fuzz: {cases} cases ({} cache hits) in {:.1} s",
        HITS.load(std::sync::atomic::Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    if let Err(err) = result {
        panic!("{err}");
    }
    assert_eq!(
        PANICS.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a task panicked (see the log above)"
    );
}
