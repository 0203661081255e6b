//! What the read-write lock's store is asked and answers, defined here (a leaf) so that the
//! seam (`backend::rwlocks`), each backend's arm and the primitive (`rwlock`) share one
//! definition without importing each other.

use std::time::Duration;

use tokio::time::Instant;

/// How a holder of a read-write lock holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwMode {
    /// A shared read.
    Read,
    /// The one upgradeable read: shared with plain readers, exclusive among upgradeable ones.
    Upgradeable,
    /// The exclusive write.
    Write,
}

impl RwMode {
    /// The mode's name on the wire (a script's argument).
    pub(crate) fn wire(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Upgradeable => "upgradeable",
            RwMode::Write => "write",
        }
    }
}

/// The keys of one read-write lock, as its store needs them (all in one hash slot on Redis).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RwKeysRef<'a> {
    /// The lock's state: the last write's fencing token, the writer, the upgradeable reader
    /// and the readers (a hash on Redis).
    pub state: &'a str,
    /// The "writer waiting" mark, with its own lease.
    pub waiting: &'a str,
    /// The prefix of a holder's own lease key (the holder's token follows it).
    pub holder_prefix: &'a str,
    /// The channel a release, a downgrade or a lapsed wait is announced on.
    pub channel: &'a str,
}

/// One try to take a read-write lock: `token` holds its own lease (`lease`) in `mode`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RwAcquire<'a> {
    pub keys: RwKeysRef<'a>,
    pub token: &'a str,
    pub mode: RwMode,
    pub lease: Duration,
    /// How long a waiting writer's mark lives unless its next try refreshes it; zero for a
    /// single try, which does not wait and so leaves no mark.
    pub mark: Duration,
}

/// What one try (or one try to upgrade) found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RwGrant {
    /// Granted. `fence` is the new write's fencing token for a write (or an upgrade), the
    /// last write's token (0 when none is known) for a read. `sent` is when the request left.
    Granted { fence: u64, sent: Instant },
    /// Not granted now: try again within `retry` (the shortest of the blocking holders'
    /// remaining leases and, for a waiting writer, its mark's refresh time).
    Busy { retry: Option<Duration> },
}
