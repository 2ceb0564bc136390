//! The contract types of `GET /admin/stats` and `GET /admin/requests`: the body around the counts,
//! and the counts, phases and records themselves, which are the wire contract's (`reprise-wire`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

// The parts the gateway and the client share are the wire contract's (`reprise-wire`): decoded
// leniently there, so an older or newer gateway's body still reads.
pub use reprise_wire::{CacheOutcome, Completion, Lenient};
pub use reprise_wire::{
    GuardRefusals, OutcomeLatency, Phases, Rates, RequestCounts, Summary, Timeline, TimelineBucket,
    TtftHistogram, TtftSaved, UpstreamErrors,
};
pub use reprise_wire::{JudgeCost, PriceTableInfo, Savings, SavingsRow, TokenSource, TokensSaved};
pub use reprise_wire::{JudgeStats, NamespaceBudget};

/// One recent request from `GET /admin/requests` (no prompt, no response, no credential); an
/// outcome or completion this client does not know is kept as the gateway spelled it.
pub type RequestRecord = reprise_wire::LenientRecord;

/// `GET /admin/stats`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub object: String,
    pub version: String,
    pub uptime_s: f64,
    /// `semantic` or `exact-only`.
    pub mode: String,
    pub store: StoreStats,
    /// `None` in exact-only mode.
    pub index: Option<IndexStats>,
    pub requests: RequestCounts,
    pub rates: Rates,
    pub ttft_saved_ms: TtftSaved,
    /// Tokens and money hits saved (absent from gateways that predate savings accounting).
    #[serde(default)]
    pub savings: Option<Savings>,
    pub embedding: Option<EmbeddingStats>,
    pub upstream_errors: UpstreamErrors,
    /// Semantic lookups a literal guard left without a match, by the first guard that refused
    /// (absent from older gateways, read as zeros).
    #[serde(default)]
    pub guard_refusals: GuardRefusals,
    /// Operators' verdicts (absent from gateways that predate feedback).
    #[serde(default)]
    pub feedback: Option<FeedbackCounts>,
    /// The judge of near matches (absent from gateways that predate `verify`).
    #[serde(default)]
    pub judge: Option<JudgeStats>,
    pub latency: Latency,
    pub ttft_histogram: TtftHistogram,
    pub timeline: Timeline,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreStats {
    pub entries: u64,
    pub bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IndexStats {
    pub vectors: u64,
    pub tombstones: u64,
    pub rebuilding: bool,
    /// Partitions searched without a graph until their graph is built (absent before 2026-12-06).
    #[serde(default)]
    pub graphs_pending: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbeddingStats {
    pub fallbacks: u64,
    pub batches: u64,
    pub texts: u64,
    pub mean_batch_size: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// Verdicts received through `POST /admin/feedback`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FeedbackCounts {
    pub right: u64,
    pub wrong: u64,
    pub vetoes: u64,
    pub approvals: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    /// How many recent requests the percentiles cover.
    pub window: u64,
    /// Only outcomes seen in the window (`hit`, `semantic-hit`, `coalesced`, `miss`).
    pub by_outcome: BTreeMap<String, OutcomeLatency>,
}

/// `GET /admin/requests`, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestsPage {
    pub object: String,
    pub data: Vec<RequestRecord>,
}
