//! Typed async client for the gateway's admin REST API (`/admin/*` and `/metrics`).
//!
//! The types follow the admin API contract field for field; those the gateway and the client share
//! (outcomes, phases, request records, the stats counts) are the wire contract's (`reprise-wire`).
//! Responses are decoded leniently: unknown fields are ignored (a newer gateway may add some),
//! everything the contract allows to be `null` is an `Option`, and an outcome this client does not
//! know is kept as the gateway spelled it. Every call is also available untyped through [`AdminClient::call_json`] and byte
//! for byte through [`AdminClient::call_raw`] (what `reprise-client --json` prints), so nothing the
//! gateway sends is lost to the typed view.
//! This module only speaks HTTP; it renders nothing (see `admin_cli` for tables).
//!
//! [`client`] holds the client and its calls; the contract types are grouped by route in [`stats`]
//! (`/admin/stats`, `/admin/requests`), [`entries`] (entries, warm, invalidate, flush) and
//! [`config`] (config, shadow, feedback). Everything is re-exported here.

pub mod client;
pub mod config;
pub mod entries;
pub mod stats;

use reqwest::Url;

pub use client::{decode, truncate_chars, AdminCall, AdminClient};
pub use config::{
    ConfigPatch, FeedbackPage, FeedbackRequest, GuardVerdict, LiveConfig, ShadowDecision,
    ShadowPage, ShadowQuery, VerdictRecord,
};
pub use entries::{
    EntryDeleted, EntryDetail, EntryFilter, EntryPage, EntrySummary, EntryVerdicts, Flush,
    HitEvent, InvalidateRequest, Invalidation, ListQuery, Observation, WarmFormat, WarmItem,
    WarmResult, WarmedEntry,
};
pub use stats::{
    CacheOutcome, Completion, EmbeddingStats, FeedbackCounts, GuardRefusals, IndexStats,
    JudgeStats, Latency, Lenient, NamespaceBudget, OutcomeLatency, Phases, Rates, RequestCounts,
    RequestRecord, RequestsPage, Stats, StoreStats, Summary, Timeline, TimelineBucket,
    TtftHistogram, TtftSaved, UpstreamErrors,
};
pub use stats::{JudgeCost, PriceTableInfo, Savings, SavingsRow, TokenSource, TokensSaved};

/// Gateway root used when `REPRISE_URL` is not set.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";
/// Environment variable holding the gateway URL (with or without a trailing `/v1`).
pub const URL_ENV: &str = "REPRISE_URL";
/// Environment variable holding the admin bearer token.
pub const TOKEN_ENV: &str = "REPRISE_ADMIN_TOKEN";

/// Everything that can go wrong talking to the admin API. `Display` is one line meant for a person
/// at a terminal: it says what happened and, where there is one, what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The gateway URL could not be used.
    #[error("invalid gateway URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// The gateway answered with a non-2xx status; the fields come from its OpenAI-shaped error body
    /// (`message` falls back to the body text or the status reason when the body is not one).
    #[error("{}", describe_http(*.status, .message, .code.as_deref(), .param.as_deref()))]
    Http {
        status: u16,
        message: String,
        /// The error's `type` (e.g. `authentication_error`).
        kind: Option<String>,
        code: Option<String>,
        param: Option<String>,
    },
    /// The request did not get an HTTP answer (connection refused, DNS, timeout, reset).
    #[error("cannot reach the gateway at {url}: {detail}")]
    Transport {
        url: String,
        detail: String,
        #[source]
        source: reqwest::Error,
    },
    /// The gateway answered 2xx with a body that does not match the contract.
    #[error("unexpected response to {call}: {detail}")]
    Decode { call: String, detail: String },
}

impl AdminError {
    /// The HTTP status for [`AdminError::Http`].
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Http { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The OpenAI error `code` for [`AdminError::Http`] (e.g. `entry_not_found`).
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Http { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// The OpenAI error `param` for [`AdminError::Http`] (e.g. `limit`).
    pub fn param(&self) -> Option<&str> {
        match self {
            Self::Http { param, .. } => param.as_deref(),
            _ => None,
        }
    }
}

/// The one-line message of an HTTP error. Authentication and a disabled admin API get advice
/// instead of the server's wording, because those are the errors a new operator hits first.
fn describe_http(status: u16, message: &str, code: Option<&str>, param: Option<&str>) -> String {
    match (status, code) {
        (401, _) => format!(
            "the gateway rejected the admin token (HTTP 401{}): it is missing or wrong; set \
             {TOKEN_ENV} (or --admin-token) to the token the gateway was started with",
            code.map(|c| format!(" {c}")).unwrap_or_default()
        ),
        (404, Some("admin_disabled")) => format!(
            "the gateway's admin API is disabled (HTTP 404 admin_disabled): the gateway was \
             started without --admin-token ({TOKEN_ENV}); restart it with one"
        ),
        (404, Some("unknown_route")) => format!(
            "{message} (HTTP 404 unknown_route): this gateway does not serve that admin route; \
             is it an older version?"
        ),
        (404, None) => format!(
            "{message} (HTTP 404): no such route; is {URL_ENV} pointing at a Reprise gateway?"
        ),
        _ => {
            let mut detail = format!("HTTP {status}");
            if let Some(code) = code {
                detail.push_str(&format!(" {code}"));
            }
            if let Some(param) = param {
                detail.push_str(&format!(", param {param}"));
            }
            format!("{message} ({detail})")
        }
    }
}

/// Gateway root for admin routes: trailing `/` and `/v1` are removed, so the same `REPRISE_URL`
/// works for the OpenAI routes and for the admin client. A path prefix (reverse proxy) is kept.
pub fn admin_root(url: &str) -> Result<Url, AdminError> {
    let invalid = |reason: String| AdminError::InvalidUrl {
        url: url.to_owned(),
        reason,
    };
    let mut trimmed = url.trim().trim_end_matches('/');
    if let Some(rest) = trimmed.strip_suffix("/v1") {
        trimmed = rest.trim_end_matches('/');
    }
    if trimmed.is_empty() {
        return Err(invalid("it is empty".to_owned()));
    }
    let parsed = Url::parse(trimmed).map_err(|e| invalid(e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid(format!(
            "scheme {:?} is not http or https",
            parsed.scheme()
        )));
    }
    if parsed.cannot_be_a_base() || parsed.host_str().is_none() {
        return Err(invalid("it has no host".to_owned()));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid("it must not have a query or fragment".to_owned()));
    }
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A newer gateway: an outcome this client does not know, and a record without phases or
    /// completion, still decode (and print as the gateway spelled them).
    #[test]
    fn requests_of_a_newer_gateway_decode() {
        let body = br#"{"object":"list","data":[
            {"id":"req_1","route":"chat.completions","status":200,"cache":"prefetched"},
            {"id":"req_2","cache":"miss","completion":"complete","phases":{"total_ms":3.5}}]}"#;
        let page: RequestsPage = decode(body, "requests").expect("lenient decode");
        assert_eq!(page.data[0].cache, "prefetched");
        assert_eq!(page.data[0].cache.known(), None);
        assert_eq!(page.data[0].phases, Phases::default());
        assert!(page.data[1].cache.is(&CacheOutcome::Miss));
        assert!(page.data[1].completion.is(&Completion::Complete));
        assert_eq!(page.data[1].phases.total_ms, 3.5);
    }

    #[test]
    fn admin_root_strips_trailing_slash_and_v1() {
        for (input, expected) in [
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080/"),
            ("http://127.0.0.1:8080/", "http://127.0.0.1:8080/"),
            ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/"),
            ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/"),
            (
                "  https://gw.example.invalid/v1//  ",
                "https://gw.example.invalid/",
            ),
            (
                "http://proxy.invalid/reprise/v1",
                "http://proxy.invalid/reprise",
            ),
            (
                "http://proxy.invalid/reprise/",
                "http://proxy.invalid/reprise",
            ),
            // Only a whole trailing `/v1` segment is stripped.
            ("http://h.invalid/apiv1", "http://h.invalid/apiv1"),
        ] {
            let root = admin_root(input).expect(input);
            assert_eq!(root.as_str(), expected, "for {input:?}");
        }
    }

    #[test]
    fn admin_root_rejects_unusable_urls() {
        for input in [
            "",
            "/v1",
            "127.0.0.1:8080",
            "ftp://h.invalid",
            "http://h.invalid/?x=1",
        ] {
            let err = admin_root(input).expect_err(input);
            assert!(
                matches!(err, AdminError::InvalidUrl { .. }),
                "{input:?}: {err}"
            );
            assert!(err.to_string().starts_with("invalid gateway URL"), "{err}");
        }
    }
}
