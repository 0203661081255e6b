//! A private Redis Cluster for tests: six [`RedisServer`]s (three primaries, three replicas) on
//! loopback, joined with `redis-cli --cluster create`.
//!
//! Every node is an ordinary [`RedisServer`] started with `cluster-enabled yes`, so everything
//! that fixture offers applies node by node: [`RedisServer::kill`] a primary to see its replica
//! promoted, [`RedisServer::pause`] one to simulate a partition, and dropping the
//! [`RedisCluster`] stops and cleans up all six (none outlives the test process either).
//!
//! The nodes run with a short `cluster-node-timeout` (1 s), so a killed primary is failed over
//! within a few seconds instead of the default 15+.
//!
//! ```no_run
//! use baton::testing::RedisCluster;
//!
//! # fn main() -> std::io::Result<()> {
//! let mut cluster = RedisCluster::start()?;
//! let owner = cluster.node_for_key(b"foo").expect("all slots are served");
//! println!("foo lives on {}", cluster.nodes()[owner].url());
//! cluster.node_mut(owner).kill(); // its replica takes over
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::io;

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::binaries::find_binary;
use super::process::{is_executable, read_log_from, reap, spawn_dying_with_process, wait_bounded};
use super::redis::PortChoice;
use super::{Flavor, RedisServer, RedisServerBuilder};

pub use super::internals::SLOTS;
/// How many primaries the cluster has; each gets one replica.
const PRIMARIES: usize = 3;
/// How many nodes the cluster has.
const NODES: usize = PRIMARIES * 2;
/// `cluster-node-timeout` of every node, in milliseconds.
const NODE_TIMEOUT_MS: &str = "1000";
/// How long [`RedisClusterBuilder::start`] waits for the cluster to become healthy.
const HEALTHY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long `redis-cli --cluster create` may take.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);
/// The output of `redis-cli --cluster create`, in the first node's data directory.
const CREATE_LOG: &str = "cluster-create.log";
/// Delay between two health probes.
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Connect and I/O timeout of the fixture's own queries to a node.
const QUERY_TIMEOUT: Duration = Duration::from_millis(500);

/// Configures and starts a [`RedisCluster`].
///
/// Obtained from [`RedisCluster::builder`]. Every setting applies to all six nodes.
#[derive(Debug, Clone, Default)]
pub struct RedisClusterBuilder {
    node: RedisServerBuilder,
}

impl RedisClusterBuilder {
    /// Sets which server the nodes run. Defaults to [`Flavor::Redis`].
    pub fn flavor(mut self, flavor: Flavor) -> Self {
        self.node = self.node.flavor(flavor);
        self
    }

    /// Adds a least-privilege user on every node, as [`RedisServerBuilder::acl_user`] does;
    /// [`RedisServer::url_for`] of a node (or [`RedisCluster::cluster_url_for`]) logs in as it.
    /// The default user stays the passwordless administrator the fixture sets the cluster up as.
    pub fn acl_user(mut self, name: &str, password: &str, prefix: &str) -> Self {
        self.node = self.node.acl_user(name, password, prefix);
        self
    }

    /// Adds an extra `--name value` pair to every node's command line (after the fixture's own
    /// cluster settings, so it overrides them), e.g. `.arg("cluster-node-timeout", "2000")`.
    ///
    /// `requirepass` is not supported (the fixture sets the cluster up as the default user,
    /// without a password): use [`acl_user`](Self::acl_user) for authenticated connections.
    pub fn arg(mut self, name: &str, value: &str) -> Self {
        self.node = self.node.arg(name, value);
        self
    }

    /// Starts six nodes, joins them with `redis-cli --cluster create … --cluster-replicas 1`,
    /// and waits (up to 20 s) until the cluster is [healthy](RedisCluster::wait_healthy).
    ///
    /// # Errors
    ///
    /// Fails if a node cannot be started (see [`RedisServerBuilder::start`]), if `redis-cli`
    /// cannot be found or fails (its output is quoted), if the cluster does not become healthy
    /// in time, or if the roles it ends up with are not three primaries covering all slots,
    /// each with one replica. Nodes started so far are stopped again.
    pub fn start(self) -> io::Result<RedisCluster> {
        if self
            .node
            .args
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("requirepass"))
            || self.node.password.is_some()
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "RedisCluster does not support requirepass; use acl_user",
            ));
        }
        let flavor = self.node.flavor;
        let cli = find_cli(flavor)?;
        let mut node = self.node;
        node.ports = PortChoice::ClusterBus;
        let own: Vec<(String, String)> = vec![
            ("cluster-enabled".into(), "yes".into()),
            ("cluster-config-file".into(), "nodes.conf".into()),
            ("cluster-node-timeout".into(), NODE_TIMEOUT_MS.into()),
            ("cluster-require-full-coverage".into(), "yes".into()),
            // Always let a replica take over, however long its link was down: tests kill
            // primaries on purpose and want the failover.
            ("cluster-replica-validity-factor".into(), "0".into()),
            // A replica's first sync starts at once: the default waits 5 s for more replicas to
            // share a diskless transfer, which would be most of the cluster's start-up time.
            ("repl-diskless-sync-delay".into(), "0".into()),
        ];
        node.args.splice(0..0, own);

        let mut nodes = Vec::with_capacity(NODES);
        for _ in 0..NODES {
            // On error the nodes started so far are dropped, which stops them.
            nodes.push(node.clone().start()?);
        }
        let mut cluster = RedisCluster {
            nodes,
            roles: vec![None; NODES],
            flavor,
        };
        let started = Instant::now();
        create(&cli, &cluster.nodes)?;
        cluster.wait_healthy(HEALTHY_TIMEOUT)?;
        // `cluster_state:ok` on every node does not mean every node has heard (by gossip) of
        // every replica yet: wait until all six views agree, so tests start from one layout.
        cluster.wait_views_agree(HEALTHY_TIMEOUT)?;
        cluster.refresh_roles()?;
        cluster.check_initial_layout()?;
        tracing::debug!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "redis cluster created and healthy"
        );
        Ok(cluster)
    }
}

/// One node's view of itself, from its own `CLUSTER NODES` line (the one flagged `myself`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeInfo {
    id: String,
    primary: bool,
    /// For a replica: the node ID of its primary.
    primary_id: Option<String>,
    slots: Vec<RangeInclusive<u16>>,
}

/// A six-node Redis Cluster (three primaries, three replicas) of private [`RedisServer`]s on
/// 127.0.0.1.
///
/// Node roles are read from the nodes themselves (`CLUSTER NODES`) after creation and whenever
/// [`refresh_roles`](Self::refresh_roles) is called: a failover changes them, so call it after
/// killing or pausing a primary. Dropping the cluster stops every node and removes its data.
///
/// See the [module documentation](self) for an example.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Per node, as of the last [`refresh_roles`](Self::refresh_roles); `None` if it did not
    /// answer.
    roles: Vec<Option<NodeInfo>>,
    flavor: Flavor,
}

impl RedisCluster {
    /// Starts a cluster with the default settings.
    ///
    /// # Errors
    ///
    /// See [`RedisClusterBuilder::start`].
    pub fn start() -> io::Result<RedisCluster> {
        RedisClusterBuilder::default().start()
    }

    /// Returns a builder to choose the flavor, ACL users or extra arguments.
    pub fn builder() -> RedisClusterBuilder {
        RedisClusterBuilder::default()
    }

    /// The server flavor the nodes run.
    pub fn flavor(&self) -> Flavor {
        self.flavor
    }

    /// All six nodes, in a fixed order; the indices used by the other methods refer to it.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Mutable access to node `index`, to [`kill`](RedisServer::kill) or
    /// [`restart`](RedisServer::restart) it.
    ///
    /// # Panics
    ///
    /// If `index` is not below 6.
    pub fn node_mut(&mut self, index: usize) -> &mut RedisServer {
        &mut self.nodes[index]
    }

    /// Starts moving hash `slot` from the primary that serves it to primary `to`, the way
    /// `redis-cli --cluster reshard` does: `CLUSTER SETSLOT slot IMPORTING` on `to`, then
    /// `MIGRATING` on the owner. From now on the owner answers `ASK` for keys of the slot it no
    /// longer holds. Returns the owner's index. Uses the roles of the last
    /// [`refresh_roles`](Self::refresh_roles).
    ///
    /// # Errors
    ///
    /// If `to` is not a primary, or already serves the slot, or a node refuses.
    pub fn begin_slot_migration(&self, slot: u16, to: usize) -> io::Result<usize> {
        let from = self
            .indices(|info| info.primary && info.slots.iter().any(|r| r.contains(&slot)))
            .first()
            .copied()
            .ok_or_else(|| io::Error::other(format!("no primary serves slot {slot}")))?;
        if from == to || !self.primaries().contains(&to) {
            return Err(io::Error::other(format!(
                "node {to} is not another primary than the slot's owner {from}"
            )));
        }
        let id = |i: usize| {
            self.node_id(i)
                .map(str::to_string)
                .ok_or_else(|| io::Error::other(format!("node {i} has no known id")))
        };
        let slot_arg = slot.to_string();
        let (from_id, to_id) = (id(from)?, id(to)?);
        let port = |i: usize| self.nodes[i].port();
        query(
            port(to),
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id],
        )?;
        query(
            port(from),
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id],
        )?;
        Ok(from)
    }

    /// Moves every key of `slot` from node `from` to node `to` with `MIGRATE` (a migration
    /// begun with [`begin_slot_migration`](Self::begin_slot_migration)). Returns how many
    /// keys moved.
    ///
    /// # Errors
    ///
    /// If a node refuses.
    pub fn migrate_slot_keys(&self, slot: u16, from: usize, to: usize) -> io::Result<usize> {
        let to_io = |err: redis::RedisError| io::Error::other(err.to_string());
        let client = redis::Client::open(self.nodes[from].url()).map_err(to_io)?;
        let mut conn = client
            .get_connection_with_timeout(QUERY_TIMEOUT)
            .map_err(to_io)?;
        conn.set_read_timeout(Some(QUERY_TIMEOUT * 4))
            .map_err(to_io)?;
        let mut moved = 0;
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut conn)
                .map_err(to_io)?;
            if keys.is_empty() {
                return Ok(moved);
            }
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.nodes[to].port())
                .arg("")
                .arg(0)
                .arg(QUERY_TIMEOUT.as_millis() as u64)
                .arg("KEYS")
                .arg(&keys)
                .query::<()>(&mut conn)
                .map_err(to_io)?;
            moved += keys.len();
        }
    }

    /// Ends a migration: `CLUSTER SETSLOT slot NODE to` on `to`, then on `from`, then on the
    /// other primaries, and refreshes the roles.
    ///
    /// # Errors
    ///
    /// If a node refuses.
    pub fn finish_slot_migration(&mut self, slot: u16, from: usize, to: usize) -> io::Result<()> {
        let to_id = self
            .node_id(to)
            .map(str::to_string)
            .ok_or_else(|| io::Error::other(format!("node {to} has no known id")))?;
        let slot_arg = slot.to_string();
        let mut order = vec![to, from];
        order.extend(
            self.primaries()
                .into_iter()
                .filter(|&i| i != to && i != from),
        );
        for i in order {
            query(
                self.nodes[i].port(),
                &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id],
            )?;
        }
        self.refresh_roles()
    }

    /// Indices of the nodes that were primaries at the last [`refresh_roles`](Self::refresh_roles)
    /// (right after start: three of them, ascending).
    pub fn primaries(&self) -> Vec<usize> {
        self.indices(|info| info.primary)
    }

    /// Indices of the nodes that were replicas at the last [`refresh_roles`](Self::refresh_roles).
    pub fn replicas(&self) -> Vec<usize> {
        self.indices(|info| !info.primary)
    }

    fn indices(&self, pick: impl Fn(&NodeInfo) -> bool) -> Vec<usize> {
        self.roles
            .iter()
            .enumerate()
            .filter_map(|(i, info)| info.as_ref().filter(|info| pick(info)).map(|_| i))
            .collect()
    }

    /// The cluster node ID of node `index` (40 hex digits), if it answered at the last
    /// [`refresh_roles`](Self::refresh_roles). It survives a [restart](RedisServer::restart):
    /// it is kept in the node's `nodes.conf`.
    pub fn node_id(&self, index: usize) -> Option<&str> {
        self.roles.get(index)?.as_ref().map(|info| info.id.as_str())
    }

    /// For a replica: the index of its primary, as of the last
    /// [`refresh_roles`](Self::refresh_roles).
    pub fn primary_of(&self, replica: usize) -> Option<usize> {
        let id = self.roles.get(replica)?.as_ref()?.primary_id.as_deref()?;
        self.roles
            .iter()
            .position(|info| info.as_ref().is_some_and(|info| info.id == id))
    }

    /// The hash slots node `index` served at the last [`refresh_roles`](Self::refresh_roles)
    /// (empty for a replica).
    pub fn slots_of(&self, index: usize) -> &[RangeInclusive<u16>] {
        match self.roles.get(index) {
            Some(Some(info)) => &info.slots,
            _ => &[],
        }
    }

    /// Re-reads every node's role, primary and slots from the node itself (its own line of
    /// `CLUSTER NODES`). A node that is not running or does not answer within 0.5 s (e.g.
    /// [paused](RedisServer::pause)) is left out of [`primaries`](Self::primaries) and
    /// [`replicas`](Self::replicas) until the next refresh.
    ///
    /// # Errors
    ///
    /// Fails if a node answers with something that is not a `CLUSTER NODES` reply.
    pub fn refresh_roles(&mut self) -> io::Result<()> {
        for (i, node) in self.nodes.iter().enumerate() {
            self.roles[i] = if node.is_running() {
                match query(node.port(), &["CLUSTER", "NODES"]) {
                    Ok(text) => Some(parse_myself(&text).ok_or_else(|| {
                        io::Error::other(format!(
                            "node {i} (port {}): no `myself` line in CLUSTER NODES:\n{text}",
                            node.port()
                        ))
                    })?),
                    Err(_) => None,
                }
            } else {
                None
            };
        }
        Ok(())
    }

    /// The index of the primary that served `key`'s [slot] at the last
    /// [`refresh_roles`](Self::refresh_roles), if any.
    pub fn node_for_key(&self, key: &[u8]) -> Option<usize> {
        let slot = slot(key);
        self.roles.iter().position(|info| {
            info.as_ref()
                .is_some_and(|info| info.primary && info.slots.iter().any(|r| r.contains(&slot)))
        })
    }

    /// `redis://127.0.0.1:<port>/` of every node, in [`nodes`](Self::nodes) order: seeds for a
    /// cluster client.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// All nodes in one URL, `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…/` (a form baton may
    /// accept for a cluster; this is only the string).
    pub fn cluster_url(&self) -> String {
        format!("redis+cluster://{}/", self.hosts())
    }

    /// Like [`cluster_url`](Self::cluster_url), logging in as `user` with `password` (e.g. a user
    /// added with [`RedisClusterBuilder::acl_user`]).
    pub fn cluster_url_for(&self, user: &str, password: &str) -> String {
        format!("redis+cluster://{user}:{password}@{}/", self.hosts())
    }

    fn hosts(&self) -> String {
        self.nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until every running node reports `cluster_state:ok` in `CLUSTER INFO` and every
    /// running replica reports `master_link_status:up` in `INFO replication`, polling every
    /// 50 ms.
    ///
    /// A [paused](RedisServer::pause) node does not answer, so this times out while one is.
    ///
    /// # Errors
    ///
    /// Fails (`TimedOut`) if that is not the case within `timeout`, saying which node is not
    /// ready and why.
    pub fn wait_healthy(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.unhealthy() {
                None => return Ok(()),
                Some(why) => why,
            };
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the cluster was not healthy within {} ms: {last}",
                        timeout.as_millis()
                    ),
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Why the cluster is not healthy, or `None` if it is.
    fn unhealthy(&self) -> Option<String> {
        for (i, node) in self.nodes.iter().enumerate() {
            if !node.is_running() {
                continue;
            }
            let port = node.port();
            match query(port, &["CLUSTER", "INFO"]) {
                Ok(info) if info_field(&info, "cluster_state") == Some("ok") => {}
                Ok(info) => {
                    return Some(format!(
                        "node {i} (port {port}) has cluster_state {:?}",
                        info_field(&info, "cluster_state")
                    ))
                }
                Err(err) => return Some(format!("node {i} (port {port}): {err}")),
            }
            match query(port, &["INFO", "replication"]) {
                Ok(info) => {
                    if info_field(&info, "role") == Some("slave")
                        && info_field(&info, "master_link_status") != Some("up")
                    {
                        return Some(format!(
                            "replica {i} (port {port}) has master_link_status {:?}",
                            info_field(&info, "master_link_status")
                        ));
                    }
                }
                Err(err) => return Some(format!("node {i} (port {port}): {err}")),
            }
        }
        None
    }

    /// Waits until every node's `CLUSTER NODES` shows the same layout: three primaries with
    /// slots, each with exactly one replica, every link connected and no node flagged failing.
    fn wait_views_agree(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut why = None;
            for node in &self.nodes {
                let port = node.port();
                match query(port, &["CLUSTER", "NODES"]) {
                    Ok(text) => {
                        if let Some(w) = layout_problem(&text) {
                            why = Some(format!("node on port {port}: {w}"));
                            break;
                        }
                    }
                    Err(err) => {
                        why = Some(format!("node on port {port}: {err}"));
                        break;
                    }
                }
            }
            let Some(why) = why else { return Ok(()) };
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the cluster's views did not agree in time: {why}"),
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Right after creation: three primaries covering all slots, each with one replica.
    fn check_initial_layout(&self) -> io::Result<()> {
        let primaries = self.primaries();
        let replicas = self.replicas();
        let covered: usize = primaries
            .iter()
            .flat_map(|&p| self.slots_of(p))
            .map(|r| usize::from(*r.end()) - usize::from(*r.start()) + 1)
            .sum();
        let mut served: Vec<usize> = replicas
            .iter()
            .filter_map(|&r| self.primary_of(r))
            .collect();
        served.sort_unstable();
        served.dedup();
        if primaries.len() == PRIMARIES
            && replicas.len() == PRIMARIES
            && covered == usize::from(SLOTS)
            && served == primaries
        {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "unexpected cluster layout after creation: primaries {primaries:?}, replicas \
                 {replicas:?} (of primaries {served:?}), {covered} slots covered"
            )))
        }
    }
}

impl fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisCluster")
            .field("flavor", &self.flavor)
            .field(
                "ports",
                &self.nodes.iter().map(RedisServer::port).collect::<Vec<_>>(),
            )
            .field("primaries", &self.primaries())
            .field("replicas", &self.replicas())
            .finish()
    }
}

pub use super::internals::slot;

/// `redis-cli` for `flavor`: for Valkey, `valkey-cli` next to the server binary if there is
/// one; otherwise `redis-cli` on `PATH` (it speaks to Valkey too).
fn find_cli(flavor: Flavor) -> io::Result<PathBuf> {
    if flavor == Flavor::Valkey {
        if let Some(cli) = find_binary(flavor)
            .ok()
            .and_then(|bin| bin.parent().map(|dir| dir.join("valkey-cli")))
            .filter(|cli| is_executable(cli))
        {
            return Ok(cli);
        }
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-cli"))
        .find(|cli| is_executable(cli))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "redis-cli not found on PATH; install it (e.g. `apt-get install redis-tools`)",
            )
        })
}

/// `redis-cli --cluster create <nodes> --cluster-replicas 1 --cluster-yes`, bounded by
/// [`CREATE_TIMEOUT`]. Its output goes to `cluster-create.log` in the first node's data
/// directory and is quoted on failure.
fn create(cli: &Path, nodes: &[RedisServer]) -> io::Result<()> {
    let first = nodes
        .first()
        .ok_or_else(|| io::Error::other("a cluster without nodes"))?;
    let log = first.dir().join(CREATE_LOG);
    let file = std::fs::File::create(&log)?;
    let mut command = Command::new(cli);
    command
        .env_remove("REDISCLI_AUTH")
        .arg("--cluster")
        .arg("create")
        .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())))
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .stdin(Stdio::null())
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file));
    let mut child = spawn_dying_with_process(command, libc::SIGKILL).map_err(|err| {
        io::Error::new(err.kind(), format!("cannot run {}: {err}", cli.display()))
    })?;
    let outcome = wait_bounded(&mut child, CREATE_TIMEOUT);
    // Kills it if it is still running (never a recycled PID: std knows whether it was reaped).
    reap(child);
    let output = read_log_from(&log, 0);
    match outcome {
        Ok(Some(status)) if status.success() && !output.contains("[ERR]") => Ok(()),
        Ok(Some(status)) => Err(io::Error::other(format!(
            "`redis-cli --cluster create` failed ({status}):\n{output}"
        ))),
        Ok(None) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "`redis-cli --cluster create` did not finish within {} s:\n{output}",
                CREATE_TIMEOUT.as_secs()
            ),
        )),
        Err(err) => Err(err),
    }
}

/// Sends one command to the node on `port` (as the default user) and returns its bulk-string
/// reply.
/// What keeps one node's `CLUSTER NODES` from showing the full initial layout (three
/// primaries with slots, one replica each, all links connected, nothing failing), or `None`.
fn layout_problem(text: &str) -> Option<String> {
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| f.len() >= 8)
        .collect();
    if lines.len() != NODES {
        return Some(format!("knows {} nodes", lines.len()));
    }
    for f in &lines {
        if f[2].contains("fail") || f[2].contains("handshake") || f[7] != "connected" {
            return Some(format!("node {} is {} / {}", f[0], f[2], f[7]));
        }
    }
    let primaries: Vec<&Vec<&str>> = lines
        .iter()
        .filter(|f| f[2].contains("master") && f.len() > 8)
        .collect();
    if primaries.len() != PRIMARIES {
        return Some(format!("sees {} primaries with slots", primaries.len()));
    }
    for p in primaries {
        let replicas = lines.iter().filter(|f| f[3] == p[0]).count();
        if replicas != 1 {
            return Some(format!("sees {replicas} replicas of {}", p[0]));
        }
    }
    None
}

fn query(port: u16, args: &[&str]) -> io::Result<String> {
    let to_io = |err: redis::RedisError| io::Error::other(err.to_string());
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).map_err(to_io)?;
    let mut conn = client
        .get_connection_with_timeout(QUERY_TIMEOUT)
        .map_err(to_io)?;
    conn.set_read_timeout(Some(QUERY_TIMEOUT)).map_err(to_io)?;
    conn.set_write_timeout(Some(QUERY_TIMEOUT)).map_err(to_io)?;
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query(&mut conn).map_err(to_io)
}

/// The value of `name` in an `INFO`-style `name:value` reply.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim())
    })
}

/// The node's own line of a `CLUSTER NODES` reply:
/// `<id> <ip:port@cport> <flags> <primary-id or -> <ping> <pong> <epoch> <link> <slot>...`.
fn parse_myself(text: &str) -> Option<NodeInfo> {
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let flags = fields.get(2)?;
        if !flags.split(',').any(|f| f == "myself") {
            return None;
        }
        let primary = flags.split(',').any(|f| f == "master");
        let primary_id = fields
            .get(3)
            .filter(|id| **id != "-")
            .map(|id| (*id).to_owned());
        let slots = fields
            .iter()
            .skip(8)
            // `[slot->-id]` / `[slot-<-id]`: a slot being migrated, not (yet) served.
            .filter(|f| !f.starts_with('['))
            .filter_map(|f| match f.split_once('-') {
                Some((a, b)) => Some(a.parse().ok()?..=b.parse().ok()?),
                None => {
                    let s = f.parse().ok()?;
                    Some(s..=s)
                }
            })
            .collect();
        Some(NodeInfo {
            id: fields.first()?.to_string(),
            primary,
            primary_id: if primary { None } else { primary_id },
            slots,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_own_line() {
        let text = "\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 7000 [5461->-292f]
";
        let info = parse_myself(text).expect("a myself line");
        assert_eq!(info.id, "e7d1");
        assert!(info.primary);
        assert_eq!(info.slots, vec![0..=5460, 7000..=7000]);
        let text = "07c3 127.0.0.1:30004@40004 myself,slave e7d1 0 1 4 connected\n";
        let info = parse_myself(text).expect("a myself line");
        assert!(!info.primary);
        assert_eq!(info.primary_id.as_deref(), Some("e7d1"));
    }
}
