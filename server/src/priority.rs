//! Background work's thread priority: the index dump's load and the index builds run at a nice
//! value of 10, so the requests served meanwhile (exact hits from the first second of a start,
//! through a rebuild that takes half an hour at a million entries) get the cores first. Threads a
//! lowered thread starts inherit its value (Linux keeps nice values per thread). Also the core
//! count that every pool and split is sized by.

/// The cores this process may run on (its CPU affinity and cgroup quota, as the standard library
/// reads them), or 1 when that cannot be read: work split across more threads than there are cores
/// only queues, so an unknown count is taken as the smallest.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Lowers the calling thread to a nice value of 10, on Linux, when it runs under the normal policy
/// at a higher priority than that; otherwise it is left alone (a thread already nicer, or under a
/// real-time policy, would be raised, and elsewhere `setpriority` can renice the whole process).
pub(crate) fn lower_this_thread() {
    // rayon's shared pool takes the priority of the thread that starts it, and `hnsw_rs` drops a
    // graph with it: started here, before lowering, its threads keep the caller's priority rather
    // than whichever lowered thread happened to use it first (an error means it runs already).
    let _ = rayon::ThreadPoolBuilder::new().build_global();
    #[cfg(target_os = "linux")]
    lower_on_linux();
}

#[cfg(target_os = "linux")]
fn lower_on_linux() {
    use thread_priority::{NormalThreadSchedulePolicy, ThreadSchedulePolicy};
    let normal = matches!(
        thread_priority::thread_schedule_policy(),
        Ok(ThreadSchedulePolicy::Normal(
            NormalThreadSchedulePolicy::Other
        ))
    );
    if !normal || nice_of_this_thread().is_none_or(|nice| nice >= 10) {
        return;
    }
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

/// The calling thread's nice value, from `/proc/thread-self/stat`.
#[cfg(target_os = "linux")]
pub(crate) fn nice_of_this_thread() -> Option<i32> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // The fields after the command's closing parenthesis; the nice value is the 19th of the line.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    rest.split(' ').nth(16)?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[cfg(target_os = "linux")]
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_is_lowered_to_nice_10_never_raised() {
        let base = nice_of_this_thread().expect("a nice value");
        let lowered = std::thread::spawn(|| {
            lower_this_thread();
            nice_of_this_thread()
        });
        // 10, or the test's own when it already runs nicer.
        assert_eq!(lowered.join().expect("thread"), Some(base.max(10)));
        let nicer = std::thread::spawn(|| {
            // 10 on the crate's 0-99 scale is a nice value of 15.
            let fifteen = thread_priority::ThreadPriorityValue::try_from(10u8).expect("value");
            thread_priority::set_current_thread_priority(
                thread_priority::ThreadPriority::Crossplatform(fifteen),
            )
            .expect("setting 15 needs no privilege below it");
            let before = nice_of_this_thread();
            lower_this_thread();
            (before, nice_of_this_thread())
        });
        let fifteen = Some(base.max(15));
        assert_eq!(nicer.join().expect("thread"), (fifteen, fifteen));
    }
}
