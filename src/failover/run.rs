//! The closure form: `client.failover().run(job, |attempt| async { … })`.
//!
//! It wires the event stream for the common case: the lease is kept alive while the closure
//! runs, the closure is cancelled the moment the attempt is lost, its result becomes `done()` or
//! `fail()`, and a panic becomes a failed attempt instead of taking the worker down.

use std::future::Future;

use serde::Serialize;
use tokio_stream::StreamExt;
use tokio_util::task::AbortOnDropHandle;

use super::config::FailoverConfig;
use super::events::Event;
use super::Failover;
use crate::error::{ConfigError, Error, ErrorKind};

/// What the closure receives: which attempt this is. Serializes as a plain object
/// (`{"key":"report","attempt":1,"last":false,"fencing_token":7}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Attempt {
    /// The job name.
    pub key: String,
    /// The attempt number, 1 ..= `max_attempts` (as [`Acquired::attempt`](super::Acquired::attempt)
    /// and [`AttemptHandle::attempt`](super::AttemptHandle::attempt)).
    pub attempt: u64,
    /// Whether this is the last attempt allowed.
    pub last: bool,
    /// The fencing token to pass to the resource the work writes to.
    pub fencing_token: u64,
}

/// How [`Failover::run`] ended for this worker. `T` is what the work returns on success, `E`
/// its error type.
///
/// Everything the work returned comes back in here, its error included ([`RunOutcome::Failed`]);
/// baton's own failures are the `Err` of [`Failover::run`].
///
/// Serializes (when `T` does) tagged `outcome` like [`Event`]'s `event`:
/// `{"outcome":"Done","value":42}`, `{"outcome":"Failed","attempt":1,"reason":"…",
/// "panicked":false}`. The work's error is serialized as its text (`reason`), so `E` need not be
/// `Serialize`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunOutcome<T, E = String> {
    /// This worker ran the job successfully and recorded `DONE`.
    Done(T),
    /// The work succeeded, but before its `DONE` was recorded another worker took the job over
    /// (the lease ran out, or an operator released the attempt): the job will be, or was, run
    /// again elsewhere. The work's result is kept.
    NotRecorded {
        /// The attempt.
        attempt: u64,
        /// What the work returned.
        value: T,
        /// Why the `DONE` was refused.
        reason: String,
    },
    /// The work succeeded, but recording its `DONE` failed with an error of baton's (a
    /// connection error, a timeout, [`ErrorKind::OutcomeUnknown`]): whether the job is recorded
    /// as done is not known, and a backup may run it again if it is not. The work's result is
    /// kept.
    DoneUnconfirmed {
        /// The attempt.
        attempt: u64,
        /// What the work returned.
        value: T,
        /// The classification of the error that recording `DONE` returned.
        kind: ErrorKind,
        /// That error's text.
        reason: String,
    },
    /// Another worker completed the job.
    CompletedElsewhere,
    /// This worker's attempt failed (error or panic); the job was left to the backups.
    Failed {
        /// The attempt.
        attempt: u64,
        /// The error's text, or `the work panicked: <panic message>`.
        reason: String,
        /// Whether the work panicked (in the closure itself or in the future it returned)
        /// rather than returning an error. The panic is contained: the attempt counts as failed
        /// and a backup takes over, exactly as for an error.
        panicked: bool,
        /// The error the work returned (`None` when it panicked or was cancelled).
        error: Option<E>,
    },
    /// Every attempt failed.
    Exhausted {
        /// The number of attempts the job made, when this worker knows it; `None` when it
        /// found the job exhausted already (see [`Event::Exhausted`](crate::Event::Exhausted)).
        attempts: Option<u64>,
    },
    /// This worker lost its attempt while the closure ran (the closure was cancelled).
    LeaseLost {
        /// The attempt.
        attempt: u64,
        /// Why.
        reason: String,
    },
    /// The worker was stopped (`Client::shutdown`).
    Stopped,
}

impl<T: Serialize, E> Serialize for RunOutcome<T, E> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        OutcomeJson::from(self).serialize(serializer)
    }
}

/// [`RunOutcome`]'s JSON form: internally tagged, which a tuple variant holding a number or a
/// string cannot be (`Done`'s value becomes a field), and without the work's error object.
#[derive(Serialize)]
#[serde(tag = "outcome")]
enum OutcomeJson<'a, T> {
    Done {
        value: &'a T,
    },
    NotRecorded {
        attempt: u64,
        value: &'a T,
        reason: &'a str,
    },
    DoneUnconfirmed {
        attempt: u64,
        value: &'a T,
        kind: ErrorKind,
        reason: &'a str,
    },
    CompletedElsewhere,
    Failed {
        attempt: u64,
        reason: &'a str,
        panicked: bool,
    },
    Exhausted {
        attempts: Option<u64>,
    },
    LeaseLost {
        attempt: u64,
        reason: &'a str,
    },
    Stopped,
}

impl<'a, T, E> From<&'a RunOutcome<T, E>> for OutcomeJson<'a, T> {
    fn from(outcome: &'a RunOutcome<T, E>) -> Self {
        match outcome {
            RunOutcome::Done(value) => OutcomeJson::Done { value },
            RunOutcome::NotRecorded {
                attempt,
                value,
                reason,
            } => OutcomeJson::NotRecorded {
                attempt: *attempt,
                value,
                reason,
            },
            RunOutcome::DoneUnconfirmed {
                attempt,
                value,
                kind,
                reason,
            } => OutcomeJson::DoneUnconfirmed {
                attempt: *attempt,
                value,
                kind: *kind,
                reason,
            },
            RunOutcome::CompletedElsewhere => OutcomeJson::CompletedElsewhere,
            RunOutcome::Failed {
                attempt,
                reason,
                panicked,
                ..
            } => OutcomeJson::Failed {
                attempt: *attempt,
                reason,
                panicked: *panicked,
            },
            RunOutcome::Exhausted { attempts } => OutcomeJson::Exhausted {
                attempts: *attempts,
            },
            RunOutcome::LeaseLost { attempt, reason } => OutcomeJson::LeaseLost {
                attempt: *attempt,
                reason,
            },
            RunOutcome::Stopped => OutcomeJson::Stopped,
        }
    }
}

/// Anything that names a job for [`Failover::run`]: a job name (default settings) or a full
/// [`FailoverConfig`].
pub trait IntoJob {
    /// Converts into a validated configuration.
    ///
    /// # Errors
    /// [`ConfigError`] when the name is invalid.
    fn into_job(self) -> Result<FailoverConfig, ConfigError>;
}

impl IntoJob for FailoverConfig {
    fn into_job(self) -> Result<FailoverConfig, ConfigError> {
        Ok(self)
    }
}

impl IntoJob for &str {
    fn into_job(self) -> Result<FailoverConfig, ConfigError> {
        FailoverConfig::builder(self).build()
    }
}

impl IntoJob for String {
    fn into_job(self) -> Result<FailoverConfig, ConfigError> {
        FailoverConfig::builder(self).build()
    }
}

impl Failover {
    /// Runs `work` if this worker wins an attempt of the job, otherwise waits as a backup and
    /// takes over when an attempt fails; returns how the job ended for this worker.
    ///
    /// The watchdog is always on here (the lease is extended while `work` runs, whatever `job`
    /// says), so failover happens when `work` fails, panics, its process dies, or `max_hold`
    /// runs out. `work` runs in its own task and is aborted as soon as the attempt is lost.
    ///
    /// A panic in `work` (in the closure or in the future it returns) is contained: the attempt
    /// is failed like an error, backups take over, and this worker returns
    /// [`RunOutcome::Failed`] with `panicked: true` (or [`RunOutcome::Exhausted`] if it was the
    /// last attempt). The coordinator itself never unwinds.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), baton::Error> {
    /// let client = baton::Client::connect("redis://127.0.0.1:6379/").await?;
    /// let outcome = client
    ///     .failover()
    ///     .run("report:nightly", |attempt| async move {
    ///         println!("running attempt {} (fence {})", attempt.attempt, attempt.fencing_token);
    ///         Ok::<_, std::io::Error>(())
    ///     })
    ///     .await?;
    /// println!("{outcome:?}");
    /// # Ok(()) }
    /// ```
    ///
    /// Whatever `work` returns comes back inside `Ok`: its value ([`RunOutcome::Done`], or
    /// [`RunOutcome::DoneUnconfirmed`] with the value when recording `DONE` failed) and its error
    /// ([`RunOutcome::Failed`]).
    ///
    /// # Errors
    /// Baton's own failures only: [`Error::Config`] for an invalid job; the worker's terminal
    /// error (corrupt state, lost state, …) when the job cannot be coordinated; connection
    /// errors while failing an attempt.
    ///
    /// # Cancel safety
    /// Dropping the future drops the worker, which fails an attempt it holds (the lease is
    /// released so a backup takes over) and aborts `work`.
    pub async fn run<J, F, Fut, T, E>(&self, job: J, work: F) -> Result<RunOutcome<T, E>, Error>
    where
        J: IntoJob,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        self.run_settling(job, work, |_| None).await
    }

    /// [`Failover::run`], where a value of the work for which `settle` says an outcome
    /// completes the job with [`AttemptHandle::done_settled`](super::AttemptHandle::done_settled)
    /// (the occurrence recorded as that outcome) instead of `done`: a buffered occurrence whose
    /// window closed before the work ran (overlap `buffer-one`).
    pub(crate) async fn run_settling<J, F, Fut, T, E>(
        &self,
        job: J,
        mut work: F,
        settle: impl Fn(&T) -> Option<crate::util::schedule_record::RecordedOutcome>,
    ) -> Result<RunOutcome<T, E>, Error>
    where
        J: IntoJob,
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: std::fmt::Display + Send + 'static,
    {
        let config = job.into_job()?.with_watchdog(true);
        let key = config.key.clone();
        let mut worker = self.start(config);
        // The attempt whose work panicked, so its `Failed` is reported as a panic.
        let mut panicked_attempt = None;
        // The error the work returned in its last attempt, kept for `Failed`.
        let mut last_error: Option<(u64, E)> = None;
        while let Some(event) = worker.next().await {
            match event {
                Event::Acquired(acquired) => {
                    let attempt = Attempt {
                        key: key.clone(),
                        attempt: acquired.attempt,
                        last: acquired.last,
                        fencing_token: acquired.fencing_token,
                    };
                    let number = attempt.attempt;
                    // A closure that panics before it even returns its future is user code
                    // panicking too: contain it like a panic inside the future. (The closure may
                    // be left in a broken state; it is only called again for a later attempt of
                    // this worker, with `rejoin_after_fail`.)
                    let fut = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        work(attempt)
                    })) {
                        Ok(fut) => fut,
                        Err(payload) => {
                            panicked_attempt = Some(number);
                            acquired
                                .fail(crate::util::panic_message(payload))
                                .await
                                .or_else(lost_is_ok)?;
                            continue;
                        }
                    };
                    // Aborted when dropped, so losing the lease (or dropping `run`) cancels it.
                    let mut task = AbortOnDropHandle::new(tokio::spawn(fut));
                    let result = tokio::select! {
                        r = &mut task => Some(r),
                        // Anything the worker says while the closure runs is about this attempt:
                        // a terminal event means it is gone, so stop the work at once.
                        ended = attempt_over(&mut worker) => match ended {
                            // Lost, and the worker waits as a backup again
                            // (`rejoin_after_fail`): so does this run, its work stopped.
                            Some(Event::Rejoined { .. }) => None,
                            ended => {
                                drop(acquired);
                                return Ok(outcome_of(ended, number));
                            }
                        }
                    };
                    let Some(result) = result else {
                        // Dropping the task aborts the work; the handle's attempt is over.
                        drop(task);
                        drop(acquired);
                        continue;
                    };
                    let ended = match result {
                        // The work's result is never dropped, whatever becomes of its DONE.
                        Ok(Ok(value)) => match match settle(&value) {
                            Some(outcome) => acquired.handle.done_settled(outcome).await,
                            None => acquired.done().await,
                        } {
                            Ok(()) => return Ok(RunOutcome::Done(value)),
                            Err(Error::LeaseLost { reason, .. }) => {
                                return Ok(RunOutcome::NotRecorded {
                                    attempt: number,
                                    value,
                                    reason,
                                })
                            }
                            Err(error) => {
                                return Ok(RunOutcome::DoneUnconfirmed {
                                    attempt: number,
                                    value,
                                    kind: error.kind(),
                                    reason: error.to_string(),
                                })
                            }
                        },
                        Ok(Err(e)) => {
                            let reason = e.to_string();
                            last_error = Some((number, e));
                            acquired.fail(reason).await
                        }
                        Err(join) if join.is_panic() => {
                            panicked_attempt = Some(number);
                            acquired
                                .fail(crate::util::panic_message(join.into_panic()))
                                .await
                        }
                        Err(_) => acquired.fail("the work was cancelled").await,
                    };
                    ended.or_else(lost_is_ok)?;
                    // The worker now reports Failed / Exhausted / LeaseLost (or rejoins).
                }
                Event::Completed { attempt: None } => return Ok(RunOutcome::CompletedElsewhere),
                other if other.is_terminal() => {
                    return terminal(other, panicked_attempt, last_error)
                }
                _ => {}
            }
        }
        Ok(RunOutcome::Stopped)
    }
}

/// Waits for the end of the attempt in hand as the worker reports it: a terminal event, a
/// `Rejoined` (its lease was lost and the worker waits as a backup again), or the end of the
/// stream.
async fn attempt_over(worker: &mut super::Worker) -> Option<Event> {
    while let Some(ev) = worker.next().await {
        if ev.is_terminal() || matches!(ev, Event::Rejoined { .. }) {
            return Some(ev);
        }
    }
    None
}

fn outcome_of<T, E>(event: Option<Event>, attempt: u64) -> RunOutcome<T, E> {
    match event {
        Some(Event::LeaseLost { attempt, reason }) => RunOutcome::LeaseLost { attempt, reason },
        Some(Event::Exhausted { attempts }) => RunOutcome::Exhausted { attempts },
        Some(Event::Error { message, .. }) => RunOutcome::LeaseLost {
            attempt,
            reason: message,
        },
        _ => RunOutcome::Stopped,
    }
}

/// After `fail()`: a lost attempt is not an error of `run` (the worker reports `LeaseLost`).
fn lost_is_ok(e: Error) -> Result<(), Error> {
    match e {
        Error::LeaseLost { .. } => Ok(()),
        other => Err(other),
    }
}

fn terminal<T, E>(
    event: Event,
    panicked_attempt: Option<u64>,
    last_error: Option<(u64, E)>,
) -> Result<RunOutcome<T, E>, Error> {
    Ok(match event {
        Event::Completed { .. } => RunOutcome::CompletedElsewhere,
        Event::Exhausted { attempts } => RunOutcome::Exhausted { attempts },
        Event::Failed { attempt, reason } => RunOutcome::Failed {
            attempt,
            reason,
            panicked: panicked_attempt == Some(attempt),
            error: last_error.filter(|(n, _)| *n == attempt).map(|(_, e)| e),
        },
        Event::LeaseLost { attempt, reason } => RunOutcome::LeaseLost { attempt, reason },
        Event::Error { kind, message, .. } => return Err(Error::Reported { kind, message }),
        _ => RunOutcome::Stopped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_serialize_tagged_with_the_value_as_a_field_and_the_error_as_text() {
        let done: RunOutcome<u64, std::io::Error> = RunOutcome::Done(42);
        assert_eq!(
            serde_json::to_string(&done).unwrap(),
            r#"{"outcome":"Done","value":42}"#
        );
        let failed: RunOutcome<(), std::io::Error> = RunOutcome::Failed {
            attempt: 2,
            reason: "disk full".into(),
            panicked: false,
            error: Some(std::io::Error::other("disk full")),
        };
        assert_eq!(
            serde_json::to_string(&failed).unwrap(),
            r#"{"outcome":"Failed","attempt":2,"reason":"disk full","panicked":false}"#
        );
        let unconfirmed: RunOutcome<&str> = RunOutcome::DoneUnconfirmed {
            attempt: 1,
            value: "sent",
            kind: ErrorKind::OutcomeUnknown,
            reason: "timed out".into(),
        };
        let json = serde_json::to_value(&unconfirmed).unwrap();
        assert_eq!(json["outcome"], "DoneUnconfirmed");
        assert_eq!(json["value"], "sent");
        assert_eq!(
            json["kind"],
            serde_json::to_value(ErrorKind::OutcomeUnknown).unwrap()
        );
    }
}
