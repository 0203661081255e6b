//! The three kinds of connection one client keeps, and why.
//!
//! - **One multiplexed connection** (a `ConnectionManager`, which reconnects by itself) for plain
//!   reads that only decide whether to keep waiting. It is never used for `WATCH`: on a
//!   multiplexed connection another task's `EXEC` would silently end our `WATCH` (and vice
//!   versa), which is exactly how the original granted one attempt twice.
//! - **A small pool of dedicated connections** for transitions (`WATCH … EXEC`). A connection is
//!   checked out by one transition at a time and never reconnects underneath it: if anything goes
//!   wrong mid-transaction the connection is dropped, and closing it ends its `WATCH` on the
//!   server. Waiting backups hold none, so thousands of waiting jobs share a handful.
//! - **One pub/sub connection** (the [`Hub`]) that wakes waiting backups. Subscriptions are
//!   reference counted per channel; `subscribe` returns only once the server confirmed, so a
//!   waiter that subscribes and *then* reads the state cannot miss a message published in
//!   between. After a reconnect every waiter is told to observe again, because messages sent
//!   while the connection was down are gone.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::AsyncConnectionConfig;

use crate::error::Error;
use crate::util::settings::ConnSettings;

/// Per-connection settings for redis' async connections (the dedicated pool and the cluster's
/// node connections).
pub(crate) fn async_config(s: &ConnSettings) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(s.connect_timeout))
        .set_response_timeout(Some(s.response_timeout))
}

fn manager_config(s: &ConnSettings) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(s.connect_timeout))
        .set_response_timeout(Some(s.response_timeout))
        .set_max_delay(s.max_backoff)
        .set_number_of_retries(2)
}

/// The shared multiplexed connection, opened by its first request (and reopened after an I/O
/// error by the next one). Needs a Tokio runtime.
pub(crate) fn lazy_manager(
    client: &redis::Client,
    s: &ConnSettings,
) -> Result<ConnectionManager, Error> {
    Ok(ConnectionManager::new_lazy_with_config(
        client.clone(),
        manager_config(s),
    )?)
}

/// Opens the shared multiplexed connection.
pub(crate) async fn connect_manager(
    client: &redis::Client,
    s: &ConnSettings,
) -> Result<ConnectionManager, Error> {
    let fut = ConnectionManager::new_with_config(client.clone(), manager_config(s));
    // The manager retries internally; bound the whole first connect so `Client::connect` fails
    // fast (and typed) when Redis is down.
    match tokio::time::timeout(s.connect_timeout * 3, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(Error::Timeout {
            during: "connecting to redis",
        }),
    }
}
