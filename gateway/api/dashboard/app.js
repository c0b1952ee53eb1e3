// sluice's dashboard: polls GET /admin/stats once a second with the admin key the operator typed
// (kept in this closure only: never in the URL, a cookie or storage), keeps the last five minutes
// of figures and draws them as SVG. Every name that comes from the server (tiers, models,
// tenants, reasons) goes into the page as text (textContent, SVG text nodes), never as markup.
'use strict';
(function () {
  const WINDOW_MS = 5 * 60 * 1000;
  const POLL_MS = 1000;
  const SVG = 'http://www.w3.org/2000/svg';
  const COLORS = ['#2f5bd3', '#c62828', '#1a7f37', '#b26a00', '#7b3fb3', '#00838f', '#ad1457',
    '#5d4037'];

  let key = null;       // the admin key, in memory only
  let timer = null;
  let history = [];     // [{t: ms, s: stats}]
  const tierCards = new Map();
  const modelCards = new Map();

  const $ = (id) => document.getElementById(id);

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function svgEl(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const k in attrs) e.setAttribute(k, String(attrs[k]));
    return e;
  }

  // ---- formatting ----

  function fmtSeconds(s) {
    if (s === null || s === undefined || !isFinite(s)) return '–';
    if (s < 1e-3) return (s * 1e6).toFixed(0) + ' µs';
    if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + ' ms';
    return s.toFixed(2) + ' s';
  }
  function fmtNum(v, digits) {
    if (v === null || v === undefined || !isFinite(v)) return '–';
    if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(2) + 'M';
    if (Math.abs(v) >= 1e4) return (v / 1e3).toFixed(1) + 'k';
    return Number.isInteger(v) && digits === undefined ? String(v) : v.toFixed(digits ?? 2);
  }
  function fmtPct(v) {
    return v === null || v === undefined || !isFinite(v) ? '–' : (v * 100).toFixed(1) + ' %';
  }
  function fmtMoney(v) {
    if (!isFinite(v)) return '–';
    return v === 0 ? '0' : Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3);
  }
  // Counts: whole numbers as they are, an axis' half-way tick with its decimal.
  const fmtCount = (v) => (v === null || v === undefined || !isFinite(v) ? '–'
    : Number.isInteger(v) ? fmtNum(v) : fmtNum(v, 1));
  const sum = (o) => Object.values(o || {}).reduce((a, b) => a + b, 0);

  // ---- charts ----

  // A chart: a titled SVG with a legend. series: [{name, color, dashed, points: [[t, v]]}].
  function makeChart(parent, title, fmt, log) {
    const box = el('div', 'chart');
    box.appendChild(el('h4', null, title));
    const svg = svgEl('svg', {viewBox: '0 0 320 110', role: 'img', 'aria-label': title});
    const legend = el('div', 'legend');
    box.append(svg, legend);
    parent.appendChild(box);
    return {box, svg, legend, fmt, title, log: !!log};
  }

  // The x axis spans the history kept, from one minute up to five.
  function span(now) {
    const first = history.length ? history[0].t : now;
    return Math.min(WINDOW_MS, Math.max(60 * 1000, now - first));
  }
  function ago(ms) {
    return ms >= 60000 ? '-' + Math.round(ms / 60000) + ' min' : '-' + Math.round(ms / 1000) + ' s';
  }

  // The y axis' top: 1, 2 or 5 times a power of ten, at least the value (1 for nothing).
  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }

  // Draws series over the history's span. Latency charts (c.log) have a log scale from a power
  // of ten below their smallest value to one above their largest (the objective included), so
  // that a p50 of a millisecond and an objective of seconds both show. A gap of more than
  // GAP_MS between two samples (polls that did not happen) breaks a line.
  function drawChart(c, series, now, fixedMax) {
    const W = 320, H = 110, L = 44, R = 4, T = 6, B = 16, GAP_MS = 5000;
    const width = span(now);
    while (c.svg.firstChild) c.svg.removeChild(c.svg.firstChild);
    let lo = Infinity, hi = 0;
    for (const s of series)
      for (const p of s.points)
        if (p[1] !== null && isFinite(p[1])) {
          if (p[1] > hi) hi = p[1];
          if (p[1] > 0 && p[1] < lo) lo = p[1];
        }
    let y, ticks;
    if (c.log) {
      const top = Math.pow(10, Math.ceil(Math.log10(hi > 0 ? hi * 1.1 : 1)));
      let bottom = Math.pow(10, Math.floor(Math.log10(isFinite(lo) ? lo : top / 1000)));
      if (bottom >= top) bottom = top / 10;
      const a = Math.log10(bottom), b = Math.log10(top);
      y = (v) => T + (H - T - B) * (1 - (Math.log10(Math.max(v, bottom)) - a) / (b - a));
      ticks = [];
      const step = Math.max(1, Math.ceil((b - a) / 3));
      for (let e = b; e >= a; e -= step) ticks.push(Math.pow(10, e));
    } else {
      const max = fixedMax || niceCeil(hi * 1.1);
      y = (v) => T + (H - T - B) * (1 - Math.min(v, max) / max);
      ticks = [0, max / 2, max];
    }
    const x = (t) => L + (W - L - R) * (1 - (now - t) / width);
    for (const v of ticks) {
      c.svg.appendChild(svgEl('line', {x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: '#e3e6eb'}));
      const label = svgEl('text', {x: L - 3, y: y(v) + 3, 'text-anchor': 'end'});
      label.textContent = c.fmt(v);
      c.svg.appendChild(label);
    }
    for (const [t, txt] of [[now - width, ago(width)], [now, 'now']]) {
      const label = svgEl('text', {x: x(t), y: H - 4, 'text-anchor': t === now ? 'end' : 'start'});
      label.textContent = txt;
      c.svg.appendChild(label);
    }
    while (c.legend.firstChild) c.legend.removeChild(c.legend.firstChild);
    for (const s of series) {
      const pts = s.points.filter((p) => p[1] !== null && isFinite(p[1]));
      let run = [];
      const flush = () => {
        if (!run.length) return;
        const line = svgEl('polyline', {
          points: run.map((p) => x(p[0]).toFixed(1) + ',' + y(p[1]).toFixed(1)).join(' '),
          fill: 'none', stroke: s.color, 'stroke-width': s.dashed ? 1 : 1.5,
        });
        if (s.dashed) line.setAttribute('stroke-dasharray', '4 3');
        c.svg.appendChild(line);
        run = [];
      };
      for (const p of pts) {
        if (run.length && p[0] - run[run.length - 1][0] > GAP_MS) flush();
        run.push(p);
      }
      flush();
      const last = pts.length ? pts[pts.length - 1][1] : null;
      let peak = null;
      for (const p of pts) if (peak === null || p[1] > peak) peak = p[1];
      const item = el('span');
      item.dataset.series = s.name;
      item.dataset.last = last === null ? '' : String(last);
      item.dataset.peak = peak === null ? '' : String(peak);
      const swatch = el('i');
      swatch.style.background = s.color;
      item.append(swatch, document.createTextNode(s.name + ' ' + c.fmt(last)));
      c.legend.appendChild(item);
    }
  }


  // ---- figures ----

  function makeFigs(parent, names) {
    const dl = el('dl', 'figs');
    const dd = {};
    for (const [k, label] of names) {
      const d = el('div');
      d.append(el('dt', null, label));
      dd[k] = el('dd', null, '–');
      dd[k].dataset.k = k;
      d.appendChild(dd[k]);
      dl.appendChild(d);
    }
    parent.appendChild(dl);
    return dd;
  }

  // Per second over the samples since the previous one: counter deltas of the tier's decisions.
  function decisionRates(prev, cur, tierName, dt) {
    const out = {};
    if (!prev || dt <= 0) return out;
    const a = (prev.tiers.find((t) => t.tier === tierName) || {}).decisions || {};
    const b = (cur.tiers.find((t) => t.tier === tierName) || {}).decisions || {};
    for (const d of ['admitted', 'degraded', 'rejected']) {
      for (const r of Object.keys(b[d] || {})) {
        const before = (a[d] || {})[r] || 0;
        const name = d === 'admitted' ? 'admitted' : d + ': ' + r;
        out[name] = (out[name] || 0) + Math.max(0, b[d][r] - before) / dt;
      }
    }
    return out;
  }

  function tierCard(name) {
    let c = tierCards.get(name);
    if (c) return c;
    const card = el('div', 'card');
    card.dataset.tier = name;
    card.appendChild(el('h3', null, name));
    const sub = el('p', 'sub');
    card.appendChild(sub);
    const figs = makeFigs(card, [
      ['attainment_1m', 'SLO met (1 min)'], ['attainment_5m', 'SLO met (5 min)'],
      ['ttft_p50', 'TTFT p50'], ['ttft_p99', 'TTFT p99'], ['tpot_p50', 'TPOT p50'],
      ['tpot_p99', 'TPOT p99'], ['admitted_rate', 'Admitted /s'], ['degraded_rate', 'Degraded /s'],
      ['refused_rate', 'Refused /s'], ['refused_5m', 'Refused (5 min)'],
      ['queued', 'Queued (admission)'], ['queued_tokens', 'Queued prompt tokens'],
      ['running', 'Running'],
    ]);
    const charts = {
      ttft: makeChart(card, 'Time to first token (1 min window, log scale)', fmtSeconds, true),
      tpot: makeChart(card, 'Time per output token (1 min window, log scale)', fmtSeconds, true),
      attain: makeChart(card, 'SLO attainment', fmtPct),
      rates: makeChart(card, 'Admission decisions per second', (v) => fmtNum(v, 1) + '/s'),
      queue: makeChart(card, 'Queue', fmtCount),
    };
    charts.rates.box.classList.add('decisions');
    $('tiers').appendChild(card);
    c = {card, sub, figs, charts};
    tierCards.set(name, c);
    return c;
  }

  function modelCard(id, title) {
    let c = modelCards.get(id);
    if (c) return c;
    const card = el('div', 'card');
    card.dataset.model = id;
    card.appendChild(el('h3', null, title));
    const figs = makeFigs(card, [
      ['running', 'Running'], ['queued_requests', 'Queued'],
      ['queued_prompt_tokens', 'Queued prompt tokens'], ['kv', 'KV blocks used'],
      ['kv_cached', 'KV blocks cached'], ['batch', 'Batch tokens / seqs'],
      ['step', 'Step time'], ['busy', 'Worker busy'],
    ]);
    const tiers = el('p', 'sub');
    tiers.dataset.k = 'tiers';
    card.appendChild(tiers);
    const charts = {
      kv: makeChart(card, 'KV cache blocks', fmtCount),
      batch: makeChart(card, 'Batch size', fmtCount),
      step: makeChart(card, 'Step time', fmtSeconds),
      busy: makeChart(card, 'Worker busy ratio', fmtPct),
    };
    $('models').appendChild(card);
    c = {card, figs, charts, tiers};
    modelCards.set(id, c);
    return c;
  }

  function series(name, color, pick, dashed) {
    const points = [];
    for (const h of history) {
      const v = pick(h.s, h);
      if (v !== undefined) points.push([h.t, v]);
    }
    return {name, color, points, dashed: !!dashed};
  }

  function renderTier(t, now) {
    const c = tierCard(t.tier);
    const w1 = t.windows['1m'], w5 = t.windows['5m'];
    c.sub.textContent = 'objectives: TTFT ' + (t.ttft_slo_ms ? t.ttft_slo_ms + ' ms' : 'none') +
      ', TPOT ' + (t.tpot_slo_ms ? t.tpot_slo_ms + ' ms' : 'none');
    const last = history[history.length - 1];
    const rates = last.rates[t.tier] || {};
    let admitted = 0, degraded = 0, refused = 0;
    for (const [k, v] of Object.entries(rates)) {
      if (k === 'admitted') admitted += v;
      else if (k.startsWith('degraded')) degraded += v;
      else refused += v;
    }
    const f = c.figs;
    const set = (k, text, cls) => { f[k].textContent = text; f[k].className = cls || ''; };
    const attainCls = (a) => (a === null ? '' : a >= 0.99 ? 'ok' : 'bad');
    set('attainment_1m', fmtPct(w1.attainment), attainCls(w1.attainment));
    set('attainment_5m', fmtPct(w5.attainment), attainCls(w5.attainment));
    const over = (v, ms) => (v !== null && ms > 0 && v * 1000 > ms ? 'bad' : '');
    set('ttft_p50', fmtSeconds(w1.ttft_p50), over(w1.ttft_p50, t.ttft_slo_ms));
    set('ttft_p99', fmtSeconds(w1.ttft_p99), over(w1.ttft_p99, t.ttft_slo_ms));
    set('tpot_p50', fmtSeconds(w1.tpot_p50), over(w1.tpot_p50, t.tpot_slo_ms));
    set('tpot_p99', fmtSeconds(w1.tpot_p99), over(w1.tpot_p99, t.tpot_slo_ms));
    set('admitted_rate', fmtNum(admitted, 1));
    set('degraded_rate', fmtNum(degraded, 1));
    set('refused_rate', fmtNum(refused, 1), refused > 0 ? 'bad' : '');
    set('refused_5m', fmtNum(sum(w5.refused)), sum(w5.refused) > 0 ? 'bad' : '');
    set('queued', fmtNum(t.admission_queued_requests));
    set('queued_tokens', fmtNum(t.admission_queued_prompt_tokens));
    set('running', fmtNum(t.running));

    const tierOf = (s) => s.tiers.find((x) => x.tier === t.tier);
    const win = (k) => (s) => { const x = tierOf(s); return x ? x.windows['1m'][k] : undefined; };
    drawChart(c.charts.ttft, [
      series('p50', COLORS[0], win('ttft_p50')), series('p99', COLORS[1], win('ttft_p99')),
      series('objective', '#667085', (s) => { const x = tierOf(s);
        return x && x.ttft_slo_ms ? x.ttft_slo_ms / 1000 : undefined; }, true),
    ], now);
    drawChart(c.charts.tpot, [
      series('p50', COLORS[0], win('tpot_p50')), series('p99', COLORS[1], win('tpot_p99')),
      series('objective', '#667085', (s) => { const x = tierOf(s);
        return x && x.tpot_slo_ms ? x.tpot_slo_ms / 1000 : undefined; }, true),
    ], now);
    drawChart(c.charts.attain, [
      series('1 min', COLORS[0], (s) => { const x = tierOf(s);
        return x ? x.windows['1m'].attainment : undefined; }),
      series('5 min', COLORS[2], (s) => { const x = tierOf(s);
        return x ? x.windows['5m'].attainment : undefined; }),
    ], now, 1);
    // One line per decision and reason seen in the last five minutes.
    const names = new Set(['admitted']);
    for (const h of history) for (const k of Object.keys(h.rates[t.tier] || {})) names.add(k);
    const rateSeries = [];
    let i = 0;
    for (const n of [...names].sort()) {
      rateSeries.push(series(n, n === 'admitted' ? COLORS[2] : COLORS[(i++ % 6) + 1],
        (s, h) => (h.rates[t.tier] ? h.rates[t.tier][n] || 0 : undefined)));
    }
    drawChart(c.charts.rates, rateSeries, now);
    drawChart(c.charts.queue, [
      series('queued', COLORS[0], (s) => { const x = tierOf(s);
        return x ? x.admission_queued_requests : undefined; }),
      series('running', COLORS[2], (s) => {
        const x = tierOf(s);
        return x ? x.running : undefined;
      }),
    ], now);
  }

  function renderModel(m, now, several) {
    const id = m.model + '#' + m.replica;
    const c = modelCard(id, several ? m.model + ' (replica ' + m.replica + ')' : m.model);
    const f = c.figs;
    f.running.textContent = fmtNum(m.running);
    f.queued_requests.textContent = fmtNum(m.queued_requests);
    f.queued_prompt_tokens.textContent = fmtNum(m.queued_prompt_tokens);
    f.kv.textContent = fmtNum(m.kv_blocks_used) + ' / ' + fmtNum(m.kv_blocks_total);
    f.kv_cached.textContent = fmtNum(m.kv_blocks_cached);
    f.batch.textContent = fmtNum(m.step_batch_tokens) + ' / ' + fmtNum(m.step_batch_sequences);
    f.step.textContent = fmtSeconds(m.step_seconds);
    f.busy.textContent = fmtPct(m.busy_ratio);
    // Each tier's share of this replica: running / queued (prompt tokens to prefill).
    c.tiers.textContent = 'By tier: ' + (m.tiers || []).map((t) => t.tier + ' ' +
      fmtCount(t.running) + ' running / ' + fmtCount(t.queued_requests) + ' queued (' +
      fmtCount(t.queued_prompt_tokens) + ' prompt tokens)').join(' · ');
    const of = (s) => s.models.find((x) => x.model === m.model && x.replica === m.replica);
    const pick = (k) => (s) => { const x = of(s); return x ? x[k] : undefined; };
    drawChart(c.charts.kv, [series('used', COLORS[0], pick('kv_blocks_used')),
      series('cached', COLORS[2], pick('kv_blocks_cached')),
      series('capacity', '#667085', pick('kv_blocks_total'), true)], now);
    drawChart(c.charts.batch, [series('tokens', COLORS[0], pick('step_batch_tokens')),
      series('sequences', COLORS[3], pick('step_batch_sequences'))], now);
    drawChart(c.charts.step, [series('latest step', COLORS[0], pick('step_seconds')),
      series('decode step (avg)', COLORS[4], pick('decode_step_seconds'))], now);
    drawChart(c.charts.busy, [series('busy', COLORS[1], pick('busy_ratio'))], now, 1);
  }

  function renderTenants(id, rows) {
    const body = $(id).tBodies[0];
    while (body.firstChild) body.removeChild(body.firstChild);
    for (const r of rows) {
      const tr = el('tr');
      tr.dataset.tenant = r.tenant;
      tr.append(el('td', null, r.tenant), el('td', null, fmtNum(r.requests)),
        el('td', null, fmtNum(r.total_tokens)), el('td', null, fmtMoney(r.cost)));
      const td = el('td');
      if (r.budget) {
        const bar = el('span', 'bar' + (r.budget.used >= 0.9 ? ' hot' : ''));
        const fill = el('span');
        fill.style.width = Math.min(100, r.budget.used * 100).toFixed(1) + '%';
        bar.appendChild(fill);
        td.append(bar, document.createTextNode(fmtPct(r.budget.used)));
      } else {
        td.textContent = 'no budget';
      }
      tr.appendChild(td);
      body.appendChild(tr);
    }
  }

  // Once the server said it drains, a later failure to connect is that drain ending, not an
  // outage: the banner keeps saying so.
  let drained = false;
  const DRAINING = 'Draining: this server is shutting down and admits nothing new.';

  function banner(text, warn) {
    const b = $('banner');
    b.hidden = !text;
    b.textContent = text || '';
    b.className = 'banner' + (warn ? ' warn' : '');
  }

  function render(s) {
    const now = Date.now();
    const prev = history.length ? history[history.length - 1] : null;
    const dt = prev ? (now - prev.t) / 1000 : 0;
    const rates = {};
    for (const t of s.tiers) rates[t.tier] = prev ? decisionRates(prev.s, s, t.tier, dt) : null;
    history.push({t: now, s, rates});
    while (history.length && history[0].t < now - WINDOW_MS) history.shift();
    for (const h of history) if (!h.rates) h.rates = {};
    drained = drained || !!s.draining;
    if (s.draining) banner(DRAINING);
    else if (s.fleet && s.fleet.fallback)
      banner('Redis lost: budgets are decided on this replica\'s local share (fallback).', true);
    else banner(null);
    for (const t of s.tiers) renderTier(t, now);
    const several = s.models.some((m) => m.replica > 0);
    for (const m of s.models) renderModel(m, now, several);
    renderTenants('by-tokens', s.tenants.by_tokens);
    renderTenants('by-cost', s.tenants.by_cost);
    for (const p of document.querySelectorAll('#tenants .currency'))
      p.textContent = 'Since the usage ledger began; costs in ' + s.currency + '.';
    $('status').textContent = 'updated ' + new Date(now).toLocaleTimeString() +
      (s.fleet ? ' · fleet of ' + s.fleet.replicas : '');
    document.body.dataset.polls = String((Number(document.body.dataset.polls) || 0) + 1);
    document.body.dataset.interval = prev ? String(now - prev.t) : '';
  }

  async function poll() {
    timer = null;
    if (key === null) return;
    try {
      const r = await fetch('/admin/stats', {
        headers: {Authorization: 'Bearer ' + key}, cache: 'no-store', credentials: 'omit',
      });
      if (r.status === 401 || r.status === 403) {
        const body = await r.json().catch(() => null);
        signOut(body && body.error && body.error.message ? body.error.message
          : 'The key was refused.');
        return;
      }
      if (!r.ok) {
        const body = await r.json().catch(() => null);
        const code = body && body.error ? body.error.code : null;
        if (code === 'draining') {
          drained = true;
          banner(DRAINING);
        } else {
          banner('/admin/stats answered ' + r.status + '.', true);
        }
      } else {
        render(await r.json());
      }
    } catch (e) {
      if (drained) banner('Drained: this server shut down and no longer answers.');
      else banner('sluice is not answering (' + e.message + ').', true);
    }
    if (key !== null) timer = setTimeout(poll, POLL_MS);
  }

  function signOut(message) {
    key = null;
    if (timer) clearTimeout(timer);
    timer = null;
    history = [];
    $('main').hidden = true;
    $('logout').hidden = true;
    $('login').hidden = false;
    $('login-error').textContent = message || '';
    $('status').textContent = 'signed out';
    drained = false;
    banner(null);
  }

  document.addEventListener('DOMContentLoaded', () => {
    $('login').addEventListener('submit', (ev) => {
      ev.preventDefault();
      const input = $('key');
      key = input.value;
      input.value = '';
      $('login-error').textContent = '';
      $('login').hidden = true;
      $('main').hidden = false;
      $('logout').hidden = false;
      poll();
    });
    $('logout').addEventListener('click', () => signOut(''));
  });
})();
