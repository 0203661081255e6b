//! The semaphore workload: `MUTEX_TASKS` tasks in each of the `WORKERS` processes (12 in all)
//! share one semaphore of `PERMITS` (3) permits, each looping acquire (with the watchdog; one
//! task per process waits in the FIFO line, `fair(true)`) →
//! BEGIN/COMMIT to the fenced resource under the key `s-0:<slot>` with the permit's fencing
//! token → release. Tokens are ordered per slot, so each slot is a resource key of its own: a
//! holder paused past its lease whose slot was granted again commits late and must be refused.
//!
//! Its checks, beside the mutex workload's (C1/C1s per slot key, M2 unique tokens per slot,
//! M3 across a volatile restart, C5, M7, C8):
//! - S1: never more than `PERMITS` holders at the resource at once. A holder counts from its
//!   accepted BEGIN to its accepted COMMIT; one whose COMMIT never came stops counting once a
//!   higher token was accepted on its slot (the resource refuses it from then on).
//! - S2: every grant's slot is below `PERMITS`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton::prelude::*;
use baton::Client;
use serde_json::{json, Value};

use crate::checker::{s, u, who, Inv};
use crate::util::{mix, mono_ns, BoxError, Rng};
use crate::worker::{
    join_tasks, op_type, resource_write, Ctx, FAIR_WAITER_TIMEOUT, LEASE, MUTEX_TASKS, MUTEX_WAIT,
    STOP_FILE,
};

/// The semaphore's name and its number of permits.
pub const SEMAPHORE: &str = "s-0";
pub const PERMITS: u32 = 3;

/// The resource key of one slot: `s-0:1`.
pub fn slot_key(slot: u32) -> String {
    format!("{SEMAPHORE}:{slot}")
}

pub async fn run(ctx: Arc<Ctx>, client: Client) -> Result<(), BoxError> {
    let counter = Arc::new(AtomicU64::new(0));
    let plain = baton::AcquireOptions::builder()
        .wait(MUTEX_WAIT)
        .watchdog(true)
        .build()?;
    // Task 0 of every process waits in the semaphore's FIFO line (4 of the 12 tasks). Its
    // waiter timeout is the lease, as the fair lock workload's: a waiter paused or killed at the
    // head holds the line up by at most that.
    let fair = baton::AcquireOptions::builder()
        .wait(MUTEX_WAIT)
        .watchdog(true)
        .fair(true)
        .waiter_timeout(FAIR_WAITER_TIMEOUT)
        .build()?;
    let (plain, fair) = (Arc::new(plain), Arc::new(fair));
    let mut tasks = Vec::new();
    for task in 0..MUTEX_TASKS {
        let opts = if task == 0 {
            fair.clone()
        } else {
            plain.clone()
        };
        let (ctx, client, counter) = (ctx.clone(), client.clone(), counter.clone());
        tasks.push(tokio::spawn(async move {
            permit_task(&ctx, &client, &counter, &opts, task).await
        }));
    }
    join_tasks(&ctx, tasks, "semaphore").await
}

async fn permit_task(
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
        0x53,
    ]));
    let sems = client.semaphores();
    let stop = ctx.args.run_dir.join(STOP_FILE);
    tokio::time::sleep(Duration::from_millis(rng.range(0.0, 100.0) as u64)).await;
    while mono_ns() < ctx.args.deadline && !stop.exists() {
        let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
        let hold_ms = rng.range(20.0, 150.0) as u64;
        // As for the mutex: three in four holders commit from a spawned task, which the loss
        // signal does not reach, so a holder paused past its lease commits late and only the
        // slot's fencing token keeps the resource safe.
        let detached = rng.unit() < 0.75;
        ctx.write(json!({"type":"invoke","f":"lock","lock":SEMAPHORE,"n":n,"fair":opts.fair()}));
        let guard = match sems.acquire(SEMAPHORE, PERMITS, LEASE, opts).await {
            Ok(g) => g,
            Err(e) => {
                ctx.write(
                    json!({"type":op_type(&e),"api_err":true,"f":"lock","lock":SEMAPHORE,
                    "n":n,"kind":e.kind(),"err":e.to_string()}),
                );
                tokio::time::sleep(Duration::from_millis(rng.range(20.0, 100.0) as u64)).await;
                continue;
            }
        };
        let (slot, fence) = (guard.slot(), guard.fencing_token());
        let key = slot_key(slot);
        ctx.write(
            json!({"type":"info","f":"grant","lock":key,"sem":SEMAPHORE,"slot":slot,"n":n,
            "token":fence,"detached":detached}),
        );
        let outcome = 'work: {
            let begin = resource_write(ctx, &key, fence, &format!("BEGIN-{n}")).await;
            if begin.as_deref() != Some("OK") {
                break 'work "fail-resource";
            }
            let commit = {
                let (ctx, key) = (ctx.clone(), key.clone());
                async move {
                    tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                    resource_write(&ctx, &key, fence, &format!("COMMIT-{n}")).await
                }
            };
            let committed = if detached {
                tokio::spawn(commit).await.ok().flatten()
            } else {
                tokio::select! {
                    _ = guard.lost() => None,
                    c = commit => c,
                }
            };
            if committed.as_deref() != Some("OK") {
                break 'work "fail-resource";
            }
            "done"
        };
        if let Some(reason) = guard.loss_reason() {
            ctx.write(
                json!({"type":"info","api_err":true,"f":"lock","lock":key,"n":n,
                "kind":"LeaseLost","token":fence,"err":reason}),
            );
        }
        match guard.release().await {
            Ok(ours) => ctx.write(json!({"type":"ok","f":"lock","lock":key,"n":n,
                "outcome":outcome,"released":ours})),
            Err(e) => ctx.write(
                json!({"type":op_type(&e),"api_err":true,"f":"release","lock":key,"n":n,
                "kind":e.kind(),"err":e.to_string()}),
            ),
        }
        tokio::time::sleep(Duration::from_millis(rng.range(20.0, 100.0) as u64)).await;
    }
    ctx.write(json!({"type":"end","task":task}));
    Ok(())
}

/// S1 and S2 over the resource's decision log and the workers' grants.
pub fn check(res: &[Value], grants: &[&Value]) -> Vec<Inv> {
    let mut s1 = Inv::new(
        "S1",
        "at most 3 holders of the semaphore at the fenced resource",
    );
    // Each holder's span at the resource, by log index: from its accepted BEGIN to its accepted
    // COMMIT, or (no COMMIT accepted) to the first higher token accepted on its slot, after which
    // a fenced resource refuses it.
    let sem_key = |v: &Value| s(v, "key").starts_with(&format!("{SEMAPHORE}:"));
    let acc: Vec<(usize, &Value)> = res
        .iter()
        .enumerate()
        .filter(|(_, v)| v["accepted"] == true && sem_key(v))
        .collect();
    let mut spans: Vec<(usize, usize, String)> = Vec::new();
    for (j, (b, v)) in acc.iter().enumerate() {
        let op = s(v, "op");
        let Some(n) = op.strip_prefix("BEGIN-") else {
            continue;
        };
        let (key, holder, token) = (s(v, "key"), s(v, "holder"), u(v, "token"));
        let later = &acc[j + 1..];
        let commit = format!("COMMIT-{n}");
        let end = later
            .iter()
            .find(|(_, w)| {
                s(w, "holder") == holder && u(w, "token") == token && s(w, "op") == commit
            })
            .or_else(|| {
                later
                    .iter()
                    .find(|(_, w)| s(w, "key") == key && u(w, "token") > token)
            })
            .map_or(res.len(), |(i, _)| *i);
        spans.push((*b, end, format!("{key} {holder} token {token}")));
    }
    let mut peak = 0usize;
    for (b, _, what) in &spans {
        let at: Vec<&str> = spans
            .iter()
            .filter(|(b2, e2, _)| b2 <= b && e2 > b)
            .map(|(_, _, w)| w.as_str())
            .collect();
        peak = peak.max(at.len());
        if at.len() > PERMITS as usize {
            s1.flag(format!(
                "{} holders at once as {what} began: {at:?}",
                at.len()
            ));
        }
    }
    s1.note = format!("at most {peak} holder(s) at once");

    let mut s2 = Inv::new("S2", "every grant's slot below the limit (3)");
    for g in grants {
        if g["slot"]
            .as_u64()
            .is_some_and(|slot| slot >= u64::from(PERMITS))
        {
            s2.flag(format!(
                "{} was granted slot {} (token {})",
                who(g),
                u(g, "slot"),
                u(g, "token")
            ));
        }
    }
    let mut per_slot: BTreeMap<u64, u64> = BTreeMap::new();
    for g in grants {
        *per_slot.entry(u(g, "slot")).or_default() += 1;
    }
    s2.note = format!("grants per slot {per_slot:?}");
    vec![s1, s2]
}
