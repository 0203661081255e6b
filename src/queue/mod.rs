//! Run-or-enqueue: one runner per key at a time, and nothing posted is ever left unhandled.
//!
//! [`Queues::run_or_enqueue`]`(key, item, handler)`: if nobody holds `key`, the caller becomes
//! its holder and runs `handler` on its item; if someone does, the item is queued and the call
//! returns at once ([`RunOrEnqueue::Enqueued`]). A holder drains every item that arrived while it
//! worked before it lets go, and an item that arrives while it is finishing causes one more run,
//! by it or by the next holder: never zero.
//!
//! # How
//! Keys under `P queue:{K}` (see the table in the `keys` module): a lock with a fence, exactly
//! as the mutex's (the same acquisition script, so fencing tokens strictly increase per key), and
//! a Redis Stream of items.
//! - Posting is one atomic script: `XADD` the item and try the fenced `SET NX PX`. The caller
//!   either holds the lock (and drains, its own item included) or the lock is held by someone
//!   who will see the item.
//! - The holder reads items oldest first (`XRANGE`), runs `handler` on each, and only then
//!   deletes it (`XDEL`, inside a script that checks the lock still holds its token), handled
//!   items a group of up to 32 at a time (one script per group, before the next read and before
//!   letting go). A holder that dies between handling and deleting leaves the items of its
//!   unfinished group for the next holder: **at-least-once delivery**. Each [`QueueItem`] carries its stream id (unique, server
//!   ordered) and the holder's fencing token, so a sink that records handled ids and rejects
//!   tokens below the highest it has seen applies every item exactly once.
//! - Letting go is "release if empty", one script: the lock is deleted only if it holds the
//!   holder's token and the stream is empty; otherwise the holder drains again. Together with
//!   the atomic post this closes the race with an item arriving while the holder finishes.
//! - While it drains, the holder keeps its lease (the call's `ttl`) with the kernel's watchdog
//!   (every ttl / 3). If the lease is lost, the running handler is dropped and the call returns
//!   [`Error::LeaseLost`]; the unfinished items stay queued for the next holder.
//!
//! # Crashes and recovery
//! Items live in Redis, not in the holder: a holder that crashes leaves them queued, and its
//! lock ends with its lease (the `ttl` of the call that took it). The next `run_or_enqueue` on the key after
//! that drains them; if none comes, [`Queues::drain`] (take the lock if free, drain, release)
//! does: call it at start-up or periodically as a sweep.
//!
//! # Handler errors
//! An error from `handler` stops the drain: the failing item (and every later one) stays
//! queued, the lock is released at once, and the call returns `Ok` with the outcome
//! [`RunOrEnqueue::HandlerFailed`] ([`Drain::HandlerFailed`]) carrying the handler's error, as
//! everything the user's code returns comes back inside `Ok` (baton's own failures are the
//! `Err(Error)`). The next
//! `run_or_enqueue` or `drain` on the key retries that item first: an item that always fails
//! blocks the key until it is handled (there is no dead-letter queue).

pub(crate) mod items;
pub(crate) mod keys;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use serde::Serialize;

use crate::backend::Backend;
use crate::error::{ConfigError, Error};
use crate::lease::deadline;
use crate::lease::lock::{self as kernel_lock, Grant};
use crate::lease::watchdog::{self, LeaseState, Watch};
use crate::queue::items::{self as kernel, Enqueue, Release, Stored};
use crate::util::backoff::Backoff;
use crate::util::metrics::{self, primitive, Labels, Loss};
use crate::util::time::after;
use crate::util::token::{new_token, short};

use keys::QueueKeys;

/// The largest item body accepted, in bytes (1 MiB).
pub const MAX_ITEM_BYTES: usize = 1 << 20;
// The bounds of a holder's lease, the same as every lease-holding primitive's.
pub use crate::lease::{MAX_LEASE, MIN_LEASE};

/// How long an empty stream is kept after a forced release (a normal release uses the fence's
/// retention, which is at least this): see `lease::items`'s release script for why.
const RETENTION: Duration = Duration::from_secs(86_400);

/// How many items one `XRANGE` reads.
const BATCH: usize = 100;

/// Run-or-enqueue on one client's connections. Get it from
/// [`Client::queues`](crate::Client::queues); cheap to clone.
#[derive(Clone)]
pub struct Queues {
    backend: Backend,
    prefix: Arc<str>,
}

impl std::fmt::Debug for Queues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queues")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// One queued item, as the handler gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueItem {
    /// Its id: the Redis Stream entry id (`<ms>-<seq>`), unique per key, in posting order.
    /// Redelivery (after a holder died between handling and removing it) keeps the id: dedup
    /// by it.
    pub id: String,
    /// The bytes posted.
    pub body: Vec<u8>,
    /// The fencing token of the holder running the handler: pass it to the sink, which should
    /// reject tokens below the highest it has seen.
    pub fencing_token: u64,
}

/// What [`Queues::run_or_enqueue`] did. `E` is the handler's error type. Serializes with a tag
/// `outcome` (`{"outcome":"Ran","handled":3,"fencing_token":7}`); the handler's error is
/// serialized when `E` is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome")]
#[non_exhaustive]
pub enum RunOrEnqueue<E> {
    /// The caller was the holder: it handled `handled` items (its own among them) and released
    /// the key with nothing left queued.
    Ran {
        /// How many items the handler completed (and were removed).
        handled: u64,
        /// The fencing token of this hold.
        fencing_token: u64,
    },
    /// Someone else holds the key; the item was queued and that holder (or the next) runs it.
    Enqueued {
        /// The item's id, as its handler will see it.
        id: String,
    },
    /// The handler failed on item `id`: the item (and every later one) stays queued, the drain
    /// stopped and the key was released at once; the next call on the key retries it first.
    HandlerFailed {
        /// The item the handler failed on.
        id: String,
        /// The fencing token of this hold.
        fencing_token: u64,
        /// How many items this hold completed before.
        handled: u64,
        /// The handler's error.
        error: E,
    },
}

/// What [`Queues::drain`] did. `E` is the handler's error type; serialized like
/// [`RunOrEnqueue`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome")]
#[non_exhaustive]
pub enum Drain<E> {
    /// The key was free: this call drained it (`handled` may be 0) and released it.
    Ran {
        /// How many items the handler completed (and were removed).
        handled: u64,
        /// The fencing token of this hold.
        fencing_token: u64,
    },
    /// Someone holds the key (a live holder, or a crashed one whose lease has not ended yet).
    Busy,
    /// The handler failed on item `id`: the item (and every later one) stays queued, the drain
    /// stopped and the key was released at once; the next call on the key retries it first.
    HandlerFailed {
        /// The item the handler failed on.
        id: String,
        /// The fencing token of this hold.
        fencing_token: u64,
        /// How many items this hold completed before.
        handled: u64,
        /// The handler's error.
        error: E,
    },
}

/// How a hold's drain ended (the two public outcomes' common part).
enum Drained<E> {
    /// Everything was handled and the key released.
    All { handled: u64 },
    /// The handler failed on `id`.
    Failed { id: String, handled: u64, error: E },
}

impl Queues {
    /// The backend, once it is one the queue lives on (Redis only).
    fn transport(&self) -> Result<&Backend, Error> {
        self.backend.queue_items()?;
        Ok(&self.backend)
    }

    /// Run-or-enqueue on `transport` (the client façade's only way in).
    pub(crate) fn new(backend: Backend) -> Self {
        Queues {
            backend,
            prefix: Arc::from(crate::util::names::DEFAULT_PREFIX),
        }
    }

    /// The same handle with keys under another prefix (`{prefix}queue:{K}`).
    ///
    /// # Errors
    /// A [`ConfigError`] naming `prefix` unless it ends with `:`, is 1..=1024 bytes, not blank
    /// and free of `{` and `}`.
    pub fn with_prefix(&self, prefix: &str) -> Result<Queues, ConfigError> {
        crate::util::names::check_prefix(prefix)?;
        Ok(Queues {
            prefix: Arc::from(prefix),
            ..self.clone()
        })
    }

    /// The key prefix in use. Defaults to `baton:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn keys(&self, key: &str) -> Result<Arc<QueueKeys>, ConfigError> {
        crate::util::names::check_name("key", key)?;
        Ok(Arc::new(QueueKeys::new(&self.prefix, key)))
    }

    /// How many items wait on `key` (including one a holder is handling right now).
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name; connection errors and timeouts.
    pub async fn pending(&self, key: &str) -> Result<u64, Error> {
        let keys = self.keys(key)?;
        self.transport()?.queue_len(&keys.items).await
    }

    /// Posts `item` to `key`, and runs `handler` on the queued items if the key was free,
    /// holding it with a lease of `lease` (renewed by a watchdog while it drains; it bounds how
    /// long a crashed holder's items wait).
    ///
    /// Free: the caller becomes the holder, runs `handler` on every queued item oldest first
    /// (its own, and whatever arrives meanwhile, and what a crashed holder left), removing each
    /// after its handler returned `Ok`, then releases the key once nothing is queued:
    /// [`RunOrEnqueue::Ran`]. Held: the item is queued and the call returns at once with its
    /// id ([`RunOrEnqueue::Enqueued`]). See the [module documentation](self) for the
    /// guarantees; under a steady stream of posts the holder keeps draining.
    ///
    /// A failing handler is not an error of this call: it returns
    /// `Ok(`[`RunOrEnqueue::HandlerFailed`]`)` with the handler's error (see "Handler errors"
    /// in the module documentation).
    ///
    /// # Errors
    /// Baton's own failures only:
    /// - [`Error::Config`] for an invalid name, a `lease` outside [`MIN_LEASE`] ..= [`MAX_LEASE`] or
    ///   an item above [`MAX_ITEM_BYTES`] (nothing posted).
    /// - [`Error::LeaseLost`] when the lease was lost while draining (the running handler was
    ///   dropped; unfinished items stay queued).
    /// - [`Error::CorruptState`] for a fence or an item baton never writes; connection errors
    ///   and timeouts. A timeout or a connection error while posting leaves it unknown whether
    ///   the item was queued (if it was, the next call on the key runs it; retrying may deliver
    ///   it twice, under two ids).
    ///
    /// # Cancel safety
    /// Dropping the future drops the running handler; its item and the later ones stay queued
    /// (for the next `run_or_enqueue` or [`Queues::drain`] on the key), and the key is released
    /// by token through a task of the client (if the client is gone too, the lease's end is the
    /// backstop).
    pub async fn run_or_enqueue<F, Fut, E>(
        &self,
        key: &str,
        item: impl AsRef<[u8]>,
        lease: Duration,
        mut handler: F,
    ) -> Result<RunOrEnqueue<E>, Error>
    where
        F: FnMut(QueueItem) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        crate::lease::check_ttl("lease", lease)?;
        let body = item.as_ref();
        if body.len() > MAX_ITEM_BYTES {
            return Err(ConfigError::invalid(
                "item",
                format!("must be at most {MAX_ITEM_BYTES} bytes, got {}", body.len()),
            )
            .into());
        }
        let keys = self.keys(key)?;
        let token = new_token();
        // Armed before the request leaves: a dropped future or a lost reply releases by token.
        let mut hold = Hold::new(self.transport()?, &keys, token.clone());
        let asked = Instant::now();
        let limit = after(asked, self.transport()?.response_timeout());
        let outcome = self
            .transport()?
            .queue_enqueue_or_acquire(&keys.kernel(), &token, lease, body, limit)
            .await;
        if outcome.is_ok() {
            // Posted either way: queued for the holder, or the first item this caller drains.
            metrics::count(metrics::Count::QueuePosts, metrics::backend::REDIS);
        }
        match outcome {
            Ok(Enqueue::Granted { fence, sent, id }) => {
                let labels = Labels::new(primitive::QUEUE, metrics::backend::REDIS);
                labels.transition(metrics::transition::GRANT, sent);
                labels.granted(false, asked);
                tracing::info!(
                    key,
                    token = short(&token),
                    fence,
                    id,
                    "queue held: draining"
                );
                let held = Held {
                    fence,
                    sent,
                    ttl: lease,
                };
                Ok(
                    match self
                        .drain_held(key, &keys, hold, held, &mut handler)
                        .await?
                    {
                        Drained::All { handled } => RunOrEnqueue::Ran {
                            handled,
                            fencing_token: fence,
                        },
                        Drained::Failed { id, handled, error } => RunOrEnqueue::HandlerFailed {
                            id,
                            fencing_token: fence,
                            handled,
                            error,
                        },
                    },
                )
            }
            Ok(Enqueue::Enqueued { id }) => {
                hold.disarm();
                tracing::debug!(key, id, "queue busy: item enqueued");
                Ok(RunOrEnqueue::Enqueued { id })
            }
            Err(e) => {
                if !e.is_indeterminate() {
                    hold.disarm();
                }
                Err(e)
            }
        }
    }

    /// Drains `key` if it is free: takes it with a lease of `lease`, runs `handler` on every
    /// queued item as [`Queues::run_or_enqueue`] does, and releases it. For recovery after a holder crashed
    /// (its items wait until its lease ends and someone calls): at start-up, or periodically.
    /// [`Drain::Busy`] when it is held.
    ///
    /// A failing handler returns `Ok(`[`Drain::HandlerFailed`]`)`, as for
    /// [`Queues::run_or_enqueue`].
    ///
    /// # Errors
    /// As [`Queues::run_or_enqueue`] (nothing is posted).
    ///
    /// # Cancel safety
    /// As [`Queues::run_or_enqueue`].
    pub async fn drain<F, Fut, E>(
        &self,
        key: &str,
        lease: Duration,
        mut handler: F,
    ) -> Result<Drain<E>, Error>
    where
        F: FnMut(QueueItem) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        crate::lease::check_ttl("lease", lease)?;
        let keys = self.keys(key)?;
        let token = new_token();
        let mut hold = Hold::new(self.transport()?, &keys, token.clone());
        let limit = after(Instant::now(), self.transport()?.response_timeout());
        let req = kernel_lock::Acquire {
            lock: &keys.lock,
            fence: &keys.fence,
            token: &token,
            ttl: lease,
        };
        let asked = Instant::now();
        let grant = self.transport()?.queue_acquire(&req, limit).await;
        match grant {
            Ok(Grant::Granted { fence, sent }) => {
                let labels = Labels::new(primitive::QUEUE, metrics::backend::REDIS);
                labels.transition(metrics::transition::GRANT, sent);
                labels.granted(false, asked);
                tracing::info!(key, token = short(&token), fence, "queue held: draining");
                let held = Held {
                    fence,
                    sent,
                    ttl: lease,
                };
                Ok(
                    match self
                        .drain_held(key, &keys, hold, held, &mut handler)
                        .await?
                    {
                        Drained::All { handled } => Drain::Ran {
                            handled,
                            fencing_token: fence,
                        },
                        Drained::Failed { id, handled, error } => Drain::HandlerFailed {
                            id,
                            fencing_token: fence,
                            handled,
                            error,
                        },
                    },
                )
            }
            Ok(Grant::Held { .. }) => {
                hold.disarm();
                Ok(Drain::Busy)
            }
            Err(e) => {
                if !e.is_indeterminate() {
                    hold.disarm();
                }
                Err(e)
            }
        }
    }

    /// The holder's loop: read a batch, handle and remove each item, and release once the
    /// stream is empty (else read again). Returns how many items were handled.
    async fn drain_held<F, Fut, E>(
        &self,
        key: &str,
        keys: &Arc<QueueKeys>,
        mut hold: Hold,
        held: Held,
        handler: &mut F,
    ) -> Result<Drained<E>, Error>
    where
        F: FnMut(QueueItem) -> Fut,
        Fut: Future<Output = Result<(), E>>,
    {
        let Held { fence, sent, ttl } = held;
        let labels = Labels::new(primitive::QUEUE, metrics::backend::REDIS);
        let state = LeaseState::new(deadline(sent, ttl), labels, sent);
        let stop = CancellationToken::new();
        watchdog::spawn(
            self.transport()?,
            Watch {
                lease: keys.lock.clone(),
                value: hold.token.clone(),
                ttl,
                sent,
                refresh: vec![keys.fence.clone()],
                retention: kernel_lock::fence_ttl(ttl),
                hold_until: None,
                // A queue has no force release: nothing to listen for.
                taken: None,
            },
            state.clone(),
            stop.clone(),
        );
        hold.watchdog = Some(stop);
        let lost = state.lost_token();
        let token = hold.token.clone();
        let lost_error = |reason: Option<String>| {
            Error::lock_lost(key, Some(fence), reason.unwrap_or_else(|| "lost".into()))
        };
        let mut handled: u64 = 0;
        loop {
            let batch: Vec<Stored> = {
                let (t, k) = (self.transport()?.clone(), keys.clone());
                let read = self
                    .retrying(&lost, ttl, || {
                        let (t, k) = (t.clone(), k.clone());
                        async move { t.queue_read(&k.items, BATCH).await }
                    })
                    .await?;
                match read {
                    Some(b) => b,
                    None => {
                        hold.disarm();
                        return Err(lost_error(state.reason()));
                    }
                }
            };
            let full = batch.len() >= BATCH;
            // Handled, not yet removed: acknowledged a group at a time (one script per group),
            // always before the next read (which would return them again) and before letting
            // go. An id is removed only after its handler returned: a holder lost meanwhile
            // leaves them queued, and the next holder delivers them again (at-least-once).
            let mut done: Vec<String> = Vec::new();
            for stored in batch {
                if lost.is_cancelled() {
                    hold.disarm();
                    return Err(lost_error(state.reason()));
                }
                let id = stored.id;
                let item = QueueItem {
                    id: id.clone(),
                    body: stored.body,
                    fencing_token: fence,
                };
                let out = tokio::select! {
                    biased;
                    _ = lost.cancelled() => None,
                    out = handler(item) => Some(out),
                };
                match out {
                    None => {
                        hold.disarm();
                        return Err(lost_error(state.reason()));
                    }
                    Some(Err(error)) => {
                        // The items handled before it are removed first; it stays queued. Let
                        // go at once so a retry need not wait out the lease.
                        if !self
                            .ack_group(&lost, ttl, keys, &token, &done, &state)
                            .await?
                        {
                            hold.disarm();
                            return Err(lost_error(state.reason()));
                        }
                        handled = handled.saturating_add(done.len() as u64);
                        hold.release_now(true).await;
                        tracing::warn!(key, id, "handler failed: the item stays queued");
                        return Ok(Drained::Failed { id, handled, error });
                    }
                    Some(Ok(())) => done.push(id),
                }
                if done.len() >= kernel::ACK_GROUP {
                    if !self
                        .ack_group(&lost, ttl, keys, &token, &done, &state)
                        .await?
                    {
                        hold.disarm();
                        return Err(lost_error(state.reason()));
                    }
                    handled = handled.saturating_add(done.len() as u64);
                    done.clear();
                }
            }
            if !self
                .ack_group(&lost, ttl, keys, &token, &done, &state)
                .await?
            {
                hold.disarm();
                return Err(lost_error(state.reason()));
            }
            handled = handled.saturating_add(done.len() as u64);
            if full {
                continue;
            }
            // Release if empty: one script, so an item posted meanwhile is never stranded.
            let mut uncertain = false;
            let mut backoff = Backoff::new(ttl / 4);
            let released = loop {
                if lost.is_cancelled() {
                    hold.disarm();
                    return Err(lost_error(state.reason()));
                }
                let r = self
                    .transport()?
                    .queue_release(&keys.kernel(), &token, false, kernel_lock::fence_ttl(ttl))
                    .await;
                match release_step(&r, uncertain) {
                    ReleaseStep::Done => {
                        state.released();
                        break true;
                    }
                    ReleaseStep::DrainAgain => break false,
                    ReleaseStep::Lost => {
                        state.lose(
                            Loss::Taken,
                            "the release found the lock held by another token (or gone)",
                        );
                        hold.disarm();
                        return Err(lost_error(state.reason()));
                    }
                    ReleaseStep::Retry { uncertain: u } => {
                        uncertain = u;
                        if let Err(e) = &r {
                            tracing::debug!(key, error = %e, "release failed; retrying");
                        }
                        let nap = backoff.next_delay();
                        tokio::select! {
                            biased;
                            _ = lost.cancelled() => {}
                            _ = tokio::time::sleep(nap) => {}
                        }
                    }
                    // A permanent error: `release_step` says `Fail` only for an `Err`.
                    ReleaseStep::Fail => {
                        r?;
                    }
                }
            };
            if released {
                hold.disarm();
                tracing::info!(
                    key,
                    token = short(&token),
                    handled,
                    "queue drained and released"
                );
                return Ok(Drained::All { handled });
            }
        }
    }

    /// Removes the handled items `ids` (none: nothing to do) while the lock is still ours,
    /// retrying transient errors; counts them drained. `Ok(false)`: the lease is lost (the lock
    /// holds another token, or the watchdog gave up), nothing removed.
    async fn ack_group(
        &self,
        lost: &CancellationToken,
        ttl: Duration,
        keys: &Arc<QueueKeys>,
        token: &str,
        ids: &[String],
        state: &LeaseState,
    ) -> Result<bool, Error> {
        if ids.is_empty() {
            return Ok(true);
        }
        let t = self.transport()?.clone();
        let group = ids;
        let acked = self
            .retrying(lost, ttl, || {
                let (t, k) = (t.clone(), keys.clone());
                async move { t.queue_ack(&k.kernel(), token, group).await }
            })
            .await?;
        match acked {
            Some(true) => {
                for _ in 0..group.len() {
                    metrics::count(metrics::Count::QueueDrained, metrics::backend::REDIS);
                }
                Ok(true)
            }
            Some(false) => {
                state.lose(
                    Loss::Taken,
                    "removing handled items found the lock held by another token (or gone)",
                );
                Ok(false)
            }
            None => Ok(false),
        }
    }

    /// Runs `op` until it succeeds, retrying transient errors with backoff; `Ok(None)` once the
    /// lease is lost.
    async fn retrying<T, Op, Fut>(
        &self,
        lost: &CancellationToken,
        ttl: Duration,
        mut op: Op,
    ) -> Result<Option<T>, Error>
    where
        Op: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Error>>,
    {
        let mut backoff = Backoff::new(ttl / 4);
        loop {
            let out = tokio::select! {
                biased;
                _ = lost.cancelled() => return Ok(None),
                out = op() => out,
            };
            match out {
                Ok(v) => return Ok(Some(v)),
                Err(e) if e.is_retryable() => {
                    tracing::debug!(error = %e, "queue step failed; retrying");
                    let nap = backoff.next_delay();
                    tokio::select! {
                        biased;
                        _ = lost.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(nap) => {}
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// A granted hold: its fence, when its request was sent and its lease.
struct Held {
    fence: u64,
    sent: Instant,
    ttl: Duration,
}

/// The holder's next step after one "release if empty" ([`release_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseStep {
    /// Released (now, or by an earlier try whose reply was lost): the hold is over.
    Done,
    /// Items are waiting: drain again.
    DrainAgain,
    /// The lock held another token (or none) and no earlier try can have released it: lost.
    Lost,
    /// A transient error: try again (`uncertain`: an earlier try may have applied).
    Retry {
        /// Whether some try so far may have applied.
        uncertain: bool,
    },
    /// A permanent error: return it.
    Fail,
}

/// What the holder does with a release's outcome, given whether an earlier try's outcome is
/// unknown (`uncertain`). The model checker (`src/model/queue.rs`) runs the same function.
pub(crate) fn release_step(r: &Result<Release, Error>, uncertain: bool) -> ReleaseStep {
    match r {
        Ok(Release::Released) => ReleaseStep::Done,
        Ok(Release::More) => ReleaseStep::DrainAgain,
        // An earlier try whose reply was lost may have released it: fine if nothing waits.
        // With items waiting, that try may as well have found them and released nothing (and
        // the lease ran out since): nobody would run them, so report the loss (the caller
        // recovers with `drain`).
        Ok(Release::NotOurs { waiting: false }) if uncertain => ReleaseStep::Done,
        Ok(Release::NotOurs { .. }) => ReleaseStep::Lost,
        Err(e) if e.is_retryable() => ReleaseStep::Retry {
            uncertain: uncertain || e.is_indeterminate(),
        },
        Err(_) => ReleaseStep::Fail,
    }
}

/// A hold (or an acquisition whose outcome is unknown): stops its watchdog and, unless
/// disarmed, releases the key by token (forced: items stay queued) through a task of the
/// client when dropped.
struct Hold {
    transport: Option<Backend>,
    keys: Arc<QueueKeys>,
    token: String,
    watchdog: Option<CancellationToken>,
}

impl Hold {
    fn new(transport: &Backend, keys: &Arc<QueueKeys>, token: String) -> Self {
        Hold {
            transport: Some(transport.clone()),
            keys: keys.clone(),
            token,
            watchdog: None,
        }
    }

    fn disarm(&mut self) {
        self.transport = None;
        if let Some(stop) = &self.watchdog {
            stop.cancel();
        }
    }

    /// Releases now (best effort: a failure leaves it to the lease's ttl), then disarms.
    async fn release_now(&mut self, force: bool) {
        if let Some(stop) = &self.watchdog {
            stop.cancel();
        }
        let Some(t) = self.transport.take() else {
            return;
        };
        let r = t
            .queue_release(&self.keys.kernel(), &self.token, force, RETENTION)
            .await;
        if let Err(e) = r {
            tracing::warn!(key = %self.keys.lock, error = %e, "release failed; the key is free when its lease ends");
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Some(stop) = &self.watchdog {
            stop.cancel();
        }
        let Some(transport) = self.transport.take() else {
            return;
        };
        let token = std::mem::take(&mut self.token);
        transport.queue_release_in_background(&self.keys.kernel(), token, RETENTION);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_trusted_after_an_uncertain_try_only_when_nothing_waits() {
        let timeout = || {
            Err(Error::Timeout {
                during: "releasing the queue's lock",
            })
        };
        assert_eq!(
            release_step(&timeout(), false),
            ReleaseStep::Retry { uncertain: true }
        );
        let not_ours = |waiting| Ok(Release::NotOurs { waiting });
        assert_eq!(release_step(&not_ours(false), true), ReleaseStep::Done);
        // The lost try may have found these items and released nothing: a loss, not a release
        // (src/model/queue.rs finds the stranded items otherwise).
        assert_eq!(release_step(&not_ours(true), true), ReleaseStep::Lost);
        assert_eq!(release_step(&not_ours(false), false), ReleaseStep::Lost);
        assert_eq!(
            release_step(&Ok(Release::More), true),
            ReleaseStep::DrainAgain
        );
        assert_eq!(
            release_step(&Ok(Release::Released), false),
            ReleaseStep::Done
        );
    }
}
