//! The configuration written out as a commented TOML file: every key, what it does and its value.
//! `reprise config example` prints it with the defaults, `reprise check-config` with the effective
//! values, so that either output is a file `--config` reads back. It only writes; reading stays
//! in [`Config::from_file`].
//!
//! A key's comment is its flag's help (one text for `--help` and the file), or, for the keys only
//! the file sets, [`FILE_ONLY`]; the tests check that every key of [`Config`] has one of the two.
//! Secrets are never written: a secret that is set shows as a comment saying so.

use clap::CommandFactory;
use serde_json::Value;

use super::{Cli, Config};

/// How a [`super::Secret`] serializes: whatever it holds, only this.
pub(crate) const REDACTED: &str = "*****";

/// Keys that have no flag, with what they do (flags carry their own help).
pub(crate) const FILE_ONLY: &[(&str, &str)] = &[
    (
        "sweep_interval_ms",
        "How often expiry and the size caps are enforced, in ms [default: 1000].",
    ),
    (
        "embed_max_batch",
        "Most texts embedded together in one model call [default: 16].",
    ),
    (
        "embed_max_wait_ms",
        "Longest wait for a batch of texts to fill before the model runs, in ms [default: 2].",
    ),
    (
        "index_save_interval_s",
        "How often the vector index is saved to the data dir, in seconds [default: 300].",
    ),
    (
        "judge_queue",
        "Most pairs waiting for a background verdict; more are dropped [default: 1024].",
    ),
    (
        "namespace_thresholds",
        "Similarity thresholds of namespaces that differ from similarity_threshold: one \
         `name = 0.95` line per namespace under this table.",
    ),
    (
        "namespace_modes",
        "Default cache modes of namespaces that differ from cache_mode: one `name = \"shadow\"` \
         line per namespace under this table.",
    ),
    (
        "namespace_verify",
        "Verify settings of namespaces that differ from the global ones: a table \
         [namespace_verify.NAME] with any of verify, verify_mode, verify_floor, max_wrong, \
         judge_model, judge_url, judge_timeout_ms.",
    ),
    (
        "namespace_prices",
        "Prices of a namespace's requests, in US dollars per million tokens, over the price table \
         (the defaults and --prices): a table [namespace_prices.NAME] with one \
         `\"model\" = { input = 2.0, output = 8.0 }` line per model.",
    ),
];

/// Written under a commented-out table when the table is empty, to show its shape.
const TABLE_EXAMPLES: &[(&str, &str)] = &[
    ("namespace_thresholds", "support = 0.95"),
    ("namespace_modes", "support = \"shadow\""),
    (
        "namespace_verify",
        "[namespace_verify.support]\nverify = \"judge\"\nverify_floor = 0.85",
    ),
    (
        "namespace_prices",
        "[namespace_prices.support]\n\"gpt-4o\" = { input = 2.0, output = 8.0 }",
    ),
];

/// Fields that are `f32`: serialized through `f64` they would read 0.8999999761581421 for 0.9.
const F32_KEYS: &[&str] = &["similarity_threshold", "verify_floor"];

const WIDTH: usize = 100;

/// `reprise config example`: every key with its default.
pub fn example() -> String {
    let mut out = String::from(
        "# reprise.toml: every key of Reprise's configuration file with its default, as printed by\n\
         # `reprise config example`. Read with `reprise serve --config reprise.toml` (or REPRISE_CONFIG);\n\
         # REPRISE_* variables and flags override it, and a key left out keeps its default.\n",
    );
    write(&Config::default(), &mut out);
    out
}

/// `reprise check-config`: the configuration the gateway would run with, secrets left out.
pub fn effective(config: &Config) -> String {
    let mut out = String::from(
        "# The effective configuration: defaults, then the --config file, then REPRISE_* variables\n\
         # and flags (printed by `reprise check-config`; it reads back with --config). Secrets are\n\
         # not printed: one that is set shows as a comment.\n",
    );
    write(config, &mut out);
    out
}

/// A key as the file spells it, with its help, in the order `reprise serve --help` lists the flags,
/// then the keys only the file sets, then the tables (TOML wants them last).
pub(crate) struct Key {
    name: String,
    help: String,
    /// `--flag, REPRISE_FLAG`; `None` for a key only the file sets.
    flag: Option<String>,
}

/// Every key, in the order it is written.
pub(crate) fn keys() -> Vec<Key> {
    let command = Cli::command();
    let serve = command
        .find_subcommand("serve")
        .expect("`reprise serve` is defined in this module's parent");
    let mut keys: Vec<Key> = serve
        .get_arguments()
        .filter_map(|arg| {
            let long = arg.get_long()?;
            // `--config` names the file; it is no key in it.
            if long == "config" || long == "help" {
                return None;
            }
            let help = arg.get_long_help().or(arg.get_help())?.to_string();
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            Some(Key {
                name: long.replace('-', "_"),
                help,
                flag: Some(match env {
                    Some(env) => format!("--{long}, {env}"),
                    None => format!("--{long}"),
                }),
            })
        })
        .collect();
    keys.extend(FILE_ONLY.iter().map(|(name, help)| Key {
        name: (*name).to_owned(),
        help: (*help).to_owned(),
        flag: None,
    }));
    keys
}

fn write(config: &Config, out: &mut String) {
    let Value::Object(mut values) = serde_json::to_value(config).unwrap_or_default() else {
        return;
    };
    let (tables, scalars): (Vec<Key>, Vec<Key>) = keys()
        .into_iter()
        .partition(|k| values.get(&k.name).is_some_and(Value::is_object));
    let mut file_only_heading = false;
    for key in scalars.iter().chain(&tables) {
        let Some(mut value) = values.remove(&key.name) else {
            continue;
        };
        if key.flag.is_none() && !file_only_heading && !value.is_object() {
            out.push_str("\n# ---- Keys only this file sets (no flag or variable) ----\n");
            file_only_heading = true;
        }
        out.push('\n');
        comment(&key.help, out);
        if let Some(flag) = &key.flag {
            out.push_str(&format!("# {flag}\n"));
        }
        tidy(&key.name, &mut value);
        entry(&key.name, value, out);
    }
}

/// Writes `name = value` (or the `[name]` table), or a comment when there is nothing to write.
fn entry(name: &str, value: Value, out: &mut String) {
    match value {
        Value::Null if name == "max_wrong" => out.push_str("max_wrong = \"none\"\n"),
        Value::Null => out.push_str(&format!("# {name} = (unset)\n")),
        Value::String(s) if s == REDACTED => {
            out.push_str(&format!("# {name} = \"{REDACTED}\" (set; not printed)\n"));
        }
        Value::Object(map) if map.is_empty() => {
            let example = TABLE_EXAMPLES
                .iter()
                .find(|(k, _)| *k == name)
                .map_or("", |(_, e)| *e);
            // A table of tables opens with its own header.
            if !example.starts_with('[') {
                out.push_str(&format!("# [{name}]\n"));
            }
            for line in example.lines() {
                out.push_str(&format!("# {line}\n"));
            }
        }
        value => {
            let table = serde_json::Map::from_iter([(name.to_owned(), value)]);
            match toml::to_string(&table) {
                Ok(text) => out.push_str(&text),
                // A value TOML cannot hold (an integer above i64): said, not dropped silently.
                Err(err) => out.push_str(&format!("# {name}: not writable as TOML ({err})\n")),
            }
        }
    }
}

/// Puts a value in the form the file reads: `f32` fields at their own precision, and a budget of
/// `"none"` spelled so inside namespace tables too.
fn tidy(name: &str, value: &mut Value) {
    match value {
        Value::Number(n) if F32_KEYS.contains(&name) || name == "namespace_thresholds" => {
            if let Some(x) = n.as_f64() {
                // The shortest text that reads back to the same f32.
                let shortest: f64 = (x as f32).to_string().parse().unwrap_or(x);
                if let Some(number) = serde_json::Number::from_f64(shortest) {
                    *n = number;
                }
            }
        }
        Value::Object(map) => {
            let inner = if name == "namespace_thresholds" {
                name
            } else {
                ""
            };
            for (key, v) in map.iter_mut() {
                if v.is_null() && key == "max_wrong" {
                    *v = Value::String("none".to_owned());
                }
                tidy(if inner.is_empty() { key } else { inner }, v);
            }
            // Absent fields of a namespace's table mean "the global value": not written.
            map.retain(|_, v| !v.is_null());
        }
        _ => {}
    }
}

/// The help as `#` lines of at most [`WIDTH`] characters, broken between words.
fn comment(help: &str, out: &mut String) {
    for paragraph in help.lines() {
        let mut line = String::from("#");
        for word in paragraph.split_whitespace() {
            if line.len() + 1 + word.len() > WIDTH && line.len() > 1 {
                out.push_str(&line);
                out.push('\n');
                line = String::from("#");
            }
            line.push(' ');
            line.push_str(word);
        }
        if line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use clap::Parser;

    use super::*;
    use crate::config::{Command, Secret, ServeArgs};
    use crate::policy::CacheMode;
    use crate::verify::settings::NamespaceVerify;

    fn parse(text: &str) -> Config {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("reprise.toml");
        std::fs::write(&path, text).expect("write");
        Config::load(&ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        })
        .unwrap_or_else(|err| panic!("{err}\n{text}"))
    }

    /// Every key of the file, including those written as comments (unset or tables left empty).
    fn written_keys(text: &str) -> BTreeSet<String> {
        text.lines()
            .filter_map(|l| {
                let l = l.trim_start_matches("# ").trim_start_matches('[');
                let name = l.split([' ', ']', '.']).next()?;
                let is_key = (l.contains(" = ") || l.ends_with(']'))
                    && !name.is_empty()
                    && name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
                is_key.then(|| name.to_owned())
            })
            .collect()
    }

    #[test]
    fn the_example_parses_to_exactly_the_defaults() {
        let text = example();
        assert_eq!(parse(&text), Config::default());
        assert!(text.contains("\nsimilarity_threshold = 0.9\n"), "{text}");
        assert!(text.contains("\nlisten = \"127.0.0.1:8080\"\n"), "{text}");
        assert!(text.contains("\nmax_wrong = 0.01\n"), "{text}");
        assert!(
            text.lines().all(|l| l.chars().count() <= WIDTH + 40),
            "{text}"
        );
    }

    #[test]
    fn the_example_writes_every_key_with_its_help() {
        let text = example();
        let Value::Object(fields) = serde_json::to_value(Config::default()).expect("json") else {
            panic!("a config is an object");
        };
        let fields: BTreeSet<String> = fields.keys().cloned().collect();
        let keys = keys();
        let named: BTreeSet<String> = keys.iter().map(|k| k.name.clone()).collect();
        // A flag without a key, or a key with neither a flag nor an entry in FILE_ONLY.
        assert_eq!(named, fields, "flags and FILE_ONLY against Config's fields");
        assert!(keys.iter().all(|k| !k.help.trim().is_empty()));
        let mut written = written_keys(&text);
        written.retain(|k| fields.contains(k));
        assert_eq!(written, fields, "{text}");
        // Each key is preceded by its help: the line above a value is a comment.
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate().skip(1) {
            if line.contains(" = ") && !line.starts_with('#') && !lines[i - 1].starts_with('[') {
                assert!(lines[i - 1].starts_with('#'), "no help above `{line}`");
            }
        }
    }

    #[test]
    fn check_config_prints_a_file_that_reads_back_to_the_same_settings_without_secrets() {
        let mut config = Config {
            listen: "0.0.0.0:9000".parse().expect("addr"),
            max_connections: Some(64),
            semantic: false,
            admin_token: Some(Secret::new("admin-very-secret")),
            upstream_api_key: Some(Secret::new("sk-very-secret")),
            redis_url: Some(Secret::new("redis://:pw-very-secret@127.0.0.1:6379")),
            judge_rate: 2.5,
            ..Config::default()
        };
        config.live.similarity_threshold = 0.93;
        config.live.max_wrong = None;
        config
            .live
            .namespace_thresholds
            .insert("support".into(), 0.95);
        config
            .live
            .namespace_modes
            .insert("beta.team".into(), CacheMode::Shadow);
        config.live.namespace_verify.insert(
            "legal".into(),
            NamespaceVerify {
                verify_floor: Some(0.85),
                max_wrong: Some(None),
                ..NamespaceVerify::default()
            },
        );
        let text = effective(&config);
        assert!(!text.contains("very-secret"), "{text}");
        assert!(
            text.contains("# admin_token = \"*****\" (set; not printed)"),
            "{text}"
        );
        assert!(text.contains("\nsimilarity_threshold = 0.93\n"), "{text}");
        let back = parse(&text);
        // Everything but the secrets reads back as it was.
        let expected = Config {
            admin_token: None,
            upstream_api_key: None,
            redis_url: None,
            ..config
        };
        assert_eq!(back, expected);
    }

    #[test]
    fn the_cli_prints_the_example_and_check_config_the_same_form() {
        let cli = Cli::try_parse_from(["reprise", "config", "example"]).expect("parses");
        assert!(matches!(cli.command, Command::Config(_)));
        let defaults = Config::load(&ServeArgs::default()).expect("defaults are valid");
        // The same file but for its opening comment.
        let body = |text: &str| text.split_once("\n\n").map(|(_, b)| b.to_owned());
        assert_eq!(body(&effective(&defaults)), body(&example()));
    }
}
