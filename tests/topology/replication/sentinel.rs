//! Acknowledged writes in sentinel mode follow a failover: their connections are
//! made for one primary, and the first acknowledged write after `SENTINEL
//! FAILOVER` runs (and is acknowledged) on the new primary. A Sentinel topology of
//! its own (primary, two replicas, three sentinels), started by this test only.

use super::*;
use testkit::sentinel::{MASTER, Sentinels};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_follow_a_failover() {
    let _serial = SERIAL.lock().await;
    let t = Sentinels::start().await;
    t.wait_settled(Duration::from_secs(60)).await;
    let prefix = unique_prefix("ack-sentinel");
    let backend = RedisBackend::sentinel(t.sentinel_urls(), MASTER)
        .prefix(&prefix)
        .replica_ack(1, Duration::from_secs(1))
        .connect()
        .await
        .expect("connect through the sentinels");
    let locker = Locker::builder(backend.clone())
        .wait_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    // Acknowledged on the first primary (a pooled connection to it stays idle).
    let g = locker
        .lock("before")
        .await
        .expect("granted on the first primary");
    g.release().await.unwrap();

    let old = t.primary_addr().await;
    t.failover().await;
    let new = t.wait_primary_change(&old, Duration::from_secs(30)).await;
    t.wait_settled(Duration::from_secs(60)).await;
    assert!(
        wait_until(Duration::from_secs(20), || {
            let on_new = backend.server() == new;
            async move { on_new }
        })
        .await,
        "the backend did not follow the new primary {new}: {}",
        backend.server()
    );

    // Acknowledged on the new primary: granted, and written there.
    let g = within(
        Duration::from_secs(10),
        "an acknowledged acquire after the failover",
        locker.lock("after"),
    )
    .await
    .expect("granted on the new primary");
    let name = String::from_utf8(testkit::names::lock(&prefix, &LockKey::from("after"))).unwrap();
    assert!(
        t.by_addr(&new)
            .cmd::<bool>(&["EXISTS", &name])
            .await
            .expect("EXISTS on the new primary"),
        "the lock is not on the new primary {new}"
    );
    g.release().await.unwrap();
}
