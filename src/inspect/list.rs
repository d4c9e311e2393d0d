//! Listing the held keys under a prefix: `SCAN` on one server, bounded.

use std::fmt;

use redis::aio::ConnectionLike;

use super::inspector::Inspector;
use crate::backend::redis::names::{lock_name, parse_lock_name};
use crate::error::{Phase, Result};
use crate::key::LockKey;

/// What holds a key that [`Inspector::list`] found: which of the key's locks
/// has a lease at the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum HeldKind {
    /// The mutex ([`Locker::lock`](crate::Locker::lock)).
    Mutex,
    /// The read-write lock's write lease.
    Write,
    /// The read-write lock's read leases.
    Read,
    /// The semaphore's permits.
    Semaphore,
}

impl HeldKind {
    /// Its name as the `lockflight` command prints it: `"mutex"`, `"write"`,
    /// `"read"`, `"semaphore"`.
    pub fn as_str(self) -> &'static str {
        match self {
            HeldKind::Mutex => "mutex",
            HeldKind::Write => "write",
            HeldKind::Read => "read",
            HeldKind::Semaphore => "semaphore",
        }
    }
}

impl fmt::Display for HeldKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A key found by [`Inspector::list`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListedKey {
    /// The key.
    pub key: LockKey,
    /// What holds it, in the order the scan met them.
    pub kinds: Vec<HeldKind>,
}

/// What [`Inspector::list`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Listing {
    /// Held keys, sorted.
    pub keys: Vec<ListedKey>,
    /// Whether the scan stopped at its bound before the end (more may exist).
    pub truncated: bool,
}

impl Inspector {
    /// The held keys under the prefix whose key starts with `key_prefix` (all
    /// with `""`): `SCAN MATCH` on one server, at most `max_keys` keys and
    /// `max_keys / 10 + 100` `SCAN` calls, so it is bounded on any database. On a
    /// Redis Cluster, run it on a plain connection to each primary: every name of
    /// a key lives in the key's slot, so each key is on exactly one of them.
    ///
    /// # Errors
    ///
    /// [`Error::NoPermission`](crate::error::Error::NoPermission) without `+scan`; otherwise as [`Inspector::key`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn list<C>(&self, conn: &mut C, key_prefix: &str, max_keys: usize) -> Result<Listing>
    where
        C: ConnectionLike + Send,
    {
        let probe = LockKey::from(format!("{key_prefix}*"));
        let mut pattern = lock_name(&self.prefix, &LockKey::from(key_prefix));
        pattern.pop(); // the closing brace: any key that starts with key_prefix
        for b in [b'*', b'}', b'*'] {
            pattern.push(b);
        }
        let glob_escaped: Vec<u8> = pattern
            .iter()
            .enumerate()
            .flat_map(|(i, &b)| {
                let special =
                    matches!(b, b'?' | b'[' | b']' | b'\\') || (b == b'*' && i + 3 < pattern.len());
                if special { vec![b'\\', b] } else { vec![b] }
            })
            .collect();
        let mut found: std::collections::BTreeMap<LockKey, Vec<HeldKind>> = Default::default();
        let mut cursor: u64 = 0;
        let mut truncated = false;
        let calls = max_keys / 10 + 100;
        for call in 0.. {
            if call >= calls || found.len() >= max_keys {
                truncated = cursor != 0 || call >= calls;
                break;
            }
            let (next, names): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&glob_escaped[..])
                .arg("COUNT")
                .arg(1000)
                .query_async(conn)
                .await
                .map_err(|e| crate::fence::redis_error(&probe, Phase::Inspecting, e))?;
            for name in names {
                let Some((key, suffix)) = parse_lock_name(&self.prefix, &name) else {
                    continue;
                };
                let kind = match suffix {
                    b"" => HeldKind::Mutex,
                    b":wr" => HeldKind::Write,
                    b":rd" => HeldKind::Read,
                    b":sem" => HeldKind::Semaphore,
                    _ => continue,
                };
                if found.len() < max_keys || found.contains_key(&key) {
                    let kinds = found.entry(key).or_default();
                    if !kinds.contains(&kind) {
                        kinds.push(kind);
                    }
                }
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        Ok(Listing {
            keys: found
                .into_iter()
                .map(|(key, kinds)| ListedKey { key, kinds })
                .collect(),
            truncated,
        })
    }
}
