//! Wake-ups: per [`LockKind`] and key, the handles that wait for a lock to be
//! free ([`Wakeup`]), and the generations that tell a late watcher it may have
//! missed one.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;
use tokio::sync::{Notify, watch};

use super::Signals;
use super::keyed::Watchers;
use crate::backend::LockKind;
use crate::key::LockKey;

/// The one-at-a-time watchers of a key: the `Notify` they wait on and how many
/// handles exist.
type OneWatchers = DashMap<LockKey, (Arc<Notify>, usize)>;

/// Number of wake-up generation counters per kind; keys share them by hash.
const STRIPES: usize = 64;

/// The watchers and wake-up generations of one [`LockKind`].
pub(super) struct Table {
    watchers: Watchers,
    ones: OneWatchers,
    generations: [AtomicU64; STRIPES],
}

impl Default for Table {
    fn default() -> Self {
        Table {
            watchers: DashMap::new(),
            ones: DashMap::new(),
            generations: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Table {
    fn stripe(&self, key: &[u8]) -> &AtomicU64 {
        &self.generations[crate::key::key_hash(key) as usize % STRIPES]
    }

    fn is_watched(&self, key: &[u8]) -> bool {
        self.watchers.contains_key(key) || self.ones.contains_key(key)
    }

    /// Wakes every watcher of every key, one-at-a-time handles included
    /// ([`Signals::wake_all`]).
    pub(super) fn wake_all(&self) {
        for g in self.generations.iter() {
            g.fetch_add(1, Ordering::AcqRel);
        }
        for tx in self.watchers.iter() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
        for one in self.ones.iter() {
            one.0.notify_waiters();
            // And one kept for a handle that is not waiting right now.
            one.0.notify_one();
        }
    }
}

/// One [`Table`] per [`LockKind`], at [`LockKind::index`].
pub(super) type Tables = [Table; LockKind::ALL.len()];

#[derive(Debug)]
enum Rx {
    All(watch::Receiver<u64>),
    One(Arc<Notify>),
}

/// Interest in the wake-ups of one lock (a kind and a key); dropping it ends the
/// interest.
pub struct Wakeup {
    rx: Option<Rx>,
    kind: LockKind,
    key: LockKey,
    tables: Arc<Tables>,
}

impl fmt::Debug for Wakeup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wakeup")
            .field("kind", &self.kind)
            .field("key", &self.key)
            .field("one_at_a_time", &matches!(self.rx, Some(Rx::One(_))))
            .finish()
    }
}

impl Wakeup {
    /// The kind of lock this handle watches.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// The key this handle watches.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// Resolves at the first wake-up since this handle was created or since the
    /// previous `woken` returned (for a one-at-a-time handle: at the first wake-up
    /// given to it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a wake-up that arrives while no call is pending is kept for the
    /// next call (for a one-at-a-time handle, for the next call of any handle of the
    /// lock), and one given to a call that is dropped before it returns passes to
    /// the next waiting handle.
    pub async fn woken(&mut self) {
        let closed = match self.rx.as_mut() {
            // The sender lives in the registry until every receiver is gone, so
            // `changed` can only fail if the registry itself was dropped.
            Some(Rx::All(rx)) => rx.changed().await.is_err(),
            Some(Rx::One(notify)) => {
                notify.notified().await;
                false
            }
            None => false,
        };
        if closed {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Wakeup {
    fn drop(&mut self) {
        let table = &self.tables[self.kind.index()];
        match self.rx.take() {
            Some(Rx::All(rx)) => {
                drop(rx);
                // Under the shard lock, so a concurrent `watch` either sees the entry
                // and subscribes before this check, or inserts a fresh one after the
                // removal.
                table
                    .watchers
                    .remove_if(&self.key, |_, tx| tx.receiver_count() == 0);
            }
            Some(Rx::One(_)) => {
                if let dashmap::Entry::Occupied(mut entry) = table.ones.entry(self.key.clone()) {
                    entry.get_mut().1 -= 1;
                    if entry.get().1 == 0 {
                        entry.remove();
                    } else {
                        // The next one asks now: this one no longer will.
                        entry.get().0.notify_one();
                    }
                }
            }
            None => {}
        }
    }
}

impl Signals {
    fn table(&self, kind: LockKind) -> &Table {
        &self.tables[kind.index()]
    }

    /// The wake-up generation of the `kind` lock of `key`: it changes whenever that
    /// lock (or another key's lock of the same kind and stripe) is woken, never by a
    /// wake-up of another kind. Read it before asking the backend; if it changed by
    /// the time you watch, a wake-up may have been missed: ask again at once.
    pub fn generation(&self, kind: LockKind, key: &[u8]) -> u64 {
        self.table(kind).stripe(key).load(Ordering::Acquire)
    }

    /// Starts watching the `kind` lock of `key`; every wake-up of it from now on is
    /// seen by the returned handle.
    pub fn watch(&self, kind: LockKind, key: &LockKey) -> Wakeup {
        let rx = self
            .table(kind)
            .watchers
            .entry(key.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Wakeup {
            rx: Some(Rx::All(rx)),
            kind,
            key: key.clone(),
            tables: Arc::clone(&self.tables),
        }
    }

    /// Starts watching the `kind` lock of `key` one at a time: a wake-up reaches one
    /// of the handles from `watch_one` for it (the one waiting longest; kept for the
    /// next `woken` call if none is waiting). A handle that is dropped passes one
    /// wake-up on to the others, so whoever leaves the wait (it got the lock, gave
    /// up or was cancelled) lets the next one ask.
    pub fn watch_one(&self, kind: LockKind, key: &LockKey) -> Wakeup {
        let notify = {
            let mut entry = self
                .table(kind)
                .ones
                .entry(key.clone())
                .or_insert_with(|| (Arc::new(Notify::new()), 0));
            entry.1 += 1;
            Arc::clone(&entry.0)
        };
        Wakeup {
            rx: Some(Rx::One(notify)),
            kind,
            key: key.clone(),
            tables: Arc::clone(&self.tables),
        }
    }

    /// Wakes every [`watch`](Self::watch) handle of the `kind` lock of `key` and
    /// one [`watch_one`](Self::watch_one) handle; the other kinds' handles of the
    /// same key bytes are left alone. Returns `false` if nobody watches that lock.
    pub fn wake(&self, kind: LockKind, key: &[u8]) -> bool {
        let table = self.table(kind);
        table.stripe(key).fetch_add(1, Ordering::AcqRel);
        let mut watched = false;
        if let Some(tx) = table.watchers.get(key) {
            tx.send_modify(|n| *n = n.wrapping_add(1));
            watched = true;
        }
        if let Some(one) = table.ones.get(key) {
            one.0.notify_one();
            watched = true;
        }
        watched
    }

    /// Number of handles currently watching the `kind` lock of `key`.
    pub fn watchers(&self, kind: LockKind, key: &[u8]) -> usize {
        let table = self.table(kind);
        table.watchers.get(key).map_or(0, |tx| tx.receiver_count())
            + table.ones.get(key).map_or(0, |one| one.1)
    }

    /// Whether anyone watches the `kind` lock of `key` (a watcher of another kind
    /// of the same key bytes does not count).
    pub fn is_watched(&self, kind: LockKind, key: &[u8]) -> bool {
        self.table(kind).is_watched(key)
    }

    /// Number of locks (kind and key) currently watched.
    pub fn len(&self) -> usize {
        self.tables
            .iter()
            .map(|table| {
                table.watchers.len()
                    + table
                        .ones
                        .iter()
                        .filter(|one| !table.watchers.contains_key(one.key()))
                        .count()
            })
            .sum()
    }

    /// Whether no lock is watched.
    pub fn is_empty(&self) -> bool {
        self.tables
            .iter()
            .all(|table| table.watchers.is_empty() && table.ones.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: LockKind = LockKind::Mutex;

    #[tokio::test]
    async fn a_wake_before_waiting_is_kept_and_entries_are_removed() {
        let reg = Signals::new();
        let key = LockKey::from("k");
        let before = reg.generation(M, b"k");
        assert!(!reg.wake(M, b"k"), "nobody watches yet");
        assert_ne!(
            reg.generation(M, b"k"),
            before,
            "an unwatched wake-up still counts"
        );
        let mut a = reg.watch(M, &key);
        let mut b = reg.watch(M, &key);
        assert!(reg.wake(M, b"k"));
        // Both see the wake-up that happened before they started waiting.
        a.woken().await;
        b.woken().await;
        drop(a);
        assert_eq!(reg.len(), 1);
        drop(b);
        assert!(reg.is_empty());
        assert!(!reg.wake(M, b"k"));
    }

    #[tokio::test]
    async fn one_wake_up_reaches_one_handle_and_a_dropped_handle_passes_it_on() {
        use std::time::Duration;
        use tokio::time::timeout;

        let reg = Signals::new();
        let key = LockKey::from("k");
        let mut a = reg.watch_one(M, &key);
        let mut b = reg.watch_one(M, &key);
        let mut all = reg.watch(M, &key);
        assert_eq!(reg.watchers(M, b"k"), 3);
        assert_eq!(reg.len(), 1);
        assert!(reg.wake(M, b"k"));
        // The broadcast handle sees it, and exactly one of the two others.
        all.woken().await;
        a.woken().await;
        let short = Duration::from_millis(20);
        assert!(timeout(short, b.woken()).await.is_err(), "b was woken too");
        // `a` stops waiting: its leaving passes one wake-up on to `b`.
        drop(a);
        timeout(Duration::from_secs(5), b.woken())
            .await
            .expect("the dropped handle passed its turn on");
        // A wake-up given to a `woken` call that is dropped before it returns goes
        // to the next waiting handle (the call is cancel safe).
        let mut c = reg.watch_one(M, &key);
        {
            let mut wait_b = Box::pin(b.woken());
            let mut wait_c = Box::pin(c.woken());
            assert!(futures::poll!(&mut wait_b).is_pending());
            assert!(futures::poll!(&mut wait_c).is_pending());
            assert!(reg.wake(M, b"k"));
            // b has waited longest: the wake-up is b's, not c's.
            assert!(futures::poll!(&mut wait_c).is_pending());
            drop(wait_b);
            timeout(Duration::from_secs(5), wait_c)
                .await
                .expect("a dropped call passed its wake-up on");
        }
        // A reconnect wakes every waiting handle.
        {
            let mut wait_b = std::pin::pin!(b.woken());
            let mut wait_c = std::pin::pin!(c.woken());
            assert!(futures::poll!(&mut wait_b).is_pending());
            assert!(futures::poll!(&mut wait_c).is_pending());
            reg.wake_all();
            timeout(Duration::from_secs(5), wait_b).await.unwrap();
            timeout(Duration::from_secs(5), wait_c).await.unwrap();
        }
        drop((b, c, all));
        assert!(reg.is_empty());
        assert!(!reg.wake(M, b"k"));
    }

    /// A wake-up of one kind reaches neither the watchers nor the generation of
    /// another kind's lock of the same key bytes; each kind's watchers and entries
    /// are counted and removed on their own.
    #[tokio::test]
    async fn kinds_of_one_key_are_woken_and_counted_apart() {
        use std::time::Duration;
        use tokio::time::timeout;

        let reg = Signals::new();
        let key = LockKey::from("k");
        let short = Duration::from_millis(20);
        let mut mutex = reg.watch(LockKind::Mutex, &key);
        let mut rw = reg.watch_one(LockKind::ReadWrite, &key);
        assert!(!reg.is_watched(LockKind::Semaphore, b"k"));
        assert_eq!(reg.watchers(LockKind::Semaphore, b"k"), 0);
        assert_eq!(reg.watchers(LockKind::Mutex, b"k"), 1);
        assert_eq!(reg.watchers(LockKind::ReadWrite, b"k"), 1);
        assert_eq!(reg.len(), 2);

        let generations = |reg: &Signals| LockKind::ALL.map(|k| reg.generation(k, b"k"));
        let before = generations(&reg);
        assert!(
            !reg.wake(LockKind::Semaphore, b"k"),
            "nobody watches the semaphore"
        );
        let after = generations(&reg);
        assert_eq!(after[..2], before[..2], "other kinds' generations moved");
        assert_ne!(after[2], before[2], "an unwatched wake-up still counts");
        assert!(timeout(short, mutex.woken()).await.is_err(), "mutex woken");
        assert!(timeout(short, rw.woken()).await.is_err(), "rw woken");

        assert!(reg.wake(LockKind::Mutex, b"k"));
        mutex.woken().await;
        assert!(timeout(short, rw.woken()).await.is_err(), "rw woken");
        assert_eq!(generations(&reg)[1], before[1]);

        assert!(reg.wake(LockKind::ReadWrite, b"k"));
        rw.woken().await;
        assert!(timeout(short, mutex.woken()).await.is_err(), "mutex woken");

        // A reconnect wakes every kind.
        reg.wake_all();
        mutex.woken().await;
        rw.woken().await;
        assert!(
            generations(&reg)
                .iter()
                .zip(after)
                .all(|(now, then)| *now != then),
            "wake_all moves every kind's generation"
        );

        drop(mutex);
        assert!(!reg.is_watched(LockKind::Mutex, b"k"));
        assert!(reg.is_watched(LockKind::ReadWrite, b"k"));
        assert_eq!(reg.len(), 1);
        drop(rw);
        assert!(reg.is_empty());
    }
}
