//! The coordination server's clock: what every host of a fleet agrees on when hosts' own
//! clocks do not (schedules bind their occurrences by it).

use std::time::{Duration, SystemTime};

use ::redis::Value;
use tokio::time::Instant;

use super::redis::jobs::parse_time;
use super::Backend;
use crate::error::Error;

/// The server's time, and the local instant its reply arrived (the server read its clock at
/// or before that instant).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerTime {
    pub(crate) now: SystemTime,
    pub(crate) received: Instant,
}

impl Backend {
    /// The server's clock: `TIME` on the Redis node that serves `key` (the node a cluster
    /// routes it to), `clock_timestamp()` on PostgreSQL; one round trip within the response
    /// timeout.
    ///
    /// # Errors
    /// Connection errors, timeouts, and a reply that is not a time.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub(crate) async fn server_time(&self, key: &str) -> Result<ServerTime, Error> {
        let limit = Instant::now() + self.response_timeout();
        let us = match self {
            Backend::Redis(t) => {
                let read = async {
                    let mut conn = t.node(key).await?.conn();
                    let v: Value = ::redis::cmd("TIME").query_async(&mut conn).await?;
                    parse_time(&v)
                };
                tokio::time::timeout_at(limit, read)
                    .await
                    .map_err(|_| Error::Timeout {
                        during: "reading the server's clock",
                    })??
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres(t) => {
                const DURING: &str = "reading the server's clock";
                let conn = tokio::time::timeout_at(limit, t.pooled())
                    .await
                    .map_err(|_| Error::Timeout { during: DURING })??;
                let row = conn
                    .by(
                        limit,
                        DURING,
                        conn.query_one(
                            "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::int8",
                            &[],
                        ),
                    )
                    .await?;
                let us: i64 = row.try_get(0).map_err(|e| Error::UnexpectedReply {
                    context: DURING,
                    reply: e.to_string(),
                })?;
                u64::try_from(us).map_err(|_| Error::UnexpectedReply {
                    context: DURING,
                    reply: format!("{us} µs since the epoch"),
                })?
            }
        };
        Ok(ServerTime {
            now: SystemTime::UNIX_EPOCH + Duration::from_micros(us),
            received: Instant::now(),
        })
    }
}
