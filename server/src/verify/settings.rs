//! The verify stage's live settings (`verify`, `verify_mode`, `verify_floor`, `max_wrong`, the
//! judge's model, URL and timeout), their per-namespace overrides, and what one request resolves
//! them to.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `off` or `judge`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum VerifyKind {
    #[default]
    Off,
    Judge,
}

/// `sync`: a near match is judged before answering; `async`: the request goes upstream and the
/// pair is judged in the background, for the next request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum VerifyMode {
    #[default]
    Sync,
    Async,
}

impl VerifyKind {
    pub fn name(self) -> &'static str {
        match self {
            VerifyKind::Off => "off",
            VerifyKind::Judge => "judge",
        }
    }
}

impl VerifyMode {
    pub fn name(self) -> &'static str {
        match self {
            VerifyMode::Sync => "sync",
            VerifyMode::Async => "async",
        }
    }
}

/// The verify settings of one namespace, where they differ from the global ones; an absent field
/// is the global value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NamespaceVerify {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub verify: Option<VerifyKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub verify_mode: Option<VerifyMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify_floor: Option<f32>,
    /// `Some(None)`: this namespace uses the threshold instead of a budget (`"none"` in the file).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present_budget"
    )]
    #[schema(value_type = Option<f64>)]
    pub max_wrong: Option<Option<f64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_timeout_ms: Option<u64>,
}

/// What one request's namespace resolves the verify settings to.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyPlan {
    pub kind: VerifyKind,
    pub mode: VerifyMode,
    /// The lowest similarity worth a judge call.
    pub floor: f32,
    /// The error budget; `None`: candidates at or above the threshold are served unjudged.
    pub max_wrong: Option<f64>,
    pub model: Option<String>,
    /// `None`: the upstream.
    pub url: Option<String>,
    pub timeout: Duration,
}

impl VerifyPlan {
    pub fn judges(&self) -> bool {
        self.kind == VerifyKind::Judge
    }
}

/// The error budget as written: a share from 0 to 1, or `"none"` (or `null`) for no budget, so
/// that a TOML file, which has no null, can say it too.
pub fn budget<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Share(f64),
        Word(String),
    }
    match Option::<Written>::deserialize(deserializer)? {
        None => Ok(None),
        Some(Written::Share(share)) => Ok(Some(share)),
        Some(Written::Word(word)) if word == "none" => Ok(None),
        Some(Written::Word(word)) => Err(serde::de::Error::custom(format!(
            "`{word}` is not a share from 0 to 1 or \"none\""
        ))),
    }
}

/// [`budget`] for a field that may be absent (`None`) or present, `null` and `"none"` included.
pub fn present_budget<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Option<f64>>, D::Error> {
    budget(deserializer).map(Some)
}

/// `--max-wrong`: a share, or `none` (no budget).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget(pub Option<f64>);

impl std::str::FromStr for Budget {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        if text == "none" {
            return Ok(Self(None));
        }
        text.parse::<f64>()
            .map(|share| Self(Some(share)))
            .map_err(|_| format!("`{text}` is not a share from 0 to 1 or `none`"))
    }
}

/// The default error budget: 1% of the candidates served unjudged may be wrong.
pub const DEFAULT_MAX_WRONG: f64 = 0.01;

/// The largest judge timeout: a sync judge call holds the client's request.
pub const MAX_JUDGE_TIMEOUT_MS: u64 = 600_000;

/// Refuses a value out of its range, naming the field.
pub fn check(field: &'static str, plan: &VerifyPlan) -> Result<(), crate::error::ConfigError> {
    let invalid = |reason: String| Err(crate::error::ConfigError::Invalid { field, reason });
    if !(0.0..=1.0).contains(&plan.floor) {
        return invalid(format!(
            "verify_floor {} is not a similarity between 0 and 1",
            plan.floor
        ));
    }
    if let Some(m) = plan.max_wrong.filter(|m| !(0.0..=1.0).contains(m)) {
        return invalid(format!("max_wrong {m} is not a share between 0 and 1"));
    }
    let ms = plan.timeout.as_millis() as u64;
    if !(1..=MAX_JUDGE_TIMEOUT_MS).contains(&ms) {
        return invalid(format!(
            "judge_timeout_ms {ms} is not from 1 to {MAX_JUDGE_TIMEOUT_MS}"
        ));
    }
    if let Some(url) = plan
        .url
        .as_deref()
        .filter(|u| !(u.starts_with("http://") || u.starts_with("https://")))
    {
        return invalid(format!(
            "judge_url {url:?} is not an http:// or https:// URL"
        ));
    }
    if plan.judges() && plan.model.as_deref().is_none_or(str::is_empty) {
        return invalid(
            "verify = \"judge\" needs judge_model (the model the judge calls use)".to_owned(),
        );
    }
    Ok(())
}
