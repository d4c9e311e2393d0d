//! Lease caching (`LockerBuilder::cache_leases_for`) against a real Redis: a released lease that no
//! local task wants is kept for the next local `lock` of the key, within the
//! handoff budget, and released at the backend when the linger ends, when the
//! budget is spent, or at `Locker::shutdown`. Each instance is its own
//! `RedisBackend` (its own connections and instance id) behind a request counter.
//!
//! Most cases are one scenario ([`scenario::run`]: A caches its lease of a key,
//! something happens, B takes the key with a greater token, and A is left as
//! the case says), written once and instantiated as a table below, a test per
//! case; the rest are tests of their own here, and in [`processes`] the ones
//! whose instance is a child process that exits, is stopped or crashes.

mod processes;
mod scenario;

use scenario::{A, Case, Next, Take, Then};

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lockflight::{Handoff, Locker, RedisBackend};
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
    take_once_free_within(Duration::from_secs(10), locker, key, what).await
}

/// [`take_once_free`] within `limit`.
async fn take_once_free_within(
    limit: Duration,
    locker: &Locker,
    key: &str,
    what: &str,
) -> lockflight::LockGuard {
    within(limit, what, async {
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

/// A test per case of [`scenario::run`], named after it (its keys' prefix too).
macro_rules! cases {
    ($($(#[doc = $doc:literal])* $name:ident: $case:expr;)+) => {$(
        $(#[doc = $doc])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            scenario::run(stringify!($name), $case).await
        }
    )+};
}

const SECOND: Duration = Duration::from_secs(1);

cases! {
    /// The next `lock` after a release takes the cached lease without a backend
    /// request, with the next fencing token of the same lease; when the linger
    /// ends, the lease is released at the backend and another instance can take
    /// the key.
    the_next_lock_takes_the_cached_lease_without_a_request: Case {
        a: A::Counted { linger: Duration::from_millis(300), handoff: None },
        b: Handoff::disabled,
        then: Then::ALocksAgainThenTheLingerEnds,
        take: Take::TryUntilFree,
        released: Some(1),
        idle_after: true,
        next: Next::NotAsked,
    };
    /// Another instance that waits for a cached key gets it once A lets it go (at
    /// once, on its revocation; at the latest when the linger ends), woken by A's
    /// release, with a greater fencing token.
    a_remote_waiter_gets_the_key_when_the_linger_ends: Case {
        a: A::Counted { linger: Duration::from_millis(200), handoff: Some(Handoff::enabled) },
        b: Handoff::enabled,
        then: Then::Nothing,
        take: Take::Lock(10 * SECOND),
        released: Some(1),
        idle_after: false,
        next: Next::NotAsked,
    };
    /// Revocation: another instance that queues for a key whose lease A keeps
    /// cached and idle makes A let go at once, not when A's linger (60 s here)
    /// ends. Another instance wanted the key: A does not cache it for a while
    /// (its turns with B would only make B wait for revocations).
    a_waiting_instance_revokes_an_idle_cached_lease: Case {
        a: A::Counted { linger: 60 * SECOND, handoff: None },
        b: Handoff::enabled,
        then: Then::Nothing,
        take: Take::Lock(10 * SECOND),
        released: Some(1),
        idle_after: true,
        next: Next::ReleasedAtOnce,
    };
    /// Another instance's `try_lock` that finds a key cached (and idle) at A
    /// revokes it: the try answers "held", and A lets go at once, not when its
    /// linger (600 s) ends, so a try a moment later takes the key.
    a_try_of_another_instance_revokes_an_idle_cached_lease: Case {
        a: A::Counted { linger: 600 * SECOND, handoff: None },
        b: Handoff::disabled,
        then: Then::BTriesAndARevokes,
        take: Take::TryUntilFree,
        released: Some(1),
        idle_after: true,
        next: Next::NotAsked,
    };
    /// `shutdown` dropped after its first poll (its releases sent, not answered):
    /// the releases finish in the background, so the key is free well before the
    /// linger (600 s) would have released it, and caching stays off.
    a_dropped_shutdown_still_releases_in_the_background: Case {
        a: A::Counted { linger: 600 * SECOND, handoff: None },
        b: Handoff::disabled,
        then: Then::ShutdownDroppedAfterOnePoll,
        take: Take::TryWithin5s,
        released: None,
        idle_after: false,
        next: Next::ReleasedAtOnce,
    };
    /// Fair mode never caches: a release frees the key at once for another
    /// instance, and a cache set with it is refused.
    fair_mode_never_caches: Case {
        a: A::Fair,
        b: Handoff::disabled,
        then: Then::Nothing,
        take: Take::TryAtOnce,
        released: None,
        idle_after: true,
        next: Next::NotAsked,
    };
    /// A partition while the lease is cached (the holder cannot renew: a paused
    /// or cut-off process): the cached lease runs out on the holder's own clock,
    /// another instance takes the key, and once the partition heals the holder's
    /// next lock acquires anew, with a token greater than the other instance's,
    /// instead of using the cached lease it no longer has.
    a_cached_lease_cut_off_by_a_partition_is_not_used_after_it: Case {
        a: A::CutOffAble,
        b: Handoff::disabled,
        then: Then::CutOffUntilLost,
        take: Take::Lock(10 * SECOND),
        released: None,
        idle_after: false,
        next: Next::AcquiresAnewAfterThePartition,
    };
    /// A revocation sent while the caching holder is cut off (paused,
    /// partitioned) does not reach it: the waiter gets the key when the holder's
    /// lease runs out at the backend (its TTL, 1 s), not at the linger (600 s);
    /// once the partition heals, the late revocation changes nothing and the
    /// holder's next lock takes a greater token than the waiter's.
    a_revocation_lost_in_a_partition_costs_at_most_the_lease_ttl: Case {
        a: A::CutOffAble,
        b: Handoff::disabled,
        then: Then::CutOff,
        take: Take::Lock(10 * SECOND),
        released: None,
        idle_after: false,
        next: Next::AcquiresAnewAfterThePartition,
    };
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
