//! [`Locker::singleflight`](crate::Locker::singleflight): singleflight under the distributed lock.
//!
//! Concurrent local callers for one key share one execution: the first becomes the
//! leader, takes the distributed lock and runs its closure; the others wait for that
//! result and receive a clone. A leader that is cancelled hands the flight to one of
//! the waiting callers, which runs *its own* closure; a leader that panics gives the
//! followers [`Error::Panicked`] (the lock is released as its guard unwinds) and
//! re-raises the panic in its own task. The last caller to leave a flight without an
//! outcome (a cancelled leader nobody follows, or the last follower of a flight
//! whose leader is gone) removes it, so no flight outlives its callers.

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

/// A flight's value with its type erased (flights are keyed by its `TypeId`).
type ErasedValue = Arc<dyn Any + Send + Sync>;
type FlightKey = (LockKey, TypeId);

/// The in-flight shared computations of one locker.
///
/// # Invariants
///
/// 1. A flight is in the map while a caller is attached to it (a leader or a
///    follower) and it has no outcome; it leaves the map when its outcome is
///    published, or when the last caller leaves it without one. Nothing else
///    keeps it there: when no caller is left, the map is empty.
/// 2. Joining a flight (`followers += 1`) happens under the map entry, and leaving
///    removes the flight under the map entry after re-checking that nobody is
///    attached, so a caller never joins a flight that has just been removed.
///
/// # Lock order
///
/// Map shard, then flight state. Nobody touches the map while holding a flight's
/// state lock.
#[derive(Debug, Default)]
pub(crate) struct Flights {
    map: DashMap<FlightKey, Arc<Flight>>,
}

impl Flights {
    /// Removes `flight` from the map if it is still `key`'s flight and nobody is
    /// attached to it any more.
    fn remove_if_abandoned(&self, key: &FlightKey, flight: &Arc<Flight>) {
        self.map
            .remove_if(key, |_, f| Arc::ptr_eq(f, flight) && f.lock().abandoned());
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

#[derive(Debug, Default)]
struct Flight {
    state: Mutex<FlightState>,
    done: Notify,
}

#[derive(Debug, Default)]
struct FlightState {
    /// `None` while running (or vacant); the shared outcome once done.
    outcome: Option<Result<ErasedValue>>,
    /// A leader is running the computation.
    leading: bool,
    /// Callers waiting for the outcome.
    followers: usize,
}

impl FlightState {
    /// No caller is attached and no outcome will come: the flight can go.
    fn abandoned(&self) -> bool {
        !self.leading && self.followers == 0
    }
}

impl Flight {
    fn lock(&self) -> MutexGuard<'_, FlightState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ends a leader's turn: publishes the outcome, or (if dropped without one) vacates
/// the flight for a follower to take over — or removes it when nobody follows.
struct Leader<'a> {
    flights: &'a Flights,
    key: FlightKey,
    flight: Arc<Flight>,
    outcome: Option<Result<ErasedValue>>,
}

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        let published = {
            let mut st = self.flight.lock();
            st.leading = false;
            match self.outcome.take() {
                Some(outcome) => {
                    st.outcome = Some(outcome);
                    true
                }
                None => false,
            }
        };
        if published {
            // Done: later callers start a new flight.
            self.flights
                .map
                .remove_if(&self.key, |_, f| Arc::ptr_eq(f, &self.flight));
        } else {
            // Cancelled: the first follower to look takes over; without one, go.
            self.flights.remove_if_abandoned(&self.key, &self.flight);
        }
        self.flight.done.notify_waiters();
    }
}

/// A follower's registration; dropping it unregisters, and removes the flight if it
/// was the last caller of a flight whose leader is gone.
struct Follower<'a> {
    flights: &'a Flights,
    key: &'a FlightKey,
    flight: &'a Arc<Flight>,
}

impl Drop for Follower<'_> {
    fn drop(&mut self) {
        let abandoned = {
            let mut st = self.flight.lock();
            st.followers -= 1;
            st.outcome.is_none() && st.abandoned()
        };
        if abandoned {
            self.flights.remove_if_abandoned(self.key, self.flight);
        }
    }
}

impl Flights {
    /// [`Locker::singleflight`](crate::Locker::singleflight) for a checked `key`:
    /// joins the key's flight for a `T`, or leads one, running `lead(key, f)` (the
    /// caller's `f` under the lock).
    pub(crate) async fn run<T, F, L, LFut>(&self, key: LockKey, f: F, lead: L) -> Result<T>
    where
        T: Clone + Send + Sync + 'static,
        L: FnOnce(LockKey, F) -> LFut,
        LFut: Future<Output = Result<T>>,
    {
        let flights = self;
        let fkey = (key.clone(), TypeId::of::<T>());
        let flight = match flights.map.entry(fkey.clone()) {
            Entry::Vacant(v) => {
                let flight = Arc::new(Flight::default());
                flight.lock().leading = true;
                v.insert(Arc::clone(&flight));
                return self.lead_flight(fkey, flight, f, lead).await;
            }
            Entry::Occupied(o) => {
                // Joined under the entry: the flight cannot be removed meanwhile.
                o.get().lock().followers += 1;
                Arc::clone(o.get())
            }
        };
        let follower = Follower {
            flights,
            key: &fkey,
            flight: &flight,
        };
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
                // Already counted out under the state lock, together with
                // `leading = true`: no moment without a caller attached.
                std::mem::forget(follower);
                return self.lead_flight(fkey, Arc::clone(&flight), f, lead).await;
            }
            notified.await;
        }
    }

    async fn lead_flight<T, F, L, LFut>(
        &self,
        key: FlightKey,
        flight: Arc<Flight>,
        f: F,
        lead: L,
    ) -> Result<T>
    where
        T: Clone + Send + Sync + 'static,
        L: FnOnce(LockKey, F) -> LFut,
        LFut: Future<Output = Result<T>>,
    {
        let flights = self;
        let mut leader = Leader {
            flights,
            key: key.clone(),
            flight,
            outcome: None,
        };
        let run = AssertUnwindSafe(lead(key.0.clone(), f))
            .catch_unwind()
            .await;
        match run {
            Ok(result) => {
                leader.outcome = Some(
                    result
                        .as_ref()
                        .map(|v| Arc::new(v.clone()) as ErasedValue)
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

#[cfg(test)]
mod tests {
    use std::future::pending;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use futures::poll;

    use super::*;
    use crate::{Locker, MemoryBackend};

    fn locker() -> Locker {
        Locker::builder(MemoryBackend::new()).build().unwrap()
    }

    fn flights(locker: &Locker) -> usize {
        locker.shared().flights.len()
    }

    /// Whether no key is left active once every background release is done and
    /// no lease is cached (`shutdown` waits for both, however long a loaded
    /// machine takes: no deadline to miss).
    async fn no_active_keys(locker: &Locker) -> bool {
        locker.shutdown().await;
        locker.active_keys() == 0
    }

    #[tokio::test]
    async fn cancelled_leader_then_cancelled_followers_leave_no_flight() {
        let locker = locker();
        for i in 0..100_000u32 {
            let key = format!("k{i}");
            let mut leader = Box::pin(locker.singleflight(key.as_str(), pending::<u32>));
            assert!(poll!(leader.as_mut()).is_pending());
            let mut a = Box::pin(locker.singleflight(key.as_str(), || async { 1u32 }));
            let mut b = Box::pin(locker.singleflight(key.as_str(), || async { 2u32 }));
            assert!(poll!(a.as_mut()).is_pending());
            assert!(poll!(b.as_mut()).is_pending());
            drop(leader);
            drop(a);
            drop(b);
        }
        assert_eq!(flights(&locker), 0, "flights leaked");
        assert!(no_active_keys(&locker).await);
    }

    #[tokio::test]
    async fn a_follower_leaving_after_the_leader_vacated_removes_the_flight() {
        let locker = locker();
        let mut leader = Box::pin(locker.singleflight("k", pending::<u32>));
        assert!(poll!(leader.as_mut()).is_pending());
        let mut a = Box::pin(locker.singleflight("k", pending::<u32>));
        let mut b = Box::pin(locker.singleflight("k", pending::<u32>));
        assert!(poll!(a.as_mut()).is_pending());
        assert!(poll!(b.as_mut()).is_pending());
        drop(leader);
        // `a` takes over (and blocks); `b` stays a follower; both leave.
        assert!(poll!(a.as_mut()).is_pending());
        assert!(poll!(b.as_mut()).is_pending());
        drop(b);
        assert_eq!(flights(&locker), 1, "the new leader's flight is live");
        drop(a);
        assert_eq!(flights(&locker), 0);
        assert!(no_active_keys(&locker).await);
    }

    #[tokio::test]
    async fn a_follower_takes_over_from_a_cancelled_leader_and_shares_its_value() {
        let locker = locker();
        let runs = Arc::new(AtomicUsize::new(0));
        let mut leader = Box::pin(locker.singleflight("k", pending::<usize>));
        assert!(poll!(leader.as_mut()).is_pending());
        let mut followers: Vec<_> = (0..5)
            .map(|_| {
                let runs = Arc::clone(&runs);
                Box::pin(locker.singleflight("k", move || async move {
                    tokio::task::yield_now().await;
                    runs.fetch_add(1, Ordering::SeqCst) + 100
                }))
            })
            .collect();
        for f in &mut followers {
            assert!(poll!(f.as_mut()).is_pending());
        }
        drop(leader);
        let values = futures::future::join_all(followers).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "one follower ran its closure"
        );
        for v in values {
            assert_eq!(v.unwrap(), 100);
        }
        assert_eq!(flights(&locker), 0);
        assert!(no_active_keys(&locker).await);
    }

    #[tokio::test]
    async fn a_panicking_leader_gives_followers_an_error_and_leaves_no_flight() {
        let locker = locker();
        let gate = Arc::new(Notify::new());
        let leader = {
            let (locker, gate) = (locker.clone(), Arc::clone(&gate));
            tokio::spawn(async move {
                locker
                    .singleflight::<(), _, _>("k", || async move {
                        gate.notified().await;
                        panic!("leader panics");
                    })
                    .await
            })
        };
        // The leader's flight exists once it waits on the gate.
        for _ in 0..400 {
            if flights(&locker) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(flights(&locker), 1);
        let mut follower = Box::pin(locker.singleflight("k", || async {}));
        assert!(poll!(follower.as_mut()).is_pending());
        gate.notify_one();
        assert!(leader.await.unwrap_err().is_panic());
        assert!(matches!(follower.await, Err(Error::Panicked { .. })));
        assert_eq!(flights(&locker), 0);
        assert!(no_active_keys(&locker).await);
    }

    /// Cancellations racing take-overs on a multi-threaded runtime: whatever the
    /// interleaving, the map ends empty.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn racing_cancellations_leave_no_flight() {
        let locker = locker();
        let mut tasks = Vec::new();
        for i in 0..2_000u64 {
            let locker = locker.clone();
            let key = format!("k{}", i % 64);
            tasks.push(tokio::spawn(async move {
                locker
                    .singleflight(key, move || async move {
                        tokio::time::sleep(Duration::from_millis(1 + i % 5)).await;
                        i
                    })
                    .await
            }));
        }
        // Let them register, then cancel most of them: leaders and followers alike,
        // some while a follower is taking over.
        tokio::time::sleep(Duration::from_millis(1)).await;
        for (i, t) in tasks.iter().enumerate() {
            if i % 4 != 0 {
                t.abort();
            }
            if i % 100 == 0 {
                tokio::task::yield_now().await;
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        assert_eq!(flights(&locker), 0);
        assert!(no_active_keys(&locker).await);
    }
}
