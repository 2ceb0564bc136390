//! The recorder: follows a miss's answer as it is relayed, feeds its flight's followers, and turns
//! a clean answer into an entry for the writer. A failed or partial answer ends the flight as
//! failed, one the rules refuse or larger than `max_entry_bytes` (relayed whole, its recording
//! dropped the moment it passes the cap) as relayed; none of them is stored.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use serde_json::Value;

use super::flight::{Flight, FlightEnd};
use super::tape::{Pushed, Tape};
use super::writer::WriteOp;
use super::Cache;
use crate::entry::{Entry, EntryId, Replay, RequestSummary, StoredEvent};
use crate::ingress::Route;
use crate::key::Keys;
use crate::timing::unix_ms;
use crate::timing::Phases;

/// Everything needed to turn a clean miss into an entry.
pub struct Recorder {
    pub cache: Arc<Cache>,
    pub route: Route,
    pub keys: Keys,
    pub summary: RequestSummary,
    pub ttl_s: u64,
    pub flight: Option<Arc<Flight>>,
    /// Chunk events seen so far, when there is no flight to keep them (a flight's tape is shared
    /// with its followers).
    own: Option<Tape>,
    /// The answer passed `max_entry_bytes`: it is relayed, not stored.
    too_large: bool,
    /// Whether this answer may be stored (policy allowed it); a flight alone does not store.
    pub store: bool,
    /// The prompt's embedding, stored with the entry for semantic matching.
    pub vector: Option<Vec<f32>>,
    /// Where an embedding still running beside the upstream request puts its vector; read when the
    /// answer is complete (an answer done first is stored without one, and the backfill adds it).
    pub vector_later: Option<Arc<OnceLock<Vec<f32>>>>,
    /// The client's stream asked for usage (`stream_options.include_usage`).
    pub asked_usage: bool,
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
        let own = flight
            .is_none()
            .then(|| Tape::new(cache.settings.max_entry_bytes, 0));
        Self {
            cache,
            route,
            keys,
            summary,
            ttl_s,
            own,
            flight,
            too_large: false,
            store,
            vector: None,
            vector_later: None,
            asked_usage: false,
            landed: false,
        }
    }

    /// Notes one stream chunk event (its bytes as relayed) as it passes.
    pub fn chunk(&mut self, at: Instant, event: &Bytes) {
        let pushed = match (&self.flight, &self.own) {
            (Some(flight), _) => flight.push(at, event.clone()),
            (None, Some(tape)) => tape.push(at, event.clone()),
            (None, None) => return,
        };
        if pushed == Pushed::WentOver {
            self.went_over();
        }
    }

    /// Why this answer is not stored, when it is for its size (`too_large`).
    pub fn skipped(&self) -> Option<&'static str> {
        self.too_large.then_some("too_large")
    }

    /// The answer passed the cap: its recording is already let go (the tape did); identical
    /// requests from now on go upstream themselves, and those waiting for this one are told.
    fn went_over(&mut self) {
        self.too_large = true;
        tracing::debug!(
            max_entry_bytes = self.cache.settings.max_entry_bytes,
            "not caching: the answer is larger than max_entry_bytes"
        );
        self.own = None;
        if let Some(flight) = &self.flight {
            self.cache.flights.retire(&self.keys.exact, flight);
        }
    }

    /// The stream ended cleanly: assemble, check and store it (unless it was too large). Returns
    /// why it was not stored, for its size.
    pub fn finish_stream(mut self, phases: Phases) -> Option<&'static str> {
        if self.too_large {
            self.land(FlightEnd::Relayed(Some("too_large")));
            return self.skipped();
        }
        let recorded = match (&self.flight, &self.own) {
            (Some(flight), _) => flight.tape.recorded(),
            (None, Some(tape)) => tape.recorded(),
            (None, None) => None,
        }
        .unwrap_or_default();
        self.own = None;
        // Parsed here to assemble and check the answer (and render the followers' replay), then
        // dropped: the writer parses the bytes again when it writes, one entry at a time.
        let Some(chunks) = super::tape::chunks(&recorded) else {
            tracing::debug!("not caching: a recorded event is not a JSON chunk");
            self.abandon();
            return None;
        };
        let body = crate::api::of(self.route).assemble(chunks.iter().map(|(_, data)| data));
        let events = chunks
            .into_iter()
            .map(|(offset_ms, data)| StoredEvent { offset_ms, data })
            .collect();
        self.finish(body, events, Some(recorded), phases);
        None
    }

    /// A non-streamed 200 answer arrived whole. Returns why it was not stored, for its size.
    pub fn finish_body(mut self, raw: &[u8], phases: Phases) -> Option<&'static str> {
        if raw.len() > self.cache.settings.max_entry_bytes {
            self.went_over();
            self.abandon();
            return Some("too_large");
        }
        let Ok(body) = serde_json::from_slice::<Value>(raw) else {
            tracing::debug!("not caching: the upstream body is not JSON");
            self.abandon();
            return None;
        };
        // Both shapes are stored, so a streamed hit can be served from a non-streamed miss.
        let events = crate::api::of(self.route).rechunk(&body, phases.decode_ms.unwrap_or(0.0));
        self.finish(body, events, None, phases);
        None
    }

    /// Stores the answer; `recorded` is the stream `events` were parsed from, sent to the writer in
    /// their place.
    fn finish(
        mut self,
        body: Value,
        events: Vec<StoredEvent>,
        recorded: Option<Vec<(f64, Bytes)>>,
        phases: Phases,
    ) {
        let allow_length = self.cache.settings.cache_length_finish;
        if let Err(why) = crate::api::of(self.route).check(&body, allow_length) {
            tracing::debug!(?why, "not caching this answer");
            // A stream refused here ended cleanly for its client: its followers end it as it did.
            return if recorded.is_some() {
                self.land(FlightEnd::Relayed(None))
            } else {
                self.abandon()
            };
        }
        let now = unix_ms();
        let usage = body.get("usage").filter(|u| !u.is_null()).cloned();
        if usage.is_none() && recorded.is_some() && self.asked_usage {
            self.cache.note_usage_ignored();
        }
        if usage.is_none() {
            // A hit of this entry will count its tokens: have the tokenizer ready by then.
            crate::savings::warm(&self.summary.model);
        }
        let entry = Entry {
            id: EntryId(0),
            key: self.keys.exact,
            partition: self.keys.partition,
            summary: self.summary.clone(),
            events,
            usage,
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
            let op = match recorded {
                Some(recorded) => {
                    let mut entry = Box::new(entry);
                    entry.events = Vec::new();
                    WriteOp::PutRecorded(entry, recorded)
                }
                None => WriteOp::Put(Box::new(entry)),
            };
            self.cache.writer.send(op);
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
        self.land(FlightEnd::Stored(entry));
    }

    /// The answer will not be stored: it failed, was cut, or could not be read back.
    pub fn abandon(mut self) {
        self.land(FlightEnd::Failed(None));
    }

    /// The stream failed after it began; `error_events` are the error events its client got,
    /// with which the followers reading it end theirs.
    pub fn fail(mut self, error_events: Option<Bytes>) {
        self.land(FlightEnd::Failed(error_events));
    }

    /// Ends the flight this request leads, once.
    fn land(&mut self, end: FlightEnd) {
        if self.landed {
            return;
        }
        self.landed = true;
        if let Some(flight) = self.flight.take() {
            self.cache.flights.land(&self.keys.exact, &flight, end);
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // A recorder dropped without a verdict (a panic, a cancelled task) must not strand followers.
        self.land(FlightEnd::Failed(None));
    }
}
