//! The index's two thread pools: builds at a lower priority than serving, searches at the
//! requests' own. Below the index and its segments, so both reach them without importing upward.

use std::sync::OnceLock;

/// The threads index builds insert on: one per core, at a lower priority than serving (a rebuild
/// of a million vectors keeps every core busy for half an hour, and a partition's rebuild for
/// minutes, while the gateway serves). `None` when the pool cannot be started: builds then use
/// rayon's global pool.
pub(crate) fn build_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("reprise-index-insert-{i}"))
            .start_handler(|_| crate::priority::lower_this_thread())
            .build()
            .inspect_err(|e| tracing::warn!(error = %e, "could not start the index build threads; builds share rayon's global pool"))
            .ok()
    })
    .as_ref()
}

/// Runs `op` on the build threads ([`build_pool`]), or on the caller's and rayon's global pool when
/// they could not be started.
pub(crate) fn on_build_threads<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    match build_pool() {
        Some(pool) => pool.install(op),
        None => op(),
    }
}

/// The threads a search of several segments runs them on: one per core, at the requests'
/// priority. Not rayon's global pool: `hnsw_rs` frees a graph on it, in parallel, and a search
/// queued behind that would hold the state lock, and stall every search behind a queued insert.
/// `None` when the pool cannot be started: segments are then searched one after another.
pub(crate) fn search_pool() -> Option<&'static rayon::ThreadPool> {
    static POOL: OnceLock<Option<rayon::ThreadPool>> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("reprise-index-search-{i}"))
            .build()
            .inspect_err(|e| tracing::warn!(error = %e, "could not start the index search threads; segments are searched one after another"))
            .ok()
    })
    .as_ref()
}

/// The search threads there are (1 without the pool, when searches run on the caller's alone):
/// how many exact scans may run at once, and into how many shares a sketch search splits.
pub(crate) fn search_threads() -> usize {
    search_pool().map_or(1, |pool| pool.current_num_threads().max(1))
}
