//! The naming rules every primitive shares: job and lock names, and key prefixes.
//!
//! A name becomes a Redis Cluster hash tag (`{K}`), so `{` and `}` are rejected: they would
//! change which part of the key Redis hashes. Each primitive adds its own sub-prefix (failover
//! jobs none, the mutex `lock:`, Redlock `redlock:`), so equal names never collide.

use crate::error::ConfigError;

/// The default key prefix of every primitive.
pub(crate) const DEFAULT_PREFIX: &str = "baton:";

/// The longest name or prefix, in bytes.
pub(crate) const MAX_NAME_BYTES: usize = 1024;

/// Checks a name reported as `field`: 1..=1024 bytes, not blank, no `{` or `}`.
pub(crate) fn check_name(field: &'static str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() || value.len() > MAX_NAME_BYTES {
        return Err(ConfigError::invalid(
            field,
            format!("must be 1..={MAX_NAME_BYTES} bytes, got {}", value.len()),
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

/// Checks a key prefix: ends with `:`, not blank before it, and the name rules.
pub(crate) fn check_prefix(prefix: &str) -> Result<(), ConfigError> {
    match prefix.strip_suffix(':') {
        None => return Err(ConfigError::invalid("prefix", "must end with `:`")),
        Some(head) if head.trim().is_empty() => {
            return Err(ConfigError::invalid(
                "prefix",
                "must not be blank before the `:`",
            ))
        }
        Some(_) => {}
    }
    check_name("prefix", prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_prefixes_are_checked() {
        assert!(check_name("key", "a").is_ok());
        assert!(check_name("key", &"a".repeat(MAX_NAME_BYTES)).is_ok());
        for bad in ["", " ", "a{b", "a}b"] {
            assert!(check_name("key", bad).is_err(), "{bad:?}");
        }
        assert!(check_name("key", &"a".repeat(MAX_NAME_BYTES + 1)).is_err());
        assert!(check_prefix("app:").is_ok());
        for bad in ["", "app", " :", "{a}:", "a}:"] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("key", "msg:42").is_ok());
        assert!(check_name("key", "ジョブ 🔒").is_ok());
        assert!(check_name("key", &"x".repeat(1024)).is_ok());
        for bad in ["", "   ", "a{b", "}a", &"x".repeat(1025)] {
            let Err(ConfigError::Invalid { field, .. }) = check_name("key", bad) else {
                panic!("{bad:?} accepted");
            };
            assert_eq!(field, "key");
        }
    }

    #[test]
    fn prefixes_are_checked() {
        assert!(check_prefix("baton:").is_ok());
        assert!(check_prefix("app:baton:").is_ok());
        for bad in ["", "baton", " :", "{b}:", ":"] {
            let Err(ConfigError::Invalid { field, .. }) = check_prefix(bad) else {
                panic!("{bad:?} accepted");
            };
            assert_eq!(field, "prefix");
        }
    }
}
