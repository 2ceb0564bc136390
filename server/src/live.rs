//! The settings an operator may change while the gateway serves (`GET|PATCH /admin/config`):
//! similarity floors, literal guards, default TTL, replay pacing and cache mode.
//!
//! [`LiveSettings`] is their one definition: the config file and flags fill it at start-up (it is
//! flattened into [`Config`](crate::config::Config), so the file keeps flat keys), requests read
//! it, and the admin routes show and patch it. Each value is parsed into its type where it enters,
//! so nothing downstream parses it again. A change is validated with the same rules as start-up
//! configuration, applied as one swap (a request sees the old or the new settings, never a mix),
//! and logged. It lasts until restart: the configuration file is the operator's, and the gateway
//! never rewrites it.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use crate::error::ConfigError;
use crate::error::GatewayError;
use crate::guard::Guards;
use crate::policy::{CacheMode, Defaults, Pacing, MAX_TTL_S};
use crate::verify::settings::{
    self as verify, NamespaceVerify, VerifyKind, VerifyMode, VerifyPlan,
};

/// The settings that can change while the gateway serves, as the config file, the flags and
/// `/admin/config` spell them.
// The typed fields travel as strings (their `Display`/`FromStr` forms), and the schema says so.
// No `deny_unknown_fields`: it is read from the whole config file, whose other keys are start-up
// settings (the `Config` around it refuses keys that neither knows).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
#[serde(default)]
pub struct LiveSettings {
    /// Global similarity floor for semantic hits.
    // Given here, or the schema would show the f32 widened: 0.8999999761581421.
    #[schema(required = true, default = 0.9)]
    pub similarity_threshold: f32,
    /// Floors of namespaces that differ from the global one.
    // In the file: `[namespace_thresholds]` then `support = 0.95`.
    #[schema(required = true)]
    pub namespace_thresholds: BTreeMap<String, f32>,
    /// Default cache modes of namespaces that differ from `cache_mode` (e.g. `shadow`).
    // In the file: `[namespace_modes]` then `support = "shadow"`; a request of that namespace
    // without `x-reprise-cache-mode` runs in that mode.
    #[schema(required = true, value_type = BTreeMap<String, String>)]
    pub namespace_modes: BTreeMap<String, CacheMode>,
    /// Guards a semantic match must pass: a comma-separated list of numbers, negation, format,
    /// task, direction, antonym, entity, template, or `none`.
    #[schema(required = true, value_type = String)]
    pub semantic_guards: Guards,
    /// TTL of new entries when the request does not set one.
    #[schema(required = true)]
    pub default_ttl_s: u64,
    /// Default replay pacing: `instant`, `recorded` or `tokens-per-second=N`.
    #[schema(required = true, value_type = String)]
    pub replay: Pacing,
    /// `on`, `off`, `read-only`, `write-only`, `exact-only` or `shadow`.
    #[schema(required = true, value_type = String)]
    pub cache_mode: CacheMode,
    /// `off` or `judge`: ask a judge (an OpenAI-compatible model) whether a near match's answer
    /// fully answers the new prompt before it is served.
    #[schema(required = true, value_type = String)]
    pub verify: VerifyKind,
    /// `sync` (judge before answering) or `async` (answer from upstream, judge in the background).
    #[schema(required = true, value_type = String)]
    pub verify_mode: VerifyMode,
    /// The lowest similarity worth a judge call.
    #[schema(required = true, default = 0.75)]
    pub verify_floor: f32,
    /// The error budget: the largest share of wrong answers among candidates served without a
    /// judge call (default 0.01). `"none"`: candidates at or above the threshold are served
    /// unjudged, those between the floor and the threshold judged.
    #[serde(deserialize_with = "verify::budget")]
    #[schema(value_type = Option<f64>)]
    pub max_wrong: Option<f64>,
    /// The model judge calls ask (required with `verify = "judge"`).
    pub judge_model: Option<String>,
    /// The judge's base URL including `/v1`; unset: the upstream.
    pub judge_url: Option<String>,
    /// Longest wait for a verdict, in ms; then it is `unsure` (never served).
    #[schema(required = true)]
    pub judge_timeout_ms: u64,
    /// Verify settings of namespaces that differ from the global ones.
    // In the file: `[namespace_verify.support]` then `verify = "judge"`, `max_wrong = 0.01`.
    #[schema(required = true)]
    pub namespace_verify: BTreeMap<String, NamespaceVerify>,
}

impl Default for LiveSettings {
    fn default() -> Self {
        Self {
            similarity_threshold: 0.9,
            namespace_thresholds: BTreeMap::new(),
            namespace_modes: BTreeMap::new(),
            semantic_guards: Guards::ALL,
            default_ttl_s: 7 * 24 * 3600,
            replay: Pacing::Instant,
            cache_mode: CacheMode::On,
            verify: VerifyKind::Off,
            verify_mode: VerifyMode::Sync,
            // A judge call is worth making while it is more likely to serve than to refuse: on the
            // dev set, candidates that pass the guards are two paraphrases to one trap from 0.75 to
            // 0.80, and about one to one below 0.75 (benches/results/eval-2026-12-04.md).
            verify_floor: 0.75,
            max_wrong: Some(verify::DEFAULT_MAX_WRONG),
            judge_model: None,
            judge_url: None,
            judge_timeout_ms: 2_000,
            namespace_verify: BTreeMap::new(),
        }
    }
}

impl LiveSettings {
    /// The numeric bounds a type cannot carry; the rest was checked when the values were parsed.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_namespaces("namespace_thresholds", self.namespace_thresholds.keys())?;
        check_namespaces("namespace_modes", self.namespace_modes.keys())?;
        check_namespaces("namespace_verify", self.namespace_verify.keys())?;
        verify::check("verify", &self.verify_for(None))?;
        for namespace in self.namespace_verify.keys() {
            verify::check("namespace_verify", &self.verify_for(Some(namespace)))?;
        }
        if !(1..=MAX_TTL_S).contains(&self.default_ttl_s) {
            return Err(ConfigError::Invalid {
                field: "default_ttl_s",
                reason: format!(
                    "{} is not from 1 to {MAX_TTL_S} (ten years)",
                    self.default_ttl_s
                ),
            });
        }
        let thresholds = std::iter::once(("similarity_threshold", self.similarity_threshold))
            .chain(
                self.namespace_thresholds
                    .values()
                    .map(|t| ("namespace_thresholds", *t)),
            );
        for (field, t) in thresholds {
            if !(0.0..=1.0).contains(&t) {
                return Err(ConfigError::Invalid {
                    field,
                    reason: format!("{t} is not a similarity between 0 and 1"),
                });
            }
        }
        Ok(())
    }

    /// The similarity floor for a namespace: its own when configured, else the global one.
    pub fn threshold_floor(&self, namespace: Option<&str>) -> f32 {
        namespace
            .and_then(|n| self.namespace_thresholds.get(n).copied())
            .unwrap_or(self.similarity_threshold)
    }

    /// The verify settings for a namespace: its own where configured, else the global ones.
    pub fn verify_for(&self, namespace: Option<&str>) -> VerifyPlan {
        let own = namespace.and_then(|n| self.namespace_verify.get(n));
        let pick = |f: fn(&NamespaceVerify) -> Option<String>, global: &Option<String>| {
            own.and_then(f).or_else(|| global.clone())
        };
        VerifyPlan {
            kind: own.and_then(|o| o.verify).unwrap_or(self.verify),
            mode: own.and_then(|o| o.verify_mode).unwrap_or(self.verify_mode),
            floor: own
                .and_then(|o| o.verify_floor)
                .unwrap_or(self.verify_floor),
            max_wrong: own.and_then(|o| o.max_wrong).unwrap_or(self.max_wrong),
            model: pick(|o| o.judge_model.clone(), &self.judge_model),
            url: pick(|o| o.judge_url.clone(), &self.judge_url),
            timeout: std::time::Duration::from_millis(
                own.and_then(|o| o.judge_timeout_ms)
                    .unwrap_or(self.judge_timeout_ms),
            ),
        }
    }

    /// The defaults a request's headers apply to: its namespace's mode when one is configured
    /// (the namespace header is read as sent; the policy validates it).
    pub fn defaults_for(&self, headers: &axum::http::HeaderMap) -> Defaults {
        let namespace_mode = headers
            .get("x-reprise-namespace")
            .and_then(|v| v.to_str().ok())
            .and_then(|n| self.namespace_modes.get(n.trim()));
        Defaults {
            mode: namespace_mode.copied().unwrap_or(self.cache_mode),
            ttl_s: self.default_ttl_s,
            pacing: self.replay,
        }
    }
}

/// Refuses a namespace name no request can carry (the request's rule, [`crate::policy::namespace`]):
/// a setting under it would never apply.
fn check_namespaces<'a>(
    field: &'static str,
    mut names: impl Iterator<Item = &'a String>,
) -> Result<(), ConfigError> {
    match names.find(|n| !crate::policy::is_namespace(n)) {
        None => Ok(()),
        Some(name) => Err(ConfigError::Invalid {
            field,
            reason: format!(
                "namespace {name:?} is not a namespace name ({})",
                crate::policy::NAMESPACE_RULE
            ),
        }),
    }
}

/// A change to the live settings: absent fields stay as they are.
// Values are parsed as the body is read, so a bad one is a 400 naming its field before anything
// is applied; the numeric bounds are checked by `LiveSettings::validate`.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigPatch {
    pub similarity_threshold: Option<f32>,
    /// Merged into the current map; a `null` value removes that namespace's floor.
    pub namespace_thresholds: Option<BTreeMap<String, Option<f32>>>,
    /// Merged into the current map; a `null` value removes that namespace's mode.
    #[serde(default, deserialize_with = "namespace_modes")]
    #[schema(value_type = Option<BTreeMap<String, Option<String>>>)]
    pub namespace_modes: Option<BTreeMap<String, Option<CacheMode>>>,
    #[schema(value_type = Option<String>)]
    pub semantic_guards: Option<Guards>,
    pub default_ttl_s: Option<u64>,
    #[schema(value_type = Option<String>)]
    pub replay: Option<Pacing>,
    #[schema(value_type = Option<String>)]
    pub cache_mode: Option<CacheMode>,
    #[schema(value_type = Option<String>)]
    pub verify: Option<VerifyKind>,
    #[schema(value_type = Option<String>)]
    pub verify_mode: Option<VerifyMode>,
    pub verify_floor: Option<f32>,
    /// `null` or `"none"`: no budget (the threshold decides).
    #[serde(default, deserialize_with = "verify::present_budget")]
    #[schema(value_type = Option<f64>)]
    pub max_wrong: Option<Option<f64>>,
    /// A `null` value removes the model.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub judge_model: Option<Option<String>>,
    /// A `null` value sends judge calls to the upstream again.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub judge_url: Option<Option<String>>,
    pub judge_timeout_ms: Option<u64>,
    /// Merged into the current map: a value replaces that namespace's verify settings whole, a
    /// `null` removes them.
    #[schema(value_type = Option<BTreeMap<String, NamespaceVerify>>)]
    pub namespace_verify: Option<BTreeMap<String, Option<NamespaceVerify>>>,
}

/// A field that is present, `null` included: `Some(None)` clears the setting, absence keeps it.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(deserializer).map(Some)
}

/// Reads `namespace_modes` whole before parsing its modes, so that a bad mode is reported against
/// `namespace_modes` (as the thresholds are), naming the namespace in the message.
fn namespace_modes<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<BTreeMap<String, Option<CacheMode>>>, D::Error> {
    let Some(raw) = Option::<BTreeMap<String, Option<String>>>::deserialize(deserializer)? else {
        return Ok(None);
    };
    raw.into_iter()
        .map(|(namespace, mode)| {
            let mode = mode
                .map(|m| m.parse::<CacheMode>())
                .transpose()
                .map_err(|why| {
                    serde::de::Error::custom(format!("namespace `{namespace}`: {why}"))
                })?;
            Ok((namespace, mode))
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

impl ConfigPatch {
    /// `settings` with this patch applied, or the first rule it breaks.
    fn applied_to(self, settings: &LiveSettings) -> Result<LiveSettings, ConfigError> {
        let mut next = settings.clone();
        // Destructured so that a new live setting cannot be forgotten here.
        let ConfigPatch {
            similarity_threshold,
            namespace_thresholds,
            namespace_modes,
            semantic_guards,
            default_ttl_s,
            replay,
            cache_mode,
            verify,
            verify_mode,
            verify_floor,
            max_wrong,
            judge_model,
            judge_url,
            judge_timeout_ms,
            namespace_verify,
        } = self;
        // Removals too: naming a namespace no request can carry is a mistake either way.
        if let Some(map) = &namespace_thresholds {
            check_namespaces("namespace_thresholds", map.keys())?;
        }
        if let Some(map) = &namespace_modes {
            check_namespaces("namespace_modes", map.keys())?;
        }
        if let Some(map) = &namespace_verify {
            check_namespaces("namespace_verify", map.keys())?;
        }
        set(&mut next.similarity_threshold, similarity_threshold);
        merge(&mut next.namespace_thresholds, namespace_thresholds);
        merge(&mut next.namespace_modes, namespace_modes);
        set(&mut next.semantic_guards, semantic_guards);
        set(&mut next.default_ttl_s, default_ttl_s);
        set(&mut next.replay, replay);
        set(&mut next.cache_mode, cache_mode);
        set(&mut next.verify, verify);
        set(&mut next.verify_mode, verify_mode);
        set(&mut next.verify_floor, verify_floor);
        set(&mut next.max_wrong, max_wrong);
        set(&mut next.judge_model, judge_model);
        set(&mut next.judge_url, judge_url);
        set(&mut next.judge_timeout_ms, judge_timeout_ms);
        merge(&mut next.namespace_verify, namespace_verify);
        next.validate()?;
        Ok(next)
    }
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *slot = value;
    }
}

/// Merges a patch of a per-namespace map: a value sets that namespace's, `None` removes it.
fn merge<T>(map: &mut BTreeMap<String, T>, patch: Option<BTreeMap<String, Option<T>>>) {
    for (namespace, value) in patch.unwrap_or_default() {
        match value {
            Some(v) => map.insert(namespace, v),
            None => map.remove(&namespace),
        };
    }
}

/// The current live settings, swapped whole on a change.
pub struct CurrentSettings {
    current: RwLock<Arc<LiveSettings>>,
}

impl CurrentSettings {
    pub fn new(settings: LiveSettings) -> Self {
        settings.semantic_guards.preload();
        Self {
            current: RwLock::new(Arc::new(settings)),
        }
    }

    pub fn current(&self) -> Arc<LiveSettings> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Puts `settings` in place whole (a replica reapplying the shared patches over its start-up
    /// settings).
    pub fn replace(&self, settings: LiveSettings) {
        settings.semantic_guards.preload();
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(settings);
    }

    /// Applies `patch` if the result is valid; returns the new settings. Nothing changes on error.
    pub fn apply(&self, patch: ConfigPatch) -> Result<Arc<LiveSettings>, GatewayError> {
        // Before the lock: requests keep reading the current settings while the guards load.
        if let Some(guards) = &patch.semantic_guards {
            guards.preload();
        }
        // The write lock is held from read to swap, so two patches cannot lose each other's changes.
        let mut slot = self.current.write().unwrap_or_else(|e| e.into_inner());
        let next = patch.applied_to(&slot).map_err(|err| match err {
            ConfigError::Invalid { field, reason } => {
                GatewayError::invalid(format!("Invalid `{field}`: {reason}."), Some(field))
            }
            other => GatewayError::invalid(other.to_string(), None),
        })?;
        tracing::info!(
            before = %serde_json::to_string(&**slot).unwrap_or_default(),
            after = %serde_json::to_string(&next).unwrap_or_default(),
            "live configuration changed"
        );
        let next = Arc::new(next);
        *slot = next.clone();
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patch(json: serde_json::Value) -> ConfigPatch {
        serde_json::from_value(json).expect("patch")
    }

    #[test]
    fn a_valid_patch_changes_only_what_it_names() {
        let live = CurrentSettings::new(LiveSettings::default());
        let now = live
            .apply(patch(serde_json::json!({
                "similarity_threshold": 0.95,
                "namespace_thresholds": {"support": 0.97},
                "namespace_modes": {"legal": "Shadow"},
                "replay": "tokens-per-second=50",
                "semantic_guards": "negation"
            })))
            .expect("valid");
        assert_eq!(now.semantic_guards, "negation".parse().expect("valid"));
        assert_eq!(now.threshold_floor(None), 0.95);
        assert_eq!(now.threshold_floor(Some("support")), 0.97);
        assert_eq!(now.replay, Pacing::TokensPerSecond(50.0));
        assert_eq!(now.namespace_modes["legal"], CacheMode::Shadow);
        assert_eq!(now.default_ttl_s, LiveSettings::default().default_ttl_s);
        // Shown in the canonical spelling of each value.
        let view = serde_json::to_value(&*now).expect("json");
        assert_eq!(view["semantic_guards"], "negation");
        assert_eq!(view["replay"], "tokens-per-second=50");
        assert_eq!(view["namespace_modes"]["legal"], "shadow");
        let removed = live
            .apply(patch(serde_json::json!({
                "namespace_thresholds": {"support": null},
                "namespace_modes": {"legal": null}
            })))
            .expect("valid");
        assert_eq!(removed.threshold_floor(Some("support")), 0.95);
        assert!(removed.namespace_modes.is_empty());
    }

    /// The typed fields are strings in the admin API's OpenAPI document, as on the wire.
    #[test]
    fn the_openapi_schema_shows_the_typed_fields_as_strings() {
        use utoipa::OpenApi;
        let doc = serde_json::to_value(crate::admin::ApiDoc::openapi()).expect("json");
        let schemas = &doc["components"]["schemas"];
        let settings = &schemas["LiveSettings"]["properties"];
        let patch = &schemas["ConfigPatch"]["properties"];
        for field in [
            "cache_mode",
            "replay",
            "semantic_guards",
            "verify",
            "verify_mode",
        ] {
            assert_eq!(settings[field]["type"], "string", "{field}: {settings}");
            assert_eq!(
                patch[field]["type"],
                serde_json::json!(["string", "null"]),
                "{field}: {patch}"
            );
        }
        let modes = &settings["namespace_modes"]["additionalProperties"];
        assert_eq!(modes["type"], "string", "{settings}");
        let modes = &patch["namespace_modes"]["additionalProperties"];
        assert_eq!(
            modes["type"],
            serde_json::json!(["string", "null"]),
            "{patch}"
        );
        // Every field is always present in a response, but the unset optional ones.
        assert_eq!(
            schemas["LiveSettings"]["required"].as_array().map(Vec::len),
            Some(12)
        );
    }

    #[test]
    fn verify_settings_patch_per_namespace_and_refuse_what_cannot_run() {
        let live = CurrentSettings::new(LiveSettings::default());
        let now = live
            .apply(patch(serde_json::json!({
                "judge_model": "gpt-4.1-mini",
                "namespace_verify": {"support": {"verify": "judge", "max_wrong": 0.01, "verify_mode": "async"}}
            })))
            .expect("valid");
        assert!(!now.verify_for(None).judges());
        let support = now.verify_for(Some("support"));
        assert!(support.judges());
        assert_eq!(support.mode, VerifyMode::Async);
        assert_eq!(support.max_wrong, Some(0.01));
        assert_eq!(support.model.as_deref(), Some("gpt-4.1-mini"));
        assert_eq!(support.floor, 0.75);
        // `null` clears a setting; a namespace that judges needs a model.
        let err = live
            .apply(patch(serde_json::json!({"judge_model": null})))
            .expect_err("support judges without a model");
        assert_eq!(err.body()["error"]["param"], "namespace_verify");
        for (body, field) in [
            (
                serde_json::json!({"verify": "judge", "judge_model": null}),
                "verify",
            ),
            (serde_json::json!({"verify_floor": 1.5}), "verify"),
            (serde_json::json!({"max_wrong": -0.1}), "verify"),
            (serde_json::json!({"judge_timeout_ms": 0}), "verify"),
            (serde_json::json!({"judge_url": "ftp://judge"}), "verify"),
            (
                serde_json::json!({"namespace_verify": {"Bad Name": {"verify": "off"}}}),
                "namespace_verify",
            ),
        ] {
            let err = live.apply(patch(body.clone())).expect_err("invalid");
            assert_eq!(err.body()["error"]["param"], field, "{body}");
        }
        let cleared = live
            .apply(patch(
                serde_json::json!({"namespace_verify": {"support": null}, "judge_model": null}),
            ))
            .expect("valid");
        assert!(cleared.namespace_verify.is_empty());
        assert_eq!(cleared.judge_model, None);
        // The budget: a share, or none (`null` or `"none"`), globally or for one namespace.
        assert_eq!(LiveSettings::default().max_wrong, Some(0.01));
        for none in [serde_json::json!(null), serde_json::json!("none")] {
            let now = live
                .apply(patch(serde_json::json!({
                    "max_wrong": none,
                    "namespace_verify": {"legal": {"max_wrong": 0.005}, "chat": {"max_wrong": "none"}}
                })))
                .expect("valid");
            assert_eq!(now.verify_for(None).max_wrong, None);
            assert_eq!(now.verify_for(Some("legal")).max_wrong, Some(0.005));
            assert_eq!(now.verify_for(Some("chat")).max_wrong, None);
        }
        let err = crate::admin::json::parse_json::<ConfigPatch>(br#"{"max_wrong": "some"}"#)
            .expect_err("not a budget");
        assert_eq!(err.body()["error"]["param"], "max_wrong");
        let err = crate::admin::json::parse_json::<ConfigPatch>(br#"{"verify": "maybe"}"#)
            .expect_err("not a kind");
        assert_eq!(err.body()["error"]["param"], "verify");
    }

    #[test]
    fn a_namespace_mode_applies_to_that_namespace_only() {
        let settings = LiveSettings {
            namespace_modes: BTreeMap::from([("support".to_owned(), CacheMode::Shadow)]),
            replay: Pacing::Recorded,
            ..LiveSettings::default()
        };
        let mut headers = axum::http::HeaderMap::new();
        assert_eq!(settings.defaults_for(&headers).mode, CacheMode::On);
        headers.insert("x-reprise-namespace", " support ".parse().expect("value"));
        let defaults = settings.defaults_for(&headers);
        assert_eq!(defaults.mode, CacheMode::Shadow);
        assert_eq!(defaults.pacing, Pacing::Recorded);
    }

    #[test]
    fn an_invalid_patch_names_the_field_and_changes_nothing() {
        let live = CurrentSettings::new(LiveSettings::default());
        // Out of range: refused when applied.
        for (body, field) in [
            (
                serde_json::json!({"similarity_threshold": 1.5}),
                "similarity_threshold",
            ),
            (serde_json::json!({"default_ttl_s": 0}), "default_ttl_s"),
            (
                serde_json::json!({"namespace_thresholds": {"a": 2.0}}),
                "namespace_thresholds",
            ),
        ] {
            let err = live.apply(patch(body)).expect_err("invalid");
            assert_eq!(err.body()["error"]["param"], field);
        }
        assert_eq!(*live.current(), LiveSettings::default());
        // Not a value of its type: refused as the body is read, naming the field.
        for (body, field, says) in [
            (
                r#"{"replay": "fast", "similarity_threshold": 0.5}"#,
                "replay",
                "`fast` is not instant, recorded or tokens-per-second=N",
            ),
            (
                r#"{"cache_mode": "sometimes"}"#,
                "cache_mode",
                "`sometimes` is not one of on, off",
            ),
            (
                r#"{"semantic_guards": "numbers,vibes"}"#,
                "semantic_guards",
                "`numbers,vibes` is not a comma-separated list of numbers",
            ),
            (
                r#"{"namespace_modes": {"support": "sometimes"}}"#,
                "namespace_modes",
                "namespace `support`: `sometimes` is not one of",
            ),
            (r#"{"listen": "x"}"#, "listen", "unknown field"),
        ] {
            let err =
                crate::admin::json::parse_json::<ConfigPatch>(body.as_bytes()).expect_err(field);
            let body = err.body();
            assert_eq!(body["error"]["param"], field, "{body}");
            assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
            let message = body["error"]["message"].as_str().unwrap_or_default();
            assert!(message.contains(says), "{message}");
        }
    }
}
