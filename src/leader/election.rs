//! One election as one candidate takes part in it: a try, the campaign until elected, the
//! supervision of a held term and its release. The elector and the worker are built on it.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::keys::{self, ElectionKeys};
use super::options::ElectionOptions;
use super::protocol::{after_try, must_stop, stop_at, CampaignStep};
use super::{Observed, Term};
use crate::backend::Backend;
use crate::error::Error;
use crate::lease::deadline;
use crate::lease::lock::{self as kernel, Grant, Stored};
use crate::lease::pending::{self, Pending};
use crate::lease::watchdog::{self, LeaseState, TakenBy, Watch};
use crate::util::backoff::Backoff;
use crate::util::metrics::{self, primitive, transition, Labels};
use crate::util::time::after;
use crate::util::token::new_token;
use crate::util::wake::{WakeOne, Woken};

/// What a new term runs besides its supervisor: the watchdog and the `elected` notification,
/// as one future, to be polled to its end in the one task the caller spawns for the term. One
/// task per term, not three: the first task spawned while a runtime thread runs the campaign
/// waits in that thread's next-task slot, and each one after it wakes a parked thread, which
/// costs the new leader's `campaign()` tens of µs each on a small machine. Dropped unpolled
/// (a campaign dropped right after its grant), nothing renews and [`Held`]'s drop releases.
pub(super) type TermTasks = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// One election, as one candidate takes part in it.
pub(super) struct Election {
    pub(super) backend: Backend,
    pub(super) keys: Arc<ElectionKeys>,
    pub(super) key: String,
    pub(super) name: Arc<str>,
    pub(super) opts: ElectionOptions,
}

/// A term this process holds: what the renewals and the release need.
///
/// Dropped without [`Election::release`] (a campaign dropped right after its grant, a worker
/// stopped mid-campaign), it stops renewing and releases by token in the background: a grant
/// nobody knows of must not be kept alive by its watchdog.
pub(super) struct Held {
    pub(super) term: Term,
    /// The lease's value: this term's token and the candidate's name.
    pub(super) value: String,
    /// Stops the watchdog.
    pub(super) watchdog: CancellationToken,
    pub(super) backend: Backend,
    pub(super) keys: Arc<ElectionKeys>,
    /// Set once a release was sent (or handed to the background).
    pub(super) let_go: std::sync::atomic::AtomicBool,
}

impl Held {
    /// Stops renewing; `true` the first time (the caller then releases).
    pub(super) fn stop_renewing(&self) -> bool {
        self.watchdog.cancel();
        let first = !self.let_go.swap(true, std::sync::atomic::Ordering::AcqRel);
        if first {
            // Every term ends here once, whichever way (resigned, lost, replaced, dropped), in
            // the elector and the worker form alike: its hold ends (unless a loss ended it
            // first), and leadership changes.
            self.term.state.released();
            metrics::count(metrics::Count::LeaderChanges, self.backend.label());
        }
        first
    }

    /// Stops renewing and releases by token in the background (once).
    pub(super) fn let_go(&self) {
        if self.stop_renewing() {
            pending::release_in_background(&self.backend, &self.keys, self.value.clone());
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.let_go();
    }
}

impl Election {
    /// The labels of this election's metrics.
    pub(super) fn labels(&self) -> Labels {
        Labels::new(primitive::LEADER, self.backend.label())
    }

    /// One try: the term and what it must run ([`TermTasks`]), or the leader's PTTL.
    pub(super) async fn try_once(
        &self,
    ) -> Result<Result<(Held, TermTasks), Option<Duration>>, Error> {
        let value = keys::lease_value(&new_token(), &self.name);
        // Armed before the request leaves: an error, a timeout or a dropped future releases
        // the lease by token unless we learn the outcome.
        let mut pending = Pending::arm(&self.backend, &self.keys, &value);
        let limit = after(Instant::now(), self.backend.response_timeout());
        let req = kernel::Acquire {
            lock: &self.keys.lease,
            fence: &self.keys.fence,
            token: &value,
            ttl: self.opts.lease,
        };
        let grant = self.backend.acquire(&req, &self.keys.channel, limit).await;
        if !kernel::orphaned(&grant) {
            pending.disarm();
        }
        match grant? {
            Grant::Held { pttl } => Ok(Err(pttl)),
            Grant::Granted { fence, sent } => {
                let labels = self.labels();
                labels.transition(transition::GRANT, sent);
                let state = LeaseState::new(deadline(sent, self.opts.lease), labels, sent);
                let held = Held {
                    term: Term::new(fence, self.name.clone(), &self.key, state.clone()),
                    value,
                    watchdog: CancellationToken::new(),
                    backend: self.backend.clone(),
                    keys: self.keys.clone(),
                    let_go: std::sync::atomic::AtomicBool::new(false),
                };
                let watchdog = watchdog::task(
                    &self.backend,
                    Watch {
                        lease: self.keys.lease.clone(),
                        value: held.value.clone(),
                        ttl: self.opts.lease,
                        sent,
                        refresh: vec![self.keys.fence.clone()],
                        retention: kernel::fence_ttl(self.opts.lease),
                        hold_until: None,
                        taken: Some((self.keys.channel.clone(), TakenBy::Fence(fence))),
                    },
                    state,
                    held.watchdog.clone(),
                );
                tracing::info!(key = %self.key, term = fence, name = %self.name, "elected");
                // The test seam: a campaign can be dropped here, granted but not yet returned.
                self.backend.before_exec("leader: granted").await;
                // Observers learn of it at once; best effort (they re-read on a reconnect and
                // on a timer too), and off the new leader's path: sent from the term's task
                // without waiting for the reply (one round trip less before `campaign`
                // returns).
                let elected = self.backend.notification(
                    &self.keys.lease,
                    &self.keys.channel,
                    "elected",
                    limit,
                );
                let tasks: TermTasks = Box::pin(async move {
                    tokio::join!(elected, watchdog);
                });
                Ok(Ok((held, tasks)))
            }
        }
    }

    /// Campaigns until elected: the term and what it must run ([`TermTasks`]). Transient
    /// errors are passed to `on_error` and retried with backoff; others are returned.
    pub(super) async fn campaign(
        &self,
        on_error: &mut (dyn FnMut(&Error) + Send),
    ) -> Result<(Held, TermTasks), Error> {
        let mut backoff = Backoff::new(Duration::from_secs(1));
        let mut group: Option<WakeOne> = None;
        let mut woken: Option<Woken> = None;
        let start = Instant::now();
        // Whether the last wait slept out the leader's lease with no resignation heard: a term
        // won then takes over from a leader that is gone (the metrics' `takeover`).
        let mut slept_out = false;
        loop {
            if let Some(stored) = group.as_ref().and_then(WakeOne::take_stored) {
                match woken {
                    None => woken = Some(stored),
                    Some(_) => stored.used(),
                }
            }
            let takeover = slept_out && woken.is_none();
            let outcome = self.try_once().await;
            if let Some(w) = woken.take() {
                w.used();
            }
            let pttl = match after_try(&outcome) {
                CampaignStep::Elected => match outcome {
                    Ok(Ok(held)) => {
                        self.labels().granted(takeover, start);
                        metrics::count(metrics::Count::LeaderChanges, self.backend.label());
                        return Ok(held);
                    }
                    // `after_try` elects only a grant.
                    _ => continue,
                },
                CampaignStep::Standby { pttl } => {
                    backoff.reset();
                    pttl
                }
                CampaignStep::Retry => {
                    if let Err(e) = &outcome {
                        on_error(e);
                    }
                    tokio::time::sleep(backoff.next_delay()).await;
                    continue;
                }
                CampaignStep::Fail => match outcome {
                    Err(e) => return Err(e),
                    _ => continue,
                },
            };
            if group.is_none() {
                // Best effort: without pub/sub a resignation is noticed at the lease's PTTL.
                let limit = self.backend.connect_timeout();
                if let Ok(Ok(g)) =
                    tokio::time::timeout(limit, self.backend.wake_one(&self.keys.channel)).await
                {
                    group = Some(g);
                    // A resignation between the try and the subscription would be missed.
                    continue;
                }
            }
            // Until the leader's lease runs out (a crashed leader publishes nothing), plus a
            // millisecond so the key has surely expired.
            let nap = match pttl {
                Some(p) => p + Duration::from_millis(1),
                None => {
                    // No TTL, or gone meanwhile: a key that never expires (or is not even a
                    // string) is not baton's doing and would keep every candidate a standby
                    // forever. Say so (a wrong type at once and for good), and look again after
                    // a backoff.
                    match read_leader(self).await {
                        Ok((Observed::Leader { .. }, None)) => on_error(&Error::NoExpiry {
                            key: self.keys.lease.clone(),
                        }),
                        Ok(_) => {}
                        Err(e) if e.is_retryable() => on_error(&e),
                        Err(e) => return Err(e),
                    }
                    backoff.next_delay()
                }
            };
            slept_out = pttl.is_some();
            match &group {
                Some(g) if g.closed() => {
                    group = None;
                    tokio::time::sleep(nap).await;
                }
                Some(g) => woken = g.wait(nap, None).await,
                None => tokio::time::sleep(nap).await,
            }
        }
    }

    /// Stops renewing `held` and releases its lease by token (waking standbys). `Ok(false)`:
    /// it was no longer ours.
    pub(super) async fn release(&self, held: &Held) -> Result<bool, Error> {
        held.stop_renewing();
        let sent = Instant::now();
        let limit = after(sent, self.backend.response_timeout());
        let ours = self
            .backend
            .release(&self.keys.lease, &self.keys.channel, &held.value, limit)
            .await?;
        self.labels().transition(transition::RELEASE, sent);
        tracing::info!(key = %self.key, term = held.term.fencing_token, ours, "resigned");
        Ok(ours)
    }

    /// Watches a held term until it must stop; returns why. `on_renew` sees each confirmed
    /// renewal's new deadline. Cancel safe.
    pub(super) async fn supervise(
        &self,
        held: &Held,
        on_renew: &mut (dyn FnMut(Instant) + Send),
    ) -> String {
        let state = &held.term.state;
        let mut deadlines = state.watch_deadline();
        let stop_timeout = self.opts.stop_timeout;
        loop {
            let d = *deadlines.borrow_and_update();
            tokio::select! {
                biased;
                _ = held.term.core.loss().wait() => {
                    return held.term.core.loss().reason().unwrap_or_else(|| "the term ended".into());
                }
                _ = state.wait_lost() => {
                    return state.reason().unwrap_or_else(|| "the lease was lost".into());
                }
                _ = self.backend.cancel().cancelled() => {
                    return "the client shut down; the lease is released".into();
                }
                _ = tokio::time::sleep_until(stop_at(d, stop_timeout)) => {
                    if must_stop(Instant::now(), state.deadline(), stop_timeout) {
                        return format!(
                            "no renewal was confirmed; the lease can end in {stop_timeout:?}"
                        );
                    }
                }
                changed = deadlines.changed() => {
                    if changed.is_err() {
                        return "the lease's watchdog ended".into();
                    }
                    on_renew(*deadlines.borrow());
                }
            }
        }
    }
}

/// Reads who leads: the lease, the term (the fence) and the lease's remaining time, in one
/// atomic read (a `MULTI` on Redis, one statement on PostgreSQL).
pub(super) async fn read_leader(
    election: &Election,
) -> Result<(Observed, Option<Duration>), Error> {
    let Stored {
        value: lease,
        fence,
        pttl,
    } = election
        .backend
        .read(&election.keys.lease, &election.keys.fence)
        .await
        .map_err(|e| match e {
            Error::Timeout { .. } => Error::Timeout {
                during: "reading who leads",
            },
            e => e,
        })?;
    let Some(value) = lease else {
        return Ok((Observed::NoLeader, None));
    };
    let name = keys::name_of(&value).ok_or_else(|| Error::CorruptState {
        key: election.keys.lease.clone(),
        value: crate::error::preview(&value),
    })?;
    // A fence deleted by someone else leaves the term unknown (0); one baton never wrote is
    // reported.
    let term = match fence.as_deref() {
        None => 0,
        Some(f) => f.parse::<u64>().map_err(|_| Error::CorruptState {
            key: election.keys.fence.clone(),
            value: crate::error::preview(f),
        })?,
    };
    Ok((
        Observed::Leader {
            name: name.to_string(),
            term,
        },
        pttl,
    ))
}
