//! Batched renewal: [`LockBackend::extend_batch`](crate::backend::LockBackend::extend_batch)
//! for Redis.
//!
//! The watchdog hands over the leases due in one scan. They are renewed by
//! `lua/extend_batch.lua`, up to [`CHUNK`] leases per call, of any kinds mixed: per
//! lease, the script runs the very function of `lua/renew.lua` that the lease's own
//! renewal script runs, so each lease gets the reply its single renewal would get,
//! and an error of one lease (a value of another type) is that lease's alone. A
//! chunk of one lease runs the lease's own script.
//!
//! * **One server, Sentinel**: `ceil(leases / CHUNK)` script calls per scan, sent
//!   at once on the shared connection (on Sentinel through the same primary
//!   resolution as a single renewal: a `READONLY` chunk is never re-run on the new
//!   primary, so every lease in it is lost, as each alone would be).
//! * **Cluster**: a script may only declare keys of one cluster slot, so leases are
//!   grouped by slot and each slot's leases chunked: one call per slot in use (per
//!   chunk), all sent at once; the cluster client writes the calls for one node on
//!   that node's connection back to back, so a scan costs about one round trip per
//!   node, but as many script calls as slots in use (at most 16,384). Leases whose
//!   keys share a hash tag share a slot, so their renewal shares a call. That is
//!   short of O(nodes) calls: 10,000 leases on random keys use some 7,000 slots.
//!   A script without flags may touch undeclared keys of other slots of its node,
//!   which would make it one call per node, but Redis discourages undeclared keys
//!   and 7.2.0–7.2.4 mishandle them (redis#12906), and a resharding would fail
//!   such calls; not done.
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

use futures::future::join_all;
use redis::{RedisError, Value};

use super::acked::{LeaseScript, first_is_one};
use super::rw::{RwNames, fence_ttl_ms};
use super::semaphore::{SemNames, decode_permit_extend};
use super::{Names, RedisBackend, decode_extend, map_err, millis, renewal_script, unexpected};
use crate::backend::{Extend, LeaseKind, RenewItem, extend_one};
use crate::error::{Phase, Result};

/// At most this many leases per script call: measured at 2.2 ms of server time per
/// call (about 4.4 µs per lease, mixed kinds; `measure_batched_renewal` in
/// `tests/redis_lock/renewal_batch.rs`), so a call holds Redis no longer than a
/// few milliseconds.
pub(super) const CHUNK: usize = 500;

pub(super) static EXTEND_BATCH: LeaseScript = LeaseScript::renewal(
    || renewal_script(include_str!("lua/extend_batch.lua")),
    any_renewed,
);

/// Whether a batch reply re-armed at least one lease (then `replica_ack` waits).
fn any_renewed(reply: &Value) -> bool {
    matches!(reply, Value::Array(items) if items.iter().any(first_is_one))
}

/// The script's argument for a lease kind.
fn kind_arg(kind: LeaseKind) -> &'static [u8] {
    match kind {
        LeaseKind::Lock => b"m",
        LeaseKind::Read => b"r",
        LeaseKind::Write => b"w",
        LeaseKind::Permit => b"p",
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

impl RedisBackend {
    /// See the module docs.
    pub(super) async fn renew_batch(&self, items: &[RenewItem<'_>]) -> Vec<Result<Extend>> {
        if items.len() <= 1 {
            return join_all(items.iter().map(|item| extend_one(self, item))).await;
        }
        let chunks = self.chunks(items);
        let replies = join_all(chunks.iter().map(|chunk| self.renew_chunk(items, chunk))).await;
        let mut out: Vec<Option<Result<Extend>>> = (0..items.len()).map(|_| None).collect();
        for (chunk, results) in chunks.iter().zip(replies) {
            for (&i, result) in chunk.iter().zip(results) {
                out[i] = Some(result);
            }
        }
        out.into_iter()
            .zip(items)
            .map(|(result, item)| {
                result.unwrap_or_else(|| {
                    Err(crate::Error::backend(
                        item.key,
                        Phase::Renewing,
                        "the batch renewal gave no answer for this lease",
                    ))
                })
            })
            .collect()
    }

    /// The indices of `items`, in groups that one script call may renew: by cluster
    /// slot on a cluster, then at most [`CHUNK`] each.
    fn chunks(&self, items: &[RenewItem<'_>]) -> Vec<Vec<usize>> {
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        let by_slot = self.inner.conn.is_cluster();
        for (i, item) in items.iter().enumerate() {
            let slot = if by_slot {
                super::replay::slot(&Names::new(&self.inner.prefix, item.key).lock)
            } else {
                0
            };
            groups.entry(slot).or_default().push(i);
        }
        groups
            .into_values()
            .flat_map(|group| {
                group
                    .chunks(CHUNK)
                    .map(<[usize]>::to_vec)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Renews `items[i]` for each `i` of `chunk` (one slot's) in one script call;
    /// returns their results in the order of `chunk`.
    async fn renew_chunk(&self, items: &[RenewItem<'_>], chunk: &[usize]) -> Vec<Result<Extend>> {
        if let [i] = chunk {
            return vec![extend_one(self, &items[*i]).await];
        }
        let inner = &*self.inner;
        let mut keys: Vec<Vec<u8>> = Vec::with_capacity(chunk.len() * 4);
        let mut args: Vec<Vec<u8>> = Vec::with_capacity(2 + chunk.len() * 4);
        args.push(inner.instance_id.as_bytes().to_vec());
        args.push(chunk.len().to_string().into_bytes());
        for &i in chunk {
            let item = &items[i];
            match item.kind {
                LeaseKind::Lock => {
                    let n = Names::new(&inner.prefix, item.key);
                    keys.extend([n.lock, n.fence, n.queue, n.queue_expiry]);
                }
                LeaseKind::Read | LeaseKind::Write => {
                    let n = RwNames::new(&inner.prefix, item.key);
                    keys.extend([n.readers, n.writer, n.writers, n.fence]);
                }
                LeaseKind::Permit => {
                    let n = SemNames::new(&inner.prefix, item.key);
                    keys.extend([n.permits, n.count]);
                }
            }
            args.extend([
                kind_arg(item.kind).to_vec(),
                item.token.to_hex().into_bytes(),
                millis(item.ttl).to_string().into_bytes(),
                fence_ttl_ms(item.ttl).to_string().into_bytes(),
            ]);
        }
        let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let (reply, too_few) = match inner.invoke_lease_acked(&EXTEND_BATCH, &keys, &args).await {
            Ok(answer) => answer,
            Err(e) => {
                return chunk
                    .iter()
                    .map(|&i| Err(map_err(items[i].key, Phase::Renewing, e.clone())))
                    .collect();
            }
        };
        let replies = match &reply {
            Value::Array(replies) if replies.len() == chunk.len() => replies,
            _ => {
                return chunk
                    .iter()
                    .map(|&i| Err(unexpected(items[i].key, Phase::Renewing, &reply)))
                    .collect();
            }
        };
        chunk
            .iter()
            .zip(replies)
            .map(|(&i, reply)| decode(&items[i], reply, too_few.as_ref()))
            .collect()
    }
}

/// One lease's part of a batch reply.
fn decode(item: &RenewItem<'_>, reply: &Value, too_few: Option<&RedisError>) -> Result<Extend> {
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
        LeaseKind::Permit => decode_permit_extend(item.key, reply),
        _ => decode_extend(item.key, reply),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(any_renewed(&Value::Array(vec![ints(&[0, 0]), ints(&[1])])));
        assert!(!any_renewed(&Value::Array(vec![ints(&[0, 0]), ints(&[0])])));
        assert!(!any_renewed(&Value::Array(vec![])));
        assert!(!any_renewed(&Value::Nil));
    }
}
