//! The worker task: the I/O around the pure decisions of [`protocol`](super::protocol).
//!
//! One task per (worker, job). As a backup it loops *observe → decide → act* until it wins an
//! attempt or the job ends; as a holder it waits for `done()`/`fail()` while keeping the lease
//! (watchdog) or watching the deadline (no watchdog). Every wait is a `select!` that also
//! listens for `stop()` and for the event receiver being dropped, so the task never outlives the
//! people interested in it.
//!
//! The backup's side (observe, decide, act, wait) is in [`backup`](super::backup), the
//! holder's (keep the lease, end the attempt) in [`holder`](super::holder); this file starts the
//! task and runs its loop.
//!
//! Transitions themselves are *not* raced against `stop()`: dropping a transition between its
//! `EXEC` and the reply would leave a grant nobody knows about. Each transition is bounded by the
//! response timeout instead, so `stop()` takes effect within about a second.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::{FailoverConfig, StatusLevel};
use super::events::{Event, EventSender, Worker};
use super::protocol::{Fault, Which};
use super::store::JobStore;
use crate::backend::jobs::OnStore;
use crate::error::Error;
use crate::util::backoff::Backoff;
use crate::util::metrics::{primitive, Labels};
use crate::util::pubsub::{HubMsg, Subscription};
use crate::util::settings::ReplicaWait;
use crate::util::time::human;
use crate::util::token as keys;

/// Starts a worker task for a job (its configuration) on whichever store its backend builds.
pub(crate) struct Start(
    pub(crate) FailoverConfig,
    pub(crate) Option<Arc<super::record::Recorder>>,
);

impl OnStore for Start {
    type Output = Worker;

    fn run<S: JobStore>(
        self,
        store: S,
        cancel: &CancellationToken,
        tracker: &TaskTracker,
    ) -> Worker {
        spawn_on(store, cancel, tracker, self.0, self.1)
    }
}

/// The worker's name (`worker_name`, else host and PID).
pub(crate) fn worker_name(cfg: &FailoverConfig) -> Arc<str> {
    cfg.worker_name
        .as_deref()
        .map_or_else(keys::default_worker_name, Into::into)
}

/// Starts a worker task for one job on `store`, a task of `tracker` stopped by `cancel`.
pub(crate) fn spawn_on<S: JobStore>(
    store: S,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
    cfg: FailoverConfig,
    record: Option<Arc<super::record::Recorder>>,
) -> Worker {
    let settings = store.settings().clone();
    let stop = cancel.child_token();
    let key: Arc<str> = cfg.key.as_str().into();
    let (events, worker) = Worker::channel(
        key.clone(),
        cfg.event_capacity,
        cfg.status_level,
        stop.clone(),
    );
    let mut task = Task {
        backoff: Backoff::new(settings.max_backoff),
        view: super::protocol::BackupView {
            max_attempts: cfg.max_attempts,
            has_retry_delay: !cfg.retry_delay.is_zero(),
            ..Default::default()
        },
        store: Arc::new(store),
        cfg: JobSettings {
            key,
            lease: cfg.lease,
            watchdog: cfg.watchdog,
            max_hold: cfg.max_hold,
            retry_delay: cfg.retry_delay,
            rejoin_after_fail: cfg.rejoin_after_fail,
            replica_ack: cfg.replica_ack,
            record,
        },
        events,
        stop,
        locked_reported: 0,
        sub: None,
        asked: Instant::now(),
        outage: None,
    };
    // A request may take up to `response_timeout`; a lease shorter than three of them leaves a
    // holder too little time to extend, or to learn in time that it cannot. Allowed (tests and
    // fast networks want short leases), but said.
    if settings.response_timeout > task.cfg.lease / 3 {
        let message = format!(
            "response_timeout ({}) is more than a third of the lease ({}): one slow request \
             can use up most of the lease",
            human(settings.response_timeout),
            human(task.cfg.lease)
        );
        tracing::warn!(key = %task.cfg.key, "{message}");
        task.events.status(StatusLevel::Normal, message);
    }
    tracker.spawn(task.run());
    worker
}

/// A won attempt.
pub(super) struct Grant {
    pub(super) attempt: u64,
    pub(super) last: bool,
    pub(super) fence: u64,
    pub(super) token: String,
    /// When the grant's `EXEC` was sent: the lease cannot end before `sent + lease` on
    /// the server, so measuring from the send time on our clock errs early, never late.
    pub(super) sent: Instant,
    /// Set when fewer replicas than [`FailoverConfig::replica_ack`] asks for acknowledged the
    /// grant: it is released, never handed out.
    pub(super) unconfirmed: Option<Error>,
}

pub(super) enum Step {
    Granted(Grant),
    Terminal(Event),
    Wait {
        attempt: u64,
        pttl_ms: Option<u64>,
    },
    Delay {
        attempt: u64,
    },
    /// A watched key changed under us (`EXEC` returned nil): observe again.
    Again,
}

/// What the loop does next, decided from a [`Step`] (small: it is what a waiting backup's loop
/// keeps across its awaits).
enum Next {
    Hold(Box<Grant>),
    End,
    Wait {
        attempt: u64,
        pttl_ms: Option<u64>,
    },
    Delay {
        attempt: u64,
    },
    Sleep(Duration),
    /// Observe again at once.
    Observe,
}

#[derive(PartialEq, Eq)]
pub(super) enum Flow {
    Continue,
    End,
}

/// What a running worker keeps of its [`FailoverConfig`]: only what its loop reads. The name
/// prefix and the worker's name live on in its keys and store, the event settings in its
/// [`EventSender`], `max_attempts` in its [`BackupView`](super::protocol::BackupView); keeping
/// the whole configuration would add about 100 bytes and two strings to every waiting backup.
pub(super) struct JobSettings {
    pub(super) key: Arc<str>,
    pub(super) lease: Duration,
    pub(super) watchdog: bool,
    pub(super) max_hold: Option<Duration>,
    pub(super) retry_delay: Duration,
    pub(super) rejoin_after_fail: bool,
    pub(super) replica_ack: Option<ReplicaWait>,
    /// The writer of the occurrence's record, for an occurrence's job
    /// ([`FailoverConfig::with_record`]): fed on grants and attempt ends, never awaited.
    pub(super) record: Option<Arc<super::record::Recorder>>,
}

impl JobSettings {
    /// As [`FailoverConfig::watchdog_interval`].
    pub(super) fn watchdog_interval(&self) -> Duration {
        self.lease / 3
    }
}

pub(super) struct Task<S: JobStore> {
    pub(super) store: Arc<S>,
    pub(super) cfg: JobSettings,
    pub(super) events: EventSender,
    pub(super) stop: CancellationToken,
    pub(super) view: super::protocol::BackupView,
    pub(super) backoff: Backoff,
    /// The attempt this worker last reported `Locked` for (0: none; attempts start at 1).
    pub(super) locked_reported: u64,
    pub(super) sub: Option<Subscription>,
    /// When this worker began to wait for its next grant (it started, or rejoined as a backup
    /// after its own failed attempt): the acquisition histogram counts from here.
    pub(super) asked: Instant,
    /// When the first retryable error of the current outage was reported (`None`: the server
    /// answered the last exchange). The first answer after one emits [`Event::Reachable`].
    pub(super) outage: Option<Instant>,
}

impl<S: JobStore> Task<S> {
    /// The labels of this worker's metrics.
    pub(super) fn labels(&self) -> Labels {
        Labels::new(primitive::FAILOVER, S::BACKEND)
    }

    /// Writes `change` into the occurrence's record in the background, when the job is a
    /// recorded occurrence (nothing otherwise).
    pub(super) fn record(&self, change: impl FnOnce() -> super::record::RecordChange) {
        if let Some(r) = &self.cfg.record {
            r.spawn(change());
        }
    }

    /// Runs the test hook (feature `testing`) between the two round trips of a transition.
    pub(super) async fn before_exec(&self, what: &'static str) {
        self.store.before_exec(what).await;
    }

    /// The task's future, inside its tracing span. A plain function around an `async fn` that
    /// owns the task: an `async fn run` that builds the span and awaits the loop kept room for
    /// the span's temporaries and a second copy of the loop's state, twice the size per worker.
    fn run(self) -> tracing::instrument::Instrumented<impl std::future::Future<Output = ()>> {
        // The fixed fields of every span baton opens; the attempt and its fencing token are
        // recorded with each grant (see `Task::hold`).
        let span = tracing::info_span!(
            "baton_worker",
            key = %self.cfg.key,
            node = %self.store.worker_name(),
            attempt = tracing::field::Empty,
            fencing_token = tracing::field::Empty,
        );
        // An async block that captures the task, not an `async fn` taking it: the latter keeps
        // the argument and its binding as two copies in the future's state.
        let mut task = self;
        tracing::Instrument::instrument(async move { task.main_loop().await }, span)
    }

    async fn main_loop(&mut self) {
        let mut nil_in_a_row = 0u32;
        loop {
            if self.stop.is_cancelled() {
                self.events.emit(Event::Stopped);
                return;
            }
            if self.events.is_closed() {
                return;
            }
            // Bound first: temporaries of a `match` scrutinee live to the end of the `match`, and
            // the compiler then keeps room for the whole transition future (about 2.8 KB) in
            // every sleeping worker's state across the arms' awaits.
            // The checkout's result is moved whole into the transition: a `match` that moved only
            // the connection out would keep the rest of it (128 bytes) in the loop's state.
            let checkout = Box::pin(self.checkout()).await;
            let step = Box::pin(self.transition(checkout)).await;
            // The step is consumed here, by a plain function: what follows awaits only a small
            // `Next`, so a waiting backup's state does not keep room for a `Step` or an `Error`.
            let flow = match self.next(step, &mut nil_in_a_row) {
                Next::End => Flow::End,
                Next::Observe => Flow::Continue,
                Next::Hold(g) => {
                    let granted = g.sent;
                    let held = Box::pin(self.hold(*g));
                    let flow = held.await;
                    // However the attempt ended (done, failed, released, lost), its hold did.
                    self.labels().held(granted);
                    // Rejoined as a backup: the next acquisition's wait starts now.
                    self.asked = Instant::now();
                    flow
                }
                Next::Wait { attempt, pttl_ms } => Box::pin(self.wait(attempt, pttl_ms)).await,
                Next::Delay { attempt } => {
                    let flow = Box::pin(self.sleep(self.cfg.retry_delay)).await;
                    self.view.delay_served(attempt);
                    flow
                }
                Next::Sleep(d) => Box::pin(self.sleep(d)).await,
            };
            if flow == Flow::End {
                return;
            }
        }
    }

    /// What the loop does after `step`: reports and counts here, so that the loop's awaits hold
    /// only the small [`Next`].
    fn next(&mut self, step: Result<Step, Error>, nil_in_a_row: &mut u32) -> Next {
        if step.is_ok() {
            // Every step that is not an error was an exchange the server answered.
            self.contact();
        }
        match step {
            Ok(Step::Granted(g)) => {
                *nil_in_a_row = 0;
                self.backoff.reset();
                Next::Hold(Box::new(g))
            }
            Ok(Step::Terminal(ev)) => {
                self.events.emit(ev);
                Next::End
            }
            Ok(Step::Wait { attempt, pttl_ms }) => {
                *nil_in_a_row = 0;
                self.backoff.reset();
                Next::Wait { attempt, pttl_ms }
            }
            Ok(Step::Delay { attempt }) => {
                self.events.status(
                    StatusLevel::Normal,
                    format!(
                        "attempt {attempt} failed; waiting retry_delay {} before taking over",
                        human(self.cfg.retry_delay)
                    ),
                );
                Next::Delay { attempt }
            }
            Ok(Step::Again) => {
                // Contention is normal (K backups racing for one attempt); if it persists,
                // spread the racers out a little so someone wins quickly.
                *nil_in_a_row += 1;
                if *nil_in_a_row > 2 {
                    Next::Sleep(Duration::from_micros(keys::random_u64() % 5_000))
                } else {
                    Next::Observe
                }
            }
            Err(e) => {
                if self.report(&e) == Flow::End {
                    return Next::End;
                }
                Next::Sleep(self.backoff.next_delay())
            }
        }
    }

    /// The server answered an exchange: ends an outage, if one was reported, with one
    /// [`Event::Reachable`]. Called on every success, it costs nothing while there is none.
    pub(super) fn contact(&mut self) {
        if let Some(since) = self.outage.take() {
            let outage_ms = crate::util::time::ms(since.elapsed());
            tracing::info!(outage_ms, "the server answers again");
            self.events.emit(Event::Reachable { outage_ms });
        }
    }

    /// Emits an `Error` event; returns `End` for errors that end the stream.
    pub(super) fn report(&mut self, e: &Error) -> Flow {
        if e.is_retryable() {
            tracing::debug!(error = %e, "retryable error");
            self.outage.get_or_insert_with(Instant::now);
        } else {
            tracing::warn!(error = %e, "worker ends with an error");
        }
        self.events.emit(Event::from_error(e));
        if e.is_retryable() {
            Flow::Continue
        } else {
            Flow::End
        }
    }

    /// Sleeps unless stopped or abandoned first.
    pub(super) async fn sleep(&mut self, d: Duration) -> Flow {
        tokio::select! {
            biased;
            // Also a dropped `Worker` (it cancels `stop`).
            _ = self.stop.cancelled() => {
                self.events.emit(Event::Stopped);
                Flow::End
            }
            _ = tokio::time::sleep(d) => Flow::Continue,
        }
    }
}

pub(super) fn fault_error<S: JobStore>(store: &S, fault: Fault) -> Error {
    let key = |w: Which| store.locate(w);
    match fault {
        Fault::Corrupt { which, value } => Error::CorruptState {
            key: key(which),
            value,
        },
        Fault::WrongType { which, detail } => Error::WrongType {
            key: key(which),
            detail,
        },
        Fault::StateLost { seen, now } => Error::StateLost {
            key: store.locate(Which::State),
            seen,
            now,
        },
    }
}

/// Receives from an optional subscription; pending forever without one.
pub(super) async fn recv_sub(sub: Option<&mut Subscription>) -> Option<HubMsg> {
    match sub {
        Some(s) => s.rx.recv().await,
        None => std::future::pending().await,
    }
}

pub(super) fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::jobs::RedisStore;

    /// The size of `R` for a function returning it, without calling the function.
    fn returned_size<A, R>(_: fn(A) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// Every waiting backup keeps one of these futures (in tokio's task cell) for as long as it
    /// waits: tens of thousands of them on one client make its size the bulk of a backup's
    /// memory (see docs/benchmarks.md, the idle scenario). Sub-futures that only run briefly
    /// (transitions, the pool checkout, subscribing) are boxed so that they do not count here,
    /// and the loop awaits nothing while it holds a `Step` or an `Error`.
    ///
    /// The bound is what fits a 640-byte cell: tokio aligns a task's cell to 128 bytes and adds
    /// 184 bytes of header and trailer on x86_64 (measured: a 712-byte future took 896 bytes,
    /// a 456-byte one 640), so 8 bytes more cost 128 per backup.
    #[test]
    fn a_waiting_workers_future_stays_small() {
        let size = returned_size(Task::<RedisStore>::run);
        let wait = {
            fn wait(t: &mut Task<RedisStore>) -> impl std::future::Future<Output = Flow> + '_ {
                t.wait(1, None)
            }
            returned_size(wait)
        };
        eprintln!("worker future: {size} bytes; its boxed wait: {wait} bytes");
        assert!(size <= 456, "the worker task's future grew to {size} bytes");
        assert!(
            wait <= 336,
            "a waiting backup's wait() grew to {wait} bytes"
        );
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("ジョブ", 4), "ジ");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
