//! The attempt-counted failover coordinator: the core of baton.
//!
//! - [`config`]: [`FailoverConfig`] and its builder (validated, serde).
//! - `protocol`: the pure decisions of every transition (unit-tested row by row).
//! - `worker`: the task that does the I/O around them.
//! - [`events`]: the [`Event`] stream, [`Acquired`] and [`AttemptHandle`].
//! - `run`: the closure form, [`Client::run`](crate::Client::run).
//! - `admin`: operator tools: [`Client::job_status`](crate::Client::job_status), `watch_job`,
//!   `fail_attempt`, `reset_job`.

mod admin;
pub mod config;
pub mod events;
pub(crate) mod protocol;
mod run;
pub(crate) mod worker;

pub use admin::{JobChange, JobStatus, JobWatch};
pub use config::{FailoverConfig, FailoverConfigBuilder, StatusLevel};
pub use events::{Acquired, AttemptHandle, Event, Worker};
pub use run::{Attempt, IntoJob, RunOutcome};
