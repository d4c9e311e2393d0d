//! RedisBackend's read-write locks: [`RwBackend`](crate::backend::rw::RwBackend).
//!
//! # Keys
//!
//! All under the lock's name `prefix:{key}` (one hash tag, so one Cluster slot):
//!
//! * `:rd` read leases, a sorted set of tokens scored by their expiry (ms, server
//!   clock); expired ones are purged by the next acquire, so a crashed reader's
//!   lease ends at its TTL. The set's own TTL covers its latest lease.
//! * `:wr` the write lease, a string holding its token, with `PX`.
//! * `:ww` waiting writers, a sorted set of writer tokens scored by expiry; a
//!   waiting writer re-registers at every attempt (at least every third of the
//!   backend's queue entry TTL). While it holds a live entry no new read lease is
//!   granted (writer preference).
//! * `:wr:g:<token>` a waiting writer's grant entry (its token, TTL, last ask's
//!   arrival, entry lifetime, send stamp and instance), living as long as its
//!   `:ww` entry; a release that frees the lock may grant the write lease to the
//!   earliest waiting writer from it, and marks it `granted <token>` then
//!   (`lua/rw_release.lua`, "The grant" in ARCHITECTURE.md).
//! * `:wf` the write fence: the last write epoch, `max(last + 1, TIME in µs)`, kept
//!   for `max(60 s, 10 × TTL)` after a grant or a renewal that re-arms it (the
//!   watchdog's renewals do when half of that time has passed: `lease/renewal.rs`).
//! * `:rwq` the instances told to wait, a sorted set of instance ids scored by
//!   expiry: when the lock frees up for them, each gets the read-write lock's
//!   wake-up message for the key on its channel (see `notify`), and the set is
//!   cleared.
//!
//! Scripts: `lua/rw_read.lua`, `lua/rw_write.lua`, `lua/rw_release.lua`,
//! `lua/rw_renew.lua`; each documents its KEYS, ARGV and replies.

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::acked::{LeaseScript, first_is_one};
use super::life::gated;
use super::notify::wake_message;
use super::{
    Inner, Names, RedisBackend, decode_acquire, map_err, millis, renewal_script, script,
    warn_refused_publish,
};
use crate::backend::rw::RwBackend;
use crate::backend::signals::send_stamp;
use crate::backend::{Acquire, LeaseToken, LockKind, Released, RenewItem, Renewal, WhenBusy};
use crate::error::{Phase, Result};
use crate::key::LockKey;

static READ: LeaseScript =
    LeaseScript::grant(|| gated(&[include_str!("lua/rw_read.lua")]), first_is_one);
static WRITE: LeaseScript =
    LeaseScript::grant(|| gated(&[include_str!("lua/rw_write.lua")]), first_is_one);
static RELEASE: LazyLock<Script> = LazyLock::new(|| script(include_str!("lua/rw_release.lua")));
static RENEW: LeaseScript = LeaseScript::renewal(
    || renewal_script(include_str!("lua/rw_renew.lua")),
    first_is_one,
);

/// The Redis names of one key's read-write lock.
pub(super) struct RwNames {
    pub(super) readers: Vec<u8>,
    pub(super) writer: Vec<u8>,
    pub(super) writers: Vec<u8>,
    pub(super) fence: Vec<u8>,
    waiting: Vec<u8>,
}

impl RwNames {
    pub(super) fn new(prefix: &str, key: &LockKey) -> RwNames {
        let base = Names::new(prefix, key).lock;
        let with = |suffix: &[u8]| [&base[..], suffix].concat();
        RwNames {
            readers: with(b":rd"),
            writer: with(b":wr"),
            writers: with(b":ww"),
            fence: with(b":wf"),
            waiting: with(b":rwq"),
        }
    }
}

pub(super) fn fence_ttl_ms(ttl: Duration) -> u64 {
    millis(ttl)
        .saturating_mul(u64::from(RenewItem::FENCE_TTL_FACTOR))
        .max(60_000)
}

/// Which lease a release or a renewal is about.
#[derive(Clone, Copy)]
enum Kind {
    Read,
    Write,
    /// The give-back of a write grant nobody here took: a write release only
    /// while the grant's mark shows no ask of the token took the lease.
    GiveBack,
}

impl Kind {
    fn arg(self) -> &'static [u8] {
        match self {
            Kind::Read => b"r",
            Kind::Write => b"w",
            Kind::GiveBack => b"g",
        }
    }
}

impl Inner {
    /// Runs `lua/rw_release.lua` for `kind` of `token`: a release, which retires
    /// the token (its release record) and, where this backend grants
    /// ([`grants`](Inner::grants)), may grant the write lease to a waiting
    /// writer.
    async fn rw_release(&self, kind: Kind, key: &LockKey, token: LeaseToken) -> Result<Released> {
        let n = RwNames::new(&self.prefix, key);
        let names = Names::new(&self.prefix, key);
        let token = token.to_hex();
        let record = names.release_record(&token);
        let life = self.life.key_of(self.life.place_of(&[&names.lock]));
        let message = wake_message(LockKind::ReadWrite, key);
        let record_ttl_ms = self.release_record_ttl_ms.to_string();
        let grants: &[u8] = if self.grants() { b"1" } else { b"" };
        let keys: [&[u8]; 7] = [
            &n.readers, &n.writer, &n.writers, &n.waiting, &record, &n.fence, &life,
        ];
        let args: [&[u8]; 6] = [
            kind.arg(),
            token.as_bytes(),
            self.channel_prefix.as_bytes(),
            &message,
            record_ttl_ms.as_bytes(),
            grants,
        ];
        let sent = self.replay_version(&keys);
        let reply = self
            .invoke(&RELEASE, &keys, &args)
            .await
            .map_err(|e| map_err(key, Phase::Releasing, e))?;
        let (released, refused) = super::decode_release(key, &reply)?;
        self.log_release(sent, &RELEASE, &keys, &args, &reply);
        if let Some(error) = refused {
            warn_refused_publish(key, "read-write release", &error);
        }
        Ok(released)
    }

    /// Gives back a write grant nobody here wants (see `notify`): the write
    /// release of its token, which deletes the write lease, retires the token and
    /// passes the lock on, as the given-up writer's own cleanup would, but only
    /// while the lease is still that token's and the grant's mark shows that no
    /// ask of the token took it (a copy of the message that arrives after the
    /// token's own ask took the lease changes nothing).
    pub(super) async fn give_back_write(&self, key: &LockKey, token: LeaseToken) -> Result<()> {
        self.rw_release(Kind::GiveBack, key, token).await.map(drop)
    }
}

impl RedisBackend {
    async fn rw_acquire(
        &self,
        script: &LeaseScript,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        let inner = &self.inner;
        if when_busy == WhenBusy::Queue {
            inner.ensure_notifier();
        }
        inner.note_lease(ttl);
        let n = RwNames::new(&inner.prefix, key);
        let token = token.to_hex();
        // A released token is never granted again (its record refuses a late copy).
        let record = Names::new(&inner.prefix, key).release_record(&token);
        let stamp = send_stamp(tokio::time::Instant::now()).to_string();
        let reply = inner
            .invoke_lease(
                script,
                &[
                    &n.readers, &n.writer, &n.writers, &n.fence, &n.waiting, &record,
                ],
                &[
                    token.as_bytes(),
                    millis(ttl).to_string().as_bytes(),
                    inner.instance_id.as_bytes(),
                    inner.entry_ttl_ms.to_string().as_bytes(),
                    if when_busy == WhenBusy::Queue {
                        b"1"
                    } else {
                        b"0"
                    },
                    fence_ttl_ms(ttl).to_string().as_bytes(),
                    // The send stamp that a write grant's message echoes: taken
                    // before the send, so a grant's validity never counts from
                    // after it (see `lua/rw_release.lua`). The read script
                    // ignores it.
                    stamp.as_bytes(),
                ],
            )
            .await
            .map_err(|e| map_err(key, Phase::Acquiring, e))?;
        // A read lease may carry epoch 0 (no write recorded): decode it here.
        if let Value::Array(items) = &reply
            && let [Value::Int(1), Value::Int(0), others] = items.as_slice()
        {
            return Ok(Acquire::Acquired {
                epoch: 0,
                waiting: super::waiting(others),
                earliest_other: None,
            });
        }
        decode_acquire(key, &reply, inner.entry_refresh)
    }

    async fn rw_renew(
        &self,
        kind: Kind,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Renewal> {
        let inner = &self.inner;
        let n = RwNames::new(&inner.prefix, key);
        let reply = inner
            .invoke_lease(
                &RENEW,
                &[&n.readers, &n.writer, &n.writers, &n.fence],
                &[
                    kind.arg(),
                    token.to_hex().as_bytes(),
                    millis(ttl).to_string().as_bytes(),
                    fence_ttl_ms(ttl).to_string().as_bytes(),
                ],
            )
            .await
            .map_err(|e| map_err(key, Phase::Renewing, e))?;
        super::decode_renewal(key, &reply)
    }
}

#[async_trait]
impl RwBackend for RedisBackend {
    async fn acquire_read(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        self.rw_acquire(&READ, key, token, ttl, when_busy).await
    }

    async fn acquire_write(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        self.rw_acquire(&WRITE, key, token, ttl, when_busy).await
    }

    async fn release_read(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        self.inner.rw_release(Kind::Read, key, token).await
    }

    async fn release_write(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        self.inner.rw_release(Kind::Write, key, token).await
    }

    async fn renew_read(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal> {
        self.rw_renew(Kind::Read, key, token, ttl).await
    }

    async fn renew_write(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Renewal> {
        self.rw_renew(Kind::Write, key, token, ttl).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_the_lock_hash_tag() {
        let n = RwNames::new("p", &LockKey::from("a{b}"));
        for name in [&n.readers, &n.writer, &n.writers, &n.fence, &n.waiting] {
            assert!(name.starts_with(b"p:{a%7Bb%7D}:"), "{name:?}");
        }
    }

    #[test]
    fn a_read_grant_without_write_is_epoch_zero_not_malformed() {
        // decode_acquire refuses epoch 0 (a mutex always has one); the rw decoder
        // accepts it for reads, before delegating.
        let reply = Value::Array(vec![Value::Int(1), Value::Int(0), Value::Int(0)]);
        assert!(decode_acquire(&LockKey::from("k"), &reply, Duration::from_secs(1)).is_err());
    }
}
