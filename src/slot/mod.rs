//! The per-key state machine that makes one task per key per process talk to the
//! backend.
//!
//! ```text
//!            join (first)                 acquired
//!   Idle ─────────────────► Acquiring ─────────────────► Held ──┐ release with handoff:
//!    ▲                        │  ▲                         │  ▲  │ the lease moves to the
//!    │ nobody left            │  │ leader failed/cancelled │  └──┘ next waiter in memory
//!    │ (slot removed)         │  │ → next waiter leads     │
//!    │                        ▼  │                         ▼ release without handoff
//!    └─────────────────────── (promote) ◄──────────── Releasing
//!                                          released
//! ```
//!
//! With lease caching, a release that finds no local waiter may *keep* the lease
//! (mode `Cached`, within the handoff budget): the next task that joins takes it
//! at once (`Join::Cached`, as a handoff to a task that arrived later), and if none
//! comes within the linger a timer takes it back and releases it at the backend.
//! The timer is one *linger task* per lease, not one per release: each caching
//! moves the slot's linger deadline (`State::until`), and the task, when it wakes,
//! takes the lease back only if it is still cached and the deadline has passed
//! (`Slot::linger`), sleeps on to a later deadline if a later caching moved it,
//! and ends when the lease is in use, so the next caching starts a new one
//! (`ReleaseStep::Cached`'s flag). `Slot::expire` takes back one caching by its
//! number, for a timer that serves only that caching. A `Cached` slot has no
//! waiters (a joiner takes the lease instead of queueing).
//!
//! Every other task that joins while the slot is not idle waits in a FIFO of local
//! waiters with its own deadline (the caller's). A waiter is *granted* either
//! leadership (it becomes the one task that acquires from the backend, inheriting
//! the token of a previous leader's acquire that may have landed, so that it is
//! reconciled; never the token of a release) or a handed-off lease. A grant moves
//! the role, and one task holds the role at a time, so at most one grant is in
//! flight: the slot keeps it (`State::granted`, with the waiter's id) and wakes
//! the waiter, which takes it under the mutex when it next polls, or passes it on
//! if it is dropped first. No channel is allocated per waiter.
//!
//! A waiter's deadline is kept by the slot, not by a timer of its own: one
//! *watcher* task per slot with waiters sleeps until the earliest deadline
//! (`State::alarm`), then, in one step under the mutex, drops the due waiters from
//! the queue and wakes them ([`Slot::time_out`]); a waiter that finds itself
//! neither queued nor granted has timed out. A join that needs a watcher and finds
//! none starts one (through [`Forward::watch`]); one with an earlier deadline than the alarm wakes it
//! (`Slot::rearm`). The watcher ends when it wakes to no waiter, and a slot that
//! goes idle wakes it to end. A watcher dropped unfinished (its runtime shut down)
//! drops every waiter ([`Slot::watch_dropped`]): a waiter dropped before its
//! deadline joins again, and so starts a watcher on its own runtime (the locker
//! then also gives it a timer of its own). A watcher keeps the deadlines of the
//! waiters of its own runtime only: one that joins from another runtime, which
//! may be alive but not driven, keeps a timer of its own from the start
//! ([`WaiterPlace::needs_own_timer`]).
//!
//! All transitions are synchronous steps under one mutex; the async work (backend
//! calls) happens between steps, outside the lock. That is what makes the machine
//! checkable by exhaustive interleaving (see `tests`).
//!
//! # Invariants
//!
//! 1. At most one leader or holder per slot: `mode` is `Acquiring`, `Held` or
//!    `Releasing` exactly while one task owns that role, `Cached` while the slot
//!    keeps the lease for nobody (exactly one lease, no holder), and `Idle`
//!    otherwise.
//! 2. A slot in `Idle` or `Cached` mode has no waiters. An `Idle` slot is removed
//!    from the map in the same step (it is marked `removed`; a task that finds a
//!    removed slot retries with a fresh one). So the map holds only slots that
//!    someone uses, or whose lease is cached (until its linger ends).
//! 3. A grant is never lost: it goes to the first live waiter, which leaves the
//!    queue in the same step, and stays in `State::granted` until that waiter's
//!    place takes it, by a poll or, if the place is dropped first, from its
//!    `Drop`, which passes it on. A place leaves the queue under the mutex, so a
//!    queued waiter is always there to take a grant.
//! 4. Waiters are served in FIFO order; a waiter that leaves is removed without
//!    disturbing the others.
//!
//! # Lock order
//!
//! Slot mutex, then the map's shard lock (removal). Arrivals take the shard lock
//! only to clone the slot's `Arc` and release it before taking the slot mutex. No
//! lock is held across an `.await`.

mod waiters;

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use dashmap::DashMap;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::backend::LeaseToken;
use crate::key::LockKey;
use crate::lease::Lease;
use waiters::Waiters;

#[cfg(test)]
mod tests;

/// The slots of one locker.
pub(crate) type SlotMap = DashMap<LockKey, Arc<Slot>>;

/// What a leader inherits from its predecessor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Inheritance {
    /// Acquire with this token: the predecessor's acquire may have landed (never a
    /// token whose release was sent: a released token is retired).
    pub(crate) token: Option<LeaseToken>,
    /// This instance may be in the backend's queue for the key.
    pub(crate) queued: bool,
}

/// What a waiter is given.
#[derive(Debug)]
pub(crate) enum Grant {
    /// Become the leader, inheriting what the previous leader left.
    Leadership(Inheritance),
    /// Take over the held lease; `seq` is the handoff sequence for the new holder.
    Lease(Arc<Lease>, u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Idle,
    Acquiring,
    Held,
    Releasing,
    /// The lease is held at the backend, by no local task (lease caching).
    Cached,
}

#[derive(Debug)]
struct State {
    mode: Mode,
    removed: bool,
    next_id: u64,
    /// Waiters in FIFO order, with their arrivals, deadlines and wakers.
    waiters: Waiters,
    /// The grant in flight and the id of its waiter, until that waiter's place
    /// takes it (at most one: a grant moves the slot's one role).
    granted: Option<(u64, Grant)>,
    /// When the slot's watcher wakes next; `None`: no watcher runs.
    alarm: Option<Instant>,
    /// The runtime the watcher was started on (`None`: outside any runtime).
    watcher_runtime: Option<tokio::runtime::Id>,
    /// In `Cached` mode: the kept lease and the handoff sequence of its next holder.
    cached: Option<(Arc<Lease>, u64)>,
    /// Counts the times the slot went `Cached`: a linger timer expires only the
    /// caching it was started for.
    cachings: u64,
    /// In `Cached` mode: when the linger of the current caching ends.
    until: Option<Instant>,
    /// The lease whose linger task is alive, if one is (set when a caching asks
    /// for a task and none runs for that lease; cleared by the task as it ends).
    lingering: Option<Weak<Lease>>,
}

/// One key's state.
#[derive(Debug)]
pub(crate) struct Slot {
    key: LockKey,
    state: Mutex<State>,
    /// Wakes the watcher before its alarm (an earlier deadline, or the slot went
    /// idle).
    rearm: Notify,
}

/// The result of joining a slot.
#[derive(Debug)]
pub(crate) enum Join {
    /// The caller is the leader: it acquires from the backend.
    Leader(Arc<Slot>),
    /// The caller waits for a grant.
    Wait(WaiterPlace),
    /// The caller takes the cached lease (as handoff number `seq`); it holds the
    /// slot, and must check the lease is still good enough to use (else release it).
    Cached(Arc<Slot>, Arc<Lease>, u64),
    /// The local queue is full.
    Overloaded,
}

/// A waiter's place in the queue. Dropping it leaves the queue, passing on a grant
/// that arrived in the meantime.
pub(crate) struct WaiterPlace {
    slot: Arc<Slot>,
    id: u64,
    /// The place has left: it took its grant, or found itself dropped.
    done: bool,
    /// The slot's watcher runs on another runtime than this waiter's: the waiter
    /// keeps its deadline with a timer of its own.
    own_timer: bool,
    fwd: Arc<dyn Forward>,
}

impl std::fmt::Debug for WaiterPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaiterPlace")
            .field("key", &self.slot.key)
            .field("id", &self.id)
            .finish()
    }
}

/// What the caller must do after a release decision.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReleaseStep {
    /// The lease went to a local waiter; nothing else to do.
    HandedOff,
    /// Release the lease at the backend, then call [`Slot::released`].
    Backend,
    /// The slot keeps the lease for the next local task, with this caching number.
    /// With `true`, the caller starts the lease's linger task (none runs for it),
    /// which calls [`Slot::linger`] when the deadline passes; otherwise a linger
    /// task already runs for the lease, or the caller did not ask for one (it
    /// calls [`Slot::expire`] with the number itself).
    Cached(u64, bool),
}

/// How a lease may be cached: see [`Slot::release`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caching {
    /// The end of this caching's linger.
    pub(crate) until: Instant,
    /// Whether the lease's linger task should take it back at `until`.
    pub(crate) linger: bool,
}

/// What a linger task does next: see [`Slot::linger`].
#[derive(Debug)]
pub(crate) enum Linger {
    /// The lease is still cached and a later caching moved the deadline here.
    Until(Instant),
    /// The linger ended: the lease was taken back (the slot is `Releasing`);
    /// release it at the backend, then call [`Slot::released`].
    Expired(Arc<Lease>),
    /// Nothing for this task to do (the lease is in use, released or replaced):
    /// it ends, and the next caching of the lease starts a new one.
    Done,
}

/// What a failed or cancelled leader leaves to clean up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Abandon {
    /// A waiter took over (with the token); nothing to clean up.
    Succeeded,
    /// Nobody took over: release the token (if an acquire may have landed) and leave
    /// the backend queue (if this instance may be queued).
    Cleanup(Inheritance),
}

impl Slot {
    fn new(key: LockKey) -> Slot {
        Slot {
            key,
            state: Mutex::new(State {
                mode: Mode::Idle,
                removed: false,
                next_id: 0,
                waiters: Waiters::default(),
                granted: None,
                alarm: None,
                watcher_runtime: None,
                cached: None,
                cachings: 0,
                until: None,
                lingering: None,
            }),
            rearm: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding this mutex; if a panic ever did, the state is
        // still consistent step by step, so recover rather than cascade.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn key(&self) -> &LockKey {
        &self.key
    }

    #[cfg(test)]
    pub(crate) fn mode(&self) -> Mode {
        self.lock().mode
    }

    /// The watcher's alarm and the waiters left (model tests).
    #[cfg(test)]
    pub(crate) fn watch_state(&self) -> (Option<Instant>, usize) {
        let st = self.lock();
        (st.alarm, st.waiters.len())
    }

    /// Joins the slot of `key`: lead if it is idle, otherwise queue (bounded by
    /// `max_waiters`) as a caller that arrived at `wait.0` (its call began then;
    /// fair mode orders by it) and waits until `wait.1` at the latest.
    pub(crate) fn join(
        map: &SlotMap,
        key: &LockKey,
        max_waiters: usize,
        wait: (Instant, Instant),
        fwd: &Arc<dyn Forward>,
    ) -> Join {
        loop {
            if let Some(join) = Self::lookup(map, key).enter(max_waiters, wait, fwd) {
                return join;
            }
        }
    }

    /// First half of [`join`](Self::join): the key's slot, created if missing. The
    /// map's shard lock is released before returning.
    fn lookup(map: &SlotMap, key: &LockKey) -> Arc<Slot> {
        // A hit takes the shard's read lock and clones no key.
        if let Some(slot) = map.get(key) {
            return Arc::clone(slot.value());
        }
        Arc::clone(
            map.entry(key.clone())
                .or_insert_with(|| Arc::new(Slot::new(key.clone())))
                .value(),
        )
    }

    /// Second half of [`join`](Self::join); `None` if the slot was removed in between
    /// (the caller looks it up again).
    fn enter(
        self: Arc<Self>,
        max_waiters: usize,
        (arrived, deadline): (Instant, Instant),
        fwd: &Arc<dyn Forward>,
    ) -> Option<Join> {
        let mut st = self.lock();
        if st.removed {
            return None;
        }
        if st.mode == Mode::Idle {
            st.mode = Mode::Acquiring;
            drop(st);
            return Some(Join::Leader(self));
        }
        if st.mode == Mode::Cached {
            let (lease, seq) = st.cached.take().expect("a cached slot keeps its lease");
            st.mode = Mode::Held;
            drop(st);
            return Some(Join::Cached(self, lease, seq));
        }
        if st.waiters.len() >= max_waiters {
            return Some(Join::Overloaded);
        }
        let id = st.next_id;
        st.next_id += 1;
        st.waiters.push(id, arrived, deadline);
        let start = st.alarm.is_none();
        let earlier = st.alarm.is_some_and(|alarm| deadline < alarm);
        if start || earlier {
            st.alarm = Some(deadline);
        }
        // A watcher runs where it was started, and a runtime may be alive but not
        // driven (a current-thread runtime between two `block_on`s, a blocked
        // thread): a waiter of another runtime keeps a timer of its own.
        let runtime = tokio::runtime::Handle::try_current().ok().map(|h| h.id());
        let own_timer = if start {
            st.watcher_runtime = runtime;
            false
        } else {
            st.watcher_runtime != runtime
        };
        drop(st);
        if start {
            fwd.watch(&self);
        } else if earlier {
            self.rearm.notify_one();
        }
        Some(Join::Wait(WaiterPlace {
            slot: self,
            id,
            done: false,
            own_timer,
            fwd: Arc::clone(fwd),
        }))
    }

    /// Joins only if the slot is idle or caches its lease (no local holder,
    /// leader or waiter): `Leader` or `Cached`, else `Overloaded`.
    pub(crate) fn try_join(
        map: &SlotMap,
        key: &LockKey,
        start: Instant,
        fwd: &Arc<dyn Forward>,
    ) -> Join {
        match Self::join(map, key, 0, (start, start), fwd) {
            Join::Wait(_) => unreachable!("max_waiters 0 never queues"),
            other => other,
        }
    }

    /// The leader obtained the lease; returns how many local waiters it found
    /// (they set the lease's handoff budget while other instances wait).
    pub(crate) fn acquired(&self) -> usize {
        let mut st = self.lock();
        debug_assert_eq!(st.mode, Mode::Acquiring);
        st.mode = Mode::Held;
        st.waiters.len()
    }

    /// The leader failed or was cancelled. Leadership (and `token`) passes to the
    /// next live waiter; if there is none the slot goes idle and is removed.
    pub(crate) fn abandon(self: &Arc<Self>, map: &SlotMap, lead: Inheritance) -> Abandon {
        let mut st = self.lock();
        debug_assert_eq!(st.mode, Mode::Acquiring);
        match Self::grant_next(&mut st, Grant::Leadership(lead)) {
            Ok(waker) => {
                drop(st);
                if let Some(waker) = waker {
                    waker.wake();
                }
                Abandon::Succeeded
            }
            Err(_) => {
                self.go_idle(&mut st, map);
                Abandon::Cleanup(lead)
            }
        }
    }

    /// The holder is done with the lease. With `handoff` the lease (as `seq`) goes to
    /// the next live waiter, if any — with `arrived_by`, only if that waiter arrived
    /// no later than it (fair mode); with `handoff` and `cache` and no live waiter,
    /// the slot keeps it for the next task that joins, until `cache.until`;
    /// otherwise the caller releases it at the backend.
    pub(crate) fn release(
        &self,
        lease: &Arc<Lease>,
        seq: u64,
        handoff: bool,
        cache: Option<Caching>,
        arrived_by: Option<Instant>,
    ) -> ReleaseStep {
        let mut st = self.lock();
        debug_assert_eq!(st.mode, Mode::Held);
        if handoff {
            if let Some(by) = arrived_by {
                // The first live waiter decides (waiters that left are skipped).
                if st.waiters.front_arrival().is_some_and(|at| at > by) {
                    st.mode = Mode::Releasing;
                    return ReleaseStep::Backend;
                }
            }
            if let Ok(waker) = Self::grant_next(&mut st, Grant::Lease(Arc::clone(lease), seq)) {
                drop(st);
                if let Some(waker) = waker {
                    waker.wake();
                }
                return ReleaseStep::HandedOff;
            }
            if let Some(caching) = cache {
                st.mode = Mode::Cached;
                st.cached = Some((Arc::clone(lease), seq));
                st.cachings += 1;
                st.until = Some(caching.until);
                let start = caching.linger
                    && !st
                        .lingering
                        .as_ref()
                        .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(lease)));
                if start {
                    st.lingering = Some(Arc::downgrade(lease));
                }
                return ReleaseStep::Cached(st.cachings, start);
            }
        }
        st.mode = Mode::Releasing;
        ReleaseStep::Backend
    }

    /// Whether the slot keeps a cached lease.
    pub(crate) fn is_cached(&self) -> bool {
        self.lock().mode == Mode::Cached
    }

    /// Takes the cached lease back now, whatever caching kept it (the slot is then
    /// `Releasing`, as after [`expire`](Self::expire)).
    pub(crate) fn uncache(&self) -> Option<(Arc<Lease>, u64)> {
        let caching = self.lock().cachings;
        self.expire(caching)
    }

    /// The linger of caching number `caching` ended: if the slot still keeps that
    /// lease, it is taken back (the slot is `Releasing`) and returned for the caller
    /// to release at the backend, then call [`released`](Self::released).
    pub(crate) fn expire(&self, caching: u64) -> Option<(Arc<Lease>, u64)> {
        let mut st = self.lock();
        if st.mode != Mode::Cached || st.cachings != caching {
            return None;
        }
        st.mode = Mode::Releasing;
        st.cached.take()
    }

    /// The linger task of `lease` woke at `now` (its deadline passed, or with
    /// `revoked`, another instance asked for the key): takes the lease back if it
    /// is still cached and its linger ended (or it was revoked); otherwise says
    /// whether to sleep on (a later caching moved the deadline) or end. A task
    /// that ends clears the slot's record of it, so the next caching starts one.
    pub(crate) fn linger(&self, lease: &Weak<Lease>, now: Instant, revoked: bool) -> Linger {
        let mut st = self.lock();
        if !st.lingering.as_ref().is_some_and(|w| w.ptr_eq(lease)) {
            // Superseded: a task for another lease runs (this one's ended).
            return Linger::Done;
        }
        let ours = st
            .cached
            .as_ref()
            .is_some_and(|(l, _)| std::ptr::eq(Arc::as_ptr(l), lease.as_ptr()));
        if st.mode == Mode::Cached && ours {
            match st.until {
                Some(until) if !revoked && now < until => return Linger::Until(until),
                _ => {
                    st.mode = Mode::Releasing;
                    st.lingering = None;
                    let (lease, _) = st.cached.take().expect("a cached slot keeps its lease");
                    return Linger::Expired(lease);
                }
            }
        }
        st.lingering = None;
        Linger::Done
    }

    /// The linger task of `lease` ends without [`linger`](Self::linger) saying so
    /// (its future was dropped: the runtime is shutting down): the next caching
    /// of the lease starts a new one.
    pub(crate) fn linger_dropped(&self, lease: &Weak<Lease>) {
        let mut st = self.lock();
        if st.lingering.as_ref().is_some_and(|w| w.ptr_eq(lease)) {
            st.lingering = None;
        }
    }

    /// When the oldest live local waiter arrived, if there is one (fair mode).
    pub(crate) fn oldest_waiter(&self) -> Option<Instant> {
        let st = self.lock();
        st.waiters.front_arrival()
    }

    /// The backend release finished (or was given up): the next waiter leads,
    /// inheriting `lead` (whether this instance may be queued). Returns `lead` when
    /// nobody took it: the slot went idle and the caller cleans up.
    pub(crate) fn released(
        self: &Arc<Self>,
        map: &SlotMap,
        lead: Inheritance,
    ) -> Option<Inheritance> {
        let mut st = self.lock();
        debug_assert_eq!(st.mode, Mode::Releasing);
        st.mode = Mode::Acquiring;
        match Self::grant_next(&mut st, Grant::Leadership(lead)) {
            Ok(waker) => {
                drop(st);
                if let Some(waker) = waker {
                    waker.wake();
                }
                None
            }
            Err(_) => {
                self.go_idle(&mut st, map);
                Some(lead)
            }
        }
    }

    /// Gives `grant` to the first waiter, which leaves the queue; returns its
    /// waker, to wake once the mutex is released, or the grant if nobody waits.
    fn grant_next(st: &mut State, grant: Grant) -> Result<Option<Waker>, Grant> {
        let Some((id, waker)) = st.waiters.pop() else {
            return Err(grant);
        };
        debug_assert!(st.granted.is_none(), "two grants in flight");
        st.granted = Some((id, grant));
        Ok(waker)
    }

    fn go_idle(self: &Arc<Self>, st: &mut State, map: &SlotMap) {
        debug_assert!(st.waiters.is_empty() && st.granted.is_none());
        st.mode = Mode::Idle;
        st.removed = true;
        if st.alarm.is_some() {
            // The watcher wakes to no waiter and ends, letting the slot go.
            self.rearm.notify_one();
        }
        map.remove_if(&self.key, |_, s| Arc::ptr_eq(s, self));
    }

    /// The watcher woke at `now`: drops the waiters due by then (and wakes them:
    /// their places find themselves dropped) and returns when to wake next;
    /// `None`: no waiter is left and the watcher ends (a later join starts a new
    /// one).
    pub(crate) fn time_out(&self, now: Instant) -> Option<Instant> {
        let mut woken = Vec::new();
        let mut st = self.lock();
        st.alarm = st.waiters.time_out(now, &mut woken);
        let alarm = st.alarm;
        drop(st);
        woken.into_iter().for_each(Waker::wake);
        alarm
    }

    /// The watcher ended without [`time_out`](Self::time_out) saying so (its
    /// runtime shut down, or none ran it): every waiter is dropped and woken, so
    /// each either times out (its deadline passed) or joins again, starting a
    /// watcher where it runs. A grant in flight stays for its waiter.
    pub(crate) fn watch_dropped(&self) {
        let mut woken = Vec::new();
        let mut st = self.lock();
        st.alarm = None;
        st.waiters.clear(&mut woken);
        drop(st);
        woken.into_iter().for_each(Waker::wake);
    }

    /// The watcher: sleeps until the alarm (or a wake-up), times out the due
    /// waiters, and ends when none is left. Started by [`Forward::watch`];
    /// dropped before it ends (even unpolled), it calls
    /// [`watch_dropped`](Self::watch_dropped).
    pub(crate) fn watch(self: Arc<Self>) -> impl std::future::Future<Output = ()> + Send {
        /// Calls `watch_dropped` unless the loop ended by itself.
        struct Running(Option<Arc<Slot>>);
        impl Drop for Running {
            fn drop(&mut self) {
                if let Some(slot) = self.0.take() {
                    slot.watch_dropped();
                }
            }
        }
        let mut running = Running(Some(self));
        async move {
            let slot = Arc::clone(running.0.as_ref().expect("set until the loop ends"));
            let mut alarm = slot.lock().alarm;
            while let Some(until) = alarm {
                tokio::select! {
                    () = tokio::time::sleep_until(until) => {}
                    () = slot.rearm.notified() => {}
                }
                alarm = slot.time_out(Instant::now());
            }
            drop(running.0.take());
        }
    }
}

impl WaiterPlace {
    /// Waits for the grant; `None` if the slot dropped this waiter ungranted: its
    /// deadline passed, or the watcher ended with its runtime (the caller tells
    /// which by the time, and joins again in the second case). After it returns,
    /// it never completes again.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the waiter keeps its place, and
    /// dropping the place passes on any grant.
    pub(crate) async fn granted(&mut self) -> Option<Grant> {
        std::future::poll_fn(|cx| self.poll_granted(cx)).await
    }

    fn poll_granted(&mut self, cx: &Context<'_>) -> Poll<Option<Grant>> {
        if self.done {
            return Poll::Pending;
        }
        let mut st = self.slot.lock();
        if let Some(grant) = Self::take(&mut st, self.id) {
            self.done = true;
            return Poll::Ready(Some(grant));
        }
        match st.waiters.wait(self.id, cx.waker()) {
            Some(replaced) => {
                drop(st);
                drop(replaced);
                Poll::Pending
            }
            None => {
                self.done = true;
                Poll::Ready(None)
            }
        }
    }

    /// Takes the grant in flight if it is waiter `id`'s.
    fn take(st: &mut State, id: u64) -> Option<Grant> {
        match st.granted.take() {
            Some((to, grant)) if to == id => Some(grant),
            other => {
                st.granted = other;
                None
            }
        }
    }

    /// Whether a grant is waiting to be taken (model tests).
    #[cfg(test)]
    pub(crate) fn has_grant(&self) -> bool {
        !self.done && (self.slot.lock().granted.as_ref()).is_some_and(|(to, _)| *to == self.id)
    }

    pub(crate) fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }

    /// Whether the waiter must keep its deadline with a timer of its own: the
    /// slot's watcher runs on another runtime, whose being driven nothing here
    /// can rely on.
    pub(crate) fn needs_own_timer(&self) -> bool {
        self.own_timer
    }

    /// Leaves the queue; returns a grant that arrived before leaving, which the
    /// caller must pass on.
    fn leave(&mut self) -> Option<Grant> {
        if std::mem::replace(&mut self.done, true) {
            return None;
        }
        let mut st = self.slot.lock();
        let grant = Self::take(&mut st, self.id);
        let waker = st.waiters.remove(self.id);
        drop(st);
        drop(waker);
        grant
    }
}

/// Passes on a grant whose receiver no longer wants it. Implemented by the locker,
/// which knows how to finish a lease or clean up after a leader.
pub(crate) trait Forward: Send + Sync {
    fn forward(&self, slot: &Arc<Slot>, grant: Grant);

    /// Starts the slot's watcher ([`Slot::watch`]); where no task can start, calls
    /// [`Slot::watch_dropped`].
    fn watch(&self, slot: &Arc<Slot>);
}

impl Drop for WaiterPlace {
    fn drop(&mut self) {
        if let Some(grant) = self.leave() {
            self.fwd.forward(&self.slot, grant);
        }
    }
}
