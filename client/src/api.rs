//! The two APIs the client drives through a gateway (`--api`): where a request goes, how it
//! authenticates and what its body looks like, for OpenAI's chat completions and Anthropic's
//! Messages API. Shared by `bench` and `eval`/`calibrate`, so both send the same shapes; reading
//! a response (chunks and named events) stays with the command that measures it.

use serde_json::{json, Value};

/// The Messages API version the client speaks (Anthropic refuses a request without one).
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// `max_tokens` of a Messages API request: Anthropic requires one and the client has no setting of
/// its own for it, so a bound well above any simulated or cached answer it measures.
pub const ANTHROPIC_MAX_TOKENS: u64 = 256;

/// The API a run speaks: one gateway serves both, and each has its own request shape and stream
/// framing, so a run says which one it measures rather than guessing from the URL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Api {
    /// OpenAI chat completions: `POST {url}/chat/completions`, `data:` chunks with `choices`.
    #[default]
    Openai,
    /// Anthropic's Messages API: `POST {url}/messages` with `x-api-key` and `anthropic-version`,
    /// named events (`content_block_delta` carries the tokens, `message_stop` ends the stream).
    Anthropic,
}

impl Api {
    /// A `POST` to this API's endpoint under `base` (a base URL including `/v1`), authenticated as
    /// its clients do: the bearer token (OpenAI), or `x-api-key` with `anthropic-version`. An empty
    /// `api_key` sends no credential, as a client without one: the gateway's anonymous tenant,
    /// where entries warmed with `"api_key": ""` live (`Bearer ` alone would be a tenant of its own).
    pub fn post(
        self,
        client: &reqwest::Client,
        base: &str,
        api_key: &str,
    ) -> reqwest::RequestBuilder {
        let request = match self {
            Self::Openai => client.post(format!("{base}/chat/completions")),
            Self::Anthropic => client
                .post(format!("{base}/messages"))
                .header("anthropic-version", ANTHROPIC_VERSION),
        };
        match (self, api_key.is_empty()) {
            (_, true) => request,
            (Self::Openai, false) => request.bearer_auth(api_key),
            (Self::Anthropic, false) => request.header("x-api-key", api_key),
        }
    }

    /// The request body for chat-shaped `messages`, in this API's shape.
    pub fn body(self, model: &str, messages: &[Value], stream: bool) -> Value {
        match self {
            Self::Openai => json!({"model": model, "stream": stream, "messages": messages}),
            Self::Anthropic => {
                // The Messages API refuses a `system` role in `messages`: system messages move to
                // the top-level `system` field, joined, as the gateway would.
                let (system, messages): (Vec<&Value>, Vec<&Value>) =
                    messages.iter().partition(|m| m["role"] == "system");
                let mut body = json!({
                    "model": model,
                    "max_tokens": ANTHROPIC_MAX_TOKENS,
                    "stream": stream,
                    "messages": messages,
                });
                let system: Vec<&str> = system
                    .iter()
                    .filter_map(|m| m["content"].as_str())
                    .collect();
                if !system.is_empty() {
                    body["system"] = Value::from(system.join("\n\n"));
                }
                body
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn credentials(api: Api, key: &str) -> Vec<String> {
        let request = api
            .post(&reqwest::Client::new(), "http://127.0.0.1:1/v1", key)
            .build()
            .expect("request");
        ["authorization", "x-api-key"]
            .iter()
            .filter_map(|name| request.headers().get(*name))
            .map(|v| v.to_str().expect("ascii").to_owned())
            .collect()
    }

    #[test]
    fn an_empty_key_sends_no_credential() {
        assert_eq!(credentials(Api::Openai, "sk-1"), ["Bearer sk-1"]);
        assert_eq!(credentials(Api::Anthropic, "sk-1"), ["sk-1"]);
        assert!(credentials(Api::Openai, "").is_empty());
        assert!(credentials(Api::Anthropic, "").is_empty());
    }
}
