//! The error budget: the verdicts each near match met, kept as (similarity, right or wrong)
//! observations, and the rule that decides whether a candidate may be served without asking the
//! judge (`max_wrong`).
//!
//! ## The method
//!
//! The one assumption: within a namespace, the chance that serving a candidate (that passed the
//! guards) is wrong does not grow with its similarity. Under it, the observations made at or
//! *below* a lookup's similarity `s` over-estimate its chance of being wrong, never under-estimate
//! it. So a candidate at `s` is served without a judge call when the observations of its namespace
//! in the window `[s - WINDOW, s]` (to the bins' 0.005) bound the wrong rate within `max_wrong`:
//! the one-sided Clopper-Pearson upper bound at [`CONFIDENCE`] of `k` wrong among `n`. With no
//! wrong observation that takes `n >= 299` observations for `max_wrong = 0.01`, and one wrong one
//! raises that to about 474: a namespace starts by judging every candidate,
//! and judges less as evidence accumulates where its traffic falls.
//!
//! Each entry has its own curve on top of the namespace's: a wrong verdict on the entry at
//! similarity `w` means every candidate of that entry at `s <= w` is judged, whatever the
//! namespace's bound says (the entry's threshold, the similarity above which it may be served
//! unjudged, rises above `w`). Served candidates are still judged at the rate [`EXPLORE`], so the
//! bound keeps being checked against traffic that changes.
//!
//! What the bound is relative to: the verdicts, that is the judge's labels and the operators'.
//! A judge that is wrong 5% of the time makes the observations wrong as often; the README says how
//! an operator measures the judge itself (shadow mode, then `calibrate` on a labelled sample).

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use statrs::distribution::{Beta, ContinuousCDF};
use utoipa::ToSchema;

use crate::entry::EntryId;
use crate::timing::unix_ms;

/// Similarity bins of the namespace histograms: 0.005 wide.
const BINS: usize = 200;

/// How far below a lookup's similarity the observations that bound it reach.
pub const WINDOW: f32 = 0.03;

/// The confidence of the bound (one-sided).
pub const CONFIDENCE: f64 = 0.95;

/// The share of candidates the bound clears that are judged all the same.
pub const EXPLORE: f64 = 0.02;

/// How many observations an entry keeps (its newest); the namespace's counts keep all of them.
const ENTRY_OBSERVATIONS: usize = 64;

/// Where a verdict came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Judge,
    Operator,
}

/// One verdict an entry met.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Observation {
    pub similarity: f32,
    pub wrong: bool,
    pub source: Source,
    pub at_ms: u64,
}

/// An entry's verdicts and the threshold they set (`GET /admin/entries/{id}`).
#[derive(Debug, Clone, Default, Serialize, ToSchema)]
pub struct EntryCurve {
    /// Newest last.
    pub observations: Vec<Observation>,
    /// Candidates of this entry at or below this similarity are always judged (its highest
    /// wrong verdict).
    pub judged_at_or_below: Option<f32>,
}

/// A namespace's observations and the error rate they show (`/admin/stats`): the wire contract's.
pub use reprise_wire::NamespaceBudget;

/// What the budget says about one candidate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// Serve without a judge call; the bound it met.
    Serve { bound: Option<f64> },
    /// Ask the judge first.
    Judge(Why),
}

/// Why a candidate is judged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Why {
    /// Below the static threshold (no `max_wrong`).
    BelowThreshold,
    /// The entry was judged wrong at this similarity or above.
    EntryWrong,
    /// The window's bound is above `max_wrong` (1.0 when it holds no observation).
    Bound(f64),
    /// Cleared, but picked for exploration.
    Explore,
}

impl Why {
    pub fn name(self) -> &'static str {
        match self {
            Why::BelowThreshold => "below_threshold",
            Why::EntryWrong => "entry_wrong",
            Why::Bound(_) => "bound",
            Why::Explore => "explore",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Counts {
    n: u32,
    wrong: u32,
}

/// The observations, in the feedback database (so they survive restarts) and, per namespace, in
/// memory.
pub struct Observations {
    /// namespace bytes, 0, bin → [`Counts`].
    namespaces: sled::Tree,
    /// entry id → its newest [`Observation`]s.
    entries: sled::Tree,
    counts: Mutex<BTreeMap<String, Vec<Counts>>>,
    /// `reprise_error_budget_observations{verdict}`: all namespaces together (a client may name
    /// any namespace, so it is no label).
    observed: prometheus::IntGaugeVec,
}

fn bin(similarity: f32) -> usize {
    ((similarity.clamp(0.0, 1.0) * BINS as f32) as usize).min(BINS - 1)
}

fn namespace_key(namespace: &str, bin: usize) -> Vec<u8> {
    let mut key = namespace.as_bytes().to_vec();
    key.push(0);
    key.push(bin as u8);
    key
}

/// The one-sided Clopper-Pearson upper bound of a rate of `k` in `n` at `confidence`.
pub fn upper_bound(k: u64, n: u64, confidence: f64) -> f64 {
    if n == 0 || k >= n {
        return 1.0;
    }
    Beta::new(k as f64 + 1.0, (n - k) as f64)
        .map(|b| b.inverse_cdf(confidence))
        .unwrap_or(1.0)
}

impl Observations {
    /// Opens the trees in `db` and reads the namespaces' counts into memory.
    pub fn open(db: &sled::Db) -> sled::Result<Self> {
        let namespaces = db.open_tree("observations")?;
        let mut counts: BTreeMap<String, Vec<Counts>> = BTreeMap::new();
        for (key, value) in namespaces.iter().flatten() {
            let Some((&bin, rest)) = key.split_last() else {
                continue;
            };
            let Some((0, name)) = rest.split_last().map(|(z, n)| (*z, n)) else {
                continue;
            };
            let (Ok(name), Ok(c)) = (
                std::str::from_utf8(name),
                serde_json::from_slice::<Counts>(&value),
            ) else {
                continue;
            };
            if let Some(slot) = counts
                .entry(name.to_owned())
                .or_insert_with(|| vec![Counts::default(); BINS])
                .get_mut(bin as usize)
            {
                *slot = c;
            }
        }
        let observed = prometheus::IntGaugeVec::new(
            prometheus::Opts::new(
                "reprise_error_budget_observations",
                "Verdicts on near matches (judge and operators) the error budget counts.",
            ),
            &["verdict"],
        )
        .unwrap_or_else(|err| panic!("invalid metric definition: {err}"));
        let (n, wrong) = counts.values().flatten().fold((0, 0), |(n, w), c| {
            (n + i64::from(c.n), w + i64::from(c.wrong))
        });
        observed.with_label_values(&["right"]).set(n - wrong);
        observed.with_label_values(&["wrong"]).set(wrong);
        Ok(Self {
            namespaces,
            entries: db.open_tree("entry_observations")?,
            counts: Mutex::new(counts),
            observed,
        })
    }

    /// The `reprise_error_budget_observations` gauge, for the gateway's registry.
    pub fn collector(&self) -> Box<dyn prometheus::core::Collector> {
        Box::new(self.observed.clone())
    }

    /// Records a verdict on `entry` met at `similarity`.
    pub fn add(
        &self,
        namespace: &str,
        entry: EntryId,
        similarity: f32,
        wrong: bool,
        source: Source,
    ) {
        let b = bin(similarity);
        let counts = {
            let mut all = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            let bins = all
                .entry(namespace.to_owned())
                .or_insert_with(|| vec![Counts::default(); BINS]);
            bins[b].n += 1;
            bins[b].wrong += u32::from(wrong);
            bins[b]
        };
        self.observed
            .with_label_values(&[if wrong { "wrong" } else { "right" }])
            .inc();
        let observation = Observation {
            similarity,
            wrong,
            source,
            at_ms: unix_ms(),
        };
        // Not flushed: a verdict lost in a crash costs one more judge call, never a wrong answer.
        let written = self
            .namespaces
            .insert(
                namespace_key(namespace, b),
                serde_json::to_vec(&counts).unwrap_or_default(),
            )
            .and_then(|_| {
                self.entries
                    .fetch_and_update(entry.0.to_be_bytes(), |old| {
                        let mut list: Vec<Observation> = old
                            .and_then(|b| serde_json::from_slice(b).ok())
                            .unwrap_or_default();
                        list.push(observation);
                        let excess = list.len().saturating_sub(ENTRY_OBSERVATIONS);
                        list.drain(..excess);
                        serde_json::to_vec(&list).ok()
                    })
                    .map(|_| ())
            });
        if let Err(err) = written {
            tracing::warn!(error = %err, "storing a verdict's observation failed");
        }
    }

    /// The entry's observations and the threshold they set.
    pub fn entry(&self, entry: EntryId) -> EntryCurve {
        let observations: Vec<Observation> = self
            .entries
            .get(entry.0.to_be_bytes())
            .ok()
            .flatten()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let judged_at_or_below = observations
            .iter()
            .filter(|o| o.wrong)
            .map(|o| o.similarity)
            .reduce(f32::max);
        EntryCurve {
            observations,
            judged_at_or_below,
        }
    }

    /// Forgets an entry's own observations (it was removed); its namespace keeps counting them.
    pub fn forget(&self, entry: EntryId) {
        let _ = self.entries.remove(entry.0.to_be_bytes());
    }

    /// `k` wrong among `n` observations of `namespace` in the window below `similarity`.
    fn window(&self, namespace: &str, similarity: f32) -> (u64, u64) {
        let all = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let Some(bins) = all.get(namespace) else {
            return (0, 0);
        };
        let (from, to) = (bin(similarity - WINDOW), bin(similarity));
        bins[from..=to].iter().fold((0, 0), |(k, n), c| {
            (k + u64::from(c.wrong), n + u64::from(c.n))
        })
    }

    /// Whether a candidate of `entry` at `similarity` may be served without a judge call.
    /// `max_wrong`: the namespace's budget, or `None` for the static threshold. `explore` is a
    /// uniform draw in [0, 1).
    pub fn decide(
        &self,
        namespace: &str,
        entry: EntryId,
        similarity: f32,
        max_wrong: Option<f64>,
        threshold: f32,
        explore: f64,
    ) -> Decision {
        if self
            .entry(entry)
            .judged_at_or_below
            .is_some_and(|w| similarity <= w)
        {
            return Decision::Judge(Why::EntryWrong);
        }
        let Some(max_wrong) = max_wrong else {
            return if similarity >= threshold {
                Decision::Serve { bound: None }
            } else {
                Decision::Judge(Why::BelowThreshold)
            };
        };
        let (k, n) = self.window(namespace, similarity);
        let bound = upper_bound(k, n, CONFIDENCE);
        if bound > max_wrong {
            Decision::Judge(Why::Bound(bound))
        } else if explore < EXPLORE {
            Decision::Judge(Why::Explore)
        } else {
            Decision::Serve { bound: Some(bound) }
        }
    }

    /// Every namespace's observations, for `/admin/stats`.
    pub fn summary(&self) -> Vec<NamespaceBudget> {
        let all = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .map(|(namespace, bins)| {
                let (n, wrong) = bins.iter().fold((0u64, 0u64), |(n, w), c| {
                    (n + u64::from(c.n), w + u64::from(c.wrong))
                });
                NamespaceBudget {
                    namespace: namespace.clone(),
                    observations: n,
                    wrong,
                    wrong_rate: (n > 0).then(|| wrong as f64 / n as f64),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observations() -> (tempfile::TempDir, sled::Db, Observations) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::Config::new().path(dir.path()).open().expect("sled");
        let o = Observations::open(&db).expect("open");
        (dir, db, o)
    }

    #[test]
    fn the_bound_is_clopper_pearson() {
        // 0 of 299: 1 - 0.05^(1/299) = 0.00997.
        assert!((upper_bound(0, 299, 0.95) - 0.00997).abs() < 1e-4);
        assert!(upper_bound(0, 298, 0.95) > 0.01);
        // 5 of 100: 0.1024 (the tables' value).
        assert!((upper_bound(5, 100, 0.95) - 0.1024).abs() < 1e-3);
        assert_eq!(upper_bound(0, 0, 0.95), 1.0);
        assert_eq!(upper_bound(3, 3, 0.95), 1.0);
    }

    #[test]
    fn a_namespace_is_judged_until_its_window_bounds_the_error_rate() {
        let (_dir, _db, o) = observations();
        let no_explore = 0.5;
        assert_eq!(
            o.decide("", EntryId(1), 0.95, Some(0.01), 0.9, no_explore),
            Decision::Judge(Why::Bound(1.0))
        );
        for i in 0..300 {
            o.add("", EntryId(100 + i), 0.94, false, Source::Judge);
        }
        assert!(matches!(
            o.decide("", EntryId(1), 0.95, Some(0.01), 0.9, no_explore),
            Decision::Serve { bound: Some(b) } if b <= 0.01
        ));
        // Observations above a lookup never vouch for it; another namespace has its own.
        assert!(matches!(
            o.decide("", EntryId(1), 0.90, Some(0.01), 0.9, no_explore),
            Decision::Judge(Why::Bound(_))
        ));
        assert!(matches!(
            o.decide("support", EntryId(1), 0.95, Some(0.01), 0.9, no_explore),
            Decision::Judge(Why::Bound(_))
        ));
        // Cleared candidates are explored at the rate EXPLORE.
        assert_eq!(
            o.decide("", EntryId(1), 0.95, Some(0.01), 0.9, EXPLORE / 2.0),
            Decision::Judge(Why::Explore)
        );
        // Wrong verdicts in the window raise the bound past the budget again.
        for i in 0..5 {
            o.add("", EntryId(500 + i), 0.93, true, Source::Judge);
        }
        assert!(matches!(
            o.decide("", EntryId(1), 0.95, Some(0.01), 0.9, no_explore),
            Decision::Judge(Why::Bound(b)) if b > 0.01
        ));
    }

    #[test]
    fn an_entry_judged_wrong_is_judged_at_or_below_that_similarity_and_it_persists() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = sled::Config::new().path(dir.path()).open().expect("sled");
            let o = Observations::open(&db).expect("open");
            o.add("ns", EntryId(7), 0.93, true, Source::Judge);
            o.add("ns", EntryId(7), 0.97, false, Source::Operator);
            db.flush().expect("flush");
        }
        // sled lets go of the lock from its flusher a moment after the drop.
        let db = reprise_migrations::fixtures::open_when_free(dir.path()).expect("sled");
        let o = Observations::open(&db).expect("reopen");
        let curve = o.entry(EntryId(7));
        assert_eq!(curve.observations.len(), 2);
        assert_eq!(curve.judged_at_or_below, Some(0.93));
        // Static threshold: above it served, unless the entry was wrong that close.
        assert_eq!(
            o.decide("ns", EntryId(7), 0.92, None, 0.9, 0.5),
            Decision::Judge(Why::EntryWrong)
        );
        assert_eq!(
            o.decide("ns", EntryId(7), 0.95, None, 0.9, 0.5),
            Decision::Serve { bound: None }
        );
        assert_eq!(
            o.decide("ns", EntryId(8), 0.85, None, 0.9, 0.5),
            Decision::Judge(Why::BelowThreshold)
        );
        let summary = o.summary();
        assert_eq!(summary.len(), 1);
        assert_eq!((summary[0].observations, summary[0].wrong), (2, 1));
    }
}
