//! The failover protocol (DESIGN.md §4, as implemented) as a model for the checker.
//!
//! Workers are actors that observe (`WATCH` + reads, one step), decide with the library's own
//! [`decide_backup`] / [`decide_holder`], and send the `EXEC` that carries out the library's own
//! write plans ([`grant_writes`], [`exhaust_writes`], [`finish_writes`]) against the Redis
//! model of [`store`](super::store), keeping the [`BackupView`] with its own update methods.
//! Nothing here decides anything itself: what is modelled is the world around those functions.
//!
//! The world: every interleaving of the workers' steps; the lease key expiring as a step of its
//! own whenever nobody keeps it alive (with keepalive, only once its holder paused past it);
//! `EXEC` replies lost, the transaction then applying later or never; channel messages lost;
//! `WATCH` refused (`NOPERM`); a holder that pauses past its lease; crashes; `stop()`; and the
//! server restarting with or without its data. Time is logical: `TIME` reads as one more than
//! the highest fencing token ever committed (the server's clock has passed every token it
//! granted, across restarts too; a clock that goes back is the documented limit).
//!
//! Properties, checked on every state ([`Model::check`]):
//! - without data loss: no attempt is granted twice; at most `max_attempts` grants; no grant
//!   after `DONE` or `EXHAUSTED`; a holder is told `Completed` for its attempt only when its own
//!   `DONE` committed;
//! - always (data loss too): fencing tokens of committed grants only grow, the fenced resource
//!   never accepts a write of one grant after a higher token's, and never two grants with one
//!   token; a worker that had seen the state before Redis lost it never runs the job again.
//!
//! Liveness: from every reachable state, steps without faults end every worker.

use super::check::{fx_hash, Model};
use super::store::{Exec, Store, MAX_CONNS};
use baton::model_api::{
    decide_backup, decide_holder, exhaust_writes, finish_gave_up, finish_writes, grant_writes,
    keep_waiting, later_grant, taken_over, BackupView, Decision, Ending, Fault, Fence, GaveUp,
    HolderDecision, HolderOp, Lease, Message, Observation, PendingGrant, State, StateValue, Which,
    Write, WATCHED,
};

const STATE: usize = 0;
const LEASE: usize = 1;
const FENCE: usize = 2;

fn key(w: Which) -> usize {
    match w {
        Which::State => STATE,
        Which::Lease => LEASE,
        Which::Fence => FENCE,
    }
}

/// A lease token: the number of the draw (the library draws 128 random bits; only equality
/// matters, and a token names no worker, so workers can be permuted, see [`Sys::canonical`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Tok(u8);

impl Tok {
    fn text(self) -> String {
        self.0.to_string()
    }

    fn parse(s: &str) -> Option<Tok> {
        s.parse().ok().map(Tok)
    }
}

/// What a key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Val {
    State(StateValue),
    Lease(Tok),
    Fence(u64),
}

/// Faults (and `stop()`s) left to inject in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Faults {
    /// `EXEC` replies lost (the transaction applies later, or never).
    pub lost_replies: u8,
    /// Times a worker loses the channel messages delivered to it so far.
    pub lost_messages: u8,
    /// Holders that pause past their lease (keepalive only; without it a lease may always end).
    pub pauses: u8,
    /// Worker crashes.
    pub crashes: u8,
    /// `stop()` calls.
    pub stops: u8,
    /// `WATCH` refused with `NOPERM`.
    pub refusals: u8,
    /// Restarts that lose every key (no persistence).
    pub wipes: u8,
    /// Restarts that keep every key (`appendfsync always`).
    pub restarts: u8,
}

/// A deliberate bug, to show the checker finds it (the tests plant them).
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// Transitions do not `WATCH` these keys.
    Unwatch(&'static [Which]),
    /// A holder whose `DONE` reply was lost and who then reads `DONE` takes it as its own,
    /// without comparing the fencing token.
    DoneSkipsFenceCheck,
    /// A refused `WATCH` is ignored: the transition goes on unwatched.
    IgnoreWatchRefusal,
}

/// The failover model's parameters.
#[derive(Clone, Debug)]
pub(crate) struct Failover {
    pub workers: u8,
    pub max_attempts: u64,
    pub keepalive: bool,
    pub retry_delay: bool,
    pub rejoin_after_fail: bool,
    pub faults: Faults,
    pub mutation: Option<Mutation>,
}

/// The attempt a worker holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Hold {
    attempt: u64,
    fence: u64,
    tok: Tok,
    /// Its lease deadline passed (it paused, or could not extend).
    late: bool,
}

/// A transaction decided on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Tx {
    Grant {
        attempt: u64,
        fence: u64,
        tok: Tok,
    },
    Exhaust,
    /// `pending`: an earlier try's `EXEC` lost its reply (the flag lives across tries).
    Finish {
        ending: Ending,
        hold: Hold,
        pending: bool,
    },
}

/// How a worker ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Outcome {
    Completed(Option<u64>),
    Exhausted,
    Failed,
    LeaseLost,
    /// `OutcomeUnknown`.
    Unknown,
    StateLost,
    Error,
    Stopped,
    Crashed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// A backup about to observe.
    Idle,
    /// Observed under `WATCH` and decided: the `EXEC` is next.
    Exec(Tx),
    /// Waiting for the lease of this attempt to end, or a message.
    Waiting(u64),
    Holding(Hold),
    /// Ending the attempt: observe next (`pending`: an `EXEC` of it lost its reply).
    Finishing {
        hold: Hold,
        ending: Ending,
        pending: bool,
    },
    Ended(Outcome),
}

/// Channel messages delivered to a worker and not yet read, as a set: bit `n - 1` for
/// `acquired:n`, then the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Inbox(u16);

const RECONNECTED: u16 = 1 << 15;

impl Inbox {
    fn bit(m: Message) -> u16 {
        match m {
            Message::Acquired(n) => 1 << (n.clamp(1, 10) - 1),
            Message::Done => 1 << 10,
            Message::Failed => 1 << 11,
            Message::Released => 1 << 12,
            Message::Exhausted => 1 << 13,
        }
    }

    fn messages(self) -> impl Iterator<Item = String> {
        let all = (1..=10).map(Message::Acquired).chain([
            Message::Done,
            Message::Failed,
            Message::Released,
            Message::Exhausted,
        ]);
        all.filter(move |m| self.0 & Inbox::bit(*m) != 0)
            .map(|m| m.text().into_owned())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Worker {
    view: BackupView,
    phase: Phase,
    inbox: Inbox,
    /// The highest attempt this worker had seen when Redis lost its data (a ghost: for the
    /// property that it never runs one of those attempts again).
    seen_before_loss: Option<u64>,
}

/// A transaction whose reply was lost, not yet processed by the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Inflight {
    conn: u8,
    worker: u8,
    tx: Tx,
}

/// What the properties need to know about the past.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Ghost {
    /// Attempts granted (bit `n`), and how many grants.
    granted: u16,
    grants: u8,
    /// `DONE` or `EXHAUSTED` was committed.
    terminal: bool,
    /// The grant whose `DONE` committed.
    done_by: Option<Tok>,
    /// The highest fencing token committed (`TIME` reads one more).
    last_fence: u64,
    /// Redis lost its data.
    wiped: bool,
    violation: Option<String>,
}

/// One state of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sys {
    store: Store<Val, 3>,
    workers: Vec<Worker>,
    inflight: Vec<Inflight>,
    faults: Faults,
    ghost: Ghost,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// `WATCH` and read, then decide.
    Observe(u8),
    /// Send the `EXEC` and read its reply.
    Exec(u8),
    /// Send the `EXEC`; the reply is lost (fault).
    ExecLost(u8),
    /// A waiting backup wakes (a message, or the lease's time ran out).
    Wake(u8),
    /// The holder's `done()`, `fail()` or `stop()`.
    Finish(u8, Ending),
    /// The keepalive script.
    Extend(u8),
    /// A holder reads its channel messages.
    Notice(u8),
    /// A holder's lease deadline fires.
    DeadlineLost(u8),
    /// A finish gives up at the lease deadline.
    GiveUp(u8),
    /// `stop()` of a backup.
    Stop(u8),
    Crash(u8),
    /// A holder pauses past its lease (fault).
    Pause(u8),
    /// `WATCH` refused (fault).
    Refuse(u8),
    /// A worker loses its unread messages (fault).
    LoseMessages(u8),
    /// The lease key's TTL runs out.
    ExpireLease,
    /// The server processes a transaction in flight.
    Apply(u8),
    /// ...or never does.
    Drop(u8),
    /// Redis restarts without its data (fault).
    Wipe,
    /// Redis restarts with its data (fault).
    Restart,
}

impl Failover {
    /// The model as the library runs: no mutation.
    pub(crate) fn new(workers: u8, max_attempts: u64, keepalive: bool, faults: Faults) -> Self {
        Failover {
            workers,
            max_attempts,
            keepalive,
            retry_delay: false,
            rejoin_after_fail: false,
            faults,
            mutation: None,
        }
    }

    fn watched(&self) -> Vec<usize> {
        WATCHED
            .iter()
            .filter(|w| !matches!(self.mutation, Some(Mutation::Unwatch(off)) if off.contains(w)))
            .map(|w| key(*w))
            .collect()
    }

    fn observation(&self, s: &Sys, with_fence: bool) -> Observation {
        let state = match s.store.get(STATE) {
            Some(Val::State(StateValue::Attempt(n))) => State::Attempt(*n),
            Some(Val::State(StateValue::Done)) => State::Done,
            Some(Val::State(StateValue::Exhausted)) => State::Exhausted,
            Some(other) => State::Corrupt(format!("{other:?}")),
            None => State::Absent,
        };
        let lease = match s.store.get(LEASE) {
            Some(Val::Lease(t)) => Lease::Held {
                token: t.text(),
                holder: String::new(),
                pttl_ms: Some(1_000),
            },
            Some(other) => Lease::Corrupt(format!("{other:?}")),
            None => Lease::Absent,
        };
        let fence = match s.store.get(FENCE) {
            _ if !with_fence => Fence::Absent,
            Some(Val::Fence(f)) => Fence::Value(*f),
            Some(other) => Fence::Corrupt(format!("{other:?}")),
            None => Fence::Absent,
        };
        Observation {
            state,
            lease,
            fence,
            now_us: if with_fence {
                s.ghost.last_fence + 1
            } else {
                0
            },
        }
    }

    /// Whether a live holder keeps the lease `tok` alive (so it cannot expire without a fault).
    fn kept_alive(&self, s: &Sys, tok: Tok) -> bool {
        self.keepalive
            && s.workers.iter().any(|w| match w.phase {
                Phase::Holding(h) => h.tok == tok && !h.late,
                Phase::Finishing { hold, pending, .. } => hold.tok == tok && !hold.late && !pending,
                Phase::Exec(Tx::Finish { hold, pending, .. }) => {
                    hold.tok == tok && !hold.late && !pending
                }
                _ => false,
            })
    }

    fn decide_holder(
        &self,
        obs: &Observation,
        hold: Hold,
        op: HolderOp,
        pending: bool,
    ) -> HolderDecision {
        if self.mutation == Some(Mutation::DoneSkipsFenceCheck)
            && op == HolderOp::Done
            && pending
            && obs.state == State::Done
        {
            return HolderDecision::AlreadyApplied;
        }
        decide_holder(obs, hold.attempt, &hold.tok.text(), hold.fence, op, pending)
    }

    fn end(&self, s: &mut Sys, i: usize, outcome: Outcome) {
        if let Outcome::Completed(Some(attempt)) = outcome {
            let hold_tok = match s.workers[i].phase {
                Phase::Finishing { hold, .. } | Phase::Exec(Tx::Finish { hold, .. }) => {
                    Some(hold.tok)
                }
                _ => None,
            };
            if !s.ghost.wiped && (hold_tok.is_none() || s.ghost.done_by != hold_tok) {
                violate(
                    s,
                    format!("worker {i} was told Completed for attempt {attempt}, but its own DONE did not commit"),
                );
            }
        }
        s.workers[i].phase = Phase::Ended(outcome);
        s.workers[i].inbox = Inbox::default();
    }

    fn fault_outcome(f: &Fault) -> Outcome {
        match f {
            Fault::StateLost { .. } => Outcome::StateLost,
            _ => Outcome::Error,
        }
    }

    /// Round trip 1 and the decision, for a backup or a finishing holder.
    fn observe(&self, s: &mut Sys, i: usize, watch: bool) {
        let obs = self.observation(s, true);
        let conn = i;
        let fresh = fresh_token(&s.store, &s.workers, &s.inflight, &s.ghost);
        let w = &mut s.workers[i];
        match w.phase {
            Phase::Idle => {
                let d = decide_backup(&obs, &w.view);
                w.view.observed(&obs, &d);
                let phase = match d {
                    Decision::Grant { attempt, fence, .. } => {
                        let tok = fresh;
                        Phase::Exec(Tx::Grant {
                            attempt,
                            fence,
                            tok,
                        })
                    }
                    Decision::WriteExhausted { .. } => Phase::Exec(Tx::Exhaust),
                    Decision::Resume {
                        attempt,
                        fence,
                        token,
                        ..
                    } => {
                        w.view.resumed(fence);
                        match Tok::parse(&token) {
                            Some(tok) => Phase::Holding(Hold {
                                attempt,
                                fence,
                                tok,
                                late: false,
                            }),
                            None => Phase::Ended(Outcome::Error),
                        }
                    }
                    Decision::Completed => Phase::Ended(Outcome::Completed(None)),
                    Decision::Exhausted { .. } => Phase::Ended(Outcome::Exhausted),
                    Decision::Wait { attempt, .. } => Phase::Waiting(attempt),
                    Decision::Delay { attempt } => {
                        w.view.delay_served(attempt);
                        Phase::Idle
                    }
                    Decision::Fault(f) => Phase::Ended(Self::fault_outcome(&f)),
                };
                w.phase = phase;
                if matches!(phase, Phase::Exec(_)) && watch {
                    s.store.watch(conn, &self.watched());
                }
            }
            Phase::Finishing {
                hold,
                ending,
                pending,
            } => match self.decide_holder(&obs, hold, ending.op(), pending) {
                HolderDecision::Commit => {
                    w.phase = Phase::Exec(Tx::Finish {
                        ending,
                        hold,
                        pending,
                    });
                    if watch {
                        s.store.watch(conn, &self.watched());
                    }
                }
                HolderDecision::AlreadyApplied => self.finished(s, i, hold, ending),
                HolderDecision::Lost(_) => self.end(s, i, Outcome::LeaseLost),
                HolderDecision::Unknown(_) => self.end(s, i, Outcome::Unknown),
                HolderDecision::Fault(f) => self.end(s, i, Self::fault_outcome(&f)),
            },
            _ => {}
        }
    }

    /// A finish that succeeded (written now, or found applied).
    fn finished(&self, s: &mut Sys, i: usize, hold: Hold, ending: Ending) {
        match ending {
            Ending::Done => self.end(s, i, Outcome::Completed(Some(hold.attempt))),
            Ending::Release => self.end(s, i, Outcome::Stopped),
            Ending::Fail if hold.attempt >= self.max_attempts => self.end(s, i, Outcome::Exhausted),
            Ending::Fail if self.rejoin_after_fail => {
                let w = &mut s.workers[i];
                w.view.delay_served(hold.attempt);
                w.phase = Phase::Idle;
            }
            Ending::Fail => self.end(s, i, Outcome::Failed),
        }
    }

    /// The server applies `tx` (sent by worker `from`): the write plan, and the properties
    /// about grants and `DONE`.
    fn apply(&self, s: &mut Sys, from: usize, tx: Tx) {
        let writes: Vec<Write> = match tx {
            Tx::Grant { attempt, fence, .. } => {
                let g = &mut s.ghost;
                let mut bad = Vec::new();
                if !g.wiped {
                    if g.granted & (1 << attempt.min(15)) != 0 {
                        bad.push(format!("attempt {attempt} granted twice"));
                    }
                    if u64::from(g.grants) + 1 > self.max_attempts {
                        bad.push(format!(
                            "grant number {} with max_attempts {}",
                            g.grants + 1,
                            self.max_attempts
                        ));
                    }
                    if g.terminal {
                        bad.push(format!("attempt {attempt} granted after DONE or EXHAUSTED"));
                    }
                }
                if fence <= g.last_fence {
                    bad.push(format!(
                        "fencing token went back: {fence} after {}",
                        g.last_fence
                    ));
                }
                if let Some(seen) = s.workers[from]
                    .seen_before_loss
                    .filter(|seen| attempt <= *seen)
                {
                    bad.push(format!(
                        "worker {from} had seen attempt {seen} before Redis lost its data, and \
                         ran attempt {attempt} again"
                    ));
                }
                g.granted |= 1 << attempt.min(15);
                g.grants = g.grants.saturating_add(1);
                g.last_fence = g.last_fence.max(fence);
                for b in bad {
                    violate(s, b);
                }
                grant_writes(attempt, fence).to_vec()
            }
            Tx::Exhaust => exhaust_writes().to_vec(),
            Tx::Finish { ending, hold, .. } => {
                finish_writes(ending, hold.attempt, self.max_attempts)
            }
        };
        for w in writes {
            match w {
                Write::SetState(v) => {
                    if !matches!(v, StateValue::Attempt(_)) {
                        s.ghost.terminal = true;
                    }
                    if v == StateValue::Done {
                        s.ghost.done_by = match tx {
                            Tx::Finish { hold, .. } => Some(hold.tok),
                            _ => None,
                        };
                    }
                    s.store.set(STATE, Val::State(v));
                }
                Write::KeepState => {
                    s.store.refresh(STATE);
                }
                Write::SetLease => {
                    if let Tx::Grant { tok, .. } = tx {
                        s.store.set(LEASE, Val::Lease(tok));
                    }
                }
                Write::DelLease => {
                    s.store.del(LEASE);
                }
                Write::SetFence(f) => s.store.set(FENCE, Val::Fence(f)),
                Write::KeepFence => {
                    s.store.refresh(FENCE);
                }
                Write::SetFailure => {}
                Write::Publish(m) => {
                    for w in &mut s.workers {
                        if !matches!(w.phase, Phase::Ended(_)) {
                            w.inbox.0 |= Inbox::bit(m);
                        }
                    }
                }
            }
        }
    }

    /// A worker's `EXEC` failed without applying, or lost its reply: what it concludes.
    fn indeterminate(&self, s: &mut Sys, i: usize, tx: Tx) {
        let w = &mut s.workers[i];
        match tx {
            Tx::Grant {
                attempt,
                fence,
                tok,
            } => {
                w.view.remember_pending(PendingGrant {
                    attempt,
                    token: tok.text(),
                    fence,
                });
                w.phase = Phase::Idle;
            }
            Tx::Exhaust => w.phase = Phase::Idle,
            Tx::Finish { ending, hold, .. } => {
                w.phase = Phase::Finishing {
                    hold,
                    ending,
                    pending: true,
                }
            }
        }
    }

    fn exec(&self, s: &mut Sys, i: usize, tx: Tx) {
        match s.store.exec(i) {
            Exec::Applied => {
                self.apply(s, i, tx);
                match tx {
                    Tx::Grant {
                        attempt,
                        fence,
                        tok,
                    } => {
                        let w = &mut s.workers[i];
                        w.view.granted(attempt, fence);
                        w.phase = Phase::Holding(Hold {
                            attempt,
                            fence,
                            tok,
                            late: false,
                        });
                    }
                    Tx::Exhaust => self.end(s, i, Outcome::Exhausted),
                    Tx::Finish { ending, hold, .. } => self.finished(s, i, hold, ending),
                }
            }
            Exec::Aborted => {
                s.workers[i].phase = match tx {
                    Tx::Finish {
                        ending,
                        hold,
                        pending,
                    } => Phase::Finishing {
                        hold,
                        ending,
                        pending,
                    },
                    _ => Phase::Idle,
                };
            }
            Exec::Broken => self.indeterminate(s, i, tx),
        }
    }

    fn restart(&self, s: &mut Sys, keep_data: bool) {
        if !keep_data {
            s.ghost.wiped = true;
            for w in &mut s.workers {
                w.seen_before_loss = w.view.seen.max(w.seen_before_loss);
            }
        }
        s.store.restart(keep_data);
        for f in std::mem::take(&mut s.inflight) {
            s.store.unwatch(f.conn as usize);
        }
        for w in &mut s.workers {
            if !matches!(w.phase, Phase::Ended(_)) {
                w.inbox.0 |= RECONNECTED;
            }
        }
    }
}

impl Sys {
    /// Puts the workers in a canonical order (by a hash of everything that belongs to each),
    /// renumbering their connections and the requests they have in flight along with them.
    /// Workers are interchangeable (same configuration; tokens name no worker) and every
    /// property treats them alike, so states that differ only by a permutation of workers are
    /// one state for the checker: this divides the state space by up to `workers!`.
    fn canonical(mut self) -> Sys {
        let n = self.workers.len();
        let keys: Vec<u64> = (0..n)
            .map(|i| {
                let own: Vec<&Inflight> = self
                    .inflight
                    .iter()
                    .filter(|f| f.worker as usize == i)
                    .collect();
                fx_hash(&(
                    &self.workers[i],
                    self.store.conn_bits(i),
                    own.iter()
                        .map(|f| (f.tx, self.store.conn_bits(f.conn as usize)))
                        .collect::<Vec<_>>(),
                ))
            })
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| keys[i]);
        if order.iter().enumerate().all(|(pos, &i)| pos == i) {
            return self;
        }
        // `order[new] = old`; `map[old] = new`.
        let mut map = vec![0; n];
        for (new, &old) in order.iter().enumerate() {
            map[old] = new;
        }
        self.workers = order.iter().map(|&old| self.workers[old].clone()).collect();
        self.store.rename_conns(&map);
        for f in &mut self.inflight {
            f.worker = map[f.worker as usize] as u8;
        }
        self.inflight.sort_by_key(|f| (f.worker, f.conn));
        self
    }
}

/// A token no part of the state refers to: the smallest such number. A token nothing refers to
/// can never be compared with again, so reusing its number changes no behaviour, and states
/// that differ only in how many tokens were drawn before are one state.
fn fresh_token(
    store: &Store<Val, 3>,
    workers: &[Worker],
    inflight: &[Inflight],
    ghost: &Ghost,
) -> Tok {
    let mut used: u64 = 0;
    let mut mark = |t: Tok| used |= 1u64 << t.0.min(63);
    if let Some(Val::Lease(t)) = store.get(LEASE) {
        mark(*t);
    }
    if let Some(t) = ghost.done_by {
        mark(t);
    }
    let tx_tok = |tx: &Tx| match tx {
        Tx::Grant { tok, .. } => Some(*tok),
        Tx::Finish { hold, .. } => Some(hold.tok),
        Tx::Exhaust => None,
    };
    for f in inflight {
        if let Some(t) = tx_tok(&f.tx) {
            mark(t);
        }
    }
    for w in workers {
        match &w.phase {
            Phase::Exec(tx) => {
                if let Some(t) = tx_tok(tx) {
                    mark(t);
                }
            }
            Phase::Holding(h) | Phase::Finishing { hold: h, .. } => mark(h.tok),
            _ => {}
        }
        for p in &w.view.pending {
            if let Some(t) = Tok::parse(&p.token) {
                mark(t);
            }
        }
    }
    Tok(used.trailing_ones() as u8)
}

fn violate(s: &mut Sys, message: String) {
    if s.ghost.violation.is_none() {
        s.ghost.violation = Some(message);
    }
}

impl Model for Failover {
    type State = Sys;
    type Action = Action;

    fn init(&self) -> Vec<Sys> {
        let worker = Worker {
            view: BackupView {
                max_attempts: self.max_attempts,
                has_retry_delay: self.retry_delay,
                ..BackupView::default()
            },
            phase: Phase::Idle,
            inbox: Inbox::default(),
            seen_before_loss: None,
        };
        vec![Sys {
            store: Store::new(),
            workers: vec![worker; self.workers as usize],
            inflight: Vec::new(),
            faults: self.faults,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, s: &Sys, out: &mut Vec<Action>) {
        let f = &s.faults;
        let free_conn = s.inflight.len() + (self.workers as usize) < MAX_CONNS;
        for (i, w) in s.workers.iter().enumerate() {
            let i = i as u8;
            match w.phase {
                Phase::Ended(_) => continue,
                Phase::Idle => {
                    out.push(Action::Observe(i));
                    if f.refusals > 0 {
                        out.push(Action::Refuse(i));
                    }
                }
                Phase::Exec(tx) => {
                    out.push(Action::Exec(i));
                    if f.lost_replies > 0 && free_conn {
                        out.push(Action::ExecLost(i));
                    }
                    if let Tx::Finish {
                        ending: Ending::Done,
                        hold,
                        ..
                    } = tx
                    {
                        if w.inbox.messages().any(|m| later_grant(&m, hold.attempt)) {
                            out.push(Action::Notice(i));
                        }
                    }
                }
                Phase::Waiting(attempt) => {
                    let obs = self.observation(s, false);
                    let lease = match obs.lease {
                        Lease::Held { pttl_ms, .. } => Some(pttl_ms),
                        _ => None,
                    };
                    if w.inbox.0 != 0 || keep_waiting(&obs.state, lease, attempt).is_none() {
                        out.push(Action::Wake(i));
                    }
                }
                Phase::Holding(h) => {
                    out.push(Action::Finish(i, Ending::Done));
                    out.push(Action::Finish(i, Ending::Fail));
                    if f.stops > 0 {
                        out.push(Action::Finish(i, Ending::Release));
                    }
                    if self.keepalive && !h.late {
                        out.push(Action::Extend(i));
                        if f.pauses > 0 {
                            out.push(Action::Pause(i));
                        }
                    }
                    if self.keepalive && h.late {
                        out.push(Action::DeadlineLost(i));
                    }
                    if w.inbox.0 != 0 {
                        out.push(Action::Notice(i));
                    }
                }
                Phase::Finishing {
                    hold,
                    ending,
                    pending,
                } => {
                    out.push(Action::Observe(i));
                    if f.refusals > 0 {
                        out.push(Action::Refuse(i));
                    }
                    if pending || hold.late {
                        out.push(Action::GiveUp(i));
                    }
                    if self.keepalive && !hold.late && f.pauses > 0 {
                        out.push(Action::Pause(i));
                    }
                    if ending == Ending::Done
                        && w.inbox.messages().any(|m| later_grant(&m, hold.attempt))
                    {
                        out.push(Action::Notice(i));
                    }
                }
            }
            if matches!(
                w.phase,
                Phase::Idle | Phase::Waiting(_) | Phase::Exec(Tx::Grant { .. } | Tx::Exhaust)
            ) && f.stops > 0
            {
                out.push(Action::Stop(i));
            }
            // A backup that crashes is one that stopped (it holds nothing, and a request it
            // has in flight lives on without it): only holders crash, leaving their lease.
            if f.crashes > 0
                && matches!(
                    w.phase,
                    Phase::Holding(_) | Phase::Finishing { .. } | Phase::Exec(Tx::Finish { .. })
                )
            {
                out.push(Action::Crash(i));
            }
            if f.lost_messages > 0 && w.inbox.0 != 0 {
                out.push(Action::LoseMessages(i));
            }
        }
        if let Some(Val::Lease(tok)) = s.store.get(LEASE) {
            if !self.kept_alive(s, *tok) {
                out.push(Action::ExpireLease);
            }
        }
        for k in 0..s.inflight.len() {
            out.push(Action::Apply(k as u8));
            out.push(Action::Drop(k as u8));
        }
        if f.wipes > 0 {
            out.push(Action::Wipe);
        }
        if f.restarts > 0 {
            out.push(Action::Restart);
        }
    }

    fn next(&self, s: &Sys, a: &Action) -> Option<Sys> {
        let mut s = s.clone();
        match *a {
            Action::Observe(i) => self.observe(&mut s, i as usize, true),
            Action::Refuse(i) => {
                s.faults.refusals -= 1;
                if self.mutation == Some(Mutation::IgnoreWatchRefusal) {
                    self.observe(&mut s, i as usize, false);
                } else {
                    // The library: a refused WATCH is a non-retryable `Permission` error.
                    self.end(&mut s, i as usize, Outcome::Error);
                }
            }
            Action::Exec(i) => {
                let Phase::Exec(tx) = s.workers[i as usize].phase else {
                    return None;
                };
                self.exec(&mut s, i as usize, tx);
            }
            Action::ExecLost(i) => {
                let Phase::Exec(tx) = s.workers[i as usize].phase else {
                    return None;
                };
                s.faults.lost_replies -= 1;
                let used: u16 = s.inflight.iter().fold(0, |a, f| a | 1 << f.conn);
                let conn = (self.workers as usize..MAX_CONNS).find(|c| used & (1 << c) == 0)?;
                s.store.move_conn(i as usize, conn);
                s.inflight.push(Inflight {
                    conn: conn as u8,
                    worker: i,
                    tx,
                });
                s.inflight.sort_by_key(|f| (f.worker, f.conn));
                self.indeterminate(&mut s, i as usize, tx);
            }
            Action::Apply(k) => {
                let f = s.inflight.remove(k as usize);
                if s.store.exec(f.conn as usize) == Exec::Applied {
                    self.apply(&mut s, f.worker as usize, f.tx);
                }
            }
            Action::Drop(k) => {
                let f = s.inflight.remove(k as usize);
                s.store.unwatch(f.conn as usize);
            }
            Action::Wake(i) => {
                let w = &mut s.workers[i as usize];
                w.inbox = Inbox::default();
                w.phase = Phase::Idle;
            }
            Action::Finish(i, ending) => {
                let Phase::Holding(hold) = s.workers[i as usize].phase else {
                    return None;
                };
                if ending == Ending::Release {
                    s.faults.stops -= 1;
                }
                s.workers[i as usize].phase = Phase::Finishing {
                    hold,
                    ending,
                    pending: false,
                };
            }
            Action::Extend(i) => {
                let Phase::Holding(h) = s.workers[i as usize].phase else {
                    return None;
                };
                let ours = s.store.get(LEASE) == Some(&Val::Lease(h.tok))
                    && s.store.get(STATE) == Some(&Val::State(StateValue::Attempt(h.attempt)));
                if ours {
                    s.store.refresh(LEASE);
                    s.store.refresh(STATE);
                    s.store.refresh(FENCE);
                } else {
                    let obs = self.observation(&s, false);
                    let outcome = match self.decide_holder(&obs, h, HolderOp::Extend, false) {
                        HolderDecision::Lost(_) => Outcome::LeaseLost,
                        HolderDecision::Fault(f) => Self::fault_outcome(&f),
                        _ => Outcome::Error,
                    };
                    self.end(&mut s, i as usize, outcome);
                }
            }
            Action::Notice(i) => {
                let idx = i as usize;
                let inbox = s.workers[idx].inbox;
                s.workers[idx].inbox = Inbox::default();
                match s.workers[idx].phase {
                    Phase::Holding(h) => {
                        if inbox.messages().any(|m| taken_over(&m, h.attempt)) {
                            self.end(&mut s, idx, Outcome::LeaseLost);
                        } else if inbox.0 & RECONNECTED != 0 && !self.keepalive {
                            // `still_ours`: one plain read, judged as a `done()` would be.
                            let obs = self.observation(&s, false);
                            if let HolderDecision::Lost(_) =
                                self.decide_holder(&obs, h, HolderOp::Done, false)
                            {
                                self.end(&mut s, idx, Outcome::LeaseLost);
                            }
                        }
                    }
                    Phase::Finishing { hold, .. } | Phase::Exec(Tx::Finish { hold, .. }) => {
                        if inbox.messages().any(|m| later_grant(&m, hold.attempt)) {
                            if matches!(s.workers[idx].phase, Phase::Exec(_)) {
                                s.store.unwatch(idx);
                            }
                            self.end(&mut s, idx, Outcome::LeaseLost);
                        }
                    }
                    _ => return None,
                }
            }
            Action::DeadlineLost(i) => self.end(&mut s, i as usize, Outcome::LeaseLost),
            Action::GiveUp(i) => {
                let Phase::Finishing {
                    ending, pending, ..
                } = s.workers[i as usize].phase
                else {
                    return None;
                };
                let outcome = match finish_gave_up(ending, pending) {
                    GaveUp::OutcomeUnknown => Outcome::Unknown,
                    GaveUp::LeaseLost => Outcome::LeaseLost,
                };
                self.end(&mut s, i as usize, outcome);
            }
            Action::Stop(i) => {
                s.faults.stops -= 1;
                s.store.unwatch(i as usize);
                self.end(&mut s, i as usize, Outcome::Stopped);
            }
            Action::Crash(i) => {
                s.faults.crashes -= 1;
                s.store.unwatch(i as usize);
                self.end(&mut s, i as usize, Outcome::Crashed);
            }
            Action::Pause(i) => {
                s.faults.pauses -= 1;
                match &mut s.workers[i as usize].phase {
                    Phase::Holding(h) | Phase::Finishing { hold: h, .. } => h.late = true,
                    _ => return None,
                }
            }
            Action::LoseMessages(i) => {
                s.faults.lost_messages -= 1;
                s.workers[i as usize].inbox = Inbox::default();
            }
            Action::ExpireLease => {
                s.store.del(LEASE);
            }
            Action::Wipe => {
                s.faults.wipes -= 1;
                self.restart(&mut s, false);
            }
            Action::Restart => {
                s.faults.restarts -= 1;
                self.restart(&mut s, true);
            }
        }
        Some(s.canonical())
    }

    fn is_fault(&self, a: &Action) -> bool {
        matches!(
            a,
            Action::ExecLost(_)
                | Action::Crash(_)
                | Action::Pause(_)
                | Action::Refuse(_)
                | Action::LoseMessages(_)
                | Action::Stop(_)
                | Action::Finish(_, Ending::Release)
                | Action::Wipe
                | Action::Restart
        )
    }

    fn check(&self, s: &Sys) -> Result<(), String> {
        match &s.ghost.violation {
            Some(v) => Err(v.clone()),
            None => Ok(()),
        }
    }

    fn is_terminal(&self, s: &Sys) -> bool {
        s.inflight.is_empty() && s.workers.iter().all(|w| matches!(w.phase, Phase::Ended(_)))
    }
}

#[cfg(test)]
mod tests {
    //! The protocol holds on small fleets, and each deliberate bug is found with a trace. These
    //! run unoptimized with every `cargo test`, so they use 2 workers × 2 attempts; CI's model
    //! step runs 3 × 3 optimized (`examples/model.rs`).

    use super::*;
    use crate::check::{check_exhaustive, Counterexample, Limits, Outcome, Report};
    use std::time::Duration;

    fn check(model: &Failover) -> Report<Sys> {
        check_exhaustive(
            model,
            &Limits {
                max_states: 5_000_000,
                timeout: Duration::from_secs(300),
                liveness_steps: Some(64),
                fair_cycles: true,
            },
        )
    }

    fn small(keepalive: bool, faults: Faults) -> Failover {
        Failover::new(2, 2, keepalive, faults)
    }

    fn mutated(mut model: Failover, mutation: Mutation) -> Failover {
        model.mutation = Some(mutation);
        model
    }

    /// The search found a safety violation; returns its trace (printed for the test log).
    fn violation(model: &Failover) -> Counterexample<Sys> {
        let r = check(model);
        match r.outcome {
            Outcome::Violation(cx) => {
                eprintln!(
                    "{:?}: {} states; counterexample:\n{cx}",
                    model.mutation, r.states
                );
                assert!(!cx.steps.is_empty(), "a trace leads there");
                cx
            }
            other => panic!(
                "{:?}: expected a counterexample, got {other}",
                model.mutation
            ),
        }
    }

    fn holds(model: &Failover) -> usize {
        let r = check(model);
        assert!(
            matches!(r.outcome, Outcome::Exhausted),
            "{model:?}: {}",
            r.outcome
        );
        r.states
    }

    const LOST_REPLY: Faults = Faults {
        lost_replies: 1,
        lost_messages: 0,
        pauses: 0,
        crashes: 0,
        stops: 0,
        refusals: 0,
        wipes: 0,
        restarts: 0,
    };

    #[test]
    fn the_protocol_holds_on_two_workers_and_two_attempts() {
        // Small budgets: this runs unoptimized; the 3 × 3 suite has the larger ones.
        let faults = Faults {
            pauses: 1,
            crashes: 1,
            ..LOST_REPLY
        };
        let wipe = Faults {
            wipes: 1,
            ..Faults::default()
        };
        for keepalive in [true, false] {
            for f in [faults, wipe] {
                let n = holds(&small(keepalive, f));
                eprintln!("keepalive={keepalive}, {f:?}: {n} states");
            }
        }
    }

    #[test]
    fn without_any_watch_an_attempt_is_granted_twice() {
        let cx = violation(&mutated(
            small(false, Faults::default()),
            Mutation::Unwatch(&[Which::State, Which::Lease, Which::Fence]),
        ));
        assert!(cx.message.contains("granted twice"), "{}", cx.message);
    }

    #[test]
    fn without_the_state_watch_a_late_done_and_a_takeover_both_commit() {
        // The fence is watched too and every transition writes or refreshes it, so while the
        // fence key exists it covers for the state's WATCH (next test); a late `done()` finds
        // the lease gone and its `DEL` changes nothing, so with the fence unwatched as well
        // only the state's WATCH stands between it and a backup's takeover.
        let cx = violation(&mutated(
            small(false, Faults::default()),
            Mutation::Unwatch(&[Which::State, Which::Fence]),
        ));
        assert!(cx.message.contains("after DONE"), "{}", cx.message);
    }

    #[test]
    fn the_state_watch_alone_is_covered_by_the_fence_watch() {
        // Dropping only the state's WATCH breaks nothing the checker can reach, faults
        // included: every write to the state comes with a write or `PEXPIRE` of the fence in
        // the same transaction (and the fence exists whenever the state does), so the fence's
        // WATCH aborts the same `EXEC`s. The state stays watched (it is what the decisions
        // read); this test pins down why that is defence in depth, not the only guard.
        let model = mutated(
            small(
                false,
                Faults {
                    crashes: 1,
                    pauses: 1,
                    ..LOST_REPLY
                },
            ),
            Mutation::Unwatch(&[Which::State]),
        );
        holds(&model);
    }

    #[test]
    fn a_done_that_skips_its_fence_check_claims_a_later_attempts_completion() {
        let cx = violation(&mutated(
            small(false, LOST_REPLY),
            Mutation::DoneSkipsFenceCheck,
        ));
        assert!(cx.message.contains("told Completed"), "{}", cx.message);
    }

    #[test]
    fn an_ignored_watch_refusal_grants_an_attempt_twice() {
        let refusal = Faults {
            refusals: 1,
            ..Faults::default()
        };
        let cx = violation(&mutated(
            small(false, refusal),
            Mutation::IgnoreWatchRefusal,
        ));
        assert!(
            cx.message.contains("granted twice") || cx.message.contains("after DONE"),
            "{}",
            cx.message
        );
        // The library's handling (the worker ends with `Permission`) holds.
        holds(&small(false, refusal));
    }
}
