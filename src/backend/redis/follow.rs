//! Following a Sentinel-monitored primary (feature `sentinel`).
//!
//! redis-rs asks the Sentinels for the primary only when it opens a connection, so a live
//! connection keeps talking to a primary that was demoted. baton follows the primary itself: a
//! task ([`super::sentinel::watch_switch_master`]) subscribes to `+switch-master` on the
//! Sentinels and asks them all every [`HEALTH_INTERVAL`] (believing an address only when every
//! Sentinel that answers names it); when the address changes, the [`Node`] is replaced, so every
//! later operation and every new dedicated connection goes to the new primary, and the hub
//! re-subscribes there. A write that reaches a demoted primary meanwhile is refused with
//! `READONLY`, a retryable error that never counts as a failed attempt: the caller backs off and
//! looks again once the new primary is known.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::node::{client_at, Node};
use super::pool::Pool;
use super::sentinel::{watch_switch_master, WatchSettings};
use super::stale::Stale;
use super::ConnSettings;
use crate::error::Error;

/// How often the Sentinels are all asked again (besides `+switch-master` messages).
pub(crate) const HEALTH_INTERVAL: Duration = Duration::from_secs(1);

/// The primary of one Sentinel service, followed across failovers.
pub(crate) struct Followed {
    /// The primary's client as first resolved: credentials, TLS and protocol for the next one.
    template: redis::Client,
    settings: ConnSettings,
    current: RwLock<Arc<Node>>,
    /// Bumped each time the primary changes (the hub re-subscribes then).
    generation: watch::Sender<u64>,
    stale: Arc<Stale>,
}

impl Followed {
    /// Follows `service` from its primary `client` (already resolved through `sentinels`,
    /// connected and checked with `manager`). The follower task ends with `cancel`.
    pub(crate) fn start(
        client: redis::Client,
        manager: redis::aio::ConnectionManager,
        sentinels: Vec<String>,
        service: String,
        settings: ConnSettings,
        cancel: CancellationToken,
    ) -> Arc<Followed> {
        let stale = Arc::new(Stale::default());
        let addr = addr_of(&client);
        let pool = Pool::new(client.clone(), settings.clone(), stale.clone(), "PUBLISH");
        let node = Node::new(manager, pool, addr, "PUBLISH", stale.clone());
        let followed = Arc::new(Followed {
            template: client,
            current: RwLock::new(node),
            generation: watch::channel(0).0,
            settings: settings.clone(),
            stale,
        });
        let watch = WatchSettings {
            timeout: settings.connect_timeout.max(settings.response_timeout),
            max_backoff: settings.max_backoff,
            health_interval: HEALTH_INTERVAL,
        };
        let mut rx = watch_switch_master(sentinels, service, watch, cancel.clone());
        let weak = Arc::downgrade(&followed);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    changed = rx.changed() => if changed.is_err() { return },
                }
                let next = rx.borrow_and_update().clone();
                let (Some((host, port)), Some(f)) = (next, weak.upgrade()) else {
                    continue;
                };
                if let Err(e) = f.switch_to(&host, port) {
                    tracing::warn!(error = %e, "cannot follow the new primary");
                }
            }
        });
        followed
    }

    /// The current primary.
    pub(crate) fn node(&self) -> Arc<Node> {
        self.current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// A client for the current primary (the hub subscribes there).
    pub(crate) fn client(&self) -> redis::Client {
        self.node().pool.client().clone()
    }

    /// Changes whenever the primary does.
    pub(crate) fn switched(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    fn switch_to(&self, host: &str, port: u16) -> Result<(), Error> {
        let client = client_at(&self.template, host, port)?;
        let addr = addr_of(&client);
        if self.node().addr == addr {
            return Ok(());
        }
        let manager = super::connection::lazy_manager(&client, &self.settings)?;
        let pool = Pool::new(client, self.settings.clone(), self.stale.clone(), "PUBLISH");
        let node = Node::new(manager, pool, addr.clone(), "PUBLISH", self.stale.clone());
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = node;
        self.generation.send_modify(|g| *g += 1);
        tracing::info!(primary = %addr, "the Sentinels named a new primary; following it");
        Ok(())
    }
}

fn addr_of(client: &redis::Client) -> String {
    client.get_connection_info().addr().to_string()
}
