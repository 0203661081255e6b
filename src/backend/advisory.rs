//! The advisory locks' seam. Advisory locks are a PostgreSQL feature (`pg_advisory_lock` and
//! its kin), not a shape of storage another backend could hold, so this seam names the
//! PostgreSQL session they live on instead of abstracting it: the primitive holds a dedicated
//! session or a pooled connection, runs the statements of `postgres::advisory` on it, and hands
//! the user a transaction of the driver's. On any other backend the primitive is refused before
//! it gets here (`Backend::postgres`).

pub(crate) use super::postgres::advisory::{self as sql, Beat, Call, CREATE_FENCE};
pub(crate) use super::postgres::{Dedicated, PgTransport, Pooled};
/// The PostgreSQL driver, for the types the advisory lock's API hands out (a closure's
/// `Transaction`, a session guard's `Client`).
pub use tokio_postgres;
pub(crate) use tokio_postgres::{Client, Transaction};
