//! [`Elector`]: a candidate that campaigns, leads and resigns when asked.

use std::sync::{Arc, Mutex};

use super::election::{Election, Held};
use super::{Observer, Term};
use crate::error::Error;
use crate::util::lock;

///
/// Dropping it while it leads stops renewing and releases the lease in the background. A client
/// that shuts down ([`Client::shutdown`](crate::Client::shutdown)) while its elector leads
/// resigns the term before `shutdown` returns: the work's [`lost_token`](crate::HeldLease::lost_token) fires and the
/// lease is released, which wakes a standby at once. (The worker form,
/// [`LeaderWorker`](super::LeaderWorker), does the same.)
pub struct Elector {
    pub(super) election: Arc<Election>,
    pub(super) current: Arc<Mutex<Option<Arc<Held>>>>,
    /// Held for the whole of a campaign. Two campaigns of one candidate at once would take two
    /// tokens, and the second would then wait as a standby behind the lease the first just took
    /// for the same candidate, until that term ended. Serialized, the second finds the first's
    /// term and returns it. An async mutex because it is held across the campaign's awaits; a
    /// dropped campaign drops its guard, so the next one proceeds.
    pub(super) campaigning: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("key", &self.election.key)
            .field("name", &self.election.name)
            .finish_non_exhaustive()
    }
}

impl Elector {
    /// Campaigns until this candidate leads and returns the term (at once if it leads
    /// already). Standbys wait for the leader's lease to run out, woken early when it resigns.
    /// Transient errors are retried. Concurrent campaigns of one elector take turns: the later
    /// ones return the term the first one won.
    ///
    /// When renewals fail the term's [`lost_token`](crate::HeldLease::lost_token) fires `stop_timeout` before the
    /// lease can end; the lease is then released at that end (or at once by
    /// [`Elector::resign`]), and a later `campaign` starts a new term.
    ///
    /// # Errors
    /// Non-retryable errors ([`Error::CorruptState`] when the fence holds something baton
    /// never writes, ACL denials).
    ///
    /// # Cancel safety
    /// A dropped campaign never leaves a lease behind: one granted with its reply lost is
    /// released by token in the background.
    pub async fn campaign(&self) -> Result<Term, Error> {
        let _turn = self.campaigning.lock().await;
        let ended = {
            let mut cur = lock(&self.current);
            match cur.as_ref() {
                Some(held) if held.term.leads() => return Ok(held.term.clone()),
                Some(_) => cur.take(),
                None => None,
            }
        };
        // A term that ended but still holds its lease (until its deadline) would make this
        // candidate wait for itself: let it go first.
        if let Some(old) = ended {
            if let Err(e) = self.election.release(&old).await {
                tracing::debug!(error = %e, "releasing the ended term failed; it runs out");
            }
        }
        // The elector's span: the campaign, the term's watchdog and its supervisor run in it.
        let span = tracing::info_span!(
            "baton_elector",
            key = %self.election.key,
            node = %self.election.name,
            fencing_token = tracing::field::Empty,
            attempt = tracing::field::Empty,
        );
        let mut on_error = |e: &Error| tracing::debug!(error = %e, "campaign failed; retrying");
        let campaign = self.election.campaign(&mut on_error);
        let (held, tasks) = tracing::Instrument::instrument(campaign, span.clone()).await?;
        let held = Arc::new(held);
        let term = held.term.clone();
        span.record("fencing_token", term.fencing_token);
        let previous = lock(&self.current).replace(held.clone());
        if let Some(old) = previous {
            old.term.end("a new term began");
            old.let_go();
        }
        // The term's supervisor: fires the stop token when the term must end, then lets the
        // lease go at its deadline (the work had until then to stop). It runs in the term's
        // one task, beside the watchdog and the `elected` notification (`TermTasks`).
        let election = self.election.clone();
        let current = self.current.clone();
        let supervisor = async move {
            let reason = election.supervise(&held, &mut |_| {}).await;
            tracing::warn!(key = %election.key, term = held.term.fencing_token, %reason, "leadership lost");
            held.term.end(&reason);
            let gone = election.backend.cancel().clone();
            let shut_down = tokio::select! {
                biased;
                _ = gone.cancelled() => true,
                _ = tokio::time::sleep_until(held.term.state.deadline()) => false,
            };
            let mine = {
                let mut cur = lock(&current);
                let mine = cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, &held));
                if mine {
                    *cur = None;
                }
                mine
            };
            if !mine {
                return;
            }
            if shut_down {
                // A shutdown hands over like a resignation, so a standby leads at once rather
                // than after the lease. Awaited here, in a task of the client's tracker, so
                // `Client::shutdown` returns after the release.
                if let Err(e) = election.release(&held).await {
                    tracing::debug!(error = %e, "releasing on shutdown failed; the lease runs out");
                }
            } else {
                held.let_go();
            }
        };
        self.election
            .backend
            .tracker()
            .spawn(tracing::Instrument::instrument(
                async move {
                    tokio::join!(tasks, supervisor);
                },
                span,
            ));
        Ok(term)
    }

    /// Stops leading: fires the term's stop token, stops renewing and releases the lease by
    /// token, which wakes the standbys at once. Stop your work before calling it.
    /// `Ok(false)`: this candidate did not lead (or its lease had passed on).
    ///
    /// # Errors
    /// Connection errors and timeouts: the release may not have applied; the lease then runs
    /// out by itself.
    pub async fn resign(&self) -> Result<bool, Error> {
        let Some(held) = lock(&self.current).take() else {
            return Ok(false);
        };
        held.term.end("resigned");
        self.election.release(&held).await
    }

    /// Whether this candidate leads now, as far as it can tell: it holds a term whose stop
    /// token has not fired and whose lease deadline has not passed.
    pub fn is_leader(&self) -> bool {
        lock(&self.current).as_ref().is_some_and(|h| h.term.leads())
    }

    /// The term this candidate leads, if it does.
    pub fn term(&self) -> Option<Term> {
        lock(&self.current)
            .as_ref()
            .filter(|h| h.term.leads())
            .map(|h| h.term.clone())
    }

    /// Who leads this election, as it changes (see [`Leaders::observe`](crate::Leaders::observe)).
    pub fn observe(&self) -> Observer {
        Observer::start(self.election.clone())
    }
}

impl Drop for Elector {
    fn drop(&mut self) {
        if let Some(held) = lock(&self.current).take() {
            held.term.end("the elector was dropped");
            held.let_go();
        }
    }
}
