//! One instance of a simulated server: the backend a `Locker` is built on. Every
//! request is counted, passes the server's outage and faults, then goes to the
//! shared in-process locks; replies carry what Redis would say about the other
//! instances, and releases and queued acquires send the server's messages.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::fault::Op;
use super::requests::Requests;
use super::shared::{Instance, Shared};
use crate::backend::rw::RwBackend;
use crate::backend::semaphore::{Permits, SemaphoreBackend};
use crate::backend::{
    Acquire, LeaseToken, LockBackend, LockKind, MemoryBackend, RecordFence, RecordState, Released,
    Renewal, Signals, WhenBusy,
};
use crate::error::Result;
use crate::key::LockKey;

/// One instance of a [`SimServer`](super::SimServer), from
/// [`SimServer::backend`](super::SimServer::backend): pass it to
/// [`Locker::builder`](crate::Locker::builder).
///
/// It has every lock kind, fair mode and fencing, as
/// [`RedisBackend`](crate::RedisBackend) has. Its lease tokens carry its instance
/// id, so the server can address a revocation to the holder's instance.
pub struct SimBackend {
    /// The shared locks, as this instance's clone (its own place in fair queues).
    memory: MemoryBackend,
    shared: Arc<Shared>,
    me: Arc<Instance>,
}

impl fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimBackend")
            .field("instance", &self.me.id)
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}

impl SimBackend {
    pub(super) fn new(shared: Arc<Shared>, me: Arc<Instance>) -> Self {
        SimBackend {
            memory: shared.memory.clone(),
            shared,
            me,
        }
    }

    /// The requests this instance has sent so far (the server's
    /// [`requests`](super::SimServer::requests) adds up every instance's).
    pub fn requests(&self) -> Requests {
        self.me.requests.snapshot()
    }

    /// Sends an `op` request for `key`: counted, then failed, delayed or applied
    /// (`apply`) as the server's outage and faults say.
    async fn request<T>(
        &self,
        op: Op,
        key: &LockKey,
        apply: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        self.me.requests.count(op);
        self.shared.serve(op, key, apply).await
    }

    /// How many other instances wait for the mutex of `key` (Redis counts its queue).
    fn others_waiting(&self, key: &LockKey) -> u32 {
        let n = self
            .shared
            .live()
            .iter()
            .filter(|i| i.id != self.me.id && i.signals.is_watched(LockKind::Mutex, key.as_bytes()))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// A mutex acquire's answer as Redis gives it: the other waiting instances
    /// counted, and the holder told when this instance queued behind it.
    fn answer(&self, key: &LockKey, when_busy: WhenBusy, reply: Acquire) -> Acquire {
        match reply {
            Acquire::Acquired {
                epoch,
                earliest_other,
                ..
            } => Acquire::Acquired {
                epoch,
                waiting: self.others_waiting(key),
                earliest_other,
            },
            busy @ Acquire::Busy { .. } => {
                if when_busy == WhenBusy::Queue
                    && let Some(holder) = self.memory.holder(key)
                    && holder.instance() != self.me.id
                {
                    self.shared.revoke(holder.instance(), key);
                }
                busy
            }
        }
    }

    /// A release's answer as Redis gives it: a repeated release of a lease this
    /// server released reports the release; a release wakes the waiters.
    fn released(&self, kind: LockKind, key: &LockKey, token: LeaseToken, released: bool) -> bool {
        if released {
            self.shared.record_release(token);
            self.shared.wake(kind, key);
            true
        } else {
            self.shared.was_released(token)
        }
    }
}

#[async_trait]
impl LockBackend for SimBackend {
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        self.shared.note_lease(ttl);
        self.request(Op::Acquire, key, async {
            if let Some(retry_in) = self.shared.held() {
                return Ok(Acquire::Busy { retry_in });
            }
            let reply = self.memory.acquire(key, token, ttl, when_busy).await?;
            Ok(self.answer(key, when_busy, reply))
        })
        .await
    }

    async fn acquire_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
        age: Duration,
    ) -> Result<Acquire> {
        self.shared.note_lease(ttl);
        self.request(Op::Acquire, key, async {
            if let Some(retry_in) = self.shared.held() {
                return Ok(Acquire::Busy { retry_in });
            }
            let reply = self
                .memory
                .acquire_fair(key, token, ttl, when_busy, age)
                .await?;
            Ok(self.answer(key, when_busy, reply))
        })
        .await
    }

    fn supports_fair(&self) -> bool {
        self.memory.supports_fair()
    }

    fn new_token(&self) -> LeaseToken {
        LeaseToken::for_instance(self.me.id)
    }

    async fn release(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        self.request(Op::Release, key, async {
            let reply = self.memory.release(key, token).await?;
            Ok(Released {
                released: self.released(LockKind::Mutex, key, token, reply.released),
                waiting: self.others_waiting(key),
            })
        })
        .await
    }

    async fn release_fair(
        &self,
        key: &LockKey,
        token: LeaseToken,
        next_waiter_age: Duration,
    ) -> Result<Released> {
        self.request(Op::Release, key, async {
            let reply = self
                .memory
                .release_fair(key, token, next_waiter_age)
                .await?;
            Ok(Released {
                released: self.released(LockKind::Mutex, key, token, reply.released),
                waiting: self.others_waiting(key),
            })
        })
        .await
    }

    async fn renew(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal> {
        self.request(Op::Renew, key, async {
            Ok(match self.memory.renew(key, token, ttl).await? {
                Renewal::Renewed { .. } => Renewal::Renewed {
                    waiting: self.others_waiting(key),
                },
                Renewal::NotOwner => Renewal::NotOwner,
            })
        })
        .await
    }

    async fn leave(&self, key: &LockKey) -> Result<()> {
        self.request(Op::Leave, key, self.memory.leave(key)).await
    }

    async fn write_leader(&self, key: &LockKey, record: &[u8], ttl: Duration) -> Result<bool> {
        self.request(Op::Leader, key, async {
            let before = self.memory.read_leader(key).await?;
            let written = self.memory.write_leader(key, record, ttl).await?;
            if written && before.as_deref() != Some(record) {
                self.shared.leader_changed(key);
            }
            Ok(written)
        })
        .await
    }

    async fn read_leader(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        self.request(Op::Leader, key, self.memory.read_leader(key))
            .await
    }

    async fn clear_leader(&self, key: &LockKey, record: &[u8]) -> Result<bool> {
        self.request(Op::Leader, key, async {
            let cleared = self.memory.clear_leader(key, record).await?;
            if cleared {
                self.shared.leader_changed(key);
            }
            Ok(cleared)
        })
        .await
    }

    async fn fence_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        retention: Duration,
    ) -> Result<RecordState> {
        self.request(
            Op::Record,
            key,
            self.memory.fence_record(key, fence, retention),
        )
        .await
    }

    async fn store_record(
        &self,
        key: &LockKey,
        fence: RecordFence,
        response: &[u8],
        retention: Duration,
    ) -> Result<bool> {
        self.request(
            Op::Record,
            key,
            self.memory.store_record(key, fence, response, retention),
        )
        .await
    }

    async fn read_record(&self, key: &LockKey) -> Result<Option<Vec<u8>>> {
        self.request(Op::Record, key, self.memory.read_record(key))
            .await
    }

    fn signals(&self) -> &Signals {
        &self.me.signals
    }

    fn fencing(&self) -> bool {
        self.memory.fencing()
    }

    fn rw(&self) -> Option<&dyn RwBackend> {
        Some(self)
    }

    fn semaphore(&self) -> Option<&dyn SemaphoreBackend> {
        Some(self)
    }
}

#[async_trait]
impl RwBackend for SimBackend {
    async fn acquire_read(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        self.shared.note_lease(ttl);
        let apply = async {
            match self.shared.held() {
                Some(retry_in) => Ok(Acquire::Busy { retry_in }),
                None => self.memory.acquire_read(key, token, ttl, when_busy).await,
            }
        };
        self.request(Op::Acquire, key, apply).await
    }

    async fn acquire_write(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        self.shared.note_lease(ttl);
        let apply = async {
            match self.shared.held() {
                Some(retry_in) => Ok(Acquire::Busy { retry_in }),
                None => self.memory.acquire_write(key, token, ttl, when_busy).await,
            }
        };
        self.request(Op::Acquire, key, apply).await
    }

    async fn release_read(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        self.request(Op::Release, key, async {
            let reply = self.memory.release_read(key, token).await?;
            Ok(Released {
                released: self.released(LockKind::ReadWrite, key, token, reply.released),
                ..reply
            })
        })
        .await
    }

    async fn release_write(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        self.request(Op::Release, key, async {
            let reply = self.memory.release_write(key, token).await?;
            Ok(Released {
                released: self.released(LockKind::ReadWrite, key, token, reply.released),
                ..reply
            })
        })
        .await
    }

    async fn renew_read(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal> {
        let apply = self.memory.renew_read(key, token, ttl);
        self.request(Op::Renew, key, apply).await
    }

    async fn renew_write(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Renewal> {
        let apply = self.memory.renew_write(key, token, ttl);
        self.request(Op::Renew, key, apply).await
    }
}

#[async_trait]
impl SemaphoreBackend for SimBackend {
    async fn acquire_permits(
        &self,
        key: &LockKey,
        permits: u32,
        tokens: &[LeaseToken],
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Permits> {
        self.shared.note_lease(ttl);
        let apply = async {
            match self.shared.held() {
                Some(retry_in) => Ok(Permits {
                    granted: 0,
                    retry_in,
                    waiting: 0,
                }),
                None => {
                    self.memory
                        .acquire_permits(key, permits, tokens, ttl, when_busy)
                        .await
                }
            }
        };
        self.request(Op::Acquire, key, apply).await
    }

    async fn release_permit(&self, key: &LockKey, token: LeaseToken) -> Result<bool> {
        self.request(Op::Release, key, async {
            let released = self.memory.release_permit(key, token).await?;
            Ok(self.released(LockKind::Semaphore, key, token, released))
        })
        .await
    }

    async fn leave_permits(&self, key: &LockKey) -> Result<()> {
        self.request(Op::Leave, key, async {
            self.memory.leave_permits(key).await?;
            self.shared.wake(LockKind::Semaphore, key);
            Ok(())
        })
        .await
    }

    async fn renew_permit(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Renewal> {
        let apply = self.memory.renew_permit(key, token, ttl);
        self.request(Op::Renew, key, apply).await
    }
}
