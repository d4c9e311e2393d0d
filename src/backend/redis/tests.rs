//! Unit tests of the Redis backend's names and reply decoding.

use redis::{ErrorKind, RedisError, Value};

use super::builder::redact;
use super::*;
use crate::error::Error;

#[test]
fn names_share_one_hash_tag_and_escape_braces() {
    let n = Names::new("lf", &LockKey::from(&b"a{b}%"[..]));
    assert_eq!(n.lock, b"lf:{a%7Bb%7D%25}");
    assert_eq!(n.fence, b"lf:{a%7Bb%7D%25}:fence");
    assert_eq!(n.queue, b"lf:{a%7Bb%7D%25}:wq");
    assert_eq!(n.claim, b"lf:{a%7Bb%7D%25}:claim");
    assert_eq!(n.release_record("00ff"), b"lf:{a%7Bb%7D%25}:rel:00ff");
    assert_eq!(n.queue_expiry, b"lf:{a%7Bb%7D%25}:wqx");
    // Distinct keys never share a name, even when one looks escaped.
    assert_ne!(
        Names::new("lf", &LockKey::from("%7B")).lock,
        Names::new("lf", &LockKey::from("{")).lock
    );
}

fn ints(ns: &[i64]) -> Value {
    Value::Array(ns.iter().map(|n| Value::Int(*n)).collect())
}

fn key() -> LockKey {
    LockKey::from("k")
}

fn assert_backend_error<T: fmt::Debug>(result: Result<T>, needle: &str) {
    match result {
        Err(e @ Error::Backend { .. }) => assert!(e.to_string().contains(needle), "{e}"),
        other => panic!("expected Backend({needle}), got {other:?}"),
    }
}

#[test]
fn decodes_every_acquire_reply() {
    let max = Duration::from_secs(1);
    let k = key();
    assert_eq!(
        decode_acquire(&k, &ints(&[1, 42, 3]), max).unwrap(),
        Acquire::Acquired {
            epoch: 42,
            waiting: 3,
            earliest_other: None,
        }
    );
    assert_eq!(
        decode_acquire(&k, &ints(&[0, 250, 1]), max).unwrap(),
        Acquire::Busy {
            retry_in: Duration::from_millis(250)
        }
    );
    // Bounded by the queue entry's refresh interval.
    assert_eq!(
        decode_acquire(&k, &ints(&[0, 60_000, 0]), max).unwrap(),
        Acquire::Busy { retry_in: max }
    );
    for code in [-1, -2] {
        assert!(matches!(
            decode_acquire(&k, &ints(&[code]), max),
            Err(Error::ForeignValue { .. })
        ));
    }
    assert_backend_error(decode_acquire(&k, &Value::Int(1), max), "unexpected");
    assert_backend_error(decode_acquire(&k, &ints(&[1, 2]), max), "unexpected");
}

#[test]
fn a_malformed_epoch_is_an_error_not_zero() {
    let k = key();
    let max = Duration::from_secs(1);
    for epoch in [
        Value::Int(0),
        Value::Int(-5),
        Value::BulkString(b"12".to_vec()),
        Value::Nil,
    ] {
        let reply = Value::Array(vec![Value::Int(1), epoch, Value::Int(0)]);
        assert_backend_error(decode_acquire(&k, &reply, max), "malformed epoch");
    }
    assert_eq!(
        decode_epoch(&k, &Value::Int(i64::MAX)).unwrap(),
        i64::MAX as u64
    );
}

#[test]
fn decodes_every_release_reply() {
    let k = key();
    assert_eq!(
        decode_release(&k, &ints(&[1, 2])).unwrap(),
        (
            Released {
                released: true,
                waiting: 2
            },
            None
        )
    );
    assert_eq!(
        decode_release(&k, &ints(&[0, 0])).unwrap(),
        (
            Released {
                released: false,
                waiting: 0
            },
            None
        )
    );
    let refused = Value::Array(vec![
        Value::Int(1),
        Value::Int(1),
        Value::BulkString(b"ERR no channel".to_vec()),
    ]);
    assert_eq!(
        decode_release(&k, &refused).unwrap(),
        (
            Released {
                released: true,
                waiting: 1
            },
            Some("ERR no channel".to_owned())
        )
    );
    assert_backend_error(decode_release(&k, &ints(&[2, 0])), "unexpected");
    assert_backend_error(decode_release(&k, &ints(&[1, 0, 5])), "unexpected");
}

#[test]
fn decodes_every_renewal_and_leave_reply() {
    let k = key();
    assert_eq!(
        decode_renewal(&k, &ints(&[1, 4])).unwrap(),
        Renewal::Renewed { waiting: 4 }
    );
    assert_eq!(
        decode_renewal(&k, &ints(&[0, 0])).unwrap(),
        Renewal::NotOwner
    );
    assert_backend_error(decode_renewal(&k, &Value::Int(1)), "unexpected");

    assert_eq!(decode_leave(&k, &ints(&[1, 0])).unwrap(), (true, None));
    assert_eq!(decode_leave(&k, &ints(&[0, 0])).unwrap(), (false, None));
    let refused = Value::Array(vec![
        Value::Int(1),
        Value::Int(0),
        Value::BulkString(b"ERR no channel".to_vec()),
    ]);
    assert_eq!(
        decode_leave(&k, &refused).unwrap(),
        (true, Some("ERR no channel".to_owned()))
    );
    // The bare integer the old script returned is not a valid reply.
    assert_backend_error(decode_leave(&k, &Value::Int(1)), "unexpected");
}

fn server_error(code: &str, detail: &str) -> RedisError {
    redis::make_extension_error(code.to_owned(), Some(detail.to_owned()))
}

#[test]
fn classifies_server_errors() {
    use redis::ServerErrorKind;
    let known = |kind: ServerErrorKind| RedisError::from((ErrorKind::Server(kind), "detail"));
    assert_eq!(
        mapping(&known(ServerErrorKind::NoPerm)),
        Mapping::NoPermission
    );
    assert_eq!(
        mapping(&server_error(
            "ERR",
            "The user executing the script can't run this command or subcommand script: x"
        )),
        Mapping::NoPermission
    );
    assert_eq!(mapping(&server_error("WRONGTYPE", "x")), Mapping::Foreign);
    for (error, code) in [
        (server_error("OOM", "command not allowed"), "OOM"),
        (known(ServerErrorKind::ReadOnly), "READONLY"),
        (known(ServerErrorKind::NoScript), "NOSCRIPT"),
        (known(ServerErrorKind::ResponseError), "ERR"),
        (server_error("MISCONF", "x"), "MISCONF"),
        (server_error("NOAUTH", "x"), "NOAUTH"),
        (server_error("WRONGPASS", "x"), "WRONGPASS"),
        (
            RedisError::from((ErrorKind::AuthenticationFailed, "x")),
            "WRONGPASS",
        ),
    ] {
        assert_eq!(mapping(&error), Mapping::Refused(code.into()), "{error}");
    }
    for error in [
        RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)),
        RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe)),
        known(ServerErrorKind::BusyLoading),
        known(ServerErrorKind::MasterDown),
        known(ServerErrorKind::TryAgain),
        known(ServerErrorKind::ClusterDown),
        server_error("BUSY", "a script is running"),
        server_error("MOVED", "3999 127.0.0.1:6381"),
        server_error("ASK", "3999 127.0.0.1:6381"),
    ] {
        assert_eq!(mapping(&error), Mapping::Transient, "{error}");
    }
}

#[test]
fn maps_classes_to_errors() {
    let k = key();
    assert!(matches!(
        map_err(&k, Phase::Renewing, RedisError::from((ErrorKind::Server(redis::ServerErrorKind::ReadOnly), "x"))),
        Error::Refused { code, phase: Phase::Renewing, .. } if code == "READONLY"
    ));
    match map_err(
        &k,
        Phase::Acquiring,
        server_error(
            "WRONGTYPE",
            "the fence key holds a value of another type script: abc, on @user_script:1.",
        ),
    ) {
        Error::ForeignValue { detail, .. } => {
            assert_eq!(detail, "the fence key holds a value of another type")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        map_err(
            &k,
            Phase::Releasing,
            RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset))
        ),
        Error::Backend { .. }
    ));
}

#[test]
fn redacts_passwords() {
    assert_eq!(redact("redis://u:secret@h:1/0"), "redis://***@h:1/0");
    assert_eq!(redact("redis://h:1"), "redis://h:1");
}

#[test]
fn rejects_bad_settings() {
    let e = RedisBackend::builder("redis://x")
        .prefix("a{b")
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("prefix"), "{e}");
    let e = RedisBackend::builder("redis://x")
        .claim_ttl(Duration::ZERO)
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("claim_ttl"), "{e}");
    let e = RedisBackend::builder("redis://x")
        .replica_ack(0, Duration::from_millis(100))
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("replica_ack"), "{e}");
    #[cfg(feature = "cluster")]
    {
        let e = RedisBackend::cluster(["redis://x"])
            .replica_ack(1, Duration::from_millis(100))
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("cluster"), "{e}");
    }
}

#[test]
fn every_client_sets_tcp_nodelay_and_keeps_the_url() {
    let client = nodelay_client("redis://user:secret@127.0.0.1:6390/3").unwrap();
    let info = client.get_connection_info();
    assert!(info.tcp_settings().nodelay());
    assert_eq!(info.addr().to_string(), "127.0.0.1:6390");
    assert_eq!(info.redis_settings().db(), 3);
    assert_eq!(info.redis_settings().username(), Some("user"));
    // The url of a default client leaves it off: the setting is lockflight's.
    let plain = redis::Client::open("redis://127.0.0.1:6390").unwrap();
    assert!(!plain.get_connection_info().tcp_settings().nodelay());
}

#[cfg(feature = "sentinel")]
#[test]
fn primary_connection_info_is_for_sentinel_backends_and_hides_its_password() {
    let info = || {
        redis::RedisConnectionInfo::default()
            .set_username("locks")
            .set_password("s3cret-pw")
            .set_db(2)
    };
    let sentinel = RedisBackend::sentinel(["redis://:sent-pw@127.0.0.1:26379"], "main")
        .primary_connection_info(info());
    sentinel.validate().unwrap();
    let shown = format!("{sentinel:?}");
    assert!(
        shown.contains("locks") && shown.contains("db: 2"),
        "{shown}"
    );
    assert!(
        !shown.contains("s3cret-pw") && !shown.contains("sent-pw"),
        "{shown}"
    );
    let e = RedisBackend::builder("redis://x")
        .primary_connection_info(info())
        .validate()
        .unwrap_err();
    assert!(matches!(e, Error::InvalidConfig { .. }), "{e:?}");
    assert!(e.to_string().contains("primary_connection_info"), "{e}");
    assert!(!format!("{e} {e:?}").contains("s3cret-pw"), "{e:?}");
    let e = RedisBackend::sentinel(["redis://127.0.0.1:26379"], "main")
        .primary_connection_info(redis::RedisConnectionInfo::default().set_username("locks"))
        .validate()
        .unwrap_err();
    assert!(e.to_string().contains("no password"), "{e}");
    #[cfg(feature = "cluster")]
    {
        let e = RedisBackend::cluster(["redis://x"])
            .primary_connection_info(info())
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("sentinel"), "{e}");
    }
}
