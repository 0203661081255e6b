//! The servers the shared scenario suite runs on, and the macro that expands a scenario into one
//! test per server.
//!
//! ```ignore
//! scenario! {
//!     #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
//!     async fn grants_once() {
//!         let srv = server(); // a server of the variant being run
//!         // ...
//!     }
//! }
//! ```
//!
//! expands to a module `grants_once` with one test per variant (`grants_once::redis`,
//! `grants_once::valkey`), each running the same body with [`server`](super::server) and
//! [`builder`](super::builder) starting that variant. Filter with `cargo test valkey` or
//! `cargo test grants_once`. A missing server binary fails the test with a message saying how to
//! install it: never skipped in silence.

use baton::testing::Flavor;

tokio::task_local! {
    static CURRENT: Flavor;
}

/// The variant the running scenario is on (Redis outside a scenario).
pub fn current() -> Flavor {
    CURRENT.try_with(|f| *f).unwrap_or_default()
}

/// Runs `body` with [`current`] returning `flavor`.
pub async fn on<F: std::future::Future>(flavor: Flavor, body: F) -> F::Output {
    CURRENT.scope(flavor, body).await
}

/// One test per server variant for each scenario (see the module docs).
#[macro_export]
macro_rules! scenario {
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

            #[$test]
            async fn redis() {
                $crate::common::topology::on(baton::testing::Flavor::Redis, body()).await
            }

            #[$test]
            async fn valkey() {
                $crate::common::topology::on(baton::testing::Flavor::Valkey, body()).await
            }
        }
    )*};
}
