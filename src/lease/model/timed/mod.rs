//! The lease protocol in time: the lock's TTL expiry, release records that
//! expire, a server restart without persistence, and the grant path (a
//! release that grants the lock on the server to a waiting task).
//!
//! The model above has no clock. This one has one, and fewer moving parts: two
//! instances with one task each, each task taking one or two leases (a token each)
//! one after the other. A task sends an acquire, renews what it holds (or stops
//! renewing, as a paused or dead holder does), releases it, or gives up an acquire
//! or a release it waits for (a timeout: its copy stays on the wire and the token
//! is released in the background, as `retire` and an abandoned acquire's cleanup
//! do), or stops waiting for a renewal. Any request may be delayed past any later
//! one and past any number of ticks, and so may any reply.
//!
//! **Time.** Time passes in ticks ([`Step::Tick`]): the holders' clock and the
//! server's clock advance together. A lease lives [`TTL`] ticks on the server,
//! from when its script ran; the holder believes it valid until
//! `sent_at + TTL − DRIFT` on its own clock ([`DRIFT`] ticks), counted from the
//! send of the acquire or renewal that was answered, as `Lease::new` and the
//! watchdog count it; from then on it has lost the lease, and sends its release
//! (at once: a later send is the same request delivered later). A reply read
//! after that instant is no grant: the task asks again with the same token. The server's clock may also gain on the holders'
//! ([`Step::Gain`], at most `Config::gain` ticks in all): `drift` is what pays for
//! that. The lock exists while the server's clock is below its expiry: a tick
//! shorter than Redis keeps it (through its last millisecond), on the side of a
//! second holder; a release record exists through its expiry, as on Redis,
//! because the gate below is compared with it to the instant.
//!
//! Every time is kept relative to the present (the holders' times to their clock,
//! the server's to its own), and a time that can no longer change an outcome is
//! clamped (a send older than a validity, an epoch older than a tick), so the
//! states are finite without a horizon: every run of any length is covered.
//!
//! **Fencing epochs** are `max(last + 1, server clock × SCALE)`, as the acquire
//! script mints them from `TIME` in µs: a tick is far longer than the grants of
//! one µs, so the grants of one tick (fewer than `SCALE`) fit in it.
//!
//! **Release records** live `Config::record_ttl` ticks (`None`: longer than
//! every delay, as the model above assumes). A release writes one (one that found
//! nothing retires its token with one), and an acquire with a recorded token is
//! refused. With `Config::late_gate`, an acquire that lands more than a record's
//! lifetime after its send is refused too (`lua/life_gate.lua`'s `not_after`),
//! and its sender asks again.
//!
//! **A restart** ([`Step::Restart`]) loses every key at once (the lock, the
//! fence, the records) and takes a tick; with `Config::clock_back` the restarted
//! server's clock comes back a tick behind where it was. Without `Config::life`
//! the holders learn of it only from their next request's answer (a renewal
//! that finds no lease).
//!
//! **The life** (`Config::life`, `backend/redis/life.rs`): the server counts its
//! lives (a restart starts the next) and keeps the current one's start and
//! whether a quarantine was written. The life starts at the restart's instant: the
//! product's starts with the first script of the new data set, no earlier, so
//! the model's quarantine is the shortest the server can write. Each instance
//! remembers the life it saw last, and an acquire carries it. The gate
//! (`lua/life_gate.lua`), after the late-grant check, answers
//! [`Reply::Gated`] (busy: nothing granted) to an acquire that carries another
//! life than the server's, and to every acquire while the server's clock is
//! before the quarantine; an acquire carrying an earlier life writes the quarantine, the
//! life's start plus the sender's longest lease TTL ([`TTL`]). Every reply is
//! tagged with the life it was made in, and an instance that reads one of a
//! life newer than it knows learns it: if it had seen an earlier one it marks
//! its lease lost (and sends the release), and the server holds grants as the
//! gate would have (this stands for the reconnect's check, `life.lua`'s
//! `life_gate` run with the instance's TTL, which also covers a renewal
//! answered "not the owner"). A grant of an earlier life read after that is
//! believed, as the product does: the quarantine is what keeps it apart. Both
//! instances have seen the first life (*witnesses*), unless `Config::fresh`:
//! then B starts after the restart, having seen no life; its first acquire is
//! answered with the life and writes no quarantine.
//!
//! **The grant path** (`Config::grant`; the mutex's release on one server,
//! Cluster or Sentinel). An acquire answered busy writes its task's queue
//! entry (the `grants` field of its instance): its token, its arrival on the
//! server's clock and, with [`Validity::EchoedSend`], its send on the
//! sender's clock; each later busy answer rewrites it, a grant by the acquire
//! script removes it. A release that leaves the lock free grants it to an
//! entry whose token has no release record and whose age is below both half
//! the TTL and a record's lifetime: it mints an epoch, locks until the
//! entry's arrival plus the TTL, removes the entry and puts a grant message on
//! the wire. When an entry may not be granted, the release may also grant
//! nothing (that entry may be the queue's head); which entry is the head is
//! not modelled (either may be granted). A grant message may be lost, read
//! after any delay, or read after its task gave up or took another lease
//! (then dropped); a duplicate adds nothing to that (a copy read too late is
//! no read, and once one copy is taken the others are dropped). The waiter
//! reads the busy answer and the grant message in either order; it takes a
//! grant whose validity (`Grant::validity`, plus the TTL less the drift) has
//! not ended, without a request (a request in flight is no longer awaited);
//! otherwise it asks again with the same token, as for a lost grant, and is
//! answered as the acquire script answers ("already yours" when the lock is
//! its token's). A waiter gives up between asks ([`Step::Abandon`], a fault)
//! or while an ask is in flight: it releases its token (armed since its busy
//! answer) and leaves the queue ([`Req::Leave`], a request of its own that
//! may land before or after the release); a release of a granted lock passes
//! it on. A dead waiter is one that takes no more steps: its grant expires at
//! its TTL. Grants with a restart, the life or the late gate are not explored,
//! nor the claim and wake-up of a release that does not grant (they decide
//! who asks when, not who holds).
//!
//! Designs: [`Grant::ECHOED`] (the waiter counts from the send the grant's
//! entry was written by, echoed in the message) keeps every property.
//! [`Grant::AS_WRITTEN`] counts from the send of the last request answered
//! busy, and breaks exclusion: a grant message delayed past the granted
//! lock's expiry is read after a later busy answer, while another task holds.
//! (There, a grant message read before its token's first busy answer has no
//! send to count from: the model's waiter asks again, the safe reading of a
//! case the design leaves open; the echoed send has no such case.)
//! Three wrong variants are caught: the validity counted from the message's
//! arrival ([`Validity::Arrival`]: two believed-valid holders), a grant that
//! ignores the release record (`checks_record: false`: the abandoned
//! waiter's own release grants its retired token, an orphan), a waiter not
//! armed after a busy answer (`armed: false`: it gives up without a release
//! and a grant lands for nobody, an orphan).
//!
//! Checked in every state and step:
//!
//! 1. **Exclusion of believed-valid holders** ([`Finding::TwoValidHolders`]): at
//!    most one task holds a lease whose validity has not ended on its clock.
//! 2. **Increasing tokens** ([`Finding::TokenNotIncreasing`]): every epoch the
//!    server mints is greater than every epoch it minted before.
//! 3. **No orphan lease** ([`Finding::OrphanLease`]): the lock is not held for a
//!    token that no task uses and no request in flight releases (the key stays
//!    locked until its TTL for nobody): a cost in liveness, not in safety.
//!
//! Exploration goes on past a finding, so a property that holds in a
//! configuration holds in every state it reaches, whatever else was found.

mod bag;
mod explore;
#[cfg(test)]
mod grant_tests;
mod parts;
mod server;
mod state;
#[cfg(test)]
mod tests;

pub(crate) use explore::{Explored, explore};
pub(crate) use parts::{Config, DRIFT, Finding, Grant, Validity};
