//! Process-level tests of the `reprise` binary: configuration errors, serving, exit 0 on SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reprise_server::store::SledStore;
use reprise_sim::{self as sim, SimConfig};

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

#[test]
fn invalid_configuration_fails_fast_naming_the_field() {
    let output = Command::new(env!("CARGO_BIN_EXE_reprise"))
        .args(["serve", "--upstream-url", "not a url"])
        .env_remove("REPRISE_UPSTREAM_URL")
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("upstream_url"), "{stderr}");
}

/// Runs `reprise` with `args` (and one environment variable) expecting it to refuse its
/// configuration; returns its stderr.
fn refused_configuration(args: &[&str], env: Option<(&str, &str)>) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_reprise"));
    command.args(args);
    if let Some((name, value)) = env {
        command.env(name, value);
    }
    let output = command.output().expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    stderr
}

/// A live setting that is not a value of its type stops the start, and the message says where it
/// was set: the file and its line, the flag, or the environment variable.
#[test]
fn a_bad_live_setting_stops_the_start_naming_where_it_was_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("reprise.toml");
    std::fs::write(&file, "listen = \"127.0.0.1:1\"\nreplay = \"fast\"\n").expect("write");
    let file = file.to_string_lossy().into_owned();
    let stderr = refused_configuration(&["serve", "--config", &file], None);
    for says in ["reprise.toml", "line 2", "`fast` is not instant, recorded"] {
        assert!(stderr.contains(says), "{says} not in {stderr}");
    }
    let stderr = refused_configuration(&["serve", "--cache-mode", "sometimes"], None);
    for says in ["--cache-mode", "`sometimes` is not one of on, off"] {
        assert!(stderr.contains(says), "{says} not in {stderr}");
    }
    let guards = ("REPRISE_SEMANTIC_GUARDS", "numbers,vibes");
    let stderr = refused_configuration(&["check-config"], Some(guards));
    for says in [
        "environment variable REPRISE_SEMANTIC_GUARDS",
        "`numbers,vibes` is not a comma-separated list",
    ] {
        assert!(stderr.contains(says), "{says} not in {stderr}");
    }
    let replay = ("REPRISE_REPLAY", "tokens-per-second=0");
    let stderr = refused_configuration(&["serve"], Some(replay));
    for says in ["environment variable REPRISE_REPLAY", "from 0.1 to"] {
        assert!(stderr.contains(says), "{says} not in {stderr}");
    }
    // The flag wins over its variable, and a bad flag is reported as the flag.
    let stderr = refused_configuration(&["serve", "--replay=fast"], Some(replay));
    assert!(
        stderr.contains("--replay") && !stderr.contains("REPRISE_REPLAY"),
        "{stderr}"
    );
}

#[test]
fn environment_variables_configure_and_secrets_stay_masked() {
    let output = Command::new(env!("CARGO_BIN_EXE_reprise"))
        .args(["check-config"])
        .env("REPRISE_UPSTREAM_URL", "http://127.0.0.1:1/v1")
        .env("REPRISE_ADMIN_TOKEN", "very-secret-token")
        .env("REPRISE_IDLE_TIMEOUT_MS", "1234")
        .output()
        .expect("run");
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    // As the file spells it, so that `--config` reads it back.
    assert!(
        stdout.contains("\nupstream_url = \"http://127.0.0.1:1/v1\"\n"),
        "{stdout}"
    );
    assert!(stdout.contains("\nidle_timeout_ms = 1234\n"), "{stdout}");
    assert!(!stdout.contains("very-secret-token"), "{stdout}");
    assert!(
        stdout.contains("# admin_token = \"*****\" (set; not printed)"),
        "{stdout}"
    );
}

/// Starts the `reprise` binary and waits until it answers `/healthz`.
async fn spawn_gateway(upstream: &str, data_dir: &std::path::Path) -> (std::process::Child, u16) {
    spawn_gateway_with(upstream, data_dir, &[]).await
}

/// A `reprise serve` process on a free port with `extra` flags, once its `/healthz` answers.
pub(crate) async fn spawn_gateway_with(
    upstream: &str,
    data_dir: &std::path::Path,
    extra: &[&str],
) -> (std::process::Child, u16) {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_reprise"))
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream-url", upstream])
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let health = format!("http://127.0.0.1:{port}/healthz");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !reqwest::get(&health)
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        assert!(Instant::now() < deadline, "gateway did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (child, port)
}

fn chat(prompt: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": prompt}]})
}

#[tokio::test]
async fn sigkill_while_writing_leaves_only_complete_entries() {
    let sim = crate::common::quick_sim().await;
    let data_dir = tempfile::tempdir().expect("tempdir");
    let (mut child, port) = spawn_gateway(&sim.base_url(), data_dir.path()).await;
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    // Eight writers send distinct prompts until the process dies under them. Each notes the
    // answers it received whole, and when.
    let mut writers = Vec::new();
    for w in 0..8 {
        let url = url.clone();
        writers.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut completed: Vec<(String, Instant)> = Vec::new();
            for i in 0..10_000 {
                let prompt = format!("kill test {w} {i}");
                let body = chat(&prompt, i % 2 == 0);
                let Ok(r) = client.post(&url).json(&body).send().await else {
                    break;
                };
                let ok = r.status().is_success();
                let whole = r.bytes().await.is_ok_and(|b| {
                    // A stream is whole once its terminator arrived.
                    i % 2 != 0 || String::from_utf8_lossy(&b).contains("[DONE]")
                });
                if !(ok && whole) {
                    break;
                }
                completed.push((prompt, Instant::now()));
            }
            completed
        }));
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let killed = Command::new("kill")
        .args(["-KILL", &child.id().to_string()])
        .status()
        .expect("kill");
    let killed_at = Instant::now();
    assert!(killed.success());
    let _ = child.wait();
    let mut completed = Vec::new();
    for w in writers {
        completed.extend(w.await.expect("writer"));
    }
    assert!(
        completed.len() > 16,
        "the gateway was under load when killed ({} answers)",
        completed.len()
    );

    // Every entry that can be read is whole: a finished answer, reachable through its key.
    let store = SledStore::open(data_dir.path()).expect("reopen after SIGKILL");
    let entries = crate::common::whole_entries(&store, false);
    let survivor = entries.last().map(|e| e.summary.prompt.clone());

    // What kill -9 lost: answers the client received whole that the store does not hold. The
    // README explains the window (the writer's queue and sled's 500 ms log flush).
    let stored: std::collections::HashSet<&str> =
        entries.iter().map(|e| e.summary.prompt.as_str()).collect();
    let lost: Vec<Duration> = completed
        .iter()
        .filter(|(prompt, _)| !stored.contains(prompt.as_str()))
        .map(|(_, at)| killed_at.saturating_duration_since(*at))
        .collect();
    let oldest_lost = lost.iter().max().copied().unwrap_or_default();
    println!(
        "kill -9 loss: {} of {} answers completed before the kill were not stored ({:.2}%); \
         the oldest completed {} ms before the kill",
        lost.len(),
        completed.len(),
        100.0 * lost.len() as f64 / completed.len() as f64,
        oldest_lost.as_millis()
    );
    assert!(lost.len() < completed.len(), "nothing survived the kill");
    drop(store);

    // And the gateway starts on that data dir and serves what survived.
    let (mut child, port) = spawn_gateway(&sim.base_url(), data_dir.path()).await;
    if let Some(prompt) = survivor {
        let response = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .json(&chat(&prompt, false))
            .send()
            .await
            .expect("send");
        assert_eq!(response.headers()["x-reprise-cache"], "hit");
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

#[tokio::test]
async fn serves_then_exits_zero_on_sigterm() {
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let port = free_port();
    let data_dir = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(env!("CARGO_BIN_EXE_reprise"))
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--upstream-url", &sim.base_url()])
        .arg("--data-dir")
        .arg(data_dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let client = reqwest::Client::new();
    let health = format!("http://127.0.0.1:{port}/healthz");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = client.get(&health).send().await {
            if r.status().is_success() {
                break;
            }
        }
        assert!(Instant::now() < deadline, "gateway did not come up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = client
        .post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .json(&serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(answer.status(), 200);

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "gateway did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "exit status {status:?}");
}

/// The gateway's resident set in bytes (`VmRSS` of /proc/PID/status).
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS")
        * 1024
}

/// A figure of the gateway's `/metrics`: the sum of the series whose line starts with `series`.
async fn metric(port: u16, series: &str) -> u64 {
    let text = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/metrics"))
        .bearer_auth("memory-admin")
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Long streams whose clients leave early (the gateway reads on to cache them: the default
/// `complete_on_disconnect`) cost memory while they run, and give it back when they end: the
/// recording keeps the relayed bytes, not a parsed JSON tree per event, stops at
/// `--max-entry-bytes`, and the allocator returns freed memory. Before, streams like these took the
/// gateway's resident set up by a gigabyte and kept it there (benches/stream-memory.sh). Memory,
/// not speed: the bound is wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_comes_back_after_long_streams_whose_clients_left() {
    let sim = crate::common::quick_sim().await;
    let data_dir = tempfile::tempdir().expect("tempdir");
    let (mut child, port) = spawn_gateway_with(
        &sim.base_url(),
        data_dir.path(),
        // However slow a shared machine is, the streams are read to their end (and stored or
        // refused for their size), never cut by the default minute after their clients left.
        &[
            "--semantic",
            "false",
            "--admin-token",
            "memory-admin",
            "--disconnect-budget-ms",
            "600000",
        ],
    )
    .await;
    let pid = child.id();
    let url = format!("http://127.0.0.1:{port}/v1/chat/completions");
    let client = reqwest::Client::new();
    // One whole stream first, so the baseline has the pools, the store and the runtime warmed.
    let warm = client
        .post(&url)
        .json(&chat("warm up", true))
        .send()
        .await
        .expect("send");
    warm.text().await.expect("body");
    let finished = |n: u64| async move {
        let deadline = Instant::now() + Duration::from_secs(180);
        while metric(port, "reprise_requests_total").await < n {
            assert!(Instant::now() < deadline, "the streams did not finish");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    finished(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = rss_bytes(pid);
    // Three answers of about 5 MB (stored: under the 8 MiB default) and two of about 10 MB (not).
    let mut clients = Vec::new();
    for (i, tokens) in [20_000, 20_000, 20_000, 40_000, 40_000]
        .into_iter()
        .enumerate()
    {
        let client = client.clone();
        let url = url.clone();
        clients.push(tokio::spawn(async move {
            let mut response = client
                .post(&url)
                .header("x-sim-tokens", tokens.to_string())
                .json(&chat(&format!("a long answer {i}"), true))
                .send()
                .await
                .expect("send");
            // The first bytes, then leave a moment later.
            response.chunk().await.expect("first chunk");
            let leave = Instant::now() + Duration::from_millis(300);
            while Instant::now() < leave {
                if response.chunk().await.expect("chunk").is_none() {
                    break;
                }
            }
        }));
    }
    for c in clients {
        c.await.expect("client");
    }
    finished(6).await;
    // What was stored (the writer thread writes it after the stream), and what was over the cap.
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric(port, "reprise_cache_entries").await < 4 {
        assert!(Instant::now() < deadline, "the answers were not stored");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(metric(port, "reprise_cache_entries").await, 4);
    assert_eq!(
        metric(port, "reprise_store_skipped_total{reason=\"too_large\"}").await,
        2
    );
    let bound = baseline + 150 * 1024 * 1024;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rss = rss_bytes(pid);
    while rss > bound && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
        rss = rss_bytes(pid);
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        rss <= bound,
        "resident set {} MB after the streams, baseline {} MB",
        rss >> 20,
        baseline >> 20
    );
}
