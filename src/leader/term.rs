//! [`Term`]: a term this process leads, a held lease like every other ([`HeldLease`]).

use std::sync::Arc;

use tokio::time::Instant;

use crate::lease::guard::{sealed, Fenced, HeldLease, LeaseCore, LossSignal};
use crate::lease::watchdog::LeaseState;

/// A term this process leads. Cheap to clone.
///
/// Its [`HeldLease`] accessors: the key is the election's; the fencing token
/// ([`Fenced::fencing_token`]) is the term number; [`HeldLease::lease_deadline`] is the send
/// time of the granting (or last confirmed renewing) request + lease − max(1 %, 2 ms), moving
/// with each renewal; the loss signal ([`HeldLease::lost_token`]) fires when the work of this
/// term must stop: renewals failed until `stop_timeout` before the lease deadline, a renewal
/// found another token, the leader resigned, or the client shut down.
#[derive(Clone)]
pub struct Term {
    /// The term number, which is also its fencing token.
    pub(super) fencing_token: u64,
    pub(super) name: Arc<str>,
    /// The lease as the watchdog keeps it (its deadline, its own loss signal).
    pub(super) state: Arc<LeaseState>,
    /// What [`HeldLease`] reads: the watchdog's deadline, and the term's stop signal (which
    /// fires `stop_timeout` before the lease could end, not at the end like the watchdog's).
    pub(super) core: LeaseCore,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("fencing_token", &self.fencing_token)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Term {
    /// Term `fencing_token` of the election on `key`, led by `name`, whose lease `state` keeps.
    pub(super) fn new(
        fencing_token: u64,
        name: Arc<str>,
        key: &str,
        state: Arc<LeaseState>,
    ) -> Self {
        let core = LeaseCore::new(
            key,
            Some(fencing_token),
            state.deadline_cell().clone(),
            LossSignal::new(),
        );
        Term {
            fencing_token,
            name,
            state,
            core,
        }
    }

    /// The leader's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Ends the term: the work's loss signal fires with `reason` (the first one is kept).
    pub(super) fn end(&self, reason: &str) {
        self.core.loss().fire(reason);
    }

    /// Whether this term still leads as far as this process can tell.
    pub(super) fn leads(&self) -> bool {
        !self.core.loss().is_lost() && Instant::now() < self.state.deadline()
    }
}

impl sealed::Sealed for Term {
    fn core(&self) -> &LeaseCore {
        &self.core
    }
}

impl HeldLease for Term {}

impl Fenced for Term {}
