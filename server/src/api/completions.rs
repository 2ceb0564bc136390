//! The legacy completions adapter (`POST /v1/completions`): its keys (the `prompt` taken byte for
//! byte, since a completion model continues the text exactly as written), and its answers, which
//! share chat's `choices` rules and shapes as `text_completion` objects. Nothing here reads the
//! cache or the store.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::choices::{assemble_choices, check_choices, rechunk_choices};
use super::{Api, Uncacheable, Warm};
use crate::entry::StoredEvent;
use crate::error::GatewayError;
use crate::ingress::Route;
use crate::key::{canonical_string, hash_fields, model_field, unreadable};
use crate::key::{FieldHasher, Ignored, Turn};

/// `POST /v1/completions`.
pub struct Completions;

impl Api for Completions {
    fn route(&self) -> Route {
        Route::Completions
    }

    fn turn(
        &self,
        body: &Map<String, Value>,
        partition: &mut FieldHasher,
    ) -> Result<Turn, GatewayError> {
        keys(body, partition)
    }

    fn check(&self, body: &Value, allow_length: bool) -> Result<(), Uncacheable> {
        check_choices(body, allow_length)
    }

    fn assemble_events(&self, events: &mut dyn Iterator<Item = &Value>) -> Value {
        assemble_choices(events, false)
    }

    fn rechunk(&self, body: &Value, decode_ms: f64) -> Vec<StoredEvent> {
        rechunk_choices(body, decode_ms, false)
    }

    fn id_prefix(&self) -> &'static str {
        "cmpl-"
    }

    fn warm(&self) -> Option<&dyn Warm> {
        Some(self)
    }
}

impl Warm for Completions {
    fn prompt(&self, prompt: String) -> Map<String, Value> {
        Map::from_iter([("prompt".to_owned(), Value::String(prompt))])
    }

    fn messages(&self, _messages: Vec<Value>) -> Result<Map<String, Value>, GatewayError> {
        Err(GatewayError::invalid(
            "`messages` is for chat.completions; use `prompt` for completions.",
            Some("messages"),
        ))
    }

    fn answer(&self, model: String, response: String, now_s: u64) -> Value {
        json!({
            "id": format!("cmpl-warm-{now_s}"), "object": "text_completion", "created": now_s,
            "model": model,
            "choices": [{"index": 0, "text": response, "logprobs": null, "finish_reason": "stop"}],
            // No upstream made it, so it counts nothing; a stream that asks for usage gets these.
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        })
    }
}

/// The known fields of the legacy `POST /completions`.
#[derive(Deserialize)]
struct CompletionFields {
    model: Option<Value>,
    prompt: Option<Value>,
    best_of: Option<Value>,
    echo: Option<Value>,
    frequency_penalty: Option<Value>,
    logit_bias: Option<Value>,
    logprobs: Option<Value>,
    max_tokens: Option<Value>,
    n: Option<Value>,
    presence_penalty: Option<Value>,
    seed: Option<Value>,
    stop: Option<Value>,
    stream: Ignored,
    stream_options: Ignored,
    suffix: Option<Value>,
    temperature: Option<Value>,
    top_p: Option<Value>,
    user: Ignored,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

/// The legacy completion keys: every field but the ignored ones in the partition; the `prompt`,
/// byte for byte, is the exact part and the prompt.
fn keys(body: &Map<String, Value>, partition: &mut FieldHasher) -> Result<Turn, GatewayError> {
    let fields = CompletionFields::deserialize(body).map_err(unreadable)?;
    let CompletionFields {
        model,
        prompt,
        best_of,
        echo,
        frequency_penalty,
        logit_bias,
        logprobs,
        max_tokens,
        n,
        presence_penalty,
        seed,
        stop,
        stream: _stream,
        stream_options: _stream_options,
        suffix,
        temperature,
        top_p,
        user: _user,
        extra,
    } = fields;
    model_field(partition, model.as_ref())?;
    hash_fields!(partition;
        best_of, echo, frequency_penalty, logit_bias, logprobs, max_tokens, n, presence_penalty,
        seed, stop, suffix, temperature, top_p,
    );
    partition.extra(&extra);
    match prompt {
        Some(Value::String(text)) => Ok(Turn {
            canonical: canonical_string(&Value::String(text.clone())),
            prompt: text,
        }),
        Some(prompt @ Value::Array(_)) => {
            let canonical = canonical_string(&prompt);
            Ok(Turn {
                prompt: canonical.clone(),
                canonical,
            })
        }
        _ => Err(GatewayError::invalid(
            "`prompt` must be a string or an array.",
            Some("prompt"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::ingress::Route;
    use crate::key::tests::{assert_same, keys_with, tenant};

    #[test]
    fn legacy_completions_keys() {
        let body = |edit: &dyn Fn(&mut Value)| {
            let mut b = json!({"model": "m", "prompt": "Once upon a time", "max_tokens": 5});
            edit(&mut b);
            keys_with(Route::Completions, b, tenant("sk-a"), None)
        };
        let a = body(&|_| {});
        assert_eq!(a.prompt, "Once upon a time");
        for field in ["user", "stream", "stream_options"] {
            assert_same(&a, &body(&|b| b[field] = json!({"x": 1})), field);
        }
        for (field, value) in [
            ("suffix", json!("The end.")),
            ("echo", json!(true)),
            ("best_of", json!(3)),
            ("temperature", json!(0)),
            ("x_unknown", json!(1)),
        ] {
            assert_ne!(
                a.partition,
                body(&|b| b[field] = value.clone()).partition,
                "{field}"
            );
        }
        // Completion text is continued verbatim: a trailing space is a different prompt.
        let spaced = body(&|b| b["prompt"] = json!("Once upon a time "));
        assert_eq!(a.partition, spaced.partition);
        assert_ne!(a.exact, spaced.exact);
        let array = body(&|b| b["prompt"] = json!(["a", "b"]));
        assert_eq!(array.prompt, r#"["a","b"]"#);
        let lookalike = body(&|b| b["prompt"] = json!(r#"["a","b"]"#));
        assert_ne!(array.exact, lookalike.exact);
    }
}
