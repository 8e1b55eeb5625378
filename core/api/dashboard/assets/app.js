// CapyCTL dashboard. Plain JavaScript, no build step, no library: the page
// calls the management API with its session cookie and the session's CSRF
// header, follows the event stream (resumed with Last-Event-ID), and draws
// its bars and charts as SVG. Every text from the API goes in through
// textContent, never as markup.
'use strict';

(() => {
  const API = '/management/v1';
  const SVGNS = 'http://www.w3.org/2000/svg';
  const MAX_EVENTS = 200;
  const HISTORY_EVENTS = 30;
  const SAMPLE_MS = 2000;
  const REQUEST_ROWS = 15; // the requests panel's rows
  const MAX_SAMPLES = 90;
  const LOG_KIB = 16;
  const USAGE_MS = 15000; // the usage panel's refresh

  const state = {
    csrf: '',
    snap: null,
    snapSeq: 0,
    streamAbort: null,
    refreshTimer: null,
    logTimer: null,
    sampleTimer: null,
    samples: [],
    prevCounts: null,
    series: new Map(), // deployment -> colour index
    logSel: '',
    usageTimer: null,
    keysOff: false, // the role keeps no named keys (a host)
    hostLedgers: new Map(), // host -> its ledger view, read from the host (a server's hosts)
    pg: { abort: null, keys: null },
  };

  const $ = (id) => document.getElementById(id);

  // el builds an element; attrs.text sets textContent, attrs.cls the class.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    setAttrs(e, attrs);
    for (const c of children) if (c != null) e.append(c);
    return e;
  }
  function sv(tag, attrs, ...children) {
    const e = document.createElementNS(SVGNS, tag);
    setAttrs(e, attrs);
    for (const c of children) if (c != null) e.append(c);
    return e;
  }
  function setAttrs(e, attrs) {
    if (!attrs) return;
    for (const [k, v] of Object.entries(attrs)) {
      if (v == null || v === false) continue;
      if (k === 'text') e.textContent = String(v);
      else if (k === 'cls') e.setAttribute('class', v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
  }

  function bytes(n) {
    if (n == null || Number.isNaN(n)) return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    let v = Math.abs(n);
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (n < 0 ? '-' : '') + (i === 0 ? v.toFixed(0) : v.toFixed(1)) + ' ' + units[i];
  }
  function clock(t) {
    const d = new Date(t);
    return Number.isNaN(d.getTime()) ? '' : d.toLocaleTimeString([], { hour12: false });
  }
  function ago(t) {
    const s = Math.round((Date.now() - new Date(t).getTime()) / 1000);
    if (!Number.isFinite(s)) return '';
    if (s < 60) return s + ' s ago';
    if (s < 3600) return Math.round(s / 60) + ' min ago';
    if (s < 86400) return Math.round(s / 3600) + ' h ago';
    return Math.round(s / 86400) + ' d ago';
  }
  function randomKey() {
    const b = new Uint8Array(16);
    crypto.getRandomValues(b);
    return 'dash-' + Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
  }
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  class APIError extends Error {
    constructor(status, body) {
      super((body && body.message) || ('HTTP ' + status));
      this.status = status;
      this.code = (body && body.code) || '';
    }
  }

  // api calls the management API (or a dashboard route) with the session.
  async function api(method, path, body, extra) {
    const headers = Object.assign({ 'X-CapyCTL-CSRF': state.csrf, Accept: 'application/json' }, extra || {});
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'same-origin', cache: 'no-store',
    });
    const text = await res.text();
    let data = null;
    try { data = text && res.headers.get('Content-Type')?.startsWith('application/json') ? JSON.parse(text) : text; } catch (e) { data = text; }
    if (res.status === 401) { loggedOut('The session ended: log in again.'); throw new APIError(401, data && data.error); }
    if (!res.ok) throw new APIError(res.status, data && data.error);
    return { data, res };
  }

  function setConn(s, text) {
    const c = $('conn');
    c.dataset.state = s;
    c.textContent = text;
  }

  // ------------------------------------------------------------ login

  function loggedOut(msg) {
    if (state.streamAbort) state.streamAbort.abort();
    state.streamAbort = null;
    clearInterval(state.sampleTimer);
    state.sampleTimer = null;
    state.csrf = '';
    $('app').hidden = true;
    $('logout').hidden = true;
    $('login').hidden = false;
    $('login-error').textContent = msg || '';
    setConn('idle', 'logged out');
    $('token').focus();
  }

  async function login(ev) {
    ev.preventDefault();
    const input = $('token');
    $('login-error').textContent = '';
    $('login-submit').disabled = true;
    try {
      const res = await fetch('/dashboard/login', {
        method: 'POST', credentials: 'same-origin', cache: 'no-store',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify({ token: input.value }),
      });
      const data = await res.json().catch(() => null);
      if (!res.ok) {
        $('login-error').textContent = (data && data.error && data.error.message) || ('HTTP ' + res.status);
        input.select();
        return;
      }
      input.value = '';
      state.csrf = data.csrf;
      await start();
    } catch (e) {
      $('login-error').textContent = 'The role did not answer: ' + e.message;
    } finally {
      $('login-submit').disabled = false;
    }
  }

  async function logout() {
    try { await api('POST', '/dashboard/logout'); } catch (e) { /* the cookie goes either way */ }
    loggedOut('Logged out.');
  }

  async function boot() {
    $('login-form').addEventListener('submit', login);
    $('logout').addEventListener('click', logout);
    $('log-refresh').addEventListener('click', () => refreshLog());
    $('log-instance').addEventListener('change', (e) => { state.logSel = e.target.value; refreshLog(); });
    $('pg-form').addEventListener('submit', playgroundSend);
    $('pg-stop').addEventListener('click', () => { if (state.pg.abort) state.pg.abort.abort(); });
    $('pg-key').addEventListener('change', (e) => { $('pg-key-pasted').hidden = e.target.value !== ''; });
    $('key-form').addEventListener('submit', createAPIKey);
    $('key-copy').addEventListener('click', copyNewKey);
    $('key-done').addEventListener('click', forgetNewKey);
    $('usage-since').addEventListener('change', () => loadUsage());
    document.addEventListener('visibilitychange', () => { if (state.csrf) startSampling(); });
    document.addEventListener('keydown', (e) => { if (e.key === 'Escape') hideTip(); });
    try {
      const res = await fetch('/dashboard/session', { credentials: 'same-origin', cache: 'no-store' });
      if (!res.ok) { loggedOut(''); return; }
      state.csrf = (await res.json()).csrf;
      await start();
    } catch (e) {
      loggedOut('The role did not answer: ' + e.message);
    }
  }

  async function start() {
    $('login').hidden = true;
    $('app').hidden = false;
    $('logout').hidden = false;
    setConn('connecting', 'connecting…');
    const snap = await refreshSnapshot();
    followEvents(snap.cursor);
    startSampling();
    loadKeys();
    loadAPIKeys();
  }

  // ------------------------------------------------------------ snapshot

  async function refreshSnapshot() {
    const { data } = await api('GET', API + '/snapshot');
    state.snap = data;
    state.snapSeq = seqOf(data.cursor);
    render();
    refreshHostLedgers(data);
    return data;
  }

  // refreshHostLedgers reads the ledger of each host the snapshot lists
  // without one (a server's hosts: the server keeps their totals, each
  // host its ledger), through the server's GET /hosts/{name}/ledger.
  async function refreshHostLedgers(snap) {
    const hosts = (snap.hosts || []).filter((h) => !(h.ledger && h.ledger.domains));
    if (!hosts.length) return;
    await Promise.all(hosts.map(async (h) => {
      if (!h.online) { state.hostLedgers.set(h.name, { error: 'the host is out of reach' }); return; }
      try {
        const { data } = await api('GET', API + '/hosts/' + encodeURIComponent(h.name) + '/ledger');
        state.hostLedgers.set(h.name, { ledger: data.ledger || {}, gpus: data.gpus || [] });
      } catch (e) {
        state.hostLedgers.set(h.name, { error: e.message });
      }
    }));
    if (state.snap === snap) renderMemory(snap);
  }

  // scheduleRefresh takes a new snapshot shortly after an event, once for
  // a burst of events.
  function scheduleRefresh() {
    if (state.refreshTimer) return;
    state.refreshTimer = setTimeout(async () => {
      state.refreshTimer = null;
      try { await refreshSnapshot(); } catch (e) { /* the next event retries */ }
    }, 120);
  }

  function seqOf(cursor) {
    const i = (cursor || '').lastIndexOf(':');
    return i < 0 ? 0 : Number(cursor.slice(i + 1)) || 0;
  }
  function withSeq(cursor, seq) {
    const i = (cursor || '').lastIndexOf(':');
    return i < 0 ? cursor : cursor.slice(0, i + 1) + seq;
  }

  // ------------------------------------------------------------ events

  // followEvents reads the event stream and resumes it after the last event
  // seen (Last-Event-ID) when it ends or breaks; a cursor the journal no
  // longer keeps (410) means a new snapshot and its cursor.
  async function followEvents(snapCursor) {
    if (state.streamAbort) state.streamAbort.abort();
    const ctrl = new AbortController();
    state.streamAbort = ctrl;
    // Start a little in the past so the list shows the latest events.
    let cursor = withSeq(snapCursor, Math.max(0, seqOf(snapCursor) - HISTORY_EVENTS));
    let history = true;
    let backoff = 500;
    while (!ctrl.signal.aborted) {
      try {
        const res = await fetch(API + '/events', {
          headers: { 'X-CapyCTL-CSRF': state.csrf, Accept: 'text/event-stream', 'Last-Event-ID': cursor },
          credentials: 'same-origin', cache: 'no-store', signal: ctrl.signal,
        });
        if (res.status === 401) { loggedOut('The session ended: log in again.'); return; }
        if (res.status === 410 || (history && res.status === 400)) {
          const wasHistory = history;
          history = false;
          if (wasHistory) {
            // The journal no longer keeps that much history: follow from
            // the snapshot's cursor.
            cursor = state.snap.cursor;
          } else {
            // The cursor expired while away: a new snapshot and its cursor.
            cursor = (await refreshSnapshot()).cursor;
            addNote('the event cursor expired: took a new snapshot');
          }
          continue;
        }
        if (!res.ok) throw new Error('HTTP ' + res.status);
        history = false;
        backoff = 500;
        setConn('live', 'live');
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value.replace(/\r\n?/g, '\n');
          let i;
          while ((i = buf.indexOf('\n\n')) >= 0) {
            const frame = parseFrame(buf.slice(0, i));
            buf = buf.slice(i + 2);
            if (frame && frame.data) {
              if (frame.id) cursor = frame.id;
              onEvent(frame);
            }
          }
        }
        setConn('connecting', 'reconnecting…');
      } catch (e) {
        if (ctrl.signal.aborted) return;
        setConn('reconnecting', 'reconnecting…');
        await sleep(backoff);
        backoff = Math.min(backoff * 2, 10000);
      }
    }
  }

  function parseFrame(text) {
    const f = { id: '', event: '', data: '' };
    const data = [];
    for (const line of text.split('\n')) {
      if (line === '' || line.startsWith(':')) continue;
      const i = line.indexOf(':');
      const k = i < 0 ? line : line.slice(0, i);
      let v = i < 0 ? '' : line.slice(i + 1);
      if (v.startsWith(' ')) v = v.slice(1);
      if (k === 'id') f.id = v;
      else if (k === 'event') f.event = v;
      else if (k === 'data') data.push(v);
    }
    f.data = data.join('\n');
    return f;
  }

  function onEvent(frame) {
    let ev;
    try { ev = JSON.parse(frame.data); } catch (e) { return; }
    const fresh = ev.seq > state.snapSeq;
    addEvent(ev, fresh);
    if (fresh) {
      scheduleRefresh();
      if (ev.kind.startsWith('api_key_')) loadAPIKeys();
      if (ev.deployment && state.logSel.startsWith(ev.deployment + '/')) scheduleLog();
    }
  }

  // EVENT_HIDDEN are payload members the list does not show: the ones it
  // shows otherwise (who, the transition) and the host's own clock.
  const EVENT_HIDDEN = ['from', 'to', 'why', 'generation', 'instance', 'deployment', 'host', 'message', 'host_time_unix_ms'];
  const TIMESTAMP = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}/;

  function eventWho(ev) {
    const p = ev.payload || {};
    return ev.instance || p.instance || ev.deployment || p.deployment || '';
  }

  // eventValue writes a payload value for people: a time as a date and
  // clock, a digest shortened, a list joined.
  function eventValue(k, v) {
    if (Array.isArray(v)) return v.every((x) => x == null || typeof x !== 'object') ? v.join(', ') : null;
    if (v == null || typeof v === 'object') return null;
    const t = String(v);
    if (TIMESTAMP.test(t) && !Number.isNaN(new Date(t).getTime())) {
      return new Date(t).toLocaleString([], { hour12: false, year: 'numeric', month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit' });
    }
    if (k === 'digest' || /^sha256:[0-9a-f]{16,}$/.test(t)) return t.slice(0, 19) + '…';
    return t;
  }

  function eventDetail(ev) {
    const p = ev.payload || {};
    const parts = [];
    if (p.from || p.to) parts.push((p.from || '?') + ' → ' + (p.to || '?'));
    if (p.why) parts.push(p.why);
    if (p.message) parts.push(p.message);
    for (const [k, v] of Object.entries(p)) {
      if (EVENT_HIDDEN.includes(k)) continue;
      const text = eventValue(k, v);
      if (text == null || text === '') continue;
      parts.push(k.replace(/_/g, ' ') + ' ' + text);
    }
    if (p.host && eventWho(ev) !== p.host) parts.push('on ' + p.host);
    return parts.join(' · ');
  }

  function addEvent(ev, fresh) {
    const list = $('event-list');
    const who = eventWho(ev);
    const li = el('li', { cls: fresh ? 'new' : '', 'data-kind': ev.kind, 'data-seq': ev.seq, 'data-instance': ev.instance || (ev.payload || {}).instance || '' },
      el('time', { datetime: ev.recorded_at, title: ev.recorded_at, text: clock(ev.recorded_at) }),
      el('span', { cls: 'kind', text: ev.kind.replace(/_/g, ' ') }),
      el('span', { cls: 'detail', text: (who ? who + ' ' : '') + eventDetail(ev) }));
    list.prepend(li);
    while (list.children.length > MAX_EVENTS) list.lastElementChild.remove();
  }

  function addNote(text) {
    $('event-list').prepend(el('li', { 'data-kind': 'note' }, el('time', { text: clock(Date.now()) }), el('span', { cls: 'kind', text: 'note' }), el('span', { cls: 'detail', text })));
  }

  // ------------------------------------------------------------ render

  function render() {
    const snap = state.snap;
    if (!snap) return;
    const r = snap.role || {};
    $('role').textContent = [r.role && r.role + ' role', r.host && 'on ' + r.host, r.version && 'v' + r.version, r.inference && 'inference ' + r.inference].filter(Boolean).join(' · ');
    // A re-render replaces the elements: keep the keyboard's place.
    const a = document.activeElement;
    const keep = a && a.dataset ? ['owner', 'instance', 'action'].filter((k) => a.dataset[k]).map((k) => '[data-' + k + '="' + CSS.escape(a.dataset[k]) + '"]').join('') : '';
    const where = keep && a.closest('[data-domain]') ? '[data-domain="' + CSS.escape(a.closest('[data-domain]').dataset.domain) + '"] ' : '';
    renderMemory(snap);
    renderModels(snap);
    renderLogChoices(snap);
    renderPlaygroundModels(snap);
    if (keep) {
      const again = document.querySelector(where + a.tagName.toLowerCase() + keep);
      if (again) again.focus();
    }
  }

  // provenance finds where an owner's figure on a domain comes from: the
  // deployment's memory view says it per phase (and per side for startup).
  function provenance(snap, ownerID, phase, domain) {
    // A server numbers instances across its hosts, a host's ledger its own:
    // the owner's deployment is the part before the slash.
    const deps = snap.deployments || [];
    const dep = deps.find((d) => (d.instances || []).some((i) => i.id === ownerID)) || deps.find((d) => ownerID.startsWith(d.name + '/'));
    const m = dep && dep.memory;
    if (!m) return 'unknown';
    const host = domain.kind === 'system';
    if (phase === 'startup') return (host ? m.startup?.host_provenance : m.startup?.device_provenance) || 'unknown';
    if (phase === 'ready') return m.ready?.provenance || 'unknown';
    if (phase === 'parked') return m.parked?.provenance || 'unknown';
    return 'unknown';
  }

  const PHASE_ORDER = { ready: 0, startup: 1, parked: 2 };
  const PHASE_WORD = { ready: 'ready', startup: 'starting', parked: 'parked', stopped: 'stopped' };

  function domainTitle(d) {
    if (d.kind === 'system') return 'Host RAM';
    if (d.kind === 'unified') return 'Unified memory';
    return (d.device_name ? d.device_name + ' ' : '') + '(' + d.name + ')';
  }

  function renderMemory(snap) {
    const root = $('hosts');
    root.replaceChildren();
    for (const h of snap.hosts || []) {
      // A server lists its hosts with their totals; each host's own
      // ledger (charges per instance) is read from the host.
      const read = h.ledger && h.ledger.domains ? null : state.hostLedgers.get(h.name);
      const ledger = read ? (read.ledger || {}) : (h.ledger || {});
      const host = read && read.gpus ? Object.assign({}, h, { gpus: read.gpus }) : h;
      const box = el('div', { cls: 'host', 'data-host': h.name },
        el('h3', { text: h.name + (h.online ? '' : ' (offline)') + (ledger.gpu_provider ? ' · ' + ledger.gpu_provider + ' GPU' : '') }));
      const domains = (ledger.domains || []).slice().sort((a, b) => (a.kind === 'system') - (b.kind === 'system') || a.name.localeCompare(b.name));
      for (const d of domains) box.append(renderDomain(snap, host, ledger, d));
      if (!domains.length) {
        let why = 'No memory ledger on this host.';
        if (!(h.ledger && h.ledger.domains)) {
          const held = h.charged_bytes != null ? ' (' + bytes(h.charged_bytes) + ' charged at its last heartbeat)' : '';
          why = read && read.error ? 'The ledger of ' + h.name + ' cannot be read now: ' + read.error + held + '.' : 'Reading the ledger of ' + h.name + '…';
        }
        box.append(el('p', { cls: 'hint', text: why }));
      }
      root.append(box);
    }
  }

  function renderDomain(snap, host, ledger, d) {
    const cap = Math.max(d.capacity_bytes || 0, 1);
    const managed = d.managed_limit_bytes || 0;
    const segs = [];
    const owners = (ledger.owners || []).filter((o) => (o.charges || {})[d.name] > 0)
      .sort((a, b) => (PHASE_ORDER[a.phase] ?? 9) - (PHASE_ORDER[b.phase] ?? 9) || a.id.localeCompare(b.id));
    let alt = false;
    owners.forEach((o, n) => {
      const prov = provenance(snap, o.id, o.phase, d);
      // Neighbours in the same phase alternate shades, so each instance
      // stays a segment of its own.
      alt = n > 0 && owners[n - 1].phase === o.phase ? !alt : false;
      segs.push({ cls: 'phase-' + o.phase + (alt ? ' alt' : ''), bytes: o.charges[d.name], owner: o.id, phase: o.phase, prov,
        label: o.id + ' · ' + (PHASE_WORD[o.phase] || o.phase), tip: o.id + '\n' + (PHASE_WORD[o.phase] || o.phase) + ' · ' + bytes(o.charges[d.name]) + '\nfigure: ' + prov });
    });
    if (d.external_bytes > 0) segs.push({ cls: 'outside', bytes: d.external_bytes, label: 'outside CapyCTL', tip: 'held outside CapyCTL\n' + bytes(d.external_bytes) + '\nfigure: measured' });
    if (d.free_bytes > 0) segs.push({ cls: 'free', bytes: d.free_bytes, label: 'free', tip: 'free under the managed limit\n' + bytes(d.free_bytes) });
    const beyond = Math.max(0, cap - managed);
    const reserve = Math.min(d.free_reserve_bytes || 0, beyond);
    if (reserve > 0) segs.push({ cls: 'reserve', bytes: reserve, label: 'reserve', tip: 'free reserve (never charged)\n' + bytes(reserve) });
    if (beyond - reserve > 0) segs.push({ cls: 'unmanaged', bytes: beyond - reserve, label: 'not managed', tip: 'beyond the managed limit\n' + bytes(beyond - reserve) });

    const W = 1000;
    const svg = sv('svg', { cls: 'bar', viewBox: '0 0 ' + W + ' 20', preserveAspectRatio: 'none', role: 'group',
      'aria-label': domainTitle(d) + ' memory', 'data-domain': d.name });
    let x = 0;
    const list = el('ul', { cls: 'segments' });
    for (const s of segs) {
      const w = (s.bytes / cap) * W;
      const rect = sv('rect', { x: x.toFixed(2), y: 0, width: Math.max(w, 0).toFixed(2), height: 20, cls: 'seg ' + s.cls, tabindex: s.owner ? 0 : null,
        'data-owner': s.owner, 'data-phase': s.phase, 'data-provenance': s.prov, 'aria-label': s.tip.replace(/\n/g, ', ') },
      sv('title', { text: s.tip }));
      rect.addEventListener('pointerenter', (e) => showTip(s.tip, e.clientX, e.clientY));
      rect.addEventListener('pointermove', (e) => moveTip(e.clientX, e.clientY));
      rect.addEventListener('pointerleave', hideTip);
      rect.addEventListener('focus', () => { const b = rect.getBoundingClientRect(); showTip(s.tip, b.left + b.width / 2, b.bottom); });
      rect.addEventListener('blur', hideTip);
      svg.append(rect);
      x += w;
      if (s.owner) list.append(el('li', { 'data-owner': s.owner, 'data-phase': s.phase, text: s.label + ' ' + bytes(s.bytes) + ' (' + s.prov + ')' }));
    }
    if (managed > 0 && managed < cap) {
      const lx = (managed / cap) * W;
      svg.append(sv('line', { cls: 'limit', x1: lx, x2: lx, y1: 0, y2: 20, 'vector-effect': 'non-scaling-stroke' }, sv('title', { text: 'managed limit ' + bytes(managed) })));
    }
    const gpu = (host.gpus || []).find((g) => g.uuid && g.uuid === d.device_uuid);
    const used = (d.charged_bytes || 0) + (d.external_bytes || 0);
    return el('div', { cls: 'domain', 'data-domain': d.name },
      el('div', { cls: 'domain-head' },
        el('span', { cls: 'name', text: domainTitle(d) }),
        el('span', { cls: 'figures', text: bytes(used) + ' held of ' + bytes(managed) + ' managed · ' + bytes(d.capacity_bytes) + ' total' +
          (gpu ? ' · card reports ' + bytes(gpu.used_bytes) + ' used' : '') })),
      svg, list);
  }

  function showTip(text, x, y) {
    const t = $('tooltip');
    t.textContent = text;
    t.hidden = false;
    moveTip(x, y);
  }
  function moveTip(x, y) {
    const t = $('tooltip');
    const w = t.offsetWidth;
    t.style.left = Math.max(4, Math.min(window.innerWidth - w - 4, x + 12)) + 'px';
    t.style.top = (y + 14) + 'px';
  }
  function hideTip() { $('tooltip').hidden = true; }

  // Actions offered for an instance state: [label, action, evict, words].
  function actionsFor(state) {
    switch (state) {
      case 'ready': return [['Park', 'park', false], ['Stop', 'stop', false]];
      case 'parked': return [['Wake', 'start', false], ['Stop', 'stop', false]];
      case 'stopped': case 'failed': return [['Start', 'start', false], ['Start, evicting idle models', 'start', true]];
      default: return [['Stop', 'stop', false]];
    }
  }
  const ACTION_WORDS = {
    park: 'Its engine sleeps and gives back GPU memory; the next request wakes it (an engine that cannot sleep is stopped).',
    stop: 'Its engine stops; requests in flight are drained first.',
    start: 'Its engine starts, or wakes in place if it is parked.',
    evict: 'Its engine starts; CapyCTL parks or stops idle models to make room.',
  };

  function renderModels(snap) {
    const root = $('deployments');
    root.replaceChildren();
    const deps = snap.deployments || [];
    if (!deps.length) root.append(el('p', { cls: 'hint', text: 'No deployment yet: capyctl deploy <file.hcl>.' }));
    for (const d of deps) {
      const req = d.requests || {};
      const head = el('div', { cls: 'dep-head' },
        el('h3', { text: d.name }),
        el('span', { cls: 'badge st-' + d.state, text: d.state }),
        el('span', { cls: 'meta', text: 'engine ' + d.engine + ' · ' + d.api + ' · routes ' + (d.routes || []).join(', ') + ' · revision ' + d.revision + ' · desired ' + d.desired }),
        el('span', { cls: 'meta', 'data-requests': d.name, text: 'in flight ' + (req.in_flight ?? 0) + ' · waiting ' + (req.waiting ?? 0) }));
      const tbody = el('tbody');
      for (const i of d.instances || []) {
        const acts = el('td', { cls: 'actions' });
        for (const [label, action, evict] of actionsFor(i.state)) {
          acts.append(el('button', { type: 'button', cls: action === 'stop' ? 'danger' : '', 'data-action': evict ? 'evict' : action,
            'data-instance': i.id, text: label, onclick: () => confirmAction(d, i, action, evict, label) }));
        }
        const charges = Object.entries(i.charges || {}).map(([k, v]) => k + ' ' + bytes(v)).join(', ');
        tbody.append(el('tr', { 'data-instance': i.id, 'data-state': i.state },
          el('td', { cls: 'mono', text: i.id }),
          el('td', {}, el('span', { cls: 'badge st-' + i.state, text: i.state })),
          el('td', { text: i.residency || '–' }),
          el('td', { text: charges || '–' }),
          el('td', { text: (i.last_transition || '–') }),
          el('td', { title: i.since, text: ago(i.since) }),
          el('td', { text: i.released || '–' }),
          el('td', {}, i.last_error ? el('span', { cls: 'err', title: i.last_error.at, text: i.last_error.code + ': ' + i.last_error.message }) : '–'),
          acts));
      }
      const table = el('table', {},
        el('thead', {}, el('tr', {}, ...['Instance', 'State', 'Residency', 'Memory', 'Last transition', 'Since', 'Released', 'Last error', 'Actions'].map((h) => el('th', { scope: 'col', text: h })))),
        tbody);
      root.append(el('article', { cls: 'dep', 'data-deployment': d.name }, head, el('div', { cls: 'table-wrap' }, table)));
    }
  }

  // confirmAction asks, then posts the action with an idempotency key; a
  // call that broke off is sent again with the same key, so it applies once.
  function confirmAction(dep, inst, action, evict, label) {
    const dlg = $('confirm');
    $('confirm-text').textContent = label + ' ' + inst.id + '?';
    $('confirm-detail').textContent = ACTION_WORDS[evict ? 'evict' : action];
    $('confirm-ok').textContent = label;
    dlg.returnValue = '';
    dlg.onclose = async () => {
      if (dlg.returnValue !== 'ok') return;
      const key = randomKey();
      const status = $('action-status');
      status.classList.remove('error');
      status.textContent = label + ' ' + inst.id + '…';
      const path = API + '/deployments/' + encodeURIComponent(dep.name) + '/instances/' + inst.index + '/actions';
      const body = { action, evict: evict || undefined };
      for (let attempt = 0; attempt < 2; attempt++) {
        try {
          const { res } = await api('POST', path, body, { 'Idempotency-Key': key });
          status.textContent = label + ' ' + inst.id + ': accepted' + (res.headers.get('Idempotent-Replayed') ? ' (replayed)' : '');
          return;
        } catch (e) {
          if (e instanceof APIError) {
            status.classList.add('error');
            status.textContent = label + ' ' + inst.id + ' refused: ' + (e.code ? e.code + ': ' : '') + e.message;
            return;
          }
          if (attempt === 1) {
            status.classList.add('error');
            status.textContent = label + ' ' + inst.id + ': the role did not answer (' + e.message + ')';
          }
        }
      }
    };
    dlg.showModal();
    $('confirm-cancel').focus();
  }

  // ------------------------------------------------------------ engine log

  function renderLogChoices(snap) {
    const sel = $('log-instance');
    const opts = [];
    for (const d of snap.deployments || []) for (const i of d.instances || []) opts.push([d.name + '/' + i.index, i.id + ' (' + i.state + ')', i.state]);
    if (!state.logSel || !opts.some((o) => o[0] === state.logSel)) {
      const ready = opts.find((o) => o[2] === 'ready') || opts[0];
      state.logSel = ready ? ready[0] : '';
      scheduleLog();
    }
    sel.replaceChildren(...opts.map(([v, t]) => el('option', { value: v, text: t, selected: v === state.logSel })));
  }

  function scheduleLog() {
    if (state.logTimer) return;
    state.logTimer = setTimeout(() => { state.logTimer = null; refreshLog(); }, 250);
  }

  async function refreshLog() {
    const sel = state.logSel;
    const pre = $('log-text');
    if (!sel) { pre.textContent = 'No instance.'; return; }
    if (!pre.textContent) pre.textContent = 'Loading…';
    const i = sel.lastIndexOf('/');
    try {
      const { data } = await api('GET', API + '/deployments/' + encodeURIComponent(sel.slice(0, i)) + '/engine-log?instance=' + sel.slice(i + 1) + '&kib=' + LOG_KIB);
      pre.textContent = (data.truncated ? '… (older lines cut)\n' : '') + (data.text || '(no output yet)');
      pre.scrollTop = pre.scrollHeight;
    } catch (e) {
      pre.textContent = 'No log: ' + e.message;
    }
  }

  // ------------------------------------------------------------ playground

  // loadKeys lists the inference keys the playground may use by name, and
  // offers to paste another.
  async function loadKeys() {
    const sel = $('pg-key');
    let keys = [];
    try { keys = (await api('GET', '/dashboard/playground/keys')).data.keys || []; } catch (e) { /* paste one */ }
    state.pg.keys = keys;
    sel.replaceChildren(...keys.map((k) => el('option', { value: k.name, title: k.description, text: k.name + ' — ' + k.description })),
      el('option', { value: '', text: 'another key (paste it)' }));
    $('pg-key-pasted').hidden = keys.length > 0;
  }

  function renderPlaygroundModels(snap) {
    const sel = $('pg-model');
    const before = sel.value;
    const models = [];
    for (const d of snap.deployments || []) {
      if (d.api && d.api !== 'chat') continue;
      for (const r of d.routes || [d.name]) models.push([r, d.state]);
    }
    models.sort((a, b) => a[0].localeCompare(b[0]));
    sel.replaceChildren(...models.map(([m, st]) => el('option', { value: m, text: m + ' (' + st + ')', selected: m === before })));
    if (!before) {
      const ready = models.find((m) => m[1] === 'ready');
      if (ready) sel.value = ready[0];
    }
  }

  const METRIC_WORDS = {
    total_ms: ['total', 'ms'], queue_ms: ['queued', 'ms'], activation_ms: ['activation (wake or start)', 'ms'],
    engine_ms: ['engine, from forward to end', 'ms'], ttft_ms: ['time to first token', 'ms'], prefill_ms: ['prefill', 'ms'],
    decode_tokens_per_second: ['decode rate', 'tokens/s'], input_tokens: ['input tokens', ''], output_tokens: ['output tokens', ''],
    cached_tokens: ['cached tokens', ''],
  };

  function showMetrics(m) {
    const table = $('pg-metrics');
    const rows = Object.entries(m || {}).map(([k, f]) => {
      const [word, unit] = METRIC_WORDS[k] || [k.replace(/_/g, ' '), ''];
      const v = Number(f.value);
      return el('tr', { 'data-metric': k },
        el('th', { scope: 'row', text: word }),
        el('td', { text: (Number.isInteger(v) ? String(v) : v.toFixed(1)) + (unit ? ' ' + unit : '') }),
        el('td', { text: f.source || '' }));
    });
    table.tBodies[0].replaceChildren(...rows);
    table.hidden = rows.length === 0;
  }

  // playgroundSend sends the message and shows the answer as it streams:
  // the text, the request ID from the answer's header, progress while the
  // model wakes, and the figures the role sends before [DONE].
  async function playgroundSend(ev) {
    ev.preventDefault();
    if (state.pg.abort) state.pg.abort.abort();
    const model = $('pg-model').value;
    const keyName = $('pg-key').value;
    const pasted = $('pg-key-pasted').value.trim();
    const status = $('pg-status');
    const out = $('pg-answer');
    status.classList.remove('error');
    out.textContent = '';
    out.dataset.chunks = '0';
    $('pg-request-id').textContent = '–';
    showMetrics(null);
    if (!model) { status.textContent = 'No chat model to ask.'; return; }
    const headers = { 'X-CapyCTL-CSRF': state.csrf, 'Content-Type': 'application/json', Accept: 'text/event-stream' };
    if (keyName) headers['X-CapyCTL-Key-Name'] = keyName;
    else if (pasted) headers['X-CapyCTL-Key'] = pasted;
    else { status.textContent = 'Paste an API key, or choose one.'; status.classList.add('error'); return; }
    const ctrl = new AbortController();
    state.pg.abort = ctrl;
    $('pg-send').disabled = true;
    $('pg-stop').hidden = false;
    status.textContent = 'Asking ' + model + '…';
    const body = { model, stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: $('pg-prompt').value }] };
    try {
      const res = await fetch('/dashboard/playground/v1/chat/completions', {
        method: 'POST', headers, body: JSON.stringify(body), credentials: 'same-origin', cache: 'no-store', signal: ctrl.signal,
      });
      $('pg-request-id').textContent = res.headers.get('X-CapyCTL-Request-Id') || '–';
      if (res.status === 401 && !keyName) throw new Error('the inference API refused the pasted key');
      if (!res.ok) {
        const err = await res.json().catch(() => null);
        throw new Error(err && err.error ? err.error.code + ': ' + err.error.message : 'HTTP ' + res.status);
      }
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      let done = false;
      while (!done) {
        const r = await reader.read();
        if (r.done) break;
        buf += r.value.replace(/\r\n?/g, '\n');
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const frame = buf.slice(0, i);
          buf = buf.slice(i + 2);
          for (const line of frame.split('\n')) {
            if (line.startsWith(': x-capyctl-metrics ')) {
              try { showMetrics(JSON.parse(line.slice(20))); } catch (e) { /* a figure the page cannot read */ }
            } else if (line.startsWith(': capyctl progress ')) {
              try { const p = JSON.parse(line.slice(19)); status.textContent = model + ': ' + p.state + ' (' + Math.round(p.elapsed_ms / 100) / 10 + ' s)…'; } catch (e) { /* ignore */ }
            } else if (line.startsWith('data: ')) {
              const data = line.slice(6);
              if (data === '[DONE]') { done = true; continue; }
              let chunk;
              try { chunk = JSON.parse(data); } catch (e) { continue; }
              if (chunk.error) throw new Error((chunk.error.code ? chunk.error.code + ': ' : '') + chunk.error.message);
              for (const c of chunk.choices || []) {
                const d = c.delta || {};
                if (d.content) {
                  out.textContent += d.content;
                  out.dataset.chunks = String(Number(out.dataset.chunks || 0) + 1);
                }
              }
              if (out.textContent) status.textContent = model + ' is answering…';
            }
          }
        }
      }
      status.textContent = done ? model + ' answered.' : model + ': the answer ended without [DONE].';
      if (!done) status.classList.add('error');
    } catch (e) {
      status.classList.add('error');
      status.textContent = ctrl.signal.aborted ? 'Stopped: the request was cancelled on the engine.' : 'The request failed: ' + e.message;
    } finally {
      if (state.pg.abort === ctrl) state.pg.abort = null;
      $('pg-send').disabled = false;
      $('pg-stop').hidden = true;
    }
  }

  // ------------------------------------------------------------ API keys

  function limitsText(l) {
    const parts = [];
    if (l.rpm) parts.push(l.rpm + ' requests/min');
    if (l.tpm) parts.push(l.tpm + ' tokens/min');
    if (l.concurrency) parts.push(l.concurrency + ' at once');
    if (l.monthly_tokens) parts.push(l.monthly_tokens + ' tokens/month');
    return parts.join(', ') || 'none';
  }

  // loadAPIKeys lists the named keys (never a key: the role has none to
  // show); a role without them hides the keys and usage panels.
  async function loadAPIKeys() {
    if (state.keysOff) return;
    let keys;
    try {
      keys = (await api('GET', API + '/api-keys')).data.keys || [];
    } catch (e) {
      if (e instanceof APIError && e.code === 'unsupported') {
        state.keysOff = true;
        $('keys').hidden = true;
        $('usage').hidden = true;
      }
      return;
    }
    $('key-rows').replaceChildren(...keys.map((k) => el('tr', { 'data-key': k.name, 'data-expired': k.expired ? 'true' : 'false' },
      el('td', { text: k.name }),
      el('td', { cls: 'mono', text: k.role ? '(credentials file)' : (k.prefix || '–') }),
      el('td', { text: (k.models || []).length ? k.models.join(', ') : 'every model' }),
      el('td', { text: limitsText(k.limits || {}) }),
      el('td', { text: k.weight }),
      el('td', { title: k.created_at, text: ago(k.created_at) }),
      el('td', { title: k.last_used_at || '', text: k.last_used_at ? ago(k.last_used_at) : 'never' }),
      el('td', { title: k.expires_at || '', text: k.expired ? 'expired' : k.expires_at ? new Date(k.expires_at).toLocaleString([], { hour12: false }) : 'never' }),
      el('td', { cls: 'actions' }, el('button', { type: 'button', cls: 'danger', 'data-revoke': k.name, text: 'Revoke', onclick: () => revokeAPIKey(k.name) })),
    )));
  }

  function keyStatus(text, error) {
    const s = $('key-status');
    s.classList.toggle('error', !!error);
    s.textContent = text;
  }

  // createAPIKey makes a key from the form and shows it, this once.
  async function createAPIKey(ev) {
    ev.preventDefault();
    const num = (id) => { const v = $(id).value.trim(); return v === '' ? 0 : Number(v); };
    const body = {
      name: $('key-name').value.trim(),
      models: $('key-models').value.split(',').map((m) => m.trim()).filter(Boolean),
      limits: { rpm: num('key-rpm'), tpm: num('key-tpm'), concurrency: num('key-concurrency'), monthly_tokens: num('key-monthly') },
    };
    const exp = $('key-expires').value.trim();
    if (exp && exp !== 'never') body.expires = exp;
    keyStatus('Creating ' + body.name + '…');
    try {
      const { data } = await api('POST', API + '/api-keys', body);
      $('key-new-name').textContent = data.name;
      $('key-new-value').value = data.key;
      $('key-new').hidden = false;
      $('key-form').reset();
      keyStatus('');
      $('key-new-value').select();
      loadAPIKeys();
    } catch (e) {
      keyStatus('Not created: ' + (e.code ? e.code + ': ' : '') + e.message, true);
    }
  }

  async function copyNewKey() {
    const v = $('key-new-value');
    v.select();
    try { await navigator.clipboard.writeText(v.value); keyStatus('Copied.'); } catch (e) { keyStatus('Select the key and copy it (the browser refused the clipboard).'); }
  }

  // forgetNewKey clears the key from the page: it cannot be shown again.
  function forgetNewKey() {
    $('key-new-value').value = '';
    $('key-new-name').textContent = '';
    $('key-new').hidden = true;
  }

  function revokeAPIKey(name) {
    const dlg = $('confirm');
    $('confirm-text').textContent = 'Revoke the key ' + name + '?';
    $('confirm-detail').textContent = name === 'default'
      ? 'The role\'s own key (its credentials file\'s api_key) stops working: every client that uses it gets 401.'
      : 'Its next request is answered 401. Its usage stays.';
    $('confirm-ok').textContent = 'Revoke';
    dlg.returnValue = '';
    dlg.onclose = async () => {
      if (dlg.returnValue !== 'ok') return;
      try {
        await api('DELETE', API + '/api-keys/' + encodeURIComponent(name));
        keyStatus('Revoked ' + name + '.');
      } catch (e) {
        keyStatus('Not revoked: ' + (e.code ? e.code + ': ' : '') + e.message, true);
      }
      loadAPIKeys();
    };
    dlg.showModal();
    $('confirm-cancel').focus();
  }

  // loadUsage draws tokens per key and hour, and the totals per key.
  async function loadUsage() {
    if (state.keysOff) return;
    const since = $('usage-since').value || '24h';
    let rows;
    try {
      rows = (await api('GET', API + '/usage?since=' + encodeURIComponent(since))).data.rows || [];
    } catch (e) {
      if (e instanceof APIError && e.code === 'unsupported') $('usage').hidden = true;
      return;
    }
    const hours = Math.round(parseInt(since, 10));
    const now = Date.now();
    const end = now - (now % 3600000);
    const start = end - (hours - 1) * 3600000;
    const byKey = new Map();
    const totals = new Map();
    for (const r of rows) {
      const h = new Date(r.hour).getTime();
      const t = (r.prompt_tokens || 0) + (r.completion_tokens || 0);
      if (!byKey.has(r.key)) byKey.set(r.key, new Map());
      const m = byKey.get(r.key);
      m.set(h, (m.get(h) || 0) + t);
      const tot = totals.get(r.key) || { requests: 0, errors: {}, prompt: 0, completion: 0, cached: 0 };
      tot.requests += r.requests || 0;
      tot.prompt += r.prompt_tokens || 0;
      tot.completion += r.completion_tokens || 0;
      tot.cached += r.cached_tokens || 0;
      for (const [c, n] of Object.entries(r.errors || {})) tot.errors[c] = (tot.errors[c] || 0) + n;
      totals.set(r.key, tot);
    }
    const keys = [...byKey.keys()].sort();
    drawUsage(keys, byKey, start, end, hours);
    $('usage-legend').replaceChildren(...keys.map((k) => el('li', {}, el('span', { cls: 'swatch line ' + colour('key:' + k) }), k)));
    $('usage-rows').replaceChildren(...[...totals.keys()].sort().map((k) => {
      const t = totals.get(k);
      const errs = Object.entries(t.errors).sort().map(([c, n]) => c + ' ' + n).join(', ');
      return el('tr', { 'data-usage-key': k },
        el('td', { text: k }), el('td', { text: t.requests }), el('td', { text: errs || '–' }),
        el('td', { 'data-prompt': t.prompt, text: t.prompt }), el('td', { 'data-completion': t.completion, text: t.completion }),
        el('td', { text: t.cached }));
    }));
  }

  function drawUsage(keys, byKey, start, end, hours) {
    const svg = $('chart-usage');
    const W = 640, H = 150, L = 50, R = 8, T = 8, B = 18;
    let max = 0;
    for (const m of byKey.values()) for (const v of m.values()) max = Math.max(max, v);
    max = max > 0 ? max * 1.1 : 1;
    const x = (h) => L + (hours <= 1 ? 0 : ((h - start) / (end - start || 1)) * (W - L - R));
    const y = (v) => T + (1 - v / max) * (H - T - B);
    const kids = [
      sv('line', { cls: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B }),
      sv('line', { cls: 'axis', x1: L, x2: L, y1: T, y2: H - B }),
      sv('text', { cls: 'axis-label', x: L - 4, y: T + 8, 'text-anchor': 'end', text: Math.round(max) }),
      sv('text', { cls: 'axis-label', x: L - 4, y: H - B, 'text-anchor': 'end', text: '0' }),
      sv('text', { cls: 'axis-label', x: W - R, y: H - 4, 'text-anchor': 'end', text: 'this hour' }),
      sv('text', { cls: 'axis-label', x: L, y: H - 4, text: '−' + hours + ' h' }),
    ];
    for (const k of keys) {
      const m = byKey.get(k);
      const pts = [];
      for (let h = start; h <= end; h += 3600000) pts.push(x(h).toFixed(1) + ',' + y(m.get(h) || 0).toFixed(1));
      kids.push(sv('polyline', { cls: 'series ' + colour('key:' + k), points: pts.join(' '), 'data-usage-series': k }));
      const [lx, ly] = pts[pts.length - 1].split(',');
      kids.push(sv('circle', { cls: 'dot ' + colour('key:' + k), cx: lx, cy: ly, r: 2.2 }));
    }
    svg.replaceChildren(...kids);
  }

  // ------------------------------------------------------------ charts

  // startSampling reads the load and latency views (and the request
  // counters) every SAMPLE_MS while the page is visible.
  function startSampling() {
    clearInterval(state.sampleTimer);
    clearInterval(state.usageTimer);
    state.sampleTimer = null;
    state.usageTimer = null;
    if (document.visibilityState !== 'visible' || !state.csrf) return;
    sample();
    state.sampleTimer = setInterval(sample, SAMPLE_MS);
    loadUsage();
    state.usageTimer = setInterval(loadUsage, USAGE_MS);
  }

  function parseCounters(text) {
    const out = {};
    for (const line of String(text).split('\n')) {
      if (!line.startsWith('capyctl_requests_total{')) continue;
      const m = /deployment="([^"]*)"/.exec(line);
      const v = Number(line.slice(line.lastIndexOf(' ') + 1));
      if (m && Number.isFinite(v)) out[m[1]] = (out[m[1]] || 0) + v;
    }
    return out;
  }

  async function sample() {
    try {
      const [load, lat, metrics, reqs] = await Promise.all([
        api('GET', API + '/metrics/load'), api('GET', API + '/metrics/latency'), api('GET', '/metrics', undefined, { Accept: 'text/plain' }),
        api('GET', API + '/requests?limit=' + REQUEST_ROWS),
      ]);
      drawRequests(reqs.data.requests || []);
      const t = Date.now();
      const counts = parseCounters(metrics.data);
      const s = { t, dep: {} };
      const get = (n) => (s.dep[n] = s.dep[n] || {});
      // Every deployment has a line, at zero until the router has seen a
      // request for it.
      for (const d of (state.snap && state.snap.deployments) || []) {
        const x = get(d.name);
        x.inflight = 0;
        x.waiting = 0;
        if (state.prevCounts) x.rate = 0;
      }
      for (const d of load.data.deployments || []) {
        const x = get(d.deployment);
        x.inflight = d.requests.in_flight || 0;
        x.waiting = d.requests.waiting || 0;
      }
      for (const d of lat.data.deployments || []) {
        const tot = (d.series || {}).total;
        if (tot) { get(d.deployment).p50 = tot.p50_ms; get(d.deployment).p99 = tot.p99_ms; }
      }
      if (state.prevCounts) {
        const dt = (t - state.prevCounts.t) / 1000;
        for (const [n, c] of Object.entries(counts)) {
          const before = state.prevCounts.c[n] ?? 0; // a counter appears at its first request
          get(n).rate = dt > 0 ? Math.max(0, c - before) / dt : 0;
        }
      }
      state.prevCounts = { t, c: counts };
      state.samples.push(s);
      while (state.samples.length > MAX_SAMPLES) state.samples.shift();
      drawCharts();
    } catch (e) { console.warn('dashboard: sampling the views failed (the next tick tries again):', e.message); }
  }

  // drawRequests lists the request log's newest records, each with the
  // route it came to.
  function drawRequests(list) {
    const ms = (v) => (v == null ? '–' : v < 1000 ? v.toFixed(v < 10 ? 1 : 0) + ' ms' : (v / 1000).toFixed(1) + ' s');
    $('request-rows').replaceChildren(...list.map((r) => el('tr', { 'data-request': r.id },
      el('td', { title: r.received_at, text: ago(r.received_at) }),
      el('td', { text: r.deployment || '–' }),
      el('td', {}, el('span', { cls: 'badge route', 'data-route': r.route, text: r.route + (r.stream ? ' · stream' : '') })),
      el('td', { text: r.outcome + (r.code && r.code !== r.outcome ? ' (' + r.code + ')' : '') }),
      el('td', { text: r.status || '–' }),
      el('td', { text: ms(r.total_ms) }),
      el('td', { text: ms(r.ttfb_ms) }),
      el('td', { text: (r.prompt_tokens ?? '–') + ' / ' + (r.completion_tokens ?? '–') }),
      el('td', { text: r.key || '–' }),
      el('td', { cls: 'mono', text: r.id }),
    )));
  }

  function colour(name) {
    if (!state.series.has(name)) state.series.set(name, state.series.size % 6);
    return 's' + state.series.get(name);
  }

  function drawCharts() {
    const names = new Set();
    for (const s of state.samples) for (const n of Object.keys(s.dep)) names.add(n);
    const sorted = [...names].sort();
    drawChart($('chart-rate'), sorted, [{ key: 'rate' }], (v) => v.toFixed(v < 10 ? 2 : 0) + '/s');
    drawChart($('chart-load'), sorted, [{ key: 'inflight' }, { key: 'waiting', dashed: true }], (v) => v.toFixed(0));
    drawChart($('chart-latency'), sorted, [{ key: 'p50' }, { key: 'p99', dashed: true }], (v) => v < 1000 ? v.toFixed(v < 10 ? 1 : 0) + ' ms' : (v / 1000).toFixed(1) + ' s');
    $('chart-legend').replaceChildren(...sorted.map((n) => el('li', {}, el('span', { cls: 'swatch line ' + colour(n) }), n)));
  }

  function drawChart(svg, names, keys, fmt) {
    const W = 320, H = 130, L = 44, R = 6, T = 8, B = 16;
    const samples = state.samples;
    let max = 0;
    for (const s of samples) for (const n of names) for (const k of keys) max = Math.max(max, s.dep[n]?.[k.key] ?? 0);
    max = max > 0 ? max * 1.1 : 1;
    const x = (i) => L + (MAX_SAMPLES <= 1 ? 0 : ((i + MAX_SAMPLES - samples.length) / (MAX_SAMPLES - 1)) * (W - L - R));
    const y = (v) => T + (1 - v / max) * (H - T - B);
    const kids = [
      sv('line', { cls: 'axis', x1: L, x2: W - R, y1: H - B, y2: H - B }),
      sv('line', { cls: 'axis', x1: L, x2: L, y1: T, y2: H - B }),
      sv('text', { cls: 'axis-label', x: L - 4, y: T + 8, 'text-anchor': 'end', text: fmt(max) }),
      sv('text', { cls: 'axis-label', x: L - 4, y: H - B, 'text-anchor': 'end', text: '0' }),
      sv('text', { cls: 'axis-label', x: W - R, y: H - 3, 'text-anchor': 'end', text: 'now' }),
      sv('text', { cls: 'axis-label', x: L, y: H - 3, text: '−' + Math.round((MAX_SAMPLES * SAMPLE_MS) / 60000) + ' min' }),
    ];
    for (const n of names) {
      for (const k of keys) {
        const pts = [];
        samples.forEach((s, i) => { const v = s.dep[n]?.[k.key]; if (v != null) pts.push(x(i).toFixed(1) + ',' + y(v).toFixed(1)); });
        if (!pts.length) continue;
        kids.push(sv('polyline', { cls: 'series ' + colour(n) + (k.dashed ? ' dashed' : ''), points: pts.join(' '), 'data-series': n + ':' + k.key, 'data-points': pts.length }));
        // The latest value as a dot, so that one sample shows too.
        const [lx, ly] = pts[pts.length - 1].split(',');
        kids.push(sv('circle', { cls: 'dot ' + colour(n), cx: lx, cy: ly, r: 2.2 }));
      }
    }
    svg.replaceChildren(...kids);
  }

  document.addEventListener('DOMContentLoaded', boot);
})();
