//! What every connection lockflight opens to Redis is made with, on every
//! topology: the timeouts, the `ConnectionManager`'s settings and a client whose
//! connections set `TCP_NODELAY`. It imports nothing of the other connection
//! files, which all import it.

use std::time::Duration;

use redis::aio::ConnectionManagerConfig;

/// Timeouts every mode applies.
#[derive(Clone, Copy, Debug)]
pub(super) struct Timeouts {
    pub(super) response: Duration,
    pub(super) connection: Duration,
}

/// The settings of the single-server `ConnectionManager`.
pub(super) fn manager_config(t: Timeouts) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(t.response))
        .set_connection_timeout(Some(t.connection))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

/// A client for `info` whose connections set `TCP_NODELAY`: lock requests are
/// small and wait for their replies, and Nagle's algorithm would hold one back
/// until the previous segment is acknowledged (a round trip on a real network).
/// Every connection lockflight opens (commands, pub/sub, acknowledged writes, on
/// every topology) comes from such a client.
pub(crate) fn nodelay_client(
    info: impl redis::IntoConnectionInfo,
) -> redis::RedisResult<redis::Client> {
    let info = info.into_connection_info()?;
    let tcp = info.tcp_settings().clone().set_nodelay(true);
    redis::Client::open(info.set_tcp_settings(tcp))
}
