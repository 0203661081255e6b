//! How baton classifies what the PostgreSQL driver reports, in one place: every
//! `tokio_postgres::Error` becomes a typed [`Error`] with a stable [`ErrorKind`], by SQLSTATE
//! (see docs/operating.md), so `is_retryable` is decided once.

use std::sync::Arc;

use tokio_postgres::error::SqlState;

use crate::error::{Error, ErrorKind};

/// A driver error as a typed [`Error`], classified by SQLSTATE (see docs/operating.md's PostgreSQL
/// section); `during` names the step for timeouts.
pub(crate) fn classify(err: tokio_postgres::Error, during: &'static str) -> Error {
    let Some(db) = err.as_db_error() else {
        // A failed TLS handshake (an untrusted or misnamed certificate, a server without TLS
        // for sslmode=require) is never retried, as on Redis.
        if let Some(why) = tls_failure(&err) {
            return Error::Tls {
                message: format!("PostgreSQL: {why}"),
                source: Some(Arc::new(err)),
            };
        }
        // The server asked for a password and the URL has none: the credentials, which no
        // retry changes (the driver says only "invalid configuration", its source why). Given
        // the SQLSTATE of a failed password login, which is what the server would answer.
        if std::error::Error::source(&err).is_some_and(|s| s.to_string() == "password missing") {
            return Error::Postgres {
                kind: ErrorKind::Permission,
                code: "28P01".into(),
                message: "the server asks for a password and none was given".into(),
                source: Some(Arc::new(err)),
            };
        }
        // Not the server's answer: the connection failed, closed, or the reply was unreadable.
        // The driver's own words ("error connecting to server") leave the cause to its source
        // chain: the cause ("Connection refused", "timed out") is what a reader needs.
        let message = with_causes(&err);
        return Error::Connection {
            message: format!("PostgreSQL: {message}"),
            source: Some(Arc::new(err)),
        };
    };
    let code = db.code().clone();
    let kind = kind_of(&code);
    if kind == ErrorKind::Timeout {
        return Error::Timeout { during };
    }
    let message = db.message().to_string();
    Error::Postgres {
        kind,
        code: code.code().to_string(),
        message,
        source: Some(Arc::new(err)),
    }
}

/// `err`'s text followed by each cause in its source chain that it does not already say
/// (`error connecting to server: Connection refused (os error 111)`).
fn with_causes(err: &tokio_postgres::Error) -> String {
    let mut message = err.to_string();
    let mut next = std::error::Error::source(err);
    // A bound, not a loop forever on a strange self-referencing chain.
    for _ in 0..8 {
        let Some(cause) = next else { break };
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        next = cause.source();
    }
    message
}

/// What rustls reported, if `err` is a failed TLS handshake; or that the server has no TLS.
fn tls_failure(err: &tokio_postgres::Error) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(err);
    // A bound, not a loop forever on a strange self-referencing chain.
    for _ in 0..16 {
        let e = next?;
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r.to_string());
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(r) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(r.to_string());
            }
        }
        // The driver's own words when the server refuses TLS under sslmode=require.
        if e.to_string().contains("server does not support TLS") {
            return Some("the server does not support TLS (sslmode=require)".into());
        }
        next = e.source();
    }
    None
}

/// The classification of a SQLSTATE.
pub(crate) fn kind_of(code: &SqlState) -> ErrorKind {
    let class = &code.code()[..2.min(code.code().len())];
    if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::LOCK_NOT_AVAILABLE
    {
        ErrorKind::Busy
    } else if *code == SqlState::QUERY_CANCELED {
        ErrorKind::Timeout
    } else if *code == SqlState::READ_ONLY_SQL_TRANSACTION {
        ErrorKind::ReadOnly
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE || class == "28" {
        // 28000 (no such role, no pg_hba.conf entry), 28P01 (wrong password), 42501.
        ErrorKind::Permission
    } else if *code == SqlState::INVALID_CATALOG_NAME {
        // 3D000: the URL's database does not exist.
        ErrorKind::Misconfigured
    } else if class == "08" || class == "57" {
        // Connection exceptions; operator intervention (admin shutdown, crash shutdown,
        // cannot connect now): the session is gone or going.
        ErrorKind::Connection
    } else if class == "53" {
        ErrorKind::Oom
    } else {
        ErrorKind::Server
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_classified() {
        assert_eq!(
            kind_of(&SqlState::T_R_SERIALIZATION_FAILURE),
            ErrorKind::Busy
        );
        assert_eq!(kind_of(&SqlState::ADMIN_SHUTDOWN), ErrorKind::Connection);
        assert_eq!(
            kind_of(&SqlState::READ_ONLY_SQL_TRANSACTION),
            ErrorKind::ReadOnly
        );
        assert_eq!(
            kind_of(&SqlState::INSUFFICIENT_PRIVILEGE),
            ErrorKind::Permission
        );
        assert_eq!(kind_of(&SqlState::INVALID_PASSWORD), ErrorKind::Permission);
        assert_eq!(
            kind_of(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION),
            ErrorKind::Permission
        );
        assert_eq!(
            kind_of(&SqlState::INVALID_CATALOG_NAME),
            ErrorKind::Misconfigured
        );
        assert_eq!(kind_of(&SqlState::DISK_FULL), ErrorKind::Oom);
        assert_eq!(kind_of(&SqlState::QUERY_CANCELED), ErrorKind::Timeout);
        assert_eq!(kind_of(&SqlState::UNIQUE_VIOLATION), ErrorKind::Server);
    }
}
