//! The worker task: the I/O around the pure decisions of [`protocol`](super::protocol).
//!
//! One task per (worker, job). As a backup it loops *observe → decide → act* until it wins an
//! attempt or the job ends; as a holder it waits for `done()`/`fail()` while keeping the lease
//! (keepalive) or watching the deadline (no keepalive). Every wait is a `select!` that also
//! listens for `stop()` and for the event receiver being dropped, so the task never outlives the
//! people interested in it.
//!
//! Transitions themselves are *not* raced against `stop()`: dropping a transition between its
//! `EXEC` and the reply would leave a grant nobody knows about. Each transition is bounded by the
//! response timeout instead, so `stop()` takes effect within about a second.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::{FailoverConfig, StatusLevel};
use super::events::{Acquired, AttemptHandle, Event, EventSender, HolderCmd, Worker};
use super::keys::JobKeys;
use super::protocol::{
    decide_backup, decide_holder, exhaust_writes, finish_gave_up, finish_writes, grant_writes,
    keep_waiting, later_grant, taken_over, Decision, Fault, GaveUp, HolderDecision, HolderOp,
    Lease, Observation, PendingGrant, State, Which,
};
use super::store::{Extended, Held, JobStore, RedisStore};
use crate::backend::redis::{HubMsg, ReplicaWait, Subscription, Transport};
use crate::error::Error;
use crate::lease;
use crate::util::backoff::Backoff;
use crate::util::lock;
use crate::util::time::{after, ms, FAR};
use crate::util::token as keys;

/// Starts a worker task for one job on Redis.
pub(crate) fn spawn(transport: Arc<Transport>, cfg: FailoverConfig) -> Worker {
    let keys = Arc::new(JobKeys::new(&cfg.prefix, &cfg.key));
    let store = RedisStore {
        transport: transport.clone(),
        keys: keys.clone(),
        name: worker_name(&cfg),
        lock_timeout: cfg.lock_timeout,
        retention: cfg.retention,
    };
    spawn_on(store, keys, &transport.cancel, &transport.tracker, cfg)
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
    job_keys: Arc<JobKeys>,
    cancel: &CancellationToken,
    tracker: &TaskTracker,
    cfg: FailoverConfig,
) -> Worker {
    let settings = store.settings().clone();
    let stop = cancel.child_token();
    let (events, worker) = Worker::channel(
        cfg.key.clone(),
        cfg.event_capacity,
        cfg.status_level,
        stop.clone(),
    );
    let mut task = Task {
        keys: job_keys,
        name: worker_name(&cfg),
        backoff: Backoff::new(settings.max_backoff),
        view: super::protocol::BackupView {
            max_attempts: cfg.max_attempts,
            has_retry_delay: !cfg.retry_delay.is_zero(),
            ..Default::default()
        },
        store: Arc::new(store),
        cfg,
        events,
        stop,
        locked_reported: None,
        sub: None,
    };
    // A request may take up to `response_timeout`; a lease shorter than three of them leaves a
    // holder too little time to extend, or to learn in time that it cannot. Allowed (tests and
    // fast networks want short leases), but said.
    if settings.response_timeout > task.cfg.lock_timeout / 3 {
        let message = format!(
            "response_timeout ({:?}) is more than a third of lock_timeout ({:?}): one slow \
             request can use up most of the lease",
            settings.response_timeout, task.cfg.lock_timeout
        );
        tracing::warn!(key = %task.cfg.key, "{message}");
        task.events.status(StatusLevel::Normal, message);
    }
    tracker.spawn(task.run());
    worker
}

/// A won attempt.
struct Grant {
    attempt: u64,
    last: bool,
    fence: u64,
    token: String,
    /// When the grant's `EXEC` was sent: the lease cannot end before `sent + lock_timeout` on
    /// the server, so measuring from the send time on our clock errs early, never late.
    sent: Instant,
    /// Set when fewer replicas than [`FailoverConfig::replica_ack`] asks for acknowledged the
    /// grant: it is released, never handed out.
    unconfirmed: Option<Error>,
}

enum Step {
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

#[derive(PartialEq, Eq)]
enum Flow {
    Continue,
    End,
}

/// How a holder ends its attempt, with the reason kept for `status`.
#[derive(Clone)]
enum Ending {
    Done,
    Fail(String),
    /// Stopped, dropped handle, dropped receiver, `max_run`: like a failure, but announced as
    /// `released` and never written as `EXHAUSTED` by the holder itself.
    Release(String),
}

impl Ending {
    fn kind(&self) -> super::protocol::Ending {
        use super::protocol::Ending as E;
        match self {
            Ending::Done => E::Done,
            Ending::Fail(_) => E::Fail,
            Ending::Release(_) => E::Release,
        }
    }

    fn reason(&self) -> &str {
        match self {
            Ending::Done => "",
            Ending::Fail(r) | Ending::Release(r) => r,
        }
    }
}

struct Task<S: JobStore> {
    store: Arc<S>,
    cfg: FailoverConfig,
    keys: Arc<JobKeys>,
    name: std::sync::Arc<str>,
    events: EventSender,
    stop: CancellationToken,
    view: super::protocol::BackupView,
    backoff: Backoff,
    locked_reported: Option<u64>,
    sub: Option<Subscription>,
}

impl<S: JobStore> Task<S> {
    /// Runs the test hook (feature `testing`) between the two round trips of a transition.
    async fn before_exec(&self, what: &'static str) {
        self.store.before_exec(what).await;
    }

    /// The task's future, inside its tracing span. A plain function around an `async fn` that
    /// owns the task: an `async fn run` that builds the span and awaits the loop kept room for
    /// the span's temporaries and a second copy of the loop's state, twice the size per worker.
    fn run(self) -> tracing::instrument::Instrumented<impl std::future::Future<Output = ()>> {
        let span = tracing::info_span!("baton_worker", key = %self.cfg.key);
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
            let checkout = Box::pin(self.checkout());
            let step = match checkout.await {
                Ok(conn) => {
                    let transition = Box::pin(self.transition(conn));
                    transition.await
                }
                Err(e) => Err(e),
            };
            match step {
                Ok(Step::Granted(g)) => {
                    nil_in_a_row = 0;
                    self.backoff.reset();
                    let next = Box::pin(self.hold(g));
                    if next.await == Flow::End {
                        return;
                    }
                }
                Ok(Step::Terminal(ev)) => {
                    self.events.emit(ev);
                    return;
                }
                Ok(Step::Wait { attempt, pttl_ms }) => {
                    nil_in_a_row = 0;
                    self.backoff.reset();
                    let next = Box::pin(self.wait(attempt, pttl_ms));
                    if next.await == Flow::End {
                        return;
                    }
                }
                Ok(Step::Delay { attempt }) => {
                    self.events.status(
                        StatusLevel::Normal,
                        format!(
                            "attempt {attempt} failed; waiting retry_delay {:?} before taking over",
                            self.cfg.retry_delay
                        ),
                    );
                    let next = Box::pin(self.sleep(self.cfg.retry_delay));
                    if next.await == Flow::End {
                        return;
                    }
                    self.view.delay_served(attempt);
                }
                Ok(Step::Again) => {
                    // Contention is normal (K backups racing for one attempt); if it persists,
                    // spread the racers out a little so someone wins quickly.
                    nil_in_a_row += 1;
                    if nil_in_a_row > 2 {
                        let jitter = Duration::from_micros(keys::random_u64() % 5_000);
                        let next = Box::pin(self.sleep(jitter));
                        if next.await == Flow::End {
                            return;
                        }
                    }
                }
                Err(e) => {
                    if self.report(&e) == Flow::End {
                        return;
                    }
                    let delay = self.backoff.next_delay();
                    let next = Box::pin(self.sleep(delay));
                    if next.await == Flow::End {
                        return;
                    }
                }
            }
        }
    }

    /// Emits an `Error` event; returns `End` for errors that end the stream.
    fn report(&mut self, e: &Error) -> Flow {
        if e.is_retryable() {
            tracing::debug!(error = %e, "retryable error");
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
    async fn sleep(&mut self, d: Duration) -> Flow {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => {
                self.events.emit(Event::Stopped);
                Flow::End
            }
            _ = self.events.closed() => Flow::End,
            _ = tokio::time::sleep(d) => Flow::Continue,
        }
    }

    async fn observe(&self, conn: &mut S::Conn) -> Result<Observation, Error> {
        self.store.observe(conn).await
    }

    /// A dedicated connection for the next transition. Waiting for one is a future of its own,
    /// kept small: when thousands of backups queue for the pool at once (all started together,
    /// or woken by one failure), each waits with this, not with a whole transition's state.
    async fn checkout(&self) -> Result<S::Conn, Error> {
        // A backup loses nothing by waiting for a connection, but not forever: a starved pool
        // is reported and retried.
        let wait = self
            .cfg
            .lock_timeout
            .max(self.store.settings().response_timeout * 5);
        self.store.checkout(after(Instant::now(), wait)).await
    }

    /// One backup transition: observe under WATCH, decide, act.
    async fn transition(&mut self, mut conn: S::Conn) -> Result<Step, Error> {
        let obs = self.observe(&mut conn).await?;
        let decision = decide_backup(&obs, &self.view);
        self.events.status(
            StatusLevel::Verbose,
            format!(
                "observed {}, lease {}; decided {decision:?}",
                obs.state.describe(),
                match &obs.lease {
                    Lease::Held { pttl_ms, .. } => format!("held ({pttl_ms:?} ms left)"),
                    Lease::Absent => "gone".into(),
                    _ => "unreadable".into(),
                }
            ),
        );
        self.view.observed(&obs, &decision);
        match decision {
            Decision::Grant {
                attempt,
                last,
                fence,
            } => Box::pin(self.grant(conn, attempt, last, fence)).await,
            Decision::Resume {
                attempt,
                last,
                fence,
                token,
            } => {
                S::abandon(&mut conn);
                self.view.resumed(fence);
                let pttl = match obs.lease {
                    Lease::Held { pttl_ms, .. } => pttl_ms.unwrap_or(0),
                    _ => 0,
                };
                // We do not know when the lost EXEC was applied; the remaining PTTL tells how
                // long the lease still runs, so date the grant back accordingly.
                let remaining = Duration::from_millis(pttl).min(self.cfg.lock_timeout);
                let sent = Instant::now()
                    .checked_sub(self.cfg.lock_timeout - remaining)
                    .unwrap_or_else(Instant::now);
                self.events.status(
                    StatusLevel::Normal,
                    format!("the grant of attempt {attempt} whose reply was lost did apply"),
                );
                Ok(Step::Granted(Grant {
                    attempt,
                    last,
                    fence,
                    token,
                    sent,
                    // A grant found applied after a lost reply had no acknowledgement; with
                    // acknowledgement required, it is released like an unconfirmed one.
                    unconfirmed: self.cfg.replica_ack.map(|w| Error::NotReplicated {
                        what: format!("the grant of attempt {attempt} (its reply was lost)"),
                        key: self.cfg.key.clone(),
                        acked: 0,
                        wanted: w.replicas,
                        timeout: w.timeout,
                    }),
                }))
            }
            Decision::Completed => {
                S::abandon(&mut conn);
                Ok(Step::Terminal(Event::Completed { attempt: None }))
            }
            Decision::Exhausted { attempts } => {
                S::abandon(&mut conn);
                Ok(Step::Terminal(Event::Exhausted { attempts }))
            }
            Decision::WriteExhausted { attempts } => {
                self.before_exec("exhaust").await;
                let writes = exhaust_writes();
                let committed =
                    self.store
                        .commit(&mut conn, &writes, "", "", None, "writing EXHAUSTED");
                match committed.await? {
                    None => Ok(Step::Again),
                    Some(_) => {
                        tracing::info!(attempts, "job exhausted");
                        Ok(Step::Terminal(Event::Exhausted { attempts }))
                    }
                }
            }
            Decision::Wait { attempt, pttl_ms } => {
                S::abandon(&mut conn);
                Ok(Step::Wait { attempt, pttl_ms })
            }
            Decision::Delay { attempt } => {
                S::abandon(&mut conn);
                Ok(Step::Delay { attempt })
            }
            Decision::Fault(f) => {
                S::abandon(&mut conn);
                Err(fault_error(&*self.store, f))
            }
        }
    }

    async fn grant(
        &mut self,
        mut conn: S::Conn,
        attempt: u64,
        last: bool,
        fence: u64,
    ) -> Result<Step, Error> {
        let token = keys::new_token();
        let writes = grant_writes(attempt, fence);
        self.before_exec("grant").await;
        let sent = Instant::now();
        let wait = self.cfg.replica_ack;
        let committed = self
            .store
            .commit(&mut conn, &writes, &token, "", wait, "the grant")
            .await;
        match committed {
            Err(e) => {
                if e.is_indeterminate() {
                    // The EXEC may have been applied: remember the token, and recognise the lease
                    // as ours on the next observation.
                    self.view.remember_pending(PendingGrant {
                        attempt,
                        token,
                        fence,
                    });
                }
                Err(e)
            }
            Ok(None) => Ok(Step::Again),
            Ok(Some(acked)) => {
                self.view.granted(attempt, fence);
                tracing::info!(attempt, fence, token = keys::short(&token), "acquired");
                Ok(Step::Granted(Grant {
                    attempt,
                    last,
                    fence,
                    token,
                    sent,
                    unconfirmed: self.short_of_replicas(wait, acked, || {
                        format!("the grant of attempt {attempt}")
                    }),
                }))
            }
        }
    }

    /// The error for a write fewer replicas than `wait` asks for acknowledged (`None` when
    /// enough did, or none were asked for).
    fn short_of_replicas(
        &self,
        wait: Option<ReplicaWait>,
        acked: Option<u64>,
        what: impl FnOnce() -> String,
    ) -> Option<Error> {
        let w = wait?;
        let acked = acked.unwrap_or(0);
        (acked < u64::from(w.replicas)).then(|| Error::NotReplicated {
            what: what(),
            key: self.cfg.key.clone(),
            acked,
            wanted: w.replicas,
            timeout: w.timeout,
        })
    }

    /// Waits as a backup until the lease can have ended or a message says something changed.
    async fn wait(&mut self, attempt: u64, mut pttl_ms: Option<u64>) -> Flow {
        if self.locked_reported != Some(attempt) {
            self.locked_reported = Some(attempt);
            tracing::debug!(attempt, "locked by another worker");
            self.events.emit(Event::Locked {
                attempt,
                max_attempts: self.cfg.max_attempts,
                lease_remaining_ms: pttl_ms,
            });
        }
        let mut resubscribe_in = None;
        if self.sub.is_none() {
            // Boxed sub-futures (here and below) are allocated only while they run: a backup
            // that sleeps keeps a small future, which matters with thousands of them.
            let store = self.store.clone();
            match Box::pin(async move { store.subscribe().await }).await {
                Ok(sub) => {
                    self.sub = Some(sub);
                    // Observe once more now that the subscription is confirmed: a `failed` or
                    // `done` published between our read and the confirmation was not delivered
                    // to us and would otherwise cost a whole lease time.
                    let read = Box::pin(self.store.quick_read());
                    match read.await {
                        Ok((State::Attempt(n), Some(p))) if n == attempt => pttl_ms = p,
                        Ok(_) => return Flow::Continue,
                        Err(e) => {
                            if self.report(&e) == Flow::End {
                                return Flow::End;
                            }
                            resubscribe_in = Some(self.backoff.next_delay());
                        }
                    }
                }
                // Without pub/sub we would still wake when the lease runs out (slower, never
                // wrong), but Redis is probably restarting: look again after a backoff, which
                // also retries the subscription.
                Err(e) => {
                    if self.report(&e) == Flow::End {
                        return Flow::End;
                    }
                    resubscribe_in = Some(self.backoff.next_delay());
                }
            }
        }
        loop {
            let mut sleep_for = match pttl_ms {
                Some(p) => Duration::from_millis(p.max(1)),
                None => {
                    let e = Error::NoExpiry {
                        key: self.keys.lease().to_string(),
                    };
                    self.report(&e);
                    self.cfg.lock_timeout
                }
            };
            if let Some(d) = resubscribe_in {
                sleep_for = sleep_for.min(d);
            }
            let sub = self.sub.as_mut();
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => {
                    self.events.emit(Event::Stopped);
                    return Flow::End;
                }
                _ = self.events.closed() => return Flow::End,
                msg = recv_sub(sub) => {
                    if msg.is_none() {
                        // The hub went away (client shutting down): fall back to timers.
                        self.sub = None;
                    }
                    // Something happened to the job (failed, released, done, …): decide at once
                    // under WATCH.
                    return Flow::Continue;
                }
                _ = tokio::time::sleep(sleep_for) => {}
            }
            if pttl_ms.is_none() || resubscribe_in.is_some() {
                return Flow::Continue;
            }
            // The lease's time ran out on our clock. Usually a kept-alive holder extended it
            // meanwhile: one plain read (GET + PTTL, one round trip on the shared connection)
            // tells, and the backup goes back to sleep for the new PTTL. Only a lease that is
            // gone, or a state that moved, needs the full WATCH transition (and a dedicated
            // connection). So a waiting backup costs one small read per lease period.
            let read = Box::pin(self.store.quick_read());
            match read
                .await
                .map(|(state, lease)| keep_waiting(&state, lease, attempt))
            {
                Ok(Some(p)) => pttl_ms = Some(p),
                // Changed, gone, or unreadable: the transition decides and reports.
                _ => return Flow::Continue,
            }
        }
    }

    /// Holds an attempt until it ends. Returns `Continue` only when the worker rejoins as a
    /// backup after its own failure.
    ///
    /// Loss detection never waits on a request: with keepalive, the lease deadline (the send
    /// time of the last confirmed extension + `lock_timeout` − max(1 %, 2 ms)) is a timer of its
    /// own in the `select!`, armed whatever an extension in flight is doing (a hung reply, a
    /// starved pool, a paused Redis). Extensions run as a separate future for that reason.
    async fn hold(&mut self, g: Grant) -> Flow {
        let (cmd_tx, mut cmd_rx) = crate::util::mailbox::unbounded();
        let ended = Arc::new(Mutex::new(None));
        let released = CancellationToken::new();
        // Whatever way this function returns, the attempt is no longer held by the user's code:
        // the handle's `lost()`/`cancellation()` fire.
        let _released_on_return = released.clone().drop_guard();
        let lock_timeout = self.cfg.lock_timeout;
        let deadline_at = lease::deadline(g.sent, lock_timeout);
        // A process pause (SIGSTOP, a swapped-out or overloaded host) between the grant's EXEC
        // and this point may have outlived the lease, and a backup may hold the next attempt by
        // now: never hand out such a grant (found by the chaos harness's holder pauses).
        if Instant::now() >= deadline_at {
            let waited = g.sent.elapsed();
            return self.lost(
                &ended,
                &g,
                format!(
                    "the lease ran out before the grant could be handed over ({waited:?} after \
                     its EXEC was sent, lock_timeout {lock_timeout:?})"
                ),
            );
        }
        if let Some(e) = g.unconfirmed.clone() {
            return self.give_back(&g, e, deadline_at).await;
        }
        let handle = AttemptHandle::new(
            self.cfg.key.clone(),
            g.attempt,
            cmd_tx,
            ended.clone(),
            released.clone(),
        );
        let delivered = self.events.emit(Event::Acquired(Acquired {
            attempt: g.attempt,
            last: g.last,
            fencing_token: g.fence,
            lease_deadline: deadline_at,
            lease_remaining_ms: ms(deadline_at.saturating_duration_since(Instant::now())),
            handle,
        }));
        if !delivered {
            let _ = self
                .finish(
                    &g,
                    Ending::Release("the event receiver was dropped".into()),
                    deadline_at,
                )
                .await;
            return Flow::End;
        }
        let keepalive = self.cfg.keepalive;
        let max_run_at = self.cfg.max_run.map(|m| after(g.sent, m));
        let interval = self.cfg.keepalive_interval();
        let mut next_extend = after(g.sent, interval);
        // The lease deadline as this worker knows it: moved on by every confirmed extension.
        let mut lease_end = deadline_at;
        let mut deadline_reported = false;
        let far = after(Instant::now(), FAR);
        let mut extend_backoff = Backoff::new(lock_timeout / 6);
        let mut extending: Option<ExtensionFuture> = None;
        // The channel tells the holder at once when a backup takes over (its lease ran out, or
        // an operator released the attempt), so `LeaseLost` is reported, and the work stopped,
        // right away rather than at the next extension or at `done()`. The subscription is made
        // alongside the work, not before it: a short job's `done()` need not wait for it.
        let mut subscribing = if self.sub.is_none() {
            let store = self.store.clone();
            Some(Box::pin(async move { store.subscribe().await }))
        } else {
            None
        };
        loop {
            let watch_sub = self.sub.as_mut();
            let ending = tokio::select! {
                biased;
                // A `done()` or `fail()` already queued is served first, `stop()` included:
                // finished work must be recorded, not released for a backup to run again.
                cmd = cmd_rx.recv() => match cmd {
                    Some(HolderCmd::Done(reply)) => (Ending::Done, Some(reply)),
                    Some(HolderCmd::Fail(reason, reply)) => (Ending::Fail(reason), Some(reply)),
                    None => (Ending::Fail("the attempt handle was dropped without done() or fail()".into()), None),
                },
                _ = self.stop.cancelled() => {
                    drop(extending.take());
                    let _ = self.finish(&g, Ending::Release("the worker was stopped".into()), lease_end).await;
                    self.set_ended(&ended, &g, "the worker was stopped");
                    self.events.emit(Event::Stopped);
                    return Flow::End;
                }
                _ = self.events.closed() => {
                    drop(extending.take());
                    let _ = self.finish(&g, Ending::Release("the event receiver was dropped".into()), lease_end).await;
                    return Flow::End;
                }
                _ = tokio::time::sleep_until(max_run_at.unwrap_or(far)) => {
                    drop(extending.take());
                    let reason = format!("max_run of {:?} reached", self.cfg.max_run.unwrap_or_default());
                    self.events.emit(Event::DeadlinePassed { attempt: g.attempt });
                    let _ = self.finish(&g, Ending::Release(reason.clone()), lease_end).await;
                    return self.lost(&ended, &g, reason);
                }
                // Whatever an extension in flight is doing, the lease may be over by now.
                _ = tokio::time::sleep_until(lease_end), if keepalive => {
                    return self.lost(&ended, &g, format!(
                        "no extension was confirmed in time: the lease ({lock_timeout:?} from the \
                         last confirmed one) may have run out"
                    ));
                }
                r = poll_extension(&mut extending), if extending.is_some() => {
                    extending = None;
                    match r {
                        Ok(sent) => {
                            lease_end = lease::deadline(sent, lock_timeout);
                            next_extend = after(sent, interval);
                            extend_backoff.reset();
                            self.events.status(
                                StatusLevel::Verbose,
                                format!("extended the lease of attempt {}", g.attempt),
                            );
                        }
                        Err(Error::LeaseLost { reason, .. }) => return self.lost(&ended, &g, reason),
                        Err(e) if e.is_retryable() => {
                            self.report(&e);
                            next_extend = after(Instant::now(), extend_backoff.next_delay()).min(lease_end);
                        }
                        Err(e) => {
                            *lock(&ended) = Some(e.clone());
                            self.report(&e);
                            return Flow::End;
                        }
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(next_extend), if keepalive && extending.is_none() => {
                    extending = Some(Box::pin(self.extension(&g, lease_end)));
                    continue;
                }
                _ = tokio::time::sleep_until(deadline_at), if !keepalive && !deadline_reported => {
                    deadline_reported = true;
                    tracing::warn!(attempt = g.attempt, "deadline passed without done() or fail()");
                    self.events.emit(Event::DeadlinePassed { attempt: g.attempt });
                    continue;
                }
                subscribed = async { subscribing.as_mut()?.await.ok() }, if subscribing.is_some() => {
                    subscribing = None;
                    self.sub = subscribed;
                    continue;
                }
                msg = recv_sub(watch_sub) => {
                    match msg {
                        Some(HubMsg::Message(m)) if taken_over(&m, g.attempt) => {
                            return self.lost(&ended, &g, format!("another worker announced `{m}`"));
                        }
                        // Someone released an attempt while we hold ours (an operator's
                        // `fail_attempt`): check our lease now instead of at the next extension.
                        Some(HubMsg::Message(m)) if keepalive && (m == "failed" || m == "released") => {
                            next_extend = Instant::now();
                        }
                        // The pub/sub link was re-established: a takeover announced while it was
                        // down was missed, so look now. With keepalive the extension tells;
                        // without, one plain read does.
                        Some(HubMsg::Reconnected) if keepalive => next_extend = Instant::now(),
                        Some(HubMsg::Reconnected) => {
                            let check = Box::pin(self.still_ours(&g));
                            if let Err(reason) = check.await {
                                return self.lost(&ended, &g, reason);
                            }
                        }
                        None => self.sub = None,
                        _ => {}
                    }
                    continue;
                }
            };
            // An extension still in flight is abandoned: the ending's own transition decides.
            drop(extending.take());
            let (ending, reply) = ending;
            // A finish is bounded by the lease as last confirmed; without keepalive a late
            // finish still gets its one try (`finish` always tries once).
            let result = self.finish(&g, ending.clone(), lease_end).await;
            if let Err(e) = &result {
                *lock(&ended) = Some(e.clone());
            }
            if let Some(reply) = reply {
                let _ = reply.send(result.clone());
            }
            return match (result, ending) {
                (Ok(()), Ending::Done) => {
                    tracing::info!(attempt = g.attempt, "done");
                    self.events.emit(Event::Completed {
                        attempt: Some(g.attempt),
                    });
                    Flow::End
                }
                (Ok(()), Ending::Fail(reason) | Ending::Release(reason)) => {
                    tracing::info!(attempt = g.attempt, %reason, "attempt failed");
                    if g.attempt >= self.cfg.max_attempts {
                        self.events.emit(Event::Exhausted {
                            attempts: g.attempt,
                        });
                        Flow::End
                    } else if self.cfg.rejoin_after_fail {
                        self.events.status(
                            StatusLevel::Normal,
                            format!(
                                "attempt {} failed ({reason}); waiting as a backup again",
                                g.attempt
                            ),
                        );
                        // Give the backups woken by our `failed` a head start, so the worker
                        // that just failed does not usually win the next attempt itself.
                        let head_start = (self.cfg.lock_timeout / 10)
                            .clamp(Duration::from_millis(10), Duration::from_millis(500))
                            .max(self.cfg.retry_delay);
                        self.view.delay_served(g.attempt);
                        Box::pin(self.sleep(head_start)).await
                    } else {
                        self.events.emit(Event::Failed {
                            attempt: g.attempt,
                            reason,
                        });
                        Flow::End
                    }
                }
                (Err(e @ Error::NotReplicated { .. }), Ending::Done) => {
                    // `DONE` is on the primary: the job is done here, but not safely so.
                    self.report(&e);
                    tracing::warn!(attempt = g.attempt, error = %e, "done, not replicated");
                    self.events.emit(Event::Completed {
                        attempt: Some(g.attempt),
                    });
                    Flow::End
                }
                (Err(Error::LeaseLost { reason, .. }), _) => self.lost(&ended, &g, reason),
                (Err(e), _) if e.is_retryable() => self.lost(
                    &ended,
                    &g,
                    format!("the outcome could not be recorded: {e}"),
                ),
                (Err(e), _) => {
                    self.report(&e);
                    Flow::End
                }
            };
        }
    }

    /// Whether another worker has taken the attempt over, by one plain read (no keepalive:
    /// a lease that ran out with nobody else holding the job is still ours to finish).
    /// `Err(reason)` when it was taken over; a failed read proves nothing (`Ok`).
    async fn still_ours(&self, g: &Grant) -> Result<(), String> {
        let limit = after(Instant::now(), self.store.settings().response_timeout);
        let Ok(obs) = self.store.holder_read(limit).await else {
            return Ok(());
        };
        match decide_holder(&obs, g.attempt, &g.token, g.fence, HolderOp::Done, false) {
            HolderDecision::Lost(reason) => Err(reason),
            _ => Ok(()),
        }
    }

    fn set_ended(&self, ended: &Mutex<Option<Error>>, g: &Grant, reason: &str) {
        let mut slot = lock(ended);
        if slot.is_none() {
            *slot = Some(Error::LeaseLost {
                key: self.cfg.key.clone(),
                attempt: g.attempt,
                reason: reason.to_string(),
            });
        }
    }

    /// Reports the loss of the attempt (terminal).
    fn lost(&mut self, ended: &Mutex<Option<Error>>, g: &Grant, reason: String) -> Flow {
        tracing::warn!(attempt = g.attempt, %reason, "lease lost");
        *lock(ended) = Some(Error::LeaseLost {
            key: self.cfg.key.clone(),
            attempt: g.attempt,
            reason: reason.clone(),
        });
        self.events.emit(Event::LeaseLost {
            attempt: g.attempt,
            reason,
        });
        Flow::End
    }

    /// Ends the attempt in Redis, retrying transient errors until `lease_end` (the lease
    /// deadline as last confirmed), after one try at least.
    ///
    /// Past `lease_end` a backup may take over, so there is nothing left to wait for: a release
    /// (`fail()`, stop, drop) gives up, and a `done()` whose `DONE` may have been applied without
    /// a reply says so with [`Error::OutcomeUnknown`] instead of waiting on. While it runs, the
    /// job's channel is watched: a grant of a later attempt proves the attempt lost at once (our
    /// `WATCH`ed `EXEC` can no longer apply).
    async fn finish(&mut self, g: &Grant, ending: Ending, lease_end: Instant) -> Result<(), Error> {
        let mut pending = false;
        let mut backoff = Backoff::new(self.store.settings().max_backoff);
        let mut nil = 0u32;
        let mut sub = self.sub.take();
        let result = loop {
            // Every request of this try ends by the lease deadline; a try that starts after it
            // (a late finish without keepalive) gets one response timeout.
            let try_deadline = if Instant::now() < lease_end {
                lease_end
            } else {
                after(Instant::now(), self.store.settings().response_timeout)
            };
            let mut exec_sent = false;
            let outcome = {
                let one_try = self.finish_once(g, &ending, pending, try_deadline, &mut exec_sent);
                tokio::pin!(one_try);
                loop {
                    tokio::select! {
                        biased;
                        r = &mut one_try => break r,
                        // Only for `done()`: a later grant proves our WATCHed `DONE` did not and
                        // cannot apply. A release's own `EXEC` may apply and be followed by a
                        // backup's grant before its reply arrives, so there it proves nothing.
                        msg = recv_sub(sub.as_mut()), if matches!(ending, Ending::Done) => match msg {
                            Some(HubMsg::Message(m)) if later_grant(&m, g.attempt) => {
                                break Err(Error::LeaseLost {
                                    key: self.cfg.key.clone(),
                                    attempt: g.attempt,
                                    reason: format!("another worker announced `{m}`"),
                                });
                            }
                            None => sub = None,
                            _ => {}
                        },
                    }
                }
            };
            match outcome {
                Ok(true) => break Ok(()),
                Ok(false) => {
                    // A watched key changed (a backup's failed race, an expiring key): look again.
                    nil += 1;
                    if nil > 100 {
                        break Err(Error::Timeout {
                            during: "ending the attempt under constant contention",
                        });
                    }
                }
                // `DONE` applied; retrying cannot make it better replicated.
                Err(e @ Error::NotReplicated { .. }) => break Err(e),
                Err(e) if e.is_retryable() => {
                    // Only an `EXEC` whose reply was lost may have applied; a failed read or
                    // checkout wrote nothing.
                    pending |= exec_sent && e.is_indeterminate();
                    self.report(&e);
                    let now = Instant::now();
                    if now >= lease_end {
                        break Err(match finish_gave_up(ending.kind(), pending) {
                            GaveUp::OutcomeUnknown => Error::OutcomeUnknown {
                                key: self.cfg.key.clone(),
                                attempt: g.attempt,
                                reason: format!(
                                    "the reply to DONE was lost and the lease deadline came \
                                     before it could be read back: {e}"
                                ),
                            },
                            GaveUp::LeaseLost => Error::LeaseLost {
                                key: self.cfg.key.clone(),
                                attempt: g.attempt,
                                reason: format!(
                                    "the lease deadline passed before the outcome could be \
                                     recorded: {e}"
                                ),
                            },
                        });
                    }
                    let delay = backoff.next_delay().min(lease_end - now);
                    tokio::time::sleep(delay).await;
                }
                Err(e) => break Err(e),
            }
        };
        self.sub = sub;
        result
    }

    /// Releases a grant too few replicas acknowledged, without handing it out: reports why,
    /// then waits as a backup again (the attempt counts as used), or reports `Exhausted` when
    /// it was the last one.
    async fn give_back(&mut self, g: &Grant, why: Error, lease_end: Instant) -> Flow {
        self.report(&why);
        let reason = format!("released unused: {why}");
        if let Err(e) = self.finish(g, Ending::Release(reason), lease_end).await {
            // Not released: the lease runs out by itself, and a backup takes over then.
            self.report(&e);
        }
        if g.attempt >= self.cfg.max_attempts {
            self.events.emit(Event::Exhausted {
                attempts: g.attempt,
            });
            return Flow::End;
        }
        // As after a failed attempt with rejoin: the other backups get a head start.
        let head_start = (self.cfg.lock_timeout / 10)
            .clamp(Duration::from_millis(10), Duration::from_millis(500))
            .max(self.cfg.retry_delay);
        self.view.delay_served(g.attempt);
        Box::pin(self.sleep(head_start)).await
    }

    /// One try of [`finish`](Self::finish); `Ok(false)` means observe again.
    async fn finish_once(
        &self,
        g: &Grant,
        ending: &Ending,
        pending: bool,
        deadline: Instant,
        exec_sent: &mut bool,
    ) -> Result<bool, Error> {
        let op = ending.kind().op();
        let mut conn = self.store.checkout(deadline).await?;
        S::set_deadline(&mut conn, deadline);
        let obs = self.observe(&mut conn).await?;
        match decide_holder(&obs, g.attempt, &g.token, g.fence, op, pending) {
            HolderDecision::Commit => {}
            HolderDecision::AlreadyApplied => {
                S::abandon(&mut conn);
                return Ok(true);
            }
            HolderDecision::Lost(reason) => {
                S::abandon(&mut conn);
                return Err(Error::LeaseLost {
                    key: self.cfg.key.clone(),
                    attempt: g.attempt,
                    reason,
                });
            }
            HolderDecision::Unknown(reason) => {
                S::abandon(&mut conn);
                return Err(Error::OutcomeUnknown {
                    key: self.cfg.key.clone(),
                    attempt: g.attempt,
                    reason,
                });
            }
            HolderDecision::Fault(f) => {
                S::abandon(&mut conn);
                return Err(fault_error(&*self.store, f));
            }
        }
        let failure = format!(
            "attempt {} by {}: {}",
            g.attempt,
            self.name,
            truncate(ending.reason(), 1024)
        );
        let writes = finish_writes(ending.kind(), g.attempt, self.cfg.max_attempts);
        self.before_exec("finish").await;
        *exec_sent = true;
        // Only `DONE` waits for replicas: a failure or release lost to a failover only makes a
        // backup wait out the lease.
        let wait = match ending {
            Ending::Done => self.cfg.replica_ack,
            _ => None,
        };
        let committed = self.store.commit(
            &mut conn,
            &writes,
            &g.token,
            &failure,
            wait,
            "ending the attempt",
        );
        match committed.await? {
            None => Ok(false),
            Some(acked) => match self.short_of_replicas(wait, acked, || "DONE".to_string()) {
                Some(e) => Err(e),
                None => Ok(true),
            },
        }
    }

    /// One lease extension, as a future that owns what it needs (it runs beside the holder's
    /// other timers, see [`hold`](Self::hold)). Resolves to the send time of the confirmed
    /// extension. When the store refuses it, [`decide_holder`] explains what it read (lost, or a
    /// fault), as for any other holder transition.
    fn extension(&self, g: &Grant, lease_end: Instant) -> ExtensionFuture {
        let held = Held {
            attempt: g.attempt,
            token: g.token.clone(),
        };
        let (attempt, token, fence) = (g.attempt, g.token.clone(), g.fence);
        let job = self.cfg.key.clone();
        let store = self.store.clone();
        let extending = store.extension(held, lease_end);
        Box::pin(async move {
            match extending.await? {
                Extended::Confirmed { sent } => Ok(sent),
                Extended::Refused(obs) => {
                    match decide_holder(&obs, attempt, &token, fence, HolderOp::Extend, false) {
                        HolderDecision::Lost(reason) => Err(Error::LeaseLost {
                            key: job,
                            attempt,
                            reason,
                        }),
                        HolderDecision::Fault(f) => Err(fault_error(&*store, f)),
                        other => Err(Error::UnexpectedReply {
                            context: "the lease extension",
                            reply: format!("refused, yet the state reads as {other:?}"),
                        }),
                    }
                }
            }
        })
    }
}

/// An extension in flight (see [`Task::extension`]).
type ExtensionFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Instant, Error>> + Send>>;

/// Polls the extension in flight; pending forever without one (the `select!` branch is
/// disabled then anyway).
async fn poll_extension(ext: &mut Option<ExtensionFuture>) -> Result<Instant, Error> {
    match ext.as_mut() {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

fn fault_error<S: JobStore>(store: &S, fault: Fault) -> Error {
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
async fn recv_sub(sub: Option<&mut Subscription>) -> Option<HubMsg> {
    match sub {
        Some(s) => s.rx.recv().await,
        None => std::future::pending().await,
    }
}

fn truncate(s: &str, max: usize) -> &str {
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

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("ジョブ", 4), "ジ");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
