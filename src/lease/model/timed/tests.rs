use super::{Config, DRIFT, Explored, Finding, explore};

/// Explores `config`, printing what it found, each with its shortest trace.
pub(super) fn in_time(config: Config) -> Explored {
    let explored = explore(config);
    for (finding, trace) in &explored.found {
        eprintln!("{finding:?}:\n  {}", trace.join("\n  "));
    }
    eprintln!(
        "{config:?}: {} states, found {:?}",
        explored.states,
        explored.kinds()
    );
    explored
}

/// Leases each task takes in the timed model's configurations that hold: 1
/// by default, 2 with `LOCKFLIGHT_MODEL_ROUNDS=2` (40 to 60 times the states,
/// 1.2 to 6 million each, about six minutes in all in a debug build).
pub(super) fn rounds() -> u8 {
    std::env::var("LOCKFLIGHT_MODEL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .clamp(1, 2)
}

/// TTL expiry, with renewals delayed, lost or never sent, and a server clock
/// that gains up to the drift on the holders': no two believed-valid holders,
/// tokens increase, nothing orphaned (about 47,000 states).
#[test]
fn ttl_expiry_keeps_believed_valid_holders_apart_and_tokens_increasing() {
    let explored = in_time(Config {
        gain: DRIFT.unsigned_abs(),
        rounds: [rounds(); 2],
        ..Config::BASE
    });
    assert!(
        explored.found.is_empty(),
        "{} states: {:?}",
        explored.states,
        explored.kinds()
    );
}

/// The drift is what pays for the server's clock running ahead: a tick more
/// and two holders believe they hold (about 11,500 states).
#[test]
fn a_server_clock_gaining_more_than_the_drift_breaks_exclusion() {
    let explored = in_time(Config {
        gain: DRIFT.unsigned_abs() + 1,
        faults: 0,
        ..Config::BASE
    });
    assert_eq!(
        explored.kinds(),
        [Finding::TwoValidHolders],
        "{} states",
        explored.states
    );
}

/// Without the gate below, a late acquire that lands after its token's
/// release record expired takes the free lock for a token nobody holds, until
/// its TTL: a cost in liveness only, never two believed-valid holders nor a
/// smaller token (about 28,700 states).
#[test]
fn an_acquire_later_than_its_release_record_orphans_the_lock_and_nothing_else() {
    let explored = in_time(Config {
        record_ttl: Some(1),
        rounds: [rounds(); 2],
        ..Config::BASE
    });
    assert_eq!(
        explored.kinds(),
        [Finding::OrphanLease],
        "{} states",
        explored.states
    );
}

/// The gate of `lua/life_gate.lua` refuses a grant that lands later than a
/// record's lifetime after its send: the same delays orphan nothing, and
/// break nothing else (about 19,200 states).
#[test]
fn the_late_grant_gate_closes_the_expired_record_window() {
    let explored = in_time(Config {
        record_ttl: Some(1),
        late_gate: true,
        rounds: [rounds(); 2],
        ..Config::BASE
    });
    assert!(
        explored.found.is_empty(),
        "{} states: {:?}",
        explored.states,
        explored.kinds()
    );
}

/// A restart without persistence: tokens still increase (the server clock's
/// floor), but a holder that has not heard of the restart still believes it
/// holds while another is granted the lock; and a late acquire finds no record
/// to refuse it (about 55,000 states).
#[test]
fn a_restart_keeps_tokens_increasing_but_not_exclusion() {
    let explored = in_time(Config {
        restarts: 1,
        rounds: [rounds(); 2],
        ..Config::BASE
    });
    assert_eq!(
        explored.kinds(),
        [Finding::TwoValidHolders, Finding::OrphanLease],
        "{} states",
        explored.states
    );
}

/// A restarted server whose clock came back behind mints a token that is not
/// above the last one (about 9,500 states).
#[test]
fn a_restart_with_the_clock_stepped_back_can_repeat_a_token() {
    let explored = in_time(Config {
        restarts: 1,
        clock_back: true,
        faults: 0,
        ..Config::BASE
    });
    assert!(
        explored.kinds().contains(&Finding::TokenNotIncreasing),
        "{} states: {:?}",
        explored.states,
        explored.kinds()
    );
}

/// With the life and its quarantine, a restart ends every believed-valid lease
/// before anything is granted in the new life: the gate refuses the first
/// acquire of an instance that saw the earlier life and holds grants for a
/// TTL from the life's start, and a holder that hears from the new life
/// drops its lease. No two believed-valid holders, tokens increase, and the
/// late acquire that found no record to refuse it is refused by the gate
/// (about 108,000 states).
#[test]
fn the_life_and_its_hold_keep_holders_apart_across_a_restart() {
    let explored = in_time(Config {
        restarts: 1,
        life: true,
        rounds: [rounds(); 2],
        ..Config::BASE
    });
    assert!(
        explored.found.is_empty(),
        "{} states: {:?}",
        explored.states,
        explored.kinds()
    );
}

/// The quarantine is written by an instance that saw the earlier life: one started
/// after the restart that asks first is told the life, asks again and is
/// granted at once, while the earlier holder still believes (about 81,000
/// states).
#[test]
fn an_instance_started_after_the_restart_that_asks_first_is_not_held() {
    let explored = in_time(Config {
        restarts: 1,
        life: true,
        fresh: true,
        ..Config::BASE
    });
    assert_eq!(
        explored.kinds(),
        [Finding::TwoValidHolders],
        "{} states",
        explored.states
    );
}
