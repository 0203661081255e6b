//! Leader election: one leader at a time per election name, a term that strictly increases and
//! doubles as the fencing token, renewals at a third of the lease, and work that is stopped
//! before anyone else can lead.
//!
//! - [`keys`]: the key layout (`baton:leader:{K}`, `…:fence`, `…:events`).
//! - [`options`]: [`ElectionOptions`] (lease, stop timeout, name; validated, serde).
//! - `protocol`: the pure decisions (shared with the model checker).
//! - `election`: one election as one candidate takes part in it (try, campaign, supervise).
//! - [`Leaders`]: the handle ([`Client::leaders`](crate::Client::leaders)).
//! - `term`: [`Term`], a term this process leads.
//! - `elector`: [`Elector`]: [`Elector::campaign`], [`Elector::resign`],
//!   [`Elector::is_leader`], [`Elector::observe`].
//! - `worker`: [`LeaderWorker`], the worker form, a stream of [`LeaderEvent`]s (`events`:
//!   `Elected`, `Renewed`, `Lost`, `Resigned`, ...) that starts your work once per term and
//!   stops it on loss.
//! - `observer`: [`Observer`], a stream of [`Observed`] changes.
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
//! statements (`backend::postgres::locks`); the term is the row's fence, by the same rule, and the channel is a
//! notification topic of the client's `LISTEN` connection. The protocol and its decisions are
//! the same code.
//!
//! # Guarantees
//! - Terms strictly increase per election name, also after the fence key was lost (restart
//!   without persistence), unless the server's clock goes back; no two grants share a term.
//! - When renewals fail, the term's [`lost_token`](crate::HeldLease::lost_token) is cancelled `stop_timeout` before the
//!   lease can end (send time of the last confirmed renewal + lease − max(1 %, 2 ms), on this
//!   host's monotonic clock): work that honours it has stopped before another candidate can be
//!   elected. The worker form reports work still running at the lease's end loudly
//!   ([`LeaderEvent::StopOverdue`], and an error in the log). Only a fencing check on the
//!   resource (pass the term) stops a paused process that ignores it.
//! - A renewal that finds another token ends the term at once.
//! - Work starts once per term, never again on a renewal.

mod election;
mod elector;
mod events;
pub mod keys;
mod observer;
pub mod options;
pub(crate) mod protocol;
mod term;
mod worker;

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::error::{ConfigError, Error};
pub use crate::lease::store::{Expected, ForceRelease, Taken};
use crate::util::token::default_worker_name;

use election::Election;
use keys::ElectionKeys;
use worker::{WorkFn, WorkerShared, WorkerTask};

pub use elector::Elector;
pub use events::LeaderEvent;
pub use observer::{Observed, Observer};
pub use options::{ElectionOptions, ElectionOptionsBuilder};
// The model checker reaches the pure decisions by this path.
#[cfg(feature = "model")]
pub(crate) use protocol::{after_try, handover, must_stop, stop_at, CampaignStep, Handover};
pub use term::Term;
pub use worker::LeaderWorker;

/// Events buffered for a reader; beyond that `Renewed` ones are dropped.
const EVENT_BUFFER: usize = 64;

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

    /// Takes election `key` from its holder, as an operator does with a hung one, but only
    /// the grant `expected` names (its fencing token as shown, or its holder where no token is
    /// shown; [`Expected::Any`] for whatever holds it): the holder value and the fence are
    /// read together and the release is by that value, so a grant made after the operator
    /// looked is left alone ([`ForceRelease::HeldByAnother`]). The holder hears it at once on
    /// its election's channel when it listens there (its watchdog does), at its next renewal otherwise, and
    /// reports the loss; the fence stays, so the next leader's term is higher than the one taken. One
    /// method, the same on the mutex, the fair lock and elections:
    /// [`Locks::force_release`](crate::Locks::force_release),
    /// [`FairLocks::force_release`](crate::FairLocks::force_release),
    /// [`Leaders::force_release`](crate::Leaders::force_release).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or [`Expected::Attempt`]; connection errors;
    /// [`Error::Timeout`] when, with [`Expected::Any`], the holder kept changing through every
    /// try.
    pub async fn force_release(
        &self,
        key: &str,
        expected: &Expected,
    ) -> Result<ForceRelease, Error> {
        crate::util::names::check_name("key", key)?;
        let k = ElectionKeys::new(&self.prefix, key);
        self.backend
            .take(
                &k.lease,
                &k.fence,
                &k.channel,
                |v| keys::name_of(v).unwrap_or("?").to_string(),
                expected,
            )
            .await
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
    /// [`LeaderEvent::Elected`] and stop it when that term's [`lost_token`](crate::HeldLease::lost_token) fires.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name.
    pub fn start(&self, key: &str, opts: &ElectionOptions) -> Result<LeaderWorker, Error> {
        self.spawn_worker(key, opts, None)
    }

    /// The worker form with work: like [`Leaders::start`], and runs `work(term)` once per term
    /// (never again on a renewal). When the term must end (renewals failing, a renewal that
    /// found another token, [`LeaderWorker::resign`]) the term's [`lost_token`](crate::HeldLease::lost_token) is
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
