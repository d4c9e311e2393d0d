//! The test kit (`lockflight::testing`): each fault knob, on a paused clock, seen
//! through `Locker`s as a user's test sees it. One test per knob; no wall-clock
//! sleep anywhere (`tokio::time::advance`, and the paused clock's auto-advance
//! while every task waits for a timer).

use std::time::Duration;

use lockflight::fence::Fenced;
use lockflight::testing::{Message, Op, SimBackend, SimFencedKey, SimServer};
use lockflight::{Error, FencingToken, Handoff, Locker};
use tokio::time::{Instant, advance};

const TTL: Duration = Duration::from_secs(3);
const KEY: &str = "job:7";

/// A locker over `backend` with a 3 s TTL (renewed every second), no handoff
/// and no lease caching: every lock and release is a request to the server.
fn locker(backend: SimBackend) -> Locker {
    Locker::builder(backend)
        .lease_ttl(TTL)
        .wait_timeout(Duration::from_secs(60))
        .handoff(Handoff::disabled())
        .build()
        .expect("valid settings")
}

/// Whether another instance takes `KEY` at once (and gives it back).
async fn free_for(other: &Locker) -> bool {
    match other.try_lock(KEY).await.expect("a try_lock answer") {
        Some(guard) => {
            guard.release().await.expect("released");
            true
        }
        None => false,
    }
}

/// Two backends of one server are two instances: their lockers exclude each
/// other, and the server counts each instance's requests.
#[tokio::test(start_paused = true)]
async fn instances_contend_and_their_requests_are_counted() {
    let server = SimServer::new();
    let (a_backend, b_backend) = (server.backend(), server.backend());
    let (a, b) = (locker(a_backend), locker(b_backend));
    let guard = a.lock(KEY).await.unwrap();
    assert!(b.try_lock(KEY).await.unwrap().is_none());
    guard.release().await.unwrap();
    let requests = server.requests();
    assert_eq!(
        (requests.acquire, requests.release, requests.leave),
        (2, 1, 0),
        "{requests:?}"
    );
    assert!(free_for(&b).await);
    assert_eq!(server.requests().total(), 5);
}

/// A lost acquire reply: the acquire landed, the locker repeats it with the
/// same token, finds the lock its own and holds it; one more round trip.
#[tokio::test(start_paused = true)]
async fn a_lost_acquire_reply_is_repeated_and_the_lock_held() {
    let server = SimServer::new();
    let (a, b) = (locker(server.backend()), locker(server.backend()));
    server
        .fault()
        .on_key(KEY)
        .next(1)
        .lose_reply(Op::Acquire)
        .unwrap();
    let guard = a.lock(KEY).await.unwrap();
    assert_eq!(
        server.requests().acquire,
        2,
        "the acquire was repeated once"
    );
    assert!(!free_for(&b).await, "the landed acquire holds the key");
    guard.release().await.unwrap();
    assert!(free_for(&b).await);
}

/// A lost renewal reply: the renewal landed, so the lease lives on; the next
/// renewal answers and nothing is lost.
#[tokio::test(start_paused = true)]
async fn a_lost_renewal_reply_keeps_the_lease() {
    let server = SimServer::new();
    let (a, b) = (locker(server.backend()), locker(server.backend()));
    let guard = a.lock(KEY).await.unwrap();
    server
        .fault()
        .on_key(KEY)
        .next(1)
        .lose_reply(Op::Renew)
        .unwrap();
    for _ in 0..10 {
        advance(Duration::from_millis(500)).await;
    }
    assert!(!guard.is_lost());
    assert!(server.requests().renew >= 4, "{:?}", server.requests());
    assert!(!free_for(&b).await);
    guard.release().await.unwrap();
}

/// Renewals that never reach the server: the lease runs out at its TTL, the
/// holder's loss signal fires by then, `with_lock` drops the work, and another
/// instance takes the key.
#[tokio::test(start_paused = true)]
async fn lost_renewals_lose_the_lease_at_its_ttl() {
    let server = SimServer::new();
    let (a, b) = (locker(server.backend()), locker(server.backend()));
    server.fault().on_key(KEY).fail(Op::Renew).unwrap();
    let start = Instant::now();
    let work = a.with_lock(KEY, |_| std::future::pending::<()>());
    let outcome = work.await;
    assert!(
        matches!(outcome, Err(Error::LeaseLost { .. })),
        "{outcome:?}"
    );
    assert!(start.elapsed() <= TTL, "lost after {:?}", start.elapsed());
    advance(TTL).await;
    assert!(free_for(&b).await);
}

/// A lost release reply: the release landed; the locker repeats it, the
/// server's release record reports it, and the key is free at once.
#[tokio::test(start_paused = true)]
async fn a_lost_release_reply_still_frees_the_key_at_once() {
    let server = SimServer::new();
    let (a, b) = (locker(server.backend()), locker(server.backend()));
    server
        .fault()
        .on_key(KEY)
        .next(1)
        .lose_reply(Op::Release)
        .unwrap();
    let guard = a.lock(KEY).await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(
        server.requests().release,
        2,
        "the release was repeated once"
    );
    assert!(free_for(&b).await);
}

/// Releases that never reach the server: the holder is told, and the key is
/// free for another instance at the TTL.
#[tokio::test(start_paused = true)]
async fn lost_releases_free_the_key_at_the_ttl() {
    let server = SimServer::new();
    let (a, b) = (locker(server.backend()), locker(server.backend()));
    server.fault().on_key(KEY).fail(Op::Release).unwrap();
    let guard = a.lock(KEY).await.unwrap();
    let released = guard.release().await;
    assert!(released.is_err(), "{released:?}");
    server.clear_faults();
    assert!(!free_for(&b).await, "the lease lives to its TTL");
    advance(TTL).await;
    assert!(free_for(&b).await);
}

/// A lease lost as in a failover: another instance takes the key at once with
/// a greater fencing token; the holder learns it at its next renewal, and its
/// release reports the loss.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_is_signalled_and_fencing_keeps_increasing() {
    let server = SimServer::new();
    let (a, b) = (locker(server.backend()), locker(server.backend()));
    let guard = a.lock(KEY).await.unwrap();
    assert!(server.lose_lease(KEY).unwrap());
    let taken = b.lock(KEY).await.unwrap();
    assert!(taken.fencing_token() > guard.fencing_token());
    tokio::time::timeout(TTL, guard.lost())
        .await
        .expect("the loss is signalled within the TTL");
    let released = guard.release().await;
    assert!(
        matches!(released, Err(Error::LeaseLost { .. })),
        "{released:?}"
    );
    taken.release().await.unwrap();
    assert!(!server.lose_lease(KEY).unwrap(), "nothing left to lose");
}

/// A restart without persistence: every lease is gone, the holders learn it,
/// and fencing tokens keep increasing.
#[tokio::test(start_paused = true)]
async fn a_restart_loses_every_lease_and_fencing_keeps_increasing() {
    let server = SimServer::new();
    let (a, b) = (locker(server.backend()), locker(server.backend()));
    let first = a.lock(KEY).await.unwrap();
    let other = a.lock("job:8").await.unwrap();
    server.restart();
    let taken = b.lock(KEY).await.unwrap();
    assert!(taken.fencing_token() > first.fencing_token());
    assert!(b.try_lock("job:8").await.unwrap().is_some());
    tokio::time::timeout(TTL, futures::future::join(first.lost(), other.lost()))
        .await
        .expect("both losses are signalled within the TTL");
    let released = first.release().await;
    assert!(
        matches!(released, Err(Error::LeaseLost { .. })),
        "{released:?}"
    );
    taken.release().await.unwrap();
}

/// How long `b` waits for `KEY` after `a`, holding it, releases it at once.
async fn wait_after_release(server: &SimServer) -> Duration {
    let (a, b) = (locker(server.backend()), locker(server.backend()));
    let guard = a.lock(KEY).await.unwrap();
    let waiter = tokio::spawn(async move {
        let guard = b.lock(KEY).await.unwrap();
        let at = Instant::now();
        guard.release().await.unwrap();
        at
    });
    // The waiter asks and is told to wait (up to the lease's TTL).
    while server.requests().acquire < 2 {
        tokio::task::yield_now().await;
    }
    let released_at = Instant::now();
    guard.release().await.unwrap();
    waiter.await.unwrap() - released_at
}

/// A dropped wake-up: the waiter asks again only when its last answer told it
/// to (the holder's TTL); a delayed one wakes it that much later; without a
/// fault it is woken at once.
#[tokio::test(start_paused = true)]
async fn dropped_and_delayed_wakeups_make_the_waiter_late() {
    let on_time = wait_after_release(&SimServer::new()).await;
    assert_eq!(on_time, Duration::ZERO);

    let server = SimServer::new();
    server
        .fault()
        .on_key(KEY)
        .next(1)
        .drop_message(Message::Wakeup)
        .unwrap();
    let dropped = wait_after_release(&server).await;
    assert!(
        dropped > TTL / 2 && dropped <= TTL,
        "woken after {dropped:?}"
    );

    let server = SimServer::new();
    let by = Duration::from_millis(700);
    server
        .fault()
        .on_key(KEY)
        .next(1)
        .delay_message(Message::Wakeup, by)
        .unwrap();
    let delayed = wait_after_release(&server).await;
    assert_eq!(delayed, by);
}

/// A lease cached for the next local task is released at once when another
/// instance queues for the key (a revocation); with the revocation dropped, the
/// other instance waits for the cache's linger to end.
#[tokio::test(start_paused = true)]
async fn a_dropped_revocation_keeps_a_cached_lease_until_its_linger() {
    const LINGER: Duration = Duration::from_secs(2);
    async fn wait_for_cached(server: &SimServer) -> Duration {
        let a = Locker::builder(server.backend())
            .lease_ttl(TTL)
            .cache_leases_for(LINGER)
            .build()
            .unwrap();
        let b = locker(server.backend());
        // Twice, so the key is warm and the second release caches the lease.
        for _ in 0..2 {
            a.lock(KEY).await.unwrap().release().await.unwrap();
        }
        let start = Instant::now();
        let guard = b.lock(KEY).await.unwrap();
        let waited = start.elapsed();
        guard.release().await.unwrap();
        a.shutdown().await;
        waited
    }
    let revoked = wait_for_cached(&SimServer::new()).await;
    assert_eq!(revoked, Duration::ZERO);

    let server = SimServer::new();
    server
        .fault()
        .on_key(KEY)
        .drop_message(Message::Revocation)
        .unwrap();
    let kept = wait_for_cached(&server).await;
    assert!(
        kept > Duration::ZERO && kept <= LINGER,
        "waited {kept:?} for the cached lease"
    );
}

/// An unreachable server: every request fails at once until the deadline and
/// changes nothing; lockflight asks again (an error without an answer may hide
/// an applied request) and is served once the server is back.
#[tokio::test(start_paused = true)]
async fn an_unreachable_server_fails_every_request_until_the_deadline() {
    let server = SimServer::new();
    let (a, b) = (locker(server.backend()), locker(server.backend()));
    let outage = Duration::from_secs(5);
    server.unreachable_for(outage);
    let gave_up = tokio::time::timeout(Duration::from_secs(1), b.try_lock(KEY)).await;
    assert!(gave_up.is_err(), "answered during the outage: {gave_up:?}");
    let failed = server.requests().acquire;
    assert!(failed >= 1);
    let start = Instant::now();
    let guard = a.try_lock(KEY).await.unwrap().expect("free once back");
    assert!(start.elapsed() >= outage - Duration::from_secs(1));
    assert!(server.requests().acquire > failed + 1, "asked again");
    guard.release().await.unwrap();
    assert!(free_for(&b).await, "the failed requests took nothing");
}

/// A hanging server: a request waits for the end of the outage and is served
/// then; a lease held through an outage longer than its TTL is lost.
#[tokio::test(start_paused = true)]
async fn a_hanging_server_serves_requests_when_it_heals() {
    let server = SimServer::new();
    let a = locker(server.backend());
    let guard = a.lock(KEY).await.unwrap();
    server.hang_for(TTL * 2);
    let start = Instant::now();
    tokio::time::timeout(TTL * 2, guard.lost())
        .await
        .expect("renewals that hang past the TTL lose the lease");
    assert!(start.elapsed() <= TTL);
    drop(guard);
    let b = locker(server.backend());
    let start = Instant::now();
    let taken = b.lock(KEY).await.unwrap();
    assert!(
        start.elapsed() > Duration::ZERO,
        "served only after the outage"
    );
    taken.release().await.unwrap();
}

/// Bad input to the knobs is a clear error, never a panic or a silent no-op.
#[tokio::test]
async fn bad_knob_input_is_an_error() {
    let server = SimServer::new();
    let empty = server.fault().on_key("").fail(Op::Acquire);
    assert!(matches!(empty, Err(Error::InvalidKey { .. })), "{empty:?}");
    let never = server.fault().next(0).lose_reply(Op::Release);
    assert!(
        matches!(never, Err(Error::InvalidConfig { .. })),
        "{never:?}"
    );
    let lost = server.lose_lease(" ");
    assert!(matches!(lost, Err(Error::InvalidKey { .. })), "{lost:?}");
    assert_eq!(server.requests().total(), 0);
}

/// The guide's table of when a holder feels a fault, on a paused clock: a lost
/// lease at its next renewal (one renewal interval after the grant, at most a
/// quarter of one later), renewals that never arrive at the end of the
/// validity (the TTL less the drift), an outage shorter than what is left of
/// the validity never, a longer one at the end of the validity.
#[tokio::test(start_paused = true)]
async fn each_fault_is_felt_when_the_guide_says() {
    let every = TTL / 3;
    let drift = TTL / 100 + Duration::from_millis(2);
    let server = SimServer::new();
    let a = locker(server.backend());

    let guard = a.lock("lost").await.unwrap();
    let granted = Instant::now();
    server.lose_lease("lost").unwrap();
    guard.lost().await;
    let felt = granted.elapsed();
    assert!(felt >= every && felt <= every + every / 4, "{felt:?}");

    server.fault().on_key("unrenewed").fail(Op::Renew).unwrap();
    let guard = a.lock("unrenewed").await.unwrap();
    let granted = Instant::now();
    guard.lost().await;
    let felt = granted.elapsed();
    assert!(
        felt > TTL - drift - every / 4 && felt <= TTL - drift,
        "{felt:?}"
    );

    let guard = a.lock("outage").await.unwrap();
    server.unreachable_for(TTL / 2);
    tokio::time::sleep(TTL * 2).await;
    assert!(
        !guard.is_lost(),
        "an outage shorter than the validity is not felt"
    );
    server.unreachable_for(TTL * 2);
    let since = Instant::now();
    guard.lost().await;
    assert!(since.elapsed() <= TTL - drift, "{:?}", since.elapsed());
}

/// One script with a handoff, a lost lease, a restart, a write lease and
/// fenced writes, traced step by step: what happened, when (Tokio's clock, from
/// the start) and under which fencing token.
async fn script() -> Vec<String> {
    let start = Instant::now();
    let mut trace = Vec::new();
    let mut step = |what: &str, token: FencingToken| {
        trace.push(format!("{:?} {what}: {token}", start.elapsed()));
    };
    let server = SimServer::new();
    let a = Locker::builder(server.backend())
        .lease_ttl(TTL)
        .build()
        .unwrap();
    let b = locker(server.backend());
    let stock = server.fenced_key("stock:7").unwrap();

    // A handoff: A's second task waits, the first passes the lease on.
    let first = a.lock(KEY).await.unwrap();
    step("a locks", first.fencing_token());
    let next = tokio::spawn({
        let a = a.clone();
        async move {
            let guard = a.lock(KEY).await.unwrap();
            let token = guard.fencing_token();
            advance(Duration::from_millis(500)).await;
            guard.release().await.unwrap();
            token
        }
    });
    advance(Duration::from_millis(10)).await;
    let old = first.fencing_token();
    first.release().await.unwrap();
    let handed = next.await.unwrap();
    assert_eq!((handed.epoch, handed.seq), (old.epoch, 1), "a handoff");
    step("a's next task took it over", handed);

    // A lost lease: B takes the key at once; A's late write is refused; A learns
    // of the loss at its next renewal.
    advance(TTL).await;
    let held = a.lock(KEY).await.unwrap();
    step("a locks again", held.fencing_token());
    assert!(server.lose_lease(KEY).unwrap());
    let taken = b.lock(KEY).await.unwrap();
    assert!(taken.fencing_token() > held.fencing_token());
    step("b locks the lost key", taken.fencing_token());
    assert!(stock.set(&taken, "b").await.unwrap().is_applied());
    let late = stock.set(&held, "a").await.unwrap();
    assert!(!late.is_applied());
    trace_push(&mut step, "a's late write", late);
    held.lost().await;
    step("a learns of its loss", held.fencing_token());
    taken.release().await.unwrap();

    // A restart: B's lease is gone; A locks the key in the same instant, with a
    // greater token.
    let before = b.lock("job:8").await.unwrap();
    step("b locks job:8", before.fencing_token());
    server.restart();
    let after = a.lock("job:8").await.unwrap();
    assert!(after.fencing_token() > before.fencing_token());
    step("a locks job:8 after the restart", after.fencing_token());
    before.lost().await;
    step("b learns of the restart", before.fencing_token());
    after.release().await.unwrap();

    let write = a.rwlock(KEY).write().await.unwrap();
    step("a's write lease", write.fencing_token());
    write.release().await.unwrap();
    trace
}

/// Records a fenced write's outcome in the trace, by the token it names.
fn trace_push(step: &mut impl FnMut(&str, FencingToken), what: &str, outcome: Fenced) {
    match outcome {
        Fenced::Applied(()) => step(&format!("{what} applied"), FencingToken::default()),
        Fenced::Stale { last, offered } => {
            step(&format!("{what} refused, offered {offered}, last"), last)
        }
    }
}

/// Runs [`script`] on a fresh paused clock.
fn run_script() -> Vec<String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
        .block_on(script())
}

/// The kit is deterministic, fencing tokens included: epochs come from the
/// server's clock (Tokio's, from the server's creation), so two runs of one
/// script give the same trace. The first grant's epoch is 1; a later one is
/// floored by the µs of virtual time passed.
#[test]
fn two_runs_of_one_script_give_the_same_trace_tokens_included() {
    let (first, second) = (run_script(), run_script());
    assert_eq!(first, second);
    assert_eq!(first[0], "0ns a locks: 1.0", "{first:#?}");
    assert!(
        first[2].starts_with("3.51s a locks again: 3510000.0"),
        "{first:#?}"
    );
}

/// Epochs strictly increase per key across a lost lease in the same instant of
/// the server's clock, where its clock floor alone would repeat them, and across
/// a restart. A restart ends every lease at once, with a reason that says so,
/// and quarantines every grant for the longest lease TTL, as a Redis restarted
/// without its data does.
#[tokio::test(start_paused = true)]
async fn epochs_increase_across_a_loss_and_a_restart_which_holds_grants_for_a_ttl() {
    let server = SimServer::new();
    let [a, b, c] = [(); 3].map(|()| locker(server.backend()));
    let first = a.lock(KEY).await.unwrap();
    server.lose_lease(KEY).unwrap();
    let second = b.lock(KEY).await.unwrap();
    let restarted = tokio::time::Instant::now();
    server.restart();
    let reason = second.loss_signal().reason().expect("lost at once");
    assert!(reason.contains("restarted"), "{reason}");
    let third = c.lock(KEY).await.unwrap();
    assert!(
        restarted.elapsed() >= TTL,
        "granted {:?} after the restart",
        restarted.elapsed()
    );
    let epochs = [&first, &second, &third].map(|g| g.fencing_token().epoch);
    assert_eq!(epochs[..2], [1, 2]);
    assert!(epochs[2] > epochs[1], "{epochs:?}");
    third.release().await.unwrap();
}

/// A fenced key on the server is a resource there: its requests are counted
/// and hit by the server's faults and outages, a request dropped while the
/// server hangs changes nothing, and a restart loses its fence (an older token
/// then writes again, as on a Redis without persistence). A key of its own
/// server is untouched.
#[tokio::test(start_paused = true)]
async fn fenced_keys_meet_the_servers_faults_and_restarts() {
    let server = SimServer::new();
    let stock = server.fenced_key("stock:7").unwrap();
    let alone = SimFencedKey::new("stock:7").unwrap();
    let (old, new) = (FencingToken::new(7, 0), FencingToken::new(8, 0));
    assert!(stock.set(new, 1).await.unwrap().is_applied());
    assert!(alone.set(new, 1).await.unwrap().is_applied());
    assert_eq!(
        server.fenced_key("stock:7").unwrap().get(),
        Some(b"1".to_vec())
    );

    server
        .fault()
        .on_key("stock:7")
        .next(1)
        .fail(Op::Fenced)
        .unwrap();
    let lost = stock.incr_by(new, 1).await;
    assert!(
        matches!(&lost, Err(e @ Error::Backend { .. }) if e.is_transient()),
        "{lost:?}"
    );
    assert_eq!(
        stock.get(),
        Some(b"1".to_vec()),
        "a lost request is not applied"
    );
    server.unreachable_for(Duration::from_secs(1));
    assert!(matches!(
        stock.last_token().await,
        Err(Error::Backend { .. })
    ));
    advance(Duration::from_secs(1)).await;
    assert_eq!(stock.last_token().await.unwrap(), Some(new));
    assert_eq!(server.requests().fenced, 4);
    assert_eq!(server.requests().total(), 4, "fenced requests only");

    server.hang_for(Duration::from_secs(1));
    let dropped = tokio::time::timeout(Duration::from_millis(100), stock.set(new, 2)).await;
    assert!(dropped.is_err(), "still waiting for the server");
    let served = stock.incr_by(new, 1).await.unwrap();
    assert_eq!(served, Fenced::Applied(2), "the dropped write never ran");

    server.restart();
    assert_eq!(stock.get(), None);
    assert_eq!(stock.last_token().await.unwrap(), None);
    assert!(stock.set(old, "late").await.unwrap().is_applied());
    assert_eq!(
        alone.set(old, "late").await.unwrap(),
        Fenced::Stale {
            last: new,
            offered: old
        }
    );
}

/// Bad input to a fenced key is a clear error, and nothing is sent.
#[tokio::test]
async fn bad_fenced_key_input_is_an_error() {
    let server = SimServer::new();
    let e = server.fenced_key("a}b").unwrap_err();
    assert!(matches!(e, Error::InvalidKey { .. }), "{e}");
    let key = server.fenced_key("k").unwrap();
    let t = FencingToken::new(1, 0);
    let e = key.set(t, vec!["two", "args"]).await.unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e}");
    assert!(e.to_string().contains("one Redis argument"), "{e}");
    let e = key.hset(t, [("f", Vec::<u8>::new())]).await;
    assert!(e.is_ok(), "an empty value is one argument: {e:?}");
    let e = key.set_with_ttl(t, "v", Duration::MAX).await.unwrap_err();
    assert!(
        matches!(&e, Error::Refused { code, .. } if code == "ERR"),
        "{e}"
    );
    assert_eq!(server.requests().fenced, 2);
}
