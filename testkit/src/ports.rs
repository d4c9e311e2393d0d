//! Free loopback ports, reserved across the tests of one binary.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

// ---------------------------------------------------------------------------
// Ports
// ---------------------------------------------------------------------------

/// Ports of the servers of this process (including killed ones that may be
/// restarted), so that no other server of this process picks them.
pub(crate) fn reserved_ports() -> MutexGuard<'static, HashSet<u16>> {
    static RESERVED: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    RESERVED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn release_port(port: u16) {
    reserved_ports().remove(&port);
}

/// Picks a free loopback port for a server and reserves it in this process.
///
/// Ports are taken *below* the kernel's ephemeral range when possible: the
/// ports handed out by binding port 0 (and to outgoing connections) come from
/// that range, so while a server is killed, a port from it could be taken by
/// anything (even a client reconnecting to it, which then connects to itself),
/// and `restart` on the same port would fail or talk to the wrong peer.
pub(crate) fn reserve_port() -> u16 {
    let (low, high) = non_ephemeral_range();
    let mut reserved = reserved_ports();
    if high > low + 1000 {
        for _ in 0..500 {
            let candidate = low + (rand::random_range(0..u64::from(high - low))) as u16;
            if !reserved.contains(&candidate)
                && std::net::TcpListener::bind(("127.0.0.1", candidate)).is_ok()
            {
                reserved.insert(candidate);
                return candidate;
            }
        }
    }
    // Fallback: let the kernel choose (holding the listeners we reject so it
    // does not hand the same port out again).
    let mut held = Vec::new();
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if reserved.insert(port) {
            return port;
        }
        held.push(listener);
    }
}

/// `[15000, start of the ephemeral range)`, or an empty range if unknown.
pub(crate) fn non_ephemeral_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    (15000, ephemeral_low.max(15000))
}
