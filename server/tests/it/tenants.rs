//! Tenant isolation by credential: every header a client may carry its API key in
//! (`Authorization`, `api-key`, `x-api-key`) keeps clients with different keys apart on every
//! cacheable route, on sled and on a shared Redis, and none of them reaches the upstream once the
//! gateway holds its own key.

use std::time::Duration;

use serde_json::{json, Value};

use crate::common::*;
use crate::redis::{on_redis, RedisServer};

/// The cacheable routes and a request body for each.
fn routes(question: &str) -> Vec<(&'static str, Value)> {
    vec![
        (
            "/v1/chat/completions",
            json!({"model": "sim-model", "messages": [{"role": "user", "content": question}]}),
        ),
        (
            "/v1/completions",
            json!({"model": "sim-model", "prompt": question}),
        ),
        (
            "/v1/embeddings",
            json!({"model": "sim-model", "input": question}),
        ),
        (
            "/v1/responses",
            json!({"model": "sim-model", "input": question}),
        ),
    ]
}

/// How a client sends its key in `header`.
fn credential(header: &str, key: &str) -> String {
    if header == "authorization" {
        format!("Bearer {key}")
    } else {
        key.to_owned()
    }
}

async fn send(gw: &Gateway, path: &str, body: &Value, headers: &[(&str, String)]) -> String {
    let mut request = client()
        .post(gw.url(path))
        .json(body)
        .timeout(Duration::from_secs(30));
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.expect("the gateway answers");
    assert_eq!(response.status(), 200, "{path}");
    let outcome = header(&response, "x-reprise-cache").expect("x-reprise-cache");
    response.bytes().await.expect("body");
    outcome
}

/// Asks until the answer is served from the cache (it is written off the request path).
async fn until_hit(gw: &Gateway, path: &str, body: &Value, headers: &[(&str, String)]) {
    for _ in 0..200 {
        if send(gw, path, body, headers).await == "hit" {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{path}: the first tenant's answer was never served from the cache");
}

/// For each route and credential header: tenant A's answer becomes a hit for A, and is never
/// served to B, whose key differs in that header only (alone, or beside a shared `Authorization`).
async fn tenants_stay_apart(gw: &Gateway, store: &str) {
    for header in reprise_server::key::CREDENTIAL_HEADERS {
        for (path, body) in routes(&format!("What does tenant isolation mean for {header}?")) {
            let a = [(header, credential(header, "key-a"))];
            let b = [(header, credential(header, "key-b"))];
            assert_eq!(send(gw, path, &body, &a).await, "miss", "{store} {path}");
            until_hit(gw, path, &body, &a).await;
            assert_eq!(
                send(gw, path, &body, &b).await,
                "miss",
                "{store} {path}: a client with another `{header}` was served another tenant's answer"
            );
            if header != "authorization" {
                // Two clients behind one shared bearer token (a proxy's, say) that differ in the
                // key the upstream reads.
                let shared = ("authorization", credential("authorization", "shared"));
                let a = [shared.clone(), (header, credential(header, "key-a"))];
                let b = [shared, (header, credential(header, "key-b"))];
                assert_eq!(send(gw, path, &body, &a).await, "miss", "{store} {path}");
                until_hit(gw, path, &body, &a).await;
                assert_eq!(
                    send(gw, path, &body, &b).await,
                    "miss",
                    "{store} {path}: `{header}` beside a shared Authorization did not separate tenants"
                );
            }
        }
    }
}

#[tokio::test]
async fn every_credential_header_separates_tenants_on_sled() {
    let sim = quick_sim().await;
    let mut config = config_for(sim.base_url());
    config.semantic = false;
    let gw = start(config).await;
    tenants_stay_apart(&gw, "sled").await;
}

#[tokio::test]
async fn every_credential_header_separates_tenants_on_redis() {
    let Some(redis) = RedisServer::start() else {
        return;
    };
    let sim = quick_sim().await;
    let mut config = on_redis(config_for(sim.base_url()), &redis);
    config.semantic = false;
    let gw = start(config).await;
    tenants_stay_apart(&gw, "redis").await;
}

/// With `--upstream-api-key`, the key the client sent in any credential header is replaced with
/// the gateway's, in the header the client used: before, a client's `x-api-key` went upstream.
#[tokio::test]
async fn the_upstream_key_replaces_every_client_credential() {
    let sim = quick_sim().await;
    let mut config = config_for(sim.base_url());
    config.semantic = false;
    config.upstream_api_key = Some(reprise_server::config::Secret::new("sk-gateway"));
    let gw = start(config).await;
    for header in reprise_server::key::CREDENTIAL_HEADERS {
        let sent = [(header, credential(header, "client-secret-key"))];
        for (path, body) in routes(&format!("Which key goes upstream for {header}?")) {
            assert_eq!(send(&gw, path, &body, &sent).await, "miss");
            let seen = sim.stats.snapshot().last_headers;
            assert!(
                !seen.iter().any(|(_, v)| v.contains("client-secret-key")),
                "{path}: the client's `{header}` went upstream: {seen:?}"
            );
            let value = |name: &str| {
                seen.iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(value("authorization").as_deref(), Some("Bearer sk-gateway"));
            if header != "authorization" {
                assert_eq!(value(header).as_deref(), Some("sk-gateway"), "{path}");
            }
        }
    }
}

/// One key acting for two organizations or projects (a user key may reach several): each is its
/// own tenant, so a stored response's id never answers another organization's request. Before,
/// the key alone decided and org B was served org A's response id.
#[tokio::test]
async fn one_key_in_two_organizations_is_two_tenants() {
    let sim = sim_default().await;
    let gw = start(config_for(sim.base_url())).await;
    let bearer = credential("authorization", "sk-user");
    for (path, body) in routes("Which organization asked?") {
        let org_a = [
            ("authorization", bearer.clone()),
            ("openai-organization", "org-A".to_owned()),
        ];
        assert_eq!(send(&gw, path, &body, &org_a).await, "miss", "{path}");
        until_hit(&gw, path, &body, &org_a).await;
        let org_b = [
            ("authorization", bearer.clone()),
            ("openai-organization", "org-B".to_owned()),
        ];
        assert_eq!(
            send(&gw, path, &body, &org_b).await,
            "miss",
            "{path}: org B"
        );
        let project = [
            ("authorization", bearer.clone()),
            ("openai-organization", "org-A".to_owned()),
            ("openai-project", "proj_2".to_owned()),
        ];
        assert_eq!(
            send(&gw, path, &body, &project).await,
            "miss",
            "{path}: a project of org A"
        );
        let key_alone = [("authorization", bearer.clone())];
        assert_eq!(
            send(&gw, path, &body, &key_alone).await,
            "miss",
            "{path}: no organization"
        );
    }
}
