//! A model of Redlock fencing over in-memory nodes, explored with `proptest`.
//!
//! **What is modelled.** N nodes, each with a lock (owner token, expiry) and a fence
//! counter; clients that run the protocol in separately scheduled steps (acquire
//! round, then finish: fence write-back and the grant decision, then release), so
//! other clients' steps, time and faults interleave between them. Faults: any
//! request may be lost (not applied) and any reply may be lost (applied, the client
//! does not know); time advances in ticks and locks expire; a node may restart with
//! an empty dataset (lock and fence gone), optionally kept out for one TTL (the
//! delayed-restart rule).
//!
//! **Assumptions** (those of the real protocol): each node mints
//! `max(fence + 1, clock)` where the clock is shared by all nodes (skew zero here;
//! the real requirement is skew much smaller than one TTL) and never steps back;
//! one tick is [`SCALE`] clock units and fewer than `SCALE` grants happen per tick
//! (the real clock is in µs); validity is measured from when the acquire was sent,
//! and the node's lock outlives it (`TTL` vs `TTL − DRIFT`). Renewals are not
//! modelled (they do not touch fences).
//!
//! **Oracle.** At every grant: no other client holds a still-valid grant (mutual
//! exclusion), and the token is strictly greater than every token granted before
//! (fencing tokens strictly increase in grant order).

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Lock TTL in ticks.
const TTL: u64 = 6;
/// Drift margin in ticks.
const DRIFT: u64 = 1;
/// Clock units per tick.
const SCALE: u64 = 1000;
const CLIENTS: usize = 3;

thread_local! {
    /// Grants made by the schedules explored on this thread (proof the model is
    /// not vacuous).
    static GRANTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    /// Grant on a majority with `max` of the minted epochs.
    NaiveMax,
    /// `max`, then `fence := max(fence, t)` where the token still owns the lock;
    /// grant after a write-back majority (what `RedlockBackend` does).
    WriteBack,
}

#[derive(Clone, Copy, Debug)]
struct Setup {
    nodes: usize,
    protocol: Protocol,
    /// Nodes mint `max(fence + 1, clock)`; without it, `fence + 1`.
    time_floor: bool,
    /// Restarted nodes stay out for one TTL.
    delayed_restart: bool,
    /// Whether the schedule may restart nodes.
    restarts: bool,
}

#[derive(Clone, Debug)]
enum Op {
    /// Client `c` sends acquire to every node; `deliver` / `reply` are bit masks of
    /// the nodes whose request / reply arrives.
    Acquire { c: usize, deliver: u8, reply: u8 },
    /// Client `c` finishes its attempt (write-back, grant or release).
    Finish { c: usize, deliver: u8, reply: u8 },
    /// Client `c` releases its grant.
    Release { c: usize, deliver: u8 },
    /// Client `c` takes its next step: acquire when idle, finish when trying,
    /// release when holding.
    Step { c: usize, deliver: u8, reply: u8 },
    /// Time passes.
    Tick(u64),
    /// Node `i` restarts empty.
    Restart(usize),
}

#[derive(Clone, Debug, Default)]
struct Node {
    /// (token, expires at tick)
    lock: Option<(u64, u64)>,
    fence: u64,
    out_until: u64,
}

#[derive(Clone, Debug)]
enum Client {
    Idle,
    Trying {
        token: u64,
        sent: u64,
        granted: Vec<(usize, u64)>,
        unknown: Vec<usize>,
    },
    Holding {
        token: u64,
        valid_until: u64,
    },
}

struct World {
    setup: Setup,
    now: u64,
    nodes: Vec<Node>,
    clients: Vec<Client>,
    next_token: u64,
    last_fence: u64,
}

impl World {
    fn new(setup: Setup) -> World {
        World {
            setup,
            now: 0,
            nodes: vec![Node::default(); setup.nodes],
            clients: vec![Client::Idle; CLIENTS],
            next_token: 1,
            last_fence: 0,
        }
    }

    fn quorum(&self) -> usize {
        self.setup.nodes / 2 + 1
    }

    fn up(&self, i: usize) -> bool {
        self.now >= self.nodes[i].out_until
    }

    fn owns(&self, i: usize, token: u64) -> bool {
        matches!(self.nodes[i].lock, Some((t, exp)) if t == token && exp > self.now)
    }

    fn release_on(&mut self, token: u64, nodes: impl IntoIterator<Item = usize>, deliver: u8) {
        for i in nodes {
            if deliver & (1 << i) != 0 && self.up(i) && self.owns(i, token) {
                self.nodes[i].lock = None;
            }
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::Step { c, deliver, reply } => {
                let next = match self.clients[c] {
                    Client::Idle => Op::Acquire { c, deliver, reply },
                    Client::Trying { .. } => Op::Finish { c, deliver, reply },
                    Client::Holding { .. } => Op::Release { c, deliver },
                };
                return self.step(&next);
            }
            Op::Tick(d) => self.now += d,
            Op::Restart(i) => {
                if self.setup.restarts {
                    self.nodes[i] = Node {
                        out_until: if self.setup.delayed_restart {
                            self.now + TTL
                        } else {
                            self.now
                        },
                        ..Node::default()
                    };
                }
            }
            Op::Acquire { c, deliver, reply } => {
                if !matches!(self.clients[c], Client::Idle) {
                    return Ok(());
                }
                let token = self.next_token;
                self.next_token += 1;
                let (mut granted, mut unknown) = (Vec::new(), Vec::new());
                for i in 0..self.setup.nodes {
                    if deliver & (1 << i) == 0 || !self.up(i) {
                        unknown.push(i);
                        continue;
                    }
                    let now = self.now;
                    let floor = if self.setup.time_floor {
                        now * SCALE
                    } else {
                        0
                    };
                    let node = &mut self.nodes[i];
                    let free = node.lock.is_none_or(|(_, exp)| exp <= now);
                    if free {
                        node.lock = Some((token, now + TTL));
                        let epoch = (node.fence + 1).max(floor);
                        node.fence = epoch;
                        if reply & (1 << i) != 0 {
                            granted.push((i, epoch));
                        } else {
                            unknown.push(i);
                        }
                    }
                }
                self.clients[c] = Client::Trying {
                    token,
                    sent: self.now,
                    granted,
                    unknown,
                };
            }
            Op::Finish { c, deliver, reply } => {
                let Client::Trying {
                    token,
                    sent,
                    granted,
                    unknown,
                } = self.clients[c].clone()
                else {
                    return Ok(());
                };
                let q = self.quorum();
                let fence = granted.iter().map(|g| g.1).max().unwrap_or(0);
                let mut ok = granted.len() >= q && self.now - sent <= TTL / 2;
                if ok && self.setup.protocol == Protocol::WriteBack {
                    let mut written = 0;
                    for &(i, _) in &granted {
                        if deliver & (1 << i) != 0 && self.up(i) && self.owns(i, token) {
                            let f = &mut self.nodes[i].fence;
                            *f = (*f).max(fence);
                            if reply & (1 << i) != 0 {
                                written += 1;
                            }
                        }
                    }
                    ok = written >= q;
                }
                if ok {
                    for (other, client) in self.clients.iter().enumerate() {
                        if let Client::Holding { valid_until, .. } = client
                            && other != c
                            && *valid_until > self.now
                        {
                            return Err(format!(
                                "double grant at tick {}: client {c} while client {other} holds until {valid_until}",
                                self.now
                            ));
                        }
                    }
                    if fence <= self.last_fence {
                        return Err(format!(
                            "fencing token {fence} granted after {} (tick {})",
                            self.last_fence, self.now
                        ));
                    }
                    self.last_fence = fence;
                    GRANTS.with(|g| g.set(g.get() + 1));
                    self.clients[c] = Client::Holding {
                        token,
                        valid_until: sent + TTL - DRIFT,
                    };
                } else {
                    let nodes: Vec<usize> = granted.iter().map(|g| g.0).chain(unknown).collect();
                    self.release_on(token, nodes, deliver);
                    self.clients[c] = Client::Idle;
                }
            }
            Op::Release { c, deliver } => {
                if let Client::Holding { token, .. } = self.clients[c] {
                    self.release_on(token, 0..self.setup.nodes, deliver);
                    self.clients[c] = Client::Idle;
                }
            }
        }
        Ok(())
    }
}

fn run(setup: Setup, ops: &[Op]) -> Result<(), String> {
    let mut world = World::new(setup);
    for op in ops {
        world.step(op)?;
    }
    Ok(())
}

/// A mask where most nodes are usually reached.
fn mask(nodes: usize) -> impl Strategy<Value = u8> {
    let all = ((1u16 << nodes) - 1) as u8;
    prop_oneof![
        3 => Just(all),
        2 => 0..=all,
    ]
}

fn op(nodes: usize) -> impl Strategy<Value = Op> {
    let c = 0..CLIENTS;
    prop_oneof![
        30 => (c, mask(nodes), mask(nodes))
            .prop_map(|(c, deliver, reply)| Op::Step { c, deliver, reply }),
        6 => (1..=3u64).prop_map(Op::Tick),
        1 => (0..nodes).prop_map(Op::Restart),
    ]
}

/// Explores `cases` random schedules of up to 50 steps, deterministically.
fn explore(setup: Setup, cases: u32) -> Result<(), String> {
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    runner
        .run(&proptest::collection::vec(op(setup.nodes), 1..50), |ops| {
            run(setup, &ops).map_err(TestCaseError::fail)
        })
        .map_err(|e| e.to_string())
}

const NAIVE: Setup = Setup {
    nodes: 3,
    protocol: Protocol::NaiveMax,
    time_floor: true,
    delayed_restart: true,
    restarts: false,
};

const CHOSEN: Setup = Setup {
    nodes: 3,
    protocol: Protocol::WriteBack,
    time_floor: true,
    delayed_restart: true,
    restarts: true,
};

#[test]
fn the_issues_counterexample_breaks_naive_max() {
    // A = 10, B = 1, C = 1 (pure counters): {A, B} gets 11, then {B, C} gets 3.
    let setup = Setup {
        time_floor: false,
        ..NAIVE
    };
    let mut w = World::new(setup);
    w.nodes[0].fence = 10;
    w.nodes[1].fence = 1;
    w.nodes[2].fence = 1;
    let ab = 0b011;
    let bc = 0b110;
    let all = 0b111;
    let ops = [
        Op::Acquire {
            c: 0,
            deliver: ab,
            reply: all,
        },
        Op::Finish {
            c: 0,
            deliver: all,
            reply: all,
        },
        Op::Release { c: 0, deliver: all },
        Op::Acquire {
            c: 1,
            deliver: bc,
            reply: all,
        },
        Op::Finish {
            c: 1,
            deliver: all,
            reply: all,
        },
    ];
    let mut result = Ok(());
    for op in &ops {
        result = w.step(op);
        if result.is_err() {
            break;
        }
    }
    let err = result.expect_err("naive max must break");
    assert!(err.contains("fencing token 3 granted after 11"), "{err}");
    // The same schedule under the write-back protocol: {B, C} reads B = 11.
    let mut w = World::new(Setup {
        protocol: Protocol::WriteBack,
        ..setup
    });
    w.nodes[0].fence = 10;
    w.nodes[1].fence = 1;
    w.nodes[2].fence = 1;
    for op in &ops {
        w.step(op).expect("write-back stays monotonic");
    }
    assert_eq!(w.last_fence, 12);
}

#[test]
fn proptest_finds_the_naive_max_counterexample() {
    // Even with the server-TIME floor: three grants within one tick on different
    // majorities.
    let err = explore(NAIVE, 20_000).expect_err("the model must find the naive-max bug");
    assert!(err.contains("fencing token"), "{err}");
}

#[test]
fn write_back_is_monotonic_with_loss_expiry_and_delayed_restarts() {
    for nodes in [3, 5] {
        GRANTS.with(|g| g.set(0));
        explore(Setup { nodes, ..CHOSEN }, 8_000).unwrap();
        let grants = GRANTS.with(|g| g.get());
        assert!(grants > 5_000, "only {grants} grants with {nodes} nodes");
    }
}

#[test]
fn write_back_without_the_time_floor_breaks_across_restarts() {
    // The reason for the floor: a restarted node forgot the counter.
    let err = explore(
        Setup {
            time_floor: false,
            ..CHOSEN
        },
        20_000,
    )
    .expect_err("pure counters are not monotonic across restarts");
    assert!(err.contains("fencing token"), "{err}");
}

#[test]
fn restarts_without_the_delay_double_grant() {
    let err = explore(
        Setup {
            delayed_restart: false,
            ..CHOSEN
        },
        20_000,
    )
    .expect_err("an undelayed restart must allow a double grant");
    assert!(err.contains("double grant"), "{err}");
}
