// dlock serve's page: the live table (/api/locks every second and on every event), one
// lock's detail (/api/locks/NAME), and a timeline of grants, losses and waits drawn from the
// event stream (/api/events) and the kept history (/api/history). No build step, no CDN.
'use strict';

const SPAN_MS = 5 * 60 * 1000;
const state = {
  sort: 'contention', prefix: '', releaseAllowed: false, locks: [], events: [],
  detail: null, busy: false, again: false,
};
const $ = (id) => document.getElementById(id);

function short(ms) {
  if (ms === null || ms === undefined) return '-';
  if (ms < 1000) return ms + 'ms';
  const s = Math.floor(ms / 1000);
  if (ms < 60000) return (ms / 1000).toFixed(1) + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm' + String(s % 60).padStart(2, '0') + 's';
  if (s < 86400) return Math.floor(s / 3600) + 'h' + String(Math.floor(s / 60) % 60).padStart(2, '0') + 'm';
  return Math.floor(s / 86400) + 'd' + String(Math.floor(s / 3600) % 24).padStart(2, '0') + 'h';
}
const atLeast = (ms, flag) => (ms === null || ms === undefined ? '-' : (flag ? '≥' : '') + short(ms));

function cell(tr, text, cls) {
  const td = document.createElement('td');
  td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function status(text) { $('status').textContent = text || ''; }

async function refresh() {
  // One request at a time; a refresh asked for meanwhile runs after it.
  if (state.busy) { state.again = true; return; }
  state.busy = true;
  try {
    const q = new URLSearchParams({ sort: state.sort });
    if (state.prefix) q.set('prefix', state.prefix);
    const r = await fetch('/api/locks?' + q);
    const body = await r.json();
    if (!r.ok) { status(body.error || r.statusText); return; }
    status('');
    state.releaseAllowed = body.release_allowed;
    state.locks = body.locks;
    $('backend').textContent = body.backend + ' (' + body.endpoint + ')' + (body.prefix ? ' under ' + body.prefix : '');
    renderTable();
    drawTimeline();
    if (state.detail) showDetail(state.detail.name, state.detail.kind);
  } catch (e) {
    status('dlock serve unreachable: ' + e.message);
  } finally {
    state.busy = false;
    if (state.again) { state.again = false; refresh(); }
  }
}

function renderTable() {
  const tbody = document.querySelector('#locks tbody');
  const rows = [];
  let held = 0, waiting = 0;
  for (const l of state.locks) {
    const h = l.holders[0];
    if (l.held) held++;
    waiting += l.waiters || 0;
    const tr = document.createElement('tr');
    tr.dataset.name = l.name;
    tr.dataset.kind = l.kind;
    tr.dataset.held = String(l.held);
    if (l.waiters) tr.className = 'waiting';
    cell(tr, l.name, 'name');
    cell(tr, l.kind, 'kind');
    cell(tr, h ? h.owner + (l.holders.length > 1 ? ' (+' + (l.holders.length - 1) + ')' : '') : 'free', 'holder');
    cell(tr, h && h.host ? h.host : '-', 'host');
    cell(tr, h && h.pid ? String(h.pid) : '-', 'pid num');
    cell(tr, h ? atLeast(h.held_for_ms, h.held_for_at_least) : '-', 'held-for num');
    cell(tr, h ? (h.lease_left_ms === null ? 'session' : short(h.lease_left_ms)) : '-', 'lease num');
    cell(tr, String(l.fencing_token), 'token num');
    cell(tr, l.waiters === null ? '?' : String(l.waiters), 'waiters num');
    cell(tr, atLeast(l.oldest_wait_ms, l.oldest_wait_at_least), 'oldest-wait num');
    const actions = cell(tr, '', 'actions');
    if (state.releaseAllowed && l.held) {
      const b = document.createElement('button');
      b.type = 'button';
      b.className = 'release';
      b.textContent = 'force release';
      b.addEventListener('click', (ev) => { ev.stopPropagation(); forceRelease(l); });
      actions.appendChild(b);
    }
    tr.addEventListener('click', () => showDetail(l.name, l.kind));
    rows.push(tr);
  }
  tbody.replaceChildren(...rows);
  $('empty').hidden = state.locks.length > 0;
  $('summary').textContent = state.locks.length + ' locks, ' + held + ' held, ' + waiting + ' waiting';
}

async function showDetail(name, kind) {
  state.detail = { name, kind };
  const r = await fetch('/api/locks/' + encodeURIComponent(name) + '?kind=' + encodeURIComponent(kind));
  const d = await r.json();
  if (!r.ok) { status(d.error || r.statusText); return; }
  $('detail').hidden = false;
  $('detail-title').textContent = d.name + ' (' + d.kind + '): ' + (d.held ? 'held' : 'free') + ', fencing token ' + d.fencing_token;
  const body = $('detail-body');
  const list = (title, items) => {
    const h = document.createElement('h3');
    h.textContent = title;
    const ol = document.createElement('ol');
    for (const text of items) {
      const li = document.createElement('li');
      li.textContent = text;
      ol.appendChild(li);
    }
    return [h, ol];
  };
  const holders = d.holders.map((h) => h.owner + (h.host ? ' host ' + h.host + ' pid ' + h.pid : '') +
    (h.side ? ' ' + h.side : '') + ' held ' + atLeast(h.held_for_ms, h.held_for_at_least) +
    ' lease ' + (h.lease_left_ms === null ? 'session' : short(h.lease_left_ms)));
  const queue = d.queue.map((w) => w.owner + (w.side ? ' wants ' + w.side : '') + ' waiting ' + short(w.waited_ms));
  const queueTitle = d.waiters === null ? 'Queue: not kept by this backend'
    : (d.queue.length === 0 && d.waiters > 0 ? 'Queue: ' + d.waiters + ' waiting (not named by this backend)' : 'Queue, first in line first');
  body.replaceChildren(...list('Holders', holders), ...list(queueTitle, queue));
}

async function forceRelease(l) {
  let token = sessionStorage.getItem('dlock-token');
  if (!token) {
    token = prompt('Release token of this dlock serve (printed when it started):');
    if (!token) return;
  }
  if (!confirm('Force the release of ' + l.name + '? Its holder loses the lock at its next renewal.')) return;
  const r = await fetch('/api/locks/' + encodeURIComponent(l.name) + '?kind=' + encodeURIComponent(l.kind), {
    method: 'DELETE', headers: { Authorization: 'Bearer ' + token },
  });
  const body = await r.json();
  if (r.ok) sessionStorage.setItem('dlock-token', token);
  else { sessionStorage.removeItem('dlock-token'); status(body.error || r.statusText); }
  refresh();
}

function addEvent(e) {
  state.events.push(e);
  const cut = Date.now() - SPAN_MS;
  while (state.events.length && state.events[0].at_ms < cut) state.events.shift();
  const li = document.createElement('li');
  li.className = 'ev-' + e.event;
  li.textContent = new Date(e.at_ms).toLocaleTimeString() + ' ' + e.event + ' ' + e.name +
    (e.owner ? ' ' + e.owner : '') + ' token ' + e.fencing_token + (e.waiters ? ' waiters ' + e.waiters : '');
  const ol = $('events');
  ol.prepend(li);
  while (ol.children.length > 200) ol.lastChild.remove();
}

// One lane per lock (the busiest 12): a bar from each grant to its release (green) or loss
// (red), a bar to now for a holder still holding, and an orange tick where waiters queued.
function drawTimeline() {
  const canvas = $('timeline');
  const ctx = canvas.getContext('2d');
  const now = Date.now(), from = now - SPAN_MS;
  const x = (t) => Math.max(0, (t - from) / SPAN_MS) * (canvas.width - 160) + 160;
  const lanes = new Map();
  const lane = (name) => { if (!lanes.has(name)) lanes.set(name, { bars: [], ticks: [], open: new Map() }); return lanes.get(name); };
  for (const e of state.events) {
    const l = lane(e.name);
    if (e.event === 'granted') l.open.set(e.owner, e.at_ms);
    else if (e.event === 'released' || e.event === 'lost') {
      const start = l.open.has(e.owner) ? l.open.get(e.owner) : from;
      l.open.delete(e.owner);
      l.bars.push([start, e.at_ms, e.event === 'lost' ? 'lost' : 'held']);
    } else if (e.event === 'waiting') l.ticks.push(e.at_ms);
  }
  for (const lock of state.locks) {
    for (const h of lock.holders) {
      const l = lane(lock.name);
      const start = l.open.has(h.owner) ? l.open.get(h.owner) : now - h.held_for_ms;
      l.open.delete(h.owner);
      l.bars.push([start, now, 'held']);
    }
    if (lock.waiters) lane(lock.name).ticks.push(now);
  }
  const css = getComputedStyle(document.documentElement);
  const color = { held: css.getPropertyValue('--held'), lost: css.getPropertyValue('--lost') };
  const names = [...lanes.keys()].sort((a, b) => (lanes.get(b).bars.length + lanes.get(b).ticks.length) - (lanes.get(a).bars.length + lanes.get(a).ticks.length)).slice(0, 12);
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.font = '12px system-ui, sans-serif';
  const h = Math.min(20, (canvas.height - 20) / Math.max(1, names.length));
  names.forEach((name, i) => {
    const y = 4 + i * h;
    ctx.fillStyle = '#1d2330';
    ctx.fillText(name.length > 22 ? name.slice(0, 21) + '…' : name, 4, y + h * 0.7);
    for (const [s, e, kind] of lanes.get(name).bars) {
      ctx.fillStyle = color[kind];
      ctx.fillRect(x(s), y + 2, Math.max(2, x(e) - x(s)), h - 6);
    }
    ctx.fillStyle = css.getPropertyValue('--wait');
    for (const t of lanes.get(name).ticks) ctx.fillRect(x(t) - 1, y, 3, h - 2);
  });
  ctx.fillStyle = '#6b7385';
  for (let m = 0; m <= 5; m++) {
    const t = from + m * 60000;
    ctx.fillText(m === 5 ? 'now' : '-' + (5 - m) + 'm', x(t) - 10, canvas.height - 4);
  }
}

function listen() {
  const es = new EventSource('/api/events');
  es.onopen = () => { $('live-state').textContent = 'live'; };
  es.onerror = () => { $('live-state').textContent = 'reconnecting'; };
  for (const kind of ['granted', 'released', 'lost', 'waiting']) {
    es.addEventListener(kind, (m) => { addEvent(JSON.parse(m.data)); refresh(); });
  }
  es.addEventListener('lagged', () => refresh());
}

async function start() {
  $('span-min').textContent = String(SPAN_MS / 60000);
  $('sort').addEventListener('change', (e) => { state.sort = e.target.value; refresh(); });
  $('prefix').addEventListener('input', (e) => { state.prefix = e.target.value; refresh(); });
  $('detail-close').addEventListener('click', () => { state.detail = null; $('detail').hidden = true; });
  try {
    const r = await fetch('/api/history');
    if (r.ok) for (const e of await r.json()) addEvent(e);
  } catch (e) { status('history unavailable: ' + e.message); }
  listen();
  await refresh();
  setInterval(refresh, 1000);
}

start();
