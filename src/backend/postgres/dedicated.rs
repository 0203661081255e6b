//! Connections of their own, never pooled and never shared: a session-scoped advisory lock
//! lives on one for its guard's whole life, and `LISTEN` needs one that stays open. A dedicated
//! connection says when it dies ([`Dedicated::closed`]) and hands over its notifications.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio_postgres::AsyncMessage;
use tokio_util::sync::CancellationToken;

use super::classify::classify;
use super::{PgTransport, Tls};
use crate::error::Error;

/// A `LISTEN` notification: its channel and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notice {
    pub channel: String,
    pub payload: String,
}

impl PgTransport {
    /// A new connection of its own, never pooled and never shared (see the module docs).
    pub(crate) async fn dedicated(&self) -> Result<Dedicated, Error> {
        connect_dedicated(&self.config, &self.tls).await
    }
}

/// A new connection of its own to `config` (see [`PgTransport::dedicated`]).
pub(crate) async fn connect_dedicated(
    config: &tokio_postgres::Config,
    tls: &Tls,
) -> Result<Dedicated, Error> {
    let (client, mut connection) = config
        .connect(tls.clone())
        .await
        .map_err(|e| classify(e, "connecting"))?;
    let closed = CancellationToken::new();
    let shut = CancellationToken::new();
    let why = Arc::new(Mutex::new(None));
    let (notices_tx, notices) = mpsc::unbounded_channel();
    let (task_closed, task_why, task_shut) = (closed.clone(), why.clone(), shut.clone());
    // The driver task: polls the socket, forwards notifications and records how the
    // connection ended. It ends with the connection (the client dropped, the server gone, or
    // `Dedicated::close`, which drops the socket at once).
    tokio::spawn(async move {
        loop {
            let message = tokio::select! {
                biased;
                _ = task_shut.cancelled() => {
                    *crate::util::lock(&task_why) = Some("closed by baton".into());
                    break;
                }
                message = std::future::poll_fn(|cx| connection.poll_message(cx)) => message,
            };
            match message {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    let _ = notices_tx.send(Notice {
                        channel: n.channel().to_string(),
                        payload: n.payload().to_string(),
                    });
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    *crate::util::lock(&task_why) = Some(e.to_string());
                    break;
                }
                None => break,
            }
        }
        task_closed.cancel();
    });
    Ok(Dedicated {
        client,
        closed,
        shut,
        why,
        notices,
    })
}

/// A connection of its own (see [`PgTransport::dedicated`]).
pub(crate) struct Dedicated {
    pub client: tokio_postgres::Client,
    pub(super) closed: CancellationToken,
    shut: CancellationToken,
    why: Arc<Mutex<Option<String>>>,
    /// Notifications of the channels this connection `LISTEN`s on.
    pub notices: mpsc::UnboundedReceiver<Notice>,
}

impl Dedicated {
    /// Cancelled when the connection has ended (the server closed it, the backend was
    /// terminated, the network failed as the driver saw it).
    pub(crate) fn closed(&self) -> &CancellationToken {
        &self.closed
    }

    /// Closes the connection now, without waiting: the driver task drops the socket (the
    /// server sees it close and ends the session, freeing its session-level state such as
    /// advisory locks), and [`closed`](Self::closed) fires. Statements in flight fail with a
    /// connection error. Idempotent.
    pub(crate) fn close(&self) {
        self.shut.cancel();
    }

    /// Why the connection ended, once it has (the driver's message), if it said.
    pub(crate) fn why_closed(&self) -> Option<String> {
        crate::util::lock(&self.why).clone()
    }
}
