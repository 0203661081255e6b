// baton dashboard: renders the server's view (server-sent events from /events) as a table.
// Data is only ever put into the page as text (textContent), never as HTML.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const prefixInput = $('prefix');
  const kindSelect = $('kind');
  const STATES = ['running', 'held', 'waiting', 'exhausted', 'corrupt', 'done', 'free'];
  // What each row looked like last time, and when it last changed: changes are highlighted.
  let seen = new Map();
  let source = null;
  let first = true;

  const query = new URLSearchParams(location.search);
  prefixInput.value = query.get('prefix') || '';
  kindSelect.value = query.get('kind') || '';

  function human(ms) {
    if (ms == null) return '-';
    if (ms < 1000) return `${ms} ms`;
    const s = ms / 1000;
    if (s < 60) return `${(Math.floor(s * 10) / 10).toFixed(1)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min ${Math.floor(s % 60)} s`;
    return `${Math.floor(m / 60)} h ${m % 60} min`;
  }

  // Instants in UTC, RFC 3339 to the millisecond, as baton's lines and occurrences write them.
  function clock(ms) {
    return ms ? new Date(ms).toISOString() : 'never';
  }

  // A job's waiting backups, an election's standbys: counted on Redis, unknown on PostgreSQL.
  function standbys(r) {
    if (!r.can_standby) return '';
    return r.standbys == null ? 'unknown' : String(r.standbys);
  }

  const DIGEST_NOTE = 'The schedule\'s digest: a hash of its expression (--every or --cron, ' +
    'zone, offset), in each occurrence\'s name KEY@DIGEST@TICK. No host has recorded the ' +
    'schedule yet, so its expression is not known here.';

  function setLive(text, cls) {
    const el = $('live');
    el.textContent = text;
    el.className = `live ${cls}`;
  }

  function cell(tr, text, cls) {
    const td = document.createElement('td');
    td.textContent = text == null ? '-' : String(text);
    if (cls) td.className = cls;
    tr.appendChild(td);
    return td;
  }

  function render(v) {
    $('server').textContent = `${v.server} · prefix ${v.prefix} · read every ${human(v.interval_ms)} · last read ${clock(v.read_at_ms)}`;
    const banner = $('banner');
    if (v.error) {
      // The stream is up but the server is not: the table is the last good read.
      setLive('stale: server unreadable', 'stale');
      banner.hidden = false;
      banner.textContent = `Cannot read the server since ${clock(v.failing_since_ms)}: ${v.error}. ` +
        `The table shows the last good read (${clock(v.read_at_ms)}).`;
    } else {
      setLive('live', 'up');
      banner.hidden = true;
    }

    const summary = $('summary');
    summary.replaceChildren();
    const total = document.createElement('span');
    total.className = 'chip';
    total.textContent = `${v.total} in all`;
    summary.appendChild(total);
    for (const state of STATES) {
      const n = v.counts[state];
      if (!n) continue;
      const chip = document.createElement('span');
      chip.className = `chip s-${state}`;
      const b = document.createElement('b');
      b.textContent = String(n);
      chip.append(b, state);
      summary.appendChild(chip);
    }

    let shown = `showing ${v.rows.length} of ${v.matching}`;
    if (v.matching > v.rows.length) shown += ` (at most ${v.max_shown}: narrow the filter)`;
    if (v.truncated) shown += '; the listing stopped at its limit, problems kept';
    $('shown').textContent = shown;

    const now = Date.now();
    const next = new Map();
    const body = document.createDocumentFragment();
    for (const r of v.rows) {
      const id = `${r.kind}\u0000${r.name}`;
      const look = [r.state, r.holder, r.attempt, r.fencing_token, r.standbys, r.note].join('\u0000');
      const before = seen.get(id);
      const changedAt = before && before.look !== look ? now : (before ? before.changedAt : 0);
      next.set(id, { look, changedAt });

      const tr = document.createElement('tr');
      tr.dataset.kind = r.kind;
      tr.dataset.name = r.name;
      tr.dataset.state = r.state;
      tr.dataset.holder = r.holder || '';
      tr.dataset.attempt = r.attempt == null ? '' : String(r.attempt);
      tr.dataset.fence = r.fencing_token == null ? '' : String(r.fencing_token);
      tr.dataset.standbys = standbys(r);
      tr.className = `st-${r.state}` + (r.problem ? ' problem' : '') +
        (!first && now - changedAt < 3000 ? ' changed' : '');
      cell(tr, r.kind);
      const name = cell(tr, r.name, 'name');
      if (r.digest && !r.expression) name.title = DIGEST_NOTE;
      if (r.expression) {
        const expr = document.createElement('span');
        expr.className = 'expression';
        expr.textContent = ` ${r.expression}`;
        name.appendChild(expr);
      }
      if (r.schedule) {
        // The schedule's own page: its record, check and history.
        const link = document.createElement('a');
        link.className = 'toggle';
        link.href = `schedule?key=${encodeURIComponent(r.schedule)}`;
        link.textContent = 'history';
        name.appendChild(link);
      }
      const state = cell(tr, '');
      const badge = document.createElement('span');
      badge.className = `badge s-${r.state}`;
      badge.textContent = r.state;
      state.appendChild(badge);
      cell(tr, r.holder);
      cell(tr, human(r.remaining_ms), 'num');
      cell(tr, r.fencing_token, 'num');
      cell(tr, standbys(r) || '-', 'num');
      cell(tr, r.note, 'note');
      body.appendChild(tr);
    }
    $('rows').replaceChildren(body);
    $('empty').hidden = v.rows.length > 0;
    seen = next;
    first = false;
  }

  function connect() {
    if (source) source.close();
    const q = new URLSearchParams();
    if (prefixInput.value) q.set('prefix', prefixInput.value);
    if (kindSelect.value) q.set('kind', kindSelect.value);
    const qs = q.toString();
    history.replaceState(null, '', qs ? `?${qs}` : location.pathname);
    setLive('connecting…', 'connecting');
    source = new EventSource(qs ? `events?${qs}` : 'events');
    // Connected is not live: each message says whether the server could be read (render).
    source.onmessage = (ev) => render(JSON.parse(ev.data));
    // EventSource reconnects by itself; say so meanwhile.
    source.onerror = () => setLive('reconnecting…', 'down');
  }

  let typing = null;
  prefixInput.addEventListener('input', () => {
    clearTimeout(typing);
    typing = setTimeout(connect, 250);
  });
  kindSelect.addEventListener('change', connect);
  $('filter').addEventListener('submit', (ev) => {
    ev.preventDefault();
    connect();
  });
  connect();
})();
