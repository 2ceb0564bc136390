//! `reprise-client eval --api anthropic` and `calibrate --api anthropic` through a real gateway in
//! front of the sim's Messages API: the pairs go out as Messages API requests (the sim sees no chat
//! completion, a conversation's system message travels as the top-level `system`), their outcomes
//! are measured as on the chat route, and the threshold found is applied to a namespace.

use clap::Parser;
use serde_json::{json, Value};

use super::upstream_messages;
use crate::common::*;
use crate::semantic::{models, semantic_config};

#[derive(Parser)]
struct Eval {
    #[command(flatten)]
    args: reprise_client::eval::cli::EvalArgs,
}

#[derive(Parser)]
struct Calibrate {
    #[command(flatten)]
    args: reprise_client::eval::calibrate::CalibrateArgs,
}

#[tokio::test]
async fn eval_and_calibrate_drive_the_messages_api() {
    let Some(models) = models() else { return };
    let sim = sim_default().await;
    let mut config = semantic_config(sim.base_url(), &models);
    config.anthropic_upstream_url = sim.base_url();
    config.validate().expect("valid");
    let gw = start(config).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pairs = dir.path().join("pairs.jsonl");
    let terse = |q: &str| json!([{"role": "system", "content": "Be terse."}, {"role": "user", "content": q}]);
    let lines = [
        json!({"id": "exact", "a": "how do I reset my password", "b": "how do I reset my password", "same_answer": true}),
        json!({"id": "para", "a": "how do I reset my password", "b": "I forgot my password, how can I reset it", "same_answer": true}),
        json!({"id": "system", "a": terse("how do I reset my password"), "b": terse("I forgot my password, how can I reset it"), "same_answer": true}),
        json!({"id": "trap", "a": "How do I reset my password?", "b": "How do I reset my username?", "same_answer": false}),
    ];
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&pairs, text.join("\n")).expect("pairs");
    let url = gw.url("");
    let path = pairs.to_str().expect("path");

    let eval = Eval::try_parse_from([
        "eval",
        "--url",
        &url,
        "--pairs",
        path,
        "--api",
        "anthropic",
        "--concurrency",
        "2",
    ])
    .expect("arguments");
    let (evaluation, summary) = reprise_client::eval::cli::evaluate(&eval.args, "eval")
        .await
        .expect("evaluated");
    assert_eq!(summary.overall.errors, 0, "{:?}", summary.failures);
    let outcome = |id: &str| {
        evaluation
            .results
            .iter()
            .find(|r| r.id == id)
            .map(|r| r.outcome.clone())
            .expect("result")
    };
    assert_eq!(outcome("exact"), "hit");
    assert_eq!(outcome("para"), "semantic-hit");
    assert_eq!(outcome("system"), "semantic-hit");
    // Every pair went through the Messages API: nothing reached the chat completions upstream,
    // and the gateway logged the Messages route only.
    assert_eq!(sim.stats.snapshot().chat_completions, 0);
    assert!(upstream_messages(&sim) >= 4, "each `a` once");
    let stats = admin_json(&gw, "/admin/stats").await;
    assert!(stats["by_route"]["messages"]["total"].as_u64() > Some(8));
    assert!(
        stats["by_route"].get("chat.completions").is_none(),
        "{stats}"
    );

    let calibrate = Calibrate::try_parse_from([
        "calibrate",
        "--url",
        &url,
        "--pairs",
        path,
        "--api",
        "anthropic",
        "--max-wrong",
        "0",
        "--namespace",
        "support",
        "--apply",
        "--admin-token",
        "admin-secret",
    ])
    .expect("arguments");
    let code = reprise_client::eval::calibrate::run(calibrate.args).await;
    assert_eq!(
        format!("{code:?}"),
        format!("{:?}", std::process::ExitCode::SUCCESS)
    );
    let config = admin_json(&gw, "/admin/config").await;
    assert!(
        config["namespace_thresholds"]["support"].is_number(),
        "{config}"
    );
    assert_eq!(sim.stats.snapshot().chat_completions, 0);
}
