//! The calls behind `RwLock::read` and `RwLock::write`, and the acquire loop.

use std::sync::Arc;
use std::time::Duration;

use share::Arrive;
use tokio::time::Instant;
use tracing::Instrument;

use super::{
    Call, Entry, Gate, Kind, Leading, ReadGuard, RwLocks, WriteGuard, acquire_call, admit, share,
    unsupported,
};
use crate::backend::{Acquire, LockKind};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::lease::acquire::{Failure, Pacer, grant};

impl RwLocks {
    /// [`RwLock::read_with_options`](crate::rwlock::RwLock::read_with_options).
    pub(crate) async fn read_within(
        self: &Arc<Self>,
        key: LockKey,
        wait: Duration,
    ) -> Result<ReadGuard> {
        key.validate()?;
        let call = Call::new(wait, true);
        let span = tracing::debug_span!("lockflight.read", key = %key);
        let guard = self.read_inner(key.clone(), call).instrument(span).await?;
        guard.ok_or_else(|| Error::backend(&key, Phase::Acquiring, "busy reply to a waiting read"))
    }

    /// [`RwLock::try_read`](crate::rwlock::RwLock::try_read).
    pub(crate) async fn try_read(self: &Arc<Self>, key: LockKey) -> Result<Option<ReadGuard>> {
        key.validate()?;
        let call = Call::new(self.config.wait_timeout, false);
        self.read_inner(key, call).await
    }

    /// [`RwLock::write_with_options`](crate::rwlock::RwLock::write_with_options).
    pub(crate) async fn write_within(
        self: &Arc<Self>,
        key: LockKey,
        wait: Duration,
    ) -> Result<WriteGuard> {
        key.validate()?;
        let call = Call::new(wait, true);
        let span = tracing::debug_span!("lockflight.write", key = %key);
        let guard = self.write_inner(key.clone(), call).instrument(span).await?;
        guard.ok_or_else(|| Error::backend(&key, Phase::Acquiring, "busy reply to a waiting write"))
    }

    /// [`RwLock::try_write`](crate::rwlock::RwLock::try_write).
    pub(crate) async fn try_write(self: &Arc<Self>, key: LockKey) -> Result<Option<WriteGuard>> {
        key.validate()?;
        let call = Call::new(self.config.wait_timeout, false);
        self.write_inner(key, call).await
    }

    pub(super) async fn read_inner(
        self: &Arc<Self>,
        key: LockKey,
        call: Call,
    ) -> Result<Option<ReadGuard>> {
        let locks = self;
        if locks.backend.rw().is_none() {
            return Err(unsupported(&key));
        }
        let entry = Entry::enter(locks, &key);
        let gate = if call.wait {
            tokio::time::timeout_at(call.deadline, Arc::clone(&entry.rw.gate).read_owned())
                .await
                .map_err(|_| call.timed_out(locks, &key, Phase::WaitingLocally))?
        } else {
            match Arc::clone(&entry.rw.gate).try_read_owned() {
                Ok(gate) => gate,
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
                    crate::lease::histograms::wait(
                        crate::lease::LeaseKind::Read,
                        call.start.elapsed(),
                    );
                    return Ok(Some(ReadGuard {
                        lease,
                        entry: Some(entry),
                        gate: Some(gate),
                        granted_at: Instant::now(),
                    }));
                }
                Arrive::Leader => break,
                Arrive::WaitDrain if !call.wait => return Ok(None),
                Arrive::WaitAcquire | Arrive::WaitDrain => {
                    locks.stats.local_wait();
                    tokio::time::timeout_at(call.deadline, notified)
                        .await
                        .map_err(|_| call.timed_out(locks, &key, Phase::WaitingLocally))?;
                }
            }
        }
        let leading = Leading {
            entry: Some(entry),
            gate: Some(Gate::Read(gate)),
            kind: Kind::Read,
            token: self.backend.new_token(),
            armed: false,
        };
        let Some((mut leading, lease)) = self.acquire(leading, call).await? else {
            return Ok(None);
        };
        let entry = leading.entry.take().expect("set");
        let Some(Gate::Read(gate)) = leading.gate.take() else {
            unreachable!("a read leader holds the read gate")
        };
        entry.rw.share().acquired(Arc::clone(&lease));
        entry.rw.changed.notify_waiters();
        Ok(Some(ReadGuard {
            lease,
            entry: Some(entry),
            gate: Some(gate),
            granted_at: Instant::now(),
        }))
    }

    pub(super) async fn write_inner(
        self: &Arc<Self>,
        key: LockKey,
        call: Call,
    ) -> Result<Option<WriteGuard>> {
        let locks = self;
        if locks.backend.rw().is_none() {
            return Err(unsupported(&key));
        }
        let entry = Entry::enter(locks, &key);
        let gate = if call.wait {
            tokio::time::timeout_at(call.deadline, Arc::clone(&entry.rw.gate).write_owned())
                .await
                .map_err(|_| call.timed_out(locks, &key, Phase::WaitingLocally))?
        } else {
            match Arc::clone(&entry.rw.gate).try_write_owned() {
                Ok(gate) => gate,
                Err(_) => return Ok(None),
            }
        };
        let leading = Leading {
            entry: Some(entry),
            gate: Some(Gate::Write(gate)),
            kind: Kind::Write,
            token: self.backend.new_token(),
            armed: false,
        };
        let Some((mut leading, lease)) = self.acquire(leading, call).await? else {
            return Ok(None);
        };
        let entry = leading.entry.take().expect("set");
        let Some(Gate::Write(gate)) = leading.gate.take() else {
            unreachable!("a writer holds the write gate")
        };
        Ok(Some(WriteGuard {
            lease,
            job: Some((entry, gate)),
            granted_at: Instant::now(),
        }))
    }

    /// Acquires `leading`'s lease at the backend, waiting (by wake-up, with the
    /// backend's retry time as a fallback) unless `call.wait` is false. On success
    /// the lease is being renewed, and `leading` is disarmed but still owns the
    /// entry and gate for the caller to take.
    pub(super) async fn acquire(
        self: &Arc<Self>,
        mut leading: Leading,
        call: Call,
    ) -> Result<Option<(Leading, Arc<Lease>)>> {
        let locks = self;
        let key = leading.entry.as_ref().expect("set").key.clone();
        let rw = locks.backend.rw().ok_or_else(|| unsupported(&key))?;
        let ttl = locks.config.lease_ttl;
        let token = leading.token;
        let mut pacer = Pacer::new(locks.backend.wakeups(), LockKind::ReadWrite, &key, false);
        loop {
            let sent_at = pacer.sending();
            leading.armed = true;
            locks.stats.acquire_attempt();
            let reply = tokio::time::timeout_at(
                call.deadline,
                acquire_call(rw, leading.kind, &key, token, ttl, call.wait),
            )
            .await
            .map_err(|_| call.timed_out(locks, &key, Phase::Acquiring))?;
            match reply {
                Ok(Acquire::Acquired { epoch, waiting, .. }) => {
                    if leading.kind == Kind::Write && epoch == 0 && locks.backend.fencing() {
                        return Err(Error::backend(
                            &key,
                            Phase::Acquiring,
                            "the backend granted the write lock without a fencing epoch",
                        ));
                    }
                    let granted = grant(
                        &locks.renewals,
                        &locks.stats,
                        &key,
                        leading.kind.lease_kind(),
                        token,
                        epoch,
                        ttl,
                        sent_at,
                        waiting,
                    );
                    let Some(lease) = granted else {
                        // Not held: ask again with the same token, which re-arms it.
                        if Instant::now() >= call.deadline {
                            return Err(call.timed_out(locks, &key, Phase::Acquiring));
                        }
                        continue;
                    };
                    crate::lease::histograms::wait(lease.kind, call.start.elapsed());
                    leading.armed = false;
                    return Ok(Some((leading, lease)));
                }
                Ok(Acquire::Busy { retry_in }) => {
                    // A busy read registered nothing but the wake-up; a busy write
                    // may have registered the token as a waiting writer (kept armed).
                    if !call.wait {
                        leading.armed = false;
                        return Ok(None);
                    }
                    if leading.kind == Kind::Read {
                        leading.armed = false;
                    }
                    if !pacer.watch() {
                        continue;
                    }
                    tokio::select! {
                        _ = pacer.woken_or(Instant::now() + retry_in) => {}
                        _ = tokio::time::sleep_until(call.deadline) => {
                            return Err(call.timed_out(locks, &key, Phase::Acquiring));
                        }
                    }
                }
                Err(e) => match Failure::of(&e) {
                    // A single attempt reports too few nodes answering at once.
                    Failure::Retry if call.wait || !Failure::unavailable(&e) => {
                        tracing::debug!(%key, error = %e, "read-write acquire failed; retrying");
                        let pause = pacer.backoff();
                        if Instant::now() + pause >= call.deadline {
                            return Err(e);
                        }
                        tokio::time::sleep(pause).await;
                    }
                    failure => {
                        // A refusal keeps the token armed for the cleanup; a definite
                        // answer wrote nothing (the scripts read before they write).
                        leading.armed = failure.may_have_written();
                        return Err(e);
                    }
                },
            }
        }
    }
}
