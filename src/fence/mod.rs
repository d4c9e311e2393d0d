//! Fenced writes: the resource side of fencing, shipped with the lock.
//!
//! A lock alone cannot keep a paused or partitioned holder out: when its lease ends
//! while it sleeps, the next holder starts, and the first one may still write when
//! it wakes up. The resource has to refuse writes that carry an older
//! [`FencingToken`] than one it has already accepted. This module does that check
//! for you, atomically with the write:
//!
//! * [`FencedKey`]: a Redis key written only under a token at least as new as the
//!   last one it accepted (`SET`, `SET … PX`, `INCRBY`, `HSET`, `DEL`, or only the
//!   fence), in one Lua script on any `redis` connection (one server, a Cluster, a
//!   `ConnectionManager`): the lock's Redis or the one that holds your data. A
//!   write that carries a [`WriteId`] (the `*_once` methods) is applied at most once,
//!   so it is safe to repeat after a lost reply.
//! * With the feature `sqlx-postgres` or `sqlx-sqlite` (`sqlx` enables both):
//!   `FenceColumns` and the guarded statements `FencedUpdate` and
//!   `FencedUpsert`, which turn an `UPDATE` or an `INSERT … ON CONFLICT` on a
//!   row with two fence columns into [`Fenced::Applied`] or [`Fenced::Stale`].
//!
//! Each takes the token as `impl Into<FencingToken>`: a [`FencingToken`], or a
//! reference to a [`LockGuard`], a
//! [`WriteGuard`] or a [`LockInfo`]. (A read lease's
//! token is the last write it observed, not a token of its own: a reader does not
//! write. A permit has no token: permits are not exclusive.)
//!
//! # The rule
//!
//! A write is **applied** when its token is *not older* than the last token the
//! resource accepted, and then the resource records it; otherwise it is
//! [`Fenced::Stale`] and nothing changes. Equal tokens are allowed on purpose:
//! a token belongs to exactly one critical section (tokens strictly increase per
//! key, handoffs included), so an equal token is the same holder writing again.
//! Once a newer holder has written, every older holder's write is refused, however
//! long it was paused. Fence one resource with the tokens of one lock key and one
//! lock kind (the mutex and the write lease of a key mint their own sequences).
//!
//! Because equal tokens are admitted, the token alone cannot tell a repeated
//! write from a second one: which writes are safe to repeat after an unknown
//! outcome is said per helper ([`FencedKey`]'s "Repeating a write", and for SQL
//! `FencedUpdate`'s).
//!
//! ```no_run
//! # async fn demo() -> lockflight::Result<()> {
//! use lockflight::fence::{Fenced, FencedKey};
//! use lockflight::{Locker, RedisBackend};
//!
//! let locker = Locker::builder(RedisBackend::connect("redis://127.0.0.1:6379").await?).build()?;
//! let mut data = redis::Client::open("redis://127.0.0.1:6379")
//!     .expect("a valid URL")
//!     .get_multiplexed_async_connection()
//!     .await
//!     .expect("Redis is up");
//!
//! let stock = FencedKey::new("stock:555")?;
//! let guard = locker.lock("sku:555").await?;
//! match stock.set(&mut data, &guard, 41).await? {
//!     Fenced::Applied(()) => {}
//!     Fenced::Stale { last, offered } => {
//!         // A newer holder (token `last`) has written: this holder lost its lease.
//!         eprintln!("refused: {offered} is older than {last}");
//!     }
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```

use crate::guard::{FencingToken, LockInfo};
use crate::locker::LockGuard;
use crate::rw::WriteGuard;

mod redis;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
mod sql;
mod write;

pub use self::redis::FencedKey;
#[cfg(feature = "inspect")]
pub(crate) use self::redis::redis_error;
#[cfg(feature = "testing")]
pub(crate) use self::redis::{foreign, no_fields, refused, ttl_millis};
pub use self::write::WriteId;
#[cfg(any(feature = "sqlx-postgres", feature = "sqlx-sqlite"))]
pub use sql::{FenceColumns, FenceConnection, FencedUpdate, FencedUpsert};

/// What a fenced write did: applied (with the write's result), or refused because
/// the resource had already accepted a newer token.
///
/// ```
/// use lockflight::FencingToken;
/// use lockflight::fence::Fenced;
///
/// let refused: Fenced = Fenced::Stale {
///     last: FencingToken::new(9, 0),
///     offered: FencingToken::new(8, 2),
/// };
/// assert!(!refused.is_applied());
/// assert_eq!(Fenced::Applied(5).applied(), Some(5));
/// ```
#[must_use = "a stale write changed nothing: check the outcome"]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fenced<T = ()> {
    /// The token was at least the last accepted one: the write happened and the
    /// resource now records this token. For a write with a [`WriteId`] that the
    /// resource had already applied under this token, it happened then, once, and
    /// `T` is what it returned then.
    Applied(T),
    /// The resource had accepted a newer token: nothing was written. The writer's
    /// critical section is over (its lease was lost), whatever it believes.
    /// (With `FenceColumns::one_write_per_token`, `last == offered` says instead
    /// that this token has already written the row, e.g. an earlier attempt of a
    /// repeated write.)
    Stale {
        /// The newest token the resource has accepted.
        last: FencingToken,
        /// The token this write carried: older than `last` (or equal, for SQL
        /// rows fenced with `FenceColumns::one_write_per_token`: then this token
        /// has already written the row).
        offered: FencingToken,
    },
}

impl<T> Fenced<T> {
    /// Whether the write was applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, Fenced::Applied(_))
    }

    /// The write's result, if it was applied.
    pub fn applied(self) -> Option<T> {
        match self {
            Fenced::Applied(value) => Some(value),
            Fenced::Stale { .. } => None,
        }
    }

    /// Maps the applied result, keeping a stale outcome as it is.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Fenced<U> {
        match self {
            Fenced::Applied(value) => Fenced::Applied(f(value)),
            Fenced::Stale { last, offered } => Fenced::Stale { last, offered },
        }
    }
}

impl From<&LockGuard> for FencingToken {
    /// The guard's [`fencing_token`](LockGuard::fencing_token).
    fn from(guard: &LockGuard) -> FencingToken {
        guard.fencing_token()
    }
}

impl From<&WriteGuard> for FencingToken {
    /// The write lease's [`fencing_token`](WriteGuard::fencing_token).
    fn from(guard: &WriteGuard) -> FencingToken {
        guard.fencing_token()
    }
}

impl From<&LockInfo> for FencingToken {
    /// The info's `fencing_token`.
    fn from(info: &LockInfo) -> FencingToken {
        info.fencing_token
    }
}

impl From<&FencingToken> for FencingToken {
    fn from(token: &FencingToken) -> FencingToken {
        *token
    }
}
