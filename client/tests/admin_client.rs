//! The admin client and the admin subcommands against an in-process mock gateway: what goes on the
//! wire (token, method, path, query, body, content type), how answers and errors are read, and what
//! the subcommands print. The real gateway is exercised by the server's end-to-end tests.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use clap::Parser;
use reprise_client::admin::{
    AdminClient, AdminError, ConfigPatch, EntryFilter, InvalidateRequest, ListQuery, WarmItem,
};
use reprise_client::admin_cli::{self, AdminCommand, CliError};
use serde_json::{json, Value};

const STATS: &str = include_str!("fixtures/stats.json");
const PAGE: &str = include_str!("fixtures/entries_page.json");
const SEARCH: &str = include_str!("fixtures/entries_search.json");
const DETAIL: &str = include_str!("fixtures/entry_detail.json");
const DELETED: &str = include_str!("fixtures/entry_deleted.json");
const WARMED: &str = include_str!("fixtures/warm_result.json");
const INVALIDATION: &str = include_str!("fixtures/invalidation.json");
const FLUSH: &str = include_str!("fixtures/flush.json");
const CONFIG: &str = include_str!("fixtures/config.json");
const REQUESTS: &str = include_str!("fixtures/requests.json");
const ERROR_401: &str = include_str!("fixtures/error_401.json");
const ERROR_404_DISABLED: &str = include_str!("fixtures/error_404_admin_disabled.json");
const ERROR_400_LIMIT: &str = include_str!("fixtures/error_400_limit.json");

/// One request as the mock received it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: Option<String>,
    authorization: Option<String>,
    content_type: Option<String>,
    body: Bytes,
}

impl Seen {
    fn query_pairs(&self) -> Vec<(String, String)> {
        let query = self.query.clone().unwrap_or_default();
        reqwest::Url::parse(&format!("http://x.invalid/?{query}"))
            .expect("query")
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    }

    fn param(&self, name: &str) -> Option<String> {
        self.query_pairs()
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

type Responder = dyn Fn(&Seen) -> (u16, String) + Send + Sync;

#[derive(Clone)]
struct MockState {
    seen: Arc<Mutex<Vec<Seen>>>,
    respond: Arc<Responder>,
}

/// A gateway stand-in on an ephemeral port that records every request and answers with `respond`.
struct Mock {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Mock {
    async fn start(respond: impl Fn(&Seen) -> (u16, String) + Send + Sync + 'static) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let state = MockState {
            seen: seen.clone(),
            respond: Arc::new(respond),
        };
        let app = Router::new().fallback(record).with_state(state);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        // The server lives as long as the test's runtime; nothing needs to finish cleanly.
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            url: format!("http://{addr}"),
            seen,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("lock").clone()
    }

    fn only(&self) -> Seen {
        let seen = self.seen();
        assert_eq!(seen.len(), 1, "expected one request, got {seen:#?}");
        seen[0].clone()
    }

    fn client(&self) -> AdminClient {
        AdminClient::new(&self.url, Some("tok")).expect("client")
    }
}

async fn record(State(state): State<MockState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let header = |name: header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let seen = Seen {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        query: parts.uri.query().map(str::to_owned),
        authorization: header(header::AUTHORIZATION),
        content_type: header(header::CONTENT_TYPE),
        body: axum::body::to_bytes(body, usize::MAX).await.expect("body"),
    };
    let (status, body) = (state.respond)(&seen);
    state.seen.lock().expect("lock").push(seen);
    let content_type = if body.trim_start().starts_with(['{', '[']) {
        "application/json"
    } else {
        "text/plain; version=0.0.4"
    };
    (
        StatusCode::from_u16(status).expect("status"),
        [(header::CONTENT_TYPE, content_type)],
        body,
    )
        .into_response()
}

/// Always the same answer.
fn always(status: u16, body: &'static str) -> impl Fn(&Seen) -> (u16, String) + Send + Sync {
    move |_| (status, body.to_owned())
}

// ---------------------------------------------------------------------------------------------
// The typed client
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn stats_sends_the_bearer_token_and_decodes_the_contract() {
    let mock = Mock::start(always(200, STATS)).await;
    // A `/v1/` base URL (the OpenAI one) reaches the admin routes at the root.
    let client = AdminClient::new(&format!("{}/v1/", mock.url), Some("tok")).expect("client");
    let stats = client.stats().await.expect("stats");
    let seen = mock.only();
    assert_eq!(seen.method, "GET");
    assert_eq!(seen.path, "/admin/stats");
    assert_eq!(seen.authorization.as_deref(), Some("Bearer tok"));
    assert_eq!(stats.requests.total, 100);
    assert_eq!(stats.rates.hit, 0.61);
    assert_eq!(stats.ttft_saved_ms.per_hit, Some(411.2));
    let phase = |outcome: &str, name: &str| {
        stats.latency.by_outcome[outcome]
            .phases
            .get(name)
            .copied()
            .flatten()
    };
    assert_eq!(phase("hit", "embed_ms"), None);
    assert_eq!(phase("miss", "ttft_ms").expect("miss ttft").p99, 1210.0);
    assert_eq!(stats.ttft_histogram.by_outcome["hit"].len(), 14);
    assert_eq!(stats.timeline.buckets[0].start_ms, 1_764_470_000_000);
}

#[tokio::test]
async fn without_a_token_no_authorization_is_sent_and_401_says_what_to_set() {
    let mock = Mock::start(always(401, ERROR_401)).await;
    let client = AdminClient::new(&mock.url, None).expect("client");
    let err = client.stats().await.expect_err("401");
    assert_eq!(mock.only().authorization, None);
    match &err {
        AdminError::Http {
            status,
            message,
            kind,
            code,
            param,
        } => {
            assert_eq!(*status, 401);
            assert_eq!(message, "Missing or invalid admin token.");
            assert_eq!(kind.as_deref(), Some("authentication_error"));
            assert_eq!(code.as_deref(), Some("invalid_admin_token"));
            assert_eq!(*param, None);
        }
        other => panic!("expected Http, got {other:?}"),
    }
    let text = err.to_string();
    assert!(text.contains("REPRISE_ADMIN_TOKEN"), "{text}");
    assert!(!text.contains('\n'), "one line: {text}");
}

#[tokio::test]
async fn admin_disabled_says_the_gateway_needs_an_admin_token() {
    let mock = Mock::start(always(404, ERROR_404_DISABLED)).await;
    let err = mock.client().config().await.expect_err("404");
    assert_eq!(err.status(), Some(404));
    assert_eq!(err.code(), Some("admin_disabled"));
    let text = err.to_string();
    assert!(
        text.contains("the gateway was started without --admin-token"),
        "{text}"
    );
}

#[tokio::test]
async fn bad_limit_comes_back_as_a_400_naming_the_param() {
    let mock = Mock::start(always(400, ERROR_400_LIMIT)).await;
    let query = ListQuery {
        limit: Some(500),
        ..ListQuery::default()
    };
    let err = mock.client().entries(&query).await.expect_err("400");
    assert_eq!(mock.only().param("limit").as_deref(), Some("500"));
    assert_eq!(err.status(), Some(400));
    assert_eq!(err.param(), Some("limit"));
    assert_eq!(
        err.to_string(),
        "limit must be between 1 and 200. (HTTP 400 invalid_value, param limit)"
    );
}

#[tokio::test]
async fn entries_send_filters_limit_and_cursor() {
    let mock = Mock::start(always(200, PAGE)).await;
    let query = ListQuery {
        namespace: Some("support".to_owned()),
        model: Some("gpt-4o-mini".to_owned()),
        q: None,
        limit: Some(2),
        cursor: Some("e_00000000002b".to_owned()),
    };
    let page = mock.client().entries(&query).await.expect("page");
    let seen = mock.only();
    assert_eq!(
        (seen.method.as_str(), seen.path.as_str()),
        ("GET", "/admin/entries")
    );
    assert_eq!(
        seen.query_pairs(),
        vec![
            ("namespace".to_owned(), "support".to_owned()),
            ("model".to_owned(), "gpt-4o-mini".to_owned()),
            ("limit".to_owned(), "2".to_owned()),
            ("cursor".to_owned(), "e_00000000002b".to_owned()),
        ]
    );
    assert!(page.has_more);
    assert_eq!(page.next_cursor.as_deref(), Some("e_000000000029"));
    assert_eq!(page.data[0].namespace, None);
    assert_eq!(page.data[1].last_hit_ms, None);
    assert_eq!(page.data[0].similarity, None);
}

#[tokio::test]
async fn search_sends_q_with_filters() {
    let mock = Mock::start(always(200, SEARCH)).await;
    let filter = EntryFilter {
        namespace: None,
        model: Some("gpt-4o-mini".to_owned()),
    };
    let page = mock
        .client()
        .search("capital of France?", Some(5), &filter)
        .await
        .expect("search");
    let seen = mock.only();
    assert_eq!(seen.param("q").as_deref(), Some("capital of France?"));
    assert_eq!(seen.param("limit").as_deref(), Some("5"));
    assert_eq!(seen.param("model").as_deref(), Some("gpt-4o-mini"));
    assert_eq!(seen.param("namespace"), None);
    assert_eq!(seen.param("cursor"), None);
    assert_eq!(page.data[0].similarity, Some(0.93));
}

/// Three pages keyed by cursor: (none) -> c1 -> c2 -> end.
fn paged(seen: &Seen) -> (u16, String) {
    let entry = |id: &str| {
        let mut entry: Value =
            serde_json::from_str::<Value>(PAGE).expect("page")["data"][0].clone();
        entry["id"] = json!(id);
        entry
    };
    let (ids, next): (Vec<&str>, Option<&str>) = match seen.param("cursor").as_deref() {
        None => (vec!["e_6", "e_5"], Some("c1")),
        Some("c1") => (vec!["e_4", "e_3"], Some("c2")),
        Some("c2") => (vec!["e_2"], None),
        Some(other) => panic!("unexpected cursor {other}"),
    };
    let page = json!({
        "object": "list",
        "data": ids.iter().map(|id| entry(id)).collect::<Vec<_>>(),
        "has_more": next.is_some(),
        "next_cursor": next,
    });
    (200, page.to_string())
}

#[tokio::test]
async fn entries_all_follows_cursors_to_the_last_page() {
    let mock = Mock::start(paged).await;
    let query = ListQuery {
        model: Some("gpt-4o-mini".to_owned()),
        ..ListQuery::default()
    };
    let entries = mock.client().entries_all(&query).await.expect("all");
    let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["e_6", "e_5", "e_4", "e_3", "e_2"]);
    let seen = mock.seen();
    let cursors: Vec<Option<String>> = seen.iter().map(|s| s.param("cursor")).collect();
    assert_eq!(
        cursors,
        [None, Some("c1".to_owned()), Some("c2".to_owned())]
    );
    for request in &seen {
        // Largest pages unless asked otherwise, and the filter on every page.
        assert_eq!(request.param("limit").as_deref(), Some("200"));
        assert_eq!(request.param("model").as_deref(), Some("gpt-4o-mini"));
    }
}

#[tokio::test]
async fn entries_all_stops_on_a_cursor_that_does_not_move() {
    let stuck = r#"{"object":"list","data":[],"has_more":true,"next_cursor":"same"}"#;
    let mock = Mock::start(always(200, stuck)).await;
    let query = ListQuery {
        cursor: Some("same".to_owned()),
        ..ListQuery::default()
    };
    let err = mock.client().entries_all(&query).await.expect_err("stuck");
    assert!(matches!(err, AdminError::Decode { .. }), "{err:?}");
    assert!(err.to_string().contains("did not advance"), "{err}");
    assert_eq!(mock.seen().len(), 1);
}

#[tokio::test]
async fn entry_and_delete_use_the_id_in_the_path() {
    let mock = Mock::start(|seen: &Seen| match seen.method.as_str() {
        "GET" => (200, DETAIL.to_owned()),
        _ => (200, DELETED.to_owned()),
    })
    .await;
    let client = mock.client();
    let entry = client.entry("e_00000000002a").await.expect("entry");
    assert_eq!(entry.summary.id, "e_00000000002a");
    assert_eq!(entry.hit_history[1].similarity, None);
    assert_eq!(entry.phases.expect("phases").completion_tokens, Some(8));
    let deleted = client.delete_entry("e_00000000002a").await.expect("delete");
    assert!(deleted.deleted);
    let seen = mock.seen();
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("GET", "/admin/entries/e_00000000002a")
    );
    assert_eq!(
        (seen[1].method.as_str(), seen[1].path.as_str()),
        ("DELETE", "/admin/entries/e_00000000002a")
    );
}

#[tokio::test]
async fn missing_entry_is_a_404_with_its_code() {
    let body = r#"{"error":{"message":"No entry e_000000000099.","type":"invalid_request_error","param":"id","code":"entry_not_found"}}"#;
    let mock = Mock::start(always(404, body)).await;
    let err = mock
        .client()
        .delete_entry("e_000000000099")
        .await
        .expect_err("404");
    assert_eq!(err.code(), Some("entry_not_found"));
    assert_eq!(
        err.to_string(),
        "No entry e_000000000099. (HTTP 404 entry_not_found, param id)"
    );
}

#[tokio::test]
async fn warm_sends_json_and_warm_jsonl_sends_json_lines() {
    let mock = Mock::start(always(201, WARMED)).await;
    let client = mock.client();
    let items = [
        WarmItem::prompt("gpt-4o-mini", "What is the capital of France?", "Paris.")
            .with_namespace("geo"),
        WarmItem::messages(
            "gpt-4o-mini",
            vec![json!({"role": "user", "content": "Who wrote Hamlet?"})],
            "Shakespeare.",
        )
        .with_ttl_s(3600),
    ];
    let result = client.warm(&items).await.expect("warm");
    assert_eq!(result.created, 2);
    assert_eq!(result.data[1].id, "e_000000000031");

    let lines = "{\"model\":\"m\",\"prompt\":\"a\",\"response\":\"b\"}\n\n{\"model\":\"m\",\"prompt\":\"c\",\"response\":\"d\"}\n";
    client.warm_jsonl(lines).await.expect("warm jsonl");

    let seen = mock.seen();
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("POST", "/admin/entries")
    );
    assert_eq!(seen[0].content_type.as_deref(), Some("application/json"));
    assert_eq!(
        seen[0].json(),
        json!([
            {"model": "gpt-4o-mini", "prompt": "What is the capital of France?", "response": "Paris.", "namespace": "geo"},
            {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Who wrote Hamlet?"}], "response": "Shakespeare.", "ttl_s": 3600}
        ])
    );
    assert_eq!(seen[1].path, "/admin/entries");
    assert_eq!(
        seen[1].content_type.as_deref(),
        Some("application/x-ndjson")
    );
    assert_eq!(seen[1].body, Bytes::from(lines));
}

#[tokio::test]
async fn invalidate_flush_config_and_requests_send_what_the_contract_says() {
    let mock = Mock::start(|seen: &Seen| {
        let body = match seen.path.as_str() {
            "/admin/invalidate" => INVALIDATION,
            "/admin/flush" => FLUSH,
            "/admin/config" => CONFIG,
            "/admin/requests" => REQUESTS,
            "/admin/openapi.json" => r#"{"openapi":"3.1.0","paths":{}}"#,
            "/metrics" => "# TYPE reprise_requests_total counter\nreprise_requests_total 3\n",
            other => panic!("unexpected path {other}"),
        };
        (200, body.to_owned())
    })
    .await;
    let client = mock.client();

    let invalidation = client
        .invalidate(&InvalidateRequest {
            namespace: Some("support".to_owned()),
            older_than_s: Some(3600),
            similar_to: Some("refund".to_owned()),
            min_similarity: Some(0.8),
            dry_run: true,
            ..InvalidateRequest::default()
        })
        .await
        .expect("invalidate");
    assert_eq!(invalidation.matched, 3);
    let flush = client.flush().await.expect("flush");
    assert_eq!(flush.deleted, 12);
    let config = client.config().await.expect("config");
    assert_eq!(config.namespace_thresholds["support"], 0.95);
    let patched = client
        .patch_config(&ConfigPatch {
            similarity_threshold: Some(0.92),
            namespace_thresholds: Some([("support".to_owned(), None)].into_iter().collect()),
            ..ConfigPatch::default()
        })
        .await
        .expect("patch");
    assert_eq!(patched.cache_mode, "on");
    let requests = client.requests(Some(7)).await.expect("requests");
    assert_eq!(requests.data[0].cache, "miss");
    assert_eq!(requests.data[0].guard.as_deref(), Some("numbers"));
    assert_eq!(requests.data[1].cache, "hit");
    assert_eq!(requests.data[2].model, None);
    client.requests(None).await.expect("requests");
    let openapi = client.openapi().await.expect("openapi");
    assert_eq!(openapi["openapi"], "3.1.0");
    let metrics = client.metrics().await.expect("metrics");
    assert!(metrics.contains("reprise_requests_total 3"), "{metrics}");

    let seen = mock.seen();
    let route = |i: usize| (seen[i].method.as_str(), seen[i].path.as_str());
    assert_eq!(route(0), ("POST", "/admin/invalidate"));
    assert_eq!(
        seen[0].json(),
        json!({"namespace": "support", "older_than_s": 3600, "similar_to": "refund",
               "min_similarity": 0.8, "dry_run": true})
    );
    assert_eq!(route(1), ("POST", "/admin/flush"));
    assert_eq!(route(2), ("GET", "/admin/config"));
    assert_eq!(route(3), ("PATCH", "/admin/config"));
    assert_eq!(seen[3].content_type.as_deref(), Some("application/json"));
    assert_eq!(
        seen[3].json(),
        json!({"similarity_threshold": 0.92, "namespace_thresholds": {"support": null}})
    );
    assert_eq!(route(4), ("GET", "/admin/requests"));
    assert_eq!(seen[4].param("limit").as_deref(), Some("7"));
    assert_eq!(seen[5].query, None);
    assert_eq!(route(6), ("GET", "/admin/openapi.json"));
    assert_eq!(route(7), ("GET", "/metrics"));
    assert!(seen
        .iter()
        .all(|s| s.authorization.as_deref() == Some("Bearer tok")));
}

#[tokio::test]
async fn a_body_off_contract_is_a_decode_error_naming_the_field() {
    let mock = Mock::start(always(200, r#"{"object":"reprise.flush","deleted":-1}"#)).await;
    let err = mock.client().flush().await.expect_err("decode");
    assert!(matches!(err, AdminError::Decode { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with("unexpected response to POST /admin/flush: at deleted"),
        "{text}"
    );
}

#[tokio::test]
async fn an_unreachable_gateway_is_a_transport_error() {
    // Bound but never listening: a connection is refused, and the port stays this test's. A port
    // bound and dropped could be handed by the kernel to another test's fake gateway, running
    // at the same time, which then answered this request (and saw one it did not expect).
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let port = socket.local_addr().expect("addr").port();
    let client = AdminClient::new(&format!("http://127.0.0.1:{port}"), Some("t")).expect("client");
    let err = client.stats().await.expect_err("refused");
    assert!(matches!(err, AdminError::Transport { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "cannot reach the gateway at http://127.0.0.1:{port}:"
        )),
        "{text}"
    );
    drop(socket);
}

// ---------------------------------------------------------------------------------------------
// The subcommands
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    command: AdminCommand,
}

/// Parses `args` as `reprise-client` would (pointed at `mock`) and runs it, returning the output.
async fn run_cli(mock: &Mock, args: &[&str]) -> (Result<(), CliError>, String) {
    let mut argv = vec!["reprise-client"];
    argv.extend_from_slice(args);
    argv.extend_from_slice(&["--url", &mock.url, "--admin-token", "tok"]);
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let mut out = Vec::new();
    let result = admin_cli::run(cli.command, &mut out).await;
    (result, String::from_utf8(out).expect("utf-8"))
}

#[tokio::test]
async fn stats_prints_tables_and_json_prints_the_raw_body() {
    let mock = Mock::start(always(200, STATS)).await;
    let (result, text) = run_cli(&mock, &["stats"]).await;
    result.expect("stats");
    assert!(text.contains("61.0% (exact 44.0%"), "{text}");
    assert!(text.contains("12.3 s over 30 hits"), "{text}");

    let (result, text) = run_cli(&mock, &["stats", "--json"]).await;
    result.expect("stats --json");
    let printed: Value = serde_json::from_str(&text).expect("JSON output");
    let sent: Value = serde_json::from_str(STATS).expect("fixture");
    assert_eq!(printed, sent);
    assert!(text.contains("\n  \"object\""), "pretty-printed: {text}");
    // Keys keep the gateway's order (a detour through a sorted map would put `mode` first).
    let position = |key: &str| text.find(&format!("\"{key}\"")).expect(key);
    assert!(position("object") < position("version"));
    assert!(position("version") < position("mode"));
    assert!(position("p50") < position("mean"));
}

#[tokio::test]
async fn nested_subcommands_take_gateway_options_on_either_side() {
    let mock = Mock::start(always(200, PAGE)).await;
    let cli = Cli::try_parse_from([
        "reprise-client",
        "entries",
        "--json",
        "--url",
        &mock.url,
        "ls",
        "--limit",
        "2",
        "--admin-token",
        "tok",
    ])
    .expect("parse");
    let mut out = Vec::new();
    admin_cli::run(cli.command, &mut out).await.expect("ls");
    let seen = mock.only();
    assert_eq!(seen.param("limit").as_deref(), Some("2"));
    assert_eq!(seen.authorization.as_deref(), Some("Bearer tok"));
    let printed: Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(printed["next_cursor"], "e_000000000029");
}

#[tokio::test]
async fn entries_ls_all_merges_pages() {
    let mock = Mock::start(paged).await;
    let (result, text) = run_cli(&mock, &["entries", "ls", "--all"]).await;
    result.expect("ls --all");
    for id in ["e_6", "e_5", "e_4", "e_3", "e_2"] {
        assert!(text.contains(id), "{id} missing in\n{text}");
    }
    assert!(text.ends_with("5 entries\n"), "{text}");
    let (result, text) = run_cli(&mock, &["entries", "ls", "--all", "--json"]).await;
    result.expect("ls --all --json");
    let printed: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(printed["data"].as_array().expect("data").len(), 5);
    assert_eq!(printed["has_more"], false);
}

#[tokio::test]
async fn entries_rm_reports_each_id_and_fails_if_any_failed() {
    let missing = r#"{"error":{"message":"No entry e_2.","type":"invalid_request_error","param":"id","code":"entry_not_found"}}"#;
    let mock = Mock::start(move |seen: &Seen| {
        if seen.path.ends_with("/e_2") {
            (404, missing.to_owned())
        } else {
            let id = seen.path.rsplit('/').next().unwrap_or_default();
            (
                200,
                json!({"id": id, "object": "reprise.entry.deleted", "deleted": true}).to_string(),
            )
        }
    })
    .await;
    let (result, text) = run_cli(&mock, &["entries", "rm", "e_1", "e_2", "e_3"]).await;
    assert_eq!(text, "deleted e_1\ndeleted e_3\n");
    let (json_result, json_text) =
        run_cli(&mock, &["entries", "rm", "--json", "e_1", "e_2", "e_3"]).await;
    assert!(json_result.is_err());
    let printed: Value = serde_json::from_str(&json_text).expect("json");
    assert_eq!(
        printed,
        json!([
            {"id": "e_1", "object": "reprise.entry.deleted", "deleted": true},
            {"id": "e_3", "object": "reprise.entry.deleted", "deleted": true}
        ])
    );
    let err = result.expect_err("one failed");
    assert_eq!(err.exit_code(), 1);
    assert_eq!(
        err.to_string(),
        "1 of 3 deletions failed: e_2: No entry e_2. (HTTP 404 entry_not_found, param id)"
    );
    assert_eq!(mock.seen().len(), 6);
}

#[tokio::test]
async fn flush_without_yes_sends_nothing() {
    let mock = Mock::start(always(200, FLUSH)).await;
    let (result, _) = run_cli(&mock, &["flush"]).await;
    let err = result.expect_err("refused");
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("--yes"), "{err}");
    assert!(mock.seen().is_empty());
    let (result, text) = run_cli(&mock, &["flush", "--yes"]).await;
    result.expect("flush --yes");
    assert_eq!(text, "flushed the cache: 12 entries deleted\n");
    assert_eq!(mock.only().method, "POST");
}

#[tokio::test]
async fn warm_sends_files_by_extension() {
    let mock = Mock::start(always(201, WARMED)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let lines = "{\"model\":\"m\",\"prompt\":\"a\",\"response\":\"b\"}\n{\"model\":\"m\",\"prompt\":\"c\",\"response\":\"d\"}\n";
    let jsonl = dir.path().join("items.jsonl");
    std::fs::write(&jsonl, lines).expect("write");
    let array = r#"{"entries": [{"model":"m","prompt":"a","response":"b"}]}"#;
    let json_file = dir.path().join("items.json");
    std::fs::write(&json_file, array).expect("write");

    let (result, text) = run_cli(&mock, &["warm", jsonl.to_str().expect("path")]).await;
    result.expect("warm jsonl");
    assert!(text.starts_with("warmed 2 entries\n"), "{text}");
    let (result, _) = run_cli(&mock, &["warm", json_file.to_str().expect("path")]).await;
    result.expect("warm json");

    let seen = mock.seen();
    assert_eq!(
        seen[0].content_type.as_deref(),
        Some("application/x-ndjson")
    );
    assert_eq!(seen[0].body, Bytes::from(lines));
    assert_eq!(seen[1].content_type.as_deref(), Some("application/json"));
    assert_eq!(seen[1].body, Bytes::from(array));
}

#[tokio::test]
async fn invalidate_and_config_set_build_their_bodies_from_flags() {
    let mock = Mock::start(|seen: &Seen| match seen.path.as_str() {
        "/admin/invalidate" => (200, INVALIDATION.to_owned()),
        _ => (200, CONFIG.to_owned()),
    })
    .await;
    let (result, text) = run_cli(
        &mock,
        &[
            "invalidate",
            "--model",
            "gpt-4o",
            "--tenant",
            "shared",
            "--older-than",
            "30m",
        ],
    )
    .await;
    result.expect("invalidate");
    assert_eq!(text, "deleted 3 of 3 matching entries\n");
    let (result, text) = run_cli(
        &mock,
        &[
            "config",
            "set",
            "replay=recorded",
            "namespace_thresholds.support=null",
        ],
    )
    .await;
    result.expect("config set");
    assert!(text.contains("support=0.95"), "{text}");

    let seen = mock.seen();
    assert_eq!(
        seen[0].json(),
        json!({"model": "gpt-4o", "tenant": "shared", "older_than_s": 1800, "dry_run": false})
    );
    assert_eq!(seen[1].method, "PATCH");
    assert_eq!(
        seen[1].json(),
        json!({"replay": "recorded", "namespace_thresholds": {"support": null}})
    );
}

#[tokio::test]
async fn http_errors_reach_the_cli_as_admin_errors() {
    let mock = Mock::start(always(401, ERROR_401)).await;
    let (result, text) = run_cli(&mock, &["requests", "--limit", "3"]).await;
    assert!(text.is_empty());
    let err = result.expect_err("401");
    assert_eq!(err.exit_code(), 1);
    assert!(matches!(
        err,
        CliError::Admin(AdminError::Http { status: 401, .. })
    ));
    assert!(err.to_string().contains("REPRISE_ADMIN_TOKEN"), "{err}");
}
