//! The deployments the shared scenario suite runs on, and the macro that expands a scenario into
//! one test per deployment.
//!
//! ```ignore
//! scenario! {
//!     #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//!     async fn grants_once() {
//!         let srv = server(); // a deployment of the topology being run
//!         // ...
//!     }
//! }
//!
//! // Kills THE server process: only on the single-server topologies.
//! scenario! {
//!     single:
//!     #[tokio::test]
//!     async fn survives_a_restart() { /* ... */ }
//! }
//! ```
//!
//! The first form expands to a module `grants_once` with one test per topology
//! (`grants_once::redis`, `grants_once::valkey`, and with the `cluster` / `sentinel` features
//! `grants_once::cluster` and `grants_once::sentinel`), each running the same body with
//! [`server`](super::server) and [`builder`](super::builder) starting that topology. The
//! `postgres:` form adds `::postgres` (feature `postgres`) to those four: for scenarios of a
//! primitive that also runs on PostgreSQL, written against what every backend offers (the
//! client's API, and [`stored`](super::stored) for what was written). The
//! `single:` form only expands to `::redis` and `::valkey`: for scenarios that inherently need
//! one server process (they kill, pause or restart it, read its PID, or count its commands);
//! say why above each one. Filter with `cargo test valkey`, `cargo test ::cluster` or
//! `cargo test grants_once`. A missing server binary fails the test with a message saying how
//! to install it: never skipped in silence.

use baton::testing::Flavor;

/// Where a scenario runs: a single Redis 7 or Valkey server, a six-node Redis Cluster, or a
/// Sentinel-managed Redis primary (the last two built from the Redis binary).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Topology {
    #[default]
    Redis,
    Valkey,
    Cluster,
    Sentinel,
    /// PostgreSQL (feature `postgres`): a database of its own per test on the binary's shared
    /// server (`PgServer::shared`).
    Postgres,
}

impl Topology {
    /// The server binary the topology runs.
    pub fn flavor(self) -> Flavor {
        match self {
            Topology::Valkey => Flavor::Valkey,
            Topology::Redis | Topology::Cluster | Topology::Sentinel | Topology::Postgres => {
                Flavor::Redis
            }
        }
    }

    /// Whether it is one server process.
    pub fn is_single(self) -> bool {
        matches!(self, Topology::Redis | Topology::Valkey)
    }

    pub fn name(self) -> &'static str {
        match self {
            Topology::Redis => "redis",
            Topology::Valkey => "valkey",
            Topology::Cluster => "a Redis Cluster",
            Topology::Sentinel => "a Sentinel set",
            Topology::Postgres => "PostgreSQL",
        }
    }
}

tokio::task_local! {
    static CURRENT: Topology;
}

/// The topology the running scenario is on (Redis outside a scenario).
pub fn current() -> Topology {
    CURRENT.try_with(|t| *t).unwrap_or_default()
}

/// Runs `body` with [`current`] returning `topology`.
pub async fn on<F: std::future::Future>(topology: Topology, body: F) -> F::Output {
    CURRENT.scope(topology, body).await
}

/// One test per topology for each scenario (see the module docs).
#[macro_export]
macro_rules! scenario {
    (postgres: $(
        $(#[doc = $doc:literal])*
        #[$test:meta]
        async fn $name:ident() $body:block
    )*) => {$(
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body() $body

            $crate::scenario!(@arm $test, redis, Redis);
            $crate::scenario!(@arm $test, valkey, Valkey);
            #[cfg(feature = "cluster")]
            $crate::scenario!(@arm $test, cluster, Cluster);
            #[cfg(feature = "sentinel")]
            $crate::scenario!(@arm $test, sentinel, Sentinel);
            #[cfg(feature = "postgres")]
            $crate::scenario!(@arm $test, postgres, Postgres);
        }
    )*};
    (single: $(
        $(#[doc = $doc:literal])*
        #[$test:meta]
        async fn $name:ident() $body:block
    )*) => {$(
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body() $body

            $crate::scenario!(@arm $test, redis, Redis);
            $crate::scenario!(@arm $test, valkey, Valkey);
        }
    )*};
    (@arm $test:meta, $arm:ident, $variant:ident) => {
        #[$test]
        async fn $arm() {
            $crate::common::topology::on($crate::common::topology::Topology::$variant, body())
                .await
        }
    };
    ($(
        $(#[doc = $doc:literal])*
        #[$test:meta]
        async fn $name:ident() $body:block
    )*) => {$(
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body() $body

            $crate::scenario!(@arm $test, redis, Redis);
            $crate::scenario!(@arm $test, valkey, Valkey);
            #[cfg(feature = "cluster")]
            $crate::scenario!(@arm $test, cluster, Cluster);
            #[cfg(feature = "sentinel")]
            $crate::scenario!(@arm $test, sentinel, Sentinel);
        }
    )*};
}
