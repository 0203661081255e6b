//! The records the inspection seam (`backend::inspect`) carries between the operator's view
//! and the backends: what to read of an entry (a job, a lock-shaped one), and what it holds,
//! with how many clients listen on its channel where the backend can count them. They sit in
//! a leaf so that every backend can fill them without knowing the seam above it.

use std::time::Duration;

use crate::error::Error;
use crate::util::jobs::{JobKeys, JobStatus};

/// One entry a batch reads: a job (its keys, its name) or a lock-shaped entry.
#[derive(Debug, Clone)]
pub(crate) enum EntryRead {
    /// A failover job: what its status is read from, and its name.
    Job(JobKeys, String),
    /// A lock, election, fair lock or queue.
    Lock(LockRead),
}

/// What an [`EntryRead`] found.
#[derive(Debug)]
pub(crate) enum EntryRecord {
    /// The job's status, or why its stored values cannot be read as one; and the clients
    /// subscribed to its channel (`None`: not countable here, see [`LockRecord::listeners`]).
    Job(Result<JobStatus, Error>, Option<u64>),
    /// The lock-shaped entry's record.
    Lock(LockRecord),
}

/// What counts the waiters of a lock-shaped entry.
#[derive(Debug, Clone)]
pub(crate) enum Waiting {
    /// The members of a sorted set (a fair lock's queue).
    Members(String),
    /// The entries of a stream (a queue's items).
    Entries(String),
}

/// The keys a lock-shaped entry is read from.
#[derive(Debug, Clone)]
pub(crate) struct LockRead {
    /// The holder's key.
    pub(crate) own: String,
    /// The fence (it outlives the holder).
    pub(crate) fence: String,
    /// What counts its waiters, if it has any.
    pub(crate) waiting: Option<Waiting>,
    /// The pub/sub channel whose subscribed clients are counted (an election's: its standbys
    /// and its leader listen there), if any.
    pub(crate) listeners: Option<String>,
}

/// A lock-shaped entry as stored: what [`LockRead`]'s keys hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LockRecord {
    /// The holder's value (`None`: no holder).
    pub(crate) value: Option<String>,
    /// The fence's value, as text.
    pub(crate) fence: Option<String>,
    /// Whether the fence key holds anything at all (of any type).
    pub(crate) fence_stored: bool,
    /// The holder's time left (`None`: no holder, or no expiry).
    pub(crate) pttl: Option<Duration>,
    /// The waiters counted, if asked for.
    pub(crate) waiting: Option<u64>,
    /// A read the server refused (a key of another type), as its reply reads.
    pub(crate) refused: Option<String>,
    /// The clients subscribed to [`LockRead::listeners`]: on Redis `PUBSUB NUMSUB` (sharded
    /// on a cluster, where baton subscribes with `SSUBSCRIBE`); `None` when not asked, when
    /// the server refused the count (an ACL without `PUBSUB`), and on PostgreSQL, where no
    /// session can count another's `LISTEN`s.
    pub(crate) listeners: Option<u64>,
}
