//! Exhaustive interleaving tests of the slot state machine.
//!
//! Every slot transition is one synchronous step under the slot's mutex, and the
//! async work of a task happens between its steps. So the behaviours of a few
//! concurrent tasks are exactly the interleavings of their steps. These tests
//! enumerate *all* of them (depth-first, replaying each schedule from scratch) for
//! small scenarios, and check after every step and at the end:
//!
//! * at most one task holds the key (one holder);
//! * a task that never gives up always ends up holding the key (no lost waiter,
//!   no lost grant);
//! * when every task is done, the slot map is empty and no background release is
//!   pending.
//!
//! With lease caching on, a release that finds nobody waiting keeps the lease,
//! and the timer that takes it back (`Action::Expire`) is one more step that can
//! run at any point after it: either the lease's linger task waking past its
//! deadline (`Slot::linger`; one task per lease, started by the caching that found
//! none running) or, for a contended caching, a timer of that caching alone
//! (`Slot::expire`). A stale timer (the lease was taken again meanwhile) must
//! change nothing, and no cached lease may be left without a timer.
//!
//! Waiters' deadlines are the slot watcher's: the model keeps a clock, gives the
//! tasks that may give up a deadline each (1, 2, 3 s: they can time out) and the
//! patient ones a deadline the clock never reaches, and makes the watcher's wake
//! one more step (`Action::Watch`) that can run at any point while a watcher runs:
//! at its alarm (the clock moves there and the due waiters are dropped), or, once
//! its slot has no waiter, early (as when the slot going idle wakes it), to end.
//! Once per schedule the watcher may instead be dropped with its runtime
//! (`Action::WatchDropped`): every waiter is dropped, and a waiter whose
//! deadline has not passed joins again. A dropped waiter observes it
//! (`Action::Observe`) at any later point, racing every other step.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

use super::*;
use crate::backend::LeaseToken;

/// How a model task behaves at its choice points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Never gives up; leads to success.
    Patient,
    /// May give up while waiting (timeout or dropped future), at any point.
    Impatient,
    /// If it leads, it is cancelled (or fails) instead of acquiring; may give up
    /// while waiting.
    Canceller,
}

enum Task {
    Start,
    Looked(Arc<Slot>),
    Leading(Arc<Slot>),
    Waiting(Ticket),
    /// The slot dropped the waiter; it has not looked yet.
    Dropped,
    Holding(Arc<Slot>, Arc<Lease>, u64),
    Releasing(Arc<Slot>),
    Done {
        held: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Look,
    Enter,
    Acquire,
    Abandon,
    Receive,
    GiveUp,
    Release,
    Released,
    Background,
    /// A linger timer fires.
    Expire,
    /// The slot watcher (index `i` of those running) wakes.
    Watch,
    /// The last watcher started is dropped unfinished.
    WatchDropped,
    /// A dropped waiter sees it was dropped: times out or joins again.
    Observe,
}

/// A deadline the model's clock never reaches.
const FAR: Duration = Duration::from_secs(86_400);

/// A timer that may take a cached lease back.
enum Timer {
    /// A lease's linger task.
    Linger(Arc<Slot>, Weak<Lease>),
    /// A contended caching's own timer, with its caching number.
    Expire(Arc<Slot>, u64),
}

/// What the locker would do with forwarded grants, recorded for the model.
struct ModelForward {
    map: Arc<SlotMap>,
    handoff: bool,
    /// Caching off (`None`), or on with linger tasks (`Some(true)`) or with a
    /// timer per caching, as for a contended key (`Some(false)`).
    cache: Option<bool>,
    pending: Mutex<Vec<Arc<Slot>>>,
    /// Timers started.
    lingering: Mutex<Vec<Timer>>,
    /// Slots whose watcher runs.
    watchers: Mutex<Vec<Arc<Slot>>>,
}

impl ModelForward {
    fn caching(&self) -> Option<Caching> {
        self.cache.map(|linger| Caching {
            until: Instant::now(),
            linger,
        })
    }

    /// What the locker does after a holder's release decision.
    fn after_release(&self, slot: &Arc<Slot>, lease: &Arc<Lease>, release: Release) {
        let timer = match release {
            Release::HandedOff => return,
            Release::Backend => return self.pending.lock().unwrap().push(Arc::clone(slot)),
            Release::Cached(_, true) => Timer::Linger(Arc::clone(slot), Arc::downgrade(lease)),
            Release::Cached(_, false) if self.cache == Some(true) => return,
            Release::Cached(n, false) => Timer::Expire(Arc::clone(slot), n),
        };
        self.lingering.lock().unwrap().push(timer);
    }
}

impl Forward for ModelForward {
    fn forward(&self, slot: &Arc<Slot>, grant: Grant) {
        match grant {
            Grant::Leadership(lead) => {
                let _ = slot.abandon(&self.map, lead);
            }
            Grant::Lease(lease, seq) => {
                let release = slot.release(&lease, seq, self.handoff, self.caching(), None);
                self.after_release(slot, &lease, release);
            }
        }
    }

    fn watch(&self, slot: &Arc<Slot>) {
        self.watchers.lock().unwrap().push(Arc::clone(slot));
    }
}

struct World {
    map: Arc<SlotMap>,
    fwd: Arc<ModelForward>,
    dynfwd: Arc<dyn Forward>,
    key: LockKey,
    tasks: Vec<(Kind, Task)>,
    holders: usize,
    /// The model's clock: the tasks' deadlines count from `t0`.
    t0: Instant,
    now: Instant,
    /// Whether a watcher may be dropped with its runtime (at most once per
    /// schedule), and was.
    may_drop_watcher: bool,
    dropped_watcher: bool,
    seqs: Vec<u64>,
}

fn lease(key: &LockKey) -> Arc<Lease> {
    Arc::new(Lease::new(
        key.clone(),
        LeaseToken::random(),
        1,
        Duration::from_secs(30),
        Instant::now(),
        0,
        Default::default(),
    ))
}

impl World {
    fn new(kinds: &[Kind], handoff: bool, cache: Option<bool>) -> World {
        let map = Arc::new(SlotMap::default());
        let fwd = Arc::new(ModelForward {
            map: Arc::clone(&map),
            handoff,
            cache,
            pending: Mutex::new(Vec::new()),
            lingering: Mutex::new(Vec::new()),
            watchers: Mutex::new(Vec::new()),
        });
        let t0 = Instant::now();
        World {
            dynfwd: fwd.clone(),
            fwd,
            map,
            key: LockKey::from("k"),
            tasks: kinds.iter().map(|k| (*k, Task::Start)).collect(),
            holders: 0,
            t0,
            now: t0,
            may_drop_watcher: false,
            dropped_watcher: false,
            seqs: Vec::new(),
        }
    }

    /// Task `i`'s deadline: 1, 2, 3 s for a task that may give up, else `FAR`.
    fn deadline(&self, i: usize) -> Instant {
        match self.tasks[i].0 {
            Patient => self.t0 + FAR,
            _ => self.t0 + Duration::from_secs(i as u64 + 1),
        }
    }

    /// Whether watcher `w` can wake: at an alarm the clock may reach, or early to
    /// end (its slot has no waiter).
    fn can_wake(&self, slot: &Slot) -> bool {
        let (alarm, waiters) = slot.watch_state();
        alarm.is_some_and(|at| at < self.t0 + FAR) || waiters == 0
    }

    /// Moves the waiters the slot dropped to `Dropped`.
    fn see_drops(&mut self) {
        for (_, task) in &mut self.tasks {
            if let Task::Waiting(ticket) = task {
                if ticket.has_grant() {
                    continue;
                }
                match ticket.granted().now_or_never() {
                    None => {}
                    Some(None) => *task = Task::Dropped,
                    Some(Some(grant)) => panic!("{grant:?} arrived unseen"),
                }
            }
        }
    }

    /// Enabled (task, action) pairs, in a fixed order.
    fn enabled(&mut self) -> Vec<(usize, Action)> {
        self.see_drops();
        let mut out = Vec::new();
        for (i, (kind, task)) in self.tasks.iter().enumerate() {
            match task {
                Task::Start => out.push((i, Action::Look)),
                Task::Looked(_) => out.push((i, Action::Enter)),
                Task::Leading(_) => out.push((
                    i,
                    if *kind == Kind::Canceller {
                        Action::Abandon
                    } else {
                        Action::Acquire
                    },
                )),
                Task::Waiting(ticket) => {
                    if ticket.has_grant() {
                        out.push((i, Action::Receive));
                    }
                    if *kind != Kind::Patient {
                        out.push((i, Action::GiveUp));
                    }
                }
                Task::Dropped => out.push((i, Action::Observe)),
                Task::Holding(..) => out.push((i, Action::Release)),
                Task::Releasing(_) => out.push((i, Action::Released)),
                Task::Done { .. } => {}
            }
        }
        if !self.fwd.pending.lock().unwrap().is_empty() {
            out.push((usize::MAX, Action::Background));
        }
        if !self.fwd.lingering.lock().unwrap().is_empty() {
            out.push((usize::MAX, Action::Expire));
        }
        let watchers = self.fwd.watchers.lock().unwrap();
        for (w, slot) in watchers.iter().enumerate() {
            if self.can_wake(slot) {
                out.push((w, Action::Watch));
            }
        }
        if !watchers.is_empty() && !self.dropped_watcher && self.may_drop_watcher {
            out.push((usize::MAX, Action::WatchDropped));
        }
        out
    }

    fn step(&mut self, (i, action): (usize, Action)) {
        self.see_drops();
        if action == Action::Background {
            let slot = self.fwd.pending.lock().unwrap().pop().unwrap();
            slot.released(&self.map, Inheritance::default());
            return;
        }
        if action == Action::Expire {
            // The linger task wakes past its deadline (a wake before it changes
            // nothing and sleeps on).
            let late = Instant::now() + Duration::from_secs(3600);
            let taken = match self.fwd.lingering.lock().unwrap().pop().unwrap() {
                Timer::Linger(slot, lease) => match slot.linger(&lease, late, false) {
                    Linger::Expired(_) => Some(slot),
                    Linger::Done => None,
                    Linger::Until(_) => panic!("a deadline in the past moved"),
                },
                Timer::Expire(slot, n) => slot.expire(n).map(|_| slot),
            };
            if let Some(slot) = taken {
                // The timer took the lease back: its backend release runs next.
                self.fwd.pending.lock().unwrap().push(slot);
            }
            return;
        }
        if action == Action::Watch {
            let slot = Arc::clone(&self.fwd.watchers.lock().unwrap()[i]);
            let (alarm, _) = slot.watch_state();
            if let Some(at) = alarm.filter(|at| *at < self.t0 + FAR) {
                self.now = self.now.max(at);
            }
            if slot.time_out(self.now).is_none() {
                self.fwd.watchers.lock().unwrap().remove(i);
            }
            return;
        }
        if action == Action::WatchDropped {
            self.dropped_watcher = true;
            let slot = self.fwd.watchers.lock().unwrap().pop().unwrap();
            slot.watch_dropped();
            return;
        }
        let task = std::mem::replace(&mut self.tasks[i].1, Task::Done { held: false });
        let handoff = self.fwd.handoff;
        let next = match (task, action) {
            (Task::Start, Action::Look) => Task::Looked(Slot::lookup(&self.map, &self.key)),
            (Task::Looked(slot), Action::Enter) => {
                match slot.enter(8, (self.now, self.deadline(i)), &self.dynfwd) {
                    None => Task::Start,
                    Some(Join::Leader(slot)) => Task::Leading(slot),
                    Some(Join::Wait(ticket)) => Task::Waiting(ticket),
                    Some(Join::Cached(slot, lease, seq)) => {
                        assert!(
                            self.fwd.cache.is_some(),
                            "a lease was cached with caching off"
                        );
                        self.hold(&slot, lease, seq)
                    }
                    Some(Join::Overloaded) => panic!("no overload in these models"),
                }
            }
            (Task::Leading(slot), Action::Acquire) => {
                slot.acquired();
                self.hold(&slot, lease(&self.key), 0)
            }
            (Task::Leading(slot), Action::Abandon) => {
                let _ = slot.abandon(&self.map, Inheritance::default());
                Task::Done { held: false }
            }
            (Task::Waiting(mut ticket), Action::Receive) => {
                let grant = ticket
                    .granted()
                    .now_or_never()
                    .flatten()
                    .expect("grant is ready");
                let slot = Arc::clone(ticket.slot());
                drop(ticket);
                match grant {
                    Grant::Leadership(_) => Task::Leading(slot),
                    Grant::Lease(lease, seq) => self.hold(&slot, lease, seq),
                }
            }
            (Task::Waiting(ticket), Action::GiveUp) => {
                drop(ticket);
                Task::Done { held: false }
            }
            (Task::Dropped, Action::Observe) if self.now >= self.deadline(i) => {
                assert_ne!(self.tasks[i].0, Patient, "a patient task timed out");
                Task::Done { held: false }
            }
            // The watcher was dropped before this waiter's deadline: join again.
            (Task::Dropped, Action::Observe) => Task::Start,
            (Task::Holding(slot, lease, seq), Action::Release) => {
                self.holders -= 1;
                match slot.release(&lease, seq + 1, handoff, self.fwd.caching(), None) {
                    Release::HandedOff => Task::Done { held: true },
                    Release::Backend => Task::Releasing(slot),
                    cached @ Release::Cached(..) => {
                        self.fwd.after_release(&slot, &lease, cached);
                        Task::Done { held: true }
                    }
                }
            }
            (Task::Releasing(slot), Action::Released) => {
                slot.released(&self.map, Inheritance::default());
                Task::Done { held: true }
            }
            (_, a) => panic!("action {a:?} not enabled"),
        };
        self.tasks[i].1 = next;
    }

    fn hold(&mut self, slot: &Arc<Slot>, lease: Arc<Lease>, seq: u64) -> Task {
        self.holders += 1;
        assert_eq!(self.holders, 1, "two local holders");
        assert_eq!(slot.mode(), Mode::Held);
        self.seqs.push(seq);
        Task::Holding(Arc::clone(slot), lease, seq)
    }

    /// Lets every watcher that can wake run to its end (scripted tests).
    fn settle(&mut self) {
        while let Some(&watch) = self.enabled().iter().find(|(_, a)| *a == Action::Watch) {
            self.step(watch);
        }
    }

    fn check_end(&mut self, schedule: &[(usize, Action)]) {
        self.settle();
        for (i, (kind, task)) in self.tasks.iter().enumerate() {
            match task {
                Task::Done { held } => {
                    if *kind == Kind::Patient {
                        assert!(*held, "patient task {i} never held; schedule {schedule:?}");
                    }
                }
                _ => panic!("task {i} stuck (lost waiter); schedule {schedule:?}"),
            }
        }
        assert_eq!(self.holders, 0);
        assert!(
            self.map.is_empty(),
            "slot left in the map; schedule {schedule:?}"
        );
        assert!(
            self.fwd.watchers.lock().unwrap().is_empty(),
            "a watcher outlived its waiters; schedule {schedule:?}"
        );
    }
}

/// Runs every interleaving of `kinds`; returns how many complete schedules ran.
fn explore(kinds: &[Kind], handoff: bool) -> usize {
    explore_with(kinds, handoff, None)
}

/// [`explore`] with lease caching off (`None`) or on, with linger tasks or with a
/// timer per caching (see [`ModelForward::cache`]).
fn explore_with(kinds: &[Kind], handoff: bool, cache: Option<bool>) -> usize {
    explore_all(kinds, handoff, cache, false)
}

/// [`explore_with`], where with `drop_watcher` a watcher may also be dropped with
/// its runtime, once per schedule.
fn explore_all(kinds: &[Kind], handoff: bool, cache: Option<bool>, drop_watcher: bool) -> usize {
    // Depth-first over choice indices. `path` holds, for each step of the current
    // schedule, the option taken and how many there were. Each schedule replays from
    // scratch (the slots are real and cannot be cloned), so the work is one replay
    // per complete schedule: run the prefix, extend it with first options to the
    // end, check, then move to the next untried option of the deepest step.
    let mut path: Vec<(usize, usize)> = Vec::new();
    let mut complete = 0usize;
    loop {
        let mut world = World::new(kinds, handoff, cache);
        world.may_drop_watcher = drop_watcher;
        let mut schedule = Vec::with_capacity(path.len());
        for &(c, _) in &path {
            let choice = world.enabled()[c];
            schedule.push(choice);
            world.step(choice);
        }
        loop {
            let options = world.enabled();
            let Some(&first) = options.first() else { break };
            path.push((0, options.len()));
            schedule.push(first);
            world.step(first);
        }
        world.check_end(&schedule);
        complete += 1;

        loop {
            match path.pop() {
                None => return complete,
                Some((c, n)) if c + 1 < n => {
                    path.push((c + 1, n));
                    break;
                }
                Some(_) => {}
            }
        }
    }
}

use Kind::*;

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

/// Counts its wakes.
struct Wakes(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Wakes {
    fn new() -> Arc<Wakes> {
        Arc::new(Wakes(std::sync::atomic::AtomicUsize::new(0)))
    }

    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Polls `ticket`'s wait once with this waker.
    fn poll(self: &Arc<Self>, ticket: &mut Ticket) -> Poll<Option<Grant>> {
        let waker = Waker::from(Arc::clone(self));
        let mut granted = std::pin::pin!(ticket.granted());
        granted.as_mut().poll(&mut Context::from_waker(&waker))
    }
}

/// A waiter that polled is woken by every step that takes it out of the queue,
/// and then finds what that step left it: a handed-off lease, leadership from a
/// failed leader or after a backend release, nothing at its deadline or at the
/// watcher's drop. A grant in flight survives the watcher's drop, and a ticket
/// dropped with its grant in flight passes the grant to the next waiter.
#[test]
fn every_way_out_of_the_queue_wakes_the_waiter() {
    let world = World::new(&[], true, None);
    let (map, fwd) = (&world.map, &world.dynfwd);
    let t0 = Instant::now();
    let wait = (t0, t0 + Duration::from_secs(1));
    let join = |key: &str| Slot::join(map, &LockKey::from(key), 8, wait, fwd);
    let leader = |key: &str| match join(key) {
        Join::Leader(slot) => slot,
        other => panic!("{other:?}"),
    };
    let waiter = |key: &str| match join(key) {
        Join::Wait(ticket) => ticket,
        other => panic!("{other:?}"),
    };
    let queued = |ticket: &mut Ticket| {
        let wakes = Wakes::new();
        assert!(wakes.poll(ticket).is_pending());
        wakes
    };

    // A handoff.
    let slot = leader("handoff");
    let mut ticket = waiter("handoff");
    let wakes = queued(&mut ticket);
    slot.acquired();
    let held = lease(slot.key());
    assert_eq!(slot.release(&held, 0, true, None, None), Release::HandedOff);
    assert_eq!(wakes.count(), 1);
    assert!(matches!(
        wakes.poll(&mut ticket),
        Poll::Ready(Some(Grant::Lease(_, 0)))
    ));
    assert!(
        wakes.poll(&mut ticket).is_pending(),
        "a ticket completes once"
    );

    // Leadership from a leader that failed.
    let slot = leader("abandon");
    let mut ticket = waiter("abandon");
    let wakes = queued(&mut ticket);
    assert_eq!(
        slot.abandon(map, Inheritance::default()),
        Abandon::Succeeded
    );
    assert_eq!(wakes.count(), 1);
    assert!(matches!(
        wakes.poll(&mut ticket),
        Poll::Ready(Some(Grant::Leadership(_)))
    ));

    // Leadership after a backend release.
    let slot = leader("released");
    let mut ticket = waiter("released");
    let wakes = queued(&mut ticket);
    slot.acquired();
    assert_eq!(slot.release(&held, 0, false, None, None), Release::Backend);
    assert_eq!(wakes.count(), 0);
    assert_eq!(slot.released(map, Inheritance::default()), None);
    assert_eq!(wakes.count(), 1);
    assert!(matches!(
        wakes.poll(&mut ticket),
        Poll::Ready(Some(Grant::Leadership(_)))
    ));

    // The deadline.
    let slot = leader("timeout");
    let mut ticket = waiter("timeout");
    let wakes = queued(&mut ticket);
    assert_eq!(slot.time_out(t0), Some(wait.1));
    assert_eq!(wakes.count(), 0);
    assert_eq!(slot.time_out(wait.1), None);
    assert_eq!(wakes.count(), 1);
    assert!(matches!(wakes.poll(&mut ticket), Poll::Ready(None)));

    // The watcher's drop, with one waiter granted and one queued.
    let slot = leader("dropped");
    let mut granted = waiter("dropped");
    let mut queued_too = waiter("dropped");
    let (wakes, wakes_too) = (queued(&mut granted), queued(&mut queued_too));
    slot.acquired();
    assert_eq!(slot.release(&held, 0, true, None, None), Release::HandedOff);
    slot.watch_dropped();
    assert_eq!((wakes.count(), wakes_too.count()), (1, 1));
    assert!(matches!(
        wakes.poll(&mut granted),
        Poll::Ready(Some(Grant::Lease(..)))
    ));
    assert!(matches!(wakes_too.poll(&mut queued_too), Poll::Ready(None)));

    // A ticket dropped with its grant in flight.
    let slot = leader("passed on");
    let first = waiter("passed on");
    let mut second = waiter("passed on");
    let wakes = queued(&mut second);
    slot.acquired();
    assert_eq!(slot.release(&held, 7, true, None, None), Release::HandedOff);
    assert_eq!(wakes.count(), 0, "the grant went to the first waiter");
    drop(first);
    assert_eq!(wakes.count(), 1);
    assert!(matches!(
        wakes.poll(&mut second),
        Poll::Ready(Some(Grant::Lease(_, 7)))
    ));
}
