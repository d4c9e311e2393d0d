//! Reading script replies: texts, integers, durations, scored members.

use std::time::Duration;

use redis::Value;

pub(super) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

pub(super) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.parse().ok(),
    }
}

pub(super) fn millis(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// Members and scores of a `WITHSCORES` reply.
pub(super) fn pairs(v: Option<&Value>) -> Vec<(String, f64)> {
    let Some(Value::Array(items)) = v else {
        return Vec::new();
    };
    items
        .chunks(2)
        .filter_map(|pair| {
            let member = text(pair.first()?)?;
            let score = match pair.get(1)? {
                Value::Double(d) => *d,
                other => text(other)?.parse().ok()?,
            };
            Some((member, score))
        })
        .collect()
}
