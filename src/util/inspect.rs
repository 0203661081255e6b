//! The records the inspection seam (`backend::inspect`) carries between the operator's view
//! and the backends: what to read of an entry (a job, a lock-shaped one, a semaphore, a read-write lock), and what it holds,
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
    /// A semaphore.
    Semaphore(SemRead),
    /// A read-write lock.
    RwLock(RwRead),
}

/// What an [`EntryRead`] found.
#[derive(Debug)]
pub(crate) enum EntryRecord {
    /// The job's status, or why its stored values cannot be read as one; and the clients
    /// subscribed to its channel (`None`: not countable here, see [`LockRecord::listeners`]).
    Job(Result<JobStatus, Error>, Option<u64>),
    /// The lock-shaped entry's record.
    Lock(LockRecord),
    /// The semaphore's record.
    Semaphore(SemRecord),
    /// The read-write lock's record.
    RwLock(RwRecord),
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

/// The keys a semaphore is read from (its layout: `semaphore::keys`).
#[derive(Debug, Clone)]
pub(crate) struct SemRead {
    /// The record: its limit, span and slots' fences.
    pub(crate) meta: String,
    /// What every slot's key starts with: slot `i` is this followed by `i`.
    pub(crate) slots: String,
    /// The line of fair waiters (Redis: a sorted set, counted with `ZCARD`).
    pub(crate) queue: String,
}

/// The keys a read-write lock is read from (its layout: `rwlock::keys`).
#[derive(Debug, Clone)]
pub(crate) struct RwRead {
    /// The state: the last write's token, the writer, the upgradeable reader, the readers.
    pub(crate) state: String,
    /// The "writer waiting" mark.
    pub(crate) waiting: String,
    /// What every holder's lease key starts with (followed by its token).
    pub(crate) holder_prefix: String,
}

/// One live lease of a semaphore or a read-write lock: its holder's token and time left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HolderLease {
    /// The holder's random token (shown by its first characters only).
    pub(crate) token: String,
    /// Its lease's time left (`None`: no expiry).
    pub(crate) pttl: Option<Duration>,
}

/// A semaphore as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SemRecord {
    /// Whether its record exists at all.
    pub(crate) stored: bool,
    /// The stored limit, as text (`None`: none stored).
    pub(crate) limit: Option<String>,
    /// How many slots may hold permits (at least every limit stored since).
    pub(crate) span: u32,
    /// Each slot's last fencing token, as text, by slot.
    pub(crate) fences: Vec<(u32, String)>,
    /// The held slots, by slot.
    pub(crate) held: Vec<(u32, HolderLease)>,
    /// The fair waiters in its line (on PostgreSQL only the live ones; on Redis a dead one
    /// counts until the next try drops it).
    pub(crate) waiting: u64,
    /// A read the server refused (a key of another type), as its reply reads.
    pub(crate) refused: Option<String>,
}

/// A read-write lock as stored: only holders whose lease lives are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RwRecord {
    /// Whether its state exists at all.
    pub(crate) stored: bool,
    /// The last write's fencing token, as text.
    pub(crate) fence: Option<String>,
    /// The writer.
    pub(crate) writer: Option<HolderLease>,
    /// The upgradeable reader.
    pub(crate) upgrader: Option<HolderLease>,
    /// The plain readers.
    pub(crate) readers: Vec<HolderLease>,
    /// Whether a writer (or an upgrading reader) waits: its mark lives.
    pub(crate) writer_waiting: bool,
    /// A read the server refused (a key of another type), as its reply reads.
    pub(crate) refused: Option<String>,
}
