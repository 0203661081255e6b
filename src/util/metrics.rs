//! The metrics baton records, named once: every metric's name, its labels' fixed values and one
//! helper per event, called where the event happens.
//!
//! baton records through the [`metrics`] facade and never installs a recorder: the application
//! does (the `baton` command installs a Prometheus one for `--metrics-addr`), then calls
//! [`describe_metrics`], which gives it every metric's help text and unit from the one table
//! of them, [`METRICS`]. Each helper resolves its handle through the current recorder at the
//! moment of the event, never earlier, because a handle registered before the application
//! installed its recorder stays a no-op forever (the facade's rule): a `Client` built before the
//! recorder would otherwise record nothing. With no recorder installed a call costs a look at
//! the key table (built once) and at the global recorder, and nothing else. Descriptions are the
//! exception: a recorder keeps only those made while it is installed, hence the call after
//! installing it.
//!
//! Labels are the primitive, the backend and small fixed enums, never a key or a worker name:
//! the number of series stays bounded whatever the workload (docs/operating.md, "Metrics and
//! traces", has the table).

use std::sync::OnceLock;

use metrics::{Key, Label, Level, Metadata, Unit};
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
/// `baton_schedule_record_errors_total{backend}`: writes to a schedule's record that failed
/// (best effort: the job is not affected).
pub(crate) const SCHEDULE_RECORD_ERRORS: &str = "baton_schedule_record_errors_total";
/// `baton_acquire_duration_seconds{primitive,backend}`: from the call (or the start of the
/// wait) to the grant, waits included.
pub(crate) const ACQUIRE_DURATION: &str = "baton_acquire_duration_seconds";
/// `baton_hold_duration_seconds{primitive,backend}`: from the grant to its release or loss.
pub(crate) const HOLD_DURATION: &str = "baton_hold_duration_seconds";
/// `baton_transition_duration_seconds{primitive,backend,transition}`: one state-changing round
/// trip (a grant, an extension, a release, ...), from its send to its reply.
pub(crate) const TRANSITION_DURATION: &str = "baton_transition_duration_seconds";

/// What a metric is to a recorder: its kind and unit go with its description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MetricKind {
    /// A monotonic count (`_total`), in events.
    Counter,
    /// A distribution of durations (`_seconds`).
    Histogram,
}

/// One metric baton records, as [`describe_metrics`] describes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Metric {
    pub(crate) name: &'static str,
    pub(crate) kind: MetricKind,
    /// The `# HELP` text: one line, what is counted or timed.
    pub(crate) help: &'static str,
}

impl Metric {
    /// The unit the recorder is told: counters count, histograms time in seconds (the
    /// Prometheus base unit, the `_seconds` of their names).
    pub(crate) fn unit(&self) -> Unit {
        match self.kind {
            MetricKind::Counter => Unit::Count,
            MetricKind::Histogram => Unit::Seconds,
        }
    }
}

/// Every metric baton records, with its description: the one table [`describe_metrics`] reads,
/// the docs test checks docs/operating.md against, and the tests below check every emitted key
/// against (a metric missing here fails them).
pub(crate) const METRICS: &[Metric] = &[
    Metric {
        name: GRANTS,
        kind: MetricKind::Counter,
        help: "Grants: failover attempts won, locks taken, leader terms won (takeover=true: \
               won after a failed attempt or a lease that ran out).",
    },
    Metric {
        name: FAILED_ATTEMPTS,
        kind: MetricKind::Counter,
        help: "Failover attempts this process failed.",
    },
    Metric {
        name: EXHAUSTED,
        kind: MetricKind::Counter,
        help: "Failover jobs this process wrote EXHAUSTED (no attempt left).",
    },
    Metric {
        name: DONE,
        kind: MetricKind::Counter,
        help: "Failover attempts this process completed (DONE written).",
    },
    Metric {
        name: LEASE_LOST,
        kind: MetricKind::Counter,
        help: "Leases lost while held, by reason.",
    },
    Metric {
        name: EXTENSIONS,
        kind: MetricKind::Counter,
        help: "Lease extensions, by outcome (ok, refused, error).",
    },
    Metric {
        name: LEADER_CHANGES,
        kind: MetricKind::Counter,
        help: "Times this candidate became leader, lost its leadership or resigned.",
    },
    Metric {
        name: QUEUE_POSTS,
        kind: MetricKind::Counter,
        help: "Items posted to a run-or-enqueue queue.",
    },
    Metric {
        name: QUEUE_DRAINED,
        kind: MetricKind::Counter,
        help: "Queued items a drainer handled and removed.",
    },
    Metric {
        name: SCHEDULE_RECORD_ERRORS,
        kind: MetricKind::Counter,
        help: "Writes to a schedule's record that failed (the jobs are not affected).",
    },
    Metric {
        name: ACQUIRE_DURATION,
        kind: MetricKind::Histogram,
        help: "Seconds from the call (or the start of the wait) to the grant, waits included.",
    },
    Metric {
        name: HOLD_DURATION,
        kind: MetricKind::Histogram,
        help: "Seconds from a grant to its release, its end or its loss.",
    },
    Metric {
        name: TRANSITION_DURATION,
        kind: MetricKind::Histogram,
        help: "Seconds of one state-changing round trip (grant, extend, done, fail, release, \
               exhaust), from its send to its reply.",
    },
];

/// Describes every metric baton records (its help text and unit) to the installed recorder:
/// call it once, right after installing your recorder.
///
/// baton never installs a recorder and resolves each metric when its event happens, so a
/// recorder installed at any time counts everything from then on; but a description is given
/// to the recorder current at the moment it is made, and a recorder installed later never
/// hears it. A Prometheus exporter without descriptions serves no `# HELP` lines, which
/// `promtool check metrics` refuses. This function describes the counters
/// `baton_grants_total`, `baton_failed_attempts_total`, `baton_exhausted_total`,
/// `baton_done_total`, `baton_lease_lost_total`, `baton_extensions_total`,
/// `baton_leader_changes_total`, `baton_queue_posts_total`, `baton_queue_drained_total`,
/// `baton_schedule_record_errors_total` (unit: count) and the histograms `baton_acquire_duration_seconds`,
/// `baton_hold_duration_seconds`, `baton_transition_duration_seconds` (unit: seconds); the
/// operating guide (`docs/operating.md`, "Metrics and traces") has their labels. Calling it
/// again is harmless (a recorder keeps the first description of a name); without a recorder it
/// does nothing.
///
/// ```
/// use metrics_exporter_prometheus::PrometheusBuilder;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let recorder = PrometheusBuilder::new().build_recorder();
/// let handle = recorder.handle();
/// metrics::set_global_recorder(recorder)?;
/// baton::describe_metrics();
/// // ... build the `Client`, run jobs; serve `handle.render()` at /metrics: every baton
/// // metric comes with its `# HELP` line.
/// # let _ = handle.render();
/// # Ok(()) }
/// ```
pub fn describe_metrics() {
    for m in METRICS {
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, m.unit(), m.help),
            MetricKind::Histogram => metrics::describe_histogram!(m.name, m.unit(), m.help),
        }
    }
}

/// A counter labelled by backend only (the failover's outcomes, leader changes, the queue's
/// posts and drains), for [`count`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Count {
    /// [`FAILED_ATTEMPTS`].
    FailedAttempts,
    /// [`EXHAUSTED`].
    Exhausted,
    /// [`DONE`].
    Done,
    /// [`LEADER_CHANGES`].
    LeaderChanges,
    /// [`QUEUE_POSTS`].
    QueuePosts,
    /// [`QUEUE_DRAINED`].
    QueueDrained,
    /// [`SCHEDULE_RECORD_ERRORS`].
    ScheduleRecordErrors,
}

impl Count {
    /// Every value, in declaration order (the order of the key table's rows).
    const ALL: [Count; 7] = [
        Count::FailedAttempts,
        Count::Exhausted,
        Count::Done,
        Count::LeaderChanges,
        Count::QueuePosts,
        Count::QueueDrained,
        Count::ScheduleRecordErrors,
    ];

    /// The metric's name.
    const fn name(self) -> &'static str {
        match self {
            Count::FailedAttempts => FAILED_ATTEMPTS,
            Count::Exhausted => EXHAUSTED,
            Count::Done => DONE,
            Count::LeaderChanges => LEADER_CHANGES,
            Count::QueuePosts => QUEUE_POSTS,
            Count::QueueDrained => QUEUE_DRAINED,
            Count::ScheduleRecordErrors => SCHEDULE_RECORD_ERRORS,
        }
    }
}

/// A label's value type: a small fixed set, each value its string and its row in the key table.
trait LabelValue: Copy + 'static {
    /// Every value, in declaration order: `ALL[v.index()] == v`.
    const ALL: &'static [Self];
    /// The label value.
    fn value(self) -> &'static str;
    /// Its position in [`LabelValue::ALL`].
    fn index(self) -> usize;
    /// Every value's string, in [`LabelValue::ALL`]'s order.
    fn values() -> Vec<&'static str> {
        Self::ALL.iter().map(|v| v.value()).collect()
    }
}

/// Declares a label's value type: the enum, its `ALL` and its strings.
macro_rules! label_values {
    ($(#[$doc:meta])* $name:ident {
        $($(#[doc = $vdoc:literal])* $(#[cfg($vcfg:meta)])? $variant:ident = $value:literal,)*
    }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum $name {
            $($(#[doc = $vdoc])* $(#[cfg($vcfg)])? $variant,)*
        }

        impl $name {
            /// The label value.
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $($(#[cfg($vcfg)])? $name::$variant => $value,)*
                }
            }
        }

        impl LabelValue for $name {
            const ALL: &'static [Self] = &[$($(#[cfg($vcfg)])? $name::$variant,)*];
            fn value(self) -> &'static str {
                self.as_str()
            }
            fn index(self) -> usize {
                // A fieldless enum's discriminant: its declaration order, the order of `ALL`.
                self as usize
            }
        }
    };
}

label_values! {
    /// The `primitive` label.
    Primitive {
        /// The failover coordinator.
        Failover = "failover",
        /// The fenced mutex.
        Mutex = "mutex",
        /// The fair lock.
        Fair = "fair",
        /// Leader election.
        Leader = "leader",
        /// Redlock.
        Redlock = "redlock",
        /// Run-or-enqueue.
        Queue = "queue",
        /// The semaphore.
        Semaphore = "semaphore",
        /// The read-write lock.
        RwLock = "rwlock",
        /// PostgreSQL advisory locks.
        #[cfg(feature = "postgres")]
        Advisory = "advisory",
    }
}

label_values! {
    /// The `backend` label.
    Backend {
        /// Redis (one server, Sentinel or Cluster).
        Redis = "redis",
        /// PostgreSQL.
        #[cfg(feature = "postgres")]
        Postgres = "postgres",
    }
}

label_values! {
    /// The `transition` label: which state-changing round trip.
    Transition {
        /// A grant.
        Grant = "grant",
        /// A confirmed extension.
        Extend = "extend",
        /// A failover attempt's `done()`.
        Done = "done",
        /// A failover attempt's `fail()`.
        Fail = "fail",
        /// A release.
        Release = "release",
        /// A job's exhaustion by a backup.
        Exhaust = "exhaust",
    }
}

label_values! {
    /// Why a lease was lost: the `reason` label, a small fixed set the loss reasons of the code
    /// map to (the full sentence goes to the event, the log and the guard's `loss_reason`).
    Loss {
        /// No extension was confirmed before the lease could end (a slow or unreachable
        /// server).
        Expired = "expired",
        /// The store says another holder has it (an extension or an ending was refused, a
        /// later attempt was announced, an operator took it).
        Taken = "taken",
        /// The hold reached its cap (`max_hold`, of a lock or a failover attempt).
        MaxHold = "max_hold",
        /// The client shut down while the lease was held.
        Shutdown = "shutdown",
        /// The outcome could not be recorded, or an extension failed for good.
        Error = "error",
    }
}

label_values! {
    /// What an extension came to: the `outcome` label.
    ExtendOutcome {
        /// Confirmed: the lease moved on.
        Ok = "ok",
        /// The store refused it: the lease is someone else's (or gone).
        Refused = "refused",
        /// It failed (a timeout, a connection error); it may be retried.
        Error = "error",
    }
}

/// The `primitive` label's values, by their call sites' names.
pub(crate) mod primitive {
    use super::Primitive;
    pub(crate) const FAILOVER: Primitive = Primitive::Failover;
    pub(crate) const MUTEX: Primitive = Primitive::Mutex;
    pub(crate) const FAIR: Primitive = Primitive::Fair;
    pub(crate) const LEADER: Primitive = Primitive::Leader;
    pub(crate) const SEMAPHORE: Primitive = Primitive::Semaphore;
    pub(crate) const REDLOCK: Primitive = Primitive::Redlock;
    pub(crate) const QUEUE: Primitive = Primitive::Queue;
    pub(crate) const RWLOCK: Primitive = Primitive::RwLock;
    #[cfg(feature = "postgres")]
    pub(crate) const ADVISORY: Primitive = Primitive::Advisory;
}

/// The `backend` label's values.
pub(crate) mod backend {
    use super::Backend;
    pub(crate) const REDIS: Backend = Backend::Redis;
    #[cfg(feature = "postgres")]
    pub(crate) const POSTGRES: Backend = Backend::Postgres;
}

/// The `transition` label's values.
pub(crate) mod transition {
    use super::Transition;
    pub(crate) const GRANT: Transition = Transition::Grant;
    pub(crate) const EXTEND: Transition = Transition::Extend;
    pub(crate) const DONE: Transition = Transition::Done;
    pub(crate) const FAIL: Transition = Transition::Fail;
    pub(crate) const RELEASE: Transition = Transition::Release;
    pub(crate) const EXHAUST: Transition = Transition::Exhaust;
}

/// The labels every event of one primitive on one backend carries. `Copy`, two bytes: cheap to
/// keep in every handle and guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Labels {
    pub(crate) primitive: Primitive,
    pub(crate) backend: Backend,
}

impl Labels {
    /// The labels of `primitive` on `backend`.
    pub(crate) const fn new(primitive: Primitive, backend: Backend) -> Self {
        Labels { primitive, backend }
    }

    /// The row of this pair in a key table whose first two labels are `primitive` and
    /// `backend`.
    fn row(self) -> usize {
        self.primitive.index() * Backend::ALL.len() + self.backend.index()
    }

    /// A grant: counted (with `takeover`), and the time since `asked` (the call, or the
    /// start of the wait) into the acquisition histogram.
    pub(crate) fn granted(self, takeover: bool, asked: Instant) {
        let keys = keys();
        increment(keys.grants.at(self.row() * 2 + usize::from(takeover)));
        record(keys.acquire.at(self.row()), asked);
    }

    /// One state-changing round trip `transition` that started at `sent`.
    pub(crate) fn transition(self, transition: Transition, sent: Instant) {
        let at = self.row() * Transition::ALL.len() + transition.index();
        record(keys().transition.at(at), sent);
    }

    /// An extension that started at `sent` came to `outcome`; a confirmed one is also a
    /// transition.
    pub(crate) fn extended(self, outcome: ExtendOutcome, sent: Instant) {
        let at = self.row() * ExtendOutcome::ALL.len() + outcome.index();
        increment(keys().extensions.at(at));
        if outcome == ExtendOutcome::Ok {
            self.transition(transition::EXTEND, sent);
        }
    }

    /// A held lease was lost for `why` (the hold's end is recorded by [`Labels::held`]).
    pub(crate) fn lost(self, why: Loss) {
        let at = self.row() * Loss::ALL.len() + why.index();
        increment(keys().lost.at(at));
    }

    /// A hold that began at `granted` ended, released or lost.
    pub(crate) fn held(self, granted: Instant) {
        record(keys().hold.at(self.row()), granted);
    }
}

/// A counter labelled by backend only.
pub(crate) fn count(what: Count, backend: Backend) {
    let at = what as usize * Backend::ALL.len() + backend.index();
    increment(keys().counts.at(at));
}

/// Every metric's keys, one per combination of its labels' values, built once.
///
/// A key is a name and labels, not a handle: each event still resolves its counter or
/// histogram through the recorder current at that moment ([`metrics::with_recorder`]), so an
/// application that installs its recorder after the `Client` is built loses nothing (the
/// facade's rule above). What the table saves is the macros' per-event work with runtime label
/// values: a `Vec` of labels, the key's hash, and the recorder's copy of the labels into an
/// `Arc` (`Key::to_retained`) before its registry lookup — the labels here are `'static`, so
/// that copy is a pointer copy and the hash is computed once.
struct KeyTable {
    grants: Keys,
    acquire: Keys,
    hold: Keys,
    transition: Keys,
    extensions: Keys,
    lost: Keys,
    counts: Keys,
}

/// One metric's keys (or, for [`KeyTable::counts`], several metrics'), in row-major order of
/// their labels' values.
struct Keys(Vec<Key>);

impl Keys {
    /// The keys of `names` (each) × every combination of `labels`' values, the last label
    /// varying fastest.
    fn new(names: &[&'static str], labels: &[(&'static str, Vec<&'static str>)]) -> Keys {
        let mut sets: Vec<Vec<Label>> = vec![Vec::new()];
        for (label, values) in labels {
            sets = sets
                .iter()
                .flat_map(|set| {
                    values.iter().map(move |value| {
                        let mut set = set.clone();
                        set.push(Label::from_static_parts(label, value));
                        set
                    })
                })
                .collect();
        }
        let mut keys = Vec::with_capacity(names.len() * sets.len());
        for name in names {
            for set in &sets {
                // Leaked once per process: a few hundred small label sets, made `'static` so a
                // recorder's `to_retained` of the key borrows them instead of copying them.
                let set: &'static [Label] = Box::leak(set.clone().into_boxed_slice());
                keys.push(Key::from_static_parts(name, set));
            }
        }
        Keys(keys)
    }

    /// The key at `at`; every index is computed from the label values' positions, in range by
    /// construction.
    fn at(&self, at: usize) -> &Key {
        &self.0[at]
    }
}

/// The key table, built at the first event.
fn keys() -> &'static KeyTable {
    static TABLE: OnceLock<KeyTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let pb = |third: Option<(&'static str, Vec<&'static str>)>| {
            let mut labels = vec![
                ("primitive", Primitive::values()),
                ("backend", Backend::values()),
            ];
            labels.extend(third);
            labels
        };
        KeyTable {
            grants: Keys::new(&[GRANTS], &pb(Some(("takeover", vec!["false", "true"])))),
            acquire: Keys::new(&[ACQUIRE_DURATION], &pb(None)),
            hold: Keys::new(&[HOLD_DURATION], &pb(None)),
            transition: Keys::new(
                &[TRANSITION_DURATION],
                &pb(Some(("transition", Transition::values()))),
            ),
            extensions: Keys::new(
                &[EXTENSIONS],
                &pb(Some(("outcome", ExtendOutcome::values()))),
            ),
            lost: Keys::new(&[LEASE_LOST], &pb(Some(("reason", Loss::values())))),
            counts: Keys::new(
                &Count::ALL.map(Count::name),
                &[("backend", Backend::values())],
            ),
        }
    })
}

/// What the macros would pass as the metadata: this module, level `INFO`.
static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Adds one to the counter `key` of the current recorder.
fn increment(key: &Key) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA)).increment(1);
}

/// Records the time since `since`, in seconds (the Prometheus base unit), into the histogram
/// `key` of the current recorder.
fn record(key: &Key, since: Instant) {
    metrics::with_recorder(|r| r.register_histogram(key, &METADATA))
        .record(since.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_prometheus_friendly() {
        let values = [
            Primitive::values(),
            Backend::values(),
            Transition::values(),
            Loss::values(),
            ExtendOutcome::values(),
        ];
        for v in values.concat() {
            assert!(v.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{v}");
        }
        for name in METRICS.iter().map(|m| m.name) {
            assert!(name.starts_with("baton_"), "{name}");
            assert!(
                name.ends_with("_total") || name.ends_with("_seconds"),
                "{name}: counters end in _total, durations in _seconds"
            );
        }
    }

    /// The labels of `key`, as (key, value) pairs in order.
    fn labels_of(key: &Key) -> Vec<(&str, &str)> {
        key.labels().map(|l| (l.key(), l.value())).collect()
    }

    #[test]
    fn every_event_finds_the_key_of_its_own_labels() {
        fn check<V: LabelValue>(
            keys: &Keys,
            name: &str,
            label: &str,
            at: impl Fn(Labels, V) -> usize,
        ) {
            for &p in Primitive::ALL {
                for &b in Backend::ALL {
                    for &v in V::ALL {
                        let l = Labels::new(p, b);
                        let key = keys.at(at(l, v));
                        assert_eq!(key.name(), name);
                        assert_eq!(
                            labels_of(key),
                            [
                                ("primitive", p.as_str()),
                                ("backend", b.as_str()),
                                (label, v.value())
                            ]
                        );
                    }
                }
            }
        }
        let k = keys();
        check(
            &k.transition,
            TRANSITION_DURATION,
            "transition",
            |l, v: Transition| l.row() * Transition::ALL.len() + v.index(),
        );
        check(
            &k.extensions,
            EXTENSIONS,
            "outcome",
            |l, v: ExtendOutcome| l.row() * ExtendOutcome::ALL.len() + v.index(),
        );
        check(&k.lost, LEASE_LOST, "reason", |l, v: Loss| {
            l.row() * Loss::ALL.len() + v.index()
        });
        for &p in Primitive::ALL {
            for &b in Backend::ALL {
                let l = Labels::new(p, b);
                let pb = [("primitive", p.as_str()), ("backend", b.as_str())];
                for takeover in [false, true] {
                    let key = k.grants.at(l.row() * 2 + usize::from(takeover));
                    assert_eq!(key.name(), GRANTS);
                    assert_eq!(
                        labels_of(key),
                        [pb[0], pb[1], ("takeover", &*takeover.to_string())]
                    );
                }
                assert_eq!(k.acquire.at(l.row()).name(), ACQUIRE_DURATION);
                assert_eq!(labels_of(k.acquire.at(l.row())), pb);
                assert_eq!(k.hold.at(l.row()).name(), HOLD_DURATION);
                assert_eq!(labels_of(k.hold.at(l.row())), pb);
            }
        }
        for what in Count::ALL {
            for &b in Backend::ALL {
                let key = k.counts.at(what as usize * Backend::ALL.len() + b.index());
                assert_eq!(key.name(), what.name());
                assert_eq!(labels_of(key), [("backend", b.as_str())]);
            }
        }
    }

    /// The description of `name`, failing the test when it has none.
    fn described(name: &str) -> &'static Metric {
        METRICS
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} is recorded but missing from METRICS"))
    }

    #[test]
    fn every_key_recorded_has_a_description_of_its_kind() {
        // An exhaustive pattern: a new field of the key table fails to compile here until it
        // is given its kind below.
        let KeyTable {
            grants,
            acquire,
            hold,
            transition,
            extensions,
            lost,
            counts,
        } = keys();
        let kinds = [
            (grants, MetricKind::Counter),
            (extensions, MetricKind::Counter),
            (lost, MetricKind::Counter),
            (counts, MetricKind::Counter),
            (acquire, MetricKind::Histogram),
            (hold, MetricKind::Histogram),
            (transition, MetricKind::Histogram),
        ];
        let mut recorded = std::collections::BTreeSet::new();
        for (keys, kind) in kinds {
            for key in &keys.0 {
                let m = described(key.name());
                assert_eq!(m.kind, kind, "{}", m.name);
                recorded.insert(m.name);
            }
        }
        // And nothing described that is never recorded.
        let all: std::collections::BTreeSet<_> = METRICS.iter().map(|m| m.name).collect();
        assert_eq!(recorded, all);
        assert_eq!(all.len(), METRICS.len(), "a name described twice");
        for m in METRICS {
            assert!(!m.help.is_empty() && !m.help.contains('\n'), "{}", m.name);
        }
    }

    /// The library's source files, outside this one and the `baton` command's.
    fn library_sources() -> Vec<(std::path::PathBuf, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut dirs = vec![root.clone()];
        let mut files = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    if path != root.join("bin") {
                        dirs.push(path);
                    }
                } else if path.extension().is_some_and(|e| e == "rs")
                    && path != root.join("util/metrics.rs")
                {
                    let text = std::fs::read_to_string(&path).expect("a source file");
                    files.push((path, text));
                }
            }
        }
        files
    }

    #[test]
    fn the_library_records_only_through_this_module() {
        // A metric recorded elsewhere (a macro, a handle of its own) would escape the table
        // above, and with it its description.
        let sources = library_sources();
        assert!(sources.len() > 20, "found {} files", sources.len());
        for (path, text) in sources {
            for banned in [
                "counter!(",
                "gauge!(",
                "histogram!(",
                "register_counter",
                "register_gauge",
                "register_histogram",
            ] {
                assert!(
                    !text.contains(banned),
                    "{}: records a metric with {banned}: go through src/util/metrics.rs",
                    path.display()
                );
            }
            // A metric's name anywhere else must be one of the table's too.
            for (at, _) in text.match_indices("\"baton_") {
                let literal: String = text[at + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if literal.ends_with("_total") || literal.ends_with("_seconds") {
                    described(&literal);
                }
            }
        }
    }

    #[test]
    fn describing_tells_the_recorder_every_metric() {
        use metrics_util::debugging::DebuggingRecorder;
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        metrics::with_local_recorder(&recorder, || {
            describe_metrics();
            // A snapshot shows the descriptions of registered metrics only.
            for m in METRICS {
                match m.kind {
                    MetricKind::Counter => metrics::counter!(m.name).increment(0),
                    MetricKind::Histogram => metrics::histogram!(m.name).record(0.0),
                }
            }
        });
        let seen = snapshotter.snapshot().into_vec();
        assert_eq!(seen.len(), METRICS.len());
        for (key, unit, help, _) in seen {
            let m = described(key.key().name());
            assert_eq!(unit, Some(m.unit()), "{}", m.name);
            assert_eq!(help.as_deref(), Some(m.help), "{}", m.name);
        }
    }

    #[test]
    fn the_operating_guide_lists_every_metric() {
        let doc = include_str!("../../docs/operating.md");
        for name in METRICS.iter().map(|m| m.name) {
            assert!(
                doc.contains(&format!("`{name}`")),
                "docs/operating.md's metrics table misses {name}"
            );
        }
    }
}
