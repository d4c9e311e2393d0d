//! What every handle of one simulated server shares: the locks, the instances,
//! the fenced resources, the faults, the outages, the release records and the
//! counters; and `serve`, the one path of every request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::fault::{Message, MessageFault, Op, RequestFault, Rules};
use super::requests::Counters;
use super::resources::Resources;
use crate::backend::{LeaseToken, LockKind, MemoryBackend, Signals};
use crate::error::{Error, Result};
use crate::key::LockKey;

/// How long the server remembers a release, for a repeated release of the same
/// lease to report it (as the Redis scripts' release records do).
const RECORD_TTL: Duration = Duration::from_secs(11);

/// One instance's end of the server: its identity, its message channel (the
/// registry its lockers wait on) and its counters.
#[derive(Debug)]
pub(super) struct Instance {
    pub(super) id: u64,
    pub(super) signals: Signals,
    pub(super) requests: Counters,
}

/// An outage: until when, and whether requests hang (rather than fail) until then.
#[derive(Clone, Copy, Debug)]
pub(super) struct Outage {
    pub(super) until: Instant,
    pub(super) hang: bool,
}

/// What every handle of one server shares.
#[derive(Debug)]
pub(super) struct Shared {
    /// The locks: every instance's backend is a clone of it. Its epochs are
    /// floored by the server's clock: Tokio's, from the server's creation.
    pub(super) memory: MemoryBackend,
    /// The fenced keys' values, fences and write records.
    pub(super) resources: Resources,
    pub(super) rules: Rules,
    pub(super) instances: Mutex<Vec<Weak<Instance>>>,
    pub(super) outage: Mutex<Option<Outage>>,
    /// Released lease tokens, until when their record lives.
    pub(super) records: Mutex<HashMap<LeaseToken, Instant>>,
    pub(super) requests: Counters,
    pub(super) last_instance: AtomicU64,
    /// After a restart, until when nothing is granted (as a Redis restarted
    /// without its data quarantines its grants: `backend/redis/life.rs`).
    pub(super) quarantine: Mutex<Option<Instant>>,
    /// The longest lease TTL asked for, in ms: the quarantine after a restart.
    pub(super) longest_ttl_ms: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            memory: MemoryBackend::with_virtual_clock(),
            resources: Resources::default(),
            rules: Rules::default(),
            instances: Mutex::default(),
            outage: Mutex::default(),
            records: Mutex::default(),
            requests: Counters::default(),
            last_instance: AtomicU64::default(),
            quarantine: Mutex::default(),
            longest_ttl_ms: AtomicU64::default(),
        }
    }
}

impl Shared {
    pub(super) fn instances(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Instance>>> {
        self.instances.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn outage(&self) -> std::sync::MutexGuard<'_, Option<Outage>> {
        self.outage.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn records(&self) -> std::sync::MutexGuard<'_, HashMap<LeaseToken, Instant>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instances still in use.
    pub(super) fn live(&self) -> Vec<Arc<Instance>> {
        self.instances().iter().filter_map(Weak::upgrade).collect()
    }

    /// Serves an `op` request for `key` (an instance has counted it as its own
    /// already): counted, then failed, delayed or applied (`apply`) as the
    /// server's outage and faults say.
    pub(super) async fn serve<T>(
        &self,
        op: Op,
        key: &LockKey,
        apply: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.requests.count(op);
        match self.admit(op, key).await? {
            None => apply.await,
            Some(RequestFault::Fail) => Err(unreachable(op, key, "the request was lost")),
            Some(RequestFault::LoseReply) => {
                let _applied = apply.await;
                Err(unreachable(op, key, "the reply was lost"))
            }
        }
    }

    /// What happens to an `op` request for `key`: an outage makes it fail or wait;
    /// otherwise a fault may strike it.
    async fn admit(&self, op: Op, key: &LockKey) -> Result<Option<RequestFault>> {
        let outage = *self.outage();
        if let Some(Outage { until, hang }) = outage.filter(|o| o.until > Instant::now()) {
            if !hang {
                return Err(unreachable(op, key, "the server is unreachable"));
            }
            tokio::time::sleep_until(until).await;
        }
        Ok(self.rules.request(op, key))
    }

    /// A lease of `ttl` is asked for: a restart holds grants that long.
    pub(super) fn note_lease(&self, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.longest_ttl_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long grants still wait after a restart (`None`: they do not).
    pub(super) fn held(&self) -> Option<Duration> {
        let until = *self.quarantine.lock().unwrap_or_else(|e| e.into_inner());
        until
            .and_then(|until| until.checked_duration_since(Instant::now()))
            .filter(|wait| !wait.is_zero())
    }

    /// Remembers the release of `token`.
    pub(super) fn record_release(&self, token: LeaseToken) {
        let now = Instant::now();
        let mut records = self.records();
        records.retain(|_, until| *until > now);
        records.insert(token, now + RECORD_TTL);
    }

    /// Whether a release of `token` is remembered.
    pub(super) fn was_released(&self, token: LeaseToken) -> bool {
        self.records()
            .get(&token)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Delivers a wake-up of the `kind` lock of `key` to every instance. An
    /// instance that waits for it may have it dropped or delayed by a fault; one
    /// that does not only sees its wake-up generation move.
    pub(super) fn wake(&self, kind: LockKind, key: &LockKey) {
        for instance in self.live() {
            let fault = if instance.signals.is_watched(kind, key.as_bytes()) {
                self.rules.message(Message::Wakeup, key)
            } else {
                None
            };
            deliver(fault, &instance, key, move |i, k| {
                i.signals.wake(kind, k.as_bytes());
            });
        }
    }

    /// Tells every instance that the leader record of `key` changed, as the
    /// record scripts' message does on Redis (to every instance: a message to an
    /// instance that does not observe the key is ignored there).
    pub(super) fn leader_changed(&self, key: &LockKey) {
        for instance in self.live() {
            instance.signals.leader_changed(key.as_bytes());
        }
    }

    /// Delivers a revocation of `key`'s mutex lease to the instance `id` (the
    /// holder's), unless a fault drops or delays it.
    pub(super) fn revoke(&self, id: u64, key: &LockKey) {
        if let Some(instance) = self.live().into_iter().find(|i| i.id == id) {
            let fault = self.rules.message(Message::Revocation, key);
            deliver(fault, &instance, key, |i, k| {
                i.signals.revoke(k.as_bytes());
            });
        }
    }
}

/// Delivers a message to `instance` now, later or never, as `fault` says.
fn deliver(
    fault: Option<MessageFault>,
    instance: &Arc<Instance>,
    key: &LockKey,
    send: impl FnOnce(&Instance, &LockKey) + Send + 'static,
) {
    match fault {
        None => send(instance, key),
        Some(MessageFault::Drop) => {}
        Some(MessageFault::Delay(by)) => {
            let (instance, key) = (Arc::downgrade(instance), key.clone());
            crate::runtime::spawn(async move {
                tokio::time::sleep(by).await;
                if let Some(instance) = instance.upgrade() {
                    send(&instance, &key);
                }
            });
        }
    }
}

/// The error of a request that got no answer.
fn unreachable(op: Op, key: &LockKey, what: &'static str) -> Error {
    Error::backend(
        key,
        op.phase(),
        std::io::Error::new(std::io::ErrorKind::ConnectionReset, what),
    )
}
