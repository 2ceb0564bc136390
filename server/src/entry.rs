//! A cache entry: what is stored for one answered request, and what a hit replays.
//!
//! Both shapes of the answer are kept: the stream events (with their offsets from the first event,
//! so `recorded` pacing can reproduce them) and the assembled non-stream body, so either kind of
//! request can be served from either kind of miss without re-deriving one from the other on the hit path.
//!
//! The store keeps an entry in two halves: its [`Replay`] (what an exact hit reads: the events and
//! body already serialized for the socket, and the few fields a hit checks) and the rest (summary,
//! phases, hit counts and history, vector), which only listings, bookkeeping and semantic matching read.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::key::{CacheKey, PartitionKey};
use crate::outcome::CacheOutcome;
use crate::timing::Phases;
use reprise_migrations::replay::{self as record, Record};

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
    /// The answer as stream chunks (without `[DONE]`); for embeddings, empty. Absent from the
    /// stored cold half (the [`Replay`] holds it).
    #[serde(default)]
    pub events: Vec<StoredEvent>,
    /// The answer as one response body (absent from the cold half, like `events`).
    #[serde(default)]
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

impl HitKind {
    /// The outcome a hit of this kind is served as: the one mapping between the two, so a hit's
    /// history and its `x-reprise-cache` always agree.
    pub fn outcome(self) -> CacheOutcome {
        match self {
            Self::Hit => CacheOutcome::Hit,
            Self::SemanticHit => CacheOutcome::SemanticHit,
            Self::Coalesced => CacheOutcome::Coalesced,
        }
    }
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

    pub(super) fn serialize<S: Serializer>(v: &Option<Vec<f32>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => {
                let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<f32>>, D::Error> {
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
    /// Records `hits` more hits, the `recent` ones (batched, maybe out of order) in the bounded
    /// history: what every store's `touch` does to the entry it rewrites.
    pub fn record_hits(&mut self, hits: u64, recent: &[HitEvent]) {
        self.hit_count = self.hit_count.saturating_add(hits);
        // Batched touches may arrive out of order: recency only moves forward.
        let last_hit_ms = recent.iter().map(|h| h.at_ms).max().unwrap_or(0);
        self.last_hit_ms = self.last_hit_ms.max(last_hit_ms);
        self.hit_history.extend_from_slice(recent);
        self.hit_history.sort_by_key(|h| h.at_ms);
        let excess = self.hit_history.len().saturating_sub(HIT_HISTORY);
        self.hit_history.drain(..excess);
    }

    /// Gives an entry stored without a vector its vector (the backfill); false when it has one.
    pub fn fill_vector(&mut self, vector: &[f32]) -> bool {
        if self.vector.is_some() {
            return false;
        }
        self.vector = Some(vector.to_vec());
        true
    }

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

#[cfg(test)]
impl Entry {
    /// A chat entry for unit tests: `prompt` under `key` in partition 1, no answer events, an
    /// empty body, stored now for a minute, no vector. Tests set the fields they are about.
    pub(crate) fn for_test(prompt: &str, key: [u8; 32]) -> Entry {
        Entry {
            id: EntryId(0),
            key: CacheKey(key),
            partition: PartitionKey([1; 32]),
            summary: RequestSummary {
                route: "chat.completions".into(),
                model: "m".into(),
                namespace: None,
                tenant: "shared".into(),
                prompt: prompt.into(),
                stream: false,
            },
            events: Vec::new(),
            body: serde_json::json!({"choices": []}),
            usage: None,
            phases: Phases::default(),
            created_at_ms: crate::timing::unix_ms(),
            ttl_ms: 60_000,
            hit_count: 0,
            last_hit_ms: 0,
            vector: None,
            hit_history: Vec::new(),
            warmed: false,
        }
    }
}

/// The stored cold half of an entry: every field but `events` and `body`, spelled as [`Entry`]
/// spells them, so that it reads back as an [`Entry`] with those two empty.
#[derive(Serialize)]
struct Cold<'a> {
    id: EntryId,
    key: CacheKey,
    partition: PartitionKey,
    summary: &'a RequestSummary,
    usage: &'a Option<Value>,
    phases: &'a Phases,
    created_at_ms: u64,
    ttl_ms: u64,
    hit_count: u64,
    last_hit_ms: u64,
    #[serde(skip_serializing_if = "no_vector", serialize_with = "vector_ref")]
    vector: &'a Option<Vec<f32>>,
    #[serde(skip_serializing_if = "no_hits")]
    hit_history: &'a [HitEvent],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    warmed: bool,
}

fn no_vector(v: &&Option<Vec<f32>>) -> bool {
    v.is_none()
}

fn no_hits(h: &&[HitEvent]) -> bool {
    h.is_empty()
}

fn vector_ref<S: serde::Serializer>(v: &&Option<Vec<f32>>, s: S) -> Result<S::Ok, S::Error> {
    vector_b64::serialize(v, s)
}

impl Entry {
    /// JSON of everything but the answer (`events`, `body`): what the store keeps apart from the
    /// [`Replay`], and rewrites alone when hits are recorded or a vector arrives.
    pub fn cold_json(&self) -> serde_json::Result<Vec<u8>> {
        serde_json::to_vec(&Cold {
            id: self.id,
            key: self.key,
            partition: self.partition,
            summary: &self.summary,
            usage: &self.usage,
            phases: &self.phases,
            created_at_ms: self.created_at_ms,
            ttl_ms: self.ttl_ms,
            hit_count: self.hit_count,
            last_hit_ms: self.last_hit_ms,
            vector: &self.vector,
            hit_history: &self.hit_history,
            warmed: self.warmed,
        })
    }

    /// Puts back the answer of a cold half read from the store.
    pub fn with_answer(mut self, replay: &Replay) -> Result<Self, String> {
        let (events, body) = replay.record.original()?;
        self.events = events
            .into_iter()
            .map(|(offset_ms, data)| StoredEvent { offset_ms, data })
            .collect();
        self.body = body;
        Ok(self)
    }
}

/// What an exact hit reads of an entry: its identity, expiry and saving, and the answer's events and
/// body pre-serialized, with holes for what each hit renews (see `reprise_migrations::replay`).
/// Read without decoding any JSON; rendered by [`crate::render`].
#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    pub(crate) record: Record,
}

impl Replay {
    /// The replay of an entry (at store time, or for an entry that came from the cold read).
    pub fn of(entry: &Entry) -> Self {
        let framing = crate::ingress::Framing::of_name(&entry.summary.route);
        Self {
            record: record::build(record::Parts {
                id: entry.id.0,
                key: entry.key.0,
                partition: entry.partition.0,
                created_at_ms: entry.created_at_ms,
                ttl_ms: entry.ttl_ms,
                ttft_cost_ms: entry.ttft_cost_ms(),
                completions: framing.text_completion,
                named_events: framing.named_events,
                message_ids: framing.message_ids,
                events: entry
                    .events
                    .iter()
                    .map(|e| (e.offset_ms, &e.data))
                    .collect(),
                body: &entry.body,
                usage: entry.usage.as_ref(),
            }),
        }
    }

    /// Reads an encoded record (the store checked its checksum).
    pub fn decode(raw: &[u8]) -> Result<Self, String> {
        Record::decode(raw).map(|record| Self { record })
    }

    pub fn encode(&self) -> Vec<u8> {
        self.record.encode()
    }

    pub fn id(&self) -> EntryId {
        EntryId(self.record.id)
    }

    /// Whether a stream served from it carries usage when the client asks for it: its stream
    /// recorded a usage chunk, or the body it came from had usage (sent as a chunk of its own). A
    /// stream asked without `include_usage` has neither, even from a server that puts
    /// `"usage": null` on every chunk.
    pub fn has_usage(&self) -> bool {
        self.record.usage_chunk.is_some() || self.record.has_usage_chunk()
    }

    pub fn key(&self) -> CacheKey {
        CacheKey(self.record.key)
    }

    pub fn partition(&self) -> PartitionKey {
        PartitionKey(self.record.partition)
    }

    pub fn created_at_ms(&self) -> u64 {
        self.record.created_at_ms
    }

    pub fn expires_at_ms(&self) -> u64 {
        self.record.created_at_ms.saturating_add(self.record.ttl_ms)
    }

    pub fn is_expired(&self, now_ms: u64) -> bool {
        now_ms >= self.expires_at_ms()
    }

    /// Whole seconds since the entry was stored.
    pub fn age_s(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.record.created_at_ms) / 1000
    }

    /// See [`Entry::ttft_cost_ms`].
    pub fn ttft_cost_ms(&self) -> Option<f64> {
        self.record.ttft_cost_ms
    }

    /// Stream events of the answer.
    pub fn events(&self) -> usize {
        self.record.events.len()
    }

    /// The stored response body as JSON text, with its original identity (what the savings
    /// accounting reads the answer's `usage` from; a hit's own body is rendered with a fresh one).
    pub fn body_json(&self) -> Vec<u8> {
        let identity = reprise_migrations::replay::Identity::Original(&self.record.identities);
        self.record.body.render_all(false, identity)
    }

    /// When the entry was stored: with its id, what tells it from a later entry of the same id.
    pub fn stamp(&self) -> (u64, u64) {
        (self.record.id, self.record.created_at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_is_spelled_in_its_history_as_its_outcome_and_old_spellings_still_read() {
        for kind in [HitKind::Hit, HitKind::SemanticHit, HitKind::Coalesced] {
            let stored = serde_json::to_value(kind).expect("serialize");
            assert_eq!(stored, kind.outcome().as_str(), "{kind:?}");
            assert_eq!(serde_json::from_value::<HitKind>(stored).ok(), Some(kind));
        }
        let old: HitKind = serde_json::from_str("\"semantic_hit\"").expect("old spelling");
        assert_eq!(old.outcome(), CacheOutcome::SemanticHit);
    }

    #[test]
    fn the_cold_half_and_the_replay_give_back_the_whole_entry() {
        let entry = Entry {
            id: EntryId(4),
            key: CacheKey([1; 32]),
            partition: PartitionKey([2; 32]),
            summary: RequestSummary {
                route: "chat.completions".into(),
                model: "m".into(),
                namespace: Some("n".into()),
                tenant: "t".into(),
                prompt: "p".into(),
                stream: true,
            },
            events: vec![StoredEvent {
                offset_ms: 0.25,
                data: serde_json::json!({"id": "x", "created": 3, "choices": [{"delta": {"content": "a"}}], "usage": null}),
            }],
            body: serde_json::json!({"id": "x", "created": 3, "choices": []}),
            usage: Some(serde_json::json!({"total_tokens": 1})),
            phases: Phases::default(),
            created_at_ms: 10,
            ttl_ms: 20,
            hit_count: 2,
            last_hit_ms: 11,
            vector: Some(vec![0.5, -0.25]),
            hit_history: vec![HitEvent {
                at_ms: 11,
                kind: HitKind::Hit,
                similarity: None,
                request_id: "r".into(),
                ttft_ms: Some(0.1),
                ttft_saved_ms: None,
            }],
            warmed: true,
        };
        let cold: Entry = serde_json::from_slice(&entry.cold_json().expect("cold")).expect("read");
        assert!(cold.events.is_empty() && cold.body.is_null());
        let replay = Replay::decode(&Replay::of(&entry).encode()).expect("replay");
        assert_eq!(cold.with_answer(&replay).expect("whole"), entry);
        assert_eq!(
            (replay.id(), replay.key(), replay.expires_at_ms()),
            (EntryId(4), CacheKey([1; 32]), 30)
        );
    }
}
