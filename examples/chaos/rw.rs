//! The read-write lock workload: `MUTEX_TASKS` tasks in each of the `WORKERS` processes, each
//! looping on a seeded one of `RW_LOCKS` locks (with the watchdog) in a seeded role:
//! - a reader (45 %): `read`, then a read at the resource (`RB-n` … `RE-n`) with the read token
//!   (the last write's token);
//! - a writer (35 %): `write`, then `BEGIN-n` … `COMMIT-n` with the write token;
//! - an upgradeable reader (20 %): `upgradeable_read`, a read, `upgrade` (a new write token),
//!   `BEGIN-n` … `COMMIT-n`, `downgrade` (the write token stays its read token), a read again.
//!
//! Three in four holders end their hold (`COMMIT`, `RE`) from a spawned task the loss signal
//! does not reach, so a holder paused past its lease acts late, and only the tokens keep the
//! resource safe: the resource (resource.rs) refuses an op whose token is below the highest it
//! accepted, and a write whose token a reader already read with.
//!
//! Its checks replace the mutex's C1 (readers share tokens) and keep M2 for write grants only:
//! - C1: no writer beside another holder at the resource (readers share): every accepted op is
//!   fresh by the fenced rule, and no op is accepted while another holder's write is open, nor a
//!   BEGIN while another holder's read is open. A hold is open from its accepted begin to its
//!   accepted end, or until an op the fenced rule makes it stale by was accepted.
//! - R2: a read sees at least the version of its read token once that write committed: a read
//!   with token t must not see a version below t when a COMMIT with a token ≥ t was accepted
//!   before it.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton::prelude::*;
use baton::Client;
use serde_json::{json, Value};

use crate::checker::{s, u, Inv};
use crate::resource::is_read;
use crate::util::{mix, mono_ns, BoxError, Rng};
use crate::worker::{
    join_tasks, op_type, resource_write, Ctx, LEASE, MUTEX_TASKS, MUTEX_WAIT, STOP_FILE,
};

/// How many read-write locks the tasks share.
pub const RW_LOCKS: usize = 2;

/// `rw-1`.
pub fn rw_lock_name(i: usize) -> String {
    format!("rw-{i}")
}

pub async fn run(ctx: Arc<Ctx>, client: Client) -> Result<(), BoxError> {
    let counter = Arc::new(AtomicU64::new(0));
    let opts = Arc::new(
        baton::AcquireOptions::builder()
            .wait(MUTEX_WAIT)
            .watchdog(true)
            .build()?,
    );
    let mut tasks = Vec::new();
    for task in 0..MUTEX_TASKS {
        let (ctx, client, counter, opts) =
            (ctx.clone(), client.clone(), counter.clone(), opts.clone());
        tasks.push(tokio::spawn(async move {
            rw_task(&ctx, &client, &counter, &opts, task).await
        }));
    }
    join_tasks(&ctx, tasks, "rw").await
}

/// One hold's work at the resource: `first` now, `last` after `hold_ms`, in a spawned task
/// when `detached`, else cancelled by the loss signal. `true` when both were accepted.
async fn span<G: HeldLease>(
    ctx: &Arc<Ctx>,
    guard: &G,
    key: &str,
    token: u64,
    (first, last): (String, String),
    hold_ms: u64,
    detached: bool,
) -> bool {
    if resource_write(ctx, key, token, &first).await.as_deref() != Some("OK") {
        return false;
    }
    let end = {
        let (ctx, key) = (ctx.clone(), key.to_string());
        async move {
            tokio::time::sleep(Duration::from_millis(hold_ms)).await;
            resource_write(&ctx, &key, token, &last).await
        }
    };
    let ended = if detached {
        tokio::spawn(end).await.ok().flatten()
    } else {
        tokio::select! {
            _ = guard.lost() => None,
            e = end => e,
        }
    };
    ended.as_deref() == Some("OK")
}

fn log_err(ctx: &Ctx, f: &str, name: &str, n: u64, e: &baton::Error) {
    ctx.write(
        json!({"type":op_type(e),"api_err":true,"f":f,"lock":name,"n":n,
        "kind":e.kind(),"err":e.to_string()}),
    );
}

fn log_grant(ctx: &Ctx, name: &str, n: u64, mode: &str, token: u64, detached: bool) {
    ctx.write(
        json!({"type":"info","f":"grant","lock":name,"n":n,"mode":mode,"token":token,
        "detached":detached}),
    );
}

fn log_loss<G: HeldLease>(ctx: &Ctx, guard: &G, name: &str, n: u64, token: u64) {
    if let Some(reason) = guard.loss_reason() {
        ctx.write(
            json!({"type":"info","api_err":true,"f":"lock","lock":name,"n":n,
            "kind":"LeaseLost","token":token,"err":reason}),
        );
    }
}

fn log_release(ctx: &Ctx, name: &str, n: u64, done: bool, r: Result<bool, baton::Error>) {
    let outcome = if done { "done" } else { "fail-resource" };
    match r {
        Ok(ours) => ctx.write(json!({"type":"ok","f":"lock","lock":name,"n":n,
            "outcome":outcome,"released":ours})),
        Err(e) => log_err(ctx, "release", name, n, &e),
    }
}

async fn rw_task(
    ctx: &Arc<Ctx>,
    client: &Client,
    counter: &AtomicU64,
    opts: &baton::AcquireOptions,
    task: usize,
) -> Result<(), BoxError> {
    let mut rng = Rng::new(mix(&[
        ctx.args.seed,
        ctx.args.id as u64,
        ctx.args.inc as u64,
        task as u64,
        0x52,
    ]));
    let locks = client.rw_locks();
    let upgrade_opts = baton::AcquireOptions::builder().wait(MUTEX_WAIT).build()?;
    let stop = ctx.args.run_dir.join(STOP_FILE);
    tokio::time::sleep(Duration::from_millis(rng.range(0.0, 100.0) as u64)).await;
    while mono_ns() < ctx.args.deadline && !stop.exists() {
        let name = rw_lock_name(rng.below(RW_LOCKS));
        let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
        let hold_ms = rng.range(20.0, 150.0) as u64;
        let detached = rng.unit() < 0.75;
        let role = rng.unit();
        let mode = if role < 0.45 {
            "read"
        } else if role < 0.8 {
            "write"
        } else {
            "upgradeable"
        };
        ctx.write(json!({"type":"invoke","f":"lock","lock":name,"n":n,"mode":mode}));
        match mode {
            "read" => match locks.read(&name, LEASE, opts).await {
                Ok(g) => {
                    let t = g.fencing_token();
                    log_grant(ctx, &name, n, mode, t, detached);
                    let ops = (format!("RB-{n}"), format!("RE-{n}"));
                    let done = span(ctx, &g, &name, t, ops, hold_ms, detached).await;
                    log_loss(ctx, &g, &name, n, t);
                    log_release(ctx, &name, n, done, g.release().await);
                }
                Err(e) => log_err(ctx, "lock", &name, n, &e),
            },
            "write" => match locks.write(&name, LEASE, opts).await {
                Ok(g) => {
                    let t = g.fencing_token();
                    log_grant(ctx, &name, n, mode, t, detached);
                    let ops = (format!("BEGIN-{n}"), format!("COMMIT-{n}"));
                    let done = span(ctx, &g, &name, t, ops, hold_ms, detached).await;
                    log_loss(ctx, &g, &name, n, t);
                    log_release(ctx, &name, n, done, g.release().await);
                }
                Err(e) => log_err(ctx, "lock", &name, n, &e),
            },
            _ => match locks.upgradeable_read(&name, LEASE, opts).await {
                Ok(mut g) => {
                    let t = g.fencing_token();
                    log_grant(ctx, &name, n, mode, t, false);
                    let ops = (format!("RB-{n}"), format!("RE-{n}"));
                    let mut done = span(ctx, &g, &name, t, ops, hold_ms / 3, false).await;
                    if done {
                        match g.upgrade(&upgrade_opts).await {
                            Ok(()) => {
                                let t = g.fencing_token();
                                log_grant(ctx, &name, n, "upgrade", t, detached);
                                let ops = (format!("BEGIN-{n}"), format!("COMMIT-{n}"));
                                done = span(ctx, &g, &name, t, ops, hold_ms, detached).await;
                                if done {
                                    match g.downgrade().await {
                                        Ok(true) => {
                                            log_grant(ctx, &name, n, "downgrade", t, false);
                                            let ops = (format!("RB-{n}d"), format!("RE-{n}d"));
                                            done = span(ctx, &g, &name, t, ops, hold_ms / 3, false)
                                                .await;
                                        }
                                        Ok(false) => done = false,
                                        Err(e) => {
                                            done = false;
                                            log_err(ctx, "downgrade", &name, n, &e);
                                        }
                                    }
                                }
                            }
                            Err(e) => {
                                done = false;
                                log_err(ctx, "upgrade", &name, n, &e);
                            }
                        }
                    }
                    log_loss(ctx, &g, &name, n, g.fencing_token());
                    log_release(ctx, &name, n, done, g.release().await);
                }
                Err(e) => log_err(ctx, "lock", &name, n, &e),
            },
        }
        tokio::time::sleep(Duration::from_millis(rng.range(20.0, 100.0) as u64)).await;
    }
    ctx.write(json!({"type":"end","task":task}));
    Ok(())
}

/// One hold at the resource: who (`w1.0#12`: the process and its acquisition's number, with
/// `d` for the read after a downgrade), its token, write or read.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Hold {
    id: String,
    token: u64,
    write: bool,
}

/// C1 (no writer beside another holder), C1s (stale ops refused; fails on none when
/// `require_stale`) and R2 (reads see their token's committed write), from the resource's
/// decision log; also the rejected and accepted stale counts.
pub fn check_resource(res: &[Value], require_stale: bool) -> (Inv, Inv, Inv, u64, u64) {
    let mut c1 = Inv::new(
        "C1",
        "no writer beside another holder at the fenced resource (readers share)",
    );
    let mut r2 = Inv::new(
        "R2",
        "reads see at least their read token's committed write",
    );
    let (mut stale_rejected, mut stale_accepted, mut reads) = (0u64, 0u64, 0u64);
    let mut by_key: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for v in res {
        if v["accepted"] == true {
            if v["stale"] == true {
                stale_accepted += 1;
            }
            by_key.entry(s(v, "key")).or_default().push(v);
        } else {
            stale_rejected += 1;
        }
    }
    for (key, ops) in &by_key {
        let (mut highest, mut read_top, mut committed) = (0u64, 0u64, 0u64);
        let mut open: HashSet<Hold> = HashSet::new();
        for v in ops {
            let (holder, token, op) = (s(v, "holder"), u(v, "token"), s(v, "op"));
            let read = is_read(&op);
            // The fenced rule (resource.rs): the op is stale when a higher token was accepted,
            // or it writes with a token a reader already read with.
            if token < highest || (!read && token > 0 && token == read_top) {
                c1.flag(format!(
                    "{key}: {holder} {op} token {token} accepted after token {highest} \
                     (read at {read_top})"
                ));
            }
            let n = op.split_once('-').map_or("", |x| x.1);
            let me = Hold {
                id: format!("{holder}#{n}"),
                token,
                write: !read,
            };
            // Holds this op makes stale end here: a fenced resource refuses them from now on.
            open.retain(|h| {
                !(h.token < token || (read && h.write && h.token == token && h.id != me.id))
            });
            let others: Vec<&Hold> = open
                .iter()
                .filter(|h| h.id != me.id && (h.write || !read))
                .collect();
            if !others.is_empty() {
                let mut names: Vec<String> = others
                    .iter()
                    .map(|h| {
                        format!(
                            "{} {} token {}",
                            h.id,
                            if h.write { "write" } else { "read" },
                            h.token
                        )
                    })
                    .collect();
                names.sort();
                c1.flag(format!(
                    "{key}: {holder} {op} (token {token}) accepted beside {names:?}"
                ));
            }
            if op.starts_with("BEGIN-") || op.starts_with("RB-") {
                open.insert(me);
            } else {
                open.remove(&me);
            }
            if op.starts_with("RB-") {
                reads += 1;
                let seen = u(v, "version");
                if seen < token && committed >= token {
                    r2.flag(format!(
                        "{key}: {holder} {op} with read token {token} saw version {seen} \
                         after a COMMIT with token {committed}"
                    ));
                }
            }
            if op.starts_with("COMMIT-") {
                committed = committed.max(token);
            }
            highest = highest.max(token);
            if read {
                read_top = read_top.max(token);
            }
        }
    }
    r2.note = format!("{reads} reads checked");
    let mut c1s = Inv::new(
        "C1s",
        "stale ops rejected (> 0 expected under holder pauses)",
    );
    c1s.note = format!("{stale_rejected} rejected, {stale_accepted} accepted");
    if stale_rejected == 0 && require_stale {
        c1s.pass = false;
        c1s.note
            .push_str(": the faults produced no stale op this run");
    }
    (c1, c1s, r2, stale_rejected, stale_accepted)
}
