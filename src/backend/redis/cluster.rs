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
//! [`FANOUT`] nodes at once, each within its own deadline, and waits at most [`SETTLE`] for the
//! others once the first full answer came, so a node that hangs (paused, swapping) never stalls
//! it, nor any lookup. The refused operation fails with a retryable error; its caller backs off
//! and observes again on the new owner.
//!
//! The first answer is not always the right one: a primary resumed after a pause (or cut off
//! by a partition) still serves `CLUSTER SLOTS` from its own view, which says it owns slots its
//! replica took over meanwhile, until it hears from the new owner. Taken as the map, it would
//! route every operation on those slots to a node that answers `MOVED` (or, for a moment,
//! accepts a read). Redis resolves such conflicts by config epoch: the claim with the higher
//! one wins, and a promoted replica claims its slots with a new epoch above every other. So
//! each node is also asked `CLUSTER NODES`, which gives the config epoch of every primary in
//! its view, and the answer whose view holds the newest claim is taken ([`choose`]); among
//! answers as new as each other, the one most nodes gave; then the first.

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

/// How long a refresh waits, once a first full answer came, for the other nodes it asked, to
/// compare their views ([`choose`]). Healthy nodes answer within a round trip (well under a
/// millisecond on one network); a node that has not answered by then is probably hung, and its
/// answer is not waited for. A stale answer is taken only if every node with a newer view is
/// slower than this, and the map is then corrected by the next `MOVED`.
const SETTLE: Duration = Duration::from_millis(50);

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

    /// Asks the known primaries, then the seeds, for `CLUSTER SLOTS` (and `CLUSTER NODES`),
    /// [`FANOUT`] at a time (another one joins as soon as one fails). Once a full answer has
    /// come, the others get [`SETTLE`] more to arrive; the newest view among those in hand wins
    /// ([`choose`]), and the questions still open are dropped.
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
        // Each question runs as its own task: dropping the set (the answers are in) aborts
        // the others.
        let mut asking = tokio::task::JoinSet::new();
        for c in waiting.by_ref().take(FANOUT) {
            asking.spawn(ask(self.settings.clone(), c));
        }
        let mut answers = Vec::new();
        let mut settle_by: Option<Instant> = None;
        let mut last_err = None;
        loop {
            // Bounded: each question ends by its own deadline (`ask`), and once an answer is
            // in, the loop ends at `settle_by` whatever is still open.
            let next = match settle_by {
                None => asking.join_next().await,
                Some(by) => match tokio::time::timeout_at(by, asking.join_next()).await {
                    Ok(next) => next,
                    Err(_) => break,
                },
            };
            let Some(answer) = next else { break };
            match answer {
                Ok(Ok(a)) => {
                    settle_by.get_or_insert_with(|| Instant::now() + SETTLE);
                    answers.push(a);
                }
                Ok(Err(e)) => last_err = Some(e),
                Err(_) => {}
            }
            if answers.is_empty() {
                if let Some(c) = waiting.next() {
                    asking.spawn(ask(self.settings.clone(), c));
                }
            }
        }
        let first = answers.first().map(|a| a.ranges.clone());
        match choose(answers) {
            Some(chosen) => {
                if first.as_ref() != Some(&chosen.ranges) {
                    tracing::debug!(
                        epoch = chosen.epoch,
                        "a node answered with an older slot map than another; the newer one is used"
                    );
                }
                Ok(chosen.ranges)
            }
            None => Err(last_err.unwrap_or(Error::Connection {
                message: "no cluster node to ask for the slot map".into(),
                source: None,
            })),
        }
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

/// One node's answer to a refresh: its slot map, and how new its view is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Answer {
    /// The full map, sorted by first slot (as [`parse_slots`] gives it, then sorted, so that
    /// two nodes' identical maps compare equal).
    ranges: Vec<(u16, u16, String, u16)>,
    /// The highest config epoch among the primaries that serve slots in this node's view
    /// ([`view_epoch`]); `None` when the node did not say (an ACL user without
    /// `+cluster|nodes`, an unreadable reply): such an answer ranks below any that did.
    epoch: Option<u64>,
}

/// Which of `answers` (in the order they arrived) becomes the slot map: the one with the
/// highest epoch (its view holds the newest slot claim; see the module docs); among those
/// with the same epoch, the one whose map most of them gave; then the first to arrive.
/// `None` only for no answers at all.
fn choose(answers: Vec<Answer>) -> Option<Answer> {
    let agreeing = |a: &Answer| {
        answers
            .iter()
            .filter(|b| b.epoch == a.epoch && b.ranges == a.ranges)
            .count()
    };
    let best = answers
        .iter()
        .enumerate()
        // `max_by_key` keeps the last of equal keys: the reversed index makes it the first.
        .max_by_key(|(i, a)| (a.epoch, agreeing(a), std::cmp::Reverse(*i)))
        .map(|(i, _)| i)?;
    answers.into_iter().nth(best)
}

/// The highest config epoch among the nodes that serve at least one slot in a `CLUSTER NODES`
/// reply (`<id> <ip:port@cport[,hostname]> <flags> <primary> <ping-sent> <pong-recv>
/// <config-epoch> <link-state> <slot> <slot> ...`): the newest slot claim this node has
/// accepted. Migration markers (`[slot->-id]`, `[slot-<-id]`) are not slots served. `None`
/// when no line serves a slot or none parses.
fn view_epoch(nodes: &str) -> Option<u64> {
    nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let serves = fields
                .get(8..)
                .is_some_and(|slots| slots.iter().any(|s| !s.starts_with('[')));
            if !serves {
                return None;
            }
            fields.get(6)?.parse::<u64>().ok()
        })
        .max()
}

/// `CLUSTER SLOTS` and `CLUSTER NODES` on a short-lived connection to `client`'s node (one
/// round trip: both are written before either reply is read), within one connect and one
/// response timeout. Only `CLUSTER SLOTS` must succeed: without `CLUSTER NODES` (a refusal, an
/// odd reply) the answer has no epoch.
async fn ask(settings: ConnSettings, client: redis::Client) -> Result<Answer, Error> {
    let config = super::connection::async_config(&settings);
    let limit = settings.connect_timeout + settings.response_timeout;
    let asked_host = match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(h, _) | ConnectionAddr::TcpTls { host: h, .. } => h.clone(),
        other => other.to_string(),
    };
    let (slots, nodes) = match tokio::time::timeout(limit, async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let mut same = conn.clone();
        // Two handles on one multiplexed connection: both requests share its socket, so they
        // leave together and the node answers them from one view.
        let (mut slots, mut nodes) = (redis::cmd("CLUSTER"), redis::cmd("CLUSTER"));
        slots.arg("SLOTS");
        nodes.arg("NODES");
        let (slots, nodes) = tokio::join!(
            slots.query_async::<Value>(&mut conn),
            nodes.query_async::<Value>(&mut same),
        );
        Ok::<_, redis::RedisError>((slots?, nodes))
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
    let mut ranges = parse_slots(&slots, &asked_host)?;
    ranges.sort_by_key(|(start, _, _, _)| *start);
    let epoch = match nodes {
        Ok(Value::BulkString(b)) => view_epoch(&String::from_utf8_lossy(&b)),
        Ok(Value::VerbatimString { text, .. }) => view_epoch(&text),
        Ok(Value::SimpleString(text)) => view_epoch(&text),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(error = %e, "CLUSTER NODES refused; the node's slot map has no epoch");
            None
        }
    };
    Ok(Answer { ranges, epoch })
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

    /// A full map whose first range is served by `first` (port), the rest by 7001 and 7002.
    fn map(first: u16) -> Vec<(u16, u16, String, u16)> {
        vec![
            (0, 5460, "127.0.0.1".into(), first),
            (5461, 10922, "127.0.0.1".into(), 7001),
            (10923, 16383, "127.0.0.1".into(), 7002),
        ]
    }

    fn answer(first: u16, epoch: Option<u64>) -> Answer {
        Answer {
            ranges: map(first),
            epoch,
        }
    }

    #[test]
    fn the_answer_with_the_highest_epoch_wins_whichever_came_first() {
        // A primary resumed after a pause (7000, its view's newest claim at epoch 6) and a node
        // that saw its replica (7003) take its slots at epoch 7.
        let stale = answer(7000, Some(6));
        let fresh = answer(7003, Some(7));
        assert_eq!(
            choose(vec![stale.clone(), fresh.clone()]),
            Some(fresh.clone())
        );
        assert_eq!(choose(vec![fresh.clone(), stale]), Some(fresh));
    }

    #[test]
    fn the_highest_epoch_wins_over_a_majority_of_older_views() {
        let fresh = answer(7003, Some(7));
        let answers = vec![answer(7000, Some(6)), answer(7000, Some(6)), fresh.clone()];
        assert_eq!(choose(answers), Some(fresh));
    }

    #[test]
    fn among_equal_epochs_the_map_most_nodes_gave_wins_then_the_first() {
        let a = answer(7000, Some(7));
        let b = answer(7003, Some(7));
        assert_eq!(
            choose(vec![a.clone(), b.clone(), b.clone()]),
            Some(b.clone())
        );
        assert_eq!(choose(vec![a.clone(), b.clone()]), Some(a.clone()));
        assert_eq!(choose(vec![b.clone(), a.clone()]), Some(b.clone()));
        // Without epochs (an ACL user without `+cluster|nodes`): the same rule.
        let (a, b) = (answer(7000, None), answer(7003, None));
        assert_eq!(
            choose(vec![a.clone(), b.clone(), b.clone()]),
            Some(b.clone())
        );
        assert_eq!(choose(vec![a.clone(), b]), Some(a));
    }

    #[test]
    fn an_answer_with_an_epoch_ranks_above_one_without() {
        let known = answer(7000, Some(1));
        let answers = vec![answer(7003, None), answer(7003, None), known.clone()];
        assert_eq!(choose(answers), Some(known));
    }

    #[test]
    fn a_single_answer_is_taken_and_none_gives_none() {
        let only = answer(7000, None);
        assert_eq!(choose(vec![only.clone()]), Some(only));
        assert_eq!(choose(Vec::new()), None);
    }

    #[test]
    fn the_view_epoch_is_the_highest_config_epoch_of_a_node_serving_slots() {
        // A resumed primary's view: it still serves 0-5460 at epoch 1; its replica (which was
        // promoted at epoch 7 elsewhere) is still a replica here.
        let stale = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master - 0 1700000000000 2 connected 5461-10922 [5461->-c3]
c3 127.0.0.1:7002@17002,host.example master - 0 1700000000000 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1700000000000 1 connected
";
        assert_eq!(view_epoch(stale), Some(3));
        // The new owner's view: 7003 serves the slots at epoch 7; the old primary lost them
        // (failed, no slots) and a node serving only a migration marker counts for nothing.
        let fresh = "\
a1 127.0.0.1:7000@17000 master,fail - 0 0 1 disconnected
b2 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 0 3 connected 10923-16383
d4 127.0.0.1:7003@17003 myself,master - 0 0 7 connected 0-5460
e5 127.0.0.1:7004@17004 master - 0 0 9 connected [100-<-d4]
";
        assert_eq!(view_epoch(fresh), Some(7));
        for odd in [
            "",
            "garbage",
            "a1 127.0.0.1:7000@17000 master - 0 0 x connected 0-16383",
            "a1 127.0.0.1:7000@17000 master - 0 0 5 connected",
        ] {
            assert_eq!(view_epoch(odd), None, "{odd:?}");
        }
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
