//! Fencing tokens across data loss.

use super::*;

/// Critical sections of `lockers` (4 tasks each, `per_task` sections per task) on
/// `key`, each recording its fencing token under the lock.
async fn fenced_phase(
    lockers: &[Locker],
    key: &LockKey,
    tokens: &Arc<Mutex<Vec<FencingToken>>>,
    inside: &Arc<AtomicUsize>,
    per_task: usize,
) {
    let mut tasks = JoinSet::new();
    for locker in lockers {
        for _ in 0..4 {
            let (locker, key, tokens, inside) =
                (locker.clone(), key.clone(), tokens.clone(), inside.clone());
            tasks.spawn(async move {
                for _ in 0..per_task {
                    let guard = locker.lock(&key).await.expect("lock");
                    {
                        let _inside = Exclusive::enter(&inside);
                        tokens.lock().unwrap().push(guard.fencing_token());
                        tokio::task::yield_now().await;
                    }
                    guard.release().await.expect("release");
                }
            });
        }
    }
    join_all(tasks).await;
}

/// Fencing tokens strictly increase in acquisition order, also across a
/// `FLUSHALL` (the fence key is gone) and across a restart of a Redis without
/// persistence (everything is gone, the connections drop and reconnect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_flushall_and_restart() {
    let server = RedisServer::start();
    let prefix = unique_prefix("fence");
    let key = LockKey::from("fenced");
    let a = backend_at(&server.url(), &prefix).await;
    let b = backend_at(&server.url(), &prefix).await;
    // Short leases: a restart (and a FLUSHALL) quarantines grants for the
    // longest lease TTL the instances asked for.
    let lockers = vec![
        Locker::builder(a.clone())
            .lease_ttl(Duration::from_secs(2))
            .wait_timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
        Locker::builder(b.clone())
            .lease_ttl(Duration::from_secs(2))
            .wait_timeout(Duration::from_secs(30))
            .handoff(Handoff::enabled())
            .build()
            .unwrap(),
    ];
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let inside = Arc::new(AtomicUsize::new(0));
    let per_task = 10;

    fenced_phase(&lockers, &key, &tokens, &inside, per_task).await;
    let before_flush = *tokens.lock().unwrap().last().unwrap();
    // Nothing held, cached leases included, when the data goes: a lease held
    // across a FLUSHALL or a restart is lost data, not what this test is about.
    wait_idle(&lockers, IDLE).await;

    server.flushall().await;
    fenced_phase(&lockers, &key, &tokens, &inside, per_task).await;
    let before_restart = *tokens.lock().unwrap().last().unwrap();
    wait_idle(&lockers, IDLE).await;

    server.restart();
    // lock() retries the transient errors of the dropped connections.
    fenced_phase(&lockers, &key, &tokens, &inside, per_task).await;

    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 3 * lockers.len() * 4 * per_task);
    assert_strictly_increasing(&tokens, "tokens");
    assert!(
        tokens.iter().any(|t| t.seq > 0),
        "no handoff happened, so handoff sequences were not covered"
    );
    println!(
        "fencing: last before FLUSHALL {before_flush}, last before restart {before_restart}, last {}",
        tokens.last().unwrap()
    );

    // The notification subscriptions came back after the restart too (the
    // restarted server started with none).
    let mut con = server.connection().await;
    for backend in [&a, &b] {
        let channel = testkit::names::channel(&prefix, backend.instance_id());
        assert!(
            testkit::channel_subscribed(&con, &channel, 1, Duration::from_secs(10)).await,
            "the subscription to {channel} was not re-established after the restart"
        );
    }
    wait_idle(&lockers, IDLE).await;
    assert!(!exists(&mut con, &testkit::names::lock(&prefix, &key)).await);
}
