//! Waiters' deadlines: the watcher times them out at their deadline, racing
//! grants, and is woken for an earlier one.

use std::time::Duration;

use futures::FutureExt;

use super::world::Kind::*;
use super::world::*;
use crate::slot::*;

#[test]
fn waiter_timeouts_vs_grants_and_a_dropped_watcher() {
    // The watcher times out waiters at any point (racing grants, releases,
    // cachings and give-ups), or is dropped with its runtime once: one holder
    // throughout, no patient waiter lost or timed out, and no watcher left.
    for handoff in [false, true] {
        for cache in [None, Some(true)] {
            for kinds in [
                &[Impatient, Patient][..],
                &[Patient, Impatient],
                &[Canceller, Impatient],
                &[Patient, Patient],
            ] {
                let n = explore_all(kinds, handoff, cache, true);
                assert!(n > 100, "only {n} schedules explored for {kinds:?}");
            }
        }
    }
}

#[test]
fn a_waiter_times_out_at_its_deadline_while_the_key_is_held() {
    // Task 0 holds; task 1 (deadline 2 s) waits, then task 2 (deadline 3 s) and
    // task 3 (patient). One watcher serves them all: it wakes at 2 s, drops task
    // 1 only, wakes at 3 s, drops task 2 only, and sleeps on for task 3.
    let mut world = World::new(&[Patient, Impatient, Impatient, Patient], true, None);
    for step in [
        (0, Action::Look),
        (0, Action::Enter),
        (0, Action::Acquire),
        (1, Action::Look),
        (1, Action::Enter),
        (2, Action::Look),
        (2, Action::Enter),
        (3, Action::Look),
        (3, Action::Enter),
    ] {
        world.step(step);
    }
    assert_eq!(world.fwd.watchers.lock().unwrap().len(), 1, "one watcher");
    let t0 = world.t0;
    world.step((0, Action::Watch));
    assert_eq!(world.now, t0 + Duration::from_secs(2));
    assert_eq!(
        world
            .enabled()
            .iter()
            .filter(|(_, a)| *a == Action::Observe)
            .count(),
        1
    );
    world.step((1, Action::Observe));
    assert!(matches!(world.tasks[1].1, Task::Done { held: false }));
    world.step((0, Action::Watch));
    assert_eq!(world.now, t0 + Duration::from_secs(3));
    world.step((2, Action::Observe));
    assert!(
        !world.enabled().contains(&(0, Action::Watch)),
        "the watcher wakes only to a deadline the clock reaches"
    );
    // The holder's release goes to task 3, which never times out.
    world.step((0, Action::Release));
    world.step((3, Action::Receive));
    world.step((3, Action::Release));
    world.step((3, Action::Released));
    world.check_end(&[]);
    assert_eq!(world.seqs, vec![0, 1]);
}

#[test]
fn an_earlier_deadline_moves_the_alarm_of_the_running_watcher() {
    // Task 2 (deadline 3 s) queues first, task 1 (deadline 2 s) second: the
    // watcher started for 3 s is woken to sleep until 2 s.
    let mut world = World::new(&[Patient, Impatient, Impatient], true, None);
    for step in [
        (0, Action::Look),
        (0, Action::Enter),
        (2, Action::Look),
        (2, Action::Enter),
    ] {
        world.step(step);
    }
    let slot = Arc::clone(&world.fwd.watchers.lock().unwrap()[0]);
    assert_eq!(
        slot.watch_state(),
        (Some(world.t0 + Duration::from_secs(3)), 1)
    );
    world.step((1, Action::Look));
    world.step((1, Action::Enter));
    assert_eq!(
        slot.watch_state(),
        (Some(world.t0 + Duration::from_secs(2)), 2)
    );
    assert_eq!(
        world.fwd.watchers.lock().unwrap().len(),
        1,
        "still one watcher"
    );
    assert!(
        slot.rearm.notified().now_or_never().is_some(),
        "the running watcher was woken"
    );
}
