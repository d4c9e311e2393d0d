//! Races of leaders, waiters and releases, every interleaving: one holder, no
//! waiter lost, sequence numbers that increase.

use super::world::Kind::*;
use super::world::*;

#[test]
fn leader_cancelled_vs_new_arrival() {
    for handoff in [false, true] {
        let n = explore(&[Canceller, Patient, Patient], handoff);
        assert!(n > 1_000, "only {n} schedules explored");
    }
}

#[test]
fn handoff_vs_waiter_timeout() {
    let n = explore(&[Patient, Impatient, Patient], true);
    assert!(n > 1_000, "only {n} schedules explored");
}

#[test]
fn release_vs_new_arrival() {
    for handoff in [false, true] {
        let n = explore(&[Patient, Patient, Patient], handoff);
        assert!(n > 1_000, "only {n} schedules explored");
    }
}

#[test]
fn slot_removal_vs_insertion() {
    for handoff in [false, true] {
        explore(&[Patient, Canceller], handoff);
        explore(&[Canceller, Impatient], handoff);
        explore(&[Impatient, Impatient], handoff);
    }
}

#[test]
fn handoff_sequence_numbers_increase() {
    // One leader, two waiters, handoff on, nobody gives up: in every schedule where
    // the lease was handed on, the holders saw strictly increasing sequence numbers.
    let mut world = World::new(&[Patient, Patient, Patient], true, None);
    // Everyone joins first, then the leader acquires and each holder releases.
    for step in [
        (0, Action::Look),
        (0, Action::Enter),
        (1, Action::Look),
        (1, Action::Enter),
        (2, Action::Look),
        (2, Action::Enter),
        (0, Action::Acquire),
        (0, Action::Release),
        (1, Action::Receive),
        (1, Action::Release),
        (2, Action::Receive),
        (2, Action::Release),
        (2, Action::Released),
    ] {
        world.step(step);
    }
    world.check_end(&[]);
    assert_eq!(world.seqs, vec![0, 1, 2]);
}
