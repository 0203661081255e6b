//! How baton's messages word things: durations in human form (`4.0 s`, `250 ms`, `2 min 5 s`,
//! never Rust's `4.006396222s`), and settings by the flag or variable the user typed
//! (`--max-hold`, not the library's field `max_hold`). Every line the CLI prints about a
//! duration or a refused setting goes through here, so the wording is one thing.

use std::time::Duration;

use baton::ConfigError;

/// `d` as a person reads it: `0 s`, `800 µs`, `250 ms`, `4.0 s`, `2 min 5 s`, `3 h 20 min`,
/// `2 days 3 h`. Precise to the unit shown (rounded down), which is all a message needs.
pub(crate) fn human(d: Duration) -> String {
    const MINUTE: u64 = 60;
    const HOUR: u64 = 60 * MINUTE;
    const DAY: u64 = 24 * HOUR;
    let secs = d.as_secs();
    if d.is_zero() {
        "0 s".into()
    } else if d < Duration::from_millis(1) {
        format!("{} µs", d.as_micros())
    } else if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if secs < MINUTE {
        // Tenths, rounded down: 59.96 s is "59.9 s", never "60.0 s".
        format!("{}.{} s", secs, d.subsec_millis() / 100)
    } else if secs < HOUR {
        two_units(secs / MINUTE, "min", secs % MINUTE, "s")
    } else if secs < DAY {
        two_units(secs / HOUR, "h", secs % HOUR / MINUTE, "min")
    } else {
        let days = secs / DAY;
        let unit = if days == 1 { "day" } else { "days" };
        two_units(days, unit, secs % DAY / HOUR, "h")
    }
}

/// `big unit` and, when not zero, `small unit` after it.
fn two_units(big: u64, big_unit: &str, small: u64, small_unit: &str) -> String {
    if small == 0 {
        format!("{big} {big_unit}")
    } else {
        format!("{big} {big_unit} {small} {small_unit}")
    }
}

/// `n attempts`, or `1 attempt`.
pub(crate) fn attempts(n: u64) -> String {
    if n == 1 {
        "1 attempt".into()
    } else {
        format!("{n} attempts")
    }
}

/// [`human`] of a number of milliseconds (the unit of the library's status fields).
pub(crate) fn human_ms(ms: u64) -> String {
    human(Duration::from_millis(ms))
}

/// The flag (or environment variable) that sets a library configuration field, for the fields
/// the CLI sets. Other fields keep their library name.
fn flag(field: &str) -> Option<&'static str> {
    Some(match field {
        "key" => "--key",
        "prefix" => "--prefix",
        "url" => "--url",
        "max_attempts" => "--max-attempts",
        "retention" => "--retention",
        "max_hold" => "--max-hold",
        "retry_delay" => "--retry-delay",
        "worker_name" | "name" | "holder_name" => "--name",
        "ttl" => "--lease",
        "wait" => "--wait",
        "lease" => "--lease",
        "masters" => "--redlock",
        "every" => "--every",
        "offset" => "--offset",
        "cron" => "--cron",
        "tz" => "--tz",
        "early" => "--early",
        "jitter" => "--jitter",
        "catch_up" => "--catch-up",
        "overlap" => "--overlap",
        "password_file" => "BATON_REDIS_PASSWORD_FILE",
        "tls_root_ca" => "BATON_TLS_CA_FILE",
        "tls_client_cert" => "BATON_TLS_CERT_FILE",
        "tls_client_key" => "BATON_TLS_KEY_FILE",
        _ => return None,
    })
}

/// The library fields that reasons mention by name ("must be below retention (…)"): named so
/// in a reason they are identifiers, not words, and are replaced by their flags. Plain words
/// that are also fields (`key`, `lease`, `wait`) are left alone: in a reason they are prose.
const FIELDS_IN_REASONS: [&str; 4] = ["max_attempts", "max_hold", "retry_delay", "retention"];

/// A refused setting as the CLI says it: `invalid --lease: 0 s is outside 10 ms ..=
/// 1 day`. The library's reason is kept, its durations and field names reworded.
pub(crate) fn config_message(e: &ConfigError) -> String {
    match e {
        ConfigError::Invalid { field, reason } => {
            let name = flag(field).map_or_else(|| format!("`{field}`"), str::to_string);
            // A reason compares the setting with "the lease (30s)": the one the user gave as
            // --lease. Only refused settings say so; elsewhere "the lease" is prose.
            let reason = reword(reason).replace("the lease (", "--lease (");
            format!("invalid {name}: {reason}")
        }
        // A variant of a later library: its own text, durations reworded.
        other => reword(&other.to_string()),
    }
}

/// A library error as the CLI says it (see [`config_message`]; durations in human form).
pub(crate) fn error_message(e: &baton::Error) -> String {
    match e {
        baton::Error::Config(c) => config_message(c),
        other => reword(&other.to_string()),
    }
}

/// `text` with Rust's `Debug` durations (`4.006396222s`, `10ms`, `1.5µs`) in human form and
/// the fields of [`FIELDS_IN_REASONS`] named by their flags.
pub(crate) fn reword(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        let at_word_start = !out
            .chars()
            .next_back()
            .is_some_and(|p| p.is_alphanumeric() || p == '_' || p == '.');
        if at_word_start {
            if let Some((d, len)) = debug_duration(rest) {
                out += &human(d);
                rest = &rest[len..];
                continue;
            }
            if let Some(field) = FIELDS_IN_REASONS.iter().find(|f| starts_word(rest, f)) {
                out += flag(field).unwrap_or(field);
                rest = &rest[field.len()..];
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// Whether `text` starts with the whole word `word`.
fn starts_word(text: &str, word: &str) -> bool {
    text.strip_prefix(word)
        .is_some_and(|after| !after.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
}

/// A `Debug`-printed duration at the start of `text` (`12.5s`, `10ms`, `3µs`, `7ns`, followed
/// by a non-word character or the end), and how many bytes it takes.
fn debug_duration(text: &str) -> Option<(Duration, usize)> {
    let int = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if int == 0 {
        return None;
    }
    let mut end = int;
    let after_int = &text[int..];
    if let Some(frac) = after_int.strip_prefix('.') {
        let digits = frac
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(frac.len());
        if digits > 0 {
            end += 1 + digits;
        }
    }
    let number: f64 = text[..end].parse().ok()?;
    let tail = &text[end..];
    let (unit, scale) = [("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)]
        .into_iter()
        .find(|(u, _)| starts_word(tail, u))?;
    let d = Duration::try_from_secs_f64(number * scale).ok()?;
    Some((d, end + unit.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_person_says_them() {
        let cases = [
            (Duration::ZERO, "0 s"),
            (Duration::from_micros(800), "800 µs"),
            (Duration::from_millis(250), "250 ms"),
            (Duration::from_nanos(4_006_396_222), "4.0 s"),
            (Duration::from_millis(59_960), "59.9 s"),
            (Duration::from_secs(125), "2 min 5 s"),
            (Duration::from_secs(120), "2 min"),
            (Duration::from_secs(3 * 3600 + 20 * 60 + 7), "3 h 20 min"),
            (Duration::from_secs(86_400), "1 day"),
            (Duration::from_secs(2 * 86_400 + 3 * 3600), "2 days 3 h"),
        ];
        for (d, text) in cases {
            assert_eq!(human(d), text, "{d:?}");
        }
    }

    #[test]
    fn debug_durations_and_field_names_in_reasons_are_reworded() {
        assert_eq!(
            reword("4.006396222s must exceed max_hold (30s)"),
            "4.0 s must exceed --max-hold (30.0 s)"
        );
        assert_eq!(
            reword("5ms is outside 10ms ..= 1 day"),
            "5 ms is outside 10 ms ..= 1 day"
        );
        assert_eq!(
            reword("86400s must be below retention (172800s)"),
            "1 day must be below --retention (2 days)"
        );
        // Words and numbers that are not durations or fields stay as they are.
        for same in [
            "must be 1..=256 bytes",
            "job w30s, 3 tries",
            "max_holds and retentions",
            "must exceed the lease",
            "v1.5s",
            "10 years",
        ] {
            assert_eq!(reword(same), same);
        }
    }

    #[test]
    fn a_refused_setting_is_named_by_its_flag() {
        let e = ConfigError::Invalid {
            field: "max_hold",
            reason: "1s must exceed the lease (10s)".into(),
        };
        assert_eq!(
            config_message(&e),
            "invalid --max-hold: 1.0 s must exceed --lease (10.0 s)"
        );
        let e = ConfigError::Invalid {
            field: "event_capacity",
            reason: "0 is outside 1 ..= 65536".into(),
        };
        assert_eq!(
            config_message(&e),
            "invalid `event_capacity`: 0 is outside 1 ..= 65536"
        );
    }
}
