//! The semaphore (`src/semaphore/`, scripts in `src/backend/redis/semaphores.rs`) as a model
//! for the checker.
//!
//! Clients take a permit of a semaphore of `limit` permits, write to the fenced resource of
//! their slot, and release it, for a number of rounds each. The acquire script is one atomic
//! server-side step here (as on the server): it counts every held slot up to the record's
//! `span`, refuses when as many are held as the limit, else takes the lowest free slot below
//! the limit and steps that slot's fence to `max(old + 1, TIME)`. A held slot is a lock of its
//! own, so its extension and release are the mutex's. The client's own decisions are the
//! library's: [`orphaned`] (an acquisition whose reply was lost is released by token, on
//! whichever slot it took) and [`after_extension`] (the watchdog's step).
//!
//! The world: every interleaving; acquisition replies lost (the script then runs later, or
//! never, with the release by token queued behind it on the same connection); holders that
//! pause past their lease; crashes; a slot's key expiring whenever no valid holder vouches for
//! it; Redis restarting without its data; an operator lowering the limit (`set_limit`) while
//! permits are held. Time is logical: `TIME` reads one more than the highest token granted.
//!
//! Properties:
//! - always: each slot's fencing tokens strictly increase (across data loss too);
//! - without data loss: a grant never leaves more *valid* holders than the limit (valid: its
//!   lease has not ended and nobody told it it lost the permit; after a lowered limit the
//!   permits above it stay held and nothing is granted until fewer are held than the new
//!   limit), and the fenced resource of a slot never refuses a valid holder of that slot.
//!
//! Liveness: from every state, fault-free steps end every client with no permit left behind.

use super::check::{fx_hash, Model};
use baton::model_api::{after_extension, orphaned, Error, Extension, Grant, Instant, WatchStep};

/// The most slots a model's semaphore has.
const SLOTS: usize = 2;

/// A holder token (only equality matters; names no client).
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
    /// A slot's fence is `old + 1` from the record, without the server-time floor: once the
    /// record is lost the slot's tokens start over.
    SlotFenceWithoutClock,
    /// The script counts only the slots below the limit given (no `span`): permits held above
    /// a lowered limit are not counted.
    NoSpan,
}

/// The semaphore model's parameters.
#[derive(Clone, Debug)]
pub(crate) struct SemaphoreModel {
    pub clients: u8,
    /// Permits each client takes.
    pub rounds: u8,
    /// The limit the clients give (at most [`SLOTS`]).
    pub limit: u8,
    /// Whether an operator lowers the limit by one, once, at any moment.
    pub lower: bool,
    pub faults: Faults,
    pub mutation: Option<Mutation>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Hold {
    slot: u8,
    tok: Tok,
    fence: u64,
    /// Its lease has not ended (a paused holder is no longer valid).
    valid: bool,
    wrote: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    Holding(Hold),
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
    /// Release by token, whichever slot holds it.
    ReleaseAny(Tok),
}

/// The semaphore's record (`sem:{K}`): its limit, span and per-slot fences.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Record {
    limit: u8,
    span: u8,
    fences: [Option<u64>; SLOTS],
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Ghost {
    /// Per slot, the highest token granted.
    last_fence: [u64; SLOTS],
    /// Tokens of acquisitions whose reply was lost (bit `t`).
    abandoned: u64,
    wiped: bool,
    violation: Option<String>,
}

/// One state of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sys {
    record: Option<Record>,
    /// The slot keys `sem:{K}:<i>`: the holder's token.
    slots: [Option<Tok>; SLOTS],
    /// The limit callers give now (lowered once by the operator, if at all).
    given: u8,
    lowered: bool,
    /// Per slot, the fenced resource's highest accepted token.
    resource: [u64; SLOTS],
    clients: Vec<Client>,
    /// Per client, its requests in flight, oldest first.
    inflight: Vec<Vec<Op>>,
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
    /// The holder writes to its slot's fenced resource.
    Work(u8),
    /// `release()`.
    Release(u8),
    /// The watchdog's extension.
    Extend(u8),
    /// A paused holder runs again: the watchdog's deadline fired, the work is cancelled and
    /// the guard releases by token.
    Resume(u8),
    Pause(u8),
    Crash(u8),
    /// Slot `i`'s key expires (its lease ended).
    Expire(u8),
    /// The key of a slot an abandoned acquisition took expires (a fault for liveness: the
    /// release by token should have removed it long before).
    ExpireOrphan(u8),
    /// The operator lowers the limit by one (`set_limit`).
    Lower,
    /// Redis restarts without its data.
    Wipe,
}

fn violate(s: &mut Sys, message: String) {
    if s.ghost.violation.is_none() {
        s.ghost.violation = Some(message);
    }
}

fn bit(t: Tok) -> u64 {
    1u64 << t.0.min(63)
}

impl SemaphoreModel {
    pub(crate) fn new(clients: u8, rounds: u8, limit: u8, lower: bool, faults: Faults) -> Self {
        SemaphoreModel {
            clients,
            rounds,
            limit: limit.clamp(1, SLOTS as u8),
            lower,
            faults,
            mutation: None,
        }
    }

    fn fresh_token(s: &Sys) -> Tok {
        let mut used = s.ghost.abandoned;
        for t in s.slots.iter().flatten() {
            used |= bit(*t);
        }
        for c in &s.clients {
            if let Phase::Holding(h) = c.phase {
                used |= bit(h.tok);
            }
        }
        for op in s.inflight.iter().flatten() {
            match *op {
                Op::Acquire(t) | Op::ReleaseAny(t) => used |= bit(t),
            }
        }
        Tok(used.trailing_ones() as u8)
    }

    fn valid_holders(s: &Sys) -> usize {
        s.clients
            .iter()
            .filter(|c| matches!(c.phase, Phase::Holding(h) if h.valid))
            .count()
    }

    /// The acquire script, atomically: `Some((slot, fence))` if it granted a permit.
    fn acquire_script(&self, s: &mut Sys, tok: Tok) -> Option<(u8, u64)> {
        let n = s.given;
        let mut rec = s.record.unwrap_or_default();
        // The span: every slot that may still be held after a lowered limit.
        let span = if self.mutation == Some(Mutation::NoSpan) {
            n
        } else {
            rec.span.max(n)
        };
        let (mut held, mut top, mut free) = (0u8, n, None);
        for i in 0..span {
            match s.slots[i as usize] {
                None if i < n && free.is_none() => free = Some(i),
                None => {}
                Some(_) => {
                    held += 1;
                    top = top.max(i + 1);
                }
            }
        }
        rec.limit = n;
        rec.span = top;
        s.record = Some(rec);
        let slot = match free {
            Some(slot) if held < n => slot,
            _ => return None,
        };
        let i = slot as usize;
        let old = rec.fences[i];
        // `TIME`: later than every token granted so far, on any slot.
        let now = s.ghost.last_fence.iter().max().copied().unwrap_or(0) + 1;
        let fence = match (self.mutation, old) {
            (Some(Mutation::SlotFenceWithoutClock), old) => old.unwrap_or(0) + 1,
            (_, Some(old)) => (old + 1).max(now),
            (_, None) => now,
        };
        if fence <= s.ghost.last_fence[i] {
            violate(
                s,
                format!(
                    "slot {slot}'s fencing token went back: {fence} after {}",
                    s.ghost.last_fence[i]
                ),
            );
        }
        if !s.ghost.wiped && Self::valid_holders(s) + 1 > n as usize {
            violate(
                s,
                format!(
                    "granted slot {slot} (token {fence}) beside {} valid holders, limit {n}",
                    Self::valid_holders(s)
                ),
            );
        }
        s.ghost.last_fence[i] = s.ghost.last_fence[i].max(fence);
        s.slots[i] = Some(tok);
        if let Some(r) = &mut s.record {
            r.fences[i] = Some(fence);
        }
        Some((slot, fence))
    }

    /// The mutex's release script on one slot's key: deletes it if it holds `tok`.
    fn release_slot(s: &mut Sys, slot: u8, tok: Tok) {
        if s.slots[slot as usize] == Some(tok) {
            s.slots[slot as usize] = None;
        }
    }

    /// The release-any script: the slot holding `tok`, among the record's span.
    fn release_any(s: &mut Sys, tok: Tok) {
        let span = s.record.map_or(0, |r| r.span) as usize;
        if let Some(k) = s.slots[..span.min(SLOTS)]
            .iter_mut()
            .find(|k| **k == Some(tok))
        {
            *k = None;
        }
    }

    fn end_round(s: &mut Sys, i: usize) {
        let c = &mut s.clients[i];
        c.rounds_left = c.rounds_left.saturating_sub(1);
        c.phase = if c.rounds_left == 0 {
            Phase::Ended
        } else {
            Phase::Idle
        };
    }

    fn vouched(s: &Sys, tok: Tok) -> bool {
        s.clients
            .iter()
            .any(|c| matches!(c.phase, Phase::Holding(h) if h.tok == tok && h.valid))
    }

    fn canonical(mut s: Sys) -> Sys {
        let n = s.clients.len();
        let keys: Vec<u64> = (0..n)
            .map(|i| fx_hash(&(&s.clients[i], &s.inflight[i])))
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| keys[i]);
        if order.iter().enumerate().any(|(pos, &i)| pos != i) {
            s.clients = order.iter().map(|&i| s.clients[i]).collect();
            s.inflight = order.iter().map(|&i| s.inflight[i].clone()).collect();
        }
        s
    }
}

impl Model for SemaphoreModel {
    type State = Sys;
    type Action = Action;

    fn init(&self) -> Vec<Sys> {
        let n = self.clients as usize;
        vec![Sys {
            record: None,
            slots: [None; SLOTS],
            given: self.limit,
            lowered: false,
            resource: [0; SLOTS],
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    rounds_left: self.rounds,
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
                // A new request queues behind those in flight on the same connection.
                Phase::Idle if s.inflight[i].is_empty() => {
                    out.push(Action::Try(i8));
                    if f.lost_replies > 0 {
                        out.push(Action::TryLost(i8));
                    }
                }
                Phase::Idle => {}
                Phase::Holding(h) => {
                    if !h.wrote {
                        out.push(Action::Work(i8));
                    }
                    if h.valid {
                        out.push(Action::Release(i8));
                        out.push(Action::Extend(i8));
                        if f.pauses > 0 {
                            out.push(Action::Pause(i8));
                        }
                    } else {
                        out.push(Action::Resume(i8));
                    }
                    if f.crashes > 0 {
                        out.push(Action::Crash(i8));
                    }
                }
            }
        }
        for (k, slot) in s.slots.iter().enumerate() {
            if let Some(tok) = *slot {
                if s.ghost.abandoned & bit(tok) != 0 {
                    out.push(Action::ExpireOrphan(k as u8));
                } else if !Self::vouched(s, tok) {
                    out.push(Action::Expire(k as u8));
                }
            }
        }
        if self.lower && !s.lowered && s.given > 1 {
            out.push(Action::Lower);
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
                let before = s.record;
                match self.acquire_script(&mut s, tok) {
                    Some((slot, fence)) => {
                        s.clients[i as usize].phase = Phase::Holding(Hold {
                            slot,
                            tok,
                            fence,
                            valid: true,
                            wrote: false,
                        });
                    }
                    // Full: the client waits and tries again; only the record may have changed.
                    None if s.record == before => return None,
                    None => {}
                }
            }
            Action::TryLost(i) => {
                s.faults.lost_replies -= 1;
                let tok = Self::fresh_token(&s);
                let lost: Result<Grant, Error> = Err(Error::Timeout {
                    during: "acquiring a permit",
                });
                s.ghost.abandoned |= bit(tok);
                let q = &mut s.inflight[i as usize];
                q.push(Op::Acquire(tok));
                if orphaned(&lost) {
                    q.push(Op::ReleaseAny(tok));
                }
            }
            Action::Apply(i) => match s.inflight[i as usize].remove(0) {
                Op::Acquire(tok) => {
                    self.acquire_script(&mut s, tok);
                }
                Op::ReleaseAny(tok) => Self::release_any(&mut s, tok),
            },
            Action::Drop(i) => {
                s.inflight[i as usize].remove(0);
            }
            Action::Work(i) => {
                let Phase::Holding(h) = &mut s.clients[i as usize].phase else {
                    return None;
                };
                h.wrote = true;
                let (slot, fence, valid) = (h.slot as usize, h.fence, h.valid);
                if fence >= s.resource[slot] {
                    s.resource[slot] = fence;
                } else if valid && !s.ghost.wiped {
                    violate(
                        &mut s,
                        format!("slot {slot}'s resource refused its valid holder of token {fence}"),
                    );
                }
            }
            Action::Release(i) => {
                let Phase::Holding(h) = s.clients[i as usize].phase else {
                    return None;
                };
                Self::release_slot(&mut s, h.slot, h.tok);
                Self::end_round(&mut s, i as usize);
            }
            Action::Extend(i) => {
                let Phase::Holding(h) = s.clients[i as usize].phase else {
                    return None;
                };
                let outcome: Result<Extension, Error> = if s.slots[h.slot as usize] == Some(h.tok) {
                    Ok(Extension::Confirmed {
                        sent: Instant::now(),
                    })
                } else {
                    Ok(Extension::Refused)
                };
                match after_extension(&outcome) {
                    WatchStep::Extended { .. } | WatchStep::Retry => return None,
                    // The loss signal: the work is cancelled; the release finds another token
                    // (or none) and deletes nothing.
                    WatchStep::Lost(_) => Self::end_round(&mut s, i as usize),
                }
            }
            Action::Pause(i) => {
                s.faults.pauses -= 1;
                let Phase::Holding(h) = &mut s.clients[i as usize].phase else {
                    return None;
                };
                h.valid = false;
            }
            Action::Resume(i) => {
                if let Phase::Holding(h) = s.clients[i as usize].phase {
                    Self::release_slot(&mut s, h.slot, h.tok);
                }
                Self::end_round(&mut s, i as usize);
            }
            Action::Crash(i) => {
                s.faults.crashes -= 1;
                s.clients[i as usize].phase = Phase::Ended;
            }
            Action::Expire(k) | Action::ExpireOrphan(k) => s.slots[k as usize] = None,
            // `set_limit`: the span keeps every slot the old limit covered.
            Action::Lower => {
                s.lowered = true;
                let old = s.given;
                s.given -= 1;
                let mut rec = s.record.unwrap_or_default();
                rec.span = rec.span.max(old).max(rec.limit);
                rec.limit = s.given;
                s.record = Some(rec);
            }
            Action::Wipe => {
                s.faults.wipes -= 1;
                s.ghost.wiped = true;
                s.record = None;
                s.slots = [None; SLOTS];
                // Requests in flight die with the connections.
                for q in &mut s.inflight {
                    q.clear();
                }
            }
        }
        // An abandoned token nothing refers to any more can never matter again.
        let mut live = 0u64;
        for t in s.slots.iter().flatten() {
            live |= bit(*t);
        }
        for op in s.inflight.iter().flatten() {
            match *op {
                Op::Acquire(t) | Op::ReleaseAny(t) => live |= bit(t),
            }
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
                | Action::ExpireOrphan(_)
        )
    }

    fn check(&self, s: &Sys) -> Result<(), String> {
        match &s.ghost.violation {
            Some(v) => Err(v.clone()),
            None => Ok(()),
        }
    }

    fn is_terminal(&self, s: &Sys) -> bool {
        s.slots.iter().all(Option::is_none)
            && s.inflight.iter().all(Vec::is_empty)
            && s.clients.iter().all(|c| c.phase == Phase::Ended)
    }
}

#[cfg(test)]
mod tests {
    //! The semaphore holds on small fleets, and each planted bug is found (3 clients × 1 round
    //! here, unoptimized; CI's model step runs larger fleets optimized).

    use super::*;
    use crate::check::{check_exhaustive, Limits, Outcome};
    use std::time::Duration;

    fn run(model: &SemaphoreModel) -> Outcome<Sys> {
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

    #[test]
    fn the_semaphore_holds() {
        for faults in [
            ALL,
            Faults {
                wipes: 1,
                pauses: 1,
                ..Faults::default()
            },
        ] {
            let outcome = run(&SemaphoreModel::new(3, 1, 2, true, faults));
            assert!(matches!(outcome, Outcome::Exhausted), "{outcome}");
        }
    }

    #[test]
    fn a_slot_fence_without_the_clock_goes_back_after_data_loss() {
        let faults = Faults {
            wipes: 1,
            ..Faults::default()
        };
        let mut model = SemaphoreModel::new(2, 2, 2, false, faults);
        model.mutation = Some(Mutation::SlotFenceWithoutClock);
        match run(&model) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(cx.message.contains("went back"), "{}", cx.message);
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }

    #[test]
    fn a_script_blind_to_permits_above_a_lowered_limit_grants_too_many() {
        let mut model = SemaphoreModel::new(3, 1, 2, true, Faults::default());
        model.mutation = Some(Mutation::NoSpan);
        match run(&model) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(cx.message.contains("valid holders"), "{}", cx.message);
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }
}
