//! Cost.

use super::*;

/// An uncontended lock + release costs exactly two Redis commands (two EVALSHA
/// round trips), and so does an uncontended try_lock + release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_lock_and_release_cost_two_round_trips() {
    let server = shared();
    let _log = server.log_on_panic();
    let proxy = CountingProxy::start(server).await;
    let prefix = unique_prefix("round-trips");
    let key = LockKey::from("k");
    let backend = backend_at(&proxy.url(), &prefix).await;
    let locker = Locker::builder(backend).build().unwrap();

    // Loads the scripts (NOSCRIPT, SCRIPT LOAD) once.
    locker.lock(&key).await.unwrap().release().await.unwrap();
    proxy.reset();
    const ROUNDS: u64 = 10;
    for round in 0..ROUNDS {
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
}
