//! The admin client itself ([`AdminClient`]): one [`AdminCall`] per admin route, sent with the
//! bearer token, answered typed, as JSON or byte for byte, and the gateway's error bodies read into
//! [`AdminError`]s. The types it decodes into are the sibling files'.

use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use super::{
    admin_root, AdminError, ConfigPatch, EntryDeleted, EntryDetail, EntryFilter, EntryPage,
    EntrySummary, FeedbackRequest, Flush, InvalidateRequest, Invalidation, ListQuery, LiveConfig,
    RequestsPage, ShadowPage, ShadowQuery, Stats, VerdictRecord, WarmFormat, WarmItem, WarmResult,
    DEFAULT_URL, TOKEN_ENV, URL_ENV,
};

/// One admin API call with its parameters, for [`AdminClient::call_json`]. The typed methods build
/// these too, so the untyped path and the typed one send exactly the same request.
#[derive(Debug, Clone, PartialEq)]
pub enum AdminCall {
    Stats,
    /// List (or, with `q`, search) entries.
    Entries(ListQuery),
    Entry(String),
    DeleteEntry(String),
    Warm(Vec<WarmItem>),
    /// A warm body as it is (e.g. a file), sent with the format's content type.
    WarmRaw {
        body: Bytes,
        format: WarmFormat,
    },
    Invalidate(InvalidateRequest),
    Flush,
    Config,
    PatchConfig(ConfigPatch),
    Requests {
        limit: Option<u32>,
    },
    Shadow(ShadowQuery),
    Feedback(FeedbackRequest),
    FeedbackList {
        limit: Option<u32>,
        cursor: Option<String>,
    },
    OpenApi,
}

impl AdminCall {
    fn method(&self) -> Method {
        match self {
            Self::Stats
            | Self::Entries(_)
            | Self::Entry(_)
            | Self::Config
            | Self::Requests { .. }
            | Self::Shadow(_)
            | Self::FeedbackList { .. }
            | Self::OpenApi => Method::GET,
            Self::DeleteEntry(_) => Method::DELETE,
            Self::Warm(_)
            | Self::WarmRaw { .. }
            | Self::Invalidate(_)
            | Self::Flush
            | Self::Feedback(_) => Method::POST,
            Self::PatchConfig(_) => Method::PATCH,
        }
    }

    /// Path segments under the gateway root.
    fn segments(&self) -> Vec<&str> {
        match self {
            Self::Stats => vec!["admin", "stats"],
            Self::Entries(_) | Self::Warm(_) | Self::WarmRaw { .. } => vec!["admin", "entries"],
            Self::Entry(id) | Self::DeleteEntry(id) => vec!["admin", "entries", id],
            Self::Invalidate(_) => vec!["admin", "invalidate"],
            Self::Flush => vec!["admin", "flush"],
            Self::Config | Self::PatchConfig(_) => vec!["admin", "config"],
            Self::Requests { .. } => vec!["admin", "requests"],
            Self::Shadow(_) => vec!["admin", "shadow"],
            Self::Feedback(_) | Self::FeedbackList { .. } => vec!["admin", "feedback"],
            Self::OpenApi => vec!["admin", "openapi.json"],
        }
    }

    /// `GET /admin/stats`-style description for error messages.
    pub fn describe(&self) -> String {
        format!("{} /{}", self.method(), self.segments().join("/"))
    }
}

/// Async client for the admin API. Cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub struct AdminClient {
    http: reqwest::Client,
    root: Url,
    token: Option<String>,
}

impl std::fmt::Debug for AdminClient {
    // Written by hand so the token never reaches a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminClient")
            .field("root", &self.root.as_str())
            .field("token", &self.token.as_ref().map(|_| "*****"))
            .finish()
    }
}

impl AdminClient {
    /// A client for the gateway at `base_url` (with or without `/v1`), sending `token` as the
    /// admin bearer token.
    pub fn new(base_url: &str, token: Option<&str>) -> Result<Self, AdminError> {
        let root = admin_root(base_url)?;
        let http = reqwest::Client::builder()
            .user_agent(concat!("reprise-client/", env!("CARGO_PKG_VERSION")))
            // Only connecting is bounded: a flush or a large warm may legitimately take a while.
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| AdminError::InvalidUrl {
                url: base_url.to_owned(),
                reason: format!("cannot build an HTTP client: {e}"),
            })?;
        Ok(Self {
            http,
            root,
            token: token.filter(|t| !t.is_empty()).map(str::to_owned),
        })
    }

    /// A client from `REPRISE_URL` (default `http://127.0.0.1:8080`) and `REPRISE_ADMIN_TOKEN`.
    pub fn from_env() -> Result<Self, AdminError> {
        Self::from_vars(std::env::var(URL_ENV).ok(), std::env::var(TOKEN_ENV).ok())
    }

    /// `from_env` with the variables passed in, so it is testable without touching the process env.
    fn from_vars(url: Option<String>, token: Option<String>) -> Result<Self, AdminError> {
        let url = url
            .filter(|u| !u.trim().is_empty())
            .unwrap_or_else(|| DEFAULT_URL.to_owned());
        Self::new(&url, token.as_deref())
    }

    /// Use this `reqwest::Client` (e.g. one with a request timeout) instead of the default one.
    pub fn with_http_client(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// The gateway root the admin routes hang off (no trailing `/v1`).
    pub fn root(&self) -> &Url {
        &self.root
    }

    fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.root.clone();
        // `admin_root` rejected URLs that cannot be a base, so the segments are always editable;
        // pushing segments one by one percent-encodes an id instead of letting it change the path.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    fn request(&self, method: Method, url: Url) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, url);
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    /// Sends a request and returns the body of a 2xx answer, or the error the answer carried.
    async fn send(&self, builder: reqwest::RequestBuilder, url: &Url) -> Result<Bytes, AdminError> {
        let transport = |source: reqwest::Error| AdminError::Transport {
            url: self.root.as_str().trim_end_matches('/').to_owned(),
            detail: transport_detail(&source),
            source,
        };
        let response = builder.send().await.map_err(transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(transport)?;
        if status.is_success() {
            Ok(body)
        } else {
            Err(http_error(status, &body, url))
        }
    }

    /// Performs `call` and returns the body of its 2xx answer, byte for byte.
    pub async fn call_raw(&self, call: &AdminCall) -> Result<Bytes, AdminError> {
        let url = self.url(&call.segments());
        let mut builder = self.request(call.method(), url.clone());
        match call {
            AdminCall::Entries(query) => builder = builder.query(&query.pairs()),
            AdminCall::Requests { limit: Some(limit) } => {
                builder = builder.query(&[("limit", limit)])
            }
            AdminCall::Warm(items) => builder = builder.json(items),
            AdminCall::WarmRaw { body, format } => {
                builder = builder
                    .header(reqwest::header::CONTENT_TYPE, format.content_type())
                    .body(body.clone())
            }
            AdminCall::Invalidate(request) => builder = builder.json(request),
            AdminCall::PatchConfig(patch) => builder = builder.json(patch),
            AdminCall::Shadow(query) => builder = builder.query(&query.pairs()),
            AdminCall::Feedback(request) => builder = builder.json(request),
            AdminCall::FeedbackList { limit, cursor } => {
                let mut pairs = Vec::new();
                if let Some(l) = limit {
                    pairs.push(("limit", l.to_string()));
                }
                if let Some(c) = cursor {
                    pairs.push(("cursor", c.clone()));
                }
                builder = builder.query(&pairs)
            }
            AdminCall::Stats
            | AdminCall::Entry(_)
            | AdminCall::DeleteEntry(_)
            | AdminCall::Flush
            | AdminCall::Config
            | AdminCall::Requests { limit: None }
            | AdminCall::OpenApi => {}
        }
        self.send(builder, &url).await
    }

    /// Performs `call` and returns its JSON answer untyped.
    pub async fn call_json(&self, call: &AdminCall) -> Result<Value, AdminError> {
        let body = self.call_raw(call).await?;
        decode(&body, &call.describe())
    }

    async fn call<T: DeserializeOwned>(&self, call: AdminCall) -> Result<T, AdminError> {
        let body = self.call_raw(&call).await?;
        decode(&body, &call.describe())
    }

    /// `GET /admin/stats`.
    pub async fn stats(&self) -> Result<Stats, AdminError> {
        self.call(AdminCall::Stats).await
    }

    /// `GET /admin/entries`: one page.
    pub async fn entries(&self, query: &ListQuery) -> Result<EntryPage, AdminError> {
        self.call(AdminCall::Entries(query.clone())).await
    }

    /// Every entry matching `query`, following `next_cursor` from `query.cursor` (or the start)
    /// to the last page. Pages are as large as the gateway allows unless `query.limit` is set.
    pub async fn entries_all(&self, query: &ListQuery) -> Result<Vec<EntrySummary>, AdminError> {
        let mut entries = Vec::new();
        for raw in self.entries_all_raw(query).await? {
            entries.push(decode(raw.get().as_bytes(), "GET /admin/entries")?);
        }
        Ok(entries)
    }

    /// Like [`AdminClient::entries_all`], untyped.
    pub async fn entries_all_json(&self, query: &ListQuery) -> Result<Vec<Value>, AdminError> {
        let mut entries = Vec::new();
        for raw in self.entries_all_raw(query).await? {
            entries.push(decode(raw.get().as_bytes(), "GET /admin/entries")?);
        }
        Ok(entries)
    }

    /// Like [`AdminClient::entries_all`], each entry exactly as the gateway sent it.
    pub async fn entries_all_raw(
        &self,
        query: &ListQuery,
    ) -> Result<Vec<Box<RawValue>>, AdminError> {
        /// Just what is needed to follow the cursor; the items stay as they were sent.
        #[derive(Deserialize)]
        struct RawPage {
            data: Vec<Box<RawValue>>,
            has_more: bool,
            next_cursor: Option<String>,
        }
        let mut page_query = query.clone();
        page_query.limit = Some(query.limit.unwrap_or(MAX_PAGE));
        let mut items = Vec::new();
        loop {
            let call = AdminCall::Entries(page_query.clone());
            let page: RawPage = decode(&self.call_raw(&call).await?, &call.describe())?;
            items.extend(page.data);
            match page.next_cursor {
                Some(next) if page.has_more => {
                    // A cursor that does not move would loop forever; report it instead.
                    if page_query.cursor.as_deref() == Some(next.as_str()) {
                        return Err(AdminError::Decode {
                            call: call.describe(),
                            detail: format!("next_cursor {next:?} did not advance"),
                        });
                    }
                    page_query.cursor = Some(next);
                }
                _ => return Ok(items),
            }
        }
    }

    /// Semantic search over cached prompts (`GET /admin/entries?q=`), most similar first.
    pub async fn search(
        &self,
        q: &str,
        limit: Option<u32>,
        filter: &EntryFilter,
    ) -> Result<EntryPage, AdminError> {
        self.entries(&ListQuery {
            namespace: filter.namespace.clone(),
            model: filter.model.clone(),
            q: Some(q.to_owned()),
            limit,
            cursor: None,
        })
        .await
    }

    /// `GET /admin/entries/{id}`.
    pub async fn entry(&self, id: &str) -> Result<EntryDetail, AdminError> {
        self.call(AdminCall::Entry(id.to_owned())).await
    }

    /// `DELETE /admin/entries/{id}`.
    pub async fn delete_entry(&self, id: &str) -> Result<EntryDeleted, AdminError> {
        self.call(AdminCall::DeleteEntry(id.to_owned())).await
    }

    /// `POST /admin/entries` with a JSON array of items.
    pub async fn warm(&self, items: &[WarmItem]) -> Result<WarmResult, AdminError> {
        self.call(AdminCall::Warm(items.to_vec())).await
    }

    /// `POST /admin/entries` with a JSON Lines body (one item per line).
    pub async fn warm_jsonl(&self, body: impl Into<Bytes>) -> Result<WarmResult, AdminError> {
        self.warm_raw(body, WarmFormat::JsonLines).await
    }

    /// `POST /admin/entries` with a body as it is (e.g. a file's contents).
    pub async fn warm_raw(
        &self,
        body: impl Into<Bytes>,
        format: WarmFormat,
    ) -> Result<WarmResult, AdminError> {
        self.call(AdminCall::WarmRaw {
            body: body.into(),
            format,
        })
        .await
    }

    /// `POST /admin/invalidate`.
    pub async fn invalidate(
        &self,
        request: &InvalidateRequest,
    ) -> Result<Invalidation, AdminError> {
        self.call(AdminCall::Invalidate(request.clone())).await
    }

    /// `POST /admin/flush`: deletes every entry.
    pub async fn flush(&self) -> Result<Flush, AdminError> {
        self.call(AdminCall::Flush).await
    }

    /// `GET /admin/config`.
    pub async fn config(&self) -> Result<LiveConfig, AdminError> {
        self.call(AdminCall::Config).await
    }

    /// `PATCH /admin/config`; returns the configuration after the change.
    pub async fn patch_config(&self, patch: &ConfigPatch) -> Result<LiveConfig, AdminError> {
        self.call(AdminCall::PatchConfig(patch.clone())).await
    }

    /// `GET /admin/requests`, newest first; `None` leaves the count to the gateway.
    pub async fn requests(&self, limit: Option<u32>) -> Result<RequestsPage, AdminError> {
        self.call(AdminCall::Requests { limit }).await
    }

    /// `GET /admin/shadow`: one page of shadow decisions.
    pub async fn shadow(&self, query: &ShadowQuery) -> Result<ShadowPage, AdminError> {
        self.call(AdminCall::Shadow(query.clone())).await
    }

    /// `POST /admin/feedback`: `right` or `wrong` on a request's match.
    pub async fn feedback(
        &self,
        request_id: &str,
        verdict: &str,
    ) -> Result<VerdictRecord, AdminError> {
        self.call(AdminCall::Feedback(FeedbackRequest {
            request_id: request_id.to_owned(),
            verdict: verdict.to_owned(),
        }))
        .await
    }

    /// `GET /admin/openapi.json`.
    pub async fn openapi(&self) -> Result<Value, AdminError> {
        self.call(AdminCall::OpenApi).await
    }

    /// `GET /metrics`: Prometheus text format.
    pub async fn metrics(&self) -> Result<String, AdminError> {
        let url = self.url(&["metrics"]);
        let body = self
            .send(self.request(Method::GET, url.clone()), &url)
            .await?;
        String::from_utf8(body.to_vec()).map_err(|e| AdminError::Decode {
            call: "GET /metrics".to_owned(),
            detail: format!("the body is not UTF-8 ({e})"),
        })
    }
}

/// The gateway's largest page size, used when following cursors.
const MAX_PAGE: u32 = 200;

/// Decodes a response body into its contract type, naming the failing field (`at latency.window`).
pub fn decode<T: DeserializeOwned>(body: &[u8], call: &str) -> Result<T, AdminError> {
    let fail = |detail: String| AdminError::Decode {
        call: call.to_owned(),
        detail,
    };
    let not_json = |e: &serde_json::Error| format!("the body is not JSON ({e})");
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        fail(if e.inner().is_syntax() || e.inner().is_eof() {
            not_json(e.inner())
        } else if e.path().to_string() == "." {
            e.inner().to_string()
        } else {
            format!("at {}: {}", e.path(), e.inner())
        })
    })?;
    // Trailing bytes after the document mean the body is not what it claims to be.
    deserializer.end().map_err(|e| fail(not_json(&e)))?;
    Ok(value)
}

/// Builds [`AdminError::Http`] from a non-2xx answer, reading the OpenAI error body when there is one.
fn http_error(status: StatusCode, body: &[u8], url: &Url) -> AdminError {
    #[derive(Deserialize)]
    struct Envelope {
        error: Body,
    }
    #[derive(Deserialize)]
    struct Body {
        message: Option<String>,
        #[serde(rename = "type")]
        kind: Option<String>,
        code: Option<String>,
        param: Option<String>,
    }
    let fallback = || {
        let text = String::from_utf8_lossy(body);
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.is_empty() {
            format!(
                "{} {}",
                status.canonical_reason().unwrap_or("error"),
                url.path()
            )
        } else {
            truncate_chars(&text, 200)
        }
    };
    match serde_json::from_slice::<Envelope>(body) {
        Ok(Envelope { error }) => AdminError::Http {
            status: status.as_u16(),
            message: error.message.unwrap_or_else(fallback),
            kind: error.kind,
            code: error.code,
            param: error.param,
        },
        Err(_) => AdminError::Http {
            status: status.as_u16(),
            message: fallback(),
            kind: None,
            code: None,
            param: None,
        },
    }
}

/// The most specific cause of a transport failure, which is what a person can act on
/// ("Connection refused") rather than reqwest's outer "error sending request".
fn transport_detail(error: &reqwest::Error) -> String {
    if error.is_timeout() {
        return "the request timed out".to_owned();
    }
    let mut detail = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(inner) = source {
        detail = inner.to_string();
        source = inner.source();
    }
    detail
}

/// At most `max` characters of `text`, with an ellipsis when something was cut.
pub fn truncate_chars(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[test]
    fn admin_urls_keep_the_prefix_and_encode_ids() {
        let client =
            AdminClient::new("http://proxy.invalid/reprise/v1/", Some("t")).expect("client");
        assert_eq!(
            client.url(&AdminCall::Stats.segments()).as_str(),
            "http://proxy.invalid/reprise/admin/stats"
        );
        let client = AdminClient::new("http://127.0.0.1:1234", Some("t")).expect("client");
        assert_eq!(
            client
                .url(&AdminCall::Entry("a/b?c".to_owned()).segments())
                .as_str(),
            "http://127.0.0.1:1234/admin/entries/a%2Fb%3Fc"
        );
        assert_eq!(
            client.url(&["metrics"]).as_str(),
            "http://127.0.0.1:1234/metrics"
        );
    }

    #[test]
    fn debug_never_shows_the_token() {
        let client = AdminClient::new("http://127.0.0.1:1234", Some("s3cret")).expect("client");
        let shown = format!("{client:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("*****"), "{shown}");
    }

    #[test]
    fn env_defaults_to_the_local_gateway() {
        let client = AdminClient::from_vars(None, None).expect("client");
        assert_eq!(client.root().as_str(), "http://127.0.0.1:8080/");
        assert!(client.token.is_none());
        let client =
            AdminClient::from_vars(Some("  ".to_owned()), Some("t".to_owned())).expect("client");
        assert_eq!(client.root().as_str(), "http://127.0.0.1:8080/");
        assert_eq!(client.token.as_deref(), Some("t"));
        let client = AdminClient::from_vars(Some("http://10.0.0.5:9000/v1".to_owned()), None)
            .expect("client");
        assert_eq!(client.root().as_str(), "http://10.0.0.5:9000/");
    }

    #[test]
    fn empty_token_counts_as_none() {
        let client = AdminClient::new("http://127.0.0.1:1234", Some("")).expect("client");
        assert!(client.token.is_none());
    }

    #[test]
    fn http_errors_read_the_openai_body() {
        let url = Url::parse("http://h.invalid/admin/entries").expect("url");
        let body = br#"{"error":{"message":"limit must be 1..=200","type":"invalid_request_error","param":"limit","code":"invalid_value"}}"#;
        let err = http_error(StatusCode::BAD_REQUEST, body, &url);
        assert_eq!(err.status(), Some(400));
        assert_eq!(err.param(), Some("limit"));
        assert_eq!(err.code(), Some("invalid_value"));
        assert_eq!(
            err.to_string(),
            "limit must be 1..=200 (HTTP 400 invalid_value, param limit)"
        );
    }

    #[test]
    fn auth_and_disabled_errors_give_advice() {
        let url = Url::parse("http://h.invalid/admin/stats").expect("url");
        let err = http_error(
            StatusCode::UNAUTHORIZED,
            br#"{"error":{"message":"Invalid admin token.","type":"authentication_error","param":null,"code":"invalid_admin_token"}}"#,
            &url,
        );
        let text = err.to_string();
        assert!(text.contains("admin token"), "{text}");
        assert!(text.contains("REPRISE_ADMIN_TOKEN"), "{text}");
        assert!(text.contains("401"), "{text}");

        let err = http_error(
            StatusCode::NOT_FOUND,
            br#"{"error":{"message":"Admin routes are disabled.","type":"invalid_request_error","param":null,"code":"admin_disabled"}}"#,
            &url,
        );
        let text = err.to_string();
        assert!(text.contains("started without --admin-token"), "{text}");
        assert_eq!(err.code(), Some("admin_disabled"));
    }

    #[test]
    fn non_json_error_bodies_are_kept_short() {
        let url = Url::parse("http://h.invalid/admin/stats").expect("url");
        let err = http_error(
            StatusCode::BAD_GATEWAY,
            b"<html>\n  bad   gateway\n</html>",
            &url,
        );
        assert_eq!(err.to_string(), "<html> bad gateway </html> (HTTP 502)");
        let err = http_error(StatusCode::NOT_FOUND, b"", &url);
        let text = err.to_string();
        assert!(
            text.starts_with("Not Found /admin/stats (HTTP 404)"),
            "{text}"
        );
        assert!(text.contains("REPRISE_URL"), "{text}");
        let long = "x".repeat(500);
        let err = http_error(StatusCode::INTERNAL_SERVER_ERROR, long.as_bytes(), &url);
        assert!(err.to_string().chars().count() < 230, "{err}");
    }

    #[test]
    fn decode_errors_name_the_field() {
        let body = br#"{"object": "reprise.flush", "deleted": "many"}"#;
        let err = decode::<Flush>(body, "POST /admin/flush").expect_err("bad type");
        let text = err.to_string();
        assert!(
            text.starts_with("unexpected response to POST /admin/flush: at deleted:"),
            "{text}"
        );
        let err = decode::<Flush>(b"<html>", "POST /admin/flush").expect_err("not JSON");
        assert!(err.to_string().contains("the body is not JSON"), "{err}");
        let err = decode::<Value>(b"{} {}", "POST /admin/flush").expect_err("two documents");
        assert!(err.to_string().contains("the body is not JSON"), "{err}");
    }

    #[test]
    fn truncation_counts_characters() {
        assert_eq!(truncate_chars("héllo", 5), "héllo");
        assert_eq!(truncate_chars("héllo wörld", 6), "héllo…");
    }
}
