//! Client connections: stalled clients (slow heads, slow bodies, clients that stop reading, h2c
//! header blocks never finished) are dropped, every refused request head on a connection gets an
//! OpenAI-shaped error, and a flood of idle or trickling sockets (in process, and against the
//! binary under a low open-file limit) cannot keep a normal request from being served.

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::resource::{getrlimit, setrlimit, Resource};
use reprise_server::config::Config;
use reprise_sim::{self as sim, SimConfig};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{chat_body, client, config_for, content, post, sim_default, start};

/// Longest any single step here may take before the test fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(10);

fn quick(mut config: Config) -> Config {
    config.client_header_timeout_ms = 300;
    config.client_body_timeout_ms = 300;
    config.keepalive_timeout_ms = 300;
    config
}

/// Reads until the server closes the connection.
async fn read_to_close(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(PATIENCE, stream.read_to_end(&mut out))
        .await
        .expect("the server closed the connection")
        .expect("read");
    out
}

/// Splits a raw HTTP/1.1 response into status, lower-cased head and body.
fn parse_response(raw: &[u8]) -> (u16, String, Vec<u8>) {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, head, raw[end + 4..].to_vec())
}

/// Sends `request` on a new connection and returns the response the server sent before closing.
async fn exchange(addr: SocketAddr, request: &[u8]) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let raw = read_to_close(&mut stream).await;
    assert!(!raw.is_empty(), "the server closed without answering");
    let (status, head, body) = parse_response(&raw);
    assert!(head.contains("content-type: application/json"), "{head}");
    let json: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&body)));
    (status, json)
}

fn assert_openai_error(body: &Value, code: &str) {
    let error = &body["error"];
    assert_eq!(error["code"], code, "{body}");
    assert_eq!(error["type"], "invalid_request_error", "{body}");
    assert!(error["param"].is_null(), "{body}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn refused_request_heads_get_openai_shaped_errors() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let long_target = |n: usize| format!("GET /v1/{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(n));
    let fields = |n: usize| -> String { (0..n).map(|i| format!("x-f{i}: v\r\n")).collect() };
    let cases: Vec<(&str, String, u16, &str)> = vec![
        ("garbage request line", "GARBAGE\r\n\r\n".into(), 400, "malformed_request"),
        (
            "header line without a colon",
            "GET /v1/models HTTP/1.1\r\nHost: x\r\nbad header\r\n\r\n".into(),
            400,
            "malformed_request",
        ),
        (
            "unknown HTTP version",
            "GET /healthz HTTP/7.0\r\nHost: x\r\n\r\n".into(),
            400,
            "malformed_request",
        ),
        (
            "conflicting Content-Length",
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx"
                .into(),
            400,
            "malformed_request",
        ),
        ("20 kB target", long_target(20_000), 414, "uri_too_long"),
        // Beyond hyper's own limit, where it would answer an empty 414 itself.
        ("70 kB target", long_target(70_000), 414, "uri_too_long"),
        (
            "150 header fields",
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{}\r\n", fields(150)),
            431,
            "request_header_fields_too_large",
        ),
        (
            "100 kB header",
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\nx-big: {}\r\n\r\n", "b".repeat(100_000)),
            431,
            "request_header_fields_too_large",
        ),
        // Beyond hyper's own read buffer (about 400 kB).
        (
            "600 kB header",
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\nx-big: {}\r\n\r\n", "b".repeat(600_000)),
            431,
            "request_header_fields_too_large",
        ),
    ];
    for (what, request, status, code) in cases {
        let (got, body) = exchange(gw.addr, request.as_bytes()).await;
        assert_eq!(got, status, "{what}: {body}");
        assert_openai_error(&body, code);
    }

    // A bad head after a good request on the same keep-alive connection is refused the same way.
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut first = vec![0u8; 64 * 1024];
    let n = tokio::time::timeout(PATIENCE, stream.read(&mut first))
        .await
        .expect("first answer")
        .expect("read");
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));
    stream.write_all(b"NOT HTTP\r\n\r\n").await.expect("write");
    let raw = read_to_close(&mut stream).await;
    let (status, _, body) = parse_response(&raw);
    assert_eq!(status, 400);
    assert_openai_error(
        &serde_json::from_slice(&body).expect("json"),
        "malformed_request",
    );

    // And the gateway still serves normal requests.
    let response = post(&gw, &chat_body("still fine", false), &[]).await;
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn h2c_with_prior_knowledge_is_served_and_not_mistaken_for_a_bad_head() {
    let sim = sim_default().await;
    let gw = start(quick(config_for(sim.base_url()))).await;
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    for stream in [false, true] {
        let response = h2
            .post(gw.url("/v1/chat/completions"))
            .json(&chat_body("over h2c", stream))
            .send()
            .await
            .expect("send");
        assert_eq!(response.version(), reqwest::Version::HTTP_2);
        assert_eq!(response.status(), 200);
        assert!(!content(response, stream).await.is_empty());
    }
}

#[tokio::test]
async fn pipelined_requests_are_served_even_when_a_head_arrives_split() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    // Two whole requests in one write, then a third whose head is split around the answers.
    stream
        .write_all(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /hea",
        )
        .await
        .expect("write");
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    while count(&seen, b"HTTP/1.1 200") < 2 {
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut buf))
            .await
            .expect("answers")
            .expect("read");
        assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream
        .write_all(b"lthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    seen.extend(read_to_close(&mut stream).await);
    assert_eq!(
        count(&seen, b"HTTP/1.1 200"),
        3,
        "{}",
        String::from_utf8_lossy(&seen)
    );
}

fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|w| *w == needle)
        .count()
}

#[tokio::test]
async fn stalled_request_heads_and_silent_connections_are_closed() {
    let sim = sim_default().await;
    let mut config = quick(config_for(sim.base_url()));
    config.keepalive_timeout_ms = 60_000;
    let gw = start(config).await;

    // Half a head, then nothing: closed after the header timeout, whatever the keep-alive timeout.
    let mut partial = TcpStream::connect(gw.addr).await.expect("connect");
    partial
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    assert!(read_to_close(&mut partial).await.is_empty());

    // A connection that never sends a byte is closed after the header timeout too.
    let mut silent = TcpStream::connect(gw.addr).await.expect("connect");
    assert!(read_to_close(&mut silent).await.is_empty());

    let metrics = metrics_text(&gw.url("/metrics")).await;
    assert!(
        metric(
            &metrics,
            "reprise_client_connections_closed_total{reason=\"header_timeout\"}"
        ) >= 2.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn idle_keepalive_connections_are_closed_but_slow_requests_are_not() {
    let sim = sim::spawn(SimConfig {
        ttft_ms: 900.0,
        itl_ms: 50.0,
        tokens: 8,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    let mut config = quick(config_for(sim.base_url()));
    config.client_header_timeout_ms = 60_000;
    let gw = start(config).await;

    // One request, then silence: closed after the keep-alive timeout.
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let raw = read_to_close(&mut stream).await;
    let (status, _, _) = parse_response(&raw);
    assert_eq!(status, 200);

    // A request slower than every client timeout (a 900 ms first token, then a stream) is not cut.
    for stream in [false, true] {
        let response = post(&gw, &chat_body("slow answer", stream), &[]).await;
        assert_eq!(response.status(), 200);
        assert!(!content(response, stream).await.is_empty());
    }
}

#[tokio::test]
async fn a_stalled_request_body_gets_an_openai_shaped_408() {
    let sim = sim_default().await;
    let gw = start(quick(config_for(sim.base_url()))).await;
    for (method, path) in [("POST", "/v1/chat/completions"), ("PATCH", "/admin/config")] {
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer admin-secret\r\n\
             Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"model\":"
        );
        let (status, body) = exchange(gw.addr, request.as_bytes()).await;
        assert_eq!(status, 408, "{path}: {body}");
        assert_openai_error(&body, "request_timeout");
    }
    // Nothing reached the upstream.
    assert_eq!(crate::common::upstream_calls(&sim), 0);
}

#[tokio::test]
async fn a_stalled_body_on_a_passthrough_route_is_the_clients_408_not_an_upstream_error() {
    // An upstream that reads whatever it is sent and never answers.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let upstream_addr = upstream.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = upstream.accept().await {
            tokio::spawn(async move {
                let mut sink = vec![0u8; 4096];
                while socket.read(&mut sink).await.is_ok_and(|n| n > 0) {}
            });
        }
    });
    let gw = start(quick(config_for(format!("http://{upstream_addr}/v1")))).await;
    let request =
        "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n\
                   Content-Length: 100\r\n\r\nten bytes.";
    let (status, body) = exchange(gw.addr, request.as_bytes()).await;
    assert_eq!(status, 408, "{body}");
    assert_openai_error(&body, "request_timeout");
}

#[tokio::test]
async fn at_the_connection_limit_idle_connections_make_room_and_busy_ones_finish() {
    let sim = sim::spawn(SimConfig {
        ttft_ms: 400.0,
        itl_ms: 5.0,
        tokens: 8,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    let mut config = config_for(sim.base_url());
    config.max_connections = Some(4);
    // Long timeouts: room must come from reclaiming idle connections, not from timing them out.
    config.client_header_timeout_ms = 120_000;
    config.keepalive_timeout_ms = 120_000;
    let gw = start(config).await;

    let mut idle = Vec::new();
    for _ in 0..12 {
        idle.push(TcpStream::connect(gw.addr).await.expect("connect"));
    }
    let health = tokio::time::timeout(PATIENCE, client().get(gw.url("/healthz")).send())
        .await
        .expect("served despite 12 idle sockets against a limit of 4")
        .expect("send");
    assert_eq!(health.status(), 200);

    // Four slow requests fill the limit; a fifth waits for one of them, and all five complete.
    let mut slow = Vec::new();
    for i in 0..5 {
        let url = gw.url("/v1/chat/completions");
        slow.push(tokio::spawn(async move {
            // A client of its own each: one connection per request.
            let response = reqwest::Client::new()
                .post(url)
                .json(&chat_body(&format!("busy {i}"), true))
                .send()
                .await
                .expect("send");
            (response.status(), response.text().await.expect("body"))
        }));
    }
    for task in slow {
        let (status, text) = tokio::time::timeout(PATIENCE, task)
            .await
            .expect("finished")
            .expect("task");
        assert_eq!(status, 200);
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    }

    let metrics = metrics_text(&gw.url("/metrics")).await;
    assert!(
        metric(&metrics, "reprise_connection_limit_waits_total") >= 1.0,
        "{metrics}"
    );
    assert!(
        metric(
            &metrics,
            "reprise_client_connections_closed_total{reason=\"reclaimed\"}"
        ) >= 1.0,
        "{metrics}"
    );
    drop(idle);
}

/// The gateway binary under a 256-descriptor limit: 400 idle sockets used to exhaust it (accept
/// failed with EMFILE, silently) so that a normal request timed out.
#[tokio::test]
async fn descriptor_exhaustion_does_not_stop_a_normal_request() {
    let log = flood_under_256_descriptors(&[]).await;
    assert!(log.contains("max_connections=64"), "{log}");
    assert!(log.contains("client connection limit reached"), "{log}");
    // Rate-limited: one line for hundreds of waits.
    assert_eq!(
        log.matches("client connection limit reached").count(),
        1,
        "{log}"
    );
}

/// With a connection cap above what the descriptors allow, accept fails with EMFILE: idle
/// connections are then closed to free descriptors, and a normal request still gets through.
#[tokio::test]
async fn running_out_of_descriptors_frees_idle_connections() {
    let log = flood_under_256_descriptors(&[
        "--max-connections",
        "10000",
        "--client-header-timeout-ms",
        "60000",
    ])
    .await;
    assert!(
        log.contains("max_connections leaves too few descriptors"),
        "{log}"
    );
    assert!(
        log.contains("accepting a client connection failed"),
        "{log}"
    );
    assert_eq!(
        log.matches("accepting a client connection failed").count(),
        1,
        "{log}"
    );
}

/// Runs the binary under `ulimit -n 256` with `args`, opens 400 idle sockets, checks that a chat
/// request is answered, stops the gateway and returns its log.
async fn flood_under_256_descriptors(args: &[&str]) -> String {
    flood_under_256_descriptors_with(args, 400, b"").await
}

/// The same with `sockets` sockets that each send `first_bytes` (e.g. part of a head) and then
/// nothing.
async fn flood_under_256_descriptors_with(
    args: &[&str],
    sockets: usize,
    first_bytes: &[u8],
) -> String {
    let sim = sim_default().await;
    let data_dir = tempfile::tempdir().expect("tempdir");
    let log_path = data_dir.path().join("gateway.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    // `ulimit` (a bash builtin) rather than setrlimit in pre_exec: the crates forbid unsafe code.
    let mut child = Command::new("bash")
        .args(["-c", "ulimit -n 256 && exec \"$@\"", "bash"])
        .arg(env!("CARGO_BIN_EXE_reprise"))
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream-url", &sim.base_url()])
        .arg("--data-dir")
        .arg(data_dir.path().join("data"))
        .args(["--semantic", "false"])
        .args(args)
        .env_remove("REPRISE_MAX_CONNECTIONS")
        .env("RUST_LOG", "info")
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .expect("spawn");
    let base = format!("http://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !reqwest::get(format!("{base}/healthz"))
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gateway did not come up"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // This test process needs 400 descriptors for the flood, whatever its own soft limit.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    if soft < 2048 && hard > soft {
        setrlimit(Resource::RLIMIT_NOFILE, hard.min(4096), hard).expect("setrlimit");
    }
    let mut idle = Vec::new();
    for _ in 0..sockets {
        let mut stream = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        if !first_bytes.is_empty() {
            stream.write_all(first_bytes).await.expect("write");
        }
        idle.push(stream);
    }
    let response = tokio::time::timeout(
        PATIENCE,
        client()
            .post(format!("{base}/v1/chat/completions"))
            .json(&chat_body("under a descriptor flood", false))
            .send(),
    )
    .await
    .expect("a normal request is served while the flood's sockets are open")
    .expect("send");
    assert_eq!(response.status(), 200);
    assert!(!content(response, false).await.is_empty());
    drop(idle);

    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "{status}");
    strip_ansi(&std::fs::read_to_string(&log_path).expect("log"))
}

/// The text log without its colour codes.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // An SGR sequence: ESC [ ... m
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

async fn metrics_text(url: &str) -> String {
    client()
        .get(url)
        .bearer_auth("admin-secret")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// The value of one sample line of the Prometheus text, 0 when absent.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn after_the_grace_period_in_flight_streams_are_dropped() {
    // A stream that would take 20 s.
    let sim = sim::spawn(SimConfig {
        ttft_ms: 10.0,
        itl_ms: 100.0,
        tokens: 200,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    let mut config = config_for(sim.base_url());
    config.shutdown_grace_ms = 300;
    let gw = start(config).await;
    let mut response = post(&gw, &chat_body("a long stream", true), &[]).await;
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    let first = response.chunk().await.expect("first chunk").expect("bytes");
    text.push_str(&String::from_utf8_lossy(&first));

    let stopped = tokio::spawn(gw.shutdown());
    let cut = tokio::time::timeout(PATIENCE, async {
        while let Ok(Some(chunk)) = response.chunk().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        text
    })
    .await
    .expect("the stream was cut after the grace period");
    assert!(!cut.contains("[DONE]"), "{cut}");
    tokio::time::timeout(PATIENCE, stopped)
        .await
        .expect("run returned")
        .expect("join")
        .expect("run");
}

/// An upstream whose chat streams never end, sending events as fast as the gateway takes them
/// (from plain threads, off the test's runtime); counts the connections it holds open (one ends
/// when the gateway drops it).
async fn endless_upstream() -> (String, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let open = Arc::new(AtomicUsize::new(0));
    let counter = open.clone();
    // Long events: the gateway's sockets fill with few of them to parse.
    let event = format!(
        "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\
         \"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}},\
         \"finish_reason\":null}}]}}\n\n",
        "more ".repeat(400)
    );
    let batch = event.repeat(16);
    std::thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(mut socket) = socket else { break };
            counter.fetch_add(1, Ordering::SeqCst);
            let counter = counter.clone();
            let batch = batch.clone();
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut request = vec![0u8; 64 * 1024];
                let _ = socket.read(&mut request);
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                            connection: close\r\n\r\n";
                if socket.write_all(head.as_bytes()).is_ok() {
                    while socket.write_all(batch.as_bytes()).is_ok() {}
                }
                counter.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (format!("http://{addr}/v1"), open)
}

/// Issue 24, point 8: 20 clients that stopped reading a stream were held, with their 20 upstream
/// connections, for as long as they lived (five here: each takes megabytes to fill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_stop_reading_are_closed_and_their_upstream_released() {
    const CLIENTS: usize = 5;
    let (upstream, upstream_open) = endless_upstream().await;
    let mut config = quick(config_for(upstream));
    config.client_send_timeout_ms = 300;
    config.semantic = false;
    // Not reading on to cache the answer (which may take the disconnect budget): the upstream
    // goes when the client does.
    config.complete_on_disconnect = false;
    let gw = start(config).await;

    let mut readers = Vec::new();
    for i in 0..CLIENTS {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        // A small window, so that the gateway's writes soon find the socket full.
        socket.set_recv_buffer_size(4096).expect("rcvbuf");
        let mut stream = socket.connect(gw.addr).await.expect("connect");
        let body = chat_body(&format!("a reader that stops, number {i}"), true).to_string();
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-a\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.expect("write");
        readers.push(stream);
    }

    // Nobody reads: the gateway closes each connection and lets go of each upstream.
    // The kernel takes about 3 MB per socket before a write blocks, which a debug build on a
    // shared machine needs seconds to produce: a bound against hanging, not a measure of speed.
    let deadline = tokio::time::Instant::now() + 6 * PATIENCE;
    loop {
        let metrics = metrics_text(&gw.url("/metrics")).await;
        let closed = metric(
            &metrics,
            "reprise_client_connections_closed_total{reason=\"send_timeout\"}",
        );
        let held = upstream_open.load(Ordering::SeqCst);
        if closed >= CLIENTS as f64 && held == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{closed} connections closed for the send timeout, {held} upstream connections held"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each client finds its stream cut: what was buffered, then the end, never `[DONE]`.
    for mut stream in readers {
        let mut got = Vec::new();
        let _ = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut got))
            .await
            .expect("the connection was closed");
        assert_eq!(count(&got, b"[DONE]"), 0);
    }
    // Nothing was stored from the cut streams.
    let cache = gw.state.cache.clone();
    tokio::task::spawn_blocking(move || cache.drain())
        .await
        .expect("drain");
    assert_eq!(gw.state.cache.store.len(), 0);
}

/// Issue 24, point 8: at the connection cap, sockets that send part of a head and then nothing
/// kept a normal request from ever being accepted.
#[tokio::test]
async fn at_the_connection_limit_partial_heads_make_room_for_a_new_request() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.semantic = false;
    config.max_connections = Some(4);
    // Long timeouts: room must come from reclaiming, not from timing the heads out.
    config.client_header_timeout_ms = 120_000;
    config.keepalive_timeout_ms = 120_000;
    let gw = start(config).await;

    let mut partial = Vec::new();
    for _ in 0..12 {
        let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
        stream
            .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("write");
        partial.push(stream);
    }
    let response = tokio::time::timeout(
        PATIENCE,
        client()
            .post(gw.url("/v1/chat/completions"))
            .json(&chat_body("past the trickles", false))
            .send(),
    )
    .await
    .expect("served despite 12 partial heads against a limit of 4")
    .expect("send");
    assert_eq!(response.status(), 200);
    assert!(!content(response, false).await.is_empty());

    let metrics = metrics_text(&gw.url("/metrics")).await;
    assert!(
        metric(
            &metrics,
            "reprise_client_connections_closed_total{reason=\"reclaimed_slow_head\"}"
        ) >= 1.0,
        "{metrics}"
    );
    drop(partial);
}

/// The binary under a 256-descriptor limit (a cap of 64): 100 sockets sending partial heads made a
/// normal request time out.
#[tokio::test]
async fn partial_heads_under_a_descriptor_limit_do_not_stop_a_normal_request() {
    let log = flood_under_256_descriptors_with(
        &["--client-header-timeout-ms", "60000"],
        100,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: applic",
    )
    .await;
    assert!(log.contains("client connection limit reached"), "{log}");
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// An HTTP/2 frame: 24-bit length, type, flags, stream id.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len())
        .expect("small frame")
        .to_be_bytes();
    let mut frame = vec![len[1], len[2], len[3], kind, flags];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// Issue 24, point 9: an h2c connection that sent only the preface, or a header block it never
/// finished, was held for the keep-alive timeout (75 s), not the header timeout.
#[tokio::test]
async fn h2c_connections_that_never_finish_a_header_block_are_closed() {
    let sim = sim::spawn(SimConfig {
        ttft_ms: 900.0,
        itl_ms: 20.0,
        tokens: 8,
        ..SimConfig::default()
    })
    .await
    .expect("sim");
    let mut config = quick(config_for(sim.base_url()));
    config.keepalive_timeout_ms = 60_000;
    config.semantic = false;
    let gw = start(config).await;

    // The preface and SETTINGS, then nothing.
    let mut preface_only = TcpStream::connect(gw.addr).await.expect("connect");
    let mut bytes = H2_PREFACE.to_vec();
    bytes.extend(h2_frame(0x4, 0, 0, &[]));
    preface_only.write_all(&bytes).await.expect("write");

    // A HEADERS frame without END_HEADERS (HPACK: :method GET, :scheme http, :path /), and the
    // CONTINUATION it promises never comes.
    let mut unfinished = TcpStream::connect(gw.addr).await.expect("connect");
    let mut bytes = H2_PREFACE.to_vec();
    bytes.extend(h2_frame(0x4, 0, 0, &[]));
    bytes.extend(h2_frame(0x1, 0x1, 1, &[0x82, 0x86, 0x84]));
    unfinished.write_all(&bytes).await.expect("write");

    // A HEADERS frame cut short: its length says 100, three bytes came.
    let mut cut = TcpStream::connect(gw.addr).await.expect("connect");
    let mut bytes = H2_PREFACE.to_vec();
    bytes.extend(h2_frame(0x4, 0, 0, &[]));
    let mut headers = h2_frame(0x1, 0x5, 1, &[0x82, 0x86, 0x84]);
    headers[2] = 100;
    bytes.extend(headers);
    cut.write_all(&bytes).await.expect("write");

    for (what, stream) in [
        ("preface only", &mut preface_only),
        ("no CONTINUATION", &mut unfinished),
        ("HEADERS cut short", &mut cut),
    ] {
        let mut sink = Vec::new();
        tokio::time::timeout(PATIENCE, stream.read_to_end(&mut sink))
            .await
            .unwrap_or_else(|_| panic!("{what}: the connection was not closed"))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    let metrics = metrics_text(&gw.url("/metrics")).await;
    assert!(
        metric(
            &metrics,
            "reprise_client_connections_closed_total{reason=\"header_timeout\"}"
        ) >= 3.0,
        "{metrics}"
    );

    // A request whose header block is complete is not cut, however long its answer takes.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    for stream in [false, true] {
        let response = h2
            .post(gw.url("/v1/chat/completions"))
            .json(&chat_body(
                &format!("slow over h2c, stream={stream}"),
                stream,
            ))
            .send()
            .await
            .expect("send");
        assert_eq!(response.version(), reqwest::Version::HTTP_2);
        assert_eq!(response.status(), 200);
        assert!(!content(response, stream).await.is_empty());
    }
}

/// Splits the responses on one connection (each framed by Content-Length or chunked) into
/// status and body.
fn split_responses(mut raw: &[u8]) -> Vec<(u16, Vec<u8>)> {
    let mut out = Vec::new();
    while !raw.is_empty() {
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut response = httparse::Response::new(&mut fields);
        let head = match response.parse(raw).expect("a response head") {
            httparse::Status::Complete(n) => n,
            httparse::Status::Partial => panic!("cut: {}", String::from_utf8_lossy(raw)),
        };
        let status = response.code.expect("status");
        let field = |name: &str| {
            response
                .headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).to_ascii_lowercase())
        };
        let chunked = field("transfer-encoding").is_some_and(|v| v.contains("chunked"));
        let length = field("content-length").map(|v| v.parse::<usize>().expect("length"));
        let mut rest = &raw[head..];
        let mut body = Vec::new();
        if chunked {
            loop {
                let (used, size) = match httparse::parse_chunk_size(rest).expect("chunk size") {
                    httparse::Status::Complete(parsed) => parsed,
                    httparse::Status::Partial => panic!("cut chunk"),
                };
                let size = usize::try_from(size).expect("size");
                rest = &rest[used..];
                if size == 0 {
                    rest = &rest[2..];
                    break;
                }
                body.extend_from_slice(&rest[..size]);
                rest = &rest[size + 2..];
            }
        } else {
            let n = length.unwrap_or(rest.len());
            body.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
        }
        out.push((status, body));
        raw = rest;
    }
    out
}

/// Issue 24, point 10: after a pipelined request or a chunked body, heads were not checked (150
/// header fields were accepted where a first head gets a 431) and bad ones got hyper's empty 400.
#[tokio::test]
async fn every_head_on_a_connection_gets_the_same_limits_and_errors() {
    let sim = sim_default().await;
    let mut config = config_for(sim.base_url());
    config.semantic = false;
    let gw = start(config).await;
    let fields: String = (0..150).map(|i| format!("x-f{i}: v\r\n")).collect();
    let many_fields = format!("GET /healthz HTTP/1.1\r\nHost: x\r\n{fields}\r\n");
    let long_target = format!("GET /v1/{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(20_000));
    let health = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let body = chat_body("a chunked body", false).to_string();
    let (first, second) = body.split_at(body.len() / 2);
    let chunked_chat = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x};ext=1\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\n\
         x-trailer: t\r\n\r\n",
        first.len(),
        second.len()
    );
    let sized_chat = {
        let body = chat_body("a sized body", false).to_string();
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    // Each case: what is sent (in writes a little apart), then the statuses expected, the last
    // one refused with this code.
    let cases: Vec<(&str, Vec<String>, Vec<u16>, &str)> = vec![
        (
            "150 fields after a pipelined request",
            vec![format!("{health}{many_fields}")],
            vec![200, 431],
            "request_header_fields_too_large",
        ),
        (
            "garbage after a pipelined request",
            vec![format!("{health}NOT HTTP\r\n\r\n")],
            vec![200, 400],
            "malformed_request",
        ),
        (
            "a long target after a chunked body",
            vec![format!("{chunked_chat}{long_target}")],
            vec![200, 414],
            "uri_too_long",
        ),
        (
            "150 fields after a sized body, the head split over two writes",
            vec![
                format!("{sized_chat}{health}GET /healthz HTTP/1.1\r\nHost: x\r\n"),
                format!("{fields}\r\n"),
            ],
            vec![200, 200, 431],
            "request_header_fields_too_large",
        ),
        (
            "garbage on a keep-alive connection after a chunked body",
            vec![chunked_chat.clone(), "BAD\r\n\r\n".to_owned()],
            vec![200, 400],
            "malformed_request",
        ),
    ];
    for (what, writes, statuses, code) in cases {
        let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
        for write in &writes {
            stream.write_all(write.as_bytes()).await.expect("write");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let raw = read_to_close(&mut stream).await;
        let responses = split_responses(&raw);
        let got: Vec<u16> = responses.iter().map(|(status, _)| *status).collect();
        assert_eq!(got, statuses, "{what}: {}", String::from_utf8_lossy(&raw));
        let (_, refusal) = responses.last().expect("a refusal");
        let refusal: Value = serde_json::from_slice(refusal)
            .unwrap_or_else(|e| panic!("{what}: {e}: {}", String::from_utf8_lossy(refusal)));
        assert_openai_error(&refusal, code);
    }
    // Requests that are fine, pipelined behind chunked and sized bodies, are all served.
    let mut stream = TcpStream::connect(gw.addr).await.expect("connect");
    let last = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    stream
        .write_all(format!("{chunked_chat}{sized_chat}{health}{last}").as_bytes())
        .await
        .expect("write");
    let raw = read_to_close(&mut stream).await;
    let got: Vec<u16> = split_responses(&raw).iter().map(|(s, _)| *s).collect();
    assert_eq!(
        got,
        vec![200, 200, 200, 200],
        "{}",
        String::from_utf8_lossy(&raw)
    );
}
