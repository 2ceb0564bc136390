//! The gateway's phases of one request, as the client reads them: in the timing comment of a
//! stream, in `Server-Timing`, and in admin answers (entries, request records).
//!
//! The client mirrors the gateway's phase names (`server/src/timing.rs`) without linking the
//! server, so every field is optional: it reads any gateway version and ignores what it does not know.

use serde::{Deserialize, Serialize};

/// Milliseconds per phase; absent phases did not happen (no upstream on a hit, for one).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Phases {
    pub ingress_ms: Option<f64>,
    pub lookup_ms: Option<f64>,
    pub embed_ms: Option<f64>,
    pub search_ms: Option<f64>,
    pub upstream_send_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub decode_ms: Option<f64>,
    pub downstream_ms: Option<f64>,
    pub total_ms: Option<f64>,
    /// Content-bearing chunks seen.
    pub tokens: Option<u64>,
    /// `usage.completion_tokens` as the upstream reported it.
    pub completion_tokens: Option<u64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    pub tokens_per_s: Option<f64>,
}
