//! `baton status` and `baton watch`: read a job's state, once or until it ends, as text or
//! JSON. Read-only, unlike the tools of admin.rs.

use baton::{Client, FailoverConfig, JobState, JobStatus};

use super::exit::{fail_with, EX_DATAERR, EX_EXHAUSTED, EX_UNAVAILABLE};
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
    match client.failover().job_status(job).await {
        Ok(s) => {
            if json {
                println!("{}", status_json(&s));
            } else {
                print!("{}", status_text(&s));
            }
            if let JobState::Corrupt { value } = &s.state {
                eprintln!(
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

pub(crate) async fn watch(client: &Client, job: FailoverConfig, json: bool) -> u8 {
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
        match changes.next().await {
            Some(Ok(change)) => {
                print_change(json, &change.message, &change.status);
                last = change.status;
            }
            Some(Err(e)) => {
                eprintln!("baton: {}", text::error_message(&e));
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

pub(crate) fn print_change(json: bool, message: &str, status: &JobStatus) {
    if json {
        println!(
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
        println!("{line}");
    }
}
