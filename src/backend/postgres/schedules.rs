//! The schedule's record on PostgreSQL (feature `postgres`).

use super::PgTransport;
use crate::error::Error;
use crate::util::schedule_record::{RawPause, RawRecord, RecordWrite, WireEntry};

fn todo() -> Error {
    Error::Unsupported {
        what: "the schedule's record",
        backend: "PostgreSQL",
        why: "not built yet",
    }
}

pub(crate) async fn write(_t: &PgTransport, _w: &RecordWrite) -> Result<Option<i64>, Error> {
    Err(todo())
}

pub(crate) async fn records(
    _t: &PgTransport,
    _key: &str,
) -> Result<(Vec<RawRecord>, Option<RawPause>, i64), Error> {
    Err(todo())
}

pub(crate) async fn history(
    _t: &PgTransport,
    _key: &str,
    _digest: &str,
    _limit: usize,
) -> Result<Vec<WireEntry>, Error> {
    Err(todo())
}

pub(crate) async fn pause(
    _t: &PgTransport,
    _key: &str,
    _until_ms: Option<i64>,
    _by: &str,
    _note: Option<&str>,
) -> Result<(bool, i64), Error> {
    Err(todo())
}

pub(crate) async fn resume(_t: &PgTransport, _key: &str) -> Result<bool, Error> {
    Err(todo())
}

pub(crate) async fn read_pause(
    _t: &PgTransport,
    _key: &str,
) -> Result<(Option<RawPause>, i64), Error> {
    Err(todo())
}

pub(crate) async fn list(_t: &PgTransport, _prefix: &str) -> Result<Vec<String>, Error> {
    Err(todo())
}
