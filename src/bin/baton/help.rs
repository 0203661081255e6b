//! The long help texts (`baton --help`, `baton lock --help`, …): the exit status tables and what
//! each command promises about PROGRAM. Prose this long would bury the flag definitions in
//! cli.rs; the tests check the tables against the statuses in exit.rs.

/// `baton --help`: the overview. Each command's own `--help` carries its manual and its exit
/// statuses in full; this says where to read, and what the statuses mean across commands.
pub(crate) const OVERVIEW: &str = "\
Each command's --help is its manual: its flags, what PROGRAM gets, signals, examples and its
exit statuses in full (`baton run --help`, `baton lock --help`, …). docs/cli.md covers every
command, README.md the tour.

Examples:
  baton run --key nightly-report -- /usr/local/bin/report
  baton lock --key backups --wait 5m -- /usr/local/bin/backup
  baton leader --key scheduler -- /usr/local/bin/scheduler
  baton status

Exit statuses, the same cause exiting the same way in every command (sysexits where one fits):
  0        done
  N        PROGRAM's own status (run, schedule, lock, leader; 128+n when signal n ended it)
  126/127  PROGRAM could not be executed / was not found
  64       usage or configuration error (checked before connecting)
  65       stored state holds a value baton never writes
  69       the server could not be reached (transient: trying again later may help)
  74       a lease was lost while PROGRAM ran (an attempt, a lock), or a success's outcome is
           unknown
  75       nothing done here, try later: the job is exhausted, --wait ran out, another grant or
           attempt holds the key now
  77       the server refused the credentials or a command (no retry helps)
  78       the server rejects the configuration, or the URL names a server that is not Redis
           (no retry helps)
  129/130/131/143
           baton got SIGHUP/SIGINT/SIGQUIT/SIGTERM";

pub(crate) const EXIT_STATUSES: &str = "\
Exit statuses of `baton run`:
  0        the job ended DONE (by this process or another one)
  N        PROGRAM's own status when this process ran an attempt that failed
           (128+n when signal n ended it, e.g. 130 after Ctrl-C in a terminal)
  126/127  PROGRAM could not be executed / was not found (the attempt is failed)
  64       usage or configuration error (checked before connecting), or an operation the
           URL's backend does not have
  65       the job's stored state is corrupt (a value baton never writes)
  69       the server (Redis or PostgreSQL) could not be reached: no server of the
           deployment answered within --connect-timeout, or it kept failing for longer than
           --give-up-after (transient: trying again later may help)
  74       this process lost its attempt: lease lost (also when baton was stopped, e.g. by
           Ctrl-Z, for longer than the lease), PROGRAM stopped by the guard (no extension was
           confirmed by the lease's deadline while baton could not act: stopped by SIGSTOP,
           blocked, starved of CPU), deadline passed (--no-watchdog), --max-hold reached, a
           success that could no longer be recorded, or a success whose outcome is unknown
           (the job may or may not be DONE: check `baton status`)
  75       the job is exhausted and this process ran no attempt
  77       the server refused the credentials or a command: a wrong password or unknown user
           (Redis WRONGPASS, PostgreSQL 28P01/28000), an ACL denial (Redis NOPERM), a missing
           privilege (PostgreSQL 42501); no retry helps
  78       the server rejects the configuration: a database index out of range (Redis), an
           unknown database (PostgreSQL 3D000), baton's tables missing where this role may not
           create them (run `baton migrate` as their owner); or the URL names a server that is
           not Redis (\"HOST:PORT is not a Redis server (it answered …)\", e.g. an HTTP or SSH
           port); no retry helps
  129/130/131/143
           baton got SIGHUP/SIGINT/SIGQUIT/SIGTERM (forwarded to PROGRAM; the attempt is failed;
           while waiting for an attempt or for the tick, nothing ran)
PROGRAM's own statuses can collide with these; use --json or --events to tell them apart.
`status`, `watch`, `fail` and `reset` exit 0 on success, 64 on usage errors (and when a live
job needs --yes), 65 on a corrupt state, 69 when the server is unreachable, 77 and 78 as above;
`watch` exits 75 when the job ends EXHAUSTED. `migrate` exits 0 when the tables exist (made now
or before; with a Redis URL there is nothing to make), 69, 77 or 78 as above.

PROGRAM gets BATON_KEY (--key), BATON_JOB (the job's key: --key, or the occurrence's
KEY@DIGEST@TICK), BATON_ATTEMPT, BATON_LAST_ATTEMPT (true/false), BATON_FENCING_TOKEN and, with a
schedule, BATON_OCCURRENCE (the tick, RFC 3339 in UTC) in its environment; its stdin, stdout and stderr pass through. It runs in its own process group,
which gets SIGTERM (then SIGCONT, so a stopped PROGRAM acts on it) and then SIGKILL when the
attempt is lost or runs out of time. Nothing in that group outlives baton: when PROGRAM exits,
what it left running there gets SIGTERM, then SIGKILL after --kill-grace, and is gone before
DONE is written or the attempt failed; when baton dies, even by SIGKILL (the OOM killer), a
guard process (`baton-guard` in ps) kills the whole group at once. The guard also enforces the
lease when baton itself cannot (stopped by SIGSTOP or a frozen cgroup, blocked, starved of CPU):
baton tells it each deadline the server confirmed, and it sends the group SIGTERM
min(--kill-grace, lease/4) before that deadline and SIGKILL just before it (a twentieth of the
lease, at most 250ms), counting time the host spent suspended; baton then says \"stopped by the
guard\", fails the attempt and exits 74. baton's own output never holds it up: a stderr or
--events file nobody reads loses lines (counted: \"N messages dropped\"), never the lease. What
escapes: a descendant that calls setsid or setpgid (a daemon's double fork, a shell with job
control) leaves the group; a whole host or VM paused pauses the guard too. A lease cannot stop
a paused or partitioned holder in time: pass BATON_FENCING_TOKEN to what PROGRAM writes to.

In a terminal, `baton run` is a well-behaved job: when stdin is a terminal and baton runs in the
foreground, PROGRAM's process group gets the terminal (PROGRAM can read it; Ctrl-C and Ctrl-Z
reach it, and PROGRAM ended by Ctrl-C fails the attempt with 130) and baton takes it back
before exiting. SIGHUP, SIGINT, SIGQUIT and SIGTERM sent to
baton are forwarded to PROGRAM's group (unless baton started with them ignored, as under nohup).
Ctrl-Z (or SIGTSTP sent to baton) stops PROGRAM and baton; the lease is not kept alive meanwhile,
and the guard kills PROGRAM's group when it runs out. On `fg`/`bg` baton first checks that it
still holds its attempt: if the lease ran out, PROGRAM is killed and baton exits 74.

With a schedule (--every DURATION [--offset DURATION], or --cron EXPR [--tz ZONE]) the job is one
occurrence of it, KEY@DIGEST@TICK (DIGEST names the schedule: two schedules on one key never
share an occurrence). TICK is the latest tick at or before now + E, E being --early (60s by
default) capped at half the gap before the tick, and now the coordination server's clock (Redis
TIME, PostgreSQL clock_timestamp()), never this host's. What that guarantees, on every server
that runs the same line: a run that starts in [TICK - E, next tick - E) binds to TICK, so a cron
that fires a little early or late (or a timer catching up after boot) still finds its
occurrence; each occurrence runs once across the fleet, with attempts and backups as above
(a failed attempt is retried within the occurrence); PROGRAM never starts before its tick by the
server's clock (a run bound to a coming tick waits for it). DONE/EXHAUSTED of an occurrence are
kept two periods (at least 10m) unless --retention says otherwise, and never less than the gap
to the next tick plus its E plus 5s: a late run can still bind to the tick until then, so a
shorter --retention is raised (baton says so once). baton says which occurrence it bound to on
stderr (--json: an \"occurrence\" event; both name the job key). `baton status --key
'KEY@DIGEST@TICK'` shows an occurrence's job.

Crontab example (every server runs it; exactly one runs the report of each night at 02:00 in
Paris, a backup retries it if it fails; cron's own time only has to fall within a day after the
tick, or a minute before it):
  0 2 * * *  baton run --quiet --key nightly-report --cron '0 2 * * *' --tz Europe/Paris -- /usr/local/bin/report

systemd timer example (on every server: the timer starts the oneshot service, Persistent= runs a
missed night after boot, which binds to that night's tick within a day):
  # /etc/systemd/system/nightly-report.service
  [Service]
  Type=oneshot
  ExecStart=/usr/local/bin/baton run --key nightly-report --every 24h --offset 2h -- /usr/local/bin/report
  # /etc/systemd/system/nightly-report.timer
  [Timer]
  OnCalendar=*-*-* 02:00:00 UTC
  Persistent=true
  [Install]
  WantedBy=timers.target
`baton schedule` is the long-running form, with no crontab or timer.";

pub(crate) const SCHEDULE_HELP: &str = "\
Exit statuses of `baton schedule`:
  0        baton got SIGTERM or SIGINT (or SIGHUP, SIGQUIT) while no attempt ran here: it
           stopped waiting for ticks (and for the occurrences it waited for as a backup)
  129/130/131/143
           baton got SIGHUP/SIGINT/SIGQUIT/SIGTERM while it ran an occurrence's attempt: the
           signal was forwarded to PROGRAM's group (SIGKILL after --kill-grace), the attempt
           failed (a backup takes over within the occurrence), and baton exited once every
           occurrence here had ended
  64       usage or configuration error (checked before connecting)
  69       the server cannot be reached at start (--connect-timeout, --give-up-after); later
           outages are ridden out, and an occurrence that gave up is run again while it is
           still the current one
  77       the server refused the credentials at start (as for `baton run`)
  78       the server rejects the configuration at start (as for `baton run`)
An occurrence's end does not end `baton schedule`: it is reported, and the next tick waited for.

At every tick of the schedule (by the coordination server's clock: Redis TIME, PostgreSQL
clock_timestamp()) `baton schedule` runs that occurrence's job KEY@DIGEST@TICK exactly as
`baton run --every/--cron` would (see `baton run --help`): holder or backup, attempts,
the watchdog, --max-hold, --kill-grace and PROGRAM's process group as there. Run it on every server
(one per server): each occurrence runs once across the fleet, never before its tick, and a failed
attempt is retried by a backup within the occurrence. It starts by waiting for the next tick;
--catch-up last first runs the latest past tick if it is neither done nor exhausted (every server
was down then); --catch-up all --catch-up-window D runs every past tick of the last D with no
terminal outcome on record, oldest first, while the next ticks run (as `baton backfill` does;
neither catches up a tick skipped while paused). An occurrence still running (or waited for as a backup) when the next tick comes
does not block it: both run at once, each a job of its own (at most --max-concurrent here),
unless --overlap says otherwise, looking at the whole fleet: `skip` records the new tick
skipped_overlap while an earlier occurrence runs anywhere; `buffer-one` makes it wait (the host
holding its job waits before PROGRAM, the others are its backups) until the earlier one ends,
skipping it if its window closes first or if two earlier ones are live; `replace` stops the
earlier ones wherever they run (their holders stop PROGRAM at once; their backups do not retry)
and runs it once they are gone. A --lease longer than the gap between ticks is allowed (warned
about: a dead holder keeps its occurrence past the next tick). PROGRAM never has the terminal
and a SIGTSTP is not passed on: this is a daemon. PROGRAM gets BATON_KEY (--key), BATON_JOB
(KEY@DIGEST@TICK), BATON_OCCURRENCE (the tick, RFC 3339 in UTC), BATON_ATTEMPT,
BATON_LAST_ATTEMPT and BATON_FENCING_TOKEN.

Output: one line per occurrence on stderr,
  baton: KEY: occurrence TICK, job KEY@DIGEST@TICK: WHAT
where WHAT is `ran here: done`, `ran here: failed with status N` (PROGRAM's status, or what
`baton run` would exit with), `ran here: stopped by SIGTERM`, `done elsewhere`, `skipped: …`
(--overlap, --max-concurrent), `exhausted`, `stopped while waiting as a backup`, or `error (exit status N)`.
With --json, one JSON object per line: {\"event\":\"occurrence_ended\", \"key\", \"occurrence\",
\"job\", \"outcome\": done|failed|stopped|done_elsewhere|skipped|skipped_overlap|exhausted|stopped_waiting|error,
\"status\": N or null}, beside each occurrence's events (as with `baton run --json`, each with
\"occurrence\" and \"job\"). -v adds the events and the next tick in words. `baton status --key
'KEY@DIGEST@TICK'` shows an occurrence's job.

systemd unit example (on every server; systemd stops it with SIGTERM to baton alone, which stops
PROGRAM and fails its attempt, so a backup takes over):
  # /etc/systemd/system/nightly-report.service
  [Service]
  ExecStart=/usr/local/bin/baton schedule --key nightly-report --cron '0 2 * * *' --tz Europe/Paris -- /usr/local/bin/report
  Environment=BATON_URL=redis://coord.internal:6379/
  KillMode=mixed
  TimeoutStopSec=30
  Restart=on-failure
  [Install]
  WantedBy=multi-user.target

Crontab example, without a service manager (started once at boot on every server):
  @reboot  baton schedule --key nightly-report --every 24h --offset 2h -- /usr/local/bin/report";

pub(crate) const LOCK_EXIT_STATUSES: &str = "\
Exit statuses of `baton lock`:
  N        PROGRAM's own status (0 on success; 128+n when signal n ended it, e.g. 130 after
           Ctrl-C in a terminal); the lock is released when PROGRAM exits
  126/127  PROGRAM could not be executed / was not found (the lock is released)
  64       usage or configuration error (durations are checked before connecting), or an
           operation the URL's backend does not have
  65       the lock's fence key holds a value baton never writes
  69       the server cannot be reached, or failed while the lock was being acquired; with
           --redlock: too many masters failed for a quorum (masters/2+1) to be possible (the
           message names the quorum); a master that is down at start is one failed vote
           (transient: trying again later may help)
  74       the lock was lost while PROGRAM ran: an extension found another token (or none),
           or no extension was confirmed before the lease's end (also when baton was stopped,
           e.g. by Ctrl-Z, for longer than the lease, or when the guard stopped PROGRAM because
           baton could not act: SIGSTOP, blocked, starved). PROGRAM got SIGTERM, then SIGKILL at the
           latest when the lease could pass on. Also when PROGRAM ended but the release found
           the lock held by another token (mutual exclusion may have been broken). With
           --redlock: an extension round found no quorum still holding the lock, or no quorum
           extension was confirmed before the validity deadline (SIGKILL by then)
  75       --wait ran out while the lock was held elsewhere (nothing was run)
  77       the server refused the credentials or a command (as for `baton run`; nothing was
           run)
  78       the server rejects the configuration (as for `baton run`; nothing was run)
  129/130/131/143
           baton got SIGHUP/SIGINT/SIGQUIT/SIGTERM (forwarded to PROGRAM; the lock is released
           once PROGRAM exits; while still waiting for the lock, nothing was run)
PROGRAM's own statuses can collide with these.

Without --wait, `baton lock` waits for the lock as long as it takes.

While PROGRAM runs, a watchdog extends the lock every --lease/3. PROGRAM gets BATON_LOCK_KEY and
BATON_FENCING_TOKEN (a number larger than any earlier holder's of the same key) in its
environment; its stdin, stdout and stderr pass through. A lease cannot stop a paused or
partitioned holder in time: pass BATON_FENCING_TOKEN to what PROGRAM writes to, and let it
refuse smaller tokens. Terminal, job control and signals work as for `baton run`: PROGRAM runs
in its own process group (which gets the terminal when baton is in the foreground), SIGHUP,
SIGINT, SIGQUIT and SIGTERM are forwarded to it, Ctrl-Z stops both (the lock is not extended
meanwhile, and PROGRAM is killed on `fg`/`bg` if the lease ran out), PROGRAM's whole group dies
with baton (a descendant that calls setsid or setpgid escapes) or, when baton cannot act, by the
lease's confirmed deadline (the guard; a whole host paused escapes), and what PROGRAM leaves running
in its group gets SIGTERM, then SIGKILL after --kill-grace, and is gone before the lock is
released.

--permits N holds one of N permits of the semaphore K instead of the mutex (as `consul lock
-n N`): up to N processes run at once; the rest wait (or exit 75 after --wait). PROGRAM gets
BATON_PERMIT, its slot (0 ..= N-1, the lowest free one), beside BATON_FENCING_TOKEN, the permit's
token, which only grows per slot: a resource keeps the highest token per (K, slot). Every holder
of K gives the same N (another N is a usage error, 64, naming both). Everything else (watchdog,
loss, signals, --wait, exit statuses) is as for the mutex.

--shared takes a shared read of the read-write lock K (as `flock -s`) and --exclusive its write.
Readers run together; a writer runs alone; once a writer waits, new readers queue behind it, so
readers cannot starve it. Under --shared, BATON_FENCING_TOKEN is the token of the last write (0
before any): what PROGRAM reads is at least that version. Under --exclusive it is a new write
token. The read-write lock is a primitive of its own, not the mutex: a plain `baton lock --key
K` (the mutex K) does not wait for --shared readers of K, nor they for it. Use --exclusive for
the writers of a lock that has --shared readers.

--permits, --shared and --exclusive exclude one another and --redlock (64: Redlock does not
make a semaphore or a read-write lock), and so does --name (their holders are shown by token).

--redlock URL,URL,URL takes the lock on a quorum of independent masters (at least 3, an odd
number, all distinct; instead of --url) so that it survives the loss of a minority of
them. PROGRAM then gets BATON_LOCK_KEY but no BATON_FENCING_TOKEN: Redlock has no monotonic
token. No counter grows across grants on a majority of masters: a master restarted without
persistence forgets the lock, a quorum can form again for a second holder while the first
still runs, and no token could be made to increase across that. Mutual exclusion then rests
on timing alone (clock rates, pauses): use it to avoid duplicate work, and the single-server
lock (with its fencing token) to protect data. The watchdog extends by quorum every --lease/3;
the lock is lost when a round finds no quorum still holding it, or when no quorum extension is
confirmed before the validity (lease − elapsed − drift) runs out.

Example (one backup at a time, whichever host gets there first):
  baton lock --key backups --lease 30s --wait 5m -- /usr/local/bin/backup
  baton lock --redlock redis://a:6379/,redis://b:6379/,redis://c:6379/ --key dedupe -- job";

pub(crate) const LEADER_EXIT_STATUSES: &str = "\
Exit statuses of `baton leader`:
  0        baton got SIGTERM or SIGINT (or Ctrl-C in a terminal: PROGRAM, which has the
           terminal, ended by SIGINT): PROGRAM (if it ran) was stopped (SIGTERM, then SIGKILL
           after --kill-grace, never past the lease's end), the leadership was resigned so a
           standby leads at once, and baton exited
  N        PROGRAM ended by itself: its own status (128+n when signal n ended it); the
           leadership is resigned first
  126/127  PROGRAM could not be executed / was not found (the leadership is resigned)
  64       usage or configuration error (checked before connecting), or an operation the
           URL's backend does not have
  65       the election's fence key holds a value baton never writes
  69       the server cannot be reached at start, or answered with another error that
           retrying did not fix
  77       the server refused the credentials or a command (as for `baton run`)
  78       the server rejects the configuration (as for `baton run`)
  129/131  baton got SIGHUP/SIGQUIT (or Ctrl-\\ in a terminal, PROGRAM ended by SIGQUIT): as for
           SIGTERM, then this status
PROGRAM's own statuses can collide with these.

`baton leader` runs a long-lived PROGRAM only while this process leads the election --key: it
campaigns (waiting as a standby while another process leads), runs PROGRAM once elected, and
renews the lease every --lease/3. PROGRAM gets BATON_LEADER_KEY and BATON_FENCING_TOKEN (the
term: larger than every earlier leader's) in its environment. When renewals fail, PROGRAM gets
SIGTERM --lease/5 before the lease could pass on and SIGKILL at the latest when it could: no
PROGRAM outlives its leadership. baton then campaigns again and runs PROGRAM anew in the next
term. Standbys are woken at once by a resignation, and by the lease running out when a leader
dies. Terminal, job control, signals and PROGRAM's process group work as for `baton lock`. In
a terminal, Ctrl-C reaches only PROGRAM (its group has the terminal): PROGRAM ended by SIGINT
there is taken for Ctrl-C typed at baton (stop, resign, exit 0); a PROGRAM that catches it and
exits with a status of its own is taken at its word.

Example (one scheduler at a time across the fleet, handed over on deploys):
  baton leader --key scheduler --lease 10s -- /usr/local/bin/scheduler";

pub(crate) const MIGRATE_HELP: &str = "\
`baton migrate --url postgres://owner@host/db` creates baton_jobs, baton_locks, the schedules'
record (baton_schedules, baton_schedule_history, baton_schedule_control), their indexes and the
sequence baton_advisory_fence in the connection's default schema (the first of its
search_path), where missing. It is idempotent and safe while workers run: when everything
exists it runs no DDL and takes no lock; otherwise each lock its DDL needs is waited for at most
1 s (a DDL waiting on a long transaction would queue every writer behind it), then tried again
with a pause, 5 times at most. Workers create a missing table themselves where their role may;
a role that may only read and write gets exit 78 naming this command instead.

With a Redis URL there is nothing to create (keys need no schema): it says so and exits 0
without connecting, so one deploy step fits both backends.

Exit statuses: 0 done (or nothing to do); 64 usage; 69 the server cannot be reached, or the
tables stayed locked through every try; 77 the role may not create them (run it as their
owner) or the credentials were refused; 78 the server rejects the configuration (an unknown
database).";

/// `baton unlock --help`: what it takes, what it does not, and its exit statuses.
pub(crate) const UNLOCK_HELP: &str = "\
`baton unlock --key K --token N` takes mutex K (`baton lock`), fair lock K, election K's term
(`baton leader`), a semaphore's permit or a read-write lock's holder from its holder, on Redis and PostgreSQL (fair locks: Redis only): the grant
with fencing token N (a leader's term), and only that one. `baton unlock --key K` describes the
holder and prints the exact command that names it (an entry shown without a fencing token is
named by --holder ID). If by the time it runs another grant holds K (the shown holder finished
and a healthy one took K), nothing is done and it exits 75. The holder hears it at once on the
lock's channel and reports the loss (`baton lock` stops PROGRAM and exits 74); one that was not
listening yet learns at its next extension. The fence is kept, so the next holder's fencing
token is higher than the one taken. --any takes whatever holds K when it runs; --yes is accepted
beside --token, --holder or --any, and alone names nothing. When K is held as several kinds,
--kind says which.

A semaphore's permit is named by its slot and the slot's token: `baton unlock --key K --permit
SLOT --token N` (a --token alone finds its slot; one that two slots show is refused, 64, naming
both). A read-write lock's writer is named by --token N (its write token); a reader or the
upgradeable reader only by --holder ID, since every reader carries the last write's token. Without
a name, every holder is listed with the command that names it.

Not for: a job (release its attempt with `baton fail --key K --attempt N`); a Redlock lock (it
lives on its masters: delete PREFIXredlock:{K} on each, e.g.
`redis-cli -u URL DEL 'baton:redlock:{K}'`); a PostgreSQL advisory lock (it lasts as long as its
session: end the session holding it with
`SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'`, see
docs/advisory-locks.md).

Exit statuses: 0 taken, or nothing held K; 64 usage (a held lock not named by --token, --holder
or --any, a job, several kinds without --kind, a token two permits show without --permit, a
reader named by token, --permit on another kind); 69 the server cannot be reached; 75 another
grant holds K now: nothing done; 77 the server refused the credentials or a command, 78 it
rejects the configuration (as for `baton run`; no retry helps).";

/// `baton fail --help` and `baton reset --help`: the attempt named, and the exit statuses.
pub(crate) const JOB_ADMIN_HELP: &str = "\
`baton fail --key K --attempt N` releases attempt N of job K so a backup takes over at once (its
holder hears `failed` and stops). `baton reset --key K` forgets job K so the next run is attempt
1 again; a live job only with --attempt N naming its live attempt. Without --attempt, a live job
is described and the exact command to run is printed. --any acts on whichever attempt is live
when the command runs; --yes is accepted beside --attempt or --any, and alone names nothing.

Exit statuses: 0 done, or nothing live to release; 64 usage (a live job not named by --attempt
or --any); 65 a corrupt state; 69 the server cannot be reached; 75 another attempt is live now:
nothing done; 77 the server refused the credentials or a command, 78 it rejects the
configuration (as for `baton run`; no retry helps).";

/// `baton dashboard --help`: what the page shows, what it refuses, and its exit statuses.
#[cfg(feature = "dashboard")]
pub(crate) const DASHBOARD_HELP: &str = "\
`baton dashboard` serves one page listing every job, lock, leader, fair lock, queue,
semaphore, read-write lock and schedule under --prefix, as `baton status` does: state, holder, time left, fencing token.
Exhausted, corrupt and waiting jobs (a failed attempt, or a holder whose lease ran out) come
first and stand out; rows that just changed are highlighted; the page filters by name prefix
and kind. It updates live over server-sent events; the server is read once per --interval
however many pages are open. When a read fails or hangs the page keeps the last good one and
says since when it is stale. /api/entries gives the same view as JSON, /healthz answers 200
while the server can be read and 503 otherwise, and /metrics serves Prometheus text: entries by
kind and state (baton_entries{kind=\"job\",state=\"exhausted\"}), the age of the last good
read and the count of failed reads.

It is read-only (every route is a GET) and never shows a password: the server is shown with
its credentials and query redacted. It binds to loopback unless --allow-remote, and on loopback
answers only requests addressed to a loopback host name (no DNS rebinding).

Example: baton dashboard --url redis://127.0.0.1:6379/ --listen 127.0.0.1:8080, then open
http://127.0.0.1:8080/ (from another host: ssh -L 8080:127.0.0.1:8080 HOST).

Exit statuses: 64 usage (a non-loopback --listen without --allow-remote); 69 the server cannot
be reached at start, or --listen cannot be bound; 130 or 143 when stopped by Ctrl-C or
SIGTERM.";

/// `baton check --help`: what is CRITICAL, and its exit statuses (Nagios', not sysexits).
pub(crate) const CHECK_HELP: &str = "\
Exit statuses of `baton check` (the Nagios plugin convention, unlike every other command):
  0        OK: no occurrence since the last success was missed, failed or exhausted, the last
           success is recent enough (--max-age), and the store knows the schedule
  1        WARNING: the newest occurrence's attempt failed and it has no outcome yet (a
           backup may still take it over within the occurrence)
  2        CRITICAL: since the last success, an occurrence was missed (its window closed with
           no attempt on record: every worker was down), failed or exhausted; the last
           success ended longer ago than --max-age (or none did in that long on record); or
           the store holds no record of the schedule (never registered, or forgotten) unless
           --allow-absent
  3        UNKNOWN: the server could not be reached or refused baton, the record is
           unreadable, or the command line is wrong
One line on stdout, `SCHEDULE STATUS: KEY (EXPRESSION): what | missed=N failed=N`, e.g.
  SCHEDULE CRITICAL: nightly-report (every 1d): 2 missed (2026-01-02T00:00:00Z, 2026-01-03T00:00:00Z) | missed=2 failed=0

The verdict is computed from the store alone (the record every host running the schedule
writes, and the occurrences' own keys), so it holds when every worker is down; a success
clears what came before it. Ticks skipped by a pause are recorded as such, never missed. The
digest a host saw last is judged (after a rolling change of the expression, the old one's
ticks are not missed). An older baton that does not write the record leaves gaps that read as
missed ticks.

Example (a Nagios or Icinga command for a daily job that must have succeeded in 26 hours):
  baton check --url redis://coord.internal:6379/ --key nightly-report --max-age 26h";

/// `baton pause --help` and `baton resume --help`.
pub(crate) const TRIGGER_HELP: &str = "\
`baton trigger --key K` asks the fleet running schedule K to run one occurrence now, outside
its calendar: the trigger is stored per key (hosts of both expressions during a rolling change
see it) and every `baton schedule --key K` starts it within its --trigger-poll (5s by default),
under the same coordination as a tick (one holder, the others its backups, attempts, fencing,
the schedule's history; paused: skipped). It runs once across the fleet, as the job
K@manual@ID, where ID (printed, and BATON_OCCURRENCE for PROGRAM) is manual-<the server's time,
ms>. The trigger is cleared once the occurrence ends done or exhausted, and is dropped after a
day if nothing ran it. For a cron-only fleet, `baton run --key K --cron … --now -- PROGRAM`
makes the trigger and runs it there.

Examples:
  baton trigger --key nightly-report --note 'rerun after the fix'
  baton run --key nightly-report --cron '0 2 * * *' --now -- ./report.sh

Exit statuses: 0 triggered (the id printed); 64 usage; 69 the server cannot be reached; 77 the
server refused the credentials or a command, 78 it rejects the configuration (as for `baton
run`).";

pub(crate) const PAUSE_HELP: &str = "\
`baton pause --key K` pauses schedule K across the fleet, before or after any host has run it:
each `baton run --every/--cron`, `baton schedule` or `Failover::schedule` that binds to one of
its occurrences while paused reads the pause (one read per occurrence), records that
occurrence skipped (paused) in the schedule's history, runs nothing and exits 0 (`baton
schedule` waits for the next tick). An occurrence already running when the pause is set runs to
its end. The pause is kept in the store with who set it, when, and --note; `baton status --key
K` shows it. --until T ends it by itself at T by the server's clock (an RFC 3339 time, or a
duration from now such as 2h); without it, it lasts until `baton resume --key K`. After the
pause, the next tick runs; the ticks skipped while paused are not caught up.

Examples:
  baton pause --key nightly-report --until 2h --note 'database migration'
  baton resume --key nightly-report

Exit statuses: 0 done (`resume` also when the schedule was not paused: it says so); 64 usage
(a --until in the past or unreadable); 69 the server cannot be reached; 77 the server refused
the credentials or a command, 78 it rejects the configuration (as for `baton run`).";
