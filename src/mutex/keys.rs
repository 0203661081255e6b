//! Key naming of the mutex, under its own sub-prefix so that a lock and a failover job with the
//! same name never collide (`baton:lock:{msg:42}` is not `baton:{msg:42}`).
//!
//! | key | value | TTL |
//! | --- | --- | --- |
//! | `P` `lock:{K}` | the holder's random 128-bit token (hex) | the lock's TTL |
//! | `P` `lock:{K}:fence` | the last fencing token granted | max(24 h, 2 × TTL), refreshed by extensions |
//! | `P` `lock:{K}:released` | pub/sub channel: `released` | — |
//!
//! `{K}` is a Redis Cluster hash tag: the lock and its fence share a slot, so one script can
//! touch both. That is why `{` and `}` are rejected in names and prefixes.

use crate::error::ConfigError;

/// The default key prefix (shared with the other primitives; each adds its own sub-prefix).
pub const DEFAULT_PREFIX: &str = "baton:";

/// The longest lock name, in bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// The keys and channel of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockKeys {
    pub lock: String,
    pub fence: String,
    pub channel: String,
}

impl LockKeys {
    /// The keys of lock `name` under `prefix` (both already validated).
    pub(crate) fn new(prefix: &str, name: &str) -> Self {
        let lock = format!("{prefix}lock:{{{name}}}");
        LockKeys {
            fence: format!("{lock}:fence"),
            channel: format!("{lock}:released"),
            lock,
        }
    }
}

/// Checks a lock name: 1..=1024 bytes, not blank, no `{` or `}`.
pub(crate) fn validate_name(name: &str) -> Result<(), ConfigError> {
    validate("key", name)
}

/// Checks a prefix: ends with `:`, not blank before it, no `{` or `}`.
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
    fn keys_live_under_their_own_sub_prefix_and_share_a_hash_tag() {
        let k = LockKeys::new("baton:", "msg:42");
        assert_eq!(k.lock, "baton:lock:{msg:42}");
        assert_eq!(k.fence, "baton:lock:{msg:42}:fence");
        assert_eq!(k.channel, "baton:lock:{msg:42}:released");
        // A failover job of the same name uses `baton:{msg:42}`: no collision.
        assert_ne!(k.lock, "baton:{msg:42}");
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("msg:42").is_ok());
        assert!(validate_name("ジョブ 🔒").is_ok());
        assert!(validate_name(&"x".repeat(1024)).is_ok());
        for bad in ["", "   ", "a{b", "}a", &"x".repeat(1025)] {
            let Err(ConfigError::Invalid { field, .. }) = validate_name(bad) else {
                panic!("{bad:?} accepted");
            };
            assert_eq!(field, "key");
        }
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(validate_prefix("baton:").is_ok());
        assert!(validate_prefix("app:baton:").is_ok());
        for bad in ["", "baton", " :", "{b}:", ":"] {
            let Err(ConfigError::Invalid { field, .. }) = validate_prefix(bad) else {
                panic!("{bad:?} accepted");
            };
            assert_eq!(field, "prefix");
        }
    }
}
