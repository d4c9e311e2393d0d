//! The conformance matrix: each property of the lease protocol is written **once**,
//! as a cell taking the lock [`Kind`], and instantiated for every kind (mutex, read
//! lease, write lease, permit) by [`for_every_kind!`], against real `redis-server`
//! processes. A kind that a backend does not offer is a typed
//! [`Error::Unsupported`](lockflight::Error::Unsupported), never a silent
//! difference.
//!
//! | cell | property |
//! |---|---|
//! | [`truthful_release_after_a_lost_reply`] | a release repeated after its reply was lost reports the release, even after another instance took and released the key meanwhile (one release record per lease, not per key) |
//! | [`release_after_a_restart_reports_the_loss`] | after an empty restart, another instance takes the same lock; the first holder's release says `LeaseLost`, never `Ok` |
//! | [`release_under_memory_pressure_frees_the_lock`] | with `maxmemory` reached and `noeviction`, a release still deletes the lease (no auxiliary write before the delete) |
//!
//! Cells that restart the server or change its configuration start their own
//! server; the others share one per test binary under their own prefix.

#[path = "../support/mod.rs"]
mod support;

mod kinds;
mod release;

pub(crate) use kinds::{Held, Kind};

/// Instantiates `cell` (an `async fn(Kind)` of the current module) once per lock
/// kind, as a module named after the cell with one test per kind.
macro_rules! for_every_kind {
    ($cell:ident) => {
        mod $cell {
            use $crate::Kind;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mutex() {
                super::$cell(Kind::Mutex).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn read() {
                super::$cell(Kind::Read).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn write() {
                super::$cell(Kind::Write).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn permit() {
                super::$cell(Kind::Permit).await
            }
        }
    };
}
pub(crate) use for_every_kind;
