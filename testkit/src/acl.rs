//! ACL users for the tests of the permissions lockflight needs.

use redis::aio::MultiplexedConnection;

use super::query;

/// The exact rules of the minimal ACL user documented on `RedisBackend`, for the
/// prefix `lfacl`.
pub const MINIMAL_ACL_RULES: &[&str] = &[
    "~lfacl:*",
    "&lfacl:inst:*",
    "+evalsha",
    "+script|load",
    "+publish",
    "+subscribe",
    "+time",
    "+get",
    "+set",
    "+del",
    "+exists",
    "+pexpire",
    "+pttl",
    "+zcard",
    "+zscore",
    "+zrange",
    "+zrangebyscore",
    "+zremrangebyscore",
    "+zcount",
    "+zadd",
    "+zrem",
];

/// Creates (or resets) the ACL user `user` with the password `pw` and `rules`.
pub async fn set_acl_user(admin: &mut MultiplexedConnection, user: &str, rules: &[&str]) {
    query::<()>(
        admin,
        redis::cmd("ACL")
            .arg(&["SETUSER", user, "reset", "on", ">pw"])
            .arg(rules),
    )
    .await;
}
