//! The test kit's fault knobs and their real-Redis twins: each scenario is written
//! **once**, over a [`Rig`] that is either the kit's [`SimServer`] or a real
//! server behind fault proxies, and asserts the same observable outcome on both.
//! Both run on the real clock with 1 s leases, so no assertion is a tight
//! wall-clock bound: outcomes, counts, and generous upper bounds (the TTL plus
//! 5 s).
//!
//! Instance A meets the fault; instance B (on Redis: straight to the server)
//! looks at the key. On Redis a [`FaultProxy`] in front of A produces the
//! request faults (it learns the acquire, renewal and release scripts' hashes by
//! watching one lock), and a [`CountingProxy`] (the hole) black-holes a hanging
//! server and the instances whose messages are lost or late: a server pushes a
//! message on the receiver's subscription, which shares the commands' address,
//! and loses one only with that connection.
//!
//! | knob | twin (`<twin>::kit`, `<twin>::redis`) | on Redis | outcome on both |
//! |---|---|---|---|
//! | `lose_reply(Op::Renew)` | [`a_lost_renewal_reply_keeps_the_lease`] | the proxy loses the reply of the next renewal's `EVALSHA` | the lease is kept, B cannot take the key |
//! | `fail(Op::Renew)` | [`lost_renewals_lose_the_lease_at_its_ttl`] | the proxy loses every renewal request | the loss signal fires, `with_lock` ends with `LeaseLost`, B takes the key |
//! | `lose_reply(Op::Acquire)` | [`a_lost_acquire_reply_is_repeated_and_the_lock_held`] | the proxy loses the reply of the next acquire | the acquire is sent twice and the lock is held |
//! | `fail(Op::Release)` | [`lost_releases_free_the_key_at_the_ttl`] | the proxy loses every release request | the release is an error, the key is busy until the TTL, then free |
//! | `unreachable_for` | [`an_unreachable_server_fails_requests_until_the_deadline`] | the proxy loses every request until the deadline | no answer during the outage, the lock once it ends, nothing taken by the failed requests |
//! | `hang_for` | [`a_hanging_server_serves_requests_when_it_heals`] | a black hole in front of both instances | the held lease is lost, a request made during the outage is served after it |
//! | `drop_message(Message::Wakeup)` | [`a_dropped_wakeup_makes_the_waiter_late`] | the waiter's connections are black-holed over the release and then reset, the message with them | the waiter is late (on the kit its timer wakes it; on Redis its subscription is made again and wakes every waiter) and gets the key |
//! | `delay_message(Message::Wakeup, _)` | [`a_delayed_wakeup_makes_the_waiter_late`] | the waiter's connections are black-holed over the release for the delay | the waiter is woken late and gets the key |
//! | `drop_message(Message::Revocation)` | [`a_dropped_revocation_keeps_a_cached_lease_until_its_linger`] | the caching holder's connections are black-holed while another instance queues, then reset | the cached lease is kept until its linger ends, then the other instance gets the key |
//! | `delay_message(Message::Revocation, _)` | [`a_delayed_revocation_gives_up_a_cached_lease_late`] | the caching holder's connections are black-holed for the delay while another instance queues | the cached lease is given up after the delay, well before its linger ends |
//!
//! The other knobs' twins are conformance cells (`tests/conformance`):
//! `lose_reply(Op::Release)` in `release::truthful_release_after_a_lost_reply`,
//! `lose_lease` in `loss::a_deleted_lease_is_signalled_lost`, `restart` in
//! `release::release_after_a_restart_reports_the_loss`. The kit's fenced
//! resource, `SimFencedKey`, and its knob `lose_reply(Op::Fenced)` have theirs
//! in `tests/locks/fence/cases.rs`: every fenced-write case runs on `FencedKey` and on
//! the kit.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockflight::testing::{Message, Op, SimServer};
use lockflight::{Error, Handoff, LockKey, Locker};
use testkit::fault_proxy::{CommandMatcher, FaultProxy, any_command, evalsha_on};
use testkit::{
    CountingProxy, RedisServer, backend_at, eventually, unique_prefix, wait_until, within,
};

/// The lease TTL of every twin (renewed about every third of it).
const TTL: Duration = Duration::from_secs(1);
/// The generous bound of a step that the scenario expects "by the TTL".
const SLACK: Duration = Duration::from_secs(5);
/// How long a dropped wake-up is held in the hole before it is thrown away.
const LOST_FOR: Duration = Duration::from_millis(200);
/// The key every twin locks.
const KEY: &str = "k";

/// Where a scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Engine {
    /// The test kit's simulated server.
    Kit,
    /// A real server (`LOCKFLIGHT_TEST_ENGINE` chooses Redis or Valkey).
    Redis,
}

/// The hashes of the acquire, renewal and release scripts.
struct Scripts {
    acquire: Vec<u8>,
    renew: Vec<u8>,
    release: Vec<u8>,
}

/// A real server, a fault proxy in front of instance A and a black-holing proxy.
struct Real {
    server: RedisServer,
    proxy: FaultProxy,
    hole: CountingProxy,
    prefix: String,
    scripts: Scripts,
    /// The Redis name of [`KEY`]'s lock.
    name: Vec<u8>,
}

/// One scenario's server and the fault knobs it turns, on either engine.
enum Rig {
    Kit(SimServer),
    Redis(Arc<Real>),
}

impl Rig {
    async fn new(engine: Engine, twin: &str) -> Rig {
        match engine {
            Engine::Kit => Rig::Kit(SimServer::new()),
            Engine::Redis => {
                let server = RedisServer::start();
                let proxy = FaultProxy::start(&server).await;
                let hole = CountingProxy::start(&server).await;
                let prefix = unique_prefix(twin);
                let scripts = learn_scripts(&proxy, &prefix).await;
                let name = testkit::names::lock(&prefix, &LockKey::from(KEY));
                proxy.record(true);
                Rig::Redis(Arc::new(Real {
                    server,
                    proxy,
                    hole,
                    prefix,
                    scripts,
                    name,
                }))
            }
        }
    }

    /// Instance A, which meets the faults: no handoff, no caching, so every lock
    /// and release is a request to the server.
    async fn a(&self) -> Locker {
        match self {
            Rig::Kit(sim) => locker(sim.backend()),
            Rig::Redis(real) => locker(backend_at(&real.proxy.url(), &real.prefix).await),
        }
    }

    /// Instance B, which looks at the key (on Redis: straight to the server).
    async fn b(&self) -> Locker {
        match self {
            Rig::Kit(sim) => locker(sim.backend()),
            Rig::Redis(real) => locker(backend_at(&real.server.url(), &real.prefix).await),
        }
    }

    /// An instance that a hanging server hangs (on Redis: behind the black hole).
    async fn behind_hole(&self) -> Locker {
        match self {
            Rig::Kit(sim) => locker(sim.backend()),
            Rig::Redis(real) => locker(backend_at(&real.hole.url(), &real.prefix).await),
        }
    }

    /// The script of `op` on [`KEY`] (Redis only).
    fn matcher(real: &Real, op: Op) -> CommandMatcher {
        let sha = match op {
            Op::Acquire => &real.scripts.acquire,
            Op::Renew => &real.scripts.renew,
            Op::Release => &real.scripts.release,
            other => panic!("no twin for {other:?}"),
        };
        evalsha_on(sha, &real.name)
    }

    /// The next `n` requests of `op` on [`KEY`] from A are applied, their replies lost.
    fn lose_reply(&self, op: Op, n: u32) {
        match self {
            Rig::Kit(sim) => sim
                .fault()
                .on_key(KEY)
                .next(n)
                .lose_reply(op)
                .expect("a valid fault"),
            Rig::Redis(real) => real
                .proxy
                .drop_replies(Self::matcher(real, op), u64::from(n)),
        }
    }

    /// Every request of `op` on [`KEY`] from A is lost until [`clear`](Self::clear).
    fn fail(&self, op: Op) {
        match self {
            Rig::Kit(sim) => sim.fault().on_key(KEY).fail(op).expect("a valid fault"),
            Rig::Redis(real) => real.proxy.drop_requests(Self::matcher(real, op), u64::MAX),
        }
    }

    /// Removes every fault rule.
    fn clear(&self) {
        match self {
            Rig::Kit(sim) => sim.clear_faults(),
            Rig::Redis(real) => real.proxy.clear_rules(),
        }
    }

    /// How many requests of `op` on [`KEY`] A sent since the rig was made.
    fn sent(&self, op: Op) -> u64 {
        match self {
            Rig::Kit(sim) => {
                let requests = sim.requests();
                match op {
                    Op::Acquire => requests.acquire,
                    Op::Renew => requests.renew,
                    Op::Release => requests.release,
                    other => panic!("no twin for {other:?}"),
                }
            }
            Rig::Redis(real) => {
                let matcher = Self::matcher(real, op);
                real.proxy.recorded().iter().filter(|c| matcher(c)).count() as u64
            }
        }
    }

    /// On Redis, that the proxy lost `replies` replies and at least one request
    /// per `requests` (the fault happened); on the kit the counts of
    /// [`sent`](Self::sent) show it.
    fn assert_proxy_lost(&self, replies: u64, requests: bool) {
        if let Rig::Redis(real) = self {
            assert_eq!(real.proxy.dropped(), replies, "replies the proxy lost");
            assert_eq!(
                real.proxy.dropped_requests() > 0,
                requests,
                "requests the proxy lost: {}",
                real.proxy.dropped_requests()
            );
        }
    }

    /// Every request from A fails for `outage` (on Redis: each closes its
    /// connection); returns at once.
    fn unreachable_for(&self, outage: Duration) {
        match self {
            Rig::Kit(sim) => sim.unreachable_for(outage),
            Rig::Redis(real) => {
                real.proxy.drop_requests(any_command(), u64::MAX);
                let real = Arc::clone(real);
                tokio::spawn(async move {
                    tokio::time::sleep(outage).await;
                    real.proxy.clear_rules();
                });
            }
        }
    }

    /// Arms `fault` on the next message of its kind about [`KEY`] to the
    /// instances behind the hole; call it right before the step that sends it
    /// (a release sends a wake-up, B's queueing a revocation), and
    /// [`after_message`](Self::after_message) right after. On Redis the hole
    /// holds everything between those instances and the server, the pushed
    /// message included: delivered when it opens (a delay), or thrown away with
    /// the connections (a drop: the only way a server loses a message).
    fn message_fault(&self, fault: MessageFault) {
        match (self, fault) {
            (Rig::Kit(sim), MessageFault::Drop(message)) => sim
                .fault()
                .on_key(KEY)
                .next(1)
                .drop_message(message)
                .expect("a valid fault"),
            (Rig::Kit(sim), MessageFault::Delay(message, by)) => sim
                .fault()
                .on_key(KEY)
                .next(1)
                .delay_message(message, by)
                .expect("a valid fault"),
            (Rig::Redis(real), MessageFault::Drop(_)) => real.hole.blackhole(true),
            (Rig::Redis(_), MessageFault::Delay(_, by)) => self.hang_for(by),
        }
    }

    /// Completes [`message_fault`](Self::message_fault) after the step that sends
    /// the message.
    async fn after_message(&self, fault: MessageFault) {
        if let (Rig::Redis(real), MessageFault::Drop(_)) = (self, fault) {
            // The message is in the hole by now; it goes with the connections.
            tokio::time::sleep(LOST_FOR).await;
            real.hole.reset_all();
            // The instance reconnects at once, so the count of open connections
            // need not reach 0: give the resets moments to land, the hole still
            // closed, before opening it.
            tokio::time::sleep(LOST_FOR).await;
            real.hole.blackhole(false);
        }
    }

    /// An instance behind the hole that caches its leases for `linger` (with
    /// leases of 2 × [`TTL`], so that its renewals outlast the hole, and a
    /// handoff budget past the linger, which would otherwise end the caching
    /// first).
    async fn caching(&self, linger: Duration) -> Locker {
        let builder = match self {
            Rig::Kit(sim) => Locker::builder(sim.backend()),
            Rig::Redis(real) => Locker::builder(backend_at(&real.hole.url(), &real.prefix).await),
        };
        builder
            .lease_ttl(TTL * 2)
            .handoff(Handoff::enabled().max_hold(linger + SLACK))
            .cache_leases_for(linger)
            .build()
            .expect("valid settings")
    }

    /// Every request of the instances behind the hole waits for `outage`.
    fn hang_for(&self, outage: Duration) {
        match self {
            Rig::Kit(sim) => sim.hang_for(outage),
            Rig::Redis(real) => {
                real.hole.blackhole(true);
                let real = Arc::clone(real);
                tokio::spawn(async move {
                    tokio::time::sleep(outage).await;
                    real.hole.blackhole(false);
                });
            }
        }
    }
}

/// A fault on a message (a wake-up or a revocation).
#[derive(Clone, Copy, Debug)]
enum MessageFault {
    Drop(Message),
    Delay(Message, Duration),
}

/// A locker over `backend` with 1 s leases, no handoff and no caching.
fn locker(backend: impl lockflight::backend::LockBackend + 'static) -> Locker {
    Locker::builder(backend)
        .lease_ttl(TTL)
        .wait_timeout(Duration::from_secs(30))
        .handoff(Handoff::disabled())
        .build()
        .expect("valid settings")
}

/// Watches one acquire, renewal and release through the proxy: the first script
/// run on the key is the acquire, the last the release, one in between the renewal.
async fn learn_scripts(proxy: &FaultProxy, prefix: &str) -> Scripts {
    let backend = backend_at(&proxy.url(), prefix).await;
    let name = testkit::names::lock(prefix, &LockKey::from("calibrate"));
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_millis(300))
        .build()
        .unwrap();
    proxy.record(true);
    let guard = locker.lock("calibrate").await.unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || {
            let renewed = locker.stats().renewals >= 1;
            async move { renewed }
        })
        .await,
        "no renewal to learn from"
    );
    guard.release().await.unwrap();
    let shas: Vec<Vec<u8>> = proxy
        .recorded()
        .into_iter()
        .filter(|c| {
            c.len() > 3
                && c[0].eq_ignore_ascii_case(b"EVALSHA")
                && testkit::fault_proxy::evalsha_on(&c[1], &name)(c)
        })
        .map(|c| c[1].clone())
        .collect();
    proxy.record(false);
    let (acquire, release) = (shas[0].clone(), shas[shas.len() - 1].clone());
    let renew = shas
        .iter()
        .find(|s| **s != acquire && **s != release)
        .cloned()
        .unwrap_or_else(|| panic!("no renewal among the scripts seen: {shas:?}"));
    Scripts {
        acquire,
        renew,
        release,
    }
}

/// Whether `other` takes [`KEY`] at once (and gives it back).
async fn free_for(other: &Locker) -> bool {
    match other.try_lock(KEY).await.expect("a try_lock answer") {
        Some(guard) => {
            guard.release().await.expect("released");
            true
        }
        None => false,
    }
}

/// `step` within [`TTL`] + [`SLACK`].
async fn by_the_ttl<F: Future>(what: &str, step: F) -> F::Output {
    within(TTL + SLACK, what, step).await
}

/// Instantiates a scenario `async fn(Engine)` on the kit and on Redis: a module
/// named after it with the tests `kit` and `redis`.
macro_rules! twin {
    ($scenario:ident) => {
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn kit() {
                super::$scenario(super::Engine::Kit).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$scenario(super::Engine::Redis).await
            }
        }
    };
}

/// `lose_reply(Op::Renew)`: the renewal landed, so the lease lives on; the
/// next renewals answer and nothing is lost.
async fn a_lost_renewal_reply_keeps_the_lease(engine: Engine) {
    let rig = Rig::new(engine, "twin-renew-reply").await;
    let (a, b) = (rig.a().await, rig.b().await);
    let guard = a.lock(KEY).await.unwrap();
    let before = rig.sent(Op::Renew);
    rig.lose_reply(Op::Renew, 1);
    // Real time: the lease outlives three TTLs.
    tokio::time::sleep(TTL * 3).await;
    assert!(!guard.is_lost(), "{engine:?}: the lease was kept");
    // Renewals went on: three of them seen, however slowly this machine sent them.
    eventually(
        &format!("{engine:?}: three renewals after the lost reply"),
        || {
            let sent = rig.sent(Op::Renew);
            async move { sent >= before + 3 }
        },
    )
    .await;
    assert!(!guard.is_lost(), "{engine:?}: the lease was kept");
    assert!(!free_for(&b).await, "{engine:?}: A still holds the key");
    rig.assert_proxy_lost(1, false);
    guard.release().await.unwrap();
    assert!(free_for(&b).await);
}
twin!(a_lost_renewal_reply_keeps_the_lease);

/// `fail(Op::Renew)`: renewals never reach the server; the lease runs out at its
/// TTL, the loss signal fires, `with_lock` ends with `LeaseLost`, and B takes
/// the key.
async fn lost_renewals_lose_the_lease_at_its_ttl(engine: Engine) {
    let rig = Rig::new(engine, "twin-renew-fail").await;
    let (a, b) = (rig.a().await, rig.b().await);
    rig.fail(Op::Renew);
    let outcome = by_the_ttl(
        "with_lock ends",
        a.with_lock(KEY, |_| std::future::pending::<()>()),
    )
    .await;
    assert!(
        matches!(outcome, Err(Error::LeaseLost { .. })),
        "{engine:?}: {outcome:?}"
    );
    assert!(rig.sent(Op::Renew) >= 1, "{engine:?}: renewals were sent");
    rig.assert_proxy_lost(0, true);
    let taken = by_the_ttl("B takes the key", b.lock(KEY)).await.unwrap();
    taken.release().await.unwrap();
    rig.clear();
}
twin!(lost_renewals_lose_the_lease_at_its_ttl);

/// `lose_reply(Op::Acquire)`: the acquire landed; A repeats it with the same
/// token, finds the lock its own and holds it.
async fn a_lost_acquire_reply_is_repeated_and_the_lock_held(engine: Engine) {
    let rig = Rig::new(engine, "twin-acquire-reply").await;
    let (a, b) = (rig.a().await, rig.b().await);
    rig.lose_reply(Op::Acquire, 1);
    let guard = by_the_ttl("A's lock", a.lock(KEY)).await.unwrap();
    assert_eq!(rig.sent(Op::Acquire), 2, "{engine:?}: repeated once");
    rig.assert_proxy_lost(1, false);
    assert!(!free_for(&b).await, "{engine:?}: the landed acquire holds");
    guard.release().await.unwrap();
    assert!(free_for(&b).await);
}
twin!(a_lost_acquire_reply_is_repeated_and_the_lock_held);

/// `fail(Op::Release)`: releases never reach the server; the holder is told,
/// the key stays busy while they are lost, and B takes it at the TTL.
async fn lost_releases_free_the_key_at_the_ttl(engine: Engine) {
    let rig = Rig::new(engine, "twin-release-fail").await;
    let (a, b) = (rig.a().await, rig.b().await);
    rig.fail(Op::Release);
    let guard = a.lock(KEY).await.unwrap();
    let released = by_the_ttl("A's release", guard.release()).await;
    assert!(released.is_err(), "{engine:?}: {released:?}");
    rig.assert_proxy_lost(0, true);
    // Kept lost, so that no later attempt of A's release lands.
    assert!(
        !free_for(&b).await,
        "{engine:?}: the lease lives to its TTL"
    );
    let taken = by_the_ttl("B takes the key", b.lock(KEY)).await.unwrap();
    // On the kit the fault is the key's, B's release included.
    rig.clear();
    taken.release().await.unwrap();
}
twin!(lost_releases_free_the_key_at_the_ttl);

/// `unreachable_for`: every request fails until the deadline and changes
/// nothing; A asks again and is served once the server is back.
async fn an_unreachable_server_fails_requests_until_the_deadline(engine: Engine) {
    let rig = Rig::new(engine, "twin-unreachable").await;
    let (a, b) = (rig.a().await, rig.b().await);
    let outage = Duration::from_secs(2);
    let start = Instant::now();
    rig.unreachable_for(outage);
    let early = tokio::time::timeout(outage / 4, a.try_lock(KEY)).await;
    assert!(
        early.is_err(),
        "{engine:?}: answered in the outage: {early:?}"
    );
    let guard = by_the_ttl("A's lock once back", a.try_lock(KEY))
        .await
        .unwrap()
        .expect("free once back");
    assert!(
        start.elapsed() >= outage,
        "{engine:?}: served in the outage"
    );
    rig.assert_proxy_lost(0, true);
    guard.release().await.unwrap();
    assert!(
        free_for(&b).await,
        "{engine:?}: the failed requests took nothing"
    );
}
twin!(an_unreachable_server_fails_requests_until_the_deadline);

/// `hang_for`: requests wait for the end of the outage and are served then; a
/// lease held through an outage longer than its TTL is lost.
async fn a_hanging_server_serves_requests_when_it_heals(engine: Engine) {
    let rig = Rig::new(engine, "twin-hang").await;
    let (a, c) = (rig.behind_hole().await, rig.behind_hole().await);
    let guard = a.lock(KEY).await.unwrap();
    let outage = TTL * 3;
    let start = Instant::now();
    rig.hang_for(outage);
    by_the_ttl("the loss signal", guard.lost()).await;
    drop(guard);
    let taken = within(outage + SLACK, "C's lock after the outage", c.lock(KEY))
        .await
        .unwrap();
    assert!(
        start.elapsed() >= outage,
        "{engine:?}: served only after the outage"
    );
    taken.release().await.unwrap();
}
twin!(a_hanging_server_serves_requests_when_it_heals);

/// B, behind the hole, waits for [`KEY`] while A holds it; A releases it with
/// `fault` on the release's wake-up. Returns how long after the fault was armed
/// B held the key.
async fn wait_after_release(rig: &Rig, fault: MessageFault) -> Duration {
    let (a, b) = (rig.a().await, rig.behind_hole().await);
    let guard = a.lock(KEY).await.unwrap();
    let stats = b.clone();
    let waiter = tokio::spawn(async move {
        let guard = b.lock(KEY).await.unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    // B asks and is told to wait (up to A's TTL).
    assert!(
        wait_until(SLACK, || {
            let asked = stats.stats().acquire_attempts >= 1;
            async move { asked }
        })
        .await,
        "B asked"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let armed = Instant::now();
    rig.message_fault(fault);
    guard.release().await.unwrap();
    rig.after_message(fault).await;
    let held = within(TTL + SLACK, "B takes the key", waiter)
        .await
        .unwrap();
    println!(
        "{fault:?}: held {:?} after the fault was armed",
        held - armed
    );
    held - armed
}

/// `drop_message(Message::Wakeup)`: the waiter is not woken by the release; it
/// is late (on the kit it asks again when its timer ends; on Redis its
/// subscription, lost with the message, is made again and wakes every waiter),
/// but it gets the key within its TTL and a few seconds.
async fn a_dropped_wakeup_makes_the_waiter_late(engine: Engine) {
    let rig = Rig::new(engine, "twin-wakeup-drop").await;
    let waited = wait_after_release(&rig, MessageFault::Drop(Message::Wakeup)).await;
    assert!(
        waited > Duration::ZERO,
        "{engine:?}: woken after {waited:?}"
    );
}
twin!(a_dropped_wakeup_makes_the_waiter_late);

/// `delay_message(Message::Wakeup, by)`: the waiter is woken `by` late (or by
/// its timer, whichever comes first) and gets the key.
async fn a_delayed_wakeup_makes_the_waiter_late(engine: Engine) {
    let rig = Rig::new(engine, "twin-wakeup-delay").await;
    let by = Duration::from_millis(600);
    let waited = wait_after_release(&rig, MessageFault::Delay(Message::Wakeup, by)).await;
    assert!(
        waited >= by.min(TTL / 2),
        "{engine:?}: woken after {waited:?}"
    );
}
twin!(a_delayed_wakeup_makes_the_waiter_late);

/// A, behind the hole, caches its lease for the next local task for `linger`;
/// B queues for the key with `fault` on the revocation that would end A's
/// caching at once. Returns how long after the fault was armed B held the key.
async fn wait_for_cached(rig: &Rig, linger: Duration, fault: MessageFault) -> Duration {
    let (a, b) = (rig.caching(linger).await, rig.b().await);
    // Twice, so the key is warm and the second release caches the lease.
    for _ in 0..2 {
        a.lock(KEY).await.unwrap().release().await.unwrap();
    }
    let armed = Instant::now();
    rig.message_fault(fault);
    let waiter = tokio::spawn(async move {
        let guard = b.lock(KEY).await.unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    rig.after_message(fault).await;
    let held = within(linger + SLACK, "B takes the key", waiter)
        .await
        .unwrap();
    a.shutdown().await;
    let waited = held - armed;
    println!("{fault:?}: B held the key {waited:?} after the fault was armed");
    waited
}

/// `drop_message(Message::Revocation)`: the revocation is lost (on Redis with
/// A's subscription); B waits for A's linger to end, and gets the key.
async fn a_dropped_revocation_keeps_a_cached_lease_until_its_linger(engine: Engine) {
    const LINGER: Duration = Duration::from_millis(1500);
    let rig = Rig::new(engine, "twin-revocation-drop").await;
    let waited = wait_for_cached(&rig, LINGER, MessageFault::Drop(Message::Revocation)).await;
    assert!(
        waited >= LINGER / 2,
        "{engine:?}: the cached lease was given up after {waited:?}"
    );
}
twin!(a_dropped_revocation_keeps_a_cached_lease_until_its_linger);

/// `delay_message(Message::Revocation, by)`: A gives its cached lease up when
/// the revocation arrives, `by` late and long before its linger ends.
async fn a_delayed_revocation_gives_up_a_cached_lease_late(engine: Engine) {
    const LINGER: Duration = Duration::from_secs(5);
    let rig = Rig::new(engine, "twin-revocation-delay").await;
    let by = Duration::from_millis(500);
    let waited = wait_for_cached(&rig, LINGER, MessageFault::Delay(Message::Revocation, by)).await;
    assert!(
        waited >= by && waited < LINGER,
        "{engine:?}: the cached lease was given up after {waited:?}"
    );
}
twin!(a_delayed_revocation_gives_up_a_cached_lease_late);
