//! The control process's own PostgreSQL connection (profile `postgres`): the nemesis's server
//! faults and the final state, straight to the server (never through a worker's proxy).
//!
//! Its application_name is `baton-chaos-admin`, so the backend kill (which targets
//! application_name `baton`) never kills it. Every statement has bind parameters and a timeout.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio_postgres::NoTls;

use crate::util::{job_name, BoxError};

/// Bounds the connection and every statement (a paused server answers nothing).
const TIMEOUT: Duration = Duration::from_secs(3);

pub struct Admin {
    client: tokio_postgres::Client,
    conn: tokio::task::JoinHandle<()>,
}

impl Drop for Admin {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl Admin {
    pub async fn connect(url: &str) -> Result<Admin, BoxError> {
        let mut cfg: tokio_postgres::Config = url.parse()?;
        cfg.application_name("baton-chaos-admin")
            .connect_timeout(TIMEOUT);
        let (client, conn) = tokio::time::timeout(TIMEOUT, cfg.connect(NoTls))
            .await
            .map_err(|_| "admin connect timed out")??;
        let conn = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Admin { client, conn })
    }

    /// `pg_terminate_backend` on every session whose application_name is `baton`.
    pub async fn terminate_baton_backends(&self) -> Result<i64, BoxError> {
        let row = tokio::time::timeout(
            TIMEOUT,
            self.client.query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = $1 AND pid <> pg_backend_pid()",
                &[&"baton"],
            ),
        )
        .await
        .map_err(|_| "backend kill timed out")??;
        Ok(row.try_get(0)?)
    }

    /// Every lease expiry moved `delta_ms` into the past; returns the rows touched.
    pub async fn lease_jump(&self, delta_ms: i64) -> Result<u64, BoxError> {
        let n = tokio::time::timeout(
            TIMEOUT,
            self.client.execute(
                "UPDATE baton_jobs SET lease_expires = lease_expires - \
                 $1::float8 * interval '1 millisecond' WHERE lease_expires IS NOT NULL",
                &[&(delta_ms as f64)],
            ),
        )
        .await
        .map_err(|_| "lease jump timed out")??;
        Ok(n)
    }

    /// The volatile control: every job row gone.
    pub async fn truncate_jobs(&self) -> Result<(), BoxError> {
        tokio::time::timeout(
            Duration::from_secs(10),
            self.client.batch_execute("TRUNCATE baton_jobs"),
        )
        .await
        .map_err(|_| "truncate timed out")??;
        Ok(())
    }

    /// Every job's `state` while its row is live (`expires_at` in the future), in the checker's
    /// shape: `j-…` → `Some(state)` or `None` (no live row).
    pub async fn job_states(
        &self,
        jobs: usize,
    ) -> Result<BTreeMap<String, Option<String>>, BoxError> {
        if jobs == 0 {
            // A lock workload (profile `postgres-locks`): no job, and maybe no `baton_jobs`.
            return Ok(BTreeMap::new());
        }
        let rows = tokio::time::timeout(
            TIMEOUT,
            self.client.query(
                "SELECT key, state FROM baton_jobs WHERE expires_at > clock_timestamp()",
                &[],
            ),
        )
        .await
        .map_err(|_| "final state read timed out")??;
        let mut live: BTreeMap<String, String> = BTreeMap::new();
        for row in rows {
            live.insert(row.try_get(0)?, row.try_get(1)?);
        }
        Ok((0..jobs)
            .map(|j| {
                let name = job_name(j);
                let state = live.get(&format!("baton:{{{name}}}")).cloned();
                (name, state)
            })
            .collect())
    }
}

/// The final state, retried while the server recovers (up to ~20 tries).
pub async fn read_final_state(
    url: &str,
    jobs: usize,
) -> Result<BTreeMap<String, Option<String>>, BoxError> {
    let mut last = String::new();
    for _ in 0..20 {
        match Admin::connect(url).await {
            Ok(admin) => match admin.job_states(jobs).await {
                Ok(m) => return Ok(m),
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(format!("cannot read the final state: {last}").into())
}
