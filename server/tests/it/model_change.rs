//! A local store and a change of embedding model: the data dir records the model whose vectors
//! the store holds, and a gateway with another model (or with a store older than the record)
//! re-embeds the store in the background: exact hits at once, semantic hits with its own vectors
//! only, entry by entry, and the record names the new model once every vector is its. Fake models
//! (vectors from a text's letters, rotated per version) stand for two versions of one model.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use reprise_server::embed::{EmbedConfig, EmbedModel, Embedder};
use reprise_server::reembed::MIGRATION_FILE;
use reprise_server::state::{MODEL_RECORD_FILE, UNRECORDED_STORE_MODEL};
use reprise_server::AppState;
use serde_json::Value;

use crate::common::*;

const QUESTION: &str = "How do I reset my password?";
/// The same letters in another case and punctuation: another exact key, the same fake vector.
const REWORDED: &str = "how do i reset my password";

/// Vectors from letter counts, so case and punctuation do not move them; the fingerprint names
/// the model version. Version `shift` counts each letter `shift` places further in the alphabet,
/// so two versions give one text different vectors, as two real models do: a text whose letters
/// are shifted back by one has, under version 1, the very vector version 0 gave the original.
struct Letters {
    fingerprint: &'static str,
    shift: u8,
    /// A text this model fails to embed (a model call that fails mid-way through re-embedding).
    fails_on: Option<&'static str>,
}

fn model(fingerprint: &'static str) -> Letters {
    Letters {
        fingerprint,
        shift: 0,
        fails_on: None,
    }
}

impl EmbedModel for Letters {
    fn embed(&mut self, texts: &[String]) -> Result<Vec<Vec<f32>>, String> {
        if texts.iter().any(|t| Some(t.as_str()) == self.fails_on) {
            return Err("the model failed".into());
        }
        Ok(texts
            .iter()
            .map(|t| {
                let mut v = [0.0f32; 26];
                for c in t
                    .to_ascii_lowercase()
                    .bytes()
                    .filter(u8::is_ascii_lowercase)
                {
                    v[usize::from((c - b'a' + self.shift) % 26)] += 1.0;
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
        self.fingerprint.to_owned()
    }
}

/// `text` with every letter `n` places back in the alphabet (see [`Letters`]).
fn shifted_back_by(n: u8, text: &str) -> String {
    text.chars()
        .map(|c| match c {
            'a'..='z' => char::from(b'a' + (c as u8 - b'a' + 26 - n) % 26),
            'A'..='Z' => char::from(b'A' + (c as u8 - b'A' + 26 - n) % 26),
            other => other,
        })
        .collect()
}

/// `text` with every letter one place back: under version 1, version 0's vector of `text`.
fn shifted_back(text: &str) -> String {
    shifted_back_by(1, text)
}

async fn gateway(upstream: String, dir: &Path, model: Letters) -> Gateway {
    gateway_batching(upstream, dir, model, EmbedConfig::default().max_batch).await
}

/// With model calls of at most `max_batch` texts.
async fn gateway_batching(
    upstream: String,
    dir: &Path,
    model: Letters,
    max_batch: usize,
) -> Gateway {
    let config = config_in(upstream, dir.to_owned());
    start_with(config, move |config| {
        let embed = EmbedConfig {
            max_batch,
            ..EmbedConfig::default()
        };
        let embedder = Embedder::with_model(Box::new(model), &embed).expect("embedder");
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

/// Asks without storing the answer: a probe must not leave an entry that later probes would match.
async fn probe(gw: &Gateway, prompt: &str) -> String {
    let response = post(
        gw,
        &chat_body(prompt, false),
        &[("cache-control", "no-store")],
    )
    .await;
    let got = outcome(&response);
    let _ = response.bytes().await;
    got
}

fn recorded(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(MODEL_RECORD_FILE))
        .expect("model record")
        .trim()
        .to_owned()
}

/// Waits until the index holds at least `n` vectors.
async fn indexed(gw: &Gateway, n: u64) {
    for _ in 0..500 {
        if health(gw).await["semantic"]["vectors"].as_u64() >= Some(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the index never held {n} vectors: {}", health(gw).await);
}

/// Waits until the re-embedding settled every stale entry (and, when none failed, recorded its
/// end); its progress then.
async fn reembedded(gw: &Gateway) -> Value {
    for _ in 0..500 {
        let progress = health(gw).await["semantic"]["reembedding"].clone();
        let failed = progress["failed"].as_u64().unwrap_or(0);
        let settled = progress["done"].as_u64().unwrap_or(0) + failed;
        if progress["total"].as_u64() == Some(settled)
            && (failed > 0 || progress["finished"] == true)
        {
            return progress;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the re-embedding never settled: {}", health(gw).await);
}

#[tokio::test]
async fn a_local_store_records_the_model_of_its_vectors() {
    let sim = quick_sim().await;
    let dir = tempfile::tempdir().expect("tempdir");

    // A fresh store takes the model it starts with.
    let gw = gateway(sim.base_url(), dir.path(), model("model-a")).await;
    assert_eq!(recorded(dir.path()), "model-a");
    assert_eq!(ask(&gw, QUESTION).await, "miss");
    wait_for_entries(&gw, 1).await;
    indexed(&gw, 1).await;
    assert_eq!(ask(&gw, REWORDED).await, "semantic-hit");
    gw.shutdown().await.expect("shutdown");

    // The same model again: its vectors are used, nothing is re-embedded.
    let gw = gateway(sim.base_url(), dir.path(), model("model-a")).await;
    indexed(&gw, 1).await;
    assert_eq!(health(&gw).await["semantic"]["reembedding"], Value::Null);
    assert_eq!(ask(&gw, REWORDED).await, "semantic-hit");
    gw.shutdown().await.expect("shutdown");

    // A store written before the record is taken as the model provisioned then: a gateway
    // running that one takes it as its own and records it...
    std::fs::remove_file(dir.path().join(MODEL_RECORD_FILE)).expect("remove record");
    let gw = gateway(sim.base_url(), dir.path(), model(UNRECORDED_STORE_MODEL)).await;
    assert_eq!(health(&gw).await["semantic"]["status"], "ready");
    assert_eq!(health(&gw).await["semantic"]["reembedding"], Value::Null);
    assert_eq!(recorded(dir.path()), UNRECORDED_STORE_MODEL);
    gw.shutdown().await.expect("shutdown");
    // ...and one running another (the int8-compute model after an upgrade) re-embeds it.
    std::fs::remove_file(dir.path().join(MODEL_RECORD_FILE)).expect("remove record");
    let gw = gateway(sim.base_url(), dir.path(), model("model-a")).await;
    assert_eq!(ask(&gw, QUESTION).await, "hit");
    let progress = reembedded(&gw).await;
    assert_eq!(progress["from"], UNRECORDED_STORE_MODEL, "{progress}");
    assert_eq!(recorded(dir.path()), "model-a");
    gw.shutdown().await.expect("shutdown");
}

/// Issue 22's upgrade: a store written with model A, a gateway started with model B. Exact hits
/// at once; semantic hits only from B's vectors, as the backfill re-embeds entry by entry; a
/// restart in the middle (here after a model call failed) re-embeds again; the record says B.
#[tokio::test]
async fn another_model_re_embeds_the_store_and_never_matches_the_old_vectors() {
    let sim = quick_sim().await;
    let dir = tempfile::tempdir().expect("tempdir");
    const OTHER: &str = "Which port does the admin API listen on?";

    // Model A stores two questions (and, at shutdown, an index dump of its vectors).
    let gw = gateway(sim.base_url(), dir.path(), model("model-a")).await;
    assert_eq!(ask(&gw, QUESTION).await, "miss");
    assert_eq!(ask(&gw, OTHER).await, "miss");
    wait_for_entries(&gw, 2).await;
    indexed(&gw, 2).await;
    gw.shutdown().await.expect("shutdown");
    assert!(dir.path().join("index").exists(), "A's index dump");

    // Model B, one text per model call, failing on OTHER: QUESTION is re-embedded, OTHER not.
    let b_failing = Letters {
        fingerprint: "model-b",
        shift: 1,
        fails_on: Some(OTHER),
    };
    let gw = gateway_batching(sim.base_url(), dir.path(), b_failing, 1).await;
    assert_eq!(ask(&gw, QUESTION).await, "hit", "exact hits at once");
    assert_eq!(ask(&gw, OTHER).await, "hit");
    assert_eq!(
        std::fs::read_to_string(dir.path().join(MIGRATION_FILE))
            .expect("marker")
            .trim(),
        "model-b"
    );
    let progress = reembedded(&gw).await;
    assert_eq!(
        (&progress["from"], &progress["to"], &progress["total"]),
        (
            &Value::from("model-a"),
            &Value::from("model-b"),
            &Value::from(2)
        ),
        "{progress}"
    );
    assert_eq!(
        (
            &progress["done"],
            &progress["failed"],
            &progress["finished"]
        ),
        (&Value::from(1), &Value::from(1), &Value::from(false))
    );
    // Only B's vector of QUESTION is in the index: neither A's vectors nor A's dump were loaded.
    assert_eq!(health(&gw).await["semantic"]["vectors"], 1);
    assert_eq!(ask(&gw, REWORDED).await, "semantic-hit", "via B's vector");
    // Under B these texts embed to A's vectors of the two questions: a match would be A's.
    for text in [shifted_back(QUESTION), shifted_back(OTHER)] {
        assert_ne!(
            probe(&gw, &text).await,
            "semantic-hit",
            "{text} matched an old vector"
        );
    }
    assert_ne!(
        probe(&gw, &OTHER.to_lowercase()).await,
        "semantic-hit",
        "OTHER keeps A's vector, out of the index"
    );
    assert_eq!(
        recorded(dir.path()),
        "model-a",
        "not finished: the record is kept"
    );
    gw.shutdown().await.expect("shutdown");

    // Restarted with B mid-way (a marker, vectors of both models): everything is re-embedded.
    let b = || Letters {
        fingerprint: "model-b",
        shift: 1,
        fails_on: None,
    };
    let gw = gateway(sim.base_url(), dir.path(), b()).await;
    assert_eq!(ask(&gw, OTHER).await, "hit");
    let progress = reembedded(&gw).await;
    assert_eq!(progress["failed"], 0, "{progress}");
    assert_eq!(progress["finished"], true, "{progress}");
    assert_eq!(recorded(dir.path()), "model-b");
    assert!(
        !dir.path().join(MIGRATION_FILE).exists(),
        "the marker is gone"
    );
    assert_eq!(
        ask(&gw, "which port does the admin api listen on").await,
        "semantic-hit"
    );
    // OTHER's stored vector was still A's at this start.
    for text in [shifted_back(QUESTION), shifted_back(OTHER)] {
        assert_ne!(probe(&gw, &text).await, "semantic-hit", "{text}");
    }
    let h = health(&gw).await;
    gw.shutdown().await.expect("shutdown");

    // And the next start with B is an ordinary one: its vectors, its dump, no re-embedding.
    let gw = gateway(sim.base_url(), dir.path(), b()).await;
    let again = health(&gw).await;
    assert_eq!(again["semantic"]["reembedding"], Value::Null, "{again}");
    assert!(
        again["semantic"]["vectors"].as_u64() >= h["semantic"]["vectors"].as_u64(),
        "{again}"
    );
    assert_eq!(ask(&gw, "HOW DO I RESET MY PASSWORD").await, "semantic-hit");
    gw.shutdown().await.expect("shutdown");
}

/// A second change of model while a re-embedding is unfinished: the store holds vectors of two
/// models (A's, and B's for what B reached); a gateway with model C re-embeds all of them, and
/// neither A's nor B's vectors are ever matched.
#[tokio::test]
async fn a_second_model_change_mid_way_re_embeds_everything_with_the_third() {
    let sim = quick_sim().await;
    let dir = tempfile::tempdir().expect("tempdir");
    const OTHER: &str = "Which port does the admin API listen on?";
    let version = |fingerprint, shift, fails_on| Letters {
        fingerprint,
        shift,
        fails_on,
    };

    let gw = gateway(sim.base_url(), dir.path(), version("model-a", 0, None)).await;
    assert_eq!(ask(&gw, QUESTION).await, "miss");
    assert_eq!(ask(&gw, OTHER).await, "miss");
    wait_for_entries(&gw, 2).await;
    gw.shutdown().await.expect("shutdown");

    // B re-embeds QUESTION and fails on OTHER: B's vector of one, A's of the other, a marker.
    let b = version("model-b", 1, Some(OTHER));
    let gw = gateway_batching(sim.base_url(), dir.path(), b, 1).await;
    let progress = reembedded(&gw).await;
    assert_eq!(
        (&progress["done"], &progress["failed"]),
        (&Value::from(1), &Value::from(1))
    );
    gw.shutdown().await.expect("shutdown");

    // C, failing on OTHER too: OTHER keeps A's vector, the marker now names C.
    let c = version("model-c", 2, Some(OTHER));
    let gw = gateway_batching(sim.base_url(), dir.path(), c, 1).await;
    let progress = reembedded(&gw).await;
    assert_eq!(
        (&progress["from"], &progress["to"], &progress["total"]),
        (
            &Value::from("model-b"),
            &Value::from("model-c"),
            &Value::from(2)
        ),
        "{progress}"
    );
    assert_eq!(
        (&progress["done"], &progress["failed"]),
        (&Value::from(1), &Value::from(1))
    );
    assert_eq!(
        health(&gw).await["semantic"]["vectors"],
        1,
        "C's vector of QUESTION alone"
    );
    // Under C, these embed to B's vector of QUESTION and A's of OTHER.
    for text in [shifted_back_by(1, QUESTION), shifted_back_by(2, OTHER)] {
        assert_ne!(probe(&gw, &text).await, "semantic-hit", "{text}");
    }
    assert_eq!(ask(&gw, REWORDED).await, "semantic-hit");
    gw.shutdown().await.expect("shutdown");

    // C again, working: all re-embedded, C recorded.
    let gw = gateway(sim.base_url(), dir.path(), version("model-c", 2, None)).await;
    let progress = reembedded(&gw).await;
    assert_eq!(
        (&progress["from"], &progress["finished"]),
        (&Value::from("model-c"), &Value::from(true)),
        "{progress}"
    );
    assert_eq!(recorded(dir.path()), "model-c");
    assert!(!dir.path().join(MIGRATION_FILE).exists());
    assert_eq!(
        ask(&gw, "which port does the admin api listen on").await,
        "semantic-hit"
    );
    gw.shutdown().await.expect("shutdown");
}
