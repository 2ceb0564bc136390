//! Shared harness: an in-process gateway on an ephemeral port in front of an in-process `reprise-sim`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use reprise_server::config::{Config, Secret};
use reprise_server::AppState;
use reprise_sim::{self as sim, SimConfig, SimHandle};
use serde_json::{json, Value};
use tokio::sync::oneshot;

pub const SIM_TTFT_MS: f64 = 60.0;

pub struct Gateway {
    pub addr: SocketAddr,
    pub state: AppState,
    /// Keeps a temporary data dir alive as long as the gateway.
    _data: Option<tempfile::TempDir>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Gateway {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Triggers graceful shutdown and waits for `run` to return.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.expect("gateway task")
    }
}

/// Whole answers in a few ms (16 tokens, 1 ms to the first, 0.2 ms apart): many per second for
/// the tests that kill a process under load.
pub async fn quick_sim() -> SimHandle {
    sim::spawn(SimConfig {
        ttft_ms: 1.0,
        itl_ms: 0.2,
        tokens: 16,
        ..SimConfig::default()
    })
    .await
    .expect("sim")
}

pub async fn sim_default() -> SimHandle {
    sim::spawn(SimConfig {
        ttft_ms: SIM_TTFT_MS,
        itl_ms: 2.0,
        tokens: 8,
        ..SimConfig::default()
    })
    .await
    .expect("sim")
}

pub fn config_for(upstream: String) -> Config {
    let mut config = Config {
        upstream_url: upstream,
        admin_token: Some(Secret::new("admin-secret")),
        ..Config::default()
    };
    config.validate().expect("valid config");
    config
}

/// Starts a gateway; a config still on the default data dir gets a temporary one instead.
pub async fn start(config: Config) -> Gateway {
    start_with(config, |config| AppState::new(config).expect("state")).await
}

/// As [`start`], with the state built by `state` from the final config (a store of the test's).
pub async fn start_with(mut config: Config, state: impl FnOnce(Config) -> AppState) -> Gateway {
    let mut data = None;
    if config.data_dir == Config::default().data_dir {
        let dir = tempfile::tempdir().expect("tempdir");
        config.data_dir = dir.path().to_owned();
        data = Some(dir);
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let state = state(config);
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(reprise_server::run(listener, state.clone(), async move {
        let _ = stopped.await;
    }));
    Gateway {
        addr,
        state,
        _data: data,
        stop: Some(stop),
        task,
    }
}

/// A config in front of `upstream` that keeps its store in `dir`.
pub fn config_in(upstream: String, dir: PathBuf) -> Config {
    let mut config = config_for(upstream);
    config.data_dir = dir;
    config
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().build().expect("client")
}

pub fn chat_body(content: &str, stream: bool) -> Value {
    json!({"model": "sim-model", "stream": stream, "messages": [{"role": "user", "content": content}]})
}

/// Parses an SSE body into (data payloads, comment lines).
pub fn parse_sse(text: &str) -> (Vec<String>, Vec<String>) {
    let mut data = Vec::new();
    let mut comments = Vec::new();
    for line in text.lines() {
        if let Some(d) = line.strip_prefix("data: ") {
            data.push(d.to_owned());
        } else if let Some(c) = line.strip_prefix(':') {
            comments.push(c.trim().to_owned());
        }
    }
    (data, comments)
}

/// A chunk without the fields that differ per response (`id`, `created`).
pub fn normalized(chunk: &str) -> Value {
    let mut v: Value = serde_json::from_str(chunk).expect("json chunk");
    if let Some(o) = v.as_object_mut() {
        o.remove("id");
        o.remove("created");
    }
    v
}

pub async fn stream_text(response: reqwest::Response) -> String {
    response.text().await.expect("body")
}

/// A chat request to the gateway as tenant `sk-tenant-a`, with extra headers.
pub async fn post(gw: &Gateway, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let auth = [("authorization", "Bearer sk-tenant-a")];
    post_to(gw, "/v1/chat/completions", body, &[&auth, headers].concat()).await
}

/// `body` as JSON to `path` of the gateway, with `headers` (credentials included).
pub async fn post_to(
    gw: &Gateway,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client().post(gw.url(path)).json(body);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request.send().await.expect("send")
}

/// A response header as text, if present.
pub fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// `x-reprise-cache`, or `none`.
/// The gateway's `/healthz` body.
pub async fn health(gw: &Gateway) -> Value {
    client()
        .get(gw.url("/healthz"))
        .send()
        .await
        .expect("healthz")
        .json()
        .await
        .expect("json")
}

pub fn outcome(response: &reqwest::Response) -> String {
    header(response, "x-reprise-cache").unwrap_or_else(|| "none".to_owned())
}

/// The answer text of a streamed or non-streamed response.
pub async fn content(response: reqwest::Response, stream: bool) -> String {
    if stream {
        let text = stream_text(response).await;
        let (data, _) = parse_sse(&text);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
        data.iter()
            .filter(|d| *d != "[DONE]")
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                v.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect()
    } else {
        let body: Value = response.json().await.expect("json");
        body.pointer("/choices/0/message/content")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    }
}

pub fn upstream_calls(sim: &SimHandle) -> u64 {
    sim.stats.snapshot().chat_completions
}

/// Writes are off the request path: wait until the store has `n` entries.
pub async fn wait_for_entries(gw: &Gateway, n: usize) {
    for _ in 0..200 {
        if gw.state.cache.store.len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "store never reached {n} entries (has {})",
        gw.state.cache.store.len()
    );
}

/// Every entry `store` holds, after checking each is whole: a finished answer that may be cached,
/// with its events, reachable through its exact key (what a crash must never break). With
/// `superseded_ok`, an entry may instead have been replaced by a newer one for its key (a shared
/// store: the process that wrote it died between writing it and naming it, and another replica
/// answered the same prompt since).
pub fn whole_entries(
    store: &dyn reprise_server::store::Store,
    superseded_ok: bool,
) -> Vec<reprise_server::entry::Entry> {
    use reprise_server::ingress::Route;
    let entries = store.list(None, 1_000_000).expect("list");
    for entry in &entries {
        let route = if entry.summary.route == Route::Completions.name() {
            Route::Completions
        } else {
            Route::ChatCompletions
        };
        assert_eq!(
            reprise_server::api::of(route).check(&entry.body, false),
            Ok(()),
            "{entry:?}"
        );
        assert!(!entry.events.is_empty());
        let by_key = store.get_by_key(&entry.key).expect("get").expect("indexed");
        if superseded_ok {
            assert!(
                by_key.id >= entry.id,
                "{:?} names {:?}",
                entry.id,
                by_key.id
            );
        } else {
            assert_eq!(by_key.id, entry.id);
        }
    }
    entries
}

/// `gw`'s `/metrics` text (with the harness's admin token).
/// `GET` of an admin route with the test token: a 200, read as JSON.
pub async fn admin_json(gw: &Gateway, path: &str) -> Value {
    let response = client()
        .get(gw.url(path))
        .bearer_auth("admin-secret")
        .send()
        .await
        .expect("admin request");
    assert_eq!(response.status(), 200, "{path}");
    response.json().await.expect("json")
}

pub async fn metrics(gw: &Gateway) -> String {
    client()
        .get(gw.url("/metrics"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// A stream of named events (the Responses API's, Anthropic's Messages API's) read back: (event
/// name, data) pairs, and what follows the last event.
pub struct Typed {
    pub events: Vec<(String, Value)>,
    pub tail: String,
}

pub fn parse_typed(text: &str) -> Typed {
    let mut events = Vec::new();
    let mut tail = String::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let mut name = None;
        let mut data = None;
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_owned());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data = Some(d.to_owned());
            }
        }
        match (name, data) {
            (Some(name), Some(data)) => {
                let value: Value = serde_json::from_str(&data).expect("event json");
                assert_eq!(
                    value["type"],
                    json!(name),
                    "the event line names the data's type"
                );
                events.push((name, value));
                tail.clear();
            }
            (None, None) => tail.push_str(block),
            other => panic!("an unnamed or empty event: {other:?} in {text}"),
        }
    }
    Typed { events, tail }
}

impl Typed {
    /// The event names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.events.iter().map(|(n, _)| n.as_str()).collect()
    }
}
