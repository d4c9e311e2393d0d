//! A state of the whole system: the server, the tasks, the requests and replies on the wire.

use super::bag::Bag;
use super::parts::*;
use super::server::Server;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct State {
    pub(super) gained: u8,
    pub(super) restarts: u8,
    pub(super) faults: u8,
    pub(super) server: Server,
    pub(super) tasks: [Stage; 2],
    /// The life each task's instance saw last (`None`: none yet).
    pub(super) seen: [Option<u8>; 2],
    /// Requests on the wire (any may be delivered next).
    pub(super) wire: Bag<Flight, 8>,
    /// Replies to tasks that wait for them, with their request's send time
    /// and the life they were made in.
    pub(super) replies: Bag<(u8, Reply, Rel, u8), 6>,
    /// The grant path: each task's token whose busy answer it read (`None`:
    /// none read for this token), with the send of the last such request
    /// (kept with [`Validity::LastBusySend`] only).
    pub(super) busy: [Option<(Tok, Option<Rel>)>; 2],
    /// Grant messages on the wire (any may be read next, read again, or
    /// lost).
    pub(super) grants: Bag<GrantMsg, 3>,
}

impl State {
    /// Task `task` lost its lease: it sends the release at once.
    pub(super) fn lose(&mut self, task: u8, tok: Tok) {
        self.tasks[usize::from(task)] = Stage::Releasing(tok);
        self.send(task, Req::Release(tok), true);
    }

    /// The holders' clock advanced a tick: sends age (up to `oldest`: older
    /// ones change no outcome), validities end.
    pub(super) fn tick_holders(&mut self, oldest: Rel) {
        let age = |sent_at: Rel| (sent_at - 1).max(oldest);
        self.wire.map(|f| Flight {
            sent_at: age(f.sent_at),
            ..f
        });
        self.replies
            .map(|(task, reply, sent_at, life)| (task, reply, age(sent_at), life));
        self.grants.map(|m| GrantMsg {
            sent: m.sent.map(age),
            ..m
        });
        for (_, b) in self.busy.iter_mut().flatten() {
            *b = b.map(age);
        }
        self.server.age_sends(oldest);
        for task in 0..2u8 {
            if let Stage::Holding {
                tok,
                valid_until,
                renewing,
            } = self.tasks[usize::from(task)]
            {
                if valid_until > 1 {
                    self.tasks[usize::from(task)] = Stage::Holding {
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
    /// is dropped (it would be ignored), unless it tells of a newer life; so
    /// is a grant message for a token its task no longer waits with (a task
    /// never waits again with a token it held or gave up).
    pub(super) fn settle(&mut self) {
        let tasks = self.tasks;
        self.grants.retain(|m| match tasks[usize::from(m.task)] {
            Stage::Ready(t) | Stage::Acquiring(t) => t == m.tok,
            _ => false,
        });
        for (b, stage) in self.busy.iter_mut().zip(tasks) {
            let waits = matches!(stage, Stage::Ready(_) | Stage::Acquiring(_));
            *b = b.filter(|(t, _)| waits && stage.token() == Some(*t));
        }
        let seen = self.seen;
        self.replies.retain(|&(task, reply, _, life)| {
            !matches!(reply, Reply::Renewed(_))
                || matches!(tasks[usize::from(task)], Stage::Holding { .. })
                || seen[usize::from(task)].is_none_or(|l| life > l)
        });
    }

    /// Task `task` read a reply made in `life`. If that is newer than the
    /// life its instance saw last, it learns it; if it had seen an earlier
    /// one, the reconnect's check reports the restart (a quarantine, as the gate
    /// writes) and its lease is lost.
    pub(super) fn learn(&mut self, task: u8, life: u8) {
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
            if let Stage::Holding { tok, .. } = self.tasks[t] {
                self.lose(task, tok);
            }
        }
    }

    /// The findings of this state itself.
    pub(super) fn check(&self) -> Vec<Finding> {
        let mut found = Vec::new();
        let valid = self
            .tasks
            .iter()
            .filter(|p| matches!(p, Stage::Holding { .. }))
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
    pub(super) fn stop_waiting(&mut self, task: u8) {
        self.wire.map(|f| Flight {
            awaited: f.awaited && f.task != task,
            ..f
        });
        self.replies.retain(|&(r, ..)| r != task);
    }

    pub(super) fn send(&mut self, task: u8, req: Req, awaited: bool) {
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
