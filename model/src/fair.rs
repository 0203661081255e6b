//! The fair lock (`src/fair/`, scripts in `src/lease/queue.rs`) as a model for the checker.
//!
//! Clients acquire (one try that grants or queues them), subscribe to their wake channel and
//! try again, wait, and try on a wake message, on their nap timer, or on their liveness
//! refresh; a holder writes to a fenced resource and releases (the leave script, which wakes
//! only the next waiter). One client may be a reserver (`SET NX` reservation, then the same
//! wait as the reserver). The scripts are atomic server steps; the waiter's nap decision is the
//! library's own [`waiting_nap`]: whether a waiter wakes before its liveness refresh (it
//! watches the holder's lease or a reservation) is what that function returns.
//!
//! Faults: acquisition and release replies lost, waiter death (a crash: its liveness entry then
//! passes and the next queued try evicts it, or a grant or release once it heads the queue), a
//! waiter's liveness passing while it lives (a
//! pause), holder pauses past the lease, crashes, lost wake messages, a reservation running
//! out while its owner waits.
//!
//! Time is logical. A lock, a liveness entry or a reservation nobody vouches for may run out
//! at any step (not a fault). A waiter's liveness refresh (a third of its timeout) is a slow
//! path: for the liveness check it counts only once, since that waiter's last try, some
//! waiter's liveness passed (a dead waiter delays the queue by its timeout plus one refresh),
//! or a client crashed or its wake message was lost while it did not watch a lease (its nap
//! was the refresh anyway). Otherwise the handoff must happen by wake messages and nap timers
//! alone: the head must watch the lease of a holder that crashes.
//!
//! Properties (safety, every state):
//! - at most one *valid* holder at a time, and the fenced resource never refuses one;
//! - fencing tokens of grants strictly increase;
//! - arrival order: no grant to a waiter while one that queued earlier is still live (its
//!   liveness has not passed), unless the grant consumes the reservation;
//! - a reservation goes next: no grant to anyone else while it exists.
//!
//! Liveness: from every state, fault-free steps (refreshes as above) end every client with no
//! lock and no reservation left.

use std::time::Duration;

use super::check::Model;
use baton::model_api::waiting_nap;

/// A waiter id / lock token: client `c`'s round `r` is `c * rounds + r`.
type Tok = u8;

/// Faults left to inject in one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Faults {
    /// Acquisition or release replies lost.
    pub lost_replies: u8,
    /// Lost wake messages.
    pub lost_messages: u8,
    /// Holders pausing past their lease, waiters past their liveness, reservers past the
    /// reservation's lifetime.
    pub pauses: u8,
    /// Client crashes (holders and waiters).
    pub crashes: u8,
}

/// A deliberate bug, to show the checker finds it.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mutation {
    /// The acquire script grants whenever the lock is free (no queue, no reservation check).
    GrantWhenFree,
    /// The acquire script ignores the reservation.
    IgnoreReservation,
    /// The leave script deletes the lock without comparing the id.
    LeaveWithoutIdCheck,
    /// The head does not shorten its nap to the holder's lease or the reservation.
    NoLeaseWatch,
}

/// The fair lock model's parameters.
#[derive(Clone, Debug)]
pub(crate) struct FairModel {
    pub clients: u8,
    /// Acquisitions each client makes.
    pub rounds: u8,
    /// Client 0 reserves before each acquisition.
    pub reserver: bool,
    pub faults: Faults,
    pub mutation: Option<Mutation>,
    /// Holds the head to the module docs' word ("a crashed holder publishes nothing: the head
    /// sleeps at most the lock's PTTL") for every waiter: no refresh counts after a holder's
    /// crash or a lost release. False by default: a waiter that became the head by the grant
    /// of the one before it (without a try since) naps its refresh, not the lease, which the
    /// test `a_new_head_naps_its_refresh_not_the_lease_of_a_crashed_holder` shows.
    pub strict: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Phase {
    Idle,
    /// Queued (or about to be: before its first try).
    Waiting {
        tok: Tok,
        reserver: bool,
        /// Subscribed to its wake channel.
        sub: bool,
        /// A wake message is waiting to be read.
        msg: bool,
        /// Its nap ends before its liveness refresh (it watches a lease or a reservation).
        watch: bool,
        /// A transient error: it tries again after a backoff.
        retry: bool,
        /// Some waiter's liveness passed since this one's last try.
        death_seen: bool,
    },
    Holding {
        tok: Tok,
        fence: u64,
        valid: bool,
        wrote: bool,
    },
    Ended,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Client {
    phase: Phase,
    round: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Entry {
    tok: Tok,
    /// Its liveness time passed (the next queued try evicts it; a grant or a release once it
    /// heads the queue).
    passed: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Ghost {
    last_fence: u64,
    violation: Option<String>,
}

/// One state of the model.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sys {
    lock: Option<Tok>,
    fence: u64,
    /// The waiter queue in arrival order, each with its liveness entry.
    queue: Vec<Entry>,
    reservation: Option<Tok>,
    /// The fenced resource's highest accepted token.
    resource: u64,
    clients: Vec<Client>,
    faults: Faults,
    ghost: Ghost,
}

/// One step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// An idle client starts an acquisition (the reserver first reserves).
    Start(u8),
    /// A waiter's try (its first, or the one right after subscribing, or after a backoff).
    Try(u8),
    /// A try whose reply is lost: the script ran; the waiter backs off and tries again.
    TryLost(u8),
    Subscribe(u8),
    /// The wake message is read: try now.
    Woken(u8),
    /// The nap (shortened to the holder's lease or the reservation) ends: try.
    NapEnds(u8),
    /// The liveness refresh: try (the slow path; see the module docs).
    Refresh(u8),
    /// The same, counted as a fault for liveness: no waiter died since this one's last try.
    RefreshSlow(u8),
    LoseMessage(u8),
    Work(u8),
    Release(u8),
    /// The release's reply lost, and the script never ran (the lock's TTL is the backstop).
    ReleaseLost(u8),
    /// A paused holder resumes: its loss signal fired; it releases by id.
    Resume(u8),
    Pause(u8),
    Crash(u8),
    /// The lock's TTL runs out (no valid holder vouches for it).
    Expire,
    /// The lock granted by a try whose reply was lost runs out before its owner tried again
    /// (a fault: the retry comes after a short backoff).
    ExpireUnclaimed,
    /// A dead waiter's liveness time passes.
    LivenessPasses(Tok),
    /// A live waiter's liveness passes (it paused).
    LivenessPaused(Tok),
    /// The reservation runs out, its owner gone.
    ReservationEnds,
    /// The reservation runs out while its owner waits (it paused).
    ReservationPaused,
}

fn violate(s: &mut Sys, message: String) {
    if s.ghost.violation.is_none() {
        s.ghost.violation = Some(message);
    }
}

/// What one try found.
enum TryReply {
    Granted(u64),
    Waiting {
        pttl: Option<Duration>,
        rank: Option<u64>,
        reserved: Option<Duration>,
    },
    ReservationGone,
}

const REFRESH: Duration = Duration::from_secs(10);
/// Any PTTL the scripts report: shorter than the refresh.
const PTTL: Duration = Duration::from_secs(1);

impl FairModel {
    pub(crate) fn new(clients: u8, rounds: u8, reserver: bool, faults: Faults) -> Self {
        FairModel {
            clients,
            rounds,
            reserver,
            faults,
            mutation: None,
            strict: false,
        }
    }

    /// A queued try's scan: every waiter whose liveness passed.
    fn evict(s: &mut Sys) {
        s.queue.retain(|e| !e.passed);
    }

    /// A grant's or a release's look at the head: dead heads only, up to the first live one.
    fn evict_head(s: &mut Sys) {
        let live = s
            .queue
            .iter()
            .position(|e| !e.passed)
            .unwrap_or(s.queue.len());
        s.queue.drain(..live);
    }

    /// The acquire-or-enqueue script, atomically.
    fn acquire_script(&self, s: &mut Sys, tok: Tok, reserver: bool) -> TryReply {
        if s.lock == Some(tok) {
            return TryReply::Granted(s.fence);
        }
        if reserver && s.reservation != Some(tok) {
            return TryReply::ReservationGone;
        }
        if s.lock.is_none() {
            let res = if self.mutation == Some(Mutation::IgnoreReservation) {
                None
            } else {
                s.reservation
            };
            let go = match res {
                _ if self.mutation == Some(Mutation::GrantWhenFree) => true,
                Some(r) => r == tok,
                None => {
                    Self::evict_head(s);
                    s.queue.first().map_or(true, |h| h.tok == tok)
                }
            };
            if go {
                self.check_grant(s, tok);
                s.lock = Some(tok);
                s.queue.retain(|e| e.tok != tok);
                if s.reservation.is_some() {
                    s.reservation = None;
                }
                let fence = (s.fence + 1).max(s.ghost.last_fence + 1);
                if fence <= s.ghost.last_fence {
                    violate(s, format!("fencing token went back: {fence}"));
                }
                s.ghost.last_fence = fence;
                s.fence = fence;
                return TryReply::Granted(fence);
            }
        }
        Self::evict(s);
        let pttl = s.lock.map(|_| PTTL);
        if reserver {
            return TryReply::Waiting {
                pttl,
                rank: None,
                reserved: Some(PTTL),
            };
        }
        match s.queue.iter_mut().find(|e| e.tok == tok) {
            Some(e) => e.passed = false,
            None => s.queue.push(Entry { tok, passed: false }),
        }
        let rank = s.queue.iter().position(|e| e.tok == tok).unwrap_or(0) as u64;
        TryReply::Waiting {
            pttl,
            rank: Some(rank),
            reserved: s.reservation.map(|_| PTTL),
        }
    }

    /// The properties a grant to `tok` must keep (checked before the script changes anything).
    fn check_grant(&self, s: &mut Sys, tok: Tok) {
        if let Some(other) = s.clients.iter().find_map(|c| match c.phase {
            Phase::Holding { fence, valid, .. } if valid => Some(fence),
            _ => None,
        }) {
            violate(
                s,
                format!("granted {tok} while the holder of fencing token {other} is still valid"),
            );
        }
        match s.reservation {
            Some(r) if r != tok => violate(
                s,
                format!("granted {tok} while the reservation of {r} exists"),
            ),
            Some(_) => {}
            None => {
                // Arrival order: every entry ahead of `tok` (or every entry, for a newcomer)
                // must have passed its liveness.
                for e in &s.queue {
                    if e.tok == tok {
                        break;
                    }
                    if !e.passed {
                        let msg = format!(
                            "granted {tok} ahead of waiter {} that queued earlier and is live",
                            e.tok
                        );
                        violate(s, msg);
                        return;
                    }
                }
            }
        }
    }

    /// The leave script (also the release).
    fn leave_script(&self, s: &mut Sys, tok: Tok) {
        if s.lock == Some(tok)
            || (s.lock.is_some() && self.mutation == Some(Mutation::LeaveWithoutIdCheck))
        {
            s.lock = None;
        }
        s.queue.retain(|e| e.tok != tok);
        if s.reservation == Some(tok) {
            s.reservation = None;
        }
        if s.lock.is_some() {
            return;
        }
        let next = match s.reservation {
            Some(r) => Some(r),
            None => {
                Self::evict_head(s);
                s.queue.first().map(|e| e.tok)
            }
        };
        if let Some(n) = next {
            for c in &mut s.clients {
                if let Phase::Waiting {
                    tok,
                    sub: true,
                    msg,
                    ..
                } = &mut c.phase
                {
                    if *tok == n {
                        *msg = true;
                    }
                }
            }
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

    /// A waiter's try and what it does with the reply.
    fn try_turn(&self, s: &mut Sys, i: usize, lost: bool) {
        let Phase::Waiting {
            tok, reserver, sub, ..
        } = s.clients[i].phase
        else {
            return;
        };
        let reply = self.acquire_script(s, tok, reserver);
        if lost {
            if let Phase::Waiting {
                retry,
                msg,
                death_seen,
                ..
            } = &mut s.clients[i].phase
            {
                *retry = true;
                *msg = false;
                *death_seen = false;
            }
            return;
        }
        match reply {
            TryReply::Granted(fence) => {
                s.clients[i].phase = Phase::Holding {
                    tok,
                    fence,
                    valid: true,
                    wrote: false,
                };
            }
            // The acquisition fails; its exit leaves by id.
            TryReply::ReservationGone => {
                self.leave_script(s, tok);
                self.end_round(s, i);
            }
            TryReply::Waiting {
                pttl,
                rank,
                reserved,
            } => {
                let (pttl, reserved) = if self.mutation == Some(Mutation::NoLeaseWatch) {
                    (None, None)
                } else {
                    (pttl, reserved)
                };
                let nap = waiting_nap(REFRESH, reserver, pttl, rank, reserved);
                s.clients[i].phase = Phase::Waiting {
                    tok,
                    reserver,
                    sub,
                    msg: false,
                    watch: nap < REFRESH,
                    // Not yet subscribed: it subscribes, then tries at once.
                    retry: false,
                    death_seen: false,
                };
            }
        }
    }

    /// Whether a live, valid holder vouches for the lock `tok`.
    fn vouched(s: &Sys, tok: Tok) -> bool {
        s.clients
            .iter()
            .any(|c| matches!(c.phase, Phase::Holding { tok: t, valid: true, .. } if t == tok))
    }

    /// After a fault that publishes nothing: a waiter whose nap does not watch a lease goes
    /// on at its refresh.
    fn slow_path(&self, s: &mut Sys) {
        if self.strict {
            return;
        }
        for c in &mut s.clients {
            if let Phase::Waiting {
                watch: false,
                death_seen,
                ..
            } = &mut c.phase
            {
                *death_seen = true;
            }
        }
    }

    fn waiting(s: &Sys, tok: Tok) -> bool {
        s.clients
            .iter()
            .any(|c| matches!(c.phase, Phase::Waiting { tok: t, .. } if t == tok))
    }
}

impl Model for FairModel {
    type State = Sys;
    type Action = Action;

    fn init(&self) -> Vec<Sys> {
        vec![Sys {
            lock: None,
            fence: 0,
            queue: Vec::new(),
            reservation: None,
            resource: 0,
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    round: 0,
                };
                self.clients as usize
            ],
            faults: self.faults,
            ghost: Ghost::default(),
        }]
    }

    fn actions(&self, s: &Sys, out: &mut Vec<Action>) {
        let f = &s.faults;
        for (i, c) in s.clients.iter().enumerate() {
            let i8 = i as u8;
            match c.phase {
                Phase::Ended => continue,
                Phase::Idle => out.push(Action::Start(i8)),
                Phase::Waiting {
                    sub,
                    msg,
                    watch,
                    retry,
                    death_seen,
                    ..
                } => {
                    if retry {
                        out.push(Action::Try(i8));
                    } else if !sub {
                        out.push(Action::Subscribe(i8));
                    } else {
                        if msg {
                            out.push(Action::Woken(i8));
                            if f.lost_messages > 0 {
                                out.push(Action::LoseMessage(i8));
                            }
                        }
                        if watch {
                            out.push(Action::NapEnds(i8));
                        }
                        out.push(if death_seen {
                            Action::Refresh(i8)
                        } else {
                            Action::RefreshSlow(i8)
                        });
                    }
                    if f.lost_replies > 0 {
                        out.push(Action::TryLost(i8));
                    }
                }
                Phase::Holding { valid, wrote, .. } => {
                    if !wrote {
                        out.push(Action::Work(i8));
                    }
                    if valid {
                        out.push(Action::Release(i8));
                        if f.lost_replies > 0 {
                            out.push(Action::ReleaseLost(i8));
                        }
                        if f.pauses > 0 {
                            out.push(Action::Pause(i8));
                        }
                    } else {
                        out.push(Action::Resume(i8));
                    }
                }
            }
            if f.crashes > 0 && c.phase != Phase::Idle {
                out.push(Action::Crash(i8));
            }
        }
        if let Some(tok) = s.lock {
            if Self::waiting(s, tok) {
                // A grant whose reply was lost: its owner tries again (and is granted) well
                // within the lock's TTL; the lock running out first is a fault.
                out.push(Action::ExpireUnclaimed);
            } else if !Self::vouched(s, tok) {
                out.push(Action::Expire);
            }
        }
        for e in &s.queue {
            if !e.passed {
                if Self::waiting(s, e.tok) {
                    if f.pauses > 0 {
                        out.push(Action::LivenessPaused(e.tok));
                    }
                } else {
                    out.push(Action::LivenessPasses(e.tok));
                }
            }
        }
        if let Some(r) = s.reservation {
            if Self::waiting(s, r) {
                if f.pauses > 0 {
                    out.push(Action::ReservationPaused);
                }
            } else {
                out.push(Action::ReservationEnds);
            }
        }
    }

    fn next(&self, s: &Sys, a: &Action) -> Option<Sys> {
        let mut s = s.clone();
        match *a {
            Action::Start(i) => {
                let c = s.clients[i as usize];
                let tok = i * self.rounds + c.round;
                let reserver = self.reserver && i == 0;
                if reserver {
                    if s.reservation.is_some() {
                        // `Error::Reserved`: this acquisition does not happen.
                        self.end_round(&mut s, i as usize);
                        return Some(s);
                    }
                    s.reservation = Some(tok);
                }
                s.clients[i as usize].phase = Phase::Waiting {
                    tok,
                    reserver,
                    sub: false,
                    msg: false,
                    watch: false,
                    retry: true,
                    death_seen: false,
                };
            }
            Action::Try(i)
            | Action::Woken(i)
            | Action::NapEnds(i)
            | Action::Refresh(i)
            | Action::RefreshSlow(i) => self.try_turn(&mut s, i as usize, false),
            Action::TryLost(i) => {
                s.faults.lost_replies -= 1;
                self.try_turn(&mut s, i as usize, true);
            }
            Action::Subscribe(i) => {
                if let Phase::Waiting { sub, retry, .. } = &mut s.clients[i as usize].phase {
                    *sub = true;
                    // A release before the subscription published to nobody: try at once.
                    *retry = true;
                }
            }
            Action::LoseMessage(i) => {
                s.faults.lost_messages -= 1;
                if let Phase::Waiting {
                    msg,
                    watch,
                    death_seen,
                    ..
                } = &mut s.clients[i as usize].phase
                {
                    *msg = false;
                    // Without a nap shortened to a lease, the refresh is its way on.
                    *death_seen |= !*watch;
                }
            }
            Action::Work(i) => {
                let Phase::Holding {
                    fence,
                    valid,
                    wrote,
                    ..
                } = &mut s.clients[i as usize].phase
                else {
                    return None;
                };
                *wrote = true;
                let (fence, valid) = (*fence, *valid);
                if fence >= s.resource {
                    s.resource = fence;
                } else if valid {
                    violate(
                        &mut s,
                        format!("the resource refused the valid holder of token {fence}"),
                    );
                }
            }
            Action::Release(i) | Action::Resume(i) => {
                let Phase::Holding { tok, .. } = s.clients[i as usize].phase else {
                    return None;
                };
                self.leave_script(&mut s, tok);
                self.end_round(&mut s, i as usize);
            }
            Action::ReleaseLost(i) => {
                s.faults.lost_replies -= 1;
                self.end_round(&mut s, i as usize);
                // Nothing published: the lock runs out on its TTL.
                self.slow_path(&mut s);
            }
            Action::Pause(i) => {
                s.faults.pauses -= 1;
                if let Phase::Holding { valid, .. } = &mut s.clients[i as usize].phase {
                    *valid = false;
                }
            }
            Action::Crash(i) => {
                s.faults.crashes -= 1;
                s.clients[i as usize].phase = Phase::Ended;
                // A crashed holder publishes nothing: the head watches its lease (its nap);
                // the others learn on their refresh.
                self.slow_path(&mut s);
            }
            Action::Expire => s.lock = None,
            Action::ExpireUnclaimed => {
                s.lock = None;
                // Nothing was published: as after a crash.
                self.slow_path(&mut s);
            }
            Action::LivenessPasses(t) | Action::LivenessPaused(t) => {
                if matches!(a, Action::LivenessPaused(_)) {
                    s.faults.pauses -= 1;
                }
                for e in &mut s.queue {
                    if e.tok == t {
                        e.passed = true;
                    }
                }
                for c in &mut s.clients {
                    if let Phase::Waiting { death_seen, .. } = &mut c.phase {
                        *death_seen = true;
                    }
                }
            }
            Action::ReservationEnds => s.reservation = None,
            Action::ReservationPaused => {
                s.faults.pauses -= 1;
                s.reservation = None;
            }
        }
        Some(s)
    }

    fn is_fault(&self, a: &Action) -> bool {
        matches!(
            a,
            Action::TryLost(_)
                | Action::RefreshSlow(_)
                | Action::LoseMessage(_)
                | Action::ReleaseLost(_)
                | Action::Pause(_)
                | Action::Crash(_)
                | Action::LivenessPaused(_)
                | Action::ReservationPaused
                | Action::ExpireUnclaimed
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
            && s.reservation.is_none()
            && s.clients.iter().all(|c| c.phase == Phase::Ended)
    }
}

#[cfg(test)]
mod tests {
    //! The fair lock holds on small fleets, and each planted bug is found.

    use super::*;
    use crate::check::{check_exhaustive, Limits, Outcome};
    use std::time::Duration;

    fn run(model: &FairModel) -> Outcome<Sys> {
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
        lost_messages: 1,
        pauses: 1,
        crashes: 1,
    };

    fn mutated(clients: u8, rounds: u8, reserver: bool, faults: Faults, m: Mutation) -> FairModel {
        let mut model = FairModel::new(clients, rounds, reserver, faults);
        model.mutation = Some(m);
        model
    }

    fn violation(model: &FairModel, needle: &str) {
        match run(model) {
            Outcome::Violation(cx) => {
                eprintln!("{cx}");
                assert!(cx.message.contains(needle), "{}", cx.message);
            }
            other => panic!("expected a counterexample, got {other}"),
        }
    }

    #[test]
    fn the_fair_lock_holds() {
        for reserver in [false, true] {
            let outcome = run(&FairModel::new(2, 2, reserver, ALL));
            assert!(matches!(outcome, Outcome::Exhausted), "{outcome}");
        }
    }

    #[test]
    fn a_new_head_naps_its_refresh_not_the_lease_of_a_crashed_holder() {
        let faults = Faults {
            crashes: 1,
            ..Faults::default()
        };
        let mut model = FairModel::new(3, 1, false, faults);
        model.strict = true;
        match run(&model) {
            Outcome::LivenessViolation(cx) => {
                eprintln!("{cx}");
                // The one left waits for its refresh: the lock is gone or held by the crashed
                // one, and it neither has a message nor watches a lease.
                let s = cx.last_state();
                assert!(
                    s.clients.iter().any(|c| matches!(
                        c.phase,
                        Phase::Waiting {
                            msg: false,
                            watch: false,
                            ..
                        }
                    )),
                    "{cx}"
                );
            }
            other => panic!("expected a liveness counterexample, got {other}"),
        }
    }

    #[test]
    fn a_grant_whenever_free_breaks_arrival_order() {
        violation(
            &mutated(2, 2, false, Faults::default(), Mutation::GrantWhenFree),
            "queued earlier",
        );
    }

    #[test]
    fn a_grant_ignoring_the_reservation_is_found() {
        violation(
            &mutated(2, 1, true, Faults::default(), Mutation::IgnoreReservation),
            "reservation",
        );
    }

    #[test]
    fn a_leave_without_the_id_check_breaks_mutual_exclusion() {
        let faults = Faults {
            pauses: 1,
            ..Faults::default()
        };
        violation(
            &mutated(2, 2, false, faults, Mutation::LeaveWithoutIdCheck),
            "still valid",
        );
    }

    #[test]
    fn a_head_that_does_not_watch_the_lease_waits_forever_on_a_crashed_holder() {
        let faults = Faults {
            crashes: 1,
            ..Faults::default()
        };
        match run(&mutated(2, 1, false, faults, Mutation::NoLeaseWatch)) {
            Outcome::LivenessViolation(cx) => eprintln!("{cx}"),
            other => panic!("expected a liveness counterexample, got {other}"),
        }
    }
}
