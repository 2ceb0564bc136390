//! What a bench request says: the body of a planned item, and the generated prompts (random words
//! from a fixed list, unique per run and index) that fresh and distinct workloads draw.

use serde_json::Value;

use super::workload::Item;
use super::BenchConfig;

/// The request body of a planned item, in the shape of the run's API.
pub(super) fn body(config: &BenchConfig, item: &Item) -> Value {
    let model = item.model.as_deref().unwrap_or(&config.model);
    let messages = item.messages.as_array().map(Vec::as_slice).unwrap_or(&[]);
    config.api.body(model, messages, config.stream)
}

pub(super) const WORDS: &[&str] = &[
    "harbor",
    "violin",
    "glacier",
    "tax",
    "recipe",
    "quantum",
    "garden",
    "invoice",
    "volcano",
    "sonnet",
    "kernel",
    "mortgage",
    "penguin",
    "telescope",
    "allergy",
    "bicycle",
    "copper",
    "election",
    "fossil",
    "guitar",
    "hurricane",
    "insulin",
    "jazz",
    "kayak",
    "lumber",
    "marathon",
    "neuron",
    "orchid",
    "passport",
    "quarry",
    "rhubarb",
    "satellite",
    "tariff",
    "umbrella",
    "vaccine",
    "walrus",
    "xylophone",
    "yeast",
    "zeppelin",
    "algebra",
    "bakery",
    "cathedral",
    "dolphin",
    "espresso",
    "falcon",
    "granite",
    "hammock",
    "igloo",
    "jackal",
    "ketchup",
    "lantern",
    "magnet",
    "nebula",
    "oyster",
    "pyramid",
    "quilt",
    "robot",
    "saffron",
    "tornado",
    "unicorn",
    "velvet",
    "whisky",
    "yoga",
    "zucchini",
    "antenna",
    "blizzard",
    "cactus",
    "diesel",
    "emerald",
    "firewall",
    "gazelle",
    "helium",
    "iceberg",
    "jigsaw",
    "koala",
    "lemonade",
    "meteor",
    "nutmeg",
];

/// A prompt of its own for every index: ten words drawn by a hash, so generated prompts are far
/// apart in meaning and a semantic cache cannot serve one for another (a shared template would).
pub(super) fn generated_prompt(run_id: &str, index: usize) -> String {
    let mut reader = blake3::Hasher::new()
        .update(run_id.as_bytes())
        .update(&index.to_le_bytes())
        .finalize_xof();
    let words: Vec<&str> = (0..10)
        .map(|_| {
            let mut b = [0u8; 2];
            reader.fill(&mut b);
            WORDS[usize::from(u16::from_le_bytes(b)) % WORDS.len()]
        })
        .collect();
    format!("Tell me about {} ({run_id}-{index}).", words.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Api, ANTHROPIC_MAX_TOKENS};
    use crate::bench::tests::test_config;
    use crate::bench::workload::{Kind, Planned, Workload};
    use serde_json::json;
    #[test]
    fn cycled_prompts_repeat_and_bodies_carry_the_model() {
        let config = test_config(&["a"]);
        let mut w = Workload::cycle("t", 2);
        let drawn: Vec<Planned> = (0..4).map(|_| w.next_planned()).collect();
        assert_eq!(drawn[3].item, drawn[1].item);
        assert_ne!(drawn[2].item, drawn[1].item);
        assert_eq!(drawn[3].kind, Kind::Repeat);
        let b = body(&config, &drawn[0].item);
        assert_eq!(b["model"], "m");
        assert_eq!(b["stream"], true);
        assert_eq!(b["messages"][0]["role"], "user");
        assert!(b.get("max_tokens").is_none(), "OpenAI bodies are unchanged");
    }

    #[test]
    fn anthropic_bodies_carry_max_tokens_and_a_top_level_system() {
        let config = BenchConfig {
            api: Api::Anthropic,
            ..test_config(&["a"])
        };
        let item = Item {
            messages: std::sync::Arc::new(json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
            ])),
            ..Item::prompt("x", None)
        };
        let b = body(&config, &item);
        assert_eq!(b["max_tokens"], ANTHROPIC_MAX_TOKENS);
        assert_eq!(b["system"], "Be brief.");
        assert_eq!(b["messages"], json!([{"role": "user", "content": "hi"}]));
        assert_eq!(
            (b["model"].as_str(), b["stream"].as_bool()),
            (Some("m"), Some(true))
        );
    }
}
