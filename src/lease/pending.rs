//! Token-checked releases that must not block: a grant whose reply was lost or whose future was
//! dropped, and a holder dropped without releasing. Shared by the lock-shaped primitives.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::lock;
use crate::transport::Transport;
use crate::util::time::after;
use crate::util::token::short;

/// Where a lock lives: its key and the channel its release wakes (a primitive's key set).
pub(crate) trait LockAt: Send + Sync + 'static {
    /// The lock (lease) key.
    fn lock(&self) -> &str;
    /// The channel a release publishes `released` on.
    fn channel(&self) -> &str;
}

/// Releases by token through a task of the client when an acquisition's outcome is unknown
/// (dropped future, lost reply); [`Pending::disarm`] once the reply is known.
pub(crate) struct Pending<K: LockAt> {
    transport: Option<Arc<Transport>>,
    at: Arc<K>,
    token: String,
}

impl<K: LockAt> Pending<K> {
    /// Armed: dropped before [`Pending::disarm`], it releases `token` from `at`.
    pub(crate) fn arm(transport: &Arc<Transport>, at: &Arc<K>, token: &str) -> Self {
        Pending {
            transport: Some(transport.clone()),
            at: at.clone(),
            token: token.to_string(),
        }
    }

    /// The outcome is known: nothing to release.
    pub(crate) fn disarm(&mut self) {
        self.transport = None;
    }
}

impl<K: LockAt> Drop for Pending<K> {
    fn drop(&mut self) {
        if let Some(t) = self.transport.take() {
            release_in_background(&t, &self.at, std::mem::take(&mut self.token));
        }
    }
}

/// Spawns a token-checked release on the client's tracker; never blocks. Without a runtime (a
/// holder dropped after it ended) or a client that shut down, the lock's ttl is the backstop.
pub(crate) fn release_in_background<K: LockAt>(
    transport: &Arc<Transport>,
    at: &Arc<K>,
    token: String,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if transport.cancel.is_cancelled() {
        return;
    }
    // The router, not the transport: the release must not keep the client alive.
    let router = transport.router.clone();
    let at = at.clone();
    let limit: Duration = transport.settings.response_timeout;
    transport.tracker.spawn_on(
        async move {
            let deadline = after(Instant::now(), limit);
            let (key, channel) = (at.lock(), at.channel());
            let released = match router.node(key).await {
                Ok(node) => lock::release(&mut node.conn(), key, channel, &token, deadline).await,
                Err(e) => Err(e),
            };
            match released {
                Ok(ours) => {
                    tracing::debug!(key, token = short(&token), ours, "released in the background")
                }
                Err(e) => {
                    tracing::warn!(key, error = %e, "background release failed; the lease expires by its ttl")
                }
            }
        },
        &handle,
    );
}
