//! What each upstream answers a browser's origin (its CORS response headers), learned from the
//! responses it sends and given to the answers the gateway makes itself (hits, followers).
//!
//! A browser reads a cross-origin response only when it carries `Access-Control-Allow-Origin` for
//! the page's origin. A miss relays the upstream's headers, so it has them; a hit is the gateway's
//! own answer, and without them the browser refuses it although the same request had worked as a
//! miss. The policy is the upstream's (OpenAI's and Anthropic's grant browsers access on their own
//! terms), so the gateway never invents one: it repeats what the upstream last said to that origin,
//! and a request from an origin it has not heard the upstream answer yet goes upstream (a miss that
//! still stores its answer) to learn it.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS,
    ORIGIN, VARY,
};
use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::ingress::Provider;
use crate::lock::lock;

/// The response headers that make up a CORS answer to an actual (not preflight) request.
const ANSWER: [HeaderName; 3] = [
    ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_ALLOW_CREDENTIALS,
    ACCESS_CONTROL_EXPOSE_HEADERS,
];

/// Origins remembered per process. A browser app has one or a few; past this many (origins made up
/// by a client) the memory starts over, each origin then relearning with one miss.
const MAX_ORIGINS: usize = 1024;

/// The CORS headers an upstream sent to one origin (empty when it sent none: a hit then sends none
/// either, and the browser refuses it as it would have refused the upstream's answer).
pub(crate) type Answer = Vec<(HeaderName, HeaderValue)>;

/// What each upstream last answered each origin.
#[derive(Default)]
pub(crate) struct Cors {
    known: Mutex<HashMap<(Provider, HeaderValue), Answer>>,
}

impl Cors {
    /// The request's `Origin`, when it has one (browsers send it on cross-origin requests and on
    /// any `POST`; the SDKs outside a browser do not).
    pub(crate) fn origin(request: &HeaderMap) -> Option<&HeaderValue> {
        request.get(ORIGIN)
    }

    /// Notes the CORS headers of `provider`'s response to a request from `origin`.
    pub(crate) fn learn(&self, provider: Provider, origin: &HeaderValue, response: &HeaderMap) {
        let mut answer: Answer = ANSWER
            .iter()
            .flat_map(|name| {
                response
                    .get_all(name)
                    .iter()
                    .map(|v| (name.clone(), v.clone()))
            })
            .collect();
        // The answer depends on the origin: a cache between the browser and the gateway must know.
        let varies = response.get_all(VARY).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("origin"))
            })
        });
        if varies {
            answer.push((VARY, HeaderValue::from_static("Origin")));
        }
        let mut known = lock(&self.known);
        if known.len() >= MAX_ORIGINS && !known.contains_key(&(provider, origin.clone())) {
            known.clear();
        }
        known.insert((provider, origin.clone()), answer);
    }

    /// What `provider` last answered `origin`; `None` when it has not been heard yet.
    pub(crate) fn answer(&self, provider: Provider, origin: &HeaderValue) -> Option<Answer> {
        lock(&self.known).get(&(provider, origin.clone())).cloned()
    }

    /// Whether a request with these headers can be answered by the gateway itself: it names no
    /// origin, or the upstream's answer to its origin is known.
    pub(crate) fn can_answer(&self, provider: Provider, request: &HeaderMap) -> bool {
        Self::origin(request)
            .is_none_or(|origin| lock(&self.known).contains_key(&(provider, origin.clone())))
    }

    /// Adds to `response` what `provider` answered the request's origin, if it has one.
    pub(crate) fn apply(&self, provider: Provider, request: &HeaderMap, response: &mut HeaderMap) {
        let Some(answer) = Self::origin(request).and_then(|o| self.answer(provider, o)) else {
            return;
        };
        for (name, value) in answer {
            response.append(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        h
    }

    #[test]
    fn an_origin_gets_what_its_upstream_answered_it_and_nothing_is_made_up() {
        let cors = Cors::default();
        let app = HeaderValue::from_static("https://app.example");
        let request = headers(&[("origin", "https://app.example")]);
        assert!(!cors.can_answer(Provider::OpenAi, &request));
        assert!(cors.can_answer(Provider::OpenAi, &HeaderMap::new()));
        cors.learn(
            Provider::OpenAi,
            &app,
            &headers(&[
                ("access-control-allow-origin", "https://app.example"),
                ("access-control-expose-headers", "x-request-id"),
                ("vary", "Accept-Encoding, origin"),
                ("content-type", "application/json"),
            ]),
        );
        assert!(cors.can_answer(Provider::OpenAi, &request));
        // Learned per upstream: Anthropic's answer to the same origin is its own.
        assert!(!cors.can_answer(Provider::Anthropic, &request));
        let mut response = HeaderMap::new();
        cors.apply(Provider::OpenAi, &request, &mut response);
        assert_eq!(
            response,
            headers(&[
                ("access-control-allow-origin", "https://app.example"),
                ("access-control-expose-headers", "x-request-id"),
                ("vary", "Origin"),
            ])
        );
        // An upstream that grants nothing: known, and a hit grants nothing either.
        let other = HeaderValue::from_static("https://evil.example");
        cors.learn(Provider::OpenAi, &other, &headers(&[("vary", "Origin")]));
        let request = headers(&[("origin", "https://evil.example")]);
        assert!(cors.can_answer(Provider::OpenAi, &request));
        let mut response = HeaderMap::new();
        cors.apply(Provider::OpenAi, &request, &mut response);
        assert_eq!(response, headers(&[("vary", "Origin")]));
    }

    #[test]
    fn past_its_bound_the_memory_starts_over() {
        let cors = Cors::default();
        let allow = headers(&[("access-control-allow-origin", "*")]);
        for i in 0..MAX_ORIGINS {
            let origin = HeaderValue::from_str(&format!("https://{i}.example")).expect("value");
            cors.learn(Provider::OpenAi, &origin, &allow);
        }
        let first = HeaderValue::from_static("https://0.example");
        assert!(cors.answer(Provider::OpenAi, &first).is_some());
        let one_more = HeaderValue::from_static("https://new.example");
        cors.learn(Provider::OpenAi, &one_more, &allow);
        assert!(cors.answer(Provider::OpenAi, &first).is_none());
        assert!(cors.answer(Provider::OpenAi, &one_more).is_some());
    }
}
