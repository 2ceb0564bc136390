//! What the benchmark sends: workload files (JSON Lines), generated workloads (Zipf-distributed
//! repeats and paraphrases drawn from a bank of paraphrase groups), and the legacy prompt sources.
//!
//! Every request is classified *by construction* as it is drawn: `new` (its text was never sent in
//! this run), `repeat` (the same text was sent before) or `paraphrase` (a new text whose group was
//! sent before). Comparing that with the cache outcome the gateway reported shows how well it does
//! (a repeat that misses, a paraphrase below the similarity threshold).

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rand::distr::weighted::WeightedIndex;
use rand::distr::Distribution;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::Zipf;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The bank of paraphrase groups used by `--generate` unless `--bank` names another.
pub const DEFAULT_BANK: &str = include_str!("../../../benches/workloads/bank.jsonl");

/// How a request relates to the ones drawn before it in the same run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    New,
    Repeat,
    Paraphrase,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Repeat => "repeat",
            Self::Paraphrase => "paraphrase",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The content of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// The chat `messages` array.
    pub messages: Arc<Value>,
    /// Overrides `--model` for this request.
    pub model: Option<String>,
    /// Items sharing a group are paraphrases of one another.
    pub group: Option<String>,
    /// Relative draw weight (weighted order only).
    pub weight: f64,
    /// Sent as `Cache-Control` (the paraphrase workload stores its `a` prompts with `no-cache`
    /// and asks its `b` prompts with `no-store`).
    pub cache_control: Option<&'static str>,
}

impl Item {
    pub fn prompt(text: &str, group: Option<String>) -> Self {
        Self {
            messages: Arc::new(json!([{"role": "user", "content": text}])),
            model: None,
            group,
            weight: 1.0,
            cache_control: None,
        }
    }

    /// The same request sent with `Cache-Control: value`.
    pub fn with_cache_control(mut self, value: &'static str) -> Self {
        self.cache_control = Some(value);
        self
    }

    /// Identity of the text as a cache would see it (model and messages).
    fn text_key(&self) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new();
        hasher.update(self.model.as_deref().unwrap_or("").as_bytes());
        hasher.update(&[0]);
        hasher.update(self.messages.to_string().as_bytes());
        *hasher.finalize().as_bytes()
    }
}

/// One drawn request.
#[derive(Debug, Clone)]
pub struct Planned {
    pub item: Item,
    pub kind: Kind,
}

/// Remembers what was sent, to classify each request by construction.
#[derive(Debug, Clone, Default)]
pub struct Novelty {
    texts: HashSet<[u8; 32]>,
    groups: HashSet<String>,
}

impl Novelty {
    /// Classifies `item` against everything noted so far, and notes it.
    pub fn classify(&mut self, item: &Item) -> Kind {
        let new_text = self.texts.insert(item.text_key());
        let new_group = match &item.group {
            // A paraphrase for another model cannot be served from this one's entries.
            Some(g) => self
                .groups
                .insert(format!("{}\0{g}", item.model.as_deref().unwrap_or(""))),
            None => true,
        };
        if !new_text {
            Kind::Repeat
        } else if !new_group {
            Kind::Paraphrase
        } else {
            Kind::New
        }
    }
}

/// A malformed workload or bank file; `line` is 1-based.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{source_name} line {line}: {message}")]
pub struct WorkloadError {
    pub source_name: String,
    pub line: usize,
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    prompt: Option<String>,
    messages: Option<Vec<Value>>,
    group: Option<Value>,
    weight: Option<f64>,
    model: Option<String>,
}

/// Parses a JSON Lines workload: one object per line with `prompt` (a string) or `messages` (a chat
/// messages array), and optionally `group`, `weight` (> 0) and `model`. Blank lines are skipped.
pub fn parse_jsonl(text: &str, source_name: &str) -> Result<Vec<Item>, WorkloadError> {
    let mut items = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let raw = raw.trim();
        if raw.is_empty() {
            continue;
        }
        let fail = |message: String| WorkloadError {
            source_name: source_name.to_owned(),
            line: i + 1,
            message,
        };
        let line: Line = serde_json::from_str(raw).map_err(|e| fail(e.to_string()))?;
        let messages = match (line.prompt, line.messages) {
            (Some(p), None) if !p.trim().is_empty() => json!([{"role": "user", "content": p}]),
            (Some(_), None) => return Err(fail("`prompt` is empty".into())),
            (None, Some(m)) => {
                if m.is_empty() {
                    return Err(fail("`messages` is empty".into()));
                }
                if let Some(bad) = m
                    .iter()
                    .position(|msg| msg.get("role").and_then(Value::as_str).is_none())
                {
                    return Err(fail(format!("`messages[{bad}]` has no string `role`")));
                }
                Value::Array(m)
            }
            (Some(_), Some(_)) => return Err(fail("give `prompt` or `messages`, not both".into())),
            (None, None) => return Err(fail("needs `prompt` or `messages`".into())),
        };
        let group = match line.group {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() => Some(s),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(_) => {
                return Err(fail(
                    "`group` must be a non-empty string or a number".into(),
                ))
            }
        };
        let weight = line.weight.unwrap_or(1.0);
        if !(weight.is_finite() && weight > 0.0) {
            return Err(fail(format!("`weight` must be above 0, got {weight}")));
        }
        items.push(Item {
            messages: Arc::new(messages),
            model: line.model,
            group,
            weight,
            cache_control: None,
        });
    }
    if items.is_empty() {
        return Err(WorkloadError {
            source_name: source_name.to_owned(),
            line: 0,
            message: "no prompts".into(),
        });
    }
    Ok(items)
}

/// Reads and parses a workload file.
pub fn read_jsonl(path: &Path) -> Result<Vec<Item>, WorkloadError> {
    let name = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| WorkloadError {
        source_name: name.clone(),
        line: 0,
        message: e.to_string(),
    })?;
    parse_jsonl(&text, &name)
}

/// Paraphrase groups for generated workloads: each group's texts ask the same thing.
#[derive(Debug, Clone)]
pub struct Bank {
    pub groups: Vec<Vec<String>>,
}

impl Bank {
    /// Groups a JSON Lines bank (`{"prompt": ..., "group": ...}`) by group, in order of first
    /// appearance; a line without a group is a group of its own.
    pub fn parse(text: &str, source_name: &str) -> Result<Self, WorkloadError> {
        let items = parse_jsonl(text, source_name)?;
        let mut order: Vec<Option<String>> = Vec::new();
        let mut groups: Vec<Vec<String>> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let text = item
                .messages
                .get(0)
                .and_then(|m| m.get("content"))
                .and_then(Value::as_str)
                .filter(|_| item.messages.as_array().is_some_and(|a| a.len() == 1))
                .ok_or_else(|| WorkloadError {
                    source_name: source_name.to_owned(),
                    line: i + 1,
                    message: "bank lines need a single `prompt`".into(),
                })?;
            match item
                .group
                .as_ref()
                .and_then(|g| order.iter().position(|o| o.as_ref() == Some(g)))
            {
                Some(at) => groups[at].push(text.to_owned()),
                None => {
                    order.push(item.group.clone());
                    groups.push(vec![text.to_owned()]);
                }
            }
        }
        Ok(Self { groups })
    }

    pub fn default_bank() -> Result<Self, WorkloadError> {
        Self::parse(DEFAULT_BANK, "benches/workloads/bank.jsonl")
    }
}

/// Parameters of a generated workload.
#[derive(Debug, Clone, Serialize)]
pub struct GenSpec {
    /// Distinct prompts (topics). Without `repeat_share`, repeats are drawn from a Zipf law over
    /// this many topics; with it, it only caps how many new topics appear.
    pub distinct: Option<usize>,
    /// Zipf exponent: how strongly repeats concentrate on the most popular topics.
    pub zipf_s: f64,
    /// Share of requests that repeat an earlier prompt verbatim (fixed shares mode).
    pub repeat_share: Option<f64>,
    /// Share of requests that are a paraphrase of an earlier prompt.
    pub paraphrase_share: f64,
    pub seed: u64,
}

impl GenSpec {
    pub fn validate(&self) -> Result<(), String> {
        let share = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} must be within 0..=1, got {v}"))
            }
        };
        share("--paraphrase-share", self.paraphrase_share)?;
        if let Some(r) = self.repeat_share {
            share("--repeat-share", r)?;
            if r + self.paraphrase_share > 1.0 + 1e-9 {
                return Err(format!(
                    "--repeat-share {r} plus --paraphrase-share {} is above 1",
                    self.paraphrase_share
                ));
            }
        }
        if !(self.zipf_s.is_finite() && self.zipf_s >= 0.0) {
            return Err(format!("--zipf-s must be 0 or more, got {}", self.zipf_s));
        }
        if self.distinct == Some(0) {
            return Err("--distinct must be at least 1".into());
        }
        Ok(())
    }

    /// Topics of the Zipf draw when no repeat share is fixed.
    pub const DEFAULT_DISTINCT: usize = 200;
}

/// Openings that turn a question into another way of asking it, after the bank's own variants.
const FRAMINGS: &[&str] = &[
    "Quick question: ",
    "Can you help me with this? ",
    "I was wondering: ",
];

/// Ways of asking about a synthetic topic (its words), the first being the topic's own prompt.
const SYNTHETIC: &[(&str, &str)] = &[
    ("Tell me about ", "."),
    ("Could you explain ", "?"),
    ("What do you know about ", "?"),
    ("Give me an overview of ", "."),
    ("I would like to learn about ", "."),
];

#[derive(Debug, Clone)]
struct Topic {
    variants: Vec<String>,
    /// Indices of the variants sent so far, in order.
    sent: Vec<usize>,
}

impl Topic {
    fn next_unsent(&self) -> Option<usize> {
        (0..self.variants.len()).find(|v| !self.sent.contains(v))
    }
}

/// Draws a generated workload, request by request, reproducibly from its seed.
#[derive(Debug, Clone)]
pub struct Generator {
    spec: GenSpec,
    bank: Arc<Bank>,
    /// Seeded order in which bank groups become topics.
    bank_order: Vec<usize>,
    /// Topic states by topic id; `None` while not introduced.
    topics: Vec<Option<Topic>>,
    /// Introduced topic ids, in order of introduction (the popularity ranks of the shares mode).
    introduced: Vec<usize>,
    rng: StdRng,
    drawn: usize,
    /// Requests drawn so far by construction, indexed by `Kind`.
    made: [usize; 3],
    zipf_all: Option<Zipf<f64>>,
}

impl Generator {
    pub fn new(spec: GenSpec, bank: Arc<Bank>) -> Result<Self, String> {
        spec.validate()?;
        let mut rng = StdRng::seed_from_u64(spec.seed);
        let mut bank_order: Vec<usize> = (0..bank.groups.len()).collect();
        // Fisher-Yates with the run's generator, so the order is part of what the seed fixes.
        for i in (1..bank_order.len()).rev() {
            let j = rng.random_range(0..=i);
            bank_order.swap(i, j);
        }
        let zipf_all = if spec.repeat_share.is_none() {
            let n = spec.distinct.unwrap_or(GenSpec::DEFAULT_DISTINCT);
            Some(Zipf::new(n as f64, spec.zipf_s).map_err(|e| e.to_string())?)
        } else {
            None
        };
        Ok(Self {
            spec,
            bank,
            bank_order,
            topics: Vec::new(),
            introduced: Vec::new(),
            rng,
            drawn: 0,
            made: [0; 3],
            zipf_all,
        })
    }

    pub fn spec(&self) -> &GenSpec {
        &self.spec
    }

    /// The texts of topic `id`: a bank group (its own variants, then framed ones) while the bank
    /// lasts, then synthetic topics of seeded words that are far apart in meaning.
    fn variants(&self, id: usize) -> Vec<String> {
        if let Some(&g) = self.bank_order.get(id) {
            let own = &self.bank.groups[g];
            let mut out = own.clone();
            for framing in FRAMINGS {
                out.extend(own.iter().map(|t| format!("{framing}{t}")));
            }
            return out;
        }
        let mut reader = blake3::Hasher::new()
            .update(b"reprise-bench-topic")
            .update(&self.spec.seed.to_le_bytes())
            .update(&(id as u64).to_le_bytes())
            .finalize_xof();
        let words: Vec<&str> = (0..8)
            .map(|_| {
                let mut b = [0u8; 2];
                reader.fill(&mut b);
                super::WORDS[usize::from(u16::from_le_bytes(b)) % super::WORDS.len()]
            })
            .collect();
        let words = words.join(", ");
        SYNTHETIC
            .iter()
            .map(|(pre, post)| format!("{pre}{words}{post}"))
            .collect()
    }

    fn topic_mut(&mut self, id: usize) -> &mut Option<Topic> {
        if self.topics.len() <= id {
            self.topics.resize(id + 1, None);
        }
        &mut self.topics[id]
    }

    fn introduce(&mut self, id: usize) -> (usize, usize) {
        let variants = self.variants(id);
        *self.topic_mut(id) = Some(Topic {
            variants,
            sent: vec![0],
        });
        self.introduced.push(id);
        (id, 0)
    }

    fn can_introduce(&self) -> bool {
        self.spec
            .distinct
            .is_none_or(|cap| self.introduced.len() < cap)
    }

    /// Draws an introduced topic by Zipf rank (rank 1 = introduced first).
    fn zipf_introduced(&mut self) -> usize {
        let n = self.introduced.len();
        let rank = Zipf::new(n as f64, self.spec.zipf_s)
            .map(|z| z.sample(&mut self.rng) as usize)
            .unwrap_or(1);
        self.introduced[rank.clamp(1, n) - 1]
    }

    fn repeat_of(&mut self, id: usize) -> (usize, usize) {
        let sent = self.topics[id].as_ref().map_or(vec![0], |t| t.sent.clone());
        let v = sent[self.rng.random_range(0..sent.len())];
        (id, v)
    }

    fn paraphrase_of(&mut self, id: usize) -> Option<(usize, usize)> {
        let topic = self.topics.get_mut(id)?.as_mut()?;
        let v = topic.next_unsent()?;
        topic.sent.push(v);
        Some((id, v))
    }

    /// A paraphrase of a Zipf-drawn earlier topic that still has an unsent variant (falling back
    /// to the most popular such topic), or `None` when every variant was sent.
    fn any_paraphrase(&mut self) -> Option<(usize, usize)> {
        for _ in 0..8 {
            let id = self.zipf_introduced();
            if let Some(p) = self.paraphrase_of(id) {
                return Some(p);
            }
        }
        let ids = self.introduced.clone();
        ids.into_iter().find_map(|id| self.paraphrase_of(id))
    }

    /// Chooses the next (topic, variant).
    fn choose(&mut self) -> (usize, usize) {
        if let Some(zipf) = self.zipf_all {
            let id = (zipf.sample(&mut self.rng) as usize).max(1) - 1;
            if self.topics.get(id).is_none_or(Option::is_none) {
                return self.introduce(id);
            }
            // Paraphrase while behind the target share, so the share holds whatever Zipf draws.
            let behind = (self.made[Kind::Paraphrase as usize] as f64)
                < self.spec.paraphrase_share * (self.drawn + 1) as f64;
            if behind {
                if let Some(p) = self.paraphrase_of(id) {
                    return p;
                }
            }
            return self.repeat_of(id);
        }
        // Fixed shares: the kind furthest behind its share goes next, so the shares hold at any
        // run length (a random draw would miss them by a few percent in a short run).
        let repeat = self.spec.repeat_share.unwrap_or(0.0);
        let paraphrase = self.spec.paraphrase_share;
        let shares = [(1.0 - repeat - paraphrase).max(0.0), repeat, paraphrase];
        let n = (self.drawn + 1) as f64;
        let mut kind = 0;
        for k in 1..3 {
            if shares[k] * n - self.made[k] as f64 > shares[kind] * n - self.made[kind] as f64 {
                kind = k;
            }
        }
        if self.can_introduce() && (kind == Kind::New as usize || self.introduced.is_empty()) {
            let id = self.introduced.len();
            return self.introduce(id);
        }
        if kind == Kind::Paraphrase as usize {
            if let Some(p) = self.any_paraphrase() {
                return p;
            }
        }
        // A repeat, or what a new prompt or a paraphrase falls back to when none is left.
        let id = self.zipf_introduced();
        self.repeat_of(id)
    }

    fn next_item(&mut self) -> Item {
        let (id, v) = self.choose();
        self.drawn += 1;
        let text = self.topics[id]
            .as_ref()
            .and_then(|t| t.variants.get(v).cloned())
            .unwrap_or_default();
        Item::prompt(&text, Some(format!("t{id}")))
    }
}

/// Order in which a workload file is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Order {
    /// File order, cycled.
    Sequential,
    /// Drawn at random (seeded) in proportion to each line's `weight`.
    Weighted,
}

#[derive(Debug, Clone)]
enum Source {
    /// Every request a new generated prompt.
    Fresh {
        run_id: String,
    },
    /// Request i sends generated prompt i mod `distinct`.
    Cycle {
        run_id: String,
        distinct: usize,
    },
    /// Items from a file.
    List {
        items: Arc<Vec<Item>>,
        weighted: Option<Box<(WeightedIndex<f64>, StdRng)>>,
    },
    Generated(Box<Generator>),
}

/// The request source of a run, classifying each drawn request.
#[derive(Debug, Clone)]
pub struct Workload {
    source: Source,
    novelty: Novelty,
    drawn: usize,
    counts: [usize; 3],
}

impl Workload {
    fn with(source: Source) -> Self {
        Self {
            source,
            novelty: Novelty::default(),
            drawn: 0,
            counts: [0; 3],
        }
    }

    /// A new prompt for every request (the default).
    pub fn fresh(run_id: &str) -> Self {
        Self::with(Source::Fresh {
            run_id: run_id.to_owned(),
        })
    }

    /// `distinct` generated prompts, cycled (later passes can be served from a cache).
    pub fn cycle(run_id: &str, distinct: usize) -> Self {
        Self::with(Source::Cycle {
            run_id: run_id.to_owned(),
            distinct: distinct.max(1),
        })
    }

    /// Items from a file, in the given order.
    pub fn list(items: Vec<Item>, order: Order, seed: u64) -> Result<Self, String> {
        let weighted = match order {
            Order::Sequential => None,
            Order::Weighted => Some(Box::new((
                WeightedIndex::new(items.iter().map(|i| i.weight)).map_err(|e| e.to_string())?,
                StdRng::seed_from_u64(seed),
            ))),
        };
        Ok(Self::with(Source::List {
            items: Arc::new(items),
            weighted,
        }))
    }

    /// Plain prompts, one per item, in order (cycled).
    pub fn prompts(prompts: &[String]) -> Result<Self, String> {
        if prompts.is_empty() {
            return Err("the prompts file has no prompts".into());
        }
        Self::list(
            prompts.iter().map(|p| Item::prompt(p, None)).collect(),
            Order::Sequential,
            0,
        )
    }

    pub fn generated(generator: Generator) -> Self {
        Self::with(Source::Generated(Box::new(generator)))
    }

    /// Requests drawn so far.
    pub fn drawn(&self) -> usize {
        self.drawn
    }

    /// Draws the next request and classifies it.
    pub fn next_planned(&mut self) -> Planned {
        let index = self.drawn;
        let item = match &mut self.source {
            Source::Fresh { run_id } => Item::prompt(&super::generated_prompt(run_id, index), None),
            Source::Cycle { run_id, distinct } => {
                Item::prompt(&super::generated_prompt(run_id, index % *distinct), None)
            }
            Source::List { items, weighted } => match weighted {
                Some(draw) => {
                    let (dist, rng) = &mut **draw;
                    items[dist.sample(rng)].clone()
                }
                None => items[index % items.len()].clone(),
            },
            Source::Generated(generator) => generator.next_item(),
        };
        self.drawn += 1;
        let kind = self.novelty.classify(&item);
        if let Source::Generated(generator) = &mut self.source {
            generator.made[kind as usize] += 1;
        }
        self.counts[kind as usize] += 1;
        Planned { item, kind }
    }

    /// Requests drawn so far by construction: (new, repeat, paraphrase).
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.counts[0], self.counts[1], self.counts[2])
    }

    /// The warm-up requests. Sources that walk a fixed sequence prime a cache with its first
    /// requests (noted as sent, so the measured ones that follow count as repeats); the others warm
    /// up with throwaway prompts the measured requests never send.
    pub fn warmup(&mut self, n: usize, run_id: &str) -> Vec<Item> {
        let primes = matches!(
            self.source,
            Source::Cycle { .. } | Source::List { weighted: None, .. }
        );
        if primes {
            let mut walk = self.clone();
            (0..n)
                .map(|_| {
                    let item = walk.next_planned().item;
                    self.novelty.classify(&item);
                    item
                })
                .collect()
        } else {
            (0..n)
                .map(|i| Item::prompt(&super::generated_prompt(run_id, usize::MAX - i), None))
                .collect()
        }
    }

    /// One line saying what the workload is.
    pub fn describe(&self) -> String {
        match &self.source {
            Source::Fresh { .. } => "every request a new prompt".into(),
            Source::Cycle { distinct, .. } => format!("{distinct} distinct prompts, cycled"),
            Source::List { items, weighted } => {
                let groups: BTreeSet<&String> =
                    items.iter().filter_map(|i| i.group.as_ref()).collect();
                format!(
                    "{} prompts from a file ({} paraphrase groups), {}",
                    items.len(),
                    groups.len(),
                    if weighted.is_some() {
                        "drawn by weight"
                    } else {
                        "in file order"
                    }
                )
            }
            Source::Generated(g) => {
                let s = g.spec();
                match s.repeat_share {
                    Some(r) => format!(
                        "generated: {:.0}% repeats, {:.0}% paraphrases (Zipf s={} over earlier prompts){}, seed {}",
                        r * 100.0,
                        s.paraphrase_share * 100.0,
                        s.zipf_s,
                        s.distinct
                            .map(|d| format!(", at most {d} distinct"))
                            .unwrap_or_default(),
                        s.seed
                    ),
                    None => format!(
                        "generated: Zipf s={} over {} distinct prompts, {:.0}% paraphrases, seed {}",
                        s.zipf_s,
                        s.distinct.unwrap_or(GenSpec::DEFAULT_DISTINCT),
                        s.paraphrase_share * 100.0,
                        s.seed
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generator(
        repeat_share: Option<f64>,
        paraphrase_share: f64,
        distinct: Option<usize>,
    ) -> Workload {
        let spec = GenSpec {
            distinct,
            zipf_s: 1.0,
            repeat_share,
            paraphrase_share,
            seed: 7,
        };
        let bank = Arc::new(Bank::default_bank().expect("bank"));
        Workload::generated(Generator::new(spec, bank).expect("generator"))
    }

    fn text(p: &Planned) -> String {
        p.item.messages[0]["content"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    #[test]
    fn jsonl_errors_name_the_line() {
        let text = "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\", \"weight\": 0}\n";
        let err = parse_jsonl(text, "w.jsonl").expect_err("weight 0");
        assert_eq!(err.line, 3);
        assert!(
            err.to_string().starts_with("w.jsonl line 3: `weight`"),
            "{err}"
        );
        let err = parse_jsonl("{\"prompt\": \"a\"}\n{oops", "w").expect_err("syntax");
        assert_eq!(err.line, 2);
        let err = parse_jsonl("{\"text\": \"a\"}", "w").expect_err("unknown field");
        assert!(err.message.contains("unknown field"), "{err}");
        let err = parse_jsonl("{\"prompt\": \"a\", \"messages\": []}", "w").expect_err("both");
        assert!(err.message.contains("not both"));
        let err = parse_jsonl("{\"messages\": [{\"content\": \"x\"}]}", "w").expect_err("role");
        assert!(err.message.contains("messages[0]"));
        assert_eq!(
            parse_jsonl("\n\n", "w").expect_err("empty").message,
            "no prompts"
        );
    }

    #[test]
    fn jsonl_lines_parse_with_groups_weights_and_models() {
        let text = concat!(
            "{\"prompt\": \"Hi\", \"group\": \"g1\", \"weight\": 3}\n",
            "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"Hey\"}], \"group\": 1, \"model\": \"m2\"}\n"
        );
        let items = parse_jsonl(text, "w").expect("parses");
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].group.as_deref(), Some("g1"));
        assert_eq!(items[0].weight, 3.0);
        assert_eq!(items[0].messages[0]["content"], "Hi");
        assert_eq!(items[1].group.as_deref(), Some("1"));
        assert_eq!(items[1].model.as_deref(), Some("m2"));
        assert_eq!(items[1].messages.as_array().map(Vec::len), Some(2));
    }

    #[test]
    fn classification_follows_texts_and_groups() {
        let a = Item::prompt("a", Some("g".into()));
        let b = Item::prompt("b", Some("g".into()));
        let c = Item::prompt("c", None);
        let mut novelty = Novelty::default();
        assert_eq!(novelty.classify(&a), Kind::New);
        assert_eq!(novelty.classify(&b), Kind::Paraphrase);
        assert_eq!(novelty.classify(&a), Kind::Repeat);
        assert_eq!(novelty.classify(&c), Kind::New);
        assert_eq!(novelty.classify(&c), Kind::Repeat);
        let mut other_model = b.clone();
        other_model.model = Some("other".into());
        assert_eq!(novelty.classify(&other_model), Kind::New);
    }

    #[test]
    fn the_bank_groups_paraphrases() {
        let bank = Bank::default_bank().expect("bank");
        assert_eq!(bank.groups.len(), 60);
        assert!(bank.groups.iter().all(|g| g.len() == 3));
        let err = Bank::parse("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]}", "b")
            .expect_err("two messages");
        assert_eq!(err.line, 1);
    }

    #[test]
    fn fixed_shares_are_held_within_tolerance() {
        let mut w = generator(Some(0.3), 0.2, None);
        let n = 4000;
        let drawn: Vec<Planned> = (0..n).map(|_| w.next_planned()).collect();
        let (new, repeat, paraphrase) = w.counts();
        assert_eq!(new + repeat + paraphrase, n);
        let share = |c: usize| c as f64 / n as f64;
        assert!(
            (share(repeat) - 0.3).abs() < 0.03,
            "repeats {}",
            share(repeat)
        );
        assert!(
            (share(paraphrase) - 0.2).abs() < 0.03,
            "paraphrases {}",
            share(paraphrase)
        );
        // The first request of a prompt is new: classification agrees with the texts.
        let mut seen = HashSet::new();
        for p in &drawn {
            assert_eq!(seen.insert(text(p)), p.kind != Kind::Repeat, "{}", text(p));
        }
        // The same seed draws the same workload.
        let mut again = generator(Some(0.3), 0.2, None);
        let replay: Vec<String> = (0..200).map(|_| text(&again.next_planned())).collect();
        let first: Vec<String> = drawn[..200].iter().map(text).collect();
        assert_eq!(replay, first);
    }

    #[test]
    fn zipf_draws_favour_the_top_ranks() {
        let mut w = generator(None, 0.0, Some(100));
        let mut by_topic = std::collections::HashMap::new();
        for _ in 0..5000 {
            let p = w.next_planned();
            *by_topic
                .entry(p.item.group.clone().unwrap_or_default())
                .or_insert(0usize) += 1;
        }
        let rank = |r: usize| by_topic.get(&format!("t{}", r - 1)).copied().unwrap_or(0);
        assert!(
            rank(1) > rank(10),
            "rank 1 {} vs rank 10 {}",
            rank(1),
            rank(10)
        );
        assert!(
            rank(10) > rank(100),
            "rank 10 {} vs rank 100 {}",
            rank(10),
            rank(100)
        );
        // With s = 1 over 100 ranks, rank 1 draws about 1 / H(100) = 19% of requests.
        assert!((700..1200).contains(&rank(1)), "rank 1 {}", rank(1));
        let (_, _, paraphrase) = w.counts();
        assert_eq!(paraphrase, 0);
    }

    #[test]
    fn zipf_mode_targets_the_paraphrase_share() {
        let mut w = generator(None, 0.2, Some(400));
        for _ in 0..3000 {
            w.next_planned();
        }
        let (new, _, paraphrase) = w.counts();
        assert!(new <= 400);
        let share = paraphrase as f64 / 3000.0;
        assert!((share - 0.2).abs() < 0.03, "paraphrase share {share}");
    }

    #[test]
    fn a_distinct_cap_turns_new_prompts_into_repeats() {
        let mut w = generator(Some(0.0), 0.0, Some(5));
        for _ in 0..50 {
            w.next_planned();
        }
        assert_eq!(w.counts(), (5, 45, 0));
    }

    #[test]
    fn sequential_lists_prime_on_warmup_and_weighted_ones_do_not() {
        let items = vec![Item::prompt("a", None), Item::prompt("b", None)];
        let mut w = Workload::list(items.clone(), Order::Sequential, 1).expect("list");
        let warm = w.warmup(1, "r");
        assert_eq!(warm[0], items[0]);
        assert_eq!(w.next_planned().kind, Kind::Repeat);
        assert_eq!(w.next_planned().kind, Kind::New);
        let mut weighted = items.clone();
        weighted[1].weight = 1000.0;
        let mut w = Workload::list(weighted, Order::Weighted, 1).expect("list");
        let warm = w.warmup(1, "r");
        assert_ne!(warm[0], items[0]);
        let bs = (0..100)
            .filter(|_| w.next_planned().item.messages[0]["content"] == "b")
            .count();
        assert!(bs > 90, "{bs}");
    }
}
