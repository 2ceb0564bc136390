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
