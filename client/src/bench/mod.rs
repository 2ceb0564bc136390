//! The benchmark driver: sends chat completions (or, with `--api anthropic`, Messages API requests)
//! to one or two base URLs and measures what an application feels (client-side time to first
//! token, inter-token gaps, total time), along with what the gateway says about each request
//! (cache outcome, TTFT saved, its phase timing).
//!
//! Closed loop (a fixed number of workers, each sending its next request when the last one is
//! done) or open loop (arrivals on a fixed schedule whatever the responses do, see `openloop`).
//! With a second URL (`--compare`) every request is sent to both, so the two are measured side by
//! side in one run on the same machine state; the report then gives each one's percentiles, the
//! paired differences (e.g. the gateway's added latency) and the ratios.
//!
//! One file per concept, in the order a run goes: [`config`] (what to send), [`prompts`] (what a
//! request says), [`http`] (sending one and measuring it into a [`sample`]), [`runner`] (closed and
//! open loop), [`summary`] (percentiles, outcomes, the report), [`table`] (the terminal table);
//! beside them the workloads, the phase timing, the Markdown report and its charts.

pub mod chart;
pub mod cli;
pub mod config;
pub mod http;
pub mod openloop;
pub mod paraphrase;
pub mod prompts;
pub mod report;
pub mod runner;
pub mod sample;
pub mod summary;
pub mod table;
pub mod timing;
pub mod workload;

pub use config::{base_url, Api, BenchConfig};
pub use http::measure;
pub use runner::{run, Event, Progress};
pub use sample::{outcome_of, skipped_reason, Sample};
pub use summary::{
    percentile, ratio, summarize, Comparison, HitRates, OutcomeSummary, Percentiles, Report,
    RunInfo, TargetSummary,
};
pub(crate) use table::fmt_ms;
pub use table::{render, skipped_line};

// The word list and generated prompts are the workloads' too (`super::WORDS` there).
use prompts::{generated_prompt, WORDS};

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::workload::Kind;
    use super::*;

    pub(crate) fn sample(target: usize, index: usize, ttft: f64, outcome: &str) -> Sample {
        let mut s = Sample::new(target, index, Kind::New);
        s.status = 200;
        s.outcome = outcome.to_owned();
        s.ttft_ms = Some(ttft);
        s.total_ms = ttft + 10.0;
        s.tokens = 3;
        s
    }

    pub(crate) fn test_config(targets: &[&str]) -> BenchConfig {
        BenchConfig {
            targets: targets.iter().map(|t| (*t).to_owned()).collect(),
            round_robin: Vec::new(),
            api: Api::Openai,
            api_key: String::new(),
            model: "m".into(),
            requests: 4,
            concurrency: 1,
            rate: None,
            arrivals: openloop::Arrivals::Uniform,
            seed: 1,
            max_in_flight: 8,
            stream: true,
            warmup: 0,
            run_id: "t".into(),
            max_duration: Duration::from_secs(1),
            namespace: None,
        }
    }
}
