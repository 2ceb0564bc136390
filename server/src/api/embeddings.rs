//! The embeddings adapter (`POST /v1/embeddings`): its keys (the `input` is only the exact part),
//! and its rules: an embedding is a pure function of its input, so there is nothing semantic to
//! match and no vector to store with it; it never streams, and an answer is stored when it has
//! data. Nothing here reads the cache or the store.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::{Api, Uncacheable};
use crate::entry::StoredEvent;
use crate::error::GatewayError;
use crate::ingress::Route;
use crate::key::{canonical_string, hash_fields, model_field, unreadable};
use crate::key::{FieldHasher, Ignored, Turn};

/// `POST /v1/embeddings`.
pub struct Embeddings;

impl Api for Embeddings {
    fn route(&self) -> Route {
        Route::Embeddings
    }

    fn turn(
        &self,
        body: &Map<String, Value>,
        partition: &mut FieldHasher,
    ) -> Result<Turn, GatewayError> {
        keys(body, partition)
    }

    fn streams(&self) -> bool {
        false
    }

    fn semantic(&self) -> bool {
        false
    }

    fn check(&self, body: &Value, _allow_length: bool) -> Result<(), Uncacheable> {
        match body.get("data").and_then(Value::as_array) {
            Some(d) if !d.is_empty() => Ok(()),
            _ => Err(Uncacheable::NoChoices),
        }
    }

    /// Never called for a stream (embeddings do not stream); kept to the shape the shared
    /// assembler gave them before adapters, so nothing changes if one ever is.
    fn assemble_events(&self, events: &mut dyn Iterator<Item = &Value>) -> Value {
        super::choices::assemble_choices(events, false)
    }

    /// An embedding is served as a body only: there are no events to replay.
    fn rechunk(&self, _body: &Value, _decode_ms: f64) -> Vec<StoredEvent> {
        Vec::new()
    }

    /// Never seen: an embeddings body carries no `id` for a hit to renew.
    fn id_prefix(&self) -> &'static str {
        ""
    }
}

/// The known fields of `POST /embeddings`.
#[derive(Deserialize)]
struct EmbeddingFields {
    model: Option<Value>,
    input: Option<Value>,
    dimensions: Option<Value>,
    encoding_format: Option<Value>,
    user: Ignored,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

/// The embeddings keys: every field but `user` in the partition; the `input` is the exact part.
fn keys(body: &Map<String, Value>, partition: &mut FieldHasher) -> Result<Turn, GatewayError> {
    let fields = EmbeddingFields::deserialize(body).map_err(unreadable)?;
    let EmbeddingFields {
        model,
        input,
        dimensions,
        encoding_format,
        user: _user,
        extra,
    } = fields;
    model_field(partition, model.as_ref())?;
    hash_fields!(partition; dimensions, encoding_format);
    partition.extra(&extra);
    match input {
        // An embedding is a pure function of its input: there is nothing semantic to match, so
        // the input is only the exact part.
        Some(input @ (Value::String(_) | Value::Array(_))) => {
            let canonical = canonical_string(&input);
            Ok(Turn {
                prompt: canonical.clone(),
                canonical,
            })
        }
        _ => Err(GatewayError::invalid(
            "`input` must be a string or an array.",
            Some("input"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use crate::ingress::Route;
    use crate::key::tests::{assert_same, keys_with, tenant};

    #[test]
    fn embeddings_keys() {
        let body = |edit: &dyn Fn(&mut Value)| {
            let mut b = json!({"model": "e", "input": "hello"});
            edit(&mut b);
            keys_with(Route::Embeddings, b, tenant("sk-a"), None)
        };
        let a = body(&|_| {});
        assert_eq!(a.prompt, r#""hello""#);
        assert_same(&a, &body(&|b| b["user"] = json!("u")), "user");
        let other = body(&|b| b["input"] = json!("world"));
        assert_eq!(a.partition, other.partition);
        assert_ne!(a.exact, other.exact);
        for (field, value) in [
            ("dimensions", json!(256)),
            ("encoding_format", json!("base64")),
            ("x_unknown", json!(1)),
        ] {
            assert_ne!(
                a.partition,
                body(&|b| b[field] = value.clone()).partition,
                "{field}"
            );
        }
        let tokens = body(&|b| b["input"] = json!([[1, 2], [3]]));
        assert_eq!(tokens.prompt, "[[1,2],[3]]");
    }
}
