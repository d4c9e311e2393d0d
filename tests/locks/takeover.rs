//! Takeovers behind the holder's back that are announced: an operator's forced
//! release (`Inspector::force_release`, `lockflight release --force`) tells the
//! holder's instance, which marks exactly that lease lost at once. From then on no
//! new local section starts on it — not from the mutex's cache, not by a handoff to
//! a local waiter (mutex or permit), not by a reader joining a shared read lease —
//! and the releases of the sections that overlapped the takeover report
//! `LeaseLost`.
//!
//! Every locker here renews every 20 s with 60 s leases, and hands on or caches a
//! lease for up to a minute: only the loss message can explain a loss seen within
//! the tests' 10 s waits, and only the loss can keep a lease from being handed on.

use std::time::Duration;

use lockflight::inspect::{ForcedRelease, Inspector};
use lockflight::{Error, Handoff, Locker, RedisBackend};
use testkit::{eventually, shared_scene, wait_until, within};

/// How long a loss message may take here: far less than a renewal (20 s).
const TOLD: Duration = Duration::from_secs(10);

/// A locker on the shared server under `prefix` whose leases no renewal touches
/// within [`TOLD`], and whose handoff budget and linger (a minute, ten minutes)
/// never end a lease during a test.
async fn instance(prefix: &str) -> Locker {
    let backend = RedisBackend::builder(testkit::shared().url())
        .prefix(prefix)
        .connect()
        .await
        .expect("connect");
    Locker::builder(backend)
        .lease_ttl(Duration::from_secs(60))
        .renew_every(Duration::from_secs(20))
        .wait_timeout(Duration::from_secs(20))
        .handoff(Handoff::enabled().max_hold(Duration::from_secs(60)))
        .cache_leases_for(Duration::from_secs(600))
        .build()
        .expect("valid settings")
}

/// The operator's forced release of `key`.
async fn force(prefix: &str, key: &str) -> ForcedRelease {
    let mut conn = testkit::shared().connection().await;
    Inspector::new(prefix)
        .force_release(&mut conn, key, &[])
        .await
        .expect("forced release")
}

fn is_lease_lost<T: std::fmt::Debug>(r: lockflight::Result<T>) -> bool {
    matches!(r, Err(Error::LeaseLost { .. }))
}

/// Makes `key` warm at `a` (a lease asked for soon after a backend release of
/// the key may be cached), then leaves a lease of it in `a`'s cache.
async fn cache_a_lease(a: &Locker, key: &str) -> lockflight::FencingToken {
    a.lock(key).await.unwrap().release().await.unwrap();
    let g = a.lock(key).await.unwrap();
    let token = g.fencing_token();
    g.release().await.unwrap();
    token
}

/// `a`'s next lock of `key` does not start while `b_guard` holds it: it waits,
/// and once B lets go it gets a lease with a token newer than B's.
async fn next_lock_waits_for_b(a: &Locker, key: &'static str, b_guard: lockflight::LockGuard) {
    let tb = b_guard.fencing_token();
    let asked = a.stats().acquire_attempts;
    let next = tokio::spawn({
        let a = a.clone();
        async move { a.lock(key).await }
    });
    // A asked (and was told to wait), then a window for a wrong grant to show.
    eventually("A's next lock asked", || async {
        a.stats().acquire_attempts > asked
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !next.is_finished(),
        "A's next lock was granted while B holds the key: {:?}",
        next.await
    );
    b_guard.release().await.unwrap();
    let next = within(TOLD, "A's lock after B's release", next)
        .await
        .unwrap()
        .unwrap();
    assert!(
        next.fencing_token() > tb,
        "A started on a lease older than B's: {:?} after {tb:?}",
        next.fencing_token()
    );
    next.release().await.unwrap();
}

/// A section running on a lease taken from the cache (a worker that locks one key
/// in a loop) learns of a forced release without waiting for a renewal; its
/// release reports the loss, and the next lock waits for the new holder instead
/// of starting on the dead lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_under_a_section_on_a_cached_lease_is_felt_at_once() {
    let (_, _log, prefix) = shared_scene("takeover-cached-section");
    let (a, b) = (instance(&prefix).await, instance(&prefix).await);
    let cached = cache_a_lease(&a, "k").await;
    let section = a.lock("k").await.unwrap();
    assert_eq!(
        section.fencing_token().epoch,
        cached.epoch,
        "the section runs on the cached lease"
    );
    let loss = section.loss_signal();

    let forced = force(&prefix, "k").await;
    assert!(forced.holder.is_some(), "{forced:?}");
    within(TOLD, "A learns of the takeover", loss.lost()).await;
    let reason = loss.reason().expect("lost");
    assert!(reason.contains("forced release"), "{reason}");

    let gb = b
        .try_lock("k")
        .await
        .unwrap()
        .expect("B takes the freed key");
    assert!(
        is_lease_lost(section.release().await),
        "the overlapped section's release reported Ok"
    );
    next_lock_waits_for_b(&a, "k", gb).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// An idle cached lease that a forced release deleted is lost at once (its loss
/// signal, kept from the last section, fires), and the next lock does not take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_of_an_idle_cached_lease_is_felt_at_once() {
    let (_, _log, prefix) = shared_scene("takeover-cached-idle");
    let (a, b) = (instance(&prefix).await, instance(&prefix).await);
    a.lock("k").await.unwrap().release().await.unwrap();
    let last = a.lock("k").await.unwrap();
    let loss = last.loss_signal();
    last.release().await.unwrap();
    assert_eq!(a.stats().keys_in_use, 1, "the lease is cached");

    force(&prefix, "k").await;
    within(TOLD, "A learns of the takeover", loss.lost()).await;
    let gb = b
        .try_lock("k")
        .await
        .unwrap()
        .expect("B takes the freed key");
    next_lock_waits_for_b(&a, "k", gb).await;
    a.shutdown().await;
    b.shutdown().await;
}

/// A holder with a local waiter: after a forced release its release goes to the
/// backend and reports the loss, instead of handing the dead lease to the waiter,
/// which waits for the new holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_stops_the_handoff_to_a_local_waiter() {
    let (_, _log, prefix) = shared_scene("takeover-handoff");
    let (a, b) = (instance(&prefix).await, instance(&prefix).await);
    let held = a.lock("k").await.unwrap();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.lock("k").await }
    });
    assert!(
        wait_until(TOLD, || {
            let waits = a.stats().local_waits;
            async move { waits == 1 }
        })
        .await,
        "the waiter never queued"
    );

    force(&prefix, "k").await;
    within(TOLD, "A learns of the takeover", held.lost()).await;
    let gb = b
        .try_lock("k")
        .await
        .unwrap()
        .expect("B takes the freed key");
    let tb = gb.fencing_token();
    assert!(
        is_lease_lost(held.release().await),
        "the overlapped section's release reported Ok"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "A's waiter started while B holds the key: {:?}",
        waiter.await
    );
    gb.release().await.unwrap();
    let next = within(TOLD, "A's waiter after B's release", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > tb);
    assert_eq!(a.stats().handoffs, 0, "the dead lease was handed on");
    next.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// A permit holder with a local waiter: after a forced release (and another
/// instance taking the only permit) its release reports the loss instead of
/// handing the dead permit to the waiter, which waits for a live one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_stops_the_handoff_of_a_permit() {
    let (server, _log, prefix) = shared_scene("takeover-permit");
    let (a, b) = (instance(&prefix).await, instance(&prefix).await);
    let (sa, sb) = (a.semaphore("s", 1), b.semaphore("s", 1));
    let held = sa.acquire().await.unwrap();

    let forced = force(&prefix, "s").await;
    assert_eq!(forced.permits, 1, "{forced:?}");
    within(TOLD, "A learns of the takeover", held.lost()).await;
    let pb = sb
        .try_acquire()
        .await
        .unwrap()
        .expect("B takes the freed permit");
    // A's waiter asks the backend (B holds the permit) and waits.
    let waiter = tokio::spawn(async move { sa.acquire().await });
    let conn = server.connection().await;
    let inspector = Inspector::new(prefix.as_str());
    assert!(
        wait_until(TOLD, || {
            let (inspector, mut conn) = (inspector.clone(), conn.clone());
            async move {
                let state = inspector.key(&mut conn, "s").await.unwrap();
                state.permit_queue.len() == 1
            }
        })
        .await,
        "A's waiter never waited at the backend"
    );

    assert!(
        is_lease_lost(held.release().await),
        "the overlapped permit's release reported Ok"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "A's waiter got a permit while B holds the only one: {:?}",
        waiter.await
    );
    pb.release().await.unwrap();
    let next = within(TOLD, "A's waiter after B's release", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(a.stats().handoffs, 0, "the dead permit was handed on");
    next.release().await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// One forced release tells every holder of every kind of a key, one message per
/// lease, and each instance marks exactly its leases lost: the mutex holder, the
/// read leases of two instances (one shared by two local readers), the permits.
/// A reader that arrives afterwards does not join the dead read lease: it gets a
/// new one, which saw the forced write fence. A write lease of another key is told
/// too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_tells_every_holder_of_every_kind() {
    let (_, _log, prefix) = shared_scene("takeover-kinds");
    let (a, b) = (instance(&prefix).await, instance(&prefix).await);
    let mutex = a.lock("k").await.unwrap();
    // Two local readers on one read lease: the second arrives while the first
    // acquires, and joins it.
    let (r1, r2) = tokio::join!(a.rwlock("k").read(), a.rwlock("k").read());
    let (r1, r2) = (r1.unwrap(), r2.unwrap());
    let rb = b.rwlock("k").read().await.unwrap();
    let pa = a.semaphore("k", 3).acquire().await.unwrap();
    let pb1 = b.semaphore("k", 3).acquire().await.unwrap();
    let pb2 = b.semaphore("k", 3).acquire().await.unwrap();
    // A lease of another key of the same instance: not touched.
    let untouched = b.lock("other").await.unwrap();

    let forced = force(&prefix, "k").await;
    assert_eq!(
        (
            forced.readers,
            forced.permits,
            forced.told,
            forced.receivers
        ),
        (2, 3, 6, 6),
        "one message per lease, each received by its instance: {forced:?}"
    );
    for (what, lost) in [
        ("the mutex", mutex.lost()),
        ("a shared read lease", r1.lost()),
        ("B's read lease", rb.lost()),
        ("A's permit", pa.lost()),
        ("B's first permit", pb1.lost()),
        ("B's second permit", pb2.lost()),
    ] {
        within(TOLD, what, lost).await;
    }
    assert!(!untouched.is_lost(), "another key's lease was marked lost");

    // A newcomer does not join the dead read lease: a new one, from the backend.
    let r3 = within(TOLD, "a new reader", a.rwlock("k").read())
        .await
        .unwrap();
    assert!(!r3.is_lost());
    assert_eq!(r3.last_write(), forced.write_fence);
    for (what, released) in [
        (
            "a reader that leaves another on the lease",
            r1.release().await,
        ),
        ("the last reader of the dead lease", r2.release().await),
        ("B's reader", rb.release().await),
        ("the mutex", mutex.release().await),
        ("A's permit", pa.release().await),
        ("B's permit", pb1.release().await),
    ] {
        assert!(is_lease_lost(released), "{what}: reported Ok");
    }
    drop(pb2);
    r3.release().await.unwrap();
    untouched.release().await.unwrap();

    let w = a.rwlock("w").write().await.unwrap();
    let forced = force(&prefix, "w").await;
    assert_eq!((forced.told, forced.receivers), (1, 1), "{forced:?}");
    within(TOLD, "the writer learns of the takeover", w.lost()).await;
    assert!(is_lease_lost(w.release().await));
    a.shutdown().await;
    b.shutdown().await;
}
