//! The benchmark driver end to end against an in-process `reprise-sim` on an ephemeral port: closed
//! and open loop, streaming and not, the report on disk. No gateway here, so every outcome is
//! `none`; the gateway's headers are covered by the unit tests and `scripts/smoke-bench.sh`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reprise_client::bench::workload::{Bank, GenSpec, Generator, Kind, Workload};
use reprise_client::bench::{self, BenchConfig, Event};
use reprise_sim::{self as sim, SimConfig};

async fn start_sim() -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = SimConfig {
        ttft_ms: 5.0,
        itl_ms: 1.0,
        tokens: 4,
        ..SimConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(sim::serve(listener, config, async move {
        let _ = stopped.await;
    }));
    (format!("http://{addr}/v1"), stop)
}

fn config(url: &str) -> BenchConfig {
    BenchConfig {
        targets: vec![url.to_owned()],
        round_robin: Vec::new(),
        api_key: "sk-test".into(),
        model: "sim-model".into(),
        requests: 20,
        concurrency: 2,
        rate: None,
        arrivals: reprise_client::bench::openloop::Arrivals::Uniform,
        seed: 1,
        max_in_flight: 64,
        stream: true,
        warmup: 1,
        run_id: "itest".into(),
        max_duration: Duration::from_secs(60),
        namespace: Some("bench-itest".into()),
    }
}

fn generated() -> Workload {
    let spec = GenSpec {
        distinct: None,
        zipf_s: 1.0,
        repeat_share: Some(0.3),
        paraphrase_share: 0.2,
        seed: 1,
    };
    let bank = Arc::new(Bank::default_bank().expect("bank"));
    Workload::generated(Generator::new(spec, bank).expect("generator"))
}

fn counter() -> (Arc<AtomicUsize>, bench::Progress) {
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    let progress: bench::Progress = Arc::new(move |event: Event<'_>| {
        if let Event::Done(_) = event {
            count.fetch_add(1, Ordering::Relaxed);
        }
    });
    (seen, progress)
}

#[tokio::test]
async fn closed_loop_measures_every_token() {
    let (url, _stop) = start_sim().await;
    let (seen, progress) = counter();
    let report = bench::run(config(&url), generated(), progress).await;
    assert_eq!(seen.load(Ordering::Relaxed), 20);
    let t = &report.targets[0];
    assert_eq!((t.requests, t.errors), (20, 0));
    assert_eq!(t.outcomes.get("none"), Some(&20));
    assert_eq!(t.hit_rate, None);
    assert!(report.samples.iter().all(|s| s.tokens == 4));
    // Four tokens make three gaps per request.
    assert!(report.samples.iter().all(|s| s.gaps_ms.len() == 3));
    assert!(t.ttft_ms.is_some() && t.itl_ms.is_some());
    assert_eq!(report.run.constructed[&Kind::New], 10);
    assert_eq!(report.run.constructed[&Kind::Repeat], 6);
    assert_eq!(report.run.constructed[&Kind::Paraphrase], 4);
    assert!(report.run.mode.starts_with("closed loop, concurrency 2"));
    assert!(report.open_loop.is_none());

    let dir = std::env::temp_dir().join(format!("reprise-bench-itest-{}", std::process::id()));
    bench::report::write(&dir, &report).expect("report");
    assert!(dir.join("report.md").is_file());
    assert!(dir.join("ttft-1.svg").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn open_loop_follows_the_schedule_and_compares() {
    let (url, _stop) = start_sim().await;
    let (second, _stop2) = start_sim().await;
    let mut config = config(&url);
    config.targets.push(second);
    config.rate = Some(50.0);
    config.requests = 10;
    config.stream = false;
    let (seen, progress) = counter();
    let report = bench::run(config, Workload::fresh("itest"), progress).await;
    let open = report.open_loop.clone().expect("open loop stats");
    assert_eq!((open.scheduled, open.sent, open.dropped), (10, 20, 0));
    assert_eq!(seen.load(Ordering::Relaxed), 20);
    assert!(report.samples.iter().all(|s| s.lag_ms.is_some()));
    let comparison = report.comparison.clone().expect("comparison");
    assert!(comparison.ttft_p50_ratio.is_some());
    assert!(comparison.throughput_ratio.is_some());
    // Not streamed: the first byte is the whole answer, and there are no gaps.
    assert!(report.targets[0].itl_ms.is_none());
}

#[tokio::test]
async fn an_open_loop_drops_arrivals_beyond_the_cap() {
    let (url, _stop) = start_sim().await;
    let mut config = config(&url);
    config.rate = Some(1000.0);
    config.requests = 40;
    config.max_in_flight = 1;
    config.warmup = 0;
    let (_, progress) = counter();
    let report = bench::run(config, Workload::fresh("itest"), progress).await;
    let open = report.open_loop.expect("open loop stats");
    // Each request takes at least the 5 ms TTFT, while arrivals come every millisecond.
    assert!(open.dropped > 0, "{open:?}");
    assert_eq!(open.sent + open.dropped, 40);
    assert_eq!(open.peak_in_flight, 1);
    assert_eq!(report.targets[0].requests, open.sent);
}

/// Chat completions a simulator served, from its `/stats`.
async fn served(base: &str) -> u64 {
    let root = base.trim_end_matches("/v1");
    let stats: serde_json::Value = reqwest::get(format!("{root}/stats"))
        .await
        .expect("stats")
        .json()
        .await
        .expect("json");
    stats["chat_completions"].as_u64().expect("count")
}

#[tokio::test]
async fn round_robin_splits_one_target_over_two_servers() {
    let (first, _stop) = start_sim().await;
    let (second, _stop2) = start_sim().await;
    let mut config = config(&first);
    config.round_robin = vec![second.clone()];
    config.warmup = 2;
    let (seen, progress) = counter();
    let report = bench::run(config, Workload::fresh("itest"), progress).await;
    assert_eq!(seen.load(Ordering::Relaxed), 20);
    assert_eq!(report.targets.len(), 1, "one target, not a comparison");
    let t = &report.targets[0];
    assert_eq!((t.requests, t.errors), (20, 0));
    assert!(t.url.contains(&second), "{}", t.url);
    // Each server: one of the two warm-up requests and half of the 20 measured ones.
    assert_eq!((served(&first).await, served(&second).await), (11, 11));
}
