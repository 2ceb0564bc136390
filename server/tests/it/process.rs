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
    assert!(stdout.contains("http://127.0.0.1:1/v1"), "{stdout}");
    assert!(stdout.contains("1234"), "{stdout}");
    assert!(!stdout.contains("very-secret-token"), "{stdout}");
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
