//! The alias memory: prompts recently served by a semantic hit, by their own exact key, so a
//! verbatim repeat of a paraphrase (many users, one wording) skips the embedding and the search.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::entry::EntryId;
use crate::key::CacheKey;
use crate::lock::lock;

/// How many paraphrases [`Aliases`] remembers.
const ALIASES: usize = 10_000;

/// Only the entry id and the similarity are kept, in memory; the entry is re-read and re-checked on
/// every use, so a deleted, replaced or expired entry is never served through an alias, and no alias
/// carries a vector that could chain paraphrases of paraphrases ever further from the stored prompt.
#[derive(Default)]
pub(super) struct Aliases {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<CacheKey, (EntryId, f32)>,
    order: VecDeque<CacheKey>,
}

impl Aliases {
    /// Remembers that the prompt with exact key `key` was served `id` at `similarity`; the oldest
    /// alias is forgotten past the cap.
    pub(super) fn remember(&self, key: CacheKey, id: EntryId, similarity: f32) {
        let mut inner = lock(&self.inner);
        if inner.map.insert(key, (id, similarity)).is_none() {
            inner.order.push_back(key);
        }
        while inner.map.len() > ALIASES {
            let Some(oldest) = inner.order.pop_front() else {
                break;
            };
            inner.map.remove(&oldest);
        }
    }

    /// The entry and similarity remembered for `key`.
    pub(super) fn get(&self, key: &CacheKey) -> Option<(EntryId, f32)> {
        lock(&self.inner).map.get(key).copied()
    }

    /// Forgets `key` (its entry is gone or moved partition).
    pub(super) fn forget(&self, key: &CacheKey) {
        let mut inner = lock(&self.inner);
        if inner.map.remove(key).is_some() {
            inner.order.retain(|k| k != key);
        }
    }
}
