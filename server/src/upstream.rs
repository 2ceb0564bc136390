//! The upstream provider's HTTP client: one pooled `reqwest` client, the headers a request carries
//! upstream (hop-by-hop removed, credentials replaced when the gateway holds its own key), and the
//! names of what went wrong with an exchange. It knows nothing of the cache or of a request's stages.

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::http::{header, HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use tokio::time::timeout_at;

use crate::config::{Config, Secret};
use crate::error::GatewayError;
use crate::ingress::Provider;

/// Hop-by-hop headers (RFC 9110 §7.6.1) and those the gateway recomputes; never forwarded either way.
pub(crate) const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// The pooled HTTP client for the configured upstream.
pub struct Upstream {
    pub(crate) client: reqwest::Client,
    base_url: String,
    /// Anthropic's base URL, for [`Provider::Anthropic`] requests.
    anthropic_base_url: String,
    /// The gateway's own key for Anthropic (`anthropic_api_key`), sent as `x-api-key`.
    anthropic_api_key: Option<Secret>,
    api_key: Option<Secret>,
    pub(crate) first_byte_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// What each upstream answers browsers' origins, for the answers the gateway makes itself.
    pub(crate) cors: crate::cors::Cors,
}

impl Upstream {
    pub fn new(config: &Config) -> Result<Self, GatewayError> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout())
            // A redirect is the upstream's answer, relayed as it is: following it would turn the
            // POST into a body-less GET elsewhere and cache that under the prompt's key.
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            // Each request is already bounded by the first-byte and idle timeouts below.
            .build()
            .map_err(|e| GatewayError::Internal {
                detail: format!("building the upstream client: {e}"),
            })?;
        Ok(Self {
            client,
            base_url: config.upstream_url.clone(),
            anthropic_base_url: config.anthropic_upstream_url.clone(),
            anthropic_api_key: config.anthropic_api_key.clone(),
            api_key: config.upstream_api_key.clone(),
            first_byte_timeout: config.first_byte_timeout(),
            idle_timeout: config.idle_timeout(),
            cors: crate::cors::Cors::default(),
        })
    }

    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Anthropic's base URL (`anthropic_upstream_url`), where `/v1/messages` goes.
    pub fn anthropic_base_url(&self) -> &str {
        &self.anthropic_base_url
    }

    /// The URL of `path` (below `/v1`) on the provider's upstream.
    pub(crate) fn url(&self, provider: Provider, path: &str, query: Option<&str>) -> String {
        let base = match provider {
            Provider::OpenAi => &self.base_url,
            Provider::Anthropic => &self.anthropic_base_url,
        };
        match query {
            Some(q) => format!("{base}{path}?{q}"),
            None => format!("{base}{path}"),
        }
    }

    /// Client headers as sent upstream: hop-by-hop (and those the client's `Connection` names) and
    /// gateway controls removed, the client's credentials replaced when an upstream key is
    /// configured, compression refused so that the relay can read the events it passes on.
    /// `json_body` is set on the cacheable routes, whose body the gateway checked is JSON: they get
    /// exactly one `Content-Type` (a strict server rejects a duplicate one). Each provider gets only
    /// its own key: `upstream_api_key` goes to `upstream_url`, `anthropic_api_key` (as `x-api-key`,
    /// the header Anthropic reads) to Anthropic ([`Provider::Anthropic`]); without the latter,
    /// requests to Anthropic keep the client's own credentials.
    pub(crate) fn outgoing_headers(
        &self,
        incoming: &HeaderMap,
        json_body: bool,
        provider: Provider,
    ) -> HeaderMap {
        let named = connection_named(incoming);
        let mut out = HeaderMap::with_capacity(incoming.len());
        for (name, value) in incoming {
            let n = name.as_str();
            if HOP_BY_HOP.contains(&n)
                || named.contains(name)
                || n.starts_with("x-reprise-")
                || n == "accept-encoding"
                || (json_body && (n == "content-length" || n == "content-type"))
            {
                continue;
            }
            out.append(name.clone(), value.clone());
        }
        if json_body {
            out.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
        }
        if let Some(key) = self
            .api_key
            .as_ref()
            .filter(|_| provider == Provider::OpenAi)
        {
            let credential = |text: String| {
                HeaderValue::from_str(&text).ok().map(|mut v| {
                    v.set_sensitive(true);
                    v
                })
            };
            // Azure-style clients send `api-key`, Anthropic's `x-api-key`: each is replaced like
            // `Authorization` (kept in the header the client used, since that is the one its
            // upstream reads), so that no client credential goes upstream once the gateway holds
            // its own.
            for name in crate::key::CREDENTIAL_HEADERS {
                if name == "authorization" {
                    continue;
                }
                let name = HeaderName::from_static(name);
                out.remove(&name);
                if incoming.contains_key(&name) {
                    if let Some(value) = credential(key.expose().to_owned()) {
                        out.insert(name, value);
                    }
                }
            }
            out.remove(header::AUTHORIZATION);
            if let Some(value) = credential(format!("Bearer {}", key.expose())) {
                out.insert(header::AUTHORIZATION, value);
            }
        }
        if let Some(key) = self
            .anthropic_api_key
            .as_ref()
            .filter(|_| provider == Provider::Anthropic)
        {
            // Every client credential goes, whichever header it came in, as for the OpenAI
            // upstream: once the gateway holds its own key, no client's key goes upstream.
            for name in crate::key::CREDENTIAL_HEADERS {
                out.remove(HeaderName::from_static(name));
            }
            if let Ok(mut value) = HeaderValue::from_str(key.expose()) {
                value.set_sensitive(true);
                out.insert(HeaderName::from_static("x-api-key"), value);
            }
        }
        out.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        out
    }

    /// Sends one request and waits for the response head, within the first-byte deadline.
    pub(crate) async fn send(
        &self,
        request: reqwest::RequestBuilder,
        deadline: tokio::time::Instant,
    ) -> Result<reqwest::Response, GatewayError> {
        match timeout_at(deadline, request.send()).await {
            Err(_) => Err(self.timeout_error()),
            Ok(Err(err)) => Err(self.error_for(&err, self.first_byte_timeout)),
            Ok(Ok(response)) => Ok(response),
        }
    }

    /// Names what went wrong with an upstream exchange: no connection (refused, DNS, TLS), no
    /// answer in time, or an answer that is not valid HTTP (a malformed head, a connection closed
    /// or reset before the response was complete).
    pub(crate) fn error_for(&self, err: &reqwest::Error, timeout: Duration) -> GatewayError {
        if err.is_timeout() {
            return GatewayError::UpstreamTimeout {
                timeout_ms: timeout.as_millis() as u64,
            };
        }
        if err.is_connect() {
            return GatewayError::UpstreamUnreachable {
                upstream: err
                    .url()
                    .map_or_else(|| self.base_url.clone(), requested_upstream),
                detail: error_chain(err),
            };
        }
        GatewayError::UpstreamProtocolError {
            reason: protocol_reason(err),
            detail: error_chain(err),
        }
    }

    pub(crate) fn timeout_error(&self) -> GatewayError {
        GatewayError::UpstreamTimeout {
            timeout_ms: self.first_byte_timeout.as_millis() as u64,
        }
    }
}

/// A phrase, safe to show the client, for an upstream response that was not valid HTTP.
fn protocol_reason(err: &reqwest::Error) -> &'static str {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            if h.is_parse() {
                return "its response head was malformed";
            }
            if h.is_incomplete_message() {
                return "it closed the connection before the response was complete";
            }
        }
        source = e.source();
    }
    if err.is_body() || err.is_decode() {
        return "its response body broke off";
    }
    "the connection failed during the exchange"
}

/// Header names listed in `Connection` (RFC 9110 §7.6.1): meant for this hop only.
pub(crate) fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|token| HeaderName::from_bytes(token.trim().as_bytes()).ok())
        .collect()
}

/// `reqwest` errors hide their cause (connection refused, DNS…) in the source chain.
/// The upstream a failed request went to, as an operator would name it: a route may have its own
/// (the Messages API goes to `anthropic_upstream_url`, not `upstream_url`), so the error names the
/// one that was tried, without credentials, query or fragment.
fn requested_upstream(url: &reqwest::Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// A request body of known length that notes when the client library took it for the socket:
/// that instant ends `upstream_send` (connect or pool checkout, head and body written).
pub(crate) struct TimedBody {
    pub(crate) data: Option<Bytes>,
    pub(crate) taken: Arc<OnceLock<Instant>>,
}

impl http_body::Body for TimedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let data = self.data.take();
        if data.is_some() {
            let _ = self.taken.set(Instant::now());
        }
        Poll::Ready(data.map(|d| Ok(http_body::Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}
