//! Test only: an empty [`Store`] whose exact-key reads and flushes take as long as a test asks, as a
//! Redis behind a slow link or a disk that stalls. Shared by the unit tests of the store's callers.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{Store, StoreError, Upkeep};
use crate::entry::{Entry, EntryId, HitEvent, Replay};
use crate::key::CacheKey;

/// An empty store; `replay_by_key` sleeps `read` and `flush` sleeps `flush` before answering.
#[derive(Default)]
pub(crate) struct StalledStore {
    pub(crate) read: Duration,
    pub(crate) flush: Duration,
    /// Exact-key reads that have ended.
    pub(crate) reads: AtomicUsize,
}

impl Store for StalledStore {
    fn get(&self, _: EntryId) -> Result<Option<Entry>, StoreError> {
        Ok(None)
    }

    fn replay_by_key(&self, _: &CacheKey) -> Result<Option<Replay>, StoreError> {
        std::thread::sleep(self.read);
        self.reads.fetch_add(1, Ordering::SeqCst);
        Ok(None)
    }

    fn get_by_key(&self, _: &CacheKey) -> Result<Option<Entry>, StoreError> {
        Ok(None)
    }

    fn put(&self, _: Entry) -> Result<EntryId, StoreError> {
        Err(StoreError::Unavailable)
    }

    fn delete(&self, _: EntryId) -> Result<bool, StoreError> {
        Ok(false)
    }

    fn touch(&self, _: EntryId, _: u64, _: &[HitEvent]) -> Result<(), StoreError> {
        Ok(())
    }

    fn set_vector(&self, _: EntryId, _: &[f32]) -> Result<bool, StoreError> {
        Ok(false)
    }

    fn replace_vector(&self, _: EntryId, _: &[f32]) -> Result<bool, StoreError> {
        Ok(false)
    }

    fn list_newest(&self, _: Option<EntryId>, _: usize) -> Result<Vec<Entry>, StoreError> {
        Ok(Vec::new())
    }

    fn list(&self, _: Option<EntryId>, _: usize) -> Result<Vec<Entry>, StoreError> {
        Ok(Vec::new())
    }

    fn ids(&self) -> Result<Vec<EntryId>, StoreError> {
        Ok(Vec::new())
    }

    fn len(&self) -> usize {
        0
    }

    fn bytes(&self) -> u64 {
        0
    }
}

impl Upkeep for StalledStore {
    fn sweep(&self, _: u64, _: usize, _: u64) -> Result<(usize, usize), StoreError> {
        Ok((0, 0))
    }

    fn flush(&self) -> Result<(), StoreError> {
        std::thread::sleep(self.flush);
        Ok(())
    }

    fn clear(&self) -> Result<usize, StoreError> {
        Ok(0)
    }
}
