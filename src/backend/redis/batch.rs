//! Group commit of lock scripts: when many tasks of one client acquire or release locks on one
//! Redis node at once, one script call ([`BATCH_SCRIPT`](super::locks::BATCH_SCRIPT)) serves
//! them all, so the fixed cost of an `EVALSHA` on the server and the client's per-request work
//! are paid once per batch instead of once per lock.
//!
//! No timer, no Nagle delay: a node's [`Lane`] has at most [`MAX_IN_FLIGHT`] lock-script calls
//! in flight. A caller that finds a free place takes it and sends its own script alone, exactly
//! as without batching (an uncontended lock pays one mutex lock for this). Callers that arrive
//! while every place is taken queue; when a call in flight returns, whoever held its place
//! hands it on: the queue (up to [`MAX_BATCH`] operations) leaves as one script call from a
//! task of its own, and so on until the queue is empty. Under load each call carries many.
//!
//! Every guarantee of a lone call holds per operation:
//! - each acquisition in a batch runs the lone script's own text on its own keys (a local
//!   function), so it gets its own fence step; each release compares its own token;
//! - the grant's lease deadline counts from when the batch was sent (after the caller asked);
//! - a caller dropped while queued is taken out of the queue: nothing was sent, nothing is
//!   released ([`Disarm`]); one dropped (or out of time) after its batch was taken from the
//!   queue is released by token by the batch's own task once the batch's reply (or timeout) is
//!   in: after the batch reached the connection, so the release cannot overtake it;
//! - a batch whose reply is lost gives every member the error a lone call gets (a timeout, a
//!   broken connection: indeterminate, so each acquisition is released by token);
//! - one operation's failing command (`WRONGTYPE` on its key) fails that operation only.
//!
//! Where it applies: a client of one server or of a Sentinel-followed primary (the node a
//! batch goes to is the one its keys live on). On a Redis Cluster each lock's `{key}` is a
//! slot of its own and one script cannot span slots, so every call goes alone there; acquiring
//! with `replica_ack` (a dedicated connection with `WAIT`) and PostgreSQL go alone too.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use super::locks::{self as lock, BATCH_SCRIPT};
use super::Transport;
use super::{unexpected, Node};
use crate::error::Error;
use crate::util::drop_guard::Disarm;
use crate::util::lock_replies::{fence_ttl, Acquire, BatchKeys, Grant};
use crate::util::time::{after, ms};

/// The most operations one batch call carries: large enough to amortize a call, small enough
/// that one script does not hold the server for long (each operation is a lone script's work).
pub(crate) const MAX_BATCH: usize = 64;

/// How many lock-script calls a node's lane keeps in flight: two, so that the server runs one
/// batch while the client reads the other's replies and gathers the next (with one, client and
/// server took turns, and on a host where they share two cores much of the CPU sat idle:
/// `lock-distinct` ran at 0.81 × the fenced floor's throughput with one, see
/// docs/benchmarks.md).
pub(crate) const MAX_IN_FLIGHT: u8 = 2;

/// A release's keys, copied: a guard's release borrows its keys, and only a queued release
/// needs them owned.
struct Owned {
    lock: String,
    channel: String,
}

impl BatchKeys for Owned {
    fn lock(&self) -> &str {
        &self.lock
    }
    fn fence(&self) -> &str {
        ""
    }
    fn channel(&self) -> &str {
        &self.channel
    }
}

enum Op {
    Acquire { token: String, ttl: Duration },
    Release { token: String },
}

impl Op {
    fn during(&self) -> &'static str {
        match self {
            Op::Acquire { .. } => "acquiring the lock",
            Op::Release { .. } => "releasing the lock",
        }
    }
}

/// What a member of a batch gets: its own reply and when the batch was sent.
type Reply = Result<(Value, Instant), Error>;

struct Queued {
    id: u64,
    keys: Arc<dyn BatchKeys>,
    op: Op,
    reply: oneshot::Sender<Reply>,
}

/// One node's group commit (see the module docs), kept on the node.
#[derive(Default)]
pub(crate) struct Lane {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Lock-script calls to the node in flight (or about to be), at most [`MAX_IN_FLIGHT`].
    busy: u8,
    queue: Vec<Queued>,
    next_id: u64,
}

enum Joined {
    /// The lane was idle and is now the caller's: it sends alone.
    Alone,
    /// Queued as `id`; the reply comes on the receiver.
    Queued(u64, oneshot::Receiver<Reply>),
}

impl Lane {
    fn join(&self, keys: impl FnOnce() -> Arc<dyn BatchKeys>, op: impl FnOnce() -> Op) -> Joined {
        let mut s = crate::util::lock(&self.state);
        if s.busy < MAX_IN_FLIGHT {
            s.busy += 1;
            return Joined::Alone;
        }
        let id = s.next_id;
        s.next_id = s.next_id.wrapping_add(1);
        let (tx, rx) = oneshot::channel();
        s.queue.push(Queued {
            id,
            keys: keys(),
            op: op(),
            reply: tx,
        });
        Joined::Queued(id, rx)
    }

    /// Takes `id` out of the queue: `true` if it was still there (it was never sent).
    fn leave(&self, id: u64) -> bool {
        let mut s = crate::util::lock(&self.state);
        match s.queue.iter().position(|q| q.id == id) {
            Some(i) => {
                s.queue.remove(i);
                true
            }
            None => false,
        }
    }

    /// The next batch, oldest first, for a place in flight that is handed on; empty (and the
    /// place free again) when nobody waits.
    fn next(&self) -> Vec<Queued> {
        let mut s = crate::util::lock(&self.state);
        if s.queue.is_empty() {
            s.busy = s.busy.saturating_sub(1);
            return Vec::new();
        }
        let n = s.queue.len().min(MAX_BATCH);
        s.queue.drain(..n).collect()
    }

    /// How many operations wait (for tests).
    #[cfg(test)]
    fn queued(&self) -> usize {
        crate::util::lock(&self.state).queue.len()
    }
}

/// A place in flight on the lane, held: dropped (the call returned, or its caller gave up on
/// it), it hands the place on to the queue's next batch, sent by a task of its own, or frees it.
struct Busy {
    lane: Arc<Lane>,
    node: Arc<Node>,
    /// The client's tasks (a client's `shutdown` waits for them): batches and the releases of
    /// given-up members run on it.
    tracker: TaskTracker,
}

impl Busy {
    fn new(lane: &Arc<Lane>, node: &Arc<Node>, tracker: &TaskTracker) -> Busy {
        Busy {
            lane: lane.clone(),
            node: node.clone(),
            tracker: tracker.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let batch = self.lane.next();
        if batch.is_empty() {
            return;
        }
        let busy = Busy::new(&self.lane, &self.node, &self.tracker);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                self.tracker.spawn_on(
                    async move {
                        send(&busy.node, &busy.tracker, batch).await;
                        drop(busy);
                    },
                    &rt,
                );
            }
            // No runtime to send from (a caller dropped after its runtime ended): the members'
            // reply channels close with `batch`, and `busy` hands on to the rest the same way.
            Err(_) => drop((batch, busy)),
        }
    }
}

/// Sends `batch` as one script call on `node` and gives each member its reply.
async fn send(node: &Arc<Node>, tracker: &TaskTracker, batch: Vec<Queued>) {
    let mut call = redis::cmd("EVALSHA");
    call.arg(BATCH_SCRIPT.get_hash());
    let keys: usize = batch
        .iter()
        .map(|q| match q.op {
            Op::Acquire { .. } => 2,
            Op::Release { .. } => 1,
        })
        .sum();
    call.arg(keys);
    for q in &batch {
        call.arg(q.keys.lock());
        if let Op::Acquire { .. } = q.op {
            call.arg(q.keys.fence());
        }
    }
    call.arg(node.publish);
    for q in &batch {
        match &q.op {
            Op::Acquire { token, ttl } => {
                call.arg("a")
                    .arg(token.as_str())
                    .arg(ms(*ttl))
                    .arg(ms(fence_ttl(*ttl)));
            }
            Op::Release { token } => {
                call.arg("r").arg(token.as_str()).arg(q.keys.channel());
            }
        }
    }
    let sent = Instant::now();
    let limit = after(sent, node.settings().response_timeout);
    let mut conn = node.conn();
    let reply = tokio::time::timeout_at(
        limit,
        super::script::run_script(&mut conn, &BATCH_SCRIPT, &call),
    )
    .await;
    let shared: Result<Vec<Value>, Error> = match reply {
        Ok(Ok(Value::Array(items))) if items.len() == batch.len() => Ok(items),
        Ok(Ok(other)) => Err(unexpected("the lock batch", &other)),
        Ok(Err(e)) => Err(Error::from(e)),
        // Each member gets the error its lone call would: the timeout of its own step.
        Err(_) => Err(Error::Timeout {
            during: "acquiring the lock",
        }),
    };
    // Members that gave up after their batch was taken from the queue (dropped, or their own
    // deadline passed) left their acquisitions to this task: it releases them here, after its
    // own script reached the connection, so a release can never overtake the acquisition it
    // undoes (the caller's own release, sent at once, could have: the batch is taken from the
    // queue a moment before its task writes it).
    let mut orphans = Vec::new();
    match shared {
        Ok(items) => {
            for (q, v) in batch.into_iter().zip(items) {
                let granted =
                    matches!(&v, Value::Array(r) if matches!(r.first(), Some(Value::Int(1))));
                if q.reply.send(Ok((v, sent))).is_err() && granted {
                    if let Op::Acquire { token, .. } = q.op {
                        orphans.push((q.keys, token));
                    }
                }
            }
        }
        Err(e) => {
            for q in batch {
                let e = match e {
                    Error::Timeout { .. } => Error::Timeout {
                        during: q.op.during(),
                    },
                    ref other => other.clone(),
                };
                // The outcome is unknown: an orphan's acquisition may have applied.
                if q.reply.send(Err(e)).is_err() {
                    if let Op::Acquire { token, .. } = q.op {
                        orphans.push((q.keys, token));
                    }
                }
            }
        }
    }
    for (keys, token) in orphans {
        let node = node.clone();
        tracker.spawn(async move {
            let limit = after(Instant::now(), node.settings().response_timeout);
            let (lock_key, channel) = (keys.lock(), keys.channel());
            match lock::release(&mut node.conn(), lock_key, channel, &token, limit).await {
                Ok(ours) => {
                    tracing::debug!(key = lock_key, ours, "a given-up batch member released")
                }
                Err(e) => tracing::warn!(
                    key = lock_key,
                    error = %e,
                    "releasing a given-up batch member failed; the lock's ttl is the backstop"
                ),
            }
        });
    }
}

/// A queued member's place: dropped before its reply came, it leaves the queue if it is still
/// there (then nothing was sent), and otherwise its batch releases the acquisition once the
/// batch's own reply (or timeout) is in. Either way `pending` (the caller's own release by
/// token) is disarmed: sent at once, it could reach the server before a batch that was taken
/// from the queue but not yet written.
struct Waiting<'a> {
    lane: &'a Lane,
    id: u64,
    pending: Option<&'a mut dyn Disarm>,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.lane.leave(self.id);
            if let Some(p) = self.pending.take() {
                p.disarm();
            }
        }
    }
}

async fn wait<'a>(
    lane: &'a Lane,
    id: u64,
    rx: oneshot::Receiver<Reply>,
    limit: Instant,
    pending: Option<&'a mut dyn Disarm>,
    during: &'static str,
) -> Reply {
    let mut place = Waiting {
        lane,
        id,
        pending,
        answered: false,
    };
    match tokio::time::timeout_at(limit, rx).await {
        Ok(Ok(reply)) => {
            place.answered = true;
            reply
        }
        // The sender went away unanswered: the batch may have left (a runtime shutting down
        // dropped its task), so the outcome is unknown.
        Ok(Err(_)) => Err(Error::Connection {
            message: format!("the batch carrying this call was dropped while {during}"),
            source: None,
        }),
        // Still queued (`place` takes it out, and nothing was sent) or in flight: the lone
        // call's timeout either way.
        Err(_) => Err(Error::Timeout { during }),
    }
}

/// One operation's own failure inside a batch (`{3, "CODE message"}`), as the lone script's
/// error would have been.
fn member_error(v: &Value) -> Option<Error> {
    let Value::Array(items) = v else {
        return None;
    };
    match items.as_slice() {
        [Value::Int(3), msg] => {
            let msg = lock::string_of(msg).unwrap_or_default();
            let (code, detail) = msg.split_once(' ').unwrap_or((msg.as_str(), ""));
            Some(Error::from(redis::make_extension_error(
                code.to_string(),
                Some(detail.to_string()),
            )))
        }
        _ => None,
    }
}

fn lane_of(node: &Node) -> Option<Arc<Lane>> {
    node.extension::<Lane>()
}

/// [`lock::acquire`] through `node`'s lane: alone when it is idle, else in the next batch.
/// `pending` is the caller's release by token, disarmed here only if the call never left.
///
/// # Errors
/// As [`lock::acquire`].
///
/// # Cancel safety
/// As [`lock::acquire`]; dropped while queued, nothing was sent and `pending` is disarmed.
pub(crate) async fn acquire<K: BatchKeys>(
    node: &Arc<Node>,
    keys: &Arc<K>,
    req: &Acquire<'_>,
    limit: Instant,
    pending: &mut dyn Disarm,
    tracker: &TaskTracker,
) -> Result<Grant, Error> {
    let Some(lane) = lane_of(node) else {
        return lock::acquire(&mut node.conn(), req, limit).await;
    };
    let joined = lane.join(
        || keys.clone(),
        || Op::Acquire {
            token: req.token.to_string(),
            ttl: req.ttl,
        },
    );
    match joined {
        Joined::Alone => {
            let _busy = Busy::new(&lane, node, tracker);
            lock::acquire(&mut node.conn(), req, limit).await
        }
        Joined::Queued(id, rx) => {
            const DURING: &str = "acquiring the lock";
            let (v, sent) = wait(&lane, id, rx, limit, Some(pending), DURING).await?;
            if let Some(e) = member_error(&v) {
                return Err(e);
            }
            lock::parse_acquire(req.fence, v, sent)
        }
    }
}

/// [`lock::release`] through `node`'s lane: alone when it is idle, else in the next batch.
///
/// # Errors
/// As [`lock::release`].
pub(crate) async fn release(
    node: &Arc<Node>,
    lock_key: &str,
    channel: &str,
    token: &str,
    limit: Instant,
    tracker: &TaskTracker,
) -> Result<bool, Error> {
    let Some(lane) = lane_of(node) else {
        return lock::release(&mut node.conn(), lock_key, channel, token, limit).await;
    };
    let joined = lane.join(
        || {
            Arc::new(Owned {
                lock: lock_key.to_string(),
                channel: channel.to_string(),
            })
        },
        || Op::Release {
            token: token.to_string(),
        },
    );
    match joined {
        Joined::Alone => {
            let _busy = Busy::new(&lane, node, tracker);
            lock::release(&mut node.conn(), lock_key, channel, token, limit).await
        }
        Joined::Queued(id, rx) => {
            const DURING: &str = "releasing the lock";
            let (v, _) = wait(&lane, id, rx, limit, None, DURING).await?;
            if let Some(e) = member_error(&v) {
                return Err(e);
            }
            match v {
                Value::Int(1) => Ok(true),
                Value::Int(0) => Ok(false),
                other => Err(unexpected("the lock release", &other)),
            }
        }
    }
}

/// [`lock::acquire`], grouped with this client's other lock calls to the same node when they
/// overlap (see the module docs) on a client whose keys all live on one node; alone on a
/// cluster. `pending` is the caller's release by token, disarmed only when the call never left.
///
/// # Errors
/// As [`lock::acquire`].
pub(crate) async fn acquire_grouped<K: BatchKeys>(
    t: &Transport,
    keys: &Arc<K>,
    req: &Acquire<'_>,
    limit: Instant,
    pending: &mut dyn crate::util::drop_guard::Disarm,
) -> Result<Grant, Error> {
    if !t.router.one_node() {
        return lock::acquire_on(t, req, limit).await;
    }
    let node = t.node(req.lock).await?;
    acquire(&node, keys, req, limit, pending, &t.tracker).await
}

/// [`lock::release`] on the node that serves `lock`, grouped with this client's other lock calls to
/// the node when they overlap (see the module docs; alone on a cluster).
///
/// # Errors
/// As [`lock::release`].
pub(crate) async fn release_on(
    t: &Transport,
    lock: &str,
    channel: &str,
    token: &str,
    limit: Instant,
) -> Result<bool, Error> {
    let node = t.node(lock).await?;
    if t.router.one_node() {
        return release(&node, lock, channel, token, limit, &t.tracker).await;
    }
    lock::release(&mut node.conn(), lock, channel, token, limit).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Arc<dyn BatchKeys> {
        Arc::new(Owned {
            lock: "l".into(),
            channel: "c".into(),
        })
    }

    fn release_op() -> Op {
        Op::Release { token: "t".into() }
    }

    #[test]
    fn the_first_callers_go_alone_and_later_ones_queue_until_handed_on() {
        let lane = Lane::default();
        for _ in 0..MAX_IN_FLIGHT {
            assert!(matches!(lane.join(keys, release_op), Joined::Alone));
        }
        let mut ids = Vec::new();
        for _ in 0..(MAX_BATCH + 3) {
            match lane.join(keys, release_op) {
                Joined::Queued(id, _rx) => ids.push(id),
                Joined::Alone => panic!("the lane is busy"),
            }
        }
        // A queued caller that gives up leaves before anything is sent.
        assert!(lane.leave(ids[1]));
        assert!(!lane.leave(ids[1]));
        let first = lane.next();
        assert_eq!(first.len(), MAX_BATCH, "capped");
        assert_eq!(first[0].id, ids[0]);
        assert_eq!(first[1].id, ids[2], "the one that left is not sent");
        // Taken into a batch: too late to leave.
        assert!(!lane.leave(ids[0]));
        assert_eq!(lane.next().len(), 2);
        // One place freed: the next caller goes alone, and the one after queues.
        assert!(lane.next().is_empty());
        assert!(matches!(lane.join(keys, release_op), Joined::Alone));
        assert!(matches!(lane.join(keys, release_op), Joined::Queued(..)));
        assert_eq!(lane.queued(), 1);
    }

    #[test]
    fn a_members_own_failure_keeps_its_server_error() {
        let v = Value::Array(vec![
            Value::Int(3),
            Value::BulkString(
                b"WRONGTYPE Operation against a key holding the wrong kind of value".to_vec(),
            ),
        ]);
        let e = member_error(&v).expect("an error");
        assert_eq!(e.kind(), crate::error::ErrorKind::WrongType, "{e:?}");
        assert!(!e.is_indeterminate());
        assert!(member_error(&Value::Array(vec![Value::Int(1), Value::Int(2)])).is_none());
        assert!(member_error(&Value::Int(1)).is_none());
    }
}
