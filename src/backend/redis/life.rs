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
//!   *quarantine* into the life, its start plus that instance's longest lease TTL, and
//!   every granting script, of every instance, answers "busy" until then. Every
//!   lease of the earlier life would have expired by then anyway (a lease is valid
//!   at most its TTL after its last renewal, which reached the server before the
//!   restart). This is the "delayed restart" of the Redlock paper, done by the
//!   instances that saw the restart instead of by the operator.
//!
//! # What the bound rests on
//!
//! * The quarantine starts when an instance of the earlier life reaches the new one.
//!   One that started after the restart knows no earlier life: if it is the first
//!   to ask, it is granted at once. Every instance that held or waited before the
//!   restart reconnects within the notifier's backoff (at most one second).
//! * The quarantine lasts the *reporting* instance's longest lease TTL. A fleet whose
//!   instances use different TTLs is covered up to the TTL of the instance that
//!   reports first (each later report can only lengthen the quarantine).
//! * A restart that keeps the data (RDB or AOF) keeps the life: leases written
//!   after the last save are lost without this signal, and learned at the next
//!   renewal, as before. An evicted life key (`maxmemory-policy` must not evict
//!   lockflight's keys) costs a false restart: every lease lost and a quarantine, never
//!   a double grant.
//! * An instance that never asked for a lease would report a quarantine of zero: it
//!   keeps the earlier life when it checks, and reports the restart at its first
//!   grant, with that grant's TTL.
//! * A renewal answered "not the owner" reads the life of its place before it
//!   reports, so a holder whose renewal meets the restarted server first learns
//!   the reason too.
//! * On a Cluster each slot has a life of its own (`<prefix>:life:{<tag>}`, a
//!   tag that hashes to the slot), because a script reaches one slot only; an
//!   instance keeps the life of each slot it asked in. So a restarted primary is
//!   learned slot by slot, by the gate (the subscription is made on one node,
//!   and says nothing of the others), and its holders learn at their next
//!   renewal or grant in the slot; the quarantine is written by the first instance
//!   that asked in the slot before the restart, and one that never did is
//!   granted at once if it asks first.
//!
//! # Grants delayed past their release record
//!
//! The gate also refuses a grant that reaches the server later than a release
//! record's lifetime after it was sent ([`GateArgs::not_after`]): a token is never
//! granted again once its release was sent, and the release record that enforces
//! it lives only that long (ARCHITECTURE.md, "The order of requests").
//!
//! A Sentinel failover keeps the life (it is replicated like every other key), so
//! a promoted replica that has the data is no restart; the replay (`replay`)
//! repeats the releases the failover lost. A promoted replica *without* the data
//! is one, and is treated as one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::{Script, Value};

use super::slots::slot;
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

/// What one backend knows of its server's life: of one place (the server; on a
/// Cluster, each slot it asked in).
#[derive(Debug)]
pub(super) struct Life {
    prefix: String,
    cluster: bool,
    /// By slot (always 0 but on a Cluster).
    places: Mutex<HashMap<u16, Place>>,
    /// The longest lease TTL asked for through this backend, in ms.
    longest_ms: AtomicU64,
    /// How long a release record lives (ms): a grant that reaches the server
    /// later than that after it was sent is refused (see [`GateArgs`]).
    record_ttl_ms: u64,
}

/// One place's life, as this instance knows it.
#[derive(Debug)]
struct Place {
    /// The life key.
    key: Vec<u8>,
    /// The life seen last (empty before the first).
    seen: String,
    /// A reading of the server's clock (ms) and when its reply arrived here: the
    /// server's time then was at least that.
    clock: Option<(u64, Instant)>,
}

/// The gate's arguments for one request, sent now.
pub(super) struct GateArgs {
    /// The place the request goes to.
    pub(super) slot: u16,
    key: Vec<u8>,
    seen: String,
    grace: String,
    /// A lower bound of the server's clock now (the last reading, plus the time
    /// since its reply arrived, less the drift allowance), plus a release
    /// record's lifetime; empty before the first reading. A copy of a grant that
    /// lands later than that may belong to a lease whose release record has
    /// expired (a release is sent after its acquire, and its record lives that
    /// long from then), so the gate refuses it: a token whose release record is
    /// gone can never be granted again.
    not_after: String,
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

/// A tag whose hash slot is `slot` (the smallest decimal number that has it).
fn tag(slot_wanted: u16) -> &'static str {
    /// Every slot's tag, found once per process (some 170,000 numbers are tried).
    static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
        let mut tags = vec![String::new(); 16_384];
        let mut missing = tags.len();
        for n in 0u32.. {
            let text = n.to_string();
            let at = usize::from(slot(text.as_bytes()));
            if tags[at].is_empty() {
                tags[at] = text;
                missing -= 1;
                if missing == 0 {
                    break;
                }
            }
        }
        tags
    });
    &TAGS[usize::from(slot_wanted)]
}

impl Life {
    pub(super) fn new(prefix: &str, cluster: bool, record_ttl_ms: u64) -> Life {
        Life {
            prefix: prefix.to_owned(),
            cluster,
            places: Mutex::new(HashMap::new()),
            longest_ms: AtomicU64::new(0),
            record_ttl_ms,
        }
    }

    /// The place of a script whose own keys are `keys` (they share one slot).
    pub(super) fn place_of(&self, keys: &[&[u8]]) -> u16 {
        match keys.first() {
            Some(key) if self.cluster => slot(key),
            _ => 0,
        }
    }

    fn with_place<T>(&self, slot_of: u16, f: impl FnOnce(&mut Place) -> T) -> T {
        let mut places = self.places.lock().unwrap_or_else(PoisonError::into_inner);
        let place = places.entry(slot_of).or_insert_with(|| Place {
            key: if self.cluster {
                format!("{}:life:{{{}}}", self.prefix, tag(slot_of)).into_bytes()
            } else {
                format!("{}:life", self.prefix).into_bytes()
            },
            seen: String::new(),
            clock: None,
        });
        f(place)
    }

    /// A lease of `ttl` is asked for: the quarantine this instance reports covers it.
    pub(super) fn note_lease(&self, ttl: Duration) {
        self.longest_ms.fetch_max(millis(ttl), Ordering::Relaxed);
    }

    /// The gate's arguments for a request to `slot_of`, sent now.
    /// The life key of the place `slot_of` (see [`place_of`](Self::place_of)).
    pub(super) fn key_of(&self, slot_of: u16) -> Vec<u8> {
        self.with_place(slot_of, |place| place.key.clone())
    }

    pub(super) fn gate_args(&self, slot_of: u16) -> GateArgs {
        let grace = self.longest_ms.load(Ordering::Relaxed).to_string();
        let record_ttl_ms = self.record_ttl_ms;
        self.with_place(slot_of, |place| GateArgs {
            slot: slot_of,
            key: place.key.clone(),
            seen: place.seen.clone(),
            grace,
            not_after: place.clock.map_or_else(String::new, |(read, at)| {
                let since = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
                let lower = read.saturating_add(since - since * DRIFT_PER_MILLE / 1000);
                lower.saturating_add(record_ttl_ms).to_string()
            }),
        })
    }

    /// The keys and arguments of a granting script: the gate's, then the script's.
    pub(super) fn gate<'a>(
        gate_args: &'a GateArgs,
        keys: &[&'a [u8]],
        args: &[&'a [u8]],
    ) -> (Vec<&'a [u8]>, Vec<&'a [u8]>) {
        let mut k = Vec::with_capacity(keys.len() + 1);
        k.push(gate_args.key.as_slice());
        k.extend_from_slice(keys);
        let mut a = Vec::with_capacity(args.len() + 3);
        a.extend([
            gate_args.seen.as_bytes(),
            gate_args.grace.as_bytes(),
            gate_args.not_after.as_bytes(),
        ]);
        a.extend_from_slice(args);
        (k, a)
    }

    /// The script that reads the life of `slot_of`, and its arguments.
    pub(super) fn check(&self, slot_of: u16) -> (&'static Script, GateArgs) {
        (&*CHECK, self.gate_args(slot_of))
    }

    /// Whether the lives are per slot (a Cluster).
    pub(super) fn is_per_slot(&self) -> bool {
        self.cluster
    }

    /// What the gate said in `reply` to a request to `slot_of` (the reply arrived
    /// at `at`), keeping the server's clock reading it carries.
    pub(super) fn gate_reply(&self, slot_of: u16, reply: &Value, at: Instant) -> Gate {
        let Value::Array(items) = reply else {
            return Gate::Ran;
        };
        let (gate, now) = match items.as_slice() {
            [Value::Int(-6), Value::Int(now)] => (Gate::TooLate, now),
            [Value::Int(-5), started, Value::Int(wait), Value::Int(now)] => match text(started) {
                Some(started) => (Gate::Life(started, u64::try_from(*wait).unwrap_or(0)), now),
                None => return Gate::Ran,
            },
            _ => return Gate::Ran,
        };
        let now = u64::try_from(*now).unwrap_or(0);
        self.with_place(slot_of, |place| place.clock = Some((now, at)));
        gate
    }

    /// The life of `slot_of` in the answer of [`check`](Self::check) (which arrived at `at`),
    /// keeping the server's clock reading it carries.
    pub(super) fn check_reply(&self, slot_of: u16, reply: &Value, at: Instant) -> Option<String> {
        let Value::Array(items) = reply else {
            return None;
        };
        let [started, Value::Int(_wait), Value::Int(now)] = items.as_slice() else {
            return None;
        };
        let started = text(started)?;
        let now = u64::try_from(*now).unwrap_or(0);
        self.with_place(slot_of, |place| place.clock = Some((now, at)));
        Some(started)
    }

    /// The place `slot_of` is in life `started`: returns whether that is a
    /// restart this instance had not seen (the caller then marks every lease of
    /// that place lost).
    pub(super) fn saw(&self, slot_of: u16, started: &str) -> bool {
        self.with_place(slot_of, |place| {
            if place.seen == started {
                return false;
            }
            let restarted = !place.seen.is_empty();
            started.clone_into(&mut place.seen);
            restarted
        })
    }

    /// Whether a lease whose lock name is `lock` is in `slot_of`.
    pub(super) fn holds_in(&self, slot_of: u16, lock: &[u8]) -> bool {
        !self.cluster || slot(lock) == slot_of
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

impl GateArgs {
    /// Whether `started` is a life other than the one seen last, itself known.
    pub(super) fn is_restart(&self, started: &str) -> bool {
        !self.seen.is_empty() && self.seen != started
    }

    /// Whether this instance never asked for a lease (it reports no quarantine).
    pub(super) fn grace_is_zero(&self) -> bool {
        self.grace == "0"
    }

    /// The arguments of [`CHECK`].
    pub(super) fn check_args(&self) -> ([&[u8]; 1], [&[u8]; 2]) {
        ([&self.key], [self.seen.as_bytes(), self.grace.as_bytes()])
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_hashes_to_its_slot() {
        for wanted in [0, 1, 5461, 10922, 16383] {
            assert_eq!(slot(tag(wanted).as_bytes()), wanted);
        }
    }
}
