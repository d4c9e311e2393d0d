//! The one way lockflight starts a task: on the runtime of the caller, if there is
//! one.
//!
//! Guards may be dropped, and lockers built, outside any Tokio runtime; the work a
//! task would do then is dropped unrun, and whatever it owns settles in its
//! `Drop` (see [`Engine::spawn_background`](crate::lease::engine::Engine::spawn_background)
//! for the lease work, counted so that `shutdown` waits for it).

use std::future::Future;

use tokio::task::JoinHandle;

/// Spawns `work` on the current Tokio runtime; without one, drops it unrun and
/// returns `None`.
pub(crate) fn spawn<F>(work: F) -> Option<JoinHandle<F::Output>>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => Some(runtime.spawn(work)),
        Err(_) => {
            drop(work);
            None
        }
    }
}

/// Whether a task started here would run: the caller is on a Tokio runtime.
pub(crate) fn available() -> bool {
    tokio::runtime::Handle::try_current().is_ok()
}
