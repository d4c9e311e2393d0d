//! Read-write locks: [`Locker::read`](crate::Locker) and `write` (in progress).

/// The read-write locks of one locker, per key.
#[derive(Debug, Default)]
pub(crate) struct RwLocks {}
