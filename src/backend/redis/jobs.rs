//! The failover coordinator's job store on Redis: [`RedisStore`], the [`JobStore`] of one job
//! over its keys (`P{J}` the state, `P{J}:lease`, `P{J}:fence`, `P{J}:failure`, and the channel
//! `P{J}:events`), and the operator tools' reads and transactions.
//!
//! A transition is two round trips on a dedicated connection: `WATCH` state, lease and fence,
//! then read them and the server's `TIME` (the observation); then `MULTI … EXEC` of the
//! decision's writes, which the server refuses (a nil `EXEC`) if a watched key changed. A lease
//! extension is one command instead, the lease extension script (`script::extend`), atomic on
//! the server and sent on the shared multiplexed connection. The replies are parsed here into
//! the leaf values the coordinator's pure decisions take ([`State`], [`Lease`], [`Fence`]).

use std::sync::Arc;
use std::time::Duration;

use ::redis::{Pipeline, Value};
use tokio::time::Instant;

use super::classify::{from_server_error, unexpected};
use super::script::{extend, Extend, ExtendReply};
use super::{check_replies, ConnSettings, Dedicated, Expect, ReplicaWait, Subscription, Transport};
use crate::error::Error;
use crate::util::jobs::{
    job_state, lease_of, lease_value, lossy, parse_attempt, replaced_message, state_of_bytes,
    state_text, stop_names, stop_value, Extended, ExtensionFuture, FailAttempt, Fence, Held,
    JobKeys, JobStatus, JobStore, Lease, Named, Observation, Replaced, ResetJob, State, Which,
    Write, WATCHED,
};
use crate::util::metrics;
use crate::util::time::{after, ms};

/// The Redis form of [`JobStore`] for one job: its keys share one hash tag, so one node
/// serves every command of a transition.
pub(crate) struct RedisStore {
    pub transport: Arc<Transport>,
    pub keys: Arc<JobKeys>,
    /// The worker's name, stored with its lease.
    pub name: Arc<str>,
    pub lease: Duration,
    pub retention: Duration,
}

/// The reads of round trip 1 (after `WATCH state lease fence`): the three keys and `TIME`.
fn observe_reads(p: &mut Pipeline, keys: &JobKeys) {
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
        tx: &mut Pipeline,
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
                        .arg(ms(self.lease));
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
    const BACKEND: metrics::Backend = metrics::backend::REDIS;

    fn acknowledge_stop(
        &self,
        attempt: u64,
    ) -> impl std::future::Future<Output = Result<bool, Error>> + Send + 'static {
        let (transport, keys) = (self.transport.clone(), self.keys.clone());
        async move { acknowledge_stop(&transport, &keys, attempt).await }
    }

    fn tracker(&self) -> &tokio_util::task::TaskTracker {
        &self.transport.tracker
    }

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
        let mut p = ::redis::pipe();
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
            Value::ServerError(e) => return Err(from_server_error(e)),
            other => return Err(unexpected("PTTL lease", other)),
        };
        Ok((parse_state(state)?, lease))
    }

    async fn holder_read(&self, limit: Instant) -> Result<Observation, Error> {
        let mut conn = self.transport.node(self.keys.state()).await?.conn();
        let mut p = ::redis::pipe();
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
        let (ttl, retention) = (self.lease, self.retention);
        let response_timeout = self.transport.settings.response_timeout;
        #[cfg(feature = "testing")]
        let hook = self.transport.exec_hook();
        Box::pin(async move {
            #[cfg(feature = "testing")]
            if let Some(hook) = hook {
                hook("extend").await;
            }
            let guard_value = held.attempt.to_string();
            let req = Extend {
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
            match extend(&mut conn, &req, limit).await? {
                ExtendReply::Confirmed { sent } => Ok(Extended::Confirmed { sent }),
                ExtendReply::Refused { guard, lease, pttl } => {
                    Ok(Extended::Refused(holder_reads(&guard, &lease, &pttl)?))
                }
            }
        })
    }
}

// ----- The operator tools ------------------------------------------------------------------------

/// `Failover::job_status` on Redis: plain reads on the shared connection.
pub(crate) async fn job_status(
    transport: &Transport,
    keys: &JobKeys,
    key: String,
) -> Result<JobStatus, Error> {
    let mut conn = transport.node(keys.state()).await?.conn();
    let mut p = ::redis::pipe();
    p.ignore_errors();
    status_reads(&mut p, keys);
    let values: Vec<Value> = p.query_async(&mut conn).await?;
    status_from_replies(key, &values)
}

/// What the watched reads of a job's state and lease show of the attempt an operator named.
enum NamedLive {
    /// The live attempt is the one named: its number, its lease's remaining ms (`None`: no
    /// TTL) and the state's (the retention when it has none).
    Live {
        attempt: u64,
        lease_ms: Option<u64>,
        state_ms: u64,
    },
    /// No attempt is live.
    NotLive,
    /// Another attempt is live.
    Other(u64),
}

/// Reads `state_and_lease_reads`' four replies for an operator's act on the attempt `named`
/// (`fail_attempt`, `replace_attempt`): the caller UNWATCHes unless it is [`NamedLive::Live`].
///
/// # Errors
/// [`Error::CorruptState`] for a state baton never writes; [`Error::UnexpectedReply`] for
/// replies that are not the four reads.
fn named_live(
    values: &[Value],
    keys: &JobKeys,
    named: Named,
    retention: Duration,
    doing: &str,
) -> Result<NamedLive, Error> {
    let [state, state_ttl, lease, lease_ttl] = values else {
        return Err(Error::UnexpectedReply {
            context: "reading a job before an operator's act on its attempt",
            reply: format!("{doing}: {} replies instead of 4", values.len()),
        });
    };
    let state = parse_state(state)?;
    if let State::Corrupt(value) = state {
        return Err(Error::CorruptState {
            key: keys.state().to_string(),
            value,
        });
    }
    let (attempt, lease_ms) = match (state, parse_lease(lease, lease_ttl)?) {
        (State::Attempt(n), Lease::Held { pttl_ms, .. }) => (n, pttl_ms),
        _ => return Ok(NamedLive::NotLive),
    };
    if !named.names(attempt) {
        return Ok(NamedLive::Other(attempt));
    }
    let state_ms = match state_ttl {
        Value::Int(n) if *n > 0 => *n as u64,
        _ => retention.as_millis() as u64,
    };
    Ok(NamedLive::Live {
        attempt,
        lease_ms,
        state_ms,
    })
}

/// `Failover::fail_attempt` on Redis: deletes the lease, records `reason` and publishes
/// `failed`, in one transaction conditional on the state and lease read (`WATCH`), if the live
/// attempt is the one `named`.
pub(crate) async fn fail_attempt(
    transport: &Transport,
    keys: &JobKeys,
    named: Named,
    reason: &str,
    retention: Duration,
) -> Result<FailAttempt, Error> {
    for _ in 0..20 {
        let deadline = tokio::time::Instant::now() + transport.settings.response_timeout * 10;
        let node = transport.node(keys.state()).await?;
        let mut conn = node.pool.get(deadline).await?;
        let values = conn
            .watch_read(&[keys.state(), keys.lease()], |p| {
                state_and_lease_reads(p, keys)
            })
            .await?;
        let live = named_live(&values, keys, named, retention, "releasing it");
        let (attempt, _, ttl) = match live {
            Ok(NamedLive::Live {
                attempt,
                lease_ms,
                state_ms,
            }) => (attempt, lease_ms, state_ms),
            other => {
                conn.defer_unwatch();
                return match other? {
                    NamedLive::Other(n) => Ok(FailAttempt::Another(n)),
                    _ => Ok(FailAttempt::NotLive),
                };
            }
        };
        // The failure note is kept as long as the state itself (`ttl`).
        let mut tx = conn.transaction();
        tx.cmd("DEL")
            .arg(keys.lease())
            .cmd("SET")
            .arg(keys.failure())
            .arg(format!(
                "attempt {attempt} released by an operator: {reason}"
            ))
            .arg("PX")
            .arg(ttl)
            .cmd(node.publish)
            .arg(keys.channel())
            .arg("failed");
        match conn.exec(tx).await? {
            None => {
                continue;
            }
            Some(replies) => {
                // Every sub-reply: a command can fail inside a transaction that still
                // applies the others.
                check_replies(
                    "releasing an attempt",
                    &replies,
                    &[Expect::Int, Expect::Ok, Expect::Int],
                )?;
                return Ok(FailAttempt::Released(attempt));
            }
        }
    }
    Err(Error::Timeout {
        during: "releasing an attempt under constant contention",
    })
}

/// `Failover::reset_job` on Redis: deletes the job's four keys in one transaction conditional
/// on the state and lease read (`WATCH`), unless a live attempt is not the one `live` names.
pub(crate) async fn reset_job(
    transport: &Transport,
    keys: &JobKeys,
    live: Named,
) -> Result<ResetJob, Error> {
    for _ in 0..20 {
        let deadline = tokio::time::Instant::now() + transport.settings.response_timeout * 10;
        let node = transport.node(keys.state()).await?;
        let mut conn = node.pool.get(deadline).await?;
        let values = conn
            .watch_read(&[keys.state(), keys.lease()], |p| {
                state_and_lease_reads(p, keys)
            })
            .await?;
        let [state, _, lease, lease_ttl] = values.as_slice() else {
            conn.defer_unwatch();
            return Err(Error::UnexpectedReply {
                context: "reading a job before resetting it",
                reply: format!("{} replies instead of 4", values.len()),
            });
        };
        // A corrupt state is reset all the same: forgetting it is the way out.
        if let (Ok(State::Attempt(n)), Ok(Lease::Held { .. })) =
            (parse_state(state), parse_lease(lease, lease_ttl))
        {
            if !live.names(n) {
                conn.defer_unwatch();
                return Ok(ResetJob::Live(n));
            }
        }
        let mut tx = conn.transaction();
        tx.cmd("DEL")
            .arg(keys.state())
            .arg(keys.lease())
            .arg(keys.fence())
            .arg(keys.failure());
        match conn.exec(tx).await? {
            None => continue,
            Some(replies) => {
                check_replies("resetting a job", &replies, &[Expect::Int])?;
                return Ok(ResetJob::Reset);
            }
        }
    }
    Err(Error::Timeout {
        during: "resetting a job under constant contention",
    })
}

/// `Failover::replace_attempt` on Redis: in one transaction conditional on the state and lease
/// read (`WATCH`), if the live attempt is the one `named`: the state becomes `DONE` (keeping its
/// retention), the lease is deleted, the failure note says who replaced it, the stop marker
/// `P{J}:stop` is set for the old lease's remaining time, and `replaced:N:BY` is published.
pub(crate) async fn replace_attempt(
    transport: &Transport,
    keys: &JobKeys,
    named: Named,
    by: &str,
    retention: Duration,
) -> Result<Replaced, Error> {
    let stop = keys.stop();
    for _ in 0..20 {
        let deadline = tokio::time::Instant::now() + transport.settings.response_timeout * 10;
        let node = transport.node(keys.state()).await?;
        let mut conn = node.pool.get(deadline).await?;
        let values = conn
            .watch_read(&[keys.state(), keys.lease()], |p| {
                state_and_lease_reads(p, keys)
            })
            .await?;
        let live = named_live(&values, keys, named, retention, "replacing its attempt");
        let (attempt, pttl, ttl) = match live {
            Ok(NamedLive::Live {
                attempt,
                lease_ms,
                state_ms,
            }) => (attempt, lease_ms, state_ms),
            other => {
                conn.defer_unwatch();
                return match other? {
                    NamedLive::Other(n) => Ok(Replaced::Other(n)),
                    _ => Ok(Replaced::NotLive),
                };
            }
        };
        // `DONE` keeps the state's retention (`ttl`): backups read it and end, none retries.
        // The marker lives as long as the old lease could have (a lease without a TTL is a
        // foreign write: then as long as the state's retention, the most it can matter).
        // Read before the EXEC, so it errs long, never short.
        let marker_ms = pttl.unwrap_or(ttl).max(1);
        let mut tx = conn.transaction();
        tx.cmd("SET")
            .arg(keys.state())
            .arg(crate::util::jobs::DONE)
            .arg("PX")
            .arg(ttl)
            .cmd("DEL")
            .arg(keys.lease())
            .cmd("SET")
            .arg(keys.failure())
            .arg(format!("attempt {attempt} replaced by {by}"))
            .arg("PX")
            .arg(ttl)
            .cmd("SET")
            .arg(&stop)
            .arg(stop_value(attempt, by))
            .arg("PX")
            .arg(marker_ms)
            .cmd(node.publish)
            .arg(keys.channel())
            .arg(replaced_message(attempt, by));
        match conn.exec(tx).await? {
            None => continue,
            Some(replies) => {
                check_replies(
                    "replacing an attempt",
                    &replies,
                    &[Expect::Ok, Expect::Int, Expect::Ok, Expect::Ok, Expect::Int],
                )?;
                return Ok(Replaced::Stopped {
                    attempt,
                    lease_remaining: Duration::from_millis(marker_ms),
                });
            }
        }
    }
    Err(Error::Timeout {
        during: "replacing an attempt under constant contention",
    })
}

/// A replaced holder's acknowledgement on Redis: deletes the stop marker if it names
/// `attempt` (`WATCH`, `GET`, then `DEL` in a transaction, so a marker set for a later
/// attempt in between is kept).
pub(crate) async fn acknowledge_stop(
    transport: &Transport,
    keys: &JobKeys,
    attempt: u64,
) -> Result<bool, Error> {
    let stop = keys.stop();
    for _ in 0..20 {
        let deadline = tokio::time::Instant::now() + transport.settings.response_timeout * 10;
        let node = transport.node(keys.state()).await?;
        let mut conn = node.pool.get(deadline).await?;
        let values = conn
            .watch_read(&[stop.as_str()], |p| {
                p.cmd("GET").arg(&stop);
            })
            .await?;
        let named = match values.first() {
            Some(Value::BulkString(b)) => stop_names(b, attempt),
            Some(Value::Nil) => false,
            Some(Value::ServerError(e)) => {
                conn.defer_unwatch();
                return Err(from_server_error(e));
            }
            _ => false,
        };
        if !named {
            conn.defer_unwatch();
            return Ok(false);
        }
        let mut tx = conn.transaction();
        tx.cmd("DEL").arg(&stop);
        match conn.exec(tx).await? {
            None => continue,
            Some(replies) => {
                check_replies("acknowledging a stop", &replies, &[Expect::Int])?;
                return Ok(true);
            }
        }
    }
    Err(Error::Timeout {
        during: "acknowledging a stop under constant contention",
    })
}

/// The stop marker's remaining time on Redis (`PTTL P{J}:stop`): `None` once it is gone.
pub(crate) async fn stop_remaining(
    transport: &Transport,
    keys: &JobKeys,
) -> Result<Option<Duration>, Error> {
    let mut conn = transport.node(keys.state()).await?.conn();
    let pttl: Value = ::redis::cmd("PTTL")
        .arg(keys.stop())
        .query_async(&mut conn)
        .await?;
    match pttl {
        Value::Int(-2) => Ok(None),
        // No TTL: a foreign write; wait as for the longest lease there can be, a second at a
        // time, re-reading (the caller polls).
        Value::Int(-1) => Ok(Some(Duration::from_secs(1))),
        Value::Int(n) if n >= 0 => Ok(Some(Duration::from_millis(n as u64))),
        Value::ServerError(e) => Err(from_server_error(&e)),
        other => Err(unexpected("PTTL stop", &other)),
    }
}

// ----- Parsing what the reads return -------------------------------------------------------------

/// `GET` and `PTTL` of the state, then of the lease: what `job_status` and `fail_attempt` read
/// first.
fn state_and_lease_reads(p: &mut Pipeline, keys: &JobKeys) {
    p.cmd("GET")
        .arg(keys.state())
        .cmd("PTTL")
        .arg(keys.state())
        .cmd("GET")
        .arg(keys.lease())
        .cmd("PTTL")
        .arg(keys.lease());
}

/// The reads of `Failover::job_status` (six replies: state, its PTTL, lease, its PTTL, fence,
/// failure), appended to `p`: also what the listing of everything under a prefix pipelines for
/// a batch of jobs.
pub(crate) fn status_reads(p: &mut Pipeline, keys: &JobKeys) {
    state_and_lease_reads(p, keys);
    p.cmd("GET")
        .arg(keys.fence())
        .cmd("GET")
        .arg(keys.failure());
}

/// How many replies [`status_reads`] adds.
pub(crate) const STATUS_READS: usize = 6;

/// Job `key`'s status from the replies of [`status_reads`].
///
/// # Errors
/// [`Error::UnexpectedReply`] for another number of replies or an unreadable one.
pub(crate) fn status_from_replies(key: String, values: &[Value]) -> Result<JobStatus, Error> {
    let [state, state_ttl, lease, lease_ttl, fence, failure] = values else {
        return Err(Error::UnexpectedReply {
            context: "reading a job's status",
            reply: format!("{} replies instead of {STATUS_READS}", values.len()),
        });
    };
    let state = job_state(parse_state(state)?, parse_lease(lease, lease_ttl)?);
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    };
    Ok(JobStatus {
        key,
        state,
        state_ttl_ms: match state_ttl {
            Value::Int(n) if *n >= 0 => Some(*n as u64),
            _ => None,
        },
        fencing_token: text(fence).and_then(|f| parse_attempt(f.as_bytes())),
        last_failure: text(failure),
    })
}

fn string_bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// Splits a reply into "a string", "nil", "wrong type" or an error.
enum Raw<'a> {
    Nil,
    Str(&'a [u8]),
    WrongType(String),
}

fn raw<'a>(v: &'a Value, context: &'static str) -> Result<Raw<'a>, Error> {
    match v {
        Value::Nil => Ok(Raw::Nil),
        Value::ServerError(e) if e.code() == "WRONGTYPE" => Ok(Raw::WrongType(
            e.details().unwrap_or("WRONGTYPE").to_string(),
        )),
        Value::ServerError(e) => Err(from_server_error(e)),
        other => string_bytes(other)
            .map(Raw::Str)
            .ok_or_else(|| unexpected(context, other)),
    }
}

/// Parses the state key's `GET` reply.
pub(crate) fn parse_state(v: &Value) -> Result<State, Error> {
    Ok(match raw(v, "GET state")? {
        Raw::Nil => State::Absent,
        Raw::WrongType(d) => State::WrongType(d),
        Raw::Str(b) => state_of_bytes(b),
    })
}

/// Parses the lease key's `GET` and `PTTL` replies.
pub(crate) fn parse_lease(get: &Value, pttl: &Value) -> Result<Lease, Error> {
    let bytes = match raw(get, "GET lease")? {
        Raw::Nil => return Ok(Lease::Absent),
        Raw::WrongType(d) => return Ok(Lease::WrongType(d)),
        Raw::Str(b) => b,
    };
    let pttl = match pttl {
        Value::Int(n) => *n,
        // MOVED/ASK/TRYAGAIN when the key migrated between the GET and the PTTL: retryable.
        Value::ServerError(e) => return Err(from_server_error(e)),
        other => return Err(unexpected("PTTL lease", other)),
    };
    let pttl_ms = match pttl {
        // Expired between the GET and the PTTL of the same pipeline: it is gone now.
        -2 => return Ok(Lease::Absent),
        -1 => None,
        n if n >= 0 => Some(n as u64),
        _ => return Err(unexpected("PTTL lease", &Value::Int(pttl))),
    };
    let text = match std::str::from_utf8(bytes) {
        Ok(t) => t,
        Err(_) => return Ok(Lease::Corrupt(lossy(bytes))),
    };
    let (token, holder) = text.split_once(' ').unwrap_or((text, ""));
    Ok(match lease_of(token, holder, pttl_ms) {
        Lease::Corrupt(_) => Lease::Corrupt(lossy(bytes)),
        held => held,
    })
}

/// Parses the fence key's `GET` reply.
pub(crate) fn parse_fence(v: &Value) -> Result<Fence, Error> {
    Ok(match raw(v, "GET fence")? {
        Raw::Nil => Fence::Absent,
        Raw::WrongType(d) => Fence::WrongType(d),
        Raw::Str(b) => match parse_attempt(b) {
            Some(n) => Fence::Value(n),
            None => Fence::Corrupt(lossy(b)),
        },
    })
}

/// Parses a Redis `TIME` reply into µs since the epoch.
pub(crate) fn parse_time(v: &Value) -> Result<u64, Error> {
    let parts = match v {
        Value::Array(parts) if parts.len() == 2 => parts,
        other => return Err(unexpected("TIME", other)),
    };
    let num = |p: &Value| -> Option<u64> {
        match p {
            Value::Int(n) => u64::try_from(*n).ok(),
            Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
            Value::SimpleString(s) => s.parse().ok(),
            _ => None,
        }
    };
    match (num(&parts[0]), num(&parts[1])) {
        (Some(s), Some(us)) => Ok(s.saturating_mul(1_000_000).saturating_add(us)),
        _ => Err(unexpected("TIME", v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "0123456789abcdef0123456789abcdef";

    /// A key that migrated to another cluster node between a pipeline's `GET` and `PTTL`
    /// (found by tests/cluster_reshard.rs): the `PTTL`'s `ASK`/`MOVED`/`TRYAGAIN` is a
    /// retryable error, never an "unexpected reply" that ends the worker.
    #[test]
    fn a_redirect_in_the_lease_reads_is_retryable() {
        let held = Value::BulkString(format!("{} host:1", "a".repeat(32)).into_bytes());
        for raw in [
            &b"-ASK 14604 127.0.0.1:20790\r\n"[..],
            b"-MOVED 14604 127.0.0.1:20790\r\n",
            b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
        ] {
            let pttl = ::redis::parse_redis_value(raw).unwrap();
            let err = parse_lease(&held, &pttl).unwrap_err();
            assert!(err.is_retryable(), "{err}");
        }
    }

    /// A key that migrated to another cluster node between a pipeline's `GET` and `PTTL`
    #[test]
    fn state_parsing() {
        let bulk = |s: &[u8]| Value::BulkString(s.to_vec());
        assert_eq!(parse_state(&Value::Nil).unwrap(), State::Absent);
        assert_eq!(parse_state(&bulk(b"DONE")).unwrap(), State::Done);
        assert_eq!(parse_state(&bulk(b"EXHAUSTED")).unwrap(), State::Exhausted);
        assert_eq!(parse_state(&bulk(b"7")).unwrap(), State::Attempt(7));
        for near in [
            &b"done"[..],
            b"DONE ",
            b"DONE\0",
            b"hello",
            b"0",
            b"\xff\xfe",
        ] {
            assert!(matches!(
                parse_state(&bulk(near)).unwrap(),
                State::Corrupt(_)
            ));
        }
        assert!(parse_state(&Value::Int(3)).is_err());
    }

    #[test]
    fn lease_parsing() {
        let v = Value::BulkString(format!("{T} host:1").into_bytes());
        assert_eq!(
            parse_lease(&v, &Value::Int(500)).unwrap(),
            Lease::Held {
                token: T.into(),
                holder: "host:1".into(),
                pttl_ms: Some(500)
            }
        );
        assert!(matches!(
            parse_lease(&v, &Value::Int(-1)).unwrap(),
            Lease::Held { pttl_ms: None, .. }
        ));
        assert_eq!(parse_lease(&v, &Value::Int(-2)).unwrap(), Lease::Absent);
        assert_eq!(
            parse_lease(&Value::Nil, &Value::Int(-2)).unwrap(),
            Lease::Absent
        );
        let junk = Value::BulkString(b"hello".to_vec());
        assert!(matches!(
            parse_lease(&junk, &Value::Int(100)).unwrap(),
            Lease::Corrupt(_)
        ));
    }

    #[test]
    fn time_parsing() {
        let v = Value::Array(vec![
            Value::BulkString(b"1700000000".to_vec()),
            Value::BulkString(b"123456".to_vec()),
        ]);
        assert_eq!(parse_time(&v).unwrap(), 1_700_000_000_123_456);
        assert!(parse_time(&Value::Nil).is_err());
    }
}
