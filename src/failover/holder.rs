//! The holder's side of the worker task: keep the lease of a won attempt (watchdog) or watch
//! its deadline, hand it to the user, and end it (done, fail, release) in the store.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::config::StatusLevel;
use super::events::{Acquired, AttemptHandle, Event, HolderCmd};
use super::protocol::{
    decide_holder, finish_gave_up, finish_writes, later_grant, taken_over, takeover_reason, GaveUp,
    HolderDecision, HolderOp,
};
use super::record::{AttemptOutcome, RecordChange, RecordedOutcome};
use super::store::{Extended, Held, JobStore};
use super::worker::{fault_error, recv_sub, truncate, Flow, Grant, Task};
use crate::error::Error;
use crate::lease;
use crate::lease::guard::{confirm, deadline_cell, LeaseCore, LossSignal};
use crate::lease::keepalive::Cadence;
use crate::util::backoff::Backoff;
use crate::util::lock;
use crate::util::metrics::{self, transition, Count, ExtendOutcome, Loss};
use crate::util::pubsub::HubMsg;
use crate::util::time::{after, human, ms, FAR};

/// How a holder ends its attempt, with the reason kept for `status`.
#[derive(Clone)]
pub(super) enum Ending {
    Done,
    Fail(String),
    /// Stopped, dropped handle, dropped receiver, `max_hold`: like a failure, but announced as
    /// `released` and never written as `EXHAUSTED` by the holder itself.
    Release(String),
}

impl Ending {
    pub(super) fn kind(&self) -> super::protocol::Ending {
        use super::protocol::Ending as E;
        match self {
            Ending::Done => E::Done,
            Ending::Fail(_) => E::Fail,
            Ending::Release(_) => E::Release,
        }
    }

    /// The metrics' `transition` label (and the `finish` span's `ending` field).
    pub(super) fn label(&self) -> metrics::Transition {
        match self {
            Ending::Done => transition::DONE,
            Ending::Fail(_) => transition::FAIL,
            Ending::Release(_) => transition::RELEASE,
        }
    }

    pub(super) fn reason(&self) -> &str {
        match self {
            Ending::Done => "",
            Ending::Fail(r) | Ending::Release(r) => r,
        }
    }
}

impl<S: JobStore> Task<S> {
    /// Holds an attempt until it ends. Returns `Continue` only when the worker rejoins as a
    /// backup after its own failure.
    ///
    /// Loss detection never waits on a request: with the watchdog, the lease deadline (the send
    /// time of the last confirmed extension + `lease` − max(1 %, 2 ms)) is a timer of its
    /// own in the `select!`, armed whatever an extension in flight is doing (a hung reply, a
    /// starved pool, a paused Redis). Extensions run as a separate future for that reason.
    pub(super) async fn hold(&mut self, g: Grant) -> Flow {
        let (cmd_tx, mut cmd_rx) = crate::util::mailbox::unbounded();
        let ended = Arc::new(Mutex::new(None));
        let loss = LossSignal::new();
        // Whatever way this function returns, the attempt is no longer held by the user's code:
        // the handle's loss signal fires.
        let _released_on_return = FireOnReturn {
            loss: loss.clone(),
            ended: ended.clone(),
        };
        let lease = self.cfg.lease;
        let deadline_at = lease::deadline(g.sent, lease);
        // A process pause (SIGSTOP, a swapped-out or overloaded host) between the grant's EXEC
        // and this point may have outlived the lease, and a backup may hold the next attempt by
        // now: never hand out such a grant (found by the chaos harness's holder pauses).
        if Instant::now() >= deadline_at {
            let waited = g.sent.elapsed();
            return self.lost(
                &ended,
                &g,
                Loss::Expired,
                format!(
                    "the lease ran out before the grant could be handed over ({} after its EXEC \
                     was sent, lease {})",
                    human(waited),
                    human(lease)
                ),
            );
        }
        if let Some(e) = g.unconfirmed.clone() {
            return self.give_back(&g, e, deadline_at).await;
        }
        // The deadline the handle shows, moved on below with every confirmed extension.
        let confirmed = deadline_cell(deadline_at);
        let handle = AttemptHandle::new(
            self.cfg.key.to_string(),
            g.attempt,
            cmd_tx,
            ended.clone(),
            LeaseCore::new(self.cfg.key.clone(), Some(g.fence), confirmed.clone(), loss),
        );
        let attempt = g.attempt;
        self.record(|| RecordChange::Started { attempt });
        let span = tracing::Span::current();
        span.record("attempt", g.attempt);
        span.record("fencing_token", g.fence);
        let delivered = self.events.emit(Event::Acquired(Acquired {
            attempt: g.attempt,
            last: g.last,
            fencing_token: g.fence,
            lease_remaining_ms: ms(deadline_at.saturating_duration_since(Instant::now())),
            handle,
            granted_deadline: deadline_at,
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
        let watchdog = self.cfg.watchdog;
        let max_hold_at = self.cfg.max_hold.map(|m| after(g.sent, m));
        // The extension cadence of the keepalive engine: every third of a lease from the last
        // confirmed send time, a backoff (from a sixth of the lease) after a failure.
        let mut cadence = Cadence::new(self.cfg.watchdog_interval(), lease / 6, g.sent);
        // The lease deadline as this worker knows it: moved on by every confirmed extension.
        let mut lease_end = deadline_at;
        let mut deadline_reported = false;
        let far = after(Instant::now(), FAR);
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
        // PROGRAM's exit, as `AttemptHandle::set_exit` left it, for the record.
        let mut exit = None;
        // The occurrence's outcome a `done_settled` end records (overlap `buffer-one`).
        let mut settle = None;
        loop {
            let watch_sub = self.sub.as_mut();
            let ending = tokio::select! {
                biased;
                // A `done()` or `fail()` already queued is served first, `stop()` included:
                // finished work must be recorded, not released for a backup to run again.
                cmd = cmd_rx.recv() => match cmd {
                    Some(HolderCmd::Done(e, s, reply)) => {
                        exit = e;
                        settle = s;
                        (Ending::Done, Some(reply))
                    }
                    Some(HolderCmd::Fail(reason, e, reply)) => {
                        exit = e;
                        (Ending::Fail(reason), Some(reply))
                    }
                    None => (Ending::Fail("the attempt handle was dropped without done() or fail()".into()), None),
                },
                // A dropped `Worker` cancels `stop` as well: say which it was.
                _ = self.stop.cancelled() => {
                    drop(extending.take());
                    let why = if self.events.is_closed() {
                        "the event receiver was dropped"
                    } else {
                        "the worker was stopped"
                    };
                    let _ = self.finish(&g, Ending::Release(why.into()), lease_end).await;
                    self.set_ended(&ended, &g, why);
                    self.events.emit(Event::Stopped);
                    return Flow::End;
                }
                _ = self.events.closed() => {
                    drop(extending.take());
                    let _ = self.finish(&g, Ending::Release("the event receiver was dropped".into()), lease_end).await;
                    return Flow::End;
                }
                _ = tokio::time::sleep_until(max_hold_at.unwrap_or(far)) => {
                    drop(extending.take());
                    let reason = format!("max_hold of {} reached", human(self.cfg.max_hold.unwrap_or_default()));
                    self.events.emit(Event::DeadlinePassed { attempt: g.attempt });
                    let _ = self.finish(&g, Ending::Release(reason.clone()), lease_end).await;
                    return self.lost(&ended, &g, Loss::MaxHold, reason);
                }
                // Whatever an extension in flight is doing, the lease may be over by now.
                _ = tokio::time::sleep_until(lease_end), if watchdog => {
                    return self.lost(&ended, &g, Loss::Expired, format!(
                        "no extension was confirmed in time: the lease ({} from the last \
                         confirmed one) may have run out",
                        human(lease)
                    ));
                }
                r = poll_extension(&mut extending), if extending.is_some() => {
                    extending = None;
                    let outcome = match &r {
                        Ok(_) => ExtendOutcome::Ok,
                        Err(Error::LeaseLost { .. }) => ExtendOutcome::Refused,
                        Err(_) => ExtendOutcome::Error,
                    };
                    self.labels().extended(outcome, r.as_ref().map_or_else(|_| Instant::now(), |s| *s));
                    match r {
                        Ok(sent) => {
                            self.contact();
                            lease_end = lease::deadline(sent, lease);
                            confirm(&confirmed, lease_end);
                            cadence.confirmed(sent);
                            self.events.status(
                                StatusLevel::Verbose,
                                format!("extended the lease of attempt {}", g.attempt),
                            );
                        }
                        Err(Error::LeaseLost {
                            fencing_token: None, reason, .. }) => return self.lost(&ended, &g, Loss::Taken, reason),
                        Err(e) if e.is_retryable() => {
                            self.report(&e);
                            cadence.failed(Some(lease_end));
                        }
                        Err(e) => {
                            *lock(&ended) = Some(e.clone());
                            self.report(&e);
                            return Flow::End;
                        }
                    }
                    continue;
                }
                _ = tokio::time::sleep_until(cadence.due()), if watchdog && extending.is_none() => {
                    extending = Some(Box::pin(self.extension(&g, lease_end)));
                    continue;
                }
                _ = tokio::time::sleep_until(deadline_at), if !watchdog && !deadline_reported => {
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
                            return self.lost(&ended, &g, Loss::Taken, takeover_reason(&m));
                        }
                        // Someone released an attempt while we hold ours (an operator's
                        // `fail_attempt`): check our lease now instead of at the next extension.
                        Some(HubMsg::Message(m)) if watchdog && (m == "failed" || m == "released") => {
                            cadence.now();
                        }
                        // The pub/sub link was re-established: a takeover announced while it was
                        // down was missed, so look now. With the watchdog the extension tells;
                        // without, one plain read does.
                        Some(HubMsg::Reconnected) if watchdog => cadence.now(),
                        Some(HubMsg::Reconnected) => {
                            let check = Box::pin(self.still_ours(&g));
                            if let Err(reason) = check.await {
                                return self.lost(&ended, &g, Loss::Taken, reason);
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
            // A finish is bounded by the lease as last confirmed; without the watchdog a late
            // finish still gets its one try (`finish` always tries once).
            let result = self.finish(&g, ending.clone(), lease_end).await;
            if let Err(e) = &result {
                *lock(&ended) = Some(e.clone());
            }
            if let Some(reply) = reply {
                let _ = reply.send(result.clone());
            }
            let failed = matches!(ending, Ending::Fail(_));
            if result.is_ok() {
                let exhausted = failed && g.attempt >= self.view.max_attempts;
                let (outcome, message) = match &ending {
                    Ending::Done => (AttemptOutcome::Done, None),
                    Ending::Fail(r) | Ending::Release(r) => {
                        (AttemptOutcome::Failed, Some(r.clone()))
                    }
                };
                let attempt = g.attempt;
                match settle.filter(|_| matches!(ending, Ending::Done)) {
                    Some(outcome) => self.record(|| RecordChange::Settled {
                        attempt,
                        outcome,
                        message: Some(format!("not run: settled {}", outcome.as_str())),
                    }),
                    None => self.record(|| RecordChange::Ended {
                        attempt,
                        outcome,
                        exit,
                        message,
                    }),
                }
                if exhausted {
                    self.record(|| RecordChange::Outcome {
                        outcome: RecordedOutcome::Exhausted,
                        note: None,
                    });
                }
            }
            return match (result, ending) {
                (Ok(()), Ending::Done) => {
                    metrics::count(Count::Done, S::BACKEND);
                    tracing::info!(attempt = g.attempt, "done");
                    self.events.emit(Event::Completed {
                        attempt: Some(g.attempt),
                    });
                    Flow::End
                }
                (Ok(()), Ending::Fail(reason) | Ending::Release(reason)) => {
                    tracing::info!(attempt = g.attempt, %reason, "attempt failed");
                    metrics::count(Count::FailedAttempts, S::BACKEND);
                    if g.attempt >= self.view.max_attempts {
                        // Only a failure writes `EXHAUSTED` (a release leaves it to a backup).
                        if failed {
                            metrics::count(Count::Exhausted, S::BACKEND);
                        }
                        self.events.emit(Event::Exhausted {
                            attempts: Some(g.attempt),
                        });
                        Flow::End
                    } else if self.cfg.rejoin_after_fail {
                        // An event that is never dropped: a reader that ran the attempt learns
                        // here that the stream goes on (a `Status` could be lagged away).
                        self.events.emit(Event::Rejoined {
                            attempt: g.attempt,
                            reason,
                        });
                        // Give the backups woken by our `failed` a head start, so the worker
                        // that just failed does not usually win the next attempt itself.
                        let head_start = (self.cfg.lease / 10)
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
                    metrics::count(Count::Done, S::BACKEND);
                    self.report(&e);
                    tracing::warn!(attempt = g.attempt, error = %e, "done, not replicated");
                    self.events.emit(Event::Completed {
                        attempt: Some(g.attempt),
                    });
                    Flow::End
                }
                (
                    Err(Error::LeaseLost {
                        fencing_token: None,
                        reason,
                        ..
                    }),
                    _,
                ) => self.lost(&ended, &g, Loss::Taken, reason),
                (Err(e), _) if e.is_retryable() => self.lost(
                    &ended,
                    &g,
                    Loss::Error,
                    format!("the outcome could not be recorded: {e}"),
                ),
                (Err(e), _) => {
                    self.report(&e);
                    Flow::End
                }
            };
        }
    }

    /// Whether another worker has taken the attempt over, by one plain read (no watchdog:
    /// a lease that ran out with nobody else holding the job is still ours to finish).
    /// `Err(reason)` when it was taken over; a failed read proves nothing (`Ok`).
    pub(super) async fn still_ours(&self, g: &Grant) -> Result<(), String> {
        let limit = after(Instant::now(), self.store.settings().response_timeout);
        let Ok(obs) = self.store.holder_read(limit).await else {
            return Ok(());
        };
        match decide_holder(&obs, g.attempt, &g.token, g.fence, HolderOp::Done, false) {
            HolderDecision::Lost(reason) => Err(reason),
            _ => Ok(()),
        }
    }

    pub(super) fn set_ended(&self, ended: &Mutex<Option<Error>>, g: &Grant, reason: &str) {
        let mut slot = lock(ended);
        if slot.is_none() {
            *slot = Some(Error::LeaseLost {
                fencing_token: None,
                key: self.cfg.key.to_string(),
                attempt: g.attempt,
                reason: reason.to_string(),
            });
        }
    }

    /// Reports the loss of the attempt (terminal); `why` is the metrics' reason.
    pub(super) fn lost(
        &mut self,
        ended: &Mutex<Option<Error>>,
        g: &Grant,
        why: Loss,
        reason: String,
    ) -> Flow {
        tracing::warn!(attempt = g.attempt, %reason, "lease lost");
        self.labels().lost(why);
        let (attempt, message) = (g.attempt, reason.clone());
        self.record(|| RecordChange::Ended {
            attempt,
            outcome: AttemptOutcome::Lost,
            exit: None,
            message: Some(message),
        });
        *lock(ended) = Some(Error::LeaseLost {
            fencing_token: None,
            key: self.cfg.key.to_string(),
            attempt: g.attempt,
            reason: reason.clone(),
        });
        if self.cfg.rejoin_after_fail {
            // Lost is failed too, as far as the job goes: the attempt is over and a backup may
            // run the next one. A worker that left here would strand the job when the backup
            // that took over dies in turn (a holder frozen past its lease, or cut off by a
            // blip, was the only other worker alive): rejoined, it takes the next attempt or
            // writes `EXHAUSTED` as any backup would. The handle's loss signal (set above) is
            // what stops the work; the event says the stream goes on.
            self.events.emit(Event::Rejoined {
                attempt: g.attempt,
                reason: format!("lease lost: {reason}"),
            });
            return Flow::Continue;
        }
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
    pub(super) async fn finish(
        &mut self,
        g: &Grant,
        ending: Ending,
        lease_end: Instant,
    ) -> Result<(), Error> {
        let mut pending = false;
        let mut backoff = Backoff::new(self.store.settings().max_backoff);
        let mut nil = 0u32;
        let mut sub = self.sub.take();
        let result = loop {
            // Every request of this try ends by the lease deadline; a try that starts after it
            // (a late finish without the watchdog) gets one response timeout.
            let try_deadline = if Instant::now() < lease_end {
                lease_end
            } else {
                after(Instant::now(), self.store.settings().response_timeout)
            };
            let mut exec_sent = false;
            let sent = Instant::now();
            let outcome = {
                let one_try = tracing::Instrument::instrument(
                    self.finish_once(g, &ending, pending, try_deadline, &mut exec_sent),
                    tracing::debug_span!(
                        "finish",
                        attempt = g.attempt,
                        ending = ending.label().as_str()
                    ),
                );
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
                                    fencing_token: None,
                                    key: self.cfg.key.to_string(),
                                    attempt: g.attempt,
                                    reason: takeover_reason(&m),
                                });
                            }
                            None => sub = None,
                            _ => {}
                        },
                    }
                }
            };
            match outcome {
                Ok(true) => {
                    self.contact();
                    self.labels().transition(ending.label(), sent);
                    break Ok(());
                }
                Ok(false) => {
                    self.contact();
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
                                key: self.cfg.key.to_string(),
                                attempt: g.attempt,
                                reason: format!(
                                    "the reply to DONE was lost and the lease deadline came \
                                     before it could be read back: {e}"
                                ),
                            },
                            GaveUp::LeaseLost => Error::LeaseLost {
                                fencing_token: None,
                                key: self.cfg.key.to_string(),
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
    pub(super) async fn give_back(&mut self, g: &Grant, why: Error, lease_end: Instant) -> Flow {
        self.report(&why);
        let reason = format!("released unused: {why}");
        if let Err(e) = self.finish(g, Ending::Release(reason), lease_end).await {
            // Not released: the lease runs out by itself, and a backup takes over then.
            self.report(&e);
        }
        if g.attempt >= self.view.max_attempts {
            self.events.emit(Event::Exhausted {
                attempts: Some(g.attempt),
            });
            return Flow::End;
        }
        // As after a failed attempt with rejoin: the other backups get a head start.
        let head_start = (self.cfg.lease / 10)
            .clamp(Duration::from_millis(10), Duration::from_millis(500))
            .max(self.cfg.retry_delay);
        self.view.delay_served(g.attempt);
        Box::pin(self.sleep(head_start)).await
    }

    /// One try of [`finish`](Self::finish); `Ok(false)` means observe again.
    pub(super) async fn finish_once(
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
                    fencing_token: None,
                    key: self.cfg.key.to_string(),
                    attempt: g.attempt,
                    reason,
                });
            }
            HolderDecision::Unknown(reason) => {
                S::abandon(&mut conn);
                return Err(Error::OutcomeUnknown {
                    key: self.cfg.key.to_string(),
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
            self.store.worker_name(),
            truncate(ending.reason(), 1024)
        );
        let writes = finish_writes(ending.kind(), g.attempt, self.view.max_attempts);
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
    pub(super) fn extension(&self, g: &Grant, lease_end: Instant) -> ExtensionFuture {
        let held = Held {
            attempt: g.attempt,
            token: g.token.clone(),
        };
        let (attempt, token, fence) = (g.attempt, g.token.clone(), g.fence);
        let job = self.cfg.key.to_string();
        let store = self.store.clone();
        let extending = store.extension(held, lease_end);
        Box::pin(async move {
            match extending.await? {
                Extended::Confirmed { sent } => Ok(sent),
                Extended::Refused(obs) => {
                    match decide_holder(&obs, attempt, &token, fence, HolderOp::Extend, false) {
                        HolderDecision::Lost(reason) => Err(Error::LeaseLost {
                            fencing_token: None,
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

/// Fires the attempt handle's loss signal when the holder returns, whichever way: the user's
/// code no longer holds the attempt. Its reason is why the attempt ended, as the handle's
/// `lost_error()` reports it.
struct FireOnReturn {
    loss: Arc<LossSignal>,
    ended: Arc<Mutex<Option<Error>>>,
}

impl Drop for FireOnReturn {
    fn drop(&mut self) {
        let reason = match &*lock(&self.ended) {
            Some(Error::LeaseLost { reason, .. }) => reason.clone(),
            Some(e) => e.to_string(),
            None => "the attempt ended".to_string(),
        };
        self.loss.fire(reason);
    }
}

/// An extension in flight (see [`Task::extension`]).
pub(super) type ExtensionFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Instant, Error>> + Send>>;

/// Polls the extension in flight; pending forever without one (the `select!` branch is
/// disabled then anyway).
pub(super) async fn poll_extension(ext: &mut Option<ExtensionFuture>) -> Result<Instant, Error> {
    match ext.as_mut() {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}
