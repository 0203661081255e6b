//! What an operator's command on a job names, and what it did: the answers of
//! [`Failover::fail_attempt`](super::Failover::fail_attempt) and
//! [`Failover::reset_job`](super::Failover::reset_job), and the rule that matches a named
//! attempt. Apart from `admin` so that both its stores (`admin` for Redis, `pg`) read it without
//! importing each other.

use serde::Serialize;

use crate::error::ConfigError;
use crate::lease::store::Expected;

/// What [`Failover::fail_attempt`](super::Failover::fail_attempt) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FailAttempt {
    /// This attempt, the one expected, was released.
    Released(u64),
    /// No attempt's lease was alive; nothing was done.
    NotLive,
    /// This other attempt is live now; nothing was done.
    Another(u64),
}

/// What [`Failover::reset_job`](super::Failover::reset_job) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ResetJob {
    /// The job's state was deleted.
    Reset,
    /// This attempt is live and was not the one expected; nothing was done.
    Live(u64),
}

/// Whether live attempt `attempt` is the one `expected` names.
///
/// # Errors
/// A [`ConfigError`] for an expectation a job cannot meet (a fencing token, a holder).
pub(crate) fn attempt_matches(expected: &Expected, attempt: u64) -> Result<bool, ConfigError> {
    match expected {
        Expected::Attempt(n) => Ok(*n == attempt),
        Expected::Any => Ok(true),
        _ => Err(ConfigError::invalid(
            "expected",
            "an attempt number or any (a job is named by its attempt)",
        )),
    }
}
