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
use baton::{Client, Expected, ForceRelease, LockOptions};
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

const EX_USAGE: i32 = 64;
const EX_TEMPFAIL: i32 = 75;
/// A lease whose first extension (at a third of it) is far off: a loss heard within `WITHIN`
/// was heard on the channel, not at an extension.
const LONG: Duration = Duration::from_secs(60);
const WITHIN: Duration = Duration::from_secs(10);

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The commands a refusal printed, each on a line of its own: `baton ...`.
fn printed(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("baton "))
        .map(str::to_string)
        .collect()
}

/// Runs a printed command as an operator pastes it (plain words only).
async fn run_printed(line: &str, url: &str) -> Output {
    let mut cmd = baton_command(BATON);
    cmd.env("BATON_URL", url);
    for word in line.split_whitespace().skip(1) {
        cmd.arg(if word == "\"$BATON_URL\"" { url } else { word });
    }
    finish_by(spawn(&mut cmd), Instant::now() + QUICK, line).await
}

/// The holders `name` shows now (holder id, slot, mode, fencing token).
async fn shown(client: &Client, name: &str) -> Vec<baton::inspect::Holder> {
    client
        .inspect()
        .find(name)
        .await
        .expect("find")
        .into_iter()
        .flat_map(|e| e.holders)
        .collect()
}

/// `Semaphores::force_release` and `RwLocks::force_release` take only the grant named, the
/// holder hears it at once on the channel (a permit, a writer, and a reader named by its holder
/// while another reader keeps its share), and the next token is higher.
async fn force_release_takes_only_the_grant_named(url: &str) {
    let client = Client::connect(url).await.expect("connect");
    let op = Client::connect(url).await.expect("connect");
    let sems = client.semaphores();
    let mut a = sems.try_acquire("fr", 2, LONG).await.unwrap().unwrap();
    let b = sems.try_acquire("fr", 2, LONG).await.unwrap().unwrap();
    a.start_watchdog(None);
    // Give the watchdog its subscription (a taken message before it is lost to it, and the
    // extension that would then tell it is a third of the lease away).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ops = op.semaphores();
    for stale in [
        Expected::Token(b.fencing_token()),
        Expected::Token(a.fencing_token() - 1),
        Expected::Holder("deadbeef".into()),
    ] {
        match ops.force_release("fr", a.slot(), &stale).await.unwrap() {
            ForceRelease::HeldByAnother(t) => assert_eq!(t.fencing_token, Some(a.fencing_token())),
            other => panic!("{stale:?} took {other:?}"),
        }
    }
    assert!(!a.is_lost(), "a stale name took the permit");
    let taken = ops
        .force_release("fr", a.slot(), &Expected::Token(a.fencing_token()))
        .await
        .unwrap();
    assert!(
        matches!(&taken, ForceRelease::Released(t) if t.fencing_token == Some(a.fencing_token())),
        "{taken:?}"
    );
    tokio::time::timeout(WITHIN, a.lost())
        .await
        .expect("the permit's holder heard it at once");
    assert!(a.loss_reason().unwrap_or_default().contains("operator"));
    // The other permit stays; the slot is free again, its next token higher.
    assert_eq!(shown(&op, "fr").await.len(), 1);
    let next = sems
        .try_acquire("fr", 2, LONG)
        .await
        .unwrap()
        .expect("a free slot");
    assert_eq!(next.slot(), a.slot());
    assert!(next.fencing_token() > a.fencing_token());
    // --any takes whatever holds the slot named: b's.
    match ops
        .force_release("fr", b.slot(), &Expected::Any)
        .await
        .unwrap()
    {
        ForceRelease::Released(t) => assert_eq!(t.fencing_token, Some(b.fencing_token())),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        ops.force_release("fr", b.slot(), &Expected::Any)
            .await
            .unwrap(),
        ForceRelease::Free
    );
    drop(next);
    finish_rw(&client, &op).await;
}

/// The read-write half of [`force_release_takes_only_the_grant_named`].
async fn finish_rw(client: &Client, op: &Client) {
    let rw = client.rw_locks();
    let orw = op.rw_locks();
    let mut w = rw.try_write("frw", LONG).await.unwrap().unwrap();
    w.start_watchdog(None);
    tokio::time::sleep(Duration::from_millis(500)).await;
    match orw
        .force_release("frw", &Expected::Token(w.fencing_token() - 1))
        .await
        .unwrap()
    {
        ForceRelease::HeldByAnother(t) => assert_eq!(t.fencing_token, Some(w.fencing_token())),
        other => panic!("a stale token took {other:?}"),
    }
    let taken = orw
        .force_release("frw", &Expected::Token(w.fencing_token()))
        .await
        .unwrap();
    assert!(matches!(taken, ForceRelease::Released(_)), "{taken:?}");
    tokio::time::timeout(WITHIN, w.lost())
        .await
        .expect("the writer heard it at once");
    let last = w.fencing_token();
    // Readers: the one taken hears it at once (named by its holder: readers share their
    // fencing token), the other keeps its share.
    let mut r1 = rw.try_read("frw", LONG).await.unwrap().expect("free");
    r1.start_watchdog(None);
    let id1 = shown(op, "frw").await[0].holder.clone();
    let r2 = rw
        .try_read("frw", LONG)
        .await
        .unwrap()
        .expect("readers share");
    assert_eq!(r1.fencing_token(), last);
    // The last write's token names no reader: every reader carries it.
    match orw
        .force_release("frw", &Expected::Token(last))
        .await
        .unwrap()
    {
        ForceRelease::HeldByAnother(_) => {}
        other => panic!("a reader was taken by token: {other:?}"),
    }
    let taken = orw
        .force_release("frw", &Expected::Holder(id1.clone()))
        .await
        .unwrap();
    assert!(
        matches!(&taken, ForceRelease::Released(t) if t.holder == id1),
        "{taken:?}"
    );
    tokio::time::timeout(WITHIN, r1.lost())
        .await
        .expect("the reader heard it at once");
    assert!(!r2.is_lost());
    let left = shown(op, "frw").await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_ne!(left[0].holder, id1);
    assert!(r2.release().await.unwrap());
    assert_eq!(
        orw.force_release("frw", &Expected::Any).await.unwrap(),
        ForceRelease::Free
    );
    let next = rw.try_write("frw", LONG).await.unwrap().expect("free");
    assert!(next.fencing_token() > last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_takes_only_the_grant_named_on_redis() {
    let server = RedisServer::start().expect("redis");
    force_release_takes_only_the_grant_named(&server.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_takes_only_the_grant_named_on_postgres() {
    let db = common::PgDatabase::create();
    force_release_takes_only_the_grant_named(&db.url).await;
}

/// `baton unlock` on a semaphore and a read-write lock: without a name it describes every
/// holder and prints a command naming each (a permit by `--permit SLOT --token N`, a writer by
/// `--token N`, a reader by `--holder ID`); the printed commands take exactly that grant.
async fn unlock_names_a_permit_or_a_holder(url: &str) {
    let client = Client::connect(url).await.expect("connect");
    let sems = client.semaphores();
    let a = sems.try_acquire("pool", 3, LONG).await.unwrap().unwrap();
    let b = sems.try_acquire("pool", 3, LONG).await.unwrap().unwrap();
    let shown_out = baton(url, &["unlock", "--key", "pool"]).await;
    assert_eq!(shown_out.status.code(), Some(EX_USAGE), "{shown_out:?}");
    let commands = printed(&shown_out);
    assert_eq!(commands.len(), 2, "{}", stderr(&shown_out));
    let for_b = format!("--permit {} --token {}", b.slot(), b.fencing_token());
    let line = commands
        .iter()
        .find(|c| c.contains(&for_b))
        .unwrap_or_else(|| panic!("no command names {for_b}: {commands:?}"));
    let out = run_printed(line, url).await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        b.is_lost()
            || !shown(&client, "pool")
                .await
                .iter()
                .any(|h| h.slot == Some(b.slot()))
    );
    // Run late, after the slot changed hands, it leaves the new holder alone.
    let c = sems.try_acquire("pool", 3, LONG).await.unwrap().unwrap();
    assert_eq!(c.slot(), b.slot());
    let out = run_printed(line, url).await;
    assert_eq!(out.status.code(), Some(EX_TEMPFAIL), "{out:?}");
    // A token alone finds its slot.
    let token = a.fencing_token().to_string();
    let out = baton(url, &["unlock", "--key", "pool", "--token", &token]).await;
    assert!(out.status.success(), "{out:?}");
    let left = shown(&client, "pool").await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].slot, Some(c.slot()));

    // A read-write lock: the writer by token, a reader by holder; --permit is refused.
    let rw = client.rw_locks();
    let w = rw.try_write("doc", LONG).await.unwrap().unwrap();
    let out = baton(url, &["unlock", "--key", "doc", "--permit", "0", "--any"]).await;
    assert_eq!(out.status.code(), Some(EX_USAGE), "{out:?}");
    let out = baton(url, &["unlock", "--key", "doc"]).await;
    assert_eq!(out.status.code(), Some(EX_USAGE), "{out:?}");
    let commands = printed(&out);
    let by_token = format!("--token {}", w.fencing_token());
    assert!(
        commands.len() == 1 && commands[0].contains(&by_token),
        "{commands:?}"
    );
    let out = run_printed(&commands[0], url).await;
    assert!(out.status.success(), "{out:?}");
    let last = w.fencing_token();
    let r1 = rw.try_read("doc", LONG).await.unwrap().expect("free");
    let r2 = rw.try_read("doc", LONG).await.unwrap().expect("shared");
    assert_eq!(r1.fencing_token(), last);
    // The last write's token names no reader: refused, with a command per reader.
    let out = baton(
        url,
        &["unlock", "--key", "doc", "--token", &last.to_string()],
    )
    .await;
    assert_eq!(out.status.code(), Some(EX_USAGE), "{out:?}");
    assert!(stderr(&out).contains("--holder"), "{}", stderr(&out));
    let out = baton(url, &["unlock", "--key", "doc", "--any"]).await;
    assert_eq!(out.status.code(), Some(EX_USAGE), "{out:?}");
    let commands = printed(&out);
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert!(
        commands.iter().all(|c| c.contains("--holder")),
        "{commands:?}"
    );
    let out = run_printed(&commands[0], url).await;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(shown(&client, "doc").await.len(), 1);
    drop((a, c, r1, r2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_names_a_permit_or_a_holder_on_redis() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    unlock_names_a_permit_or_a_holder(&url).await;

    // Two slots showing one token (each steps its own fence from the server's clock; forged
    // here by fences ahead of the clock): the token alone is refused, naming both slots.
    let raw = redis::Client::open(url.as_str()).unwrap();
    let mut conn = raw.get_multiplexed_async_connection().await.unwrap();
    let ahead = "9000000000000000";
    let _: () = redis::cmd("HSET")
        .arg("baton:sem:{dup}")
        .arg("f0")
        .arg(ahead)
        .arg("f1")
        .arg(ahead)
        .query_async(&mut conn)
        .await
        .unwrap();
    let client = Client::connect(&url).await.unwrap();
    let sems = client.semaphores();
    let x = sems.try_acquire("dup", 2, LONG).await.unwrap().unwrap();
    let y = sems.try_acquire("dup", 2, LONG).await.unwrap().unwrap();
    assert_eq!(x.fencing_token(), y.fencing_token());
    let token = x.fencing_token().to_string();
    let out = baton(&url, &["unlock", "--key", "dup", "--token", &token]).await;
    assert_eq!(out.status.code(), Some(EX_USAGE), "{out:?}");
    let commands = printed(&out);
    assert_eq!(commands.len(), 2, "{}", stderr(&out));
    assert!(commands.iter().any(|c| c.contains("--permit 0")));
    assert!(commands.iter().any(|c| c.contains("--permit 1")));
    let out = baton(
        &url,
        &["unlock", "--key", "dup", "--permit", "1", "--token", &token],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let left = shown(&client, "dup").await;
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].slot, Some(0));
    drop((x, y));
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_names_a_permit_or_a_holder_on_postgres() {
    let db = common::PgDatabase::create();
    unlock_names_a_permit_or_a_holder(&db.url).await;
}

/// A semaphore's fair waiters: their line's keys stand beside it (no entry of their own), and
/// the entry counts them.
async fn fair_waiters_are_counted(url: &str) {
    let client = Client::connect(url).await.expect("connect");
    let sems = client.semaphores();
    let held = sems.try_acquire("line", 1, LONG).await.unwrap().unwrap();
    let opts = LockOptions::builder()
        .fair(true)
        .wait(Duration::from_secs(30))
        .build()
        .unwrap();
    let waiter = {
        let sems = sems.clone();
        let opts = opts.clone();
        tokio::spawn(async move { sems.acquire("line", 1, LONG, &opts).await })
    };
    let deadline = Instant::now() + QUICK;
    loop {
        let found = client.inspect().find("line").await.unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        if found[0].waiting == Some(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter never showed: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = baton(url, &["status", "--json"]).await;
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["waiting"], 1, "{rows:?}");
    assert!(held.release().await.unwrap());
    let got = waiter.await.unwrap().unwrap();
    assert_eq!(
        client.inspect().find("line").await.unwrap()[0].waiting,
        None
    );
    drop(got);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_counted_on_redis() {
    let server = RedisServer::start().expect("redis");
    fair_waiters_are_counted(&server.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_are_counted_on_postgres() {
    let db = common::PgDatabase::create();
    fair_waiters_are_counted(&db.url).await;
}
