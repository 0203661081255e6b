//! TLS (`rediss://`, PostgreSQL's `sslmode=require`) through rustls (feature `tls`), shared by
//! both backends: the PEM material a [`ClientBuilder`] was
//! given, its validation before any network I/O, the crypto provider, and the classification of
//! handshake failures as [`ErrorKind::Tls`](crate::ErrorKind::Tls).
//!
//! [`ClientBuilder`]: crate::ClientBuilder

use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::ConfigError;

/// PEM bytes and where they came from. `Debug` prints the origin and the size, never the bytes
/// (a private key must not reach a log).
#[derive(Clone)]
pub(crate) struct Pem {
    bytes: Vec<u8>,
    path: Option<PathBuf>,
}

impl Pem {
    pub(crate) fn bytes(bytes: Vec<u8>) -> Pem {
        Pem { bytes, path: None }
    }

    /// Reads a PEM file now, so a missing file is reported by the builder call that named it.
    pub(crate) fn file(field: &'static str, path: &Path) -> Result<Pem, ConfigError> {
        // The error names the path and the OS reason; the content is never echoed.
        let bytes = std::fs::read(path).map_err(|e| {
            ConfigError::invalid(field, format!("cannot read {}: {e}", path.display()))
        })?;
        Ok(Pem {
            bytes,
            path: Some(path.to_path_buf()),
        })
    }
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.path {
            Some(p) => write!(f, "<pem {} bytes from {}>", self.bytes.len(), p.display()),
            None => write!(f, "<pem {} bytes>", self.bytes.len()),
        }
    }
}

/// What a builder was given for TLS.
#[derive(Clone, Debug, Default)]
pub(crate) struct TlsSettings {
    /// The CA(s) to trust instead of the system's.
    pub root_ca: Option<Pem>,
    /// A client certificate (chain) and its private key, for servers with
    /// `tls-auth-clients yes`.
    pub client: Option<(Pem, Pem)>,
}

/// PEM material that [`TlsSettings::certificates`] checked: the private CA, and the client
/// certificate with its key.
pub(crate) struct CheckedPem {
    pub(crate) root_cert: Option<Vec<u8>>,
    /// (certificate chain, private key), both PEM.
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsSettings {
    /// Whether anything was set (TLS options with a `redis://` URL are a configuration error).
    pub(crate) fn is_set(&self) -> bool {
        self.root_ca.is_some() || self.client.is_some()
    }

    /// Checks the PEM material (parses, the key matches the certificate) and returns it as
    /// bytes (the Redis backend hands them to redis-rs). Messages never quote PEM content.
    pub(crate) fn certificates(&self) -> Result<CheckedPem, ConfigError> {
        let root_cert = match &self.root_ca {
            None => None,
            Some(pem) => {
                root_store(pem)?;
                Some(pem.bytes.clone())
            }
        };
        let client_tls = match &self.client {
            None => None,
            Some((cert, key)) => {
                let chain = parse_certs("tls_client_cert", cert)?;
                let der = parse_key(key)?;
                // Loads the key with the provider baton installs, and compares its public half
                // with the certificate's: a mismatch would otherwise surface only as a failed
                // handshake.
                rustls::sign::CertifiedKey::from_der(
                    chain,
                    der,
                    &rustls::crypto::ring::default_provider(),
                )
                .map_err(|e| {
                    ConfigError::invalid(
                        "tls_client_key",
                        format!("{key:?} does not fit the client certificate {cert:?} ({e})"),
                    )
                })?;
                Some((cert.bytes.clone(), key.bytes.clone()))
            }
        };
        Ok(CheckedPem {
            client: client_tls,
            root_cert,
        })
    }
}

impl TlsSettings {
    /// A rustls client configuration (for PostgreSQL): trusts `root_ca` if set, else the
    /// system's CAs (rustls-native-certs, as redis-rs does for `rediss://`), and presents the
    /// client certificate if set. The server's certificate is always verified, its name
    /// included. Checked as [`certificates`](Self::certificates) checks.
    ///
    /// # Errors
    /// A [`ConfigError`] naming `tls_root_ca`, `tls_client_cert` or `tls_client_key`, or `url`
    /// when no CA is given and the system has none.
    #[cfg(feature = "postgres")]
    pub(crate) fn rustls_config(&self) -> Result<rustls::ClientConfig, ConfigError> {
        self.certificates()?;
        install_crypto_provider();
        let roots = match &self.root_ca {
            Some(pem) => root_store(pem)?,
            None => {
                let mut roots = rustls::RootCertStore::empty();
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(ConfigError::invalid(
                        "url",
                        "sslmode=require, but the system has no CA certificates to verify the \
                         server with (give one with tls_root_ca_pem/tls_root_ca_file)",
                    ));
                }
                roots
            }
        };
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        match &self.client {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let chain = parse_certs("tls_client_cert", cert)?;
                let der = parse_key(key)?;
                builder.with_client_auth_cert(chain, der).map_err(|e| {
                    ConfigError::invalid(
                        "tls_client_key",
                        format!("{key:?} does not fit the client certificate {cert:?} ({e})"),
                    )
                })
            }
        }
    }
}

/// The CA(s) in `pem` as a trust store.
fn root_store(pem: &Pem) -> Result<rustls::RootCertStore, ConfigError> {
    let mut store = rustls::RootCertStore::empty();
    for cert in parse_certs("tls_root_ca", pem)? {
        store.add(cert).map_err(|e| {
            ConfigError::invalid(
                "tls_root_ca",
                format!("{pem:?} holds a certificate that is not a usable CA ({e})"),
            )
        })?;
    }
    Ok(store)
}

fn parse_key(key: &Pem) -> Result<PrivateKeyDer<'static>, ConfigError> {
    PrivateKeyDer::from_pem_slice(&key.bytes).map_err(|_| {
        ConfigError::invalid(
            "tls_client_key",
            format!("{key:?} is not a PEM private key (PKCS#8, PKCS#1 or SEC1)"),
        )
    })
}

fn parse_certs(
    field: &'static str,
    pem: &Pem,
) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
    let certs = CertificateDer::pem_slice_iter(&pem.bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| ConfigError::invalid(field, format!("{pem:?} is not valid PEM")))?;
    if certs.is_empty() {
        return Err(ConfigError::invalid(
            field,
            format!("{pem:?} holds no `BEGIN CERTIFICATE` block"),
        ));
    }
    Ok(certs)
}

/// Makes ring rustls' process-wide crypto provider, once, before any TLS connect.
///
/// rustls 0.23 picks a provider by itself only when exactly one provider feature is enabled in
/// the whole dependency graph; otherwise building a TLS client panics ("Could not automatically
/// determine the process-level CryptoProvider"). Installing one explicitly makes a TLS connect
/// never panic. An `Err` from `install_default` only means the application installed one
/// already, which is then used.
pub(crate) fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The TLS failure behind a client library's error (`err`, e.g. a redis-rs error), if it is
/// one: what rustls reported.
///
/// redis-rs hands a failed handshake back as an I/O error (`kind() == Io`, `InvalidData`) whose
/// inner error is the `rustls::Error` (`InvalidCertificate(UnknownIssuer)`,
/// `InvalidCertificate(NotValidForNameContext { .. })`, `AlertReceived(CertificateRequired)`).
/// Its `source()` is the `Arc` it stores the I/O error in, so the chain is walked through `Arc`,
/// `io::Error::get_ref` and `source()`.
pub(crate) fn failure(err: &(dyn StdError + 'static)) -> Option<String> {
    let mut next: Option<&(dyn StdError + 'static)> = err.source();
    // A bound, not a loop forever on a strange self-referencing chain.
    for _ in 0..16 {
        let e = next?;
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(r.to_string());
        }
        if let Some(r) = e.downcast_ref::<rustls::pki_types::InvalidDnsNameError>() {
            return Some(format!("the host is not a valid TLS server name ({r})"));
        }
        next = if let Some(arc) = e.downcast_ref::<Arc<dyn StdError + Send + Sync>>() {
            let inner: &(dyn StdError + 'static) = arc.as_ref();
            Some(inner)
        } else if let Some(io) = e.downcast_ref::<std::io::Error>() {
            match io.get_ref() {
                Some(inner) => {
                    let inner: &(dyn StdError + 'static) = inner;
                    Some(inner)
                }
                None => io.source(),
            }
        } else {
            e.source()
        };
    }
    None
}
