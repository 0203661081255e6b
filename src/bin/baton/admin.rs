//! `baton fail`, `baton reset` and `baton migrate`: the operator's tools. Each is one library
//! call behind a confirmation; they are apart from `status`/`watch`, which only read.

use baton::{Client, FailoverConfig};

use super::exit::{fail_with, EX_USAGE};
use super::out;

pub(crate) async fn fail(client: &Client, job: FailoverConfig, reason: &str, yes: bool) -> u8 {
    let key = job.key().to_string();
    match client.failover().job_status(job.clone()).await {
        Ok(s) if s.is_live() && !yes => {
            say!(
                "baton: {key} is live ({}); pass --yes to release its attempt",
                s.state
            );
            return EX_USAGE;
        }
        Ok(_) => {}
        Err(e) => return fail_with(&e),
    }
    match client.failover().fail_attempt(job, reason).await {
        Ok(Some(n)) => {
            outln!("released attempt {n} of {key}");
            0
        }
        Ok(None) => {
            outln!("{key} has no live attempt; nothing to release");
            0
        }
        Err(e) => fail_with(&e),
    }
}

pub(crate) async fn reset(client: &Client, job: FailoverConfig, yes: bool) -> u8 {
    let key = job.key().to_string();
    match client.failover().job_status(job.clone()).await {
        Ok(s) if s.is_live() && !yes => {
            say!("baton: {key} is live ({}); pass --yes to reset it", s.state);
            return EX_USAGE;
        }
        Ok(_) => {}
        Err(e) => return fail_with(&e),
    }
    match client.failover().reset_job(job).await {
        Ok(()) => {
            outln!("reset {key}");
            0
        }
        Err(e) => fail_with(&e),
    }
}

/// `baton migrate` on PostgreSQL (a Redis URL never gets here: there is nothing to make).
pub(crate) async fn migrate(client: &Client) -> u8 {
    match client.migrate().await {
        Ok(()) => {
            say!("baton: baton_jobs, baton_locks and baton_advisory_fence are in place");
            0
        }
        Err(e) => fail_with(&e),
    }
}
