//! Running a benchmark ([`run`]): the warm-up, then a closed loop of workers or the open-loop
//! schedule, drawing from the workload and reporting progress as requests finish. It decides when
//! requests are sent; `http.rs` measures each one and `summary.rs` makes the report.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::workload::{Kind, Planned, Workload};
use super::{measure, openloop, summarize, BenchConfig, Report, Sample};

/// What the progress display hears about.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A request completed (or failed).
    Done(&'a Sample),
    /// An open-loop arrival was dropped at the in-flight cap.
    Dropped,
}

/// Called with every event of the measured run as it happens (progress display).
pub type Progress = Arc<dyn Fn(Event<'_>) + Send + Sync>;

fn lock(workload: &Mutex<Workload>) -> std::sync::MutexGuard<'_, Workload> {
    // A worker that panicked mid-draw leaves a usable workload: the draw is one step.
    workload
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs the benchmark: the warm-up, then closed loop at the configured concurrency or open loop
/// at the configured rate, until `requests` were drawn or `max_duration` passed.
pub async fn run(config: BenchConfig, mut workload: Workload, progress: Progress) -> Report {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(config.concurrency.max(config.max_in_flight.min(256)) * 2)
        .tcp_nodelay(true)
        .build()
        .unwrap_or_default();
    let run_started = httpdate::fmt_http_date(std::time::SystemTime::now());
    // Warm-up: open connections and let any lazy start-up happen off the record.
    // Numbered, so that with --round-robin every URL opens its connections here too.
    for (i, item) in workload
        .warmup(config.warmup, &config.run_id)
        .into_iter()
        .enumerate()
    {
        let planned = Planned {
            item,
            kind: Kind::New,
        };
        for t in 0..config.targets.len() {
            let _ = measure(&client, &config, t, i, &planned).await;
        }
    }
    let config = Arc::new(config);
    let description = workload.describe();
    let started = Instant::now();
    let (samples, open_loop, workload) = match config.rate {
        Some(rate) => {
            let (samples, stats) =
                openloop::run(&client, &config, rate, &mut workload, &progress).await;
            (samples, Some(stats), workload)
        }
        None => {
            let shared = Arc::new(Mutex::new(workload));
            let samples = closed_loop(&client, &config, &shared, &progress).await;
            let workload = lock(&shared).clone();
            (samples, None, workload)
        }
    };
    let mut report = summarize(&config, &samples, started.elapsed());
    let (new, repeat, paraphrase) = workload.counts();
    report.run.started = run_started;
    report.run.workload = description;
    report.run.constructed = [
        (Kind::New, new),
        (Kind::Repeat, repeat),
        (Kind::Paraphrase, paraphrase),
    ]
    .into_iter()
    .collect();
    report.open_loop = open_loop;
    report.samples = samples;
    report
}

async fn closed_loop(
    client: &reqwest::Client,
    config: &Arc<BenchConfig>,
    workload: &Arc<Mutex<Workload>>,
    progress: &Progress,
) -> Vec<Sample> {
    let deadline = Instant::now() + config.max_duration;
    let mut workers = Vec::new();
    for _ in 0..config.concurrency.max(1) {
        let (client, config, workload, progress) = (
            client.clone(),
            config.clone(),
            workload.clone(),
            progress.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                // Draw under the lock, so request indices follow the draw order.
                let next = {
                    let mut w = lock(&workload);
                    (w.drawn() < config.requests && Instant::now() < deadline)
                        .then(|| (w.drawn(), w.next_planned()))
                };
                let Some((index, planned)) = next else { break };
                // Alternate which target goes first, so neither always gets the warmer moment.
                let n = config.targets.len();
                for k in 0..n {
                    let target = (index + k) % n;
                    let sample = measure(&client, &config, target, index, &planned).await;
                    progress(Event::Done(&sample));
                    samples.push(sample);
                }
            }
            samples
        }));
    }
    let mut samples = Vec::new();
    for worker in workers {
        if let Ok(mut s) = worker.await {
            samples.append(&mut s);
        }
    }
    samples
}
