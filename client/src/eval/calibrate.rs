//! `reprise-client calibrate`: the threshold an application can afford, from its own labeled pairs.
//! It runs the pairs through the gateway exactly like `eval` (same protocol, same figures), prints
//! the threshold curve and the highest should-hit share whose served traps stay within
//! `--max-wrong`, and with `--apply` sets that threshold live (`PATCH /admin/config`) for the
//! namespace, or globally without one. It never applies a threshold that misses the budget.

use std::process::ExitCode;

use serde::Serialize;

use super::cli::{evaluate, finish, EvalArgs};
use super::report;
use super::score::{self, Best};
use crate::admin::{AdminClient, ConfigPatch, TOKEN_ENV};

#[derive(Debug, Clone, clap::Args)]
pub struct CalibrateArgs {
    #[command(flatten)]
    pub eval: EvalArgs,
    /// The largest share of trap pairs (`same_answer: false`) the threshold may serve.
    #[arg(long, default_value_t = 0.01)]
    pub max_wrong: f64,
    /// The namespace whose threshold `--apply` sets [default: the global similarity_threshold].
    #[arg(long)]
    pub namespace: Option<String>,
    /// Set the threshold found on the gateway (needs the admin token).
    #[arg(long)]
    pub apply: bool,
    /// Admin bearer token, for --apply.
    #[arg(long, env = TOKEN_ENV, hide_env_values = true)]
    pub admin_token: Option<String>,
}

/// What `--json` prints.
#[derive(Debug, Serialize)]
struct Calibration<'a> {
    max_wrong: f64,
    namespace: Option<&'a str>,
    best: Option<Best>,
    applied: bool,
    summary: &'a report::Summary,
}

/// The `PATCH /admin/config` body that sets `threshold` for `namespace` (or globally).
pub fn patch_for(namespace: Option<&str>, threshold: f64) -> ConfigPatch {
    // Rounded to the 4 decimals similarities are reported with, so the config shows what was found.
    let t = ((threshold * 1e4).round() / 1e4) as f32;
    match namespace {
        Some(ns) => ConfigPatch {
            namespace_thresholds: Some([(ns.to_owned(), Some(t))].into_iter().collect()),
            ..ConfigPatch::default()
        },
        None => ConfigPatch {
            similarity_threshold: Some(t),
            ..ConfigPatch::default()
        },
    }
}

/// Runs the command: exit 0 when a threshold meets the budget (and was applied, if asked), 1 when
/// none does or the run failed, 2 for bad input.
pub async fn run(args: CalibrateArgs) -> ExitCode {
    if !(0.0..=1.0).contains(&args.max_wrong) {
        eprintln!(
            "reprise-client calibrate: --max-wrong must be a share between 0 and 1, like 0.01"
        );
        return ExitCode::from(2);
    }
    if args.apply && args.admin_token.is_none() {
        eprintln!("reprise-client calibrate: --apply needs the admin token (--admin-token or {TOKEN_ENV})");
        return ExitCode::from(2);
    }
    let (evaluation, summary) = match evaluate(&args.eval, "calibrate").await {
        Ok(done) => done,
        Err(code) => return code,
    };
    let scored: Vec<_> = evaluation
        .results
        .iter()
        .filter_map(|r| r.scored())
        .collect();
    let best = score::best_within(&scored, args.max_wrong);
    let mut applied = false;
    if let (true, Some(b)) = (args.apply, best) {
        let patch = patch_for(args.namespace.as_deref(), b.threshold);
        let client = match AdminClient::new(&args.eval.url, args.admin_token.as_deref()) {
            Ok(c) => c,
            Err(err) => {
                eprintln!("reprise-client calibrate: {err}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(err) = client.patch_config(&patch).await {
            eprintln!("reprise-client calibrate: applying the threshold failed: {err}");
            return ExitCode::FAILURE;
        }
        applied = true;
    }
    let target = args
        .namespace
        .as_deref()
        .map_or("the global threshold".to_owned(), |n| {
            format!("namespace {n}")
        });
    if args.eval.json {
        let out = Calibration {
            max_wrong: args.max_wrong,
            namespace: args.namespace.as_deref(),
            best,
            applied,
            summary: &summary,
        };
        match serde_json::to_string_pretty(&out) {
            Ok(text) => println!("{text}"),
            Err(err) => {
                eprintln!("reprise-client calibrate: {err}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", report::render_text(&summary));
        match best {
            Some(b) => println!(
                "\ncalibrated: threshold {:.4} serves {:.1}% of should-hit pairs and {:.1}% of traps (budget {:.1}%){}",
                b.threshold,
                b.hit_share * 100.0,
                b.trap_share * 100.0,
                args.max_wrong * 100.0,
                if applied {
                    format!("; applied to {target}")
                } else {
                    format!("; --apply sets it for {target}")
                }
            ),
            None => println!(
                "\nno threshold keeps the traps served within {:.1}%: nothing to apply (raise --max-wrong, or look at the traps the guards miss)",
                args.max_wrong * 100.0
            ),
        }
    }
    match (best, finish(&args.eval, &summary, &evaluation, "calibrate")) {
        (Some(_), code) => code,
        (None, _) => ExitCode::FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_names_the_namespace_or_the_global_threshold() {
        let ns = serde_json::to_value(patch_for(Some("support"), 0.934_449_9)).expect("json");
        assert_eq!(
            ns,
            serde_json::json!({"namespace_thresholds": {"support": 0.9344_f32}})
        );
        let global = serde_json::to_value(patch_for(None, 0.95)).expect("json");
        assert_eq!(
            global,
            serde_json::json!({"similarity_threshold": 0.95_f32})
        );
    }
}
