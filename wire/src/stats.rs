//! The parts of the `GET /admin/stats` body that count and time requests: counts and shares by
//! cache outcome, prefill time saved, upstream errors, guard refusals, the TTFT histogram, the
//! hit-rate timeline and per-outcome phase percentiles. The gateway fills them from its counters;
//! the body around them (store, index, embedding, judge) stays the gateway's own.
//!
//! Every field has a default, so a reader takes the body of an older gateway (a count it lacks is
//! zero) and ignores the counts of a newer one. Each non-optional field says so twice: `serde(default)`
//! for the reader, `schema(required)` so the OpenAPI document still says the gateway always sends it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RequestCounts {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub total: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub hit: u64,
    #[serde(default, rename = "semantic-hit")]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub semantic_hit: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub miss: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub coalesced: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub bypass: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub refresh: u64,
    /// Routes that are never cached (passthrough).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub pass: u64,
    /// Requests that ended in an error (gateway or upstream), not counting client disconnects.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub errors: u64,
}

/// Shares of the cacheable requests (hit, semantic hit, coalesced, miss, bypass, refresh).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rates {
    /// Exact, semantic and coalesced hits together.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub hit: f64,
    /// Spelled as the outcome is, `exact-hit` beside `semantic-hit`; the outcome itself is `hit`,
    /// which here names all hits together.
    #[serde(default, rename = "exact-hit")]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub exact_hit: f64,
    #[serde(default, rename = "semantic-hit")]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub semantic_hit: f64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub coalesced: f64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub miss: f64,
    /// Bypassed or refreshed on the client's request.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub bypass: f64,
}

impl Rates {
    pub fn of(c: &RequestCounts) -> Self {
        let cacheable = c.hit + c.semantic_hit + c.coalesced + c.miss + c.bypass + c.refresh;
        let share = |n: u64| {
            if cacheable == 0 {
                0.0
            } else {
                n as f64 / cacheable as f64
            }
        };
        Self {
            hit: share(c.hit + c.semantic_hit + c.coalesced),
            exact_hit: share(c.hit),
            semantic_hit: share(c.semantic_hit),
            coalesced: share(c.coalesced),
            miss: share(c.miss),
            bypass: share(c.bypass + c.refresh),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TtftSaved {
    /// Milliseconds of upstream network and prefill that hits did not wait for.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub total: f64,
    pub per_hit: Option<f64>,
    /// Hits counted (those whose entry recorded its miss's TTFT).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub hits: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UpstreamErrors {
    /// No connection: refused, DNS, TLS.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub connect: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub timeout: u64,
    /// Answers that were not valid HTTP (malformed head, closed before complete).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub protocol: u64,
    /// Non-2xx answers relayed as they were.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub status: u64,
    /// Streams that failed after they started.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub stream: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TtftHistogram {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub bounds_ms: Vec<f64>,
    /// Per outcome, one count per bound (TTFT at or below it, above the previous) and one more for
    /// what lies above the last bound.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub by_outcome: BTreeMap<String, Vec<u64>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Timeline {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub bucket_s: u64,
    /// Oldest first; buckets without traffic may be absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub buckets: Vec<TimelineBucket>,
}

/// Requests by outcome within one timeline bucket.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TimelineBucket {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub start_ms: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub hit: u64,
    #[serde(default, rename = "semantic-hit")]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub semantic_hit: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub miss: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub coalesced: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub bypass: u64,
}

/// Semantic lookups that a guard left without a match, by the first guard that refused:
/// wrong answers that were not served.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GuardRefusals {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub numbers: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub negation: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub format: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub task: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub direction: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub antonym: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub entity: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub template: u64,
}

/// Misses raced against their semantic search (`semantic_overlap`), by which finished first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Overlap {
    /// A semantic hit was found before the upstream's first byte: served, the upstream request cancelled.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub semantic_first: u64,
    /// The upstream's first byte came first: its answer was relayed.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub upstream_first: u64,
}

/// p50/p90/p99 and the mean of one phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Summary {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub p50: f64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub p90: f64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub p99: f64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub mean: f64,
}

/// Phase summaries of one outcome over the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutcomeLatency {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub count: usize,
    /// Keyed by phase (`ingress_ms` … `total_ms`); `null` when no request of the window had it.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, Summary>, required))]
    pub phases: BTreeMap<String, Option<Summary>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An older gateway's counts (no `pass`, no `errors`) and a newer one's extra count both read.
    #[test]
    fn counts_decode_leniently() {
        let c: RequestCounts =
            serde_json::from_str(r#"{"total":3,"hit":1,"semantic-hit":1,"miss":1,"later":7}"#)
                .expect("json");
        assert_eq!((c.total, c.semantic_hit, c.pass, c.errors), (3, 1, 0, 0));
        let r = Rates::of(&c);
        assert!((r.hit - 2.0 / 3.0).abs() < 1e-9);
        assert_eq!(
            serde_json::to_value(&r).expect("json")["semantic-hit"],
            serde_json::json!(1.0 / 3.0)
        );
    }

    /// The shares are spelled as the outcomes are, with hyphens, and one spelling only.
    #[test]
    fn rates_spell_exact_hit_beside_semantic_hit() {
        let c = RequestCounts {
            total: 4,
            hit: 1,
            semantic_hit: 1,
            miss: 2,
            ..RequestCounts::default()
        };
        let json = serde_json::to_value(Rates::of(&c)).expect("json");
        assert_eq!(json["exact-hit"], serde_json::json!(0.25));
        assert_eq!(json["semantic-hit"], serde_json::json!(0.25));
        assert!(json.get("exact_hit").is_none(), "{json}");
        let back: Rates = serde_json::from_value(json).expect("json");
        assert_eq!(back.exact_hit, 0.25);
    }
}
