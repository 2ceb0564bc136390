//! The ids a Redis replica's listings page over (`/admin/entries`, invalidation, a deleted
//! response's entries), so that a page does not read the whole registry again.
//!
//! Reading the registry (`HSCAN` of `reprise:index`) costs Redis about a second at a million
//! entries, and the admin paths read entries a page of 256 at a time: an invalidation by namespace
//! read it once per page (thousands of times), the dashboard once per refresh. A listing instead
//! keeps the ids one read found, with the id counter (`reprise:ids`) as it stood then. Ids are
//! only ever taken from that counter and never reused, so the ids taken since are exactly those
//! above it: a listing catches up with one `GET` of the counter, whichever replica wrote them, and
//! is a superset of the live ids. Ids of entries gone since stay in it until the next read; the
//! pages skip them as they skip any entry that expired or was deleted between two pages.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::entry::EntryId;

/// How long one read of the registry serves listings: past it, the next listing reads it again,
/// shedding the ids of entries gone since (each costs a page a round trip).
pub(super) const READ_EVERY: Duration = Duration::from_secs(60);
/// Ids of entries gone (deleted or expired since the read) that one page may meet before the
/// registry is read again: each costs the page a round trip, and a flush or a big invalidation
/// leaves a listing of nothing but them.
pub(super) const GONE_BEFORE_READ: usize = 256;
/// Ids just below the counter a read is taken as if allocated after it: a put takes its id
/// before it writes its registry row, so a row may be missing from the read though its id is not
/// above the counter. Each replica writes through one writer thread, so at most one put per
/// replica is between the two.
const IN_FLIGHT: u64 = 64;

/// The ids one read of the registry found, and those taken since.
pub(super) struct Listing {
    read_at: Instant,
    /// Every id up to this one is in `ids` if its entry existed at the read.
    counter: u64,
    /// Ascending.
    ids: Arc<Vec<EntryId>>,
}

impl Listing {
    /// The live `ids` (ascending) that a read of the registry found, begun when the counter stood
    /// at `counter`.
    pub(super) fn read(ids: Vec<EntryId>, counter: u64) -> Self {
        let mut listing = Self {
            read_at: Instant::now(),
            counter: counter.saturating_sub(IN_FLIGHT),
            ids: Arc::new(ids),
        };
        listing.catch_up(counter);
        listing
    }

    /// Whether this read may still serve listings.
    pub(super) fn fresh(&self) -> bool {
        self.read_at.elapsed() < READ_EVERY
    }

    /// Adds the ids taken since, now that the counter stands at `counter`; false when it stands
    /// below what this listing saw (a Redis that lost its data), which only a new read can follow.
    pub(super) fn catch_up(&mut self, counter: u64) -> bool {
        if counter < self.counter {
            return false;
        }
        if counter > self.counter {
            let ids = Arc::make_mut(&mut self.ids);
            // Ids above the old counter that the read did find come back in the range, once.
            ids.truncate(ids.partition_point(|id| id.0 <= self.counter));
            ids.extend((self.counter + 1..=counter).map(EntryId));
            self.counter = counter;
        }
        true
    }

    /// The ids, ascending.
    pub(super) fn ids(&self) -> Arc<Vec<EntryId>> {
        self.ids.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(raw: &[u64]) -> Vec<EntryId> {
        raw.iter().copied().map(EntryId).collect()
    }

    #[test]
    fn ids_taken_since_the_read_are_listed_once() {
        let read: Vec<u64> = (1..=200).filter(|id| id % 3 != 0).collect();
        // Entries 199 and 200 were written while the registry was read.
        let mut listing = Listing::read(ids(&read), 198);
        listing.catch_up(202);
        // The read's ids up to 134, then every id from 135: the 64 below the counter the read
        // began at, as if taken after it, and those taken since.
        assert_eq!(IN_FLIGHT, 64);
        let mut want: Vec<u64> = (1..=134).filter(|id| id % 3 != 0).collect();
        want.extend(135..=202);
        assert_eq!(*listing.ids(), ids(&want));
        // Nothing taken since: nothing changes.
        assert!(listing.catch_up(202));
        assert_eq!(*listing.ids(), ids(&want));
    }

    #[test]
    fn a_row_written_late_by_a_put_in_flight_is_still_listed() {
        // Id 10 was taken before the counter was read, its row written after the read passed it.
        let listing = Listing::read(ids(&[1, 2, 3]), 10);
        assert!(listing.ids().contains(&EntryId(10)));
    }

    #[test]
    fn a_counter_gone_back_asks_for_a_new_read() {
        let mut listing = Listing::read(ids(&[1, 2]), 500);
        assert!(!listing.catch_up(3));
        assert!(listing.fresh());
    }
}
