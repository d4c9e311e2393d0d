//! The handoff budget while other instances wait: two turns per local task that
//! was waiting when the lease was taken.

use super::*;

/// A's tasks: one leads, the others wait locally when A's lease is taken.
const A_TASKS: u64 = 6;

/// Instance A takes a lease with five of its tasks waiting locally while instance C
/// waits at Redis: the lease serves A's leader and ten handoffs (two turns per
/// local waiter), then goes back to Redis and C gets the lock although A's tasks
/// still want it. With the earlier fixed budget (32 while others wait), C waited
/// for 33 of A's sections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_serves_two_turns_per_local_waiter_while_others_wait() {
    let (server, _log, prefix) = shared_scene("turns");
    let key = LockKey::from("k");
    let con = server.connection().await;
    let a_backend = backend_at(&server.url(), &prefix).await;
    let a = Locker::builder(a_backend.clone()).build().unwrap();
    let b = plain_locker(&server.url(), &prefix).await;
    let c_backend = backend_at(&server.url(), &prefix).await;
    let c = Locker::builder(c_backend.clone()).build().unwrap();

    let held = b.lock(&key).await.unwrap();
    let log = Arc::new(Mutex::new(Vec::<char>::new()));
    let mut tasks = JoinSet::new();
    for _ in 0..A_TASKS {
        let (a, key, log) = (a.clone(), key.clone(), Arc::clone(&log));
        tasks.spawn(async move {
            for _ in 0..10 {
                let guard = a.lock(&key).await.unwrap();
                log.lock().unwrap().push('A');
                tokio::task::yield_now().await;
                guard.release().await.unwrap();
            }
        });
    }
    // A's leader is queued at Redis and its other tasks wait locally...
    assert!(
        wait_queued(
            &con,
            &prefix,
            &a_backend,
            &key,
            true,
            Duration::from_secs(5)
        )
        .await,
        "A never queued"
    );
    assert!(
        wait_until(Duration::from_secs(5), || async {
            a.stats().local_waits == A_TASKS - 1
        })
        .await,
        "A's other tasks never waited locally"
    );
    // ...then C queues behind A.
    tasks.spawn({
        let (c, key, log) = (c.clone(), key.clone(), Arc::clone(&log));
        async move {
            let guard = c.lock(&key).await.unwrap();
            log.lock().unwrap().push('C');
            guard.release().await.unwrap();
        }
    });
    assert!(
        wait_queued(
            &con,
            &prefix,
            &c_backend,
            &key,
            true,
            Duration::from_secs(5)
        )
        .await,
        "C never queued"
    );
    held.release().await.unwrap();
    within(Duration::from_secs(20), "all sections", join_all(tasks)).await;

    let log = log.lock().unwrap().clone();
    assert_eq!(log.len() as u64, A_TASKS * 10 + 1, "{log:?}");
    let first_c = log.iter().position(|&who| who == 'C').unwrap();
    assert!(
        first_c as u64 <= 1 + 2 * (A_TASKS - 1),
        "C got the lock only after {first_c} of A's sections (budget: the leader's \
         section and two turns for each of A's other waiting tasks): {log:?}"
    );
    wait_idle(&[a, b, c], IDLE).await;
}
