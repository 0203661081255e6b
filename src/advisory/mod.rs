//! PostgreSQL advisory locks, done so that the classic mistakes cannot be made (feature
//! `postgres`; [`Client::advisory_locks`](crate::Client::advisory_locks)).
//!
//! An advisory lock is a lock on a number that PostgreSQL keeps in its lock manager: real
//! mutual exclusion between sessions, shared or exclusive, with waiters queued and woken by the
//! server. It has **no lease**: it lives exactly as long as what holds it, a transaction or a
//! session (a connection). There is nothing to extend and nothing that expires; a holder that
//! hangs while its connection stays up holds the lock for as long as it hangs.
//!
//! Two forms:
//!
//! - **Transaction-scoped** ([`AdvisoryLocks::with_xact_lock`],
//!   [`AdvisoryLocks::try_with_xact_lock`]): your closure runs inside a transaction on a pooled
//!   connection that holds `pg_advisory_xact_lock[_shared]`; it commits when the closure returns
//!   `Ok` and rolls back on `Err`, and the lock ends with the transaction: there is no unlock to
//!   forget. Prefer this form: it works through any connection pooler, including PgBouncer in
//!   transaction mode.
//! - **Session-scoped** ([`AdvisoryLocks::acquire`], [`AdvisoryLocks::try_acquire`] →
//!   [`AdvisoryGuard`]): the lock is taken on a **dedicated connection** that the guard owns
//!   for its whole life, never one from the pool. The pitfall of session locks through a pool
//!   (locked on one pooled connection, "unlocked" on another, where `pg_advisory_unlock` just
//!   returns false and the lock stays forever) cannot happen: [`AdvisoryGuard::release`] unlocks
//!   on the connection that locked, checks that PostgreSQL says it was held, and closes it.
//!   Dropping a guard closes its connection without blocking, and the server frees the lock when
//!   it sees the connection end. There is no API to unlock a key this process does not hold.
//!
//! Both have a try form (contention is `Ok(None)`, never an error) and a blocking form that
//! waits in the server's queue (woken by PostgreSQL when the lock is freed, nothing polls),
//! bounded by [`LockOptions::wait`]: the statement runs with `lock_timeout` set to it, and
//! when the server gives up (SQLSTATE `55P03` `lock_not_available`) the call returns
//! [`Error::NotAcquired`]. Without a wait bound it waits until granted.
//!
//! # Keys
//! [`AdvisoryKey`]: an `i64`, an `(i32, i32)` pair (a separate key space in PostgreSQL: `1` and
//! `(0, 1)` never conflict), or a string hashed to 64 bits with FNV-1a
//! ([`AdvisoryKey::hashed`]; two names collide with odds about n²/2⁶⁵ for n names, 1 in
//! 3.7×10⁷ for a million; a collision makes two names wait for each other, never share the
//! lock at once).
//!
//! # Session guards: stacking, loss, fencing
//! - **Stacked acquires are forbidden by construction.** PostgreSQL counts re-entrant session
//!   locks (lock twice in one session, unlock twice), but every guard has a connection of its
//!   own, so two guards of one key in one process are two sessions and contend like two
//!   processes: the second `try_acquire` returns `None`, a second `acquire` waits for the
//!   first guard (in one task, forever: that is a self-deadlock, bound it with a `wait`).
//! - **Loss signal** ([`HeldLease::lost`], [`HeldLease::lost_token`],
//!   [`HeldLease::is_lost`]): fires when the guard's connection ends (the server terminated
//!   the backend, restarted, the socket failed), and when a **heartbeat** (`SELECT
//!   pg_backend_pid()` on that
//!   connection every [`LockOptions::heartbeat`], default **1 s**, each bounded by the
//!   client's response timeout) fails or goes unanswered; the guard then closes its side of
//!   the connection. A silently dead link is thus found within heartbeat + response timeout
//!   (1.5 s with the defaults). After a loss, [`AdvisoryGuard::release`] returns
//!   `Ok(false)` (it was no longer held), never `Ok(true)`. The server frees the lock when it notices the session
//!   is gone (at once for a terminated backend; for a dead link, when its TCP keepalives or a
//!   write fail). Statements you run on [`AdvisoryGuard::client`] share the connection with the
//!   heartbeat: one running longer than the response timeout makes the heartbeat's answer late,
//!   which counts as a loss, so keep long work off the guard's connection.
//! - **Fencing token** ([`Fenced::fencing_token`]): advisory locks have none, so baton
//!   takes `nextval('baton_advisory_fence')` on the guard's connection right after the lock is
//!   granted, as a statement of its own (so its own transaction, committed at once). A sequence
//!   does not go back: `nextval` is never rolled back, and a sequence is WAL-logged ahead (32
//!   values at a time) by the `nextval` that crosses the logged mark, whose transaction then
//!   flushes that WAL at commit; so after a crash the next values jump forward and never repeat
//!   one already handed out, **as long as `fsync` and `synchronous_commit` are on** (the
//!   defaults). With `synchronous_commit = off` a crash may lose the last WAL and hand out a
//!   token again. So tokens strictly increase across successive holders of a key (the next
//!   holder's `nextval` runs after the previous holder's, since the lock orders them), and are
//!   unique across all keys. The sequence is created on
//!   first use (`CREATE SEQUENCE IF NOT EXISTS baton_advisory_fence` in the first schema of the
//!   `search_path`), which needs the `CREATE` privilege there; otherwise create it once with
//!   `baton migrate` ([`AdvisoryLocks::migrate`]) and grant `USAGE` on it (a role that may not
//!   create it gets [`ErrorKind::Misconfigured`] naming that step).
//! - A session lock survives a rolled-back transaction on its connection (PostgreSQL's rule):
//!   statements you run on [`AdvisoryGuard::client`] (`BEGIN … ROLLBACK` included) leave it
//!   held.
//!
//! # Connection poolers
//! **Session locks do not work through PgBouncer in transaction (or statement) pooling mode**:
//! there, consecutive statements of one client connection may run on different server
//! sessions, so the lock may be taken on one server session, never seen again, and held until
//! that server connection closes, while the unlock runs on another session and fails. baton
//! cannot detect such a pooler reliably, so: connect session locks directly to PostgreSQL, or
//! through a pooler in **session** pooling mode. It does catch one when it shows, at no cost:
//! the lock statement, the `nextval` after it and every heartbeat return `pg_backend_pid()`,
//! and a pid that changes refuses the acquisition ([`Error::Unsupported`]) or fires the loss
//! signal. A pooler that happens to route every statement to the same server session passes
//! these checks, so they are a safety net, never a guarantee. The
//! transaction-scoped form is safe under transaction pooling (the whole transaction runs on one
//! server session).

pub mod key;
pub mod options;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::advisory::{sql, Beat, Call, Dedicated, PgTransport, Pooled, CREATE_FENCE};
use crate::backend::Backend;
use crate::error::{Error, ErrorKind};
use crate::lease::guard::{deadline_cell, sealed, Fenced, HeldLease, LeaseCore, LossSignal};
use crate::util::time::{after, FAR};

/// The PostgreSQL driver baton uses, re-exported so that closures name the same version's
/// [`Transaction`] and [`Client`](PgClient).
pub use crate::backend::advisory::tokio_postgres;
use crate::backend::advisory::{Client as PgClient, Transaction};
pub use key::AdvisoryKey;
use key::Repr;
pub use options::{
    AdvisoryOptions, AdvisoryOptionsBuilder, LockOptions, LockOptionsBuilder, DEFAULT_HEARTBEAT,
};

/// The future a transaction-scoped closure returns: boxed, so that it may borrow the
/// transaction it is given.
pub type XactFuture<'t, T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 't>>;

/// Exclusive or shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdvisoryMode {
    /// One holder at a time; excludes shared holders too.
    Exclusive,
    /// Any number of shared holders at once; excludes exclusive holders.
    Shared,
}

/// `key` in PostgreSQL's key spaces, and whether `mode` is shared: what the statements take.
fn wire(key: AdvisoryKey, mode: AdvisoryMode) -> (sql::Key, bool) {
    let key = match key.repr() {
        Repr::Int(k) => sql::Key::Int(k),
        Repr::Pair(a, b) => sql::Key::Pair(a, b),
    };
    (key, mode == AdvisoryMode::Shared)
}

/// A pooled connection that goes back to the pool only when marked clean: after an error of
/// unknown effect, a timeout or a dropped future it is detached and closed instead, so nobody
/// else inherits a transaction or a statement still waiting for a lock.
struct PoolLease {
    conn: Option<Pooled>,
    clean: bool,
}

impl PoolLease {
    fn client(&mut self) -> Result<&mut PgClient, Error> {
        match self.conn.as_mut() {
            Some(conn) => Ok(conn),
            None => Err(Error::Connection {
                message: "PostgreSQL: the pooled connection was already given up".into(),
                source: None,
            }),
        }
    }
}

impl Drop for PoolLease {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if !self.clean {
                // Detached from the pool and dropped: the socket closes.
                conn.retire();
            }
        }
    }
}

/// Advisory locks on one PostgreSQL client's connections. Get it from
/// [`Client::advisory_locks`](crate::Client::advisory_locks); cheap to clone. On a Redis client
/// every operation returns [`Error::Unsupported`]. See the [module docs](self).
#[derive(Clone)]
pub struct AdvisoryLocks {
    backend: Backend,
}

impl std::fmt::Debug for AdvisoryLocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdvisoryLocks")
            .field("backend", &self.backend.name())
            .finish()
    }
}

impl AdvisoryLocks {
    /// The handle on `backend` (the client façade's only way in).
    pub(crate) fn new(backend: Backend) -> Self {
        AdvisoryLocks { backend }
    }

    fn transport(&self) -> Result<&Arc<PgTransport>, Error> {
        self.backend.postgres(
            "advisory locks",
            "advisory locks are PostgreSQL's; on Redis use `locks()` (the fenced mutex)",
        )
    }

    /// Creates what advisory locks store, if missing: the sequence `baton_advisory_fence` that
    /// fencing tokens come from (acquisitions create it on first use).
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a Redis client; connection and permission errors.
    pub async fn migrate(&self) -> Result<(), Error> {
        self.transport()?.migrate_schema(CREATE_FENCE).await
    }

    /// Takes `key` in `mode` if it is free: `Ok(None)` when another session holds it in a
    /// conflicting mode. The guard owns a new dedicated connection (see [`AdvisoryGuard`]).
    ///
    /// `opts` gives the heartbeat; its `wait` is not used.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a Redis client; connection errors and timeouts; a PostgreSQL
    /// error (e.g. no privilege to create the fencing sequence).
    pub async fn try_acquire(
        &self,
        key: impl Into<AdvisoryKey>,
        mode: AdvisoryMode,
        opts: &AdvisoryOptions,
    ) -> Result<Option<AdvisoryGuard>, Error> {
        self.session(key.into(), mode, opts, true).await
    }

    /// Takes `key` in `mode`, waiting in PostgreSQL's queue until it is granted, for at most
    /// [`AdvisoryOptions::wait`] if set. The guard owns a new dedicated connection.
    ///
    /// Dropping the returned future while it waits closes that connection and asks the server
    /// to cancel the wait. Without a `wait` bound, a link that dies silently during the wait is
    /// only noticed by TCP keepalives (minutes): prefer a bound.
    ///
    /// # Errors
    /// [`Error::NotAcquired`] when the wait ran out (the server's `lock_timeout`);
    /// [`Error::Unsupported`] on a Redis client; connection errors and timeouts.
    pub async fn acquire(
        &self,
        key: impl Into<AdvisoryKey>,
        mode: AdvisoryMode,
        opts: &AdvisoryOptions,
    ) -> Result<AdvisoryGuard, Error> {
        let key = key.into();
        let mut acq = AdvisoryTry {
            locks: self,
            key,
            mode,
            opts,
        };
        crate::lease::acquire::acquire(&mut acq, &key.to_string(), opts).await
    }

    async fn session(
        &self,
        key: AdvisoryKey,
        mode: AdvisoryMode,
        opts: &AdvisoryOptions,
        try_only: bool,
    ) -> Result<Option<AdvisoryGuard>, Error> {
        let asked = Instant::now();
        let t = self.transport()?.clone();
        options::check(opts)?;
        let conn = t.dedicated().await?;
        let client = &conn.client;
        let (k, shared) = wire(key, mode);
        let granted = if try_only {
            match sql::try_lock(&t, client, Call::TryLock, shared, k).await? {
                Some(granted) => granted,
                // Dropping `conn` closes the connection.
                None => return Ok(None),
            }
        } else {
            let lock_timeout = options::lock_timeout(opts);
            if let Some(lock_timeout) = &lock_timeout {
                sql::set_lock_timeout(&t, client, lock_timeout, false).await?;
            }
            let name = key.to_string();
            let granted =
                sql::wait_for_lock(&t, client, Call::Lock, shared, k, opts.wait(), &name).await?;
            if lock_timeout.is_some() {
                sql::reset_lock_timeout(&t, client, false).await?;
            }
            granted
        };
        let lock_pid = granted.backend_pid()?;
        let (fencing_token, backend_pid) = sql::next_fence(&t, client).await?;
        if lock_pid != backend_pid {
            // Two statements, two server sessions: a pooler in transaction mode (see the module
            // docs). Dropping `conn` is all that can be done; the lock stays on the server
            // session that took it until the pooler resets or closes that one.
            return Err(Error::Unsupported {
                what: "session-scoped advisory locks",
                backend: "a connection pooler in transaction or statement pooling mode",
                why: "two consecutive statements ran in different server sessions (different \
                      pg_backend_pid()), so a session lock cannot be held or released \
                      reliably; connect directly or in session pooling mode, or use \
                      with_xact_lock",
            });
        }
        // PostgreSQL's lock table knows no lease to expire: a grant is never a takeover.
        crate::util::metrics::Labels::new(
            crate::util::metrics::primitive::ADVISORY,
            crate::util::metrics::backend::POSTGRES,
        )
        .granted(false, asked);
        Ok(Some(AdvisoryGuard::start(
            t,
            conn,
            key,
            mode,
            fencing_token,
            backend_pid,
            opts.heartbeat(),
        )))
    }

    /// Runs `work` inside a transaction on a pooled connection that holds `key` in `mode`
    /// (`pg_advisory_xact_lock[_shared]`), waiting for the lock for at most
    /// [`AdvisoryOptions::wait`] if set. Commits when `work` returns `Ok`, rolls back when it
    /// returns `Err`; the lock ends with the transaction either way.
    ///
    /// ```no_run
    /// use baton::advisory::{AdvisoryKey, AdvisoryMode, AdvisoryOptions};
    /// # async fn demo(client: baton::Client) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    /// let n: i64 = client
    ///     .advisory_locks()
    ///     .with_xact_lock(
    ///         AdvisoryKey::hashed("invoices"),
    ///         AdvisoryMode::Exclusive,
    ///         &AdvisoryOptions::default(),
    ///         |tx| Box::pin(async move {
    ///             let row = tx.query_one("UPDATE counters SET n = n + 1 RETURNING n", &[]).await?;
    ///             Ok::<_, Box<dyn std::error::Error + Send + Sync>>(row.get(0))
    ///         }),
    ///     )
    ///     .await??; // baton's failure first, then the work's own error
    /// # Ok(()) }
    /// ```
    ///
    /// The lock statement's `lock_timeout` is reset (`SET LOCAL lock_timeout TO DEFAULT`) before
    /// `work` runs, so `work`'s own statements are not bound by it.
    ///
    /// # Errors
    /// As every method that runs your code (crate docs, "Errors"): what `work` returns comes
    /// back inside `Ok` — `Ok(Ok(value))` after the commit, `Ok(Err(e))` after the rollback —
    /// and only baton's own failures are `Err`: [`Error::NotAcquired`] when the wait ran out,
    /// [`Error::Unsupported`] on a Redis client, connection errors and timeouts (a failed
    /// `COMMIT` is a connection error whose outcome is unknown: the transaction may or may not
    /// have committed).
    pub async fn with_xact_lock<T, E, F>(
        &self,
        key: impl Into<AdvisoryKey>,
        mode: AdvisoryMode,
        opts: &AdvisoryOptions,
        work: F,
    ) -> Result<Result<T, E>, Error>
    where
        F: for<'t> FnOnce(&'t Transaction<'t>) -> XactFuture<'t, T, E>,
    {
        let key = key.into();
        match self.xact(key, mode, opts, false, work).await? {
            Some(out) => Ok(out),
            None => Err(Error::NotAcquired {
                key: key.to_string(),
                tries: 1,
                waited: Duration::ZERO,
            }),
        }
    }

    /// As [`with_xact_lock`](Self::with_xact_lock) without waiting
    /// (`pg_try_advisory_xact_lock[_shared]`): `Ok(None)` when the lock is held in a
    /// conflicting mode, and then `work` does not run.
    ///
    /// # Errors
    /// As [`with_xact_lock`](Self::with_xact_lock) (`Ok(Some(Ok(value)))`,
    /// `Ok(Some(Err(e)))`), except `NotAcquired`.
    pub async fn try_with_xact_lock<T, E, F>(
        &self,
        key: impl Into<AdvisoryKey>,
        mode: AdvisoryMode,
        opts: &AdvisoryOptions,
        work: F,
    ) -> Result<Option<Result<T, E>>, Error>
    where
        F: for<'t> FnOnce(&'t Transaction<'t>) -> XactFuture<'t, T, E>,
    {
        self.xact(key.into(), mode, opts, true, work).await
    }

    async fn xact<T, E, F>(
        &self,
        key: AdvisoryKey,
        mode: AdvisoryMode,
        opts: &AdvisoryOptions,
        try_only: bool,
        work: F,
    ) -> Result<Option<Result<T, E>>, Error>
    where
        F: for<'t> FnOnce(&'t Transaction<'t>) -> XactFuture<'t, T, E>,
    {
        let t = self.transport()?.clone();
        options::check(opts)?;
        let mut lease = PoolLease {
            conn: Some(t.pooled().await?),
            clean: false,
        };
        let tx = t
            .timed("beginning a transaction", lease.client()?.transaction())
            .await?;
        // The pool's connections bound baton's own statements at the response timeout; the
        // wait and the caller's work get the role's own setting back.
        sql::unbound_statements(&t, &tx).await?;
        let client = tx.client();
        let (k, shared) = wire(key, mode);
        if try_only {
            let granted = sql::try_lock(&t, client, Call::TryXactLock, shared, k).await?;
            if granted.is_none() {
                t.timed("rolling back", tx.rollback()).await?;
                lease.clean = true;
                return Ok(None);
            }
        } else {
            let lock_timeout = options::lock_timeout(opts);
            if let Some(lock_timeout) = &lock_timeout {
                sql::set_lock_timeout(&t, client, lock_timeout, true).await?;
            }
            let name = key.to_string();
            let wait = opts.wait();
            if let Err(e) =
                sql::wait_for_lock(&t, client, Call::XactLock, shared, k, wait, &name).await
            {
                if e.kind() == ErrorKind::NotAcquired
                    && t.timed("rolling back", tx.rollback()).await.is_ok()
                {
                    lease.clean = true;
                }
                return Err(e);
            }
            if lock_timeout.is_some() {
                sql::reset_lock_timeout(&t, client, true).await?;
            }
        }
        match work(&tx).await {
            Ok(out) => {
                t.timed("committing", tx.commit()).await?;
                lease.clean = true;
                Ok(Some(Ok(out)))
            }
            Err(e) => {
                match t.timed("rolling back", tx.rollback()).await {
                    Ok(()) => lease.clean = true,
                    Err(rollback) => tracing::warn!(
                        key = %key,
                        error = %rollback,
                        "rolling back after the work failed did not answer; the connection is \
                         closed, which ends the transaction and its lock"
                    ),
                }
                Ok(Some(Err(e)))
            }
        }
    }
}

/// The advisory lock's one try for the acquisition engine: the blocking statement, which
/// waits in the server's queue (bounded by `lock_timeout`), so the engine never loops: a grant
/// or an error, none retried.
struct AdvisoryTry<'a> {
    locks: &'a AdvisoryLocks,
    key: AdvisoryKey,
    mode: AdvisoryMode,
    opts: &'a AdvisoryOptions,
}

impl crate::lease::acquire::TryAcquire for AdvisoryTry<'_> {
    type Guard = AdvisoryGuard;
    type Channel = crate::lease::acquire::NoChannel;

    async fn try_once(
        &mut self,
        _takeover: bool,
        _asked: Instant,
    ) -> Result<crate::lease::acquire::Tried<AdvisoryGuard>, Error> {
        match self
            .locks
            .session(self.key, self.mode, self.opts, false)
            .await?
        {
            Some(guard) => Ok(crate::lease::acquire::Tried::Granted(guard)),
            // The blocking statement either grants or errs; this is only for completeness.
            None => Err(Error::NotAcquired {
                key: self.key.to_string(),
                tries: 1,
                waited: Duration::ZERO,
            }),
        }
    }

    fn retries(&self, _: &Error) -> bool {
        false
    }
}

/// A session-scoped advisory lock, held on a dedicated connection the guard owns (see the
/// [module docs](self)). Release it with [`release`](Self::release), which says whether it was
/// still held; dropping it closes the connection, which frees the lock server-side.
///
/// A held lease like the others for reading ([`HeldLease`], [`Fenced`]): the key is the
/// advisory key as text (`7`, `1,2`; [`advisory_key`](Self::advisory_key) gives the typed
/// one), the loss signal fires when the connection ends or the heartbeat fails, and also when
/// the guard is released or dropped (its connection closes then).
///
/// Its [`lease_deadline`](HeldLease::lease_deadline) is **far in the future** (a year from the
/// grant), and never moves: a session lock has no deadline. It is held until its session ends,
/// which the loss signal reports, not until a time. A deadline built from the heartbeat (last
/// answered check + interval) would pass between two healthy heartbeats and make code that
/// sleeps until the deadline stop a lock that is still held; code that needs a bound on the
/// hold sets its own.
///
/// Not a [`LeaseGuard`](crate::LeaseGuard): there is nothing to extend and no watchdog. Its
/// `release() -> Result<bool>` answers as the leases' does.
pub struct AdvisoryGuard {
    key: AdvisoryKey,
    mode: AdvisoryMode,
    backend_pid: i32,
    conn: Arc<Dedicated>,
    transport: Arc<PgTransport>,
    /// What [`HeldLease`] reads. Its loss signal is linked to the connection's `closed`: it
    /// fires when the connection ends or the heartbeat gives up.
    core: LeaseCore,
    /// Stops the heartbeat (release, drop).
    stop: CancellationToken,
}

impl std::fmt::Debug for AdvisoryGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdvisoryGuard")
            .field("key", &self.key)
            .field("mode", &self.mode)
            .field("fencing_token", &self.fencing_token())
            .field("backend_pid", &self.backend_pid)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl sealed::Sealed for AdvisoryGuard {
    fn core(&self) -> &LeaseCore {
        &self.core
    }
}

impl HeldLease for AdvisoryGuard {}

impl Fenced for AdvisoryGuard {}

impl Drop for AdvisoryGuard {
    fn drop(&mut self) {
        self.stop.cancel();
        // Drops the socket without waiting: the server ends the session and frees the lock.
        self.conn.close();
    }
}

impl AdvisoryGuard {
    fn start(
        transport: Arc<PgTransport>,
        conn: Dedicated,
        key: AdvisoryKey,
        mode: AdvisoryMode,
        fencing_token: u64,
        backend_pid: i32,
        heartbeat: Duration,
    ) -> AdvisoryGuard {
        let loss = LossSignal::linked(
            conn.closed(),
            "the connection to PostgreSQL ended (the session and its lock are gone)",
        );
        let conn = Arc::new(conn);
        let guard = AdvisoryGuard {
            key,
            mode,
            backend_pid,
            conn: conn.clone(),
            transport: transport.clone(),
            core: LeaseCore::new(
                key.to_string(),
                Some(fencing_token),
                deadline_cell(after(Instant::now(), FAR)),
                loss.clone(),
            ),
            stop: CancellationToken::new(),
        };
        tokio::spawn(heartbeat_task(
            Arc::downgrade(&conn),
            backend_pid,
            loss,
            guard.stop.clone(),
            heartbeat,
            transport.settings.response_timeout,
        ));
        guard
    }

    /// The lock's key, typed ([`HeldLease::key`] is the same as text).
    pub fn advisory_key(&self) -> AdvisoryKey {
        self.key
    }

    /// Exclusive or shared.
    pub fn mode(&self) -> AdvisoryMode {
        self.mode
    }

    /// The PostgreSQL backend (server process) of the guard's session, as in `pg_locks.pid`
    /// and `pg_stat_activity.pid`.
    pub fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// The guard's own connection, for statements that should run in the session holding the
    /// lock. A transaction there (`BEGIN … ROLLBACK`) leaves the lock held. Do not unlock
    /// through it (`release` would then report the lock lost), and keep statements short: the
    /// heartbeat shares it (see the module docs).
    pub fn client(&self) -> &PgClient {
        &self.conn.client
    }

    fn lost_error(&self, reason: String) -> Error {
        Error::lock_lost(self.key.to_string(), Some(self.fencing_token()), reason)
    }

    /// Unlocks on the guard's own connection (`pg_advisory_unlock[_shared]`), checks that
    /// PostgreSQL says the lock was held, and closes the connection. `Ok(true)`: it was held
    /// and is released; `Ok(false)`: it was no longer held, because the loss signal fired
    /// before (see [`HeldLease::loss_reason`]; the session's end frees the lock) or because
    /// PostgreSQL answered that this session did not hold it (it was unlocked through
    /// [`client`](Self::client)). The same answer as the leases' `release`.
    ///
    /// # Errors
    /// [`Error::LeaseLost`] (kind [`ErrorKind::LeaseLost`]) when the connection failed during
    /// the release (whether it was still held is unknown; closing the connection ends the
    /// session, which frees the lock); other server errors as they come.
    pub async fn release(self) -> Result<bool, Error> {
        if let Some(reason) = self.loss_reason() {
            tracing::debug!(key = %self.key, %reason, "advisory lock was lost before its release");
            return Ok(false);
        }
        self.stop.cancel();
        let (k, shared) = wire(self.key, self.mode);
        let result = sql::unlock(&self.transport, &self.conn.client, shared, k).await;
        // `self` drops here, closing the connection in every case.
        match result {
            Ok(held) => {
                let held = held?;
                if !held {
                    tracing::warn!(key = %self.key, "PostgreSQL says this session did not hold the advisory lock (unlocked through the guard's client?)");
                }
                Ok(held)
            }
            Err(_) if self.is_lost() => Ok(false),
            Err(e) if e.is_indeterminate() => Err(self.lost_error(format!(
                "the release failed ({e}); the connection is closed, so the server frees the lock"
            ))),
            Err(e) => Err(e),
        }
    }
}

/// The guard's heartbeat: `SELECT pg_backend_pid()` every `interval`, bounded by `timeout`. A
/// failure that is not an ordinary server error, no answer in time, or another backend's pid
/// (a pooler moved the connection) declares the lock lost and closes the connection (so that
/// it really ends). Holds only a weak reference: the guard owns the connection.
async fn heartbeat_task(
    conn: Weak<Dedicated>,
    backend_pid: i32,
    loss: Arc<LossSignal>,
    stop: CancellationToken,
    interval: Duration,
    timeout: Duration,
) {
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = loss.wait() => {
                // The connection ended under the guard: say why, as the driver said it.
                if let Some(why) = conn.upgrade().and_then(|c| c.why_closed()) {
                    loss.record(why);
                }
                return;
            }
            _ = tokio::time::sleep(interval) => {}
        }
        let Some(conn) = conn.upgrade() else { return };
        let ping = tokio::time::timeout(timeout, sql::heartbeat(&conn.client, backend_pid));
        let verdict = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            verdict = ping => verdict,
        };
        let why = match verdict {
            Ok(Beat::Alive) => continue,
            Ok(Beat::Moved(other)) => format!(
                "the heartbeat ran in another server session (backend {other}, the lock is \
                 in {backend_pid}): a connection pooler in transaction or statement mode \
                 moved this connection, and a session lock cannot be held through it"
            ),
            Ok(Beat::Failed(e)) => format!("the heartbeat on the lock's connection failed: {e}"),
            Err(_) => format!(
                "the heartbeat on the lock's connection got no answer within {timeout:?}; the \
                 connection is closed"
            ),
        };
        if stop.is_cancelled() {
            return;
        }
        loss.fire(why);
        conn.close();
        return;
    }
}
