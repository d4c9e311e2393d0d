//! `connect()` verifies: the password, the ACL permissions, and the minimal ACL
//! line suffices for every operation.

use super::*;

/// The message of `result`'s error, which must be an `expected` (`is` tells);
/// panics naming `what` otherwise.
fn error_text<T: std::fmt::Debug>(
    what: &str,
    result: lockflight::Result<T>,
    expected: &str,
    is: fn(&Error) -> bool,
) -> String {
    match result {
        Err(e) if is(&e) => e.to_string(),
        other => panic!("{what}: expected {expected}, got {other:?}"),
    }
}

fn assert_connect_auth_failure(what: &str, result: lockflight::Result<RedisBackend>) {
    let text = error_text(what, result, "Connect", |e| {
        matches!(e, Error::Connect { .. })
    });
    assert!(
        text.contains("authentication failed"),
        "{what}: the message does not say authentication failed: {text}"
    );
    assert!(
        !text.contains("secretpw") && !text.contains("wrongpw"),
        "{text}"
    );
}

/// Against a `requirepass` server, `connect()` fails at once without the password
/// or with a wrong one, and succeeds with the right one.
#[tokio::test]
async fn connect_checks_the_password() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    query::<()>(
        &mut admin,
        redis::cmd("CONFIG").arg(&["SET", "requirepass", "secretpw"]),
    )
    .await;
    // Through a proxy that counts connections: a refused password ends connect()
    // after a bounded number of attempts, not at its timeout: at most the command
    // connection's 3 attempts (1 + `set_number_of_retries(2)`, which the connection
    // manager also spends on a refused AUTH) and the subscription's one.
    let proxy = testkit::CountingProxy::start(&server).await;
    let port = proxy.port();
    assert_connect_auth_failure(
        "no password",
        RedisBackend::connect(&format!("redis://127.0.0.1:{port}/")).await,
    );
    assert_connect_auth_failure(
        "wrong password",
        RedisBackend::connect(&format!("redis://:wrongpw@127.0.0.1:{port}/")).await,
    );
    let opened = proxy.accepted();
    assert!(
        opened <= 2 * 4,
        "{opened} connections for two refused connects"
    );
    let port = server.port();
    let b = RedisBackend::connect(&format!("redis://:secretpw@127.0.0.1:{port}/"))
        .await
        .expect("the right password");
    // connect() returns once its subscription is up.
    let channel = testkit::names::channel(
        lockflight::backend::RedisBackendBuilder::DEFAULT_PREFIX,
        b.instance_id(),
    );
    assert_eq!(testkit::numsub(&mut admin, &channel).await, 1);
}

/// Every operation, with a second instance waiting and woken: holder and waiter
/// both use `url`.
async fn exercise(url: &str) -> lockflight::Result<()> {
    let holder = RedisBackend::builder(url).prefix("lfacl").connect().await?;
    let waiter = RedisBackend::builder(url).prefix("lfacl").connect().await?;
    let key = LockKey::from(LeaseToken::random().to_hex());
    let (t1, t2) = (LeaseToken::random(), LeaseToken::random());
    epoch_of(holder.acquire(&key, t1, TTL, WhenBusy::Queue).await?);
    let Acquire::Busy { .. } = waiter.acquire(&key, t2, TTL, WhenBusy::Queue).await? else {
        panic!("the waiter got a held lock")
    };
    let mut woken = waiter.signals().watch(LockKind::Mutex, &key);
    assert_eq!(
        holder.renew(&key, t1, TTL).await?,
        Renewal::Renewed { waiting: 1 }
    );
    assert!(holder.release(&key, t1).await?.released);
    tokio::time::timeout(Duration::from_secs(5), woken.woken())
        .await
        .expect("the waiter is woken");
    epoch_of(waiter.acquire(&key, t2, TTL, WhenBusy::Queue).await?);
    assert!(waiter.release(&key, t2).await?.released);
    // A released token is never granted again: a new lease takes a new token.
    let t3 = LeaseToken::random();
    epoch_of(holder.acquire(&key, t3, TTL, WhenBusy::Queue).await?);
    holder.leave(&key).await?;
    assert!(holder.release(&key, t3).await?.released);

    // The read-write lock's scripts: a reader, a writer waiting and woken.
    let (rw_holder, rw_waiter) = (holder.rw().expect("rw"), waiter.rw().expect("rw"));
    let key = LockKey::from(LeaseToken::random().to_hex());
    let Acquire::Acquired { .. } = rw_holder
        .acquire_read(&key, t1, TTL, WhenBusy::Queue)
        .await?
    else {
        panic!("a free read lock was refused")
    };
    let Acquire::Busy { .. } = rw_waiter
        .acquire_write(&key, t2, TTL, WhenBusy::Queue)
        .await?
    else {
        panic!("a writer got a read-locked key")
    };
    let mut woken = waiter.signals().watch(LockKind::ReadWrite, &key);
    assert!(matches!(
        rw_holder.renew_read(&key, t1, TTL).await?,
        Renewal::Renewed { .. }
    ));
    assert!(rw_holder.release_read(&key, t1).await?.released);
    tokio::time::timeout(Duration::from_secs(5), woken.woken())
        .await
        .expect("the writer is woken");
    epoch_of(
        rw_waiter
            .acquire_write(&key, t2, TTL, WhenBusy::Queue)
            .await?,
    );
    assert!(matches!(
        rw_waiter.renew_write(&key, t2, TTL).await?,
        Renewal::Renewed { .. }
    ));
    assert!(rw_waiter.release_write(&key, t2).await?.released);
    Ok(())
}

fn assert_no_permission(
    what: &str,
    result: lockflight::Result<impl std::fmt::Debug>,
    needle: &str,
) {
    let text = error_text(what, result, "NoPermission", |e| {
        matches!(e, Error::NoPermission { .. })
    });
    assert!(
        text.to_lowercase().contains(needle),
        "{what}: the message does not name {needle:?}: {text}"
    );
}

/// ACL users: without `evalsha`, without the key pattern or without the channel
/// pattern, `connect()` fails with `NoPermission` naming what was refused; the
/// minimal user succeeds and can run every operation; and every rule of the
/// minimal line is needed (without it, connect or some operation is refused).
#[tokio::test]
async fn connect_checks_acl_permissions_and_the_minimal_line_suffices() {
    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let url = format!("redis://app:pw@127.0.0.1:{}/", server.port());
    let without = |rule: &str| -> Vec<&str> {
        MINIMAL_ACL_RULES
            .iter()
            .copied()
            .filter(|r| *r != rule)
            .collect()
    };
    let connect = || RedisBackend::builder(url.clone()).prefix("lfacl").connect();

    set_acl_user(&mut admin, "app", &without("+evalsha")).await;
    assert_no_permission("without evalsha", connect().await, "evalsha");

    let mut rules = without("~lfacl:*");
    rules.push("~other:*");
    set_acl_user(&mut admin, "app", &rules).await;
    assert_no_permission("without the key pattern", connect().await, "key");

    let mut rules = without("&lfacl:inst:*");
    rules.push("&other:*");
    set_acl_user(&mut admin, "app", &rules).await;
    assert_no_permission("without the channel pattern", connect().await, "channel");

    set_acl_user(&mut admin, "app", MINIMAL_ACL_RULES).await;
    exercise(&url).await.expect("the minimal ACL user");

    for rule in MINIMAL_ACL_RULES {
        set_acl_user(&mut admin, "app", &without(rule)).await;
        match exercise(&url).await {
            Err(e @ Error::NoPermission { .. }) => println!("without {rule}: {e}"),
            other => panic!("without {rule}: expected NoPermission, got {other:?}"),
        }
    }
}

/// A fenced write refused by the ACL inside its script (a user with every key but
/// only the lock commands has no `+type`, which the fenced script runs) is
/// `NoPermission` naming the resource,
/// on either engine: Redis 7.0 and Valkey word the refusal differently, and one
/// classification serves locks, fences and inspection. Nothing is written.
#[tokio::test]
async fn a_fenced_write_refused_inside_its_script_is_no_permission() {
    use lockflight::fence::FencedKey;

    let server = RedisServer::start();
    let mut admin = server.connection().await;
    let mut rules: Vec<&str> = MINIMAL_ACL_RULES.to_vec();
    rules.push("~*");
    set_acl_user(&mut admin, "app", &rules).await;
    let url = format!("redis://app:pw@127.0.0.1:{}/", server.port());
    let locker = Locker::builder(connect(&url, "lfacl").await)
        .build()
        .unwrap();
    let guard = locker.lock("sku:1").await.unwrap();
    let mut data = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let stock = FencedKey::new("lfacl:stock:1").unwrap();

    match stock.set(&mut data, &guard, "v").await {
        Err(Error::NoPermission { key, .. }) => assert_eq!(key.as_str(), Some("lfacl:stock:1")),
        other => panic!("expected NoPermission, got {other:?}"),
    }
    assert!(
        !exists(&mut admin, b"lfacl:stock:1").await,
        "nothing written"
    );
    guard.release().await.unwrap();
}
