//! Distributed semaphores: `N` permits per key across every instance.
//!
//! [`Locker::semaphore`](crate::Locker::semaphore) gives a [`Semaphore`] handle; [`Semaphore::acquire`] waits
//! for a [`Permit`]. Each permit is a lease of its own (a random token in the
//! backend, expiring at the locker's lease TTL unless renewed), renewed by the
//! locker's watchdog while held, with the same loss signal as a
//! [`LockGuard`](crate::LockGuard): if its holder dies, the permit comes back by
//! itself within its TTL. A semaphore is its own lock: it is independent of the
//! exclusive lock and of the read-write lock of the same key string.
//!
//! # Coalescing
//!
//! Per key, **one** local task asks the backend for permits on behalf of every task
//! of this locker waiting for that key: one request (one round trip with Redis)
//! asks for up to `k` permits, `k` being the number of local waiters at the time it
//! is sent (at most `N`), and the backend grants as many as are free. Granted
//! permits go to the local waiters in FIFO order; tasks that arrive while a request
//! is in flight wait for the next one. A permit granted for a waiter that has gone
//! meanwhile goes to the next local waiter, or back to the backend.
//!
//! # Local handoff
//!
//! A released permit goes to the next local waiter of the key in memory, like the
//! exclusive lock's lease: the same token, still one of the key's `N` permits,
//! renewed by the same watchdog entry, no backend request. It is bounded by the
//! handoff budget of [`Handoff`](crate::Handoff) (on by default), per permit, and
//! never happens in fair mode while others wait, with less than `min_validity` left,
//! or once the permit is lost (a forced release's message makes it lost at once). A
//! permit past its budget, lost, or with no local waiter goes back to the backend:
//! one round trip, which wakes waiting instances, this one included (the release of
//! a lost one reports the loss). A waiter that finds the permit it was given already
//! lost returns it and waits on.
//!
//! # Wake-ups
//!
//! An instance that was not given all it asked for registers in the key's waiting
//! set (entries expire) and waits for its wake-up, or the earliest expiry of a
//! held permit, whichever comes first. A release that leaves `f` permits free
//! publishes the key to up to `f` waiting instances, oldest first: one wake-up per
//! free permit, never a broadcast. An instance that got permits and still waits
//! moves to the back of the waiting set, so instances take turns.
//!
//! # Invariants
//!
//! 1. Per key at most one request task runs (`driving`), and it runs while the key
//!    has local waiters; the key's local state is removed, under the map's lock,
//!    only by that task when nobody waits, after it left the backend's waiting set.
//! 2. A token the backend may have granted is always accounted for: it becomes a
//!    [`Permit`] held by a waiter, or it is released in the background (a permit
//!    nobody took, a request that failed, a reply that came back too late).
//! 3. A [`Permit`] that is dropped, or whose release future is dropped, is handed
//!    to the next local waiter (within the budget) or released in the background;
//!    without a runtime, it expires at its TTL.
//!
//! # Lock order
//!
//! The map of keys, then a key's queue. Neither is held across an `.await`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::semaphore::SemaphoreBackend;
use crate::backend::{Acquire, LeaseToken, WhenBusy};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::LeaseKind;
use crate::lease::acquire::{Armed, Ask, Call, acquire};
use crate::lease::engine::deadline_after;
use crate::settings::LockOptions;
mod permit;
mod requests;

pub use permit::Permit;
use permit::PermitPool;
pub(crate) use requests::Semaphores;

/// The most permits a semaphore key may have.
pub const MAX_PERMITS: u32 = 65_536;

/// The most permits one request asks for (the tokens travel as script arguments).
const MAX_BATCH: usize = 256;

/// A distributed semaphore: at most `N` [`Permit`]s of its key are held at a time,
/// across every instance. Made by [`Locker::semaphore`](crate::Locker::semaphore); cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockflight::Result<()> {
/// use std::time::Duration;
/// use lockflight::{LockOptions, Locker, MemoryBackend};
///
/// let locker = Locker::builder(MemoryBackend::new()).build()?;
/// let exports = locker.semaphore("exports", 3); // at most 3 exports at once
/// let wait = LockOptions::new().wait_timeout(Duration::from_secs(1));
/// let permit = exports.acquire_with_options(wait).await?;
/// let finished = tokio::select! {
///     _ = permit.lost() => false, // stop: the permit no longer protects us
///     _ = async { /* the export */ } => true,
/// };
/// assert!(finished);
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    semaphores: Arc<Semaphores>,
    key: LockKey,
    permits: u32,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("key", &self.key)
            .field("permits", &self.permits)
            .finish()
    }
}

impl Semaphore {
    /// The semaphore's key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The number of permits this handle asks with.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// A handle on `key` with `permits` permits ([`Locker::semaphore`](crate::Locker::semaphore)).
    pub(crate) fn new(semaphores: Arc<Semaphores>, key: LockKey, permits: u32) -> Semaphore {
        Semaphore {
            semaphores,
            key,
            permits,
        }
    }

    /// Checks the key, the number of permits and the backend.
    fn check(&self) -> Result<&dyn SemaphoreBackend> {
        self.key.validate()?;
        if self.permits == 0 || self.permits > MAX_PERMITS {
            return Err(Error::config(format!(
                "semaphore {}: permits is {}, it must be between 1 and {MAX_PERMITS}",
                self.key, self.permits
            )));
        }
        self.semaphores
            .engine
            .backend
            .semaphore()
            .ok_or_else(|| Error::Unsupported {
                key: self.key.clone(),
                what: "semaphores",
            })
    }

    /// Waits for a permit, up to the locker's wait timeout.
    ///
    /// Within this process one task per key asks the backend, for every local waiter
    /// at once (see the [module docs](self)); permits go to local waiters in FIFO
    /// order.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for a bad key; [`Error::InvalidConfig`] for `permits`
    /// of 0 or above [`MAX_PERMITS`]; [`Error::Unsupported`] for a backend without
    /// semaphores; [`Error::PermitMismatch`] when the key has another number of
    /// permits (here or in the backend); [`Error::Overloaded`] when `max_waiters`
    /// tasks already wait for the key here; [`Error::Timeout`] when the wait
    /// timeout passes; backend errors that are not transient (transient ones are
    /// retried until the deadline).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A dropped call leaves the local queue at once; a permit granted
    /// for it while it was being dropped goes to the next local waiter or back to
    /// the backend, so no permit leaks. When the last local waiter of a key is
    /// gone, the request task leaves the backend's waiting set and ends.
    pub async fn acquire(&self) -> Result<Permit> {
        self.acquire_within(self.semaphores.engine.config.wait_timeout)
            .await
    }

    /// Like [`acquire`](Self::acquire) with per-call settings: a wait timeout
    /// (`Duration::MAX`: as long as it takes), or no waiting at all
    /// ([`LockOptions::try_only`](crate::LockOptions::try_only): [`Error::Busy`]
    /// when no permit is free).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); [`Error::Busy`] under `try_only`;
    /// [`Error::InvalidConfig`] for a per-call lease TTL (permits take the
    /// locker's).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_with_options(&self, options: LockOptions) -> Result<Permit> {
        let default_wait = self.semaphores.engine.config.wait_timeout;
        match options.wait_at_locker_ttl("acquire_with_options", &self.key, default_wait)? {
            Some(wait) => self.acquire_within(wait).await,
            None => self.try_acquire().await?.ok_or_else(|| Error::Busy {
                key: self.key.clone(),
            }),
        }
    }

    /// [`acquire`](Self::acquire), waiting at most `wait`.
    pub(crate) async fn acquire_within(&self, wait: Duration) -> Result<Permit> {
        self.check()?;
        let start = Instant::now();
        let deadline = deadline_after(start, wait);
        let semaphores = &self.semaphores;
        loop {
            let (rx, _waiting) = semaphores.enqueue(&self.key, self.permits)?;
            return match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(Ok(permit))) if permit.is_lost() => {
                    // Lost between its grant or handoff and this task waking up (a
                    // forced release, its validity): it is not held. Dropping it
                    // returns it to the backend (a lost permit is never handed on);
                    // wait again.
                    tracing::debug!(key = %self.key, "a permit was lost before its holder woke");
                    drop(permit);
                    continue;
                }
                Ok(Ok(Ok(permit))) => {
                    crate::lease::histograms::wait(crate::lease::LeaseKind::Permit, start);
                    Ok(permit)
                }
                Ok(Ok(Err(e))) => Err(e),
                Ok(Err(_)) => Err(Error::backend(
                    &self.key,
                    Phase::Acquiring,
                    "the semaphore's request task ended (its runtime shut down)",
                )),
                Err(_) => {
                    semaphores.engine.stats.timeout();
                    Err(Error::timeout(&self.key, Phase::Acquiring, start.elapsed()))
                }
            };
        }
    }

    /// One attempt: a permit if one is free now, else `None`. Not coalesced with the
    /// waiting tasks, and without joining the waiting set.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), without the overload, and a full semaphore is
    /// `Ok(None)`: as [`Locker::try_lock`](crate::Locker::try_lock), a transient
    /// error is asked again (same token) until the wait timeout, then returned; too
    /// few nodes answering is returned at once.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped while the request is in flight, the
    /// token it asked with is released in the background.
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        let backend = self.check()?;
        let semaphores = &self.semaphores;
        semaphores.check_permits(&self.key, self.permits)?;
        let (key, permits, ttl) = (&self.key, self.permits, semaphores.engine.config.lease_ttl);
        let token = semaphores.engine.backend.new_token();
        let mut armed = Armed::new(&semaphores.engine, LeaseKind::Permit, key, vec![token], ());
        let call = Call::new(semaphores.engine.config.wait_timeout, ttl, WhenBusy::Return);
        let ask = Ask {
            key,
            kind: LeaseKind::Permit,
            token,
            call,
            one_at_a_time: false,
        };
        let granted = acquire(
            &semaphores.engine,
            ask,
            &mut armed,
            |token, mode, _| async move {
                let reply = backend
                    .acquire_permits(key, permits, &[token], ttl, mode)
                    .await?;
                Ok(if reply.granted >= 1 {
                    Acquire::Acquired {
                        epoch: 0,
                        waiting: reply.waiting,
                        earliest_other: None,
                    }
                } else {
                    Acquire::Busy {
                        retry_in: reply.retry_in,
                    }
                })
            },
        )
        .await?;
        let queue: Arc<dyn PermitPool> = Arc::clone(semaphores) as Arc<dyn PermitPool>;
        Ok(granted.map(|granted| Permit::new(&queue, granted.lease)))
    }
}

/// The tokens of a permit request in flight: released in the background (on the
/// shared schedule) unless disarmed.
fn pending(semaphores: &Arc<Semaphores>, key: &LockKey, tokens: Vec<LeaseToken>) -> Armed {
    let mut armed = Armed::new(&semaphores.engine, LeaseKind::Permit, key, tokens, ());
    armed.arm();
    armed
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::backend::memory::MemoryBackend;
    use crate::locker::Locker;
    use crate::settings::Handoff;

    fn locker(max_waiters: usize) -> Locker {
        Locker::builder(MemoryBackend::new())
            .lease_ttl(Duration::from_secs(3))
            .wait_timeout(Duration::from_secs(10))
            .max_waiters(max_waiters)
            .build()
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_n_holders_fifo_and_nothing_left() {
        let locker = locker(100);
        let sem = locker.semaphore("k", 2);
        let a = sem.acquire().await.unwrap();
        let b = sem.acquire().await.unwrap();
        assert!(sem.try_acquire().await.unwrap().is_none());
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..4 {
            let (sem, order) = (sem.clone(), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                let p = sem.acquire().await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(10)).await;
                p.release().await.unwrap();
            }));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(locker.active_semaphores(), 1);
        a.release().await.unwrap();
        b.release().await.unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3], "FIFO");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(locker.active_semaphores(), 0);
        // Every permit came back: N again.
        let all: Vec<Permit> = futures::future::try_join_all((0..2).map(|_| sem.acquire()))
            .await
            .unwrap();
        assert_eq!(all.len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn bad_input_mismatch_timeout_overload_and_loss() {
        let locker = locker(1);
        for n in [0, MAX_PERMITS + 1] {
            let e = locker.semaphore("k", n).acquire().await.unwrap_err();
            assert!(matches!(e, Error::InvalidConfig { .. }), "{e:?}");
            assert!(e.to_string().contains("semaphore k:"), "names the key: {e}");
        }
        assert!(matches!(
            locker.semaphore("", 1).acquire().await,
            Err(Error::InvalidKey { .. })
        ));
        let held = locker.semaphore("k", 1).acquire().await.unwrap();
        match locker.semaphore("k", 2).try_acquire().await {
            Err(Error::PermitMismatch {
                permits: 1,
                requested: 2,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let sem = locker.semaphore("k", 1);
        let waiting = tokio::spawn({
            let sem = sem.clone();
            async move { sem.acquire_within(Duration::from_millis(500)).await }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        // The local queue holds one (max_waiters 1): the next is refused.
        assert!(matches!(
            sem.acquire().await,
            Err(Error::Overloaded { waiters: 1, .. })
        ));
        // A local waiter with another N is refused at once.
        assert!(matches!(
            locker.semaphore("k", 3).acquire().await,
            Err(Error::PermitMismatch { permits: 1, .. })
        ));
        assert!(matches!(waiting.await.unwrap(), Err(Error::Timeout { .. })));
        // Lost: its entry is removed behind its back; the watchdog notices.
        let backend = Arc::clone(&locker.shared().engine.backend);
        let lost = held.lost();
        let token = held.lease.token;
        let sem_backend = backend.semaphore().unwrap();
        assert!(
            sem_backend
                .release_permit(&LockKey::from("k"), token)
                .await
                .unwrap()
        );
        lost.await;
        assert!(held.is_lost());
        assert!(matches!(
            held.release().await,
            Err(Error::LeaseLost {
                phase: Phase::Releasing,
                ..
            })
        ));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(locker.active_semaphores(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_waiters_leak_nothing() {
        let locker = locker(1000);
        let sem = locker.semaphore("k", 3);
        let held: Vec<Permit> = futures::future::try_join_all((0..3).map(|_| sem.acquire()))
            .await
            .unwrap();
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let sem = sem.clone();
            tasks.push(tokio::spawn(async move { sem.acquire().await }));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(held);
        tokio::task::yield_now().await;
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(locker.active_semaphores(), 0);
        let all: Vec<Permit> = futures::future::try_join_all((0..3).map(|_| sem.try_acquire()))
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.expect("every permit is free again"))
            .collect();
        assert_eq!(all.len(), 3);
    }

    /// A released permit goes to the next local waiter: the same token, no backend
    /// request; past the budget (here two handoffs) it goes back to the backend and
    /// the next waiter gets a new one.
    #[tokio::test(start_paused = true)]
    async fn a_released_permit_goes_to_the_next_local_waiter_within_the_budget() {
        let locker = Locker::builder(MemoryBackend::new())
            .lease_ttl(Duration::from_secs(3))
            .handoff(Handoff::enabled().max_consecutive(2))
            .build()
            .unwrap();
        let sem = locker.semaphore("k", 1);
        let first = sem.acquire().await.unwrap();
        let token = first.lease.token;
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let sem = sem.clone();
                tokio::spawn(async move { sem.acquire().await.unwrap() })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let before = locker.stats();
        let mut permit = first;
        let mut tokens = Vec::new();
        for w in waiters {
            permit.release().await.unwrap();
            permit = w.await.unwrap();
            tokens.push(permit.lease.token);
        }
        let after = locker.stats();
        assert_eq!(
            tokens[..2],
            [token, token],
            "two handoffs of the same permit"
        );
        assert_ne!(
            tokens[2], token,
            "past the budget: a new permit from the backend"
        );
        assert_eq!(after.handoffs - before.handoffs, 2);
        assert_eq!(after.acquired - before.acquired, 1, "one backend grant");
        permit.release().await.unwrap();
        assert!(
            sem.try_acquire().await.unwrap().is_some(),
            "returned at the end"
        );
    }

    /// A lost permit and a permit with handoff off are never handed on: each goes
    /// back to the backend (fair mode is tested against Redis, which reports the
    /// other waiting instances).
    #[tokio::test(start_paused = true)]
    async fn a_lost_permit_or_handoff_off_goes_back_to_the_backend() {
        for handoff in [Handoff::enabled(), Handoff::disabled()] {
            let locker = Locker::builder(MemoryBackend::new())
                .lease_ttl(Duration::from_secs(3))
                .handoff(handoff)
                .build()
                .unwrap();
            let sem = locker.semaphore("k", 1);
            let held = sem.acquire().await.unwrap();
            let token = held.lease.token;
            let waiter = tokio::spawn({
                let sem = sem.clone();
                async move { sem.acquire().await.unwrap() }
            });
            tokio::time::sleep(Duration::from_millis(1)).await;
            if handoff.is_enabled() {
                // Lost: removed behind its back.
                let backend = Arc::clone(&locker.shared().engine.backend);
                let sem_backend = backend.semaphore().unwrap();
                assert!(
                    sem_backend
                        .release_permit(&LockKey::from("k"), token)
                        .await
                        .unwrap()
                );
                held.lost().await;
                assert!(matches!(held.release().await, Err(Error::LeaseLost { .. })));
            } else {
                held.release().await.unwrap();
            }
            let next = waiter.await.unwrap();
            assert_ne!(next.lease.token, token, "{handoff:?}: a new permit");
            assert_eq!(locker.stats().handoffs, 0, "{handoff:?}");
            next.release().await.unwrap();
        }
    }

    /// A permit handed to a local waiter and lost before the waiter woke (here a
    /// takeover, as a forced release announces it) is not used: the waiter returns
    /// it to the backend and waits for a live one.
    #[tokio::test(start_paused = true)]
    async fn a_permit_lost_before_its_waiter_woke_is_not_used() {
        let locker = locker(100);
        let sem = locker.semaphore("k", 1);
        let held = sem.acquire().await.unwrap();
        let token = held.lease.token;
        let waiter = tokio::spawn({
            let sem = sem.clone();
            async move { sem.acquire().await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        let wakeups = locker.shared().engine.backend.signals().clone();
        // Handed on, then lost, before the waiter runs (one thread, no await).
        drop(held);
        assert_eq!(locker.stats().handoffs, 1, "handed on");
        assert!(wakeups.take_over(token));
        let next = waiter.await.unwrap();
        assert_ne!(next.lease.token, token, "the waiter used the lost permit");
        assert!(!next.is_lost());
        next.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(locker.active_semaphores(), 0);
    }

    /// A runtime that shuts down with a request task and waiters leaves no local
    /// state behind: the next runtime acquires afresh (the permit its holder kept
    /// expires at its TTL).
    #[test]
    fn a_runtime_shutdown_leaves_no_stuck_state() {
        let locker = Locker::builder(MemoryBackend::new())
            .lease_ttl(Duration::from_millis(300))
            .build()
            .unwrap();
        let sem = locker.semaphore("k", 1);
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let held = sem.acquire().await.unwrap();
            for _ in 0..3 {
                let sem = sem.clone();
                tokio::spawn(async move { sem.acquire().await });
            }
            tokio::spawn(async move {
                let _held = held;
                std::future::pending::<()>().await
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(locker.active_semaphores(), 1);
        });
        drop(rt);
        assert_eq!(
            locker.active_semaphores(),
            0,
            "the request task's state went with it"
        );
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let p = sem
                .acquire_within(Duration::from_secs(5))
                .await
                .expect("the permit comes back");
            p.release().await.unwrap();
        });
    }
}
