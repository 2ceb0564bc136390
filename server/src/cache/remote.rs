//! Single flight across replicas that share a store (`--store redis`). A request that leads its
//! replica's local flight also claims the key in the store: the replica that holds the claim asks
//! the upstream (and keeps the claim alive until its answer is stored); the others wait for that
//! answer to appear in the store and serve it, local followers included. A claim that goes away
//! without an answer (the leader's answer was not cacheable, or the leader died and its claim
//! lapsed) sends the waiting request to claim again, and so upstream. Every store failure counts as
//! a claim won: a request never waits on a broken store, and never waits past [`WAIT_MAX`].
//!
//! It must not hold the local flight open past its own end: a cancelled wait lands the local flight
//! as uncacheable, so local followers go upstream rather than wait forever.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::task::TaskTracker;

use super::flight::{Flight, FlightEnd};
use super::writer::WriteOp;
use super::{Cache, ExactHit};
use crate::key::CacheKey;
use crate::policy::Policy;
use crate::store::{Claim, ClaimToken};

/// How long a claim lives unless renewed: what a replica killed mid-flight costs the replicas
/// waiting for it, at most.
pub const CLAIM_TTL_MS: u64 = 3_000;
/// Renewals per claim lifetime: two may fail before the claim lapses under a live leader.
const RENEW_EVERY: Duration = Duration::from_millis(CLAIM_TTL_MS / 3);
/// How often a waiting request looks for the answer: a few store reads per answer, and at most
/// this much added to a coalesced request's wait.
const POLL: Duration = Duration::from_millis(20);
/// The longest a request waits for another replica's answer, however long that replica renews its
/// claim; then it goes upstream itself.
pub const WAIT_MAX: Duration = Duration::from_secs(60);

/// What single flight across replicas decided for a request that leads its local flight.
pub enum Across {
    /// Go upstream. `waited` tells how a wait for another replica ended, if there was one.
    Lead { waited: Option<WaitEnd> },
    /// Another replica's answer, found in the store: serve it. The local flight has landed with it.
    Answered(ExactHit),
}

/// Why a wait for another replica's answer ended without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    /// The claim went away without an answer (not cacheable, or its holder died): this request
    /// took the claim, or the store failed (fail-open).
    Lapsed,
    /// [`WAIT_MAX`] passed with the claim still held.
    GaveUp,
}

impl WaitEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lapsed => "lapsed",
            Self::GaveUp => "gave_up",
        }
    }
}

/// Lands a local flight as uncacheable if the wait is dropped (the client went away): its local
/// followers then go upstream instead of waiting for a flight nobody leads.
struct Unlanded<'a> {
    cache: &'a Cache,
    key: CacheKey,
    flight: &'a Arc<Flight>,
    armed: bool,
}

impl Drop for Unlanded<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.cache
                .flights
                .land(&self.key, self.flight, FlightEnd::Failed(None));
        }
    }
}

/// Claims `key` for the local flight `flight` this request leads. With `wait` (the request may be
/// served from the cache), a key claimed by another replica is waited for: its stored answer is
/// returned, and lands `flight` for the local followers. Without `wait`, or once the claim is this
/// replica's, the request goes upstream; a held claim is renewed (a task on `tasks`) until the
/// flight lands, then released after the answer's write.
pub async fn lead(
    cache: &Arc<Cache>,
    tasks: &TaskTracker,
    key: CacheKey,
    flight: &Arc<Flight>,
    policy: &Policy,
    wait: bool,
) -> Across {
    let mut guard = Unlanded {
        cache,
        key,
        flight,
        armed: true,
    };
    let began = Instant::now();
    let mut waited = None;
    let across = loop {
        // Every store call runs off the async workers; one that does not answer in time is a
        // store failure, and so a claim won (fail-open).
        let claimed = cache
            .read(move |store| crate::store::claim(store, &key, CLAIM_TTL_MS))
            .await
            .unwrap_or(Err(crate::store::StoreError::Unavailable));
        match claimed {
            Ok(Claim::Led(token)) => {
                keep(cache.clone(), tasks, key, flight.clone(), token);
                break Across::Lead { waited };
            }
            Ok(Claim::Local) | Err(_) => break Across::Lead { waited },
            Ok(Claim::Elsewhere) if !wait => break Across::Lead { waited },
            Ok(Claim::Elsewhere) if began.elapsed() >= WAIT_MAX => {
                break Across::Lead {
                    waited: Some(WaitEnd::GaveUp),
                }
            }
            Ok(Claim::Elsewhere) => {}
        }
        match answer(cache, &key, policy, began + WAIT_MAX).await {
            Some(hit) => {
                guard.armed = false;
                cache
                    .flights
                    .land(&key, flight, FlightEnd::Stored(hit.replay.clone()));
                break Across::Answered(hit);
            }
            // Claim again: whoever wins asks the upstream.
            None => waited = Some(WaitEnd::Lapsed),
        }
    };
    guard.armed = false;
    across
}

/// Waits for the answer to `key` while another replica holds its claim; `None` once the claim is
/// gone without one, or at `deadline`.
async fn answer(
    cache: &Cache,
    key: &CacheKey,
    policy: &Policy,
    deadline: Instant,
) -> Option<ExactHit> {
    loop {
        if let Some(hit) = cache.lookup(key, policy).await {
            return Some(hit);
        }
        // A store error (or a call past its deadline) reads as no claim: fail open.
        let key = *key;
        let held = cache
            .read(move |store| crate::store::claimed(store, &key).unwrap_or(false))
            .await
            .unwrap_or(false);
        if !held || Instant::now() >= deadline {
            // One more look: the holder releases its claim only after its answer is written.
            return cache.lookup(&key, policy).await;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Keeps the claim `token` on `key` alive while `flight` runs, then releases it: through the
/// writer when the answer is being stored (after its write), at once when there is none.
fn keep(
    cache: Arc<Cache>,
    tasks: &TaskTracker,
    key: CacheKey,
    flight: Arc<Flight>,
    token: ClaimToken,
) {
    tasks.spawn(async move {
        let end = flight.end();
        tokio::pin!(end);
        let end = loop {
            tokio::select! {
                end = &mut end => break end,
                () = tokio::time::sleep(RENEW_EVERY) => {
                    let token = token.clone();
                    let renewed = cache
                        .read(move |store| crate::store::renew(store, &key, &token, CLAIM_TTL_MS).unwrap_or(false))
                        .await
                        .unwrap_or(false);
                    if !renewed {
                        // Lapsed (a flush, a stalled store): other replicas may ask the upstream
                        // too; this answer is still stored.
                        tracing::debug!("a single-flight claim lapsed while its flight ran");
                    }
                }
            }
        };
        match end {
            FlightEnd::Stored(_) => cache.writer.send(WriteOp::Release(key, token)),
            FlightEnd::Failed(_) | FlightEnd::Relayed(_) => {
                let _ = cache.read(move |store| crate::store::release(store, &key, &token)).await;
            }
        }
    });
}
