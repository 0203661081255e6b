//! Baton's tables: making sure they exist before a primitive's first operation
//! ([`PgTransport::ensure_schema`]), creating what is missing for `migrate`
//! ([`PgTransport::migrate_schema`]), and the relations a schema's DDL creates
//! ([`created_relations`]). DDL has its own rules: it runs only when a catalog read finds
//! something missing, under a short `lock_timeout`, and a role that may not run it is told to
//! run `baton migrate`.

use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::classify::classify;
use super::PgTransport;
use crate::error::{Error, ErrorKind};

impl PgTransport {
    /// Makes sure the schema `sql` (fixed text, no parameters: `CREATE … IF NOT EXISTS`
    /// statements) is there before a primitive's first operation, once per client for each
    /// `name`: one catalog read finds the tables and sequences it creates, and only when one is
    /// missing is the DDL run (see [`create_schema`](Self::create_schema)). So a role that may
    /// only read and write the tables never runs DDL, and neither does the owner once they
    /// exist (a `CREATE INDEX IF NOT EXISTS` takes a `SHARE` lock on its table even when the
    /// index exists, which would queue every writer behind a long transaction). A missing
    /// table the role may not create is [`ErrorKind::Misconfigured`], naming `baton migrate`.
    ///
    /// `maintenance`, when given, is a statement run every interval from then on while the
    /// client lives (deleting expired rows), its errors logged at debug level.
    pub(crate) async fn ensure_schema(
        &self,
        name: &'static str,
        sql: &str,
        maintenance: Option<(&'static str, Duration)>,
    ) -> Result<(), Error> {
        if crate::util::lock(&self.schemas).contains(name) {
            return Ok(());
        }
        // The indexes are left to `migrate`: operations are correct without them.
        let needed: Vec<&str> = created_relations(sql)
            .into_iter()
            .filter(|(kind, _)| *kind != "INDEX")
            .map(|(_, name)| name)
            .collect();
        if !self.relations_exist(&needed).await? {
            self.create_schema(sql)
                .await
                .map_err(|e| not_creatable(e, &needed))?;
        }
        let first = crate::util::lock(&self.schemas).insert(name);
        if let (true, Some((statement, every))) = (first, maintenance) {
            let (pool, cancel) = (self.pool.clone(), self.cancel.clone());
            self.tracker.spawn(async move {
                loop {
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(every) => {}
                    }
                    let outcome = match pool.get().await {
                        Ok(conn) => conn
                            .batch_execute(statement)
                            .await
                            .map_err(|e| e.to_string()),
                        Err(e) => Err(e.to_string()),
                    };
                    if let Err(e) = outcome {
                        tracing::debug!(error = %e, "PostgreSQL maintenance statement failed");
                    }
                }
            });
        }
        Ok(())
    }

    /// Creates whatever of the schema `sql` is missing (tables, indexes, sequences), for
    /// `migrate`: nothing at all, not even a lock, when everything exists, so it is idempotent
    /// and cheap to run on every deploy while workers run.
    ///
    /// # Errors
    /// Connection errors; [`ErrorKind::Permission`] for a role that may not create them;
    /// [`ErrorKind::Busy`] when the tables stayed locked by other transactions through every
    /// try (see [`create_schema`](Self::create_schema)).
    pub(crate) async fn migrate_schema(&self, sql: &str) -> Result<(), Error> {
        let all: Vec<&str> = created_relations(sql)
            .into_iter()
            .map(|(_, name)| name)
            .collect();
        if self.relations_exist(&all).await? {
            return Ok(());
        }
        self.create_schema(sql).await
    }

    /// Whether every relation in `names` (unqualified: looked up in the `search_path`, as the
    /// statements that use them are) exists and is visible to this role; one catalog read.
    async fn relations_exist(&self, names: &[&str]) -> Result<bool, Error> {
        const DURING: &str = "looking for baton's tables";
        let conn = self.pooled().await?;
        let row = conn
            .by(
                tokio::time::Instant::now() + self.settings.response_timeout,
                DURING,
                conn.query_one(
                    "SELECT bool_and(to_regclass(n) IS NOT NULL) FROM unnest($1::text[]) AS n",
                    &[&names],
                ),
            )
            .await?;
        let all: Option<bool> = row.try_get(0).map_err(|e| Error::UnexpectedReply {
            context: "to_regclass",
            reply: e.to_string(),
        })?;
        Ok(all.unwrap_or(true))
    }

    /// Runs the DDL `sql` in one transaction holding a transaction-level advisory lock, which
    /// serializes clients creating it at the same moment (concurrent `CREATE TABLE IF NOT
    /// EXISTS` can fail on the catalog's unique index).
    ///
    /// Every lock it waits for is bounded by a short `lock_timeout` ([`DDL_LOCK_TIMEOUT`]): a
    /// DDL statement queued behind a long transaction would queue every later writer of the
    /// table behind itself. A try that times out on a lock is rolled back and tried again after
    /// a pause, [`DDL_TRIES`] times at most.
    async fn create_schema(&self, sql: &str) -> Result<(), Error> {
        const DURING: &str = "creating baton's tables";
        // Bounded by the connect timeout, not the (shorter) response timeout: DDL writes the
        // catalog, and may wait up to `lock_timeout` for each lock. The same bound holds on the
        // server (`statement_timeout`), so a try the client gave up on does not run on.
        let bound = self
            .settings
            .connect_timeout
            .max(self.settings.response_timeout)
            .max(DDL_LOCK_TIMEOUT)
            * 5;
        let script = format!(
            "SET LOCAL statement_timeout = '{}ms'; SET LOCAL lock_timeout = '{}ms'; \
             SELECT pg_advisory_xact_lock(hashtext('baton schema')); {sql}",
            bound.as_millis(),
            DDL_LOCK_TIMEOUT.as_millis()
        );
        let mut pause = Duration::from_millis(200);
        let mut tries = 0;
        loop {
            tries += 1;
            let mut conn = self.pooled().await?;
            // The transaction runs outside `Pooled::by`: bracketed, so that a caller dropping
            // this future mid-DDL closes the connection rather than pooling an open transaction.
            conn.begin();
            let ran = async {
                let tx = self.timed(DURING, conn.transaction()).await?;
                match tokio::time::timeout(bound, tx.batch_execute(&script)).await {
                    Ok(result) => result.map_err(|e| classify(e, DURING))?,
                    Err(_) => return Err(Error::Timeout { during: DURING }),
                }
                self.timed(DURING, tx.commit()).await
            }
            .await;
            conn.end();
            match ran {
                Ok(()) => return Ok(()),
                Err(e) if e.is_indeterminate() => {
                    // A reply not awaited: the transaction may still be open on the connection.
                    conn.retire();
                    return Err(e);
                }
                Err(Error::Postgres { ref code, .. })
                    if code == SqlState::LOCK_NOT_AVAILABLE.code() && tries < DDL_TRIES =>
                {
                    tracing::debug!(tries, "baton's DDL timed out on a lock; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// How long baton's DDL waits for any one lock before it gives up the try (see
/// [`PgTransport::create_schema`]).
pub(crate) const DDL_LOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// How many times baton's DDL is tried when it times out on a lock.
pub(crate) const DDL_TRIES: u32 = 5;

/// The relations a schema's DDL creates, `(kind, name)` for each `CREATE <kind> IF NOT EXISTS
/// <name>` (`TABLE`, `INDEX`, `SEQUENCE`): read from the DDL itself, so the check before it
/// can never drift from what it creates.
pub(crate) fn created_relations(sql: &str) -> Vec<(&str, &str)> {
    sql.split(';')
        .filter_map(|statement| {
            let words: Vec<&str> = statement.split_whitespace().take(6).collect();
            match words.as_slice() {
                ["CREATE", kind, "IF", "NOT", "EXISTS", name] => {
                    Some((*kind, name.trim_end_matches('(')))
                }
                _ => None,
            }
        })
        .collect()
}

/// `err`, from creating baton's missing relations `names` for an operation: a refusal for lack
/// of privilege becomes [`ErrorKind::Misconfigured`] naming `baton migrate`, the step that
/// creates them with a role that may.
pub(crate) fn not_creatable(err: Error, names: &[&str]) -> Error {
    match err {
        Error::Postgres {
            kind: ErrorKind::Permission,
            code,
            message,
            source,
        } => Error::Postgres {
            kind: ErrorKind::Misconfigured,
            code,
            message: format!(
                "{message}: {} not found (missing, or in a schema this role may not use), and \
                 this role may not create it; run `baton migrate --url …` (Client::migrate) once \
                 as their owner, and grant this role SELECT, INSERT, UPDATE, DELETE on them \
                 (docs/operating.md, \"PostgreSQL roles and `baton migrate`\")",
                names.join(", ")
            ),
            source,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relations_a_schema_creates_are_read_from_its_ddl() {
        let ddl = "
            CREATE TABLE IF NOT EXISTS t (
                key text PRIMARY KEY
            );
            CREATE INDEX IF NOT EXISTS t_key ON t (key);
            CREATE SEQUENCE IF NOT EXISTS s;
            SELECT 1";
        assert_eq!(
            created_relations(ddl),
            [("TABLE", "t"), ("INDEX", "t_key"), ("SEQUENCE", "s")]
        );
    }
}
