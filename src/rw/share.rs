//! The shared read lease of one key in one process: a small state machine.
//!
//! The first local reader of a key acquires a read lease at the backend (it
//! **leads**); readers that arrive meanwhile wait for it and then **join** the
//! lease; the last holder to leave releases it. A lease admits joiners only while
//! the caller's admission predicate says so (the admission window, see
//! [`READ_ADMISSION_WINDOW`](super::READ_ADMISSION_WINDOW)); after that, newcomers
//! wait for the lease to drain and then acquire a new one at the backend (where a
//! waiting writer is preferred). A lease found lost is **detached**: its holders
//! keep it until they leave (the last one releases it) and a newcomer leads a new
//! acquisition at once.
//!
//! # Invariants
//!
//! 1. At most one acquisition is in flight (`Acquiring`) per key, and only its
//!    leader ends it ([`Share::acquired`] or [`Share::abandoned`]).
//! 2. Every holder holds the current lease or a detached one; a lease's holder
//!    count is the number of holders that have not left.
//! 3. [`Share::leave`] returns `true` exactly once per lease: for its last holder.
//!    The lease is then forgotten here (the caller releases it at the backend).
//! 4. Nobody joins a lease the predicate refuses.
//! 5. Idle (no lease, nothing in flight, nothing detached) when nobody holds or
//!    leads.
//!
//! The struct is plain data: the caller guards it with a mutex and wakes waiters
//! (a `Notify`) after `acquired`, `abandoned` and a last `leave`, the only
//! transitions that can let a waiter proceed.

/// Lease identity: the state machine stores clones and compares them.
pub(crate) trait SameLease: Clone {
    /// Whether `self` and `other` are the same lease.
    fn same(&self, other: &Self) -> bool;
}

/// What the admission predicate says of the current lease for a newcomer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Join it.
    Join,
    /// Wait for it to drain (its admission window is closed).
    Wait,
    /// It is lost: detach it and lead a new acquisition.
    Replace,
}

/// What a newcomer does.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Arrive<L> {
    /// Acquire a read lease at the backend, then call `acquired` or `abandoned`.
    Leader,
    /// Hold this lease (already counted).
    Join(L),
    /// Another local reader is acquiring: wait for it, then arrive again.
    WaitAcquire,
    /// The current lease admits nobody more: wait for it to drain, then arrive again.
    WaitDrain,
}

#[derive(Debug)]
enum ShareState<L> {
    Idle,
    Acquiring,
    Held { lease: L, holders: usize },
}

/// The shared read lease of one key; see the module docs.
#[derive(Debug)]
pub(crate) struct Share<L> {
    phase: ShareState<L>,
    /// Lost leases that still have holders, with their holder counts.
    detached: Vec<(L, usize)>,
}

impl<L> Default for Share<L> {
    fn default() -> Self {
        Share {
            phase: ShareState::Idle,
            detached: Vec::new(),
        }
    }
}

impl<L: SameLease> Share<L> {
    /// A reader arrives; `admit` judges the current lease, if there is one.
    pub(crate) fn arrive(&mut self, admit: impl FnOnce(&L) -> Admit) -> Arrive<L> {
        match &mut self.phase {
            ShareState::Idle => {
                self.phase = ShareState::Acquiring;
                Arrive::Leader
            }
            ShareState::Acquiring => Arrive::WaitAcquire,
            ShareState::Held { lease, holders } => match admit(lease) {
                Admit::Join => {
                    *holders += 1;
                    Arrive::Join(lease.clone())
                }
                Admit::Wait => Arrive::WaitDrain,
                Admit::Replace => {
                    let ShareState::Held { lease, holders } =
                        std::mem::replace(&mut self.phase, ShareState::Acquiring)
                    else {
                        unreachable!("matched Held above")
                    };
                    self.detached.push((lease, holders));
                    Arrive::Leader
                }
            },
        }
    }

    /// The leader's acquisition succeeded: it holds `lease`, which admits joiners.
    pub(crate) fn acquired(&mut self, lease: L) {
        debug_assert!(matches!(self.phase, ShareState::Acquiring));
        self.phase = ShareState::Held { lease, holders: 1 };
    }

    /// The leader gave up (an error, a timeout, or its future was dropped): the next
    /// newcomer leads.
    pub(crate) fn abandoned(&mut self) {
        if matches!(self.phase, ShareState::Acquiring) {
            self.phase = ShareState::Idle;
        }
    }

    /// A holder of `lease` leaves. `true` when it was the last one: release the
    /// lease at the backend.
    pub(crate) fn leave(&mut self, lease: &L) -> bool {
        if let ShareState::Held {
            lease: current,
            holders,
        } = &mut self.phase
            && current.same(lease)
        {
            *holders -= 1;
            if *holders == 0 {
                self.phase = ShareState::Idle;
                return true;
            }
            return false;
        }
        if let Some(i) = self.detached.iter().position(|(l, _)| l.same(lease)) {
            self.detached[i].1 -= 1;
            if self.detached[i].1 == 0 {
                self.detached.swap_remove(i);
                return true;
            }
        }
        false
    }

    /// Whether nothing is held, led or detached.
    #[cfg(test)]
    pub(crate) fn is_idle(&self) -> bool {
        matches!(self.phase, ShareState::Idle) && self.detached.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    impl SameLease for u32 {
        fn same(&self, other: &Self) -> bool {
            self == other
        }
    }

    /// One reader of the model.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Reader {
        /// Not arrived yet.
        New,
        /// Waiting (for an acquisition or a drain): arrives again when woken.
        Waiting,
        /// Leading an acquisition.
        Leading,
        /// Holding lease `n`.
        Holding(u32),
        /// Gone (left after holding, or gave up leading).
        Done,
    }

    #[derive(Clone, Copy, Debug)]
    enum Event {
        /// Reader `i` arrives (or arrives again after waiting).
        Arrive(usize),
        /// The leader's acquisition succeeds.
        AcquireDone(usize),
        /// The leader's acquisition fails (error, timeout, dropped future).
        AcquireFail(usize),
        /// Reader `i` leaves its lease.
        Leave(usize),
        /// The current lease's admission window closes.
        CloseWindow,
        /// The current lease is lost.
        Lose,
    }

    #[derive(Clone)]
    struct Model {
        share_phase: Vec<Reader>,
        next_lease: u32,
        /// Per lease: window open, lost, released, and holders as the model counts them.
        windows: HashMap<u32, (bool, bool, bool, usize)>,
        current: Option<u32>,
        fails_left: u32,
        trace: Vec<Event>,
    }

    fn enabled(m: &Model) -> Vec<Event> {
        let mut out = Vec::new();
        for (i, r) in m.share_phase.iter().enumerate() {
            match r {
                Reader::New | Reader::Waiting => out.push(Event::Arrive(i)),
                Reader::Leading => {
                    out.push(Event::AcquireDone(i));
                    if m.fails_left > 0 {
                        out.push(Event::AcquireFail(i));
                    }
                }
                Reader::Holding(_) => out.push(Event::Leave(i)),
                Reader::Done => {}
            }
        }
        if let Some(l) = m.current {
            let (open, lost, released, _) = m.windows[&l];
            if !released {
                if open {
                    out.push(Event::CloseWindow);
                }
                if !lost {
                    out.push(Event::Lose);
                }
            }
        }
        out
    }

    fn step(share: &mut Share<u32>, m: &mut Model, e: Event) {
        m.trace.push(e);
        let t = m.trace.clone();
        match e {
            Event::Arrive(i) => {
                let windows = m.windows.clone();
                let arrive = share.arrive(|l| {
                    let (open, lost, ..) = windows[l];
                    if lost {
                        Admit::Replace
                    } else if open {
                        Admit::Join
                    } else {
                        Admit::Wait
                    }
                });
                match arrive {
                    Arrive::Leader => {
                        assert!(
                            !m.share_phase.contains(&Reader::Leading),
                            "two leaders: {t:?}"
                        );
                        m.share_phase[i] = Reader::Leading;
                    }
                    Arrive::Join(l) => {
                        let w = m.windows.get_mut(&l).expect("joined a known lease");
                        assert!(
                            w.0 && !w.1 && !w.2,
                            "joined a closed, lost or released lease: {t:?}"
                        );
                        w.3 += 1;
                        m.share_phase[i] = Reader::Holding(l);
                    }
                    Arrive::WaitAcquire => {
                        assert!(
                            m.share_phase.contains(&Reader::Leading),
                            "waits for no leader: {t:?}"
                        );
                        m.share_phase[i] = Reader::Waiting;
                    }
                    Arrive::WaitDrain => {
                        let l = m.current.expect("drains a lease");
                        assert!(!m.windows[&l].0, "waits on an open window: {t:?}");
                        m.share_phase[i] = Reader::Waiting;
                    }
                }
            }
            Event::AcquireDone(i) => {
                let l = m.next_lease;
                m.next_lease += 1;
                share.acquired(l);
                m.windows.insert(l, (true, false, false, 1));
                m.current = Some(l);
                m.share_phase[i] = Reader::Holding(l);
            }
            Event::AcquireFail(i) => {
                m.fails_left -= 1;
                share.abandoned();
                m.share_phase[i] = Reader::Done;
            }
            Event::Leave(i) => {
                let Reader::Holding(l) = m.share_phase[i] else {
                    unreachable!()
                };
                let last = share.leave(&l);
                let w = m.windows.get_mut(&l).unwrap();
                assert!(!w.2, "left a released lease: {t:?}");
                w.3 -= 1;
                assert_eq!(last, w.3 == 0, "release exactly at the last holder: {t:?}");
                if last {
                    w.2 = true;
                }
                m.share_phase[i] = Reader::Done;
            }
            Event::CloseWindow => {
                let l = m.current.unwrap();
                m.windows.get_mut(&l).unwrap().0 = false;
            }
            Event::Lose => {
                let l = m.current.unwrap();
                m.windows.get_mut(&l).unwrap().1 = true;
            }
        }
    }

    /// Explores every interleaving; returns the number of complete runs.
    fn explore(share: &Share<u32>, m: &Model, depth: usize) -> u64 {
        assert!(depth < 64, "runaway interleaving: {:?}", m.trace);
        let events = enabled(m);
        let useful: Vec<Event> = events
            .into_iter()
            // Window and loss events matter only while someone could still arrive.
            .filter(|e| {
                !matches!(e, Event::CloseWindow | Event::Lose)
                    || m.share_phase
                        .iter()
                        .any(|r| matches!(r, Reader::New | Reader::Waiting))
            })
            .collect();
        // Waiting readers only retry when something changed: model that by letting
        // them arrive again at any point (a spurious wake-up is harmless), but a
        // state where only waiters can move and none can progress is a deadlock.
        let progress = useful.iter().any(|e| match e {
            Event::Arrive(i) => m.share_phase[*i] == Reader::New,
            _ => true,
        });
        if !progress {
            let waiting = m.share_phase.contains(&Reader::Waiting);
            if waiting {
                // Every waiter must be able to lead or join now.
                let mut s = clone_share(share);
                let mut mm = m.clone();
                let i = m
                    .share_phase
                    .iter()
                    .position(|r| *r == Reader::Waiting)
                    .unwrap();
                step(&mut s, &mut mm, Event::Arrive(i));
                assert!(
                    matches!(mm.share_phase[i], Reader::Leading | Reader::Holding(_)),
                    "deadlock: {:?}",
                    m.trace
                );
                return explore(&s, &mm, depth + 1);
            }
            // The end: everything left, every lease released once, all idle.
            assert!(share.is_idle(), "not idle at the end: {:?}", m.trace);
            for (l, w) in &m.windows {
                assert!(w.2 && w.3 == 0, "lease {l} not released: {:?}", m.trace);
            }
            return 1;
        }
        let mut runs = 0;
        for e in useful {
            // A waiter re-arriving while nothing changed is a no-op loop: only let
            // waiters arrive when they would not wait again on the same thing.
            if let Event::Arrive(i) = e
                && m.share_phase[i] == Reader::Waiting
            {
                let mut s = clone_share(share);
                let mut mm = m.clone();
                step(&mut s, &mut mm, e);
                if mm.share_phase[i] == Reader::Waiting {
                    continue;
                }
                runs += explore(&s, &mm, depth + 1);
                continue;
            }
            let mut s = clone_share(share);
            let mut mm = m.clone();
            step(&mut s, &mut mm, e);
            runs += explore(&s, &mm, depth + 1);
        }
        runs
    }

    fn clone_share(s: &Share<u32>) -> Share<u32> {
        Share {
            phase: match &s.phase {
                ShareState::Idle => ShareState::Idle,
                ShareState::Acquiring => ShareState::Acquiring,
                ShareState::Held { lease, holders } => ShareState::Held {
                    lease: *lease,
                    holders: *holders,
                },
            },
            detached: s.detached.clone(),
        }
    }

    /// Every order of arrive / acquire-done / acquire-failed / leave / window-close /
    /// loss events for up to 3 readers (with up to one failed acquisition) keeps the
    /// invariants: one leader at a time, no join of a closed, lost or released lease,
    /// each lease released exactly once by its last holder, no deadlock, idle at the
    /// end.
    #[test]
    fn every_interleaving_keeps_the_invariants() {
        for readers in 1..=3 {
            for fails in 0..=1 {
                let m = Model {
                    share_phase: vec![Reader::New; readers],
                    next_lease: 0,
                    windows: HashMap::new(),
                    current: None,
                    fails_left: fails,
                    trace: Vec::new(),
                };
                let runs = explore(&Share::default(), &m, 0);
                assert!(runs > 0);
                println!("{readers} readers, {fails} failures: {runs} interleavings");
            }
        }
    }

    #[test]
    fn readers_share_one_lease_and_the_last_releases_it() {
        let mut s = Share::<u32>::default();
        assert_eq!(s.arrive(|_| Admit::Join), Arrive::Leader);
        assert_eq!(s.arrive(|_| Admit::Join), Arrive::WaitAcquire);
        s.acquired(7);
        assert_eq!(s.arrive(|_| Admit::Join), Arrive::Join(7));
        assert_eq!(s.arrive(|_| Admit::Wait), Arrive::WaitDrain);
        assert!(!s.leave(&7));
        assert!(s.leave(&7));
        assert!(s.is_idle());
        // A lost lease is detached; its holder still releases it.
        assert_eq!(s.arrive(|_| Admit::Join), Arrive::Leader);
        s.acquired(8);
        assert_eq!(s.arrive(|_| Admit::Replace), Arrive::Leader);
        s.acquired(9);
        assert!(s.leave(&8));
        assert!(!s.is_idle());
        assert!(s.leave(&9));
        assert!(s.is_idle());
    }
}
