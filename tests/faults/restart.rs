//! Row 3: Redis is **killed and restarted empty, twice**, under a hot-key
//! workload (3 lockers × 4 tasks).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lockflight::Error;
use rand::RngExt as _;
use tokio::task::JoinSet;

use crate::oracle::{Fence, History};
use crate::{
    IDLE, TTL, Tally, assert_no_lock_left, join_all, kind, lock_granted, mixed_lockers, serial,
    wait_idle, within,
};
use testkit::{RedisServer, unique_prefix};

const LOCKERS: usize = 3;
const TASKS: usize = 4;
const WAIT: Duration = Duration::from_secs(3);
/// How long the server stays down.
const DOWN: Duration = Duration::from_millis(300);

/// Every fencing token granted after a restart is greater than every token
/// granted before it (the epoch's floor is the server clock, so it survives the
/// loss of the fence key); the fenced resource rejects only writers whose lease
/// was wiped by a restart; progress resumes within TTL + 2 s of each restart;
/// errors are only `Timeout` / `Backend` (and `LeaseLost` from a release of a
/// wiped lease); no lock is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_and_progress_resumes_across_empty_restarts() {
    let _serial = serial().await;
    let server = Arc::new(RedisServer::start());
    let prefix = unique_prefix("restart");
    let key = "hot";
    let history = History::new();
    let fence = Arc::new(Fence::default());
    let errors = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let lockers = mixed_lockers(&server.url(), &prefix, LOCKERS, WAIT).await;

    let mut tasks = JoinSet::new();
    for (li, locker) in lockers.iter().enumerate() {
        for t in 0..TASKS {
            let (locker, history, fence, errors, stop) = (
                locker.clone(),
                Arc::clone(&history),
                Arc::clone(&fence),
                Arc::clone(&errors),
                Arc::clone(&stop),
            );
            tasks.spawn(async move {
                let mut longest = Duration::ZERO;
                for _ in 0..100_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let call = Instant::now();
                    let result = locker.lock(key).await;
                    longest = longest.max(call.elapsed());
                    let Some(guard) = lock_granted(result, &errors) else {
                        continue;
                    };
                    let mut held = history.granted(key, format!("{li}/{t}"), call, &guard);
                    let hold = rand::rng().random_range(0..4);
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    held.write(&guard, &fence);
                    let lost_before = guard.is_lost();
                    held.finish();
                    match guard.release().await {
                        Ok(()) => {}
                        Err(e @ Error::Backend { .. }) => {
                            errors.add(format!("release: {}", kind(&e)))
                        }
                        Err(Error::LeaseLost { .. }) => errors.add(if lost_before {
                            "release: LeaseLost (seen lost before)"
                        } else if history.data_lost_since(call.checked_sub(2 * TTL).unwrap_or(call))
                        {
                            "release: LeaseLost (data lost)"
                        } else {
                            "release: LeaseLost (false)"
                        }),
                        Err(e) => panic!("release failed with {e:?}"),
                    }
                }
                longest
            });
        }
    }

    let mut kills = Vec::new();
    let mut restarts = Vec::new();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for _ in 0..2 {
        history.data_loss();
        let killed = Instant::now();
        server.kill();
        tokio::time::sleep(DOWN).await;
        let restarted = {
            let server = Arc::clone(&server);
            tokio::task::spawn_blocking(move || {
                server.restart();
                Instant::now()
            })
            .await
            .unwrap()
        };
        kills.push(killed);
        restarts.push(restarted);
        tokio::time::sleep(Duration::from_millis(2500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let longest = within(Duration::from_secs(30), "the tasks", join_all(tasks))
        .await
        .into_iter()
        .max()
        .unwrap();

    let sections = history.sections();
    let verdict = history.check();
    println!("restarts: {}", verdict.summary());
    println!(
        "restarts: errors {:?}; longest lock() call {longest:?}",
        errors.snapshot()
    );
    verdict.assert_clean("restarts");
    assert!(
        longest <= WAIT + Duration::from_secs(1),
        "a lock() call took {longest:?} with a wait timeout of {WAIT:?}"
    );
    for (i, (&killed, &restarted)) in kills.iter().zip(&restarts).enumerate() {
        let before = sections
            .iter()
            .filter(|s| s.grant <= killed)
            .map(|s| s.token)
            .max()
            .expect("sections before the kill");
        let after: Vec<_> = sections.iter().filter(|s| s.grant >= restarted).collect();
        let below = after.iter().filter(|s| s.token <= before).count();
        assert_eq!(
            below, 0,
            "restart {i}: {below} tokens granted after the restart are not above {before}, the \
             greatest before it"
        );
        let first = after
            .iter()
            .map(|s| s.grant)
            .min()
            .expect("sections after the restart");
        let resumed = first - restarted;
        println!(
            "restart {i}: down {:?}, first grant {resumed:?} after the restart (greatest token \
             before: {before})",
            restarted - killed
        );
        assert!(
            resumed <= TTL + Duration::from_secs(2),
            "restart {i}: progress resumed only {resumed:?} after the restart"
        );
    }
    assert_eq!(
        errors.get("release: LeaseLost (false)"),
        0,
        "a release reported a loss that its holder had not seen, with no data loss during its \
         section: {:?}",
        errors.snapshot()
    );

    wait_idle(&lockers, IDLE).await;
    assert_no_lock_left(&server, &prefix, TTL + Duration::from_secs(2)).await;
}

/// A restart without the data ends every lease of every kind at once, with a
/// reason that says so (not at the next renewal, which is a TTL away), and no new
/// lease is granted to anyone, not even to an instance that connects only after
/// the restart, until every lease of the lost data would have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_ends_every_lease_at_once_and_grants_nothing_until_their_ttl() {
    let _serial = serial().await;
    let server = Arc::new(RedisServer::start());
    let prefix = unique_prefix("life");
    // A renewal would find each lease gone too, but would say "not the owner":
    // the reason tells which signal came first.
    let ttl = Duration::from_secs(5);
    let holder = lockflight::Locker::builder(crate::backend_at(&server.url(), &prefix).await)
        .lease_ttl(ttl)
        .renew_every(Duration::from_millis(1900))
        .build()
        .unwrap();
    let lock = holder.lock("mutex").await.unwrap();
    let write = holder.rwlock("rw").write().await.unwrap();
    let permit = holder.semaphore("sem", 2).acquire().await.unwrap();
    let signals = [
        lock.loss_signal(),
        write.loss_signal(),
        permit.loss_signal(),
    ];

    {
        let server = Arc::clone(&server);
        tokio::task::spawn_blocking(move || server.restart())
            .await
            .unwrap();
    }
    for signal in &signals {
        within(Duration::from_secs(30), "the loss", signal.lost()).await;
        let reason = signal.reason().unwrap();
        assert!(
            reason.contains("restarted without its data"),
            "lost for another reason: {reason}"
        );
    }

    // An instance that connects now knows no earlier life, and is still held off.
    let late = lockflight::Locker::builder(crate::backend_at(&server.url(), &prefix).await)
        .lease_ttl(ttl)
        .build()
        .unwrap();
    assert!(late.try_lock("mutex").await.unwrap().is_none());
    assert!(late.rwlock("rw").try_write().await.unwrap().is_none());
    assert!(
        late.semaphore("sem", 2)
            .try_acquire()
            .await
            .unwrap()
            .is_none(),
        "a permit was granted while the restart's quarantine lasts"
    );
    // The quarantine ends one TTL after the restart: then it is granted.
    let mut admin = server.connection().await;
    let life: String = redis::cmd("GET")
        .arg(format!("{prefix}:life"))
        .query_async(&mut admin)
        .await
        .unwrap();
    let quarantined_until_ms: u64 = life
        .split(' ')
        .nth(1)
        .expect("a quarantine")
        .parse()
        .unwrap();
    let guard = late
        .lock_with_options(
            "mutex",
            lockflight::LockOptions::new().wait_timeout(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut admin).await.unwrap();
    assert!(
        secs * 1000 + micros / 1000 >= quarantined_until_ms,
        "granted before the quarantine ended"
    );
    assert!(guard.fencing_token() > lock.fencing_token());
    guard.release().await.unwrap();
    drop((lock, write, permit));
}
