//! What a gateway's verify stage (`--verify judge`) did in an evaluation, read from the lookup of
//! `b`: `x-reprise-verified` (`judge` or `budget`: how a served semantic hit was vetted),
//! `x-reprise-verify` (the judge's verdict on this request, or `queued`/`dropped` in async mode;
//! `unsure; reason=R` says why, and some reasons mean the judge was never asked) and the judge's
//! time in `Server-Timing` (`judge;dur=<ms>`). Figures only, no HTTP; a run without
//! any of these headers has no verify figures and its report is unchanged.

use serde::Serialize;

use super::PairResult;
use crate::bench::percentile;

/// Verdicts that mean the judge was asked on this very request.
pub const VERDICTS: [&str; 3] = ["same", "different", "unsure"];

/// `unsure` reasons of a judge that was not asked: the rate budget was spent, a prompt too long to
/// show whole, no judge model or credential.
pub const NOT_ASKED: [&str; 3] = ["over_budget", "too_long", "not_configured"];

/// The first token of a header value (`same; …` reads `same`), lower-cased; `None` when empty.
pub fn token(value: Option<&str>) -> Option<String> {
    let first = value?.split(';').next()?.trim().to_ascii_lowercase();
    (!first.is_empty()).then_some(first)
}

/// The `reason=` parameter of a header value (`unsure; reason=timeout` reads `timeout`).
pub fn reason(value: Option<&str>) -> Option<String> {
    value?
        .split(';')
        .skip(1)
        .find_map(|p| p.trim().strip_prefix("reason="))
        .map(|r| r.trim().to_ascii_lowercase())
        .filter(|r| !r.is_empty())
}

/// The `dur` of entry `name` in `Server-Timing` values (several headers or one comma list).
pub fn server_timing_ms<'a>(values: impl IntoIterator<Item = &'a str>, name: &str) -> Option<f64> {
    values
        .into_iter()
        .flat_map(|v| v.split(','))
        .find_map(|entry| {
            let mut parts = entry.split(';').map(str::trim);
            if parts.next()? != name {
                return None;
            }
            parts
                .filter_map(|p| p.strip_prefix("dur="))
                .find_map(|d| d.trim_matches('"').parse::<f64>().ok())
        })
}

/// Whether a pair's lookup shows any sign of the verify stage.
pub fn active(r: &PairResult) -> bool {
    r.verified.is_some() || r.verify.is_some() || r.judge_ms.is_some()
}

/// Whether the judge was asked (sync) for this pair's lookup.
pub fn judged(r: &PairResult) -> bool {
    r.verify.as_deref().is_some_and(|v| VERDICTS.contains(&v))
        && !r
            .verify_reason
            .as_deref()
            .is_some_and(|why| NOT_ASKED.contains(&why))
}

/// p50 and p99 of a set of milliseconds, with how many there were.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Spread {
    pub n: usize,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

impl Spread {
    fn of(samples: &[f64]) -> Self {
        Self {
            n: samples.len(),
            p50_ms: percentile(samples, 0.50),
            p99_ms: percentile(samples, 0.99),
        }
    }
}

/// The verify figures of one group of pairs (overall, a category).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct VerifyTally {
    /// Pairs whose lookup of `b` was measured.
    pub lookups: usize,
    /// Lookups on which the judge gave a verdict (`x-reprise-verify: same|different|unsure`).
    pub judge_calls: usize,
    pub same: usize,
    pub different: usize,
    /// `unsure` from a judge that was asked (it said so, timed out, failed, answered nonsense).
    pub unsure: usize,
    /// `unsure` without a judge call (rate budget spent, prompt too long, not configured).
    pub not_asked: usize,
    /// Async mode: pairs queued for the judge, and dropped by a full queue.
    pub queued: usize,
    pub dropped: usize,
    /// Served semantic hits vetted by the judge on this request (`x-reprise-verified: judge`).
    pub verified_by_judge: usize,
    /// Served semantic hits the entry's error budget let through unjudged (`budget`).
    pub verified_by_budget: usize,
    /// The judge's own time (`Server-Timing: judge`) on the lookups it was asked.
    pub judge: Spread,
    /// Time to the response head of a hit the judge was asked about, and vetted, on this request.
    pub verified_hit_ttft: Spread,
    /// Time to the response head of a semantic hit served without a judge call.
    pub unverified_hit_ttft: Spread,
}

impl VerifyTally {
    /// Judge calls over measured lookups; `None` without lookups.
    pub fn calls_per_lookup(&self) -> Option<f64> {
        (self.lookups > 0).then(|| self.judge_calls as f64 / self.lookups as f64)
    }

    /// Served hits with any `x-reprise-verified`.
    pub fn verified_hits(&self) -> usize {
        self.verified_by_judge + self.verified_by_budget
    }
}

/// Tallies the measured pairs among `results`.
pub fn tally<'a>(results: impl IntoIterator<Item = &'a PairResult>) -> VerifyTally {
    let mut t = VerifyTally::default();
    let (mut judge, mut verified, mut unverified) = (Vec::new(), Vec::new(), Vec::new());
    for r in results.into_iter().filter(|r| r.measured()) {
        t.lookups += 1;
        match r.verify.as_deref() {
            Some("same") => t.same += 1,
            Some("different") => t.different += 1,
            Some("unsure") if judged(r) => t.unsure += 1,
            Some("unsure") => t.not_asked += 1,
            Some("queued") => t.queued += 1,
            Some("dropped") => t.dropped += 1,
            _ => {}
        }
        if judged(r) {
            t.judge_calls += 1;
            judge.extend(r.judge_ms);
        }
        if r.served && r.outcome == "semantic-hit" {
            let by_judge = r.verified.as_deref() == Some("judge");
            match r.verified.as_deref() {
                Some("judge") => t.verified_by_judge += 1,
                Some("budget") => t.verified_by_budget += 1,
                _ => {}
            }
            // A hit verified by an earlier verdict (an approved alias) waited for no judge.
            if let Some(ms) = r.ttft_ms {
                if by_judge && judged(r) {
                    verified.push(ms);
                } else if !judged(r) {
                    unverified.push(ms);
                }
            }
        }
    }
    t.judge = Spread::of(&judge);
    t.verified_hit_ttft = Spread::of(&verified);
    t.unverified_hit_ttft = Spread::of(&unverified);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_read_their_first_token() {
        assert_eq!(token(Some("same")).as_deref(), Some("same"));
        assert_eq!(token(Some(" Judge ; ms=3")).as_deref(), Some("judge"));
        assert_eq!(token(Some("  ")), None);
        assert_eq!(token(None), None);
    }

    #[test]
    fn reasons_tell_a_judge_not_asked_from_one_that_was() {
        assert_eq!(
            reason(Some("unsure; reason=over_budget")).as_deref(),
            Some("over_budget")
        );
        assert_eq!(reason(Some("unsure")), None);
        assert_eq!(reason(Some("same")), None);
        let lookup = |verify: &str| PairResult {
            verify: token(Some(verify)),
            verify_reason: reason(Some(verify)),
            ..crate::eval::tests::pair_result()
        };
        assert!(judged(&lookup("unsure; reason=timeout")));
        assert!(judged(&lookup("unsure")));
        assert!(judged(&lookup("different")));
        assert!(!judged(&lookup("unsure; reason=over_budget")));
        assert!(!judged(&lookup("unsure; reason=too_long")));
        assert!(!judged(&lookup("queued")));
        let t = tally([
            &lookup("unsure; reason=not_configured"),
            &lookup("unsure; reason=failed"),
        ]);
        assert_eq!((t.unsure, t.not_asked, t.judge_calls), (1, 1, 1));
    }

    #[test]
    fn server_timing_finds_the_judge_entry() {
        let one = "lookup;dur=0.4, embed;dur=3.1, judge;dur=152.7;desc=\"verify\", total;dur=160";
        assert_eq!(server_timing_ms([one], "judge"), Some(152.7));
        assert_eq!(
            server_timing_ms(["ingress;dur=0.1", "judge;dur=\"12\""], "judge"),
            Some(12.0)
        );
        assert_eq!(server_timing_ms([one], "upstream_send"), None);
        // A `judge` entry without a duration says nothing of its time.
        assert_eq!(
            server_timing_ms(["judge", "judge_queue;dur=3"], "judge"),
            None
        );
    }
}
