//! Test-support harness for lockflight's integration tests, benches and examples.
//!
//! An unpublished workspace member: a dev-dependency of `lockflight` (its
//! `tests/` and `benches/`) and of `examples` (the inventory tests), and a
//! dependency of `bench` (the contention harness). Use it from any of those
//! targets with plain paths, e.g. `use testkit::{RedisServer, unique_prefix};` or
//! `testkit::shared()`. It is compiled once, not into every test binary.
//!
//! Unit tests inside lockflight's `src/` (`#[cfg(test)]`) must not use it: they
//! are compiled into a second copy of the library, whose types are not the ones
//! this crate links against.
//!
//! # Real Redis servers
//!
//! [`RedisServer::start`] runs a real `redis-server` (or `valkey-server`, see
//! below; it must be there: the tests never skip themselves silently) on a free port of 127.0.0.1, with no
//! persistence and its own temporary directory (in `/dev/shm` where it exists: a
//! cluster node's or sentinel's config fsync on a disk busy writing back a build
//! can stall the server for seconds). Dropping the value kills and
//! reaps the server; if the drop happens while the test is panicking, the last
//! lines of the server's log are printed to stderr, so they show up in
//! `cargo test`'s report of the failing test.
//!
//! # The server engine: Redis or Valkey
//!
//! One environment variable, [`ENGINE_VAR`] (`LOCKFLIGHT_TEST_ENGINE`), chooses
//! the engine of a whole test run, read once per test binary ([`Engine::current`]):
//!
//! * unset, empty or `redis`: `redis-server` from `PATH` (Redis 7.0 in CI);
//! * `valkey`: `valkey-server`, first where `scripts/valkey` installs it
//!   (`.tools/valkey/…` in the workspace, git-ignored), else from `PATH`
//!   (Valkey 9.1 in CI); a run that asks for it without it panics, naming
//!   `scripts/valkey`.
//!
//! Every server the harness starts comes from that one binary
//! ([`Engine::server_binary`]): [`RedisServer`], every [`cluster::Node`] (the
//! Cluster's nodes, the Sentinel set's data nodes and its sentinels, started with
//! `--sentinel`, the replicated pair), so a run never mixes engines. Tools stay
//! Redis' `redis-cli` (`--cluster create`), which speaks to both. Any other value
//! panics. So: `scripts/valkey && LOCKFLIGHT_TEST_ENGINE=valkey cargo test …`.
//! A test that must know the engine (a reply text, an `INFO` field) asks
//! [`Engine::current`].
//!
//! **Which server to use:**
//!
//! * [`shared()`] is one lazily started server per test binary. Use it for
//!   tests that only need *a* Redis, and keep every key of such a test under
//!   its own [`unique_prefix`] so parallel tests never collide. Such a test must
//!   never pause, kill, restart, `FLUSHALL`/`FLUSHDB`, `CONFIG SET`, `DEBUG` or
//!   otherwise disturb the server, and must not count global things such as
//!   `DBSIZE` or `INFO` stats.
//! * A test that pauses, kills, restarts or flushes the server, or that needs
//!   global counts, starts its **own** server with [`RedisServer::start`].
//!   (`pause`, `kill`, `restart` and `flushall` panic on the shared server.)
//!
//! No server outlives the test run: every server runs under a tiny `sh`
//! supervisor whose stdin is a pipe held by the test process. When the test
//! process dies for any reason (even `SIGKILL`, or a static that is never
//! dropped), the pipe closes and the supervisor kills the server.
//!
//! Linux only: process states are read from `/proc`; signals are sent with
//! `nix` (a safe wrapper of `kill(2)`).
//!
//! # Fault injection
//!
//! [`CountingProxy`] sits between a client and a server: it counts the RESP
//! commands the client sends, and can delay, black-hole or reset the traffic.
//! [`fault_proxy::FaultProxy`] parses both directions and can lose the reply of
//! chosen commands after the server applied them. [`nemesis`] stops and continues
//! any process (a child holder), kills client connections, and samples Zipf ranks.
//!
//! # Waiting in tests
//!
//! A test waits for the event it means, never for a guess of how long the event
//! takes: a signal the code offers (a guard's `lost()`, a channel, an idle wait),
//! else [`eventually`] (a condition polled every few ms up to a generous
//! [`EVENTUALLY`], failing with the name of what never happened), or
//! [`count_first_poll`] for what a future does before its first await. A fixed
//! sleep stays only where real time is the point (a TTL running out on a server, a
//! paused process), as a window for something that must *not* happen (a slow
//! machine can only hide it, never fail the test), as a workload's pace, or under
//! a paused clock.
//!
//! # Layout
//!
//! `server` (the servers and small helpers), `process` (supervised children,
//! signals, `/proc`), `ports` (free loopback ports), `relay` (the listener and
//! per-connection relay both proxies share), `proxy` ([`CountingProxy`]),
//! `fault_proxy`, `resp` (the RESP command counter and the request/reply
//! parsers, tested at every chunk boundary), `acl` (users for permission tests),
//! `counting` (a backend wrapper that counts lockflight's requests), `engine`
//! (Redis or Valkey, and the server binary),
//! `cluster`, `sentinel`, `nemesis`.
//! Everything a test needs is re-exported at the crate root; `cluster`,
//! `sentinel`, `replication`, `fault_proxy`, `nemesis` and `names` (the Redis names of
//! a key's records and of an instance's channel) are public modules.
//!
//! # Things to know about redis-rs 1.8
//!
//! * A connection made with default settings has a **500 ms response timeout**
//!   and a 1 s connection timeout. The connections made by this module
//!   ([`RedisServer::connection`], [`CountingProxy::connection`]) use 10 s / 5 s
//!   instead, so that a loaded CI machine does not cause spurious failures.
//! * Every new connection pipelines two `CLIENT SETINFO` commands (`LIB-NAME`
//!   and `LIB-VER`) during its handshake, so a fresh connection through a
//!   [`CountingProxy`] already counts 2 commands (before it returns). Call
//!   [`CountingProxy::reset`] after connecting, or use
//!   [`CountingProxy::quiet_client`], whose handshake sends nothing. There is
//!   no URL setting for this, and `ConnectionInfo`'s fields are no longer
//!   public: use `ConnectionInfo::redis_settings()` /
//!   `set_redis_settings(..)` with `RedisConnectionInfo::set_skip_set_lib_name()`.
//! * Do not combine these servers with `#[tokio::test(start_paused = true)]`:
//!   with a paused clock, tokio jumps time forward whenever the runtime waits
//!   on I/O, so every response timeout fires at once.
pub mod cluster;
mod engine;
pub mod fault_proxy;
mod logs;
pub mod names;
pub mod nemesis;
pub mod replication;
pub mod sentinel;

mod acl;
mod counting;
mod ports;
mod postgres;
mod process;
mod proxy;
mod relay;
mod resp;
mod server;
mod steps;
mod test_path;

pub use engine::{ENGINE_VAR, Engine};
pub use logs::Logs;
use ports::*;
pub use postgres::{Postgres, shared_postgres};
pub use test_path::test_path;
pub use {acl::*, counting::*, process::*, proxy::*, relay::Relay, resp::*, server::*, steps::*};
