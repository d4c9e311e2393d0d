//! [`Locker::coalesce`]: singleflight under the distributed lock.
//!
//! Concurrent local callers for one key share one execution: the first becomes the
//! leader, takes the distributed lock and runs its closure; the others wait for that
//! result and receive a clone. A leader that is cancelled hands the flight to one of
//! the waiting callers, which runs *its own* closure; a leader that panics gives the
//! followers [`Error::Panicked`] (the lock is released as its guard unwinds) and
//! re-raises the panic in its own task.

use std::any::{Any, TypeId};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;
use futures::FutureExt;
use tokio::sync::Notify;

use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::locker::Locker;

type Shared = Arc<dyn Any + Send + Sync>;
type FlightKey = (LockKey, TypeId);

/// The in-flight shared computations of one locker.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    map: DashMap<FlightKey, Arc<Flight>>,
}

#[derive(Debug, Default)]
struct Flight {
    state: Mutex<FlightState>,
    done: Notify,
}

#[derive(Debug, Default)]
struct FlightState {
    /// `None` while running (or vacant); the shared outcome once done.
    outcome: Option<Result<Shared>>,
    /// A leader is running the computation.
    leading: bool,
    /// Callers waiting for the outcome.
    followers: usize,
}

impl Flight {
    fn lock(&self) -> MutexGuard<'_, FlightState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ends a leader's turn: publishes the outcome, or (if dropped without one) vacates
/// the flight for a follower to take over.
struct Leader<'a> {
    flights: &'a Flights,
    key: FlightKey,
    flight: Arc<Flight>,
    outcome: Option<Result<Shared>>,
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let mut st = self.flight.lock();
        st.leading = false;
        match self.outcome.take() {
            Some(outcome) => st.outcome = Some(outcome),
            None if st.followers > 0 => {
                // Cancelled: wake the followers; the first to look takes over.
                drop(st);
                self.flight.done.notify_waiters();
                return;
            }
            None => {}
        }
        drop(st);
        self.flights
            .map
            .remove_if(&self.key, |_, f| Arc::ptr_eq(f, &self.flight));
        self.flight.done.notify_waiters();
    }
}

/// A follower's registration; dropping it unregisters.
struct Follower<'a>(&'a Flight);

impl Drop for Follower<'_> {
    fn drop(&mut self) {
        self.0.lock().followers -= 1;
    }
}

impl Locker {
    /// Runs `f` under the lock of `key`, sharing its result with every concurrent
    /// local caller for the same key (and the same `T`).
    ///
    /// Use it for idempotent work whose result everyone may share: filling a cache
    /// entry, loading a hot row. Callers that arrive after a flight completed start a
    /// new one (one run per lock generation).
    ///
    /// # Concurrent calls on the same key
    ///
    /// One caller leads: it takes the distributed lock (as [`with_lock`](Self::with_lock))
    /// and runs its `f`; the others wait, without a deadline of their own, and receive
    /// a clone of the leader's value or error. If the leader is cancelled, one of the
    /// waiting callers becomes the leader and runs *its* `f`. If the leader panics,
    /// the waiting callers get [`Error::Panicked`], the lock is released, and the
    /// panic resumes in the leader's task.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let (a, b) = tokio::join!(
    ///     locker.coalesce("user:7", || async {
    ///         tokio::task::yield_now().await; // a real load awaits I/O here
    ///         "loaded once".to_string()
    ///     }),
    ///     locker.coalesce("user:7", || async { String::from("not run: shares the first") }),
    /// );
    /// assert_eq!(a?, "loaded once");
    /// assert_eq!(b?, "loaded once");
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`with_lock`](Self::with_lock), shared by all callers of the flight, plus
    /// [`Error::Panicked`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A cancelled follower simply stops waiting; a cancelled leader
    /// drops `f` (releasing the lock in the background) and passes the flight on.
    ///
    /// # Panics
    ///
    /// Resumes the panic of `f` in the caller whose `f` panicked.
    pub async fn coalesce<T, F, Fut>(&self, key: impl Into<LockKey>, f: F) -> Result<T>
    where
        T: Clone + Send + Sync + 'static,
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let key: LockKey = key.into();
        key.validate()?;
        let flights = &self.shared().flights;
        let fkey = (key.clone(), TypeId::of::<T>());
        let flight = match flights.map.entry(fkey.clone()) {
            Entry::Vacant(v) => {
                let flight = Arc::new(Flight::default());
                flight.lock().leading = true;
                v.insert(Arc::clone(&flight));
                return self.lead_flight(flights, fkey, flight, f).await;
            }
            Entry::Occupied(o) => Arc::clone(o.get()),
        };
        {
            flight.lock().followers += 1;
        }
        let follower = Follower(&flight);
        loop {
            let notified = flight.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let take_over = {
                let mut st = flight.lock();
                if let Some(outcome) = &st.outcome {
                    return match outcome {
                        Ok(value) => Ok(value
                            .downcast_ref::<T>()
                            .expect("flights are keyed by the value's TypeId")
                            .clone()),
                        Err(e) => Err(e.clone()),
                    };
                }
                if st.leading {
                    false
                } else {
                    st.leading = true;
                    st.followers -= 1;
                    true
                }
            };
            if take_over {
                std::mem::forget(follower);
                return self
                    .lead_flight(flights, fkey, Arc::clone(&flight), f)
                    .await;
            }
            notified.await;
        }
    }

    async fn lead_flight<T, F, Fut>(
        &self,
        flights: &Flights,
        key: FlightKey,
        flight: Arc<Flight>,
        f: F,
    ) -> Result<T>
    where
        T: Clone + Send + Sync + 'static,
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let mut leader = Leader {
            flights,
            key: key.clone(),
            flight,
            outcome: None,
        };
        let run = AssertUnwindSafe(self.with_lock(key.0.clone(), |_| f()))
            .catch_unwind()
            .await;
        match run {
            Ok(result) => {
                leader.outcome = Some(
                    result
                        .as_ref()
                        .map(|v| Arc::new(v.clone()) as Shared)
                        .map_err(Clone::clone),
                );
                result
            }
            Err(panic) => {
                leader.outcome = Some(Err(Error::Panicked { key: key.0 }));
                drop(leader);
                std::panic::resume_unwind(panic)
            }
        }
    }
}
