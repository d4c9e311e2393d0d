//! Wake-up latency on a cluster vs one server (printed: a measurement, asserted only
//! to come from a message), and the measurement behind classic pub/sub for wake-ups.

use lockflight::backend::LockBackend;

use super::*;

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
        // Queued in Redis (one busy reply) and asleep on the wake-up: this round's
        // waiter watches the key.
        testkit::eventually("the waiter watches for its wake-up", || async {
            waiter_b
                .signals()
                .watchers(lockflight::backend::LockKind::Mutex, key.as_bytes())
                >= 1
        })
        .await;
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
    let _serial = cluster_for_this_test().await;
    let single = RedisServer::start();
    let p = unique_prefix("wake-single");
    let s1 = backend_at(&single.url(), &p).await;
    let s2 = backend_at(&single.url(), &p).await;
    let single_p50 = wakeup_p50(s1, s2, 30).await;
    let p = unique_prefix("wake-cluster");
    let c1 = backend(&p).await;
    let c2 = backend(&p).await;
    let cluster_p50 = wakeup_p50(c1, c2, 30).await;
    let rtt = ping_rtt(data_conn().await).await;
    println!(
        "wake-up p50: single {single_p50:?}, cluster {cluster_p50:?}; cluster PING RTT p50 {rtt:?}"
    );
    // How the two compare is a figure for BENCHMARKS.md, not an assertion: on a
    // busy machine any wall-clock comparison can go either way. What must hold is
    // that the waiter was woken by the release's message, not by its fallback
    // timer (a third of the queue entry's TTL: 1 s by default, hundreds of times
    // the wake-up measured even beside three test runs and a CPU hog).
    let fallback = Duration::from_secs(1);
    assert!(
        cluster_p50 < fallback && single_p50 < fallback,
        "the waiters were woken by their retry timers, not by a message: \
         cluster p50 {cluster_p50:?}, single p50 {single_p50:?}"
    );
}

/// Classic `PUBLISH` (broadcast over the cluster bus) vs sharded `SPUBLISH` (stays
/// in the shard), both from a script on the key's primary, received by a
/// subscriber on another node (classic) or on that shard (sharded). Prints the
/// publish-to-receive latency and the publish throughput of each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pubsub_classic_vs_sharded() {
    let (_serial, c) = cluster_for_this_test().await;
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

/// Every instance keeps a subscription to its channel on every primary (besides
/// its main one), so that a release's wake-up reaches it from the key's own node
/// instead of over the cluster bus, whose occasional tens-of-milliseconds delay
/// decided the hot-key throughput; the backend follows the primaries it lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_instance_listens_on_every_primary() {
    let (_serial, c) = cluster_for_this_test().await;
    let prefix = unique_prefix("mirrors");
    let b = backend(&prefix).await;
    let channel = testkit::names::channel(&prefix, b.instance_id());
    let primaries = c.primaries().await;
    assert_eq!(primaries.len(), 3);
    assert!(
        wait_until(Duration::from_secs(10), || async {
            let mut all = true;
            for p in &primaries {
                let counts: (String, u64) = c
                    .by_addr(&p.addr)
                    .cmd(&["PUBSUB", "NUMSUB", &channel])
                    .await
                    .unwrap_or_default();
                all &= counts.1 >= 1;
            }
            all
        })
        .await,
        "{channel} is not subscribed on every primary"
    );
    drop(b);
}

/// Revocation on a Cluster: for a key on each shard, instance B queues for a key
/// whose lease instance A keeps cached and idle (linger 60 s), and A lets go at
/// once: the revocation, published by the key's node on A's instance channel,
/// reaches A (by its subscription on that node, or over the cluster bus).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_instance_revokes_an_idle_cached_lease_on_each_shard() {
    let (_serial, _cluster) = cluster_for_this_test().await;
    let (_, ab, bb) = two_instances("cluster-revoke").await;
    let keys = key_per_shard("revoke").await;
    let a = Locker::builder(ab)
        // A budget as long as the linger: an idle cached lease also ends with it.
        .handoff(Handoff::enabled().max_hold(Duration::from_secs(60)))
        .cache_leases_for(Duration::from_secs(60))
        .build()
        .unwrap();
    let b = Locker::builder(bb)
        .wait_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    for (key, node) in keys {
        let g = a.lock(&key).await.unwrap();
        let ta = g.fencing_token();
        g.release().await.unwrap();
        let got = within(
            Duration::from_secs(10),
            &format!("B's lock of {key} on {}, cached by A for 60 s", node.addr),
            b.lock(&key),
        )
        .await
        .unwrap();
        assert!(got.fencing_token() > ta);
        got.release().await.unwrap();
    }
    a.shutdown().await;
}
