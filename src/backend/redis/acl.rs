//! Least privilege: the exact Redis commands baton sends, for an ACL user of its own.
//!
//! ```text
//! ACL SETUSER baton on >PASSWORD resetkeys ~baton:* resetchannels &baton:* -@all +watch +unwatch ...
//! ```
//!
//! [`setuser_args`] builds that command. The integration tests run the coordinator as such a user
//! and compare this list with what `ACL GETUSER` reports, so the list cannot drift from the code.

/// Every command the failover coordinator, the mutex, Redlock and the operator tools send.
///
/// The mutex's scripts (`EVALSHA`, `SCRIPT LOAD`) call `GET`, `SET`, `DEL`, `PTTL`, `PEXPIRE`,
/// `TIME`, `INCR` and `PUBLISH`, and waiters `SUBSCRIBE`, all listed here (ACL rules apply to commands
/// inside scripts too); the resource-side fenced write (`Locks::write_fenced`) adds `HGET` and
/// `HSET`, on the resource's key, which must then match the user's key pattern too. Redlock
/// needs nothing more (on each master: a plain `SET … NX PX`, and the same release and
/// extension scripts).
///
/// `CONFIG` (`CONFIG|GET` only) is optional: without it `Client::connect` just skips its
/// durability warning.
pub const FAILOVER_COMMANDS: &[&str] = &[
    // Transitions: WATCH + reads, then MULTI … EXEC (or UNWATCH).
    "watch",
    "unwatch",
    "multi",
    "exec",
    "get",
    "set",
    "del",
    "pttl",
    "pexpire",
    "time",
    // The lock's fence, stepped by one when it is ahead of server time (inside its script).
    "incr",
    // Lease extensions: one script call (loaded on first use, or after a SCRIPT FLUSH).
    "evalsha",
    "script|load",
    // Fenced writes to a resource hash (inside their script).
    "hget",
    "hset",
    // Run-or-enqueue (`queue`): the item stream, inside its scripts (XADD, XDEL, XLEN; PERSIST
    // and PEXPIRE on the stream: an empty one is kept with a TTL, a non-empty one never expires)
    // and read by the holder (XRANGE) and `Queues::pending` (XLEN).
    "xadd",
    "xrange",
    "xdel",
    "xlen",
    "persist",
    // Waking backups (the sharded forms on a Redis Cluster).
    "publish",
    "subscribe",
    "unsubscribe",
    "spublish",
    "ssubscribe",
    "sunsubscribe",
    // Reading a Redis Cluster's slot map, with each node's view of the primaries' config
    // epochs (to prefer the newest map over a resumed primary's stale one; without it a node's
    // map is still used, ranked below those with an epoch), and following an `ASK` redirect
    // while a slot migrates.
    "cluster|slots",
    "cluster|nodes",
    "asking",
    // The fair lock's waiter queue and liveness sets (inside its scripts; `ZRANGE` with
    // `BYSCORE` needs Redis 6.2+).
    "zadd",
    "zrem",
    "zrange",
    "zrank",
    "zscore",
    // The schedule's record (inside its script, and its reads): hashes, the digests' set,
    // the ticks' sorted set, and the pause's expiry.
    "hgetall",
    "hmget",
    "hdel",
    "hlen",
    "hexists",
    "sadd",
    "smembers",
    "zcard",
    "zrevrange",
    "zremrangebyrank",
    "pexpireat",
    // Replica acknowledgement (optional: only with `replica_ack`).
    "wait",
    // Connection health checks of the client library.
    "ping",
    // The durability check (read-only).
    "config|get",
];

/// The arguments of `ACL SETUSER` for a least-privilege user: only baton's keys (`PREFIX*`), only
/// its channels, only [`FAILOVER_COMMANDS`].
pub fn setuser_args(user: &str, password: &str, prefix: &str) -> Vec<String> {
    let mut args = vec![
        "SETUSER".to_string(),
        user.to_string(),
        "reset".to_string(),
        "on".to_string(),
        format!(">{password}"),
        format!("~{prefix}*"),
        format!("&{prefix}*"),
        "-@all".to_string(),
    ];
    args.extend(FAILOVER_COMMANDS.iter().map(|c| format!("+{c}")));
    args
}

/// The same user as one `user` directive line of `redis.conf` (or an `aclfile`), without the
/// leading `user` word: `"<user> reset on >password ~prefix* &prefix* -@all +watch …"`.
///
/// A user defined this way survives a server restart, which one made with `ACL SETUSER` does not
/// (unless the server has an `aclfile` and someone runs `ACL SAVE`). Neither `user` nor
/// `password` may contain whitespace.
pub fn user_rule(user: &str, password: &str, prefix: &str) -> String {
    setuser_args(user, password, prefix)[1..].join(" ")
}
