//! Wake-ups over a quorum: each key's wake node, and the task that forwards its
//! wake-ups to this backend's watchers (see the module docs' "Wake-ups").

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Inner;
use crate::backend::{LockBackend, LockKind, Signals, Wakeup};
use crate::key::LockKey;
/// Per key this instance waits for: the task forwarding its wake node's wake-ups.
pub(super) type Forwarders = DashMap<LockKey, Arc<Forwarder>>;

impl Inner {
    /// The node whose queue orders the waiting instances of `key` and whose
    /// release wakes the next one: chosen by the key's hash, so every instance
    /// agrees.
    pub(super) fn wake_node(&self, key: &LockKey) -> usize {
        (crate::key::key_hash(key.as_bytes()) % self.nodes.len() as u64) as usize
    }

    /// Starts forwarding the wake-ups of `key` from its wake node unless that is
    /// already under way. `before` are the nodes' wake-up generations read before
    /// the acquire was sent: if the wake node's moved, it may have woken us before
    /// we watched it, and that counts as a wake-up.
    pub(super) fn watch_nodes(&self, key: &LockKey, before: &[u64]) {
        if let Some(f) = self.forwarders.get(key)
            && !f.stop.is_cancelled()
        {
            return;
        }
        let forwarder = Arc::new(Forwarder {
            woken: AtomicU64::new(0),
            stop: self.stop.child_token(),
        });
        let w = self.wake_node(key);
        let registry = self.nodes[w].backend.signals();
        let watches: Vec<Wakeup> = vec![registry.watch(LockKind::Mutex, key)];
        let mut count = 0;
        if registry.generation(LockKind::Mutex, key.as_bytes()) != before[w] {
            count = forwarder.mark(0);
        }
        if let Some(old) = self.forwarders.insert(key.clone(), Arc::clone(&forwarder)) {
            old.stop.cancel();
        }
        if count >= WAKE_THRESHOLD {
            forwarder.woken.store(0, Ordering::Release);
            self.signals.wake(LockKind::Mutex, key.as_bytes());
        }
        crate::runtime::spawn(forward(
            key.clone(),
            forwarder,
            watches,
            WAKE_THRESHOLD,
            self.signals.clone(),
            Arc::clone(&self.forwarders),
        ));
    }

    /// Stops counting the wake-ups of `key` (acquired, or no longer wanted).
    pub(super) fn unwatch_nodes(&self, key: &LockKey) {
        if let Some((_, f)) = self.forwarders.remove(key) {
            f.stop.cancel();
        }
    }
}

/// The wake-up count of one waited-for key.
pub(super) struct Forwarder {
    /// Bit i: watched node i has woken this instance since its last attempt.
    pub(super) woken: AtomicU64,
    stop: CancellationToken,
}

impl Forwarder {
    /// Marks node `i` as having woken us; returns how many nodes have.
    fn mark(&self, i: usize) -> usize {
        let bit = 1u64 << i;
        ((self.woken.fetch_or(bit, Ordering::AcqRel) | bit).count_ones()) as usize
    }
}

/// Wake-ups of the wake node that wake this backend's watchers.
const WAKE_THRESHOLD: usize = 1;

/// How often a forwarder checks whether anyone still waits for its key.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Counts the watched nodes' wake-ups of `key` (today: the key's wake node only);
/// wakes this backend's watchers of `key` when `threshold` nodes have woken it
/// since the last attempt. Ends when stopped, or when nobody here watches the key
/// any more.
async fn forward(
    key: LockKey,
    forwarder: Arc<Forwarder>,
    mut watches: Vec<Wakeup>,
    threshold: usize,
    registry: Signals,
    forwarders: Arc<Forwarders>,
) {
    let mut idle = tokio::time::interval_at(Instant::now() + IDLE_CHECK, IDLE_CHECK);
    loop {
        let any = futures::future::select_all(watches.iter_mut().map(|w| Box::pin(w.woken())));
        tokio::select! {
            _ = forwarder.stop.cancelled() => break,
            (_, i, _) = any => {
                if forwarder.mark(i) >= threshold {
                    forwarder.woken.store(0, Ordering::Release);
                    registry.wake(LockKind::Mutex, key.as_bytes());
                }
            }
            _ = idle.tick() => {
                if !registry.is_watched(LockKind::Mutex, key.as_bytes()) {
                    break;
                }
            }
        }
    }
    forwarder.stop.cancel();
    forwarders.remove_if(&key, |_, f| Arc::ptr_eq(f, &forwarder));
}
