//! Batched renewal: the watchdog renews the leases due in a scan with a few script
//! calls (`LockBackend::renew_batch`), not one per lease, and each lease still gets
//! the answer its own renewal would get.

use futures::StreamExt;
use lockflight::backend::{LeaseKind, RenewItem, WhenBusy};
use testkit::Held;

use super::*;

/// Leases per script call (the Redis backend's chunk).
const CHUNK: u64 = 500;

/// The kind of the `i`-th of `n` leases: mostly mutexes, and `n / 20` each of read
/// leases, write leases and permits.
fn kind_of(i: usize, n: usize) -> LeaseKind {
    let few = n / 20;
    if i < few {
        LeaseKind::Read
    } else if i < 2 * few {
        LeaseKind::Write
    } else if i < 3 * few {
        LeaseKind::Permit
    } else {
        LeaseKind::Mutex
    }
}

/// Takes `n` leases of mixed kinds on keys `b<i>` through `locker`, 64 at a time;
/// the `i`-th of the result is the lease of `b<i>` (callers pick leases by index).
async fn take(locker: &Locker, n: usize) -> Vec<(LeaseKind, LockKey, Held)> {
    futures::stream::iter(0..n)
        .map(|i| async move {
            let key = LockKey::from(format!("b{i}"));
            let kind = kind_of(i, n);
            let held = match kind {
                LeaseKind::Read => Held::Read(locker.rwlock(&key).read().await.unwrap()),
                LeaseKind::Write => Held::Write(locker.rwlock(&key).write().await.unwrap()),
                LeaseKind::Permit => {
                    Held::Permit(locker.semaphore(&key, 1).acquire().await.unwrap())
                }
                _ => Held::Lock(locker.lock(&key).await.unwrap()),
            };
            (kind, key, held)
        })
        .buffered(64)
        .collect()
        .await
}

/// Releases every lease, 64 at a time; each release must find its lease.
async fn release_all(held: Vec<(LeaseKind, LockKey, Held)>) {
    futures::stream::iter(held)
        .for_each_concurrent(64, |(kind, key, held)| async move {
            held.release()
                .await
                .unwrap_or_else(|e| panic!("releasing the {kind:?} lease of {key}: {e}"));
        })
        .await;
}

/// `INFO commandstats`: the calls and the server time (µs) of `EVALSHA`.
async fn evalsha_stats(con: &mut MultiplexedConnection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .unwrap_or("calls=0,usec=0");
    let field = |name: &str| {
        line.split(',')
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("calls="), field("usec="))
}

/// The server's CPU seconds so far (`used_cpu_sys + used_cpu_user`).
async fn server_cpu(con: &mut MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("used_cpu_sys:")
                .or_else(|| l.strip_prefix("used_cpu_user:"))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

async fn reset_stats(con: &mut MultiplexedConnection) {
    redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async::<()>(con)
        .await
        .unwrap();
}

/// 10,000 held leases (mutexes, read and write leases, permits) on one server,
/// renewed every 200 ms for 1 s: the renewal takes at most `ceil(due / 500)`
/// script calls per scan (the per-lease watchdog made 10,000 per period), every
/// lease is renewed in the window and none is lost; another instance finds them
/// held; each release finds its lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_renew_with_a_few_script_calls_per_period() {
    const N: usize = 10_000;
    // A private server: commandstats counts every client's commands.
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("batch");
    let every = Duration::from_millis(200);
    // A TTL many periods long: a debug build on a loaded machine can take more
    // than a second to renew 10,000 leases, and the test is about the calls.
    let locker = Locker::builder(backend_at(&server.url(), &prefix).await)
        .lease_ttl(Duration::from_secs(5))
        .renew_every(every)
        .build()
        .unwrap();
    let held = within(
        Duration::from_secs(60),
        "taking 10,000 leases",
        take(&locker, N),
    )
    .await;
    let mut admin = server.connection().await;
    reset_stats(&mut admin).await;
    let before = locker.stats();
    let window = 5 * every;
    tokio::time::sleep(window).await;
    let (calls, usec) = evalsha_stats(&mut admin).await;
    let stats = locker.stats() - before;

    // The scans in the window: one every `every / 4`, each taking its due leases in
    // at most ceil(due / CHUNK) calls; over a period the due leases are all N.
    let periods = (window.as_millis() / every.as_millis()) as u64 + 1;
    let scans_per_period = 4;
    let bound = periods * (N as u64).div_ceil(CHUNK) + periods * scans_per_period + 10;
    println!(
        "{N} leases, {periods} periods: {calls} EVALSHA ({usec} µs of server time), {} renewals",
        stats.renewals
    );
    assert!(
        calls <= bound,
        "{calls} script calls for {N} leases over {window:?}, more than {bound}"
    );
    // Each lease renewed within the window (how many times each is a question of
    // throughput: a debug build on two cores busy with other work renewed 10,603
    // in 1 s, about one period's worth; none was lost, which is the guarantee).
    assert!(
        stats.renewals >= N as u64,
        "each lease renewed in the window: {stats:?}"
    );
    assert_eq!(stats.leases_lost, 0, "{stats:?}");
    for (kind, key, held) in &held {
        assert!(!held.is_lost(), "the {kind:?} lease of {key} was lost");
    }
    // Another instance finds a sample of them held.
    let other = plain_locker(&server.url(), &prefix).await;
    for (kind, key, _) in held.iter().step_by(97) {
        let free = match kind {
            LeaseKind::Read => other.rwlock(key).try_write().await.unwrap().is_some(),
            LeaseKind::Write => other.rwlock(key).try_read().await.unwrap().is_some(),
            LeaseKind::Permit => other
                .semaphore(key, 1)
                .try_acquire()
                .await
                .unwrap()
                .is_some(),
            _ => other.try_lock(key).await.unwrap().is_some(),
        };
        assert!(!free, "another instance took the {kind:?} lease of {key}");
    }
    // A hang guard, not a speed bound: beside three test runs and a CPU hog the
    // 10,000 releases (64 at a time, while the watchdog renews the rest) took
    // more than 60 s.
    within(Duration::from_secs(600), "releasing", release_all(held)).await;
    wait_idle(&[locker, other], IDLE).await;
}

/// Leases deleted at the server behind their holder's back (mutexes, a read lease,
/// a write lease, a permit) are lost at the next batch; the other leases of the
/// same batches are renewed and stay held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_loses_exactly_the_leases_deleted_behind_the_holders_back() {
    const N: usize = 200;
    let (server, _log, prefix) = shared_scene("batch-loss");
    let every = Duration::from_millis(150);
    let backend = backend_at(&server.url(), &prefix).await;
    let locker = Locker::builder(backend.clone())
        .lease_ttl(Duration::from_millis(1_500))
        .renew_every(every)
        .build()
        .unwrap();
    let held = take(&locker, N).await;
    let mut con = server.connection().await;
    // Every 7th lease goes: its lease's key at the server.
    let doomed = |i: usize| i.is_multiple_of(7);
    for (i, (kind, key, _)) in held.iter().enumerate() {
        if !doomed(i) {
            continue;
        }
        let lock = testkit::names::lock(&prefix, key);
        let name = match kind {
            LeaseKind::Read => [&lock[..], b":rd"].concat(),
            LeaseKind::Write => [&lock[..], b":wr"].concat(),
            LeaseKind::Permit => testkit::names::permits(&prefix, key),
            _ => lock,
        };
        del(&mut con, &name).await;
    }
    let expected = held.iter().enumerate().filter(|(i, _)| doomed(*i)).count();
    let kinds: std::collections::BTreeSet<String> = held
        .iter()
        .enumerate()
        .filter(|(i, _)| doomed(*i))
        .map(|(_, (kind, _, _))| format!("{kind:?}"))
        .collect();
    assert_eq!(kinds.len(), 4, "every kind has a deleted lease: {kinds:?}");
    assert!(
        wait_until(Duration::from_secs(5), || async {
            locker.stats().leases_lost >= expected as u64
        })
        .await,
        "{:?}",
        locker.stats()
    );
    // The others keep being renewed: each of them once more, at least (about two
    // periods; waited for, not timed, so a slow machine only takes longer).
    let renewed = locker.stats().renewals;
    eventually("every surviving lease renewed again", || async {
        locker.stats().renewals >= renewed + (N - expected) as u64
    })
    .await;
    assert_eq!(locker.stats().leases_lost, expected as u64);
    let mut survivors = Vec::new();
    for (i, (kind, key, held)) in held.into_iter().enumerate() {
        assert_eq!(
            held.is_lost(),
            doomed(i),
            "the {kind:?} lease of {key} (deleted: {})",
            doomed(i)
        );
        if doomed(i) {
            assert!(held.release().await.is_err(), "a deleted lease released");
        } else {
            survivors.push((kind, key, held));
        }
    }
    release_all(survivors).await;
    wait_idle(&[locker], IDLE).await;
}

/// A backend-level batch of every kind answers each lease as its own call does:
/// renewed, not the owner (a token that holds nothing), and a value of another
/// type is that lease's error alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_each_lease_as_its_own_call_would() {
    let (server, _log, prefix) = shared_scene("batch-answers");
    let backend = backend_at(&server.url(), &prefix).await;
    let ttl = Duration::from_secs(5);
    let (m, r, w, p, foreign) = (
        LockKey::from("m"),
        LockKey::from("r"),
        LockKey::from("w"),
        LockKey::from("p"),
        LockKey::from("foreign"),
    );
    let tokens: Vec<LeaseToken> = (0..4).map(|_| LeaseToken::random()).collect();
    assert!(matches!(
        backend
            .acquire(&m, tokens[0], ttl, WhenBusy::Return)
            .await
            .unwrap(),
        Acquire::Acquired { .. }
    ));
    let rw = backend.rw().unwrap();
    assert!(matches!(
        rw.acquire_read(&r, tokens[1], ttl, WhenBusy::Return)
            .await
            .unwrap(),
        Acquire::Acquired { .. }
    ));
    assert!(matches!(
        rw.acquire_write(&w, tokens[2], ttl, WhenBusy::Return)
            .await
            .unwrap(),
        Acquire::Acquired { .. }
    ));
    let sem = backend.semaphore().unwrap();
    assert_eq!(
        sem.acquire_permits(&p, 2, &tokens[3..4], ttl, WhenBusy::Return)
            .await
            .unwrap()
            .granted,
        1
    );
    let mut con = server.connection().await;
    set_for_30s(
        &mut con,
        &[&testkit::names::lock(&prefix, &foreign)[..], b":rd"].concat(),
        "x",
    )
    .await;
    let stranger = LeaseToken::random();
    let items = [
        RenewItem::new(LeaseKind::Mutex, &m, tokens[0], ttl),
        RenewItem::new(LeaseKind::Read, &r, tokens[1], ttl),
        RenewItem::new(LeaseKind::Write, &w, tokens[2], ttl),
        RenewItem::new(LeaseKind::Permit, &p, tokens[3], ttl),
        RenewItem::new(LeaseKind::Mutex, &m, stranger, ttl),
        RenewItem::new(LeaseKind::Read, &foreign, stranger, ttl),
        RenewItem::new(LeaseKind::Write, &r, stranger, ttl),
        RenewItem::new(LeaseKind::Permit, &p, stranger, ttl),
    ];
    let batch = backend.renew_batch(&items).await;
    assert_eq!(batch.len(), items.len());
    for (item, answer) in items.iter().zip(&batch) {
        let alone = match item.kind {
            LeaseKind::Mutex => backend.renew(item.key, item.token, ttl).await,
            LeaseKind::Read => rw.renew_read(item.key, item.token, ttl).await,
            LeaseKind::Write => rw.renew_write(item.key, item.token, ttl).await,
            _ => sem.renew_permit(item.key, item.token, ttl).await,
        };
        match (answer, &alone) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "{item:?}"),
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{item:?}"),
            _ => panic!("{item:?}: in a batch {answer:?}, alone {alone:?}"),
        }
    }
    assert!(
        batch[..4]
            .iter()
            .all(|a| matches!(a, Ok(Renewal::Renewed { .. })))
    );
    assert!(matches!(batch[4], Ok(Renewal::NotOwner)));
    assert!(
        matches!(batch[5], Err(Error::ForeignValue { .. })),
        "{:?}",
        batch[5]
    );
    assert!(matches!(batch[6], Ok(Renewal::NotOwner)));
    assert!(matches!(batch[7], Ok(Renewal::NotOwner)));
    del(
        &mut con,
        &[&testkit::names::lock(&prefix, &foreign)[..], b":rd"].concat(),
    )
    .await;
    assert!(backend.release(&m, tokens[0]).await.unwrap().released);
    assert!(rw.release_read(&r, tokens[1]).await.unwrap().released);
    assert!(rw.release_write(&w, tokens[2]).await.unwrap().released);
    assert!(sem.release_permit(&p, tokens[3]).await.unwrap());
}

/// A Redis backend that renews lease by lease: every call forwarded, except
/// `renew_batch`, which keeps the trait's default (one call per lease, all at
/// once): the watchdog's cost before batching.
#[derive(Debug)]
struct PerLease(RedisBackend);

#[async_trait::async_trait]
impl LockBackend for PerLease {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> lockflight::Result<Acquire> {
        self.0.acquire(key, token, ttl, when_busy).await
    }
    async fn release(
        &self,
        key: &LockKey,
        token: LeaseToken,
    ) -> lockflight::Result<lockflight::backend::Released> {
        self.0.release(key, token).await
    }
    async fn renew(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> lockflight::Result<Renewal> {
        self.0.renew(key, token, ttl).await
    }
    async fn leave(&self, key: &LockKey) -> lockflight::Result<()> {
        self.0.leave(key).await
    }
    fn signals(&self) -> &lockflight::backend::Signals {
        self.0.signals()
    }
    fn rw(&self) -> Option<&dyn lockflight::backend::rw::RwBackend> {
        self.0.rw()
    }
    fn semaphore(&self) -> Option<&dyn lockflight::backend::semaphore::SemaphoreBackend> {
        self.0.semaphore()
    }
}

/// The measurement behind the batch size: 10,000 held leases (mixed kinds) on one
/// private server, renewed every 200 ms for 2 s, lease by lease (`PerLease`) and
/// batched; prints the `EVALSHA` calls, their server time and the server's CPU
/// per renewal period. Run with
/// `cargo test --release --all-features --test locks redis_lock::renewal_batch::measure_batched_renewal -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: prints the cost of renewal, per lease and batched"]
async fn measure_batched_renewal() {
    const N: usize = 10_000;
    let every = Duration::from_millis(200);
    let window = 10 * every;
    for batched in [false, true] {
        let server = RedisServer::start();
        let _log = server.log_on_panic();
        let prefix = unique_prefix("measure");
        let backend = backend_at(&server.url(), &prefix).await;
        let builder = if batched {
            Locker::builder(backend)
        } else {
            Locker::builder(PerLease(backend))
        };
        let locker = builder
            .lease_ttl(Duration::from_millis(1_200))
            .renew_every(every)
            .build()
            .unwrap();
        let held = take(&locker, N).await;
        let mut admin = server.connection().await;
        reset_stats(&mut admin).await;
        let cpu = server_cpu(&mut admin).await;
        let before = locker.stats();
        tokio::time::sleep(window).await;
        let (calls, usec) = evalsha_stats(&mut admin).await;
        let cpu = server_cpu(&mut admin).await - cpu;
        let stats = locker.stats() - before;
        let periods = (window.as_secs_f64() / every.as_secs_f64()) as u64;
        println!(
            "{}: {N} leases, per period: {} EVALSHA, {} µs EVALSHA server time, {:.1} ms server CPU; {} µs per call; {} renewals, {} lost",
            if batched { "batched" } else { "per lease" },
            calls / periods,
            usec / periods,
            cpu * 1000.0 / periods as f64,
            usec / calls.max(1),
            stats.renewals,
            stats.leases_lost,
        );
        release_all(held).await;
        wait_idle(&[locker], IDLE).await;
    }
}

/// `PEXPIRE name ms`.
async fn pexpire(con: &mut MultiplexedConnection, name: &[u8], ms: u64) {
    let set: i64 = redis::cmd("PEXPIRE")
        .arg(name)
        .arg(ms)
        .query_async(con)
        .await
        .expect("PEXPIRE");
    assert_eq!(set, 1, "no key to PEXPIRE");
}

/// A batch re-arms a lease's fence only when the item says it is due, and still
/// re-arms the lease itself, counts the instances waiting for it and reports a
/// lost lease and a value of another type, each as its own call would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_re_arms_a_fence_only_when_it_is_due() {
    let (server, _log, prefix) = shared_scene("batch-fence");
    let backend = backend_at(&server.url(), &prefix).await;
    let waiter = backend_at(&server.url(), &prefix).await;
    let ttl = Duration::from_secs(5);
    let (busy, quiet, lost, w, foreign) = (
        LockKey::from("busy"),
        LockKey::from("quiet"),
        LockKey::from("lost"),
        LockKey::from("w"),
        LockKey::from("foreign"),
    );
    let tokens: Vec<LeaseToken> = (0..4).map(|_| LeaseToken::random()).collect();
    for (key, token) in [(&busy, tokens[0]), (&quiet, tokens[1]), (&lost, tokens[2])] {
        let granted = backend.acquire(key, token, ttl, WhenBusy::Return).await;
        assert!(matches!(granted, Ok(Acquire::Acquired { .. })), "{key}");
    }
    let rw = backend.rw().unwrap();
    let granted = rw.acquire_write(&w, tokens[3], ttl, WhenBusy::Return).await;
    assert!(matches!(granted, Ok(Acquire::Acquired { .. })));
    // Another instance waits for `busy`.
    let queued = waiter
        .acquire(&busy, LeaseToken::random(), ttl, WhenBusy::Queue)
        .await
        .unwrap();
    assert!(!matches!(queued, Acquire::Acquired { .. }), "{queued:?}");
    let mut con = server.connection().await;
    let lock = |key: &LockKey| testkit::names::lock(&prefix, key);
    let fences = [
        testkit::suffixed(&lock(&busy), ":fence"),
        testkit::suffixed(&lock(&quiet), ":fence"),
        testkit::suffixed(&lock(&w), ":wf"),
    ];
    for fence in &fences {
        pexpire(&mut con, fence, 5_000).await;
    }
    del(&mut con, &lock(&lost)).await;
    let _: () = redis::cmd("HSET")
        .arg(lock(&foreign))
        .arg("f")
        .arg("v")
        .query_async(&mut con)
        .await
        .unwrap();

    let items = |due: bool| {
        [
            RenewItem::new(LeaseKind::Mutex, &busy, tokens[0], ttl),
            RenewItem::new(LeaseKind::Mutex, &quiet, tokens[1], ttl),
            RenewItem::new(LeaseKind::Mutex, &lost, tokens[2], ttl),
            RenewItem::new(LeaseKind::Write, &w, tokens[3], ttl),
            RenewItem::new(LeaseKind::Mutex, &foreign, tokens[0], ttl),
        ]
        .map(|item| item.with_fence_due(due))
    };
    for due in [false, true] {
        let batch = backend.renew_batch(&items(due)).await;
        assert!(
            matches!(batch[0], Ok(Renewal::Renewed { waiting: 1 })),
            "{batch:?}"
        );
        assert!(
            matches!(batch[1], Ok(Renewal::Renewed { waiting: 0 })),
            "{batch:?}"
        );
        assert!(matches!(batch[2], Ok(Renewal::NotOwner)), "{batch:?}");
        assert!(
            matches!(batch[3], Ok(Renewal::Renewed { waiting: 0 })),
            "{batch:?}"
        );
        assert!(
            matches!(batch[4], Err(Error::ForeignValue { .. })),
            "{batch:?}"
        );
        for key in [&busy, &quiet] {
            assert!(pttl(&mut con, &lock(key)).await > 4_000, "{key}");
        }
        for fence in &fences {
            let left = pttl(&mut con, fence).await;
            if due {
                assert!(left > 50_000, "a due fence left at {left} ms");
            } else {
                assert!(
                    (1..=5_000).contains(&left),
                    "a fence not due re-armed to {left} ms"
                );
            }
        }
    }
    del(&mut con, &lock(&foreign)).await;
    assert!(backend.release(&busy, tokens[0]).await.unwrap().released);
    assert!(backend.release(&quiet, tokens[1]).await.unwrap().released);
    assert!(rw.release_write(&w, tokens[3]).await.unwrap().released);
}

/// The watchdog re-arms a held lease's fence at its first renewal and then only
/// once half of the fence's time (10 × the TTL) has passed: in between, a fence
/// cut short behind its back stays as it was; after, it is re-armed again. The
/// lease stays held throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_re_arms_the_fence_when_half_of_its_time_has_passed() {
    let (server, _log, prefix) = shared_scene("watchdog-fence");
    let ttl = Duration::from_millis(300);
    let locker = Locker::builder(backend_at(&server.url(), &prefix).await)
        .lease_ttl(ttl)
        .build()
        .unwrap();
    let key = LockKey::from("k");
    let fence = testkit::suffixed(&testkit::names::lock(&prefix, &key), ":fence");
    let mut con = server.connection().await;
    let guard = locker.lock(&key).await.unwrap();
    let taken = Instant::now();
    // The first renewal (after ttl / 3) re-arms the fence; the next is due 1.5 s
    // after that one's send.
    tokio::time::sleep(Duration::from_millis(400)).await;
    pexpire(&mut con, &fence, 20_000).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left = pttl(&mut con, &fence).await;
    assert!(left > 0, "the fence expired under a live lease");
    // (On a machine too slow to get here before the fence is due, the check says
    // nothing.)
    if taken.elapsed() < Duration::from_millis(1_500) {
        assert!(
            left <= 20_000,
            "the fence was re-armed before it was due: {left} ms left after {:?}",
            taken.elapsed()
        );
    }
    eventually("the fence re-armed once due", || {
        let mut con = con.clone();
        let fence = fence.clone();
        async move { pttl(&mut con, &fence).await > 50_000 }
    })
    .await;
    assert!(!guard.is_lost());
    assert!(locker.stats().renewals >= 5, "{:?}", locker.stats());
    guard.release().await.expect("the lease is still ours");
    wait_idle(&[locker], IDLE).await;
}
