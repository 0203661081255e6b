//! Key naming of Redlock, under its own sub-prefix so that a Redlock, a mutex and a failover
//! job with the same name never collide (`baton:redlock:{K}` is not `baton:lock:{K}`).
//!
//! | key (on every master) | value | TTL |
//! | --- | --- | --- |
//! | `P` `redlock:{K}` | the holder's random 128-bit token (hex) | the lock's TTL |
//! | `P` `redlock:{K}:released` | pub/sub channel: `released` (published by the shared release script) | — |
//!
//! No fence key: Redlock has no fencing token (see the [module docs](super)). `{K}` is a Redis
//! Cluster hash tag, which is why `{` and `}` are rejected in names and prefixes; the prefix
//! defaults to `baton:`.

/// The sub-prefix of this primitive's keys after the key prefix (`P` `redlock:{K}`): what tells
/// its keys from the other primitives' (a failover job's have none: `P{K}`), also for the
/// listing of everything under a prefix.
pub(crate) const SUB_PREFIX: &str = "redlock:";

/// The default key prefix (shared with the other primitives; each adds its own sub-prefix).
pub const DEFAULT_PREFIX: &str = crate::util::names::DEFAULT_PREFIX;

/// The longest lock name, in bytes.
pub const MAX_KEY_BYTES: usize = crate::util::names::MAX_NAME_BYTES;

/// The key and channel of one Redlock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedlockKeys {
    pub lock: String,
    pub channel: String,
}

impl RedlockKeys {
    /// The keys of lock `name` under `prefix` (both already validated).
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let lock = format!("{prefix}{SUB_PREFIX}{{{name}}}");
        RedlockKeys {
            channel: format!("{lock}:released"),
            lock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_live_under_their_own_sub_prefix() {
        let k = RedlockKeys::new("baton:", "orders");
        assert_eq!(k.lock, "baton:redlock:{orders}");
        assert_eq!(k.channel, "baton:redlock:{orders}:released");
    }

    #[test]
    fn names_and_prefixes_are_validated() {
        assert!(crate::util::names::check_name("key", "a").is_ok());
        assert!(crate::util::names::check_name("key", &"a".repeat(MAX_KEY_BYTES)).is_ok());
        for bad in ["", " ", "a{b", "a}b"] {
            assert!(
                crate::util::names::check_name("key", bad).is_err(),
                "{bad:?}"
            );
        }
        assert!(crate::util::names::check_name("key", &"a".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(crate::util::names::check_prefix("app:").is_ok());
        for bad in ["", "app", " :", "{a}:"] {
            assert!(crate::util::names::check_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
