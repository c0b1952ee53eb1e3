// Checks deploy/grafana/sluice.json (run by tests/deploy/check.sh):
//   - its shape: Grafana's schemaVersion 36 or later, a datasource variable DS_PROMETHEUS that
//     every panel and target uses, the templated tier and tenant, unique panel ids, a grid of
//     24 columns without overlaps, every target an expression with a refId;
//   - with BASE_URL: that every metric each PromQL expression (and each variable's
//     label_values query) names is in a live /metrics scrape of that sluice, after requests that
//     make every family have samples (a histogram's _bucket, _sum and _count are samples of a
//     family of that TYPE).
//
// usage: node grafana.mjs DASHBOARD.json [BASE_URL TENANT_KEY RPM1_KEY]
//   TENANT_KEY: a tenant with a money budget and prices (so that cost and budget series exist);
//   RPM1_KEY: a tenant with rpm 1 (its second request is refused: a rejection series).
// Prints "ok: ..." or "FAIL: ..." lines; exits 1 when one failed.
import {readFileSync} from 'node:fs';

const [path, base, tenantKey, rpmKey] = process.argv.slice(2);
if (!path) {
  console.error('usage: node grafana.mjs DASHBOARD.json [BASE_URL TENANT_KEY RPM1_KEY]');
  process.exit(2);
}
let failed = 0;
const ok = (what) => console.log(`ok: grafana: ${what}`);
const fail = (what) => { failed++; console.log(`FAIL: grafana: ${what}`); };

// ---- PromQL: the metric names an expression selects ----

const KEYWORDS = new Set(['and', 'or', 'unless', 'bool', 'offset', 'by', 'without', 'on',
  'ignoring', 'group_left', 'group_right', 'inf', 'nan', 'Inf', 'NaN']);

export function metricNames(expr) {
  const e = expr
    .replace(/"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'/g, '""') // strings (label values)
    .replace(/\{[^}]*\}/g, ' ')                            // label matchers
    .replace(/\[[^\]]*\]/g, ' ')                           // range and subquery selectors
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ') // groupings
    .replace(/\$\{?\w+\}?/g, ' ');                         // Grafana's variables
  const names = new Set();
  const re = /[a-zA-Z_:][a-zA-Z0-9_:]*/g;
  let m;
  while ((m = re.exec(e))) {
    const before = e[m.index - 1];
    if (before !== undefined && /[0-9.]/.test(before)) continue; // an exponent: 1e9
    if (/^\s*\(/.test(e.slice(re.lastIndex))) continue;           // a function or aggregation
    if (KEYWORDS.has(m[0])) continue;
    names.add(m[0]);
  }
  return [...names];
}

// The extractor must find what an expression names and nothing else, or the live check below
// proves nothing.
const selfTest = [
  ['histogram_quantile(0.99, sum by (tier, le) (rate(sluice:a_seconds_bucket{tier=~"$tier",x="y{z}"}[$__rate_interval])))',
    ['sluice:a_seconds_bucket']],
  ['sum by (tenant) (rate(a_total[5m]) + rate(b_total{c="d"}[1h:1m])) / on(tenant) group_left c * 1e9 > bool 0',
    ['a_total', 'b_total', 'c']],
  ['topk(10, sum without (model) (increase(x:y[$__range]))) or vector(0)', ['x:y']],
];
for (const [expr, want] of selfTest) {
  const got = metricNames(expr).sort();
  if (JSON.stringify(got) !== JSON.stringify([...want].sort())) {
    fail(`the expression reader finds ${JSON.stringify(got)} in ${expr}, not ${JSON.stringify(want)}`);
  }
}

// ---- the dashboard's shape ----

let dash;
try {
  dash = JSON.parse(readFileSync(path, 'utf8'));
} catch (e) {
  fail(`${path} does not parse: ${e.message}`);
  process.exit(1);
}
const problems = [];
if (!(dash.schemaVersion >= 36)) problems.push(`schemaVersion ${dash.schemaVersion} is below 36`);
if (!dash.uid || !dash.title) problems.push('no uid or title');
const vars = (dash.templating && dash.templating.list) || [];
const dsVar = vars.find((v) => v.name === 'DS_PROMETHEUS');
if (!dsVar || dsVar.type !== 'datasource' || dsVar.query !== 'prometheus')
  problems.push('no datasource variable DS_PROMETHEUS of type prometheus');
const exprs = []; // [where, expr]
for (const name of ['tier', 'tenant']) {
  const v = vars.find((x) => x.name === name);
  const q = v && (typeof v.query === 'string' ? v.query : v.query && v.query.query);
  const m = q && /^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*(\w+)\s*\)$/.exec(q);
  if (!v || v.type !== 'query' || !m || m[2] !== name) {
    problems.push(`no query variable ${name} = label_values(METRIC, ${name})`);
  } else {
    if (!v.datasource || v.datasource.uid !== '${DS_PROMETHEUS}')
      problems.push(`variable ${name} does not use \${DS_PROMETHEUS}`);
    exprs.push([`variable ${name}`, m[1]]);
  }
}
const ids = new Set();
const cells = new Map(); // "x,y" → panel title: overlaps
let n = 0;
for (const p of dash.panels || []) {
  if (ids.has(p.id)) problems.push(`panel id ${p.id} is used twice`);
  ids.add(p.id);
  const g = p.gridPos || {};
  if (!(g.w > 0 && g.h > 0 && g.x >= 0 && g.y >= 0 && g.x + g.w <= 24))
    problems.push(`panel "${p.title}" has gridPos ${JSON.stringify(g)}`);
  for (let x = g.x; x < g.x + g.w; x++)
    for (let y = g.y; y < g.y + g.h; y++) {
      const k = `${x},${y}`;
      if (cells.has(k)) problems.push(`panels "${cells.get(k)}" and "${p.title}" overlap at ${k}`);
      cells.set(k, p.title);
    }
  if (p.type === 'row') continue;
  n++;
  if (!p.datasource || p.datasource.uid !== '${DS_PROMETHEUS}')
    problems.push(`panel "${p.title}" does not use \${DS_PROMETHEUS}`);
  if (!Array.isArray(p.targets) || p.targets.length === 0) problems.push(`panel "${p.title}" has no targets`);
  for (const t of p.targets || []) {
    if (!t.refId || typeof t.expr !== 'string' || !t.expr.trim())
      problems.push(`panel "${p.title}" has a target without refId or expr`);
    else exprs.push([`panel "${p.title}" ${t.refId}`, t.expr]);
  }
}
for (const needle of ['$tier', '$tenant'])
  if (!exprs.some(([, e]) => e.includes(needle))) problems.push(`no expression uses ${needle}`);
if (problems.length) fail([...new Set(problems)].join('; '));
else ok(`${path}: schemaVersion ${dash.schemaVersion}, ${n} panels, ${exprs.length} expressions, \${DS_PROMETHEUS}, tier and tenant`);

if (!base) process.exit(failed ? 1 : 0);

// ---- against a live sluice ----

async function complete(key) {
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: {Authorization: `Bearer ${key}`, 'Content-Type': 'application/json'},
    body: JSON.stringify({prompt: 'Once upon a time', max_tokens: 4, ignore_eos: true}),
  });
  await r.arrayBuffer();
  return r.status;
}
const statuses = [await complete(tenantKey), await complete(tenantKey), await complete(rpmKey),
  await complete(rpmKey)];
if (statuses.join() !== '200,200,200,429')
  fail(`the requests that fill the families were answered ${statuses.join()}, not 200,200,200,429`);
const scrape = await (await fetch(`${base}/metrics`)).text();
const samples = new Set();
const types = new Map();
for (const line of scrape.split('\n')) {
  const t = /^# TYPE (\S+) (\S+)/.exec(line);
  if (t) types.set(t[1], t[2]);
  else if (line && !line.startsWith('#')) samples.add(line.split(/[{ ]/)[0]);
}
// A name an expression selects: a sample name of the scrape; for _bucket, _sum and _count, of a
// family of the TYPE that has them.
function exported(name) {
  if (!samples.has(name)) return false;
  const suffix = /^(.*)_(bucket|sum|count)$/.exec(name);
  if (suffix && types.has(suffix[1]))
    return suffix[2] === 'bucket' ? types.get(suffix[1]) === 'histogram'
      : ['histogram', 'summary'].includes(types.get(suffix[1]));
  return types.has(name);
}
const missing = [];
const names = new Set();
for (const [where, expr] of exprs) {
  const found = metricNames(expr);
  if (found.length === 0) missing.push(`${where} names no metric`);
  for (const name of found) {
    names.add(name);
    if (!exported(name)) missing.push(`${where}: ${name}`);
  }
}
if (missing.length) fail(`not in the live /metrics scrape: ${missing.join('; ')}`);
else ok(`every metric of the ${exprs.length} expressions (${names.size} names) is in a live /metrics scrape`);
process.exit(failed ? 1 : 0);
