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
    let lock = testkit::names::lock(&prefix, &key);
    let (t1, t2) = (LeaseToken::random(), LeaseToken::random());

    // Acquired.
    let e1 = epoch_of(a.acquire(&key, t1, TTL, WhenBusy::Queue).await.unwrap());
    assert!(e1 > 0);
    assert_eq!(get_string(&mut con, &lock).await, Some(t1.to_hex()));
    assert!((1..=30_000).contains(&pttl(&mut con, &lock).await));

    // Already ours: the TTL is re-armed and a fresh, greater epoch is minted.
    query::<()>(&mut con, redis::cmd("PEXPIRE").arg(&lock).arg(5_000)).await;
    let e2 = epoch_of(a.acquire(&key, t1, TTL, WhenBusy::Queue).await.unwrap());
    assert!(
        e2 > e1,
        "already ours must mint a new epoch: {e2} after {e1}"
    );
    assert!(pttl(&mut con, &lock).await > 10_000, "TTL not re-armed");

    // Busy, queued.
    match b.acquire(&key, t2, TTL, WhenBusy::Queue).await.unwrap() {
        Acquire::Busy { retry_in } => assert!(retry_in <= Duration::from_secs(1), "{retry_in:?}"),
        other => panic!("expected Busy, got {other:?}"),
    }
    let queue = name(&prefix, &key, ":wq");
    assert!(queued(&mut con, &queue, b.instance_id()).await);
    assert_eq!(
        a.renew(&key, t1, TTL).await.unwrap(),
        Renewal::Renewed { waiting: 1 }
    );

    // Busy, not queued (try_lock).
    let c = connect(&server.url(), &prefix).await;
    assert!(matches!(
        c.acquire(&key, LeaseToken::random(), TTL, WhenBusy::Return)
            .await
            .unwrap(),
        Acquire::Busy { .. }
    ));
    assert!(!queued(&mut con, &queue, c.instance_id()).await);

    // Another type at the lock key (-1): reported, left alone.
    let key = LockKey::from("hash");
    let lock = testkit::names::lock(&prefix, &key);
    hset(&mut con, &lock, "f", "v").await;
    assert_foreign(
        "acquire on a hash",
        a.acquire(&key, t1, TTL, WhenBusy::Queue).await,
    );
    assert!(hexists(&mut con, &lock, "f").await);

    // A string without a TTL (-2): reported, left alone.
    let key = LockKey::from("no-ttl");
    let lock = testkit::names::lock(&prefix, &key);
    query::<()>(&mut con, redis::cmd("SET").arg(&lock).arg("x")).await;
    assert_foreign(
        "acquire on a string without TTL",
        a.acquire(&key, t1, TTL, WhenBusy::Queue).await,
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
    let lock = testkit::names::lock(&prefix, &key);
    let (t1, t2, t3) = (
        LeaseToken::random(),
        LeaseToken::random(),
        LeaseToken::random(),
    );
    let record = name(&prefix, &key, &format!(":rel:{}", t1.to_hex()));

    epoch_of(a.acquire(&key, t1, TTL, WhenBusy::Queue).await.unwrap());
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
    epoch_of(a.acquire(&key, t3, TTL, WhenBusy::Queue).await.unwrap());
    assert!(a.release(&key, t3).await.unwrap().released);
    assert!(a.release(&key, t1).await.unwrap().released);

    // A foreign value at the record of a lease that is not held: refused, nothing
    // deleted.
    let t4 = LeaseToken::random();
    let foreign = name(&prefix, &key, &format!(":rel:{}", t4.to_hex()));
    hset(&mut con, &foreign, "f", "v").await;
    set_for_30s(&mut con, &lock, &t2.to_hex()).await;
    assert_foreign(
        "release reading a foreign record",
        a.release(&key, t4).await,
    );
    assert_eq!(get_string(&mut con, &lock).await, Some(t2.to_hex()));
    del(&mut con, &lock).await;

    // A late copy of an acquire with a released token (-3): refused with nothing
    // written, even on a free lock; the record keeps speaking for the release.
    let refused = a.acquire(&key, t1, TTL, WhenBusy::Queue).await;
    assert!(
        matches!(refused, Err(Error::LeaseLost { .. })),
        "an acquire with a released token: {refused:?}"
    );
    assert!(!exists(&mut con, &lock).await);
    assert!(exists(&mut con, &record).await);
    assert!(a.release(&key, t1).await.unwrap().released);

    // A release that found nothing to delete retires its token all the same (it
    // may have overtaken the acquire it undoes): not "released", and a later
    // acquire with that token is refused.
    let t5 = LeaseToken::random();
    assert!(!a.release(&key, t5).await.unwrap().released);
    assert!(!a.release(&key, t5).await.unwrap().released);
    let refused = a.acquire(&key, t5, TTL, WhenBusy::Queue).await;
    assert!(
        matches!(refused, Err(Error::LeaseLost { .. })),
        "an acquire overtaken by its release: {refused:?}"
    );
    assert!(!exists(&mut con, &lock).await);
}

/// renew: renewed (TTL re-armed, waiting count) / not the owner (nothing changed).
#[tokio::test]
async fn renew_replies() {
    let (_log, a, mut con, prefix) = one_instance("renew-replies").await;
    let key = LockKey::from("k");
    let lock = testkit::names::lock(&prefix, &key);
    let t1 = LeaseToken::random();

    epoch_of(
        a.acquire(&key, t1, Duration::from_secs(5), WhenBusy::Queue)
            .await
            .unwrap(),
    );
    enqueue(
        &mut con,
        &name(&prefix, &key, ":wq"),
        "other",
        1,
        LIVE_ENTRY,
    )
    .await;
    assert_eq!(
        a.renew(&key, t1, TTL).await.unwrap(),
        Renewal::Renewed { waiting: 1 }
    );
    assert!(pttl(&mut con, &lock).await > 10_000);
    assert_eq!(
        a.renew(&key, LeaseToken::random(), Duration::from_secs(60))
            .await
            .unwrap(),
        Renewal::NotOwner
    );
    assert!(pttl(&mut con, &lock).await <= 30_000);
}

/// leave: the normal path removes the entry and passes a claim on. The
/// only-if-claimed path, which the notification task takes for a wake-up nobody at
/// the instance waits for, changes nothing when the claim is not the instance's, and
/// leaves, passing the claim on, when it is.
#[tokio::test]
async fn leave_replies() {
    // A server of its own: its EVALSHA count is this instance's.
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let prefix = testkit::unique_prefix("leave-replies");
    let a = connect(&server.url(), &prefix).await;
    let mut con = server.connection().await;
    let key = LockKey::from("k");
    let (queue, claim) = (name(&prefix, &key, ":wq"), name(&prefix, &key, ":claim"));

    // Normal: a queued instance holding the claim leaves; the claim passes on.
    enqueue(&mut con, &queue, a.instance_id(), 0, LIVE_ENTRY).await;
    enqueue(&mut con, &queue, "next", 1, LIVE_ENTRY).await;
    set_for_30s(&mut con, &claim, a.instance_id()).await;
    a.leave(&key).await.expect("leave");
    assert!(!queued(&mut con, &queue, a.instance_id()).await);
    assert_eq!(get_string(&mut con, &claim).await.as_deref(), Some("next"));

    // A mutex wake-up for `k` on A's channel, where nobody waits for it.
    let channel = testkit::names::channel(&prefix, a.instance_id());
    let wake = async |con: &mut MultiplexedConnection| {
        let receivers: i64 = query(con, redis::cmd("PUBLISH").arg(&channel).arg(b"\xFDk")).await;
        assert_eq!(receivers, 1, "A is subscribed");
    };

    // Only if claimed, and the claim is someone else's: the leave script runs and
    // changes nothing.
    enqueue(&mut con, &queue, a.instance_id(), 0, LIVE_ENTRY).await;
    let scripts = testkit::evalsha_count(&mut con).await;
    wake(&mut con).await;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let mut con = con.clone();
            async move { testkit::evalsha_count(&mut con).await > scripts }
        })
        .await,
        "the unwanted wake-up ran no script"
    );
    assert!(queued(&mut con, &queue, a.instance_id()).await);
    assert_eq!(get_string(&mut con, &claim).await.as_deref(), Some("next"));

    // Only if claimed, and the claim is ours: left, the claim passed on.
    set_for_30s(&mut con, &claim, a.instance_id()).await;
    wake(&mut con).await;
    assert!(
        wait_until(Duration::from_secs(10), || {
            let (mut con, queue, id) = (con.clone(), &queue, a.instance_id());
            async move { !queued(&mut con, queue, id).await }
        })
        .await,
        "A kept its entry with an unwanted claim"
    );
    assert_eq!(get_string(&mut con, &claim).await.as_deref(), Some("next"));
}

/// Every kind: a late copy of an acquire (delayed on the wire past its lease's
/// release, or past the release of an acquire its sender gave up) is refused with
/// nothing written, so it cannot hold a read lease, the write lease or a permit
/// for a token nobody holds until its TTL.
#[tokio::test]
async fn a_released_token_is_never_granted_again_by_any_kind() {
    let (server, _log, prefix) = shared_scene("released-tokens");
    let a = connect(&server.url(), &prefix).await;
    let (rw, sem) = (a.rw().unwrap(), a.semaphore().unwrap());
    let late = |what: &str, r: lockflight::Result<Acquire>| {
        assert!(
            matches!(r, Err(Error::LeaseLost { .. })),
            "{what}: a late copy of an acquire was answered {r:?}"
        );
    };
    for (i, released_first) in [true, false].into_iter().enumerate() {
        let key = LockKey::from(format!("rw{i}"));
        let (t1, t2) = (LeaseToken::random(), LeaseToken::random());
        if released_first {
            // Granted, used and released; the late copy comes after.
            let Acquire::Acquired { .. } = rw
                .acquire_read(&key, t1, TTL, WhenBusy::Queue)
                .await
                .unwrap()
            else {
                panic!("a free read lock was refused")
            };
            assert!(rw.release_read(&key, t1).await.unwrap().released);
            epoch_of(
                rw.acquire_write(&key, t2, TTL, WhenBusy::Queue)
                    .await
                    .unwrap(),
            );
            assert!(rw.release_write(&key, t2).await.unwrap().released);
        } else {
            // The abandoned acquire's release overtook the acquire itself.
            assert!(!rw.release_read(&key, t1).await.unwrap().released);
            assert!(!rw.release_write(&key, t2).await.unwrap().released);
        }
        late(
            "read",
            rw.acquire_read(&key, t1, TTL, WhenBusy::Queue).await,
        );
        late(
            "write",
            rw.acquire_write(&key, t2, TTL, WhenBusy::Queue).await,
        );
        // The key is free for everyone else at once.
        let t3 = LeaseToken::random();
        epoch_of(
            rw.acquire_write(&key, t3, TTL, WhenBusy::Return)
                .await
                .unwrap(),
        );
        assert!(rw.release_write(&key, t3).await.unwrap().released);

        let key = LockKey::from(format!("sem{i}"));
        let tokens = [LeaseToken::random(), LeaseToken::random()];
        if released_first {
            let got = sem
                .acquire_permits(&key, 2, &tokens, TTL, WhenBusy::Queue)
                .await;
            assert_eq!(got.unwrap().granted, 2);
            assert!(sem.release_permit(&key, tokens[0]).await.unwrap());
        } else {
            assert!(!sem.release_permit(&key, tokens[0]).await.unwrap());
        }
        // A copy naming a released token is refused whole, even beside a token
        // that is still a live permit.
        let refused = sem
            .acquire_permits(&key, 2, &tokens, TTL, WhenBusy::Queue)
            .await;
        assert!(
            matches!(refused, Err(Error::LeaseLost { .. })),
            "permits: a late copy of an acquire was answered {refused:?}"
        );
        let fresh = [LeaseToken::random(), LeaseToken::random()];
        let expected = if released_first { 1 } else { 2 };
        let got = sem
            .acquire_permits(&key, 2, &fresh, TTL, WhenBusy::Return)
            .await;
        assert_eq!(got.unwrap().granted, expected, "permits free for others");
        for t in tokens.iter().chain(&fresh) {
            let _ = sem.release_permit(&key, *t).await.unwrap();
        }
    }
}
