//! The shared state's operations: running the scripts, the notifier, and the
//! checks `connect` makes.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use redis::{RedisError, Script, Value};

use super::life::{Gate, Life};
use super::notify::wake_message;
use super::{
    ACQUIRE, CheckFailed, Inner, LEAVE, LeaseScript, Mapping, Names, PROBE_KEY, RELEASE,
    RENEW_LOCK, connect_error, decode_acquire, decode_leave, decode_release, decode_renewal,
    is_auth_failure, map_err, mapping, millis, notify, warn_refused_publish,
};
use crate::backend::signals::send_stamp;
use crate::backend::{Acquire, LeaseToken, LockKind, Released, WhenBusy};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

impl Inner {
    /// Runs `lua/release.lua`, which retires the token (its release record);
    /// `requeue` is the age of this instance's next local waiter in fair mode.
    pub(super) async fn release(
        &self,
        key: &LockKey,
        token: LeaseToken,
        requeue: Option<Duration>,
    ) -> Result<Released> {
        let n = Names::new(&self.prefix, key);
        let token = token.to_hex();
        let record = n.release_record(&token);
        let life = self.life.key_of(self.life.place_of(&[&n.lock]));
        let keys: [&[u8]; 7] = [
            &n.lock,
            &n.queue,
            &n.claim,
            &record,
            &n.queue_expiry,
            &n.fence,
            &life,
        ];
        let (claim_ttl_ms, record_ttl_ms) = (
            self.claim_ttl_ms.to_string(),
            self.release_record_ttl_ms.to_string(),
        );
        let message = wake_message(LockKind::Mutex, key);
        // Whether the release may grant the key to the next instance (see
        // `grants`).
        let grants: &[u8] = if self.grants() { b"1" } else { b"" };
        let args: [&[u8]; 7] = [
            token.as_bytes(),
            self.instance_id.as_bytes(),
            claim_ttl_ms.as_bytes(),
            self.channel_prefix.as_bytes(),
            &message,
            record_ttl_ms.as_bytes(),
            grants,
        ];
        let sent = self.replay_version(&keys);
        let reply = match requeue {
            None => self.invoke(&RELEASE, &keys, &args).await,
            Some(age) => {
                let entry_ttl_ms = self.entry_ttl_ms.to_string();
                self.invoke_fair(&RELEASE, &keys, &args, age, &[entry_ttl_ms.as_bytes()])
                    .await
            }
        }
        .map_err(|e| map_err(key, Phase::Releasing, e))?;
        let (released, refused) = decode_release(key, &reply)?;
        self.log_release(sent, &RELEASE, &keys, &args, &reply);
        if let Some(error) = refused {
            warn_refused_publish(key, "release", &error);
        }
        Ok(released)
    }

    /// Whether a mutex release grants the key to the next waiting instance on the
    /// server (`lua/release.lua`), and a read-write release that frees the lock
    /// its write lease to a waiting writer (`lua/rw_release.lua`): not with `replica_ack`, whose grants are
    /// acknowledged by a `WAIT` after the granting script before anyone uses them,
    /// and a release's grant would be used on its message alone; not on a Redlock
    /// node, where one node's grant is no quorum.
    pub(super) fn grants(&self) -> bool {
        self.grants
    }

    /// Runs `lua/acquire.lua`; `fair` is the caller's age in fair mode.
    pub(super) async fn acquire(
        self: &Arc<Self>,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
        fair: Option<Duration>,
    ) -> Result<Acquire> {
        if when_busy == WhenBusy::Queue {
            // A caller about to wait needs the wake-ups.
            self.ensure_notifier();
        }
        self.note_lease(ttl);
        let n = Names::new(&self.prefix, key);
        let ttl_ms = millis(ttl);
        let fence_ttl_ms = (ttl_ms.saturating_mul(10)).max(60_000);
        let token = token.to_hex();
        let record = n.release_record(&token);
        let keys: [&[u8]; 6] = [
            &n.lock,
            &n.fence,
            &n.queue,
            &n.claim,
            &record,
            &n.queue_expiry,
        ];
        // A waiter with a pace of its own keeps its queue entry between its asks.
        let pace = self
            .paces
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
            .map(|&(pace, _)| pace);
        let (entry_ttl_ms, max_wait) = match pace {
            Some(pace) => (
                self.entry_ttl_ms + 2 * millis(pace),
                pace.max(self.entry_refresh),
            ),
            None => (self.entry_ttl_ms, self.entry_refresh),
        };
        let (ttl_ms, entry_ttl_ms, fence_ttl_ms) = (
            ttl_ms.to_string(),
            entry_ttl_ms.to_string(),
            fence_ttl_ms.to_string(),
        );
        let args: [&[u8]; 6] = [
            token.as_bytes(),
            ttl_ms.as_bytes(),
            self.instance_id.as_bytes(),
            entry_ttl_ms.as_bytes(),
            fence_ttl_ms.as_bytes(),
            if when_busy == WhenBusy::Queue {
                b"1"
            } else {
                b"0"
            },
        ];
        // The channel prefix and the wake-up message: a caller that queues anew
        // sends the holder's instance a revocation built from them.
        let message = wake_message(LockKind::Mutex, key);
        // Last, the send stamp that a grant message echoes: taken before the send,
        // so a grant's validity never counts from after it (see `lua/release.lua`).
        let stamp = send_stamp(tokio::time::Instant::now()).to_string();
        let reply = match fair {
            None => {
                let mut all = Vec::with_capacity(args.len() + 2);
                all.extend_from_slice(&args);
                all.extend([self.channel_prefix.as_bytes(), &message, stamp.as_bytes()]);
                self.invoke_lease(&ACQUIRE, &keys, &all).await
            }
            Some(age) => {
                // The fair arguments: the age (µs), the claim TTL, the channel
                // prefix and the wake-up message (as `invoke_fair` passes them).
                let (age_us, claim_ttl_ms) = (age_micros(age), self.claim_ttl_ms.to_string());
                let mut all = Vec::with_capacity(args.len() + 4);
                all.extend_from_slice(&args);
                all.extend([
                    age_us.as_bytes(),
                    claim_ttl_ms.as_bytes(),
                    self.channel_prefix.as_bytes(),
                    &message,
                    stamp.as_bytes(),
                ]);
                self.invoke_lease(&ACQUIRE, &keys, &all).await
            }
        }
        .map_err(|e| map_err(key, Phase::Acquiring, e))?;
        decode_acquire(key, &reply, max_wait)
    }

    /// Runs `script` in fair mode: `args`, then this instance's `age` (its oldest
    /// local waiter's, in µs), then the fair mode's own `fair_args`.
    async fn invoke_fair(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[&[u8]],
        age: Duration,
        fair_args: &[&[u8]],
    ) -> Result<Value, RedisError> {
        let age_us = u64::try_from(age.as_micros())
            .unwrap_or(u64::MAX)
            .to_string();
        let mut all = Vec::with_capacity(args.len() + 1 + fair_args.len());
        all.extend_from_slice(args);
        all.push(age_us.as_bytes());
        all.extend_from_slice(fair_args);
        self.invoke(script, keys, &all).await
    }

    /// Runs a script that neither grants nor renews a lease, on the shared
    /// connection (never acknowledged).
    pub(super) async fn invoke(
        &self,
        script: &Script,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Value, RedisError> {
        self.conn.invoke(script, false, keys, args).await
    }

    /// Runs a script that grants or renews a lease. With `replica_ack`, a reply
    /// that says it wrote the lease is followed by `WAIT` on a connection of its
    /// own (see `acked`), and fewer acknowledgements than required make it a
    /// `NOREPLICAS` refusal (`Error::Refused` once mapped): an acquire fails (its
    /// caller releases the token), a renewal is retried until the lease's validity
    /// ends.
    pub(super) async fn invoke_lease(
        &self,
        lease: &LeaseScript,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<Value, RedisError> {
        match self.invoke_lease_acked(lease, keys, args).await? {
            (_, Some(too_few)) => Err(too_few),
            (reply, None) => Ok(reply),
        }
    }

    /// [`invoke_lease`](Self::invoke_lease), but a write acknowledged by too few
    /// replicas comes back as the reply *and* that `NOREPLICAS` error: a batch
    /// renewal needs the reply to tell the leases it re-armed (refused for want of
    /// acknowledgements) from the ones it did not (answered as they are).
    pub(super) async fn invoke_lease_acked(
        &self,
        lease: &LeaseScript,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<(Value, Option<RedisError>), RedisError> {
        if lease.renewal {
            return self.invoke_lease_once(lease, keys, args).await;
        }
        // A grant passes the gate first (`life`). An answer that names a life
        // this instance had not seen ends every lease here; one that says the
        // request came too late (by the server's clock, which the instance had
        // misjudged) brings a new reading of it. Either is asked again at once
        // when nothing holds grants back, so the caller sees the script's own
        // answer.
        let place = self.life.place_of(keys);
        for _ in 0..3 {
            let gate_args = self.life.gate_args(place);
            let (k, a) = Life::gate(&gate_args, keys, args);
            let (reply, acks) = self.invoke_lease_once(lease, &k, &a).await?;
            match self
                .life
                .gate_reply(place, &reply, std::time::Instant::now())
            {
                Gate::Ran => return Ok((reply, acks)),
                Gate::TooLate => continue,
                Gate::Life(started, wait_ms) => {
                    self.saw_life(place, &started);
                    if wait_ms > 0 {
                        return Ok((Life::busy(Duration::from_millis(wait_ms)), None));
                    }
                }
            }
        }
        Ok((Life::busy(Duration::from_millis(10)), None))
    }

    /// Reads the server's life (`life`), and ends every lease here if it is not
    /// the one this instance saw last. Nothing to do on a cluster, whose slots'
    /// lives the gate and the renewals read ([`check_life_at`](Self::check_life_at)).
    pub(super) async fn check_life(&self) -> Result<(), RedisError> {
        if self.life.is_per_slot() {
            return Ok(());
        }
        self.check_life_at(0).await
    }

    /// [`check_life`](Self::check_life) for the life of one place: the server,
    /// or on a Cluster the slot `slot`.
    pub(super) async fn check_life_at(&self, slot: u16) -> Result<(), RedisError> {
        let (script, gate_args) = self.life.check(slot);
        let (keys, args) = gate_args.check_args();
        let reply = self.conn.invoke(script, false, &keys, &args).await?;
        match self
            .life
            .check_reply(slot, &reply, std::time::Instant::now())
        {
            Some(started) => {
                // An instance that never asked for a lease holds none, and its
                // quarantine would be 0: it keeps the earlier life, so its first grant
                // reports the restart with that grant's TTL.
                if !(gate_args.is_restart(&started) && gate_args.grace_is_zero()) {
                    self.saw_life(gate_args.slot, &started);
                }
                Ok(())
            }
            None => Err(redis::make_extension_error(
                "UNEXPECTED".to_owned(),
                Some(format!("the life script answered {reply:?}")),
            )),
        }
    }

    /// The place `slot` (the server; on a Cluster, one slot) is in life
    /// `started`: if this instance saw another one before, the server lost
    /// every lease it granted there then, so each lease of this instance there
    /// is marked lost now. Returns whether that happened.
    pub(super) fn saw_life(&self, slot: u16, started: &str) -> bool {
        if !self.life.saw(slot, started) {
            return false;
        }
        let lost = self.signals.restarted(|key| {
            self.life
                .holds_in(slot, &Names::new(&self.prefix, key).lock)
        });
        tracing::warn!(target = %self.target, slot, lost, "the server restarted without its data: every lease of this instance there is lost");
        true
    }

    /// One run of a granting or renewing script, acknowledged with `replica_ack`.
    async fn invoke_lease_once(
        &self,
        lease: &LeaseScript,
        keys: &[&[u8]],
        args: &[&[u8]],
    ) -> Result<(Value, Option<RedisError>), RedisError> {
        let Some(pool) = &self.acks else {
            let reply = self.conn.invoke(lease, lease.renewal, keys, args).await?;
            return Ok((reply, None));
        };
        let (reply, acks) = self.conn.invoke_acked(pool, lease, keys, args).await?;
        let (replicas, timeout) = pool.settings();
        match acks {
            Some(acks) if acks < i64::from(replicas) => {
                let too_few = redis::make_extension_error(
                    "NOREPLICAS".to_owned(),
                    Some(format!(
                        "{acks} of the {replicas} replicas required acknowledged the write within {timeout:?}"
                    )),
                );
                Ok((reply, Some(too_few)))
            }
            _ => Ok((reply, None)),
        }
    }

    /// Starts the notification task on the current runtime unless it is running:
    /// at connect, and again when the runtime that ran it has shut down (its tasks
    /// are gone, and with them the wake-ups). Meanwhile waiters rely on their timers.
    pub(super) fn ensure_notifier(self: &Arc<Self>) {
        let mut task = self.notifier.lock().unwrap_or_else(PoisonError::into_inner);
        if task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        if !crate::runtime::available() {
            return;
        }
        if task.is_some() {
            tracing::debug!(channel = %self.channel, "the notification task ended with its runtime; restarting it");
        }
        self.subscriber.restarting();
        *task = crate::runtime::spawn(notify::run(
            self.conn.clone(),
            self.channel.clone(),
            self.connection_timeout,
            Arc::downgrade(self),
            self.stop.clone(),
        ));
    }

    /// The checks of `connect`: the scripts load, the renewal script runs on the
    /// probe key, the subscription comes up, and this instance may publish on its
    /// channel.
    pub(super) async fn verify(&self) -> Result<()> {
        // The largest script last: a server that wants a password refuses a
        // long bulk string from a client that has not given it with a protocol
        // error, and a smaller request first gets the clear NOAUTH.
        for script in [
            &*RELEASE,
            &*RENEW_LOCK,
            &*LEAVE,
            &*super::renew::RENEW_BATCH,
            &*ACQUIRE,
        ] {
            self.conn
                .load(script)
                .await
                .map_err(|e| self.check_error("SCRIPT LOAD", e))?;
        }
        let probe = LockKey::from(PROBE_KEY);
        let n = Names::new(&self.prefix, &probe);
        let reply = self
            .invoke_lease(
                &RENEW_LOCK,
                &[&n.lock, &n.fence, &n.queue, &n.queue_expiry],
                &[
                    LeaseToken::random().to_hex().as_bytes(),
                    b"1",
                    b"1",
                    self.instance_id.as_bytes(),
                ],
            )
            .await
            .map_err(|e| {
                let name = String::from_utf8_lossy(&n.lock);
                self.check_error(
                    &format!("running the renewal script (EVALSHA) on {name}"),
                    e,
                )
            })?;
        decode_renewal(&probe, &reply)?;
        self.first_subscription().await?;
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&self.channel).arg("");
        self.conn
            .query(&publish)
            .await
            .map_err(|e| self.check_error(&format!("PUBLISH on {}", self.channel), e))?;
        Ok(())
    }

    /// Waits, at most the connection timeout, until the notification task has
    /// subscribed once. An ACL or authentication refusal ends the wait at once.
    pub(super) async fn first_subscription(&self) -> Result<()> {
        let mut attempts = self.subscriber.attempts();
        let deadline = tokio::time::Instant::now() + self.connection_timeout;
        let mut last = None;
        loop {
            match &*attempts.borrow_and_update() {
                notify::Attempt::Subscribed => return Ok(()),
                notify::Attempt::Failed(e) => {
                    if is_auth_failure(e) || mapping(e) == Mapping::NoPermission {
                        return Err(
                            self.check_error(&format!("SUBSCRIBE to {}", self.channel), e.clone())
                        );
                    }
                    last = Some(e.clone());
                }
                notify::Attempt::Pending => {}
            }
            if !matches!(
                tokio::time::timeout_at(deadline, attempts.changed()).await,
                Ok(Ok(()))
            ) {
                let check = format!(
                    "SUBSCRIBE to {} did not succeed within {:?}",
                    self.channel, self.connection_timeout
                );
                return Err(Error::Connect {
                    target: self.target.clone(),
                    source: match last {
                        Some(e) => Arc::new(CheckFailed { check, source: e }),
                        None => Arc::from(Box::<dyn std::error::Error + Send + Sync>::from(check)),
                    },
                });
            }
        }
    }

    /// The error of a failed `connect` check.
    pub(super) fn check_error(&self, check: &str, e: RedisError) -> Error {
        if is_auth_failure(&e) {
            return connect_error(&self.target, check, e);
        }
        let failed = Arc::new(CheckFailed {
            check: format!("connect check: {check}"),
            source: e,
        });
        match mapping(&failed.source) {
            Mapping::NoPermission => Error::NoPermission {
                key: LockKey::from(PROBE_KEY),
                phase: Phase::Acquiring,
                source: failed,
            },
            Mapping::Refused(code) => Error::Refused {
                key: LockKey::from(PROBE_KEY),
                phase: Phase::Acquiring,
                code,
                source: failed,
            },
            Mapping::Foreign | Mapping::Transient => Error::Connect {
                target: self.target.clone(),
                source: failed,
            },
        }
    }

    /// Leaves the queue of `key`; with `only_if_claimed`, only if this instance
    /// holds the key's claim (see `lua/leave.lua`). Returns whether it left.
    pub(super) async fn leave(&self, key: &LockKey, only_if_claimed: bool) -> Result<bool> {
        self.leave_giving_back(key, only_if_claimed, None).await
    }

    /// Leaves the queue of `key` and gives back the lock a release granted to
    /// `token` if it is still that token's (an unwanted grant: nobody here waits
    /// with it; see `lua/leave.lua`).
    pub(super) async fn give_back(&self, key: &LockKey, token: LeaseToken) -> Result<bool> {
        self.leave_giving_back(key, false, Some(token)).await
    }

    async fn leave_giving_back(
        &self,
        key: &LockKey,
        only_if_claimed: bool,
        token: Option<LeaseToken>,
    ) -> Result<bool> {
        let n = Names::new(&self.prefix, key);
        let token = token.map(|t| t.to_hex());
        let claim_ttl_ms = self.claim_ttl_ms.to_string();
        let message = wake_message(LockKind::Mutex, key);
        let mut args: Vec<&[u8]> = vec![
            self.instance_id.as_bytes(),
            claim_ttl_ms.as_bytes(),
            self.channel_prefix.as_bytes(),
            &message,
            if only_if_claimed { b"1" } else { b"0" },
        ];
        if let Some(token) = &token {
            args.push(token.as_bytes());
        }
        let reply = self
            .invoke(
                &LEAVE,
                &[&n.lock, &n.queue, &n.claim, &n.queue_expiry],
                &args,
            )
            .await
            .map_err(|e| map_err(key, Phase::Acquiring, e))?;
        let (left, refused) = decode_leave(key, &reply)?;
        if let Some(error) = refused {
            warn_refused_publish(key, "leave", &error);
        }
        Ok(left)
    }
}

/// `age` in whole microseconds, as the fair scripts take it.
fn age_micros(age: Duration) -> String {
    u64::try_from(age.as_micros())
        .unwrap_or(u64::MAX)
        .to_string()
}
