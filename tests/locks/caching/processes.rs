//! Lease caching across processes: a child process (this test binary, run
//! again for one test) that returns from `main` with a lease cached or a release
//! in flight, that is stopped while it keeps a lease cached, or that crashes
//! after it queued.

use std::time::Duration;

use lockflight::{Handoff, Locker, RedisBackend};
use testkit::{CountingProxy, eventually, shared, unique_prefix, wait_until, within};

use super::{budget, instance, warm};

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
    lockflight::FencingToken::new(epoch, seq)
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
    // B queues behind the dead waiter.
    eventually("B queued behind the dead waiter", || {
        let (mut con, queue, child_id) = (con.clone(), queue.clone(), child_id.clone());
        async move {
            let queued: Vec<String> = redis::cmd("ZRANGE")
                .arg(queue)
                .arg(0)
                .arg(-1)
                .query_async(&mut con)
                .await
                .unwrap();
            queued.iter().any(|id| *id != child_id)
        }
    })
    .await;
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
