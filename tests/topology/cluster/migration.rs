//! A hot key's slot migrates while the lock is held and waited on.

use tokio::time::sleep;

use super::*;

/// A hot key's slot moves to another shard (`MIGRATING`/`IMPORTING`, `MIGRATE` of
/// its keys, `SETSLOT NODE`) while 2 instances × 8 tasks run read-modify-write
/// critical sections on it: none overlaps, the counter is exact, and the workload
/// goes on after the move (waiters woken by releases on the new shard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_slot_migrates_while_held_and_waited_on() {
    let (_serial, c) = cluster_for_this_test().await;
    let (prefix, a, b) = two_instances("migrate").await;
    let key = LockKey::from("hot");
    let slot = slot_of(&key);
    let (from, to) = c.slot_move(slot).await;
    let lockers: Vec<Locker> = [a.clone(), b.clone()]
        .into_iter()
        .map(|be| {
            Locker::builder(be)
                .lease_ttl(Duration::from_secs(2))
                .wait_timeout(Duration::from_secs(30))
                .build()
                .unwrap()
        })
        .collect();
    let counter = counter_name(&prefix, &key);
    let data = data_conn().await;
    let done = Arc::new(AtomicU64::new(0));
    let release_errors = Arc::new(AtomicU64::new(0));
    let section = CounterSection::new(counter.clone(), data.clone());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    for l in &lockers {
        for _ in 0..8 {
            let (l, key, mut section) = (l.clone(), key.clone(), section.clone());
            let (done, stop, rel) = (done.clone(), stop.clone(), release_errors.clone());
            tasks.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let guard = l.lock(&key).await.expect("lock during the migration");
                    section
                        .increment(guard.fencing_token(), sleep(Duration::from_millis(1)))
                        .await;
                    done.fetch_add(1, Ordering::SeqCst);
                    if guard.release().await.is_err() {
                        // TRYAGAIN outlasting the retries mid-migration: the lease
                        // expires by its TTL instead.
                        rel.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    }
    // Let the workload run, then move the slot while it runs.
    assert!(
        wait_until(Duration::from_secs(20), || {
            let n = done.load(Ordering::SeqCst);
            async move { n >= 50 }
        })
        .await
    );
    let moved_at = done.load(Ordering::SeqCst);
    c.migrate_slot(
        slot,
        &from,
        &to,
        tokio::time::sleep(Duration::from_millis(200)),
    )
    .await;
    let after = done.load(Ordering::SeqCst);
    // The workload continues on the new shard.
    assert!(
        wait_until(Duration::from_secs(20), || {
            let n = done.load(Ordering::SeqCst);
            async move { n >= after + 100 }
        })
        .await,
        "the workload stalled after the migration ({} sections)",
        done.load(Ordering::SeqCst)
    );
    stop.store(true, Ordering::SeqCst);
    join_all(tasks).await;
    let total = done.load(Ordering::SeqCst);
    let mut data = data.clone();
    let v = counter_value(&mut data, &counter).await;
    assert_eq!(v, total, "lost updates across the migration");
    assert_eq!(c.primary_of_slot(slot).await.id, to.id, "the slot moved");
    assert_strictly_increasing(&section.tokens(), "migration");
    wait_idle(&lockers, IDLE).await;
    println!(
        "migration: {moved_at} sections before, {} during, {total} in all; {} release errors",
        after - moved_at,
        release_errors.load(Ordering::SeqCst)
    );
}
