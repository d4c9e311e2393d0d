//! Tests that start no server: [`testing`] (feature `testing`), the test kit's
//! fault knobs on a paused clock; [`contract`], the lease contract on
//! `MemoryBackend` under a fault plan; [`harness`], the test harness's RESP
//! counter; [`send_sync`], `Send` and `Sync` pinned on the public futures and
//! guards.

mod contract;
mod harness;
mod send_sync;
#[cfg(feature = "testing")]
mod testing;
