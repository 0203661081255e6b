//! A toy livelock, run by the suite to show the fair-cycle check bites: two workers each raise
//! a flag, then check the other's; a worker that sees the other's flag lowers its own and starts
//! over (backs off), one that does not wins and ends. In lockstep they back off forever: worker
//! 0 checks and lowers its flag, raises it again, then worker 1 checks, sees it and backs off,
//! and so on. There is a way out (a worker that checks while the other's flag is down wins),
//! and every state reaches the end in a few fault-free steps, so the bounded liveness check
//! passes; but the way out is not enabled all along the cycle, so weak fairness does not force
//! it, and the cycle is fair: a livelock.

use super::check::Model;

/// The toy.
pub(crate) struct Livelock;

/// Where a worker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Pc {
    /// About to raise its flag.
    Start,
    /// Flag raised, about to check the other's.
    Raised,
    /// Won (its flag lowered again).
    Done,
}

/// A state: each worker's place and flag.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Toy {
    pc: [Pc; 2],
    flag: [bool; 2],
}

/// A step of worker `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Step {
    /// Raise its flag.
    Raise(usize),
    /// Check the other's flag: back off, or win.
    Check(usize),
}

impl Model for Livelock {
    type State = Toy;
    type Action = Step;

    fn init(&self) -> Vec<Toy> {
        vec![Toy {
            pc: [Pc::Start; 2],
            flag: [false; 2],
        }]
    }

    fn actions(&self, _: &Toy, out: &mut Vec<Step>) {
        out.extend([
            Step::Raise(0),
            Step::Raise(1),
            Step::Check(0),
            Step::Check(1),
        ]);
    }

    fn next(&self, s: &Toy, a: &Step) -> Option<Toy> {
        let mut t = s.clone();
        match *a {
            Step::Raise(i) if s.pc[i] == Pc::Start => {
                t.flag[i] = true;
                t.pc[i] = Pc::Raised;
            }
            Step::Check(i) if s.pc[i] == Pc::Raised => {
                t.flag[i] = false;
                t.pc[i] = if s.flag[1 - i] { Pc::Start } else { Pc::Done };
            }
            _ => return None,
        }
        Some(t)
    }

    fn is_fault(&self, _: &Step) -> bool {
        false
    }

    fn check(&self, _: &Toy) -> Result<(), String> {
        Ok(())
    }

    fn is_terminal(&self, s: &Toy) -> bool {
        s.pc == [Pc::Done; 2]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{check_exhaustive, Limits, Outcome};
    use std::time::Duration;

    #[test]
    fn the_lockstep_back_off_is_a_fair_cycle_the_bounded_check_misses() {
        let mut limits = Limits {
            max_states: 1000,
            timeout: Duration::from_secs(10),
            liveness_steps: Some(64),
            fair_cycles: false,
        };
        let r = check_exhaustive(&Livelock, &limits);
        assert!(matches!(r.outcome, Outcome::Exhausted), "{r}");
        limits.fair_cycles = true;
        let r = check_exhaustive(&Livelock, &limits);
        let Outcome::FairCycle(cx) = &r.outcome else {
            panic!("expected a fair cycle: {r}");
        };
        assert_eq!(r.cyclic_components, Some(1));
        // The cycle: raising and checking, each taken.
        let cycle: Vec<&str> = cx.steps.iter().map(|(a, _)| a.as_str()).collect();
        for step in ["Check(", "Raise("] {
            assert!(cycle.iter().any(|a| a.starts_with(step)), "{cx}");
        }
        assert!(cx.message.starts_with("fair cycle: 3 states"), "{cx}");
        // Once around: back where the cycle was entered.
        assert_eq!(cx.last_state(), &cx.steps[0].1, "{cx}");
    }
}
