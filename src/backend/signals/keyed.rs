//! One key's signal that is not a wake-up (a revocation, a leader change): a
//! `watch` channel per key, made by the key's first handle and removed with its
//! last.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::watch;

use crate::key::LockKey;

/// Per key, the sender every handle of the key subscribes to.
pub(super) type Watchers = DashMap<LockKey, watch::Sender<u64>>;

/// One key's entry in a per-key signal map (revocations, leader changes), held
/// by one handle: it sees every signal of the key sent after it was made, and
/// the map's entry goes with the key's last handle.
#[derive(Debug)]
pub(super) struct KeySignal {
    rx: Option<watch::Receiver<u64>>,
    pub(super) key: LockKey,
    map: Arc<Watchers>,
}

impl KeySignal {
    /// A handle on `key`'s entry of `map` (made if it is the first).
    pub(super) fn watch(map: &Arc<Watchers>, key: &LockKey) -> KeySignal {
        let rx = map
            .entry(key.clone())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        KeySignal {
            rx: Some(rx),
            key: key.clone(),
            map: Arc::clone(map),
        }
    }

    /// Signals every handle of `key` in `map`; `false` if there is none.
    pub(super) fn send(map: &Watchers, key: &[u8]) -> bool {
        match map.get(key) {
            Some(tx) => {
                tx.send_modify(|n| *n = n.wrapping_add(1));
                true
            }
            None => false,
        }
    }

    /// Signals every handle of every key in `map` (after a lost notification
    /// connection, when messages may have been missed).
    pub(super) fn send_all(map: &Watchers) {
        for tx in map.iter() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// Whether a signal came that this handle has not awaited yet.
    pub(super) fn has_changed(&self) -> bool {
        self.rx
            .as_ref()
            .is_some_and(|rx| rx.has_changed().unwrap_or(false))
    }

    /// Resolves at the first signal this handle has not awaited yet.
    pub(super) async fn changed(&mut self) {
        match self.rx.as_mut() {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    // The map's entry is gone (it never is while a handle
                    // lives): never signalled.
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
}

impl Clone for KeySignal {
    /// A handle that has seen what this one has.
    fn clone(&self) -> Self {
        KeySignal {
            rx: self.rx.clone(),
            key: self.key.clone(),
            map: Arc::clone(&self.map),
        }
    }
}

impl Drop for KeySignal {
    fn drop(&mut self) {
        drop(self.rx.take());
        // Under the shard lock, so a concurrent `watch` either sees the entry and
        // subscribes before this check, or inserts a fresh one after the removal.
        self.map
            .remove_if(&self.key, |_, tx| tx.receiver_count() == 0);
    }
}
