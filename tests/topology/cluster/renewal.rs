//! Batched renewal on a Cluster: leases are grouped by primary, one script call
//! per primary per scan (not one per lease, nor one per slot), a lease deleted
//! behind its holder's back is lost alone, and a lease whose slot moves to another
//! primary while held keeps being renewed.

use futures::StreamExt;
use lockflight::LockGuard;

use super::*;

/// Leases held by the batch tests: on random keys, so in nearly as many slots.
const LEASES: usize = 480;

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

/// A backend under a fresh prefix (`name`) and a locker on it whose leases last
/// `ttl` and renew every `every`.
async fn renewing(name: &str, ttl: Duration, every: Duration) -> (String, Locker) {
    let prefix = unique_prefix(name);
    let locker = Locker::builder(backend(&prefix).await)
        .lease_ttl(ttl)
        .renew_every(every)
        .build()
        .unwrap();
    (prefix, locker)
}

/// Releases every held lease (none may be lost), then waits for the locker to
/// go idle.
async fn release_all(held: Vec<(LockKey, LockGuard)>, locker: Locker) {
    futures::stream::iter(held)
        .for_each_concurrent(64, |(key, g)| async move {
            assert!(!g.is_lost(), "{key}");
            g.release().await.expect("a renewed lease releases");
        })
        .await;
    wait_idle(&[locker], IDLE).await;
}

/// Takes the lock of every key, 64 at a time.
async fn hold_all(locker: &Locker, keys: Vec<LockKey>) -> Vec<(LockKey, LockGuard)> {
    futures::stream::iter(keys)
        .map(|key| {
            let locker = locker.clone();
            async move {
                let guard = locker.lock(&key).await.unwrap();
                (key, guard)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await
}

/// 480 mutex leases on keys `r0` … `r479` (some 470 cluster slots, about 160 on
/// each primary), renewed every 300 ms for 1.2 s: each primary runs about one
/// renewal script call per scan (per slot that would be about 160 per scan, per
/// lease 160 per period), every lease stays held. Then every 5th lock key is
/// deleted at the server: exactly those leases are lost, the others of their
/// primaries' batches keep being renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_renew_per_primary_and_a_deleted_one_is_lost_alone() {
    let (_serial, c) = cluster_for_this_test().await;
    let every = Duration::from_millis(300);
    let (prefix, locker) = renewing("batch", Duration::from_millis(1_500), every).await;

    let keys: Vec<LockKey> = (0..LEASES)
        .map(|i| LockKey::from(format!("r{i}")))
        .collect();
    let slots: std::collections::BTreeSet<u16> = keys.iter().map(slot_of).collect();
    assert!(slots.len() > LEASES * 9 / 10, "{} slots", slots.len());
    let primaries = c.primaries().await;
    let held = hold_all(&locker, keys).await;
    let n = held.len();
    // The first scans go per slot while the slot map is read in the background:
    // wait until a period's renewals go per primary (per slot they would be
    // about 160 calls on each).
    let scans_per_period = 4;
    testkit::eventually("the renewals go per primary", || async {
        for p in &primaries {
            evalsha_calls(&p.addr, true).await;
        }
        tokio::time::sleep(every).await;
        let mut batched = true;
        for p in &primaries {
            batched &= evalsha_calls(&p.addr, false).await <= 2 * scans_per_period + 5;
        }
        batched
    })
    .await;
    for p in &primaries {
        evalsha_calls(&p.addr, true).await;
    }
    let before = locker.stats();
    let window = 4 * every;
    tokio::time::sleep(window).await;
    let stats = locker.stats() - before;
    let periods = (window.as_millis() / every.as_millis()) as u64 + 1;
    let mut total = 0;
    for p in &primaries {
        let calls = evalsha_calls(&p.addr, false).await;
        total += calls;
        let bound = scans_per_period * periods + 5;
        let slots_here = slots
            .iter()
            .filter(|&&s| p.slots.iter().any(|&(a, z)| a <= s && s <= z))
            .count();
        println!(
            "{}: {calls} EVALSHA for the leases of {slots_here} slots over {window:?}",
            p.addr
        );
        assert!(
            calls <= bound,
            "{}: {calls} calls, more than {bound}",
            p.addr
        );
    }
    println!(
        "{n} leases: {total} EVALSHA over {window:?}, {} renewals",
        stats.renewals
    );
    assert!(stats.renewals >= 3 * n as u64, "{stats:?}");
    assert_eq!(stats.leases_lost, 0, "{stats:?}");
    let lost: Vec<_> = held
        .iter()
        .filter_map(|(k, g)| g.loss_signal().reason().map(|r| (k.clone(), r)))
        .collect();
    assert!(lost.is_empty(), "leases lost: {lost:?}");

    // Every 5th lock key goes.
    let mut data = data_conn().await;
    let doomed = |i: usize| i.is_multiple_of(5);
    for (i, (key, _)) in held.iter().enumerate() {
        if doomed(i) {
            redis::cmd("DEL")
                .arg(testkit::names::lock(&prefix, key))
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

/// 120 leases renewed every 200 ms, 6 of them in one slot; that slot moves to
/// another primary (`MIGRATING`/`IMPORTING`, `MIGRATE`, `SETSLOT NODE`), held in
/// the migrating state for two renewal periods. The old primary's batch finds the
/// moved leases not local: they are renewed on their new primary (each moved
/// record's TTL there goes back up, which only a renewal does), every lease keeps
/// being renewed, nothing is lost, and every lease releases.
///
/// The test waits for those renewals (bounded) instead of counting them in a fixed
/// window: a machine that stalls the process for a second must not fail it. The
/// 5 s TTL keeps such a stall from losing leases legitimately; a lease renewed
/// only on its old primary shows as a TTL on the new one that never rises.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_slot_moves_keeps_being_renewed() {
    let (_serial, c) = cluster_for_this_test().await;
    let every = Duration::from_millis(200);
    let (prefix, locker) = renewing("batch-move", Duration::from_secs(5), every).await;
    let mut keys: Vec<LockKey> = (0..114).map(|i| LockKey::from(format!("m{i}"))).collect();
    let slot = slot_of(&keys[0]);
    keys.extend(
        (0..)
            .map(|i| LockKey::from(format!("m0-{i}")))
            .filter(|k| slot_of(k) == slot)
            .take(5),
    );
    let moved: Vec<LockKey> = keys
        .iter()
        .filter(|k| slot_of(k) == slot)
        .cloned()
        .collect();
    assert_eq!(moved.len(), 6);
    let held = hold_all(&locker, keys).await;
    // Renewed by primary batches first (the slot map is read).
    wait_for_renewals(&locker, 119 * 2).await;
    let (from, to) = c.slot_move(slot).await;
    c.migrate_slot(slot, &from, &to, tokio::time::sleep(2 * every))
        .await;
    assert_eq!(c.primary_of_slot(slot).await.id, to.id);
    let before = locker.stats();
    for key in &moved {
        renewed_on(c, &to, &testkit::names::lock(&prefix, key)).await;
    }
    wait_for_renewals(&locker, before.renewals + 119 * 3).await;
    let stats = locker.stats() - before;
    assert_eq!(stats.leases_lost, 0, "{stats:?}");
    release_all(held, locker).await;
}

/// Waits (up to 30 s) until `locker` has made `n` renewals since it was built.
async fn wait_for_renewals(locker: &Locker, n: u64) {
    assert!(
        wait_until(Duration::from_secs(30), || async {
            locker.stats().renewals >= n
        })
        .await,
        "renewals stopped: {:?}",
        locker.stats()
    );
}

/// Waits (up to 30 s) until the record `name` on the node of `info` is renewed
/// there: its TTL goes back up above the lowest value read so far (it only falls
/// between renewals). The lowest, not the first: a first read just after a renewal
/// sees the full TTL, which no later renewal can exceed.
async fn renewed_on(c: &Cluster, info: &NodeInfo, name: &[u8]) {
    let name = std::str::from_utf8(name).expect("a UTF-8 lock name");
    let node = c.by_addr(&info.addr);
    let first: i64 = node.cmd(&["PTTL", name]).await.expect("PTTL");
    assert!(
        first > 0,
        "{name} is not held on {}: PTTL {first}",
        info.addr
    );
    let lowest = std::sync::atomic::AtomicI64::new(first);
    assert!(
        wait_until(Duration::from_secs(30), || async {
            let Ok(ttl) = node.cmd::<i64>(&["PTTL", name]).await else {
                return false;
            };
            if ttl <= 0 {
                return false; // gone: a lost lease, never a renewal
            }
            ttl > lowest.fetch_min(ttl, Ordering::SeqCst)
        })
        .await,
        "{name} was not renewed on {} (PTTL {first}, then only falling to {})",
        info.addr,
        lowest.load(Ordering::SeqCst)
    );
}

/// Sets `maxmemory` of a node, and puts it back to 0 (none) when dropped.
struct MaxMemory(redis::Client);

impl MaxMemory {
    async fn set(c: &Cluster, info: &NodeInfo, bytes: &str) -> MaxMemory {
        let node = c.by_addr(&info.addr);
        let _: () = node
            .cmd(&["CONFIG", "SET", "maxmemory", bytes])
            .await
            .expect("CONFIG SET maxmemory");
        MaxMemory(node.client())
    }
}

impl Drop for MaxMemory {
    fn drop(&mut self) {
        if let Ok(mut con) = self.0.get_connection() {
            let _ = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg("0")
                .query::<()>(&mut con);
        }
    }
}

/// 120 leases on random keys, renewed every 200 ms, while one primary is out of
/// memory (`maxmemory` 1 byte, `noeviction`): Redis refuses a flagged script
/// (the cross-slot batch) before it runs, so that primary's leases are renewed per
/// slot, whose mutex renewal (`PEXPIRE`) an out-of-memory server runs, as before
/// batches went by primary: each of its records' TTL goes back up. Nothing is
/// lost; every lease releases. (Waited for, not counted in a window, with a 5 s
/// TTL: see `a_lease_whose_slot_moves_keeps_being_renewed`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_out_of_memory_still_renews_its_leases() {
    let (_serial, c) = cluster_for_this_test().await;
    let every = Duration::from_millis(200);
    let (prefix, locker) = renewing("batch-oom", Duration::from_secs(5), every).await;
    let keys: Vec<LockKey> = (0..120).map(|i| LockKey::from(format!("o{i}"))).collect();
    let full = c.primaries().await.remove(0);
    let on_full: Vec<LockKey> = keys
        .iter()
        .filter(|k| {
            let s = slot_of(k);
            full.slots.iter().any(|&(a, z)| a <= s && s <= z)
        })
        .cloned()
        .collect();
    assert!(
        on_full.len() >= 10,
        "{} leases on {}",
        on_full.len(),
        full.addr
    );
    let held = hold_all(&locker, keys).await;
    let oom = MaxMemory::set(c, &full, "1").await;
    let before = locker.stats();
    for key in &on_full {
        renewed_on(c, &full, &testkit::names::lock(&prefix, key)).await;
    }
    wait_for_renewals(&locker, before.renewals + 120 * 3).await;
    let stats = locker.stats() - before;
    assert_eq!(stats.leases_lost, 0, "{stats:?}");
    release_all(held, locker).await;
    drop(oom);
}

/// 40 leases on two primaries, renewed every 200 ms with a 1 s TTL, while the
/// third primary answers no client for 2.5 s (`CLIENT PAUSE … ALL`: the cluster
/// bus goes on, so nothing fails over) from before the first renewal on. Reading
/// the slot map asks that primary (its version, maybe `CLUSTER NODES`) and waits
/// up to 2 s per question: the renewals do not wait for it (they go per slot until
/// the map is there), so nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_do_not_wait_for_the_slot_map() {
    let (_serial, c) = cluster_for_this_test().await;
    let every = Duration::from_millis(200);
    let (_, locker) = renewing("batch-slow-map", Duration::from_millis(1_000), every).await;
    let slow = c.primaries().await.remove(0);
    let keys: Vec<LockKey> = (0..)
        .map(|i| LockKey::from(format!("w{i}")))
        .filter(|k| {
            let s = slot_of(k);
            !slow.slots.iter().any(|&(a, z)| a <= s && s <= z)
        })
        .take(40)
        .collect();
    let _: () = c
        .by_addr(&slow.addr)
        .cmd(&["CLIENT", "PAUSE", "2500", "ALL"])
        .await
        .expect("CLIENT PAUSE");
    let held = hold_all(&locker, keys).await;
    // Beyond the lease TTL, within the pause.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let stats = locker.stats();
    assert_eq!(stats.leases_lost, 0, "{stats:?}");
    assert!(stats.renewals >= 40 * 4, "{stats:?}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    release_all(held, locker).await;
}
