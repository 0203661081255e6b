//! What the supervisor needs of a lease ([`Lease`]), and the adapters that give it from the
//! library's held locks: the fenced mutex's `LockGuard`, the `RedlockGuard` and the leader's
//! `Term` ([`HeldLock`]). In a file of their own because they are the CLI's one seam over the
//! library's guard types: when those change, this file alone follows.

use std::time::Duration;

use baton::{LockGuard, RedlockGuard, Term};
use tokio::time::Instant;

use super::sink::Sink;
use super::supervisor::later;
use super::text::human;

/// How the lease PROGRAM runs under was lost.
pub(crate) struct Loss {
    /// Send SIGTERM first (PROGRAM may still clean up until `kill_at`).
    pub(crate) term: bool,
    /// When PROGRAM must be dead: SIGKILL then (at once when already past).
    pub(crate) kill_at: Instant,
}

/// The lease PROGRAM runs under, as [`Supervisor::supervise`] watches it: a failover attempt
/// (`baton run`) or a fenced mutex (`baton lock`). Whatever the lease, PROGRAM is handled the
/// same way (process group, terminal, signals, job control); only what "lost" means differs.
pub(crate) trait Lease {
    /// The next loss of the lease; pending forever once nothing more can come. Cancel safe.
    async fn lost(&mut self, sink: &mut Sink) -> Loss;

    /// Whether this process still holds the lease after being stopped (job control) for
    /// `away`; `Err` says why not.
    async fn still_held(&mut self, away: Duration) -> Result<(), String>;

    /// When the lease ends at the earliest as of the last extension the server confirmed, on
    /// this host's monotonic clock: what the guard of PROGRAM's group enforces (guard.rs).
    fn confirmed_deadline(&self) -> Instant;
}

/// What `baton lock` needs of a held lock (the fenced mutex or a Redlock): its watchdog's loss
/// signal and the deadline before which the lock cannot pass on.
pub(crate) trait HeldLock {
    async fn lost(&self);
    fn loss_reason(&self) -> Option<String>;
    /// Errs early: the mutex's lease deadline (send time of the last confirmed extension + ttl
    /// − margin), a Redlock's validity (round start + ttl − elapsed − drift).
    fn deadline(&self) -> Instant;
}

impl HeldLock for LockGuard {
    async fn lost(&self) {
        LockGuard::lost(self).await;
    }
    fn loss_reason(&self) -> Option<String> {
        LockGuard::loss_reason(self)
    }
    fn deadline(&self) -> Instant {
        self.lease_deadline()
    }
}

impl HeldLock for RedlockGuard {
    async fn lost(&self) {
        RedlockGuard::lost(self).await;
    }
    fn loss_reason(&self) -> Option<String> {
        RedlockGuard::loss_reason(self)
    }
    fn deadline(&self) -> Instant {
        self.lease_deadline()
    }
}

impl HeldLock for Term {
    async fn lost(&self) {
        Term::lost(self).await;
    }
    fn loss_reason(&self) -> Option<String> {
        Term::loss_reason(self)
    }
    fn deadline(&self) -> Instant {
        self.lease_deadline()
    }
}

/// `baton lock`'s lease: a held lock and its watchdog's loss signal.
pub(crate) struct LockLease<'a, G> {
    pub(crate) guard: &'a G,
    pub(crate) kill_grace: Duration,
    /// The loss signal fires once and stays fired: report it once.
    pub(crate) reported: bool,
}

impl<G: HeldLock> Lease for LockLease<'_, G> {
    async fn lost(&mut self, sink: &mut Sink) -> Loss {
        if self.reported {
            return std::future::pending().await;
        }
        // Cancel safe: a cancellation token's `cancelled()` is.
        self.guard.lost().await;
        self.reported = true;
        let reason = self
            .guard
            .loss_reason()
            .unwrap_or_else(|| "the lock was lost".into());
        sink.warn(&format!("lock lost: {reason}; stopping PROGRAM"));
        // The deadline errs early: killed by then, PROGRAM is gone before the lock can expire
        // and pass on. When the loss is the deadline itself, that is now: SIGKILL at once. A
        // refused extension (the key is gone or foreign) can come earlier; PROGRAM then gets
        // the time left, at most --kill-grace, to stop cleanly: another holder may already
        // run, which only the fencing token guards against.
        let kill_at = self
            .guard
            .deadline()
            .min(later(Instant::now(), self.kill_grace));
        Loss {
            term: true,
            kill_at,
        }
    }

    fn confirmed_deadline(&self) -> Instant {
        self.guard.deadline()
    }

    async fn still_held(&mut self, away: Duration) -> Result<(), String> {
        let lost = |what: String| Err(format!("{what} while baton was stopped ({})", human(away)));
        if let Some(reason) = self.guard.loss_reason() {
            return lost(format!("the lock was lost ({reason})"));
        }
        // Nothing was extended while stopped: past the deadline the key may have expired and
        // passed on. Before it, the watchdog's next extension settles the rest.
        if Instant::now() >= self.guard.deadline() {
            return lost("the lease ran out".into());
        }
        Ok(())
    }
}
