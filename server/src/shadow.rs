//! Shadow mode: semantic matching that decides but does not serve. A request in shadow mode
//! (`x-reprise-cache-mode: shadow`, `cache_mode = "shadow"`, or its namespace's mode) goes upstream
//! like a miss; this module records what `on` would have served it, with the similarity, the
//! threshold and every guard's verdict, so an operator can judge semantic matching on real traffic
//! before turning it on. It never decides what is served.
//!
//! Decisions live in a sled tree of the feedback database ([`crate::feedback`]), bounded in count,
//! so they survive restarts; sled's page cache keeps the newest in memory.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::entry::Entry;
use crate::guard::{Guards, Literals};

/// How many decisions are kept; the oldest go first.
pub(crate) const MAX_DECISIONS: usize = 10_000;

/// What `on` would have done with the nearest candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum Would {
    /// Similar enough and every running guard lets it through: a semantic hit.
    #[serde(rename = "would-hit")]
    Hit,
    /// Similar enough, but a running guard refuses it.
    #[serde(rename = "would-refuse")]
    Refuse,
    /// Below the threshold: a miss, whatever the guards say.
    #[serde(rename = "would-miss")]
    Miss,
}

impl Would {
    pub fn name(self) -> &'static str {
        match self {
            Would::Hit => "would-hit",
            Would::Refuse => "would-refuse",
            Would::Miss => "would-miss",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Would::Hit, Would::Refuse, Would::Miss]
            .into_iter()
            .find(|w| w.name() == s || w.name().trim_start_matches("would-") == s)
    }
}

/// One guard's verdict on the candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GuardVerdict {
    pub guard: String,
    /// Whether the gateway runs this guard now (`semantic_guards`); a guard that does not run
    /// is judged anyway, to show what turning it on would change.
    pub enabled: bool,
    pub refuses: bool,
}

/// What a shadowed request would have been served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ShadowDecision {
    /// Increasing; the cursor of `GET /admin/shadow`.
    pub id: u64,
    pub at_ms: u64,
    /// The request's `x-reprise-request-id`, for `POST /admin/feedback`.
    pub request_id: String,
    pub namespace: Option<String>,
    pub model: String,
    pub prompt: String,
    pub would: Would,
    /// The nearest live entry of the request's partition.
    pub entry: String,
    pub entry_prompt: String,
    pub similarity: f32,
    pub threshold: f32,
    /// Every guard, in the order the gateway checks them, then `feedback` when a veto or the
    /// entry's own threshold refuses the candidate.
    pub guards: Vec<GuardVerdict>,
    /// With `verify = judge`: the judge's verdict on the pair (`same`, `different`, `unsure…`),
    /// asked in the background; `queued` until it lands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    /// On a `would-hit`: the tokens (and money) serving the candidate would have saved, its
    /// entry's stored usage as a hit would count it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_save: Option<reprise_wire::TokensSaved>,
}

impl ShadowDecision {
    /// Judges `candidate` for `prompt` as the semantic stage would, with every guard's verdict.
    pub fn judge(
        prompt: &str,
        candidate: &Entry,
        similarity: f32,
        threshold: f32,
        guards: Guards,
    ) -> (Would, Vec<GuardVerdict>) {
        let verdicts: Vec<GuardVerdict> = guards
            .verdicts(
                &Literals::of(prompt),
                &Literals::of(&candidate.summary.prompt),
            )
            .into_iter()
            .map(|(guard, enabled, refuses)| GuardVerdict {
                guard: guard.name().to_owned(),
                enabled,
                refuses,
            })
            .collect();
        let would = if similarity < threshold {
            Would::Miss
        } else if verdicts.iter().any(|v| v.enabled && v.refuses) {
            Would::Refuse
        } else {
            Would::Hit
        };
        (would, verdicts)
    }

    /// The `x-reprise-shadow` header: `would-hit; similarity=0.9712; entry=e_…`, plus the
    /// refusing guards when there are.
    pub fn header(&self) -> String {
        let mut value = format!(
            "{}; similarity={:.4}; threshold={:.4}; entry={}",
            self.would.name(),
            self.similarity,
            self.threshold,
            self.entry
        );
        let refusing: Vec<&str> = self
            .guards
            .iter()
            .filter(|g| g.enabled && g.refuses)
            .map(|g| g.guard.as_str())
            .collect();
        if !refusing.is_empty() {
            value.push_str(&format!("; guard={}", refusing.join(",")));
        }
        if let Some(verdict) = &self.verdict {
            // `queued` on the response itself: the verdict lands in `GET /admin/shadow`.
            value.push_str(&format!("; verify={verdict}"));
        }
        value
    }
}

/// The persisted, bounded log of shadow decisions.
pub struct ShadowLog {
    /// Hands out the ids: unique and increasing across concurrent requests and restarts.
    db: sled::Db,
    tree: sled::Tree,
    /// How many decisions are kept ([`MAX_DECISIONS`] in service).
    max: usize,
}

/// A page of `GET /admin/shadow`: filters and a cursor, newest first.
#[derive(Debug, Default, Clone)]
pub struct ShadowFilter {
    pub namespace: Option<String>,
    pub would: Option<Would>,
    /// Only decisions older than this id (the previous page's `next`).
    pub before: Option<u64>,
    pub limit: usize,
}

impl ShadowLog {
    pub fn new(db: sled::Db, tree: sled::Tree, max: usize) -> Self {
        Self { db, tree, max }
    }

    /// Appends a decision (its `id` is assigned here) and drops the oldest beyond the bound.
    pub fn record(&self, mut decision: ShadowDecision) -> Result<ShadowDecision, sled::Error> {
        // sled's ids start at 0; 0 never names a decision.
        let next = self.db.generate_id()? + 1;
        decision.id = next;
        let bytes = serde_json::to_vec(&decision).unwrap_or_default();
        self.tree.insert(next.to_be_bytes(), bytes)?;
        while self.tree.len() > self.max {
            if self.tree.pop_min()?.is_none() {
                break;
            }
        }
        Ok(decision)
    }

    /// Writes the judge's verdict into decision `id`, if it is still kept.
    pub fn set_verdict(&self, id: u64, verdict: String) {
        let updated = self.tree.fetch_and_update(id.to_be_bytes(), |old| {
            let mut decision: ShadowDecision = serde_json::from_slice(old?).ok()?;
            decision.verdict = Some(verdict.clone());
            serde_json::to_vec(&decision).ok()
        });
        if let Err(err) = updated {
            tracing::warn!(error = %err, "recording a shadow verdict failed");
        }
    }

    /// Newest first, filtered; the second value is the cursor for the next page, if any.
    pub fn list(&self, filter: &ShadowFilter) -> (Vec<ShadowDecision>, Option<u64>) {
        let end = filter.before.unwrap_or(u64::MAX);
        let mut page = Vec::new();
        let mut more = None;
        for item in self.tree.range(..end.to_be_bytes()).rev() {
            let Ok((_, value)) = item else { continue };
            let Ok(decision) = serde_json::from_slice::<ShadowDecision>(&value) else {
                continue;
            };
            let keep = filter
                .namespace
                .as_ref()
                .is_none_or(|n| decision.namespace.as_ref() == Some(n))
                && filter.would.is_none_or(|w| decision.would == w);
            if !keep {
                continue;
            }
            if page.len() == filter.limit {
                more = page.last().map(|d: &ShadowDecision| d.id);
                break;
            }
            page.push(decision);
        }
        (page, more)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(namespace: &str, would: Would) -> ShadowDecision {
        ShadowDecision {
            id: 0,
            at_ms: 1,
            request_id: "req_1".into(),
            namespace: Some(namespace.into()),
            model: "m".into(),
            prompt: "p".into(),
            would,
            entry: "e_000000000001".into(),
            entry_prompt: "q".into(),
            similarity: 0.95,
            threshold: 0.9,
            guards: Vec::new(),
            verdict: None,
            would_save: None,
        }
    }

    #[test]
    fn the_log_is_bounded_newest_first_filtered_and_paged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::Config::new().path(dir.path()).open().expect("db");
        let log = ShadowLog::new(db.clone(), db.open_tree("shadow").expect("tree"), 3);
        let ids: Vec<u64> = [
            ("a", Would::Hit),
            ("a", Would::Refuse),
            ("b", Would::Hit),
            ("a", Would::Hit),
        ]
        .into_iter()
        .map(|(ns, w)| log.record(decision(ns, w)).expect("record").id)
        .collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
        let all = ShadowFilter {
            limit: 10,
            ..ShadowFilter::default()
        };
        let (page, more) = log.list(&all);
        // The oldest went first.
        assert_eq!(
            page.iter().map(|d| d.id).collect::<Vec<_>>(),
            vec![ids[3], ids[2], ids[1]]
        );
        assert_eq!(more, None);
        let hits_in_a = ShadowFilter {
            namespace: Some("a".into()),
            would: Some(Would::Hit),
            limit: 10,
            before: None,
        };
        assert_eq!(log.list(&hits_in_a).0.len(), 1);
        let (first, more) = log.list(&ShadowFilter {
            limit: 2,
            ..all.clone()
        });
        assert_eq!(first.len(), 2);
        let (rest, none) = log.list(&ShadowFilter {
            before: more,
            ..all
        });
        assert_eq!(rest.iter().map(|d| d.id).collect::<Vec<_>>(), vec![ids[1]]);
        assert_eq!(none, None);
        assert_eq!(Would::parse("refuse"), Some(Would::Refuse));
        assert_eq!(Would::parse("would-miss"), Some(Would::Miss));
        assert_eq!(Would::parse("maybe"), None);
    }
}
