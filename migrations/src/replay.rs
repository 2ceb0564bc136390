//! The replay record of schema version 3: what an exact hit reads, with the answer's stream events
//! and body already serialized as they go to the socket. It must stay free of the server's types.
//!
//! It lives here, beside the step that writes one for every older entry, because its bytes encode
//! the replay rules of version 3 (which fields a hit renews, how `include_usage` changes a chunk):
//! a change to those rules is a new schema version, whose step re-renders the records. The server
//! builds, reads and renders records through this module.
//!
//! A [`Template`] is the compact JSON of the original text with *holes*: the values of the top-level
//! `id` and `created` members are cut out (a hit writes fresh ones; the originals are kept in
//! [`Record::identities`], so the stored answer can still be read back exactly), and the bytes that
//! differ between a client that asked for `stream_options.include_usage` and one that did not are
//! marked as spans kept only for one of them. Rendering is copying bytes between the holes.

use std::ops::Range;

use serde_json::Value;

/// Format byte at the start of an encoded record.
const RECORD_FORMAT: u8 = 3;

/// What a hole stands for.
pub mod hole {
    /// The top-level `id` value: `arg` indexes [`super::Record::identities`].
    pub const ID: u8 = 1;
    /// The top-level `created` value: `arg` indexes [`super::Record::identities`].
    pub const CREATED: u8 = 2;
    /// `len` bytes (and the `arg` holes inside them) sent only when the client asked for usage.
    pub const WITH_USAGE: u8 = 3;
    /// `len` bytes (and the `arg` holes inside them) sent only when it did not.
    pub const WITHOUT_USAGE: u8 = 4;
}

/// Stands in for a hole while a variant is written: serde_json escapes every control character
/// inside strings, so these bytes never occur in its output.
const ID_MARK: u8 = 0x01;
const CREATED_MARK: u8 = 0x02;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hole {
    /// Offset in [`Template::text`].
    pub pos: u32,
    /// Bytes the hole covers (conditional spans only).
    pub len: u32,
    pub kind: u8,
    /// Identity index, or the number of holes inside a conditional span.
    pub arg: u32,
}

/// Bytes with holes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Template {
    pub text: Vec<u8>,
    pub holes: Vec<Hole>,
}

/// What fills identity holes.
#[derive(Clone, Copy)]
pub enum Identity<'a> {
    /// A hit's own: the JSON of its `id` and of its `created`.
    Fresh { id: &'a [u8], created: &'a [u8] },
    /// The stored answer's, from [`Record::identities`].
    Original(&'a [Vec<u8>]),
}

impl Template {
    /// Appends `text[text]` with holes `holes[holes]` filled (the ranges must be those of whole
    /// events, or of the whole template).
    pub fn render(
        &self,
        text: Range<usize>,
        holes: Range<usize>,
        with_usage: bool,
        identity: Identity<'_>,
        out: &mut Vec<u8>,
    ) {
        let mut at = text.start;
        let mut i = holes.start;
        while i < holes.end {
            let Some(h) = self.holes.get(i) else { break };
            i += 1;
            let pos = h.pos as usize;
            out.extend_from_slice(self.text.get(at..pos).unwrap_or_default());
            at = pos;
            match h.kind {
                hole::ID | hole::CREATED => match identity {
                    Identity::Fresh { id, created } => {
                        out.extend_from_slice(if h.kind == hole::ID { id } else { created })
                    }
                    Identity::Original(values) => {
                        if let Some(v) = values.get(h.arg as usize) {
                            out.extend_from_slice(v);
                        }
                    }
                },
                kind => {
                    if (kind == hole::WITH_USAGE) != with_usage {
                        at = pos + h.len as usize;
                        i += h.arg as usize;
                    }
                }
            }
        }
        out.extend_from_slice(self.text.get(at..text.end).unwrap_or_default());
    }

    /// The whole template rendered.
    pub fn render_all(&self, with_usage: bool, identity: Identity<'_>) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.text.len() + 64);
        self.render(
            0..self.text.len(),
            0..self.holes.len(),
            with_usage,
            identity,
            &mut out,
        );
        out
    }

    /// Appends marked bytes: marks become identity holes naming `ident` (id, created).
    fn push_marked(&mut self, bytes: &[u8], ident: (u32, u32)) {
        for &b in bytes {
            let (kind, arg) = match b {
                ID_MARK => (hole::ID, ident.0),
                CREATED_MARK => (hole::CREATED, ident.1),
                _ => {
                    self.text.push(b);
                    continue;
                }
            };
            self.holes.push(Hole {
                pos: self.text.len() as u32,
                len: 0,
                kind,
                arg,
            });
        }
    }

    /// Appends marked bytes as a span sent only with (or only without) usage.
    fn push_span(&mut self, kind: u8, bytes: &[u8], ident: (u32, u32)) {
        if bytes.is_empty() {
            return;
        }
        let at = self.holes.len();
        let pos = self.text.len() as u32;
        self.holes.push(Hole {
            pos,
            len: 0,
            kind,
            arg: 0,
        });
        self.push_marked(bytes, ident);
        let inner = (self.holes.len() - at - 1) as u32;
        let len = self.text.len() as u32 - pos;
        self.holes[at].len = len;
        self.holes[at].arg = inner;
    }

    /// Appends two variants of one text, sharing their common prefix and suffix.
    fn push_variants(&mut self, without: &[u8], with: &[u8], ident: (u32, u32)) {
        let prefix = without.iter().zip(with).take_while(|(a, b)| a == b).count();
        let room = without.len().min(with.len()) - prefix;
        let suffix = without
            .iter()
            .rev()
            .zip(with.iter().rev())
            .take(room)
            .take_while(|(a, b)| a == b)
            .count();
        self.push_marked(&without[..prefix], ident);
        self.push_span(
            hole::WITHOUT_USAGE,
            &without[prefix..without.len() - suffix],
            ident,
        );
        self.push_span(hole::WITH_USAGE, &with[prefix..with.len() - suffix], ident);
        self.push_marked(&without[without.len() - suffix..], ident);
    }
}

/// One stream event's place in [`Record::stream`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    /// End of its bytes in the stream text (it starts where the previous one ends).
    pub text_end: u32,
    /// End of its holes.
    pub holes_end: u32,
    /// Milliseconds after the first event of the original stream.
    pub offset_ms: f64,
    /// Choices with content in it (see [`chunk_tokens`]).
    pub tokens: u32,
    /// The original chunk had a `usage` member (restores it when read back).
    pub had_usage: bool,
}

/// The replay record of one entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub id: u64,
    pub key: [u8; 32],
    pub partition: [u8; 32],
    pub created_at_ms: u64,
    pub ttl_ms: u64,
    /// Network and prefill time of the miss that stored it (what a hit saves).
    pub ttft_cost_ms: Option<f64>,
    pub events: Vec<Event>,
    /// Every event as `data: <json>\n\n`, one after the other.
    pub stream: Template,
    /// The usage-only chunk sent at the end to a client that asked for usage when the stream
    /// recorded none (the assembled body had usage).
    pub usage_chunk: Option<Template>,
    /// The non-stream response body.
    pub body: Template,
    /// Original `id`/`created` values as JSON, named by identity holes.
    pub identities: Vec<Vec<u8>>,
}

/// What a record is built from.
pub struct Parts<'a> {
    pub id: u64,
    pub key: [u8; 32],
    pub partition: [u8; 32],
    pub created_at_ms: u64,
    pub ttl_ms: u64,
    pub ttft_cost_ms: Option<f64>,
    /// The legacy completions route (its chunks are `text_completion` objects).
    pub completions: bool,
    /// A Responses API or Anthropic Messages answer: see [`build_named`].
    pub named_events: bool,
    /// With `named_events`: an Anthropic message, whose `id` a hit renews (see [`build_named`]).
    pub message_ids: bool,
    /// (offset ms, chunk) of each stream event.
    pub events: Vec<(f64, &'a Value)>,
    pub body: &'a Value,
    pub usage: Option<&'a Value>,
}

/// Whether a chunk is the usage-only chunk sent when `stream_options.include_usage` was asked.
pub fn is_usage_chunk(chunk: &Value) -> bool {
    chunk.get("usage").is_some_and(|u| !u.is_null())
        && chunk
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
}

/// Choices of a chunk that carry content: a chat delta with content, a refusal, reasoning or tool
/// calls, or a legacy completion's text (about one token each on OpenAI-style streams).
pub fn chunk_tokens(chunk: &Value) -> u32 {
    let non_empty = |v: Option<&Value>| v.and_then(Value::as_str).is_some_and(|s| !s.is_empty());
    let has_content = |choice: &Value| {
        if non_empty(choice.get("text")) {
            return true;
        }
        let Some(delta) = choice.get("delta") else {
            return false;
        };
        non_empty(delta.get("content"))
            || non_empty(delta.get("refusal"))
            || non_empty(delta.get("reasoning_content"))
            || delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .is_some_and(|calls| !calls.is_empty())
    };
    chunk
        .get("choices")
        .and_then(Value::as_array)
        .map_or(0, |choices| {
            choices.iter().filter(|c| has_content(c)).count() as u32
        })
}

/// Compact JSON of `value` (as `Value`'s `Display` writes it) with the values of its top-level
/// `id` and `created` members replaced by marks.
fn write_marked(value: &Value, out: &mut Vec<u8>) {
    let Some(obj) = value.as_object() else {
        // Writing to a Vec cannot fail, and a Value always serializes.
        let _ = serde_json::to_writer(&mut *out, value);
        return;
    };
    out.push(b'{');
    for (i, (k, v)) in obj.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let _ = serde_json::to_writer(&mut *out, k);
        out.push(b':');
        match k.as_str() {
            "id" => out.push(ID_MARK),
            "created" => out.push(CREATED_MARK),
            _ => {
                let _ = serde_json::to_writer(&mut *out, v);
            }
        }
    }
    out.push(b'}');
}

fn sse_marked(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"data: ");
    write_marked(value, &mut out);
    out.extend_from_slice(b"\n\n");
    out
}

/// Interns original identity values.
#[derive(Default)]
struct Identities {
    values: Vec<Vec<u8>>,
    index: std::collections::HashMap<Vec<u8>, u32>,
}

impl Identities {
    fn of(&mut self, value: &Value) -> (u32, u32) {
        (
            self.intern(value.get("id")),
            self.intern(value.get("created")),
        )
    }

    fn intern(&mut self, value: Option<&Value>) -> u32 {
        let Some(value) = value else { return u32::MAX };
        let raw = serde_json::to_vec(value).unwrap_or_default();
        if let Some(&i) = self.index.get(&raw) {
            return i;
        }
        let i = self.values.len() as u32;
        self.values.push(raw.clone());
        self.index.insert(raw, i);
        i
    }
}

/// Builds the record of an answer. The bytes follow the replay rules of version 3: a hit renews
/// the top-level `id` and `created` of each chunk and of the body; a client that did not ask for
/// usage gets no usage-only chunk and no `usage` member, one that did gets `"usage":null` on every
/// other chunk, and a usage-only chunk synthesized from the body's usage when the stream had none.
pub fn build(parts: Parts<'_>) -> Record {
    if parts.named_events {
        return build_named(parts);
    }
    let mut identities = Identities::default();
    let mut stream = Template::default();
    let mut events = Vec::with_capacity(parts.events.len());
    let mut saw_usage = false;
    for (offset_ms, data) in &parts.events {
        let usage_only = is_usage_chunk(data);
        saw_usage |= usage_only;
        let ident = identities.of(data);
        // As `render_chunk` of version 3 had it: without usage, the `usage` member is removed (and
        // a usage-only chunk is not sent); with usage, it is added as `null` where absent. One of
        // the two is the chunk as stored, so one clone per event.
        let has_usage = data.get("usage").is_some();
        let edited = |with_usage: bool| {
            let mut chunk = (*data).clone();
            if let Some(obj) = chunk.as_object_mut() {
                if with_usage {
                    obj.entry("usage").or_insert(Value::Null);
                } else {
                    obj.remove("usage");
                }
            }
            sse_marked(&chunk)
        };
        let without = match (usage_only, has_usage) {
            (true, _) => Vec::new(),
            (false, false) => sse_marked(data),
            (false, true) => edited(false),
        };
        let with = if usage_only || has_usage {
            sse_marked(data)
        } else {
            edited(true)
        };
        stream.push_variants(&without, &with, ident);
        events.push(Event {
            text_end: stream.text.len() as u32,
            holes_end: stream.holes.len() as u32,
            offset_ms: *offset_ms,
            tokens: chunk_tokens(data),
            had_usage: data.get("usage").is_some(),
        });
    }
    let usage_chunk = match parts.usage {
        Some(usage) if !saw_usage => {
            let object = if parts.completions {
                "text_completion"
            } else {
                "chat.completion.chunk"
            };
            let mut chunk = serde_json::json!({"id": "", "object": object, "created": 0,
                "model": parts.body.get("model").cloned().unwrap_or(Value::Null)});
            if let Some(fp) = parts.body.get("system_fingerprint") {
                chunk["system_fingerprint"] = fp.clone();
            }
            chunk["choices"] = serde_json::json!([]);
            chunk["usage"] = usage.clone();
            let mut t = Template::default();
            // Never read back: its identities are the hit's own.
            t.push_marked(&sse_marked(&chunk), (u32::MAX, u32::MAX));
            Some(t)
        }
        _ => None,
    };
    let mut body = Template::default();
    let mut raw = Vec::with_capacity(1024);
    write_marked(parts.body, &mut raw);
    body.push_marked(&raw, identities.of(parts.body));
    Record {
        id: parts.id,
        key: parts.key,
        partition: parts.partition,
        created_at_ms: parts.created_at_ms,
        ttl_ms: parts.ttl_ms,
        ttft_cost_ms: parts.ttft_cost_ms,
        events,
        stream,
        usage_chunk,
        body,
        identities: identities.values,
    }
}

/// A record of named events (the Responses API, Anthropic's Messages API): each event is
/// `event: <its type>\ndata: <json>\n\n`, and the stream ends with its last event; no `[DONE]`
/// follows, and `include_usage` does not apply (usage is in the events).
///
/// A Responses API record has no holes at all: a hit serves the stored response with its
/// original ids (so that a conversation continued from it with `previous_response_id`, and
/// `GET /v1/responses/{id}`, reach the response the provider stored). An Anthropic message
/// (`message_ids`) is kept nowhere upstream, so a hit gets a fresh id like a chat completion: the
/// body's top-level `id` and the `id` of `message_start`'s `message` are holes.
fn build_named(parts: Parts<'_>) -> Record {
    let mut identities = Identities::default();
    let mut stream = Template::default();
    let mut events = Vec::with_capacity(parts.events.len());
    let mut raw = Vec::with_capacity(1024);
    for (offset_ms, data) in &parts.events {
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        stream.text.extend_from_slice(b"event: ");
        stream.text.extend_from_slice(kind.as_bytes());
        stream.text.extend_from_slice(b"\ndata: ");
        match (parts.message_ids, kind, data.as_object()) {
            (true, "message_start", Some(obj)) => {
                // Written as serde_json writes it, with the message's identity marked.
                raw.clear();
                raw.push(b'{');
                for (i, (k, v)) in obj.iter().enumerate() {
                    if i > 0 {
                        raw.push(b',');
                    }
                    let _ = serde_json::to_writer(&mut raw, k);
                    raw.push(b':');
                    if k == "message" {
                        write_marked(v, &mut raw);
                    } else {
                        let _ = serde_json::to_writer(&mut raw, v);
                    }
                }
                raw.push(b'}');
                let ident = identities.of(obj.get("message").unwrap_or(&Value::Null));
                stream.push_marked(&raw, ident);
            }
            _ => {
                let _ = serde_json::to_writer(&mut stream.text, data);
            }
        }
        stream.text.extend_from_slice(b"\n\n");
        events.push(Event {
            text_end: stream.text.len() as u32,
            holes_end: stream.holes.len() as u32,
            offset_ms: *offset_ms,
            tokens: named_event_tokens(data),
            had_usage: false,
        });
    }
    let body = if parts.message_ids {
        let mut body = Template::default();
        raw.clear();
        write_marked(parts.body, &mut raw);
        body.push_marked(&raw, identities.of(parts.body));
        body
    } else {
        Template {
            text: serde_json::to_vec(parts.body).unwrap_or_default(),
            holes: Vec::new(),
        }
    };
    Record {
        id: parts.id,
        key: parts.key,
        partition: parts.partition,
        created_at_ms: parts.created_at_ms,
        ttl_ms: parts.ttl_ms,
        ttft_cost_ms: parts.ttft_cost_ms,
        events,
        stream,
        usage_chunk: None,
        body,
        identities: identities.values,
    }
}

/// About one token for each delta event of a Responses API stream that carries text, and for
/// each `content_block_delta` of an Anthropic Messages stream that carries text, thinking or tool
/// input (a `signature_delta` is not a token).
pub fn named_event_tokens(event: &Value) -> u32 {
    let kind = event.get("type").and_then(Value::as_str).unwrap_or("");
    if kind == "content_block_delta" {
        let delta = event.get("delta");
        let carried = ["text", "thinking", "partial_json"].iter().any(|field| {
            delta
                .and_then(|d| d.get(*field))
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        });
        return u32::from(carried);
    }
    let delta = kind.starts_with("response.")
        && kind.ends_with(".delta")
        && !kind.starts_with("response.audio.transcript");
    u32::from(delta && event.get("delta").is_some_and(|d| d != "" && !d.is_null()))
}

impl Record {
    /// A Responses API record: its events are named (`event:` lines), and its stream ends with
    /// its last event, without `[DONE]`.
    pub fn named_events(&self) -> bool {
        self.stream.text.starts_with(b"event: ")
    }

    /// Bytes `[from, to)` of the stream text and holes of events `from..to`.
    pub fn event_ranges(&self, from: usize, to: usize) -> (Range<usize>, Range<usize>) {
        let start = |i: usize| {
            i.checked_sub(1)
                .and_then(|p| self.events.get(p))
                .map_or((0, 0), |e| (e.text_end as usize, e.holes_end as usize))
        };
        let (t0, h0) = start(from);
        let (t1, h1) = start(to);
        (t0..t1, h0..h1)
    }

    /// Whether the stream holds a usage-only chunk (a `usage` object and no choices), which a
    /// hit sends only to a client that asked for usage. [`build`] stores such a chunk as one
    /// `WITH_USAGE` span spanning its whole event; any other chunk also has bytes sent without
    /// usage. A chunk's `"usage": null` member (some servers send one on every chunk, asked or not)
    /// is not usage. Looked for from the end, where a stream puts it.
    pub fn has_usage_chunk(&self) -> bool {
        (0..self.events.len()).rev().any(|i| {
            let (text, holes) = self.event_ranges(i, i + 1);
            self.events[i].had_usage
                && self.stream.holes.get(holes.start).is_some_and(|h| {
                    h.kind == hole::WITH_USAGE
                        && h.pos as usize == text.start
                        && h.len as usize == text.len()
                        && !text.is_empty()
                })
        })
    }

    /// The original chunks and body, as they were stored: `(offset ms, chunk)` and the body.
    pub fn original(&self) -> Result<(Vec<(f64, Value)>, Value), String> {
        let identity = Identity::Original(&self.identities);
        let mut events = Vec::with_capacity(self.events.len());
        let mut out = Vec::new();
        for (i, event) in self.events.iter().enumerate() {
            out.clear();
            let (text, holes) = self.event_ranges(i, i + 1);
            self.stream
                .render(text, holes, event.had_usage, identity, &mut out);
            // A named event's `event:` line is its data's `type`: read back from the data.
            let framed = match out.strip_prefix(b"event: ") {
                Some(rest) => rest
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(&rest[..0], |at| &rest[at + 1..]),
                None => &out[..],
            };
            let json = framed
                .strip_prefix(b"data: ")
                .and_then(|r| r.strip_suffix(b"\n\n"))
                .ok_or_else(|| format!("event {i} is not framed"))?;
            let data = serde_json::from_slice(json).map_err(|e| format!("event {i}: {e}"))?;
            events.push((event.offset_ms, data));
        }
        let body = serde_json::from_slice(&self.body.render_all(false, identity))
            .map_err(|e| format!("body: {e}"))?;
        Ok((events, body))
    }

    /// The record as stored (little-endian throughout).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.stream.text.len() + self.body.text.len() + 512);
        out.push(RECORD_FORMAT);
        out.extend_from_slice(&self.id.to_le_bytes());
        out.extend_from_slice(&self.key);
        out.extend_from_slice(&self.partition);
        out.extend_from_slice(&self.created_at_ms.to_le_bytes());
        out.extend_from_slice(&self.ttl_ms.to_le_bytes());
        out.push(u8::from(self.ttft_cost_ms.is_some()));
        out.extend_from_slice(&self.ttft_cost_ms.unwrap_or(0.0).to_le_bytes());
        out.extend_from_slice(&(self.events.len() as u32).to_le_bytes());
        for e in &self.events {
            out.extend_from_slice(&e.text_end.to_le_bytes());
            out.extend_from_slice(&e.holes_end.to_le_bytes());
            out.extend_from_slice(&e.offset_ms.to_le_bytes());
            out.extend_from_slice(&e.tokens.to_le_bytes());
            out.push(u8::from(e.had_usage));
        }
        encode_template(&self.stream, &mut out);
        out.push(u8::from(self.usage_chunk.is_some()));
        if let Some(t) = &self.usage_chunk {
            encode_template(t, &mut out);
        }
        encode_template(&self.body, &mut out);
        out.extend_from_slice(&(self.identities.len() as u32).to_le_bytes());
        for v in &self.identities {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
        out
    }

    /// Reads an encoded record, checking that every offset stays inside its template.
    pub fn decode(raw: &[u8]) -> Result<Self, String> {
        let mut r = Reader { raw, at: 0 };
        let format = r.u8()?;
        if format != RECORD_FORMAT {
            return Err(format!("unknown replay record format {format}"));
        }
        let id = r.u64()?;
        let key = r.array()?;
        let partition = r.array()?;
        let created_at_ms = r.u64()?;
        let ttl_ms = r.u64()?;
        let has_cost = r.u8()? != 0;
        let cost = r.f64()?;
        let n = r.u32()? as usize;
        let mut events = Vec::with_capacity(n.min(r.remaining() / 21));
        for _ in 0..n {
            events.push(Event {
                text_end: r.u32()?,
                holes_end: r.u32()?,
                offset_ms: r.f64()?,
                tokens: r.u32()?,
                had_usage: r.u8()? != 0,
            });
        }
        let stream = r.template()?;
        let mut last = (0, 0);
        for e in &events {
            if e.text_end < last.0
                || e.holes_end < last.1
                || e.text_end as usize > stream.text.len()
                || e.holes_end as usize > stream.holes.len()
            {
                return Err("event offsets out of order".into());
            }
            last = (e.text_end, e.holes_end);
        }
        let usage_chunk = if r.u8()? != 0 {
            Some(r.template()?)
        } else {
            None
        };
        let body = r.template()?;
        let n = r.u32()? as usize;
        let mut identities = Vec::with_capacity(n.min(r.remaining() / 4));
        for _ in 0..n {
            let len = r.u32()? as usize;
            identities.push(r.bytes(len)?.to_vec());
        }
        if r.remaining() != 0 {
            return Err("trailing bytes".into());
        }
        Ok(Self {
            id,
            key,
            partition,
            created_at_ms,
            ttl_ms,
            ttft_cost_ms: has_cost.then_some(cost),
            events,
            stream,
            usage_chunk,
            body,
            identities,
        })
    }
}

fn encode_template(t: &Template, out: &mut Vec<u8>) {
    out.extend_from_slice(&(t.text.len() as u32).to_le_bytes());
    out.extend_from_slice(&t.text);
    out.extend_from_slice(&(t.holes.len() as u32).to_le_bytes());
    for h in &t.holes {
        out.extend_from_slice(&h.pos.to_le_bytes());
        out.extend_from_slice(&h.len.to_le_bytes());
        out.push(h.kind);
        out.extend_from_slice(&h.arg.to_le_bytes());
    }
}

struct Reader<'a> {
    raw: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.raw.len() - self.at
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.raw.len());
        let end = end.ok_or_else(|| "replay record cut short".to_owned())?;
        let out = &self.raw[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let b = self.bytes(N)?;
        b.try_into()
            .map_err(|_| "replay record cut short".to_owned())
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_le_bytes(self.array()?))
    }

    fn template(&mut self) -> Result<Template, String> {
        let len = self.u32()? as usize;
        let text = self.bytes(len)?.to_vec();
        let n = self.u32()? as usize;
        let mut holes = Vec::with_capacity(n.min(self.remaining() / 13));
        for _ in 0..n {
            let h = Hole {
                pos: self.u32()?,
                len: self.u32()?,
                kind: self.u8()?,
                arg: self.u32()?,
            };
            let end = h.pos as usize + h.len as usize;
            let spans = matches!(h.kind, hole::WITH_USAGE | hole::WITHOUT_USAGE);
            if !(hole::ID..=hole::WITHOUT_USAGE).contains(&h.kind)
                || end > text.len()
                || (spans && h.arg as usize > n)
                || holes.last().is_some_and(|p: &Hole| p.pos > h.pos)
            {
                return Err("replay record hole out of place".into());
            }
            holes.push(h);
        }
        Ok(Template { text, holes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parts<'a>(events: &'a [Value], body: &'a Value, usage: Option<&'a Value>) -> Parts<'a> {
        Parts {
            id: 9,
            key: [1; 32],
            partition: [2; 32],
            created_at_ms: 5,
            ttl_ms: 6,
            ttft_cost_ms: Some(1.5),
            completions: false,
            named_events: false,
            message_ids: false,
            events: events
                .iter()
                .enumerate()
                .map(|(i, e)| (i as f64, e))
                .collect(),
            body,
            usage,
        }
    }

    #[test]
    fn a_record_encodes_decodes_and_reads_back_its_original() {
        let events = vec![
            json!({"id": "c1", "created": 7, "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi \u{1}"}}]}),
            json!({"id": "c1", "created": 7, "choices": [{"index": 0, "delta": {}}], "usage": null}),
            json!({"id": 3, "created": 7.5, "choices": [], "usage": {"total_tokens": 2}}),
            json!(["not", "an", "object"]),
        ];
        let body = json!({"id": "c1", "created": 7, "choices": [{"message": {"content": "Hi"}}]});
        let usage = json!({"total_tokens": 2});
        let record = build(parts(&events, &body, Some(&usage)));
        assert!(record.usage_chunk.is_none(), "the stream had a usage chunk");
        let decoded = Record::decode(&record.encode()).expect("decode");
        assert_eq!(decoded, record);
        let (original, original_body) = decoded.original().expect("original");
        let want: Vec<(f64, Value)> = events
            .iter()
            .cloned()
            .enumerate()
            .map(|(i, e)| (i as f64, e))
            .collect();
        assert_eq!(original, want);
        assert_eq!(original_body, body);
        // Every prefix of a record is refused, not misread.
        let raw = record.encode();
        for cut in 0..raw.len() {
            assert!(Record::decode(&raw[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn named_events_keep_their_names_and_ids_and_read_back() {
        let events = vec![
            json!({"type": "response.created", "sequence_number": 0, "response": {"id": "resp_1", "status": "in_progress"}}),
            json!({"type": "response.output_text.delta", "sequence_number": 1, "delta": "Hi"}),
            json!({"type": "response.completed", "sequence_number": 2, "response": {"id": "resp_1", "status": "completed"}}),
        ];
        let body = json!({"id": "resp_1", "created_at": 7, "status": "completed"});
        let mut p = parts(&events, &body, None);
        p.named_events = true;
        let record = build(p);
        assert!(record.named_events());
        assert!(record.stream.holes.is_empty() && record.body.holes.is_empty());
        let tokens: Vec<u32> = record.events.iter().map(|e| e.tokens).collect();
        assert_eq!(tokens, [0, 1, 0]);
        let text = String::from_utf8_lossy(&record.stream.text).into_owned();
        assert!(
            text.starts_with("event: response.created\ndata: {"),
            "{text}"
        );
        assert!(
            text.ends_with("\"type\":\"response.completed\"}\n\n"),
            "{text}"
        );
        let decoded = Record::decode(&record.encode()).expect("decode");
        let (original, original_body) = decoded.original().expect("original");
        assert_eq!(
            original.into_iter().map(|(_, e)| e).collect::<Vec<_>>(),
            events
        );
        assert_eq!(original_body, body);
        let fresh = Identity::Fresh {
            id: b"\"new\"",
            created: b"9",
        };
        assert_eq!(
            record.body.render_all(false, fresh),
            serde_json::to_vec(&body).expect("json")
        );
    }

    #[test]
    fn an_anthropic_message_renews_its_id_and_reads_back() {
        let events = vec![
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "content": []}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
            json!({"type": "message_stop"}),
        ];
        let body =
            json!({"id": "msg_1", "type": "message", "content": [{"type": "text", "text": "Hi"}]});
        let mut p = parts(&events, &body, None);
        p.named_events = true;
        p.message_ids = true;
        let record = build(p);
        assert!(record.named_events());
        let tokens: Vec<u32> = record.events.iter().map(|e| e.tokens).collect();
        assert_eq!(tokens, [0, 1, 0]);
        let decoded = Record::decode(&record.encode()).expect("decode");
        let (original, original_body) = decoded.original().expect("original");
        assert_eq!(
            original.into_iter().map(|(_, e)| e).collect::<Vec<_>>(),
            events
        );
        assert_eq!(original_body, body);
        let fresh = Identity::Fresh {
            id: b"\"msg_new\"",
            created: b"9",
        };
        let rendered: Value =
            serde_json::from_slice(&record.body.render_all(false, fresh)).expect("json");
        assert_eq!(rendered["id"], "msg_new");
        assert_eq!(rendered["content"], body["content"]);
        let stream = String::from_utf8(record.stream.render_all(false, fresh)).expect("utf-8");
        assert!(
            stream.starts_with(
                "event: message_start\ndata: {\"message\":{\"content\":[],\"id\":\"msg_new\","
            ),
            "{stream}"
        );
        assert!(!stream.contains("msg_1"), "{stream}");
    }

    #[test]
    fn holes_take_fresh_identities_and_usage_spans_follow_the_client() {
        let events = vec![
            json!({"id": "c1", "created": 7, "choices": [{"index": 0, "delta": {"content": "x"}}]}),
        ];
        let body = json!({"id": "c1", "created": 7, "choices": []});
        let record = build(parts(&events, &body, None));
        let fresh = Identity::Fresh {
            id: b"\"new\"",
            created: b"99",
        };
        let (t, h) = record.event_ranges(0, 1);
        let mut plain = Vec::new();
        record
            .stream
            .render(t.clone(), h.clone(), false, fresh, &mut plain);
        assert_eq!(
            String::from_utf8_lossy(&plain),
            "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"index\":0}],\"created\":99,\"id\":\"new\"}\n\n"
        );
        let mut usage = Vec::new();
        record.stream.render(t, h, true, fresh, &mut usage);
        assert_eq!(
            String::from_utf8_lossy(&usage),
            "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"index\":0}],\"created\":99,\"id\":\"new\",\"usage\":null}\n\n"
        );
        assert_eq!(
            record.body.render_all(false, fresh),
            b"{\"choices\":[],\"created\":99,\"id\":\"new\"}"
        );
    }

    /// A usage-only chunk is usage; `"usage": null` on every chunk (asked or not, as some servers
    /// send it) is not, nor is a usage member on a chunk with choices when no usage-only chunk
    /// follows (the body's usage then becomes a chunk of its own, `usage_chunk`).
    #[test]
    fn only_a_usage_only_chunk_counts_as_the_streams_usage() {
        let usage = json!({"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4});
        let text = |u: Value| {
            json!({"id": "c1", "created": 7, "usage": u,
                "choices": [{"index": 0, "delta": {"content": "x"}}]})
        };
        let usage_only = json!({"id": "c1", "created": 7, "choices": [], "usage": usage});
        let body = json!({"id": "c1", "created": 7, "choices": []});
        let nulls = [text(Value::Null), text(Value::Null)];
        assert!(!build(parts(&nulls, &body, None)).has_usage_chunk());
        let plain = [json!({"id": "c1", "created": 7, "choices": []})];
        assert!(!build(parts(&plain, &body, None)).has_usage_chunk());
        let asked = [text(Value::Null), usage_only.clone()];
        let record = build(parts(&asked, &body, Some(&usage)));
        assert!(record.has_usage_chunk() && record.usage_chunk.is_none());
        // Read back from its bytes, as a lookup sees it.
        assert!(Record::decode(&record.encode())
            .expect("decode")
            .has_usage_chunk());
        let inline = [text(usage.clone())];
        let record = build(parts(&inline, &body, Some(&usage)));
        assert!(!record.has_usage_chunk() && record.usage_chunk.is_some());
    }
}
