//! Savings accounting: the tokens a hit did not send upstream and what they would have cost.
//!
//! A hit's tokens are its entry's stored `usage` (the upstream's own count, `reported`). An entry
//! whose upstream sent none (a chat stream without `stream_options.include_usage`) has the text of
//! the prompt and of the answer counted with OpenAI's tokenizer for the model's family instead
//! (`counted`, tiktoken's `o200k_base` or `cl100k_base`). Anthropic publishes no tokenizer for its
//! current models: their text is counted with `cl100k_base` and labelled an approximation, as is a
//! model of a family no tokenizer is known for. A hit never waits for a tokenizer's tables to be
//! built (0.44 s): until they are, its text is estimated at four bytes a token and labelled so.
//!
//! Money comes from a price table: a dated default compiled in (`server/prices.toml`), which
//! `--prices FILE` extends or overrides model by model, and `namespace_prices` per namespace. A
//! model without a price still has its tokens counted; its cost is absent, never zero.
//!
//! What one entry saves is worked out on its first hit and remembered (bounded; an estimate is
//! not), so later hits of the same entry read one map entry and parse nothing.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use lru::LruCache;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tiktoken_rs::CoreBPE;

use crate::entry::Replay;
use crate::lock::lock;
use reprise_wire::{PriceTableInfo, TokenSource, TokensSaved};

/// The default price table, dated, with its sources.
pub const DEFAULT_PRICES: &str = include_str!("../prices.toml");

/// How many entries' token counts are remembered.
const REMEMBERED: usize = 65_536;

/// The price of one model, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
}

/// A price table file: the default's format, which `--prices` files share.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    date: Option<String>,
    #[serde(default)]
    sources: Vec<String>,
    #[serde(default)]
    models: BTreeMap<String, Price>,
}

/// Per-namespace prices from the configuration (`[namespace_prices.NAME]`), model by model.
pub type NamespacePrices = BTreeMap<String, BTreeMap<String, Price>>;

/// The price table in force.
#[derive(Debug, Clone)]
pub struct Prices {
    models: BTreeMap<String, Price>,
    namespaces: NamespacePrices,
    info: PriceTableInfo,
}

fn parse_file(text: &str) -> Result<PriceFile, String> {
    let file: PriceFile = toml::from_str(text).map_err(|e| e.to_string())?;
    check_prices(file.models.iter())?;
    Ok(file)
}

fn check_prices<'a>(prices: impl Iterator<Item = (&'a String, &'a Price)>) -> Result<(), String> {
    for (model, price) in prices {
        for (kind, value) in [("input", price.input), ("output", price.output)] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!(
                    "model {model:?}: {kind} = {value} is not a price of 0 or more (US dollars per million tokens)"
                ));
            }
        }
    }
    Ok(())
}

/// The entry of `table` for `model`: the exact name, else the longest key that `model` starts
/// with followed by `-` (a dated snapshot of that model).
fn lookup<'a>(table: &'a BTreeMap<String, Price>, model: &str) -> Option<&'a Price> {
    if let Some(price) = table.get(model) {
        return Some(price);
    }
    table
        .iter()
        .filter(|(key, _)| {
            model
                .strip_prefix(key.as_str())
                .is_some_and(|rest| rest.starts_with('-'))
        })
        .max_by_key(|(key, _)| key.len())
        .map(|(_, price)| price)
}

impl Prices {
    /// The compiled-in defaults, then `file`'s models over them, then the namespaces' own.
    pub fn build(file: Option<&Path>, namespaces: &NamespacePrices) -> Result<Self, String> {
        let defaults = parse_file(DEFAULT_PRICES).map_err(|e| format!("the default table: {e}"))?;
        let mut models = defaults.models;
        let mut info = PriceTableInfo {
            date: defaults.date.unwrap_or_default(),
            sources: defaults.sources,
            file: None,
            models: 0,
        };
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let over = parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            models.extend(over.models);
            // The file's own date and sources describe what it changed; both are shown.
            if let Some(date) = over.date {
                info.date = format!("{} (defaults); {date} ({})", info.date, path.display());
            }
            info.sources.extend(over.sources);
            info.file = Some(path.display().to_string());
        }
        for (namespace, table) in namespaces {
            check_prices(table.iter()).map_err(|e| format!("namespace {namespace:?}: {e}"))?;
        }
        info.models = models.len();
        Ok(Self {
            models,
            namespaces: namespaces.clone(),
            info,
        })
    }

    /// The price of `model` for a request of `namespace`: the namespace's own, else the table's.
    pub fn price(&self, model: &str, namespace: Option<&str>) -> Option<Price> {
        namespace
            .and_then(|n| self.namespaces.get(n))
            .and_then(|table| lookup(table, model))
            .or_else(|| lookup(&self.models, model))
            .copied()
    }

    /// US dollars for `input` and `output` tokens of `model`; `None` when it has no price.
    pub fn cost(
        &self,
        model: &str,
        namespace: Option<&str>,
        input: u64,
        output: u64,
    ) -> Option<f64> {
        let price = self.price(model, namespace)?;
        Some((input as f64 * price.input + output as f64 * price.output) / 1e6)
    }

    pub fn info(&self) -> &PriceTableInfo {
        &self.info
    }
}

/// Input and output tokens of an upstream `usage` object, whichever API wrote it: chat and legacy
/// completions and embeddings (`prompt_tokens`, `completion_tokens`), the Responses API
/// (`input_tokens`, `output_tokens`) and Anthropic's Messages API (`input_tokens` plus its
/// prompt-cache reads and writes, `output_tokens`). `None` when it holds no count.
pub fn usage_tokens(usage: &Value) -> Option<(u64, u64)> {
    let get = |name: &str| usage.get(name).and_then(Value::as_u64);
    let input = get("prompt_tokens").or_else(|| get("input_tokens"));
    let output = get("completion_tokens").or_else(|| get("output_tokens"));
    if input.is_none() && output.is_none() {
        return None;
    }
    let cached = get("cache_creation_input_tokens").unwrap_or(0)
        + get("cache_read_input_tokens").unwrap_or(0);
    Some((input.unwrap_or(0) + cached, output.unwrap_or(0)))
}

/// The BPE tables a model's text is counted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Table {
    O200k,
    Cl100k,
    P50k,
    R50k,
}

/// Which tables are built: the first use of one builds it, which takes a while (see [`warm`]).
static READY: [AtomicBool; 4] = [const { AtomicBool::new(false) }; 4];

impl Table {
    /// The tables, built on first use (0.44 s for o200k_base in a release build; see [`warm`]).
    fn bpe(self) -> &'static CoreBPE {
        let bpe = match self {
            Table::O200k => tiktoken_rs::o200k_base_singleton(),
            Table::Cl100k => tiktoken_rs::cl100k_base_singleton(),
            Table::P50k => tiktoken_rs::p50k_base_singleton(),
            Table::R50k => tiktoken_rs::r50k_base_singleton(),
        };
        READY[self.slot()].store(true, Ordering::Release);
        bpe
    }

    /// The tables if they are built; if not, `None`, and they are built on a thread of their own
    /// (once): a hit never waits for them. It used to, for 0.44 s in a release build, on the first
    /// hit after every restart whose answer had no usage.
    fn built(self) -> Option<&'static CoreBPE> {
        if READY[self.slot()].load(Ordering::Acquire) {
            return Some(self.bpe());
        }
        self.warm();
        None
    }

    /// Builds the tables on a thread of their own, once.
    fn warm(self) {
        static WARMED: [AtomicBool; 4] = [const { AtomicBool::new(false) }; 4];
        if WARMED[self.slot()].swap(true, Ordering::Relaxed) {
            return;
        }
        // Not a task that must finish: until it does, counts are estimated.
        let built = std::thread::Builder::new()
            .name("reprise-tokenizer".into())
            .spawn(move || {
                self.bpe();
            });
        if let Err(err) = built {
            // Tried again at the next hit that needs it, rather than estimating for good.
            WARMED[self.slot()].store(false, Ordering::Relaxed);
            tracing::debug!(error = %err, "could not start building the tokenizer");
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

/// The table text of `model` is counted with, and its label: OpenAI's own for its models;
/// `cl100k_base` for Anthropic's, whose tokenizer is not public (an approximation, labelled
/// `approx:`); `o200k_base`, also an approximation, for any other.
fn table(model: &str) -> (Table, &'static str) {
    use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
    // GPT-5 postdates the crate's model map; it uses o200k_base as GPT-4o does.
    let known = if model.starts_with("gpt-5") {
        Some(Tokenizer::O200kBase)
    } else {
        get_tokenizer(model)
    };
    match known {
        Some(Tokenizer::O200kBase) => (Table::O200k, "o200k_base"),
        Some(Tokenizer::Cl100kBase) => (Table::Cl100k, "cl100k_base"),
        Some(Tokenizer::P50kBase | Tokenizer::P50kEdit) => (Table::P50k, "p50k_base"),
        Some(Tokenizer::R50kBase | Tokenizer::Gpt2) => (Table::R50k, "r50k_base"),
        None if model.starts_with("claude") => (Table::Cl100k, "approx:cl100k_base"),
        None => (Table::O200k, "approx:o200k_base"),
    }
}

/// The tokenizer text of `model` is counted with, and its label.
pub fn tokenizer(model: &str) -> (&'static CoreBPE, &'static str) {
    let (table, label) = table(model);
    (table.bpe(), label)
}

/// Builds `model`'s tokenizer on a thread of its own, once: called when an answer without usage
/// is stored, so that its first hit can count it (over a second in a debug build; until then hits
/// are estimated). A gateway whose upstream always reports usage never loads them.
pub fn warm(model: &str) {
    table(model).0.warm();
}

/// Keys whose string values are a message's words rather than its structure.
const TEXT_KEYS: [&str; 6] = ["content", "text", "arguments", "refusal", "input", "output"];

/// Collects the text of an answer or a prompt: strings under [`TEXT_KEYS`] (and every string
/// inside them), so roles, ids, types and finish reasons are left out.
fn collect_text(value: &Value, inside: bool, out: &mut String) {
    match value {
        Value::String(s) if inside => {
            out.push_str(s);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|v| collect_text(v, inside, out)),
        Value::Object(map) => {
            for (key, v) in map {
                let text = inside && !matches!(key.as_str(), "role" | "type" | "id" | "name")
                    || TEXT_KEYS.contains(&key.as_str());
                collect_text(v, text, out);
            }
        }
        _ => {}
    }
}

/// The text a request sends: its messages, system prompt, input or prompt.
fn prompt_text(request: &Map<String, Value>) -> String {
    let mut out = String::new();
    for key in ["system", "instructions", "messages", "input", "prompt"] {
        if let Some(v) = request.get(key) {
            collect_text(v, true, &mut out);
        }
    }
    out
}

/// The text of a stored answer (its `choices`, `content` or `output`).
fn answer_text(body: &Value) -> String {
    let mut out = String::new();
    for key in ["choices", "content", "output"] {
        if let Some(v) = body.get(key) {
            collect_text(v, false, &mut out);
        }
    }
    out
}

/// The label of tokens estimated while the tokenizer's tables are still being built.
pub const ESTIMATED: &str = "approx:bytes/4";

/// Counts what a request and its stored answer would have cost in tokens, without a `usage`, with
/// `tokenizer` and its label; estimated ([`ESTIMATED`]) without one (its tables not built yet).
fn count_with(
    tokenizer: Option<(&CoreBPE, &'static str)>,
    request: &Map<String, Value>,
    body: &Value,
) -> (u64, u64, &'static str) {
    let (prompt, answer) = (prompt_text(request), answer_text(body));
    match tokenizer {
        Some((bpe, label)) => {
            let tokens = |text: &str| bpe.encode_ordinary(text).len() as u64;
            (tokens(&prompt), tokens(&answer), label)
        }
        // About four bytes of UTF-8 a token: four characters of English (OpenAI's rule of
        // thumb), one or two characters of Chinese or Japanese (three bytes each).
        None => (
            prompt.len().div_ceil(4) as u64,
            answer.len().div_ceil(4) as u64,
            ESTIMATED,
        ),
    }
}

/// Only the `usage` of a response body: the rest is skipped without being built.
#[derive(Deserialize)]
struct UsageOnly {
    #[serde(default)]
    usage: Option<Value>,
}

/// One entry's tokens, as worked out on its first hit.
#[derive(Debug, Clone, Copy)]
struct Tokens {
    input: u64,
    output: u64,
    /// The tokenizer, when they were counted rather than reported.
    counted: Option<&'static str>,
}

/// The price table and what each entry's answer cost in tokens.
pub struct Accounting {
    pub prices: Prices,
    remembered: Mutex<LruCache<(u64, u64), Tokens>>,
}

impl Accounting {
    pub fn new(prices: Prices) -> Self {
        let cap = NonZeroUsize::new(REMEMBERED).unwrap_or(NonZeroUsize::MIN);
        Self {
            prices,
            remembered: Mutex::new(LruCache::new(cap)),
        }
    }

    /// The price table of the configuration: `prices` (a file) and `namespace_prices`.
    pub fn load(file: Option<&PathBuf>, namespaces: &NamespacePrices) -> Result<Self, String> {
        Ok(Self::new(Prices::build(
            file.map(PathBuf::as_path),
            namespaces,
        )?))
    }

    /// What serving `entry` to `request` saved: the entry's stored usage, or its text counted.
    pub fn saved(
        &self,
        entry: &Replay,
        request: &Map<String, Value>,
        model: &str,
        namespace: Option<&str>,
    ) -> TokensSaved {
        self.saved_with(entry, request, model, namespace, Table::built)
    }

    /// [`Accounting::saved`], with the tokenizers' tables as `tables` gives them (built or not).
    fn saved_with(
        &self,
        entry: &Replay,
        request: &Map<String, Value>,
        model: &str,
        namespace: Option<&str>,
        tables: impl Fn(Table) -> Option<&'static CoreBPE>,
    ) -> TokensSaved {
        let stamp = entry.stamp();
        let known = lock(&self.remembered).get(&stamp).copied();
        let tokens = known.unwrap_or_else(|| {
            let tokens = Self::tokens_of(entry, request, model, tables);
            // An estimate is made again until the tokenizer can count.
            if tokens.counted != Some(ESTIMATED) {
                lock(&self.remembered).put(stamp, tokens);
            }
            tokens
        });
        TokensSaved {
            input_tokens: tokens.input,
            output_tokens: tokens.output,
            source: match tokens.counted {
                Some(_) => TokenSource::Counted,
                None => TokenSource::Reported,
            },
            tokenizer: tokens.counted.map(str::to_owned),
            cost_usd: self
                .prices
                .cost(model, namespace, tokens.input, tokens.output),
        }
    }

    fn tokens_of(
        entry: &Replay,
        request: &Map<String, Value>,
        model: &str,
        tables: impl Fn(Table) -> Option<&'static CoreBPE>,
    ) -> Tokens {
        let json = entry.body_json();
        // A usage of nothing at all is a warmed entry's (no upstream made it): what its hit saved
        // is counted from the texts, as for an answer that reported no usage.
        let reported = serde_json::from_slice::<UsageOnly>(&json)
            .ok()
            .and_then(|b| b.usage)
            .as_ref()
            .and_then(usage_tokens)
            .filter(|(input, output)| input + output > 0);
        if let Some((input, output)) = reported {
            return Tokens {
                input,
                output,
                counted: None,
            };
        }
        let body = serde_json::from_slice::<Value>(&json).unwrap_or(Value::Null);
        let (table, label) = table(model);
        let (input, output, label) =
            count_with(tables(table).map(|bpe| (bpe, label)), request, &body);
        Tokens {
            input,
            output,
            counted: Some(label),
        }
    }

    /// The cost of a call that used `usage` (the judge's), at `model`'s price.
    pub fn cost_of(&self, model: &str, input: u64, output: u64) -> Option<f64> {
        self.prices.cost(model, None, input, output)
    }
}

/// `x-reprise-tokens-saved`: `input=812, output=164`, with `, counted=<tokenizer>` when the upstream
/// reported no usage.
pub fn tokens_header(saved: &TokensSaved) -> String {
    let mut value = format!(
        "input={}, output={}",
        saved.input_tokens, saved.output_tokens
    );
    if let Some(tokenizer) = &saved.tokenizer {
        value.push_str(", counted=");
        value.push_str(tokenizer);
    }
    value
}

/// `x-reprise-cost-saved`: US dollars with six decimals (a millionth of a dollar is below any
/// model's price of one token), e.g. `0.003670`.
pub fn cost_header(cost_usd: f64) -> String {
    format!("{cost_usd:.6}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_default_table_parses_is_dated_and_prices_the_well_known_models() {
        let prices = Prices::build(None, &NamespacePrices::new()).expect("defaults");
        assert_eq!(prices.info().date.len(), "2025-11-24".len());
        assert!(prices
            .info()
            .sources
            .iter()
            .all(|s| s.starts_with("https://")));
        for model in [
            "gpt-4o",
            "gpt-4o-mini",
            "gpt-4.1",
            "o3",
            "claude-sonnet-4-5",
        ] {
            assert!(prices.price(model, None).is_some(), "{model}");
        }
        // Snapshots take their model's price; the longest key wins.
        assert_eq!(
            prices.price("gpt-4o-2024-08-06", None),
            prices.price("gpt-4o", None)
        );
        assert_eq!(
            prices.price("gpt-4o-mini-2024-07-18", None),
            prices.price("gpt-4o-mini", None)
        );
        assert_ne!(
            prices.price("gpt-4o-mini", None),
            prices.price("gpt-4o", None)
        );
        assert_eq!(
            prices.price("claude-sonnet-4-5-20250929", None),
            prices.price("claude-sonnet-4-5", None)
        );
        // A prefix that is not a whole name part does not match.
        assert_eq!(prices.price("gpt-4oz", None), None);
        assert_eq!(prices.price("sim-model", None), None);
        assert_eq!(prices.cost("sim-model", None, 10, 10), None);
        let cost = prices
            .cost("gpt-4o", None, 1_000_000, 100_000)
            .expect("priced");
        assert!((cost - (2.5 + 1.0)).abs() < 1e-9, "{cost}");
    }

    #[test]
    fn a_file_and_a_namespace_override_the_defaults() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("prices.toml");
        std::fs::write(
            &path,
            "date = \"2026-01-01\"\n[models]\n\"gpt-4o\" = { input = 1.0, output = 2.0 }\n\"sim-model\" = { input = 3.0, output = 4.0 }\n",
        )
        .expect("write");
        let namespaces = NamespacePrices::from([(
            "support".to_owned(),
            BTreeMap::from([(
                "gpt-4o".to_owned(),
                Price {
                    input: 0.5,
                    output: 0.5,
                },
            )]),
        )]);
        let prices = Prices::build(Some(&path), &namespaces).expect("table");
        assert_eq!(prices.cost("sim-model", None, 1_000_000, 0), Some(3.0));
        assert_eq!(prices.cost("gpt-4o", None, 1_000_000, 1_000_000), Some(3.0));
        assert_eq!(
            prices.cost("gpt-4o", Some("support"), 1_000_000, 1_000_000),
            Some(1.0)
        );
        // Another namespace, and models the namespace does not price, use the table.
        assert_eq!(
            prices.cost("gpt-4o", Some("sales"), 1_000_000, 0),
            Some(1.0)
        );
        assert!(prices.price("gpt-4.1", Some("support")).is_some());
        assert!(prices.info().date.contains("2026-01-01"));
        assert_eq!(
            prices.info().file.as_deref(),
            Some(&*path.display().to_string())
        );

        std::fs::write(&path, "[models]\n\"x\" = { input = -1.0, output = 2.0 }\n").expect("write");
        let err = Prices::build(Some(&path), &NamespacePrices::new()).expect_err("negative");
        assert!(err.contains("\"x\"") && err.contains("input"), "{err}");
        std::fs::write(&path, "[models]\n\"x\" = { input = 1.0 }\n").expect("write");
        assert!(Prices::build(Some(&path), &NamespacePrices::new()).is_err());
    }

    #[test]
    fn usage_of_every_api_reads_as_input_and_output() {
        let chat = json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17});
        assert_eq!(usage_tokens(&chat), Some((12, 5)));
        let responses = json!({"input_tokens": 3, "output_tokens": 4, "total_tokens": 7});
        assert_eq!(usage_tokens(&responses), Some((3, 4)));
        let messages = json!({"input_tokens": 5, "output_tokens": 7, "cache_creation_input_tokens": 2, "cache_read_input_tokens": 3});
        assert_eq!(usage_tokens(&messages), Some((10, 7)));
        let embeddings = json!({"prompt_tokens": 8, "total_tokens": 8});
        assert_eq!(usage_tokens(&embeddings), Some((8, 0)));
        assert_eq!(usage_tokens(&json!({"total_tokens": 1})), None);
    }

    #[test]
    fn text_is_counted_with_the_model_family_tokenizer() {
        assert_eq!(tokenizer("gpt-4o-mini").1, "o200k_base");
        assert_eq!(tokenizer("gpt-5-mini").1, "o200k_base");
        assert_eq!(tokenizer("gpt-3.5-turbo").1, "cl100k_base");
        assert_eq!(tokenizer("claude-sonnet-4-5").1, "approx:cl100k_base");
        assert_eq!(tokenizer("sim-model").1, "approx:o200k_base");
        let request = json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]});
        let request = request.as_object().expect("an object");
        let body = json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi! How can I help?"}}]});
        // Before the tables are built, an estimate, said to be one: 22 and 20 bytes of text.
        assert_eq!(count_with(None, request, &body), (6, 5, ESTIMATED));
        let (input, output, label) = count_with(Some(tokenizer("gpt-4o")), request, &body);
        assert_eq!(label, "o200k_base");
        // The words only: no role, type, id or finish reason is counted.
        let bpe = tiktoken_rs::o200k_base_singleton();
        assert_eq!(
            input,
            bpe.encode_ordinary("Be brief.\nHello there\n").len() as u64
        );
        assert_eq!(
            output,
            bpe.encode_ordinary("Hi! How can I help?\n").len() as u64
        );
        let anthropic =
            json!({"content": [{"type": "text", "text": "Bonjour"}], "stop_reason": "end_turn"});
        assert!(count_with(Some(tokenizer("claude-3-5-haiku")), request, &anthropic).1 > 0);
    }

    /// A hit served before the tables were built is estimated; the estimate is not kept for the
    /// entry, so its next hit is counted with them, and that count is kept.
    #[test]
    fn an_estimate_is_not_remembered_and_the_count_after_it_is() {
        let accounting = Accounting::load(None, &NamespacePrices::new()).expect("defaults");
        let mut entry = crate::entry::Entry::for_test("Hello there", [7; 32]);
        entry.body = json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hi! How can I help?"}}]});
        let replay = Replay::of(&entry);
        let request =
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello there"}]});
        let request = request.as_object().expect("an object");
        let saved = |tables: &dyn Fn(Table) -> Option<&'static CoreBPE>| {
            accounting.saved_with(&replay, request, "gpt-4o", None, tables)
        };
        let estimated = saved(&|_| None);
        assert_eq!(estimated.tokenizer.as_deref(), Some(ESTIMATED));
        assert_eq!((estimated.input_tokens, estimated.output_tokens), (3, 5));
        assert!(lock(&accounting.remembered).is_empty(), "not remembered");
        let counted = saved(&|t| Some(t.bpe()));
        assert_eq!(counted.tokenizer.as_deref(), Some("o200k_base"));
        // Kept: a later hit reads it, built tables or not.
        let again = saved(&|_| None);
        assert_eq!(again.tokenizer.as_deref(), Some("o200k_base"));
        assert_eq!(again.output_tokens, counted.output_tokens);
    }

    #[test]
    fn headers_are_spelled_as_documented() {
        let mut saved = TokensSaved {
            input_tokens: 812,
            output_tokens: 164,
            source: TokenSource::Reported,
            tokenizer: None,
            cost_usd: Some(0.00367),
        };
        assert_eq!(tokens_header(&saved), "input=812, output=164");
        saved.tokenizer = Some("o200k_base".into());
        assert_eq!(
            tokens_header(&saved),
            "input=812, output=164, counted=o200k_base"
        );
        assert_eq!(cost_header(0.00367), "0.003670");
    }
}
