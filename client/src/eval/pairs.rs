//! Labeled pairs for the match-quality evaluation, read from JSON Lines: one object per line with
//! `a` (the prompt that is cached), `b` (the prompt that is looked up), `same_answer`, and optionally
//! `id`, `category` (or `subtype`, as the fow-cache conversation files name it) and `ambiguous`.
//!
//! `a` and `b` are either a string (one user message) or a list of chat messages, sent as they are.
//! Parsing only checks what the evaluation relies on; it never rewrites a prompt.

use std::path::Path;

use serde_json::{Map, Value};

/// What is sent for one side of a pair.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A single user message.
    Text(String),
    /// A whole conversation, message objects as given (`role` and `content` at least).
    Messages(Vec<Value>),
}

impl Prompt {
    /// The `messages` array of a chat completion request.
    pub fn messages(&self) -> Vec<Value> {
        match self {
            Self::Text(text) => vec![serde_json::json!({"role": "user", "content": text})],
            Self::Messages(messages) => messages.clone(),
        }
    }

    /// Everything before the final message: two prompts whose contexts differ are in different
    /// cache partitions, so the gateway never compares them.
    pub fn context(&self) -> &[Value] {
        match self {
            Self::Text(_) => &[],
            Self::Messages(messages) => messages.split_last().map_or(&[], |(_, rest)| rest),
        }
    }
}

/// One labeled pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Pair {
    pub id: String,
    /// `category`, else `subtype`, else `uncategorized`; for an ambiguous pair scored as a label,
    /// the ambiguity reason (as fow-cache reports them).
    pub category: String,
    /// The file the pair came from, as given on the command line.
    pub source: String,
    /// 1-based line number in `source`.
    pub line: usize,
    pub a: Prompt,
    pub b: Prompt,
    /// Whether one answer is right for both prompts: `false` marks a trap.
    pub same_answer: bool,
}

/// How pairs marked `ambiguous` (their answer equivalence depends on the application) are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ambiguous {
    /// As traps (fow-cache's default, the strict reading).
    #[default]
    Different,
    /// As should-hit pairs.
    Same,
    /// Left out.
    Skip,
}

impl std::str::FromStr for Ambiguous {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "different" => Ok(Self::Different),
            "same" => Ok(Self::Same),
            "skip" => Ok(Self::Skip),
            other => Err(format!("`{other}` is not one of different, same, skip")),
        }
    }
}

/// A pair file that cannot be used, with the place to fix it.
#[derive(Debug, thiserror::Error)]
pub enum PairsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {message}")]
    Invalid {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}: no pairs in the file")]
    Empty { path: String },
}

/// Reads every pair of one file.
pub fn read_file(path: &Path, ambiguous: Ambiguous) -> Result<Vec<Pair>, PairsError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| PairsError::Read {
        path: name.clone(),
        source,
    })?;
    let pairs = parse(&name, &text, ambiguous)?;
    if pairs.is_empty() {
        return Err(PairsError::Empty { path: name });
    }
    Ok(pairs)
}

/// Parses JSON Lines text; `source` names it in errors and results. Blank lines are skipped.
pub fn parse(source: &str, text: &str, ambiguous: Ambiguous) -> Result<Vec<Pair>, PairsError> {
    let mut pairs = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let invalid = |message: String| PairsError::Invalid {
            path: source.to_owned(),
            line: index + 1,
            message,
        };
        let value: Value =
            serde_json::from_str(line).map_err(|err| invalid(format!("not valid JSON: {err}")))?;
        let Value::Object(object) = value else {
            return Err(invalid("a line must be a JSON object".into()));
        };
        if let Some(pair) = pair_of(&object, source, index + 1, ambiguous).map_err(invalid)? {
            pairs.push(pair);
        }
    }
    Ok(pairs)
}

/// One line's pair; `None` when it is ambiguous and ambiguous pairs are skipped.
fn pair_of(
    object: &Map<String, Value>,
    source: &str,
    line: usize,
    ambiguous: Ambiguous,
) -> Result<Option<Pair>, String> {
    let a = prompt_of(object, "a")?;
    let b = prompt_of(object, "b")?;
    let labeled = match object.get("same_answer") {
        Some(Value::Bool(v)) => *v,
        Some(_) => return Err("`same_answer` must be true or false".into()),
        None => return Err("`same_answer` is missing".into()),
    };
    let text_field = |name: &str| -> Result<Option<String>, String> {
        match object.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
            Some(_) => Err(format!("`{name}` must be a non-empty string")),
        }
    };
    let id = text_field("id")?.unwrap_or_else(|| format!("{source}:{line}"));
    let mut category = match text_field("category")? {
        Some(c) => c,
        None => text_field("subtype")?.unwrap_or_else(|| "uncategorized".to_owned()),
    };
    let mut same_answer = labeled;
    // A pair is ambiguous when `ambiguous` names a reason; `false`/null means it is not.
    let reason = match object.get("ambiguous") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => None,
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.clone()),
        Some(Value::Bool(true)) => Some("ambiguous".to_owned()),
        Some(_) => return Err("`ambiguous` must be a string (the reason) or a boolean".into()),
    };
    if let Some(reason) = reason {
        match ambiguous {
            Ambiguous::Skip => return Ok(None),
            Ambiguous::Different => same_answer = false,
            Ambiguous::Same => same_answer = true,
        }
        // Reported as their own group, so the choice never blurs a real category's figures.
        category = reason;
    }
    Ok(Some(Pair {
        id,
        category,
        source: source.to_owned(),
        line,
        a,
        b,
        same_answer,
    }))
}

fn prompt_of(object: &Map<String, Value>, field: &str) -> Result<Prompt, String> {
    match object.get(field) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(Prompt::Text(s.clone())),
        Some(Value::String(_)) => Err(format!("`{field}` is an empty string")),
        Some(Value::Array(messages)) => {
            if messages.is_empty() {
                return Err(format!("`{field}` is an empty list of messages"));
            }
            for (i, message) in messages.iter().enumerate() {
                let role = message.get("role").and_then(Value::as_str);
                if role.is_none() {
                    return Err(format!(
                        "`{field}[{i}]` must be a message object with a string `role`"
                    ));
                }
                if message.get("content").is_none() {
                    return Err(format!("`{field}[{i}]` has no `content`"));
                }
            }
            // The gateway matches on the final user turn: a list ending otherwise has none to match.
            if messages
                .last()
                .and_then(|m| m.get("role"))
                .and_then(Value::as_str)
                != Some("user")
            {
                return Err(format!("`{field}` must end with a user message"));
            }
            Ok(Prompt::Messages(messages.clone()))
        }
        Some(_) => Err(format!(
            "`{field}` must be a string or a list of chat messages"
        )),
        None => Err(format!("`{field}` is missing")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn one(line: &str) -> Result<Vec<Pair>, PairsError> {
        parse("t.jsonl", line, Ambiguous::Different)
    }

    #[test]
    fn string_pairs_become_one_user_message() {
        let pairs = one(
            r#"{"id":"p1","category":"paraphrase","a":"Hi there","b":"Hello","same_answer":true}"#,
        )
        .expect("parses");
        assert_eq!(pairs.len(), 1);
        let p = &pairs[0];
        assert_eq!(p.id, "p1");
        assert_eq!(p.category, "paraphrase");
        assert!(p.same_answer);
        assert_eq!(p.a, Prompt::Text("Hi there".into()));
        assert_eq!(
            p.b.messages(),
            vec![json!({"role": "user", "content": "Hello"})]
        );
        assert!(p.a.context().is_empty());
    }

    #[test]
    fn message_lists_are_kept_and_subtype_is_the_category() {
        let text = concat!(
            "\n",
            r#"{"subtype":"context_swap","same_answer":false,"a":[{"role":"user","content":"x"},{"role":"assistant","content":"y"},{"role":"user","content":"cancel it"}],"b":[{"role":"user","content":"cancel it"}]}"#,
            "\n"
        );
        let pairs = parse("conv.jsonl", text, Ambiguous::Different).expect("valid pairs");
        let p = &pairs[0];
        assert_eq!(p.category, "context_swap");
        assert!(!p.same_answer);
        // No id: the file and line name it.
        assert_eq!(p.id, "conv.jsonl:2");
        assert_eq!(p.line, 2);
        match &p.a {
            Prompt::Messages(m) => assert_eq!(m.len(), 3),
            other => panic!("expected messages, got {other:?}"),
        }
        assert_eq!(p.a.context().len(), 2);
        assert!(p.b.context().is_empty());
    }

    #[test]
    fn missing_category_is_uncategorized() {
        let pairs = one(r#"{"a":"x","b":"y","same_answer":false}"#).expect("parses");
        assert_eq!(pairs[0].category, "uncategorized");
    }

    #[test]
    fn errors_name_the_line_and_field() {
        let text = concat!(
            r#"{"a":"x","b":"y","same_answer":true}"#,
            "\n",
            r#"{"a":"x","b":"y","same_answer":"yes"}"#,
            "\n"
        );
        let err = parse("f.jsonl", text, Ambiguous::Different).expect_err("an error");
        assert_eq!(
            err.to_string(),
            "f.jsonl:2: `same_answer` must be true or false"
        );

        let cases = [
            ("not json", "not valid JSON"),
            ("[1,2]", "a line must be a JSON object"),
            (r#"{"b":"y","same_answer":true}"#, "`a` is missing"),
            (
                r#"{"a":"","b":"y","same_answer":true}"#,
                "`a` is an empty string",
            ),
            (
                r#"{"a":"x","b":[],"same_answer":true}"#,
                "`b` is an empty list",
            ),
            (
                r#"{"a":"x","b":3,"same_answer":true}"#,
                "`b` must be a string or a list",
            ),
            (
                r#"{"a":[{"content":"x"}],"b":"y","same_answer":true}"#,
                "`a[0]` must be a message object with a string `role`",
            ),
            (
                r#"{"a":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}],"b":"y","same_answer":true}"#,
                "`a` must end with a user message",
            ),
            (r#"{"a":"x","b":"y"}"#, "`same_answer` is missing"),
            (
                r#"{"a":"x","b":"y","same_answer":true,"category":5}"#,
                "`category` must be a non-empty string",
            ),
        ];
        for (line, want) in cases {
            let err = one(line).expect_err("an error").to_string();
            assert!(err.starts_with("t.jsonl:1: "), "{line}: {err}");
            assert!(err.contains(want), "{line}: got {err}, want {want}");
        }
    }

    #[test]
    fn ambiguous_pairs_follow_the_chosen_reading() {
        let text = concat!(
            r#"{"category":"paraphrase","a":"x","b":"y","same_answer":true,"ambiguous":"context_dependent"}"#,
            "\n",
            r#"{"category":"paraphrase","a":"x","b":"z","same_answer":true}"#,
        );
        let strict = parse("f", text, Ambiguous::Different).expect("valid pairs");
        assert_eq!(strict.len(), 2);
        assert!(!strict[0].same_answer);
        assert_eq!(strict[0].category, "context_dependent");
        assert!(strict[1].same_answer);
        assert_eq!(strict[1].category, "paraphrase");

        let lenient = parse("f", text, Ambiguous::Same).expect("valid pairs");
        assert!(lenient[0].same_answer);

        let skipped = parse("f", text, Ambiguous::Skip).expect("valid pairs");
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].line, 2);
    }

    #[test]
    fn a_file_without_pairs_is_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("empty.jsonl");
        std::fs::write(&path, "\n\n").expect("parses");
        let err = read_file(&path, Ambiguous::Different).expect_err("an error");
        assert!(err.to_string().contains("no pairs"), "{err}");
        let missing =
            read_file(&dir.path().join("nope.jsonl"), Ambiguous::Different).expect_err("an error");
        assert!(missing.to_string().starts_with("cannot read"), "{missing}");
    }
}
