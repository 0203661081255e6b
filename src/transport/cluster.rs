//! Redis Cluster routing (feature `cluster`): baton's own slot map, and a [`Node`] (a
//! multiplexed connection and a pool of dedicated ones) per primary.
//!
//! redis-rs' cluster client is not used for commands: it sends `WATCH` on shared per-node
//! multiplexed connections (where another task's `EXEC` ends it), has no transactions, and hides
//! which node a key went to. baton reads the slot map itself (`CLUSTER SLOTS`, asked of any node
//! that answers: the known primaries first, then the seeds), places a key by CRC16 of its hash
//! tag ([`crate::util::slot`]), and sends each operation to the primary that owns the slot.
//!
//! A reply that says the map is out of date (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`,
//! `READONLY`, a dropped connection) marks it [`Stale`]; the next lookup reads the map again (at
//! most one read per [`MIN_REFRESH`] while the cluster settles, e.g. while a failover promotes a
//! replica). The refused operation fails with a retryable error; its caller backs off and
//! observes again on the new owner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use redis::{ConnectionAddr, Value};
use tokio::time::Instant;

use super::connection::Pool;
use super::route::{Node, Stale};
use super::ConnSettings;
use crate::error::{Error, ErrorKind};
use crate::util::lock;
use crate::util::slot::{slot, SLOTS};

/// Fewest time between two reads of the slot map (a dead primary marks the map stale on every
/// request until the cluster promotes its replica).
pub(crate) const MIN_REFRESH: Duration = Duration::from_millis(100);

/// Which primary serves each slot: `(first slot, last slot, node)`, sorted by first slot.
#[derive(Default)]
struct SlotMap {
    ranges: Vec<(u16, u16, Arc<Node>)>,
}

impl SlotMap {
    fn owner(&self, slot: u16) -> Option<&Arc<Node>> {
        let i = self.ranges.partition_point(|(_, end, _)| *end < slot);
        self.ranges
            .get(i)
            .filter(|(start, _, _)| *start <= slot)
            .map(|(_, _, n)| n)
    }
}

/// The routing of one client over a cluster.
pub(crate) struct Cluster {
    /// What every node connection is built from (credentials, TLS, protocol): a seed's client,
    /// with the address replaced.
    template: redis::Client,
    /// The seed nodes, as given.
    seeds: Vec<redis::Client>,
    settings: ConnSettings,
    map: RwLock<Arc<SlotMap>>,
    /// Nodes by `host:port`, kept across refreshes so their connections are reused.
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    /// Serializes refreshes; holds when the last one ended.
    refreshing: tokio::sync::Mutex<Option<Instant>>,
    stale: Arc<Stale>,
    /// Bumped when a refresh finds other primaries than before.
    moved: tokio::sync::watch::Sender<u64>,
}

impl Cluster {
    /// Reads the slot map from the first seed that answers.
    ///
    /// # Errors
    /// The last seed's error when none answers with a slot map (a permission error for bad
    /// credentials, a connection error when all are down, `UnexpectedReply` for a server that
    /// is not in cluster mode).
    pub(crate) async fn connect(
        seeds: Vec<redis::Client>,
        settings: ConnSettings,
    ) -> Result<Arc<Cluster>, Error> {
        let template = seeds.first().cloned().ok_or_else(|| {
            Error::Config(crate::error::ConfigError::invalid(
                "url",
                "a cluster needs at least one seed node",
            ))
        })?;
        let cluster = Arc::new(Cluster {
            template,
            seeds,
            settings,
            map: RwLock::default(),
            nodes: Mutex::default(),
            refreshing: tokio::sync::Mutex::new(None),
            stale: Arc::default(),
            moved: tokio::sync::watch::channel(0).0,
        });
        cluster.refresh(true).await?;
        Ok(cluster)
    }

    /// The primary that serves `key`'s slot (refreshing the map first if it was marked stale).
    pub(crate) async fn node(&self, key: &str) -> Result<Arc<Node>, Error> {
        if self.stale.is_set() {
            self.refresh(false).await?;
        }
        let slot = slot(key.as_bytes());
        let map = self
            .map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match map.owner(slot) {
            Some(n) => Ok(n.clone()),
            None => {
                self.stale.set();
                Err(Error::Redis {
                    kind: ErrorKind::Busy,
                    code: "CLUSTERDOWN".into(),
                    message: format!("no primary serves hash slot {slot} in the last slot map"),
                    source: None,
                })
            }
        }
    }

    /// Changes whenever a refresh finds other primaries than before (for the hub).
    pub(crate) fn moved(&self) -> tokio::sync::watch::Receiver<u64> {
        self.moved.subscribe()
    }

    /// Every primary of the last slot map, once each.
    pub(crate) fn primaries(&self) -> Vec<Arc<Node>> {
        let map = self
            .map
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut out: Vec<Arc<Node>> = Vec::new();
        for (_, _, n) in &map.ranges {
            if !out.iter().any(|o| Arc::ptr_eq(o, n)) {
                out.push(n.clone());
            }
        }
        out
    }

    /// Reads the slot map again. With `must`, an error is returned when no node answers;
    /// otherwise the old map stays in use (and stays marked stale) and only a map with no
    /// primary at all is an error.
    async fn refresh(&self, must: bool) -> Result<(), Error> {
        let mut last = self.refreshing.lock().await;
        if !must {
            if !self.stale.is_set() {
                // Another task refreshed while this one waited.
                return Ok(());
            }
            if last.is_some_and(|t| t.elapsed() < MIN_REFRESH) {
                return Ok(());
            }
        }
        self.stale.clear();
        let fetched = self.fetch().await;
        *last = Some(Instant::now());
        match fetched {
            Ok(map) => {
                tracing::debug!(ranges = map.ranges.len(), "cluster slot map read");
                let layout = |m: &SlotMap| -> Vec<(u16, u16, String)> {
                    m.ranges
                        .iter()
                        .map(|(s, e, n)| (*s, *e, n.addr.clone()))
                        .collect()
                };
                let new = layout(&map);
                let old = std::mem::replace(
                    &mut *self
                        .map
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner),
                    Arc::new(map),
                );
                if !old.ranges.is_empty() && layout(&old) != new {
                    tracing::info!("the cluster's slot map changed");
                    self.moved.send_modify(|g| *g += 1);
                }
                Ok(())
            }
            Err(e) => {
                self.stale.set();
                tracing::warn!(error = %e, "cannot read the cluster's slot map");
                let empty = self
                    .map
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .ranges
                    .is_empty();
                if must || empty {
                    Err(e)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Asks the known primaries, then the seeds, for `CLUSTER SLOTS`; the first full answer wins.
    async fn fetch(&self) -> Result<SlotMap, Error> {
        let mut candidates: Vec<redis::Client> = self
            .primaries()
            .iter()
            .filter_map(|n| self.client_for_addr(&n.addr))
            .collect();
        candidates.extend(self.seeds.iter().cloned());
        let mut last_err = None;
        for c in candidates {
            match self.ask(&c).await {
                Ok(map) => return Ok(map),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.unwrap_or(Error::Connection {
            message: "no cluster node to ask for the slot map".into(),
            source: None,
        }))
    }

    /// `CLUSTER SLOTS` on a short-lived connection to `client`'s node.
    async fn ask(&self, client: &redis::Client) -> Result<SlotMap, Error> {
        let config = self.settings.async_config();
        let limit = self.settings.connect_timeout + self.settings.response_timeout;
        let asked_host = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(h, _) | ConnectionAddr::TcpTls { host: h, .. } => h.clone(),
            other => other.to_string(),
        };
        let reply: Value = match tokio::time::timeout(limit, async {
            let mut conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async::<Value>(&mut conn)
                .await
        })
        .await
        {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::Timeout {
                    during: "reading the cluster's slot map",
                })
            }
        };
        let ranges = parse_slots(&reply, &asked_host)?;
        let mut nodes = lock(&self.nodes);
        let mut map = SlotMap::default();
        for (start, end, host, port) in ranges {
            let addr = format!("{host}:{port}");
            let node = match nodes.get(&addr) {
                Some(n) => n.clone(),
                None => {
                    let n = self.open_node(&host, port, &addr)?;
                    nodes.insert(addr, n.clone());
                    n
                }
            };
            map.ranges.push((start, end, node));
        }
        map.ranges.sort_by_key(|(start, _, _)| *start);
        // Nodes that serve no slot any more (a demoted primary) are let go.
        nodes.retain(|_, n| map.ranges.iter().any(|(_, _, m)| Arc::ptr_eq(n, m)));
        Ok(map)
    }

    /// A client for `host:port` with the template's credentials, TLS and protocol.
    fn client_for(&self, host: &str, port: u16) -> Result<redis::Client, Error> {
        super::route::client_at(&self.template, host, port)
    }

    fn client_for_addr(&self, addr: &str) -> Option<redis::Client> {
        let (host, port) = addr.rsplit_once(':')?;
        self.client_for(host, port.parse().ok()?).ok()
    }

    fn open_node(&self, host: &str, port: u16, addr: &str) -> Result<Arc<Node>, Error> {
        let client = self.client_for(host, port)?;
        let manager = super::lazy_manager(&client, &self.settings)?;
        let pool = Pool::new(
            client,
            self.settings.clone(),
            self.stale.clone(),
            "SPUBLISH",
        );
        Ok(Node::new(
            manager,
            pool,
            addr.to_string(),
            "SPUBLISH",
            self.stale.clone(),
        ))
    }
}

/// The ranges of a `CLUSTER SLOTS` reply: `(first, last, host, port)` of each range's primary.
/// An empty or `?` host means the node that was asked (`asked_host`). The ranges must cover all
/// 16384 slots: a partial map (a node still joining) is refused, so another node is asked.
fn parse_slots(reply: &Value, asked_host: &str) -> Result<Vec<(u16, u16, String, u16)>, Error> {
    let bad = || super::classify::unexpected("CLUSTER SLOTS", reply);
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let mut out = Vec::with_capacity(items.len());
    let mut covered = 0usize;
    for item in items {
        let Value::Array(parts) = item else {
            return Err(bad());
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(primary))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return Err(bad());
        };
        let host = match primary.first() {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => return Err(bad()),
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.to_string()
        } else {
            host
        };
        let Some(Value::Int(port)) = primary.get(1) else {
            return Err(bad());
        };
        let (Ok(start), Ok(end), Ok(port)) = (
            u16::try_from(*start),
            u16::try_from(*end),
            u16::try_from(*port),
        ) else {
            return Err(bad());
        };
        if start > end || end >= SLOTS || port == 0 {
            return Err(bad());
        }
        covered += usize::from(end - start) + 1;
        out.push((start, end, host, port));
    }
    if covered != usize::from(SLOTS) {
        return Err(Error::Redis {
            kind: ErrorKind::Busy,
            code: "CLUSTERDOWN".into(),
            message: format!("the slot map covers {covered} of {SLOTS} slots"),
            source: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(start: i64, end: i64, host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::Int(start),
            Value::Int(end),
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ]),
        ])
    }

    #[test]
    fn a_full_slot_map_is_parsed_and_an_empty_host_is_the_asked_node() {
        let reply = Value::Array(vec![
            range(0, 5460, "127.0.0.1", 7000),
            range(5461, 10922, "", 7001),
            range(10923, 16383, "?", 7002),
        ]);
        let r = parse_slots(&reply, "10.0.0.9").unwrap();
        assert_eq!(r[0], (0, 5460, "127.0.0.1".into(), 7000));
        assert_eq!(r[1], (5461, 10922, "10.0.0.9".into(), 7001));
        assert_eq!(r[2], (10923, 16383, "10.0.0.9".into(), 7002));
    }

    #[test]
    fn partial_or_odd_slot_maps_are_refused_without_panicking() {
        let partial = Value::Array(vec![range(0, 100, "h", 1)]);
        assert_eq!(
            parse_slots(&partial, "h").unwrap_err().kind(),
            ErrorKind::Busy
        );
        for odd in [
            Value::Nil,
            Value::Array(vec![Value::Int(3)]),
            Value::Array(vec![range(0, 16384, "h", 1)]),
            Value::Array(vec![range(10, 5, "h", 1)]),
            Value::Array(vec![range(0, 16383, "h", 0)]),
            Value::Array(vec![range(0, 16383, "h", 70000)]),
            Value::Array(vec![range(-1, 16383, "h", 1)]),
        ] {
            assert!(parse_slots(&odd, "h").is_err(), "{odd:?}");
        }
    }
}
