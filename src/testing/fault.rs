//! The faults a test turns on: which requests and messages they hit, how often,
//! and what happens to them.

use std::sync::Mutex;
use std::time::Duration;

use crate::error::{Error, Phase, Result};
use crate::key::LockKey;

/// A kind of request sent to the server (by an instance, or by a
/// [`SimFencedKey`](super::SimFencedKey)): what a fault hits and what
/// [`Requests`](super::Requests) counts.
///
/// Each lock kind's requests count under the same names: a read lease, a write
/// lease and a semaphore permit are acquired, renewed and released as a mutex
/// lease is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// Acquire-or-enqueue: a lock, a read or write lease, semaphore permits.
    Acquire,
    /// A renewal of a held lease, one request per lease.
    Renew,
    /// A release of a held lease (or permit).
    Release,
    /// A waiter that gives up leaves the key's queue.
    Leave,
    /// A write, read or delete of an election's leader record
    /// ([`Election`](crate::election::Election)).
    Leader,
    /// A request of a [`SimFencedKey`](super::SimFencedKey): a fenced write, a
    /// read of its last token, a forget. [`FaultBuilder::on_key`] names the
    /// resource.
    Fenced,
    /// A fence, store or read of an idempotency record
    /// ([`IdempotencyLayer`](crate::layer::IdempotencyLayer)).
    Record,
}

impl Op {
    /// Every kind of request, in declaration order.
    pub(super) const ALL: [Op; 7] = [
        Op::Acquire,
        Op::Renew,
        Op::Release,
        Op::Leave,
        Op::Leader,
        Op::Fenced,
        Op::Record,
    ];

    /// The position in [`ALL`](Self::ALL).
    pub(super) fn index(self) -> usize {
        match self {
            Op::Acquire => 0,
            Op::Renew => 1,
            Op::Release => 2,
            Op::Leave => 3,
            Op::Leader => 4,
            Op::Fenced => 5,
            Op::Record => 6,
        }
    }

    /// What the caller was doing, for its error.
    pub(super) fn phase(self) -> Phase {
        match self {
            Op::Acquire | Op::Leave | Op::Leader | Op::Record => Phase::Acquiring,
            Op::Renew => Phase::Renewing,
            Op::Release => Phase::Releasing,
            Op::Fenced => Phase::Writing,
        }
    }
}

/// A message the server pushes to an instance, as Redis does on the instance's
/// pub/sub channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Message {
    /// A release woke the instances waiting for the key. Without it a waiter asks
    /// again when its last answer told it to (at the holder's TTL at the latest).
    Wakeup,
    /// Another instance queued for a mutex whose lease this instance holds: a
    /// lease cached here for the next local task is released at once. Without it
    /// the cached lease is kept until its linger ends.
    Revocation,
}

/// What a fault does to the request or message it hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    /// The request never reaches the server.
    Fail(Op),
    /// The server applies the request; the reply never reaches the caller.
    LoseReply(Op),
    /// The message is never delivered.
    Drop(Message),
    /// The message is delivered this much later.
    Delay(Message, Duration),
}

/// What happens to a request a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RequestFault {
    /// Not applied; the caller gets an error.
    Fail,
    /// Applied; the caller gets an error.
    LoseReply,
}

/// What happens to a message a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MessageFault {
    /// Never delivered.
    Drop,
    /// Delivered this much later.
    Delay(Duration),
}

/// One fault turned on: its effect, the key it is limited to and how many more
/// times it strikes (`None`: until cleared).
#[derive(Debug)]
struct Rule {
    key: Option<LockKey>,
    effect: Effect,
    left: Option<u32>,
}

impl Rule {
    fn hits(&self, key: &LockKey) -> bool {
        self.key.as_ref().is_none_or(|k| k == key) && self.left != Some(0)
    }

    /// Counts one strike.
    fn strike(&mut self) {
        if let Some(left) = self.left.as_mut() {
            *left -= 1;
        }
    }
}

/// The faults turned on at one server, in the order they were turned on: of the
/// faults that hit a request or message, the first one strikes.
#[derive(Debug, Default)]
pub(super) struct Rules(Mutex<Vec<Rule>>);

impl Rules {
    fn rules(&self) -> std::sync::MutexGuard<'_, Vec<Rule>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, rule: Rule) {
        self.rules().push(rule);
    }

    pub(super) fn clear(&self) {
        self.rules().clear();
    }

    /// The fault that strikes an `op` request for `key`, if one does (counted).
    pub(super) fn request(&self, op: Op, key: &LockKey) -> Option<RequestFault> {
        let mut rules = self.rules();
        let (rule, fault) = rules.iter_mut().find_map(|rule| match rule.effect {
            Effect::Fail(o) if o == op && rule.hits(key) => Some((rule, RequestFault::Fail)),
            Effect::LoseReply(o) if o == op && rule.hits(key) => {
                Some((rule, RequestFault::LoseReply))
            }
            _ => None,
        })?;
        rule.strike();
        rules.retain(|rule| rule.left != Some(0));
        Some(fault)
    }

    /// The fault that strikes a `message` about `key`, if one does (counted).
    pub(super) fn message(&self, message: Message, key: &LockKey) -> Option<MessageFault> {
        let mut rules = self.rules();
        let (rule, fault) = rules.iter_mut().find_map(|rule| match rule.effect {
            Effect::Drop(m) if m == message && rule.hits(key) => Some((rule, MessageFault::Drop)),
            Effect::Delay(m, by) if m == message && rule.hits(key) => {
                Some((rule, MessageFault::Delay(by)))
            }
            _ => None,
        })?;
        rule.strike();
        rules.retain(|rule| rule.left != Some(0));
        Some(fault)
    }
}

/// A fault being turned on at a [`SimServer`](super::SimServer), from
/// [`SimServer::fault`](super::SimServer::fault).
///
/// Narrow it with [`on_key`](Self::on_key) and [`next`](Self::next), then turn it
/// on with one of [`fail`](Self::fail), [`lose_reply`](Self::lose_reply),
/// [`drop_message`](Self::drop_message) or [`delay_message`](Self::delay_message).
/// Without `on_key` it hits every key; without `next` it strikes until
/// [`SimServer::clear_faults`](super::SimServer::clear_faults). Faults strike in
/// the order they were turned on.
///
/// ```
/// use lockflight::testing::{Op, SimServer};
///
/// let server = SimServer::new();
/// // The next renewal of "job:7" is applied, but its reply is lost.
/// server.fault().on_key("job:7").next(1).lose_reply(Op::Renew)?;
/// // A fault that strikes zero times is a mistake, not a no-op.
/// assert!(server.fault().next(0).fail(Op::Acquire).is_err());
/// # Ok::<(), lockflight::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "a fault is turned on only by `fail`, `lose_reply`, `drop_message` or `delay_message`"]
pub struct FaultBuilder<'a> {
    rules: &'a Rules,
    key: Option<LockKey>,
    times: Option<u32>,
}

impl<'a> FaultBuilder<'a> {
    pub(super) fn new(rules: &'a Rules) -> Self {
        FaultBuilder {
            rules,
            key: None,
            times: None,
        }
    }

    /// Hits only requests and messages about `key` (every lock of the key
    /// string: its mutex, read-write lock and semaphore; and the fenced key of
    /// that name).
    pub fn on_key(self, key: impl Into<LockKey>) -> Self {
        FaultBuilder {
            key: Some(key.into()),
            ..self
        }
    }

    /// Strikes the next `times` requests or messages it hits, then turns itself
    /// off.
    pub fn next(self, times: u32) -> Self {
        FaultBuilder {
            times: Some(times),
            ..self
        }
    }

    /// `op` requests never reach the server: nothing changes there, and the caller
    /// gets [`Error::Backend`], as from a connection that broke before sending.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for a key that no lock may have, and
    /// [`Error::InvalidConfig`] for `next(0)`.
    pub fn fail(self, op: Op) -> Result<()> {
        self.turn_on(Effect::Fail(op))
    }

    /// The server applies `op` requests, but their replies are lost: the caller
    /// gets [`Error::Backend`], as from a connection that broke after sending,
    /// and the state changed. lockflight repeats such a request to learn its
    /// outcome, so a lost acquire or release reply costs one more request.
    ///
    /// # Errors
    ///
    /// As [`fail`](Self::fail).
    pub fn lose_reply(self, op: Op) -> Result<()> {
        self.turn_on(Effect::LoseReply(op))
    }

    /// `message`s are never delivered. With [`next`](Self::next), each copy sent
    /// to an instance that waits for it counts as one (a wake-up reaches every
    /// waiting instance; a revocation, the holder's).
    ///
    /// # Errors
    ///
    /// As [`fail`](Self::fail).
    pub fn drop_message(self, message: Message) -> Result<()> {
        self.turn_on(Effect::Drop(message))
    }

    /// `message`s are delivered `by` later, on Tokio's clock; counted as with
    /// [`drop_message`](Self::drop_message).
    ///
    /// # Errors
    ///
    /// As [`fail`](Self::fail).
    pub fn delay_message(self, message: Message, by: Duration) -> Result<()> {
        self.turn_on(Effect::Delay(message, by))
    }

    fn turn_on(self, effect: Effect) -> Result<()> {
        if let Some(key) = &self.key {
            key.validate()?;
        }
        if self.times == Some(0) {
            return Err(Error::config(
                "a fault that strikes `next(0)` times would never strike",
            ));
        }
        self.rules.push(Rule {
            key: self.key,
            effect,
            left: self.times,
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fault hits only its op (or message) and key; `next(n)` strikes n times
    /// and is gone; of two faults that hit, the one turned on first strikes.
    #[test]
    fn faults_strike_in_order_on_their_key_and_as_often_as_asked() {
        let rules = Rules::default();
        let (k, other) = (LockKey::from("k"), LockKey::from("other"));
        FaultBuilder::new(&rules)
            .on_key("k")
            .next(2)
            .lose_reply(Op::Release)
            .unwrap();
        FaultBuilder::new(&rules).fail(Op::Release).unwrap();
        FaultBuilder::new(&rules)
            .next(1)
            .delay_message(Message::Wakeup, Duration::from_secs(1))
            .unwrap();

        assert_eq!(rules.request(Op::Acquire, &k), None, "another op");
        assert_eq!(rules.request(Op::Release, &other), Some(RequestFault::Fail));
        assert_eq!(
            rules.request(Op::Release, &k),
            Some(RequestFault::LoseReply)
        );
        assert_eq!(
            rules.request(Op::Release, &k),
            Some(RequestFault::LoseReply)
        );
        assert_eq!(
            rules.request(Op::Release, &k),
            Some(RequestFault::Fail),
            "the first fault is spent; the unlimited one strikes"
        );
        assert_eq!(rules.message(Message::Revocation, &k), None);
        assert_eq!(
            rules.message(Message::Wakeup, &other),
            Some(MessageFault::Delay(Duration::from_secs(1)))
        );
        assert_eq!(rules.message(Message::Wakeup, &other), None, "spent");
        assert_eq!(rules.rules().len(), 1, "spent faults are removed");
        rules.clear();
        assert_eq!(rules.request(Op::Release, &k), None);
    }

    /// Bad input turns nothing on.
    #[test]
    fn bad_input_is_an_error_and_turns_nothing_on() {
        let rules = Rules::default();
        let empty = FaultBuilder::new(&rules).on_key("").fail(Op::Renew);
        assert!(matches!(empty, Err(Error::InvalidKey { .. })), "{empty:?}");
        let never = FaultBuilder::new(&rules)
            .next(0)
            .drop_message(Message::Wakeup);
        assert!(
            matches!(never, Err(Error::InvalidConfig { .. })),
            "{never:?}"
        );
        assert!(rules.rules().is_empty());
    }
}
