//! The trait every API adapter implements, and what the adapters share (why an answer is not
//! stored, the word pieces a body is re-chunked into). Kept apart from `api/mod.rs`, which picks an
//! adapter per route, so that the adapters and their lookup do not import each other; it must not
//! name any one adapter.

use serde_json::{Map, Value};

use crate::entry::StoredEvent;
use crate::error::GatewayError;
use crate::ingress::Route;
use crate::key::{FieldHasher, Turn};
use crate::policy::Policy;
use crate::sse::EventKind;

/// Why an answer must not be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uncacheable {
    NoFinishReason,
    Length,
    /// A choice stopped at the provider's content filter (or Anthropic's `refusal`): an error
    /// signal, not an answer.
    ContentFilter,
    /// The body carries an `error` member beside its choices.
    Error,
    InvalidToolArguments,
    NotJson,
    NoChoices,
    /// A Responses API response whose status is not `completed` (incomplete, failed, cancelled,
    /// queued), or with an output item that did not complete; an Anthropic message that stopped at
    /// `pause_turn` (the client must continue the turn).
    NotCompleted,
    /// A Responses API response in which the provider ran a tool with effects outside the answer
    /// (a remote MCP call, code in a container) or waits for an approval: a hit would skip them.
    ServerSideTool,
}

/// One API's rules, as the stages need them.
pub trait Api: Sync {
    /// The route this adapter serves.
    fn route(&self) -> Route;

    /// Keys: writes the body's answer-changing fields into the partition and returns the final
    /// turn (the exact part and the prompt semantic matching compares). Fails (400, naming the
    /// field) when a field the keys depend on has the wrong JSON type.
    fn turn(
        &self,
        body: &Map<String, Value>,
        partition: &mut FieldHasher,
    ) -> Result<Turn, GatewayError>;

    /// Request headers that change the answer, written into the partition by their canonical value
    /// (Anthropic's `anthropic-version` and `anthropic-beta`); none by default.
    fn key_headers(&self) -> &'static [&'static str] {
        &[]
    }

    /// The API's own cache rules read from the request body, applied to `policy` (a request that
    /// is never cached turns lookup and store off); returns whether its entry may be shared across
    /// API keys when the operator shares them.
    fn rules(&self, _body: &Map<String, Value>, _policy: &mut Policy) -> bool {
        true
    }

    /// Whether a request asking for a stream is answered by one.
    fn streams(&self) -> bool {
        true
    }

    /// Whether a paraphrase may be served this API's answer (semantic matching and vectors).
    fn semantic(&self) -> bool {
        true
    }

    /// Checks an assembled answer against the never-store rules; `allow_length` lets an answer cut
    /// at its token limit be stored.
    fn check(&self, body: &Value, allow_length: bool) -> Result<(), Uncacheable>;

    /// The body a non-streamed request would have received, from a stream's events. Call it as
    /// `assemble` on `dyn Api`, which takes any iterator.
    fn assemble_events(&self, events: &mut dyn Iterator<Item = &Value>) -> Value;

    /// The events a streamed request would have received for a body; offsets spread the content
    /// over the original decode time, so `recorded` pacing stays plausible.
    fn rechunk(&self, body: &Value, decode_ms: f64) -> Vec<StoredEvent>;

    /// How the stream relay reads one of this API's events, given [`crate::sse::classify`]'s
    /// reading (which knows OpenAI's chunks and the Responses API's events): which events carry
    /// tokens (the first one is the time to first token), which carries usage, and which is the
    /// clean end of the stream (`finish_reason` set). The default keeps that reading.
    fn stream_event(&self, kind: EventKind) -> EventKind {
        kind
    }

    /// The prefix of the fresh id a hit carries instead of the original's (`chatcmpl-`).
    fn id_prefix(&self) -> &'static str;

    /// The event that ends a stream of this API which failed after it began (the upstream broke
    /// off, timed out, or the leader a follower read failed), in the shape its clients parse:
    /// `{"error":{…}}` on OpenAI's chunk streams, Anthropic's `event: error`. `last` is the data of
    /// the last event the client got, for APIs that number their events.
    fn stream_error(&self, err: &GatewayError, last: Option<&Value>) -> bytes::Bytes {
        let _ = last;
        err.sse_event_for(self.route().provider().error_shape())
    }

    /// How an answer is warmed from text (`POST /admin/entries`); `None` for an API that is not.
    fn warm(&self) -> Option<&dyn Warm> {
        None
    }
}

impl dyn Api {
    /// [`Api::assemble_events`] over any iterator of events.
    pub fn assemble<'a>(&self, events: impl IntoIterator<Item = &'a Value>) -> Value {
        self.assemble_events(&mut events.into_iter())
    }
}

/// How a warmed item (a prompt or messages, and a response text) becomes a request and an answer.
pub trait Warm: Sync {
    /// The request body a warmed `prompt` stands for.
    fn prompt(&self, prompt: String) -> Map<String, Value>;
    /// The request body of warmed `messages`, or why this API takes none.
    fn messages(&self, messages: Vec<Value>) -> Result<Map<String, Value>, GatewayError>;
    /// The stored answer: `response` as this API's body, under a `warm` id.
    fn answer(&self, model: String, response: String, now_s: u64) -> Value;
    /// Keyed request headers ([`Api::key_headers`]) a warmed item stands for when it names none:
    /// what the API's clients always send, one set per kind of client (Anthropic's
    /// `anthropic-version`, which its SDKs and Claude Code give different values); the item is
    /// stored once per set, so that it answers each of them.
    fn default_headers(&self) -> &'static [&'static [(&'static str, &'static str)]] {
        &[&[]]
    }
}

/// Splits text into token-like pieces, each keeping the whitespace before it.
pub(crate) fn pieces(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    for ch in text.chars() {
        if ch.is_whitespace() && in_word {
            out.push(std::mem::take(&mut current));
            in_word = false;
        }
        if !ch.is_whitespace() {
            in_word = true;
        }
        current.push(ch);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_keep_whitespace_with_the_next_word() {
        assert_eq!(
            pieces("Hello  big\nworld"),
            vec!["Hello", "  big", "\nworld"]
        );
        assert_eq!(pieces(""), Vec::<String>::new());
    }
}
