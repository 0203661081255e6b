//! The job table as the layers above the coordinator name it (feature `postgres`): its schema
//! and cleanup for the client's schema checks, the listing's page for the inspector, and a
//! grant's statement for tests that interleave it. The statements themselves live in the
//! PostgreSQL backend's job store; these are the seam's re-exports.

pub(crate) use crate::backend::jobs::pg::{status_page, CLEANUP, SCHEMA, TABLE};

/// The statement and parameters of a backup's grant of `attempt` with fencing token `fence` to
/// job row `key` observed at `version` (`None`: no row), as a worker would send it; for tests
/// that interleave it with [`CLEANUP`] (feature `testing`).
///
/// # Errors
/// A fencing token that does not fit PostgreSQL's `bigint`.
#[cfg(feature = "testing")]
pub(crate) fn grant_statement(
    key: &str,
    version: Option<i64>,
    attempt: u64,
    fence: u64,
    token: &str,
) -> Result<(String, crate::backend::jobs::pg::Params), crate::error::Error> {
    crate::backend::jobs::pg::write_statement(
        key,
        version,
        &super::protocol::grant_writes(attempt, fence),
        token,
    )
}
