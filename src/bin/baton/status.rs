//! `baton status` and `baton watch`: list everything under the prefix, read what a name is
//! (a job, a lock, an election, …), once or as it changes, as text or JSON. Read-only, unlike
//! the tools of admin.rs and unlock.rs. A schedule's occurrences fold into one row showing its
//! worst open occurrence ([`ScheduleFold`], shared with the dashboard); each `watch` line
//! starts with when it was seen (UTC, RFC 3339 to the millisecond; `"at"` in JSON).

use baton::inspect::{Entry, EntryState, Holder, Kind, Occurrence, ScheduleFold, ScheduleRow};
use baton::{Client, FailoverConfig, JobState, JobStatus};

use super::exit::{fail_with, EX_DATAERR, EX_EXHAUSTED, EX_UNAVAILABLE};
use super::out;
use super::supervisor::wall_time;
use super::text::{self, human_ms};

pub(crate) fn status_json(s: &JobStatus) -> serde_json::Value {
    let (state, attempt, holder, lease) = state_parts(&s.state);
    serde_json::json!({
        "key": s.key,
        "state": state,
        "attempt": attempt,
        "holder": holder,
        "lease_remaining_ms": lease,
        "state_ttl_ms": s.state_ttl_ms,
        "fencing_token": s.fencing_token,
        "last_failure": s.last_failure,
    })
}

pub(crate) fn state_parts(
    state: &JobState,
) -> (&'static str, Option<u64>, Option<String>, Option<u64>) {
    match state {
        JobState::Absent => ("absent", None, None, None),
        JobState::Attempt {
            number,
            holder: Some(h),
            lease_remaining_ms,
        } => (
            "running",
            Some(*number),
            Some(h.clone()),
            *lease_remaining_ms,
        ),
        JobState::Attempt { number, .. } => ("waiting", Some(*number), None, None),
        JobState::Done => ("done", None, None, None),
        JobState::Exhausted => ("exhausted", None, None, None),
        _ => ("corrupt", None, None, None),
    }
}

pub(crate) fn status_text(s: &JobStatus) -> String {
    let state = match &s.state {
        JobState::Attempt {
            number,
            holder: Some(h),
            lease_remaining_ms,
        } => format!(
            "attempt {number} running (holder {h}, lease {} left)",
            lease_remaining_ms.map_or("without TTL".into(), human_ms)
        ),
        JobState::Attempt { number, .. } => {
            format!("attempt {number} ended without success; waiting for a backup to take over")
        }
        other => other.to_string(),
    };
    let mut out = format!("job:          {}\nstate:        {state}\n", s.key);
    if let Some(ttl) = s.state_ttl_ms {
        out += &format!("retained:     {} more\n", human_ms(ttl));
    }
    if let Some(f) = s.fencing_token {
        out += &format!("fencing:      {f}\n");
    }
    if let Some(r) = &s.last_failure {
        out += &format!("last failure: {r}\n");
    }
    out
}

pub(crate) async fn status(client: &Client, job: FailoverConfig, prefix: &str, json: bool) -> u8 {
    let inspect = match client.inspect().with_prefix(prefix) {
        Ok(i) => i,
        Err(e) => return super::exit::usage_config(&e),
    };
    let found = match inspect.find(job.key()).await {
        Ok(found) => found,
        Err(e) => return fail_with(&e),
    };
    let (jobs, others): (Vec<Entry>, Vec<Entry>) =
        found.into_iter().partition(|e| e.kind == Kind::Job);
    let job_entry = jobs.into_iter().next();
    // A job, or nothing at all: the job's view, as it always was (`absent` included).
    let job_exists = match client.failover().job_status(job.clone()).await {
        Ok(s) => s.state != JobState::Absent,
        Err(e) => return fail_with(&e),
    };
    // A schedule under this key: one block per digest, from its record.
    let records = match client.failover().schedule_records(job.clone()).await {
        Ok(r) => r,
        Err(e) => return fail_with(&e),
    };
    let mut code = 0;
    if job_exists || (others.is_empty() && records.is_empty()) {
        code = job_status(client, job.clone(), job_entry.as_ref(), prefix, json).await;
    }
    if !records.is_empty() {
        let failover = client.failover();
        let now = match failover.server_time(job.key()).await {
            Ok(t) => t,
            Err(e) => return fail_with(&e),
        };
        for record in &records {
            let history = match failover
                .schedule_history(job.clone(), &record.digest, record.spec.history as usize)
                .await
            {
                Ok(h) => h,
                Err(e) => return fail_with(&e),
            };
            let view = ScheduleView::of(record, &history, now);
            if json {
                outln!("{}", view.json());
            } else {
                out!("{}", view.text());
            }
        }
    }
    for entry in &others {
        if json {
            outln!("{}", entry_json(entry));
        } else {
            out!("{}", entry_text(entry));
        }
        if entry.state == EntryState::Corrupt {
            code = EX_DATAERR;
        }
    }
    code
}

/// A job's status, with its waiting backups as the listing read them (`entry`).
async fn job_status(
    client: &Client,
    job: FailoverConfig,
    entry: Option<&Entry>,
    prefix: &str,
    json: bool,
) -> u8 {
    match client.failover().job_status(job).await {
        Ok(s) => {
            // Counted only for an open job (`null` in JSON otherwise, and where unknown).
            let open = matches!(s.state, JobState::Attempt { .. });
            let standbys = entry.filter(|e| open && e.can_have_standbys());
            if json {
                let mut v = status_json(&s);
                v["standbys"] = serde_json::json!(standbys.and_then(|e| e.standbys));
                outln!("{v}");
            } else {
                out!("{}", status_text(&s));
                if let Some(e) = standbys {
                    let n = e.standbys.map_or("unknown".into(), |n| n.to_string());
                    outln!("backups:      {n} waiting");
                }
            }
            if let JobState::Corrupt { value } = &s.state {
                say!(
                    "baton: key `{prefix}{{{}}}` holds {value}, which baton never writes",
                    s.key
                );
                return EX_DATAERR;
            }
            0
        }
        Err(e) => fail_with(&e),
    }
}

/// A lock-shaped entry as `status --key` prints it, one field a line like a job's.
fn entry_text(e: &Entry) -> String {
    let label = format!("{}:", e.kind);
    let mut out = format!("{label:<14}{}\n", e.name);
    let who = if e.kind == Kind::Leader {
        "leader"
    } else {
        "holder"
    };
    let state = match (&e.holder, e.remaining_ms) {
        (Some(h), left) => format!(
            "{} ({who} {h}, {} left)",
            e.state,
            left.map_or("without TTL".into(), human_ms)
        ),
        _ => e.state.to_string(),
    };
    out += &format!("state:        {state}\n");
    if let Some(f) = e.fencing_token {
        let label = if e.kind == Kind::Leader {
            "term:"
        } else {
            "fencing:"
        };
        out += &format!("{label:<14}{f}\n");
    }
    if let Some(w) = e.waiting {
        out += &format!("waiting:      {w}\n");
    }
    if e.can_have_standbys() {
        let n = e.standbys.map_or("unknown".into(), |n| n.to_string());
        out += &format!("standbys:     {n}\n");
    }
    if let Some(l) = e.limit {
        out += &format!("limit:        {l}\n");
    }
    if e.kind == Kind::RwLock {
        if let Some(mode) = e.holders_summary() {
            out += &format!("mode:         {mode}\n");
        }
    }
    if let Some(w) = e.writer_waiting {
        out += &format!("writer waits: {}\n", if w { "yes" } else { "no" });
    }
    for h in &e.holders {
        out += &format!("holder:       {}\n", holder_line(h));
    }
    if let Some(d) = &e.detail {
        out += &format!("detail:       {d}\n");
    }
    out
}

/// One holder of a semaphore or read-write lock, as a line says it:
/// `slot 0 token 1750000000000000 by 3f2a9c01 (12s left)`, `read token 17… by 3f2a9c01 (…)`.
pub(crate) fn holder_line(h: &Holder) -> String {
    let mut line = holder_id(h);
    line += &format!(
        " ({} left)",
        h.remaining_ms.map_or("no TTL".into(), human_ms)
    );
    line
}

/// A holder without its time left (what the dashboard's note shows: it changes only when the
/// holders do): `slot 0 token 1750000000000000 by 3f2a9c01`.
pub(crate) fn holder_id(h: &Holder) -> String {
    let mut line = String::new();
    if let Some(slot) = h.slot {
        line += &format!("slot {slot} ");
    }
    if let Some(mode) = h.mode {
        line += &format!("{mode} ");
    }
    if let Some(f) = h.fencing_token {
        line += &format!("token {f} ");
    }
    line += &format!("by {}", h.holder);
    line
}

pub(crate) fn entry_json(e: &Entry) -> serde_json::Value {
    serde_json::to_value(e).unwrap_or_default()
}

/// What `baton status` prints of one entry in a listing: kind, name, state, holder, time
/// left, fencing token.
fn row(
    kind: &str,
    name: &str,
    state: &str,
    holder: Option<&str>,
    left: Option<u64>,
    fence: Option<u64>,
    note: &str,
) -> String {
    let mut line = format!(
        "{kind:<8} {name:<40} {state:<10} {:<20} {:>9} {:>18}",
        holder.unwrap_or("-"),
        left.map_or("-".into(), human_ms),
        fence.map_or("-".into(), |f| f.to_string()),
    );
    if !note.is_empty() {
        line.push_str("  ");
        line.push_str(note);
    }
    line
}

/// The note of a schedule's row: how many occurrences, the one shown when it is not the
/// latest (a worse one is open), and the last outcomes, newest first:
/// `5 occurrences; worst open: 2026-01-01T00:00:00Z waiting; last: 2026-01-05T00:00:00Z done, …`.
pub(crate) fn schedule_note(s: &ScheduleRow) -> String {
    let outcomes: Vec<String> = s
        .last
        .iter()
        .map(|o| format!("{} {}", o.tick, o.entry.state))
        .collect();
    let plural = if s.occurrences == 1 { "" } else { "s" };
    let mut note = format!("{} occurrence{plural}; ", s.occurrences);
    if s.shows_an_older_occurrence() {
        note += &format!("worst open: {} {}; ", s.shown.tick, s.shown.entry.state);
    }
    note += &format!("last: {}", outcomes.join(", "));
    let standbys = entry_standbys(&s.shown.entry);
    if !standbys.is_empty() {
        note += "; ";
        note += &standbys;
    }
    note
}

/// What `status --json` prints of a schedule's row: the state of the occurrence it shows
/// (`shown`: the worst open one, or the latest when all are done), and the last ones.
pub(crate) fn schedule_json(s: &ScheduleRow) -> serde_json::Value {
    let occurrence =
        |o: &Occurrence| serde_json::json!({ "tick": o.tick, "entry": entry_json(&o.entry) });
    let last: Vec<serde_json::Value> = s.last.iter().map(occurrence).collect();
    serde_json::json!({
        "kind": "schedule",
        "name": s.key,
        "digest": s.digest,
        "state": s.shown.entry.state,
        "occurrences": s.occurrences,
        "shown": occurrence(&s.shown),
        "last": last,
    })
}

pub(crate) async fn list(
    client: &Client,
    prefix: &str,
    kind: Option<Kind>,
    all: bool,
    json: bool,
) -> u8 {
    let inspect = match client.inspect().with_prefix(prefix) {
        Ok(i) => i,
        Err(e) => return super::exit::usage_config(&e),
    };
    let mut listing = inspect.list(kind);
    let mut schedules = ScheduleFold::new();
    if !json {
        outln!(
            "{:<8} {:<40} {:<10} {:<20} {:>9} {:>18}",
            "KIND",
            "NAME",
            "STATE",
            "HOLDER",
            "LEFT",
            "FENCE"
        );
    }
    loop {
        let batch = match listing.next_batch().await {
            Ok(Some(b)) => b,
            Ok(None) => break,
            Err(e) => return fail_with(&e),
        };
        for entry in batch {
            let entry = if all {
                Some(entry)
            } else {
                schedules.fold(entry)
            };
            if let Some(entry) = entry {
                print_entry(&entry, json);
            }
        }
    }
    // Each schedule's record, read once per key: its expression, next tick, last success,
    // pause and hosts join the row of the digest they describe. The schedules whose
    // occurrences have all expired (every host gone longer than their retention) have only
    // their record left: listed from it, so a dead schedule never drops out of the listing.
    if !matches!(kind, None | Some(Kind::Job)) {
        return 0;
    }
    let failover = client.failover();
    let rows: Vec<ScheduleRow> = schedules.rows().collect();
    let listed = match inspect.schedules().await {
        Ok(keys) => keys,
        Err(e) => return fail_with(&e),
    };
    // The server's clock, read once and only when there is a schedule to show.
    let first = rows
        .first()
        .map(|s| s.key.as_str())
        .or(listed.first().map(String::as_str));
    let now = match first {
        None => return 0,
        Some(key) => match failover.server_time(key).await {
            Ok(t) => t,
            Err(e) => return fail_with(&e),
        },
    };
    let mut records: std::collections::BTreeMap<String, Vec<baton::ScheduleRecord>> =
        std::collections::BTreeMap::new();
    let mut keys: Vec<String> = rows.iter().map(|s| s.key.clone()).collect();
    keys.extend(listed);
    keys.sort();
    keys.dedup();
    for key in keys {
        let read = match FailoverConfig::builder(key.clone()).prefix(prefix).build() {
            Ok(config) => failover.schedule_records(config).await,
            // A key the coordinator would refuse has no record either.
            Err(_) => Ok(Vec::new()),
        };
        match read {
            Ok(r) => records.insert(key, r),
            Err(e) => return fail_with(&e),
        };
    }
    let mut shown = std::collections::BTreeSet::new();
    for s in rows {
        let record = records
            .get(&s.key)
            .and_then(|r| r.iter().find(|r| r.digest == s.digest));
        shown.insert((s.key.clone(), s.digest.clone()));
        let view = record.map(|r| ScheduleView::of(r, &[], now));
        print_schedule(&s, view.as_ref(), json);
    }
    for record in records.values().flatten() {
        if !shown.contains(&(record.key.clone(), record.digest.clone())) {
            print_recorded(&ScheduleView::of(record, &[], now), json);
        }
    }
    0
}

/// The state a schedule's row shows when only its record is left (no occurrence in the
/// store: every one has expired, or none ran yet since a pause).
pub(crate) const RECORDED: &str = "recorded";

/// The row of a schedule that has only its record in the store: its state is
/// [`RECORDED`], its note the record's summary.
fn print_recorded(view: &ScheduleView<'_>, json: bool) {
    let r = view.record;
    if json {
        let mut v = serde_json::json!({
            "kind": "schedule",
            "name": r.key,
            "digest": r.digest,
            "state": RECORDED,
            "occurrences": 0,
        });
        v["record"] = view.json();
        outln!("{v}");
        return;
    }
    outln!(
        "{}",
        row(
            "schedule",
            &format!("{}@{}", r.key, r.digest),
            RECORDED,
            None,
            None,
            None,
            &format!("{}; no occurrence in the store", view.note())
        )
    );
}

/// The note of an entry's row: its attempt (with the last failure, if any), its waiters or its
/// detail, and its standbys (see [`entry_standbys`]).
pub(crate) fn entry_note(e: &Entry) -> String {
    let mut note = match (e.attempt, e.waiting, &e.detail) {
        (Some(a), _, Some(d)) => format!("attempt {a}; last failure: {d}"),
        (Some(a), _, _) => format!("attempt {a}"),
        (_, Some(w), _) => format!("{w} waiting"),
        (_, _, Some(d)) => d.clone(),
        _ if e.writer_waiting == Some(true) => "a writer waits".to_string(),
        _ => String::new(),
    };
    let standbys = entry_standbys(e);
    if !standbys.is_empty() {
        if !note.is_empty() {
            note += "; ";
        }
        note += &standbys;
    }
    note
}

/// An open job's waiting backups or an election's standbys, as a note says them: `1 backup
/// waiting`, `2 standbys`, or `backups waiting: unknown` where they cannot be counted
/// (PostgreSQL); empty for an entry that has none.
pub(crate) fn entry_standbys(e: &Entry) -> String {
    if !e.can_have_standbys() {
        return String::new();
    }
    let (one, many) = if e.kind == Kind::Leader {
        ("standby", "standbys")
    } else {
        ("backup waiting", "backups waiting")
    };
    match e.standbys {
        Some(1) => format!("1 {one}"),
        Some(n) => format!("{n} {many}"),
        None => format!("{many}: unknown"),
    }
}

fn print_entry(e: &Entry, json: bool) {
    if json {
        outln!("{}", entry_json(e));
        return;
    }
    // A semaphore's or read-write lock's holder column sums its holders up (`2/3`,
    // `read ×2`); each holder follows on an indented line of its own.
    let summary = e.holders_summary();
    outln!(
        "{}",
        row(
            e.kind.as_str(),
            &e.name,
            e.state.as_str(),
            summary.as_deref().or(e.holder.as_deref()),
            if summary.is_some() {
                None
            } else {
                e.remaining_ms
            },
            e.fencing_token,
            &entry_note(e)
        )
    );
    for h in &e.holders {
        outln!("         {}", holder_line(h));
    }
}

/// A schedule's row: the state, holder, time left and fence of the occurrence it shows (its
/// worst open one), with a note of its last outcomes.
fn print_schedule(s: &ScheduleRow, view: Option<&ScheduleView<'_>>, json: bool) {
    if json {
        let mut v = schedule_json(s);
        if let Some(view) = view {
            v["record"] = view.json();
        }
        outln!("{v}");
        return;
    }
    let mut note = schedule_note(s);
    if let Some(view) = view {
        note = format!("{}; {note}", view.note());
    }
    let shown = &s.shown.entry;
    outln!(
        "{}",
        row(
            "schedule",
            &format!("{}@{}", s.key, s.digest),
            shown.state.as_str(),
            shown.holder.as_deref(),
            shown.remaining_ms,
            shown.fencing_token,
            &note
        )
    );
}

pub(crate) async fn watch(
    client: &Client,
    job: FailoverConfig,
    kind: Option<Kind>,
    json: bool,
) -> u8 {
    let kind = match kind {
        Some(k) => k,
        // What exists under the name: a lock-shaped entry when no job does.
        None => match client.inspect().with_prefix(job.prefix()) {
            Ok(i) => match i.find(job.key()).await {
                Ok(found) if !found.iter().any(|e| e.kind == Kind::Job) => {
                    found.first().map_or(Kind::Job, |e| e.kind)
                }
                Ok(_) => Kind::Job,
                Err(e) => return fail_with(&e),
            },
            Err(e) => return super::exit::usage_config(&e),
        },
    };
    if kind != Kind::Job {
        return watch_entry(client, &job, kind, json).await;
    }
    let mut changes = match client.failover().watch_job(job.clone()).await {
        Ok(w) => w,
        Err(e) => return fail_with(&e),
    };
    // Subscribed first, then read: nothing that happens in between is missed.
    let mut last = match client.failover().job_status(job).await {
        Ok(s) => s,
        Err(e) => return fail_with(&e),
    };
    print_change(json, "status", &last);
    while !last.is_finished() {
        // Nobody reads any more (`baton watch ... | head -3`): end quietly.
        if super::out::stdout_closed() {
            return 0;
        }
        match changes.next_event().await {
            Some(Ok(change)) => {
                print_change(json, &change.message, &change.status);
                last = change.status;
            }
            Some(Err(e)) => {
                say!("baton: {}", text::error_message(&e));
            }
            None => break,
        }
    }
    match last.state {
        JobState::Done => 0,
        JobState::Exhausted => EX_EXHAUSTED,
        _ => EX_UNAVAILABLE,
    }
}

/// Follows a lock, fair lock, queue or election until interrupted: a line per change of
/// state, holder or fencing token.
async fn watch_entry(client: &Client, job: &FailoverConfig, kind: Kind, json: bool) -> u8 {
    let watch = match client.inspect().with_prefix(job.prefix()) {
        Ok(i) => i.watch(kind, job.key()).await,
        Err(e) => return super::exit::usage_config(&e),
    };
    let mut watch = match watch {
        Ok(w) => w,
        Err(e) => return fail_with(&e),
    };
    let mut first = true;
    loop {
        // Nobody reads any more (`baton watch ... | head -3`): end quietly.
        if super::out::stdout_closed() {
            return 0;
        }
        match watch.next_event().await {
            Ok(entry) => {
                let message = if first { "status" } else { "changed" };
                first = false;
                let at = wall_time(std::time::SystemTime::now());
                if json {
                    outln!(
                        "{}",
                        serde_json::json!({ "at": at, "message": message, "state": entry_json(&entry) })
                    );
                } else {
                    let mut line = format!("{at} {message}: {} {}", entry.kind, entry.state);
                    if let Some(s) = entry.holders_summary() {
                        line += &format!(" {s}");
                    } else if let Some(h) = &entry.holder {
                        line += &format!(" by {h}");
                    }
                    if entry.writer_waiting == Some(true) {
                        line += ", a writer waits";
                    }
                    for h in &entry.holders {
                        line += &format!("; {}", holder_line(h));
                    }
                    if let Some(f) = entry.fencing_token {
                        let label = if kind == Kind::Leader {
                            "term"
                        } else {
                            "token"
                        };
                        line += &format!(" {label} {f}");
                    }
                    outln!("{line}");
                }
            }
            Err(e) => {
                say!("baton: {}", text::error_message(&e));
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
}

/// One line of `baton watch` of a job: when it was seen (UTC, RFC 3339 to the millisecond),
/// what happened and the job's state.
pub(crate) fn print_change(json: bool, message: &str, status: &JobStatus) {
    let at = wall_time(std::time::SystemTime::now());
    if json {
        outln!(
            "{}",
            serde_json::json!({ "at": at, "message": message, "state": status_json(status) })
        );
    } else {
        let (state, attempt, holder, _) = state_parts(&status.state);
        let mut line = format!("{at} {message}: {state}");
        if let Some(a) = attempt {
            line += &format!(" attempt {a}");
        }
        if let Some(h) = holder {
            line += &format!(" held by {h}");
        }
        outln!("{line}");
    }
}

/// `baton status --key K --history`: each digest's history from the schedule's record, newest
/// first, `limit` occurrences at most per digest. As text: a header per digest, then a line
/// per attempt (an occurrence with none gets one line); with --json, one object per
/// occurrence (the record's fields, times in RFC 3339, and `key`, `digest` and each attempt's
/// `duration_ms`).
pub(crate) async fn history(
    client: &Client,
    config: FailoverConfig,
    limit: usize,
    json: bool,
) -> u8 {
    let failover = client.failover();
    let records = match failover.schedule_records(config.clone()).await {
        Ok(r) => r,
        Err(e) => return fail_with(&e),
    };
    if records.is_empty() {
        say!(
            "baton: {}: no schedule's record under this key (never run by a baton that \
             records, or forgotten)",
            config.key()
        );
        // As `status --key` of an absent job: nothing there is an answer, not an error.
        return 0;
    }
    for record in &records {
        let history = match failover
            .schedule_history(config.clone(), &record.digest, limit)
            .await
        {
            Ok(h) => h,
            Err(e) => return fail_with(&e),
        };
        if json {
            for occurrence in &history {
                outln!("{}", occurrence_json(record, occurrence));
            }
            continue;
        }
        outln!(
            "schedule {}@{} ({}): {} occurrence{} on record",
            record.key,
            record.digest,
            record.spec.text,
            history.len(),
            if history.len() == 1 { "" } else { "s" }
        );
        outln!(
            "{:<24} {:<15} {:>7} {:<20} {:<24} {:<24} {:>9} {:<10} MESSAGE",
            "TICK",
            "OUTCOME",
            "ATTEMPT",
            "HOST",
            "START",
            "END",
            "DURATION",
            "EXIT"
        );
        for occurrence in &history {
            for line in occurrence_lines(occurrence) {
                outln!("{line}");
            }
        }
    }
    0
}

/// An occurrence's lines in `status --history`: one per attempt, the tick and outcome on the
/// first.
pub(crate) fn occurrence_lines(o: &baton::OccurrenceRecord) -> Vec<String> {
    // A manual occurrence by its id (`manual-…`): its time is in it, and it is no tick.
    let tick = if o.manual {
        o.id.clone()
    } else {
        super::run::baton_time(o.tick)
    };
    let mut outcome = o.outcome.to_string();
    if let Some(note) = &o.note {
        outcome = format!("{outcome} ({note})");
    }
    let time = |t: Option<std::time::SystemTime>| t.map_or("-".into(), super::run::baton_time);
    if o.attempts.is_empty() {
        return vec![format!(
            "{tick:<24} {outcome:<15} {:>7} {:<20} {:<24} {:<24} {:>9} {:<10} -",
            "-", "-", "-", "-", "-", "-"
        )];
    }
    o.attempts
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let (tick, outcome) = if i == 0 {
                (tick.as_str(), outcome.as_str())
            } else {
                ("", "")
            };
            let exit = a.exit.map_or("-".into(), |e| e.to_string());
            let duration = a
                .duration()
                .map_or("-".into(), |d| text::human(d).to_string());
            let host = a.host.as_deref().unwrap_or("unknown");
            let end = match (a.ended, a.outcome) {
                (Some(t), _) => super::run::baton_time(t),
                // A worker that died between its transition and its record write: the end
                // is not known, only that the attempt ended (or not yet).
                (None, Some(_)) => "unknown".into(),
                (None, None) => "-".into(),
            };
            let what = match (a.outcome, &a.message) {
                (Some(out), Some(m)) => format!("{}: {m}", attempt_word(out)),
                (Some(out), None) => attempt_word(out).to_string(),
                (None, Some(m)) => m.clone(),
                (None, None) => "-".into(),
            };
            format!(
                "{tick:<24} {outcome:<15} {:>7} {host:<20} {:<24} {end:<24} {duration:>9} \
                 {exit:<10} {what}",
                a.attempt,
                time(a.started)
            )
        })
        .collect()
}

fn attempt_word(o: baton::AttemptOutcome) -> &'static str {
    match o {
        baton::AttemptOutcome::Done => "done",
        baton::AttemptOutcome::Failed => "failed",
        baton::AttemptOutcome::Lost => "lost",
        _ => "ended",
    }
}

/// An occurrence as `status --history --json` prints it.
pub(crate) fn occurrence_json(
    record: &baton::ScheduleRecord,
    o: &baton::OccurrenceRecord,
) -> serde_json::Value {
    let mut v = serde_json::to_value(o).unwrap_or_default();
    v["key"] = serde_json::json!(record.key);
    v["digest"] = serde_json::json!(record.digest);
    if let Some(attempts) = v["attempts"].as_array_mut() {
        for (a, rec) in attempts.iter_mut().zip(&o.attempts) {
            a["duration_ms"] = serde_json::json!(rec
                .duration()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
        }
    }
    v
}

/// A schedule's row from its record: what `status --key` prints of each digest and the
/// listing's note adds, and the dashboard shows.
pub(crate) struct ScheduleView<'a> {
    pub(crate) record: &'a baton::ScheduleRecord,
    /// The next tick after the server's time.
    pub(crate) next_tick: Option<std::time::SystemTime>,
    /// The worst open occurrence on record: a failed attempt waiting for a backup before one
    /// still running; between equals the oldest.
    pub(crate) worst_open: Option<&'a baton::OccurrenceRecord>,
    /// How long ago the last success ended.
    pub(crate) success_age: Option<std::time::Duration>,
    /// The pause, when one holds at the server's time.
    pub(crate) paused: Option<&'a baton::Pause>,
    pub(crate) now: std::time::SystemTime,
}

impl<'a> ScheduleView<'a> {
    pub(crate) fn of(
        record: &'a baton::ScheduleRecord,
        history: &'a [baton::OccurrenceRecord],
        now: std::time::SystemTime,
    ) -> Self {
        use baton::RecordedOutcome;
        let rank = |o: &baton::OccurrenceRecord| match o.outcome {
            RecordedOutcome::Failed => Some(0),
            RecordedOutcome::Running => Some(1),
            _ => None,
        };
        let worst_open = history
            .iter()
            .filter_map(|o| rank(o).map(|r| (r, o.tick, o)))
            .min_by_key(|(r, tick, _)| (*r, *tick))
            .map(|(_, _, o)| o);
        let next_tick = baton::Schedule::from_spec(&record.spec)
            .ok()
            .and_then(|s| s.next_after(now));
        let paused = record
            .paused
            .as_ref()
            .filter(|p| p.until.map_or(true, |u| u > now));
        ScheduleView {
            record,
            next_tick,
            worst_open,
            success_age: record
                .last_success
                .map(|t| now.duration_since(t).unwrap_or_default()),
            paused,
            now,
        }
    }

    /// The hosts seen, most recent first: `web-1 (2m ago), web-2 (1h ago)`.
    pub(crate) fn hosts(&self) -> String {
        let mut hosts: Vec<&baton::HostSeen> = self.record.hosts.iter().collect();
        hosts.sort_by_key(|h| std::cmp::Reverse(h.last_seen));
        let list: Vec<String> = hosts
            .iter()
            .map(|h| {
                let ago = self.now.duration_since(h.last_seen).unwrap_or_default();
                format!("{} ({} ago)", h.host, text::human(ago))
            })
            .collect();
        if list.is_empty() {
            "none".into()
        } else {
            list.join(", ")
        }
    }

    /// The one-line summary a listing's note and the dashboard use.
    pub(crate) fn note(&self) -> String {
        let r = self.record;
        let mut parts = vec![r.spec.text.clone()];
        if let Some(t) = self.next_tick {
            parts.push(format!("next {}", super::run::baton_time(t)));
        }
        if let Some(o) = r.last_outcome {
            parts.push(format!("last outcome {o}"));
        }
        parts.push(match self.success_age {
            Some(age) => format!("last success {} ago", text::human(age)),
            None => "no success on record".into(),
        });
        if let Some(p) = self.paused {
            parts.push(super::pause::describe(p));
        }
        parts.push(format!(
            "{} host{}",
            r.hosts.len(),
            if r.hosts.len() == 1 { "" } else { "s" }
        ));
        parts.join("; ")
    }

    pub(crate) fn text(&self) -> String {
        let r = self.record;
        let time =
            |t: Option<std::time::SystemTime>| t.map_or("none".into(), super::run::baton_time);
        let mut out = format!("schedule:     {}@{}\n", r.key, r.digest);
        out += &format!("expression:   {}\n", r.spec.text);
        out += &format!("next tick:    {} (server time)\n", time(self.next_tick));
        out += &format!(
            "worst open:   {}\n",
            self.worst_open
                .map_or("none".into(), |o| format!("{} {}", o.id, o.outcome))
        );
        out += &format!(
            "last outcome: {}\n",
            match (r.last_outcome, r.last_tick) {
                (Some(o), Some(t)) => format!("{o} ({})", super::run::baton_time(t)),
                (Some(o), None) => o.to_string(),
                _ => "none".into(),
            }
        );
        out += &format!(
            "last success: {}\n",
            match (self.success_age, r.last_success) {
                (Some(age), Some(t)) =>
                    format!("{} ago ({})", text::human(age), super::run::baton_time(t)),
                _ => "none on record".into(),
            }
        );
        out += &format!(
            "paused:       {}\n",
            self.paused.map_or("no".into(), super::pause::describe)
        );
        out += &format!("hosts:        {}\n", self.hosts());
        out
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        let r = self.record;
        let mut v = serde_json::to_value(r).unwrap_or_default();
        v["kind"] = serde_json::json!("schedule");
        v["next_tick"] = serde_json::json!(self.next_tick.map(super::run::baton_time));
        v["worst_open"] = serde_json::json!(self.worst_open);
        v["last_success_age_ms"] = serde_json::json!(self
            .success_age
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
        v["paused"] = serde_json::json!(self.paused);
        v
    }
}
