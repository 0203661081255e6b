//! Run-or-enqueue against real servers: free and held keys, the arrived-while-finishing race,
//! redelivery after a dropped or killed holder, handler errors, a lost lease, and the
//! acceptance run (1 000 items from 8 tasks in 4 processes into a fenced, deduplicating sink,
//! with and without a holder SIGKILLed mid-drain).

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::{Drain, ErrorKind, QueueItem, Queues, RunOrEnqueue};
use common::{client, raw, server, Raw, WAKE};
use tokio::time::Instant;

/// A holder's lease where a test does not say otherwise.
const TTL: Duration = Duration::from_secs(10);

fn lock_key(name: &str) -> String {
    format!("baton:queue:{{{name}}}")
}

fn items_key(name: &str) -> String {
    format!("baton:queue:{{{name}}}:items")
}

async fn exists(conn: &mut Raw, key: &str) -> bool {
    let n: i64 = redis::cmd("EXISTS")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap();
    n == 1
}

/// Released with nothing queued: no lock, and the empty stream kept with a TTL (so its ids
/// never repeat; see `lease::items`).
async fn assert_released_empty(conn: &mut Raw, name: &str) {
    assert!(
        !exists(conn, &lock_key(name)).await,
        "`{name}` is still held"
    );
    let len: i64 = redis::cmd("XLEN")
        .arg(items_key(name))
        .query_async(conn)
        .await
        .unwrap();
    assert_eq!(len, 0, "items left on `{name}`");
    assert!(
        common::pttl(conn, &items_key(name)).await > 0,
        "the empty stream has a TTL"
    );
}

fn parse_id(id: &str) -> (u64, u64) {
    let (a, b) = id.split_once('-').expect("a stream id");
    (a.parse().unwrap(), b.parse().unwrap())
}

/// What a poster got back, and how long its call took.
type Posted = Arc<Mutex<Vec<(RunOrEnqueue<String>, Duration)>>>;

/// What a handler saw: (id, body, fencing token), in order.
type Seen = Arc<Mutex<Vec<(String, String, u64)>>>;

fn record(seen: &Seen, item: &QueueItem) {
    seen.lock().unwrap().push((
        item.id.clone(),
        String::from_utf8_lossy(&item.body).into_owned(),
        item.fencing_token,
    ));
}

fn bodies(seen: &Seen) -> Vec<String> {
    seen.lock().unwrap().iter().map(|s| s.1.clone()).collect()
}

/// Drains `key` until a drain ran (the key may still be held for a moment), within `within`.
async fn drain_until_ran<F, Fut>(
    q: &Queues,
    key: &str,
    ttl: Duration,
    within: Duration,
    mut handler: F,
) -> (u64, u64)
where
    F: FnMut(QueueItem) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + within;
    loop {
        match q.drain(key, ttl, &mut handler).await.expect("drain") {
            Drain::Ran {
                handled,
                fencing_token,
            } => return (handled, fencing_token),
            Drain::Busy => {
                assert!(
                    Instant::now() < deadline,
                    "`{key}` stayed busy for {within:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("`{key}`: {other:?}"),
        }
    }
}

scenario! {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_free_key_runs_the_handler_once_on_its_own_item() {
        let srv = server();
        let c = client(&srv).await;
        let mut admin = raw(&srv).await;
        let q = c.queues();
        let seen: Seen = Arc::default();
        let s = seen.clone();
        let out = q
            .run_or_enqueue("solo", "hello", TTL, move |item| {
                let s = s.clone();
                async move {
                    record(&s, &item);
                    Ok::<(), String>(())
                }
            })
            .await
            .expect("run_or_enqueue");
        let RunOrEnqueue::Ran { handled, fencing_token } = out else {
            panic!("a free key must run, got {out:?}");
        };
        assert_eq!(handled, 1);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].1, "hello");
        assert_eq!(seen[0].2, fencing_token);
        assert!(fencing_token > 0);
        assert_released_empty(&mut admin, "solo").await;
        assert_eq!(q.pending("solo").await.unwrap(), 0);
    }

    // The holder's handler posts from another client while it handles the last item it read:
    // that post finds the key held (so it returns at once, `Enqueued`) and lands after the
    // holder's read, in the window before its release. The release-if-empty script must send
    // the holder back to drain it: a plain release would strand it (handled == 1).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_item_posted_while_the_holder_finishes_causes_one_more_run() {
        let srv = server();
        let holder = client(&srv).await;
        let other = client(&srv).await.queues();
        let mut admin = raw(&srv).await;
        let seen: Seen = Arc::default();
        let posted: Posted = Arc::default();
        let (s, p) = (seen.clone(), posted.clone());
        let out = holder
            .queues()
            .run_or_enqueue("race", "a", TTL, move |item| {
                let (s, p, other) = (s.clone(), p.clone(), other.clone());
                async move {
                    record(&s, &item);
                    if item.body == b"a" {
                        let t = Instant::now();
                        let r = other
                            .run_or_enqueue("race", "b", TTL, |_| async {
                                Err::<(), String>("the poster must not run: the key is held".into())
                            })
                            .await
                            .map_err(|e| e.to_string())?;
                        p.lock().unwrap().push((r, t.elapsed()));
                    }
                    Ok::<(), String>(())
                }
            })
            .await
            .expect("run_or_enqueue");
        let posted = posted.lock().unwrap().clone();
        assert_eq!(posted.len(), 1);
        let RunOrEnqueue::Enqueued { id: b_id } = &posted[0].0 else {
            panic!("a held key must enqueue, got {:?}", posted[0].0);
        };
        assert!(posted[0].1 < WAKE, "enqueueing took {:?}", posted[0].1);
        let RunOrEnqueue::Ran { handled, fencing_token } = out else {
            panic!("expected Ran, got {out:?}");
        };
        assert_eq!(handled, 2, "the late item was drained by the same hold");
        assert_eq!(bodies(&seen), ["a", "b"]);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(&seen[1].0, b_id, "the handler sees the id the poster got");
        assert!(seen.iter().all(|s| s.2 == fencing_token));
        assert_released_empty(&mut admin, "race").await;
    }

    // A holder whose future is dropped mid-item (as a crash would) leaves the item queued;
    // the next holder gets it again, same id, larger fencing token.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_item_whose_holder_was_dropped_mid_handler_is_delivered_again() {
        let srv = server();
        let a = client(&srv).await;
        let b = client(&srv).await;
        let first: Seen = Arc::default();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
        let started_tx = Arc::new(Mutex::new(Some(started_tx)));
        let f = first.clone();
        let qa = a.queues();
        let task = tokio::spawn(async move {
            qa.run_or_enqueue("crash", "x", TTL, move |item| {
                let (f, tx) = (f.clone(), started_tx.clone());
                async move {
                    record(&f, &item);
                    if let Some(tx) = tx.lock().unwrap().take() {
                        let _ = tx.send(());
                    }
                    // "Crashes" here: never finishes; the future is dropped.
                    std::future::pending::<()>().await;
                    Ok::<(), String>(())
                }
            })
            .await
        });
        tokio::time::timeout(WAKE, started_rx).await.expect("handler started").unwrap();
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        let second: Seen = Arc::default();
        let s = second.clone();
        // The dropped holder released by token in the background: well before its 10 s lease.
        let (handled, fence) = drain_until_ran(&b.queues(), "crash", TTL, WAKE, move |item| {
            let s = s.clone();
            async move {
                record(&s, &item);
                Ok(())
            }
        })
        .await;
        assert_eq!(handled, 1);
        let (first, second) = (first.lock().unwrap().clone(), second.lock().unwrap().clone());
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].0, first[0].0, "redelivered under the same id");
        assert_eq!(second[0].1, "x");
        assert!(second[0].2 > first[0].2, "a larger fencing token: {second:?} vs {first:?}");
        assert_eq!(fence, second[0].2);
        assert_eq!(b.queues().pending("crash").await.unwrap(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_keeps_the_item_queued_and_frees_the_key() {
    let srv = server();
    let c = client(&srv).await;
    let q = c.queues();
    // The handler's failure is the user's, so it comes back inside `Ok`, with the item's id.
    let out = q
        .run_or_enqueue("err", "bad", TTL, |_| async {
            Err::<(), &str>("sink down")
        })
        .await
        .expect("a handler error is not baton's");
    let RunOrEnqueue::HandlerFailed {
        id,
        handled,
        error,
        fencing_token,
    } = &out
    else {
        panic!("expected a handler failure, got {out:?}");
    };
    assert_eq!((*handled, *error), (0, "sink down"));
    assert!(*fencing_token > 0, "{out:?}");
    assert_eq!(q.pending("err").await.unwrap(), 1);
    // Released at once: a drain right away runs and gets the same item.
    let got: Seen = Arc::default();
    let g = got.clone();
    let out = q
        .drain("err", TTL, move |item| {
            let g = g.clone();
            async move {
                record(&g, &item);
                Ok::<(), String>(())
            }
        })
        .await
        .unwrap();
    assert!(matches!(out, Drain::Ran { handled: 1, .. }), "{out:?}");
    assert_eq!(&got.lock().unwrap()[0].0, id);
    assert_eq!(q.pending("err").await.unwrap(), 0);
    // A drain of an empty queue runs nothing and lets go.
    let out = q
        .drain("err", TTL, |_| async {
            Err::<(), String>("nothing is queued".into())
        })
        .await
        .unwrap();
    assert!(matches!(out, Drain::Ran { handled: 0, .. }), "{out:?}");
    assert_released_empty(&mut raw(&srv).await, "err").await;
}

/// Someone else takes the key from under the holder (its lock rewritten): the watchdog's next
/// extension is refused, the running handler is dropped, the call reports `LeaseLost`, and the
/// item stays queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_stops_the_drain_and_keeps_the_item() {
    let srv = server();
    let c = client(&srv).await;
    let mut admin = raw(&srv).await;
    let q = c.queues();
    let admin_url = srv.url();
    let started = Instant::now();
    let err = q
        .run_or_enqueue("lost", "item", Duration::from_millis(600), move |_| {
            let url = admin_url.clone();
            async move {
                let mut conn = common::raw_at(&url).await;
                let _: () = redis::cmd("SET")
                    .arg(lock_key("lost"))
                    .arg("someone-else")
                    .arg("PX")
                    .arg(60_000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                std::future::pending::<()>().await;
                Ok::<(), String>(())
            }
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    assert!(
        started.elapsed() < WAKE,
        "noticed within {:?}",
        started.elapsed()
    );
    assert_eq!(q.pending("lost").await.unwrap(), 1);
    // The other token's lock was left alone.
    assert_eq!(
        common::get(&mut admin, &lock_key("lost")).await.as_deref(),
        Some("someone-else")
    );
}

/// Ids never repeat across holds (a sink deduplicating by id would drop the later item): the
/// stream is kept, not deleted, when released empty, and its TTL is removed by the next post so
/// a queued item never expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_grow_across_holds_and_queued_items_never_expire() {
    let srv = server();
    let c = client(&srv).await;
    let mut admin = raw(&srv).await;
    let q = c.queues();
    let mut ids = Vec::new();
    for round in 0..20 {
        let seen: Seen = Arc::default();
        let (s, url) = (seen.clone(), srv.url());
        let out = q
            .run_or_enqueue("ids", format!("{round}"), TTL, move |item| {
                let (s, url) = (s.clone(), url.clone());
                async move {
                    record(&s, &item);
                    let mut conn = common::raw_at(&url).await;
                    // While an item is queued its stream has no TTL.
                    Ok::<i64, String>(common::pttl(&mut conn, &items_key("ids")).await).and_then(
                        |p| {
                            if p == -1 {
                                Ok(())
                            } else {
                                Err(format!("PTTL {p}"))
                            }
                        },
                    )
                }
            })
            .await
            .expect("run_or_enqueue");
        assert!(
            matches!(out, RunOrEnqueue::Ran { handled: 1, .. }),
            "{out:?}"
        );
        ids.push(parse_id(&seen.lock().unwrap()[0].0));
        assert_released_empty(&mut admin, "ids").await;
    }
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids went back: {ids:?}"
    );
}

/// A foreign value of another type where the items stream lives: a typed error, the foreign
/// value untouched, and no lock left behind by the failed post (Lua scripts do not roll back
/// the `SET` that ran before the failing `XADD`).
#[tokio::test]
async fn a_foreign_items_key_is_a_typed_error_and_leaves_no_lock() {
    let srv = server();
    let c = client(&srv).await;
    let mut admin = raw(&srv).await;
    let _: () = redis::cmd("SET")
        .arg(items_key("foreign"))
        .arg("not a stream")
        .query_async(&mut admin)
        .await
        .unwrap();
    let e = c
        .queues()
        .run_or_enqueue("foreign", "x", TTL, |_| async {
            Err::<(), String>("must not run".into())
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WrongType, "{e}");
    assert!(
        !exists(&mut admin, &lock_key("foreign")).await,
        "a lock was left behind"
    );
    assert_eq!(
        common::get(&mut admin, &items_key("foreign"))
            .await
            .as_deref(),
        Some("not a stream")
    );
}

#[tokio::test]
async fn bad_input_is_rejected_before_anything_is_posted() {
    let srv = server();
    let c = client(&srv).await;
    let mut admin = raw(&srv).await;
    let q = c.queues();
    let never = |_: QueueItem| async { Err::<(), String>("must not run".into()) };
    let big = vec![0u8; baton::queue::MAX_ITEM_BYTES + 1];
    let e = q.run_or_enqueue("big", &big, TTL, never).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("item"), "{e}");
    assert!(!exists(&mut admin, &items_key("big")).await);
    for bad in ["", "a{b", "}"] {
        let e = q.run_or_enqueue(bad, "x", TTL, never).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{bad:?}");
    }
    for bad in [Duration::ZERO, Duration::from_secs(86_401)] {
        let e = q.run_or_enqueue("ttl", "x", bad, never).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{bad:?}");
        assert!(e.to_string().contains("`lease`"), "{e}");
        let e = q.drain("ttl", bad, never).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{bad:?}");
    }
    assert!(!exists(&mut admin, &items_key("ttl")).await);
    assert!(q.with_prefix("nocolon").is_err());
    // Exactly 1 MiB is fine.
    let ok = vec![7u8; baton::queue::MAX_ITEM_BYTES];
    let out = q
        .run_or_enqueue("edge", &ok, TTL, |item| async move {
            assert_eq!(item.body.len(), baton::queue::MAX_ITEM_BYTES);
            Ok::<(), String>(())
        })
        .await
        .unwrap();
    assert!(matches!(out, RunOrEnqueue::Ran { handled: 1, .. }));
}

// ---------------------------------------------------------------------------------------------
// The acceptance run: 4 processes × 2 tasks × 125 items into a fenced sink.
// ---------------------------------------------------------------------------------------------

const CHILD_ENV: &str = "BATON_QUEUE_CHILD";
const PROCS: usize = 4;
const TASKS: usize = 2;
const PER_TASK: usize = 125;
const KEY: &str = "acceptance";
/// The sink's keys (one hash slot; not under `baton:`, written by the administrator).
const APPLIED: &str = "sink:{q}:applied";
const DELIVERIES: &str = "sink:{q}:deliveries";
const HIGHEST: &str = "sink:{q}:fence";
const VICTIM: &str = "sink:{q}:victim";
/// Set by the victim when it holds the key (its first handled item).
const HOLDING: &str = "sink:{q}:holding";
/// The bodies whose `run_or_enqueue` returned `Ok` (so they must all be applied).
const POSTED: &str = "sink:{q}:posted";
/// The victim process stops for good (to be SIGKILLed) on its N-th handled item, in the same
/// hold as its first: after its first item it waits until the other processes queued at least
/// [`OTHERS_QUEUED`] items behind it, so it is mid-drain with work left when it stops.
const VICTIM_AT: u64 = 10;
const OTHERS_QUEUED: usize = 20;

/// How many queued items other processes than the victim (process 0) posted.
async fn others_queued(conn: &mut Raw) -> usize {
    let entries: Vec<(String, HashMap<String, Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(items_key(KEY))
        .arg("-")
        .arg("+")
        .query_async(conn)
        .await
        .unwrap();
    entries
        .iter()
        .filter(|(_, f)| f.get("b").is_some_and(|b| !b.starts_with(b"p0-")))
        .count()
}

/// The fenced, deduplicating sink: refuses a token below the highest seen (`-1`), counts the
/// delivery, applies the item once per id (`1` applied, `0` a duplicate).
static SINK: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        r"
local high = redis.call('GET', KEYS[3])
if high and tonumber(ARGV[1]) < tonumber(high) then
  return -1
end
redis.call('SET', KEYS[3], ARGV[1])
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
return redis.call('HSETNX', KEYS[1], ARGV[2], ARGV[3])
",
    )
});

async fn apply(sink: &mut Raw, item: &QueueItem) -> Result<(), String> {
    let r: i64 = SINK
        .key(APPLIED)
        .key(DELIVERIES)
        .key(HIGHEST)
        .arg(item.fencing_token.to_string())
        .arg(&item.id)
        .arg(&item.body[..])
        .invoke_async(sink)
        .await
        .map_err(|e| e.to_string())?;
    if r < 0 {
        return Err(format!("fencing token {} refused", item.fencing_token));
    }
    Ok(())
}

/// One child process of the acceptance tests (run only by them, re-executing this binary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the multi-process acceptance tests"]
async fn queue_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    // proc|user url|admin url|victim(0/1)|ttl ms
    let parts: Vec<&str> = spec.split('|').collect();
    let proc: usize = parts[0].parse().unwrap();
    let c = baton::Client::connect(parts[1]).await.expect("connect");
    let admin_url = parts[2].to_string();
    let victim = parts[3] == "1";
    let ttl = Duration::from_millis(parts[4].parse().unwrap());
    let q = c.queues();
    let handled = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (q, admin_url, handled) = (q.clone(), admin_url.clone(), handled.clone());
        tasks.push(tokio::spawn(async move {
            let sink = common::raw_at(&admin_url).await;
            for n in 0..PER_TASK {
                let body = format!("p{proc}-t{t}-{n}");
                let out = q
                    .run_or_enqueue(KEY, &body, ttl, |item| {
                        let (mut sink, handled) = (sink.clone(), handled.clone());
                        async move {
                            apply(&mut sink, &item).await?;
                            let k = handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                            if victim && k == 1 {
                                let _: () = redis::cmd("SET")
                                    .arg(HOLDING)
                                    .arg(std::process::id())
                                    .query_async(&mut sink)
                                    .await
                                    .unwrap();
                                while others_queued(&mut sink).await < OTHERS_QUEUED {
                                    tokio::time::sleep(Duration::from_millis(10)).await;
                                }
                            }
                            if victim && k == VICTIM_AT {
                                // Applied, not yet removed: stop here until the parent kills us.
                                let _: () = redis::cmd("SET")
                                    .arg(VICTIM)
                                    .arg(format!("{} {}", std::process::id(), item.id))
                                    .query_async(&mut sink)
                                    .await
                                    .unwrap();
                                std::future::pending::<()>().await;
                            }
                            Ok::<(), String>(())
                        }
                    })
                    .await;
                match out {
                    Err(e) => panic!("process {proc} task {t} item {n}: {e}"),
                    Ok(failed @ RunOrEnqueue::HandlerFailed { .. }) => {
                        panic!("process {proc} task {t} item {n}: {failed:?}")
                    }
                    Ok(_) => {}
                }
                let _: () = redis::cmd("SADD")
                    .arg(POSTED)
                    .arg(&body)
                    .query_async(&mut sink.clone())
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

fn spawn_child(
    proc: usize,
    user_url: &str,
    admin_url: &str,
    victim: bool,
    ttl_ms: u64,
) -> tokio::process::Child {
    let exe = std::env::current_exe().expect("this test binary");
    tokio::process::Command::new(exe)
        .args(["queue_child", "--exact", "--include-ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(
            CHILD_ENV,
            format!(
                "{proc}|{user_url}|{admin_url}|{}|{ttl_ms}",
                if victim { "1" } else { "0" }
            ),
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("re-execute the test binary")
}

fn expected_bodies() -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for p in 0..PROCS {
        for t in 0..TASKS {
            for n in 0..PER_TASK {
                all.insert(format!("p{p}-t{t}-{n}"));
            }
        }
    }
    all
}

async fn hgetall(conn: &mut Raw, key: &str) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(key)
        .query_async(conn)
        .await
        .unwrap()
}

/// Runs the four children (`victim` makes process 0 stop mid-drain, then SIGKILLs it), sweeps
/// with `drain` when asked, and returns the sink: applied (id → body) and deliveries (id → n).
async fn acceptance(kill: bool) -> Sink {
    let srv = server();
    let mut admin = raw(&srv).await;
    let user_url = srv.url_for(common::TEST_USER, common::TEST_PASSWORD);
    let admin_url = srv.url();
    let ttl_ms = 1_000;
    let started = Instant::now();
    let mut children = vec![spawn_child(0, &user_url, &admin_url, kill, ttl_ms)];
    if kill {
        // The victim first: it takes the key and waits in its first handler for the others.
        let deadline = Instant::now() + Duration::from_secs(30);
        while common::get(&mut admin, HOLDING).await.is_none() {
            if let Ok(Some(status)) = children[0].try_wait() {
                panic!("the victim exited ({status:?}) before it held the key");
            }
            assert!(Instant::now() < deadline, "the victim never held the key");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    children.extend((1..PROCS).map(|p| spawn_child(p, &user_url, &admin_url, false, ttl_ms)));
    let mut victim_item = None;
    if kill {
        // Wait until the victim stops inside its handler, then SIGKILL it there.
        let deadline = Instant::now() + Duration::from_secs(30);
        let stopped = loop {
            if let Some(v) = common::get(&mut admin, VICTIM).await {
                break v;
            }
            if let Ok(Some(status)) = children[0].try_wait() {
                let mut err = String::new();
                if let Some(mut e) = children[0].stderr.take() {
                    use tokio::io::AsyncReadExt;
                    let _ = e.read_to_string(&mut err).await;
                }
                panic!("the victim exited ({status:?}) before it stopped mid-drain: {err}");
            }
            assert!(
                Instant::now() < deadline,
                "the victim never handled {VICTIM_AT} items as a holder"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let (pid, id) = stopped.split_once(' ').unwrap();
        common::process::send_signal(pid.parse().unwrap(), libc::SIGKILL);
        let out = tokio::time::timeout(
            Duration::from_secs(10),
            children.remove(0).wait_with_output(),
        )
        .await
        .expect("the victim died")
        .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{:?}", out.status);
        victim_item = Some(id.to_string());
    }
    for child in children {
        let out =
            tokio::time::timeout_at(started + Duration::from_secs(45), child.wait_with_output())
                .await
                .expect("a child finished in time")
                .unwrap();
        assert!(
            out.status.success(),
            "child failed: {:?}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let c = client(&srv).await;
    let q = c.queues();
    if kill {
        // Recovery sweep: what the dead holder left (its lease ends within ttl_ms) is drained.
        let sink = raw(&srv).await;
        let deadline = Instant::now() + Duration::from_secs(15);
        while q.pending(KEY).await.unwrap() > 0 {
            assert!(Instant::now() < deadline, "the queue was not drained");
            let _ = drain_until_ran(&q, KEY, TTL, Duration::from_secs(10), |item| {
                let mut sink = sink.clone();
                async move { apply(&mut sink, &item).await }
            })
            .await;
        }
    } else {
        // Every call returned, so every item was handled: nothing queued, nobody holding.
        assert_eq!(q.pending(KEY).await.unwrap(), 0, "items stranded");
        assert!(
            !exists(&mut admin, &lock_key(KEY)).await,
            "the key is still held"
        );
    }
    eprintln!("acceptance (kill: {kill}) took {:?}", started.elapsed());
    let applied = hgetall(&mut admin, APPLIED).await;
    let deliveries = hgetall(&mut admin, DELIVERIES)
        .await
        .into_iter()
        .map(|(k, v)| (k, v.parse().unwrap()))
        .collect();
    let posted: BTreeSet<String> = redis::cmd("SMEMBERS")
        .arg(POSTED)
        .query_async(&mut admin)
        .await
        .unwrap();
    Sink {
        applied,
        deliveries,
        posted,
        victim_item,
    }
}

/// What the sink recorded: applied (id → body), deliveries (id → count), the bodies whose
/// post returned, and the killed holder's in-flight item.
struct Sink {
    applied: HashMap<String, String>,
    deliveries: HashMap<String, u64>,
    posted: BTreeSet<String>,
    victim_item: Option<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_items_from_four_processes_are_each_delivered_exactly_once() {
    let sink = acceptance(false).await;
    let bodies: BTreeSet<String> = sink.applied.values().cloned().collect();
    assert_eq!(sink.posted, expected_bodies(), "every post returned");
    assert_eq!(
        sink.applied.len(),
        PROCS * TASKS * PER_TASK,
        "one applied entry per item"
    );
    assert_eq!(bodies, expected_bodies(), "none lost, none invented");
    let ids: BTreeSet<&String> = sink.applied.keys().collect();
    assert_eq!(ids, sink.deliveries.keys().collect(), "applied = delivered");
    let twice: Vec<_> = sink.deliveries.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "delivered more than once without a crash: {twice:?}"
    );
}

/// The victim (process 0) is SIGKILLed inside its handler, after applying an item and before
/// removing it, with other processes' items queued behind it. Its unposted items never exist;
/// every item whose post returned, the three other processes' 750 among them, is applied once,
/// and the in-flight item is delivered a second time (after the dead holder's lease) and
/// deduplicated by the sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_items_survive_a_holder_killed_mid_drain() {
    let sink = acceptance(true).await;
    let bodies: BTreeSet<String> = sink.applied.values().cloned().collect();
    assert_eq!(
        bodies.len(),
        sink.applied.len(),
        "each body applied under one id"
    );
    let others: BTreeSet<String> = expected_bodies()
        .into_iter()
        .filter(|b| !b.starts_with("p0-"))
        .collect();
    assert!(
        others.is_subset(&sink.posted),
        "the survivors posted everything"
    );
    let lost: Vec<_> = sink.posted.difference(&bodies).collect();
    assert!(lost.is_empty(), "posted but never applied: {lost:?}");
    assert!(bodies.is_subset(&expected_bodies()), "nothing invented");
    let ids: BTreeSet<&String> = sink.applied.keys().collect();
    assert_eq!(ids, sink.deliveries.keys().collect(), "applied = delivered");
    let victim_item = sink.victim_item.expect("the victim's item");
    assert_eq!(
        sink.deliveries.get(&victim_item),
        Some(&2),
        "the killed holder's in-flight item is redelivered once"
    );
    assert!(sink.deliveries.values().all(|n| *n >= 1));
}

/// Queues `n` items on `name` behind a holder that waits for `go`; returns the holder's call
/// (which then drains them with `handler`).
async fn queue_behind_a_holder<H, Fut>(
    q: &Queues,
    name: &str,
    n: usize,
    mut handler: H,
) -> RunOrEnqueue<String>
where
    H: FnMut(QueueItem) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let (q2, name2) = (q.clone(), name.to_string());
    let mut first = Some((held_tx, go_rx));
    let holder = tokio::spawn(async move {
        q2.run_or_enqueue(&name2, "first", TTL, move |item| {
            let wait = first.take();
            let out = handler(item);
            async move {
                if let Some((held, go)) = wait {
                    let _ = held.send(());
                    let _ = go.await;
                }
                out.await
            }
        })
        .await
        .expect("the holder's call")
    });
    held_rx.await.expect("the holder holds");
    for i in 0..n {
        let out = q
            .run_or_enqueue(name, format!("item-{i}"), TTL, |_| async {
                Ok::<(), String>(())
            })
            .await
            .expect("post");
        assert!(matches!(out, RunOrEnqueue::Enqueued { .. }), "{out:?}");
    }
    go_tx.send(()).expect("the holder waits");
    holder.await.expect("the holder's task")
}

/// Handled items are removed a group at a time (one fenced `XDEL` script per 32, not per item),
/// every one of them; a handler failing in the middle of a group leaves exactly it and the items
/// after it queued, the ones before it removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handled_items_are_removed_in_groups_and_a_failure_keeps_only_the_rest() {
    let srv = server();
    let c = client(&srv).await;
    let q = c.queues();
    let mut admin = raw(&srv).await;
    let before = common::command_calls(&mut admin).await;
    let out = queue_behind_a_holder(&q, "groups", 70, |_| async { Ok(()) }).await;
    assert!(
        matches!(out, RunOrEnqueue::Ran { handled: 71, .. }),
        "{out:?}"
    );
    let after = common::command_calls(&mut admin).await;
    let xdel = after.get("xdel").copied().unwrap_or(0) - before.get("xdel").copied().unwrap_or(0);
    // The holder's first read holds its own item (a group of 1); the next read the 70 queued
    // meanwhile: groups of 32, 32 and 6. One at a time this was 71.
    assert_eq!(xdel, 4, "one XDEL per group of handled items");
    assert_released_empty(&mut raw(&srv).await, "groups").await;

    // The 41st item fails: the 40 before it (the holder's own among them) are removed, it and
    // the 30 after it stay.
    let out = queue_behind_a_holder(&q, "fails", 70, |item| async move {
        if item.body == b"item-39" {
            Err("sink down".to_string())
        } else {
            Ok(())
        }
    })
    .await;
    let RunOrEnqueue::HandlerFailed { handled, .. } = &out else {
        panic!("expected a handler failure, got {out:?}");
    };
    assert_eq!(*handled, 40, "{out:?}");
    assert_eq!(q.pending("fails").await.unwrap(), 31);
}
