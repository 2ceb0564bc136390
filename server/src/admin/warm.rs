//! `POST /admin/entries`: pre-loads (warms) the cache from prompt/response pairs, as JSON or JSON Lines.
//!
//! Each item becomes an entry keyed exactly as the same request from an app would be (the same
//! key builder, tenant and namespace rules), with its prompt embedded for semantic matching. The
//! batch is validated whole before anything is stored: one bad item stores nothing. Warmed entries
//! make no claim of prefill time saved, because no upstream was ever timed for them.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::entry::{Entry, EntryId, RequestSummary};
use crate::error::GatewayError;
use crate::ingress::Route;
use crate::key::{KeyInput, Keys, Tenant};
use crate::state::AppState;
use crate::timing::unix_ms;
use crate::timing::Phases;

use crate::policy::MAX_TTL_S;

/// How long warming waits for the writer to store one entry: it may first finish a disk-budget
/// rebuild of the store, which takes seconds on a large one.
const WARM_PUT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// One prompt/response pair to pre-load.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WarmItem {
    /// Required unless `request` names it.
    pub model: Option<String>,
    /// The user's prompt (one user message, or the completions prompt).
    pub prompt: Option<String>,
    /// A whole chat conversation, as `messages` of a request.
    #[schema(value_type = Option<Vec<Object>>)]
    pub messages: Option<Vec<Value>>,
    /// A whole OpenAI request body, as the app sends it (sampling parameters and all).
    #[schema(value_type = Option<Object>)]
    pub request: Option<Map<String, Value>>,
    /// `max_tokens` of the request the entry answers (the Messages API requires it, and it is in
    /// the key of every API that has it); added to the body like `model`.
    pub max_tokens: Option<u64>,
    /// Request headers that are in the key (`anthropic-version`, `anthropic-beta` on the
    /// `messages` route); the route's default (`anthropic-version: 2023-06-01`) when absent.
    #[schema(value_type = Option<Object>)]
    pub headers: Option<std::collections::BTreeMap<String, String>>,
    /// The answer to replay.
    pub response: String,
    /// `chat.completions` (default), `completions` or `messages` (Anthropic's Messages API).
    pub route: Option<String>,
    /// As the `x-reprise-namespace` header.
    pub namespace: Option<String>,
    /// The client key the entry belongs to (hashed, never stored). Required when the gateway keeps
    /// tenants apart (`share_across_keys` off); `""` is the anonymous client.
    pub api_key: Option<String>,
    /// Time to live; the live default when absent.
    pub ttl_s: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum WarmBody {
    Wrapped { entries: Vec<Value> },
    Many(Vec<Value>),
    One(Map<String, Value>),
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WarmedEntry {
    pub id: String,
    pub prompt: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Warmed {
    pub object: String,
    pub created: usize,
    pub data: Vec<WarmedEntry>,
}

/// Whether a content type means JSON Lines.
fn is_json_lines(content_type: &str) -> bool {
    let mime = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        mime.as_str(),
        "application/x-ndjson"
            | "application/ndjson"
            | "application/jsonl"
            | "application/json-lines"
            | "application/x-jsonlines"
    )
}

/// Splits a body into items, each with the label errors name it by (`entries[3]` or `line 4`).
fn split_items(raw: &[u8], json_lines: bool) -> Result<Vec<(String, Value)>, GatewayError> {
    if json_lines {
        let text = std::str::from_utf8(raw)
            .map_err(|_| GatewayError::invalid("The JSON Lines body is not UTF-8.", None))?;
        let mut items = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let value = serde_json::from_str(line).map_err(|e| {
                GatewayError::invalid(format!("line {}: not valid JSON: {e}.", n + 1), None)
            })?;
            items.push((format!("line {}", n + 1), value));
        }
        return Ok(items);
    }
    let body: WarmBody = serde_json::from_slice(raw).map_err(|e| {
        GatewayError::invalid(
            format!("The body must be an item, an array of items or {{\"entries\": [...]}}: {e}."),
            None,
        )
    })?;
    Ok(match body {
        WarmBody::Wrapped { entries } | WarmBody::Many(entries) => entries
            .into_iter()
            .enumerate()
            .map(|(i, v)| (format!("entries[{i}]"), v))
            .collect(),
        WarmBody::One(one) => vec![("entries[0]".to_owned(), Value::Object(one))],
    })
}

/// A validated item, ready to store.
struct Prepared {
    route: Route,
    keys: Keys,
    summary: RequestSummary,
    body: Value,
    ttl_s: u64,
}

/// Prefixes an item's label to an error, and its field path to the param.
fn in_item(label: &str, err: GatewayError) -> GatewayError {
    match err {
        GatewayError::InvalidRequest { message, param, .. } => {
            let prefix = label.replace("line ", "lines[").replace(' ', "");
            let prefix = if label.starts_with("line ") {
                format!("{prefix}]")
            } else {
                prefix
            };
            let param = param.map_or(prefix.clone(), |p| format!("{prefix}.{p}"));
            GatewayError::invalid(format!("{label}: {message}"), Some(&param))
        }
        other => other,
    }
}

/// What validating an item needs from the gateway's settings.
#[derive(Clone, Copy)]
struct Rules {
    share_across_keys: bool,
    default_ttl_s: u64,
}

/// An item's entries: one, or one per set of the API's default headers when it names none.
fn prepare(rules: Rules, value: Value) -> Result<Vec<Prepared>, GatewayError> {
    let item: WarmItem = super::json::from_value(value)?;
    let WarmItem {
        model,
        prompt,
        messages,
        request,
        max_tokens,
        headers,
        response,
        route,
        namespace,
        api_key,
        ttl_s,
    } = item;
    // `chat` is short for `chat.completions`, and the default; an API warms when its adapter can
    // make a request and an answer from text.
    let name = match route.as_deref() {
        None | Some("chat") => "chat.completions",
        Some(name) => name,
    };
    let Some((api, warm)) = crate::api::named(name).and_then(|api| Some((api, api.warm()?))) else {
        return Err(GatewayError::invalid(
            format!("`route` must be chat.completions, completions or messages, not `{name}`."),
            Some("route"),
        ));
    };
    let route = api.route();
    let given = [prompt.is_some(), messages.is_some(), request.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(GatewayError::invalid(
            "Give exactly one of `prompt`, `messages` or `request`.",
            Some("prompt"),
        ));
    }
    let mut body = match (request, messages, prompt) {
        (Some(request), _, _) => request,
        (None, Some(messages), _) => warm.messages(messages)?,
        (None, None, Some(prompt)) => warm.prompt(prompt),
        (None, None, None) => Map::new(),
    };
    if let Some(model) = model {
        body.insert("model".to_owned(), Value::String(model));
    }
    if let Some(max_tokens) = max_tokens {
        body.insert("max_tokens".to_owned(), Value::from(max_tokens));
    }
    let header_sets = key_headers(api, warm, headers)?;
    let model = crate::ingress::required_string(&body, "model")?;
    crate::ingress::check_route_fields(route, &body)?;
    if response.is_empty() {
        return Err(GatewayError::invalid(
            "`response` must not be empty.",
            Some("response"),
        ));
    }
    let namespace = namespace
        .map(|n| crate::policy::namespace(&n, "namespace"))
        .transpose()?;
    let ttl_s = ttl_s.unwrap_or(rules.default_ttl_s);
    if !(1..=MAX_TTL_S).contains(&ttl_s) {
        return Err(GatewayError::invalid(
            format!("`ttl_s` must be from 1 to {MAX_TTL_S}."),
            Some("ttl_s"),
        ));
    }
    let tenant = if rules.share_across_keys {
        Tenant::Shared
    } else {
        let Some(key) = api_key else {
            return Err(GatewayError::invalid(
                "This gateway keeps each API key's cache apart (share_across_keys is off): give the `api_key` the app will send (\"\" for clients without one).",
                Some("api_key"),
            ));
        };
        Tenant::Key(*blake3::hash(key.trim().as_bytes()).as_bytes())
    };
    let now_s = unix_ms() / 1000;
    header_sets
        .iter()
        .map(|headers| {
            let keys = crate::api::keys(&KeyInput {
                route,
                body: &body,
                headers,
                tenant,
                namespace: namespace.as_deref(),
            })?;
            let summary = RequestSummary {
                route: route.name().to_owned(),
                model: model.clone(),
                namespace: namespace.clone(),
                tenant: tenant.label(),
                prompt: keys.prompt.clone(),
                stream: false,
            };
            Ok(Prepared {
                route,
                keys,
                summary,
                body: warm.answer(model.clone(), response.clone(), now_s),
                ttl_s,
            })
        })
        .collect()
}

/// The keyed headers a warmed item stands for: those it names (only headers its API keys on), else
/// each set of the API's defaults, so that it answers the requests its clients send.
fn key_headers(
    api: &dyn crate::api::Api,
    warm: &dyn crate::api::Warm,
    given: Option<std::collections::BTreeMap<String, String>>,
) -> Result<Vec<axum::http::HeaderMap>, GatewayError> {
    let sets: Vec<Vec<(String, String)>> = match given {
        Some(given) => vec![given.into_iter().collect()],
        None => warm
            .default_headers()
            .iter()
            .map(|set| {
                set.iter()
                    .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                    .collect()
            })
            .collect(),
    };
    sets.into_iter()
        .map(|pairs| header_map(api, pairs))
        .collect()
}

/// `pairs` as headers, each one a header `api` keys on.
fn header_map(
    api: &dyn crate::api::Api,
    pairs: Vec<(String, String)>,
) -> Result<axum::http::HeaderMap, GatewayError> {
    use axum::http::{HeaderName, HeaderValue};
    let mut headers = axum::http::HeaderMap::new();
    for (name, value) in pairs {
        let lower = name.to_ascii_lowercase();
        if !api.key_headers().contains(&lower.as_str()) {
            return Err(GatewayError::invalid(
                format!(
                    "`headers.{name}` is not a header this route keys on (it takes {}).",
                    match api.key_headers() {
                        [] => "none".to_owned(),
                        names => names.join(", "),
                    }
                ),
                Some(&format!("headers.{name}")),
            ));
        }
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(lower.as_bytes()),
            HeaderValue::from_str(&value),
        ) else {
            return Err(GatewayError::invalid(
                format!("`headers.{name}` is not a valid header value."),
                Some(&format!("headers.{name}")),
            ));
        };
        headers.append(name, value);
    }
    Ok(headers)
}

/// Pre-loads entries from prompt/response pairs (JSON, or JSON Lines by content type).
#[utoipa::path(post, path = "/admin/entries", tag = "admin",
    request_body(content = Vec<WarmItem>, description = "An item, an array of items, `{\"entries\": [...]}`, or JSON Lines (application/x-ndjson)"),
    responses((status = 201, body = Warmed), (status = 400, description = "An invalid item; names it, and nothing was stored")),
    security(("admin_token" = [])))]
pub(crate) async fn warm(
    State(state): State<AppState>,
    request: Request,
) -> Result<(StatusCode, Json<Warmed>), GatewayError> {
    let (parts, body) = request.into_parts();
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let json_lines = is_json_lines(content_type);
    let raw =
        crate::ingress::read_limited(body, &parts.headers, super::json::ADMIN_MAX_BODY).await?;
    let rules = Rules {
        share_across_keys: state.cache.settings.share_across_keys,
        default_ttl_s: state.live.current().default_ttl_s,
    };
    // Parsing and keying a large file is CPU work: off the async workers.
    let prepared: Vec<Prepared> = tokio::task::spawn_blocking(move || {
        let items = split_items(&raw, json_lines)?;
        if items.is_empty() {
            return Err(GatewayError::invalid("No entries to warm.", None));
        }
        let prepared = items
            .into_iter()
            .map(|(label, value)| prepare(rules, value).map_err(|e| in_item(&label, e)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(prepared.into_iter().flatten().collect())
    })
    .await
    .map_err(|e| GatewayError::Internal {
        detail: format!("warm task failed: {e}"),
    })??;
    // Vectors in one batched call; a failed embedding leaves the entries exact-match only.
    let vectors: Vec<Option<Vec<f32>>> = match &state.semantic {
        Some(semantic) => {
            let texts = prepared.iter().map(|p| p.keys.prompt.clone()).collect();
            match semantic.embedder.embed_many(texts).await {
                Ok(v) => v.into_iter().map(Some).collect(),
                Err(err) => {
                    tracing::warn!(error = %err, "embedding warmed prompts failed; they match exactly only");
                    vec![None; prepared.len()]
                }
            }
        }
        None => vec![None; prepared.len()],
    };
    let cache = state.cache.clone();
    let data = tokio::task::spawn_blocking(move || {
        let now = unix_ms();
        let mut data = Vec::with_capacity(prepared.len());
        for (p, vector) in prepared.into_iter().zip(vectors) {
            let vector = vector.filter(|v| !v.is_empty() && !p.keys.prompt.trim().is_empty());
            let events = crate::api::of(p.route).rechunk(&p.body, 0.0);
            let entry = Entry {
                id: EntryId(0),
                key: p.keys.exact,
                partition: p.keys.partition,
                summary: p.summary,
                events,
                usage: None,
                body: p.body,
                phases: Phases::default(),
                created_at_ms: now,
                ttl_ms: p.ttl_s.saturating_mul(1000),
                hit_count: 0,
                last_hit_ms: 0,
                vector,
                hit_history: Vec::new(),
                warmed: true,
            };
            let prompt = entry.summary.prompt.clone();
            // Stored before the 201, so the entry is served once it is answered; through the
            // writer, which also adds its vector to the index, so it never meets the store in the
            // middle of the disk budget's rebuild.
            let id = match cache.store_now(entry, WARM_PUT_WAIT) {
                Some(Ok(id)) => id,
                Some(Err(e)) => {
                    return Err(GatewayError::Internal {
                        detail: format!("storing a warmed entry: {e}"),
                    })
                }
                None => {
                    return Err(GatewayError::Internal {
                        detail: format!(
                            "storing a warmed entry: the cache writer did not store it within {} s (entries before it are stored)",
                            WARM_PUT_WAIT.as_secs()
                        ),
                    })
                }
            };
            data.push(WarmedEntry {
                id: id.to_string(),
                prompt,
            });
        }
        Ok::<_, GatewayError>(data)
    })
    .await
    .map_err(|e| GatewayError::Internal {
        detail: format!("warm task failed: {e}"),
    })??;
    tracing::info!(created = data.len(), "admin warm");
    Ok((
        StatusCode::CREATED,
        Json(Warmed {
            object: "list".to_owned(),
            created: data.len(),
            data,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_are_told_by_content_type() {
        assert!(is_json_lines("application/x-ndjson"));
        assert!(is_json_lines("application/jsonl; charset=utf-8"));
        assert!(!is_json_lines("application/json"));
    }

    #[test]
    fn items_are_split_and_labelled() {
        let lines = split_items(b"{\"a\":1}\n\n{\"b\":2}\n", true).expect("lines");
        assert_eq!(
            lines.iter().map(|(l, _)| l.as_str()).collect::<Vec<_>>(),
            ["line 1", "line 3"]
        );
        let err = split_items(b"{\"a\":1}\nnot json\n", true).expect_err("bad line");
        assert!(err.to_string().starts_with("line 2:"), "{err}");
        for body in [
            &b"{\"response\":\"x\"}"[..],
            b"[{\"response\":\"x\"}]",
            b"{\"entries\":[{\"response\":\"x\"}]}",
        ] {
            let items = split_items(body, false).expect("json");
            assert_eq!(items.len(), 1);
            assert_eq!(items[0].0, "entries[0]");
        }
    }

    #[test]
    fn item_errors_name_the_item_and_field() {
        let err = in_item("entries[3]", GatewayError::invalid("bad", Some("response")));
        assert_eq!(err.body()["error"]["param"], "entries[3].response");
        let err = in_item("line 4", GatewayError::invalid("bad", None));
        assert_eq!(err.body()["error"]["param"], "lines[4]");
        assert!(err.to_string().starts_with("line 4: "));
    }
}
