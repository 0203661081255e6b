//! What a worker reports: the [`Event`] stream, the [`Acquired`] attempt and its handle.
//!
//! The stream is bounded for chatter, never for what matters: `Status` and `Locked` events are
//! dropped (and counted in a `Lagged` event) once `event_capacity` of them wait unread, while
//! `Acquired`, `Error` and terminal events always get through. That keeps a slow reader from
//! stalling the worker task (which must keep extending a lease on time) without ever losing the
//! news that a lease was won or lost.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use serde::Serialize;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::config::StatusLevel;
use crate::error::{Error, ErrorKind};
use crate::lease::guard::{sealed, Fenced, HeldLease, LeaseCore};
use crate::util::lock;
use crate::util::schedule_record::Exit;

/// One thing a worker saw or did. Every event serializes to one JSON object tagged by `event`.
///
/// Exactly one terminal event ends each stream (see [`Event::is_terminal`]): `Completed`,
/// `Exhausted`, `Failed`, `LeaseLost`, `Stopped`, or an `Error` that is not retryable.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event")]
#[non_exhaustive]
pub enum Event {
    /// This worker won an attempt: do the work, then call `done()` or `fail()`.
    Acquired(Acquired),
    /// Another worker holds `attempt`; this one waits as a backup (sent once per attempt).
    Locked {
        /// The attempt being run elsewhere.
        attempt: u64,
        /// This worker's `max_attempts`.
        max_attempts: u64,
        /// The holder's lease time left in ms (`None` if the lease has no TTL).
        lease_remaining_ms: Option<u64>,
    },
    /// A human-readable progress note.
    Status {
        /// Normal or Verbose.
        level: StatusLevel,
        /// The sentence.
        message: String,
    },
    /// Something went wrong. A retryable error is retried with backoff and the stream goes on;
    /// any other ends the stream.
    Error {
        /// The stable classification.
        kind: ErrorKind,
        /// What happened, naming the key.
        message: String,
        /// Whether the worker retries.
        retryable: bool,
    },
    /// Without the watchdog, the attempt's lease is about to run out (at send time + `lease`
    /// − max(1 %, 2 ms) on this worker's monotonic clock): a backup may take over from now on.
    /// With `max_hold`, the cap was reached.
    DeadlinePassed {
        /// The attempt.
        attempt: u64,
    },
    /// The server answered again after retryable errors: sent once per outage, at the first
    /// successful exchange after the `Error` events it ends (never for a healthy worker, so a
    /// waiting backup's stream stays quiet). A reader that gives up on a long outage restarts
    /// its clock here.
    Reachable {
        /// How long the server failed, in ms: from the first `Error` of the outage to this
        /// answer.
        outage_ms: u64,
    },
    /// With [`rejoin_after_fail`](super::FailoverConfigBuilder::rejoin_after_fail): this
    /// worker's attempt failed, or lost its lease, and it waits as a backup again (after a
    /// failure, with a head start for the others). Not terminal: `Locked`, `Acquired`, …
    /// follow as for a new worker. Without rejoin a failed attempt ends the stream with
    /// `Failed` instead, and a lost one with `LeaseLost`. A lost attempt's handle says so at
    /// once all the same ([`HeldLease::lost`]): stop the work on
    /// it, or on this event while the attempt runs.
    Rejoined {
        /// The attempt that ended here.
        attempt: u64,
        /// The reason given to `fail()`, or `lease lost: …` and why.
        reason: String,
    },
    /// `dropped` `Status`/`Locked` events were discarded because nobody read them.
    Lagged {
        /// How many.
        dropped: u64,
    },
    /// Terminal: the job is `DONE` (`attempt` is set when this worker did it).
    Completed {
        /// The attempt this worker completed, if it was this worker.
        attempt: Option<u64>,
    },
    /// Terminal: every attempt failed; the job is `EXHAUSTED`.
    Exhausted {
        /// The number of the job's last attempt (how many attempts it made), when this worker
        /// knows it: it ran that attempt, or wrote `EXHAUSTED` after it, or saw it live as the
        /// last one its `max_attempts` allows (or found the count above that maximum: the job
        /// is exhausted for this worker). `None` when the job was exhausted before this worker
        /// could tell by which attempt: the store keeps `EXHAUSTED` in place of the count,
        /// whatever `max_attempts` the workers that exhausted it had. Its last failure note
        /// ([`JobStatus::last_failure`](crate::JobStatus::last_failure), "attempt N by NAME:
        /// reason") names the last attempt that recorded a failure; one whose holder died
        /// records none. Serialized as `null` then.
        attempts: Option<u64>,
    },
    /// Terminal: this worker's attempt failed and it left the job to the backups.
    Failed {
        /// The attempt.
        attempt: u64,
        /// The reason given to `fail()` (or why the worker failed it).
        reason: String,
    },
    /// Terminal: this worker lost its attempt (taken over, lease expired, `max_hold`, or its
    /// outcome could not be recorded). It comes without an `Acquired` before it when the
    /// process was paused between winning an attempt and handing it over for longer than the
    /// lease: a grant that may already belong to a backup is never handed out.
    LeaseLost {
        /// The attempt.
        attempt: u64,
        /// Why.
        reason: String,
    },
    /// Terminal: the worker was stopped (`stop()` or `Client::shutdown`).
    Stopped,
}

impl Event {
    /// The event's name, as in its JSON `event` field (`"Acquired"`, `"Locked"`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Event::Acquired(_) => "Acquired",
            Event::Locked { .. } => "Locked",
            Event::Status { .. } => "Status",
            Event::Error { .. } => "Error",
            Event::DeadlinePassed { .. } => "DeadlinePassed",
            Event::Reachable { .. } => "Reachable",
            Event::Rejoined { .. } => "Rejoined",
            Event::Lagged { .. } => "Lagged",
            Event::Completed { .. } => "Completed",
            Event::Exhausted { .. } => "Exhausted",
            Event::Failed { .. } => "Failed",
            Event::LeaseLost { .. } => "LeaseLost",
            Event::Stopped => "Stopped",
        }
    }

    /// Whether this event ends the stream.
    pub fn is_terminal(&self) -> bool {
        match self {
            Event::Completed { .. }
            | Event::Exhausted { .. }
            | Event::Failed { .. }
            | Event::LeaseLost { .. }
            | Event::Stopped => true,
            Event::Error { retryable, .. } => !retryable,
            _ => false,
        }
    }

    /// Whether the event may be dropped when nobody reads.
    fn droppable(&self) -> bool {
        matches!(self, Event::Status { .. } | Event::Locked { .. })
    }

    pub(crate) fn from_error(err: &Error) -> Event {
        Event::Error {
            kind: err.kind(),
            message: err.to_string(),
            retryable: err.is_retryable(),
        }
    }
}

/// An attempt this worker won.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Acquired {
    /// The attempt number, 1 ..= `max_attempts`.
    pub attempt: u64,
    /// Whether this is the last attempt allowed.
    pub last: bool,
    /// The fencing token: pass it to the resource you write so it can reject a stale holder.
    /// Strictly greater than every token granted before on this job.
    pub fencing_token: u64,
    /// The lease time left (ms) when the event was emitted, measured to the grant's deadline
    /// (the send time of the grant's `EXEC` + `lease` − max(1 %, 2 ms)). The deadline
    /// itself, which moves with the watchdog, is [`HeldLease::lease_deadline`].
    pub lease_remaining_ms: u64,
    /// The handle that ends the attempt.
    #[serde(skip)]
    pub handle: AttemptHandle,
    /// The grant's deadline (see [`Acquired::grant_deadline`]).
    #[serde(skip)]
    pub(crate) granted_deadline: tokio::time::Instant,
}

/// The attempt's held lease, read through its handle (see [`AttemptHandle`]).
impl sealed::Sealed for Acquired {
    fn core(&self) -> &LeaseCore {
        &self.handle.inner.core
    }
}

impl HeldLease for Acquired {}

impl Fenced for Acquired {}

impl Acquired {
    /// When the lease ends at the earliest as the worker computed it from the send time of the
    /// grant's `EXEC` (`sent + lease − max(1 %, 2 ms)`): it errs early, never late, does
    /// not depend on when this event is read, and never moves. With the watchdog, confirmed
    /// extensions move the real end further on: [`HeldLease::lease_deadline`] is that one.
    pub fn grant_deadline(&self) -> tokio::time::Instant {
        self.granted_deadline
    }

    /// Records success: the job becomes `DONE`. See [`AttemptHandle::done`].
    ///
    /// # Errors
    /// As [`AttemptHandle::done`].
    pub async fn done(self) -> Result<(), Error> {
        self.handle.done().await
    }

    /// Gives the attempt up so a backup takes over at once. See [`AttemptHandle::fail`].
    ///
    /// # Errors
    /// As [`AttemptHandle::fail`].
    pub async fn fail(self, reason: impl Into<String>) -> Result<(), Error> {
        self.handle.fail(reason).await
    }
}

pub(crate) enum HolderCmd {
    /// The exit for the record, and the occurrence's outcome the end settles
    /// ([`AttemptHandle::done_settled`]).
    Done(
        Option<Exit>,
        Option<crate::util::schedule_record::RecordedOutcome>,
        oneshot::Sender<Result<(), Error>>,
    ),
    Fail(String, Option<Exit>, oneshot::Sender<Result<(), Error>>),
}

/// Ends one attempt. Clones share one slot: the first `done()`/`fail()` wins, later calls get
/// [`Error::AttemptEnded`]. Dropping every clone without either call fails the attempt (the
/// worker task notices; `Drop` never blocks).
///
/// Cloning an [`Event::Acquired`] clones this handle: an event kept around (in a log, say) keeps
/// the attempt from being failed on drop. Keep the serialized event instead.
///
/// A held lease like the others for reading ([`HeldLease`], [`Fenced`]): the key is the job's;
/// the fencing token is the attempt's; [`HeldLease::lease_deadline`] is when the lease ends at
/// the earliest as of the last extension the store confirmed, on this process's monotonic
/// clock (the send time of the granting or last confirmed extending request + `lease`
/// − max(1 %, 2 ms)): it moves on with every confirmed watchdog extension, never without the
/// watchdog, and keeps its last value once the attempt ended. It errs early, never late:
/// until this instant no backup can hold the next attempt. A supervisor that must stop the
/// work before the lease can pass on (a process outside this one, say) reads it each time it
/// changes. The loss signal ([`HeldLease::lost_token`]) fires as soon as this worker no
/// longer holds the attempt: the lease was lost (taken over, not extended in time,
/// `max_hold`), the worker was stopped, or the attempt ended. Hand the token to the work
/// (`token.run_until_cancelled(work)`) to stop it on loss without reading the event stream;
/// [`AttemptHandle::lost_error`] says why as an error.
#[derive(Clone)]
pub struct AttemptHandle {
    inner: Arc<HandleInner>,
}

struct HandleInner {
    key: String,
    attempt: u64,
    tx: Mutex<Option<crate::util::mailbox::Sender<HolderCmd>>>,
    /// PROGRAM's exit, for the attempt's end in the schedule's record
    /// ([`AttemptHandle::set_exit`]).
    exit: Mutex<Option<Exit>>,
    /// Why the attempt ended on the worker's side (set before the task lets go of the receiver).
    ended: Arc<Mutex<Option<Error>>>,
    /// What [`HeldLease`] reads: the job's key, the attempt's fencing token, the deadline the
    /// holder moves on with every extension the store acknowledged, and the loss signal the
    /// holder fires once it no longer holds the attempt for the user's code.
    core: LeaseCore,
}

impl std::fmt::Debug for AttemptHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttemptHandle")
            .field("key", &self.inner.key)
            .field("attempt", &self.inner.attempt)
            .finish()
    }
}

impl AttemptHandle {
    pub(crate) fn new(
        key: String,
        attempt: u64,
        tx: crate::util::mailbox::Sender<HolderCmd>,
        ended: Arc<Mutex<Option<Error>>>,
        core: LeaseCore,
    ) -> Self {
        AttemptHandle {
            inner: Arc::new(HandleInner {
                key,
                attempt,
                tx: Mutex::new(Some(tx)),
                exit: Mutex::new(None),
                ended,
                core,
            }),
        }
    }

    /// The loss signal as a token: renamed [`HeldLease::lost_token`].
    #[deprecated(note = "use `HeldLease::lost_token` (`use baton::prelude::*`)")]
    pub fn cancellation(&self) -> CancellationToken {
        self.lost_token()
    }

    /// Resolves once this worker no longer holds the attempt (see [`HeldLease::lost`]), with
    /// why: [`Error::LeaseLost`] when it was lost or the worker stopped, the error that ended it
    /// otherwise.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub async fn lost_error(&self) -> Error {
        self.inner.core.loss().wait().await;
        self.ended_reason()
    }

    /// The attempt number.
    pub fn attempt(&self) -> u64 {
        self.inner.attempt
    }

    /// Sets the exit status (or signal) of what the attempt ran, recorded with the attempt's
    /// end in its schedule's record when the job is an occurrence of a schedule
    /// ([`FailoverConfig::for_occurrence`](crate::FailoverConfig::for_occurrence)). Call it
    /// before [`AttemptHandle::done`] / [`AttemptHandle::fail`]; the last value set wins.
    pub fn set_exit(&self, exit: Exit) {
        *lock(&self.inner.exit) = Some(exit);
    }

    fn exit(&self) -> Option<Exit> {
        *lock(&self.inner.exit)
    }

    /// Records success: `DONE` is stored (with the retention TTL), the lease deleted and backups
    /// woken so they end `Completed`.
    ///
    /// A late `done()` (the lease ran out) still succeeds if no backup took over yet.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] when another worker took over or the job was marked exhausted
    /// (nothing is written); [`Error::AttemptEnded`] if the attempt was already ended through a
    /// clone; other errors when Redis stayed unreachable (the outcome was not recorded: the
    /// lease will expire and a backup will run the job again).
    ///
    /// # Cancel safety
    /// Once called, the worker task carries the request out even if this future is dropped.
    pub async fn done(self) -> Result<(), Error> {
        let exit = self.exit();
        self.end(|reply| HolderCmd::Done(exit, None, reply)).await
    }

    /// Completes the job (`DONE`, as [`AttemptHandle::done`]: backups end, none runs it)
    /// without the work having run, and records the occurrence as `outcome` in its
    /// schedule's record: what a holder of an occurrence buffered behind a running one does
    /// when its window closes before that one ends (overlap `buffer-one`: `outcome` is
    /// [`RecordedOutcome::SkippedOverlap`](crate::RecordedOutcome::SkippedOverlap)). The
    /// outcome travels with the attempt's end write, so it holds whichever of the worker's
    /// record writes lands first; it never overwrites a terminal outcome. On a job that is no
    /// occurrence it is [`AttemptHandle::done`].
    ///
    /// # Errors
    /// As [`AttemptHandle::done`].
    ///
    /// # Cancel safety
    /// As [`AttemptHandle::done`].
    pub async fn done_settled(
        self,
        outcome: crate::util::schedule_record::RecordedOutcome,
    ) -> Result<(), Error> {
        self.end(|reply| HolderCmd::Done(None, Some(outcome), reply))
            .await
    }

    /// Gives the attempt up: the lease is deleted and backups are woken so one takes over at
    /// once (or, on the last attempt, the job is marked `EXHAUSTED`). The reason is stored for
    /// operators in the job's `:failure` key.
    ///
    /// # Errors
    /// As [`AttemptHandle::done`].
    ///
    /// # Cancel safety
    /// As [`AttemptHandle::done`].
    pub async fn fail(self, reason: impl Into<String>) -> Result<(), Error> {
        let reason = reason.into();
        let exit = self.exit();
        self.end(|reply| HolderCmd::Fail(reason, exit, reply)).await
    }

    async fn end(
        self,
        make: impl FnOnce(oneshot::Sender<Result<(), Error>>) -> HolderCmd,
    ) -> Result<(), Error> {
        let tx = lock(&self.inner.tx).take();
        let Some(tx) = tx else {
            return Err(Error::AttemptEnded {
                key: self.inner.key.clone(),
                attempt: self.inner.attempt,
            });
        };
        let (reply_tx, reply_rx) = oneshot::channel();
        if tx.send(make(reply_tx)).is_err() {
            return Err(self.ended_reason());
        }
        drop(tx);
        reply_rx.await.unwrap_or_else(|_| Err(self.ended_reason()))
    }

    fn ended_reason(&self) -> Error {
        lock(&self.inner.ended)
            .clone()
            .unwrap_or_else(|| Error::LeaseLost {
                key: self.inner.key.clone(),
                attempt: self.inner.attempt,
                fencing_token: None,
                reason: "the worker stopped".into(),
            })
    }
}

impl sealed::Sealed for AttemptHandle {
    fn core(&self) -> &LeaseCore {
        &self.inner.core
    }
}

impl HeldLease for AttemptHandle {}

impl Fenced for AttemptHandle {}

/// The worker task's end of the event stream.
pub(crate) struct EventSender {
    tx: crate::util::mailbox::Sender<Event>,
    capacity: usize,
    lagged: u64,
    level: StatusLevel,
}

impl EventSender {
    /// Queues an event. Returns false when the receiver is gone.
    pub(crate) fn emit(&mut self, event: Event) -> bool {
        // The queue's own length: no separate counter to keep per worker.
        if event.droppable() && self.tx.len() >= self.capacity {
            self.lagged += 1;
            return !self.tx.is_closed();
        }
        if self.lagged > 0 {
            let dropped = std::mem::take(&mut self.lagged);
            self.push(Event::Lagged { dropped });
        }
        self.push(event)
    }

    fn push(&mut self, event: Event) -> bool {
        self.tx.send(event).is_ok()
    }

    /// Queues a `Status` event if `level` passes the configured filter.
    pub(crate) fn status(&mut self, level: StatusLevel, message: impl Into<String>) {
        if level <= self.level {
            self.emit(Event::Status {
                level,
                message: message.into(),
            });
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves when the receiver is dropped.
    pub(crate) async fn closed(&self) {
        self.tx.closed().await
    }
}

/// A running worker: a [`Stream`](tokio_stream::Stream) of [`Event`]s for one job.
///
/// Dropping it stops the worker (an attempt it holds is failed so a backup takes over).
#[derive(Debug)]
#[must_use = "a worker stops (and fails an attempt it holds) when its event stream is dropped"]
pub struct Worker {
    rx: crate::util::mailbox::Receiver<Event>,
    stop: CancellationToken,
    key: Arc<str>,
}

/// A worker that reports `err` as its only (terminal) event: for a job it cannot run at all.
pub(crate) fn refused(config: super::FailoverConfig, err: Error) -> Worker {
    let (mut events, worker) = Worker::channel(
        config.key.as_str().into(),
        config.event_capacity,
        config.status_level,
        CancellationToken::new(),
    );
    events.emit(Event::from_error(&err));
    worker
}

impl Worker {
    pub(crate) fn channel(
        key: Arc<str>,
        capacity: usize,
        level: StatusLevel,
        stop: CancellationToken,
    ) -> (EventSender, Worker) {
        let (tx, rx) = crate::util::mailbox::unbounded();
        (
            EventSender {
                tx,
                capacity,
                lagged: 0,
                level,
            },
            Worker { rx, stop, key },
        )
    }

    /// The job name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Asks the worker to stop: timers are cancelled, subscriptions closed, and an attempt it
    /// holds is released (backups are told at once). The stream then yields `Stopped` and ends.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// The next event, or `None` once the terminal event was read.
    ///
    /// # Cancel safety
    /// Cancel safe: no event is lost if the future is dropped.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.rx.recv().await
    }
}

impl Drop for Worker {
    /// Stops the task: a waiting backup then needs only its `stop` signal to notice that nobody
    /// reads its events any more. A holder still releases its attempt, saying the receiver was
    /// dropped.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl tokio_stream::Stream for Worker {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chatter_is_dropped_with_a_lag_count_but_terminal_events_are_not() {
        let (mut tx, mut w) = Worker::channel(
            "k".into(),
            2,
            StatusLevel::Verbose,
            CancellationToken::new(),
        );
        for i in 0..10 {
            tx.status(StatusLevel::Normal, format!("s{i}"));
        }
        assert!(tx.emit(Event::Completed { attempt: None }));
        let mut got = Vec::new();
        while let Some(ev) = w.rx.try_recv() {
            got.push(serde_json::to_value(&ev).unwrap());
        }
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[2]["event"], "Lagged");
        assert_eq!(got[2]["dropped"], 8);
        assert_eq!(got[3]["event"], "Completed");
    }

    #[test]
    fn status_filter() {
        let (mut tx, mut w) =
            Worker::channel("k".into(), 8, StatusLevel::Normal, CancellationToken::new());
        tx.status(StatusLevel::Verbose, "hidden");
        tx.status(StatusLevel::Normal, "shown");
        let ev = w.rx.try_recv().unwrap();
        assert!(matches!(ev, Event::Status { ref message, .. } if message == "shown"));
        assert!(w.rx.try_recv().is_none());
    }

    #[test]
    fn terminal_classification() {
        assert!(Event::Stopped.is_terminal());
        assert!(!Event::Lagged { dropped: 1 }.is_terminal());
        assert!(Event::Error {
            kind: ErrorKind::CorruptState,
            message: String::new(),
            retryable: false
        }
        .is_terminal());
        assert!(!Event::Error {
            kind: ErrorKind::Timeout,
            message: String::new(),
            retryable: true
        }
        .is_terminal());
    }

    #[tokio::test]
    async fn handle_is_single_use_across_clones() {
        let (tx, mut rx) = crate::util::mailbox::unbounded();
        let h = AttemptHandle::new(
            "k".into(),
            1,
            tx,
            Arc::new(Mutex::new(None)),
            LeaseCore::new(
                "k",
                Some(1),
                crate::lease::guard::deadline_cell(tokio::time::Instant::now()),
                crate::lease::guard::LossSignal::new(),
            ),
        );
        let h2 = h.clone();
        let task = tokio::spawn(async move {
            if let Some(HolderCmd::Done(_, _, reply)) = rx.recv().await {
                let _ = reply.send(Ok(()));
            }
        });
        h.done().await.unwrap();
        assert!(matches!(h2.done().await, Err(Error::AttemptEnded { .. })));
        task.await.unwrap();
    }
}
