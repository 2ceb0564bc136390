//! The simulated judge: answers the gateway's judge calls (`--verify judge`, the protocol in the
//! README's "The judge call") from labeled pairs instead of a model, wrong on purpose at a stated,
//! seeded rate. It reads only the JSON block the protocol defines, never the instruction's prose,
//! and must never be mistaken for a measure of a real judge model's accuracy.
//!
//! - A chat completion is a judge call iff the last `user` message holds, between its first
//!   "```json\n" and the following "\n```", a JSON object with a `reprise_judge` key. Anything else
//!   (no block, a block that is not JSON or not such an object) is an ordinary chat request.
//! - The verdict is the label of the unordered pair (`cached`, `new`), looked up by normalized text
//!   (trimmed, whitespace runs collapsed to one space, case kept). A pair the labels do not hold is
//!   `different` and never flipped; a block without string `cached` and `new` is `unsure`.
//! - `accuracy` P: a known pair's verdict is flipped (same <-> different) iff a hash of (seed, the
//!   two normalized texts in sorted order), read as a number in [0, 1), is ≥ P. The same pair thus
//!   gets the same verdict at any concurrency, in any order, in either direction.

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;
use serde_json::{json, Value};

use crate::text::{self, Event, Ids};

/// What the judge answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Same,
    Different,
    Unsure,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Same => "same",
            Self::Different => "different",
            Self::Unsure => "unsure",
        }
    }

    /// The message content of the answer, as the protocol spells it.
    pub fn content(self) -> String {
        format!("{{\"verdict\":\"{}\"}}", self.as_str())
    }
}

/// The two texts of a judge call; `None` each when the block lacks it (or it is not a string).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgeCall {
    pub cached: Option<String>,
    pub new: Option<String>,
}

/// Recognises a judge call in a chat completion request (see the module comment).
pub fn judge_call(request: &Value) -> Option<JudgeCall> {
    let messages = request.get("messages")?.as_array()?;
    let last_user = messages
        .iter()
        .rev()
        .find(|m| m.get("role").and_then(Value::as_str) == Some("user"))?;
    let content = content_text(last_user.get("content")?)?;
    let start = content.find("```json\n")? + "```json\n".len();
    let end = start + content[start..].find("\n```")?;
    let block: Value = serde_json::from_str(&content[start..end]).ok()?;
    let object = block.as_object()?;
    object.get("reprise_judge")?;
    let text = |key: &str| object.get(key).and_then(Value::as_str).map(str::to_owned);
    Some(JudgeCall {
        cached: text("cached"),
        new: text("new"),
    })
}

/// A message's text: a string, or the `text` of its content parts joined (as OpenAI allows).
fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => Some(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        ),
        _ => None,
    }
}

/// Trimmed, every whitespace run one space; case is kept (labels and prompts are the same text).
pub fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The two normalized texts in sorted order: the key of an unordered pair.
fn key(a: &str, b: &str) -> (String, String) {
    let (a, b) = (normalize(a), normalize(b));
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

/// Labeled pairs by unordered normalized text: `true` when one answer serves both.
#[derive(Clone, Default, PartialEq)]
pub struct JudgeLabels {
    pairs: HashMap<(String, String), bool>,
}

/// The count only: the binary logs its config at start, and the pairs are a data set's text.
impl std::fmt::Debug for JudgeLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JudgeLabels({} pairs)", self.pairs.len())
    }
}

impl JudgeLabels {
    /// Reads a JSON Lines file in the eval's format (see [`JudgeLabels::parse`]).
    pub fn read_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}:{e}", path.display()))
    }

    /// One object a line with `a`, `b` (a string, or chat messages: the final message's content is
    /// the text), `same_answer` and optionally `ambiguous` (`true` or a reason: then `different`,
    /// the eval's strict default). Other fields are ignored, blank lines skipped. A pair labeled
    /// both ways (two lines, or two contexts with the same final texts) is `different`.
    /// Errors read `LINE: message`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut pairs: HashMap<(String, String), bool> = HashMap::new();
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let invalid = |message: &str| format!("{}: {message}", index + 1);
            let value: Value =
                serde_json::from_str(line).map_err(|e| invalid(&format!("not valid JSON: {e}")))?;
            let side = |name: &str| -> Result<String, String> {
                label_text(value.get(name))
                    .ok_or_else(|| invalid(&format!("`{name}` must be a string or chat messages")))
            };
            let (a, b) = (side("a")?, side("b")?);
            let labeled = value
                .get("same_answer")
                .and_then(Value::as_bool)
                .ok_or_else(|| invalid("`same_answer` must be true or false"))?;
            let ambiguous = match value.get("ambiguous") {
                None | Some(Value::Null) | Some(Value::Bool(false)) => false,
                Some(Value::Bool(true)) => true,
                Some(Value::String(s)) => !s.trim().is_empty(),
                Some(_) => return Err(invalid("`ambiguous` must be a string or a boolean")),
            };
            let same = labeled && !ambiguous;
            pairs
                .entry(key(&a, &b))
                .and_modify(|v| *v &= same)
                .or_insert(same);
        }
        Ok(Self { pairs })
    }

    /// Labels from (a, b, same_answer) triples, for tests that build them in code.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str, bool)>) -> Self {
        let mut labels = Self::default();
        for (a, b, same) in pairs {
            labels
                .pairs
                .entry(key(a, b))
                .and_modify(|v| *v &= same)
                .or_insert(same);
        }
        labels
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The label of the unordered pair, `None` when it is not labeled.
    pub fn get(&self, a: &str, b: &str) -> Option<bool> {
        self.pairs.get(&key(a, b)).copied()
    }
}

/// The text a pair side stands for: a string, or the content of its last chat message.
fn label_text(side: Option<&Value>) -> Option<String> {
    match side? {
        Value::String(s) => Some(s.clone()),
        Value::Array(messages) => content_text(messages.last()?.get("content")?),
        _ => None,
    }
}

/// A number in [0, 1) fixed by the seed and the unordered pair: the draw that decides a flip.
pub fn draw(seed: u64, a: &str, b: &str) -> f64 {
    let (first, second) = key(a, b);
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"reprise-sim judge flip v1\0");
    hasher.update(&seed.to_le_bytes());
    // Length-prefixed, so ("ab", "c") and ("a", "bc") never hash alike.
    for text in [&first, &second] {
        hasher.update(&(text.len() as u64).to_le_bytes());
        hasher.update(text.as_bytes());
    }
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&hasher.finalize().as_bytes()[..8]);
    // The top 53 bits: every value exactly representable, strictly below 1.
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

/// The verdict on a judge call, given the labels (none: every pair is unknown), the accuracy and
/// the seed.
pub fn verdict(
    call: &JudgeCall,
    labels: Option<&JudgeLabels>,
    accuracy: f64,
    seed: u64,
) -> Verdict {
    let (Some(cached), Some(new)) = (&call.cached, &call.new) else {
        return Verdict::Unsure;
    };
    let Some(same) = labels.and_then(|l| l.get(cached, new)) else {
        return Verdict::Different;
    };
    let flipped = draw(seed, cached, new) >= accuracy;
    if same != flipped {
        Verdict::Same
    } else {
        Verdict::Different
    }
}

/// Usage of a judge answer: the prompt counted as every other answer counts it, the verdict's
/// JSON as its completion (5 or 6 tokens at 4 characters a token).
fn usage(verdict: Verdict, prompt_tokens: u64) -> Value {
    let completion = text::estimate_tokens(&verdict.content());
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion
    })
}

/// The non-streamed answer: a `chat.completion` whose content is the verdict's JSON.
pub(crate) fn full_body(verdict: Verdict, ids: &Ids, prompt_tokens: u64) -> Value {
    json!({
        "id": ids.id,
        "object": "chat.completion",
        "created": ids.created,
        "model": ids.model,
        "system_fingerprint": "fp_reprise_sim",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": verdict.content(), "refusal": null},
            "logprobs": null,
            "finish_reason": "stop"
        }],
        "usage": usage(verdict, prompt_tokens),
    })
}

/// The same answer streamed: role, the verdict's JSON in one delta, finish, usage when asked, `[DONE]`.
pub(crate) fn stream_events(
    verdict: Verdict,
    ids: &Ids,
    prompt_tokens: u64,
    include_usage: bool,
) -> Vec<Event> {
    let chunk = |choices: Value| {
        let mut v = json!({
            "id": ids.id,
            "object": "chat.completion.chunk",
            "created": ids.created,
            "model": ids.model,
            "system_fingerprint": "fp_reprise_sim",
            "choices": choices,
        });
        if include_usage {
            v["usage"] = Value::Null;
        }
        v
    };
    let delta = |delta: Value, finish: Value| json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]);
    let mut events = vec![
        Event::Immediate(text::sse(&chunk(delta(
            json!({"role": "assistant", "content": "", "refusal": null}),
            Value::Null,
        )))),
        Event::Token(text::sse(&chunk(delta(
            json!({"content": verdict.content()}),
            Value::Null,
        )))),
        Event::Immediate(text::sse(&chunk(delta(json!({}), json!("stop"))))),
    ];
    if include_usage {
        let mut last = chunk(json!([]));
        last["usage"] = usage(verdict, prompt_tokens);
        events.push(Event::Immediate(text::sse(&last)));
    }
    events.push(Event::Immediate(Bytes::from_static(b"data: [DONE]\n\n")));
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A request whose last user message carries `block` as the protocol writes it.
    fn request_with(block: &Value) -> Value {
        json!({"model": "j", "messages": [
            {"role": "system", "content": "You check whether a cached answer can be reused."},
            {"role": "user", "content": format!("```json\n{block}\n```")}
        ]})
    }

    fn call(cached: &str, new: &str) -> JudgeCall {
        JudgeCall {
            cached: Some(cached.into()),
            new: Some(new.into()),
        }
    }

    #[test]
    fn a_judge_call_is_the_block_of_the_last_user_message() {
        let block = json!({"reprise_judge": 1, "system": null, "context": null, "cached": "A\nB", "new": "C"});
        assert_eq!(judge_call(&request_with(&block)), Some(call("A\nB", "C")));
        // Content parts are read like a string.
        let parts = json!({"model": "j", "messages": [{"role": "user", "content": [
            {"type": "text", "text": format!("```json\n{block}\n```")}
        ]}]});
        assert_eq!(judge_call(&parts), Some(call("A\nB", "C")));
        // A block in an earlier user message is not the judge's: the last user message decides.
        let earlier = json!({"model": "j", "messages": [
            {"role": "user", "content": format!("```json\n{block}\n```")},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "and now?"}
        ]});
        assert_eq!(judge_call(&earlier), None);
    }

    #[test]
    fn malformed_blocks_are_ordinary_requests() {
        let plain = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(judge_call(&plain), None);
        for content in [
            "```json\n{\"reprise_judge\": 1, \"cached\": \"a\"\n```", // not JSON
            "```json\n[1, 2]\n```",                                   // not an object
            "```json\n{\"cached\": \"a\", \"new\": \"b\"}\n```",      // no reprise_judge
            "```json\n{\"reprise_judge\": 1}",                        // no closing fence
            "{\"reprise_judge\": 1, \"cached\": \"a\", \"new\": \"b\"}", // no fence at all
        ] {
            let request = json!({"model": "m", "messages": [{"role": "user", "content": content}]});
            assert_eq!(judge_call(&request), None, "{content}");
        }
        // A recognised block without the texts is a judge call the judge cannot decide.
        let missing = request_with(&json!({"reprise_judge": 1, "cached": "a"}));
        let call = judge_call(&missing).expect("a judge call");
        assert_eq!(verdict(&call, None, 1.0, 0), Verdict::Unsure);
    }

    #[test]
    fn labels_are_unordered_normalized_and_strict() {
        let text = concat!(
            r#"{"a": "How do I  reset my password?", "b": "How can I reset my password?", "same_answer": true}"#,
            "\n\n",
            r#"{"a": "Is it safe?", "b": "Is it unsafe?", "same_answer": false}"#,
            "\n",
            r#"{"a": "x", "b": "y", "same_answer": true, "ambiguous": "context_dependent"}"#,
            "\n",
            r#"{"a": [{"role":"user","content":"hi"},{"role":"assistant","content":"yo"},{"role":"user","content":"cancel it"}], "b": [{"role":"user","content":"stop it"}], "same_answer": true}"#,
            "\n",
            r#"{"a": "p", "b": "q", "same_answer": true, "ambiguous": true}"#,
        );
        let labels = JudgeLabels::parse(text).expect("valid labels");
        assert_eq!(labels.len(), 5);
        let same = |a: &str, b: &str| verdict(&call(a, b), Some(&labels), 1.0, 0);
        assert_eq!(
            same(
                " How can I reset\tmy password? ",
                "How do I reset my password?"
            ),
            Verdict::Same
        );
        assert_eq!(same("Is it unsafe?", "Is it safe?"), Verdict::Different);
        // Case is kept: another case is another text, so an unknown pair.
        assert_eq!(labels.get("is it safe?", "is it unsafe?"), None);
        assert_eq!(same("x", "y"), Verdict::Different, "ambiguous is different");
        assert_eq!(same("q", "p"), Verdict::Different, "ambiguous: true too");
        assert_eq!(
            same("stop it", "cancel it"),
            Verdict::Same,
            "final messages"
        );
        assert_eq!(same("never", "labeled"), Verdict::Different, "unknown pair");
        assert_eq!(
            verdict(
                &call(
                    "How do I reset my password?",
                    "How can I reset my password?"
                ),
                None,
                1.0,
                0
            ),
            Verdict::Different,
            "without labels every pair is unknown"
        );
    }

    #[test]
    fn a_pair_labeled_both_ways_is_different() {
        let labels = JudgeLabels::from_pairs([("a", "b", true), ("b", "a", false)]);
        assert_eq!(labels.get("a", "b"), Some(false));
    }

    #[test]
    fn bad_label_lines_name_the_line() {
        for (text, want) in [
            (
                "{\"a\":\"x\",\"b\":\"y\",\"same_answer\":true}\nnope",
                "2: not valid JSON",
            ),
            ("{\"b\":\"y\",\"same_answer\":true}", "1: `a` must be"),
            (
                "{\"a\":\"x\",\"b\":3,\"same_answer\":true}",
                "1: `b` must be",
            ),
            ("{\"a\":\"x\",\"b\":\"y\"}", "1: `same_answer` must be"),
            (
                "{\"a\":\"x\",\"b\":\"y\",\"same_answer\":true,\"ambiguous\":3}",
                "1: `ambiguous`",
            ),
        ] {
            let err = JudgeLabels::parse(text).expect_err("invalid");
            assert!(err.starts_with(want), "{text}: {err}");
        }
    }

    /// 2,000 synthetic pairs, half of them same: at accuracy P about 1 - P of the verdicts are
    /// wrong, both ways, and unknown pairs are never flipped.
    #[test]
    fn accuracy_flips_about_the_stated_share() {
        let texts: Vec<(String, String, bool)> = (0..2000)
            .map(|i| {
                (
                    format!("question {i} a"),
                    format!("question {i} b"),
                    i % 2 == 0,
                )
            })
            .collect();
        let labels =
            JudgeLabels::from_pairs(texts.iter().map(|(a, b, s)| (a.as_str(), b.as_str(), *s)));
        for accuracy in [0.9, 0.95, 0.98] {
            let mut wrong = [0usize; 2];
            for (a, b, same) in &texts {
                let v = verdict(&call(a, b), Some(&labels), accuracy, 7);
                assert_ne!(v, Verdict::Unsure);
                if (v == Verdict::Same) != *same {
                    wrong[usize::from(*same)] += 1;
                }
            }
            let share = (wrong[0] + wrong[1]) as f64 / texts.len() as f64;
            // Binomial sd at n = 2000 is under 0.007: 0.025 is over 3.5 sd, and the draw is fixed.
            assert!(
                (share - (1.0 - accuracy)).abs() < 0.025,
                "{accuracy}: {share}"
            );
            assert!(
                wrong[0] > 0 && wrong[1] > 0,
                "{accuracy}: both ways {wrong:?}"
            );
        }
        for (a, b, _) in &texts {
            let unknown = call(&format!("{a}?"), b);
            assert_eq!(verdict(&unknown, Some(&labels), 0.0, 7), Verdict::Different);
        }
        // Accuracy 1 never flips, 0 always does.
        for (a, b, same) in texts.iter().take(50) {
            let right = if *same {
                Verdict::Same
            } else {
                Verdict::Different
            };
            assert_eq!(verdict(&call(a, b), Some(&labels), 1.0, 3), right);
            assert_ne!(verdict(&call(a, b), Some(&labels), 0.0, 3), right);
        }
    }

    #[test]
    fn flips_depend_on_seed_and_pair_only() {
        let pairs: Vec<(String, String)> = (0..500)
            .map(|i| (format!("q{i}  one"), format!("q{i} two")))
            .collect();
        let flipped = |seed: u64, reversed: bool| -> Vec<bool> {
            pairs
                .iter()
                .map(|(a, b)| {
                    let (x, y) = if reversed { (b, a) } else { (a, b) };
                    draw(seed, x, y) >= 0.9
                })
                .collect()
        };
        assert_eq!(flipped(1, false), flipped(1, true), "order does not matter");
        assert_eq!(flipped(1, false), flipped(1, false), "reproducible");
        assert_ne!(flipped(1, false), flipped(2, false), "the seed does");
        // Normalization happens before the draw: whitespace does not move it.
        assert_eq!(draw(5, "q1  one", "q1 two"), draw(5, " q1 one", "q1\ntwo "));
        assert!((0.0..1.0).contains(&draw(0, "", "")));
    }

    #[test]
    fn verdict_content_is_the_protocols_json() {
        for v in [Verdict::Same, Verdict::Different, Verdict::Unsure] {
            let parsed: Value = serde_json::from_str(&v.content()).expect("json");
            assert_eq!(parsed, json!({"verdict": v.as_str()}));
        }
    }
}
