//! The record of one finished request, as `GET /admin/requests` lists it: what happened and how
//! long each phase took. It carries no prompt, no response and no credential: only the route,
//! model, outcome and timings.
//!
//! The gateway writes [`RequestRecord`] with its exhaustive enums; a reader decodes a
//! [`LenientRecord`], the same fields with the outcome and completion kept as sent when it does not
//! know their spelling. Every other field has a default, so a field a gateway leaves out (older) is
//! not an error, and one it adds (newer) is ignored.

use serde::{Deserialize, Serialize};

use crate::lenient::Lenient;
use crate::outcome::{CacheOutcome, Completion};
use crate::phases::Phases;

// `Outcome` and `End` are the spelled fields: the gateway's own enums by default, [`Lenient`] ones
// in a [`LenientRecord`]. (A `//` comment: a doc comment would become the schema's description.)
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(bound = ""))]
pub struct RequestRecord<Outcome = CacheOutcome, End = Completion> {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub id: String,
    /// Unix time in milliseconds when the request arrived.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub started_at_ms: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub method: String,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub route: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub stream: bool,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub status: u16,
    /// Cache outcome as sent in `x-reprise-cache` (`pass` for routes that are never cached).
    #[cfg_attr(feature = "openapi", schema(value_type = CacheOutcome))]
    pub cache: Outcome,
    #[cfg_attr(feature = "openapi", schema(value_type = Completion))]
    pub completion: End,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub phases: Phases,
    /// The entry that served a hit (or a coalesced request).
    #[serde(default)]
    pub entry: Option<String>,
    /// Similarity of a semantic hit.
    #[serde(default)]
    pub similarity: Option<f32>,
    /// On a miss: similarity of the best semantic candidate (`x-reprise-nearest`).
    #[serde(default)]
    pub nearest: Option<f32>,
    /// On a miss: the literal guard that refused a candidate at or above the threshold, leaving no
    /// match (`x-reprise-guard`; what `guard_refusals` counts).
    #[serde(default)]
    pub guard: Option<String>,
    /// Why semantic matching was skipped (`overload`, `deadline`, `failed`, `scan_busy`), as in
    /// `x-reprise-semantic: skipped; reason=…`.
    #[serde(default)]
    pub semantic_skipped: Option<String>,
    /// Network and prefill time of the stored miss, less this hit's TTFT.
    #[serde(default)]
    pub ttft_saved_ms: Option<f64>,
    /// The `code` of the gateway's own error response, when it answered with one.
    #[serde(default)]
    pub error: Option<String>,
    /// Why a clean answer was not stored: `too_large` (over `max_entry_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_skipped: Option<String>,
    /// The request's `x-reprise-namespace`, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// On a hit: the tokens its entry's answer cost upstream, and their price
    /// (`x-reprise-tokens-saved`, `x-reprise-cost-saved`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved: Option<crate::savings::TokensSaved>,
}

/// A record as a reader decodes it: an outcome or completion it does not know is kept as sent, and
/// a record without them reads as [`Lenient::Unknown`] with an empty spelling.
pub type LenientRecord = RequestRecord<Lenient<CacheOutcome>, Lenient<Completion>>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A newer gateway's record: an outcome this reader does not know, a field it never heard of,
    /// and the phases, status and completion left out.
    #[test]
    fn a_reader_decodes_unknown_outcomes_and_missing_fields() {
        let json = r#"{"id":"req_1","route":"chat.completions","cache":"prefetched",
            "similarity":0.9,"shiny_new_field":{"a":1}}"#;
        let record: LenientRecord = serde_json::from_str(json).expect("lenient decode");
        assert_eq!(record.cache, Lenient::Unknown("prefetched".to_owned()));
        assert_eq!(record.completion, Lenient::Unknown(String::new()));
        assert_eq!(record.status, 0);
        assert_eq!(record.phases, Phases::default());
        assert_eq!(record.similarity, Some(0.9));
        assert_eq!(record.route, "chat.completions");
        // The gateway's own type still refuses what it would never write.
        assert!(serde_json::from_str::<RequestRecord>(json).is_err());
    }

    #[test]
    fn a_reader_keeps_known_outcomes() {
        let json = r#"{"id":"r","started_at_ms":1,"method":"POST","route":"chat.completions",
            "model":null,"stream":true,"status":200,"cache":"semantic-hit","completion":"complete",
            "phases":{"ingress_ms":0.1,"total_ms":2.0,"tokens":3}}"#;
        let record: LenientRecord = serde_json::from_str(json).expect("lenient decode");
        assert!(record.cache.is(&CacheOutcome::SemanticHit));
        assert!(record.completion.is(&Completion::Complete));
        assert_eq!(record.phases.total_ms, 2.0);
        let strict: RequestRecord = serde_json::from_str(json).expect("strict decode");
        assert_eq!(strict.cache, CacheOutcome::SemanticHit);
        // Both write the same bytes.
        assert_eq!(
            serde_json::to_string(&record).expect("json"),
            serde_json::to_string(&strict).expect("json")
        );
    }
}
