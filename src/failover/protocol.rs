//! The failover protocol's decisions, as pure functions.
//!
//! Every transition of a job is an optimistic transaction on a dedicated connection: round trip 1
//! `WATCH`es the state, lease and fence keys and reads them (plus the server's `TIME`); then one
//! of the functions here decides what to do from what was read and what this worker saw before;
//! round trip 2 is the `MULTI … EXEC` that carries the decision out. Nothing in this file does
//! I/O, so each rule of the protocol is a unit test below, and property tests (or a model
//! checker) can drive exactly the code the worker runs.
//!
//! Why the decisions look the way they do:
//! - A backup takes over only when the lease is gone *and* the counter still holds the attempt it
//!   expects (the WATCH makes the second half atomic with the write). The original ignored the
//!   expected count and could grant one attempt twice.
//! - Only the exact sentinels `DONE` and `EXHAUSTED` and canonical positive integers are ours.
//!   Anything else (`0`, `03`, `+3`, `done`, `DONE\0`, a list) is reported and never overwritten:
//!   a job whose state we cannot read must not be re-run on a guess.
//! - A worker that saw attempt `n` and later sees less (or nothing, or a lease without a state)
//!   knows Redis lost data; granting then could run the job a second time as "attempt 1", so it
//!   reports `StateLost` instead.

use std::time::Duration;

use crate::lease::next_fence;
use crate::util::time::human;

// The values the store reads and writes are leaves (the backends build them); the decisions
// below, the worker and the model checker name them here.
/// The keys every transition `WATCH`es (the Redis store reads it from the leaf).
#[cfg(feature = "model")]
pub use crate::util::jobs::WATCHED;
pub use crate::util::jobs::{Fence, Lease, Message, Observation, State, StateValue, Which, Write};

/// A condition that stops the protocol: reported, never written over.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Fault {
    Corrupt { which: Which, value: String },
    WrongType { which: Which, detail: String },
    StateLost { seen: String, now: String },
}

/// What a backup (a worker not holding an attempt) remembers between observations.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct BackupView {
    /// The highest attempt number this worker has seen in the state key.
    pub seen: Option<u64>,
    /// Grants whose `EXEC` reply was lost: each may have been applied (even after a later one
    /// was sent: a reply lost to a paused Redis can still apply once it resumes), so all are
    /// kept, the oldest dropped beyond `MAX_PENDING`.
    pub pending: Vec<PendingGrant>,
    /// This worker's `max_attempts`.
    pub max_attempts: u64,
    /// Whether takeovers wait `retry_delay` first.
    pub has_retry_delay: bool,
    /// The attempt whose failure this worker has already waited `retry_delay` for.
    pub delay_served_for: Option<u64>,
    /// The last fencing token this worker was granted (0 if none); tokens never go back.
    pub last_fence: u64,
}

/// How many grants of unknown outcome a worker remembers (each lost reply adds one; more than a
/// few in a row means Redis is unreachable and the oldest are long expired).
pub const MAX_PENDING: usize = 8;

impl BackupView {
    /// Remembers a grant whose reply was lost, keeping the earlier ones.
    pub fn remember_pending(&mut self, grant: PendingGrant) {
        if self.pending.len() >= MAX_PENDING {
            self.pending.remove(0);
        }
        self.pending.push(grant);
    }
}

/// A grant that was sent but whose outcome is unknown.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PendingGrant {
    pub attempt: u64,
    pub token: String,
    pub fence: u64,
}

/// What a backup does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Write `s = attempt`, a new lease and `fence`.
    Grant {
        attempt: u64,
        last: bool,
        fence: u64,
    },
    /// A grant whose reply was lost turned out to be applied: we hold `attempt` with `token`.
    Resume {
        attempt: u64,
        last: bool,
        fence: u64,
        token: String,
    },
    /// The job is `DONE`.
    Completed,
    /// The job is `EXHAUSTED` (or beyond this worker's maximum).
    Exhausted {
        /// The number of the job's last attempt, when this worker knows it (see
        /// [`crate::Event::Exhausted`]).
        attempts: Option<u64>,
    },
    /// The last attempt failed: write `EXHAUSTED`.
    WriteExhausted { attempts: u64 },
    /// Someone holds `attempt`; wait for the lease to end or a message.
    Wait { attempt: u64, pttl_ms: Option<u64> },
    /// `attempt` failed, but `retry_delay` must pass before taking over.
    Delay { attempt: u64 },
    /// Stop and report.
    Fault(Fault),
}

impl Fault {
    /// The fault in words, for status messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Fault::Corrupt { which, value } => {
                format!(
                    "the {} key holds {value:?}, which baton never writes",
                    which.name()
                )
            }
            Fault::WrongType { which, detail } => {
                format!("the {} key has the wrong type ({detail})", which.name())
            }
            Fault::StateLost { seen, now } => {
                format!("the state went back from {seen} to {now}")
            }
        }
    }
}

impl Decision {
    /// The decision in words for `Verbose` status messages: its name first (`Grant`, `Wait`, …),
    /// then what it means.
    pub(crate) fn describe(&self) -> String {
        match self {
            Decision::Grant {
                attempt,
                last,
                fence,
            } => format!(
                "Grant: take attempt {attempt}{} with fencing token {fence}",
                if *last { " (the last)" } else { "" }
            ),
            Decision::Resume { attempt, fence, .. } => format!(
                "Resume: a grant whose reply was lost did apply; attempt {attempt} with fencing \
                 token {fence} is ours"
            ),
            Decision::Completed => "Completed: the job is done".into(),
            Decision::Exhausted {
                attempts: Some(attempts),
            } => format!("Exhausted: the job ended after {attempts} attempts"),
            Decision::Exhausted { attempts: None } => {
                "Exhausted: the job was found exhausted".into()
            }
            Decision::WriteExhausted { attempts } => {
                format!("WriteExhausted: the last of {attempts} attempts failed")
            }
            Decision::Wait {
                attempt,
                pttl_ms: Some(ms),
            } => format!(
                "Wait: attempt {attempt} runs elsewhere, its lease ends in {}",
                human(Duration::from_millis(*ms))
            ),
            Decision::Wait {
                attempt,
                pttl_ms: None,
            } => format!("Wait: attempt {attempt} runs elsewhere"),
            Decision::Delay { attempt } => {
                format!("Delay: attempt {attempt} failed; retry_delay passes before a takeover")
            }
            Decision::Fault(f) => format!("Fault: {}", f.describe()),
        }
    }
}

fn common_faults(obs: &Observation) -> Option<Fault> {
    match &obs.state {
        State::Corrupt(v) => {
            return Some(Fault::Corrupt {
                which: Which::State,
                value: v.clone(),
            })
        }
        State::WrongType(d) => {
            return Some(Fault::WrongType {
                which: Which::State,
                detail: d.clone(),
            })
        }
        _ => {}
    }
    match &obs.lease {
        Lease::Corrupt(v) => {
            return Some(Fault::Corrupt {
                which: Which::Lease,
                value: v.clone(),
            })
        }
        Lease::WrongType(d) => {
            return Some(Fault::WrongType {
                which: Which::Lease,
                detail: d.clone(),
            })
        }
        _ => {}
    }
    match &obs.fence {
        Fence::Corrupt(v) => Some(Fault::Corrupt {
            which: Which::Fence,
            value: v.clone(),
        }),
        Fence::WrongType(d) => Some(Fault::WrongType {
            which: Which::Fence,
            detail: d.clone(),
        }),
        _ => None,
    }
}

/// Decides a backup's next step from one observation.
pub fn decide_backup(obs: &Observation, view: &BackupView) -> Decision {
    if let Some(fault) = common_faults(obs) {
        return Decision::Fault(fault);
    }
    let fence = match obs.fence {
        Fence::Value(f) => f,
        _ => 0,
    };
    let max = view.max_attempts;
    // An indeterminate grant that was applied: the lease carries its token.
    for p in &view.pending {
        if obs.state == State::Attempt(p.attempt) && obs.lease.token() == Some(p.token.as_str()) {
            return Decision::Resume {
                attempt: p.attempt,
                last: p.attempt >= max,
                fence: p.fence,
                token: p.token.clone(),
            };
        }
    }
    let lost = |now: String| {
        Decision::Fault(Fault::StateLost {
            seen: view
                .seen
                .map(|n| format!("attempt {n}"))
                .unwrap_or_else(|| "no attempt".into()),
            now,
        })
    };
    match obs.state {
        State::Done => Decision::Completed,
        // The state keeps `EXHAUSTED`, not the count. This worker knows it only when the last
        // attempt it saw was the last one by its maximum (then the exhaustion followed it);
        // a job found exhausted, or exhausted past what it saw (another worker's smaller
        // maximum), made a number of attempts the store does not say.
        State::Exhausted => Decision::Exhausted {
            attempts: view.seen.filter(|&n| n >= max),
        },
        State::Absent => {
            if matches!(obs.lease, Lease::Held { .. }) {
                lost("no state, but a live lease".into())
            } else if view.seen.is_some() {
                lost("no state".into())
            } else {
                Decision::Grant {
                    attempt: 1,
                    last: max == 1,
                    fence: next_fence(fence, obs.now_us, view.last_fence),
                }
            }
        }
        State::Attempt(n) => {
            if view.seen.is_some_and(|s| n < s) {
                return lost(format!("attempt {n}"));
            }
            if n > max {
                // Another worker runs with a larger maximum; for us the job is exhausted.
                return Decision::Exhausted { attempts: Some(n) };
            }
            match &obs.lease {
                Lease::Held { pttl_ms, .. } => Decision::Wait {
                    attempt: n,
                    pttl_ms: *pttl_ms,
                },
                _ if n >= max => Decision::WriteExhausted { attempts: n },
                _ if view.has_retry_delay && view.delay_served_for != Some(n) => {
                    Decision::Delay { attempt: n }
                }
                _ => Decision::Grant {
                    attempt: n + 1,
                    last: n + 1 >= max,
                    fence: next_fence(fence, obs.now_us, view.last_fence),
                },
            }
        }
        // Handled by common_faults above.
        State::Corrupt(_) | State::WrongType(_) => Decision::Fault(Fault::Corrupt {
            which: Which::State,
            value: obs.state.describe(),
        }),
    }
}

/// Whether a channel message announces the grant of a later attempt than ours (which proves
/// that our `WATCH`ed `DONE` did not apply and no longer can).
pub fn later_grant(message: &str, attempt: u64) -> bool {
    message
        .strip_prefix("acquired:")
        .and_then(|n| n.parse::<u64>().ok())
        .is_some_and(|n| n > attempt)
}

/// Whether a channel message tells a holder of `attempt` that the job moved past it.
pub fn taken_over(message: &str, attempt: u64) -> bool {
    later_grant(message, attempt) || message == "exhausted"
}

/// Who replaced `attempt`, when a channel message says it was replaced (`replaced:N:BY`, from
/// `Failover::replace_attempt`): the holder of that attempt stops at once. The message is
/// published in the same transaction that deleted the lease and wrote `DONE`, so it proves the
/// loss as a later grant does; a message about another attempt is not ours.
pub fn replaced_by(message: &str, attempt: u64) -> Option<&str> {
    let rest = message.strip_prefix("replaced:")?;
    let (n, by) = rest.split_once(':')?;
    (n.parse::<u64>().ok()? == attempt).then_some(by)
}

/// Why a holder lost its attempt to a channel message that [`taken_over`] accepted, in words:
/// `acquired:3` is another worker's grant of attempt 3 (this attempt's lease was released, by
/// `fail_attempt` or a missed extension, or ran out), `exhausted` the job's end.
pub fn takeover_reason(message: &str) -> String {
    match message
        .strip_prefix("acquired:")
        .and_then(|n| n.parse::<u64>().ok())
    {
        Some(n) => format!(
            "another worker was granted attempt {n} (this attempt was released, by an \
             operator's `fail` or a missed extension, or its lease ran out)"
        ),
        None if message == "exhausted" => "the job was marked exhausted".into(),
        None => format!("another worker announced `{message}`"),
    }
}

/// A backup's grant of `attempt` with fencing token `fence`.
pub fn grant_writes(attempt: u64, fence: u64) -> [Write; 4] {
    [
        Write::SetState(StateValue::Attempt(attempt)),
        Write::SetLease,
        Write::SetFence(fence),
        Write::Publish(Message::Acquired(attempt)),
    ]
}

/// A backup's record that the last attempt failed.
pub fn exhaust_writes() -> [Write; 3] {
    [
        Write::SetState(StateValue::Exhausted),
        Write::KeepFence,
        Write::Publish(Message::Exhausted),
    ]
}

/// How a holder ends its attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ending {
    /// `done()`.
    Done,
    /// `fail(reason)` (or a dropped handle).
    Fail,
    /// Stopped, a dropped receiver, `max_hold`: like a failure, but announced as `released` and
    /// never written as `EXHAUSTED` by the holder itself.
    Release,
}

impl Ending {
    /// The holder operation whose rules apply.
    pub fn op(self) -> HolderOp {
        match self {
            Ending::Done => HolderOp::Done,
            Ending::Fail | Ending::Release => HolderOp::Release,
        }
    }
}

/// The holder's writes for `ending` of `attempt`. A failed last attempt is recorded as
/// `EXHAUSTED` at once, so the job reads exhausted even when no backup is left to notice.
pub fn finish_writes(ending: Ending, attempt: u64, max_attempts: u64) -> Vec<Write> {
    match ending {
        Ending::Done => vec![
            Write::SetState(StateValue::Done),
            Write::DelLease,
            Write::KeepFence,
            Write::Publish(Message::Done),
        ],
        Ending::Fail | Ending::Release => {
            let exhausted = ending == Ending::Fail && attempt >= max_attempts;
            let (state, message) = match ending {
                _ if exhausted => (Write::SetState(StateValue::Exhausted), Message::Exhausted),
                Ending::Fail => (Write::KeepState, Message::Failed),
                _ => (Write::KeepState, Message::Released),
            };
            vec![
                state,
                Write::DelLease,
                Write::KeepFence,
                Write::SetFailure,
                Write::Publish(message),
            ]
        }
    }
}

/// How a holder's finish that ran out of lease time ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GaveUp {
    /// A `DONE` may have been applied without a reply: say so (`OutcomeUnknown`).
    OutcomeUnknown,
    /// Nothing of ours can have been applied, or it does not matter: `LeaseLost`.
    LeaseLost,
}

/// What a finish that reached the lease deadline reports; `pending` says an `EXEC` of it was
/// sent and its reply lost.
pub fn finish_gave_up(ending: Ending, pending: bool) -> GaveUp {
    if ending == Ending::Done && pending {
        GaveUp::OutcomeUnknown
    } else {
        GaveUp::LeaseLost
    }
}

/// A waiting backup's check when the lease's time ran out on its clock (a plain `GET state` and
/// `PTTL lease`, `lease` being `None` when it is gone and `Some(None)` when it has no TTL):
/// `Some(pttl)` to sleep again while the same attempt's lease lives on (a kept-alive holder
/// extended it); `None` when something changed and the full transition must decide.
pub fn keep_waiting(state: &State, lease: Option<Option<u64>>, attempt: u64) -> Option<u64> {
    match (state, lease) {
        (State::Attempt(n), Some(Some(p))) if *n == attempt && p > 0 => Some(p),
        _ => None,
    }
}

impl BackupView {
    /// Records what an observation showed (the highest attempt seen), unless it was a fault.
    pub fn observed(&mut self, obs: &Observation, decision: &Decision) {
        if let (State::Attempt(n), false) = (&obs.state, matches!(decision, Decision::Fault(_))) {
            self.seen = Some(self.seen.map_or(*n, |s| s.max(*n)));
        }
    }

    /// Records a confirmed grant.
    pub fn granted(&mut self, attempt: u64, fence: u64) {
        self.pending.clear();
        self.last_fence = fence;
        self.seen = Some(attempt);
    }

    /// Records that a grant whose reply was lost did apply ([`Decision::Resume`]).
    pub fn resumed(&mut self, fence: u64) {
        self.pending.clear();
        self.last_fence = self.last_fence.max(fence);
    }

    /// Records that `retry_delay` was waited for after `attempt` failed.
    pub fn delay_served(&mut self, attempt: u64) {
        self.delay_served_for = Some(attempt);
    }
}

/// What the holder wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HolderOp {
    /// Record success.
    Done,
    /// Give the attempt up (failure, stop, dropped handle).
    Release,
    /// Extend the lease (watchdog).
    Extend,
}

/// What the holder's transition does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HolderDecision {
    /// Write the outcome (or the extension).
    Commit,
    /// An earlier try whose reply was lost already took effect.
    AlreadyApplied,
    /// Someone else has the job now; write nothing.
    Lost(String),
    /// An earlier `DONE` whose reply was lost may or may not have been applied, and nothing
    /// read tells which: report it, write nothing.
    Unknown(String),
    /// Stop and report.
    Fault(Fault),
}

/// Decides a holder's transition. `pending` says an earlier try of the same `op` may have been
/// applied (its `EXEC` reply was lost).
pub fn decide_holder(
    obs: &Observation,
    attempt: u64,
    token: &str,
    fence: u64,
    op: HolderOp,
    pending: bool,
) -> HolderDecision {
    if let Some(fault) = common_faults(obs) {
        return HolderDecision::Fault(fault);
    }
    let ours = obs.lease.token() == Some(token);
    match obs.state {
        State::Attempt(n) if n == attempt => match (&obs.lease, op) {
            _ if ours => HolderDecision::Commit,
            (Lease::Absent, HolderOp::Extend) => HolderDecision::Lost(
                "the lease is gone (it expired, or an operator released the attempt)".into(),
            ),
            // A late finish that nobody took over yet is still ours: WATCH on the state makes
            // sure no backup's grant can slip in between this read and the write.
            (Lease::Absent, _) => HolderDecision::Commit,
            _ => HolderDecision::Lost("another worker holds the lease".into()),
        },
        // Our release went through earlier, and a backup may already have moved on.
        _ if pending && op == HolderOp::Release && !matches!(obs.state, State::Absent) => {
            match obs.state {
                State::Attempt(n) if n < attempt => HolderDecision::Fault(Fault::StateLost {
                    seen: format!("attempt {attempt}"),
                    now: format!("attempt {n}"),
                }),
                _ => HolderDecision::AlreadyApplied,
            }
        }
        // Our `DONE` went out without a reply, and the job is DONE: but whose? Only the fence
        // tells. Every grant writes a fence above all earlier ones, and our `DONE` keeps it, so
        // our own fence means no later grant happened and the `DONE` is ours; a higher one
        // means a later attempt was granted (our WATCHed `EXEC` then cannot have applied) and
        // completed the job; without a fence there is no evidence either way.
        State::Done if pending && op == HolderOp::Done => match obs.fence {
            Fence::Value(f) if f == fence => HolderDecision::AlreadyApplied,
            Fence::Value(f) if f > fence => HolderDecision::Lost(format!(
                "the job was completed by a later attempt (fencing token {f}, ours {fence})"
            )),
            _ => HolderDecision::Unknown(format!(
                "the job is DONE, but the fence key ({}) cannot tell whether by this attempt \
                 (fencing token {fence})",
                match &obs.fence {
                    Fence::Value(f) => format!("{f}"),
                    Fence::Absent => "absent".into(),
                    Fence::Corrupt(v) | Fence::WrongType(v) => v.clone(),
                }
            )),
        },
        State::Done => HolderDecision::Lost("the job was completed by another attempt".into()),
        State::Exhausted => HolderDecision::Lost("the job was marked exhausted".into()),
        State::Attempt(n) if n > attempt => {
            HolderDecision::Lost(format!("attempt {n} was granted to another worker"))
        }
        State::Attempt(n) => HolderDecision::Fault(Fault::StateLost {
            seen: format!("attempt {attempt}"),
            now: format!("attempt {n}"),
        }),
        State::Absent => HolderDecision::Fault(Fault::StateLost {
            seen: format!("attempt {attempt}"),
            now: "no state".into(),
        }),
        State::Corrupt(_) | State::WrongType(_) => HolderDecision::Fault(Fault::Corrupt {
            which: Which::State,
            value: obs.state.describe(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::jobs::parse_attempt;

    #[test]
    fn decisions_read_as_text_not_debug_output() {
        let said = [
            Decision::Grant {
                attempt: 2,
                last: true,
                fence: 7,
            }
            .describe(),
            Decision::Wait {
                attempt: 1,
                pttl_ms: Some(4_006),
            }
            .describe(),
            Decision::Wait {
                attempt: 1,
                pttl_ms: None,
            }
            .describe(),
            Decision::Fault(Fault::Corrupt {
                which: Which::State,
                value: "03".into(),
            })
            .describe(),
        ];
        assert_eq!(
            said[0],
            "Grant: take attempt 2 (the last) with fencing token 7"
        );
        assert_eq!(
            said[1],
            "Wait: attempt 1 runs elsewhere, its lease ends in 4.0 s"
        );
        for s in &said {
            assert!(!s.contains("Some(") && !s.contains('{'), "{s}");
        }
    }

    const T: &str = "0123456789abcdef0123456789abcdef";
    const OTHER: &str = "ffffffffffffffffffffffffffffffff";

    fn obs(state: State, lease: Lease) -> Observation {
        Observation {
            state,
            lease,
            fence: Fence::Value(100),
            now_us: 50,
        }
    }
    fn held(token: &str) -> Lease {
        Lease::Held {
            token: token.into(),
            holder: "w".into(),
            pttl_ms: Some(1000),
        }
    }
    fn view(max: u64) -> BackupView {
        BackupView {
            max_attempts: max,
            ..BackupView::default()
        }
    }

    #[test]
    fn absent_key_grants_attempt_one() {
        let d = decide_backup(&obs(State::Absent, Lease::Absent), &view(5));
        assert_eq!(
            d,
            Decision::Grant {
                attempt: 1,
                last: false,
                fence: 101
            }
        );
        let d = decide_backup(&obs(State::Absent, Lease::Absent), &view(1));
        assert!(matches!(d, Decision::Grant { last: true, .. }));
    }

    #[test]
    fn sentinels_end_without_writing() {
        assert_eq!(
            decide_backup(&obs(State::Done, Lease::Absent), &view(5)),
            Decision::Completed
        );
        assert!(matches!(
            decide_backup(&obs(State::Exhausted, Lease::Absent), &view(5)),
            Decision::Exhausted { attempts: None }
        ));
    }

    #[test]
    fn live_lease_means_wait() {
        assert_eq!(
            decide_backup(&obs(State::Attempt(2), held(OTHER)), &view(5)),
            Decision::Wait {
                attempt: 2,
                pttl_ms: Some(1000)
            }
        );
        let no_ttl = Lease::Held {
            token: OTHER.into(),
            holder: String::new(),
            pttl_ms: None,
        };
        assert_eq!(
            decide_backup(&obs(State::Attempt(2), no_ttl), &view(5)),
            Decision::Wait {
                attempt: 2,
                pttl_ms: None
            }
        );
    }

    #[test]
    fn gone_lease_takes_over_the_next_attempt() {
        let d = decide_backup(&obs(State::Attempt(2), Lease::Absent), &view(3));
        assert_eq!(
            d,
            Decision::Grant {
                attempt: 3,
                last: true,
                fence: 101
            }
        );
    }

    #[test]
    fn last_attempt_failed_writes_exhausted() {
        assert_eq!(
            decide_backup(&obs(State::Attempt(3), Lease::Absent), &view(3)),
            Decision::WriteExhausted { attempts: 3 }
        );
    }

    #[test]
    fn count_above_our_maximum_is_exhausted_without_write() {
        assert_eq!(
            decide_backup(&obs(State::Attempt(99), held(OTHER)), &view(3)),
            Decision::Exhausted { attempts: Some(99) }
        );
    }

    #[test]
    fn retry_delay_is_served_once_per_attempt() {
        let mut v = view(5);
        v.has_retry_delay = true;
        let o = obs(State::Attempt(1), Lease::Absent);
        assert_eq!(decide_backup(&o, &v), Decision::Delay { attempt: 1 });
        v.delay_served_for = Some(1);
        assert!(matches!(
            decide_backup(&o, &v),
            Decision::Grant { attempt: 2, .. }
        ));
    }

    #[test]
    fn state_that_goes_back_is_lost() {
        let mut v = view(5);
        v.seen = Some(3);
        for s in [State::Absent, State::Attempt(1)] {
            assert!(matches!(
                decide_backup(&obs(s, Lease::Absent), &v),
                Decision::Fault(Fault::StateLost { .. })
            ));
        }
        // A lease with no state is lost data even for a worker that saw nothing.
        assert!(matches!(
            decide_backup(&obs(State::Absent, held(OTHER)), &view(5)),
            Decision::Fault(Fault::StateLost { .. })
        ));
    }

    #[test]
    fn foreign_values_are_faults() {
        let corrupt = obs(State::Corrupt("\"hello\"".into()), Lease::Absent);
        assert!(matches!(
            decide_backup(&corrupt, &view(5)),
            Decision::Fault(Fault::Corrupt {
                which: Which::State,
                ..
            })
        ));
        let mut o = obs(State::Attempt(1), Lease::Absent);
        o.fence = Fence::Corrupt("\"x\"".into());
        assert!(matches!(
            decide_backup(&o, &view(5)),
            Decision::Fault(Fault::Corrupt {
                which: Which::Fence,
                ..
            })
        ));
        let o = obs(State::Attempt(1), Lease::WrongType("list".into()));
        assert!(matches!(
            decide_backup(&o, &view(5)),
            Decision::Fault(Fault::WrongType {
                which: Which::Lease,
                ..
            })
        ));
    }

    #[test]
    fn pending_grant_with_our_token_resumes() {
        let mut v = view(5);
        v.remember_pending(PendingGrant {
            attempt: 2,
            token: T.into(),
            fence: 77,
        });
        assert_eq!(
            decide_backup(&obs(State::Attempt(2), held(T)), &v),
            Decision::Resume {
                attempt: 2,
                last: false,
                fence: 77,
                token: T.into(),
            }
        );
        // Someone else's lease: just wait.
        assert!(matches!(
            decide_backup(&obs(State::Attempt(2), held(OTHER)), &v),
            Decision::Wait { .. }
        ));
    }

    #[test]
    fn holder_commits_only_its_own_attempt() {
        let o = obs(State::Attempt(2), held(T));
        assert_eq!(
            decide_holder(&o, 2, T, 50, HolderOp::Done, false),
            HolderDecision::Commit
        );
        // Late finish, nobody took over yet.
        let o = obs(State::Attempt(2), Lease::Absent);
        assert_eq!(
            decide_holder(&o, 2, T, 50, HolderOp::Done, false),
            HolderDecision::Commit
        );
        // ...but a watchdog that finds the lease gone has lost it.
        assert!(matches!(
            decide_holder(&o, 2, T, 50, HolderOp::Extend, false),
            HolderDecision::Lost(_)
        ));
        // Taken over.
        let o = obs(State::Attempt(3), held(OTHER));
        assert!(matches!(
            decide_holder(&o, 2, T, 50, HolderOp::Done, false),
            HolderDecision::Lost(_)
        ));
        // Exhaustion was written.
        let o = obs(State::Exhausted, Lease::Absent);
        assert!(matches!(
            decide_holder(&o, 3, T, 50, HolderOp::Done, false),
            HolderDecision::Lost(_)
        ));
        // Another token on our attempt number (foreign write).
        let o = obs(State::Attempt(2), held(OTHER));
        assert!(matches!(
            decide_holder(&o, 2, T, 50, HolderOp::Done, false),
            HolderDecision::Lost(_)
        ));
    }

    #[test]
    fn a_second_lost_grant_keeps_the_first_pending_one() {
        // Two grants in a row lost their replies (Redis paused with both in its socket
        // buffers); the first one applies after all. The worker must still recognise it.
        let mut v = view(5);
        v.remember_pending(PendingGrant {
            attempt: 2,
            token: T.into(),
            fence: 77,
        });
        v.remember_pending(PendingGrant {
            attempt: 2,
            token: OTHER.into(),
            fence: 78,
        });
        assert_eq!(
            decide_backup(&obs(State::Attempt(2), held(T)), &v),
            Decision::Resume {
                attempt: 2,
                last: false,
                fence: 77,
                token: T.into(),
            }
        );
        for i in 0..2 * MAX_PENDING as u64 {
            v.remember_pending(PendingGrant {
                attempt: 3,
                token: format!("t{i}"),
                fence: 100 + i,
            });
        }
        assert_eq!(v.pending.len(), MAX_PENDING, "bounded");
    }

    #[test]
    fn holder_recognises_its_own_lost_reply_by_its_fence() {
        // DONE, and the fence is this grant's (50): no later grant happened, the DONE is ours.
        let mut o = obs(State::Done, Lease::Absent);
        o.fence = Fence::Value(50);
        assert_eq!(
            decide_holder(&o, 2, T, 50, HolderOp::Done, true),
            HolderDecision::AlreadyApplied
        );
        // DONE with a higher fence: a later attempt was granted and completed the job.
        o.fence = Fence::Value(51);
        assert!(matches!(
            decide_holder(&o, 2, T, 50, HolderOp::Done, true),
            HolderDecision::Lost(_)
        ));
        // DONE without a fence: no evidence either way.
        o.fence = Fence::Absent;
        assert!(matches!(
            decide_holder(&o, 2, T, 50, HolderOp::Done, true),
            HolderDecision::Unknown(_)
        ));
        let o = obs(State::Done, Lease::Absent);
        assert!(matches!(
            decide_holder(&o, 2, T, 50, HolderOp::Done, false),
            HolderDecision::Lost(_)
        ));
        let o = obs(State::Attempt(3), held(OTHER));
        assert_eq!(
            decide_holder(&o, 2, T, 50, HolderOp::Release, true),
            HolderDecision::AlreadyApplied
        );
    }

    #[test]
    fn holder_sees_lost_state() {
        for s in [State::Absent, State::Attempt(1)] {
            assert!(matches!(
                decide_holder(&obs(s, Lease::Absent), 2, T, 50, HolderOp::Extend, false),
                HolderDecision::Fault(Fault::StateLost { .. })
            ));
        }
    }

    #[test]
    fn takeover_messages() {
        assert!(taken_over("acquired:3", 2));
        assert!(!taken_over("acquired:2", 2));
        assert!(!taken_over("acquired:x", 2));
        assert!(taken_over("exhausted", 2));
        assert!(!taken_over("failed", 2));
        for m in [Message::Acquired(3), Message::Exhausted] {
            assert!(taken_over(&m.text(), 2), "{m:?}");
        }
        for m in [
            Message::Acquired(2),
            Message::Done,
            Message::Failed,
            Message::Released,
        ] {
            assert!(!taken_over(&m.text(), 2), "{m:?}");
        }
    }

    #[test]
    fn finish_writes_by_ending() {
        let w = finish_writes(Ending::Fail, 3, 3);
        assert_eq!(w[0], Write::SetState(StateValue::Exhausted));
        assert_eq!(w[4], Write::Publish(Message::Exhausted));
        let w = finish_writes(Ending::Release, 3, 3);
        assert_eq!(w[0], Write::KeepState, "a release never writes EXHAUSTED");
        assert_eq!(w[4], Write::Publish(Message::Released));
        let w = finish_writes(Ending::Fail, 2, 3);
        assert_eq!(w[4], Write::Publish(Message::Failed));
        assert!(finish_writes(Ending::Done, 2, 3).contains(&Write::KeepFence));
    }

    #[test]
    fn attempt_numbers_must_be_canonical() {
        assert_eq!(parse_attempt(b"1"), Some(1));
        assert_eq!(parse_attempt(b"42"), Some(42));
        assert_eq!(parse_attempt(b"9223372036854775807"), Some(i64::MAX as u64));
        for bad in [
            &b""[..],
            b"0",
            b"03",
            b"+3",
            b"-1",
            b" 3",
            b"3 ",
            b"9223372036854775808",
            b"99999999999999999999",
            b"1e3",
        ] {
            assert_eq!(
                parse_attempt(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
