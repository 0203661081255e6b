//! [`LeaderWorker`]: the worker form, which campaigns, leads, renews and campaigns again,
//! running the work once per term and stopping it before the lease can pass on.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::election::{Election, Held};
use super::protocol::{handover, Handover};
use super::{LeaderEvent, Term};
use crate::error::Error;
use crate::util::lock;

/// The work of the worker form, run once per term.
pub(super) type WorkFn = Box<dyn FnMut(Term) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

#[derive(Default)]
pub(super) struct WorkerShared {
    pub(super) term: Mutex<Option<Term>>,
}

/// The worker form ([`Leaders::start`](crate::Leaders::start), [`Leaders::lead`](crate::Leaders::lead)): a stream of [`LeaderEvent`]s.
/// Dropping it resigns in the background (the work is told to stop first).
pub struct LeaderWorker {
    pub(super) rx: mpsc::Receiver<LeaderEvent>,
    pub(super) resign: CancellationToken,
    pub(super) shared: Arc<WorkerShared>,
    pub(super) done: bool,
}

impl std::fmt::Debug for LeaderWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderWorker").finish_non_exhaustive()
    }
}

impl LeaderWorker {
    /// Hands over: the work is told to stop, the worker waits for it (bounded by the lease),
    /// releases the lease, which wakes a standby at once, and the stream ends with
    /// [`LeaderEvent::Resigned`] ([`LeaderEvent::Stopped`] when it did not lead).
    pub fn resign(&self) {
        self.resign.cancel();
    }

    /// Whether this worker leads now, as far as it can tell.
    pub fn is_leader(&self) -> bool {
        lock(&self.shared.term).as_ref().is_some_and(Term::leads)
    }

    /// The term this worker leads, if it does.
    pub fn term(&self) -> Option<Term> {
        lock(&self.shared.term)
            .as_ref()
            .filter(|t| t.leads())
            .cloned()
    }

    /// The next event; `None` once the stream ended.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn next_event(&mut self) -> Option<LeaderEvent> {
        if self.done {
            return None;
        }
        let ev = self.rx.recv().await;
        if ev.as_ref().map_or(true, LeaderEvent::is_terminal) {
            self.done = true;
        }
        ev
    }
}

impl tokio_stream::Stream for LeaderWorker {
    type Item = LeaderEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LeaderEvent>> {
        if self.done {
            return Poll::Ready(None);
        }
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(ev) = &polled {
            if ev.as_ref().map_or(true, LeaderEvent::is_terminal) {
                self.done = true;
            }
        }
        polled
    }
}

impl Drop for LeaderWorker {
    fn drop(&mut self) {
        self.resign.cancel();
    }
}

/// The worker's task.
pub(super) struct WorkerTask {
    pub(super) election: Arc<Election>,
    pub(super) events: mpsc::Sender<LeaderEvent>,
    pub(super) resign: CancellationToken,
    pub(super) shared: Arc<WorkerShared>,
}

/// How a term ended, for the worker.
enum TermEnd {
    /// It must stop: why.
    Lost(String),
    /// Resign was asked for.
    Resign,
    /// The work returned by itself (or panicked: the message).
    WorkDone(String),
}

impl WorkerTask {
    async fn emit(&self, ev: LeaderEvent) {
        // A reader that went away: the `resign` token (fired by the dropped worker) ends us.
        let _ = self.events.send(ev).await;
    }

    pub(super) async fn run(self, mut work: Option<WorkFn>) {
        let client_gone = self.election.backend.cancel().clone();
        loop {
            let events = self.events.clone();
            let mut on_error = move |e: &Error| {
                let _ = events.try_send(LeaderEvent::error(e));
            };
            let held = tokio::select! {
                biased;
                _ = self.resign.cancelled() => {
                    self.emit(LeaderEvent::Stopped).await;
                    return;
                }
                _ = client_gone.cancelled() => {
                    self.emit(LeaderEvent::Stopped).await;
                    return;
                }
                h = self.election.campaign(&mut on_error) => h,
            };
            let held = match held {
                Ok((h, tasks)) => {
                    // The watchdog and the `elected` notification, in one task of the client.
                    self.election
                        .backend
                        .tracker()
                        .spawn(tracing::Instrument::in_current_span(tasks));
                    h
                }
                Err(e) => {
                    tracing::error!(key = %self.election.key, error = %e, "campaign failed");
                    self.emit(LeaderEvent::error(&e)).await;
                    return;
                }
            };
            let term = held.term.clone();
            *lock(&self.shared.term) = Some(term.clone());
            self.emit(LeaderEvent::Elected {
                term: term.fencing_token,
                name: term.name.to_string(),
                handle: term.clone(),
            })
            .await;
            let end = self.lead(&held, work.as_mut()).await;
            *lock(&self.shared.term) = None;
            let released = self.election.release(&held).await;
            if let Err(e) = &released {
                tracing::warn!(key = %self.election.key, error = %e, "release failed; the lease runs out by itself");
            }
            match end {
                TermEnd::Lost(reason) => {
                    self.emit(LeaderEvent::Lost {
                        term: term.fencing_token,
                        reason,
                    })
                    .await;
                    if self.resign.is_cancelled() || client_gone.is_cancelled() {
                        self.emit(LeaderEvent::Stopped).await;
                        return;
                    }
                }
                TermEnd::Resign => {
                    self.emit(LeaderEvent::Resigned {
                        term: term.fencing_token,
                        reason: "resign() was called".into(),
                    })
                    .await;
                    return;
                }
                TermEnd::WorkDone(reason) => {
                    self.emit(LeaderEvent::Resigned {
                        term: term.fencing_token,
                        reason,
                    })
                    .await;
                    return;
                }
            }
        }
    }

    /// Leads one term: runs the work, reports renewals, and returns once the term is over
    /// and its work has stopped (or was reported overdue).
    async fn lead(&self, held: &Held, work: Option<&mut WorkFn>) -> TermEnd {
        let term = held.term.clone();
        let mut handle = work.map(|w| tokio::spawn(w(term.clone())));
        let events = self.events.clone();
        let number = term.fencing_token;
        let mut on_renew = move |d: Instant| {
            let left = d.saturating_duration_since(Instant::now());
            // Renewals are dropped rather than waited for when nobody reads.
            let _ = events.try_send(LeaderEvent::Renewed {
                term: number,
                lease_left_ms: crate::util::time::ms(left),
            });
        };
        let end = tokio::select! {
            biased;
            reason = self.election.supervise(held, &mut on_renew) => TermEnd::Lost(reason),
            _ = self.resign.cancelled() => TermEnd::Resign,
            why = join_opt(&mut handle) => TermEnd::WorkDone(why),
        };
        let reason = match &end {
            TermEnd::Lost(r) => {
                tracing::warn!(key = %self.election.key, term = number, reason = %r, "leadership lost; stopping the work");
                r.clone()
            }
            TermEnd::Resign => "resigned".into(),
            TermEnd::WorkDone(why) => why.clone(),
        };
        term.end(&reason);
        if let Some(h) = handle.take() {
            if !h.is_finished() {
                self.stop_work(h, &term).await;
            }
        }
        end
    }

    /// Waits for a told-to-stop work until the lease's end; past it, reports it loudly and
    /// aborts it.
    async fn stop_work(&self, mut h: tokio::task::JoinHandle<()>, term: &Term) {
        let told = Instant::now();
        loop {
            // A renewal confirmed meanwhile moves the deadline: the work may take that long.
            let end = term.state.deadline();
            match handover(h.is_finished(), Instant::now(), end) {
                Handover::Release => return,
                Handover::Wait => {
                    let _ = tokio::time::timeout_at(end, &mut h).await;
                }
                Handover::Overdue => break,
            }
        }
        let waited = told.elapsed();
        tracing::error!(
            key = %self.election.key,
            term = term.fencing_token,
            ?waited,
            "the work did not stop by the lease's end: another candidate may lead while it runs; aborting it"
        );
        self.emit(LeaderEvent::StopOverdue {
            term: term.fencing_token,
            waited_ms: crate::util::time::ms(waited),
        })
        .await;
        h.abort();
        let _ = tokio::time::timeout(self.election.opts.stop_timeout, h).await;
    }
}

/// Waits for the work to end by itself: why (it returned, or what its panic said).
async fn join_opt(h: &mut Option<tokio::task::JoinHandle<()>>) -> String {
    match h {
        Some(h) => match h.await {
            Ok(()) => "the work returned".into(),
            Err(e) if e.is_panic() => {
                let why = crate::util::panic_message(e.into_panic());
                tracing::error!(%why, "the leader's work panicked; resigning");
                why
            }
            Err(_) => "the work was cancelled".into(),
        },
        None => std::future::pending().await,
    }
}
