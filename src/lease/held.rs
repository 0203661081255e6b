//! A granted lock as its guard holds it: [`LockGuard`], the one guard of the mutex and the fair
//! lock (the token, the fencing token, the lease deadline and loss signal, the watchdog, the
//! token-checked extension). What differs between them is only how a release is done (the
//! mutex's compare-and-delete, the fair lock's leave that wakes the next waiter), which their
//! key sets provide ([`HeldKeys`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::guard::{sealed, Fenced, HeldLease, LeaseCore, LeaseGuard};
use super::lock::{fence_ttl, FencedValue, FencedWrite};
use super::watchdog::{self, LeaseState, TakenBy, Watch};
use super::{check_ttl, deadline, Extend, Extension};
use crate::backend::Backend;
use crate::error::Error;
use crate::util::metrics::{transition, ExtendOutcome, Labels, Loss};
use crate::util::time::after;
use crate::util::token::short;

/// A primitive's keys as a held lock needs them: the lock and the fence beside it, refreshed
/// with each extension.
pub(crate) trait FencedAt: Send + Sync + 'static {
    /// The lock key.
    fn lock_key(&self) -> &str;
    /// The fence key.
    fn fence_key(&self) -> &str;
}

/// A boxed release future (a trait object's async method).
pub(crate) type ReleaseFuture<'a> = Pin<Box<dyn Future<Output = Result<bool, Error>> + Send + 'a>>;

/// How a primitive lets go of a grant: what its guard calls on `release` and on drop.
pub(crate) trait HeldKeys: FencedAt {
    /// What the logs call it ("lock", "fair lock").
    fn what(&self) -> &'static str;
    /// The metrics' `primitive` label ("mutex", "fair").
    fn primitive(&self) -> crate::util::metrics::Primitive;
    /// Releases `token` if it still holds the lock, in one round trip that gives up at
    /// `limit`; `Ok(false)` when it was no longer ours.
    fn release<'a>(
        &'a self,
        backend: &'a Backend,
        token: &'a str,
        limit: Instant,
    ) -> ReleaseFuture<'a>;
    /// The same, through a task of the client; never blocks (a dropped guard).
    fn release_in_background(self: Arc<Self>, backend: &Backend, token: String);
    /// The channel a force release tells the holder on (`taken:<fencing token>`), which the
    /// watchdog listens on.
    fn taken_channel(&self) -> String;
    /// Whether a force release names this grant by its holder (`taken:h:<holder>`) rather
    /// than its fencing token: for grants whose token several holders share.
    fn taken_by_holder(&self) -> bool {
        false
    }
}

/// One grant, held.
pub(crate) struct HeldLock {
    /// Where the lock lives (the seam: Redis or PostgreSQL).
    pub backend: Backend,
    pub keys: Arc<dyn HeldKeys>,
    /// The lock's name, as given to acquire.
    pub key: String,
    pub token: String,
    pub fence: u64,
    pub ttl: Duration,
    pub state: Arc<LeaseState>,
    /// When the granting request was sent.
    pub sent: Instant,
    /// Stops the watchdog, when one runs.
    pub watchdog: Option<CancellationToken>,
    /// The guard's span (`baton_guard`): its watchdog, extensions and release run in it.
    pub span: tracing::Span,
}

impl std::fmt::Debug for HeldLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the full token: it is what a holder proves itself with.
        f.debug_struct("HeldLock")
            .field("key", &self.key)
            .field("token", &short(&self.token))
            .field("fencing_token", &self.fence)
            .finish_non_exhaustive()
    }
}

impl HeldLock {
    /// The grant of `token` on `keys`, with fencing token `fence`, by a request sent at `sent`.
    pub(crate) fn new(
        backend: Backend,
        keys: Arc<dyn HeldKeys>,
        key: &str,
        token: String,
        fence: u64,
        ttl: Duration,
        sent: Instant,
    ) -> Self {
        let labels = Labels::new(keys.primitive(), backend.label());
        let span = tracing::info_span!(
            "baton_guard",
            key,
            fencing_token = fence,
            node = tracing::field::Empty,
            attempt = tracing::field::Empty,
        );
        HeldLock {
            backend,
            keys,
            key: key.to_string(),
            token,
            fence,
            ttl,
            state: LeaseState::new(deadline(sent, ttl), labels, sent),
            sent,
            watchdog: None,
            span,
        }
    }

    /// Starts the watchdog (once; later calls do nothing), with an optional cap on the hold.
    pub(crate) fn start_watchdog(&mut self, max_hold: Option<Duration>) {
        if self.watchdog.is_some() {
            return;
        }
        let stop = CancellationToken::new();
        let _in_guard = self.span.enter();
        watchdog::spawn(
            &self.backend,
            Watch {
                lease: self.keys.lock_key().to_string(),
                value: self.token.clone(),
                ttl: self.ttl,
                sent: self.sent,
                refresh: vec![self.keys.fence_key().to_string()],
                retention: fence_ttl(self.ttl),
                hold_until: max_hold.map(|m| after(self.sent, m)),
                taken: Some((
                    self.keys.taken_channel(),
                    if self.keys.taken_by_holder() {
                        TakenBy::Holder(crate::util::token::short(&self.token).to_string())
                    } else {
                        TakenBy::Fence(self.fence)
                    },
                )),
            },
            self.state.clone(),
            stop.clone(),
        );
        self.watchdog = Some(stop);
    }

    /// Stops the watchdog, if one runs.
    pub(crate) fn stop_watchdog(&self) {
        if let Some(stop) = &self.watchdog {
            stop.cancel();
        }
    }

    /// Extends the lock to `ttl` (already validated) from now if it still holds this token; a
    /// refusal fires the loss signal and writes nothing.
    ///
    /// # Errors
    /// [`Error::Timeout`] (the extension may or may not have applied; the deadline does not
    /// move) and connection errors.
    pub(crate) async fn extend(&mut self, ttl: Duration) -> Result<bool, Error> {
        let refresh = [self.keys.fence_key()];
        let req = Extend {
            lease: self.keys.lock_key(),
            value: &self.token,
            ttl,
            guard: self.keys.lock_key(),
            guard_value: &self.token,
            refresh: &refresh,
            retention: fence_ttl(ttl.max(self.ttl)),
        };
        let limit = after(Instant::now(), self.backend.response_timeout());
        let labels = self.state.labels();
        let span = tracing::debug_span!(parent: &self.span, "extend");
        let extended =
            tracing::Instrument::instrument(self.backend.extend(&req, limit), span).await;
        if extended.is_err() {
            labels.extended(ExtendOutcome::Error, Instant::now());
        }
        match extended? {
            Extension::Confirmed { sent } => {
                labels.extended(ExtendOutcome::Ok, sent);
                self.state.confirmed(deadline(sent, ttl));
                Ok(true)
            }
            Extension::Refused => {
                labels.extended(ExtendOutcome::Refused, Instant::now());
                tracing::warn!(key = %self.key, token = short(&self.token), "extension refused: the lock is held by another token or gone");
                self.state.lose(
                    Loss::Taken,
                    "an extension found the lock held by another token (or gone)",
                );
                Ok(false)
            }
        }
    }
}

/// A held lock of the mutex ([`Locks`](crate::Locks)) or of the fair lock
/// ([`FairLocks`](crate::FairLocks)): one guard type for both. Release it with
/// [`LockGuard::release`]; dropping it releases in the background (the fair lock's release also
/// wakes the next waiter).
///
/// The fencing token ([`Fenced::fencing_token`]) is what the protected resource should
/// check: a lease alone cannot stop a paused holder from writing after its lease ended.
/// [`LockGuard::write_fenced`] and [`LockGuard::read_fenced`] are that check for a resource
/// kept in Redis.
pub struct LockGuard {
    /// What [`HeldLease`] reads: the key, the fencing token, the deadline and loss signal.
    core: LeaseCore,
    // `Some` for the guard's whole life: only `release(self)` and `Drop` take it.
    held: Option<HeldLock>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the full token: it is what a holder proves itself with.
        let mut d = f.debug_struct("LockGuard");
        if let Some(h) = &self.held {
            d.field("key", &h.key)
                .field("token", &short(&h.token))
                .field("fencing_token", &h.fence);
        }
        d.finish_non_exhaustive()
    }
}

impl LockGuard {
    /// The guard of a grant (the primitives' only way to make one).
    pub(crate) fn new(held: HeldLock) -> Self {
        LockGuard {
            core: held.state.core(held.key.as_str(), Some(held.fence)),
            held: Some(held),
        }
    }

    fn held(&self) -> Option<&HeldLock> {
        self.held.as_ref()
    }

    /// The same grant under another fencing token: the read-write lock's upgrade (a new write
    /// token) and downgrade (the write token kept as the read token) keep the lease and change
    /// only what the token is.
    pub(crate) fn refence(&mut self, fence: u64) {
        if let Some(h) = self.held.as_mut() {
            h.fence = fence;
            self.core = h.state.core(h.key.as_str(), Some(fence));
        }
    }

    /// This holder's random 128-bit token (hex), as stored in the lock key.
    pub fn token(&self) -> &str {
        self.held().map(|h| h.token.as_str()).unwrap_or_default()
    }

    /// Starts the watchdog (once; later calls do nothing): it extends the lock every `ttl / 3`
    /// (on Redis on the shared multiplexed connection, on PostgreSQL on a pooled one) and
    /// fires the loss signal as [`HeldLease::lost_token`] describes. With `max_hold`, it stops
    /// extending once the lock was held that long (counted from the grant) and fires the loss
    /// signal then.
    pub fn start_watchdog(&mut self, max_hold: Option<Duration>) {
        if let Some(h) = self.held.as_mut() {
            h.start_watchdog(max_hold);
        }
    }

    /// Extends the lock to `lease` from now if it still holds this guard's token (one script:
    /// compare, then `PEXPIRE`; on PostgreSQL one `UPDATE … WHERE token = …`). `Ok(false)`: it
    /// was no longer ours; nothing was written (a failed extension never deletes anything), and
    /// the loss signal fires. On success the lease deadline moves (counted from this request's
    /// send time).
    ///
    /// # Errors
    /// [`Error::Config`] for a lease outside 10 ms ..= 1 day; [`Error::Timeout`] (the extension
    /// may or may not have applied; the deadline does not move) and connection errors.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped extension leaves the deadline where it was.
    pub async fn extend(&mut self, lease: Duration) -> Result<bool, Error> {
        check_ttl("lease", lease)?;
        match self.held.as_mut() {
            Some(h) => h.extend(lease).await,
            None => Ok(false),
        }
    }

    /// Releases the lock if it still holds this guard's token: the mutex's compare-and-delete
    /// (then a `released` message wakes waiters), or the fair lock's leave, which wakes the next
    /// waiter (the reserver, else the queue's live head), in one script. `Ok(false)`: it was no
    /// longer ours; nothing was deleted.
    ///
    /// # Errors
    /// [`Error::Timeout`] and connection errors: the release may or may not have applied; the
    /// lock's ttl is the backstop.
    ///
    /// # Cancel safety
    /// Dropping the future after the guard was moved in leaves the outcome unknown; the ttl is
    /// the backstop.
    pub async fn release(mut self) -> Result<bool, Error> {
        let Some(h) = self.held.take() else {
            return Ok(false);
        };
        h.stop_watchdog();
        h.state.released();
        let sent = Instant::now();
        let limit = after(sent, h.backend.response_timeout());
        let span = tracing::debug_span!(parent: &h.span, "release");
        let ours =
            tracing::Instrument::instrument(h.keys.release(&h.backend, &h.token, limit), span)
                .await?;
        h.state.labels().transition(transition::RELEASE, sent);
        let what = h.keys.what();
        tracing::info!(key = %h.key, token = short(&h.token), ours, "{what} released");
        Ok(ours)
    }

    /// Writes `value` to the Redis hash `resource` with this guard's fencing token, only if no
    /// larger token wrote it before ([`Locks::write_fenced`](crate::Locks::write_fenced) with
    /// [`Fenced::fencing_token`]). A holder whose lock was taken over meanwhile gets
    /// [`FencedWrite::Rejected`], and nothing changes.
    ///
    /// # Errors
    /// As [`Locks::write_fenced`](crate::Locks::write_fenced); [`Error::Unsupported`] on a
    /// PostgreSQL client.
    pub async fn write_fenced(
        &self,
        resource: &str,
        value: impl AsRef<[u8]>,
    ) -> Result<FencedWrite, Error> {
        let backend = self.backend()?;
        backend
            .write_fenced(resource, self.fencing_token(), value.as_ref())
            .await
    }

    /// Reads the Redis hash `resource` a fenced write keeps: the value and the fencing token it
    /// was written with, `None` if nothing was written yet. A read is never refused, whatever
    /// this guard's token ([`Locks::read_fenced`](crate::Locks::read_fenced)).
    ///
    /// # Errors
    /// As [`Locks::read_fenced`](crate::Locks::read_fenced); [`Error::Unsupported`] on a
    /// PostgreSQL client.
    pub async fn read_fenced(&self, resource: &str) -> Result<Option<FencedValue>, Error> {
        let backend = self.backend()?;
        backend.read_fenced(resource).await
    }

    /// [`LockGuard::read_fenced`] recording this grant's fencing token at the resource first,
    /// for a holder whose token is a read's (a read-write lock's reader): writes at or below it
    /// are refused from then on.
    pub(crate) async fn read_fenced_marking(
        &self,
        resource: &str,
    ) -> Result<Option<FencedValue>, Error> {
        let backend = self.backend()?;
        backend.read_fenced_at(resource, self.fencing_token()).await
    }

    fn backend(&self) -> Result<&Backend, Error> {
        // Only a released guard has no backend, and `release` consumes the guard.
        self.held().map(|h| &h.backend).ok_or(Error::Stopped)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(h) = self.held.take() {
            h.stop_watchdog();
            h.state.released();
            h.keys.release_in_background(&h.backend, h.token);
        }
    }
}

impl sealed::Sealed for LockGuard {
    fn core(&self) -> &LeaseCore {
        &self.core
    }
}

/// The loss signal fires when an extension (the watchdog's or [`LeaseGuard::extend`]'s) found
/// another token, when the watchdog could not confirm an extension before the lease deadline,
/// at the watchdog's hold cap, or at an operator's force release. Without the watchdog it only
/// fires on a refused extension: watch the deadline yourself.
impl HeldLease for LockGuard {}

impl Fenced for LockGuard {}

impl LeaseGuard for LockGuard {
    fn extend(&mut self, lease: Duration) -> impl Future<Output = Result<bool, Error>> + Send {
        LockGuard::extend(self, lease)
    }
    fn release(self) -> impl Future<Output = Result<bool, Error>> + Send {
        LockGuard::release(self)
    }
    fn start_watchdog(&mut self, max_hold: Option<Duration>) {
        LockGuard::start_watchdog(self, max_hold)
    }
}
