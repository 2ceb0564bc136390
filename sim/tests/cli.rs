//! The `reprise-sim` binary as scripts and the SDK tests run it: its name, its flags and the answers
//! they shape. (Also makes `cargo test --workspace` build `target/debug/reprise-sim`, which
//! `scripts/test.sh` hands to the SDK and dashboard tests.)

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The running binary, killed when the test ends however it ends.
struct Sim {
    child: Child,
    url: String,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// Starts `reprise-sim` with `args` after `--listen` and waits until `/healthz` answers.
async fn start(args: &[&str]) -> Sim {
    let listen = format!("127.0.0.1:{}", free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_reprise-sim"))
        .arg("--listen")
        .arg(&listen)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start reprise-sim");
    let sim = Sim {
        child,
        url: format!("http://{listen}"),
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = reqwest::get(format!("{}/healthz", sim.url)).await {
            if r.status().is_success() {
                return sim;
            }
        }
        assert!(Instant::now() < deadline, "reprise-sim never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn chat(sim: &Sim) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", sim.url))
        .json(&json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("send")
}

#[tokio::test]
async fn flags_shape_the_answer() {
    let sim = start(&["--ttft-ms", "0", "--itl-ms", "0", "--tokens", "3"]).await;
    let response = chat(&sim).await;
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["usage"]["completion_tokens"], 3, "{body}");
    assert_eq!(body["object"], "chat.completion");
}

#[tokio::test]
async fn fault_flag_applies_to_every_request() {
    let sim = start(&["--ttft-ms", "0", "--fault", "status=503"]).await;
    for _ in 0..2 {
        let response = chat(&sim).await;
        assert_eq!(response.status(), 503);
        let body: Value = response.json().await.expect("json");
        assert!(body["error"]["message"].is_string(), "{body}");
    }
}

#[test]
fn a_transport_fault_is_refused_on_the_command_line() {
    let out = Command::new(env!("CARGO_BIN_EXE_reprise-sim"))
        .args(["--listen", "127.0.0.1:0", "--fault", "close-early"])
        .output()
        .expect("run reprise-sim");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("transport fault"), "{stderr}");
}

/// A file of labels in the process's temp dir, removed when the test ends.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> Self {
        let path = std::env::temp_dir().join(format!("reprise-sim-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("write temp file");
        Self(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn judge(sim: &Sim, cached: &str, new: &str) -> String {
    let block =
        json!({"reprise_judge": 1, "system": null, "context": null, "cached": cached, "new": new});
    let response = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", sim.url))
        .json(&json!({"model": "sim-judge", "messages": [
            {"role": "user", "content": format!("```json\n{block}\n```")}
        ]}))
        .send()
        .await
        .expect("send");
    let body: Value = response.json().await.expect("json");
    body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned()
}

#[tokio::test]
async fn judge_flags_answer_from_the_labels() {
    let labels = TempFile::new(
        "labels.jsonl",
        concat!(
            r#"{"a": "one", "b": "uno", "same_answer": true}"#,
            "\n",
            r#"{"a": "one", "b": "two", "same_answer": false}"#,
            "\n",
        ),
    );
    let path = labels.0.to_str().expect("utf-8 path");
    let right = start(&["--judge-labels", path]).await;
    assert_eq!(judge(&right, "uno", "one").await, r#"{"verdict":"same"}"#);
    assert_eq!(
        judge(&right, "one", "two").await,
        r#"{"verdict":"different"}"#
    );
    // Accuracy 0: every known pair is flipped, an unknown one stays different.
    let wrong = start(&[
        "--judge-labels",
        path,
        "--judge-accuracy",
        "0",
        "--judge-seed",
        "9",
    ])
    .await;
    assert_eq!(
        judge(&wrong, "uno", "one").await,
        r#"{"verdict":"different"}"#
    );
    assert_eq!(judge(&wrong, "one", "two").await, r#"{"verdict":"same"}"#);
    assert_eq!(
        judge(&wrong, "one", "three").await,
        r#"{"verdict":"different"}"#
    );
    let stats: Value = reqwest::get(format!("{}/stats", wrong.url))
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    assert_eq!(stats["judge"]["calls"], 3, "{stats}");
    assert_eq!(stats["judge"]["same"], 1, "{stats}");
}

#[test]
fn bad_judge_flags_are_refused() {
    let labels = TempFile::new("bad.jsonl", "{\"a\": \"x\", \"b\": \"y\"}\n");
    let cases: [(&[&str], &str); 3] = [
        (
            &["--judge-labels", labels.0.to_str().expect("utf-8 path")],
            ":1: `same_answer`",
        ),
        (&["--judge-accuracy", "1.5"], "--judge-accuracy must"),
        (&["--judge-latency-ms=-1"], "--judge-latency-ms must"),
    ];
    for (args, want) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_reprise-sim"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .expect("run reprise-sim");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(want), "{args:?}: {stderr}");
    }
}
