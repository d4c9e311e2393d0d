//! The quorum rounds: one request per node in parallel, the acquire round with
//! its fence write-back round (asked with the lease's round token, `rounds.rs`),
//! and the release of what a failed round left.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::future::join_all;
use tokio::time::Instant;

use super::{FENCE, Inner, Node, Outcome, drift, fence_ttl_ms, is_definite};
use crate::backend::{Acquire, LeaseToken, LockBackend, LockKind, WhenBusy};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

impl Inner {
    /// Runs `op` on every node in parallel, each bounded by the node timeout.
    pub(super) async fn round<'a, T, F, Fut>(
        &'a self,
        key: &LockKey,
        phase: Phase,
        op: F,
    ) -> Vec<Outcome<T>>
    where
        F: Fn(&'a Node) -> Fut,
        Fut: Future<Output = Result<T>> + 'a,
    {
        let timeout = self.node_timeout;
        join_all(self.nodes.iter().map(|node| {
            let fut = op(node);
            async move {
                match tokio::time::timeout(timeout, fut).await {
                    Ok(Ok(v)) => Outcome::Ok(v),
                    Ok(Err(e)) => Outcome::Failed(e),
                    Err(_) => {
                        tracing::debug!(%key, %phase, node = ?node.backend, "redlock: no reply within {timeout:?}");
                        Outcome::TimedOut
                    }
                }
            }
        }))
        .await
    }

    /// The fence write-back on one node: `Ok(true)` if the round token `round`
    /// owns the lock there and its fence is now at least `epoch`.
    pub(super) async fn write_back(
        &self,
        node: &Node,
        key: &LockKey,
        round: LeaseToken,
        epoch: u64,
        fence_ttl_ms: u64,
    ) -> Result<bool> {
        let lock = node.backend.lock_name(key);
        let fence = [&lock[..], b":fence"].concat();
        let mut conn = node.conn.clone();
        let reply: i64 = FENCE
            .key(lock)
            .key(fence)
            .arg(round.to_hex())
            .arg(epoch.to_string())
            .arg(fence_ttl_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(|e| Error::Backend {
                key: key.clone(),
                phase: Phase::Acquiring,
                source: Arc::new(e),
            })?;
        Ok(reply == 1)
    }

    /// Releases the failed round's token `round` on the nodes `which`, in
    /// parallel, ignoring the outcomes (a release that is lost leaves that node's
    /// grant to expire with the TTL). Each release writes its record, as every
    /// release does: a copy of this round's acquire that lands later is refused,
    /// and the round's token was retired, so no later round asks with it.
    pub(super) async fn release_on(&self, key: &LockKey, round: LeaseToken, which: &[usize]) {
        let timeout = self.node_timeout;
        join_all(which.iter().map(|&i| {
            let node = &self.nodes[i];
            async move {
                let release = node.backend.release(key, round);
                match tokio::time::timeout(timeout, release).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::debug!(%key, error = %e, "redlock: releasing a partial grant failed"),
                    Err(_) => tracing::debug!(%key, "redlock: releasing a partial grant timed out"),
                }
            }
        }))
        .await;
    }

    /// A random delay around the retry delay (half to one and a half times it).
    pub(super) fn jitter(&self) -> Duration {
        let base = self.retry_delay.as_micros() as u64;
        let r = rand::random::<u64>() % base.max(1);
        Duration::from_micros(base / 2 + r)
    }

    /// One acquire round (and write-back round) of the lease `token`, asked with
    /// its round token; also says whether a node failed fast with a transient
    /// error.
    pub(super) async fn acquire_once(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> (Result<Acquire>, bool) {
        let inner = self;
        let before: Vec<u64> = inner
            .nodes
            .iter()
            .map(|node| {
                node.backend
                    .signals()
                    .generation(LockKind::Mutex, key.as_bytes())
            })
            .collect();
        if let Some(f) = inner.forwarders.get(key) {
            f.woken.store(0, Ordering::Release);
        }
        let sent_at = Instant::now();
        let round = inner.rounds.asking(key, token, sent_at + ttl);
        let wake = &inner.nodes[inner.wake_node(key)];
        let outcomes = inner
            .round(key, Phase::Acquiring, |node| {
                // Only the wake node queues this instance (and may give it a claim).
                let when_busy = if std::ptr::eq(node, wake) {
                    when_busy
                } else {
                    WhenBusy::Return
                };
                node.backend.acquire(key, round, ttl, when_busy)
            })
            .await;
        let mut granted = Vec::new(); // (node, epoch, waiting)
        let mut busy = Vec::new(); // retry_in
        let mut unknown = Vec::new(); // node indices that may hold it
        let mut definite = Vec::new();
        let mut fast = false;
        for (i, o) in outcomes.into_iter().enumerate() {
            match o {
                Outcome::Ok(Acquire::Acquired { epoch, waiting, .. }) => {
                    granted.push((i, epoch, waiting))
                }
                Outcome::Ok(Acquire::Busy { retry_in }) => busy.push(retry_in),
                Outcome::Failed(e) => {
                    if is_definite(&e) {
                        definite.push(e);
                    } else {
                        fast = true;
                    }
                    // A definite refusal wrote nothing; releasing it is harmless.
                    unknown.push(i);
                }
                Outcome::TimedOut => unknown.push(i),
            }
        }
        let validity = |now: Instant| ttl.saturating_sub(now - sent_at).saturating_sub(drift(ttl));
        if granted.len() >= inner.quorum && validity(Instant::now()) >= ttl / 2 {
            let epoch = granted.iter().map(|g| g.1).max().unwrap_or(0);
            let waiting = granted.iter().map(|g| g.2).max().unwrap_or(0);
            let fence_ttl = fence_ttl_ms(ttl);
            let written = join_all(granted.iter().map(|&(i, _, _)| {
                let node = &inner.nodes[i];
                async move {
                    tokio::time::timeout(
                        inner.node_timeout,
                        inner.write_back(node, key, round, epoch, fence_ttl),
                    )
                    .await
                }
            }))
            .await
            .into_iter()
            .filter(|r| matches!(r, Ok(Ok(true))))
            .count();
            if written >= inner.quorum && validity(Instant::now()) >= ttl / 2 {
                inner.unwatch_nodes(key);
                // No fair queue across nodes: no arrival order to report.
                let earliest_other = None;
                return (
                    Ok(Acquire::Acquired {
                        epoch,
                        waiting,
                        earliest_other,
                    }),
                    fast,
                );
            }
            tracing::debug!(%key, written, "redlock: the fence write-back reached no majority in time");
        }
        // Not granted: retire the round's token (the next round asks with a
        // fresh one) before releasing it wherever it may be held, so that no
        // round asks with a token a release of which may be on the wire.
        let mut holders: Vec<usize> = granted.iter().map(|g| g.0).collect();
        holders.extend_from_slice(&unknown);
        holders.sort_unstable();
        inner.rounds.retire(key, token, round);
        inner.release_on(key, round, &holders).await;
        if granted.len() + busy.len() >= inner.quorum {
            let retry_in = if granted.is_empty() && busy.len() >= inner.quorum {
                // Held elsewhere: a majority may be free when the quorum-th
                // earliest node frees it.
                busy.sort_unstable();
                busy[inner.quorum - 1] + inner.jitter() / 4
            } else {
                inner.jitter()
            };
            if when_busy == WhenBusy::Queue {
                inner.watch_nodes(key, &before);
            }
            return (Ok(Acquire::Busy { retry_in }), fast);
        }
        if definite.len() >= inner.quorum
            && let Some(e) = definite.into_iter().next()
        {
            return (Err(e), fast);
        }
        (
            Err(Error::QuorumNotReached {
                key: key.clone(),
                phase: Phase::Acquiring,
                granted: granted.len(),
                needed: inner.quorum,
            }),
            fast,
        )
    }
}
