//! Redlock: the mutex over several independent Redis masters, held by a quorum.
//!
//! - [`keys`]: the key layout (`baton:redlock:{K}` on every master).
//! - [`Redlock`]: the handle ([`Redlock::new`]):
//!   [`Redlock::try_acquire`], [`Redlock::acquire`], [`Redlock::with_lock`].
//! - [`options`]: [`LockOptions`], the options of every lock-shaped primitive (waiting is
//!   the lease kernel's acquisition engine, fed one quorum round per try).
//! - [`RedlockGuard`]: the held lock ([`LeaseGuard`]): token, lease deadline, `release`,
//!   `extend`, the watchdog and its loss signal; no fencing token.
//!
//! # How it works
//! An acquisition picks a random 128-bit token and sends `SET key token NX PX ttl` to every
//! master at once, each bounded by a per-master timeout far below the TTL
//! (`min(response_timeout, ttl / 10)`, at least 5 ms), so a master that is down cannot eat the
//! lock's validity. The lock is held iff a quorum (`masters / 2 + 1`) said yes and some
//! validity is left: `ttl − elapsed − drift`, with `elapsed` measured on this host's monotonic
//! clock from before the first request left and `drift = ttl / 100 + 2 ms`. When the quorum
//! fails, the lock is released (compare-and-delete by token) on **every** master, also those
//! whose reply was lost, since a lost reply may have set it.
//!
//! Failures tell their cause: `Ok(None)` (or [`Error::NotAcquired`] from
//! [`Redlock::acquire`]) when enough masters answered but the lock was held elsewhere;
//! [`Error::QuorumUnavailable`] (retryable) when too many masters were down or erroring for a
//! quorum to be possible, naming the quorum, how many answered and what the others said.
//!
//! Extension ([`RedlockGuard::extend`]) is a compare-and-`PEXPIRE` on every master, held iff a
//! quorum confirmed within the new validity, computed the same way; a failed extension never
//! deletes anything. Release compares the token on every master.
//!
//! The watchdog ([`RedlockGuard::start_watchdog`]) extends by quorum every `ttl / 3` from the
//! start of the last confirmed round and moves the validity deadline; its loss signal
//! ([`lost_token`](HeldLease::lost_token), [`lost`](HeldLease::lost), [`loss_reason`](HeldLease::loss_reason)) fires
//! when a round finds no quorum still holding the token, when no quorum extension was confirmed
//! by the validity deadline (its own timer), or when non-retryable errors make a quorum
//! impossible; other failures are retried until the deadline.
//!
//! # What Redlock gives, and what it does not
//! - **Mutual exclusion only under timing assumptions**: the masters' clocks must advance at
//!   about the same rate (the drift allowance is 1 % + 2 ms), and the holder must stop using the
//!   lock before [`lease_deadline`](HeldLease::lease_deadline). A process paused (GC, swap, `SIGSTOP`) or a
//!   network delay longer than the remaining validity lets a second holder in while the first
//!   still believes it holds the lock. Nothing in Redlock can detect that afterwards.
//! - **No fencing token.** There is no counter that grows across grants on a majority of
//!   masters: a master restarted without persistence forgets the locks it held, so a quorum can
//!   form again for a second holder while the first one's validity has not ended, and no token
//!   could be made monotonic across that. The resource you protect cannot reject a stale
//!   holder's late write. This is why `baton lock --redlock` does not set
//!   `BATON_FENCING_TOKEN`. Run the masters with `appendonly yes` and `appendfsync always`, or
//!   keep a restarted master out for at least one TTL ("delayed restart"), to keep the
//!   forgetting window closed.
//! - **Availability**: acquisitions go on while a quorum of masters is up (2 of 3, 3 of 5).
//!
//! Prefer the single-node fenced mutex ([`Client::locks`](crate::Client::locks)) when
//! correctness matters: its fencing token lets the resource reject late writes, whatever the
//! timing. Use Redlock when you need the lock to survive the loss of a minority of servers and
//! a rare double grant is acceptable (efficiency locks: avoiding duplicate work, not protecting
//! data).
//!
//! Give an odd number of masters, 3 or 5: [`Redlock::new`] rejects
//! fewer than 3, an even count and one server given twice (bad-input catalogue, row 9).

pub mod keys;
pub mod options;
mod quorum;
mod watchdog;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::Backend;
use crate::error::{ConfigError, Error};
use crate::lease::acquire::{self, NoChannel, Tried, TryAcquire};
use crate::lease::guard::{sealed, HeldLease, LeaseCore, LeaseGuard};
use crate::lease::options::Field;
use crate::lease::watchdog::LeaseState;
use crate::lease::Extension;
use crate::util::drop_guard::Armed;
use crate::util::metrics::{self, primitive, Labels, Loss};
use crate::util::time::after;
use crate::util::token::{new_token, short};

use keys::RedlockKeys;
pub use keys::DEFAULT_PREFIX;
pub use options::{LockOptions, LockOptionsBuilder, RedlockOptions, RedlockOptionsBuilder};
use quorum::{decide, node_timeout, Decision};

pub use crate::lease::{MAX_LEASE, MIN_LEASE};
/// The fewest masters a Redlock accepts.
pub const MIN_MASTERS: usize = 3;

type Masters = Arc<[Backend]>;

/// The mutex over several independent masters (see the [module docs](self) for what it does
/// and does not guarantee). Get it from [`Redlock::new`]; cheap to
/// clone.
#[derive(Clone)]
pub struct Redlock {
    masters: Masters,
    prefix: Arc<str>,
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field("masters", &self.masters.len())
            .field("quorum", &self.quorum())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Redlock {
    /// A Redlock over `masters` (the client façade's only way in).
    pub(crate) fn from_transports(masters: Vec<Backend>) -> Result<Self, ConfigError> {
        let n = masters.len();
        if n < MIN_MASTERS {
            return Err(ConfigError::invalid(
                "masters",
                format!("need at least {MIN_MASTERS} independent masters, got {n}"),
            ));
        }
        if n % 2 == 0 {
            return Err(ConfigError::invalid(
                "masters",
                format!(
                    "must be an odd number (3, 5, …), got {n}: one more master raises the quorum \
                     without tolerating one more failure"
                ),
            ));
        }
        for (i, a) in masters.iter().enumerate() {
            if masters[..i].iter().any(|b| b.endpoint() == a.endpoint()) {
                return Err(ConfigError::invalid(
                    "masters",
                    format!(
                        "`{}` is given twice: one server counted twice would fake a quorum",
                        a.endpoint()
                    ),
                ));
            }
        }
        Ok(Redlock {
            masters: masters.into(),
            prefix: Arc::from(DEFAULT_PREFIX),
        })
    }

    /// The same handle with keys under another prefix (`{prefix}redlock:{K}`).
    ///
    /// # Errors
    /// A [`ConfigError`] naming `prefix` unless it ends with `:`, is 1..=1024 bytes, not blank
    /// and free of `{` and `}`.
    pub fn with_prefix(&self, prefix: &str) -> Result<Redlock, ConfigError> {
        crate::util::names::check_prefix(prefix)?;
        Ok(Redlock {
            masters: self.masters.clone(),
            prefix: Arc::from(prefix),
        })
    }

    /// The key prefix in use. Defaults to `baton:`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many masters this Redlock has.
    pub fn masters(&self) -> usize {
        self.masters.len()
    }

    /// How many masters must agree: `masters / 2 + 1`.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.masters.len())
    }

    fn keys(&self, key: &str, lease: Duration) -> Result<Arc<RedlockKeys>, Error> {
        crate::util::names::check_name("key", key)?;
        crate::lease::check_ttl("lease", lease)?;
        Ok(Arc::new(RedlockKeys::new(&self.prefix, key)))
    }

    /// Tries once to take lock `key` for `lease` on a quorum of the masters (one round, every
    /// master at once). Contention is `Ok(None)`; the lock is then released on every master.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid name or a lease outside 10 ms ..= 1 day;
    /// [`Error::QuorumUnavailable`] when too many masters failed (down, timed out, erroring)
    /// for a quorum to be possible; [`Error::Timeout`] when a quorum said yes but the round
    /// took longer than the ttl allows (no validity left). In every error case the lock was
    /// released on every master that could be reached.
    ///
    /// # Cancel safety
    /// Dropping the future after the requests left releases by token on every master through
    /// a task of the first live master's client (if every client is gone, the ttl is the
    /// backstop).
    pub async fn try_acquire(
        &self,
        key: &str,
        lease: Duration,
    ) -> Result<Option<RedlockGuard>, Error> {
        let keys = self.keys(key, lease)?;
        self.try_once(&keys, key, lease, Instant::now()).await
    }

    /// One round; `asked` is when the caller asked, for the acquisition histogram.
    async fn try_once(
        &self,
        keys: &Arc<RedlockKeys>,
        key: &str,
        ttl: Duration,
        asked: Instant,
    ) -> Result<Option<RedlockGuard>, Error> {
        let token = new_token();
        // Armed before any request leaves: an early return or a dropped future releases by
        // token on every master unless disarmed.
        let mut pending = {
            let (masters, keys, token) = (self.masters.clone(), keys.clone(), token.clone());
            Armed::new(move || release_in_background(masters, keys, token))
        };
        let start = Instant::now();
        let replies = join_all(
            self.masters
                .iter()
                .map(|t| {
                    let limit = after(start, node_timeout(t.response_timeout(), ttl));
                    t.redlock_set(&keys.lock, &token, ttl, limit)
                })
                .collect(),
        )
        .await;
        let elapsed = start.elapsed();
        let yes = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        let failed = replies.iter().filter(|r| r.is_err()).count();
        let decision = decide(self.masters.len(), yes, failed, ttl, elapsed);
        if let Decision::Held { validity } = decision {
            pending.disarm();
            tracing::info!(
                key,
                token = short(&token),
                yes,
                masters = self.masters.len(),
                ?validity,
                "redlock acquired"
            );
            // A quorum's grant does not tell a holder that expired from a free lock.
            let labels = Labels::new(primitive::REDLOCK, metrics::backend::REDIS);
            labels.transition(metrics::transition::GRANT, start);
            labels.granted(false, asked);
            let state = LeaseState::new(
                after(start, validity),
                Labels::new(primitive::REDLOCK, metrics::backend::REDIS),
                start,
            );
            return Ok(Some(RedlockGuard {
                core: state.core(key, None),
                held: Some(Held {
                    masters: self.masters.clone(),
                    keys: keys.clone(),
                    key: key.to_string(),
                    token,
                    ttl,
                    round_start: start,
                    granted: start,
                    state,
                    watchdog: None,
                }),
            }));
        }
        // No quorum: undo on every master, the failed ones included (a lost reply may have
        // set the key there).
        let released = release_all(&self.masters, keys, &token, |t| {
            node_timeout(t.response_timeout(), ttl)
        })
        .await;
        if released.iter().all(Result::is_ok) {
            pending.disarm();
        }
        tracing::debug!(key, yes, failed, ?decision, "redlock not acquired");
        match decision {
            Decision::Unavailable { needed, reachable } => Err(Error::QuorumUnavailable {
                key: key.to_string(),
                needed,
                reachable,
                masters: self.masters.len(),
                errors: summary(&self.masters, &replies),
            }),
            Decision::Expired => Err(Error::Timeout {
                during: "acquiring the Redlock quorum within the lock's validity",
            }),
            Decision::Contended | Decision::Held { .. } => Ok(None),
        }
    }

    /// Takes lock `key` for `lease`, retrying while it is held elsewhere: exponential backoff
    /// with full jitter, bounded as `opts` says.
    ///
    /// # Errors
    /// [`Error::NotAcquired`] when the bound ran out with the lock held elsewhere (never a
    /// master failure in disguise); [`Error::Unsupported`] for an option Redlock does not use
    /// (`replica_ack`, `waiter_timeout`, `heartbeat`); otherwise as [`Redlock::try_acquire`],
    /// returned at once.
    ///
    /// # Cancel safety
    /// As [`Redlock::try_acquire`].
    pub async fn acquire(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
    ) -> Result<RedlockGuard, Error> {
        let keys = self.keys(key, lease)?;
        opts.refuse_others(
            "Redlock",
            &[
                Field::MaxTries,
                Field::MaxBackoff,
                Field::Watchdog,
                Field::MaxHold,
            ],
        )?;
        let mut acq = RedlockTry {
            redlock: self,
            keys,
            key,
            lease,
        };
        let mut guard = acquire::acquire(&mut acq, key, opts).await?;
        if opts.watchdog {
            guard.start_watchdog(opts.max_hold);
        }
        Ok(guard)
    }

    /// Runs `work` holding lock `key`: acquires as [`Redlock::acquire`] does (with `opts`, the
    /// watchdog always on), calls `work` with the guard, cancels the future it returns if the lock is lost (no
    /// quorum extension confirmed before the lease deadline, or a round found it held
    /// elsewhere), and always releases. The guard has no fencing token: Redlock has none (see
    /// the [module docs](self)).
    ///
    /// # Errors
    /// As [`Redlock::acquire`]; [`Error::LeaseLost`] when the loss signal fired during `work`
    /// (which was dropped at that point) or when the release found no quorum still holding the
    /// lock (mutual exclusion may then have been broken, so `work`'s output is not returned). A
    /// release that fails on the network is only logged: `work` finished in time and the lock
    /// expires by its lease.
    ///
    /// # Cancel safety
    /// Dropping the future drops `work` and the guard, which releases in the background.
    pub async fn with_lock<F, Fut>(
        &self,
        key: &str,
        lease: Duration,
        opts: &LockOptions,
        work: F,
    ) -> Result<Fut::Output, Error>
    where
        F: FnOnce(&RedlockGuard) -> Fut,
        Fut: Future,
    {
        let opts = opts.clone().with_watchdog();
        let guard = self.acquire(key, lease, &opts).await?;
        acquire::with_lock(guard, work).await
    }
}

/// One quorum round, as the acquisition engine drives it: failures are returned at once (a
/// round that found masters down says so, and the caller decides), contention is retried
/// after the backoff (its jitter keeps competing clients from colliding round after round).
struct RedlockTry<'a> {
    redlock: &'a Redlock,
    keys: Arc<RedlockKeys>,
    key: &'a str,
    lease: Duration,
}

impl TryAcquire for RedlockTry<'_> {
    type Guard = RedlockGuard;
    type Channel = NoChannel;

    async fn try_once(
        &mut self,
        _takeover: bool,
        asked: Instant,
    ) -> Result<Tried<RedlockGuard>, Error> {
        Ok(
            match self
                .redlock
                .try_once(&self.keys, self.key, self.lease, asked)
                .await?
            {
                Some(guard) => Tried::Granted(guard),
                None => Tried::Held { remaining: None },
            },
        )
    }

    fn retries(&self, _: &Error) -> bool {
        false
    }
}

/// One extension round: compare-and-`PEXPIRE` to `ttl` on every master at once, each bounded
/// far below `ttl`. Returns when the round started (before any request left) and the replies in
/// the masters' order.
async fn extend_round(
    masters: &[Backend],
    keys: &RedlockKeys,
    token: &str,
    ttl: Duration,
) -> (Instant, Vec<Result<Extension, Error>>) {
    let start = Instant::now();
    let replies = join_all(
        masters
            .iter()
            .map(|t| {
                let limit = after(start, node_timeout(t.response_timeout(), ttl));
                t.redlock_extend(&keys.lock, token, ttl, limit)
            })
            .collect(),
    )
    .await;
    (start, replies)
}

/// Compare-and-delete by token on every master at once, each bounded by `timeout(master)`:
/// per master, whether it still held the token.
async fn release_all(
    masters: &[Backend],
    keys: &RedlockKeys,
    token: &str,
    timeout: impl Fn(&Backend) -> Duration,
) -> Vec<Result<bool, Error>> {
    let start = Instant::now();
    join_all(
        masters
            .iter()
            .map(|t| {
                let limit = after(start, timeout(t));
                t.redlock_release(&keys.lock, &keys.channel, token, limit)
            })
            .collect(),
    )
    .await
}

/// `master i (host:port/db): error; …` for the masters whose reply is an error.
fn summary<T>(masters: &[Backend], replies: &[Result<T, Error>]) -> String {
    let parts: Vec<String> = masters
        .iter()
        .zip(replies)
        .enumerate()
        .filter_map(|(i, (t, r))| {
            r.as_ref()
                .err()
                .map(|e| format!("master {i} ({}): {e}", t.endpoint()))
        })
        .collect();
    parts.join("; ")
}

/// Polls every future until all are done; the outputs in the order given. (A `join_all`
/// without a dependency: a handful of futures, each re-polled on any wake-up.)
async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Pin<Box<F>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut waiting = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    Poll::Ready(v) => *o = Some(v),
                    Poll::Pending => waiting = true,
                }
            }
        }
        if waiting {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

/// Spawns a token-checked release on every master on the tracker of the first master whose
/// client is not shut down (so `shutdown` waits for it); never blocks. Without a runtime or a
/// live client, the ttl is the backstop.
fn release_in_background(masters: Masters, keys: Arc<RedlockKeys>, token: String) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Some(host) = masters.iter().find(|t| !t.cancel().is_cancelled()).cloned() else {
        return;
    };
    host.tracker().spawn_on(
        async move {
            let replies = release_all(&masters, &keys, &token, |t| t.response_timeout()).await;
            let held = replies.iter().filter(|r| matches!(r, Ok(true))).count();
            let failed = replies.iter().filter(|r| r.is_err()).count();
            if failed > 0 {
                tracing::warn!(key = %keys.lock, held, failed, errors = %summary(&masters, &replies), "background Redlock release failed on some masters; the lock expires there by its ttl");
            } else {
                tracing::debug!(key = %keys.lock, token = short(&token), held, "Redlock released in the background");
            }
        },
        &handle,
    );
}

/// A held Redlock. Release it with [`RedlockGuard::release`]; dropping it releases on every
/// master in the background.
///
/// It implements [`LeaseGuard`] but not [`Fenced`](crate::Fenced): there is no fencing token.
/// A token would have to grow across grants on a quorum of independent masters, and a master
/// restarted without persistence forgets what it held, so no counter kept on them could be
/// made monotonic (see the [module docs](self)). Stop using the lock before its
/// [`lease_deadline`](HeldLease::lease_deadline): its validity, in Redlock's words (start of
/// the granting or last confirmed extending round + ttl − elapsed − drift; always before
/// `start + ttl`).
///
/// Its loss signal fires when an extension round (the watchdog's or
/// [`RedlockGuard::extend`]'s) found no quorum still holding this guard's token, when the
/// watchdog could not confirm a quorum extension before the validity ends (its own timer: a
/// hung master never delays it), or when non-retryable errors (ACL, wrong type) made a quorum
/// impossible. Without the watchdog it only fires on a refused extension: watch the deadline
/// yourself.
pub struct RedlockGuard {
    /// What [`HeldLease`] reads.
    core: LeaseCore,
    held: Option<Held>,
}

struct Held {
    masters: Masters,
    keys: Arc<RedlockKeys>,
    key: String,
    token: String,
    ttl: Duration,
    /// When the granting (or last confirmed extending) round started.
    round_start: Instant,
    /// When the granting round started (a watchdog's hold cap counts from it).
    granted: Instant,
    /// The validity deadline and the loss signal, shared with the watchdog.
    state: Arc<LeaseState>,
    /// Stops the watchdog, when one runs.
    watchdog: Option<CancellationToken>,
}

impl std::fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the full token: it is what a holder proves itself with.
        let mut d = f.debug_struct("RedlockGuard");
        if let Some(h) = &self.held {
            d.field("key", &h.key)
                .field("token", &short(&h.token))
                .field("masters", &h.masters.len());
        }
        d.finish_non_exhaustive()
    }
}

impl RedlockGuard {
    // `held` is `Some` for the guard's whole life: only `release(self)` and `Drop` take it.
    fn held(&self) -> Option<&Held> {
        self.held.as_ref()
    }

    /// This holder's random 128-bit token (hex), as stored on the masters. Not a fencing token:
    /// it does not grow from one grant to the next.
    pub fn token(&self) -> &str {
        self.held().map(|h| h.token.as_str()).unwrap_or_default()
    }

    /// Starts the watchdog (once; later calls do nothing). It extends the lock by quorum every
    /// `ttl / 3`, counted from the start of the last confirmed round, moves
    /// [`HeldLease::lease_deadline`] with each confirmed quorum extension, retries
    /// transient failures (masters down, timeouts, a round too slow to leave validity) with
    /// backoff until the validity deadline, and fires the loss signal as the
    /// [type's docs](RedlockGuard) describe. It runs on the task tracker of the first
    /// master's client that is not shut down, stops on `release` or drop, and fires the loss
    /// signal if that client shuts down. Without a live client or a runtime it fires the loss
    /// signal at once: nobody would extend. With `max_hold`, it stops extending once the lock
    /// was held that long (counted from the granting round's start; no extension reaches past
    /// it) and fires the loss signal then.
    pub fn start_watchdog(&mut self, max_hold: Option<Duration>) {
        let Some(h) = self.held.as_mut() else {
            return;
        };
        if h.watchdog.is_some() {
            return;
        }
        let stop = CancellationToken::new();
        watchdog::spawn(
            watchdog::Watch {
                masters: h.masters.clone(),
                keys: h.keys.clone(),
                key: h.key.clone(),
                token: h.token.clone(),
                ttl: h.ttl,
                round_start: h.round_start,
                hold_until: max_hold.map(|m| after(h.granted, m)),
            },
            h.state.clone(),
            stop.clone(),
        );
        h.watchdog = Some(stop);
    }

    /// Whether the watchdog runs.
    pub fn has_watchdog(&self) -> bool {
        self.held().is_some_and(|h| h.watchdog.is_some())
    }

    /// Extends the lock to `lease` on every master that still holds this guard's token
    /// (compare-and-`PEXPIRE`, every master at once, each bounded far below `lease`). `Ok(true)`
    /// iff a quorum confirmed with validity left; the validity deadline then moves, computed as
    /// for an acquisition. `Ok(false)`: no quorum still held it (or the round took too long);
    /// nothing was deleted anywhere and the deadline stays.
    ///
    /// # Errors
    /// [`Error::Config`] for a lease outside 10 ms ..= 1 day; [`Error::QuorumUnavailable`] when
    /// too many masters failed to tell (the deadline stays).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped extension leaves the deadline where it was.
    pub async fn extend(&mut self, lease: Duration) -> Result<bool, Error> {
        crate::lease::check_ttl("lease", lease)?;
        let Some(h) = self.held.as_mut() else {
            return Ok(false);
        };
        let (start, replies) = extend_round(&h.masters, &h.keys, &h.token, lease).await;
        let elapsed = start.elapsed();
        let yes = replies
            .iter()
            .filter(|r| matches!(r, Ok(Extension::Confirmed { .. })))
            .count();
        let failed = replies.iter().filter(|r| r.is_err()).count();
        match decide(h.masters.len(), yes, failed, lease, elapsed) {
            Decision::Held { validity } => {
                h.ttl = lease;
                h.round_start = start;
                h.state.confirmed(after(start, validity));
                Ok(true)
            }
            Decision::Unavailable { needed, reachable } => Err(Error::QuorumUnavailable {
                key: h.key.clone(),
                needed,
                reachable,
                masters: h.masters.len(),
                errors: summary(&h.masters, &replies),
            }),
            Decision::Contended => {
                tracing::warn!(key = %h.key, token = short(&h.token), yes, failed, "Redlock extension without a quorum");
                h.state.lose(Loss::Taken, format!(
                    "an extension round found no quorum still holding the lock ({yes} of {} masters did, {} needed)",
                    h.masters.len(),
                    quorum::quorum(h.masters.len())
                ));
                Ok(false)
            }
            Decision::Expired => {
                tracing::warn!(key = %h.key, token = short(&h.token), yes, failed, "Redlock extension round too slow to leave any validity");
                Ok(false)
            }
        }
    }

    /// Releases the lock on every master (compare-and-delete by token, every master at once,
    /// each bounded by its client's response timeout). `Ok(true)` when a quorum of masters
    /// still held this guard's token (it was still ours), `Ok(false)` when fewer did (it may
    /// have been taken over; nothing of another holder's was deleted). Failures on a minority
    /// are logged (the lock expires there by its ttl).
    ///
    /// # Errors
    /// [`Error::QuorumUnavailable`] when fewer than a quorum of masters answered: the lock may
    /// still be held on a quorum until its ttl.
    ///
    /// # Cancel safety
    /// Dropping the future after the guard was moved in leaves the outcome unknown; the ttl is
    /// the backstop.
    pub async fn release(self) -> Result<bool, Error> {
        let needed = quorum::quorum(self.held().map_or(0, |h| h.masters.len()));
        Ok(self.release_counted().await? >= needed.max(1))
    }

    /// [`RedlockGuard::release`], answering on how many masters the lock was still held by this
    /// guard's token (for a caller that reports how far a loss went, e.g. "held on 2 of 3").
    ///
    /// # Errors
    /// As [`RedlockGuard::release`].
    ///
    /// # Cancel safety
    /// As [`RedlockGuard::release`].
    pub async fn release_counted(mut self) -> Result<usize, Error> {
        let Some(h) = self.held.take() else {
            return Ok(0);
        };
        if let Some(stop) = &h.watchdog {
            stop.cancel();
        }
        h.state.released();
        let sent = Instant::now();
        let replies = release_all(&h.masters, &h.keys, &h.token, |t| t.response_timeout()).await;
        h.state
            .labels()
            .transition(metrics::transition::RELEASE, sent);
        let held = replies.iter().filter(|r| matches!(r, Ok(true))).count();
        let failed = replies.iter().filter(|r| r.is_err()).count();
        let needed = quorum::quorum(h.masters.len());
        let reachable = h.masters.len().saturating_sub(failed);
        if reachable < needed {
            return Err(Error::QuorumUnavailable {
                key: h.key.clone(),
                needed,
                reachable,
                masters: h.masters.len(),
                errors: summary(&h.masters, &replies),
            });
        }
        if failed > 0 {
            tracing::warn!(key = %h.key, held, failed, errors = %summary(&h.masters, &replies), "Redlock release failed on some masters; the lock expires there by its ttl");
        }
        tracing::info!(key = %h.key, token = short(&h.token), held, "redlock released");
        Ok(held)
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        if let Some(h) = self.held.take() {
            if let Some(stop) = &h.watchdog {
                stop.cancel();
            }
            h.state.released();
            release_in_background(h.masters, h.keys, h.token);
        }
    }
}

impl sealed::Sealed for RedlockGuard {
    fn core(&self) -> &LeaseCore {
        &self.core
    }
}

impl HeldLease for RedlockGuard {}

impl LeaseGuard for RedlockGuard {
    fn extend(&mut self, lease: Duration) -> impl Future<Output = Result<bool, Error>> + Send {
        RedlockGuard::extend(self, lease)
    }
    fn release(self) -> impl Future<Output = Result<bool, Error>> + Send {
        RedlockGuard::release(self)
    }
    fn start_watchdog(&mut self, max_hold: Option<Duration>) {
        RedlockGuard::start_watchdog(self, max_hold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn join_all_keeps_the_order() {
        let out = join_all(
            [30u64, 0, 10]
                .into_iter()
                .map(|d| async move {
                    tokio::time::sleep(Duration::from_millis(d)).await;
                    d
                })
                .collect(),
        )
        .await;
        assert_eq!(out, vec![30, 0, 10]);
    }
}
