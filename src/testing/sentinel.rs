//! A private Redis Sentinel set for tests: one primary, two replicas and three Sentinels, all on
//! loopback, all torn down on drop.
//!
//! Every process is a [`RedisServer`], so everything [`RedisServer`] promises holds here too: each
//! runs on a free port on 127.0.0.1 with its own temporary directory, is spawned by the fixture's
//! long-lived spawner thread (it dies with the test process, `PR_SET_PDEATHSIG`), and is killed,
//! reaped and removed on drop; [`RedisServer::kill`], [`RedisServer::pause`] and friends work on
//! data nodes and Sentinels alike.
//!
//! * The data nodes: a primary, and two replicas started with `--replicaof 127.0.0.1 <primary
//!   port>`, all with `repl-diskless-sync-delay 0` (a replica syncs at once). Their default user
//!   has no password (Sentinels and replicas log in as it); an optional least-privilege ACL user
//!   ([`RedisSentinelBuilder::acl_user`]) is added to every data node, for the clients under
//!   test.
//! * The Sentinels: the same binary run as `<server> <dir>/sentinel.conf --sentinel`, with a
//!   writable config file (Sentinels rewrite it) holding `port`, `bind 127.0.0.1`,
//!   `sentinel monitor <service> 127.0.0.1 <primary port> 2` and short timeouts
//!   (`down-after-milliseconds` 1000, `failover-timeout` 3000, `parallel-syncs` 1), so a
//!   failover takes a few seconds rather than the default minutes. Sentinels need no password.
//!
//! Not supported: a password on the data nodes' default user (`sentinel auth-pass`), ACL users on
//! the Sentinels, TLS.
//!
//! [`RedisSentinelBuilder::start`] returns once both replicas report `master_link_status:up` and
//! every Sentinel names the primary and knows the other two Sentinels and both replicas.
//!
//! ```no_run
//! use baton::testing::RedisSentinel;
//!
//! # fn main() -> std::io::Result<()> {
//! let mut set = RedisSentinel::start()?;
//! println!("{}", set.url()); // redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/baton-test
//! let primary = set.primary_index()?;
//! set.nodes_mut()[primary].kill(); // the Sentinels promote a replica within seconds
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::io;
use std::thread;
use std::time::{Duration, Instant};

use super::{Flavor, RedisServer};

/// The service name a set monitors unless [`RedisSentinelBuilder::service`] says otherwise.
pub const DEFAULT_SERVICE: &str = "baton-test";
/// How long [`RedisSentinelBuilder::start`] waits for replication and discovery to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(20);
/// Delay between two settle checks.
const SETTLE_POLL: Duration = Duration::from_millis(50);
/// Connect and I/O timeout of the fixture's own (synchronous) checks.
const CHECK_TIMEOUT: Duration = Duration::from_millis(500);
/// Number of replicas and of Sentinels.
const REPLICAS: usize = 2;
const SENTINELS: usize = 3;

/// Configures and starts a [`RedisSentinel`]; from [`RedisSentinel::builder`] (or `Default`).
#[derive(Clone)]
pub struct RedisSentinelBuilder {
    flavor: Flavor,
    service: String,
    user: Option<(String, String, String)>,
}

impl Default for RedisSentinelBuilder {
    fn default() -> Self {
        RedisSentinelBuilder {
            flavor: Flavor::default(),
            service: DEFAULT_SERVICE.to_owned(),
            user: None,
        }
    }
}

// Hand-written so that the ACL user's password never ends up in test output.
impl fmt::Debug for RedisSentinelBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSentinelBuilder")
            .field("flavor", &self.flavor)
            .field("service", &self.service)
            .field("user", &self.user.as_ref().map(|(name, _, _)| name))
            .finish()
    }
}

impl RedisSentinelBuilder {
    /// Sets which server runs, for data nodes and Sentinels alike. Defaults to [`Flavor::Redis`].
    pub fn flavor(mut self, flavor: Flavor) -> Self {
        self.flavor = flavor;
        self
    }

    /// Sets the name the Sentinels monitor the primary under (defaults to
    /// [`DEFAULT_SERVICE`], `baton-test`). Only ASCII letters, digits, `-`, `_` and `.` are
    /// accepted (it goes into a config file and a URL); [`start`](Self::start) rejects others.
    pub fn service(mut self, service: &str) -> Self {
        self.service = service.to_owned();
        self
    }

    /// Adds a least-privilege user to every data node, as [`super::RedisServerBuilder::acl_user`]
    /// does (keys and channels under `prefix`, only the failover commands). Sentinels and
    /// replication keep using the passwordless default user; reach a node as this user with
    /// [`RedisServer::url_for`].
    pub fn acl_user(mut self, name: &str, password: &str, prefix: &str) -> Self {
        self.user = Some((name.to_owned(), password.to_owned(), prefix.to_owned()));
        self
    }

    /// Starts the primary, the replicas and the Sentinels, and waits (up to 20 s) until the
    /// replicas are in sync and every Sentinel names the primary and knows the other two
    /// Sentinels and both replicas.
    ///
    /// # Errors
    ///
    /// Fails if the service name is invalid, if a process cannot be started (see
    /// [`super::RedisServerBuilder::start`]), or if the set does not settle in time (the error
    /// says what was still missing). Whatever was started is torn down again.
    pub fn start(self) -> io::Result<RedisSentinel> {
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if self.service.is_empty() || !self.service.chars().all(valid) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "invalid Sentinel service name {:?}: use ASCII letters, digits, '-', '_', '.'",
                    self.service
                ),
            ));
        }
        let data_node = || {
            // A full sync starts at once rather than after the default 5 s wait for more
            // replicas to join (`repl-diskless-sync-delay`), on every node: any may be promoted.
            let builder = RedisServer::builder()
                .flavor(self.flavor)
                .arg("repl-diskless-sync-delay", "0");
            match &self.user {
                Some((name, password, prefix)) => builder.acl_user(name, password, prefix),
                None => builder,
            }
        };
        let primary = data_node().start()?;
        let replica_of = format!("127.0.0.1 {}", primary.port());
        let mut nodes = vec![primary];
        for _ in 0..REPLICAS {
            nodes.push(data_node().arg("replicaof", &replica_of).start()?);
        }
        // Sentinels learn the replicas from the primary's INFO: start them once the replicas
        // are attached, so that they know them from their first look at the primary.
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        wait_for("the replicas to be in sync", deadline, || {
            replicas_in_sync(&nodes[1..])
        })?;
        let body = format!(
            "sentinel monitor {service} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {service} 1000\n\
             sentinel failover-timeout {service} 3000\n\
             sentinel parallel-syncs {service} 1\n",
            service = self.service,
            port = nodes[0].port(),
        );
        let mut sentinels = Vec::with_capacity(SENTINELS);
        for _ in 0..SENTINELS {
            sentinels.push(
                RedisServer::builder()
                    .flavor(self.flavor)
                    .sentinel(body.clone())
                    .start()?,
            );
        }
        let set = RedisSentinel {
            sentinels,
            nodes,
            service: self.service,
        };
        let primary_port = set.nodes[0].port();
        wait_for("the Sentinels to agree", deadline, || {
            set.sentinels
                .iter()
                .try_for_each(|s| sentinel_settled(s, &set.service, primary_port))
        })?;
        Ok(set)
    }
}

/// A private Sentinel-monitored set: a primary, two replicas and three Sentinels (see the
/// [module documentation](self)).
///
/// Dropping it kills and reaps every process (Sentinels first) and removes their directories.
pub struct RedisSentinel {
    // Declared first so that they are dropped first: no failover starts while the data nodes go.
    sentinels: Vec<RedisServer>,
    nodes: Vec<RedisServer>,
    service: String,
}

impl RedisSentinel {
    /// Starts a set with the default settings ([`Flavor::Redis`], service `baton-test`, no ACL
    /// user).
    ///
    /// # Errors
    ///
    /// See [`RedisSentinelBuilder::start`].
    pub fn start() -> io::Result<RedisSentinel> {
        RedisSentinelBuilder::default().start()
    }

    /// Returns a builder to choose the flavor, the service name or an ACL user.
    pub fn builder() -> RedisSentinelBuilder {
        RedisSentinelBuilder::default()
    }

    /// The name the Sentinels monitor the primary under.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The Sentinels' addresses, `127.0.0.1:<port>`, in [`sentinels`](Self::sentinels) order.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect()
    }

    /// `redis+sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3/<service>`: the set as one URL
    /// string, as `Client::connect` takes it (feature `sentinel`; the `redis` crate does not
    /// parse it).
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://{}/{}",
            self.sentinel_addrs().join(","),
            self.service
        )
    }

    /// The three Sentinels (each a [`RedisServer`] running `--sentinel`; its
    /// [`url`](RedisServer::url) reaches it without a password).
    pub fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The Sentinels, mutably: to [`kill`](RedisServer::kill) or
    /// [`restart`](RedisServer::restart) one.
    pub fn sentinels_mut(&mut self) -> &mut [RedisServer] {
        &mut self.sentinels
    }

    /// The data nodes. Index 0 was the primary at start; after a failover, ask
    /// [`primary_index`](Self::primary_index) which one is.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The data nodes, mutably: to [`kill`](RedisServer::kill), [`pause`](RedisServer::pause)
    /// or [`restart`](RedisServer::restart) one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The primary's address as the Sentinels report it (`SENTINEL get-master-addr-by-name`),
    /// `127.0.0.1:<port>`: the first Sentinel that answers is believed.
    ///
    /// # Errors
    ///
    /// Fails if no Sentinel answers with an address.
    pub fn primary_addr(&self) -> io::Result<String> {
        let mut last = None;
        for sentinel in &self.sentinels {
            match master_addr(sentinel, &self.service) {
                Ok((host, port)) => return Ok(format!("{host}:{port}")),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no Sentinel to ask")))
    }

    /// The index in [`nodes`](Self::nodes) of the current primary, as the Sentinels report it
    /// (re-read on every call: a failover changes it).
    ///
    /// # Errors
    ///
    /// Fails if no Sentinel answers, or names an address that is none of the data nodes.
    pub fn primary_index(&self) -> io::Result<usize> {
        let addr = self.primary_addr()?;
        self.nodes
            .iter()
            .position(|n| format!("127.0.0.1:{}", n.port()) == addr)
            .ok_or_else(|| {
                io::Error::other(format!(
                    "the Sentinels name {addr} as the primary, which is none of the data nodes"
                ))
            })
    }

    /// The current primary, as the Sentinels report it (see
    /// [`primary_index`](Self::primary_index)).
    ///
    /// # Errors
    ///
    /// As for [`primary_index`](Self::primary_index).
    pub fn primary(&self) -> io::Result<&RedisServer> {
        let index = self.primary_index()?;
        Ok(&self.nodes[index])
    }

    /// The current primary, mutably (to kill or pause it).
    ///
    /// # Errors
    ///
    /// As for [`primary_index`](Self::primary_index).
    pub fn primary_mut(&mut self) -> io::Result<&mut RedisServer> {
        let index = self.primary_index()?;
        Ok(&mut self.nodes[index])
    }
}

impl fmt::Debug for RedisSentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSentinel")
            .field("service", &self.service)
            .field("nodes", &self.nodes)
            .field("sentinels", &self.sentinels)
            .finish()
    }
}

/// Polls `check` until it succeeds or `deadline` passes; the error names `what` and the last
/// reason it was not yet true.
fn wait_for(
    what: &str,
    deadline: Instant,
    mut check: impl FnMut() -> Result<(), String>,
) -> io::Result<()> {
    loop {
        let last = match check() {
            Ok(()) => return Ok(()),
            Err(reason) => reason,
        };
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "timed out after {} s waiting for {what}: {last}",
                    SETTLE_TIMEOUT.as_secs()
                ),
            ));
        }
        thread::sleep(SETTLE_POLL);
    }
}

/// A short-lived synchronous connection to `server` as its default user.
fn connect(server: &RedisServer) -> Result<redis::Connection, String> {
    let place = format!("127.0.0.1:{}", server.port());
    let client = redis::Client::open(server.url()).map_err(|err| format!("{place}: {err}"))?;
    let conn = client
        .get_connection_with_timeout(CHECK_TIMEOUT)
        .map_err(|err| format!("{place}: connect: {err}"))?;
    conn.set_read_timeout(Some(CHECK_TIMEOUT))
        .and_then(|()| conn.set_write_timeout(Some(CHECK_TIMEOUT)))
        .map_err(|err| format!("{place}: socket setup: {err}"))?;
    Ok(conn)
}

/// `Ok` once every replica reports `master_link_status:up`.
fn replicas_in_sync(replicas: &[RedisServer]) -> Result<(), String> {
    for replica in replicas {
        let mut conn = connect(replica)?;
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut conn)
            .map_err(|err| format!("INFO replication on port {}: {err}", replica.port()))?;
        if !info.lines().any(|l| l.trim() == "master_link_status:up") {
            return Err(format!("replica on port {} not in sync", replica.port()));
        }
    }
    Ok(())
}

/// `SENTINEL get-master-addr-by-name <service>` on one Sentinel.
fn master_addr(sentinel: &RedisServer, service: &str) -> io::Result<(String, u16)> {
    let ask = || -> Result<(String, u16), String> {
        let mut conn = connect(sentinel)?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(service)
            .query(&mut conn)
            .map_err(|err| format!("SENTINEL get-master-addr-by-name: {err}"))?;
        addr.ok_or_else(|| format!("the Sentinel does not monitor {service:?}"))
    };
    ask().map_err(|err| io::Error::other(format!("Sentinel on port {}: {err}", sentinel.port())))
}

/// `Ok` once `sentinel` names the primary on `primary_port` and knows the other Sentinels and
/// the replicas.
fn sentinel_settled(
    sentinel: &RedisServer,
    service: &str,
    primary_port: u16,
) -> Result<(), String> {
    let port = sentinel.port();
    let (host, primary) = master_addr(sentinel, service).map_err(|err| err.to_string())?;
    if (host.as_str(), primary) != ("127.0.0.1", primary_port) {
        return Err(format!(
            "Sentinel on port {port} names {host}:{primary}, not 127.0.0.1:{primary_port}"
        ));
    }
    let mut conn = connect(sentinel)?;
    for (what, want) in [("sentinels", SENTINELS - 1), ("replicas", REPLICAS)] {
        let known: Vec<redis::Value> = redis::cmd("SENTINEL")
            .arg(what)
            .arg(service)
            .query(&mut conn)
            .map_err(|err| format!("SENTINEL {what} on port {port}: {err}"))?;
        if known.len() != want {
            return Err(format!(
                "Sentinel on port {port} knows {} {what}, not {want}",
                known.len()
            ));
        }
    }
    Ok(())
}
