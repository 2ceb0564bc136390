//! Replicas on one Redis keep in step through the change feed: an answer stored through one is a
//! semantic candidate on the others without a restart; invalidations, flushes, verdicts and config
//! patches sent to any replica act on all of them; a replica that loses its place in the feed
//! rebuilds; a replica with another embedding model refuses to match against the stored vectors.
//! Real `redis-server` (see `redis.rs`); the semantic tests need the model.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;
use crate::redis::{ask, on_redis, RedisServer};
use crate::semantic::{models, semantic_config};

/// Propagation through the feed takes a read of at most a second; this leaves room for a busy
/// machine without letting a broken feed pass.
const PROPAGATION: Duration = Duration::from_secs(15);

async fn admin(gw: &Gateway, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
    let mut request = client()
        .request(method, gw.url(path))
        .bearer_auth("admin-secret");
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("admin route");
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

/// Waits until `check` holds for `gw`'s `/admin/stats`, or fails naming `what`.
async fn eventually(gw: &Gateway, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PROPAGATION;
    loop {
        let stats = admin(gw, reqwest::Method::GET, "/admin/stats", None).await;
        if check(&stats) {
            return stats;
        }
        assert!(Instant::now() < deadline, "{what} never happened: {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn vectors(stats: &Value) -> u64 {
    stats["index"]["vectors"].as_u64().unwrap_or(u64::MAX)
}

#[tokio::test]
async fn entries_verdicts_and_deletes_reach_every_replica_through_the_feed() {
    let Some(models) = models() else { return };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    // Both replicas run before anything is stored: B learns of A's entries only from the feed.
    let a = start(on_redis(semantic_config(sim.base_url(), &models), &redis)).await;
    let b = start(on_redis(semantic_config(sim.base_url(), &models), &redis)).await;
    eventually(&b, "B's empty index", |s| {
        vectors(s) == 0 && s["index"]["rebuilding"] == false
    })
    .await;

    let miss = ask(&a, "how do I reset my password").await;
    assert_eq!(outcome(&miss), "miss");
    let answer = content(miss, false).await;
    eventually(&b, "A's entry in B's index", |s| vectors(s) == 1).await;

    let hit = ask(&b, "I forgot my password, how can I reset it").await;
    assert_eq!(outcome(&hit), "semantic-hit");
    let served_by_b = header(&hit, "x-reprise-request-id").expect("request id");
    assert_eq!(content(hit, false).await, answer);
    assert_eq!(upstream_calls(&sim), 1);

    // A verdict on B's hit, sent to A: A finds what B's request met, and B applies the veto.
    // B shares what its request met off the request path (a moment after its answer), so the
    // verdict is retried while A cannot know the request yet.
    let deadline = Instant::now() + PROPAGATION;
    let verdict = loop {
        let response = client()
            .post(a.url("/admin/feedback"))
            .bearer_auth("admin-secret")
            .json(&json!({"request_id": served_by_b, "verdict": "wrong"}))
            .send()
            .await
            .expect("admin route");
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            break body;
        }
        assert!(
            status == 404 && Instant::now() < deadline,
            "/admin/feedback: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        verdict["effect"]
            .as_str()
            .unwrap_or("")
            .starts_with("vetoed"),
        "{verdict}"
    );
    eventually(&b, "the veto on B", |s| s["feedback"]["vetoes"] == 1).await;
    let vetoed = ask(&b, "I forgot my password, how can I reset it").await;
    assert_eq!(outcome(&vetoed), "miss", "B served a vetoed pair");

    // B's miss on the vetoed pair stored a second entry; both are in B's index.
    eventually(&b, "B's own entry in its index", |s| vectors(s) == 2).await;
    // Deleting A's entry through A takes it out of B's index (not only out of the store).
    let listed = admin(&a, reqwest::Method::GET, "/admin/entries", None).await;
    let first = listed["data"]
        .as_array()
        .and_then(|d| {
            d.iter()
                .find(|e| e["prompt"] == "how do I reset my password")
        })
        .unwrap_or_else(|| panic!("A's entry is not listed: {listed}"));
    let id = first["id"].as_str().expect("id");
    admin(
        &a,
        reqwest::Method::DELETE,
        &format!("/admin/entries/{id}"),
        None,
    )
    .await;
    eventually(&b, "the delete in B's index", |s| vectors(s) == 1).await;

    // A flush through A empties B's index.
    admin(&a, reqwest::Method::POST, "/admin/flush", None).await;
    let stats = eventually(&b, "the flush in B's index", |s| vectors(s) == 0).await;
    let replica = &stats["replica"];
    assert!(
        replica["replica"].as_str().is_some_and(|r| !r.is_empty()),
        "{replica}"
    );
    assert!(replica["applied"].as_u64().unwrap_or(0) >= 3, "{replica}");
    assert!(replica["error"].is_null(), "{replica}");
}

#[tokio::test]
async fn a_config_patch_sent_to_one_replica_applies_to_all_and_to_later_ones() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let a = start(on_redis(config_for(sim.base_url()), &redis)).await;
    let b = start(on_redis(config_for(sim.base_url()), &redis)).await;
    let patched = admin(
        &a,
        reqwest::Method::PATCH,
        "/admin/config",
        Some(json!({"similarity_threshold": 0.97, "default_ttl_s": 60})),
    )
    .await;
    assert_eq!(patched["default_ttl_s"], 60);

    let config = config_becomes(&b, "B applying A's patch", |c| c["default_ttl_s"] == 60).await;
    assert_eq!(config["similarity_threshold"], 0.97);
    // A replica started later applies every patch made before it, over its own start-up settings.
    let c = start(on_redis(config_for(sim.base_url()), &redis)).await;
    config_becomes(&c, "C catching up", |c| c["default_ttl_s"] == 60).await;
}

/// Waits until `check` holds for `gw`'s `/admin/config`, or fails naming `what`.
async fn config_becomes(gw: &Gateway, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + PROPAGATION;
    loop {
        let config = admin(gw, reqwest::Method::GET, "/admin/config", None).await;
        if check(&config) {
            return config;
        }
        assert!(Instant::now() < deadline, "{what} never happened: {config}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_replica_that_loses_its_place_in_the_feed_rebuilds() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let a = start(on_redis(config_for(sim.base_url()), &redis)).await;
    let b = start(on_redis(config_for(sim.base_url()), &redis)).await;
    ask(&a, "first question").await;
    eventually(&b, "B reading A's put", |s| {
        s["replica"]["applied"].as_u64() >= Some(1)
    })
    .await;
    assert_eq!(
        admin(&b, reqwest::Method::GET, "/admin/stats", None).await["replica"]["resyncs"],
        0
    );
    // The stream is gone (as after a Redis restart without persistence): B cannot know what it
    // missed, so it rebuilds from the store.
    let client = ::redis::Client::open(redis.url()).expect("url");
    let mut c = client.get_connection().expect("connect");
    ::redis::cmd("DEL")
        .arg("reprise:feed")
        .query::<()>(&mut c)
        .expect("DEL");
    eventually(&b, "B's rebuild", |s| s["replica"]["resyncs"] == 1).await;
    // And it follows the new stream from there.
    ask(&a, "second question").await;
    eventually(&b, "B reading the new stream", |s| {
        s["replica"]["applied"].as_u64() >= Some(2) && s["replica"]["error"].is_null()
    })
    .await;
}

/// A replica started while Redis is down must not take the store for empty: its index waits, and
/// fills once Redis is back. It used to start with an empty index taken for the whole one, and a
/// resync that ran before the replica noticed Redis was back read the store as empty again.
#[tokio::test]
async fn a_replica_started_while_redis_is_down_indexes_the_store_once_it_is_back() {
    let Some(models) = models() else { return };
    let Some(mut redis) = RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let a = start(on_redis(semantic_config(sim.base_url(), &models), &redis)).await;
    let questions = [
        "how do I reset my password",
        "how do I change the email address on my account",
        "how do I cancel my subscription",
    ];
    for question in questions {
        assert_eq!(outcome(&ask(&a, question).await), "miss");
    }
    eventually(&a, "A's entries in its index", |s| vectors(s) == 3).await;
    a.shutdown().await.expect("shutdown");

    redis.save_and_stop();
    let b = start(on_redis(semantic_config(sim.base_url(), &models), &redis)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = admin(&b, reqwest::Method::GET, "/admin/stats", None).await;
    assert_eq!(
        (vectors(&stats), &stats["index"]["rebuilding"]),
        (0, &json!(true)),
        "waiting for the store, not an empty index: {stats}"
    );

    redis.start_again();
    // The store's recovery (every 2 s) and the index's next try (its waits grow from 0.5 s).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = admin(&b, reqwest::Method::GET, "/admin/stats", None).await;
        if vectors(&stats) == 3 && stats["index"]["rebuilding"] == false {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B never indexed the store: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hit = ask(&b, "I forgot my password, how can I reset it").await;
    assert_eq!(outcome(&hit), "semantic-hit");
}

#[tokio::test]
async fn a_replica_with_another_embedding_model_refuses_semantic_matching() {
    let Some(models) = models() else { return };
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let client = ::redis::Client::open(redis.url()).expect("url");
    let mut c = client.get_connection().expect("connect");
    ::redis::cmd("SET")
        .arg("reprise:model")
        .arg("blake3:another-model")
        .query::<()>(&mut c)
        .expect("SET");
    let sim = sim_default().await;
    let gw = start(on_redis(semantic_config(sim.base_url(), &models), &redis)).await;
    let health = health(&gw).await;
    assert_eq!(health["semantic"]["status"], "disabled", "{health}");
    let why = health["semantic"]["detail"].as_str().unwrap_or("");
    assert!(
        why.contains("another embedding model") && why.contains("blake3:another-model"),
        "{why}"
    );
    // Exact caching still works.
    ask(&gw, "exact only").await;
    wait_for_entries(&gw, 1).await;
    assert_eq!(outcome(&ask(&gw, "exact only").await), "hit");
}

/// What one load worker saw: requests sent, and the failures (status or a broken body).
#[derive(Default, Debug)]
struct Seen {
    sent: usize,
    failures: Vec<String>,
    /// Prompts answered whole, and when.
    completed: Vec<(String, Instant)>,
}

/// `workers` clients send distinct prompts (and a repeated one, for hits) round-robin over
/// `urls` until `stop` is cancelled; each answer must be a 200 with a whole body.
fn load(
    urls: Vec<String>,
    workers: usize,
    stop: tokio_util::sync::CancellationToken,
) -> Vec<tokio::task::JoinHandle<Seen>> {
    (0..workers)
        .map(|w| {
            let urls = urls.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let mut seen = Seen::default();
                let mut i = 0usize;
                while !stop.is_cancelled() {
                    let url = &urls[(w + i) % urls.len()];
                    let prompt = if i.is_multiple_of(3) {
                        format!("repeated question {}", i % 5)
                    } else {
                        format!("load {w} {i}")
                    };
                    let stream = i.is_multiple_of(2);
                    i += 1;
                    seen.sent += 1;
                    let sent = client
                        .post(format!("{url}/v1/chat/completions"))
                        .bearer_auth("sk-a")
                        .json(&json!({"model": "m", "stream": stream,
                            "messages": [{"role": "user", "content": prompt}]}))
                        .timeout(Duration::from_secs(20))
                        .send()
                        .await;
                    let response = match sent {
                        Ok(r) => r,
                        Err(e) => {
                            seen.failures.push(format!("{url}: {e}"));
                            continue;
                        }
                    };
                    let status = response.status();
                    let body = response.text().await.unwrap_or_default();
                    let whole = if stream {
                        body.contains("[DONE]")
                    } else {
                        body.contains("\"choices\"")
                    };
                    if status.is_success() && whole {
                        seen.completed.push((prompt, Instant::now()));
                    } else {
                        seen.failures.push(format!("{url}: {status} {body}"));
                    }
                }
                seen
            })
        })
        .collect()
}

async fn gather(workers: Vec<tokio::task::JoinHandle<Seen>>) -> Seen {
    let mut all = Seen::default();
    for w in workers {
        let seen = w.await.expect("worker");
        all.sent += seen.sent;
        all.failures.extend(seen.failures);
        all.completed.extend(seen.completed);
    }
    all
}

async fn metric(gw: &Gateway, name: &str) -> f64 {
    let text = metrics(gw).await;
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} not in /metrics"))
}

#[tokio::test]
async fn killing_redis_under_load_fails_no_request_and_every_replica_recovers() {
    let Some(mut redis) = crate::redis::RedisServer::start() else {
        return;
    };
    let sim = sim_default().await;
    let a = start(on_redis(config_for(sim.base_url()), &redis)).await;
    let b = start(on_redis(config_for(sim.base_url()), &redis)).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let workers = load(vec![a.url(""), b.url("")], 4, stop.clone());
    tokio::time::sleep(Duration::from_millis(800)).await;

    redis.kill();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for gw in [&a, &b] {
        assert_eq!(health(gw).await["store"]["status"], "degraded");
        assert_eq!(metric(gw, "reprise_store_degraded").await, 1.0);
        assert!(metric(gw, "reprise_store_errors_total{kind=\"failed\"}").await >= 1.0);
    }

    redis.restart();
    for gw in [&a, &b] {
        let deadline = Instant::now() + PROPAGATION;
        while health(gw).await["store"]["status"] != "ok" {
            assert!(
                Instant::now() < deadline,
                "a replica never left degraded mode"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    stop.cancel();
    let seen = gather(workers).await;
    assert!(
        seen.sent > 20,
        "too little load to mean anything: {}",
        seen.sent
    );
    assert!(
        seen.failures.is_empty(),
        "{} of {} requests failed while Redis died and came back: {:?}",
        seen.failures.len(),
        seen.sent,
        &seen.failures[..seen.failures.len().min(3)]
    );

    // Redis came back empty: the replicas cache and share again, and both rebuilt from the store
    // (their place in the old feed is gone).
    let miss = ask(&a, "after the restart").await;
    assert_eq!(outcome(&miss), "miss");
    let deadline = Instant::now() + PROPAGATION;
    loop {
        let response = ask(&b, "after the restart").await;
        if outcome(&response) == "hit" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B never served A's answer after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for gw in [&a, &b] {
        eventually(gw, "a rebuild after Redis came back empty", |s| {
            s["replica"]["resyncs"].as_u64() >= Some(1)
        })
        .await;
    }
}

/// A `reprise` process on `redis` (exact matching only: no model needed), and its base URL.
async fn spawn_replica(
    upstream: &str,
    redis: &RedisServer,
    data_dir: &std::path::Path,
) -> (std::process::Child, String) {
    let url = redis.url();
    let flags = [
        "--store",
        "redis",
        "--redis-url",
        &url,
        "--semantic",
        "false",
    ];
    let (child, port) = crate::process::spawn_gateway_with(upstream, data_dir, &flags).await;
    (child, format!("http://127.0.0.1:{port}"))
}

#[tokio::test]
async fn a_replica_killed_under_load_leaves_whole_entries_and_the_others_serving() {
    use reprise_server::store::RedisStore;

    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = quick_sim().await;
    let dirs = [
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    ];
    let (mut a, a_url) = spawn_replica(&sim.base_url(), &redis, dirs[0].path()).await;
    let (mut b, b_url) = spawn_replica(&sim.base_url(), &redis, dirs[1].path()).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let on_a = load(vec![a_url.clone()], 4, stop.clone());
    let on_b = load(vec![b_url.clone()], 4, stop.clone());
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &a.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let _ = a.wait();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.cancel();
    let seen_a = gather(on_a).await;
    let seen_b = gather(on_b).await;
    assert!(seen_a.completed.len() > 16, "A was under load when killed");
    assert!(
        seen_b.failures.is_empty(),
        "B failed requests while A died: {:?}",
        &seen_b.failures[..seen_b.failures.len().min(3)]
    );

    // Every entry in Redis is whole: a finished answer, reachable through its key, or replaced by
    // a newer answer to the same prompt (A died between writing an entry and naming it).
    let store = RedisStore::new(&redis.url()).expect("url");
    let entries = whole_entries(&store, true);
    assert!(!entries.is_empty());
    // What the kill lost of A's acknowledged answers: those in its writer's queue.
    let stored: std::collections::HashSet<&str> =
        entries.iter().map(|e| e.summary.prompt.as_str()).collect();
    let from_a: Vec<&String> = seen_a
        .completed
        .iter()
        .map(|(p, _)| p)
        .filter(|p| p.starts_with("load "))
        .collect();
    let lost = from_a
        .iter()
        .filter(|p| !stored.contains(p.as_str()))
        .count();
    println!(
        "replica kill -9 loss: {lost} of {} answers A completed were not stored ({:.2}%)",
        from_a.len(),
        100.0 * lost as f64 / from_a.len().max(1) as f64
    );
    assert!(lost < from_a.len(), "nothing A stored survived");
    // What A stored is served by B.
    let survivor = from_a
        .iter()
        .find(|p| stored.contains(p.as_str()))
        .expect("a survivor");
    let response = reqwest::Client::new()
        .post(format!("{b_url}/v1/chat/completions"))
        .bearer_auth("sk-a")
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": survivor}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(outcome(&response), "hit");
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &b.id().to_string()])
        .status();
    let _ = b.wait();
}
