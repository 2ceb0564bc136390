//! When the Redis store reads its whole registry again (a recount), and what it reports between
//! two: the pacing behind `RedisStore`'s sweep, kept apart from the Redis calls so it can be tested
//! without a server.
//!
//! A recount reads every registry row (`HSCAN`): it is how a replica learns of expired entries,
//! of entries orphaned by a dead writer, and of the size of what other replicas stored. At a
//! million rows that is about a second of Redis's single core and two to four seconds of the
//! replica's writer thread, so it is never done whole on the writer's routine sweeps: a routine
//! recount advances one time slice per sweep, and starts again [`RECOUNT_EVERY`] after the last
//! one finished. Between recounts the replica counts rows with `HLEN` (O(1), every replica's
//! writes included) and estimates bytes by the mean entry size the last recount found. Only a
//! cap exceeded by that estimate (or a replica that never counted) reads the registry whole at
//! once, and then evicts [`SLACK_PER_CAP`] below the caps, so a full cache recounts once per
//! hundredth of its cap written, not at every sweep.

use std::time::{Duration, Instant};

use super::ledger::Held;

/// Least time from the end of one routine recount to the start of the next.
pub(super) const RECOUNT_EVERY: Duration = Duration::from_secs(10);
/// What one routine sweep may spend reading the registry: the writer thread stores answers
/// between slices, and Redis serves every replica's other commands.
pub(super) const SLICE: Duration = Duration::from_millis(20);
/// An eviction frees this share of each cap beyond what the cap requires.
const SLACK_PER_CAP: u64 = 100;

/// A recount under way: where `HSCAN` goes on, and the rows read so far.
pub(super) struct Scan<R> {
    pub(super) cursor: u64,
    pub(super) rows: Vec<R>,
    /// The cursor came back to 0: every row present throughout was read.
    pub(super) done: bool,
}

impl<R> Default for Scan<R> {
    fn default() -> Self {
        Self {
            cursor: 0,
            rows: Vec::new(),
            done: false,
        }
    }
}

/// One replica's recounts: the one under way, and what the last one found.
pub(super) struct Recounts<R> {
    every: Duration,
    scan: Option<Scan<R>>,
    /// When the last recount finished and what it left; `None`: never counted.
    last: Option<(Instant, Held)>,
}

/// What a sweep must do with the registry now.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Read {
    /// Nothing: the last recount is recent, and no cap is exceeded.
    Nothing,
    /// One more slice of a routine recount.
    Slice,
    /// Read it to the end now (finishing the recount under way, if any): a cap is exceeded by
    /// the estimate, or this replica never counted.
    Whole,
}

impl<R> Recounts<R> {
    /// Routine recounts at least `every` apart.
    pub(super) fn new(every: Duration) -> Self {
        Self {
            every,
            scan: None,
            last: None,
        }
    }

    /// Entries and bytes held when the registry has `rows` rows: the rows themselves (those of
    /// expired entries count until a recount prunes them), and bytes at the mean size the last
    /// recount found. `None` when unknown: before the first recount, or rows again after one
    /// that found none (no mean size).
    pub(super) fn estimate(&self, rows: usize) -> Option<Held> {
        let (_, counted) = self.last?;
        let bytes = match (counted.len, rows) {
            (_, 0) => 0,
            (0, _) => return None,
            (n, rows) => (u128::from(counted.bytes) * rows as u128 / n as u128) as u64,
        };
        Some(Held { len: rows, bytes })
    }

    /// What the sweep must read, given the estimate of what is held and the caps.
    pub(super) fn read(&self, held: Option<Held>, max_entries: usize, max_bytes: u64) -> Read {
        let (Some((at, _)), Some(held)) = (self.last, held) else {
            return Read::Whole;
        };
        if held.over(max_entries, max_bytes) {
            Read::Whole
        } else if self.scan.is_some() || at.elapsed() >= self.every {
            Read::Slice
        } else {
            Read::Nothing
        }
    }

    /// The recount under way, begun now if none is.
    pub(super) fn scan(&mut self) -> &mut Scan<R> {
        self.scan.get_or_insert_with(Scan::default)
    }

    /// The rows of the recount under way once it has read them all, ending it.
    pub(super) fn take_done(&mut self) -> Option<Vec<R>> {
        if self.scan.as_ref().is_some_and(|scan| scan.done) {
            return self.scan.take().map(|scan| scan.rows);
        }
        None
    }

    /// A recount (a sweep's, or one read whole elsewhere) left `held`.
    pub(super) fn counted(&mut self, held: Held) {
        self.last = Some((Instant::now(), held));
    }
}

/// Where an eviction stops: [`SLACK_PER_CAP`] below each cap (the cap itself when that rounds
/// to nothing, as in a cap of a few entries).
pub(super) fn floor(max_entries: usize, max_bytes: u64) -> (usize, u64) {
    (
        max_entries - max_entries / SLACK_PER_CAP as usize,
        max_bytes - max_bytes / SLACK_PER_CAP,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(len: usize, bytes: u64) -> Held {
        Held { len, bytes }
    }

    #[test]
    fn a_replica_that_never_counted_reads_the_registry_whole() {
        let recounts: Recounts<u64> = Recounts::new(RECOUNT_EVERY);
        assert_eq!(recounts.estimate(5), None);
        assert_eq!(recounts.read(None, 100, u64::MAX), Read::Whole);
    }

    #[test]
    fn rows_written_since_the_recount_are_estimated_at_its_mean_size() {
        let mut recounts: Recounts<u64> = Recounts::new(RECOUNT_EVERY);
        recounts.counted(held(4, 4_000));
        let estimate = recounts.estimate(10).expect("counted");
        assert_eq!((estimate.len, estimate.bytes), (10, 10_000));
        // A recount of an empty registry gives no mean size: rows since are read whole.
        recounts.counted(held(0, 0));
        let estimate = recounts.estimate(0).expect("still empty");
        assert_eq!((estimate.len, estimate.bytes), (0, 0));
        assert_eq!(recounts.estimate(3), None);
        assert_eq!(recounts.read(None, 100, u64::MAX), Read::Whole);
    }

    #[test]
    fn a_recent_recount_is_not_repeated_until_a_cap_is_exceeded() {
        let mut recounts: Recounts<u64> = Recounts::new(RECOUNT_EVERY);
        recounts.counted(held(10, 1_000));
        let estimate = recounts.estimate(10);
        assert_eq!(recounts.read(estimate, 100, u64::MAX), Read::Nothing);
        // Other replicas' rows, by HLEN.
        let estimate = recounts.estimate(101);
        assert_eq!(recounts.read(estimate, 100, u64::MAX), Read::Whole);
        // The bytes cap, by the mean size.
        let estimate = recounts.estimate(30);
        assert_eq!(recounts.read(estimate, 100, 2_999), Read::Whole);
        assert_eq!(recounts.read(estimate, 100, 3_000), Read::Nothing);
    }

    #[test]
    fn a_routine_recount_goes_on_slice_by_slice_until_its_scan_is_done() {
        let mut recounts: Recounts<u64> = Recounts::new(Duration::ZERO);
        recounts.counted(held(2, 200));
        let estimate = recounts.estimate(2);
        assert_eq!(recounts.read(estimate, 100, u64::MAX), Read::Slice);
        recounts.scan().rows.push(7);
        assert_eq!(recounts.take_done(), None, "not read to the end yet");
        let scan = recounts.scan();
        scan.rows.push(8);
        scan.done = true;
        assert_eq!(recounts.take_done(), Some(vec![7, 8]));
        assert!(recounts.scan.is_none(), "the next recount starts afresh");

        // Due again only `every` after the last one finished.
        let mut recounts: Recounts<u64> = Recounts::new(Duration::from_secs(3600));
        recounts.counted(held(2, 200));
        assert_eq!(recounts.read(estimate, 100, u64::MAX), Read::Nothing);
        recounts.scan();
        assert_eq!(
            recounts.read(estimate, 100, u64::MAX),
            Read::Slice,
            "one under way goes on"
        );
    }

    #[test]
    fn an_eviction_frees_a_hundredth_of_each_cap_beyond_it() {
        assert_eq!(
            floor(1_000_000, 1 << 30),
            (990_000, (1 << 30) - (1 << 30) / 100)
        );
        // Small caps are held exactly.
        assert_eq!(floor(3, 99), (3, 99));
        assert_eq!(floor(usize::MAX, u64::MAX).0, usize::MAX - usize::MAX / 100);
    }
}
