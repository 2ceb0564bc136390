//! The phases of one request, in milliseconds, and their two text forms: the standard
//! `Server-Timing` header and the `: reprise-timing {json}` comment a stream carries before
//! `data: [DONE]`. The gateway writes them (its `PhaseClock` measures them); the client reads them
//! back. What each phase covers is written down in the server's `timing.rs`.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

/// The timing comment's prefix.
const COMMENT: &[u8] = b": reprise-timing ";

// Every field has a default, so a reader takes the phases of an older or newer gateway; the
// non-optional ones are pinned `required` in the OpenAPI document, since the gateway always sends them.
/// The phases of one request, in milliseconds. Absent phases did not happen (e.g. no upstream on a hit).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Phases {
    pub ingress_ms: Option<f64>,
    /// Cache policy, key and exact lookup (absent on routes that are not cached).
    #[serde(default)]
    pub lookup_ms: Option<f64>,
    /// Embedding the final user turn with the local model (semantic matching).
    #[serde(default)]
    pub embed_ms: Option<f64>,
    /// Searching the request's partition in the vector index.
    #[serde(default)]
    pub search_ms: Option<f64>,
    /// Waiting for the judge's verdict on a near match (`verify = judge`, sync).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_ms: Option<f64>,
    pub upstream_send_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub decode_ms: Option<f64>,
    pub downstream_ms: Option<f64>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub total_ms: f64,
    /// Content-bearing chunks seen (about one token each on OpenAI-style streams).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub tokens: u64,
    /// `usage.completion_tokens` as the upstream reported it, when it did.
    pub completion_tokens: Option<u64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    pub tokens_per_s: Option<f64>,
}

impl Phases {
    /// A standard `Server-Timing` header value (`name;dur=ms`), phases that happened only.
    pub fn server_timing(&self) -> String {
        let mut parts = Vec::new();
        for (name, value) in [
            ("ingress", self.ingress_ms),
            ("lookup", self.lookup_ms),
            ("embed", self.embed_ms),
            ("search", self.search_ms),
            ("judge", self.judge_ms),
            ("upstream_send", self.upstream_send_ms),
            ("ttft", self.ttft_ms),
            ("decode", self.decode_ms),
            ("downstream", self.downstream_ms),
            ("total", Some(self.total_ms)),
        ] {
            if let Some(ms) = value {
                parts.push(format!("{name};dur={ms:.3}"));
            }
        }
        parts.join(", ")
    }

    /// The SSE comment line placed just before `data: [DONE]`; SSE clients ignore comments.
    pub fn sse_comment(&self) -> Bytes {
        let json = serde_json::to_string(self).unwrap_or_else(|_| "{}".to_owned());
        Bytes::from(format!(": reprise-timing {json}\n"))
    }

    /// Parses one SSE line if it is the timing comment (`None` for any other line).
    pub fn from_sse_line(line: &[u8]) -> Option<Self> {
        let json = line.strip_prefix(COMMENT)?;
        serde_json::from_slice(json.trim_ascii()).ok()
    }

    /// Parses a `Server-Timing` value (`name;dur=ms, ...`); unknown names and parameters are
    /// ignored, so are entries without a duration. `None` when no phase of ours is in it.
    pub fn from_server_timing(value: &str) -> Option<Self> {
        let mut phases = Self::default();
        let mut any = false;
        for entry in value.split(',') {
            let mut parts = entry.split(';').map(str::trim);
            let name = parts.next().unwrap_or("");
            let dur = parts
                .filter_map(|p| p.strip_prefix("dur="))
                .find_map(|d| d.trim_matches('"').parse::<f64>().ok());
            let Some(dur) = dur else { continue };
            let slot = match name {
                "ingress" => &mut phases.ingress_ms,
                "lookup" => &mut phases.lookup_ms,
                "embed" => &mut phases.embed_ms,
                "search" => &mut phases.search_ms,
                "upstream_send" => &mut phases.upstream_send_ms,
                "ttft" => &mut phases.ttft_ms,
                "decode" => &mut phases.decode_ms,
                "downstream" => &mut phases.downstream_ms,
                "total" => {
                    phases.total_ms = dur;
                    any = true;
                    continue;
                }
                _ => continue,
            };
            *slot = Some(dur);
            any = true;
        }
        any.then_some(phases)
    }
}
