//! Test certificates made with `openssl`: a private CA, a server and a client certificate it
//! signed, and a second CA nobody uses, so that TLS tests of both backends (a TLS-only
//! [`RedisServer`](super::RedisServer), [`PgServer::enable_tls`](super::PgServer::enable_tls))
//! can check a good chain, client authentication, a name mismatch and an unknown issuer.
//!
//! The `openssl` command rather than a certificate crate: it is on every machine that runs the
//! servers anyway, and the library does not need to depend on a certificate generator for it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Name of the directory of a server's certificates, inside its data directory.
const TLS_DIR: &str = "tls";

/// The PEM files of a TLS server started with [`RedisServerBuilder::tls`](super::RedisServerBuilder::tls), all inside its data
/// directory (removed with the server).
///
/// Private keys are files the test reads itself; `Debug` prints only the paths.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsFiles {
    /// The private CA that signed the server and client certificates.
    pub ca_cert: PathBuf,
    /// The server certificate (`CN=localhost`, SAN `DNS:localhost`, `IP:127.0.0.1`).
    pub server_cert: PathBuf,
    /// The server's private key.
    pub server_key: PathBuf,
    /// A client certificate signed by [`ca_cert`](Self::ca_cert) (`extendedKeyUsage=clientAuth`).
    pub client_cert: PathBuf,
    /// The client certificate's private key.
    pub client_key: PathBuf,
    /// A second, self-signed CA that signed nothing the server uses: trusting it instead of
    /// [`ca_cert`](Self::ca_cert) must fail with an unknown issuer.
    pub untrusted_ca_cert: PathBuf,
}

/// Makes the certificates of a TLS server with `openssl` in `<dir>/tls` (see
/// [`RedisServerBuilder::tls`](super::RedisServerBuilder::tls)). EC P-256 keys: quick to make, and both redis and rustls take
/// them. Valid for 2 days, which outlives any test.
pub(super) fn make_tls_files(dir: &Path) -> io::Result<TlsFiles> {
    let tls = dir.join(TLS_DIR);
    fs::create_dir(&tls).map_err(|err| {
        io::Error::new(
            err.kind(),
            format!("cannot create {}: {err}", tls.display()),
        )
    })?;
    let files = TlsFiles {
        ca_cert: tls.join("ca.crt"),
        server_cert: tls.join("server.crt"),
        server_key: tls.join("server.key"),
        client_cert: tls.join("client.crt"),
        client_key: tls.join("client.key"),
        untrusted_ca_cert: tls.join("untrusted-ca.crt"),
    };
    fs::write(
        tls.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )?;
    fs::write(tls.join("client.ext"), "extendedKeyUsage=clientAuth\n")?;
    const KEY: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    for (name, cn) in [
        ("ca", "baton-test-ca"),
        ("untrusted-ca", "baton-untrusted-ca"),
    ] {
        let subj = format!("/CN={cn}");
        openssl(
            &tls,
            &["req", "-x509"],
            &KEY,
            &[
                "-nodes",
                "-days",
                "2",
                "-subj",
                &subj,
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
            ],
        )?;
    }
    for (name, cn) in [("server", "localhost"), ("client", "baton-test-client")] {
        let subj = format!("/CN={cn}");
        openssl(
            &tls,
            &["req"],
            &KEY,
            &[
                "-nodes",
                "-subj",
                &subj,
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        )?;
        openssl(
            &tls,
            &["x509", "-req"],
            &[],
            &[
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{name}.ext"),
                "-out",
                &format!("{name}.crt"),
            ],
        )?;
    }
    Ok(files)
}

/// Runs `openssl` in `dir` with the argument groups concatenated; a clear error when it is
/// missing or fails (its stderr quoted).
fn openssl(dir: &Path, a: &[&str], b: &[&str], c: &[&str]) -> io::Result<()> {
    let out = Command::new("openssl")
        .args(a)
        .args(b)
        .args(c)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| {
            io::Error::new(
                err.kind(),
                format!(
                    "cannot run `openssl` to make the test certificates ({err}); install it \
                     (e.g. `apt-get install openssl`)"
                ),
            )
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "`openssl {}` failed ({}): {}",
            a.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}
