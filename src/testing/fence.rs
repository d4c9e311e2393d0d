//! [`SimFencedKey`]: a fenced resource kept by the simulated server, with the rule,
//! the results and the errors of [`FencedKey`] (`fence/lua/fenced.lua`, which the
//! server's resources follow step by step: `resources.rs`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::ToRedisArgs;

use super::fault::Op;
use super::resources::{Answer, Field, Value, Write};
use super::shared::Shared;
use crate::error::{Error, Result};
use crate::fence::{Fenced, FencedKey, WriteId, foreign, no_fields, refused, ttl_millis};
use crate::key::LockKey;
use crate::lease::FencingToken;

/// A resource guarded by fencing tokens, kept in memory by a
/// [`SimServer`](super::SimServer): the test kit's
/// [`FencedKey`](crate::fence::FencedKey), without Redis.
///
/// It applies a write only if its token is not older than the last token the
/// resource accepted, as `FencedKey` does, with the same operations, the same
/// [`Fenced`] outcomes (`Stale { last, offered }` for an older token; an equal
/// token is the same critical section writing again), the same at-most-once
/// writes with a [`WriteId`] (the `*_once` methods; at least the 64 newest ids of
/// a token are kept, an older one is refused with [`Error::Refused`], code
/// `WRITEID`) and the same errors, texts included. So a test of "my late write
/// is refused" needs no Redis and no fence of its own. lockflight's tests run
/// the same fenced-write cases on both.
///
/// A key from [`SimServer::fenced_key`](super::SimServer::fenced_key) lives on
/// that server, as a `FencedKey` on the lock's Redis does: every call is a
/// request ([`Op::Fenced`], counted in
/// [`Requests::fenced`](super::Requests::fenced)) that the server's faults and
/// outages hit (a lost reply: applied, and the caller gets [`Error::Backend`]),
/// and [`restart`](super::SimServer::restart) loses its value, fence and write
/// record, as a Redis without persistence does. Keys of one name on one server
/// are one resource. [`SimFencedKey::new`] makes a resource on a server of its
/// own, with no faults.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockflight::Result<()> {
/// use lockflight::FencingToken;
/// use lockflight::fence::Fenced;
/// use lockflight::testing::SimFencedKey;
///
/// let stock = SimFencedKey::new("stock:555")?;
/// let (old, new) = (FencingToken::new(7, 0), FencingToken::new(8, 0));
/// assert_eq!(stock.set(new, 41).await?, Fenced::Applied(()));
/// assert_eq!(stock.set(old, 40).await?, Fenced::Stale { last: new, offered: old });
/// assert_eq!(stock.get().as_deref(), Some(&b"41"[..]));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SimFencedKey {
    /// The name and its checks, exactly `FencedKey`'s.
    name: FencedKey,
    shared: Arc<Shared>,
}

impl fmt::Debug for SimFencedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFencedKey")
            .field("name", &String::from_utf8_lossy(self.name.name()))
            .finish_non_exhaustive()
    }
}

impl SimFencedKey {
    /// The resource `resource` on a server of its own (no faults, no restarts):
    /// clones share it, another `new` of the same name is another resource.
    ///
    /// # Errors
    ///
    /// As [`FencedKey::new`]: [`Error::InvalidKey`] when the name is empty, longer
    /// than [`LockKey::MAX_LEN`], or has no hash tag but contains `}`.
    pub fn new(resource: impl Into<Vec<u8>>) -> Result<SimFencedKey> {
        // A server of its own is a fresh `Shared` (what `SimServer::new` holds).
        SimFencedKey::on(Arc::default(), resource.into())
    }

    pub(super) fn on(shared: Arc<Shared>, resource: Vec<u8>) -> Result<SimFencedKey> {
        Ok(SimFencedKey {
            name: FencedKey::new(resource)?,
            shared,
        })
    }

    /// The resource's name.
    pub fn name(&self) -> &[u8] {
        self.name.name()
    }

    /// The resource's string value, as `GET` reads it: `None` when there is none
    /// (never written, deleted, expired) or the resource is a hash. A look from
    /// the test, not a request: no fault hits it and it is not counted.
    pub fn get(&self) -> Option<Vec<u8>> {
        self.shared
            .resources
            .read(self.name(), |stored| match &stored.value {
                Value::Str(value) => Some(value.clone()),
                Value::Hash(_) => None,
            })
    }

    /// The value of `field` of the resource's hash, as `HGET` reads it: `None`
    /// when the hash has no such field or the resource is not a hash. A look from
    /// the test, as [`get`](Self::get).
    pub fn hget(&self, field: impl AsRef<[u8]>) -> Option<Vec<u8>> {
        self.shared
            .resources
            .read(self.name(), |stored| match &stored.value {
                Value::Hash(fields) => fields.get(field.as_ref()).cloned(),
                Value::Str(_) => None,
            })
    }

    /// Sets the resource to `value` under `token`, as [`FencedKey::set`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `value` is not one Redis argument; otherwise
    /// as [`SimFencedKey::incr_by`].
    ///
    /// # Cancel safety
    ///
    /// The write is applied at once and whole when the request reaches the
    /// server: a future dropped before then (while the server hangs,
    /// [`SimServer::hang_for`](super::SimServer::hang_for)) changed nothing, one
    /// dropped later applied it. As with `FencedKey`, the caller cannot tell
    /// which.
    pub async fn set(
        &self,
        token: impl Into<FencingToken>,
        value: impl ToRedisArgs,
    ) -> Result<Fenced> {
        let value = self.one_arg("a value", &value)?;
        self.run(
            token.into(),
            None,
            Write::Set {
                value,
                ttl_ms: None,
            },
        )
        .await
        .map(|f| f.map(drop))
    }

    /// [`set`](Self::set) with the write id `id`: safe to repeat with the same id.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `value` is not one Redis argument; otherwise
    /// as [`SimFencedKey::incr_by_once`].
    ///
    /// # Cancel safety
    ///
    /// As [`SimFencedKey::set`].
    pub async fn set_once(
        &self,
        token: impl Into<FencingToken>,
        value: impl ToRedisArgs,
        id: WriteId,
    ) -> Result<Fenced> {
        let value = self.one_arg("a value", &value)?;
        self.run(
            token.into(),
            Some(id),
            Write::Set {
                value,
                ttl_ms: None,
            },
        )
        .await
        .map(|f| f.map(drop))
    }

    /// Sets the resource to `value` for `ttl` of Tokio's clock under `token`, as
    /// [`FencedKey::set_with_ttl`] (the fence itself never expires).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a TTL under 1 ms, or when `value` is not one
    /// Redis argument; otherwise as [`SimFencedKey::incr_by`].
    ///
    /// # Cancel safety
    ///
    /// As [`SimFencedKey::set`].
    pub async fn set_with_ttl(
        &self,
        token: impl Into<FencingToken>,
        value: impl ToRedisArgs,
        ttl: Duration,
    ) -> Result<Fenced> {
        let ttl_ms = Some(ttl_millis(self.name(), ttl)?);
        let value = self.one_arg("a value", &value)?;
        self.run(token.into(), None, Write::Set { value, ttl_ms })
            .await
            .map(|f| f.map(drop))
    }

    /// [`set_with_ttl`](Self::set_with_ttl) with the write id `id`: safe to repeat
    /// with the same id (a repeat of an applied write does not reset the TTL).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a TTL under 1 ms, or when `value` is not one
    /// Redis argument; otherwise as [`SimFencedKey::incr_by_once`].
    ///
    /// # Cancel safety
    ///
    /// As [`SimFencedKey::set`].
    pub async fn set_with_ttl_once(
        &self,
        token: impl Into<FencingToken>,
        value: impl ToRedisArgs,
        ttl: Duration,
        id: WriteId,
    ) -> Result<Fenced> {
        let ttl_ms = Some(ttl_millis(self.name(), ttl)?);
        let value = self.one_arg("a value", &value)?;
        self.run(token.into(), Some(id), Write::Set { value, ttl_ms })
            .await
            .map(|f| f.map(drop))
    }

    /// Adds `delta` to the resource's integer under `token` (a resource without a
    /// value counts as 0), as [`FencedKey::incr_by`]; applied, it carries the new
    /// value. Not safe to repeat: use [`incr_by_once`](Self::incr_by_once) for
    /// that.
    ///
    /// # Errors
    ///
    /// All with nothing written: [`Error::ForeignValue`] when the resource is a
    /// hash; [`Error::Refused`] with code `ERR` when its value is not an integer
    /// in Redis' form, or the sum would overflow an `i64`, with Redis' texts;
    /// [`Error::Backend`] (transient) when a fault or an outage of the server hit
    /// the request, in which case the write may or may not have happened (a lost
    /// reply: it did).
    ///
    /// # Cancel safety
    ///
    /// As [`SimFencedKey::set`].
    pub async fn incr_by(&self, token: impl Into<FencingToken>, delta: i64) -> Result<Fenced<i64>> {
        self.run(token.into(), None, Write::IncrBy(delta)).await
    }

    /// [`incr_by`](Self::incr_by) with the write id `id`, safe to repeat with the
    /// same id: the resource adds `delta` at most once under `token`, and a repeat
    /// of an applied write carries the value that write made.
    ///
    /// # Errors
    ///
    /// As [`SimFencedKey::incr_by`]; with a write id also [`Error::Refused`] with
    /// code `WRITEID` when the id is older than every id the write record still
    /// keeps for `token` and not among them (whether it was applied cannot be
    /// told; nothing is written now).
    ///
    /// # Cancel safety
    ///
    /// As [`SimFencedKey::set`].
    pub async fn incr_by_once(
        &self,
        token: impl Into<FencingToken>,
        delta: i64,
        id: WriteId,
    ) -> Result<Fenced<i64>> {
        self.run(token.into(), Some(id), Write::IncrBy(delta)).await
    }

    /// Sets `fields` of the resource's hash under `token`, as [`FencedKey::hset`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `fields` is empty, or a field or a value is
    /// not one Redis argument; [`Error::ForeignValue`] when the resource holds a
    /// string; otherwise as [`SimFencedKey::incr_by`].
    ///
    /// # Cancel safety
    ///
    /// As [`SimFencedKey::set`].
    pub async fn hset<F, V>(
        &self,
        token: impl Into<FencingToken>,
        fields: impl IntoIterator<Item = (F, V)>,
    ) -> Result<Fenced>
    where
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        let fields = self.fields(fields)?;
        self.run(token.into(), None, Write::HSet(fields))
            .await
            .map(|f| f.map(drop))
    }

    /// [`hset`](Self::hset) with the write id `id`: safe to repeat with the same id.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when `fields` is empty, or a field or a value is
    /// not one Redis argument; otherwise as [`SimFencedKey::incr_by_once`].
    ///
    /// # Cancel safety
    ///
    /// As [`SimFencedKey::set`].
    pub async fn hset_once<F, V>(
        &self,
        token: impl Into<FencingToken>,
        fields: impl IntoIterator<Item = (F, V)>,
        id: WriteId,
    ) -> Result<Fenced>
    where
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        let fields = self.fields(fields)?;
        self.run(token.into(), Some(id), Write::HSet(fields))
            .await
            .map(|f| f.map(drop))
    }

    /// Deletes the resource's value under `token`, as [`FencedKey::delete`]; the
    /// fence stays, so an older holder cannot recreate it.
    ///
    /// # Errors
    ///
    /// As [`SimFencedKey::incr_by`], without the refusals.
    ///
    /// # Cancel safety
    ///
    /// As [`SimFencedKey::set`].
    pub async fn delete(&self, token: impl Into<FencingToken>) -> Result<Fenced> {
        self.run(token.into(), None, Write::Delete)
            .await
            .map(|f| f.map(drop))
    }

    /// [`delete`](Self::delete) with the write id `id`: safe to repeat with the
    /// same id.
    ///
    /// # Errors
    ///
    /// As [`SimFencedKey::incr_by_once`].
    ///
    /// # Cancel safety
    ///
    /// As [`SimFencedKey::set`].
    pub async fn delete_once(&self, token: impl Into<FencingToken>, id: WriteId) -> Result<Fenced> {
        self.run(token.into(), Some(id), Write::Delete)
            .await
            .map(|f| f.map(drop))
    }

    /// Records `token` in the fence without touching the value, as
    /// [`FencedKey::advance`]: every holder with an older token is refused from
    /// now on. Safe to repeat.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] as for [`SimFencedKey::incr_by`].
    ///
    /// # Cancel safety
    ///
    /// As [`SimFencedKey::set`].
    pub async fn advance(&self, token: impl Into<FencingToken>) -> Result<Fenced> {
        self.run(token.into(), None, Write::Advance)
            .await
            .map(|f| f.map(drop))
    }

    /// The last token the resource accepted, if any, as
    /// [`FencedKey::last_token`]; a request to the server.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] when a fault or an outage of the server hit the request.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn last_token(&self) -> Result<Option<FencingToken>> {
        let resources = &self.shared.resources;
        let read = async { Ok(resources.fence(self.name())) };
        self.shared.serve(Op::Fenced, &self.key(), read).await
    }

    /// Deletes the fence and the write record (not the value), as
    /// [`FencedKey::forget`]: afterwards any token is accepted, and no write id is
    /// remembered.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] when a fault or an outage of the server hit the request
    /// (a lost reply: both are deleted).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves both deleted or neither.
    pub async fn forget(&self) -> Result<()> {
        let resources = &self.shared.resources;
        let forget = async {
            resources.forget(self.name());
            Ok(())
        };
        self.shared.serve(Op::Fenced, &self.key(), forget).await
    }

    fn key(&self) -> LockKey {
        LockKey::from(self.name().to_vec())
    }

    /// Sends the write to the server and reads its answer as `FencedKey` reads
    /// the script's.
    async fn run(
        &self,
        offered: FencingToken,
        id: Option<WriteId>,
        write: Write,
    ) -> Result<Fenced<i64>> {
        let key = self.key();
        let resources = &self.shared.resources;
        let apply = async { Ok(resources.write(self.name(), offered, id, &write)) };
        match self.shared.serve(Op::Fenced, &key, apply).await? {
            Answer::Applied(result) => Ok(Fenced::Applied(result)),
            Answer::Stale(last) => Ok(Fenced::Stale { last, offered }),
            Answer::Foreign(role) => Err(foreign(&key, role, "nothing was written")),
            Answer::Refused(detail) => Err(refused(&key, &detail)),
        }
    }

    /// `value` as the one argument a Redis command would get.
    fn one_arg(&self, what: &str, value: &impl ToRedisArgs) -> Result<Vec<u8>> {
        let mut args = value.to_redis_args();
        match (args.pop(), args.is_empty()) {
            (Some(arg), true) => Ok(arg),
            (popped, _) => Err(Error::InvalidConfig {
                reason: format!(
                    "fenced write to {}: {what} must be one Redis argument, not {}",
                    String::from_utf8_lossy(self.name()),
                    args.len() + usize::from(popped.is_some())
                ),
            }),
        }
    }

    fn fields<F, V>(&self, fields: impl IntoIterator<Item = (F, V)>) -> Result<Vec<Field>>
    where
        F: ToRedisArgs,
        V: ToRedisArgs,
    {
        let mut pairs = Vec::new();
        for (field, value) in fields {
            pairs.push((
                self.one_arg("a field", &field)?,
                self.one_arg("a value", &value)?,
            ));
        }
        if pairs.is_empty() {
            return Err(no_fields(self.name()));
        }
        Ok(pairs)
    }
}
