//! The gateway's one way to take a mutex. A panic while a lock was held poisons it; every critical
//! section in the gateway is a plain update of counters, maps or queues that leaves them consistent,
//! so the data is still good, and one panicked request must not stop every later one at this lock.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking the data of a poisoned one as it is.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
