//! Leader election: [`on_redis`], instances on one real Redis; [`processes`],
//! leaders in child processes (this binary, run again for one test) that are
//! killed, stopped or blocked; [`on_kit`] (feature `testing`), elections on the
//! test kit's paused clock, where order and request counts are exact.
//!
//! What an election reports to metrics is in the `signals` binary, which owns
//! the process's one recorder.

#[cfg(feature = "testing")]
mod on_kit;
mod on_redis;
mod processes;
