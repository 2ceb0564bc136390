//! Single flight: concurrent identical misses share one upstream call. The first becomes the
//! leader; the others follow its chunks as they arrive, or wait for its stored answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::Notify;

use super::lock;
use crate::entry::Replay;
use crate::key::CacheKey;

/// How a flight ended.
#[derive(Clone)]
pub enum FlightEnd {
    /// The leader's answer was clean and is stored (or would have been, under `no-store`).
    Stored(Arc<Replay>),
    /// The leader's answer failed, broke off or may not be cached: followers go upstream themselves.
    Uncacheable,
}

/// A miss in progress that identical requests can join.
pub struct Flight {
    pub leader_streams: bool,
    /// Chunks the leader has received so far (streamed leaders only).
    chunks: Mutex<Vec<Value>>,
    end: Mutex<Option<FlightEnd>>,
    changed: Notify,
}

/// What a follower reads from a flight since its last look.
pub struct FlightUpdate {
    pub chunks: Vec<Value>,
    /// Set once the flight has ended.
    pub end: Option<FlightEnd>,
}

impl Flight {
    fn new(leader_streams: bool) -> Self {
        Self {
            leader_streams,
            chunks: Mutex::new(Vec::new()),
            end: Mutex::new(None),
            changed: Notify::new(),
        }
    }

    pub fn push(&self, chunk: Value) {
        lock(&self.chunks).push(chunk);
        self.changed.notify_waiters();
    }

    /// Chunks from `from` on, and the end if there is one; waits until there is something new.
    pub async fn next(&self, from: usize) -> FlightUpdate {
        loop {
            // Register interest before looking, so a push between the look and the wait is not lost.
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let chunks: Vec<Value> = lock(&self.chunks)
                .get(from..)
                .map(<[Value]>::to_vec)
                .unwrap_or_default();
            let end = lock(&self.end).clone();
            if !chunks.is_empty() || end.is_some() {
                return FlightUpdate { chunks, end };
            }
            notified.await;
        }
    }

    /// Waits for the end of the flight, ignoring its chunks.
    pub async fn end(&self) -> FlightEnd {
        loop {
            if let Some(end) = self.next(usize::MAX).await.end {
                return end;
            }
        }
    }
}

/// The role of a request in single flight.
pub enum Join {
    Leader(Arc<Flight>),
    Follower(Arc<Flight>),
}

/// The flights in progress, by exact key.
#[derive(Default)]
pub(super) struct Flights {
    inflight: Mutex<HashMap<CacheKey, Arc<Flight>>>,
}

impl Flights {
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
        let flight = Arc::new(Flight::new(leader_streams));
        inflight.insert(key, flight.clone());
        Some(Join::Leader(flight))
    }

    /// Ends `flight`: later identical requests start their own, followers read `end`.
    pub(super) fn land(&self, key: &CacheKey, flight: &Arc<Flight>, end: FlightEnd) {
        let mut inflight = lock(&self.inflight);
        if inflight.get(key).is_some_and(|f| Arc::ptr_eq(f, flight)) {
            inflight.remove(key);
        }
        drop(inflight);
        *lock(&flight.end) = Some(end);
        flight.changed.notify_waiters();
    }
}
