//! The words every floor uses for how a request ended: what the cache did ([`CacheOutcome`], one
//! spelling on the wire, in stats, metrics and the client) and how the response reached the client
//! ([`Completion`]). Both stay exhaustive: a reader that must survive a newer gateway wraps them in
//! [`crate::Lenient`] rather than adding a catch-all here.

use serde::{Deserialize, Serialize};

/// What the cache did with a request: the value of `x-reprise-cache`, of a record's `cache`, of the
/// metrics' `cache` label and of every per-outcome breakdown, spelled the same everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "kebab-case")]
pub enum CacheOutcome {
    /// Served from the entry stored under the request's exact key.
    Hit,
    /// Served from the entry of a similar prompt that every guard let through.
    SemanticHit,
    /// Waited for an identical miss already in flight and served its answer.
    Coalesced,
    /// Went upstream; a clean answer is stored.
    Miss,
    /// `Cache-Control: no-cache`: went upstream without looking, and the answer replaces the entry.
    Refresh,
    /// Neither looked up nor stored (`no-cache, no-store`, or cache mode `off`).
    Bypass,
    /// A route that is never cached (pass-through); no `x-reprise-cache` header is sent.
    Pass,
}

impl CacheOutcome {
    pub const ALL: [Self; 7] = [
        Self::Hit,
        Self::SemanticHit,
        Self::Coalesced,
        Self::Miss,
        Self::Refresh,
        Self::Bypass,
        Self::Pass,
    ];

    /// The outcomes latency is broken down by (those that return an answer through the cache).
    pub const SERVED: [Self; 4] = [Self::Miss, Self::Hit, Self::SemanticHit, Self::Coalesced];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit => "hit",
            Self::SemanticHit => "semantic-hit",
            Self::Coalesced => "coalesced",
            Self::Miss => "miss",
            Self::Refresh => "refresh",
            Self::Bypass => "bypass",
            Self::Pass => "pass",
        }
    }
}

impl std::fmt::Display for CacheOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CacheOutcome {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|o| o.as_str() == s).ok_or(())
    }
}

/// How a request ended, from the client's point of view.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Completion {
    /// The whole response reached the client.
    Complete,
    /// The gateway answered with an error of its own (bad input, upstream unreachable, timeout).
    GatewayError,
    /// The upstream answered with a non-2xx status, relayed as it was.
    UpstreamError,
    /// The upstream stream failed after it started (cut, malformed, idle timeout, error event).
    StreamFailed,
    /// The client went away before the response was delivered.
    ClientDisconnected,
}

impl Completion {
    pub const ALL: [Self; 5] = [
        Self::Complete,
        Self::GatewayError,
        Self::UpstreamError,
        Self::StreamFailed,
        Self::ClientDisconnected,
    ];

    /// The spelling on the wire (the serde name).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::GatewayError => "gateway_error",
            Self::UpstreamError => "upstream_error",
            Self::StreamFailed => "stream_failed",
            Self::ClientDisconnected => "client_disconnected",
        }
    }
}

impl std::fmt::Display for Completion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Completion {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|c| c.as_str() == s).ok_or(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `as_str` is the serde spelling, so headers, labels and JSON agree.
    #[test]
    fn spellings_match_serde() {
        for o in CacheOutcome::ALL {
            assert_eq!(
                serde_json::to_string(&o).expect("json"),
                format!("\"{}\"", o.as_str())
            );
            assert_eq!(o.as_str().parse(), Ok(o));
        }
        for c in Completion::ALL {
            assert_eq!(
                serde_json::to_string(&c).expect("json"),
                format!("\"{}\"", c.as_str())
            );
            assert_eq!(c.as_str().parse(), Ok(c));
        }
        assert_eq!("semantic_hit".parse::<CacheOutcome>(), Err(()));
    }
}
