//! One measured request ([`Sample`]) and how the gateway's response headers are read into it
//! (`x-reprise-cache`, `x-reprise-semantic`). No HTTP and no statistics here.

use serde::Serialize;

use super::timing::Phases;
use super::workload::Kind;

/// One measured request.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub target: usize,
    pub index: usize,
    /// How the request relates to earlier ones by construction.
    pub kind: Kind,
    pub status: u16,
    /// `x-reprise-cache` as the gateway sent it, `none` without the header.
    pub outcome: String,
    pub ttft_ms: Option<f64>,
    pub total_ms: f64,
    pub tokens: usize,
    /// Gaps between successive content chunks as the client received them.
    #[serde(skip)]
    pub gaps_ms: Vec<f64>,
    /// `x-reprise-ttft-saved-ms`: the original miss's TTFT minus this hit's.
    pub ttft_saved_ms: Option<f64>,
    /// `x-reprise-similarity` of a semantic hit.
    pub similarity: Option<f64>,
    /// The reason in `x-reprise-semantic: skipped; reason=…`: the gateway matched this request
    /// exactly only (its embedding was refused, late or failed).
    pub semantic_skipped: Option<String>,
    /// The gateway's phase timing (stream comment or `Server-Timing`).
    pub phases: Option<Phases>,
    /// `x-reprise-entry`: the entry that served a hit.
    pub entry: Option<String>,
    /// `x-reprise-verified` of a verified semantic hit (`judge` or `budget`).
    pub verified: Option<String>,
    /// `x-reprise-verify`: what the verify stage did (a verdict, `queued`, `dropped`).
    pub verify: Option<String>,
    /// `x-reprise-judge-ms`: the judge's time on this request.
    pub judge_ms: Option<f64>,
    /// Open loop: how late the request was sent against its schedule.
    pub lag_ms: Option<f64>,
    pub error: Option<String>,
}

impl Sample {
    pub fn new(target: usize, index: usize, kind: Kind) -> Self {
        Self {
            target,
            index,
            kind,
            status: 0,
            outcome: "none".to_owned(),
            ttft_ms: None,
            total_ms: 0.0,
            tokens: 0,
            gaps_ms: Vec::new(),
            ttft_saved_ms: None,
            similarity: None,
            semantic_skipped: None,
            phases: None,
            entry: None,
            verified: None,
            verify: None,
            judge_ms: None,
            lag_ms: None,
            error: None,
        }
    }
}

/// The outcome name of an `x-reprise-cache` value (`none` without the header).
pub fn outcome_of(header: Option<&str>) -> String {
    match header.map(str::trim).filter(|v| !v.is_empty()) {
        Some(v) => v.to_ascii_lowercase(),
        None => "none".to_owned(),
    }
}

/// The reason of an `x-reprise-semantic: skipped; reason=…` header (`unknown` when it names none);
/// `None` without the header or for another value.
pub fn skipped_reason(header: Option<&str>) -> Option<String> {
    let mut parts = header?.split(';').map(str::trim);
    if !parts.next()?.eq_ignore_ascii_case("skipped") {
        return None;
    }
    let reason = parts
        .find_map(|p| p.strip_prefix("reason="))
        .map(|r| r.trim().to_ascii_lowercase())
        .filter(|r| !r.is_empty());
    Some(reason.unwrap_or_else(|| "unknown".to_owned()))
}
