//! `baton`: run any program under failover coordination, inspect and administer jobs.
//!
//! ```text
//! baton run --key nightly-report -- /usr/local/bin/report --since yesterday
//! baton lock --key backups --wait 5m -- /usr/local/bin/backup
//! baton status --key nightly-report
//! ```
//!
//! Built with the `cli` feature. See `baton --help` for every flag and exit status.
//!
//! Every command checks its whole configuration (job name, durations, flags) before it connects,
//! so a usage error is reported as one (exit 64) even when Redis is unreachable.
//!
//! # PROGRAM, signals and the terminal
//!
//! `baton run` and `baton lock` run PROGRAM the same way (one [`Supervisor`] over either
//! lease: a failover attempt or a fenced mutex). `baton run` starts PROGRAM as the leader of its own process group and follows it with
//! `waitid(2)`, stops included; it never uses tokio's child handling, so it knows exactly when
//! PROGRAM's leader is reaped. Signals go to the whole group, and only while the leader is not
//! reaped yet (a zombie at worst): a reaped leader's number can be reused by an unrelated process
//! group. When PROGRAM exits, what is left of its group gets SIGTERM, then SIGKILL after
//! --kill-grace, and is gone (as `/proc` shows) before the leader is reaped and the lease let
//! go. A guard process (guard.rs) kills the whole group if baton dies, even by SIGKILL.
//!
//! Like a shell running a job: when stdin is a terminal and baton's own process group is in its
//! foreground, PROGRAM's group is made the terminal's foreground group (by PROGRAM itself, right
//! before its `exec`, with SIGTTOU blocked), so it can read the terminal and Ctrl-C, Ctrl-\ and
//! Ctrl-Z reach it; baton takes the terminal back before it exits. SIGHUP, SIGINT, SIGQUIT and
//! SIGTERM sent to baton are forwarded to PROGRAM's group and end the attempt (exit 128 + n); a
//! signal baton inherited as ignored (`nohup`, a script's `&`) stays ignored, for PROGRAM too.
//! A terminating signal is always followed by SIGCONT, so a stopped PROGRAM acts on it.
//!
//! A SIGTSTP sent to baton itself (Ctrl-Z when stdin is not the terminal) is passed on to
//! PROGRAM's group instead of stopping baton alone, which would let the lease lapse while
//! PROGRAM runs. When PROGRAM is stopped by job control (SIGTSTP, SIGTTIN, SIGTTOU), baton takes
//! the terminal back and stops itself with SIGSTOP (SIGTSTP would be discarded in an orphaned
//! process group), so the shell sees the job stopped. Its lease is not extended while stopped. Once
//! continued, it first checks that it still holds its attempt (no-keepalive deadline, then the
//! job's state in Redis): if not, PROGRAM is killed and baton exits 74; otherwise PROGRAM's group
//! gets the terminal back (if baton is in the foreground again) and SIGCONT.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::ExitCode;
use std::task::Poll;
use std::time::Duration;

use baton::{
    AcquireOptions, Client, ElectionOptions, ErrorKind, Event, FailoverConfig, JobState, JobStatus,
    LockGuard, Redlock, RedlockGuard, RedlockOptions, Term,
};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use tokio::signal::unix::{signal, SignalKind};
use tokio::time::Instant;
use tokio_stream::StreamExt;

// Not `mod guard;`: from this crate root that would be src/bin/guard.rs, which cargo would
// take for a binary of its own.
#[path = "baton/guard.rs"]
mod guard;

const EXIT_STATUSES: &str = "\
Exit statuses of `baton run`:
  0        the job ended DONE (by this process or another one)
  N        PROGRAM's own status when this process ran an attempt that failed
           (128+n when signal n ended it, e.g. 130 after Ctrl-C in a terminal)
  126/127  PROGRAM could not be executed / was not found (the attempt is failed)
  64       usage or configuration error (checked before connecting), or an operation the
           URL's backend does not have
  65       the job's stored state is corrupt (a value baton never writes)
  69       the server (Redis or PostgreSQL) cannot be reached, or kept failing for a few
           seconds (transient: trying again later may help)
  74       this process lost its attempt: lease lost (also when baton was stopped, e.g. by
           Ctrl-Z, for longer than the lease), deadline passed (--no-keepalive), --max-run
           reached, a success that could no longer be recorded, or a success whose outcome is
           unknown (the job may or may not be DONE: check `baton status`)
  75       the job is exhausted and this process ran no attempt
  77       the server refused the credentials or a command: a wrong password or unknown user
           (Redis WRONGPASS, PostgreSQL 28P01/28000), an ACL denial (Redis NOPERM), a missing
           privilege (PostgreSQL 42501); no retry helps
  78       the server rejects the configuration: a database index out of range (Redis), an
           unknown database (PostgreSQL 3D000), baton's tables missing where this role may not
           create them (run `baton migrate` as their owner); no retry helps
  129/130/131/143
           baton got SIGHUP/SIGINT/SIGQUIT/SIGTERM (forwarded to PROGRAM; the attempt is failed)
PROGRAM's own statuses can collide with these; use --json or --events to tell them apart.
`status`, `watch`, `fail` and `reset` exit 0 on success, 64 on usage errors (and when a live
job needs --yes), 65 on a corrupt state, 69 when the server is unreachable, 77 and 78 as above;
`watch` exits 75 when the job ends EXHAUSTED. `migrate` exits 0 when the tables exist (made now
or before; with a Redis URL there is nothing to make), 69, 77 or 78 as above.

PROGRAM gets BATON_KEY, BATON_ATTEMPT, BATON_LAST_ATTEMPT (true/false) and BATON_FENCING_TOKEN
in its environment; its stdin, stdout and stderr pass through. It runs in its own process group,
which gets SIGTERM (then SIGCONT, so a stopped PROGRAM acts on it) and then SIGKILL when the
attempt is lost or runs out of time. Nothing in that group outlives baton: when PROGRAM exits,
what it left running there gets SIGTERM, then SIGKILL after --kill-grace, and is gone before
DONE is written or the attempt failed; when baton dies, even by SIGKILL (the OOM killer), a
guard process (`baton-guard` in ps) kills the whole group at once. What leaves the group
escapes both: a descendant that calls setsid or setpgid (a daemon's double fork, a shell with
job control). A lease cannot stop a paused or partitioned holder in time: pass
BATON_FENCING_TOKEN to what PROGRAM writes to.

In a terminal, `baton run` is a well-behaved job: when stdin is a terminal and baton runs in the
foreground, PROGRAM's process group gets the terminal (PROGRAM can read it; Ctrl-C and Ctrl-Z
reach it, and PROGRAM ended by Ctrl-C fails the attempt with 130) and baton takes it back
before exiting. SIGHUP, SIGINT, SIGQUIT and SIGTERM sent to
baton are forwarded to PROGRAM's group (unless baton started with them ignored, as under nohup).
Ctrl-Z (or SIGTSTP sent to baton) stops PROGRAM and baton; the lease is not kept alive meanwhile.
On `fg`/`bg` baton first checks that it still holds its attempt: if the lease ran out, PROGRAM is
killed and baton exits 74.

Crontab example (every server runs it; exactly one runs the report, a backup retries on failure;
the key names the UTC night, since a fixed key's DONE, kept for --retention, would make the next
night run nothing; crontab wants % written \\%):
  0 2 * * *  baton run --key \"nightly-report:$(date -u +\\%F)\" --lock-timeout 60s --max-attempts 3 -- /usr/local/bin/report";

const LOCK_EXIT_STATUSES: &str = "\
Exit statuses of `baton lock`:
  N        PROGRAM's own status (0 on success; 128+n when signal n ended it, e.g. 130 after
           Ctrl-C in a terminal); the lock is released when PROGRAM exits
  126/127  PROGRAM could not be executed / was not found (the lock is released)
  64       usage or configuration error (durations are checked before connecting), or an
           operation the URL's backend does not have
  65       the lock's fence key holds a value baton never writes
  69       the server cannot be reached, or failed while the lock was being acquired; with
           --redlock: too many masters failed for a quorum (masters/2+1) to be possible (the
           message names the quorum); a master that is down at start is one failed vote
           (transient: trying again later may help)
  74       the lock was lost while PROGRAM ran: an extension found another token (or none),
           or no extension was confirmed before the lease's end (also when baton was stopped,
           e.g. by Ctrl-Z, for longer than the lease). PROGRAM got SIGTERM, then SIGKILL at the
           latest when the lease could pass on. Also when PROGRAM ended but the release found
           the lock held by another token (mutual exclusion may have been broken). With
           --redlock: an extension round found no quorum still holding the lock, or no quorum
           extension was confirmed before the validity deadline (SIGKILL by then)
  75       --wait ran out while the lock was held elsewhere (nothing was run)
  77       the server refused the credentials or a command (as for `baton run`; nothing was
           run)
  78       the server rejects the configuration (as for `baton run`; nothing was run)
  129/130/131/143
           baton got SIGHUP/SIGINT/SIGQUIT/SIGTERM (forwarded to PROGRAM; the lock is released
           once PROGRAM exits; while still waiting for the lock, nothing was run)
PROGRAM's own statuses can collide with these.

Without --wait, `baton lock` waits for the lock as long as it takes.

While PROGRAM runs, a watchdog extends the lock every --ttl/3. PROGRAM gets BATON_LOCK_KEY and
BATON_FENCING_TOKEN (a number larger than any earlier holder's of the same key) in its
environment; its stdin, stdout and stderr pass through. A lease cannot stop a paused or
partitioned holder in time: pass BATON_FENCING_TOKEN to what PROGRAM writes to, and let it
refuse smaller tokens. Terminal, job control and signals work as for `baton run`: PROGRAM runs
in its own process group (which gets the terminal when baton is in the foreground), SIGHUP,
SIGINT, SIGQUIT and SIGTERM are forwarded to it, Ctrl-Z stops both (the lock is not extended
meanwhile, and PROGRAM is killed on `fg`/`bg` if the lease ran out), PROGRAM's whole group dies
with baton (a descendant that calls setsid or setpgid escapes), and what PROGRAM leaves running
in its group gets SIGTERM, then SIGKILL after --kill-grace, and is gone before the lock is
released.

--redlock URL,URL,URL takes the lock on a quorum of independent masters (at least 3, an odd
number, all distinct; instead of --url) so that it survives the loss of a minority of
them. PROGRAM then gets BATON_LOCK_KEY but no BATON_FENCING_TOKEN: Redlock has no monotonic
token. No counter grows across grants on a majority of masters: a master restarted without
persistence forgets the lock, a quorum can form again for a second holder while the first
still runs, and no token could be made to increase across that. Mutual exclusion then rests
on timing alone (clock rates, pauses): use it to avoid duplicate work, and the single-server
lock (with its fencing token) to protect data. The watchdog extends by quorum every --ttl/3;
the lock is lost when a round finds no quorum still holding it, or when no quorum extension is
confirmed before the validity (ttl − elapsed − drift) runs out.

Example (one backup at a time, whichever host gets there first):
  baton lock --key backups --ttl 30s --wait 5m -- /usr/local/bin/backup
  baton lock --redlock redis://a:6379/,redis://b:6379/,redis://c:6379/ --key dedupe -- job";

const LEADER_EXIT_STATUSES: &str = "\
Exit statuses of `baton leader`:
  0        baton got SIGTERM or SIGINT (or Ctrl-C in a terminal: PROGRAM, which has the
           terminal, ended by SIGINT): PROGRAM (if it ran) was stopped (SIGTERM, then SIGKILL
           after --kill-grace, never past the lease's end), the leadership was resigned so a
           standby leads at once, and baton exited
  N        PROGRAM ended by itself: its own status (128+n when signal n ended it); the
           leadership is resigned first
  126/127  PROGRAM could not be executed / was not found (the leadership is resigned)
  64       usage or configuration error (checked before connecting), or an operation the
           URL's backend does not have
  65       the election's fence key holds a value baton never writes
  69       the server cannot be reached at start, or answered with another error that
           retrying did not fix
  77       the server refused the credentials or a command (as for `baton run`)
  78       the server rejects the configuration (as for `baton run`)
  129/131  baton got SIGHUP/SIGQUIT (or Ctrl-\\ in a terminal, PROGRAM ended by SIGQUIT): as for
           SIGTERM, then this status
PROGRAM's own statuses can collide with these.

`baton leader` runs a long-lived PROGRAM only while this process leads the election --key: it
campaigns (waiting as a standby while another process leads), runs PROGRAM once elected, and
renews the lease every --lease/3. PROGRAM gets BATON_LEADER_KEY and BATON_FENCING_TOKEN (the
term: larger than every earlier leader's) in its environment. When renewals fail, PROGRAM gets
SIGTERM --lease/5 before the lease could pass on and SIGKILL at the latest when it could: no
PROGRAM outlives its leadership. baton then campaigns again and runs PROGRAM anew in the next
term. Standbys are woken at once by a resignation, and by the lease running out when a leader
dies. Terminal, job control, signals and PROGRAM's process group work as for `baton lock`. In
a terminal, Ctrl-C reaches only PROGRAM (its group has the terminal): PROGRAM ended by SIGINT
there is taken for Ctrl-C typed at baton (stop, resign, exit 0); a PROGRAM that catches it and
exits with a status of its own is taken at its word.

Example (one scheduler at a time across the fleet, handed over on deploys):
  baton leader --key scheduler --lease 10s -- /usr/local/bin/scheduler";

const MIGRATE_HELP: &str = "\
`baton migrate --url postgres://owner@host/db` creates baton_jobs, baton_locks, their indexes
and the sequence baton_advisory_fence in the connection's default schema (the first of its
search_path), where missing. It is idempotent and safe while workers run: when everything
exists it runs no DDL and takes no lock; otherwise each lock its DDL needs is waited for at most
1 s (a DDL waiting on a long transaction would queue every writer behind it), then tried again
with a pause, 5 times at most. Workers create a missing table themselves where their role may;
a role that may only read and write gets exit 78 naming this command instead.

With a Redis URL there is nothing to create (keys need no schema): it says so and exits 0
without connecting, so one deploy step fits both backends.

Exit statuses: 0 done (or nothing to do); 64 usage; 69 the server cannot be reached, or the
tables stayed locked through every try; 77 the role may not create them (run it as their
owner) or the credentials were refused; 78 the server rejects the configuration (an unknown
database).";

const EX_USAGE: u8 = 64;
const EX_DATAERR: u8 = 65;
const EX_UNAVAILABLE: u8 = 69;
const EX_LOST: u8 = 74;
/// Refused credentials or privileges (sysexits' EX_NOPERM).
const EX_NOPERM: u8 = 77;
/// Configuration the server rejects (sysexits' EX_CONFIG).
const EX_CONFIG: u8 = 78;
const EX_EXHAUSTED: u8 = 75;
/// `baton lock`: --wait ran out (EX_TEMPFAIL: try again later).
const EX_TEMPFAIL: u8 = 75;

/// The longest `--kill-grace` accepted.
const MAX_KILL_GRACE: Duration = Duration::from_secs(24 * 3600);
/// "Never", for timers that are not armed.
const FAR: Duration = Duration::from_secs(86_400 * 365);
/// How long a resumed baton waits for Redis to confirm it still holds its attempt.
const LEASE_CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// How often baton looks (in `/proc`) whether what PROGRAM left running in its group has ended.
const LEFTOVER_POLL: Duration = Duration::from_millis(50);
/// How long after SIGKILL a process of PROGRAM's group may take to be gone before baton stops
/// waiting for it (it exits as soon as it leaves the kernel; one that does not was out of reach).
const KILL_SETTLE: Duration = Duration::from_secs(2);

/// Run any program under attempt-counted failover coordination through Redis or PostgreSQL.
#[derive(Parser, Debug)]
#[command(name = "baton", version, after_long_help = EXIT_STATUSES)]
struct Cli {
    /// Where the coordination lives. Redis: redis://[user:password@]host:port/[db] (rediss://
    /// for TLS, unix:// for a socket), redis+cluster://host:port,host:port/ for a Redis
    /// Cluster's seed nodes, or redis+sentinel://host:port,host:port/SERVICE for the primary
    /// Sentinels monitor as SERVICE (credentials there are the data nodes'). PostgreSQL:
    /// postgres://[user[:password]@]host[:port]/database (tables made by `baton migrate`, or on
    /// first use where the role may; `lock`
    /// is then the table mutex and `leader` an election on the same table; --redlock is Redis
    /// only; add ?sslmode=require for TLS, the server's certificate always verified).
    /// --redis-url is an alias, and BATON_REDIS_URL is read when BATON_URL is not set. A
    /// password can also come from the file named by BATON_REDIS_PASSWORD_FILE. Never printed.
    /// For TLS (rediss://, or postgres:// with sslmode=require) the system's CAs are trusted,
    /// or the PEM file named by BATON_TLS_CA_FILE; BATON_TLS_CERT_FILE and BATON_TLS_KEY_FILE
    /// name a client certificate and its key, for servers that want one.
    #[arg(
        long,
        visible_alias = "redis-url",
        global = true,
        env = "BATON_URL",
        default_value = "redis://127.0.0.1:6379/",
        hide_env_values = true,
        hide_default_value = false
    )]
    url: String,
    /// Key prefix of the job's Redis keys.
    #[arg(long, global = true, default_value = "baton:")]
    prefix: String,
    /// Whether --url was given on the command line (not by default or environment).
    #[arg(skip)]
    url_given: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run PROGRAM if this process wins an attempt of the job; otherwise wait as a backup and
    /// take over when an attempt fails.
    #[command(after_long_help = EXIT_STATUSES)]
    Run(RunArgs),
    /// Run PROGRAM holding a fenced mutex: one holder at a time per key, kept alive by a
    /// watchdog; PROGRAM is stopped if the lock is lost.
    #[command(after_long_help = LOCK_EXIT_STATUSES)]
    Lock(LockArgs),
    /// Run a long-lived PROGRAM only while this process is the elected leader of --key; stop it
    /// on loss and campaign again; on SIGTERM stop it, resign and exit 0.
    #[command(after_long_help = LEADER_EXIT_STATUSES)]
    Leader(LeaderArgs),
    /// Show a job's state: attempt, holder, last failure, TTLs, fencing token.
    Status {
        /// The job name.
        #[arg(long)]
        key: String,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Follow a job's changes (grants, done, failures) until it ends.
    Watch {
        /// The job name.
        #[arg(long)]
        key: String,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Release a hung holder's attempt so a backup takes over at once.
    Fail {
        /// The job name.
        #[arg(long)]
        key: String,
        /// Why (kept in the job's failure note).
        #[arg(long, default_value = "released by an operator")]
        reason: String,
        /// Confirm releasing a live attempt.
        #[arg(long)]
        yes: bool,
    },
    /// Create baton's PostgreSQL tables, indexes and sequence where missing (as their owner,
    /// once per database, before workers run with a role that may only read and write them).
    #[command(after_long_help = MIGRATE_HELP)]
    Migrate,
    /// Forget a job's state, so the next `baton run` runs it again as attempt 1.
    Reset {
        /// The job name.
        #[arg(long)]
        key: String,
        /// Confirm resetting a live job.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The job name (e.g. nightly-report); every server running the job uses the same key.
    #[arg(long)]
    key: String,
    /// The lease: how long a silent holder keeps the job before a backup may take over
    /// (10ms ..= 1 day).
    #[arg(long, default_value = "30s", value_parser = duration)]
    lock_timeout: Duration,
    /// The maximum number of attempts.
    #[arg(long, default_value_t = 5)]
    max_attempts: u64,
    /// How long DONE/EXHAUSTED are kept, so late duplicates are not re-run (at most 10 years).
    #[arg(long, default_value = "24h", value_parser = duration)]
    retention: Duration,
    /// Do not extend the lease: the attempt must finish within --lock-timeout of its grant
    /// (PROGRAM is stopped when it does not).
    #[arg(long)]
    no_keepalive: bool,
    /// Cap on one attempt's run time, counted from its grant (must exceed --lock-timeout).
    #[arg(long, value_parser = duration)]
    max_run: Option<Duration>,
    /// Pause before a backup takes over a failed attempt.
    #[arg(long, default_value = "0s", value_parser = duration)]
    retry_delay: Duration,
    /// Time between SIGTERM and SIGKILL when PROGRAM must stop, or what it left running in its
    /// process group when it exits, at most 1 day (never past the lease's end; without
    /// keepalive SIGTERM comes this long, at most a quarter lease, before the deadline).
    #[arg(long, default_value = "10s", value_parser = kill_grace)]
    kill_grace: Duration,
    /// This worker's name, shown by `baton status` (default host:pid).
    #[arg(long)]
    name: Option<String>,
    /// Write events as JSON lines on stderr.
    #[arg(long)]
    json: bool,
    /// Write events as JSON lines to FILE (appended).
    #[arg(long, value_name = "FILE")]
    events: Option<PathBuf>,
    /// More human-readable output on stderr (repeat for library traces).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// The program and its arguments.
    #[arg(required = true, last = true, value_name = "PROGRAM")]
    program: Vec<OsString>,
}

#[derive(Args, Debug)]
struct LockArgs {
    /// The lock's name; every process that must not run at the same time uses the same key.
    #[arg(long)]
    key: String,
    /// Use Redlock over these independent masters (comma-separated, at least 3, an odd number,
    /// all distinct) instead of --url. BATON_FENCING_TOKEN is then not set: Redlock has
    /// no monotonic token (see below).
    /// (Conflicts with --url on the command line; BATON_URL is ignored with it.)
    #[arg(long, value_name = "URL,URL,URL", value_delimiter = ',')]
    redlock: Vec<String>,
    /// The lease: how long the lock outlives a holder that went silent (10ms ..= 1 day). The
    /// watchdog extends it every ttl/3 while PROGRAM runs.
    #[arg(long, default_value = "30s", value_parser = duration)]
    ttl: Duration,
    /// How long to wait for the lock at most, then exit 75 [default: wait forever].
    #[arg(long, value_parser = duration)]
    wait: Option<Duration>,
    /// Time between SIGTERM and SIGKILL when PROGRAM must stop, or what it left running in its
    /// process group when it exits, at most 1 day; when the lock is lost, never past the
    /// lease's end.
    #[arg(long, default_value = "10s", value_parser = kill_grace)]
    kill_grace: Duration,
    /// More human-readable output on stderr (repeat for library traces).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// The program and its arguments.
    #[arg(required = true, last = true, value_name = "PROGRAM")]
    program: Vec<OsString>,
}

#[derive(Args, Debug)]
struct LeaderArgs {
    /// The election's name; every process that may lead uses the same key.
    #[arg(long)]
    key: String,
    /// The lease: how long a silent leader keeps leading (10ms ..= 1 day), renewed every
    /// lease/3.
    #[arg(long, default_value = "10s", value_parser = duration)]
    lease: Duration,
    /// This candidate's name, shown to observers (default host:pid).
    #[arg(long)]
    name: Option<String>,
    /// Time between SIGTERM and SIGKILL when baton stops PROGRAM on a signal, or what PROGRAM
    /// left running in its process group when it exits, at most 1 day; on a lost leadership
    /// PROGRAM is killed by the lease's end whatever this says.
    #[arg(long, default_value = "10s", value_parser = kill_grace)]
    kill_grace: Duration,
    /// More human-readable output on stderr (repeat for library traces).
    #[arg(short, long, action = clap::ArgAction::Count)]
    verbose: u8,
    /// The program and its arguments.
    #[arg(required = true, last = true, value_name = "PROGRAM")]
    program: Vec<OsString>,
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 500ms, 30s, 5m, 24h)"))
}

fn kill_grace(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d > MAX_KILL_GRACE {
        return Err(format!("{s} is above the maximum of 1 day"));
    }
    Ok(d)
}

fn main() -> ExitCode {
    // The guard of a PROGRAM's process group is this binary, re-executed (see guard.rs).
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new(guard::ARG)) {
        return guard::main();
    }
    // BATON_REDIS_URL, the variable's name before PostgreSQL, still works when BATON_URL is
    // not set. Set before any other thread exists (the runtime starts later).
    if std::env::var_os("BATON_URL").is_none() {
        if let Some(url) = std::env::var_os("BATON_REDIS_URL") {
            std::env::set_var("BATON_URL", url);
        }
    }
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    let cli = match parsed {
        Ok((mut cli, m)) => {
            // --url is global: its source is recorded on the subcommand's matches.
            let given = |m: &clap::ArgMatches| {
                m.value_source("url") == Some(clap::parser::ValueSource::CommandLine)
            };
            cli.url_given = given(&m) || m.subcommand().is_some_and(|(_, sub)| given(sub));
            cli
        }
        Err(e) => {
            let code = if e.use_stderr() { EX_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    // One thread: PROGRAM is forked from the main thread, which lives as long as the process,
    // so the parent-death signal (which follows the forking *thread*) fires only when baton dies.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("baton: cannot start the runtime: {e}");
            return ExitCode::from(EX_UNAVAILABLE);
        }
    };
    ExitCode::from(runtime.block_on(dispatch(cli)))
}

/// A command with its configuration checked, ready to run once connected.
enum Plan<'a> {
    Run(&'a RunArgs, FailoverConfig, Sink),
    Lock(&'a LockArgs, AcquireOptions, Sink),
    Redlock(&'a LockArgs, RedlockOptions, Sink),
    Leader(&'a LeaderArgs, ElectionOptions, Sink),
    Status(FailoverConfig, bool),
    Watch(FailoverConfig, bool),
    Fail(FailoverConfig, &'a str, bool),
    Reset(FailoverConfig, bool),
    Migrate,
}

/// Checks everything that can be checked without Redis; `Err` is the exit status.
fn plan(cli: &Cli) -> Result<Plan<'_>, u8> {
    let job = |key: &str| {
        FailoverConfig::builder(key)
            .prefix(cli.prefix.clone())
            .build()
            .map_err(usage)
    };
    Ok(match &cli.command {
        Command::Run(args) => {
            let (config, sink) = run_config(args, &cli.prefix)?;
            Plan::Run(args, config, sink)
        }
        Command::Lock(args) => {
            // Lock names and prefixes follow the rules of job names (1..=1024 bytes, not blank,
            // no `{`/`}`; a prefix ends with `:`): checked here, before connecting, so a bad one
            // is a usage error even when Redis is unreachable.
            job(&args.key)?;
            let (opts, sink) = lock_config(args)?;
            if args.redlock.is_empty() {
                Plan::Lock(args, opts, sink)
            } else {
                if cli.url_given {
                    return Err(usage(
                        "--redlock and --url cannot be used together: --redlock names \
                         every master",
                    ));
                }
                redlock_urls(&args.redlock)?;
                let mut ropts = RedlockOptions::default();
                if let Some(wait) = args.wait {
                    ropts = ropts.wait(wait);
                }
                Plan::Redlock(args, ropts, sink)
            }
        }
        Command::Leader(args) => {
            job(&args.key)?;
            let mut opts = ElectionOptions::builder().lease(args.lease);
            if let Some(name) = &args.name {
                opts = opts.name(name.clone());
            }
            let opts = opts.build().map_err(usage)?;
            let sink = Sink {
                json: false,
                file: None,
                verbose: args.verbose,
                key: args.key.clone(),
            };
            Plan::Leader(args, opts, sink)
        }
        Command::Status { key, json } => Plan::Status(job(key)?, *json),
        Command::Watch { key, json } => Plan::Watch(job(key)?, *json),
        Command::Fail { key, reason, yes } => Plan::Fail(job(key)?, reason, *yes),
        Command::Reset { key, yes } => Plan::Reset(job(key)?, *yes),
        Command::Migrate => Plan::Migrate,
    })
}

async fn dispatch(cli: Cli) -> u8 {
    let verbose = match &cli.command {
        Command::Run(args) => args.verbose,
        Command::Lock(args) => args.verbose,
        Command::Leader(args) => args.verbose,
        _ => 0,
    };
    if verbose >= 2 {
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter("baton=debug")
            .try_init();
    }
    let plan = match plan(&cli) {
        Ok(p) => p,
        Err(code) => return code,
    };
    // Redlock connects to its own masters, never to --url.
    let plan = match plan {
        Plan::Redlock(args, opts, sink) => {
            return redlock(args, opts, sink, &cli.prefix).await;
        }
        other => other,
    };
    if let Plan::Migrate = plan {
        if !(cli.url.starts_with("postgres://") || cli.url.starts_with("postgresql://")) {
            eprintln!("baton: nothing to migrate: Redis keys need no schema");
            return 0;
        }
    }
    let client = match connect(&cli.url).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    match plan {
        Plan::Run(args, config, sink) => run(&client, args, config, sink).await,
        Plan::Lock(args, opts, sink) => lock(&client, args, opts, sink, &cli.prefix).await,
        Plan::Leader(args, opts, sink) => leader(&client, args, opts, sink, &cli.prefix).await,
        // Returned above.
        Plan::Redlock(..) => EX_USAGE,
        Plan::Status(cfg, json) => status(&client, cfg, &cli.prefix, json).await,
        Plan::Watch(cfg, json) => watch(&client, cfg, json).await,
        Plan::Fail(cfg, reason, yes) => admin_fail(&client, cfg, reason, yes).await,
        Plan::Reset(cfg, yes) => reset(&client, cfg, yes).await,
        Plan::Migrate => match client.migrate().await {
            Ok(()) => {
                eprintln!("baton: baton_jobs, baton_locks and baton_advisory_fence are in place");
                0
            }
            Err(e) => fail_with(&e),
        },
    }
}

fn usage(e: impl std::fmt::Display) -> u8 {
    eprintln!("baton: {e}");
    EX_USAGE
}

/// Maps a library error to an exit status and prints it.
fn fail_with(e: &baton::Error) -> u8 {
    eprintln!("baton: {e}");
    exit_for(e.kind())
}

fn exit_for(kind: ErrorKind) -> u8 {
    match kind {
        // A primitive the URL's backend does not have (the fair lock on PostgreSQL...): the
        // command line asks for something impossible.
        ErrorKind::Config | ErrorKind::Unsupported => EX_USAGE,
        ErrorKind::CorruptState | ErrorKind::WrongType | ErrorKind::StateLost => EX_DATAERR,
        ErrorKind::LeaseLost | ErrorKind::OutcomeUnknown => EX_LOST,
        // No retry helps: a supervisor must not restart baton in a loop on these.
        ErrorKind::Permission => EX_NOPERM,
        ErrorKind::Misconfigured => EX_CONFIG,
        _ => EX_UNAVAILABLE,
    }
}

async fn connect(url: &str) -> Result<Client, u8> {
    let mut builder = Client::builder(url);
    if let Some(path) = std::env::var_os("BATON_REDIS_PASSWORD_FILE") {
        builder = builder.password_file(path).map_err(usage)?;
    }
    if let Some(path) = std::env::var_os("BATON_TLS_CA_FILE") {
        builder = builder.tls_root_ca_file(path).map_err(usage)?;
    }
    match (
        std::env::var_os("BATON_TLS_CERT_FILE"),
        std::env::var_os("BATON_TLS_KEY_FILE"),
    ) {
        (Some(cert), Some(key)) => {
            builder = builder.tls_client_cert_files(cert, key).map_err(usage)?;
        }
        (None, None) => {}
        _ => {
            return Err(usage(
                "BATON_TLS_CERT_FILE and BATON_TLS_KEY_FILE are set together or not at all",
            ))
        }
    }
    // The client retries connecting for a few seconds by itself; past that Redis is unavailable.
    match tokio::time::timeout(Duration::from_secs(8), builder.connect()).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(fail_with(&e)),
        Err(_) => {
            eprintln!("baton: the server did not answer within 8 s");
            Err(EX_UNAVAILABLE)
        }
    }
}

/// Where events go.
struct Sink {
    json: bool,
    file: Option<std::fs::File>,
    verbose: u8,
    key: String,
}

impl Sink {
    fn emit(&mut self, event: &Event) {
        if self.json || self.file.is_some() {
            let mut value = serde_json::to_value(event).unwrap_or_default();
            if let Some(map) = value.as_object_mut() {
                map.insert("key".into(), self.key.clone().into());
            }
            let line = value.to_string();
            if self.json {
                eprintln!("{line}");
            }
            if let Some(f) = &mut self.file {
                let _ = writeln!(f, "{line}");
            }
        }
        if self.json {
            return;
        }
        let important = matches!(
            event,
            Event::Error { .. } | Event::LeaseLost { .. } | Event::DeadlinePassed { .. }
        );
        if important || self.verbose >= 1 {
            eprintln!("baton: {}: {}", self.key, describe(event));
        }
    }

    /// A remark shown with --verbose.
    fn note(&mut self, text: &str) {
        if !self.json && self.verbose >= 1 {
            eprintln!("baton: {}: {text}", self.key);
        }
    }

    /// Something the operator must see (not with --json, whose events tell it).
    fn warn(&mut self, text: &str) {
        if !self.json {
            eprintln!("baton: {}: {text}", self.key);
        }
    }
}

fn describe(event: &Event) -> String {
    match event {
        Event::Acquired(a) => format!(
            "acquired attempt {}{} (fencing token {})",
            a.attempt,
            if a.last { ", the last" } else { "" },
            a.fencing_token
        ),
        Event::Locked {
            attempt,
            lease_remaining_ms,
            ..
        } => format!(
            "attempt {attempt} runs elsewhere; waiting as a backup ({} ms lease left)",
            lease_remaining_ms.map_or("?".into(), |m| m.to_string())
        ),
        Event::Status { message, .. } => message.clone(),
        Event::Error {
            kind,
            message,
            retryable,
        } => format!(
            "error ({kind:?}{}): {message}",
            if *retryable { ", retrying" } else { "" }
        ),
        Event::DeadlinePassed { attempt } => format!("attempt {attempt} ran out of time"),
        Event::Lagged { dropped } => format!("{dropped} events dropped"),
        Event::Completed { attempt: Some(n) } => format!("done (attempt {n})"),
        Event::Completed { attempt: None } => "done by another worker".into(),
        Event::Exhausted { attempts } => format!("exhausted after {attempts} attempts"),
        Event::Failed { attempt, reason } => format!("attempt {attempt} failed: {reason}"),
        Event::LeaseLost { attempt, reason } => format!("lost attempt {attempt}: {reason}"),
        Event::Stopped => "stopped".into(),
        other => format!("{other:?}"),
    }
}

/// Builds and checks `run`'s job configuration and opens its events file.
fn run_config(args: &RunArgs, prefix: &str) -> Result<(FailoverConfig, Sink), u8> {
    let mut builder = FailoverConfig::builder(args.key.clone())
        .prefix(prefix)
        .lease(args.lock_timeout)
        .max_attempts(args.max_attempts)
        .retention(args.retention)
        .keepalive(!args.no_keepalive)
        .retry_delay(args.retry_delay);
    if let Some(name) = &args.name {
        builder = builder.worker_name(name.clone());
    }
    // Validate --max-run with the library's rules, but enforce it here: PROGRAM must be stopped
    // *before* the attempt is released, which only this process can do.
    builder
        .clone()
        .max_run(args.max_run)
        .build()
        .map_err(usage)?;
    let config = builder.build().map_err(usage)?;
    let file = match &args.events {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| usage(format!("cannot open {}: {e}", path.display())))?,
        ),
        None => None,
    };
    let sink = Sink {
        json: args.json,
        file,
        verbose: args.verbose,
        key: args.key.clone(),
    };
    Ok((config, sink))
}

/// The signals baton forwards to PROGRAM's group; each ends the attempt (exit 128 + n).
const FORWARDED: [libc::c_int; 4] = [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM];

/// The forwarded signals baton listens to.
struct Signals(Vec<(libc::c_int, tokio::signal::unix::Signal)>);

impl Signals {
    /// Listens to every forwarded signal that baton did not inherit as ignored: `nohup` leaves
    /// SIGHUP ignored, a script's `&` SIGINT and SIGQUIT. Those stay ignored, for PROGRAM too
    /// (an ignored signal stays ignored across `exec`).
    fn install() -> std::io::Result<Signals> {
        let mut streams = Vec::new();
        for sig in FORWARDED {
            if !inherited_ignored(sig) {
                streams.push((sig, signal(SignalKind::from_raw(sig))?));
            }
        }
        Ok(Signals(streams))
    }

    /// The next forwarded signal received. Cancel safe (as `Signal::recv`).
    async fn recv(&mut self) -> libc::c_int {
        std::future::poll_fn(|cx| {
            for (sig, stream) in &mut self.0 {
                if let Poll::Ready(Some(())) = stream.poll_recv(cx) {
                    return Poll::Ready(*sig);
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// The next delivery of `sig`, or never without a stream. Cancel safe.
async fn recv_or_pending(sig: &mut Option<tokio::signal::unix::Signal>) {
    if let Some(s) = sig {
        if s.recv().await.is_some() {
            return;
        }
    }
    std::future::pending().await
}

fn inherited_ignored(sig: libc::c_int) -> bool {
    // SAFETY: an all-zero `sigaction` is a valid value to write into; sigaction(2) with a null
    // new action only reads the current disposition into it.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// 128 + n, the shell's status for signal n.
fn signal_status(sig: libc::c_int) -> u8 {
    u8::try_from(128 + sig).unwrap_or(255)
}

fn signal_name(sig: libc::c_int) -> String {
    match sig {
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGINT => "SIGINT".into(),
        libc::SIGQUIT => "SIGQUIT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGTSTP => "SIGTSTP".into(),
        libc::SIGTTIN => "SIGTTIN".into(),
        libc::SIGTTOU => "SIGTTOU".into(),
        n => format!("signal {n}"),
    }
}

/// The forwarded signals and SIGCHLD, listened to before PROGRAM exists so none of its status
/// changes can be missed; `Err` is the exit status (reported).
fn install_signals() -> Result<(Signals, tokio::signal::unix::Signal), u8> {
    let installed = Signals::install().and_then(|s| Ok((s, signal(SignalKind::child())?)));
    installed.map_err(|e| {
        eprintln!("baton: cannot install signal handlers: {e}");
        EX_UNAVAILABLE
    })
}

async fn run(client: &Client, args: &RunArgs, config: FailoverConfig, mut sink: Sink) -> u8 {
    let (mut signals, mut sigchld) = match install_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let mut worker = client.failover().start(config.clone());
    let mut failing_since: Option<Instant> = None;
    loop {
        let event = tokio::select! {
            sig = signals.recv() => {
                return stop_waiting(&mut worker, &mut sink, signal_status(sig)).await;
            }
            ev = worker.next() => ev,
        };
        let Some(event) = event else {
            eprintln!("baton: the worker ended unexpectedly");
            return EX_UNAVAILABLE;
        };
        sink.emit(&event);
        match event {
            Event::Acquired(acquired) => {
                let mut holder = Holder {
                    args,
                    client,
                    config: &config,
                    worker: &mut worker,
                    sink: &mut sink,
                    signals: &mut signals,
                    sigchld: &mut sigchld,
                };
                return holder.hold(acquired).await;
            }
            Event::Error {
                retryable: true, ..
            } => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(5) {
                    eprintln!("baton: {}: redis keeps failing; giving up", args.key);
                    return stop_waiting(&mut worker, &mut sink, EX_UNAVAILABLE).await;
                }
            }
            Event::Error { kind, message, .. } => {
                if args.json {
                    eprintln!("baton: {message}");
                }
                return exit_for(kind);
            }
            Event::Completed { .. } => return 0,
            Event::Exhausted { .. } => return EX_EXHAUSTED,
            Event::Stopped => return 130,
            Event::Locked { .. } | Event::Status { .. } => failing_since = None,
            _ => {}
        }
    }
}

/// Stops a waiting worker, reads its remaining events, and returns `code`.
async fn stop_waiting(worker: &mut baton::Worker, sink: &mut Sink, code: u8) -> u8 {
    worker.stop();
    drain(worker, sink).await;
    code
}

/// Reads the worker's events until the stream ends (bounded).
async fn drain(worker: &mut baton::Worker, sink: &mut Sink) -> Option<Event> {
    let mut last = None;
    let deadline = Instant::now() + Duration::from_secs(15);
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline, worker.next()).await {
        sink.emit(&ev);
        last = Some(ev);
    }
    last
}

/// `at + d`, saturating far in the future instead of overflowing.
fn later(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(FAR))
        .unwrap_or(at)
}

/// Why PROGRAM is being stopped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stopping {
    /// The attempt is lost or out of time: exit 74.
    Lost,
    /// baton got this forwarded signal: exit 128 + n.
    Signal(libc::c_int),
}

/// How the lease PROGRAM runs under was lost.
struct Loss {
    /// Send SIGTERM first (PROGRAM may still clean up until `kill_at`).
    term: bool,
    /// When PROGRAM must be dead: SIGKILL then (at once when already past).
    kill_at: Instant,
}

/// The lease PROGRAM runs under, as [`Supervisor::supervise`] watches it: a failover attempt
/// (`baton run`) or a fenced mutex (`baton lock`). Whatever the lease, PROGRAM is handled the
/// same way (process group, terminal, signals, job control); only what "lost" means differs.
trait Lease {
    /// The next loss of the lease; pending forever once nothing more can come. Cancel safe.
    async fn lost(&mut self, sink: &mut Sink) -> Loss;

    /// Whether this process still holds the lease after being stopped (job control) for
    /// `away`; `Err` says why not.
    async fn still_held(&mut self, away: Duration) -> Result<(), String>;
}

/// How PROGRAM's supervision ended.
struct Supervised {
    /// PROGRAM's wait status (`Err`: baton lost track of it).
    status: std::io::Result<std::process::ExitStatus>,
    /// Why baton stopped PROGRAM, if it did.
    stopping: Option<Stopping>,
    /// What to record as the reason of a [`Stopping::Lost`].
    why: String,
    /// Whether PROGRAM's group had the terminal when PROGRAM ended (its SIGINT then most
    /// likely came from Ctrl-C, which reaches PROGRAM's group only).
    had_terminal: bool,
}

/// Runs PROGRAM to its end: forwards signals, follows job control, stops PROGRAM when the lease
/// is lost or a time limit passes. Shared by `baton run` and `baton lock`.
struct Supervisor<'a> {
    sink: &'a mut Sink,
    signals: &'a mut Signals,
    sigchld: &'a mut tokio::signal::unix::Signal,
    /// Time between SIGTERM and SIGKILL when baton stops PROGRAM (signal or time limit).
    kill_grace: Duration,
    /// When the lease ends for sure (no keepalive): PROGRAM is dead by then, whatever the grace.
    lease_end: Option<Instant>,
}

impl Supervisor<'_> {
    /// Watches `program` until it is reaped. `term_at` (SIGTERM, then SIGKILL `kill_grace`
    /// later, never past `lease_end`) stops it for `why`, e.g. a deadline or --max-run.
    async fn supervise<L: Lease>(
        &mut self,
        program: &mut Program,
        lease: &mut L,
        term_at: Instant,
        why: String,
    ) -> Supervised {
        let far = later(Instant::now(), FAR);
        let lease_end = self.lease_end;
        let mut why_text = why;
        let mut reason = Stopping::Lost;
        let mut kill_at = far;
        let mut stopping: Option<Stopping> = None;
        // Once PROGRAM's leader ended: whether what it left running in its group got SIGTERM,
        // and when the group got SIGKILL (if it did).
        let mut draining = false;
        let mut killed_at: Option<Instant> = None;
        // SIGCHLD reports every change of PROGRAM; this slow tick is only a safety net.
        let mut recheck = tokio::time::interval(Duration::from_secs(1));
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A SIGTSTP for baton itself (Ctrl-Z when stdin is not the terminal, or `kill -TSTP`)
        // goes to PROGRAM: stopping baton alone would let the lease lapse while PROGRAM runs.
        // PROGRAM's stop then stops baton too (below).
        let mut sigtstp = if inherited_ignored(libc::SIGTSTP) {
            None
        } else {
            signal(SignalKind::from_raw(libc::SIGTSTP)).ok()
        };
        let status = 'watch: loop {
            tokio::select! {
                _ = self.sigchld.recv() => {}
                _ = recheck.tick() => {}
                // No SIGCHLD tells of PROGRAM's leftovers ending (they are not baton's children).
                _ = tokio::time::sleep(LEFTOVER_POLL), if program.ended => {}
                loss = lease.lost(self.sink) => {
                    // The lease has ended or is about to: PROGRAM must be gone before it could
                    // pass on. Whatever stopped PROGRAM before, this is now a lost lease; once
                    // PROGRAM ended by itself, its status stands (the lost lease still fails the
                    // record of a success, or the lock's release) and only its leftovers go.
                    if !program.ended {
                        stopping = Some(Stopping::Lost);
                    }
                    if loss.term {
                        program.signal(libc::SIGTERM);
                    }
                    if loss.kill_at <= Instant::now() {
                        program.signal(libc::SIGKILL);
                        killed_at.get_or_insert_with(Instant::now);
                        kill_at = far;
                    } else {
                        kill_at = kill_at.min(loss.kill_at);
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(term_at), if stopping.is_none() && !program.ended => {
                    self.sink.note(&format!("stopping PROGRAM: {why_text}"));
                    stopping = Some(reason);
                    program.signal(libc::SIGTERM);
                    kill_at = cap(later(Instant::now(), self.kill_grace), lease_end);
                    continue;
                }
                _ = tokio::time::sleep_until(kill_at) => {
                    program.signal(libc::SIGKILL);
                    killed_at.get_or_insert_with(Instant::now);
                    kill_at = far;
                    continue;
                }
                _ = recv_or_pending(&mut sigtstp) => {
                    if stopping.is_none() && !program.ended {
                        program.signal(libc::SIGTSTP);
                    }
                    continue;
                }
                sig = self.signals.recv() => {
                    if program.ended {
                        // PROGRAM's status is settled; the signal only hurries its leftovers.
                        self.sink.note(&format!(
                            "got {}; forwarding it to what PROGRAM left running",
                            signal_name(sig)
                        ));
                        program.signal(sig);
                        kill_at =
                            kill_at.min(cap(later(Instant::now(), self.kill_grace), lease_end));
                        continue;
                    }
                    self.sink.note(&format!("got {}; forwarding it to PROGRAM", signal_name(sig)));
                    reason = Stopping::Signal(sig);
                    // A lost lease stays the reason: PROGRAM is already being killed for it.
                    if stopping != Some(Stopping::Lost) {
                        stopping = Some(reason);
                    }
                    program.signal(sig);
                    kill_at = kill_at.min(cap(later(Instant::now(), self.kill_grace), lease_end));
                    continue;
                }
            }
            // SIGCHLD (or a tick): collect what happened to PROGRAM.
            loop {
                match program.poll() {
                    Ok(None) => break,
                    Ok(Some(Change::Ended)) => break,
                    Err(e) => break 'watch Err(e),
                    Ok(Some(Change::Stopped(sig))) if is_job_control_stop(sig) => {
                        if stopping.is_some() {
                            // PROGRAM is on its way out: let it run so it can act on that.
                            program.signal(libc::SIGCONT);
                        } else if let Err(why) = self.suspend(program, sig, lease).await {
                            self.sink.warn(&format!("{why}; killing PROGRAM"));
                            why_text = why;
                            stopping = Some(Stopping::Lost);
                            program.signal(libc::SIGTERM);
                            program.signal(libc::SIGKILL);
                        }
                    }
                    Ok(Some(_)) => {}
                }
            }
            if !program.ended {
                continue;
            }
            // PROGRAM's leader ended: nothing it started may outlive it (the lease is released
            // or DONE written only after this returns). What is left in its group gets SIGTERM,
            // then SIGKILL after --kill-grace (never past the lease's end), as PROGRAM would.
            match program.leftovers() {
                Ok(false) => break 'watch program.reap(),
                Err(e) => {
                    self.sink.warn(&format!(
                        "cannot look for what PROGRAM left running ({e}); killing its process group"
                    ));
                    break 'watch program.reap();
                }
                Ok(true) if !draining => {
                    draining = true;
                    self.sink.note(&format!(
                        "PROGRAM ended; stopping what it left running in its process group \
                         (SIGTERM, then SIGKILL after {:?})",
                        self.kill_grace
                    ));
                    program.signal(libc::SIGTERM);
                    kill_at = kill_at.min(cap(later(Instant::now(), self.kill_grace), lease_end));
                }
                Ok(true) => {
                    // SIGKILL cannot be ignored; what survives it a while is out of baton's
                    // reach (a set-user-ID program it may not signal): waiting longer would not
                    // help, and would hold the lease forever.
                    if killed_at.is_some_and(|at| at.elapsed() >= KILL_SETTLE) {
                        self.sink.warn(
                            "something PROGRAM left running in its process group survived \
                             SIGKILL (baton may not signal it); going on without it",
                        );
                        break 'watch program.reap();
                    }
                }
            }
        };
        let had_terminal = program.has_terminal;
        program.take_terminal_back();
        Supervised {
            status,
            stopping,
            why: why_text,
            had_terminal,
        }
    }

    /// PROGRAM was stopped by job control (Ctrl-Z, or it read the terminal in the background):
    /// stop baton as well, as the shell expects of a job, and once continued resume PROGRAM only
    /// if this process still holds its lease. `Err` says why it does not.
    async fn suspend<L: Lease>(
        &mut self,
        program: &mut Program,
        sig: libc::c_int,
        lease: &mut L,
    ) -> Result<(), String> {
        self.sink.note(&format!(
            "PROGRAM was stopped by {}; stopping baton too (the lease is not extended meanwhile)",
            signal_name(sig)
        ));
        program.take_terminal_back();
        let stopped_at = Instant::now();
        // SAFETY: raise(3) has no memory-safety preconditions. SIGSTOP cannot be caught, and
        // unlike SIGTSTP it is not discarded in an orphaned process group: this process stops
        // here until a SIGCONT, and raise returns then.
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
        let away = stopped_at.elapsed();
        self.sink
            .note(&format!("continued after {away:?}; checking the lease"));
        if self.lease_end.is_some_and(|end| Instant::now() >= end) {
            return Err(format!(
                "the lease ran out while baton was stopped ({away:?})"
            ));
        }
        lease.still_held(away).await?;
        program.give_terminal();
        program.signal(libc::SIGCONT);
        Ok(())
    }
}

/// `baton run`'s lease: a failover attempt, reported by the worker's events.
struct RunLease<'a> {
    args: &'a RunArgs,
    client: &'a Client,
    config: &'a FailoverConfig,
    worker: &'a mut baton::Worker,
    attempt: u64,
    /// An ended stream answers `None` at once, forever: stop polling it, or the supervision
    /// loop would spin and starve the runtime of the SIGCHLD that reports PROGRAM's exit.
    events_ended: bool,
}

impl Lease for RunLease<'_> {
    async fn lost(&mut self, sink: &mut Sink) -> Loss {
        loop {
            if self.events_ended {
                return std::future::pending().await;
            }
            // Cancel safe: `Worker::next` is, and nothing else awaits here.
            let Some(ev) = self.worker.next().await else {
                self.events_ended = true;
                continue;
            };
            sink.emit(&ev);
            let now = Instant::now();
            match ev {
                // No keepalive: the lease is about to end; PROGRAM must stop now.
                Event::DeadlinePassed { .. } => {
                    return Loss {
                        term: false,
                        kill_at: now,
                    }
                }
                // The lease has ended (or belongs to someone else): stop at once.
                Event::LeaseLost { .. }
                | Event::Error {
                    retryable: false, ..
                } => {
                    return Loss {
                        term: true,
                        kill_at: now,
                    }
                }
                _ => {}
            }
        }
    }

    async fn still_held(&mut self, away: Duration) -> Result<(), String> {
        let attempt = self.attempt;
        let lost = |what: String| Err(format!("{what} while baton was stopped ({away:?})"));
        let status = tokio::time::timeout(
            LEASE_CHECK_TIMEOUT,
            self.client.failover().job_status(self.config.clone()),
        )
        .await;
        match status {
            Ok(Ok(s)) => match s.state {
                // Attempt numbers are granted once: a live lease on ours is ours.
                JobState::Attempt {
                    number,
                    holder: Some(_),
                    ..
                } if number == attempt => Ok(()),
                JobState::Attempt { number, .. } if number == attempt => {
                    lost("the lease ran out".into())
                }
                other => lost(format!("attempt {attempt} ended (the job is now {other})")),
            },
            // Redis cannot tell now. With keepalive the lease was extended at most a third of it
            // before the stop: half a lease later it surely still runs, and the worker's next
            // extension settles the rest.
            _ if away < self.args.lock_timeout / 2 => Ok(()),
            Ok(Err(e)) => lost(format!("the lease could not be confirmed ({e})")),
            Err(_) => lost("the lease could not be confirmed (no answer from redis)".into()),
        }
    }
}

struct Holder<'a> {
    args: &'a RunArgs,
    client: &'a Client,
    config: &'a FailoverConfig,
    worker: &'a mut baton::Worker,
    sink: &'a mut Sink,
    signals: &'a mut Signals,
    sigchld: &'a mut tokio::signal::unix::Signal,
}

impl Holder<'_> {
    async fn hold(&mut self, acquired: baton::Acquired) -> u8 {
        let args = self.args;
        let tty = in_foreground();
        let env = [
            ("BATON_KEY", args.key.clone()),
            ("BATON_ATTEMPT", acquired.attempt.to_string()),
            ("BATON_LAST_ATTEMPT", acquired.last.to_string()),
            ("BATON_FENCING_TOKEN", acquired.fencing_token.to_string()),
        ];
        let mut program = match spawn(&args.program, &env, tty) {
            Ok(p) => p,
            Err(e) => {
                let code = spawn_failed(&args.program, &e, tty);
                let _ = acquired.fail(format!("cannot execute PROGRAM: {e}")).await;
                drain(self.worker, self.sink).await;
                return code;
            }
        };
        let now = Instant::now();
        let far = later(now, FAR);
        // Without keepalive the lease ends lock_timeout after the grant's EXEC was sent: the
        // worker computed that instant (`lease_deadline`, a little early) when the grant came
        // back, so any time between that and this point is already counted. PROGRAM must be
        // gone by then: SIGTERM kill_grace (at most a quarter lease) before, SIGKILL at it.
        let lease_end = args.no_keepalive.then_some(acquired.lease_deadline);
        // The grant's send time (as early as the deadline errs): --max-run counts from it.
        let granted = acquired
            .lease_deadline
            .checked_sub(args.lock_timeout)
            .unwrap_or(now);
        let mut term_at = match lease_end {
            Some(end) => end
                .checked_sub(args.kill_grace.min(args.lock_timeout / 4))
                .unwrap_or(end),
            None => far,
        };
        let mut why_text = String::from("deadline passed");
        if let Some(max_run) = args.max_run {
            let at = later(granted, max_run);
            if at < term_at {
                term_at = at;
                why_text = format!("max_run of {max_run:?} reached");
            }
        }
        let mut lease = RunLease {
            args,
            client: self.client,
            config: self.config,
            worker: self.worker,
            attempt: acquired.attempt,
            events_ended: false,
        };
        let mut supervisor = Supervisor {
            sink: self.sink,
            signals: self.signals,
            sigchld: self.sigchld,
            kill_grace: args.kill_grace,
            lease_end,
        };
        let Supervised {
            status,
            stopping,
            why: why_text,
            ..
        } = supervisor
            .supervise(&mut program, &mut lease, term_at, why_text)
            .await;
        let status = match status {
            Ok(s) => s,
            Err(e) => {
                eprintln!("baton: lost track of PROGRAM: {e}");
                let _ = acquired.fail(format!("lost track of PROGRAM: {e}")).await;
                drain(self.worker, self.sink).await;
                return EX_LOST;
            }
        };
        let code = exit_code(&status);
        match stopping {
            Some(Stopping::Lost) => {
                let _ = acquired.fail(why_text).await;
                drain(self.worker, self.sink).await;
                EX_LOST
            }
            Some(Stopping::Signal(sig)) => {
                let _ = acquired
                    .fail(format!("baton got {}", signal_name(sig)))
                    .await;
                drain(self.worker, self.sink).await;
                signal_status(sig)
            }
            None if status.success() => match acquired.done().await {
                Ok(()) => {
                    drain(self.worker, self.sink).await;
                    0
                }
                Err(e) if e.kind() == ErrorKind::OutcomeUnknown => {
                    eprintln!(
                        "baton: PROGRAM succeeded, but whether that was recorded is unknown: the \
                         job may or may not be DONE (see `baton status`): {e}"
                    );
                    drain(self.worker, self.sink).await;
                    EX_LOST
                }
                Err(e) => {
                    eprintln!(
                        "baton: PROGRAM succeeded but the success could not be recorded: {e}"
                    );
                    drain(self.worker, self.sink).await;
                    EX_LOST
                }
            },
            None => {
                let reason = format!("PROGRAM exited with status {code}");
                match acquired.fail(reason).await {
                    Ok(()) | Err(baton::Error::LeaseLost { .. }) => {}
                    Err(e) => eprintln!("baton: the failure could not be recorded: {e}"),
                }
                drain(self.worker, self.sink).await;
                code
            }
        }
    }
}

/// Checks `lock`'s durations (before connecting) and sets up its output.
fn lock_config(args: &LockArgs) -> Result<(AcquireOptions, Sink), u8> {
    if args.ttl < baton::mutex::MIN_TTL || args.ttl > baton::mutex::MAX_TTL {
        return Err(usage(format!(
            "--ttl {:?} is outside 10ms ..= 1 day",
            args.ttl
        )));
    }
    // The watchdog is started here, not by `acquire`: it must run from the grant on, and the
    // loss it reports is what stops PROGRAM.
    let mut opts = AcquireOptions::builder().watchdog(true);
    if let Some(wait) = args.wait {
        opts = opts.wait(wait);
    }
    let opts = opts.build().map_err(usage)?;
    let sink = Sink {
        json: false,
        file: None,
        verbose: args.verbose,
        key: args.key.clone(),
    };
    Ok((opts, sink))
}

/// What `baton lock` needs of a held lock (the fenced mutex or a Redlock): its watchdog's loss
/// signal and the deadline before which the lock cannot pass on.
trait HeldLock {
    async fn lost(&self);
    fn loss_reason(&self) -> Option<String>;
    /// Errs early: the mutex's lease deadline (send time of the last confirmed extension + ttl
    /// − margin), a Redlock's validity (round start + ttl − elapsed − drift).
    fn deadline(&self) -> Instant;
}

impl HeldLock for LockGuard {
    async fn lost(&self) {
        LockGuard::lost(self).await;
    }
    fn loss_reason(&self) -> Option<String> {
        LockGuard::loss_reason(self)
    }
    fn deadline(&self) -> Instant {
        self.lease_deadline()
    }
}

impl HeldLock for RedlockGuard {
    async fn lost(&self) {
        RedlockGuard::lost(self).await;
    }
    fn loss_reason(&self) -> Option<String> {
        RedlockGuard::loss_reason(self)
    }
    fn deadline(&self) -> Instant {
        self.validity_deadline()
    }
}

impl HeldLock for Term {
    async fn lost(&self) {
        Term::lost(self).await;
    }
    fn loss_reason(&self) -> Option<String> {
        Term::loss_reason(self)
    }
    fn deadline(&self) -> Instant {
        self.lease_deadline()
    }
}

/// `baton lock`'s lease: a held lock and its watchdog's loss signal.
struct LockLease<'a, G> {
    guard: &'a G,
    kill_grace: Duration,
    /// The loss signal fires once and stays fired: report it once.
    reported: bool,
}

impl<G: HeldLock> Lease for LockLease<'_, G> {
    async fn lost(&mut self, sink: &mut Sink) -> Loss {
        if self.reported {
            return std::future::pending().await;
        }
        // Cancel safe: a cancellation token's `cancelled()` is.
        self.guard.lost().await;
        self.reported = true;
        let reason = self
            .guard
            .loss_reason()
            .unwrap_or_else(|| "the lock was lost".into());
        sink.warn(&format!("lock lost: {reason}; stopping PROGRAM"));
        // The deadline errs early: killed by then, PROGRAM is gone before the lock can expire
        // and pass on. When the loss is the deadline itself, that is now: SIGKILL at once. A
        // refused extension (the key is gone or foreign) can come earlier; PROGRAM then gets
        // the time left, at most --kill-grace, to stop cleanly: another holder may already
        // run, which only the fencing token guards against.
        let kill_at = self
            .guard
            .deadline()
            .min(later(Instant::now(), self.kill_grace));
        Loss {
            term: true,
            kill_at,
        }
    }

    async fn still_held(&mut self, away: Duration) -> Result<(), String> {
        let lost = |what: String| Err(format!("{what} while baton was stopped ({away:?})"));
        if let Some(reason) = self.guard.loss_reason() {
            return lost(format!("the lock was lost ({reason})"));
        }
        // Nothing was extended while stopped: past the deadline the key may have expired and
        // passed on. Before it, the watchdog's next extension settles the rest.
        if Instant::now() >= self.guard.deadline() {
            return lost("the lease ran out".into());
        }
        Ok(())
    }
}

async fn lock(
    client: &Client,
    args: &LockArgs,
    opts: AcquireOptions,
    mut sink: Sink,
    prefix: &str,
) -> u8 {
    let locks = match client.locks().with_prefix(prefix) {
        Ok(l) => l,
        Err(e) => return usage(e),
    };
    let (mut signals, mut sigchld) = match install_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    sink.note("waiting for the lock");
    let got = tokio::select! {
        sig = signals.recv() => Err(sig),
        got = locks.acquire(&args.key, args.ttl, &opts) => Ok(got),
    };
    let guard = match got {
        Ok(Ok(guard)) => guard,
        Ok(Err(e)) if e.kind() == ErrorKind::NotAcquired => {
            eprintln!("baton: {}: not acquired: {e}", args.key);
            return EX_TEMPFAIL;
        }
        Ok(Err(e)) => return fail_with(&e),
        Err(sig) => {
            // The dropped acquisition releases a lock its script may just have taken, by token,
            // in a task of the client: let it finish (bounded) rather than leave the lock
            // blocking everyone for its ttl.
            client.shutdown(LEASE_CHECK_TIMEOUT).await;
            return signal_status(sig);
        }
    };
    let fence = guard.fencing_token();
    sink.note(&format!("acquired (fencing token {fence})"));
    let tty = in_foreground();
    let env = [
        ("BATON_LOCK_KEY", args.key.clone()),
        ("BATON_FENCING_TOKEN", fence.to_string()),
    ];
    let mut program = match spawn(&args.program, &env, tty) {
        Ok(p) => p,
        Err(e) => {
            let code = spawn_failed(&args.program, &e, tty);
            let _ = guard.release().await;
            return code;
        }
    };
    let mut lease = LockLease {
        guard: &guard,
        kill_grace: args.kill_grace,
        reported: false,
    };
    let mut supervisor = Supervisor {
        sink: &mut sink,
        signals: &mut signals,
        sigchld: &mut sigchld,
        kill_grace: args.kill_grace,
        // The watchdog keeps the lease: its loss signal, not a fixed end, bounds PROGRAM.
        lease_end: None,
    };
    let far = later(Instant::now(), FAR);
    let done = supervisor
        .supervise(&mut program, &mut lease, far, String::new())
        .await;
    // Released in every case: after a loss the token check makes this a no-op on a lock that
    // passed on, and it frees at once a lock whose loss was only a missed deadline.
    let released = guard.release().await;
    let status = match done.status {
        Ok(s) => s,
        Err(e) => {
            eprintln!("baton: lost track of PROGRAM: {e}");
            return EX_LOST;
        }
    };
    match done.stopping {
        Some(Stopping::Lost) => EX_LOST,
        Some(Stopping::Signal(sig)) => signal_status(sig),
        None => match released {
            Ok(true) => exit_code(&status),
            Ok(false) => {
                eprintln!(
                    "baton: {}: PROGRAM ended, but the lock was held by another token by then \
                     (mutual exclusion may have been broken)",
                    args.key
                );
                EX_LOST
            }
            Err(e) => {
                // PROGRAM finished while the lock was ours; it expires by its ttl.
                eprintln!(
                    "baton: {}: the release failed (the lock expires by its ttl): {e}",
                    args.key
                );
                exit_code(&status)
            }
        },
    }
}

/// `baton leader`: campaign, run PROGRAM while leading, campaign again after a loss.
async fn leader(
    client: &Client,
    args: &LeaderArgs,
    opts: ElectionOptions,
    mut sink: Sink,
    prefix: &str,
) -> u8 {
    let elector = match client
        .leaders()
        .with_prefix(prefix)
        .map_err(baton::Error::from)
        .and_then(|l| l.elector(&args.key, &opts))
    {
        Ok(e) => e,
        Err(e) => return fail_with(&e),
    };
    let (mut signals, mut sigchld) = match install_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    // SIGTERM and SIGINT end a leader gracefully (exit 0); SIGHUP and SIGQUIT the same way
    // with their own status.
    let graceful = |sig: libc::c_int| {
        if sig == libc::SIGTERM || sig == libc::SIGINT {
            0
        } else {
            signal_status(sig)
        }
    };
    loop {
        sink.note("campaigning");
        let got = tokio::select! {
            sig = signals.recv() => Err(sig),
            got = elector.campaign() => Ok(got),
        };
        let term = match got {
            Ok(Ok(term)) => term,
            Ok(Err(e)) => return fail_with(&e),
            Err(sig) => {
                // A dropped campaign releases a lease its script may just have taken, in a task
                // of the client: let it finish (bounded).
                drop(elector);
                client.shutdown(LEASE_CHECK_TIMEOUT).await;
                return graceful(sig);
            }
        };
        sink.note(&format!("elected (term {})", term.number()));
        let tty = in_foreground();
        let env = [
            ("BATON_LEADER_KEY", args.key.clone()),
            ("BATON_FENCING_TOKEN", term.number().to_string()),
        ];
        let mut program = match spawn(&args.program, &env, tty) {
            Ok(p) => p,
            Err(e) => {
                let code = spawn_failed(&args.program, &e, tty);
                let _ = elector.resign().await;
                return code;
            }
        };
        let mut lease = LockLease {
            guard: &term,
            kill_grace: args.kill_grace,
            reported: false,
        };
        let mut supervisor = Supervisor {
            sink: &mut sink,
            signals: &mut signals,
            sigchld: &mut sigchld,
            kill_grace: args.kill_grace,
            lease_end: None,
        };
        let far = later(Instant::now(), FAR);
        let done = supervisor
            .supervise(&mut program, &mut lease, far, String::new())
            .await;
        // Resigned in every case: after a loss the token check makes this a no-op on a lease
        // that passed on, and it lets a standby lead at once otherwise.
        if let Err(e) = elector.resign().await {
            sink.warn(&format!(
                "resigning failed (the lease runs out by itself): {e}"
            ));
        }
        let status = match done.status {
            Ok(s) => s,
            Err(e) => {
                eprintln!("baton: lost track of PROGRAM: {e}");
                return EX_LOST;
            }
        };
        match done.stopping.or_else(|| terminal_signal(&done, &status)) {
            Some(Stopping::Lost) => {
                sink.warn(&format!(
                    "term {} ended; PROGRAM was stopped; campaigning again",
                    term.number()
                ));
            }
            Some(Stopping::Signal(sig)) => return graceful(sig),
            None => return exit_code(&status),
        }
    }
}

/// In a terminal, Ctrl-C and Ctrl-\ reach only the foreground group, PROGRAM's, never baton:
/// PROGRAM ended by SIGINT or SIGQUIT while it had the terminal is taken for that key typed at
/// baton, so `baton leader` keeps the meaning its help gives those signals (SIGINT: stop
/// PROGRAM, resign, exit 0). A PROGRAM that catches them and exits with a status of its own is
/// taken at its word.
fn terminal_signal(done: &Supervised, status: &std::process::ExitStatus) -> Option<Stopping> {
    let sig = status.signal()?;
    (done.had_terminal && matches!(sig, libc::SIGINT | libc::SIGQUIT))
        .then_some(Stopping::Signal(sig))
}

/// `--redlock`'s URLs: at least 3, an odd number, all distinct (checked before connecting).
fn redlock_urls(urls: &[String]) -> Result<(), u8> {
    let n = urls.len();
    if n < 3 {
        return Err(usage(format!(
            "--redlock needs at least 3 independent masters, got {n}"
        )));
    }
    if n % 2 == 0 {
        return Err(usage(format!(
            "--redlock needs an odd number of masters (3, 5, …), got {n}: one more master \
             raises the quorum without tolerating one more failure"
        )));
    }
    for (i, u) in urls.iter().enumerate() {
        if u.trim().is_empty() {
            return Err(usage("--redlock: an empty URL"));
        }
        if urls[..i].contains(u) {
            return Err(usage(
                "--redlock: a master is given twice (one server counted twice would fake a quorum)",
            ));
        }
    }
    Ok(())
}

/// A client per `--redlock` master, built without connecting: a master that is down at start
/// is one failed vote, not a reason not to start (the acquisition says when too many are down,
/// exit 69 naming the quorum). `Err` is the exit status (64 for a bad URL or password file).
fn masters(urls: &[String]) -> Result<Vec<Client>, u8> {
    let mut clients = Vec::with_capacity(urls.len());
    for (i, u) in urls.iter().enumerate() {
        let mut builder = Client::builder(u.clone());
        if let Some(path) = std::env::var_os("BATON_REDIS_PASSWORD_FILE") {
            builder = builder
                .password_file(path)
                .map_err(|e| usage(format!("--redlock master {i}: {e}")))?;
        }
        clients.push(
            builder
                .build_lazy()
                .map_err(|e| usage(format!("--redlock master {i}: {e}")))?,
        );
    }
    Ok(clients)
}

async fn redlock(args: &LockArgs, opts: RedlockOptions, mut sink: Sink, prefix: &str) -> u8 {
    let clients = match masters(&args.redlock) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let code = redlock_with(&clients, args, opts, &mut sink, prefix).await;
    for c in &clients {
        c.shutdown(LEASE_CHECK_TIMEOUT).await;
    }
    code
}

async fn redlock_with(
    clients: &[Client],
    args: &LockArgs,
    opts: RedlockOptions,
    sink: &mut Sink,
    prefix: &str,
) -> u8 {
    let rl = match Redlock::new(clients).and_then(|r| r.with_prefix(prefix)) {
        Ok(r) => r,
        Err(e) => return usage(e),
    };
    let (mut signals, mut sigchld) = match install_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    sink.note("waiting for the Redlock");
    let got = tokio::select! {
        sig = signals.recv() => Err(sig),
        got = rl.acquire(&args.key, args.ttl, &opts) => Ok(got),
    };
    let mut guard = match got {
        Ok(Ok(guard)) => guard,
        Ok(Err(e)) if e.kind() == ErrorKind::NotAcquired => {
            eprintln!("baton: {}: not acquired: {e}", args.key);
            return EX_TEMPFAIL;
        }
        Ok(Err(e)) if e.kind() == ErrorKind::QuorumUnavailable => {
            eprintln!(
                "baton: {}: the Redlock needs a quorum of {} of {} masters: {e}",
                args.key,
                rl.quorum(),
                rl.masters()
            );
            return EX_UNAVAILABLE;
        }
        Ok(Err(e)) => return fail_with(&e),
        // The dropped acquisition releases on every master in a client task; the caller's
        // shutdown lets it finish.
        Err(sig) => return signal_status(sig),
    };
    guard.start_watchdog();
    sink.note(&format!(
        "acquired on a quorum of {} of {} masters (no fencing token: Redlock has none)",
        rl.quorum(),
        rl.masters()
    ));
    let tty = in_foreground();
    let env = [("BATON_LOCK_KEY", args.key.clone())];
    let mut program = match spawn(&args.program, &env, tty) {
        Ok(p) => p,
        Err(e) => {
            let code = spawn_failed(&args.program, &e, tty);
            let _ = guard.release().await;
            return code;
        }
    };
    let mut lease = LockLease {
        guard: &guard,
        kill_grace: args.kill_grace,
        reported: false,
    };
    let mut supervisor = Supervisor {
        sink,
        signals: &mut signals,
        sigchld: &mut sigchld,
        kill_grace: args.kill_grace,
        lease_end: None,
    };
    let far = later(Instant::now(), FAR);
    let done = supervisor
        .supervise(&mut program, &mut lease, far, String::new())
        .await;
    let quorum = rl.quorum();
    let released = guard.release().await;
    let status = match done.status {
        Ok(s) => s,
        Err(e) => {
            eprintln!("baton: lost track of PROGRAM: {e}");
            return EX_LOST;
        }
    };
    match done.stopping {
        Some(Stopping::Lost) => EX_LOST,
        Some(Stopping::Signal(sig)) => signal_status(sig),
        None => match released {
            Ok(held) if held >= quorum => exit_code(&status),
            Ok(held) => {
                eprintln!(
                    "baton: {}: PROGRAM ended, but only {held} masters still held the lock \
                     (a quorum is {quorum}; mutual exclusion may have been broken)",
                    args.key
                );
                EX_LOST
            }
            Err(e) => {
                eprintln!(
                    "baton: {}: the release failed (the lock expires by its ttl): {e}",
                    args.key
                );
                exit_code(&status)
            }
        },
    }
}

/// PROGRAM could not be started: gives the terminal back (the child made its group the
/// foreground one before its exec failed), says why, and returns 127 (not found) or 126.
fn spawn_failed(program: &[OsString], e: &std::io::Error, tty: bool) -> u8 {
    if tty {
        set_foreground(own_group());
    }
    eprintln!(
        "baton: cannot execute {}: {e}",
        program[0].to_string_lossy()
    );
    if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

/// `at`, but never later than the lease's end (if the lease is not kept alive).
fn cap(at: Instant, lease_end: Option<Instant>) -> Instant {
    match lease_end {
        Some(end) => at.min(end),
        None => at,
    }
}

/// The shell convention: the exit code, or 128 + the signal that ended the process.
fn exit_code(status: &std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => signal_status(sig),
        _ => 1,
    }
}

fn is_job_control_stop(sig: libc::c_int) -> bool {
    matches!(sig, libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU)
}

/// PROGRAM as this process started it: the leader of its own process group, watched with
/// `waitid` (never by tokio, so this process alone decides when the leader is reaped).
struct Program {
    pid: libc::pid_t,
    /// The process group PROGRAM leads, until the leader is reaped: from then on the number may
    /// name an unrelated process group, so no signal is sent to it any more.
    group: Option<libc::pid_t>,
    /// Whether PROGRAM's group was made the terminal's foreground group by baton (which then
    /// takes the terminal back).
    has_terminal: bool,
    /// Whether the leader has ended (it is a zombie, kept so until [`Program::reap`]).
    ended: bool,
    /// Kills the group if baton dies; stopped right before the leader is reaped. `None` when it
    /// could not be started (PROGRAM then runs with only its own parent-death signal).
    guard: Option<guard::Guard>,
}

/// A status change of PROGRAM.
enum Change {
    /// Its leader ended; it is a zombie until [`Program::reap`], so the group's number still
    /// names PROGRAM's group (and what PROGRAM left running in it can be stopped).
    Ended,
    /// It was stopped by this signal.
    Stopped(libc::c_int),
    /// It was continued (or traced).
    Other,
}

impl Program {
    /// Sends `sig` to PROGRAM's group, followed by SIGCONT for a terminating signal (a stopped
    /// process acts on it only once continued). Nothing once the leader was reaped.
    fn signal(&self, sig: libc::c_int) {
        let Some(group) = self.group.filter(|&g| g > 1) else {
            return;
        };
        // SAFETY: kill(2) has no memory-safety preconditions. The group's leader is not reaped
        // (at worst a zombie), so its number still names PROGRAM's group.
        unsafe {
            libc::kill(-group, sig);
            if FORWARDED.contains(&sig) {
                libc::kill(-group, libc::SIGCONT);
            }
        }
    }

    /// The next status change of PROGRAM, without blocking (`None`: nothing new; always once
    /// the leader has ended).
    fn poll(&mut self) -> std::io::Result<Option<Change>> {
        if self.group.is_none() || self.ended {
            return Ok(None);
        }
        loop {
            // Has it ended? Look without reaping it: while the leader is a zombie its number
            // cannot be reused, so what is left of its group can still be signalled by that
            // number.
            if waitid(self.pid, libc::WEXITED | libc::WNOWAIT)?.is_some() {
                self.ended = true;
                return Ok(Some(Change::Ended));
            }
            match stop_change(self.pid)? {
                StopChange::Ended => continue,
                StopChange::None => return Ok(None),
                StopChange::Stopped(sig) => return Ok(Some(Change::Stopped(sig))),
                StopChange::Other => return Ok(Some(Change::Other)),
            }
        }
    }

    /// Whether anything PROGRAM started still runs in its group, its leader having ended.
    /// `Err`: `/proc` cannot tell.
    fn leftovers(&self) -> std::io::Result<bool> {
        match self.group {
            Some(group) if self.ended => guard::group_has_live_members(group),
            _ => Ok(false),
        }
    }

    /// Reaps the ended leader (see [`Change::Ended`]) and returns its status. A last SIGKILL to
    /// the group first, for whatever the `/proc` scan could not see, then the guard is stopped:
    /// from the reap on, the group's number may name another group.
    fn reap(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.signal(libc::SIGKILL);
        if let Some(guard) = self.guard.take() {
            guard.stop();
        }
        let status = reap(self.pid)?;
        self.group = None;
        Ok(std::process::ExitStatus::from_raw(status))
    }

    /// Makes PROGRAM's group the terminal's foreground group again, if baton is in the
    /// foreground (it is not after a shell's `bg`).
    fn give_terminal(&mut self) {
        if let Some(group) = self.group {
            if in_foreground() && set_foreground(group) {
                self.has_terminal = true;
            }
        }
    }

    /// Makes baton's group the terminal's foreground group again, if it handed it to PROGRAM.
    fn take_terminal_back(&mut self) {
        if std::mem::take(&mut self.has_terminal) {
            set_foreground(own_group());
        }
    }
}

impl Drop for Program {
    /// A PROGRAM dropped before it was reaped (baton lost track of it and is giving up) is
    /// killed with its whole group, while the unreaped leader still holds the group's number;
    /// the guard is stopped only after that (its field drops after this body).
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
    }
}

/// What [`stop_change`] saw.
#[derive(Debug, PartialEq)]
enum StopChange {
    /// No stop or continue to report.
    None,
    /// Stopped by this signal.
    Stopped(libc::c_int),
    /// Continued (or traced).
    Other,
    /// The child has ended (it is a zombie): look for its exit status.
    Ended,
}

/// A stop or continue of the child `pid`, without blocking and without reaping it.
///
/// Linux answers `ECHILD` when the only matching child is a zombie and `WEXITED` was not asked
/// for: a child that ends between the exit check and this call is reported as
/// [`StopChange::Ended`], never as an error. `ECHILD` from a later exit check is then real.
fn stop_change(pid: libc::pid_t) -> std::io::Result<StopChange> {
    match waitid(pid, libc::WSTOPPED | libc::WCONTINUED) {
        Ok(None) => Ok(StopChange::None),
        // SAFETY: for CLD_STOPPED, waitid(2) filled in si_status (the stop signal).
        Ok(Some(info)) if info.si_code == libc::CLD_STOPPED => {
            Ok(StopChange::Stopped(unsafe { info.si_status() }))
        }
        Ok(Some(_)) => Ok(StopChange::Other),
        Err(e) if e.raw_os_error() == Some(libc::ECHILD) => Ok(StopChange::Ended),
        Err(e) => Err(e),
    }
}

/// waitid(2) on `pid` without blocking: the child's status, if it has one matching `flags`.
fn waitid(pid: libc::pid_t, flags: libc::c_int) -> std::io::Result<Option<libc::siginfo_t>> {
    loop {
        // SAFETY: an all-zero siginfo_t is valid; waitid writes one into it. With WNOHANG and no
        // matching change it leaves si_pid zero (it was zeroed, as POSIX leaves that unspecified).
        let (r, info) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                flags | libc::WNOHANG,
            );
            (r, info)
        };
        if r == -1 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // SAFETY: si_pid is valid for every SIGCHLD siginfo, and zero when nothing was reported.
        return Ok((unsafe { info.si_pid() } == pid).then_some(info));
    }
}

/// Reaps an ended child; returns its wait status.
fn reap(pid: libc::pid_t) -> std::io::Result<libc::c_int> {
    loop {
        let mut status = 0;
        // SAFETY: waitpid(2) writes the status into a valid local.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(status);
        }
        let e = std::io::Error::last_os_error();
        if r == -1 && e.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return Err(e);
    }
}

fn own_group() -> libc::pid_t {
    // SAFETY: getpgrp(2) has no preconditions and cannot fail.
    unsafe { libc::getpgrp() }
}

/// Whether baton may hand the terminal on: stdin is a terminal and baton's process group is its
/// foreground group (baton is not a background job).
fn in_foreground() -> bool {
    // SAFETY: isatty(3) and tcgetpgrp(3) on fd 0 have no memory-safety preconditions.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == own_group() }
}

/// Makes `group` the foreground group of the terminal on stdin. SIGTTOU is blocked meanwhile: a
/// background process calling tcsetpgrp would be stopped by it. Only async-signal-safe calls,
/// so PROGRAM's child side uses it between fork and exec.
fn set_foreground(group: libc::pid_t) -> bool {
    // SAFETY: all-zero sigset_t values are valid and initialized by sigemptyset; the mask is
    // restored before returning; tcsetpgrp on fd 0 has no memory-safety preconditions.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::sigprocmask(libc::SIG_BLOCK, &block, &mut old);
        let ok = libc::tcsetpgrp(0, group) == 0;
        libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        ok
    }
}

/// Starts PROGRAM as the leader of a new process group, with a guard that kills that group if
/// baton dies (see guard.rs); with `terminal`, that group takes the terminal before PROGRAM runs
/// (so its first read cannot meet SIGTTIN).
/// `program` is PROGRAM and its arguments (at least one element); `env` is added to baton's.
fn spawn(program: &[OsString], env: &[(&str, String)], terminal: bool) -> std::io::Result<Program> {
    // Started first, so that it knows PROGRAM's group before PROGRAM can start anything.
    let guard = match guard::Guard::start() {
        Ok(g) => Some(g),
        Err(e) => {
            // Without /proc, say. PROGRAM still dies with baton; what it starts may not.
            eprintln!(
                "baton: cannot start the guard of PROGRAM's process group ({e}): what PROGRAM \
                 starts may outlive baton"
            );
            None
        }
    };
    let pipe = guard.as_ref().map(guard::Guard::pipe);
    let mut cmd = std::process::Command::new(&program[0]);
    cmd.args(&program[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .process_group(0);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs in the forked child before exec and only calls the
    // async-signal-safe prctl(2), getppid(2), getpid(2), sigemptyset/sigaddset/sigprocmask,
    // tcsetpgrp(3), and `guard::announce` (getpgrp, signal, write), allocating nothing.
    unsafe {
        cmd.pre_exec(move || {
            // Die with baton, even when baton is SIGKILLed.
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // baton may have died between fork and prctl: then nobody would signal us.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // std made the process group before running this: the guard learns it now.
            if let Some(pipe) = pipe {
                guard::announce(pipe)?;
            }
            if terminal {
                // Best effort: without the terminal PROGRAM still runs (SIGTTIN if it reads).
                set_foreground(libc::getpid());
            }
            Ok(())
        });
    }
    // std's Child neither kills nor reaps on drop: `Program` does both. On an error the guard
    // is dropped (stopped) with it: std reaped the child that could not exec.
    let child = cmd.spawn()?;
    let pid = child.id() as libc::pid_t;
    Ok(Program {
        pid,
        group: Some(pid),
        has_terminal: terminal,
        ended: false,
        guard,
    })
}

fn status_json(s: &JobStatus) -> serde_json::Value {
    let (state, attempt, holder, lease) = state_parts(&s.state);
    serde_json::json!({
        "key": s.key,
        "state": state,
        "attempt": attempt,
        "holder": holder,
        "lease_remaining_ms": lease,
        "state_ttl_ms": s.state_ttl_ms,
        "fencing_token": s.fencing_token,
        "last_failure": s.last_failure,
    })
}

fn state_parts(state: &JobState) -> (&'static str, Option<u64>, Option<String>, Option<u64>) {
    match state {
        JobState::Absent => ("absent", None, None, None),
        JobState::Attempt {
            number,
            holder: Some(h),
            lease_remaining_ms,
        } => (
            "running",
            Some(*number),
            Some(h.clone()),
            *lease_remaining_ms,
        ),
        JobState::Attempt { number, .. } => ("waiting", Some(*number), None, None),
        JobState::Done => ("done", None, None, None),
        JobState::Exhausted => ("exhausted", None, None, None),
        _ => ("corrupt", None, None, None),
    }
}

fn status_text(s: &JobStatus) -> String {
    let state = match &s.state {
        JobState::Attempt {
            number,
            holder: Some(h),
            lease_remaining_ms,
        } => format!(
            "attempt {number} running (holder {h}, lease {} left)",
            lease_remaining_ms.map_or("without TTL".into(), ms_text)
        ),
        JobState::Attempt { number, .. } => {
            format!("attempt {number} ended without success; waiting for a backup to take over")
        }
        other => other.to_string(),
    };
    let mut out = format!("job:          {}\nstate:        {state}\n", s.key);
    if let Some(ttl) = s.state_ttl_ms {
        out += &format!("retained:     {} more\n", ms_text(ttl));
    }
    if let Some(f) = s.fencing_token {
        out += &format!("fencing:      {f}\n");
    }
    if let Some(r) = &s.last_failure {
        out += &format!("last failure: {r}\n");
    }
    out
}

fn ms_text(ms: u64) -> String {
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

async fn status(client: &Client, job: FailoverConfig, prefix: &str, json: bool) -> u8 {
    match client.failover().job_status(job).await {
        Ok(s) => {
            if json {
                println!("{}", status_json(&s));
            } else {
                print!("{}", status_text(&s));
            }
            if let JobState::Corrupt { value } = &s.state {
                eprintln!(
                    "baton: key `{prefix}{{{}}}` holds {value}, which baton never writes",
                    s.key
                );
                return EX_DATAERR;
            }
            0
        }
        Err(e) => fail_with(&e),
    }
}

async fn watch(client: &Client, job: FailoverConfig, json: bool) -> u8 {
    let mut changes = match client.failover().watch_job(job.clone()).await {
        Ok(w) => w,
        Err(e) => return fail_with(&e),
    };
    // Subscribed first, then read: nothing that happens in between is missed.
    let mut last = match client.failover().job_status(job).await {
        Ok(s) => s,
        Err(e) => return fail_with(&e),
    };
    print_change(json, "status", &last);
    while !last.is_finished() {
        match changes.next().await {
            Some(Ok(change)) => {
                print_change(json, &change.message, &change.status);
                last = change.status;
            }
            Some(Err(e)) => {
                eprintln!("baton: {e}");
            }
            None => break,
        }
    }
    match last.state {
        JobState::Done => 0,
        JobState::Exhausted => EX_EXHAUSTED,
        _ => EX_UNAVAILABLE,
    }
}

fn print_change(json: bool, message: &str, status: &JobStatus) {
    if json {
        println!(
            "{}",
            serde_json::json!({ "message": message, "state": status_json(status) })
        );
    } else {
        let (state, attempt, holder, _) = state_parts(&status.state);
        let mut line = format!("{message}: {state}");
        if let Some(a) = attempt {
            line += &format!(" attempt {a}");
        }
        if let Some(h) = holder {
            line += &format!(" held by {h}");
        }
        println!("{line}");
    }
}

async fn admin_fail(client: &Client, job: FailoverConfig, reason: &str, yes: bool) -> u8 {
    let key = job.key().to_string();
    match client.failover().job_status(job.clone()).await {
        Ok(s) if s.is_live() && !yes => {
            eprintln!(
                "baton: {key} is live ({}); pass --yes to release its attempt",
                s.state
            );
            return EX_USAGE;
        }
        Ok(_) => {}
        Err(e) => return fail_with(&e),
    }
    match client.failover().fail_attempt(job, reason).await {
        Ok(Some(n)) => {
            println!("released attempt {n} of {key}");
            0
        }
        Ok(None) => {
            println!("{key} has no live attempt; nothing to release");
            0
        }
        Err(e) => fail_with(&e),
    }
}

async fn reset(client: &Client, job: FailoverConfig, yes: bool) -> u8 {
    let key = job.key().to_string();
    match client.failover().job_status(job.clone()).await {
        Ok(s) if s.is_live() && !yes => {
            eprintln!("baton: {key} is live ({}); pass --yes to reset it", s.state);
            return EX_USAGE;
        }
        Ok(_) => {}
        Err(e) => return fail_with(&e),
    }
    match client.failover().reset_job(job).await {
        Ok(()) => {
            println!("reset {key}");
            0
        }
        Err(e) => fail_with(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_outcome_exits_74_and_the_help_says_the_job_may_or_may_not_be_done() {
        assert_eq!(exit_for(ErrorKind::OutcomeUnknown), EX_LOST);
        assert_eq!(exit_for(ErrorKind::LeaseLost), EX_LOST);
        assert!(EXIT_STATUSES.contains("may or may not be DONE"));
    }

    #[test]
    fn refusals_no_retry_fixes_have_their_own_statuses_in_every_table() {
        assert_eq!(exit_for(ErrorKind::Permission), EX_NOPERM);
        assert_eq!(exit_for(ErrorKind::Misconfigured), EX_CONFIG);
        assert_eq!(exit_for(ErrorKind::Connection), EX_UNAVAILABLE);
        assert_eq!(exit_for(ErrorKind::Busy), EX_UNAVAILABLE);
        for table in [
            EXIT_STATUSES,
            LOCK_EXIT_STATUSES,
            LEADER_EXIT_STATUSES,
            MIGRATE_HELP,
        ] {
            assert!(table.contains("77") && table.contains("78"), "{table}");
        }
    }

    /// A child that ends between `poll`'s exit check and its stop check: Linux answers that
    /// stop check with ECHILD, which once made `baton lock` exit 74 ("lost track of PROGRAM").
    #[test]
    // The child is reaped by `Program::poll`, which is what this test checks.
    #[allow(clippy::zombie_processes)]
    fn a_child_ending_between_the_exit_and_stop_checks_is_reaped_not_lost() {
        let child = std::process::Command::new("sh")
            .args(["-c", "exit 3"])
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while waitid(pid, libc::WEXITED | libc::WNOWAIT)
            .unwrap()
            .is_none()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the child never ended"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The ground the fix stands on: the zombie is invisible to a stop-only waitid.
        let raw = waitid(pid, libc::WSTOPPED | libc::WCONTINUED).unwrap_err();
        assert_eq!(raw.raw_os_error(), Some(libc::ECHILD));
        assert_eq!(stop_change(pid).unwrap(), StopChange::Ended);
        let mut program = Program {
            pid,
            group: Some(pid),
            has_terminal: false,
            ended: false,
            guard: None,
        };
        match program.poll().unwrap() {
            Some(Change::Ended) => {}
            _ => panic!("the ended child was not reported as ended"),
        }
        assert!(
            !program.leftovers().unwrap(),
            "nothing else was in its group"
        );
        assert_eq!(program.reap().unwrap().code(), Some(3));
        assert!(program.group.is_none());
    }

    #[test]
    fn forwarded_signals_exit_128_plus_n() {
        let codes: Vec<u8> = FORWARDED.iter().map(|&s| signal_status(s)).collect();
        assert_eq!(codes, [129, 130, 131, 143]);
    }
}
