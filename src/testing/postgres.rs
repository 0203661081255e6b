//! [`PgServer`]: a private PostgreSQL server (`initdb` into a temporary directory, `postgres` on
//! a free loopback port), for the tests of baton's PostgreSQL backend, the SQL side of fencing,
//! and the faults it must survive (a crash with [`PgServer::crash`] and
//! [`PgServer::restart_immediate`], a stall with [`PgServer::pause`]).
//!
//! Built like the Redis fixture (the same spawner thread, so a postmaster never outlives the
//! test process), but PostgreSQL differs in everything else: it refuses to run as root, is
//! ready when its `postmaster.pid` says so, is set up through `psql` rather than a driver (the
//! fixture sits below the library's client), and has its own authentication file and worker
//! role ([`PG_WORKER_ROLE`]). [`PgServer::shared`] gives a test binary one server for all its
//! tests, since `initdb` costs about a second and a half.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use super::process::{
    children_of, create_temp_dir, free_port, is_executable, process_state, read_log_from, reap,
    send_signal, spawn_dying_with_process, start_on_free_port, wait_bounded, wait_until_ready,
    Failure, WaitFailure, POLL_INTERVAL, READY_TIMEOUT,
};
use super::tls::{make_tls_files, TlsFiles};

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
/// fencing sequence): what docs/operating.md tells an operator to give a worker role.
pub const PG_WORKER_ROLE: &str = "baton_dml";
/// [`PG_WORKER_ROLE`]'s password.
pub const PG_WORKER_PASSWORD: &str = "dml-pw-5e2b";

/// The grants [`PgServer::grant_worker_role`] gives [`PG_WORKER_ROLE`] in a migrated database.
const PG_WORKER_GRANTS: &str = "
GRANT USAGE ON SCHEMA public TO baton_dml;
GRANT SELECT, INSERT, UPDATE, DELETE ON baton_jobs, baton_job_stops, baton_locks TO baton_dml;
GRANT SELECT, INSERT, UPDATE, DELETE
    ON baton_rwlocks, baton_semaphores, baton_semaphore_waiters TO baton_dml;
GRANT SELECT, INSERT, UPDATE, DELETE
    ON baton_schedules, baton_schedule_history, baton_schedule_control,
       baton_schedule_triggers TO baton_dml;
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
///   `SIGKILL` after 5 s) and removes the directory. Like [`RedisServer`](super::RedisServer), `initdb` and the
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

    /// Turns TLS on: certificates made as for [`RedisServerBuilder::tls`](super::RedisServerBuilder::tls) (a private CA, a
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
        while process_state(self.pid).is_some_and(|s| s != 'T' && s != 't')
            && Instant::now() < deadline
        {
            thread::sleep(Duration::from_millis(1));
        }
        for child in children_of(self.pid) {
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
        for child in children_of(self.pid) {
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

/// Sends `signal` to a child of the fixture's postmaster (found by [`children_of`]).
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

    start_on_free_port("postgres", free_port, |port| {
        pg_launch(bin_dir, run_as, dir, port, durable)
    })
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
    let outcome = match wait_until_ready(&mut child, |pid| pg_ready(&pid_file, pid, port)) {
        Ok(()) => return Ok(child),
        Err(outcome) => outcome,
    };
    pg_stop(child);
    let text = read_log_from(&log, log_start);
    let kind = outcome.kind();
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
        let children = children_of(pg.pid());
        assert!(
            children.len() >= 3,
            "a running server has auxiliary processes: {children:?}"
        );
        pg.pause().expect("pause");
        // SIGSTOP is delivered asynchronously; give it a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        let all_stopped = || {
            std::iter::once(pg.pid())
                .chain(children_of(pg.pid()))
                // A child that exited meanwhile stays a zombie (`Z`): its stopped parent
                // cannot reap it.
                .all(|p| matches!(process_state(p), Some('T' | 't' | 'Z' | 'X') | None))
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
