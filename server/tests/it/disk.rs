//! Process tests of the store under failure: a full disk (a small tmpfs, so root), corrupt and
//! unusable data dirs, and start-up errors that name their cause on stderr.
//!
//! Tests that need root fail when `CI` is set and they are not root; elsewhere they say why they
//! skip and return.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use reprise_sim::{self as sim, SimConfig, SimHandle};
use serde_json::{json, Value};

const ADMIN: &str = "disk-admin-token";

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// True when the test may go on as root; false (after saying why) when it should skip.
fn need_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test} needs root (it mounts a tmpfs) and CI is set: run the suite as root"
    );
    eprintln!("SKIPPED {test}: needs root to mount a tmpfs (not in CI, so not a failure)");
    false
}

/// A tmpfs of `size` mounted on a fresh temporary directory, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (after saying why) when the mount is refused outside CI, e.g. root in a container
    /// without the capability; under `CI` a refused mount fails the test.
    fn mount(size: &str, read_only: bool) -> Option<Self> {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = format!("size={size}{}", if read_only { ",ro" } else { "" });
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &options, "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        if status.success() {
            return Some(Self { dir });
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "mount tmpfs failed under CI"
        );
        eprintln!("SKIPPED: cannot mount a tmpfs here (not in CI, so not a failure)");
        None
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the filesystem of `dir` with a file; returns its path (remove it to free the space).
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).expect("filler");
    let block = vec![0xa5u8; 64 * 1024];
    while file.write_all(&block).is_ok() {}
    // A last small write takes the remaining bytes below one block.
    while file.write_all(&block[..512]).is_ok() {}
    path
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// A `reprise` process with its output in a file.
struct Proc {
    child: Child,
    port: u16,
    log: PathBuf,
    _logdir: tempfile::TempDir,
}

impl Proc {
    fn start(upstream: &str, data_dir: &Path, extra: &[&str]) -> Self {
        let port = free_port();
        let logdir = tempfile::tempdir().expect("tempdir");
        let log = logdir.path().join("output.log");
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_reprise"))
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--upstream-url", upstream])
            .args(["--semantic", "false", "--shutdown-grace-ms", "1000"])
            .args(["--admin-token", ADMIN])
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .env("RUST_LOG", "warn,reprise=info,reprise_server=info")
            // The log goes to stdout, errors at exit to stderr: both to one file.
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("spawn");
        Self {
            child,
            port,
            log,
            _logdir: logdir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = reqwest::get(self.url("/healthz")).await {
                if r.status().is_success() {
                    return;
                }
            }
            if let Some(status) = self.child.try_wait().expect("poll") {
                panic!("gateway exited with {status}: {}", self.log());
            }
            assert!(Instant::now() < deadline, "gateway did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn health(&self) -> Value {
        reqwest::get(self.url("/healthz"))
            .await
            .expect("healthz")
            .json()
            .await
            .expect("json")
    }

    async fn stats(&self) -> Value {
        reqwest::Client::new()
            .get(self.url("/admin/stats"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("stats")
            .json()
            .await
            .expect("json")
    }

    /// Asks `prompt`; returns the status and the `x-reprise-cache` outcome.
    async fn ask(&self, prompt: &str) -> (u16, String) {
        let response = reqwest::Client::new()
            .post(self.url("/v1/chat/completions"))
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": prompt}]}))
            .send()
            .await
            .expect("send");
        let status = response.status().as_u16();
        let outcome = response
            .headers()
            .get("x-reprise-cache")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let _ = response.bytes().await;
        (status, outcome)
    }

    /// Asks `prompt` until it is a hit (the writer stores off the request path).
    async fn until_hit(&self, prompt: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let (status, outcome) = self.ask(prompt).await;
            assert_eq!(status, 200);
            if outcome == "hit" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{prompt:?} never became a hit: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn until_store(&self, status: &str, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let health = self.health().await;
            if health["store"]["status"] == status {
                return health;
            }
            assert!(
                Instant::now() < deadline,
                "store never became {status}: {health}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Asks distinct prompts (every request answered) until the store says it is degraded: sled
    /// fails a write once its log needs room the disk no longer has, which takes more answers the
    /// better they compress (stored replays are LZ4-compressed). Returns the prompts asked and the
    /// health that said so.
    async fn ask_until_degraded(&self, prefix: &str, within: Duration) -> (usize, Value) {
        let deadline = Instant::now() + within;
        let mut asked = 0;
        loop {
            for _ in 0..5 {
                let (status, _) = self.ask(&format!("{prefix} {asked}")).await;
                assert_eq!(status, 200, "a full disk must not fail requests");
                asked += 1;
            }
            let health = self.health().await;
            if health["store"]["status"] == "degraded" {
                return (asked, health);
            }
            assert!(
                Instant::now() < deadline,
                "store never became degraded after {asked} answers: {health}"
            );
        }
    }

    /// Sends SIGTERM and waits at most `within` for the exit.
    async fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill")
            .success());
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("no exit within {within:?} of SIGTERM: {}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn sim_long_answers() -> SimHandle {
    sim::spawn(SimConfig {
        ttft_ms: 1.0,
        itl_ms: 0.0,
        tokens: 400,
        ..SimConfig::default()
    })
    .await
    .expect("sim")
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// The full disk, on a 6 MB tmpfs: requests are still answered; `/healthz` and
/// `/admin/stats` say the store is degraded; one log line, not one per request; caching comes back
/// when space does, without a restart; SIGTERM exits within its grace period; a replacement starts
/// on the full disk and serves what was stored before.
#[tokio::test]
async fn full_disk_degrades_to_pass_through_and_recovers() {
    if !need_root("full_disk_degrades_to_pass_through_and_recovers") {
        return;
    }
    let sim = sim_long_answers().await;
    let Some(fs) = Tmpfs::mount("6m", false) else {
        return;
    };
    let data = fs.path().join("data");
    let mut gw = Proc::start(&sim.base_url(), &data, &[]);
    gw.ready().await;
    gw.until_hit("stored before the disk filled", Duration::from_secs(10))
        .await;
    // sled writes its log to disk every 500 ms: let that answer reach the disk before it fills.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let filler = fill(fs.path());
    let (asked, health) = gw
        .ask_until_degraded("asked on a full disk", Duration::from_secs(30))
        .await;
    assert_eq!(health["status"], "degraded");
    let reason = health["store"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("no space"), "{health}");
    let stats = gw.stats().await;
    assert_eq!(stats["store"]["status"], "degraded", "{stats}");
    assert!(stats["store"]["degraded"]["reason"].is_string(), "{stats}");
    for n in 0..asked {
        assert_eq!(gw.ask(&format!("asked on a full disk {n}")).await.0, 200);
    }
    let log = gw.log();
    assert_eq!(count(&log, "CACHE STORE DEGRADED"), 1, "{log}");
    assert_eq!(count(&log, "storing a cache entry failed"), 0, "{log}");
    assert_eq!(count(&log, "cache lookup failed"), 0, "{log}");

    // Space returns: caching resumes on its own.
    std::fs::remove_file(&filler).expect("free space");
    gw.until_store("ok", Duration::from_secs(30)).await;
    gw.until_hit("asked after space returned", Duration::from_secs(10))
        .await;
    assert_eq!(count(&gw.log(), "cache store recovered"), 1);

    // Full again, then SIGTERM: the exit does not wait on the store past the grace period.
    let filler = fill(fs.path());
    gw.ask_until_degraded("asked before SIGTERM", Duration::from_secs(30))
        .await;
    let status = gw.terminate(Duration::from_secs(15)).await;
    assert!(status.success(), "exit {status:?}: {}", gw.log());

    // A replacement starts on the still-full disk (the lock was released), serving without
    // caching; when space returns it serves what was stored before the disk filled.
    let mut next = Proc::start(&sim.base_url(), &data, &[]);
    next.ready().await;
    assert_eq!(next.ask("asked of the replacement").await.0, 200);
    std::fs::remove_file(&filler).expect("free space");
    next.until_store("ok", Duration::from_secs(30)).await;
    next.until_hit("stored before the disk filled", Duration::from_secs(5))
        .await;
    let leftovers: Vec<String> = std::fs::read_dir(&data)
        .expect("list")
        .flatten()
        .map(|i| i.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".generating"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "unfinished snapshots left: {leftovers:?}"
    );
    next.terminate(Duration::from_secs(15)).await;
}

/// Runs `reprise serve` on `data_dir` expecting it to fail; returns its stderr.
fn start_failure(data_dir: &Path, extra: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_reprise"))
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args([
            "--upstream-url",
            "http://127.0.0.1:9/v1",
            "--semantic",
            "false",
        ])
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("internal error"), "{stderr}");
    stderr
}

#[tokio::test]
async fn start_up_errors_name_their_cause() {
    let dir = tempfile::tempdir().expect("tempdir");

    // Not a directory, and a directory under a file: the file is left alone.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"user data").expect("write");
    let stderr = start_failure(&file, &[]);
    assert!(stderr.contains("is not a directory"), "{stderr}");
    let stderr = start_failure(&file.join("data"), &[]);
    assert!(stderr.contains("not a directory"), "{stderr}");
    assert_eq!(std::fs::read(&file).expect("kept"), b"user data");

    // Locked by a running gateway.
    let sim = sim::spawn(SimConfig::default()).await.expect("sim");
    let held = dir.path().join("held");
    let mut first = Proc::start(&sim.base_url(), &held, &[]);
    first.ready().await;
    let stderr = start_failure(&held, &[]);
    assert!(stderr.contains("locked by another process"), "{stderr}");
    first.terminate(Duration::from_secs(15)).await;

    // Corrupt, with --strict-store: refused, naming the flag; the files stay where they are.
    let corrupt = dir.path().join("corrupt");
    {
        let mut gw = Proc::start(&sim.base_url(), &corrupt, &[]);
        gw.ready().await;
        gw.until_hit("a stored answer", Duration::from_secs(10))
            .await;
        gw.terminate(Duration::from_secs(15)).await;
    }
    std::fs::write(corrupt.join("conf"), b"segment_size: banana\n").expect("damage");
    let stderr = start_failure(&corrupt, &["--strict-store"]);
    assert!(stderr.contains("corrupt"), "{stderr}");
    assert!(stderr.contains("--strict-store"), "{stderr}");
    assert!(corrupt.join("db").exists(), "strict mode moved files");

    // Without it: moved aside, named in the log, and what sled can still read salvaged: here the
    // whole log (sled writes a default conf in place of the damaged one), so the answer is kept.
    let mut gw = Proc::start(&sim.base_url(), &corrupt, &[]);
    gw.ready().await;
    let log = gw.log();
    let aside: Vec<PathBuf> = std::fs::read_dir(&corrupt)
        .expect("list")
        .flatten()
        .map(|i| i.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("corrupt-"))
        })
        .collect();
    assert_eq!(aside.len(), 1, "{log}");
    assert!(
        aside[0].join("db").exists(),
        "old files kept for inspection"
    );
    assert!(log.contains(&*aside[0].to_string_lossy()), "{log}");
    assert!(log.contains("salvaged the corrupt store"), "{log}");
    assert_eq!(gw.ask("a stored answer").await, (200, "hit".to_owned()));
    gw.terminate(Duration::from_secs(15)).await;

    // Unwritable: a read-only filesystem (root ignores file modes), or a read-only directory.
    if is_root() {
        if let Some(ro) = Tmpfs::mount("1m", true) {
            let stderr = start_failure(&ro.path().join("data"), &[]);
            assert!(stderr.contains("not writable"), "{stderr}");
        }
    } else {
        use std::os::unix::fs::PermissionsExt;
        let ro = dir.path().join("read-only");
        std::fs::create_dir(&ro).expect("mkdir");
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o500)).expect("chmod");
        let stderr = start_failure(&ro.join("data"), &[]);
        assert!(stderr.contains("not writable"), "{stderr}");
    }
}
