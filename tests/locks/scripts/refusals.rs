//! A refused wake-up `PUBLISH` still reports the release; the server's refusals
//! (`OOM`, `READONLY`) are classified.

use super::*;

/// An ACL user that may publish only on its own channel releases a lock another
/// instance waits for: the release is reported as done, and the claim that was set
/// for the instance that could not be told is taken back. Same for leave.
#[tokio::test]
async fn a_refused_wake_up_publish_still_reports_the_release() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let prefix = "lfpub";
    query::<()>(
        &mut admin,
        redis::cmd("ACL").arg(&["SETUSER", "u", "on", ">pw", "~*", "&*", "+@all"]),
    )
    .await;
    let url = format!("redis://u:pw@127.0.0.1:{}/", server.port());
    let u = connect(&url, prefix).await;
    // From now on `u` may publish on its own channel only.
    query::<()>(
        &mut admin,
        redis::cmd("ACL")
            .arg(&["SETUSER", "u", "resetchannels"])
            .arg(format!(
                "&{}",
                testkit::names::channel(prefix, u.instance_id())
            )),
    )
    .await;
    let key = LockKey::from("k");
    let (lock, queue, claim) = (
        testkit::names::lock(prefix, &key),
        name(prefix, &key, ":wq"),
        name(prefix, &key, ":claim"),
    );

    // Release.
    let token = LeaseToken::random();
    epoch_of(u.acquire(&key, token, TTL, WhenBusy::Queue).await.unwrap());
    enqueue(&mut admin, &queue, "waiter", 1, LIVE_ENTRY).await;
    assert_eq!(
        u.release(&key, token).await.expect("release"),
        Released {
            released: true,
            waiting: 1
        }
    );
    assert!(!exists(&mut admin, &lock).await);
    assert!(
        !exists(&mut admin, &claim).await,
        "the claim of an instance that was never told is left"
    );

    // Leave, holding the claim: it would pass to "waiter", who cannot be told.
    enqueue(&mut admin, &queue, u.instance_id(), 0, LIVE_ENTRY).await;
    set_for_30s(&mut admin, &claim, u.instance_id()).await;
    u.leave(&key).await.expect("leave");
    assert!(!queued(&mut admin, &queue, u.instance_id()).await);
    assert!(!exists(&mut admin, &claim).await);

    // The default user may publish anywhere: the claim is given.
    let d = connect(&server.url(), prefix).await;
    let token = LeaseToken::random();
    epoch_of(d.acquire(&key, token, TTL, WhenBusy::Queue).await.unwrap());
    assert!(d.release(&key, token).await.unwrap().released);
    assert_eq!(
        get_string(&mut admin, &claim).await.as_deref(),
        Some("waiter")
    );
}

/// Out of memory under `noeviction`: acquire answers `Refused { code: "OOM" }` at
/// once, and leaves nothing behind.
#[tokio::test]
async fn out_of_memory_is_refused_at_once() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    // Through a proxy that counts the requests: refused at once, not retried.
    let proxy = testkit::CountingProxy::start(&server).await;
    let a = connect(&proxy.url(), "lfoom").await;
    query::<()>(
        &mut admin,
        redis::cmd("CONFIG").arg(&["SET", "maxmemory-policy", "noeviction"]),
    )
    .await;
    query::<()>(
        &mut admin,
        redis::cmd("CONFIG").arg(&["SET", "maxmemory", "1"]),
    )
    .await;
    let key = LockKey::from("k");
    proxy.reset();
    match a
        .acquire(&key, LeaseToken::random(), TTL, WhenBusy::Queue)
        .await
    {
        Err(Error::Refused { code, .. }) => assert_eq!(code, "OOM"),
        other => panic!("expected Refused(OOM), got {other:?}"),
    }
    assert_eq!(
        proxy.commands(),
        1,
        "one EVALSHA, answered with OOM, not repeated"
    );
    assert!(!exists(&mut admin, &testkit::names::lock("lfoom", &key)).await);
}

/// A read-only replica: acquire and renew answer `Refused { code: "READONLY" }`.
#[tokio::test]
async fn a_read_only_replica_is_refused() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    // No 5 s wait before the full sync.
    query::<()>(
        &mut primary.connection().await,
        redis::cmd("CONFIG").arg(&["SET", "repl-diskless-sync-delay", "0"]),
    )
    .await;
    let mut admin = replica.connection().await;
    query::<()>(
        &mut admin,
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg(primary.port()),
    )
    .await;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let mut admin = admin.clone();
            async move {
                let info: String = query(&mut admin, redis::cmd("INFO").arg("replication")).await;
                info.contains("master_link_status:up")
            }
        })
        .await,
        "the replica never synced"
    );
    let p = connect(&primary.url(), "lfro").await;
    let r = connect(&replica.url(), "lfro").await;
    let key = LockKey::from("k");
    let token = LeaseToken::random();

    match r
        .acquire(&key, LeaseToken::random(), TTL, WhenBusy::Queue)
        .await
    {
        Err(Error::Refused { code, .. }) => assert_eq!(code, "READONLY"),
        other => panic!("acquire: expected Refused(READONLY), got {other:?}"),
    }

    // A lease taken on the primary and replicated: renewing it on the replica.
    epoch_of(p.acquire(&key, token, TTL, WhenBusy::Queue).await.unwrap());
    assert!(
        wait_until(Duration::from_secs(10), || {
            let mut admin = admin.clone();
            let lock = testkit::names::lock("lfro", &key);
            async move { exists(&mut admin, &lock).await }
        })
        .await,
        "the lock never reached the replica"
    );
    match r.renew(&key, token, TTL).await {
        Err(Error::Refused { code, .. }) => assert_eq!(code, "READONLY"),
        other => panic!("renew: expected Refused(READONLY), got {other:?}"),
    }
}
