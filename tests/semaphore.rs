//! Distributed semaphores against a real Redis: at most N holders across instances,
//! a killed holder's permit comes back at its TTL, no permit leaks through a
//! cancellation storm, N is fixed per key, local waiters coalesce into one request,
//! a release wakes one waiting instance by message, and a lost permit is signalled.

mod support;

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lockflight::semaphore::Permit;
use lockflight::{Error, LockKey, Locker, RedisBackend, error::Phase};
use redis::aio::MultiplexedConnection;
use support::{
    CountingProxy, child_line, key_count, shared, spawn_test_child, unique_prefix, wait_until,
};
use tokio::task::JoinSet;

/// A backend on `url` under `prefix` whose notification subscription is up.
async fn backend_at(url: &str, prefix: &str) -> RedisBackend {
    subscribed(
        RedisBackend::builder(url)
            .prefix(prefix)
            .connect()
            .await
            .expect("connect the backend"),
    )
    .await
}

async fn subscribed(backend: RedisBackend) -> RedisBackend {
    assert!(
        wait_until(Duration::from_secs(10), || {
            let up = backend.is_subscribed();
            async move { up }
        })
        .await,
        "the notification subscription of {backend:?} never came up"
    );
    backend
}

fn locker(backend: RedisBackend, ttl: Duration) -> Locker {
    Locker::builder(backend)
        .lease_ttl(ttl)
        .wait_timeout(Duration::from_secs(60))
        .build()
        .expect("build the locker")
}

/// Number of entries of a sorted set.
async fn zcard(con: &mut MultiplexedConnection, name: &[u8]) -> i64 {
    redis::cmd("ZCARD")
        .arg(name)
        .query_async::<i64>(con)
        .await
        .expect("ZCARD")
}

/// `name` + `suffix`.
fn with(name: &[u8], suffix: &str) -> Vec<u8> {
    [name, suffix.as_bytes()].concat()
}

/// Bounds a test step, so that a bug shows up as a clear failure, never a hang.
async fn within<F: std::future::Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: did not finish within {limit:?}"),
    }
}

async fn join_all<T: 'static>(mut set: JoinSet<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(v) => out.push(v),
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("a test task was cancelled: {e}"),
        }
    }
    out
}

async fn wait_idle(lockers: &[Locker]) {
    let idle = wait_until(Duration::from_secs(10), || {
        let busy: usize = lockers.iter().map(Locker::active_semaphores).sum();
        async move { busy == 0 }
    })
    .await;
    assert!(idle, "semaphore state left behind in a locker");
}

/// Counts holders inside a critical section and records the maximum.
struct Inside {
    now: AtomicUsize,
    max: AtomicUsize,
}

struct Entered<'a>(&'a Inside);

impl Inside {
    fn enter(&self, n: usize) -> Entered<'_> {
        let inside = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(inside, Ordering::SeqCst);
        assert!(
            inside <= n,
            "{inside} holders of a semaphore of {n} permits"
        );
        Entered(self)
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// 3 instances × 50 tasks, 4 critical sections each, on a semaphore of 3 permits:
/// never more than 3 holders at once; afterwards no permit, count or waiting entry
/// is left in Redis and no local state in any locker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_n_holders_across_instances() {
    const N: u32 = 3;
    const TASKS: usize = 50;
    const ROUNDS: usize = 4;
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("sem-exclusion");
    let mut lockers = Vec::new();
    for _ in 0..3 {
        lockers.push(locker(
            backend_at(&server.url(), &prefix).await,
            Duration::from_secs(30),
        ));
    }
    let inside = Arc::new(Inside {
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
    });
    let mut set = JoinSet::new();
    for l in &lockers {
        for _ in 0..TASKS {
            let (sem, inside) = (l.semaphore("pool", N), Arc::clone(&inside));
            set.spawn(async move {
                for _ in 0..ROUNDS {
                    let permit = sem.acquire().await.expect("acquire");
                    let entered = inside.enter(N as usize);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    drop(entered);
                    permit.release().await.expect("release");
                }
            });
        }
    }
    within(
        Duration::from_secs(60),
        "all critical sections",
        join_all(set),
    )
    .await;
    let max = inside.max.load(Ordering::SeqCst);
    let sections = 3 * TASKS * ROUNDS;
    let requests: u64 = lockers.iter().map(|l| l.stats().acquire_attempts).sum();
    println!(
        "max holders at once: {max} of {N}; {requests} permit requests for {sections} \
         critical sections (plus one release each)"
    );
    assert!(
        max >= 2,
        "the permits were never used concurrently (max {max})"
    );
    wait_idle(&lockers).await;
    assert_eq!(
        key_count(server, &format!("{prefix}:*")).await,
        0,
        "keys left"
    );
}

const CHILD_ENV: &str = "LOCKFLIGHT_SEM_CHILD";
const CHILD_LEASE_TTL: Duration = Duration::from_secs(2);

/// Not a test: the child process of [`killed_holder_permit_returns_within_its_ttl`].
/// It takes the only permit, prints `HELD`, and waits to be killed.
#[tokio::test]
#[ignore = "child process of killed_holder_permit_returns_within_its_ttl"]
async fn child_permit_holder() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let backend = RedisBackend::builder(var("LOCKFLIGHT_CHILD_URL"))
        .prefix(var("LOCKFLIGHT_CHILD_PREFIX"))
        .connect()
        .await
        .expect("child: connect");
    let locker = locker(backend, CHILD_LEASE_TTL);
    let permit = locker
        .semaphore(var("LOCKFLIGHT_CHILD_KEY"), 1)
        .acquire()
        .await
        .expect("child: acquire");
    let mut out = std::io::stdout().lock();
    writeln!(out, "\nHELD {}", permit.key()).unwrap();
    out.flush().unwrap();
    drop(out);
    std::future::pending::<()>().await;
}

/// A holder process killed with SIGKILL (no release, no more renewals): its permit
/// comes back when its TTL runs out, not before, and not much later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_permit_returns_within_its_ttl() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("sem-killed");
    let key = "k";
    let (mut child, mut lines) = spawn_test_child(
        "child_permit_holder",
        &[
            (CHILD_ENV, "1".to_owned()),
            ("LOCKFLIGHT_CHILD_URL", server.url()),
            ("LOCKFLIGHT_CHILD_PREFIX", prefix.clone()),
            ("LOCKFLIGHT_CHILD_KEY", key.to_owned()),
        ],
    );
    child_line(&mut lines, "HELD ").await;

    let backend = backend_at(&server.url(), &prefix).await;
    let permits = backend.permits_name(&LockKey::from(key));
    let locker = locker(backend, Duration::from_secs(30));
    let sem = locker.semaphore(key, 1);
    assert!(
        sem.try_acquire().await.unwrap().is_none(),
        "the child holds the permit"
    );
    let mut con = server.connection().await;

    child.kill().await.expect("SIGKILL the child");
    let killed = Instant::now();
    // The child's permit expiry, against the server's clock.
    let (_, expiry): (String, i64) = redis::cmd("ZRANGE")
        .arg(&permits)
        .arg(0)
        .arg(0)
        .arg("WITHSCORES")
        .query_async::<Vec<(String, i64)>>(&mut con)
        .await
        .expect("ZRANGE")
        .pop()
        .expect("the child's permit is in the set");
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut con)
        .await
        .expect("TIME");
    let left = Duration::from_millis((expiry - (secs * 1000 + micros / 1000)).max(0) as u64);
    assert!(!left.is_zero(), "the permit must still live after the kill");
    let permit = sem
        .acquire()
        .await
        .expect("the permit comes back at its TTL");
    let blocked = killed.elapsed();
    println!("killed holder's permit came back after {blocked:?} (it had {left:?} left)");
    assert!(
        blocked < CHILD_LEASE_TTL + Duration::from_millis(1500),
        "a killed holder kept its permit for {blocked:?}"
    );
    assert!(
        blocked + Duration::from_millis(50) >= left,
        "the permit was taken {blocked:?} after the kill, before its TTL ({left:?} left) ran out"
    );
    permit.release().await.unwrap();
    assert_eq!(zcard(&mut con, &permits).await, 0);
}

/// Many acquire (and try_acquire) futures dropped at random points, on two
/// instances, some holding a permit: afterwards all N permits can be taken, and
/// after their release the permit set is empty and no key is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancellation_storm_leaks_no_permit() {
    const N: u32 = 4;
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("sem-storm");
    let mut lockers = Vec::new();
    for _ in 0..2 {
        lockers.push(locker(
            backend_at(&server.url(), &prefix).await,
            Duration::from_secs(30),
        ));
    }
    let permits = RedisBackend::builder(server.url())
        .prefix(&prefix)
        .connect()
        .await
        .unwrap()
        .permits_name(&LockKey::from("pool"));
    let granted = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    let mut handles = Vec::new();
    for l in &lockers {
        for _ in 0..40 {
            let (sem, granted) = (l.semaphore("pool", N), Arc::clone(&granted));
            handles.push(set.spawn(async move {
                for _ in 0..10 {
                    let cut = Duration::from_micros(rand::random::<u64>() % 8_000);
                    let got = if rand::random::<u8>().is_multiple_of(4) {
                        tokio::time::timeout(cut, sem.try_acquire()).await
                    } else {
                        tokio::time::timeout(cut, async { sem.acquire().await.map(Some) }).await
                    };
                    if let Ok(Ok(Some(permit))) = got {
                        granted.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_micros(rand::random::<u64>() % 2_000))
                            .await;
                        if rand::random::<bool>() {
                            // A release whose future is dropped half-way.
                            let _ = tokio::time::timeout(
                                Duration::from_micros(rand::random::<u64>() % 500),
                                permit.release(),
                            )
                            .await;
                        }
                    }
                }
            }));
        }
    }
    // Abort some tasks wherever they are.
    tokio::time::sleep(Duration::from_millis(20)).await;
    for h in handles.iter().step_by(3) {
        h.abort();
    }
    while let Some(joined) = set.join_next().await {
        if let Err(e) = joined
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    wait_idle(&lockers).await;
    let granted = granted.load(Ordering::Relaxed);
    println!("cancellation storm: {granted} permits granted, the rest cut short");
    assert!(granted > 0, "the storm never got a permit");
    let mut con = server.connection().await;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let mut con = con.clone();
            let permits = permits.clone();
            async move { zcard(&mut con, &permits).await == 0 }
        })
        .await,
        "permits left in Redis after the storm: {}",
        zcard(&mut con, &permits).await
    );
    let sem = lockers[0].semaphore("pool", N);
    let mut all: Vec<Permit> = Vec::new();
    for i in 0..N {
        all.push(
            sem.try_acquire()
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("permit {i} of {N} is not free after the storm")),
        );
    }
    assert!(sem.try_acquire().await.unwrap().is_none());
    for p in all {
        p.release().await.unwrap();
    }
    assert_eq!(zcard(&mut con, &permits).await, 0);
    let pattern = format!("{prefix}:*");
    assert!(
        wait_until(Duration::from_secs(5), || {
            let pattern = pattern.clone();
            async move { key_count(server, &pattern).await == 0 }
        })
        .await,
        "keys left after the storm"
    );
}

/// N is fixed at first use: another instance asking with another N gets
/// PermitMismatch at once; once every permit is gone, the key may be used anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_permit_count_is_a_mismatch() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("sem-mismatch");
    let ab = backend_at(&server.url(), &prefix).await;
    let count = with(&ab.permits_name(&LockKey::from("k")), "n");
    let a = locker(ab, Duration::from_secs(30));
    let b = locker(
        backend_at(&server.url(), &prefix).await,
        Duration::from_secs(30),
    );
    let held = a.semaphore("k", 2).acquire().await.unwrap();
    let con = server.connection().await;
    let pttl = |mut con: MultiplexedConnection, name: Vec<u8>| async move {
        redis::cmd("PTTL")
            .arg(name)
            .query_async::<i64>(&mut con)
            .await
            .unwrap()
    };
    let left = pttl(con.clone(), count.clone()).await;
    assert!(
        (1..=30_000).contains(&left),
        "N is stored with the permits' lifetime: PTTL {left}"
    );
    let started = Instant::now();
    for result in [
        b.semaphore("k", 3).acquire().await.map(Some),
        b.semaphore("k", 3).try_acquire().await,
    ] {
        match result {
            Err(Error::PermitMismatch {
                key,
                permits: 2,
                requested: 3,
            }) => assert_eq!(key, LockKey::from("k")),
            other => panic!("expected a mismatch, got {other:?}"),
        }
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "answered at once, not at the wait timeout"
    );
    wait_idle(std::slice::from_ref(&b)).await;
    held.release().await.unwrap();
    assert_eq!(
        pttl(con.clone(), count.clone()).await,
        -2,
        "N goes with the last permit"
    );
    let p = b.semaphore("k", 3).acquire().await.unwrap();
    p.release().await.unwrap();
    // Bad input is refused with the key named.
    let e = b.semaphore("k", 0).acquire().await.unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }) && e.to_string().contains("\"k\""));
}

/// k local waiters that arrive while a request is in flight cost one more request,
/// not k: counted at the proxy, 8 (and 32) waiters cost 2 requests (the first
/// waiter's, and one for all the others), and each release one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_waiters_share_one_request() {
    let server = shared();
    let _log = server.log_on_panic();
    let proxy = CountingProxy::start(server).await;
    let prefix = unique_prefix("sem-coalesce");
    let l = locker(
        backend_at(&proxy.url(), &prefix).await,
        Duration::from_secs(30),
    );
    for k in [8usize, 32] {
        let sem = l.semaphore(format!("pool-{k}"), k as u32);
        // Loads the scripts (NOSCRIPT, SCRIPT LOAD) once.
        sem.acquire().await.unwrap().release().await.unwrap();
        let attempts = l.stats().acquire_attempts;
        proxy.reset();
        proxy.set_delay(Duration::from_millis(300));
        let mut set = JoinSet::new();
        let first = sem.clone();
        set.spawn(async move { first.acquire().await.unwrap() });
        // The first waiter's request is now in flight (delayed by the proxy).
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 1..k {
            let sem = sem.clone();
            set.spawn(async move { sem.acquire().await.unwrap() });
        }
        let held = within(Duration::from_secs(10), "k permits", join_all(set)).await;
        let requests = proxy.commands();
        proxy.set_delay(Duration::ZERO);
        println!("{k} local waiters: {requests} Redis commands");
        assert_eq!(l.stats().acquire_attempts - attempts, 2);
        assert_eq!(
            requests, 2,
            "one request in flight, one for all who came meanwhile"
        );
        proxy.reset();
        for p in held {
            p.release().await.unwrap();
        }
        assert_eq!(proxy.commands(), k as u64, "one command per release");
    }
}

/// A waiting instance is woken by the release's message, well before its retry
/// timer (20 s here) and the holder's TTL (30 s); one release wakes one waiting
/// instance (the oldest), not every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wakes_one_waiting_instance() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("sem-wake");
    let slow_timer = |url: String| {
        let prefix = prefix.clone();
        async move {
            subscribed(
                RedisBackend::builder(url)
                    .prefix(prefix)
                    .queue_entry_ttl(Duration::from_secs(60))
                    .connect()
                    .await
                    .unwrap(),
            )
            .await
        }
    };
    let holder = locker(slow_timer(server.url()).await, Duration::from_secs(30));
    let bb = slow_timer(server.url()).await;
    let waiting_set = with(&bb.permits_name(&LockKey::from("k")), "q");
    let b = locker(bb, Duration::from_secs(30));
    let c = locker(slow_timer(server.url()).await, Duration::from_secs(30));
    let held = holder.semaphore("k", 1).acquire().await.unwrap();
    let mut con = server.connection().await;

    let b_wait = tokio::spawn({
        let sem = b.semaphore("k", 1);
        async move { sem.acquire().await }
    });
    assert!(
        wait_until(Duration::from_secs(5), || {
            let mut con = con.clone();
            let q = waiting_set.clone();
            async move { zcard(&mut con, &q).await == 1 }
        })
        .await
    );
    let c_wait = tokio::spawn({
        let sem = c.semaphore("k", 1);
        async move { sem.acquire().await }
    });
    assert!(
        wait_until(Duration::from_secs(5), || {
            let mut con = con.clone();
            let q = waiting_set.clone();
            async move { zcard(&mut con, &q).await == 2 }
        })
        .await
    );
    let (b0, c0) = (b.stats().acquire_attempts, c.stats().acquire_attempts);
    assert_eq!((b0, c0), (1, 1), "each waiting instance asked once");

    let released = Instant::now();
    held.release().await.unwrap();
    let permit = within(Duration::from_secs(5), "b's permit", b_wait)
        .await
        .unwrap()
        .expect("b acquires");
    let woken_after = released.elapsed();
    println!("the oldest waiting instance got the permit {woken_after:?} after the release");
    assert!(woken_after < Duration::from_secs(5));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(b.stats().acquire_attempts, b0 + 1);
    assert_eq!(
        c.stats().acquire_attempts,
        c0,
        "the release woke one instance, not every one"
    );
    // b's release wakes c, the next one.
    permit.release().await.unwrap();
    let p = within(Duration::from_secs(5), "c's permit", c_wait)
        .await
        .unwrap()
        .expect("c acquires");
    p.release().await.unwrap();
    assert_eq!(zcard(&mut con, &waiting_set).await, 0);
}

/// A permit whose entry is removed in Redis is signalled lost within a renewal
/// interval or so, and its release reports the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_permit_is_signalled() {
    let server = shared();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("sem-loss");
    let backend = backend_at(&server.url(), &prefix).await;
    let permits = backend.permits_name(&LockKey::from("k"));
    let l = locker(backend, Duration::from_millis(900));
    let permit = l.semaphore("k", 2).acquire().await.unwrap();
    let signal = permit.loss_signal();
    assert!(!permit.is_lost());
    let mut con = server.connection().await;
    let removed: i64 = redis::cmd("DEL")
        .arg(&permits)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(removed, 1);
    let changed = Instant::now();
    within(Duration::from_secs(3), "lost()", permit.lost()).await;
    println!("loss noticed {:?} after the removal", changed.elapsed());
    assert!(permit.is_lost() && signal.is_lost());
    assert!(signal.reason().is_some());
    assert!(l.stats().leases_lost >= 1);
    match permit.release().await {
        Err(Error::LeaseLost { phase, .. }) => assert_eq!(phase, Phase::Releasing),
        other => panic!("release of a lost permit: {other:?}"),
    }
}

/// Every future of the semaphore API is `Send` (usable from `tokio::spawn`).
#[test]
fn futures_are_send() {
    fn send<T: Send>(_: &T) {}
    fn check(sem: lockflight::semaphore::Semaphore, permit: Permit) {
        send(&sem.acquire());
        send(&sem.acquire_within(Duration::from_secs(1)));
        send(&sem.try_acquire());
        send(&permit.lost());
        send(&permit.release());
    }
    let _ = check;
}

/// The minimal ACL rules documented on `RedisBackend` suffice for semaphores:
/// every script command (acquire, wait, renew, release with its wake-up, leave)
/// runs under them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_rules_suffice() {
    const RULES: &[&str] = &[
        "~lfacl:*",
        "&lfacl:inst:*",
        "+evalsha",
        "+script|load",
        "+publish",
        "+subscribe",
        "+time",
        "+get",
        "+set",
        "+del",
        "+exists",
        "+pexpire",
        "+pttl",
        "+zcard",
        "+zscore",
        "+zrange",
        "+zrangebyscore",
        "+zadd",
        "+zrem",
    ];
    let server = support::RedisServer::start();
    let _log = server.log_on_panic();
    let mut admin = server.connection().await;
    redis::cmd("ACL")
        .arg(&["SETUSER", "app", "reset", "on", ">pw"])
        .arg(RULES)
        .query_async::<()>(&mut admin)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://app:pw@127.0.0.1:{}/", server.port());
    let a = locker(backend_at(&url, "lfacl").await, Duration::from_millis(300));
    let b = locker(backend_at(&url, "lfacl").await, Duration::from_millis(300));
    let held = a.semaphore("k", 1).acquire().await.expect("acquire");
    // b waits, gives up (leave), then waits again and is woken by the release.
    let gave_up = b
        .semaphore("k", 1)
        .acquire_within(Duration::from_millis(200))
        .await;
    assert!(matches!(gave_up, Err(Error::Timeout { .. })), "{gave_up:?}");
    wait_idle(std::slice::from_ref(&b)).await;
    let waiting = tokio::spawn({
        let sem = b.semaphore("k", 1);
        async move { sem.acquire().await }
    });
    // Renewals run (every 100 ms) while b waits.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(!held.is_lost(), "renewed under the ACL");
    held.release().await.expect("release");
    let p = within(Duration::from_secs(5), "b's permit", waiting)
        .await
        .unwrap()
        .expect("b acquires");
    assert!(b.semaphore("k", 1).try_acquire().await.unwrap().is_none());
    p.release().await.unwrap();
}

/// On a Redis Cluster (3 primaries) the semaphore scripts are single-slot: 2
/// instances × 10 tasks on a semaphore of 2 permits never exceed 2 holders, and
/// leave nothing behind.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_cluster() {
    const N: u32 = 2;
    let cluster = support::cluster::Cluster::start();
    let prefix = unique_prefix("sem-cluster");
    let mut lockers = Vec::new();
    for _ in 0..2 {
        let b = RedisBackend::cluster(cluster.urls())
            .prefix(&prefix)
            .connect()
            .await
            .expect("connect to the cluster");
        lockers.push(locker(subscribed(b).await, Duration::from_secs(30)));
    }
    let inside = Arc::new(Inside {
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
    });
    let mut set = JoinSet::new();
    for l in &lockers {
        for _ in 0..10 {
            let (sem, inside) = (l.semaphore("pool", N), Arc::clone(&inside));
            set.spawn(async move {
                for _ in 0..5 {
                    let permit = sem.acquire().await.expect("acquire");
                    let entered = inside.enter(N as usize);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    drop(entered);
                    permit.release().await.expect("release");
                }
            });
        }
    }
    within(
        Duration::from_secs(60),
        "the cluster workload",
        join_all(set),
    )
    .await;
    assert_eq!(inside.max.load(Ordering::SeqCst), N as usize);
    wait_idle(&lockers).await;
}
