//! Semaphores: `N` permits per key across every instance (in progress).

/// The semaphores of one locker, per key.
#[derive(Debug, Default)]
pub(crate) struct Semaphores {}
