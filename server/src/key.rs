//! Cache keys: a partition (everything that must match for two requests to share an answer) and an
//! exact key (the partition plus the final user turn), each a blake3 hash of a canonical form.
//!
//! This stage only reads the parsed body and the caller's identity; it never changes what is
//! forwarded upstream, and it never logs prompts.
//!
//! ## What goes into the keys
//!
//! - **Partition**: the tenant (a hash of the client's API key, or one shared tenant when keys are
//!   configured to share the cache), the namespace, the route, the model, every request parameter
//!   that can change the answer, and every message except the final user turn: system and developer
//!   prompts, earlier turns, and tool calls and tool results that come after the final user turn.
//!   The non-text parts of the final user turn (images, audio, files, its `name`) are in the
//!   partition too, so a semantic match never crosses a different image or tool context. Fields the
//!   gateway does not know are in the partition: an unknown field may change the answer.
//! - **Left out**, because they do not change the answer: `user`, `stream`, `stream_options`,
//!   `metadata`, `store`, `service_tier`, `prompt_cache_key`, `safety_identifier` (legacy
//!   completions: `user`, `stream`, `stream_options`; embeddings: `user`).
//! - **Per API**: which body fields are in the partition, which are left out, and what the final
//!   turn is are each API's own rules, in its adapter ([`crate::api`]): chat, legacy completions,
//!   embeddings, and the Responses API (the same rules over `instructions` and input items). This
//!   module holds what they share: the tenant, namespace and route fields, the hasher, the canonical
//!   form and the split at the final turn.
//! - **Exact key**: the partition plus the canonical final user turn (chat), the `prompt` (legacy
//!   completions) or the `input` (embeddings). A chat request without any user message has an empty
//!   final turn.
//! - **Prompt**, the text semantic matching compares: the text of the final user turn (text parts
//!   joined with a newline), a legacy string `prompt` as sent (an array prompt as canonical JSON),
//!   or the canonical JSON of an embeddings `input`.
//!
//! ## Canonical form
//!
//! - Object keys are sorted by their bytes, whatever order the client sent them in.
//! - A field that is absent and a field set to `null` are the same. A field set to its default
//!   value is *not* the same as an absent one (`"temperature": 1` differs from no temperature),
//!   because defaults differ between providers and models.
//! - Integers are written as integers; a float with no fractional part and a magnitude below 2^53 is
//!   written as that integer (`1.0` equals `1`); other floats in their shortest round-trip form.
//! - Message text (a string `content`, and the `text` of `{"type":"text"}` content parts, in every
//!   message including system and developer prompts) is normalized:
//!   1. `\r\n` and a lone `\r` become `\n`;
//!   2. trailing whitespace is removed from every line;
//!   3. blank lines at the start and at the end of the text are removed;
//!   4. a text left with a single line also loses its leading whitespace; in a text of several
//!      lines the first line keeps its indentation, because indentation only means something
//!      relative to the other lines.
//!
//!   Inner spacing and indentation are never touched: `a  b` differs from `a b`, and code indented
//!   differently is a different prompt.
//! - A content array made of exactly one `{"type":"text","text":…}` part equals the plain string.
//! - Legacy `prompt` and `suffix` and embeddings `input` are taken byte for byte: a completion model
//!   continues the text exactly as written, so a trailing space or newline changes the answer.

use std::collections::BTreeMap;

use http::HeaderMap;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Number, Value};

use crate::error::GatewayError;
use crate::ingress::Route;

/// The exact-match key of a request.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CacheKey(pub [u8; 32]);

/// The partition of a request: tenant, namespace, route, model, output-changing parameters, system
/// prompt and earlier turns. Semantic matching only ever compares requests of one partition.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PartitionKey(pub [u8; 32]);

macro_rules! hex_debug {
    ($t:ty) => {
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                for b in &self.0[..8] {
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    };
}
hex_debug!(CacheKey);
hex_debug!(PartitionKey);

impl CacheKey {
    /// All 64 hex digits, for storage and admin lookups.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl PartitionKey {
    /// All 64 hex digits, for storage and admin lookups.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

/// Whose cache a request may read: one per API key, or one for everybody.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tenant {
    Shared,
    /// blake3 of the client's credential (the empty credential for anonymous clients).
    Key([u8; 32]),
}

/// The headers a client may carry its API key in, in the order their values are hashed:
/// `Authorization` (OpenAI's SDKs, and some Anthropic clients as a bearer token), `api-key`
/// (Azure OpenAI's SDKs) and `x-api-key` (Anthropic's SDKs, Claude Code, LangChain's
/// `ChatAnthropic`). [`crate::upstream`] replaces each of them with `--upstream-api-key`.
pub const CREDENTIAL_HEADERS: [&str; 3] = ["authorization", "api-key", "x-api-key"];

/// Domain of the hash of a request that carries several different credentials.
const CREDENTIALS_DOMAIN: &str = "reprise.credentials.v1";

/// Headers that pick, for one credential, which of its organizations and projects a request acts
/// for (OpenAI's; a user key may reach several). Each is its own tenant: a stored response's id
/// belongs to one organization, and a project is a boundary of data and billing.
pub const SCOPE_HEADERS: [&str; 2] = ["openai-organization", "openai-project"];

/// Domain of the hash of a credential together with the organization or project it acts for.
const SCOPE_DOMAIN: &str = "reprise.credential-scope.v1";

impl Tenant {
    /// blake3 of the client's credential: the bearer token of `Authorization`, the value of
    /// `api-key` or of `x-api-key`. A client that sends one credential (in any of these headers,
    /// or the same one in several) is the tenant of that credential, so the same API key is one
    /// tenant whichever SDK sends it. A client that sends several different ones is the tenant of
    /// all of them together: the upstream may authenticate by any one of those headers, and a
    /// tenant taken from one header alone would let two clients that differ only in another
    /// share answers. Clients without any share one anonymous tenant, `Key(blake3(""))`. A request
    /// that names an organization or a project ([`SCOPE_HEADERS`]) is the tenant of its
    /// credential within that scope; one that names neither keeps its credential's tenant.
    /// Every client is `Shared` when `share_across_keys` is set.
    pub fn from_headers(headers: &HeaderMap, share_across_keys: bool) -> Tenant {
        if share_across_keys {
            return Tenant::Shared;
        }
        let mut credentials: Vec<&[u8]> = Vec::new();
        for name in CREDENTIAL_HEADERS {
            for value in headers.get_all(name) {
                let credential = if name == "authorization" {
                    bearer_token(value.as_bytes())
                } else {
                    value.as_bytes().trim_ascii()
                };
                if !credential.is_empty() && !credentials.contains(&credential) {
                    credentials.push(credential);
                }
            }
        }
        let hash = match credentials.as_slice() {
            [] => blake3::hash(b""),
            [one] => blake3::hash(one),
            several => {
                let mut hasher = blake3::Hasher::new_derive_key(CREDENTIALS_DOMAIN);
                for credential in several {
                    hasher.update(&(credential.len() as u64).to_be_bytes());
                    hasher.update(credential);
                }
                hasher.finalize()
            }
        };
        let scope: Vec<(usize, &[u8])> = SCOPE_HEADERS
            .iter()
            .enumerate()
            .flat_map(|(i, name)| headers.get_all(*name).iter().map(move |v| (i, v)))
            .map(|(i, value)| (i, value.as_bytes().trim_ascii()))
            .filter(|(_, value)| !value.is_empty())
            .collect();
        if scope.is_empty() {
            return Tenant::Key(*hash.as_bytes());
        }
        let mut hasher = blake3::Hasher::new_derive_key(SCOPE_DOMAIN);
        hasher.update(hash.as_bytes());
        for (header, value) in scope {
            hasher.update(&(header as u64).to_be_bytes());
            hasher.update(&(value.len() as u64).to_be_bytes());
            hasher.update(value);
        }
        Tenant::Key(*hasher.finalize().as_bytes())
    }

    /// 16 hex digits of the hash, or `shared`: short enough for logs, never the key itself.
    pub fn label(&self) -> String {
        match self {
            Tenant::Shared => "shared".to_owned(),
            Tenant::Key(hash) => hex(&hash[..8]),
        }
    }
}

/// The token of `Bearer <token>`; any other scheme is hashed whole, so it still separates tenants.
fn bearer_token(value: &[u8]) -> &[u8] {
    let value = value.trim_ascii();
    match value.split_at_checked(7) {
        Some((scheme, token)) if scheme.eq_ignore_ascii_case(b"bearer ") => token.trim_ascii(),
        _ => value,
    }
}

/// Everything the keys are built from.
#[derive(Debug, Clone, Copy)]
pub struct KeyInput<'a> {
    pub route: Route,
    pub body: &'a Map<String, Value>,
    /// The request's headers: an API may key on some of them ([`crate::api::Api::key_headers`]).
    pub headers: &'a HeaderMap,
    pub tenant: Tenant,
    pub namespace: Option<&'a str>,
}

/// Both keys of a request and the text semantic matching compares.
#[derive(Debug, Clone)]
pub struct Keys {
    pub partition: PartitionKey,
    pub exact: CacheKey,
    pub prompt: String,
}

const PARTITION_DOMAIN: &str = "reprise.partition.v1";
const EXACT_DOMAIN: &str = "reprise.exact.v1";

/// The part of the keys each API decides: writes the body's fields into the partition and returns
/// the final turn ([`crate::api::Api::turn`]).
pub type TurnRule<'r> =
    &'r dyn Fn(&Map<String, Value>, &mut FieldHasher) -> Result<Turn, GatewayError>;

/// Builds the partition key, the exact key and the prompt of one parsed request, with `turn` (the
/// route's adapter) deciding the body's part; [`crate::api::keys`] passes the right one.
///
/// The rules are in this module's documentation. Fails (400, naming the field in `param`) only
/// when a field the keys depend on has the wrong JSON type, such as `messages` that is not an
/// array or a message without a string `role`.
pub fn build(input: &KeyInput<'_>, turn: TurnRule<'_>) -> Result<Keys, GatewayError> {
    let mut partition = FieldHasher::new(PARTITION_DOMAIN);
    match input.tenant {
        Tenant::Shared => partition.field("tenant.shared", b""),
        Tenant::Key(hash) => partition.field("tenant.key", &hash),
    }
    if let Some(namespace) = input.namespace {
        partition.field("namespace", namespace.as_bytes());
    }
    partition.field("route", input.route.name().as_bytes());
    let turn = turn(input.body, &mut partition)?;
    let partition = PartitionKey(partition.finish());

    // The exact key hashes the partition's digest rather than repeating its fields: one place
    // decides what the partition holds, and the exact key can never hold less.
    let mut exact = FieldHasher::new(EXACT_DOMAIN);
    exact.field("partition", &partition.0);
    exact.field("turn", turn.canonical.as_bytes());
    Ok(Keys {
        partition,
        exact: CacheKey(exact.finish()),
        prompt: turn.prompt,
    })
}

/// The part of a request that is in the exact key but not in the partition.
pub struct Turn {
    /// Canonical JSON of the final turn; empty when there is none.
    pub(crate) canonical: String,
    pub(crate) prompt: String,
}

/// Type of the fields that are known and deliberately left out of the keys: nothing is copied.
pub(crate) type Ignored = Option<IgnoredAny>;

/// Writes each named field under its own name, so the tag can never drift from the variable.
macro_rules! hash_fields {
    ($hasher:expr; $($field:ident),+ $(,)?) => {
        $( $hasher.json(stringify!($field), $field.as_ref()); )+
    };
}
// The adapters in `api/` name their fields with it.
pub(crate) use hash_fields;

/// Splits canonical messages (or input items) at the last one `is_turn` accepts, the final user turn:
/// it is the exact and semantic text, and what comes before and after it (each under its own field
/// of `names`, so moving a message across the turn changes the partition: tool results after the
/// turn must never be matched against other results) and the turn's shape go into the partition.
/// Without such a turn there is nothing to match semantically: everything is context.
pub(crate) fn final_turn(
    partition: &mut FieldHasher,
    [before_name, after_name]: [&str; 2],
    canonical: &[Map<String, Value>],
    is_turn: impl Fn(&Map<String, Value>) -> bool,
    shape: impl Fn(&Map<String, Value>) -> Value,
    text: impl Fn(&Map<String, Value>) -> String,
) -> Turn {
    let Some(at) = canonical.iter().rposition(is_turn) else {
        partition.field(before_name, canonical_seq(canonical).as_bytes());
        return Turn {
            canonical: String::new(),
            prompt: String::new(),
        };
    };
    // `rposition` returned an index into `canonical`, so these slices are in bounds.
    let (before, last, after) = (&canonical[..at], &canonical[at], &canonical[at + 1..]);
    partition.field(before_name, canonical_seq(before).as_bytes());
    partition.field(after_name, canonical_seq(after).as_bytes());
    partition.field("turn.shape", canonical_string(&shape(last)).as_bytes());
    Turn {
        canonical: canonical_string(&Value::Object(last.clone())),
        prompt: text(last),
    }
}

/// One message of `messages[i]` in canonical form: an object with a string `role`, its `null` fields
/// dropped (SDKs send `"content": null` on tool-call messages or leave it out; both mean the same)
/// and its `content` put in the API's canonical form by `content`. Chat completions and the Messages
/// API share this shape; only what their content looks like differs.
pub(crate) fn canonical_message(
    i: usize,
    message: &Value,
    content: impl Fn(&Value) -> Result<Value, GatewayError>,
) -> Result<Map<String, Value>, GatewayError> {
    let Some(fields) = message.as_object() else {
        return Err(GatewayError::invalid(
            format!("`messages[{i}]` must be an object with a string `role`."),
            Some(&format!("messages[{i}]")),
        ));
    };
    if !fields.get("role").is_some_and(Value::is_string) {
        return Err(GatewayError::invalid(
            format!("`messages[{i}]` must be an object with a string `role`."),
            Some(&format!("messages[{i}].role")),
        ));
    }
    let mut out = Map::new();
    for (name, value) in fields {
        if value.is_null() {
            continue;
        }
        let value = if name == "content" {
            content(value)?
        } else {
            value.clone()
        };
        out.insert(name.clone(), value);
    }
    Ok(out)
}

pub(crate) fn model_field(
    partition: &mut FieldHasher,
    model: Option<&Value>,
) -> Result<(), GatewayError> {
    match model {
        Some(Value::String(model)) => {
            partition.field("model", model.as_bytes());
            Ok(())
        }
        _ => Err(GatewayError::invalid(
            "`model` must be a string.",
            Some("model"),
        )),
    }
}

/// All fields are `Option<Value>` or ignored, so this cannot happen for a JSON object; it is
/// mapped rather than unwrapped because a panic would drop the connection.
pub(crate) fn unreadable(err: serde_json::Error) -> GatewayError {
    GatewayError::invalid(format!("The request body could not be read: {err}."), None)
}

/// Normalizes message text as the module documentation describes.
pub(crate) fn normalize_text(text: &str) -> String {
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    let lines: Vec<&str> = text.split('\n').map(str::trim_end).collect();
    let Some(first) = lines.iter().position(|l| !l.is_empty()) else {
        return String::new();
    };
    let last = lines.iter().rposition(|l| !l.is_empty()).unwrap_or(first);
    match &lines[first..=last] {
        // A lone line has no other line to be indented against, so its indent is noise.
        [only] => only.trim_start().to_owned(),
        kept => kept.join("\n"),
    }
}

/// One blake3 hasher that only ever sees tagged, length-prefixed fields, so no two different
/// field sequences can produce the same byte stream.
pub struct FieldHasher(blake3::Hasher);

impl FieldHasher {
    fn new(domain: &str) -> Self {
        let mut hasher = Self(blake3::Hasher::new());
        hasher.field("domain", domain.as_bytes());
        hasher
    }

    pub(crate) fn field(&mut self, name: &str, bytes: &[u8]) {
        self.0.update(&(name.len() as u64).to_le_bytes());
        self.0.update(name.as_bytes());
        self.0.update(&(bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
    }

    /// Absent and `null` both mean "not set" and write nothing.
    pub(crate) fn json(&mut self, name: &str, value: Option<&Value>) {
        if let Some(value) = value.filter(|v| !v.is_null()) {
            self.field(name, canonical_string(value).as_bytes());
        }
    }

    /// Unknown fields, each under a name no known field can have.
    pub(crate) fn extra(&mut self, extra: &BTreeMap<String, Value>) {
        // BTreeMap iterates in byte order of the keys, independent of serde_json's features.
        for (name, value) in extra {
            self.json(&format!("extra.{name}"), Some(value));
        }
    }

    fn finish(self) -> [u8; 32] {
        *self.0.finalize().as_bytes()
    }
}

pub(crate) fn canonical_string(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn canonical_seq(messages: &[Map<String, Value>]) -> String {
    let mut out = String::from("[");
    for (i, message) in messages.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_object(message, &mut out);
    }
    out.push(']');
    out
}

/// Compact JSON with sorted keys. Sorting here, not trusting `Map`'s order, keeps keys stable if
/// any crate in the build turns on serde_json's `preserve_order`.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(map, out),
    }
}

fn write_object(map: &Map<String, Value>, out: &mut String) {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push('{');
    for (i, (key, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(key, out);
        out.push(':');
        write_canonical(value, out);
    }
    out.push('}');
}

/// 2^53: above it not every integer is a float, so integral floats up there keep their float form.
const MAX_EXACT_INT: f64 = 9_007_199_254_740_992.0;

fn write_number(n: &Number, out: &mut String) {
    if let Some(i) = n.as_i64() {
        out.push_str(&i.to_string());
    } else if let Some(u) = n.as_u64() {
        out.push_str(&u.to_string());
    } else if let Some(f) = n.as_f64() {
        if f.fract() == 0.0 && f.abs() < MAX_EXACT_INT {
            // Exact: |f| < 2^53 fits i64, and -0.0 becomes 0.
            out.push_str(&(f as i64).to_string());
        } else {
            // Display is the shortest text that parses back to the same f64.
            out.push_str(&f.to_string());
        }
    } else {
        // Only reachable with serde_json's arbitrary_precision and a number beyond f64.
        out.push_str(&n.to_string());
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    //! The helpers are shared with the adapters' key tests (`api/`): keys are built the way the
    //! gateway builds them, through the route's adapter.
    use super::*;
    use serde_json::json;

    pub(crate) fn tenant(api_key: &str) -> Tenant {
        Tenant::Key(*blake3::hash(api_key.as_bytes()).as_bytes())
    }

    pub(crate) fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    pub(crate) fn keys_with(
        route: Route,
        body: Value,
        tenant: Tenant,
        namespace: Option<&str>,
    ) -> Keys {
        let body = object(body);
        crate::api::keys(&KeyInput {
            route,
            body: &body,
            headers: &HeaderMap::new(),
            tenant,
            namespace,
        })
        .expect("valid request")
    }

    pub(crate) fn chat_keys(body: Value) -> Keys {
        keys_with(Route::ChatCompletions, body, tenant("sk-a"), None)
    }

    pub(crate) fn base() -> Value {
        json!({
            "model": "gpt-x",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "What is Rust?"}
            ],
            "temperature": 0.2
        })
    }

    pub(crate) fn with(edit: impl FnOnce(&mut Value)) -> Value {
        let mut body = base();
        edit(&mut body);
        body
    }

    /// A chat body whose only message is one user turn with `content`.
    pub(crate) fn user_says(content: Value) -> Value {
        json!({"model": "m", "messages": [{"role": "user", "content": content}]})
    }

    pub(crate) fn assert_same(a: &Keys, b: &Keys, what: &str) {
        assert_eq!(a.partition, b.partition, "{what}: partition");
        assert_eq!(a.exact, b.exact, "{what}: exact");
        assert_eq!(a.prompt, b.prompt, "{what}: prompt");
    }

    #[test]
    fn identical_requests_have_identical_keys() {
        let a = chat_keys(base());
        let b = chat_keys(base());
        assert_same(&a, &b, "identical");
        assert_eq!(a.prompt, "What is Rust?");
        assert_ne!(a.partition.0, a.exact.0);
    }

    #[test]
    fn tenant_namespace_and_route_change_the_partition() {
        let body = json!({"model": "m", "prompt": "hi", "input": "hi"});
        let route = Route::Completions;
        let a = keys_with(route, body.clone(), tenant("sk-a"), None);
        let cases = [
            (
                "tenant",
                keys_with(route, body.clone(), tenant("sk-b"), None),
            ),
            (
                "shared",
                keys_with(route, body.clone(), Tenant::Shared, None),
            ),
            (
                "namespace",
                keys_with(route, body.clone(), tenant("sk-a"), Some("ns")),
            ),
            (
                "route",
                keys_with(Route::Embeddings, body.clone(), tenant("sk-a"), None),
            ),
        ];
        for (what, b) in cases {
            assert_ne!(a.partition, b.partition, "{what}: partition");
            assert_ne!(a.exact, b.exact, "{what}: exact");
        }
        let ns1 = keys_with(route, body.clone(), tenant("sk-a"), Some("one"));
        let ns2 = keys_with(route, body, tenant("sk-a"), Some("two"));
        assert_ne!(ns1.partition, ns2.partition);
    }

    #[test]
    fn a_different_final_turn_keeps_the_partition_and_changes_the_exact_key() {
        let a = chat_keys(base());
        let b = chat_keys(with(|b| b["messages"][3]["content"] = json!("What is Go?")));
        assert_eq!(a.partition, b.partition);
        assert_ne!(a.exact, b.exact);
        assert_eq!(b.prompt, "What is Go?");
    }

    #[test]
    fn whitespace_is_normalized_only_at_the_edges_of_lines_and_text() {
        let keys = |text: &str| chat_keys(user_says(json!(text)));
        let same = [
            ("Hello  world\r\n  ", "Hello  world"),
            ("\n\n  Hello\t\n\n", "Hello"),
            ("a  \r\nb\t\rc", "a\nb\nc"),
            (
                "\n    def f():\n        pass  \n",
                "    def f():\n        pass",
            ),
        ];
        for (a, b) in same {
            assert_same(&keys(a), &keys(b), a);
        }
        assert_eq!(keys("Hello  world\r\n  ").prompt, "Hello  world");
        let different = [
            ("Hello world", "Hello  world"),
            ("def f():\n    pass", "def f():\n  pass"),
            ("    a\n    b", "a\n    b"),
            ("a\n\nb", "a\nb"),
        ];
        for (a, b) in different {
            let (ka, kb) = (keys(a), keys(b));
            assert_eq!(ka.partition, kb.partition, "{a:?}");
            assert_ne!(ka.exact, kb.exact, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn key_order_does_not_matter() {
        let mut first = Map::new();
        first.insert("model".into(), json!("m"));
        first.insert("temperature".into(), json!(0.5));
        first.insert(
            "messages".into(),
            json!([{"role": "user", "content": "hi"}]),
        );
        let mut second = Map::new();
        second.insert(
            "messages".into(),
            json!([{"content": "hi", "role": "user"}]),
        );
        second.insert("temperature".into(), json!(0.5));
        second.insert("model".into(), json!("m"));
        let a = chat_keys(Value::Object(first));
        let b = chat_keys(Value::Object(second));
        assert_same(&a, &b, "insertion order");

        let text_a = r#"{"model":"m","response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{"type":"object","properties":{"a":{"type":"string"}}}}},"messages":[{"role":"user","content":"hi"}]}"#;
        let text_b = r#"{"messages":[{"content":"hi","role":"user"}],"response_format":{"json_schema":{"schema":{"properties":{"a":{"type":"string"}},"type":"object"},"name":"s"},"type":"json_schema"},"model":"m"}"#;
        let parse = |t: &str| serde_json::from_str::<Value>(t).expect("json");
        assert_same(
            &chat_keys(parse(text_a)),
            &chat_keys(parse(text_b)),
            "text order",
        );
    }

    #[test]
    fn numbers_compare_by_value() {
        let t = |v: Value| chat_keys(with(|b| b["temperature"] = v));
        assert_same(&t(json!(1)), &t(json!(1.0)), "1 vs 1.0");
        let parse = |s: &str| serde_json::from_str::<Value>(s).expect("number");
        assert_same(&t(parse("0.50")), &t(parse("0.5")), "0.50 vs 0.5");
        assert_same(&t(parse("-0.0")), &t(parse("0")), "-0.0 vs 0");
        assert_ne!(t(json!(1)).partition, t(json!(1.5)).partition);
        assert_ne!(t(json!(1)).partition, t(json!("1")).partition);

        let canonical = |v: Value| canonical_string(&v);
        assert_eq!(canonical(json!(2.0)), "2");
        assert_eq!(canonical(json!(0.1)), "0.1");
        assert_eq!(canonical(json!(-7)), "-7");
        assert_eq!(canonical(json!(u64::MAX)), u64::MAX.to_string());
        assert_eq!(canonical(json!(1e300)), 1e300_f64.to_string());
        assert_eq!(
            canonical(json!({"b": [1.0, null], "a": "\"\n\u{1}"})),
            r#"{"a":"\"\n\u0001","b":[1,null]}"#
        );
    }

    #[test]
    fn absent_equals_null_but_not_an_explicit_default() {
        let absent = chat_keys(base());
        let null = chat_keys(with(|b| b["top_p"] = Value::Null));
        assert_same(&absent, &null, "top_p null");
        let unknown_null = chat_keys(with(|b| b["x_vendor"] = Value::Null));
        assert_same(&absent, &unknown_null, "unknown null");
        let tool_call = |content: Option<Value>| {
            let mut assistant = json!({"role": "assistant", "tool_calls": [{"id": "c1"}]});
            if let Some(content) = content {
                assistant["content"] = content;
            }
            chat_keys(json!({"model": "m", "messages": [
                {"role": "user", "content": "weather?"},
                assistant,
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                {"role": "user", "content": "thanks"}
            ]}))
        };
        assert_same(
            &tool_call(None),
            &tool_call(Some(Value::Null)),
            "content null",
        );

        let no_temperature = chat_keys(with(|b| {
            b.as_object_mut().expect("object").remove("temperature");
        }));
        let default_temperature = chat_keys(with(|b| b["temperature"] = json!(1)));
        assert_ne!(no_temperature.partition, default_temperature.partition);
    }

    #[test]
    fn messages_after_the_last_user_turn_are_in_the_partition() {
        let turns = |result: &str| {
            chat_keys(json!({"model": "m", "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": null,
                 "tool_calls": [{"id": "c1", "type": "function",
                                 "function": {"name": "weather", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": result}
            ]}))
        };
        let sunny = turns("sunny");
        let rainy = turns("rainy");
        assert_eq!(sunny.prompt, "weather in Paris?");
        assert_eq!(sunny.prompt, rainy.prompt);
        assert_ne!(sunny.partition, rainy.partition);
        assert_ne!(sunny.exact, rainy.exact);

        // The same message before or after the user turn is a different context.
        let order = |messages: Value| chat_keys(json!({"model": "m", "messages": messages}));
        let a =
            order(json!([{"role": "assistant", "content": "x"}, {"role": "user", "content": "q"}]));
        let b =
            order(json!([{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}]));
        assert_ne!(a.partition, b.partition);
    }

    #[test]
    fn without_a_user_turn_everything_is_partition() {
        let only = |text: &str| {
            chat_keys(json!({"model": "m", "messages": [{"role": "system", "content": text}]}))
        };
        let a = only("one");
        let b = only("two");
        assert_eq!(a.prompt, "");
        assert_ne!(a.partition, b.partition);
        assert_ne!(a.exact, b.exact);
    }

    #[test]
    fn tenant_comes_from_the_bearer_token_or_api_key() {
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().expect("header value"));
            }
            map
        };
        let from = |pairs: &[(&'static str, &str)]| Tenant::from_headers(&headers(pairs), false);
        let a = from(&[("authorization", "Bearer a")]);
        let b = from(&[("authorization", "Bearer b")]);
        assert_ne!(a, b);
        assert_eq!(a, tenant("a"));
        assert_eq!(a, from(&[("authorization", "bearer  a ")]));
        // The same key in any credential header is the same tenant.
        assert_eq!(a, from(&[("api-key", "a")]));
        assert_eq!(a, from(&[("x-api-key", " a")]));
        assert_eq!(
            a,
            from(&[("authorization", "Bearer a"), ("x-api-key", "a")])
        );
        // Clients that differ in any credential they send are different tenants: before, the
        // first header present decided alone, and `x-api-key` was not read at all.
        assert_ne!(a, from(&[("x-api-key", "b")]));
        let both = from(&[("authorization", "Bearer a"), ("x-api-key", "b")]);
        assert_ne!(both, a);
        assert_ne!(both, b);
        assert_ne!(
            both,
            from(&[("authorization", "Bearer a"), ("x-api-key", "c")])
        );
        assert_ne!(
            from(&[("authorization", "Bearer a"), ("api-key", "b")]),
            from(&[("authorization", "Bearer a"), ("api-key", "c")])
        );
        // Hashed length-prefixed: the boundary between two credentials cannot move.
        assert_ne!(
            from(&[("authorization", "Bearer ab"), ("x-api-key", "c")]),
            from(&[("authorization", "Bearer a"), ("x-api-key", "bc")])
        );
        assert_eq!(from(&[]), tenant(""));
        assert_ne!(from(&[("authorization", "Basic YTpi")]), tenant("YTpi"));
        assert_eq!(
            Tenant::from_headers(&headers(&[("authorization", "Bearer a")]), true),
            Tenant::Shared
        );

        assert_eq!(Tenant::Shared.label(), "shared");
        let label = a.label();
        assert_eq!(label.len(), 16);
        assert!(label
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(label, blake3::hash(b"a").to_hex()[..16]);

        // One key acting for another organization or project is another tenant (a stored
        // response's id is one organization's); naming neither keeps the key's own tenant.
        let org = |o: &str| from(&[("authorization", "Bearer a"), ("openai-organization", o)]);
        assert_ne!(org("org-A"), a);
        assert_ne!(org("org-A"), org("org-B"));
        assert_eq!(org("org-A"), org(" org-A "));
        assert_eq!(org(""), a);
        let project = from(&[("authorization", "Bearer a"), ("openai-project", "org-A")]);
        assert_ne!(project, org("org-A"), "which header names it counts");
        assert_ne!(
            from(&[
                ("authorization", "Bearer b"),
                ("openai-organization", "org-A")
            ]),
            org("org-A")
        );
    }

    #[test]
    fn hex_forms() {
        let keys = chat_keys(base());
        assert_eq!(keys.exact.to_hex().len(), 64);
        assert_eq!(
            keys.partition.to_hex()[..16],
            format!("{:?}", keys.partition)
        );
        assert_eq!(CacheKey([0xab; 32]).to_hex(), "ab".repeat(32));
    }

    #[test]
    fn wrong_types_are_rejected_with_the_param() {
        let cases: Vec<(Route, Value, &str)> = vec![
            (
                Route::ChatCompletions,
                json!({"model": "m", "messages": "hi"}),
                "messages",
            ),
            (Route::ChatCompletions, json!({"model": "m"}), "messages"),
            (
                Route::ChatCompletions,
                json!({"model": 3, "messages": []}),
                "model",
            ),
            (
                Route::ChatCompletions,
                json!({"model": "m", "messages": [{"role": "user", "content": "a"}, 5]}),
                "messages[1]",
            ),
            (
                Route::ChatCompletions,
                json!({"model": "m", "messages": [
                    {"role": "system", "content": "a"},
                    {"role": "user", "content": "b"},
                    {"role": 7, "content": "c"}
                ]}),
                "messages[2].role",
            ),
            (
                Route::ChatCompletions,
                json!({"model": "m", "messages": [{"content": "c"}]}),
                "messages[0].role",
            ),
            (
                Route::ChatCompletions,
                json!({"model": "m", "messages": [{"role": "user", "content": 1}]}),
                "messages[0].content",
            ),
            (
                Route::ChatCompletions,
                json!({"model": "m", "messages": [{"role": "user", "content": ["x"]}]}),
                "messages[0].content[0]",
            ),
            (
                Route::ChatCompletions,
                json!({"model": "m", "messages": [{"role": "user",
                       "content": [{"type": "text", "text": 1}]}]}),
                "messages[0].content[0].text",
            ),
            (
                Route::Completions,
                json!({"model": "m", "prompt": 1}),
                "prompt",
            ),
            (Route::Completions, json!({"model": "m"}), "prompt"),
            (
                Route::Embeddings,
                json!({"model": "m", "input": {}}),
                "input",
            ),
        ];
        for (route, body, param) in cases {
            let map = object(body.clone());
            let err = crate::api::keys(&KeyInput {
                route,
                body: &map,
                headers: &HeaderMap::new(),
                tenant: Tenant::Shared,
                namespace: None,
            })
            .expect_err(&body.to_string());
            assert_eq!(err.status().as_u16(), 400, "{body}");
            assert_eq!(err.body()["error"]["param"], param, "{body}");
        }
    }
}
