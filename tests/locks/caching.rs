//! Lease caching (`LockerBuilder::cache_leases_for`) against a real Redis: a released lease that no
//! local task wants is kept for the next local `lock` of the key, within the
//! handoff budget, and released at the backend when the linger ends, when the
//! budget is spent, or at `Locker::shutdown`. Each instance is its own
//! `RedisBackend` (its own connections and instance id) behind a request counter.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lockflight::{Contention, Error, Handoff, Locker, RedisBackend};
use testkit::{Counting, CountingProxy, Counts, shared, unique_prefix, wait_until, within};

/// A locker on the shared server under `prefix`, with `handoff` and the default
/// lease caching, its backend requests counted.
async fn instance(prefix: &str, handoff: Handoff) -> (Locker, Arc<Counts>) {
    instance_with(prefix, handoff, None).await
}

/// [`instance`], caching leases for `cache` (`None`: the default).
async fn instance_with(
    prefix: &str,
    handoff: Handoff,
    cache: Option<Duration>,
) -> (Locker, Arc<Counts>) {
    let backend = RedisBackend::builder(shared().url())
        .prefix(prefix)
        .connect()
        .await
        .expect("connect");
    let (backend, counts) = Counting::new(backend);
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_secs(30))
        .wait_timeout(Duration::from_secs(20))
        .handoff(handoff);
    let locker = match cache {
        Some(d) => locker.cache_leases_for(d),
        None => locker,
    }
    .build()
    .expect("valid settings");
    (locker, counts)
}

fn acquires(c: &Counts) -> u64 {
    c.acquire.load(Ordering::SeqCst)
}

fn releases(c: &Counts) -> u64 {
    c.release.load(Ordering::SeqCst)
}

/// `locker`'s `try_lock` of `key`, tried again until it gets the key: a release
/// is counted when it is sent, so a try may still reach the backend first.
async fn take_once_free(locker: &Locker, key: &str, what: &str) -> lockflight::LockGuard {
    within(Duration::from_secs(10), what, async {
        loop {
            if let Some(g) = locker.try_lock(key).await.unwrap() {
                break g;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// The handoff budget under which a lease cached for `linger` is kept until the
/// linger ends (or a revocation, a release or `shutdown` ends it): a hold budget
/// (`max_hold`) at least as long as the linger, since an idle cached lease also
/// ends with its budget (250 ms by default).
fn budget(linger: Duration) -> Handoff {
    Handoff::enabled().max_hold(linger.max(Handoff::DEFAULT_MAX_HOLD))
}

/// Makes `key` warm at `a`: caching keeps only a lease of a key that `a` released
/// at the backend less than a second before taking it, so one lock of a cold key
/// goes back to the backend at once. With `counts`, it checks that and then
/// counts afresh.
async fn warm(a: &Locker, counts: Option<&Counts>, key: &str) {
    let before = counts.map(releases);
    a.lock(key).await.unwrap().release().await.unwrap();
    if let (Some(c), Some(before)) = (counts, before) {
        assert_eq!(releases(c), before + 1, "a cold key's lease was cached");
        c.acquire.store(0, Ordering::SeqCst);
        c.release.store(0, Ordering::SeqCst);
    }
}

/// A locker behind a proxy that can cut it off (`blackhole`): 1 s leases renewed
/// every 200 ms, and a linger (600 s) and hold budget that only a release or a
/// revocation ends.
async fn cut_off_able(prefix: &str) -> (CountingProxy, Locker) {
    let proxy = CountingProxy::start(shared()).await;
    let a = Locker::builder(
        RedisBackend::builder(proxy.url())
            .prefix(prefix)
            .response_timeout(Duration::from_millis(300))
            .connect()
            .await
            .unwrap(),
    )
    .lease_ttl(Duration::from_secs(1))
    .renew_every(Duration::from_millis(200))
    .wait_timeout(Duration::from_secs(10))
    .handoff(budget(Duration::from_secs(600)))
    .cache_leases_for(Duration::from_secs(600))
    .build()
    .unwrap();
    (proxy, a)
}

/// After the partition healed: A's next lock acquires anew, with a token greater
/// than `tb` (the other instance's), instead of using its cut-off cached lease.
async fn locks_anew_after_the_partition(a: &Locker, tb: lockflight::FencingToken) {
    let again = within(
        Duration::from_secs(15),
        "A locks after the partition",
        a.lock("k"),
    )
    .await
    .unwrap();
    assert!(
        again.fencing_token() > tb,
        "A used its cut-off cached lease: {:?} after B's {tb:?}",
        again.fencing_token()
    );
    again.release().await.unwrap();
    a.shutdown().await;
}

/// The next `lock` after a release takes the cached lease without a backend
/// request, with the next fencing token of the same lease; when the linger ends,
/// the lease is released at the backend and another instance can take the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_lock_takes_the_cached_lease_without_a_request() {
    let prefix = unique_prefix("cached-next");
    let linger = Duration::from_millis(300);
    let (a, counts) = instance_with(&prefix, budget(linger), Some(linger)).await;
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    warm(&a, Some(&counts), "k").await;

    let first = a.lock("k").await.unwrap();
    let t1 = first.fencing_token();
    first.release().await.unwrap();
    let second = a.lock("k").await.unwrap();
    let t2 = second.fencing_token();
    assert_eq!(acquires(&counts), 1, "the second lock asked the backend");
    assert_eq!(
        releases(&counts),
        0,
        "the cached lease was released at the backend"
    );
    assert_eq!(t2.epoch, t1.epoch, "the same lease");
    assert!(t2 > t1, "fencing tokens must increase: {t1:?} then {t2:?}");
    second.release().await.unwrap();
    // Nobody asks for the key: the linger's end releases it.
    assert!(
        wait_until(Duration::from_secs(5), || async { releases(&counts) == 1 }).await,
        "the linger ended without a backend release"
    );
    let g = take_once_free(&b, "k", "B takes the key after the linger").await;
    assert_eq!(releases(&counts), 1, "A released the lease more than once");
    assert!(g.fencing_token() > t2);
    g.release().await.unwrap();
    assert_eq!(a.stats().keys_in_use, 0, "A keeps nothing for the key");
}

/// Another instance that waits for a cached key gets it once A lets it go (at
/// once, on its revocation; at the latest when the linger ends), woken by A's
/// release, with a greater fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_waiter_gets_the_key_when_the_linger_ends() {
    let prefix = unique_prefix("cached-remote");
    let (a, counts) = instance_with(
        &prefix,
        Handoff::enabled(),
        Some(Duration::from_millis(200)),
    )
    .await;
    let (b, _) = instance(&prefix, Handoff::enabled()).await;
    warm(&a, Some(&counts), "k").await;
    let g = a.lock("k").await.unwrap();
    let ta = g.fencing_token();
    g.release().await.unwrap();
    let got = within(
        Duration::from_secs(10),
        "B's lock of the cached key",
        b.lock("k"),
    )
    .await
    .unwrap();
    assert_eq!(releases(&counts), 1, "B got the key before A released it");
    assert!(got.fencing_token() > ta);
    got.release().await.unwrap();
}

/// `shutdown` releases every cached lease at once and stops caching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_cached_leases_and_stops_caching() {
    let prefix = unique_prefix("cached-shutdown");
    // A linger far longer than the test: only shutdown can release.
    let (a, counts) = instance_with(
        &prefix,
        budget(Duration::from_secs(600)),
        Some(Duration::from_secs(600)),
    )
    .await;
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    for key in ["k1", "k2"] {
        warm(&a, Some(&counts), key).await;
        a.lock(key).await.unwrap().release().await.unwrap();
    }
    assert_eq!(releases(&counts), 0);
    within(Duration::from_secs(10), "shutdown", a.shutdown()).await;
    assert_eq!(releases(&counts), 2, "shutdown released both cached leases");
    for key in ["k1", "k2"] {
        let g = b.try_lock(key).await.unwrap();
        assert!(g.is_some(), "{key} is still held after shutdown");
        g.unwrap().release().await.unwrap();
    }
    // After shutdown a release goes to the backend at once.
    a.lock("k1").await.unwrap().release().await.unwrap();
    assert_eq!(releases(&counts), 3, "a lease was cached after shutdown");
    let g = b.try_lock("k1").await.unwrap();
    assert!(g.is_some(), "k1 is held after A's release");
}

/// Caching spends the handoff budget: with `max_consecutive(3)`, five locks in a
/// row take two leases from the backend, and the first goes back after its
/// third reuse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caching_stays_within_the_handoff_budget() {
    let prefix = unique_prefix("cached-budget");
    let handoff = budget(Duration::from_secs(600)).max_consecutive(3);
    let (a, counts) = instance_with(&prefix, handoff, Some(Duration::from_secs(600))).await;
    let mut last = None;
    warm(&a, Some(&counts), "k").await;
    for _ in 0..5 {
        let g = a.lock("k").await.unwrap();
        let t = g.fencing_token();
        assert!(last < Some(t), "tokens must increase: {last:?} then {t:?}");
        last = Some(t);
        g.release().await.unwrap();
    }
    assert_eq!(acquires(&counts), 2, "five locks, two leases");
    assert_eq!(
        releases(&counts),
        1,
        "the spent lease went back to the backend"
    );
    a.shutdown().await;
    assert_eq!(releases(&counts), 2);
}

/// A cached lease that is lost meanwhile (deleted in Redis; the renewal finds it
/// gone) is not handed to the next lock: that lock acquires a new lease, with a
/// greater fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_lease_lost_meanwhile_is_not_handed_on() {
    let prefix = unique_prefix("cached-lost");
    let backend = RedisBackend::builder(shared().url())
        .prefix(&prefix)
        .connect()
        .await
        .unwrap();
    let (backend, counts) = Counting::new(backend);
    let a = Locker::builder(backend)
        .lease_ttl(Duration::from_secs(2))
        .renew_every(Duration::from_millis(200))
        .handoff(budget(Duration::from_secs(600)))
        .cache_leases_for(Duration::from_secs(600))
        .build()
        .unwrap();
    warm(&a, Some(&counts), "k").await;
    let g = a.lock("k").await.unwrap();
    let t1 = g.fencing_token();
    g.release().await.unwrap();
    let mut con = shared().connection().await;
    let deleted: u64 = redis::cmd("DEL")
        .arg(format!("{prefix}:{{k}}"))
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(deleted, 1, "the cached lease is held in Redis");
    assert!(
        wait_until(Duration::from_secs(5), || async {
            a.stats().leases_lost >= 1
        })
        .await,
        "the renewal did not find the cached lease gone"
    );
    let g = a.lock("k").await.unwrap();
    assert_eq!(acquires(&counts), 2, "the lost lease was handed on");
    assert!(g.fencing_token() > t1);
    g.release().await.unwrap();
    a.shutdown().await;
}

/// Fair mode never caches: a release frees the key at once for another instance,
/// and a cache set with it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_never_caches() {
    let prefix = unique_prefix("cached-fair");
    let fair = || async {
        Locker::builder(testkit::backend_at(&shared().url(), &prefix).await)
            .contention(Contention::Fair)
    };
    let e = fair()
        .await
        .cache_leases_for(Duration::from_secs(600))
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e:?}");
    let a = fair().await.build().unwrap();
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    warm(&a, None, "k").await;
    a.lock("k").await.unwrap().release().await.unwrap();
    let g = b.try_lock("k").await.unwrap();
    assert!(g.is_some(), "a fair release left the key held");
    assert_eq!(a.stats().keys_in_use, 0);
}

/// A partition while the lease is cached (the holder cannot renew: a paused or
/// cut-off process): the cached lease runs out on the holder's own clock, another
/// instance takes the key, and once the partition heals the holder's next lock
/// acquires anew, with a token greater than the other instance's, instead of
/// using the cached lease it no longer has.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_lease_cut_off_by_a_partition_is_not_used_after_it() {
    let prefix = unique_prefix("cached-partition");
    let (proxy, a) = cut_off_able(&prefix).await;
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    warm(&a, None, "k").await;
    let g = a.lock("k").await.unwrap();
    let ta = g.fencing_token();
    g.release().await.unwrap();

    proxy.blackhole(true);
    assert!(
        wait_until(Duration::from_secs(5), || async {
            a.stats().leases_lost >= 1
        })
        .await,
        "the cached lease's validity did not run out while A was cut off"
    );
    let gb = within(Duration::from_secs(10), "B takes the key", b.lock("k"))
        .await
        .unwrap();
    let tb = gb.fencing_token();
    assert!(tb > ta);
    gb.release().await.unwrap();
    proxy.blackhole(false);
    locks_anew_after_the_partition(&a, tb).await;
}

/// `shutdown` dropped after its first poll (its releases sent, not answered):
/// the releases finish in the background, so the key is free well before the
/// linger (600 s) would have released it, and caching stays off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_shutdown_still_releases_in_the_background() {
    use futures::FutureExt;
    let prefix = unique_prefix("cached-shutdown-dropped");
    let (a, counts) = instance_with(
        &prefix,
        budget(Duration::from_secs(600)),
        Some(Duration::from_secs(600)),
    )
    .await;
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    warm(&a, Some(&counts), "k").await;
    a.lock("k").await.unwrap().release().await.unwrap();
    assert_eq!(releases(&counts), 0, "cached");
    assert!(
        a.shutdown().now_or_never().is_none(),
        "shutdown answered at once"
    );
    assert!(
        wait_until(Duration::from_secs(5), || async {
            match b.try_lock("k").await.unwrap() {
                Some(g) => {
                    g.release().await.unwrap();
                    true
                }
                None => false,
            }
        })
        .await,
        "the release begun by the dropped shutdown never finished"
    );
    // The dropped attempt may have been sent, and the background one again.
    let before = releases(&counts);
    assert!(before >= 1);
    a.lock("k").await.unwrap().release().await.unwrap();
    assert_eq!(
        releases(&counts),
        before + 1,
        "a lease was cached after shutdown began"
    );
}

/// Revocation: another instance that queues for a key whose lease A keeps cached
/// and idle makes A let go at once, not when A's linger (60 s here) ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_instance_revokes_an_idle_cached_lease() {
    let prefix = unique_prefix("cached-revoked");
    let (a, counts) = instance_with(
        &prefix,
        budget(Duration::from_secs(60)),
        Some(Duration::from_secs(60)),
    )
    .await;
    let (b, _) = instance(&prefix, Handoff::enabled()).await;
    warm(&a, Some(&counts), "k").await;
    let g = a.lock("k").await.unwrap();
    let ta = g.fencing_token();
    g.release().await.unwrap();
    assert_eq!(releases(&counts), 0, "cached");
    let got = within(
        Duration::from_secs(10),
        "B's lock of a cached key (the linger is 60 s)",
        b.lock("k"),
    )
    .await
    .unwrap();
    assert_eq!(releases(&counts), 1, "A released the revoked lease");
    assert!(got.fencing_token() > ta);
    got.release().await.unwrap();
    assert_eq!(a.stats().keys_in_use, 0, "A keeps nothing for the key");
    // Another instance wanted the key: A does not cache it for a while (its
    // turns with B would only make B wait for revocations).
    a.lock("k").await.unwrap().release().await.unwrap();
    assert_eq!(releases(&counts), 2, "A cached a key B wanted a moment ago");
    a.shutdown().await;
}

/// A revocation that comes while A's task uses the lease does not end the hold
/// (the handoff budget bounds how long A keeps a key others wait for), but it is
/// remembered: A's release caches the lease only for a moment (a task of A that
/// locks again at once could take it), so B, queued during A's hold and sending
/// no second revocation, gets the key right after A's release, not when A's
/// linger (600 s) ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_during_a_hold_shortens_the_linger() {
    let prefix = unique_prefix("cached-revoke-held");
    let linger = Duration::from_secs(600);
    // A budget that the hold below does not spend (the default max_hold is 250 ms).
    let handoff = Handoff::enabled().max_hold(Duration::from_secs(20));
    let (a, counts) = instance_with(&prefix, handoff, Some(linger)).await;
    let (b, b_counts) = instance(&prefix, Handoff::enabled()).await;
    warm(&a, Some(&counts), "k").await;
    let g = a.lock("k").await.unwrap();
    let ta = g.fencing_token();
    let waiter = tokio::spawn(async move {
        let got = b.lock("k").await.unwrap();
        let token = got.fencing_token();
        got.release().await.unwrap();
        token
    });
    // B's acquire was answered (busy: B queued and sent its revocation) while A
    // holds the lease.
    assert!(
        wait_until(Duration::from_secs(5), || async {
            acquires(&b_counts) >= 1 && b_counts.in_flight.load(Ordering::SeqCst) == 0
        })
        .await
    );
    assert!(!g.is_lost(), "the revocation ended A's hold");
    let released_at = tokio::time::Instant::now();
    g.release().await.unwrap();
    let tb = within(Duration::from_secs(15), "B's lock", waiter)
        .await
        .unwrap();
    let after_release = released_at.elapsed();
    println!("B got the key {after_release:?} after A's release");
    assert!(tb > ta);
    assert!(
        after_release < Duration::from_secs(10),
        "B got the key {after_release:?} after A's release: the revoked lease was cached for the linger"
    );
    assert_eq!(releases(&counts), 1, "A's lease went back to the backend");
    a.shutdown().await;
}

/// A revocation sent while the caching holder is cut off (paused, partitioned)
/// does not reach it: the waiter gets the key when the holder's lease runs out at
/// the backend (its TTL, 1 s), not at the linger (600 s); once the partition
/// heals, the late revocation changes nothing and the holder's next lock takes a
/// greater token than the waiter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_lost_in_a_partition_costs_at_most_the_lease_ttl() {
    let prefix = unique_prefix("cached-revoke-partition");
    let (proxy, a) = cut_off_able(&prefix).await;
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    warm(&a, None, "k").await;
    let g = a.lock("k").await.unwrap();
    let ta = g.fencing_token();
    g.release().await.unwrap();

    proxy.blackhole(true);
    let gb = within(
        Duration::from_secs(10),
        "B takes the key (A's lease ends at its TTL)",
        b.lock("k"),
    )
    .await
    .unwrap();
    let tb = gb.fencing_token();
    assert!(tb > ta);
    gb.release().await.unwrap();
    proxy.blackhole(false);
    locks_anew_after_the_partition(&a, tb).await;
}

/// Another instance's `try_lock` that finds a key cached (and idle) at A revokes
/// it: the try answers "held", and A lets go at once, not when its linger (600 s)
/// ends, so a try a moment later takes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_of_another_instance_revokes_an_idle_cached_lease() {
    let prefix = unique_prefix("cached-try-revoked");
    let (a, counts) = instance_with(
        &prefix,
        budget(Duration::from_secs(600)),
        Some(Duration::from_secs(600)),
    )
    .await;
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    warm(&a, Some(&counts), "k").await;
    let g = a.lock("k").await.unwrap();
    let ta = g.fencing_token();
    g.release().await.unwrap();
    assert!(
        b.try_lock("k").await.unwrap().is_none(),
        "the key is cached by A, so B's try finds it held"
    );
    assert!(
        wait_until(Duration::from_secs(5), || async { releases(&counts) == 1 }).await,
        "B's try did not revoke A's idle cached lease"
    );
    let got = take_once_free(&b, "k", "B takes the key after the revocation").await;
    assert_eq!(releases(&counts), 1, "A released the lease more than once");
    assert!(got.fencing_token() > ta);
    got.release().await.unwrap();
    assert_eq!(a.stats().keys_in_use, 0, "A keeps nothing for the key");
}

/// Only warm keys are cached: a key this locker takes once (as a short-lived
/// program does) goes back to the backend at its release with the default
/// settings, so another instance takes it at once; a key asked for again within
/// the linger of that release is cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_locked_once_is_released_at_once_and_a_warm_one_is_cached() {
    let prefix = unique_prefix("cached-cold");
    let (a, counts) = instance_with(
        &prefix,
        budget(Duration::from_secs(10)),
        Some(Duration::from_secs(10)),
    )
    .await;
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    // The defaults: a key locked once is free right after its release.
    let (d, d_counts) = instance(&prefix, Handoff::enabled()).await;
    d.lock("once").await.unwrap().release().await.unwrap();
    assert_eq!(releases(&d_counts), 1, "a cold key's lease was cached");
    b.try_lock("once")
        .await
        .unwrap()
        .expect("a cold key is free after its release")
        .release()
        .await
        .unwrap();
    // Locked again within the linger: cached.
    a.lock("k").await.unwrap().release().await.unwrap();
    assert_eq!(releases(&counts), 1, "a cold key's lease was cached");
    a.lock("k").await.unwrap().release().await.unwrap();
    assert_eq!(releases(&counts), 1, "a warm key's lease was not cached");
    assert_eq!(a.stats().keys_in_use, 1);
    a.shutdown().await;
    assert_eq!(releases(&counts), 2);
}

/// Not a test: the child process of
/// [`a_process_that_returns_from_main_leaves_nothing_cached`]. It locks its key
/// three times (the last lease is cached; a 10 s linger, so that a busy machine
/// cannot make the key cold between two locks) and returns from the test
/// function, which drops its `Locker` on a multi-thread runtime, as
/// `#[tokio::main]` does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of a_process_that_returns_from_main_leaves_nothing_cached"]
async fn looping_child() {
    let Some((backend, key)) = testkit::holder_child_target(CHILD_ENV).await else {
        return;
    };
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_secs(30))
        .handoff(budget(Duration::from_secs(10)))
        .cache_leases_for(Duration::from_secs(10))
        .build()
        .expect("child: build");
    for _ in 0..3 {
        locker
            .lock(key.as_str())
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(
        locker.stats().keys_in_use,
        1,
        "child: the last lease is not cached"
    );
    testkit::tell_parent("LFCHILD CACHED");
}

const CHILD_ENV: &str = "LOCKFLIGHT_CACHING_CHILD";

/// A process that loops over a key and then returns from `main` (a multi-thread
/// runtime) without calling `Locker::shutdown` leaves nothing locked: dropping
/// its last `Locker` releases the cached lease. Without that, the key would stay
/// held for the lease TTL (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_returns_from_main_leaves_nothing_cached() {
    let prefix = unique_prefix("cached-exit");
    let child = testkit::spawn_holder_child(
        &testkit::test_path(module_path!(), "looping_child"),
        CHILD_ENV,
        shared().url(),
        &prefix,
        "k",
    );
    assert!(
        exits_leaving_the_key_free(child, "LFCHILD CACHED", &prefix, Kind::Mutex, "k").await,
        "the exited process left its cached lease held"
    );
}

/// A kind of lease a child process takes; as a key, it tells the child which.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Mutex,
    Read,
    Write,
    Permit,
}

impl Kind {
    fn key(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::Read => "read",
            Kind::Write => "write",
            Kind::Permit => "permit",
        }
    }

    fn of_key(key: &str) -> Kind {
        [Kind::Mutex, Kind::Read, Kind::Write, Kind::Permit]
            .into_iter()
            .find(|k| k.key() == key)
            .unwrap_or_else(|| panic!("no kind of lease is called {key:?}"))
    }

    /// Takes a lease of this kind on `key` at once and drops it; `false` if a
    /// lease that excludes it is held (for a read lease: a write excludes it).
    async fn take_at_once(self, locker: &Locker, key: &str) -> bool {
        match self {
            Kind::Mutex => locker.try_lock(key).await.unwrap().is_some(),
            Kind::Read | Kind::Write => locker.rwlock(key).try_write().await.unwrap().is_some(),
            Kind::Permit => locker
                .semaphore(key, 1)
                .try_acquire()
                .await
                .unwrap()
                .is_some(),
        }
    }
}

/// Waits for the child's `said` line and its successful exit, then takes its
/// `kind` of lease on `key` under `prefix` at once: whether the child left it
/// free.
async fn exits_leaving_the_key_free(
    (mut child, mut lines): (
        tokio::process::Child,
        tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    ),
    said: &str,
    prefix: &str,
    kind: Kind,
    key: &str,
) -> bool {
    testkit::child_line(&mut lines, said).await;
    let status = within(Duration::from_secs(20), "the child's exit", child.wait())
        .await
        .unwrap();
    assert!(status.success(), "the child failed: {status}");
    // Not counted: `Counting` wraps only the exclusive lock's calls.
    let backend = RedisBackend::builder(shared().url())
        .prefix(prefix)
        .connect()
        .await
        .expect("connect");
    let b = Locker::builder(backend)
        .handoff(Handoff::disabled())
        .build()
        .expect("valid settings");
    let free = kind.take_at_once(&b, key).await;
    b.shutdown().await;
    free
}

/// Not a test: the child process of the
/// `a_process_that_returns_from_main_right_after_dropping_*` tests. It takes the
/// lease its key names ([`Kind`]) once (through the parent's slow proxy), drops
/// it (the release runs in a background task) and returns from `main` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of the a_process_that_returns_from_main_right_after_dropping_* tests"]
async fn dropping_child() {
    let Some((backend, key)) = testkit::holder_child_target(DROP_CHILD_ENV).await else {
        return;
    };
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_secs(30))
        .build()
        .expect("child: build");
    let key = key.as_str();
    let held: Box<dyn Send> = match Kind::of_key(key) {
        Kind::Mutex => Box::new(locker.lock(key).await.unwrap()),
        Kind::Read => Box::new(locker.rwlock(key).read().await.unwrap()),
        Kind::Write => Box::new(locker.rwlock(key).write().await.unwrap()),
        Kind::Permit => Box::new(locker.semaphore(key, 1).acquire().await.unwrap()),
    };
    testkit::tell_parent("LFCHILD HELD");
    drop(held);
    // The locker goes here, with the release still on its way (200 ms each way).
}

const DROP_CHILD_ENV: &str = "LOCKFLIGHT_CACHING_DROP_CHILD";

/// Ten processes (side by side, each under its own prefix) that each take a
/// `kind` of lease, drop it and return from `main` (a multi-thread runtime) at
/// once, the release still in flight (a proxy delays each way 200 ms): each
/// leaves its key free, because dropping the last `Locker` waits (at most 1 s)
/// for the background releases of every kind, as `shutdown` does. Without that
/// wait the runtime's shutdown drops the release task, and the key stays held
/// for the lease TTL (30 s).
async fn processes_that_return_right_after_a_drop_leave_nothing_locked(kind: Kind) {
    const RUNS: usize = 10;
    let proxy = CountingProxy::start(shared()).await;
    proxy.set_delay(Duration::from_millis(200));
    let runs = (0..RUNS).map(|i| {
        let prefix = unique_prefix(&format!("dropped-exit-{}-{i}", kind.key()));
        let url = proxy.url();
        async move {
            let child = testkit::spawn_holder_child(
                &testkit::test_path(module_path!(), "dropping_child"),
                DROP_CHILD_ENV,
                url,
                &prefix,
                kind.key(),
            );
            exits_leaving_the_key_free(child, "LFCHILD HELD", &prefix, kind, kind.key()).await
        }
    });
    let free = futures::future::join_all(runs).await;
    let held = free.iter().filter(|free| !**free).count();
    assert_eq!(
        held, 0,
        "{held} of {RUNS} exited processes left their {kind:?} lease held"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_returns_from_main_right_after_a_drop_leaves_nothing_locked() {
    processes_that_return_right_after_a_drop_leave_nothing_locked(Kind::Mutex).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_returns_from_main_right_after_dropping_a_read_guard_leaves_nothing_locked()
{
    processes_that_return_right_after_a_drop_leave_nothing_locked(Kind::Read).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_returns_from_main_right_after_dropping_a_write_guard_leaves_nothing_locked()
{
    processes_that_return_right_after_a_drop_leave_nothing_locked(Kind::Write).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_returns_from_main_right_after_dropping_a_permit_leaves_nothing_locked() {
    processes_that_return_right_after_a_drop_leave_nothing_locked(Kind::Permit).await;
}

const PAUSE_CHILD_ENV: &str = "LOCKFLIGHT_CACHING_PAUSE_CHILD";

/// A fencing token printed by a child as "EPOCH SEQ".
fn parse_token(s: &str) -> lockflight::FencingToken {
    let mut parts = s
        .split_whitespace()
        .map(|p| p.parse::<u64>().expect("a number"));
    let (epoch, seq) = (parts.next().expect("epoch"), parts.next().expect("seq"));
    lockflight::FencingToken { epoch, seq }
}

/// Not a test: the child process of
/// [`a_cached_lease_revoked_while_its_process_is_paused_is_not_used_after_it`].
/// It caches a lease of its key (1 s TTL, a 600 s linger), says so, waits for the
/// parent's go (a Redis key, polled), then locks the key once more and prints
/// that section's token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of a_cached_lease_revoked_while_its_process_is_paused_is_not_used_after_it"]
async fn pausable_child() {
    let Some((backend, key)) = testkit::holder_child_target(PAUSE_CHILD_ENV).await else {
        return;
    };
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_secs(1))
        .wait_timeout(Duration::from_secs(20))
        .handoff(budget(Duration::from_secs(600)))
        .cache_leases_for(Duration::from_secs(600))
        .build()
        .expect("child: build");
    warm(&locker, None, &key).await;
    let g = locker.lock(key.as_str()).await.unwrap();
    let cached = g.fencing_token();
    g.release().await.unwrap();
    assert_eq!(
        locker.stats().keys_in_use,
        1,
        "child: the lease is not cached"
    );
    // Connected before the parent may pause this process.
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let client = redis::Client::open(var("LOCKFLIGHT_CHILD_URL")).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let go = format!("{}:go", var("LOCKFLIGHT_CHILD_PREFIX"));
    testkit::tell_parent(&format!("LFCHILD CACHED {} {}", cached.epoch, cached.seq));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        // A GET in flight across the pause may time out: ask again.
        let v: Option<String> = redis::cmd("GET")
            .arg(&go)
            .query_async(&mut con)
            .await
            .unwrap_or(None);
        if v.is_some() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "child: no go");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let g = locker.lock(key.as_str()).await.unwrap();
    let t = g.fencing_token();
    testkit::tell_parent(&format!("LFCHILD TOKEN {} {}", t.epoch, t.seq));
    g.release().await.unwrap();
    locker.shutdown().await;
}

/// A process paused (SIGSTOP) while it keeps a lease cached: another instance
/// queues (its revocation waits unread in the paused process's socket) and takes
/// the key when the lease's TTL (1 s) runs out at Redis. When the process resumes,
/// its timers, the stale revocation and its next `lock` race: the next section
/// (which waits for the other instance's hold) must get a token greater than the
/// other instance's. Its `lock` comes a round trip after the resume (it polls for
/// the go), so in practice the stale revocation has ended the caching by then;
/// the validity check that guards a `lock` winning that race is what
/// `a_cached_lease_cut_off_by_a_partition_is_not_used_after_it` fails without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_lease_revoked_while_its_process_is_paused_is_not_used_after_it() {
    let prefix = unique_prefix("cached-paused");
    let (mut child, mut lines) = testkit::spawn_holder_child(
        &testkit::test_path(module_path!(), "pausable_child"),
        PAUSE_CHILD_ENV,
        shared().url(),
        &prefix,
        "k",
    );
    let ta = parse_token(&testkit::child_line(&mut lines, "LFCHILD CACHED").await);
    let pid = child.id().expect("the child runs");
    assert!(
        testkit::nemesis::stop_process(pid),
        "the child did not stop"
    );
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    let gb = within(
        Duration::from_secs(10),
        "B takes the key (the paused child's lease ends at its TTL)",
        b.lock("k"),
    )
    .await
    .unwrap();
    let tb = gb.fencing_token();
    assert!(
        tb > ta,
        "B's token {tb} is not greater than the child's {ta}"
    );
    testkit::nemesis::continue_process(pid);
    let mut con = shared().connection().await;
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}:go"))
        .arg("1")
        .query_async(&mut con)
        .await
        .unwrap();
    // The child's next lock runs into B's hold.
    tokio::time::sleep(Duration::from_millis(300)).await;
    gb.release().await.unwrap();
    let tc = parse_token(&testkit::child_line(&mut lines, "LFCHILD TOKEN").await);
    assert!(
        tc > tb,
        "the resumed child's section has token {tc}, not greater than B's {tb}: it used its cached lease"
    );
    let status = within(Duration::from_secs(20), "the child's exit", child.wait())
        .await
        .unwrap();
    assert!(status.success(), "the child failed: {status}");
}

const WAITER_CHILD_ENV: &str = "LOCKFLIGHT_CACHING_WAITER_CHILD";

/// Not a test: the child process of
/// [`a_waiter_that_crashes_after_revoking_strands_nobody`]. It names its instance
/// and waits for its key until it is killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "child process of a_waiter_that_crashes_after_revoking_strands_nobody"]
async fn crashing_waiter_child() {
    let Some((backend, key)) = testkit::holder_child_target(WAITER_CHILD_ENV).await else {
        return;
    };
    let backend = backend;
    testkit::tell_parent(&format!("LFCHILD ID {}", backend.instance_id()));
    let locker = Locker::builder(backend)
        .wait_timeout(Duration::from_secs(60))
        .build()
        .expect("child: build");
    let _never = locker.lock(key.as_str()).await;
    panic!("child: got the key it should have been killed waiting for");
}

/// A waiter that queued (and sent its revocation) and then crashed, ahead of
/// another instance's waiter: the holder's release (after its linger, the
/// revocation having come during its hold) offers the key to the dead waiter,
/// whose claim window (500 ms) and queue entry (3 s) run out, and the live waiter
/// gets the key long before the lease TTL (30 s) would have freed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_crashes_after_revoking_strands_nobody() {
    let prefix = unique_prefix("cached-dead-waiter");
    let (a, counts) = instance(&prefix, Handoff::enabled()).await;
    warm(&a, Some(&counts), "k").await;
    let held = a.lock("k").await.unwrap();
    let (mut child, mut lines) = testkit::spawn_holder_child(
        &testkit::test_path(module_path!(), "crashing_waiter_child"),
        WAITER_CHILD_ENV,
        shared().url(),
        &prefix,
        "k",
    );
    let child_id = testkit::child_line(&mut lines, "LFCHILD ID").await;
    let con = shared().connection().await;
    let queue = format!("{prefix}:{{k}}:wq");
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (mut con, queue, id) = (con.clone(), queue.clone(), child_id.clone());
            async move {
                let at: Option<f64> = redis::cmd("ZSCORE")
                    .arg(queue)
                    .arg(id)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                at.is_some()
            }
        })
        .await,
        "the child never queued"
    );
    child.kill().await.unwrap();
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    let waiter = tokio::spawn(async move {
        let asked = tokio::time::Instant::now();
        let g = b.lock("k").await.unwrap();
        let waited = asked.elapsed();
        g.release().await.unwrap();
        waited
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    held.release().await.unwrap();
    let waited = within(Duration::from_secs(20), "B's lock", waiter)
        .await
        .unwrap();
    println!("B waited {waited:?} behind a crashed waiter");
    assert!(
        waited < Duration::from_secs(10),
        "B waited {waited:?}: the crashed waiter stranded the key"
    );
    a.shutdown().await;
}

/// `shutdown` waits for the releases already under way in the background (here
/// a dropped guard's, slowed by a 300 ms proxy delay), so that a program that
/// exits right after it leaves nothing locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_background_releases() {
    let prefix = unique_prefix("cached-shutdown-background");
    let proxy = CountingProxy::start(shared()).await;
    let a = Locker::builder(
        RedisBackend::builder(proxy.url())
            .prefix(&prefix)
            .connect()
            .await
            .unwrap(),
    )
    .build()
    .unwrap();
    let (b, _) = instance(&prefix, Handoff::disabled()).await;
    let guard = a.lock("k").await.unwrap();
    proxy.set_delay(Duration::from_millis(300));
    drop(guard); // released in a background task
    within(Duration::from_secs(10), "shutdown", a.shutdown()).await;
    b.try_lock("k")
        .await
        .unwrap()
        .expect("shutdown returned before the background release ended")
        .release()
        .await
        .unwrap();
    assert_eq!(a.stats().keys_in_use, 0);
}

/// Re-caching a lease moves its linger on and starts no task: one linger task
/// serves every caching of the lease (a task per release would keep a thousand
/// sleeping tasks here), and the lease is released when the linger of the last
/// caching ends, not the first's. In-process backend, on a paused clock.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn one_linger_task_serves_every_caching_of_a_lease() {
    let server = lockflight::MemoryBackend::new();
    let other = Locker::builder(server.clone()).build().unwrap();
    let linger = Duration::from_millis(20);
    let a = Locker::builder(server)
        .cache_leases_for(linger)
        // One lease for the whole run.
        .handoff(budget(Duration::from_secs(60)).max_consecutive(10_000))
        .build()
        .unwrap();
    // Warm the key (the first lease of a cold key is released at once).
    a.lock("k").await.unwrap().release().await.unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();
    let mut alive = Vec::new();
    for round in 0..1_000 {
        a.lock("k").await.unwrap().release().await.unwrap();
        tokio::time::advance(Duration::from_micros(100)).await;
        if round == 9 || round == 999 {
            alive.push(metrics.num_alive_tasks());
        }
    }
    assert_eq!(
        alive[0], alive[1],
        "tasks alive after 10 and after 1,000 cachings"
    );
    // 100 ms after the first caching, 0.1 ms after the last: still cached.
    assert!(other.try_lock("k").await.unwrap().is_none());
    tokio::time::sleep(linger).await;
    tokio::task::yield_now().await;
    let g = other.try_lock("k").await.unwrap();
    assert!(g.is_some(), "released when the last caching's linger ended");
    g.unwrap().release().await.unwrap();
}
