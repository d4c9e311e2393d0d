//! Semaphores in a backend: [`SemaphoreBackend`].
//!
//! A semaphore key has `N` permits, fixed at first use (while any permit or waiting
//! instance of the key lives). Each permit is a lease: a random token that expires at
//! its TTL unless renewed, so the permit of a holder that died comes back by itself.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::{LeaseToken, Renewal, WhenBusy};
use crate::error::Result;
use crate::key::LockKey;

/// The answer to [`SemaphoreBackend::acquire_permits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Permits {
    /// How many permits were granted: the **first** `granted` tokens of the request
    /// are now permits (a token that already was one is re-armed and counts).
    pub granted: usize,
    /// When fewer were granted than asked for: ask again after this long at the
    /// latest, even without a wake-up (the earliest expiry of a held permit, bounded
    /// by the refresh interval of this instance's waiting entry).
    pub retry_in: Duration,
    /// How many **other** instances were in the key's waiting set when the request
    /// was answered (0 when the backend does not track them). While others wait, a
    /// granted permit passes between local tasks on the halved handoff budget
    /// ([`Handoff`](crate::Handoff)), and in fair mode not at all.
    pub waiting: u32,
}

/// A backend that stores semaphores, reached through
/// [`LockBackend::semaphore`](super::LockBackend::semaphore).
///
/// Semantics the [`Semaphore`](crate::semaphore::Semaphore) relies on:
///
/// 1. At most `N` live permits per key; a permit ends at its TTL unless renewed,
///    and expired permits are never counted.
/// 2. `N` is fixed per key while any permit or waiting instance of the key lives; a
///    request with another `N` is answered [`Error::PermitMismatch`](crate::Error::PermitMismatch),
///    with nothing changed.
/// 3. Acquiring with tokens that are already permits re-arms them (a retry after a
///    lost reply is safe).
/// 4. A waiting instance (one that asked with [`WhenBusy::Queue`] and was not
///    given all it asked for) is registered in the key's waiting set (entries
///    expire); a release or a leave that leaves `k` permits free wakes up to `k`
///    waiting instances, oldest first, through their
///    [`signals`](super::LockBackend::signals), as
///    [`LockKind::Semaphore`](super::LockKind::Semaphore).
///
/// # Cancel safety
///
/// Dropping any of the futures may leave the operation done or not done: the caller
/// releases the tokens it asked for (releasing a token that is no permit is
/// harmless).
#[async_trait]
pub trait SemaphoreBackend: Send + Sync + fmt::Debug {
    /// Asks for up to `tokens.len()` permits of `key`, which has `permits` permits,
    /// each with a TTL of `ttl`: grants as many as are free, one token each, in the
    /// order of `tokens`. With [`WhenBusy::Queue`], an instance given fewer than it
    /// asked for joins (or stays in) the key's waiting set; one given everything
    /// leaves it.
    async fn acquire_permits(
        &self,
        key: &LockKey,
        permits: u32,
        tokens: &[LeaseToken],
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Permits>;

    /// Returns the permit `token` of `key` and wakes as many waiting instances as
    /// permits are free. `Ok(false)` if `token` held no live permit (it expired or
    /// was removed): nothing was returned by this call.
    async fn release_permit(&self, key: &LockKey, token: LeaseToken) -> Result<bool>;

    /// This instance no longer waits for permits of `key`: it leaves the waiting
    /// set, and passes on wake-ups (free permits) to the other waiting instances.
    async fn leave_permits(&self, key: &LockKey) -> Result<()>;

    /// Re-arm the TTL of the permit `token` of `key`.
    async fn renew_permit(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Renewal>;
}
