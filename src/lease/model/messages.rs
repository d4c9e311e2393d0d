//! The model of messages, without a clock: the two designs, every order of
//! requests and replies within a fault budget (see `model`'s docs).

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
    Renew(Tok),
    Release(Tok),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Reply {
    Granted,
    Busy,
    /// The token was released: a late copy of an acquire (`Retire` only).
    Retired,
    Renewed(bool),
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
enum Stage {
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
    tasks: [Stage; 3],
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
            tasks: [Stage::Ready(0), Stage::Waiting, Stage::Ready(1)],
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
            Req::Renew(t) => Reply::Renewed(st.lock == Some(t)),
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
        if task == 0 && st.tasks[1] == Stage::Waiting {
            let tok = inherited.unwrap_or_else(|| {
                st.next_tok += 1;
                st.next_tok - 1
            });
            st.tasks[1] = Stage::Ready(tok);
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
                (Stage::Acquiring(tok), Reply::Granted) => {
                    s.tasks[t] = Stage::Holding {
                        tok,
                        renewed: false,
                    };
                    s.overlapped[t] = false;
                }
                (Stage::Acquiring(tok), Reply::Busy) => s.tasks[t] = Stage::Ready(tok),
                (Stage::Acquiring(_), Reply::Retired) => {
                    s.tasks[t] = Stage::Done;
                    Self::pass_lead(&mut s, task, None);
                }
                (Stage::Holding { tok, .. }, Reply::Renewed(false)) => {
                    s.tasks[t] = Stage::Lost(tok);
                }
                (Stage::Holding { .. }, Reply::Renewed(true)) => {}
                (Stage::Releasing(_), Reply::Released(ok)) => {
                    s.untruthful |= ok && s.overlapped[t];
                    s.tasks[t] = Stage::Done;
                    Self::pass_lead(&mut s, task, None);
                }
                // A renewal's answer after the section ended.
                (_, Reply::Renewed(_)) => {}
                (phase, reply) => unreachable!("{phase:?} cannot read {reply:?}"),
            }
            next.push((label, s));
        }
        for task in 0..3u8 {
            let t = usize::from(task);
            let awaiting = st.wire.iter().any(|f| f.task == task && f.awaited)
                || st.replies.iter().any(|&(r, _)| r == task);
            match st.tasks[t] {
                Stage::Ready(tok) => {
                    let mut s = st.clone();
                    s.tasks[t] = Stage::Acquiring(tok);
                    Self::send(&mut s, task, Req::Acquire(tok), true);
                    next.push((Step::Send(task, Req::Acquire(tok)), s));
                }
                Stage::Holding { tok, renewed } => {
                    if !renewed {
                        let mut s = st.clone();
                        s.tasks[t] = Stage::Holding { tok, renewed: true };
                        Self::send(&mut s, task, Req::Renew(tok), true);
                        next.push((Step::Send(task, Req::Renew(tok)), s));
                    }
                    // The section ends: a release at the backend, or (A's first
                    // task, its second waiting) a local handoff.
                    let mut s = st.clone();
                    s.tasks[t] = Stage::Releasing(tok);
                    Self::send(&mut s, task, Req::Release(tok), true);
                    next.push((Step::Send(task, Req::Release(tok)), s));
                    if task == 0 && st.tasks[1] == Stage::Waiting {
                        let mut s = st.clone();
                        s.tasks[0] = Stage::Done;
                        s.tasks[1] = Stage::Holding {
                            tok,
                            renewed: false,
                        };
                        s.overlapped[1] = false;
                        next.push((Step::HandOff(tok), s));
                    }
                }
                Stage::Lost(tok) => {
                    let mut s = st.clone();
                    s.tasks[t] = Stage::Releasing(tok);
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
                    Stage::Acquiring(tok) => {
                        let mut s = base.clone();
                        Self::send(&mut s, task, Req::Acquire(tok), true);
                        next.push((Step::Resend(task, Req::Acquire(tok)), s));
                        // Gives up: the next local leader inherits the token (its
                        // acquire may have landed; no release was sent), else the
                        // token is released in the background.
                        let mut s = base;
                        s.tasks[t] = Stage::Done;
                        if task == 0 && s.tasks[1] == Stage::Waiting {
                            Self::pass_lead(&mut s, task, Some(tok));
                        } else {
                            Self::send(&mut s, task, Req::Release(tok), false);
                        }
                        next.push((Step::GiveUp(task, Req::Acquire(tok)), s));
                    }
                    Stage::Releasing(tok) => {
                        let mut s = base.clone();
                        Self::send(&mut s, task, Req::Release(tok), true);
                        next.push((Step::Resend(task, Req::Release(tok)), s));
                        // Gives up: the lock may still be held for the token.
                        let mut s = base;
                        s.tasks[t] = Stage::Done;
                        let waiting = task == 0 && s.tasks[1] == Stage::Waiting;
                        match self.design {
                            Design::Reuse if waiting => Self::pass_lead(&mut s, task, Some(tok)),
                            _ => {
                                Self::send(&mut s, task, Req::Release(tok), false);
                                Self::pass_lead(&mut s, task, None);
                            }
                        }
                        next.push((Step::GiveUp(task, Req::Release(tok)), s));
                    }
                    Stage::Holding { .. } => {
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
            if let Stage::Holding { tok, .. } = st.tasks[t]
                && st.lock != Some(tok)
            {
                st.overlapped[t] = true;
            }
        }
        let holders = st
            .tasks
            .iter()
            .filter(|p| matches!(p, Stage::Holding { .. }))
            .count();
        if holders > 1 {
            return Some(Violation::TwoHolders);
        }
        if st.wire.is_empty()
            && let Some(tok) = st.lock
        {
            let used = st.tasks.iter().any(|p| match *p {
                Stage::Ready(t) | Stage::Acquiring(t) | Stage::Lost(t) | Stage::Releasing(t) => {
                    t == tok
                }
                Stage::Holding { tok: t, .. } => t == tok,
                Stage::Waiting | Stage::Done => false,
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
}
