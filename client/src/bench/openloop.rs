//! Open-loop load: arrivals on a schedule fixed before the run, sent whether or not earlier requests
//! have answered, the way independent users arrive. The schedule is evenly spaced (request i is due
//! at i / rate seconds) or, with `--arrivals poisson`, a seeded Poisson process at the same mean rate
//! (exponential gaps): real traffic comes in bursts, and bursts are what queues and coalescing see.
//!
//! A closed loop slows down with the server and so hides queueing; an open loop does not, but it
//! can swamp the machine, so in-flight requests are capped: an arrival that finds the cap reached is
//! dropped and counted, never queued (queueing it would turn the run back into a closed loop). The
//! dispatcher itself can fall behind (timer granularity, a busy CPU); every request's lag behind its
//! schedule is recorded and late arrivals are counted, so the report says how open the loop was.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::SeedableRng;
use rand_distr::{Distribution, Exp};
use serde::Serialize;

use super::workload::Workload;
use super::{measure, BenchConfig, Event, Percentiles, Progress, Sample};

/// An arrival sent more than this after its due time counts as late (tokio's timer has a
/// millisecond granularity, so up to about 1 ms is the schedule working as intended).
pub const LATE_AFTER_MS: f64 = 2.0;

/// How arrivals are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Every 1/rate seconds.
    #[default]
    Uniform,
    /// Exponential gaps with mean 1/rate (seeded).
    Poisson,
}

/// When each arrival is due, from the start of the run: those due before `duration`, at most
/// `requests`, drawn one at a time (a day at 10k/s is never held in memory). The same arguments give
/// the same schedule.
pub fn schedule(
    rate: f64,
    requests: usize,
    duration: Duration,
    arrivals: Arrivals,
    seed: u64,
) -> Schedule {
    let poisson = match arrivals {
        Arrivals::Uniform => None,
        // Its own stream, so the workload's draws do not change with the schedule's.
        Arrivals::Poisson => Exp::new(rate)
            .ok()
            .map(|gap| (gap, StdRng::seed_from_u64(seed ^ 0x0a11_7e5a_c0ff_ee00))),
    };
    let valid = rate.is_finite() && rate > 0.0;
    Schedule {
        rate,
        left: if valid { requests } else { 0 },
        end: duration.as_secs_f64(),
        next: 0,
        t: 0.0,
        poisson,
    }
}

/// The arrivals of a run, in order (see [`schedule`]).
pub struct Schedule {
    rate: f64,
    left: usize,
    end: f64,
    next: usize,
    t: f64,
    poisson: Option<(Exp<f64>, StdRng)>,
}

impl Schedule {
    /// How many arrivals the schedule holds: exact for even spacing, the expected count (capped by
    /// `requests`) for Poisson. For a progress bar.
    pub fn expected_len(&self) -> usize {
        match self.poisson {
            None => arrivals(self.rate, self.left, Duration::from_secs_f64(self.end)),
            Some(_) => {
                let expected = (self.rate * self.end).ceil();
                if expected >= self.left as f64 {
                    self.left
                } else {
                    expected as usize
                }
            }
        }
    }
}

impl Iterator for Schedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.left == 0 {
            return None;
        }
        let t = match &mut self.poisson {
            Some((gap, rng)) => {
                self.t += gap.sample(rng);
                self.t
            }
            None => self.next as f64 / self.rate,
        };
        if t >= self.end {
            self.left = 0;
            return None;
        }
        self.next += 1;
        self.left -= 1;
        Some(Duration::from_secs_f64(t))
    }
}

/// When arrival `i` is due on the even schedule, from the start of the run.
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
    pub arrivals: Arrivals,
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
        let spacing = match self.arrivals {
            Arrivals::Uniform => "",
            Arrivals::Poisson => " (Poisson)",
        };
        format!(
            "open loop: {} arrivals scheduled at {}/s{spacing}, {} requests sent, {} dropped (in-flight cap {}, peak {}), {} late (> {LATE_AFTER_MS} ms){lag}",
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
    let due_at = schedule(
        rate,
        config.requests,
        config.max_duration,
        config.arrivals,
        config.seed,
    );
    let mut scheduled = 0;
    let cap = config.max_in_flight.max(1);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let mut samples = Vec::new();
    let mut lags = Vec::with_capacity(due_at.expected_len().min(1 << 20));
    let (mut sent, mut dropped, mut peak) = (0usize, 0usize, 0usize);
    let started = Instant::now();
    for (i, offset) in due_at.enumerate() {
        scheduled += 1;
        let due = started + offset;
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
        arrivals: config.arrivals,
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
    fn poisson_schedules_are_seeded_bursty_and_at_the_mean_rate() {
        let long = Duration::from_secs(1000);
        let draw = |seed| -> Vec<Duration> {
            schedule(20.0, 4000, long, Arrivals::Poisson, seed).collect()
        };
        let a = draw(7);
        assert_eq!(a, draw(7));
        assert_ne!(a, draw(8));
        assert_eq!(a.len(), 4000);
        assert!(a.windows(2).all(|w| w[0] <= w[1]));
        // 4000 gaps of mean 50 ms: the total is within a few percent of 200 s.
        let span = a[a.len() - 1].as_secs_f64();
        assert!((190.0..210.0).contains(&span), "{span}");
        // Exponential gaps: their standard deviation equals their mean (even spacing has none).
        let gaps: Vec<f64> = a.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64).sqrt();
        assert!((0.9..1.1).contains(&(sd / mean)), "sd/mean {}", sd / mean);
        // Bounded by time as well as count.
        let short = schedule(
            20.0,
            usize::MAX,
            Duration::from_secs(10),
            Arrivals::Poisson,
            7,
        );
        assert_eq!(short.expected_len(), 200);
        let short: Vec<Duration> = short.collect();
        assert!((150..250).contains(&short.len()), "{}", short.len());
        assert!(short.iter().all(|d| *d < Duration::from_secs(10)));
        assert_eq!(schedule(0.0, 10, long, Arrivals::Poisson, 7).count(), 0);
        // A day at 10k/s is drawn lazily: taking the first few costs nothing.
        let day = Duration::from_secs(86_400);
        let huge = schedule(10_000.0, usize::MAX, day, Arrivals::Poisson, 7);
        assert_eq!(huge.expected_len(), 864_000_000);
        assert_eq!(huge.take(3).count(), 3);
    }

    #[test]
    fn the_even_schedule_matches_the_arrival_count() {
        let s = schedule(10.0, 1000, Duration::from_secs(1), Arrivals::Uniform, 0);
        assert_eq!(s.expected_len(), 10);
        let s: Vec<Duration> = s.collect();
        assert_eq!(s.len(), 10);
        assert_eq!(s[3], Duration::from_millis(300));
        let capped: Vec<Duration> =
            schedule(10.0, 4, Duration::from_secs(1), Arrivals::Uniform, 0).collect();
        assert_eq!(capped.len(), 4);
        assert_eq!(
            schedule(f64::NAN, 4, Duration::from_secs(1), Arrivals::Uniform, 0).count(),
            0
        );
    }

    #[test]
    fn the_summary_line_reports_drops_and_lateness() {
        let stats = OpenLoopStats {
            rate: 50.0,
            arrivals: Arrivals::Poisson,
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
        assert!(line.contains("at 50/s (Poisson)"), "{line}");
        assert!(line.contains("max 5.000 ms"), "{line}");
    }
}
