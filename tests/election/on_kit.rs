//! Elections on the test kit's paused clock (feature `testing`), where order and
//! request counts can be asserted exactly:
//!
//! * `observe()` gives a slow reader every change it read, in order, within its
//!   buffer; beyond it, one `Observed::Missed` counting exactly the dropped
//!   items, then the newest in order.
//! * `run_with_stop`'s order: the work stops, then the hook runs while the lease
//!   is still held (the record names the term, another instance is refused the
//!   key, nothing was released), then the lease is released.
//! * Under every `LossPolicy` the work learns of its loss from its `LossSignal`,
//!   whether the loss was signalled (the lease deleted) or found by the clock
//!   (renewals lost until the validity ended); then the hook sees the loss.
//! * A candidate waiting behind an abandoned lease asks the backend about three
//!   times per lease TTL, whatever the locker's wait timeout, and leads when the
//!   lease ends.
//! * Dropping `run` while its hook runs gives leadership up at once; a work that
//!   returns at once does not starve the runtime; the new futures are `Send`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockflight::election::{Observation, Observed};
use lockflight::testing::{Op, SimServer};
use lockflight::{FencingToken, Locker, LossPolicy};
use tokio::time::Instant;

/// Long enough that no periodic re-read or renewal explains what a test sees.
const TTL: Duration = Duration::from_secs(60);

fn locker(server: &SimServer, ttl: Duration) -> Locker {
    Locker::builder(server.backend())
        .lease_ttl(ttl)
        // A resignation then always sends its release (no lease kept for the
        // next local task): the tests count releases.
        .cache_leases_for(Duration::ZERO)
        .build()
        .unwrap()
}

/// What an observation's item says, comparable: `(identity, term)` of a leader,
/// `None` for nobody, or the count of a marker.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Leader(String, FencingToken),
    Nobody,
    Missed(u64),
}

fn seen(item: Observed) -> Seen {
    match item {
        Observed::Leader(l) => Seen::Leader(l.identity, l.term),
        Observed::NoLeader => Seen::Nobody,
        Observed::Missed(n) => Seen::Missed(n),
        other => panic!("an item this test does not know: {other:?}"),
    }
}

/// The items waiting in `observation`, taken without waiting for more (a second
/// of the paused clock passes idle: less than any periodic re-read).
async fn waiting(observation: &mut Observation) -> Vec<Seen> {
    let mut items = Vec::new();
    while let Ok(item) = tokio::time::timeout(Duration::from_secs(1), observation.next()).await {
        items.push(seen(item.expect("the observation ended")));
    }
    items
}

/// `terms` leaders in turn on `candidates`, each gaining and resigning, with the
/// observer's task given time to read each change; the items the observer must
/// have queued, its first read (nobody) included.
async fn terms_in_turn(candidates: &Locker, terms: usize) -> Vec<Seen> {
    let settle = || tokio::time::sleep(Duration::from_millis(10));
    settle().await;
    let mut expected = vec![Seen::Nobody];
    for i in 0..terms {
        let identity = format!("candidate-{i}");
        let leadership = candidates
            .election("jobs")
            .identity(identity.clone())
            .campaign()
            .await
            .unwrap();
        settle().await;
        expected.push(Seen::Leader(identity, leadership.fencing_token()));
        leadership.resign().await.unwrap();
        settle().await;
        expected.push(Seen::Nobody);
    }
    expected
}

#[tokio::test(start_paused = true)]
async fn a_slow_observer_sees_every_change_in_order_within_its_buffer() {
    let server = SimServer::new();
    let (candidates, observer) = (locker(&server, TTL), locker(&server, TTL));
    let mut observation = observer.election("jobs").observe();
    // 1 + 2 × 5 = 11 items, fewer than the buffer holds; none read until the end.
    let expected = terms_in_turn(&candidates, 5).await;
    assert!(expected.len() <= Observation::BUFFER);
    assert_eq!(waiting(&mut observation).await, expected);
    assert_eq!(observation.current(), None);
}

#[tokio::test(start_paused = true)]
async fn a_slow_observer_beyond_its_buffer_is_told_how_many_it_missed() {
    let server = SimServer::new();
    let (candidates, observer) = (locker(&server, TTL), locker(&server, TTL));
    let mut observation = observer.election("jobs").observe();
    // 1 + 2 × 12 = 25 items: 9 more than the buffer holds.
    let expected = terms_in_turn(&candidates, 12).await;
    let dropped = expected.len() - Observation::BUFFER;
    assert_eq!(dropped, 9);
    let mut items = waiting(&mut observation).await.into_iter();
    assert_eq!(items.next(), Some(Seen::Missed(dropped as u64)));
    assert_eq!(
        items.collect::<Vec<_>>(),
        expected[dropped..],
        "the newest items, in order"
    );

    // Read in time again: one more term, no marker.
    let leadership = candidates
        .election("jobs")
        .identity("last")
        .campaign()
        .await
        .unwrap();
    let term = leadership.fencing_token();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        waiting(&mut observation).await,
        [Seen::Leader("last".into(), term)]
    );
    assert_eq!(observation.current().map(|l| l.term), Some(term));
    leadership.resign().await.unwrap();
}

/// Events in the order they happened.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<String>>>);

impl Events {
    fn push(&self, event: impl Into<String>) {
        self.0.lock().unwrap().push(event.into());
    }

    fn all(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Waits (on the paused clock) until `event` happened.
    async fn reach(&self, event: &str) {
        for _ in 0..10_000 {
            if self.all().iter().any(|e| e == event) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never reached {event:?}: {:?}", self.all());
    }
}

#[tokio::test(start_paused = true)]
async fn the_stop_hook_runs_after_the_work_and_before_the_release() {
    let server = SimServer::new();
    let a = locker(&server, Duration::from_secs(3));
    let other = locker(&server, Duration::from_secs(3));
    let events = Events::default();
    let terms = Arc::new(Mutex::new(0));
    let election = a.election("relay").identity("a");
    let work = {
        let (events, server) = (events.clone(), server.clone());
        move |leader: lockflight::election::LeaderInfo, _loss| {
            let events = events.clone();
            let term = {
                let mut terms = terms.lock().unwrap();
                *terms += 1;
                *terms
            };
            let releases = server.requests().release;
            async move {
                events.push(format!("work {term} started, {releases} released"));
                if term == 1 {
                    // Work that ends on its own: the term ends.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    events.push(format!("work 1 returned in term {}", leader.term));
                } else {
                    std::future::pending::<()>().await;
                }
            }
        }
    };
    let on_stop = {
        let (events, election, server) = (events.clone(), election.clone(), server.clone());
        move |stopped: lockflight::election::Stopped| {
            let (events, election, other) = (events.clone(), election.clone(), other.clone());
            let server = server.clone();
            async move {
                // Asynchronous work in the hook, longer than the TTL: the lease
                // stays held, renewed.
                tokio::time::sleep(Duration::from_secs(5)).await;
                let record = election.leader().await.unwrap().map(|l| l.term);
                let refused = other.try_lock("relay").await.unwrap().is_none();
                events.push(format!(
                    "hook: {:?}, lost {}, record names term {}, other refused {}, \
                     {} released",
                    stopped.cause,
                    stopped.loss.is_lost(),
                    record == Some(stopped.leader.term),
                    refused,
                    server.requests().release,
                ));
            }
        }
    };
    let running = tokio::spawn(async move { election.run_with_stop(work, on_stop).await });
    events.reach("work 2 started, 1 released").await;
    let events = events.all();
    assert_eq!(events.len(), 4, "{events:#?}");
    assert_eq!(events[0], "work 1 started, 0 released");
    assert!(events[1].starts_with("work 1 returned"), "{events:#?}");
    assert_eq!(
        events[2],
        "hook: Returned, lost false, record names term true, other refused true, 0 released",
        "the hook runs after the work, the lease still held and renewed past its TTL"
    );
    assert_eq!(events[3], "work 2 started, 1 released");
    running.abort();
}

/// How a test takes the lease away from the leader.
#[derive(Clone, Copy, Debug)]
enum Loss {
    /// The server deletes it: the next renewal is told, the loss is signalled.
    Deleted,
    /// Every renewal is lost: the validity ends on the leader's clock.
    Expired,
}

/// The events of one term of `run_with_stop` under `policy`, whose lease is
/// taken away as `loss` says: the work races its `LossSignal` and, on the loss,
/// reports it after an `.await`; the hook records what it sees. The events up to
/// the hook's.
async fn a_lost_term(policy: LossPolicy, loss: Loss) -> Vec<String> {
    let server = SimServer::new();
    let locker = Locker::builder(server.backend())
        .lease_ttl(Duration::from_secs(3))
        .on_loss(policy)
        .build()
        .unwrap();
    let events = Events::default();
    let running = tokio::spawn({
        let election = locker.election("relay").identity("a");
        let (events, hook_events) = (events.clone(), events.clone());
        async move {
            election
                .run_with_stop(
                    move |_leader, loss| {
                        let events = events.clone();
                        async move {
                            events.push("work started");
                            tokio::select! {
                                _ = loss.lost() => {
                                    events.push("work: lost");
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                    events.push("work: reported the loss");
                                }
                                _ = std::future::pending::<()>() => {}
                            }
                        }
                    },
                    move |stopped| {
                        let events = hook_events.clone();
                        async move {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            events.push(format!(
                                "hook: {:?}, lost {}",
                                stopped.cause,
                                stopped.loss.is_lost()
                            ));
                        }
                    },
                )
                .await
        }
    });
    events.reach("work started").await;
    match loss {
        Loss::Deleted => assert!(server.lose_lease("relay").unwrap()),
        Loss::Expired => server.fault().on_key("relay").fail(Op::Renew).unwrap(),
    }
    events.reach("hook: Lost, lost true").await;
    running.abort();
    // The events of the lost term; `run` campaigns again after the hook.
    let mut events = events.all();
    let hook = events.iter().position(|e| e.starts_with("hook")).unwrap();
    assert!(
        events[hook + 1..].iter().all(|e| e == "work started"),
        "{events:?}"
    );
    events.truncate(hook + 1);
    events
}

#[tokio::test(start_paused = true)]
async fn under_abort_the_work_sees_its_loss_before_it_is_dropped() {
    for loss in [Loss::Deleted, Loss::Expired] {
        assert_eq!(
            a_lost_term(LossPolicy::Abort, loss).await,
            ["work started", "work: lost", "hook: Lost, lost true"],
            "{loss:?}: the work's loss branch runs up to its first pending .await"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn under_signal_the_work_runs_on_after_its_loss_until_it_returns() {
    for loss in [Loss::Deleted, Loss::Expired] {
        assert_eq!(
            a_lost_term(LossPolicy::Signal, loss).await,
            [
                "work started",
                "work: lost",
                "work: reported the loss",
                "hook: Lost, lost true"
            ],
            "{loss:?}"
        );
    }
}

/// `run` (no hook) under the default policy: the work's own loss branch runs.
#[tokio::test(start_paused = true)]
async fn run_lets_the_work_see_its_loss() {
    let server = SimServer::new();
    let locker = locker(&server, Duration::from_secs(3));
    let events = Events::default();
    let running = tokio::spawn({
        let (election, events) = (locker.election("relay").identity("a"), events.clone());
        async move {
            election
                .run(move |_leader, loss| {
                    let events = events.clone();
                    async move {
                        events.push("work started");
                        loss.lost().await;
                        events.push("work: lost");
                        std::future::pending::<()>().await
                    }
                })
                .await
        }
    });
    events.reach("work started").await;
    assert!(server.lose_lease("relay").unwrap());
    events.reach("work: lost").await;
    running.abort();
}

#[tokio::test(start_paused = true)]
async fn a_waiting_candidate_asks_about_three_times_per_lease_ttl() {
    let server = SimServer::new();
    let leader = locker(&server, TTL);
    let candidate = Locker::builder(server.backend())
        .lease_ttl(TTL)
        // A short wait timeout: it must not set the pace of a campaign.
        .wait_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let abandoned = leader
        .election("jobs")
        .identity("gone")
        .campaign()
        .await
        .unwrap();
    let term = abandoned.fencing_token();
    let next = tokio::spawn(async move {
        candidate
            .election("jobs")
            .identity("next")
            .campaign()
            .await
            .map(|l| (Instant::now(), l))
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The leader's acquire, and the candidate's first (busy) one.
    let asked = server.requests().acquire;
    assert_eq!(asked, 2, "queued behind the leader");
    // The leader's process is gone: nothing is sent, the lease ends at its TTL.
    let gone_at = Instant::now();
    std::thread::spawn(move || drop(abandoned))
        .join()
        .expect("dropped without a runtime");
    let (led_at, leadership) = next.await.unwrap().unwrap();
    assert!(leadership.fencing_token() > term);
    let took = led_at - gone_at;
    assert!(
        took <= TTL + Duration::from_millis(100),
        "led {took:?} after the leader was gone: not when the lease ended"
    );
    // A pace of 10 s ± 25 % (a third of the TTL, at most 10 s) over about 60 s:
    // 4 to 8 asks, then the one that is granted when the lease ends.
    // The leader's process sends nothing more: every acquire is the candidate's.
    let asks = server.requests().acquire - asked;
    assert!(
        (5..=9).contains(&asks),
        "{asks} asks while a {TTL:?} lease ran out"
    );
    leadership.resign().await.unwrap();
}

/// On the memory backend a term whose work returns at once never waits: `run`
/// still lets the runtime's other tasks run between terms. (On a current-thread
/// runtime, of its own thread, so that a starved runtime fails the test instead
/// of hanging it.)
#[test]
fn a_work_that_returns_at_once_does_not_starve_the_runtime() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let locker = Locker::builder(lockflight::MemoryBackend::new())
                .build()
                .unwrap();
            let election = locker.election("relay").identity("a");
            let terms = Arc::new(Mutex::new(0u32));
            let counted = Arc::clone(&terms);
            let running = election.run(move |_, _| {
                *counted.lock().unwrap() += 1;
                std::future::ready(())
            });
            let other = async {
                while *terms.lock().unwrap() < 3 {
                    tokio::task::yield_now().await;
                }
            };
            tokio::select! {
                _ = running => unreachable!("run returns only with an error"),
                () = other => {}
            }
        });
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("another task of the runtime never ran while `run` looped");
}

/// The election's new futures are `Send` (spawnable on a multi-thread runtime).
#[allow(dead_code)]
fn the_futures_are_send(election: &lockflight::election::Election, observation: &mut Observation) {
    fn send<T: Send>(_: T) {}
    send(election.run_with_stop(|_, _| async {}, |_| async {}));
    send(observation.next());
}

/// Dropping `run` while its hook runs drops the hook and gives leadership up in
/// the background: another instance leads at once, not a lease TTL later.
#[tokio::test(start_paused = true)]
async fn dropping_run_during_its_hook_gives_up_leadership() {
    let server = SimServer::new();
    let (a, b) = (locker(&server, TTL), locker(&server, TTL));
    let events = Events::default();
    let running = tokio::spawn({
        let election = a.election("relay").identity("a");
        let (events, hook_events) = (events.clone(), events.clone());
        async move {
            election
                .run_with_stop(
                    move |_, _| {
                        events.push("work started");
                        std::future::ready(())
                    },
                    move |_| {
                        hook_events.push("hook started");
                        std::future::pending::<()>()
                    },
                )
                .await
        }
    });
    events.reach("hook started").await;
    running.abort();
    let _ = running.await;
    let start = Instant::now();
    let leads = b.election("relay").identity("b").campaign().await.unwrap();
    assert!(
        start.elapsed() < TTL / 10,
        "led after {:?}",
        start.elapsed()
    );
    assert_eq!(events.all(), ["work started", "hook started"]);
    leads.resign().await.unwrap();
}
