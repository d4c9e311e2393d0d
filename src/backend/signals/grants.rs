//! Grants: the server gave this instance's waiting mutex acquire the lock itself
//! (`lua/release.lua` of the Redis backend), or its waiting writer the write
//! lease of a read-write lock (`lua/rw_release.lua`), and the message says so:
//! the token it was granted to, its fencing epoch, and who still waits.
//!
//! A grant is kept here, by lock kind and key (a user key may name both a mutex
//! and a read-write lock, two independent locks), until the acquire loop waiting with that token
//! takes it ([`Signals::take_grant`]), and it wakes that loop alone, through the
//! handle the loop registered for its token ([`Signals::watch_grant`]): the other
//! tasks waiting for the key (without coalescing, each asks on its own) are not
//! disturbed, since the lock is held again. The message may come before the loop
//! registers (the busy reply that queued it and the release that grants race on
//! two connections), so a grant nobody watches is kept too, and a loop looks for
//! one right after it registers. What nobody takes is replaced by the key's next
//! grant, or swept once more than [`KEPT`] keys hold one: a grant for a token
//! whose acquire was given up is never taken here, and that token's release
//! (which the given-up acquire sends) frees the lock at the server.
//!
//! **A grant is taken once, and a copy of it is no grant.** A Cluster may deliver
//! a message twice (once through the key's node, once over the cluster bus), so a
//! second copy of a grant may come after the first was taken, while its lease is
//! held or while that lease's release is on the wire. Kept, it would be a grant
//! nobody takes: the notifier would give it back (`leave.lua` deletes the lock
//! if it is still the token's and no ask took the grant, which taking it from a
//! message does not show the server), deleting a lease this instance holds or
//! is releasing. So the tokens whose grant was taken (or given back) are kept,
//! the last [`TAKEN_KEPT`], under the same lock as the untaken grants, and a
//! grant for one of them is dropped where it arrives: no take can fall between
//! the check and the keeping. A token names one acquire of this process and is
//! granted at most once (a release grants only a queued token without a release
//! record, and a granted token leaves the queue), so every later grant for it is
//! a copy. A copy later than [`TAKEN_KEPT`] further takes finds the lease
//! registered (`holds`) or released: `leave.lua` then finds the lock another
//! token's, and changes nothing.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::Signals;
use crate::backend::{LeaseToken, LockKind};

/// The acquire loops waiting with a token that a grant may name, by lock kind,
/// key and token.
pub(super) type GrantWatches = dashmap::DashMap<(LockKind, Vec<u8>, LeaseToken), Arc<Notify>>;

/// The keys with an untaken grant beyond which those nobody watches are swept.
const KEPT: usize = 256;

/// How many tokens whose grant was taken are remembered, so that a copy of
/// their grant message is dropped.
const TAKEN_KEPT: usize = 4096;

/// The grants not taken yet, by lock kind and key, and the tokens whose grant
/// was taken.
#[derive(Debug, Default)]
pub(crate) struct Granted {
    by_key: HashMap<(LockKind, Vec<u8>), Grant>,
    taken: HashSet<LeaseToken>,
    /// `taken` in the order of taking, for the bound.
    order: VecDeque<LeaseToken>,
}

impl Granted {
    /// Takes the grant of the `kind` lock of `key` if it is for `token`, and
    /// remembers the token.
    fn take(&mut self, kind: LockKind, key: &[u8], token: LeaseToken) -> Option<Grant> {
        let at = (kind, key.to_vec());
        if self
            .by_key
            .get(&at)
            .is_none_or(|grant| grant.token != token)
        {
            return None;
        }
        let grant = self.by_key.remove(&at);
        if self.taken.insert(token) {
            self.order.push_back(token);
            if self.order.len() > TAKEN_KEPT
                && let Some(oldest) = self.order.pop_front()
            {
                self.taken.remove(&oldest);
            }
        }
        grant
    }
}

/// The origin of this process's send stamps.
static ORIGIN: OnceLock<Instant> = OnceLock::new();

/// The send stamp of a request sent now (`at`): µs on this process's clock, which
/// the acquire script keeps in the grant entry and the grant message echoes
/// unread. Rounded down, so the instant it names is never later than `at`.
pub(crate) fn send_stamp(at: Instant) -> u64 {
    let origin = *ORIGIN.get_or_init(|| at);
    u64::try_from(at.saturating_duration_since(origin).as_micros()).unwrap_or(u64::MAX)
}

/// The instant a [`send_stamp`] names (`None` for one this process never made).
pub(crate) fn stamp_instant(stamp: u64) -> Option<Instant> {
    ORIGIN.get()?.checked_add(Duration::from_micros(stamp))
}

/// A grant of a key's mutex, or of its read-write lock's write lease, to one
/// token, from the server's message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) token: LeaseToken,
    pub(crate) epoch: u64,
    /// The instances still waiting for the key's mutex, or the writers still
    /// waiting for its read-write lock.
    pub(crate) waiting: u32,
    /// How long the server keeps the lock for the token at least, counted from
    /// the arrival of the token's last ask (its renewal makes it a full lease).
    pub(crate) window: Duration,
    /// When the granted ask was sent, from its echoed [`send_stamp`]: the
    /// grant's validity counts from here.
    pub(crate) sent: Instant,
    /// When the earliest instance still waiting arrived, in µs after the
    /// arrival of the token's last ask (negative: before it), if one waits: fair
    /// mode's hand-on bound.
    pub(crate) earliest_after_ask: Option<i64>,
}

/// The registration of one acquire loop waiting with `token` for a key's mutex
/// or write lease:
/// [`granted`](Self::granted) resolves when a grant to that token arrives.
/// Dropping it ends the registration.
#[derive(Debug)]
pub(crate) struct GrantWatch {
    signals: Signals,
    at: (LockKind, Vec<u8>, LeaseToken),
    notify: Arc<Notify>,
}

impl GrantWatch {
    /// Resolves once a grant to this token arrived since the registration (or
    /// since the last call that resolved).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a grant that arrives while no call is pending is kept for the
    /// next call (a stored permit).
    pub(crate) async fn granted(&self) {
        self.notify.notified().await;
    }
}

impl Drop for GrantWatch {
    fn drop(&mut self) {
        self.signals.grant_watches.remove(&self.at);
    }
}

impl Signals {
    /// Whether this backend's releases grant the lock to the next waiting
    /// instance: a waiting mutex acquire (or writer) may then hold the lock
    /// without asking, so its token stays armed (released if the acquire is
    /// given up).
    pub(crate) fn grants(&self) -> bool {
        self.grants.load(Ordering::Relaxed)
    }

    /// Says whether this backend's releases grant (see [`grants`](Self::grants)).
    pub(crate) fn set_grants(&self, grants: bool) {
        self.grants.store(grants, Ordering::Relaxed);
    }

    /// Registers an acquire loop waiting with `token` for the `kind` lock of
    /// `key`.
    pub(crate) fn watch_grant(&self, kind: LockKind, key: &[u8], token: LeaseToken) -> GrantWatch {
        let at = (kind, key.to_vec(), token);
        let notify = Arc::clone(self.grant_watches.entry(at.clone()).or_default().value());
        GrantWatch {
            signals: self.clone(),
            at,
            notify,
        }
    }

    /// A grant of the `kind` lock of `key` arrived: keeps it for the acquire
    /// waiting with its token and wakes that one (or, if none registered that
    /// token, the waiters of that lock). Returns `false`, keeping and waking
    /// nothing, for a copy of a grant already taken.
    pub(crate) fn grant(&self, kind: LockKind, key: &[u8], grant: Grant) -> bool {
        {
            let mut granted = self.granted();
            if granted.taken.contains(&grant.token) {
                return false;
            }
            if granted.by_key.len() >= KEPT {
                granted.by_key.retain(|(kind, key), grant| {
                    self.grant_watches
                        .contains_key(&(*kind, key.clone(), grant.token))
                });
            }
            granted.by_key.insert((kind, key.to_vec()), grant);
        }
        match self.grant_watches.get(&(kind, key.to_vec(), grant.token)) {
            Some(notify) => notify.notify_one(),
            // Nobody registered that token (yet): the key's waiters, if any, are
            // woken as by a release, and whoever asks with the token is answered
            // "already yours".
            None => {
                self.wake(kind, key);
            }
        }
        true
    }

    /// Whether an acquire loop of this instance waits with `token` for a grant
    /// of the `kind` lock of `key`.
    pub(crate) fn wants_grant(&self, kind: LockKind, key: &[u8], token: LeaseToken) -> bool {
        self.grant_watches
            .contains_key(&(kind, key.to_vec(), token))
    }

    /// Whether a lease with `token` is held here (registered): a copy of a grant
    /// message already taken (a Cluster delivers some twice) is then no unwanted
    /// grant.
    pub(crate) fn holds(&self, token: LeaseToken) -> bool {
        self.registered.contains_key(&token)
    }

    /// Whether a grant of the `kind` lock of `key` to `token` came and was not
    /// taken.
    pub(crate) fn has_grant(&self, kind: LockKind, key: &[u8], token: LeaseToken) -> bool {
        self.granted()
            .by_key
            .get(&(kind, key.to_vec()))
            .is_some_and(|grant| grant.token == token)
    }

    /// The grant of the `kind` lock of `key` to `token`, if one came: taken (a
    /// second call, or a copy of its message, finds none). A grant to another
    /// token, or of another kind's lock of the key, stays.
    pub(crate) fn take_grant(
        &self,
        kind: LockKind,
        key: &[u8],
        token: LeaseToken,
    ) -> Option<Grant> {
        self.granted().take(kind, key, token)
    }

    fn granted(&self) -> MutexGuard<'_, Granted> {
        self.granted.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: LockKind = LockKind::Mutex;

    /// A grant to `token` with `epoch`, a 500 ms window, made from an ask sent now.
    fn grant_to(token: LeaseToken, epoch: u64, waiting: u32) -> Grant {
        Grant {
            token,
            epoch,
            waiting,
            window: Duration::from_millis(500),
            earliest_after_ask: None,
            sent: Instant::now(),
        }
    }

    #[tokio::test]
    async fn a_grant_wakes_its_token_alone_and_is_taken_once() {
        let signals = Signals::new();
        let (mine, other) = (LeaseToken::random(), LeaseToken::random());
        let watch = signals.watch_grant(M, b"k", mine);
        let theirs = signals.watch_grant(M, b"k", other);
        let grant = grant_to(mine, 7, 1);
        // Kept, and its token's loop alone woken.
        signals.grant(M, b"k", grant);
        watch.granted().await;
        let woke = tokio::time::timeout(Duration::from_millis(20), theirs.granted());
        assert!(woke.await.is_err(), "another token's loop was woken");
        assert_eq!(signals.take_grant(M, b"k", other), None);
        assert_eq!(signals.take_grant(M, b"k", mine), Some(grant));
        assert_eq!(signals.take_grant(M, b"k", mine), None);
        drop((watch, theirs));
        assert!(signals.grant_watches.is_empty());
    }

    /// A key may name both a mutex and a read-write lock, two independent locks:
    /// a grant of one is kept, woken and taken apart from the other's.
    #[tokio::test]
    async fn a_grant_of_one_kind_is_not_the_other_kinds() {
        let signals = Signals::new();
        let token = LeaseToken::random();
        let mutex = signals.watch_grant(M, b"k", token);
        let write = signals.watch_grant(LockKind::ReadWrite, b"k", token);
        let grant = grant_to(token, 5, 0);
        assert!(signals.grant(LockKind::ReadWrite, b"k", grant));
        write.granted().await;
        let woke = tokio::time::timeout(Duration::from_millis(20), mutex.granted());
        assert!(woke.await.is_err(), "a write grant woke the mutex's loop");
        assert!(!signals.has_grant(M, b"k", token));
        assert_eq!(signals.take_grant(M, b"k", token), None);
        assert!(signals.wants_grant(LockKind::ReadWrite, b"k", token));
        assert_eq!(
            signals.take_grant(LockKind::ReadWrite, b"k", token),
            Some(grant)
        );
        drop(write);
        assert!(!signals.wants_grant(LockKind::ReadWrite, b"k", token));
        assert!(signals.wants_grant(M, b"k", token));
    }

    #[test]
    fn grants_nobody_watches_are_swept_beyond_the_bound() {
        let signals = Signals::new();
        let token = LeaseToken::random();
        let _watch = signals.watch_grant(M, b"watched", token);
        let grant = grant_to(token, 1, 0);
        signals.grant(M, b"watched", grant);
        for i in 0..KEPT + 10 {
            signals.grant(M, format!("k{i}").as_bytes(), grant);
        }
        assert!(signals.granted().by_key.len() <= KEPT + 1);
        assert_eq!(signals.take_grant(M, b"watched", token), Some(grant));
    }

    /// A Cluster may deliver a grant message twice: a copy that comes after the
    /// grant was taken is dropped where it arrives (kept, the notifier would give
    /// it back and delete the lease it names, held or being released).
    #[tokio::test]
    async fn a_copy_of_a_taken_grant_is_dropped_and_wakes_nobody() {
        let signals = Signals::new();
        let token = LeaseToken::random();
        let grant = grant_to(token, 3, 0);
        let watch = signals.watch_grant(M, b"k", token);
        assert!(signals.grant(M, b"k", grant));
        watch.granted().await;
        assert_eq!(signals.take_grant(M, b"k", token), Some(grant));
        let mut waiter = signals.watch(M, &crate::LockKey::from("k"));
        assert!(!signals.grant(M, b"k", grant), "a copy was kept");
        assert!(!signals.has_grant(M, b"k", token));
        assert_eq!(signals.take_grant(M, b"k", token), None);
        let woke = tokio::time::timeout(Duration::from_millis(20), waiter.woken());
        assert!(woke.await.is_err(), "a copy woke the key's waiters");
        let late = tokio::time::timeout(Duration::from_millis(20), watch.granted());
        assert!(late.await.is_err(), "a copy woke the token's loop");
        // A grant for another token is no copy.
        let next = Grant {
            token: LeaseToken::random(),
            ..grant
        };
        assert!(signals.grant(M, b"k", next));
        assert_eq!(signals.take_grant(M, b"k", next.token), Some(next));
    }

    #[test]
    fn the_taken_tokens_are_bounded() {
        let signals = Signals::new();
        let first = LeaseToken::random();
        assert!(signals.grant(M, b"k", grant_to(first, 1, 0)));
        assert!(signals.take_grant(M, b"k", first).is_some());
        for _ in 0..TAKEN_KEPT {
            let t = LeaseToken::random();
            assert!(signals.grant(M, b"k", grant_to(t, 1, 0)));
            assert!(signals.take_grant(M, b"k", t).is_some());
        }
        let granted = signals.granted();
        assert_eq!(granted.taken.len(), TAKEN_KEPT);
        assert_eq!(granted.order.len(), TAKEN_KEPT);
        assert!(!granted.taken.contains(&first));
    }
}
