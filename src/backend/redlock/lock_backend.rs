//! The [`LockBackend`] calls: acquire, release, renew and leave, each over every
//! node.

use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::Outcome;
use crate::backend::{
    Acquire, LeaseToken, LockBackend, RedlockBackend, Released, Renewal, Signals, WhenBusy,
};
use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

#[async_trait]
impl LockBackend for RedlockBackend {
    /// Acquire-or-enqueue on every node; granted after a majority and the fence
    /// write-back round (see the [module docs](super)). Each round asks with a
    /// round token of its own once the previous round ended without a grant.
    ///
    /// # Errors
    ///
    /// [`Error::QuorumNotReached`] when too few nodes answered for a majority to be
    /// possible (after releasing what the others granted); a node's definite
    /// refusal ([`Error::ForeignValue`], [`Error::NoPermission`],
    /// [`Error::Refused`]) when a majority of nodes refused that way.
    async fn acquire(
        &self,
        key: &LockKey,
        token: LeaseToken,
        ttl: Duration,
        when_busy: WhenBusy,
    ) -> Result<Acquire> {
        // A node that fails fast (its connection is being re-established after a
        // restart or a reset) is asked again, within one node timeout; a node that
        // does not answer in time is not.
        let start = Instant::now();
        let mut pause = Duration::from_millis(5);
        loop {
            let (result, fast_failures) = self.inner.acquire_once(key, token, ttl, when_busy).await;
            match result {
                Err(Error::QuorumNotReached { .. })
                    if fast_failures && start.elapsed() + pause < self.inner.node_timeout =>
                {
                    tokio::time::sleep(pause).await;
                    pause *= 3;
                }
                other => return other,
            }
        }
    }

    /// Releases the lease's round token on every node (the holder's wake-up goes
    /// out on each); a lease no round of which may hold anything is not the owner,
    /// without a request.
    ///
    /// # Errors
    ///
    /// A transient [`Error::Backend`] when neither a majority of releases nor a
    /// majority of "not yours" was confirmed (nodes unreachable): retrying
    /// reconciles it, as the nodes' release records recognise a repeated release.
    async fn release(&self, key: &LockKey, token: LeaseToken) -> Result<Released> {
        let inner = &*self.inner;
        let Some(round) = inner.rounds.current(key, token, None) else {
            // No round of this lease may hold anything: each one that was not
            // granted released its own token.
            return Ok(Released {
                released: false,
                waiting: 0,
            });
        };
        // The other nodes first, then the wake node, whose release wakes the next
        // waiting instance: by then a majority is free for it.
        let wake = &inner.nodes[inner.wake_node(key)];
        let mut outcomes = inner
            .round(key, Phase::Releasing, |node| {
                let skip = std::ptr::eq(node, wake);
                async move {
                    if skip {
                        Ok(Released {
                            released: false,
                            waiting: 0,
                        })
                    } else {
                        node.backend.release(key, round).await
                    }
                }
            })
            .await;
        let w = inner.wake_node(key);
        outcomes[w] = match tokio::time::timeout(
            inner.node_timeout,
            wake.backend.release(key, round),
        )
        .await
        {
            Ok(Ok(r)) => Outcome::Ok(r),
            Ok(Err(e)) => Outcome::Failed(e),
            Err(_) => Outcome::TimedOut,
        };
        let (mut released, mut not_owner, mut waiting) = (0, 0, 0);
        for o in &outcomes {
            if let Outcome::Ok(r) = o {
                waiting = waiting.max(r.waiting);
                if r.released {
                    released += 1;
                } else {
                    not_owner += 1;
                }
            }
        }
        if released >= inner.quorum {
            inner.rounds.forget(key, token);
            return Ok(Released {
                released: true,
                waiting,
            });
        }
        if not_owner > inner.nodes.len() - inner.quorum {
            inner.rounds.forget(key, token);
            return Ok(Released {
                released: false,
                waiting,
            });
        }
        // Kept for the repeat, which the nodes' release records answer.
        Err(Error::backend(
            key,
            Phase::Releasing,
            format!(
                "redlock: the release was confirmed on {released} nodes and refused on {not_owner}; {} of {} are needed",
                inner.quorum,
                inner.nodes.len()
            ),
        ))
    }

    /// Renews the lease's round token on every node; a lease no round of which
    /// may hold anything is not the owner, without a request.
    ///
    /// # Errors
    ///
    /// [`Error::QuorumNotReached`] (phase renewing) when fewer than a majority
    /// renewed and not enough nodes answered "not yours" to call it lost.
    async fn renew(&self, key: &LockKey, token: LeaseToken, ttl: Duration) -> Result<Renewal> {
        let inner = &*self.inner;
        let Some(round) = inner.rounds.current(key, token, Some(Instant::now() + ttl)) else {
            return Ok(Renewal::NotOwner);
        };
        let outcomes = inner
            .round(key, Phase::Renewing, |node| {
                node.backend.renew(key, round, ttl)
            })
            .await;
        let (mut renewed, mut not_owner, mut waiting) = (0, 0, 0);
        for o in &outcomes {
            match o {
                Outcome::Ok(Renewal::Renewed { waiting: w }) => {
                    renewed += 1;
                    waiting = waiting.max(*w);
                }
                Outcome::Ok(Renewal::NotOwner) => not_owner += 1,
                Outcome::Failed(_) | Outcome::TimedOut => {}
            }
        }
        if renewed >= inner.quorum {
            return Ok(Renewal::Renewed { waiting });
        }
        if not_owner > inner.nodes.len() - inner.quorum {
            return Ok(Renewal::NotOwner);
        }
        Err(Error::QuorumNotReached {
            key: key.clone(),
            phase: Phase::Renewing,
            granted: renewed,
            needed: inner.quorum,
        })
    }

    /// Leaves the queue of `key` (on its wake node, the only one that queues).
    ///
    /// # Errors
    ///
    /// The wake node's error, or a transient [`Error::Backend`] when it does not
    /// answer in time (queue entries expire on their own).
    async fn leave(&self, key: &LockKey) -> Result<()> {
        let inner = &*self.inner;
        inner.unwatch_nodes(key);
        // Only the wake node queues waiting instances.
        let wake = &inner.nodes[inner.wake_node(key)];
        match tokio::time::timeout(inner.node_timeout, wake.backend.leave(key)).await {
            Ok(result) => result,
            Err(_) => Err(Error::backend(
                key,
                Phase::Acquiring,
                format!(
                    "redlock: no reply to the leave from {:?} within {:?}",
                    wake.backend, inner.node_timeout
                ),
            )),
        }
    }

    fn signals(&self) -> &Signals {
        &self.inner.signals
    }
}
