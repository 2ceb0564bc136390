//! Semantic matching with the real MiniLM model: paraphrases hit, unrelated prompts and other
//! partitions miss, thresholds only go up, the index survives restarts, and failures fall back to
//! exact matching. These tests need the provisioned model (`scripts/provision-models.sh`); without
//! it they skip locally and fail in CI.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;

const QUESTION: &str = "how do I reset my password";
const PARAPHRASE: &str = "I forgot my password, how can I reset it";
const UNRELATED: &str = "what is the capital of France";

/// The provisioned model folder, or `None` (skip) when it is missing outside CI.
pub fn models() -> Option<PathBuf> {
    let dir = std::env::var_os("REPRISE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../models")));
    if dir.join("all-MiniLM-L6-v2/model.onnx").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the embedding model is missing from {}: run scripts/provision-models.sh",
        dir.display()
    );
    eprintln!(
        "skipping: no embedding model in {} (run scripts/provision-models.sh)",
        dir.display()
    );
    None
}

pub fn semantic_config(
    upstream: String,
    models: &std::path::Path,
) -> reprise_server::config::Config {
    let mut config = config_for(upstream);
    config.model_dir = models.join("all-MiniLM-L6-v2");
    config.ort_lib = models.join("onnxruntime/libonnxruntime.so");
    // Generous: the test machine is small and busy; the fallback test sets its own.
    config.embed_deadline_ms = 5_000;
    config
}

/// As [`semantic_config`], keeping the store (and the index dump) in `dir`, for tests that restart.
pub fn semantic_config_in(
    upstream: String,
    models: &std::path::Path,
    dir: &std::path::Path,
) -> reprise_server::config::Config {
    let mut config = semantic_config(upstream, models);
    config.data_dir = dir.to_owned();
    config
}

async fn ask(gw: &Gateway, key: &str, content: &str, extra: &[(&str, &str)]) -> reqwest::Response {
    ask_body(gw, key, &chat_body(content, false), extra).await
}

async fn ask_body(
    gw: &Gateway,
    key: &str,
    body: &Value,
    extra: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(body);
    for (k, v) in extra {
        request = request.header(*k, *v);
    }
    request.send().await.expect("send")
}

/// Stores the answer to `content` and waits until the index has it.
async fn seed(gw: &Gateway, key: &str, content: &str) -> String {
    let before = gw.state.semantic.as_ref().map_or(0, |s| {
        reprise_server::index::VectorIndex::len(s.index.as_ref())
    });
    let response = ask(gw, key, content, &[]).await;
    assert_eq!(
        header(&response, "x-reprise-cache").as_deref(),
        Some("miss")
    );
    let body: Value = response.json().await.expect("json");
    for _ in 0..300 {
        let now = gw.state.semantic.as_ref().map_or(0, |s| {
            reprise_server::index::VectorIndex::len(s.index.as_ref())
        });
        if now > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned()
}

#[tokio::test]
async fn a_paraphrase_is_a_semantic_hit_and_an_unrelated_prompt_is_not() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    assert!(gw.state.semantic.is_some(), "model loaded");
    let original = seed(&gw, "sk-a", QUESTION).await;
    let calls = sim.stats.snapshot().chat_completions;

    let hit = ask(&gw, "sk-a", PARAPHRASE, &[]).await;
    assert_eq!(
        header(&hit, "x-reprise-cache").as_deref(),
        Some("semantic-hit")
    );
    let similarity: f64 = header(&hit, "x-reprise-similarity")
        .expect("similarity")
        .parse()
        .expect("num");
    assert!((0.9..=1.0).contains(&similarity), "{similarity}");
    let timing = header(&hit, "server-timing").expect("timing");
    assert!(
        timing.contains("embed;dur=") && timing.contains("search;dur="),
        "{timing}"
    );
    let body: Value = hit.json().await.expect("json");
    assert_eq!(body["choices"][0]["message"]["content"], original.as_str());
    assert_eq!(
        sim.stats.snapshot().chat_completions,
        calls,
        "upstream not called"
    );

    let miss = ask(&gw, "sk-a", UNRELATED, &[]).await;
    assert_eq!(header(&miss, "x-reprise-cache").as_deref(), Some("miss"));
    let nearest: f64 = header(&miss, "x-reprise-nearest")
        .expect("nearest")
        .parse()
        .expect("num");
    assert!(nearest < 0.5, "unrelated prompt scored {nearest}");

    // exact-only mode never serves the paraphrase.
    let exact_only = ask(
        &gw,
        "sk-a",
        PARAPHRASE,
        &[("x-reprise-cache-mode", "exact-only")],
    )
    .await;
    assert_eq!(
        header(&exact_only, "x-reprise-cache").as_deref(),
        Some("miss")
    );
}

#[tokio::test]
async fn other_tenants_models_and_system_prompts_never_match() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    seed(&gw, "sk-a", QUESTION).await;
    assert_eq!(
        header(&ask(&gw, "sk-b", PARAPHRASE, &[]).await, "x-reprise-cache").as_deref(),
        Some("miss")
    );
    let other_model =
        json!({"model": "another-model", "messages": [{"role": "user", "content": PARAPHRASE}]});
    assert_eq!(
        header(
            &ask_body(&gw, "sk-a", &other_model, &[]).await,
            "x-reprise-cache"
        )
        .as_deref(),
        Some("miss")
    );
    let with_system = json!({"model": "sim-model", "messages": [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": PARAPHRASE}
    ]});
    assert_eq!(
        header(
            &ask_body(&gw, "sk-a", &with_system, &[]).await,
            "x-reprise-cache"
        )
        .as_deref(),
        Some("miss")
    );
}

#[tokio::test]
async fn a_request_may_raise_the_threshold_but_never_lower_it() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    seed(&gw, "sk-a", QUESTION).await;
    let strict = ask(&gw, "sk-a", PARAPHRASE, &[("x-reprise-threshold", "0.99")]).await;
    assert_eq!(header(&strict, "x-reprise-cache").as_deref(), Some("miss"));
    let lowered = ask(&gw, "sk-a", UNRELATED, &[("x-reprise-threshold", "0.05")]).await;
    assert_eq!(lowered.status(), 400);
    let err: Value = lowered.json().await.expect("json");
    assert_eq!(err["error"]["param"], "x-reprise-threshold");
}

#[tokio::test]
async fn semantic_hits_survive_restarts_with_and_without_the_index_dump() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || semantic_config_in(sim.base_url(), &models, dir.path());
    let gw = start(config()).await;
    seed(&gw, "sk-a", QUESTION).await;
    gw.shutdown().await.expect("shutdown");
    assert!(
        dir.path().join("index").exists(),
        "index dumped at shutdown"
    );

    for delete_dump in [false, true] {
        if delete_dump {
            std::fs::remove_dir_all(dir.path().join("index")).expect("delete dump");
        }
        let gw = start(config()).await;
        // The dump loads, or without it the index is rebuilt, in the background; wait for it.
        let semantic = index_ready(&gw).await;
        // The ids the store's ledger says have a vector are the dump's: it loads, no rebuild.
        assert_eq!(semantic.index.from_dump(), !delete_dump);
        let hit = ask(&gw, "sk-a", PARAPHRASE, &[]).await;
        assert_eq!(
            header(&hit, "x-reprise-cache").as_deref(),
            Some("semantic-hit"),
            "after restart (dump deleted: {delete_dump})"
        );
        gw.shutdown().await.expect("shutdown");
    }
}

/// The gateway's semantic stage once its index is whole (the dump loaded, or the index rebuilt, in
/// the background after a start); fails after 5 s.
async fn index_ready(gw: &Gateway) -> &reprise_server::semantic::Semantic {
    let semantic = gw.state.semantic.as_ref().expect("semantic");
    for _ in 0..500 {
        if !semantic.index.is_building() {
            return semantic;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the index was still building after 5 s");
}

/// Copies the files of `from` (an index dump: no subfolders) into `to`, created if need be.
fn copy_files(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("listing") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

#[tokio::test]
async fn a_dump_behind_the_store_is_caught_up_not_rebuilt() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || semantic_config_in(sim.base_url(), &models, dir.path());
    // A dump that holds UNRELATED only, kept aside.
    let gw = start(config()).await;
    seed(&gw, "sk-a", UNRELATED).await;
    gw.shutdown().await.expect("shutdown");
    let old_dump = tempfile::tempdir().expect("tempdir");
    copy_files(&dir.path().join("index"), old_dump.path());

    // Then UNRELATED leaves the store and QUESTION comes in; the dump saved at this shutdown is
    // replaced by the old one, as if the process had died before saving it.
    let gw = start(config()).await;
    let gone = gw
        .state
        .cache
        .store
        .list(None, 10)
        .expect("list")
        .pop()
        .expect("entry");
    assert!(gw.state.cache.store.delete(gone.id).expect("delete"));
    seed(&gw, "sk-a", QUESTION).await;
    gw.shutdown().await.expect("shutdown");
    std::fs::remove_dir_all(dir.path().join("index")).expect("rm dump");
    copy_files(old_dump.path(), &dir.path().join("index"));
    // Nor did it write its ledger file: the store's open scans, and the dump loads beside it.
    std::fs::remove_file(dir.path().join("ledger")).expect("rm ledger file");

    let gw = start(config()).await;
    let semantic = index_ready(&gw).await;
    // The dump was loaded and brought up to the store: QUESTION added, UNRELATED removed.
    assert!(semantic.index.from_dump(), "loaded, not rebuilt");
    let index = semantic.index.current();
    let stored: std::collections::BTreeSet<u64> = gw
        .state
        .cache
        .store
        .list(None, 10)
        .expect("list")
        .iter()
        .map(|e| e.id.0)
        .collect();
    assert_eq!((index.ids(), stored.len()), (stored, 1));
    assert_eq!(
        header(&ask(&gw, "sk-a", PARAPHRASE, &[]).await, "x-reprise-cache").as_deref(),
        Some("semantic-hit")
    );
    gw.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn deleted_and_expired_entries_are_never_served() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    // Expired: a one-second TTL.
    let response = ask(&gw, "sk-a", QUESTION, &[("x-reprise-ttl", "1")]).await;
    let _ = response.bytes().await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        header(&ask(&gw, "sk-a", PARAPHRASE, &[]).await, "x-reprise-cache").as_deref(),
        Some("miss")
    );
    // Deleted: remove the entry behind the index's back.
    let gw2 = start(semantic_config(sim.base_url(), &models)).await;
    seed(&gw2, "sk-a", QUESTION).await;
    let entry = gw2
        .state
        .cache
        .store
        .list(None, 10)
        .expect("list")
        .pop()
        .expect("entry");
    assert!(gw2.state.cache.store.delete(entry.id).expect("delete"));
    assert_eq!(
        header(&ask(&gw2, "sk-a", PARAPHRASE, &[]).await, "x-reprise-cache").as_deref(),
        Some("miss")
    );
}

#[tokio::test]
async fn embedding_failures_fall_back_to_exact_matching() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let mut config = semantic_config(sim.base_url(), &models);
    // No embedding finishes in a microsecond-scale deadline: every request falls back.
    config.embed_deadline_ms = 1;
    let gw = start(config).await;
    let first = ask(&gw, "sk-a", QUESTION, &[]).await;
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "x-reprise-cache").as_deref(), Some("miss"));
    // The model's measured cost says no call fits: refused at once, and the response says so.
    assert_eq!(
        header(&first, "x-reprise-semantic").as_deref(),
        Some("skipped; reason=overload")
    );
    let _ = first.bytes().await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        header(&ask(&gw, "sk-a", QUESTION, &[]).await, "x-reprise-cache").as_deref(),
        Some("hit")
    );
    let fell_back = health(&gw).await;
    assert!(
        fell_back["semantic"]["fallbacks"]
            .as_u64()
            .expect("fallbacks")
            >= 1,
        "{fell_back}"
    );

    // A model that cannot be loaded: the gateway starts in exact-only mode and says so.
    let mut broken = semantic_config(sim.base_url(), &models);
    broken.model_dir = models.join("no-such-model");
    let gw = start(broken).await;
    let health = health(&gw).await;
    assert_eq!(health["mode"], "exact-only");
    assert_eq!(health["semantic"]["status"], "disabled");
    assert!(
        health["semantic"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no-such-model")),
        "{health}"
    );
    assert_eq!(ask(&gw, "sk-a", QUESTION, &[]).await.status(), 200);
}

/// Issue 24: at the defaults, 87% of misses skipped matching at concurrency 8 with the model at a
/// tenth of its capacity. A burst the model absorbs within the default budget (sized from the
/// model's own measured cost) is matched in full: no response says `x-reprise-semantic: skipped`,
/// nothing is counted as overload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_the_model_absorbs_within_the_budget_never_skips_matching() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let config = semantic_config(sim.base_url(), &models);
    let mut gw = start(config.clone()).await;
    let mut semantic = gw.state.semantic.clone().expect("model loaded");
    let mut cost = semantic.embedder.cost().expect("calibrated at load");
    let mut budget = Duration::from_millis(config.embed_queue_budget_ms);
    // Every text of a closed-loop burst of `clients` waits at most for a running call of them
    // all and then its own: keep that within half the budget.
    let fits = |cost: reprise_server::embed::Cost, budget: Duration| {
        (2..=8u64).rev().find(|n| cost.of(*n) * 2 <= budget / 2)
    };
    if fits(cost, budget).is_none() {
        // An unoptimized build on a busy machine can take longer for two texts than the default
        // budget: the rule, not the figure, is under test, so the budget is scaled to the model as
        // measured here, for a burst of 4.
        budget = cost.of(4) * 4;
        let mut scaled = config;
        scaled.embed_queue_budget_ms = u64::try_from(budget.as_millis()).expect("ms") + 1;
        drop(gw);
        gw = start(scaled).await;
        semantic = gw.state.semantic.clone().expect("model loaded");
        cost = semantic.embedder.cost().expect("calibrated at load");
    }
    let clients = fits(cost, budget).unwrap_or(2);
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let url = gw.url("/v1/chat/completions");
        tasks.spawn(async move {
            let mut skipped = Vec::new();
            for n in 0..8u64 {
                // Each client's own pace, so that they arrive while others' calls run.
                tokio::time::sleep(Duration::from_millis((c * 7 + n * 3) % 13)).await;
                let prompt = format!("client {c} asks question {n} about the weather on Mars");
                let response = client()
                    .post(&url)
                    .bearer_auth("sk-burst")
                    .json(&chat_body(&prompt, false))
                    .send()
                    .await
                    .expect("send");
                assert_eq!(response.status(), 200);
                if let Some(value) = header(&response, "x-reprise-semantic") {
                    skipped.push(format!("{prompt}: {value}"));
                }
                let _ = response.bytes().await;
            }
            skipped
        });
    }
    let mut skipped = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        skipped.extend(joined.expect("client task"));
    }
    let stats = semantic.embedder.stats();
    assert!(
        skipped.is_empty(),
        "{} of {} skipped ({clients} clients, {cost:?}): {skipped:?}; {stats:?}",
        skipped.len(),
        clients * 8
    );
    assert_eq!(semantic.fallbacks().overload, 0, "{stats:?}");
}

#[tokio::test]
async fn a_repeated_paraphrase_skips_the_embedding_but_never_outlives_its_entry() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    let original = seed(&gw, "sk-a", QUESTION).await;
    let first = ask(&gw, "sk-a", PARAPHRASE, &[]).await;
    assert_eq!(
        header(&first, "x-reprise-cache").as_deref(),
        Some("semantic-hit")
    );
    let similarity = header(&first, "x-reprise-similarity").expect("similarity");
    let entry = header(&first, "x-reprise-entry").expect("entry");
    let embeds = gw
        .state
        .semantic
        .as_ref()
        .map(|s| s.embedder.stats().requests);

    // The same wording again: served from the same entry, same similarity, no embedding.
    let again = ask(&gw, "sk-a", PARAPHRASE, &[]).await;
    assert_eq!(
        header(&again, "x-reprise-cache").as_deref(),
        Some("semantic-hit")
    );
    assert_eq!(
        header(&again, "x-reprise-similarity"),
        Some(similarity.clone())
    );
    assert_eq!(header(&again, "x-reprise-entry"), Some(entry.clone()));
    let timing = header(&again, "server-timing").expect("timing");
    assert!(!timing.contains("embed;dur="), "{timing}");
    assert_eq!(
        gw.state
            .semantic
            .as_ref()
            .map(|s| s.embedder.stats().requests),
        embeds
    );
    let body: Value = again.json().await.expect("json");
    assert_eq!(body["choices"][0]["message"]["content"], original.as_str());

    // A stricter request does not take the shortcut below its threshold.
    let strict = ask(
        &gw,
        "sk-a",
        PARAPHRASE,
        &[("x-reprise-threshold", "0.9999")],
    )
    .await;
    assert_eq!(header(&strict, "x-reprise-cache").as_deref(), Some("miss"));
    let _ = strict.bytes().await;
    // Another tenant's identical wording is another partition.
    let other = ask(&gw, "sk-b", PARAPHRASE, &[]).await;
    assert_eq!(header(&other, "x-reprise-cache").as_deref(), Some("miss"));
    let _ = other.bytes().await;

    // Once the entry is deleted, the remembered paraphrase is not served either.
    let deleted = client()
        .delete(gw.url(&format!("/admin/entries/{entry}")))
        .bearer_auth("admin-secret")
        .send()
        .await
        .expect("delete");
    assert_eq!(deleted.status(), 200);
    let after = ask(&gw, "sk-a", PARAPHRASE, &[("cache-control", "no-store")]).await;
    assert_ne!(header(&after, "x-reprise-entry"), Some(entry));
    assert_ne!(
        header(&after, "x-reprise-cache").as_deref(),
        Some("semantic-hit")
    );
}

#[tokio::test]
async fn literal_guards_refuse_other_numbers_and_negations_until_turned_off() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    seed(&gw, "sk-a", "Can I book an appointment for 3pm tomorrow?").await;
    seed(&gw, "sk-a", "Cancel my gym subscription").await;
    let no_store = [("cache-control", "no-store")];
    let negated = "Don't cancel my gym subscription";

    for (prompt, guard) in [
        ("Can I book an appointment for 3pm on Friday?", "numbers"),
        (negated, "negation"),
    ] {
        let refused = ask(&gw, "sk-a", prompt, &no_store).await;
        assert_eq!(header(&refused, "x-reprise-cache").as_deref(), Some("miss"));
        assert_eq!(header(&refused, "x-reprise-guard").as_deref(), Some(guard));
        let nearest: f64 = header(&refused, "x-reprise-nearest")
            .expect("nearest")
            .parse()
            .expect("num");
        // The point of the guard: the embedding alone would have served this wrong answer.
        assert!(nearest >= 0.9, "{prompt} scored only {nearest}");
        refused.bytes().await.expect("body");
    }
    // The request log says the same, for /admin/requests and the dashboard.
    let mut recorded = Vec::new();
    for _ in 0..200 {
        recorded = gw.state.requests.recent(2);
        if recorded.len() == 2 && recorded[0].guard.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let guards: Vec<_> = recorded.iter().map(|r| r.guard.as_deref()).collect();
    assert_eq!(guards, [Some("negation"), Some("numbers")]);
    assert!(recorded.iter().all(|r| r.nearest.is_some_and(|n| n >= 0.9)));
    let refusals = gw.state.requests.stats.totals().guard_refusals;
    assert_eq!((refusals.numbers, refusals.negation), (1, 1));

    // A nearest candidate far below the threshold is no refusal, whatever a guard thinks of it:
    // `x-reprise-guard` stays for what the stats count, and only `x-reprise-nearest-guard` (for the
    // evaluation's sweep) names the guard.
    let unrelated = ask(&gw, "sk-a", "What is 2 plus 2?", &no_store).await;
    assert_eq!(
        header(&unrelated, "x-reprise-cache").as_deref(),
        Some("miss")
    );
    let nearest: f64 = header(&unrelated, "x-reprise-nearest")
        .expect("nearest")
        .parse()
        .expect("num");
    assert!(nearest < 0.9, "an unrelated prompt scored {nearest}");
    assert!(
        header(&unrelated, "x-reprise-nearest-guard").is_some(),
        "the guards refuse the nearest candidate (nearest {nearest})"
    );
    assert_eq!(header(&unrelated, "x-reprise-guard"), None);
    unrelated.bytes().await.expect("body");
    let mut last = None;
    for _ in 0..200 {
        last = gw.state.requests.recent(1).into_iter().next();
        if last
            .as_ref()
            .is_some_and(|r| r.nearest.is_some_and(|n| f64::from(n) < 0.9))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(last.expect("recorded").guard, None);
    let after = gw.state.requests.stats.totals().guard_refusals;
    assert_eq!(
        after, refusals,
        "a candidate below the threshold counted as a refusal"
    );

    // The same literals in other words still match, and carry no guard header.
    let paraphrase = ask(
        &gw,
        "sk-a",
        "Could I book an appointment for 3pm tomorrow?",
        &no_store,
    )
    .await;
    assert_eq!(
        header(&paraphrase, "x-reprise-cache").as_deref(),
        Some("semantic-hit"),
        "nearest {:?}, guard {:?}",
        header(&paraphrase, "x-reprise-nearest"),
        header(&paraphrase, "x-reprise-guard")
    );
    assert_eq!(header(&paraphrase, "x-reprise-guard"), None);

    // Turned off live, the embedding decides alone and serves the opposite request.
    let off = reprise_server::live::ConfigPatch {
        semantic_guards: Some("none".parse().expect("guards")),
        ..Default::default()
    };
    gw.state.live.apply(off).expect("valid patch");
    let loose = ask(&gw, "sk-a", negated, &[]).await;
    assert_eq!(
        header(&loose, "x-reprise-cache").as_deref(),
        Some("semantic-hit"),
        "without guards the negation is served from its nearest entry"
    );

    // Back on: the alias that unguarded hit left behind is checked again, not trusted.
    let on = reprise_server::live::ConfigPatch {
        semantic_guards: Some("numbers,negation".parse().expect("guards")),
        ..Default::default()
    };
    gw.state.live.apply(on).expect("valid patch");
    let again = ask(&gw, "sk-a", negated, &no_store).await;
    assert_eq!(header(&again, "x-reprise-cache").as_deref(), Some("miss"));
    assert_eq!(
        header(&again, "x-reprise-guard").as_deref(),
        Some("negation")
    );
}

/// `semantic_overlap`: a miss goes upstream at once and its semantic search runs meanwhile. A
/// paraphrase whose search finds its entry before the upstream's first byte is served that entry
/// (the upstream request is dropped); a new prompt whose upstream answers first is relayed as a
/// miss and still stored with its vector, so that its own paraphrases hit later.
#[tokio::test]
async fn with_overlap_a_paraphrase_beats_a_slow_upstream_and_a_fast_miss_keeps_its_vector() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let mut config = semantic_config(sim.base_url(), &models);
    config.semantic_overlap = true;
    let gw = start(config).await;
    let original = seed(&gw, "sk-a", QUESTION).await;

    // The upstream would take 5 s to its first token: the search wins, whatever the machine's load.
    let slow = [("x-sim-ttft-ms", "5000")];
    for stream in [false, true] {
        let hit = ask_body(&gw, "sk-a", &chat_body(PARAPHRASE, stream), &slow).await;
        assert_eq!(
            header(&hit, "x-reprise-cache").as_deref(),
            Some("semantic-hit"),
            "stream: {stream}"
        );
        assert!(header(&hit, "x-reprise-similarity").is_some());
        assert_eq!(content(hit, stream).await, original, "stream: {stream}");
    }
    // The streamed repeat came from the alias memory, before any race: one race, won by the search.
    let stats = admin_stats(&gw).await;
    assert_eq!(
        stats["semantic_overlap"]["semantic_first"], 1,
        "{}",
        stats["semantic_overlap"]
    );

    // An upstream that answers at once, before the search: relayed as a miss, stored with its
    // vector (or given one by the backfill), and then its paraphrase is a semantic hit.
    let vectors = || {
        gw.state.semantic.as_ref().map_or(0, |s| {
            reprise_server::index::VectorIndex::len(s.index.as_ref())
        })
    };
    let before = vectors();
    let fast = [("x-sim-ttft-ms", "0")];
    let miss = ask(&gw, "sk-a", UNRELATED, &fast).await;
    assert_eq!(header(&miss, "x-reprise-cache").as_deref(), Some("miss"));
    let answer: Value = miss.json().await.expect("json");
    for _ in 0..200 {
        if vectors() > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(vectors() > before, "the miss's entry got its vector");
    let again = ask(
        &gw,
        "sk-a",
        "What's the capital of France?",
        &[("x-sim-ttft-ms", "5000"), ("cache-control", "no-store")],
    )
    .await;
    assert_eq!(
        header(&again, "x-reprise-cache").as_deref(),
        Some("semantic-hit")
    );
    let body: Value = again.json().await.expect("json");
    assert_eq!(body["choices"], answer["choices"]);
}

async fn admin_stats(gw: &Gateway) -> Value {
    admin_json(gw, "/admin/stats").await
}
