//! Run-or-enqueue (`src/queue/`, scripts in `src/lease/items.rs`) as a model for the checker.
//!
//! Posters post one item per round (the enqueue-or-acquire script: `XADD` and the fenced
//! acquisition, atomically); the one granted drains: reads the stream (a snapshot, oldest
//! first), hands each item to a fenced sink, acks it (`XDEL` only while the lock holds its
//! token), and lets go with "release if empty", draining again when items arrived meanwhile.
//! The holder's step after a release is the library's own [`release_step`].
//!
//! Faults: lost replies (a post whose script ran: the caller sees a timeout, its armed hold
//! releases by token, forced, through a task, and it posts again; a release whose script ran:
//! the holder retries, uncertain), holders pausing past their lease (a stale holder may keep
//! going until it notices), crashes (the process restarts and calls `drain` until it once
//! holds the key: the documented recovery). A lock no valid holder vouches for may run out at
//! any step. A caller whose hold ended with the lease lost (`Error::LockLost`) recovers as after
//! a crash: it calls `drain` until it holds the key once (without that, the items posted under
//! its stale lock wait for the next call on the key: the checker finds that too).
//!
//! The sink accepts an item's effect iff the token is not below the highest it has seen, and
//! records the item's id (a redelivered id is not applied twice: at most once per id).
//!
//! Properties:
//! - no item lost, at every state: every posted item is applied by the sink or still queued
//!   (at-least-once);
//! - the sink never refuses a valid holder (one whose lease has not passed);
//! - fencing tokens strictly increase;
//! - liveness: fault-free steps end every client with no lock left and the stream empty (an
//!   item posted while the holder finishes causes one more run, never zero).

use super::check::Model;
use crate::error::Error;
use crate::queue::items::Release;
use crate::queue::{release_step, ReleaseStep};

/// A lock token: client `c`'s `k`-th hold is `c * 8 + k`.
type Tok = u8;

/// Faults left to inject in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Faults {
    /// Post or release replies lost (the script ran).
    pub lost_replies: u8,
    /// Holders pausing past their lease.
    pub pauses: u8,
    /// Client crashes (a restart then drains).
    pub crashes: u8,
}

/// A deliberate bug, to show the checker finds it.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// The holder lets go with a plain release by token, not "release if empty".
    PlainRelease,
    /// The ack deletes the item without checking the lock still holds the token.
    AckWithoutTokenCheck,
    /// The release script does not say whether items wait when the lock is not the caller's
    /// (as before the model found the gap): a holder whose earlier try's reply was lost takes
    /// "not ours" for "released".
    TrustUncertainRelease,
}

/// The model's parameters.
#[derive(Clone, Debug)]
pub(crate) struct QueueModel {
    pub clients: u8,
    /// Items each client posts.
    pub rounds: u8,
    pub faults: Faults,
    pub mutation: Option<Mutation>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Step {
    Read,
    /// The batch read (item ids, oldest first, as a bit set in posting order), and whether its
    /// first item was handled (not yet acked).
    Batch {
        items: u16,
        handled: bool,
    },
    Release {
        uncertain: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    Draining {
        tok: Tok,
        fence: u64,
        valid: bool,
        step: Step,
    },
    /// Restarted after a crash: calls `drain` until it holds the key once.
    Sweep,
    Ended,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Client {
    phase: Phase,
    /// Items posted so far.
    round: u8,
    /// Holds taken so far (for fresh tokens).
    holds: u8,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Ghost {
    last_fence: u64,
    /// Items posted (bit `n`: the `n`-th item the server appended).
    posted: u16,
    violation: Option<String>,
}

/// One state of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sys {
    lock: Option<Tok>,
    fence: u64,
    /// Queued items (bit `n`: item `n`); stream order is id order.
    stream: u16,
    /// The sink's highest accepted token, and the items it applied.
    sink_fence: u64,
    applied: u16,
    clients: Vec<Client>,
    /// Per client, a forced release by token sent by its armed hold after a lost reply.
    pending: Vec<Option<Tok>>,
    faults: Faults,
    ghost: Ghost,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    Post(u8),
    /// The post's script ran; its reply was lost.
    PostLost(u8),
    /// The forced release sent by a hold after a lost reply reaches the server.
    ApplyPending(u8),
    Read(u8),
    Handle(u8),
    Ack(u8),
    Release(u8),
    /// The release's script ran; its reply was lost.
    ReleaseLost(u8),
    /// A stale holder's loss signal fires: it stops (nothing released).
    NoticeLoss(u8),
    /// A restarted client's `drain`: takes the key if free.
    Sweep(u8),
    Pause(u8),
    Crash(u8),
    /// The lock's TTL runs out.
    Expire,
}

fn violate(s: &mut Sys, message: String) {
    if s.ghost.violation.is_none() {
        s.ghost.violation = Some(message);
    }
}

impl QueueModel {
    pub(crate) fn new(clients: u8, rounds: u8, faults: Faults) -> Self {
        QueueModel {
            clients,
            rounds,
            faults,
            mutation: None,
        }
    }

    /// The fenced acquisition (`SET NX` + fence step): `Some(fence)` if it took the lock.
    fn acquire(s: &mut Sys, tok: Tok) -> Option<u64> {
        if s.lock.is_some() {
            return None;
        }
        let fence = (s.fence + 1).max(s.ghost.last_fence + 1);
        if fence <= s.ghost.last_fence {
            violate(s, format!("fencing token went back: {fence}"));
        }
        s.ghost.last_fence = fence;
        s.fence = fence;
        s.lock = Some(tok);
        Some(fence)
    }

    fn fresh_tok(s: &mut Sys, i: usize) -> Tok {
        let c = &mut s.clients[i];
        let tok = (i as u8) * 8 + c.holds.min(7);
        c.holds = c.holds.saturating_add(1);
        tok
    }

    /// The enqueue-or-acquire script: appends the next item and tries the lock.
    fn post_script(s: &mut Sys, tok: Tok) -> Option<u64> {
        let id = s.ghost.posted.count_ones();
        s.ghost.posted |= 1 << id;
        s.stream |= 1 << id;
        Self::acquire(s, tok)
    }

    fn draining(fence: u64, tok: Tok) -> Phase {
        Phase::Draining {
            tok,
            fence,
            valid: true,
            step: Step::Read,
        }
    }

    fn end_round(&self, s: &mut Sys, i: usize) {
        let c = &mut s.clients[i];
        c.round += 1;
        c.phase = if c.round >= self.rounds {
            Phase::Ended
        } else {
            Phase::Idle
        };
    }

    /// After a hold ends: the next post, or the end.
    fn after_hold(&self, s: &mut Sys, i: usize) {
        let c = &mut s.clients[i];
        c.phase = if c.round >= self.rounds {
            Phase::Ended
        } else {
            Phase::Idle
        };
    }

    /// After a hold ends with its lease lost ([`Error::LockLost`]): the caller recovers as
    /// after a crash, with `drain` until it holds the key once (the documented recovery: the
    /// items it left, and those posted meanwhile under its stale lock, wait for it).
    fn after_loss(s: &mut Sys, i: usize) {
        s.clients[i].phase = Phase::Sweep;
    }

    /// The release-if-empty script (or, mutated, a plain release by token).
    fn release_script(&self, s: &mut Sys, tok: Tok) -> Release {
        if s.lock != Some(tok) {
            return Release::NotOurs {
                waiting: s.stream != 0 && self.mutation != Some(Mutation::TrustUncertainRelease),
            };
        }
        if s.stream != 0 && self.mutation != Some(Mutation::PlainRelease) {
            return Release::More;
        }
        s.lock = None;
        Release::Released
    }

    fn vouched(s: &Sys, tok: Tok) -> bool {
        s.clients
            .iter()
            .any(|c| matches!(c.phase, Phase::Draining { tok: t, valid: true, .. } if t == tok))
    }

    fn set_step(s: &mut Sys, i: usize, to: Step) {
        if let Phase::Draining { step, .. } = &mut s.clients[i].phase {
            *step = to;
        }
    }

    fn release(&self, s: &mut Sys, i: usize, lost: bool) {
        let Phase::Draining {
            tok,
            step: Step::Release { uncertain },
            ..
        } = s.clients[i].phase
        else {
            return;
        };
        let outcome = self.release_script(s, tok);
        let reply: Result<Release, Error> = if lost {
            Err(Error::Timeout {
                during: "releasing the queue's lock",
            })
        } else {
            Ok(outcome)
        };
        match release_step(&reply, uncertain) {
            ReleaseStep::Done => self.after_hold(s, i),
            ReleaseStep::Lost | ReleaseStep::Fail => Self::after_loss(s, i),
            ReleaseStep::DrainAgain => Self::set_step(s, i, Step::Read),
            ReleaseStep::Retry { uncertain } => Self::set_step(s, i, Step::Release { uncertain }),
        }
    }
}

impl Model for QueueModel {
    type State = Sys;
    type Action = Action;

    fn init(&self) -> Vec<Sys> {
        let n = self.clients as usize;
        vec![Sys {
            lock: None,
            fence: 0,
            stream: 0,
            sink_fence: 0,
            applied: 0,
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    round: 0,
                    holds: 0,
                };
                n
            ],
            pending: vec![None; n],
            faults: self.faults,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, s: &Sys, out: &mut Vec<Action>) {
        let f = &s.faults;
        for (i, c) in s.clients.iter().enumerate() {
            let i8 = i as u8;
            if s.pending[i].is_some() {
                out.push(Action::ApplyPending(i8));
            }
            match c.phase {
                Phase::Ended => continue,
                // A new request queues behind the one in flight on the same connection.
                Phase::Idle if s.pending[i].is_none() => {
                    out.push(Action::Post(i8));
                    if f.lost_replies > 0 {
                        out.push(Action::PostLost(i8));
                    }
                }
                Phase::Idle => {}
                Phase::Sweep => out.push(Action::Sweep(i8)),
                Phase::Draining { valid, step, .. } => {
                    match step {
                        Step::Read => out.push(Action::Read(i8)),
                        Step::Batch { handled: false, .. } => out.push(Action::Handle(i8)),
                        Step::Batch { handled: true, .. } => out.push(Action::Ack(i8)),
                        Step::Release { .. } => {
                            out.push(Action::Release(i8));
                            if f.lost_replies > 0 {
                                out.push(Action::ReleaseLost(i8));
                            }
                        }
                    }
                    if !valid {
                        out.push(Action::NoticeLoss(i8));
                    } else if f.pauses > 0 {
                        out.push(Action::Pause(i8));
                    }
                }
            }
            if f.crashes > 0 && c.phase != Phase::Idle && c.phase != Phase::Sweep {
                out.push(Action::Crash(i8));
            }
        }
        if let Some(tok) = s.lock {
            if !Self::vouched(s, tok) {
                out.push(Action::Expire);
            }
        }
    }

    fn next(&self, s: &Sys, a: &Action) -> Option<Sys> {
        let mut s = s.clone();
        match *a {
            Action::Post(i) | Action::PostLost(i) => {
                let i = i as usize;
                let tok = Self::fresh_tok(&mut s, i);
                let granted = Self::post_script(&mut s, tok);
                if matches!(a, Action::PostLost(_)) {
                    s.faults.lost_replies -= 1;
                    // A timeout is indeterminate: the armed hold releases by token (forced),
                    // and the caller posts again (the item may be delivered twice).
                    s.pending[i] = Some(tok);
                    return Some(s);
                }
                match granted {
                    Some(fence) => s.clients[i].phase = Self::draining(fence, tok),
                    None => self.end_round(&mut s, i),
                }
                if granted.is_some() {
                    s.clients[i].round += 1;
                }
            }
            Action::ApplyPending(i) => {
                if let Some(tok) = s.pending[i as usize].take() {
                    if s.lock == Some(tok) {
                        s.lock = None;
                    }
                }
            }
            Action::Sweep(i) => {
                let i = i as usize;
                if s.lock.is_some() {
                    // `Drain::Busy`: it tries again later.
                    return None;
                }
                let tok = Self::fresh_tok(&mut s, i);
                if let Some(fence) = Self::acquire(&mut s, tok) {
                    s.clients[i].phase = Self::draining(fence, tok);
                }
            }
            Action::Read(i) => {
                let items = s.stream;
                let to = if items == 0 {
                    Step::Release { uncertain: false }
                } else {
                    Step::Batch {
                        items,
                        handled: false,
                    }
                };
                Self::set_step(&mut s, i as usize, to);
            }
            Action::Handle(i) => {
                let Phase::Draining {
                    fence,
                    valid,
                    step: Step::Batch { items, .. },
                    ..
                } = s.clients[i as usize].phase
                else {
                    return None;
                };
                let id = items.trailing_zeros();
                // The fenced sink.
                if fence >= s.sink_fence {
                    s.sink_fence = fence;
                    s.applied |= 1 << id;
                } else if valid {
                    violate(
                        &mut s,
                        format!("the sink refused the valid holder of token {fence}"),
                    );
                }
                Self::set_step(
                    &mut s,
                    i as usize,
                    Step::Batch {
                        items,
                        handled: true,
                    },
                );
            }
            Action::Ack(i) => {
                let Phase::Draining {
                    tok,
                    step: Step::Batch { items, .. },
                    ..
                } = s.clients[i as usize].phase
                else {
                    return None;
                };
                let id = items.trailing_zeros();
                let ours = s.lock == Some(tok);
                if ours || self.mutation == Some(Mutation::AckWithoutTokenCheck) {
                    s.stream &= !(1 << id);
                }
                if !ours && self.mutation != Some(Mutation::AckWithoutTokenCheck) {
                    // `Ok(false)`: the lease is lost; the hold stops, nothing released.
                    Self::after_loss(&mut s, i as usize);
                } else {
                    let rest = items & !(1 << id);
                    let to = if rest == 0 {
                        Step::Release { uncertain: false }
                    } else {
                        Step::Batch {
                            items: rest,
                            handled: false,
                        }
                    };
                    Self::set_step(&mut s, i as usize, to);
                }
            }
            Action::Release(i) => self.release(&mut s, i as usize, false),
            Action::ReleaseLost(i) => {
                s.faults.lost_replies -= 1;
                self.release(&mut s, i as usize, true);
            }
            Action::NoticeLoss(i) => Self::after_loss(&mut s, i as usize),
            Action::Pause(i) => {
                s.faults.pauses -= 1;
                if let Phase::Draining { valid, .. } = &mut s.clients[i as usize].phase {
                    *valid = false;
                }
            }
            Action::Crash(i) => {
                s.faults.crashes -= 1;
                s.clients[i as usize].phase = Phase::Sweep;
                // Its requests in flight die with the process's connections.
                s.pending[i as usize] = None;
            }
            Action::Expire => s.lock = None,
        }
        let lost = s.ghost.posted & !s.applied & !s.stream;
        if lost != 0 {
            violate(
                &mut s,
                format!(
                    "item {} was removed from the stream but never applied",
                    lost.trailing_zeros()
                ),
            );
        }
        Some(s)
    }

    fn is_fault(&self, a: &Action) -> bool {
        matches!(
            a,
            Action::PostLost(_) | Action::ReleaseLost(_) | Action::Pause(_) | Action::Crash(_)
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
            && s.stream == 0
            && s.pending.iter().all(Option::is_none)
            && s.clients.iter().all(|c| c.phase == Phase::Ended)
    }
}

#[cfg(test)]
mod tests {
    //! Run-or-enqueue holds on small fleets, and each planted bug is found.

    use super::*;
    use crate::model::check::{check_exhaustive, Limits, Outcome};
    use std::time::Duration;

    fn run(model: &QueueModel) -> Outcome<Sys> {
        let r = check_exhaustive(
            model,
            &Limits {
                max_states: 2_000_000,
                timeout: Duration::from_secs(120),
                liveness_steps: Some(64),
            },
        );
        eprintln!("{:?}: {} states", model.mutation, r.states);
        r.outcome
    }

    const ALL: Faults = Faults {
        lost_replies: 1,
        pauses: 1,
        crashes: 1,
    };

    fn mutated(clients: u8, rounds: u8, faults: Faults, m: Mutation) -> QueueModel {
        let mut model = QueueModel::new(clients, rounds, faults);
        model.mutation = Some(m);
        model
    }

    #[test]
    fn run_or_enqueue_holds() {
        for (clients, rounds) in [(2, 2), (3, 1)] {
            let outcome = run(&QueueModel::new(clients, rounds, ALL));
            assert!(matches!(outcome, Outcome::Exhausted), "{outcome}");
        }
    }

    #[test]
    fn a_plain_release_strands_an_item_posted_while_the_holder_finishes() {
        match run(&mutated(2, 1, Faults::default(), Mutation::PlainRelease)) {
            Outcome::LivenessViolation(cx) => {
                eprintln!("{cx}");
                assert!(cx.last_state().stream != 0, "{cx}");
            }
            other => panic!("expected a liveness counterexample, got {other}"),
        }
    }

    #[test]
    fn a_release_trusted_after_a_lost_reply_strands_items_when_the_lease_ran_out() {
        let faults = Faults {
            lost_replies: 1,
            pauses: 1,
            ..Faults::default()
        };
        match run(&mutated(2, 2, faults, Mutation::TrustUncertainRelease)) {
            Outcome::LivenessViolation(cx) => {
                eprintln!("{cx}");
                assert!(cx.last_state().stream != 0, "{cx}");
            }
            other => panic!("expected a liveness counterexample, got {other}"),
        }
    }

    #[test]
    fn an_ack_without_the_token_check_loses_an_item_after_a_stale_holder() {
        let faults = Faults {
            pauses: 1,
            ..Faults::default()
        };
        match run(&mutated(2, 2, faults, Mutation::AckWithoutTokenCheck)) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(cx.message.contains("never applied"), "{}", cx.message);
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }
}
