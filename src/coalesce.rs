//! `Locker::coalesce`: singleflight under the distributed lock (placeholder).

/// The in-flight shared computations of one locker.
#[derive(Debug, Default)]
pub(crate) struct Flights {}
