//! Exclusion, fencing, loss and cancellation: the promises every holder relies on,
//! for every kind.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockflight::{Error, FencingToken, LockKey, Locker};
use tokio::task::JoinSet;

use crate::{Held, Kind, Topology, matrix};
use testkit::{assert_strictly_increasing, join_all, wait_until, within};

/// How long a cell waits for its lockers' local state to go.
const IDLE: Duration = Duration::from_secs(10);

/// Waits until none of `lockers` keeps local state for any kind.
pub(crate) async fn assert_idle(lockers: &[Locker], what: &str) {
    let idle = wait_until(IDLE, || {
        let idle = lockers
            .iter()
            .all(|l| Kind::ALL.iter().all(|k| k.idle_in(l)));
        async move { idle }
    })
    .await;
    assert!(idle, "{what}: local lock state left behind");
}

/// Who is inside the key's critical sections right now, and what was seen.
#[derive(Default)]
struct Inside {
    shared: AtomicUsize,
    exclusive: AtomicUsize,
    overlaps: AtomicUsize,
    tokens: Mutex<Vec<FencingToken>>,
}

impl Inside {
    /// Enters a section held as `held`; records overlaps that its kind forbids.
    fn enter(&self, held: &Held) {
        if held.is_shared() {
            self.shared.fetch_add(1, Ordering::SeqCst);
            if self.exclusive.load(Ordering::SeqCst) > 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
        } else {
            let before = self.exclusive.fetch_add(1, Ordering::SeqCst);
            if before > 0 || self.shared.load(Ordering::SeqCst) > 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
            // Exclusive: sections enter in the order they hold the key.
            if let Some(token) = held.fencing_token() {
                self.tokens.lock().unwrap().push(token);
            }
        }
    }

    fn leave(&self, held: &Held) {
        let counter = if held.is_shared() {
            &self.shared
        } else {
            &self.exclusive
        };
        counter.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Three instances × four tasks, eight sections each. For the read kind, the
/// tasks alternate between reads and writes (readers may share; nobody may overlap
/// a writer). No section may overlap another that its kind excludes, and the
/// tokens of fenced sections (mutex, write) strictly increase in section order.
async fn exclusive_sections_and_increasing_tokens(kind: Kind, topology: Topology) {
    if topology.refuses(kind).await {
        return;
    }
    const TASKS: usize = 4;
    const ROUNDS: usize = 8;
    let (lockers, _prefix) = topology
        .instances(&format!("exclusion-{kind:?}"), 3, Duration::from_secs(5))
        .await;
    let inside = Arc::new(Inside::default());
    let mut tasks = JoinSet::new();
    for locker in &lockers {
        for task in 0..TASKS {
            let (locker, inside) = (locker.clone(), Arc::clone(&inside));
            tasks.spawn(async move {
                for round in 0..ROUNDS {
                    let this = if (task + round) % 2 == 0 {
                        kind
                    } else {
                        kind.rival()
                    };
                    let held = this
                        .acquire(&locker, "k", Duration::from_secs(30))
                        .await
                        .unwrap_or_else(|e| panic!("{this:?} round {round}: {e}"));
                    inside.enter(&held);
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.leave(&held);
                    held.release().await.expect("release");
                }
            });
        }
    }
    within(Duration::from_secs(60), "the sections", join_all(tasks)).await;

    assert_eq!(
        inside.overlaps.load(Ordering::SeqCst),
        0,
        "{kind:?} on {topology:?}: sections overlapped that the kind excludes"
    );
    let tokens = inside.tokens.lock().unwrap().clone();
    if matches!(kind, Kind::Mutex | Kind::Write | Kind::Read | Kind::Many) {
        let sections = lockers.len() * TASKS * ROUNDS;
        let fenced = if kind == Kind::Read {
            sections / 2
        } else {
            sections
        };
        assert_eq!(
            tokens.len(),
            fenced,
            "every fenced section recorded a token"
        );
        assert_strictly_increasing(&tokens, &format!("{kind:?} on {topology:?}"));
    } else {
        assert!(
            tokens.is_empty(),
            "{kind:?} sections carry no fencing token"
        );
    }
    assert_idle(&lockers, "after the sections").await;
}
matrix!(exclusive_sections_and_increasing_tokens: every topology);

/// Three instances on the cell's topology, of which B holds the key (`kind`'s
/// rival); `None` when the topology does not offer `kind`.
async fn b_holds(kind: Kind, topology: Topology, cell: &str) -> Option<(Vec<Locker>, Held)> {
    if topology.refuses(kind).await {
        return None;
    }
    let (lockers, _prefix) = topology
        .instances(&format!("{cell}-{kind:?}"), 3, Duration::from_secs(30))
        .await;
    let holder = kind
        .rival()
        .acquire(&lockers[1], "k", Duration::from_secs(5))
        .await
        .expect("B takes the key");
    Some((lockers, holder))
}

/// B releases: C gets the key at once, not after a lease TTL (30 s), and A, whose
/// waits were abandoned, keeps no state for it.
async fn c_takes_the_key_after_abandoned_waits(
    kind: Kind,
    lockers: &[Locker],
    holder: Held,
    how: &str,
) {
    holder.release().await.expect("B's release");
    let next = within(
        Duration::from_secs(5),
        &format!("C to take the key after B's release (a {how} waiter must not hold it)"),
        kind.rival()
            .acquire(&lockers[2], "k", Duration::from_secs(5)),
    )
    .await
    .unwrap_or_else(|e| panic!("{kind:?}: C could not take the key: {e}"));
    next.release().await.unwrap();
    assert_idle(lockers, &format!("after the {how} waits")).await;
}

/// Instance B holds the key; instance A's acquires are cancelled after 0, 1, 5 and
/// 20 ms of waiting (at whatever await they are). Then B releases: instance C gets
/// the key at once, not after a lease TTL (30 s), and A keeps no state for it.
async fn cancelled_waiters_leave_nothing_locked(kind: Kind, topology: Topology) {
    let Some((lockers, holder)) = b_holds(kind, topology, "cancel").await else {
        return;
    };
    for after in [0, 1, 5, 20] {
        let a = lockers[0].clone();
        let waiting =
            tokio::spawn(async move { kind.acquire(&a, "k", Duration::from_secs(20)).await });
        tokio::time::sleep(Duration::from_millis(after)).await;
        waiting.abort();
        match waiting.await {
            Err(e) if e.is_cancelled() => {}
            Err(e) => panic!("{kind:?}: the waiting acquire panicked: {e}"),
            Ok(Ok(_)) => panic!("{kind:?}: A got the key while B held it"),
            Ok(Err(e)) => panic!("{kind:?}: A's acquire failed instead of waiting: {e}"),
        }
    }
    c_takes_the_key_after_abandoned_waits(kind, &lockers, holder, "cancelled").await;
}
matrix!(cancelled_waiters_leave_nothing_locked: every topology);

/// Instance B holds the key; instance A's acquire is polled by hand, found
/// pending, and dropped (after one poll, after two, and after ten, a
/// millisecond apart: before it was sent, while it waits at the backend, and
/// while it waits for a wake-up). Then B releases: instance C gets the key at
/// once, and A keeps no state for it. The waiting future's own cancel safety,
/// without a task or a runtime's abort in between.
async fn a_waiter_dropped_while_pending_leaves_nothing(kind: Kind, topology: Topology) {
    let Some((lockers, holder)) = b_holds(kind, topology, "drop-pending").await else {
        return;
    };
    for polls in [1, 2, 10] {
        let mut waiting = std::pin::pin!(kind.acquire(&lockers[0], "k", Duration::from_secs(20)));
        for _ in 0..polls {
            assert!(
                futures::poll!(waiting.as_mut()).is_pending(),
                "{kind:?}: A's acquire finished while B held the key"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    c_takes_the_key_after_abandoned_waits(kind, &lockers, holder, "dropped").await;
}
matrix!(a_waiter_dropped_while_pending_leaves_nothing: every topology);

/// An empty key and a key one byte over `LockKey::MAX_LEN` are refused with
/// `Error::InvalidKey` naming the key, by the waiting and the trying calls alike,
/// before anything is sent.
async fn bad_keys_are_clear_errors(kind: Kind, topology: Topology) {
    if topology.refuses(kind).await {
        return;
    }
    let (lockers, _prefix) = topology
        .instances(&format!("bad-key-{kind:?}"), 1, Duration::from_secs(5))
        .await;
    let locker = &lockers[0];
    let long = "k".repeat(LockKey::MAX_LEN + 1);
    for key in ["", long.as_str()] {
        let waited = kind.acquire(locker, key, Duration::from_secs(1)).await;
        let tried = kind.try_acquire(locker, key).await;
        for (call, result) in [("acquire", waited.err()), ("try", tried.err())] {
            match result {
                Some(e @ Error::InvalidKey { .. }) => {
                    assert_eq!(e.key(), Some(&LockKey::from(key)), "{kind:?} {call}");
                    assert_eq!(e.code(), "invalid_key");
                }
                other => panic!("{kind:?} {call} with a {}-byte key: {other:?}", key.len()),
            }
        }
    }
    assert_eq!(locker.stats().acquire_attempts, 0, "nothing was sent");
    assert_idle(&lockers, "after the refusals").await;
}
matrix!(bad_keys_are_clear_errors: every topology);
