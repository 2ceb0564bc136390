//! The benchmark driver end to end against an in-process `reprise-sim` on an ephemeral port: closed
//! and open loop, streaming and not, the report on disk. No gateway here, so every outcome is
//! `none`; the gateway's headers are covered by the unit tests and `scripts/smoke-bench.sh`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use reprise_client::bench::workload::{Bank, GenSpec, Generator, Kind, Workload};
use reprise_client::bench::{self, Api, BenchConfig, Event};
use reprise_sim::{self as sim, SimConfig};

async fn start_sim() -> (String, tokio::sync::oneshot::Sender<()>) {
    start_sim_with(None).await
}

/// A sim whose every request meets `fault` (e.g. an error status), or none.
async fn start_sim_with(fault: Option<sim::Fault>) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let config = SimConfig {
        ttft_ms: 5.0,
        itl_ms: 1.0,
        tokens: 4,
        fault,
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
        api: Api::Openai,
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

// ---------------------------------------------------------------------------------------------
// The paraphrase workload against a fake gateway with an async verify stage.
// ---------------------------------------------------------------------------------------------

mod paraphrase {
    use std::collections::{HashMap, HashSet};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use axum::extract::State;
    use axum::http::HeaderMap;
    use axum::response::{IntoResponse, Response};
    use axum::routing::{get, post};
    use axum::{Json, Router};
    use reprise_client::bench::paraphrase::{self, Spec};
    use reprise_client::eval::pairs::{parse, Ambiguous};
    use serde_json::{json, Value};

    /// An entry is served only this long after it was stored, like the gateway's writer.
    const VISIBLE_AFTER: Duration = Duration::from_millis(30);
    /// The background judge's time per pair: later rounds start only once it has answered.
    const JUDGE_MS: u64 = 40;

    const PAIRS: &str = concat!(
        "{\"a\": \"How do I boil an egg?\", \"b\": \"What is the way to boil an egg?\", \"same_answer\": true}\n",
        "{\"a\": \"How do I boil an egg?\", \"b\": \"How do I poach an egg?\", \"same_answer\": false}\n",
        "{\"a\": \"Capital of France?\", \"b\": \"What is France's capital?\", \"same_answer\": true}\n",
        "{\"a\": \"USD to EUR rate\", \"b\": \"EUR to USD rate\", \"same_answer\": false}\n",
    );

    #[derive(Default)]
    struct Fake {
        /// Stored prompt -> (entry id, stored at).
        entries: HashMap<String, (String, Instant)>,
        /// `b` -> (its `a`, whether the judge says same), from the labels.
        labels: HashMap<String, (String, bool)>,
        approved: HashSet<String>,
        judged: HashSet<String>,
        queued: u64,
        queue_depth: u64,
        same: u64,
        different: u64,
        stored_b: usize,
    }

    type Shared = Arc<Mutex<Fake>>;

    fn lock(fake: &Shared) -> std::sync::MutexGuard<'_, Fake> {
        fake.lock().expect("lock")
    }

    async fn chat(
        State(fake): State<Shared>,
        headers: HeaderMap,
        Json(body): Json<Value>,
    ) -> Response {
        let text = body["messages"][0]["content"]
            .as_str()
            .expect("a prompt")
            .to_owned();
        let control = headers
            .get("cache-control")
            .map(|v| v.to_str().expect("ascii").to_owned())
            .unwrap_or_default();
        let mut f = lock(&fake);
        let mut head: Vec<(&str, String)> = Vec::new();
        if control == "no-cache" {
            let n = f.entries.len();
            f.entries
                .entry(text.clone())
                .or_insert_with(|| (format!("e_{n}"), Instant::now()));
            head.push(("x-reprise-cache", "miss".into()));
        } else if let Some((id, _)) = f
            .entries
            .get(&text)
            .filter(|(_, at)| at.elapsed() >= VISIBLE_AFTER)
        {
            head.push(("x-reprise-cache", "hit".into()));
            head.push(("x-reprise-entry", id.clone()));
        } else if f.approved.contains(&text) {
            let a = f.labels[&text].0.clone();
            head.push(("x-reprise-cache", "semantic-hit".into()));
            head.push(("x-reprise-verified", "judge".into()));
            head.push(("x-reprise-entry", f.entries[&a].0.clone()));
        } else {
            head.push(("x-reprise-cache", "miss".into()));
            if control != "no-store" && f.labels.contains_key(&text) {
                f.stored_b += 1;
            }
            if let Some((_, same)) = f.labels.get(&text).cloned() {
                if f.judged.insert(text.clone()) {
                    f.queued += 1;
                    f.queue_depth += 1;
                    head.push(("x-reprise-verify", "queued".into()));
                    let fake = fake.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(JUDGE_MS)).await;
                        let mut f = lock(&fake);
                        f.queue_depth -= 1;
                        if same {
                            f.same += 1;
                            f.approved.insert(text);
                        } else {
                            f.different += 1;
                        }
                    });
                }
            }
        }
        drop(f);
        let mut response =
            Json(json!({"choices": [{"message": {"role": "assistant", "content": "ok"}}]}))
                .into_response();
        for (name, value) in head {
            response
                .headers_mut()
                .insert(name, value.parse().expect("header value"));
        }
        response
    }

    async fn stats(State(fake): State<Shared>) -> Json<Value> {
        let mut stats: Value =
            serde_json::from_str(include_str!("fixtures/stats.json")).expect("fixture");
        let f = lock(&fake);
        stats["judge"] = json!({
            "calls": f.same + f.different, "same": f.same, "different": f.different, "unsure": 0,
            "timeouts": 0, "failures": 0, "over_budget": 0, "too_long": 0,
            "queued": f.queued, "dropped": 0, "queue_depth": f.queue_depth,
            "prompt_tokens": 0, "completion_tokens": 0, "p50_ms": null, "p99_ms": null,
            "namespaces": []
        });
        Json(stats)
    }

    async fn start(fake: Shared) -> String {
        let app = Router::new()
            .route("/v1/chat/completions", post(chat))
            .route("/admin/stats", get(stats))
            .with_state(fake);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/v1")
    }

    /// Issue 19: a paraphrase judged `same` in the background is served in the next round, a
    /// trap never is, and a pair is judged once; every `b` is asked without being stored.
    #[tokio::test]
    async fn async_verdicts_promote_paraphrases_in_the_next_round() {
        let pairs = parse("fake.jsonl", PAIRS, Ambiguous::Different).expect("pairs");
        let fake: Shared = Arc::default();
        for p in &pairs {
            let text = |p: &reprise_client::eval::pairs::Prompt| match p {
                reprise_client::eval::pairs::Prompt::Text(t) => t.clone(),
                other => panic!("{other:?}"),
            };
            lock(&fake)
                .labels
                .insert(text(&p.b), (text(&p.a), p.same_answer));
        }
        let url = start(fake.clone()).await;
        let mut config = super::config(&url);
        config.stream = false;
        config.warmup = 0;
        let spec = Spec {
            pairs,
            rounds: 3,
            segments: 2,
            admin_token: None,
            drain_timeout: Duration::from_secs(10),
        };
        let (seen, progress) = super::counter();
        let report = paraphrase::run(config, spec, progress)
            .await
            .expect("the workload runs");
        assert_eq!(seen.load(std::sync::atomic::Ordering::Relaxed), 12);
        assert_eq!((report.seeds, report.should_hit, report.traps), (3, 2, 2));
        let round = |r: usize| {
            report
                .by_round
                .iter()
                .find(|row| row.round == Some(r))
                .expect("a row per round")
        };
        // Round 1: every `b` misses and is queued for its verdict.
        assert_eq!(round(1).should_hit_served, 0);
        assert_eq!(round(1).judge_calls_per_lookup, Some(1.0));
        assert_eq!(round(1).judge.as_ref().map(|j| j.queued), Some(4));
        for r in [2, 3] {
            assert_eq!(round(r).should_hit_served, 2, "round {r}");
            assert_eq!(round(r).verified_judge, 2, "round {r}");
            assert_eq!(round(r).traps_served, 0, "round {r}");
            assert_eq!(round(r).judge_calls_per_lookup, Some(0.0), "round {r}");
        }
        assert_eq!(report.by_segment.len(), 3 * 2);
        let promoted = &report.promotions[0];
        assert_eq!((promoted.round, promoted.target), (2, 0));
        assert_eq!(
            (promoted.should_hit_missed, promoted.should_hit_promoted),
            (2, 2)
        );
        assert_eq!((promoted.traps_missed, promoted.traps_promoted), (2, 0));
        assert_eq!(lock(&fake).stored_b, 0, "every b is asked with no-store");
        assert!(paraphrase::render(&report).contains("| 2 | all | [1] | 4 | 100.0% (2/2)"));
    }
}

/// `--api anthropic` against the sim's Messages API: streamed, TTFT is the first
/// `content_block_delta` and every delta a token; not streamed, the `message`'s usage gives them.
#[tokio::test]
async fn the_anthropic_api_is_measured_streamed_and_not() {
    let (url, _stop) = start_sim().await;
    for stream in [true, false] {
        let mut config = config(&url);
        config.api = Api::Anthropic;
        config.stream = stream;
        config.requests = 6;
        let (seen, progress) = counter();
        let report = bench::run(config, Workload::fresh("itest"), progress).await;
        assert_eq!(seen.load(Ordering::Relaxed), 6);
        let t = &report.targets[0];
        assert_eq!((t.requests, t.errors), (6, 0), "stream {stream}");
        assert_eq!(t.outcomes.get("none"), Some(&6));
        for s in &report.samples {
            assert_eq!((s.status, s.tokens), (200, 4), "stream {stream}: {s:?}");
            assert!(s.ttft_ms.is_some_and(|ttft| ttft > 0.0), "{s:?}");
            assert!(s.total_ms >= s.ttft_ms.unwrap_or(0.0));
            // Four deltas make three gaps; an unstreamed answer has none.
            assert_eq!(s.gaps_ms.len(), if stream { 3 } else { 0 });
        }
    }
}

/// A status the sim's Messages API answers with (here an injected 529 `overloaded_error`) is
/// counted as an error, not measured as an answer.
#[tokio::test]
async fn an_anthropic_error_status_is_an_error() {
    let (url, _stop) = start_sim_with(Some(sim::Fault::Status(529))).await;
    let mut config = config(&url);
    config.api = Api::Anthropic;
    config.requests = 3;
    config.warmup = 0;
    let (_, progress) = counter();
    let report = bench::run(config, Workload::fresh("itest"), progress).await;
    assert_eq!(
        (report.targets[0].requests, report.targets[0].errors),
        (3, 3)
    );
    for s in &report.samples {
        assert_eq!(s.status, 529);
        assert_eq!(s.error.as_deref(), Some("HTTP 529"));
        assert_eq!(s.tokens, 0);
    }
}
