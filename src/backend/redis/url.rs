//! URL checks made before any network I/O (catalogue row 8), and the redaction every message
//! and `Debug` output shows a URL through.

use crate::error::ConfigError;

/// Which kind of connection a URL asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    /// `redis://` or `unix://`.
    Plain,
    /// `rediss://` (feature `tls`).
    Tls,
}

/// The checks of catalogue row 8 that redis-rs' URL parser does not make, before any network
/// I/O. Every message shows the URL through [`redact_url`].
pub(crate) fn check_url(url: &str, tls_options: bool) -> Result<Scheme, ConfigError> {
    let bad = |why: &str| ConfigError::invalid("url", format!("{}: {why}", redact_url(url)));
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("not a URL (expected redis://host:port/)"));
    };
    let scheme = match scheme {
        "redis" | "unix" => Scheme::Plain,
        "rediss" if cfg!(feature = "tls") => Scheme::Tls,
        "rediss" => {
            return Err(bad(
                "rediss:// needs baton's `tls` feature, which is not compiled in",
            ))
        }
        _ => return Err(bad(&format!("the scheme must be {}", compiled_schemes()))),
    };
    if let Some((_, fragment)) = rest.split_once('#') {
        return Err(if fragment == "insecure" {
            bad("#insecure (skip certificate checks) is always refused")
        } else {
            bad("a URL fragment is not allowed")
        });
    }
    let before_query = rest.split_once('?').map_or(rest, |(b, _)| b);
    if let Some((userinfo, _)) = before_query.rsplit_once('@') {
        if userinfo.is_empty() || userinfo == ":" {
            return Err(bad(
                "empty credentials (`:@`): give a password, or leave out the `@`",
            ));
        }
    }
    if tls_options && scheme != Scheme::Tls {
        return Err(bad(
            "TLS options were given, but the URL is not rediss://; TLS is never silently dropped",
        ));
    }
    Ok(scheme)
}

/// The URL schemes this build accepts, for messages: only those of the features compiled in
/// (naming `rediss://` to a build without `tls` would send the user to a dead end).
pub(crate) fn compiled_schemes() -> String {
    let schemes: Vec<&str> = [
        ("redis://", true),
        ("rediss://", cfg!(feature = "tls")),
        ("unix://", true),
        ("redis+cluster://", cfg!(feature = "cluster")),
        ("redis+sentinel://", cfg!(feature = "sentinel")),
        ("postgres://", cfg!(feature = "postgres")),
        ("postgresql://", cfg!(feature = "postgres")),
    ]
    .into_iter()
    .filter_map(|(scheme, compiled)| compiled.then_some(scheme))
    .collect();
    match schemes.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => schemes.join(""),
    }
}

pub(crate) use crate::util::redact::redact_url;
