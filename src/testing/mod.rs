//! Private servers for tests, examples, benchmarks and fault injection: Redis and Valkey alone,
//! as a Cluster or behind Sentinels, and PostgreSQL, each a real child process on a free
//! loopback port with its own data directory, torn down when dropped.
//!
//! One file per concern:
//!
//! - `binaries.rs`: [`Flavor`] (Redis or Valkey) and where its server binary is found
//!   (`$REDIS_SERVER_BIN`/`$VALKEY_SERVER_BIN`, `PATH`, Valkey's virtual environment).
//! - `redis.rs`: [`RedisServer`] (and its [`RedisServerBuilder`], [`Persistence`]),
//!   one `redis-server` or `valkey-server` with the faults a coordination layer must survive:
//!   [`RedisServer::kill`] (a crash), [`RedisServer::restart`] (with or without its data),
//!   [`RedisServer::pause`] (up but silent, as during a long fork or a partition). Every Redis
//!   fixture below is made of these. Also [`url_from_env_or_start`] for the examples.
//! - [`cluster`]: [`RedisCluster`], six servers joined into three primaries with a replica each.
//! - [`sentinel`]: [`RedisSentinel`], a primary, two replicas and three Sentinels.
//! - `postgres.rs`: [`PgServer`], `initdb` and `postgres` in a temporary directory, with a
//!   least-privilege worker role ([`PG_WORKER_ROLE`]) and one shared server per test binary.
//! - `proxy.rs`: [`TcpRelay`], a loopback relay in front of a server that a test cuts and
//!   restores (a network blip between one client and the server).
//! - `tls.rs`: [`TlsFiles`], the certificates `openssl` makes for a TLS Redis server or
//!   [`PgServer::enable_tls`].
//! - `process.rs`: what every server shares about living and dying: one spawner thread, so
//!   that no server outlives the test process however it ends (`PR_SET_PDEATHSIG` on Linux),
//!   signals that never reach a recycled PID, temporary directories, free ports, log excerpts.
//!
//! The API is synchronous and uses only `std`, `libc` and the `redis` crate's synchronous
//! client, so it can be used from plain `#[test]`s as well as from inside a tokio runtime: its
//! blocking waits are short (milliseconds, at most a few seconds while a server boots).
//! Unix-only: it sends signals with `libc`.
//!
//! # Example
//!
//! ```no_run
//! use baton::testing::{Persistence, RedisServer};
//!
//! # fn main() -> std::io::Result<()> {
//! let mut server = RedisServer::builder()
//!     .persistence(Persistence::Durable)
//!     .start()?;
//! server.kill(); // crash it
//! server.restart()?; // same port, the append-only file is replayed
//! # Ok(())
//! # }
//! ```

mod binaries;
pub mod cluster;
mod postgres;
#[cfg(test)]
#[cfg(feature = "postgres")]
mod postgres_pool_tests;
mod process;
mod proxy;
mod redis;
pub mod sentinel;
#[cfg(test)]
#[cfg(feature = "sentinel")]
mod sentinel_resolve_tests;
mod tls;

pub use binaries::Flavor;
pub use cluster::{RedisCluster, RedisClusterBuilder};
#[cfg(feature = "postgres")]
pub use internals::{TEST_CLEANUP_EVERY_ENV, TEST_FENCE_RETENTION_ENV};
pub use postgres::{PgServer, PG_WORKER_PASSWORD, PG_WORKER_ROLE};
pub use proxy::TcpRelay;
pub use redis::{url_from_env_or_start, Persistence, RedisServer, RedisServerBuilder};
pub use sentinel::{RedisSentinel, RedisSentinelBuilder};
pub use tls::TlsFiles;

/// The library's own items the fixtures use, imported here only: the fixtures sit below the
/// client and reach a few internals (the ACL rules a test user gets, the hash slot of a key, the
/// PostgreSQL backend's test knobs, and for the Sentinel unit tests the resolver itself), and a
/// move inside the library is then fixed in this one place.
mod internals {
    pub(crate) use crate::backend::redis::acl::setuser_args;
    pub use crate::util::slot::{slot, SLOTS};

    #[cfg(feature = "postgres")]
    pub use crate::backend::postgres::{TEST_CLEANUP_EVERY_ENV, TEST_FENCE_RETENTION_ENV};

    #[cfg(all(test, feature = "postgres"))]
    pub(crate) use crate::backend::postgres::PgTransport;
    #[cfg(all(test, feature = "postgres"))]
    pub(crate) use crate::util::{settings::ConnSettings, tls::TlsSettings};

    #[cfg(all(test, feature = "sentinel"))]
    pub(crate) use crate::backend::redis::{
        sentinel::{is_primary, resolve_primary, watch_switch_master, WatchSettings},
        topology_url::{parse, DataTemplate, Target},
    };
}
