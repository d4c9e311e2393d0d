//! [`FencedKey`]: a Redis key written only under a fencing token not older than the
//! last one it accepted, and a write with a [`WriteId`](super::WriteId) at most once
//! (`lua/fenced.lua`).
//!
//! # Layout
//!
//! The resource keeps its own name and type; the last accepted token lives beside
//! it in a string `"<epoch>:<seq>"` without a TTL, its *fence*, and the write ids
//! applied under that token in a hash, its *write record* (written only by writes
//! that carry an id), named so that all three share one cluster slot (the script
//! touches them together):
//!
//! * a resource with a hash tag (`stock:{555}`) keeps it: the fence is
//!   `stock:{555}:lockflight-fence`, the record `stock:{555}:lockflight-writes`;
//! * a resource without one (`stock:555`) is wrapped into a tag, which hashes
//!   exactly the same bytes: `{stock:555}:lockflight-fence`,
//!   `{stock:555}:lockflight-writes`.
//!
//! A resource without a hash tag that contains `}` cannot be wrapped (the tag would
//! end early); it is refused with [`Error::InvalidKey`].
//!
//! The fence never expires: a fence that vanished while its resource lived would
//! let any older holder in. Deleting the resource (even with
//! [`FencedKey::delete`]) keeps the fence, so a stale holder cannot recreate it;
//! [`FencedKey::forget`] removes the fence and the record once nobody can write
//! any more. The record holds the ids of one token only: the first write with an
//! id under a newer token replaces it.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisError, Script, ToRedisArgs, Value};

use super::Fenced;
use super::write::WriteId;
use crate::error::{Error, Phase, Result};
use crate::guard::FencingToken;
use crate::key::LockKey;

static FENCED: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("lua/fenced.lua")));

/// The suffix of a fence's name.
const FENCE_SUFFIX: &[u8] = b":lockflight-fence";
/// The suffix of a write record's name.
const WRITES_SUFFIX: &[u8] = b":lockflight-writes";

/// A Redis key guarded by fencing tokens: every write through it is applied only
/// if its token is not older than the last token the key accepted, in one script
/// (see the [module docs](crate::fence) for the rule). It holds only names; each call
/// takes any `redis` async connection, a cluster one included (the resource, its fence
/// and its write record share one slot).
///
/// ```no_run
/// # async fn demo(locker: lockflight::Locker, mut data: redis::aio::ConnectionManager) -> lockflight::Result<()> {
/// use lockflight::fence::FencedKey;
///
/// let counter = FencedKey::new("orders:{eu}:count")?;
/// locker
///     .with_lock("orders:eu", |info| async move {
///         // Refused (Fenced::Stale) if a newer holder has written meanwhile.
///         counter.incr_by(&mut data, &info, 1).await
///     })
///     .await??;
/// # Ok(()) }
/// ```
///
/// # Repeating a write
///
/// A write whose reply did not arrive ([`Error::Backend`], or a dropped future) may or
/// may not have been applied; a repeat answered [`Fenced::Stale`] (a newer holder has
/// written) leaves that unknown. A repeat with the same token:
///
/// * **with a write id** (the same [`WriteId`] to an `*_once` method in every attempt)
///   is safe, even while an earlier attempt is on its way: applied at most once per
///   token, every later attempt gets [`Fenced::Applied`] with the result of the one that
///   applied. At least the 64 newest ids of the token are kept; an id older than one
///   forgotten is refused with [`Error::Refused`] (code `WRITEID`), never applied;
/// * **without one** is a new write: [`incr_by`](Self::incr_by) adds again; [`set`](Self::set),
///   [`set_with_ttl`](Self::set_with_ttl), [`hset`](Self::hset) and [`delete`](Self::delete)
///   are safe unless the earlier attempt lands after a later write of the same section;
///   [`advance`](Self::advance) is always safe.
///
/// ```no_run
/// # async fn demo(guard: lockflight::LockGuard, mut data: redis::aio::ConnectionManager) -> lockflight::Result<()> {
/// use lockflight::fence::{FencedKey, WriteId};
///
/// let counter = FencedKey::new("orders:{eu}:count")?;
/// let once = WriteId::next();
/// let mut outcome = counter.incr_by_once(&mut data, &guard, 1, once).await;
/// for _ in 0..3 {
///     if !outcome.as_ref().is_err_and(|e| e.is_transient()) {
///         break;
///     }
///     // The reply was lost: the same write again (the manager reconnects).
///     outcome = counter.incr_by_once(&mut data, &guard, 1, once).await;
/// }
/// let added = outcome?;
/// # let _ = added;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FencedKey {
    resource: Vec<u8>,
    fence: Vec<u8>,
    writes: Vec<u8>,
}

impl FencedKey {
    /// Names the Redis key `resource` (exactly these bytes, no prefix added), its
    /// fence and its write record.
    ///
    /// ```
    /// use lockflight::fence::FencedKey;
    ///
    /// let plain = FencedKey::new("stock:555")?;
    /// assert_eq!(plain.fence_name(), b"{stock:555}:lockflight-fence");
    /// assert_eq!(plain.writes_name(), b"{stock:555}:lockflight-writes");
    /// let tagged = FencedKey::new("stock:{555}")?;
    /// assert_eq!(tagged.fence_name(), b"stock:{555}:lockflight-fence");
    /// assert!(FencedKey::new("").is_err());
    /// # Ok::<(), lockflight::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] naming the key when it is empty, longer than
    /// [`LockKey::MAX_LEN`], or has no hash tag but contains `}` (its fence could
    /// not share its cluster slot; give it a hash tag such as `{…}`).
    pub fn new(resource: impl Into<Vec<u8>>) -> Result<FencedKey> {
        let resource = resource.into();
        let invalid = |reason: &str| Error::InvalidKey {
            key: LockKey::from(resource.clone()),
            reason: format!("cannot be a fenced key: {reason}"),
        };
        if resource.is_empty() {
            return Err(invalid("the key is empty"));
        }
        if resource.len() > LockKey::MAX_LEN {
            return Err(invalid(&format!(
                "the key is {} bytes long, the limit is {}",
                resource.len(),
                LockKey::MAX_LEN
            )));
        }
        let tagged = if hash_tag(&resource).is_some() {
            resource.clone()
        } else if resource.contains(&b'}') {
            return Err(invalid(
                "it has no hash tag but contains `}`, so its fence cannot share its cluster slot; give it a hash tag such as {…}",
            ));
        } else {
            [b"{", &resource[..], b"}"].concat()
        };
        Ok(FencedKey {
            fence: [&tagged[..], FENCE_SUFFIX].concat(),
            writes: [&tagged[..], WRITES_SUFFIX].concat(),
            resource,
        })
    }

    /// The resource's Redis name.
    pub fn name(&self) -> &[u8] {
        &self.resource
    }

    /// The Redis name of the string that holds the last accepted token.
    pub fn fence_name(&self) -> &[u8] {
        &self.fence
    }

    /// The Redis name of the hash that holds the write ids applied under the last
    /// accepted token (see "Repeating a write" above).
    pub fn writes_name(&self) -> &[u8] {
        &self.writes
    }

    /// `SET resource value` under `token`.
    ///
    /// # Errors
    ///
    /// See [`FencedKey::incr_by`].
    ///
    /// # Cancel safety
    ///
    /// The write is one script: dropping the future before its reply leaves the
    /// write either fully applied (token recorded) or not done at all; which one is
    /// unknown (see "Repeating a write" above).
    pub async fn set<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        value: impl ToRedisArgs,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
    {
        self.set_with(conn, token, value, None).await
    }

    /// [`set`](Self::set) with the write id `id`: safe to repeat with the same id.
    ///
    /// # Errors
    ///
    /// As [`FencedKey::incr_by_once`].
    ///
    /// # Cancel safety
    ///
    /// As [`FencedKey::set`].
    pub async fn set_once<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        value: impl ToRedisArgs,
        id: WriteId,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
    {
        self.set_with(conn, token, value, Some(id)).await
    }

    async fn set_with<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        value: impl ToRedisArgs,
        write_id: Option<WriteId>,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
    {
        self.run(conn, token.into(), write_id, "set", |s| {
            s.arg(value);
        })
        .await
        .map(|f| f.map(drop))
    }

    /// `SET resource value PX ttl` under `token` (the fence itself never expires).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a TTL under 1 ms; otherwise as
    /// [`FencedKey::incr_by`].
    ///
    /// # Cancel safety
    ///
    /// As [`FencedKey::set`].
    pub async fn set_with_ttl<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        value: impl ToRedisArgs,
        ttl: Duration,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
    {
        self.set_with_ttl_with(conn, token, value, ttl, None).await
    }

    /// [`set_with_ttl`](Self::set_with_ttl) with the write id `id`: safe to repeat with
    /// the same id (a repeat of an applied write does not reset the TTL).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a TTL under 1 ms; otherwise as
    /// [`FencedKey::incr_by_once`].
    ///
    /// # Cancel safety
    ///
    /// As [`FencedKey::set`].
    pub async fn set_with_ttl_once<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        value: impl ToRedisArgs,
        ttl: Duration,
        id: WriteId,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
    {
        self.set_with_ttl_with(conn, token, value, ttl, Some(id))
            .await
    }

    async fn set_with_ttl_with<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        value: impl ToRedisArgs,
        ttl: Duration,
        write_id: Option<WriteId>,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
    {
        let ms = ttl_millis(&self.resource, ttl)?;
        self.run(conn, token.into(), write_id, "setpx", |s| {
            s.arg(value).arg(ms);
        })
        .await
        .map(|f| f.map(drop))
    }

    /// `INCRBY resource delta` under `token`; applied, it carries the new value.
    /// Not safe to repeat: use [`incr_by_once`](Self::incr_by_once) with a
    /// write id for that.
    ///
    /// # Errors
    ///
    /// All with nothing written: [`Error::ForeignValue`] when the resource holds a
    /// value of a type the operation cannot change (or the fence is not a fence),
    /// [`Error::Refused`] with code `ERR` when Redis refuses the command itself (a
    /// non-integer value here) and with the server's code for `OOM` and the like,
    /// [`Error::NoPermission`] for an ACL refusal; [`Error::Backend`] (transient)
    /// when the connection failed, in which case the write may or may not have
    /// happened (see "Repeating a write" above).
    ///
    /// # Cancel safety
    ///
    /// As [`FencedKey::set`].
    pub async fn incr_by<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        delta: i64,
    ) -> Result<Fenced<i64>>
    where
        C: ConnectionLike + Send,
    {
        self.incr_by_with(conn, token, delta, None).await
    }

    /// [`incr_by`](Self::incr_by) with the write id `id`, safe to repeat with the same
    /// id: the resource adds `delta` at most once under `token`, and a repeat
    /// of an applied write carries the value that write made.
    ///
    /// # Errors
    ///
    /// As [`FencedKey::incr_by`]; with a write id also [`Error::ForeignValue`]
    /// when the write record holds something else, and [`Error::Refused`] with
    /// code `WRITEID` when the id is too old for the record to tell whether it was
    /// applied (see "Repeating a write" above; nothing is written now).
    ///
    /// # Cancel safety
    ///
    /// As [`FencedKey::set`].
    pub async fn incr_by_once<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        delta: i64,
        id: WriteId,
    ) -> Result<Fenced<i64>>
    where
        C: ConnectionLike + Send,
    {
        self.incr_by_with(conn, token, delta, Some(id)).await
    }

    async fn incr_by_with<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        delta: i64,
        write_id: Option<WriteId>,
    ) -> Result<Fenced<i64>>
    where
        C: ConnectionLike + Send,
    {
        self.run(conn, token.into(), write_id, "incrby", |s| {
            s.arg(delta);
        })
        .await
    }

    /// `HSET resource field value …` under `token`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `fields` is empty; otherwise as
    /// [`FencedKey::incr_by`].
    ///
    /// # Cancel safety
    ///
    /// As [`FencedKey::set`].
    pub async fn hset<C, F, V>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        fields: impl IntoIterator<Item = (F, V)>,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        self.hset_with(conn, token, fields, None).await
    }

    /// [`hset`](Self::hset) with the write id `id`: safe to repeat with the same id.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `fields` is empty; otherwise as
    /// [`FencedKey::incr_by_once`].
    ///
    /// # Cancel safety
    ///
    /// As [`FencedKey::set`].
    pub async fn hset_once<C, F, V>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        fields: impl IntoIterator<Item = (F, V)>,
        id: WriteId,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        self.hset_with(conn, token, fields, Some(id)).await
    }

    async fn hset_with<C, F, V>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        fields: impl IntoIterator<Item = (F, V)>,
        write_id: Option<WriteId>,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        let mut pairs = Vec::new();
        for (field, value) in fields {
            pairs.push((field.to_redis_args(), value.to_redis_args()));
        }
        if pairs.is_empty() {
            return Err(no_fields(&self.resource));
        }
        self.run(conn, token.into(), write_id, "hset", |s| {
            for (field, value) in &pairs {
                s.arg(field).arg(value);
            }
        })
        .await
        .map(|f| f.map(drop))
    }

    /// `DEL resource` under `token`; the fence stays, so an older holder cannot
    /// recreate the resource.
    ///
    /// # Errors
    ///
    /// As [`FencedKey::incr_by`].
    ///
    /// # Cancel safety
    ///
    /// As [`FencedKey::set`].
    pub async fn delete<C>(&self, conn: &mut C, token: impl Into<FencingToken>) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
    {
        self.delete_with(conn, token, None).await
    }

    /// [`delete`](Self::delete) with the write id `id`: safe to repeat with the same id.
    ///
    /// # Errors
    ///
    /// As [`FencedKey::incr_by_once`].
    ///
    /// # Cancel safety
    ///
    /// As [`FencedKey::set`].
    pub async fn delete_once<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        id: WriteId,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
    {
        self.delete_with(conn, token, Some(id)).await
    }

    async fn delete_with<C>(
        &self,
        conn: &mut C,
        token: impl Into<FencingToken>,
        write_id: Option<WriteId>,
    ) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
    {
        self.run(conn, token.into(), write_id, "del", |_| {})
            .await
            .map(|f| f.map(drop))
    }

    /// Records `token` in the fence without touching the resource, so that every
    /// holder with an older token is refused from now on (what
    /// `lockflight release --force --fence` does with the token it mints). Safe to
    /// repeat: it only ever moves the fence forward.
    ///
    /// # Errors
    ///
    /// As [`FencedKey::incr_by`].
    ///
    /// # Cancel safety
    ///
    /// As [`FencedKey::set`].
    pub async fn advance<C>(&self, conn: &mut C, token: impl Into<FencingToken>) -> Result<Fenced>
    where
        C: ConnectionLike + Send,
    {
        self.run(conn, token.into(), None, "advance", |_| {})
            .await
            .map(|f| f.map(drop))
    }

    /// The last token the resource accepted, if any.
    ///
    /// # Errors
    ///
    /// [`Error::ForeignValue`] when the fence holds something else; otherwise as
    /// [`FencedKey::incr_by`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn last_token<C>(&self, conn: &mut C) -> Result<Option<FencingToken>>
    where
        C: ConnectionLike + Send,
    {
        let raw: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&self.fence)
            .query_async(conn)
            .await
            .map_err(|e| redis_error(&self.key(), Phase::Writing, e))?;
        raw.map(|raw| {
            parse_token(&raw).ok_or_else(|| self.foreign("fence", "the fence is not a token"))
        })
        .transpose()
    }

    /// Deletes the fence and the write record (not the resource). Only for a
    /// resource nobody will write again under the old lock: afterwards any token
    /// is accepted, and no write id is remembered.
    ///
    /// # Errors
    ///
    /// As [`FencedKey::incr_by`], without [`Error::ForeignValue`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves both deleted or neither (one `DEL`).
    pub async fn forget<C>(&self, conn: &mut C) -> Result<()>
    where
        C: ConnectionLike + Send,
    {
        redis::cmd("DEL")
            .arg(&self.fence)
            .arg(&self.writes)
            .query_async::<()>(conn)
            .await
            .map_err(|e| redis_error(&self.key(), Phase::Writing, e))
    }

    fn key(&self) -> LockKey {
        LockKey::from(self.resource.clone())
    }

    fn foreign(&self, role: &str, detail: &str) -> Error {
        foreign(&self.key(), role, detail)
    }

    async fn run<C>(
        &self,
        conn: &mut C,
        token: FencingToken,
        write_id: Option<WriteId>,
        op: &str,
        args: impl FnOnce(&mut redis::ScriptInvocation<'static>),
    ) -> Result<Fenced<i64>>
    where
        C: ConnectionLike + Send,
    {
        let mut invocation = FENCED.prepare_invoke();
        invocation.key(&self.resource[..]).key(&self.fence[..]);
        // The record is named only with an id: a write without one never touches it.
        if write_id.is_some() {
            invocation.key(&self.writes[..]);
        }
        invocation
            .arg(token.epoch)
            .arg(token.seq)
            .arg(write_id.map(|id| id.to_string()).unwrap_or_default())
            .arg(op);
        args(&mut invocation);
        let reply: Value = invocation
            .invoke_async(conn)
            .await
            .map_err(|e| redis_error(&self.key(), Phase::Writing, e))?;
        self.decode(token, &reply)
    }

    fn decode(&self, offered: FencingToken, reply: &Value) -> Result<Fenced<i64>> {
        let bad = || {
            Error::backend(
                &self.key(),
                Phase::Writing,
                format!("unexpected reply from the fenced-write script: {reply:?}"),
            )
        };
        let Value::Array(items) = reply else {
            return Err(bad());
        };
        let int = |v: &Value| match v {
            Value::Int(i) => Some(*i),
            _ => None,
        };
        let text = |v: &Value| match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        // 1 applied now, 2 applied before under this token (a repeated write id).
        match items.first().and_then(int) {
            Some(1 | 2) => {
                let result = items
                    .get(1)
                    .and_then(|v| int(v).or_else(|| text(v).and_then(|t| t.parse().ok())));
                Ok(Fenced::Applied(result.ok_or_else(bad)?))
            }
            Some(0) => {
                let epoch = items.get(1).and_then(text).and_then(|s| s.parse().ok());
                let seq = items.get(2).and_then(text).and_then(|s| s.parse().ok());
                match (epoch, seq) {
                    (Some(epoch), Some(seq)) => Ok(Fenced::Stale {
                        last: FencingToken::new(epoch, seq),
                        offered,
                    }),
                    _ => Err(bad()),
                }
            }
            Some(-1) => {
                let role = items.get(1).and_then(text).unwrap_or_default();
                Err(self.foreign(&role, "nothing was written"))
            }
            Some(-2) => {
                let detail = items.get(1).and_then(text).unwrap_or_default();
                Err(refused(&self.key(), &detail))
            }
            _ => Err(bad()),
        }
    }
}

/// What a fenced write refused for a value of another type gets: the role (the
/// resource, the fence, the write record) says which key holds it.
pub(crate) fn foreign(key: &LockKey, role: &str, detail: &str) -> Error {
    Error::ForeignValue {
        key: key.clone(),
        phase: Phase::Writing,
        detail: format!("{detail} (the {role} key holds a value of another type)"),
    }
}

/// What a fenced write that failed with nothing written gets: `detail` is the
/// server's error (its first word the code: `ERR`, `WRITEID`).
pub(crate) fn refused(key: &LockKey, detail: &str) -> Error {
    let code = detail.split(' ').next().unwrap_or("ERR").to_owned();
    Error::Refused {
        key: key.clone(),
        phase: Phase::Writing,
        code: code.clone(),
        source: Arc::new(redis::make_extension_error(
            code,
            Some(format!("{detail} (nothing was written)")),
        )),
    }
}

/// `ttl` in whole ms for `SET … PX`: [`Error::InvalidConfig`] under 1 ms.
pub(crate) fn ttl_millis(resource: &[u8], ttl: Duration) -> Result<u64> {
    let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return Err(Error::InvalidConfig {
            reason: format!(
                "fenced write to {}: a TTL of {ttl:?} is under 1 ms",
                String::from_utf8_lossy(resource)
            ),
        });
    }
    Ok(ms)
}

/// What a fenced `HSET` without fields gets.
pub(crate) fn no_fields(resource: &[u8]) -> Error {
    Error::InvalidConfig {
        reason: format!(
            "fenced HSET on {}: no fields given",
            String::from_utf8_lossy(resource)
        ),
    }
}

/// `"<epoch>:<seq>"`, as the script writes it.
fn parse_token(raw: &[u8]) -> Option<FencingToken> {
    let text = std::str::from_utf8(raw).ok()?;
    let (epoch, seq) = text.split_once(':')?;
    Some(FencingToken::new(epoch.parse().ok()?, seq.parse().ok()?))
}

/// The hash tag of a Redis key by Redis Cluster's rule: the bytes between the first
/// `{` and the first `}` after it, if there are any.
pub(crate) fn hash_tag(name: &[u8]) -> Option<&[u8]> {
    let open = name.iter().position(|&b| b == b'{')?;
    let len = name[open + 1..].iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &name[open + 1..open + 1 + len])
}

/// A Redis error met by a fenced write or an inspection of `key`, as lockflight
/// reports every Redis error (one classification for locks, fences and
/// inspection): an ACL refusal, a bare `NOPERM` or one raised inside a script on
/// either engine, is [`Error::NoPermission`]; `WRONGTYPE` [`Error::ForeignValue`];
/// another server error [`Error::Refused`] with its code; I/O, timeouts and
/// dropped connections (the request may or may not have run) [`Error::Backend`].
pub(crate) fn redis_error(key: &LockKey, phase: Phase, e: RedisError) -> Error {
    crate::backend::redis::map_err(key, phase, e)
}

#[cfg(test)]
mod tests {
    use super::{FencedKey, hash_tag, parse_token};
    use crate::guard::FencingToken;

    #[test]
    fn hash_tags_follow_redis_cluster() {
        assert_eq!(hash_tag(b"a{b}c"), Some(&b"b"[..]));
        assert_eq!(hash_tag(b"a{}c{d}"), None);
        assert_eq!(hash_tag(b"a{b"), None);
        assert_eq!(hash_tag(b"}a{b}"), Some(&b"b"[..]));
        assert_eq!(hash_tag(b"plain"), None);
    }

    #[test]
    fn fence_names_share_the_resource_slot() {
        for name in [&b"stock:1"[..], b"a{b", b"x{y}z", b"}{q}"] {
            let key = FencedKey::new(name).unwrap();
            let tag_of = |n: &[u8]| hash_tag(n).map(<[u8]>::to_vec).unwrap_or(n.to_vec());
            assert_eq!(tag_of(name), tag_of(key.fence_name()), "{name:?}");
        }
        for bad in [&b""[..], b"a}b", b"x{}y"] {
            let e = FencedKey::new(bad).unwrap_err();
            assert_eq!(e.code(), "invalid_key", "{bad:?}");
        }
    }

    #[test]
    fn tokens_parse_back() {
        assert_eq!(parse_token(b"17:3"), Some(FencingToken::new(17, 3)));
        assert_eq!(parse_token(b"17"), None);
        assert_eq!(parse_token(b"x:1"), None);
    }
}
