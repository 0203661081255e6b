//! A process that started `RedisServer`s or a `PgServer` and is killed (SIGKILL, SIGTERM) leaves
//! no `redis-server` or `postgres` process behind (`--features testing`).
//!
//! Each test re-executes this test binary as a child that runs [`orphan_child`] (ignored, so
//! it only runs when asked for, and does nothing without [`CHILD_ENV`]): the child starts a
//! server on a short-lived thread, prints the server's PID and port, and waits. The test checks
//! that the server outlives the thread that created it, kills the child, and expects the server
//! to be gone within a few seconds.
#![cfg(feature = "testing")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use baton::testing::RedisServer;

const CHILD_ENV: &str = "BATON_FIXTURE_ORPHAN_CHILD";
const CHILD_TEST: &str = "orphan_child";
/// How long the server may take to die after its parent process did.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// The child's part: a server started on a thread that then exits, its PID and port on stdout,
/// then a wait the parent cuts short (bounded, so a failed test never leaves it running).
#[test]
#[ignore = "run as a child process by the tests of this file"]
fn orphan_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let server = std::thread::spawn(|| RedisServer::start().expect("start redis-server"))
        .join()
        .expect("the starting thread");
    let pid = server.pid().expect("the server runs");
    println!("REDIS_SERVER {pid} {}", server.port());
    std::io::stdout().flush().expect("flush stdout");
    std::thread::sleep(Duration::from_secs(30));
    drop(server);
}

/// `true` once `pid` is no redis-server of ours: gone, a zombie, or (recycled) something else.
fn gone(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    if state == Some('Z') {
        return true;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    !String::from_utf8_lossy(&cmdline).contains("redis-server")
}

fn pong(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is a process this test started
    // (the child, or the redis-server the child started), positive.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Runs the child, kills it with `sig`, and expects its redis-server to die with it.
fn killed_child_leaves_no_server(sig: libc::c_int) {
    let exe = std::env::current_exe().expect("this test binary");
    let mut child = Command::new(exe)
        .args([CHILD_TEST, "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("re-execute the test binary");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // libtest prints "test orphan_child ... " first, on the same line.
            if let Some((_, rest)) = line.split_once("REDIS_SERVER ") {
                let mut it = rest.split_whitespace().map(|v| v.parse::<u32>());
                if let (Some(Ok(pid)), Some(Ok(port))) = (it.next(), it.next()) {
                    let _ = tx.send((pid, port as u16));
                }
            }
        }
    });
    let Ok((pid, port)) = rx.recv_timeout(Duration::from_secs(30)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the child printed no REDIS_SERVER line");
    };
    // The thread that started the server has exited: the server must still serve.
    std::thread::sleep(Duration::from_millis(100));
    let alive = !gone(pid) && pong(port);
    if !alive {
        let _ = child.kill();
        let _ = child.wait();
        panic!("redis-server {pid} died with the thread that started it");
    }
    signal(child.id(), sig);
    let status = child.wait().expect("wait for the child");
    assert!(!status.success(), "the child was killed: {status:?}");
    let deadline = Instant::now() + GONE_WITHIN;
    while !gone(pid) {
        if Instant::now() > deadline {
            // Clean up what the failed fixture left, then fail.
            signal(pid, libc::SIGKILL);
            panic!(
                "redis-server {pid} outlived the process that started it (killed with signal \
                 {sig}) by {GONE_WITHIN:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigkill_leaves_no_redis_server() {
    killed_child_leaves_no_server(libc::SIGKILL);
}

#[test]
fn sigterm_leaves_no_redis_server() {
    killed_child_leaves_no_server(libc::SIGTERM);
}

// PostgreSQL (`PgServer`): the postmaster gets SIGQUIT when the process that started it dies, an
// immediate shutdown that also ends every backend and auxiliary process it forked.

const PG_CHILD_TEST: &str = "pg_orphan_child";

/// The child's part for PostgreSQL: as [`orphan_child`], with a `PgServer`.
#[test]
#[ignore = "run as a child process by the tests of this file"]
fn pg_orphan_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let server = std::thread::spawn(|| baton::testing::PgServer::start().expect("start postgres"))
        .join()
        .expect("the starting thread");
    println!(
        "PG_SERVER {} {} {}",
        server.pid(),
        server.port(),
        server.socket_dir().display()
    );
    std::io::stdout().flush().expect("flush stdout");
    std::thread::sleep(Duration::from_secs(30));
    drop(server);
}

/// `pid` and every live process whose parent is `pid` (the postmaster's backends and workers).
fn with_children(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        let ppid = stat.rfind(')').and_then(|i| {
            stat[i + 1..]
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u32>().ok())
        });
        if ppid == Some(pid) {
            pids.push(p);
        }
    }
    pids
}

/// `true` once `pid` is no postgres process: gone, a zombie, or (recycled) something else.
fn pg_gone(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].trim_start().chars().next());
    if state == Some('Z') {
        return true;
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    !String::from_utf8_lossy(&cmdline).contains("postgres")
}

/// Runs the PostgreSQL child, kills it with `sig`, and expects the postmaster and all its
/// children to die with it.
fn killed_child_leaves_no_postgres(sig: libc::c_int) {
    let exe = std::env::current_exe().expect("this test binary");
    let mut child = Command::new(exe)
        .args([PG_CHILD_TEST, "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(CHILD_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("re-execute the test binary");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some((_, rest)) = line.split_once("PG_SERVER ") {
                let mut it = rest.splitn(3, ' ');
                let pid = it.next().and_then(|v| v.parse::<u32>().ok());
                let port = it.next().and_then(|v| v.parse::<u16>().ok());
                if let (Some(pid), Some(port), Some(dir)) = (pid, port, it.next()) {
                    let _ = tx.send((pid, port, std::path::PathBuf::from(dir)));
                }
            }
        }
    });
    let Ok((pid, port, dir)) = rx.recv_timeout(Duration::from_secs(60)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the child printed no PG_SERVER line");
    };
    // The thread that started the server has exited: the server must still accept connections.
    std::thread::sleep(Duration::from_millis(100));
    let processes = with_children(pid);
    let alive = !pg_gone(pid) && TcpStream::connect(("127.0.0.1", port)).is_ok();
    if !alive || processes.len() < 2 {
        let _ = child.kill();
        let _ = child.wait();
        panic!("postgres {pid} died with the thread that started it (processes: {processes:?})");
    }
    signal(child.id(), sig);
    let status = child.wait().expect("wait for the child");
    assert!(!status.success(), "the child was killed: {status:?}");
    let deadline = Instant::now() + GONE_WITHIN;
    while let Some(&left) = processes.iter().find(|&&p| !pg_gone(p)) {
        if Instant::now() > deadline {
            for &p in &processes {
                if !pg_gone(p) {
                    signal(p, libc::SIGKILL);
                }
            }
            panic!(
                "postgres process {left} (of {processes:?}) outlived the process that started it \
                 (killed with signal {sig}) by {GONE_WITHIN:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // A killed process cannot remove the fixture's directory; this test can.
    let ours = dir.starts_with(std::env::temp_dir())
        && dir
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("baton-pg-"));
    if ours {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn sigkill_leaves_no_postgres() {
    killed_child_leaves_no_postgres(libc::SIGKILL);
}

#[test]
fn sigterm_leaves_no_postgres() {
    killed_child_leaves_no_postgres(libc::SIGTERM);
}
