//! The settings an operator may change while the gateway serves (`GET|PATCH /admin/config`):
//! similarity floors, literal guards, default TTL, replay pacing and cache mode.
//!
//! A change is validated with the same rules as start-up configuration, applied as one swap (a
//! request sees the old or the new settings, never a mix), and logged. It lasts until restart: the
//! configuration file is the operator's, and the gateway never rewrites it.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::config::{Config, ConfigError};
use crate::error::GatewayError;
use crate::guard::Guards;
use crate::policy::Defaults;

/// The live settings in their JSON shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema)]
pub struct LiveConfig {
    /// Global similarity floor for semantic hits.
    pub similarity_threshold: f32,
    /// Floors of namespaces that differ from the global one.
    pub namespace_thresholds: BTreeMap<String, f32>,
    /// Default cache modes of namespaces that differ from `cache_mode` (e.g. `shadow`).
    pub namespace_modes: BTreeMap<String, String>,
    /// Guards a semantic match must pass: a list of numbers, negation, direction, antonym, or `none`.
    pub semantic_guards: String,
    /// TTL of new entries when the request does not set one.
    pub default_ttl_s: u64,
    /// Default replay pacing: `instant`, `recorded` or `tokens-per-second=N`.
    pub replay: String,
    /// `on`, `off`, `read-only`, `write-only` or `exact-only`.
    pub cache_mode: String,
}

/// A change to the live settings: absent fields stay as they are.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigPatch {
    pub similarity_threshold: Option<f32>,
    /// Merged into the current map; a `null` value removes that namespace's floor.
    pub namespace_thresholds: Option<BTreeMap<String, Option<f32>>>,
    /// Merged into the current map; a `null` value removes that namespace's mode.
    pub namespace_modes: Option<BTreeMap<String, Option<String>>>,
    pub semantic_guards: Option<String>,
    pub default_ttl_s: Option<u64>,
    pub replay: Option<String>,
    pub cache_mode: Option<String>,
}

/// What requests read: the configuration with the live changes, and its parsed defaults.
#[derive(Debug)]
pub struct Settings {
    pub config: Config,
    pub defaults: Defaults,
    pub guards: Guards,
}

impl Settings {
    fn new(config: Config) -> Self {
        Self {
            defaults: config.policy_defaults(),
            guards: config.guards(),
            config,
        }
    }

    /// The similarity floor for a namespace: its own when configured, else the global one.
    pub fn threshold_floor(&self, namespace: Option<&str>) -> f32 {
        self.config.threshold_floor(namespace)
    }

    /// The defaults a request's headers apply to: its namespace's mode when one is configured
    /// (the namespace header is read as sent; the policy validates it).
    pub fn defaults_for(&self, headers: &axum::http::HeaderMap) -> std::borrow::Cow<'_, Defaults> {
        let mode = headers
            .get("x-reprise-namespace")
            .and_then(|v| v.to_str().ok())
            .and_then(|n| self.config.namespace_modes.get(n.trim()))
            .and_then(|m| crate::policy::CacheMode::parse(m));
        match mode {
            Some(mode) => std::borrow::Cow::Owned(Defaults {
                mode,
                ..self.defaults.clone()
            }),
            None => std::borrow::Cow::Borrowed(&self.defaults),
        }
    }

    pub fn view(&self) -> LiveConfig {
        let c = &self.config;
        LiveConfig {
            similarity_threshold: c.similarity_threshold,
            namespace_thresholds: c.namespace_thresholds.clone(),
            namespace_modes: c.namespace_modes.clone(),
            semantic_guards: c.semantic_guards.clone(),
            default_ttl_s: c.default_ttl_s,
            replay: c.replay.clone(),
            cache_mode: c.cache_mode.clone(),
        }
    }
}

/// The current settings, swapped whole on a change.
pub struct Live {
    current: RwLock<Arc<Settings>>,
}

impl Live {
    pub fn new(config: Config) -> Self {
        Self {
            current: RwLock::new(Arc::new(Settings::new(config))),
        }
    }

    pub fn current(&self) -> Arc<Settings> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Applies `patch` if the result is valid; returns the new settings. Nothing changes on error.
    pub fn apply(&self, patch: ConfigPatch) -> Result<Arc<Settings>, GatewayError> {
        // The write lock is held from read to swap, so two patches cannot lose each other's changes.
        let mut slot = self.current.write().unwrap_or_else(|e| e.into_inner());
        let before = slot.view();
        let mut config = slot.config.clone();
        let ConfigPatch {
            similarity_threshold,
            namespace_thresholds,
            namespace_modes,
            semantic_guards,
            default_ttl_s,
            replay,
            cache_mode,
        } = patch;
        if let Some(t) = similarity_threshold {
            config.similarity_threshold = t;
        }
        for (namespace, floor) in namespace_thresholds.unwrap_or_default() {
            match floor {
                Some(t) => config.namespace_thresholds.insert(namespace, t),
                None => config.namespace_thresholds.remove(&namespace),
            };
        }
        for (namespace, mode) in namespace_modes.unwrap_or_default() {
            match mode {
                Some(m) => config.namespace_modes.insert(namespace, m),
                None => config.namespace_modes.remove(&namespace),
            };
        }
        if let Some(guards) = semantic_guards {
            config.semantic_guards = guards;
        }
        if let Some(ttl) = default_ttl_s {
            config.default_ttl_s = ttl;
        }
        if let Some(replay) = replay {
            config.replay = replay;
        }
        if let Some(mode) = cache_mode {
            config.cache_mode = mode;
        }
        config.validate().map_err(|err| match err {
            ConfigError::Invalid { field, reason } => {
                GatewayError::invalid(format!("Invalid `{field}`: {reason}."), Some(field))
            }
            other => GatewayError::invalid(other.to_string(), None),
        })?;
        let next = Arc::new(Settings::new(config));
        let after = next.view();
        tracing::info!(
            before = %serde_json::to_string(&before).unwrap_or_default(),
            after = %serde_json::to_string(&after).unwrap_or_default(),
            "live configuration changed"
        );
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
        let live = Live::new(Config::default());
        let now = live
            .apply(patch(serde_json::json!({
                "similarity_threshold": 0.95,
                "namespace_thresholds": {"support": 0.97},
                "replay": "tokens-per-second=50",
                "semantic_guards": "negation"
            })))
            .expect("valid");
        assert_eq!(now.guards, Guards::parse("negation").expect("valid"));
        assert_eq!(now.view().semantic_guards, "negation");
        assert_eq!(now.threshold_floor(None), 0.95);
        assert_eq!(now.threshold_floor(Some("support")), 0.97);
        assert_eq!(
            now.defaults.pacing,
            crate::policy::Pacing::TokensPerSecond(50.0)
        );
        assert_eq!(now.config.default_ttl_s, Config::default().default_ttl_s);
        let removed = live
            .apply(patch(
                serde_json::json!({"namespace_thresholds": {"support": null}}),
            ))
            .expect("valid");
        assert_eq!(removed.threshold_floor(Some("support")), 0.95);
    }

    #[test]
    fn an_invalid_patch_names_the_field_and_changes_nothing() {
        let live = Live::new(Config::default());
        for (body, field) in [
            (
                serde_json::json!({"similarity_threshold": 1.5}),
                "similarity_threshold",
            ),
            (serde_json::json!({"default_ttl_s": 0}), "default_ttl_s"),
            (
                serde_json::json!({"replay": "fast", "similarity_threshold": 0.5}),
                "replay",
            ),
            (serde_json::json!({"cache_mode": "sometimes"}), "cache_mode"),
            (
                serde_json::json!({"semantic_guards": "numbers,vibes"}),
                "semantic_guards",
            ),
        ] {
            let err = live.apply(patch(body)).expect_err("invalid");
            assert_eq!(err.body()["error"]["param"], field);
        }
        assert_eq!(
            live.current().view(),
            Settings::new(Config::default()).view()
        );
        assert!(serde_json::from_value::<ConfigPatch>(serde_json::json!({"listen": "x"})).is_err());
    }
}
