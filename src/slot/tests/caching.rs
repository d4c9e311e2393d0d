//! Lease caching: a released lease kept for a later arrival, its linger task
//! and its timers, stale or not.

use super::world::Kind::*;
use super::world::*;

// Caching on: every interleaving of releases that cache, arrivals that take the
// cached lease, linger timers (stale or not) and background releases keeps one
// holder, loses no waiter and leaves the map empty. One test per cast of tasks, so
// the explorations run side by side.

/// `linger`: a linger task per cached lease (`true`), or a timer per caching, as
/// for a contended key (`false`).
fn cached_lease_vs_arrivals_and_expiry(kinds: &[Kind], linger: bool) {
    let n = explore_with(kinds, true, Some(linger));
    assert!(n > 1_000, "only {n} schedules explored for {kinds:?}");
}

#[test]
fn cached_lease_vs_arrivals_and_expiry_patient_tasks() {
    cached_lease_vs_arrivals_and_expiry(&[Patient, Patient, Patient], true);
}

#[test]
fn cached_lease_vs_arrivals_and_expiry_with_a_task_that_gives_up() {
    cached_lease_vs_arrivals_and_expiry(&[Patient, Impatient, Patient], true);
}

#[test]
fn cached_lease_vs_arrivals_and_expiry_with_a_cancelled_task() {
    cached_lease_vs_arrivals_and_expiry(&[Canceller, Patient, Patient], true);
}

/// A timer per caching (a contended key's), with a task that gives up.
#[test]
fn cached_lease_vs_arrivals_and_expiry_with_a_timer_per_caching() {
    cached_lease_vs_arrivals_and_expiry(&[Patient, Impatient, Patient], false);
}

#[test]
fn cached_lease_goes_to_a_later_arrival_with_a_higher_sequence() {
    let mut world = World::new(&[Patient, Patient], true, Some(false));
    for step in [
        (0, Action::Look),
        (0, Action::Enter),
        (0, Action::Acquire),
        (0, Action::Release),
        // Nobody waited: the lease is cached, and the next arrival takes it.
        (1, Action::Look),
        (1, Action::Enter),
        (1, Action::Release),
        // Two timers: the first caching's is stale, the second's releases it.
        (usize::MAX, Action::Expire),
        (usize::MAX, Action::Expire),
        (usize::MAX, Action::Background),
    ] {
        world.step(step);
    }
    world.check_end(&[]);
    assert_eq!(world.seqs, vec![0, 1]);
}

#[test]
fn one_linger_task_serves_every_caching_of_a_lease() {
    let mut world = World::new(&[Patient, Patient, Patient], true, Some(true));
    for step in [
        (0, Action::Look),
        (0, Action::Enter),
        (0, Action::Acquire),
        (0, Action::Release),
        // Cached: the lease's linger task starts; the next arrivals take it and
        // cache it again, and no second task starts while the first runs.
        (1, Action::Look),
        (1, Action::Enter),
        (1, Action::Release),
        (2, Action::Look),
        (2, Action::Enter),
        (2, Action::Release),
    ] {
        world.step(step);
    }
    assert_eq!(world.fwd.lingering.lock().unwrap().len(), 1);
    // The one task takes the lease back when its linger ends.
    world.step((usize::MAX, Action::Expire));
    world.step((usize::MAX, Action::Background));
    world.check_end(&[]);
    assert_eq!(world.seqs, vec![0, 1, 2]);
}

#[test]
fn a_linger_task_that_finds_the_lease_in_use_ends_and_the_next_caching_starts_one() {
    let mut world = World::new(&[Patient, Patient], true, Some(true));
    for step in [
        (0, Action::Look),
        (0, Action::Enter),
        (0, Action::Acquire),
        (0, Action::Release),
        (1, Action::Look),
        (1, Action::Enter),
        // The task wakes while task 1 holds the lease: it ends.
        (usize::MAX, Action::Expire),
        (1, Action::Release),
    ] {
        world.step(step);
    }
    assert_eq!(
        world.fwd.lingering.lock().unwrap().len(),
        1,
        "the caching after the task ended starts a new one"
    );
    world.step((usize::MAX, Action::Expire));
    world.step((usize::MAX, Action::Background));
    world.check_end(&[]);
}
