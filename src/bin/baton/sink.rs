//! Where `baton run`'s events go: human lines on stderr (only what matters without
//! --verbose), JSON lines on stderr (--json) or appended to a file (--events). Apart from the
//! commands because every line baton writes about a job goes through it.

use std::io::Write;

use baton::Event;

use super::text::{human_ms, reword};

/// Where events go.
pub(crate) struct Sink {
    pub(crate) json: bool,
    pub(crate) file: Option<std::fs::File>,
    pub(crate) verbose: u8,
    pub(crate) key: String,
}

impl Sink {
    pub(crate) fn emit(&mut self, event: &Event) {
        if self.json || self.file.is_some() {
            let mut value = serde_json::to_value(event).unwrap_or_default();
            if let Some(map) = value.as_object_mut() {
                map.insert("key".into(), self.key.clone().into());
            }
            let line = value.to_string();
            if self.json {
                eprintln!("{line}");
            }
            if let Some(f) = &mut self.file {
                let _ = writeln!(f, "{line}");
            }
        }
        if self.json {
            return;
        }
        let important = matches!(
            event,
            Event::Error { .. } | Event::LeaseLost { .. } | Event::DeadlinePassed { .. }
        );
        if important || self.verbose >= 1 {
            eprintln!("baton: {}: {}", self.key, describe(event));
        }
    }

    /// A remark shown with --verbose.
    pub(crate) fn note(&mut self, text: &str) {
        if !self.json && self.verbose >= 1 {
            eprintln!("baton: {}: {text}", self.key);
        }
    }

    /// Something the operator must see (not with --json, whose events tell it).
    pub(crate) fn warn(&mut self, text: &str) {
        if !self.json {
            eprintln!("baton: {}: {text}", self.key);
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
        Event::Lagged { dropped } => format!("{dropped} events dropped"),
        Event::Completed { attempt: Some(n) } => format!("done (attempt {n})"),
        Event::Completed { attempt: None } => "done by another worker".into(),
        Event::Exhausted { attempts } => format!("exhausted after {attempts} attempts"),
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
