//! Redlock's commands on one Redis master (the seam is `backend::redlock`): `SET NX PX` to
//! take, the lease extension script to extend, the lock store's token-checked release to
//! release, each on the node of that master that serves the lock.

use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::script::extend;
use super::{unexpected, Transport};
use crate::error::Error;
use crate::util::lock_replies::{Extend, Extension};
use crate::util::time::ms;

/// `SET lock token NX PX ttl` on one master, giving up at `limit`: `true` if it set.
pub(crate) async fn set_nx(
    master: &Transport,
    lock: &str,
    token: &str,
    ttl: Duration,
    limit: Instant,
) -> Result<bool, Error> {
    let mut cmd = redis::cmd("SET");
    cmd.arg(lock).arg(token).arg("NX").arg("PX").arg(ms(ttl));
    let query = async {
        let mut conn = master.node(lock).await?.conn();
        Ok::<Value, Error>(cmd.query_async(&mut conn).await?)
    };
    let reply: Value = match tokio::time::timeout_at(limit, query).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(Error::Timeout {
                during: "setting the Redlock on one master",
            })
        }
    };
    parse_set(reply)
}

fn parse_set(reply: Value) -> Result<bool, Error> {
    match reply {
        Value::Okay => Ok(true),
        Value::SimpleString(s) if s == "OK" => Ok(true),
        Value::Nil => Ok(false),
        other => Err(unexpected("the Redlock SET NX", &other)),
    }
}

/// Compare-and-`PEXPIRE` of `lock` to `ttl` if it still holds `token`, giving up at `limit`.
///
/// # Errors
/// [`Error::Timeout`] at `limit`; connection and server errors.
pub(crate) async fn extend_on(
    master: &Transport,
    lock: &str,
    token: &str,
    ttl: Duration,
    limit: Instant,
) -> Result<Extension, Error> {
    let mut conn = master.node(lock).await?.conn();
    let req = Extend {
        lease: lock,
        value: token,
        ttl,
        guard: lock,
        guard_value: token,
        refresh: &[],
        retention: ttl,
    };
    Ok(extend(&mut conn, &req, limit).await?.into_extension())
}

/// Compare-and-delete of `lock` by `token`, waking `channel`, giving up at `limit` (alone:
/// Redlock's masters are clients of their own, never grouped).
///
/// # Errors
/// [`Error::Timeout`] at `limit`; connection and server errors.
pub(crate) async fn release_on(
    master: &Transport,
    lock: &str,
    channel: &str,
    token: &str,
    limit: Instant,
) -> Result<bool, Error> {
    let mut conn = master.node(lock).await?.conn();
    super::locks::release(&mut conn, lock, channel, token, limit).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replies_are_parsed_without_panicking() {
        assert!(parse_set(Value::Okay).unwrap());
        assert!(parse_set(Value::SimpleString("OK".into())).unwrap());
        assert!(!parse_set(Value::Nil).unwrap());
        for bad in [
            Value::Int(1),
            Value::SimpleString("QUEUED".into()),
            Value::Array(vec![]),
        ] {
            assert_eq!(
                parse_set(bad).unwrap_err().kind(),
                crate::error::ErrorKind::UnexpectedReply
            );
        }
    }
}
