//! The calls behind `RwLock::read` and `RwLock::write`, and the acquire loop.

use std::sync::Arc;
use std::time::Duration;

use share::Arrive;
use tracing::Instrument;

use super::{
    Entry, LocalLock, ReadGuard, RwLeading, RwLocks, WriteGuard, admit, share, unsupported,
};
use crate::backend::WhenBusy;
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::acquire::{Ask, Call, acquire};
use crate::lease::{Lease, LeaseKind};

impl RwLocks {
    /// [`RwLock::read_with_options`](crate::rwlock::RwLock::read_with_options).
    pub(crate) async fn read_within(
        self: &Arc<Self>,
        key: LockKey,
        wait: Duration,
    ) -> Result<ReadGuard> {
        key.validate()?;
        let call = Call::new(wait, self.engine.config.lease_ttl, WhenBusy::Queue);
        let span = tracing::debug_span!("lockflight.read", key = %key);
        let guard = self.read_inner(key.clone(), call).instrument(span).await?;
        guard.ok_or_else(|| Error::backend(&key, Phase::Acquiring, "busy reply to a waiting read"))
    }

    /// [`RwLock::try_read`](crate::rwlock::RwLock::try_read).
    pub(crate) async fn try_read(self: &Arc<Self>, key: LockKey) -> Result<Option<ReadGuard>> {
        key.validate()?;
        let call = Call::new(
            self.engine.config.wait_timeout,
            self.engine.config.lease_ttl,
            WhenBusy::Return,
        );
        self.read_inner(key, call).await
    }

    /// [`RwLock::write_with_options`](crate::rwlock::RwLock::write_with_options).
    pub(crate) async fn write_within(
        self: &Arc<Self>,
        key: LockKey,
        wait: Duration,
    ) -> Result<WriteGuard> {
        key.validate()?;
        let call = Call::new(wait, self.engine.config.lease_ttl, WhenBusy::Queue);
        let span = tracing::debug_span!("lockflight.write", key = %key);
        let guard = self.write_inner(key.clone(), call).instrument(span).await?;
        guard.ok_or_else(|| Error::backend(&key, Phase::Acquiring, "busy reply to a waiting write"))
    }

    /// [`RwLock::try_write`](crate::rwlock::RwLock::try_write).
    pub(crate) async fn try_write(self: &Arc<Self>, key: LockKey) -> Result<Option<WriteGuard>> {
        key.validate()?;
        let call = Call::new(
            self.engine.config.wait_timeout,
            self.engine.config.lease_ttl,
            WhenBusy::Return,
        );
        self.write_inner(key, call).await
    }

    pub(super) async fn read_inner(
        self: &Arc<Self>,
        key: LockKey,
        call: Call,
    ) -> Result<Option<ReadGuard>> {
        let locks = self;
        if locks.engine.backend.rw().is_none() {
            return Err(unsupported(&key));
        }
        let entry = Entry::enter(locks, &key);
        let local_lock = if call.mode == WhenBusy::Queue {
            tokio::time::timeout_at(call.deadline, Arc::clone(&entry.rw.local_lock).read_owned())
                .await
                .map_err(|_| call.timed_out(&locks.engine, &key, Phase::WaitingLocally))?
        } else {
            match Arc::clone(&entry.rw.local_lock).try_read_owned() {
                Ok(local_lock) => local_lock,
                Err(_) => return Ok(None),
            }
        };
        let mut waited_for_acquire = false;
        loop {
            let rw = Arc::clone(&entry.rw);
            let notified = rw.changed.notified();
            let arrive = entry
                .rw
                .share()
                .arrive(|lease| admit(lease, waited_for_acquire));
            waited_for_acquire = matches!(arrive, Arrive::WaitAcquire);
            match arrive {
                Arrive::Join(lease) => {
                    crate::lease::histograms::wait(crate::lease::LeaseKind::Read, call.start);
                    return Ok(Some(ReadGuard {
                        lease,
                        entry: Some(entry),
                        local_lock: Some(local_lock),
                        granted_at: crate::lease::histograms::Since::now(),
                    }));
                }
                Arrive::Leader => break,
                Arrive::WaitDrain if call.mode == WhenBusy::Return => return Ok(None),
                Arrive::WaitAcquire | Arrive::WaitDrain => {
                    locks.engine.stats.local_wait();
                    tokio::time::timeout_at(call.deadline, notified)
                        .await
                        .map_err(|_| call.timed_out(&locks.engine, &key, Phase::WaitingLocally))?;
                }
            }
        }
        let leading = RwLeading::new(self, LeaseKind::Read, entry, LocalLock::Read(local_lock));
        let Some((entry, local_lock, lease)) = self.acquire(leading, call).await? else {
            return Ok(None);
        };
        let LocalLock::Read(local_lock) = local_lock else {
            unreachable!("a read leader holds the local read lock")
        };
        entry.rw.share().acquired(Arc::clone(&lease));
        entry.rw.changed.notify_waiters();
        Ok(Some(ReadGuard {
            lease,
            entry: Some(entry),
            local_lock: Some(local_lock),
            granted_at: crate::lease::histograms::Since::now(),
        }))
    }

    pub(super) async fn write_inner(
        self: &Arc<Self>,
        key: LockKey,
        call: Call,
    ) -> Result<Option<WriteGuard>> {
        let locks = self;
        if locks.engine.backend.rw().is_none() {
            return Err(unsupported(&key));
        }
        let entry = Entry::enter(locks, &key);
        let local_lock = if call.mode == WhenBusy::Queue {
            tokio::time::timeout_at(
                call.deadline,
                Arc::clone(&entry.rw.local_lock).write_owned(),
            )
            .await
            .map_err(|_| call.timed_out(&locks.engine, &key, Phase::WaitingLocally))?
        } else {
            match Arc::clone(&entry.rw.local_lock).try_write_owned() {
                Ok(local_lock) => local_lock,
                Err(_) => return Ok(None),
            }
        };
        let leading = RwLeading::new(self, LeaseKind::Write, entry, LocalLock::Write(local_lock));
        let Some((entry, local_lock, lease)) = self.acquire(leading, call).await? else {
            return Ok(None);
        };
        let LocalLock::Write(local_lock) = local_lock else {
            unreachable!("a writer holds the local write lock")
        };
        Ok(Some(WriteGuard {
            lease,
            job: Some((entry, local_lock)),
            granted_at: crate::lease::histograms::Since::now(),
        }))
    }

    /// Acquires `leading`'s lease at the backend ([`acquire`]), waiting unless
    /// `call.mode` is [`WhenBusy::Return`]. On success the lease is being renewed, and the
    /// entry and local lock `leading` kept are the caller's.
    pub(super) async fn acquire(
        self: &Arc<Self>,
        mut leading: RwLeading,
        call: Call,
    ) -> Result<Option<(Entry, LocalLock, Arc<Lease>)>> {
        let key = leading.entry().key.clone();
        let rw = self.engine.backend.rw().ok_or_else(|| unsupported(&key))?;
        let (kind, ttl) = (leading.kind, call.ttl);
        let ask = Ask {
            key: &key,
            kind,
            token: leading.token,
            call,
            one_at_a_time: false,
        };
        let key = &key;
        let granted = acquire(
            &self.engine,
            ask,
            &mut leading,
            |token, mode, _| async move {
                if kind == LeaseKind::Read {
                    rw.acquire_read(key, token, ttl, mode).await
                } else {
                    rw.acquire_write(key, token, ttl, mode).await
                }
            },
        )
        .await?;
        let Some(granted) = granted else {
            return Ok(None);
        };
        crate::lease::histograms::wait(kind, call.start);
        let (entry, local_lock) = leading.armed.take_local().expect("held until granted");
        Ok(Some((entry, local_lock, granted.lease)))
    }
}
