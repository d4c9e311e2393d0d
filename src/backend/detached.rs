//! Lease work run on a thread of its own, away from the runtime that made the
//! backend's connections.
//!
//! The last `Locker` dropped on a current-thread runtime, or outside any runtime,
//! must still release the leases it keeps cached: a `#[tokio::main(flavor =
//! "current_thread")]` program drops it as `main`'s future ends, and the runtime
//! then drops every task unrun, so a release spawned there never happens (the key
//! stays held for its lease TTL). Blocking that thread until a spawned task has run
//! is no way out either: it is the one thread that would run it. So the releases
//! run here, on a new thread with a current-thread runtime of its own, while the
//! dropping thread waits for them, at most a bound.
//!
//! **Invariants.**
//!
//! 1. While [`is_detached`] is true on a thread, a backend makes its requests
//!    there on connections driven by that thread's runtime, because its usual
//!    connection's task runs on the runtime that made it, which may be blocked in
//!    the drop or gone: on one server and behind Sentinel (to the primary it
//!    names) a connection per request, on a Cluster one cluster connection per
//!    detached thread.
//! 2. The caller never waits longer than the bound, whatever the backend does;
//!    the work still running then is dropped with the process, and what it had not
//!    released expires at its TTL, as after a crash.

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

thread_local! {
    static DETACHED: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread runs detached lease work (see the module docs).
pub(crate) fn is_detached() -> bool {
    DETACHED.with(Cell::get)
}

/// Runs `work` on a new thread with a current-thread runtime of its own, marked
/// detached, and waits for it at most `bound` (the work is bounded by it too).
/// Returns whether it finished in time.
pub(crate) fn run<F>(work: F, bound: Duration) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let spawned = std::thread::Builder::new()
        .name("lockflight-exit".to_owned())
        .spawn(move || {
            DETACHED.with(|d| d.set(true));
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            // The timer is made inside the runtime, which it needs.
            let ended = runtime.block_on(async move { tokio::time::timeout(bound, work).await });
            if ended.is_ok() {
                let _ = done.send(());
            }
        });
    spawned.is_ok() && finished.recv_timeout(bound).is_ok()
}
