//! Leader election against a real Redis: separate `RedisBackend`s on one server
//! are separate instances.
//!
//! * At most one leader at any instant among 3 instances × 2 local candidates,
//!   over many terms, with terms strictly increasing (an oracle flag and the last
//!   term, shared by every candidate).
//! * A resignation wakes the waiting instance once: it leads after exactly one more
//!   acquire (request counts, not time).
//! * A leader cut off by a black hole sees its loss no later than its validity ends,
//!   and the next leader is elected only after; its fenced write is then refused;
//!   `leader()` and `observe()` follow the failover.
//! * An observer in an instance that is not a candidate sees each change of the
//!   leader by its message, far sooner than its periodic re-read (once per lease
//!   TTL) could explain; after its subscription was cut while the leader changed,
//!   it re-reads once it has subscribed again.
//! * `run` drops the leader's work on loss and campaigns again.
//! * A candidate behind a lease nobody renews asks a handful of times before it
//!   leads, whatever the TTL (ignored: it asks about once a second on Redis).
//!
//! Waits are bounded by generous limits ([`TOLD`]) only to fail instead of hanging;
//! [`ANNOUNCED`] bounds what a message must explain.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockflight::backend::{LockBackend, LockKind};
use lockflight::election::{LeaderInfo, Leadership, Observation, Observed};
use lockflight::fence::{Fenced, FencedKey};
use lockflight::{FencingToken, Locker, RedisBackend};
use testkit::nemesis::client_kill;
use testkit::{
    Counting, CountingProxy, RedisServer, channel_subscribed, count_reaches, numsub, shared_scene,
    unique_prefix, wait_until, within,
};
use tokio::time::Instant;

/// A limit that only a hang reaches.
const TOLD: Duration = Duration::from_secs(30);
/// How soon an observer sees a change that was announced to it: a few seconds on
/// a loaded machine, far below the observer's lease TTL ([`OBSERVER_TTL`]) and its
/// renewal interval, so that only a message (or a re-read on reconnect) explains it.
const ANNOUNCED: Duration = Duration::from_secs(5);
/// The observing instance's lease TTL: its periodic re-read comes no sooner.
const OBSERVER_TTL: Duration = Duration::from_secs(60);
/// How late a loss may be signalled after the end of the validity, on a loaded
/// machine (as the black-hole fault test allows).
const LATE: Duration = Duration::from_millis(500);

async fn backend(url: String, prefix: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .prefix(prefix)
        .connect()
        .await
        .expect("connect")
}

fn locker(backend: impl lockflight::backend::LockBackend, ttl: Duration) -> Locker {
    Locker::builder(backend)
        .lease_ttl(ttl)
        .renew_every(ttl / 4)
        .wait_timeout(Duration::from_secs(5))
        .build()
        .expect("valid settings")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_terms_increase() {
    let (server, _log, prefix) = shared_scene("election-one");
    let leading = Arc::new(AtomicBool::new(false));
    let last = Arc::new(Mutex::new(FencingToken::default()));
    let terms = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    let mut lockers = Vec::new();
    for i in 0..3 {
        let locker = locker(
            backend(server.url(), &prefix).await,
            Duration::from_secs(10),
        );
        let election = locker.election("scheduler");
        lockers.push(locker);
        for j in 0..2 {
            let me = format!("instance-{i}-candidate-{j}");
            let election = election.clone().identity(me.clone());
            let (leading, last, terms) = (leading.clone(), last.clone(), terms.clone());
            tasks.spawn(async move {
                for _ in 0..5 {
                    let leadership = election.campaign().await.expect("campaign");
                    assert!(
                        !leading.swap(true, Ordering::SeqCst),
                        "{me} leads while another leader is valid"
                    );
                    {
                        let mut last = last.lock().unwrap();
                        assert!(leadership.fencing_token() > *last, "term did not increase");
                        *last = leadership.fencing_token();
                    }
                    let seen = election.leader().await.unwrap().expect("a leader");
                    assert_eq!(
                        (seen.identity.as_str(), seen.term),
                        (me.as_str(), leadership.fencing_token())
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    assert!(!leadership.is_lost());
                    leading.store(false, Ordering::SeqCst);
                    terms.fetch_add(1, Ordering::Relaxed);
                    leadership.resign().await.expect("resign");
                }
            });
        }
    }
    within(TOLD * 4, "every candidate's terms", async {
        while let Some(done) = tasks.join_next().await {
            done.expect("a candidate panicked");
        }
    })
    .await;
    assert_eq!(terms.load(Ordering::Relaxed), 30);
    for locker in &lockers {
        assert_eq!(locker.stats().keys_in_use, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resign_grants_the_lead_to_the_next_instance_with_no_second_acquire() {
    let (server, _log, prefix) = shared_scene("election-resign");
    let ttl = Duration::from_secs(60);
    let a = locker(backend(server.url(), &prefix).await, ttl);
    let b_redis = backend(server.url(), &prefix).await;
    let (b_backend, b_counts) = Counting::new(b_redis.clone());
    let b = locker(b_backend, ttl);
    let leadership = a.election("relay").identity("a").campaign().await.unwrap();
    let b_election = b.election("relay").identity("b");
    let next = tokio::spawn({
        let b_election = b_election.clone();
        async move { b_election.campaign().await }
    });
    within(
        TOLD,
        "B's first (busy) acquire",
        count_reaches(&b_counts.acquire, 1),
    )
    .await;
    // The busy reply came back: B waits for its wake-up.
    testkit::eventually("B watches for its wake-up", || async {
        b_redis.signals().watchers(LockKind::Mutex, b"relay") >= 1
    })
    .await;
    assert!(!next.is_finished());
    let a_term = leadership.fencing_token();
    leadership.resign().await.unwrap();
    let b_leads = within(TOLD, "B leads after A resigned", next)
        .await
        .unwrap()
        .unwrap();
    assert!(b_leads.fencing_token() > a_term);
    assert_eq!(
        (b_counts.acquire.load(Ordering::SeqCst), b.stats().grants),
        (1, 1),
        "B should lead on A's release's grant: one busy acquire, no second"
    );
    let seen = b_election.leader().await.unwrap().unwrap();
    assert_eq!(
        (seen.identity.as_str(), seen.term),
        ("b", b_leads.fencing_token())
    );
    b_leads.resign().await.unwrap();
    assert_eq!(b_election.leader().await.unwrap(), None);
    assert_eq!((a.stats().keys_in_use, b.stats().keys_in_use), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_learns_first_and_its_fenced_write_is_refused() {
    let (server, _log, prefix) = shared_scene("election-blackhole");
    let ttl = Duration::from_secs(2);
    let proxy = CountingProxy::start(server).await;
    let a = locker(backend(proxy.url(), &prefix).await, ttl);
    let b = locker(backend(server.url(), &prefix).await, ttl);
    let mut data = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let resource = FencedKey::new(format!("{prefix}:schedule")).unwrap();

    let a_leads = a.election("cron").identity("a").campaign().await.unwrap();
    let a_term = a_leads.fencing_token();
    assert!(
        resource
            .set(&mut data, a_term, "a")
            .await
            .unwrap()
            .is_applied()
    );
    let b_election = b.election("cron").identity("b");
    let mut observed = b_election.observe();
    observes(&mut observed, TOLD, "B observes A", |l| {
        l.is_some_and(|l| l.identity == "a")
    })
    .await;

    let a_lost = tokio::spawn({
        let loss = a_leads.loss_signal();
        async move {
            loss.lost().await;
            Instant::now()
        }
    });
    let b_gained = tokio::spawn({
        let b_election = b_election.clone();
        async move {
            let leadership = b_election.campaign().await.unwrap();
            (Instant::now(), leadership)
        }
    });
    proxy.blackhole(true);
    let known_until = Instant::now() + a_leads.valid_for();
    let lost_at = within(TOLD, "A's loss", a_lost).await.unwrap();
    let (gained_at, b_leads) = within(TOLD, "B leads", b_gained).await.unwrap();
    assert!(
        lost_at <= known_until + LATE,
        "A learnt of its loss after its validity"
    );
    assert!(lost_at <= gained_at, "B was elected before A knew it lost");
    assert!(b_leads.fencing_token() > a_term);

    assert!(
        resource
            .set(&mut data, b_leads.fencing_token(), "b")
            .await
            .unwrap()
            .is_applied()
    );
    assert!(matches!(
        resource.set(&mut data, a_term, "a again").await.unwrap(),
        Fenced::Stale { .. }
    ));
    let b_term = b_leads.fencing_token();
    observes(&mut observed, TOLD, "B observes itself", |l| {
        l.is_some_and(|l| l.identity == "b" && l.term == b_term)
    })
    .await;
    let seen = b_election.leader().await.unwrap().unwrap();
    assert_eq!((seen.identity.as_str(), seen.term), ("b", b_term));

    b_leads.resign().await.unwrap();
    drop(a_leads);
    proxy.blackhole(false);
}

/// Drops the work's marker: tells the test that the work was dropped.
struct Dropped(Arc<AtomicU64>);

impl Drop for Dropped {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_drops_the_work_on_loss_and_campaigns_again() {
    let (server, _log, prefix) = shared_scene("election-run");
    let ttl = Duration::from_secs(2);
    let proxy = CountingProxy::start(server).await;
    let a = locker(backend(proxy.url(), &prefix).await, ttl);
    let b = locker(backend(server.url(), &prefix).await, ttl);
    let started = Arc::new(AtomicU64::new(0));
    let dropped = Arc::new(AtomicU64::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let runner = tokio::spawn({
        let election = a.election("outbox").identity("a");
        let (started, dropped, terms) = (started.clone(), dropped.clone(), terms.clone());
        async move {
            election
                .run(move |leader, _loss| {
                    let marker = Dropped(dropped.clone());
                    started.fetch_add(1, Ordering::SeqCst);
                    terms.lock().unwrap().push(leader.term);
                    async move {
                        let _marker = marker;
                        std::future::pending::<()>().await
                    }
                })
                .await
        }
    });
    within(TOLD, "A's work starts", count_reaches(&started, 1)).await;
    proxy.blackhole(true);
    within(TOLD, "A's work is dropped", count_reaches(&dropped, 1)).await;
    let b_leads = within(
        TOLD,
        "B leads",
        b.election("outbox").identity("b").campaign(),
    )
    .await
    .unwrap();
    proxy.blackhole(false);
    assert_eq!(
        started.load(Ordering::SeqCst),
        1,
        "A's work restarted while B leads"
    );
    b_leads.resign().await.unwrap();
    within(TOLD, "A's work starts again", count_reaches(&started, 2)).await;
    let terms = terms.lock().unwrap().clone();
    assert!(terms[1] > terms[0]);
    runner.abort();
    let _ = runner.await;
}

/// `locker`'s candidate `identity` campaigns for the `compactor` election and leads.
async fn leads(locker: &Locker, identity: &str) -> Leadership {
    locker
        .election("compactor")
        .identity(identity)
        .campaign()
        .await
        .unwrap()
}

/// Takes the items of `observation` (within `limit`) until one names a leader
/// `names` accepts, or nobody if it accepts `None`.
async fn observes(
    observation: &mut Observation,
    limit: Duration,
    what: &str,
    names: impl Fn(Option<&LeaderInfo>) -> bool,
) {
    within(limit, what, async {
        loop {
            match observation.next().await.expect("the observation ended") {
                Observed::Leader(l) if names(Some(&l)) => return,
                Observed::NoLeader if names(None) => return,
                _ => {}
            }
        }
    })
    .await
}

/// Waits (within [`ANNOUNCED`]) until `seen` names `leader` (identity and term), or
/// nobody for `None`.
async fn sees(seen: &mut Observation, what: &str, leader: Option<(&str, FencingToken)>) {
    observes(seen, ANNOUNCED, what, |l| match (l, leader) {
        (Some(l), Some((identity, term))) => l.identity == identity && l.term == term,
        (None, None) => true,
        _ => false,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_elsewhere_sees_each_change_by_its_message() {
    let (server, _log, prefix) = shared_scene("election-observe");
    let a = locker(backend(server.url(), &prefix).await, OBSERVER_TTL);
    let b = locker(backend(server.url(), &prefix).await, OBSERVER_TTL);
    // Not a candidate: a locker of its own, on a backend of its own.
    let c = locker(backend(server.url(), &prefix).await, OBSERVER_TTL);
    let mut seen = c.election("compactor").observe();

    let a_leads = leads(&a, "a").await;
    let a_term = a_leads.fencing_token();
    sees(&mut seen, "C sees A lead", Some(("a", a_term))).await;

    a_leads.resign().await.unwrap();
    sees(&mut seen, "C sees A resign", None).await;

    let b_leads = leads(&b, "b").await;
    let b_term = b_leads.fencing_token();
    assert!(b_term > a_term);
    sees(
        &mut seen,
        "C sees B lead in a greater term",
        Some(("b", b_term)),
    )
    .await;

    b_leads.resign().await.unwrap();
    sees(&mut seen, "C sees B resign", None).await;
    drop(seen);
    for locker in [&a, &b, &c] {
        assert_eq!(locker.stats().keys_in_use, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_reads_again_after_its_subscription_restarts() {
    // Its own server: the test kills every pub/sub connection on it.
    let server = RedisServer::start();
    let _log = server.log_on_panic();
    let prefix = unique_prefix("election-observe-restart");
    let a = locker(backend(server.url(), &prefix).await, OBSERVER_TTL);
    let b = locker(backend(server.url(), &prefix).await, OBSERVER_TTL);
    // The observer talks to the server through a proxy, which holds its
    // connections (a new subscription too) while the leader changes.
    let proxy = CountingProxy::start(&server).await;
    let c_backend = backend(proxy.url(), &prefix).await;
    let c_channel = testkit::names::channel(&prefix, c_backend.instance_id());
    let c = locker(c_backend, OBSERVER_TTL);

    // A leads before C observes: C's first read sees A, and no message for C is
    // on its way that could have C read again later.
    let a_leads = leads(&a, "a").await;
    let a_term = a_leads.fencing_token();
    let mut seen = c.election("compactor").observe();
    sees(&mut seen, "C sees A lead", Some(("a", a_term))).await;

    // C's subscription ends at the server, and C cannot subscribe again yet:
    // every message of the change below is lost to it.
    proxy.blackhole(true);
    let mut admin = server.connection().await;
    client_kill(&mut admin, "pubsub", TOLD)
        .await
        .expect("CLIENT KILL TYPE pubsub answered");
    assert!(
        wait_until(TOLD, || {
            let mut admin = admin.clone();
            let channel = c_channel.clone();
            async move { numsub(&mut admin, &channel).await == 0 }
        })
        .await,
        "C's subscription is still there"
    );
    a_leads.resign().await.unwrap();
    let b_leads = leads(&b, "b").await;
    let b_term = b_leads.fencing_token();
    assert!(b_term > a_term);

    // C subscribes again and reads the record then, long before its periodic
    // re-read.
    proxy.blackhole(false);
    assert!(
        channel_subscribed(&admin, &c_channel, 1, TOLD).await,
        "C did not subscribe again"
    );
    sees(
        &mut seen,
        "C sees B lead after it subscribed again",
        Some(("b", b_term)),
    )
    .await;

    b_leads.resign().await.unwrap();
    sees(&mut seen, "C sees B resign", None).await;
}

/// A leader that stops renewing (killed, or cut off) leaves its lease at the
/// backend until its TTL. A candidate waiting behind it asks again when the lease
/// ends and at its pace (a third of the TTL), a handful of times whatever the TTL,
/// not once per second (request counts, not time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_behind_an_abandoned_lease_asks_a_few_times_per_ttl() {
    let (server, _log, prefix) = shared_scene("election-abandoned");
    let ttl = Duration::from_secs(12);
    let proxy = CountingProxy::start(server).await;
    let a = locker(backend(proxy.url(), &prefix).await, ttl);
    let (b_backend, b_counts) = Counting::new(backend(server.url(), &prefix).await);
    let b = locker(b_backend, ttl);
    let a_leads = a
        .election("archiver")
        .identity("a")
        .campaign()
        .await
        .unwrap();
    let a_term = a_leads.fencing_token();
    // Nothing of A reaches Redis any more: its lease stays until its TTL.
    proxy.blackhole(true);
    let b_leads = within(
        TOLD,
        "B leads once A's lease expired",
        b.election("archiver").identity("b").campaign(),
    )
    .await
    .unwrap();
    assert!(b_leads.fencing_token() > a_term);
    let [acquires, _, _, leaves] = b_counts.snapshot();
    // Paces of a third of the TTL (at least 3 s each) within the lease's
    // remaining TTL (at most 12 s): four asks, and one when the lease ends.
    assert!(
        acquires <= 6,
        "B asked {acquires} times (and left the queue {leaves} times) behind an \
         abandoned lease of TTL {ttl:?}"
    );
    b_leads.resign().await.unwrap();
    drop(a_leads);
    proxy.blackhole(false);
}
