//! The exact counter: 3 instances × 40 tasks × 25 read-modify-write critical
//! sections, on keys of all three shards and on one hot key.

use super::*;

const INSTANCES: usize = 3;

const TASKS: usize = 40;

const ITERATIONS: usize = 25;

/// 3 instances × 40 tasks × 25 read-modify-write critical sections; task `t`
/// uses `keys[t % keys.len()]`. Returns the tokens per key.
async fn counter(name: &str, spread: bool, handoff: bool) -> Vec<Vec<FencingToken>> {
    let prefix = unique_prefix(name);
    let mut backends = Vec::new();
    let mut lockers = Vec::new();
    for _ in 0..INSTANCES {
        let b = backend(&prefix).await;
        let builder = Locker::builder(b.clone()).wait_timeout(Duration::from_secs(60));
        let builder = if handoff {
            builder.handoff(Handoff::enabled())
        } else {
            builder
        };
        lockers.push(builder.build().unwrap());
        backends.push(b);
    }
    let keys: Vec<LockKey> = if spread {
        key_per_shard("k")
            .await
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    } else {
        vec![LockKey::from("hot")]
    };
    let data = data_conn().await;
    let sections: Vec<CounterSection> = keys
        .iter()
        .map(|key| CounterSection::new(counter_name(&prefix, key), data.clone()))
        .collect();
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for locker in &lockers {
        for t in 0..TASKS {
            let i = t % keys.len();
            let (locker, key) = (locker.clone(), keys[i].clone());
            let mut section = sections[i].clone();
            tasks.spawn(async move {
                for _ in 0..ITERATIONS {
                    let guard = locker.lock(&key).await.expect("lock within 60 s");
                    section
                        .increment(guard.fencing_token(), tokio::task::yield_now())
                        .await;
                    guard.release().await.expect("release");
                }
            });
        }
    }
    join_all(tasks).await;
    let elapsed = started.elapsed();
    // Leases cached after the last sections go back when their linger ends.
    wait_idle(&lockers, IDLE).await;
    let mut data = data.clone();
    for (i, key) in keys.iter().enumerate() {
        let per_key =
            (INSTANCES * (0..TASKS).filter(|t| t % keys.len() == i).count() * ITERATIONS) as u64;
        let v = counter_value(&mut data, &counter_name(&prefix, key)).await;
        assert_eq!(v, per_key, "lost updates on {key}");
        let left: bool = redis::cmd("EXISTS")
            .arg(testkit::names::lock(&prefix, key))
            .query_async(&mut data)
            .await
            .unwrap();
        assert!(!left, "lock key of {key} left behind");
    }
    wait_idle(&lockers, IDLE).await;
    for l in &lockers {
        let s = l.stats();
        assert_eq!(s.leases_lost, 0, "{s:?}");
        assert_eq!(s.timeouts, 0, "{s:?}");
    }
    let attempts: u64 = lockers.iter().map(|l| l.stats().acquire_attempts).sum();
    println!(
        "cluster counter {name} ({} keys): {} sections in {elapsed:?}, {attempts} acquire attempts",
        keys.len(),
        INSTANCES * TASKS * ITERATIONS
    );
    let out: Vec<Vec<FencingToken>> = sections.iter().map(CounterSection::tokens).collect();
    for (t, key) in out.iter().zip(&keys) {
        assert_strictly_increasing(t, &key.to_string());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_exact_on_keys_of_all_three_shards() {
    let _serial = cluster_for_this_test().await;
    counter("spread", true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_exact_on_a_hot_key() {
    let _serial = cluster_for_this_test().await;
    counter("hot", false, false).await;
    counter("hot-handoff", false, true).await;
}
