//! RedisBackend's semaphores: [`SemaphoreBackend`](crate::backend::semaphore::SemaphoreBackend).

use std::time::Duration;

use async_trait::async_trait;

use super::RedisBackend;
use crate::backend::semaphore::SemaphoreBackend;
use crate::backend::{Extend, LeaseToken};
use crate::error::{Error, Result};
use crate::key::LockKey;

#[async_trait]
impl SemaphoreBackend for RedisBackend {
    async fn extend_permit(
        &self,
        key: &LockKey,
        _token: LeaseToken,
        _ttl: Duration,
    ) -> Result<Extend> {
        Err(Error::Unsupported {
            key: key.clone(),
            what: "semaphores",
        })
    }
}
