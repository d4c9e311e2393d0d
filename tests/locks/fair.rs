//! Fair mode ([`Contention::Fair`]) against a real Redis: grants in order of
//! arrival across instances (several tasks per instance, interleaved), no barging
//! after a TTL expiry, local handoff only in order, `try_lock` busy while an earlier
//! instance waits, a cancelled waiter leaving the queue, and what fair mode costs in
//! server commands.
//!
//! Every `RedisBackend` is one service instance (its own instance id and channel).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockflight::backend::{Acquire, LeaseToken, LockKind, WhenBusy};
use lockflight::{
    Contention, Error, LockKey, LockOptions, Locker, RedisBackend, backend::LockBackend,
    backend::RedlockBackend,
};
use testkit::{
    CountingProxy, RedisServer, backend_at, eventually, shared, unique_prefix, wait_until,
};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

/// The time between two arrivals: well above the jitter of placing an arrival on
/// the server's clock (a one-way trip to a local server, on a loaded test machine).
const GAP: Duration = Duration::from_millis(25);

fn locker(backend: RedisBackend, fair: bool) -> Locker {
    Locker::builder(backend)
        .contention(if fair {
            Contention::Fair
        } else {
            Contention::Coalesced
        })
        .wait_timeout(Duration::from_secs(30))
        .build()
        .expect("valid settings")
}

/// `n` instances under `prefix` (on `url`), each with its locker.
async fn instances(url: &str, prefix: &str, n: usize, fair: bool) -> Vec<Locker> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(locker(backend_at(url, prefix).await, fair));
    }
    out
}

async fn redis_exists(name: &[u8]) -> bool {
    let mut con = shared().connection().await;
    redis::cmd("EXISTS")
        .arg(name)
        .query_async::<i64>(&mut con)
        .await
        .unwrap()
        == 1
}

async fn queue_len(prefix: &str, key: &LockKey) -> i64 {
    let name = testkit::names::queue(prefix, key);
    let mut con = shared().connection().await;
    redis::cmd("ZCARD")
        .arg(name)
        .query_async::<i64>(&mut con)
        .await
        .unwrap()
}

/// While a holder (on its own instance) holds `key`, starts `waiters.len()` tasks,
/// task `i` on instance `waiters[i]`, one by one `gap` apart (each after the
/// previous one has called `lock`), then releases; every task holds for a few ms.
/// Returns the order in which the tasks were granted the lock.
async fn grant_order(
    prefix: &str,
    holder: &Locker,
    lockers: &[Locker],
    key: &LockKey,
    waiters: &[usize],
    gap: Duration,
) -> Vec<usize> {
    let guard = holder.lock(key).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = JoinSet::new();
    let asked = |l: &Locker| l.stats().acquire_attempts + l.stats().local_waits;
    let queued_key = key;
    for (i, &inst) in waiters.iter().enumerate() {
        let before = asked(&lockers[inst]);
        let (started, arrived) = oneshot::channel();
        let (locker, key, order) = (lockers[inst].clone(), key.clone(), Arc::clone(&order));
        tasks.spawn(async move {
            let _ = started.send(());
            let guard = locker.lock(&key).await.expect("granted in time");
            order.lock().unwrap().push(i);
            tokio::time::sleep(Duration::from_millis(3)).await;
            guard.release().await.unwrap();
        });
        arrived.await.unwrap();
        // This arrival has landed (its instance queued at Redis, the task asked or
        // waits locally) before the next one starts: the order is the arrival order
        // however slow the machine.
        let queued = waiters[..=i]
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len() as i64;
        eventually("the arrival landed", || async {
            asked(&lockers[inst]) > before && queue_len(prefix, queued_key).await == queued
        })
        .await;
        // And the server's clock, which places fair arrivals, moves on between two.
        tokio::time::sleep(gap).await;
    }
    // Every instance's request has landed (queued) before the holder lets go.
    let instances = waiters
        .iter()
        .collect::<std::collections::HashSet<_>>()
        .len();
    assert!(
        wait_until(Duration::from_secs(10), || async {
            queue_len(prefix, key).await == instances as i64
        })
        .await,
        "the waiting instances never all queued"
    );
    guard.release().await.unwrap();
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    Arc::try_unwrap(order).unwrap().into_inner().unwrap()
}

/// 4 instances, 3 tasks each, interleaved in several patterns: in fair mode the
/// grant order is the arrival order, round after round. In the default mode the
/// first instance hands the lease to its own later tasks ahead of the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_follow_arrival_order_across_four_instances() {
    let server = shared();
    let _log = server.log_on_panic();
    let url = server.url();
    let prefix = unique_prefix("fair-order");
    let key = LockKey::from("k");
    let holder = locker(backend_at(&url, &prefix).await, true);
    let fair = instances(&url, &prefix, 4, true).await;
    let patterns: [&[usize]; 4] = [
        &[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3],
        &[3, 2, 1, 0, 0, 1, 2, 3, 3, 2, 1, 0],
        &[0, 0, 1, 1, 2, 2, 3, 3, 0, 1, 2, 3],
        &[1, 3, 0, 2, 1, 0, 3, 2, 2, 3, 1, 0],
    ];
    for round in 0..3 {
        for (p, pattern) in patterns.iter().enumerate() {
            let order = grant_order(&prefix, &holder, &fair, &key, pattern, GAP).await;
            let arrival: Vec<usize> = (0..pattern.len()).collect();
            assert_eq!(
                order, arrival,
                "fair mode, round {round}, pattern {p} ({pattern:?}): grants out of arrival order"
            );
        }
    }

    // The default mode, same scenario: instance 0's first task hands the lease to
    // its later tasks (4 and 8) ahead of the other instances' earlier ones.
    let prefix = unique_prefix("default-order");
    let holder = locker(backend_at(&url, &prefix).await, false);
    let default = instances(&url, &prefix, 4, false).await;
    let order = grant_order(&prefix, &holder, &default, &key, patterns[0], GAP).await;
    println!("default mode grant order: {order:?}");
    assert_ne!(
        order,
        (0..12).collect::<Vec<_>>(),
        "the default mode is expected to hand off locally out of arrival order"
    );
}

/// A holder whose lease expires without a release (its renewals stopped: a raw
/// lease nobody renews, as left by a frozen process) while an instance waits: the
/// waiting instance gets the lock, not a newcomer that arrives after the expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_barging_after_a_ttl_expiry() {
    let server = shared();
    let _log = server.log_on_panic();
    let url = server.url();
    let prefix = unique_prefix("fair-expiry");
    let key = LockKey::from("k");
    let frozen = backend_at(&url, &prefix).await;
    let waiting = backend_at(&url, &prefix).await;
    let probe = testkit::names::lock(&prefix, &key);
    let ttl = Duration::from_millis(400);
    let Acquire::Acquired { .. } = frozen
        .acquire(&key, LeaseToken::random(), ttl, WhenBusy::Return)
        .await
        .unwrap()
    else {
        panic!("free lock not acquired")
    };

    let order = Arc::new(Mutex::new(Vec::new()));
    let queued = {
        let (locker, key, order) = (
            locker(waiting.clone(), true),
            key.clone(),
            Arc::clone(&order),
        );
        tokio::spawn(async move {
            let guard = locker.lock(&key).await.expect("the queued instance");
            order.lock().unwrap().push("queued");
            guard.release().await.unwrap();
        })
    };
    assert!(
        wait_until(Duration::from_secs(5), || async {
            queue_len(&prefix, &key).await == 1
        })
        .await,
        "the waiting instance never queued"
    );
    assert!(
        wait_until(Duration::from_secs(5), || async {
            !redis_exists(&probe).await
        })
        .await,
        "the frozen holder's lease never expired"
    );
    let newcomer = locker(backend_at(&url, &prefix).await, true);
    let late = {
        let (key, order) = (key.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let guard = newcomer.lock(&key).await.expect("the newcomer, second");
            order.lock().unwrap().push("newcomer");
            guard.release().await.unwrap();
        })
    };
    queued.await.unwrap();
    late.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["queued", "newcomer"]);
}

/// With the lock free but an instance queued (its holder's lease expired, nobody
/// told the queue), a fair `try_lock` is busy — and wakes the queued instance,
/// which then takes the lock — while a default `try_lock` barges in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_lock_is_busy_while_an_earlier_instance_waits() {
    let server = shared();
    let _log = server.log_on_panic();
    let url = server.url();
    let prefix = unique_prefix("fair-try");
    let ttl = Duration::from_millis(200);
    let long = Duration::from_secs(10);
    let frozen = backend_at(&url, &prefix).await;
    let queued = backend_at(&url, &prefix).await;
    let fair = locker(backend_at(&url, &prefix).await, true);
    let default = locker(backend_at(&url, &prefix).await, false);

    for (name, fair_mode) in [("default", false), ("fair", true)] {
        let key = LockKey::from(name);
        let probe = testkit::names::lock(&prefix, &key);
        assert!(matches!(
            frozen
                .acquire(&key, LeaseToken::random(), ttl, WhenBusy::Return)
                .await
                .unwrap(),
            Acquire::Acquired { .. }
        ));
        let token = LeaseToken::random();
        assert!(matches!(
            queued
                .acquire_fair(&key, token, long, WhenBusy::Queue, Duration::ZERO)
                .await
                .unwrap(),
            Acquire::Busy { .. }
        ));
        assert!(
            wait_until(Duration::from_secs(5), || async {
                !redis_exists(&probe).await
            })
            .await,
            "the lease never expired"
        );
        if !fair_mode {
            let barged = default.try_lock(&key).await.unwrap();
            assert!(barged.is_some(), "the default mode takes a free lock");
            barged.unwrap().release().await.unwrap();
            queued.leave(&key).await.unwrap();
            continue;
        }
        let before = queued.signals().generation(LockKind::Mutex, key.as_bytes());
        assert!(
            fair.try_lock(&key).await.unwrap().is_none(),
            "fair try_lock barged"
        );
        assert!(matches!(
            fair.lock_with_options(&key, LockOptions::new().try_only())
                .await,
            Err(Error::Busy { .. })
        ));
        assert!(
            wait_until(Duration::from_secs(5), || {
                let woken = queued.signals().generation(LockKind::Mutex, key.as_bytes()) != before;
                async move { woken }
            })
            .await,
            "the queued instance was not woken"
        );
        let Acquire::Acquired { .. } = queued
            .acquire_fair(&key, token, long, WhenBusy::Queue, Duration::ZERO)
            .await
            .unwrap()
        else {
            panic!("the queued instance did not get the lock")
        };
        assert!(queued.release(&key, token).await.unwrap().released);
        let guard = fair.try_lock(&key).await.unwrap();
        assert!(
            guard.is_some(),
            "free, nobody waiting: fair try_lock takes it"
        );
        guard.unwrap().release().await.unwrap();
    }
}

/// A local waiter does not get a handed-off lease ahead of an earlier remote
/// waiter; an earlier local waiter does go before a later remote one (its instance
/// keeps its place through the release). The default mode hands off regardless.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_respects_arrival_order() {
    let server = shared();
    let _log = server.log_on_panic();
    let url = server.url();
    for (fair_mode, local_first) in [(true, false), (true, true), (false, false)] {
        let prefix = unique_prefix("fair-handoff");
        let key = LockKey::from("k");
        let lockers = instances(&url, &prefix, 2, fair_mode).await;
        let (home, remote) = (&lockers[0], &lockers[1]);
        let guard = home.lock(&key).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = JoinSet::new();
        let starts: [(&str, &Locker); 2] = if local_first {
            [("local", home), ("remote", remote)]
        } else {
            [("remote", remote), ("local", home)]
        };
        for (name, locker) in starts {
            let asked = || locker.stats().acquire_attempts + locker.stats().local_waits;
            let before = asked();
            let (started, arrived) = oneshot::channel();
            let (locker, k, order) = (locker.clone(), key.clone(), Arc::clone(&order));
            tasks.spawn(async move {
                let _ = started.send(());
                let guard = locker.lock(&k).await.unwrap();
                order.lock().unwrap().push(name);
                guard.release().await.unwrap();
            });
            arrived.await.unwrap();
            // The task asked (or waits locally) before the next one starts.
            eventually("the arrival landed", || async { asked() > before }).await;
            // Real time: fair arrivals are placed on the server's clock.
            tokio::time::sleep(GAP).await;
            if name == "remote" {
                // Its request has landed: the arrival order is unambiguous.
                assert!(
                    wait_until(Duration::from_secs(10), || async {
                        queue_len(&prefix, &key).await == 1
                    })
                    .await,
                    "the remote instance never queued"
                );
            }
        }
        guard.release().await.unwrap();
        while let Some(done) = tasks.join_next().await {
            done.unwrap();
        }
        let order = order.lock().unwrap().clone();
        let expected = match (fair_mode, local_first) {
            (true, false) => ["remote", "local"],
            (true, true) => ["local", "remote"],
            (false, _) => ["local", "remote"], // handed off ahead of the remote
        };
        assert_eq!(
            order, expected,
            "fair {fair_mode}, local first {local_first}"
        );
    }
}

/// Cancel safety in fair mode: a waiting `lock()` that is dropped takes its
/// instance out of the queue, so a later instance is not held behind the dead
/// entry. The cancelled instance's entries would live 30 s (its queue entry TTL),
/// and fair mode gives a free lock only to the earliest live entry, so a stale
/// entry would keep the later instance waiting for about that long.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_the_fair_queue() {
    let server = shared();
    let _log = server.log_on_panic();
    let url = server.url();
    let prefix = unique_prefix("fair-cancel");
    let key = LockKey::from("k");
    let holder = locker(backend_at(&url, &prefix).await, true);
    let guard = holder.lock(&key).await.unwrap();

    let early = RedisBackend::builder(url.as_str())
        .prefix(prefix.as_str())
        .queue_entry_ttl(Duration::from_secs(30))
        .connect()
        .await
        .unwrap();
    let early = locker(early, true);
    let cancelled = tokio::spawn({
        let (early, key) = (early.clone(), key.clone());
        async move { early.lock(&key).await.map(drop) }
    });
    assert!(
        wait_until(Duration::from_secs(10), || async {
            queue_len(&prefix, &key).await == 1
        })
        .await,
        "the early instance never queued"
    );
    // Real time: fair arrivals are placed on the server's clock.
    tokio::time::sleep(GAP).await;
    let later = locker(backend_at(&url, &prefix).await, true);
    let waiting = tokio::spawn({
        let key = key.clone();
        async move {
            let guard = later.lock(&key).await?;
            guard.release().await
        }
    });
    assert!(
        wait_until(Duration::from_secs(10), || async {
            queue_len(&prefix, &key).await == 2
        })
        .await,
        "the later instance never queued"
    );

    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    assert!(
        wait_until(Duration::from_secs(10), || async {
            queue_len(&prefix, &key).await == 1
        })
        .await,
        "the cancelled waiter's instance is still queued"
    );
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the later instance waited behind the cancelled one")
        .unwrap()
        .unwrap();
    assert_eq!(early.stats().keys_in_use, 0);
    assert_eq!(holder.stats().keys_in_use, 0);
}

/// Redlock has no common queue: a fair locker over it does not build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_refuses_fair_mode() {
    let url = shared().url();
    let redlock = RedlockBackend::builder(vec![url; 3])
        .prefix(unique_prefix("fair-redlock"))
        .connect()
        .await
        .unwrap();
    let e = Locker::builder(redlock)
        .contention(Contention::Fair)
        .build()
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    assert!(e.to_string().contains("fair mode"), "{e}");
}

/// What fair mode costs: server commands per critical section with 4 instances
/// of `tasks` tasks each looping on one key, fair vs default (printed for the
/// benchmark notes; asserted only to be mutually exclusive and complete).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_per_critical_section_fair_vs_default() {
    // Its own server: the command statistics count only this test's work.
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let proxy = CountingProxy::start(&server).await;
    let mut admin = server.connection().await;
    for tasks in [1usize, 4, 16] {
        for fair_mode in [false, true] {
            let prefix = unique_prefix("fair-cost");
            let key = LockKey::from("hot");
            let lockers = instances(&proxy.url(), &prefix, 4, fair_mode).await;
            // Load the scripts first.
            lockers[0]
                .lock(&key)
                .await
                .unwrap()
                .release()
                .await
                .unwrap();
            const ROUNDS: usize = 15;
            let inside = Arc::new(Mutex::new(false));
            let before = proxy.commands();
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut admin)
                .await
                .unwrap();
            let mut set = JoinSet::new();
            for l in &lockers {
                for _ in 0..tasks {
                    let (l, key, inside) = (l.clone(), key.clone(), Arc::clone(&inside));
                    set.spawn(async move {
                        for _ in 0..ROUNDS {
                            let g = l.lock(&key).await.unwrap();
                            assert!(!std::mem::replace(&mut *inside.lock().unwrap(), true));
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            *inside.lock().unwrap() = false;
                            g.release().await.unwrap();
                        }
                    });
                }
            }
            while let Some(done) = set.join_next().await {
                done.unwrap();
            }
            let sections = 4 * tasks * ROUNDS;
            let commands = proxy.commands() - before;
            // Every command the server ran, those run by the scripts included.
            let stats: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut admin)
                .await
                .unwrap();
            let executed: u64 = stats
                .lines()
                .filter(|l| {
                    l.starts_with("cmdstat_")
                        && !l.starts_with("cmdstat_config")
                        && !l.starts_with("cmdstat_info")
                })
                .filter_map(|l| {
                    l.split("calls=")
                        .nth(1)?
                        .split(',')
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum();
            let handoffs: u64 = lockers.iter().map(|l| l.stats().handoffs).sum();
            println!(
                "4 instances x {tasks} tasks, fair {fair_mode}: {commands} commands for \
                 {sections} critical sections = {:.2} per section, {:.1} executed by the \
                 server (scripts' commands included) ({handoffs} handoffs)",
                commands as f64 / sections as f64,
                executed as f64 / sections as f64
            );
        }
    }
}

/// While another instance waits, fair mode still hands the lease to a local task
/// that arrived before every waiter of every other instance (the acquire reply
/// reports when the earliest of them arrived), and to none that arrived after one:
/// the grant order stays the arrival order, with one handoff instead of a second
/// acquire for the two earlier local tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_handoff_serves_local_tasks_that_arrived_before_every_other_waiter() {
    let server = shared();
    let _log = server.log_on_panic();
    let url = server.url();
    let prefix = unique_prefix("fair-handoff-earlier");
    let key = LockKey::from("k");
    let holder = locker(backend_at(&url, &prefix).await, true);
    let fair = instances(&url, &prefix, 2, true).await;
    let before = fair[0].stats();
    // Instance 0: two tasks, then instance 1, then instance 0 again.
    let order = grant_order(&prefix, &holder, &fair, &key, &[0, 0, 1, 0], GAP).await;
    assert_eq!(order, [0, 1, 2, 3], "arrival order");
    let after = fair[0].stats();
    assert_eq!(
        after.handoffs - before.handoffs,
        1,
        "the second local task (earlier than instance 1's) by handoff, the fourth not"
    );
    assert_eq!(after.acquired - before.acquired, 2, "two grants by Redis");
}
