//! Row 2: **Redis** is SIGSTOPped for 2 × TTL while a lock is held and waited on
//! (by local waiters of the holder's locker, with handoff on, and by two other
//! instances queued in Redis).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockflight::{Error, Handoff, Locker};
use tokio::task::JoinSet;

use crate::oracle::{Fence, History};
use crate::{
    IDLE, TTL, Tally, assert_no_lock_left, backend_at, join_all, kind, serial, wait_idle, within,
};
use testkit::{RedisServer, unique_prefix, wait_until};

/// The holder's `lost()` resolves by the end of its validity (measured, with a
/// margin for a loaded machine); nobody is granted the lock while Redis is
/// stopped; no two holders overlap; after the resume the key is taken again
/// within TTL + 1 s and every waiter gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_signals_loss_in_time_and_never_overlaps() {
    let _serial = serial().await;
    let server = RedisServer::start();
    let prefix = unique_prefix("paused-redis");
    let key = "k";
    let history = History::new();
    let fence = Arc::new(Fence::default());
    let errors = Arc::new(Tally::default());
    let build = |backend, handoff| {
        Locker::builder(backend)
            .lease_ttl(TTL)
            .wait_timeout(Duration::from_secs(15))
            .handoff(handoff)
            .build()
            .unwrap()
    };
    let holder_locker = build(backend_at(&server.url(), &prefix).await, Handoff::enabled());
    let others = [
        build(
            backend_at(&server.url(), &prefix).await,
            Handoff::disabled(),
        ),
        build(
            backend_at(&server.url(), &prefix).await,
            Handoff::disabled(),
        ),
    ];
    let queue = testkit::names::queue(&prefix, &key.into());

    let call = Instant::now();
    let guard = holder_locker.lock(key).await.unwrap();
    let mut held = history.granted(key, "holder", call, &guard);
    let signal = guard.loss_signal();
    // The holder writes every 20 ms until it sees its lease lost, then releases.
    let holder = {
        let fence = Arc::clone(&fence);
        tokio::spawn(async move {
            for _ in 0..1000 {
                if held.write(&guard, &fence).is_none() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            held.finish();
            guard.release().await
        })
    };

    let mut waiters = JoinSet::new();
    let lockers = [
        (&holder_locker, "holder-locker", 2),
        (&others[0], "other1", 3),
        (&others[1], "other2", 3),
    ];
    for (locker, name, n) in lockers {
        for t in 0..n {
            let (locker, history, fence, errors) = (
                locker.clone(),
                Arc::clone(&history),
                Arc::clone(&fence),
                Arc::clone(&errors),
            );
            waiters.spawn(async move {
                let call = Instant::now();
                let guard = match locker.lock(key).await {
                    Ok(g) => g,
                    Err(e) => {
                        errors.add(format!("lock: {}", kind(&e)));
                        return None;
                    }
                };
                let mut held = history.granted(key, format!("{name}/{t}"), call, &guard);
                for _ in 0..3 {
                    held.write(&guard, &fence);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let section = held.finish();
                if let Err(e) = guard.release().await {
                    errors.add(format!("release: {}", kind(&e)));
                }
                Some(section.grant)
            });
        }
    }
    let con = server.connection().await;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (mut con, queue) = (con.clone(), &queue);
            async move {
                redis::cmd("ZCARD")
                    .arg(queue)
                    .query_async::<i64>(&mut con)
                    .await
                    .unwrap()
                    == 2
            }
        })
        .await,
        "the two other instances never queued"
    );
    // A renewal first.
    testkit::eventually("the holder's first renewal", || async {
        holder_locker.stats().renewals >= 1
    })
    .await;
    assert!(!signal.is_lost());

    server.pause();
    let paused_at = Instant::now();
    // A reply sent before the pause has arrived by now; no later one can.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let valid_for = signal.valid_for();
    let valid_until = Instant::now() + valid_for;
    assert!(!valid_for.is_zero(), "lost right after the pause");
    within(
        valid_for + Duration::from_secs(3),
        "lost() while Redis is stopped",
        signal.lost(),
    )
    .await;
    let lost_at = Instant::now();
    let late = lost_at.saturating_duration_since(valid_until);
    println!(
        "paused redis: lost() resolved {late:?} after valid_until (valid for {valid_for:?} \
         50 ms after the pause, {:?} after the pause)",
        lost_at - paused_at
    );
    assert!(
        late <= Duration::from_millis(500),
        "loss signalled {late:?} after the lease's validity ended"
    );
    tokio::time::sleep_until((paused_at + 2 * TTL).into()).await;
    let resuming = Instant::now();
    server.resume();

    let holder_release = within(Duration::from_secs(20), "the holder", holder)
        .await
        .unwrap();
    let grants: Vec<Instant> = within(Duration::from_secs(30), "the waiters", join_all(waiters))
        .await
        .into_iter()
        .flatten()
        .collect();
    println!(
        "paused redis: holder's release after the loss: {:?}; errors {:?}",
        holder_release.as_ref().map_err(kind),
        errors.snapshot()
    );
    assert!(
        matches!(
            holder_release,
            Ok(()) | Err(Error::LeaseLost { .. } | Error::Backend { .. })
        ),
        "the holder's release: {holder_release:?}"
    );
    assert_eq!(
        grants.len(),
        8,
        "every waiter gets the lock: {:?}",
        errors.snapshot()
    );
    let first = grants.iter().min().copied().unwrap();
    assert!(
        grants.iter().all(|&g| g >= resuming),
        "a waiter was granted the lock while Redis was stopped"
    );
    let after_resume = first - resuming;
    println!("paused redis: the key was taken again {after_resume:?} after the resume");
    assert!(
        after_resume <= TTL + Duration::from_secs(1),
        "the key was taken again only {after_resume:?} after the resume"
    );

    let verdict = history.check();
    println!("paused redis: {}", verdict.summary());
    verdict.assert_clean("paused redis");
    assert!(holder_locker.stats().leases_lost >= 1);
    let all = [holder_locker, others[0].clone(), others[1].clone()];
    wait_idle(&all, IDLE).await;
    assert_no_lock_left(&server, &prefix, TTL + Duration::from_secs(2)).await;
}
