//! Token-checked releases that must not block: a grant whose reply was lost or whose future was
//! dropped, and a holder dropped without releasing. Shared by the lock-shaped primitives.

use std::sync::Arc;

use crate::backend::Backend;
use crate::util::drop_guard::Armed;

/// Where a lock lives: its key and the channel its release wakes (a primitive's key set).
pub(crate) trait LockAt: Send + Sync + 'static {
    /// The lock (lease) key.
    fn lock(&self) -> &str;
    /// The channel a release publishes `released` on.
    fn channel(&self) -> &str;
}

/// Releases by token through a task of the client when an acquisition's outcome is unknown
/// (dropped future, lost reply); [`Armed::disarm`] once the reply is known.
pub(crate) struct Pending;

impl Pending {
    /// Armed: dropped before [`Armed::disarm`], it releases `token` from `at`.
    pub(crate) fn arm<K: LockAt>(
        backend: &Backend,
        at: &Arc<K>,
        token: &str,
    ) -> Armed<impl FnOnce() + Send + Sync + 'static> {
        let (backend, at, token) = (backend.clone(), at.clone(), token.to_string());
        Armed::new(move || release_in_background(&backend, &at, token))
    }
}

/// Spawns a token-checked release on the client's tracker; never blocks. Without a runtime (a
/// holder dropped after it ended) or a client that shut down, the lock's ttl is the backstop.
pub(crate) fn release_in_background<K: LockAt>(backend: &Backend, at: &Arc<K>, token: String) {
    backend.release_in_background(at.lock(), at.channel(), token);
}
