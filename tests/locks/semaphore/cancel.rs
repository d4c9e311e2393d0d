//! Acquire and release futures dropped at random points leak no permit.

use super::*;

/// Many acquire (and try_acquire) futures dropped at random points, on two
/// instances, some holding a permit: afterwards all N permits can be taken, and
/// after their release the permit set is empty and no key is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancellation_storm_leaks_no_permit() {
    const N: u32 = 4;
    let (server, _log, prefix) = shared_scene("sem-storm");
    let lockers = instances(&server.url(), &prefix, 2).await;
    let permits = testkit::names::permits(&prefix, &LockKey::from("pool"));
    let granted = Arc::new(AtomicUsize::new(0));
    let mut set = JoinSet::new();
    let mut handles = Vec::new();
    for l in &lockers {
        for _ in 0..40 {
            let (sem, granted) = (l.semaphore("pool", N), Arc::clone(&granted));
            handles.push(set.spawn(async move {
                for _ in 0..10 {
                    let cut = Duration::from_micros(rand::random::<u64>() % 8_000);
                    let got = if rand::random::<u8>().is_multiple_of(4) {
                        tokio::time::timeout(cut, sem.try_acquire()).await
                    } else {
                        tokio::time::timeout(cut, async { sem.acquire().await.map(Some) }).await
                    };
                    if let Ok(Ok(Some(permit))) = got {
                        granted.fetch_add(1, Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_micros(rand::random::<u64>() % 2_000))
                            .await;
                        if rand::random::<bool>() {
                            // A release whose future is dropped half-way.
                            let _ = tokio::time::timeout(
                                Duration::from_micros(rand::random::<u64>() % 500),
                                permit.release(),
                            )
                            .await;
                        }
                    }
                }
            }));
        }
    }
    // Abort some tasks wherever they are.
    tokio::time::sleep(Duration::from_millis(20)).await;
    for h in handles.iter().step_by(3) {
        h.abort();
    }
    while let Some(joined) = set.join_next().await {
        if let Err(e) = joined
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    wait_idle(&lockers).await;
    let granted = granted.load(Ordering::Relaxed);
    println!("cancellation storm: {granted} permits granted, the rest cut short");
    assert!(granted > 0, "the storm never got a permit");
    let mut con = server.connection().await;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let mut con = con.clone();
            let permits = permits.clone();
            async move { zcard(&mut con, &permits).await == 0 }
        })
        .await,
        "permits left in Redis after the storm: {}",
        zcard(&mut con, &permits).await
    );
    let sem = lockers[0].semaphore("pool", N);
    let mut all: Vec<Permit> = Vec::new();
    for i in 0..N {
        all.push(
            sem.try_acquire()
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("permit {i} of {N} is not free after the storm")),
        );
    }
    assert!(sem.try_acquire().await.unwrap().is_none());
    for p in all {
        p.release().await.unwrap();
    }
    assert_eq!(zcard(&mut con, &permits).await, 0);
    let pattern = format!("{prefix}:*");
    assert!(
        wait_until(Duration::from_secs(5), || {
            let pattern = pattern.clone();
            async move { key_count(server, &pattern).await == 0 }
        })
        .await,
        "keys left after the storm"
    );
}
