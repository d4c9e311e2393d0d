//! Row 4: the **reply is lost after the server applied the command**, for
//! acquire, renew and release ([`FaultProxy`] forwards the request, and closes
//! the connection at the first byte of its reply).
//!
//! Instance A talks to Redis through the proxy, instance B directly. The proxy
//! learns the three scripts' hashes by watching one lock, renewal and release,
//! so the tests do not depend on the scripts' text or arguments.

use std::time::{Duration, Instant};

use lockflight::{Error, Handoff, LockKey, Locker};

use crate::{TTL, backend_at, serial, within};
use testkit::fault_proxy::{FaultProxy, evalsha_on};
use testkit::{RedisServer, unique_prefix, wait_until};

/// A TTL long enough that "free again at once" cannot be confused with "free
/// again because it expired".
const LONG_TTL: Duration = Duration::from_secs(10);
/// What "at once" means here (a reconnect and a retry or two).
const QUICKLY: Duration = Duration::from_secs(2);

pub(crate) struct Scripts {
    pub(crate) acquire: Vec<u8>,
    pub(crate) renew: Vec<u8>,
    pub(crate) release: Vec<u8>,
}

/// The key every test locks.
const KEY: &str = "k";

struct Setup {
    server: RedisServer,
    proxy: FaultProxy,
    prefix: String,
    scripts: Scripts,
    /// The Redis name of [`KEY`]'s lock.
    name: Vec<u8>,
}

impl Setup {
    async fn new(name: &str) -> Setup {
        let server = RedisServer::start();
        let proxy = FaultProxy::start(&server).await;
        let prefix = unique_prefix(name);
        let scripts = learn_scripts(&proxy, &prefix).await;
        let name = testkit::names::lock(&prefix, &LockKey::from(KEY));
        Setup {
            server,
            proxy,
            prefix,
            scripts,
            name,
        }
    }

    /// Instance A: through the proxy. Without handoff, so that every release the
    /// tests lose goes to Redis even while a local task waits.
    async fn a(&self, ttl: Duration, wait: Duration) -> Locker {
        Locker::builder(backend_at(&self.proxy.url(), &self.prefix).await)
            .lease_ttl(ttl)
            .wait_timeout(wait)
            .handoff(Handoff::disabled())
            .build()
            .unwrap()
    }

    /// Instance B: straight to Redis.
    async fn b(&self, ttl: Duration) -> Locker {
        Locker::builder(backend_at(&self.server.url(), &self.prefix).await)
            .lease_ttl(ttl)
            .wait_timeout(Duration::from_secs(15))
            .build()
            .unwrap()
    }

    /// The proxy loses the next `n` replies of `script` run on [`KEY`].
    fn lose_replies(&self, script: &[u8], n: u64) {
        self.proxy.drop_replies(evalsha_on(script, &self.name), n);
    }

    /// The PTTL of [`KEY`]'s lock.
    async fn pttl(&self) -> i64 {
        let mut con = self.server.connection().await;
        redis::cmd("PTTL")
            .arg(&self.name)
            .query_async(&mut con)
            .await
            .unwrap()
    }
}

/// B takes [`KEY`] (waiting up to 15 s; `what` names the step) and releases it;
/// returns how long after `since` B held it.
async fn b_lock_after(b: &Locker, since: Instant, what: &str) -> Duration {
    let g = within(Duration::from_secs(15), what, b.lock(KEY))
        .await
        .unwrap();
    let blocked = since.elapsed();
    g.release().await.unwrap();
    blocked
}

/// Watches one acquire, renewal and release through the proxy: the first script
/// run on the key is the acquire, the last the release, the one in between the
/// renewal.
pub(crate) async fn learn_scripts(proxy: &FaultProxy, prefix: &str) -> Scripts {
    let backend = backend_at(&proxy.url(), prefix).await;
    let name = testkit::names::lock(prefix, &LockKey::from("calibrate"));
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_millis(300))
        .build()
        .unwrap();
    proxy.record(true);
    let guard = locker.lock("calibrate").await.unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || {
            let renewed = locker.stats().renewals >= 1;
            async move { renewed }
        })
        .await,
        "no renewal to learn from"
    );
    guard.release().await.unwrap();
    let shas: Vec<Vec<u8>> = proxy
        .recorded()
        .into_iter()
        .filter(|c| c.len() > 3 && evalsha_on(&c[1], &name)(c))
        .map(|c| c[1].clone())
        .collect();
    proxy.record(false);
    let (acquire, release) = (shas[0].clone(), shas[shas.len() - 1].clone());
    let renew = shas
        .iter()
        .find(|s| **s != acquire && **s != release)
        .cloned()
        .unwrap_or_else(|| panic!("no renewal among the scripts seen: {shas:?}"));
    assert_ne!(acquire, release);
    Scripts {
        acquire,
        renew,
        release,
    }
}

/// The acquire ran (the lock is set with A's token) but A never heard: A retries
/// with the same token, which the script recognizes as its own. A holds the
/// lock — not nobody — and releases it; B gets it right after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_acquire_reply_is_reconciled_by_the_same_token() {
    let _serial = serial().await;
    let s = Setup::new("lost-acquire").await;
    let a = s.a(LONG_TTL, Duration::from_secs(5)).await;
    let b = s.b(LONG_TTL).await;

    s.lose_replies(&s.scripts.acquire, 1);
    let started = Instant::now();
    let guard = within(Duration::from_secs(10), "A's lock", a.lock(KEY))
        .await
        .expect("a lost acquire reply is reconciled");
    let took = started.elapsed();
    println!("lost acquire reply: A held the lock {took:?} after asking");
    assert_eq!(s.proxy.dropped(), 1, "the acquire's reply was lost once");
    assert!(took <= QUICKLY, "reconciling took {took:?}");
    assert!(!guard.is_lost());
    assert!(guard.valid_for() > LONG_TTL / 2);
    assert!(
        b.try_lock(KEY).await.unwrap().is_none(),
        "the lock must be held (by A)"
    );
    assert!(s.pttl().await > 0);
    guard
        .release()
        .await
        .expect("A's release finds its own token at the key");
    let taken = b_lock_after(&b, Instant::now(), "B's lock after A's release").await;
    assert!(taken <= QUICKLY);
    assert_eq!(a.stats().leases_lost, 0);
    assert!(a.stats().acquire_attempts >= 2);
}

/// Every acquire reply is lost until A gives up: the acquire that landed is
/// released in the background, so B takes the lock at once instead of after the
/// TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_acquire_replies_until_the_caller_gives_up_leave_no_lock() {
    let _serial = serial().await;
    let s = Setup::new("lost-acquire-give-up").await;
    let a = s.a(LONG_TTL, Duration::from_secs(1)).await;
    let b = s.b(LONG_TTL).await;

    s.lose_replies(&s.scripts.acquire, 1_000);
    let result = within(Duration::from_secs(10), "A's lock", a.lock(KEY)).await;
    s.proxy.clear_rules();
    let gave_up = Instant::now();
    let dropped = s.proxy.dropped();
    println!(
        "lost acquire replies: A gave up with {:?} after {dropped} lost replies",
        result.as_ref().map(|_| ()).map_err(crate::kind)
    );
    match result {
        Err(Error::Timeout { .. } | Error::Backend { .. }) => {}
        other => panic!("A's lock with every reply lost: {other:?}"),
    }
    assert!(dropped >= 1);
    let blocked = b_lock_after(&b, gave_up, "B's lock after A gave up").await;
    println!("lost acquire replies: B held the lock {blocked:?} after A gave up");
    assert!(
        blocked <= QUICKLY,
        "the lock A's landed acquire set was held by nobody for {blocked:?}"
    );
}

/// Two renewal replies are lost (the renewals did happen): the watchdog retries,
/// and the lease is neither lost nor taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_renewal_replies_are_retried_without_a_false_loss() {
    let _serial = serial().await;
    let s = Setup::new("lost-renewal").await;
    let a = s.a(TTL, Duration::from_secs(5)).await;
    let b = s.b(TTL).await;

    let guard = a.lock(KEY).await.unwrap();
    s.lose_replies(&s.scripts.renew, 2);
    let dropped = wait_until(Duration::from_secs(5), || {
        let n = s.proxy.dropped();
        async move { n >= 2 }
    })
    .await;
    assert!(dropped, "two renewal replies were not lost: {:?}", s.proxy);
    let renewals = a.stats().renewals;
    // Watch for more than a TTL: no loss, nobody else gets the lock.
    let until = Instant::now() + TTL + TTL / 2;
    while Instant::now() < until {
        assert!(
            !guard.is_lost(),
            "a lost renewal reply ended in a loss: {:?}",
            guard.loss_signal().reason()
        );
        assert!(b.try_lock(KEY).await.unwrap().is_none(), "B took A's lock");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        a.stats().renewals > renewals,
        "no renewal after the lost replies"
    );
    assert_eq!(a.stats().leases_lost, 0);
    guard.release().await.expect("A still owns its lock");
    let g = within(QUICKLY, "B's lock", b.lock(KEY)).await.unwrap();
    g.release().await.unwrap();
}

/// The release ran (the lock is gone) but A never heard, even after its retries:
/// A reports a backend error — not a loss — and the lock is free for B at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_release_replies_leave_the_lock_free() {
    let _serial = serial().await;
    let s = Setup::new("lost-release-free").await;
    let a = s.a(LONG_TTL, Duration::from_secs(5)).await;
    let b = s.b(LONG_TTL).await;

    // Every reply of the first release and its two retries is lost.
    let guard = a.lock(KEY).await.unwrap();
    s.lose_replies(&s.scripts.release, 3);
    let result = within(Duration::from_secs(15), "A's release", guard.release()).await;
    s.proxy.clear_rules();
    let released = Instant::now();
    println!(
        "lost release replies: A's release returned {:?} after {} lost replies",
        result.as_ref().map_err(crate::kind),
        s.proxy.dropped()
    );
    let blocked = b_lock_after(&b, released, "B's lock").await;
    println!("lost release replies: B held the lock {blocked:?} after A's release");
    assert!(
        blocked <= QUICKLY,
        "a released lock was held by nobody for {blocked:?}"
    );
    assert!(
        !matches!(result, Err(Error::LeaseLost { .. })),
        "a release whose replies were lost reported a lost lease: {result:?}"
    );
    assert_eq!(a.stats().leases_lost, 0);
}

/// The release ran but its reply was lost once: the retry must recognize that
/// the lock it finds gone was released by itself, and report success, not
/// `LeaseLost` (the holder did nothing wrong and never lost its lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_release_reply_is_not_reported_as_lost() {
    let _serial = serial().await;
    let s = Setup::new("lost-release").await;
    let a = s.a(LONG_TTL, Duration::from_secs(5)).await;
    let b = s.b(LONG_TTL).await;

    let guard = a.lock(KEY).await.unwrap();
    s.lose_replies(&s.scripts.release, 1);
    let result = within(Duration::from_secs(15), "A's release", guard.release()).await;
    assert_eq!(s.proxy.dropped(), 1);
    let blocked = b_lock_after(&b, Instant::now(), "B's lock").await;
    assert!(blocked <= QUICKLY);
    assert_eq!(a.stats().leases_lost, 0);
    assert!(
        result.is_ok(),
        "a release whose reply was lost (the lock was deleted by it) reported {result:?}"
    );
}

/// A release whose **request** never reaches Redis (the first attempt and both
/// retries) fails with a backend error, and the lock stays held at Redis. The
/// token is released once more in the background, so the next local waiter does
/// not wait out the TTL — and starts a new critical section, whose fencing token
/// must be greater than the previous holder's: a fenced resource that accepted
/// the previous holder's writes would otherwise reject the new, legitimate
/// holder (guarantee 2: tokens strictly increase across critical sections).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_release_requests_do_not_reuse_a_fencing_token() {
    let _serial = serial().await;
    let s = Setup::new("lost-release-request").await;
    let a = s.a(LONG_TTL, Duration::from_secs(10)).await;
    let fence = crate::oracle::Fence::default();

    let first = a.lock(KEY).await.unwrap();
    let t1 = first.fencing_token();
    assert!(fence.write(KEY, t1, "first"));
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move { a.lock(KEY).await })
    };
    assert!(
        wait_until(Duration::from_secs(5), || {
            let waiting = a.stats().local_waits >= 1;
            async move { waiting }
        })
        .await,
        "the second task never waited"
    );
    s.proxy
        .drop_requests(evalsha_on(&s.scripts.release, &s.name), 3);
    let result = within(
        Duration::from_secs(15),
        "the first release",
        first.release(),
    )
    .await;
    s.proxy.clear_rules();
    println!(
        "lost release requests: the release returned {:?} after {} lost requests; the lock's \
         PTTL is {} ms",
        result.as_ref().map_err(crate::kind),
        s.proxy.dropped_requests(),
        s.pttl().await
    );
    assert!(
        matches!(result, Err(Error::Backend { .. })),
        "a release that never reached Redis: {result:?}"
    );
    let second = within(Duration::from_secs(15), "the waiter", waiter)
        .await
        .unwrap()
        .expect("the waiter gets the lock");
    let t2 = second.fencing_token();
    let accepted = fence.write(KEY, t2, "second");
    println!("lost release requests: first holder {t1}, next holder {t2}");
    second.release().await.unwrap();
    assert!(
        t2 > t1 && accepted,
        "the next critical section got fencing token {t2} after {t1}: the fenced resource \
         rejects the legitimate holder"
    );
}
