//! The conformance matrix: each property of the lease protocol is written **once**,
//! as a cell `async fn(Kind, Topology)`, and instantiated by [`matrix!`] for every
//! lock kind (mutex, read lease, write lease, permit, `lock_many`) on the topologies the cell
//! names, against real `redis-server` processes. A kind that a backend does not
//! offer is a typed [`Error::Unsupported`](lockflight::Error::Unsupported), never a
//! silent difference.
//!
//! | cell | topologies | property |
//! |---|---|---|
//! | `exclusion::exclusive_sections_and_increasing_tokens` | all | several instances × tasks: no section of an exclusive kind overlaps another (readers overlap only readers), and fenced kinds' tokens strictly increase in section order |
//! | `loss::a_deleted_lease_is_signalled_lost` | all Redis, the test kit (not memory) | the lease deleted behind the holder's back (on every Redlock node; on the kit by `SimServer::lose_lease`): its loss is signalled within one validity window and its release says `LeaseLost` |
//! | `loss::a_renewal_refused_readonly_is_a_loss` | one server | the node holding the lease is demoted to a replica with the same data: the next renewal is refused `READONLY`, which is a loss at once (not at the end of the validity) |
//! | `exclusion::cancelled_waiters_leave_nothing_locked` | all | acquires cancelled at several points while the key is busy: the key goes to the next instance at once after the holder's release, and nothing stays in memory |
//! | `exclusion::bad_keys_are_clear_errors` | all | an empty or oversized key is `Error::InvalidKey` naming the key, from every call |
//! | `release::truthful_release_after_a_lost_reply` | one server, Cluster, Sentinel, the test kit | a release repeated after its reply was lost reports the release, even after another instance took and released the key meanwhile (one release record per lease, not per key); on one server a fault proxy loses the reply, on Cluster and Sentinel (no proxy can stand in front of nodes whose addresses clients discover) the first answer is discarded; on the kit a `lose_reply(Op::Release)` fault loses it |
//! | `release::release_after_a_restart_reports_the_loss` | one server, the test kit | after an empty restart, another instance takes the same lock; the first holder's release says `LeaseLost`, never `Ok` |
//! | `release::release_under_memory_pressure_frees_the_lock` | one server | with `maxmemory` reached and `noeviction`, a release still deletes the lease (no auxiliary write before the delete) |
//! | `lifecycle::shutdown_waits_for_a_dropped_holders_release` | all | a holder dropped right before `shutdown` on a current-thread runtime, whose runtime then ends: another instance finds the key free at once |
//! | `lifecycle::the_last_drop_waits_for_a_dropped_holders_release` | all | the same with the last `Locker` dropped on a multi-thread runtime |
//! | `lifecycle::the_last_drop_on_a_current_thread_runtime_frees_every_key` | all | a program on a current-thread runtime makes its locker (and so its connections) in `main`, locks ten keys twice each (a warm key's mutex lease stays cached) and drops its last `Locker` on that one thread: another instance finds all ten free at once |
//! | `lifecycle::a_holder_dropped_without_a_runtime_settles_locally` | all | a holder dropped on a thread without a runtime: no local state stays, renewal stops, another instance gets the key after the TTL |
//! | `lifecycle::an_abandoned_acquire_is_released_with_retries` | one server, the test kit | an acquire that landed (its reply lost) is abandoned, and the first attempt of its background release is lost too: the release is repeated, `shutdown` waits for it, the key is free at once |
//! | `election::a_resignation_hands_over_and_observers_follow` | all (Redlock: `Unsupported`) | the election column: A resigns, the waiting B leads with a greater term, a third instance's `observe()` and `leader()` follow, and nobody leads after B resigns |
//! | `election::a_leader_that_vanishes_is_replaced_after_its_ttl` | all (Redlock: `Unsupported`) | a leader gone without a word (dropped without a runtime, as after `kill -9`): the waiting instance leads after the TTL with a greater term; observers follow |
//! | `idempotency::one_instance_runs_the_others_replay` | all (Redlock: `Unsupported`) | the idempotency column: A runs a request with a key while B's duplicate waits for A's lease; B, woken by A's release, and a later C replay A's stored response byte for byte; another body under the key is `422`; the handler ran once |
//! | `transfer::a_release_passes_the_key_to_a_waiting_instance` | all | the grant column: A releases while B waits at the backend for the key (with the kind that excludes A's): a mutex release (also `lock_many`'s) on one server, Cluster and Sentinel, coalescing or not, grants B the key on the server, and B holds from the message alone (one grant, no acquire request of B's, a greater fencing token); on Redlock, the memory backend and the test kit, and for the read-write lock and the semaphore, B is woken and asks (no grant); the key is free after B's release |
//!
//! Why some cells run on one server only: a restart without persistence, `maxmemory`
//! and a demotion change a whole server, so each of those tests starts servers of
//! its own (a Cluster or Sentinel set per test would cost seconds each); what they
//! check is the release and renewal scripts' answers and the client's reading of
//! them, which are the same on every topology (a Sentinel client additionally
//! follows the new primary on `READONLY`: `tests/topology/sentinel.rs`). Replica
//! acknowledgement is its own module (`tests/topology/replication`), one definition for every
//! kind, because its tests stop the one replica and must run one at a time.
//!
//! The topologies ([`Topology`]): the memory backend, one server, a 3-primary
//! Cluster, a primary behind Sentinel, Redlock over three primaries, one server
//! with per-process coalescing off, and, with the feature `testing`, the test
//! kit's simulated server (`lockflight::testing`) ("all" above).
//! On Redlock, which offers only the mutex, a cell's other kinds check that they
//! are refused with `Error::Unsupported` ([`Topology::refuses`]).
//!
//! Cells that restart the server or change its configuration start their own
//! server; the others share one of each topology per test binary, each cell under
//! its own prefix.

// The matrix runs on every topology, Cluster and Sentinel included: without
// both features, only the twins (feature `testing`) are compiled.
#[cfg(all(feature = "cluster", feature = "sentinel"))]
mod election;
#[cfg(all(feature = "cluster", feature = "sentinel"))]
mod exclusion;
#[cfg(all(feature = "cluster", feature = "sentinel"))]
mod idempotency;
#[cfg(all(feature = "cluster", feature = "sentinel"))]
mod kinds;
#[cfg(all(feature = "cluster", feature = "sentinel"))]
mod lifecycle;
#[cfg(all(feature = "cluster", feature = "sentinel"))]
mod loss;
#[cfg(all(feature = "cluster", feature = "sentinel"))]
mod release;
#[cfg(all(feature = "cluster", feature = "sentinel"))]
mod transfer;
/// The test kit's fault knobs and their real-server twins.
#[cfg(feature = "testing")]
mod twins;

#[cfg(all(feature = "cluster", feature = "sentinel"))]
pub(crate) use kinds::{Held, Kind, Topology};

/// Instantiates `cell` (an `async fn(Kind, Topology)` of the current module) for
/// every lock kind on each listed topology (`name => Variant`, or `every topology`):
/// a module named after the cell, a module per topology, a test per kind. With
/// `every topology, no kind`, `cell` is an `async fn(Topology)` (a cell that no lock
/// kind varies, such as an election's), with a test per topology.
#[cfg(all(feature = "cluster", feature = "sentinel"))]
macro_rules! matrix {
    ($cell:ident: every topology) => {
        matrix!(@topologies matrix, $cell);
    };
    ($cell:ident: every topology, no kind) => {
        matrix!(@topologies topology_only, $cell);
    };
    // The one list of topologies; `$then` is called with it.
    (@topologies $then:ident, $cell:ident) => {
        $crate::$then!($cell:
            memory => Memory,
            one_server => OneServer,
            cluster => Cluster,
            sentinel => Sentinel,
            redlock => Redlock,
            uncoalesced => Uncoalesced,
            #[cfg(feature = "testing")]
            sim => Sim,
        );
    };
    ($cell:ident: $($(#[$attr:meta])* $topo:ident => $variant:ident),+ $(,)?) => {
        mod $cell {
            $(
                $(#[$attr])*
                mod $topo {
                    use $crate::{Kind, Topology};

                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn mutex() {
                        super::super::$cell(Kind::Mutex, Topology::$variant).await
                    }

                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn read() {
                        super::super::$cell(Kind::Read, Topology::$variant).await
                    }

                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn write() {
                        super::super::$cell(Kind::Write, Topology::$variant).await
                    }

                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn permit() {
                        super::super::$cell(Kind::Permit, Topology::$variant).await
                    }

                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn lock_many() {
                        super::super::$cell(Kind::Many, Topology::$variant).await
                    }
                }
            )+
        }
    };
}
#[cfg(all(feature = "cluster", feature = "sentinel"))]
pub(crate) use matrix;

/// [`matrix!`]'s `no kind` form: a test per topology, in a module named after the
/// cell.
#[cfg(all(feature = "cluster", feature = "sentinel"))]
macro_rules! topology_only {
    ($cell:ident: $($(#[$attr:meta])* $topo:ident => $variant:ident),+ $(,)?) => {
        mod $cell {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $topo() {
                    super::$cell($crate::Topology::$variant).await
                }
            )+
        }
    };
}
#[cfg(all(feature = "cluster", feature = "sentinel"))]
pub(crate) use topology_only;
