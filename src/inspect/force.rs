//! The operator's forced release: frees a key whatever holds it and advances
//! its fences (`lua/force_release.lua`).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use super::inspector::Inspector;
use super::reply::{int, text};
use crate::backend::redis::names::key_name;
use crate::error::{Error, Phase, Result};
use crate::fence::FencedKey;
use crate::key::LockKey;
use crate::lease::FencingToken;

static FORCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/force_release.lua")));

/// What [`Inspector::force_release`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForcedRelease {
    /// The mutex holder's token, if it was held.
    pub holder: Option<String>,
    /// The write lease's token, if one was out.
    pub writer: Option<String>,
    /// How many read leases were dropped.
    pub readers: usize,
    /// The mutex fence's new epoch: every later mutex token of the key is greater.
    /// `FencingToken::new(epoch, 0)` is newer than every earlier token.
    pub fence: FencingToken,
    /// The write fence's new epoch (the same, for write leases).
    pub write_fence: FencingToken,
    /// How many waiting instances were woken.
    pub woken: usize,
    /// How many of the semaphore's permits were dropped (a permit has no fencing
    /// token: its holder is kept out by its loss).
    pub permits: usize,
    /// How many loss messages were published: one per dropped lease (holder,
    /// write lease, read lease, permit) whose token names an instance, on that
    /// instance's channel. The instance marks that lease lost when the message
    /// arrives; a refused `PUBLISH` is not counted.
    pub told: usize,
    /// How many subscribers received the loss messages, as `PUBLISH` counts them
    /// on the server that ran the release (on a Cluster, only the subscribers
    /// connected to that node; an instance also subscribed there counts). Zero
    /// with `told` above zero: no holder's instance was listening there; its
    /// holders learn of the loss at their next renewal.
    pub receivers: usize,
}

impl Inspector {
    /// Frees `key` whatever holds it (the mutex holder, the write lease, every read
    /// lease, every permit of its semaphore), advances both of its fences to
    /// `max(last + 1, server time in µs)`, tells each freed lease's instance that the
    /// lease is lost, then wakes the key's waiting instances of every kind. With
    /// `fence_resources`, also records the new token in each [`FencedKey`]'s fence on the
    /// same connection, so an old holder's late writes to them are refused from then on.
    ///
    /// Tokens of the key stay strictly increasing. A freed lease is marked lost when the
    /// message reaches its instance (or, unsubscribed, at its next renewal): no new local
    /// section starts on it, its releases report [`Error::LeaseLost`]. Until then the old
    /// holder overlaps the next, refused only by resources that have seen a newer token
    /// (a permit has none: only `fence_resources` fences it). On a Redis Cluster, pass a
    /// cluster connection (ARCHITECTURE.md, "Fenced writes and the forced release").
    ///
    /// # Errors
    ///
    /// As [`Inspector::key`]; a fenced resource that refuses the token (it had a
    /// newer one) is not an error.
    ///
    /// # Cancel safety
    ///
    /// The release is one script: dropping the future leaves it done or not done;
    /// the resources' fences are advanced one by one after it.
    pub async fn force_release<C>(
        &self,
        conn: &mut C,
        key: impl Into<LockKey>,
        fence_resources: &[FencedKey],
    ) -> Result<ForcedRelease>
    where
        C: ConnectionLike + Send,
    {
        let key = key.into();
        key.validate()?;
        let mut invocation = FORCE.prepare_invoke();
        for suffix in [
            "", ":fence", ":claim", ":wr", ":wf", ":rd", ":wq", ":rwq", ":sem", ":semn", ":semq",
        ] {
            invocation.key(key_name(&self.prefix, &key, suffix));
        }
        // The wake-up messages of the mutex, the read-write lock and the semaphore
        // (`backend/redis/notify.rs`: a tag byte, then the key); the script builds
        // the loss messages from the mutex's.
        let message = |tag: u8| [&[tag][..], key.as_bytes()].concat();
        invocation
            .arg(format!("{}:inst:", self.prefix))
            .arg(message(0xFD))
            .arg(message(0xFE))
            .arg(60_000)
            .arg(message(0xFF));
        let reply: Vec<Value> = invocation
            .invoke_async(conn)
            .await
            .map_err(|e| crate::fence::redis_error(&key, Phase::Inspecting, e))?;
        let bad = || {
            Error::backend(
                &key,
                Phase::Inspecting,
                format!("unexpected reply from the force-release script: {reply:?}"),
            )
        };
        let epoch = |v: Option<&Value>| {
            text(v?)?
                .parse::<u64>()
                .ok()
                .map(|epoch| FencingToken::new(epoch, 0))
        };
        let released = ForcedRelease {
            holder: reply.first().and_then(text),
            writer: reply.get(1).and_then(text),
            readers: reply.get(2).and_then(int).ok_or_else(bad)? as usize,
            fence: epoch(reply.get(3)).ok_or_else(bad)?,
            write_fence: epoch(reply.get(4)).ok_or_else(bad)?,
            woken: reply.get(5).and_then(int).ok_or_else(bad)? as usize,
            permits: reply.get(6).and_then(int).ok_or_else(bad)? as usize,
            told: reply.get(7).and_then(int).ok_or_else(bad)? as usize,
            receivers: reply.get(8).and_then(int).ok_or_else(bad)? as usize,
        };
        let newest = released.fence.max(released.write_fence);
        for resource in fence_resources {
            // Refused only if the resource already has a newer token: fine.
            let _ = resource.advance(conn, newest).await?;
        }
        Ok(released)
    }
}
