//! Scenario 5's holders, in a process of their own: the idle scenario measures the RSS of the
//! process that holds the waiting backups, so the holders must not share it.
//!
//! The bench re-executes itself (`std::env::current_exe()`) with [`FLAG`]: the child connects to
//! the given Redis URL, starts one keepalive holder per job, prints `acquired N in MS ms` once
//! every one holds its attempt, and keeps them until a line arrives on its standard input or
//! the input closes; then it shuts its client down (each holder releases its attempt), prints
//! `stopped unexpected K` (K = holders whose stream ended early) and exits.
//!
//! The child never outlives the bench: its input closes when the bench dies (however it dies),
//! it exits when its parent process changes (`exit_with_parent` in `main.rs`), and the bench
//! kills it by PID when [`Holders`] is dropped (a panic in the scenario included).

use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::time::Instant;

use crate::harness::{connect, spawn_idle_worker, wait_count};

/// The hidden command-line flag that makes the bench binary the holders' process:
/// `--idle-holders URL JOB_PREFIX N LEASE_MS`.
pub const FLAG: &str = "--idle-holders";

/// What the child is told to do.
pub struct ChildArgs {
    url: String,
    prefix: String,
    n: usize,
    lease: Duration,
}

/// `Some` when this process was started as the holders' process.
pub fn child_args() -> Option<ChildArgs> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() != Some(FLAG) {
        return None;
    }
    let parsed = (|| {
        let url = args.next()?;
        let prefix = args.next()?;
        let n = args.next()?.parse().ok()?;
        let lease = Duration::from_millis(args.next()?.parse().ok()?);
        Some(ChildArgs {
            url,
            prefix,
            n,
            lease,
        })
    })();
    match parsed {
        Some(a) => Some(a),
        None => {
            eprintln!("usage: {FLAG} URL JOB_PREFIX N LEASE_MS");
            std::process::exit(64);
        }
    }
}

/// The holders' process: see the module doc.
pub async fn child(args: ChildArgs) {
    let client = connect(&args.url).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let acquired = Arc::new(AtomicUsize::new(0));
    let unexpected = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..args.n)
        .map(|i| {
            spawn_idle_worker(
                &client,
                &format!("{}-{i}", args.prefix),
                args.lease,
                true,
                &stop_rx,
                acquired.clone(),
                unexpected.clone(),
            )
        })
        .collect();
    wait_count(
        "holders acquired",
        &acquired,
        args.n,
        Duration::from_secs(120),
    )
    .await;
    println!("acquired {} in {} ms", args.n, t0.elapsed().as_millis());
    // Hold until told to stop (a line) or the bench is gone (end of input).
    let mut line = String::new();
    let _ = BufReader::new(tokio::io::stdin())
        .read_line(&mut line)
        .await;
    // Streams that ended before the stop (a shut-down client ends every stream).
    let ended_early = unexpected.load(Ordering::Relaxed);
    let _ = stop_tx.send(true);
    client.shutdown(Duration::from_secs(60)).await;
    for t in tasks {
        let _ = t.await;
    }
    println!("stopped unexpected {ended_early}");
}

/// The holders' process, seen from the bench.
pub struct Holders {
    child: Child,
    pid: u32,
    stdin: Option<ChildStdin>,
    out: Lines<BufReader<ChildStdout>>,
}

impl Holders {
    /// Starts the holders' process and returns once all `n` hold their attempt (panics after
    /// `limit`, or when the child ends first).
    pub async fn start(
        url: &str,
        prefix: &str,
        n: usize,
        lease: Duration,
        limit: Duration,
    ) -> Self {
        let exe = std::env::current_exe().expect("the bench's own executable");
        let mut child = tokio::process::Command::new(exe)
            .arg(FLAG)
            .arg(url)
            .arg(prefix)
            .arg(n.to_string())
            .arg(lease.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("start the holders' process");
        let pid = child.id().expect("the holders' process has a PID");
        let stdin = child.stdin.take();
        let out = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        let mut h = Holders {
            child,
            pid,
            stdin,
            out,
        };
        match tokio::time::timeout(limit, h.out.next_line()).await {
            Ok(Ok(Some(l))) if l.starts_with("acquired ") => h,
            Ok(other) => panic!("holders' process (pid {pid}): {other:?} instead of 'acquired'"),
            Err(_) => panic!("holders' process (pid {pid}): not all {n} acquired in {limit:?}"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Tells the child to stop (its holders release their attempts) and waits for it (bounded);
    /// returns how many holders ended early, when the child said.
    pub async fn stop(mut self, limit: Duration) -> Option<usize> {
        if let Some(mut s) = self.stdin.take() {
            let _ = s.write_all(b"stop\n").await;
        }
        let said = tokio::time::timeout(limit, async {
            while let Ok(Some(l)) = self.out.next_line().await {
                if let Some(k) = l.strip_prefix("stopped unexpected ") {
                    return k.trim().parse().ok();
                }
            }
            None
        })
        .await
        .ok()
        .flatten();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        said
    }
}

impl Drop for Holders {
    /// Kills the child by its PID unless it has exited and been reaped (`kill_on_drop` would
    /// too; this says so where it matters).
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            let _ = self.child.start_kill();
        }
    }
}
