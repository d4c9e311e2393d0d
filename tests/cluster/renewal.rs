//! Batched renewal on a Cluster: leases are grouped by cluster slot, one script
//! call per slot in use per scan (not one per lease), and a lease deleted behind
//! its holder's back is lost alone.

use futures::StreamExt;
use lockflight::LockGuard;

use super::*;

/// Slots used per primary, and leases per slot.
const SLOTS_PER_PRIMARY: usize = 4;
const PER_SLOT: usize = 40;

/// `INFO commandstats` `EVALSHA` calls of the node at `addr`, and a reset.
async fn evalsha_calls(addr: &str, reset: bool) -> u64 {
    let node = cluster().by_addr(addr);
    let mut con = node.connection().await;
    let calls = testkit::evalsha_count(&mut con).await;
    if reset {
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async::<()>(&mut con)
            .await
            .unwrap();
    }
    calls
}

/// 480 mutex leases in 12 cluster slots (4 on each primary, 40 keys each), renewed
/// every 300 ms for 1.2 s: each primary runs at most one renewal script call per
/// slot and scan (the per-lease watchdog ran one per lease and period), every lease
/// stays held. Then every 5th lock key is deleted at the server: exactly those
/// leases are lost, the others of their slots' batches keep being renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_renew_per_slot_and_a_deleted_one_is_lost_alone() {
    let (_serial, c) = cluster_for_this_test().await;
    let prefix = unique_prefix("batch");
    let b = backend(&prefix).await;
    let every = Duration::from_millis(300);
    let locker = Locker::builder(b.clone())
        .lease_ttl(Duration::from_millis(1_500))
        .renew_every(every)
        .build()
        .unwrap();

    // Keys grouped by slot: the first SLOTS_PER_PRIMARY slots of each primary's
    // range that hold PER_SLOT of the candidates `r0`, `r1`, …
    let primaries = c.primaries().await;
    let mut by_slot: BTreeMap<u16, Vec<LockKey>> = BTreeMap::new();
    for i in 0..1_000_000 {
        let key = LockKey::from(format!("r{i}"));
        by_slot
            .entry(Cluster::slot(&b.lock_name(&key)))
            .or_default()
            .push(key);
    }
    let mut keys = Vec::new();
    let mut slots_of: Vec<(String, usize)> = Vec::new();
    for p in &primaries {
        let mine: Vec<_> = by_slot
            .iter()
            .filter(|(slot, keys)| {
                p.slots.iter().any(|&(a, z)| a <= **slot && **slot <= z) && keys.len() >= PER_SLOT
            })
            .take(SLOTS_PER_PRIMARY)
            .collect();
        assert_eq!(mine.len(), SLOTS_PER_PRIMARY, "slots of {}", p.addr);
        for (_, k) in mine {
            keys.extend(k[..PER_SLOT].iter().cloned());
        }
        slots_of.push((p.addr.clone(), SLOTS_PER_PRIMARY));
    }
    let n = keys.len();
    let held: Vec<(LockKey, LockGuard)> = futures::stream::iter(keys)
        .map(|key| {
            let locker = locker.clone();
            async move {
                let guard = locker.lock(&key).await.unwrap();
                (key, guard)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    for p in &primaries {
        evalsha_calls(&p.addr, true).await;
    }
    let before = locker.stats();
    let window = 4 * every;
    tokio::time::sleep(window).await;
    let stats = locker.stats() - before;
    let periods = (window.as_millis() / every.as_millis()) as u64 + 1;
    let scans_per_period = 4;
    let mut total = 0;
    for (addr, slots) in &slots_of {
        let calls = evalsha_calls(addr, false).await;
        total += calls;
        let bound = *slots as u64 * scans_per_period * periods + 5;
        println!(
            "{addr}: {calls} EVALSHA for {} leases in {slots} slots over {window:?}",
            slots * PER_SLOT
        );
        assert!(calls <= bound, "{addr}: {calls} calls, more than {bound}");
    }
    println!(
        "{n} leases: {total} EVALSHA over {window:?}, {} renewals",
        stats.renewals
    );
    assert!(
        total < n as u64 * 3 / 2,
        "{total} calls for {n} leases over {periods} periods"
    );
    assert!(stats.renewals >= 3 * n as u64, "{stats:?}");
    assert_eq!(stats.leases_lost, 0, "{stats:?}");
    assert!(held.iter().all(|(_, g)| !g.is_lost()));

    // Every 5th lock key goes.
    let mut data = data_conn().await;
    let doomed = |i: usize| i.is_multiple_of(5);
    for (i, (key, _)) in held.iter().enumerate() {
        if doomed(i) {
            redis::cmd("DEL")
                .arg(b.lock_name(key))
                .query_async::<()>(&mut data)
                .await
                .unwrap();
        }
    }
    let expected = held.iter().enumerate().filter(|(i, _)| doomed(*i)).count() as u64;
    assert!(
        wait_until(Duration::from_secs(5), || async {
            locker.stats().leases_lost >= expected
        })
        .await,
        "{:?}",
        locker.stats()
    );
    tokio::time::sleep(2 * every).await;
    assert_eq!(locker.stats().leases_lost, expected);
    let mut survivors = Vec::new();
    for (i, (key, guard)) in held.into_iter().enumerate() {
        assert_eq!(guard.is_lost(), doomed(i), "{key} (deleted: {})", doomed(i));
        if !doomed(i) {
            survivors.push(guard);
        }
    }
    futures::stream::iter(survivors)
        .for_each_concurrent(64, |g| async move {
            g.release().await.expect("a renewed lease releases");
        })
        .await;
    wait_idle(&[locker], IDLE).await;
}
