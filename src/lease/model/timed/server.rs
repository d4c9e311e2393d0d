//! The server's side: its keys of one lock, its clock's past, its life and gate.

use super::parts::*;

/// The server's keys of one lock, and its clock's past that matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Server {
    /// The holder's token and the key's expiry.
    pub(super) lock: Option<(Tok, Rel)>,
    /// The last epoch minted (the fence key), or [`OLD`].
    pub(super) fence: Epoch,
    /// The greatest epoch minted before a restart, while the clock is not
    /// past it.
    pub(super) floor: Option<Epoch>,
    /// Each token's release record: its expiry, if it has one.
    pub(super) records: [Option<Rel>; 4],
    /// The current life (0 until the first restart, and without
    /// `Config::life`).
    pub(super) life: u8,
    /// When the current life started, down to `-TTL` (a quarantine from then is
    /// over).
    pub(super) started: Rel,
    /// A quarantine was written into the current life, and is not over: grants
    /// wait until `started + TTL`.
    pub(super) held: bool,
    /// Each task's queue entry (the grant path): what its last busy-answered
    /// request wrote.
    pub(super) queue: [Option<Entry>; 2],
}

impl Server {
    /// The server's clock advanced a tick: keys past their TTL are gone.
    pub(super) fn tick(&mut self) {
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
        // An entry older than a TTL is as old as any other: never granted.
        for e in self.queue.iter_mut().flatten() {
            e.at = (e.at - 1).max(-TTL);
        }
    }

    /// The holders' clock advanced a tick: the send times the entries keep
    /// age (down to `oldest`, as every send does).
    pub(super) fn age_sends(&mut self, oldest: Rel) {
        for e in self.queue.iter_mut().flatten() {
            e.sent = e.sent.map(|t| (t - 1).max(oldest));
        }
    }

    /// The tasks whose entries a release that left the lock free may grant
    /// to now, and whether some entry may not be granted (then the release
    /// may grant nothing: that entry may be the queue's head).
    pub(super) fn grantable(&self, c: &Config) -> (Vec<u8>, bool) {
        let Some(g) = c.grant else {
            return (Vec::new(), false);
        };
        let mut to = Vec::new();
        let mut refused = false;
        if self.lock.is_some() {
            return (to, false);
        }
        for (task, e) in (0u8..).zip(self.queue) {
            let Some(e) = e else { continue };
            let age = -e.at;
            let fresh = 2 * age < TTL && c.record_ttl.is_none_or(|r| age < r);
            let retired = g.checks_record && self.records[usize::from(e.tok)].is_some();
            if fresh && !retired {
                to.push(task);
            } else {
                refused = true;
            }
        }
        (to, refused)
    }

    /// Grants the lock to `task`'s entry: mints an epoch, locks until the
    /// entry's arrival plus the TTL, removes the entry; the grant message,
    /// and whether the epoch increased.
    pub(super) fn grant(&mut self, task: u8) -> (GrantMsg, bool) {
        let e = self.queue[usize::from(task)].take().expect("an entry");
        let increased = self.mint();
        let expiry = TTL + e.at;
        assert!(
            expiry > 0 && expiry <= TTL,
            "a grant's expiry within its TTL"
        );
        self.lock = Some((e.tok, expiry));
        let msg = GrantMsg {
            task,
            tok: e.tok,
            sent: e.sent,
        };
        (msg, increased)
    }

    /// An instance that had seen an earlier life reports the restart: grants
    /// wait until the life's start plus its TTL (the quarantine only grows, and
    /// every instance's TTL is [`TTL`]).
    pub(super) fn report(&mut self) {
        self.held = self.started > -TTL;
    }

    /// A restart without persistence: every key is gone. `clock_step` is
    /// how far the clock moved meanwhile (+1, or −1 when it came back
    /// behind). With `life`, the next life starts now, without a quarantine.
    pub(super) fn restart(&mut self, clock_step: Epoch, life: bool) {
        let last = self.fence - clock_step * SCALE;
        self.floor = (self.fence != OLD && last >= 0).then_some(last);
        self.lock = None;
        self.fence = OLD;
        self.records = [None; 4];
        self.queue = [None; 2];
        if life {
            self.life += 1;
            self.started = 0;
            self.held = false;
        }
    }

    /// Mints an epoch; `false` if it is not above one minted before.
    pub(super) fn mint(&mut self) -> bool {
        let epoch = (self.fence + 1).max(0);
        assert!(epoch < SCALE, "more grants in a tick than SCALE");
        self.fence = epoch;
        self.floor.take().is_none_or(|floor| epoch > floor)
    }

    /// The mutex's scripts, reduced to the lock, the fence, the records and
    /// the queue entries, for a request of `task` sent `age` ticks ago by an
    /// instance that had seen `seen` (an acquire's gate reads it); whether
    /// the epoch it minted, if any, increased.
    pub(super) fn apply(
        &mut self,
        task: u8,
        req: Req,
        age: Rel,
        seen: Option<u8>,
        c: &Config,
    ) -> (Reply, bool) {
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
                let entry = usize::from(task);
                match self.lock {
                    Some((holder, _)) if holder != t => {
                        // Queued, or the entry refreshed.
                        if let Some(g) = c.grant {
                            let sent = (g.validity == Validity::EchoedSend).then_some(-age);
                            self.queue[entry] = Some(Entry {
                                tok: t,
                                at: 0,
                                sent,
                            });
                        }
                        (Reply::Busy, true)
                    }
                    _ => {
                        let increased = self.mint();
                        self.lock = Some((t, TTL));
                        self.queue[entry] = None;
                        (Reply::Granted, increased)
                    }
                }
            }
            Req::Renew(t) => {
                let ours = self.lock.is_some_and(|(holder, _)| holder == t);
                if ours {
                    self.lock = Some((t, TTL));
                }
                (Reply::Renewed(ours), true)
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
            Req::Leave(t) => {
                let entry = &mut self.queue[usize::from(task)];
                if entry.is_some_and(|e| e.tok == t) {
                    *entry = None;
                }
                (Reply::Left, true)
            }
        }
    }
}
