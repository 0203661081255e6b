//! [`ElectionOptions`]: the lease, how long the work gets to stop, and the candidate's name.
//! Validated by [`ElectionOptionsBuilder::build`] and by deserialization alike, never coerced.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// The shortest lease.
pub const MIN_LEASE: Duration = Duration::from_millis(10);
/// The longest lease (one day).
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 3600);
/// The default lease.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);
/// The longest candidate name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;

/// How an elector campaigns and leads.
///
/// - `lease` (default 10 s, 10 ms ..= 1 day): how long a silent leader keeps leading. The
///   leader renews it every `lease / 3`.
/// - `stop_timeout` (default `lease / 5`, at most `lease / 2`): when renewals fail, the work is
///   told to stop this long before the lease can end, so it has stopped before anyone else can
///   be elected; a work still running at the lease's end is reported loudly (`StopOverdue`).
/// - `name` (default `host:pid`, 1..=256 bytes, no control characters): what observers see.
///
/// Build it with [`ElectionOptions::builder`] or deserialize it (durations in milliseconds,
/// e.g. `{"lease_ms":10000,"name":"api-1"}`); both run the same validation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawOptions", into = "RawOptions")]
pub struct ElectionOptions {
    pub(crate) lease: Duration,
    pub(crate) stop_timeout: Duration,
    pub(crate) name: Option<String>,
}

impl Default for ElectionOptions {
    fn default() -> Self {
        ElectionOptions {
            lease: DEFAULT_LEASE,
            stop_timeout: DEFAULT_LEASE / 5,
            name: None,
        }
    }
}

impl ElectionOptions {
    /// Starts from the defaults.
    pub fn builder() -> ElectionOptionsBuilder {
        ElectionOptionsBuilder {
            raw: RawOptions::default(),
        }
    }

    /// The lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// How long before the lease can end the work is told to stop when renewals fail.
    pub fn stop_timeout(&self) -> Duration {
        self.stop_timeout
    }

    /// The candidate's name (`None`: `host:pid`).
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// Builds [`ElectionOptions`]; [`ElectionOptionsBuilder::build`] validates.
#[derive(Debug, Clone)]
pub struct ElectionOptionsBuilder {
    raw: RawOptions,
}

impl ElectionOptionsBuilder {
    /// The lease (10 ms ..= 1 day). Also sets `stop_timeout` to `lease / 5` unless it was set.
    /// Defaults to 10 s ([`DEFAULT_LEASE`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.raw.lease_ms = crate::util::time::ms(lease);
        self
    }

    /// How long before the lease can end the work is told to stop (at most `lease / 2`).
    /// Defaults to `lease / 5`.
    pub fn stop_timeout(mut self, d: Duration) -> Self {
        self.raw.stop_timeout_ms = Some(crate::util::time::ms(d));
        self
    }

    /// The candidate's name, shown to observers (1..=256 bytes, no control characters).
    /// Defaults to `host:pid`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.raw.name = Some(name.into());
        self
    }

    /// Validates.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first invalid setting.
    pub fn build(self) -> Result<ElectionOptions, ConfigError> {
        ElectionOptions::try_from(self.raw)
    }
}

/// The serialized shape: plain fields with defaults, durations in ms.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RawOptions {
    lease_ms: u64,
    /// `None`: a fifth of the lease.
    stop_timeout_ms: Option<u64>,
    name: Option<String>,
}

impl Default for RawOptions {
    fn default() -> Self {
        RawOptions {
            lease_ms: crate::util::time::ms(DEFAULT_LEASE),
            stop_timeout_ms: None,
            name: None,
        }
    }
}

impl From<ElectionOptions> for RawOptions {
    fn from(o: ElectionOptions) -> Self {
        RawOptions {
            lease_ms: crate::util::time::ms(o.lease),
            stop_timeout_ms: Some(crate::util::time::ms(o.stop_timeout)),
            name: o.name,
        }
    }
}

impl TryFrom<RawOptions> for ElectionOptions {
    type Error = ConfigError;

    fn try_from(r: RawOptions) -> Result<Self, ConfigError> {
        let lease = Duration::from_millis(r.lease_ms);
        if lease < MIN_LEASE || lease > MAX_LEASE {
            return Err(ConfigError::invalid(
                "lease",
                format!("{lease:?} is outside 10ms ..= 1 day"),
            ));
        }
        let stop_timeout = r.stop_timeout_ms.map_or(lease / 5, Duration::from_millis);
        if stop_timeout > lease / 2 {
            return Err(ConfigError::invalid(
                "stop_timeout",
                format!(
                    "{stop_timeout:?} is above half the lease ({:?}): the work would be told to \
                     stop before a renewal could even be retried",
                    lease / 2
                ),
            ));
        }
        if let Some(name) = &r.name {
            check_candidate_name(name)?;
        }
        Ok(ElectionOptions {
            lease,
            stop_timeout,
            name: r.name,
        })
    }
}

/// A candidate name: 1..=256 bytes, not blank, no control characters (it is printed).
pub(crate) fn check_candidate_name(name: &str) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(ConfigError::invalid(
            "name",
            format!("must be 1..={MAX_NAME_BYTES} bytes, got {}", name.len()),
        ));
    }
    if name.trim().is_empty() {
        return Err(ConfigError::invalid("name", "must not be blank"));
    }
    if name.chars().any(char::is_control) {
        return Err(ConfigError::invalid(
            "name",
            "must not contain control characters",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let d = ElectionOptions::builder().build().unwrap();
        assert_eq!(d, ElectionOptions::default());
        assert_eq!(d.stop_timeout(), Duration::from_secs(2));
        let o = ElectionOptions::builder()
            .lease(Duration::from_secs(30))
            .build()
            .unwrap();
        assert_eq!(o.stop_timeout(), Duration::from_secs(6));
        for bad in [
            ElectionOptions::builder().lease(Duration::from_millis(5)),
            ElectionOptions::builder().lease(Duration::from_secs(2 * 86_400)),
            ElectionOptions::builder()
                .lease(Duration::from_secs(10))
                .stop_timeout(Duration::from_secs(6)),
            ElectionOptions::builder().name(""),
            ElectionOptions::builder().name("  "),
            ElectionOptions::builder().name("a\nb"),
            ElectionOptions::builder().name("x".repeat(257)),
        ] {
            assert!(bad.build().is_err());
        }
    }

    #[test]
    fn deserialization_validates_too() {
        let o: ElectionOptions =
            serde_json::from_str(r#"{"lease_ms":3000,"name":"api-1"}"#).unwrap();
        assert_eq!(o.lease(), Duration::from_secs(3));
        assert_eq!(o.name(), Some("api-1"));
        assert!(serde_json::from_str::<ElectionOptions>(r#"{"lease_ms":1}"#).is_err());
        assert!(serde_json::from_str::<ElectionOptions>(r#"{"bogus":1}"#).is_err());
        let back: ElectionOptions =
            serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(back, o);
    }
}
