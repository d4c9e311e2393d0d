//! The cluster slot of a key, and a cluster's slot map as one `CLUSTER SLOTS`
//! reply after another shows it: each slot's primary, and how many times that
//! changed (what the failover replay, `replay.rs`, versions a release by).

use redis::Value;

/// The number of slots of a Redis Cluster.
const SLOTS: usize = 16_384;

/// The cluster slot of a key (CRC16/XMODEM of its hash tag, modulo 16,384).
pub(super) fn slot(key: &[u8]) -> u16 {
    let tag = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS as u16
}

/// A cluster's slot map as the task last read it: each slot's primary, and how
/// many times that changed (the slot's topology version).
pub(super) struct SlotView {
    primary: Vec<u32>,
    /// Per slot, how many times its primary changed.
    pub(super) changes: Vec<u64>,
    nodes: Vec<(String, u16)>,
}

// Read only on a cluster (`replay::read_slots`).
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
impl SlotView {
    const NONE: u32 = u32::MAX;

    pub(super) fn new() -> SlotView {
        SlotView {
            primary: vec![Self::NONE; SLOTS],
            changes: vec![0; SLOTS],
            nodes: Vec::new(),
        }
    }

    /// Applies a `CLUSTER SLOTS` reply; returns how many slots changed primary.
    pub(super) fn update(&mut self, reply: &Value) -> usize {
        let Value::Array(ranges) = reply else {
            return 0;
        };
        let mut changed = 0;
        for range in ranges {
            let Value::Array(r) = range else { continue };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(node))) =
                (r.first(), r.get(1), r.get(2))
            else {
                continue;
            };
            let host = match node.first() {
                Some(Value::BulkString(h)) => String::from_utf8_lossy(h).into_owned(),
                Some(Value::SimpleString(h)) => h.clone(),
                _ => continue,
            };
            let Some(Value::Int(port)) = node.get(1) else {
                continue;
            };
            let (Ok(port), Ok(start), Ok(end)) = (
                u16::try_from(*port),
                usize::try_from(*start),
                usize::try_from(*end),
            ) else {
                continue;
            };
            if host.is_empty() || host == "?" || end >= SLOTS || start > end {
                continue;
            }
            let addr = (host, port);
            let id = match self.nodes.iter().position(|n| *n == addr) {
                Some(i) => i as u32,
                None => {
                    self.nodes.push(addr);
                    (self.nodes.len() - 1) as u32
                }
            };
            let before = changed;
            for s in start..=end {
                if self.primary[s] != id {
                    if self.primary[s] != Self::NONE {
                        self.changes[s] += 1;
                        changed += 1;
                    }
                    self.primary[s] = id;
                }
            }
            if changed > before {
                tracing::debug!(start, end, to = ?self.nodes[id as usize], "slots changed primary");
            }
        }
        changed
    }

    pub(super) fn primary(&self, slot: u16) -> Option<&(String, u16)> {
        self.nodes.get(self.primary[usize::from(slot)] as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag() {
        // Known values (CLUSTER KEYSLOT).
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"lockflight:{foo}:wr"), 12182);
        assert_eq!(slot(b"{}x"), slot(b"{}x"));
        assert_eq!(slot(b"123456789"), 0x31c3);
    }

    #[test]
    fn the_slot_view_counts_changes_of_primary() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let reply = |a: i64, b: i64| {
            Value::Array(vec![
                Value::Array(vec![Value::Int(0), Value::Int(8191), node(a)]),
                Value::Array(vec![Value::Int(8192), Value::Int(16383), node(b)]),
            ])
        };
        let mut v = SlotView::new();
        assert_eq!(v.update(&reply(7000, 7001)), 0);
        assert_eq!(v.update(&reply(7000, 7001)), 0);
        assert_eq!(v.update(&reply(7000, 7004)), 8192);
        assert_eq!(v.changes[0], 0);
        assert_eq!(v.changes[9000], 1);
        assert_eq!(v.primary(9000), Some(&("127.0.0.1".to_owned(), 7004)));
    }
}
