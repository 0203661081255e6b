//! The backup's side of the worker task: observe the job under `WATCH`, decide
//! ([`decide_backup`]), act (grant, write `EXHAUSTED`, report), and wait for the lease to end or
//! a message.

use std::time::Duration;

use tokio::time::Instant;

use super::config::StatusLevel;
use super::events::Event;
use super::protocol::{
    decide_backup, exhaust_writes, grant_writes, keep_waiting, Decision, Lease, Observation,
    PendingGrant, State,
};
use super::store::JobStore;
use super::worker::{fault_error, recv_sub, Flow, Grant, Step, Task};
use crate::error::Error;
use crate::util::metrics::{self, transition};
use crate::util::pubsub::Subscription;
use crate::util::settings::ReplicaWait;
use crate::util::time::{after, human};
use crate::util::token as keys;

impl<S: JobStore> Task<S> {
    pub(super) async fn observe(&self, conn: &mut S::Conn) -> Result<Observation, Error> {
        self.store.observe(conn).await
    }

    /// A dedicated connection for the next transition. Waiting for one is a future of its own,
    /// kept small: when thousands of backups queue for the pool at once (all started together,
    /// or woken by one failure), each waits with this, not with a whole transition's state.
    pub(super) async fn checkout(&self) -> Result<S::Conn, Error> {
        // A backup loses nothing by waiting for a connection, but not forever: a starved pool
        // is reported and retried.
        let wait = self
            .cfg
            .lease
            .max(self.store.settings().response_timeout * 5);
        self.store.checkout(after(Instant::now(), wait)).await
    }

    /// One backup transition on the checked-out connection: observe under WATCH, decide, act.
    pub(super) async fn transition(
        &mut self,
        checkout: Result<S::Conn, Error>,
    ) -> Result<Step, Error> {
        let mut conn = checkout?;
        let obs = self.observe(&mut conn).await?;
        let decision = decide_backup(&obs, &self.view);
        self.events.status(
            StatusLevel::Verbose,
            format!(
                "observed {}, lease {}; decided {}",
                obs.state.describe(),
                match &obs.lease {
                    Lease::Held {
                        pttl_ms: Some(ms), ..
                    } => format!("held ({} left)", human(Duration::from_millis(*ms))),
                    Lease::Held { pttl_ms: None, .. } => "held (no expiry)".into(),
                    Lease::Absent => "gone".into(),
                    _ => "unreadable".into(),
                },
                decision.describe()
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
                let remaining = Duration::from_millis(pttl).min(self.cfg.lease);
                let sent = Instant::now()
                    .checked_sub(self.cfg.lease - remaining)
                    .unwrap_or_else(Instant::now);
                self.events.status(
                    StatusLevel::Normal,
                    format!("the grant of attempt {attempt} whose reply was lost did apply"),
                );
                // Its EXEC's reply was lost, so this is where the grant is first known.
                self.labels().granted(attempt > 1, self.asked);
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
                        key: self.cfg.key.to_string(),
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
                let sent = Instant::now();
                let committed =
                    self.store
                        .commit(&mut conn, &writes, "", "", None, "writing EXHAUSTED");
                match committed.await? {
                    None => Ok(Step::Again),
                    Some(_) => {
                        self.labels().transition(transition::EXHAUST, sent);
                        metrics::count(metrics::Count::Exhausted, S::BACKEND);
                        tracing::info!(attempts, "job exhausted");
                        Ok(Step::Terminal(Event::Exhausted {
                            attempts: Some(attempts),
                        }))
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

    pub(super) async fn grant(
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
        let committed = tracing::Instrument::instrument(
            self.store
                .commit(&mut conn, &writes, &token, "", wait, "the grant"),
            tracing::debug_span!("grant", attempt, fencing_token = fence),
        )
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
                let labels = self.labels();
                labels.transition(transition::GRANT, sent);
                // Every attempt after the first takes over from a holder that failed, gave up
                // or lost its lease.
                labels.granted(attempt > 1, self.asked);
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
    pub(super) fn short_of_replicas(
        &self,
        wait: Option<ReplicaWait>,
        acked: Option<u64>,
        what: impl FnOnce() -> String,
    ) -> Option<Error> {
        let w = wait?;
        let acked = acked.unwrap_or(0);
        (acked < u64::from(w.replicas)).then(|| Error::NotReplicated {
            what: what(),
            key: self.cfg.key.to_string(),
            acked,
            wanted: w.replicas,
            timeout: w.timeout,
        })
    }

    /// Keeps a new subscription; or reports why there is none (`Some`: what the error means for
    /// the stream).
    fn adopt(&mut self, subscribed: Result<Subscription, Error>) -> Option<Flow> {
        match subscribed {
            Ok(sub) => {
                self.sub = Some(sub);
                self.contact();
                None
            }
            Err(e) => Some(self.report(&e)),
        }
    }

    /// Waits as a backup until the lease can have ended or a message says something changed.
    pub(super) async fn wait(&mut self, attempt: u64, mut pttl_ms: Option<u64>) -> Flow {
        if self.locked_reported != attempt {
            self.locked_reported = attempt;
            tracing::debug!(attempt, "locked by another worker");
            self.events.emit(Event::Locked {
                attempt,
                max_attempts: self.view.max_attempts,
                lease_remaining_ms: pttl_ms,
            });
        }
        let mut resubscribe_in = None;
        if self.sub.is_none() {
            // Boxed sub-futures (here and below) are allocated only while they run: a backup
            // that sleeps keeps a small future, which matters with thousands of them.
            let store = self.store.clone();
            let subscribed = Box::pin(async move { store.subscribe().await }).await;
            // Consumed whole by a plain function: a `match` moving the subscription out would
            // keep the rest of the `Result` in this future across the read below.
            match self.adopt(subscribed) {
                Some(Flow::End) => return Flow::End,
                // Without pub/sub we would still wake when the lease runs out (slower, never
                // wrong), but Redis is probably restarting: look again after a backoff, which
                // also retries the subscription.
                Some(Flow::Continue) => resubscribe_in = Some(self.backoff.next_delay()),
                None => {
                    // Observe once more now that the subscription is confirmed: a `failed` or
                    // `done` published between our read and the confirmation was not delivered
                    // to us and would otherwise cost a whole lease time.
                    let read = Box::pin(self.store.quick_read()).await;
                    if read.is_ok() {
                        self.contact();
                    }
                    match read {
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
            }
        }
        loop {
            let mut sleep_for = match pttl_ms {
                Some(p) => Duration::from_millis(p.max(1)),
                None => {
                    let e = Error::NoExpiry {
                        key: self.store.locate(super::protocol::Which::Lease),
                    };
                    self.report(&e);
                    self.cfg.lease
                }
            };
            if let Some(d) = resubscribe_in {
                sleep_for = sleep_for.min(d);
            }
            let sub = self.sub.as_mut();
            tokio::select! {
                biased;
                // A dropped `Worker` cancels `stop` too, so this one arm serves both (a
                // `Stopped` nobody reads is dropped): one future less in every waiting backup.
                _ = self.stop.cancelled() => {
                    self.events.emit(Event::Stopped);
                    return Flow::End;
                }
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
            let read = Box::pin(self.store.quick_read()).await;
            if read.is_ok() {
                self.contact();
            }
            match read.map(|(state, lease)| keep_waiting(&state, lease, attempt)) {
                Ok(Some(p)) => pttl_ms = Some(p),
                // Changed, gone, or unreadable: the transition decides and reports.
                _ => return Flow::Continue,
            }
        }
    }
}
