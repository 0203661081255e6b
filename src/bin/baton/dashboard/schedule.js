// baton dashboard: one schedule's page (schedule?key=KEY): each digest's record, its check
// and its history, read from api/history every few seconds.
// Data is only ever put into the page as text (textContent), never as HTML.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const key = new URLSearchParams(location.search).get('key') || '';
  const EVERY_MS = 5000;

  function human(ms) {
    if (ms == null) return '-';
    if (ms < 1000) return `${ms} ms`;
    const s = ms / 1000;
    if (s < 60) return `${(Math.floor(s * 10) / 10).toFixed(1)} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min ${Math.floor(s % 60)} s`;
    const h = Math.floor(m / 60);
    if (h < 48) return `${h} h ${m % 60} min`;
    return `${Math.floor(h / 24)} d ${h % 24} h`;
  }

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text != null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }

  function cell(tr, text, cls) {
    const td = el('td', text == null ? '-' : text, cls);
    tr.appendChild(td);
    return td;
  }

  function setLive(text, cls) {
    const e = $('live');
    e.textContent = text;
    e.className = `live ${cls}`;
  }

  // A summary line: term and its value.
  function fact(dl, term, value, cls) {
    dl.appendChild(el('dt', term));
    dl.appendChild(el('dd', value, cls));
  }

  function section(d) {
    const r = d.record;
    const sec = el('section', null, 'schedule');
    sec.dataset.digest = r.digest;
    sec.appendChild(el('h2', r.spec.text));
    const check = el('p', d.check ? d.check.line : '-', `check c-${d.check ? d.check.status : 'unknown'}`);
    check.dataset.status = d.check ? d.check.status : '';
    sec.appendChild(check);
    const dl = el('dl');
    fact(dl, 'Digest', r.digest);
    fact(dl, 'Next tick', d.next_tick || '-');
    const now = Date.parse(d.now);
    fact(dl, 'Last success', r.last_success
      ? `${r.last_success} (${human(now - Date.parse(r.last_success))} ago)` : 'none on record');
    fact(dl, 'Last outcome', r.last_outcome || '-');
    const p = r.paused;
    fact(dl, 'Paused', p
      ? `by ${p.by} at ${p.at}${p.until ? ` until ${p.until}` : ' until resumed'}${p.note ? `: ${p.note}` : ''}`
      : 'no', p ? 'paused' : null);
    fact(dl, 'Jitter', r.spec.jitter_ms ? human(r.spec.jitter_ms) : 'none');
    fact(dl, 'History kept', `${r.spec.history} occurrences`);
    fact(dl, 'First seen', r.first_seen);
    fact(dl, 'Hosts seen', r.hosts.length
      ? r.hosts.map((h) => `${h.host} (${human(now - Date.parse(h.last_seen))} ago)`).join(', ') : 'none');
    sec.appendChild(dl);

    const table = el('table', null, 'history');
    const head = el('tr');
    for (const h of ['Occurrence', 'Outcome', 'Attempt', 'Host', 'Start', 'End', 'Duration', 'Exit', 'Message']) {
      head.appendChild(el('th', h));
    }
    table.appendChild(head);
    for (const o of d.history) {
      // One row per attempt (an occurrence with none: one row).
      const attempts = o.attempts.length ? o.attempts : [null];
      attempts.forEach((a, i) => {
        const row = el('tr', null, `st-${o.outcome}`);
        row.dataset.occurrence = o.id;
        row.dataset.outcome = o.outcome;
        row.dataset.host = a && a.host ? a.host : '';
        cell(row, i === 0 ? o.id : '', 'name');
        cell(row, i === 0 ? o.outcome + (o.note ? ` (${o.note})` : '') : '');
        cell(row, a ? a.attempt : '-', 'num');
        cell(row, a ? (a.host || 'unknown') : '-');
        cell(row, a && a.started ? a.started : '-');
        cell(row, a && a.ended ? a.ended : (a && a.outcome ? 'unknown' : '-'));
        const ms = a && a.started && a.ended ? Date.parse(a.ended) - Date.parse(a.started) : null;
        cell(row, human(ms), 'num');
        const exit = a && a.exit ? (a.exit.status != null ? `exit ${a.exit.status}` : `signal ${a.exit.signal}`) : '-';
        cell(row, exit);
        cell(row, a ? [a.outcome, a.message].filter(Boolean).join(': ') || '-' : '-', 'note');
        table.appendChild(row);
      });
    }
    if (!d.history.length) {
      const row = el('tr');
      const td = cell(row, 'no occurrence on record', 'note');
      td.colSpan = 9;
      table.appendChild(row);
    }
    sec.appendChild(table);
    return sec;
  }

  async function read() {
    try {
      const res = await fetch(`api/history?schedule=${encodeURIComponent(key)}`);
      if (!res.ok) throw new Error((await res.text()).trim() || res.statusText);
      const got = await res.json();
      const body = document.createDocumentFragment();
      for (const d of got) body.appendChild(section(d));
      $('digests').replaceChildren(body);
      $('empty').hidden = got.length > 0;
      $('banner').hidden = true;
      $('server').textContent = `read ${new Date().toISOString()}`;
      setLive('live', 'up');
    } catch (e) {
      // The page keeps the last good read and says why it is stale.
      const banner = $('banner');
      banner.hidden = false;
      banner.textContent = `Cannot read the schedule: ${e.message || e}. The page shows the last good read.`;
      setLive('stale: server unreadable', 'stale');
    }
  }

  $('key').textContent = key;
  document.title = `baton schedule ${key}`;
  read();
  setInterval(read, EVERY_MS);
})();
