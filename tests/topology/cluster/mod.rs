//! lockflight on a real Redis Cluster: 3 primaries with one replica each, started
//! once for this test binary ([`testkit::cluster::Cluster`]).
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
//! * `a_release_lost_in_a_failover_is_repeated_on_the_new_primary`: releases the
//!   killed primary acknowledged but never replicated are repeated on the
//!   promoted replica: the keys are free within 10 s, not one 30 s TTL.
//! * `wakeup_latency_cluster_vs_single`: p50 within one RTT + 1 ms of one server.
//! * `a_waiting_instance_revokes_an_idle_cached_lease_on_each_shard`: a cached
//!   lease (60 s linger) is released at once when another instance queues.
//! * `leases_renew_per_primary_and_a_deleted_one_is_lost_alone`: 480 leases in
//!   some 470 slots renew with about one script call per primary and scan;
//!   deleted ones are lost alone.
//! * `a_lease_whose_slot_moves_keeps_being_renewed`, `a_primary_out_of_memory_still_renews_its_leases`:
//!   a stale slot map, and a primary that refuses the cross-slot script, cost a
//!   second call, not a lease.
//! * `renewals_do_not_wait_for_the_slot_map`: a primary that answers no client
//!   delays the slot map's read, never a renewal.
//! * `pubsub_classic_vs_sharded`: the measurement behind the choice of classic
//!   pub/sub for wake-ups (printed; both must deliver).
mod counter;
mod failover;
mod latency;
mod migration;
mod renewal;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lockflight::{FencingToken, Handoff, LockKey, Locker, RedisBackend};
use redis::cluster_async::ClusterConnection;
use testkit::cluster::{Cluster, NodeInfo};
use testkit::{
    AllThree, RedisServer, assert_strictly_increasing, backend_at, counter_value, increment,
    join_all, takes_all_three_after, unique_prefix, wait_idle, wait_until, within,
};

use tokio::task::JoinSet;

/// How long a test waits for its lockers' local activity to end.
const IDLE: Duration = Duration::from_secs(10);

static CLUSTER: OnceLock<Cluster> = OnceLock::new();
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cluster() -> &'static Cluster {
    CLUSTER.get_or_init(Cluster::start)
}

/// The cluster, for this test alone (hold the guard), once it is healthy.
async fn cluster_for_this_test() -> (tokio::sync::MutexGuard<'static, ()>, &'static Cluster) {
    let serial = SERIAL.lock().await;
    let c = cluster();
    c.wait_ok(Duration::from_secs(30)).await;
    (serial, c)
}

async fn backend(prefix: &str) -> RedisBackend {
    RedisBackend::cluster(cluster().urls())
        .prefix(prefix)
        .connect()
        .await
        .expect("connect to the cluster")
}

/// A new prefix (from `name`) and two instances on the cluster under it.
async fn two_instances(name: &str) -> (String, RedisBackend, RedisBackend) {
    let prefix = unique_prefix(name);
    let (a, b) = (backend(&prefix).await, backend(&prefix).await);
    (prefix, a, b)
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
async fn key_per_shard(stem: &str) -> Vec<(LockKey, NodeInfo)> {
    let primaries = cluster().primaries().await;
    let mut out: Vec<Option<LockKey>> = vec![None; primaries.len()];
    for i in 0.. {
        let key = LockKey::from(format!("{stem}{i}"));
        let slot = slot_of(&key);
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

/// The counter's name under the test's `prefix`, in the key's hash tag (so on
/// the key's shard): each test counts apart from every other on the shared cluster.
fn counter_name(prefix: &str, key: &LockKey) -> Vec<u8> {
    [&testkit::names::lock(prefix, key)[..], b":counter"].concat()
}

/// The Cluster slot of every Redis name of `key`: they share the key's hash tag,
/// whatever the prefix.
fn slot_of(key: &LockKey) -> u16 {
    Cluster::slot(&testkit::names::lock("any", key))
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

/// The critical sections of a counter workload on one key, cloned into each task:
/// the counter's name, a data connection, who is inside, and the fencing tokens in
/// the order the sections entered.
#[derive(Clone)]
struct CounterSection {
    name: Vec<u8>,
    data: ClusterConnection,
    inside: Arc<AtomicUsize>,
    tokens: Arc<Mutex<Vec<FencingToken>>>,
}

impl CounterSection {
    fn new(name: Vec<u8>, data: ClusterConnection) -> CounterSection {
        CounterSection {
            name,
            data,
            inside: Arc::default(),
            tokens: Arc::default(),
        }
    }

    /// One critical section under the lock whose fencing token is `token`: enters
    /// (panics on an overlap), records `token`, and increments the counter by a
    /// read-modify-write with `pause` between the GET and the SET.
    async fn increment(&mut self, token: FencingToken, pause: impl Future<Output = ()>) {
        let _in = Exclusive::enter(&self.inside);
        self.tokens.lock().unwrap().push(token);
        increment(&mut self.data, &self.name, pause).await;
    }

    /// The fencing tokens so far, in the order the sections entered.
    fn tokens(&self) -> Vec<FencingToken> {
        self.tokens.lock().unwrap().clone()
    }
}

/// `RedisBackend::from_cluster_client`: lockflight's commands go through the
/// application's `ClusterClient` with its own options (here an ACL user's
/// credentials set on the client builder, not in the URLs), lockflight's pub/sub
/// connections through the nodes given beside it; the lease lands on the key's
/// primary under the builder's prefix with the locker's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_client_of_the_application_carries_the_locks() {
    let (_serial, c) = cluster_for_this_test().await;
    for node in c.nodes.iter().filter(|n| n.is_running()) {
        node.cmd::<()>(&[
            "ACL", "SETUSER", "lfclient", "on", ">pw", "~*", "&*", "+@all",
        ])
        .await
        .expect("ACL SETUSER on every node");
    }
    let with_credentials: Vec<String> = c
        .nodes
        .iter()
        .map(|n| format!("redis://lfclient:pw@{}/", n.hostport()))
        .collect();
    let client = |password: &str| {
        redis::cluster::ClusterClientBuilder::new(c.urls())
            .username("lfclient")
            .password(password)
            .retries(3)
            .build()
            .expect("cluster client")
    };
    let prefix = unique_prefix("cluster-client");
    let backend = RedisBackend::from_cluster_client(client("pw"), with_credentials.clone())
        .prefix(&prefix)
        .connect()
        .await
        .expect("connect through the application's cluster client");
    let locker = Locker::builder(backend.clone())
        .lease_ttl(Duration::from_secs(10))
        .build()
        .unwrap();
    let key = LockKey::from("invoice:7");
    let guard = locker.lock(key.clone()).await.unwrap();
    let name = testkit::names::lock(&prefix, &key);
    assert!(name.starts_with(format!("{prefix}:").as_bytes()));
    let owner = c.primary_of_slot(Cluster::slot(&name)).await;
    let node = c.by_addr(&owner.addr);
    let name = String::from_utf8(name).unwrap();
    assert!(
        node.has_key(&name).await,
        "the lease is on the key's primary"
    );
    let pttl: i64 = node.cmd(&["PTTL", &name]).await.unwrap();
    assert!(0 < pttl && pttl <= 10_000, "the locker's TTL: {pttl} ms");
    guard.release().await.unwrap();
    assert!(!node.has_key(&name).await, "released");

    // The client's own credentials carry the commands: a wrong password on the
    // client fails to connect, although the nodes given beside it are right.
    let refused = RedisBackend::from_cluster_client(client("wrong"), with_credentials.clone())
        .prefix(&prefix)
        .connect()
        .await;
    assert!(
        matches!(refused, Err(lockflight::Error::Connect { .. })),
        "{refused:?}"
    );
    // Bad settings are refused with a clear error.
    let bad = RedisBackend::from_cluster_client(client("pw"), ["not a url"])
        .connect()
        .await;
    assert!(
        matches!(&bad, Err(lockflight::Error::InvalidConfig { .. }))
            && bad
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("from_cluster_client"),
        "{bad:?}"
    );
    let acked = RedisBackend::from_cluster_client(client("pw"), with_credentials)
        .replica_ack(1, Duration::from_millis(100))
        .connect()
        .await;
    assert!(
        matches!(acked, Err(lockflight::Error::InvalidConfig { .. })),
        "{acked:?}"
    );
}
