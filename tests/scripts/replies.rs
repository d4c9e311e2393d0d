//! Every reply of every script, through `RedisBackend`'s decoding.

use super::*;

/// acquire: acquired / already ours (TTL re-armed, a new and greater epoch) / busy
/// and queued / busy and not queued (try) / another type at the lock key (-1) / a
/// string without a TTL (-2).
#[tokio::test]
async fn acquire_replies() {
    let (server, _log, prefix) = shared_scene("acquire-replies");
    let a = connect(&server.url(), &prefix).await;
    let b = connect(&server.url(), &prefix).await;
    let mut con = server.connection().await;
    let key = LockKey::from("k");
    let lock = a.lock_name(&key);
    let (t1, t2) = (LeaseToken::random(), LeaseToken::random());

    // Acquired.
    let e1 = epoch_of(a.acquire(&key, t1, TTL, true).await.unwrap());
    assert!(e1 > 0);
    assert_eq!(get_string(&mut con, &lock).await, Some(t1.to_hex()));
    assert!((1..=30_000).contains(&pttl(&mut con, &lock).await));

    // Already ours: the TTL is re-armed and a fresh, greater epoch is minted.
    query::<()>(&mut con, redis::cmd("PEXPIRE").arg(&lock).arg(5_000)).await;
    let e2 = epoch_of(a.acquire(&key, t1, TTL, true).await.unwrap());
    assert!(
        e2 > e1,
        "already ours must mint a new epoch: {e2} after {e1}"
    );
    assert!(pttl(&mut con, &lock).await > 10_000, "TTL not re-armed");

    // Busy, queued.
    match b.acquire(&key, t2, TTL, true).await.unwrap() {
        Acquire::Busy { retry_in } => assert!(retry_in <= Duration::from_secs(1), "{retry_in:?}"),
        other => panic!("expected Busy, got {other:?}"),
    }
    let queue = name(&a, &key, ":wq");
    assert!(queued(&mut con, &queue, b.instance_id()).await);
    assert_eq!(
        a.extend(&key, t1, TTL).await.unwrap(),
        Extend::Extended { waiting: 1 }
    );

    // Busy, not queued (try_lock).
    let c = connect(&server.url(), &prefix).await;
    assert!(matches!(
        c.acquire(&key, LeaseToken::random(), TTL, false)
            .await
            .unwrap(),
        Acquire::Busy { .. }
    ));
    assert!(!queued(&mut con, &queue, c.instance_id()).await);

    // Another type at the lock key (-1): reported, left alone.
    let key = LockKey::from("hash");
    let lock = a.lock_name(&key);
    hset(&mut con, &lock, "f", "v").await;
    assert_foreign("acquire on a hash", a.acquire(&key, t1, TTL, true).await);
    assert!(hexists(&mut con, &lock, "f").await);

    // A string without a TTL (-2): reported, left alone.
    let key = LockKey::from("no-ttl");
    let lock = a.lock_name(&key);
    query::<()>(&mut con, redis::cmd("SET").arg(&lock).arg("x")).await;
    assert_foreign(
        "acquire on a string without TTL",
        a.acquire(&key, t1, TTL, true).await,
    );
    assert_eq!(get_string(&mut con, &lock).await.as_deref(), Some("x"));
    assert_eq!(pttl(&mut con, &lock).await, -1);
}

/// release: released / not ours / already released by an earlier attempt with the
/// same token (the lease's release record, which carries a TTL), even after another
/// instance took and released the key meanwhile (the record is per lease, not per
/// key).
#[tokio::test]
async fn release_replies_and_records() {
    let (server, _log, prefix) = shared_scene("release-replies");
    let a = RedisBackend::builder(server.url())
        .prefix(&prefix)
        .response_timeout(Duration::from_millis(1_500))
        .connect()
        .await
        .unwrap();
    let mut con = server.connection().await;
    let key = LockKey::from("k");
    let lock = a.lock_name(&key);
    let (t1, t2, t3) = (
        LeaseToken::random(),
        LeaseToken::random(),
        LeaseToken::random(),
    );
    let record = name(&a, &key, &format!(":rel:{}", t1.to_hex()));

    epoch_of(a.acquire(&key, t1, TTL, true).await.unwrap());
    // Not ours: nothing deleted.
    assert_eq!(
        a.release(&key, t2).await.unwrap(),
        Released {
            released: false,
            waiting: 0
        }
    );
    assert!(exists(&mut con, &lock).await);
    // Released.
    assert!(a.release(&key, t1).await.unwrap().released);
    assert!(!exists(&mut con, &lock).await);
    // The record: the 5 s release window + the longest request (2 × 1.5 s response
    // timeout + 2 s connection timeout) + a 1 s margin = 11 s.
    assert_eq!(get_string(&mut con, &record).await, Some(t1.to_hex()));
    let ttl = pttl(&mut con, &record).await;
    assert!((10_000..=11_000).contains(&ttl), "record PTTL {ttl}");
    // A retry of the same release (its reply was lost): released.
    assert!(a.release(&key, t1).await.unwrap().released);
    // Another token: not released.
    assert!(!a.release(&key, t2).await.unwrap().released);
    // Another lease takes and releases the key; t1's retry still finds its own record.
    epoch_of(a.acquire(&key, t3, TTL, true).await.unwrap());
    assert!(a.release(&key, t3).await.unwrap().released);
    assert!(a.release(&key, t1).await.unwrap().released);

    // A foreign value at the record of a lease that is not held: refused, nothing
    // deleted.
    let t4 = LeaseToken::random();
    let foreign = name(&a, &key, &format!(":rel:{}", t4.to_hex()));
    hset(&mut con, &foreign, "f", "v").await;
    set_for_30s(&mut con, &lock, &t2.to_hex()).await;
    assert_foreign(
        "release reading a foreign record",
        a.release(&key, t4).await,
    );
    assert_eq!(get_string(&mut con, &lock).await, Some(t2.to_hex()));
    del(&mut con, &lock).await;

    // The token reused by a new leader: acquiring with it clears its record, so a
    // lease lost afterwards is not reported as released.
    epoch_of(a.acquire(&key, t1, TTL, true).await.unwrap());
    assert!(!exists(&mut con, &record).await);
    set_for_30s(&mut con, &lock, &t2.to_hex()).await;
    assert!(!a.release(&key, t1).await.unwrap().released);
    assert_eq!(get_string(&mut con, &lock).await, Some(t2.to_hex()));
}

/// extend: extended (TTL re-armed, waiting count) / not the owner (nothing changed).
#[tokio::test]
async fn extend_replies() {
    let (_log, a, mut con) = one_instance("extend-replies").await;
    let key = LockKey::from("k");
    let lock = a.lock_name(&key);
    let t1 = LeaseToken::random();

    epoch_of(
        a.acquire(&key, t1, Duration::from_secs(5), true)
            .await
            .unwrap(),
    );
    enqueue(&mut con, &name(&a, &key, ":wq"), "other", 1, LIVE_ENTRY).await;
    assert_eq!(
        a.extend(&key, t1, TTL).await.unwrap(),
        Extend::Extended { waiting: 1 }
    );
    assert!(pttl(&mut con, &lock).await > 10_000);
    assert_eq!(
        a.extend(&key, LeaseToken::random(), Duration::from_secs(60))
            .await
            .unwrap(),
        Extend::NotOwner
    );
    assert!(pttl(&mut con, &lock).await <= 30_000);
}

/// leave: the normal path removes the entry and passes a claim on; the
/// only-if-claimed path changes nothing when the claim is not this instance's.
#[tokio::test]
async fn leave_replies() {
    let (_log, a, mut con) = one_instance("leave-replies").await;
    let key = LockKey::from("k");
    let (queue, claim) = (name(&a, &key, ":wq"), name(&a, &key, ":claim"));

    // Normal: a queued instance holding the claim leaves; the claim passes on.
    enqueue(&mut con, &queue, a.instance_id(), 0, LIVE_ENTRY).await;
    enqueue(&mut con, &queue, "next", 1, LIVE_ENTRY).await;
    set_for_30s(&mut con, &claim, a.instance_id()).await;
    a.leave(&key).await.expect("leave");
    assert!(!queued(&mut con, &queue, a.instance_id()).await);
    assert_eq!(get_string(&mut con, &claim).await.as_deref(), Some("next"));

    // Only if claimed, and the claim is someone else's: nothing changes.
    enqueue(&mut con, &queue, a.instance_id(), 0, LIVE_ENTRY).await;
    assert!(!a.leave_if_claimed(&key).await.expect("leave_if_claimed"));
    assert!(queued(&mut con, &queue, a.instance_id()).await);
    assert_eq!(get_string(&mut con, &claim).await.as_deref(), Some("next"));

    // Only if claimed, and the claim is ours: left.
    set_for_30s(&mut con, &claim, a.instance_id()).await;
    assert!(a.leave_if_claimed(&key).await.expect("leave_if_claimed"));
    assert!(!queued(&mut con, &queue, a.instance_id()).await);
    assert_eq!(get_string(&mut con, &claim).await.as_deref(), Some("next"));
}
