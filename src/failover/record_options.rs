//! How a schedule's record is written: [`RecordOptions`], and what a worker of an
//! occurrence's job keeps of its schedule ([`OccurrenceContext`]). A file of its own so that
//! the job's configuration can carry it without importing the record's readers.

use std::time::{Duration, SystemTime};

use crate::error::ConfigError;
use crate::schedule::{Schedule, DEFAULT_HISTORY, MAX_HISTORY};

/// How a schedule's record is written ([`Failover::record_occurrence`](super::Failover::record_occurrence)): the history size and
/// the jitter it describes. The key prefix and the writer's name come from the job's
/// [`FailoverConfig`](crate::FailoverConfig).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordOptions {
    /// How many occurrences the record keeps (1 ..= 1000, default 50).
    pub history: u32,
    /// The jitter the schedule's runs use (recorded in the spec).
    pub jitter: Duration,
}

impl Default for RecordOptions {
    fn default() -> Self {
        RecordOptions {
            history: DEFAULT_HISTORY,
            jitter: Duration::ZERO,
        }
    }
}

impl RecordOptions {
    /// With a history of `n` occurrences.
    pub fn history(mut self, n: u32) -> Self {
        self.history = n;
        self
    }

    /// With `jitter`.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Checks the history size.
    ///
    /// # Errors
    /// `history`: outside 1 ..= 1000.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_history(self.history)
    }
}

/// Checks a history size (1 ..= [`MAX_HISTORY`]).
pub(crate) fn check_history(n: u32) -> Result<(), ConfigError> {
    if n == 0 || n > MAX_HISTORY {
        return Err(ConfigError::invalid(
            "history",
            format!("{n} is outside 1 ..= {MAX_HISTORY}"),
        ));
    }
    Ok(())
}

/// What a worker running an occurrence's job knows of its schedule, to record its attempts
/// ([`FailoverConfig::with_record`](crate::FailoverConfig::with_record)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OccurrenceContext {
    /// The schedule's key (not the occurrence's job key).
    pub key: String,
    pub schedule: Schedule,
    pub tick: SystemTime,
    pub options: RecordOptions,
    /// The manual occurrence when the job runs one (its entry is keyed by its id, marked
    /// manual, and never counts missed ticks).
    pub manual: Option<crate::schedule::Occurrence>,
}
