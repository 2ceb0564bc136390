//! What a bench run sends and how ([`BenchConfig`]), and the base URLs it is given. Settings only:
//! parsed from the command line in `cli.rs`, read by the runner; nothing here sends a request.

use std::time::Duration;

use super::openloop;

/// What to send and how.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Base URLs including `/v1`: the target, and optionally a second one measured alongside.
    pub targets: Vec<String>,
    /// More base URLs of the first target (replicas of one service without a load balancer in
    /// front): request `i` of the first target goes to `targets[0]` and these in turn, by `i`.
    pub round_robin: Vec<String>,
    /// Which API the requests speak; the base URLs must serve it.
    pub api: Api,
    /// Sent as the bearer token (OpenAI) or as `x-api-key` (Anthropic).
    pub api_key: String,
    pub model: String,
    /// Upper bound on measured requests per target (`usize::MAX`: bounded by time only).
    pub requests: usize,
    /// Closed loop: concurrent workers.
    pub concurrency: usize,
    /// Open loop: arrivals per second on a fixed schedule (`None`: closed loop).
    pub rate: Option<f64>,
    /// Open loop: how arrivals are spaced (even, or Poisson at the same mean rate).
    pub arrivals: openloop::Arrivals,
    /// Seeds the Poisson schedule (the workload has its own seed from the same flag).
    pub seed: u64,
    /// Open loop: requests in flight at most; an arrival finding them all busy is dropped.
    pub max_in_flight: usize,
    pub stream: bool,
    /// Requests per target sent first and left out of the results (connection set-up, warm caches).
    pub warmup: usize,
    /// Distinguishes this run's generated prompts from any earlier run's.
    pub run_id: String,
    /// Upper bound on the whole run (no request starts after it).
    pub max_duration: Duration,
    /// Sent as `x-reprise-namespace`, so a run starts from a cache of its own.
    pub namespace: Option<String>,
}

pub use crate::api::Api;

impl BenchConfig {
    /// The base URL that request `index` of `target` is sent to.
    pub fn url_of(&self, target: usize, index: usize) -> &str {
        if target == 0 && !self.round_robin.is_empty() {
            match index % (self.round_robin.len() + 1) {
                0 => &self.targets[0],
                k => &self.round_robin[k - 1],
            }
        } else {
            &self.targets[target]
        }
    }
}

/// Normalizes a base URL: a URL without a path is a gateway (or server) root, and `/v1` is
/// appended; one with a path is used as given (without a trailing slash).
pub fn base_url(raw: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(raw.trim()).map_err(|e| format!("invalid URL {raw:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("URL {raw:?} is not http or https"));
    }
    let text = url.as_str().trim_end_matches('/');
    Ok(if url.path() == "/" || url.path().is_empty() {
        format!("{text}/v1")
    } else {
        text.to_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_get_v1_only_without_a_path() {
        let url = |s| base_url(s).expect("valid");
        assert_eq!(url("http://127.0.0.1:8080"), "http://127.0.0.1:8080/v1");
        assert_eq!(url("http://127.0.0.1:8080/"), "http://127.0.0.1:8080/v1");
        assert_eq!(url("http://127.0.0.1:8080/v1/"), "http://127.0.0.1:8080/v1");
        assert_eq!(
            url("https://peer.example/openai/v1"),
            "https://peer.example/openai/v1"
        );
        assert!(base_url("127.0.0.1:8080").is_err());
        assert!(base_url("ftp://x").is_err());
    }
}
