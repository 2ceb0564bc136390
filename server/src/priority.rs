//! Background work's thread priority: the index dump's load and the index builds run at a nice
//! value of 10, so the requests served meanwhile (exact hits from the first second of a start,
//! through a rebuild that takes half an hour at a million entries) get the cores first. Threads a
//! lowered thread starts inherit its value (Linux keeps nice values per thread).

/// Lowers the calling thread to a nice value of 10; where the platform refuses, it keeps its
/// priority (background work then competes with requests as it did before).
pub(crate) fn lower_this_thread() {
    // 22 on the crate's 0-99 scale is a nice value of 10 on Linux.
    let lowered = thread_priority::ThreadPriorityValue::try_from(22u8)
        .map_err(|e| e.to_string())
        .and_then(|value| {
            thread_priority::set_current_thread_priority(
                thread_priority::ThreadPriority::Crossplatform(value),
            )
            .map_err(|e| e.to_string())
        });
    if let Err(err) = lowered {
        tracing::debug!(error = %err, "a background thread keeps the normal priority");
    }
}
