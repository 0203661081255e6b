//! `baton status` and `baton watch`: list everything under the prefix, read what a name is
//! (a job, a lock, an election, …), once or as it changes, as text or JSON. Read-only, unlike
//! the tools of admin.rs and unlock.rs.

use std::collections::BTreeMap;

use baton::inspect::{Entry, EntryState, Kind};
use baton::{Client, FailoverConfig, JobState, JobStatus};

use super::exit::{fail_with, EX_DATAERR, EX_EXHAUSTED, EX_UNAVAILABLE};
use super::out;
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
    let others = match inspect.find(job.key()).await {
        Ok(found) => found,
        Err(e) => return fail_with(&e),
    };
    let others: Vec<Entry> = others.into_iter().filter(|e| e.kind != Kind::Job).collect();
    // A job, or nothing at all: the job's view, as it always was (`absent` included).
    let job_exists = match client.failover().job_status(job.clone()).await {
        Ok(s) => s.state != JobState::Absent,
        Err(e) => return fail_with(&e),
    };
    let mut code = 0;
    if job_exists || others.is_empty() {
        code = job_status(client, job, prefix, json).await;
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

async fn job_status(client: &Client, job: FailoverConfig, prefix: &str, json: bool) -> u8 {
    match client.failover().job_status(job).await {
        Ok(s) => {
            if json {
                outln!("{}", status_json(&s));
            } else {
                out!("{}", status_text(&s));
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
    if let Some(d) = &e.detail {
        out += &format!("detail:       {d}\n");
    }
    out
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

/// How many occurrences of a schedule its row recalls.
const LAST_OCCURRENCES: usize = 3;

/// A listing's schedules: each schedule's occurrences folded into one row, the only state a
/// listing keeps across batches (a few occurrences per schedule, not the entries). `status`
/// and `dashboard` fold alike.
#[derive(Default)]
pub(crate) struct Schedules(BTreeMap<(String, String), Schedule>);

impl Schedules {
    /// Keeps `entry` when it is a schedule's occurrence (`KEY@DIGEST@TICK`); gives it back
    /// otherwise.
    pub(crate) fn fold(&mut self, entry: Entry) -> Option<Entry> {
        let Some((key, digest, tick)) = entry.occurrence() else {
            return Some(entry);
        };
        let (key, digest, tick) = (key.to_string(), digest.to_string(), tick.to_string());
        self.0.entry((key, digest)).or_default().add(&tick, entry);
        None
    }

    /// One row per schedule, by key and digest.
    pub(crate) fn rows(self) -> impl Iterator<Item = ScheduleRow> {
        self.0
            .into_iter()
            .map(|((key, digest), s)| ScheduleRow { key, digest, s })
    }
}

/// The occurrences of one schedule seen so far.
#[derive(Default)]
struct Schedule {
    count: u64,
    /// The latest occurrences by tick (RFC 3339 in UTC sorts by time), oldest first.
    last: Vec<(String, Entry)>,
}

impl Schedule {
    fn add(&mut self, tick: &str, entry: Entry) {
        self.count += 1;
        let at = self.last.partition_point(|(t, _)| t.as_str() < tick);
        self.last.insert(at, (tick.to_string(), entry));
        if self.last.len() > LAST_OCCURRENCES {
            self.last.remove(0);
        }
    }
}

/// A schedule as one row: its latest occurrence's state, and a note of its last outcomes.
pub(crate) struct ScheduleRow {
    pub(crate) key: String,
    pub(crate) digest: String,
    s: Schedule,
}

impl ScheduleRow {
    /// The latest occurrence (there is always one: a row exists once one was folded).
    pub(crate) fn latest(&self) -> Option<&Entry> {
        self.s.last.last().map(|(_, e)| e)
    }

    /// `3 occurrences; last: 2026-01-03T00:00:00Z done, …`, newest first.
    pub(crate) fn note(&self) -> String {
        let outcomes: Vec<String> = self
            .s
            .last
            .iter()
            .rev()
            .map(|(tick, e)| format!("{tick} {}", e.state))
            .collect();
        let plural = if self.s.count == 1 { "" } else { "s" };
        format!(
            "{} occurrence{plural}; last: {}",
            self.s.count,
            outcomes.join(", ")
        )
    }

    /// What `status --json` prints of it.
    pub(crate) fn json(&self) -> serde_json::Value {
        let last: Vec<serde_json::Value> = self
            .s
            .last
            .iter()
            .rev()
            .map(|(tick, e)| serde_json::json!({ "tick": tick, "entry": entry_json(e) }))
            .collect();
        serde_json::json!({
            "kind": "schedule",
            "name": self.key,
            "digest": self.digest,
            "occurrences": self.s.count,
            "last": last,
        })
    }
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
    let mut schedules = Schedules::default();
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
    for s in schedules.rows() {
        print_schedule(&s, json);
    }
    0
}

/// The note of an entry's row: its attempt (with the last failure, if any), its waiters or its
/// detail.
pub(crate) fn entry_note(e: &Entry) -> String {
    match (e.attempt, e.waiting, &e.detail) {
        (Some(a), _, Some(d)) => format!("attempt {a}; last failure: {d}"),
        (Some(a), _, _) => format!("attempt {a}"),
        (_, Some(w), _) => format!("{w} waiting"),
        (_, _, Some(d)) => d.clone(),
        _ => String::new(),
    }
}

fn print_entry(e: &Entry, json: bool) {
    if json {
        outln!("{}", entry_json(e));
        return;
    }
    outln!(
        "{}",
        row(
            e.kind.as_str(),
            &e.name,
            e.state.as_str(),
            e.holder.as_deref(),
            e.remaining_ms,
            e.fencing_token,
            &entry_note(e)
        )
    );
}

fn print_schedule(s: &ScheduleRow, json: bool) {
    let Some(latest) = s.latest() else {
        return;
    };
    if json {
        outln!("{}", s.json());
        return;
    }
    outln!(
        "{}",
        row(
            "schedule",
            &format!("{}@{}", s.key, s.digest),
            latest.state.as_str(),
            latest.holder.as_deref(),
            latest.remaining_ms,
            latest.fencing_token,
            &s.note()
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
                if json {
                    outln!(
                        "{}",
                        serde_json::json!({ "message": message, "state": entry_json(&entry) })
                    );
                } else {
                    let mut line = format!("{message}: {} {}", entry.kind, entry.state);
                    if let Some(h) = &entry.holder {
                        line += &format!(" by {h}");
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

pub(crate) fn print_change(json: bool, message: &str, status: &JobStatus) {
    if json {
        outln!(
            "{}",
            serde_json::json!({ "message": message, "state": status_json(status) })
        );
    } else {
        let (state, attempt, holder, _) = state_parts(&status.state);
        let mut line = format!("{message}: {state}");
        if let Some(a) = attempt {
            line += &format!(" attempt {a}");
        }
        if let Some(h) = holder {
            line += &format!(" held by {h}");
        }
        outln!("{line}");
    }
}
