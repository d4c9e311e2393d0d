//! A primary is killed while a lock on its shard is held and waited on.

use super::*;

/// A shard's primary is killed while a lock on it is held and waited on. The
/// holder is signalled lost, or it keeps a lease that the promoted replica also
/// has; a workload on the other shards is not held up; the key's fencing tokens
/// never go back. The killed node comes back as a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_primary_while_held() {
    let (_serial, c) = cluster_for_this_test().await;
    let (a, b) = two_instances("failover").await;
    let shards = key_per_shard(&a, "f").await;
    let (key, victim) = shards[0].clone();
    let others: Vec<LockKey> = shards[1..].iter().map(|(k, _)| k.clone()).collect();
    let ttl = Duration::from_secs(4);
    let holder = Locker::builder(a.clone())
        .lease_ttl(ttl)
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let waiter = Locker::builder(b.clone())
        .lease_ttl(ttl)
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();

    let held = holder.lock(&key).await.unwrap();
    let first = held.fencing_token();
    let waiting = {
        let (w, k) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            let g = w
                .lock(&k)
                .await
                .expect("the waiter gets the key after the failover");
            let t = g.fencing_token();
            g.release().await.expect("release");
            t
        })
    };
    // The other shards' workload, timed per critical section.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worst = Arc::new(Mutex::new(Duration::ZERO));
    let other_done = Arc::new(AtomicU64::new(0));
    let mut others_tasks = JoinSet::new();
    for k in others {
        for _ in 0..4 {
            let (l, k, stop, worst, n) = (
                waiter.clone(),
                k.clone(),
                stop.clone(),
                worst.clone(),
                other_done.clone(),
            );
            others_tasks.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let t0 = Instant::now();
                    let g = l.lock(&k).await.expect("other shards keep working");
                    g.release().await.expect("release on another shard");
                    let d = t0.elapsed();
                    {
                        let mut w = worst.lock().unwrap();
                        *w = (*w).max(d);
                    }
                    n.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let replica = c.replicas_of(&victim.id).await;
    assert_eq!(replica.len(), 1, "one replica per primary");
    let replica = replica[0].clone();
    // Replication is asynchronous: wait until the replica has the lock too.
    let lock_name = a.lock_name(&key);
    let rnode = c.by_addr(&replica.addr);
    assert!(
        wait_until(Duration::from_secs(5), || {
            let name = String::from_utf8_lossy(&lock_name).into_owned();
            async move {
                let mut con = rnode.connection().await;
                redis::cmd("READONLY")
                    .query_async::<()>(&mut con)
                    .await
                    .ok();
                redis::cmd("EXISTS")
                    .arg(&name)
                    .query_async::<bool>(&mut con)
                    .await
                    .unwrap_or(false)
            }
        })
        .await
    );
    let before_kill = other_done.load(Ordering::SeqCst);
    let killed_at = Instant::now();
    c.by_addr(&victim.addr).kill();
    // The replica takes over.
    assert!(
        wait_until(Duration::from_secs(20), || async {
            c.primaries().await.iter().any(|p| p.id == replica.id)
        })
        .await,
        "the replica was not promoted"
    );
    let promoted_after = killed_at.elapsed();
    // Over two lease TTLs: either the holder was told it lost the lease, or the
    // promoted replica holds it and renewals keep it.
    tokio::time::sleep(ttl * 2).await;
    let lost = held.is_lost();
    if !lost {
        let mut con = rnode.connection().await;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&lock_name)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            exists,
            "the holder is not lost but the new primary lacks its lock"
        );
    }
    let during = other_done.load(Ordering::SeqCst) - before_kill;
    let _ = held.release().await;
    let second = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiter is served after the failover")
        .unwrap();
    let third = {
        let g = holder.lock(&key).await.unwrap();
        let t = g.fencing_token();
        g.release().await.unwrap();
        t
    };
    assert_strictly_increasing(&[first, second, third], "across the failover");
    stop.store(true, Ordering::SeqCst);
    join_all(others_tasks).await;
    let worst = *worst.lock().unwrap();
    println!(
        "failover: replica promoted {promoted_after:?} after the kill; holder lost: {lost}; \
         other shards: {during} sections meanwhile, worst {worst:?}; tokens {first} < {second} < {third}"
    );
    assert!(during > 0, "the other shards stalled during the failover");
    // The killed node comes back (empty) and rejoins as a replica.
    c.by_addr(&victim.addr).restart();
    c.wait_ok(Duration::from_secs(30)).await;
    wait_idle(&[holder, waiter], IDLE).await;
}
