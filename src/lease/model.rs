//! An exhaustive model of the lease protocol's messages: which orders of requests
//! and replies a backend may see, and what each side then believes.
//!
//! The model is the protocol, not the code: two instances (A with two local tasks
//! that coalesce, B with one), the mutex's server-side scripts reduced to the lock
//! key and the per-lease release records, and a network that may delay any request
//! past any later one (requests of one instance travel on several connections with
//! no mutual order: the pool of acknowledged writes, the shared connection, a
//! reconnect), lose any reply after its request was applied, and deliver a request
//! that its sender gave up on (a timeout) after the re-sent copy. Every state
//! reachable within a budget of faults (timeouts) is visited once (depth-first,
//! states deduplicated), and three properties are checked in each:
//!
//! 1. **Exclusion**: at most one task believes it holds the lock (the backend keeps
//!    its data: no expiry, no `FLUSHALL`, no failover in the model).
//! 2. **Truthful release**: a release answered "released" (`Ok`) ends a section
//!    during which the backend held the lock for that task's token throughout.
//! 3. **Nothing stranded**: once no request is in flight, the lock is not held for
//!    a token that no task will use or release (it would wait out its TTL).
//!
//! It covers acquire (with re-grant of an owned token), extend (a renewal: "not
//! the owner" is a loss), release (with its record), local handoff, the local
//! leader's inheritance after a failed release or an abandoned acquire, and the
//! background release of an abandoned token; each request may be re-sent after a
//! timeout while its first copy is still in flight. It does not cover the queue,
//! claims and wake-ups (they decide who asks when, not who holds), the read-write
//! lock and the semaphore (their grants never reuse a token; their scripts keep
//! the same record rule), and Redlock's quorum (`backend/redlock/model.rs`). Time
//! is the second model's, [`timed`]: TTL expiry of the lock, release records that
//! expire, and a server restart that loses every key, with or without the life
//! that ends the leases of the earlier one.
//!
//! Two designs are explored. [`Design::Reuse`] is the rejected design: a
//! release that fails leaves its token to the next local leader, which acquires
//! with it (a re-grant), and an acquire with a token deletes its release record.
//! [`Design::Retire`] is the protocol lockflight runs: a token whose release was sent is never
//! acquired again (the next local leader takes a fresh token and the failed one is
//! released in the background), a release that finds nothing to delete still
//! leaves a record (the token is retired), and an acquire refuses a token that has
//! a record. (Without that last record, the model finds a stranded lock: an
//! abandoned acquire's background release lands before the acquire itself.) The tests below assert that `Reuse` violates exclusion, the truthful
//! release and strands locks when requests may be reordered, that it is safe when
//! one FIFO connection carries every request of an instance, and that `Retire` is
//! safe in every order.

use std::collections::HashSet;

/// Which protocol the clients and scripts follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Design {
    /// The next local leader reuses the token of a failed release; an acquire
    /// deletes its token's release record.
    Reuse,
    /// A token whose release was sent is retired: never acquired again, and an
    /// acquire with a released token is refused.
    Retire,
}

/// How the network orders one instance's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// One FIFO connection per instance.
    Fifo,
    /// Any request may overtake any other (several connections, reconnects).
    Any,
}

/// A property that failed, with the trace that led there.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Violation {
    TwoHolders,
    UntruthfulRelease,
    Stranded,
}

type Tok = u8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Req {
    Acquire(Tok),
    Extend(Tok),
    Release(Tok),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Reply {
    Granted,
    Busy,
    /// The token was released: a late copy of an acquire (`Retire` only).
    Retired,
    Extended(bool),
    Released(bool),
}

/// A request on the wire: its task, and whether that task still waits for its
/// reply (a request its sender timed out on is still delivered, unanswered).
/// One step of a trace (its fields are read through `Debug`, in traces).
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)]
enum Step {
    Start,
    /// The backend applies a request and answers.
    Deliver(Flight, Reply),
    /// A task reads the answer to its request.
    Read(u8, Reply),
    Send(u8, Req),
    /// A's first task hands its lease to the second.
    HandOff(Tok),
    /// A timeout: the request is sent again (its first copy stays on the wire).
    Resend(u8, Req),
    /// A timeout: the task gives up the request (its copy stays on the wire).
    GiveUp(u8, Req),
    RenewalTimesOut(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Flight {
    task: u8,
    req: Req,
    awaited: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// Not started (A's second task: waiting locally for the slot).
    Waiting,
    /// About to send an acquire with this token.
    Ready(Tok),
    Acquiring(Tok),
    /// Holds the lease; `renewed` once its one renewal was sent.
    Holding {
        tok: Tok,
        renewed: bool,
    },
    /// Told the lease is lost (a renewal found another owner); still releases it.
    Lost(Tok),
    Releasing(Tok),
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    lock: Option<Tok>,
    /// Tokens with a release record that says the release deleted the lease (a bit
    /// per token).
    records: u32,
    /// Tokens retired by a release that found nothing to delete (`Retire` only).
    retired: u32,
    tasks: [Phase; 3],
    /// The backend's lock was not the task's token at some point of its section.
    overlapped: [bool; 3],
    /// Requests on the wire, in send order per instance.
    wire: Vec<Flight>,
    /// Replies on the wire to tasks that wait for them.
    replies: Vec<(u8, Reply)>,
    next_tok: Tok,
    faults: u8,
    /// A release was answered "released" for a section the backend did not hold
    /// throughout.
    untruthful: bool,
}

fn instance(task: u8) -> u8 {
    u8::from(task == 2)
}

struct Model {
    design: Design,
    order: Order,
    max_faults: u8,
    seen: HashSet<State>,
    found: Vec<(Violation, Vec<String>)>,
}

impl Model {
    fn new(design: Design, order: Order, max_faults: u8) -> Model {
        Model {
            design,
            order,
            max_faults,
            seen: HashSet::new(),
            found: Vec::new(),
        }
    }

    fn start(&self) -> State {
        State {
            lock: None,
            records: 0,
            retired: 0,
            tasks: [Phase::Ready(0), Phase::Waiting, Phase::Ready(1)],
            overlapped: [false; 3],
            wire: Vec::new(),
            replies: Vec::new(),
            next_tok: 2,
            faults: 0,
            untruthful: false,
        }
    }

    /// The backend's scripts, reduced to the lock key and the release records.
    fn apply(&self, st: &mut State, req: Req) -> Reply {
        let recorded = |st: &State, t: Tok| st.records & (1 << t) != 0;
        match req {
            Req::Acquire(t) => {
                if self.design == Design::Retire && (recorded(st, t) || st.retired & (1 << t) != 0)
                {
                    return Reply::Retired;
                }
                if st.lock.is_none() || st.lock == Some(t) {
                    st.lock = Some(t);
                    if self.design == Design::Reuse {
                        st.records &= !(1 << t);
                    }
                    Reply::Granted
                } else {
                    Reply::Busy
                }
            }
            Req::Extend(t) => Reply::Extended(st.lock == Some(t)),
            Req::Release(t) => {
                if st.lock == Some(t) {
                    st.lock = None;
                    st.records |= 1 << t;
                    Reply::Released(true)
                } else {
                    let before = recorded(st, t);
                    if self.design == Design::Retire && !before {
                        st.retired |= 1 << t;
                    }
                    Reply::Released(before)
                }
            }
        }
    }

    fn send(st: &mut State, task: u8, req: Req, awaited: bool) {
        st.wire.push(Flight { task, req, awaited });
    }

    /// A's first task is done: its second task leads, with `inherited` (a token
    /// to acquire with) or a fresh token.
    fn pass_lead(st: &mut State, task: u8, inherited: Option<Tok>) {
        if task == 0 && st.tasks[1] == Phase::Waiting {
            let tok = inherited.unwrap_or_else(|| {
                st.next_tok += 1;
                st.next_tok - 1
            });
            st.tasks[1] = Phase::Ready(tok);
        }
    }

    /// Every state reachable in one step, with a label for the trace.
    fn successors(&self, st: &State) -> Vec<(Step, State)> {
        let mut next = Vec::new();
        // The network delivers a request (in FIFO mode, only the oldest of its
        // instance); the reply goes on the wire if its sender still waits.
        for (i, f) in st.wire.iter().enumerate() {
            if self.order == Order::Fifo
                && st.wire[..i]
                    .iter()
                    .any(|g| instance(g.task) == instance(f.task))
            {
                continue;
            }
            let mut s = st.clone();
            let f = s.wire.remove(i);
            let reply = self.apply(&mut s, f.req);
            if f.awaited {
                s.replies.push((f.task, reply));
            }
            next.push((Step::Deliver(f, reply), s));
        }
        // A task reads its reply.
        for (i, &(task, reply)) in st.replies.iter().enumerate() {
            let mut s = st.clone();
            s.replies.remove(i);
            let t = usize::from(task);
            let label = Step::Read(task, reply);
            match (s.tasks[t], reply) {
                (Phase::Acquiring(tok), Reply::Granted) => {
                    s.tasks[t] = Phase::Holding {
                        tok,
                        renewed: false,
                    };
                    s.overlapped[t] = false;
                }
                (Phase::Acquiring(tok), Reply::Busy) => s.tasks[t] = Phase::Ready(tok),
                (Phase::Acquiring(_), Reply::Retired) => {
                    s.tasks[t] = Phase::Done;
                    Self::pass_lead(&mut s, task, None);
                }
                (Phase::Holding { tok, .. }, Reply::Extended(false)) => {
                    s.tasks[t] = Phase::Lost(tok);
                }
                (Phase::Holding { .. }, Reply::Extended(true)) => {}
                (Phase::Releasing(_), Reply::Released(ok)) => {
                    s.untruthful |= ok && s.overlapped[t];
                    s.tasks[t] = Phase::Done;
                    Self::pass_lead(&mut s, task, None);
                }
                // A renewal's answer after the section ended.
                (_, Reply::Extended(_)) => {}
                (phase, reply) => unreachable!("{phase:?} cannot read {reply:?}"),
            }
            next.push((label, s));
        }
        for task in 0..3u8 {
            let t = usize::from(task);
            let awaiting = st.wire.iter().any(|f| f.task == task && f.awaited)
                || st.replies.iter().any(|&(r, _)| r == task);
            match st.tasks[t] {
                Phase::Ready(tok) => {
                    let mut s = st.clone();
                    s.tasks[t] = Phase::Acquiring(tok);
                    Self::send(&mut s, task, Req::Acquire(tok), true);
                    next.push((Step::Send(task, Req::Acquire(tok)), s));
                }
                Phase::Holding { tok, renewed } => {
                    if !renewed {
                        let mut s = st.clone();
                        s.tasks[t] = Phase::Holding { tok, renewed: true };
                        Self::send(&mut s, task, Req::Extend(tok), true);
                        next.push((Step::Send(task, Req::Extend(tok)), s));
                    }
                    // The section ends: a release at the backend, or (A's first
                    // task, its second waiting) a local handoff.
                    let mut s = st.clone();
                    s.tasks[t] = Phase::Releasing(tok);
                    Self::send(&mut s, task, Req::Release(tok), true);
                    next.push((Step::Send(task, Req::Release(tok)), s));
                    if task == 0 && st.tasks[1] == Phase::Waiting {
                        let mut s = st.clone();
                        s.tasks[0] = Phase::Done;
                        s.tasks[1] = Phase::Holding {
                            tok,
                            renewed: false,
                        };
                        s.overlapped[1] = false;
                        next.push((Step::HandOff(tok), s));
                    }
                }
                Phase::Lost(tok) => {
                    let mut s = st.clone();
                    s.tasks[t] = Phase::Releasing(tok);
                    s.overlapped[t] = true;
                    Self::send(&mut s, task, Req::Release(tok), true);
                    next.push((Step::Send(task, Req::Release(tok)), s));
                }
                _ => {}
            }
            // A timeout: the task stops waiting for its request (which stays on
            // the wire, or whose reply is lost) and re-sends it, or gives up.
            if awaiting && st.faults < self.max_faults {
                let mut base = st.clone();
                base.faults += 1;
                for f in base.wire.iter_mut().filter(|f| f.task == task) {
                    f.awaited = false;
                }
                base.replies.retain(|&(r, _)| r != task);
                match st.tasks[t] {
                    Phase::Acquiring(tok) => {
                        let mut s = base.clone();
                        Self::send(&mut s, task, Req::Acquire(tok), true);
                        next.push((Step::Resend(task, Req::Acquire(tok)), s));
                        // Gives up: the next local leader inherits the token (its
                        // acquire may have landed; no release was sent), else the
                        // token is released in the background.
                        let mut s = base;
                        s.tasks[t] = Phase::Done;
                        if task == 0 && s.tasks[1] == Phase::Waiting {
                            Self::pass_lead(&mut s, task, Some(tok));
                        } else {
                            Self::send(&mut s, task, Req::Release(tok), false);
                        }
                        next.push((Step::GiveUp(task, Req::Acquire(tok)), s));
                    }
                    Phase::Releasing(tok) => {
                        let mut s = base.clone();
                        Self::send(&mut s, task, Req::Release(tok), true);
                        next.push((Step::Resend(task, Req::Release(tok)), s));
                        // Gives up: the lock may still be held for the token.
                        let mut s = base;
                        s.tasks[t] = Phase::Done;
                        let waiting = task == 0 && s.tasks[1] == Phase::Waiting;
                        match self.design {
                            Design::Reuse if waiting => Self::pass_lead(&mut s, task, Some(tok)),
                            _ => {
                                Self::send(&mut s, task, Req::Release(tok), false);
                                Self::pass_lead(&mut s, task, None);
                            }
                        }
                        next.push((Step::GiveUp(task, Req::Release(tok)), s));
                    }
                    Phase::Holding { .. } => {
                        // A renewal that timed out: retried later (not modelled).
                        next.push((Step::RenewalTimesOut(task), base));
                    }
                    _ => {}
                }
            }
        }
        next
    }

    /// Checks the state's properties; marks sections the backend stopped holding.
    fn check(st: &mut State) -> Option<Violation> {
        if st.untruthful {
            return Some(Violation::UntruthfulRelease);
        }
        for t in 0..3 {
            if let Phase::Holding { tok, .. } = st.tasks[t]
                && st.lock != Some(tok)
            {
                st.overlapped[t] = true;
            }
        }
        let holders = st
            .tasks
            .iter()
            .filter(|p| matches!(p, Phase::Holding { .. }))
            .count();
        if holders > 1 {
            return Some(Violation::TwoHolders);
        }
        if st.wire.is_empty()
            && let Some(tok) = st.lock
        {
            let used = st.tasks.iter().any(|p| match *p {
                Phase::Ready(t) | Phase::Acquiring(t) | Phase::Lost(t) | Phase::Releasing(t) => {
                    t == tok
                }
                Phase::Holding { tok: t, .. } => t == tok,
                Phase::Waiting | Phase::Done => false,
            });
            if !used {
                return Some(Violation::Stranded);
            }
        }
        None
    }

    /// Explores every reachable state; returns the violations found, each with
    /// the first trace that reached it, and the number of states visited.
    fn explore(mut self) -> (Vec<(Violation, Vec<String>)>, usize) {
        // Steps taken: (parent step, label); a trace is read back only on a
        // violation.
        let mut steps: Vec<(usize, Step)> = vec![(usize::MAX, Step::Start)];
        let mut stack = vec![(self.start(), 0usize)];
        while let Some((mut st, at)) = stack.pop() {
            if let Some(v) = Self::check(&mut st) {
                if !self.found.iter().any(|(f, _)| *f == v) {
                    let mut trace = Vec::new();
                    let mut i = at;
                    while i != 0 {
                        trace.push(format!("{:?}", steps[i].1));
                        i = steps[i].0;
                    }
                    trace.reverse();
                    self.found.push((v, trace));
                }
                continue;
            }
            if !self.seen.insert(st.clone()) {
                continue;
            }
            for (label, s) in self.successors(&st) {
                steps.push((at, label));
                stack.push((s, steps.len() - 1));
            }
        }
        let states = self.seen.len();
        (self.found, states)
    }
}

/// Explores `design` under `order` with at most `faults` timeouts: the
/// violations found (each with a trace) and the number of states visited.
pub(crate) fn explore(
    design: Design,
    order: Order,
    faults: u8,
) -> (Vec<(Violation, Vec<String>)>, usize) {
    Model::new(design, order, faults).explore()
}

/// The lease protocol in time: the lock's TTL expiry, release records that
/// expire, and a server restart without persistence.
///
/// The model above has no clock. This one has one, and fewer moving parts: two
/// instances with one task each, each task taking one or two leases (a token each)
/// one after the other. A task sends an acquire, renews what it holds (or stops
/// renewing, as a paused or dead holder does), releases it, or gives up an acquire
/// or a release it waits for (a timeout: its copy stays on the wire and the token
/// is released in the background, as `retire` and an abandoned acquire's cleanup
/// do), or stops waiting for a renewal. Any request may be delayed past any later
/// one and past any number of ticks, and so may any reply.
///
/// **Time.** Time passes in ticks ([`Step::Tick`]): the holders' clock and the
/// server's clock advance together. A lease lives [`TTL`] ticks on the server,
/// from when its script ran; the holder believes it valid until
/// `sent_at + TTL − DRIFT` on its own clock ([`DRIFT`] ticks), counted from the
/// send of the acquire or renewal that was answered, as `Lease::new` and the
/// watchdog count it; from then on it has lost the lease, and sends its release
/// (at once: a later send is the same request delivered later). A reply read
/// after that instant is no grant: the task asks again with the same token. The server's clock may also gain on the holders'
/// ([`Step::Gain`], at most `Config::gain` ticks in all): `drift` is what pays for
/// that. The lock exists while the server's clock is below its expiry: a tick
/// shorter than Redis keeps it (through its last millisecond), on the side of a
/// second holder; a release record exists through its expiry, as on Redis,
/// because the gate below is compared with it to the instant.
///
/// Every time is kept relative to the present (the holders' times to their clock,
/// the server's to its own), and a time that can no longer change an outcome is
/// clamped (a send older than a validity, an epoch older than a tick), so the
/// states are finite without a horizon: every run of any length is covered.
///
/// **Fencing epochs** are `max(last + 1, server clock × SCALE)`, as the acquire
/// script mints them from `TIME` in µs: a tick is far longer than the grants of
/// one µs, so the grants of one tick (fewer than `SCALE`) fit in it.
///
/// **Release records** live `Config::record_ttl` ticks (`None`: longer than
/// every delay, as the model above assumes). A release writes one (one that found
/// nothing retires its token with one), and an acquire with a recorded token is
/// refused. With `Config::late_gate`, an acquire that lands more than a record's
/// lifetime after its send is refused too (`lua/life_gate.lua`'s `not_after`),
/// and its sender asks again.
///
/// **A restart** ([`Step::Restart`]) loses every key at once (the lock, the
/// fence, the records) and takes a tick; with `Config::clock_back` the restarted
/// server's clock comes back a tick behind where it was. Without `Config::life`
/// the holders learn of it only from their next request's answer (a renewal
/// that finds no lease).
///
/// **The life** (`Config::life`, `backend/redis/life.rs`): the server counts its
/// lives (a restart starts the next) and keeps the current one's start and
/// whether a quarantine was written. The life starts at the restart's instant: the
/// product's starts with the first script of the new data set, no earlier, so
/// the model's quarantine is the shortest the server can write. Each instance
/// remembers the life it saw last, and an acquire carries it. The gate
/// (`lua/life_gate.lua`), after the late-grant check, answers
/// [`Reply::Gated`] (busy: nothing granted) to an acquire that carries another
/// life than the server's, and to every acquire while the server's clock is
/// before the quarantine; an acquire carrying an earlier life writes the quarantine, the
/// life's start plus the sender's longest lease TTL ([`TTL`]). Every reply is
/// tagged with the life it was made in, and an instance that reads one of a
/// life newer than it knows learns it: if it had seen an earlier one it marks
/// its lease lost (and sends the release), and the server holds grants as the
/// gate would have (this stands for the reconnect's check, `life.lua`'s
/// `life_gate` run with the instance's TTL, which also covers a renewal
/// answered "not the owner"). A grant of an earlier life read after that is
/// believed, as the product does: the quarantine is what keeps it apart. Both
/// instances have seen the first life (*witnesses*), unless `Config::fresh`:
/// then B starts after the restart, having seen no life; its first acquire is
/// answered with the life and writes no quarantine.
///
/// Checked in every state and step:
///
/// 1. **Exclusion of believed-valid holders** ([`Finding::TwoValidHolders`]): at
///    most one task holds a lease whose validity has not ended on its clock.
/// 2. **Increasing tokens** ([`Finding::TokenNotIncreasing`]): every epoch the
///    server mints is greater than every epoch it minted before.
/// 3. **No orphan lease** ([`Finding::OrphanLease`]): the lock is not held for a
///    token that no task uses and no request in flight releases (the key stays
///    locked until its TTL for nobody): a cost in liveness, not in safety.
///
/// Exploration goes on past a finding, so a property that holds in a
/// configuration holds in every state it reaches, whatever else was found.
pub(crate) mod timed {
    use std::collections::{HashSet, VecDeque};

    type Tok = u8;
    /// A time, in ticks from the present of its clock.
    type Rel = i8;
    /// An epoch, relative to the server's clock × `SCALE`.
    type Epoch = i16;

    /// A lease's TTL, in ticks.
    pub(crate) const TTL: Rel = 3;
    /// How long before the server's TTL (counted from the send) the holder stops
    /// believing it holds: the model's `backend::drift`.
    pub(crate) const DRIFT: Rel = 1;
    /// Epochs per tick of the server's clock: more than the grants of one tick.
    const SCALE: Epoch = 16;
    /// No epoch minted within the last tick (nor a fence key at all): the next one
    /// is the clock's.
    const OLD: Epoch = -SCALE - 1;
    /// The oldest send whose answer can still be read within its validity.
    const STALE: Rel = -(TTL - DRIFT);
    /// A record that outlives every delay.
    const NEVER: Rel = Rel::MAX;
    /// Tokens per task.
    const ROUNDS: Tok = 2;

    /// A small multiset, kept sorted (so that a state has one form whatever the
    /// order things were put in): requests on the wire, replies.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    struct Bag<T, const N: usize>([Option<T>; N]);

    impl<T: Copy + Ord, const N: usize> Bag<T, N> {
        const EMPTY: Self = Bag([None; N]);

        fn push(&mut self, item: T) {
            let free = self.0.iter_mut().find(|s| s.is_none());
            *free.expect("a bag big enough for every run") = Some(item);
            self.0.sort_unstable();
        }

        /// Takes out the item at `i` (as [`iter`](Self::iter) numbers them).
        fn take(&mut self, i: usize) -> T {
            let item = self.0[i].take().expect("an item");
            self.0.sort_unstable();
            item
        }

        fn iter(&self) -> impl Iterator<Item = (usize, T)> + '_ {
            self.0
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.map(|x| (i, x)))
        }

        /// Changes every item; the order is restored.
        fn map(&mut self, f: impl Fn(T) -> T) {
            for s in &mut self.0 {
                *s = s.map(&f);
            }
            self.0.sort_unstable();
        }

        fn retain(&mut self, keep: impl Fn(&T) -> bool) {
            for s in &mut self.0 {
                if s.is_some_and(|x| !keep(&x)) {
                    *s = None;
                }
            }
            self.0.sort_unstable();
        }
    }

    /// What a configuration allows.
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct Config {
        /// Ticks the server's clock may gain on the holders' in all.
        pub(crate) gain: u8,
        /// How long a release record lives, in ticks (`None`: for ever).
        pub(crate) record_ttl: Option<Rel>,
        /// Restarts without persistence.
        pub(crate) restarts: u8,
        /// A restart brings the server's clock back a tick behind.
        pub(crate) clock_back: bool,
        /// Timeouts in all: a task gives up an acquire, a release or a renewal.
        pub(crate) faults: u8,
        /// Leases each task takes, one after the other (1 or 2).
        pub(crate) rounds: u8,
        /// The gate of `lua/life_gate.lua` that refuses a grant landing more
        /// than a record's lifetime after its send (`{ -6 }`; the caller asks
        /// again). The model's send time is the server's (clocks in step: use it
        /// with no `gain`).
        pub(crate) late_gate: bool,
        /// The server's life and its quarantine (`backend/redis/life.rs`): the gate
        /// refuses an acquire that carries another life than the server's, and
        /// every acquire during a quarantine; a reply of a new life ends its reader's
        /// lease.
        pub(crate) life: bool,
        /// B starts after the restart, having seen no life (an instance started
        /// then): it sends nothing before it. With `life` and a restart.
        pub(crate) fresh: bool,
    }

    impl Config {
        /// The protocol as it runs: clocks in step, records that outlive every
        /// request, no restart; one timeout, one lease per task.
        pub(crate) const BASE: Config = Config {
            gain: 0,
            record_ttl: None,
            restarts: 0,
            clock_back: false,
            faults: 1,
            rounds: 1,
            late_gate: false,
            life: false,
            fresh: false,
        };
    }

    /// A property that failed (for [`OrphanLease`](Finding::OrphanLease), a
    /// liveness cost).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    pub(crate) enum Finding {
        TwoValidHolders,
        TokenNotIncreasing,
        OrphanLease,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    enum Req {
        Acquire(Tok),
        Extend(Tok),
        Release(Tok),
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    enum Reply {
        Granted,
        Busy,
        /// The token has a release record: a late copy of an acquire.
        Retired,
        /// The gate refused a grant that landed too long after its send.
        TooLate,
        /// The life gate answered busy, granting nothing: the acquire carried
        /// another life than the server's, or grants are held.
        Gated,
        Extended(bool),
        Released,
    }

    /// A request on the wire, with its send time on its sender's clock.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
    struct Flight {
        task: u8,
        req: Req,
        sent_at: Rel,
        /// Its sender still waits for the reply.
        awaited: bool,
        /// For an acquire, the life its sender had seen last (`None`: none).
        life: Option<u8>,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    enum Phase {
        /// About to send an acquire with this token.
        Ready(Tok),
        Acquiring(Tok),
        Holding {
            tok: Tok,
            valid_until: Rel,
            renewing: bool,
        },
        /// Releasing; also a lease lost (its validity ended, or a renewal found
        /// no lease), whose release is sent at once.
        Releasing(Tok),
        Done,
    }

    impl Phase {
        fn token(self) -> Option<Tok> {
            match self {
                Phase::Ready(t)
                | Phase::Acquiring(t)
                | Phase::Releasing(t)
                | Phase::Holding { tok: t, .. } => Some(t),
                Phase::Done => None,
            }
        }

        /// The task's next lease, once it is done with `tok`.
        fn after(tok: Tok, rounds: u8) -> Phase {
            if tok % ROUNDS + 1 >= rounds {
                Phase::Done
            } else {
                Phase::Ready(tok + 1)
            }
        }
    }

    /// One step of a trace (read through `Debug`).
    #[derive(Clone, Copy, Debug)]
    #[allow(dead_code)]
    enum Step {
        Start,
        /// The holders' and the server's clocks advance a tick.
        Tick,
        /// The server's clock advances a tick alone.
        Gain,
        /// The server restarts without persistence, and a tick passes.
        Restart,
        Send(u8, Req),
        /// The server applies a request and answers.
        Deliver(u8, Req, Reply),
        Read(u8, Reply),
        /// A timeout: the task stops waiting for its request.
        GiveUp(u8, Req),
    }

    /// The server's keys of one lock, and its clock's past that matters.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    struct Server {
        /// The holder's token and the key's expiry.
        lock: Option<(Tok, Rel)>,
        /// The last epoch minted (the fence key), or [`OLD`].
        fence: Epoch,
        /// The greatest epoch minted before a restart, while the clock is not
        /// past it.
        floor: Option<Epoch>,
        /// Each token's release record: its expiry, if it has one.
        records: [Option<Rel>; 4],
        /// The current life (0 until the first restart, and without
        /// `Config::life`).
        life: u8,
        /// When the current life started, down to `-TTL` (a quarantine from then is
        /// over).
        started: Rel,
        /// A quarantine was written into the current life, and is not over: grants
        /// wait until `started + TTL`.
        held: bool,
    }

    impl Server {
        /// The server's clock advanced a tick: keys past their TTL are gone.
        fn tick(&mut self) {
            self.lock = self
                .lock
                .filter(|(_, at)| *at > 1)
                .map(|(t, at)| (t, at - 1));
            // A record lives through its last instant, as Redis keeps a key
            // until its clock is past the expiry (the gate's bound is compared
            // the same way).
            for r in &mut self.records {
                *r = r
                    .filter(|at| *at > 0)
                    .map(|at| if at == NEVER { at } else { at - 1 });
            }
            self.fence = (self.fence - SCALE).max(OLD);
            self.floor = self.floor.map(|f| f - SCALE).filter(|f| *f >= 0);
            self.started = (self.started - 1).max(-TTL);
            self.held &= self.started > -TTL;
        }

        /// An instance that had seen an earlier life reports the restart: grants
        /// wait until the life's start plus its TTL (the quarantine only grows, and
        /// every instance's TTL is [`TTL`]).
        fn report(&mut self) {
            self.held = self.started > -TTL;
        }

        /// A restart without persistence: every key is gone. `clock_step` is
        /// how far the clock moved meanwhile (+1, or −1 when it came back
        /// behind). With `life`, the next life starts now, without a quarantine.
        fn restart(&mut self, clock_step: Epoch, life: bool) {
            let last = self.fence - clock_step * SCALE;
            self.floor = (self.fence != OLD && last >= 0).then_some(last);
            self.lock = None;
            self.fence = OLD;
            self.records = [None; 4];
            if life {
                self.life += 1;
                self.started = 0;
                self.held = false;
            }
        }

        /// Mints an epoch; `false` if it is not above one minted before.
        fn mint(&mut self) -> bool {
            let epoch = (self.fence + 1).max(0);
            assert!(epoch < SCALE, "more grants in a tick than SCALE");
            self.fence = epoch;
            self.floor.take().is_none_or(|floor| epoch > floor)
        }

        /// The mutex's scripts, reduced to the lock, the fence and the records,
        /// for a request sent `age` ticks ago by an instance that had seen
        /// `seen` (an acquire's gate reads it); whether the epoch it minted, if
        /// any, increased.
        fn apply(&mut self, req: Req, age: Rel, seen: Option<u8>, c: &Config) -> (Reply, bool) {
            let record_until = c.record_ttl.unwrap_or(NEVER);
            match req {
                Req::Acquire(_) if c.late_gate && c.record_ttl.is_some_and(|ttl| age > ttl) => {
                    (Reply::TooLate, true)
                }
                Req::Acquire(_) if c.life && (seen != Some(self.life) || self.held) => {
                    if seen.is_some_and(|l| l != self.life) {
                        self.report();
                    }
                    (Reply::Gated, true)
                }
                Req::Acquire(t) => {
                    if self.records[usize::from(t)].is_some() {
                        return (Reply::Retired, true);
                    }
                    match self.lock {
                        Some((holder, _)) if holder != t => (Reply::Busy, true),
                        _ => {
                            let increased = self.mint();
                            self.lock = Some((t, TTL));
                            (Reply::Granted, increased)
                        }
                    }
                }
                Req::Extend(t) => {
                    let ours = self.lock.is_some_and(|(holder, _)| holder == t);
                    if ours {
                        self.lock = Some((t, TTL));
                    }
                    (Reply::Extended(ours), true)
                }
                Req::Release(t) => {
                    let record = &mut self.records[usize::from(t)];
                    if self.lock.is_some_and(|(holder, _)| holder == t) {
                        self.lock = None;
                        *record = Some(record_until);
                    } else if record.is_none() {
                        // Retires the token (`SET NX`).
                        *record = Some(record_until);
                    }
                    (Reply::Released, true)
                }
            }
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    struct State {
        gained: u8,
        restarts: u8,
        faults: u8,
        server: Server,
        tasks: [Phase; 2],
        /// The life each task's instance saw last (`None`: none yet).
        seen: [Option<u8>; 2],
        /// Requests on the wire (any may be delivered next).
        wire: Bag<Flight, 8>,
        /// Replies to tasks that wait for them, with their request's send time
        /// and the life they were made in.
        replies: Bag<(u8, Reply, Rel, u8), 6>,
    }

    impl State {
        /// Task `task` lost its lease: it sends the release at once.
        fn lose(&mut self, task: u8, tok: Tok) {
            self.tasks[usize::from(task)] = Phase::Releasing(tok);
            self.send(task, Req::Release(tok), true);
        }

        /// The holders' clock advanced a tick: sends age (up to `oldest`: older
        /// ones change no outcome), validities end.
        fn tick_holders(&mut self, oldest: Rel) {
            let age = |sent_at: Rel| (sent_at - 1).max(oldest);
            self.wire.map(|f| Flight {
                sent_at: age(f.sent_at),
                ..f
            });
            self.replies
                .map(|(task, reply, sent_at, life)| (task, reply, age(sent_at), life));
            for task in 0..2u8 {
                if let Phase::Holding {
                    tok,
                    valid_until,
                    renewing,
                } = self.tasks[usize::from(task)]
                {
                    if valid_until > 1 {
                        self.tasks[usize::from(task)] = Phase::Holding {
                            tok,
                            valid_until: valid_until - 1,
                            renewing,
                        };
                    } else {
                        self.lose(task, tok);
                    }
                }
            }
        }

        /// The canonical form: a renewal's answer to a task that no longer holds
        /// is dropped (it would be ignored), unless it tells of a newer life.
        fn settle(&mut self) {
            let tasks = self.tasks;
            let seen = self.seen;
            self.replies.retain(|&(task, reply, _, life)| {
                !matches!(reply, Reply::Extended(_))
                    || matches!(tasks[usize::from(task)], Phase::Holding { .. })
                    || seen[usize::from(task)].is_none_or(|l| life > l)
            });
        }

        /// Task `task` read a reply made in `life`. If that is newer than the
        /// life its instance saw last, it learns it; if it had seen an earlier
        /// one, the reconnect's check reports the restart (a quarantine, as the gate
        /// writes) and its lease is lost.
        fn learn(&mut self, task: u8, life: u8) {
            let t = usize::from(task);
            let before = self.seen[t];
            if before.is_some_and(|l| l >= life) {
                return;
            }
            self.seen[t] = Some(life);
            if before.is_some() {
                if life == self.server.life {
                    self.server.report();
                }
                if let Phase::Holding { tok, .. } = self.tasks[t] {
                    self.lose(task, tok);
                }
            }
        }

        /// The findings of this state itself.
        fn check(&self) -> Vec<Finding> {
            let mut found = Vec::new();
            let valid = self
                .tasks
                .iter()
                .filter(|p| matches!(p, Phase::Holding { .. }))
                .count();
            if valid > 1 {
                found.push(Finding::TwoValidHolders);
            }
            if let Some((tok, _)) = self.server.lock {
                let used = self.tasks.iter().any(|p| p.token() == Some(tok));
                let released = self.wire.iter().any(|(_, f)| f.req == Req::Release(tok));
                if !used && !released {
                    found.push(Finding::OrphanLease);
                }
            }
            found
        }

        /// The task stops waiting for its requests (their copies stay on the
        /// wire) and for their replies.
        fn stop_waiting(&mut self, task: u8) {
            self.wire.map(|f| Flight {
                awaited: f.awaited && f.task != task,
                ..f
            });
            self.replies.retain(|&(r, ..)| r != task);
        }

        fn send(&mut self, task: u8, req: Req, awaited: bool) {
            let life = match req {
                Req::Acquire(_) => self.seen[usize::from(task)],
                _ => None,
            };
            self.wire.push(Flight {
                task,
                req,
                sent_at: 0,
                awaited,
                life,
            });
        }
    }

    struct Explorer {
        config: Config,
        seen: HashSet<State>,
        /// Per state index: the state it was first reached from, and the step.
        parents: Vec<(u32, Step)>,
        /// Each finding with the first trace that reached it.
        found: Vec<(Finding, Vec<String>)>,
    }

    impl Explorer {
        fn start(&self) -> State {
            State {
                gained: 0,
                restarts: 0,
                faults: 0,
                server: Server {
                    lock: None,
                    fence: OLD,
                    floor: None,
                    records: [None; 4],
                    life: 0,
                    started: -TTL,
                    held: false,
                },
                tasks: [Phase::Ready(0), Phase::Ready(ROUNDS)],
                seen: [Some(0), (!self.config.fresh).then_some(0)],
                wire: Bag::EMPTY,
                replies: Bag::EMPTY,
            }
        }

        /// Every state one step away, each with a finding of the step itself.
        fn successors(&self, st: &State) -> Vec<(Step, State, Option<Finding>)> {
            let c = self.config;
            // The oldest send that matters: one whose answer is read after its
            // validity, or (with the gate) one the gate refuses.
            let oldest = match c.record_ttl {
                Some(ttl) if c.late_gate => STALE.min(-ttl - 1),
                _ => STALE,
            };
            let mut next = Vec::new();
            let mut push = |step, mut s: State, found| {
                s.settle();
                next.push((step, s, found));
            };
            let mut s = *st;
            s.tick_holders(oldest);
            s.server.tick();
            push(Step::Tick, s, None);
            if st.gained < c.gain {
                let mut s = *st;
                s.gained += 1;
                s.server.tick();
                push(Step::Gain, s, None);
            }
            if st.restarts < c.restarts {
                let mut s = *st;
                s.restarts += 1;
                s.tick_holders(oldest);
                s.server.restart(if c.clock_back { -1 } else { 1 }, c.life);
                push(Step::Restart, s, None);
            }
            for (i, f) in st.wire.iter() {
                if i > 0 && st.wire.0[i - 1] == Some(f) {
                    continue;
                }
                let mut s = *st;
                s.wire.take(i);
                let (reply, increased) = s.server.apply(f.req, -f.sent_at, f.life, &c);
                let life = s.server.life;
                let t = usize::from(f.task);
                // A reply of a life its reader has not seen is read later: when,
                // matters.
                let known = s.seen[t] == Some(life);
                match (f.awaited, s.tasks[t], reply) {
                    (false, ..) => {}
                    // Answers whose reading depends on nothing else (not the time,
                    // not what other tasks do) are read at once: reading them
                    // later adds states, no outcomes.
                    (true, Phase::Acquiring(tok), Reply::Busy | Reply::TooLate | Reply::Gated)
                        if known =>
                    {
                        s.tasks[t] = Phase::Ready(tok);
                    }
                    (true, Phase::Acquiring(tok), Reply::Retired)
                    | (true, Phase::Releasing(tok), Reply::Released)
                        if known =>
                    {
                        s.tasks[t] = Phase::after(tok, c.rounds);
                    }
                    (true, ..) => s.replies.push((f.task, reply, f.sent_at, life)),
                }
                let found = (!increased).then_some(Finding::TokenNotIncreasing);
                push(Step::Deliver(f.task, f.req, reply), s, found);
            }
            for (i, (task, reply, sent_at, life)) in st.replies.iter() {
                let mut s = *st;
                s.replies.take(i);
                let t = usize::from(task);
                let believed_until = sent_at + TTL - DRIFT;
                s.tasks[t] = match (st.tasks[t], reply) {
                    // A reply after the validity it would give is no grant: ask
                    // again with the same token.
                    (Phase::Acquiring(tok), Reply::Granted) if believed_until <= 0 => {
                        Phase::Ready(tok)
                    }
                    (Phase::Acquiring(tok), Reply::Granted) => Phase::Holding {
                        tok,
                        valid_until: believed_until,
                        renewing: false,
                    },
                    (
                        Phase::Holding {
                            tok, valid_until, ..
                        },
                        Reply::Extended(true),
                    ) => Phase::Holding {
                        tok,
                        valid_until: valid_until.max(believed_until),
                        renewing: false,
                    },
                    (Phase::Holding { tok, .. }, Reply::Extended(false)) => {
                        s.lose(task, tok);
                        s.tasks[t]
                    }
                    // A renewal's answer after the lease ended, kept for the life
                    // it tells of.
                    (phase, Reply::Extended(_)) => phase,
                    (Phase::Acquiring(tok), Reply::Busy | Reply::TooLate | Reply::Gated) => {
                        Phase::Ready(tok)
                    }
                    (Phase::Acquiring(tok), Reply::Retired)
                    | (Phase::Releasing(tok), Reply::Released) => Phase::after(tok, c.rounds),
                    (phase, reply) => unreachable!("{phase:?} cannot read {reply:?}"),
                };
                s.learn(task, life);
                push(Step::Read(task, reply), s, None);
            }
            for task in 0..2u8 {
                let t = usize::from(task);
                match st.tasks[t] {
                    // B, started after the restart, sends nothing before it.
                    Phase::Ready(_) if task == 1 && c.fresh && st.restarts < c.restarts => {}
                    Phase::Ready(tok) => {
                        let mut s = *st;
                        s.tasks[t] = Phase::Acquiring(tok);
                        s.send(task, Req::Acquire(tok), true);
                        push(Step::Send(task, Req::Acquire(tok)), s, None);
                    }
                    Phase::Holding {
                        tok,
                        valid_until,
                        renewing,
                    } => {
                        if !renewing {
                            let mut s = *st;
                            s.tasks[t] = Phase::Holding {
                                tok,
                                valid_until,
                                renewing: true,
                            };
                            s.send(task, Req::Extend(tok), true);
                            push(Step::Send(task, Req::Extend(tok)), s, None);
                        } else if st.faults < c.faults {
                            // The renewal timed out; the next one may be sent.
                            let mut s = *st;
                            s.faults += 1;
                            s.stop_waiting(task);
                            s.tasks[t] = Phase::Holding {
                                tok,
                                valid_until,
                                renewing: false,
                            };
                            push(Step::GiveUp(task, Req::Extend(tok)), s, None);
                        }
                        let mut s = *st;
                        s.tasks[t] = Phase::Releasing(tok);
                        s.send(task, Req::Release(tok), true);
                        push(Step::Send(task, Req::Release(tok)), s, None);
                    }
                    Phase::Acquiring(tok) | Phase::Releasing(tok) if st.faults < c.faults => {
                        // Gives up: the token is released in the background (an
                        // abandoned acquire's cleanup, a failed release's repeat),
                        // and the task goes on with a fresh one.
                        let given_up = match st.tasks[t] {
                            Phase::Acquiring(_) => Req::Acquire(tok),
                            _ => Req::Release(tok),
                        };
                        let mut s = *st;
                        s.faults += 1;
                        s.stop_waiting(task);
                        s.send(task, Req::Release(tok), false);
                        s.tasks[t] = Phase::after(tok, c.rounds);
                        push(Step::GiveUp(task, given_up), s, None);
                    }
                    _ => {}
                }
            }
            next
        }

        /// Keeps the first trace of `finding`: the one to state `at`, then `last`.
        fn record(&mut self, finding: Finding, at: u32, last: Option<Step>) {
            if self.found.iter().any(|(f, _)| *f == finding) {
                return;
            }
            let mut trace: Vec<String> = last.iter().map(|s| format!("{s:?}")).collect();
            let mut i = at;
            while i != 0 {
                let (parent, step) = self.parents[i as usize];
                trace.push(format!("{step:?}"));
                i = parent;
            }
            trace.reverse();
            self.found.push((finding, trace));
        }

        /// Breadth first, so that each trace is a shortest one.
        fn run(mut self) -> Explored {
            let start = self.start();
            self.seen.insert(start);
            self.parents.push((0, Step::Start));
            let mut queue = VecDeque::from([(start, 0u32)]);
            while let Some((st, at)) = queue.pop_front() {
                for finding in st.check() {
                    self.record(finding, at, None);
                }
                for (step, s, found) in self.successors(&st) {
                    if let Some(finding) = found {
                        self.record(finding, at, Some(step));
                    }
                    if !self.seen.insert(s) {
                        continue;
                    }
                    let id = u32::try_from(self.parents.len()).expect("fewer than 2^32 states");
                    self.parents.push((at, step));
                    queue.push_back((s, id));
                }
            }
            let mut found = self.found;
            found.sort_by_key(|(f, _)| *f);
            Explored {
                found,
                states: self.seen.len(),
            }
        }
    }

    /// What an exploration found, and how many states it visited.
    pub(crate) struct Explored {
        /// Each finding with the first (shortest) trace that reached it.
        pub(crate) found: Vec<(Finding, Vec<String>)>,
        pub(crate) states: usize,
    }

    impl Explored {
        pub(crate) fn kinds(&self) -> Vec<Finding> {
            self.found.iter().map(|(f, _)| *f).collect()
        }
    }

    /// Explores every state `config` allows.
    pub(crate) fn explore(config: Config) -> Explored {
        Explorer {
            config,
            seen: HashSet::new(),
            parents: Vec::new(),
            found: Vec::new(),
        }
        .run()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(found: &[(Violation, Vec<String>)]) -> Vec<Violation> {
        let mut v: Vec<Violation> = found.iter().map(|(v, _)| v.clone()).collect();
        v.sort_by_key(|v| format!("{v:?}"));
        v
    }

    #[test]
    fn reusing_a_released_token_over_reordering_connections_breaks_every_property() {
        let (found, states) = explore(Design::Reuse, Order::Any, 2);
        for (v, trace) in &found {
            eprintln!("{v:?}:\n  {}", trace.join("\n  "));
        }
        assert!(states > 100, "{states} states");
        let found = kinds(&found);
        for v in [
            Violation::TwoHolders,
            Violation::UntruthfulRelease,
            Violation::Stranded,
        ] {
            assert!(found.contains(&v), "{v:?} not found: {found:?}");
        }
    }

    #[test]
    fn reuse_is_safe_on_one_fifo_connection_per_instance() {
        let (found, states) = explore(Design::Reuse, Order::Fifo, max_faults());
        assert!(found.is_empty(), "{found:?} in {states} states");
    }

    /// The fault budget explored: 2 by default (about 190,000 states in all), more
    /// with `LOCKFLIGHT_MODEL_FAULTS` (3: some 625,000 more, about a minute in a
    /// debug build).
    fn max_faults() -> u8 {
        std::env::var("LOCKFLIGHT_MODEL_FAULTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2)
    }

    #[test]
    fn retired_tokens_keep_every_property_in_every_order() {
        for faults in 0..=max_faults() {
            let (found, states) = explore(Design::Retire, Order::Any, faults);
            assert!(
                found.is_empty(),
                "{faults} faults, {states} states: {found:?}"
            );
            eprintln!("{faults} faults: {states} states, no violation");
        }
    }

    use super::timed::{self, Config, DRIFT, Finding};

    /// Explores `config`, printing what it found, each with its shortest trace.
    fn in_time(config: Config) -> timed::Explored {
        let explored = timed::explore(config);
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
    fn rounds() -> u8 {
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
            rounds: rounds(),
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
            rounds: rounds(),
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
            rounds: rounds(),
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
            rounds: rounds(),
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
            rounds: rounds(),
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
}
