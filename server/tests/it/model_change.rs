//! A local store and a change of embedding model: the data dir records the model whose vectors
//! the store holds, a gateway with another model (or with a store older than the record) starts
//! with semantic matching off and exact caching on, and a flushed store takes the new model.
//! Fake models (vectors from a text's letters) stand for two versions of one model.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use reprise_server::embed::{EmbedConfig, EmbedModel, Embedder};
use reprise_server::state::{MODEL_RECORD_FILE, UNRECORDED_STORE_MODEL};
use reprise_server::AppState;
use serde_json::Value;

use crate::common::*;

const QUESTION: &str = "How do I reset my password?";
/// The same letters in another case and punctuation: another exact key, the same fake vector.
const REWORDED: &str = "how do i reset my password";

/// Vectors from letter counts, so case and punctuation do not move them; the fingerprint names
/// the model version.
struct Letters(&'static str);

impl EmbedModel for Letters {
    fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        Ok(texts
            .iter()
            .map(|t| {
                let mut v = [0.0f32; 26];
                for c in t
                    .to_ascii_lowercase()
                    .bytes()
                    .filter(u8::is_ascii_lowercase)
                {
                    v[usize::from(c - b'a')] += 1.0;
                }
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
                v.iter().map(|x| x / norm).collect()
            })
            .collect())
    }

    fn dimension(&self) -> usize {
        26
    }

    fn fingerprint(&self) -> String {
        self.0.to_owned()
    }
}

async fn gateway(upstream: String, dir: &Path, model: &'static str) -> Gateway {
    let config = config_in(upstream, dir.to_owned());
    start_with(config, move |config| {
        let embedder = Embedder::with_model(Box::new(Letters(model)), &EmbedConfig::default())
            .expect("embedder");
        AppState::with_embedder(config, Some(Arc::new(embedder))).expect("state")
    })
    .await
}

async fn ask(gw: &Gateway, prompt: &str) -> String {
    let response = post(gw, &chat_body(prompt, false), &[]).await;
    let got = outcome(&response);
    let _ = response.bytes().await;
    got
}

async fn health(gw: &Gateway) -> Value {
    client()
        .get(gw.url("/healthz"))
        .send()
        .await
        .expect("healthz")
        .json()
        .await
        .expect("json")
}

fn recorded(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(MODEL_RECORD_FILE))
        .expect("model record")
        .trim()
        .to_owned()
}

/// Waits until the stored question's vector is in the index.
async fn indexed(gw: &Gateway) {
    for _ in 0..500 {
        if health(gw).await["semantic"]["vectors"].as_u64() >= Some(1) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the stored question never reached the index");
}

#[tokio::test]
async fn a_local_store_keeps_the_model_of_its_vectors_and_a_flush_lets_another_in() {
    let sim = quick_sim().await;
    let dir = tempfile::tempdir().expect("tempdir");

    // A fresh store takes the model it starts with.
    let gw = gateway(sim.base_url(), dir.path(), "model-a").await;
    assert_eq!(recorded(dir.path()), "model-a");
    assert_eq!(ask(&gw, QUESTION).await, "miss");
    wait_for_entries(&gw, 1).await;
    indexed(&gw).await;
    assert_eq!(ask(&gw, REWORDED).await, "semantic-hit");
    gw.shutdown().await.expect("shutdown");

    // The same model again: its vectors are used.
    let gw = gateway(sim.base_url(), dir.path(), "model-a").await;
    indexed(&gw).await;
    assert_eq!(ask(&gw, REWORDED).await, "semantic-hit");
    gw.shutdown().await.expect("shutdown");

    // Another model: no semantic matching against vectors it cannot compare, exact hits still.
    let gw = gateway(sim.base_url(), dir.path(), "model-b").await;
    let h = health(&gw).await;
    assert_eq!(h["semantic"]["status"], "disabled", "{h}");
    let why = h["semantic"]["detail"].as_str().unwrap_or("");
    assert!(
        why.contains("another embedding model")
            && why.contains("model-a")
            && why.contains("model-b"),
        "{why}"
    );
    assert_eq!(ask(&gw, QUESTION).await, "hit");
    assert_ne!(ask(&gw, REWORDED).await, "semantic-hit");
    assert_eq!(recorded(dir.path()), "model-a", "the record is kept");
    gw.shutdown().await.expect("shutdown");

    // A store written before the record is taken as the model provisioned then: a gateway
    // running that one takes it as its own and records it...
    std::fs::remove_file(dir.path().join(MODEL_RECORD_FILE)).expect("remove record");
    let gw = gateway(sim.base_url(), dir.path(), UNRECORDED_STORE_MODEL).await;
    assert_eq!(health(&gw).await["semantic"]["status"], "ready");
    assert_eq!(recorded(dir.path()), UNRECORDED_STORE_MODEL);
    gw.shutdown().await.expect("shutdown");
    // ...and one running another (the int8-compute model after an upgrade) does not.
    std::fs::remove_file(dir.path().join(MODEL_RECORD_FILE)).expect("remove record");
    let gw = gateway(sim.base_url(), dir.path(), "model-a").await;
    let h = health(&gw).await;
    assert_eq!(h["semantic"]["status"], "disabled", "{h}");
    assert!(
        h["semantic"]["detail"]
            .as_str()
            .unwrap_or("")
            .contains("before stores recorded their model"),
        "{h}"
    );
    // What the message says to do: flush, then restart with the new model.
    let flushed = client()
        .post(gw.url("/admin/flush"))
        .bearer_auth("admin-secret")
        .send()
        .await
        .expect("flush");
    assert!(flushed.status().is_success(), "{}", flushed.status());
    gw.shutdown().await.expect("shutdown");

    let gw = gateway(sim.base_url(), dir.path(), "model-b").await;
    assert_eq!(health(&gw).await["semantic"]["status"], "ready");
    assert_eq!(recorded(dir.path()), "model-b");
    assert_eq!(ask(&gw, QUESTION).await, "miss");
    wait_for_entries(&gw, 1).await;
    indexed(&gw).await;
    assert_eq!(ask(&gw, REWORDED).await, "semantic-hit");
    gw.shutdown().await.expect("shutdown");
}
