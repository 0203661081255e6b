//! The metrics baton records, named once: every metric's name, its labels' fixed values and one
//! helper per event, called where the event happens.
//!
//! baton records through the [`metrics`] facade and never installs a recorder: the application
//! does (the `baton` command installs a Prometheus one for `--metrics-addr`). Each helper
//! resolves its handle through the macros at the moment of the event, never earlier, because a
//! handle registered before the application installed its recorder stays a no-op forever (the
//! facade's rule): a `Client` built before the recorder would otherwise record nothing. With no
//! recorder installed a call costs a look at the global recorder and nothing else.
//!
//! Labels are the primitive, the backend and small fixed enums, never a key or a worker name:
//! the number of series stays bounded whatever the workload (docs/operating.md, "Metrics and
//! traces", has the table).

use std::time::Duration;

use tokio::time::Instant;

/// `baton_grants_total{primitive,backend,takeover}`: every grant (a failover attempt won, a
/// lock taken, a leader term won).
pub(crate) const GRANTS: &str = "baton_grants_total";
/// `baton_failed_attempts_total{backend}`: failover attempts this worker failed.
pub(crate) const FAILED_ATTEMPTS: &str = "baton_failed_attempts_total";
/// `baton_exhausted_total{backend}`: jobs this worker saw become `EXHAUSTED` by its own write.
pub(crate) const EXHAUSTED: &str = "baton_exhausted_total";
/// `baton_done_total{backend}`: attempts this worker completed.
pub(crate) const DONE: &str = "baton_done_total";
/// `baton_lease_lost_total{primitive,backend,reason}`: leases lost while held.
pub(crate) const LEASE_LOST: &str = "baton_lease_lost_total";
/// `baton_extensions_total{primitive,backend,outcome}`: lease extensions by their outcome.
pub(crate) const EXTENSIONS: &str = "baton_extensions_total";
/// `baton_leader_changes_total{backend}`: this elector became leader or stopped being it.
pub(crate) const LEADER_CHANGES: &str = "baton_leader_changes_total";
/// `baton_queue_posts_total{backend}`: items posted to a run-or-enqueue queue.
pub(crate) const QUEUE_POSTS: &str = "baton_queue_posts_total";
/// `baton_queue_drained_total{backend}`: queued items handled by a drainer.
pub(crate) const QUEUE_DRAINED: &str = "baton_queue_drained_total";
/// `baton_acquire_duration_seconds{primitive,backend}`: from the call (or the start of the
/// wait) to the grant, waits included.
pub(crate) const ACQUIRE_DURATION: &str = "baton_acquire_duration_seconds";
/// `baton_hold_duration_seconds{primitive,backend}`: from the grant to its release or loss.
pub(crate) const HOLD_DURATION: &str = "baton_hold_duration_seconds";
/// `baton_transition_duration_seconds{primitive,backend,transition}`: one state-changing round
/// trip (a grant, an extension, a release, ...), from its send to its reply.
pub(crate) const TRANSITION_DURATION: &str = "baton_transition_duration_seconds";

/// Every metric name, for the docs test that keeps the table in docs/operating.md complete.
#[cfg(test)]
pub(crate) const ALL: &[&str] = &[
    GRANTS,
    FAILED_ATTEMPTS,
    EXHAUSTED,
    DONE,
    LEASE_LOST,
    EXTENSIONS,
    LEADER_CHANGES,
    QUEUE_POSTS,
    QUEUE_DRAINED,
    ACQUIRE_DURATION,
    HOLD_DURATION,
    TRANSITION_DURATION,
];

/// The `primitive` label's values.
pub(crate) mod primitive {
    pub(crate) const FAILOVER: &str = "failover";
    pub(crate) const MUTEX: &str = "mutex";
    pub(crate) const FAIR: &str = "fair";
    pub(crate) const LEADER: &str = "leader";
    pub(crate) const REDLOCK: &str = "redlock";
    pub(crate) const QUEUE: &str = "queue";
    #[cfg(feature = "postgres")]
    pub(crate) const ADVISORY: &str = "advisory";
}

/// The `backend` label's values.
pub(crate) mod backend {
    pub(crate) const REDIS: &str = "redis";
    #[cfg(feature = "postgres")]
    pub(crate) const POSTGRES: &str = "postgres";
}

/// The `transition` label's values.
pub(crate) mod transition {
    pub(crate) const GRANT: &str = "grant";
    pub(crate) const EXTEND: &str = "extend";
    pub(crate) const DONE: &str = "done";
    pub(crate) const FAIL: &str = "fail";
    pub(crate) const RELEASE: &str = "release";
    pub(crate) const EXHAUST: &str = "exhaust";
}

/// Why a lease was lost: the `reason` label, a small fixed set the loss reasons of the code map
/// to (the full sentence goes to the event, the log and the guard's `loss_reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loss {
    /// No extension was confirmed before the lease could end (a slow or unreachable server).
    Expired,
    /// The store says another holder has it (an extension or an ending was refused, a later
    /// attempt was announced, an operator took it).
    Taken,
    /// The hold reached its cap (`max_hold`, `max_run`).
    MaxHold,
    /// The client shut down while the lease was held.
    Shutdown,
    /// The outcome could not be recorded, or an extension failed for good.
    Error,
}

impl Loss {
    /// The label value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Loss::Expired => "expired",
            Loss::Taken => "taken",
            Loss::MaxHold => "max_hold",
            Loss::Shutdown => "shutdown",
            Loss::Error => "error",
        }
    }
}

/// What an extension came to: the `outcome` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExtendOutcome {
    /// Confirmed: the lease moved on.
    Ok,
    /// The store refused it: the lease is someone else's (or gone).
    Refused,
    /// It failed (a timeout, a connection error); it may be retried.
    Error,
}

impl ExtendOutcome {
    /// The label value.
    pub(crate) fn label(self) -> &'static str {
        match self {
            ExtendOutcome::Ok => "ok",
            ExtendOutcome::Refused => "refused",
            ExtendOutcome::Error => "error",
        }
    }
}

/// The labels every event of one primitive on one backend carries. `Copy`, two static strings:
/// cheap to keep in every handle and guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Labels {
    pub(crate) primitive: &'static str,
    pub(crate) backend: &'static str,
}

impl Labels {
    /// The labels of `primitive` on `backend` (values from [`primitive`] and [`backend`]).
    pub(crate) const fn new(primitive: &'static str, backend: &'static str) -> Self {
        Labels { primitive, backend }
    }

    /// A grant: counted (with `takeover`), and the time since `asked` (the call, or the
    /// start of the wait) into the acquisition histogram.
    pub(crate) fn granted(self, takeover: bool, asked: Instant) {
        metrics::counter!(GRANTS, "primitive" => self.primitive, "backend" => self.backend,
            "takeover" => if takeover { "true" } else { "false" })
        .increment(1);
        metrics::histogram!(ACQUIRE_DURATION, "primitive" => self.primitive, "backend" => self.backend)
            .record(seconds(asked.elapsed()));
    }

    /// One state-changing round trip `transition` (a [`transition`] value) that started at
    /// `sent`.
    pub(crate) fn transition(self, transition: &'static str, sent: Instant) {
        metrics::histogram!(TRANSITION_DURATION, "primitive" => self.primitive,
            "backend" => self.backend, "transition" => transition)
        .record(seconds(sent.elapsed()));
    }

    /// An extension that started at `sent` came to `outcome`; a confirmed one is also a
    /// transition.
    pub(crate) fn extended(self, outcome: ExtendOutcome, sent: Instant) {
        metrics::counter!(EXTENSIONS, "primitive" => self.primitive, "backend" => self.backend,
            "outcome" => outcome.label())
        .increment(1);
        if outcome == ExtendOutcome::Ok {
            self.transition(transition::EXTEND, sent);
        }
    }

    /// A held lease was lost for `why` (the hold's end is recorded by [`Labels::held`]).
    pub(crate) fn lost(self, why: Loss) {
        metrics::counter!(LEASE_LOST, "primitive" => self.primitive, "backend" => self.backend,
            "reason" => why.label())
        .increment(1);
    }

    /// A hold that began at `granted` ended, released or lost.
    pub(crate) fn held(self, granted: Instant) {
        metrics::histogram!(HOLD_DURATION, "primitive" => self.primitive, "backend" => self.backend)
            .record(seconds(granted.elapsed()));
    }
}

/// A counter labelled by backend only (the failover's outcomes, leader changes, the queue's
/// posts and drains): `name` is one of this module's constants.
pub(crate) fn count(name: &'static str, backend: &'static str) {
    metrics::counter!(name, "backend" => backend).increment(1);
}

/// A duration in seconds, the Prometheus base unit.
fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_prometheus_friendly() {
        let values = [
            Loss::Expired.label(),
            Loss::Taken.label(),
            Loss::MaxHold.label(),
            Loss::Shutdown.label(),
            Loss::Error.label(),
            ExtendOutcome::Ok.label(),
            ExtendOutcome::Refused.label(),
            ExtendOutcome::Error.label(),
        ];
        for v in values {
            assert!(v.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{v}");
        }
        for name in ALL {
            assert!(name.starts_with("baton_"), "{name}");
            assert!(
                name.ends_with("_total") || name.ends_with("_seconds"),
                "{name}: counters end in _total, durations in _seconds"
            );
        }
    }

    #[test]
    fn the_operating_guide_lists_every_metric() {
        let doc = include_str!("../../docs/operating.md");
        for name in ALL {
            assert!(
                doc.contains(&format!("`{name}`")),
                "docs/operating.md's metrics table misses {name}"
            );
        }
    }
}
