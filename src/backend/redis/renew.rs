//! Batched renewal: [`LockBackend::renew_batch`](crate::backend::LockBackend::renew_batch)
//! for Redis.
//!
//! The watchdog hands over the leases due in one scan. They are renewed by
//! `lua/renew_batch.lua`, up to [`CHUNK`] leases per call, of any kinds mixed: per
//! lease, the script runs the very function of `lua/renew.lua` that the lease's own
//! renewal script runs, so each lease gets the reply its single renewal would get,
//! and an error of one lease (a value of another type) is that lease's alone. A
//! chunk of one lease whose fence is due ([`RenewItem::fence_due`]) runs the
//! lease's own script (which re-arms the fence); the batch script re-arms a fence
//! only when it is due.
//!
//! * **One server, Sentinel**: `ceil(leases / CHUNK)` script calls per scan, sent
//!   at once on the shared connection (on Sentinel through the same primary
//!   resolution as a single renewal: a `READONLY` chunk is never re-run on the new
//!   primary, so every lease in it is lost, as each alone would be).
//! * **Cluster**: leases are grouped by the **primary** that serves their slot
//!   (the slot map of `owners`), then chunked: `ceil(leases on it / CHUNK)` calls
//!   per primary and scan, all sent at once. A script may declare keys of one slot
//!   only, so a primary's batch declares none: the same script, flagged
//!   `allow-cross-slot-keys` (Redis 7), finds the key names after the leases'
//!   arguments, and runs on the primary of its first lease's slot (as the cluster
//!   client's map says). Safety does not rest on the map: Redis checks every key a
//!   script touches and refuses one of a slot the node does not serve ("non local
//!   key") before that lease's first write (a lease's keys share one slot), so a
//!   stale map or a migrating slot costs the leases it misplaced a second call,
//!   each on its own (routed by its keys, following `MOVED`/`ASK`), and the map is
//!   forgotten: batches go per slot until it is read again, in a task of its own
//!   (a renewal never waits for the map: the first scans after a start or a
//!   forgotten map go per slot). A call refused as a whole (say `OOM`: Redis refuses a flagged
//!   script before it runs when out of memory, where an unflagged one runs its
//!   `PEXPIRE`s) is made again per slot, which gives each lease its per-slot
//!   answer; `READONLY` and transient failures are every lease's, as per slot. A
//!   primary that cannot run it correctly (before 7.0, 7.2.0–7.2.4, redis#12906, and Valkey before 8.0;
//!   see `owners`), and a backend with `replica_ack` (its `WAIT` needs the
//!   connection the script ran on), are renewed per slot: one call per slot in
//!   use (leases whose keys share a hash tag share it). Measured on the test
//!   cluster: 10,000 leases on random keys (some 7,000 slots) renew with about 7
//!   calls per primary and period, against one per slot in use before.
//! * **Redlock** keeps the default: each lease's quorum renewal, all at once.
//! * **`replica_ack`**: one `WAIT` per chunk, after the script, when it re-armed at
//!   least one lease. Too few acknowledgements make each lease the chunk re-armed a
//!   `NOREPLICAS` refusal (retried by the watchdog until its validity ends); the
//!   others keep their own answer (not the owner), as their single renewal, which
//!   waits for nothing, would.
//!
//! A whole-call failure (I/O, a timeout, a dropped connection, `READONLY`, `BUSY`)
//! is that error for every lease of the chunk, classified as for a single renewal.
//! Under `maxmemory`, Redis refuses a script's first write that may grow memory but
//! no later one: a lease that would be refused `OOM` alone may be renewed in a
//! batch after another lease's write (never the reverse).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use redis::{RedisError, Value};

use super::acked::{LeaseScript, first_is_one};
use super::rw::{RwNames, fence_ttl_ms};
use super::semaphore::{SemNames, decode_permit_renewal};
use super::{Names, RedisBackend, decode_renewal, map_err, millis, renewal_script, unexpected};
use crate::backend::{LeaseKind, RenewItem, Renewal, renew_one};
use crate::error::{Error, Phase, Result};

/// At most this many leases per script call, so that one call holds Redis for a
/// few milliseconds at most (measured by `measure_batched_renewal` in
/// `tests/locks/redis_lock/renewal_batch.rs`; figures in BENCHMARKS.md).
pub(super) const CHUNK: usize = 500;

pub(super) static RENEW_BATCH: LeaseScript = LeaseScript::renewal(
    || renewal_script(include_str!("lua/renew_batch.lua")),
    any_renewed,
);

/// The source of [`RENEW_BATCH_CROSS_SLOT`]: the same script, flagged
/// `allow-cross-slot-keys` (Redis 7), which a node's batch on a cluster runs with
/// its keys undeclared.
#[cfg(feature = "cluster")]
static CROSS_SLOT_SOURCE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "#!lua flags=allow-cross-slot-keys\n{}",
        super::renewal_source(include_str!("lua/renew_batch.lua"))
    )
});

/// The batch renewal of a cluster node's leases of several slots.
#[cfg(feature = "cluster")]
static RENEW_BATCH_CROSS_SLOT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(&CROSS_SLOT_SOURCE));

/// Whether a batch reply re-armed at least one lease (then `replica_ack` waits).
fn any_renewed(reply: &Value) -> bool {
    matches!(reply, Value::Array(items) if items.chunks(2).any(|pair| matches!(pair, [Value::Int(1), _])))
}

/// The script's argument for a lease's kind, upper case when its fence is due.
fn kind_arg(item: &RenewItem<'_>) -> &'static [u8] {
    match (item.kind, item.fence_due) {
        (LeaseKind::Mutex, false) => b"m",
        (LeaseKind::Mutex, true) => b"M",
        (LeaseKind::Read, false) => b"r",
        (LeaseKind::Read, true) => b"R",
        (LeaseKind::Write, false) => b"w",
        (LeaseKind::Write, true) => b"W",
        (LeaseKind::Permit, _) => b"p",
    }
}

/// A per-lease error of the batch script (`{ -1, message }`), as the error the
/// lease's own script would have failed with: its code is the message's first word.
fn lease_error(message: &[u8]) -> RedisError {
    let message = String::from_utf8_lossy(message);
    let (code, detail) = message.split_once(' ').unwrap_or((&message, ""));
    let is_code = !code.is_empty() && code.bytes().all(|b| b.is_ascii_uppercase());
    if is_code {
        redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
    } else {
        redis::make_extension_error("ERR".to_owned(), Some(message.into_owned()))
    }
}

/// How a group of leases is renewed in one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Group {
    /// Leases of one cluster slot (or of the one server): keys declared.
    Slot(u16),
    /// Leases of many slots of one cluster primary: keys undeclared, the script
    /// flagged `allow-cross-slot-keys`.
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    Node(usize),
}

impl RedisBackend {
    /// See the module docs.
    pub(super) async fn renew_all(&self, items: &[RenewItem<'_>]) -> Vec<Result<Renewal>> {
        let results = self.renew_all_inner(items).await;
        // A lease gone may be a server restarted without its data: its holders
        // learn that reason (and every other lease there is lost with it) before
        // this renewal reports "not the owner" (`life`).
        let mut places: Vec<u16> = items
            .iter()
            .zip(&results)
            .filter(|(_, r)| matches!(r, Ok(Renewal::NotOwner)))
            .map(|(item, _)| self.slot_of(item))
            .collect();
        places.sort_unstable();
        places.dedup();
        for place in places {
            if let Err(e) = self.inner.check_life_at(place).await {
                tracing::debug!(error = %e, "reading the server's life after a lost lease failed");
            }
        }
        results
    }

    async fn renew_all_inner(&self, items: &[RenewItem<'_>]) -> Vec<Result<Renewal>> {
        if let [item] = items
            && item.fence_due
        {
            return vec![renew_one(self, item).await];
        }
        let chunks = self.chunks(items);
        let replies = join_all(chunks.iter().map(|(group, chunk)| async move {
            match group {
                #[cfg(feature = "cluster")]
                Group::Node(_) => self.renew_node_chunk(items, chunk).await,
                _ => self.renew_chunk(items, chunk).await,
            }
        }))
        .await;
        let positions = chunks.iter().map(|(_, chunk)| chunk.as_slice());
        scatter(items, (0..items.len()).collect(), positions, replies)
    }

    /// The cluster slot of a lease's keys (0 on one server).
    fn slot_of(&self, item: &RenewItem<'_>) -> u16 {
        if self.inner.conn.is_cluster() {
            super::slots::slot(&Names::new(&self.inner.prefix, item.key).lock)
        } else {
            0
        }
    }

    /// The indices of `items`, in groups that one script call may renew: on a
    /// cluster by primary where the primary takes cross-slot batches (see
    /// `owners`), else by slot; and by TTL (a call's leases share one: the
    /// watchdog's differ only at a hold limit); then at most [`CHUNK`] each.
    fn chunks(&self, items: &[RenewItem<'_>]) -> Vec<(Group, Vec<usize>)> {
        #[cfg(feature = "cluster")]
        let owners = match self.inner.conn.cluster() {
            // An acknowledged write waits on a connection of its own (`acked`),
            // which a node's batch does not use.
            Some(c) if self.inner.acks.is_none() => c.owners.get(c),
            _ => None,
        };
        let mut groups: BTreeMap<(Group, Duration), Vec<usize>> = BTreeMap::new();
        for (i, item) in items.iter().enumerate() {
            let slot = self.slot_of(item);
            #[cfg(feature = "cluster")]
            if let Some(node) = owners.as_ref().and_then(|o| o.batching_node(slot)) {
                groups
                    .entry((Group::Node(node), item.ttl))
                    .or_default()
                    .push(i);
                continue;
            }
            groups
                .entry((Group::Slot(slot), item.ttl))
                .or_default()
                .push(i);
        }
        groups
            .into_iter()
            .flat_map(|((group, _), indices)| {
                indices
                    .chunks(CHUNK)
                    .map(|chunk| (group, chunk.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The keys and the arguments of a batch of `items[i]` for each `i` of
    /// `chunk` (leases of one TTL, see [`chunks`](Self::chunks)), in the order of
    /// `lua/renew_batch.lua`.
    fn batch_args(&self, items: &[RenewItem<'_>], chunk: &[usize]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let inner = &*self.inner;
        let ttl = chunk.first().map_or(Duration::ZERO, |&i| items[i].ttl);
        let mut keys: Vec<Vec<u8>> = Vec::with_capacity(chunk.len() * 4);
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(4 + chunk.len() * 2);
        args.extend([
            inner.instance_id.as_bytes().to_vec(),
            chunk.len().to_string().into_bytes(),
            millis(ttl).to_string().into_bytes(),
            fence_ttl_ms(ttl).to_string().into_bytes(),
        ]);
        for &i in chunk {
            let item = &items[i];
            debug_assert_eq!(item.ttl, ttl, "a batch call's leases share one TTL");
            let fence = match item.kind {
                LeaseKind::Mutex => {
                    let n = Names::new(&inner.prefix, item.key);
                    keys.extend([n.lock, n.queue, n.queue_expiry]);
                    Some(n.fence)
                }
                LeaseKind::Read | LeaseKind::Write => {
                    let n = RwNames::new(&inner.prefix, item.key);
                    keys.extend([n.readers, n.writer, n.writers]);
                    Some(n.fence)
                }
                LeaseKind::Permit => {
                    let n = SemNames::new(&inner.prefix, item.key);
                    keys.extend([n.permits, n.count]);
                    None
                }
            };
            if item.fence_due {
                keys.extend(fence);
            }
            args.extend([kind_arg(item).to_vec(), item.token.to_hex().into_bytes()]);
        }
        (keys, args)
    }

    /// Renews `items[i]` for each `i` of `chunk` (one slot's) in one script call;
    /// returns their results in the order of `chunk`.
    async fn renew_chunk(&self, items: &[RenewItem<'_>], chunk: &[usize]) -> Vec<Result<Renewal>> {
        if let [i] = chunk
            && items[*i].fence_due
        {
            return vec![renew_one(self, &items[*i]).await];
        }
        let (keys, args) = self.batch_args(items, chunk);
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let (reply, too_few) = match self
            .inner
            .invoke_lease_acked(&RENEW_BATCH, &keys, &args)
            .await
        {
            Ok(answer) => answer,
            Err(e) => return chunk_failed(items, chunk, e),
        };
        let Some(replies) = per_lease(items, chunk, &reply) else {
            return unexpected_for_all(items, chunk, &reply);
        };
        chunk
            .iter()
            .zip(&replies)
            .map(|(&i, reply)| decode(&items[i], reply, too_few.as_ref()))
            .collect()
    }

    /// Renews `items[i]` for each `i` of `chunk` (leases of several slots of one
    /// primary, as the slot map said) in one cross-slot script call on the
    /// primary of the first lease's slot. A lease the node refuses as not local
    /// (the map was wrong, or its slot is migrating) is renewed on its own, and
    /// the map forgotten. A call the node refuses as a whole for another reason
    /// than a loss (`READONLY`) or a transient failure (say `OOM`: a flagged script
    /// is refused before it runs) is made again per slot, which keeps the
    /// per-slot answer.
    #[cfg(feature = "cluster")]
    async fn renew_node_chunk(
        &self,
        items: &[RenewItem<'_>],
        chunk: &[usize],
    ) -> Vec<Result<Renewal>> {
        use super::errors::{Mapping, mapping};

        let Some(cluster) = self.inner.conn.cluster() else {
            return self.renew_chunk(items, chunk).await;
        };
        if let [i] = chunk
            && items[*i].fence_due
        {
            return vec![renew_one(self, &items[*i]).await];
        }
        let (keys, mut args) = self.batch_args(items, chunk);
        args.extend(keys);
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let slot = self.slot_of(&items[chunk[0]]);
        let reply = match cluster
            .invoke_on(&RENEW_BATCH_CROSS_SLOT, &CROSS_SLOT_SOURCE, slot, &args)
            .await
        {
            Ok(reply) => reply,
            Err(e) if mapping(&e) == Mapping::Transient || e.code() == Some("READONLY") => {
                return chunk_failed(items, chunk, e);
            }
            Err(e) => {
                tracing::debug!(error = %e, "a cross-slot renewal was refused; renewing per slot");
                cluster.owners.forget();
                return self.renew_per_slot(items, chunk).await;
            }
        };
        let Some(replies) = per_lease(items, chunk, &reply) else {
            return unexpected_for_all(items, chunk, &reply);
        };
        let mut out = Vec::with_capacity(chunk.len());
        let mut alone = Vec::new();
        for (&i, reply) in chunk.iter().zip(&replies) {
            if not_local(reply) {
                alone.push(out.len());
                out.push(None);
            } else {
                out.push(Some(decode(&items[i], reply, None)));
            }
        }
        if !alone.is_empty() {
            cluster.owners.forget();
            let again = join_all(alone.iter().map(|&j| renew_one(self, &items[chunk[j]]))).await;
            for (j, result) in alone.into_iter().zip(again) {
                out[j] = Some(result);
            }
        }
        out.into_iter().flatten().collect()
    }

    /// Renews `items[i]` for each `i` of `chunk` per slot; results in the order of
    /// `chunk`.
    #[cfg(feature = "cluster")]
    async fn renew_per_slot(
        &self,
        items: &[RenewItem<'_>],
        chunk: &[usize],
    ) -> Vec<Result<Renewal>> {
        // (A call's leases share one TTL.)
        let mut by_slot: BTreeMap<(u16, Duration), Vec<usize>> = BTreeMap::new();
        for (j, &i) in chunk.iter().enumerate() {
            by_slot
                .entry((self.slot_of(&items[i]), items[i].ttl))
                .or_default()
                .push(j);
        }
        let groups: Vec<Vec<usize>> = by_slot.into_values().collect();
        let replies = join_all(groups.iter().map(|positions| {
            let indices: Vec<usize> = positions.iter().map(|&j| chunk[j]).collect();
            async move { self.renew_chunk(items, &indices).await }
        }))
        .await;
        scatter(
            items,
            chunk.to_vec(),
            groups.iter().map(Vec::as_slice),
            replies,
        )
    }
}

/// The results of groups of leases in one list: `leases[j]` is the index in
/// `items` of the lease at position `j`, each group lists its positions, and its
/// results come in that order. A position no group answered is an error.
fn scatter<'a>(
    items: &[RenewItem<'_>],
    leases: Vec<usize>,
    groups: impl Iterator<Item = &'a [usize]>,
    results: Vec<Vec<Result<Renewal>>>,
) -> Vec<Result<Renewal>> {
    let mut out: Vec<Option<Result<Renewal>>> = leases.iter().map(|_| None).collect();
    for (positions, results) in groups.zip(results) {
        for (&j, result) in positions.iter().zip(results) {
            out[j] = Some(result);
        }
    }
    out.into_iter()
        .zip(leases)
        .map(|(result, i)| {
            result.unwrap_or_else(|| {
                Err(Error::backend(
                    items[i].key,
                    Phase::Renewing,
                    "the batch renewal gave no answer for this lease",
                ))
            })
        })
        .collect()
}

/// A batch call's failure, as every lease of its chunk's.
fn chunk_failed(items: &[RenewItem<'_>], chunk: &[usize], e: RedisError) -> Vec<Result<Renewal>> {
    chunk
        .iter()
        .map(|&i| Err(map_err(items[i].key, Phase::Renewing, e.clone())))
        .collect()
}

/// A batch reply that is not one reply per lease, as every lease's error.
fn unexpected_for_all(
    items: &[RenewItem<'_>],
    chunk: &[usize],
    reply: &Value,
) -> Vec<Result<Renewal>> {
    chunk
        .iter()
        .map(|&i| Err(unexpected(items[i].key, Phase::Renewing, reply)))
        .collect()
}

/// The per-lease replies of a batch reply of `n` leases (two values each: a
/// lease's `{ code, value }`), each as its single renewal's reply: `{ code, value }`,
/// or a permit's `{ code }`.
fn per_lease(items: &[RenewItem<'_>], chunk: &[usize], reply: &Value) -> Option<Vec<Value>> {
    match reply {
        Value::Array(values) if values.len() == 2 * chunk.len() => Some(
            chunk
                .iter()
                .zip(values.chunks(2))
                .map(|(&i, pair)| match (items[i].kind, pair) {
                    (LeaseKind::Permit, [code @ Value::Int(0 | 1), _]) => {
                        Value::Array(vec![code.clone()])
                    }
                    _ => Value::Array(pair.to_vec()),
                })
                .collect(),
        ),
        _ => None,
    }
}

/// Whether a lease's part of a cross-slot batch reply says its keys are not
/// served by the node that ran it (Redis: "Script attempted to access a non local
/// key in a cluster node", Valkey: "Attempted to access a non local key in a
/// cluster node"; a redirect or a cluster in flux, likewise).
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
fn not_local(reply: &Value) -> bool {
    let Value::Array(parts) = reply else {
        return false;
    };
    let [Value::Int(-1), Value::BulkString(message)] = parts.as_slice() else {
        return false;
    };
    let message = String::from_utf8_lossy(message);
    message.contains("non local key")
        || ["MOVED ", "ASK ", "CLUSTERDOWN ", "TRYAGAIN "]
            .iter()
            .any(|code| message.starts_with(code))
}

/// One lease's part of a batch reply.
fn decode(item: &RenewItem<'_>, reply: &Value, too_few: Option<&RedisError>) -> Result<Renewal> {
    if let Value::Array(parts) = reply
        && let [Value::Int(-1), Value::BulkString(message)] = parts.as_slice()
    {
        return Err(map_err(item.key, Phase::Renewing, lease_error(message)));
    }
    if let Some(e) = too_few
        && first_is_one(reply)
    {
        return Err(map_err(item.key, Phase::Renewing, e.clone()));
    }
    match item.kind {
        LeaseKind::Permit => decode_permit_renewal(item.key, reply),
        _ => decode_renewal(item.key, reply),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The refusal of a key of another node, as the batch script's `pcall` hands
    /// it on, in the words of each engine.
    #[cfg(feature = "cluster")]
    #[test]
    fn a_non_local_key_is_recognised_in_the_words_of_either_engine() {
        let part = |message: &str| {
            Value::Array(vec![
                Value::Int(-1),
                Value::BulkString(message.as_bytes().to_vec()),
            ])
        };
        for message in [
            // Redis 7.0.15 (pcall hands on a string)
            "ERR Script attempted to access a non local key in a cluster node",
            // Valkey 9.1.2 (pcall hands on a table; the script takes its `err`)
            "ERR Attempted to access a non local key in a cluster node",
            "MOVED 3168 127.0.0.1:7001",
            "ASK 3168 127.0.0.1:7001",
        ] {
            assert!(not_local(&part(message)), "{message}");
        }
        assert!(!not_local(&part("OOM command not allowed")));
        assert!(!not_local(&Value::Int(1)));
    }

    #[test]
    fn a_lease_error_keeps_the_code_of_its_message() {
        let e = lease_error(b"WRONGTYPE the lock key holds a value of another type");
        assert_eq!(e.code(), Some("WRONGTYPE"));
        assert_eq!(
            e.detail(),
            Some("the lock key holds a value of another type")
        );
        let e = lease_error(b"user_script:1: something odd");
        assert_eq!(e.code(), Some("ERR"));
    }

    #[test]
    fn a_batch_reply_wrote_if_any_lease_was_re_armed() {
        let ints = |v: &[i64]| Value::Array(v.iter().map(|n| Value::Int(*n)).collect());
        assert!(any_renewed(&ints(&[0, 0, 1, 0])));
        assert!(!any_renewed(&ints(&[0, 0, 0, 0])));
        assert!(!any_renewed(&ints(&[0, 1, -1, 1])));
        assert!(!any_renewed(&Value::Array(vec![])));
        assert!(!any_renewed(&Value::Nil));
    }
}
