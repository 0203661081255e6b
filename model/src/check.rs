//! A small explicit-state model checker: exhaustive breadth-first search with safety and
//! fault-free liveness checks ([`check_exhaustive`]), and seeded random walks for
//! configurations too large to exhaust ([`random_walks`]).
//!
//! A protocol model implements [`Model`]: its initial states, the actions enabled in a state,
//! the state an action leads to, which actions are faults, the invariants, and which states
//! are terminal. Everything is deterministic: the same model gives the same states, in the same
//! order, and the same counterexamples on every run (no randomised hashing; walks are seeded).
//!
//! Memory: each reachable state is stored once, in a `Vec` in BFS order; the deduplication
//! table holds 8-byte slots (an index into that `Vec` and 32 bits of the hash), the parent
//! pointers an index and the action. With liveness on, every distinct fault-free edge costs
//! 4 bytes during the search (8 while the reverse graph is built) plus 8 bytes per state.
//! The fair-cycle check adds 4 bytes per such edge (its class) and, after the search, 8 bytes
//! per state (Tarjan's number and low link) plus its stacks.
//!
//! # Fair cycles
//!
//! The bounded liveness check (every state reaches a terminal state within `n` fault-free
//! steps) passes a livelock with one way out: a cycle that a run may go around forever, as long
//! as the step out is not forced. Which steps are forced is weak fairness: a step (a class of
//! actions, see below) that stays enabled in every state of a run from some point on is taken
//! in it, as the real system does (a worker's next step happens, a timer fires, time passes).
//! Faults are never forced, and not followed: the check runs on the graph of fault-free steps.
//!
//! A run that never ends goes around, from some point on, inside one strongly connected
//! component (SCC) of that graph with no terminal state (a run through a terminal state ends).
//! Such an SCC holds a weakly fair cycle if and only if every class enabled in *all* its states
//! is taken by a step inside it: then the walk that goes through every state and every inner
//! step of the SCC, repeated, is fair (each class is either taken on it or disabled at some
//! state on it); and conversely a fair cycle in the SCC passes, for a class enabled in all its
//! states, a state where it is enabled, so it must take it, inside the SCC. Unlike strong
//! fairness, weak fairness needs no recursive splitting of the SCC. So: Tarjan's algorithm
//! (iterative: no recursion over millions of states) over the stored forward graph, and per SCC
//! of two or more states (a self-loop changes nothing and is not a step) with no terminal
//! state, one pass over its members' steps: the classes enabled everywhere, intersected, must
//! lie within the classes of its inner steps. The first fair SCC is reported with a path to it
//! and a walk once around it that takes every inner class.
//!
//! Why this is sound for the models' step semantics: "enabled" is what the graph holds, the
//! non-fault actions whose `next` is a different state (a `None` or a self-loop is no step:
//! nothing to force); every step of a state is an edge, so the enabled classes of a state are
//! its edges' classes, and "enabled throughout" is exact. A class is an action with the numbers
//! in its `Debug` text erased (`Renew(1)` is `Renew`), because the models store states up to a
//! permutation of their workers: `Renew(1)` names whichever worker sits in slot 1 of that
//! state, and the same worker may sit in slot 0 of the next state on the cycle. Per-slot classes
//! would take a leader renewing forever, while its `Release` stays enabled, for a fair cycle
//! (its slot changes every step, so neither `Release(0)` nor `Release(1)` is enabled
//! throughout). The price of erasing: two workers alternately enabled for the same kind of step
//! count as that kind enabled throughout, so such a cycle must also take that kind of step
//! to be judged fair; the toy livelock (`toy.rs`) shows a lockstep livelock is still found.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};
use std::time::{Duration, Instant};

/// A protocol model: a finite (or bounded) transition system the checker explores.
pub(crate) trait Model {
    /// One global state of the system. Compared and hashed by full value.
    type State: Clone + Eq + Hash + fmt::Debug;
    /// One step of one participant (or of the environment: a fault). Equal actions are one
    /// step for weak fairness (the fair-cycle check): `Exec(1)` is worker 1's `EXEC`, wherever
    /// it is enabled.
    type Action: Clone + fmt::Debug + Eq + Hash;
    /// Initial states.
    fn init(&self) -> Vec<Self::State>;
    /// Appends the actions enabled in `s` to `out`.
    fn actions(&self, s: &Self::State, out: &mut Vec<Self::Action>);
    /// The state after `a`; None if `a` turns out to change nothing / is not enabled.
    fn next(&self, s: &Self::State, a: &Self::Action) -> Option<Self::State>;
    /// Whether `a` is a fault (lost reply, crash, pause, data loss...). Liveness only follows
    /// non-fault actions.
    fn is_fault(&self, a: &Self::Action) -> bool;
    /// Safety: Err(property name + explanation) when `s` violates an invariant.
    fn check(&self, s: &Self::State) -> Result<(), String>;
    /// Whether `s` is terminal for the liveness check (e.g. every worker has ended).
    fn is_terminal(&self, s: &Self::State) -> bool;
}

/// The bounds of one exhaustive search.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    /// The search stops with [`Outcome::Incomplete`] when a new state would make more than this
    /// many (capped at `u32::MAX - 1`, the index space).
    pub(crate) max_states: usize,
    /// The search stops with [`Outcome::Incomplete`] once this much time has passed (checked
    /// every 1024 expanded states).
    pub(crate) timeout: Duration,
    /// `Some(n)`: after the search, every reachable state must reach a terminal state in at
    /// most `n` non-fault steps. `None`: no liveness check (and no edges kept).
    pub(crate) liveness_steps: Option<u32>,
    /// With `liveness_steps`: also look for a fair cycle of non-fault steps (see
    /// [`fair_cycle`]), a run that never ends although every step enabled throughout it is
    /// taken in it.
    pub(crate) fair_cycles: bool,
}

/// A path from an initial state to a state that violates a property.
#[derive(Clone, Debug)]
pub(crate) struct Counterexample<S> {
    /// What is violated: the [`Model::check`] error, or the liveness explanation.
    pub(crate) message: String,
    /// The initial state the path starts from.
    pub(crate) init: S,
    /// Each step: the action (its `Debug` form) and the state it led to. The last state is the
    /// violating one (or `init` when there are no steps).
    pub(crate) steps: Vec<(String, S)>,
}

impl<S> Counterexample<S> {
    /// The violating state: the last state of the path.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn last_state(&self) -> &S {
        self.steps.last().map_or(&self.init, |(_, s)| s)
    }
}

impl<S: fmt::Debug> fmt::Display for Counterexample<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.message)?;
        write!(f, "  0. (initial state)\n     {:?}", self.init)?;
        for (i, (action, state)) in self.steps.iter().enumerate() {
            write!(f, "\n  {}. {action}\n     {state:?}", i + 1)?;
        }
        Ok(())
    }
}

/// How an exhaustive search ended.
#[derive(Clone, Debug)]
pub(crate) enum Outcome<S> {
    /// Every reachable state was visited and every property holds.
    Exhausted,
    /// A reachable state violates a safety invariant; the path is a shortest one.
    Violation(Counterexample<S>),
    /// A reachable state cannot reach a terminal state within the bound by non-fault actions;
    /// the path is a shortest one to the first such state (in BFS order).
    LivenessViolation(Counterexample<S>),
    /// A weakly fair cycle of non-fault steps through non-terminal states: a run that goes
    /// around it forever never ends. The path reaches the cycle, then goes once around it.
    FairCycle(Counterexample<S>),
    /// The search was cut short (state budget or timeout): nothing is proven. CI must fail.
    Incomplete {
        /// Which limit was hit, and where.
        reason: String,
    },
}

impl<S: fmt::Debug> fmt::Display for Outcome<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Exhausted => write!(f, "exhausted: every property holds"),
            Outcome::Violation(cx) => write!(f, "safety violation: {cx}"),
            Outcome::LivenessViolation(cx) => write!(f, "liveness violation: {cx}"),
            Outcome::FairCycle(cx) => write!(f, "fair cycle: {cx}"),
            Outcome::Incomplete { reason } => write!(f, "incomplete: {reason}"),
        }
    }
}

/// The result of [`check_exhaustive`].
#[derive(Clone, Debug)]
pub(crate) struct Report<S> {
    /// How the search ended.
    pub(crate) outcome: Outcome<S>,
    /// Distinct states stored (all reachable ones when the search was exhausted).
    pub(crate) states: usize,
    /// Transitions explored: every enabled action whose `next` is a different state, including
    /// those to states already seen.
    pub(crate) edges: usize,
    /// The BFS depth of the deepest state stored (0: only initial states).
    pub(crate) max_depth: u32,
    /// The largest number of non-fault steps from a reachable state to its nearest terminal
    /// state, over the states that reach one. `None` when the liveness check did not run or no
    /// state reaches a terminal state.
    pub(crate) max_distance_to_terminal: Option<u32>,
    /// The strongly connected components of non-fault steps with a cycle and no terminal
    /// state, all checked for a fair cycle (`None`: the check did not run).
    pub(crate) cyclic_components: Option<usize>,
    /// Wall-clock time of the whole check.
    pub(crate) elapsed: Duration,
}

impl<S: fmt::Debug> fmt::Display for Report<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} states, {} edges, depth {}",
            self.states, self.edges, self.max_depth
        )?;
        if let Some(d) = self.max_distance_to_terminal {
            write!(f, ", at most {d} steps to a terminal state")?;
        }
        write!(f, ", {:.2?}; {}", self.elapsed, self.outcome)
    }
}

/// How a run of [`random_walks`] ended.
#[derive(Clone, Debug)]
pub(crate) enum WalkOutcome<S> {
    /// No walk met a violation (which proves nothing beyond the walks taken).
    Ok,
    /// A walk reached a state that violates a safety invariant; its whole path.
    Violation(Counterexample<S>),
}

/// The result of [`random_walks`].
#[derive(Clone, Debug)]
pub(crate) struct WalkReport<S> {
    /// How the walks ended.
    pub(crate) outcome: WalkOutcome<S>,
    /// Walks started (the violating one included; fewer than asked when the deadline passed).
    pub(crate) walks: u32,
    /// Actions taken over all walks.
    pub(crate) steps: u64,
    /// Distinct states seen (by 64-bit hash, so a collision may undercount).
    pub(crate) distinct_states_seen: usize,
    /// Wall-clock time of all walks.
    pub(crate) elapsed: Duration,
}

impl<S: fmt::Debug> fmt::Display for WalkReport<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} walks, {} steps, {} distinct states, {:.2?}; ",
            self.walks, self.steps, self.distinct_states_seen, self.elapsed
        )?;
        write!(f, "{}", self.outcome)
    }
}

impl<S: fmt::Debug> fmt::Display for WalkOutcome<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WalkOutcome::Ok => write!(f, "no violation"),
            WalkOutcome::Violation(cx) => write!(f, "safety violation: {cx}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hashing
// ---------------------------------------------------------------------------------------------

/// An FxHash-like hasher (rotate, xor, multiply per word) with a murmur3 finaliser, so that both
/// the low and the high bits of [`Hasher::finish`] are well mixed. Not DoS-resistant, and not
/// meant to be: it hashes the model's own states, deterministically.
#[derive(Clone, Copy, Default)]
pub(crate) struct FxHasher {
    /// The running hash.
    hash: u64,
}

/// The multiplier of FxHash (from Firefox / rustc).
const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    /// Mixes one word in.
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // murmur3's fmix64.
        let mut h = self.hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^ (h >> 33)
    }
}

/// Builds [`FxHasher`]s, for `std` maps and sets keyed by model data.
#[derive(Clone, Copy, Default)]
pub(crate) struct FxBuildHasher;

impl BuildHasher for FxBuildHasher {
    type Hasher = FxHasher;
    fn build_hasher(&self) -> FxHasher {
        FxHasher::default()
    }
}

/// The [`FxHasher`] hash of `value`.
pub(crate) fn fx_hash<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut h = FxHasher::default();
    value.hash(&mut h);
    h.finish()
}

// ---------------------------------------------------------------------------------------------
// The state table
// ---------------------------------------------------------------------------------------------

/// An empty slot of [`Table`].
const EMPTY: u64 = u64::MAX;

/// The largest number of states a search may store: indices are `u32`, and `u32::MAX` marks an
/// empty slot.
const MAX_INDEX: usize = u32::MAX as usize - 1;

/// An open-addressing (linear probing) set of indices into the `Vec` that owns the states, so
/// that each state is stored once. A slot packs the low 32 bits of the state's hash (a tag that
/// spares most full comparisons) and its index; the slot position comes from the hash's high
/// bits. Growing rehashes the states.
struct Table {
    /// `tag << 32 | index`, or [`EMPTY`].
    slots: Vec<u64>,
    /// `64 - log2(slots.len())`: the position of hash `h` is `h >> shift`.
    shift: u32,
    /// Occupied slots.
    len: usize,
}

impl Table {
    /// An empty table of 1024 slots.
    fn new() -> Table {
        Table {
            slots: vec![EMPTY; 1 << 10],
            shift: 64 - 10,
            len: 0,
        }
    }

    /// The index whose state `is` reports equal, or the empty slot where a state of this
    /// `hash` goes.
    #[inline]
    fn find(&self, hash: u64, is: impl Fn(u32) -> bool) -> Result<u32, usize> {
        let mask = self.slots.len() - 1;
        let tag = hash & 0xffff_ffff;
        let mut pos = (hash >> self.shift) as usize;
        loop {
            let slot = self.slots[pos];
            if slot == EMPTY {
                return Err(pos);
            }
            if slot >> 32 == tag && is(slot as u32) {
                return Ok(slot as u32);
            }
            pos = (pos + 1) & mask;
        }
    }

    /// Fills the empty slot `pos` (from [`Table::find`]) with `index`, then grows when more than
    /// 3/4 full; `hash_of(i)` must give the hash of state `i`, for the rehash.
    fn insert(&mut self, pos: usize, hash: u64, index: u32, hash_of: impl Fn(u32) -> u64) {
        self.slots[pos] = (hash << 32) | u64::from(index);
        self.len += 1;
        if self.len * 4 > self.slots.len() * 3 {
            self.grow(hash_of);
        }
    }

    /// Doubles the slots and re-places every index.
    fn grow(&mut self, hash_of: impl Fn(u32) -> u64) {
        let doubled = vec![EMPTY; self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        self.shift -= 1;
        let mask = self.slots.len() - 1;
        for slot in old.into_iter().filter(|&s| s != EMPTY) {
            let mut pos = (hash_of(slot as u32) >> self.shift) as usize;
            while self.slots[pos] != EMPTY {
                pos = (pos + 1) & mask;
            }
            self.slots[pos] = slot;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Exhaustive search
// ---------------------------------------------------------------------------------------------

/// The states found so far and how each was first reached.
struct Explored<M: Model> {
    /// Every distinct state, in BFS order (the initial ones first).
    states: Vec<M::State>,
    /// For state `n_init + i`: the index of its BFS parent and the action from it.
    via: Vec<(u32, M::Action)>,
    /// The number of distinct initial states (indices `0..n_init`).
    n_init: usize,
}

impl<M: Model> Explored<M> {
    /// A shortest path to state `index` (BFS parents), as a counterexample saying `message`.
    fn trace(&self, index: usize, message: String) -> Counterexample<M::State> {
        let mut path = Vec::new();
        let mut i = index;
        while i >= self.n_init {
            path.push(i);
            i = self.via[i - self.n_init].0 as usize;
        }
        let steps = path
            .iter()
            .rev()
            .map(|&j| {
                (
                    format!("{:?}", self.via[j - self.n_init].1),
                    self.states[j].clone(),
                )
            })
            .collect();
        Counterexample {
            message,
            init: self.states[i].clone(),
            steps,
        }
    }
}

/// Explores every state reachable from `model.init()` breadth-first, checking
/// [`Model::check`] on each, then (with `limits.liveness_steps`) that every state reaches a
/// terminal state by non-fault actions within the bound. Stops at the first safety violation,
/// with a shortest path to it.
pub(crate) fn check_exhaustive<M: Model>(model: &M, limits: &Limits) -> Report<M::State> {
    let start = Instant::now();
    let max_states = limits.max_states.min(MAX_INDEX);
    let liveness = limits.liveness_steps;
    let mut ex = Explored::<M> {
        states: Vec::new(),
        via: Vec::new(),
        n_init: 0,
    };
    let mut table = Table::new();
    // Liveness only: the distinct non-fault steps of each state (`fwd_off[i]..` into `fwd`, the
    // step's class in `fwd_class`; states are expanded in index order, so this is the forward
    // graph in CSR form), and the terminal states. A class numbers one distinct action
    // (`classes[c]`), the unit of weak fairness.
    let mut fwd: Vec<u32> = Vec::new();
    let mut fwd_class: Vec<u32> = Vec::new();
    let mut fwd_off: Vec<usize> = Vec::new();
    let mut classes = Classes::<M::Action>::default();
    let mut terminals: Vec<u32> = Vec::new();
    let mut edges = 0usize;
    let mut max_depth = 0u32;

    let report = |outcome, ex: &Explored<M>, edges, max_depth, dist| Report {
        outcome,
        states: ex.states.len(),
        edges,
        max_depth,
        max_distance_to_terminal: dist,
        cyclic_components: None,
        elapsed: start.elapsed(),
    };
    let budget = |n: usize, depth: u32| Outcome::Incomplete {
        reason: format!(
            "max_states ({max_states}) exceeded: {n} states stored, BFS at depth {depth}"
        ),
    };

    for s in model.init() {
        let hash = fx_hash(&s);
        let Err(pos) = table.find(hash, |i| ex.states[i as usize] == s) else {
            continue;
        };
        if ex.states.len() >= max_states {
            return report(budget(ex.states.len(), 0), &ex, edges, 0, None);
        }
        let index = ex.states.len() as u32;
        if liveness.is_some() && model.is_terminal(&s) {
            terminals.push(index);
        }
        let verdict = model.check(&s);
        ex.states.push(s);
        table.insert(pos, hash, index, |i| fx_hash(&ex.states[i as usize]));
        if let Err(message) = verdict {
            let cx = ex.trace(index as usize, message);
            return report(Outcome::Violation(cx), &ex, edges, 0, None);
        }
    }
    ex.n_init = ex.states.len();

    let mut actions = Vec::new();
    let mut depth = 0u32;
    let mut level_end = ex.states.len();
    let mut cur = 0usize;
    while cur < ex.states.len() {
        if cur == level_end {
            depth += 1;
            level_end = ex.states.len();
        }
        if cur % 1024 == 0 && start.elapsed() >= limits.timeout {
            let reason = format!(
                "timeout ({:?}) passed: {} states stored, {cur} expanded, BFS at depth {depth}",
                limits.timeout,
                ex.states.len()
            );
            return report(Outcome::Incomplete { reason }, &ex, edges, max_depth, None);
        }
        if liveness.is_some() {
            fwd_off.push(fwd.len());
        }
        model.actions(&ex.states[cur], &mut actions);
        for a in actions.drain(..) {
            let Some(t) = model.next(&ex.states[cur], &a) else {
                continue;
            };
            if t == ex.states[cur] {
                continue;
            }
            edges += 1;
            let follow = liveness.is_some() && !model.is_fault(&a);
            let class = if follow { Some(classes.of(&a)) } else { None };
            let hash = fx_hash(&t);
            let to = match table.find(hash, |i| ex.states[i as usize] == t) {
                Ok(to) => to,
                Err(pos) => {
                    if ex.states.len() >= max_states {
                        let outcome = budget(ex.states.len(), depth + 1);
                        return report(outcome, &ex, edges, max_depth, None);
                    }
                    let index = ex.states.len() as u32;
                    if liveness.is_some() && model.is_terminal(&t) {
                        terminals.push(index);
                    }
                    let verdict = model.check(&t);
                    ex.states.push(t);
                    ex.via.push((cur as u32, a));
                    max_depth = depth + 1;
                    table.insert(pos, hash, index, |i| fx_hash(&ex.states[i as usize]));
                    if let Err(message) = verdict {
                        let cx = ex.trace(index as usize, message);
                        return report(Outcome::Violation(cx), &ex, edges, max_depth, None);
                    }
                    index
                }
            };
            if let Some(class) = class {
                let mine = fwd_off[cur]..;
                if !fwd[mine.clone()]
                    .iter()
                    .zip(&fwd_class[mine])
                    .any(|(&t, &c)| t == to && c == class)
                {
                    fwd.push(to);
                    fwd_class.push(class);
                }
            }
        }
        cur += 1;
    }
    drop(table);

    let Some(bound) = liveness else {
        return report(Outcome::Exhausted, &ex, edges, max_depth, None);
    };
    fwd_off.push(fwd.len());
    let dist = distances_to_terminal(ex.states.len(), &fwd, &fwd_off, &terminals);
    let max_dist = dist.iter().copied().filter(|&d| d != u32::MAX).max();
    let late = dist.iter().position(|&d| d > bound).map(|i| (i, dist[i]));
    drop(dist);
    let outcome = match late {
        None => Outcome::Exhausted,
        Some((i, d)) => {
            let message = if d == u32::MAX {
                "liveness: no fault-free path from this state to a terminal state".to_string()
            } else {
                format!(
                    "liveness: the shortest fault-free path from this state to a terminal state \
                     takes {} steps, more than the bound of {bound}",
                    d
                )
            };
            Outcome::LivenessViolation(ex.trace(i, message))
        }
    };
    if !matches!(outcome, Outcome::Exhausted) || !limits.fair_cycles {
        return report(outcome, &ex, edges, max_depth, max_dist);
    }
    let graph = Graph {
        fwd: &fwd,
        class: &fwd_class,
        off: &fwd_off,
        classes: classes.list.len(),
    };
    let (cyclic, found) = fair_cycle(&graph, &terminals);
    let outcome = match found {
        None => Outcome::Exhausted,
        Some(scc) => Outcome::FairCycle(scc.trace(model, &graph, &ex, &mut classes)),
    };
    Report {
        cyclic_components: Some(cyclic),
        ..report(outcome, &ex, edges, max_depth, max_dist)
    }
}

/// The classes of the non-fault actions of a search, numbered in the order first met: the unit
/// of weak fairness. A class is an action with its numbers erased (`Release(1)` and
/// `Release(0)` are one class, `Release`): the models store each state up to a permutation of
/// their workers (`canonical`), so a number names a slot of that state, not a worker, and the
/// same worker may be slot 1 in one state of a cycle and slot 0 in the next.
struct Classes<A> {
    /// Action to class (each distinct action is named once, then looked up).
    index: HashMap<A, u32, FxBuildHasher>,
    /// Class name (the action's `Debug` text without digits) to class.
    names: HashMap<String, u32>,
    /// Class to the first action of it met (for traces).
    list: Vec<A>,
}

impl<A> Default for Classes<A> {
    fn default() -> Self {
        Classes {
            index: HashMap::default(),
            names: HashMap::new(),
            list: Vec::new(),
        }
    }
}

impl<A: Clone + Eq + Hash + fmt::Debug> Classes<A> {
    /// The class of `a`.
    fn of(&mut self, a: &A) -> u32 {
        if let Some(&c) = self.index.get(a) {
            return c;
        }
        let name: String = format!("{a:?}")
            .chars()
            .filter(|c| !c.is_ascii_digit())
            .collect();
        let next = self.list.len() as u32;
        let c = *self.names.entry(name).or_insert(next);
        if c == next {
            self.list.push(a.clone());
        }
        self.index.insert(a.clone(), c);
        c
    }
}

/// The graph of non-fault steps in CSR form: the steps out of state `i` go to
/// `fwd[off[i]..off[i + 1]]`, with the classes `class[off[i]..off[i + 1]]`.
struct Graph<'a> {
    /// Target states.
    fwd: &'a [u32],
    /// The class (numbered action) of each step.
    class: &'a [u32],
    /// Where each state's steps start (one more entry than states).
    off: &'a [usize],
    /// How many classes there are.
    classes: usize,
}

impl Graph<'_> {
    /// The steps out of `v`: (target, class).
    fn steps(&self, v: u32) -> impl Iterator<Item = (u32, u32)> + '_ {
        let r = self.off[v as usize]..self.off[v as usize + 1];
        self.fwd[r.clone()]
            .iter()
            .copied()
            .zip(self.class[r].iter().copied())
    }
}

/// A set of classes (one bit each).
#[derive(Clone, PartialEq)]
struct ClassSet(Vec<u64>);

impl ClassSet {
    fn empty(classes: usize) -> ClassSet {
        ClassSet(vec![0; classes.div_ceil(64)])
    }
    fn full(classes: usize) -> ClassSet {
        let mut s = ClassSet::empty(classes);
        for c in 0..classes {
            s.insert(c as u32);
        }
        s
    }
    fn insert(&mut self, c: u32) {
        self.0[c as usize / 64] |= 1 << (c % 64);
    }
    fn contains(&self, c: u32) -> bool {
        self.0[c as usize / 64] & (1 << (c % 64)) != 0
    }
    fn clear(&mut self) {
        self.0.iter_mut().for_each(|w| *w = 0);
    }
    /// `self ∩= other`.
    fn keep(&mut self, other: &ClassSet) {
        self.0.iter_mut().zip(&other.0).for_each(|(a, b)| *a &= b);
    }
    /// Whether every class of `self` is in `other`.
    fn within(&self, other: &ClassSet) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a & !b == 0)
    }
}

/// A strongly connected component of non-fault steps that holds a fair cycle.
struct FairScc {
    /// Its states, ascending (the first is the one BFS met first).
    members: Vec<u32>,
    /// The classes enabled in every one of its states (each is taken inside it).
    always: ClassSet,
    /// The classes of its inner steps.
    taken: ClassSet,
}

/// Marks of [`fair_cycle`]'s Tarjan: not visited yet, and assigned to a component.
const UNSEEN: u32 = u32::MAX;
const DONE: u32 = u32::MAX - 1;

/// Looks for a weakly fair cycle among the non-terminal states (see the crate docs, "Fair
/// cycles"): Tarjan's strongly connected components, iteratively (an explicit stack, as a
/// component may hold millions of states), then per component with a cycle and no terminal
/// state: the classes enabled in every state of it must all be taken by a step inside it.
/// Returns how many such components there were, and the first fair one.
fn fair_cycle(g: &Graph<'_>, terminals: &[u32]) -> (usize, Option<FairScc>) {
    let n = g.off.len() - 1;
    let mut terminal = vec![false; n];
    for &t in terminals {
        terminal[t as usize] = true;
    }
    // `index[v]`: Tarjan's number, UNSEEN, or DONE once v's component is known; `low[v]`: the
    // low link, then the root of v's component (which names it).
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0u32; n];
    let mut stack: Vec<u32> = Vec::new();
    let mut call: Vec<(u32, usize)> = Vec::new();
    let mut next = 0u32;
    let mut cyclic = 0usize;
    let mut here = ClassSet::empty(g.classes);
    for root in 0..n as u32 {
        if index[root as usize] != UNSEEN {
            continue;
        }
        index[root as usize] = next;
        low[root as usize] = next;
        next += 1;
        stack.push(root);
        call.push((root, g.off[root as usize]));
        while let Some((v, e)) = call.last_mut() {
            let v = *v;
            if *e < g.off[v as usize + 1] {
                let w = g.fwd[*e];
                *e += 1;
                match index[w as usize] {
                    UNSEEN => {
                        index[w as usize] = next;
                        low[w as usize] = next;
                        next += 1;
                        stack.push(w);
                        call.push((w, g.off[w as usize]));
                    }
                    DONE => {}
                    i => low[v as usize] = low[v as usize].min(i),
                }
                continue;
            }
            call.pop();
            if let Some(&(u, _)) = call.last() {
                low[u as usize] = low[u as usize].min(low[v as usize]);
            }
            if low[v as usize] != index[v as usize] {
                continue;
            }
            // v is the root of a component: the stack from v up.
            let at = stack.iter().rposition(|&m| m == v).unwrap_or(0);
            let members = stack.split_off(at);
            for &m in &members {
                index[m as usize] = DONE;
                low[m as usize] = v;
            }
            // One state has no cycle (self-loops are not steps); a terminal state ends runs.
            if members.len() < 2 || members.iter().any(|&m| terminal[m as usize]) {
                continue;
            }
            cyclic += 1;
            let mut always = ClassSet::full(g.classes);
            let mut taken = ClassSet::empty(g.classes);
            for &m in &members {
                here.clear();
                for (t, c) in g.steps(m) {
                    here.insert(c);
                    if index[t as usize] == DONE && low[t as usize] == v {
                        taken.insert(c);
                    }
                }
                always.keep(&here);
            }
            if always.within(&taken) {
                let mut members = members;
                members.sort_unstable();
                let scc = FairScc {
                    members,
                    always,
                    taken,
                };
                return (cyclic, Some(scc));
            }
        }
    }
    (cyclic, None)
}

impl FairScc {
    /// A shortest path to the component's first state, then a walk around the component that
    /// takes a step of every class taken inside it and passes a state where each other class is
    /// disabled (so the walk, repeated, is a fair run), back to the first state.
    fn trace<M: Model>(
        &self,
        model: &M,
        g: &Graph<'_>,
        ex: &Explored<M>,
        classes: &mut Classes<M::Action>,
    ) -> Counterexample<M::State> {
        let inside: HashSet<u32, FxBuildHasher> = self.members.iter().copied().collect();
        let entry = self.members[0];
        let always: Vec<String> = (0..g.classes as u32)
            .filter(|&c| self.always.contains(c))
            .map(|c| format!("{:?}", classes.list[c as usize]))
            .collect::<Vec<_>>();
        let mut cx = ex.trace(entry as usize, String::new());
        let prefix = cx.steps.len();
        // The goals, in class order: a state with an inner step of class c (then that step),
        // or a state where c, enabled elsewhere in the component, is not.
        let mut cur = entry;
        let mut walk: Vec<(u32, u32)> = Vec::new();
        let mut enabled_somewhere = ClassSet::empty(g.classes);
        for &m in &self.members {
            g.steps(m).for_each(|(_, c)| enabled_somewhere.insert(c));
        }
        for c in 0..g.classes as u32 {
            if self.taken.contains(c) {
                let has = |v: u32| g.steps(v).any(|(t, k)| k == c && inside.contains(&t));
                walk.extend(shortest_inside(g, &inside, cur, has));
                cur = walk.last().map_or(cur, |&(t, _)| t);
                if let Some(step) = g.steps(cur).find(|&(t, k)| k == c && inside.contains(&t)) {
                    walk.push(step);
                    cur = step.0;
                }
            } else if enabled_somewhere.contains(c) {
                let off = |v: u32| g.steps(v).all(|(_, k)| k != c);
                walk.extend(shortest_inside(g, &inside, cur, off));
                cur = walk.last().map_or(cur, |&(t, _)| t);
            }
        }
        walk.extend(shortest_inside(g, &inside, cur, |v| v == entry));
        // The graph keeps classes only: find the action of each step again.
        let mut from = entry;
        let mut enabled = Vec::new();
        for (t, c) in walk {
            enabled.clear();
            model.actions(&ex.states[from as usize], &mut enabled);
            let action = enabled
                .iter()
                .find(|a| {
                    !model.is_fault(a)
                        && model.next(&ex.states[from as usize], a).as_ref()
                            == Some(&ex.states[t as usize])
                        && classes.of(a) == c
                })
                .map_or_else(
                    || format!("{:?}", classes.list[c as usize]),
                    |a| format!("{a:?}"),
                );
            cx.steps.push((action, ex.states[t as usize].clone()));
            from = t;
        }
        cx.message = format!(
            "fair cycle: {} states that no fault-free step leaves for good, none of them terminal: \
             a run can go around them forever while every step enabled throughout ({}) is taken; \
             steps 1..{prefix} reach them, steps {}..{} go once around",
            self.members.len(),
            if always.is_empty() {
                "none".to_string()
            } else {
                always.join(", ")
            },
            prefix + 1,
            cx.steps.len()
        );
        cx
    }
}

/// A shortest path of steps within `inside` from `from` to a state where `goal` holds (empty
/// when `from` is one), as (state reached, class taken) pairs.
fn shortest_inside(
    g: &Graph<'_>,
    inside: &HashSet<u32, FxBuildHasher>,
    from: u32,
    goal: impl Fn(u32) -> bool,
) -> Vec<(u32, u32)> {
    if goal(from) {
        return Vec::new();
    }
    let mut parent: HashMap<u32, (u32, u32), FxBuildHasher> = HashMap::default();
    let mut queue = std::collections::VecDeque::from([from]);
    while let Some(v) = queue.pop_front() {
        for (t, c) in g.steps(v) {
            if t == from || !inside.contains(&t) || parent.contains_key(&t) {
                continue;
            }
            parent.insert(t, (v, c));
            if goal(t) {
                let mut path = vec![(t, c)];
                let mut at = v;
                while at != from {
                    let (p, k) = parent[&at];
                    path.push((at, k));
                    at = p;
                }
                path.reverse();
                return path;
            }
            queue.push_back(t);
        }
    }
    Vec::new()
}

/// For each of the `n` states, the length of a shortest path to a terminal state in the graph
/// whose edges out of state `i` go to `fwd[fwd_off[i]..fwd_off[i + 1]]` (`u32::MAX`: none):
/// a backward BFS from all terminal states over the reversed graph (built in CSR form).
fn distances_to_terminal(n: usize, fwd: &[u32], fwd_off: &[usize], terminals: &[u32]) -> Vec<u32> {
    // rev_off[t]: first counted as the end of t's range (inclusive prefix sums of in-degrees),
    // then moved down to its start as the sources are filled in.
    let mut rev_off = vec![0usize; n + 1];
    for &t in fwd {
        rev_off[t as usize] += 1;
    }
    let mut total = 0;
    for o in rev_off.iter_mut() {
        total += *o;
        *o = total;
    }
    let mut rev = vec![0u32; fwd.len()];
    for (s, w) in fwd_off.windows(2).enumerate() {
        for &t in &fwd[w[0]..w[1]] {
            rev_off[t as usize] -= 1;
            rev[rev_off[t as usize]] = s as u32;
        }
    }

    let mut dist = vec![u32::MAX; n];
    let mut queue: Vec<u32> = Vec::with_capacity(terminals.len());
    for &t in terminals {
        dist[t as usize] = 0;
        queue.push(t);
    }
    let mut head = 0;
    while let Some(&t) = queue.get(head) {
        head += 1;
        let d = dist[t as usize] + 1;
        for &s in &rev[rev_off[t as usize]..rev_off[t as usize + 1]] {
            if dist[s as usize] == u32::MAX {
                dist[s as usize] = d;
                queue.push(s);
            }
        }
    }
    dist
}

// ---------------------------------------------------------------------------------------------
// Random walks
// ---------------------------------------------------------------------------------------------

/// splitmix64 (Steele, Lea, Flood): a tiny, good-enough PRNG for picking actions.
struct SplitMix64(u64);

impl SplitMix64 {
    /// The next 64 random bits.
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`), by multiply-shift (bias below 2^-32 for any `n` here).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// Up to `walks` random walks of at most `max_steps` actions each: every walk starts at a
/// random initial state and takes a uniformly random enabled action whose `next` is a different
/// state, until none is left or `max_steps`, calling [`Model::check`] on every state. Stops at
/// the first violation (with that walk's path) or once `deadline` has passed (not a failure).
/// Walk `w` draws from its own generator, seeded from `seed` and `w`: a fixed seed gives the
/// same walks.
pub(crate) fn random_walks<M: Model>(
    model: &M,
    seed: u64,
    walks: u32,
    max_steps: u32,
    deadline: Duration,
) -> WalkReport<M::State> {
    let start = Instant::now();
    let inits = model.init();
    let mut seeds = SplitMix64(seed);
    let mut seen: HashSet<u64, FxBuildHasher> = HashSet::default();
    let mut steps = 0u64;
    let mut started = 0u32;
    let mut actions = Vec::new();
    let mut path: Vec<(M::Action, M::State)> = Vec::new();
    let report = |outcome, started, steps, seen: &HashSet<u64, FxBuildHasher>| WalkReport {
        outcome,
        walks: started,
        steps,
        distinct_states_seen: seen.len(),
        elapsed: start.elapsed(),
    };

    'walks: for _ in 0..walks {
        if inits.is_empty() || start.elapsed() >= deadline {
            break;
        }
        started += 1;
        let mut rng = SplitMix64(seeds.next_u64());
        let init = &inits[rng.below(inits.len())];
        path.clear();
        seen.insert(fx_hash(init));
        let mut verdict = model.check(init);
        for step in 0..max_steps {
            if verdict.is_err() {
                break;
            }
            if step % 1024 == 1023 && start.elapsed() >= deadline {
                break 'walks;
            }
            let cur = path.last().map_or(init, |(_, s)| s);
            actions.clear();
            model.actions(cur, &mut actions);
            // Draw without replacement until one leads somewhere: uniform over those that do.
            let mut taken = None;
            while !actions.is_empty() {
                let a = actions.swap_remove(rng.below(actions.len()));
                if let Some(t) = model.next(cur, &a) {
                    if t != *cur {
                        taken = Some((a, t));
                        break;
                    }
                }
            }
            let Some((a, t)) = taken else {
                break;
            };
            steps += 1;
            seen.insert(fx_hash(&t));
            verdict = model.check(&t);
            path.push((a, t));
        }
        if let Err(message) = verdict {
            let cx = Counterexample {
                message,
                init: init.clone(),
                steps: path.drain(..).map(|(a, s)| (format!("{a:?}"), s)).collect(),
            };
            return report(WalkOutcome::Violation(cx), started, steps, &seen);
        }
    }
    report(WalkOutcome::Ok, started, steps, &seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generous limits for the toy models.
    fn limits(liveness_steps: Option<u32>) -> Limits {
        Limits {
            max_states: 1_000_000,
            timeout: Duration::from_secs(60),
            liveness_steps,
            fair_cycles: false,
        }
    }

    /// Two threads each add 1 to `x`. `locked: false`: read, then write `read + 1`, as two
    /// steps (lost update). `locked: true`: acquire a lock, read, then write and release.
    struct Counter {
        /// Whether the threads take the lock around their read and write.
        locked: bool,
    }

    /// A state of [`Counter`].
    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    struct CounterState {
        /// The shared variable.
        x: u8,
        /// Per thread: 0 idle, 1 holds the lock (locked only), 2 has read, 3 done.
        pc: [u8; 2],
        /// Per thread: the value read (0 before the read).
        tmp: [u8; 2],
    }

    impl Model for Counter {
        type State = CounterState;
        type Action = usize;
        fn init(&self) -> Vec<CounterState> {
            vec![CounterState {
                x: 0,
                pc: [0, 0],
                tmp: [0, 0],
            }]
        }
        fn actions(&self, _: &CounterState, out: &mut Vec<usize>) {
            out.extend([0, 1]);
        }
        fn next(&self, s: &CounterState, &t: &usize) -> Option<CounterState> {
            let mut s = s.clone();
            match s.pc[t] {
                0 if self.locked => {
                    if s.pc.iter().any(|&p| p == 1 || p == 2) {
                        return None;
                    }
                    s.pc[t] = 1;
                }
                0 | 1 => {
                    s.tmp[t] = s.x;
                    s.pc[t] = 2;
                }
                2 => {
                    s.x = s.tmp[t] + 1;
                    s.pc[t] = 3;
                }
                _ => return None,
            }
            Some(s)
        }
        fn is_fault(&self, _: &usize) -> bool {
            false
        }
        fn check(&self, s: &CounterState) -> Result<(), String> {
            if s.pc == [3, 3] && s.x != 2 {
                return Err(format!("lost update: both done, x = {}", s.x));
            }
            Ok(())
        }
        fn is_terminal(&self, s: &CounterState) -> bool {
            s.pc == [3, 3]
        }
    }

    #[test]
    fn the_racy_counter_loses_an_update_in_4_steps() {
        let r = check_exhaustive(&Counter { locked: false }, &limits(Some(10)));
        let Outcome::Violation(cx) = &r.outcome else {
            panic!("expected a violation: {r}");
        };
        assert_eq!(cx.steps.len(), 4, "{cx}");
        assert_eq!(cx.last_state().x, 1);
        assert_eq!(cx.last_state().pc, [3, 3]);
        assert!(cx.message.starts_with("lost update"), "{cx}");
        assert_eq!(r.max_depth, 4);
        assert_eq!(r.max_distance_to_terminal, None);
        // Both read before either writes.
        assert!(cx.steps[1].1.pc.iter().all(|&p| p == 2), "{cx}");
        let text = cx.to_string();
        assert!(text.starts_with("lost update: both done, x = 1\n  0. (initial state)\n     CounterState { x: 0, pc: [0, 0], tmp: [0, 0] }\n  1. "), "{text}");
        assert!(text.contains("\n  4. "), "{text}");
    }

    #[test]
    fn the_locked_counter_is_exhausted_with_13_states() {
        // By hand: both idle (1); one thread holding the lock, before or after its read, the
        // other idle (2 x 2); one done, the other idle (2); one done, the other holding the
        // lock before or after its read (2 x 2); both done, tmp = [0, 1] or [1, 0] (2): 13.
        // Edges: each order is a chain of 6 steps, 12 in all; depth 6.
        let r = check_exhaustive(&Counter { locked: true }, &limits(Some(6)));
        assert!(matches!(r.outcome, Outcome::Exhausted), "{r}");
        assert_eq!(r.states, 13);
        assert_eq!(r.edges, 12);
        assert_eq!(r.max_depth, 6);
        assert_eq!(r.max_distance_to_terminal, Some(6));

        // One step less is too few for the initial state.
        let r = check_exhaustive(&Counter { locked: true }, &limits(Some(5)));
        let Outcome::LivenessViolation(cx) = &r.outcome else {
            panic!("expected a liveness violation: {r}");
        };
        assert!(cx.steps.is_empty(), "{cx}");
        assert!(cx.message.contains("takes 6 steps"), "{cx}");

        // Exactly max_states states is still exhausted; one fewer is not.
        let tight = Limits {
            max_states: 13,
            ..limits(None)
        };
        let r = check_exhaustive(&Counter { locked: true }, &tight);
        assert!(matches!(r.outcome, Outcome::Exhausted), "{r}");
        let r = check_exhaustive(
            &Counter { locked: true },
            &Limits {
                max_states: 12,
                ..tight
            },
        );
        assert!(matches!(r.outcome, Outcome::Incomplete { .. }), "{r}");
        assert_eq!(r.states, 12);
    }

    /// A job that a worker starts and finishes, or that crashes (a fault) into a stuck state.
    struct Crashy;

    /// A state of [`Crashy`].
    #[derive(Clone, PartialEq, Eq, Hash, Debug)]
    enum Job {
        /// Not started.
        Idle,
        /// Running.
        Running,
        /// Crashed: nothing but a fault could get it out.
        Stuck,
        /// Finished.
        Done,
    }

    /// An action of [`Crashy`].
    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    enum JobStep {
        /// Idle to running.
        Start,
        /// Running to done.
        Finish,
        /// Running to stuck (a fault).
        Crash,
        /// Stuck to idle (a fault too: faults are not followed by the liveness check).
        Revive,
    }

    impl Model for Crashy {
        type State = Job;
        type Action = JobStep;
        fn init(&self) -> Vec<Job> {
            vec![Job::Idle, Job::Idle]
        }
        fn actions(&self, _: &Job, out: &mut Vec<JobStep>) {
            out.extend([
                JobStep::Start,
                JobStep::Finish,
                JobStep::Crash,
                JobStep::Revive,
            ]);
        }
        fn next(&self, s: &Job, a: &JobStep) -> Option<Job> {
            match (s, a) {
                (Job::Idle, JobStep::Start) => Some(Job::Running),
                (Job::Running, JobStep::Finish) => Some(Job::Done),
                (Job::Running, JobStep::Crash) => Some(Job::Stuck),
                (Job::Stuck, JobStep::Revive) => Some(Job::Idle),
                (Job::Done, _) => Some(Job::Done),
                _ => None,
            }
        }
        fn is_fault(&self, a: &JobStep) -> bool {
            matches!(a, JobStep::Crash | JobStep::Revive)
        }
        fn check(&self, _: &Job) -> Result<(), String> {
            Ok(())
        }
        fn is_terminal(&self, s: &Job) -> bool {
            *s == Job::Done
        }
    }

    #[test]
    fn a_fault_into_a_dead_end_is_a_liveness_violation() {
        let r = check_exhaustive(&Crashy, &limits(Some(100)));
        let Outcome::LivenessViolation(cx) = &r.outcome else {
            panic!("expected a liveness violation: {r}");
        };
        assert_eq!(*cx.last_state(), Job::Stuck, "{cx}");
        let actions: Vec<&str> = cx.steps.iter().map(|(a, _)| a.as_str()).collect();
        assert_eq!(actions, ["Start", "Crash"]);
        assert!(cx.message.contains("no fault-free path"), "{cx}");
        // Idle, Running, Done, Stuck (duplicate init state and Done's self-loop ignored).
        assert_eq!(r.states, 4);
        assert_eq!(r.edges, 4);
        assert_eq!(r.max_distance_to_terminal, Some(2));
        // Without liveness, nothing is wrong.
        let r = check_exhaustive(&Crashy, &limits(None));
        assert!(matches!(r.outcome, Outcome::Exhausted), "{r}");
        assert_eq!(r.max_distance_to_terminal, None);
    }

    /// A ring 0 → 1 → … → 4 → 0, with an exit from 2 to a terminal state, and a fault
    /// shortcut from 4 to 2 that the liveness check must not take.
    struct Ring;

    impl Model for Ring {
        type State = u8;
        type Action = &'static str;
        fn init(&self) -> Vec<u8> {
            vec![0]
        }
        fn actions(&self, s: &u8, out: &mut Vec<&'static str>) {
            if *s < 5 {
                out.push("next");
            }
            if *s == 2 {
                out.push("exit");
            }
            if *s == 4 {
                out.push("skip");
            }
        }
        fn next(&self, s: &u8, a: &&'static str) -> Option<u8> {
            Some(match *a {
                "next" => (s + 1) % 5,
                "exit" => 5,
                _ => 2,
            })
        }
        fn is_fault(&self, a: &&'static str) -> bool {
            *a == "skip"
        }
        fn check(&self, _: &u8) -> Result<(), String> {
            Ok(())
        }
        fn is_terminal(&self, s: &u8) -> bool {
            *s == 5
        }
    }

    #[test]
    fn a_cycle_with_an_exit_is_live_within_its_distance() {
        // Distances: 2 → 1, 1 → 2, 0 → 3, 4 → 4, 3 → 5 (not 4 → 2 via the fault).
        let r = check_exhaustive(&Ring, &limits(Some(5)));
        assert!(matches!(r.outcome, Outcome::Exhausted), "{r}");
        assert_eq!(r.states, 6);
        assert_eq!(r.edges, 7);
        assert_eq!(r.max_depth, 4);
        assert_eq!(r.max_distance_to_terminal, Some(5));

        let r = check_exhaustive(&Ring, &limits(Some(4)));
        let Outcome::LivenessViolation(cx) = &r.outcome else {
            panic!("expected a liveness violation: {r}");
        };
        assert_eq!(*cx.last_state(), 3);
        assert_eq!(cx.steps.len(), 3);
        assert!(cx.message.contains("takes 5 steps"), "{cx}");
        assert_eq!(r.max_distance_to_terminal, Some(5));
    }

    #[test]
    fn a_ring_whose_exit_is_not_always_enabled_is_a_fair_cycle() {
        // The exit is enabled at 2 only: going round and round takes `next`, the only step
        // enabled all along, so that run is fair and never ends, although every state reaches
        // the end within 5 steps.
        let fair = Limits {
            fair_cycles: true,
            ..limits(Some(5))
        };
        let r = check_exhaustive(&Ring, &fair);
        let Outcome::FairCycle(cx) = &r.outcome else {
            panic!("expected a fair cycle: {r}");
        };
        assert_eq!(r.cyclic_components, Some(1));
        assert!(cx.message.starts_with("fair cycle: 5 states"), "{cx}");
        // Reached at 0 (the initial state), then once around: 1, 2, 3, 4, 0.
        let around: Vec<u8> = cx.steps.iter().map(|(_, s)| *s).collect();
        assert_eq!(around, [1, 2, 3, 4, 0], "{cx}");
    }

    /// A spinner: 0 and 1 alternate by `spin`; `go` (enabled at both) leads to 2, the end.
    struct Spin;

    impl Model for Spin {
        type State = u8;
        type Action = &'static str;
        fn init(&self) -> Vec<u8> {
            vec![0]
        }
        fn actions(&self, s: &u8, out: &mut Vec<&'static str>) {
            if *s < 2 {
                out.extend(["spin", "go"]);
            }
        }
        fn next(&self, s: &u8, a: &&'static str) -> Option<u8> {
            Some(if *a == "spin" { 1 - s } else { 2 })
        }
        fn is_fault(&self, _: &&'static str) -> bool {
            false
        }
        fn check(&self, _: &u8) -> Result<(), String> {
            Ok(())
        }
        fn is_terminal(&self, s: &u8) -> bool {
            *s == 2
        }
    }

    #[test]
    fn a_cycle_that_never_takes_a_step_enabled_throughout_is_not_fair() {
        let fair = Limits {
            fair_cycles: true,
            ..limits(Some(1))
        };
        let r = check_exhaustive(&Spin, &fair);
        assert!(matches!(r.outcome, Outcome::Exhausted), "{r}");
        assert_eq!(r.cyclic_components, Some(1));
    }

    /// A counter that counts forever.
    struct Unbounded;

    impl Model for Unbounded {
        type State = u64;
        type Action = ();
        fn init(&self) -> Vec<u64> {
            vec![0]
        }
        fn actions(&self, _: &u64, out: &mut Vec<()>) {
            out.push(());
        }
        fn next(&self, s: &u64, _: &()) -> Option<u64> {
            Some(s + 1)
        }
        fn is_fault(&self, _: &()) -> bool {
            false
        }
        fn check(&self, _: &u64) -> Result<(), String> {
            Ok(())
        }
        fn is_terminal(&self, _: &u64) -> bool {
            false
        }
    }

    #[test]
    fn an_unbounded_model_is_incomplete() {
        let small = Limits {
            max_states: 100,
            ..limits(Some(10))
        };
        let r = check_exhaustive(&Unbounded, &small);
        let Outcome::Incomplete { reason } = &r.outcome else {
            panic!("expected incomplete: {r}");
        };
        assert!(reason.contains("max_states (100)"), "{reason}");
        assert_eq!(r.states, 100);
        assert_eq!(r.max_depth, 99);
        assert_eq!(r.max_distance_to_terminal, None);

        let no_time = Limits {
            timeout: Duration::ZERO,
            ..limits(None)
        };
        let r = check_exhaustive(&Unbounded, &no_time);
        let Outcome::Incomplete { reason } = &r.outcome else {
            panic!("expected incomplete: {r}");
        };
        assert!(reason.starts_with("timeout"), "{reason}");
    }

    #[test]
    fn the_table_grows_and_deduplicates() {
        // 200 000 states (many table growths), each reached twice.
        struct Grid;
        impl Model for Grid {
            type State = (u32, u32);
            type Action = u8;
            fn init(&self) -> Vec<(u32, u32)> {
                vec![(0, 0)]
            }
            fn actions(&self, _: &(u32, u32), out: &mut Vec<u8>) {
                out.extend([0, 1]);
            }
            fn next(&self, &(a, b): &(u32, u32), &d: &u8) -> Option<(u32, u32)> {
                match d {
                    0 if a < 399 => Some((a + 1, b)),
                    1 if b < 499 => Some((a, b + 1)),
                    _ => None,
                }
            }
            fn is_fault(&self, _: &u8) -> bool {
                false
            }
            fn check(&self, _: &(u32, u32)) -> Result<(), String> {
                Ok(())
            }
            fn is_terminal(&self, s: &(u32, u32)) -> bool {
                *s == (399, 499)
            }
        }
        let r = check_exhaustive(&Grid, &limits(Some(898)));
        assert!(matches!(r.outcome, Outcome::Exhausted), "{r}");
        assert_eq!(r.states, 400 * 500);
        assert_eq!(r.edges, 399 * 500 + 400 * 499);
        assert_eq!(r.max_depth, 898);
        assert_eq!(r.max_distance_to_terminal, Some(898));
    }

    #[test]
    fn states_with_equal_hashes_stay_distinct() {
        /// A number whose hash is constant: every state collides, tag included.
        #[derive(Clone, PartialEq, Eq, Debug)]
        struct Colliding(u32);
        impl Hash for Colliding {
            fn hash<H: Hasher>(&self, _: &mut H) {}
        }
        /// Counts from 0 to 2999 along two paths (+1, and +2 from even numbers).
        struct Slow;
        impl Model for Slow {
            type State = Colliding;
            type Action = u32;
            fn init(&self) -> Vec<Colliding> {
                vec![Colliding(0), Colliding(0)]
            }
            fn actions(&self, s: &Colliding, out: &mut Vec<u32>) {
                out.push(1);
                if s.0 % 2 == 0 {
                    out.push(2);
                }
            }
            fn next(&self, s: &Colliding, d: &u32) -> Option<Colliding> {
                (s.0 + d < 3000).then(|| Colliding(s.0 + d))
            }
            fn is_fault(&self, _: &u32) -> bool {
                false
            }
            fn check(&self, _: &Colliding) -> Result<(), String> {
                Ok(())
            }
            fn is_terminal(&self, s: &Colliding) -> bool {
                s.0 == 2999
            }
        }
        // Depth and distance: 0 → 2 → … → 2998 → 2999 (1500 steps).
        let r = check_exhaustive(&Slow, &limits(Some(1500)));
        assert!(matches!(r.outcome, Outcome::Exhausted), "{r}");
        assert_eq!(r.states, 3000);
        assert_eq!(r.edges, 2999 + 1499);
        assert_eq!(r.max_depth, 1500);
        assert_eq!(r.max_distance_to_terminal, Some(1500));
    }

    #[test]
    fn random_walks_find_the_lost_update_deterministically() {
        let deadline = Duration::from_secs(60);
        let racy = Counter { locked: false };
        let a = random_walks(&racy, 7, 1000, 100, deadline);
        let WalkOutcome::Violation(cx) = &a.outcome else {
            panic!("expected a violation: {a}");
        };
        assert_eq!(cx.last_state().x, 1, "{cx}");
        assert_eq!(cx.steps.len(), 4, "{cx}");
        assert!(a.walks >= 1 && a.walks <= 1000);
        assert_eq!(a.steps, 4 * u64::from(a.walks));

        let b = random_walks(&racy, 7, 1000, 100, deadline);
        assert_eq!((a.walks, a.steps), (b.walks, b.steps));
        assert_eq!(a.distinct_states_seen, b.distinct_states_seen);
        assert_eq!(a.outcome.to_string(), b.outcome.to_string());

        // The locked counter: every walk runs to the end (6 steps), and 1000 walks see both
        // orders, so all 13 states.
        let ok = random_walks(&Counter { locked: true }, 7, 1000, 100, deadline);
        assert!(matches!(ok.outcome, WalkOutcome::Ok), "{ok}");
        assert_eq!(ok.walks, 1000);
        assert_eq!(ok.steps, 6000);
        assert_eq!(ok.distinct_states_seen, 13);

        // max_steps cuts walks short; a passed deadline stops before the first walk.
        let short = random_walks(&Counter { locked: true }, 7, 10, 2, deadline);
        assert_eq!(short.steps, 20);
        let none = random_walks(&Counter { locked: true }, 7, 10, 2, Duration::ZERO);
        assert_eq!((none.walks, none.steps), (0, 0));
    }
}
