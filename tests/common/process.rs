//! Running the `baton` binary in the CLI tests: spawning, bounded waits for its exit and for
//! the files its PROGRAM writes, process state from `/proc`, signals, and `promtool check
//! metrics` on a scrape.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

/// The `baton` binary at `bin`, with no inherited `BATON_*` connection settings, stdin closed,
/// stdout/stderr captured, the forwarded signals at their defaults, and killed if the test drops
/// it.
pub fn baton_command(bin: &str) -> Command {
    let mut cmd = Command::new(bin);
    for var in [
        "BATON_REDIS_URL",
        "BATON_URL",
        "BATON_REDIS_PASSWORD_FILE",
        "BATON_TLS_CA_FILE",
        "BATON_TLS_CERT_FILE",
        "BATON_TLS_KEY_FILE",
    ] {
        cmd.env_remove(var);
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: the closure runs between fork and exec and only calls signal(2), which is
    // async-signal-safe and allocates nothing. A test run started in the background by a script
    // (`cmd &`) inherits SIGINT and SIGQUIT ignored, and baton leaves inherited ignored signals
    // ignored: reset them as an interactive shell would.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGQUIT, libc::SIGTERM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd
}

pub fn spawn(cmd: &mut Command) -> Child {
    cmd.spawn().expect("spawn baton")
}

/// Waits for `child` to exit by `deadline` and returns its output; kills it and panics if not.
pub async fn finish_by(child: Child, deadline: Instant, what: &str) -> Output {
    match tokio::time::timeout_at(deadline, child.wait_with_output()).await {
        Ok(out) => out.expect("wait for baton"),
        // Dropping the future drops the child, which kills it (kill_on_drop).
        Err(_) => panic!("{what}: baton did not exit in time"),
    }
}

pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The exit code; panics (with the output) if a signal ended the process.
pub fn code(out: &Output) -> i32 {
    out.status
        .code()
        .unwrap_or_else(|| panic!("baton was ended by a signal: {}", describe(out)))
}

pub fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Whether process `pid` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// Whether `pid` is gone by `within`.
pub async fn gone_within(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if !alive(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until `pred` holds for the file's contents (a missing file reads as empty), or `None`
/// after `within`.
pub async fn wait_file(
    path: &Path,
    within: Duration,
    pred: impl Fn(&str) -> bool,
) -> Option<String> {
    let deadline = Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if pred(&text) {
            return Some(text);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for a PID file written by `echo $$ > FILE`.
pub async fn read_pid(path: &Path, within: Duration) -> u32 {
    let text = wait_file(path, within, |t| {
        t.ends_with('\n') && t.trim().parse::<u32>().is_ok()
    })
    .await
    .unwrap_or_else(|| panic!("{} was not written within {within:?}", path.display()));
    text.trim().parse().unwrap()
}

/// Sends `sig` to a process this test started.
pub fn send_signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is a live process of this test.
    let r = unsafe { libc::kill(pid as libc::pid_t, sig) };
    assert_eq!(
        r,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// Checks `text` (a scrape of `what`) with `promtool check metrics`: it must exit 0 and say
/// nothing (a lint finding, such as a metric without `# HELP`, exits 3), and every baton metric
/// in it must have its `# HELP` line. promtool missing is a failure, never a skip.
pub fn promtool_check(text: &str, what: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => panic!(
            "promtool check metrics: cannot run promtool ({e}); install it with \
             `. .ci/ensure-promtool` (Debian's prometheus package){}",
            if std::env::var_os("CI").is_some() {
                " — CI must install it before the tests"
            } else {
                ""
            }
        ),
    };
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(text.as_bytes())
        .expect("promtool reads the scrape");
    let out = child.wait_with_output().expect("promtool ends");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics on {what}: exit {:?}\n{said}\n--- the scrape ---\n{text}",
        out.status.code()
    );
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .filter(|n| n.starts_with("baton_"))
        .collect();
    assert!(!families.is_empty(), "{what}: no baton metric in\n{text}");
    for name in families {
        assert!(
            text.lines()
                .any(|l| l.starts_with(&format!("# HELP {name} "))),
            "{what}: {name} has no # HELP line:\n{text}"
        );
    }
}
