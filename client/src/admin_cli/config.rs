//! `config` (show, set): its arguments, the `key=value` assignments that build a patch (with
//! durations like `7d`), and the table of live settings.

use std::collections::BTreeMap;

use clap::{Args, Subcommand};

use super::format::{fmt_age, key_values, push_table};
use super::{CliError, GatewayArgs};
use crate::admin::{ConfigPatch, LiveConfig};

#[derive(Debug, Args)]
pub struct ConfigArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[command(subcommand)]
    pub command: Option<ConfigCommand>,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Show the live configuration (the default).
    Get,
    /// Change settings: similarity_threshold=0.92 default_ttl_s=1d replay=recorded
    /// cache_mode=read-only semantic_guards=numbers,negation,direction,antonym|none
    /// namespace_thresholds.support=0.95 namespace_modes.support=shadow (=null removes one).
    Set {
        /// One or more settings, each `key=value`, applied together as one patch.
        #[arg(required = true, value_name = "KEY=VALUE")]
        assignments: Vec<String>,
    },
}

/// Whole seconds from `3600`, `3600s`, `30m`, `1h`, `2d`, `1h 30m`.
pub fn parse_seconds(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(seconds);
    }
    let duration = humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 1h, 30m, 3600s or 3600 ({e})"))?;
    if duration.subsec_nanos() != 0 {
        return Err(format!("{text:?} is not a whole number of seconds"));
    }
    Ok(duration.as_secs())
}

/// Builds a config PATCH from `key=value` arguments.
pub fn parse_config_patch(assignments: &[String]) -> Result<ConfigPatch, CliError> {
    const KEYS: &str = "similarity_threshold, default_ttl_s, replay, cache_mode, \
                        semantic_guards, namespace_thresholds.NAME, namespace_modes.NAME";
    let mut patch = ConfigPatch::default();
    for assignment in assignments {
        let Some((key, value)) = assignment.split_once('=') else {
            return Err(CliError::Usage(format!(
                "{assignment:?} is not KEY=VALUE (keys: {KEYS})"
            )));
        };
        let (key, value) = (key.trim(), value.trim());
        let threshold = |value: &str| {
            value
                .parse::<f32>()
                .map_err(|_| CliError::Usage(format!("{key}: {value:?} is not a number like 0.92")))
        };
        match key {
            "similarity_threshold" => patch.similarity_threshold = Some(threshold(value)?),
            "default_ttl_s" => {
                patch.default_ttl_s =
                    Some(parse_seconds(value).map_err(|e| CliError::Usage(format!("{key}: {e}")))?)
            }
            "replay" => patch.replay = Some(value.to_owned()),
            "cache_mode" => patch.cache_mode = Some(value.to_owned()),
            "semantic_guards" => patch.semantic_guards = Some(value.to_owned()),
            _ if key.starts_with("namespace_modes.") && key.len() > "namespace_modes.".len() => {
                let namespace = &key["namespace_modes.".len()..];
                let mode = match value {
                    "null" | "none" | "" => None,
                    value => Some(value.to_owned()),
                };
                patch
                    .namespace_modes
                    .get_or_insert_with(BTreeMap::new)
                    .insert(namespace.to_owned(), mode);
            }
            _ => match key.strip_prefix("namespace_thresholds.") {
                Some(namespace) if !namespace.is_empty() => {
                    // `null` (or `none`, or nothing) removes the namespace's own threshold.
                    let threshold = match value {
                        "null" | "none" | "" => None,
                        value => Some(threshold(value)?),
                    };
                    patch
                        .namespace_thresholds
                        .get_or_insert_with(BTreeMap::new)
                        .insert(namespace.to_owned(), threshold);
                }
                _ => {
                    return Err(CliError::Usage(format!(
                        "unknown config key {key:?} (keys: {KEYS})"
                    )))
                }
            },
        }
    }
    Ok(patch)
}

/// `config` and `config set`.
pub fn render_config(config: &LiveConfig) -> String {
    let mut rows = vec![
        (
            "similarity_threshold",
            format!("{}", config.similarity_threshold),
        ),
        (
            "default_ttl_s",
            match config.default_ttl_s {
                Some(ttl) => format!("{ttl} ({})", fmt_age(ttl as f64)),
                None => "none (entries do not expire)".to_owned(),
            },
        ),
        ("replay", config.replay.clone()),
        ("cache_mode", config.cache_mode.clone()),
        ("semantic_guards", config.semantic_guards.clone()),
    ];
    let namespaces: Vec<String> = config
        .namespace_thresholds
        .iter()
        .map(|(namespace, threshold)| format!("{namespace}={threshold}"))
        .collect();
    rows.push((
        "namespace_thresholds",
        if namespaces.is_empty() {
            "none".to_owned()
        } else {
            namespaces.join(", ")
        },
    ));
    let modes: Vec<String> = config
        .namespace_modes
        .iter()
        .map(|(namespace, mode)| format!("{namespace}={mode}"))
        .collect();
    rows.push((
        "namespace_modes",
        if modes.is_empty() {
            "none".to_owned()
        } else {
            modes.join(", ")
        },
    ));
    let mut out = String::new();
    push_table(&mut out, &key_values(rows));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin_cli::tests::fixture;

    #[test]
    fn seconds_accept_units_and_plain_numbers() {
        assert_eq!(parse_seconds("3600"), Ok(3600));
        assert_eq!(parse_seconds("3600s"), Ok(3600));
        assert_eq!(parse_seconds("30m"), Ok(1800));
        assert_eq!(parse_seconds("1h"), Ok(3600));
        assert_eq!(parse_seconds("1h 30m"), Ok(5400));
        assert_eq!(parse_seconds("2d"), Ok(172_800));
        assert_eq!(parse_seconds(" 7 "), Ok(7));
        assert!(parse_seconds("soon").is_err());
        assert!(parse_seconds("-5").is_err());
        assert!(parse_seconds("1500ms")
            .expect_err("subsecond")
            .contains("whole number of seconds"));
    }

    #[test]
    fn config_assignments_build_a_patch() {
        let args: Vec<String> = [
            "similarity_threshold=0.92",
            "default_ttl_s=1d",
            "replay=tokens-per-second=40",
            "cache_mode=read-only",
            "semantic_guards=none",
            "namespace_thresholds.support=0.95",
            "namespace_thresholds.legal=null",
            "namespace_modes.support=shadow",
            "namespace_modes.legal=null",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let patch = parse_config_patch(&args).expect("patch");
        assert_eq!(
            serde_json::to_value(&patch).expect("json"),
            serde_json::json!({
                "similarity_threshold": 0.92_f32,
                "default_ttl_s": 86400,
                "replay": "tokens-per-second=40",
                "cache_mode": "read-only",
                "semantic_guards": "none",
                "namespace_thresholds": {"support": 0.95_f32, "legal": null},
                "namespace_modes": {"support": "shadow", "legal": null}
            })
        );
        for bad in [
            "threshold=0.9",
            "similarity_threshold",
            "similarity_threshold=high",
            "namespace_thresholds.=0.9",
        ] {
            let err = parse_config_patch(&[bad.to_owned()]).expect_err(bad);
            assert_eq!(err.exit_code(), 2, "{bad}: {err}");
        }
    }

    #[test]
    fn config_renders_every_setting() {
        let config: LiveConfig = fixture(include_str!("../../tests/fixtures/config.json"));
        let text = render_config(&config);
        for expected in [
            "similarity_threshold",
            "0.9",
            "604800 (7days)",
            "instant",
            "cache_mode",
            "support=0.95",
            "numbers,negation",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }
}
