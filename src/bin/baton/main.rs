//! `baton`: run any program under failover coordination, inspect and administer jobs.
//!
//! ```text
//! baton run --key nightly-report -- /usr/local/bin/report --since yesterday
//! baton run --key nightly-report --cron '0 2 * * *' --tz Europe/Paris -- /usr/local/bin/report
//! baton schedule --key sweep --every 5m -- /usr/local/bin/sweep
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
//! continued, it first checks that it still holds its attempt (--no-watchdog deadline, then the
//! job's state in Redis): if not, PROGRAM is killed and baton exits 74; otherwise PROGRAM's group
//! gets the terminal back (if baton is in the foreground again) and SIGCONT.

//!
//! # Layout
//!
//! One file per command and one per concern, so a change to how PROGRAM is supervised does not
//! touch the commands, and a command reads top to bottom without the process plumbing:
//!
//! | file | what |
//! |---|---|
//! | `main.rs` | parse, check every setting before connecting ([`Plan`]), connect, dispatch |
//! | `cli.rs` | the command line: flags, their help, duration parsers |
//! | `help.rs` | the long help texts: exit status tables, `migrate`'s manual |
//! | `exit.rs` | exit statuses and the mapping of library errors to them |
//! | `text.rs` | how messages word things: durations in human form, settings by their flags |
//! | `sink.rs` | where `run`'s events go (stderr, JSON lines, a file) |
//! | `signals.rs` | the signals baton forwards to PROGRAM, and their statuses |
//! | `program.rs` | PROGRAM as a child: spawn, process group, `waitid`, the terminal |
//! | `supervisor.rs` | runs PROGRAM to its end under a lease |
//! | `guard.rs` | the process that kills PROGRAM's group if baton dies |
//! | `metrics.rs` | `--metrics-addr` and `--metrics-file`: the Prometheus exporter, `/healthz` |
//! | `run.rs`, `schedule.rs`, `lock.rs`, `leader.rs`, `status.rs`, `unlock.rs`, `admin.rs` | the commands |
//! | `check.rs`, `pause.rs` | `baton check` (Nagios statuses) and `baton pause`/`resume`, on a schedule's record |
//! | `dashboard.rs`, `dashboard/` | `baton dashboard` (feature `dashboard`): the page's server, the page, and its `/metrics` |

use std::process::ExitCode;
use std::time::Duration;

use baton::{AcquireOptions, Client, ElectionOptions, FailoverConfig, RedlockOptions, Schedule};
use clap::FromArgMatches;

use cli::{Cli, Command};
use cli::{LeaderArgs, LockArgs, RunArgs, ScheduleArgs};
use exit::{fail_with, usage, usage_config, EX_UNAVAILABLE, EX_USAGE};
use sink::Sink;

// First: its `say!`, `outln!` and `out!` macros are used by every module after it.
#[macro_use]
mod out;

mod admin;
mod backfill;
mod check;
mod cli;
#[cfg(feature = "dashboard")]
mod dashboard;
mod exit;
mod guard;
mod help;
mod leader;
mod lock;
mod metrics;
mod overlap;
mod pause;
mod program;
mod run;
mod schedule;
mod signals;
mod sink;
mod status;
mod supervisor;
mod text;
mod trigger;
mod unlock;

/// How long a resumed baton waits for Redis to confirm it still holds its attempt.
pub(crate) const LEASE_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

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
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let parsed = cli::command()
        .try_get_matches_from(std::env::args_os())
        .and_then(|m| Cli::from_arg_matches(&m).map(|cli| (cli, m)));
    let cli = match parsed {
        Ok((mut cli, m)) => {
            // --url is global: its source is recorded on the subcommand's matches.
            let given = |m: &clap::ArgMatches| {
                m.value_source("url") == Some(clap::parser::ValueSource::CommandLine)
            };
            cli.url_given = given(&m) || m.subcommand().is_some_and(|(_, sub)| given(sub));
            out::set_quiet(cli.quiet);
            cli
        }
        Err(e) => {
            let code = match e.use_stderr() {
                // `baton check` answers a monitor: a line it cannot read is UNKNOWN.
                true if check::is_check(&args) => check::UNKNOWN,
                true => EX_USAGE,
                false => 0,
            };
            let e = if e.use_stderr() {
                cli::explain(e, &args)
            } else {
                e
            };
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
            say!("baton: cannot start the runtime: {e}");
            out::finish();
            return ExitCode::from(EX_UNAVAILABLE);
        }
    };
    let code = runtime.block_on(dispatch(cli));
    // What baton said last (how the job ended) gets a moment to reach stderr; a stderr nobody
    // reads does not hold the exit up (out.rs).
    out::finish();
    ExitCode::from(code)
}

/// A command with its configuration checked, ready to run once connected.
enum Plan<'a> {
    Run(&'a RunArgs, FailoverConfig, Option<Schedule>, Sink),
    Schedule(&'a ScheduleArgs, FailoverConfig, Schedule, Sink),
    Backfill(
        &'a cli::BackfillArgs,
        FailoverConfig,
        Schedule,
        backfill::Window,
        Sink,
    ),
    Lock(&'a LockArgs, AcquireOptions, Sink),
    Redlock(&'a LockArgs, RedlockOptions, Sink),
    Leader(&'a LeaderArgs, ElectionOptions, Sink),
    Status(FailoverConfig, bool),
    History(FailoverConfig, usize, bool),
    Check(FailoverConfig, check::Thresholds),
    Pause(FailoverConfig, Option<pause::Until>, Option<&'a str>),
    Resume(FailoverConfig),
    Trigger(FailoverConfig, Option<&'a str>, bool),
    List(Option<baton::inspect::Kind>, bool, bool),
    Watch(FailoverConfig, Option<baton::inspect::Kind>, bool),
    Unlock(FailoverConfig, Option<baton::inspect::Kind>, admin::Named),
    Fail(FailoverConfig, &'a str, admin::Named),
    Reset(FailoverConfig, admin::Named),
    Migrate,
    #[cfg(feature = "dashboard")]
    Dashboard(&'a cli::DashboardArgs),
}

/// Checks everything that can be checked without Redis; `Err` is the exit status.
fn plan(cli: &Cli) -> Result<Plan<'_>, u8> {
    let job = |key: &str| {
        FailoverConfig::builder(key)
            .prefix(cli.prefix.clone())
            .build()
            .map_err(|e| usage_config(&e))
    };
    Ok(match &cli.command {
        Command::Run(args) => {
            let (config, sink) = run::config(args, &cli.prefix, false)?;
            let schedule = run::schedule_of(&args.when, &config, args.retention)?;
            Plan::Run(args, config, schedule, sink)
        }
        Command::Schedule(args) => {
            if args.run.when.now {
                return Err(usage(
                    "`baton schedule` takes no --now: `baton trigger --key KEY` runs one \
                     occurrence now across its daemons",
                ));
            }
            if args.trigger_poll < std::time::Duration::from_millis(10) {
                return Err(usage("--trigger-poll: at least 10ms"));
            }
            let (config, sink) = run::config(&args.run, &cli.prefix, true)?;
            let schedule = run::schedule_of(&args.run.when, &config, args.run.retention)?
                // clap requires --every or --cron here; said again rather than assumed.
                .ok_or_else(|| usage("`baton schedule` needs --every or --cron"))?;
            Plan::Schedule(args, config, schedule, sink)
        }
        Command::Backfill(args) => {
            let window = backfill::window(args)?;
            let (config, sink) = run::config(&args.run, &cli.prefix, false)?;
            let schedule = run::schedule_of(&args.run.when, &config, args.run.retention)?
                .ok_or_else(|| usage("`baton backfill` needs --every or --cron"))?;
            Plan::Backfill(args, config, schedule, window, sink)
        }
        Command::Lock(args) => {
            // Lock names and prefixes follow the rules of job names (1..=1024 bytes, not blank,
            // no `{`/`}`; a prefix ends with `:`): checked here, before connecting, so a bad one
            // is a usage error even when Redis is unreachable.
            job(&args.key)?;
            lock::kind(args)?;
            let (opts, sink) = lock::config(args)?;
            if args.redlock.is_empty() {
                Plan::Lock(args, opts, sink)
            } else {
                if cli.url_given {
                    return Err(usage(
                        "--redlock and --url cannot be used together: --redlock names \
                         every master",
                    ));
                }
                lock::redlock_urls(&args.redlock)?;
                let mut ropts = RedlockOptions::builder();
                if let Some(wait) = args.wait {
                    ropts = ropts.wait(wait);
                }
                Plan::Redlock(args, ropts.build().map_err(|e| usage_config(&e))?, sink)
            }
        }
        Command::Leader(args) => {
            job(&args.key)?;
            let mut opts = ElectionOptions::builder().lease(args.lease);
            if let Some(name) = &args.name {
                opts = opts.name(name.clone());
            }
            let opts = opts.build().map_err(|e| usage_config(&e))?;
            let sink = Sink {
                json: false,
                file: None,
                verbose: args.verbose,
                key: args.key.clone(),
                occurrence: None,
            };
            Plan::Leader(args, opts, sink)
        }
        Command::Status {
            key: Some(key),
            json,
            history: true,
            limit,
            ..
        } => Plan::History(job(key)?, *limit as usize, *json),
        Command::Status {
            key: Some(key),
            json,
            ..
        } => Plan::Status(job(key)?, *json),
        Command::Status {
            key: None,
            json,
            kind,
            all,
            ..
        } => Plan::List(kind.map(|k| k.kind()), *all, *json),
        Command::Check {
            key,
            max_age,
            allow_absent,
        } => {
            // A monitor reads 3 (UNKNOWN) for a check it could not make, a wrong line too.
            let config = job(key).map_err(|_| check::UNKNOWN)?;
            Plan::Check(
                config,
                check::Thresholds {
                    max_age: *max_age,
                    allow_absent: *allow_absent,
                },
            )
        }
        Command::Pause { key, until, note } => {
            let until = until.as_deref().map(pause::parse_until).transpose()?;
            Plan::Pause(job(key)?, until, note.as_deref())
        }
        Command::Resume { key } => Plan::Resume(job(key)?),
        Command::Trigger { key, note, json } => Plan::Trigger(job(key)?, note.as_deref(), *json),
        Command::Watch { key, kind, json } => Plan::Watch(job(key)?, kind.map(|k| k.kind()), *json),
        Command::Unlock { .. } | Command::Fail { .. } | Command::Reset { .. } => admin::plan(cli)?,
        Command::Migrate => Plan::Migrate,
        #[cfg(feature = "dashboard")]
        Command::Dashboard(args) => {
            dashboard::check(args)?;
            Plan::Dashboard(args)
        }
    })
}

async fn dispatch(cli: Cli) -> u8 {
    let flags = match &cli.command {
        Command::Run(args) => Some(&args.metrics),
        Command::Schedule(args) => Some(&args.run.metrics),
        Command::Backfill(args) => Some(&args.run.metrics),
        Command::Lock(args) => Some(&args.metrics),
        Command::Leader(args) => Some(&args.metrics),
        _ => None,
    };
    let plan = match plan(&cli) {
        Ok(p) => p,
        Err(code) => return code,
    };
    // Installed before connecting, so the whole run is counted.
    let exporter = match flags {
        Some(flags) => match metrics::Exporter::start(flags).await {
            Ok(e) => e,
            Err(code) => return code,
        },
        None => None,
    };
    let code = dispatch_plan(&cli, plan, exporter.as_ref()).await;
    if let Some(e) = &exporter {
        e.finish();
    }
    code
}

async fn dispatch_plan(cli: &Cli, plan: Plan<'_>, exporter: Option<&metrics::Exporter>) -> u8 {
    let verbose = match &cli.command {
        Command::Run(args) => args.verbose,
        Command::Schedule(args) => args.run.verbose,
        Command::Backfill(args) => args.run.verbose,
        Command::Lock(args) => args.verbose,
        Command::Leader(args) => args.verbose,
        _ => 0,
    };
    if verbose >= 2 {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| out::TracingWriter)
            .with_env_filter("baton=debug")
            .try_init();
    }
    // Redlock connects to its own masters, never to --url.
    let plan = match plan {
        Plan::Redlock(args, opts, sink) => {
            return lock::redlock(args, opts, sink, &cli.prefix).await;
        }
        other => other,
    };
    if let Plan::Migrate = plan {
        if !(cli.url.starts_with("postgres://") || cli.url.starts_with("postgresql://")) {
            tell!("baton: nothing to migrate: Redis keys need no schema");
            return 0;
        }
    }
    // `run` and `schedule` ride out a deployment that is briefly down (--connect-timeout,
    // --give-up-after); the other commands answer an operator, at once.
    let patience = match &cli.command {
        Command::Run(a)
        | Command::Schedule(ScheduleArgs { run: a, .. })
        | Command::Backfill(cli::BackfillArgs { run: a, .. }) => {
            Some((a.connect_timeout, a.give_up_after))
        }
        _ => None,
    };
    let client = match connect(&cli.url, patience).await {
        Ok(c) => c,
        // A monitor reads anything but 0..=3 as a broken plugin: the server out of reach is
        // UNKNOWN, said on stdout as the status line.
        Err(_) if matches!(plan, Plan::Check(..)) => return check::unreachable(),
        Err(code) => return code,
    };
    match plan {
        Plan::Run(args, config, schedule, sink) => {
            run::run(&client, args, config, schedule, sink).await
        }
        Plan::Schedule(args, config, schedule, sink) => {
            schedule::schedule(&client, args, config, schedule, sink).await
        }
        Plan::Backfill(args, config, schedule, window, sink) => {
            backfill::backfill(&client, args, config, schedule, window, sink).await
        }
        Plan::Lock(args, opts, sink) => lock::lock(&client, args, opts, sink, &cli.prefix).await,
        Plan::Leader(args, opts, sink) => {
            let health = exporter.map(metrics::Exporter::health);
            leader::leader(&client, args, opts, sink, &cli.prefix, health).await
        }
        // Returned above.
        Plan::Redlock(..) => EX_USAGE,
        Plan::Status(cfg, json) => status::status(&client, cfg, &cli.prefix, json).await,
        Plan::History(cfg, limit, json) => status::history(&client, cfg, limit, json).await,
        Plan::Check(cfg, thresholds) => check::check(&client, cfg, thresholds).await,
        Plan::Pause(cfg, until, note) => pause::pause(&client, cfg, until, note).await,
        Plan::Resume(cfg) => pause::resume(&client, cfg).await,
        Plan::Trigger(cfg, note, json) => trigger::trigger(&client, cfg, note, json).await,
        Plan::List(kind, all, json) => status::list(&client, &cli.prefix, kind, all, json).await,
        Plan::Watch(cfg, kind, json) => status::watch(&client, cfg, kind, json).await,
        Plan::Unlock(cfg, kind, named) => {
            unlock::unlock(&client, &cli.prefix, cfg.key(), kind, named).await
        }
        Plan::Fail(cfg, reason, named) => admin::fail(&client, cfg, reason, named).await,
        Plan::Reset(cfg, named) => admin::reset(&client, cfg, named).await,
        Plan::Migrate => admin::migrate(&client).await,
        #[cfg(feature = "dashboard")]
        Plan::Dashboard(args) => dashboard::dashboard(&client, args, &cli.prefix, &cli.url).await,
    }
}

/// Connects to `url`. With `patience` (`--connect-timeout`, `--give-up-after`), failures a
/// retry can fix are retried: for that long while no server of the deployment has answered,
/// then for up to the second once one has.
async fn connect(url: &str, patience: Option<(Duration, Duration)>) -> Result<Client, u8> {
    let mut builder = Client::builder(url);
    if let Some(path) = std::env::var_os("BATON_REDIS_PASSWORD_FILE") {
        builder = builder.password_file(path).map_err(|e| usage_config(&e))?;
    }
    if let Some(path) = std::env::var_os("BATON_TLS_CA_FILE") {
        builder = builder
            .tls_root_ca_file(path)
            .map_err(|e| usage_config(&e))?;
    }
    match (
        std::env::var_os("BATON_TLS_CERT_FILE"),
        std::env::var_os("BATON_TLS_KEY_FILE"),
    ) {
        (Some(cert), Some(key)) => {
            builder = builder
                .tls_client_cert_files(cert, key)
                .map_err(|e| usage_config(&e))?;
        }
        (None, None) => {}
        _ => {
            return Err(usage(
                "BATON_TLS_CERT_FILE and BATON_TLS_KEY_FILE are set together or not at all",
            ))
        }
    }
    if let Some((unreached, outage)) = patience {
        let started = tokio::time::Instant::now();
        return builder
            .connect_patiently(unreached, outage)
            .await
            .map_err(|e| {
                if !e.is_retryable() {
                    return fail_with(&e);
                }
                let waited = text::human(started.elapsed());
                // The cause is said ("refused", "timed out"): it tells a wrong address or a
                // firewall from a server that is down.
                if e.kind() == baton::ErrorKind::Timeout {
                    say!(
                        "baton: connecting timed out: no answer from the server within {waited} \
                         (--connect-timeout, --give-up-after); giving up: {}",
                        text::error_message(&e)
                    );
                } else {
                    say!(
                        "baton: could not connect within {waited} (--connect-timeout, \
                         --give-up-after); giving up: {}",
                        text::error_message(&e)
                    );
                }
                exit::exit_for(e.kind())
            });
    }
    // The client retries connecting for a few seconds by itself; past that Redis is unavailable.
    match tokio::time::timeout(Duration::from_secs(8), builder.connect()).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) if e.kind() == baton::ErrorKind::Timeout => {
            say!("baton: connecting timed out: {}", text::error_message(&e));
            Err(exit::exit_for(e.kind()))
        }
        Ok(Err(e)) => Err(fail_with(&e)),
        Err(_) => {
            say!("baton: connecting timed out: the server did not answer within 8 s");
            Err(EX_UNAVAILABLE)
        }
    }
}
