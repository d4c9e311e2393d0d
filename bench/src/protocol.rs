//! The coordinator ↔ worker protocol (see the crate docs): the worker spec on the
//! worker's stdin, `LFBENCH` lines on its stdout, the `GO` start barrier. The spec
//! and the result are typed: a missing or unknown field fails to parse instead of
//! silently reading as zero.

use std::io::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::config::{Mode, Workload};

/// Set (to anything) in a worker process's environment.
pub const WORKER_ENV: &str = "LOCKFLIGHT_BENCH_WORKER";
/// Marks the protocol lines on a worker's stdout (other output is ignored).
const MARK: &str = "LFBENCH ";

/// What one worker process runs: the coordinator's first line on its stdin.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkerSpec {
    pub(crate) id: u64,
    pub(crate) url: String,
    /// Every Redis name of the point starts with it.
    pub(crate) prefix: String,
    pub(crate) workload: Workload,
    pub(crate) mode: Mode,
    pub(crate) tasks: usize,
    /// Tokio worker threads; 0 = current-thread runtime.
    pub(crate) threads: usize,
    pub(crate) seed: u64,
}

/// What one worker process measured (`LFBENCH RESULT <json>`).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WorkerResult {
    pub(crate) id: u64,
    pub(crate) sections: u64,
    /// Time inside the critical sections (the GET + SET of the counter, and the hold
    /// of `hotkey-rmw-hold1ms`; not the lock's acquire and release), summed over this
    /// worker's sections, µs. The coordinator's efficiency of a hot key.
    pub(crate) section_us: u64,
    pub(crate) elapsed_us: u64,
    /// Client-side requests `[acquire, release, renew, leave]` (the plain lock:
    /// `[SET NX attempts, releases, 0, 0]`).
    pub(crate) requests: [u64; 4],
    /// The locker's counters over the run; `null` for the modes without a locker.
    /// Required (`deserialize_with` keeps serde from defaulting a missing field to
    /// `None`, which would skip the lease-lost and timeout oracles).
    #[serde(deserialize_with = "Option::deserialize")]
    pub(crate) stats: Option<LockStats>,
    /// The lock-wait histogram: `[value µs, count]` pairs.
    pub(crate) hist: Vec<[u64; 2]>,
    /// One per critical section: `[key index, counter value read, epoch, seq, start,
    /// end]`, start and end the section's own, in unix µs.
    pub(crate) records: Vec<[u64; 6]>,
    /// Errors of the tasks (a lock or release that failed ends its task).
    pub(crate) errors: Vec<String>,
}

/// A worker's `Locker::stats()` delta over the measured run, and the slots left.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LockStats {
    pub(crate) acquire_attempts: u64,
    pub(crate) acquired: u64,
    pub(crate) local_waits: u64,
    pub(crate) handoffs: u64,
    pub(crate) releases: u64,
    pub(crate) renewals: u64,
    pub(crate) leases_lost: u64,
    pub(crate) timeouts: u64,
    /// Keys still in the locker's slot map after every task finished.
    pub(crate) active_keys: u64,
}

/// A message from a worker's stdout.
pub(crate) enum Msg {
    Ready,
    Result(Box<WorkerResult>),
    Error(String),
    Eof,
}

impl Msg {
    /// The message on a line of a worker's stdout, if it is a protocol line.
    pub(crate) fn parse(line: &str) -> Option<Msg> {
        let at = line.find(MARK)?;
        let rest = &line[at + MARK.len()..];
        let (kind, payload) = rest.split_once(' ').unwrap_or((rest, ""));
        Some(match kind {
            "READY" => Msg::Ready,
            "RESULT" => match serde_json::from_str(payload) {
                Ok(v) => Msg::Result(Box::new(v)),
                Err(e) => Msg::Error(format!("unparsable result: {e}")),
            },
            _ => Msg::Error(payload.to_owned()),
        })
    }
}

/// Prints a protocol line on stdout.
pub(crate) fn emit(kind: &str, payload: &str) {
    let mut out = std::io::stdout().lock();
    // A leading newline: libtest may have printed "test x ... " on this line.
    let _ = writeln!(out, "\n{MARK}{kind} {payload}");
    let _ = out.flush();
}

/// The start barrier's line: everyone starts at `start` and stops at `end` (unix µs).
pub(crate) fn go_line(start: u64, end: u64) -> String {
    format!("GO {start} {end}\n")
}

/// Parses [`go_line`]: the start and end instants.
pub(crate) fn parse_go(go: &str) -> Result<(Instant, Instant), String> {
    let mut parts = go.split_whitespace();
    let (Some("GO"), Some(start), Some(end)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("expected GO, got {go:?}"));
    };
    let start: u64 = start.parse().map_err(|_| "bad GO start")?;
    let end: u64 = end.parse().map_err(|_| "bad GO end")?;
    Ok((instant_at(start), instant_at(end)))
}

pub(crate) fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The monotonic instant of a unix time in µs (same machine, same clock).
fn instant_at(at_us: u64) -> Instant {
    let (now, now_us) = (Instant::now(), unix_us());
    if at_us >= now_us {
        now + Duration::from_micros(at_us - now_us)
    } else {
        now.checked_sub(Duration::from_micros(now_us - at_us))
            .unwrap_or(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result_json() -> serde_json::Value {
        serde_json::json!({
            "id": 1, "sections": 3, "section_us": 120, "elapsed_us": 500, "requests": [3, 3, 0, 0],
            "stats": null, "hist": [[10, 3]], "records": [[0, 0, 0, 0, 10, 50]], "errors": [],
        })
    }

    #[test]
    fn a_complete_result_parses() {
        let r: WorkerResult = serde_json::from_value(result_json()).expect("parses");
        assert_eq!((r.id, r.sections, r.requests[0]), (1, 3, 3));
        assert!(r.stats.is_none());
    }

    /// The old untyped reader turned a missing field into 0 (or skipped the oracle
    /// of a missing `stats`); now every field is required.
    #[test]
    fn a_missing_or_unknown_field_is_an_error() {
        for field in [
            "sections",
            "section_us",
            "stats",
            "records",
            "errors",
            "requests",
        ] {
            let mut v = result_json();
            v.as_object_mut().expect("an object").remove(field);
            let e = serde_json::from_value::<WorkerResult>(v).expect_err(field);
            assert!(e.to_string().contains(field), "{field}: {e}");
        }
        let mut v = result_json();
        v["stats"] = serde_json::json!({ "acquired": 1 });
        assert!(serde_json::from_value::<WorkerResult>(v).is_err());
        let mut v = result_json();
        v["sectoins"] = 3.into();
        assert!(serde_json::from_value::<WorkerResult>(v).is_err());
    }

    #[test]
    fn the_spec_round_trips_with_names() {
        let spec = WorkerSpec {
            id: 2,
            url: "redis://127.0.0.1:1".into(),
            prefix: "p".into(),
            workload: Workload::HotkeyHold,
            mode: Mode::Handoff,
            tasks: 4,
            threads: 0,
            seed: 7,
        };
        let line = serde_json::to_string(&spec).expect("serializes");
        assert!(
            line.contains(r#""workload":"hotkey-rmw-hold1ms""#),
            "{line}"
        );
        assert!(line.contains(r#""mode":"handoff""#), "{line}");
        let back: WorkerSpec = serde_json::from_str(&line).expect("parses");
        assert_eq!(
            (back.workload, back.mode, back.tasks),
            (spec.workload, spec.mode, 4)
        );
        for name in Workload::ALL.map(Workload::name) {
            assert_eq!(Workload::parse(name).map(Workload::name), Some(name));
        }
    }

    #[test]
    fn protocol_lines() {
        assert!(matches!(
            Msg::parse("test x ... LFBENCH READY 3"),
            Some(Msg::Ready)
        ));
        assert!(Msg::parse("running 1 test").is_none());
        assert!(matches!(
            Msg::parse("LFBENCH RESULT {}"),
            Some(Msg::Error(_))
        ));
        let (s, e) = parse_go(&go_line(unix_us(), unix_us() + 1_000_000)).expect("GO");
        assert!(e > s);
        assert!(parse_go("GO 1").is_err());
    }
}
