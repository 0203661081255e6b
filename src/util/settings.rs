//! What every backend's connections are configured with, and the hidden test seam each backend
//! runs before a commit. Plain data: the backends read it, the client builds it.

use std::time::Duration;

/// Connection settings of one client, shared by every kind of connection of every backend.
#[derive(Debug, Clone)]
pub(crate) struct ConnSettings {
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    pub max_backoff: Duration,
    pub pool_size: usize,
}

/// `WAIT replicas timeout` after a write: how many replicas must acknowledge it, and how long
/// to wait for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaWait {
    pub replicas: u32,
    pub timeout: Duration,
}

/// A hook run between round trip 1 (`WATCH` + reads) and round trip 2 (`MULTI … EXEC`) of a
/// transition, and before a lease extension, with the transition's name (`"grant"`,
/// `"exhaust"`, `"finish"`, `"extend"`). A hidden test seam (feature `testing`): tests write a
/// competing value exactly in the window a `WATCH` protects, or hold a transition there.
#[cfg(feature = "testing")]
pub type ExecHook = std::sync::Arc<
    dyn Fn(&'static str) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
        + Send
        + Sync,
>;
