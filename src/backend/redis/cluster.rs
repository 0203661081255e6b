//! Redis Cluster routing (feature `cluster`): baton's own slot map, and a [`Node`] (a
//! multiplexed connection and a pool of dedicated ones) per primary.
//!
//! redis-rs' cluster client is not used for commands: it sends `WATCH` on shared per-node
//! multiplexed connections (where another task's `EXEC` ends it), has no transactions, and hides
//! which node a key went to. baton reads the slot map itself (`CLUSTER SLOTS`, asked of the
//! known primaries and the seeds), places a key by CRC16 of its hash
//! tag ([`crate::util::slot`]), and sends each operation to the primary that owns the slot.
//!
//! A reply that says the map is out of date (`MOVED`, `TRYAGAIN`, `CLUSTERDOWN`, `READONLY`, a
//! dropped connection, a timeout) marks it [`Stale`]; the next lookup starts a refresh in the
//! background and waits for it at most one refresh round (at most one read per [`MIN_REFRESH`]
//! while the cluster settles, e.g. while a failover promotes a replica). A refresh asks
//! [`FANOUT`] nodes at once and takes the first full answer, so a node that hangs (paused,
//! swapping) never stalls it, nor any lookup. The refused operation fails with a retryable
//! error; its caller backs off and observes again on the new owner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use redis::{ConnectionAddr, Value};
use tokio::time::Instant;

use super::node::{Node, Redirects};
use super::pool::Pool;
use super::stale::Stale;
use super::ConnSettings;
use crate::error::{Error, ErrorKind};
use crate::util::lock;
use crate::util::slot::{slot, SLOTS};

/// Fewest time between two reads of the slot map (a dead primary marks the map stale on every
/// request until the cluster promotes its replica).
pub(crate) const MIN_REFRESH: Duration = Duration::from_millis(100);

/// How to reach each primary of the last slot map (the hub's seeds: they answered lately,
/// unlike a seed that may hang).
pub(crate) type Primaries = Arc<Vec<redis::ConnectionInfo>>;

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

/// How many nodes are asked for the slot map at once. A hung node (paused, swapping) answers
/// nothing until its timeout: asked alone, one after another, it would hold every lookup; asked
/// beside others, the first good answer wins and the hung one is simply dropped.
const FANOUT: usize = 3;

/// Where the background refresh stands.
#[derive(Default)]
struct RefreshState {
    /// A refresh task is running (or sleeping until [`MIN_REFRESH`] has passed).
    running: bool,
    /// When the last refresh started.
    last: Option<Instant>,
}

/// The routing of one client over a cluster.
pub(crate) struct Cluster {
    /// This router, for the refresh task and the nodes' `ASK` redirects (which must not keep
    /// it alive).
    me: Weak<Cluster>,
    /// What every node connection is built from (credentials, TLS, protocol): a seed's client,
    /// with the address replaced.
    template: redis::Client,
    /// The seed nodes, as given.
    seeds: Vec<redis::Client>,
    settings: ConnSettings,
    map: RwLock<Arc<SlotMap>>,
    /// Nodes by `host:port`, kept across refreshes so their connections are reused.
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    refresh: Mutex<RefreshState>,
    /// Bumped when a refresh ends (whatever it found): lookups that wait for one watch it.
    refreshed: tokio::sync::watch::Sender<u64>,
    stale: Arc<Stale>,
    /// The primaries of the slot map; receivers are told when a refresh finds another layout
    /// than before (a failover, a reshard).
    moved: tokio::sync::watch::Sender<Primaries>,
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
        let cluster = Arc::new_cyclic(|me| Cluster {
            me: me.clone(),
            template,
            seeds,
            settings,
            map: RwLock::default(),
            nodes: Mutex::default(),
            refresh: Mutex::default(),
            refreshed: tokio::sync::watch::channel(0).0,
            stale: Arc::default(),
            moved: tokio::sync::watch::channel(Primaries::default()).0,
        });
        lock(&cluster.refresh).last = Some(Instant::now());
        let ranges = cluster.fetch().await?;
        cluster.install(ranges)?;
        Ok(cluster)
    }

    /// The primary that serves `key`'s slot. When the map was marked stale, a refresh is
    /// started (in the background: a lookup never waits for a hung node) and awaited for at
    /// most one refresh round; if it has not ended by then, the last map answers (a request
    /// sent by it at worst meets the same trouble again, and is retried).
    pub(crate) async fn node(&self, key: &str) -> Result<Arc<Node>, Error> {
        if self.stale.is_set() {
            let mut refreshed = self.refreshed.subscribe();
            refreshed.mark_unchanged();
            self.start_refresh();
            let round = self.settings.connect_timeout + self.settings.response_timeout;
            let _ = tokio::time::timeout(MIN_REFRESH + round, refreshed.changed()).await;
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

    /// Changes whenever a refresh finds another layout than before (for the hub), and holds
    /// the primaries of the last map.
    pub(crate) fn moved(&self) -> tokio::sync::watch::Receiver<Primaries> {
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

    /// Starts a refresh task unless one is running. It waits until [`MIN_REFRESH`] has passed
    /// since the last one began (while a failover settles, every request marks the map stale),
    /// then reads the map; the mark is cleared when it starts, so a mark made meanwhile leads
    /// to another refresh. It runs on its own, so a caller that gives up does not abandon it,
    /// and holds the router only weakly while it waits.
    fn start_refresh(&self) {
        let wait = {
            let mut state = lock(&self.refresh);
            if state.running {
                return;
            }
            state.running = true;
            state
                .last
                .map(|t| MIN_REFRESH.saturating_sub(t.elapsed()))
                .unwrap_or_default()
        };
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let Some(cluster) = me.upgrade() else { return };
            {
                let mut state = lock(&cluster.refresh);
                state.last = Some(Instant::now());
            }
            cluster.stale.clear();
            let fetched = cluster.fetch().await;
            let outcome = fetched.and_then(|ranges| cluster.install(ranges));
            if let Err(e) = outcome {
                cluster.stale.set();
                tracing::warn!(error = %e, "cannot read the cluster's slot map; the last one stays in use");
            }
            lock(&cluster.refresh).running = false;
            cluster.refreshed.send_modify(|g| *g = g.wrapping_add(1));
        });
    }

    /// Makes `ranges` (a full `CLUSTER SLOTS` answer) the slot map, reusing the nodes already
    /// known; tells the hub when the primaries changed.
    fn install(&self, ranges: Vec<(u16, u16, String, u16)>) -> Result<(), Error> {
        let map = {
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
            map
        };
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
        let changed = !old.ranges.is_empty() && layout(&old) != new;
        if changed {
            tracing::info!("the cluster's slot map changed");
        }
        let primaries: Primaries = Arc::new(
            self.primaries()
                .iter()
                .map(|n| n.pool.client().get_connection_info().clone())
                .collect(),
        );
        // The first map is recorded without telling anyone: nothing moved.
        self.moved.send_if_modified(|p| {
            *p = primaries;
            changed
        });
        Ok(())
    }

    /// Asks the known primaries, then the seeds, for `CLUSTER SLOTS`, [`FANOUT`] at a time
    /// (another one joins as soon as one fails); the first full answer wins and the others
    /// are dropped.
    async fn fetch(&self) -> Result<Vec<(u16, u16, String, u16)>, Error> {
        let mut candidates: Vec<(String, redis::Client)> = self
            .primaries()
            .iter()
            .filter_map(|n| Some((n.addr.clone(), self.client_for_addr(&n.addr)?)))
            .collect();
        for seed in &self.seeds {
            let addr = seed.get_connection_info().addr().to_string();
            if !candidates.iter().any(|(a, _)| *a == addr) {
                candidates.push((addr, seed.clone()));
            }
        }
        let mut waiting = candidates.into_iter().map(|(_, c)| c);
        // Each question runs as its own task: dropping the set (a good answer came) aborts
        // the others.
        let mut asking = tokio::task::JoinSet::new();
        for c in waiting.by_ref().take(FANOUT) {
            asking.spawn(ask(self.settings.clone(), c));
        }
        let mut last_err = None;
        while let Some(answer) = asking.join_next().await {
            match answer {
                Ok(Ok(ranges)) => return Ok(ranges),
                Ok(Err(e)) => last_err = Some(e),
                Err(_) => {}
            }
            if let Some(c) = waiting.next() {
                asking.spawn(ask(self.settings.clone(), c));
            }
        }
        Err(last_err.unwrap_or(Error::Connection {
            message: "no cluster node to ask for the slot map".into(),
            source: None,
        }))
    }

    /// A client for `host:port` with the template's credentials, TLS and protocol.
    fn client_for(&self, host: &str, port: u16) -> Result<redis::Client, Error> {
        super::node::client_at(&self.template, host, port)
    }

    fn client_for_addr(&self, addr: &str) -> Option<redis::Client> {
        let (host, port) = addr.rsplit_once(':')?;
        self.client_for(host, port.parse().ok()?).ok()
    }

    fn open_node(&self, host: &str, port: u16, addr: &str) -> Result<Arc<Node>, Error> {
        let client = self.client_for(host, port)?;
        let manager = super::connection::lazy_manager(&client, &self.settings)?;
        let pool = Pool::new(
            client,
            self.settings.clone(),
            self.stale.clone(),
            "SPUBLISH",
        );
        let node = Node::new(
            manager,
            pool,
            addr.to_string(),
            "SPUBLISH",
            self.stale.clone(),
        );
        let me: Weak<dyn Redirects> = self.me.clone();
        node.follow_redirects(me);
        Ok(node)
    }
}

impl Redirects for Cluster {
    /// The node at `addr`: a primary of the map, or (a slot migrating to a node that serves
    /// none yet) a node opened for the purpose and kept until the next refresh.
    fn node_at(&self, addr: &str) -> Option<Arc<Node>> {
        let mut nodes = lock(&self.nodes);
        if let Some(n) = nodes.get(addr) {
            return Some(n.clone());
        }
        let (host, port) = addr.rsplit_once(':')?;
        let node = self.open_node(host, port.parse().ok()?, addr).ok()?;
        nodes.insert(addr.to_string(), node.clone());
        Some(node)
    }
}

/// `CLUSTER SLOTS` on a short-lived connection to `client`'s node, within one connect and
/// one response timeout.
async fn ask(
    settings: ConnSettings,
    client: redis::Client,
) -> Result<Vec<(u16, u16, String, u16)>, Error> {
    let config = super::connection::async_config(&settings);
    let limit = settings.connect_timeout + settings.response_timeout;
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
    parse_slots(&reply, &asked_host)
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
