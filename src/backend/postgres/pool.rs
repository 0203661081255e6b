//! The pool of short-lived connections: a transition of a primitive borrows one ([`Pooled`]),
//! runs its statements and gives it back, but only when the last statement on it completed:
//! a connection whose reply was not awaited (a timeout, or the caller dropping its future
//! mid-statement) is retired (closed) instead, so no later borrower inherits the statement.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};

use super::classify::classify;
use super::{PgTransport, Tls};
use crate::error::{ConfigError, Error};
use crate::util::settings::ConnSettings;

/// A connection borrowed from the pool; derefs to a [`tokio_postgres::Client`]. Dropping it
/// gives it back when it is clean: it was not [retired](Pooled::retire), and every statement
/// begun on it (through [`Pooled::by`], or bracketed by [`Pooled::begin`] and
/// [`Pooled::end`]) completed. Otherwise it is closed.
pub(crate) struct Pooled {
    /// `Some` until `drop` (the only place that takes it).
    conn: Option<deadpool_postgres::Object>,
    retired: AtomicBool,
    /// Statements begun and not yet completed. A future dropped mid-statement never comes
    /// back to decrement it, which is the point: the count stays above zero and `drop` closes
    /// the connection. The driver would otherwise keep the dropped statement's request on the
    /// socket, and the next borrower's statements would queue behind it (a lock wait, a slow
    /// scan) or run inside its still-open transaction.
    in_flight: AtomicUsize,
}

impl Pooled {
    fn new(conn: deadpool_postgres::Object) -> Self {
        Pooled {
            conn: Some(conn),
            retired: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Closes the connection when it is dropped instead of giving it back to the pool: a
    /// statement may still be running on it (its reply was not awaited), and the next borrower
    /// would queue behind it, or inherit its effects seconds later. Closing the socket is the
    /// only safe way out: a cancel request names a backend, not a statement, and once the
    /// connection were reused it could cancel the next borrower's statement instead.
    /// The server ends the statement itself by `statement_timeout` (see [`PgTransport::new`]).
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Relaxed);
    }

    /// Marks the start of work on this connection that runs outside [`Pooled::by`] (a
    /// transaction driven through `deref_mut`): until the matching [`Pooled::end`], the
    /// connection counts as busy, and dropping it then closes it.
    pub(crate) fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// Marks the end of work begun with [`Pooled::begin`], whatever its outcome: its reply
    /// came (an error of unknown effect [retires](Pooled::retire) the connection separately).
    pub(crate) fn end(&self) {
        // Saturating: an unmatched `end` must not wrap the count and make a busy connection
        // look clean, nor panic.
        let _ = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Whether dropping this connection gives it back to the pool (see the type's docs).
    pub(crate) fn is_clean(&self) -> bool {
        !self.retired.load(Ordering::Relaxed) && self.in_flight.load(Ordering::Relaxed) == 0
    }

    /// `fut`, a statement on this connection, bounded by `limit`, its driver errors classified.
    /// A timeout or a lost connection retires the connection (see [`Pooled::retire`]), and so
    /// does dropping the returned future before it completes.
    pub(crate) async fn by<T>(
        &self,
        limit: tokio::time::Instant,
        during: &'static str,
        fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, Error> {
        self.begin();
        let outcome = match tokio::time::timeout_at(limit, fut).await {
            Ok(result) => result.map_err(|e| classify(e, during)),
            Err(_) => Err(Error::Timeout { during }),
        };
        // Reached only when the statement's future ended: dropped with it, the count stays up.
        self.end();
        if matches!(&outcome, Err(e) if e.is_indeterminate()) {
            self.retire();
        }
        outcome
    }
}

impl std::ops::Deref for Pooled {
    type Target = deadpool_postgres::Object;

    fn deref(&self) -> &Self::Target {
        // Invariant: `conn` is `Some` until `drop`, and nothing can borrow `self` after that.
        self.conn
            .as_ref()
            .expect("a pooled connection is present until dropped")
    }
}

impl std::ops::DerefMut for Pooled {
    fn deref_mut(&mut self) -> &mut Self::Target {
        // Invariant: as in `deref`.
        self.conn
            .as_mut()
            .expect("a pooled connection is present until dropped")
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        if !self.is_clean() {
            // Detached from the pool and dropped: deadpool aborts its driver task, so the
            // socket closes now, even with a reply still due.
            drop(deadpool_postgres::Object::take(conn));
        }
    }
}

/// The pool of a client's connections to `config`: at most `settings.pool_size`, each
/// bounding its statements on the server at the response timeout.
pub(crate) fn build(
    config: &tokio_postgres::Config,
    tls: &Tls,
    settings: &ConnSettings,
) -> Result<Pool, Error> {
    let manager = Manager::from_config(
        config.clone(),
        tls.clone(),
        ManagerConfig {
            // `Fast` trusts a connection the driver has not seen closed; a dead one fails
            // its next statement with a connection error, which every caller retries.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    // Every pooled connection bounds its statements on the server too, at the client's
    // response timeout: a statement the client gave up on ends by itself (a grant or an
    // extension cannot apply seconds later), and its connection is retired meanwhile
    // (`Pooled::retire`). A plain `SET`, not a startup option, so that `SET LOCAL
    // statement_timeout TO DEFAULT` gives a transaction the role's own setting back (the
    // advisory `xact` runs the caller's statements).
    let statement_timeout = format!(
        "SET statement_timeout = '{}ms'",
        settings.response_timeout.as_millis().max(1)
    );
    let pool = Pool::builder(manager)
        .post_create(deadpool_postgres::Hook::async_fn(move |client, _| {
            let set = statement_timeout.clone();
            Box::pin(async move {
                client
                    .batch_execute(&set)
                    .await
                    .map_err(deadpool_postgres::HookError::Backend)
            })
        }))
        .max_size(settings.pool_size.max(1))
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(settings.connect_timeout + settings.response_timeout))
        .create_timeout(Some(settings.connect_timeout))
        .recycle_timeout(Some(settings.response_timeout))
        .build()
        .map_err(|e| {
            Error::Config(ConfigError::invalid(
                "url",
                format!("cannot build the connection pool: {e}"),
            ))
        })?;
    Ok(pool)
}

impl PgTransport {
    /// A connection from the pool once `ready` passed (a module's check that its tables
    /// exist), both by `limit`: `Timeout { during }` past it.
    pub(crate) async fn pooled_when(
        &self,
        ready: impl std::future::Future<Output = Result<(), Error>>,
        limit: tokio::time::Instant,
        during: &'static str,
    ) -> Result<Pooled, Error> {
        let both = async {
            ready.await?;
            self.pooled().await
        };
        match tokio::time::timeout_at(limit, both).await {
            Ok(conn) => conn,
            Err(_) => Err(Error::Timeout { during }),
        }
    }

    /// A connection from the pool.
    pub(crate) async fn pooled(&self) -> Result<Pooled, Error> {
        self.pool.get().await.map(Pooled::new).map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(e)
            | deadpool_postgres::PoolError::PostCreateHook(
                deadpool_postgres::HookError::Backend(e),
            ) => classify(e, "connecting"),
            // Opening a connection timed out (the server accepted it and never answered):
            // said as connecting, not as waiting for a free connection of the pool.
            deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Create) => {
                Error::Timeout {
                    during: "connecting to PostgreSQL",
                }
            }
            deadpool_postgres::PoolError::Timeout(_) => Error::Timeout {
                during: "waiting for a PostgreSQL connection",
            },
            other => Error::Connection {
                message: format!("{}: {other}", self.endpoint),
                source: None,
            },
        })
    }

    /// `fut` bounded by the response timeout.
    pub(crate) async fn timed<T>(
        &self,
        during: &'static str,
        fut: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.settings.response_timeout, fut).await {
            Ok(result) => result.map_err(|e| classify(e, during)),
            Err(_) => Err(Error::Timeout { during }),
        }
    }
}
