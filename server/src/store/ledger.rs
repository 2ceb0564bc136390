//! The bookkeeping both stores keep alike (what a hit records, the order they evict in, shedding
//! down to the caps), and the sled store's in-memory ledger: the id, key, expiry, recency and size
//! of every entry, built by one scan at open (or read back from the file a clean close wrote,
//! `ledger_file.rs`). The ledger makes `len`/`bytes` O(1) and lets `sweep`
//! find expired entries and sample eviction candidates without reading payloads from disk. It must
//! not touch a backend: the stores call it, and the sled store keeps the ledger in step with what
//! it writes, under the lock every write takes.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::StoreError;
use crate::entry::{Entry, HitEvent};
use crate::key::CacheKey;

/// Records hits on an entry (see [`Store::touch`]) through `update`, the store's rewrite of the
/// entry's cold half under its own rules for concurrent writers: adds `hits` to its count, the
/// `recent` ones to its bounded history, and moves its last hit forward. Nothing is read or
/// written when there is nothing to record; a missing entry is not an error (it may have been
/// evicted).
///
/// [`Store::touch`]: super::Store::touch
pub(super) fn touch(
    hits: u64,
    recent: &[HitEvent],
    update: impl FnOnce(&mut dyn FnMut(&mut Entry) -> bool) -> Result<bool, StoreError>,
) -> Result<(), StoreError> {
    if hits == 0 && recent.is_empty() {
        return Ok(());
    }
    update(&mut |entry| {
        entry.record_hits(hits, recent);
        true
    })?;
    Ok(())
}

/// An entry's last use, what both stores evict by: stored, or its latest hit on any replica.
pub(super) fn recency_ms(created_at_ms: u64, last_hit_ms: u64) -> u64 {
    last_hit_ms.max(created_at_ms)
}

/// The order both stores evict in, smallest first: least recently used, ties to the older id (so
/// a small store, where every entry is compared, evicts exactly as a Redis-backed one does).
pub(super) fn lru_order(recency_ms: u64, id: u64) -> (u64, u64) {
    (recency_ms, id)
}

/// What a store holds while it chooses what to evict: both stores shed entries until it fits
/// within both caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Held {
    pub(super) len: usize,
    pub(super) bytes: u64,
}

impl Held {
    pub(super) fn over(self, max_entries: usize, max_bytes: u64) -> bool {
        self.len > max_entries || self.bytes > max_bytes
    }

    /// One entry of `size` bytes less.
    pub(super) fn shed(&mut self, size: u64) {
        self.len = self.len.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(size);
    }

    /// One entry of `size` bytes more (one about to be written).
    pub(super) fn add(&mut self, size: u64) {
        self.len = self.len.saturating_add(1);
        self.bytes = self.bytes.saturating_add(size);
    }
}

/// Entries compared per eviction: Redis-style approximate LRU, close to exact LRU at a fixed cost.
const EVICTION_SAMPLE: usize = 16;

/// What the store needs to know about one entry without reading it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) id: u64,
    pub(super) key: CacheKey,
    pub(super) expires_at_ms: u64,
    /// max(last_hit_ms, created_at_ms): the LRU age.
    pub(super) recency_ms: u64,
    /// Encoded size on disk.
    pub(super) size: u64,
    /// Whether the entry holds a vector (what the vector index must hold at start-up).
    pub(super) vector: bool,
}

impl Slot {
    pub(super) fn new(entry: &Entry, size: usize) -> Self {
        Self {
            id: entry.id.0,
            key: entry.key,
            expires_at_ms: entry.expires_at_ms(),
            recency_ms: recency_ms(entry.created_at_ms, entry.last_hit_ms),
            size: size as u64,
            vector: entry.vector.is_some(),
        }
    }
}

/// In-memory mirror of the `entries` tree. A dense vector so eviction can sample uniformly, an id
/// map into it, and an expiry-ordered set so expired entries are found without a scan.
pub(super) struct Ledger {
    pub(super) slots: Vec<Slot>,
    position: HashMap<u64, usize>,
    by_expiry: BTreeSet<(u64, u64)>,
    pub(super) bytes: u64,
    rng: u64,
}

impl Ledger {
    pub(super) fn new() -> Self {
        // Any nonzero seed will do: sampling needs spread, not unpredictability.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self {
            slots: Vec::new(),
            position: HashMap::new(),
            by_expiry: BTreeSet::new(),
            bytes: 0,
            rng: nanos | 1,
        }
    }

    /// A ledger of `slots` (read back from the file a clean close wrote).
    pub(super) fn from_slots(slots: Vec<Slot>) -> Self {
        let mut ledger = Self::new();
        ledger.position.reserve(slots.len());
        ledger.slots.reserve(slots.len());
        for slot in slots {
            ledger.insert(slot);
        }
        ledger
    }

    pub(super) fn get(&self, id: u64) -> Option<&Slot> {
        self.position.get(&id).map(|&i| &self.slots[i])
    }

    /// Inserts or replaces the slot of `slot.id`.
    pub(super) fn insert(&mut self, slot: Slot) {
        self.remove(slot.id);
        self.position.insert(slot.id, self.slots.len());
        self.by_expiry.insert((slot.expires_at_ms, slot.id));
        self.bytes = self.bytes.saturating_add(slot.size);
        self.slots.push(slot);
    }

    pub(super) fn remove(&mut self, id: u64) -> Option<Slot> {
        let index = self.position.remove(&id)?;
        let slot = self.slots.swap_remove(index);
        if let Some(moved) = self.slots.get(index) {
            self.position.insert(moved.id, index);
        }
        self.by_expiry.remove(&(slot.expires_at_ms, id));
        self.bytes = self.bytes.saturating_sub(slot.size);
        Some(slot)
    }

    /// Up to `limit` ids expired at `now_ms`, soonest-expired first.
    pub(super) fn expired(&self, now_ms: u64, limit: usize) -> Vec<u64> {
        self.by_expiry
            .iter()
            .take_while(|(expires_at, _)| *expires_at <= now_ms)
            .take(limit)
            .map(|&(_, id)| id)
            .collect()
    }

    /// Up to `limit` ids to evict so that the store fits `max_entries` and `max_bytes`, each the
    /// least recently used of a sample of the entries not already chosen.
    pub(super) fn eviction_victims(
        &mut self,
        max_entries: usize,
        max_bytes: u64,
        limit: usize,
    ) -> Vec<u64> {
        self.victims_for(max_entries, max_bytes, None, limit)
    }

    /// Ids to evict so that the store fits `max_entries` and `max_bytes` once `incoming` is
    /// written: `(slot, id it replaces)`, the replaced entry's own slot neither counted nor chosen.
    pub(super) fn victims_for(
        &mut self,
        max_entries: usize,
        max_bytes: u64,
        incoming: Option<(Slot, Option<u64>)>,
        limit: usize,
    ) -> Vec<u64> {
        let mut chosen: HashSet<usize> = HashSet::new();
        let mut held = Held {
            len: self.slots.len(),
            bytes: self.bytes,
        };
        let mut kept = None;
        if let Some((slot, replaces)) = incoming {
            if let Some(&index) = replaces.and_then(|id| self.position.get(&id)) {
                held.shed(self.slots[index].size);
                kept = Some(index);
            }
            held.add(slot.size);
        }
        // The replaced slot stands in `chosen` so that no sample picks it, and is left out below.
        chosen.extend(kept);
        let taken = usize::from(kept.is_some());
        while held.over(max_entries, max_bytes) && chosen.len() - taken < limit {
            let Some(index) = self.oldest_of_sample(&chosen) else {
                break;
            };
            chosen.insert(index);
            held.shed(self.slots[index].size);
        }
        chosen
            .into_iter()
            .filter(|i| Some(*i) != kept)
            .map(|i| self.slots[i].id)
            .collect()
    }

    /// The least recent of [`EVICTION_SAMPLE`] distinct slots outside `chosen` (all of them when
    /// that few remain, which makes small stores exact LRU). Ties go to the older id.
    fn oldest_of_sample(&mut self, chosen: &HashSet<usize>) -> Option<usize> {
        let n = self.slots.len();
        let age = |slots: &[Slot], i: usize| lru_order(slots[i].recency_ms, slots[i].id);
        if n.saturating_sub(chosen.len()) <= EVICTION_SAMPLE {
            return (0..n)
                .filter(|i| !chosen.contains(i))
                .min_by_key(|&i| age(&self.slots, i));
        }
        let mut sample: HashSet<usize> = HashSet::with_capacity(EVICTION_SAMPLE);
        // Random draws first; the rare shortfall (draws landing on chosen or repeated slots) is
        // topped up by walking on from a random slot, so the sample is always full.
        for _ in 0..EVICTION_SAMPLE * 4 {
            let i = (self.next_random() % n as u64) as usize;
            if !chosen.contains(&i) {
                sample.insert(i);
                if sample.len() == EVICTION_SAMPLE {
                    break;
                }
            }
        }
        let start = (self.next_random() % n as u64) as usize;
        for i in (0..n).map(|k| (start + k) % n) {
            if sample.len() == EVICTION_SAMPLE {
                break;
            }
            if !chosen.contains(&i) {
                sample.insert(i);
            }
        }
        sample.into_iter().min_by_key(|&i| age(&self.slots, i))
    }

    /// xorshift64*: fast and dependency-free; statistical quality is ample for sampling.
    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touch_with_nothing_to_record_writes_nothing() {
        let mut called = false;
        touch(0, &[], |_| {
            called = true;
            Ok(true)
        })
        .expect("touch");
        assert!(!called, "no rewrite for no hits");
        // A gone entry (the rewrite finds nothing) is not an error.
        touch(1, &[], |_| Ok(false)).expect("touch of a gone entry");
    }

    #[test]
    fn held_is_over_either_cap_and_sheds_to_within_both() {
        let mut held = Held { len: 3, bytes: 30 };
        assert!(held.over(2, 100), "over the entry cap");
        assert!(held.over(10, 20), "over the byte cap");
        assert!(!held.over(3, 30), "at both caps is within them");
        held.shed(15);
        assert_eq!((held.len, held.bytes), (2, 15));
        held.add(5);
        assert_eq!((held.len, held.bytes), (3, 20));
        // The older of two entries used at the same time goes first.
        assert!(lru_order(5, 1) < lru_order(5, 2));
        assert!(lru_order(4, 9) < lru_order(5, 1));
        assert_eq!(recency_ms(10, 0), 10, "never hit: its creation");
        assert_eq!(recency_ms(10, 20), 20);
    }
}
