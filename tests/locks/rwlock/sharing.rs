//! Readers share: across instances, and locally through one Redis lease.

use super::*;

/// Readers of three instances hold the lock at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_of_three_instances_overlap() {
    let (server, _log, prefix) = shared_scene("rw-overlap");
    let lockers = instances(&server.url(), &prefix, 3).await;
    let inside: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
    let max_instances = Arc::new(AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for (i, locker) in lockers.iter().enumerate() {
        for _ in 0..3 {
            let (locker, inside, max_instances) = (
                locker.clone(),
                Arc::clone(&inside),
                Arc::clone(&max_instances),
            );
            tasks.spawn(async move {
                let guard = locker.rwlock("k").read().await.unwrap();
                inside[i].fetch_add(1, Ordering::SeqCst);
                // Held until readers of two instances were seen inside at once (by
                // any reader), not for a guessed time: if they cannot share, the
                // wait runs out and the assertion below fails.
                wait_until(testkit::EVENTUALLY, || {
                    let together = inside
                        .iter()
                        .filter(|n| n.load(Ordering::SeqCst) > 0)
                        .count();
                    let seen = max_instances
                        .fetch_max(together, Ordering::SeqCst)
                        .max(together);
                    async move { seen > 1 }
                })
                .await;
                inside[i].fetch_sub(1, Ordering::SeqCst);
                guard.release().await.unwrap();
            });
        }
    }
    join_all(tasks).await;
    let seen = max_instances.load(Ordering::SeqCst);
    println!("readers of {seen} instances held the lock at once");
    assert!(seen > 1, "readers of different instances never overlapped");
    wait_idle(&lockers).await;
}

/// N overlapping readers of one process cost the same Redis commands as one
/// reader: one acquire and one release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_readers_share_one_acquire_and_one_release() {
    let server = shared();
    let _log = server.log_on_panic();
    let proxy = CountingProxy::start(server).await;
    let prefix = unique_prefix("rw-cost");
    let backend = backend_at(&proxy.url(), &prefix).await;
    let locker = Locker::builder(backend).build().unwrap();
    // Loads the scripts (NOSCRIPT, SCRIPT LOAD) once.
    locker
        .rwlock("k")
        .read()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    locker
        .rwlock("k")
        .write()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    proxy.reset();
    locker
        .rwlock("k")
        .read()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let one = proxy.commands();

    const N: usize = 32;
    proxy.reset();
    // The leader's acquire is slowed down so that every reader arrives while it is
    // in flight (and joins it), however loaded the machine.
    proxy.set_delay(Duration::from_millis(300));
    let waits_before = locker.stats().local_waits;
    let all_in = Arc::new(tokio::sync::Barrier::new(N));
    let mut tasks = JoinSet::new();
    for _ in 0..N {
        let (locker, all_in) = (locker.clone(), Arc::clone(&all_in));
        tasks.spawn(async move {
            let guard = locker.rwlock("k").read().await.unwrap();
            // Everyone holds at once before anyone leaves.
            all_in.wait().await;
            guard.release().await.unwrap();
        });
    }
    let arrived = wait_until(Duration::from_secs(10), || {
        let waits = locker.stats().local_waits - waits_before;
        async move { waits >= N as u64 - 1 }
    })
    .await;
    assert!(arrived, "the readers never all arrived");
    proxy.set_delay(Duration::ZERO);
    join_all(tasks).await;
    let many = proxy.commands();
    println!("Redis commands: 1 reader = {one}, {N} overlapping readers = {many}");
    assert_eq!(one, 2, "one read + release: one acquire and one release");
    assert_eq!(
        many, one,
        "{N} local readers must share one acquire and one release"
    );

    proxy.reset();
    locker
        .rwlock("k")
        .write()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    println!("Redis commands: write + release = {}", proxy.commands());
    assert_eq!(proxy.commands(), 2);
    wait_idle(&[locker]).await;
}
