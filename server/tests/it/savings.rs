//! Savings accounting through the gateway, against the sim: a hit says what it saved
//! (`x-reprise-tokens-saved`, `x-reprise-cost-saved`) on chat completions, Anthropic's Messages API
//! and the Responses API; tokens are the stored usage, or counted when the stream had none; the
//! price comes from `--prices`, a namespace's own, or the default table, and an unpriced model
//! has no cost. `/admin/stats`, `/metrics` and the dashboard's data match the sum over the records.

use std::collections::BTreeMap;
use std::time::Duration;

use reprise_server::savings::{NamespacePrices, Price};
use serde_json::{json, Value};

use crate::common::*;

/// Per million tokens, from the test's `--prices` file.
const SIM_PRICE: (f64, f64) = (1.0, 2.0);
const CLAUDE_PRICE: (f64, f64) = (3.0, 15.0);
/// `sim-model` in namespace `support` (`namespace_prices`).
const SUPPORT_PRICE: (f64, f64) = (0.5, 0.5);
/// `gpt-4o-mini` from the compiled-in default table.
const GPT_4O_MINI: (f64, f64) = (0.15, 0.60);

fn cost(price: (f64, f64), input: u64, output: u64) -> f64 {
    (input as f64 * price.0 + output as f64 * price.1) / 1e6
}

/// `input=N, output=M[, counted=T]` read back.
fn tokens_header(value: &str) -> BTreeMap<String, String> {
    value
        .split(", ")
        .map(|pair| {
            let (k, v) = pair.split_once('=').expect("key=value");
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

async fn send(
    gw: &Gateway,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client()
        .post(gw.url(path))
        .bearer_auth("sk-tenant-a")
        .header("x-api-key", "sk-tenant-a")
        .header("anthropic-version", "2023-06-01")
        .json(body);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    request.send().await.expect("send")
}

/// A miss then a hit of `body`; returns the miss's usage (input, output) as the upstream reported
/// it (non-streamed only), and the hit's response headers.
async fn miss_then_hit(
    gw: &Gateway,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (Option<(u64, u64)>, reqwest::header::HeaderMap) {
    let stream = body["stream"].as_bool().unwrap_or(false);
    let before = gw.state.cache.store.len();
    let miss = send(gw, path, body, headers).await;
    assert_eq!(miss.status(), 200);
    assert_eq!(outcome(&miss), "miss");
    let usage = if stream {
        miss.text().await.expect("body");
        None
    } else {
        let json: Value = miss.json().await.expect("json");
        reprise_server::savings::usage_tokens(&json["usage"])
    };
    // The writer is off the request path: wait for this answer's entry.
    wait_for_entries(gw, before + 1).await;
    let mut hit = send(gw, path, body, headers).await;
    for _ in 0..200 {
        if outcome(&hit) == "hit" {
            break;
        }
        hit.bytes().await.expect("body");
        tokio::time::sleep(Duration::from_millis(10)).await;
        hit = send(gw, path, body, headers).await;
    }
    assert_eq!(outcome(&hit), "hit", "{path} {body}");
    let headers = hit.headers().clone();
    hit.bytes().await.expect("body");
    (usage, headers)
}

fn header_of(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Sums `name{...}` samples of the Prometheus text whose labels include `with`.
fn metric_sum(text: &str, name: &str, with: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn hits_say_what_they_saved_and_every_total_matches_the_records() {
    let sim = sim_default().await;
    let dir = tempfile::tempdir().expect("dir");
    let prices = dir.path().join("prices.toml");
    std::fs::write(
        &prices,
        format!(
            "date = \"2026-12-01\"\n[models]\n\"sim-model\" = {{ input = {}, output = {} }}\n\"claude-sim\" = {{ input = {}, output = {} }}\n",
            SIM_PRICE.0, SIM_PRICE.1, CLAUDE_PRICE.0, CLAUDE_PRICE.1
        ),
    )
    .expect("write");
    let mut config = config_for(sim.base_url());
    config.anthropic_upstream_url = sim.base_url();
    config.prices = Some(prices);
    config.namespace_prices = NamespacePrices::from([(
        "support".to_owned(),
        BTreeMap::from([(
            "sim-model".to_owned(),
            Price {
                input: SUPPORT_PRICE.0,
                output: SUPPORT_PRICE.1,
            },
        )]),
    )]);
    config.validate().expect("valid");
    let gw = start(config).await;

    // Chat, not streamed: the stored usage, priced from the file.
    let (usage, hit) = miss_then_hit(
        &gw,
        "/v1/chat/completions",
        &chat_body("What does a cache save?", false),
        &[],
    )
    .await;
    let (input, output) = usage.expect("the sim reports usage");
    assert!(input > 0 && output > 0);
    let saved = header_of(&hit, "x-reprise-tokens-saved").expect("tokens saved");
    assert_eq!(saved, format!("input={input}, output={output}"));
    assert_eq!(
        header_of(&hit, "x-reprise-cost-saved"),
        Some(format!("{:.6}", cost(SIM_PRICE, input, output)))
    );

    // The same model in a namespace with its own price.
    let (usage, hit) = miss_then_hit(
        &gw,
        "/v1/chat/completions",
        &chat_body("What does a namespace pay?", false),
        &[("x-reprise-namespace", "support")],
    )
    .await;
    let (input, output) = usage.expect("usage");
    assert_eq!(
        header_of(&hit, "x-reprise-cost-saved"),
        Some(format!("{:.6}", cost(SUPPORT_PRICE, input, output)))
    );

    // A stream without include_usage: counted with a tokenizer, and said so. Its tables are
    // built first: hits served before they are estimate (`approx:bytes/4`, a unit test's case).
    let _built = reprise_server::savings::tokenizer("sim-model");
    let (_, hit) = miss_then_hit(
        &gw,
        "/v1/chat/completions",
        &chat_body("Count my tokens, please", true),
        &[],
    )
    .await;
    let counted = tokens_header(&header_of(&hit, "x-reprise-tokens-saved").expect("saved"));
    assert_eq!(counted["counted"], "approx:o200k_base", "{counted:?}");
    assert!(counted["input"].parse::<u64>().expect("n") > 0);
    assert!(counted["output"].parse::<u64>().expect("n") > 0);
    assert!(header_of(&hit, "x-reprise-cost-saved").is_some());

    // A model the table does not price: tokens, no cost.
    let mut unpriced = chat_body("Nobody priced me", false);
    unpriced["model"] = json!("sim-unpriced");
    let (usage, hit) = miss_then_hit(&gw, "/v1/chat/completions", &unpriced, &[]).await;
    let (input, output) = usage.expect("usage");
    assert_eq!(
        header_of(&hit, "x-reprise-tokens-saved"),
        Some(format!("input={input}, output={output}"))
    );
    assert_eq!(header_of(&hit, "x-reprise-cost-saved"), None);

    // Anthropic's Messages API.
    let ask = json!({"model": "claude-sim", "max_tokens": 256, "stream": false,
        "messages": [{"role": "user", "content": "What does Claude cost?"}]});
    let (usage, hit) = miss_then_hit(&gw, "/v1/messages", &ask, &[]).await;
    let (input, output) = usage.expect("usage");
    assert_eq!(
        header_of(&hit, "x-reprise-tokens-saved"),
        Some(format!("input={input}, output={output}"))
    );
    assert_eq!(
        header_of(&hit, "x-reprise-cost-saved"),
        Some(format!("{:.6}", cost(CLAUDE_PRICE, input, output)))
    );

    // The Responses API, priced from the default table.
    let ask =
        json!({"model": "gpt-4o-mini", "input": "What does a response cost?", "stream": false});
    let (usage, hit) = miss_then_hit(&gw, "/v1/responses", &ask, &[]).await;
    let (input, output) = usage.expect("usage");
    assert_eq!(
        header_of(&hit, "x-reprise-tokens-saved"),
        Some(format!("input={input}, output={output}"))
    );
    assert_eq!(
        header_of(&hit, "x-reprise-cost-saved"),
        Some(format!("{:.6}", cost(GPT_4O_MINI, input, output)))
    );

    // The records: six hits, each with what it saved (records are written once delivered).
    let mut records = Vec::new();
    for _ in 0..200 {
        records = admin_json(&gw, "/admin/requests?limit=1000").await["data"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if records.iter().filter(|r| r["cache"] == "hit").count() == 6 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let hits: Vec<&Value> = records.iter().filter(|r| r["cache"] == "hit").collect();
    assert_eq!(hits.len(), 6, "{records:?}");
    assert!(records
        .iter()
        .filter(|r| r["cache"] == "miss")
        .all(|r| r.get("saved").is_none()));
    let sum = |pick: &dyn Fn(&Value) -> bool, field: &str| -> f64 {
        hits.iter()
            .filter(|r| pick(r))
            .filter_map(|r| r["saved"][field].as_f64())
            .sum()
    };
    let all = |_: &Value| true;
    let (input, output, usd) = (
        sum(&all, "input_tokens"),
        sum(&all, "output_tokens"),
        sum(&all, "cost_usd"),
    );
    assert_eq!(
        hits.iter()
            .filter(|r| r["saved"]["source"] == "counted")
            .count(),
        1
    );
    // The non-streamed hits' records count their tokens (they said 0 before).
    for r in hits.iter().filter(|r| r["stream"] == false) {
        assert!(r["phases"]["tokens"].as_u64().expect("tokens") > 0, "{r}");
        assert_eq!(
            r["phases"]["completion_tokens"], r["saved"]["output_tokens"],
            "{r}"
        );
    }

    // /admin/stats: totals, by route, model and namespace, and the unpriced hit.
    let stats = admin_json(&gw, "/admin/stats").await;
    let s = &stats["savings"];
    assert_eq!(s["total"]["hits"], 6, "{s}");
    assert_eq!(s["total"]["input_tokens"].as_f64(), Some(input));
    assert_eq!(s["total"]["output_tokens"].as_f64(), Some(output));
    assert!((s["total"]["cost_usd"].as_f64().expect("usd") - usd).abs() < 1e-9);
    assert_eq!(s["total"]["unpriced"], 1);
    assert_eq!(s["total"]["counted"], 1);
    assert_eq!(s["by_route"]["messages"]["hits"], 1, "{s}");
    assert_eq!(s["by_route"]["responses"]["hits"], 1, "{s}");
    assert_eq!(s["by_route"]["chat.completions"]["hits"], 4, "{s}");
    assert_eq!(s["by_model"]["sim-unpriced"]["unpriced"], 1, "{s}");
    assert_eq!(s["by_namespace"]["support"]["hits"], 1, "{s}");
    let support = |r: &Value| r["namespace"] == "support";
    assert_eq!(
        s["by_namespace"]["support"]["input_tokens"].as_f64(),
        Some(sum(&support, "input_tokens"))
    );
    assert!(s["prices"]["date"]
        .as_str()
        .expect("date")
        .contains("2026-12-01"));
    assert!((s["net_cost_usd"].as_f64().expect("net") - usd).abs() < 1e-9);

    // /metrics: the same sums.
    let text = metrics(&gw).await;
    assert_eq!(
        metric_sum(&text, "reprise_tokens_saved_total", "kind=\"input\""),
        input
    );
    assert_eq!(
        metric_sum(&text, "reprise_tokens_saved_total", "kind=\"output\""),
        output
    );
    assert!((metric_sum(&text, "reprise_cost_saved_total", "route=") - usd).abs() < 1e-9);
    let chat = |r: &Value| r["route"] == "chat.completions";
    assert_eq!(
        metric_sum(
            &text,
            "reprise_tokens_saved_total",
            "kind=\"output\",route=\"chat.completions\""
        ),
        sum(&chat, "output_tokens")
    );
    // No tenant, prompt or model in a savings label.
    for line in text.lines().filter(|l| l.contains("_saved_total{")) {
        assert!(
            !line.contains("tenant") && !line.contains("model="),
            "{line}"
        );
    }
    gw.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn a_bad_price_file_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().expect("dir");
    let prices = dir.path().join("prices.toml");
    std::fs::write(
        &prices,
        "[models]\n\"m\" = { input = \"cheap\", output = 1.0 }\n",
    )
    .expect("write");
    let mut config = reprise_server::config::Config {
        prices: Some(prices),
        ..reprise_server::config::Config::default()
    };
    let err = config.validate().expect_err("a bad price");
    assert!(err.to_string().contains("prices"), "{err}");
    let mut config = reprise_server::config::Config {
        prices: Some(dir.path().join("missing.toml")),
        ..reprise_server::config::Config::default()
    };
    let err = config.validate().expect_err("no file");
    assert!(err.to_string().contains("missing.toml"), "{err}");
}
