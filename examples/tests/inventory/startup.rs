//! Instances started at the same moment on a new SQLite file all come up.

use std::path::PathBuf;
use std::time::Duration;

use crate::app;

/// The child's environment: the database file, and the file whose appearance
/// starts it.
const CHILD_DB: &str = "INVENTORY_CHILD_DB";
const CHILD_GO: &str = "INVENTORY_CHILD_GO";

/// Instances are separate processes opening one new database file (SQLite's
/// locks between processes are what failed: "database is locked" while another
/// process switched the new file to WAL). Several rounds of three processes, each
/// released by one file appearing: every instance comes up, in WAL mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_started_together_on_a_new_database_all_come_up() {
    for round in 0..30 {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("inventory.db");
        let go = dir.path().join("go");
        let mut children = Vec::new();
        for _ in 0..3 {
            let (child, mut lines) = testkit::spawn_test_child(
                "startup::child_opens_the_database",
                &[
                    (CHILD_DB, db.display().to_string()),
                    (CHILD_GO, go.display().to_string()),
                ],
            );
            testkit::child_line(&mut lines, "child: ready").await;
            children.push((child, lines));
        }
        std::fs::write(&go, b"go").unwrap();
        for (_child, lines) in &mut children {
            let opened = testkit::child_line(lines, "child: opened").await;
            assert_eq!(opened, "wal", "round {round}: an instance did not come up");
        }
    }
}

/// The child of the test above (does nothing in an ordinary run): waits for the
/// start file, opens the database as an instance does, says how it went.
#[tokio::test]
#[ignore = "a child process of instances_started_together_on_a_new_database_all_come_up"]
async fn child_opens_the_database() {
    let (Some(db), Some(go)) = (std::env::var_os(CHILD_DB), std::env::var_os(CHILD_GO)) else {
        return;
    };
    let (db, go) = (PathBuf::from(db), PathBuf::from(go));
    testkit::tell_parent("child: ready");
    let mut waited = 0;
    while !go.exists() {
        assert!(waited < 30_000, "child: no start file within 30 s");
        std::thread::sleep(Duration::from_millis(1));
        waited += 1;
    }
    match app::open_db(Some(&db)).await {
        Ok(pool) => {
            let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
                .fetch_one(&pool)
                .await
                .unwrap();
            testkit::tell_parent(&format!("child: opened {mode}"));
        }
        Err(e) => testkit::tell_parent(&format!("child: opened failed: {e}")),
    }
}
