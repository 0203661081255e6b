//! [`LeaderEvent`]: what the worker form reports.

use serde::Serialize;

use super::Term;
use crate::error::{Error, ErrorKind};

/// What the worker form reports. Every event is `serde::Serialize` (`{"event":"Elected",...}`).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event")]
#[non_exhaustive]
pub enum LeaderEvent {
    /// This worker leads `term`. The work of the term starts now (once).
    Elected {
        /// The term (the fencing token).
        term: u64,
        /// This candidate's name.
        name: String,
        /// The term's handle: its stop token and lease deadline.
        #[serde(skip)]
        handle: Term,
    },
    /// The lease was renewed (may be dropped when nobody reads).
    Renewed {
        /// The term.
        term: u64,
        /// How long until the lease can end now, in ms.
        lease_left_ms: u64,
    },
    /// The term ended without a resignation: its work was told to stop (and has stopped, or
    /// [`LeaderEvent::StopOverdue`] came first), the lease was let go, and the worker
    /// campaigns again.
    Lost {
        /// The term.
        term: u64,
        /// Why.
        reason: String,
    },
    /// The work did not stop by the lease's end: another candidate may lead while it still
    /// runs (it was aborted at its next `.await`). Only fencing protects the resource now.
    StopOverdue {
        /// The term.
        term: u64,
        /// How long the work had been told to stop, in ms.
        waited_ms: u64,
    },
    /// The worker resigned the term (on [`LeaderWorker::resign`](crate::LeaderWorker::resign), or when the work returned or
    /// panicked) and woke the standbys; the stream ends.
    Resigned {
        /// The term.
        term: u64,
        /// Why: `resign() was called`, `the work returned`, or `the work panicked: …`.
        reason: String,
    },
    /// Something went wrong. A retryable error is retried and the stream goes on; any other
    /// ends it.
    Error {
        /// The stable classification.
        kind: ErrorKind,
        /// What happened.
        message: String,
        /// Whether the worker retries.
        retryable: bool,
    },
    /// The worker stopped without leading ([`LeaderWorker::resign`](crate::LeaderWorker::resign) while a standby, or the
    /// client shut down); the stream ends.
    Stopped,
}

impl LeaderEvent {
    /// Whether this event ends the stream.
    pub fn is_terminal(&self) -> bool {
        match self {
            LeaderEvent::Resigned { .. } | LeaderEvent::Stopped => true,
            LeaderEvent::Error { retryable, .. } => !retryable,
            _ => false,
        }
    }

    pub(super) fn error(e: &Error) -> Self {
        LeaderEvent::Error {
            kind: e.kind(),
            message: e.to_string(),
            retryable: e.is_retryable(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_resigned_stopped_and_fatal_errors_end_the_stream() {
        assert!(LeaderEvent::Stopped.is_terminal());
        assert!(LeaderEvent::Resigned {
            term: 1,
            reason: String::new()
        }
        .is_terminal());
        assert!(!LeaderEvent::Lost {
            term: 1,
            reason: String::new()
        }
        .is_terminal());
        assert!(!LeaderEvent::Error {
            kind: ErrorKind::Connection,
            message: String::new(),
            retryable: true
        }
        .is_terminal());
        assert!(LeaderEvent::Error {
            kind: ErrorKind::Permission,
            message: String::new(),
            retryable: false
        }
        .is_terminal());
    }

    #[test]
    fn events_serialize_without_their_handles() {
        let ev = LeaderEvent::Renewed {
            term: 7,
            lease_left_ms: 9_000,
        };
        assert_eq!(
            serde_json::to_string(&ev).unwrap(),
            r#"{"event":"Renewed","term":7,"lease_left_ms":9000}"#
        );
    }
}
