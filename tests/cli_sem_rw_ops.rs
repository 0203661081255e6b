//! The operator's view of the semaphore and the read-write lock: `Inspector::find`, `list` and
//! `watch` of each, and `baton status` (text, `--json`, `--kind`, `--key`) listing a
//! semaphore's limit and held permits (slot, fencing token, holder) and a read-write lock's
//! mode, holders and last write token, with the slots' and holders' own keys never listed as
//! entries of their own; on Redis and on PostgreSQL (the least-privilege role).
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::process::Output;
use std::time::Duration;

use baton::inspect::{EntryState, HoldMode, Kind};
use baton::prelude::*;
use baton::testing::RedisServer;
use baton::Client;
use common::process::{baton_command, finish_by, spawn};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const QUICK: Duration = Duration::from_secs(15);
const LEASE: Duration = Duration::from_secs(30);

async fn baton(url: &str, args: &[&str]) -> Output {
    let mut cmd = baton_command(BATON);
    cmd.args(args).arg("--url").arg(url);
    finish_by(spawn(&mut cmd), Instant::now() + QUICK, args[0]).await
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    stdout(out)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

async fn operators_view(url: &str) {
    let client = Client::connect(url).await.expect("connect");
    let sems = client.semaphores();
    let a = sems.try_acquire("pool", 3, LEASE).await.unwrap().unwrap();
    let b = sems.try_acquire("pool", 3, LEASE).await.unwrap().unwrap();
    let rw = client.rw_locks();
    let r1 = rw.try_read("cfg", LEASE).await.unwrap().unwrap();
    let r2 = rw.try_read("cfg", LEASE).await.unwrap().unwrap();
    let w = rw.try_write("doc", LEASE).await.unwrap().unwrap();

    // find: the semaphore with its limit and both permits, by slot, with each slot's token.
    let inspect = client.inspect();
    let found = inspect.find("pool").await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let e = &found[0];
    assert_eq!(
        (e.kind, e.state, e.limit),
        (Kind::Semaphore, EntryState::Held, Some(3))
    );
    let slots: Vec<(Option<u32>, Option<u64>)> = e
        .holders
        .iter()
        .map(|h| (h.slot, h.fencing_token))
        .collect();
    assert_eq!(
        slots,
        [
            (Some(a.slot()), Some(a.fencing_token())),
            (Some(b.slot()), Some(b.fencing_token()))
        ]
    );
    assert!(e
        .holders
        .iter()
        .all(|h| h.remaining_ms.is_some_and(|ms| ms > 0)));
    assert_eq!(e.holders_summary().as_deref(), Some("2/3"));

    // The read-write locks: two readers carrying the last write's token (none yet), a writer.
    let cfg = inspect.find("cfg").await.unwrap();
    assert_eq!(cfg.len(), 1, "{cfg:?}");
    assert_eq!(cfg[0].kind, Kind::RwLock);
    assert_eq!(cfg[0].holders.len(), 2);
    assert!(cfg[0]
        .holders
        .iter()
        .all(|h| h.mode == Some(HoldMode::Read)));
    assert_eq!(cfg[0].holders_summary().as_deref(), Some("read ×2"));
    assert_eq!(cfg[0].writer_waiting, Some(false));
    let doc = inspect.find("doc").await.unwrap();
    assert_eq!(doc[0].holders_summary().as_deref(), Some("write"));
    assert_eq!(doc[0].fencing_token, Some(w.fencing_token()));
    assert_eq!(doc[0].holders[0].fencing_token, Some(w.fencing_token()));
    assert!(doc[0].holder.is_some());

    // The listing: one entry each, never a slot's or a holder's key as a mutex of its own.
    let out = baton(url, &["status", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    let rows = json_lines(&out);
    let names: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap().into(),
                r["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [
            ("rwlock".to_string(), "cfg".to_string()),
            ("rwlock".into(), "doc".into()),
            ("semaphore".into(), "pool".into()),
        ],
        "{rows:?}"
    );
    let pool = rows.iter().find(|r| r["name"] == "pool").unwrap();
    assert_eq!(pool["limit"], 3);
    assert_eq!(pool["holders"].as_array().unwrap().len(), 2);
    assert_eq!(pool["holders"][0]["slot"], a.slot());
    assert_eq!(pool["holders"][0]["fencing_token"], a.fencing_token());

    // --kind, and the text rows: the summary in the holder column, a line per holder.
    let out = baton(url, &["status", "--kind", "semaphore"]).await;
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("semaphore pool"), "{text}");
    assert!(text.contains("2/3"), "{text}");
    assert!(
        text.contains(&format!("slot {} token {}", a.slot(), a.fencing_token())),
        "{text}"
    );
    assert!(!text.contains("rwlock"), "{text}");
    let out = baton(url, &["status", "--key", "cfg"]).await;
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("rwlock:"), "{text}");
    assert!(text.contains("mode:         read ×2"), "{text}");
    assert!(text.contains("writer waits: no"), "{text}");
    let out = baton(url, &["status", "--key", "pool", "--json"]).await;
    let rows = json_lines(&out);
    assert_eq!(rows[0]["kind"], "semaphore", "{rows:?}");

    // watch: each change of the holders is an event (a release here).
    let mut watch = inspect.watch(Kind::Semaphore, "pool").await.unwrap();
    let first = watch.next_event().await.unwrap();
    assert_eq!(first.holders.len(), 2);
    assert!(b.release().await.unwrap());
    let next = tokio::time::timeout(QUICK, watch.next_event())
        .await
        .expect("a change")
        .unwrap();
    assert_eq!(next.holders.len(), 1);
    assert_eq!(next.holders[0].slot, Some(a.slot()));
    let mut watch = inspect.watch(Kind::RwLock, "cfg").await.unwrap();
    assert_eq!(watch.next_event().await.unwrap().holders.len(), 2);
    assert!(r1.release().await.unwrap());
    let next = tokio::time::timeout(QUICK, watch.next_event())
        .await
        .expect("a change")
        .unwrap();
    assert_eq!(next.holders_summary().as_deref(), Some("read ×1"));
    drop((a, r2, w));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_watch_show_semaphores_and_rw_locks_on_redis() {
    let server = RedisServer::start().expect("redis");
    operators_view(&server.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_watch_show_semaphores_and_rw_locks_on_postgres() {
    let db = common::PgDatabase::create();
    operators_view(&db.url).await;
}
