//! The instance's single notification subscription.
//!
//! One task per backend keeps one pub/sub connection subscribed to the instance's
//! channel, on one server: the server itself, any node of a cluster (a classic
//! `PUBLISH` reaches every node; see `cluster` for why not sharded pub/sub), or the
//! primary the sentinels name. When the connection drops or cannot be made, the task
//! asks the command connection again where to subscribe (`CLUSTER NODES`, the
//! sentinels) and tries the servers in turn. When the connection drops, the task
//! reconnects with backoff and resubscribes, reads the server's life (a restarted
//! server ends every lease at once: see `life`), then wakes every watcher once, and has
//! every observer of a leader read the record again, because messages sent during
//! the gap are lost (a spurious wake-up only causes a retry, a spurious re-read only
//! a read). Meanwhile waiters fall back to their timers, observers to their
//! periodic re-read.
//!
//! # Messages
//!
//! Each message names one lock: a one-byte [`LockKind`] tag, then the key's bytes,
//! built by [`wake_message`] (the scripts publish the value they are given, their
//! "raw key" argument, as it is). The mutex, the read-write lock and the semaphore
//! of one key string are independent locks, so the task wakes only the watchers of
//! the tagged kind. The tags (`0xFD`, `0xFE`, `0xFF`) never begin valid UTF-8, so a
//! message with a text key is never misread.
//!
//! * An empty message carries no key: `connect` publishes one to check that it
//!   may, and it is ignored here.
//! * A revocation (tag `0xFC`, then the key) says that another instance queued for
//!   the key's mutex while this instance held its lease: if the lease is cached
//!   here and idle ([`LockerBuilder::cache_leases_for`](crate::LockerBuilder::cache_leases_for)), its caching ends
//!   and it is released at once ([`Signals::revoke`](crate::backend::Signals::revoke));
//!   if a task uses the lease, its next release keeps it only until that task
//!   yields.
//! * A takeover (tag `0xFB`, then the 32 hex digits of a lease token, then the
//!   key) says that an operator's forced release (`inspect/lua/force_release.lua`)
//!   deleted that lease of this instance: the lease registered under the token is
//!   marked lost at once ([`Signals::take_over`](crate::backend::Signals::take_over)),
//!   whatever its kind, so no new local section starts on it (a handoff, a cached
//!   lease, a reader joining a shared read lease) and its holders' releases report
//!   the loss. Nothing else is touched: a newer lease of the key has another token.
//! * A leader message (tag `0xFA`, then the key, built by [`leader_message`]) says
//!   that the leader record of the election of that key changed: a new leader or
//!   term (`lua/leader_write.lua`) or none any more (`lua/leader_clear.lua`). The
//!   scripts send it to every instance registered as an observer of the record
//!   (`lua/leader_observe.lua`); the observers here read the record again
//!   ([`Signals::leader_changed`](crate::backend::Signals::leader_changed)).
//!   It carries no claim and wakes no waiter. Only instances that registered
//!   receive it, so an older lockflight (which never registers) never does.
//! * A grant (tag `0xF9`, then the 32 hex digits of a lease token, the fencing
//!   epoch, a space, the instances still waiting, a space, the grant's window in
//!   ms, a space, when the earliest instance still waiting arrived, in µs after
//!   the granted ask's arrival (or `-`), a space, the ask's send stamp, a space,
//!   the key) says that a release gave the key's mutex to this
//!   instance's waiting acquire with that token, on the server
//!   (`lua/release.lua`): it is kept for that acquire (`Signals::grant`), which
//!   takes it without another request. It carries no claim. A grant for a key
//!   whose mutex nobody here waits for (still nobody after the grace period
//!   below) is given back: the lock is deleted if that token still holds it
//!   (`lua/leave.lua`).
//! * A write grant (tag `0xF8`, then the same fields as a grant's, the earliest
//!   arrival always `-`) says that a release gave the write lease of the key's
//!   read-write lock to this instance's waiting writer with that token
//!   (`lua/rw_release.lua`): kept and taken as a grant is, apart from the
//!   mutex's. One nobody here waits for is given back with the write release of
//!   that token (`lua/rw_release.lua`, `w`), which deletes the write lease if
//!   that token still holds it, retires the token, and passes the lock on.
//! * A message without a tag (a bare key) may be for any of the key's locks: it
//!   wakes the watchers of every kind of that key, a spurious wake-up at worst.
//!
//! A mutex message (tagged, or untagged) for a key whose mutex nobody here waits
//! for any more (still nobody after a short grace period) means this instance may
//! have been given a claim it will not use: if the claim is still this instance's,
//! the task leaves the key's queue, which passes the claim on, so no other instance
//! waits out the claim window for nothing. A claim already used, or a newer queue
//! entry, is left alone. Waiters of the key's read-write lock or semaphore do not
//! keep a mutex claim; messages of those kinds carry no claim and are only
//! delivered.
//!
//! The task runs on the runtime that started it; when that runtime shuts down, the
//! backend starts a new one on the runtime that uses it next (see
//! `Inner::ensure_notifier`).

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::RedisError;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Inner;
use super::conn::Conn;
use crate::backend::signals::{Grant, stamp_instant};
use crate::backend::{LeaseToken, LockKind};
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
    attempt: watch::Sender<Attempt>,
}

impl Default for Status {
    fn default() -> Self {
        Status {
            attempt: watch::Sender::new(Attempt::Pending),
        }
    }
}

impl Status {
    /// Follows the outcomes of the subscription attempts.
    pub(super) fn attempts(&self) -> watch::Receiver<Attempt> {
        self.attempt.subscribe()
    }
    /// A new task takes over (the previous one ended without saying so).
    pub(super) fn restarting(&self) {
        self.attempt.send_replace(Attempt::Pending);
    }
    fn report(&self, attempt: Attempt) {
        self.attempt.send_replace(attempt);
    }
}

/// The tag byte of the wake-up messages of `kind`: none of them begins valid UTF-8.
fn tag(kind: LockKind) -> u8 {
    match kind {
        LockKind::Mutex => 0xFD,
        LockKind::ReadWrite => 0xFE,
        LockKind::Semaphore => 0xFF,
    }
}

/// The wake-up message for the waiters of the `kind` lock of `key`: its tag byte,
/// then the key's bytes. The scripts take it as their "raw key" argument and
/// publish it unchanged; [`read_message`] reads it back.
pub(super) fn wake_message(kind: LockKind, key: &LockKey) -> Vec<u8> {
    let mut message = Vec::with_capacity(1 + key.len());
    message.push(tag(kind));
    message.extend_from_slice(key.as_bytes());
    message
}

/// The tag byte of a revocation: another instance queued for the mutex of the key
/// that follows while this instance held its lease (`lua/acquire.lua` builds it
/// from the wake-up message). Not a [`LockKind`]'s tag, and not valid UTF-8 either.
const REVOKE: u8 = 0xFC;

/// The tag byte of a takeover: a forced release deleted the lease whose token
/// (32 hex digits) follows, then the key (`inspect/lua/force_release.lua` builds
/// it). Not a [`LockKind`]'s tag, and not valid UTF-8 either.
const TAKEN_OVER: u8 = 0xFB;

/// The tag byte of a grant: a release gave the mutex of the key to this
/// instance's waiting acquire on the server (`lua/release.lua`): then the 32 hex
/// digits of the token, the epoch, a space, the waiting count, a space, the key.
/// Not a [`LockKind`]'s tag, and not valid UTF-8 either.
const GRANTED: u8 = 0xF9;

/// The tag byte of a write grant: a release gave the write lease of the
/// read-write lock of the key to this instance's waiting writer on the server
/// (`lua/rw_release.lua`), with the fields of a [`GRANTED`] message. Not a
/// [`LockKind`]'s tag, and not valid UTF-8 either.
const WRITE_GRANTED: u8 = 0xF8;

/// The tag byte of a leader message: the leader record of the election of the key
/// that follows changed (`lua/leader_write.lua` and `lua/leader_clear.lua` publish
/// it as they are given it). Not a [`LockKind`]'s tag, and not valid UTF-8 either.
const LEADER: u8 = 0xFA;

/// The leader message for the observers of the election `key`: its tag byte, then
/// the key's bytes; [`read_message`] reads it back.
pub(super) fn leader_message(key: &LockKey) -> Vec<u8> {
    let mut message = Vec::with_capacity(1 + key.len());
    message.push(LEADER);
    message.extend_from_slice(key.as_bytes());
    message
}

/// What a message on the instance's channel is about.
#[derive(Debug, PartialEq, Eq)]
enum Message<'a> {
    /// The empty probe `connect` publishes.
    Probe,
    /// A revocation of this instance's lease of the mutex of a key.
    Revoke(&'a [u8]),
    /// A forced release deleted this instance's lease `token` of a key.
    TakenOver(LeaseToken, &'a [u8]),
    /// The leader record of the election of a key changed.
    Leader(&'a [u8]),
    /// A release granted the `kind` lock of a key (a mutex, or a read-write
    /// lock's write lease) to this instance's acquire.
    Granted(LockKind, Grant, &'a [u8]),
    /// The `kind` lock of a key, from [`wake_message`].
    Lock(LockKind, &'a [u8]),
    /// A bare key without a tag: any of its locks.
    Untagged(&'a [u8]),
}

/// Reads a message published on the instance's channel (see the module docs).
fn read_message(raw: &[u8]) -> Message<'_> {
    if let [TAKEN_OVER, body @ ..] = raw
        && let Some(token) = taken_token(body)
    {
        return Message::TakenOver(token, &body[32..]);
    }
    if let [tag @ (GRANTED | WRITE_GRANTED), body @ ..] = raw
        && let Some((grant, key)) = read_grant(body)
    {
        let kind = if *tag == GRANTED {
            LockKind::Mutex
        } else {
            LockKind::ReadWrite
        };
        return Message::Granted(kind, grant, key);
    }
    match raw {
        [] => Message::Probe,
        [REVOKE, key @ ..] if !key.is_empty() => Message::Revoke(key),
        [LEADER, key @ ..] if !key.is_empty() => Message::Leader(key),
        [first, key @ ..] if !key.is_empty() => LockKind::ALL
            .into_iter()
            .find(|kind| tag(*kind) == *first)
            .map_or(Message::Untagged(raw), |kind| Message::Lock(kind, key)),
        _ => Message::Untagged(raw),
    }
}

/// The body of a grant message: the token, the epoch and the waiting count, and
/// the key (not empty).
fn read_grant(body: &[u8]) -> Option<(Grant, &[u8])> {
    let token = taken_token(body)?;
    let rest = &body[32..];
    let number = |bytes: &[u8]| std::str::from_utf8(bytes).ok()?.parse::<u64>().ok();
    let space = rest.iter().position(|&b| b == b' ')?;
    let epoch = number(&rest[..space])?;
    let rest = &rest[space + 1..];
    let space = rest.iter().position(|&b| b == b' ')?;
    let waiting = u32::try_from(number(&rest[..space])?).unwrap_or(u32::MAX);
    let rest = &rest[space + 1..];
    let space = rest.iter().position(|&b| b == b' ')?;
    let window = Duration::from_millis(number(&rest[..space])?);
    let rest = &rest[space + 1..];
    let space = rest.iter().position(|&b| b == b' ')?;
    let earliest_after_ask = match &rest[..space] {
        b"-" => None,
        at => Some(std::str::from_utf8(at).ok()?.parse::<i64>().ok()?),
    };
    let rest = &rest[space + 1..];
    let space = rest.iter().position(|&b| b == b' ')?;
    let sent = stamp_instant(number(&rest[..space])?)?;
    let key = &rest[space + 1..];
    if key.is_empty() {
        return None;
    }
    Some((
        Grant {
            token,
            epoch,
            waiting,
            window,
            earliest_after_ask,
            sent,
        },
        key,
    ))
}

/// The token that begins the body of a takeover message: 32 hex digits.
fn taken_token(body: &[u8]) -> Option<LeaseToken> {
    let hex = std::str::from_utf8(body.get(..32)?).ok()?;
    LeaseToken::from_hex(hex)
}

/// Wakes the watchers of the lock(s) `raw` is about; a mutex message nobody here
/// waits for may pass an unwanted claim on (see the module docs).
fn deliver(i: Arc<Inner>, raw: &[u8]) {
    let (key, mutex_watched) = match read_message(raw) {
        Message::Probe => return,
        Message::Revoke(key) => {
            // Ends an idle cached lease's linger; a lease in use keeps it for its
            // next release (which then caches only briefly).
            i.signals.revoke(key);
            return;
        }
        Message::TakenOver(token, key) => {
            // Exactly that lease is lost; a newer one of the key has another token.
            let held = i.signals.take_over(token);
            tracing::debug!(key = %String::from_utf8_lossy(key), ?token, held, "takeover message");
            return;
        }
        Message::Granted(kind, grant, key) => {
            // Kept for the acquire waiting with that token, which takes it. If
            // nobody here waits for the key's lock of that kind (still nobody
            // after the grace period), nobody will: the lock goes back at once
            // rather than at the end of its window. A copy of a grant already
            // taken (a Cluster may deliver one through the key's node and one
            // over the cluster bus) is dropped where it arrives
            // (`signals/grants.rs`).
            if !i.signals.grant(kind, key, grant) {
                tracing::debug!(key = %String::from_utf8_lossy(key), "a copy of a taken grant");
                return;
            }
            let key = LockKey::from(key);
            tokio::spawn(async move {
                tokio::time::sleep(UNWANTED_GRACE).await;
                // Taking it here remembers its token too, so a later copy is
                // dropped as well.
                if i.signals.is_watched(kind, key.as_bytes())
                    || i.signals.wants_grant(kind, key.as_bytes(), grant.token)
                    || i.signals.holds(grant.token)
                    || i.signals
                        .take_grant(kind, key.as_bytes(), grant.token)
                        .is_none()
                {
                    return;
                }
                // A mutex grant goes back through `leave.lua` (only while its
                // mark shows no ask took it); a write grant with the write
                // release of its token, as the given-up writer's own cleanup
                // would send it.
                let given_back = if kind == LockKind::Mutex {
                    i.give_back(&key, grant.token).await.map(drop)
                } else {
                    i.give_back_write(&key, grant.token).await
                };
                if let Err(e) = given_back {
                    tracing::debug!(%key, error = %e, "giving back an unwanted grant failed");
                }
            });
            return;
        }
        Message::Leader(key) => {
            // Observers read the record again; no lock is woken.
            i.signals.leader_changed(key);
            return;
        }
        Message::Lock(LockKind::Mutex, key) => (key, i.signals.wake(LockKind::Mutex, key)),
        Message::Lock(kind, key) => {
            // Read-write locks and semaphores give no claim: nothing to pass on (a
            // semaphore's request task that stops waiting leaves the waiting set
            // itself, passing its wake-ups on).
            i.signals.wake(kind, key);
            return;
        }
        Message::Untagged(key) => {
            // Any of the key's locks: wake them all.
            let mut mutex_watched = false;
            for kind in LockKind::ALL {
                let watched = i.signals.wake(kind, key);
                mutex_watched |= watched && kind == LockKind::Mutex;
            }
            (key, mutex_watched)
        }
    };
    if mutex_watched {
        return;
    }
    // Nobody waits for the key's mutex right now. A leader may be between its
    // acquire's reply and its registration (it will see the generation change and
    // retry), so give it a moment before concluding the claim is unwanted and
    // passing it on.
    let key = LockKey::from(key);
    tokio::spawn(async move {
        tokio::time::sleep(UNWANTED_GRACE).await;
        if i.signals.is_watched(LockKind::Mutex, key.as_bytes()) {
            return;
        }
        // Only if the claim is still ours: a leader of this instance may have used
        // it, or queued again, meanwhile.
        if let Err(e) = i.leave(&key, true).await {
            tracing::debug!(%key, error = %e, "leaving an unwanted claim failed");
        }
    });
}

/// How long a wake-up for a key nobody watches waits before the claim is given up.
const UNWANTED_GRACE: Duration = Duration::from_millis(25);
const MIN_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How often the mirrors' list of publishers is refreshed.
const MIRROR_REFRESH: Duration = Duration::from_secs(5);

/// Keeps a best-effort subscription to `channel` on every server that publishes
/// wake-ups first ([`Conn::publishers`]: a Cluster's primaries), so that a wake-up
/// arrives from the key's own node instead of over the cluster bus. The main
/// subscription ([`run`]) stays the one whose state `connect` waits
/// for; a mirror that fails is only retried at the next
/// refresh, and the messages it would have carried still come by the bus.
async fn mirrors(
    conn: Conn,
    channel: String,
    connect_timeout: Duration,
    inner: Weak<Inner>,
    stop: CancellationToken,
) {
    let mut running: std::collections::HashMap<String, tokio::task::JoinHandle<()>> =
        std::collections::HashMap::new();
    loop {
        let listed = tokio::select! {
            _ = stop.cancelled() => break,
            l = conn.publishers() => l,
        };
        running.retain(|_, task| !task.is_finished());
        for client in listed {
            let addr = client.get_connection_info().addr().to_string();
            if running.contains_key(&addr) {
                continue;
            }
            let (channel, inner, stop) = (channel.clone(), inner.clone(), stop.clone());
            let task = tokio::spawn(async move {
                let attempt = async {
                    let mut pubsub = client.get_async_pubsub().await?;
                    pubsub.subscribe(&channel).await?;
                    Ok::<_, redis::RedisError>(pubsub)
                };
                let Ok(Ok(pubsub)) = tokio::time::timeout(connect_timeout, attempt).await else {
                    return;
                };
                let mut messages = pubsub.into_on_message();
                loop {
                    let msg = tokio::select! {
                        _ = stop.cancelled() => return,
                        m = messages.next() => m,
                    };
                    let (Some(msg), Some(i)) = (msg, inner.upgrade()) else {
                        return;
                    };
                    deliver(i, msg.get_payload_bytes());
                }
            });
            running.insert(addr, task);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(MIRROR_REFRESH) => {}
        }
        if inner.strong_count() == 0 {
            break;
        }
    }
    for task in running.into_values() {
        task.abort();
    }
}

pub(super) async fn run(
    conn: Conn,
    channel: String,
    connect_timeout: Duration,
    inner: Weak<Inner>,
    stop: CancellationToken,
) {
    if conn.has_publishers() {
        let mirrored = mirrors(
            conn.clone(),
            channel.clone(),
            connect_timeout,
            inner.clone(),
            stop.clone(),
        );
        // Dropped with this task's runtime; ends with `stop` or the backend.
        tokio::spawn(mirrored);
    }
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
                // The server may be a new run of it that lost every lease (`life`):
                // its holders learn it before the waiters here ask again.
                // The command connection's first request after it was dropped
                // fails (and makes it reconnect): a few tries.
                for _ in 0..3 {
                    match tokio::time::timeout(connect_timeout, i.check_life()).await {
                        Ok(Ok(())) => break,
                        Ok(Err(e)) => {
                            tracing::debug!(%channel, error = %e, "reading the server's life failed")
                        }
                        Err(_) => tracing::debug!(%channel, "reading the server's life timed out"),
                    }
                }
                i.subscriber.report(Attempt::Subscribed);
                // Anything published while we were away is lost: let waiters retry.
                i.signals.wake_all();
                drop(i);
                let mut messages = pubsub.into_on_message();
                loop {
                    let msg = tokio::select! {
                        _ = stop.cancelled() => return,
                        m = messages.next() => m,
                    };
                    let Some(msg) = msg else { break };
                    let Some(i) = inner.upgrade() else { return };
                    deliver(i, msg.get_payload_bytes());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_message_names_its_kind_and_key() {
        for kind in LockKind::ALL {
            for key in [&b"k"[..], b"sku:555", b"\xfd", b"\xff\x00"] {
                let message = wake_message(kind, &LockKey::from(key));
                assert_eq!(message.len(), 1 + key.len());
                assert_eq!(read_message(&message), Message::Lock(kind, key), "{kind:?}");
            }
        }
        let tags: Vec<u8> = LockKind::ALL.into_iter().map(tag).collect();
        assert_eq!(tags, [0xFD, 0xFE, 0xFF], "the tags are the wire format");
        for t in tags {
            assert!(
                std::str::from_utf8(&[t, b'k']).is_err(),
                "{t:#x} begins UTF-8"
            );
        }
    }

    #[test]
    fn the_probe_and_untagged_messages_are_recognised() {
        assert_eq!(read_message(b""), Message::Probe);
        // A bare key (an older instance's message) is for any lock of the key.
        assert_eq!(read_message(b"sku:555"), Message::Untagged(b"sku:555"));
        assert_eq!(read_message(b"k"), Message::Untagged(b"k"));
        // A lone tag byte is a one-byte bare key: tagged messages have a key.
        assert_eq!(read_message(b"\xfd"), Message::Untagged(b"\xfd"));
        assert_eq!(read_message(b"\xfck"), Message::Revoke(b"k"));
        assert_eq!(read_message(b"\xfbk"), Message::Untagged(b"\xfbk"));
        // A lone leader tag is a bare key too.
        assert_eq!(read_message(b"\xfa"), Message::Untagged(b"\xfa"));
    }

    #[test]
    fn a_leader_message_names_its_key() {
        for key in [&b"k"[..], b"cron", b"\xfa", b"\xfd\x00"] {
            let message = leader_message(&LockKey::from(key));
            assert_eq!(message.len(), 1 + key.len());
            assert_eq!(message[0], 0xFA, "the tag is the wire format");
            assert_eq!(read_message(&message), Message::Leader(key));
        }
        assert!(
            std::str::from_utf8(&[LEADER, b'k']).is_err(),
            "0xFA begins UTF-8"
        );
    }

    #[test]
    fn a_takeover_names_its_token_and_key() {
        let token = LeaseToken::for_instance(0x00c0_ffee);
        let message = [&[TAKEN_OVER][..], token.to_hex().as_bytes(), b"sku:555"].concat();
        assert_eq!(
            read_message(&message),
            Message::TakenOver(token, b"sku:555")
        );
        // Upper-case hex is the same token.
        let upper = [
            &[TAKEN_OVER][..],
            token.to_hex().to_uppercase().as_bytes(),
            b"k",
        ]
        .concat();
        assert_eq!(read_message(&upper), Message::TakenOver(token, b"k"));
        // Without 32 hex digits it is no takeover: a bare key, as before the tag.
        let short = [&[TAKEN_OVER][..], &token.to_hex().as_bytes()[..31]].concat();
        assert_eq!(read_message(&short), Message::Untagged(&short));
        let not_hex = [&[TAKEN_OVER][..], &[b'g'; 32][..], b"k"].concat();
        assert_eq!(read_message(&not_hex), Message::Untagged(&not_hex));
        assert!(std::str::from_utf8(&message).is_err(), "0xFB begins UTF-8");
    }

    #[test]
    fn a_grant_names_its_token_epoch_waiting_count_and_key() {
        let token = LeaseToken::for_instance(0x00c0_ffee);
        let sent = tokio::time::Instant::now();
        let stamp = crate::backend::signals::send_stamp(sent);
        let message = [
            &[GRANTED][..],
            token.to_hex().as_bytes(),
            format!("1764000000000001 3 500 -1200 {stamp} sku: 5 5").as_bytes(),
        ]
        .concat();
        let grant = Grant {
            token,
            epoch: 1_764_000_000_000_001,
            waiting: 3,
            window: Duration::from_millis(500),
            earliest_after_ask: Some(-1200),
            sent: stamp_instant(stamp).unwrap(),
        };
        assert!(grant.sent <= sent);
        assert_eq!(
            read_message(&message),
            Message::Granted(LockKind::Mutex, grant, b"sku: 5 5")
        );
        // A write grant: the same fields, of the key's read-write lock.
        let write = [&[WRITE_GRANTED][..], &message[1..]].concat();
        assert_eq!(
            read_message(&write),
            Message::Granted(LockKind::ReadWrite, grant, b"sku: 5 5")
        );
        assert!(std::str::from_utf8(&write).is_err(), "0xF8 begins UTF-8");
        let none = [
            &[GRANTED][..],
            token.to_hex().as_bytes(),
            format!("1 0 500 - {stamp} k").as_bytes(),
        ]
        .concat();
        assert!(matches!(
            read_message(&none),
            Message::Granted(
                LockKind::Mutex,
                Grant {
                    earliest_after_ask: None,
                    ..
                },
                b"k"
            )
        ));
        // Anything malformed is no grant: a bare key, a spurious wake-up at worst.
        for body in [
            &b"12 3 5 - 0"[..],
            b"12 3 5 - 0 ",
            b"x 3 5 - 0 k",
            b"12 -1 5 - 0 k",
            b"12 3 5 - k",
            b"12 3 5 x 0 k",
            b"12 3 5 - x k",
            b"12",
        ] {
            let bad = [&[GRANTED][..], token.to_hex().as_bytes(), body].concat();
            assert_eq!(read_message(&bad), Message::Untagged(&bad), "{body:?}");
        }
        assert!(std::str::from_utf8(&message).is_err(), "0xF9 begins UTF-8");
    }
}
