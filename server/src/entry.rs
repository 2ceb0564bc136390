//! A cache entry: what is stored for one answered request, and what a hit replays.
//!
//! Both shapes of the answer are kept: the stream events (with their offsets from the first event,
//! so `recorded` pacing can reproduce them) and the assembled non-stream body, so either kind of
//! request can be served from either kind of miss without re-deriving one from the other on the hit path.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::key::{CacheKey, PartitionKey};
use crate::timing::Phases;

/// Store-assigned entry id, shown to clients as `x-reprise-entry`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EntryId(pub u64);

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "e_{:012x}", self.0)
    }
}

impl std::str::FromStr for EntryId {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let hex = s.strip_prefix("e_").ok_or(())?;
        u64::from_str_radix(hex, 16).map(EntryId).map_err(|_| ())
    }
}

/// What the entry answers, for listings and invalidation. Never holds a credential.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RequestSummary {
    /// `chat.completions`, `completions` or `embeddings`.
    pub route: String,
    pub model: String,
    pub namespace: Option<String>,
    /// Hex prefix of the tenant hash (blake3 of the client's API key), or `shared`.
    pub tenant: String,
    /// The final user turn (chat) or prompt (completions) as canonicalized for the key.
    pub prompt: String,
    /// Whether the original request streamed.
    pub stream: bool,
}

/// One stream event of the original answer: its JSON payload and when it arrived.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StoredEvent {
    /// Milliseconds after the first event of the stream.
    pub offset_ms: f64,
    /// The `data:` payload (a JSON chunk), without `data: ` and the blank line.
    pub data: Value,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub id: EntryId,
    pub key: CacheKey,
    pub partition: PartitionKey,
    pub summary: RequestSummary,
    /// The answer as stream chunks (without `[DONE]`); for embeddings, empty.
    pub events: Vec<StoredEvent>,
    /// The answer as one response body.
    pub body: Value,
    pub usage: Option<Value>,
    /// Phases of the miss that produced this entry.
    pub phases: Phases,
    pub created_at_ms: u64,
    pub ttl_ms: u64,
    pub hit_count: u64,
    pub last_hit_ms: u64,
    /// Embedding of `summary.prompt` (unit length) for semantic matching; absent when the entry was
    /// stored without one (embedding late or off, embeddings route).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "vector_b64")]
    pub vector: Option<Vec<f32>>,
    /// The latest hits served from this entry, oldest first, at most [`HIT_HISTORY`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hit_history: Vec<HitEvent>,
    /// Pre-loaded through `POST /admin/entries` rather than recorded from an upstream answer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub warmed: bool,
}

/// How many hits an entry remembers for `GET /admin/entries/{id}`.
pub const HIT_HISTORY: usize = 32;

/// How a hit found its entry, spelled as its `x-reprise-cache` outcome.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum HitKind {
    Hit,
    /// Entries written before the outcome had one spelling say `semantic_hit`.
    #[serde(alias = "semantic_hit")]
    SemanticHit,
    Coalesced,
}

/// One request served from an entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct HitEvent {
    pub at_ms: u64,
    pub kind: HitKind,
    /// Similarity of the request's prompt to the entry's (semantic hits only).
    pub similarity: Option<f32>,
    pub request_id: String,
    /// Time to first token of the hit.
    pub ttft_ms: Option<f64>,
    /// The stored miss's network and prefill time, less the hit's TTFT.
    pub ttft_saved_ms: Option<f64>,
}

/// Vectors as base64 of little-endian f32: a third of the size of a JSON number array, and exact.
mod vector_b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<f32>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => {
                let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<f32>>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else {
            return Ok(None);
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)?;
        if bytes.len() % 4 != 0 {
            return Err(serde::de::Error::custom(
                "vector bytes are not a multiple of 4",
            ));
        }
        Ok(Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }
}

impl Entry {
    pub fn expires_at_ms(&self) -> u64 {
        self.created_at_ms.saturating_add(self.ttl_ms)
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_at_ms()
    }

    /// Whole seconds since the entry was stored (the `age` header, `Cache-Control: max-age`).
    pub fn age_s(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.created_at_ms) / 1000
    }

    /// Network and prefill time the original miss spent before its first token: what a hit saves.
    pub fn ttft_cost_ms(&self) -> Option<f64> {
        let p = &self.phases;
        Some(p.upstream_send_ms.unwrap_or(0.0) + p.ttft_ms?)
    }
}
