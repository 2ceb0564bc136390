//! Operator statistics: every finished request is counted here (by route and cache outcome, with its
//! phases and the prefill time a hit saved), for `GET /admin/stats` and the Prometheus text at
//! `GET /metrics`.
//!
//! Labels stay low-cardinality: route, cache outcome, phase and error kind only, never a prompt, a
//! key, a model or a tenant. Percentiles in `/admin/stats` are exact over the recent-requests window;
//! counters and histograms cover the whole life of the process.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// The bodies `/admin/stats` is built from are the wire contract's, shared with the client.
pub(crate) use reprise_wire::{
    GuardRefusals, Overlap, Rates, RequestCounts, Timeline, TimelineBucket, TtftHistogram,
    TtftSaved, UpstreamErrors,
};
pub(crate) use reprise_wire::{OutcomeLatency, Summary};
pub(crate) use reprise_wire::{Savings, TokensSaved};

/// The `by_namespace` key of requests without a namespace: not a valid namespace name, so it
/// cannot collide with one.
pub(crate) const NO_NAMESPACE: &str = "(none)";

use crate::guard::Guard;
use crate::ingress::{route_names, PASSTHROUGH};
use crate::lock::lock;
use crate::outcome::{CacheOutcome, Completion};
use crate::timing::unix_ms;
use crate::timing::{percentile, Phases};
use reprise_wire::RequestRecord;

/// Upper bounds (ms) of the TTFT histogram buckets; one more bucket counts what lies above.
pub(crate) const TTFT_BOUNDS_MS: [f64; 13] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
];
/// Phase-duration buckets (seconds) for Prometheus: 0.1 ms to 30 s.
const PHASE_BUCKETS_S: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 30.0,
];
/// Width and count of the hit-rate timeline buckets (ten minutes in all).
const TIMELINE_BUCKET_MS: u64 = 10_000;
const TIMELINE_BUCKETS: usize = 60;

/// Counters and histograms of the whole process, plus the Prometheus registry they live in.
pub struct Stats {
    started: Instant,
    counts: Mutex<Counts>,
    registry: Registry,
    requests: IntCounterVec,
    upstream_errors: IntCounterVec,
    ttft: HistogramVec,
    total: HistogramVec,
    phases: HistogramVec,
    ttft_saved: prometheus::Counter,
    /// Tokens hits did not send upstream, by route and kind (input, output), and their cost.
    tokens_saved: IntCounterVec,
    cost_saved: prometheus::CounterVec,
    embed_batch_size: Histogram,
    embed_batch_seconds: Histogram,
    embed_queue_wait: Histogram,
    embed_fallbacks: IntCounterVec,
    semantic_skipped: IntCounterVec,
    store_errors: IntCounterVec,
    /// Clean answers not stored, by reason (`too_large`).
    store_skipped: IntCounterVec,
    store_degraded: IntGauge,
    feed_behind: IntGauge,
    guard_refusals: IntCounterVec,
    overlap_races: IntCounterVec,
    replica_waits: IntCounterVec,
    /// Set at scrape time from the store and the index.
    entries: IntGauge,
    store_bytes: IntGauge,
    index_vectors: IntGauge,
    index_tombstones: IntGauge,
    index_graphs_pending: IntGauge,
}

/// One route's requests by cache outcome, and those that failed.
#[derive(Default)]
struct RouteCounts {
    by_cache: BTreeMap<CacheOutcome, u64>,
    total: u64,
    errors: u64,
}

/// The wire's request counts from counts by cache outcome: one mapping for the totals and for each
/// route, so a new outcome cannot be counted in one and forgotten in the other.
fn request_counts(
    by_cache: &BTreeMap<CacheOutcome, u64>,
    total: u64,
    errors: u64,
) -> RequestCounts {
    let get = |k: CacheOutcome| by_cache.get(&k).copied().unwrap_or(0);
    RequestCounts {
        total,
        hit: get(CacheOutcome::Hit),
        semantic_hit: get(CacheOutcome::SemanticHit),
        miss: get(CacheOutcome::Miss),
        coalesced: get(CacheOutcome::Coalesced),
        bypass: get(CacheOutcome::Bypass),
        refresh: get(CacheOutcome::Refresh),
        pass: get(CacheOutcome::Pass),
        errors,
    }
}

#[derive(Default)]
struct Counts {
    by_cache: BTreeMap<CacheOutcome, u64>,
    /// The same counts per route (`chat.completions`, `messages`, …), for the dashboard's table.
    by_route: BTreeMap<String, RouteCounts>,
    /// Misses raced against their semantic search (`semantic_overlap`): hits found first, and
    /// upstream answers that came first.
    overlap_semantic_first: u64,
    overlap_upstream_first: u64,
    total: u64,
    errors: u64,
    upstream_errors: BTreeMap<&'static str, u64>,
    guard_refusals: BTreeMap<&'static str, u64>,
    ttft_saved_ms: f64,
    ttft_saved_hits: u64,
    /// TTFT bucket counts by served outcome (index `i` counts TTFT <= `TTFT_BOUNDS_MS[i]`, the
    /// last counts the rest).
    ttft_buckets: BTreeMap<CacheOutcome, [u64; TTFT_BOUNDS_MS.len() + 1]>,
    timeline: VecDeque<TimelineBucket>,
    /// Tokens and money hits saved, and shadow mode's would-be hits (judge and prices are the
    /// admin route's to add).
    savings: Savings,
}

/// Which upstream failure a finished request shows, if any.
fn upstream_error_kind(record: &RequestRecord) -> Option<&'static str> {
    match record.completion {
        Completion::UpstreamError => Some("status"),
        Completion::StreamFailed => Some("stream"),
        // The gateway's own errors name their cause; only these three are the upstream's doing.
        Completion::GatewayError => match record.error.as_deref() {
            Some("upstream_unreachable") => Some("connect"),
            Some("upstream_timeout") => Some("timeout"),
            // Not valid HTTP: a malformed head, or closed before the response was complete.
            Some("upstream_protocol_error") => Some("protocol"),
            // Broke off or was malformed before the first event.
            Some("upstream_invalid_response") => Some("stream"),
            _ => None,
        },
        Completion::Complete | Completion::ClientDisconnected => None,
    }
}

/// The phases a Prometheus histogram is kept for, with their values.
fn phase_values(p: &Phases) -> [(&'static str, Option<f64>); 8] {
    [
        ("ingress", p.ingress_ms),
        ("lookup", p.lookup_ms),
        ("embed", p.embed_ms),
        ("search", p.search_ms),
        ("upstream_send", p.upstream_send_ms),
        ("ttft", p.ttft_ms),
        ("decode", p.decode_ms),
        ("downstream", p.downstream_ms),
    ]
}

impl Default for Stats {
    fn default() -> Self {
        Self::new()
    }
}

impl Stats {
    pub fn new() -> Self {
        let registry = Registry::new();
        let seconds = |name: &str, help: &str, labels: &[&str]| {
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(PHASE_BUCKETS_S.to_vec()),
                labels,
            )
        };
        // The metric definitions are constants: a failure here is a programming error caught by
        // the tests, so fall back to an unregistered metric rather than take the gateway down.
        let requests = IntCounterVec::new(
            Opts::new(
                "reprise_requests_total",
                "Finished requests by route and cache outcome.",
            ),
            &["route", "cache"],
        );
        let upstream_errors = IntCounterVec::new(
            Opts::new(
                "reprise_upstream_errors_total",
                "Requests the upstream failed, by kind (connect, timeout, protocol, status, stream).",
            ),
            &["kind"],
        );
        let guard_refusals = IntCounterVec::new(
            Opts::new(
                "reprise_semantic_guard_refusals_total",
                "Semantic lookups left without a match because a guard (numbers, negation, format, task, direction, antonym, entity, template) refused a candidate above the threshold.",
            ),
            &["guard"],
        );
        let ttft = seconds(
            "reprise_ttft_seconds",
            "Time to first token as the gateway delivered it, by route and cache outcome.",
            &["route", "cache"],
        );
        let total = seconds(
            "reprise_request_duration_seconds",
            "Arrival until the last byte left, by route and cache outcome.",
            &["route", "cache"],
        );
        let phases = seconds(
            "reprise_phase_seconds",
            "Duration of each request phase, by cache outcome.",
            &["phase", "cache"],
        );
        let stats = Self {
            started: Instant::now(),
            counts: Mutex::new(Counts::default()),
            requests: requests.unwrap_or_else(unreachable_metric),
            upstream_errors: upstream_errors.unwrap_or_else(unreachable_metric),
            guard_refusals: guard_refusals.unwrap_or_else(unreachable_metric),
            overlap_races: IntCounterVec::new(
                Opts::new(
                    "reprise_semantic_overlap_total",
                    "Misses whose semantic search raced the upstream request (semantic_overlap), by which finished first: semantic (a hit served, the upstream request cancelled) or upstream.",
                ),
                &["first"],
            )
            .unwrap_or_else(unreachable_metric),
            replica_waits: IntCounterVec::new(
                Opts::new(
                    "reprise_replica_flight_waits_total",
                    "Misses that waited for another replica asking the upstream for the same key (single flight across replicas), by how the wait ended: answered (its stored answer served), lapsed (its claim went without an answer: this request went upstream), gave_up (waited too long).",
                ),
                &["result"],
            )
            .unwrap_or_else(unreachable_metric),
            ttft: ttft.unwrap_or_else(unreachable_metric),
            total: total.unwrap_or_else(unreachable_metric),
            phases: phases.unwrap_or_else(unreachable_metric),
            ttft_saved: prometheus::Counter::new(
                "reprise_ttft_saved_seconds_total",
                "Upstream network and prefill time that hits did not wait for.",
            )
            .unwrap_or_else(unreachable_metric),
            tokens_saved: IntCounterVec::new(
                Opts::new(
                    "reprise_tokens_saved_total",
                    "Tokens hits did not send upstream (their entries' usage), by route and kind (input, output).",
                ),
                &["route", "kind"],
            )
            .unwrap_or_else(unreachable_metric),
            cost_saved: prometheus::CounterVec::new(
                Opts::new(
                    "reprise_cost_saved_total",
                    "US dollars hits saved at the price table's rates (hits of unpriced models add nothing), by route.",
                ),
                &["route"],
            )
            .unwrap_or_else(unreachable_metric),
            embed_batch_size: Histogram::with_opts(
                HistogramOpts::new(
                    "reprise_embedding_batch_size",
                    "Texts per embedding model call.",
                )
                .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
            )
            .unwrap_or_else(unreachable_metric),
            embed_batch_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "reprise_embedding_batch_seconds",
                    "Model time per embedding batch.",
                )
                .buckets(PHASE_BUCKETS_S.to_vec()),
            )
            .unwrap_or_else(unreachable_metric),
            // Fine buckets: admission keeps this wait within `embed_max_wait_ms` (a few ms), and
            // the point of the histogram is to check that claim.
            embed_queue_wait: Histogram::with_opts(
                HistogramOpts::new(
                    "reprise_embedding_queue_wait_seconds",
                    "Time a request's text waited between its embedding call and the start of its model call.",
                )
                .buckets(vec![
                    0.000_5, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                ]),
            )
            .unwrap_or_else(unreachable_metric),
            embed_fallbacks: IntCounterVec::new(
                Opts::new(
                    "reprise_embedding_fallbacks_total",
                    "Requests that fell back to exact matching, by reason: overload (refused at once), deadline, failed (the embedding), scan_busy (every core scanning partitions that await their graph).",
                ),
                &["reason"],
            )
            .unwrap_or_else(unreachable_metric),
            semantic_skipped: IntCounterVec::new(
                Opts::new(
                    "reprise_semantic_skipped_total",
                    "Lookups that skipped semantic matching (exact only, `x-reprise-semantic: skipped`), by reason: overload, deadline, failed, scan_busy.",
                ),
                &["reason"],
            )
            .unwrap_or_else(unreachable_metric),
            store_errors: IntCounterVec::new(
                Opts::new(
                    "reprise_store_errors_total",
                    "Store operations that failed (I/O error, Redis timeout or refusal), were skipped while the store was degraded (each a lookup that missed or a write dropped), or were given up at their deadline on the request path (timed_out: a lookup that missed).",
                ),
                &["kind"],
            )
            .unwrap_or_else(unreachable_metric),
            store_skipped: IntCounterVec::new(
                Opts::new(
                    "reprise_store_skipped_total",
                    "Clean answers relayed but not stored, by reason (too_large: over max_entry_bytes).",
                ),
                &["reason"],
            )
            .unwrap_or_else(unreachable_metric),
            store_degraded: gauge(
                "reprise_store_degraded",
                "1 while the store is degraded (serving without caching), else 0.",
            ),
            feed_behind: gauge(
                "reprise_feed_behind_ms",
                "How far behind the shared store's change feed this replica is (0 when caught up; --store redis only).",
            ),
            entries: gauge("reprise_cache_entries", "Entries in the store."),
            store_bytes: gauge("reprise_store_bytes", "Encoded size of all stored entries."),
            index_vectors: gauge(
                "reprise_index_vectors",
                "Live vectors in the semantic index.",
            ),
            index_tombstones: gauge(
                "reprise_index_tombstones",
                "Index points of removed or replaced vectors, until the next rebuild.",
            ),
            index_graphs_pending: gauge(
                "reprise_index_graphs_pending",
                "Index partitions searched without a graph (past 32,768 rows by their rows' sketches, scanned exactly below) until their graph is built (after a rebuild from the store).",
            ),
            registry,
        };
        // Every route's outcomes start at 0 rather than appearing with their first request:
        // Prometheus takes a series' first sample as its baseline, so `increase()` over a window in
        // which a series appeared loses the counts of its first scrape, and the dashboard's hit rate
        // after a restart (the first misses uncounted) reads too high.
        for route in route_names() {
            for cache in CacheOutcome::ALL {
                stats.requests.with_label_values(&[route, cache.as_str()]);
            }
        }
        stats
            .requests
            .with_label_values(&[PASSTHROUGH, CacheOutcome::Pass.as_str()]);
        let collectors: [Box<dyn prometheus::core::Collector>; 21] = [
            Box::new(stats.store_errors.clone()),
            Box::new(stats.store_skipped.clone()),
            Box::new(stats.store_degraded.clone()),
            Box::new(stats.feed_behind.clone()),
            Box::new(stats.overlap_races.clone()),
            Box::new(stats.requests.clone()),
            Box::new(stats.upstream_errors.clone()),
            Box::new(stats.ttft.clone()),
            Box::new(stats.total.clone()),
            Box::new(stats.phases.clone()),
            Box::new(stats.ttft_saved.clone()),
            Box::new(stats.embed_batch_size.clone()),
            Box::new(stats.embed_batch_seconds.clone()),
            Box::new(stats.embed_queue_wait.clone()),
            Box::new(stats.embed_fallbacks.clone()),
            Box::new(stats.guard_refusals.clone()),
            Box::new(stats.entries.clone()),
            Box::new(stats.store_bytes.clone()),
            Box::new(stats.index_vectors.clone()),
            Box::new(stats.index_tombstones.clone()),
            Box::new(stats.index_graphs_pending.clone()),
        ];
        for c in collectors {
            if let Err(err) = stats.registry.register(c) {
                tracing::error!(error = %err, "registering a metric failed");
            }
        }
        stats.register(Box::new(stats.replica_waits.clone()));
        stats.register(Box::new(stats.tokens_saved.clone()));
        stats.register(Box::new(stats.cost_saved.clone()));
        stats.register(Box::new(stats.semantic_skipped.clone()));
        stats
    }

    /// Creates the `reprise_semantic_skipped_total` series of every reason the semantic stage
    /// names (its owner passes them, so this floor does not import it): a dashboard's rate of a
    /// series that appears late is wrong.
    pub fn declare_skip_reasons(&self, reasons: &[&'static str]) {
        for reason in reasons {
            self.semantic_skipped.with_label_values(&[reason]);
        }
    }

    /// Adds metrics kept elsewhere (the connection counters of [`crate::serve`]).
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) {
        if let Err(err) = self.registry.register(collector) {
            tracing::error!(error = %err, "registering a metric failed");
        }
    }

    /// Counts one finished request.
    pub fn observe(&self, record: &RequestRecord) {
        let cache = record.cache.as_str();
        let route = record.route.as_str();
        self.requests.with_label_values(&[route, cache]).inc();
        let kind = upstream_error_kind(record);
        if let Some(kind) = kind {
            self.upstream_errors.with_label_values(&[kind]).inc();
        }
        if let Some(reason) = &record.semantic_skipped {
            self.semantic_skipped.with_label_values(&[reason]).inc();
        }
        // Only the request that recorded the answer says so (a coalesced follower's is not counted).
        if let Some(reason) = record
            .store_skipped
            .as_deref()
            .filter(|_| record.cache != CacheOutcome::Coalesced)
        {
            self.store_skipped.with_label_values(&[reason]).inc();
        }
        let p = &record.phases;
        let served = CacheOutcome::SERVED
            .contains(&record.cache)
            .then_some(record.cache);
        let complete = record.completion == Completion::Complete;
        // Latency of failed or abandoned requests would blur the picture of what users wait for.
        if complete {
            if let Some(ttft) = p.ttft_ms {
                self.ttft
                    .with_label_values(&[route, cache])
                    .observe(ttft / 1e3);
            }
            self.total
                .with_label_values(&[route, cache])
                .observe(p.total_ms / 1e3);
            for (phase, value) in phase_values(p) {
                if let Some(ms) = value {
                    self.phases
                        .with_label_values(&[phase, cache])
                        .observe(ms / 1e3);
                }
            }
        }
        if let Some(saved) = record.ttft_saved_ms {
            self.ttft_saved.inc_by(saved / 1e3);
        }
        if let Some(saved) = &record.saved {
            for (kind, n) in [
                ("input", saved.input_tokens),
                ("output", saved.output_tokens),
            ] {
                self.tokens_saved
                    .with_label_values(&[route, kind])
                    .inc_by(n);
            }
            // Created at the first hit even when unpriced, so a route's series exists with its tokens.
            let cost = self.cost_saved.with_label_values(&[route]);
            if let Some(usd) = saved.cost_usd {
                cost.inc_by(usd);
            }
        }

        let now = unix_ms();
        let mut counts = lock(&self.counts);
        counts.total += 1;
        *counts.by_cache.entry(record.cache).or_default() += 1;
        let failed = !matches!(
            record.completion,
            Completion::Complete | Completion::ClientDisconnected
        );
        if failed {
            counts.errors += 1;
        }
        let by_route = counts.by_route.entry(record.route.clone()).or_default();
        by_route.total += 1;
        by_route.errors += u64::from(failed);
        *by_route.by_cache.entry(record.cache).or_default() += 1;
        if let Some(kind) = kind {
            *counts.upstream_errors.entry(kind).or_default() += 1;
        }
        if let Some(saved) = record.ttft_saved_ms {
            counts.ttft_saved_ms += saved;
            counts.ttft_saved_hits += 1;
        }
        if let Some(saved) = &record.saved {
            let s = &mut counts.savings;
            s.total.add(saved);
            s.by_route.entry(route.to_owned()).or_default().add(saved);
            let model = record.model.as_deref().unwrap_or("");
            s.by_model.entry(model.to_owned()).or_default().add(saved);
            let namespace = record.namespace.as_deref().unwrap_or(NO_NAMESPACE);
            s.by_namespace
                .entry(namespace.to_owned())
                .or_default()
                .add(saved);
        }
        if let (Some(outcome), Some(ttft), true) = (served, p.ttft_ms, complete) {
            let slot = TTFT_BOUNDS_MS
                .iter()
                .position(|b| ttft <= *b)
                .unwrap_or(TTFT_BOUNDS_MS.len());
            counts.ttft_buckets.entry(outcome).or_default()[slot] += 1;
        }
        let start_ms = now - now % TIMELINE_BUCKET_MS;
        if counts.timeline.back().map(|b| b.start_ms) != Some(start_ms) {
            counts.timeline.push_back(TimelineBucket {
                start_ms,
                ..TimelineBucket::default()
            });
            trim_timeline(&mut counts.timeline, now);
        }
        if let Some(bucket) = counts.timeline.back_mut() {
            match record.cache {
                CacheOutcome::Hit => bucket.hit += 1,
                CacheOutcome::SemanticHit => bucket.semantic_hit += 1,
                CacheOutcome::Miss => bucket.miss += 1,
                CacheOutcome::Coalesced => bucket.coalesced += 1,
                CacheOutcome::Bypass | CacheOutcome::Refresh => bucket.bypass += 1,
                CacheOutcome::Pass => {}
            }
        }
    }

    /// Counts what a shadowed request's would-be hit would have saved.
    pub fn shadow_saved(&self, saved: &TokensSaved) {
        lock(&self.counts).savings.shadow.add(saved);
    }

    /// Tokens and money saved since start: hits by route, model and namespace, and shadow mode's
    /// would-be hits. The judge's cost, the net and the price table are the caller's to fill in.
    pub fn savings(&self) -> Savings {
        lock(&self.counts).savings.clone()
    }

    /// Counts a miss whose semantic search raced its upstream request: `semantic_first` when a hit
    /// was found before the upstream's first byte (and served, the upstream request cancelled).
    pub fn overlap(&self, semantic_first: bool) {
        let winner = if semantic_first {
            "semantic"
        } else {
            "upstream"
        };
        self.overlap_races.with_label_values(&[winner]).inc();
        let mut counts = lock(&self.counts);
        if semantic_first {
            counts.overlap_semantic_first += 1;
        } else {
            counts.overlap_upstream_first += 1;
        }
    }

    /// Counts a miss that waited for another replica's answer, by how the wait ended (`answered`,
    /// `lapsed`, `gave_up`: see [`crate::cache::remote::WaitEnd`]).
    pub fn replica_wait(&self, result: &'static str) {
        self.replica_waits.with_label_values(&[result]).inc();
    }

    /// Counts a semantic lookup that a literal guard left without a match (a candidate above the
    /// threshold was refused, and no other was served).
    pub fn guard_refused(&self, guard: Guard) {
        self.guard_refusals.with_label_values(&[guard.name()]).inc();
        *lock(&self.counts)
            .guard_refusals
            .entry(guard.name())
            .or_default() += 1;
    }

    /// Hooks the embedder's batches into the histograms.
    pub fn embed_observer(&self) -> crate::embed::BatchObserver {
        let (size, seconds) = (
            self.embed_batch_size.clone(),
            self.embed_batch_seconds.clone(),
        );
        Box::new(move |n: usize, took: Duration| {
            size.observe(n as f64);
            seconds.observe(took.as_secs_f64());
        })
    }

    /// Hooks the embedder's queue waits into their histogram.
    pub fn embed_wait_observer(&self) -> crate::embed::WaitObserver {
        let waited = self.embed_queue_wait.clone();
        Box::new(move |took: Duration| waited.observe(took.as_secs_f64()))
    }

    pub fn uptime_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The Prometheus text exposition, after setting the gauges from `now`.
    pub fn render_prometheus(&self, now: &Gauges) -> String {
        self.entries.set(now.entries as i64);
        self.store_bytes.set(now.store_bytes as i64);
        self.index_vectors.set(now.index_vectors as i64);
        self.index_tombstones.set(now.index_tombstones as i64);
        self.index_graphs_pending
            .set(now.index_graphs_pending as i64);
        self.store_degraded.set(i64::from(now.store_degraded));
        self.feed_behind.set(now.feed_behind_ms as i64);
        // The embedder counts fallbacks itself; the counter catches up to it (never goes back).
        // Under the counts lock, so two scrapes at once cannot both add the same difference.
        {
            let _catching_up = lock(&self.counts);
            for &(kind, count) in &now.store_errors {
                let counter = self.store_errors.with_label_values(&[kind]);
                let seen = counter.get();
                if count > seen {
                    counter.inc_by(count - seen);
                }
            }
            for &(reason, count) in &now.embed_fallbacks {
                let counter = self.embed_fallbacks.with_label_values(&[reason]);
                let seen = counter.get();
                if count > seen {
                    counter.inc_by(count - seen);
                }
            }
        }
        let mut out = Vec::new();
        if let Err(err) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %err, "encoding metrics failed");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// Counts and rates since start, the TTFT histogram and the timeline.
    pub fn totals(&self) -> Totals {
        let mut counts = lock(&self.counts);
        trim_timeline(&mut counts.timeline, unix_ms());
        let requests = request_counts(&counts.by_cache, counts.total, counts.errors);
        let by_route = counts
            .by_route
            .iter()
            .map(|(route, c)| {
                (
                    route.clone(),
                    request_counts(&c.by_cache, c.total, c.errors),
                )
            })
            .collect();
        let err = |k: &str| counts.upstream_errors.get(k).copied().unwrap_or(0);
        let refused = |g: Guard| counts.guard_refusals.get(g.name()).copied().unwrap_or(0);
        Totals {
            by_route,
            rates: Rates::of(&requests),
            requests,
            ttft_saved_ms: TtftSaved {
                total: counts.ttft_saved_ms,
                per_hit: (counts.ttft_saved_hits > 0)
                    .then(|| counts.ttft_saved_ms / counts.ttft_saved_hits as f64),
                hits: counts.ttft_saved_hits,
            },
            upstream_errors: UpstreamErrors {
                connect: err("connect"),
                timeout: err("timeout"),
                protocol: err("protocol"),
                status: err("status"),
                stream: err("stream"),
            },
            overlap: Overlap {
                semantic_first: counts.overlap_semantic_first,
                upstream_first: counts.overlap_upstream_first,
            },
            guard_refusals: GuardRefusals {
                numbers: refused(Guard::Numbers),
                negation: refused(Guard::Negation),
                format: refused(Guard::Format),
                task: refused(Guard::Task),
                direction: refused(Guard::Direction),
                antonym: refused(Guard::Antonym),
                entity: refused(Guard::Entity),
                template: refused(Guard::Template),
            },
            ttft_histogram: TtftHistogram {
                bounds_ms: TTFT_BOUNDS_MS.to_vec(),
                by_outcome: counts
                    .ttft_buckets
                    .iter()
                    .map(|(k, v)| (k.as_str().to_owned(), v.to_vec()))
                    .collect(),
            },
            timeline: Timeline {
                bucket_s: TIMELINE_BUCKET_MS / 1000,
                buckets: counts.timeline.iter().cloned().collect(),
            },
        }
    }
}

/// Keeps the buckets of the last ten minutes only (an idle gateway has none).
fn trim_timeline(timeline: &mut VecDeque<TimelineBucket>, now_ms: u64) {
    let oldest = now_ms.saturating_sub(TIMELINE_BUCKET_MS * TIMELINE_BUCKETS as u64);
    while timeline.front().is_some_and(|b| b.start_ms < oldest) {
        timeline.pop_front();
    }
}

fn gauge(name: &str, help: &str) -> IntGauge {
    IntGauge::new(name, help).unwrap_or_else(unreachable_metric)
}

/// Metric constructors only fail on invalid names or labels, which are constants here.
fn unreachable_metric<T>(err: prometheus::Error) -> T {
    panic!("invalid metric definition: {err}")
}

/// Values read from the store, the index and the embedder when metrics are rendered.
#[derive(Debug, Default)]
pub struct Gauges {
    pub entries: u64,
    pub store_bytes: u64,
    pub index_vectors: u64,
    pub index_tombstones: u64,
    pub index_graphs_pending: u64,
    /// Semantic lookups that fell back to exact matching, by reason (`overload`, `deadline`,
    /// `failed`, `scan_busy`), as the semantic stage counts them.
    pub embed_fallbacks: Vec<(&'static str, u64)>,
    /// Store operations that did not reach the store, by kind (`failed`, `skipped`, `timed_out`).
    pub store_errors: Vec<(&'static str, u64)>,
    pub store_degraded: bool,
    pub feed_behind_ms: u64,
}

/// Everything the counters know, for `/admin/stats`.
#[derive(Debug, Clone)]
pub struct Totals {
    pub overlap: Overlap,
    pub requests: RequestCounts,
    /// `requests` per route name.
    pub by_route: BTreeMap<String, RequestCounts>,
    pub rates: Rates,
    pub ttft_saved_ms: TtftSaved,
    pub upstream_errors: UpstreamErrors,
    pub guard_refusals: GuardRefusals,
    pub ttft_histogram: TtftHistogram,
    pub timeline: Timeline,
}

/// p50/p90/p99 and the mean of `samples`; `None` for no samples.
fn summary(samples: &[f64]) -> Option<Summary> {
    Some(Summary {
        p50: percentile(samples, 0.50)?,
        p90: percentile(samples, 0.90)?,
        p99: percentile(samples, 0.99)?,
        mean: samples.iter().sum::<f64>() / samples.len() as f64,
    })
}

/// Per-outcome phase percentiles of the complete requests among `records`.
pub(crate) fn latency_by_outcome(records: &[RequestRecord]) -> BTreeMap<String, OutcomeLatency> {
    let mut out = BTreeMap::new();
    for outcome in CacheOutcome::SERVED {
        let mine: Vec<&Phases> = records
            .iter()
            .filter(|r| r.cache == outcome && r.completion == Completion::Complete)
            .map(|r| &r.phases)
            .collect();
        if mine.is_empty() {
            continue;
        }
        // One column of samples per phase, in `phase_values` order.
        let mut columns: Vec<(&str, Vec<f64>)> = phase_values(&Phases::default())
            .into_iter()
            .map(|(name, _)| (name, Vec::with_capacity(mine.len())))
            .collect();
        for p in &mine {
            for (column, (_, value)) in columns.iter_mut().zip(phase_values(p)) {
                column.1.extend(value);
            }
        }
        let mut phases: BTreeMap<String, Option<Summary>> = columns
            .into_iter()
            .map(|(name, samples)| (format!("{name}_ms"), summary(&samples)))
            .collect();
        let totals: Vec<f64> = mine.iter().map(|p| p.total_ms).collect();
        phases.insert("total_ms".to_owned(), summary(&totals));
        out.insert(
            outcome.as_str().to_owned(),
            OutcomeLatency {
                count: mine.len(),
                phases,
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(cache: &str, completion: Completion, status: u16, ttft: f64) -> RequestRecord {
        RequestRecord {
            id: "req".into(),
            started_at_ms: 0,
            method: "POST".into(),
            route: "chat.completions".into(),
            model: Some("m".into()),
            stream: true,
            status,
            cache: cache.parse().expect("an outcome"),
            completion,
            phases: Phases {
                ttft_ms: Some(ttft),
                total_ms: ttft * 2.0,
                ..Phases::default()
            },
            entry: None,
            similarity: None,
            nearest: None,
            guard: None,
            semantic_skipped: None,
            ttft_saved_ms: (cache == "hit").then_some(400.0),
            error: (completion == Completion::GatewayError).then(|| match status {
                504 => "upstream_timeout".to_owned(),
                _ => "upstream_unreachable".to_owned(),
            }),
            store_skipped: None,
            namespace: None,
            saved: None,
        }
    }

    #[test]
    fn counts_rates_savings_and_errors() {
        let stats = Stats::new();
        for _ in 0..3 {
            stats.observe(&record("hit", Completion::Complete, 200, 0.4));
        }
        stats.observe(&record("miss", Completion::Complete, 200, 410.0));
        stats.observe(&record("miss", Completion::UpstreamError, 500, 5.0));
        stats.observe(&record("miss", Completion::GatewayError, 504, 0.0));
        stats.observe(&record("pass", Completion::Complete, 200, 1.0));
        let t = stats.totals();
        assert_eq!(
            (t.requests.total, t.requests.hit, t.requests.miss),
            (7, 3, 3)
        );
        assert_eq!(t.requests.pass, 1);
        assert_eq!(t.requests.errors, 2);
        assert_eq!(
            (t.upstream_errors.status, t.upstream_errors.timeout),
            (1, 1)
        );
        // Passthrough requests are not cacheable: 3 hits of 6.
        assert!((t.rates.hit - 0.5).abs() < 1e-9);
        assert!((t.ttft_saved_ms.total - 1200.0).abs() < 1e-9);
        assert_eq!(t.ttft_saved_ms.per_hit, Some(400.0));
        // Only complete requests enter the TTFT histogram: 0.4 ms is in the first bucket.
        assert_eq!(t.ttft_histogram.by_outcome["hit"][0], 3);
        assert_eq!(t.ttft_histogram.by_outcome["miss"].iter().sum::<u64>(), 1);
        assert_eq!(t.ttft_histogram.by_outcome["miss"][9], 1, "410 ms <= 500");
        let bucket = t.timeline.buckets.last().expect("a bucket");
        assert_eq!((bucket.hit, bucket.miss), (3, 3));
    }

    #[test]
    fn upstream_errors_are_told_apart_by_the_error_code() {
        let stats = Stats::new();
        let mut broke = record("miss", Completion::GatewayError, 502, 0.0);
        broke.error = Some("upstream_invalid_response".into());
        stats.observe(&broke);
        let mut garbled = record("miss", Completion::GatewayError, 502, 0.0);
        garbled.error = Some("upstream_protocol_error".into());
        stats.observe(&garbled);
        stats.observe(&record("miss", Completion::GatewayError, 502, 0.0));
        let mut own = record("miss", Completion::GatewayError, 400, 0.0);
        own.error = Some("invalid_request".into());
        stats.observe(&own);
        let e = stats.totals().upstream_errors;
        assert_eq!(
            (e.connect, e.protocol, e.stream, e.timeout, e.status),
            (1, 1, 1, 0, 0)
        );
    }

    #[test]
    fn the_timeline_keeps_ten_minutes() {
        let mut timeline: VecDeque<TimelineBucket> = [0u64, 500_000, 590_000, 600_000]
            .into_iter()
            .map(|start_ms| TimelineBucket {
                start_ms,
                ..TimelineBucket::default()
            })
            .collect();
        trim_timeline(&mut timeline, 1_150_000);
        let starts: Vec<u64> = timeline.iter().map(|b| b.start_ms).collect();
        assert_eq!(starts, [590_000, 600_000]);
        trim_timeline(&mut timeline, 10_000_000);
        assert!(timeline.is_empty(), "an idle gateway shows no old traffic");
    }

    #[test]
    fn every_route_and_outcome_is_exported_at_zero_before_any_request() {
        let text = Stats::new().render_prometheus(&Gauges::default());
        for (route, cache) in [
            ("messages", "miss"),
            ("chat.completions", "semantic-hit"),
            ("passthrough", "pass"),
        ] {
            let series = format!("reprise_requests_total{{cache=\"{cache}\",route=\"{route}\"}} 0");
            assert!(text.contains(&series), "{series} missing from {text}");
        }
        let series = text.matches("reprise_requests_total{").count();
        assert_eq!(series, route_names().len() * CacheOutcome::ALL.len() + 1);
    }

    #[test]
    fn prometheus_text_has_the_counters() {
        let stats = Stats::new();
        stats.observe(&record("hit", Completion::Complete, 200, 0.4));
        stats.observe(&record("miss", Completion::StreamFailed, 200, 9.0));
        let text = stats.render_prometheus(&Gauges {
            entries: 7,
            ..Gauges::default()
        });
        assert!(text.contains("reprise_requests_total{cache=\"hit\",route=\"chat.completions\"} 1"));
        assert!(text.contains("reprise_upstream_errors_total{kind=\"stream\"} 1"));
        assert!(text.contains("reprise_cache_entries 7"));
        assert!(text.contains("reprise_ttft_saved_seconds_total 0.4"));
        assert!(
            text.contains("reprise_ttft_seconds_count{cache=\"hit\",route=\"chat.completions\"} 1")
        );
    }

    #[test]
    fn savings_are_summed_by_route_model_and_namespace_and_exported() {
        let stats = Stats::new();
        let saved = |input, output, cost| TokensSaved {
            input_tokens: input,
            output_tokens: output,
            source: reprise_wire::TokenSource::Reported,
            tokenizer: None,
            cost_usd: cost,
        };
        let mut hit = record("hit", Completion::Complete, 200, 0.4);
        hit.saved = Some(saved(100, 20, Some(0.25)));
        hit.namespace = Some("support".into());
        stats.observe(&hit);
        let mut unpriced = record("hit", Completion::Complete, 200, 0.4);
        unpriced.route = "messages".into();
        unpriced.saved = Some(saved(7, 3, None));
        stats.observe(&unpriced);
        stats.observe(&record("miss", Completion::Complete, 200, 9.0));
        stats.shadow_saved(&saved(1, 1, Some(0.5)));
        let s = stats.savings();
        assert_eq!(
            (s.total.hits, s.total.input_tokens, s.total.output_tokens),
            (2, 107, 23)
        );
        assert_eq!(s.total.unpriced, 1);
        assert!((s.total.cost_usd - 0.25).abs() < 1e-12);
        assert_eq!(s.by_route["messages"].input_tokens, 7);
        assert_eq!(s.by_namespace["support"].hits, 1);
        assert_eq!(s.by_namespace[NO_NAMESPACE].hits, 1);
        assert_eq!(s.by_model["m"].hits, 2);
        assert_eq!(s.shadow.hits, 1);
        let text = stats.render_prometheus(&Gauges::default());
        assert!(text
            .contains("reprise_tokens_saved_total{kind=\"input\",route=\"chat.completions\"} 100"));
        assert!(text.contains("reprise_tokens_saved_total{kind=\"output\",route=\"messages\"} 3"));
        assert!(text.contains("reprise_cost_saved_total{route=\"chat.completions\"} 0.25"));
        // An unpriced route has its tokens and a cost series that stays at zero.
        assert!(text.contains("reprise_cost_saved_total{route=\"messages\"} 0"));
    }

    #[test]
    fn latency_is_summarized_per_outcome() {
        let records: Vec<RequestRecord> = (1..=100)
            .map(|i| record("miss", Completion::Complete, 200, i as f64))
            .chain([record("hit", Completion::ClientDisconnected, 200, 1.0)])
            .collect();
        let by = latency_by_outcome(&records);
        assert!(!by.contains_key("hit"), "incomplete requests are left out");
        let miss = &by["miss"];
        assert_eq!(miss.count, 100);
        let ttft = miss.phases["ttft_ms"].as_ref().expect("ttft");
        assert_eq!((ttft.p50, ttft.p90, ttft.p99), (50.0, 90.0, 99.0));
        assert!((ttft.mean - 50.5).abs() < 1e-9);
        assert!(miss.phases["embed_ms"].is_none());
    }
}
