//! A granted lock as its guard holds it: what the mutex's and the fair lock's guards share (the
//! token, the fencing token, the lease deadline and loss signal, the watchdog, the
//! token-checked extension). Each guard adds its own release (the mutex's compare-and-delete,
//! the fair lock's leave that wakes the next waiter).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lock::fence_ttl;
use super::watchdog::{self, LeaseState, Watch};
use super::{deadline, Extend, Extension};
use crate::backend::Backend;
use crate::error::Error;
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

/// One grant, held.
pub(crate) struct HeldLock<K: FencedAt> {
    /// Where the lock lives (the seam: Redis or PostgreSQL).
    pub backend: Backend,
    pub keys: Arc<K>,
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
}

impl<K: FencedAt> std::fmt::Debug for HeldLock<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the full token: it is what a holder proves itself with.
        f.debug_struct("HeldLock")
            .field("key", &self.key)
            .field("token", &short(&self.token))
            .field("fencing_token", &self.fence)
            .finish_non_exhaustive()
    }
}

impl<K: FencedAt> HeldLock<K> {
    /// The grant of `token` on `keys`, with fencing token `fence`, by a request sent at `sent`.
    pub(crate) fn new(
        backend: Backend,
        keys: Arc<K>,
        key: &str,
        token: String,
        fence: u64,
        ttl: Duration,
        sent: Instant,
    ) -> Self {
        HeldLock {
            backend,
            keys,
            key: key.to_string(),
            token,
            fence,
            ttl,
            state: LeaseState::new(deadline(sent, ttl)),
            sent,
            watchdog: None,
        }
    }

    /// Starts the watchdog (once; later calls do nothing), with an optional cap on the hold.
    pub(crate) fn start_watchdog(&mut self, max_hold: Option<Duration>) {
        if self.watchdog.is_some() {
            return;
        }
        let stop = CancellationToken::new();
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
        match self.backend.extend(&req, limit).await? {
            Extension::Confirmed { sent } => {
                self.state.confirmed(deadline(sent, ttl));
                Ok(true)
            }
            Extension::Refused { .. } => {
                tracing::warn!(key = %self.key, token = short(&self.token), "extension refused: the lock is held by another token or gone");
                self.state
                    .lose("an extension found the lock held by another token (or gone)");
                Ok(false)
            }
        }
    }
}
