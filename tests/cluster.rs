//! lockflight on a real Redis Cluster: 3 primaries with one replica each, started
//! once for this test binary ([`support::cluster::Cluster`]).
//!
//! The tests share the cluster and some of them change it (a slot migrates, a
//! primary is killed and comes back as a replica), so they run one at a time (the
//! `SERIAL` lock) and each looks the topology up when it starts.
//!
//! * `counter_exact_on_keys_of_all_three_shards`, `counter_exact_on_a_hot_key`:
//!   3 instances × 40 tasks × 25 critical sections, read-modify-write, exact.
//! * `hot_slot_migrates_while_held_and_waited_on`: `SETSLOT MIGRATING/IMPORTING` +
//!   `MIGRATE` under a workload: no overlap, the workload continues, waiters woken.
//! * `killed_primary_while_held`: the holder is lost or keeps a lease the promoted
//!   replica has; other shards unaffected; the key's fencing tokens never go back.
//! * `wakeup_latency_cluster_vs_single`: p50 within one RTT + 1 ms of one server.
//! * `pubsub_classic_vs_sharded`: the measurement behind the choice of classic
//!   pub/sub for wake-ups (printed; both must deliver).
#![cfg(feature = "cluster")]

mod support;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lockflight::{FencingToken, Handoff, LockKey, Locker, RedisBackend};
use redis::cluster_async::ClusterConnection;
use support::cluster::{Cluster, NodeInfo};
use support::{
    RedisServer, assert_strictly_increasing, join_all, subscribed, unique_prefix, wait_idle,
    wait_until,
};

/// How long a test waits for its lockers' local activity to end.
const IDLE: Duration = Duration::from_secs(10);
use tokio::task::JoinSet;

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(Cluster::start)
}

async fn backend(prefix: &str) -> RedisBackend {
    subscribed(
        RedisBackend::cluster(cluster().urls())
            .prefix(prefix)
            .connect()
            .await
            .expect("connect to the cluster"),
    )
    .await
}

async fn data_conn() -> ClusterConnection {
    redis::cluster::ClusterClientBuilder::new(cluster().urls())
        .response_timeout(Duration::from_secs(5))
        .connection_timeout(Duration::from_secs(5))
        .min_retry_wait(5)
        .max_retry_wait(200)
        .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true))
        .build()
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster data connection")
}

/// Keys whose lock names land on each current primary (one per primary, in the
/// primaries' slot order), found by trying `<stem>0`, `<stem>1`, …
async fn key_per_shard(b: &RedisBackend, stem: &str) -> Vec<(LockKey, NodeInfo)> {
    let primaries = cluster().primaries().await;
    let mut out: Vec<Option<LockKey>> = vec![None; primaries.len()];
    for i in 0.. {
        let key = LockKey::from(format!("{stem}{i}"));
        let slot = Cluster::slot(&b.lock_name(&key));
        let owner = primaries
            .iter()
            .position(|p| p.slots.iter().any(|&(a, z)| a <= slot && slot <= z))
            .expect("a primary serves every slot");
        if out[owner].is_none() {
            out[owner] = Some(key);
        }
        if out.iter().all(Option::is_some) {
            break;
        }
    }
    out.into_iter()
        .zip(primaries)
        .map(|(k, p)| (k.unwrap(), p))
        .collect()
}

/// The counter's name, in the key's hash tag (so on the key's shard).
fn counter_name(b: &RedisBackend, key: &LockKey) -> Vec<u8> {
    [&b.lock_name(key)[..], b":counter"].concat()
}

struct Exclusive(Arc<AtomicUsize>);
impl Exclusive {
    fn enter(inside: &Arc<AtomicUsize>) -> Exclusive {
        assert_eq!(
            inside.fetch_add(1, Ordering::SeqCst),
            0,
            "two holders at once"
        );
        Exclusive(inside.clone())
    }
}
impl Drop for Exclusive {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

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
        key_per_shard(&backends[0], "k")
            .await
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    } else {
        vec![LockKey::from("hot")]
    };
    let data = data_conn().await;
    let inside: Vec<Arc<AtomicUsize>> = keys.iter().map(|_| Arc::default()).collect();
    let tokens: Vec<Arc<Mutex<Vec<FencingToken>>>> = keys.iter().map(|_| Arc::default()).collect();
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for locker in &lockers {
        for t in 0..TASKS {
            let i = t % keys.len();
            let (locker, key) = (locker.clone(), keys[i].clone());
            let (inside, tokens, mut data) = (inside[i].clone(), tokens[i].clone(), data.clone());
            let counter = counter_name(&backends[0], &key);
            tasks.spawn(async move {
                for _ in 0..ITERATIONS {
                    let guard = locker.lock(&key).await.expect("lock within 60 s");
                    {
                        let _in = Exclusive::enter(&inside);
                        tokens.lock().unwrap().push(guard.fencing_token());
                        let v: Option<u64> = redis::cmd("GET")
                            .arg(&counter)
                            .query_async(&mut data)
                            .await
                            .expect("GET");
                        tokio::task::yield_now().await;
                        redis::cmd("SET")
                            .arg(&counter)
                            .arg(v.unwrap_or(0) + 1)
                            .query_async::<()>(&mut data)
                            .await
                            .expect("SET");
                    }
                    guard.release().await.expect("release");
                }
            });
        }
    }
    join_all(tasks).await;
    let elapsed = started.elapsed();
    let mut data = data.clone();
    for (i, key) in keys.iter().enumerate() {
        let per_key =
            (INSTANCES * (0..TASKS).filter(|t| t % keys.len() == i).count() * ITERATIONS) as u64;
        let v: u64 = redis::cmd("GET")
            .arg(counter_name(&backends[0], key))
            .query_async(&mut data)
            .await
            .unwrap();
        assert_eq!(v, per_key, "lost updates on {key}");
        let left: bool = redis::cmd("EXISTS")
            .arg(backends[0].lock_name(key))
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
    let out: Vec<Vec<FencingToken>> = tokens.iter().map(|t| t.lock().unwrap().clone()).collect();
    for (t, key) in out.iter().zip(&keys) {
        assert_strictly_increasing(t, &key.to_string());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_exact_on_keys_of_all_three_shards() {
    let _serial = SERIAL.lock().await;
    cluster().wait_ok(Duration::from_secs(30)).await;
    counter("spread", true, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_exact_on_a_hot_key() {
    let _serial = SERIAL.lock().await;
    cluster().wait_ok(Duration::from_secs(30)).await;
    counter("hot", false, false).await;
    counter("hot-handoff", false, true).await;
}

/// A hot key's slot moves to another shard (`MIGRATING`/`IMPORTING`, `MIGRATE` of
/// its keys, `SETSLOT NODE`) while 2 instances × 8 tasks run read-modify-write
/// critical sections on it: none overlaps, the counter is exact, and the workload
/// goes on after the move (waiters woken by releases on the new shard).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_slot_migrates_while_held_and_waited_on() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.wait_ok(Duration::from_secs(30)).await;
    let prefix = unique_prefix("migrate");
    let a = backend(&prefix).await;
    let b = backend(&prefix).await;
    let key = LockKey::from("hot");
    let slot = Cluster::slot(&a.lock_name(&key));
    let from = c.primary_of_slot(slot).await;
    let to = c
        .primaries()
        .await
        .into_iter()
        .find(|p| p.id != from.id)
        .unwrap();
    let lockers: Vec<Locker> = [a.clone(), b.clone()]
        .into_iter()
        .map(|be| {
            Locker::builder(be)
                .lease_ttl(Duration::from_secs(2))
                .wait_timeout(Duration::from_secs(30))
                .build()
                .unwrap()
        })
        .collect();
    let counter = counter_name(&a, &key);
    let data = data_conn().await;
    let inside = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let release_errors = Arc::new(AtomicU64::new(0));
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    for l in &lockers {
        for _ in 0..8 {
            let (l, key, counter, mut data) =
                (l.clone(), key.clone(), counter.clone(), data.clone());
            let (inside, done, tokens, stop, rel) = (
                inside.clone(),
                done.clone(),
                tokens.clone(),
                stop.clone(),
                release_errors.clone(),
            );
            tasks.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let guard = l.lock(&key).await.expect("lock during the migration");
                    {
                        let _in = Exclusive::enter(&inside);
                        tokens.lock().unwrap().push(guard.fencing_token());
                        let v: Option<u64> = redis::cmd("GET")
                            .arg(&counter)
                            .query_async(&mut data)
                            .await
                            .expect("GET");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        redis::cmd("SET")
                            .arg(&counter)
                            .arg(v.unwrap_or(0) + 1)
                            .query_async::<()>(&mut data)
                            .await
                            .expect("SET");
                    }
                    done.fetch_add(1, Ordering::SeqCst);
                    if guard.release().await.is_err() {
                        // TRYAGAIN outlasting the retries mid-migration: the lease
                        // expires by its TTL instead.
                        rel.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    }
    // Let the workload run, then move the slot while it runs.
    assert!(
        wait_until(Duration::from_secs(20), || {
            let n = done.load(Ordering::SeqCst);
            async move { n >= 50 }
        })
        .await
    );
    let moved_at = done.load(Ordering::SeqCst);
    c.migrate_slot(
        slot,
        &from,
        &to,
        tokio::time::sleep(Duration::from_millis(200)),
    )
    .await;
    let after = done.load(Ordering::SeqCst);
    // The workload continues on the new shard.
    assert!(
        wait_until(Duration::from_secs(20), || {
            let n = done.load(Ordering::SeqCst);
            async move { n >= after + 100 }
        })
        .await,
        "the workload stalled after the migration ({} sections)",
        done.load(Ordering::SeqCst)
    );
    stop.store(true, Ordering::SeqCst);
    join_all(tasks).await;
    let total = done.load(Ordering::SeqCst);
    let mut data = data.clone();
    let v: u64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut data)
        .await
        .unwrap();
    assert_eq!(v, total, "lost updates across the migration");
    assert_eq!(c.primary_of_slot(slot).await.id, to.id, "the slot moved");
    assert_strictly_increasing(&tokens.lock().unwrap(), "migration");
    wait_idle(&lockers, IDLE).await;
    println!(
        "migration: {moved_at} sections before, {} during, {total} in all; {} release errors",
        after - moved_at,
        release_errors.load(Ordering::SeqCst)
    );
}

/// A shard's primary is killed while a lock on it is held and waited on. The
/// holder is signalled lost, or it keeps a lease that the promoted replica also
/// has; a workload on the other shards is not held up; the key's fencing tokens
/// never go back. The killed node comes back as a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_primary_while_held() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.wait_ok(Duration::from_secs(30)).await;
    let prefix = unique_prefix("failover");
    let a = backend(&prefix).await;
    let b = backend(&prefix).await;
    let shards = key_per_shard(&a, "f").await;
    let (key, victim) = shards[0].clone();
    let others: Vec<LockKey> = shards[1..].iter().map(|(k, _)| k.clone()).collect();
    let ttl = Duration::from_secs(4);
    let holder = Locker::builder(a.clone())
        .lease_ttl(ttl)
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let waiter = Locker::builder(b.clone())
        .lease_ttl(ttl)
        .wait_timeout(Duration::from_secs(60))
        .build()
        .unwrap();

    let held = holder.lock(&key).await.unwrap();
    let first = held.fencing_token();
    let waiting = {
        let (w, k) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            let g = w
                .lock(&k)
                .await
                .expect("the waiter gets the key after the failover");
            let t = g.fencing_token();
            g.release().await.expect("release");
            t
        })
    };
    // The other shards' workload, timed per critical section.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worst = Arc::new(Mutex::new(Duration::ZERO));
    let other_done = Arc::new(AtomicU64::new(0));
    let mut others_tasks = JoinSet::new();
    for k in others {
        for _ in 0..4 {
            let (l, k, stop, worst, n) = (
                waiter.clone(),
                k.clone(),
                stop.clone(),
                worst.clone(),
                other_done.clone(),
            );
            others_tasks.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let t0 = Instant::now();
                    let g = l.lock(&k).await.expect("other shards keep working");
                    g.release().await.expect("release on another shard");
                    let d = t0.elapsed();
                    {
                        let mut w = worst.lock().unwrap();
                        *w = (*w).max(d);
                    }
                    n.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            });
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let replica = c.replicas_of(&victim.id).await;
    assert_eq!(replica.len(), 1, "one replica per primary");
    let replica = replica[0].clone();
    // Replication is asynchronous: wait until the replica has the lock too.
    let lock_name = a.lock_name(&key);
    let rnode = c.by_addr(&replica.addr);
    assert!(
        wait_until(Duration::from_secs(5), || {
            let name = String::from_utf8_lossy(&lock_name).into_owned();
            async move {
                let mut con = rnode.connection().await;
                redis::cmd("READONLY")
                    .query_async::<()>(&mut con)
                    .await
                    .ok();
                redis::cmd("EXISTS")
                    .arg(&name)
                    .query_async::<bool>(&mut con)
                    .await
                    .unwrap_or(false)
            }
        })
        .await
    );
    let before_kill = other_done.load(Ordering::SeqCst);
    let killed_at = Instant::now();
    c.by_addr(&victim.addr).kill();
    // The replica takes over.
    assert!(
        wait_until(Duration::from_secs(20), || async {
            c.primaries().await.iter().any(|p| p.id == replica.id)
        })
        .await,
        "the replica was not promoted"
    );
    let promoted_after = killed_at.elapsed();
    // Over two lease TTLs: either the holder was told it lost the lease, or the
    // promoted replica holds it and renewals keep it.
    tokio::time::sleep(ttl * 2).await;
    let lost = held.is_lost();
    if !lost {
        let mut con = rnode.connection().await;
        let exists: bool = redis::cmd("EXISTS")
            .arg(&lock_name)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(
            exists,
            "the holder is not lost but the new primary lacks its lock"
        );
    }
    let during = other_done.load(Ordering::SeqCst) - before_kill;
    let _ = held.release().await;
    let second = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiter is served after the failover")
        .unwrap();
    let third = {
        let g = holder.lock(&key).await.unwrap();
        let t = g.fencing_token();
        g.release().await.unwrap();
        t
    };
    assert_strictly_increasing(&[first, second, third], "across the failover");
    stop.store(true, Ordering::SeqCst);
    join_all(others_tasks).await;
    let worst = *worst.lock().unwrap();
    println!(
        "failover: replica promoted {promoted_after:?} after the kill; holder lost: {lost}; \
         other shards: {during} sections meanwhile, worst {worst:?}; tokens {first} < {second} < {third}"
    );
    assert!(during > 0, "the other shards stalled during the failover");
    // The killed node comes back (empty) and rejoins as a replica.
    c.by_addr(&victim.addr).restart();
    c.wait_ok(Duration::from_secs(30)).await;
    wait_idle(&[holder, waiter], IDLE).await;
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// Wake-up latency: a waiter on one instance, the holder on another; the time from
/// the release's reply to the waiter's grant.
async fn wakeup_p50(holder_b: RedisBackend, waiter_b: RedisBackend, rounds: usize) -> Duration {
    let key = LockKey::from("wake");
    let holder = Locker::builder(holder_b).build().unwrap();
    let waiter = Locker::builder(waiter_b.clone())
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut lat = Vec::new();
    for _ in 0..rounds {
        let held = holder.lock(&key).await.unwrap();
        let task = {
            let (w, k) = (waiter.clone(), key.clone());
            tokio::spawn(async move {
                let g = w.lock(&k).await.unwrap();
                (g, Instant::now())
            })
        };
        // Queued in Redis (one busy reply) and asleep on the wake-up.
        assert!(
            wait_until(Duration::from_secs(10), || {
                let n = waiter.stats().acquire_attempts;
                async move { n >= 1 }
            })
            .await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        held.release().await.unwrap();
        let released = Instant::now();
        let (g, at) = task.await.unwrap();
        lat.push(at.saturating_duration_since(released));
        g.release().await.unwrap();
    }
    percentile(&mut lat, 0.5)
}

async fn ping_rtt(mut con: impl redis::aio::ConnectionLike) -> Duration {
    let mut v = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        redis::cmd("PING")
            .query_async::<String>(&mut con)
            .await
            .unwrap();
        v.push(t.elapsed());
    }
    percentile(&mut v, 0.5)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakeup_latency_cluster_vs_single() {
    let _serial = SERIAL.lock().await;
    cluster().wait_ok(Duration::from_secs(30)).await;
    let single = RedisServer::start();
    let p = unique_prefix("wake-single");
    let s1 = RedisBackend::builder(single.url())
        .prefix(&p)
        .connect()
        .await
        .unwrap();
    let s2 = RedisBackend::builder(single.url())
        .prefix(&p)
        .connect()
        .await
        .unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || {
            let up = s1.is_subscribed() && s2.is_subscribed();
            async move { up }
        })
        .await
    );
    let single_p50 = wakeup_p50(s1, s2, 30).await;
    let p = unique_prefix("wake-cluster");
    let c1 = backend(&p).await;
    let c2 = backend(&p).await;
    let cluster_p50 = wakeup_p50(c1, c2, 30).await;
    let rtt = ping_rtt(data_conn().await).await;
    println!(
        "wake-up p50: single {single_p50:?}, cluster {cluster_p50:?}; cluster PING RTT p50 {rtt:?}"
    );
    assert!(
        cluster_p50 <= single_p50 + rtt + Duration::from_millis(1),
        "cluster wake-up p50 {cluster_p50:?} > single {single_p50:?} + RTT {rtt:?} + 1 ms"
    );
}

/// Classic `PUBLISH` (broadcast over the cluster bus) vs sharded `SPUBLISH` (stays
/// in the shard), both from a script on the key's primary, received by a
/// subscriber on another node (classic) or on that shard (sharded). Prints the
/// publish-to-receive latency and the publish throughput of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_classic_vs_sharded() {
    let _serial = SERIAL.lock().await;
    let c = cluster();
    c.wait_ok(Duration::from_secs(30)).await;
    let primaries = c.primaries().await;
    let tag = format!("{{{}}}", unique_prefix("ps"));
    let slot = Cluster::slot(tag.as_bytes());
    let owner = c.primary_of_slot(slot).await;
    let elsewhere = primaries.iter().find(|p| p.id != owner.id).unwrap();
    let channel = format!("{tag}:inst:x");
    const N: usize = 2000;
    let script = redis::Script::new("return redis.call(ARGV[1], ARGV[2], ARGV[3])");
    let mut results = Vec::new();
    for (publish, sub_node) in [("PUBLISH", elsewhere), ("SPUBLISH", &owner)] {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // Kept alive until the measurement ends.
        let mut _single = None;
        let mut _sharded = None;
        if publish == "PUBLISH" {
            let sub_client =
                redis::Client::open(format!("redis://{}/?protocol=3", sub_node.addr)).unwrap();
            let config = redis::AsyncConnectionConfig::new().set_push_sender(tx);
            let mut sub = sub_client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .unwrap();
            sub.subscribe(&channel).await.unwrap();
            _single = Some(sub);
        } else {
            // The cluster client sends SSUBSCRIBE to the channel's shard.
            let mut sub = redis::cluster::ClusterClientBuilder::new(c.urls())
                .use_protocol(redis::ProtocolVersion::RESP3)
                .push_sender(tx)
                .build()
                .unwrap()
                .get_async_connection()
                .await
                .unwrap();
            sub.ssubscribe(&channel).await.unwrap();
            _sharded = Some(sub);
        }
        let mut pub_con = c.by_addr(&owner.addr).connection().await;
        // Latency, one at a time.
        let mut lat = Vec::new();
        for i in 0..200 {
            let t = Instant::now();
            let _: i64 = script
                .key(&channel)
                .arg(publish)
                .arg(&channel)
                .arg(i)
                .invoke_async(&mut pub_con)
                .await
                .unwrap();
            loop {
                let m = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                    .await
                    .expect("message delivered")
                    .unwrap();
                if matches!(m.kind, redis::PushKind::Message | redis::PushKind::SMessage) {
                    break;
                }
            }
            lat.push(t.elapsed());
        }
        // Throughput: N scripts in flight from 16 tasks, then all received.
        let t = Instant::now();
        let mut js = JoinSet::new();
        for w in 0..16 {
            let (mut con, script, channel) = (pub_con.clone(), script.clone(), channel.clone());
            js.spawn(async move {
                for i in 0..N / 16 {
                    let _: i64 = script
                        .key(&channel)
                        .arg(publish)
                        .arg(&channel)
                        .arg(w * 10_000 + i)
                        .invoke_async(&mut con)
                        .await
                        .unwrap();
                }
            });
        }
        join_all(js).await;
        let mut got = 0;
        while got < N / 16 * 16 {
            let m = tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .expect("all messages delivered")
                .unwrap();
            if matches!(m.kind, redis::PushKind::Message | redis::PushKind::SMessage) {
                got += 1;
            }
        }
        let rate = got as f64 / t.elapsed().as_secs_f64();
        let p50 = percentile(&mut lat, 0.5);
        let p99 = percentile(&mut lat, 0.99);
        println!(
            "{publish} from a script on {}, subscriber on {}: p50 {p50:?} p99 {p99:?}, {rate:.0} msgs/s",
            owner.addr, sub_node.addr
        );
        results.push((publish, p50, p99, rate));
    }
    println!("pubsub classic vs sharded: {results:?}");
}
