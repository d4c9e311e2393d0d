//! Read-write locks in a backend: [`RwBackend`].

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::{Extend, LeaseToken};
use crate::error::Result;
use crate::key::LockKey;

/// A backend that stores read-write locks, reached through
/// [`LockBackend::rw`](super::LockBackend::rw).
#[async_trait]
pub trait RwBackend: Send + Sync + fmt::Debug {
    /// Re-arm the TTL of the read lease `token` of `key`.
    async fn extend_read(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Extend>;

    /// Re-arm the TTL of the write lease `token` of `key`.
    async fn extend_write(&self, key: &LockKey, token: LeaseToken, ttl: Duration)
    -> Result<Extend>;
}
