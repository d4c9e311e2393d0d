//! The timed model's parts: its units of time, its constants, what a
//! configuration allows, what it finds, and the requests, replies, phases and
//! steps of a trace.

pub(super) type Tok = u8;
/// A time, in ticks from the present of its clock.
pub(super) type Rel = i8;
/// An epoch, relative to the server's clock × `SCALE`.
pub(super) type Epoch = i16;

/// A lease's TTL, in ticks.
pub(crate) const TTL: Rel = 3;
/// How long before the server's TTL (counted from the send) the holder stops
/// believing it holds: the model's `backend::drift`.
pub(crate) const DRIFT: Rel = 1;
/// Epochs per tick of the server's clock: more than the grants of one tick.
pub(super) const SCALE: Epoch = 16;
/// No epoch minted within the last tick (nor a fence key at all): the next one
/// is the clock's.
pub(super) const OLD: Epoch = -SCALE - 1;
/// The oldest send whose answer can still be read within its validity.
pub(super) const STALE: Rel = -(TTL - DRIFT);
/// A record that outlives every delay.
pub(super) const NEVER: Rel = Rel::MAX;
/// Tokens per task.
pub(super) const ROUNDS: Tok = 2;

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
    /// Leases each task (A, B) takes, one after the other (1 or 2).
    pub(crate) rounds: [u8; 2],
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
    /// The grant path (`None`: a release never grants).
    pub(crate) grant: Option<Grant>,
    /// Stop at the first finding (for a design known to be wrong: the
    /// states are then those visited until its shortest trace).
    pub(crate) until_found: bool,
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
        rounds: [1, 1],
        late_gate: false,
        life: false,
        fresh: false,
        grant: None,
        until_found: false,
    };
}

/// The grant path: a release that finds the lock free grants it on the server
/// to a waiting task's queue entry, and publishes a grant message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    /// What the waiter counts its validity from when it takes a grant message.
    pub(crate) validity: Validity,
    /// The release grants only a token without a release record (wrong
    /// without).
    pub(crate) checks_record: bool,
    /// A waiter's token is armed from its first busy answer: one that gives
    /// up between asks releases it (wrong without: it only leaves the queue).
    pub(crate) armed: bool,
}

impl Grant {
    /// The design as written: validity from the send of the last request
    /// answered busy.
    pub(crate) const AS_WRITTEN: Grant = Grant {
        validity: Validity::LastBusySend,
        checks_record: true,
        armed: true,
    };
    /// The design with its validity taken from the send time that the entry
    /// the grant was minted from carries, echoed in the grant message.
    pub(crate) const ECHOED: Grant = Grant {
        validity: Validity::EchoedSend,
        ..Grant::AS_WRITTEN
    };
}

/// Where a waiter's validity starts when it takes a grant message (it ends a
/// TTL less the drift later).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Validity {
    /// The send of the last request whose busy answer it read.
    LastBusySend,
    /// The send of the request whose queue entry the grant was minted from:
    /// the request carries its send time (on its sender's clock, opaque to
    /// the server), the entry keeps it, the grant message echoes it.
    EchoedSend,
    /// The grant message's arrival (wrong).
    Arrival,
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
pub(super) enum Req {
    Acquire(Tok),
    Renew(Tok),
    Release(Tok),
    /// A waiter that gave up leaves the queue: its entry goes if it is still
    /// for this token.
    Leave(Tok),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Reply {
    Granted,
    Busy,
    /// The token has a release record: a late copy of an acquire.
    Retired,
    /// The gate refused a grant that landed too long after its send.
    TooLate,
    /// The life gate answered busy, granting nothing: the acquire carried
    /// another life than the server's, or grants are held.
    Gated,
    Renewed(bool),
    Released,
    /// The queue was left (never awaited).
    Left,
}

/// A request on the wire, with its send time on its sender's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct Flight {
    pub(super) task: u8,
    pub(super) req: Req,
    pub(super) sent_at: Rel,
    /// Its sender still waits for the reply.
    pub(super) awaited: bool,
    /// For an acquire, the life its sender had seen last (`None`: none).
    pub(super) life: Option<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Stage {
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

impl Stage {
    pub(super) fn token(self) -> Option<Tok> {
        match self {
            Stage::Ready(t)
            | Stage::Acquiring(t)
            | Stage::Releasing(t)
            | Stage::Holding { tok: t, .. } => Some(t),
            Stage::Done => None,
        }
    }

    /// The task's next lease, once it is done with `tok`.
    pub(super) fn after(tok: Tok, rounds: u8) -> Stage {
        if tok % ROUNDS + 1 >= rounds {
            Stage::Done
        } else {
            Stage::Ready(tok + 1)
        }
    }
}

/// One step of a trace (read through `Debug`).
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)]
pub(super) enum Step {
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
    /// A waiter gives up between asks (deadline, cancel), with the token of
    /// its queue entry.
    Abandon(u8, Tok),
    /// The server applies a task's release, which grants the lock to the
    /// other task's queue entry.
    DeliverGranting(u8, Req, u8),
    /// A task reads a grant message for its token and takes the lease.
    ReadGrant(u8, Tok),
    /// A grant message is lost.
    LoseGrant(u8, Tok),
}

/// A waiting task's queue entry (the `grants` hash field of its instance).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Entry {
    pub(super) tok: Tok,
    /// The arrival of the request that wrote it, on the server's clock.
    pub(super) at: Rel,
    /// That request's send, on its sender's clock (kept with
    /// [`Validity::EchoedSend`] only).
    pub(super) sent: Option<Rel>,
}

/// A grant message on the wire: its task, token, and the echoed send (as in
/// [`Entry::sent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) struct GrantMsg {
    pub(super) task: u8,
    pub(super) tok: Tok,
    pub(super) sent: Option<Rel>,
}
