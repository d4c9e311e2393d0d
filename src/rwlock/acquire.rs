//! The public calls on `Locker` and the acquire loop behind them.

use crate::backend::{Acquire, LeaseToken};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;
use crate::lease::Lease;
use crate::locker::Locker;
use share::Arrive;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::Instrument;

use super::*;

/// Read-write locks.
impl Locker {
    /// Takes a shared read lock of `key`, waiting up to the configured wait timeout.
    ///
    /// Overlapping readers of this process share one read lease (one backend acquire
    /// and one release for all of them, see the [module docs](crate::rwlock)); a
    /// reader that arrives after the shared lease's admission window, or while a
    /// writer waits, waits for the lease to drain and for the writers.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let a = locker.read("catalog").await?;
    /// let b = locker.read("catalog").await?; // shares a's lease
    /// a.release().await?;
    /// b.release().await?; // the last reader releases the lease
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for an empty or oversized key; [`Error::Unsupported`]
    /// at once on a backend without read-write locks (Redlock); [`Error::Timeout`]
    /// when the wait timeout passes; [`Error::ForeignValue`],
    /// [`Error::NoPermission`], [`Error::Refused`] and [`Error::Backend`] from the
    /// backend (transient errors are retried until the deadline).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A dropped waiter leaves nothing behind; a dropped reader that was
    /// acquiring for the others lets the next local reader lead, and releases its
    /// request (which may have landed) in the background.
    pub async fn read(&self, key: impl Into<LockKey>) -> Result<ReadGuard> {
        self.read_within(key, self.shared().config.wait_timeout)
            .await
    }

    /// Like [`read`](Self::read) with an explicit wait timeout (`Duration::MAX`:
    /// as long as it takes).
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn read_within(&self, key: impl Into<LockKey>, wait: Duration) -> Result<ReadGuard> {
        let key = key.into();
        key.validate()?;
        let call = Call::new(wait, true);
        let span = tracing::debug_span!("lockflight.read", key = %key);
        let guard = self.read_inner(key.clone(), call).instrument(span).await?;
        guard.ok_or_else(|| Error::backend(&key, Phase::Acquiring, "busy reply to a waiting read"))
    }

    /// Takes a shared read lock of `key` if that needs no waiting: `None` when a
    /// writer holds the key or waits for it (here or in another instance), or when
    /// this process's shared read lease no longer admits readers. At most one backend
    /// request; it waits only for another local reader's acquire in flight.
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read), except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn try_read(&self, key: impl Into<LockKey>) -> Result<Option<ReadGuard>> {
        let key = key.into();
        key.validate()?;
        let call = Call::new(self.shared().config.wait_timeout, false);
        self.read_inner(key, call).await
    }

    /// Takes the exclusive write lock of `key`, waiting up to the configured wait
    /// timeout.
    ///
    /// While it waits at the backend it is registered as a waiting writer: no new
    /// read lease is granted to any instance, so a stream of readers cannot starve
    /// it (see the [module docs](crate::rwlock) for the bound).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// let first = locker.write("catalog").await?.fencing_token();
    /// let second = locker.write("catalog").await?;
    /// assert!(second.fencing_token() > first);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. A dropped writer leaves the local queue; if it was talking to
    /// the backend, its registration as a waiting writer and any request that may
    /// have landed are released in the background (readers blocked by it are woken).
    pub async fn write(&self, key: impl Into<LockKey>) -> Result<WriteGuard> {
        self.write_within(key, self.shared().config.wait_timeout)
            .await
    }

    /// Like [`write`](Self::write) with an explicit wait timeout.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write).
    ///
    /// # Cancel safety
    ///
    /// As [`write`](Self::write).
    pub async fn write_within(
        &self,
        key: impl Into<LockKey>,
        wait: Duration,
    ) -> Result<WriteGuard> {
        let key = key.into();
        key.validate()?;
        let call = Call::new(wait, true);
        let span = tracing::debug_span!("lockflight.write", key = %key);
        let guard = self.write_inner(key.clone(), call).instrument(span).await?;
        guard.ok_or_else(|| Error::backend(&key, Phase::Acquiring, "busy reply to a waiting write"))
    }

    /// Takes the write lock of `key` if it is free right now: `None` when a local
    /// task holds or waits for the key's gate, or the backend reports readers or a
    /// writer. One backend request at most; it does not register as a waiting writer.
    ///
    /// # Errors
    ///
    /// As [`write`](Self::write), except that a busy lock is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`write`](Self::write).
    pub async fn try_write(&self, key: impl Into<LockKey>) -> Result<Option<WriteGuard>> {
        let key = key.into();
        key.validate()?;
        let call = Call::new(self.shared().config.wait_timeout, false);
        self.write_inner(key, call).await
    }

    /// Number of keys with local read-write activity (a reader, a writer, a waiter
    /// or a release in flight). Zero when every task is done.
    pub fn active_rw_keys(&self) -> usize {
        self.shared().rw.lock().len()
    }

    pub(super) async fn read_inner(&self, key: LockKey, call: Call) -> Result<Option<ReadGuard>> {
        let shared = self.shared();
        if shared.backend.rw().is_none() {
            return Err(unsupported(&key));
        }
        let entry = Entry::enter(shared, &key);
        let gate = if call.wait {
            tokio::time::timeout_at(call.deadline, Arc::clone(&entry.rw.gate).read_owned())
                .await
                .map_err(|_| call.timed_out(shared, &key, Phase::WaitingLocally))?
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
                    crate::stats::histograms::wait(
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
                Arrive::Lead => break,
                Arrive::WaitDrain if !call.wait => return Ok(None),
                Arrive::WaitAcquire | Arrive::WaitDrain => {
                    shared.stats.local_wait();
                    tokio::time::timeout_at(call.deadline, notified)
                        .await
                        .map_err(|_| call.timed_out(shared, &key, Phase::WaitingLocally))?;
                }
            }
        }
        let leading = Leading {
            entry: Some(entry),
            gate: Some(Gate::Read(gate)),
            kind: Kind::Read,
            token: LeaseToken::random(),
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

    pub(super) async fn write_inner(&self, key: LockKey, call: Call) -> Result<Option<WriteGuard>> {
        let shared = self.shared();
        if shared.backend.rw().is_none() {
            return Err(unsupported(&key));
        }
        let entry = Entry::enter(shared, &key);
        let gate = if call.wait {
            tokio::time::timeout_at(call.deadline, Arc::clone(&entry.rw.gate).write_owned())
                .await
                .map_err(|_| call.timed_out(shared, &key, Phase::WaitingLocally))?
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
            token: LeaseToken::random(),
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
        &self,
        mut leading: Leading,
        call: Call,
    ) -> Result<Option<(Leading, Arc<Lease>)>> {
        let shared = self.shared();
        let key = leading.entry.as_ref().expect("set").key.clone();
        let rw = shared.backend.rw().ok_or_else(|| unsupported(&key))?;
        let ttl = shared.config.lease_ttl;
        let token = leading.token;
        let wakeups = shared.backend.wakeups();
        let mut wakeup: Option<crate::backend::Wakeup> = None;
        let mut backoff = Duration::from_millis(10);
        loop {
            let generation = wakeups.generation(key.as_bytes());
            let sent_at = Instant::now();
            leading.armed = true;
            shared.stats.acquire_attempt();
            let reply = tokio::time::timeout_at(
                call.deadline,
                acquire_call(rw, leading.kind, &key, token, ttl, call.wait),
            )
            .await
            .map_err(|_| call.timed_out(shared, &key, Phase::Acquiring))?;
            match reply {
                Ok(Acquire::Acquired { epoch, waiting }) => {
                    if leading.kind == Kind::Write && epoch == 0 && shared.backend.fencing() {
                        return Err(Error::backend(
                            &key,
                            Phase::Acquiring,
                            "the backend granted the write lock without a fencing epoch",
                        ));
                    }
                    let lease = Arc::new(
                        Lease::new(
                            key.clone(),
                            token,
                            epoch,
                            ttl,
                            sent_at,
                            waiting,
                            Arc::clone(&shared.stats),
                        )
                        .with_kind(leading.kind.lease_kind()),
                    );
                    if Instant::now() >= lease.valid_until() {
                        // The reply came after the lease's validity: not held. Ask
                        // again with the same token, which re-arms it.
                        if Instant::now() >= call.deadline {
                            return Err(call.timed_out(shared, &key, Phase::Acquiring));
                        }
                        continue;
                    }
                    shared.stats.acquired();
                    shared.renewals.watch(&lease, sent_at);
                    crate::stats::histograms::wait(lease.kind, call.start.elapsed());
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
                    backoff = Duration::from_millis(10);
                    let wakeup = match &mut wakeup {
                        Some(w) => w,
                        None => {
                            let w = wakeup.insert(wakeups.watch(&key));
                            if wakeups.generation(key.as_bytes()) != generation {
                                continue;
                            }
                            w
                        }
                    };
                    tokio::select! {
                        _ = wakeup.woken() => {}
                        _ = tokio::time::sleep(retry_in) => {}
                        _ = tokio::time::sleep_until(call.deadline) => {
                            return Err(call.timed_out(shared, &key, Phase::Acquiring));
                        }
                    }
                }
                Err(e @ (Error::Backend { .. } | Error::Connect { .. })) => {
                    tracing::debug!(%key, error = %e, "read-write acquire failed; retrying");
                    if Instant::now() + backoff >= call.deadline {
                        return Err(e);
                    }
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
                Err(e @ (Error::Refused { .. } | Error::NoPermission { .. })) => return Err(e),
                Err(e) => {
                    // A definite refusal: the scripts read before they write.
                    leading.armed = false;
                    return Err(e);
                }
            }
        }
    }
}
