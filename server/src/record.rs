//! The last stage of every request: what happened and how long each phase took, kept in a bounded
//! in-memory log that `GET /admin/requests` reads.
//!
//! Records carry no prompt, no response and no credential: only the route, model, outcome and timings.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::stats::Stats;
use crate::timing::Phases;

/// How a request ended, from the client's point of view.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Completion {
    /// The whole response reached the client.
    Complete,
    /// The gateway answered with an error of its own (bad input, upstream unreachable, timeout).
    GatewayError,
    /// The upstream answered with a non-2xx status, relayed as it was.
    UpstreamError,
    /// The upstream stream failed after it started (cut, malformed, idle timeout, error event).
    StreamFailed,
    /// The client went away before the response was delivered.
    ClientDisconnected,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct RequestRecord {
    pub id: String,
    /// Unix time in milliseconds when the request arrived.
    pub started_at_ms: u64,
    pub method: String,
    pub route: String,
    pub model: Option<String>,
    pub stream: bool,
    pub status: u16,
    /// Cache outcome as sent in `x-reprise-cache` (`pass` for routes that are never cached).
    pub cache: String,
    pub completion: Completion,
    pub phases: Phases,
    /// The entry that served a hit (or a coalesced request).
    #[serde(default)]
    pub entry: Option<String>,
    /// Similarity of a semantic hit.
    #[serde(default)]
    pub similarity: Option<f32>,
    /// On a miss: similarity of the best semantic candidate (`x-reprise-nearest`).
    #[serde(default)]
    pub nearest: Option<f32>,
    /// On a miss: the literal guard that refused the best candidate (`x-reprise-guard`).
    #[serde(default)]
    pub guard: Option<String>,
    /// Network and prefill time of the stored miss, less this hit's TTFT.
    #[serde(default)]
    pub ttft_saved_ms: Option<f64>,
    /// The `code` of the gateway's own error response, when it answered with one.
    #[serde(default)]
    pub error: Option<String>,
}

/// A bounded ring of recent requests (the oldest is dropped when full), and the counters every
/// finished request adds to.
pub struct RequestLog {
    pub stats: Stats,
    capacity: usize,
    records: Mutex<VecDeque<RequestRecord>>,
    next_id: AtomicU64,
    /// Random per process, so ids from two runs do not collide in someone's notes.
    prefix: u32,
}

impl RequestLog {
    pub fn new(capacity: usize) -> Self {
        let seed = blake3::hash(&unix_ms().to_le_bytes());
        let prefix = u32::from_le_bytes([
            seed.as_bytes()[0],
            seed.as_bytes()[1],
            seed.as_bytes()[2],
            seed.as_bytes()[3],
        ]);
        Self {
            stats: Stats::new(),
            capacity,
            records: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            next_id: AtomicU64::new(1),
            prefix,
        }
    }

    /// A fresh request id, also sent to the client as `x-reprise-request-id`.
    pub fn next_id(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("req_{:08x}{:08x}", self.prefix, n)
    }

    pub fn push(&self, record: RequestRecord) {
        self.stats.observe(&record);
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.len() == self.capacity {
            records.pop_front();
        }
        records.push_back(record);
    }

    /// Up to `limit` records, newest first.
    pub fn recent(&self, limit: usize) -> Vec<RequestRecord> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.iter().rev().take(limit).cloned().collect()
    }
}

pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> RequestRecord {
        RequestRecord {
            id: id.into(),
            started_at_ms: 0,
            method: "POST".into(),
            route: "chat".into(),
            model: None,
            stream: false,
            status: 200,
            cache: "pass".into(),
            completion: Completion::Complete,
            phases: Phases::default(),
            entry: None,
            similarity: None,
            nearest: None,
            guard: None,
            ttft_saved_ms: None,
            error: None,
        }
    }

    #[test]
    fn keeps_the_newest_within_capacity() {
        let log = RequestLog::new(2);
        for id in ["a", "b", "c"] {
            log.push(record(id));
        }
        let ids: Vec<_> = log.recent(10).into_iter().map(|r| r.id).collect();
        assert_eq!(ids, ["c", "b"]);
        assert_eq!(log.recent(1).len(), 1);
        assert_ne!(log.next_id(), log.next_id());
    }
}
