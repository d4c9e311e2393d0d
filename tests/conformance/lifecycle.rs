//! The end of a lease's life, the same for every kind: a dropped holder's release
//! finishes before `shutdown` returns and before the last `Locker`'s drop does, an
//! abandoned acquire's lease is released on the retry schedule, and a holder
//! dropped outside any runtime leaves no local state behind.

use std::sync::Arc;
use std::time::Duration;

use lockflight::{Handoff, Locker};

use crate::exclusion::assert_idle;
use crate::{Kind, Topology, matrix};
use testkit::fault_proxy::{CommandMatcher, FaultProxy};
use testkit::{backend_at, shared, unique_prefix, wait_until, within};

/// Long enough that a key found free was released, not expired.
const TTL: Duration = Duration::from_secs(30);

/// How a program ends: what a `main` does after its last lock.
#[derive(Clone, Copy, Debug)]
enum Exit {
    /// `locker.shutdown().await`, on a current-thread runtime.
    Shutdown,
    /// The last `Locker` dropped, on a multi-thread runtime.
    LastDrop,
}

/// Instance A takes the key and drops its holder (the release goes to a
/// background task), then its program ends as `exit` says and its runtime is
/// dropped, cancelling whatever still runs on it. Instance B must find the key
/// free at once: the release was done before the program's end returned, not left
/// to the lease's TTL.
async fn a_program_that_ends(kind: Kind, topology: Topology, exit: Exit) {
    if topology.refuses(kind).await {
        return;
    }
    let (lockers, _prefix) = topology
        .instances(&format!("exit-{exit:?}-{kind:?}"), 2, TTL)
        .await;
    let [a, b] = <[Locker; 2]>::try_from(lockers).expect("two instances");
    tokio::task::spawn_blocking(move || {
        let runtime = match exit {
            Exit::Shutdown => tokio::runtime::Builder::new_current_thread(),
            Exit::LastDrop => tokio::runtime::Builder::new_multi_thread(),
        }
        .enable_all()
        .build()
        .expect("A's runtime");
        runtime.block_on(async move {
            let held = kind
                .acquire(&a, "k", Duration::from_secs(10))
                .await
                .unwrap_or_else(|e| panic!("{kind:?}: A takes the key: {e}"));
            drop(held);
            match exit {
                Exit::Shutdown => a.shutdown().await,
                Exit::LastDrop => drop(a),
            }
        });
        drop(runtime);
    })
    .await
    .expect("A's program");
    free_at_once(
        kind,
        &b,
        &format!("A's dropped holder was not released before its program ended ({exit:?})"),
    )
    .await;
}

/// A program on a current-thread runtime (`#[tokio::main(flavor =
/// "current_thread")]`) that makes its locker in `main`, locks ten keys twice
/// each (a key locked again soon is warm: its mutex lease stays cached after the
/// second release) and returns, dropping its last `Locker` on the one thread that
/// also drives its connections. Instance B must find all ten keys free at once:
/// the drop released the cached leases on a thread and connections of its own,
/// on every topology, not left them to the lease's TTL. (A holder dropped, not
/// released, right before that drop is not covered: its release is a task of the
/// runtime that ends unrun; `Locker::shutdown` is the way there.)
async fn the_last_drop_on_a_current_thread_runtime_frees_every_key(kind: Kind, topology: Topology) {
    if topology.refuses(kind).await {
        return;
    }
    let (lockers, prefix) = topology
        .instances(&format!("exit-current-{kind:?}"), 2, TTL)
        .await;
    let [a, b] = <[Locker; 2]>::try_from(lockers).expect("two instances");
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    let taken = keys.clone();
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("A's runtime");
        runtime.block_on(async move {
            // Made here, as `main` makes it, where the topology has connections;
            // a linger no busy machine outlasts, so the leases are still cached
            // at the drop.
            let linger = Duration::from_secs(20);
            let a = topology
                .instance_at(&prefix, TTL, |builder| match topology {
                    // Without coalescing there is no slot to keep a lease in.
                    Topology::Uncoalesced => builder,
                    _ => builder
                        .handoff(Handoff::enabled().max_hold(linger))
                        .cache_leases_for(linger),
                })
                .await
                .unwrap_or(a);
            for key in taken.iter().chain(&taken) {
                let held = kind
                    .acquire(&a, key, Duration::from_secs(10))
                    .await
                    .unwrap_or_else(|e| panic!("{kind:?}: A takes {key}: {e}"));
                held.release()
                    .await
                    .unwrap_or_else(|e| panic!("{kind:?}: A releases {key}: {e}"));
            }
            drop(a);
        });
        drop(runtime);
    })
    .await
    .expect("A's program");
    for key in &keys {
        free_key_at_once(
            kind,
            &b,
            key,
            "A's program left it held after its last Locker was dropped on a current-thread runtime",
        )
        .await;
    }
}
matrix!(the_last_drop_on_a_current_thread_runtime_frees_every_key: every topology);

/// Instance `b` takes the key that A held, at once (one attempt), and releases
/// it; `else_what` says what a failure means.
async fn free_at_once(kind: Kind, b: &Locker, else_what: &str) {
    free_key_at_once(kind, b, "k", else_what).await;
}

/// Instance `b` takes `key`, which A held, at once (one attempt), and releases
/// it; `else_what` says what a failure means.
async fn free_key_at_once(kind: Kind, b: &Locker, key: &str, else_what: &str) {
    let next = kind
        .rival()
        .try_acquire(b, key)
        .await
        .unwrap_or_else(|e| panic!("{kind:?}: B's attempt failed: {e}"));
    let Some(next) = next else {
        panic!("{kind:?}: {key}: {else_what}");
    };
    next.release().await.expect("B's release");
}

async fn shutdown_waits_for_a_dropped_holders_release(kind: Kind, topology: Topology) {
    a_program_that_ends(kind, topology, Exit::Shutdown).await;
}
matrix!(shutdown_waits_for_a_dropped_holders_release: every topology);

async fn the_last_drop_waits_for_a_dropped_holders_release(kind: Kind, topology: Topology) {
    a_program_that_ends(kind, topology, Exit::LastDrop).await;
}
matrix!(the_last_drop_waits_for_a_dropped_holders_release: every topology);

/// A holder dropped on a thread without a Tokio runtime: nothing can be sent, so
/// the lease is left to its TTL, but the local state moves on at once (no slot,
/// gate or queue stays behind for the next local task) and the lease is no longer
/// renewed, so another instance gets the key once the TTL ends.
async fn a_holder_dropped_without_a_runtime_settles_locally(kind: Kind, topology: Topology) {
    if topology.refuses(kind).await {
        return;
    }
    let ttl = Duration::from_secs(1);
    let (lockers, _prefix) = topology
        .instances(&format!("no-runtime-{kind:?}"), 2, ttl)
        .await;
    let held = kind
        .acquire(&lockers[0], "k", Duration::from_secs(10))
        .await
        .expect("A takes the key");
    std::thread::spawn(move || drop(held))
        .join()
        .expect("dropped without a runtime");
    assert_idle(&lockers[..1], "after a drop without a runtime").await;
    // Not renewed any more: B gets it within about one TTL (and well before the
    // wait ends if A's watchdog kept renewing it).
    let next = kind
        .rival()
        .acquire(&lockers[1], "k", Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("{kind:?}: B could not take the key after the TTL: {e}"));
    next.release().await.expect("B's release");
}
matrix!(a_holder_dropped_without_a_runtime_settles_locally: every topology);

/// Matches `EVALSHA <sha> …`.
fn evalsha(sha: Vec<u8>) -> CommandMatcher {
    Arc::new(move |args: &[Vec<u8>]| {
        args.len() > 1 && args[0].eq_ignore_ascii_case(b"EVALSHA") && args[1] == sha
    })
}

/// The hashes of the scripts `kind` acquires and releases with, learnt by
/// watching instance `a` take and release a key of its own through `proxy`.
async fn learn(kind: Kind, a: &Locker, proxy: &FaultProxy) -> (Vec<u8>, Vec<u8>) {
    proxy.record(true);
    let held = kind
        .acquire(a, "learn", Duration::from_secs(10))
        .await
        .expect("take the learning key");
    held.release().await.expect("release the learning key");
    // The scripts by hash, in the order they were first sent: the acquire's, then
    // the release's.
    let mut shas: Vec<Vec<u8>> = Vec::new();
    for command in proxy.recorded() {
        if command.len() > 1
            && command[0].eq_ignore_ascii_case(b"EVALSHA")
            && !shas.contains(&command[1])
        {
            shas.push(command[1].clone());
        }
    }
    proxy.record(false);
    assert_eq!(
        shas.len(),
        2,
        "{kind:?}: expected an acquire and a release script"
    );
    (shas[0].clone(), shas[1].clone())
}

/// Instance A's acquire lands at Redis but its reply is lost, and A gives up
/// (its future is dropped) while it asks again. The lease it may hold is released
/// in the background, and the first attempt of that release is lost too: the
/// release is repeated on the retry schedule, so once `shutdown` has waited for
/// it, instance B takes the key at once, not after the TTL.
///
/// On the test kit, faults lose what the proxy loses on one server.
async fn an_abandoned_acquire_is_released_with_retries(kind: Kind, topology: Topology) {
    #[cfg(feature = "testing")]
    if topology == Topology::Sim {
        return abandoned_on_the_kit(kind).await;
    }
    assert_eq!(
        topology,
        Topology::OneServer,
        "a cell of one server's proxy"
    );
    let server = shared();
    let proxy = FaultProxy::start(server).await;
    let prefix = unique_prefix(&format!("abandoned-{kind:?}"));
    let locker = |url: String, prefix: String| async move {
        Locker::builder(backend_at(&url, &prefix).await)
            .lease_ttl(TTL)
            .wait_timeout(Duration::from_secs(30))
            .build()
            .expect("build the locker")
    };
    let a = locker(proxy.url(), prefix.clone()).await;
    let b = locker(server.url(), prefix).await;
    let (acquire, release) = learn(kind, &a, &proxy).await;

    // The acquire is applied, its reply lost; every later copy is lost before
    // Redis sees it; the first release is lost too.
    proxy.drop_replies(evalsha(acquire.clone()), 1);
    proxy.drop_requests(evalsha(acquire), 1_000);
    proxy.drop_requests(evalsha(release), 1);
    let waiting = {
        let a = a.clone();
        tokio::spawn(async move { kind.acquire(&a, "k", Duration::from_secs(60)).await })
    };
    // The reply lost, and A past it (a copy or the release of what may have landed
    // was sent since).
    let lost = wait_until(Duration::from_secs(20), || {
        let lost = proxy.dropped() >= 1 && proxy.dropped_requests() >= 1;
        async move { lost }
    })
    .await;
    assert!(lost, "{kind:?}: the acquire's reply was never lost");
    waiting.abort();
    assert!(
        waiting.await.is_err_and(|e| e.is_cancelled()),
        "{kind:?}: A's acquire ended on its own"
    );
    within(Duration::from_secs(20), "A's shutdown", a.shutdown()).await;
    proxy.clear_rules();
    free_at_once(
        kind,
        &b,
        "the abandoned acquire's lease was left to its TTL",
    )
    .await;
}
matrix!(an_abandoned_acquire_is_released_with_retries:
    one_server => OneServer,
    #[cfg(feature = "testing")]
    sim => Sim,
);

/// [`an_abandoned_acquire_is_released_with_retries`] on the test kit.
#[cfg(feature = "testing")]
async fn abandoned_on_the_kit(kind: Kind) {
    use lockflight::testing::Op;

    let (lockers, prefix) = Topology::Sim
        .instances(&format!("abandoned-{kind:?}"), 2, TTL)
        .await;
    let [a, b] = <[Locker; 2]>::try_from(lockers).expect("two instances");
    let server = crate::kinds::sim_server(&prefix);
    // The acquire is applied, its reply lost; every later copy is lost before
    // the server sees it; the first release is lost too.
    let fault = || server.fault().on_key("k");
    fault().next(1).lose_reply(Op::Acquire).unwrap();
    fault().next(1_000).fail(Op::Acquire).unwrap();
    fault().next(1).fail(Op::Release).unwrap();
    let waiting = {
        let a = a.clone();
        tokio::spawn(async move { kind.acquire(&a, "k", Duration::from_secs(60)).await })
    };
    // The reply lost, and A past it (a copy or the release of what may have landed
    // was sent since).
    let lost = wait_until(Duration::from_secs(20), || {
        let requests = server.requests();
        async move { requests.acquire + requests.release >= 2 }
    })
    .await;
    assert!(lost, "{kind:?}: A never asked again after the lost reply");
    waiting.abort();
    assert!(
        waiting.await.is_err_and(|e| e.is_cancelled()),
        "{kind:?}: A's acquire ended on its own"
    );
    within(Duration::from_secs(20), "A's shutdown", a.shutdown()).await;
    let released = server.requests().release;
    assert!(
        released >= 2,
        "{kind:?}: the lost release was not repeated ({released} sent)"
    );
    server.clear_faults();
    free_at_once(
        kind,
        &b,
        "the abandoned acquire's lease was left to its TTL",
    )
    .await;
}
