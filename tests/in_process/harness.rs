//! Tests of the test harness itself: the RESP command counter that the counting
//! proxy relies on, fed at every chunk boundary, against commands encoded by the
//! `redis` crate.

use proptest::prelude::*;
use testkit::RespCommandCounter;

/// The bytes the `redis` crate sends for `cmd`.
fn encode(cmd: &redis::Cmd) -> Vec<u8> {
    cmd.get_packed_command()
}

fn sample_stream() -> (Vec<u8>, u64) {
    let mut bytes = Vec::new();
    let mut commands = 0;
    let mut push = |cmd: redis::Cmd| {
        bytes.extend_from_slice(&encode(&cmd));
        commands += 1;
    };
    push(redis::cmd("PING"));
    push(redis::cmd("SET").arg("k").arg("v\r\n*3\r\n$1").clone());
    push(
        redis::cmd("EVALSHA")
            .arg("0123")
            .arg(2)
            .arg(b"\x00\xff")
            .arg("")
            .clone(),
    );
    push(redis::cmd("GET").arg(vec![b'x'; 300]).clone());
    // An inline command and blank lines between commands.
    bytes.extend_from_slice(b"\r\nPING\r\n\n");
    commands += 1;
    // An empty array is no command, as in Redis.
    bytes.extend_from_slice(b"*0\r\n");
    (bytes, commands)
}

#[test]
fn counts_a_stream_fed_whole() {
    let (bytes, commands) = sample_stream();
    assert_eq!(RespCommandCounter::default().feed(&bytes), commands);
}

#[test]
fn counts_a_stream_split_at_every_boundary() {
    let (bytes, commands) = sample_stream();
    for cut in 0..=bytes.len() {
        let mut counter = RespCommandCounter::default();
        let n = counter.feed(&bytes[..cut]) + counter.feed(&bytes[cut..]);
        assert_eq!(n, commands, "split at byte {cut}");
    }
}

#[test]
fn counts_a_stream_fed_byte_by_byte() {
    let (bytes, commands) = sample_stream();
    let mut counter = RespCommandCounter::default();
    let n: u64 = bytes
        .iter()
        .map(|b| counter.feed(std::slice::from_ref(b)))
        .sum();
    assert_eq!(n, commands);
}

#[test]
fn a_partial_command_is_not_counted_until_complete() {
    let bytes = encode(redis::cmd("SET").arg("key").arg("value"));
    let mut counter = RespCommandCounter::default();
    assert_eq!(counter.feed(&bytes[..bytes.len() - 1]), 0);
    assert_eq!(counter.feed(&bytes[bytes.len() - 1..]), 1);
}

proptest! {
    /// Any sequence of commands with binary arguments, cut into any chunks.
    #[test]
    fn counts_any_commands_in_any_chunks(
        args in prop::collection::vec(prop::collection::vec(any::<Vec<u8>>(), 0..4), 1..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let mut bytes = Vec::new();
        for list in &args {
            let mut cmd = redis::cmd("CMD");
            for a in list {
                cmd.arg(a.as_slice());
            }
            bytes.extend_from_slice(&encode(&cmd));
        }
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort_unstable();
        let mut counter = RespCommandCounter::default();
        let n: u64 = points.windows(2).map(|w| counter.feed(&bytes[w[0]..w[1]])).sum();
        prop_assert_eq!(n, args.len() as u64);
    }
}
