//! `baton lock`: take the fenced mutex (or a Redlock, with --redlock; a semaphore's permit with
//! --permits; a read-write lock's read or write with --shared or --exclusive), run PROGRAM while
//! the watchdog keeps it, release it when PROGRAM ends. One file for every lock: the same flags,
//! the same exit statuses, only the acquisition, PROGRAM's environment and the release's answer
//! differ.

use std::future::Future;

use baton::{
    AcquireOptions, Client, ConfigError, Error, ErrorKind, Fenced, LeaseGuard, Redlock,
    RedlockOptions,
};

use super::cli::LockArgs;
use super::exit::{
    exit_code, fail_with, usage, usage_config, EX_LOST, EX_TEMPFAIL, EX_UNAVAILABLE,
};
use super::out;
use super::signals::{install_signals, signal_status};
use super::sink::Sink;
use super::supervisor::{run_held, Held, Stopping};
use super::text::{self, human};
use super::LEASE_CHECK_TIMEOUT;

/// What `baton lock` holds while PROGRAM runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The fenced mutex (or a Redlock, with --redlock).
    Mutex,
    /// One of N permits of a semaphore (--permits N).
    Permit(u32),
    /// A shared read of a read-write lock (--shared).
    Read,
    /// The write of a read-write lock (--exclusive).
    Write,
}

/// Which lock `args` asks for; `Err` (64) for flags that exclude each other: --permits,
/// --shared and --exclusive pick one primitive each, and Redlock makes none of them.
pub(crate) fn kind(args: &LockArgs) -> Result<Kind, u8> {
    let mut picked: Vec<&str> = Vec::new();
    if args.permits.is_some() {
        picked.push("--permits");
    }
    if args.shared {
        picked.push("--shared");
    }
    if args.exclusive {
        picked.push("--exclusive");
    }
    if picked.len() > 1 {
        return Err(usage(format!(
            "{} cannot be used together: each names a lock of its own kind",
            picked.join(" and ")
        )));
    }
    if args.fair && args.permits.is_none() {
        return Err(usage(
            "--fair needs --permits: it is the semaphore's FIFO line (for a FIFO mutex, use the \
             fair lock's API)",
        ));
    }
    let Some(flag) = picked.first() else {
        return Ok(Kind::Mutex);
    };
    if !args.redlock.is_empty() {
        return Err(usage(format!(
            "{flag} cannot be used with --redlock: Redlock makes neither a semaphore nor a \
             read-write lock"
        )));
    }
    if args.name.is_some() {
        return Err(usage(format!(
            "--name cannot be used with {flag}: its holders are shown by token"
        )));
    }
    Ok(match args.permits {
        Some(0) => return Err(usage("invalid --permits: 0 (at least 1)")),
        Some(n) => Kind::Permit(n),
        None if args.shared => Kind::Read,
        None => Kind::Write,
    })
}

/// Checks `lock`'s durations (before connecting) and sets up its output.
pub(crate) fn config(args: &LockArgs) -> Result<(AcquireOptions, Sink), u8> {
    if args.lease < baton::mutex::MIN_LEASE || args.lease > baton::mutex::MAX_LEASE {
        return Err(usage(format!(
            "invalid --lease: {} is outside 10 ms ..= 1 day",
            human(args.lease)
        )));
    }
    // The watchdog is started here, not by `acquire`: it must run from the grant on, and the
    // loss it reports is what stops PROGRAM.
    let mut opts = AcquireOptions::builder().watchdog(true);
    if let Some(wait) = args.wait {
        opts = opts.wait(wait);
    }
    // The holder's name rides in the lock's token (`TOKEN:NAME`), for `status` to show. Only
    // the mutex keeps one (`kind` refused --name for the others).
    if args.redlock.is_empty() && kind(args) == Ok(Kind::Mutex) {
        opts = opts.holder_name(
            args.name
                .clone()
                .unwrap_or_else(baton::client::default_worker_name),
        );
    }
    if args.fair {
        opts = opts.fair(true);
    }
    let opts = opts.build().map_err(|e| usage_config(&e))?;
    let sink = Sink {
        json: false,
        file: None,
        verbose: args.verbose,
        key: args.key.clone(),
        occurrence: None,
    };
    Ok((opts, sink))
}

/// `baton lock` on --url: takes what `args` asks for ([`kind`]) and runs PROGRAM under it.
pub(crate) async fn lock(
    client: &Client,
    args: &LockArgs,
    opts: AcquireOptions,
    sink: Sink,
    prefix: &str,
) -> u8 {
    // `main` checked the flags before connecting; this only reads them again.
    let kind = match kind(args) {
        Ok(k) => k,
        Err(code) => return code,
    };
    let (key, lease) = (args.key.as_str(), args.lease);
    match kind {
        Kind::Mutex => {
            let locks = match client.locks().with_prefix(prefix) {
                Ok(l) => l,
                Err(e) => return usage_config(&e),
            };
            hold(client, args, sink, locks.acquire(key, lease, &opts), |_| {
                Vec::new()
            })
            .await
        }
        Kind::Permit(limit) => {
            let sems = match client.semaphores().with_prefix(prefix) {
                Ok(s) => s,
                Err(e) => return usage_config(&e),
            };
            let acquiring = sems.acquire(key, limit, lease, &opts);
            hold(client, args, sink, acquiring, |g| {
                vec![("BATON_PERMIT", g.slot().to_string())]
            })
            .await
        }
        Kind::Read | Kind::Write => {
            let rw = match client.rw_locks().with_prefix(prefix) {
                Ok(r) => r,
                Err(e) => return usage_config(&e),
            };
            if kind == Kind::Read {
                hold(client, args, sink, rw.read(key, lease, &opts), |_| {
                    Vec::new()
                })
                .await
            } else {
                hold(client, args, sink, rw.write(key, lease, &opts), |_| {
                    Vec::new()
                })
                .await
            }
        }
    }
}

/// Waits for `acquiring` (a signal gives up), then runs PROGRAM under the guard it yields and
/// releases it: the same for every fenced lease. PROGRAM gets BATON_LOCK_KEY,
/// BATON_FENCING_TOKEN and what `extra` adds for this guard.
async fn hold<G, F>(
    client: &Client,
    args: &LockArgs,
    mut sink: Sink,
    acquiring: F,
    extra: impl FnOnce(&G) -> Vec<(&'static str, String)>,
) -> u8
where
    G: LeaseGuard + Fenced,
    F: Future<Output = Result<G, Error>>,
{
    let (mut signals, mut sigchld) = match install_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    sink.note("waiting for the lock");
    let got = tokio::select! {
        sig = signals.recv() => Err(sig),
        got = acquiring => Ok(got),
    };
    let guard = match got {
        Ok(Ok(guard)) => guard,
        Ok(Err(e)) if e.kind() == ErrorKind::NotAcquired => {
            say!(
                "baton: {}: not acquired: {}",
                args.key,
                text::error_message(&e)
            );
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
    let mut env = vec![
        ("BATON_LOCK_KEY", args.key.clone()),
        ("BATON_FENCING_TOKEN", fence.to_string()),
    ];
    env.extend(extra(&guard));
    let more: Vec<String> = env[2..].iter().map(|(k, v)| format!(", {k}={v}")).collect();
    sink.note(&format!(
        "acquired (fencing token {fence}{})",
        more.concat()
    ));
    let done = match run_held(
        &guard,
        Held::Lock,
        &args.program,
        &env,
        args.lease,
        args.kill_grace,
        &mut sink,
        &mut signals,
        &mut sigchld,
    )
    .await
    {
        Ok(done) => done,
        Err(code) => {
            let _ = guard.release().await;
            return code;
        }
    };
    // Released in every case: after a loss the token check makes this a no-op on a lock that
    // passed on, and it frees at once a lock whose loss was only a missed deadline.
    let released = guard.release().await;
    let status = match done.status {
        Ok(s) => s,
        Err(e) => {
            say!("baton: lost track of PROGRAM: {e}");
            return EX_LOST;
        }
    };
    match done.stopping {
        Some(Stopping::Lost) => EX_LOST,
        Some(Stopping::Signal(sig)) => signal_status(sig),
        None => match released {
            Ok(true) => exit_code(&status),
            Ok(false) => {
                say!(
                    "baton: {}: PROGRAM ended, but the lock was held by another token by then \
                     (mutual exclusion may have been broken)",
                    args.key
                );
                EX_LOST
            }
            Err(e) => {
                // PROGRAM finished while the lock was ours; it expires by its ttl.
                say!(
                    "baton: {}: the release failed (the lock expires by its ttl): {}",
                    args.key,
                    text::error_message(&e)
                );
                exit_code(&status)
            }
        },
    }
}

/// `--redlock`'s URLs: at least 3, an odd number, all distinct (checked before connecting).
pub(crate) fn redlock_urls(urls: &[String]) -> Result<(), u8> {
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
pub(crate) fn masters(urls: &[String]) -> Result<Vec<Client>, u8> {
    let mut clients = Vec::with_capacity(urls.len());
    for (i, u) in urls.iter().enumerate() {
        let bad = |what: String| usage(format!("--redlock master {i}: {what}"));
        let mut builder = Client::builder(u.clone());
        if let Some(path) = std::env::var_os("BATON_REDIS_PASSWORD_FILE") {
            builder = builder
                .password_file(path)
                .map_err(|e| bad(text::config_message(&e)))?;
        }
        let client = builder.build_lazy().map_err(|e| match &e {
            // The master's URL is one of --redlock's, not --url.
            baton::Error::Config(ConfigError::Invalid {
                field: "url",
                reason,
            }) => bad(format!("invalid URL: {}", text::reword(reason))),
            _ => bad(text::error_message(&e)),
        })?;
        clients.push(client);
    }
    Ok(clients)
}

pub(crate) async fn redlock(
    args: &LockArgs,
    opts: RedlockOptions,
    mut sink: Sink,
    prefix: &str,
) -> u8 {
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

pub(crate) async fn redlock_with(
    clients: &[Client],
    args: &LockArgs,
    opts: RedlockOptions,
    sink: &mut Sink,
    prefix: &str,
) -> u8 {
    let rl = match Redlock::new(clients).and_then(|r| r.with_prefix(prefix)) {
        Ok(r) => r,
        Err(e) => return usage_config(&e),
    };
    let (mut signals, mut sigchld) = match install_signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    sink.note("waiting for the Redlock");
    let got = tokio::select! {
        sig = signals.recv() => Err(sig),
        got = rl.acquire(&args.key, args.lease, &opts) => Ok(got),
    };
    let mut guard = match got {
        Ok(Ok(guard)) => guard,
        Ok(Err(e)) if e.kind() == ErrorKind::NotAcquired => {
            say!(
                "baton: {}: not acquired: {}",
                args.key,
                text::error_message(&e)
            );
            return EX_TEMPFAIL;
        }
        Ok(Err(e)) if e.kind() == ErrorKind::QuorumUnavailable => {
            say!(
                "baton: {}: the Redlock needs a quorum of {} of {} masters: {}",
                args.key,
                rl.quorum(),
                rl.masters(),
                text::error_message(&e)
            );
            return EX_UNAVAILABLE;
        }
        Ok(Err(e)) => return fail_with(&e),
        // The dropped acquisition releases on every master in a client task; the caller's
        // shutdown lets it finish.
        Err(sig) => return signal_status(sig),
    };
    guard.start_watchdog(None);
    sink.note(&format!(
        "acquired on a quorum of {} of {} masters (no fencing token: Redlock has none)",
        rl.quorum(),
        rl.masters()
    ));
    let env = [("BATON_LOCK_KEY", args.key.clone())];
    let done = match run_held(
        &guard,
        Held::Lock,
        &args.program,
        &env,
        args.lease,
        args.kill_grace,
        sink,
        &mut signals,
        &mut sigchld,
    )
    .await
    {
        Ok(done) => done,
        Err(code) => {
            let _ = guard.release().await;
            return code;
        }
    };
    let quorum = rl.quorum();
    let released = guard.release_counted().await;
    let status = match done.status {
        Ok(s) => s,
        Err(e) => {
            say!("baton: lost track of PROGRAM: {e}");
            return EX_LOST;
        }
    };
    match done.stopping {
        Some(Stopping::Lost) => EX_LOST,
        Some(Stopping::Signal(sig)) => signal_status(sig),
        None => match released {
            Ok(held) if held >= quorum => exit_code(&status),
            Ok(held) => {
                say!(
                    "baton: {}: PROGRAM ended, but only {held} masters still held the lock \
                     (a quorum is {quorum}; mutual exclusion may have been broken)",
                    args.key
                );
                EX_LOST
            }
            Err(e) => {
                say!(
                    "baton: {}: the release failed (the lock expires by its ttl): {}",
                    args.key,
                    text::error_message(&e)
                );
                exit_code(&status)
            }
        },
    }
}
