//! The `baton` command's surface: flags refused rather than ignored, usage lines after a usage
//! error, the `--` tip, `--help` as the overview, and what a failed connection says (a server
//! that is not Redis, a refused or silent PostgreSQL, a `rediss://` URL to a plain server).
//! Every server here is a loopback listener of the test's own, or a private redis-server; every
//! connection test bounds baton with a short `--connect-timeout`.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::process::Output;
use std::time::Duration;

use common::process::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");

/// Upper bound for a `baton` process that has nothing to wait for.
const QUICK: Duration = Duration::from_secs(10);

/// A URL nothing listens on: usage errors must be found before connecting to it.
const UNREACHABLE: &str = "redis://127.0.0.1:1/";

fn baton(args: &[&str]) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.args(args);
    cmd
}

async fn run(cmd: &mut Command) -> Output {
    finish_by(spawn(cmd), Instant::now() + QUICK, "baton").await
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `Usage:` line of a usage error.
fn usage_line(text: &str) -> String {
    text.lines()
        .find(|l| l.starts_with("Usage:"))
        .unwrap_or_else(|| panic!("no usage line in:\n{text}"))
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// Flags refused, usage lines, the `--` tip
// ---------------------------------------------------------------------------------------------

/// `--tz` belongs to `--cron` and `--offset` to `--every`: with the other schedule they are
/// refused (64) by name, before connecting, not accepted and ignored.
#[tokio::test]
async fn tz_with_every_and_offset_with_cron_are_refused_naming_both_flags() {
    let cases: [(&[&str], [&str; 2]); 2] = [
        (
            &["--every", "5m", "--tz", "Europe/Paris"],
            ["--every", "--tz"],
        ),
        (
            &["--cron", "0 2 * * *", "--offset", "2h"],
            ["--cron", "--offset"],
        ),
    ];
    for sub in ["run", "schedule"] {
        for (flags, named) in &cases {
            let out = run(baton(&[sub, "--url", UNREACHABLE, "--key", "k"])
                .args(["--connect-timeout", "300ms"])
                .args(*flags)
                .args(["--", "true"]))
            .await;
            assert_eq!(code(&out), 64, "{sub} {flags:?}: {}", describe(&out));
            let err = stderr(&out);
            for flag in named {
                assert!(err.contains(flag), "{sub} {flags:?} names {flag}:\n{err}");
            }
        }
    }
}

/// After a usage error, the usage line is the command's own: `--url` (given on the command
/// line or by BATON_URL) is not shown as if it were required, and `[OPTIONS]` is there.
#[tokio::test]
async fn a_usage_error_shows_the_commands_own_usage_line() {
    let program = " -- <PROGRAM>...";
    let cases: Vec<(&str, Vec<&str>, String)> = vec![
        (
            "run",
            vec!["--key", "k"],
            format!("Usage: baton run [OPTIONS] --key <KEY>{program}"),
        ),
        (
            "schedule",
            vec!["--key", "k", "--every", "1m"],
            format!(
                "Usage: baton schedule [OPTIONS] --key <KEY> <--every <DURATION>|--cron <EXPR>>\
                 {program}"
            ),
        ),
        (
            "lock",
            vec!["--key", "k"],
            format!("Usage: baton lock [OPTIONS] --key <KEY>{program}"),
        ),
        (
            "leader",
            vec!["--key", "k"],
            format!("Usage: baton leader [OPTIONS] --key <KEY>{program}"),
        ),
        (
            "status",
            vec!["--bogus"],
            "Usage: baton status [OPTIONS]".into(),
        ),
        (
            "watch",
            vec!["--bogus"],
            "Usage: baton watch [OPTIONS] --key <KEY>".into(),
        ),
        (
            "unlock",
            vec!["--bogus"],
            "Usage: baton unlock [OPTIONS] --key <KEY>".into(),
        ),
        (
            "fail",
            vec!["--bogus"],
            "Usage: baton fail [OPTIONS] --key <KEY>".into(),
        ),
        (
            "reset",
            vec!["--bogus"],
            "Usage: baton reset [OPTIONS] --key <KEY>".into(),
        ),
        (
            "migrate",
            vec!["--bogus"],
            "Usage: baton migrate [OPTIONS]".into(),
        ),
    ];
    for (sub, args, want) in &cases {
        // --url on the command line, then from the environment.
        let given = run(baton(&[sub, "--url", UNREACHABLE]).args(args)).await;
        let from_env = run(baton(&[sub]).args(args).env("BATON_URL", UNREACHABLE)).await;
        for out in [given, from_env] {
            assert_eq!(code(&out), 64, "{sub}: {}", describe(&out));
            let line = usage_line(&stderr(&out));
            assert_eq!(&line, want, "{sub} {args:?}:\n{}", stderr(&out));
        }
    }
}

/// PROGRAM typed without `--`: clap's "unexpected argument" comes with a tip showing the line
/// with `--` put in before PROGRAM (64).
#[tokio::test]
async fn program_without_double_dash_gets_a_tip_with_the_line_fixed() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["run", "--key", "x", "-v", "echo", "hi"],
            "tip: put -- before PROGRAM: baton run --key x -v -- echo hi",
        ),
        (
            &["schedule", "--key", "x", "--every", "1m", "echo", "it's"],
            "tip: put -- before PROGRAM: baton schedule --key x --every 1m -- echo 'it'\\''s'",
        ),
        (
            &["lock", "--key", "x", "--wait", "5s", "echo", "hi"],
            "tip: put -- before PROGRAM: baton lock --key x --wait 5s -- echo hi",
        ),
        (
            &["leader", "--key", "echo", "echo", "hi"],
            "tip: put -- before PROGRAM: baton leader --key echo -- echo hi",
        ),
    ];
    for (args, tip) in cases {
        let out = run(&mut baton(args)).await;
        assert_eq!(code(&out), 64, "{args:?}: {}", describe(&out));
        let err = stderr(&out);
        assert!(
            err.contains("unexpected argument 'echo'"),
            "{args:?}:\n{err}"
        );
        assert!(err.contains(tip), "{args:?} wants {tip:?}:\n{err}");
    }
}

/// `baton --help` is the overview (commands, where to read more, the exit statuses in one
/// short table), not `run`'s manual; every command's own `--help` keeps its manual.
#[tokio::test]
async fn top_help_is_the_overview_and_each_command_keeps_its_own_manual() {
    let top = run(&mut baton(&["--help"])).await;
    assert_eq!(code(&top), 0, "{}", describe(&top));
    let text = stdout(&top);
    assert!(text.lines().count() <= 80, "--help is short:\n{text}");
    for want in [
        "Commands:",
        "run --help",
        "docs/cli.md",
        "Exit statuses",
        "78",
    ] {
        assert!(text.contains(want), "--help has {want:?}:\n{text}");
    }
    // `run`'s manual lives in `run --help` only.
    for run_only in [
        "Crontab example",
        "BATON_FENCING_TOKEN",
        "setsid or setpgid",
    ] {
        assert!(
            !text.contains(run_only),
            "--help lacks {run_only:?}:\n{text}"
        );
    }
    let manuals: [(&str, &str); 9] = [
        ("run", "Crontab example"),
        ("schedule", "Exit statuses of `baton schedule`"),
        ("lock", "Exit statuses of `baton lock`"),
        ("leader", "Exit statuses of `baton leader`"),
        ("unlock", "Not for:"),
        ("fail", "--attempt N` releases attempt N"),
        ("reset", "--attempt N` releases attempt N"),
        ("migrate", "baton_advisory_fence"),
        ("run", "setsid or setpgid"),
    ];
    for (sub, want) in manuals {
        let out = run(&mut baton(&[sub, "--help"])).await;
        assert_eq!(code(&out), 0, "{sub}: {}", describe(&out));
        assert!(
            stdout(&out).contains(want),
            "{sub} --help has {want:?}:\n{}",
            stdout(&out)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// What a failed connection says
// ---------------------------------------------------------------------------------------------

/// A loopback listener that answers every connection with `reply` and closes it: after
/// reading what the client sent first (`speaks_first` false: an HTTP server, which also echoes
/// the request back, as some error pages do) or before (an SSH daemon's banner).
async fn impostor(reply: &'static [u8], speaks_first: bool) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut got = vec![0u8; 4096];
                if speaks_first {
                    let _ = conn.write_all(reply).await;
                    let _ = conn.read(&mut got).await;
                } else {
                    let n = tokio::time::timeout(Duration::from_secs(1), conn.read(&mut got))
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .unwrap_or(0);
                    let _ = conn.write_all(reply).await;
                    let _ = conn.write_all(&got[..n]).await;
                }
            });
        }
    });
    port
}

/// A loopback listener that accepts connections and never answers (kept open).
async fn silent() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    port
}

/// A loopback port nobody listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// `baton run` (patient: --connect-timeout) and `baton status` (at once) against `url`.
async fn connect_both(url: &str) -> [(&'static str, Output, Duration); 2] {
    let started = Instant::now();
    let runs = run(baton(&["run", "--url", url, "--key", "k"]).args([
        "--connect-timeout",
        "2s",
        "--",
        "true",
    ]))
    .await;
    let run_took = started.elapsed();
    let started = Instant::now();
    let status = run(&mut baton(&["status", "--url", url])).await;
    [
        ("run", runs, run_took),
        ("status", status, started.elapsed()),
    ]
}

/// A redis:// URL (or a Cluster seed, a Sentinel) on a port where something else listens: one
/// line saying it is not a Redis server and what it answered (printable, shortened, no
/// credentials), exit 78 (no retry helps), at once.
#[tokio::test]
async fn a_redis_url_to_a_server_that_is_not_redis_exits_78_saying_what_answered() {
    let http = impostor(
        b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n",
        false,
    )
    .await;
    let ssh = impostor(b"SSH-2.0-OpenSSH_9.2p1\r\n", true).await;
    let mut urls = vec![
        (
            format!("redis://app:s3cret@127.0.0.1:{http}/"),
            "\"HTTP/1.1 400 Bad Request…\"",
        ),
        (
            format!("redis://127.0.0.1:{ssh}/"),
            "\"SSH-2.0-OpenSSH_9.2p1\"",
        ),
    ];
    if cfg!(feature = "cluster") {
        urls.push((
            format!("redis+cluster://127.0.0.1:{http}/"),
            "\"HTTP/1.1 400 Bad Request…\"",
        ));
    }
    if cfg!(feature = "sentinel") {
        urls.push((
            format!("redis+sentinel://127.0.0.1:{ssh}/mymaster"),
            "\"SSH-2.0-OpenSSH_9.2p1\"",
        ));
    }
    for (url, answered) in &urls {
        for (sub, out, took) in connect_both(url).await {
            assert_eq!(code(&out), 78, "{sub} {url}: {}", describe(&out));
            let err = stderr(&out);
            let want = format!("is not a Redis server (it answered {answered})");
            assert!(err.contains(&want), "{sub} {url} says {want:?}:\n{err}");
            assert!(
                err.contains("127.0.0.1:"),
                "{sub} {url} names the server:\n{err}"
            );
            assert_eq!(err.lines().count(), 1, "{sub} {url}: one line:\n{err}");
            assert!(!err.contains("s3cret"), "{sub} {url}:\n{err}");
            assert!(took < Duration::from_secs(2), "{sub} {url}: {took:?}");
        }
    }
}

/// PostgreSQL connection errors keep their cause: a closed port says "refused", a server that
/// accepts and never answers says "timed out", within --connect-timeout.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn a_postgres_connection_error_says_refused_or_timed_out() {
    let closed = format!("postgres://baton:pw@127.0.0.1:{}/baton", closed_port());
    let silent = format!("postgres://baton:pw@127.0.0.1:{}/baton", silent().await);
    for (url, cause) in [(&closed, "refused"), (&silent, "timed out")] {
        for (sub, out, took) in connect_both(url).await {
            assert_eq!(code(&out), 69, "{sub} {url}: {}", describe(&out));
            let err = stderr(&out);
            assert!(err.contains(cause), "{sub} {url} says {cause:?}:\n{err}");
            assert!(!err.contains("pw@"), "{sub}:\n{err}");
            assert!(took < Duration::from_secs(5), "{sub} {url}: {took:?}");
        }
    }
}

/// A `rediss://` URL to a plain Redis says the server looks like it does not speak TLS (it
/// accepted the connection and never answered the handshake), not only that it did not answer
/// in time; nothing is sent to it in clear.
#[cfg(feature = "tls")]
#[tokio::test]
async fn a_rediss_url_to_a_plain_redis_says_it_does_not_speak_tls() {
    let srv = baton::testing::RedisServer::start()
        .unwrap_or_else(|e| panic!("cannot start redis-server: {e}"));
    let url = format!("rediss://127.0.0.1:{}/", srv.port());
    for (sub, out, took) in connect_both(&url).await {
        assert_ne!(code(&out), 0, "{sub}: {}", describe(&out));
        let err = stderr(&out);
        assert!(
            err.contains("it looks like it does not speak TLS"),
            "{sub} {url}:\n{err}"
        );
        assert!(took < Duration::from_secs(5), "{sub}: {took:?}");
    }
}
