//! Semaphores in a backend: [`SemaphoreBackend`].

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::{Extend, LeaseToken};
use crate::error::Result;
use crate::key::LockKey;

/// A backend that stores semaphores, reached through
/// [`LockBackend::semaphore`](super::LockBackend::semaphore).
#[async_trait]
pub trait SemaphoreBackend: Send + Sync + fmt::Debug {
    /// Re-arm the TTL of the permit `token` of `key`.
    async fn extend_permit(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
    ) -> Result<Extend>;
}
