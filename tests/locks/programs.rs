//! The guide's programs (`guide::lock_family`'s mutex, shapes and family
//! programs, `guide::fencing`'s Redis form, and the crate docs' first example)
//! leave nothing locked when they return: each runs as a child process against a
//! real Redis (the program's text, with a `RedisBackend` in place of
//! `MemoryBackend::new()`, and a prefix of its own), on a current-thread runtime
//! as the guide writes it, and on a multi-thread one; once the child has exited,
//! another instance takes every lock the program took, at once.
//!
//! The programs leave nothing held on purpose: each releases or drops what it
//! took before it returns. What can strand a key is what the library keeps after
//! that, a lease cached for the next local task (on by default), and whether
//! the runtime can still release it when `main` returns.

use std::time::Duration;

use lockflight::{Error, Handoff, LockOptions, Locker, RedisBackend};
use testkit::{shared, unique_prefix, within};

/// The environment variable that makes [`program_child`] run a program.
const CHILD_ENV: &str = "LOCKFLIGHT_PROGRAM_CHILD";

/// A runtime flavor, as `#[tokio::main]` builds it.
#[derive(Clone, Copy, Debug)]
enum Flavor {
    CurrentThread,
    MultiThread,
}

/// A program of the guide.
#[derive(Clone, Copy, Debug)]
enum Program {
    /// The crate docs' first example (an in-memory quick start).
    QuickStart,
    /// "More shapes".
    MoreShapes,
    /// "The lock family".
    Family,
    /// "Fenced writes", the Redis form.
    FencedKey,
}

impl Program {
    const ALL: [Program; 4] = [
        Program::QuickStart,
        Program::MoreShapes,
        Program::Family,
        Program::FencedKey,
    ];

    fn name(self) -> &'static str {
        match self {
            Program::QuickStart => "quick-start",
            Program::MoreShapes => "more-shapes",
            Program::Family => "family",
            Program::FencedKey => "fenced-key",
        }
    }

    fn named(name: &str) -> Program {
        Program::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .unwrap_or_else(|| panic!("the guide has no program called {name:?}"))
    }

    /// Runs the program on `url` under `prefix`.
    async fn run(self, url: &str, prefix: &str) -> lockflight::Result<()> {
        let backend = || async {
            RedisBackend::builder(url.to_owned())
                .prefix(prefix)
                .connect()
                .await
        };
        match self {
            Program::QuickStart => quick_start(backend().await?).await,
            Program::MoreShapes => more_shapes(backend().await?).await,
            Program::Family => family(backend().await?).await,
            Program::FencedKey => fenced_key(backend().await?, url).await,
        }
    }

    /// Whether another instance takes, at once, every lock the program took.
    async fn left_free(self, other: &Locker) -> Result<(), String> {
        let mutex = |key: &'static str| async move {
            match other.try_lock(key).await.unwrap() {
                Some(g) => {
                    g.release().await.unwrap();
                    Ok(())
                }
                None => Err(format!("the lock of {key} is held")),
            }
        };
        match self {
            Program::QuickStart | Program::FencedKey => mutex("sku:555").await,
            Program::MoreShapes => {
                mutex("sku:9").await?;
                mutex("sku:2").await
            }
            Program::Family => {
                match other.rwlock("stock:9").try_write().await.unwrap() {
                    Some(w) => w.release().await.unwrap(),
                    None => return Err("the read-write lock of stock:9 is held".into()),
                }
                // All four permits: one stranded permit would leave three.
                let tenant = other.semaphore("tenant:acme", 4);
                let mut permits = Vec::new();
                for _ in 0..4 {
                    match tenant.try_acquire().await.unwrap() {
                        Some(p) => permits.push(p),
                        None => {
                            return Err(format!(
                                "{} of tenant:acme's 4 permits are held",
                                4 - permits.len()
                            ));
                        }
                    }
                }
                for p in permits {
                    p.release().await.unwrap();
                }
                Ok(())
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The guide's programs, with `backend` where the guide builds a `MemoryBackend`.
// ---------------------------------------------------------------------------

async fn quick_start(backend: RedisBackend) -> lockflight::Result<()> {
    let locker = Locker::builder(backend)
        .lease_ttl(Duration::from_secs(30)) // renewed every 10 s while held
        .wait_timeout(Duration::from_secs(5)) // lock() gives up with Error::Timeout
        .handoff(Handoff::enabled()) // the default: pass leases between local tasks
        .build()?;

    let guard = locker.lock("sku:555").await?;
    let fence = guard.fencing_token(); // send it along with every write
    guard.release().await?;

    // Aborted with Error::LeaseLost if the lease is lost mid-way.
    let next = locker
        .with_lock("sku:555", |info| async move { info.fencing_token })
        .await?;
    assert!(next > fence);
    Ok(())
}

async fn more_shapes(backend: RedisBackend) -> lockflight::Result<()> {
    let locker = Locker::builder(backend).build()?;

    // Several keys, all or nothing, in one canonical order (no deadlocks).
    let cart = locker.lock_many(["sku:9", "sku:2"]).await?;

    // Per call: fail fast instead of queueing (LockLayer::options does it per route).
    let busy = locker
        .lock_with_options("sku:9", LockOptions::new().try_only())
        .await;
    assert!(matches!(busy, Err(Error::Busy { .. })));
    cart.release().await?;

    // Inside with_lock, locking the same key again fails at once instead of
    // waiting behind itself.
    let inner = locker.clone();
    let again = locker
        .with_lock(
            "sku:2",
            |_| async move { inner.lock("sku:2").await.map(drop) },
        )
        .await?;
    assert!(matches!(again, Err(Error::Reentrant { .. })));
    Ok(())
}

async fn family(backend: RedisBackend) -> lockflight::Result<()> {
    let locker = Locker::builder(backend).build()?;

    let stock = locker.rwlock("stock:9");
    let r1 = stock.read().await?;
    let r2 = stock.read().await?; // joins r1's lease, no backend call
    assert!(stock.try_write().await?.is_none());
    drop((r1, r2));
    let w = stock.write().await?; // fencing token > every earlier write's
    let token = w.fencing_token();
    w.release().await?;
    assert_eq!(stock.read().await?.last_write(), token);

    let tenant = locker.semaphore("tenant:acme", 4);
    let permit = tenant.acquire().await?;
    assert!(matches!(
        locker.semaphore("tenant:acme", 5).acquire().await,
        Err(Error::PermitMismatch { permits: 4, .. })
    ));
    permit.release().await?;
    Ok(())
}

async fn fenced_key(backend: RedisBackend, url: &str) -> lockflight::Result<()> {
    use lockflight::fence::{Fenced, FencedKey};

    let locker = Locker::builder(backend).build()?;
    let mut data = redis::Client::open(url)
        .expect("a valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("Redis is up");
    // Under the test's own prefix, as a resource of its own.
    let stock = FencedKey::new(format!("{}:stock:{{555}}", locker_prefix()))?;

    let guard = locker.lock("sku:555").await?;
    match stock.incr_by(&mut data, &guard, -1).await? {
        Fenced::Applied(left) => println!("{left} left"),
        Fenced::Stale { last, offered } => println!("fenced out: {offered} < {last}"),
    }
    guard.release().await?;
    Ok(())
}

/// The child's prefix (set by the parent).
fn locker_prefix() -> String {
    std::env::var("LOCKFLIGHT_PROGRAM_PREFIX").expect("LOCKFLIGHT_PROGRAM_PREFIX is not set")
}

// ---------------------------------------------------------------------------
// The runtimes, as `#[tokio::main]` builds them: the program's locker is dropped
// when its future ends, inside `block_on`, and the runtime is dropped after.
// ---------------------------------------------------------------------------

#[tokio::main(flavor = "current_thread")]
async fn on_current_thread(program: Program, url: &str, prefix: &str) -> lockflight::Result<()> {
    program.run(url, prefix).await
}

#[tokio::main]
async fn on_multi_thread(program: Program, url: &str, prefix: &str) -> lockflight::Result<()> {
    program.run(url, prefix).await
}

/// Not a test: the child process of [`the_guides_programs_leave_nothing_locked`]. It
/// runs the program and the flavor its environment names, then says so.
#[test]
#[ignore = "child process of the_guides_programs_leave_nothing_locked"]
fn program_child() {
    let Ok(program) = std::env::var(CHILD_ENV) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let (url, prefix) = (var("LOCKFLIGHT_PROGRAM_URL"), locker_prefix());
    let program = Program::named(&program);
    match var("LOCKFLIGHT_PROGRAM_FLAVOR").as_str() {
        "current" => on_current_thread(program, &url, &prefix),
        "multi" => on_multi_thread(program, &url, &prefix),
        other => panic!("no runtime flavor called {other:?}"),
    }
    .unwrap_or_else(|e| panic!("child: {program:?} failed: {e}"));
    // After the runtime is gone: everything the program did has been done.
    testkit::tell_parent("LFCHILD RETURNED");
}

/// Runs `program` on `flavor` in a child process and, once it has exited,
/// checks that another instance takes its locks at once.
async fn leaves_nothing_locked(program: Program, flavor: Flavor) -> Result<(), String> {
    let prefix = unique_prefix(&format!("readme-{}", program.name()));
    let flavor_name = match flavor {
        Flavor::CurrentThread => "current",
        Flavor::MultiThread => "multi",
    };
    let (mut child, mut lines) = testkit::spawn_test_child(
        &testkit::test_path(module_path!(), "program_child"),
        &[
            (CHILD_ENV, program.name().to_owned()),
            ("LOCKFLIGHT_PROGRAM_FLAVOR", flavor_name.to_owned()),
            ("LOCKFLIGHT_PROGRAM_URL", shared().url()),
            ("LOCKFLIGHT_PROGRAM_PREFIX", prefix.clone()),
        ],
    );
    testkit::child_line(&mut lines, "LFCHILD RETURNED").await;
    let status = within(Duration::from_secs(60), "the child's exit", child.wait())
        .await
        .unwrap();
    assert!(
        status.success(),
        "{program:?} on {flavor:?} failed: {status}"
    );

    let backend = RedisBackend::builder(shared().url())
        .prefix(&prefix)
        .connect()
        .await
        .expect("connect");
    let other = Locker::builder(backend)
        .handoff(Handoff::disabled())
        .build()
        .expect("valid settings");
    let free = program.left_free(&other).await;
    other.shutdown().await;
    free.map_err(|held| format!("{program:?} on {flavor:?}: {held}"))
}

/// Every program of the guide, on either runtime flavor, leaves every key it
/// locked free for another instance the moment it has exited. Without the
/// release of cached leases when the last `Locker` is dropped on a
/// current-thread runtime, the quick start leaves `sku:555` held for its 30 s
/// lease TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_programs_leave_nothing_locked() {
    let mut held = Vec::new();
    for flavor in [Flavor::CurrentThread, Flavor::MultiThread] {
        for program in Program::ALL {
            if let Err(e) = leaves_nothing_locked(program, flavor).await {
                held.push(e);
            }
        }
    }
    assert!(held.is_empty(), "locks left held:\n{}", held.join("\n"));
}
