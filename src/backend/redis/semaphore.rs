//! RedisBackend's semaphores: [`SemaphoreBackend`](crate::backend::semaphore::SemaphoreBackend).
//!
//! # Protocol
//!
//! The names of semaphore key `<key>` share the hash tag of its lock names
//! (`<prefix>:{<key>}`), so every script stays single-slot:
//!
//! * `<prefix>:{<key>}:sem`: the permit set, a sorted set token → expiry (ms, server
//!   `TIME`); a permit whose expiry has passed is never counted, and is purged by
//!   the next script that writes, so a killed holder's permit returns at its TTL;
//! * `<prefix>:{<key>}:semn`: `N`, fixed at first use, living as long as any permit
//!   or waiting entry does (a request with another `N` gets
//!   [`Error::PermitMismatch`] with nothing changed);
//! * `<prefix>:{<key>}:semq` and `<prefix>:{<key>}:semqx`: the waiting set of
//!   instances, ordered by enqueue time, with its expiry index (the same structure as
//!   a lock's queue; entries expire, so a crashed instance drops out).
//!
//! Scripts (`lua/sem_*.lua`, after the lock scripts' prelude and
//! `lua/sem_common.lua`), one round trip each, reads before writes:
//!
//! * `sem_acquire`: grants up to `k` permits (one token each) and says how many, and
//!   how long to wait for the rest; a waiting instance joins the waiting set (and
//!   moves to its back after a partial grant, so instances take turns);
//! * `sem_release`: removes one permit, then publishes the semaphore's wake-up
//!   message for the key (see `notify`) on the channels of as many waiting
//!   instances as permits are free, oldest first (one wake-up per free permit, no
//!   broadcast), on each instance's channel `<prefix>:inst:<id>`;
//! * `sem_leave`: a waiting instance gives up, passing on the wake-ups it may have
//!   been sent;
//! * `sem_renew`: re-arms one permit if it is still live.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::acked::{LeaseScript, first_is_one, first_is_positive};
use super::notify::wake_message;
use super::{
    Inner, Names, PRELUDE, RedisBackend, SEM_COMMON, map_err, millis, renewal_script, unexpected,
    warn_refused_publish,
};
use crate::backend::semaphore::{Permits, SemaphoreBackend};
use crate::backend::{LeaseToken, LockKind, Renewal, WhenBusy};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

fn sem_script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{SEM_COMMON}\n{body}"))
}

static SEM_ACQUIRE: LeaseScript = LeaseScript::grant(
    || super::life::gated(&[SEM_COMMON, include_str!("lua/sem_acquire.lua")]),
    first_is_positive,
);
static SEM_RELEASE: LazyLock<Script> =
    LazyLock::new(|| sem_script(include_str!("lua/sem_release.lua")));
static SEM_LEAVE: LazyLock<Script> =
    LazyLock::new(|| sem_script(include_str!("lua/sem_leave.lua")));
static SEM_RENEW: LeaseScript = LeaseScript::renewal(
    || renewal_script(include_str!("lua/sem_renew.lua")),
    first_is_one,
);

/// The shortest retry delay of a waiting instance (a reply of 0 ms would spin).
const MIN_RETRY: Duration = Duration::from_millis(5);

/// The Redis names of one semaphore key.
pub(super) struct SemNames {
    pub(super) permits: Vec<u8>,
    pub(super) count: Vec<u8>,
    queue: Vec<u8>,
    expiry: Vec<u8>,
}

impl SemNames {
    pub(super) fn new(prefix: &str, key: &LockKey) -> SemNames {
        let base = Names::new(prefix, key).lock;
        let with = |suffix: &[u8]| [&base[..], suffix].concat();
        SemNames {
            permits: with(b":sem"),
            count: with(b":semn"),
            queue: with(b":semq"),
            expiry: with(b":semqx"),
        }
    }

    fn keys(&self) -> [&[u8]; 4] {
        [&self.permits, &self.count, &self.queue, &self.expiry]
    }
}

/// The reply of `lua/sem_acquire.lua`; `max_wait` bounds the retry delay.
fn decode_acquire(
    key: &LockKey,
    permits: u32,
    reply: &Value,
    max_wait: Duration,
) -> Result<Permits> {
    if let Value::Array(items) = reply {
        match items.as_slice() {
            [Value::Int(-3), Value::Int(stored)] => {
                return Err(Error::PermitMismatch {
                    key: key.clone(),
                    permits: u32::try_from(*stored).unwrap_or(0),
                    requested: permits,
                });
            }
            [Value::Int(-4)] => {
                // Only a late copy of a request meets a release record of its own
                // tokens: their holders had already released them.
                return Err(Error::LeaseLost {
                    key: key.clone(),
                    phase: Phase::Acquiring,
                    reason: "a permit token was already released; a released token is never \
                             granted again"
                        .into(),
                });
            }
            [Value::Int(granted), Value::Int(wait_ms), Value::Int(others)] if *granted >= 0 => {
                let wait = Duration::from_millis(u64::try_from(*wait_ms).unwrap_or(0));
                return Ok(Permits {
                    granted: usize::try_from(*granted).unwrap_or(0),
                    retry_in: wait.clamp(MIN_RETRY, max_wait.max(MIN_RETRY)),
                    waiting: u32::try_from(*others).unwrap_or(u32::MAX),
                });
            }
            _ => {}
        }
    }
    Err(unexpected(key, Phase::Acquiring, reply))
}

/// The error of a refused wake-up `PUBLISH` at the end of a reply.
fn refused(rest: &[Value]) -> Option<String> {
    match rest {
        [Value::BulkString(b), ..] => Some(String::from_utf8_lossy(b).into_owned()),
        [Value::SimpleString(s), ..] => Some(s.clone()),
        _ => None,
    }
}

impl Inner {
    /// Runs a semaphore script that grants or renews permits (acknowledged with
    /// `replica_ack`, see `Inner::invoke_lease`).
    async fn sem_invoke_lease(
        &self,
        lease: &LeaseScript,
        key: &LockKey,
        phase: Phase,
        args: &[&[u8]],
    ) -> Result<Value> {
        let n = SemNames::new(&self.prefix, key);
        self.invoke_lease(lease, &n.keys(), args)
            .await
            .map_err(|e| map_err(key, phase, e))
    }

    async fn sem_invoke(
        &self,
        script: &Script,
        key: &LockKey,
        phase: Phase,
        args: &[&[u8]],
    ) -> Result<Value> {
        let n = SemNames::new(&self.prefix, key);
        self.invoke(script, &n.keys(), args)
            .await
            .map_err(|e| map_err(key, phase, e))
    }
}

#[async_trait]
impl SemaphoreBackend for RedisBackend {
    async fn acquire_permits(
        &self,
        key: &LockKey,
        permits: u32,
        tokens: &[LeaseToken],
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Permits> {
        let inner = &self.inner;
        if when_busy == WhenBusy::Queue {
            // A caller about to wait needs the wake-ups.
            inner.ensure_notifier();
        }
        inner.note_lease(ttl);
        let head = [
            permits.to_string().into_bytes(),
            millis(ttl).to_string().into_bytes(),
            inner.instance_id.clone().into_bytes(),
            inner.entry_ttl_ms.to_string().into_bytes(),
            if when_busy == WhenBusy::Queue {
                b"1".to_vec()
            } else {
                b"0".to_vec()
            },
        ];
        let hex: Vec<String> = tokens.iter().map(|t| t.to_hex()).collect();
        let args: Vec<&[u8]> = head
            .iter()
            .map(Vec::as_slice)
            .chain(hex.iter().map(|h| h.as_bytes()))
            .collect();
        // One release record per token (KEYS[5..]): a released token is never
        // granted again, so a late copy of this request is refused whole.
        let n = SemNames::new(&inner.prefix, key);
        let names = Names::new(&inner.prefix, key);
        let records: Vec<Vec<u8>> = hex.iter().map(|h| names.release_record(h)).collect();
        let keys: Vec<&[u8]> = n
            .keys()
            .into_iter()
            .chain(records.iter().map(Vec::as_slice))
            .collect();
        let reply = inner
            .invoke_lease(&SEM_ACQUIRE, &keys, &args)
            .await
            .map_err(|e| map_err(key, Phase::Acquiring, e))?;
        decode_acquire(key, permits, &reply, inner.entry_refresh)
    }

    async fn release_permit(&self, key: &LockKey, token: LeaseToken) -> Result<bool> {
        let inner = &self.inner;
        let (n, token) = (SemNames::new(&inner.prefix, key), token.to_hex());
        let record = Names::new(&inner.prefix, key).release_record(&token);
        let message = wake_message(LockKind::Semaphore, key);
        let record_ttl_ms = inner.release_record_ttl_ms.to_string();
        let [permits, count, queue, expiry] = n.keys();
        let keys: [&[u8]; 5] = [permits, count, queue, expiry, &record];
        let args: [&[u8]; 4] = [
            token.as_bytes(),
            inner.channel_prefix.as_bytes(),
            &message,
            record_ttl_ms.as_bytes(),
        ];
        let sent = inner.replay_version(&keys);
        let reply = inner
            .invoke(&SEM_RELEASE, &keys, &args)
            .await
            .map_err(|e| map_err(key, Phase::Releasing, e))?;
        if let Value::Array(items) = &reply
            && let [Value::Int(released @ (0 | 1)), Value::Int(_), rest @ ..] = items.as_slice()
        {
            inner.log_release(sent, &SEM_RELEASE, &keys, &args, &reply);
            if let Some(error) = refused(rest) {
                warn_refused_publish(key, "semaphore release", &error);
            }
            return Ok(*released == 1);
        }
        Err(unexpected(key, Phase::Releasing, &reply))
    }

    async fn leave_permits(&self, key: &LockKey) -> Result<()> {
        let inner = &self.inner;
        let reply = inner
            .sem_invoke(
                &SEM_LEAVE,
                key,
                Phase::Acquiring,
                &[
                    inner.instance_id.as_bytes(),
                    inner.channel_prefix.as_bytes(),
                    &wake_message(LockKind::Semaphore, key),
                ],
            )
            .await?;
        if let Value::Array(items) = &reply
            && let [Value::Int(_), rest @ ..] = items.as_slice()
        {
            if let Some(error) = refused(rest) {
                warn_refused_publish(key, "semaphore leave", &error);
            }
            return Ok(());
        }
        Err(unexpected(key, Phase::Acquiring, &reply))
    }

    async fn renew_permit(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Renewal> {
        let reply = self
            .inner
            .sem_invoke_lease(
                &SEM_RENEW,
                key,
                Phase::Renewing,
                &[
                    token.to_hex().as_bytes(),
                    millis(ttl).to_string().as_bytes(),
                ],
            )
            .await?;
        decode_permit_renewal(key, &reply)
    }
}

/// The reply of `lua/sem_renew.lua`.
pub(super) fn decode_permit_renewal(key: &LockKey, reply: &Value) -> Result<Renewal> {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1)] => Ok(Renewal::Renewed { waiting: 0 }),
            [Value::Int(0)] => Ok(Renewal::NotOwner),
            _ => Err(unexpected(key, Phase::Renewing, reply)),
        },
        _ => Err(unexpected(key, Phase::Renewing, reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_acquire_replies() {
        let k = LockKey::from("k");
        let max = Duration::from_secs(1);
        let ints = |v: &[i64]| Value::Array(v.iter().map(|n| Value::Int(*n)).collect());
        assert_eq!(
            decode_acquire(&k, 3, &ints(&[2, 0, 4]), max).unwrap(),
            Permits {
                granted: 2,
                retry_in: MIN_RETRY,
                waiting: 4,
            }
        );
        assert_eq!(
            decode_acquire(&k, 3, &ints(&[0, 60_000, 0]), max)
                .unwrap()
                .retry_in,
            max
        );
        match decode_acquire(&k, 3, &ints(&[-3, 5]), max) {
            Err(Error::PermitMismatch {
                permits: 5,
                requested: 3,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        assert!(decode_acquire(&k, 3, &ints(&[-1]), max).is_err());
    }

    #[test]
    fn names_share_the_lock_hash_tag() {
        let n = SemNames::new("p", &LockKey::from("a{b}"));
        assert_eq!(n.permits, b"p:{a%7Bb%7D}:sem");
        assert_eq!(n.count, b"p:{a%7Bb%7D}:semn");
        assert_eq!(n.queue, b"p:{a%7Bb%7D}:semq");
        assert_eq!(n.expiry, b"p:{a%7Bb%7D}:semqx");
    }
}
