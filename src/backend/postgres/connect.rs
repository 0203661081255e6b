//! Connecting to PostgreSQL: the transport built from the URL (nothing sent yet), and the
//! first round trip that makes an unreachable server or bad credentials fail at connect and
//! reads the durability settings a connect warns about.

use std::sync::Arc;

use super::PgTransport;
use crate::error::Error;
use crate::util::settings::ConnSettings;

/// The settings that decide whether an acknowledged commit survives a crash.
const DURABILITY: &str = "SELECT name, setting FROM pg_settings WHERE name IN \
                          ('fsync', 'synchronous_commit', 'full_page_writes')";

/// A transport for `url`, not connected yet (its pool connects on first use).
///
/// # Errors
/// [`Error::Config`] for invalid settings, URL or TLS material.
pub(crate) fn build(
    url: &str,
    password: Option<&str>,
    settings: &ConnSettings,
    tls: &crate::util::tls::TlsSettings,
) -> Result<Arc<PgTransport>, Error> {
    settings.check()?;
    Ok(Arc::new(PgTransport::new(
        url,
        password,
        settings.clone(),
        tls,
    )?))
}

/// One round trip: fails as a connect on Redis does (an unreachable server, bad credentials),
/// and warns (via `tracing`) when the durability settings may lose acknowledged commits.
///
/// # Errors
/// Connection errors, timeouts, a permission error for bad credentials.
pub(crate) async fn check_server(t: &PgTransport) -> Result<(), Error> {
    let conn = t.pooled().await?;
    let rows = conn
        .by(
            tokio::time::Instant::now() + t.settings.response_timeout,
            "connecting",
            conn.query(DURABILITY, &[]),
        )
        .await?;
    let unsafe_settings: Vec<String> = rows
        .iter()
        .filter_map(|r| {
            let (name, value): (String, String) = (r.try_get(0).ok()?, r.try_get(1).ok()?);
            let safe = match name.as_str() {
                "synchronous_commit" => value != "off",
                _ => value == "on",
            };
            (!safe).then(|| format!("{name} is {value}"))
        })
        .collect();
    if !unsafe_settings.is_empty() {
        tracing::warn!(
            problems = ?unsafe_settings,
            "PostgreSQL may lose acknowledged commits in a crash; baton's guarantees \
             need fsync on, synchronous_commit on and full_page_writes on"
        );
    }
    Ok(())
}
