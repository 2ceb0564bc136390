//! The contract types of the cache's contents: `GET /admin/entries` (pages, summaries, one entry
//! with its history and verdicts), `DELETE`, `POST /admin/entries` (warm), `/admin/invalidate` and
//! `/admin/flush`. Types and the query strings they make; no HTTP here.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Phases;

/// One cached entry as listed by `GET /admin/entries`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntrySummary {
    pub id: String,
    pub object: String,
    /// `chat.completions` or `completions`.
    pub route: String,
    pub model: String,
    pub namespace: Option<String>,
    /// Tenant hash prefix, or `shared`.
    pub tenant: String,
    pub prompt: String,
    pub stream: bool,
    /// First 200 characters of the answer.
    pub answer_preview: String,
    pub created_at_ms: u64,
    pub expires_at_ms: Option<u64>,
    pub age_s: f64,
    pub hit_count: u64,
    /// `None` when never hit.
    pub last_hit_ms: Option<u64>,
    pub bytes: u64,
    /// What the miss that stored it waited for its first token.
    pub ttft_cost_ms: Option<f64>,
    pub tokens: u64,
    pub warmed: bool,
    /// Only present in search results (`q`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub similarity: Option<f64>,
}

/// `GET /admin/entries/{id}`: the summary fields plus the stored response and its history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryDetail {
    #[serde(flatten)]
    pub summary: EntrySummary,
    pub key: String,
    pub partition: String,
    pub answer: String,
    /// The OpenAI response object as stored.
    pub body: Value,
    /// Stream events recorded for replay.
    pub events: u64,
    pub usage: Option<Value>,
    /// Phases of the miss that stored it (`None` for warmed entries, which had no miss).
    pub phases: Option<Phases>,
    pub has_vector: bool,
    /// Newest last, at most 32.
    pub hit_history: Vec<HitEvent>,
    /// The verdicts (judge and operators) its near matches met (absent from older gateways).
    #[serde(default)]
    pub verdicts: Option<EntryVerdicts>,
    /// The entry's own floor, raised by operators' `wrong` verdicts.
    #[serde(default)]
    pub entry_threshold: Option<f32>,
}

/// An entry's verdicts and the threshold they set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryVerdicts {
    /// Newest last.
    pub observations: Vec<Observation>,
    /// Candidates at or below this similarity are always judged.
    pub judged_at_or_below: Option<f32>,
}

/// One verdict an entry met.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    pub similarity: f32,
    pub wrong: bool,
    /// `judge` or `operator`.
    pub source: String,
    pub at_ms: u64,
}

/// One time an entry served a request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HitEvent {
    pub at_ms: u64,
    /// `hit`, `semantic-hit` or `coalesced`.
    pub kind: String,
    pub similarity: Option<f64>,
    pub request_id: Option<String>,
    pub ttft_ms: Option<f64>,
    pub ttft_saved_ms: Option<f64>,
}

/// One page of `GET /admin/entries`, newest first (or by similarity for a search).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryPage {
    pub object: String,
    pub data: Vec<EntrySummary>,
    pub has_more: bool,
    pub next_cursor: Option<String>,
}

/// Query parameters of `GET /admin/entries`; `None` fields are not sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListQuery {
    pub namespace: Option<String>,
    pub model: Option<String>,
    /// Semantic search text (semantic mode only).
    pub q: Option<String>,
    /// 1..=200; the gateway defaults to 20.
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl ListQuery {
    pub(super) fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        let fields = [
            ("namespace", self.namespace.clone()),
            ("model", self.model.clone()),
            ("q", self.q.clone()),
            ("limit", self.limit.map(|l| l.to_string())),
            ("cursor", self.cursor.clone()),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                pairs.push((name, value));
            }
        }
        pairs
    }
}

/// Exact-match filters for a search.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntryFilter {
    pub namespace: Option<String>,
    pub model: Option<String>,
}

/// `DELETE /admin/entries/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EntryDeleted {
    pub id: String,
    pub object: String,
    pub deleted: bool,
}

/// One entry to pre-load with `POST /admin/entries`. Exactly one of `prompt`, `messages` and
/// `request` must be set; the constructors guarantee that.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmItem {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// OpenAI chat messages, passed through as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Value>>,
    /// A whole OpenAI request body as the application sends it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Value>,
    pub response: String,
    /// `chat.completions` (the gateway's default), `completions` or `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// `max_tokens` of the request the entry answers (required on the `messages` route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// Keyed request headers (`anthropic-version`, `anthropic-beta` on the `messages` route).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Tenant key (hashed by the gateway, never stored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_s: Option<u64>,
}

impl WarmItem {
    /// A single user prompt for `model` answered by `response`.
    pub fn prompt(
        model: impl Into<String>,
        prompt: impl Into<String>,
        response: impl Into<String>,
    ) -> Self {
        Self {
            model: Some(model.into()),
            prompt: Some(prompt.into()),
            ..Self::empty(response.into())
        }
    }

    /// A chat conversation (`[{"role": .., "content": ..}, ..]`) answered by `response`.
    pub fn messages(
        model: impl Into<String>,
        messages: Vec<Value>,
        response: impl Into<String>,
    ) -> Self {
        Self {
            model: Some(model.into()),
            messages: Some(messages),
            ..Self::empty(response.into())
        }
    }

    /// A whole OpenAI request body (it carries the model) answered by `response`.
    pub fn request(request: Value, response: impl Into<String>) -> Self {
        Self {
            request: Some(request),
            ..Self::empty(response.into())
        }
    }

    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    pub fn with_route(mut self, route: impl Into<String>) -> Self {
        self.route = Some(route.into());
        self
    }

    pub fn with_max_tokens(mut self, max_tokens: u64) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers
            .get_or_insert_with(Default::default)
            .insert(name.into(), value.into());
        self
    }

    pub fn with_api_key(mut self, api_key: impl Into<String>) -> Self {
        self.api_key = Some(api_key.into());
        self
    }

    pub fn with_ttl_s(mut self, ttl_s: u64) -> Self {
        self.ttl_s = Some(ttl_s);
        self
    }

    fn empty(response: String) -> Self {
        Self {
            model: None,
            prompt: None,
            messages: None,
            request: None,
            response,
            route: None,
            max_tokens: None,
            headers: None,
            namespace: None,
            api_key: None,
            ttl_s: None,
        }
    }
}

/// `POST /admin/entries` -> 201.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmResult {
    pub object: String,
    pub created: u64,
    pub data: Vec<WarmedEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmedEntry {
    pub id: String,
    pub prompt: String,
}

/// How a raw warm body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmFormat {
    /// One item, an array of items, or `{"entries": [..]}`.
    Json,
    /// One item per line (blank lines ignored).
    JsonLines,
}

impl WarmFormat {
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::JsonLines => "application/x-ndjson",
        }
    }
}

/// `POST /admin/invalidate`: all set fields must match (AND); at least one is required.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InvalidateRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Tenant hash prefix or `shared`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub older_than_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub similar_to: Option<String>,
    /// Defaults (on the gateway) to the configured similarity threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_similarity: Option<f32>,
    /// Count the matches without deleting them.
    #[serde(default)]
    pub dry_run: bool,
}

/// `POST /admin/invalidate` -> 200.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Invalidation {
    pub object: String,
    pub matched: u64,
    pub deleted: u64,
    pub dry_run: bool,
}

/// `POST /admin/flush` -> 200.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Flush {
    pub object: String,
    pub deleted: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_items_send_only_what_is_set() {
        let item = WarmItem::prompt("gpt-4o-mini", "hi", "hello").with_namespace("support");
        assert_eq!(
            serde_json::to_value(&item).expect("serialize"),
            serde_json::json!({"model": "gpt-4o-mini", "prompt": "hi", "response": "hello", "namespace": "support"})
        );
        let item = WarmItem::request(serde_json::json!({"model": "m", "messages": []}), "a");
        assert_eq!(
            serde_json::to_value(&item).expect("serialize"),
            serde_json::json!({"request": {"model": "m", "messages": []}, "response": "a"})
        );
    }

    #[test]
    fn list_query_sends_only_set_parameters() {
        let query = ListQuery {
            model: Some("m".to_owned()),
            limit: Some(5),
            ..ListQuery::default()
        };
        assert_eq!(
            query.pairs(),
            vec![("model", "m".to_owned()), ("limit", "5".to_owned())]
        );
    }
}
