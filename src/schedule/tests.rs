use super::*;

fn at(s: &str) -> SystemTime {
    SystemTime::from(s.parse::<Timestamp>().unwrap())
}

fn id(t: SystemTime) -> String {
    Timestamp::try_from(t).unwrap().to_string()
}

/// A small deterministic generator (xorshift64*), so a failing sample can be replayed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The binding property, checked against the calendar alone: the occurrence of a run at `now`
/// is a tick `T` with `T − E_T <= now < N − E_N` (`N` the next tick), and waiting
/// `until_due(now)` never starts the run before `T`.
fn check_binding(s: &Schedule, now: SystemTime) {
    let occ = s.occurrence_at(now).expect("an occurrence");
    let t = occ.tick();
    assert_eq!(
        s.occurrence_of_tick(t).as_ref(),
        Some(&occ),
        "{s}: {} is not a tick",
        id(t)
    );
    let e_t = occ.early_tolerance();
    assert!(e_t <= s.early_tolerance());
    assert!(
        now + e_t >= t,
        "{s}: run at {} bound to {}, more than E = {e_t:?} ahead",
        id(now),
        id(t)
    );
    let n = s.next_after(t).expect("a next tick");
    assert_eq!(occ.next_tick(), Some(n));
    let e_n = s.occurrence_of_tick(n).unwrap().early_tolerance();
    assert!(
        now + e_n < n,
        "{s}: run at {} bound to {} but is within E = {e_n:?} of the next tick {}",
        id(now),
        id(t),
        id(n)
    );
    // Each tolerance is at most half the gap before its tick: the windows never overlap.
    assert!(e_n <= n.duration_since(t).unwrap() / 2);
    // The run waits for a coming tick: it never starts before it.
    assert!(now + occ.until_due(now) >= t);
    // The outcome, written at the tick at the earliest, outlives every run that can still bind
    // to the tick (this one included) and the catch-up's look at it (until the next tick).
    let kept_until = t + occ.retention_floor();
    assert!(
        kept_until >= n + RETENTION_CLOCK_MARGIN && kept_until > now + RETENTION_CLOCK_MARGIN,
        "{s}: the outcome of {} would expire at {} while a run can still bind to it",
        id(t),
        id(kept_until)
    );
}

fn samples(s: &Schedule, seed: u64, span: Duration, count: usize) {
    let base = at("2026-01-01T00:00:00Z");
    let mut rng = Rng(seed);
    for _ in 0..count {
        let now = base + Duration::from_millis(rng.below(span.as_millis() as u64));
        check_binding(s, now);
    }
}

#[test]
fn every_binds_each_run_to_one_tick() {
    let mut rng = Rng(7);
    for _ in 0..40 {
        let period = Duration::from_millis(1000 + rng.below(3 * 86_400_000));
        let offset = Duration::from_millis(rng.below(period.as_millis() as u64));
        let early = Duration::from_millis(rng.below(2 * period.as_millis() as u64));
        let s = Schedule::every(period)
            .unwrap()
            .offset(offset)
            .unwrap()
            .early(early);
        samples(&s, rng.next() | 1, period * 20, 500);
    }
}

#[test]
fn cron_with_irregular_gaps_binds_each_run_to_one_tick() {
    for (expr, zone, early) in [
        ("0 2,3 * * *", "UTC", 60),
        ("0 2,3 * * *", "UTC", 7200),
        ("*/7 * * * * *", "UTC", 60),
        ("0,1,30 9 * * 1-5", "UTC", 45),
        ("30 2 * * *", "Europe/Paris", 600),
        ("*/30 * * * *", "Europe/Paris", 3600),
        ("0 0 L * *", "America/New_York", 86_400),
        ("15 1 * * *", "America/New_York", 60),
    ] {
        let s = Schedule::cron_in(expr, zone)
            .unwrap()
            .early(Duration::from_secs(early));
        samples(&s, 11, Duration::from_secs(366 * 86_400), 400);
    }
}

#[test]
fn runs_around_daylight_saving_changes_bind_to_one_tick() {
    // Dense samples around both of 2026's transitions in Paris and New York.
    for (expr, zone, from) in [
        ("30 2 * * *", "Europe/Paris", "2026-03-28T00:00:00Z"),
        ("30 2 * * *", "Europe/Paris", "2026-10-24T00:00:00Z"),
        ("*/30 * * * *", "Europe/Paris", "2026-03-29T00:00:00Z"),
        ("*/30 * * * *", "Europe/Paris", "2026-10-25T00:00:00Z"),
        ("30 1 * * *", "America/New_York", "2026-11-01T00:00:00Z"),
        ("30 2 * * *", "America/New_York", "2026-03-08T00:00:00Z"),
    ] {
        let s = Schedule::cron_in(expr, zone).unwrap();
        let mut rng = Rng(3);
        for _ in 0..300 {
            check_binding(&s, at(from) + Duration::from_secs(rng.below(2 * 86_400)));
        }
    }
}

#[test]
fn every_ticks_count_from_the_epoch_plus_the_offset() {
    let s = Schedule::every(Duration::from_secs(86_400))
        .unwrap()
        .offset(Duration::from_secs(7200))
        .unwrap();
    let occ = s.occurrence_at(at("2026-11-26T01:59:30Z")).unwrap();
    assert_eq!(
        occ.id(),
        "2026-11-26T02:00:00Z",
        "30 s early binds to the coming tick"
    );
    assert_eq!(
        occ.until_due(at("2026-11-26T01:59:30Z")),
        Duration::from_secs(30)
    );
    let occ = s.occurrence_at(at("2026-11-26T01:58:59Z")).unwrap();
    assert_eq!(
        occ.id(),
        "2026-11-25T02:00:00Z",
        "61 s early binds to the last tick"
    );
    let occ = s.occurrence_at(at("2026-11-27T01:00:00Z")).unwrap();
    assert_eq!(
        occ.id(),
        "2026-11-26T02:00:00Z",
        "23 h late still binds to it"
    );
    assert_eq!(
        occ.job_key("nightly-report"),
        format!("nightly-report@{}@2026-11-26T02:00:00Z", s.digest())
    );
    assert_eq!(
        occ.default_retention(Duration::from_secs(30)),
        Duration::from_secs(2 * 86_400)
    );
    let short = Schedule::every(Duration::from_secs(1)).unwrap();
    let occ = short.occurrence_at(at("2026-11-26T02:00:00.6Z")).unwrap();
    assert_eq!(
        occ.id(),
        "2026-11-26T02:00:01Z",
        "E is capped at half the period"
    );
    assert_eq!(occ.early_tolerance(), Duration::from_millis(500));
    assert_eq!(
        occ.default_retention(Duration::from_secs(30)),
        Duration::from_secs(600)
    );
    assert_eq!(short.to_string(), "every 1s");
    assert_eq!(s.to_string(), "every 1d offset 2h");
}

#[test]
fn spring_forward_runs_a_skipped_fixed_time_at_the_end_of_the_gap() {
    // Paris, 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 does not exist that day.
    let s = Schedule::cron_in("30 2 * * *", "Europe/Paris").unwrap();
    let ticks: Vec<String> = std::iter::successors(s.next_after(at("2026-03-28T12:00:00Z")), |t| {
        s.next_after(*t)
    })
    .take(3)
    .map(id)
    .collect();
    // 03:00 CEST (01:00Z) on the day of the gap, 02:30 CEST (00:30Z) after it.
    assert_eq!(
        ticks,
        [
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:30:00Z",
            "2026-03-31T00:30:00Z"
        ]
    );
    // An interval job has no ticks in the gap: 01:30 CET (00:30Z), then 03:00 CEST (01:00Z).
    let s = Schedule::cron_in("*/30 * * * *", "Europe/Paris").unwrap();
    assert_eq!(
        s.next_after(at("2026-03-29T00:30:00Z")).map(id).as_deref(),
        Some("2026-03-29T01:00:00Z")
    );
}

#[test]
fn fall_back_runs_a_fixed_time_once_and_an_interval_at_each_pass() {
    // Paris, 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:00–02:59 happen twice.
    let s = Schedule::cron_in("30 2 * * *", "Europe/Paris").unwrap();
    let ticks: Vec<String> = std::iter::successors(s.next_after(at("2026-10-24T12:00:00Z")), |t| {
        s.next_after(*t)
    })
    .take(2)
    .map(id)
    .collect();
    // Once, at the first pass (02:30 CEST = 00:30Z), then 02:30 CET (01:30Z) the next day.
    assert_eq!(ticks, ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]);
    let s = Schedule::cron_in("*/30 * * * *", "Europe/Paris").unwrap();
    let ticks: Vec<String> = std::iter::successors(s.next_after(at("2026-10-25T00:10:00Z")), |t| {
        s.next_after(*t)
    })
    .take(4)
    .map(id)
    .collect();
    // 02:30 CEST, 02:00 CET, 02:30 CET, 03:00 CET: every half hour of real time.
    assert_eq!(
        ticks,
        [
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T02:00:00Z"
        ]
    );
}

#[test]
fn bad_schedules_name_their_field() {
    let field = |r: Result<Schedule, ConfigError>| match r {
        Err(ConfigError::Invalid { field, reason }) => format!("{field}: {reason}"),
        Ok(s) => panic!("accepted {s}"),
    };
    assert!(field(Schedule::cron("61 * * * *")).starts_with("cron: \"61 * * * *\": minute field"));
    assert!(field(Schedule::cron("0 25 * * *")).contains("hour field \"25\""));
    assert!(field(Schedule::cron("0 0 * * * * *")).starts_with("cron:"));
    assert!(field(Schedule::cron("* * *")).starts_with("cron:"));
    assert!(field(Schedule::cron("")).starts_with("cron:"));
    assert!(field(Schedule::cron("0 0 30 2 *")).contains("matches no time"));
    assert!(field(Schedule::cron_in("0 2 * * *", "Mars/Olympus")).starts_with("tz:"));
    assert!(field(Schedule::every(Duration::from_millis(999))).starts_with("every:"));
    assert!(field(Schedule::every(Duration::from_micros(1_000_500))).starts_with("every:"));
    let day = Schedule::every(Duration::from_secs(86_400)).unwrap();
    assert!(field(day.clone().offset(Duration::from_secs(86_400))).starts_with("offset:"));
    assert!(field(
        Schedule::cron("0 2 * * *")
            .unwrap()
            .offset(Duration::from_secs(1))
    )
    .starts_with("offset:"));
    // Whitespace does not change the schedule, the zone does.
    assert_eq!(
        Schedule::cron(" 0  2 * * * ").unwrap().digest(),
        Schedule::cron("0 2 * * *").unwrap().digest()
    );
    assert_ne!(
        Schedule::cron_in("0 2 * * *", "Europe/Paris")
            .unwrap()
            .digest(),
        Schedule::cron("0 2 * * *").unwrap().digest()
    );
    assert_ne!(
        day.digest(),
        Schedule::every(Duration::from_secs(86_400))
            .unwrap()
            .offset(Duration::from_secs(1))
            .unwrap()
            .digest()
    );
}

#[test]
fn the_digest_is_a_protocol_constant() {
    // Changing these re-runs every occurrence of every deployed schedule.
    assert_eq!(
        Schedule::every(Duration::from_secs(86_400))
            .unwrap()
            .digest(),
        digest("every:86400000:0")
    );
    assert_eq!(digest(""), "cbf29ce48422");
    assert_eq!(digest("a"), "af63dc4c8601");
}

#[test]
fn occurrence_job_names_split_back_into_their_parts() {
    let s = Schedule::every(Duration::from_secs(60)).unwrap();
    let digest = s.digest().to_string();
    let name = format!("a@b@{digest}@2026-11-26T02:00:00Z");
    assert_eq!(
        split_job_key(&name),
        Some(("a@b", digest.as_str(), "2026-11-26T02:00:00Z"))
    );
    for other in [
        "plain",
        "a@b",
        "a@short@t",
        "@0123456789ab@t",
        "a@0123456789ab@",
    ] {
        assert_eq!(split_job_key(other), None, "{other}");
    }
}

#[test]
fn the_retention_floor_outlasts_the_binding_window_of_an_every_tick() {
    let lease = Duration::from_millis(500);
    // The CLI repro: `--every 10s --retention 1s`. E of the next tick is 5 s (half the gap).
    let s = Schedule::every(Duration::from_secs(10)).unwrap();
    let occ = s.occurrence_at(at("2026-11-26T02:00:00.2Z")).unwrap();
    assert_eq!(occ.id(), "2026-11-26T02:00:00Z");
    let floor = Duration::from_secs(10 + 5) + RETENTION_CLOCK_MARGIN;
    assert_eq!(occ.retention_floor(), floor);
    assert_eq!(
        occ.retention(Some(Duration::from_secs(1)), lease),
        floor,
        "a shorter retention is raised"
    );
    assert_eq!(
        occ.retention(Some(Duration::from_secs(60)), lease),
        Duration::from_secs(60),
        "a longer one is kept"
    );
    assert_eq!(occ.retention(None, lease), MIN_DEFAULT_RETENTION);
    // A day: E is the full minute.
    let daily = Schedule::every(Duration::from_secs(86_400)).unwrap();
    let occ = daily.occurrence_at(at("2026-11-26T12:00:00Z")).unwrap();
    assert_eq!(
        occ.retention_floor(),
        Duration::from_secs(86_400 + 60) + RETENTION_CLOCK_MARGIN
    );
    assert_eq!(
        occ.retention(Some(Duration::from_secs(3600)), lease),
        occ.retention_floor()
    );
    assert_eq!(
        occ.default_retention(lease),
        Duration::from_secs(2 * 86_400)
    );
}

#[test]
fn the_retention_floor_follows_each_gap_of_an_irregular_cron() {
    let lease = Duration::from_secs(30);
    // 02:00 and 03:00: gaps of 1 h and 23 h. With E = 1 h, the 03:00 tick's E is capped at
    // 30 min (half the gap before it), the 02:00 tick's is the full hour.
    let s = Schedule::cron("0 2,3 * * *")
        .unwrap()
        .early(Duration::from_secs(3600));
    let two = s.occurrence_of_tick(at("2026-11-26T02:00:00Z")).unwrap();
    assert_eq!(
        two.retention_floor(),
        Duration::from_secs(3600 + 1800) + RETENTION_CLOCK_MARGIN
    );
    let three = s.occurrence_of_tick(at("2026-11-26T03:00:00Z")).unwrap();
    assert_eq!(
        three.retention_floor(),
        Duration::from_secs(23 * 3600 + 3600) + RETENTION_CLOCK_MARGIN
    );
    let two_hours = Some(Duration::from_secs(7200));
    assert_eq!(
        two.retention(two_hours, lease),
        Duration::from_secs(7200),
        "above the short gap's floor: kept"
    );
    assert_eq!(
        three.retention(two_hours, lease),
        three.retention_floor(),
        "below the long gap's floor: raised"
    );
    // A run 22 h late still binds to 03:00; its outcome is still there.
    let late = at("2026-11-27T00:59:00Z");
    assert_eq!(s.occurrence_at(late), Some(three.clone()));
    assert!(three.tick() + three.retention(two_hours, lease) > late);
}

#[test]
fn retentions_stay_within_the_coordinators_ten_years() {
    let s = Schedule::every(MAX_PERIOD).unwrap();
    let occ = s.occurrence_at(at("2026-11-26T02:00:00Z")).unwrap();
    assert_eq!(occ.retention_floor(), MAX_RETENTION);
    assert_eq!(
        occ.default_retention(Duration::from_secs(30)),
        MAX_RETENTION,
        "two periods would be twenty years"
    );
}

/// The jitter's hash is a protocol constant (every host, every version, the same start):
/// these values pin it.
#[test]
fn the_jitter_is_a_protocol_constant() {
    let s = Schedule::every(Duration::from_secs(3600)).unwrap();
    let occ = s.occurrence_of_tick(at("2026-11-26T02:00:00Z")).unwrap();
    let lease = Duration::from_secs(30);
    let d = Duration::from_secs(600);
    let hash = fmix64(fnv1a(&[
        b"nightly-report\0",
        s.digest().as_bytes(),
        b"\0",
        b"1795658400000",
    ]));
    assert_eq!(
        occ.jitter("nightly-report", d, lease),
        Duration::from_millis(hash % 600_000)
    );
    // Computed independently (Python): the digest fffd879560a4, j = 5.04 s.
    assert_eq!(s.digest(), "fffd879560a4");
    assert_eq!(
        occ.jitter("nightly-report", d, lease),
        Duration::from_millis(5040)
    );
    assert_eq!(
        occ.jittered_start("nightly-report", d, lease),
        occ.tick() + occ.jitter("nightly-report", d, lease)
    );
    // FNV-1a of the empty input is its offset basis; the finalizer is MurmurHash3's.
    assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fmix64(0), 0);
    assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
}

/// `j` lies in `[0, D)`, the start never before the tick, and always before the next tick's
/// window opens by at least the lease, for `every` and irregular cron expressions alike.
#[test]
fn the_jittered_start_stays_inside_the_occurrences_window() {
    let mut rng = Rng(0x5eed_1177);
    let schedules = [
        Schedule::every(Duration::from_secs(10)).unwrap(),
        Schedule::cron("0 2,3 * * *").unwrap(),
        Schedule::cron_in("*/30 * * * *", "Europe/Paris").unwrap(),
    ];
    for s in &schedules {
        let mut now = at("2026-10-24T00:00:00Z");
        for _ in 0..300 {
            now += Duration::from_millis(rng.below(3_600_000));
            let occ = s.occurrence_at(now).unwrap();
            let d = Duration::from_millis(1 + rng.below(4 * 3_600_000));
            let lease = Duration::from_millis(10 + rng.below(60_000));
            let key = format!("job-{}", rng.below(1000));
            let j = occ.jitter(&key, d, lease);
            assert!(j < d, "{s}: j {j:?} not below D {d:?}");
            let start = occ.jittered_start(&key, d, lease);
            assert!(start >= occ.tick());
            let next = occ.next_tick().unwrap();
            let opens = next - s.occurrence_of_tick(next).unwrap().early_tolerance();
            assert!(
                start + lease <= opens || j.is_zero(),
                "{s}: start {} plus the lease reaches the next window ({})",
                id(start),
                id(opens)
            );
            // The binding rule is unchanged: a run at the start binds to this occurrence.
            assert_eq!(s.occurrence_at(start), Some(occ.clone()));
        }
    }
}

/// A jitter longer than the room is reduced to it; with no room left there is none; the
/// calendar's last tick has no cap.
#[test]
fn a_jitter_that_does_not_fit_is_reduced_to_the_room() {
    let s = Schedule::every(Duration::from_secs(10)).unwrap();
    let occ = s.occurrence_of_tick(at("2026-11-26T02:00:00Z")).unwrap();
    // Window: 10 s − E (5 s, half the period) = 5 s; minus a 2 s lease: 3 s.
    let lease = Duration::from_secs(2);
    assert_eq!(occ.jitter_room(lease), Duration::from_secs(3));
    for key in (0..200).map(|k| format!("k{k}")) {
        assert!(occ.jitter(&key, Duration::from_secs(9), lease) < Duration::from_secs(3));
    }
    assert_eq!(occ.jitter_room(Duration::from_secs(5)), Duration::ZERO);
    assert_eq!(
        occ.jitter("k", Duration::from_secs(9), Duration::from_secs(6)),
        Duration::ZERO
    );
    assert_eq!(occ.jitter("k", Duration::ZERO, lease), Duration::ZERO);
}

#[test]
fn a_jitter_longer_than_the_period_is_refused_naming_both() {
    let now = at("2026-11-26T02:00:00Z");
    let every = Schedule::every(Duration::from_secs(60)).unwrap();
    assert!(every.check_jitter(Duration::from_secs(60), now).is_ok());
    let err = every
        .check_jitter(Duration::from_secs(61), now)
        .unwrap_err();
    let ConfigError::Invalid { field, reason } = &err;
    assert_eq!(*field, "jitter");
    assert!(
        reason.contains("61s is longer than the period of every 1m (60s)"),
        "{reason}"
    );
    // A cron expression's shortest gap: one hour between 02:00 and 03:00.
    let cron = Schedule::cron("0 2,3 * * *").unwrap();
    assert!(cron.check_jitter(Duration::from_secs(3600), now).is_ok());
    let err = cron
        .check_jitter(Duration::from_secs(3601), now)
        .unwrap_err();
    assert!(err.to_string().contains("shortest gap"), "{err}");
}
