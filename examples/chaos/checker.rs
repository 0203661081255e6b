//! The checker: pure passes over one phase's JSONL logs and final Redis state.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{json, Value};

use crate::control::PhaseResult;
use crate::fleet::ExitRec;
use crate::util::read_jsonl;
use crate::worker::{Workload, LEASE, MAX_ATTEMPTS};

#[derive(Debug, Clone, Serialize)]
pub struct Inv {
    pub id: &'static str,
    pub name: &'static str,
    pub violations: u64,
    pub pass: bool,
    pub note: String,
    pub examples: Vec<String>,
}

impl Inv {
    pub(crate) fn new(id: &'static str, name: &'static str) -> Inv {
        Inv {
            id,
            name,
            violations: 0,
            pass: true,
            note: String::new(),
            examples: Vec::new(),
        }
    }

    pub(crate) fn flag(&mut self, msg: String) {
        self.violations += 1;
        self.pass = false;
        if self.examples.len() < 8 {
            self.examples.push(msg);
        }
    }
}

pub struct Analysis {
    pub invs: Vec<Inv>,
    pub stats: Value,
    pub state_lost_events: u64,
}

impl Analysis {
    pub fn get(&self, id: &str) -> Option<&Inv> {
        self.invs.iter().find(|i| i.id == id)
    }
}

pub(crate) fn s(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_string()
}

pub(crate) fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_default()
}

pub(crate) fn who(v: &Value) -> String {
    format!("{}.{}", s(v, "p"), u(v, "inc"))
}

fn pct(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied()
}

/// One phase's logs: the files of its directory, the workers' lines (ordered by time), the
/// resource's and the nemesis's.
struct Logs {
    files: Vec<PathBuf>,
    wl: Vec<Value>,
    res: Vec<Value>,
    nem: Vec<Value>,
}

fn load(dir: &Path) -> Logs {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    let mut wl: Vec<Value> = Vec::new();
    for f in &files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("worker-") && name.ends_with(".jsonl") {
            wl.extend(read_jsonl(f));
        }
    }
    wl.sort_by_key(|v| u(v, "t"));
    let res = read_jsonl(&dir.join("resource.jsonl"));
    let nem = read_jsonl(&dir.join("nemesis.jsonl"));
    Logs {
        files,
        wl,
        res,
        nem,
    }
}

/// C1 (mutual exclusion at the resource, from its decision log) and C1s (stale writes rejected;
/// fails on none when `require_stale`). Also returns the rejected and accepted stale counts.
fn check_c1(res: &[Value], require_stale: bool) -> (Inv, Inv, u64, u64) {
    let mut c1 = Inv::new("C1", "mutual exclusion at the fenced resource");
    let mut stale_rejected = 0u64;
    let mut stale_accepted = 0u64;
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
    for (key, ws) in &by_key {
        let mut max: Option<(u64, String)> = None;
        for w in ws {
            let (tok, h) = (u(w, "token"), s(w, "holder"));
            if let Some((m, mh)) = &max {
                if tok < *m || (tok == *m && h != *mh) {
                    c1.flag(format!(
                        "{key}: {} {} token {tok} accepted after token {m} of {mh}",
                        h,
                        s(w, "op")
                    ));
                }
            }
            if !matches!(&max, Some((m, _)) if tok <= *m) {
                max = Some((tok, h));
            }
        }
        // BEGIN/COMMIT pairs of one attempt never interleave with another attempt's writes.
        for (i, b) in ws.iter().enumerate() {
            let op = s(b, "op");
            let Some(att) = op.strip_prefix("BEGIN-") else {
                continue;
            };
            let (h, tok) = (s(b, "holder"), u(b, "token"));
            let commit = format!("COMMIT-{att}");
            let Some(j) = ws[i + 1..]
                .iter()
                .position(|w| s(w, "holder") == h && s(w, "op") == commit && u(w, "token") == tok)
            else {
                continue;
            };
            for w in &ws[i + 1..i + 1 + j] {
                if s(w, "holder") != h || u(w, "token") != tok {
                    c1.flag(format!("{key}: {} {} (token {}) interleaved inside {h}'s attempt {att} (token {tok})",
                    s(w, "holder"), s(w, "op"), u(w, "token")));
                }
            }
        }
    }
    let mut c1s = Inv::new("C1s", "stale writes rejected (> 0 expected under F1/F5/F9)");
    c1s.note = format!("{stale_rejected} rejected, {stale_accepted} accepted");
    if stale_rejected == 0 && require_stale {
        c1s.pass = false;
        c1s.note
            .push_str(": the faults produced no stale write this run");
    }
    (c1, c1s, stale_rejected, stale_accepted)
}

/// C5: no panic in any stderr; every exit 0 unless the harness SIGKILLed it. Also the panics.
fn check_c5(exits: &[ExitRec], files: &[PathBuf]) -> (Inv, u64) {
    let mut c5 = Inv::new("C5", "no panic, workers exit 0 unless SIGKILLed");
    for e in exits {
        let ok = e.code == Some(0) || (e.killed && e.signal == Some(libc::SIGKILL));
        if !ok {
            c5.flag(format!(
                "w{}.{} exited code {:?} signal {:?}",
                e.worker, e.inc, e.code, e.signal
            ));
        }
    }
    let mut panics = 0u64;
    for f in files {
        if f.extension().is_some_and(|x| x == "stderr") {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            let n = text.matches("panicked at").count() as u64;
            if n > 0 {
                panics += n;
                c5.flag(format!("{}: {n} panic(s)", f.display()));
            }
        }
    }
    (c5, panics)
}

/// One fault from the nemesis log, start to stop.
struct Window {
    kind: String,
    start: u64,
    stop: u64,
    targets: Vec<String>,
    secs: f64,
}

/// The fault windows, the faults by kind, and their total.
fn fault_windows(nem: &[Value]) -> (Vec<Window>, BTreeMap<String, u64>, u64) {
    let mut starts: HashMap<u64, &Value> = HashMap::new();
    let mut windows = Vec::new();
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for v in nem {
        match v["type"].as_str() {
            Some("start") => {
                starts.insert(u(v, "id"), v);
                *faults.entry(s(v, "kind")).or_default() += 1;
            }
            Some("stop") => {
                if let Some(st) = starts.get(&u(v, "id")) {
                    let d = &st["detail"];
                    let secs = d["secs"]
                        .as_f64()
                        .or(d["down_secs"].as_f64())
                        .unwrap_or(0.0);
                    windows.push(Window {
                        kind: s(st, "kind"),
                        start: u(st, "t"),
                        stop: u(v, "t"),
                        targets: st["targets"]
                            .as_array()
                            .map(|a| {
                                a.iter()
                                    .filter_map(|x| x.as_str().map(String::from))
                                    .collect()
                            })
                            .unwrap_or_default(),
                        secs,
                    });
                }
            }
            _ => {}
        }
    }
    let total_faults: u64 = faults.values().sum();
    (windows, faults, total_faults)
}

/// C8: the canary password in no log.
fn check_c8(files: &[PathBuf], canary: &str) -> Inv {
    let mut c8 = Inv::new("C8", "no secret in logs");
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|x| x == "jsonl" || x == "stderr"))
    {
        let bytes = std::fs::read(f).unwrap_or_default();
        let n = String::from_utf8_lossy(&bytes).matches(canary).count();
        if n > 0 {
            c8.flag(format!("{}: {n} canary match(es)", f.display()));
        }
    }
    c8
}

pub fn check(r: &PhaseResult, canary: &str) -> Analysis {
    match r.cfg.workload {
        Workload::Failover => check_failover(r, canary),
        // Leader election logs the same shape: a grant per term (token = the term), BEGIN/COMMIT
        // pairs at the resource fenced by it; M2 is then "no two leaders share a term".
        // The fair lock too (a grant per acquisition, token = its fencing token); its M7 also
        // wants every lock granted after the heal (a lapsed reservation or a dead waiter must
        // not block one).
        // The semaphore: the same per slot (its grants' `lock` is the slot's key, `s-0:1`),
        // plus S1/S2 (semaphore.rs). The read-write lock: its own C1 and R2 (rw.rs), M2 and
        // M3 over write grants (a read's token is the last write's, shared).
        Workload::Mutex
        | Workload::Leader
        | Workload::Fair
        | Workload::Semaphore
        | Workload::Rw => check_mutex(r, canary),
    }
}

fn check_failover(r: &PhaseResult, canary: &str) -> Analysis {
    let Logs {
        files,
        wl,
        res,
        nem,
    } = load(&r.dir);
    let events = |name: &'static str| wl.iter().filter(move |v| v["ev"] == name);

    // ---- C1: mutual exclusion at the resource; C1s stale writes.
    let (c1, c1s, stale_rejected, stale_accepted) = check_c1(&res, r.cfg.fenced);

    // ---- C3: attempts bound.
    let mut c3 = Inv::new("C3", "attempts bound and unique grants");
    // Grants are ordered by their fencing token, which Redis floors by its own clock at the
    // grant: that is the order in which Redis granted them. The order in which workers *report*
    // them can differ: a worker paused between its EXEC and its `Acquired` event reports an old
    // grant late (its writes are then rejected as stale, which C1 checks). Such late reports are
    // counted as a diagnostic, not flagged.
    let mut grants: BTreeMap<String, Vec<(u64, u64, String, u64)>> = BTreeMap::new();
    for v in events("Acquired") {
        grants.entry(s(v, "job")).or_default().push((
            u(v, "fencing_token"),
            u(v, "attempt"),
            who(v),
            u(v, "t"),
        ));
    }
    let mut max_attempt_seen = 0;
    let mut late_reports = 0u64;
    for (job, gs) in grants.iter_mut() {
        let mut by_att: HashMap<u64, Vec<&String>> = HashMap::new();
        let mut highest_reported = 0;
        for (_, a, _, _) in gs.iter() {
            if *a < highest_reported {
                late_reports += 1;
            }
            highest_reported = highest_reported.max(*a);
        }
        gs.sort();
        let mut last = 0;
        for (token, a, w, _) in gs.iter() {
            max_attempt_seen = max_attempt_seen.max(*a);
            if *a > MAX_ATTEMPTS || *a == 0 {
                c3.flag(format!(
                    "{job}: attempt {a} granted to {w} (max {MAX_ATTEMPTS})"
                ));
            }
            if *a <= last {
                c3.flag(format!(
                    "{job}: attempt {a} granted to {w} (token {token}) after attempt {last}"
                ));
            }
            last = last.max(*a);
            by_att.entry(*a).or_default().push(w);
        }
        for (a, ws) in by_att {
            if ws.len() > 1 {
                c3.flag(format!(
                    "{job}: attempt {a} granted {} times: {ws:?}",
                    ws.len()
                ));
            }
        }
    }
    for (job, st) in &r.final_state {
        if let Some(n) = st.as_deref().and_then(|x| x.parse::<u64>().ok()) {
            if n > MAX_ATTEMPTS {
                c3.flag(format!("{job}: final counter {n} > {MAX_ATTEMPTS}"));
            }
        }
    }

    // ---- C4: no lost job, no resurrection.
    let mut c4 = Inv::new("C4", "no lost job, no Acquired after DONE");
    let (mut done, mut exhausted, mut lost) = (0u64, 0u64, 0u64);
    if let Some(e) = &r.final_state_err {
        c4.flag(format!("final state unreadable: {e}"));
    }
    for (job, st) in &r.final_state {
        match st.as_deref() {
            Some("DONE") => done += 1,
            Some("EXHAUSTED") => exhausted += 1,
            other => {
                lost += 1;
                c4.flag(format!("{job}: final state {other:?} after quiescence"));
            }
        }
    }
    // A resurrection is a grant Redis made after the job was DONE: a token above the token of
    // the attempt that recorded DONE. An older grant reported late by a paused worker is not one.
    let token_of: HashMap<(String, u64), u64> = events("Acquired")
        .map(|v| ((s(v, "job"), u(v, "attempt")), u(v, "fencing_token")))
        .collect();
    let mut done_by: HashMap<String, (u64, String, u64)> = HashMap::new();
    for v in wl.iter().filter(|v| v["type"] == "ok" && v["f"] == "done") {
        let key = (s(v, "job"), u(v, "attempt"));
        if let Some(token) = token_of.get(&key) {
            done_by.entry(key.0).or_insert((*token, who(v), u(v, "t")));
        }
    }
    let (mut resurrected, mut late_after_done) = (0u64, 0u64);
    for v in events("Acquired") {
        if let Some((done_token, w, done_t)) = done_by.get(&s(v, "job")) {
            let token = u(v, "fencing_token");
            if token > *done_token {
                resurrected += 1;
                c4.flag(format!(
                    "{}: {} was granted attempt {} (token {token}) after {w} recorded DONE (token {done_token})",
                    s(v, "job"),
                    who(v),
                    u(v, "attempt")
                ));
            } else if u(v, "t") > *done_t {
                late_after_done += 1;
            }
        }
    }
    let completed_jobs: HashSet<String> = events("Completed").map(|v| s(v, "job")).collect();
    for v in events("Exhausted") {
        if completed_jobs.contains(&s(v, "job")) {
            c4.flag(format!(
                "{}: both Completed and Exhausted reported",
                s(v, "job")
            ));
        }
    }

    // ---- C1d: overlapping lease *beliefs* (diagnostic). A worker believes it holds an attempt
    // from its `Acquired` until it ends the attempt (done/fail returned), hears `LeaseLost`, ends
    // the job, or its process stops (its last log line). Overlaps between different holders of
    // one job show that pauses and partitions really made two workers believe at once; fencing
    // is what keeps the resource safe then (C1).
    let mut last_line: HashMap<String, u64> = HashMap::new();
    for v in &wl {
        last_line.insert(who(v), u(v, "t"));
    }
    let mut beliefs: BTreeMap<String, Vec<(u64, u64, String)>> = BTreeMap::new();
    for (i, v) in wl.iter().enumerate() {
        if v["ev"] != "Acquired" {
            continue;
        }
        let (job, holder, attempt) = (s(v, "job"), who(v), u(v, "attempt"));
        let end = wl[i + 1..]
            .iter()
            .find(|x| {
                who(x) == holder
                    && s(x, "job") == job
                    && (x["ev"] == "LeaseLost"
                        || x["type"] == "end"
                        || (x["api_err"] == true || x["type"] == "ok")
                            && u(x, "attempt") == attempt
                            && matches!(x["f"].as_str(), Some(f) if f == "done" || f.starts_with("fail")))
            })
            .map(|x| u(x, "t"))
            .unwrap_or_else(|| last_line.get(&holder).copied().unwrap_or(u(v, "t")));
        beliefs
            .entry(job)
            .or_default()
            .push((u(v, "t"), end, holder));
    }
    let mut overlaps = 0u64;
    let mut overlap_ms = 0u64;
    for bs in beliefs.values() {
        for (i, a) in bs.iter().enumerate() {
            for b in &bs[i + 1..] {
                if a.2 != b.2 && a.0 < b.1 && b.0 < a.1 {
                    overlaps += 1;
                    overlap_ms += (a.1.min(b.1) - a.0.max(b.0)) / 1_000_000;
                }
            }
        }
    }

    // ---- C5: no panic.
    let (c5, panics) = check_c5(&r.exits, &files);

    // ---- Fault windows (from the nemesis log).
    let (windows, faults, total_faults) = fault_windows(&nem);
    // Incarnations the nemesis SIGKILLed ("w1.2"), with the kill time.
    let killed_incs: Vec<(String, u64)> = nem
        .iter()
        .filter(|v| v["type"] == "start" && v["kind"] == "kill_worker")
        .map(|v| {
            let tgt = v["targets"][0].as_str().unwrap_or_default();
            (format!("{tgt}.{}", u(&v["detail"], "inc")), u(v, "t"))
        })
        .collect();

    // ---- C6: errors surfaced.
    let mut c6 = Inv::new(
        "C6",
        "errors surfaced as events where a fault hit a holder's links",
    );
    let is_err = |v: &Value| v["ev"] == "Error" || v["api_err"] == true;
    let (mut meaningful, mut surfaced_m, mut any_windows, mut surfaced_any) =
        (0u64, 0u64, 0u64, 0u64);
    for w in &windows {
        let hits_links = matches!(
            w.kind.as_str(),
            "pause_redis"
                | "crash_restart_redis"
                | "partition_worker"
                | "latency"
                | "reset"
                | "client_kill"
                | "client_pause"
                | "slice"
                | "pause_pg"
                | "crash_restart_pg"
                | "pg_backend_kill"
        );
        if !hits_links {
            continue;
        }
        let grace = 2_000_000_000;
        for tgt in &w.targets {
            // A worker the nemesis itself froze (SIGSTOP) for all but < 1 s of this window could
            // not have seen the fault; its window says nothing about error reporting.
            let frozen: u64 = windows
                .iter()
                .filter(|p| p.kind == "pause_worker" && p.targets.iter().any(|x| x == tgt))
                .map(|p| p.stop.min(w.stop).saturating_sub(p.start.max(w.start)))
                .sum();
            if frozen > 0 && (w.stop - w.start).saturating_sub(frozen) < 1_000_000_000 {
                continue;
            }
            let mine = || wl.iter().filter(|v| s(v, "p") == *tgt);
            let saw_err =
                mine().any(|v| is_err(v) && u(v, "t") >= w.start && u(v, "t") <= w.stop + grace);
            // Did the worker hold an attempt when the fault began?
            let mut open: HashSet<(String, u64)> = HashSet::new();
            for v in mine().take_while(|v| u(v, "t") < w.start) {
                let key = (who(v), 0);
                let job = s(v, "job");
                if v["ev"] == "Acquired" {
                    open.insert((format!("{}|{job}", key.0), u(v, "attempt")));
                } else if (v["type"] == "ok" || v["api_err"] == true)
                    && matches!(v["f"].as_str(), Some(f) if f.starts_with("done") || f.starts_with("fail"))
                    || v["type"] == "end"
                {
                    open.retain(|(k, _)| k != &format!("{}|{job}", key.0));
                }
            }
            // A holder whose incarnation was SIGKILLed by the nemesis does not count.
            open.retain(|(k, _)| {
                let inc = k.split('|').next().unwrap_or_default().to_string();
                !killed_incs
                    .iter()
                    .any(|(ki, kt)| *ki == inc && *kt <= w.stop + grace)
            });
            let holding = !open.is_empty();
            any_windows += 1;
            if saw_err {
                surfaced_any += 1;
            }
            let strong = matches!(
                w.kind.as_str(),
                "pause_redis"
                    | "crash_restart_redis"
                    | "partition_worker"
                    | "pause_pg"
                    | "crash_restart_pg"
            ) && w.secs >= 1.0;
            if strong && holding {
                meaningful += 1;
                if saw_err {
                    surfaced_m += 1;
                } else {
                    c6.flag(format!(
                        "{} ({:.1}s) hit {tgt} while it held {:?}, no Error event",
                        w.kind,
                        w.secs,
                        open.iter().next()
                    ));
                }
            }
        }
    }
    c6.note = format!("meaningful windows {surfaced_m}/{meaningful} surfaced; all link-fault windows {surfaced_any}/{any_windows}");

    // ---- C7: liveness after heal.
    let mut c7 = Inv::new("C7", "liveness after heal");
    // The cluster profile adds its failover time (liveness_extra_ms): the replica of a killed
    // primary serves only once promoted.
    let bound_ns = (LEASE.as_millis() as u64 + 5_000 + 2_000 + r.cfg.liveness_extra_ms) * 1_000_000;
    let progress: Vec<u64> = wl
        .iter()
        .filter(|v| v["ev"] == "Acquired" || v["ev"] == "Completed")
        .map(|v| u(v, "t"))
        .collect();
    let mut timeline: Vec<(u64, i64)> = Vec::new();
    for w in &windows {
        timeline.push((w.start, 1));
        timeline.push((w.stop, -1));
    }
    timeline.sort();
    let mut heals = Vec::new();
    let mut active = 0i64;
    for (t, d) in &timeline {
        active += d;
        if active == 0 && *d < 0 {
            heals.push(*t);
        }
    }
    heals.push(r.heal_t);
    let mut rec = Vec::new();
    for h in &heals {
        let Some(next) = progress.iter().find(|t| **t >= *h) else {
            continue;
        };
        let d = next - h;
        // A fault that starts before the next progress restarts the clock: such a sample
        // measures the next fault, not the recovery from this one.
        let interfered = timeline
            .iter()
            .any(|(t, dd)| *dd > 0 && *t > *h && *t < *next);
        if interfered {
            continue;
        }
        rec.push(d / 1_000_000);
        if d > bound_ns {
            c7.flag(format!(
                "{} ms from a heal to the next Acquired/Completed",
                d / 1_000_000
            ));
        }
    }
    rec.sort();
    for w in &r.stuck {
        c7.flag(format!("w{w} still running at the quiescence bound"));
    }
    c7.note = format!(
        "p50 {:?} ms, p99 {:?} ms over {} heals (bound {} ms)",
        pct(&rec, 0.5),
        pct(&rec, 0.99),
        rec.len(),
        bound_ns / 1_000_000
    );

    // ---- C8: secrets.
    let c8 = check_c8(&files, canary);

    // ---- Stats.
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for v in events("Error") {
        *by_kind.entry(s(v, "kind")).or_default() += 1;
    }
    let state_lost_events = by_kind.get("StateLost").copied().unwrap_or(0);
    let count = |f: &dyn Fn(&Value) -> bool| wl.iter().filter(|v| f(v)).count() as u64;
    let mut faults_json = json!(faults);
    faults_json["total"] = json!(total_faults);
    let stats = json!({
        "duration_s": (r.end_t - r.start_t) as f64 / 1e9,
        "ops": {
            "acquire_ok": count(&|v| v["ev"] == "Acquired"),
            "locked_events": count(&|v| v["ev"] == "Locked"),
            "resource_writes": res.len(),
            "resource_accepted": res.iter().filter(|v| v["accepted"] == true).count(),
            "done_ok": count(&|v| v["type"] == "ok" && v["f"] == "done"),
            "fail_ok": count(&|v| v["type"] == "ok" && matches!(v["f"].as_str(), Some(f) if f.starts_with("fail"))),
            "api_err": count(&|v| v["api_err"] == true),
            "api_indeterminate": count(&|v| v["api_err"] == true && v["type"] == "info"),
            "error_events": count(&|v| v["ev"] == "Error"),
            "lease_lost_events": count(&|v| v["ev"] == "LeaseLost"),
            "resource_indeterminate": count(&|v| v["type"] == "info" && v["f"] == "write"),
            "worker_incarnations": r.exits.len(),
        },
        "errors_by_kind": by_kind,
        "faults": faults_json,
        "jobs": {"submitted": r.cfg.jobs, "done": done, "exhausted": exhausted, "lost": lost,
                 "resurrected": resurrected, "max_attempts_seen": max_attempt_seen,
                 "late_grant_reports": late_reports, "late_reports_after_done": late_after_done},
        "fencing": {"stale_rejected": stale_rejected, "stale_accepted": stale_accepted},
        "belief_overlaps": {"pairs": overlaps, "total_ms": overlap_ms},
        "liveness": {"recovery_ms_p50": pct(&rec, 0.5), "recovery_ms_p99": pct(&rec, 0.99),
                     "samples": rec.len(), "bound_ms": bound_ns / 1_000_000},
        "errors_surfaced": {"meaningful": meaningful, "meaningful_surfaced": surfaced_m,
                            "all_windows": any_windows, "all_surfaced": surfaced_any},
        // The fair lock's priority reservations: taken, granted through, refused (another
        // contender's reservation existed), lapsed before the grant (the reserver was paused
        // or cut off past the lifetime).
        "reservations": {
            "taken": count(&|v| v["type"] == "ok" && v["f"] == "reserve"),
            "granted": count(&|v| v["f"] == "grant" && v["reserved"] == true),
            "refused": count(&|v| v["f"] == "reserve" && v["kind"] == "Reserved"),
            "lapsed": count(&|v| v["f"] == "lock" && v["kind"] == "Reserved"),
        },
        "panics": panics,
        "stuck_workers": r.stuck,
        "volatile_restart_at_ns": r.volatile_t,
        "exits": r.exits,
    });
    Analysis {
        invs: vec![c1, c1s, c3, c4, c5, c6, c7, c8],
        stats,
        state_lost_events,
    }
}

/// The mutex workload's checks: C1/C1s at the resource (key = lock name, BEGIN-n/COMMIT-n pairs
/// per holder and token), M2 unique fencing tokens per lock, M3 tokens above every earlier one
/// across a volatile restart, C5, M7 liveness after the final heal, C8. The failover-only checks
/// (C3, C4, C6) do not apply.
fn check_mutex(r: &PhaseResult, canary: &str) -> Analysis {
    let Logs {
        files,
        wl,
        res,
        nem,
    } = load(&r.dir);
    let grants: Vec<&Value> = wl.iter().filter(|v| v["f"] == "grant").collect();
    // Grants with a token of their own: all but the read-write lock's reads (theirs is the last
    // write's, shared by every reader since).
    let write_grants: Vec<&Value> = grants
        .iter()
        .copied()
        .filter(|g| matches!(g["mode"].as_str(), None | Some("write") | Some("upgrade")))
        .collect();

    // ---- C1, C1s: stale writes are expected wherever holders are paused past their lease.
    let pauses_holders = r
        .cfg
        .lanes
        .iter()
        .any(|l| l.contains(&crate::nemesis::Kind::PauseWorker));
    let require_stale = r.cfg.fenced && pauses_holders;
    let mut extra = Vec::new();
    let (c1, c1s, stale_rejected, stale_accepted) = if r.cfg.workload == Workload::Rw {
        let (c1, c1s, r2, rejected, accepted) = crate::rw::check_resource(&res, require_stale);
        extra.push(r2);
        (c1, c1s, rejected, accepted)
    } else {
        check_c1(&res, require_stale)
    };
    if r.cfg.workload == Workload::Semaphore {
        extra.extend(crate::semaphore::check(&res, &grants));
    }

    // ---- M2: no two grants of one lock share a fencing token.
    let mut m2 = Inv::new(
        "M2",
        "fencing tokens unique per lock name across all grants",
    );
    let mut by_token: BTreeMap<(String, u64), Vec<String>> = BTreeMap::new();
    for g in &write_grants {
        by_token
            .entry((s(g, "lock"), u(g, "token")))
            .or_default()
            .push(format!("{}#{}", who(g), u(g, "n")));
    }
    for ((lock, token), hs) in &by_token {
        if hs.len() > 1 {
            m2.flag(format!(
                "{lock}: token {token} granted {} times: {hs:?}",
                hs.len()
            ));
        }
    }
    m2.note = format!(
        "{} grants, {} distinct (lock, token)",
        write_grants.len(),
        by_token.len()
    );

    // ---- M3: after a restart that lost all data, every grant's token is above every token
    // granted before it (on the same lock).
    let mut m3 = Inv::new(
        "M3",
        "fencing tokens above all earlier ones across a volatile restart",
    );
    if let Some(vt) = r.volatile_t {
        let mut before: HashMap<String, u64> = HashMap::new();
        let mut after = 0u64;
        for g in &write_grants {
            let (lock, token) = (s(g, "lock"), u(g, "token"));
            if u(g, "t") < vt {
                let m = before.entry(lock).or_default();
                *m = (*m).max(token);
            } else {
                after += 1;
                if let Some(m) = before.get(&lock).filter(|m| token <= **m) {
                    m3.flag(format!(
                        "{lock}: {} granted token {token} after the restart, not above {m}",
                        who(g)
                    ));
                }
            }
        }
        m3.note = format!("{after} grants after the restart checked");
        if after == 0 {
            m3.flag("no grant after the volatile restart".into());
        }
    } else {
        m3.note = "no volatile restart in this phase".into();
    }

    // ---- C5, fault windows, C8.
    let (c5, panics) = check_c5(&r.exits, &files);
    let (_, faults, total_faults) = fault_windows(&nem);
    let c8 = check_c8(&files, canary);

    // ---- M7: liveness after the final heal: some grant within the lease + 5 s.
    let mut m7 = Inv::new("M7", "liveness: a grant soon after the final heal");
    let bound_ns = (LEASE.as_millis() as u64 + 5_000) * 1_000_000;
    let first = grants.iter().map(|g| u(g, "t")).find(|t| *t >= r.heal_t);
    let recovery_ms = first.map(|t| (t - r.heal_t) / 1_000_000);
    match first {
        Some(t) if t - r.heal_t <= bound_ns => {}
        Some(t) => m7.flag(format!(
            "first grant {} ms after the heal",
            (t - r.heal_t) / 1_000_000
        )),
        None => m7.flag("no grant after the heal".into()),
    }
    for w in &r.stuck {
        m7.flag(format!("w{w} still running at the quiescence bound"));
    }
    m7.note = format!(
        "first grant {recovery_ms:?} ms after the heal (bound {} ms)",
        bound_ns / 1_000_000
    );
    if r.cfg.workload == Workload::Fair {
        // Per lock: a reservation whose owner was paused or killed lapses after its lifetime,
        // a dead waiter is evicted after its timeout, a dead holder's lease runs out; all
        // shorter than the bound, so every lock must be granted again within it.
        let mut per_lock = Vec::new();
        for i in 0..crate::worker::MUTEX_LOCKS {
            let lock = crate::worker::fair_lock_name(i);
            let first = grants
                .iter()
                .filter(|g| s(g, "lock") == lock)
                .map(|g| u(g, "t"))
                .find(|t| *t >= r.heal_t);
            match first {
                Some(t) if t - r.heal_t <= bound_ns => {}
                Some(t) => m7.flag(format!(
                    "{lock}: first grant {} ms after the heal",
                    (t - r.heal_t) / 1_000_000
                )),
                None => m7.flag(format!("{lock}: no grant after the heal")),
            }
            per_lock.push(format!(
                "{lock} {:?}",
                first.map(|t| (t - r.heal_t) / 1_000_000)
            ));
        }
        m7.note = format!("{}; per lock (ms): {}", m7.note, per_lock.join(", "));
    }

    // ---- Stats.
    let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
    for v in wl.iter().filter(|v| v["api_err"] == true) {
        *by_kind.entry(s(v, "kind")).or_default() += 1;
    }
    let count = |f: &dyn Fn(&Value) -> bool| wl.iter().filter(|v| f(v)).count() as u64;
    let mut faults_json = json!(faults);
    faults_json["total"] = json!(total_faults);
    let stats = json!({
        "duration_s": (r.end_t - r.start_t) as f64 / 1e9,
        "ops": {
            "lock_invoked": count(&|v| v["type"] == "invoke" && v["f"] == "lock"),
            "grants": grants.len(),
            "done": count(&|v| v["type"] == "ok" && v["f"] == "lock" && v["outcome"] == "done"),
            "fail_resource": count(&|v| v["type"] == "ok" && v["f"] == "lock" && v["outcome"] == "fail-resource"),
            "api_err": count(&|v| v["api_err"] == true),
            "api_indeterminate": count(&|v| v["api_err"] == true && v["type"] == "info"),
            "resource_writes": res.len(),
            "resource_accepted": res.iter().filter(|v| v["accepted"] == true).count(),
            "resource_indeterminate": count(&|v| v["type"] == "info" && v["f"] == "write"),
            "worker_incarnations": r.exits.len(),
        },
        "errors_by_kind": by_kind,
        "faults": faults_json,
        "fencing": {"stale_rejected": stale_rejected, "stale_accepted": stale_accepted},
        "liveness": {"recovery_ms": recovery_ms, "bound_ms": bound_ns / 1_000_000},
        // The fair lock's priority reservations: taken, granted through, refused (another
        // contender's reservation existed), lapsed before the grant (the reserver was paused
        // or cut off past the lifetime).
        "reservations": {
            "taken": count(&|v| v["type"] == "ok" && v["f"] == "reserve"),
            "granted": count(&|v| v["f"] == "grant" && v["reserved"] == true),
            "refused": count(&|v| v["f"] == "reserve" && v["kind"] == "Reserved"),
            "lapsed": count(&|v| v["f"] == "lock" && v["kind"] == "Reserved"),
        },
        "panics": panics,
        "stuck_workers": r.stuck,
        "volatile_restart_at_ns": r.volatile_t,
        "exits": r.exits,
    });
    let mut invs = vec![c1, c1s, m2];
    invs.extend(extra);
    if r.volatile_t.is_some() {
        invs.push(m3);
    }
    invs.extend([c5, m7, c8]);
    Analysis {
        invs,
        stats,
        state_lost_events: 0,
    }
}
