//! The server's life: a restarted server ends every lease at once.
//!
//! A Redis without persistence that restarts (or a `FLUSHALL`) loses every lease
//! it granted, and the holders would only learn of it at their next renewal: until
//! then a holder believes it holds a lock that the server may already have granted
//! to someone else. So each server (each data set) gets a *life*: the server
//! `TIME` of the first lockflight script that ran on it, kept under
//! `<prefix>:life` (`lua/life.lua`). An instance remembers the life it saw last.
//!
//! * **The holder learns at once.** Whenever an instance hears the server again
//!   after losing it (the notification subscription is made again, which happens
//!   on every dropped connection: `notify`) and before anything is granted to it
//!   (every granting script runs the gate of `lua/life_gate.lua` first, and says
//!   so when the caller saw an earlier life), it compares lives; a different one
//!   marks every lease of the instance lost (`lease::RESTARTED` says why): mutex leases,
//!   cached ones, read and write leases, permits, and so leaderships.
//! * **Nobody is granted meanwhile.** A holder that is slow to reconnect (or
//!   partitioned) cannot learn anything, so the server itself waits: the first
//!   instance that knew an earlier life and asks anything of the new one writes a
//!   *hold* into the life, its start plus that instance's longest lease TTL, and
//!   every granting script, of every instance, answers "busy" until then. Every
//!   lease of the earlier life would have expired by then anyway (a lease is valid
//!   at most its TTL after its last renewal, which reached the server before the
//!   restart). This is the "delayed restart" of the Redlock paper, done by the
//!   instances that saw the restart instead of by the operator.
//!
//! # What the bound rests on
//!
//! * The hold starts when an instance of the earlier life reaches the new one.
//!   One that started after the restart knows no earlier life: if it is the first
//!   to ask, it is granted at once. Every instance that held or waited before the
//!   restart reconnects within the notifier's backoff (at most one second).
//! * The hold lasts the *reporting* instance's longest lease TTL. A fleet whose
//!   instances use different TTLs is covered up to the TTL of the instance that
//!   reports first (each later report can only lengthen the hold).
//! * A restart that keeps the data (RDB or AOF) keeps the life: leases written
//!   after the last save are lost without this signal, and learned at the next
//!   renewal, as before. So is a life key evicted (`maxmemory-policy` must not
//!   evict lockflight's keys), which then costs a false restart: every lease lost
//!   and a hold, never a double grant.
//! * A Cluster is not gated yet: its holders learn at the next renewal.
//!
//! A Sentinel failover keeps the life (it is replicated like every other key), so
//! a promoted replica that has the data is no restart; the replay (`replay`)
//! repeats the releases the failover lost. A promoted replica *without* the data
//! is one, and is treated as one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use redis::{Script, Value};

use super::{PRELUDE, millis};

/// `lua/life.lua`, which the gate and [`CHECK`] call.
const LIFE: &str = include_str!("lua/life.lua");
/// The gate every granting script runs first.
const GATE: &str = include_str!("lua/life_gate.lua");

/// A granting script: the prelude, the life and its gate, then `parts`.
pub(super) fn gated(parts: &[&str]) -> Script {
    Script::new(&format!("{PRELUDE}\n{LIFE}\n{GATE}\n{}", parts.join("\n")))
}

/// Reads (or starts) the life and returns `{ started, wait_ms }`.
static CHECK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}\n{LIFE}\nlocal started, wait = life_gate(KEYS[1], ARGV[1], tonumber(ARGV[2]) or 0)\n\
         return {{ started, wait }}"
    ))
});

/// What one backend knows of its server's life.
#[derive(Debug)]
pub(super) struct Life {
    /// `<prefix>:life`; `None` when not gated (a cluster).
    key: Option<Vec<u8>>,
    /// The life seen last (empty before the first).
    seen: Mutex<String>,
    /// The longest lease TTL asked for through this backend, in ms.
    longest_ms: AtomicU64,
}

impl Life {
    pub(super) fn new(prefix: &str, gated: bool) -> Life {
        Life {
            key: gated.then(|| format!("{prefix}:life").into_bytes()),
            seen: Mutex::new(String::new()),
            longest_ms: AtomicU64::new(0),
        }
    }

    /// A lease of `ttl` is asked for: the hold this instance reports covers it.
    pub(super) fn note_lease(&self, ttl: Duration) {
        self.longest_ms.fetch_max(millis(ttl), Ordering::Relaxed);
    }

    /// The keys and arguments of a granting script: the gate's, then the script's.
    pub(super) fn gate<'a>(
        &'a self,
        keys: &[&'a [u8]],
        args: &[&'a [u8]],
        seen: &'a str,
        grace: &'a str,
    ) -> (Vec<&'a [u8]>, Vec<&'a [u8]>) {
        let mut k = Vec::with_capacity(keys.len() + 1);
        let mut a = Vec::with_capacity(args.len() + 2);
        match &self.key {
            Some(key) => {
                k.push(key.as_slice());
                a.push(seen.as_bytes());
            }
            None => a.push(b"-".as_slice()),
        }
        a.push(grace.as_bytes());
        k.extend_from_slice(keys);
        a.extend_from_slice(args);
        (k, a)
    }

    /// The gate's arguments now: the life seen last, and the longest lease TTL.
    pub(super) fn args(&self) -> (String, String) {
        let seen = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (seen, self.longest_ms.load(Ordering::Relaxed).to_string())
    }

    /// The script that reads the life (`None` when not gated), with its key.
    pub(super) fn check(&self) -> Option<(&'static Script, &[u8])> {
        Some((&CHECK, self.key.as_deref()?))
    }

    /// `{ -5, started, wait_ms }`, the gate's answer, if `reply` is one.
    pub(super) fn held_reply(reply: &Value) -> Option<(String, u64)> {
        match reply {
            Value::Array(items) => match items.as_slice() {
                [Value::Int(-5), started, Value::Int(wait)] => {
                    Some((text(started)?, u64::try_from(*wait).unwrap_or(0)))
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// `{ started, wait_ms }`, the answer of [`check`](Self::check).
    pub(super) fn check_reply(reply: &Value) -> Option<(String, u64)> {
        match reply {
            Value::Array(items) => match items.as_slice() {
                [started, Value::Int(wait)] => {
                    Some((text(started)?, u64::try_from(*wait).unwrap_or(0)))
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// The server is in life `started`: returns whether that is a restart this
    /// instance had not seen (the caller then marks every lease lost).
    pub(super) fn saw(&self, started: &str) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if *seen == started {
            return false;
        }
        let restarted = !seen.is_empty();
        *seen = started.to_owned();
        restarted
    }

    /// A "busy" answer that every granting script's decoding reads as "ask again
    /// in `wait`": `{ 0, wait_ms, 0 }` (no lease, no permit, nobody else waiting).
    pub(super) fn busy(wait: Duration) -> Value {
        Value::Array(vec![
            Value::Int(0),
            Value::Int(i64::try_from(wait.as_millis()).unwrap_or(i64::MAX)),
            Value::Int(0),
        ])
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}
