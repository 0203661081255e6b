//! `baton lock --permits N` (a semaphore's permit) and `--shared`/`--exclusive` (a read-write
//! lock's read and write), run as child processes on Redis and on PostgreSQL: N holders at
//! once with their slots in BATON_PERMIT, readers together and a writer after them, and the
//! flags that exclude each other refused before connecting. PROGRAMs hold until the test
//! creates a file, so nothing depends on timing; the bounds only catch a hang.
#![cfg(all(feature = "cli", feature = "testing"))]

mod common;

use std::process::Output;
use std::time::Duration;

use common::process::*;
use common::{server, shq, TempDir};
use tokio::process::{Child, Command};
use tokio::time::Instant;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const QUICK: Duration = Duration::from_secs(20);
const EX_USAGE: i32 = 64;
const EX_TEMPFAIL: i32 = 75;

/// `baton lock --url URL ARGS`.
fn lock(url: &str, args: &[&str]) -> Command {
    let mut cmd = baton_command(BATON);
    cmd.arg("lock").arg("--url").arg(url).args(args);
    cmd
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A PROGRAM that writes `$VAR` to `dir/in.<pid>`, then holds until `dir/go` exists.
fn holder(dir: &TempDir, var: &str) -> String {
    format!(
        "echo \"${var}\" > {d}/in.$$; while [ ! -e {d}/go ]; do sleep 0.02; done",
        d = shq(&dir.path(""))
    )
}

/// The contents of the `in.*` files, once there are `n` of them.
async fn entered(dir: &TempDir, n: usize) -> Vec<String> {
    let bound = Instant::now() + QUICK;
    loop {
        let mut seen: Vec<String> = std::fs::read_dir(dir.path(""))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("in."))
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .filter(|s| s.ends_with('\n'))
            .map(|s| s.trim().to_string())
            .collect();
        if seen.len() >= n {
            seen.sort();
            return seen;
        }
        assert!(
            Instant::now() < bound,
            "{n} holders never entered: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn done(child: Child, what: &str) -> Output {
    let out = finish_by(child, Instant::now() + QUICK, what).await;
    assert_eq!(out.status.code(), Some(0), "{what}: {}", text(&out));
    out
}

/// Three processes on a semaphore of 2: two run at once with slots 0 and 1, the third gives up
/// after --wait (75) while both are held, and one that waits runs once they end.
async fn two_of_three_run_at_once(url: &str) {
    let dir = TempDir::new("cli-permits");
    let hold = holder(&dir, "BATON_PERMIT");
    let args = ["--key", "pool", "--permits", "2", "--", "sh", "-c", &hold];
    let a = spawn(&mut lock(url, &args));
    let b = spawn(&mut lock(url, &args));
    assert_eq!(entered(&dir, 2).await, ["0", "1"]);
    let late = lock(
        url,
        &[
            "--key",
            "pool",
            "--permits",
            "2",
            "--wait",
            "300ms",
            "--",
            "true",
        ],
    )
    .output()
    .await
    .unwrap();
    assert_eq!(late.status.code(), Some(EX_TEMPFAIL), "{}", text(&late));
    let third = spawn(&mut lock(
        url,
        &[
            "--key",
            "pool",
            "--permits",
            "2",
            "--",
            "sh",
            "-c",
            "echo \"$BATON_PERMIT $BATON_FENCING_TOKEN\"",
        ],
    ));
    std::fs::write(dir.path("go"), "").unwrap();
    done(a, "first holder").await;
    done(b, "second holder").await;
    let out = done(third, "third holder").await;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (slot, token) = line.split_once(' ').expect("slot and token");
    assert!(slot == "0" || slot == "1", "{line}");
    assert!(token.parse::<u64>().unwrap() > 0, "{line}");
}

/// Two --shared readers run at once; an --exclusive writer gives up while they hold (75), and
/// one that waits runs after them with a new write token, which the next reader sees. The
/// mutex of the same name is another lock: it runs beside the readers.
async fn readers_share_and_the_writer_waits(url: &str) {
    let dir = TempDir::new("cli-shared");
    let hold = holder(&dir, "BATON_FENCING_TOKEN");
    let args = ["--key", "doc", "--shared", "--", "sh", "-c", &hold];
    let a = spawn(&mut lock(url, &args));
    let b = spawn(&mut lock(url, &args));
    assert_eq!(entered(&dir, 2).await, ["0", "0"]);
    let writer = |wait: &[&str]| {
        let mut v = vec!["--key", "doc", "--exclusive"];
        v.extend_from_slice(wait);
        v.extend_from_slice(&["--", "sh", "-c", "echo $BATON_FENCING_TOKEN"]);
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let w: Vec<String> = writer(&["--wait", "300ms"]);
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    let out = lock(url, &w).output().await.unwrap();
    assert_eq!(out.status.code(), Some(EX_TEMPFAIL), "{}", text(&out));
    let mutex = lock(url, &["--key", "doc", "--wait", "5s", "--", "true"])
        .output()
        .await
        .unwrap();
    assert_eq!(mutex.status.code(), Some(0), "{}", text(&mutex));
    let w: Vec<String> = writer(&[]);
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    let waiting = spawn(&mut lock(url, &w));
    std::fs::write(dir.path("go"), "").unwrap();
    done(a, "first reader").await;
    done(b, "second reader").await;
    let out = done(waiting, "writer").await;
    let token: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(token > 0);
    let read = lock(
        url,
        &[
            "--key",
            "doc",
            "--shared",
            "--",
            "sh",
            "-c",
            "echo $BATON_FENCING_TOKEN",
        ],
    )
    .output()
    .await
    .unwrap();
    assert_eq!(read.status.code(), Some(0), "{}", text(&read));
    assert_eq!(
        String::from_utf8_lossy(&read.stdout).trim(),
        token.to_string()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_on_redis() {
    let srv = server();
    two_of_three_run_at_once(&srv.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_and_exclusive_on_redis() {
    let srv = server();
    readers_share_and_the_writer_waits(&srv.url()).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_on_postgres() {
    let db = common::PgDatabase::create();
    two_of_three_run_at_once(&db.url).await;
}

#[cfg(feature = "postgres")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_and_exclusive_on_postgres() {
    let db = common::PgDatabase::create();
    readers_share_and_the_writer_waits(&db.url).await;
}

/// `--fair`: waiters run in the order they asked, across processes, and one that asked without
/// `--fair` after them waits behind the whole line. Each waiter starts a second after the one
/// before (time to connect and join the line); the order is read from the file they append to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_waiters_run_in_the_order_they_asked() {
    let srv = server();
    let url = srv.url();
    let dir = TempDir::new("cli-fair");
    let hold = holder(&dir, "BATON_PERMIT");
    let first = spawn(&mut lock(
        &url,
        &["--key", "line", "--permits", "1", "--", "sh", "-c", &hold],
    ));
    assert_eq!(entered(&dir, 1).await, ["0"]);
    let order = dir.path("order");
    let mut waiters = Vec::new();
    for (i, fair) in [(1, true), (2, true), (3, true), (4, false)] {
        let append = format!("echo {i} >> {}", shq(&order));
        let mut args = vec!["--key", "line", "--permits", "1"];
        if fair {
            args.push("--fair");
        }
        args.extend(["--", "sh", "-c", &append]);
        waiters.push(spawn(&mut lock(&url, &args)));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    std::fs::write(dir.path("go"), "").unwrap();
    done(first, "the holder").await;
    for (i, w) in waiters.into_iter().enumerate() {
        done(w, &format!("waiter {}", i + 1)).await;
    }
    let ran = std::fs::read_to_string(&order).unwrap();
    assert_eq!(
        ran.split_whitespace().collect::<Vec<_>>(),
        ["1", "2", "3", "4"]
    );
}

/// The flags that pick another primitive exclude each other, Redlock and --name: 64, before
/// connecting (nothing listens on port 1).
#[tokio::test]
async fn conflicting_flags_are_usage_errors() {
    let url = "redis://127.0.0.1:1/";
    let masters = "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3";
    for (args, says) in [
        (vec!["--permits", "2", "--shared"], "--permits and --shared"),
        (vec!["--shared", "--exclusive"], "--shared and --exclusive"),
        (
            vec!["--permits", "2", "--exclusive"],
            "--permits and --exclusive",
        ),
        (vec!["--permits", "0"], "--permits"),
        (vec!["--permits", "2", "--name", "x"], "--name"),
        (vec!["--fair"], "--fair needs --permits"),
        (vec!["--shared", "--fair"], "--fair needs --permits"),
    ] {
        let mut full = vec!["--key", "k"];
        full.extend(args.iter());
        full.extend(["--", "true"]);
        let out = lock(url, &full).output().await.unwrap();
        assert_eq!(
            out.status.code(),
            Some(EX_USAGE),
            "{args:?}: {}",
            text(&out)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(says),
            "{}",
            text(&out)
        );
    }
    for flag in [&["--permits", "3"][..], &["--shared"], &["--exclusive"]] {
        let mut cmd = baton_command(BATON);
        cmd.args(["lock", "--redlock", masters, "--key", "k"])
            .args(flag)
            .args(["--", "true"]);
        let out = cmd.output().await.unwrap();
        assert_eq!(
            out.status.code(),
            Some(EX_USAGE),
            "{flag:?}: {}",
            text(&out)
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--redlock"),
            "{}",
            text(&out)
        );
    }
}

/// The example lines of docs/cli.md's section, run as written on Redis (their PROGRAM replaced
/// by one that prints what it got): each exits 0, and --permits gives a slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_docs_lines_run_as_written() {
    let doc = include_str!("../docs/cli.md");
    let section = doc
        .split("### Permits and shared reads")
        .nth(1)
        .expect("docs/cli.md has the section");
    let lines: Vec<&str> = section
        .lines()
        .take_while(|l| !l.starts_with("- "))
        .filter(|l| l.starts_with("baton lock "))
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    let srv = server();
    for line in lines {
        let words: Vec<&str> = line.split_whitespace().skip(2).collect();
        let cut = words.iter().position(|w| *w == "--").expect("-- PROGRAM");
        let mut args = words[..cut].to_vec();
        args.extend([
            "--",
            "sh",
            "-c",
            "echo \"${BATON_PERMIT-none} $BATON_FENCING_TOKEN\"",
        ]);
        let out = lock(&srv.url(), &args).output().await.unwrap();
        assert_eq!(out.status.code(), Some(0), "{line}: {}", text(&out));
        let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let slot = said.split(' ').next().unwrap();
        assert_eq!(slot == "0", line.contains("--permits"), "{line}: {said}");
    }
}
