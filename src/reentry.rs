//! Which locks the running future holds, so that asking again for one of them
//! fails at once ([`Error::Reentrant`](crate::Error::Reentrant)) instead of
//! waiting behind itself until the wait timeout.
//!
//! # Why scoped, not thread- or task-bound
//!
//! Redisson's reentrant lock belongs to a *thread*. A Tokio task moves between
//! worker threads at every `.await`, and one task may run several independent
//! futures at once (`join!`, `select!`), so neither the thread nor the task says
//! who holds a lock. What does: the future that runs *under* it. The closure of
//! [`Locker::with_lock`](crate::Locker::with_lock) and the inner service behind
//! [`LockLayer`](crate::layer::LockLayer) are polled inside a task-local scope
//! that names the held keys; a `lock`, `try_lock`, `with_lock` or `singleflight` of
//! one of those keys (on the same [`Locker`](crate::Locker)) from inside that
//! future is answered with the typed error, while a sibling future of the same
//! task, outside the scope, waits for the lock as usual.
//!
//! A bare [`LockGuard`](crate::LockGuard) held across code that locks the same
//! key again has no scope and is not detected: prefer `with_lock` where the
//! guarded code may lock again.

use std::future::Future;
use std::sync::Arc;

use tokio::task::futures::TaskLocalFuture;

use crate::key::LockKey;

/// The keys held by the current future, each with the id of its locker.
#[derive(Clone, Debug, Default)]
pub(crate) struct HeldKeys(Arc<[(usize, LockKey)]>);

tokio::task_local! {
    static HELD: HeldKeys;
}

/// Whether the running future holds `key` of the locker `locker`.
pub(crate) fn holds(locker: usize, key: &LockKey) -> bool {
    HELD.try_with(|held| held.0.iter().any(|(l, k)| *l == locker && k == key))
        .unwrap_or(false)
}

/// Runs `fut` as if the running future did not hold `key` of `locker`: the lock
/// layer scopes an in-handler route as a holder of its key from the start, and
/// the handler's extractor then takes that very lock.
pub(crate) fn without<F: Future>(
    locker: usize,
    key: &LockKey,
    fut: F,
) -> TaskLocalFuture<HeldKeys, F> {
    let keys: Vec<_> = HELD
        .try_with(|held| {
            held.0
                .iter()
                .filter(|(l, k)| !(*l == locker && k == key))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    HELD.scope(HeldKeys(keys.into()), fut)
}

/// Runs `fut` as a holder of `key` of `locker` (and of whatever the running
/// future already holds).
pub(crate) fn scope<F: Future>(
    locker: usize,
    key: LockKey,
    fut: F,
) -> TaskLocalFuture<HeldKeys, F> {
    let mut keys = HELD.try_with(|held| held.0.to_vec()).unwrap_or_default();
    keys.push((locker, key));
    HELD.scope(HeldKeys(keys.into()), fut)
}
