//! Leader election (`src/leader/`, scripts in `src/lease/`) as a model for the checker.
//!
//! Candidates campaign, lead a term (its work runs, writes to a fenced resource), renew, and
//! end the term by resigning or by losing it, for a number of terms each. The scripts are
//! atomic server-side steps (as on the server); the candidates' decisions are the library's:
//! [`after_try`] (what a campaign does after one try), [`orphaned`] (a grant whose reply was
//! lost is released by token), [`after_extension`] (the watchdog's step after a renewal),
//! [`must_stop`] (when the term's supervisor tells the work to stop) and [`handover`] (when
//! the worker lets the lease go, or reports the work overdue).
//!
//! A leader's clock is abstracted to where it stands against its lease deadline `d`:
//! `Fresh` (before `d − stop_timeout`), `StopDue` (from there to `d`), `Expired` (from `d`):
//! every renewal failure moves it forward, a confirmed renewal back to `Fresh`. The server may
//! expire the lease only once its holder's clock is `Expired` (the deadline errs early).
//!
//! The world: every interleaving; grant replies lost (the script runs later or never, the
//! release by token queued behind it); renewals failing; leaders pausing past their lease (a
//! paused process runs nothing); crashes; work that is slow to stop; Redis restarting without
//! its data.
//!
//! Properties:
//! - always: terms strictly increase (across data loss too);
//! - without data loss: when a term is granted, no other leader is still valid (its deadline
//!   not passed), and no other term's work still runs unless that was reported overdue (a
//!   paused process's work is frozen; it is reported overdue when the process resumes);
//! - without data loss: the fenced resource never refuses a valid leader's write.
//!
//! Liveness: from every state, fault-free steps end every candidate with no lease left behind.

use std::time::Duration;

use baton::model_api::Instant;

use super::check::{fx_hash, Model};
use baton::model_api::Error;
use baton::model_api::Extension;
use baton::model_api::{after_extension, WatchStep};
use baton::model_api::{after_try, handover, must_stop, stop_at, CampaignStep, Handover};
use baton::model_api::{orphaned, Grant};

/// A lease token (only equality matters; names no candidate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Tok(u8);

/// Faults left to inject in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Faults {
    /// Grant replies lost.
    pub lost_replies: u8,
    /// Leaders that pause past their lease.
    pub pauses: u8,
    /// Candidate crashes.
    pub crashes: u8,
    /// Restarts that lose every key.
    pub wipes: u8,
}

/// A deliberate bug, to show the checker finds it.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// The lease is released as soon as the work is told to stop, not once it stopped.
    ReleaseBeforeTheWorkStops,
    /// The work is told to stop only at the lease's end (no `stop_timeout` margin).
    StopAtTheDeadline,
    /// The term is `old + 1`, without the server-time floor.
    NoTimeFloor,
}

/// The model's parameters.
#[derive(Clone, Debug)]
pub(crate) struct LeaderModel {
    pub candidates: u8,
    /// Terms each candidate leads before it ends.
    pub terms: u8,
    pub faults: Faults,
    pub mutation: Option<Mutation>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Clock {
    Fresh,
    StopDue,
    Expired,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Work {
    Running,
    /// Told to stop (the term's stop token fired), still running.
    Told,
    Stopped,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Lead {
    tok: Tok,
    term: u64,
    clock: Clock,
    work: Work,
    paused: bool,
    /// Reported overdue ([`Handover::Overdue`]).
    overdue: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Standby,
    Leading(Lead),
    Ended,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Candidate {
    phase: Phase,
    terms_left: u8,
}

/// A script call sent whose reply was lost, in connection order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Op {
    Acquire(Tok),
    Release(Tok),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Ghost {
    last_term: u64,
    /// Tokens of grants whose reply was lost (bit `t`).
    abandoned: u64,
    wiped: bool,
    violation: Option<String>,
}

/// One state of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sys {
    lease: Option<Tok>,
    fence: Option<u64>,
    resource: u64,
    cands: Vec<Candidate>,
    inflight: Vec<Vec<Op>>,
    faults: Faults,
    ghost: Ghost,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// A campaign's try, with its reply.
    Try(u8),
    /// A try sent, its reply lost (fault).
    TryLost(u8),
    /// The oldest request in flight reaches the server.
    Apply(u8),
    /// ...or an acquisition in flight never does.
    Drop(u8),
    /// A renewal, with its reply.
    Renew(u8),
    /// Time passes without a confirmed renewal: the leader's clock moves on.
    Late(u8),
    /// The leader's work writes to the fenced resource.
    Write(u8),
    /// The work stops (it honours its stop token).
    WorkStops(u8),
    /// The leader resigns: the work is told to stop.
    Resign(u8),
    /// The worker lets the lease go (release by token).
    Release(u8),
    Pause(u8),
    Resume(u8),
    Crash(u8),
    /// The lease's TTL runs out.
    Expire,
    /// The TTL of a lease an abandoned grant left behind runs out (a fault for liveness).
    ExpireOrphan,
    /// Redis restarts without its data.
    Wipe,
}

fn violate(s: &mut Sys, message: String) {
    if s.ghost.violation.is_none() {
        s.ghost.violation = Some(message);
    }
}

/// The lease and stop timeout the clock points stand for (only their order matters).
const LEASE: Duration = Duration::from_secs(10);
const STOP: Duration = Duration::from_secs(2);

/// Whether the library's supervisor tells the work to stop at clock point `clock`.
fn supervisor_stops(clock: Clock, mutation: Option<Mutation>) -> bool {
    let base = Instant::now();
    let deadline = base + LEASE;
    let now = match clock {
        Clock::Fresh => base,
        Clock::StopDue => stop_at(deadline, STOP),
        Clock::Expired => deadline,
    };
    if mutation == Some(Mutation::StopAtTheDeadline) {
        return now >= deadline;
    }
    must_stop(now, deadline, STOP)
}

impl LeaderModel {
    pub(crate) fn new(candidates: u8, terms: u8, faults: Faults) -> Self {
        LeaderModel {
            candidates,
            terms,
            faults,
            mutation: None,
        }
    }

    fn fresh_token(s: &Sys) -> Tok {
        let mut used: u64 = s.ghost.abandoned;
        let mut mark = |t: Tok| used |= 1u64 << t.0.min(63);
        if let Some(t) = s.lease {
            mark(t);
        }
        for c in &s.cands {
            if let Phase::Leading(l) = c.phase {
                mark(l.tok);
            }
        }
        for op in s.inflight.iter().flatten() {
            match *op {
                Op::Acquire(t) | Op::Release(t) => mark(t),
            }
        }
        Tok(used.trailing_ones() as u8)
    }

    /// The acquire script: `Some(term)` if granted.
    fn acquire_script(&self, s: &mut Sys, tok: Tok) -> Option<u64> {
        if s.lease.is_some() {
            return None;
        }
        let old = s.fence.unwrap_or(0);
        let term = if self.mutation == Some(Mutation::NoTimeFloor) {
            old + 1
        } else {
            (old + 1).max(s.ghost.last_term + 1)
        };
        if term <= s.ghost.last_term {
            violate(
                s,
                format!("a term went back: {term} after {}", s.ghost.last_term),
            );
        }
        if !s.ghost.wiped {
            for c in &s.cands {
                let Phase::Leading(l) = c.phase else { continue };
                if l.clock != Clock::Expired {
                    violate(
                        s,
                        format!(
                            "term {term} granted while the leader of term {} is still valid",
                            l.term
                        ),
                    );
                    break;
                }
                if l.work != Work::Stopped && !l.overdue && !l.paused {
                    violate(
                        s,
                        format!(
                            "term {term} granted while the work of term {} still runs, unreported",
                            l.term
                        ),
                    );
                    break;
                }
            }
        }
        s.ghost.last_term = s.ghost.last_term.max(term);
        s.lease = Some(tok);
        s.fence = Some(term);
        Some(term)
    }

    fn release_script(s: &mut Sys, tok: Tok) {
        if s.lease == Some(tok) {
            s.lease = None;
        }
    }

    fn end_term(&self, s: &mut Sys, i: usize) {
        let c = &mut s.cands[i];
        c.terms_left = c.terms_left.saturating_sub(1);
        c.phase = if c.terms_left == 0 {
            Phase::Ended
        } else {
            Phase::Standby
        };
    }

    /// The supervisor's and the worker's reaction to leader `i`'s clock (when it runs;
    /// `resumed`: it was just paused, so it could not act earlier).
    fn react(&self, s: &mut Sys, i: usize, resumed: bool) {
        let Phase::Leading(l) = &mut s.cands[i].phase else {
            return;
        };
        if l.paused {
            return;
        }
        if l.work == Work::Running && supervisor_stops(l.clock, self.mutation) {
            l.work = Work::Told;
            if l.clock == Clock::Expired && !resumed {
                let term = l.term;
                violate(
                    s,
                    format!("the work of term {term} was told to stop only when the lease could already end"),
                );
                return;
            }
        }
        if l.work == Work::Told && !l.overdue {
            let base = Instant::now();
            let deadline = base + LEASE;
            let now = if l.clock == Clock::Expired {
                deadline
            } else {
                base
            };
            if handover(false, now, deadline) == Handover::Overdue {
                l.overdue = true;
            }
        }
    }

    fn vouched(s: &Sys, tok: Tok) -> bool {
        s.cands.iter().any(
            |c| matches!(c.phase, Phase::Leading(l) if l.tok == tok && l.clock != Clock::Expired),
        )
    }

    fn canonical(mut s: Sys) -> Sys {
        let n = s.cands.len();
        let keys: Vec<u64> = (0..n)
            .map(|i| fx_hash(&(&s.cands[i], &s.inflight[i])))
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| keys[i]);
        if order.iter().enumerate().any(|(pos, &i)| pos != i) {
            s.cands = order.iter().map(|&i| s.cands[i]).collect();
            s.inflight = order.iter().map(|&i| s.inflight[i].clone()).collect();
        }
        s
    }
}

impl Model for LeaderModel {
    type State = Sys;
    type Action = Action;

    fn init(&self) -> Vec<Sys> {
        let n = self.candidates as usize;
        vec![Sys {
            lease: None,
            fence: None,
            resource: 0,
            cands: vec![
                Candidate {
                    phase: Phase::Standby,
                    terms_left: self.terms,
                };
                n
            ],
            inflight: vec![Vec::new(); n],
            faults: self.faults,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, s: &Sys, out: &mut Vec<Action>) {
        let f = &s.faults;
        for (i, c) in s.cands.iter().enumerate() {
            let i8 = i as u8;
            if !s.inflight[i].is_empty() {
                out.push(Action::Apply(i8));
                if matches!(s.inflight[i].first(), Some(Op::Acquire(_))) {
                    out.push(Action::Drop(i8));
                }
            }
            match c.phase {
                Phase::Ended => {}
                Phase::Standby if s.inflight[i].is_empty() => {
                    out.push(Action::Try(i8));
                    if f.lost_replies > 0 {
                        out.push(Action::TryLost(i8));
                    }
                }
                Phase::Standby => {}
                Phase::Leading(l) if l.paused => {
                    out.push(Action::Resume(i8));
                    if f.crashes > 0 {
                        out.push(Action::Crash(i8));
                    }
                }
                Phase::Leading(l) => {
                    if l.work != Work::Stopped {
                        out.push(Action::Write(i8));
                    }
                    if l.work == Work::Told {
                        out.push(Action::WorkStops(i8));
                    }
                    if l.work == Work::Running {
                        out.push(Action::Resign(i8));
                    }
                    let release = if self.mutation == Some(Mutation::ReleaseBeforeTheWorkStops) {
                        l.work != Work::Running
                    } else {
                        l.work == Work::Stopped
                    };
                    if release {
                        out.push(Action::Release(i8));
                    }
                    if l.clock != Clock::Expired {
                        out.push(Action::Renew(i8));
                        out.push(Action::Late(i8));
                        if f.pauses > 0 {
                            out.push(Action::Pause(i8));
                        }
                    }
                    if f.crashes > 0 {
                        out.push(Action::Crash(i8));
                    }
                }
            }
        }
        if let Some(tok) = s.lease {
            if s.ghost.abandoned >> tok.0.min(63) & 1 != 0 {
                out.push(Action::ExpireOrphan);
            } else if !Self::vouched(s, tok) {
                out.push(Action::Expire);
            }
        }
        if f.wipes > 0 {
            out.push(Action::Wipe);
        }
    }

    fn next(&self, s: &Sys, a: &Action) -> Option<Sys> {
        let mut s = s.clone();
        match *a {
            Action::Try(i) => {
                let tok = Self::fresh_token(&s);
                let outcome: Result<Result<u64, Option<Duration>>, Error> =
                    match self.acquire_script(&mut s, tok) {
                        Some(term) => Ok(Ok(term)),
                        None => Ok(Err(Some(LEASE))),
                    };
                match (after_try(&outcome), outcome) {
                    (CampaignStep::Elected, Ok(Ok(term))) => {
                        s.cands[i as usize].phase = Phase::Leading(Lead {
                            tok,
                            term,
                            clock: Clock::Fresh,
                            work: Work::Running,
                            paused: false,
                            overdue: false,
                        });
                    }
                    // A standby waits (for the PTTL or a message): nothing changed.
                    _ => return None,
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
                if orphaned(&lost) {
                    q.push(Op::Release(tok));
                }
                // The campaign goes on: `after_try` retries a timeout.
                let retry: Result<Result<(), Option<Duration>>, Error> = Err(Error::Timeout {
                    during: "acquiring the lock",
                });
                if after_try(&retry) != CampaignStep::Retry {
                    violate(&mut s, "a lost reply ended the campaign".into());
                }
            }
            Action::Apply(i) => match s.inflight[i as usize].remove(0) {
                Op::Acquire(tok) => {
                    self.acquire_script(&mut s, tok);
                }
                Op::Release(tok) => Self::release_script(&mut s, tok),
            },
            Action::Drop(i) => {
                s.inflight[i as usize].remove(0);
            }
            Action::Renew(i) => {
                let Phase::Leading(l) = s.cands[i as usize].phase else {
                    return None;
                };
                let outcome: Result<Extension, Error> = if s.lease == Some(l.tok) {
                    Ok(Extension::Confirmed {
                        sent: Instant::now(),
                    })
                } else {
                    Ok(Extension::Refused)
                };
                let Phase::Leading(l) = &mut s.cands[i as usize].phase else {
                    return None;
                };
                match after_extension(&outcome) {
                    WatchStep::Extended { .. } => {
                        if l.clock == Clock::Fresh {
                            return None;
                        }
                        l.clock = Clock::Fresh;
                    }
                    WatchStep::Retry => return None,
                    // The loss signal: the term's supervisor tells the work to stop.
                    WatchStep::Lost(_) => {
                        if l.work != Work::Running {
                            return None;
                        }
                        l.work = Work::Told;
                    }
                }
            }
            Action::Late(i) => {
                let Phase::Leading(l) = &mut s.cands[i as usize].phase else {
                    return None;
                };
                l.clock = match l.clock {
                    Clock::Fresh => Clock::StopDue,
                    Clock::StopDue | Clock::Expired => Clock::Expired,
                };
                self.react(&mut s, i as usize, false);
            }
            Action::Write(i) => {
                let Phase::Leading(l) = s.cands[i as usize].phase else {
                    return None;
                };
                if l.term >= s.resource {
                    s.resource = l.term;
                } else if l.clock != Clock::Expired && !l.paused && !s.ghost.wiped {
                    violate(
                        &mut s,
                        format!("the resource refused the valid leader of term {}", l.term),
                    );
                } else {
                    // Refused: a stale leader's write. Nothing changed.
                    return None;
                }
            }
            Action::WorkStops(i) => {
                let Phase::Leading(l) = &mut s.cands[i as usize].phase else {
                    return None;
                };
                l.work = Work::Stopped;
            }
            Action::Resign(i) => {
                let Phase::Leading(l) = &mut s.cands[i as usize].phase else {
                    return None;
                };
                l.work = Work::Told;
            }
            Action::Release(i) => {
                let Phase::Leading(l) = s.cands[i as usize].phase else {
                    return None;
                };
                if l.work != Work::Stopped && !l.overdue {
                    violate(
                        &mut s,
                        format!(
                            "the lease of term {} was let go while its work still runs, unreported",
                            l.term
                        ),
                    );
                }
                Self::release_script(&mut s, l.tok);
                self.end_term(&mut s, i as usize);
            }
            Action::Pause(i) => {
                s.faults.pauses -= 1;
                let Phase::Leading(l) = &mut s.cands[i as usize].phase else {
                    return None;
                };
                // Paused past its lease: nothing of the process runs meanwhile.
                l.paused = true;
                l.clock = Clock::Expired;
            }
            Action::Resume(i) => {
                let Phase::Leading(l) = &mut s.cands[i as usize].phase else {
                    return None;
                };
                l.paused = false;
                self.react(&mut s, i as usize, true);
            }
            Action::Crash(i) => {
                s.faults.crashes -= 1;
                s.cands[i as usize].phase = Phase::Ended;
            }
            Action::Expire | Action::ExpireOrphan => s.lease = None,
            Action::Wipe => {
                s.faults.wipes -= 1;
                s.ghost.wiped = true;
                s.lease = None;
                s.fence = None;
                for q in &mut s.inflight {
                    q.clear();
                }
            }
        }
        let mut live = 0u64;
        if let Some(t) = s.lease {
            live |= 1u64 << t.0.min(63);
        }
        for op in s.inflight.iter().flatten() {
            let (Op::Acquire(t) | Op::Release(t)) = *op;
            live |= 1u64 << t.0.min(63);
        }
        s.ghost.abandoned &= live;
        Some(Self::canonical(s))
    }

    fn is_fault(&self, a: &Action) -> bool {
        matches!(
            a,
            Action::TryLost(_)
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
        s.lease.is_none()
            && s.inflight.iter().all(Vec::is_empty)
            && s.cands.iter().all(|c| c.phase == Phase::Ended)
    }
}

#[cfg(test)]
mod tests {
    //! Leader election holds on small fleets, and each planted bug is found (2 candidates × 2
    //! terms here, unoptimized; CI's model step runs 3 candidates optimized).

    use super::*;
    use crate::check::{check_exhaustive, Limits, Outcome};

    fn run(model: &LeaderModel) -> Outcome<Sys> {
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

    fn mutated(faults: Faults, m: Mutation) -> LeaderModel {
        let mut model = LeaderModel::new(2, 2, faults);
        model.mutation = Some(m);
        model
    }

    #[test]
    fn leader_election_holds() {
        for faults in [
            ALL,
            Faults {
                wipes: 1,
                ..Faults::default()
            },
        ] {
            let outcome = run(&LeaderModel::new(2, 2, faults));
            assert!(matches!(outcome, Outcome::Exhausted), "{outcome}");
        }
    }

    #[test]
    fn releasing_before_the_work_stops_lets_two_terms_work_at_once() {
        match run(&mutated(
            Faults::default(),
            Mutation::ReleaseBeforeTheWorkStops,
        )) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(
                    cx.message.contains("let go while its work still runs"),
                    "{}",
                    cx.message
                );
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }

    #[test]
    fn stopping_only_at_the_deadline_is_too_late() {
        match run(&mutated(Faults::default(), Mutation::StopAtTheDeadline)) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(
                    cx.message.contains("told to stop only when"),
                    "{}",
                    cx.message
                );
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }

    #[test]
    fn terms_without_the_time_floor_go_back_after_data_loss() {
        let faults = Faults {
            wipes: 1,
            ..Faults::default()
        };
        match run(&mutated(faults, Mutation::NoTimeFloor)) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(cx.message.contains("went back"), "{}", cx.message);
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }
}
