//! The fenced resources one simulated server keeps, and the rule of
//! `fence/lua/fenced.lua` step by step: the fence first, then the write record,
//! then the resource's type, then the write; nothing changes unless all of it
//! happens.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::fence::WriteId;
use crate::lease::FencingToken;

/// The write ids a write record keeps once it trims (the newest, by id order).
const KEEP: usize = 64;
/// The number of ids past which a write record trims itself to [`KEEP`].
const TRIM: usize = 96;

/// A hash field and its value.
pub(super) type Field = (Vec<u8>, Vec<u8>);

/// The fenced resources of one server, by name.
#[derive(Debug, Default)]
pub(super) struct Resources(Mutex<HashMap<Vec<u8>, Resource>>);

impl Resources {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Resource>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets every resource (a restart without persistence).
    pub(super) fn clear(&self) {
        self.map().clear();
    }

    /// Applies one fenced write to `name`, atomically.
    pub(super) fn write(
        &self,
        name: &[u8],
        token: FencingToken,
        id: Option<WriteId>,
        write: &Write,
    ) -> Answer {
        let mut map = self.map();
        let resource = map.entry(name.to_vec()).or_default();
        let answer = resource.write(Instant::now(), token, id, write);
        if resource.is_empty() {
            map.remove(name);
        }
        answer
    }

    pub(super) fn fence(&self, name: &[u8]) -> Option<FencingToken> {
        self.map().get(name).and_then(|r| r.fence)
    }

    pub(super) fn forget(&self, name: &[u8]) {
        let mut map = self.map();
        if let Some(resource) = map.get_mut(name) {
            resource.fence = None;
            resource.record = None;
            if resource.is_empty() {
                map.remove(name);
            }
        }
    }

    /// `read` of the live value of `name`, if it has one.
    pub(super) fn read<T>(
        &self,
        name: &[u8],
        read: impl FnOnce(&Stored) -> Option<T>,
    ) -> Option<T> {
        let map = self.map();
        let stored = map.get(name)?.live(Instant::now())?;
        read(stored)
    }
}

/// One resource: its value, its fence (the last accepted token) and its write
/// record, as the three Redis keys of a `FencedKey`.
#[derive(Debug, Default)]
struct Resource {
    value: Option<Stored>,
    fence: Option<FencingToken>,
    record: Option<Record>,
}

/// A value and when it expires.
#[derive(Debug)]
pub(super) struct Stored {
    pub(super) value: Value,
    expires: Option<Instant>,
}

/// A value of one of the two types fenced writes make.
#[derive(Debug)]
pub(super) enum Value {
    Str(Vec<u8>),
    Hash(BTreeMap<Vec<u8>, Vec<u8>>),
}

/// The write ids applied under one token, with their results, and the greatest
/// id dropped so far.
#[derive(Debug)]
struct Record {
    token: FencingToken,
    mark: Option<WriteId>,
    ids: BTreeMap<WriteId, i64>,
}

/// What a write does to the resource's value.
#[derive(Debug)]
pub(super) enum Write {
    Set { value: Vec<u8>, ttl_ms: Option<u64> },
    IncrBy(i64),
    HSet(Vec<Field>),
    Delete,
    Advance,
}

/// A write's answer, as the script's reply codes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Answer {
    /// `{ 1, result }` or `{ 2, result }`.
    Applied(i64),
    /// `{ 0, last }`.
    Stale(FencingToken),
    /// `{ -1, role }`.
    Foreign(&'static str),
    /// `{ -2, detail }`.
    Refused(String),
}

/// Redis' texts for the refusals a fenced write can meet here.
const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";
const OVERFLOW: &str = "ERR increment or decrement would overflow";
const BAD_EXPIRY: &str = "ERR invalid expire time in 'set' command";

impl Resource {
    fn is_empty(&self) -> bool {
        self.value.is_none() && self.fence.is_none() && self.record.is_none()
    }

    /// The value, unless it has expired.
    fn live(&self, now: Instant) -> Option<&Stored> {
        self.value
            .as_ref()
            .filter(|s| s.expires.is_none_or(|at| at > now))
    }

    /// One fenced write, in the script's order: every check before the first
    /// change.
    fn write(
        &mut self,
        now: Instant,
        token: FencingToken,
        id: Option<WriteId>,
        write: &Write,
    ) -> Answer {
        if self.live(now).is_none() {
            self.value = None;
        }
        if let Some(last) = self.fence
            && token < last
        {
            return Answer::Stale(last);
        }
        let fresh = match (id, &self.record) {
            (Some(id), Some(record)) if record.token == token => {
                if let Some(&done) = record.ids.get(&id) {
                    return Answer::Applied(done);
                }
                if record.mark.is_some_and(|mark| id <= mark) {
                    return Answer::Refused(format!(
                        "WRITEID write id {id} is older than the ids still recorded under token {}:{}: whether it was applied cannot be told",
                        token.epoch, token.seq
                    ));
                }
                false
            }
            _ => true,
        };
        let result = match self.apply(now, write) {
            Ok(result) => result,
            Err(answer) => return answer,
        };
        self.fence = Some(token);
        if let Some(id) = id {
            let record = match &mut self.record {
                Some(record) if !fresh => record,
                other => other.insert(Record {
                    token,
                    mark: None,
                    ids: BTreeMap::new(),
                }),
            };
            record.ids.insert(id, result);
            if record.ids.len() > TRIM {
                let drop: Vec<WriteId> = record
                    .ids
                    .keys()
                    .take(record.ids.len() - KEEP)
                    .copied()
                    .collect();
                for dropped in &drop {
                    record.ids.remove(dropped);
                }
                record.mark = drop.last().copied().or(record.mark);
            }
        }
        Answer::Applied(result)
    }

    /// The write's change to the value: its result (the new value of an
    /// increment, else 0), or the answer of a write that cannot be made.
    fn apply(&mut self, now: Instant, write: &Write) -> Result<i64, Answer> {
        match (write, &mut self.value) {
            (
                Write::IncrBy(_),
                Some(Stored {
                    value: Value::Hash(_),
                    ..
                }),
            )
            | (
                Write::HSet(_),
                Some(Stored {
                    value: Value::Str(_),
                    ..
                }),
            ) => {
                return Err(Answer::Foreign("resource"));
            }
            _ => {}
        }
        match write {
            Write::Set { value, ttl_ms } => {
                let expires = match ttl_ms {
                    None => None,
                    Some(ms) if i64::try_from(*ms).is_err() => {
                        return Err(Answer::Refused(NOT_AN_INTEGER.to_owned()));
                    }
                    Some(ms) => Some(
                        now.checked_add(Duration::from_millis(*ms))
                            .ok_or_else(|| Answer::Refused(BAD_EXPIRY.to_owned()))?,
                    ),
                };
                self.value = Some(Stored {
                    value: Value::Str(value.clone()),
                    expires,
                });
                Ok(0)
            }
            Write::IncrBy(delta) => {
                let (old, expires) = match &self.value {
                    None => (0, None),
                    Some(Stored {
                        value: Value::Str(text),
                        expires,
                    }) => (
                        redis_integer(text)
                            .ok_or_else(|| Answer::Refused(NOT_AN_INTEGER.to_owned()))?,
                        *expires,
                    ),
                    Some(Stored {
                        value: Value::Hash(_),
                        ..
                    }) => return Err(Answer::Foreign("resource")),
                };
                let new = old
                    .checked_add(*delta)
                    .ok_or_else(|| Answer::Refused(OVERFLOW.to_owned()))?;
                self.value = Some(Stored {
                    value: Value::Str(new.to_string().into_bytes()),
                    expires,
                });
                Ok(new)
            }
            Write::HSet(fields) => {
                let stored = self.value.get_or_insert_with(|| Stored {
                    value: Value::Hash(BTreeMap::new()),
                    expires: None,
                });
                if let Value::Hash(hash) = &mut stored.value {
                    hash.extend(fields.iter().cloned());
                }
                Ok(0)
            }
            Write::Delete => {
                self.value = None;
                Ok(0)
            }
            Write::Advance => Ok(0),
        }
    }
}

/// The integer a string holds, in the form Redis reads one (`string2ll`): an
/// optional `-`, digits without a leading zero (or `0` alone), within an `i64`.
fn redis_integer(text: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(text).ok()?;
    let n: i64 = text.parse().ok()?;
    (n.to_string() == text).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(epoch: u64) -> FencingToken {
        FencingToken { epoch, seq: 0 }
    }

    #[test]
    fn integers_are_read_as_redis_reads_them() {
        for (text, n) in [
            ("0", Some(0)),
            ("-12", Some(-12)),
            ("9223372036854775807", Some(i64::MAX)),
        ] {
            assert_eq!(redis_integer(text.as_bytes()), n, "{text}");
        }
        for text in [
            "",
            "-",
            "-0",
            "05",
            "+5",
            " 5",
            "5 ",
            "1.0",
            "9223372036854775808",
        ] {
            assert_eq!(redis_integer(text.as_bytes()), None, "{text:?}");
        }
    }

    /// The record keeps the 64 newest ids once it passes 96, marks the greatest
    /// dropped one, and refuses ids at or under the mark that it does not hold.
    #[test]
    fn the_write_record_trims_to_the_newest_ids_and_marks_the_rest() {
        let mut resource = Resource::default();
        let now = Instant::now();
        let t = token(4);
        for id in 1..=97 {
            let answer = resource.write(now, t, Some(WriteId::from(id)), &Write::IncrBy(1));
            assert_eq!(answer, Answer::Applied(id as i64));
        }
        let record = resource.record.as_ref().unwrap();
        assert_eq!(record.ids.len(), KEEP);
        assert_eq!(record.mark, Some(WriteId::from(33)));
        let refused = resource.write(now, t, Some(WriteId::from(33)), &Write::IncrBy(1));
        assert!(
            matches!(&refused, Answer::Refused(d) if d.starts_with("WRITEID write id 0000000000000021 ")),
            "{refused:?}"
        );
        assert_eq!(
            resource.write(now, t, Some(WriteId::from(34)), &Write::IncrBy(1)),
            Answer::Applied(34)
        );
    }

    /// A refused or foreign write records neither its token nor its id.
    #[test]
    fn a_write_that_cannot_be_made_changes_nothing() {
        let mut resource = Resource::default();
        let now = Instant::now();
        let hset = Write::HSet(vec![(b"f".to_vec(), b"v".to_vec())]);
        assert_eq!(
            resource.write(now, token(1), None, &hset),
            Answer::Applied(0)
        );
        let incr = resource.write(now, token(2), Some(WriteId::from(1)), &Write::IncrBy(1));
        assert_eq!(incr, Answer::Foreign("resource"));
        assert_eq!(resource.fence, Some(token(1)));
        assert!(resource.record.is_none());
        let set = Write::Set {
            value: b"v".to_vec(),
            ttl_ms: Some(u64::MAX),
        };
        assert_eq!(
            resource.write(now, token(2), None, &set),
            Answer::Refused(NOT_AN_INTEGER.to_owned())
        );
        assert_eq!(resource.fence, Some(token(1)));
    }
}
