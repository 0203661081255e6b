//! Where `baton run`'s events go: human lines on stderr (only what matters without
//! --verbose), JSON lines on stderr (--json) or appended to a file (--events). Apart from the
//! commands because every line baton writes about a job goes through it. Every line goes
//! through a queue that never blocks (out.rs): no output can stall the watchdog.

use baton::Event;

use super::out;
use super::out::FileOut;

use super::text::{attempts, human_ms, reword};

/// Where events go.
pub(crate) struct Sink {
    pub(crate) json: bool,
    pub(crate) file: Option<FileOut>,
    pub(crate) verbose: u8,
    /// The key the user gave (`--key`).
    pub(crate) key: String,
    /// The occurrence of a schedule these events are about, if any.
    pub(crate) occurrence: Option<Bound>,
}

/// The occurrence a sink's events are about: its id (the tick, `BATON_OCCURRENCE`) and the
/// key of the job that runs it (`KEY@DIGEST@TICK`). Every JSON line carries both; human lines
/// name the tick (`baton schedule` runs several occurrences at once).
#[derive(Clone)]
pub(crate) struct Bound {
    pub(crate) id: String,
    pub(crate) job: String,
}

impl Sink {
    pub(crate) fn emit(&mut self, event: &Event) {
        if self.json || self.file.is_some() {
            let value = serde_json::to_value(event).unwrap_or_default();
            self.write_json(value);
        }
        if self.json {
            return;
        }
        // Errors that end something always show; a retry in progress and the server's
        // return are news an operator wants, but not under --quiet (cron mails every line).
        let error = matches!(
            event,
            Event::Error {
                retryable: false,
                ..
            } | Event::LeaseLost { .. }
                | Event::DeadlinePassed { .. }
        );
        let news = matches!(
            event,
            Event::Error {
                retryable: true,
                ..
            } | Event::Reachable { .. }
        );
        if error || (news && !out::quiet()) || self.verbose >= 1 {
            say!("baton: {}: {}", self.label(), describe(event));
        }
    }

    /// A line the operator sees unless --quiet (which tick a run bound to, how an occurrence
    /// ended when it went well): `value` (with the key and occurrence added) as a JSON line on
    /// stderr with --json and in the --events file, `text` on stderr otherwise.
    pub(crate) fn say(&mut self, value: serde_json::Value, text: &str) {
        self.write_json(value);
        if !self.json {
            tell!("baton: {}: {text}", self.key);
        }
    }

    /// [`Sink::say`] for an error (an occurrence that failed, an exhausted job): shown under
    /// --quiet too.
    pub(crate) fn say_error(&mut self, value: serde_json::Value, text: &str) {
        self.write_json(value);
        if !self.json {
            say!("baton: {}: {text}", self.key);
        }
    }

    /// `event` as a JSON line only (stderr with --json, the events file): for an event whose
    /// human line the command writes itself.
    pub(crate) fn emit_json(&mut self, event: &Event) {
        if self.json || self.file.is_some() {
            let value = serde_json::to_value(event).unwrap_or_default();
            self.write_json(value);
        }
    }

    /// `value` with `key` (and the occurrence's `occurrence` and `job`) added, to stderr
    /// (--json) and the events file.
    fn write_json(&mut self, mut value: serde_json::Value) {
        if !self.json && self.file.is_none() {
            return;
        }
        if let Some(map) = value.as_object_mut() {
            map.insert("key".into(), self.key.clone().into());
            if let Some(o) = &self.occurrence {
                map.insert("occurrence".into(), o.id.clone().into());
                map.insert("job".into(), o.job.clone().into());
            }
        }
        let line = value.to_string();
        if self.json {
            super::out::err(&line);
        }
        if let Some(f) = &self.file {
            f.line(&line);
        }
    }

    /// The same outputs, for the job of occurrence `bound` (one sink per occurrence `baton
    /// schedule` runs at once; the events file is shared, each line written whole).
    pub(crate) fn for_occurrence(&self, bound: Bound) -> Sink {
        Sink {
            json: self.json,
            file: self.file.clone(),
            verbose: self.verbose,
            key: self.key.clone(),
            occurrence: Some(bound),
        }
    }

    /// How human lines name what they are about: the key, and the occurrence's tick.
    fn label(&self) -> String {
        match &self.occurrence {
            Some(o) => format!("{} {}", self.key, o.id),
            None => self.key.clone(),
        }
    }

    /// A remark shown with --verbose.
    pub(crate) fn note(&mut self, text: &str) {
        if !self.json && self.verbose >= 1 {
            say!("baton: {}: {text}", self.label());
        }
    }

    /// Something the operator must see, an error (not with --json, whose events tell it):
    /// shown under --quiet too.
    pub(crate) fn warn(&mut self, text: &str) {
        if !self.json {
            say!("baton: {}: {text}", self.label());
        }
    }

    /// A warning that changes no outcome (a flag overruled, a risky setting): not under
    /// --quiet, nor with --json.
    pub(crate) fn caution(&mut self, text: &str) {
        if !self.json {
            tell!("baton: {}: {text}", self.label());
        }
    }
}

pub(crate) fn describe(event: &Event) -> String {
    match event {
        Event::Acquired(a) => format!(
            "acquired attempt {}{} (fencing token {})",
            a.attempt,
            if a.last { ", the last" } else { "" },
            a.fencing_token
        ),
        Event::Locked {
            attempt,
            lease_remaining_ms,
            ..
        } => format!(
            "attempt {attempt} runs elsewhere; waiting as a backup ({} lease left)",
            lease_remaining_ms.map_or("? ms".into(), human_ms)
        ),
        // The library's own words, with its durations and field names in the CLI's.
        Event::Status { message, .. } => reword(message),
        Event::Error {
            kind,
            message,
            retryable,
        } => format!(
            "error ({kind:?}{}): {}",
            if *retryable { ", retrying" } else { "" },
            reword(message)
        ),
        Event::DeadlinePassed { attempt } => format!("attempt {attempt} ran out of time"),
        Event::Reachable { outage_ms } => {
            format!("the server answers again (after {})", human_ms(*outage_ms))
        }
        Event::Rejoined { attempt, reason } => format!(
            "attempt {attempt} failed ({}); waiting as a backup again",
            reword(reason)
        ),
        Event::Lagged { dropped } => format!("{dropped} events dropped"),
        Event::Completed { attempt: Some(n) } => format!("done (attempt {n})"),
        Event::Completed { attempt: None } => "done by another worker".into(),
        Event::Exhausted { attempts: Some(n) } => format!("exhausted after {}", attempts(*n)),
        Event::Exhausted { attempts: None } => "exhausted".into(),
        Event::Failed { attempt, reason } => {
            format!("attempt {attempt} failed: {}", reword(reason))
        }
        Event::LeaseLost { attempt, reason } => {
            format!("lost attempt {attempt}: {}", reword(reason))
        }
        Event::Stopped => "stopped".into(),
        other => format!("{other:?}"),
    }
}
