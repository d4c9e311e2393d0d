//! Acknowledged writes ([`replica_ack`](super::RedisBackendBuilder::replica_ack)):
//! which scripts grant or renew a lease, and the connections their `WAIT` runs on.
//!
//! Every script that grants or renews a lease of any kind is a [`LeaseScript`]: it
//! says, from its reply, whether it wrote the lease. With `replica_ack` set, such a
//! script is followed by `WAIT replicas timeout` when (and only when) it wrote; a
//! busy or not-the-owner reply wrote no lease and is not waited for.
//!
//! `WAIT` counts the writes of the connection it is sent on, so the script and its
//! `WAIT` share one connection. Not the backend's multiplexed one: Redis answers a
//! connection's commands in order, so every other command of the process would
//! queue behind the `WAIT`. A [`Pool`] lends each acknowledged write a connection
//! of its own for the script and its `WAIT`: created on demand, at most
//! [`MAX_CONNECTIONS`] at once (more acknowledged writes wait for one), put back
//! after a clean exchange, dropped on any error (its state is unknown) and when
//! the primary changed (sentinel mode tags each connection with the primary's
//! generation). A script that finds its idle connection closed by the server runs
//! once more on a new one.

use std::ops::Deref;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, Script, ScriptInvocation, Value};
use tokio::sync::Semaphore;

use super::client::Timeouts;

/// A script that grants or renews a lease: its write is what `replica_ack`
/// acknowledges.
pub(super) struct LeaseScript {
    script: LazyLock<Script>,
    /// Whether the reply says the script wrote the lease (granted or re-armed it).
    pub(super) wrote: fn(&Value) -> bool,
    /// A renewal (in sentinel mode, one answered `READONLY` is not run again on the
    /// new primary: see `sentinel`).
    pub(super) renewal: bool,
}

impl LeaseScript {
    /// A script that grants a lease; `wrote` reads its reply.
    pub(super) const fn grant(script: fn() -> Script, wrote: fn(&Value) -> bool) -> Self {
        LeaseScript {
            script: LazyLock::new(script),
            wrote,
            renewal: false,
        }
    }

    /// A script that renews a lease; `wrote` reads its reply.
    pub(super) const fn renewal(script: fn() -> Script, wrote: fn(&Value) -> bool) -> Self {
        LeaseScript {
            script: LazyLock::new(script),
            wrote,
            renewal: true,
        }
    }
}

impl Deref for LeaseScript {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script
    }
}

/// The first element of an array reply, if it is an integer.
fn first_int(reply: &Value) -> Option<i64> {
    match reply {
        Value::Array(items) => match items.first() {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        },
        _ => None,
    }
}

/// `{ 1, … }`: the lock and read-write scripts granted or re-armed the lease.
pub(super) fn first_is_one(reply: &Value) -> bool {
    first_int(reply) == Some(1)
}

/// `{ n, … }` with `n ≥ 1`: the semaphore granted or re-armed `n` permits.
pub(super) fn first_is_positive(reply: &Value) -> bool {
    first_int(reply).is_some_and(|n| n >= 1)
}

/// At most this many acknowledged writes of one backend are in flight at once.
pub(super) const MAX_CONNECTIONS: usize = 16;

/// The reply of an acknowledged script: the script's reply, and how many
/// replicas acknowledged it if it wrote (`None`: it wrote no lease, nothing was
/// waited for).
pub(super) type Acked = (Value, Option<i64>);

/// The dedicated connections of one backend's acknowledged writes.
pub(super) struct Pool {
    replicas: u32,
    timeout: Duration,
    config: AsyncConnectionConfig,
    /// Idle connections, with the primary generation they were made for.
    idle: Mutex<Vec<(u64, MultiplexedConnection)>>,
    slots: Semaphore,
}

impl Pool {
    /// A pool whose writes wait for `replicas` replicas, at most `timeout`.
    pub(super) fn new(replicas: u32, timeout: Duration, timeouts: Timeouts) -> Pool {
        Pool {
            replicas,
            timeout,
            // A reply may take the whole WAIT.
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeouts.connection))
                .set_response_timeout(Some(timeouts.response + timeout)),
            idle: Mutex::new(Vec::new()),
            slots: Semaphore::new(MAX_CONNECTIONS),
        }
    }

    /// How many replicas must acknowledge, and how long `WAIT` waits for them.
    pub(super) fn settings(&self) -> (u32, Duration) {
        (self.replicas, self.timeout)
    }

    /// Runs `call` on a connection of its own to `client` (the current primary,
    /// of `generation`), then, if `wrote` says it wrote, `WAIT` on that connection.
    /// Dropping the future drops the connection (a pending `WAIT` with it).
    pub(super) async fn run(
        &self,
        client: &redis::Client,
        generation: u64,
        call: &ScriptInvocation<'_>,
        wrote: fn(&Value) -> bool,
    ) -> Result<Acked, RedisError> {
        let _slot = self
            .slots
            .acquire()
            .await
            .expect("the pool's slots stay open");
        let connect = || client.get_multiplexed_async_connection_with_config(&self.config);
        let (mut conn, reused) = match self.take(generation) {
            Some(conn) => (conn, true),
            None => (connect().await?, false),
        };
        let reply: Value = match call.invoke_async(&mut conn).await {
            // An idle connection the server closed meanwhile (a restart, its idle
            // `timeout`, `CLIENT KILL`): once more on a new one. The scripts are
            // idempotent for their token, so a repeat is safe.
            Err(e) if reused && (e.is_connection_dropped() || e.is_io_error()) => {
                conn = connect().await?;
                call.invoke_async(&mut conn).await?
            }
            other => other?,
        };
        let acks = if wrote(&reply) {
            let acks: i64 = redis::cmd("WAIT")
                .arg(self.replicas)
                .arg(
                    u64::try_from(self.timeout.as_millis())
                        .unwrap_or(u64::MAX)
                        .max(1),
                )
                .query_async(&mut conn)
                .await?;
            Some(acks)
        } else {
            None
        };
        self.put(generation, conn);
        Ok((reply, acks))
    }

    /// An idle connection to the primary of `generation`; idle connections to an
    /// earlier primary are dropped.
    fn take(&self, generation: u64) -> Option<MultiplexedConnection> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|(g, _)| *g == generation);
        idle.pop().map(|(_, conn)| conn)
    }

    fn put(&self, generation: u64, conn: MultiplexedConnection) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < MAX_CONNECTIONS {
            idle.push((generation, conn));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_say_whether_the_lease_was_written() {
        let ints = |v: &[i64]| Value::Array(v.iter().map(|n| Value::Int(*n)).collect());
        // Lock and read-write scripts: granted / re-armed, busy, foreign, not owner.
        assert!(first_is_one(&ints(&[1, 7, 0])));
        assert!(first_is_one(&ints(&[1])));
        for reply in [ints(&[0, 100, 2]), ints(&[-1]), ints(&[-2]), ints(&[0, 0])] {
            assert!(!first_is_one(&reply), "{reply:?}");
        }
        // Semaphore: n permits granted, none, a count mismatch.
        assert!(first_is_positive(&ints(&[2, 0])));
        assert!(first_is_positive(&ints(&[1])));
        for reply in [ints(&[0, 50]), ints(&[-3, 5]), ints(&[0])] {
            assert!(!first_is_positive(&reply), "{reply:?}");
        }
        assert!(!first_is_one(&Value::Nil));
        assert!(!first_is_positive(&Value::Okay));
    }
}
