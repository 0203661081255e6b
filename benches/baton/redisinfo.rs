//! What the server says it did: `INFO commandstats`, `INFO stats` and a `MONITOR` capture.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Calls per command (lower case), from `INFO commandstats`.
pub type CommandStats = BTreeMap<String, u64>;

pub async fn info(conn: &mut redis::aio::MultiplexedConnection, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO")
}

pub async fn commandstats(conn: &mut redis::aio::MultiplexedConnection) -> CommandStats {
    let text = info(conn, "commandstats").await;
    let mut out = CommandStats::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let calls = fields
            .split(',')
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        out.insert(name.to_string(), calls);
    }
    out
}

/// `after - before` per command, without the zeros.
pub fn delta(before: &CommandStats, after: &CommandStats) -> CommandStats {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// A field of `INFO stats` (`total_reads_processed`, ...).
pub async fn stat(conn: &mut redis::aio::MultiplexedConnection, field: &str) -> u64 {
    let text = info(conn, "stats").await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO stats has no {field}"))
}

/// A numeric field of an `INFO` section (`used_cpu_user` in `cpu`, ...); 0 when absent.
pub async fn field(conn: &mut redis::aio::MultiplexedConnection, section: &str, name: &str) -> f64 {
    let text = info(conn, section).await;
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

pub async fn server_version(conn: &mut redis::aio::MultiplexedConnection) -> String {
    let text = info(conn, "server").await;
    text.lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?")
        .trim()
        .to_string()
}

/// One command seen by `MONITOR`.
#[derive(Debug, Clone)]
pub struct Seen {
    /// When the server ran it (its clock, s since the epoch, µs resolution).
    pub at: f64,
    /// The client's address.
    pub addr: String,
    /// The command name, upper case.
    pub cmd: String,
}

/// A `MONITOR` connection read by a thread until [`Monitor::stop`].
pub struct Monitor {
    lines: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Monitor {
    pub fn start(port: u16) -> std::io::Result<Monitor> {
        let mut s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_read_timeout(Some(Duration::from_millis(50)))?;
        s.write_all(b"MONITOR\r\n")?;
        let mut reader = BufReader::new(s);
        let mut first = String::new();
        // "+OK"
        for _ in 0..100 {
            match reader.read_line(&mut first) {
                Ok(_) if first.ends_with('\n') => break,
                _ => {}
            }
        }
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, st) = (lines.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut buf = String::new();
            while !st.load(Ordering::Relaxed) {
                match reader.read_line(&mut buf) {
                    Ok(0) => break,
                    Ok(_) if buf.ends_with('\n') => {
                        if let Some(seen) = parse(buf.trim_end()) {
                            l.lock().unwrap().push(seen);
                        }
                        buf.clear();
                    }
                    // A timeout (partial line kept in `buf`) or a partial read.
                    _ => {}
                }
            }
        });
        Ok(Monitor {
            lines,
            stop,
            thread: Some(thread),
        })
    }

    /// Everything seen so far (and forgets it).
    pub fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.lines.lock().unwrap())
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn parse(line: &str) -> Option<Seen> {
    // +1700000000.123456 [0 127.0.0.1:54321] "WATCH" "a"
    let line = line.strip_prefix('+').unwrap_or(line);
    let (time, rest) = line.split_once(' ')?;
    let rest = rest.strip_prefix('[')?;
    let (inside, rest) = rest.split_once(']')?;
    let addr = inside.split_once(' ')?.1.to_string();
    let cmd = rest.trim_start().strip_prefix('"')?.split('"').next()?;
    Some(Seen {
        at: time.parse().unwrap_or(0.0),
        addr,
        cmd: cmd.to_ascii_uppercase(),
    })
}
