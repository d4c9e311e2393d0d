//! The model world: tasks that look, lead, wait, hold and release on one
//! slot, the locker's side recorded, and the exploration of every schedule.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

use crate::backend::LeaseToken;
use crate::slot::*;
use Kind::*;

/// How a model task behaves at its choice points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// Never gives up; leads to success.
    Patient,
    /// May give up while waiting (timeout or dropped future), at any point.
    Impatient,
    /// If it leads, it is cancelled (or fails) instead of acquiring; may give up
    /// while waiting.
    Canceller,
}

pub(super) enum Task {
    Start,
    Looked(Arc<Slot>),
    Leading(Arc<Slot>),
    Waiting(WaiterPlace),
    /// The slot dropped the waiter; it has not looked yet.
    Dropped,
    Holding(Arc<Slot>, Arc<Lease>, u64),
    Releasing(Arc<Slot>),
    Done {
        held: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Action {
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
pub(super) const FAR: Duration = Duration::from_secs(86_400);

/// A timer that may take a cached lease back.
pub(super) enum Timer {
    /// A lease's linger task.
    Linger(Arc<Slot>, Weak<Lease>),
    /// A contended caching's own timer, with its caching number.
    Expire(Arc<Slot>, u64),
}

/// What the locker would do with forwarded grants, recorded for the model.
pub(super) struct ModelForward {
    pub(super) map: Arc<SlotMap>,
    pub(super) handoff: bool,
    /// Caching off (`None`), or on with linger tasks (`Some(true)`) or with a
    /// timer per caching, as for a contended key (`Some(false)`).
    pub(super) cache: Option<bool>,
    pub(super) pending: Mutex<Vec<Arc<Slot>>>,
    /// Timers started.
    pub(super) lingering: Mutex<Vec<Timer>>,
    /// Slots whose watcher runs.
    pub(super) watchers: Mutex<Vec<Arc<Slot>>>,
}

impl ModelForward {
    pub(super) fn caching(&self) -> Option<Caching> {
        self.cache.map(|linger| Caching {
            until: Instant::now(),
            linger,
        })
    }

    /// What the locker does after a holder's release decision.
    pub(super) fn after_release(&self, slot: &Arc<Slot>, lease: &Arc<Lease>, release: ReleaseStep) {
        let timer = match release {
            ReleaseStep::HandedOff => return,
            ReleaseStep::Backend => return self.pending.lock().unwrap().push(Arc::clone(slot)),
            ReleaseStep::Cached(_, true) => Timer::Linger(Arc::clone(slot), Arc::downgrade(lease)),
            ReleaseStep::Cached(_, false) if self.cache == Some(true) => return,
            ReleaseStep::Cached(n, false) => Timer::Expire(Arc::clone(slot), n),
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

pub(super) struct World {
    pub(super) map: Arc<SlotMap>,
    pub(super) fwd: Arc<ModelForward>,
    pub(super) dynfwd: Arc<dyn Forward>,
    pub(super) key: LockKey,
    pub(super) tasks: Vec<(Kind, Task)>,
    pub(super) holders: usize,
    /// The model's clock: the tasks' deadlines count from `t0`.
    pub(super) t0: Instant,
    pub(super) now: Instant,
    /// Whether a watcher may be dropped with its runtime (at most once per
    /// schedule), and was.
    pub(super) may_drop_watcher: bool,
    pub(super) dropped_watcher: bool,
    pub(super) seqs: Vec<u64>,
}

pub(super) fn lease(key: &LockKey) -> Arc<Lease> {
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
    pub(super) fn new(kinds: &[Kind], handoff: bool, cache: Option<bool>) -> World {
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
    pub(super) fn deadline(&self, i: usize) -> Instant {
        match self.tasks[i].0 {
            Patient => self.t0 + FAR,
            _ => self.t0 + Duration::from_secs(i as u64 + 1),
        }
    }

    /// Whether watcher `w` can wake: at an alarm the clock may reach, or early to
    /// end (its slot has no waiter).
    pub(super) fn can_wake(&self, slot: &Slot) -> bool {
        let (alarm, waiters) = slot.watch_state();
        alarm.is_some_and(|at| at < self.t0 + FAR) || waiters == 0
    }

    /// Moves the waiters the slot dropped to `Dropped`.
    pub(super) fn see_drops(&mut self) {
        for (_, task) in &mut self.tasks {
            if let Task::Waiting(place) = task {
                if place.has_grant() {
                    continue;
                }
                match place.granted().now_or_never() {
                    None => {}
                    Some(None) => *task = Task::Dropped,
                    Some(Some(grant)) => panic!("{grant:?} arrived unseen"),
                }
            }
        }
    }

    /// Enabled (task, action) pairs, in a fixed order.
    pub(super) fn enabled(&mut self) -> Vec<(usize, Action)> {
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
                Task::Waiting(place) => {
                    if place.has_grant() {
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

    pub(super) fn step(&mut self, (i, action): (usize, Action)) {
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
                    Some(Join::Wait(place)) => Task::Waiting(place),
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
            (Task::Waiting(mut place), Action::Receive) => {
                let grant = place
                    .granted()
                    .now_or_never()
                    .flatten()
                    .expect("grant is ready");
                let slot = Arc::clone(place.slot());
                drop(place);
                match grant {
                    Grant::Leadership(_) => Task::Leading(slot),
                    Grant::Lease(lease, seq) => self.hold(&slot, lease, seq),
                }
            }
            (Task::Waiting(place), Action::GiveUp) => {
                drop(place);
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
                    ReleaseStep::HandedOff => Task::Done { held: true },
                    ReleaseStep::Backend => Task::Releasing(slot),
                    cached @ ReleaseStep::Cached(..) => {
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

    pub(super) fn hold(&mut self, slot: &Arc<Slot>, lease: Arc<Lease>, seq: u64) -> Task {
        self.holders += 1;
        assert_eq!(self.holders, 1, "two local holders");
        assert_eq!(slot.mode(), Mode::Held);
        self.seqs.push(seq);
        Task::Holding(Arc::clone(slot), lease, seq)
    }

    /// Lets every watcher that can wake run to its end (scripted tests).
    pub(super) fn settle(&mut self) {
        while let Some(&watch) = self.enabled().iter().find(|(_, a)| *a == Action::Watch) {
            self.step(watch);
        }
    }

    pub(super) fn check_end(&mut self, schedule: &[(usize, Action)]) {
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
pub(super) fn explore(kinds: &[Kind], handoff: bool) -> usize {
    explore_with(kinds, handoff, None)
}

/// [`explore`] with lease caching off (`None`) or on, with linger tasks or with a
/// timer per caching (see [`ModelForward::cache`]).
pub(super) fn explore_with(kinds: &[Kind], handoff: bool, cache: Option<bool>) -> usize {
    explore_all(kinds, handoff, cache, false)
}

/// [`explore_with`], where with `drop_watcher` a watcher may also be dropped with
/// its runtime, once per schedule.
pub(super) fn explore_all(
    kinds: &[Kind],
    handoff: bool,
    cache: Option<bool>,
    drop_watcher: bool,
) -> usize {
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
