//! The figures of a match-quality run, computed from recorded outcomes alone (no HTTP here): shares
//! served per category at the gateway's own decisions, and a sweep that re-judges every pair at other
//! thresholds from its recorded similarity.
//!
//! A pair is *served* when the lookup of `b` was answered from `a`'s entry. For a should-hit pair
//! that is a saved upstream call; for a trap (`same_answer: false`) it is a wrong answer.
//! "Wrong" in the threshold budget (≤ 1%, ≤ 5%) is the share of traps served, the stricter of the
//! two wrong-answer figures (the other, `error_rate`, divides by every pair).

use std::collections::BTreeMap;

use serde::Serialize;

/// What the sweep needs of one pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    pub same_answer: bool,
    /// Served by the exact lookup, which no threshold can stop.
    pub exact: bool,
    /// Similarity to `a`'s entry: of the match on a semantic hit, of the nearest candidate on a
    /// miss; `None` when the partition held no candidate (the gateway never compared them).
    pub similarity: Option<f64>,
    /// A literal guard refuses `a`'s entry (`x-reprise-nearest-guard`): no threshold would serve it.
    pub guarded: bool,
}

impl Scored {
    /// Whether the gateway would serve this pair with its threshold at `threshold`.
    pub fn served_at(&self, threshold: f64) -> bool {
        self.exact || (!self.guarded && self.similarity.is_some_and(|s| s >= threshold))
    }
}

/// How one pair's lookup ended, as a [`Tally`] counts it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observed {
    pub same_answer: bool,
    pub served: bool,
    /// No candidate at all: `a` is in another partition.
    pub no_candidate: bool,
    /// The candidate was refused by a literal guard.
    pub guarded: bool,
}

/// Counts for one group of pairs (all, a category, a file).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Tally {
    /// Pairs with an outcome (pairs whose requests failed are counted in `errors` only).
    pub pairs: usize,
    pub should_hit: usize,
    pub should_hit_served: usize,
    pub traps: usize,
    pub traps_served: usize,
    /// Pairs whose lookup found no candidate at all: a different partition (other earlier turns).
    pub no_candidate: usize,
    /// Pairs whose candidate a guard refuses (`x-reprise-nearest-guard`).
    pub guarded: usize,
    /// Pairs left out because a request failed.
    pub errors: usize,
}

impl Tally {
    pub fn add(&mut self, o: Observed) {
        self.pairs += 1;
        if o.same_answer {
            self.should_hit += 1;
            self.should_hit_served += usize::from(o.served);
        } else {
            self.traps += 1;
            self.traps_served += usize::from(o.served);
        }
        self.no_candidate += usize::from(o.no_candidate);
        self.guarded += usize::from(o.guarded);
    }

    /// Share of should-hit pairs served; `None` without any.
    pub fn hit_share(&self) -> Option<f64> {
        ratio(self.should_hit_served, self.should_hit)
    }

    /// Share of traps served, i.e. given a wrong answer; `None` without any.
    pub fn trap_share(&self) -> Option<f64> {
        ratio(self.traps_served, self.traps)
    }

    /// Wrong answers over every query of the group.
    pub fn error_rate(&self) -> Option<f64> {
        ratio(self.traps_served, self.pairs)
    }
}

fn ratio(part: usize, whole: usize) -> Option<f64> {
    (whole > 0).then(|| part as f64 / whole as f64)
}

/// Tallies by a grouping key (category or source file).
pub fn tally_by<'a, T: 'a>(
    items: impl IntoIterator<Item = &'a T>,
    key: impl Fn(&T) -> String,
    observed: impl Fn(&T) -> Option<Observed>,
) -> BTreeMap<String, Tally> {
    let mut groups: BTreeMap<String, Tally> = BTreeMap::new();
    for item in items {
        let tally = groups.entry(key(item)).or_default();
        match observed(item) {
            Some(o) => tally.add(o),
            None => tally.errors += 1,
        }
    }
    groups
}

/// The figures at one threshold.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    pub threshold: f64,
    pub hit_share: Option<f64>,
    pub trap_share: Option<f64>,
    pub error_rate: Option<f64>,
}

/// Re-judges every pair at `threshold`.
pub fn at(scored: &[Scored], threshold: f64) -> Point {
    let mut tally = Tally::default();
    for s in scored {
        tally.add(Observed {
            same_answer: s.same_answer,
            served: s.served_at(threshold),
            ..Observed::default()
        });
    }
    Point {
        threshold,
        hit_share: tally.hit_share(),
        trap_share: tally.trap_share(),
        error_rate: tally.error_rate(),
    }
}

/// The figures at each of `thresholds`.
pub fn sweep(scored: &[Scored], thresholds: &[f64]) -> Vec<Point> {
    thresholds.iter().map(|t| at(scored, *t)).collect()
}

/// Every threshold at which something changes: the recorded similarities, ascending. Between two
/// of them the served set is that of the higher one.
pub fn candidates(scored: &[Scored]) -> Vec<f64> {
    let mut values: Vec<f64> = scored
        .iter()
        .filter_map(|s| s.similarity)
        .filter(|v| v.is_finite())
        .collect();
    values.sort_by(f64::total_cmp);
    values.dedup();
    values
}

/// The best threshold under a wrong-answer budget.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Best {
    /// Largest share of traps served allowed.
    pub max_wrong: f64,
    /// The threshold: the highest one with that hit share, which serves the fewest traps.
    pub threshold: f64,
    pub hit_share: f64,
    pub trap_share: f64,
}

/// The threshold serving the largest share of should-hit pairs while at most `max_wrong` of the
/// traps are served; among thresholds with that share, the highest. `None` when no recorded
/// similarity keeps the traps within the budget, or there are no should-hit pairs or no traps.
pub fn best_within(scored: &[Scored], max_wrong: f64) -> Option<Best> {
    let mut best: Option<Best> = None;
    // Descending: raising the threshold never serves more, so the first threshold over the budget
    // ends the search, and the first threshold reaching a hit share is the highest with it.
    for t in candidates(scored).into_iter().rev() {
        let point = at(scored, t);
        let (Some(hit), Some(wrong)) = (point.hit_share, point.trap_share) else {
            return None;
        };
        if wrong > max_wrong {
            break;
        }
        if best.is_none_or(|b| hit > b.hit_share) {
            best = Some(Best {
                max_wrong,
                threshold: t,
                hit_share: hit,
                trap_share: wrong,
            });
        }
    }
    best
}

/// Thresholds for the curve: a fine grid from `low` to 1.0, plus every recorded similarity in that
/// range so each step of the curve is drawn where it happens.
pub fn curve_thresholds(scored: &[Scored], low: f64) -> Vec<f64> {
    const STEPS: usize = 400;
    let mut ts: Vec<f64> = (0..=STEPS)
        .map(|i| low + (1.0 - low) * i as f64 / STEPS as f64)
        .collect();
    ts.extend(
        candidates(scored)
            .into_iter()
            .filter(|v| (low..=1.0).contains(v)),
    );
    ts.sort_by(f64::total_cmp);
    ts.dedup();
    ts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(similarity: f64) -> Scored {
        Scored {
            same_answer: true,
            exact: false,
            similarity: Some(similarity),
            guarded: false,
        }
    }
    fn trap(similarity: f64) -> Scored {
        Scored {
            same_answer: false,
            exact: false,
            similarity: Some(similarity),
            guarded: false,
        }
    }

    const HITS: [f64; 10] = [0.80, 0.82, 0.84, 0.86, 0.88, 0.90, 0.92, 0.94, 0.96, 0.98];

    /// 10 should-hit pairs at 0.80..0.98, and traps at chosen similarities.
    fn hand_made(traps: &[f64]) -> Vec<Scored> {
        let mut v: Vec<Scored> = HITS.iter().map(|s| hit(*s)).collect();
        v.extend(traps.iter().map(|t| trap(*t)));
        v
    }

    #[test]
    fn served_at_compares_similarity_and_exact_always_serves() {
        assert!(hit(0.9).served_at(0.9));
        assert!(!hit(0.8999).served_at(0.9));
        let exact = Scored {
            same_answer: true,
            exact: true,
            similarity: Some(1.0),
            guarded: false,
        };
        assert!(exact.served_at(1.5));
        let none = Scored {
            same_answer: true,
            exact: false,
            similarity: None,
            guarded: false,
        };
        assert!(!none.served_at(-1.0));
    }

    #[test]
    fn sweep_counts_shares_at_each_threshold() {
        // 100 traps: one at 0.95, four at 0.91, the rest low.
        let mut traps = vec![0.95, 0.91, 0.91, 0.91, 0.91];
        traps.extend(std::iter::repeat_n(0.5, 95));
        let scored = hand_made(&traps);
        let p = at(&scored, 0.9);
        // Hits at 0.90, 0.92, ..., 0.98.
        assert_eq!(p.hit_share, Some(0.5));
        assert_eq!(p.trap_share, Some(0.05));
        assert_eq!(p.error_rate, Some(5.0 / 110.0));
        let points = sweep(&scored, &[0.0, 0.96, 2.0]);
        assert_eq!(points[0].hit_share, Some(1.0));
        assert_eq!(points[0].trap_share, Some(1.0));
        assert_eq!(points[1].hit_share, Some(0.2));
        assert_eq!(points[1].trap_share, Some(0.0));
        assert_eq!(points[2].hit_share, Some(0.0));
    }

    #[test]
    fn best_thresholds_under_one_and_five_percent() {
        // 100 traps: one at 0.95, four at 0.91, 95 at 0.5.
        let mut traps = vec![0.95, 0.91, 0.91, 0.91, 0.91];
        traps.extend(std::iter::repeat_n(0.5, 95));
        let scored = hand_made(&traps);

        // ≤ 1%: only the trap at 0.95 may pass, the ones at 0.91 may not. The highest threshold
        // serving the hits above 0.91 is the lowest hit similarity above 0.91 (0.92).
        let one = best_within(&scored, 0.01).expect("a best threshold");
        assert_eq!(one.threshold, 0.92);
        assert_eq!(one.hit_share, 0.4);
        assert_eq!(one.trap_share, 0.01);

        // ≤ 5%: all five high traps may pass, the 95 at 0.5 may not: every hit from 0.80 up.
        let five = best_within(&scored, 0.05).expect("a best threshold");
        assert_eq!(five.threshold, 0.80);
        assert_eq!(five.hit_share, 1.0);
        assert_eq!(five.trap_share, 0.05);

        // A zero budget: above the highest trap, 0.96 and 0.98 remain.
        let zero = best_within(&scored, 0.0).expect("a best threshold");
        assert_eq!(zero.threshold, 0.96);
        assert_eq!(zero.hit_share, 0.2);
        assert_eq!(zero.trap_share, 0.0);
    }

    #[test]
    fn ties_in_hit_share_pick_the_highest_threshold() {
        // Hits at 0.9 and 0.95, traps at 0.3 and 0.92, half the traps allowed. Every threshold
        // above 0.3 up to 0.9 serves both hits and one trap: the highest of them is 0.9.
        let scored = vec![hit(0.9), hit(0.95), trap(0.3), trap(0.92)];
        let best = best_within(&scored, 0.5).expect("a best threshold");
        assert_eq!(best.hit_share, 1.0);
        assert_eq!(best.threshold, 0.9);
        assert_eq!(best.trap_share, 0.5);
    }

    #[test]
    fn no_best_when_the_budget_cannot_be_met() {
        // An exact-served trap is served at every threshold.
        let scored = vec![
            hit(0.95),
            Scored {
                same_answer: false,
                exact: true,
                similarity: Some(1.0),
                guarded: false,
            },
        ];
        assert_eq!(best_within(&scored, 0.01), None);
        // Without traps there is no wrong-answer share to budget.
        assert_eq!(best_within(&[hit(0.9)], 0.01), None);
    }

    #[test]
    fn pairs_without_candidates_are_never_served() {
        let mut scored = hand_made(&[0.2]);
        scored.push(Scored {
            same_answer: true,
            exact: false,
            similarity: None,
            guarded: false,
        });
        assert_eq!(at(&scored, 0.0).hit_share, Some(10.0 / 11.0));
        assert_eq!(candidates(&scored).len(), 11);
    }

    fn seen(same_answer: bool, served: bool, no_candidate: bool) -> Observed {
        Observed {
            same_answer,
            served,
            no_candidate,
            guarded: false,
        }
    }

    #[test]
    fn tallies_per_category_and_errors_apart() {
        struct R {
            cat: &'static str,
            outcome: Option<Observed>,
        }
        let rows = [
            R {
                cat: "paraphrase",
                outcome: Some(seen(true, true, false)),
            },
            R {
                cat: "paraphrase",
                outcome: Some(seen(true, false, false)),
            },
            R {
                cat: "paraphrase",
                outcome: None,
            },
            R {
                cat: "negation",
                outcome: Some(seen(false, true, false)),
            },
            R {
                cat: "negation",
                outcome: Some(seen(false, false, true)),
            },
            R {
                cat: "negation",
                outcome: Some(seen(false, false, false)),
            },
            R {
                cat: "negation",
                outcome: Some(Observed {
                    guarded: true,
                    ..seen(false, false, false)
                }),
            },
        ];
        let groups = tally_by(&rows, |r| r.cat.to_owned(), |r| r.outcome);
        assert_eq!(groups["negation"].guarded, 1);
        let para = &groups["paraphrase"];
        assert_eq!((para.pairs, para.errors), (2, 1));
        assert_eq!(para.hit_share(), Some(0.5));
        assert_eq!(para.trap_share(), None);
        assert_eq!(para.error_rate(), Some(0.0));
        let neg = &groups["negation"];
        assert_eq!(neg.hit_share(), None);
        assert_eq!(neg.trap_share(), Some(0.25));
        assert_eq!(neg.error_rate(), Some(0.25));
        assert_eq!(neg.no_candidate, 1);
    }

    #[test]
    fn curve_thresholds_cover_the_range_and_every_step() {
        let scored = vec![hit(0.9123), trap(0.4), hit(1.0)];
        let ts = curve_thresholds(&scored, 0.5);
        assert_eq!(ts.first(), Some(&0.5));
        assert_eq!(ts.last(), Some(&1.0));
        assert!(ts.contains(&0.9123));
        assert!(!ts.contains(&0.4));
        assert!(ts.windows(2).all(|w| w[0] < w[1]));
    }
}
