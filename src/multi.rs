//! [`Locker::lock_many`]: several keys, all or nothing, without deadlocks.
//!
//! The keys are sorted (by their bytes) and deduplicated, then locked one after
//! the other in that canonical order, each through the ordinary single-key path
//! (coalescing, handoff, notify-one wake-ups). Two callers whose sets overlap lock
//! their common keys in the same order, so neither can hold one key while waiting
//! for another that the other holds. Each key is an independent lock, so the keys
//! may live anywhere the backend puts them (on different shards of a cluster).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::lease::{FencingToken, Loss};
use crate::locker::{LockGuard, Locker};

/// Several held locks, taken together by [`Locker::lock_many`].
///
/// Every key has its own lease and fencing token; the guard counts as lost as
/// soon as any of them is lost. Dropping it releases every key (in the
/// background); [`release`](Self::release) reports the outcome.
#[must_use = "the locks are released when the guard is dropped"]
pub struct MultiGuard {
    /// In canonical (sorted) key order.
    guards: Vec<LockGuard>,
}

impl fmt::Debug for MultiGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(&self.guards).finish()
    }
}

impl MultiGuard {
    /// The held keys, in canonical order.
    pub fn keys(&self) -> impl Iterator<Item = &LockKey> {
        self.guards.iter().map(LockGuard::key)
    }

    /// The fencing token of each key, in canonical order. Fence every write to a
    /// key's resource with that key's token.
    pub fn fencing_tokens(&self) -> Vec<(LockKey, FencingToken)> {
        self.guards
            .iter()
            .map(|g| (g.key().clone(), g.fencing_token()))
            .collect()
    }

    /// The fencing token of `key`, if this guard holds it.
    pub fn fencing_token(&self, key: &LockKey) -> Option<FencingToken> {
        self.guards
            .iter()
            .find(|g| g.key() == key)
            .map(LockGuard::fencing_token)
    }

    /// Whether any of the leases is lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// How long all the leases are known to stay valid (the shortest).
    pub fn valid_for(&self) -> Duration {
        self.guards
            .iter()
            .map(LockGuard::valid_for)
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// Resolves when any of the leases is lost (see [`LockGuard::lost`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; it only observes.
    pub fn lost(&self) -> Loss {
        Loss::any(self.guards.iter().map(LockGuard::lost).collect())
    }

    /// Releases every key, in reverse order.
    ///
    /// # Errors
    ///
    /// The first error among the releases ([`Error::LeaseLost`] if a lock was no
    /// longer held); every key is released regardless.
    ///
    /// # Cancel safety
    ///
    /// If this future is dropped, the releases not yet done run in the
    /// background (as when a [`LockGuard`] is dropped).
    pub async fn release(mut self) -> Result<()> {
        let mut first = Ok(());
        while let Some(guard) = self.guards.pop() {
            if let Err(e) = guard.release().await
                && first.is_ok()
            {
                first = Err(e);
            }
        }
        first
    }
}

impl Locker {
    /// Takes the locks of every key in `keys`, all or nothing, within the
    /// locker's wait timeout for the whole set.
    ///
    /// The keys are deduplicated and locked in one canonical order (sorted by
    /// their bytes), so callers with overlapping sets never deadlock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockflight::Result<()> {
    /// use lockflight::{LockKey, Locker, MemoryBackend};
    ///
    /// let locker = Locker::builder(MemoryBackend::new()).build()?;
    /// // A checkout that reserves several SKUs at once.
    /// let cart = locker.lock_many(["sku:9", "sku:2", "sku:9"]).await?;
    /// let keys: Vec<&LockKey> = cart.keys().collect();
    /// assert_eq!(keys, [&LockKey::from("sku:2"), &LockKey::from("sku:9")]);
    /// let token = cart.fencing_token(&LockKey::from("sku:2")).unwrap();
    /// # let _ = token;
    /// cart.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for an empty set or an invalid key (before anything
    /// is locked); otherwise as [`lock`](Self::lock) for the first key that
    /// fails — every key already taken is then released.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the keys already taken are released in the background, and
    /// the key being acquired is handled as a cancelled [`lock`](Self::lock).
    pub async fn lock_many<K, I>(&self, keys: I) -> Result<MultiGuard>
    where
        I: IntoIterator<Item = K>,
        K: Into<LockKey>,
    {
        let mut keys: Vec<LockKey> = keys.into_iter().map(Into::into).collect();
        if keys.is_empty() {
            return Err(Error::InvalidKey {
                key: LockKey::from(""),
                reason: "lock_many needs at least one key".into(),
            });
        }
        for key in &keys {
            key.validate()?;
        }
        keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        keys.dedup();
        let start = Instant::now();
        let wait = self.wait_timeout();
        let mut guards = Vec::with_capacity(keys.len());
        for key in keys {
            let left = wait.saturating_sub(start.elapsed());
            match self
                .lock_within(key, left.max(Duration::from_millis(1)))
                .await
            {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    // All or nothing: give back what was taken.
                    drop(MultiGuard { guards });
                    return Err(e);
                }
            }
        }
        Ok(MultiGuard { guards })
    }
}
