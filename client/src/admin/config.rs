//! The contract types of `/admin/config` (the live settings and a patch of them), `/admin/shadow`
//! (what semantic matching would have served) and `/admin/feedback` (operators' verdicts).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `GET`/`PATCH /admin/config`: the settings that can change without a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveConfig {
    pub similarity_threshold: f32,
    pub namespace_thresholds: BTreeMap<String, f32>,
    /// `numbers,negation,direction,antonym`, some of them, or `none` (empty from gateways that predate the guards).
    #[serde(default)]
    pub semantic_guards: String,
    pub default_ttl_s: Option<u64>,
    /// `instant`, `recorded` or `tokens-per-second=N`.
    pub replay: String,
    /// `on`, `off`, `read-only`, `write-only`, `exact-only`, `shadow`.
    pub cache_mode: String,
    /// Default cache modes of namespaces (empty from gateways that predate them).
    #[serde(default)]
    pub namespace_modes: BTreeMap<String, String>,
}

/// `PATCH /admin/config` body: only set fields are sent. In `namespace_thresholds` a `None` value
/// is sent as `null`, which removes that namespace's threshold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub similarity_threshold: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_thresholds: Option<BTreeMap<String, Option<f32>>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semantic_guards: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_ttl_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_modes: Option<BTreeMap<String, Option<String>>>,
}

impl ConfigPatch {
    /// True when nothing would change.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// One guard's verdict on a shadow candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GuardVerdict {
    pub guard: String,
    pub enabled: bool,
    pub refuses: bool,
}

/// What a request in shadow mode would have been served (`GET /admin/shadow`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowDecision {
    pub id: u64,
    pub at_ms: u64,
    pub request_id: String,
    pub namespace: Option<String>,
    pub model: String,
    pub prompt: String,
    /// `would-hit`, `would-refuse` or `would-miss`.
    pub would: String,
    pub entry: String,
    pub entry_prompt: String,
    pub similarity: f32,
    pub threshold: f32,
    pub guards: Vec<GuardVerdict>,
    /// The judge's verdict (`verify = judge`): `queued` until it lands.
    #[serde(default)]
    pub verdict: Option<String>,
}

/// `GET /admin/shadow`, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShadowPage {
    pub data: Vec<ShadowDecision>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// Filters of `GET /admin/shadow`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShadowQuery {
    pub namespace: Option<String>,
    /// `hit`, `refuse` or `miss` (or their `would-` forms).
    pub would: Option<String>,
    pub limit: Option<u32>,
    pub cursor: Option<String>,
}

impl ShadowQuery {
    pub(super) fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        if let Some(n) = &self.namespace {
            pairs.push(("namespace", n.clone()));
        }
        if let Some(w) = &self.would {
            pairs.push(("would", w.clone()));
        }
        if let Some(l) = self.limit {
            pairs.push(("limit", l.to_string()));
        }
        if let Some(c) = &self.cursor {
            pairs.push(("cursor", c.clone()));
        }
        pairs
    }
}

/// `POST /admin/feedback`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackRequest {
    pub request_id: String,
    /// `right` or `wrong`.
    pub verdict: String,
}

/// A stored verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerdictRecord {
    pub id: u64,
    pub at_ms: u64,
    pub request_id: String,
    pub verdict: String,
    /// `hit`, `semantic-hit` or `shadow`.
    pub met: String,
    pub entry: String,
    pub prompt: String,
    pub similarity: Option<f32>,
    pub effect: String,
}

/// `GET /admin/feedback`, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeedbackPage {
    pub data: Vec<VerdictRecord>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn config_patch_sends_null_to_remove_a_threshold() {
        let patch = ConfigPatch {
            namespace_thresholds: Some(BTreeMap::from([
                ("support".to_owned(), Some(0.95)),
                ("legal".to_owned(), None),
            ])),
            ..ConfigPatch::default()
        };
        let json = serde_json::to_value(&patch).expect("serialize");
        assert_eq!(
            json,
            serde_json::json!({"namespace_thresholds": {"legal": null, "support": 0.95_f32}})
        );
        assert!(!patch.is_empty());
        assert!(ConfigPatch::default().is_empty());
    }
}
