//! Lease caching: a released lease kept for a later arrival, its linger task
//! and its timers, stale or not.

use super::world::Kind::*;
use super::world::*;

#[test]
fn cached_lease_vs_arrivals_and_expiry() {
    // Caching on: every interleaving of releases that cache, arrivals that take the
    // cached lease, linger timers (stale or not) and background releases keeps one
    // holder, loses no waiter and leaves the map empty.
    for kinds in [
        &[Patient, Patient, Patient][..],
        &[Patient, Impatient, Patient],
        &[Canceller, Patient, Patient],
    ] {
        let n = explore_with(kinds, true, Some(true));
        assert!(n > 1_000, "only {n} schedules explored for {kinds:?}");
    }
    // A timer per caching (a contended key's), with a task that gives up.
    let n = explore_with(&[Patient, Impatient, Patient], true, Some(false));
    assert!(n > 1_000, "only {n} schedules explored");
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
