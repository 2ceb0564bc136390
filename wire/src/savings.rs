//! What the cache saved in tokens and money: per request ([`TokensSaved`], in the request record and
//! a shadow decision) and summed (`GET /admin/stats` `savings`: [`Savings`], by route, model and
//! namespace, less what the judge's calls cost).
//!
//! Money is in US dollars at the gateway's price table (list prices per million tokens); a model
//! the table does not price still has its tokens counted, and its cost is absent, never zero.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Where a hit's token counts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// The upstream's own `usage`, stored with the answer.
    Reported,
    /// The upstream sent no usage (a stream without `include_usage`): the prompt's and the answer's
    /// text were counted with a tokenizer (`tokenizer` names it).
    Counted,
}

/// The tokens one hit did not send upstream, and what they would have cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TokensSaved {
    /// Prompt tokens (Anthropic: with the prompt-cache reads and writes).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub input_tokens: u64,
    /// Completion tokens.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub output_tokens: u64,
    #[cfg_attr(feature = "openapi", schema(required))]
    pub source: TokenSource,
    /// With `counted`: the tokenizer, e.g. `o200k_base`, or `cl100k_base (approximation)` for a
    /// model whose own tokenizer is not public.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<String>,
    /// US dollars at the price table's rate for the model; absent when the table has no price for it.
    #[serde(default)]
    pub cost_usd: Option<f64>,
}

/// Tokens and money saved by a group of hits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SavingsRow {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub hits: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub input_tokens: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub output_tokens: u64,
    /// US dollars, over the hits whose model has a price.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub cost_usd: f64,
    /// Hits whose model has no price: their tokens are counted, their cost is not.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub unpriced: u64,
    /// Hits whose tokens were counted with a tokenizer, not reported by the upstream.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub counted: u64,
}

impl SavingsRow {
    /// Adds one hit's saving.
    pub fn add(&mut self, saved: &TokensSaved) {
        self.hits += 1;
        self.input_tokens += saved.input_tokens;
        self.output_tokens += saved.output_tokens;
        match saved.cost_usd {
            Some(cost) => self.cost_usd += cost,
            None => self.unpriced += 1,
        }
        if saved.source == TokenSource::Counted {
            self.counted += 1;
        }
    }
}

/// What the judge's calls cost: a cost against the savings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JudgeCost {
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub calls: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub input_tokens: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub output_tokens: u64,
    /// US dollars at the judge model's price.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub cost_usd: f64,
    /// Calls whose judge model has no price.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub unpriced: u64,
}

/// The price table in force: its date and where its figures come from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PriceTableInfo {
    /// The date the default table's prices were read (`YYYY-MM-DD`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub date: String,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub sources: Vec<String>,
    /// The file that overrides the defaults (`--prices`), when one is set.
    #[serde(default)]
    pub file: Option<String>,
    /// Models priced (defaults and overrides together).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub models: usize,
}

/// `GET /admin/stats` `savings`: what hits saved since start, by route, model and namespace (no
/// namespace: `(none)`), what shadow mode's would-be hits would have saved, and the judge's cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Savings {
    /// Every hit (exact and semantic; coalesced requests waited for their leader's upstream call
    /// and save nothing).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub total: SavingsRow,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub by_route: BTreeMap<String, SavingsRow>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub by_model: BTreeMap<String, SavingsRow>,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub by_namespace: BTreeMap<String, SavingsRow>,
    /// Shadow mode's would-be hits: what turning semantic matching on would have saved.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub shadow: SavingsRow,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub judge: JudgeCost,
    /// `total.cost_usd` less `judge.cost_usd`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub net_cost_usd: f64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub prices: PriceTableInfo,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_counts_unpriced_and_counted_hits_apart() {
        let mut row = SavingsRow::default();
        row.add(&TokensSaved {
            input_tokens: 10,
            output_tokens: 5,
            source: TokenSource::Reported,
            tokenizer: None,
            cost_usd: Some(0.5),
        });
        row.add(&TokensSaved {
            input_tokens: 1,
            output_tokens: 2,
            source: TokenSource::Counted,
            tokenizer: Some("o200k_base".into()),
            cost_usd: None,
        });
        assert_eq!((row.hits, row.input_tokens, row.output_tokens), (2, 11, 7));
        assert_eq!((row.unpriced, row.counted), (1, 1));
        assert!((row.cost_usd - 0.5).abs() < 1e-12);
        let json = serde_json::to_value(&row).expect("json");
        assert_eq!(json["unpriced"], 1);
        // An older gateway's body without savings reads as zeros.
        let empty: Savings = serde_json::from_str("{}").expect("json");
        assert_eq!(empty.total, SavingsRow::default());
    }
}
