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
//! # Grants delayed past their release record
//!
//! The gate also refuses a grant that reaches the server later than a release
//! record's lifetime after it was sent ([`Life::not_after`]): a token is never
//! granted again once its release was sent, and the release record that enforces
//! it lives only that long (ARCHITECTURE.md, "The order of requests").
//!
//! A Sentinel failover keeps the life (it is replicated like every other key), so
//! a promoted replica that has the data is no restart; the replay (`replay`)
//! repeats the releases the failover lost. A promoted replica *without* the data
//! is one, and is treated as one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

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

/// Reads (or starts) the life and returns `{ started, wait_ms, now_ms }`.
static CHECK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{PRELUDE}\n{LIFE}\nlocal started, wait = life_gate(KEYS[1], ARGV[1], tonumber(ARGV[2]) or 0)\n\
         return {{ started, wait, now().ms }}"
    ))
});

/// How much faster than this process's monotonic clock the server's clock is
/// assumed to run at most, as a fraction (1/1000): what a lower bound of the
/// server's time, extrapolated from a sample, gives away per second.
const DRIFT_PER_MILLE: u64 = 1;

/// What one backend knows of its server's life.
#[derive(Debug)]
pub(super) struct Life {
    /// `<prefix>:life`; `None` when not gated (a cluster).
    key: Option<Vec<u8>>,
    /// The life seen last (empty before the first).
    seen: Mutex<String>,
    /// The longest lease TTL asked for through this backend, in ms.
    longest_ms: AtomicU64,
    /// A reading of the server's clock (ms) and when its reply arrived here: the
    /// server's time then was at least that.
    clock: Mutex<Option<(u64, Instant)>>,
    /// How long a release record lives (ms): a grant that reaches the server
    /// later than that after it was sent is refused (see [`not_after`](Self::not_after)).
    record_ttl_ms: u64,
}

/// What a gate answered instead of running its script.
pub(super) enum Gate {
    /// The script ran: its own reply.
    Ran,
    /// The server's life (`started`) and how long grants wait.
    Life(String, u64),
    /// The request arrived too late to apply: nothing changed.
    TooLate,
}

impl Life {
    pub(super) fn new(prefix: &str, gated: bool, record_ttl_ms: u64) -> Life {
        Life {
            key: gated.then(|| format!("{prefix}:life").into_bytes()),
            seen: Mutex::new(String::new()),
            longest_ms: AtomicU64::new(0),
            clock: Mutex::new(None),
            record_ttl_ms,
        }
    }

    /// The server's clock read `now_ms` in a reply that arrived at `at`.
    pub(super) fn clock_read(&self, now_ms: u64, at: Instant) {
        *self.clock.lock().unwrap_or_else(PoisonError::into_inner) = Some((now_ms, at));
    }

    /// The gate's "too late after" for a request sent now: a lower bound of the
    /// server's clock now (the last reading, plus the time since its reply
    /// arrived, less the drift allowance), plus a release record's lifetime.
    ///
    /// A copy of a grant that lands later than that may belong to a lease whose
    /// release record has expired (a release is sent after its acquire, and its
    /// record lives that long from then), so the gate refuses it: a token whose
    /// release record is gone can never be granted again. Empty before the first
    /// reading.
    pub(super) fn not_after(&self) -> String {
        let Some((read, at)) = *self.clock.lock().unwrap_or_else(PoisonError::into_inner) else {
            return String::new();
        };
        let since = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
        let lower = read.saturating_add(since - since * DRIFT_PER_MILLE / 1000);
        lower.saturating_add(self.record_ttl_ms).to_string()
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
        not_after: &'a str,
    ) -> (Vec<&'a [u8]>, Vec<&'a [u8]>) {
        let mut k = Vec::with_capacity(keys.len() + 1);
        let mut a = Vec::with_capacity(args.len() + 3);
        match &self.key {
            Some(key) => {
                k.push(key.as_slice());
                a.push(seen.as_bytes());
            }
            None => a.push(b"-".as_slice()),
        }
        a.push(grace.as_bytes());
        a.push(not_after.as_bytes());
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

    /// What the gate said in `reply` (which arrived at `at`), keeping the
    /// server's clock reading it carries.
    pub(super) fn gate_reply(&self, reply: &Value, at: Instant) -> Gate {
        let Value::Array(items) = reply else {
            return Gate::Ran;
        };
        match items.as_slice() {
            [Value::Int(-6), Value::Int(now)] => {
                self.clock_read(u64::try_from(*now).unwrap_or(0), at);
                Gate::TooLate
            }
            [Value::Int(-5), started, Value::Int(wait), Value::Int(now)] => match text(started) {
                Some(started) => {
                    self.clock_read(u64::try_from(*now).unwrap_or(0), at);
                    Gate::Life(started, u64::try_from(*wait).unwrap_or(0))
                }
                None => Gate::Ran,
            },
            _ => Gate::Ran,
        }
    }

    /// The life in the answer of [`check`](Self::check) (which arrived at `at`),
    /// keeping the server's clock reading it carries.
    pub(super) fn check_reply(&self, reply: &Value, at: Instant) -> Option<String> {
        match reply {
            Value::Array(items) => match items.as_slice() {
                [started, Value::Int(_wait), Value::Int(now)] => {
                    let started = text(started)?;
                    self.clock_read(u64::try_from(*now).unwrap_or(0), at);
                    Some(started)
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
