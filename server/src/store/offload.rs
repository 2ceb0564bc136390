//! Store calls from async code (the request path): each runs on tokio's blocking pool, at most
//! [`MAX_CALLS`] at once, and is given up at its deadline. It must never run a store call on an
//! async worker: the [`Store`] trait is blocking, and with two workers one slow Redis round trip
//! on each stalls every request of the process, `/healthz` and pass-through routes included.
//!
//! A call that cannot start or finish in time is a miss to its caller (fail open, as a store
//! error is), and is counted in [`Offload::timed_out`]. The blocking call itself still runs to
//! its end (a thread cannot be cancelled) and keeps its permit until then, so a stuck store holds
//! at most [`MAX_CALLS`] threads, never the async workers and never more threads over time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::Store;

/// Store calls running at once from async code: the Redis store's connection pool (16), so that
/// calls reuse warm connections instead of opening more (each new one costs two round trips, and
/// over a slow link may time out and empty the pool); a sled read holds its thread for
/// microseconds, so 16 is far more than a sled store ever has in flight.
pub const MAX_CALLS: usize = 16;

/// The longest a request waits for one store call, from asking to its answer. Above the Redis
/// store's own deadlines (50 ms to connect, 50 ms per command), so those fire first and mark the
/// store degraded; this one bounds what they do not cover (a sled read stalled on the disk, a
/// queue of calls behind a slow store).
pub const CALL_DEADLINE: Duration = Duration::from_millis(200);

/// Runs [`Store`] calls off the async workers, bounded in number and time.
pub struct Offload {
    store: Arc<dyn Store>,
    permits: Arc<Semaphore>,
    deadline: Duration,
    timed_out: AtomicU64,
}

impl Offload {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self::with_limits(store, MAX_CALLS, CALL_DEADLINE)
    }

    pub fn with_limits(store: Arc<dyn Store>, max_calls: usize, deadline: Duration) -> Self {
        Self {
            store,
            permits: Arc::new(Semaphore::new(max_calls.max(1))),
            deadline,
            timed_out: AtomicU64::new(0),
        }
    }

    /// Runs `op` on the store on a blocking thread; `None` when it could not start or end before
    /// the deadline (or panicked): the caller treats that as the store having nothing to give.
    pub async fn call<T, F>(&self, op: F) -> Option<T>
    where
        F: FnOnce(&dyn Store) -> T + Send + 'static,
        T: Send + 'static,
    {
        let deadline = tokio::time::Instant::now() + self.deadline;
        let permit =
            match tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned()).await {
                Ok(Ok(permit)) => permit,
                // Waited past the deadline behind other calls (or the semaphore was closed).
                Ok(Err(_)) | Err(_) => {
                    self.timed_out.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
            };
        let store = self.store.clone();
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            op(store.as_ref())
        });
        match tokio::time::timeout_at(deadline, task).await {
            Ok(Ok(value)) => Some(value),
            Ok(Err(panicked)) => {
                tracing::error!(error = %panicked, "a store call panicked");
                None
            }
            Err(_) => {
                self.timed_out.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Calls given up at their deadline since start.
    pub fn timed_out(&self) -> u64 {
        self.timed_out.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
#[allow(
    clippy::disallowed_methods,
    reason = "the tests spawn the callers of the code under test; none outlives the test"
)]
mod tests {
    use super::*;
    use crate::key::CacheKey;
    use crate::store::stalled::StalledStore;

    fn slow(delay_ms: u64) -> Arc<StalledStore> {
        Arc::new(StalledStore {
            read: Duration::from_millis(delay_ms),
            ..Default::default()
        })
    }

    /// On a runtime of one worker, a task that never touches the store keeps running while store
    /// calls are slow: they wait on blocking threads, not on the worker.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn slow_store_calls_leave_the_worker_free() {
        let store = slow(300);
        let offload = Arc::new(Offload::with_limits(
            store.clone(),
            8,
            Duration::from_secs(5),
        ));
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let offload = offload.clone();
                tokio::spawn(async move {
                    offload
                        .call(|s| s.replay_by_key(&CacheKey([0; 32])).is_ok())
                        .await
                })
            })
            .collect();
        // Lets the calls start, then measures how long the only worker takes to run a timer.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let before = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let stalled = before.elapsed();
        assert_eq!(
            store.reads.load(Ordering::SeqCst),
            0,
            "the calls had not ended yet"
        );
        assert!(
            stalled < Duration::from_millis(250),
            "a 1 ms timer took {stalled:?}: the worker was held by a store call"
        );
        for call in calls {
            assert_eq!(call.await.expect("task"), Some(true));
        }
    }

    /// A call past its deadline is given up (a miss to the caller) and counted; calls queued behind
    /// the bound give up at the same deadline instead of waiting their turn forever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_past_the_deadline_are_given_up_and_counted() {
        let store = slow(400);
        let offload = Arc::new(Offload::with_limits(
            store.clone(),
            1,
            Duration::from_millis(100),
        ));
        let first = {
            let offload = offload.clone();
            tokio::spawn(async move { offload.call(|s| s.replay_by_key(&CacheKey([0; 32]))).await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let queued = offload.call(|s| s.replay_by_key(&CacheKey([1; 32]))).await;
        assert!(queued.is_none(), "a call waiting behind the bound gives up");
        assert!(
            first.await.expect("task").is_none(),
            "the slow call gives up"
        );
        assert_eq!(offload.timed_out(), 2);
        // A fast call afterwards is answered once the stuck one has let its permit go.
        tokio::time::sleep(Duration::from_millis(450)).await;
        assert_eq!(offload.call(|s| s.len()).await, Some(0));
        assert_eq!(offload.timed_out(), 2);
    }
}
