//! The inspection seam on Redis: `SCAN` on every primary (one server, each primary of a
//! cluster, the followed primary of a Sentinel set), and the reads of lock-shaped entries in
//! one pipeline on the node that holds their keys.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use super::jobs::{status_from_replies, status_reads, STATUS_READS};
use super::{Node, Transport};
use crate::error::Error;
use crate::util::inspect::{EntryRead, EntryRecord, LockRead, LockRecord, Waiting};

/// Where a listing is on Redis: the primaries, the one being scanned and its cursor.
#[derive(Clone)]
pub(crate) struct Scan {
    nodes: Vec<Arc<Node>>,
    node: usize,
    cursor: u64,
}

/// `prefix` as a `SCAN MATCH` pattern: its glob characters escaped, then `*`.
fn match_pattern(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 2);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('*');
    out
}

/// One `SCAN` call on the current primary (from the start: `at` is `None`): the keys it
/// returned, the node that returned them, and where the listing goes on (`None`: every
/// primary was read through); `None` when there is no primary left.
#[allow(clippy::type_complexity)]
pub(crate) async fn list_step(
    t: &Transport,
    at: Option<&Scan>,
    prefix: &str,
    batch: usize,
) -> Result<Option<(Vec<String>, Arc<Node>, Option<Scan>)>, Error> {
    let (nodes, node, cursor) = match at {
        Some(s) => (s.nodes.clone(), s.node, s.cursor),
        None => (t.router.primaries().await?, 0, 0),
    };
    let Some(n) = nodes.get(node).cloned() else {
        return Ok(None);
    };
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(match_pattern(prefix))
        .arg("COUNT")
        .arg(batch);
    let mut conn = n.conn();
    let scan = cmd.query_async::<(u64, Vec<Vec<u8>>)>(&mut conn);
    let (next, raw) = tokio::time::timeout(t.settings.response_timeout, scan)
        .await
        .map_err(|_| Error::Timeout {
            during: "listing keys",
        })??;
    // Keys that are not UTF-8 are none of baton's (its names are strings).
    let keys: Vec<String> = raw
        .into_iter()
        .filter_map(|k| String::from_utf8(k).ok())
        .collect();
    let after = if next == 0 {
        (node + 1 < nodes.len()).then_some(Scan {
            nodes,
            node: node + 1,
            cursor: 0,
        })
    } else {
        Some(Scan {
            nodes,
            node,
            cursor: next,
        })
    };
    Ok(Some((keys, n, after)))
}

/// Appends the reads of a lock-shaped entry; returns how many replies they add.
fn lock_reads(p: &mut redis::Pipeline, read: &LockRead) -> usize {
    p.cmd("GET")
        .arg(&read.own)
        .cmd("GET")
        .arg(&read.fence)
        .cmd("PTTL")
        .arg(&read.own);
    match &read.waiting {
        Some(Waiting::Members(key)) => {
            p.cmd("ZCARD").arg(key);
            4
        }
        Some(Waiting::Entries(key)) => {
            p.cmd("XLEN").arg(key);
            4
        }
        None => 3,
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// A lock-shaped entry's record from its replies (see [`lock_reads`]).
fn lock_record(replies: &[Value]) -> LockRecord {
    LockRecord {
        value: replies.first().and_then(text),
        fence: replies.get(1).and_then(text),
        fence_stored: !matches!(replies.get(1), Some(Value::Nil) | None),
        pttl: match replies.get(2) {
            Some(Value::Int(n)) if *n >= 0 => Some(Duration::from_millis(*n as u64)),
            _ => None,
        },
        waiting: match replies.get(3) {
            Some(Value::Int(n)) => u64::try_from(*n).ok(),
            _ => None,
        },
        refused: replies.iter().find_map(|v| match v {
            Value::ServerError(e) => Some(format!("{e:?}")),
            _ => None,
        }),
    }
}

/// Reads `reads` in one pipeline, at `at` or on the node of the first read's keys.
pub(crate) async fn read_entries(
    t: &Transport,
    at: Option<&Arc<Node>>,
    reads: &[EntryRead],
) -> Result<Vec<EntryRecord>, Error> {
    let Some(first) = reads.first() else {
        return Ok(Vec::new());
    };
    let node: Arc<Node> = match at {
        Some(at) => at.clone(),
        None => match first {
            EntryRead::Job(keys, _) => t.node(keys.state()).await?,
            EntryRead::Lock(read) => t.node(&read.own).await?,
        },
    };
    let mut p = redis::pipe();
    p.ignore_errors();
    let counts: Vec<usize> = reads
        .iter()
        .map(|r| match r {
            EntryRead::Job(keys, _) => {
                status_reads(&mut p, keys);
                STATUS_READS
            }
            EntryRead::Lock(read) => lock_reads(&mut p, read),
        })
        .collect();
    let values: Vec<Value> =
        tokio::time::timeout(t.settings.response_timeout, p.query_async(&mut node.conn()))
            .await
            .map_err(|_| Error::Timeout {
                during: "reading keys",
            })??;
    let mut out = Vec::with_capacity(reads.len());
    let mut from = 0;
    for (read, n) in reads.iter().zip(counts) {
        let replies = values
            .get(from..from + n)
            .ok_or_else(|| Error::UnexpectedReply {
                context: "reading keys",
                reply: format!("{} replies for more reads", values.len()),
            })?;
        from += n;
        out.push(match read {
            EntryRead::Job(_, name) => EntryRecord::Job(status_from_replies(name.clone(), replies)),
            EntryRead::Lock(_) => EntryRecord::Lock(lock_record(replies)),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefixes_are_matched_literally() {
        assert_eq!(super::match_pattern("baton:"), "baton:*");
        assert_eq!(super::match_pattern("a*b?[c]\\:"), "a\\*b\\?\\[c\\]\\\\:*");
    }
}
