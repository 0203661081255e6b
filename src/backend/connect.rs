//! Building a backend from a URL: the one place that reads the URL's scheme and hands the
//! rest to the backend it names (`postgres://`/`postgresql://` to PostgreSQL, every other
//! scheme to Redis, which checks it). Each backend's own connect and check code sits in its
//! folder (`redis/connect.rs`, `postgres/connect.rs`); a third backend adds one arm here.

use super::Backend;
use crate::error::Error;
use crate::util::settings::ConnSettings;

/// What a client connects with besides its URL: the password given beside it, the connection
/// settings, and the TLS material (feature `tls`).
#[derive(Clone)]
pub(crate) struct ConnectSettings {
    pub(crate) password: Option<String>,
    pub(crate) conn: ConnSettings,
    #[cfg(feature = "tls")]
    pub(crate) tls: crate::util::tls::TlsSettings,
}

/// Whether `url` asks for PostgreSQL (`postgres://`, `postgresql://`).
fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The Redis backend's view of `url` and `s`.
fn redis_options<'a>(url: &'a str, s: &'a ConnectSettings) -> super::redis::connect::Options<'a> {
    super::redis::connect::Options {
        url,
        password: s.password.as_deref(),
        settings: &s.conn,
        #[cfg(feature = "tls")]
        tls: &s.tls,
    }
}

/// A PostgreSQL backend for `url`, not connected yet (feature `postgres`).
fn postgres(url: &str, s: &ConnectSettings) -> Result<Backend, Error> {
    #[cfg(feature = "postgres")]
    {
        let t = super::postgres::connect::build(url, s.password.as_deref(), &s.conn, &s.tls)?;
        Ok(Backend::Postgres(t))
    }
    #[cfg(not(feature = "postgres"))]
    {
        s.conn.check()?;
        Err(Error::Config(crate::error::ConfigError::invalid(
            "url",
            format!(
                "{}: this URL needs baton's `postgres` feature, which is not compiled in",
                crate::util::redact::redact_url(url)
            ),
        )))
    }
}

/// Connects to the backend `url` names and checks it answers (an unreachable server, bad
/// credentials and a failed TLS handshake fail here); sets `reached` once a server of the
/// deployment answered, even with an error (a Sentinel naming a primary that does not answer
/// yet).
///
/// # Errors
/// [`Error::Config`] for invalid settings or URL; connection, permission and TLS errors.
pub(crate) async fn connect(
    url: &str,
    settings: &ConnectSettings,
    reached: &mut bool,
) -> Result<Backend, Error> {
    if is_postgres(url) {
        let backend = postgres(url, settings)?;
        #[cfg(feature = "postgres")]
        if let Ok(t) = backend.postgres("connect", "") {
            super::postgres::connect::check_server(t).await?;
        }
        return Ok(backend);
    }
    let t = super::redis::connect::connect(redis_options(url, settings), reached).await?;
    Ok(Backend::Redis(t))
}

/// The backend `url` names, connecting on first use: the settings and URL checked as
/// [`connect`] does, nothing sent.
///
/// # Errors
/// [`Error::Config`] for invalid settings or URL, a Redis Cluster or Sentinel URL, or when
/// called outside a Tokio runtime.
pub(crate) fn connect_lazy(url: &str, settings: &ConnectSettings) -> Result<Backend, Error> {
    if is_postgres(url) {
        return postgres(url, settings);
    }
    let t = super::redis::connect::connect_lazy(redis_options(url, settings))?;
    Ok(Backend::Redis(t))
}

/// Checks the settings and a Redis URL as [`connect`] does, without connecting.
///
/// # Errors
/// A [`ConfigError`](crate::error::ConfigError) naming the setting or `url`.
#[cfg(test)]
pub(crate) fn check(
    url: &str,
    settings: &ConnectSettings,
) -> Result<(), crate::error::ConfigError> {
    super::redis::connect::check(&redis_options(url, settings))
}
