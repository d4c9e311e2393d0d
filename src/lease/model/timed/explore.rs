//! The search: every state a configuration allows, breadth first, with the first trace to each finding.

use std::collections::{HashSet, VecDeque};

use super::bag::Bag;
use super::parts::*;
use super::server::Server;
use super::state::State;

pub(super) struct Explorer {
    pub(super) config: Config,
    pub(super) seen: HashSet<State>,
    /// Per state index: the state it was first reached from, and the step.
    pub(super) parents: Vec<(u32, Step)>,
    /// Each finding with the first trace that reached it.
    pub(super) found: Vec<(Finding, Vec<String>)>,
}

impl Explorer {
    pub(super) fn start(&self) -> State {
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
                queue: [None; 2],
            },
            tasks: [Stage::Ready(0), Stage::Ready(ROUNDS)],
            seen: [Some(0), (!self.config.fresh).then_some(0)],
            wire: Bag::EMPTY,
            replies: Bag::EMPTY,
            busy: [None; 2],
            grants: Bag::EMPTY,
        }
    }

    /// Every state one step away, each with a finding of the step itself.
    pub(super) fn successors(&self, st: &State) -> Vec<(Step, State, Option<Finding>)> {
        let c = self.config;
        // The oldest send that matters: one whose answer is read after its
        // validity, or (with the gate) one the gate refuses.
        let oldest = match c.record_ttl {
            Some(ttl) if c.late_gate => STALE.min(-ttl - 1),
            _ => STALE,
        };
        let counts_from_busy = c
            .grant
            .is_some_and(|g| g.validity == Validity::LastBusySend);
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
            let (reply, increased) = s.server.apply(f.task, f.req, -f.sent_at, f.life, &c);
            let life = s.server.life;
            let t = usize::from(f.task);
            // A reply of a life its reader has not seen is read later: when,
            // matters.
            let known = s.seen[t] == Some(life);
            match (f.awaited, s.tasks[t], reply) {
                (false, ..) => {}
                // Answers whose reading depends on nothing else (not the time,
                // not what other tasks do) are read at once: reading them
                // later adds states, no outcomes. When a grant counts from the
                // last busy answer, when that is read matters.
                (true, Stage::Acquiring(tok), Reply::Busy | Reply::TooLate | Reply::Gated)
                    if known && (reply != Reply::Busy || !counts_from_busy) =>
                {
                    if reply == Reply::Busy && c.grant.is_some() {
                        s.busy[t] = Some((tok, None));
                    }
                    s.tasks[t] = Stage::Ready(tok);
                }
                (true, Stage::Acquiring(tok), Reply::Retired)
                | (true, Stage::Releasing(tok), Reply::Released)
                    if known =>
                {
                    s.tasks[t] = Stage::after(tok, c.rounds[t]);
                }
                (true, ..) => s.replies.push((f.task, reply, f.sent_at, life)),
            }
            let step = Step::Deliver(f.task, f.req, reply);
            let found = (!increased).then_some(Finding::TokenNotIncreasing);
            if !matches!(f.req, Req::Release(_)) {
                push(step, s, found);
                continue;
            }
            // A release that leaves the lock free may grant it to a queue
            // entry, or grant nothing.
            let (to, refused) = s.server.grantable(&c);
            for task in to.iter().copied() {
                let mut g = s;
                let (msg, minted) = g.server.grant(task);
                g.grants.push(msg);
                let found = (!minted).then_some(Finding::TokenNotIncreasing);
                push(Step::DeliverGranting(f.task, f.req, task), g, found);
            }
            if to.is_empty() || refused {
                push(step, s, found);
            }
        }
        for (i, (task, reply, sent_at, life)) in st.replies.iter() {
            let mut s = *st;
            s.replies.take(i);
            let t = usize::from(task);
            let believed_until = sent_at + TTL - DRIFT;
            s.tasks[t] = match (st.tasks[t], reply) {
                // A reply after the validity it would give is no grant: ask
                // again with the same token.
                (Stage::Acquiring(tok), Reply::Granted) if believed_until <= 0 => Stage::Ready(tok),
                (Stage::Acquiring(tok), Reply::Granted) => Stage::Holding {
                    tok,
                    valid_until: believed_until,
                    renewing: false,
                },
                (
                    Stage::Holding {
                        tok, valid_until, ..
                    },
                    Reply::Renewed(true),
                ) => Stage::Holding {
                    tok,
                    valid_until: valid_until.max(believed_until),
                    renewing: false,
                },
                (Stage::Holding { tok, .. }, Reply::Renewed(false)) => {
                    s.lose(task, tok);
                    s.tasks[t]
                }
                // A renewal's answer after the lease ended, kept for the life
                // it tells of.
                (phase, Reply::Renewed(_)) => phase,
                (Stage::Acquiring(tok), Reply::Busy) if c.grant.is_some() => {
                    s.busy[t] = Some((tok, Some(sent_at)));
                    Stage::Ready(tok)
                }
                (Stage::Acquiring(tok), Reply::Busy | Reply::TooLate | Reply::Gated) => {
                    Stage::Ready(tok)
                }
                (Stage::Acquiring(tok), Reply::Retired)
                | (Stage::Releasing(tok), Reply::Released) => Stage::after(tok, c.rounds[t]),
                (phase, reply) => unreachable!("{phase:?} cannot read {reply:?}"),
            };
            s.learn(task, life);
            push(Step::Read(task, reply), s, None);
        }
        if let Some(g) = c.grant {
            for (i, m) in st.grants.iter() {
                let mut s = *st;
                s.grants.take(i);
                // Lost, or read too late (the same: the task asks again).
                push(Step::LoseGrant(m.task, m.tok), s, None);
                // Read in time: the task takes the lease, without a request.
                let t = usize::from(m.task);
                let from = match g.validity {
                    Validity::LastBusySend => st.busy[t].and_then(|(_, b)| b),
                    Validity::EchoedSend => m.sent,
                    Validity::Arrival => Some(0),
                };
                if let Some(valid_until) = from.map(|b| b + TTL - DRIFT).filter(|v| *v > 0) {
                    s.stop_waiting(m.task);
                    s.tasks[t] = Stage::Holding {
                        tok: m.tok,
                        valid_until,
                        renewing: false,
                    };
                    push(Step::ReadGrant(m.task, m.tok), s, None);
                }
            }
        }
        for task in 0..2u8 {
            let t = usize::from(task);
            match st.tasks[t] {
                // A waiter gives up between asks (deadline, cancel): it
                // releases its token, armed since its busy answer (not armed:
                // nothing), and leaves the queue. Or it asks again.
                Stage::Ready(tok) if st.busy[t].is_some() && st.faults < c.faults => {
                    let mut s = *st;
                    s.faults += 1;
                    if c.grant.is_some_and(|g| g.armed) {
                        s.send(task, Req::Release(tok), false);
                    }
                    s.send(task, Req::Leave(tok), false);
                    s.tasks[t] = Stage::after(tok, c.rounds[t]);
                    push(Step::Abandon(task, tok), s, None);
                    let mut s = *st;
                    s.tasks[t] = Stage::Acquiring(tok);
                    s.send(task, Req::Acquire(tok), true);
                    push(Step::Send(task, Req::Acquire(tok)), s, None);
                }
                // B, started after the restart, sends nothing before it.
                Stage::Ready(_) if task == 1 && c.fresh && st.restarts < c.restarts => {}
                Stage::Ready(tok) => {
                    let mut s = *st;
                    s.tasks[t] = Stage::Acquiring(tok);
                    s.send(task, Req::Acquire(tok), true);
                    push(Step::Send(task, Req::Acquire(tok)), s, None);
                }
                Stage::Holding {
                    tok,
                    valid_until,
                    renewing,
                } => {
                    if !renewing {
                        let mut s = *st;
                        s.tasks[t] = Stage::Holding {
                            tok,
                            valid_until,
                            renewing: true,
                        };
                        s.send(task, Req::Renew(tok), true);
                        push(Step::Send(task, Req::Renew(tok)), s, None);
                    } else if st.faults < c.faults {
                        // The renewal timed out; the next one may be sent.
                        let mut s = *st;
                        s.faults += 1;
                        s.stop_waiting(task);
                        s.tasks[t] = Stage::Holding {
                            tok,
                            valid_until,
                            renewing: false,
                        };
                        push(Step::GiveUp(task, Req::Renew(tok)), s, None);
                    }
                    let mut s = *st;
                    s.tasks[t] = Stage::Releasing(tok);
                    s.send(task, Req::Release(tok), true);
                    push(Step::Send(task, Req::Release(tok)), s, None);
                }
                Stage::Acquiring(tok) | Stage::Releasing(tok) if st.faults < c.faults => {
                    // Gives up: the token is released in the background (an
                    // abandoned acquire's cleanup, a failed release's repeat),
                    // and the task goes on with a fresh one.
                    let given_up = match st.tasks[t] {
                        Stage::Acquiring(_) => Req::Acquire(tok),
                        _ => Req::Release(tok),
                    };
                    let mut s = *st;
                    s.faults += 1;
                    s.stop_waiting(task);
                    s.send(task, Req::Release(tok), false);
                    if c.grant.is_some() && given_up == Req::Acquire(tok) {
                        s.send(task, Req::Leave(tok), false);
                    }
                    s.tasks[t] = Stage::after(tok, c.rounds[t]);
                    push(Step::GiveUp(task, given_up), s, None);
                }
                _ => {}
            }
        }
        next
    }

    /// Keeps the first trace of `finding`: the one to state `at`, then `last`.
    pub(super) fn record(&mut self, finding: Finding, at: u32, last: Option<Step>) {
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

    /// Breadth first, so that each trace is a shortest one; with
    /// `Config::until_found`, up to the first finding.
    pub(super) fn run(mut self) -> Explored {
        let start = self.start();
        self.seen.insert(start);
        self.parents.push((0, Step::Start));
        let mut queue = VecDeque::from([(start, 0u32)]);
        while let Some((st, at)) = queue.pop_front() {
            if self.config.until_found && !self.found.is_empty() {
                break;
            }
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
