//! lockflight on topologies of several servers, each started once for this test
//! binary and shared by its module's tests, which run one at a time where they
//! change it (each module's `SERIAL` lock):
//!
//! * [`cluster`] (feature `cluster`): a Redis Cluster of 3 primaries with one
//!   replica each;
//! * [`sentinel`] (feature `sentinel`): a primary, two replicas and three
//!   sentinels;
//! * [`replication`]: replica acknowledgement on a primary with one replica;
//! * [`redlock`]: `RedlockBackend` over 5 servers.

#[cfg(feature = "cluster")]
mod cluster;
mod redlock;
mod replication;
#[cfg(feature = "sentinel")]
mod sentinel;
