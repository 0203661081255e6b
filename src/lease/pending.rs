//! Token-checked releases that must not block: a grant whose reply was lost or whose future was
//! dropped, and a holder dropped without releasing. Shared by the lock-shaped primitives.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::lock;
use crate::backend::redis::Transport;
use crate::backend::Backend;
use crate::util::drop_guard::Armed;
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
#[cfg_attr(
    not(feature = "postgres"),
    allow(clippy::infallible_destructuring_match)
)]
pub(crate) fn release_in_background<K: LockAt>(backend: &Backend, at: &Arc<K>, token: String) {
    let at = at.clone();
    let transport = match backend {
        Backend::Redis(t) => t,
        #[cfg(feature = "postgres")]
        Backend::Postgres(t) => {
            let Ok(handle) = tokio::runtime::Handle::try_current() else {
                return;
            };
            if t.cancel.is_cancelled() {
                return;
            }
            // The task holds the transport for at most one response timeout.
            let t2 = t.clone();
            t.tracker.spawn_on(
                async move {
                    let limit = after(Instant::now(), t2.settings.response_timeout);
                    match crate::backend::postgres::locks::release(
                        &t2,
                        at.lock(),
                        at.channel(),
                        &token,
                        limit,
                    )
                    .await
                    {
                        Ok(ours) => tracing::debug!(
                            key = at.lock(),
                            token = short(&token),
                            ours,
                            "released in the background"
                        ),
                        Err(e) => tracing::warn!(
                            key = at.lock(),
                            error = %e,
                            "released in the background failed; the lock's ttl is the backstop"
                        ),
                    }
                },
                &handle,
            );
            return;
        }
    };
    spawn_cleanup(
        transport,
        at.lock().to_string(),
        "released",
        move |mut conn, deadline| async move {
            let ours = lock::release(&mut conn, at.lock(), at.channel(), &token, deadline).await?;
            Ok(format!("{} (ours: {ours})", short(&token)))
        },
    );
}

/// Runs `cleanup` (a token-checked release, a leave of a waiter queue, ...) on the connection of
/// the node that serves `key`, through a task of the client's tracker, bounded by the response
/// timeout; never blocks, and logs the outcome (`what` names it). Without a runtime or a client
/// that shut down it does nothing: the keys' TTLs are then the backstop. The task holds the
/// router, not the transport, so it never keeps the client alive.
pub(crate) fn spawn_cleanup<F, Fut>(
    transport: &Arc<Transport>,
    key: String,
    what: &'static str,
    cleanup: F,
) where
    F: FnOnce(crate::backend::redis::Conn, Instant) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<String, crate::error::Error>> + Send + 'static,
{
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if transport.cancel.is_cancelled() {
        return;
    }
    let router = transport.router.clone();
    let limit: Duration = transport.settings.response_timeout;
    transport.tracker.spawn_on(
        async move {
            let deadline = after(Instant::now(), limit);
            let done = match router.node(&key).await {
                Ok(node) => cleanup(node.conn(), deadline).await,
                Err(e) => Err(e),
            };
            match done {
                Ok(outcome) => tracing::debug!(key, %outcome, "{what} in the background"),
                Err(e) => tracing::warn!(
                    key,
                    error = %e,
                    "{what} in the background failed; the keys' TTLs are the backstop"
                ),
            }
        },
        &handle,
    );
}
