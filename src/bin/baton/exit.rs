//! Exit statuses (sysexits where one fits) and the mapping of library errors to them. One
//! table for every command, so the same cause exits the same way whatever the command; the
//! help texts (help.rs) document them.

use std::os::unix::process::ExitStatusExt;

use baton::{ConfigError, ErrorKind};

use super::out;
use super::text;

pub(crate) const EX_USAGE: u8 = 64;
pub(crate) const EX_DATAERR: u8 = 65;
pub(crate) const EX_UNAVAILABLE: u8 = 69;
pub(crate) const EX_LOST: u8 = 74;
/// Refused credentials or privileges (sysexits' EX_NOPERM).
pub(crate) const EX_NOPERM: u8 = 77;
/// Configuration the server rejects (sysexits' EX_CONFIG).
pub(crate) const EX_CONFIG: u8 = 78;
pub(crate) const EX_EXHAUSTED: u8 = 75;
/// `baton lock`: --wait ran out (EX_TEMPFAIL: try again later).
pub(crate) const EX_TEMPFAIL: u8 = 75;

/// Prints a usage error (baton's own words) and returns its status.
pub(crate) fn usage(e: impl std::fmt::Display) -> u8 {
    say!("baton: {e}");
    EX_USAGE
}

/// Prints a setting the library refused, named by its flag (text.rs), and returns 64.
pub(crate) fn usage_config(e: &ConfigError) -> u8 {
    usage(text::config_message(e))
}

/// Maps a library error to an exit status and prints it (in the CLI's words, text.rs).
pub(crate) fn fail_with(e: &baton::Error) -> u8 {
    say!("baton: {}", text::error_message(e));
    exit_for(e.kind())
}

/// The exit status of a library error of this kind (the tables of help.rs).
pub(crate) fn exit_for(kind: ErrorKind) -> u8 {
    match kind {
        // A primitive the URL's backend does not have (the fair lock on PostgreSQL...): the
        // command line asks for something impossible.
        ErrorKind::Config | ErrorKind::Unsupported => EX_USAGE,
        ErrorKind::CorruptState | ErrorKind::WrongType | ErrorKind::StateLost => EX_DATAERR,
        ErrorKind::LeaseLost | ErrorKind::OutcomeUnknown => EX_LOST,
        // No retry helps: a supervisor must not restart baton in a loop on these.
        ErrorKind::Permission => EX_NOPERM,
        // The URL names a server that is not Redis: the address must change, not the time.
        ErrorKind::Misconfigured | ErrorKind::NotRedis => EX_CONFIG,
        _ => EX_UNAVAILABLE,
    }
}

/// 128 + n, the shell's status for signal n.
pub(crate) fn signal_status(sig: libc::c_int) -> u8 {
    u8::try_from(128 + sig).unwrap_or(255)
}

/// The shell convention: the exit code, or 128 + the signal that ended the process.
pub(crate) fn exit_code(status: &std::process::ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c).unwrap_or(1),
        (None, Some(sig)) => signal_status(sig),
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::super::help::{
        EXIT_STATUSES, JOB_ADMIN_HELP, LEADER_EXIT_STATUSES, LOCK_EXIT_STATUSES, MIGRATE_HELP,
        PAUSE_HELP, SCHEDULE_HELP, UNLOCK_HELP,
    };
    use super::*;

    #[test]
    fn an_unknown_outcome_exits_74_and_the_help_says_the_job_may_or_may_not_be_done() {
        assert_eq!(exit_for(ErrorKind::OutcomeUnknown), EX_LOST);
        assert_eq!(exit_for(ErrorKind::LeaseLost), EX_LOST);
        assert!(EXIT_STATUSES.contains("may or may not be DONE"));
    }

    #[test]
    fn refusals_no_retry_fixes_have_their_own_statuses_in_every_table() {
        assert_eq!(exit_for(ErrorKind::Permission), EX_NOPERM);
        assert_eq!(exit_for(ErrorKind::Misconfigured), EX_CONFIG);
        assert_eq!(exit_for(ErrorKind::NotRedis), EX_CONFIG);
        assert_eq!(exit_for(ErrorKind::Connection), EX_UNAVAILABLE);
        assert_eq!(exit_for(ErrorKind::Busy), EX_UNAVAILABLE);
        for table in [
            EXIT_STATUSES,
            LOCK_EXIT_STATUSES,
            LEADER_EXIT_STATUSES,
            MIGRATE_HELP,
            SCHEDULE_HELP,
            UNLOCK_HELP,
            JOB_ADMIN_HELP,
            PAUSE_HELP,
        ] {
            assert!(table.contains("77") && table.contains("78"), "{table}");
        }
    }
}
