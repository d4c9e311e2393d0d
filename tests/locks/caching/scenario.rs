//! The one scenario most caching cases share, written once: instance A caches
//! its lease of `k`, something happens ([`Then`]), instance B takes the key
//! ([`Take`]) with a greater fencing token, and A is left as the case says
//! ([`Case`]'s last fields).

use std::time::Duration;

use futures::FutureExt;
use lockflight::{Contention, Error, Handoff, Locker};
use testkit::{CountingProxy, Counts, shared, unique_prefix, wait_until, within};

use super::{
    acquires, budget, cut_off_able, instance, instance_with, locks_anew_after_the_partition,
    releases, take_once_free, take_once_free_within, warm,
};

/// How instance A, the one that caches, is built.
pub(super) enum A {
    /// On the shared server, its requests counted, caching for `linger` under
    /// `handoff` (`None`: [`budget`] for the linger).
    Counted {
        linger: Duration,
        handoff: Option<fn() -> Handoff>,
    },
    /// Behind a proxy that can cut it off ([`cut_off_able`]): 1 s leases, a 600 s
    /// linger; not counted.
    CutOffAble,
    /// Fair mode, which refuses a cache and never caches; not counted.
    Fair,
}

/// What happens once A's lease of `k` is cached.
pub(super) enum Then {
    /// Nothing: B asks at once.
    Nothing,
    /// A locks `k` again, from the cache (no request, the same lease, a greater
    /// token), releases it, and the linger ends with a release at the backend.
    ALocksAgainThenTheLingerEnds,
    /// B's `try_lock` finds the key held, and A releases it (revoked).
    BTriesAndARevokes,
    /// A is cut off, and its lease's validity runs out on its own clock.
    CutOffUntilLost,
    /// A is cut off (B's revocation never reaches it).
    CutOff,
    /// `A::shutdown` polled once and dropped (its releases sent).
    ShutdownDroppedAfterOnePoll,
}

/// How B takes the key.
pub(super) enum Take {
    /// `lock`, within the bound.
    Lock(Duration),
    /// `try_lock`, at once.
    TryAtOnce,
    /// `try_lock` again until it gets the key (a release is counted when it is
    /// sent, so a try may still reach the backend first), within 10 s.
    TryUntilFree,
    /// `try_lock` again until it gets the key, within 5 s.
    TryWithin5s,
}

/// What A's next lock of `k` does, once B is done.
pub(super) enum Next {
    /// Not asked.
    NotAsked,
    /// It goes to the backend at its release (A does not cache the key for a
    /// while after another instance wanted it, nor after `shutdown`).
    ReleasedAtOnce,
    /// Once the partition heals, it acquires anew with a token greater than B's.
    AcquiresAnewAfterThePartition,
}

pub(super) struct Case {
    pub(super) a: A,
    /// B's handoff.
    pub(super) b: fn() -> Handoff,
    pub(super) then: Then,
    pub(super) take: Take,
    /// A's backend releases once B has the key (A counted); `None`: at least one.
    pub(super) released: Option<u64>,
    /// Whether A keeps nothing for the key once B has it.
    pub(super) idle_after: bool,
    pub(super) next: Next,
}

/// Runs `case` under a prefix of its own named `name`.
pub(super) async fn run(name: &str, case: Case) {
    let prefix = unique_prefix(name);
    let (a, counts, proxy) = build_a(&prefix, &case.a).await;
    let (b, _) = instance(&prefix, (case.b)()).await;
    let counts = counts.as_deref();
    warm(&a, counts, "k").await;
    let g = a.lock("k").await.unwrap();
    let mut ta = g.fencing_token();
    g.release().await.unwrap();
    // Cached (checked where the linger is long enough that no busy machine
    // sees it end first).
    if let (Some(c), A::Counted { linger, .. }) = (counts, &case.a)
        && *linger >= Duration::from_secs(60)
    {
        assert_eq!(releases(c), 0, "cached");
    }

    match case.then {
        Then::Nothing => {}
        Then::ALocksAgainThenTheLingerEnds => {
            let c = counts.expect("a counted A");
            let second = a.lock("k").await.unwrap();
            let t2 = second.fencing_token();
            assert_eq!(acquires(c), 1, "the second lock asked the backend");
            assert_eq!(
                releases(c),
                0,
                "the cached lease was released at the backend"
            );
            assert_eq!(t2.epoch, ta.epoch, "the same lease");
            assert!(t2 > ta, "fencing tokens must increase: {ta:?} then {t2:?}");
            ta = t2;
            second.release().await.unwrap();
            // Nobody asks for the key: the linger's end releases it.
            assert!(
                wait_until(Duration::from_secs(5), || async { releases(c) == 1 }).await,
                "the linger ended without a backend release"
            );
        }
        Then::BTriesAndARevokes => {
            let c = counts.expect("a counted A");
            assert!(
                b.try_lock("k").await.unwrap().is_none(),
                "the key is cached by A, so B's try finds it held"
            );
            assert!(
                wait_until(Duration::from_secs(5), || async { releases(c) == 1 }).await,
                "B's try did not revoke A's idle cached lease"
            );
        }
        Then::CutOffUntilLost => {
            proxy.as_ref().expect("a cut-off-able A").blackhole(true);
            assert!(
                wait_until(Duration::from_secs(5), || async {
                    a.stats().leases_lost >= 1
                })
                .await,
                "the cached lease's validity did not run out while A was cut off"
            );
        }
        Then::CutOff => proxy.as_ref().expect("a cut-off-able A").blackhole(true),
        Then::ShutdownDroppedAfterOnePoll => assert!(
            a.shutdown().now_or_never().is_none(),
            "shutdown answered at once"
        ),
    }

    let got = take(&b, &case.take).await;
    let tb = got.fencing_token();
    if let Some(c) = counts {
        match case.released {
            Some(n) => assert_eq!(
                releases(c),
                n,
                "A's releases at the backend when B got the key"
            ),
            None => assert!(releases(c) >= 1),
        }
    }
    assert!(tb > ta, "B's token {tb:?} is not greater than A's {ta:?}");
    got.release().await.unwrap();
    if case.idle_after {
        assert_eq!(a.stats().keys_in_use, 0, "A keeps nothing for the key");
    }

    match case.next {
        Next::NotAsked => {}
        Next::ReleasedAtOnce => {
            let c = counts.expect("a counted A");
            // The dropped attempt may have been sent, and the background one again.
            let before = releases(c);
            a.lock("k").await.unwrap().release().await.unwrap();
            assert_eq!(
                releases(c),
                before + 1,
                "A cached a key it should not cache now"
            );
            a.shutdown().await;
        }
        Next::AcquiresAnewAfterThePartition => {
            proxy.as_ref().expect("a cut-off-able A").blackhole(false);
            locks_anew_after_the_partition(&a, tb).await;
        }
    }
}

async fn build_a(
    prefix: &str,
    a: &A,
) -> (
    Locker,
    Option<std::sync::Arc<Counts>>,
    Option<CountingProxy>,
) {
    match *a {
        A::Counted { linger, handoff } => {
            let handoff = handoff.map_or_else(|| budget(linger), |h| h());
            let (locker, counts) = instance_with(prefix, handoff, Some(linger)).await;
            (locker, Some(counts), None)
        }
        A::CutOffAble => {
            let (proxy, locker) = cut_off_able(prefix).await;
            (locker, None, Some(proxy))
        }
        A::Fair => {
            let fair = || async {
                Locker::builder(testkit::backend_at(&shared().url(), prefix).await)
                    .contention(Contention::Fair)
            };
            let e = fair()
                .await
                .cache_leases_for(Duration::from_secs(600))
                .build()
                .unwrap_err();
            assert!(matches!(e, Error::InvalidConfig { .. }), "{e:?}");
            (fair().await.build().unwrap(), None, None)
        }
    }
}

async fn take(b: &Locker, how: &Take) -> lockflight::LockGuard {
    match *how {
        Take::Lock(limit) => within(limit, "B's lock of the cached key", b.lock("k"))
            .await
            .unwrap(),
        Take::TryAtOnce => b
            .try_lock("k")
            .await
            .unwrap()
            .expect("a fair release left the key held"),
        Take::TryUntilFree => take_once_free(b, "k", "B takes the key").await,
        Take::TryWithin5s => {
            take_once_free_within(
                Duration::from_secs(5),
                b,
                "k",
                "the release begun by the dropped shutdown never finished",
            )
            .await
        }
    }
}
