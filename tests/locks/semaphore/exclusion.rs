//! The bound: never more than N holders at once, on one server and on a cluster.

use super::*;

/// 3 instances × 50 tasks, 4 critical sections each, on a semaphore of 3 permits:
/// never more than 3 holders at once; afterwards no permit, count or waiting entry
/// is left in Redis and no local state in any locker.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn never_more_than_n_holders_across_instances() {
    const N: u32 = 3;
    const TASKS: usize = 50;
    const ROUNDS: usize = 4;
    let (server, _log, prefix) = shared_scene("sem-exclusion");
    let lockers = instances(&server.url(), &prefix, 3).await;
    let max = exclusion_workload(&lockers, N, TASKS, ROUNDS, "all critical sections").await;
    let sections = 3 * TASKS * ROUNDS;
    let requests: u64 = lockers.iter().map(|l| l.stats().acquire_attempts).sum();
    println!(
        "max holders at once: {max} of {N}; {requests} permit requests for {sections} \
         critical sections (plus one release each)"
    );
    assert!(
        max >= 2,
        "the permits were never used concurrently (max {max})"
    );
    wait_idle(&lockers).await;
    assert_eq!(
        key_count(server, &format!("{prefix}:*")).await,
        0,
        "keys left"
    );
}

/// On a Redis Cluster (3 primaries) the semaphore scripts are single-slot: 2
/// instances × 10 tasks on a semaphore of 2 permits never exceed 2 holders, and
/// leave nothing behind.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_cluster() {
    const N: u32 = 2;
    let cluster = testkit::cluster::Cluster::start();
    let prefix = unique_prefix("sem-cluster");
    let mut lockers = Vec::new();
    for _ in 0..2 {
        let b = RedisBackend::cluster(cluster.urls())
            .prefix(&prefix)
            .connect()
            .await
            .expect("connect to the cluster");
        lockers.push(locker(b, Duration::from_secs(30)));
    }
    let max = exclusion_workload(&lockers, N, 10, 5, "the cluster workload").await;
    assert_eq!(max, N as usize);
    wait_idle(&lockers).await;
}
