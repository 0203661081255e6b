//! What the model checker (the workspace crate `baton-model`, in `model/`) reads of the library:
//! the primitives' pure decisions and the types they take and return. Not part of the API:
//! hidden, and compiled only with the feature `model`.
//!
//! Why one module: the model lives in its own crate so that `src/` is the library alone, and a
//! crate sees only what is `pub`. The decisions stay where they are (each primitive's folder);
//! this module is the one place that names their paths, so moving a decision means changing one
//! `use` here. Items of private modules (the failover protocol, the lease kernel) are `pub` in
//! those modules and re-exported as they are. A decision in a public module keeps its
//! `pub(crate)` visibility (it is no API) and is reached through a wrapper here that calls it
//! and maps its result onto a copy of its enum, one arm per variant, so a variant added there
//! fails to compile here instead of being missed by the model.

#[cfg(feature = "model")]
pub use crate::error::Error;
#[cfg(feature = "model")]
pub use crate::failover::protocol::{
    decide_backup, decide_holder, exhaust_writes, finish_gave_up, finish_writes, grant_writes,
    keep_waiting, later_grant, taken_over, BackupView, Decision, Ending, Fault, Fence, GaveUp,
    HolderDecision, HolderOp, Lease, Message, Observation, PendingGrant, State, StateValue, Which,
    Write, WATCHED,
};
#[cfg(feature = "model")]
pub use crate::lease::lock::{orphaned, Grant};
#[cfg(feature = "model")]
pub use crate::lease::watchdog::{after_extension, WatchStep};
#[cfg(feature = "model")]
pub use crate::lease::Extension;

/// The clock the lease decisions read (the models build their instants from it).
#[cfg(feature = "model")]
pub use tokio::time::Instant;

#[cfg(feature = "model")]
pub use public::*;

/// Wrappers of the decisions that live in public modules (see the module docs).
#[cfg(feature = "model")]
mod public {
    use crate::error::Error;
    use std::time::Duration;
    use tokio::time::Instant;

    /// `fair::waiting_nap`: how long a waiting client of the fair lock sleeps.
    pub fn waiting_nap(
        refresh: Duration,
        reserver: bool,
        pttl: Option<Duration>,
        rank: Option<u64>,
        reserved: Option<Duration>,
    ) -> Duration {
        crate::fair::waiting_nap(refresh, reserver, pttl, rank, reserved)
    }

    /// `leader::CampaignStep`: what a candidate does after one try.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum CampaignStep {
        /// Granted: it leads.
        Elected,
        /// Someone leads: wait for the lease's PTTL.
        Standby {
            /// The lease's PTTL as read.
            pttl: Option<Duration>,
        },
        /// A transient error: try again after a backoff.
        Retry,
        /// An error retrying cannot fix.
        Fail,
    }

    /// `leader::after_try`: the campaign's decision on one try's outcome.
    pub fn after_try<T>(outcome: &Result<Result<T, Option<Duration>>, Error>) -> CampaignStep {
        use crate::leader::CampaignStep as C;
        match crate::leader::after_try(outcome) {
            C::Elected => CampaignStep::Elected,
            C::Standby { pttl } => CampaignStep::Standby { pttl },
            C::Retry => CampaignStep::Retry,
            C::Fail => CampaignStep::Fail,
        }
    }

    /// `leader::stop_at`: when a term's work is told to stop.
    pub fn stop_at(deadline: Instant, stop_timeout: Duration) -> Instant {
        crate::leader::stop_at(deadline, stop_timeout)
    }

    /// `leader::must_stop`: whether a term's work must stop at `now`.
    pub fn must_stop(now: Instant, deadline: Instant, stop_timeout: Duration) -> bool {
        crate::leader::must_stop(now, deadline, stop_timeout)
    }

    /// `leader::Handover`: what the worker does with a term's work it told to stop.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Handover {
        /// Still running, the lease still ours: wait.
        Wait,
        /// It stopped: let the lease go.
        Release,
        /// Still running at the lease's end.
        Overdue,
    }

    /// `leader::handover`: the worker's decision on a told-to-stop work at `now`.
    pub fn handover(work_finished: bool, now: Instant, deadline: Instant) -> Handover {
        use crate::leader::Handover as H;
        match crate::leader::handover(work_finished, now, deadline) {
            H::Wait => Handover::Wait,
            H::Release => Handover::Release,
            H::Overdue => Handover::Overdue,
        }
    }

    /// `util::rw_replies::RwMode`: how a holder of a read-write lock holds it.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum RwMode {
        /// A shared read.
        Read,
        /// The one upgradeable read.
        Upgradeable,
        /// The exclusive write.
        Write,
    }

    /// `util::rw_replies::RwState`: the holders a read-write lock's state names and its live
    /// "writer waiting" mark (token, remaining ms).
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub struct RwState {
        /// The writer's token.
        pub writer: Option<String>,
        /// The upgradeable reader's token.
        pub upgrader: Option<String>,
        /// The plain readers' tokens.
        pub readers: Vec<String>,
        /// The live mark.
        pub waiting: Option<(String, u64)>,
    }

    /// `util::rw_replies::MarkChange`: what a try does with the "writer waiting" mark.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum MarkChange {
        /// Left as it is.
        Keep,
        /// Set to the deciding token.
        Set,
        /// Deleted.
        Clear,
    }

    /// `util::rw_replies::RwDecision`: what one try or upgrade decided.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct RwDecision {
        /// Granted.
        pub granted: bool,
        /// The state written back (holders whose lease ended dropped).
        pub state: RwState,
        /// The mark.
        pub mark: MarkChange,
    }

    /// `util::rw_replies::decide`: the read-write lock's rule (docs/rwlock.md), which
    /// PostgreSQL's arm runs and the Redis scripts apply in Lua.
    pub fn rw_decide(
        state: &RwState,
        live: &dyn Fn(&str) -> Option<u64>,
        token: &str,
        mode: RwMode,
        upgrade: bool,
        mark: Duration,
    ) -> RwDecision {
        use crate::util::rw_replies as rw;
        let state = rw::RwState {
            writer: state.writer.clone(),
            upgrader: state.upgrader.clone(),
            readers: state.readers.clone(),
            waiting: state.waiting.clone(),
        };
        let mode = match mode {
            RwMode::Read => rw::RwMode::Read,
            RwMode::Upgradeable => rw::RwMode::Upgradeable,
            RwMode::Write => rw::RwMode::Write,
        };
        let d = rw::decide(&state, live, token, mode, upgrade, mark);
        RwDecision {
            granted: d.granted,
            state: RwState {
                writer: d.state.writer,
                upgrader: d.state.upgrader,
                readers: d.state.readers,
                waiting: d.state.waiting,
            },
            mark: match d.mark {
                rw::MarkChange::Keep => MarkChange::Keep,
                rw::MarkChange::Set(_) => MarkChange::Set,
                rw::MarkChange::Clear => MarkChange::Clear,
            },
        }
    }

    /// `lease::items::Release`: what one "release if empty" of run-or-enqueue found.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Release {
        /// The lock was deleted.
        Released,
        /// Items are waiting: drain again.
        More,
        /// The lock does not hold the token.
        NotOurs {
            /// Whether the stream holds items.
            waiting: bool,
        },
    }

    /// `queue::ReleaseStep`: the holder's next step after one release.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum ReleaseStep {
        /// Released: the hold is over.
        Done,
        /// Items are waiting: drain again.
        DrainAgain,
        /// Lost.
        Lost,
        /// A transient error: try again.
        Retry {
            /// Whether some try so far may have applied.
            uncertain: bool,
        },
        /// A permanent error.
        Fail,
    }

    /// `queue::release_step`: what the holder does with a release's outcome.
    pub fn release_step(r: &Result<Release, Error>, uncertain: bool) -> ReleaseStep {
        use crate::queue::items::Release as R;
        use crate::queue::ReleaseStep as S;
        let r = match r {
            Ok(Release::Released) => Ok(R::Released),
            Ok(Release::More) => Ok(R::More),
            Ok(Release::NotOurs { waiting }) => Ok(R::NotOurs { waiting: *waiting }),
            Err(e) => Err(e.clone()),
        };
        match crate::queue::release_step(&r, uncertain) {
            S::Done => ReleaseStep::Done,
            S::DrainAgain => ReleaseStep::DrainAgain,
            S::Lost => ReleaseStep::Lost,
            S::Retry { uncertain } => ReleaseStep::Retry { uncertain },
            S::Fail => ReleaseStep::Fail,
        }
    }
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    /// The model of the lock table's cleanup (`model/src/pgrows.rs`, `rechecks`) is the
    /// library's: both cleanup statements repeat their conditions after the subquery (in the
    /// outer `WHERE`), which PostgreSQL re-evaluates on a row that changed while the `DELETE`
    /// waited for it.
    #[test]
    fn cleanup_statements_re_check_the_row_they_delete() {
        for (statement, conditions) in [
            (
                crate::lease::PG_LOCKS_CLEANUP,
                &[
                    "fence_expires_at < clock_timestamp()",
                    "(token IS NULL OR expires_at IS NULL OR expires_at < clock_timestamp())",
                ][..],
            ),
            (
                crate::failover::pg::CLEANUP,
                &["expires_at < clock_timestamp()"][..],
            ),
        ] {
            // What follows the subquery (it ends with its `LIMIT`).
            let outer = statement
                .split_once("LIMIT 1000\n)")
                .map(|(_, after)| after)
                .unwrap_or_default();
            for condition in conditions {
                assert!(
                    outer.contains(condition),
                    "the outer WHERE of {statement:?} does not re-check {condition:?}"
                );
            }
        }
    }
}
