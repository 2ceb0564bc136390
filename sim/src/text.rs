//! Deterministic answers for the simulator: words picked by a hash of the prompt, shaped as OpenAI
//! chat or legacy-completion bodies and stream chunks.

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde_json::{json, Value};

use super::Fault;

pub(crate) const VOCAB: &[&str] = &[
    "cache", "token", "stream", "answer", "latency", "prefill", "decode", "vector", "gateway",
    "request", "prompt", "reply", "index", "store", "model", "replay", "signal", "river", "garden",
    "window", "copper", "silver", "orbit", "harbor", "meadow", "lantern", "paper", "pencil",
    "marble", "engine", "bridge", "canyon", "forest", "planet", "circuit", "kernel", "buffer",
    "socket", "thread", "queue", "shard", "ledger", "beacon", "compass", "anchor", "timber",
    "quartz", "falcon", "summit", "valley", "ember", "glacier", "harvest", "island", "jungle",
    "lagoon", "mirror", "nectar", "oasis", "pepper", "quiver", "rocket", "saddle", "tundra",
];

/// `n` words drawn from `reader`, as streamed tokens: the first capitalized, the others with
/// their leading space.
pub(crate) fn words(reader: &mut blake3::OutputReader, n: u32) -> Vec<String> {
    (0..n)
        .map(|i| {
            let mut b = [0u8; 2];
            reader.fill(&mut b);
            let word = VOCAB[usize::from(u16::from_le_bytes(b)) % VOCAB.len()];
            if i == 0 {
                let mut w = word.to_owned();
                w[..1].make_ascii_uppercase();
                w
            } else {
                format!(" {word}")
            }
        })
        .collect()
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A rough token count (4 characters a token), enough for prefill pacing and `usage`.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4).max(1)
}

/// A unit-length vector derived from the text: equal texts get equal vectors, nothing more.
pub fn pseudo_embedding(text: &str, dims: usize) -> Vec<f32> {
    let mut reader = blake3::Hasher::new().update(text.as_bytes()).finalize_xof();
    let mut raw = vec![0u8; dims * 2];
    reader.fill(&mut raw);
    let mut v: Vec<f32> = raw
        .chunks(2)
        .map(|b| f32::from(u16::from_le_bytes([b[0], b[1]])) / 32768.0 - 1.0)
        .collect();
    let norm = v
        .iter()
        .map(|x| x * x)
        .sum::<f32>()
        .sqrt()
        .max(f32::EPSILON);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

/// What a request asks for, reduced to what shapes the answer.
pub struct Generation {
    pub model: String,
    pub prompt_tokens: u64,
    seed: blake3::Hash,
    max_tokens: Option<u32>,
    n: u32,
    /// The function the answer must call, when `tool_choice` forces one.
    tool: Option<String>,
}

impl Generation {
    pub fn from_request(request: &Value, chat: bool) -> Result<Self, String> {
        let model = request
            .get("model")
            .and_then(Value::as_str)
            .ok_or("you must provide a model parameter")?
            .to_owned();
        let prompt = if chat {
            request
                .get("messages")
                .filter(|m| m.is_array())
                .ok_or("`messages` must be an array")?
        } else {
            request.get("prompt").ok_or("you must provide a prompt")?
        };
        let prompt_text = prompt.to_string();
        let seed = blake3::Hasher::new()
            .update(model.as_bytes())
            .update(b"\0")
            .update(prompt_text.as_bytes())
            .finalize();
        let max_tokens = request
            .get("max_completion_tokens")
            .or_else(|| request.get("max_tokens"))
            .and_then(Value::as_u64)
            .map(|t| t.min(u64::from(u32::MAX)) as u32);
        let n = request
            .get("n")
            .and_then(Value::as_u64)
            .unwrap_or(1)
            .clamp(1, 8) as u32;
        Ok(Self {
            model,
            prompt_tokens: estimate_tokens(&prompt_text),
            seed,
            max_tokens,
            n,
            tool: if chat { forced_tool(request) } else { None },
        })
    }

    /// The answer: `tokens` words per choice unless `max_tokens` is lower (then `length`).
    pub fn answer(&self, tokens: u32, fault: Option<&Fault>) -> Answer {
        let limit = self.max_tokens.map_or(tokens, |m| m.min(tokens));
        let finish = if limit < tokens { "length" } else { "stop" };
        let last = self.n.saturating_sub(1);
        let choices = (0..self.n)
            .map(|choice| {
                let mut reader = blake3::Hasher::new()
                    .update(self.seed.as_bytes())
                    .update(&choice.to_le_bytes())
                    .finalize_xof();
                let words = words(&mut reader, limit);
                match &self.tool {
                    Some(name) => {
                        let query: String = words.iter().take(3).map(String::as_str).collect();
                        let mut args = json!({"query": query.trim()}).to_string();
                        if fault == Some(&Fault::BadToolArgs) {
                            args.truncate(args.len() / 2);
                        }
                        ChoiceAnswer {
                            words: Vec::new(),
                            tool_call: Some((name.clone(), args)),
                            finish_reason: "tool_calls",
                        }
                    }
                    None => ChoiceAnswer {
                        words,
                        tool_call: None,
                        // Only the last choice: "any choice" is what a cache must look at.
                        finish_reason: if fault == Some(&Fault::ContentFilter) && choice == last {
                            "content_filter"
                        } else {
                            finish
                        },
                    },
                }
            })
            .collect();
        Answer {
            choices,
            prompt_tokens: self.prompt_tokens,
        }
    }
}

/// `tool_choice: "required"` or `{"type":"function","function":{"name":…}}` forces a call.
fn forced_tool(request: &Value) -> Option<String> {
    let tools = request.get("tools")?.as_array()?;
    let first = tools
        .first()?
        .pointer("/function/name")?
        .as_str()?
        .to_owned();
    match request.get("tool_choice") {
        Some(Value::String(s)) if s == "required" => Some(first),
        Some(Value::Object(o)) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

pub struct ChoiceAnswer {
    words: Vec<String>,
    tool_call: Option<(String, String)>,
    finish_reason: &'static str,
}

pub struct Answer {
    choices: Vec<ChoiceAnswer>,
    prompt_tokens: u64,
}

/// What a chat or legacy completions stream says of usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamUsage {
    /// Nothing: not asked for, or asked of a server that ignores `include_usage`.
    Omitted,
    /// `"usage": null` on every chunk and no usage chunk, as some OpenAI-compatible servers
    /// stream whether or not usage was asked for.
    Nulls,
    /// `"usage": null` on every chunk, then a usage-only chunk: OpenAI's answer to
    /// `stream_options.include_usage`.
    Chunk,
}

/// Identity of one response.
pub struct Ids {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// One SSE event of a simulated stream and how it is paced.
pub enum Event {
    /// A content token: leaves on the token clock, which then moves one inter-token latency on.
    Token(Bytes),
    /// Leaves as soon as the current deadline has passed (role, finish, usage, `[DONE]`).
    Immediate(Bytes),
    /// Break the connection here.
    Abort,
    /// Send nothing more and keep the connection open (until the client gives up).
    Stall,
}

/// Puts two bytes that are not UTF-8 (`0xFF 0xFE`) inside the first JSON string value after a
/// `content` or `text` key: the JSON stays well-formed byte-wise, its text does not.
pub fn with_bad_utf8(json: &[u8]) -> Bytes {
    let mut out = json.to_vec();
    for key in [&b"\"content\":\""[..], &b"\"text\":\""[..]] {
        if let Some(at) = out.windows(key.len()).position(|w| w == key) {
            let at = at + key.len();
            out.splice(at..at, [0xFF, 0xFE]);
            return Bytes::from(out);
        }
    }
    Bytes::from(out)
}

pub(crate) fn sse(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// Splits tool-call arguments the way real servers stream them: a few characters at a time.
fn fragments(args: &str) -> Vec<String> {
    let chars: Vec<char> = args.chars().collect();
    chars.chunks(8).map(|c| c.iter().collect()).collect()
}

impl Answer {
    /// Completion tokens in the answer (words, or argument fragments for a tool call).
    pub fn token_count(&self) -> u32 {
        self.choices
            .iter()
            .map(|c| match &c.tool_call {
                Some((_, args)) => fragments(args).len() as u32 + 1,
                None => c.words.len() as u32,
            })
            .max()
            .unwrap_or(0)
    }

    fn usage(&self) -> Value {
        let completion: u64 = self
            .choices
            .iter()
            .map(|c| match &c.tool_call {
                Some((_, args)) => fragments(args).len() as u64 + 1,
                None => c.words.len() as u64,
            })
            .sum();
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion
        })
    }

    /// The whole (non-streamed) response body.
    pub fn full_body(&self, ids: &Ids, chat: bool) -> Value {
        let choices: Vec<Value> = self
            .choices
            .iter()
            .enumerate()
            .map(|(index, c)| {
                let text: String = c.words.concat();
                if !chat {
                    return json!({"text": text, "index": index, "logprobs": null, "finish_reason": c.finish_reason});
                }
                let mut message = json!({"role": "assistant", "content": text, "refusal": null});
                if let Some((name, args)) = &c.tool_call {
                    message["content"] = Value::Null;
                    message["tool_calls"] = json!([{
                        "id": format!("call_sim{index}"),
                        "type": "function",
                        "function": {"name": name, "arguments": args}
                    }]);
                }
                json!({"index": index, "message": message, "logprobs": null, "finish_reason": c.finish_reason})
            })
            .collect();
        json!({
            "id": ids.id,
            "object": if chat { "chat.completion" } else { "text_completion" },
            "created": ids.created,
            "model": ids.model,
            "system_fingerprint": "fp_reprise_sim",
            "choices": choices,
            "usage": self.usage(),
        })
    }

    /// The stream, event by event, with any mid-stream fault applied.
    pub fn stream_events(
        &self,
        ids: &Ids,
        chat: bool,
        usage: StreamUsage,
        fault: Option<&Fault>,
    ) -> Vec<Event> {
        let object = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let chunk = |choices: Value| {
            let mut v = json!({
                "id": ids.id,
                "object": object,
                "created": ids.created,
                "model": ids.model,
                "system_fingerprint": "fp_reprise_sim",
                "choices": choices,
            });
            if usage != StreamUsage::Omitted {
                v["usage"] = Value::Null;
            }
            v
        };
        let mut events = Vec::new();
        if chat {
            for index in 0..self.choices.len() {
                events.push(Event::Immediate(sse(&chunk(json!([{
                    "index": index,
                    "delta": {"role": "assistant", "content": "", "refusal": null},
                    "logprobs": null,
                    "finish_reason": null
                }])))));
            }
        }
        // Per-choice token deltas, interleaved across choices.
        let per_choice: Vec<Vec<Value>> = self
            .choices
            .iter()
            .enumerate()
            .map(|(index, c)| match &c.tool_call {
                Some((name, args)) => {
                    let mut deltas = vec![json!({"index": index, "delta": {"tool_calls": [{
                        "index": 0, "id": format!("call_sim{index}"), "type": "function",
                        "function": {"name": name, "arguments": ""}
                    }]}, "logprobs": null, "finish_reason": null})];
                    for part in fragments(args) {
                        deltas.push(json!({"index": index, "delta": {"tool_calls": [{
                            "index": 0, "function": {"arguments": part}
                        }]}, "logprobs": null, "finish_reason": null}));
                    }
                    deltas
                }
                None => c
                    .words
                    .iter()
                    .map(|w| {
                        if chat {
                            json!({"index": index, "delta": {"content": w}, "logprobs": null, "finish_reason": null})
                        } else {
                            json!({"text": w, "index": index, "logprobs": null, "finish_reason": null})
                        }
                    })
                    .collect(),
            })
            .collect();
        let longest = per_choice.iter().map(Vec::len).max().unwrap_or(0);
        let mut sent = 0u32;
        for position in 0..longest {
            for deltas in &per_choice {
                if let Some(delta) = deltas.get(position) {
                    match fault {
                        Some(Fault::Cut(n)) if sent == *n => return events,
                        Some(Fault::Abort(n)) if sent == *n => {
                            events.push(Event::Abort);
                            return events;
                        }
                        Some(Fault::ErrorEvent(n)) if sent == *n => {
                            events.push(Event::Immediate(sse(&json!({"error": {
                                "message": "The server had an error while processing your request.",
                                "type": "server_error", "param": null, "code": null
                            }}))));
                            return events;
                        }
                        Some(Fault::ErrorFrame(n)) if sent == *n => {
                            events.push(Event::Immediate(Bytes::from_static(
                                b"event: error\ndata: {\"message\": \"injected error frame\"}\n\n",
                            )));
                        }
                        Some(Fault::BadUtf8(n)) if sent == *n => {
                            let bytes = sse(&chunk(json!([delta])));
                            events.push(Event::Token(with_bad_utf8(&bytes)));
                            sent += 1;
                            continue;
                        }
                        Some(Fault::Malformed(n)) if sent == *n => {
                            events.push(Event::Immediate(Bytes::from_static(
                                b"data: {\"choices\": [ this is not json\n\n",
                            )));
                        }
                        _ => {}
                    }
                    events.push(Event::Token(sse(&chunk(json!([delta])))));
                    sent += 1;
                }
            }
        }
        for (index, c) in self.choices.iter().enumerate() {
            let finish = if chat {
                json!([{"index": index, "delta": {}, "logprobs": null, "finish_reason": c.finish_reason}])
            } else {
                json!([{"text": "", "index": index, "logprobs": null, "finish_reason": c.finish_reason}])
            };
            events.push(Event::Immediate(sse(&chunk(finish))));
        }
        if usage == StreamUsage::Chunk {
            let mut last = chunk(json!([]));
            last["usage"] = self.usage();
            events.push(Event::Immediate(sse(&last)));
        }
        if fault == Some(&Fault::StallAtDone) {
            events.push(Event::Stall);
            return events;
        }
        events.push(Event::Immediate(Bytes::from_static(b"data: [DONE]\n\n")));
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generation(request: Value) -> Generation {
        Generation::from_request(&request, true).expect("valid")
    }

    #[test]
    fn same_prompt_same_words_other_prompt_other_words() {
        let a = generation(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
        let b = generation(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
        let c = generation(json!({"model": "m", "messages": [{"role": "user", "content": "yo"}]}));
        let ids = Ids {
            id: "x".into(),
            created: 0,
            model: "m".into(),
        };
        let text = |g: &Generation| {
            g.answer(16, None).full_body(&ids, true)["choices"][0]["message"]["content"].clone()
        };
        assert_eq!(text(&a), text(&b));
        assert_ne!(text(&a), text(&c));
    }

    #[test]
    fn max_tokens_caps_with_length_and_faults_shape_the_stream() {
        let g = generation(
            json!({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}),
        );
        let ids = Ids {
            id: "x".into(),
            created: 0,
            model: "m".into(),
        };
        let answer = g.answer(10, None);
        assert_eq!(answer.token_count(), 3);
        assert_eq!(
            answer.full_body(&ids, true)["choices"][0]["finish_reason"],
            "length"
        );
        let events = answer.stream_events(&ids, true, StreamUsage::Chunk, None);
        // role + 3 tokens + finish + usage + [DONE]
        assert_eq!(events.len(), 7);
        let cut = answer.stream_events(&ids, true, StreamUsage::Omitted, Some(&Fault::Cut(1)));
        assert_eq!(cut.len(), 2);
        let err = answer.stream_events(
            &ids,
            true,
            StreamUsage::Omitted,
            Some(&Fault::ErrorEvent(1)),
        );
        assert!(
            matches!(err.last(), Some(Event::Immediate(b)) if b.starts_with(b"data: {\"error\""))
        );
        // role + 3 tokens + finish + usage, then a stall where `[DONE]` would be.
        let stall = answer.stream_events(&ids, true, StreamUsage::Chunk, Some(&Fault::StallAtDone));
        assert_eq!(stall.len(), 7);
        assert!(matches!(stall.last(), Some(Event::Stall)));
        assert!(
            matches!(&stall[4], Event::Immediate(b) if b.windows(15).any(|w| w == b"\"finish_reason\""))
        );
    }

    #[test]
    fn forced_tool_calls_and_bad_arguments() {
        let g = generation(json!({
            "model": "m", "messages": [{"role": "user", "content": "weather?"}],
            "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}],
            "tool_choice": "required"
        }));
        let ids = Ids {
            id: "x".into(),
            created: 0,
            model: "m".into(),
        };
        let body = g.answer(8, None).full_body(&ids, true);
        let args = body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .expect("args")
            .to_owned();
        assert!(serde_json::from_str::<Value>(&args).is_ok());
        let bad = g.answer(8, Some(&Fault::BadToolArgs)).full_body(&ids, true);
        let bad_args = bad["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .expect("args");
        assert!(serde_json::from_str::<Value>(bad_args).is_err());
    }

    #[test]
    fn pseudo_embeddings_are_unit_length_and_stable() {
        let a = pseudo_embedding("x", 16);
        assert_eq!(a, pseudo_embedding("x", 16));
        let norm: f32 = a.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }
}
