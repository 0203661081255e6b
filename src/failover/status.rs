//! What an operator sees of a job: its stored state and lease ([`JobState`], [`JobStatus`]),
//! the same on every backend. Its own file so that each backend's operator tools (`admin.rs`
//! on Redis, `pg.rs` on PostgreSQL) read it without importing each other.

use serde::Serialize;

use super::protocol::{Lease, State};
use crate::error::preview;

/// A job's state as stored in Redis; see [`Failover::job_state`](super::Failover::job_state).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state")]
#[non_exhaustive]
pub enum JobState {
    /// No state: never run, or its retention ran out.
    Absent,
    /// Attempt `number` was the last one started.
    Attempt {
        /// The attempt number.
        number: u64,
        /// The holder's name while its lease is alive.
        holder: Option<String>,
        /// The lease time left in ms (`None` when no lease is alive, or it has no TTL).
        lease_remaining_ms: Option<u64>,
    },
    /// The job succeeded.
    Done,
    /// Every attempt failed.
    Exhausted,
    /// A value baton never writes.
    Corrupt {
        /// A printable preview of it.
        value: String,
    },
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobState::Absent => f.write_str("absent"),
            JobState::Attempt { number, .. } => write!(f, "attempt {number}"),
            JobState::Done => f.write_str("DONE"),
            JobState::Exhausted => f.write_str("EXHAUSTED"),
            JobState::Corrupt { value } => write!(f, "corrupt ({value})"),
        }
    }
}

/// Everything stored about a job; see [`Failover::job_status`](crate::Failover::job_status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct JobStatus {
    /// The job name.
    pub key: String,
    /// The state key's value (with the live holder, if any).
    pub state: JobState,
    /// The state key's remaining retention in ms (`None` if absent or without TTL).
    pub state_ttl_ms: Option<u64>,
    /// The last fencing token granted (`None` if absent or unreadable).
    pub fencing_token: Option<u64>,
    /// The last failure reason recorded (`attempt N by NAME: reason`).
    pub last_failure: Option<String>,
}

impl JobStatus {
    /// Whether an attempt's lease is alive (a holder is running it).
    pub fn is_live(&self) -> bool {
        matches!(
            self.state,
            JobState::Attempt {
                holder: Some(_),
                ..
            }
        )
    }

    /// Whether the job ended (`DONE` or `EXHAUSTED`).
    pub fn is_finished(&self) -> bool {
        matches!(self.state, JobState::Done | JobState::Exhausted)
    }
}

/// What an operator sees of a job's stored state and lease (the same on every backend).
pub(crate) fn job_state(state: State, lease: Lease) -> JobState {
    let (holder, lease_remaining_ms) = match lease {
        Lease::Held {
            holder, pttl_ms, ..
        } => (Some(holder), pttl_ms),
        Lease::Corrupt(v) => (Some(format!("unreadable lease {v}")), None),
        _ => (None, None),
    };
    match state {
        State::Absent => JobState::Absent,
        State::Attempt(number) => JobState::Attempt {
            number,
            holder,
            lease_remaining_ms,
        },
        State::Done => JobState::Done,
        State::Exhausted => JobState::Exhausted,
        State::Corrupt(value) => JobState::Corrupt { value },
        State::WrongType(detail) => JobState::Corrupt {
            value: preview(&detail),
        },
    }
}
