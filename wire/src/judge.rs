//! The `judge` part of the `GET /admin/stats` body: what the judge of near matches did and the
//! error budget's evidence per namespace. The gateway fills it from its verifier; the client reads
//! it (the paraphrase bench waits on it, `reprise-client stats` prints it).
//!
//! Every field has a default, so a reader takes the body of an older gateway (a count it lacks is
//! zero) and ignores the counts of a newer one; `schema(required)` keeps the OpenAPI document
//! saying the gateway always sends each non-optional field.

use serde::{Deserialize, Serialize};

/// The judge's work so far (`verify = judge`) and the verdicts observed per namespace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JudgeStats {
    /// Calls that reached the judge, by verdict (`unsure`: it said so, timed out, failed or
    /// answered something else).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub calls: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub same: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub different: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub unsure: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub timeouts: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub failures: u64,
    /// Candidates not judged (and not served): the rate budget was spent, or a prompt was too long
    /// to show whole.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub over_budget: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub too_long: u64,
    /// Background mode: pairs queued, dropped because the queue was full, waiting now.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub queued: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub dropped: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub queue_depth: u64,
    /// Tokens the judge calls cost, as the judge reported them.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub prompt_tokens: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub completion_tokens: u64,
    /// Latency of the newest calls.
    #[serde(default)]
    pub p50_ms: Option<f64>,
    #[serde(default)]
    pub p99_ms: Option<f64>,
    /// Verdicts observed per namespace (judge and operators), the error budget's evidence.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub namespaces: Vec<NamespaceBudget>,
}

/// A namespace's observations and the error rate they show.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NamespaceBudget {
    /// The namespace, `""` for requests without one.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub namespace: String,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub observations: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(required))]
    pub wrong: u64,
    /// `wrong / observations`: the error rate of judged candidates.
    #[serde(default)]
    pub wrong_rate: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_gateways_judge_body_reads_with_zeros() {
        // A gateway before the background queue and token counts sent only the verdict counts.
        let body = r#"{"calls":3,"same":2,"different":1,"unsure":0,"namespaces":[{"namespace":"a","observations":3,"wrong":1}]}"#;
        let stats: JudgeStats = serde_json::from_str(body).expect("json");
        assert_eq!((stats.calls, stats.same, stats.different), (3, 2, 1));
        assert_eq!(
            (stats.queued, stats.prompt_tokens, stats.p50_ms),
            (0, 0, None)
        );
        assert_eq!(stats.namespaces[0].wrong_rate, None);
        assert_eq!(stats.namespaces[0].wrong, 1);
    }

    #[test]
    fn the_gateways_encoding_round_trips() {
        let stats = JudgeStats {
            calls: 5,
            timeouts: 1,
            p99_ms: Some(12.5),
            namespaces: vec![NamespaceBudget {
                namespace: String::new(),
                observations: 4,
                wrong: 1,
                wrong_rate: Some(0.25),
            }],
            ..JudgeStats::default()
        };
        let json = serde_json::to_value(&stats).expect("json");
        assert_eq!(json["namespaces"][0]["wrong_rate"], 0.25);
        assert_eq!(json["p50_ms"], serde_json::Value::Null);
        let back: JudgeStats = serde_json::from_value(json).expect("json");
        assert_eq!(back, stats);
    }
}
