//! Model checking of baton's protocols (see the crate's library), on the library's own decisions.
//!
//! ```text
//! cargo run --profile model -p baton-model                  # the exhaustive suite (CI)
//! cargo run --profile model -p baton-model -- check FILTER --all  # every case (minutes more) whose name contains FILTER
//! cargo run --profile model -p baton-model -- walk --workers 6 --attempts 5 --seed 7 --walks 20000
//! ```
//!
//! Exits 1 on any counterexample, and on an exhaustive search that ended on a bound (state limit
//! or timeout) instead of exhausting the space.

use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str, default: u64| -> u64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| {
                v.parse().unwrap_or_else(|_| {
                    eprintln!("{name} wants a number, not {v:?}");
                    std::process::exit(2)
                })
            })
            .unwrap_or(default)
    };
    let ok = match args.first().map(String::as_str) {
        None | Some("check") => {
            let all = args.iter().any(|a| a == "--all");
            let filter = args
                .get(1)
                .filter(|a| !a.starts_with("--"))
                .map(String::as_str)
                .unwrap_or("");
            baton_model::check_suite(
                filter,
                all,
                flag("--max-states", 60_000_000) as usize,
                Duration::from_secs(flag("--timeout-secs", 600)),
            )
        }
        Some("walk") => baton_model::walk(
            flag("--workers", 6) as u8,
            flag("--attempts", 5),
            flag("--seed", 1),
            flag("--walks", 10_000) as u32,
            flag("--steps", 400) as u32,
            Duration::from_secs(flag("--secs", 120)),
        ),
        Some("one") => {
            let budget: Vec<u8> = args[4..12].iter().map(|a| a.parse().unwrap_or(0)).collect();
            baton_model::check_one(
                args[1].parse().unwrap_or(3),
                args[2].parse().unwrap_or(3),
                args[3] == "keepalive",
                budget.try_into().unwrap_or([0; 8]),
                Duration::from_secs(60),
            )
        }
        Some(other) => {
            eprintln!("usage: model [check [FILTER]] | walk [--workers N --attempts N --seed N --walks N --steps N --secs N]; not {other:?}");
            std::process::exit(2)
        }
    };
    std::process::exit(if ok { 0 } else { 1 })
}
