//! The read-write lock (`src/rwlock/`, scripts in `src/backend/redis/rwlocks.rs`) as a model for
//! the checker.
//!
//! Readers take shared reads and release them, over and over (they never end, so a writer that
//! readers could starve has a run that never ends); writers take the write, write to a fenced
//! resource and release, for a number of rounds; the upgradeable reader takes its read,
//! upgrades to the write, writes, downgrades and releases. Every try, upgrade, downgrade and
//! release is one atomic server-side step (as the scripts are); what a try or an upgrade grants
//! is decided by the library's own rule, [`rw_decide`] (`util::rw_replies::decide`, which the
//! PostgreSQL arm runs and the Redis scripts apply in Lua). A waiting writer's refused try sets
//! the "writer waiting" mark, or refreshes it when the mark is its own; the mark lapses once
//! nobody refreshes it. The client's own decisions are the library's: [`orphaned`] (a try
//! whose reply was lost is released by token) and [`after_extension`] (the watchdog).
//!
//! The world: every interleaving; try replies lost (the script then runs later, or never, with
//! the release by token behind it); holders that pause past their lease; crashes; a holder's
//! lease key expiring whenever no valid holder vouches for it; Redis restarting without its
//! data. Time is logical: `TIME` reads one more than the highest write token granted.
//!
//! Properties:
//! - always: write tokens strictly increase (across data loss too), so the fenced resource
//!   refuses a stale writer;
//! - without data loss: never a valid writer beside another valid holder; a read grant carries
//!   the last write's token; the resource never refuses a valid writer;
//! - no fair cycle: under weak fairness a waiting writer (and the upgrading reader) gets in
//!   although readers keep coming.

use std::time::Duration;

use super::check::{fx_hash, Model};
use baton::model_api::{
    after_extension, orphaned, rw_decide, Error, Extension, Grant, Instant, MarkChange, RwMode,
    RwState, WatchStep,
};

/// A holder token (only equality matters; names no client).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Tok(u8);

fn bit(t: Tok) -> u64 {
    1u64 << t.0.min(63)
}

fn name(t: Tok) -> String {
    format!("t{}", t.0)
}

fn parse(s: &str) -> Option<Tok> {
    s.strip_prefix('t')?.parse().ok().map(Tok)
}

/// Faults left to inject in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Faults {
    /// Try replies lost.
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
    /// Reads are decided as if no writer waited (the mark ignored): readers can keep a waiting
    /// writer out forever.
    ReadersIgnoreMark,
    /// A write's token is the stored one plus one, without the server-time floor.
    WriteFenceWithoutClock,
}

/// What a client does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Role {
    Reader,
    Writer,
    Upgrader,
}

/// The read-write lock model's parameters.
#[derive(Clone, Debug)]
pub(crate) struct RwModel {
    pub readers: u8,
    pub writers: u8,
    /// Writes each writer makes.
    pub rounds: u8,
    pub upgrader: bool,
    /// A waiting writer tries again with the token of its refused try (so its mark stays its
    /// own); else each try has a fresh token.
    pub keep_token: bool,
    pub faults: Faults,
    pub mutation: Option<Mutation>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Hold {
    tok: Tok,
    mode: RwMode,
    fence: u64,
    valid: bool,
    /// The upgradeable reader's progress: 0 read, 1 upgraded (writing), 2 wrote, 3 downgraded.
    stage: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    /// About to try (`Some`: the token of its refused try, kept for the next).
    Idle(Option<Tok>),
    Holding(Hold),
    Ended,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Client {
    role: Role,
    phase: Phase,
    rounds_left: u8,
}

/// A script call sent whose reply was lost, in connection order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Op {
    Try(Tok, RwMode),
    Release(Tok),
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Ghost {
    last_write: u64,
    abandoned: u64,
    wiped: bool,
    violation: Option<String>,
}

/// One state of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sys {
    writer: Option<Tok>,
    upgrader: Option<Tok>,
    /// The readers the state names (bit `t`).
    readers: u64,
    /// The last write's token as stored.
    fence: Option<u64>,
    /// The holders whose own lease key lives (bit `t`).
    leases: u64,
    mark: Option<Tok>,
    /// The fenced resource's highest accepted write token.
    resource: u64,
    clients: Vec<Client>,
    inflight: Vec<Vec<Op>>,
    faults: Faults,
    ghost: Ghost,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// The try script (the upgradeable read or a write, by role), with its reply.
    Try(u8),
    /// A plain reader's try. Its own action (as [`Action::ReadRelease`]) so that weak fairness,
    /// which tells steps apart by name, never counts a reader's step as a writer's.
    ReadTry(u8),
    /// A plain reader's release.
    ReadRelease(u8),
    /// The try script sent, its reply lost (fault).
    TryLost(u8),
    Apply(u8),
    Drop(u8),
    /// A writer (or the upgraded reader) writes to the fenced resource.
    Work(u8),
    /// The upgradeable reader's upgrade script.
    Upgrade(u8),
    /// Its downgrade script.
    Downgrade(u8),
    Release(u8),
    Extend(u8),
    Resume(u8),
    Pause(u8),
    Crash(u8),
    /// Holder `t`'s lease key expires.
    Expire(u8),
    /// ...that of an abandoned try (a fault for liveness).
    ExpireOrphan(u8),
    /// The mark lapses: nobody refreshed it.
    Lapse,
    Wipe,
}

fn violate(s: &mut Sys, message: String) {
    if s.ghost.violation.is_none() {
        s.ghost.violation = Some(message);
    }
}

impl RwModel {
    pub(crate) fn new(
        readers: u8,
        writers: u8,
        rounds: u8,
        upgrader: bool,
        faults: Faults,
    ) -> Self {
        RwModel {
            readers,
            writers,
            rounds,
            upgrader,
            keep_token: true,
            faults,
            mutation: None,
        }
    }

    fn fresh_token(s: &Sys) -> Tok {
        let mut used = s.ghost.abandoned | s.leases | s.readers;
        for t in [s.writer, s.upgrader, s.mark].into_iter().flatten() {
            used |= bit(t);
        }
        for c in &s.clients {
            match c.phase {
                Phase::Holding(h) => used |= bit(h.tok),
                Phase::Idle(Some(t)) => used |= bit(t),
                _ => {}
            }
        }
        for op in s.inflight.iter().flatten() {
            match *op {
                Op::Try(t, _) | Op::Release(t) => used |= bit(t),
            }
        }
        Tok(used.trailing_ones() as u8)
    }

    fn mode(role: Role) -> RwMode {
        match role {
            Role::Reader => RwMode::Read,
            Role::Writer => RwMode::Write,
            Role::Upgrader => RwMode::Upgradeable,
        }
    }

    fn state(&self, s: &Sys, mode: RwMode) -> RwState {
        let ignore = self.mutation == Some(Mutation::ReadersIgnoreMark) && mode != RwMode::Write;
        RwState {
            writer: s.writer.map(name),
            upgrader: s.upgrader.map(name),
            readers: (0..64)
                .filter(|t| s.readers >> t & 1 != 0)
                .map(|t| name(Tok(t)))
                .collect(),
            waiting: s.mark.filter(|_| !ignore).map(|t| (name(t), 100)),
        }
    }

    /// Applies a decision's state and mark for `tok`.
    fn apply(s: &mut Sys, st: &RwState, mark: MarkChange, tok: Tok) {
        s.writer = st.writer.as_deref().and_then(parse);
        s.upgrader = st.upgrader.as_deref().and_then(parse);
        s.readers = st
            .readers
            .iter()
            .filter_map(|r| parse(r))
            .fold(0, |a, t| a | bit(t));
        match mark {
            MarkChange::Keep => {}
            MarkChange::Set => s.mark = Some(tok),
            MarkChange::Clear => s.mark = None,
        }
    }

    fn valid_others(s: &Sys, tok: Tok, writers_only: bool) -> Option<(RwMode, u64)> {
        s.clients.iter().find_map(|c| match c.phase {
            Phase::Holding(h)
                if h.valid && h.tok != tok && (!writers_only || h.mode == RwMode::Write) =>
            {
                Some((h.mode, h.fence))
            }
            _ => None,
        })
    }

    /// The write fence step: `max(stored + 1, TIME)`.
    fn step_fence(&self, s: &mut Sys) -> u64 {
        let old = s.fence.unwrap_or(0);
        let fence = if self.mutation == Some(Mutation::WriteFenceWithoutClock) {
            old + 1
        } else {
            (old + 1).max(s.ghost.last_write + 1)
        };
        if fence <= s.ghost.last_write {
            violate(
                s,
                format!(
                    "write token went back: {fence} after {}",
                    s.ghost.last_write
                ),
            );
        }
        s.ghost.last_write = s.ghost.last_write.max(fence);
        s.fence = Some(fence);
        fence
    }

    /// The try script: `Ok(fence)` if granted, `Err(changed)` if not.
    fn try_script(&self, s: &mut Sys, tok: Tok, mode: RwMode) -> Result<u64, bool> {
        let leases = s.leases;
        let live = move |t: &str| parse(t).filter(|t| leases & bit(*t) != 0).map(|_| 100);
        let d = rw_decide(
            &self.state(s, mode),
            &live,
            &name(tok),
            mode,
            false,
            Duration::from_secs(1),
        );
        let before = (s.writer, s.upgrader, s.readers, s.mark);
        let mut st = d.state.clone();
        if self.mutation == Some(Mutation::ReadersIgnoreMark) {
            st.waiting = s.mark.map(|t| (name(t), 100));
        }
        Self::apply(s, &st, d.mark, tok);
        if !d.granted {
            return Err(before != (s.writer, s.upgrader, s.readers, s.mark));
        }
        s.leases |= bit(tok);
        if mode == RwMode::Write {
            if !s.ghost.wiped {
                if let Some((m, f)) = Self::valid_others(s, tok, false) {
                    violate(
                        s,
                        format!("a write granted beside a valid {m:?} holder ({f})"),
                    );
                }
            }
            Ok(self.step_fence(s))
        } else {
            if !s.ghost.wiped {
                if let Some((_, f)) = Self::valid_others(s, tok, true) {
                    violate(s, format!("a {mode:?} granted beside the valid writer {f}"));
                }
            }
            let fence = s.fence.unwrap_or(0);
            if !s.ghost.wiped && fence != s.ghost.last_write {
                violate(
                    s,
                    format!(
                        "a read carries {fence}, the last write was {}",
                        s.ghost.last_write
                    ),
                );
            }
            Ok(fence)
        }
    }

    fn release_script(s: &mut Sys, tok: Tok) {
        s.leases &= !bit(tok);
        s.readers &= !bit(tok);
        for slot in [&mut s.writer, &mut s.upgrader, &mut s.mark] {
            if *slot == Some(tok) {
                *slot = None;
            }
        }
    }

    fn end_round(s: &mut Sys, i: usize) {
        let c = &mut s.clients[i];
        if c.role != Role::Reader {
            c.rounds_left = c.rounds_left.saturating_sub(1);
        }
        c.phase = if c.rounds_left == 0 {
            Phase::Ended
        } else {
            Phase::Idle(None)
        };
    }

    fn vouched(s: &Sys, tok: Tok) -> bool {
        s.clients
            .iter()
            .any(|c| matches!(c.phase, Phase::Holding(h) if h.tok == tok && h.valid))
    }

    /// Whether someone refreshes the mark: the try with its token, or the upgrade.
    fn mark_kept(s: &Sys, tok: Tok) -> bool {
        s.clients.iter().any(|c| match c.phase {
            Phase::Idle(Some(t)) => t == tok,
            Phase::Holding(h) => h.tok == tok && h.valid && h.stage == 0 && s.upgrader == Some(tok),
            _ => false,
        })
    }

    fn canonical(mut s: Sys) -> Sys {
        let n = s.clients.len();
        let keys: Vec<u64> = (0..n)
            .map(|i| fx_hash(&(&s.clients[i], &s.inflight[i])))
            .collect();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| (s.clients[i].role, keys[i]));
        if order.iter().enumerate().any(|(pos, &i)| pos != i) {
            s.clients = order.iter().map(|&i| s.clients[i]).collect();
            s.inflight = order.iter().map(|&i| s.inflight[i].clone()).collect();
        }
        s
    }
}

impl Model for RwModel {
    type State = Sys;
    type Action = Action;

    fn init(&self) -> Vec<Sys> {
        let mut clients = Vec::new();
        let mut add = |role, n: u8, rounds| {
            for _ in 0..n {
                clients.push(Client {
                    role,
                    phase: Phase::Idle(None),
                    rounds_left: rounds,
                });
            }
        };
        add(Role::Reader, self.readers, 1);
        add(Role::Writer, self.writers, self.rounds);
        add(Role::Upgrader, u8::from(self.upgrader), 1);
        let n = clients.len();
        vec![Self::canonical(Sys {
            writer: None,
            upgrader: None,
            readers: 0,
            fence: None,
            leases: 0,
            mark: None,
            resource: 0,
            clients,
            inflight: vec![Vec::new(); n],
            faults: self.faults,
            ghost: Ghost::default(),
        })]
    }

    fn actions(&self, s: &Sys, out: &mut Vec<Action>) {
        let f = &s.faults;
        for (i, c) in s.clients.iter().enumerate() {
            let i8 = i as u8;
            if !s.inflight[i].is_empty() {
                out.push(Action::Apply(i8));
                if matches!(s.inflight[i].first(), Some(Op::Try(..))) {
                    out.push(Action::Drop(i8));
                }
            }
            match c.phase {
                Phase::Ended => {}
                Phase::Idle(_) if s.inflight[i].is_empty() => {
                    out.push(if c.role == Role::Reader {
                        Action::ReadTry(i8)
                    } else {
                        Action::Try(i8)
                    });
                    if f.lost_replies > 0 {
                        out.push(Action::TryLost(i8));
                    }
                }
                Phase::Idle(_) => {}
                Phase::Holding(h) => {
                    if h.valid {
                        match (c.role, h.stage) {
                            (Role::Writer, 0) => out.push(Action::Work(i8)),
                            (Role::Upgrader, 0) => out.push(Action::Upgrade(i8)),
                            (Role::Upgrader, 1) => out.push(Action::Work(i8)),
                            (Role::Upgrader, 2) => out.push(Action::Downgrade(i8)),
                            _ => {}
                        }
                        out.push(if c.role == Role::Reader {
                            Action::ReadRelease(i8)
                        } else {
                            Action::Release(i8)
                        });
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
        for t in 0..64u8 {
            if s.leases >> t & 1 == 0 {
                continue;
            }
            if s.ghost.abandoned >> t & 1 != 0 {
                out.push(Action::ExpireOrphan(t));
            } else if !Self::vouched(s, Tok(t)) {
                out.push(Action::Expire(t));
            }
        }
        if let Some(t) = s.mark {
            if !Self::mark_kept(s, t) {
                out.push(Action::Lapse);
            }
        }
        if f.wipes > 0 {
            out.push(Action::Wipe);
        }
    }

    fn next(&self, s: &Sys, a: &Action) -> Option<Sys> {
        let mut s = s.clone();
        let a = match *a {
            Action::ReadTry(i) => Action::Try(i),
            Action::ReadRelease(i) => Action::Release(i),
            other => other,
        };
        match a {
            Action::ReadTry(_) | Action::ReadRelease(_) => return None,
            Action::Try(i) => {
                let c = s.clients[i as usize];
                let mode = Self::mode(c.role);
                let tok = match c.phase {
                    Phase::Idle(Some(t)) if self.keep_token => t,
                    _ => Self::fresh_token(&s),
                };
                match self.try_script(&mut s, tok, mode) {
                    Ok(fence) => {
                        s.clients[i as usize].phase = Phase::Holding(Hold {
                            tok,
                            mode,
                            fence,
                            valid: true,
                            stage: 0,
                        });
                    }
                    Err(changed) => {
                        // Busy: a waiting writer tries again (with this token, if kept).
                        let retry = (self.keep_token && mode == RwMode::Write).then_some(tok);
                        let was = s.clients[i as usize].phase;
                        s.clients[i as usize].phase = Phase::Idle(retry);
                        if !changed && was == Phase::Idle(retry) {
                            return None;
                        }
                    }
                }
            }
            Action::TryLost(i) => {
                s.faults.lost_replies -= 1;
                let c = s.clients[i as usize];
                let tok = Self::fresh_token(&s);
                let lost: Result<Grant, Error> = Err(Error::Timeout {
                    during: "acquiring the read-write lock",
                });
                s.ghost.abandoned |= bit(tok);
                s.clients[i as usize].phase = Phase::Idle(None);
                let q = &mut s.inflight[i as usize];
                q.push(Op::Try(tok, Self::mode(c.role)));
                if orphaned(&lost) {
                    q.push(Op::Release(tok));
                }
            }
            Action::Apply(i) => match s.inflight[i as usize].remove(0) {
                Op::Try(tok, mode) => {
                    let _ = self.try_script(&mut s, tok, mode);
                }
                Op::Release(tok) => Self::release_script(&mut s, tok),
            },
            Action::Drop(i) => {
                s.inflight[i as usize].remove(0);
            }
            Action::Work(i) => {
                let Phase::Holding(h) = &mut s.clients[i as usize].phase else {
                    return None;
                };
                h.stage += 1;
                let (fence, valid) = (h.fence, h.valid);
                if fence >= s.resource {
                    s.resource = fence;
                } else if valid && !s.ghost.wiped {
                    violate(
                        &mut s,
                        format!("the resource refused the valid writer of token {fence}"),
                    );
                }
            }
            Action::Upgrade(i) => {
                let Phase::Holding(h) = s.clients[i as usize].phase else {
                    return None;
                };
                if s.leases & bit(h.tok) == 0 || s.upgrader != Some(h.tok) {
                    // `{3}`: the upgradeable read's lease ended; the guard reports it lost.
                    Self::end_round(&mut s, i as usize);
                } else {
                    let leases = s.leases;
                    let live =
                        move |t: &str| parse(t).filter(|t| leases & bit(*t) != 0).map(|_| 100);
                    let d = rw_decide(
                        &self.state(&s, RwMode::Write),
                        &live,
                        &name(h.tok),
                        RwMode::Write,
                        true,
                        Duration::from_secs(1),
                    );
                    let before = s.clone();
                    Self::apply(&mut s, &d.state, d.mark, h.tok);
                    if !d.granted {
                        if s == before {
                            return None;
                        }
                    } else {
                        if !s.ghost.wiped {
                            if let Some((m, f)) = Self::valid_others(&s, h.tok, false) {
                                violate(
                                    &mut s,
                                    format!("an upgrade granted beside a valid {m:?} holder ({f})"),
                                );
                            }
                        }
                        let fence = self.step_fence(&mut s);
                        s.clients[i as usize].phase = Phase::Holding(Hold {
                            mode: RwMode::Write,
                            fence,
                            stage: 1,
                            ..h
                        });
                    }
                }
            }
            Action::Downgrade(i) => {
                let Phase::Holding(h) = s.clients[i as usize].phase else {
                    return None;
                };
                if s.leases & bit(h.tok) != 0 && s.writer == Some(h.tok) {
                    s.writer = None;
                    s.upgrader = Some(h.tok);
                    s.clients[i as usize].phase = Phase::Holding(Hold {
                        mode: RwMode::Upgradeable,
                        stage: 3,
                        ..h
                    });
                } else {
                    // No longer the writer: the guard reports the lease lost.
                    Self::end_round(&mut s, i as usize);
                }
            }
            Action::Release(i) => {
                let Phase::Holding(h) = s.clients[i as usize].phase else {
                    return None;
                };
                Self::release_script(&mut s, h.tok);
                Self::end_round(&mut s, i as usize);
            }
            Action::Extend(i) => {
                let Phase::Holding(h) = s.clients[i as usize].phase else {
                    return None;
                };
                let outcome: Result<Extension, Error> = if s.leases & bit(h.tok) != 0 {
                    Ok(Extension::Confirmed {
                        sent: Instant::now(),
                    })
                } else {
                    Ok(Extension::Refused)
                };
                match after_extension(&outcome) {
                    WatchStep::Extended { .. } | WatchStep::Retry => return None,
                    // The loss signal: the work is cancelled and the guard's release runs.
                    WatchStep::Lost(_) => {
                        Self::release_script(&mut s, h.tok);
                        Self::end_round(&mut s, i as usize);
                    }
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
                    Self::release_script(&mut s, h.tok);
                }
                Self::end_round(&mut s, i as usize);
            }
            Action::Crash(i) => {
                s.faults.crashes -= 1;
                s.clients[i as usize].phase = Phase::Ended;
            }
            Action::Expire(t) | Action::ExpireOrphan(t) => s.leases &= !(1u64 << t),
            Action::Lapse => s.mark = None,
            Action::Wipe => {
                s.faults.wipes -= 1;
                s.ghost.wiped = true;
                s.writer = None;
                s.upgrader = None;
                s.readers = 0;
                s.fence = None;
                s.leases = 0;
                s.mark = None;
                for q in &mut s.inflight {
                    q.clear();
                }
            }
        }
        // A holder the state names whose lease ended is dropped by the next script that reads
        // it; dropping it now keeps equal states equal. Abandoned tokens nothing refers to any
        // more can never matter again.
        let leases = s.leases;
        s.readers &= leases;
        for slot in [&mut s.writer, &mut s.upgrader] {
            if slot.is_some_and(|t| leases & bit(t) == 0) {
                *slot = None;
            }
        }
        let mut live = s.leases;
        for op in s.inflight.iter().flatten() {
            match *op {
                Op::Try(t, _) | Op::Release(t) => live |= bit(t),
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

    /// Readers never end: the run is over once every writer and the upgradeable reader ended
    /// and nothing of theirs is left.
    fn is_terminal(&self, s: &Sys) -> bool {
        s.inflight.iter().all(Vec::is_empty)
            && s.writer.is_none()
            && s.upgrader.is_none()
            && s.mark.is_none()
            && s.clients
                .iter()
                .all(|c| c.role == Role::Reader || c.phase == Phase::Ended)
    }
}

#[cfg(test)]
mod tests {
    //! The read-write lock holds on small fleets, and each planted bug is found.

    use super::*;
    use crate::check::{check_exhaustive, Limits, Outcome};

    fn run(model: &RwModel) -> Outcome<Sys> {
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

    #[test]
    fn the_rwlock_holds() {
        for faults in [
            Faults {
                lost_replies: 1,
                pauses: 1,
                crashes: 1,
                wipes: 0,
            },
            Faults {
                wipes: 1,
                ..Faults::default()
            },
        ] {
            let outcome = run(&RwModel::new(2, 1, 1, true, faults));
            assert!(matches!(outcome, Outcome::Exhausted), "{outcome}");
        }
    }

    #[test]
    fn readers_ignoring_a_waiting_writer_starve_it() {
        let mut model = RwModel::new(2, 1, 1, false, Faults::default());
        model.mutation = Some(Mutation::ReadersIgnoreMark);
        match run(&model) {
            Outcome::FairCycle(cx) => eprintln!("{cx}"),
            other => panic!("expected a fair cycle, got {other}"),
        }
    }

    /// A waiting writer whose every try has a fresh token never refreshes its mark (only a try
    /// with the mark's token does): the mark lapses while it waits and readers keep it out.
    #[test]
    fn a_waiting_writer_with_a_fresh_token_per_try_is_starved() {
        let mut model = RwModel::new(2, 1, 1, false, Faults::default());
        model.keep_token = false;
        match run(&model) {
            Outcome::FairCycle(cx) => eprintln!("{cx}"),
            other => panic!("expected a fair cycle, got {other}"),
        }
    }

    #[test]
    fn write_tokens_without_the_clock_go_back_after_data_loss() {
        let faults = Faults {
            wipes: 1,
            ..Faults::default()
        };
        let mut model = RwModel::new(1, 1, 2, false, faults);
        model.mutation = Some(Mutation::WriteFenceWithoutClock);
        match run(&model) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(cx.message.contains("went back"), "{}", cx.message);
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }
}
