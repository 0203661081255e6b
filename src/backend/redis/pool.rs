//! The pool of dedicated connections for transitions (`WATCH … EXEC`), one of the three kinds
//! of connection a client keeps (see [`super::connection`] for why three). A connection is
//! checked out by one transition at a time and never reconnects underneath it: if anything goes
//! wrong mid-transaction the connection is dropped, and closing it ends its `WATCH` on the
//! server. Waiting backups hold none, so thousands of waiting jobs share a handful.

use std::sync::{Arc, Mutex};

use redis::aio::MultiplexedConnection;
use redis::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::ConnSettings;
use crate::error::Error;
use crate::util::lock;

/// The pool of dedicated connections for `WATCH`/`MULTI`/`EXEC`.
pub(crate) struct Pool {
    client: redis::Client,
    settings: ConnSettings,
    /// Idle connections, each with whether a `WATCH` may still be active on it (a deferred
    /// `UNWATCH`, sent at the start of its next pipeline).
    idle: Mutex<Vec<(MultiplexedConnection, bool)>>,
    permits: Arc<Semaphore>,
    /// Marked when a reply says the key may be served elsewhere now ([`super::route`]).
    stale: Arc<super::stale::Stale>,
    /// The node's publish command ([`super::route::Node::publish`]).
    publish: &'static str,
}

impl Pool {
    pub(crate) fn new(
        client: redis::Client,
        settings: ConnSettings,
        stale: Arc<super::stale::Stale>,
        publish: &'static str,
    ) -> Arc<Pool> {
        Arc::new(Pool {
            permits: Arc::new(Semaphore::new(settings.pool_size)),
            client,
            settings,
            idle: Mutex::new(Vec::new()),
            stale,
            publish,
        })
    }

    /// The client the pool's connections are opened with.
    #[cfg_attr(not(feature = "sentinel"), allow(dead_code))]
    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    /// Checks out a dedicated connection, opening one if none is idle; gives up at `deadline`
    /// (a starved pool or a hanging connect must not hold a caller past its own deadline).
    ///
    /// # Errors
    /// [`Error::Timeout`] at `deadline`; connection errors from opening a connection.
    ///
    /// # Cancel safety
    /// Cancel safe: a permit or connection taken is returned on drop.
    pub(crate) async fn get(self: &Arc<Self>, deadline: Instant) -> Result<Dedicated, Error> {
        let timeout = || Error::Timeout {
            during: "waiting for a dedicated connection",
        };
        // Waiting for a permit is what thousands of workers do at once (all started together,
        // or woken by one failure), so that wait is kept small: opening a connection is a big
        // future, boxed and allocated only by the few that get a permit and find no idle one.
        // A timeout here (every permit held by transitions stuck on the node, or a connect
        // that hangs) is what a hung server looks like: the routing is marked stale, so a
        // cluster asks again who serves the slot.
        let permit = tokio::time::timeout_at(deadline, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| {
                self.stale.set();
                timeout()
            })?
            .map_err(|_| Error::Stopped)?;
        let idle = lock(&self.idle).pop();
        let (conn, unwatch_first) = match idle {
            Some(c) => c,
            None => {
                let config = super::connection::async_config(&self.settings);
                let open = Box::pin(
                    self.client
                        .get_multiplexed_async_connection_with_config(&config),
                );
                let conn = match tokio::time::timeout_at(deadline, open).await {
                    Ok(Ok(c)) => c,
                    Ok(Err(e)) => {
                        let e = Error::from(e);
                        self.stale.note(&e);
                        return Err(e);
                    }
                    Err(_) => {
                        self.stale.set();
                        return Err(timeout());
                    }
                };
                (conn, false)
            }
        };
        Ok(Dedicated {
            conn: Some(conn),
            clean: false,
            unwatch_first,
            deadline: None,
            sent: None,
            pool: self.clone(),
            _permit: permit,
        })
    }

    /// The settings the pool's connections are opened with.
    pub(crate) fn settings(&self) -> &ConnSettings {
        &self.settings
    }

    /// Forgets idle connections (after one failed, the others very likely point at the same dead
    /// server; reopening beats a string of errors).
    pub(crate) fn flush(&self) {
        lock(&self.idle).clear();
    }
}

/// A dedicated connection checked out of the [`Pool`].
///
/// It goes back to the pool only if the transaction on it ended cleanly (`EXEC` or `UNWATCH`
/// answered); otherwise it is dropped, which closes the socket and with it any `WATCH`.
pub(crate) struct Dedicated {
    conn: Option<MultiplexedConnection>,
    clean: bool,
    /// A `WATCH` may be active (its `UNWATCH` was deferred): the next pipeline starts with
    /// `UNWATCH`, so no `EXEC` can ever run under a stale `WATCH`.
    unwatch_first: bool,
    /// No request on this connection may outlive it (see [`Dedicated::set_deadline`]).
    deadline: Option<Instant>,
    /// When the request now on the wire left (`None` between requests): a `Dedicated`
    /// dropped while one waits (its caller's deadline passed) reports it like a timeout.
    sent: Option<Instant>,
    pool: Arc<Pool>,
    _permit: OwnedSemaphorePermit,
}

impl Dedicated {
    /// Bounds every later request on this connection: each one times out at the earlier of
    /// the response timeout and `deadline` (a lease holder's requests must not outlive its
    /// lease).
    pub(crate) fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = Some(deadline);
    }

    /// Runs a pipeline (or transaction) on this connection. Any error leaves the connection
    /// unusable (its `WATCH` state is unknown), so it will be dropped, not pooled.
    ///
    /// Idle pooled connections are dropped too when this one failed with a connection error
    /// (they very likely point at the same dead server), but not after a timeout: a slow reply
    /// says nothing about the other connections, and reopening them all would only add load.
    async fn query<T: redis::FromRedisValue>(
        &mut self,
        pipe: &redis::Pipeline,
    ) -> Result<T, Error> {
        self.clean = false;
        let conn = self.conn.as_mut().ok_or(Error::Stopped)?;
        self.sent = Some(Instant::now());
        let fut = pipe.query_async(conn);
        let result = match self.deadline {
            Some(d) => match tokio::time::timeout_at(d, fut).await {
                Ok(r) => r.map_err(Error::from),
                Err(_) => Err(Error::Timeout {
                    during: "waiting for a reply before the lease deadline",
                }),
            },
            None => fut.await.map_err(Error::from),
        };
        self.sent = None;
        match result {
            Ok(v) => {
                self.unwatch_first = false;
                Ok(v)
            }
            Err(e) => {
                self.conn = None;
                if e.kind() == crate::ErrorKind::Connection {
                    self.pool.flush();
                }
                self.pool.stale.note(&e);
                Err(e)
            }
        }
    }

    /// Round trip 1 of a transition: `WATCH keys` followed by the reads of `reads`, in one
    /// pipeline. Returns the replies of `reads` (server errors as `Value::ServerError`, so one
    /// bad key is reported precisely).
    ///
    /// The `WATCH` reply is checked: a refused `WATCH` (an ACL without `+watch`, say) would leave
    /// the following `MULTI … EXEC` unguarded, so it is an error naming the command, with the
    /// server's classification (`NOPERM` is a non-retryable `Permission` error). On any error the
    /// connection is not returned to the pool (no `WATCH` may linger on it).
    pub(crate) async fn watch_read(
        &mut self,
        keys: &[&str],
        reads: impl FnOnce(&mut redis::Pipeline),
    ) -> Result<Vec<redis::Value>, Error> {
        let mut p = self.pipe();
        p.cmd("WATCH");
        for k in keys {
            p.arg(*k);
        }
        reads(&mut p);
        let mut values: Vec<redis::Value> = self.query(&p).await?;
        self.pool.stale.note_values(&values);
        if values.is_empty() {
            return Err(Error::UnexpectedReply {
                context: "WATCH",
                reply: "no reply".into(),
            });
        }
        match values.remove(0) {
            redis::Value::Okay => Ok(values),
            redis::Value::SimpleString(s) if s == "OK" => Ok(values),
            redis::Value::ServerError(e) => {
                let e = super::classify::refused("WATCH", &e);
                self.pool.stale.note(&e);
                Err(e)
            }
            other => Err(super::classify::unexpected("WATCH", &other)),
        }
    }

    /// Runs `script` (whose source is `code`) with `keys` and `args` (`EVALSHA`, loading the
    /// script on `NOSCRIPT`) and
    /// pipelines `WAIT wait.replicas timeout` right after it on this connection (a script may
    /// not call `WAIT`). Returns the script's reply (a server error as `Value::ServerError`)
    /// and how many replicas acknowledged. The `WAIT` timeout is capped as in
    /// [`exec_then_wait`](Self::exec_then_wait).
    pub(crate) async fn script_then_wait(
        &mut self,
        script: &redis::Script,
        code: &str,
        keys: &[&str],
        args: &[String],
        wait: ReplicaWait,
    ) -> Result<(redis::Value, u64), Error> {
        let cap = self.pool.settings.response_timeout * 3 / 4;
        let build = |p: &mut redis::Pipeline| {
            p.cmd("EVALSHA")
                .arg(script.get_hash())
                .arg(keys.len())
                .arg(keys)
                .arg(args)
                .cmd("WAIT")
                .arg(wait.replicas)
                .arg(crate::util::time::ms(wait.timeout.min(cap)).max(1));
        };
        let mut p = self.pipe();
        build(&mut p);
        let mut replies: Vec<redis::Value> = self.query(&p).await?;
        if matches!(replies.first(), Some(redis::Value::ServerError(e)) if e.kind() == Some(redis::ServerErrorKind::NoScript))
        {
            // Loaded once per server (after a restart or SCRIPT FLUSH); the WAIT that ran
            // after the refusal counted nothing of ours.
            let mut load = self.pipe();
            load.cmd("SCRIPT").arg("LOAD").arg(code);
            let _: Vec<redis::Value> = self.query(&load).await?;
            let mut p = self.pipe();
            build(&mut p);
            replies = self.query(&p).await?;
        }
        self.clean = true;
        let mut it = replies.into_iter();
        let (Some(reply), Some(acked)) = (it.next(), it.next()) else {
            return Err(Error::UnexpectedReply {
                context: "a script and WAIT",
                reply: "fewer than 2 replies".into(),
            });
        };
        let acked = match acked {
            redis::Value::Int(n) if n >= 0 => n as u64,
            redis::Value::ServerError(e) => return Err(super::classify::refused("WAIT", &e)),
            other => return Err(super::classify::unexpected("WAIT", &other)),
        };
        if let redis::Value::ServerError(e) = &reply {
            return Err(super::classify::from_server_error(e));
        }
        Ok((reply, acked))
    }

    /// The command that wakes subscribers on this connection's node: `PUBLISH`, or `SPUBLISH`
    /// on a cluster.
    pub(crate) fn publish(&self) -> &'static str {
        self.pool.publish
    }

    /// A transaction to fill for [`exec`](Self::exec): the pipeline already holds `MULTI`.
    pub(crate) fn transaction(&self) -> redis::Pipeline {
        let mut p = self.pipe();
        p.cmd("MULTI");
        p
    }

    /// Sends `tx` (from [`transaction`](Self::transaction), with the transaction's commands
    /// added) with `EXEC`, in a single round trip.
    ///
    /// Returns `None` when `EXEC` answered nil (a watched key changed). redis-rs' own transaction
    /// mode drops the `QUEUED` replies, so a command refused at queue time (`READONLY`, `OOM`,
    /// `NOPERM`) would surface only as a bare `EXECABORT`; sending `MULTI`/`EXEC` ourselves keeps
    /// those replies, and the first refusal is reported as the error. Either way the `EXEC` reply
    /// ended the `WATCH`, so the connection is reusable.
    pub(crate) async fn exec(
        &mut self,
        p: redis::Pipeline,
    ) -> Result<Option<Vec<redis::Value>>, Error> {
        Ok(self.exec_then_wait(p, None).await?.0)
    }

    /// [`exec`](Self::exec), with `WAIT replicas timeout` pipelined right after the `EXEC` when
    /// `wait` is set (inside `MULTI` a `WAIT` would return at once). Returns the `EXEC` outcome
    /// and, with `wait`, how many replicas acknowledged every write of this connection so far.
    ///
    /// The `WAIT` timeout is capped at three quarters of the response timeout, so a slow
    /// acknowledgement is never mistaken for a lost reply (which would make the `EXEC`'s outcome
    /// unknown).
    pub(crate) async fn exec_then_wait(
        &mut self,
        mut p: redis::Pipeline,
        wait: Option<ReplicaWait>,
    ) -> Result<(Option<Vec<redis::Value>>, Option<u64>), Error> {
        p.cmd("EXEC");
        if let Some(w) = wait {
            let cap = self.pool.settings.response_timeout * 3 / 4;
            p.cmd("WAIT")
                .arg(w.replicas)
                .arg(crate::util::time::ms(w.timeout.min(cap)).max(1));
        }
        let mut replies: Vec<redis::Value> = self.query(&p).await?;
        let acked = match wait {
            None => None,
            Some(_) => match replies.pop() {
                Some(redis::Value::Int(n)) if n >= 0 => Some(n as u64),
                Some(redis::Value::ServerError(e)) => {
                    return Err(super::classify::refused("WAIT", &e))
                }
                Some(other) => return Err(super::classify::unexpected("WAIT", &other)),
                None => {
                    return Err(Error::UnexpectedReply {
                        context: "WAIT",
                        reply: "no reply".into(),
                    })
                }
            },
        };
        Ok((self.exec_outcome(replies)?, acked))
    }

    /// The outcome of a pipeline that ended with `EXEC` (see [`exec`](Self::exec)).
    fn exec_outcome(
        &mut self,
        mut replies: Vec<redis::Value>,
    ) -> Result<Option<Vec<redis::Value>>, Error> {
        let exec = replies.pop();
        self.clean = true;
        match exec {
            Some(redis::Value::Nil) => Ok(None),
            Some(redis::Value::Array(items)) => Ok(Some(items)),
            Some(redis::Value::ServerError(err)) => {
                let refused = replies.iter().find_map(|v| match v {
                    redis::Value::ServerError(e) => Some(e),
                    _ => None,
                });
                let e = super::classify::from_server_error(refused.unwrap_or(&err));
                self.pool.stale.note(&e);
                Err(e)
            }
            Some(other) => Err(super::classify::unexpected("EXEC", &other)),
            None => Err(Error::UnexpectedReply {
                context: "EXEC",
                reply: "no reply".into(),
            }),
        }
    }

    /// Ends a decision that writes nothing, without a round trip: the connection goes back to
    /// the pool marked so that its next pipeline starts with `UNWATCH` (see
    /// [`query`](Self::query)). Every `WATCH` still ends in `EXEC`, `UNWATCH` or a dropped
    /// connection, and no `EXEC` can run under a stale one; a `WATCH` left active meanwhile only
    /// costs the server a few bytes.
    pub(crate) fn defer_unwatch(&mut self) {
        if self.conn.is_some() {
            self.unwatch_first = true;
            self.clean = true;
        }
    }

    /// A pipeline for this connection: server errors come back as values, and a deferred
    /// `UNWATCH` (see [`defer_unwatch`](Self::defer_unwatch)) goes first, its reply dropped.
    fn pipe(&self) -> redis::Pipeline {
        let mut p = redis::pipe();
        p.ignore_errors();
        if self.unwatch_first {
            p.cmd("UNWATCH").ignore();
        }
        p
    }
}

impl Drop for Dedicated {
    fn drop(&mut self) {
        if self
            .sent
            .is_some_and(|t| t.elapsed() >= self.pool.settings.response_timeout / 4)
        {
            // Dropped while a request went unanswered for a while: as a timeout (the caller
            // gave up first). The connection itself is not pooled (`clean` is false).
            self.pool.stale.set();
        }
        if self.clean {
            if let Some(c) = self.conn.take() {
                lock(&self.pool.idle).push((c, self.unwatch_first));
            }
        }
    }
}

/// Checks every reply inside an `EXEC`: a command can fail inside a transaction that still
/// applies the others, so "EXEC answered" alone proves nothing.
pub(crate) fn check_replies(
    context: &'static str,
    replies: &[Value],
    expect: &[Expect],
) -> Result<(), Error> {
    if replies.len() != expect.len() {
        return Err(Error::UnexpectedReply {
            context,
            reply: format!("{} replies instead of {}", replies.len(), expect.len()),
        });
    }
    for (v, e) in replies.iter().zip(expect) {
        let ok = match (e, v) {
            (_, Value::ServerError(err)) => return Err(super::classify::from_server_error(err)),
            (Expect::Ok, Value::Okay) => true,
            (Expect::Ok, Value::SimpleString(s)) => s == "OK",
            (Expect::Int, Value::Int(_)) => true,
            _ => false,
        };
        if !ok {
            return Err(super::classify::unexpected(context, v));
        }
    }
    Ok(())
}

pub(crate) enum Expect {
    /// `OK`.
    Ok,
    /// Any integer.
    Int,
}

// A plain setting, a leaf: the primitives' options name it too.
pub(crate) use crate::util::settings::ReplicaWait;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_checks() {
        let ok = [Value::Okay, Value::Int(1)];
        assert!(check_replies("t", &ok, &[Expect::Ok, Expect::Int]).is_ok());
        assert!(check_replies("t", &ok, &[Expect::Ok]).is_err());
        let bad = [Value::Int(0), Value::Int(1)];
        assert!(check_replies("t", &bad, &[Expect::Ok, Expect::Int]).is_err());
    }
}
