//! The oracle of the fault tests.
//!
//! * A **fenced resource** accepts a write only with a [`FencingToken`] greater
//!   than the last one it accepted: [`Fence`] in process, [`RedisFence`] in a
//!   Redis server that is never faulted (for holders in several processes).
//! * A [`History`] of critical sections (holders in one process) checks:
//!   - every grant was of a valid lease (`!is_lost()`, `valid_for() > 0`);
//!   - **no overlap**: two holders of a key never *believe* they hold at the same
//!     time. A holder's belief interval is `[grant, last check]`, where the last
//!     check is the latest moment it saw `is_lost() == false` just before a write
//!     (the time is taken before the check, so it lies inside the lease's
//!     validity). Overlaps are excused only when Redis lost its data (a kill and
//!     restart) while the earlier lease lived: invariant 1 assumes a backend that
//!     keeps its data;
//!   - **fenced order**: a lease acquired by a call that started after another
//!     section's grant has a greater epoch (this holds across data loss too: the
//!     epoch's floor is the server clock), and the handoff sequence within a lease
//!     grows in grant order.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lockflight::{FencingToken, LockGuard};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------
// Fenced resources
// ---------------------------------------------------------------------------

/// An in-process fenced resource: per key, the last accepted token and its
/// writer.
#[derive(Default)]
pub(crate) struct Fence {
    last: Mutex<HashMap<String, (FencingToken, String)>>,
}

impl Fence {
    /// Accepts the write iff `token` is greater than the last accepted one, or
    /// is that one and `writer` wrote it (a holder writes several times).
    pub(crate) fn write(&self, key: &str, token: FencingToken, writer: &str) -> bool {
        let mut last = lock(&self.last);
        let ok = last
            .get(key)
            .is_none_or(|(prev, by)| token > *prev || (token == *prev && by == writer));
        if ok {
            last.insert(key.to_owned(), (token, writer.to_owned()));
        }
        ok
    }
}

/// Compare-and-set of `(epoch, seq)` in a Redis hash (an equal token is accepted
/// from the writer that wrote it); every accepted write is appended to
/// `<name>:log` as `<writer> <epoch>.<seq>`.
const FENCE_SCRIPT: &str = r"
local e = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '-1')
local s = tonumber(redis.call('HGET', KEYS[1], 'seq') or '-1')
local w = redis.call('HGET', KEYS[1], 'writer')
local ne, ns = tonumber(ARGV[1]), tonumber(ARGV[2])
if ne > e or (ne == e and (ns > s or (ns == s and w == ARGV[3]))) then
  redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'seq', ARGV[2], 'writer', ARGV[3])
  redis.call('RPUSH', KEYS[1] .. ':log', ARGV[3] .. ' ' .. ARGV[1] .. '.' .. ARGV[2])
  return 1
end
return 0
";

/// A fenced resource in a Redis server that no test faults (`testkit::shared()`),
/// usable from several processes.
#[derive(Clone)]
pub(crate) struct RedisFence {
    con: redis::aio::MultiplexedConnection,
    script: Arc<redis::Script>,
}

impl RedisFence {
    pub(crate) async fn connect(url: &str) -> RedisFence {
        let client = redis::Client::open(url).expect("fence server url");
        RedisFence {
            con: testkit::connection_for(&client).await,
            script: Arc::new(redis::Script::new(FENCE_SCRIPT)),
        }
    }

    /// Writes as `writer` with `token` to the resource `name`; `true` if accepted.
    pub(crate) async fn write(&self, name: &str, token: FencingToken, writer: &str) -> bool {
        // Epochs are server time in µs (about 2^51): exact in Lua's doubles.
        assert!(token.epoch < (1 << 53) && token.seq < (1 << 53));
        let mut con = self.con.clone();
        let ok: i64 = self
            .script
            .key(name)
            .arg(token.epoch.to_string())
            .arg(token.seq.to_string())
            .arg(writer)
            .invoke_async(&mut con)
            .await
            .expect("the fence server answers");
        ok == 1
    }

    /// The accepted writes of `name`, in order: `(writer, token)`.
    pub(crate) async fn log(&self, name: &str) -> Vec<(String, FencingToken)> {
        let mut con = self.con.clone();
        let lines: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("{name}:log"))
            .arg(0)
            .arg(-1)
            .query_async(&mut con)
            .await
            .expect("LRANGE on the fence server");
        lines
            .iter()
            .map(|line| {
                let (writer, token) = line.split_once(' ').expect("<writer> <token>");
                let (epoch, seq) = token.split_once('.').expect("<epoch>.<seq>");
                (
                    writer.to_owned(),
                    FencingToken::new(epoch.parse().expect("epoch"), seq.parse().expect("seq")),
                )
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// History
// ---------------------------------------------------------------------------

/// One critical section.
#[derive(Clone, Debug)]
pub(crate) struct Section {
    /// Unique among all sections of the test binary (the fence's writer id).
    pub(crate) id: u64,
    pub(crate) key: String,
    pub(crate) holder: String,
    /// When the `lock()` call started.
    pub(crate) call: Instant,
    /// When it returned the guard.
    pub(crate) grant: Instant,
    pub(crate) token: FencingToken,
    /// `!is_lost() && valid_for() > 0` right at the grant.
    pub(crate) valid_at_grant: bool,
    pub(crate) valid_for_at_grant: Duration,
    /// The latest moment the holder saw its lease valid (taken just before the
    /// `is_lost()` check that said so).
    pub(crate) last_valid: Option<Instant>,
    pub(crate) writes_accepted: u32,
    pub(crate) writes_rejected: u32,
    /// A write was skipped because the holder saw its lease lost.
    pub(crate) saw_loss: bool,
}

/// Critical sections and data-loss events of one test, checked at the end.
#[derive(Default)]
pub(crate) struct History {
    sections: Mutex<Vec<Section>>,
    data_loss: Mutex<Vec<Instant>>,
}

/// A section in progress; [`finish`](Held::finish) records it.
pub(crate) struct Held {
    history: Arc<History>,
    section: Section,
}

impl History {
    pub(crate) fn new() -> Arc<History> {
        Arc::default()
    }

    /// Starts the section of a guard that `lock()` (called at `call`) just
    /// returned.
    pub(crate) fn granted(
        self: &Arc<Self>,
        key: &str,
        holder: impl Into<String>,
        call: Instant,
        guard: &LockGuard,
    ) -> Held {
        static IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let grant = Instant::now();
        let valid_for = guard.valid_for();
        let valid = !guard.is_lost() && !valid_for.is_zero();
        Held {
            history: Arc::clone(self),
            section: Section {
                id: IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                key: key.to_owned(),
                holder: holder.into(),
                call,
                grant,
                token: guard.fencing_token(),
                valid_at_grant: valid,
                valid_for_at_grant: valid_for,
                last_valid: valid.then_some(grant),
                writes_accepted: 0,
                writes_rejected: 0,
                saw_loss: false,
            },
        }
    }

    /// Redis is about to lose its data (called just before a kill).
    pub(crate) fn data_loss(&self) {
        lock(&self.data_loss).push(Instant::now());
    }

    /// Whether Redis lost its data at or after `from`.
    pub(crate) fn data_lost_since(&self, from: Instant) -> bool {
        lock(&self.data_loss).iter().any(|&k| k >= from)
    }

    pub(crate) fn sections(&self) -> Vec<Section> {
        lock(&self.sections).clone()
    }

    /// Checks everything; see [`Verdict`].
    pub(crate) fn check(&self) -> Verdict {
        let sections = self.sections();
        let losses = lock(&self.data_loss).clone();
        let mut verdict = Verdict {
            sections: sections.len(),
            ..Verdict::default()
        };
        let mut by_key: HashMap<&str, Vec<&Section>> = HashMap::new();
        for s in &sections {
            by_key.entry(&s.key).or_default().push(s);
            if !s.valid_at_grant {
                verdict.invalid_grants.push(format!(
                    "{} on {:?} granted {} with valid_for {:?} (lost at grant)",
                    s.holder, s.key, s.token, s.valid_for_at_grant
                ));
            }
            verdict.writes_accepted += u64::from(s.writes_accepted);
            verdict.writes_rejected += u64::from(s.writes_rejected);
        }
        for (key, mut list) in by_key {
            list.sort_by_key(|s| s.grant);
            // When each lease (key, epoch) was asked for: the earliest call of its
            // sections (the acquiring one's call precedes the epoch's minting).
            let mut lease_call: HashMap<u64, Instant> = HashMap::new();
            for s in &list {
                let e = lease_call.entry(s.token.epoch).or_insert(s.call);
                *e = (*e).min(s.call);
            }
            let data_lost_between =
                |from: Instant, to: Instant| losses.iter().any(|&k| k >= from && k <= to);

            // Overlap: sweep by grant, remembering the interval reaching furthest.
            let mut furthest: Option<&Section> = None;
            for s in &list {
                let Some(end) = s.last_valid else { continue };
                if let Some(prev) = furthest {
                    let prev_end = prev.last_valid.expect("only sections with an interval");
                    if s.grant < prev_end && prev.token != s.token {
                        let origin = lease_call[&prev.token.epoch];
                        if data_lost_between(origin, s.grant) {
                            verdict.excused_overlaps += 1;
                        } else {
                            verdict.overlaps.push(format!(
                                "key {key:?}: {} ({}) believed it held until {:?} after its \
                                 grant, but {} ({}) was granted {:?} after that grant",
                                prev.holder,
                                prev.token,
                                prev_end - prev.grant,
                                s.holder,
                                s.token,
                                s.grant - prev.grant,
                            ));
                        }
                    }
                    if end > prev_end {
                        furthest = Some(s);
                    }
                } else {
                    furthest = Some(s);
                }
            }

            // Fenced order across leases: prefix maximum of epochs by grant time.
            let grants: Vec<Instant> = list.iter().map(|s| s.grant).collect();
            let mut prefix_max = Vec::with_capacity(list.len());
            let mut max: Option<&Section> = None;
            for s in &list {
                if max.is_none_or(|m| s.token.epoch > m.token.epoch) {
                    max = Some(s);
                }
                prefix_max.push(max.expect("set"));
            }
            for s in list.iter().filter(|s| s.token.seq == 0) {
                let before = grants.partition_point(|&g| g < s.call);
                if before == 0 {
                    continue;
                }
                let m = prefix_max[before - 1];
                if m.token.epoch >= s.token.epoch {
                    verdict.order_violations.push(format!(
                        "key {key:?}: {} acquired epoch {} in a call that started {:?} after \
                         {} was granted epoch {}",
                        s.holder,
                        s.token.epoch,
                        s.call - m.grant,
                        m.holder,
                        m.token.epoch
                    ));
                }
            }
            // Within a lease: the handoff sequence grows in grant order.
            let mut last_seq: HashMap<u64, &Section> = HashMap::new();
            for s in &list {
                if let Some(prev) = last_seq.get(&s.token.epoch)
                    && prev.token.seq >= s.token.seq
                {
                    verdict.order_violations.push(format!(
                        "key {key:?}: {} was granted {} after {} was granted {}",
                        s.holder, s.token, prev.holder, prev.token
                    ));
                }
                last_seq.insert(s.token.epoch, s);
            }
        }
        verdict
    }
}

impl Held {
    /// Checks the lease just before a write to `fence`: `None` if the holder saw it
    /// lost (nothing written), else whether the fence accepted the write.
    pub(crate) fn write(&mut self, guard: &LockGuard, fence: &Fence) -> Option<bool> {
        let before = Instant::now();
        if guard.is_lost() {
            self.section.saw_loss = true;
            return None;
        }
        self.section.last_valid = Some(before);
        Some(self.write_unchecked(fence))
    }

    /// Records that the holder saw its lease valid now, with no write.
    pub(crate) fn still_valid(&mut self, guard: &LockGuard) -> bool {
        let before = Instant::now();
        if guard.is_lost() {
            self.section.saw_loss = true;
            return false;
        }
        self.section.last_valid = Some(before);
        true
    }

    /// Writes to `fence` without checking the lease first: for a holder that
    /// checked ([`still_valid`](Self::still_valid)) and then stalled.
    pub(crate) fn write_unchecked(&mut self, fence: &Fence) -> bool {
        let writer = self.section.id.to_string();
        let ok = fence.write(&self.section.key, self.section.token, &writer);
        if ok {
            self.section.writes_accepted += 1;
        } else {
            self.section.writes_rejected += 1;
        }
        ok
    }

    /// Records the section (call before releasing or dropping the guard).
    pub(crate) fn finish(self) -> Section {
        lock(&self.history.sections).push(self.section.clone());
        self.section
    }
}

/// What [`History::check`] found.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) sections: usize,
    pub(crate) invalid_grants: Vec<String>,
    pub(crate) overlaps: Vec<String>,
    /// Overlaps after Redis lost its data while the earlier lease lived.
    pub(crate) excused_overlaps: usize,
    pub(crate) order_violations: Vec<String>,
    pub(crate) writes_accepted: u64,
    pub(crate) writes_rejected: u64,
}

impl Verdict {
    /// Panics with every violation found (at most 10 of each kind shown).
    pub(crate) fn assert_clean(&self, what: &str) {
        let mut msg = String::new();
        for (name, list) in [
            ("grants of a lost lease", &self.invalid_grants),
            ("overlapping holders", &self.overlaps),
            ("fenced-order violations", &self.order_violations),
        ] {
            if !list.is_empty() {
                let _ = writeln!(msg, "{what}: {} {name}:", list.len());
                for line in list.iter().take(10) {
                    let _ = writeln!(msg, "  {line}");
                }
            }
        }
        assert!(msg.is_empty(), "{msg}{self:?}");
    }

    /// One line for the test's output.
    pub(crate) fn summary(&self) -> String {
        format!(
            "{} sections, writes accepted {} / rejected by the fence {}, overlaps {} \
             (excused by data loss {}), order violations {}, grants of lost leases {}",
            self.sections,
            self.writes_accepted,
            self.writes_rejected,
            self.overlaps.len(),
            self.excused_overlaps,
            self.order_violations.len(),
            self.invalid_grants.len()
        )
    }
}
