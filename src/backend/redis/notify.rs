//! The instance's single notification subscription.
//!
//! One task per backend keeps one pub/sub connection subscribed to the instance's
//! channel, on one server: the server itself, any node of a cluster (a classic
//! `PUBLISH` reaches every node; see `cluster` for why not sharded pub/sub), or the
//! primary the sentinels name. When the connection drops or cannot be made, the task
//! asks the command connection again where to subscribe (`CLUSTER NODES`, the
//! sentinels) and tries the servers in turn. Each message carries a raw key; the task wakes that key's watchers. When
//! the connection drops, the task reconnects with backoff and resubscribes, then
//! wakes every watcher once, because messages sent during the gap are lost (a
//! spurious wake-up only causes a retry). Meanwhile waiters fall back to their timers.
//!
//! A message for a key nobody here waits for any more (still nobody after a short
//! grace period) means this instance may have been given a claim it will not use:
//! if the claim is still this instance's, the task leaves the key's queue, which
//! passes the claim on, so no other instance waits out the claim window for
//! nothing. A claim already used, or a newer queue entry, is left alone.
//!
//! An empty message carries no key: `connect` publishes one to check that it may,
//! and it is ignored here.
//!
//! The task runs on the runtime that started it; when that runtime shuts down, the
//! backend starts a new one on the runtime that uses it next (see
//! `Inner::ensure_notifier`).

use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use redis::RedisError;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Inner;
use super::conn::Conn;
use crate::key::LockKey;

/// The outcome of the task's latest attempt to subscribe.
#[derive(Clone, Debug)]
pub(super) enum Attempt {
    /// No attempt has ended yet.
    Pending,
    /// Subscribed.
    Subscribed,
    /// The attempt failed (it is retried with backoff).
    Failed(RedisError),
}

/// Shared view of the subscription's health.
#[derive(Debug)]
pub(super) struct Status {
    up: AtomicBool,
    count: AtomicU64,
    attempt: watch::Sender<Attempt>,
}

impl Default for Status {
    fn default() -> Self {
        Status {
            up: AtomicBool::new(false),
            count: AtomicU64::new(0),
            attempt: watch::Sender::new(Attempt::Pending),
        }
    }
}

impl Status {
    pub(super) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }
    pub(super) fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }
    /// Follows the outcomes of the subscription attempts.
    pub(super) fn attempts(&self) -> watch::Receiver<Attempt> {
        self.attempt.subscribe()
    }
    /// A new task takes over (the previous one ended without saying so).
    pub(super) fn restarting(&self) {
        self.up.store(false, Ordering::Release);
        self.attempt.send_replace(Attempt::Pending);
    }
    fn report(&self, attempt: Attempt) {
        self.attempt.send_replace(attempt);
    }
}

/// How long a wake-up for a key nobody watches waits before the claim is given up.
const UNWANTED_GRACE: Duration = Duration::from_millis(25);
const MIN_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

pub(super) async fn run(
    conn: Conn,
    channel: String,
    connect_timeout: Duration,
    inner: Weak<Inner>,
    stop: CancellationToken,
) {
    let mut backoff = MIN_BACKOFF;
    let mut targets: Vec<redis::Client> = Vec::new();
    let mut next = 0;
    loop {
        if next >= targets.len() {
            // Where to subscribe now: a node may have failed, a primary moved.
            let listed = tokio::select! {
                _ = stop.cancelled() => return,
                r = tokio::time::timeout(connect_timeout, conn.subscribe_targets()) => r,
            };
            match listed {
                Ok(Ok(mut list)) if !list.is_empty() => {
                    // Instances spread their subscriptions over a cluster's nodes.
                    let start = (rand::random::<u64>() % list.len() as u64) as usize;
                    list.rotate_left(start);
                    targets = list;
                }
                Ok(Err(e)) if targets.is_empty() => {
                    tracing::debug!(%channel, error = %e, "finding a server to subscribe on failed");
                    let Some(i) = inner.upgrade() else { return };
                    i.subscriber.report(Attempt::Failed(e));
                }
                _ => {}
            }
            next = 0;
        }
        let Some(client) = targets.get(next).cloned() else {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            continue;
        };
        next += 1;
        let attempt = async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        };
        let connected = tokio::select! {
            _ = stop.cancelled() => return,
            r = tokio::time::timeout(connect_timeout, attempt) => r,
        };
        match connected {
            Ok(Ok(pubsub)) => {
                backoff = MIN_BACKOFF;
                let Some(i) = inner.upgrade() else { return };
                i.subscriber.up.store(true, Ordering::Release);
                i.subscriber.count.fetch_add(1, Ordering::AcqRel);
                i.subscriber.report(Attempt::Subscribed);
                // Anything published while we were away is lost: let waiters retry.
                i.wakeups.wake_all();
                drop(i);
                let mut messages = pubsub.into_on_message();
                loop {
                    let msg = tokio::select! {
                        _ = stop.cancelled() => return,
                        m = messages.next() => m,
                    };
                    let Some(msg) = msg else { break };
                    let Some(i) = inner.upgrade() else { return };
                    let raw = msg.get_payload_bytes();
                    if raw.is_empty() {
                        continue;
                    }
                    if !i.wakeups.wake(raw) {
                        // Nobody watches the key right now. A leader may be between
                        // its acquire's reply and its registration (it will see the
                        // generation change and retry), so give it a moment before
                        // concluding the claim is unwanted and passing it on.
                        let key = LockKey::from(raw);
                        tokio::spawn(async move {
                            tokio::time::sleep(UNWANTED_GRACE).await;
                            if i.wakeups.is_watched(key.as_bytes()) {
                                return;
                            }
                            // Only if the claim is still ours: a leader of this
                            // instance may have used it, or queued again, meanwhile.
                            if let Err(e) = i.leave(&key, true).await {
                                tracing::debug!(%key, error = %e, "leaving an unwanted claim failed");
                            }
                        });
                    }
                }
                if let Some(i) = inner.upgrade() {
                    i.subscriber.up.store(false, Ordering::Release);
                }
                // Ask again where to subscribe.
                next = targets.len();
                tracing::debug!(%channel, "notification connection lost; reconnecting");
            }
            Ok(Err(e)) => {
                tracing::debug!(%channel, error = %e, "subscribing failed");
                let Some(i) = inner.upgrade() else { return };
                i.subscriber.report(Attempt::Failed(e));
            }
            Err(_) => {
                tracing::debug!(%channel, "subscribing timed out");
                let Some(i) = inner.upgrade() else { return };
                let timed_out =
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "subscribing timed out");
                i.subscriber.report(Attempt::Failed(timed_out.into()));
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
