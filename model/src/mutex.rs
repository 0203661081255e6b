//! The fenced mutex (`src/mutex/`, scripts in `src/backend/redis/locks.rs`) as a model for the
//! checker.
//!
//! Clients take the lock, write to a fenced resource, and release it, for a number of rounds
//! each. The scripts are atomic server-side steps here (as on the server); the client's own
//! decisions are the library's: [`orphaned`] (whether an acquisition whose reply was lost must
//! be released by token) and [`after_extension`] (the watchdog's step after an extension).
//!
//! The world: every interleaving; acquisition replies lost (the script then runs later, or
//! never, and the release by token queued behind it on the same connection); holders that
//! pause past their lease; crashes; the lock expiring whenever no live holder vouches for it;
//! Redis restarting without its data. Time is logical: `TIME` reads one more than the highest
//! token granted.
//!
//! Properties:
//! - always: fencing tokens of grants strictly increase (across data loss too);
//! - without data loss: at most one *valid* holder at a time (valid: its lease deadline has not
//!   passed; a paused holder is not valid, which is why the resource is fenced), and the fenced
//!   resource never refuses a valid holder's write (a refusal would mean a later grant while it
//!   held the lock).
//!
//! With `batching` the clients are tasks of one client whose lock calls may also go through
//! the group commit (`src/backend/redis/batch.rs`): an acquisition or a release queues, and the
//! queue leaves as one script call that runs each operation's own step atomically, in order (a
//! release then an acquisition in one batch is a handoff). A queued acquisition may be dropped
//! (it leaves the queue; nothing was sent, nothing is released); a batch's reply may be lost
//! (every acquisition in it is then orphaned, [`orphaned`] decides, and released by token
//! behind the batch on the same connection), or the batch never arrives; and the callers of a
//! batch's acquisitions may give up after it was taken, in which case the batch's task
//! releases their grants by token behind it, as `src/backend/redis/batch.rs` does.
//!
//! Liveness: from every state, fault-free steps end every client with no lock left behind; a
//! lock orphaned by an abandoned acquisition expiring on its TTL counts as a fault, so the
//! release by token must clean it up.

use super::check::{fx_hash, Model};
use baton::model_api::Error;
use baton::model_api::{orphaned, Grant};

use baton::model_api::Extension;
use baton::model_api::Instant;
use baton::model_api::{after_extension, WatchStep};

/// A lock token (only equality matters; names no client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Tok(u8);

/// Faults left to inject in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Faults {
    /// Acquisition replies lost.
    pub lost_replies: u8,
    /// Holders that pause past their lease.
    pub pauses: u8,
    /// Client crashes.
    pub crashes: u8,
    /// Restarts that lose every key.
    pub wipes: u8,
}

/// A deliberate bug, to show the checker finds it.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// `release` deletes the lock without comparing the token.
    ReleaseWithoutTokenCheck,
    /// An acquisition whose reply was lost is not released by token.
    OrphansKept,
    /// The fence is `old + 1`, without the server-time floor.
    NoTimeFloor,
    /// A batch's grants skip the fence step: each is handed the stored fence.
    BatchSkipsFenceStep,
    /// A batch tests the lock once for all its members: every acquisition in it is granted
    /// if the lock was free when the batch began.
    BatchGrantsTwice,
    /// A batch member that gave up after its batch was taken from the queue is not released:
    /// its grant stays until its ttl.
    GivenUpKept,
}

/// The mutex model's parameters.
#[derive(Clone, Debug)]
pub(crate) struct MutexModel {
    pub clients: u8,
    /// Acquisitions each client makes.
    pub rounds: u8,
    pub watchdog: bool,
    pub faults: Faults,
    pub mutation: Option<Mutation>,
    /// Lock calls may also go through the group commit (see the module docs).
    pub batching: bool,
    /// Whether a lone acquisition's reply may be lost (else only a batch's).
    pub lone_lost: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Hold {
    tok: Tok,
    fence: u64,
    /// Its lease deadline has not passed (a paused holder is no longer valid).
    valid: bool,
    wrote: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    /// An acquisition waits in the group commit's queue.
    Queued,
    Holding(Hold),
    /// A release waits in the group commit's queue (the watchdog already stopped).
    Releasing(Hold),
    Ended,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Client {
    phase: Phase,
    rounds_left: u8,
}

/// A script call sent whose reply was lost, in connection order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Op {
    Acquire(Tok),
    /// Release by token (`None`: by key, a mutation).
    Release(Option<Tok>),
}

/// An operation in the group commit: whose, and its token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum QOp {
    Acquire(u8, Tok),
    Release(u8, Tok),
}

/// A request on the group commit's shared connection whose reply nobody waits for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Shared {
    /// A batch whose reply was lost: its operations' tokens (acquisitions, releases).
    Batch(Vec<(bool, Tok)>),
    /// A release by token of an acquisition the lost batch carried.
    Release(Tok),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Ghost {
    last_fence: u64,
    /// Tokens of acquisitions whose reply was lost (bit `t`): a lock with one of them that
    /// nobody releases is orphaned.
    abandoned: u64,
    wiped: bool,
    violation: Option<String>,
}

/// One state of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sys {
    lock: Option<Tok>,
    fence: Option<u64>,
    /// The fenced resource's highest accepted token (it lives outside this Redis).
    resource: u64,
    clients: Vec<Client>,
    /// Per client, its requests in flight, oldest first.
    inflight: Vec<Vec<Op>>,
    /// The group commit's queue, oldest first.
    queue: Vec<QOp>,
    /// Requests on the group commit's connection whose reply was lost, oldest first.
    shared: Vec<Shared>,
    faults: Faults,
    ghost: Ghost,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// The acquire script, with its reply.
    Try(u8),
    /// The acquire script sent, its reply lost (fault).
    TryLost(u8),
    /// The oldest request in flight of a client reaches the server.
    Apply(u8),
    /// ...or an acquisition in flight never does.
    Drop(u8),
    /// The holder writes to the fenced resource.
    Work(u8),
    /// `release()`.
    Release(u8),
    /// The watchdog's extension.
    Extend(u8),
    /// Without the watchdog: the lease deadline passes while the holder works.
    Deadline(u8),
    /// A paused holder runs again: the watchdog's deadline timer fires first.
    Resume(u8),
    Pause(u8),
    Crash(u8),
    /// The lock's TTL runs out.
    Expire,
    /// The TTL of a lock an abandoned acquisition left behind runs out (a fault for liveness:
    /// the release by token should have removed it long before).
    ExpireOrphan,
    /// Redis restarts without its data.
    Wipe,
    /// An idle client's acquisition queues in the group commit.
    Enqueue(u8),
    /// A holder's release queues in the group commit.
    EnqueueRelease(u8),
    /// A queued acquisition's caller is dropped (its round ends): it leaves the queue, nothing
    /// was sent.
    Leave(u8),
    /// The queue leaves as one script call, with its reply.
    Flush,
    /// The queue leaves as one script call whose reply is lost (fault).
    FlushLost,
    /// The queue leaves as one script call and its reply comes back, but the acquisitions'
    /// callers gave up after the batch was taken (dropped, or out of their own time; drawn
    /// from the lost-reply budget to bound the search, not a fault): the batch's task
    /// releases each grant by token, sent after the batch on the same connection.
    FlushGivenUp,
    /// The oldest request on the shared connection reaches the server.
    ApplyShared,
    /// ...or a batch on it never does.
    DropShared,
}

fn violate(s: &mut Sys, message: String) {
    if s.ghost.violation.is_none() {
        s.ghost.violation = Some(message);
    }
}

impl MutexModel {
    pub(crate) fn new(clients: u8, rounds: u8, watchdog: bool, faults: Faults) -> Self {
        MutexModel {
            clients,
            rounds,
            watchdog,
            faults,
            mutation: None,
            batching: false,
            lone_lost: true,
        }
    }

    fn fresh_token(s: &Sys) -> Tok {
        let mut used: u64 = s.ghost.abandoned;
        let mut mark = |t: Tok| used |= 1u64 << t.0.min(63);
        if let Some(t) = s.lock {
            mark(t);
        }
        for c in &s.clients {
            if let Phase::Holding(h) = c.phase {
                mark(h.tok);
            }
        }
        for op in s.inflight.iter().flatten() {
            match *op {
                Op::Acquire(t) | Op::Release(Some(t)) => mark(t),
                Op::Release(None) => {}
            }
        }
        for c in &s.clients {
            if let Phase::Releasing(h) = c.phase {
                mark(h.tok);
            }
        }
        for q in &s.queue {
            match *q {
                QOp::Acquire(_, t) | QOp::Release(_, t) => mark(t),
            }
        }
        for op in &s.shared {
            match op {
                Shared::Batch(ops) => ops.iter().for_each(|&(_, t)| mark(t)),
                Shared::Release(t) => mark(*t),
            }
        }
        Tok(used.trailing_ones() as u8)
    }

    /// The acquire script, atomically: `Some(fence)` if it took the lock.
    fn acquire_script(&self, s: &mut Sys, tok: Tok) -> Option<u64> {
        self.acquire_step(s, tok, false, None)
    }

    /// The acquire script's step, alone or as one operation of a batch (`in_batch`; `free`:
    /// whether the lock was free when the batch began, which only a mutation looks at).
    fn acquire_step(
        &self,
        s: &mut Sys,
        tok: Tok,
        in_batch: bool,
        free: Option<bool>,
    ) -> Option<u64> {
        let free = match (self.mutation, free) {
            (Some(Mutation::BatchGrantsTwice), Some(f)) if in_batch => f,
            _ => s.lock.is_none(),
        };
        if !free {
            return None;
        }
        let old = s.fence.unwrap_or(0);
        let fence = match self.mutation {
            Some(Mutation::NoTimeFloor) => old + 1,
            Some(Mutation::BatchSkipsFenceStep) if in_batch && s.fence.is_some() => old,
            _ => (old + 1).max(s.ghost.last_fence + 1),
        };
        if fence <= s.ghost.last_fence {
            violate(
                s,
                format!(
                    "fencing token went back: {fence} after {}",
                    s.ghost.last_fence
                ),
            );
        }
        if !s.ghost.wiped {
            if let Some(other) = s.clients.iter().find_map(|c| match c.phase {
                Phase::Holding(h) if h.valid => Some(h.fence),
                _ => None,
            }) {
                violate(
                    s,
                    format!("granted token {fence} while the holder of {other} is still valid"),
                );
            }
        }
        s.ghost.last_fence = s.ghost.last_fence.max(fence);
        s.lock = Some(tok);
        s.fence = Some(fence);
        Some(fence)
    }

    fn release_script(&self, s: &mut Sys, tok: Option<Tok>) -> bool {
        let ours = match tok {
            Some(t) => s.lock == Some(t),
            None => s.lock.is_some(),
        };
        if ours {
            s.lock = None;
        }
        ours
    }

    fn end_round(&self, s: &mut Sys, i: usize) {
        let c = &mut s.clients[i];
        c.rounds_left = c.rounds_left.saturating_sub(1);
        c.phase = if c.rounds_left == 0 {
            Phase::Ended
        } else {
            Phase::Idle
        };
    }

    /// Whether a live, valid holder vouches for the lock `tok` (it cannot expire then).
    fn vouched(&self, s: &Sys, tok: Tok) -> bool {
        s.clients
            .iter()
            .any(|c| matches!(c.phase, Phase::Holding(h) if h.tok == tok && h.valid))
    }

    fn canonical(mut s: Sys) -> Sys {
        let n = s.clients.len();
        // A client's place in the queue is part of what tells it apart.
        let place = |i: usize| {
            s.queue.iter().position(|q| match *q {
                QOp::Acquire(c, _) | QOp::Release(c, _) => c as usize == i,
            })
        };
        let keys: Vec<u64> = (0..n)
            .map(|i| fx_hash(&(&s.clients[i], &s.inflight[i], place(i))))
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| keys[i]);
        if order.iter().enumerate().any(|(pos, &i)| pos != i) {
            s.clients = order.iter().map(|&i| s.clients[i]).collect();
            s.inflight = order.iter().map(|&i| s.inflight[i].clone()).collect();
            let mut new_of = vec![0u8; n];
            for (pos, &old) in order.iter().enumerate() {
                new_of[old] = pos as u8;
            }
            for q in &mut s.queue {
                match q {
                    QOp::Acquire(c, _) | QOp::Release(c, _) => *c = new_of[*c as usize],
                }
            }
        }
        s
    }

    /// Runs a batch's operations in order, atomically (the batch script). With `deliver` (the
    /// reply came back) each caller learns its outcome at once, so a later grant in the same
    /// batch is checked against the earlier ones.
    fn batch_script(&self, s: &mut Sys, ops: &[QOp], deliver: bool) {
        let free = Some(s.lock.is_none());
        for op in ops {
            match *op {
                QOp::Acquire(c, tok) => {
                    let fence = self.acquire_step(s, tok, true, free);
                    if !deliver {
                        continue;
                    }
                    s.clients[c as usize].phase = match fence {
                        Some(fence) => Phase::Holding(Hold {
                            tok,
                            fence,
                            valid: true,
                            wrote: false,
                        }),
                        // Contended: the caller tries again later.
                        None => Phase::Idle,
                    };
                }
                QOp::Release(c, tok) => {
                    self.release_script(s, Some(tok));
                    if deliver {
                        self.end_round(s, c as usize);
                    }
                }
            }
        }
    }
}

impl Model for MutexModel {
    type State = Sys;
    type Action = Action;

    fn init(&self) -> Vec<Sys> {
        let n = self.clients as usize;
        vec![Sys {
            lock: None,
            fence: None,
            resource: 0,
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    rounds_left: self.rounds,
                };
                n
            ],
            inflight: vec![Vec::new(); n],
            queue: Vec::new(),
            shared: Vec::new(),
            faults: self.faults,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, s: &Sys, out: &mut Vec<Action>) {
        let f = &s.faults;
        for (i, c) in s.clients.iter().enumerate() {
            let i8 = i as u8;
            if !s.inflight[i].is_empty() {
                out.push(Action::Apply(i8));
                if matches!(s.inflight[i].first(), Some(Op::Acquire(_))) {
                    out.push(Action::Drop(i8));
                }
            }
            match c.phase {
                Phase::Ended => {}
                // A new request queues behind those in flight on the same connection: modelled
                // as waiting for them.
                Phase::Idle if s.inflight[i].is_empty() => {
                    out.push(Action::Try(i8));
                    if f.lost_replies > 0 && self.lone_lost {
                        out.push(Action::TryLost(i8));
                    }
                    if self.batching {
                        out.push(Action::Enqueue(i8));
                    }
                }
                Phase::Idle => {}
                Phase::Queued => out.push(Action::Leave(i8)),
                Phase::Releasing(_) => {}
                Phase::Holding(h) => {
                    if !h.wrote {
                        out.push(Action::Work(i8));
                    }
                    if self.batching && (h.valid || !self.watchdog) {
                        out.push(Action::EnqueueRelease(i8));
                    }
                    if h.valid {
                        out.push(Action::Release(i8));
                        if self.watchdog {
                            out.push(Action::Extend(i8));
                            if f.pauses > 0 {
                                out.push(Action::Pause(i8));
                            }
                        } else {
                            out.push(Action::Deadline(i8));
                        }
                    } else if self.watchdog {
                        out.push(Action::Resume(i8));
                    } else {
                        // Without the watchdog nothing tells the holder; it releases (and
                        // learns the lock was no longer its own).
                        out.push(Action::Release(i8));
                    }
                    if f.crashes > 0 {
                        out.push(Action::Crash(i8));
                    }
                }
            }
        }
        if let Some(tok) = s.lock {
            if s.ghost.abandoned >> tok.0.min(63) & 1 != 0 {
                out.push(Action::ExpireOrphan);
            } else if !self.vouched(s, tok) {
                out.push(Action::Expire);
            }
        }
        if f.wipes > 0 {
            out.push(Action::Wipe);
        }
        if !s.queue.is_empty() {
            out.push(Action::Flush);
            if f.lost_replies > 0 {
                out.push(Action::FlushLost);
                if s.queue.iter().any(|q| matches!(q, QOp::Acquire(..))) {
                    out.push(Action::FlushGivenUp);
                }
            }
        }
        if let Some(first) = s.shared.first() {
            out.push(Action::ApplyShared);
            if matches!(first, Shared::Batch(_)) {
                out.push(Action::DropShared);
            }
        }
    }

    fn next(&self, s: &Sys, a: &Action) -> Option<Sys> {
        let mut s = s.clone();
        match *a {
            Action::Try(i) => {
                let tok = Self::fresh_token(&s);
                match self.acquire_script(&mut s, tok) {
                    Some(fence) => {
                        s.clients[i as usize].phase = Phase::Holding(Hold {
                            tok,
                            fence,
                            valid: true,
                            wrote: false,
                        });
                    }
                    // Contended: the client tries again later (its backoff); nothing changed.
                    None => return None,
                }
            }
            Action::TryLost(i) => {
                s.faults.lost_replies -= 1;
                let tok = Self::fresh_token(&s);
                let lost: Result<Grant, Error> = Err(Error::Timeout {
                    during: "acquiring the lock",
                });
                s.ghost.abandoned |= 1u64 << tok.0.min(63);
                let q = &mut s.inflight[i as usize];
                q.push(Op::Acquire(tok));
                if orphaned(&lost) && self.mutation != Some(Mutation::OrphansKept) {
                    q.push(Op::Release(Some(tok)));
                }
            }
            Action::Apply(i) => {
                let op = s.inflight[i as usize].remove(0);
                match op {
                    Op::Acquire(tok) => {
                        self.acquire_script(&mut s, tok);
                    }
                    Op::Release(tok) => {
                        self.release_script(&mut s, tok);
                    }
                }
            }
            Action::Drop(i) => {
                s.inflight[i as usize].remove(0);
            }
            Action::Work(i) => {
                let Phase::Holding(h) = &mut s.clients[i as usize].phase else {
                    return None;
                };
                h.wrote = true;
                let (fence, valid) = (h.fence, h.valid);
                if fence >= s.resource {
                    s.resource = fence;
                } else if valid && !s.ghost.wiped {
                    violate(
                        &mut s,
                        format!("the resource refused the valid holder of token {fence}"),
                    );
                }
            }
            Action::Release(i) => {
                let Phase::Holding(h) = s.clients[i as usize].phase else {
                    return None;
                };
                let by = if self.mutation == Some(Mutation::ReleaseWithoutTokenCheck) {
                    None
                } else {
                    Some(h.tok)
                };
                self.release_script(&mut s, by);
                self.end_round(&mut s, i as usize);
            }
            Action::Extend(i) => {
                let Phase::Holding(h) = s.clients[i as usize].phase else {
                    return None;
                };
                let outcome: Result<Extension, Error> = if s.lock == Some(h.tok) {
                    Ok(Extension::Confirmed {
                        sent: Instant::now(),
                    })
                } else {
                    Ok(Extension::Refused)
                };
                match after_extension(&outcome) {
                    WatchStep::Extended { .. } | WatchStep::Retry => return None,
                    // The loss signal: the work is cancelled, and the guard's release finds
                    // another token (or none) and writes nothing.
                    WatchStep::Lost(_) => self.end_round(&mut s, i as usize),
                }
            }
            Action::Deadline(i) | Action::Pause(i) => {
                if matches!(a, Action::Pause(_)) {
                    s.faults.pauses -= 1;
                }
                let Phase::Holding(h) = &mut s.clients[i as usize].phase else {
                    return None;
                };
                h.valid = false;
            }
            // `with_lock` then cancels the work and releases by token (a no-op if the lock was
            // taken over; its own lock, not yet expired, is removed).
            Action::Resume(i) => {
                if let Phase::Holding(h) = s.clients[i as usize].phase {
                    self.release_script(&mut s, Some(h.tok));
                }
                self.end_round(&mut s, i as usize);
            }
            Action::Crash(i) => {
                s.faults.crashes -= 1;
                s.clients[i as usize].phase = Phase::Ended;
            }
            Action::Enqueue(i) => {
                let tok = Self::fresh_token(&s);
                s.queue.push(QOp::Acquire(i, tok));
                s.clients[i as usize].phase = Phase::Queued;
            }
            Action::EnqueueRelease(i) => {
                let Phase::Holding(h) = s.clients[i as usize].phase else {
                    return None;
                };
                s.queue.push(QOp::Release(i, h.tok));
                s.clients[i as usize].phase = Phase::Releasing(h);
            }
            Action::Leave(i) => {
                s.queue
                    .retain(|q| !matches!(*q, QOp::Acquire(c, _) if c == i));
                // The caller gave up on this round.
                self.end_round(&mut s, i as usize);
            }
            Action::Flush => {
                let ops = std::mem::take(&mut s.queue);
                self.batch_script(&mut s, &ops, true);
            }
            Action::FlushLost => {
                s.faults.lost_replies -= 1;
                let ops = std::mem::take(&mut s.queue);
                let lost: Result<Grant, Error> = Err(Error::Timeout {
                    during: "acquiring the lock",
                });
                let mut batch = Vec::new();
                let mut releases = Vec::new();
                for op in &ops {
                    match *op {
                        QOp::Acquire(c, tok) => {
                            batch.push((true, tok));
                            s.ghost.abandoned |= 1u64 << tok.0.min(63);
                            if orphaned(&lost) && self.mutation != Some(Mutation::OrphansKept) {
                                releases.push(Shared::Release(tok));
                            }
                            s.clients[c as usize].phase = Phase::Idle;
                        }
                        // The release's outcome is unknown to its caller; the guard is gone
                        // either way (the ttl is the backstop if the batch never arrives).
                        QOp::Release(c, tok) => {
                            batch.push((false, tok));
                            self.end_round(&mut s, c as usize);
                        }
                    }
                }
                s.shared.push(Shared::Batch(batch));
                s.shared.extend(releases);
            }
            Action::FlushGivenUp => {
                s.faults.lost_replies -= 1;
                let ops = std::mem::take(&mut s.queue);
                let free = Some(s.lock.is_none());
                let mut releases = Vec::new();
                for op in &ops {
                    match *op {
                        QOp::Acquire(c, tok) => {
                            let granted = self.acquire_step(&mut s, tok, true, free).is_some();
                            s.ghost.abandoned |= 1u64 << tok.0.min(63);
                            if granted && self.mutation != Some(Mutation::GivenUpKept) {
                                releases.push(Shared::Release(tok));
                            }
                            // The caller gave up on this round.
                            self.end_round(&mut s, c as usize);
                        }
                        QOp::Release(c, tok) => {
                            self.release_script(&mut s, Some(tok));
                            self.end_round(&mut s, c as usize);
                        }
                    }
                }
                s.shared.extend(releases);
            }
            Action::ApplyShared => match s.shared.remove(0) {
                Shared::Batch(ops) => {
                    let ops: Vec<QOp> = ops
                        .into_iter()
                        .map(|(acq, t)| {
                            if acq {
                                QOp::Acquire(0, t)
                            } else {
                                QOp::Release(0, t)
                            }
                        })
                        .collect();
                    self.batch_script(&mut s, &ops, false);
                }
                Shared::Release(tok) => {
                    self.release_script(&mut s, Some(tok));
                }
            },
            Action::DropShared => {
                s.shared.remove(0);
            }
            Action::Expire | Action::ExpireOrphan => s.lock = None,
            Action::Wipe => {
                s.faults.wipes -= 1;
                s.ghost.wiped = true;
                s.lock = None;
                s.fence = None;
                // Requests in flight die with the connections.
                for q in &mut s.inflight {
                    q.clear();
                }
                s.shared.clear();
            }
        }
        // An abandoned token nothing refers to any more can never matter again.
        let mut live = 0u64;
        if let Some(t) = s.lock {
            live |= 1u64 << t.0.min(63);
        }
        for op in s.inflight.iter().flatten() {
            if let Op::Acquire(t) | Op::Release(Some(t)) = *op {
                live |= 1u64 << t.0.min(63);
            }
        }
        for op in &s.shared {
            match op {
                Shared::Batch(ops) => ops.iter().for_each(|&(_, t)| live |= 1u64 << t.0.min(63)),
                Shared::Release(t) => live |= 1u64 << t.0.min(63),
            }
        }
        s.ghost.abandoned &= live;
        Some(Self::canonical(s))
    }

    fn is_fault(&self, a: &Action) -> bool {
        matches!(
            a,
            Action::TryLost(_)
                | Action::FlushLost
                | Action::Pause(_)
                | Action::Crash(_)
                | Action::Wipe
                | Action::ExpireOrphan
        )
    }

    fn check(&self, s: &Sys) -> Result<(), String> {
        match &s.ghost.violation {
            Some(v) => Err(v.clone()),
            None => Ok(()),
        }
    }

    fn is_terminal(&self, s: &Sys) -> bool {
        s.lock.is_none()
            && s.inflight.iter().all(Vec::is_empty)
            && s.queue.is_empty()
            && s.shared.is_empty()
            && s.clients.iter().all(|c| c.phase == Phase::Ended)
    }
}

#[cfg(test)]
mod tests {
    //! The mutex holds on small fleets, and each planted bug is found (2 clients × 2 rounds
    //! here, unoptimized; CI's model step runs 3 clients optimized).

    use super::*;
    use crate::check::{check_exhaustive, Limits, Outcome};
    use std::time::Duration;

    fn run(model: &MutexModel) -> Outcome<Sys> {
        let r = check_exhaustive(
            model,
            &Limits {
                max_states: 2_000_000,
                timeout: Duration::from_secs(120),
                liveness_steps: Some(64),
                fair_cycles: true,
            },
        );
        eprintln!("{:?}: {} states", model.mutation, r.states);
        r.outcome
    }

    const ALL: Faults = Faults {
        lost_replies: 1,
        pauses: 1,
        crashes: 1,
        wipes: 0,
    };

    fn mutated(watchdog: bool, faults: Faults, m: Mutation) -> MutexModel {
        let mut model = MutexModel::new(2, 2, watchdog, faults);
        model.mutation = Some(m);
        model
    }

    #[test]
    fn the_mutex_holds() {
        for watchdog in [true, false] {
            for faults in [
                ALL,
                Faults {
                    wipes: 1,
                    ..Faults::default()
                },
            ] {
                let outcome = run(&MutexModel::new(2, 2, watchdog, faults));
                assert!(matches!(outcome, Outcome::Exhausted), "{outcome}");
            }
        }
    }

    fn batching(faults: Faults, m: Option<Mutation>) -> MutexModel {
        let mut model = MutexModel::new(2, 2, true, faults);
        model.batching = true;
        model.mutation = m;
        model
    }

    #[test]
    fn the_mutex_holds_with_batched_calls() {
        for faults in [
            ALL,
            Faults {
                wipes: 1,
                lost_replies: 1,
                ..Faults::default()
            },
        ] {
            let outcome = run(&batching(faults, None));
            assert!(matches!(outcome, Outcome::Exhausted), "{outcome}");
        }
    }

    #[test]
    fn a_batch_grant_without_its_fence_step_is_found() {
        match run(&batching(
            Faults::default(),
            Some(Mutation::BatchSkipsFenceStep),
        )) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(cx.message.contains("went back"), "{}", cx.message);
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }

    #[test]
    fn a_batch_granting_one_lock_twice_is_found() {
        match run(&batching(
            Faults::default(),
            Some(Mutation::BatchGrantsTwice),
        )) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(cx.message.contains("still valid"), "{}", cx.message);
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }

    /// Runs the batched model with one lost reply, only on batched calls (the lone path's loss
    /// is covered above), and `mutation`: a lock must be left behind (a liveness violation).
    fn batched_loss_leaves_a_lock_behind(mutation: Mutation) {
        let faults = Faults {
            lost_replies: 1,
            ..Faults::default()
        };
        let mut model = batching(faults, Some(mutation));
        model.lone_lost = false;
        match run(&model) {
            Outcome::LivenessViolation(cx) => eprintln!("{cx}"),
            other => panic!("expected a liveness counterexample, got {other}"),
        }
    }

    #[test]
    fn a_lost_batch_whose_acquisitions_are_not_released_by_token_leaves_a_lock_behind() {
        batched_loss_leaves_a_lock_behind(Mutation::OrphansKept);
    }

    #[test]
    fn a_release_without_the_token_check_breaks_mutual_exclusion() {
        match run(&mutated(
            false,
            Faults::default(),
            Mutation::ReleaseWithoutTokenCheck,
        )) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(cx.message.contains("still valid"), "{}", cx.message);
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }

    #[test]
    fn a_batch_member_that_gave_up_and_is_not_released_leaves_a_lock_behind() {
        batched_loss_leaves_a_lock_behind(Mutation::GivenUpKept);
    }

    #[test]
    fn an_abandoned_acquisition_not_released_by_token_leaves_a_lock_behind() {
        let faults = Faults {
            lost_replies: 1,
            ..Faults::default()
        };
        match run(&mutated(true, faults, Mutation::OrphansKept)) {
            Outcome::LivenessViolation(cx) => {
                eprintln!("{cx}");
                assert!(
                    cx.message.contains("no fault-free path") || cx.message.contains("steps"),
                    "{}",
                    cx.message
                );
            }
            other => panic!("expected a liveness counterexample, got {other}"),
        }
    }

    #[test]
    fn fencing_tokens_without_the_time_floor_go_back_after_data_loss() {
        let faults = Faults {
            wipes: 1,
            ..Faults::default()
        };
        match run(&mutated(true, faults, Mutation::NoTimeFloor)) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(cx.message.contains("went back"), "{}", cx.message);
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }
}
