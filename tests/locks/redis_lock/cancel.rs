//! Cancel safety.

use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};

use super::*;

/// 200 tasks on one key over three lockers (coalescing, handoff, naive); half of
/// them are cancelled at random points (timeouts and aborts, while waiting, while
/// acquiring, inside the critical section). The others all complete; afterwards
/// nothing is left: no slot, no lock key, no key without a TTL, and the lock is
/// free at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_lock_calls_leave_nothing_behind() {
    const TASKS: u64 = 200;
    let (server, _log, prefix) = shared_scene("cancel");
    let key = LockKey::from("k");
    let mut backends = Vec::new();
    let mut lockers = Vec::new();
    for mode in [Mode::Coalescing, Mode::Handoff, Mode::Naive] {
        let backend = backend_at(&server.url(), &prefix).await;
        lockers.push(
            configure(Locker::builder(backend.clone()), mode)
                .build()
                .unwrap(),
        );
        backends.push(backend);
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let completed = Arc::new(AtomicU64::new(0));

    let mut must_finish = JoinSet::new();
    let mut cancellable = JoinSet::new();
    let mut aborters = JoinSet::new();
    for i in 0..TASKS {
        let locker = lockers[(i % 3) as usize].clone();
        let (key, inside, completed) = (key.clone(), inside.clone(), completed.clone());
        let mut rng = StdRng::seed_from_u64(i + 1);
        let start_in = Duration::from_micros(rng.random_range(0..20_000));
        let hold = Duration::from_micros(rng.random_range(0..2_000));
        let body = async move {
            tokio::time::sleep(start_in).await;
            let guard = locker.lock(&key).await.expect("lock within 60 s");
            let _inside = Exclusive::enter(&inside);
            tokio::task::yield_now().await;
            tokio::time::sleep(hold).await;
            drop(_inside);
            guard.release().await.expect("release");
            completed.fetch_add(1, Ordering::SeqCst);
        };
        let cancel_after = Duration::from_micros(rng.random_range(0..60_000));
        match i % 4 {
            0 | 2 => {
                must_finish.spawn(body);
            }
            1 => {
                cancellable.spawn(async move {
                    let _ = tokio::time::timeout(cancel_after, body).await;
                });
            }
            _ => {
                let handle = cancellable.spawn(body);
                aborters.spawn(async move {
                    tokio::time::sleep(cancel_after).await;
                    handle.abort();
                });
            }
        }
    }
    join_all(must_finish).await;
    join_all(aborters).await;
    while let Some(joined) = cancellable.join_next().await {
        if let Err(e) = joined
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let completed = completed.load(Ordering::SeqCst);
    assert!(completed >= TASKS / 2, "only {completed} completed");
    println!("cancel safety: {completed} of {TASKS} tasks completed");

    wait_idle(&lockers, IDLE).await;
    let mut con = server.connection().await;
    let lock_name = testkit::names::lock(&prefix, &key);
    assert!(
        wait_until(Duration::from_secs(5), || {
            let (mut con, lock_name) = (con.clone(), &lock_name);
            async move { !exists(&mut con, lock_name).await }
        })
        .await,
        "a lock key is left behind (PTTL {})",
        pttl(&mut con, &lock_name).await
    );
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut con)
        .await
        .unwrap();
    for name in keys.iter().filter(|name| !testkit::is_life(name)) {
        // -2: it expired since KEYS; -1 would be a key that never expires (but
        // the server's life, which lockflight keeps for good).
        let left = pttl(&mut con, name).await;
        assert_ne!(
            left,
            -1,
            "{} has no TTL: it would never go away",
            String::from_utf8_lossy(name)
        );
    }
    let claim = {
        let mut name = lock_name.clone();
        name.extend_from_slice(b":claim");
        name
    };
    // A lease cached after the last section goes back when its linger ends.
    wait_idle(&lockers, IDLE).await;
    for locker in &lockers {
        // A release gives the head of the Redis queue a short claim window (at most
        // claim_ttl); let any such hand-over settle, then the lock is free at once.
        assert!(
            wait_until(Duration::from_secs(2), || {
                let (mut con, claim) = (con.clone(), &claim);
                async move { !exists(&mut con, claim).await }
            })
            .await,
            "a claim on the lock outlived claim_ttl"
        );
        let guard = locker
            .try_lock(&key)
            .await
            .unwrap()
            .expect("the lock is free at once after all tasks ended");
        guard.release().await.unwrap();
        // The key is warm here: that release may be cached; the next locker's
        // try must find it free.
        locker.shutdown().await;
        let stats = locker.stats();
        assert_eq!(stats.leases_lost, 0, "{stats:?}");
    }
    wait_idle(&lockers, IDLE).await;
}
