//! The fenced resource server: `W key token holder op` → `OK` or `STALE highest`.
//!
//! It keeps `highest[key]` and appends every request with its reply to `resource.jsonl`. With
//! `fenced = false` (negative control) it accepts every write, and logs whether the write would
//! have been stale.
//!
//! Ops are writes (`BEGIN-n`, `COMMIT-n`) or, for the read-write lock's readers, reads
//! (`RB-n`, `RE-n`: a read's begin and end). A read carries the read token (the last write's
//! token), so a read is stale when a higher token was accepted (a writer came in after the
//! reader's share ended); a write is also stale when a read with its own token was accepted:
//! readers get a write's token only once that write's hold ended. A semaphore's slots are keys of
//! their own (`s-0:1`): tokens are ordered per slot. Reads log the version they see, the token
//! of the last accepted COMMIT.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

use crate::util::{mono_ns, Jsonl};

#[derive(Default)]
struct State {
    highest: HashMap<String, u64>,
    /// Accepted BEGINs not followed by the same holder's accepted COMMIT: key → (holder, t,
    /// token).
    open: HashMap<String, (String, u64, u64)>,
    /// When the last write was accepted (monotonic ns).
    last_accepted: u64,
    /// The same per key.
    accepted_at: HashMap<String, u64>,
    /// The highest token a read was accepted with, per key: a write with that token is stale.
    read_top: HashMap<String, u64>,
    /// The token of the last accepted COMMIT per key: what a read sees.
    version: HashMap<String, u64>,
    /// Accepted read begins without their end: (key, holder) → (t, token).
    open_reads: HashMap<(String, String), (u64, u64)>,
}

/// Whether `op` is a read (`RB-n`, `RE-n`) rather than a write.
pub fn is_read(op: &str) -> bool {
    op.starts_with("RB-") || op.starts_with("RE-")
}

pub struct Resource {
    fenced: bool,
    state: Mutex<State>,
    log: Jsonl,
    pub port: u16,
}

impl Resource {
    pub async fn start(fenced: bool, log: Jsonl) -> std::io::Result<Arc<Resource>> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let res = Arc::new(Resource {
            fenced,
            state: Mutex::new(State::default()),
            log,
            port,
        });
        let r = res.clone();
        tokio::spawn(async move {
            loop {
                if let Ok((sock, _)) = listener.accept().await {
                    tokio::spawn(serve(sock, r.clone()));
                }
            }
        });
        Ok(res)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holders (`w2.1`) with a BEGIN (or a read's begin) accepted in the last `within_ms` and
    /// no COMMIT (or end) yet.
    pub fn current_holders(&self, within_ms: u64) -> Vec<String> {
        let now = mono_ns();
        let s = self.state();
        let recent = |t: u64| now.saturating_sub(t) < within_ms * 1_000_000;
        s.open
            .values()
            .filter(|(_, t, _)| recent(*t))
            .map(|(h, _, _)| h.clone())
            .chain(
                s.open_reads
                    .iter()
                    .filter(|(_, (t, _))| recent(*t))
                    .map(|((_, h), _)| h.clone()),
            )
            .collect()
    }

    /// The key and token of `holder`'s open BEGIN (`w2.1`), or else of its open read, if any.
    pub fn open_of(&self, holder: &str) -> Option<(String, u64)> {
        let s = self.state();
        s.open
            .iter()
            .find(|(_, (h, _, _))| h == holder)
            .map(|(k, (_, _, tok))| (k.clone(), *tok))
            .or_else(|| {
                s.open_reads
                    .iter()
                    .find(|((_, h), _)| h == holder)
                    .map(|((k, _), (_, tok))| (k.clone(), *tok))
            })
    }

    /// The highest token accepted on `key` (0: none yet).
    pub fn highest(&self, key: &str) -> u64 {
        self.state().highest.get(key).copied().unwrap_or(0)
    }

    /// Monotonic ns of the last accepted write (0: none yet).
    pub fn last_accepted(&self) -> u64 {
        self.state().last_accepted
    }

    /// Monotonic ns of the last accepted write on `key` (0: none yet).
    pub fn last_accepted_on(&self, key: &str) -> u64 {
        self.state().accepted_at.get(key).copied().unwrap_or(0)
    }

    /// Decides one write and logs it under the state lock, so the log order is the decision
    /// order.
    fn write(&self, key: &str, token: u64, holder: &str, op: &str) -> String {
        let mut s = self.state();
        let highest = s.highest.get(key).copied().unwrap_or(0);
        let read = is_read(op);
        let read_top = s.read_top.get(key).copied().unwrap_or(0);
        let stale = token < highest || (!read && token > 0 && token == read_top);
        let accepted = !stale || !self.fenced;
        let version = s.version.get(key).copied().unwrap_or(0);
        let reply = if accepted {
            s.highest.insert(key.to_string(), highest.max(token));
            let now = mono_ns();
            s.last_accepted = now;
            s.accepted_at.insert(key.to_string(), now);
            if read {
                s.read_top.insert(key.to_string(), read_top.max(token));
                let k = (key.to_string(), holder.to_string());
                if op.starts_with("RB-") {
                    s.open_reads.insert(k, (now, token));
                } else {
                    s.open_reads.remove(&k);
                }
            } else if op.starts_with("BEGIN") {
                s.open
                    .insert(key.to_string(), (holder.to_string(), mono_ns(), token));
            } else if s.open.get(key).is_some_and(|(h, _, _)| h == holder) {
                s.open.remove(key);
            }
            if op.starts_with("COMMIT") {
                s.version.insert(key.to_string(), token);
            }
            "OK".to_string()
        } else {
            format!("STALE {highest}")
        };
        self.log.write(
            json!({"p":"resource","type": if accepted {"ok"} else {"fail"},
            "f":"write","key":key,"token":token,"holder":holder,"op":op,"reply":reply,
            "accepted":accepted,"stale":stale,"highest":highest,"version":version}),
        );
        reply
    }
}

async fn serve(sock: TcpStream, res: Arc<Resource>) {
    let (r, mut w) = sock.into_split();
    let mut lines = BufReader::new(r).lines();
    loop {
        let line = match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
            Ok(Ok(Some(l))) => l,
            _ => return,
        };
        let parts: Vec<&str> = line.split_whitespace().collect();
        let reply = match parts.as_slice() {
            ["W", key, token, holder, op] => match token.parse::<u64>() {
                Ok(token) => res.write(key, token, holder, op),
                Err(_) => "ERR bad token".to_string(),
            },
            _ => "ERR bad request".to_string(),
        };
        if w.write_all(format!("{reply}\n").as_bytes()).await.is_err() {
            return;
        }
    }
}
