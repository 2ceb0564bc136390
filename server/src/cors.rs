//! What each upstream answers a browser's origin (its CORS response headers), learned from the
//! responses it sends and given to the answers the gateway makes itself (hits, followers, and its
//! own errors: without them a page sees a CORS failure, never the error's status and message).
//!
//! A browser reads a cross-origin response only when it carries `Access-Control-Allow-Origin` for
//! the page's origin. A miss relays the upstream's headers, so it has them; a hit is the gateway's
//! own answer, and without them the browser refuses it although the same request had worked as a
//! miss. The policy is the upstream's (OpenAI and Anthropic grant browsers access on their own
//! terms), so the gateway never invents one: it repeats what the upstream last said to the same
//! asker, and a request from an asker it has not heard the upstream answer yet goes upstream (see
//! `pipeline/lookup.rs`) to learn it.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::http::header::{
    ACCESS_CONTROL_ALLOW_CREDENTIALS, ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS,
    ORIGIN, VARY,
};
use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::ingress::Provider;
use crate::key::Tenant;
use crate::lock::lock;

/// The response headers that make up a CORS answer to an actual (not preflight) request.
const ANSWER: [HeaderName; 3] = [
    ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_ALLOW_CREDENTIALS,
    ACCESS_CONTROL_EXPOSE_HEADERS,
];

/// Anthropic answers a browser only when the request opts in with this header.
const ANTHROPIC_OPT_IN: &str = "anthropic-dangerous-direct-browser-access";

/// Askers remembered per process. A browser app has one origin or a few; past this many (origins
/// made up by a client) one is forgotten for each new one, which relearns with one miss.
const MAX_ASKERS: usize = 1024;

/// An `Origin` longer than any real one (a scheme, a host name of at most 253 bytes and a port) is
/// never learned: its requests always go upstream.
const MAX_ORIGIN_BYTES: usize = 300;

/// Whom an upstream's CORS answer was given to: a browser's origin, as one tenant asked from it
/// (an upstream may grant browsers per key), opted in to Anthropic's browser access or not.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Asker {
    provider: Provider,
    tenant: Tenant,
    origin: HeaderValue,
    opted_in: bool,
}

impl Asker {
    /// The asker of a request from a browser (one with `Origin`: browsers send it on cross-origin
    /// requests and on any `POST`; the SDKs outside a browser do not); `None` otherwise, before
    /// any credential is hashed. Per key even when keys share answers: an upstream may grant
    /// browsers per key.
    pub(crate) fn of(provider: Provider, request: &HeaderMap) -> Option<Self> {
        let origin = request.get(ORIGIN)?.clone();
        let tenant = Tenant::from_headers(request, false);
        let opted_in = provider == Provider::Anthropic
            && request
                .get(ANTHROPIC_OPT_IN)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        Some(Self {
            provider,
            tenant,
            origin,
            opted_in,
        })
    }
}

/// The CORS headers an upstream sent to one asker (empty when it sent none: a hit then sends none
/// either, and the browser refuses it as it would have refused the upstream's answer).
pub(crate) type Answer = Vec<(HeaderName, HeaderValue)>;

/// What each upstream last answered each asker.
#[derive(Default)]
pub(crate) struct Cors {
    known: Mutex<HashMap<Asker, Answer>>,
}

impl Cors {
    /// Notes the CORS headers of a successful (2xx) upstream response to `asker`. An error page
    /// (a refused key, a rate limit, a proxy's 502) may carry none, or other ones, and must not
    /// decide what the hits of a request that works carry.
    pub(crate) fn learn(&self, asker: &Asker, success: bool, response: &HeaderMap) {
        if !success || asker.origin.len() > MAX_ORIGIN_BYTES {
            return;
        }
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
        if known.len() >= MAX_ASKERS && !known.contains_key(asker) {
            if let Some(any) = known.keys().next().cloned() {
                known.remove(&any);
            }
        }
        known.insert(asker.clone(), answer);
    }

    /// What the upstream last answered `asker`; `None` when it has not been heard yet.
    pub(crate) fn answer(&self, asker: &Asker) -> Option<Answer> {
        lock(&self.known).get(asker).cloned()
    }
}

/// Adds a learned answer, if any, to the gateway's own response: a hit, or an error of the
/// gateway's own, which a browser can read (its status, its message) only with these headers.
pub(crate) fn apply(answer: Option<&Answer>, response: &mut HeaderMap) {
    for (name, value) in answer.into_iter().flatten() {
        response.append(name.clone(), value.clone());
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

    fn asker(provider: Provider, tenant: u8, request: &[(&str, &str)]) -> Asker {
        let key = format!("Bearer sk-{tenant}");
        let mut request = request.to_vec();
        request.push(("authorization", &key));
        Asker::of(provider, &headers(&request)).expect("an origin")
    }

    #[test]
    fn an_asker_gets_what_its_upstream_answered_it_and_nothing_is_made_up() {
        let cors = Cors::default();
        assert!(Asker::of(Provider::OpenAi, &HeaderMap::new()).is_none());
        let app = asker(Provider::OpenAi, 1, &[("origin", "https://app.example")]);
        assert_eq!(cors.answer(&app), None);
        let granted = headers(&[
            ("access-control-allow-origin", "https://app.example"),
            ("access-control-expose-headers", "x-request-id"),
            ("vary", "Accept-Encoding, origin"),
            ("content-type", "application/json"),
        ]);
        // An error page teaches nothing.
        cors.learn(&app, false, &HeaderMap::new());
        assert_eq!(cors.answer(&app), None);
        cors.learn(&app, true, &granted);
        let mut response = HeaderMap::new();
        apply(Some(&cors.answer(&app).expect("known")), &mut response);
        assert_eq!(
            response,
            headers(&[
                ("access-control-allow-origin", "https://app.example"),
                ("access-control-expose-headers", "x-request-id"),
                ("vary", "Origin"),
            ])
        );
        // Learned per upstream and per tenant.
        let anthropic = asker(Provider::Anthropic, 1, &[("origin", "https://app.example")]);
        let other_tenant = asker(Provider::OpenAi, 2, &[("origin", "https://app.example")]);
        assert_eq!(cors.answer(&anthropic), None);
        assert_eq!(cors.answer(&other_tenant), None);
        // Anthropic's opt-in is part of the asker: a grant to it is not given to a request without.
        let opted = asker(
            Provider::Anthropic,
            1,
            &[
                ("origin", "https://app.example"),
                ("anthropic-dangerous-direct-browser-access", "true"),
            ],
        );
        assert_ne!(opted, anthropic);
        cors.learn(&opted, true, &granted);
        assert_eq!(cors.answer(&anthropic), None);
        // An upstream that grants nothing: known, and a hit grants nothing either.
        let denied = asker(Provider::OpenAi, 1, &[("origin", "https://evil.example")]);
        cors.learn(&denied, true, &headers(&[("content-type", "text/plain")]));
        assert_eq!(cors.answer(&denied), Some(Vec::new()));
    }

    #[test]
    fn past_its_bound_the_memory_forgets_one_asker_per_new_one() {
        let cors = Cors::default();
        let allow = headers(&[("access-control-allow-origin", "*")]);
        let of = |i: usize| {
            asker(
                Provider::OpenAi,
                1,
                &[("origin", &format!("https://{i}.example"))],
            )
        };
        for i in 0..MAX_ASKERS {
            cors.learn(&of(i), true, &allow);
        }
        cors.learn(&of(MAX_ASKERS), true, &allow);
        let known = (0..=MAX_ASKERS)
            .filter(|&i| cors.answer(&of(i)).is_some())
            .count();
        assert_eq!(known, MAX_ASKERS);
        assert!(cors.answer(&of(MAX_ASKERS)).is_some());
        // An origin no browser sends is never learned.
        let long = asker(Provider::OpenAi, 1, &[("origin", &"x".repeat(400))]);
        cors.learn(&long, true, &allow);
        assert_eq!(cors.answer(&long), None);
    }
}
