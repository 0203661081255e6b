//! [`Term`]: a term this process leads, with the accessors every lease-holding guard has.

use std::sync::{Arc, Mutex};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::watchdog::LeaseState;
use crate::util::lock;

/// A term this process leads. Cheap to clone.
#[derive(Clone)]
pub struct Term {
    pub(super) number: u64,
    pub(super) name: Arc<str>,
    pub(super) state: Arc<LeaseState>,
    pub(super) stop: CancellationToken,
    pub(super) reason: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("number", &self.number)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Term {
    /// The term: larger than every earlier term of this election.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The fencing token to pass to the resources this leader writes: the term.
    pub fn fencing_token(&self) -> u64 {
        self.number
    }

    /// The leader's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When the lease can end at the earliest, on this host's monotonic clock: send time of
    /// the granting (or last confirmed renewing) request + lease − max(1 %, 2 ms).
    pub fn lease_deadline(&self) -> Instant {
        self.state.deadline()
    }

    /// Cancelled when the work of this term must stop: renewals failed until `stop_timeout`
    /// before [`Term::lease_deadline`], a renewal found another token, the leader resigned,
    /// or the client shut down.
    pub fn lost_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Resolves when [`Term::lost_token`] is cancelled.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn lost(&self) {
        self.stop.cancelled().await;
    }

    /// Whether the term ended ([`Term::lost_token`] was cancelled).
    pub fn is_lost(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Why the term ended, once it did.
    pub fn loss_reason(&self) -> Option<String> {
        lock(&self.reason).clone()
    }

    pub(super) fn end(&self, reason: &str) {
        {
            let mut r = lock(&self.reason);
            if r.is_none() {
                *r = Some(reason.to_string());
            }
        }
        self.stop.cancel();
    }

    /// Whether this term still leads as far as this process can tell.
    pub(super) fn leads(&self) -> bool {
        !self.stop.is_cancelled() && Instant::now() < self.state.deadline()
    }
}
