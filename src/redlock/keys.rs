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

use crate::error::ConfigError;

/// The default key prefix (shared with the other primitives; each adds its own sub-prefix).
pub const DEFAULT_PREFIX: &str = "baton:";

/// The longest lock name, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// The key and channel of one Redlock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RedlockKeys {
    pub lock: String,
    pub channel: String,
}

impl RedlockKeys {
    /// The keys of lock `name` under `prefix` (both already validated).
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let lock = format!("{prefix}redlock:{{{name}}}");
        RedlockKeys {
            channel: format!("{lock}:released"),
            lock,
        }
    }
}

/// Checks a lock name: 1..=1024 bytes, not blank, no `{` or `}`.
pub(crate) fn validate_name(name: &str) -> Result<(), ConfigError> {
    validate("key", name)
}

/// Checks a prefix: 1..=1024 bytes, ends with `:`, not blank before it, no `{` or `}`.
pub(crate) fn validate_prefix(prefix: &str) -> Result<(), ConfigError> {
    validate("prefix", prefix)?;
    match prefix.strip_suffix(':') {
        None => Err(ConfigError::invalid("prefix", "must end with `:`")),
        Some(head) if head.trim().is_empty() => Err(ConfigError::invalid(
            "prefix",
            "must not be blank before the `:`",
        )),
        Some(_) => Ok(()),
    }
}

fn validate(field: &'static str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() > MAX_KEY_BYTES {
        return Err(ConfigError::invalid(
            field,
            format!("must be 1..={MAX_KEY_BYTES} bytes, got {}", value.len()),
        ));
    }
    if value.trim().is_empty() {
        return Err(ConfigError::invalid(field, "must not be blank"));
    }
    if value.contains('{') || value.contains('}') {
        return Err(ConfigError::invalid(
            field,
            "must not contain `{` or `}` (they would change the Redis Cluster hash tag)",
        ));
    }
    Ok(())
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
        assert!(validate_name("a").is_ok());
        assert!(validate_name(&"a".repeat(MAX_KEY_BYTES)).is_ok());
        for bad in ["", " ", "a{b", "a}b"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name(&"a".repeat(MAX_KEY_BYTES + 1)).is_err());
        assert!(validate_prefix("app:").is_ok());
        for bad in ["", "app", " :", "{a}:"] {
            assert!(validate_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
