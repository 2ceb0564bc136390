//! Open-loop load: arrivals on a fixed schedule (request i is due at i / rate seconds), sent
//! whether or not earlier requests have answered, the way independent users arrive.
//!
//! A closed loop slows down with the server and so hides queueing; an open loop does not, but it
//! can swamp the machine, so in-flight requests are capped: an arrival that finds the cap reached is
//! dropped and counted, never queued (queueing it would turn the run back into a closed loop). The
//! dispatcher itself can fall behind (timer granularity, a busy CPU); every request's lag behind its
//! schedule is recorded and late arrivals are counted, so the report says how open the loop was.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::workload::Workload;
use super::{measure, BenchConfig, Event, Percentiles, Progress, Sample};

/// An arrival sent more than this after its due time counts as late (tokio's timer has a
/// millisecond granularity, so up to about 1 ms is the schedule working as intended).
pub const LATE_AFTER_MS: f64 = 2.0;

/// When arrival `i` is due, from the start of the run.
pub fn offset(i: usize, rate: f64) -> Duration {
    Duration::from_secs_f64(i as f64 / rate)
}

/// How many arrivals the schedule has: those due before `duration`, at most `requests`.
pub fn arrivals(rate: f64, requests: usize, duration: Duration) -> usize {
    if !(rate.is_finite() && rate > 0.0) {
        return 0;
    }
    // Arrival i is due at i / rate; those with i / rate < duration are i < rate * duration.
    let within = (rate * duration.as_secs_f64()).ceil();
    if within >= requests as f64 {
        requests
    } else {
        within as usize
    }
}

/// What happened to the schedule.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OpenLoopStats {
    pub rate: f64,
    /// Arrivals on the schedule (each sent to every target).
    pub scheduled: usize,
    /// Requests sent (arrivals times targets, less the dropped ones).
    pub sent: usize,
    /// Requests not sent because `max_in_flight` were already in flight.
    pub dropped: usize,
    /// Arrivals sent more than `LATE_AFTER_MS` after their due time.
    pub late: usize,
    pub lag_ms: Option<Percentiles>,
    pub max_lag_ms: f64,
    pub max_in_flight: usize,
    /// The most requests in flight at once.
    pub peak_in_flight: usize,
}

impl OpenLoopStats {
    pub fn describe(&self) -> String {
        let lag = self.lag_ms.as_ref().map_or(String::new(), |l| {
            format!(
                "; lag behind schedule p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
                l.p50, l.p99, self.max_lag_ms
            )
        });
        format!(
            "open loop: {} arrivals scheduled at {}/s, {} requests sent, {} dropped (in-flight cap {}, peak {}), {} late (> {LATE_AFTER_MS} ms){lag}",
            self.scheduled,
            self.rate,
            self.sent,
            self.dropped,
            self.max_in_flight,
            self.peak_in_flight,
            self.late,
        )
    }
}

/// Sends the schedule and waits for every request it started.
pub async fn run(
    client: &reqwest::Client,
    config: &Arc<BenchConfig>,
    rate: f64,
    workload: &mut Workload,
    progress: &Progress,
) -> (Vec<Sample>, OpenLoopStats) {
    let scheduled = arrivals(rate, config.requests, config.max_duration);
    let cap = config.max_in_flight.max(1);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let mut samples = Vec::new();
    let mut lags = Vec::with_capacity(scheduled.min(1 << 20));
    let (mut sent, mut dropped, mut peak) = (0usize, 0usize, 0usize);
    let started = Instant::now();
    for i in 0..scheduled {
        let due = started + offset(i, rate);
        // Returns at once for an arrival already due: a late dispatcher catches up in a burst.
        tokio::time::sleep_until(tokio::time::Instant::from_std(due)).await;
        let lag = Instant::now().saturating_duration_since(due).as_secs_f64() * 1000.0;
        lags.push(lag);
        let planned = Arc::new(workload.next_planned());
        let n = config.targets.len();
        for k in 0..n {
            // Alternate which target is sent first, as the closed loop does.
            let target = (i + k) % n;
            let now_in_flight = in_flight.load(Ordering::Acquire);
            if now_in_flight >= cap {
                dropped += 1;
                progress(Event::Dropped);
                continue;
            }
            in_flight.fetch_add(1, Ordering::AcqRel);
            peak = peak.max(now_in_flight + 1);
            sent += 1;
            let (client, config, planned, in_flight, progress) = (
                client.clone(),
                config.clone(),
                planned.clone(),
                in_flight.clone(),
                progress.clone(),
            );
            tasks.spawn(async move {
                let mut sample = measure(&client, &config, target, i, &planned).await;
                in_flight.fetch_sub(1, Ordering::AcqRel);
                sample.lag_ms = Some(lag);
                progress(Event::Done(&sample));
                sample
            });
        }
        // Collect what finished, so the set stays as small as what is in flight.
        while let Some(done) = tasks.try_join_next() {
            samples.extend(done.ok());
        }
    }
    while let Some(done) = tasks.join_next().await {
        samples.extend(done.ok());
    }
    let stats = OpenLoopStats {
        rate,
        scheduled,
        sent,
        dropped,
        late: lags.iter().filter(|l| **l > LATE_AFTER_MS).count(),
        max_lag_ms: lags.iter().copied().fold(0.0, f64::max),
        lag_ms: Percentiles::of(&lags),
        max_in_flight: cap,
        peak_in_flight: peak,
    };
    (samples, stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_evenly_spaced() {
        assert_eq!(offset(0, 4.0), Duration::ZERO);
        assert_eq!(offset(3, 4.0), Duration::from_millis(750));
        assert_eq!(offset(100, 50.0), Duration::from_secs(2));
    }

    #[test]
    fn arrivals_are_bounded_by_time_and_count() {
        // Due at 0.0, 0.1, ..., 0.9 s: ten before one second.
        assert_eq!(arrivals(10.0, 1000, Duration::from_secs(1)), 10);
        assert_eq!(arrivals(10.0, 1000, Duration::from_millis(1050)), 11);
        assert_eq!(arrivals(10.0, 5, Duration::from_secs(1)), 5);
        assert_eq!(arrivals(10.0, usize::MAX, Duration::from_secs(30)), 300);
        assert_eq!(arrivals(0.5, 100, Duration::from_secs(3)), 2);
        assert_eq!(arrivals(0.0, 100, Duration::from_secs(3)), 0);
        assert_eq!(arrivals(f64::NAN, 100, Duration::from_secs(3)), 0);
    }

    #[test]
    fn the_summary_line_reports_drops_and_lateness() {
        let stats = OpenLoopStats {
            rate: 50.0,
            scheduled: 100,
            sent: 97,
            dropped: 3,
            late: 2,
            lag_ms: Percentiles::of(&[0.1, 0.2, 5.0]),
            max_lag_ms: 5.0,
            max_in_flight: 8,
            peak_in_flight: 8,
        };
        let line = stats.describe();
        assert!(
            line.contains("3 dropped (in-flight cap 8, peak 8)"),
            "{line}"
        );
        assert!(line.contains("2 late"), "{line}");
        assert!(line.contains("max 5.000 ms"), "{line}");
    }
}
