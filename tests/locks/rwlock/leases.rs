//! The leases' life: cancelled waits, a lost read lease, crashed holders, renewal.

use super::*;

/// Read and write futures dropped while they wait (locally, or at Redis as a
/// registered waiting writer, or as the local reader acquiring for others) leave
/// nothing locked: the waiting-writer entry is withdrawn, readers and a writer get
/// in afterwards, and no local state is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiting_reads_and_writes_leave_nothing_locked() {
    let (server, _log, prefix) = shared_scene("rw-cancel");
    let lockers = instances(&server.url(), &prefix, 3).await;
    let key = LockKey::from("k");
    let mut con = server.connection().await;

    // A writer of instance 0 holds the key.
    let held = lockers[0].rwlock("k").write().await.unwrap();
    // Instance 1: three readers wait (one of them at Redis for the others), then
    // are dropped. Instance 2: a writer waits at Redis (registered), and a second
    // writer waits locally behind it; both are dropped.
    let mut waiting = JoinSet::new();
    for _ in 0..3 {
        let l = lockers[1].clone();
        waiting.spawn(async move { l.rwlock("k").read().await.map(drop) });
    }
    for _ in 0..2 {
        let l = lockers[2].clone();
        waiting.spawn(async move { l.rwlock("k").write().await.map(drop) });
    }
    let registered = wait_until(Duration::from_secs(10), || {
        let name = rw_name(&prefix, &key, ":ww");
        let mut con = con.clone();
        async move { zcard(&mut con, &name).await == 1 }
    })
    .await;
    assert!(registered, "the waiting writer never registered at Redis");
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiting.abort_all();
    while waiting.join_next().await.is_some() {}
    // The dropped writer's entry is withdrawn in the background.
    let withdrawn = wait_until(Duration::from_secs(5), || {
        let name = rw_name(&prefix, &key, ":ww");
        let mut con = con.clone();
        async move { zcard(&mut con, &name).await == 0 }
    })
    .await;
    assert!(withdrawn, "a cancelled writer left its waiting entry");
    wait_idle(&lockers[1..]).await;
    held.release().await.unwrap();

    // Readers of instance 1 and then a writer of instance 2 get in.
    let r = lockers[1].rwlock("k").read().await.unwrap();
    r.release().await.unwrap();
    let w = lockers[2]
        .rwlock("k")
        .write_with_options(lockflight::LockOptions::new().wait_timeout(Duration::from_secs(5)))
        .await
        .unwrap();
    w.release().await.unwrap();

    // A reader that leads at Redis (the key write-locked) is dropped while another
    // local reader waits for it: the waiter takes over and gets the lock.
    let held = lockers[0].rwlock("k").write().await.unwrap();
    let before = lockers[1].stats();
    let l = lockers[1].clone();
    let leader = tokio::spawn(async move { l.rwlock("k").read().await.map(drop) });
    eventually("the leading reader asked Redis", || async {
        lockers[1].stats().acquire_attempts > before.acquire_attempts
    })
    .await;
    let l = lockers[1].clone();
    let follower = tokio::spawn(async move { l.rwlock("k").read().await });
    eventually("the second reader waits locally for the leader", || async {
        lockers[1].stats().local_waits > before.local_waits
    })
    .await;
    leader.abort();
    let _ = leader.await;
    held.release().await.unwrap();
    let guard = follower.await.unwrap().expect("the follower took over");
    guard.release().await.unwrap();

    wait_idle(&lockers).await;
    assert!(!exists(&mut con, &rw_name(&prefix, &key, ":wr")).await);
    let no_readers = wait_until(Duration::from_secs(5), || {
        let name = rw_name(&prefix, &key, ":rd");
        let mut con = con.clone();
        async move { zcard(&mut con, &name).await == 0 }
    })
    .await;
    assert!(no_readers, "a read lease was left behind");
}

/// When the shared read lease is lost (its keys deleted in Redis), every local
/// reader sharing it is signalled by the renewal, long before its validity ends,
/// and each release reports the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_read_lease_signals_every_local_reader() {
    let (server, _log, prefix) = shared_scene("rw-lost");
    let backend = backend_at(&server.url(), &prefix).await;
    let key = LockKey::from("k");
    let readers_key = rw_name(&prefix, &key, ":rd");
    let ttl = Duration::from_secs(10);
    let locker = Locker::builder(backend)
        .lease_ttl(ttl)
        .renew_every(Duration::from_millis(200))
        .build()
        .unwrap();
    let mut guards = Vec::new();
    for _ in 0..4 {
        guards.push(locker.rwlock("k").read().await.unwrap());
    }
    let mut con = server.connection().await;
    let deleted_at = Instant::now();
    redis::cmd("DEL")
        .arg(&readers_key)
        .query_async::<i64>(&mut con)
        .await
        .unwrap();
    for g in &guards {
        tokio::time::timeout(Duration::from_secs(5), g.lost())
            .await
            .expect("a local reader was not told its lease was lost");
    }
    let noticed = deleted_at.elapsed();
    println!("loss noticed by every reader {noticed:?} after the delete");
    assert!(
        noticed < ttl / 2,
        "signalled by the renewal, not the validity timer"
    );
    for g in guards {
        assert!(g.is_lost());
        let reason = g.loss_signal().reason().unwrap();
        assert!(reason.contains("no longer ours"), "{reason}");
        assert!(matches!(g.release().await, Err(Error::LeaseLost { .. })));
    }
    // A new reader gets a fresh lease.
    let fresh = locker.rwlock("k").read().await.unwrap();
    assert!(!fresh.is_lost());
    fresh.release().await.unwrap();
    wait_idle(&[locker]).await;
}

/// A reader or a waiting writer that crashed (it never releases, never asks again)
/// blocks nobody past its TTL: the read lease ends at the lease TTL, the waiting
/// writer's entry at the queue entry TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_readers_lease_and_a_crashed_writers_entry_expire() {
    use lockflight::backend::LockBackend;
    use lockflight::backend::{Acquire, LeaseToken, WhenBusy};

    let (server, _log, prefix) = shared_scene("rw-crash");
    let entry_ttl = Duration::from_millis(600);
    let connect = || async {
        RedisBackend::builder(server.url())
            .prefix(&prefix)
            .queue_entry_ttl(entry_ttl)
            .connect()
            .await
            .unwrap()
    };
    let crashed = connect().await;
    let locker = Locker::builder(connect().await).build().unwrap();
    let key = LockKey::from("k");
    let rw = crashed.rw().expect("Redis has read-write locks");

    // A read lease of 400 ms that nobody renews or releases.
    let ttl = Duration::from_millis(400);
    let start = Instant::now();
    let granted = rw
        .acquire_read(&key, LeaseToken::random(), ttl, WhenBusy::Return)
        .await;
    assert!(
        matches!(granted, Ok(Acquire::Acquired { .. })),
        "{granted:?}"
    );
    assert!(
        locker.rwlock("k").try_write().await.unwrap().is_none(),
        "the reader holds it"
    );
    let w = locker
        .rwlock("k")
        .write_with_options(lockflight::LockOptions::new().wait_timeout(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(
        start.elapsed() >= ttl - Duration::from_millis(50),
        "{:?}",
        start.elapsed()
    );
    w.release().await.unwrap();

    // A writer registered as waiting (behind a live reader), then gone.
    let reader = locker.rwlock("k").read().await.unwrap();
    let busy = rw
        .acquire_write(&key, LeaseToken::random(), ttl, WhenBusy::Queue)
        .await;
    assert!(matches!(busy, Ok(Acquire::Busy { .. })), "{busy:?}");
    reader.release().await.unwrap();
    let start = Instant::now();
    assert!(
        locker.rwlock("k").try_read().await.unwrap().is_none(),
        "a registered waiting writer refuses new read leases"
    );
    let r = locker
        .rwlock("k")
        .read_with_options(lockflight::LockOptions::new().wait_timeout(Duration::from_secs(10)))
        .await
        .unwrap();
    let waited = start.elapsed();
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    r.release().await.unwrap();
    wait_idle(&[locker]).await;
}

/// The watchdog renews held read and write leases past their TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_read_and_write_leases_are_renewed_past_their_ttl() {
    let (server, _log, prefix) = shared_scene("rw-renew");
    let ttl = Duration::from_millis(400);
    let locker = Locker::builder(backend_at(&server.url(), &prefix).await)
        .lease_ttl(ttl)
        .renew_every(Duration::from_millis(100))
        .build()
        .unwrap();
    let r = locker.rwlock("k").read().await.unwrap();
    tokio::time::sleep(ttl * 3).await;
    assert!(!r.is_lost(), "{:?}", r.loss_signal().reason());
    r.release().await.unwrap();
    let w = locker.rwlock("k").write().await.unwrap();
    tokio::time::sleep(ttl * 3).await;
    assert!(!w.is_lost(), "{:?}", w.loss_signal().reason());
    w.release().await.unwrap();
    let stats = locker.stats();
    assert!(stats.renewals >= 4, "{stats:?}");
    wait_idle(&[locker]).await;
}
