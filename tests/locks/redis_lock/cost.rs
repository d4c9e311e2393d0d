//! Cost.

use super::*;

/// An uncontended lock + release of a key costs exactly two Redis commands (two
/// EVALSHA round trips), and so does an uncontended try_lock + release; a key
/// locked again and again costs two per lease (lease caching).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_lock_and_release_cost_two_round_trips() {
    let server = shared();
    let _log = server.log_on_panic();
    let proxy = CountingProxy::start(server).await;
    let prefix = unique_prefix("round-trips");
    let key = LockKey::from("k");
    let backend = backend_at(&proxy.url(), &prefix).await;
    // A linger long enough that the warm part below cannot miss it on a busy
    // machine (a lease is cached only if asked for within the linger of the
    // key's last release).
    let locker = Locker::builder(backend)
        .cache_leases_for(Duration::from_secs(10))
        .build()
        .unwrap();

    // Loads the scripts (NOSCRIPT, SCRIPT LOAD) once.
    locker.lock(&key).await.unwrap().release().await.unwrap();
    proxy.reset();
    const ROUNDS: u64 = 10;
    // A cold key each round (lease caching keeps only a warm key's lease).
    for round in 0..ROUNDS {
        let key = LockKey::from(format!("cold-{round}"));
        let before = proxy.commands();
        let guard = locker.lock(&key).await.unwrap();
        let after_lock = proxy.commands();
        guard.release().await.unwrap();
        let after_release = proxy.commands();
        assert_eq!(
            (after_lock - before, after_release - after_lock),
            (1, 1),
            "round {round}: lock and release should be one command each"
        );
    }
    for round in 0..ROUNDS {
        let key = LockKey::from(format!("try-{round}"));
        let before = proxy.commands();
        let guard = locker.try_lock(&key).await.unwrap().expect("free");
        guard.release().await.unwrap();
        assert_eq!(proxy.commands() - before, 2, "try_lock round {round}");
    }
    println!(
        "uncontended: {} commands for {ROUNDS} lock+release and {ROUNDS} try_lock+release",
        proxy.commands()
    );
    assert_eq!(proxy.commands(), 4 * ROUNDS);

    // A warm key (its lease released at the backend a moment ago): the defaults
    // cache the lease, so ROUNDS lock + release in a row take one lease, one
    // acquire and one release (here at shutdown).
    let key = LockKey::from("warm");
    locker.lock(&key).await.unwrap().release().await.unwrap();
    proxy.reset();
    for _ in 0..ROUNDS {
        locker.lock(&key).await.unwrap().release().await.unwrap();
    }
    locker.shutdown().await;
    assert_eq!(proxy.commands(), 2, "{ROUNDS} lock + release on a warm key");
}
