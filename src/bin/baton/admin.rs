//! `baton fail`, `baton reset` and `baton migrate`: the operator's tools. Each is one library
//! call that names what it acts on (the attempt shown), so a grant made after the operator
//! looked is never touched; they are apart from `status`/`watch`, which only read.

use baton::{Client, Expected, FailAttempt, FailoverConfig, ResetJob};

use super::cli::{Cli, Command};
use super::exit::{fail_with, usage_config, EX_TEMPFAIL, EX_USAGE};
use super::out;
use super::Plan;

/// What an operator's command names (`--token`, `--holder`, `--attempt`, `--any`), and how to
/// print the command that names it when it names nothing.
pub(crate) struct Named {
    /// The grant meant; `None` when the command line names none (then it only describes).
    pub(crate) expected: Option<Expected>,
    /// `--yes` was given (alone it names nothing: said so in the refusal).
    pub(crate) yes: bool,
    /// `--permit`: the semaphore's slot named (`unlock` only).
    pub(crate) permit: Option<u32>,
    /// How the printed command starts: `baton`, with `--url` and `--prefix` when they were
    /// given.
    head: String,
    /// The URL given has credentials: the printed command reads it from `BATON_URL`.
    secret_url: bool,
}

impl Named {
    /// What the command line names, with `url`/`prefix` for the printed command (`--url` only
    /// when `url_given`: otherwise it came from the environment or the default, which the
    /// printed command uses too).
    pub(crate) fn new(
        expected: Option<Expected>,
        yes: bool,
        url: &str,
        url_given: bool,
        prefix: &str,
    ) -> Named {
        let mut head = String::from("baton");
        let mut secret_url = false;
        if url_given {
            // A URL with credentials is never printed; the command reads it from the
            // environment instead.
            if baton::client::redacted_url(url) == url {
                head.push_str(&format!(" --url {}", shell_word(url)));
            } else {
                head.push_str(" --url \"$BATON_URL\"");
                secret_url = true;
            }
        }
        if prefix != "baton:" {
            head.push_str(&format!(" --prefix {}", shell_word(prefix)));
        }
        Named {
            expected,
            yes,
            permit: None,
            head,
            secret_url,
        }
    }

    /// As [`Named::refuse`], for an entry with several grants: each command in `rests` names
    /// one of them, on a line of its own.
    pub(crate) fn refuse_each(&self, what: &str, rests: &[String]) -> u8 {
        say!("baton: {what}");
        if self.yes {
            say!("baton: --yes alone names nothing; name what you saw, one of:");
        } else {
            say!("baton: to act on exactly one of them, run one of:");
        }
        for rest in rests {
            say!("    {} {rest}", self.head);
        }
        if self.secret_url {
            say!("baton: (set BATON_URL to the URL first: its credentials are never printed)");
        }
        EX_USAGE
    }

    /// Prints the refusal of a command that names nothing: `what` is described, and the
    /// command to run is printed whole (`rest`: the subcommand and its flags), to copy.
    pub(crate) fn refuse(&self, what: &str, rest: &str) -> u8 {
        say!("baton: {what}");
        if self.yes {
            say!("baton: --yes alone names nothing; name what you saw:");
        } else {
            say!("baton: to act on exactly that, run:");
        }
        // On a line of its own, to copy whole.
        say!("    {} {rest}", self.head);
        if self.secret_url {
            say!("baton: (set BATON_URL to the URL first: its credentials are never printed)");
        }
        EX_USAGE
    }
}

/// The plan of `unlock`, `fail` and `reset`: the job (or lock) name checked, and what the
/// command line names.
pub(crate) fn plan(cli: &Cli) -> Result<Plan<'_>, u8> {
    let job = |key: &str| {
        FailoverConfig::builder(key)
            .prefix(cli.prefix.clone())
            .build()
            .map_err(|e| usage_config(&e))
    };
    let named = |expected, yes| Named::new(expected, yes, &cli.url, cli.url_given, &cli.prefix);
    Ok(match &cli.command {
        Command::Unlock {
            key,
            kind,
            token,
            holder,
            permit,
            any,
            yes,
        } => Plan::Unlock(job(key)?, kind.map(|k| k.kind()), {
            let mut n = named(
                super::unlock::expected(*token, holder.as_deref(), *any),
                *yes,
            );
            n.permit = *permit;
            n
        }),
        Command::Fail {
            key,
            reason,
            attempt,
            any,
            yes,
        } => Plan::Fail(
            job(key)?,
            reason,
            named(self::attempt(*attempt, *any), *yes),
        ),
        Command::Reset {
            key,
            attempt,
            any,
            yes,
        } => Plan::Reset(job(key)?, named(self::attempt(*attempt, *any), *yes)),
        // main.rs sends only these three here.
        _ => return Err(EX_USAGE),
    })
}

/// What `--attempt` and `--any` name (clap lets at most one through).
pub(crate) fn attempt(attempt: Option<u64>, any: bool) -> Option<Expected> {
    match (attempt, any) {
        (Some(n), _) => Some(Expected::Attempt(n)),
        (None, true) => Some(Expected::Any),
        (None, false) => None,
    }
}

/// `s` as one shell word: as is when it is plain, single-quoted otherwise.
pub(crate) fn shell_word(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric()
                || matches!(c, '-' | '_' | '.' | '/' | ':' | '@' | ',' | '=' | '+')
        });
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

pub(crate) async fn fail(client: &Client, job: FailoverConfig, reason: &str, named: Named) -> u8 {
    let key = job.key().to_string();
    let Some(expected) = &named.expected else {
        // Nothing named: describe what is live, and print the command that names it.
        return match client.failover().job_status(job.clone()).await {
            Ok(s) if s.is_live() => {
                let attempt = match &s.state {
                    baton::JobState::Attempt { number, .. } => *number,
                    _ => 0,
                };
                let reason_arg = if reason == DEFAULT_REASON {
                    String::new()
                } else {
                    format!(" --reason {}", shell_word(reason))
                };
                named.refuse(
                    &format!(
                        "{key} is live ({}); name its attempt to release it",
                        s.state
                    ),
                    &format!(
                        "fail --key {} --attempt {attempt}{reason_arg}",
                        shell_word(&key)
                    ),
                )
            }
            Ok(_) => {
                doneln!("{key} has no live attempt; nothing to release");
                0
            }
            Err(e) => fail_with(&e),
        };
    };
    match client.failover().fail_attempt(job, expected, reason).await {
        Ok(FailAttempt::Released(n)) => {
            doneln!("released attempt {n} of {key}");
            0
        }
        Ok(FailAttempt::Another(n)) => {
            say!("baton: {key} is now at attempt {n}, not the {expected} named; nothing done");
            EX_TEMPFAIL
        }
        Ok(_) => {
            doneln!("{key} has no live attempt; nothing to release");
            0
        }
        Err(e) => fail_with(&e),
    }
}

/// `--reason`'s default (cli.rs): left out of the printed command.
const DEFAULT_REASON: &str = "released by an operator";

pub(crate) async fn reset(client: &Client, job: FailoverConfig, named: Named) -> u8 {
    let key = job.key().to_string();
    match client
        .failover()
        .reset_job(job, named.expected.as_ref())
        .await
    {
        Ok(ResetJob::Live(n)) => match &named.expected {
            None => named.refuse(
                &format!("{key} is live (attempt {n}); name its attempt to reset it"),
                &format!("reset --key {} --attempt {n}", shell_word(&key)),
            ),
            Some(expected) => {
                say!("baton: {key} is now at attempt {n}, not the {expected} named; nothing done");
                EX_TEMPFAIL
            }
        },
        Ok(_) => {
            doneln!("reset {key}");
            0
        }
        Err(e) => fail_with(&e),
    }
}

/// `baton migrate` on PostgreSQL (a Redis URL never gets here: there is nothing to make).
pub(crate) async fn migrate(client: &Client) -> u8 {
    match client.migrate().await {
        Ok(()) => {
            tell!(
                "baton: baton_jobs, baton_locks, baton_schedules, baton_schedule_history, \
                 baton_schedule_control and baton_advisory_fence are in place"
            );
            0
        }
        Err(e) => fail_with(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_commands_quote_what_a_shell_would_split_and_never_print_credentials() {
        assert_eq!(shell_word("report-1"), "report-1");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("it's"), r"'it'\''s'");
        let n = Named::new(None, false, "redis://127.0.0.1:7000/", true, "app:");
        assert_eq!(n.head, "baton --url redis://127.0.0.1:7000/ --prefix app:");
        let n = Named::new(None, false, "redis://u:secret@127.0.0.1/", true, "baton:");
        assert_eq!(n.head, "baton --url \"$BATON_URL\"");
        assert!(n.secret_url);
        let n = Named::new(None, false, "redis://u:secret@127.0.0.1/", false, "baton:");
        assert_eq!(n.head, "baton");
    }
}
