//! Shadow mode and feedback with the real MiniLM model: a shadowed request records what it would
//! have been served without being served it; `wrong` stops a semantic hit for good, across
//! restarts; `right` on a shadow decision makes the next identical prompt a hit. Like the other
//! semantic tests they need the provisioned model, and fail without it in CI.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;
use crate::semantic::{models, semantic_config, semantic_config_in};

const QUESTION: &str = "how do I reset my password";
const PARAPHRASE: &str = "I forgot my password, how can I reset it";
const SHIPS_AFTER: &str = "Can I cancel my order after it ships?";
const SHIPS_BEFORE: &str = "Can I cancel my order before it ships?";
const TOKEN: &str = "admin-secret";

async fn ask(gw: &Gateway, content: &str, extra: &[(&str, &str)]) -> reqwest::Response {
    let mut request = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-a")
        .json(&chat_body(content, false));
    for (k, v) in extra {
        request = request.header(*k, *v);
    }
    request.send().await.expect("send")
}

fn vectors(gw: &Gateway) -> usize {
    gw.state.semantic.as_ref().map_or(0, |s| {
        reprise_server::index::VectorIndex::len(s.index.as_ref())
    })
}

/// Stores the answer to `content` (a miss) and waits until the index holds it; returns the answer.
async fn seed(gw: &Gateway, content: &str) -> String {
    let before = vectors(gw);
    let response = ask(gw, content, &[]).await;
    assert_eq!(cache_of(&response), "miss");
    let body: Value = response.json().await.expect("json");
    for _ in 0..500 {
        if vectors(gw) > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(vectors(gw) > before, "the seeded answer reached the index");
    answer(&body)
}

fn answer(body: &Value) -> String {
    body["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_owned()
}

fn cache_of(response: &reqwest::Response) -> String {
    header(response, "x-reprise-cache").unwrap_or_default()
}

fn request_id(response: &reqwest::Response) -> String {
    header(response, "x-reprise-request-id").expect("x-reprise-request-id")
}

async fn admin(
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = client().request(method, gw.url(path)).bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("send");
    let status = response.status().as_u16();
    let text = response.text().await.expect("text");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn feedback(gw: &Gateway, request_id: &str, verdict: &str) -> (u16, Value) {
    admin(
        gw,
        reqwest::Method::POST,
        "/admin/feedback",
        Some(json!({"request_id": request_id, "verdict": verdict})),
    )
    .await
}

#[tokio::test]
async fn shadow_mode_records_what_it_would_serve_without_serving_it() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    seed(&gw, QUESTION).await;
    seed(&gw, SHIPS_AFTER).await;
    let calls = sim.stats.snapshot().chat_completions;

    // A paraphrase `on` would serve goes upstream, and says what would have happened.
    let shadowed = ask(&gw, PARAPHRASE, &[("x-reprise-cache-mode", "shadow")]).await;
    assert_eq!(cache_of(&shadowed), "miss");
    let said = header(&shadowed, "x-reprise-shadow").expect("x-reprise-shadow");
    assert!(said.starts_with("would-hit; similarity=0.9"), "{said}");
    let shadowed_id = request_id(&shadowed);
    assert_eq!(
        sim.stats.snapshot().chat_completions,
        calls + 1,
        "went upstream"
    );

    // Exact hits are the same prompt: shadow mode serves them.
    let exact = ask(&gw, QUESTION, &[("x-reprise-cache-mode", "shadow")]).await;
    assert_eq!(cache_of(&exact), "hit");
    assert!(header(&exact, "x-reprise-shadow").is_none());

    // The whole gateway in shadow mode, through the live config: a guarded trap is recorded with
    // every guard's verdict, the refusing one named.
    let (status, _) = admin(
        &gw,
        reqwest::Method::PATCH,
        "/admin/config",
        Some(json!({"cache_mode": "shadow"})),
    )
    .await;
    assert_eq!(status, 200);
    let trap = ask(&gw, SHIPS_BEFORE, &[]).await;
    assert_eq!(cache_of(&trap), "miss");
    let said = header(&trap, "x-reprise-shadow").expect("x-reprise-shadow");
    assert!(
        said.starts_with("would-refuse;") && said.contains("guard=direction"),
        "{said}"
    );
    assert_eq!(sim.stats.snapshot().chat_completions, calls + 2);

    let (status, page) = admin(&gw, reqwest::Method::GET, "/admin/shadow", None).await;
    assert_eq!(status, 200, "{page}");
    let data = page["data"].as_array().expect("data");
    assert_eq!(data.len(), 2, "{page}");
    // Newest first.
    assert_eq!(data[0]["would"], "would-refuse");
    assert_eq!(data[0]["entry_prompt"], SHIPS_AFTER);
    let guards = data[0]["guards"].as_array().expect("guards");
    assert_eq!(guards.len(), 8, "every guard judged");
    assert!(guards
        .iter()
        .any(|g| g["guard"] == "direction" && g["refuses"] == true && g["enabled"] == true));
    assert_eq!(data[1]["would"], "would-hit");
    assert_eq!(data[1]["request_id"], shadowed_id.as_str());
    assert_eq!(data[1]["prompt"], PARAPHRASE);
    assert_eq!(data[1]["entry_prompt"], QUESTION);
    assert!(
        data[1]["similarity"].as_f64().expect("similarity")
            >= data[1]["threshold"].as_f64().expect("threshold")
    );
    // What the would-be hit would have saved: its candidate's tokens, summed in the stats; a
    // refusal saves nothing.
    let would_save = &data[1]["would_save"];
    assert!(
        would_save["input_tokens"].as_u64().expect("input") > 0,
        "{would_save}"
    );
    assert!(
        would_save["output_tokens"].as_u64().expect("output") > 0,
        "{would_save}"
    );
    assert!(data[0].get("would_save").is_none(), "{}", data[0]);
    let (_, stats) = admin(&gw, reqwest::Method::GET, "/admin/stats", None).await;
    let shadow = &stats["savings"]["shadow"];
    assert_eq!(shadow["hits"], 1, "{shadow}");
    assert_eq!(shadow["input_tokens"], would_save["input_tokens"]);
    assert_eq!(shadow["output_tokens"], would_save["output_tokens"]);
    // Shadowed requests are misses: nothing was saved for real.
    assert_eq!(stats["savings"]["total"]["hits"], 1, "the exact hit only");

    // Filters and cursor pages.
    let (_, hits) = admin(&gw, reqwest::Method::GET, "/admin/shadow?would=hit", None).await;
    assert_eq!(hits["data"].as_array().map(Vec::len), Some(1));
    let (_, first) = admin(&gw, reqwest::Method::GET, "/admin/shadow?limit=1", None).await;
    assert_eq!(first["has_more"], true);
    let next = first["next_cursor"].as_str().expect("cursor");
    let (_, second) = admin(
        &gw,
        reqwest::Method::GET,
        &format!("/admin/shadow?limit=1&cursor={next}"),
        None,
    )
    .await;
    assert_eq!(second["data"][0]["would"], "would-hit");
    assert_eq!(second["has_more"], false);
    let (status, err) = admin(&gw, reqwest::Method::GET, "/admin/shadow?would=maybe", None).await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["param"], "would");
}

#[tokio::test]
async fn feedback_wrong_stops_a_semantic_hit_for_good_also_after_restart() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = || semantic_config_in(sim.base_url(), &models, dir.path());
    let gw = start(config()).await;
    let original = seed(&gw, QUESTION).await;
    let hit = ask(&gw, PARAPHRASE, &[]).await;
    assert_eq!(cache_of(&hit), "semantic-hit");
    let entry = header(&hit, "x-reprise-entry").expect("entry");
    let wrong_id = request_id(&hit);
    let body: Value = hit.json().await.expect("json");
    assert_eq!(answer(&body), original);

    // Feedback on what it cannot judge: an unknown request, an exact hit.
    let (status, err) = feedback(&gw, "req_nope", "wrong").await;
    assert_eq!(status, 404, "{err}");
    assert_eq!(err["error"]["code"], "request_not_found");
    let exact = ask(&gw, QUESTION, &[]).await;
    assert_eq!(cache_of(&exact), "hit");
    let (status, err) = feedback(&gw, &request_id(&exact), "wrong").await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "request_id");
    let (status, err) = feedback(&gw, &wrong_id, "meh").await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "verdict");

    let (status, record) = feedback(&gw, &wrong_id, "wrong").await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["entry"], entry.as_str());
    assert!(
        record["effect"]
            .as_str()
            .expect("effect")
            .starts_with("vetoed"),
        "{record}"
    );

    // Shadow mode knows it too: the vetoed pair would be refused, by feedback.
    let shadowed = ask(
        &gw,
        PARAPHRASE,
        &[
            ("cache-control", "no-store"),
            ("x-reprise-cache-mode", "shadow"),
        ],
    )
    .await;
    let said = header(&shadowed, "x-reprise-shadow").expect("x-reprise-shadow");
    assert!(
        said.starts_with("would-refuse;") && said.ends_with("guard=feedback"),
        "{said}"
    );

    // Neither the alias made by the hit nor a new search serves the pair again. `no-store`
    // keeps the paraphrase's own answer out of the cache, so every ask below tests the veto.
    let calls = sim.stats.snapshot().chat_completions;
    for _ in 0..2 {
        let again = ask(&gw, PARAPHRASE, &[("cache-control", "no-store")]).await;
        assert_eq!(cache_of(&again), "miss");
        assert_eq!(
            header(&again, "x-reprise-vetoed").as_deref(),
            Some(entry.as_str())
        );
    }
    assert_eq!(sim.stats.snapshot().chat_completions, calls + 2);
    let (_, stats) = admin(&gw, reqwest::Method::GET, "/admin/stats", None).await;
    assert_eq!(stats["feedback"]["wrong"], 1, "{stats}");
    assert_eq!(stats["feedback"]["vetoes"], 1);
    let (_, metrics) = admin(&gw, reqwest::Method::GET, "/metrics", None).await;
    let metrics = metrics.as_str().expect("text");
    assert!(
        metrics.contains("reprise_feedback_total{verdict=\"wrong\"} 1"),
        "{metrics}"
    );
    let (_, listed) = admin(&gw, reqwest::Method::GET, "/admin/feedback", None).await;
    assert_eq!(listed["data"][0]["request_id"], wrong_id.as_str());
    gw.shutdown().await.expect("shutdown");

    let gw = start(config()).await;
    for _ in 0..500 {
        if !gw
            .state
            .semantic
            .as_ref()
            .is_some_and(|s| s.index.is_building())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let after = ask(&gw, PARAPHRASE, &[("cache-control", "no-store")]).await;
    assert_eq!(cache_of(&after), "miss", "vetoed after a restart");
    assert_eq!(
        header(&after, "x-reprise-vetoed").as_deref(),
        Some(entry.as_str())
    );
    // The entry itself still serves its own prompt.
    assert_eq!(cache_of(&ask(&gw, QUESTION, &[]).await), "hit");
    let (_, stats) = admin(&gw, reqwest::Method::GET, "/admin/stats", None).await;
    assert_eq!(stats["feedback"]["wrong"], 1, "{stats}");
    gw.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn right_on_a_shadow_decision_or_a_near_miss_makes_the_next_identical_prompt_a_hit() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    let original = seed(&gw, QUESTION).await;
    // A strict threshold: `on` would not serve the paraphrase, and shadow mode says so.
    let strict = [
        ("x-reprise-threshold", "0.999"),
        ("cache-control", "no-store"),
    ];
    let shadowed = ask(
        &gw,
        PARAPHRASE,
        &[strict[0], strict[1], ("x-reprise-cache-mode", "shadow")],
    )
    .await;
    assert_eq!(cache_of(&shadowed), "miss");
    let said = header(&shadowed, "x-reprise-shadow").expect("x-reprise-shadow");
    assert!(said.starts_with("would-miss;"), "{said}");
    let before = ask(&gw, PARAPHRASE, &strict).await;
    assert_eq!(cache_of(&before), "miss", "not approved yet");

    // Through the typed client, as `reprise-client shadow` and `reprise-client feedback` do.
    let typed = reprise_client::admin::AdminClient::new(&gw.url(""), Some(TOKEN)).expect("client");
    let page = typed
        .shadow(&reprise_client::admin::ShadowQuery {
            would: Some("miss".into()),
            ..Default::default()
        })
        .await
        .expect("shadow");
    assert_eq!(page.data.len(), 1);
    let table = reprise_client::admin_cli::render_shadow(&page, page.data[0].at_ms);
    assert!(
        table.contains("would-miss") && table.contains(&page.data[0].request_id),
        "{table}"
    );
    let record = typed
        .feedback(&page.data[0].request_id, "right")
        .await
        .expect("feedback");
    assert_eq!(record.request_id, request_id(&shadowed));
    assert_eq!(record.effect, "approved alias");

    let calls = sim.stats.snapshot().chat_completions;
    let hit = ask(&gw, PARAPHRASE, &strict).await;
    assert_eq!(cache_of(&hit), "semantic-hit");
    let body: Value = hit.json().await.expect("json");
    assert_eq!(answer(&body), original);
    assert_eq!(
        sim.stats.snapshot().chat_completions,
        calls,
        "upstream not called"
    );

    // A near miss (a plain miss whose nearest candidate was below the threshold) can be approved too.
    let near = ask(&gw, "How can I reset my password?", &strict).await;
    assert_eq!(cache_of(&near), "miss");
    let (status, record) = feedback(&gw, &request_id(&near), "right").await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["met"], "near-miss");
    assert_eq!(record["effect"], "approved alias");
    let hit = ask(&gw, "How can I reset my password?", &strict).await;
    assert_eq!(cache_of(&hit), "semantic-hit");

    let (_, stats) = admin(&gw, reqwest::Method::GET, "/admin/stats", None).await;
    assert_eq!(stats["feedback"]["right"], 2, "{stats}");
    assert_eq!(stats["feedback"]["approvals"], 2);
}

#[tokio::test]
async fn a_namespace_runs_in_shadow_mode_and_gets_its_own_threshold_from_the_live_config() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    let support = ("x-reprise-namespace", "support");
    let before = vectors(&gw);
    assert_eq!(cache_of(&ask(&gw, QUESTION, &[support]).await), "miss");
    for _ in 0..500 {
        if vectors(&gw) > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let patch = |body: Value| admin(&gw, reqwest::Method::PATCH, "/admin/config", Some(body));
    let (status, err) = patch(json!({"namespace_modes": {"support": "sometimes"}})).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["param"], "namespace_modes");
    let (status, config) = patch(json!({"namespace_modes": {"support": "shadow"}})).await;
    assert_eq!(status, 200, "{config}");
    assert_eq!(config["namespace_modes"]["support"], "shadow");

    let shadowed = ask(&gw, PARAPHRASE, &[support, ("cache-control", "no-store")]).await;
    assert_eq!(cache_of(&shadowed), "miss");
    assert!(header(&shadowed, "x-reprise-shadow").is_some_and(|s| s.starts_with("would-hit")));
    let (_, page) = admin(
        &gw,
        reqwest::Method::GET,
        "/admin/shadow?namespace=support",
        None,
    )
    .await;
    assert_eq!(page["data"][0]["namespace"], "support", "{page}");
    let (_, other) = admin(
        &gw,
        reqwest::Method::GET,
        "/admin/shadow?namespace=sales",
        None,
    )
    .await;
    assert_eq!(other["data"].as_array().map(Vec::len), Some(0));
    // The request's own mode wins over its namespace's.
    let on = [
        support,
        ("cache-control", "no-store"),
        ("x-reprise-cache-mode", "on"),
    ];
    assert_eq!(cache_of(&ask(&gw, PARAPHRASE, &on).await), "semantic-hit");

    // A namespace threshold set live applies at once, and a request can still only raise it.
    let (status, _) = patch(json!({"namespace_thresholds": {"support": 0.995}})).await;
    assert_eq!(status, 200);
    let on_fresh = [
        support,
        ("cache-control", "no-store"),
        ("x-reprise-cache-mode", "on"),
    ];
    let strict = ask(&gw, "I forgot my password, how do I reset it?", &on_fresh).await;
    assert_eq!(cache_of(&strict), "miss");
    let lower = ask(
        &gw,
        PARAPHRASE,
        &[
            support,
            ("x-reprise-cache-mode", "on"),
            ("x-reprise-threshold", "0.95"),
        ],
    )
    .await;
    assert_eq!(lower.status(), 400);
    let (status, err) = patch(json!({"namespace_thresholds": {"support": 1.5}})).await;
    assert_eq!(status, 400);
    assert_eq!(err["error"]["param"], "namespace_thresholds");
}

#[tokio::test]
async fn calibrate_finds_the_threshold_within_the_budget_and_applies_it_to_a_namespace() {
    use clap::Parser;
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let gw = start(semantic_config(sim.base_url(), &models)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pairs = dir.path().join("pairs.jsonl");
    let lines = [
        json!({"a": QUESTION, "b": PARAPHRASE, "same_answer": true, "category": "paraphrase"}),
        json!({"a": "What are your opening hours?", "b": "When are you open?", "same_answer": true, "category": "paraphrase"}),
        // Unguarded traps: only the threshold keeps them out.
        json!({"a": "How do I reset my password?", "b": "How do I reset my username?", "same_answer": false, "category": "entity"}),
        json!({"a": "What are your opening hours?", "b": "What are your opening hours on holidays?", "same_answer": false, "category": "scope"}),
    ];
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&pairs, text.join("\n")).expect("pairs");

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: reprise_client::eval::calibrate::CalibrateArgs,
    }
    let url = gw.url("");
    let cli = Cli::try_parse_from([
        "calibrate",
        "--url",
        url.as_str(),
        "--pairs",
        pairs.to_str().expect("path"),
        "--max-wrong",
        "0",
        "--namespace",
        "support",
        "--apply",
        "--admin-token",
        TOKEN,
        "--concurrency",
        "2",
    ])
    .expect("arguments");
    let code = reprise_client::eval::calibrate::run(cli.args).await;
    assert_eq!(
        format!("{code:?}"),
        format!("{:?}", std::process::ExitCode::SUCCESS)
    );

    // The floor set for the namespace keeps both traps out and serves what it can.
    let (_, config) = admin(&gw, reqwest::Method::GET, "/admin/config", None).await;
    let floor = config["namespace_thresholds"]["support"]
        .as_f64()
        .expect("namespace threshold applied");
    assert!((0.0..=1.0).contains(&floor), "{config}");
    let support = ("x-reprise-namespace", "support");
    for (a, b) in [
        ("How do I reset my password?", "How do I reset my username?"),
        (
            "What are your opening hours?",
            "What are your opening hours on holidays?",
        ),
    ] {
        let before = vectors(&gw);
        assert_eq!(cache_of(&ask(&gw, a, &[support]).await), "miss");
        for _ in 0..500 {
            if vectors(&gw) > before {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let trap = ask(&gw, b, &[support, ("cache-control", "no-store")]).await;
        assert_eq!(
            cache_of(&trap),
            "miss",
            "{b} at the calibrated floor {floor}"
        );
    }
}
