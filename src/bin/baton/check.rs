//! `baton check`: a schedule's health for a monitor, by the Nagios plugin convention: one line
//! on stdout (`SCHEDULE CRITICAL - …`) and the exit status 0 OK, 1 WARNING, 2 CRITICAL,
//! 3 UNKNOWN. The only command whose statuses are not sysexits (exit.rs): a monitor reads any
//! other status as a broken plugin. The verdict is the library's
//! ([`baton::ScheduleRecord::check`]), computed from the store alone, so it holds when every
//! worker is down; this file reads the record, picks the digest to judge and prints.

use std::time::Duration;

use baton::{CheckStatus, Client, FailoverConfig};

use super::out;
use super::text;

pub(crate) const OK: u8 = 0;
pub(crate) const WARNING: u8 = 1;
pub(crate) const CRITICAL: u8 = 2;
pub(crate) const UNKNOWN: u8 = 3;

/// What makes a schedule CRITICAL besides its missed, failed and exhausted occurrences.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Thresholds {
    /// `--max-age`: the last success must have ended within this.
    pub(crate) max_age: Option<Duration>,
    /// `--allow-absent`: no record at all is OK.
    pub(crate) allow_absent: bool,
}

/// Prints the status line and returns the status.
fn verdict(code: u8, line: &str) -> u8 {
    let word = match code {
        OK => "OK",
        WARNING => "WARNING",
        CRITICAL => "CRITICAL",
        _ => "UNKNOWN",
    };
    say_line(&format!("{word}: {line}"));
    code
}

/// Prints `SCHEDULE ` and `line` (which starts with the status word) as one line: a monitor
/// shows the first line only.
fn say_line(line: &str) {
    outln!("SCHEDULE {}", line.replace('\n', " "));
}

/// The status line when the server could not be reached (the connection's error was said on
/// stderr).
pub(crate) fn unreachable() -> u8 {
    verdict(UNKNOWN, "cannot reach the server (see stderr)")
}

/// Whether the command line's subcommand is `check`: its parse errors are UNKNOWN, not 64.
/// The first word that is neither a flag nor the value of a global flag that takes one.
pub(crate) fn is_check(args: &[std::ffi::OsString]) -> bool {
    let mut words = args.iter().map(|a| a.to_string_lossy());
    while let Some(w) = words.next() {
        match &*w {
            "--url" | "--redis-url" | "--prefix" => {
                words.next();
            }
            w if w.starts_with('-') => {}
            w => return w == "check",
        }
    }
    false
}

pub(crate) async fn check(client: &Client, config: FailoverConfig, limits: Thresholds) -> u8 {
    let key = config.key().to_string();
    let failover = client.failover();
    let unknown = |e: &baton::Error| {
        verdict(
            UNKNOWN,
            &format!("{key}: cannot read the record: {}", text::error_message(e)),
        )
    };
    let records = match failover.schedule_records(config.clone()).await {
        Ok(r) => r,
        Err(e) => return unknown(&e),
    };
    // The digest in use: the one a host saw last. After a rolling change of the expression the
    // old digest's record stays until it expires, and its ticks after the change were never
    // meant to run: judging it would report them missed.
    let Some(record) = records.iter().max_by_key(|r| r.last_seen) else {
        if limits.allow_absent {
            return verdict(
                OK,
                &format!("{key}: no record in the store (--allow-absent)"),
            );
        }
        return verdict(
            CRITICAL,
            &format!(
                "{key}: no record in the store: never run by a baton that records, or forgotten \
                 (no host ran it for max(30 days, 10 gaps)); --allow-absent makes this OK"
            ),
        );
    };
    let now = match failover.server_time(&key).await {
        Ok(t) => t,
        Err(e) => return unknown(&e),
    };
    let history = match failover
        .schedule_history(config.clone(), &record.digest, record.spec.history as usize)
        .await
    {
        Ok(h) => h,
        Err(e) => return unknown(&e),
    };
    let check = record.check(&history, now, limits.max_age);
    let code = match check.status {
        CheckStatus::Ok => OK,
        CheckStatus::Warning => WARNING,
        CheckStatus::Critical => CRITICAL,
        _ => UNKNOWN,
    };
    // Performance data, after `|` by the convention: graphs of the counts over time.
    say_line(&format!(
        "{} | missed={} failed={}",
        check.line,
        check.missed.len(),
        check.failed.len()
    ));
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subcommand_is_found_past_global_flags_and_their_values() {
        let args =
            |s: &str| -> Vec<std::ffi::OsString> { s.split_whitespace().map(Into::into).collect() };
        assert!(is_check(&args("check --key k")));
        assert!(is_check(&args("--url check -q check --key x")));
        assert!(is_check(&args("--prefix p: check")));
        assert!(!is_check(&args("status --key check")));
        assert!(!is_check(&args("--url redis://x/ run --key check -- true")));
    }
}
