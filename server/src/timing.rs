//! Per-request phase clock and its three renderings: `Server-Timing`, the SSE timing comment, and JSON.
//!
//! Phases, as a user feels them (all in milliseconds, measured on the gateway's monotonic clock):
//! - `ingress`: reading and parsing the client's body;
//! - `lookup`: cache policy, key and exact lookup;
//! - `embed`, `search`: embedding the prompt and searching the vector index (semantic matching);
//! - `upstream_send`: connect (or pool checkout) until the request body was handed to the socket;
//! - `ttft`: request sent until the first content token arrived (non-streaming: the first body byte);
//!   on a hit, parsed request until the first token left the gateway;
//! - `decode`: first to last token, with token count, inter-token latency p50/p99 and tokens/s;
//! - `downstream`: after the last upstream byte, until the client was handed the last byte;
//! - `total`: request arrival until the last byte left (or until the timing was rendered, for the
//!   copies sent with the response itself).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The phases of one request and their text forms are the wire contract's, shared with the client.
pub use reprise_wire::Phases;

/// Unix time in milliseconds: every timestamp the gateway keeps (entry creation and expiry, ages,
/// records) reads this one clock.
///
/// It is the system time at the first call plus tokio's clock since then. In a running gateway
/// tokio's clock is the monotonic one, so an entry's age never jumps when the system clock is set;
/// in a test that pauses and advances tokio's time (`tokio::time::pause`), TTLs and `max-age`
/// follow it, so expiry is tested without waiting for it.
pub fn unix_ms() -> u64 {
    static BASE: std::sync::OnceLock<(u64, tokio::time::Instant)> = std::sync::OnceLock::new();
    let (unix, at) = *BASE.get_or_init(|| {
        let unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        (unix, tokio::time::Instant::now())
    });
    let since = tokio::time::Instant::now().saturating_duration_since(at);
    unix.saturating_add(since.as_millis() as u64)
}

/// Instants recorded while a request passes through. Phases are derived from these, never stored twice.
#[derive(Debug, Clone)]
pub struct PhaseClock {
    pub start: Instant,
    pub body_read: Option<Instant>,
    /// Policy, key and cache lookup done.
    pub looked_up: Option<Instant>,
    pub upstream_sent: Option<Instant>,
    pub upstream_head: Option<Instant>,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    pub last_upstream_byte: Option<Instant>,
    pub delivered: Option<Instant>,
    /// Arrival instant of every content-bearing chunk, for inter-token latency.
    token_times: Vec<Instant>,
    /// Completion tokens reported by the upstream's `usage`, when it sent one.
    pub usage_tokens: Option<u64>,
    /// Time spent embedding the prompt and searching the vector index (inside the lookup).
    pub embed_ms: Option<f64>,
    pub search_ms: Option<f64>,
    /// When embedding began (the search follows it): places those two phases in a trace.
    pub semantic_began: Option<Instant>,
    /// Time spent waiting for the judge's verdict on a near match (inside the lookup).
    pub judge_ms: Option<f64>,
}

impl PhaseClock {
    pub fn start(at: Instant) -> Self {
        Self {
            start: at,
            body_read: None,
            looked_up: None,
            upstream_sent: None,
            upstream_head: None,
            first_token: None,
            last_token: None,
            last_upstream_byte: None,
            delivered: None,
            token_times: Vec::new(),
            usage_tokens: None,
            embed_ms: None,
            search_ms: None,
            semantic_began: None,
            judge_ms: None,
        }
    }

    /// Records `count` content tokens that arrived together at `at`.
    pub fn tokens(&mut self, at: Instant, count: u32) {
        if count == 0 {
            return;
        }
        self.first_token.get_or_insert(at);
        self.last_token = Some(at);
        for _ in 0..count {
            self.token_times.push(at);
        }
    }

    /// Phases as of `now` (used for copies rendered before the response is fully delivered).
    pub fn phases(&self, now: Instant) -> Phases {
        let ms = |from: Option<Instant>, to: Option<Instant>| match (from, to) {
            (Some(a), Some(b)) => Some(millis(b.saturating_duration_since(a))),
            _ => None,
        };
        let end = self.delivered.unwrap_or(now);
        let sent = self.upstream_sent;
        let gaps: Vec<f64> = self
            .token_times
            .windows(2)
            .map(|w| millis(w[1].saturating_duration_since(w[0])))
            .collect();
        let tokens = self.token_times.len() as u64;
        let decode_ms = ms(self.first_token, self.last_token);
        let tokens_per_s = match decode_ms {
            Some(d) if d > 0.0 && tokens > 1 => Some((tokens - 1) as f64 / (d / 1000.0)),
            _ => None,
        };
        let after_lookup = self.looked_up.or(self.body_read);
        Phases {
            ingress_ms: ms(Some(self.start), self.body_read),
            // The exact lookup alone: embedding and search are reported on their own. A difference
            // of values in whole microseconds is rounded back to whole microseconds, or binary
            // floating point shows 0.062 as 0.06200000000000072.
            lookup_ms: ms(self.body_read, self.looked_up).map(|total| {
                to_micros(
                    total
                        - self.embed_ms.unwrap_or(0.0)
                        - self.search_ms.unwrap_or(0.0)
                        - self.judge_ms.unwrap_or(0.0),
                )
                .max(0.0)
            }),
            embed_ms: self.embed_ms,
            search_ms: self.search_ms,
            judge_ms: self.judge_ms,
            upstream_send_ms: ms(after_lookup, sent),
            // A hit has no upstream: its TTFT runs from the parsed request to its first token.
            ttft_ms: ms(sent.or(self.body_read), self.first_token),
            decode_ms,
            downstream_ms: ms(self.last_upstream_byte, Some(end)),
            total_ms: millis(end.saturating_duration_since(self.start)),
            tokens,
            completion_tokens: self.usage_tokens,
            itl_p50_ms: percentile(&gaps, 0.50),
            itl_p99_ms: percentile(&gaps, 0.99),
            tokens_per_s,
        }
    }
}

pub fn millis(d: Duration) -> f64 {
    // Microsecond resolution is plenty and keeps the JSON short.
    (d.as_micros() as f64) / 1000.0
}

/// Milliseconds rounded to whole microseconds, for a value computed from others (a difference).
pub fn to_micros(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

/// Nearest-rank percentile of unsorted samples (`q` in 0..=1); `None` for no samples.
pub fn percentile(samples: &[f64], q: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lookup_is_a_difference_printed_in_whole_microseconds() {
        let t0 = Instant::now();
        let mut clock = PhaseClock::start(t0);
        clock.body_read = Some(t0);
        // 0.3 ms of lookup, of which 0.1 + 0.138 embedding and search: 0.062 left, which binary
        // floating point makes 0.06199999999999997 before rounding.
        clock.looked_up = Some(t0 + Duration::from_micros(300));
        clock.embed_ms = Some(0.1);
        clock.search_ms = Some(0.138);
        let p = clock.phases(t0 + Duration::from_millis(1));
        assert_eq!(p.lookup_ms, Some(0.062));
        let json = serde_json::to_string(&p).expect("serialize");
        assert!(json.contains("\"lookup_ms\":0.062,"), "{json}");
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&samples, 0.5), Some(50.0));
        assert_eq!(percentile(&samples, 0.99), Some(99.0));
        assert_eq!(percentile(&samples, 1.0), Some(100.0));
        assert_eq!(percentile(&[3.0], 0.99), Some(3.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn phases_follow_the_recorded_instants() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut clock = PhaseClock::start(t0);
        clock.body_read = Some(at(1));
        clock.upstream_sent = Some(at(3));
        clock.tokens(at(103), 1);
        clock.tokens(at(113), 1);
        clock.tokens(at(133), 2);
        clock.last_upstream_byte = Some(at(134));
        clock.delivered = Some(at(135));
        let p = clock.phases(at(500));
        assert_eq!(p.ingress_ms, Some(1.0));
        assert_eq!(p.upstream_send_ms, Some(2.0));
        assert_eq!(p.ttft_ms, Some(100.0));
        assert_eq!(p.decode_ms, Some(30.0));
        assert_eq!(p.downstream_ms, Some(1.0));
        assert_eq!(p.total_ms, 135.0);
        assert_eq!(p.tokens, 4);
        assert_eq!(p.itl_p50_ms, Some(10.0));
        assert_eq!(p.itl_p99_ms, Some(20.0));
        assert_eq!(p.tokens_per_s, Some(100.0));
        let header = p.server_timing();
        assert!(header.starts_with("ingress;dur=1.000, upstream_send;dur=2.000, ttft;dur=100.000"));
        assert!(p
            .sse_comment()
            .starts_with(b": reprise-timing {\"ingress_ms\":1.0"));
    }
}
