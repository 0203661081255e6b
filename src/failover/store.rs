//! The failover coordinator's seam to its backend: [`JobStore`], what the worker task
//! ([`super::worker`]) needs from wherever a job's state lives, and [`RedisStore`], its Redis
//! form (`WATCH` + reads, `MULTI … EXEC`, the extension script, pub/sub). The PostgreSQL form is
//! [`super::pg`]. The worker's loop and the pure decisions of [`super::protocol`] are written
//! once, above this trait; a store only reads, writes and wakes.
//!
//! A transition is *observe → decide → commit* on one [`JobStore::Conn`]: the observation
//! arms the conditional write (Redis: `WATCH` on the connection; PostgreSQL: the row's version
//! kept with the connection), and the commit applies the decision's [`Write`]s only if nothing
//! observed has changed since, else it returns `None` (the nil `EXEC`) and the worker observes
//! again.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::keys::JobKeys;
use super::protocol::{
    lease_value, parse_fence, parse_lease, parse_state, parse_time, state_text, Fence, Observation,
    State, Which, Write, WATCHED,
};
use crate::backend::redis::{
    check_replies, ConnSettings, Dedicated, Expect, ReplicaWait, Subscription, Transport,
};
use crate::error::Error;
use crate::lease;
use crate::util::time::{after, ms};

/// What a lease extension found: confirmed (with its send time, from which the new deadline
/// is measured), or refused, with what the store read instead (for [`decide_holder`]).
///
/// [`decide_holder`]: super::protocol::decide_holder
pub(crate) enum Extended {
    Confirmed { sent: Instant },
    Refused(Observation),
}

/// A lease extension in flight; it owns what it needs (it runs beside the holder's timers).
pub(crate) type ExtensionFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<Extended, Error>> + Send>>;

/// The grant a holder extends or ends.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub attempt: u64,
    pub token: String,
}

/// Where one job's state lives, as the worker task sees it (see the module docs).
pub(crate) trait JobStore: Send + Sync + 'static {
    /// A connection carrying one transition's observation to its commit.
    type Conn: Send;

    /// The metrics' `backend` label of this store.
    const BACKEND: crate::util::metrics::Backend;

    /// The client's connection settings.
    fn settings(&self) -> &ConnSettings;

    /// Where `which` of this job is stored, for messages (a key name, a table row).
    fn locate(&self, which: Which) -> String;

    /// The worker's name, stored with its lease.
    fn worker_name(&self) -> &str;

    /// Runs the test hook (feature `testing`) between a transition's observation and commit.
    fn before_exec(&self, what: &'static str) -> impl std::future::Future<Output = ()> + Send;

    /// A connection for the next transition, waiting for one until `deadline`.
    fn checkout(
        &self,
        deadline: Instant,
    ) -> impl std::future::Future<Output = Result<Self::Conn, Error>> + Send;

    /// Bounds every later request on `conn` by `deadline` (a holder's, by its lease).
    fn set_deadline(conn: &mut Self::Conn, deadline: Instant);

    /// Reads the job (state, lease, fence, the server's clock) and arms `conn`'s commit.
    fn observe<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
    ) -> impl std::future::Future<Output = Result<Observation, Error>> + Send + 'a;

    /// Ends a transition that writes nothing, without a round trip.
    fn abandon(conn: &mut Self::Conn);

    /// Applies `writes` if nothing observed on `conn` has changed: `Ok(None)` when something
    /// did (nothing was written), else `Ok(Some(acked))`, `acked` being how many replicas
    /// acknowledged when `wait` asked. `token` is the lease's token ([`Write::SetLease`]),
    /// `failure` the text of [`Write::SetFailure`], `context` names the transition in errors.
    #[allow(clippy::too_many_arguments)]
    fn commit<'a>(
        &'a self,
        conn: &'a mut Self::Conn,
        writes: &'a [Write],
        token: &'a str,
        failure: &'a str,
        wait: Option<ReplicaWait>,
        context: &'static str,
    ) -> impl std::future::Future<Output = Result<Option<Option<u64>>, Error>> + Send + 'a;

    /// Subscribes to the job's messages ([`super::protocol::Message`]).
    fn subscribe(&self) -> impl std::future::Future<Output = Result<Subscription, Error>> + Send;

    /// A plain read (no commit armed): the state, and `Some(pttl)` while a lease is alive
    /// (`Some(None)`: alive without expiry).
    fn quick_read(
        &self,
    ) -> impl std::future::Future<Output = Result<(State, Option<Option<u64>>), Error>> + Send;

    /// A plain read of state and lease for a holder's check, bounded by `limit`; the fence and
    /// time are not read (`Fence::Absent`, 0).
    fn holder_read(
        &self,
        limit: Instant,
    ) -> impl std::future::Future<Output = Result<Observation, Error>> + Send;

    /// One lease extension of `held`, bounded by `lease_end`: atomic, conditional on the lease
    /// still holding `held`'s token and the state its attempt.
    fn extension(&self, held: Held, lease_end: Instant) -> ExtensionFuture;
}

/// The Redis form of [`JobStore`] for one job.
pub(crate) struct RedisStore {
    pub transport: Arc<Transport>,
    pub keys: Arc<JobKeys>,
    /// The worker's name, stored with its lease.
    pub name: Arc<str>,
    pub lock_timeout: Duration,
    pub retention: Duration,
}

/// The reads of round trip 1 (after `WATCH state lease fence`): the three keys and `TIME`.
fn observe_reads(p: &mut redis::Pipeline, keys: &JobKeys) {
    p.cmd("GET")
        .arg(keys.state())
        .cmd("GET")
        .arg(keys.lease())
        .cmd("PTTL")
        .arg(keys.lease())
        .cmd("GET")
        .arg(keys.fence())
        .cmd("TIME");
}

fn parse_observation(values: &[Value]) -> Result<Observation, Error> {
    let [state, lease, pttl, fence, time] = values else {
        return Err(Error::UnexpectedReply {
            context: "the observation pipeline",
            reply: format!("{} replies instead of 5", values.len()),
        });
    };
    Ok(Observation {
        state: parse_state(state)?,
        lease: parse_lease(lease, pttl)?,
        fence: parse_fence(fence)?,
        now_us: parse_time(time)?,
    })
}

/// What a holder's plain read or a refused extension saw (state, lease, lease PTTL), as an
/// observation for [`decide_holder`](super::protocol::decide_holder); neither reads the fence
/// or the server's time, which only a pending `DONE` (never judged here) needs.
fn holder_reads(state: &Value, lease: &Value, pttl: &Value) -> Result<Observation, Error> {
    Ok(Observation {
        state: parse_state(state)?,
        lease: parse_lease(lease, pttl)?,
        fence: Fence::Absent,
        now_us: 0,
    })
}

impl RedisStore {
    /// Adds a transition's writes to its `MULTI`; returns the reply each must give.
    fn render(
        &self,
        tx: &mut redis::Pipeline,
        writes: &[Write],
        token: &str,
        failure: &str,
        publish: &str,
    ) -> Vec<Expect> {
        let (k, retention) = (&self.keys, ms(self.retention));
        writes
            .iter()
            .map(|w| match *w {
                Write::SetState(v) => {
                    tx.cmd("SET")
                        .arg(k.state())
                        .arg(state_text(v))
                        .arg("PX")
                        .arg(retention);
                    Expect::Ok
                }
                Write::KeepState => {
                    tx.cmd("PEXPIRE").arg(k.state()).arg(retention);
                    Expect::Int
                }
                Write::SetLease => {
                    tx.cmd("SET")
                        .arg(k.lease())
                        .arg(lease_value(token, &self.name))
                        .arg("PX")
                        .arg(ms(self.lock_timeout));
                    Expect::Ok
                }
                Write::DelLease => {
                    tx.cmd("DEL").arg(k.lease());
                    Expect::Int
                }
                Write::SetFence(f) => {
                    tx.cmd("SET").arg(k.fence()).arg(f).arg("PX").arg(retention);
                    Expect::Ok
                }
                Write::KeepFence => {
                    tx.cmd("PEXPIRE").arg(k.fence()).arg(retention);
                    Expect::Int
                }
                Write::SetFailure => {
                    tx.cmd("SET")
                        .arg(k.failure())
                        .arg(failure)
                        .arg("PX")
                        .arg(retention);
                    Expect::Ok
                }
                Write::Publish(m) => {
                    tx.cmd(publish).arg(k.channel()).arg(m.text().as_ref());
                    Expect::Int
                }
            })
            .collect()
    }
}

impl JobStore for RedisStore {
    type Conn = Dedicated;
    const BACKEND: crate::util::metrics::Backend = crate::util::metrics::backend::REDIS;

    fn settings(&self) -> &ConnSettings {
        &self.transport.settings
    }

    fn worker_name(&self) -> &str {
        &self.name
    }

    fn locate(&self, which: Which) -> String {
        self.keys.of(which).to_string()
    }

    async fn before_exec(&self, what: &'static str) {
        self.transport.before_exec(what).await;
    }

    async fn checkout(&self, deadline: Instant) -> Result<Dedicated, Error> {
        let node = self.transport.node(self.keys.state()).await?;
        node.pool.get(deadline).await
    }

    fn set_deadline(conn: &mut Dedicated, deadline: Instant) {
        conn.set_deadline(deadline);
    }

    async fn observe<'a>(&'a self, conn: &'a mut Dedicated) -> Result<Observation, Error> {
        let k = &self.keys;
        let values = conn
            .watch_read(&WATCHED.map(|w| k.of(w)), |p| observe_reads(p, k))
            .await?;
        match parse_observation(&values) {
            Ok(o) => Ok(o),
            Err(e) => {
                conn.defer_unwatch();
                Err(e)
            }
        }
    }

    fn abandon(conn: &mut Dedicated) {
        conn.defer_unwatch();
    }

    async fn commit<'a>(
        &'a self,
        conn: &'a mut Dedicated,
        writes: &'a [Write],
        token: &'a str,
        failure: &'a str,
        wait: Option<ReplicaWait>,
        context: &'static str,
    ) -> Result<Option<Option<u64>>, Error> {
        let mut tx = conn.transaction();
        let expect = self.render(&mut tx, writes, token, failure, conn.publish());
        match conn.exec_then_wait(tx, wait).await? {
            (None, _) => Ok(None),
            (Some(replies), acked) => {
                check_replies(context, &replies, &expect)?;
                Ok(Some(acked))
            }
        }
    }

    async fn subscribe(&self) -> Result<Subscription, Error> {
        self.transport.hub.subscribe(self.keys.channel()).await
    }

    async fn quick_read(&self) -> Result<(State, Option<Option<u64>>), Error> {
        // The semaphore is never closed; the error is mapped all the same.
        let _permit = (self.transport.wait_reads.acquire().await).map_err(|_| Error::Stopped)?;
        let mut conn = self.transport.node(self.keys.state()).await?.conn();
        let mut p = redis::pipe();
        p.ignore_errors()
            .cmd("GET")
            .arg(self.keys.state())
            .cmd("PTTL")
            .arg(self.keys.lease());
        let values: Vec<Value> = p.query_async(&mut conn).await?;
        let [state, pttl] = values.as_slice() else {
            return Err(Error::UnexpectedReply {
                context: "the wait check",
                reply: format!("{} replies instead of 2", values.len()),
            });
        };
        let lease = match pttl {
            Value::Int(-2) => None,
            Value::Int(-1) => Some(None),
            Value::Int(n) if *n >= 0 => Some(Some(*n as u64)),
            Value::ServerError(e) => {
                return Err(crate::backend::redis::classify::from_server_error(e))
            }
            other => return Err(crate::backend::redis::unexpected("PTTL lease", other)),
        };
        Ok((parse_state(state)?, lease))
    }

    async fn holder_read(&self, limit: Instant) -> Result<Observation, Error> {
        let mut conn = self.transport.node(self.keys.state()).await?.conn();
        let mut p = redis::pipe();
        p.ignore_errors()
            .cmd("GET")
            .arg(self.keys.state())
            .cmd("GET")
            .arg(self.keys.lease())
            .cmd("PTTL")
            .arg(self.keys.lease());
        let values =
            match tokio::time::timeout_at(limit, p.query_async::<Vec<Value>>(&mut conn)).await {
                Ok(values) => values?,
                Err(_) => {
                    return Err(Error::Timeout {
                        during: "reading the job",
                    })
                }
            };
        let [state, lease, pttl] = values.as_slice() else {
            return Err(Error::UnexpectedReply {
                context: "the holder's check",
                reply: format!("{} replies instead of 3", values.len()),
            });
        };
        holder_reads(state, lease, pttl)
    }

    /// One round trip, one command: the extension script (`EVALSHA`) checks that the lease
    /// still holds this grant's token and the state this attempt, and only then extends the
    /// lease and refreshes the state's and fence's retention (DESIGN.md §3). Being atomic it
    /// needs no `WATCH`, so it runs on the shared multiplexed connection and never waits for the
    /// dedicated pool. When the check fails, the script returns what it read.
    fn extension(&self, held: Held, lease_end: Instant) -> ExtensionFuture {
        // The router, not the transport: an extension in flight must not keep the client alive.
        let router = self.transport.router.clone();
        let keys = self.keys.clone();
        let value = lease_value(&held.token, &self.name);
        let (ttl, retention) = (self.lock_timeout, self.retention);
        let response_timeout = self.transport.settings.response_timeout;
        #[cfg(feature = "testing")]
        let hook = self.transport.exec_hook();
        Box::pin(async move {
            #[cfg(feature = "testing")]
            if let Some(hook) = hook {
                hook("extend").await;
            }
            let guard_value = held.attempt.to_string();
            let req = lease::Extend {
                lease: keys.lease(),
                value: &value,
                ttl,
                guard: keys.state(),
                guard_value: &guard_value,
                refresh: &[keys.state(), keys.fence()],
                retention,
            };
            let limit = after(Instant::now(), response_timeout).min(lease_end);
            let mut conn = router.node(keys.state()).await?.conn();
            match crate::backend::redis::script::extend(&mut conn, &req, limit).await? {
                lease::Extension::Confirmed { sent } => Ok(Extended::Confirmed { sent }),
                lease::Extension::Refused { guard, lease, pttl } => {
                    Ok(Extended::Refused(holder_reads(&guard, &lease, &pttl)?))
                }
            }
        })
    }
}
