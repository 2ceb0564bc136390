//! Process-level tests of the `reprise` binary: configuration errors, serving, exit 0 on SIGTERM.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reprise_client::sim::{self, SimConfig};

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
