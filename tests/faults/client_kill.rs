//! Row 5: `CLIENT KILL TYPE normal` and `CLIENT KILL TYPE pubsub` every 200 ms
//! for 5 s while 3 lockers × 20 tasks increment a counter in Redis (GET, then SET
//! under the lock).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockflight::Error;
use tokio::task::JoinSet;

use crate::oracle::{Fence, History};
use crate::{
    IDLE, TTL, Tally, assert_no_lock_left, join_all, kind, lock_granted, mixed_lockers, serial,
    wait_idle, within,
};
use testkit::nemesis::client_kill;
use testkit::{RedisServer, unique_prefix};

const LOCKERS: usize = 3;
const TASKS: usize = 20;
const WAIT: Duration = Duration::from_secs(2);
const KILL_EVERY: Duration = Duration::from_millis(200);
const KILL_FOR: Duration = Duration::from_secs(5);

/// The counter is exact (mutual exclusion held), no `lock()` waits past its wait
/// timeout (+ 1 s), errors are only `Timeout` / `Backend` (and a release may
/// report `LeaseLost` only for a lease its holder saw lost), the holders never
/// overlap, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_keep_the_counter_exact() {
    let _serial = serial().await;
    let server = RedisServer::start();
    let prefix = unique_prefix("client-kill");
    let key = "hot";
    let counter = format!("{prefix}:counter");
    // Skipped by its own CLIENT KILL (SKIPME yes): the counter's connection.
    let mut admin = server.connection().await;
    redis::cmd("SET")
        .arg(&counter)
        .arg(0)
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let history = History::new();
    let fence = Arc::new(Fence::default());
    let errors = Arc::new(Tally::default());
    let increments = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let lockers = mixed_lockers(&server.url(), &prefix, LOCKERS, WAIT).await;

    let mut tasks = JoinSet::new();
    for (li, locker) in lockers.iter().enumerate() {
        for t in 0..TASKS {
            let (locker, history, fence, errors, increments, stop, admin, counter) = (
                locker.clone(),
                Arc::clone(&history),
                Arc::clone(&fence),
                Arc::clone(&errors),
                Arc::clone(&increments),
                Arc::clone(&stop),
                admin.clone(),
                counter.clone(),
            );
            tasks.spawn(async move {
                let (mut longest_lock, mut longest_release) = (Duration::ZERO, Duration::ZERO);
                for _ in 0..100_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let call = Instant::now();
                    let result = locker.lock(key).await;
                    longest_lock = longest_lock.max(call.elapsed());
                    let Some(guard) = lock_granted(result, &errors) else {
                        continue;
                    };
                    let mut held = history.granted(key, format!("{li}/{t}"), call, &guard);
                    let mut con = admin.clone();
                    let value: u64 = redis::cmd("GET")
                        .arg(&counter)
                        .query_async(&mut con)
                        .await
                        .expect("GET on the counter connection");
                    tokio::task::yield_now().await;
                    if held.write(&guard, &fence) == Some(true) {
                        redis::cmd("SET")
                            .arg(&counter)
                            .arg(value + 1)
                            .query_async::<()>(&mut con)
                            .await
                            .expect("SET on the counter connection");
                        increments.fetch_add(1, Ordering::Relaxed);
                    } else {
                        errors.add("section: lease lost before the SET");
                    }
                    let lost_before = guard.is_lost();
                    held.finish();
                    let released = Instant::now();
                    let result = guard.release().await;
                    longest_release = longest_release.max(released.elapsed());
                    match result {
                        Ok(()) => {}
                        Err(e @ Error::Backend { .. }) => {
                            errors.add(format!("release: {}", kind(&e)))
                        }
                        Err(Error::LeaseLost { .. }) => errors.add(if lost_before {
                            "release: LeaseLost (seen lost before)"
                        } else {
                            "release: LeaseLost (not seen lost: a lost reply?)"
                        }),
                        Err(e) => panic!("release failed with {e:?}"),
                    }
                }
                (longest_lock, longest_release)
            });
        }
    }

    let started = Instant::now();
    let (mut rounds, mut normal, mut pubsub) = (0, 0, 0);
    let before = increments.load(Ordering::Relaxed);
    while started.elapsed() < KILL_FOR && rounds < 100 {
        let tick = started + KILL_EVERY * (rounds + 1);
        normal += client_kill(&mut admin, "normal", Duration::from_secs(2))
            .await
            .expect("CLIENT KILL TYPE normal");
        pubsub += client_kill(&mut admin, "pubsub", Duration::from_secs(2))
            .await
            .expect("CLIENT KILL TYPE pubsub");
        rounds += 1;
        tokio::time::sleep_until(tick.into()).await;
    }
    let during = increments.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    let longest = within(Duration::from_secs(30), "the tasks", join_all(tasks)).await;
    let longest_lock = longest.iter().map(|l| l.0).max().unwrap();
    let longest_release = longest.iter().map(|l| l.1).max().unwrap();

    let value: u64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut admin)
        .await
        .unwrap();
    let verdict = history.check();
    println!(
        "client kill: {rounds} rounds killed {normal} normal and {pubsub} pub/sub connections; \
         {during} increments while killing, counter {value}"
    );
    println!("client kill: {}", verdict.summary());
    println!(
        "client kill: errors {:?}; longest lock() {longest_lock:?}, longest release() \
         {longest_release:?}",
        errors.snapshot()
    );
    assert_eq!(
        value,
        increments.load(Ordering::Relaxed),
        "lost updates: the counter is not exact"
    );
    assert!(during > 0, "no progress while connections were killed");
    assert!(normal > 0 && pubsub > 0, "nothing was killed");
    verdict.assert_clean("client kill");
    assert!(
        longest_lock <= WAIT + Duration::from_secs(1),
        "a lock() call took {longest_lock:?} with a wait timeout of {WAIT:?}"
    );
    wait_idle(&lockers, IDLE).await;
    assert_no_lock_left(&server, &prefix, TTL + Duration::from_secs(2)).await;
}
