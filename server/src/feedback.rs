//! Feedback: what operators teach the gateway about its semantic matches, and what it remembers of
//! them (`POST /admin/feedback`, `reprise-client feedback`).
//!
//! A verdict names a request by its `x-reprise-request-id`:
//! - `wrong` on a semantic hit (or a shadow decision) vetoes that pair for good: the entry is never
//!   served again for that prompt, through a search or an alias, and the entry's own threshold rises
//!   above the wrong match's similarity, so its nearest paraphrases need to be closer still;
//! - `right` on a shadow decision or a near miss (a miss with a candidate) makes the prompt an
//!   approved alias of the entry: the next identical
//!   prompt in the same partition is served that entry, whatever the threshold and guards say (the
//!   operator has read both prompts);
//! - a verdict on an exact hit is refused (400): an exact hit is the same prompt, nothing to learn.
//!
//! Vetoes, entry thresholds, approvals, verdicts and shadow decisions are kept in their own sled
//! database in the data dir (`feedback/`), so they survive restarts; what a request was served is
//! kept in memory for the most recent requests only. This module decides nothing about serving by
//! itself: the lookup asks [`Feedback::allows`] and [`approved_hit`].

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::entry::EntryId;
use crate::error::GatewayError;
use crate::key::PartitionKey;
use crate::shadow::ShadowLog;
use crate::timing::unix_ms;
use crate::verify::budget::{Observations, Source};

/// How many recent requests can still receive feedback.
const REMEMBERED_REQUESTS: usize = 10_000;

/// How many verdicts are listed at most; vetoes and approvals are kept whatever this says.
const MAX_VERDICTS: usize = 100_000;

/// How far above a wrong match's similarity the entry's threshold goes: the next float would be
/// enough to refuse the same match, this also refuses what is barely closer.
const THRESHOLD_STEP: f32 = 0.0001;

/// `right` or `wrong`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Right,
    Wrong,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Right => "right",
            Verdict::Wrong => "wrong",
        }
    }
}

/// How a request met an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Met {
    /// Served as an exact hit: the same prompt.
    Hit,
    /// Served as a semantic hit (search, alias or approval).
    SemanticHit,
    /// Shadow mode: the entry it would have been judged against, not served.
    Shadow,
    /// A miss whose nearest candidate was this entry (below the threshold, or refused).
    NearMiss,
}

/// How many characters of a prompt feedback keeps for display; the prompt itself is keyed by hash.
pub(crate) const PREVIEW_CHARS: usize = 500;

/// A prompt as feedback keys it: the blake3 hash of its words, lowercased and single-spaced, so
/// case and spacing do not make another question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptKey([u8; 32]);

impl PromptKey {
    pub fn of(prompt: &str) -> Self {
        let mut hasher = blake3::Hasher::new();
        for (i, word) in prompt.split_whitespace().enumerate() {
            if i > 0 {
                hasher.update(b" ");
            }
            hasher.update(word.to_lowercase().as_bytes());
        }
        Self(*hasher.finalize().as_bytes())
    }
}

/// The first [`PREVIEW_CHARS`] characters of `text`.
pub(crate) fn preview(text: &str) -> String {
    match text.char_indices().nth(PREVIEW_CHARS) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// What feedback on a request needs to know: the entry and the prompt it was matched with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Encounter {
    pub met: Met,
    pub entry: EntryId,
    pub partition: PartitionKey,
    pub prompt: PromptKey,
    /// The prompt's head, for the verdict list.
    pub preview: String,
    pub similarity: Option<f32>,
    /// The request's namespace: where the verdict counts towards the error budget.
    #[serde(default)]
    pub namespace: Option<String>,
}

/// `POST /admin/feedback`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FeedbackRequest {
    /// The `x-reprise-request-id` of the judged response.
    pub request_id: String,
    pub verdict: Verdict,
}

/// A stored verdict (`POST` answers it, `GET /admin/feedback` lists them).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VerdictRecord {
    /// Increasing; the cursor of `GET /admin/feedback`.
    pub id: u64,
    pub at_ms: u64,
    pub request_id: String,
    pub verdict: Verdict,
    pub met: Met,
    pub entry: String,
    pub prompt: String,
    pub similarity: Option<f32>,
    /// What the verdict changed: `vetoed; entry threshold 0.9731`, `approved alias`, or
    /// `recorded`.
    pub effect: String,
}

/// Verdicts received, by kind (`/admin/stats`, `reprise_feedback_total`).
#[derive(Debug, Default, Clone, Serialize, ToSchema)]
pub struct FeedbackCounts {
    pub right: u64,
    pub wrong: u64,
    /// Pairs vetoed for good.
    pub vetoes: u64,
    /// Prompts approved as aliases of an entry.
    pub approvals: u64,
}

/// A verdict as replicas share it on the change feed: what it applies to and its record, so every
/// replica vetoes or approves the same pair, whichever one received it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SharedVerdict {
    /// The replica that received it, and its record id there: applied once per replica.
    pub origin: String,
    pub encounter: Encounter,
    pub record: VerdictRecord,
}

/// Where a replica sharing a store sends what its requests met (so that a verdict sent to another
/// replica finds it), and asks for what another replica's requests met.
pub trait Shared: Send + Sync {
    /// Off the request path: may drop under load.
    fn remember(&self, request_id: &str, encounter: &Encounter);
    fn recall(&self, request_id: &str) -> Option<Encounter>;
}

/// An approval, stored under (partition, prompt).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Approval {
    entry: u64,
    similarity: f32,
    /// Who approved: an operator, or the judge (then the hit says `x-reprise-verified: judge`).
    #[serde(default = "operator")]
    source: Source,
}

fn operator() -> Source {
    Source::Operator
}

/// The feedback database and the recent requests it can judge.
pub struct Feedback {
    db: sled::Db,
    verdicts: sled::Tree,
    /// (entry id, prompt hash) → the vetoed similarity.
    vetoes: sled::Tree,
    /// entry id → the entry's own threshold.
    floors: sled::Tree,
    /// (partition, prompt hash) → [`Approval`].
    approvals: sled::Tree,
    /// `origin/record id` of the shared verdicts already applied here.
    applied: sled::Tree,
    pub shadow: ShadowLog,
    /// Every verdict as a (similarity, right or wrong) observation, for the error budget.
    pub observations: Observations,
    shared: std::sync::OnceLock<Box<dyn Shared>>,
    recent: Mutex<Recent>,
    right: AtomicU64,
    wrong: AtomicU64,
}

#[derive(Default)]
struct Recent {
    map: HashMap<String, Encounter>,
    order: VecDeque<String>,
}

fn veto_key(entry: EntryId, prompt: &PromptKey) -> Vec<u8> {
    let mut key = entry.0.to_be_bytes().to_vec();
    key.extend_from_slice(&prompt.0);
    key
}

fn approval_key(partition: &PartitionKey, prompt: &PromptKey) -> Vec<u8> {
    let mut key = partition.0.to_vec();
    key.extend_from_slice(&prompt.0);
    key
}

fn internal(err: sled::Error) -> GatewayError {
    GatewayError::Internal {
        detail: format!("feedback store: {err}"),
    }
}

impl Feedback {
    /// Opens (creating) `dir`; waits briefly for a previous gateway in this process to let go.
    pub fn open(dir: &Path) -> Result<Self, sled::Error> {
        let db = crate::store::open_waiting(sled::Config::new().path(dir))?;
        Self::on(db)
    }

    /// A feedback store that lives only until the process exits: for when the data dir's cannot
    /// be opened (full or failing disk, damaged files), so that the gateway still answers.
    pub fn temporary() -> Result<Self, sled::Error> {
        Self::on(sled::Config::new().temporary(true).open()?)
    }

    fn on(db: sled::Db) -> Result<Self, sled::Error> {
        let verdicts = db.open_tree("verdicts")?;
        let (mut right, mut wrong) = (0, 0);
        for (_, value) in verdicts.iter().flatten() {
            match serde_json::from_slice::<VerdictRecord>(&value).map(|v| v.verdict) {
                Ok(Verdict::Right) => right += 1,
                Ok(Verdict::Wrong) => wrong += 1,
                Err(_) => {}
            }
        }
        Ok(Self {
            vetoes: db.open_tree("vetoes")?,
            floors: db.open_tree("entry_thresholds")?,
            approvals: db.open_tree("approvals")?,
            applied: db.open_tree("shared_applied")?,
            observations: Observations::open(&db)?,
            shared: std::sync::OnceLock::new(),
            shadow: ShadowLog::new(
                db.clone(),
                db.open_tree("shadow")?,
                crate::shadow::MAX_DECISIONS,
            ),
            verdicts,
            db,
            recent: Mutex::new(Recent::default()),
            right: AtomicU64::new(right),
            wrong: AtomicU64::new(wrong),
        })
    }

    /// Shares what requests meet with the other replicas (a shared store only; set once).
    pub fn share(&self, shared: Box<dyn Shared>) {
        let _ = self.shared.set(shared);
    }

    /// Remembers what request `request_id` met, so feedback on it can act.
    pub fn note(&self, request_id: &str, encounter: Encounter) {
        // An exact hit has nothing to judge: no replica needs to know it.
        if let (Some(shared), false) = (self.shared.get(), encounter.met == Met::Hit) {
            shared.remember(request_id, &encounter);
        }
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if recent
            .map
            .insert(request_id.to_owned(), encounter)
            .is_none()
        {
            recent.order.push_back(request_id.to_owned());
        }
        while recent.map.len() > REMEMBERED_REQUESTS {
            let Some(oldest) = recent.order.pop_front() else {
                break;
            };
            recent.map.remove(&oldest);
        }
    }

    /// Whether `entry` may be served to `prompt` at `similarity`: the pair is not vetoed and the
    /// similarity clears the entry's own threshold. Fails open on a read error (logged), like the
    /// rest of the lookup, except that it never fails towards serving a vetoed pair it could read.
    pub fn allows(&self, entry: EntryId, prompt: &PromptKey, similarity: f32) -> bool {
        // Most gateways never receive a `wrong`: skip the hashing then.
        if self.floors.is_empty() && self.vetoes.is_empty() {
            return true;
        }
        match self.vetoes.contains_key(veto_key(entry, prompt)) {
            Ok(true) => return false,
            Ok(false) => {}
            Err(err) => tracing::warn!(error = %err, "reading feedback vetoes failed"),
        }
        match self.floors.get(entry.0.to_be_bytes()) {
            Ok(Some(bytes)) => similarity >= decode_f32(&bytes),
            Ok(None) => true,
            Err(err) => {
                tracing::warn!(error = %err, "reading entry thresholds failed");
                true
            }
        }
    }

    /// The entry's own floor, when an operator's `wrong` raised it.
    pub fn entry_threshold(&self, entry: EntryId) -> Option<f32> {
        let bytes = self.floors.get(entry.0.to_be_bytes()).ok()??;
        Some(decode_f32(&bytes))
    }

    /// The approval an operator (or the judge) gave this prompt in this partition.
    fn approval(&self, partition: &PartitionKey, prompt: &PromptKey) -> Option<Approval> {
        if self.approvals.is_empty() {
            return None;
        }
        let bytes = self.approvals.get(approval_key(partition, prompt)).ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    /// Applies the judge's verdict on a pair: `same` approves the prompt as an alias of the entry
    /// (served next time without a judge call), `different` vetoes the pair for good; either is an
    /// observation of the entry's curve. Unlike an operator's `wrong`, the judge's `different`
    /// does not raise the entry's hard floor: its candidates below are judged, not refused (a judge
    /// that errs would otherwise shut an entry's paraphrases out for good).
    pub fn judged(&self, e: &Encounter, same: bool) {
        let similarity = e.similarity.unwrap_or(1.0);
        let namespace = e.namespace.as_deref().unwrap_or("");
        self.observations
            .add(namespace, e.entry, similarity, !same, Source::Judge);
        let applied = if same {
            self.approve_as(e, Source::Judge).map(drop)
        } else {
            self.veto_pair(e)
        };
        if let Err(err) = applied {
            tracing::warn!(error = %err, "storing the judge's verdict failed");
        }
    }

    /// Applies and stores a verdict on a recent request (of this replica, or of another one sharing
    /// the store); returns its record and what it was about.
    pub fn judge(
        &self,
        request: &FeedbackRequest,
    ) -> Result<(VerdictRecord, Encounter), GatewayError> {
        let local = self
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map
            .get(&request.request_id)
            .cloned();
        let encounter = local
            .or_else(|| self.shared.get()?.recall(&request.request_id))
            .ok_or_else(|| GatewayError::RequestNotFound {
                id: request.request_id.clone(),
            })?;
        if let (Some(similarity), false) = (encounter.similarity, encounter.met == Met::Hit) {
            self.observations.add(
                encounter.namespace.as_deref().unwrap_or(""),
                encounter.entry,
                similarity,
                request.verdict == Verdict::Wrong,
                Source::Operator,
            );
        }
        let effect = match (encounter.met, request.verdict) {
            (Met::Hit, _) => {
                return Err(GatewayError::invalid(
                    format!(
                        "Request {} was an exact hit: the same prompt as the entry's, so there is no match to judge. Feedback applies to semantic hits and shadow decisions.",
                        request.request_id
                    ),
                    Some("request_id"),
                ))
            }
            (_, Verdict::Wrong) => self.veto(&encounter).map_err(internal)?,
            (Met::Shadow | Met::NearMiss, Verdict::Right) => {
                self.approve(&encounter).map_err(internal)?
            }
            // Already served: nothing changes, the verdict is kept for the record and the counts.
            (Met::SemanticHit, Verdict::Right) => "recorded".to_owned(),
        };
        let record = VerdictRecord {
            id: 0,
            at_ms: unix_ms(),
            request_id: request.request_id.clone(),
            verdict: request.verdict,
            met: encounter.met,
            entry: encounter.entry.to_string(),
            prompt: encounter.preview.clone(),
            similarity: encounter.similarity,
            effect,
        };
        let record = self.keep(record)?;
        tracing::info!(
            request_id = %record.request_id,
            verdict = record.verdict.name(),
            entry = %record.entry,
            effect = %record.effect,
            "feedback received"
        );
        Ok((record, encounter))
    }

    /// Applies a verdict another replica received (once: a replica that rebuilds reads them all
    /// again). Exact-hit verdicts are refused where they are received, so none arrive here.
    pub fn apply_shared(&self, shared: &SharedVerdict) -> Result<(), GatewayError> {
        let mark = format!("{}/{}", shared.origin, shared.record.id);
        if self.applied.contains_key(&mark).map_err(internal)? {
            return Ok(());
        }
        let e = &shared.encounter;
        match (e.met, shared.record.verdict) {
            (Met::Hit, _) | (Met::SemanticHit, Verdict::Right) => {}
            (_, Verdict::Wrong) => {
                self.veto(e).map_err(internal)?;
            }
            (Met::Shadow | Met::NearMiss, Verdict::Right) => {
                self.approve(e).map_err(internal)?;
            }
        }
        self.keep(shared.record.clone())?;
        self.applied.insert(mark, &[]).map_err(internal)?;
        self.db.flush().map_err(internal)?;
        Ok(())
    }

    /// Stores `record` under a new local id, counts it, and makes it durable.
    fn keep(&self, mut record: VerdictRecord) -> Result<VerdictRecord, GatewayError> {
        record.id = self.db.generate_id().map_err(internal)? + 1;
        let bytes = serde_json::to_vec(&record).unwrap_or_default();
        self.verdicts
            .insert(record.id.to_be_bytes(), bytes)
            .map_err(internal)?;
        while self.verdicts.len() > MAX_VERDICTS {
            if self.verdicts.pop_min().map_err(internal)?.is_none() {
                break;
            }
        }
        // A verdict is rare and must survive a crash right after it was acknowledged.
        self.db.flush().map_err(internal)?;
        match record.verdict {
            Verdict::Right => self.right.fetch_add(1, Ordering::Relaxed),
            Verdict::Wrong => self.wrong.fetch_add(1, Ordering::Relaxed),
        };
        Ok(record)
    }

    /// Vetoes the pair (and withdraws its approval), without touching the entry's threshold.
    fn veto_pair(&self, e: &Encounter) -> Result<(), sled::Error> {
        let similarity = e.similarity.unwrap_or(1.0);
        self.vetoes
            .insert(veto_key(e.entry, &e.prompt), &similarity.to_be_bytes())?;
        // A wrong approval is withdrawn too.
        let key = approval_key(&e.partition, &e.prompt);
        if let Some(bytes) = self.approvals.get(&key)? {
            if serde_json::from_slice::<Approval>(&bytes).is_ok_and(|a| a.entry == e.entry.0) {
                self.approvals.remove(&key)?;
            }
        }
        Ok(())
    }

    fn veto(&self, e: &Encounter) -> Result<String, sled::Error> {
        let similarity = e.similarity.unwrap_or(1.0);
        self.veto_pair(e)?;
        let raised = (similarity + THRESHOLD_STEP).min(1.0);
        let floor = self
            .floors
            .get(e.entry.0.to_be_bytes())?
            .map_or(raised, |b| decode_f32(&b).max(raised));
        self.floors
            .insert(e.entry.0.to_be_bytes(), &floor.to_be_bytes())?;
        Ok(format!("vetoed; entry threshold {floor:.4}"))
    }

    fn approve(&self, e: &Encounter) -> Result<String, sled::Error> {
        self.approve_as(e, Source::Operator)
    }

    fn approve_as(&self, e: &Encounter, source: Source) -> Result<String, sled::Error> {
        let approval = Approval {
            entry: e.entry.0,
            similarity: e.similarity.unwrap_or(1.0),
            source,
        };
        self.vetoes.remove(veto_key(e.entry, &e.prompt))?;
        self.approvals.insert(
            approval_key(&e.partition, &e.prompt),
            serde_json::to_vec(&approval).unwrap_or_default(),
        )?;
        Ok("approved alias".to_owned())
    }

    /// Newest first, before the cursor `before`; the second value is the next page's cursor.
    pub fn list(&self, before: Option<u64>, limit: usize) -> (Vec<VerdictRecord>, Option<u64>) {
        let end = before.unwrap_or(u64::MAX);
        let mut page: Vec<VerdictRecord> = Vec::new();
        let mut more = None;
        for (_, value) in self.verdicts.range(..end.to_be_bytes()).rev().flatten() {
            let Ok(record) = serde_json::from_slice::<VerdictRecord>(&value) else {
                continue;
            };
            if page.len() == limit {
                more = page.last().map(|r| r.id);
                break;
            }
            page.push(record);
        }
        (page, more)
    }

    pub fn counts(&self) -> FeedbackCounts {
        FeedbackCounts {
            right: self.right.load(Ordering::Relaxed),
            wrong: self.wrong.load(Ordering::Relaxed),
            vetoes: self.vetoes.len() as u64,
            approvals: self.approvals.len() as u64,
        }
    }

    /// `reprise_feedback_total{verdict}`, appended to `/metrics`.
    pub fn render_prometheus(&self) -> String {
        let c = self.counts();
        format!(
            "# HELP reprise_feedback_total Operator verdicts on semantic matches.\n# TYPE reprise_feedback_total counter\nreprise_feedback_total{{verdict=\"right\"}} {}\nreprise_feedback_total{{verdict=\"wrong\"}} {}\n",
            c.right, c.wrong
        )
    }

    /// Writes everything to disk (shutdown).
    pub fn flush(&self) {
        if let Err(err) = self.db.flush() {
            tracing::warn!(error = %err, "flushing the feedback store failed");
        }
    }
}

impl Drop for Feedback {
    /// The shadow decisions of the last moments land on disk at shutdown too.
    fn drop(&mut self) {
        self.flush();
    }
}

/// The entry approved for `keys`' prompt, if it is still live, in the partition, young enough for
/// `max-age` and not vetoed since: an alias the operator (or the judge) confirmed, served at any
/// threshold. Also says who approved it.
pub(crate) async fn approved_hit(
    feedback: &Feedback,
    cache: &crate::cache::Cache,
    keys: &crate::key::Keys,
    prompt: &PromptKey,
    policy: &crate::policy::Policy,
) -> Option<(crate::cache::Hit, f32, Source)> {
    let approval = feedback.approval(&keys.partition, prompt)?;
    let (id, similarity, source) = (
        EntryId(approval.entry),
        approval.similarity,
        approval.source,
    );
    let entry = cache.read(move |store| store.get(id)).await?.ok()??;
    let now = unix_ms();
    let age_s = entry.age_s(now);
    let live = entry.partition == keys.partition
        && !entry.is_expired(now)
        && policy.max_age_s.is_none_or(|max| age_s <= max);
    live.then(|| {
        (
            crate::cache::Hit {
                entry: std::sync::Arc::new(entry),
                age_s,
            },
            similarity,
            source,
        )
    })
}

fn decode_f32(bytes: &[u8]) -> f32 {
    let mut b = [0u8; 4];
    let n = bytes.len().min(4);
    b[..n].copy_from_slice(&bytes[..n]);
    f32::from_be_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encounter(met: Met, entry: u64, prompt: &str, similarity: f32) -> Encounter {
        Encounter {
            met,
            entry: EntryId(entry),
            partition: PartitionKey([7; 32]),
            prompt: PromptKey::of(prompt),
            preview: preview(prompt),
            similarity: Some(similarity),
            namespace: None,
        }
    }

    fn approved(
        f: &Feedback,
        partition: &PartitionKey,
        prompt: &PromptKey,
    ) -> Option<(EntryId, f32)> {
        f.approval(partition, prompt)
            .map(|a| (EntryId(a.entry), a.similarity))
    }

    fn judge(f: &Feedback, id: &str, verdict: Verdict) -> Result<VerdictRecord, GatewayError> {
        f.judge(&FeedbackRequest {
            request_id: id.to_owned(),
            verdict,
        })
        .map(|(record, _)| record)
    }

    #[test]
    fn wrong_vetoes_the_pair_and_raises_the_entry_threshold_for_good() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let f = Feedback::open(dir.path()).expect("open");
            assert!(f.allows(
                EntryId(1),
                &PromptKey::of("Can I cancel before it ships?"),
                0.95
            ));
            f.note(
                "req_1",
                encounter(Met::SemanticHit, 1, "Can I cancel before it ships?", 0.95),
            );
            let record = judge(&f, "req_1", Verdict::Wrong).expect("judged");
            assert!(record.effect.starts_with("vetoed"), "{}", record.effect);
            // The same prompt, respaced and recased, never again; other prompts need more.
            assert!(!f.allows(
                EntryId(1),
                &PromptKey::of("can I cancel  BEFORE it ships?"),
                0.999
            ));
            assert!(!f.allows(EntryId(1), &PromptKey::of("another paraphrase"), 0.95));
            assert!(f.allows(EntryId(1), &PromptKey::of("another paraphrase"), 0.96));
            assert!(f.allows(
                EntryId(2),
                &PromptKey::of("Can I cancel before it ships?"),
                0.95
            ));
        }
        let f = Feedback::open(dir.path()).expect("reopen");
        assert!(!f.allows(
            EntryId(1),
            &PromptKey::of("Can I cancel before it ships?"),
            0.999
        ));
        assert_eq!(f.counts().wrong, 1);
        assert_eq!(f.list(None, 10).0.len(), 1);
    }

    #[test]
    fn right_on_a_shadow_decision_approves_and_exact_hits_or_unknown_ids_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = Feedback::open(dir.path()).expect("open");
        f.note(
            "req_s",
            encounter(Met::Shadow, 3, "reset my password", 0.91),
        );
        judge(&f, "req_s", Verdict::Right).expect("judged");
        assert_eq!(
            approved(
                &f,
                &PartitionKey([7; 32]),
                &PromptKey::of("Reset my password")
            ),
            Some((EntryId(3), 0.91))
        );
        assert_eq!(
            approved(
                &f,
                &PartitionKey([8; 32]),
                &PromptKey::of("reset my password")
            ),
            None
        );

        // A wrong on the same pair later withdraws the approval.
        f.note(
            "req_w",
            encounter(Met::SemanticHit, 3, "reset my password", 0.91),
        );
        judge(&f, "req_w", Verdict::Wrong).expect("judged");
        assert_eq!(
            approved(
                &f,
                &PartitionKey([7; 32]),
                &PromptKey::of("reset my password")
            ),
            None
        );

        f.note("req_h", encounter(Met::Hit, 3, "x", 1.0));
        let err = judge(&f, "req_h", Verdict::Wrong).expect_err("exact hit");
        assert_eq!(err.status(), 400);
        let err = judge(&f, "req_unknown", Verdict::Right).expect_err("unknown");
        assert_eq!(err.status(), 404);
        assert_eq!(err.body()["error"]["param"], "request_id");
        assert_eq!(f.counts().right, 1);
        assert_eq!(f.counts().wrong, 1);
    }
}
