//! The listing on Redis: `SCAN` on every primary, each batch's values read in one pipeline on
//! the node that returned its keys.

use std::sync::Arc;

use redis::Value;

use super::{At, Entry, Kind, Listing, Parsed, Part};
use crate::backend::redis::{Node, Transport};
use crate::error::Error;
use crate::failover::admin::{status_from_replies, status_reads, STATUS_READS};
use crate::failover::keys::JobKeys;

/// The keys a lock-shaped entry is read from: its holder, its fence, and what counts its
/// waiters (a fair lock's queue, a queue's items).
struct LockKeys {
    own: String,
    fence: String,
    waiting: Option<(&'static str, String)>,
}

fn lock_keys(prefix: &str, kind: Kind, name: &str) -> LockKeys {
    match kind {
        Kind::Fair => {
            let k = crate::fair::keys::fair_keys(prefix, name);
            LockKeys {
                own: k.lock,
                fence: k.fence,
                waiting: Some(("ZCARD", k.queue)),
            }
        }
        Kind::Queue => {
            let k = crate::queue::keys::QueueKeys::new(prefix, name);
            LockKeys {
                own: k.lock,
                fence: k.fence,
                waiting: Some(("XLEN", k.items)),
            }
        }
        Kind::Leader => {
            let k = crate::leader::keys::ElectionKeys::new(prefix, name);
            LockKeys {
                own: k.lease,
                fence: k.fence,
                waiting: None,
            }
        }
        // A job never gets here; the mutex's layout is the default.
        Kind::Lock | Kind::Job => {
            let k = crate::mutex::keys::LockKeys::new(prefix, name);
            LockKeys {
                own: k.lock().to_string(),
                fence: k.fence().to_string(),
                waiting: None,
            }
        }
    }
}

/// Appends the reads of a lock-shaped entry; returns how many replies they add.
fn lock_reads(p: &mut redis::Pipeline, keys: &LockKeys) -> usize {
    p.cmd("GET")
        .arg(&keys.own)
        .cmd("GET")
        .arg(&keys.fence)
        .cmd("PTTL")
        .arg(&keys.own);
    match &keys.waiting {
        Some((cmd, key)) => {
            p.cmd(cmd).arg(key);
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

/// A lock-shaped entry from its replies (see [`lock_reads`]); `None` when nothing is stored.
fn lock_entry(kind: Kind, name: &str, replies: &[Value]) -> Option<Entry> {
    if let Some(Value::ServerError(e)) = replies.iter().find(|v| matches!(v, Value::ServerError(_)))
    {
        let mut entry = Entry::lock(kind, name);
        entry.state = super::EntryState::Corrupt;
        entry.detail = Some(format!("{e:?}"));
        return Some(entry);
    }
    let value = replies.first().and_then(text);
    let fence = replies.get(1).and_then(text);
    if value.is_none() && fence.is_none() {
        return None;
    }
    let pttl = match replies.get(2) {
        Some(Value::Int(n)) if *n >= 0 => Some(std::time::Duration::from_millis(*n as u64)),
        _ => None,
    };
    let mut entry = Entry::of_lock(kind, name, value.as_deref(), fence.as_deref(), pttl);
    if let Some(Value::Int(n)) = replies.get(3) {
        entry.waiting = u64::try_from(*n).ok();
    }
    Some(entry)
}

/// What one entry of a batch reads.
enum Read<'a> {
    Job(&'a str),
    Lock(Parsed<'a>),
}

/// Reads the entries that `keys` (a batch from one node) stand for, in one pipeline on `node`.
async fn read_batch(
    node: &Arc<Node>,
    prefix: &str,
    kind: Option<Kind>,
    keys: &[String],
) -> Result<Vec<Entry>, Error> {
    let mut p = redis::pipe();
    p.ignore_errors();
    let mut reads: Vec<(Read<'_>, usize)> = Vec::new();
    for key in keys {
        let Some(parsed) = super::parse_key(prefix, key) else {
            continue;
        };
        if kind.is_some_and(|k| k != parsed.kind) || parsed.part == Part::Beside {
            continue;
        }
        if parsed.kind == Kind::Job {
            status_reads(&mut p, &JobKeys::new(prefix, parsed.name));
            reads.push((Read::Job(parsed.name), STATUS_READS));
        } else {
            let n = lock_reads(&mut p, &lock_keys(prefix, parsed.kind, parsed.name));
            reads.push((Read::Lock(parsed), n));
        }
    }
    if reads.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = node.conn();
    let values: Vec<Value> = p.query_async(&mut conn).await?;
    let mut out = Vec::with_capacity(reads.len());
    let mut at = 0;
    for (read, n) in reads {
        let replies = values
            .get(at..at + n)
            .ok_or_else(|| Error::UnexpectedReply {
                context: "listing entries",
                reply: format!("{} replies for more reads", values.len()),
            })?;
        at += n;
        match read {
            Read::Job(name) => {
                let entry = match status_from_replies(name.to_string(), replies) {
                    Ok(status) => Entry::of_job(name, status),
                    Err(e) => {
                        let mut entry = Entry::lock(Kind::Job, name);
                        entry.state = super::EntryState::Corrupt;
                        entry.detail = Some(e.to_string());
                        Some(entry)
                    }
                };
                out.extend(entry);
            }
            Read::Lock(parsed) => {
                let fence_read = !matches!(replies.get(1), Some(Value::Nil) | None);
                if parsed.stands_for_entry(fence_read) {
                    out.extend(lock_entry(parsed.kind, parsed.name, replies));
                }
            }
        }
    }
    Ok(out)
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

/// The next batch of `listing` on Redis: one `SCAN` call on the current primary and the reads
/// of what it returned (`Some(empty)` when that call found nothing of baton's).
pub(super) async fn next_batch(
    t: &Transport,
    listing: &mut Listing,
) -> Result<Option<Vec<Entry>>, Error> {
    if let At::Start = listing.at {
        listing.at = At::Scan {
            nodes: t.router.primaries().await?,
            node: 0,
            cursor: 0,
        };
    }
    let At::Scan {
        nodes,
        node,
        cursor,
    } = &mut listing.at
    else {
        return Ok(None);
    };
    let Some(n) = nodes.get(*node).cloned() else {
        listing.at = At::Done;
        return Ok(None);
    };
    let inspector = &listing.inspector;
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(*cursor)
        .arg("MATCH")
        .arg(match_pattern(&inspector.prefix))
        .arg("COUNT")
        .arg(inspector.batch);
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
    let entries = read_batch(&n, &inspector.prefix, listing.kind, &keys).await?;
    // Moved on only once the batch was read: an error asks for the same batch again.
    if next == 0 {
        *node += 1;
        *cursor = 0;
    } else {
        *cursor = next;
    }
    Ok(Some(entries))
}

/// What `name` is, of every kind: every key of one name shares its hash tag, so one pipeline
/// on one node reads them all.
pub(super) async fn find(t: &Transport, prefix: &str, name: &str) -> Result<Vec<Entry>, Error> {
    let job = JobKeys::new(prefix, name);
    let node = t.node(job.state()).await?;
    let mut p = redis::pipe();
    p.ignore_errors();
    status_reads(&mut p, &job);
    let mut reads = vec![(Kind::Job, STATUS_READS)];
    for kind in [Kind::Lock, Kind::Leader, Kind::Fair, Kind::Queue] {
        let n = lock_reads(&mut p, &lock_keys(prefix, kind, name));
        reads.push((kind, n));
    }
    let values: Vec<Value> =
        tokio::time::timeout(t.settings.response_timeout, p.query_async(&mut node.conn()))
            .await
            .map_err(|_| Error::Timeout {
                during: "reading a key",
            })??;
    let mut out = Vec::new();
    let mut at = 0;
    for (kind, n) in reads {
        let replies = values
            .get(at..at + n)
            .ok_or_else(|| Error::UnexpectedReply {
                context: "reading a key",
                reply: format!("{} replies for more reads", values.len()),
            })?;
        at += n;
        if kind == Kind::Job {
            out.extend(Entry::of_job(
                name,
                status_from_replies(name.to_string(), replies)?,
            ));
        } else {
            out.extend(lock_entry(kind, name, replies));
        }
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
