//! Row 6: **handoff while Redis becomes a black hole** (a proxy that forwards
//! nothing and closes nothing, like a network partition).
//!
//! Two instances reach Redis through the proxy, with handoff on (one with the
//! default `min_validity`, one with 30 ms, so that leases are handed on close to
//! their end); a third instance talks to Redis directly and competes for the
//! same keys, so it takes them over once the partitioned instances' leases
//! expire. On key `hot` the tasks hold for a few ms (handoff chains); on key
//! `long` one partitioned task holds for longer than the black hole lasts.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lockflight::{Error, Handoff, Locker};
use rand::RngExt as _;
use tokio::task::JoinSet;

use crate::oracle::{Fence, History};
use crate::{
    IDLE, TTL, Tally, assert_no_lock_left, backend_at, join_all, kind, lock_granted, serial,
    wait_idle, within,
};
use testkit::{CountingProxy, RedisServer, unique_prefix};

const WAIT: Duration = Duration::from_secs(3);
const BLACKHOLE: Duration = Duration::from_millis(2500);
/// How late a loss may be signalled after the end of the validity, on a loaded
/// machine.
const LATE: Duration = Duration::from_millis(500);

#[derive(Debug, Default, Clone, Copy)]
struct TaskReport {
    /// Sections that ended with the lease lost.
    outlived: u32,
    /// Of those, the latest `lost()` relative to the end of the validity.
    latest: Duration,
}

/// One task: lock, hold for `hold()` while writing every 10 ms, and — when the
/// lease is lost by the end — check that `lost()` had resolved by the end of
/// the validity the holder last saw.
#[allow(clippy::too_many_arguments)]
async fn worker(
    locker: Locker,
    key: &'static str,
    name: String,
    hold: fn() -> Duration,
    history: Arc<History>,
    fence: Arc<Fence>,
    errors: Arc<Tally>,
    stop: Arc<AtomicBool>,
) -> TaskReport {
    let mut report = TaskReport::default();
    for _ in 0..100_000 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let call = Instant::now();
        let Some(guard) = lock_granted(locker.lock(key).await, &errors) else {
            continue;
        };
        let mut held = history.granted(key, name.clone(), call, &guard);
        let signal = guard.loss_signal();
        let watcher = tokio::spawn(async move {
            signal.lost().await;
            Instant::now()
        });
        let end = Instant::now() + hold();
        let mut known_until = Instant::now() + guard.valid_for();
        while Instant::now() < end {
            let sampled = Instant::now();
            let left = guard.valid_for();
            if !left.is_zero() {
                known_until = known_until.max(sampled + left);
            }
            held.write(&guard, &fence);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if guard.is_lost() {
            let lost_at = within(
                Duration::from_millis(500),
                "lost() of a lease that is lost",
                watcher,
            )
            .await
            .expect("the watcher");
            report.outlived += 1;
            report.latest = report
                .latest
                .max(lost_at.saturating_duration_since(known_until));
        } else {
            watcher.abort();
        }
        held.finish();
        match guard.release().await {
            Ok(()) => {}
            Err(e @ (Error::Backend { .. } | Error::LeaseLost { .. })) => {
                errors.add(format!("release: {}", kind(&e)));
            }
            Err(e) => panic!("release failed with {e:?}"),
        }
    }
    report
}

fn short() -> Duration {
    Duration::from_millis(rand::rng().random_range(5..40))
}

fn long() -> Duration {
    BLACKHOLE + TTL
}

/// No task is granted a lease whose validity ended before its grant; every task
/// that outlives its lease has `lost()` resolved, by the end of the validity it
/// last saw (+ 500 ms); the direct instance's holders never overlap the
/// partitioned ones; the partitioned instances make progress again once the
/// black hole ends; nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handoff_into_a_black_hole_grants_only_valid_leases_and_signals_loss() {
    let _serial = serial().await;
    let server = RedisServer::start();
    let proxy = CountingProxy::start(&server).await;
    let prefix = unique_prefix("blackhole");
    let history = History::new();
    let fence = Arc::new(Fence::default());
    let errors = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let handoff = Handoff::enabled()
        .max_consecutive(10_000)
        .max_hold(Duration::from_secs(10));
    let build = |backend, handoff| {
        Locker::builder(backend)
            .lease_ttl(TTL)
            .wait_timeout(WAIT)
            .handoff(handoff)
            .build()
            .unwrap()
    };
    let partitioned = [
        build(backend_at(&proxy.url(), &prefix).await, handoff),
        build(
            backend_at(&proxy.url(), &prefix).await,
            handoff.min_validity(Duration::from_millis(30)),
        ),
    ];
    let direct = build(
        backend_at(&server.url(), &prefix).await,
        Handoff::disabled(),
    );

    let mut tasks = JoinSet::new();
    let mut spawn = |locker: &Locker, key: &'static str, name: String, hold: fn() -> Duration| {
        tasks.spawn(worker(
            locker.clone(),
            key,
            name,
            hold,
            Arc::clone(&history),
            Arc::clone(&fence),
            Arc::clone(&errors),
            Arc::clone(&stop),
        ));
    };
    for (i, locker) in partitioned.iter().enumerate() {
        for t in 0..4 {
            spawn(locker, "hot", format!("p{i}/{t}"), short);
        }
    }
    spawn(&partitioned[0], "long", "p0/long".into(), long);
    for t in 0..2 {
        spawn(&direct, "hot", format!("d/{t}"), short);
    }
    spawn(&direct, "long", "d/long".into(), short);

    tokio::time::sleep(Duration::from_millis(1000)).await;
    proxy.blackhole(true);
    let cut = Instant::now();
    tokio::time::sleep(BLACKHOLE).await;
    proxy.blackhole(false);
    let healed = Instant::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    stop.store(true, Ordering::Relaxed);
    let reports = within(Duration::from_secs(30), "the tasks", join_all(tasks)).await;

    let verdict = history.check();
    let outlived: u32 = reports.iter().map(|r| r.outlived).sum();
    let latest = reports.iter().map(|r| r.latest).max().unwrap();
    let sections = history.sections();
    let after = sections
        .iter()
        .filter(|s| s.holder.starts_with('p') && s.grant > healed)
        .count();
    let direct_during = sections
        .iter()
        .filter(|s| s.holder.starts_with("d/") && s.grant > cut && s.grant < cut + BLACKHOLE)
        .count();
    let handoffs: u64 = partitioned.iter().map(|l| l.stats().handoffs).sum();
    println!("black hole: {}", verdict.summary());
    println!(
        "black hole: {handoffs} handoffs; {outlived} sections outlived their lease, lost() at \
         most {latest:?} after the validity they last saw; the direct instance held the keys \
         {direct_during} times during the black hole; the partitioned instances {after} times \
         after it; errors {:?}",
        errors.snapshot()
    );
    verdict.assert_clean("black hole");
    assert!(outlived >= 1, "the long holder did not outlive its lease");
    assert!(
        latest <= LATE,
        "a loss was signalled {latest:?} after the end of the validity"
    );
    assert!(
        direct_during >= 1,
        "the direct instance never took over from the partitioned ones"
    );
    assert!(
        after >= 1,
        "no progress of the partitioned instances after the black hole"
    );
    let mut all = partitioned.to_vec();
    all.push(direct);
    wait_idle(&all, IDLE).await;
    assert_no_lock_left(&server, &prefix, TTL + Duration::from_secs(2)).await;
}
