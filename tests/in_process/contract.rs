//! The lease contract under faults, against a backend whose every call can be made
//! to fail, stall or lie: validity checked at grant, loss observed by every
//! observer on the monotonic clock, counters before signals, settings that cannot
//! renew in time rejected, background work that survives a change of runtime and a
//! shutdown, a failed release reconciled by the next leader, and no panic on
//! extreme durations.
//!
//! The backend here is [`MemoryBackend`] behind a fault plan; the Redis-specific
//! behaviour (scripts, replies, ACLs) is tested against real servers elsewhere.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockflight::backend::{Acquire, LeaseToken, Released, Renewal, Signals, WhenBusy};
use lockflight::{
    Error, Handoff, LockKey, Locker, LossPolicy, MemoryBackend, Result, backend::LockBackend,
    error::Phase,
};
use tokio::time::Instant;

/// What one backend call does instead of its normal work.
#[derive(Clone, Debug)]
enum Fault {
    /// Fail with this error (nothing done).
    Fail(Error),
    /// Do the work, then wait this long before answering.
    Late(Duration),
    /// Never answer (nothing done).
    Hang,
    /// Answer this acquire reply without doing anything.
    Acquire(Acquire),
    /// Answer this release reply without doing anything.
    Release(Released),
    /// Answer this renewal reply without doing anything.
    Renewal(Renewal),
}

#[derive(Debug, Default)]
struct Plan {
    acquire: VecDeque<Fault>,
    release: VecDeque<Fault>,
    renew: VecDeque<Fault>,
    /// Applied to every renewal once its queue is empty.
    renew_always: Option<Fault>,
}

/// [`MemoryBackend`] with a queue of faults per operation, and call counters.
#[derive(Clone, Debug, Default)]
struct Faulty {
    inner: MemoryBackend,
    plan: Arc<Mutex<Plan>>,
    acquires: Arc<AtomicU32>,
    releases: Arc<AtomicU32>,
    renewals: Arc<AtomicU32>,
}

impl Faulty {
    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan.lock().unwrap()
    }

    fn next(&self, pick: impl FnOnce(&mut Plan) -> Option<Fault>) -> Option<Fault> {
        pick(&mut self.plan())
    }
}

async fn apply<T>(fault: Option<Fault>, work: impl Future<Output = Result<T>>) -> Result<T> {
    match fault {
        None => work.await,
        Some(Fault::Fail(e)) => Err(e),
        Some(Fault::Late(d)) => {
            let out = work.await;
            tokio::time::sleep(d).await;
            out
        }
        Some(Fault::Hang) => std::future::pending().await,
        Some(other) => panic!("fault {other:?} does not fit this call"),
    }
}

#[async_trait]
impl LockBackend for Faulty {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        match self.next(|p| p.acquire.pop_front()) {
            Some(Fault::Acquire(reply)) => Ok(reply),
            fault => apply(fault, self.inner.acquire(key, token, ttl, when_busy)).await,
        }
    }

    async fn release(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        match self.next(|p| p.release.pop_front()) {
            Some(Fault::Release(reply)) => Ok(reply),
            fault => apply(fault, self.inner.release(key, token)).await,
        }
    }

    async fn renew(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        match self.next(|p| p.renew.pop_front().or_else(|| p.renew_always.clone())) {
            Some(Fault::Renewal(reply)) => Ok(reply),
            fault => apply(fault, self.inner.renew(key, token, ttl)).await,
        }
    }

    async fn leave(&self, key: &LockKey) -> Result<()> {
        self.inner.leave(key).await
    }

    fn signals(&self) -> &Signals {
        self.inner.signals()
    }
}

fn transient(key: &str, phase: Phase) -> Error {
    Error::backend(&LockKey::from(key), phase, "injected I/O error")
}

/// Runs `test` on a single-threaded runtime of its own, which the test may stall.
fn on_one_thread<F: std::future::Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(test)
}

/// A task that locks `key` with `locker` (and returns the guard).
fn spawn_lock(
    locker: &Locker,
    key: &'static str,
) -> tokio::task::JoinHandle<lockflight::Result<lockflight::LockGuard>> {
    let locker = locker.clone();
    tokio::spawn(async move { locker.lock(key).await })
}

fn locker(backend: &Faulty, ttl: Duration) -> Locker {
    Locker::builder(backend.clone())
        .lease_ttl(ttl)
        .wait_timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// Defect: loss was signalled before the counter moved, so a task woken by
/// `lost()` could read the old count. Many rounds on two worker threads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_is_counted_before_it_is_signalled() {
    let backend = Faulty::default();
    backend.plan().renew_always = Some(Fault::Renewal(Renewal::NotOwner));
    let locker = Locker::builder(backend.clone())
        .lease_ttl(Duration::from_millis(100))
        .build()
        .unwrap();
    for round in 1..=100u64 {
        let guard = locker.lock(format!("k{round}")).await.unwrap();
        guard.lost().await;
        assert_eq!(
            locker.stats().leases_lost,
            round,
            "a task woken by the loss signal must see it counted"
        );
        drop(guard);
    }
}

/// Defect: an acquire reply that arrives after `sent_at + ttl - drift` yielded a
/// guard that was not lost although its validity had ended.
#[tokio::test(start_paused = true)]
async fn a_reply_after_the_validity_window_is_not_a_grant() {
    let backend = Faulty::default();
    let ttl = Duration::from_secs(1);
    backend
        .plan()
        .acquire
        .push_back(Fault::Late(ttl + Duration::from_millis(10)));
    let locker = locker(&backend, ttl);
    let guard = locker.lock("k").await.unwrap();
    assert!(!guard.is_lost());
    assert!(
        guard.valid_for() > ttl / 2,
        "the grant came from a fresh acquire, valid for {:?}",
        guard.valid_for()
    );
    assert_eq!(backend.acquires.load(Ordering::SeqCst), 2, "asked again");
    guard.release().await.unwrap();
}

/// Defect: `lock_with_options` with `try_only` bounded its one backend request by
/// the locker's wait timeout, not the call's own `wait_timeout`.
#[tokio::test(start_paused = true)]
async fn a_try_only_call_is_bounded_by_its_own_wait_timeout() {
    let backend = Faulty::default();
    backend.plan().acquire.push_back(Fault::Hang);
    let locker = locker(&backend, Duration::from_secs(1)); // waits 5 s by default
    let options = lockflight::LockOptions::new()
        .try_only()
        .wait_timeout(Duration::from_millis(200));
    let start = Instant::now();
    let got = locker.lock_with_options("k", options).await;
    assert!(
        matches!(
            got,
            Err(Error::Timeout {
                phase: Phase::Acquiring,
                ..
            })
        ),
        "{got:?}"
    );
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(1),
        "waited {waited:?}"
    );
    // The key is free: nothing of the hung request stays behind.
    drop(locker.lock("k").await.unwrap());
}

/// Defect: a handed-off lease is checked at the local grant too: a waiter that
/// wakes after the lease's validity ended competes again instead of holding it.
#[test]
fn a_handed_off_lease_that_ran_out_is_not_granted() {
    on_one_thread(async {
        let backend = Faulty::default();
        let ttl = Duration::from_millis(300);
        let locker = Locker::builder(backend.clone())
            .lease_ttl(ttl)
            .handoff(Handoff::enabled().min_validity(Duration::from_millis(50)))
            .build()
            .unwrap();
        let guard = locker.lock("k").await.unwrap();
        let first = guard.fencing_token();
        let waiter = spawn_lock(&locker, "k");
        tokio::task::yield_now().await;
        // Hand off, then stall this single-threaded runtime past the validity
        // window before the waiter can run.
        drop(guard);
        std::thread::sleep(ttl + Duration::from_millis(50));
        let next = waiter.await.unwrap().unwrap();
        assert!(!next.is_lost(), "granted a lease that had already run out");
        assert!(next.valid_for() > Duration::ZERO);
        assert!(next.fencing_token() > first);
        next.release().await.unwrap();
    });
}

/// Defect: `is_lost()` trusted only the signal; after a stall it answered `false`
/// while the validity was already over.
#[test]
fn is_lost_follows_the_monotonic_clock_after_a_stall() {
    on_one_thread(async {
        let backend = Faulty::default();
        let locker = locker(&backend, Duration::from_millis(200));
        let guard = locker.lock("k").await.unwrap();
        let info = guard.info();
        // The runtime stalls: no renewal task can run.
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(guard.valid_for(), Duration::ZERO);
        assert!(guard.is_lost(), "validity ended, so the lease is lost");
        assert!(info.loss.is_lost());
        assert_eq!(locker.stats().leases_lost, 1);
        assert!(info.loss.reason().unwrap().contains("validity"));
    });
}

/// Defect: a renewal interval that starts too late for the TTL was accepted; and a
/// lease whose renewals never answer is signalled lost by the end of its
/// validity, not after it.
#[tokio::test(start_paused = true)]
async fn settings_that_cannot_renew_in_time_are_rejected_and_loss_is_on_time() {
    let backend = Faulty::default();
    let ttl = Duration::from_secs(1);
    let err = Locker::builder(backend.clone())
        .lease_ttl(ttl)
        .renew_every(Duration::from_millis(900))
        .build()
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig { .. }), "{err}");
    assert!(err.to_string().contains("renew_every"), "{err}");

    // The slowest accepted interval, with renewals that never answer.
    backend.plan().renew_always = Some(Fault::Hang);
    let locker = Locker::builder(backend.clone())
        .lease_ttl(ttl)
        .renew_every(Duration::from_millis(390))
        .build()
        .unwrap();
    let sent = Instant::now();
    let guard = locker.lock("k").await.unwrap();
    guard.lost().await;
    let at = sent.elapsed();
    assert!(
        at <= ttl,
        "loss signalled {at:?} after the acquire, TTL {ttl:?}"
    );
    assert!(at >= ttl * 9 / 10, "loss signalled early: {at:?}");
    assert!(backend.renewals.load(Ordering::SeqCst) >= 1);
    assert!(guard.is_lost());
}

/// Defect: the renewal driver was spawned once on the first runtime; a locker used
/// from a second runtime after the first ended held leases nobody renewed.
#[test]
fn a_locker_outlives_the_runtime_that_first_used_it() {
    let backend = Faulty::default();
    let locker = locker(&backend, Duration::from_millis(300));
    let first = tokio::runtime::Runtime::new().unwrap();
    first.block_on(async {
        locker.lock("k").await.unwrap().release().await.unwrap();
    });
    drop(first);
    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        let guard = locker.lock("k").await.unwrap();
        // Real time: the lease outlives three TTLs, renewed on this runtime.
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(!guard.is_lost(), "{:?}", guard.info().loss.reason());
        assert!(
            testkit::wait_until(testkit::EVENTUALLY, || async {
                locker.stats().renewals >= 2
            })
            .await,
            "renewed on the second runtime: {:?}",
            locker.stats()
        );
        guard.release().await.unwrap();
    });
    assert_eq!(locker.stats().keys_in_use, 0);
}

/// Defect: at runtime shutdown, background releases were spawned but never ran,
/// leaving the slot in `Releasing` forever. Now the key is left to expire at its
/// TTL and the locker works on the next runtime.
#[test]
fn a_runtime_shutdown_leaves_no_stuck_slot() {
    let backend = Faulty::default();
    let ttl = Duration::from_millis(300);
    let locker = Locker::builder(backend.clone())
        .lease_ttl(ttl)
        .handoff(Handoff::enabled())
        .build()
        .unwrap();
    let first = tokio::runtime::Runtime::new().unwrap();
    first.block_on(async {
        for key in ["a", "b"] {
            let guard = locker.lock(key).await.unwrap();
            // A holder task and a waiter task, both torn down by the shutdown.
            tokio::spawn(async move {
                let _guard = guard;
                std::future::pending::<()>().await;
            });
            let waiter = locker.clone();
            tokio::spawn(async move { waiter.lock(key).await });
        }
        tokio::task::yield_now().await;
    });
    drop(first);
    assert_eq!(locker.stats().keys_in_use, 0, "a slot outlived its runtime");
    let second = tokio::runtime::Runtime::new().unwrap();
    second.block_on(async {
        let started = Instant::now();
        let guard = locker.lock("a").await.unwrap();
        assert!(started.elapsed() < ttl + Duration::from_secs(1));
        guard.release().await.unwrap();
    });
}

/// Defect: after a release failed three times, the next local leader started
/// with a fresh token and the key blocked everyone until the TTL. Now the failed
/// token is released once more in the background (never acquired again: a late
/// copy of the failed release could delete a re-grant), and the next leader's
/// fresh token gets the lock with a newer fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_release_is_reconciled_by_the_next_leader() {
    let backend = Faulty::default();
    for _ in 0..3 {
        backend
            .plan()
            .release
            .push_back(Fault::Fail(transient("k", Phase::Releasing)));
    }
    // Without handoff: the release goes to the backend even though a task waits.
    let locker = Locker::builder(backend.clone())
        .lease_ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(3))
        .handoff(Handoff::disabled())
        .build()
        .unwrap();
    let guard = locker.lock("k").await.unwrap();
    let first = guard.fencing_token();
    let waiter = spawn_lock(&locker, "k");
    while locker.stats().local_waits == 0 {
        tokio::task::yield_now().await;
    }
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    let next = waiter
        .await
        .unwrap()
        .expect("the waiter reconciles the token instead of waiting out the TTL");
    assert!(
        next.fencing_token() > first,
        "fencing tokens strictly increase"
    );
    next.release().await.unwrap();
    assert!(locker.try_lock("k").await.unwrap().is_some());
}

/// Defect: `Duration::MAX` and friends overflowed `Instant` and panicked.
#[tokio::test]
async fn extreme_durations_are_rejected_or_saturate() {
    let backend = Faulty::default();
    let err = Locker::builder(backend.clone())
        .lease_ttl(Duration::MAX)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("lease_ttl"), "{err}");
    let err = Locker::builder(backend.clone())
        .handoff(Handoff::enabled().min_validity(Duration::MAX))
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("min_validity"), "{err}");
    let err = Locker::builder(backend.clone())
        .renew_every(Duration::MAX)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("renew_every"), "{err}");

    let locker = Locker::builder(backend.clone())
        .wait_timeout(Duration::MAX)
        .handoff(
            Handoff::enabled()
                .max_hold(Duration::MAX)
                .max_consecutive(u32::MAX),
        )
        .build()
        .unwrap();
    let guard = locker.lock("k").await.unwrap();
    assert!(locker.try_lock("k").await.unwrap().is_none());
    let waiter = tokio::spawn({
        let locker = locker.clone();
        async move {
            locker
                .lock_with_options(
                    "k",
                    lockflight::LockOptions::new().wait_timeout(Duration::MAX),
                )
                .await
        }
    });
    tokio::task::yield_now().await;
    drop(guard);
    waiter.await.unwrap().unwrap().release().await.unwrap();
}

/// Defect: `with_lock` returned `Ok` when the release found the lock no longer
/// ours: the work had run past its lease.
#[tokio::test]
async fn with_lock_reports_a_release_that_found_the_lock_gone() {
    let backend = Faulty::default();
    backend.plan().release.push_back(Fault::Release(Released {
        released: false,
        waiting: 0,
    }));
    let locker = Locker::builder(backend.clone())
        .on_loss(LossPolicy::Signal)
        .build()
        .unwrap();
    let err = locker
        .with_lock("k", |_| async { "done" })
        .await
        .unwrap_err();
    match err {
        Error::LeaseLost { key, phase, .. } => {
            assert_eq!(key, LockKey::from("k"));
            assert_eq!(phase, Phase::Releasing);
        }
        other => panic!("expected LeaseLost, got {other}"),
    }
}

/// A locker (3 s leases, `LossPolicy::Signal`) whose every renewal finds the lease
/// taken (`NotOwner`).
fn signal_locker_losing_its_lease() -> Locker {
    let backend = Faulty::default();
    backend.plan().renew_always = Some(Fault::Renewal(Renewal::NotOwner));
    Locker::builder(backend)
        .lease_ttl(Duration::from_secs(3))
        .on_loss(LossPolicy::Signal)
        .build()
        .unwrap()
}

/// Defect: under `LossPolicy::Signal` the work had no way to observe loss. Now
/// `LockInfo::loss` resolves and reads as lost, and the work runs to its end.
#[tokio::test(start_paused = true)]
async fn signal_policy_work_observes_loss_through_its_info() {
    let locker = signal_locker_losing_its_lease();
    let seen = locker
        .with_lock("k", |info| async move {
            assert!(!info.loss.is_lost());
            info.loss.lost().await;
            (
                info.loss.is_lost(),
                info.loss.valid_for(),
                info.loss.reason(),
            )
        })
        .await;
    // The work ran to its end, but not under a valid lease: its outcome is an error.
    let Err(Error::LeaseLost { .. }) = seen else {
        panic!("expected LeaseLost after a lost lease, got {seen:?}")
    };
    assert_eq!(locker.stats().leases_lost, 1);
}

/// The work's view under `Signal`: what it observed, for a lease lost mid-way.
#[tokio::test(start_paused = true)]
async fn signal_policy_loss_view() {
    let locker = signal_locker_losing_its_lease();
    let guard = locker.lock("k").await.unwrap();
    let info = guard.info();
    info.loss.lost().await;
    assert!(info.loss.is_lost());
    assert_eq!(info.loss.valid_for(), Duration::ZERO);
    assert!(info.loss.reason().unwrap().contains("no longer ours"));
    assert!(guard.is_lost());
}

/// Defect: refusals a retry cannot change were retried until the deadline, even
/// by `try_lock`. A `Refused` error is answered at once, and a renewal refused by
/// a read-only (demoted) node is a loss at once.
#[tokio::test(start_paused = true)]
async fn refusals_are_answered_at_once() {
    let backend = Faulty::default();
    let refused = |code: &str, phase| Error::Refused {
        key: LockKey::from("k"),
        phase,
        code: code.into(),
        source: Arc::new(std::io::Error::other(format!("{code} injected"))),
    };
    backend
        .plan()
        .acquire
        .push_back(Fault::Fail(refused("OOM", Phase::Acquiring)));
    backend
        .plan()
        .acquire
        .push_back(Fault::Fail(refused("OOM", Phase::Acquiring)));
    let locker = locker(&backend, Duration::from_secs(3));
    let started = Instant::now();
    let err = locker.try_lock("k").await.unwrap_err();
    assert!(matches!(err, Error::Refused { .. }), "{err}");
    let err = locker.lock("k").await.unwrap_err();
    assert!(matches!(err, Error::Refused { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(backend.acquires.load(Ordering::SeqCst), 2, "no retries");

    backend
        .plan()
        .renew
        .push_back(Fault::Fail(refused("READONLY", Phase::Renewing)));
    let guard = locker.lock("k").await.unwrap();
    let acquired = Instant::now();
    guard.lost().await;
    assert!(
        acquired.elapsed() < Duration::from_millis(1500),
        "lost at the first (refused) renewal, not at validity end: {:?}",
        acquired.elapsed()
    );
    assert!(guard.info().loss.reason().unwrap().contains("read-only"));
}

/// Defect: a waiting acquire refused with `NOREPLICAS` asked again until its
/// wait ran out and then said only "timed out": the cause was lost. A timeout
/// names the last failed attempt (and has it as its `source()`); one whose
/// last answer was "busy" ran out on contention and says nothing more.
#[tokio::test(start_paused = true)]
async fn a_timeout_after_a_refusal_names_the_refusal() {
    let backend = Faulty::default();
    let too_few = lockflight::redis::make_extension_error(
        "NOREPLICAS".to_owned(),
        Some("0 of the 1 replicas required acknowledged the write within 100ms".to_owned()),
    );
    let refused = Error::Refused {
        key: LockKey::from("k"),
        phase: Phase::Acquiring,
        code: "NOREPLICAS".into(),
        source: Arc::new(too_few),
    };
    // Refused, then the retry is still in flight when the wait ends.
    backend
        .plan()
        .acquire
        .push_back(Fault::Fail(refused.clone()));
    backend.plan().acquire.push_back(Fault::Hang);
    let locker = Locker::builder(backend.clone())
        .wait_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let err = locker.lock("k").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "lock k: timed out after 1s while acquiring; the last attempt was refused: \
         NOREPLICAS: 0 of the 1 replicas required acknowledged the write within 100ms"
    );
    let source = std::error::Error::source(&err).expect("the refusal is the source");
    assert_eq!(
        source.to_string(),
        "lock k: the server refused the command while acquiring: \
         NOREPLICAS: 0 of the 1 replicas required acknowledged the write within 100ms"
    );
    assert_eq!(err.code(), "lock_timeout");

    // Refused, then busy (another instance holds the key) until the wait ends:
    // a plain timeout.
    let other = Locker::builder(backend.inner.clone()).build().unwrap();
    let holder = other.lock("k2").await.unwrap();
    backend.plan().acquire.push_back(Fault::Fail(refused));
    let err = locker.lock("k2").await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "lock k2: timed out after 1s while acquiring"
    );
    assert!(std::error::Error::source(&err).is_none());
    holder.release().await.unwrap();
}

/// Defect: a malformed epoch silently became 0 (no fencing). An acquire granted
/// without an epoch is an error, and the token is released, not leaked.
#[tokio::test]
async fn a_grant_without_an_epoch_is_an_error() {
    let backend = Faulty::default();
    backend
        .plan()
        .acquire
        .push_back(Fault::Acquire(Acquire::Acquired {
            epoch: 0,
            waiting: 0,
            earliest_other: None,
        }));
    let locker = locker(&backend, Duration::from_secs(3));
    let err = locker.lock("k").await.unwrap_err();
    assert!(matches!(err, Error::Backend { .. }), "{err}");
    assert!(err.to_string().contains("epoch"), "{err}");
    // The cleanup runs in the background; `shutdown` waits for it.
    locker.shutdown().await;
    assert_eq!(
        backend.releases.load(Ordering::SeqCst),
        1,
        "the token of a rejected grant is released"
    );
    assert_eq!(locker.stats().keys_in_use, 0);
}

/// Defect: taking a cached lease that could no longer be handed on (under
/// `min_validity` left while its renewals failed) awaited its backend release
/// without bound: a `try_lock` or a `lock_within` whose deadline passed meanwhile
/// waited as long as that release did. It now ends at the deadline with a
/// timeout, and the release goes on in the background.
#[tokio::test(start_paused = true)]
async fn taking_a_spent_cached_lease_keeps_the_callers_deadline() {
    let backend = Faulty::default();
    let wait = Duration::from_secs(1);
    for call in ["try_lock", "lock_within"] {
        let key = call;
        let locker = Locker::builder(backend.clone())
            .lease_ttl(Duration::from_secs(3))
            .wait_timeout(wait)
            .handoff(Handoff::enabled().max_hold(Duration::from_secs(600)))
            .cache_leases_for(Duration::from_secs(600))
            .build()
            .unwrap();
        // Released at the backend once, the key is warm: its next lease is cached.
        locker.lock(key).await.unwrap().release().await.unwrap();
        locker.lock(key).await.unwrap().release().await.unwrap();
        assert_eq!(
            locker.stats().keys_in_use,
            1,
            "{call}: the lease is not cached"
        );
        // Its renewals fail until less than `min_validity` (1 s) is left.
        backend.plan().renew_always = Some(Fault::Fail(transient(key, Phase::Renewing)));
        tokio::time::sleep(Duration::from_millis(2_500)).await;
        backend.plan().renew_always = None;
        backend.plan().release.push_back(Fault::Hang);
        let start = Instant::now();
        let taken = tokio::time::timeout(Duration::from_secs(60), async {
            match call {
                "try_lock" => locker.try_lock(key).await.map(|_| ()),
                _ => locker
                    .lock_with_options(key, lockflight::LockOptions::new().wait_timeout(wait))
                    .await
                    .map(|_| ()),
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{call} waited for the spent lease's release"));
        let err = taken.unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{call}: {err}");
        assert_eq!(start.elapsed(), wait, "{call}");
        // The release was re-run in the background, and the slot settled.
        locker.shutdown().await;
        assert_eq!(locker.stats().keys_in_use, 0, "{call}");
    }
}
