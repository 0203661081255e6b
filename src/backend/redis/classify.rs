//! How baton classifies what the `redis` crate and the server report, in one place: every
//! `RedisError` and every server error reply inside a pipeline becomes a typed [`Error`] with a
//! stable [`ErrorKind`] (so `is_retryable` is decided once).

use crate::error::{preview, Error, ErrorKind};

/// A reply baton did not expect, shown bounded and escaped.
pub(crate) fn unexpected(context: &'static str, reply: &redis::Value) -> Error {
    Error::UnexpectedReply {
        context,
        reply: preview(&format!("{reply:?}")),
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        // First: a failed handshake is an I/O error to redis-rs, but must not look like a
        // transient connection problem (that would be retried).
        #[cfg(feature = "tls")]
        if let Some(message) = crate::util::tls::failure(&err) {
            return Error::Tls {
                message,
                source: Some(std::sync::Arc::new(err)),
            };
        }
        if err.is_timeout() {
            return Error::Timeout {
                during: "waiting for a reply",
            };
        }
        if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
            return Error::Connection {
                message: err.to_string(),
                source: Some(std::sync::Arc::new(err)),
            };
        }
        match err.kind() {
            // The `SELECT` of the URL's database, refused while connecting: the server will
            // refuse it every time, so this is the configuration, never a transient failure.
            redis::ErrorKind::Server(_) if refused_database(&err) => Error::Redis {
                kind: ErrorKind::Misconfigured,
                code: err.code().unwrap_or("ERR").to_string(),
                message: format!(
                    "the server refused to switch to the URL's database: {}",
                    err.detail().unwrap_or_default()
                ),
                source: Some(std::sync::Arc::new(err)),
            },
            redis::ErrorKind::Server(server) => Error::Redis {
                kind: server_kind(Some(server), err.code()),
                code: err.code().unwrap_or("ERR").to_string(),
                message: err.detail().unwrap_or_default().to_string(),
                source: Some(std::sync::Arc::new(err)),
            },
            // Server errors whose code redis-rs does not know (NOAUTH, WRONGPASS, WRONGTYPE,
            // OOM, BUSY, ...) come as `Extension`; they are server replies, not connection
            // trouble.
            redis::ErrorKind::Extension => Error::Redis {
                kind: server_kind(None, err.code()),
                code: err.code().unwrap_or("ERR").to_string(),
                message: err.detail().unwrap_or_default().to_string(),
                source: Some(std::sync::Arc::new(err)),
            },
            redis::ErrorKind::AuthenticationFailed => Error::Redis {
                kind: ErrorKind::Permission,
                code: "AUTH".into(),
                message: err.to_string(),
                source: Some(std::sync::Arc::new(err)),
            },
            redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType => {
                Error::UnexpectedReply {
                    context: "a request",
                    reply: err.to_string(),
                }
            }
            _ => Error::Connection {
                message: err.to_string(),
                source: Some(std::sync::Arc::new(err)),
            },
        }
    }
}

/// Whether `err` is the server refusing the `SELECT` redis-rs sends for the URL's database
/// (`ERR DB index is out of range`; redis-rs adds "refused to switch database").
fn refused_database(err: &redis::RedisError) -> bool {
    err.detail()
        .is_some_and(|d| d.contains("DB index is out of range"))
        || err.to_string().contains("refused to switch database")
}

/// Maps a server error (from a reply inside a pipeline) to a typed error.
pub(crate) fn from_server_error(err: &redis::ServerError) -> Error {
    Error::Redis {
        kind: server_kind(err.kind(), Some(err.code())),
        code: err.code().to_string(),
        message: err.details().unwrap_or_default().to_string(),
        source: None,
    }
}

/// A command the server refused, as an error whose message names the command (a refused `WATCH`
/// reads "WATCH refused: NOPERM …"), classified like any server error.
pub(crate) fn refused(command: &'static str, err: &redis::ServerError) -> Error {
    Error::Redis {
        kind: server_kind(err.kind(), Some(err.code())),
        code: err.code().to_string(),
        message: format!("{command} refused: {}", err.details().unwrap_or_default()),
        source: None,
    }
}

fn server_kind(kind: Option<redis::ServerErrorKind>, code: Option<&str>) -> ErrorKind {
    use redis::ServerErrorKind as S;
    match kind {
        Some(S::ReadOnly) => ErrorKind::ReadOnly,
        Some(S::BusyLoading) | Some(S::TryAgain) | Some(S::MasterDown) | Some(S::ClusterDown) => {
            ErrorKind::Busy
        }
        Some(S::NoPerm) => ErrorKind::Permission,
        Some(S::Moved) | Some(S::Ask) => ErrorKind::Moved,
        _ => match code {
            Some("WRONGTYPE") => ErrorKind::WrongType,
            Some("NOAUTH") | Some("WRONGPASS") => ErrorKind::Permission,
            Some("BUSY") => ErrorKind::Busy,
            // OOM: memory may be freed (keys expire); retryable, and nothing was written.
            Some("OOM") => ErrorKind::Oom,
            _ => ErrorKind::Server,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "tls")]
    #[test]
    fn a_rustls_error_inside_an_io_error_is_classified_as_tls() {
        // The shape redis-rs 1.8 returns for a failed handshake (see crate::util::tls::failure).
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let e = Error::from(redis::RedisError::from(io));
        assert_eq!(e.kind(), ErrorKind::Tls, "{e:?}");
        assert!(e.to_string().contains("UnknownIssuer"), "{e}");
        // A plain I/O error stays a connection error.
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let e = Error::from(redis::RedisError::from(io));
        assert_eq!(e.kind(), ErrorKind::Connection);
    }

    #[test]
    fn server_errors_redis_rs_does_not_know_keep_their_kind() {
        for (code, kind) in [
            ("NOAUTH", ErrorKind::Permission),
            ("WRONGPASS", ErrorKind::Permission),
            ("WRONGTYPE", ErrorKind::WrongType),
            ("OOM", ErrorKind::Oom),
            ("BUSY", ErrorKind::Busy),
            ("SOMETHINGNEW", ErrorKind::Server),
        ] {
            let e = Error::from(redis::make_extension_error(
                code.into(),
                Some("detail".into()),
            ));
            assert_eq!(e.kind(), kind, "{code}: {e:?}");
            assert!(!e.is_indeterminate(), "{code}: a reply, not a lost one");
        }
    }

    #[test]
    fn a_database_index_out_of_range_is_the_configuration() {
        // The shape redis-rs 1.8 returns when the SELECT of its connection setup is refused.
        let err = redis::RedisError::from((
            redis::ServerErrorKind::ResponseError.into(),
            "Redis server refused to switch database",
            "DB index is out of range".to_string(),
        ));
        let e = Error::from(err);
        assert_eq!(e.kind(), ErrorKind::Misconfigured, "{e:?}");
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("DB index is out of range"), "{e}");
    }

    #[test]
    fn errors_keep_the_client_librarys_error_as_their_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused here");
        let e = Error::from(redis::RedisError::from(io));
        assert_eq!(e.kind(), ErrorKind::Connection);
        let source = std::error::Error::source(&e).expect("a source");
        assert!(source.to_string().contains("refused here"), "{source}");
        let e = Error::from(redis::make_extension_error(
            "WRONGTYPE".into(),
            Some("detail".into()),
        ));
        assert!(std::error::Error::source(&e).is_some());
    }
}
