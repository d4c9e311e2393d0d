//! The notifier follows the runtime.

use super::*;

/// A backend connected on a runtime that has ended restarts its notification
/// subscription on the runtime that uses it: a waiter there is woken by a release
/// well before its fallback timer (10 s here).
#[test]
fn the_notifier_restarts_on_a_new_runtime() {
    let (server, _log, prefix) = shared_scene("respawn");
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    };
    let first = runtime();
    let waiter = first
        .block_on(
            RedisBackend::builder(server.url())
                .prefix(&prefix)
                .queue_entry_ttl(Duration::from_secs(30))
                .connect(),
        )
        .unwrap();
    drop(first);

    runtime().block_on(async {
        let holder = connect(&server.url(), &prefix).await;
        let key = LockKey::from("k");
        let token = LeaseToken::random();
        epoch_of(
            holder
                .acquire(&key, token, TTL, WhenBusy::Queue)
                .await
                .unwrap(),
        );
        let locker = Locker::builder(waiter.clone())
            .wait_timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let task = tokio::spawn(async move { locker.lock("k").await.map(drop) });
        let con = server.connection().await;
        let queue = name(&prefix, &key, ":wq");
        let id = waiter.instance_id().to_owned();
        assert!(
            wait_until(Duration::from_secs(10), || {
                let (mut con, queue, id) = (con.clone(), queue.clone(), id.clone());
                async move { queued(&mut con, &queue, &id).await }
            })
            .await,
            "the waiter never queued"
        );
        let released = Instant::now();
        assert!(holder.release(&key, token).await.unwrap().released);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("the waiter is woken well before its fallback timer")
            .unwrap()
            .expect("the waiter's lock");
        println!("woken {:?} after the release", released.elapsed());
    });
}
