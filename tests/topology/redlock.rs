//! Integration tests of [`RedlockBackend`] over 5 real `redis-server` processes on
//! loopback: mutual exclusion under contention, availability for every subset of
//! stopped nodes (`Error::QuorumNotReached`), a key deleted behind the holder's back,
//! a node restarted empty with and without the delayed-restart rule, lost replies on
//! a minority of nodes, a failed round's release delayed past a later round, and
//! fencing tokens across restarts.
//!
//! Two sets of 5 servers per test binary: [`calm`] is never disturbed (each test
//! uses its own prefix); [`stormy`] is paused, restarted and flushed, so the tests
//! that use it take the [`STORM`] lock and run one at a time.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lockflight::{
    Error, FencingToken, Handoff, LockKey, Locker, LockerBuilder, backend::RedlockBackend,
    error::Phase,
};
use redis::aio::MultiplexedConnection;
use testkit::fault_proxy::{CommandMatcher, FaultProxy};
use testkit::{
    RedisServer, assert_strictly_increasing, counter_value, increment, unique_prefix, wait_until,
    within,
};
use tokio::task::JoinSet;
use tokio::time::Instant;

const NODES: usize = 5;

fn five() -> Vec<RedisServer> {
    (0..NODES).map(|_| RedisServer::start()).collect()
}

/// 5 servers that no test disturbs.
fn calm() -> &'static [RedisServer] {
    static CALM: OnceLock<Vec<RedisServer>> = OnceLock::new();
    CALM.get_or_init(five)
}

/// 5 servers that tests pause, restart and flush, one test at a time (hold
/// [`STORM`]).
fn stormy() -> &'static [RedisServer] {
    static STORMY: OnceLock<Vec<RedisServer>> = OnceLock::new();
    STORMY.get_or_init(five)
}

static STORM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Leaves the stormy servers running, resumed and empty.
async fn calm_down(servers: &[RedisServer]) {
    for s in servers {
        if !s.is_running() {
            s.restart();
        }
        if s.is_paused() {
            s.resume();
        }
        s.flushall().await;
    }
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

async fn backend(urls: &[String], prefix: &str, node_timeout: Duration) -> RedlockBackend {
    RedlockBackend::builder(urls.to_vec())
        .prefix(prefix)
        .node_timeout(node_timeout)
        .connect()
        .await
        .expect("connect to the 5 nodes")
}

/// A new prefix (from `name`) and `n` instances under it on the calm servers (1 s
/// node timeout).
async fn calm_instances(name: &str, n: usize) -> (String, Vec<RedlockBackend>) {
    let (urls, prefix) = (urls(calm()), unique_prefix(name));
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(backend(&urls, &prefix, Duration::from_secs(1)).await);
    }
    (prefix, out)
}

/// 3 instances on the calm servers (built by `configure`) × 40 tasks × 25 critical
/// sections on one hot key, within 50 s (`what` names the step); checks the counter
/// on node 0, and returns the lockers and the tokens in critical-section order.
async fn counter_over_five_nodes(
    name: &str,
    configure: fn(LockerBuilder) -> LockerBuilder,
    what: &str,
) -> (Vec<Locker>, Vec<FencingToken>) {
    let (prefix, backends) = calm_instances(name, 3).await;
    let counter = format!("{prefix}:counter");
    let lockers: Vec<Locker> = backends
        .into_iter()
        .map(|b| {
            configure(Locker::builder(b).wait_timeout(Duration::from_secs(60)))
                .build()
                .unwrap()
        })
        .collect();
    let mut con = calm()[0].connection().await;
    let tokens = within(
        Duration::from_secs(50),
        what,
        hammer(&lockers, "hot", &counter, &con, 40, 25),
    )
    .await;
    assert_eq!(
        counter_value(&mut con, counter.as_bytes()).await,
        3 * 40 * 25
    );
    (lockers, tokens)
}

/// Whether the lock of `key` exists on node `i`.
async fn locked_on(servers: &[RedisServer], prefix: &str, i: usize, key: &LockKey) -> bool {
    let name = testkit::names::lock(prefix, key);
    let mut con = servers[i].connection().await;
    redis::cmd("EXISTS")
        .arg(name)
        .query_async::<i64>(&mut con)
        .await
        .expect("EXISTS")
        == 1
}

/// `instances` lockers × `tasks` tasks × `iterations` critical sections on `key`,
/// each a GET + SET of a counter on node 0; returns the fencing tokens in critical
/// section order and checks the counter.
async fn hammer(
    lockers: &[Locker],
    key: &str,
    counter: &str,
    con: &MultiplexedConnection,
    tasks: usize,
    iterations: usize,
) -> Vec<FencingToken> {
    let tokens = Arc::new(Mutex::new(Vec::new()));
    let mut set = JoinSet::new();
    for locker in lockers {
        for _ in 0..tasks {
            let (locker, tokens, mut con) = (locker.clone(), Arc::clone(&tokens), con.clone());
            let (key, counter) = (key.to_owned(), counter.to_owned());
            set.spawn(async move {
                for _ in 0..iterations {
                    let guard = locker.lock(key.as_str()).await.expect("lock");
                    tokens.lock().unwrap().push(guard.fencing_token());
                    increment(&mut con, counter.as_bytes(), tokio::task::yield_now()).await;
                    guard.release().await.expect("release");
                }
            });
        }
    }
    while let Some(r) = set.join_next().await {
        r.expect("task");
    }
    std::mem::take(&mut *tokens.lock().unwrap())
}

// ---------------------------------------------------------------------------
// Mutual exclusion
// ---------------------------------------------------------------------------

/// 3 instances × 40 tasks × 25 critical sections over 5 nodes, without handoff
/// (every critical section is a Redlock acquisition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_exact_over_five_nodes() {
    let (lockers, tokens) =
        counter_over_five_nodes("counter", |b| b, "3 x 40 x 25 critical sections").await;
    assert_eq!(tokens.len(), 3000);
    assert_strictly_increasing(&tokens, "tokens");
    // Leases cached after the last sections go back when their linger ends.
    testkit::wait_idle(&lockers, Duration::from_secs(10)).await;
}

/// The same with handoff: few acquisitions, still exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_is_exact_over_five_nodes_with_handoff() {
    let (lockers, tokens) = counter_over_five_nodes(
        "counter-handoff",
        |b| b.handoff(Handoff::enabled()),
        "handoff critical sections",
    )
    .await;
    assert_strictly_increasing(&tokens, "tokens");
    let handoffs: u64 = lockers.iter().map(|l| l.stats().handoffs).sum();
    assert!(handoffs > 0, "handoff never happened");
}

// ---------------------------------------------------------------------------
// Availability: every subset of stopped nodes
// ---------------------------------------------------------------------------

/// For each of the 32 subsets of paused nodes: `try_lock` succeeds iff a majority
/// is up; otherwise `QuorumNotReached { granted: up, needed: 3 }` and nothing is
/// left locked on the live nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_succeeds_iff_a_majority_is_up() {
    let _storm = STORM.lock().await;
    let servers = stormy();
    calm_down(servers).await;
    let prefix = unique_prefix("subsets");
    let b = backend(&urls(servers), &prefix, Duration::from_millis(250)).await;
    let locker = Locker::builder(b.clone())
        .lease_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let key = LockKey::from("k");
    for down in 0u32..(1 << NODES) {
        let up: Vec<usize> = (0..NODES).filter(|i| down & (1 << i) == 0).collect();
        for (i, s) in servers.iter().enumerate() {
            if down & (1 << i) != 0 {
                s.pause();
            }
        }
        let mut result = locker.try_lock(key.clone()).await;
        if up.len() >= 3 {
            // A node slower than the node timeout on a loaded machine makes one
            // attempt fail (released, reported busy): a few attempts, bounded.
            for _ in 0..5 {
                if matches!(result, Ok(Some(_))) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
                result = locker.try_lock(key.clone()).await;
            }
            let guard = result
                .unwrap_or_else(|e| panic!("down = {down:05b}: {e}"))
                .unwrap_or_else(|| panic!("down = {down:05b}: busy"));
            guard.release().await.expect("release with a majority up");
        } else {
            match result {
                Err(Error::QuorumNotReached {
                    phase: Phase::Acquiring,
                    granted,
                    needed: 3,
                    ..
                }) => assert_eq!(granted, up.len(), "down = {down:05b}"),
                other => panic!("down = {down:05b}: expected QuorumNotReached, got {other:?}"),
            }
            for &i in &up {
                assert!(
                    !locked_on(servers, &prefix, i, &key).await,
                    "down = {down:05b}: node {i} is left locked"
                );
            }
        }
        for (i, s) in servers.iter().enumerate() {
            if down & (1 << i) != 0 {
                s.resume();
            }
        }
        // The paused nodes now run the acquire and the release queued for them.
        let settled = wait_until(Duration::from_secs(5), || async {
            for i in 0..NODES {
                if locked_on(servers, &prefix, i, &key).await {
                    return false;
                }
            }
            true
        })
        .await;
        assert!(settled, "down = {down:05b}: a lock is left behind");
    }
    // The exact case: 3 of 5 down.
    for s in &servers[..3] {
        s.pause();
    }
    match locker.try_lock(key.clone()).await {
        Err(e @ Error::QuorumNotReached { .. }) => {
            assert!(matches!(
                e,
                Error::QuorumNotReached {
                    granted: 2,
                    needed: 3,
                    ..
                }
            ));
            assert_eq!(e.code(), "quorum_not_reached");
            assert!(e.is_transient());
            assert_eq!(e.key(), Some(&key));
        }
        other => panic!("expected QuorumNotReached, got {other:?}"),
    }
    for i in 3..NODES {
        assert!(!locked_on(servers, &prefix, i, &key).await);
    }
    calm_down(servers).await;
}

// ---------------------------------------------------------------------------
// A key deleted behind the holder's back
// ---------------------------------------------------------------------------

/// A "clock jump" stand-in: node 0 loses the key early. The holder keeps its
/// majority (and renews it), and a second instance cannot reach one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_lost_on_one_node_keeps_the_quorum() {
    let servers = calm();
    let (prefix, instances) = calm_instances("clock-jump", 2).await;
    let [a, b]: [RedlockBackend; 2] = instances.try_into().unwrap();
    let ttl = Duration::from_millis(600);
    let la = Locker::builder(a.clone()).lease_ttl(ttl).build().unwrap();
    let lb = Locker::builder(b).lease_ttl(ttl).build().unwrap();
    let key = LockKey::from("k");
    let guard = la.lock(key.clone()).await.unwrap();
    let name = testkit::names::lock(&prefix, &key);
    let mut con = servers[0].connection().await;
    let _: () = redis::cmd("DEL")
        .arg(&name)
        .query_async(&mut con)
        .await
        .unwrap();
    // Past two TTLs: the holder renewed on its 4 nodes; the other instance gets at
    // most node 0.
    let until = Instant::now() + ttl * 2;
    while Instant::now() < until {
        assert!(lb.try_lock(key.clone()).await.unwrap().is_none());
        assert!(
            !guard.is_lost(),
            "the holder lost a lease it holds on 4 of 5"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    match lb
        .lock_with_options(
            key.clone(),
            lockflight::LockOptions::new().wait_timeout(ttl),
        )
        .await
    {
        Err(Error::Timeout { .. }) => {}
        other => panic!("the second instance must time out, got {other:?}"),
    }
    guard.release().await.unwrap();
    let g = within(
        Duration::from_secs(5),
        "lock after release",
        lb.lock(key.clone()),
    )
    .await
    .unwrap();
    g.release().await.unwrap();
}

// ---------------------------------------------------------------------------
// Restarts without persistence
// ---------------------------------------------------------------------------

/// Node 0 restarts empty right after A's grant on {0, 1, 2} (nodes 3 and 4 were
/// held by somebody else, whose locks then end). Returns whether B got the lock
/// while A's lease was still valid (a double grant).
async fn restart_after_grant(delayed: bool) -> bool {
    let servers = stormy();
    calm_down(servers).await;
    let prefix = unique_prefix(if delayed {
        "restart-delayed"
    } else {
        "restart"
    });
    let urls = urls(servers);
    let ttl = Duration::from_millis(1500);
    let a = backend(&urls, &prefix, Duration::from_millis(200)).await;
    let b = backend(&urls, &prefix, Duration::from_millis(200)).await;
    let la = Locker::builder(a.clone()).lease_ttl(ttl).build().unwrap();
    let lb = Locker::builder(b).lease_ttl(ttl).build().unwrap();
    let key = LockKey::from("k");
    let name = testkit::names::lock(&prefix, &key);
    for i in [3, 4] {
        let mut con = servers[i].connection().await;
        let _: () = redis::cmd("SET")
            .arg(&name)
            .arg("somebody-else")
            .arg("PX")
            .arg(10_000)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    let guard = la.lock(key.clone()).await.expect("A gets {0, 1, 2}");
    for i in [3, 4] {
        let mut con = servers[i].connection().await;
        let _: () = redis::cmd("DEL")
            .arg(&name)
            .query_async(&mut con)
            .await
            .unwrap();
    }
    servers[0].restart();
    if delayed {
        // The delayed-restart rule: node 0 stays out for one TTL.
        servers[0].pause();
    }
    let out_until = Instant::now() + ttl;
    let mut double = false;
    while Instant::now() < out_until {
        if let Ok(Some(g)) = lb.try_lock(key.clone()).await {
            double = !guard.is_lost();
            drop(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if delayed {
        assert!(!double);
        // A cannot renew on a majority ({1, 2} only): its lease ends, and only then
        // may B take the lock.
        within(ttl * 2, "A's loss", guard.lost()).await;
        servers[0].resume();
        let g = within(
            Duration::from_secs(10),
            "B after A's lease ended",
            lb.lock(key.clone()),
        )
        .await
        .expect("B locks once A's lease is over");
        g.release().await.unwrap();
    } else {
        drop(guard);
    }
    calm_down(servers).await;
    double
}

/// A node restarted empty and serving at once: the instances that knew it before
/// quarantine its grants for one TTL (the server's life gate), so no second instance
/// assembles a majority while A's lease is valid. (Before the gate: a double
/// grant, every run.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_quarantines_its_grants_for_a_ttl() {
    let _storm = STORM.lock().await;
    assert!(
        !restart_after_grant(false).await,
        "a node restarted empty let a second instance in while the first held the lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_the_delay_rule_keeps_mutual_exclusion() {
    let _storm = STORM.lock().await;
    assert!(!restart_after_grant(true).await);
}

// ---------------------------------------------------------------------------
// Lost replies on a minority of nodes
// ---------------------------------------------------------------------------

/// Matches `EVALSHA` of any script whose first key of its own is `name` (a
/// granting script is given the server's life first).
fn evalsha_first_key(name: Vec<u8>) -> CommandMatcher {
    Arc::new(move |args: &[Vec<u8>]| {
        args.len() > 3 && testkit::fault_proxy::evalsha_on(&args[1], &name)(args)
    })
}

/// Nodes 0 and 1 lose the replies of lock operations (acquire, fence write-back,
/// renew, release, applied by the server) while two instances contend: the counter
/// stays exact and no lock is held by nobody past one TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_on_a_minority_leave_nothing_behind() {
    let servers = calm();
    let prefix = unique_prefix("lost-replies");
    let p0 = FaultProxy::start(&servers[0]).await;
    let p1 = FaultProxy::start(&servers[1]).await;
    let mut faulty = vec![p0.url(), p1.url()];
    faulty.extend(servers[2..].iter().map(RedisServer::url));
    let ttl = Duration::from_millis(900);
    let a = backend(&faulty, &prefix, Duration::from_millis(500)).await;
    let b = backend(&urls(servers), &prefix, Duration::from_millis(500)).await;
    let key = LockKey::from("k");
    let name = testkit::names::lock(&prefix, &key);
    for p in [&p0, &p1] {
        p.drop_replies(evalsha_first_key(name.clone()), 6);
    }
    let lockers: Vec<Locker> = [a.clone(), b]
        .into_iter()
        .map(|x| {
            Locker::builder(x)
                .lease_ttl(ttl)
                .wait_timeout(Duration::from_secs(30))
                .build()
                .unwrap()
        })
        .collect();
    let counter = format!("{prefix}:counter");
    let mut con = servers[2].connection().await;
    let tokens = within(
        Duration::from_secs(40),
        "contention with lost replies",
        hammer(&lockers, "k", &counter, &con, 4, 10),
    )
    .await;
    assert_eq!(counter_value(&mut con, counter.as_bytes()).await, 80);
    assert_strictly_increasing(&tokens, "tokens");
    assert!(p0.dropped() + p1.dropped() > 0, "no reply was lost");
    // Every lock write landed before now: one TTL later none is left, however
    // late a loaded machine gets to look.
    tokio::time::sleep_until(Instant::now() + ttl + Duration::from_millis(200)).await;
    let mut held = Vec::new();
    for i in 0..NODES {
        if locked_on(servers, &prefix, i, &key).await {
            held.push(i);
        }
    }
    assert!(
        held.is_empty(),
        "a lock held by nobody outlived one TTL on nodes {held:?}"
    );
}

// ---------------------------------------------------------------------------
// The rounds of one acquire
// ---------------------------------------------------------------------------

/// Matches the release script run on the lock `lock` (seven keys, the fourth a
/// release record): a failed round's release of what it took, or a lease's
/// release; never an acquire (seven keys too, the first its gate's life key).
fn release_of(lock: Vec<u8>) -> CommandMatcher {
    let record = [&lock[..], b":rel:"].concat();
    Arc::new(move |args: &[Vec<u8>]| {
        args.len() > 6
            && args[0].eq_ignore_ascii_case(b"EVALSHA")
            && args[2] == b"7"
            && args[3] == lock
            && args[6].starts_with(&record)
    })
}

/// Sets the lock `name` on `server` to a token of an instance that does not
/// exist (a holder that never releases), or deletes it.
async fn foreign_hold(server: &RedisServer, name: &[u8], held: bool) {
    let mut con = server.connection().await;
    let cmd = if held {
        redis::cmd("SET")
            .arg(name)
            .arg("f".repeat(32))
            .arg("PX")
            .arg(60_000)
            .clone()
    } else {
        redis::cmd("DEL").arg(name).clone()
    };
    let _: redis::Value = cmd.query_async(&mut con).await.expect("SET or DEL");
}

/// A round of A's acquire takes node 0 only (another instance holds nodes 1 and
/// 2) and releases it; that release is held back on the wire. Node 1 frees up, a
/// later round of the same acquire is granted on nodes 0 and 1, and the held-back
/// release lands on node 0. It must not delete A's lease there: each round asks
/// with a token of its own, released with its record, so the late release names a
/// lease nobody holds. Then node 2 frees up too, and B must still be refused while
/// A holds the lock. (Before, every round asked with the lease's one token and a
/// failed round's release wrote no record: the late release deleted A's lease on
/// node 0, the lease rested on node 1 alone, and B took nodes 0 and 2 while A held
/// the lock.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rounds_late_release_cannot_delete_a_later_rounds_lease() {
    /// How long the proxy holds the first round's release back.
    const DELAY: Duration = Duration::from_secs(2);
    /// Long enough that nothing expires or is renewed during the test.
    const LONG_TTL: Duration = Duration::from_secs(30);
    let servers = &calm()[..3];
    let prefix = unique_prefix("late-round-release");
    let key = LockKey::from("k");
    let name = testkit::names::lock(&prefix, &key);
    let p0 = FaultProxy::start(&servers[0]).await;
    let through_proxy = vec![p0.url(), servers[1].url(), servers[2].url()];
    let a = backend(&through_proxy, &prefix, Duration::from_secs(1)).await;
    let b = backend(&urls(servers), &prefix, Duration::from_secs(1)).await;
    let [la, lb] = [a, b].map(|x| {
        Locker::builder(x)
            .lease_ttl(LONG_TTL)
            .wait_timeout(Duration::from_secs(20))
            .build()
            .unwrap()
    });

    for s in &servers[1..] {
        foreign_hold(s, &name, true).await;
    }
    p0.record(true);
    p0.delay_requests(release_of(name.clone()), 1, DELAY);
    let taking = tokio::spawn({
        let (la, key) = (la.clone(), key.clone());
        async move { la.lock(key).await }
    });
    let held_back = wait_until(Duration::from_secs(10), || {
        let matcher = release_of(name.clone());
        let recorded = p0.recorded();
        async move { recorded.iter().any(|c| matcher(c)) }
    })
    .await;
    assert!(held_back, "A's first round released nothing on node 0");
    foreign_hold(&servers[1], &name, false).await;

    let guard = within(Duration::from_secs(20), "A's lock", taking)
        .await
        .expect("A's task")
        .expect("A locks once node 1 is free");
    let granted_first = p0.delayed_applied() == 0;
    let landed = wait_until(DELAY * 10, || async { p0.delayed_applied() >= 1 }).await;
    assert!(landed, "the held-back release never reached node 0");
    println!(
        "A was granted {} the first round's release landed",
        if granted_first { "before" } else { "after" }
    );
    let on_node_0 = locked_on(servers, &prefix, 0, &key).await;

    foreign_hold(&servers[2], &name, false).await;
    let rival = lb.try_lock(key.clone()).await.expect("B's try_lock");
    assert!(
        rival.is_none(),
        "B took the lock while A holds it: two holders (A's lease on node 0 \
         {}deleted by the first round's late release)",
        if on_node_0 { "not " } else { "" }
    );
    assert!(
        on_node_0,
        "the first round's late release deleted A's lease on node 0"
    );
    assert!(!guard.is_lost(), "A's lease is intact");
    guard.release().await.expect("A's release");
    let next = within(Duration::from_secs(10), "B's lock", lb.lock(key)).await;
    next.expect("B locks after A's release")
        .release()
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------
// Fencing across restarts
// ---------------------------------------------------------------------------

/// Tokens accepted by a fenced resource strictly increase over the whole run:
/// contention phases separated by node restarts (each kept out for one TTL) and a
/// flush of a majority's data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_increase_across_restarts() {
    let _storm = STORM.lock().await;
    let servers = stormy();
    calm_down(servers).await;
    let prefix = unique_prefix("fencing");
    let urls = urls(servers);
    let ttl = Duration::from_millis(800);
    let mut lockers = Vec::new();
    for _ in 0..2 {
        let b = backend(&urls, &prefix, Duration::from_millis(500)).await;
        lockers.push(
            Locker::builder(b)
                .lease_ttl(ttl)
                .wait_timeout(Duration::from_secs(30))
                .handoff(Handoff::enabled().max_consecutive(4))
                .build()
                .unwrap(),
        );
    }
    let counter = format!("{prefix}:counter");
    let mut all = Vec::new();
    let disturb: [&[usize]; 4] = [&[0], &[1, 2], &[0, 3, 4], &[]];
    for (phase, nodes) in disturb.iter().enumerate() {
        // The counter lives on a node that this phase does not restart.
        let home = (0..NODES).find(|i| !nodes.contains(i)).unwrap();
        let con = servers[home].connection().await;
        all.extend(hammer(&lockers, "k", &counter, &con, 4, 10).await);
        for &i in *nodes {
            servers[i].restart();
            servers[i].pause();
        }
        tokio::time::sleep(ttl).await;
        for &i in *nodes {
            servers[i].resume();
        }
        tracing::debug!(phase, "fencing phase done");
    }
    assert_eq!(all.len(), 4 * 2 * 4 * 10);
    assert_strictly_increasing(&all, "tokens");
    calm_down(servers).await;
}

// ---------------------------------------------------------------------------
// Wake-ups
// ---------------------------------------------------------------------------

/// A waiting instance is woken by the holder's release through the key's wake
/// node, well before its retry timer (the queue-entry refresh, 1 s) would fire; the
/// waiter was queued on the wake node only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiting_instance_at_once() {
    let servers = calm();
    let (prefix, instances) = calm_instances("wake", 2).await;
    let [a, b]: [RedlockBackend; 2] = instances.try_into().unwrap();
    let la = Locker::builder(a.clone()).build().unwrap();
    let lb = Locker::builder(b.clone()).build().unwrap();
    let key = LockKey::from("k");
    let mut wake_ups = Vec::new();
    for round in 0..5 {
        let guard = la.lock(key.clone()).await.unwrap();
        let waiter = {
            let (lb, key) = (lb.clone(), key.clone());
            tokio::spawn(async move {
                let g = lb.lock(key).await.expect("B locks");
                let at = Instant::now();
                g.release().await.unwrap();
                at
            })
        };
        // B is queued: exactly one node holds a queue entry for it.
        let queued = wait_until(Duration::from_secs(5), || async {
            let mut entries = 0;
            for server in servers {
                let q = testkit::names::queue(&prefix, &key);
                let mut con = server.connection().await;
                let n: i64 = redis::cmd("ZCARD")
                    .arg(&q)
                    .query_async(&mut con)
                    .await
                    .unwrap();
                entries += n;
            }
            entries == 1
        })
        .await;
        assert!(queued, "round {round}: B is not queued on exactly one node");
        let released = Instant::now();
        guard.release().await.unwrap();
        let acquired = within(Duration::from_secs(5), "B's lock", waiter)
            .await
            .unwrap();
        wake_ups.push(acquired.saturating_duration_since(released));
    }
    wake_ups.sort();
    let median = wake_ups[wake_ups.len() / 2];
    assert!(
        median < Duration::from_millis(300),
        "B woke after {wake_ups:?}: the release did not wake it"
    );
}

/// Redlock keeps no leader records: a campaign is refused with
/// `Error::Unsupported` (the matrix of `guide::topology`), and the key it took to campaign is
/// released, so another instance locks it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_is_refused_and_leaves_nothing_locked() {
    let (_, instances) = calm_instances("election", 2).await;
    let [a, b]: [RedlockBackend; 2] = instances.try_into().unwrap();
    let la = Locker::builder(a).build().unwrap();
    let lb = Locker::builder(b).build().unwrap();
    let refused = la.election("leader").identity("a").campaign().await;
    assert!(
        matches!(refused, Err(Error::Unsupported { .. })),
        "{refused:?}"
    );
    let next = within(Duration::from_secs(10), "B's lock", lb.lock("leader")).await;
    next.expect("the campaign's key is free")
        .release()
        .await
        .unwrap();
}
