//! `baton dashboard` against a private redis-server: in a real browser (Debian's headless
//! Chromium, driven over the DevTools protocol on a pipe), the page shows a job's attempt change
//! and a lock's holder change within seconds, a job's waiting backup, problems first (a
//! schedule's stuck older occurrence too), times in UTC, no password anywhere, a live badge
//! that says "stale" while the server is paused and "live" again after, and a screenshot is
//! stored under `target/` for a person to look at; over plain HTTP, what it
//! refuses (a foreign `Host`, anything but `GET`, a non-loopback `--listen`) and a hung server
//! (the last good read stays, marked stale, `/healthz` says 503).
#![cfg(all(feature = "dashboard", feature = "testing"))]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine;
use baton::testing::RedisServer;
use common::process::{baton_command, code, describe, finish_by};
use common::{shq, TempDir};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;

const BATON: &str = env!("CARGO_BIN_EXE_baton");
const EX_USAGE: i32 = 64;

/// How long the page may take to show a change (it reads the server every 200 ms here): a
/// bound for a hung page, not a speed claim; the time it took is printed.
const SHOWN_WITHIN: Duration = Duration::from_secs(10);

/// Upper bound for a `baton` process that has nothing to wait for.
const QUICK: Duration = Duration::from_secs(15);

/// The password of the test's server: it must appear nowhere on the page.
const PASSWORD: &str = "dash-pw-7c41e9";

fn baton(url: &str, args: &[&str]) -> Child {
    let mut cmd = baton_command(BATON);
    // --url before the subcommand's arguments: after `--` it would be PROGRAM's.
    cmd.arg("--url").arg(url).args(args);
    cmd.spawn().expect("spawn baton")
}

async fn finished(url: &str, args: &[&str]) -> std::process::Output {
    finish_by(
        baton(url, args),
        tokio::time::Instant::now() + QUICK,
        args[0],
    )
    .await
}

/// Starts `baton dashboard` on a free loopback port; returns it and its address, read from the
/// line it prints at start.
async fn dashboard(url: &str, extra: &[&str]) -> (Child, String) {
    let mut args = vec![
        "dashboard",
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "200ms",
    ];
    args.extend_from_slice(extra);
    let mut child = baton(url, &args);
    let stderr = child.stderr.take().expect("piped stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let line = tokio::time::timeout(QUICK, lines.next_line())
        .await
        .expect("the dashboard's first line in time")
        .expect("read stderr")
        .expect("a first line");
    let addr = line
        .split("at http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    assert!(
        !line.contains(PASSWORD),
        "the start line shows the password: {line}"
    );
    (child, addr)
}

/// One HTTP/1.1 request with `Host: host`: status, headers (lower-case names) and body.
async fn request(addr: &str, method: &str, path: &str, host: &str) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("send");
    let mut reply = String::new();
    tokio::time::timeout(QUICK, s.read_to_string(&mut reply))
        .await
        .expect("a reply in time")
        .expect("read");
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// `/api/entries` as JSON (a chunked body is decoded by taking the JSON object out of it).
async fn entries(addr: &str) -> Value {
    let (status, _, body) = request(addr, "GET", "/api/entries", addr).await;
    assert_eq!(status, 200, "{body}");
    let start = body.find('{').expect("a JSON object");
    let end = body.rfind('}').expect("a JSON object");
    serde_json::from_str(&body[start..=end]).expect("JSON")
}

// ---------------------------------------------------------------------------------------------
// The browser: Chromium with --remote-debugging-pipe, the DevTools protocol as NUL-terminated
// JSON messages on file descriptors 3 (to it) and 4 (from it), as Playwright drives it. No
// WebSocket, no driver binary, no crate beyond serde_json.

struct Browser {
    child: std::process::Child,
    to: std::fs::File,
    replies: mpsc::Receiver<Value>,
    next_id: u64,
    session: String,
    _profile: TempDir,
}

fn chromium() -> PathBuf {
    let path = std::env::var_os("BATON_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.exists(),
        "{} is missing: install Debian's chromium (`bash .ci/test` does, through \
         .ci/ensure-chromium), or set BATON_CHROMIUM",
        path.display()
    );
    path
}

/// A pipe: (read end, write end), close-on-exec.
fn pipe() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, which the files then own.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(rc, 0, "pipe2: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just made and are owned by nothing else.
    unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    }
}

impl Browser {
    fn start() -> Browser {
        use std::os::fd::AsRawFd;
        use std::os::unix::process::CommandExt;
        let profile = TempDir::new("chromium");
        let (their_in, to) = pipe();
        let (from, their_out) = pipe();
        let (in_fd, out_fd) = (their_in.as_raw_fd(), their_out.as_raw_fd());
        let mut cmd = std::process::Command::new(chromium());
        cmd.args([
            "--headless",
            // The sandbox needs user namespaces a root test run does not have.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            // Nothing but the page: no calls home on a machine without a network.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--window-size=1280,760",
            "--remote-debugging-pipe",
        ])
        .arg(format!(
            "--user-data-dir={}",
            profile.path("profile").display()
        ))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: between fork and exec only dup2(2), which is async-signal-safe; the dup'ed
        // descriptors 3 and 4 do not carry close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::dup2(in_fd, 3) < 0 || libc::dup2(out_fd, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start chromium");
        drop((their_in, their_out));
        let (tx, replies) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(from);
            loop {
                let mut msg = Vec::new();
                match reader.read_until(0, &mut msg) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                msg.pop();
                let Ok(value) = serde_json::from_slice::<Value>(&msg) else {
                    continue;
                };
                // Replies only (they carry an id); events are not needed here.
                if value.get("id").is_some() && tx.send(value).is_err() {
                    return;
                }
            }
        });
        let mut browser = Browser {
            child,
            to,
            replies,
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = browser.call("Target.createTarget", json!({ "url": "about:blank" }));
        let target_id = target["targetId"]
            .as_str()
            .expect("a target id")
            .to_string();
        let attached = browser.call(
            "Target.attachToTarget",
            json!({ "targetId": target_id, "flatten": true }),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        browser
    }

    /// Sends one command (to the page's session once attached) and waits for its reply.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.try_call(method, params)
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// [`Browser::call`], its error reply returned instead of a panic (a page navigating away
    /// answers an evaluation with one).
    fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            msg["sessionId"] = Value::from(self.session.clone());
        }
        let mut bytes = serde_json::to_vec(&msg).expect("JSON");
        bytes.push(0);
        self.to.write_all(&bytes).expect("write to chromium");
        let deadline = Instant::now() + QUICK;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = self
                .replies
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("chromium did not answer {method} in time"));
            if reply["id"] != id {
                continue;
            }
            if let Some(e) = reply.get("error") {
                return Err(e.clone());
            }
            return Ok(reply["result"].clone());
        }
    }

    fn open(&mut self, url: &str) {
        self.call("Page.navigate", json!({ "url": url }));
    }

    /// The value of `expression` in the page.
    fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true }),
        );
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression}: {e}");
        }
        r["result"]["value"].clone()
    }

    /// The `data-*` attributes of the row of `kind` `name` as the page shows it (`null`: no such
    /// row).
    fn row(&mut self, kind: &str, name: &str) -> Value {
        self.eval(&format!(
            "(() => {{ const r = [...document.querySelectorAll('#rows tr')].find(r => \
             r.dataset.kind === {kind} && r.dataset.name === {name}); \
             return r ? {{ ...r.dataset, class: r.className }} : null; }})()",
            kind = json!(kind),
            name = json!(name)
        ))
    }

    /// Polls the row until `ok` accepts it; returns it and how long it took. Panics with the
    /// last one seen after [`SHOWN_WITHIN`].
    fn until_row(
        &mut self,
        kind: &str,
        name: &str,
        ok: impl Fn(&Value) -> bool,
    ) -> (Value, Duration) {
        let start = Instant::now();
        loop {
            let row = self.row(kind, name);
            if ok(&row) {
                return (row, start.elapsed());
            }
            assert!(
                start.elapsed() < SHOWN_WITHIN,
                "the page never showed the awaited {kind} {name}; last: {row}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A PNG of the page, as tall as its content.
    fn screenshot(&mut self, path: &Path) {
        let height = self
            .eval("Math.ceil(document.body.getBoundingClientRect().bottom) + 16")
            .as_u64()
            .unwrap_or(760)
            .clamp(200, 4000);
        let shot = self.call(
            "Page.captureScreenshot",
            json!({
                "format": "png",
                "captureBeyondViewport": true,
                "clip": { "x": 0, "y": 0, "width": 1280, "height": height, "scale": 1 },
            }),
        );
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().expect("base64 data"))
            .expect("base64");
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        std::fs::create_dir_all(path.parent().expect("a directory")).expect("mkdir");
        std::fs::write(path, png).expect("write the screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Closed through the protocol; killed if it does not go (it is ours, by PID).
        self.next_id += 1;
        let close = format!("{{\"id\":{},\"method\":\"Browser.close\"}}\0", self.next_id);
        let _ = self.to.write_all(close.as_bytes());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the screenshot goes: `target/dashboard.png` (or under `CARGO_TARGET_DIR`).
fn screenshot_path() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("dashboard.png")
}

/// A worker of job `send-message-42` (3 attempts) named `name`, running `program`.
fn sender(url: &str, name: &str, program: &[&str]) -> Child {
    let mut args = vec![
        "run",
        "--key",
        "send-message-42",
        "--max-attempts",
        "3",
        "--name",
        name,
        "--",
    ];
    args.extend_from_slice(program);
    baton(url, &args)
}

/// A shell command that waits for file `flag`, then exits with `status`.
fn until_flag(flag: &Path, status: i32) -> String {
    format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exit {status}",
        shq(flag)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_an_attempt_change_and_a_holder_change_live() {
    let server = RedisServer::builder()
        .requirepass(PASSWORD)
        .start()
        .expect("redis");
    let url = server.url_for("default", PASSWORD);
    assert!(
        url.contains(PASSWORD),
        "the test's URL carries the password"
    );
    let dir = TempDir::new("dashboard");
    let (fail_flag, release_flag) = (dir.path("fail"), dir.path("release"));

    // What an operator's fleet leaves: a job done, one exhausted, one between attempts (its
    // first failed, no backup yet), a schedule's occurrence done, a leader. Exit statuses: a
    // failed attempt exits with PROGRAM's own.
    for (args, status) in [
        ("run --key nightly-report --name worker-a -- true", 0),
        (
            "run --key flaky-export --max-attempts 1 --name worker-b -- false",
            1,
        ),
        (
            "run --key invoice-sync --max-attempts 3 --name worker-c -- false",
            1,
        ),
        ("run --key sweep --every 1h --early 0s -- true", 0),
        // A schedule whose older occurrence is stuck waiting, its later one done.
        (
            "run --key nightly@0123456789ab@2026-01-01T00:00:00Z --max-attempts 3 -- false",
            1,
        ),
        (
            "run --key nightly@0123456789ab@2026-01-02T00:00:00Z -- true",
            0,
        ),
    ] {
        let args: Vec<&str> = args.split(' ').collect();
        let out = finished(&url, &args).await;
        assert_eq!(code(&out), status, "{args:?}: {}", describe(&out));
    }
    let _leader = baton(
        &url,
        &[
            "leader",
            "--key",
            "scheduler",
            "--name",
            "node-1",
            "--",
            "sleep",
            "60",
        ],
    );

    let (_dash, addr) = dashboard(&url, &[]).await;

    // A job whose first attempt will fail, with a backup waiting to take it over; a lock with
    // a second process waiting for it.
    let fail_script = until_flag(&fail_flag, 1);
    let _alpha = sender(&url, "alpha", &["sh", "-c", &fail_script]);
    let release_script = until_flag(&release_flag, 0);
    let _first = baton(
        &url,
        &[
            "lock",
            "--key",
            "backups",
            "--",
            "sh",
            "-c",
            &release_script,
        ],
    );

    // A semaphore with one of its two permits held, a read-write lock with one reader.
    let _permit = baton(
        &url,
        &[
            "lock",
            "--key",
            "pool",
            "--permits",
            "2",
            "--",
            "sleep",
            "60",
        ],
    );
    let _reader = baton(
        &url,
        &["lock", "--key", "cfg", "--shared", "--", "sleep", "60"],
    );

    let mut browser = tokio::task::block_in_place(Browser::start);
    tokio::task::block_in_place(|| browser.open(&format!("http://{addr}/")));
    // Their rows: the holder column says how many hold (a semaphore's permits of its limit, a
    // read-write lock's mode); a permit's slot token is per slot, so the row shows none.
    tokio::task::block_in_place(|| {
        browser.until_row("semaphore", "pool", |r| {
            r["state"] == "held" && r["holder"] == "1/2"
        });
        browser.until_row("rwlock", "cfg", |r| {
            r["state"] == "held" && r["holder"] == "read ×1"
        });
    });
    let (job, _) = tokio::task::block_in_place(|| {
        browser.until_row("job", "send-message-42", |r| {
            r["attempt"] == "1" && r["holder"] == "alpha" && r["state"] == "running"
        })
    });
    let (lock, _) = tokio::task::block_in_place(|| {
        browser.until_row("lock", "backups", |r| r["state"] == "held")
    });
    let first_holder = lock["holder"].as_str().unwrap_or_default().to_string();
    let first_fence: u64 = lock["fence"]
        .as_str()
        .unwrap_or_default()
        .parse()
        .expect("a fence");
    assert!(!first_holder.is_empty(), "{lock}");
    assert_eq!(job["class"], "st-running", "{job}");

    // The backups start only now: they wait (the job's attempt is alpha's, the lock is held).
    let _beta = sender(&url, "beta", &["sleep", "60"]);
    let _second = baton(&url, &["lock", "--key", "backups", "--", "sleep", "60"]);
    // The backup is counted (it listens on the job's channel; the holder's own listening is
    // not a backup).
    let (job, took) = tokio::task::block_in_place(|| {
        browser.until_row("job", "send-message-42", |r| r["standbys"] == "1")
    });
    assert_eq!(job["holder"], "alpha", "{job}");
    println!(
        "the waiting backup shown {} ms after it started",
        took.as_millis()
    );

    // Attempt 1 fails; beta takes over as attempt 2: the page shows it.
    std::fs::write(&fail_flag, b"").expect("flag");
    let (job, took) = tokio::task::block_in_place(|| {
        browser.until_row("job", "send-message-42", |r| {
            r["attempt"] == "2" && r["holder"] == "beta" && r["state"] == "running"
        })
    });
    println!(
        "attempt 1 -> 2 shown {} ms after the failure",
        took.as_millis()
    );
    assert!(
        job["class"]
            .as_str()
            .unwrap_or_default()
            .contains("changed"),
        "{job}"
    );

    // The lock's holder lets go; the waiting process takes it with a higher fence.
    std::fs::write(&release_flag, b"").expect("flag");
    let (lock, took) = tokio::task::block_in_place(|| {
        browser.until_row("lock", "backups", |r| {
            r["state"] == "held"
                && r["holder"] != first_holder.as_str()
                && r["holder"] != ""
                && r["fence"]
                    .as_str()
                    .and_then(|f| f.parse::<u64>().ok())
                    .is_some_and(|f| f > first_fence)
        })
    });
    println!(
        "lock holder {first_holder} -> {} shown {} ms after the release",
        lock["holder"],
        took.as_millis()
    );

    // Problems first and marked; the leader and the finished job are there; no password.
    let first_row = tokio::task::block_in_place(|| {
        browser.eval("document.querySelector('#rows tr').dataset.name")
    });
    assert_eq!(
        first_row, "flaky-export",
        "the exhausted job leads the table"
    );
    let flaky = tokio::task::block_in_place(|| browser.row("job", "flaky-export"));
    assert!(
        flaky["class"]
            .as_str()
            .unwrap_or_default()
            .contains("problem"),
        "{flaky}"
    );
    let waiting = tokio::task::block_in_place(|| browser.row("job", "invoice-sync"));
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    assert!(
        waiting["class"]
            .as_str()
            .unwrap_or_default()
            .contains("problem"),
        "{waiting}"
    );
    let schedule = tokio::task::block_in_place(|| {
        browser.eval(
            "[...document.querySelectorAll('#rows tr')].filter(r => r.dataset.kind === \
             'schedule' && r.dataset.name.startsWith('sweep@')).map(r => r.dataset.state)",
        )
    });
    assert_eq!(
        schedule,
        json!(["done"]),
        "one row for the schedule, its occurrence done"
    );
    // The stuck older occurrence, not the latest done one, is the schedule's row: a problem;
    // its name's digest says why the expression is not shown.
    let nightly = tokio::task::block_in_place(|| browser.row("schedule", "nightly@0123456789ab"));
    assert_eq!(nightly["state"], "waiting", "{nightly}");
    assert!(
        nightly["class"]
            .as_str()
            .unwrap_or_default()
            .contains("problem"),
        "{nightly}"
    );
    let title = tokio::task::block_in_place(|| {
        browser.eval(
            "[...document.querySelectorAll('#rows tr')].find(r => r.dataset.name === \
             'nightly@0123456789ab').querySelector('td.name').title",
        )
    });
    assert!(
        title.as_str().unwrap_or_default().contains("digest"),
        "{title}"
    );
    // Instants in UTC, RFC 3339 to the millisecond.
    let header = tokio::task::block_in_place(|| {
        browser.eval("document.getElementById('server').textContent")
    });
    let header = header.as_str().unwrap_or_default();
    let read_at = header.split("last read ").nth(1).unwrap_or_default();
    assert!(
        read_at.len() == 24 && read_at.ends_with('Z') && read_at.as_bytes()[10] == b'T',
        "{header}"
    );
    let leader = tokio::task::block_in_place(|| browser.row("leader", "scheduler"));
    assert_eq!(leader["holder"], "node-1", "{leader}");
    let done = tokio::task::block_in_place(|| browser.row("job", "nightly-report"));
    assert_eq!(done["state"], "done", "{done}");
    let page = tokio::task::block_in_place(|| {
        browser.eval(
            "document.documentElement.outerHTML + document.getElementById('server').textContent",
        )
    });
    let page = page.as_str().unwrap_or_default();
    assert!(!page.contains(PASSWORD), "the page shows the password");
    assert!(
        page.contains("<redacted>") || page.contains("&lt;redacted&gt;"),
        "the server is shown redacted"
    );

    // The filter: by name prefix, the other rows go.
    tokio::task::block_in_place(|| {
        browser.eval(
            "(() => { const i = document.getElementById('prefix'); i.value = 'send-'; \
             i.dispatchEvent(new Event('input')); return true; })()",
        );
    });
    tokio::task::block_in_place(|| {
        browser.until_row("job", "nightly-report", |r| r.is_null());
    });
    let kept = tokio::task::block_in_place(|| browser.row("job", "send-message-42"));
    assert_eq!(kept["holder"], "beta", "{kept}");
    tokio::task::block_in_place(|| {
        browser.eval(
            "(() => { const i = document.getElementById('prefix'); i.value = ''; \
             i.dispatchEvent(new Event('input')); return true; })()",
        );
        browser.until_row("job", "nightly-report", |r| !r.is_null());
    });

    let path = screenshot_path();
    tokio::task::block_in_place(|| browser.screenshot(&path));
    println!("screenshot: {}", path.display());

    // An outage (the server paused, SIGSTOP): the badge says the data is stale, then live
    // again once the server answers.
    let badge = |browser: &mut Browser| {
        let v = browser.eval("document.getElementById('live').textContent");
        v.as_str().unwrap_or_default().to_string()
    };
    let until_badge = |browser: &mut Browser, want: &str| {
        let start = Instant::now();
        loop {
            let now = badge(browser);
            if now.starts_with(want) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < SHOWN_WITHIN,
                "the badge never said {want}: {now}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert_eq!(tokio::task::block_in_place(|| badge(&mut browser)), "live");
    server.pause().expect("pause redis");
    let took = tokio::task::block_in_place(|| until_badge(&mut browser, "stale"));
    println!("the outage shown {} ms after the pause", took.as_millis());
    let banner =
        tokio::task::block_in_place(|| browser.eval("document.getElementById('banner').hidden"));
    assert_eq!(banner, false, "the banner says so too");
    server.resume().expect("resume redis");
    let took = tokio::task::block_in_place(|| until_badge(&mut browser, "live"));
    println!("live again {} ms after the resume", took.as_millis());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_refuses_foreign_hosts_and_writes_and_says_when_its_server_hangs() {
    let server = RedisServer::builder()
        .requirepass(PASSWORD)
        .start()
        .expect("redis");
    let url = server.url_for("default", PASSWORD);
    let done = finished(&url, &["run", "--key", "report", "--", "true"]).await;
    assert_eq!(code(&done), 0, "{}", describe(&done));
    let (_dash, addr) = dashboard(&url, &[]).await;

    let (status, head, body) = request(&addr, "GET", "/", &addr).await;
    assert_eq!(status, 200);
    assert!(body.contains("<title>baton dashboard</title>"));
    assert!(
        head.contains("content-security-policy: default-src 'none'; script-src 'self'"),
        "{head}"
    );
    assert!(head.contains("x-frame-options: deny"), "{head}");
    let port = addr.rsplit(':').next().unwrap();
    let (status, _, _) = request(&addr, "GET", "/", &format!("localhost:{port}")).await;
    assert_eq!(status, 200, "localhost is a loopback name");
    // A DNS-rebinding page would reach the port with its own host name.
    let (status, _, _) = request(
        &addr,
        "GET",
        "/api/entries",
        &format!("evil.example:{port}"),
    )
    .await;
    assert_eq!(status, 403);
    for method in ["POST", "PUT", "DELETE"] {
        let (status, _, _) = request(&addr, method, "/api/entries", &addr).await;
        assert_eq!(status, 405, "{method} on a read-only page");
    }

    // The listing, with the server's password nowhere.
    let until = Instant::now() + SHOWN_WITHIN;
    let view = loop {
        let v = entries(&addr).await;
        if v["total"] == 1 {
            break v;
        }
        assert!(Instant::now() < until, "never listed: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(view["rows"][0]["name"], "report");
    assert!(!view.to_string().contains(PASSWORD), "{view}");
    assert_eq!(request(&addr, "GET", "/healthz", &addr).await.0, 200);

    // A server that hangs rather than dies: the last good read stays, marked stale.
    server.pause().expect("pause redis");
    let until = Instant::now() + Duration::from_secs(30);
    let stale = loop {
        let v = entries(&addr).await;
        if !v["error"].is_null() {
            break v;
        }
        assert!(Instant::now() < until, "a hung server never shown: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        stale["rows"][0]["name"], "report",
        "the last good read stays: {stale}"
    );
    assert!(stale["failing_since_ms"].as_u64().is_some(), "{stale}");
    assert_eq!(request(&addr, "GET", "/healthz", &addr).await.0, 503);
    server.resume().expect("resume redis");
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let v = entries(&addr).await;
        if v["error"].is_null() {
            break;
        }
        assert!(Instant::now() < until, "never recovered: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(request(&addr, "GET", "/healthz", &addr).await.0, 200);
}

#[tokio::test]
async fn a_non_loopback_address_or_a_bad_interval_is_a_usage_error() {
    // Refused before connecting: nothing listens at this URL.
    let url = "redis://127.0.0.1:1/";
    let out = finished(url, &["dashboard", "--listen", "0.0.0.0:0"]).await;
    assert_eq!(code(&out), EX_USAGE, "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a loopback address") && err.contains("--allow-remote"),
        "{err}"
    );
    for interval in ["10ms", "2h"] {
        let out = finished(url, &["dashboard", "--interval", interval]).await;
        assert_eq!(code(&out), EX_USAGE, "{}", describe(&out));
    }
}

/// A schedule's row shows its expression from its record; a schedule with only its record
/// left (no occurrence in the store, as when every one expired) keeps a row, state
/// `recorded`; `/api/history` gives a schedule's record and history (the page's expanded row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_rows_show_the_expression_and_history_and_a_record_alone_keeps_its_row() {
    let server = RedisServer::start().expect("redis");
    let url = server.url();
    let out = finished(
        &url,
        &[
            "run", "--key", "nightly", "--every", "1h", "--name", "host-a", "--", "true",
        ],
    )
    .await;
    assert_eq!(code(&out), 0, "{}", describe(&out));
    // "gone": a record and no occurrence key, as after its occurrences expired.
    let client = baton::Client::connect(&url).await.unwrap();
    let failover = client.failover();
    let daily = baton::Schedule::cron_in("0 2 * * *", "UTC").unwrap();
    let now = failover.server_time("gone").await.unwrap();
    let tick = daily.latest_at_or_before(now).unwrap();
    failover
        .record_occurrence(
            &daily,
            &baton::RecordOptions::default(),
            "gone",
            tick,
            baton::RecordChange::Outcome {
                outcome: baton::RecordedOutcome::Done,
                note: None,
            },
        )
        .await
        .unwrap();
    let hourly = baton::Schedule::every(Duration::from_secs(3600))
        .unwrap()
        .to_string();

    let (mut dash, addr) = dashboard(&url, &[]).await;
    let until = Instant::now() + SHOWN_WITHIN;
    let (nightly, gone) = loop {
        let view = entries(&addr).await;
        let rows = view["rows"].as_array().cloned().unwrap_or_default();
        let row = |key: &str| {
            rows.iter()
                .find(|r| r["kind"] == "schedule" && r["schedule"] == key)
                .cloned()
        };
        if let (Some(n), Some(g)) = (row("nightly"), row("gone")) {
            if !n["expression"].is_null() {
                break (n, g);
            }
        }
        assert!(Instant::now() < until, "schedule rows not shown: {view}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(nightly["expression"], json!(hourly), "{nightly}");
    assert_eq!(nightly["state"], "done", "{nightly}");
    assert_eq!(gone["state"], "recorded", "{gone}");
    assert_eq!(gone["expression"], json!(daily.to_string()), "{gone}");
    assert_eq!(gone["digest"], json!(daily.digest()), "{gone}");

    let (status, _, body) = request(&addr, "GET", "/api/history?schedule=nightly", &addr).await;
    assert_eq!(status, 200, "{body}");
    let start = body.find('[').expect("a JSON array");
    let end = body.rfind(']').expect("a JSON array");
    let history: Value = serde_json::from_str(&body[start..=end]).expect("JSON");
    let digests = history.as_array().unwrap();
    assert_eq!(digests.len(), 1, "{history}");
    assert_eq!(
        digests[0]["record"]["spec"]["text"],
        json!(hourly),
        "{history}"
    );
    let occurrences = digests[0]["history"].as_array().unwrap();
    assert_eq!(occurrences.len(), 1, "{history}");
    assert_eq!(occurrences[0]["outcome"], "done", "{history}");
    assert_eq!(occurrences[0]["attempts"][0]["host"], "host-a", "{history}");
    assert_eq!(
        occurrences[0]["attempts"][0]["exit"],
        json!({ "status": 0 }),
        "{history}"
    );
    assert_eq!(digests[0]["check"]["status"], "ok", "{history}");
    assert!(digests[0]["next_tick"].is_string(), "{history}");

    // In the browser: the row's history link opens the schedule's page, which shows its
    // check, its hosts and its history.
    let mut browser = tokio::task::block_in_place(Browser::start);
    tokio::task::block_in_place(|| {
        browser.open(&format!("http://{addr}/"));
        browser.until_row("schedule", nightly["name"].as_str().unwrap(), |r| {
            !r.is_null()
        });
        let clicked = browser.eval(
            "(() => { const r = [...document.querySelectorAll('#rows tr')].find(r => \
             r.dataset.kind === 'schedule' && r.dataset.name.startsWith('nightly')); \
             const a = r && r.querySelector('a.toggle'); if (a) a.click(); return !!a; })()",
        );
        assert_eq!(
            clicked,
            json!(true),
            "the schedule's row has a history link"
        );
        let until = Instant::now() + SHOWN_WITHIN;
        let page = loop {
            // The link navigates: an evaluation that meets the navigation is tried again.
            let page = browser.try_call(
                "Runtime.evaluate",
                json!({ "returnByValue": true, "expression":
                "(() => { const row = document.querySelector('table.history tr[data-outcome]'); \
                 const check = document.querySelector('p.check'); \
                 return { path: location.pathname, search: location.search, \
                 key: document.getElementById('key').textContent, \
                 check: check ? check.dataset.status : null, \
                 expression: (document.querySelector('section.schedule h2') || {}).textContent, \
                 row: row ? { ...row.dataset } : null, \
                 facts: document.querySelector('section.schedule dl')?.textContent }; })()"
                }),
            );
            let page = page.map_or(Value::Null, |r| r["result"]["value"].clone());
            if !page.is_null() && !page["row"].is_null() {
                break page;
            }
            assert!(
                Instant::now() < until,
                "the schedule's page never showed: {page}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(page["path"], "/schedule", "{page}");
        assert_eq!(page["search"], "?key=nightly", "{page}");
        assert_eq!(page["key"], "nightly", "{page}");
        assert_eq!(page["check"], "ok", "{page}");
        assert_eq!(page["expression"], json!(hourly), "{page}");
        assert_eq!(page["row"]["outcome"], "done", "{page}");
        assert_eq!(page["row"]["host"], "host-a", "{page}");
        let facts = page["facts"].as_str().unwrap_or_default();
        assert!(facts.contains("host-a"), "hosts seen: {page}");
        assert!(facts.contains("Next tick"), "{page}");
        browser.screenshot(&screenshot_path().with_file_name("dashboard-schedule.png"));
    });
    dash.kill().await.ok();
}
