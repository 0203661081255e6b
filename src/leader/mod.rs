//! Leader election: one leader at a time per election name, a term that strictly increases and
//! doubles as the fencing token, renewals at a third of the lease, and work that is stopped
//! before anyone else can lead.
//!
//! - [`keys`]: the key layout (`baton:leader:{K}`, `…:fence`, `…:events`).
//! - [`options`]: [`ElectionOptions`] (lease, stop timeout, name; validated, serde).
//! - [`Leaders`]: the handle ([`Client::leaders`](crate::Client::leaders)).
//! - [`Elector`]: [`Elector::campaign`], [`Elector::resign`], [`Elector::is_leader`],
//!   [`Elector::observe`].
//! - [`LeaderWorker`]: the worker form, a stream of [`LeaderEvent`]s (`Elected`, `Renewed`,
//!   `Lost`, `Resigned`, ...) that starts your work once per term and stops it on loss.
//!
//! # Protocol
//! A candidate takes the lease with the lease kernel's fenced acquisition (one script: `SET NX
//! PX`, then the fence becomes `max(old + 1, server time in µs)`): that fence value is the term.
//! The leader renews every `lease / 3` with the kernel's token-checked extension (the
//! watchdog). Standbys sleep until the holder's PTTL runs out (a crashed leader), woken early
//! by a `released` message on the election's channel (a resignation): no fixed poll.
//!
//! On PostgreSQL (feature `postgres`, a `postgres://` client) the lease is a row of
//! `baton_locks` under the same name, taken, renewed and released by the lease kernel's
//! statements (`lease::pg`); the term is the row's fence, by the same rule, and the channel is a
//! notification topic of the client's `LISTEN` connection. The protocol and its decisions are
//! the same code.
//!
//! # Guarantees
//! - Terms strictly increase per election name, also after the fence key was lost (restart
//!   without persistence), unless the server's clock goes back; no two grants share a term.
//! - When renewals fail, the term's [`Term::stop_token`] is cancelled `stop_timeout` before the
//!   lease can end (send time of the last confirmed renewal + lease − max(1 %, 2 ms), on this
//!   host's monotonic clock): work that honours it has stopped before another candidate can be
//!   elected. The worker form reports work still running at the lease's end loudly
//!   ([`LeaderEvent::StopOverdue`], and an error in the log). Only a fencing check on the
//!   resource (pass the term) stops a paused process that ignores it.
//! - A renewal that finds another token ends the term at once.
//! - Work starts once per term, never again on a renewal.

pub mod keys;
pub mod options;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::redis::HubMsg;
use crate::backend::Backend;
use crate::error::{ConfigError, Error, ErrorKind};
use crate::lease::deadline;
use crate::lease::lock::{self as kernel, Grant, Stored};
use crate::lease::pending::{self, Pending};
use crate::lease::watchdog::{self, LeaseState, Watch};
use crate::util::backoff::Backoff;
use crate::util::lock;
use crate::util::time::after;
use crate::util::token::{default_worker_name, new_token};
use crate::util::wake::{WakeOne, Woken};

use keys::ElectionKeys;
pub use options::{ElectionOptions, ElectionOptionsBuilder};

/// Leader election on one client's connections. Get it from
/// [`Client::leaders`](crate::Client::leaders); cheap to clone.
#[derive(Clone)]
pub struct Leaders {
    backend: Backend,
    prefix: Arc<str>,
}

impl std::fmt::Debug for Leaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaders")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Leaders {
    /// Elections on `backend` (the client façade's only way in).
    pub(crate) fn new(backend: Backend) -> Self {
        Leaders {
            backend,
            prefix: Arc::from(crate::util::names::DEFAULT_PREFIX),
        }
    }

    /// The same handle with keys under another prefix (`{prefix}leader:{K}`).
    ///
    /// # Errors
    /// A [`ConfigError`] unless `prefix` ends with `:`, is 1..=1024 bytes, not blank and free
    /// of `{` and `}`.
    pub fn with_prefix(&self, prefix: &str) -> Result<Leaders, ConfigError> {
        crate::util::names::check_prefix(prefix)?;
        Ok(Leaders {
            backend: self.backend.clone(),
            prefix: Arc::from(prefix),
        })
    }

    /// The key prefix in use. Defaults to `baton:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn election(&self, key: &str, opts: &ElectionOptions) -> Result<Arc<Election>, Error> {
        crate::util::names::check_name("key", key)?;
        let name: Arc<str> = match &opts.name {
            Some(n) => Arc::from(n.as_str()),
            None => default_worker_name(),
        };
        let keys = Arc::new(ElectionKeys::new(&self.prefix, key));
        Ok(Arc::new(Election {
            backend: self.backend.clone(),
            keys,
            key: key.to_string(),
            name,
            opts: opts.clone(),
        }))
    }

    /// A candidate in election `key`.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name.
    pub fn elector(&self, key: &str, opts: &ElectionOptions) -> Result<Elector, Error> {
        Ok(Elector {
            election: self.election(key, opts)?,
            current: Arc::new(Mutex::new(None)),
            campaigning: tokio::sync::Mutex::new(()),
        })
    }

    /// Who leads election `key`, as it changes: a stream of [`Observed`], starting with the
    /// state now. Re-reads when a leader is elected or resigns (pub/sub), when the leader's
    /// lease would run out, after a reconnect, and every 10 s as a safety net.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name.
    pub fn observe(&self, key: &str) -> Result<Observer, Error> {
        let election = self.election(key, &ElectionOptions::default())?;
        Ok(Observer::start(election))
    }

    /// The worker form without work: campaigns, leads, renews and campaigns again after a
    /// loss, reporting it all as [`LeaderEvent`]s. Start your work on
    /// [`LeaderEvent::Elected`] and stop it when that term's [`Term::stop_token`] fires.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name.
    pub fn start(&self, key: &str, opts: &ElectionOptions) -> Result<LeaderWorker, Error> {
        self.spawn_worker(key, opts, None)
    }

    /// The worker form with work: like [`Leaders::start`], and runs `work(term)` once per term
    /// (never again on a renewal). When the term must end (renewals failing, a renewal that
    /// found another token, [`LeaderWorker::resign`]) the term's [`Term::stop_token`] is
    /// cancelled and the worker waits for `work` to return before the lease can pass on; a
    /// work that has not returned by the lease's end is aborted at its next `.await` and
    /// reported ([`LeaderEvent::StopOverdue`], and an error in the log). A `work` that returns
    /// by itself ends the leadership: the worker resigns and the stream ends with
    /// [`LeaderEvent::Resigned`].
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name.
    pub fn lead<F, Fut>(
        &self,
        key: &str,
        opts: &ElectionOptions,
        work: F,
    ) -> Result<LeaderWorker, Error>
    where
        F: FnMut(Term) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut work = work;
        let boxed: WorkFn = Box::new(move |t| Box::pin(work(t)));
        self.spawn_worker(key, opts, Some(boxed))
    }

    fn spawn_worker(
        &self,
        key: &str,
        opts: &ElectionOptions,
        work: Option<WorkFn>,
    ) -> Result<LeaderWorker, Error> {
        let election = self.election(key, opts)?;
        let (tx, rx) = mpsc::channel(EVENT_BUFFER);
        let resign = CancellationToken::new();
        let shared = Arc::new(WorkerShared::default());
        let task = WorkerTask {
            election: election.clone(),
            events: tx,
            resign: resign.clone(),
            shared: shared.clone(),
        };
        election.backend.tracker().spawn(task.run(work));
        Ok(LeaderWorker {
            rx,
            resign,
            shared,
            done: false,
        })
    }
}

type WorkFn = Box<dyn FnMut(Term) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Events buffered for a reader; beyond that `Renewed` ones are dropped.
const EVENT_BUFFER: usize = 64;

/// One election, as one candidate takes part in it.
struct Election {
    backend: Backend,
    keys: Arc<ElectionKeys>,
    key: String,
    name: Arc<str>,
    opts: ElectionOptions,
}

/// A term this process holds: what the renewals and the release need.
///
/// Dropped without [`Election::release`] (a campaign dropped right after its grant, a worker
/// stopped mid-campaign), it stops renewing and releases by token in the background: a grant
/// nobody knows of must not be kept alive by its watchdog.
struct Held {
    term: Term,
    /// The lease's value: this term's token and the candidate's name.
    value: String,
    /// Stops the watchdog.
    watchdog: CancellationToken,
    backend: Backend,
    keys: Arc<ElectionKeys>,
    /// Set once a release was sent (or handed to the background).
    let_go: std::sync::atomic::AtomicBool,
}

impl Held {
    /// Stops renewing; `true` the first time (the caller then releases).
    fn stop_renewing(&self) -> bool {
        self.watchdog.cancel();
        !self.let_go.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Stops renewing and releases by token in the background (once).
    fn let_go(&self) {
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
    /// One try: the term, or the leader's PTTL.
    async fn try_once(&self) -> Result<Result<Held, Option<Duration>>, Error> {
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
                let state = LeaseState::new(deadline(sent, self.opts.lease));
                let stop = CancellationToken::new();
                let held = Held {
                    term: Term {
                        number: fence,
                        name: self.name.clone(),
                        state: state.clone(),
                        stop,
                        reason: Arc::new(Mutex::new(None)),
                    },
                    value,
                    watchdog: CancellationToken::new(),
                    backend: self.backend.clone(),
                    keys: self.keys.clone(),
                    let_go: std::sync::atomic::AtomicBool::new(false),
                };
                watchdog::spawn(
                    &self.backend,
                    Watch {
                        lease: self.keys.lease.clone(),
                        value: held.value.clone(),
                        ttl: self.opts.lease,
                        sent,
                        refresh: vec![self.keys.fence.clone()],
                        retention: kernel::fence_ttl(self.opts.lease),
                        hold_until: None,
                    },
                    state,
                    held.watchdog.clone(),
                );
                tracing::info!(key = %self.key, term = fence, name = %self.name, "elected");
                // The test seam: a campaign can be dropped here, granted but not yet returned.
                self.backend.before_exec("leader: granted").await;
                // Observers learn of it at once; best effort (they re-read on a reconnect and
                // on a timer too), and off the new leader's path: sent by a client task
                // without waiting for the reply (one round trip less before `campaign`
                // returns).
                self.backend.notify_in_background(
                    &self.keys.lease,
                    &self.keys.channel,
                    "elected",
                    limit,
                );
                Ok(Ok(held))
            }
        }
    }

    /// Campaigns until elected. Transient errors are passed to `on_error` and retried with
    /// backoff; others are returned.
    async fn campaign(&self, on_error: &mut (dyn FnMut(&Error) + Send)) -> Result<Held, Error> {
        let mut backoff = Backoff::new(Duration::from_secs(1));
        let mut group: Option<WakeOne> = None;
        let mut woken: Option<Woken> = None;
        loop {
            if let Some(stored) = group.as_ref().and_then(WakeOne::take_stored) {
                match woken {
                    None => woken = Some(stored),
                    Some(_) => stored.used(),
                }
            }
            let outcome = self.try_once().await;
            if let Some(w) = woken.take() {
                w.used();
            }
            let pttl = match after_try(&outcome) {
                CampaignStep::Elected => match outcome {
                    Ok(Ok(held)) => return Ok(held),
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
            match &group {
                Some(g) if g.closed() => {
                    group = None;
                    tokio::time::sleep(nap).await;
                }
                Some(g) => woken = g.wait(nap).await,
                None => tokio::time::sleep(nap).await,
            }
        }
    }

    /// Stops renewing `held` and releases its lease by token (waking standbys). `Ok(false)`:
    /// it was no longer ours.
    async fn release(&self, held: &Held) -> Result<bool, Error> {
        held.stop_renewing();
        let limit = after(Instant::now(), self.backend.response_timeout());
        let ours = self
            .backend
            .release(&self.keys.lease, &self.keys.channel, &held.value, limit)
            .await?;
        tracing::info!(key = %self.key, term = held.term.number, ours, "resigned");
        Ok(ours)
    }

    /// Watches a held term until it must stop; returns why. `on_renew` sees each confirmed
    /// renewal's new deadline. Cancel safe.
    async fn supervise(&self, held: &Held, on_renew: &mut (dyn FnMut(Instant) + Send)) -> String {
        let state = &held.term.state;
        let mut deadlines = state.watch_deadline();
        let stop_timeout = self.opts.stop_timeout;
        loop {
            let d = *deadlines.borrow_and_update();
            tokio::select! {
                biased;
                _ = held.term.stop.cancelled() => {
                    return held.term.stop_reason().unwrap_or_else(|| "the term ended".into());
                }
                _ = state.lost().cancelled() => {
                    return state.reason().unwrap_or_else(|| "the lease was lost".into());
                }
                _ = self.backend.cancel().cancelled() => {
                    return "the client shut down; the lease is no longer renewed".into();
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

/// What a candidate does after one try ([`Election::try_once`]); shared with the model checker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CampaignStep {
    /// Granted: it leads.
    Elected,
    /// Someone leads: wait for the lease's PTTL (or a resignation's message).
    Standby { pttl: Option<Duration> },
    /// A transient error: try again after a backoff (a grant whose reply was lost is released
    /// by token meanwhile).
    Retry,
    /// An error retrying cannot fix.
    Fail,
}

/// The campaign's decision on one try's outcome.
pub(crate) fn after_try<T>(outcome: &Result<Result<T, Option<Duration>>, Error>) -> CampaignStep {
    match outcome {
        Ok(Ok(_)) => CampaignStep::Elected,
        Ok(Err(pttl)) => CampaignStep::Standby { pttl: *pttl },
        Err(e) if e.is_retryable() => CampaignStep::Retry,
        Err(_) => CampaignStep::Fail,
    }
}

/// When a term's work is told to stop unless a renewal moves `deadline` first: `stop_timeout`
/// before the lease can end.
pub(crate) fn stop_at(deadline: Instant, stop_timeout: Duration) -> Instant {
    deadline.checked_sub(stop_timeout).unwrap_or(deadline)
}

/// Whether a term's work must stop at `now`, the lease's deadline being `deadline` (the term's
/// supervisor asks when its timer fires; the model checker at each point of a holder's clock).
pub(crate) fn must_stop(now: Instant, deadline: Instant, stop_timeout: Duration) -> bool {
    now >= stop_at(deadline, stop_timeout)
}

/// What the worker does with a term's work it told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handover {
    /// Still running, and the lease is still ours: wait for it (until the deadline).
    Wait,
    /// It stopped: let the lease go.
    Release,
    /// Still running at the lease's end: another candidate may lead now. Report it loudly,
    /// abort it, then let go.
    Overdue,
}

/// The worker's decision on a told-to-stop work at `now`.
pub(crate) fn handover(work_finished: bool, now: Instant, deadline: Instant) -> Handover {
    if work_finished {
        Handover::Release
    } else if now < deadline {
        Handover::Wait
    } else {
        Handover::Overdue
    }
}

/// A term this process leads. Cheap to clone.
#[derive(Clone)]
pub struct Term {
    number: u64,
    name: Arc<str>,
    state: Arc<LeaseState>,
    stop: CancellationToken,
    reason: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("number", &self.number)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Term {
    /// The term: larger than every earlier term of this election.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// The fencing token to pass to the resources this leader writes: the term.
    pub fn fencing_token(&self) -> u64 {
        self.number
    }

    /// The leader's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// When the lease can end at the earliest, on this host's monotonic clock: send time of
    /// the granting (or last confirmed renewing) request + lease − max(1 %, 2 ms).
    pub fn lease_deadline(&self) -> Instant {
        self.state.deadline()
    }

    /// Cancelled when the work of this term must stop: renewals failed until `stop_timeout`
    /// before [`Term::lease_deadline`], a renewal found another token, the leader resigned,
    /// or the client shut down.
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Resolves when [`Term::stop_token`] is cancelled.
    ///
    /// # Cancel safety
    /// Cancel safe.
    pub async fn stopped(&self) {
        self.stop.cancelled().await;
    }

    /// Why the term ended, once it did.
    pub fn stop_reason(&self) -> Option<String> {
        lock(&self.reason).clone()
    }

    fn end(&self, reason: &str) {
        {
            let mut r = lock(&self.reason);
            if r.is_none() {
                *r = Some(reason.to_string());
            }
        }
        self.stop.cancel();
    }

    /// Whether this term still leads as far as this process can tell.
    fn leads(&self) -> bool {
        !self.stop.is_cancelled() && Instant::now() < self.state.deadline()
    }
}

/// A candidate in one election ([`Leaders::elector`]).
///
/// Dropping it while it leads stops renewing and releases the lease in the background. A client
/// that shuts down ([`Client::shutdown`](crate::Client::shutdown)) while its elector leads
/// releases nothing: renewals stop and the lease runs out, as after a crash. Call
/// [`Elector::resign`] first for a handover. (The worker form, [`LeaderWorker`], resigns on a
/// shutdown by itself.)
pub struct Elector {
    election: Arc<Election>,
    current: Arc<Mutex<Option<Arc<Held>>>>,
    /// Held for the whole of a campaign. Two campaigns of one candidate at once would take two
    /// tokens, and the second would then wait as a standby behind the lease the first just took
    /// for the same candidate, until that term ended. Serialized, the second finds the first's
    /// term and returns it. An async mutex because it is held across the campaign's awaits; a
    /// dropped campaign drops its guard, so the next one proceeds.
    campaigning: tokio::sync::Mutex<()>,
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
    /// When renewals fail the term's [`Term::stop_token`] fires `stop_timeout` before the
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
        let held = Arc::new(
            self.election
                .campaign(&mut |e| tracing::debug!(error = %e, "campaign failed; retrying"))
                .await?,
        );
        let term = held.term.clone();
        let previous = lock(&self.current).replace(held.clone());
        if let Some(old) = previous {
            old.term.end("a new term began");
            old.let_go();
        }
        // The term's supervisor: fires the stop token when the term must end, then lets the
        // lease go at its deadline (the work had until then to stop).
        let election = self.election.clone();
        let current = self.current.clone();
        self.election.backend.tracker().spawn(async move {
            let reason = election.supervise(&held, &mut |_| {}).await;
            tracing::warn!(key = %election.key, term = held.term.number, %reason, "leadership lost");
            held.term.end(&reason);
            let gone = election.backend.cancel().clone();
            tokio::select! {
                _ = tokio::time::sleep_until(held.term.state.deadline()) => {}
                // A client that shut down releases nothing: the lease runs out.
                _ = gone.cancelled() => return,
            }
            let mine = {
                let mut cur = lock(&current);
                let mine = cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, &held));
                if mine {
                    *cur = None;
                }
                mine
            };
            if mine {
                held.let_go();
            }
        });
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

    /// Who leads this election, as it changes (see [`Leaders::observe`]).
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

/// What the worker form reports. Every event is `serde::Serialize` (`{"event":"Elected",...}`).
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event")]
#[non_exhaustive]
pub enum LeaderEvent {
    /// This worker leads `term`. The work of the term starts now (once).
    Elected {
        /// The term (the fencing token).
        term: u64,
        /// This candidate's name.
        name: String,
        /// The term's handle: its stop token and lease deadline.
        #[serde(skip)]
        handle: Term,
    },
    /// The lease was renewed (may be dropped when nobody reads).
    Renewed {
        /// The term.
        term: u64,
        /// How long until the lease can end now, in ms.
        lease_left_ms: u64,
    },
    /// The term ended without a resignation: its work was told to stop (and has stopped, or
    /// [`LeaderEvent::StopOverdue`] came first), the lease was let go, and the worker
    /// campaigns again.
    Lost {
        /// The term.
        term: u64,
        /// Why.
        reason: String,
    },
    /// The work did not stop by the lease's end: another candidate may lead while it still
    /// runs (it was aborted at its next `.await`). Only fencing protects the resource now.
    StopOverdue {
        /// The term.
        term: u64,
        /// How long the work had been told to stop, in ms.
        waited_ms: u64,
    },
    /// The worker resigned the term (on [`LeaderWorker::resign`], or when the work returned or
    /// panicked) and woke the standbys; the stream ends.
    Resigned {
        /// The term.
        term: u64,
        /// Why: `resign() was called`, `the work returned`, or `the work panicked: …`.
        reason: String,
    },
    /// Something went wrong. A retryable error is retried and the stream goes on; any other
    /// ends it.
    Error {
        /// The stable classification.
        kind: ErrorKind,
        /// What happened.
        message: String,
        /// Whether the worker retries.
        retryable: bool,
    },
    /// The worker stopped without leading ([`LeaderWorker::resign`] while a standby, or the
    /// client shut down); the stream ends.
    Stopped,
}

impl LeaderEvent {
    /// Whether this event ends the stream.
    pub fn is_terminal(&self) -> bool {
        match self {
            LeaderEvent::Resigned { .. } | LeaderEvent::Stopped => true,
            LeaderEvent::Error { retryable, .. } => !retryable,
            _ => false,
        }
    }

    fn error(e: &Error) -> Self {
        LeaderEvent::Error {
            kind: e.kind(),
            message: e.to_string(),
            retryable: e.is_retryable(),
        }
    }
}

#[derive(Default)]
struct WorkerShared {
    term: Mutex<Option<Term>>,
}

/// The worker form ([`Leaders::start`], [`Leaders::lead`]): a stream of [`LeaderEvent`]s.
/// Dropping it resigns in the background (the work is told to stop first).
pub struct LeaderWorker {
    rx: mpsc::Receiver<LeaderEvent>,
    resign: CancellationToken,
    shared: Arc<WorkerShared>,
    done: bool,
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
struct WorkerTask {
    election: Arc<Election>,
    events: mpsc::Sender<LeaderEvent>,
    resign: CancellationToken,
    shared: Arc<WorkerShared>,
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

    async fn run(self, mut work: Option<WorkFn>) {
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
                Ok(h) => h,
                Err(e) => {
                    tracing::error!(key = %self.election.key, error = %e, "campaign failed");
                    self.emit(LeaderEvent::error(&e)).await;
                    return;
                }
            };
            let term = held.term.clone();
            *lock(&self.shared.term) = Some(term.clone());
            self.emit(LeaderEvent::Elected {
                term: term.number,
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
                        term: term.number,
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
                        term: term.number,
                        reason: "resign() was called".into(),
                    })
                    .await;
                    return;
                }
                TermEnd::WorkDone(reason) => {
                    self.emit(LeaderEvent::Resigned {
                        term: term.number,
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
        let number = term.number;
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
            term = term.number,
            ?waited,
            "the work did not stop by the lease's end: another candidate may lead while it runs; aborting it"
        );
        self.emit(LeaderEvent::StopOverdue {
            term: term.number,
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

/// Who leads an election, as [`Observer`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "observed")]
#[non_exhaustive]
pub enum Observed {
    /// `name` leads in `term`.
    Leader {
        /// The leader's name.
        name: String,
        /// Its term (0 when the fence key was deleted by someone else).
        term: u64,
    },
    /// Nobody leads.
    NoLeader,
    /// The state could not be read (retried; the stream goes on).
    Error {
        /// The stable classification.
        kind: ErrorKind,
        /// What happened.
        message: String,
    },
}

/// A stream of [`Observed`] changes ([`Leaders::observe`]); ends with the client. Each change
/// is reported once (consecutive equal observations are merged).
pub struct Observer {
    rx: mpsc::Receiver<Observed>,
    stop: CancellationToken,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl tokio_stream::Stream for Observer {
    type Item = Observed;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Observed>> {
        self.rx.poll_recv(cx)
    }
}

/// The observer's safety-net re-read interval.
const OBSERVE_REFRESH: Duration = Duration::from_secs(10);

impl Observer {
    fn start(election: Arc<Election>) -> Observer {
        let (tx, rx) = mpsc::channel(EVENT_BUFFER);
        let stop = CancellationToken::new();
        let cancel = election.backend.cancel().clone();
        let task_stop = stop.clone();
        let tracker = election.backend.tracker().clone();
        tracker.spawn(async move {
            tokio::select! {
                _ = task_stop.cancelled() => {}
                _ = cancel.cancelled() => {}
                _ = observe(election, tx) => {}
            }
        });
        Observer { rx, stop }
    }
}

async fn observe(election: Arc<Election>, tx: mpsc::Sender<Observed>) {
    let backend = &election.backend;
    let mut sub = None;
    let mut last: Option<Observed> = None;
    let mut backoff = Backoff::new(Duration::from_secs(1));
    loop {
        if sub.is_none() {
            let limit = backend.connect_timeout();
            if let Ok(Ok(s)) =
                tokio::time::timeout(limit, backend.subscribe(&election.keys.channel)).await
            {
                sub = Some(s);
            }
        }
        let (seen, next) = match read_leader(&election).await {
            Ok((seen, pttl)) => {
                backoff.reset();
                let next = pttl
                    .map(|p| p + Duration::from_millis(1))
                    .unwrap_or(OBSERVE_REFRESH)
                    .min(OBSERVE_REFRESH);
                (seen, next)
            }
            Err(e) => (
                Observed::Error {
                    kind: e.kind(),
                    message: e.to_string(),
                },
                backoff.next_delay(),
            ),
        };
        if last.as_ref() != Some(&seen) {
            if tx.send(seen.clone()).await.is_err() {
                return;
            }
            last = Some(seen);
        }
        match &mut sub {
            Some(s) => {
                match tokio::time::timeout(next, s.rx.recv()).await {
                    // A message (elected, released), a reconnect, or the timer: read again.
                    Ok(Some(HubMsg::Message(_) | HubMsg::Reconnected)) | Err(_) => {}
                    // The hub is gone: fall back to timers.
                    Ok(None) => sub = None,
                }
            }
            None => tokio::time::sleep(next).await,
        }
    }
}

/// Reads who leads: the lease, the term (the fence) and the lease's remaining time, in one
/// atomic read (a `MULTI` on Redis, one statement on PostgreSQL).
async fn read_leader(election: &Election) -> Result<(Observed, Option<Duration>), Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_resigned_stopped_and_fatal_errors_end_the_stream() {
        assert!(LeaderEvent::Stopped.is_terminal());
        assert!(LeaderEvent::Resigned {
            term: 1,
            reason: String::new()
        }
        .is_terminal());
        assert!(!LeaderEvent::Lost {
            term: 1,
            reason: String::new()
        }
        .is_terminal());
        assert!(!LeaderEvent::Error {
            kind: ErrorKind::Connection,
            message: String::new(),
            retryable: true
        }
        .is_terminal());
        assert!(LeaderEvent::Error {
            kind: ErrorKind::Permission,
            message: String::new(),
            retryable: false
        }
        .is_terminal());
    }

    #[test]
    fn the_work_is_told_to_stop_before_the_lease_can_end_and_waited_for_until_then() {
        let d = Instant::now() + Duration::from_secs(10);
        let stop = Duration::from_secs(2);
        assert_eq!(stop_at(d, stop), d - stop);
        assert!(!must_stop(d - stop - Duration::from_millis(1), d, stop));
        assert!(must_stop(d - stop, d, stop));
        assert!(must_stop(d + stop, d, stop));
        assert_eq!(handover(true, d + stop, d), Handover::Release);
        assert_eq!(handover(false, d - stop, d), Handover::Wait);
        assert_eq!(handover(false, d, d), Handover::Overdue);
        let held: Result<Result<(), Option<Duration>>, Error> = Ok(Err(None));
        assert_eq!(after_try(&held), CampaignStep::Standby { pttl: None });
        let lost: Result<Result<(), Option<Duration>>, Error> = Err(Error::Timeout { during: "x" });
        assert_eq!(after_try(&lost), CampaignStep::Retry);
    }

    #[test]
    fn events_serialize_without_their_handles() {
        let ev = LeaderEvent::Renewed {
            term: 7,
            lease_left_ms: 9_000,
        };
        assert_eq!(
            serde_json::to_string(&ev).unwrap(),
            r#"{"event":"Renewed","term":7,"lease_left_ms":9000}"#
        );
        let o = Observed::Leader {
            name: "a".into(),
            term: 3,
        };
        assert_eq!(
            serde_json::to_string(&o).unwrap(),
            r#"{"observed":"Leader","name":"a","term":3}"#
        );
    }
}
