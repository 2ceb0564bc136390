//! The recorder: follows a miss's answer as it is relayed, feeds its flight's followers, and turns
//! a clean answer into an entry for the writer. A failed, partial or refused answer ends the flight
//! as uncacheable and is never stored.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use serde_json::Value;

use super::cacheable;
use super::flight::{Flight, FlightEnd};
use super::writer::WriteOp;
use super::Cache;
use crate::entry::{Entry, EntryId, Replay, RequestSummary, StoredEvent};
use crate::ingress::Route;
use crate::key::Keys;
use crate::record::unix_ms;
use crate::timing::Phases;

/// Everything needed to turn a clean miss into an entry.
pub struct Recorder {
    pub cache: Arc<Cache>,
    pub route: Route,
    pub keys: Keys,
    pub summary: RequestSummary,
    pub ttl_s: u64,
    pub flight: Option<Arc<Flight>>,
    /// Chunks seen so far, with their arrival instants.
    events: Vec<(Instant, Value)>,
    /// Whether this answer may be stored (policy allowed it); a flight alone does not store.
    pub store: bool,
    /// The prompt's embedding, stored with the entry for semantic matching.
    pub vector: Option<Vec<f32>>,
    /// Where an embedding still running beside the upstream request puts its vector; read when the
    /// answer is complete (an answer done first is stored without one, and the backfill adds it).
    pub vector_later: Option<Arc<OnceLock<Vec<f32>>>>,
    landed: bool,
}

impl Recorder {
    pub fn new(
        cache: Arc<Cache>,
        route: Route,
        keys: Keys,
        summary: RequestSummary,
        ttl_s: u64,
        flight: Option<Arc<Flight>>,
        store: bool,
    ) -> Self {
        Self {
            cache,
            route,
            keys,
            summary,
            ttl_s,
            flight,
            events: Vec::new(),
            store,
            vector: None,
            vector_later: None,
            landed: false,
        }
    }

    /// Notes one stream chunk as it passes.
    pub fn chunk(&mut self, at: Instant, chunk: &Value) {
        if let Some(flight) = &self.flight {
            flight.push(chunk.clone());
        }
        self.events.push((at, chunk.clone()));
    }

    /// The stream ended cleanly: assemble, check and store it.
    pub fn finish_stream(mut self, phases: Phases) {
        let first = self.events.first().map(|(at, _)| *at);
        let events: Vec<StoredEvent> = std::mem::take(&mut self.events)
            .into_iter()
            .map(|(at, data)| StoredEvent {
                offset_ms: first.map_or(0.0, |f| {
                    crate::timing::millis(at.saturating_duration_since(f))
                }),
                data,
            })
            .collect();
        let chunks: Vec<Value> = events.iter().map(|e| e.data.clone()).collect();
        let body = cacheable::assemble(self.route, &chunks);
        self.finish(body, events, phases);
    }

    /// A non-streamed 200 answer arrived whole.
    pub fn finish_body(self, raw: &[u8], phases: Phases) {
        let Ok(body) = serde_json::from_slice::<Value>(raw) else {
            tracing::debug!("not caching: the upstream body is not JSON");
            return self.abandon();
        };
        let events = if self.route == Route::Embeddings {
            Vec::new()
        } else {
            cacheable::rechunk(self.route, &body, phases.decode_ms.unwrap_or(0.0))
        };
        self.finish(body, events, phases);
    }

    fn finish(mut self, body: Value, events: Vec<StoredEvent>, phases: Phases) {
        if let Err(why) =
            cacheable::check_cacheable(self.route, &body, self.cache.settings.cache_length_finish)
        {
            tracing::debug!(?why, "not caching this answer");
            return self.abandon();
        }
        let now = unix_ms();
        let entry = Entry {
            id: EntryId(0),
            key: self.keys.exact,
            partition: self.keys.partition,
            summary: self.summary.clone(),
            events,
            usage: body.get("usage").filter(|u| !u.is_null()).cloned(),
            body,
            phases,
            created_at_ms: now,
            ttl_ms: self.ttl_s.saturating_mul(1000),
            hit_count: 0,
            last_hit_ms: 0,
            vector: self
                .vector
                .take()
                .or_else(|| self.vector_later.as_ref()?.get().cloned()),
            hit_history: Vec::new(),
            warmed: false,
        };
        self.landed = true;
        // Followers are served the answer as a hit would be: from its replay.
        let landing = self
            .flight
            .take()
            .map(|flight| (flight, Arc::new(Replay::of(&entry))));
        if self.store {
            self.cache.writer.send(WriteOp::Put(Box::new(entry)));
        }
        if let Some((flight, replay)) = landing {
            self.cache
                .flights
                .land(&self.keys.exact, &flight, FlightEnd::Stored(replay));
        }
    }

    /// The request was served `entry` instead of the upstream's answer (a semantic hit found while
    /// the upstream request was in flight): followers are served it too, and nothing is stored.
    pub fn served_instead(mut self, entry: Arc<Replay>) {
        self.landed = true;
        if let Some(flight) = self.flight.take() {
            self.cache
                .flights
                .land(&self.keys.exact, &flight, FlightEnd::Stored(entry));
        }
    }

    /// The answer will not be stored (failed, partial, or refused by the rules).
    pub fn abandon(mut self) {
        self.land_failed();
    }

    fn land_failed(&mut self) {
        if self.landed {
            return;
        }
        self.landed = true;
        if let Some(flight) = self.flight.take() {
            self.cache
                .flights
                .land(&self.keys.exact, &flight, FlightEnd::Uncacheable);
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // A recorder dropped without a verdict (a panic, a cancelled task) must not strand followers.
        self.land_failed();
    }
}
