//! What a PostgreSQL URL asks for, checked before any network I/O: the driver's configuration
//! and the TLS connector (`sslmode`). Pure, so unit-tested without a server.

use std::time::Duration;

use crate::error::{ConfigError, Error};
use crate::util::redact::redact_url;
use crate::util::settings::ConnSettings;

/// How every connection of a client makes TLS: rustls through tokio-postgres-rustls. With
/// `sslmode=disable` (what `prefer` becomes, see [`parse_url`]) it is never used.
pub(crate) type Tls = tokio_postgres_rustls::MakeRustlsConnect;

/// Whether `url` names a PostgreSQL server (`postgres://` or `postgresql://`).
pub(crate) fn is_postgres_url(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// `url` with libpq's `sslmode=verify-ca` and `verify-full` (which the driver does not parse)
/// as `require`, which baton verifies fully anyway (see [`parse_url`]).
fn libpq_sslmodes(url: &str) -> std::borrow::Cow<'_, str> {
    let Some((base, query)) = url.split_once('?') else {
        return url.into();
    };
    let params: Vec<&str> = query
        .split('&')
        .map(|p| match p {
            "sslmode=verify-ca" | "sslmode=verify-full" => "sslmode=require",
            other => other,
        })
        .collect();
    format!("{base}?{}", params.join("&")).into()
}

/// The checks made before any network I/O, and the driver's configuration of `url`.
///
/// TLS is all or nothing: `sslmode=require` connects with TLS only, and verifies the server's
/// certificate and name (what libpq calls `verify-full`: a `require` that accepted any
/// certificate would not stop a man in the middle; libpq's `verify-ca` and `verify-full` are
/// taken as `require`). `sslmode=prefer` (the driver's default)
/// and `disable` connect without TLS: there is no opportunistic TLS, which would fail against
/// the self-signed certificate many servers ship with, or protect nothing when unverified.
pub(crate) fn parse_url(
    url: &str,
    settings: &ConnSettings,
) -> Result<tokio_postgres::Config, ConfigError> {
    let bad = |why: String| ConfigError::invalid("url", format!("{}: {why}", redact_url(url)));
    if !is_postgres_url(url) {
        return Err(bad("the scheme must be postgres:// or postgresql://".into()));
    }
    if url.contains('#') {
        return Err(bad("a URL fragment is not allowed".into()));
    }
    let mut config: tokio_postgres::Config = libpq_sslmodes(url)
        .parse()
        .map_err(|e: tokio_postgres::Error| bad(format!("rejected ({e})")))?;
    if config.get_ssl_mode() != tokio_postgres::config::SslMode::Require {
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
    }
    if config.get_hosts().is_empty() {
        return Err(bad("no host".into()));
    }
    if config.get_ports().contains(&0) {
        return Err(bad("port 0 is not a port to connect to".into()));
    }
    config
        .connect_timeout(settings.connect_timeout)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(30));
    if config.get_application_name().is_none() {
        config.application_name("baton");
    }
    Ok(config)
}

/// The TLS connector of every connection of a client to `config` (parsed from `url`): made
/// from `tls` with `sslmode=require`; TLS options without it are refused, never ignored.
pub(crate) fn connector(
    config: &tokio_postgres::Config,
    url: &str,
    tls: &crate::util::tls::TlsSettings,
) -> Result<Tls, Error> {
    let tls = if config.get_ssl_mode() == tokio_postgres::config::SslMode::Require {
        Tls::new(tls.rustls_config()?)
    } else if tls.is_set() {
        return Err(Error::Config(ConfigError::invalid(
            "url",
            format!(
                "{}: TLS options were given, but the URL does not ask for TLS (add \
                 sslmode=require)",
                redact_url(url)
            ),
        )));
    } else {
        // Never used (no TLS is made with sslmode=disable): no CA store to load.
        crate::util::tls::install_crypto_provider();
        Tls::new(
            rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth(),
        )
    };
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::postgres::PgTransport;

    fn settings() -> ConnSettings {
        ConnSettings {
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_millis(500),
            max_backoff: Duration::from_secs(5),
            pool_size: 4,
        }
    }

    #[test]
    fn urls_are_checked_before_any_io() {
        assert!(parse_url("postgres://u@127.0.0.1:5432/db", &settings()).is_ok());
        assert!(parse_url("postgresql://127.0.0.1/db", &settings()).is_ok());
        for (url, why) in [
            ("redis://127.0.0.1/", "scheme"),
            ("postgres://u:secret@127.0.0.1:0/db", "port 0"),
            ("postgres://u:secret@127.0.0.1/db#x", "fragment"),
        ] {
            let err = parse_url(url, &settings()).unwrap_err().to_string();
            assert!(err.contains(why), "{url}: {err}");
            assert!(!err.contains("secret"), "{url}: the password leaked: {err}");
        }
    }

    #[test]
    fn tls_is_all_or_nothing() {
        use tokio_postgres::config::SslMode;
        let mode = |url: &str| parse_url(url, &settings()).unwrap().get_ssl_mode();
        assert_eq!(
            mode("postgres://127.0.0.1/db?sslmode=require"),
            SslMode::Require
        );
        assert_eq!(
            mode("postgres://127.0.0.1/db?sslmode=verify-full"),
            SslMode::Require
        );
        assert_eq!(
            mode("postgres://127.0.0.1/db?application_name=x&sslmode=verify-ca"),
            SslMode::Require
        );
        // No opportunistic TLS: prefer (the default) and disable connect without.
        assert_eq!(mode("postgres://127.0.0.1/db"), SslMode::Disable);
        assert_eq!(
            mode("postgres://127.0.0.1/db?sslmode=prefer"),
            SslMode::Disable
        );
        assert_eq!(
            mode("postgres://127.0.0.1/db?sslmode=disable"),
            SslMode::Disable
        );
        // TLS options with a URL that does not ask for TLS are refused, never ignored.
        let tls = crate::util::tls::TlsSettings {
            root_ca: Some(crate::util::tls::Pem::bytes(b"x".to_vec())),
            client: None,
        };
        let err = PgTransport::new("postgres://127.0.0.1/db", None, settings(), &tls)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sslmode=require"), "{err}");
        // And unusable ones are refused before any I/O.
        let err = PgTransport::new(
            "postgres://127.0.0.1/db?sslmode=require",
            None,
            settings(),
            &tls,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("tls_root_ca"), "{err}");
    }
}
