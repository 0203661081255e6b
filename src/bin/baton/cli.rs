//! The command line: commands, flags and their help, and the duration parsers. Only the shape
//! of the command line lives here; checking the values against the library's rules is `plan` in
//! main.rs, before anything connects.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Args, CommandFactory, Parser, Subcommand, ValueEnum};

#[cfg(feature = "dashboard")]
use super::help::DASHBOARD_HELP;
use super::help::{
    CHECK_HELP, EXIT_STATUSES, JOB_ADMIN_HELP, LEADER_EXIT_STATUSES, LOCK_EXIT_STATUSES,
    MIGRATE_HELP, OVERVIEW, PAUSE_HELP, SCHEDULE_HELP, UNLOCK_HELP,
};

/// The longest `--kill-grace` accepted.
pub(crate) const MAX_KILL_GRACE: Duration = Duration::from_secs(24 * 3600);

/// Each command's help for `--prefix`: the keys it names differ (a job's, a lock's, an
/// election's), and so does what PostgreSQL does with it.
const PREFIX_HELP: [(&str, &str); 14] = [
    ("run", JOB_PREFIX),
    ("schedule", JOB_PREFIX),
    ("backfill", JOB_PREFIX),
    ("status", JOB_PREFIX),
    ("check", SCHEDULE_PREFIX),
    ("pause", SCHEDULE_PREFIX),
    ("resume", SCHEDULE_PREFIX),
    ("trigger", SCHEDULE_PREFIX),
    ("watch", JOB_PREFIX),
    ("fail", JOB_PREFIX),
    ("reset", JOB_PREFIX),
    (
        "lock",
        "Key prefix of the lock's keys: PREFIXlock:{KEY} on Redis (PREFIXredlock:{KEY} on each \
         --redlock master); on PostgreSQL the key of the lock's row in baton_locks (must end \
         with `:`)",
    ),
    (
        "leader",
        "Key prefix of the election's keys: PREFIXleader:{KEY} on Redis; on PostgreSQL the key \
         of the election's row in baton_locks (must end with `:`)",
    ),
    (
        "unlock",
        "Key prefix of the keys --key may name: a lock's PREFIXlock:{KEY}, a fair lock's \
         PREFIXfair:{KEY} or an election's PREFIXleader:{KEY} on Redis; on PostgreSQL the key \
         of the lock's or election's row in baton_locks (must end with `:`)",
    ),
];

const SCHEDULE_PREFIX: &str = "Key prefix of the schedule's record and control: \
    PREFIXschedule:{KEY}:… on Redis; on PostgreSQL the key of its rows in baton_schedules, \
    baton_schedule_history and baton_schedule_control (must end with `:`)";

const JOB_PREFIX: &str = "Key prefix of the job's keys: PREFIX{KEY} and the keys beside it on \
    Redis; on PostgreSQL the key of the job's row in baton_jobs (must end with `:`)";

/// The command line, with each command's own help for the global `--prefix` (a copy of it in
/// the subcommand, which clap then does not propagate over; its value still reaches
/// [`Cli::prefix`], as a global's does).
pub(crate) fn command() -> clap::Command {
    let mut cmd = Cli::command();
    let prefix = cmd
        .get_arguments()
        .find(|a| a.get_id() == "prefix")
        .cloned();
    if let Some(prefix) = prefix {
        for (name, help) in PREFIX_HELP {
            cmd = cmd.mut_subcommand(name, |sub| sub.arg(prefix.clone().help(help)));
        }
        #[cfg(feature = "dashboard")]
        {
            cmd = cmd.mut_subcommand("dashboard", |sub| {
                sub.arg(prefix.clone().help(
                    "Key prefix of what the page lists: the keys of jobs, locks, leaders, fair \
                     locks and queues under it on Redis, their rows' keys on PostgreSQL (must \
                     end with `:`)",
                ))
            });
        }
    }
    // `schedule` is `run`'s flags (one struct) with a schedule required: the group is
    // `run`'s, where it is optional.
    cmd.mut_subcommand("schedule", |sub| {
        sub.mut_group(SCHEDULE_GROUP, |g| g.required(true))
    })
    .mut_subcommand("backfill", |sub| {
        sub.mut_group(SCHEDULE_GROUP, |g| g.required(true))
    })
}

/// Run any program under attempt-counted failover coordination through Redis or PostgreSQL.
#[derive(Parser, Debug)]
#[command(name = "baton", version, after_long_help = OVERVIEW)]
pub(crate) struct Cli {
    /// Where the coordination lives: a redis://, rediss://, unix://, redis+cluster://,
    /// redis+sentinel:// or postgres:// URL (--help for each form, TLS and credentials).
    ///
    /// Redis: redis://[user:password@]host:port/[db] (rediss:// for TLS, unix:// for a socket),
    /// redis+cluster://host:port,host:port/ for a Redis Cluster's seed nodes, or
    /// redis+sentinel://host:port,host:port/SERVICE for the primary Sentinels monitor as SERVICE
    /// (credentials there are the data nodes'). PostgreSQL:
    /// postgres://[user[:password]@]host[:port]/database (tables made by `baton migrate`, or on
    /// first use where the role may; `lock` is then the table mutex and `leader` an election on
    /// the same table; --redlock is Redis only; add ?sslmode=require for TLS, the server's
    /// certificate always verified).
    ///
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
    pub(crate) url: String,
    /// Key prefix of everything baton stores: the names of its Redis keys, and of its rows'
    /// keys on PostgreSQL (must end with `:`; each command's --help says which keys).
    #[arg(long, global = true, default_value = "baton:")]
    pub(crate) prefix: String,
    /// Only errors on stderr, and PROGRAM's own output: nothing when a run goes well (done
    /// here or elsewhere, a skipped tick), for cron, which mails whatever a job prints.
    /// Errors still print: a failed, exhausted or lost job, a server that kept failing.
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,
    /// Whether --url was given on the command line (not by default or environment).
    #[arg(skip)]
    pub(crate) url_given: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run PROGRAM if this process wins an attempt of the job; otherwise wait as a backup and
    /// take over when an attempt fails.
    #[command(after_long_help = EXIT_STATUSES)]
    Run(RunArgs),
    /// Run PROGRAM at every tick of a schedule (--every or --cron), each occurrence once
    /// across every server running this command (the long-running form; no crontab).
    #[command(after_long_help = SCHEDULE_HELP)]
    Schedule(ScheduleArgs),
    /// Run PROGRAM holding a fenced mutex: one holder at a time per key, kept alive by a
    /// watchdog; PROGRAM is stopped if the lock is lost.
    #[command(after_long_help = LOCK_EXIT_STATUSES)]
    Lock(LockArgs),
    /// Run a long-lived PROGRAM only while this process is the elected leader of --key; stop it
    /// on loss and campaign again; on SIGTERM stop it, resign and exit 0.
    #[command(after_long_help = LEADER_EXIT_STATUSES)]
    Leader(LeaderArgs),
    /// List every job, lock, leader, fair lock, queue, semaphore and read-write lock under the
    /// prefix (one line each: kind, name, state, holder, time left, fencing token), or show
    /// what --key is, of any kind.
    Status {
        /// The name to show (a job's, a lock's, an election's, …); without it, list everything.
        #[arg(long)]
        key: Option<String>,
        /// Print JSON (one object per line).
        #[arg(long)]
        json: bool,
        /// List only entries of this kind.
        #[arg(long, value_enum, conflicts_with = "key")]
        kind: Option<KindArg>,
        /// List each occurrence of a schedule (KEY@DIGEST@TICK), not one row per schedule
        /// (which shows the worst open occurrence: exhausted, then waiting, then running; the
        /// latest once all are done).
        #[arg(long, conflicts_with = "key")]
        all: bool,
        /// With --key: print the schedule's history from its record, newest first: each
        /// occurrence's tick and outcome, and each attempt's host, start, end, duration, exit
        /// status or signal and message (one JSON object per occurrence with --json).
        #[arg(long, requires = "key")]
        history: bool,
        /// With --history: at most this many occurrences (newest first).
        #[arg(long, value_name = "N", requires = "history", default_value_t = 50,
              value_parser = clap::value_parser!(u32).range(1..=1000))]
        limit: u32,
    },
    /// Check a schedule's record for Nagios, Icinga or any monitor that runs a command: one
    /// status line, exit 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.
    #[command(after_long_help = CHECK_HELP)]
    Check {
        /// The schedule's key (--key of its `baton run --every/--cron` or `baton schedule`).
        #[arg(long)]
        key: String,
        /// CRITICAL when the last success ended longer ago than this (e.g. 26h for a daily
        /// job), or when there is none on record.
        #[arg(long, value_name = "DURATION", value_parser = duration)]
        max_age: Option<Duration>,
        /// OK (not CRITICAL) when the store holds no record of the schedule: never
        /// registered, or forgotten after max(30 days, 10 gaps) with no host running it.
        #[arg(long)]
        allow_absent: bool,
    },
    /// Run the past occurrences of a schedule in a window (--from, --to) that have no
    /// terminal outcome on record, each once across the fleet, oldest first.
    #[command(after_long_help = super::backfill::BACKFILL_HELP)]
    Backfill(BackfillArgs),
    /// Pause a schedule across the fleet: each run that binds to one of its occurrences while
    /// paused records it skipped (paused), runs nothing and exits 0; the cadence is kept.
    #[command(after_long_help = PAUSE_HELP)]
    Pause {
        /// The schedule's key; it may be paused before any host has run it.
        #[arg(long)]
        key: String,
        /// Until when: an RFC 3339 time (2026-12-24T08:00:00Z) or a duration from now (2h)
        /// [default: until `baton resume`].
        #[arg(long, value_name = "T")]
        until: Option<String>,
        /// Why (shown by `baton status`, kept with the pause).
        #[arg(long, value_name = "TEXT")]
        note: Option<String>,
    },
    /// Run one occurrence of a schedule now, across the fleet: every `baton schedule` of the
    /// key starts it within its --trigger-poll (5s by default) and it runs once; prints its id.
    #[command(after_long_help = super::help::TRIGGER_HELP)]
    Trigger {
        /// The schedule's key.
        #[arg(long)]
        key: String,
        /// Why (kept with the trigger and in the occurrence's history entry).
        #[arg(long, value_name = "TEXT")]
        note: Option<String>,
        /// Print the trigger as JSON (id, at, by, note).
        #[arg(long)]
        json: bool,
    },
    /// Resume a paused schedule: the next tick runs (the ticks skipped while paused are not
    /// caught up).
    #[command(after_long_help = PAUSE_HELP)]
    Resume {
        /// The schedule's key.
        #[arg(long)]
        key: String,
    },
    /// Follow a job's changes (grants, done, failures) until it ends, or a lock's or a
    /// leader's (holder changes, fencing tokens, loss) until interrupted; each line starts
    /// with when it was seen (UTC, RFC 3339).
    Watch {
        /// The name to follow.
        #[arg(long)]
        key: String,
        /// What to follow when the name is several things, or nothing yet
        /// [default: what exists, a job if nothing does].
        #[arg(long, value_enum)]
        kind: Option<KindArg>,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Take a mutex, a fair lock, a leader's term, a semaphore's permit (--permit) or a
    /// read-write lock's holder from a hung holder, the grant named by --token (or --holder):
    /// it hears so and stops; the next holder's fencing token is higher.
    #[command(after_long_help = UNLOCK_HELP)]
    #[command(group(ArgGroup::new("grant").args(["token", "holder", "any"])))]
    Unlock {
        /// The lock's (or election's) name.
        #[arg(long)]
        key: String,
        /// Which one, when the name is held as several kinds.
        #[arg(long, value_enum)]
        kind: Option<KindArg>,
        /// Take only the grant with this fencing token (a leader's term), as `baton unlock
        /// --key K` or `baton status` showed it; another grant holding K then is left alone
        /// (exit 75).
        #[arg(long, value_name = "N")]
        token: Option<u64>,
        /// Take only the grant of this holder, as shown, for an entry shown without a fencing
        /// token (a read-write lock's reader).
        #[arg(long, value_name = "ID")]
        holder: Option<String>,
        /// A semaphore's slot (`BATON_PERMIT`, as `baton status` shows it): each slot has
        /// fencing tokens of its own, so two slots can show the same one.
        #[arg(long, value_name = "SLOT")]
        permit: Option<u32>,
        /// Take whatever holds K when the command runs (scripts that mean it).
        #[arg(long)]
        any: bool,
        /// Accepted beside --token, --holder or --any; alone it names no grant and is refused.
        #[arg(long)]
        yes: bool,
    },
    /// Release a hung holder's attempt so a backup takes over at once: the attempt named by
    /// --attempt.
    #[command(after_long_help = JOB_ADMIN_HELP)]
    #[command(group(ArgGroup::new("grant").args(["attempt", "any"])))]
    Fail {
        /// The job name.
        #[arg(long)]
        key: String,
        /// Why (kept in the job's failure note).
        #[arg(long, default_value = "released by an operator")]
        reason: String,
        /// Release only this attempt, as `baton fail --key K` or `baton status` showed it;
        /// another attempt live then is left alone (exit 75).
        #[arg(long, value_name = "N")]
        attempt: Option<u64>,
        /// Release whichever attempt is live when the command runs (scripts that mean it).
        #[arg(long)]
        any: bool,
        /// Accepted beside --attempt or --any; alone it names no attempt and is refused.
        #[arg(long)]
        yes: bool,
    },
    /// Create baton's PostgreSQL tables, indexes and sequence where missing (as their owner,
    /// once per database, before workers run with a role that may only read and write them).
    #[command(after_long_help = MIGRATE_HELP)]
    Migrate,
    /// Serve a read-only page of every job, lock, leader, fair lock, queue, semaphore,
    /// read-write lock and schedule under the prefix, updated live (loopback only unless
    /// --allow-remote).
    #[cfg(feature = "dashboard")]
    #[command(after_long_help = DASHBOARD_HELP)]
    Dashboard(DashboardArgs),
    /// Forget a job's state, so the next `baton run` runs it again as attempt 1. A live job
    /// only with --attempt naming its live attempt.
    #[command(after_long_help = JOB_ADMIN_HELP)]
    #[command(group(ArgGroup::new("grant").args(["attempt", "any"])))]
    Reset {
        /// The job name.
        #[arg(long)]
        key: String,
        /// Reset a live job only while this attempt is the live one, as `baton reset --key K`
        /// or `baton status` showed it (another: exit 75).
        #[arg(long, value_name = "N")]
        attempt: Option<u64>,
        /// Reset the job whatever attempt is live (scripts that mean it).
        #[arg(long)]
        any: bool,
        /// Accepted beside --attempt or --any; alone it names no attempt and is refused on a
        /// live job.
        #[arg(long)]
        yes: bool,
    },
}

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    /// The job name (e.g. nightly-report); every server running the job uses the same key.
    #[arg(long)]
    pub(crate) key: String,
    /// The lease: how long a silent holder keeps the job before a backup may take over
    /// (10ms ..= 1 day). --lock-timeout is an alias (its former name).
    #[arg(
        long = "lease",
        visible_alias = "lock-timeout",
        default_value = "30s",
        value_parser = duration
    )]
    pub(crate) lease: Duration,
    /// The maximum number of attempts.
    #[arg(long, default_value_t = 5)]
    pub(crate) max_attempts: u64,
    /// How long DONE/EXHAUSTED are kept, so late duplicates are not re-run (at most 10 years;
    /// with a schedule, at least the gap to the next tick plus its E plus 5s)
    /// [default: 24h; with a schedule, two periods and at least 10m].
    #[arg(long, value_parser = duration)]
    pub(crate) retention: Option<Duration>,
    /// Turn the watchdog off: the lease is not extended, and the attempt must finish within
    /// --lease of its grant (PROGRAM is stopped when it does not). --no-keepalive is an alias
    /// (its former name).
    #[arg(long = "no-watchdog", visible_alias = "no-keepalive")]
    pub(crate) no_watchdog: bool,
    /// Cap on how long one attempt may hold the job, counted from its grant (must exceed
    /// --lease). --max-run is an alias (its former name).
    #[arg(long = "max-hold", visible_alias = "max-run", value_parser = duration)]
    pub(crate) max_hold: Option<Duration>,
    /// Pause before a backup takes over a failed attempt.
    #[arg(long, default_value = "0s", value_parser = duration)]
    pub(crate) retry_delay: Duration,
    /// Time between SIGTERM and SIGKILL when PROGRAM must stop, or what it left running in its
    /// process group when it exits, at most 1 day (never past the lease's end; without
    /// the watchdog SIGTERM comes this long, at most a quarter lease, before the deadline).
    #[arg(long, default_value = "10s", value_parser = kill_grace)]
    pub(crate) kill_grace: Duration,
    /// This worker's name, shown by `baton status` (default host:pid).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// How long the server may keep failing (refused, reset, timed out, CLUSTERDOWN, LOADING,
    /// TRYAGAIN, a failover in progress) before a run or a waiting backup gives up with 69.
    /// Each answer from the server restarts this clock; retries back off (jittered, capped).
    /// The default outlasts a Sentinel failover (failover-timeout defaults to 3 minutes) and
    /// a Cluster's (node timeout 15 s) several times over, so only a real outage ends the
    /// wait; it is never longer than three quarters of --retention, past which a job done
    /// during the outage could be forgotten.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration)]
    pub(crate) give_up_after: Duration,
    /// How long to keep trying to reach the deployment (the server, a Cluster seed or a
    /// Sentinel) when none has answered yet since baton started, then exit 69: a mistyped URL
    /// fails quickly. Once one has answered, --give-up-after applies instead.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration)]
    pub(crate) connect_timeout: Duration,
    /// Whether this worker, after its own attempt failed or lost its lease (PROGRAM stopped),
    /// waits as a backup again and may run a later attempt (after a failure a waiting backup
    /// elsewhere still goes first). `--rejoin=false` turns it off [default: off for `run`, on
    /// for `schedule`, so a one-server fleet retries a failed occurrence].
    #[arg(
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true"
    )]
    pub(crate) rejoin: Option<bool>,
    /// Write events as JSON lines on stderr.
    #[arg(long)]
    pub(crate) json: bool,
    /// Write events as JSON lines to FILE (appended).
    #[arg(long, value_name = "FILE")]
    pub(crate) events: Option<PathBuf>,
    /// More human-readable output on stderr (repeat for library traces).
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub(crate) verbose: u8,
    #[command(flatten)]
    pub(crate) when: WhenArgs,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
    /// The program and its arguments.
    #[arg(required = true, last = true, value_name = "PROGRAM")]
    pub(crate) program: Vec<OsString>,
}

/// The id of the group of --every and --cron: optional for `run`, required for `schedule`.
pub(crate) const SCHEDULE_GROUP: &str = "schedule";

/// The schedule flags: optional for `run` (without them it runs the job --key once), required
/// for `schedule`.
#[derive(Args, Debug, Default)]
#[group(skip)]
#[command(group(ArgGroup::new(SCHEDULE_GROUP).args(["every", "cron"])))]
pub(crate) struct WhenArgs {
    /// Schedule: ticks at every whole multiple of DURATION since the Unix epoch, by the
    /// server's clock (24h: midnight UTC); the job is then KEY@DIGEST@TICK, one per tick.
    #[arg(long, value_name = "DURATION", value_parser = duration, conflicts_with = "cron")]
    pub(crate) every: Option<Duration>,
    /// With --every: shift the ticks by DURATION, below the period (--every 24h --offset 2h:
    /// 02:00 UTC).
    // `requires` alone lets `--cron … --offset` through: clap forgives a missing --every when
    // it conflicts with an argument present (--cron). Refused by name instead.
    #[arg(
        long,
        value_name = "DURATION",
        value_parser = duration,
        requires = "every",
        conflicts_with = "cron"
    )]
    pub(crate) offset: Option<Duration>,
    /// Schedule: a cron expression, five fields (minute hour day-of-month month day-of-week)
    /// or six with seconds first, e.g. '0 2 * * *'; the job is then KEY@DIGEST@TICK.
    #[arg(long, value_name = "EXPR")]
    pub(crate) cron: Option<String>,
    /// With --cron: the IANA time zone the expression is read in, e.g. Europe/Paris
    /// [default: UTC].
    // As --offset with --cron: `--every … --tz` is refused by name, not ignored.
    #[arg(long, value_name = "ZONE", requires = "cron", conflicts_with = "every")]
    pub(crate) tz: Option<String>,
    /// With a schedule: a run that starts up to this long before a tick binds to that tick and
    /// waits for it (capped at half the gap before the tick) [default: 60s].
    #[arg(long, value_name = "DURATION", value_parser = duration, requires = SCHEDULE_GROUP)]
    pub(crate) early: Option<Duration>,
    /// With a schedule: how many occurrences its record keeps in the store, newest first
    /// (`baton status --key KEY --history`), 1 ..= 1000 [default: 50]. Not part of the
    /// digest: hosts may differ during a rolling change.
    #[arg(long, value_name = "N", requires = SCHEDULE_GROUP,
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) history: Option<u32>,
    /// With a schedule: start each occurrence at its tick plus a jitter in [0, DURATION), the
    /// same on every server (a hash of the key, the schedule and the tick), so schedules that
    /// tick together do not all start at once; never longer than fits before the next tick's
    /// window with --lease to spare, at most the period. BATON_OCCURRENCE stays the tick.
    #[arg(long, value_name = "DURATION", value_parser = duration, requires = SCHEDULE_GROUP)]
    pub(crate) jitter: Option<Duration>,
    /// With a schedule (`baton run` only): run a manual occurrence now instead of the
    /// occurrence of the tick: it is stored as a trigger (so `baton schedule` daemons of the
    /// key join as its backups), run here under the same coordination and recorded, then
    /// cleared once it ended. BATON_OCCURRENCE is its id (manual-<time>).
    #[arg(long, requires = SCHEDULE_GROUP)]
    pub(crate) now: bool,
    /// With a schedule: what an occurrence does while an earlier one still runs anywhere in
    /// the fleet (its job's lease is live): `allow` (the default) runs it as well (each
    /// occurrence is a job of its own); `skip` records it skipped_overlap and runs nothing;
    /// `buffer-one` waits (the host that holds its job waits before PROGRAM starts, the others
    /// are its backups) until the earlier one ends, then runs it, or records it skipped_overlap
    /// if its own window closes first; with two earlier ones live it is skipped; `replace`
    /// stops the earlier ones wherever they run (their holders stop PROGRAM at once, their
    /// occurrences end replaced, no backup retries them) and runs it once their holders are
    /// gone (or their leases ran out). `skip`, `buffer-one` and `replace` cost about two
    /// reads per occurrence.
    #[arg(long, value_enum, value_name = "POLICY", requires = SCHEDULE_GROUP)]
    pub(crate) overlap: Option<OverlapArg>,
}

/// The metrics flags of the long-running commands (`run`, `schedule`, `lock`, `leader`).
#[derive(Args, Debug, Default)]
pub(crate) struct MetricsArgs {
    /// Serve Prometheus metrics at http://ADDR/metrics and a health check at /healthz (for
    /// `leader`: 200 while leading or standing by, 503 once its election stays unreadable),
    /// e.g. 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics_addr: Option<SocketAddr>,
    /// Write the metrics to PATH (Prometheus text, replaced atomically) when the command ends,
    /// for node_exporter's textfile collector.
    #[arg(long, value_name = "PATH")]
    pub(crate) metrics_file: Option<PathBuf>,
}

/// `baton schedule`: `run`'s flags, and what to do with a missed or overlapping tick.
#[derive(Args, Debug)]
pub(crate) struct ScheduleArgs {
    #[command(flatten)]
    pub(crate) run: RunArgs,
    /// At start: `last` first runs the latest past tick if it is neither done nor exhausted
    /// (every server was down then); `all` runs every past tick of --catch-up-window with no
    /// terminal outcome on record, oldest first, while the next ticks run as usual; `none`
    /// waits for the next tick. Ticks skipped while paused are not caught up (`baton
    /// backfill` runs them).
    #[arg(long, value_enum, default_value_t = CatchUpArg::None)]
    pub(crate) catch_up: CatchUpArg,
    /// With `--catch-up all` (required there): how far back from now to catch up, e.g. 6h;
    /// ticks older than what the schedule's record vouches for are left out.
    #[arg(long, value_name = "DURATION", value_parser = duration,
          required_if_eq("catch_up", "all"))]
    pub(crate) catch_up_window: Option<Duration>,
    /// The most occurrences that run (or wait as a backup) here at
    /// once; a tick that comes while this many still do is reported skipped and not run here
    /// (a backup elsewhere may run it). Bounds the processes and connections that pile up when
    /// PROGRAM hangs tick after tick.
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_concurrent: u32,
    /// How often to read the key's pending triggers (`baton trigger`) and start the manual
    /// occurrences not started here yet: one read of the store per poll per daemon, at least
    /// 10ms.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "5s")]
    pub(crate) trigger_poll: Duration,
}

/// `baton backfill`: `run`'s flags (a schedule required) and the window.
#[derive(Args, Debug)]
pub(crate) struct BackfillArgs {
    /// The window's first tick: an RFC 3339 time (2026-11-26T00:00:00Z); ticks at or after it.
    #[arg(long, value_name = "T")]
    pub(crate) from: String,
    /// The window's end: an RFC 3339 time; ticks at or before it (and not after the server's
    /// clock: a tick not yet due is not backfilled).
    #[arg(long, value_name = "T")]
    pub(crate) to: String,
    #[command(flatten)]
    pub(crate) run: RunArgs,
}

/// `baton dashboard`: where to serve the page and how often to read the server.
#[cfg(feature = "dashboard")]
#[derive(Args, Debug)]
pub(crate) struct DashboardArgs {
    /// Where to serve the page, e.g. 127.0.0.1:8080 (port 0: any free port, printed at start).
    /// A loopback address unless --allow-remote.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    pub(crate) listen: SocketAddr,
    /// Serve on a non-loopback --listen address. The page has no authentication of its own:
    /// put it behind a proxy that authenticates.
    #[arg(long)]
    pub(crate) allow_remote: bool,
    /// How often the page's data is read from the server, once for every open page
    /// (100ms ..= 1h).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = interval)]
    pub(crate) interval: Duration,
    /// The most schedules /metrics gives series for (its baton_schedule_* families, one set
    /// per schedule); the schedules past it are left out and counted in
    /// baton_dashboard_schedules_dropped.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub(crate) max_schedules: usize,
}

/// --interval of `dashboard`: 100 ms ..= 1 h.
#[cfg(feature = "dashboard")]
fn interval(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if !(Duration::from_millis(100)..=Duration::from_secs(3600)).contains(&d) {
        return Err(format!("{s} is outside 100ms ..= 1h"));
    }
    Ok(d)
}

/// --kind's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum KindArg {
    Job,
    Lock,
    Leader,
    Fair,
    Queue,
    Semaphore,
    Rwlock,
}

impl KindArg {
    pub(crate) fn kind(self) -> baton::inspect::Kind {
        match self {
            KindArg::Job => baton::inspect::Kind::Job,
            KindArg::Lock => baton::inspect::Kind::Lock,
            KindArg::Leader => baton::inspect::Kind::Leader,
            KindArg::Fair => baton::inspect::Kind::Fair,
            KindArg::Queue => baton::inspect::Kind::Queue,
            KindArg::Semaphore => baton::inspect::Kind::Semaphore,
            KindArg::Rwlock => baton::inspect::Kind::RwLock,
        }
    }
}

/// --catch-up's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum CatchUpArg {
    None,
    Last,
    All,
}

/// --overlap's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OverlapArg {
    Allow,
    Skip,
    BufferOne,
    Replace,
}

#[derive(Args, Debug)]
pub(crate) struct LockArgs {
    /// The lock's name; every process that must not run at the same time uses the same key.
    #[arg(long)]
    pub(crate) key: String,
    /// Use Redlock over these independent masters (comma-separated, at least 3, an odd number,
    /// all distinct) instead of --url. BATON_FENCING_TOKEN is then not set: Redlock has
    /// no monotonic token (see below).
    /// (Conflicts with --url on the command line; BATON_URL is ignored with it.)
    #[arg(long, value_name = "URL,URL,URL", value_delimiter = ',')]
    pub(crate) redlock: Vec<String>,
    /// The lease: how long the lock outlives a holder that went silent (10ms ..= 1 day). The
    /// watchdog extends it every lease/3 while PROGRAM runs. --ttl is an alias (its former
    /// name).
    #[arg(
        long = "lease",
        visible_alias = "ttl",
        default_value = "30s",
        value_parser = duration
    )]
    pub(crate) lease: Duration,
    /// Hold one of N permits of the semaphore K instead of the mutex (as `consul lock -n N`):
    /// up to N processes run at once. PROGRAM gets BATON_PERMIT (its slot, 0 ..= N-1) beside
    /// BATON_FENCING_TOKEN (the permit's token, growing per slot). Every holder of K gives the
    /// same N.
    #[arg(long, value_name = "N")]
    pub(crate) permits: Option<u32>,
    /// With --permits: wait in the semaphore's FIFO line, so permits go in the order the
    /// waiters asked, across every host, and nobody outside the line takes one first.
    #[arg(long)]
    pub(crate) fair: bool,
    /// Take a shared read of the read-write lock K (as `flock -s`): readers run together,
    /// writers (--exclusive) wait for them; once a writer waits, new readers queue behind it.
    /// BATON_FENCING_TOKEN is the last write's token (0 before any write).
    #[arg(long)]
    pub(crate) shared: bool,
    /// Take the write of the read-write lock K: the exclusive side of --shared. The read-write
    /// lock is not the mutex: a plain `baton lock --key K` neither waits for --shared readers
    /// nor keeps them out.
    #[arg(long)]
    pub(crate) exclusive: bool,
    /// How long to wait for the lock at most, then exit 75 [default: wait forever].
    #[arg(long, value_parser = duration)]
    pub(crate) wait: Option<Duration>,
    /// This holder's name, stored with the lock and shown by `baton status` (default
    /// host:pid; not with --redlock, whose masters keep only a token, nor with --permits,
    /// --shared or --exclusive, whose holders are shown by token).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Time between SIGTERM and SIGKILL when PROGRAM must stop, or what it left running in its
    /// process group when it exits, at most 1 day; when the lock is lost, never past the
    /// lease's end.
    #[arg(long, default_value = "10s", value_parser = kill_grace)]
    pub(crate) kill_grace: Duration,
    /// More human-readable output on stderr (repeat for library traces).
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub(crate) verbose: u8,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
    /// The program and its arguments.
    #[arg(required = true, last = true, value_name = "PROGRAM")]
    pub(crate) program: Vec<OsString>,
}

#[derive(Args, Debug)]
pub(crate) struct LeaderArgs {
    /// The election's name; every process that may lead uses the same key.
    #[arg(long)]
    pub(crate) key: String,
    /// The lease: how long a silent leader keeps leading (10ms ..= 1 day), renewed every
    /// lease/3.
    #[arg(long, default_value = "10s", value_parser = duration)]
    pub(crate) lease: Duration,
    /// This candidate's name, shown to observers (default host:pid).
    #[arg(long)]
    pub(crate) name: Option<String>,
    /// Time between SIGTERM and SIGKILL when baton stops PROGRAM on a signal, or what PROGRAM
    /// left running in its process group when it exits, at most 1 day; on a lost leadership
    /// PROGRAM is killed by the lease's end whatever this says.
    #[arg(long, default_value = "10s", value_parser = kill_grace)]
    pub(crate) kill_grace: Duration,
    /// More human-readable output on stderr (repeat for library traces).
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub(crate) verbose: u8,
    #[command(flatten)]
    pub(crate) metrics: MetricsArgs,
    /// The program and its arguments.
    #[arg(required = true, last = true, value_name = "PROGRAM")]
    pub(crate) program: Vec<OsString>,
}

pub(crate) fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (use e.g. 500ms, 30s, 5m, 24h)"))
}

pub(crate) fn kill_grace(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d > MAX_KILL_GRACE {
        return Err(format!("{s} is above the maximum of 1 day"));
    }
    Ok(d)
}

/// The commands whose PROGRAM comes after `--`.
const TAKES_PROGRAM: [&str; 4] = ["run", "schedule", "lock", "leader"];

/// A parse error made clearer before it is printed: its usage line is the command's own
/// (`baton run [OPTIONS] --key <KEY> -- <PROGRAM>...`), not clap's rendering of what was typed
/// (which lists the flags given, --url among them, as if they were required); and a PROGRAM
/// typed without `--` before it gets a tip showing the line with `--` put in. `args` are the
/// command line's arguments after the program's name.
pub(crate) fn explain(mut e: clap::Error, args: &[OsString]) -> clap::Error {
    use clap::error::{ContextKind, ContextValue};
    let mut cmd = command();
    cmd.build();
    let Some(ContextValue::StyledStr(usage)) = e.get(ContextKind::Usage) else {
        return e;
    };
    // clap's usage starts with the command's path: `baton run …`.
    let usage = usage.to_string();
    let Some(name) = usage
        .split_whitespace()
        .skip_while(|w| *w != "baton")
        .nth(1)
        .map(str::to_owned)
    else {
        return e;
    };
    let Some(sub) = cmd.find_subcommand_mut(&name) else {
        return e;
    };
    let own = sub.render_usage();
    e.insert(ContextKind::Usage, ContextValue::StyledStr(own));
    if e.kind() != clap::error::ErrorKind::UnknownArgument || !TAKES_PROGRAM.contains(&&*name) {
        return e;
    }
    let Some(ContextValue::String(invalid)) = e.get(ContextKind::InvalidArg) else {
        return e;
    };
    if invalid.starts_with('-') {
        return e;
    }
    let tip = match program_start(sub, &name, args) {
        Some(at) if args[at].to_string_lossy() == **invalid => {
            let mut line = vec!["baton".to_owned()];
            line.extend(args[..at].iter().map(|a| shell_word(&a.to_string_lossy())));
            line.push("--".to_owned());
            line.extend(args[at..].iter().map(|a| shell_word(&a.to_string_lossy())));
            format!("put -- before PROGRAM: {}", line.join(" "))
        }
        _ => format!("put -- before PROGRAM: baton {name} [OPTIONS] -- PROGRAM [ARGS]..."),
    };
    let mut tips = match e.get(ContextKind::Suggested) {
        Some(ContextValue::StyledStrs(tips)) => tips.clone(),
        _ => Vec::new(),
    };
    tips.push(tip.into());
    e.insert(ContextKind::Suggested, ContextValue::StyledStrs(tips));
    e
}

/// Where PROGRAM starts in `args` when it was typed without `--`: the first word after the
/// command `name` that is neither a flag nor a flag's value (read with `sub`'s flags, the
/// globals included). `None` when the line cannot be read that way.
fn program_start(sub: &clap::Command, name: &str, args: &[OsString]) -> Option<usize> {
    // A separate value follows a flag that takes one, unless the flag wants `--flag=VALUE`.
    let takes_value =
        |arg: &clap::Arg| arg.get_action().takes_values() && !arg.is_require_equals_set();
    let long = |word: &str| {
        sub.get_arguments().find(|a| {
            a.get_long() == Some(word) || a.get_all_aliases().is_some_and(|al| al.contains(&word))
        })
    };
    let mut i = 0;
    let mut in_sub = false;
    while i < args.len() {
        let word = args[i].to_str()?;
        if word == "--" {
            return None;
        }
        if let Some(flag) = word.strip_prefix("--") {
            if !flag.contains('=') && long(flag).is_some_and(takes_value) {
                i += 1;
            }
        } else if let Some(shorts) = word.strip_prefix('-').filter(|s| !s.is_empty()) {
            let last = shorts.chars().last()?;
            let arg = sub.get_arguments().find(|a| a.get_short() == Some(last));
            if shorts.chars().count() == 1 && arg.is_some_and(takes_value) {
                i += 1;
            }
        } else if !in_sub {
            if word != name {
                return None;
            }
            in_sub = true;
        } else {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// `word` as a shell reads it back: as is when it holds nothing the shell treats specially,
/// else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
