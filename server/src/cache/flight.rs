//! Single flight: concurrent identical misses share one upstream call. The first becomes the
//! leader; the others follow its chunks as they arrive, or wait for its stored answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use std::time::Instant;

use bytes::Bytes;
use tokio::sync::Notify;

use super::tape::{Pushed, Read, Tape};
use crate::entry::Replay;
use crate::key::CacheKey;
use crate::lock::lock;

/// How a flight ended.
#[derive(Clone)]
pub enum FlightEnd {
    /// The leader's answer was clean and is stored (or would have been, under `no-store`).
    Stored(Arc<Replay>),
    /// The leader's answer failed or broke off: followers that have read nothing go upstream
    /// themselves; those reading its stream end with the error events its client got (the
    /// upstream's, and the gateway's), when it got any (not when it had left).
    Failed(Option<Bytes>),
    /// The leader's stream ended cleanly but was not stored: it passed `max_entry_bytes` (the
    /// reason, `too_large`, goes into the followers' records as into the leader's), or the rules
    /// refused the answer (a `length` finish, say). The followers already reading it end it as it
    /// did; the others go upstream themselves.
    Relayed(Option<&'static str>),
}

/// A miss in progress that identical requests can join.
pub struct Flight {
    pub leader_streams: bool,
    /// Chunk events the leader has relayed so far (streamed leaders only), as the bytes relayed.
    pub(super) tape: Tape,
    end: Mutex<Option<FlightEnd>>,
    changed: Notify,
}

/// What a follower reads from a flight since its last look.
pub struct FlightUpdate {
    /// Chunk events as the leader relayed them (see [`super::tape::chunk_of`]).
    pub chunks: Vec<Bytes>,
    /// Events this follower had not read were let go (the answer passed `max_entry_bytes` and the
    /// follower fell behind the window kept for it).
    pub lagged: bool,
    /// Set once the flight has ended.
    pub end: Option<FlightEnd>,
}

impl Flight {
    fn new(leader_streams: bool, max_entry_bytes: usize) -> Self {
        Self {
            leader_streams,
            tape: Tape::new(max_entry_bytes, super::tape::FOLLOWED_WINDOW),
            end: Mutex::new(None),
            changed: Notify::new(),
        }
    }

    pub(super) fn push(&self, at: Instant, event: Bytes) -> Pushed {
        let pushed = self.tape.push(at, event);
        self.changed.notify_waiters();
        pushed
    }

    /// Chunks from `from` on, and the end if there is one; waits until there is something new.
    pub async fn next(&self, from: usize) -> FlightUpdate {
        loop {
            // Register interest before looking, so a push between the look and the wait is not lost.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let end = lock(&self.end).clone();
            let (chunks, lagged) = match self.tape.read(from) {
                Read::Events(chunks) => (chunks, false),
                Read::Lagged => (Vec::new(), true),
            };
            if !chunks.is_empty() || end.is_some() || lagged {
                return FlightUpdate {
                    chunks,
                    lagged,
                    end,
                };
            }
            notified.await;
        }
    }

    /// Waits for the end of the flight, ignoring its chunks. A flight whose answer went over
    /// `max_entry_bytes` ends here for its waiters at once: it will not be stored.
    pub async fn end(&self) -> FlightEnd {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(end) = lock(&self.end).clone() {
                return end;
            }
            if self.tape.is_over() {
                return FlightEnd::Failed(None);
            }
            notified.await;
        }
    }
}

/// The role of a request in single flight.
pub enum Join {
    Leader(Arc<Flight>),
    Follower(Arc<Flight>),
}

/// The flights in progress, by exact key.
pub(super) struct Flights {
    inflight: Mutex<HashMap<CacheKey, Arc<Flight>>>,
    /// The recording cap each new flight's tape gets.
    pub(super) max_entry_bytes: usize,
}

impl Flights {
    pub(super) fn new(max_entry_bytes: usize) -> Self {
        Self {
            inflight: Mutex::default(),
            max_entry_bytes,
        }
    }

    /// Joins the flight for `key`, or starts one when this request will store its answer.
    pub(super) fn join(
        &self,
        key: CacheKey,
        leader_streams: bool,
        will_store: bool,
    ) -> Option<Join> {
        let mut inflight = lock(&self.inflight);
        if let Some(flight) = inflight.get(&key) {
            return Some(Join::Follower(flight.clone()));
        }
        if !will_store {
            return None;
        }
        let flight = Arc::new(Flight::new(leader_streams, self.max_entry_bytes));
        inflight.insert(key, flight.clone());
        Some(Join::Leader(flight))
    }

    /// Ends `flight`: later identical requests start their own, followers read `end`.
    pub(super) fn land(&self, key: &CacheKey, flight: &Arc<Flight>, end: FlightEnd) {
        self.retire(key, flight);
        *lock(&flight.end) = Some(end);
        flight.changed.notify_waiters();
    }

    /// Takes `flight` out of the joinable ones (its answer will not be stored): identical requests
    /// from now on start their own, while its followers go on reading it.
    pub(super) fn retire(&self, key: &CacheKey, flight: &Arc<Flight>) {
        let mut inflight = lock(&self.inflight);
        if inflight.get(key).is_some_and(|f| Arc::ptr_eq(f, flight)) {
            inflight.remove(key);
        }
    }
}
