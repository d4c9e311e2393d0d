//! Releases that are not ours.

use super::*;

/// Release with a foreign token deletes nothing and says so, both through the
/// `LockBackend` trait and through a guard whose key was taken over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_with_foreign_token_deletes_nothing() {
    let (server, _log, prefix) = shared_scene("foreign-token");
    let key = LockKey::from("k");
    let backend = backend_at(&server.url(), &prefix).await;
    // No caching: every release here is answered by the backend (a cached
    // lease's release is verified when the lease goes back; see `LockerBuilder::cache_leases_for`).
    let locker = Locker::builder(backend.clone())
        .cache_leases_for(Duration::ZERO)
        .build()
        .unwrap();
    let name = testkit::names::lock(&prefix, &key);
    let mut con = server.connection().await;

    // Directly through the trait.
    let guard = locker.lock(&key).await.unwrap();
    let stranger = LeaseToken::random();
    let released = backend.release(&key, stranger).await.unwrap();
    assert!(!released.released, "a foreign token released the lock");
    assert!(exists(&mut con, &name).await, "the lock key was deleted");
    assert_eq!(
        backend
            .renew(&key, stranger, Duration::from_secs(1))
            .await
            .unwrap(),
        Renewal::NotOwner
    );
    // The stranger's release retired its token: never granted from now on.
    assert!(matches!(
        backend
            .acquire(&key, stranger, Duration::from_secs(1), WhenBusy::Return)
            .await,
        Err(lockflight::Error::LeaseLost { .. })
    ));
    assert!(matches!(
        backend
            .acquire(
                &key,
                LeaseToken::random(),
                Duration::from_secs(1),
                WhenBusy::Return
            )
            .await
            .unwrap(),
        Acquire::Busy { .. }
    ));
    assert!(pttl(&mut con, &name).await > 1000, "the TTL was touched");
    guard.release().await.expect("still ours");
    assert!(!exists(&mut con, &name).await);

    // Through a guard whose lock was overwritten behind its back.
    let guard = locker.lock(&key).await.unwrap();
    set_for_30s(&mut con, &name, "foreign").await;
    match guard.release().await {
        Err(Error::LeaseLost { key: k, phase, .. }) => {
            assert_eq!(k, key);
            assert_eq!(phase, Phase::Releasing);
        }
        other => panic!("release of an overwritten lock: {other:?}"),
    }
    let value = get_string(&mut con, &name).await;
    assert_eq!(value.as_deref(), Some("foreign"));
    del(&mut con, &name).await;
    wait_idle(&[locker], IDLE).await;
}
