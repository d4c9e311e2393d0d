//! A replicated pair on loopback: one primary and one replica (`--replicaof`), no
//! persistence, no Sentinel. For the tests of acknowledged writes
//! (`RedisBackendBuilder::replica_ack`): stopping the replica with `SIGSTOP` keeps
//! its link open (the primary still lists it) while it acknowledges nothing, and
//! [`Replicated::resume_replica`] lets it catch up from its socket buffers.

use std::time::{Duration, Instant};

use super::cluster::Node;
use super::process::data_args;

/// A primary and its one replica; both killed when dropped.
pub struct Replicated {
    /// The primary (the backends connect here).
    pub primary: Node,
    /// Its replica.
    pub replica: Node,
}

impl Replicated {
    /// Starts both nodes and waits (at most 30 s) until the replica is in sync.
    pub async fn start() -> Replicated {
        let primary = Node::start(None, |_| data_args());
        let pport = primary.port();
        let replica = Node::start(None, move |_| {
            let mut a = data_args();
            a.extend(["--replicaof".into(), "127.0.0.1".into(), pport.to_string()]);
            a
        });
        let pair = Replicated { primary, replica };
        pair.wait_in_sync(Duration::from_secs(30)).await;
        pair
    }

    /// Waits until the primary counts its replica as online and the replica has
    /// acknowledged a fresh write (a `SET` and a `WAIT 1 100` on one connection).
    /// Panics after `timeout`.
    pub async fn wait_in_sync(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let info: String = self
                .primary
                .cmd(&["INFO", "replication"])
                .await
                .unwrap_or_default();
            if info.contains("connected_slaves:1")
                && info.contains("state=online")
                && self.acknowledged().await
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the replica did not get in sync within {timeout:?}:\n{info}\n{}",
                self.replica.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the replica acknowledges a write within 100 ms.
    async fn acknowledged(&self) -> bool {
        let ack = async {
            let mut con = self.primary.connection().await;
            let mut pipe = redis::pipe();
            pipe.cmd("SET").arg("replication-test:sync").arg(1).ignore();
            pipe.cmd("WAIT").arg(1).arg(100);
            pipe.query_async::<(i64,)>(&mut con).await
        };
        matches!(
            tokio::time::timeout(Duration::from_secs(5), ack).await,
            Ok(Ok((1,)))
        )
    }

    /// Stops the replica (`SIGSTOP`): it stays connected but acknowledges nothing.
    pub fn stop_replica(&self) {
        self.replica.pause();
    }

    /// Continues the replica and waits (at most 30 s) until it is in sync again.
    pub async fn resume_replica(&self) {
        self.replica.resume();
        self.wait_in_sync(Duration::from_secs(30)).await;
    }
}
