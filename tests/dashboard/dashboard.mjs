// The dashboard in a real browser (issue 33): starts sluice on a free loopback port with three
// tenants (one named with a <script> element, one with an <img onerror>), keeps light load
// running in two tiers, opens /dashboard in Debian's headless Chromium through playwright-core,
// logs in with the admin key and checks through the DOM that
//   - each tier appears, with figures that change between two reads while load runs;
//   - each model replica appears with its KV, batch and busy figures;
//   - a burst of refusals (a tenant with rpm 2 sending 20 requests: 429s) shows in the tier's
//     decisions chart under its reason, and in its refused figure;
//   - the tenants' names are shown as text, and nothing in them ran (window.__pwned undefined,
//     no element but the page's own script);
//   - the page raises no script error and no Content-Security-Policy violation;
//   - on a phone's viewport nothing overflows sideways;
// then saves screenshots (dashboard.png, dashboard-phone.png) into OUTDIR. A second sluice, with
// a Redis of its own, then shows the banners: none while Redis answers, "Redis lost" once it is
// killed and a decision falls back to the local share, and "Draining" once SIGTERM comes while
// a long prompt is being computed (the page's next poll, on its open connection, is answered
// 503 draining), which stays once the server has gone. Without redis-server that part is
// skipped, with a line saying so (and fails under CI or SLUICE_REQUIRE_BROWSER).
//
// Waits are on DOM conditions with timeouts, never on fixed sleeps; no assertion is about time.
//
// usage: node dashboard.mjs SLUICE_BIN OUTDIR
// Exits 0 when every check passed, 1 when one failed, 77 (meson's skip) when Chromium or
// playwright-core is missing and neither CI nor SLUICE_REQUIRE_BROWSER is set.
import {spawn, spawnSync} from 'node:child_process';
import {createServer} from 'node:net';
import {existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync} from 'node:fs';
import {createRequire} from 'node:module';
import {tmpdir} from 'node:os';
import {join} from 'node:path';

const [sluiceBin, outDir] = process.argv.slice(2);
if (!sluiceBin || !outDir) {
  console.error('usage: node dashboard.mjs SLUICE_BIN OUTDIR');
  process.exit(2);
}
const CHROMIUM = process.env.SLUICE_CHROMIUM || '/usr/bin/chromium';
const required = !!(process.env.CI || process.env.SLUICE_REQUIRE_BROWSER);

function missing(what) {
  console.log(`${required ? 'FAIL' : 'SKIP'}: ${what} (scripts/setup.sh installs it)`);
  process.exit(required ? 1 : 77);
}
if (!existsSync(CHROMIUM)) missing(`${CHROMIUM} is not installed: Debian's chromium package`);
let chromium;
try {
  const require = createRequire(import.meta.url);
  ({chromium} = require('playwright-core'));
} catch (e) {
  missing('playwright-core is not in tests/dashboard/node_modules: npm ci there');
}

// Keys and their SHA-256 (tests/integration/harness.h's).
const ADMIN = 'admin-secret-key-0123456789';
const ADMIN_SHA = '4863aec637069806d797219f620402072ed601f239fbc9cb3533c91cc53c1611';
const ALICE = 'sk-alice-0123456789abcdefXYZ';
const ALICE_SHA = '4e3cf284f86ed2e2912a406e093fde194fffbfc71792276277eb201998cc4cfe';
const BOB = 'sk-bob-0123456789abcdefXYZ';
const BOB_SHA = 'ca94e0a18defaf16a73804c392e6898bd1b71c8a2fdf1ec61e574517dadbedca';
const CAROL = 'sk-carol-0123456789abcdefXYZ';
const CAROL_SHA = 'ce548d28bf71aa9d30cf3e8667a790d9244416b551883d5c1d8753b04686d643';
const SCRIPT_NAME = '<script>window.__pwned=1</script>';
const IMG_NAME = '<img src=x onerror=window.__pwned=2>';

const tmp = mkdtempSync(join(tmpdir(), 'sluice-dashboard-'));
mkdirSync(outDir, {recursive: true});
const config = {
  threads: 1,
  admin_key_sha256: ADMIN_SHA,
  currency: 'credits',
  price: {input_per_mtok: 1000, output_per_mtok: 2000},
  tiers: {
    interactive: {priority: 0, weight: 4, ttft_slo_ms: 2000, tpot_slo_ms: 200},
    batch: {priority: 1, weight: 1, ttft_slo_ms: 60000, tpot_slo_ms: 1000},
  },
  tenants: [
    {name: SCRIPT_NAME, key_sha256: ALICE_SHA, tiers: ['interactive'], default_tier: 'interactive',
      budget: {amount: 100, period: 'day'}},
    {name: 'bob', key_sha256: BOB_SHA, tiers: ['batch'], default_tier: 'batch'},
    {name: IMG_NAME, key_sha256: CAROL_SHA, tiers: ['interactive'], default_tier: 'interactive',
      rpm: 2},
  ],
};
writeFileSync(join(tmp, 'sluice.json'), JSON.stringify(config));

let passed = 0, failed = 0;
function ok(what) { passed++; console.log(`ok: ${what}`); }
function fail(what) { failed++; console.log(`FAIL: ${what}`); }
function check(cond, what, detail) {
  if (cond) ok(what);
  else fail(detail === undefined ? what : `${what}: ${detail}`);
  return cond;
}

// ---- sluice ----

// Starts sluice with a configuration file and a model; resolves to {proc, port, log()} once it
// says where it listens. log() is what it wrote to stderr so far (the first MiB).
function startSluice(configPath, model) {
  const proc = spawn(sluiceBin, ['--config', configPath, '--listen', '127.0.0.1:0', '--model',
    model], {stdio: ['ignore', 'ignore', 'pipe']});
  let text = '';
  proc.stderr.setEncoding('utf8');
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('sluice did not say where it listens')), 60000);
    proc.stderr.on('data', (d) => {
      if (text.length < 1 << 20) text += d;
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(text);
      if (m) { clearTimeout(timer); resolve({proc, port: Number(m[1]), log: () => text}); }
    });
    proc.on('exit', (code) => reject(new Error(`sluice exited with ${code}:\n${text}`)));
  });
}
const exited = (proc) => new Promise((resolve) =>
  (proc.exitCode !== null || proc.signalCode !== null ? resolve() : proc.on('exit', resolve)));

const first = await startSluice(join(tmp, 'sluice.json'), 'synthetic')
  .catch((e) => { console.log(`FAIL: ${e.message}`); process.exit(1); });
const server = first.proc, port = first.port;
let log = '';
const base = `http://127.0.0.1:${port}`;

// ---- load: one request at a time per tenant, at most ten a second each, until stopped ----

let loading = true;
const answered = {};
async function complete(key, maxTokens) {
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST',
    headers: {Authorization: `Bearer ${key}`, 'Content-Type': 'application/json'},
    body: JSON.stringify({prompt: 'Once upon a time there was', max_tokens: maxTokens,
      ignore_eos: true}),
  });
  await r.arrayBuffer();
  answered[r.status] = (answered[r.status] || 0) + 1;
  return r.status;
}
// Paced, not closed-loop flat out: light load on a shared machine (the pace is no
// synchronisation: nothing waits for it).
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
async function loop(key, maxTokens) {
  while (loading) {
    await complete(key, maxTokens).catch(() => {});
    await pause(100);
  }
}
const load = [loop(ALICE, 8), loop(BOB, 24)];

// ---- the banners: a second sluice with a Redis of its own ----

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const {port: p} = srv.address();
      srv.close(() => resolve(p));
    });
  });
}

async function startRedis() {
  const rport = await freePort();
  const proc = spawn('redis-server', ['--port', String(rport), '--bind', '127.0.0.1', '--save', '',
    '--appendonly', 'no'], {stdio: ['ignore', 'pipe', 'ignore']});
  let text = '';
  proc.stdout.setEncoding('utf8');
  await new Promise((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new Error(`redis-server did not start:\n${text}`)), 30000);
    proc.stdout.on('data', (d) => {
      text += d;
      if (/Ready to accept connections/.test(text)) { clearTimeout(timer); resolve(); }
    });
    proc.on('exit', (code) => reject(new Error(`redis-server exited with ${code}:\n${text}`)));
  });
  return {proc, port: rport};
}

// The banner's text once it matches re (or its last text when it never does).
async function bannerText(page, re) {
  await page.waitForFunction((src) => {
    const b = document.getElementById('banner');
    return !b.hidden && new RegExp(src).test(b.textContent);
  }, re.source).catch(() => {});
  return page.evaluate(() => {
    const b = document.getElementById('banner');
    return b.hidden ? '(hidden)' : b.textContent;
  });
}

async function banners(context) {
  if (spawnSync('redis-server', ['--version']).status !== 0) {
    if (required) fail('the banners: redis-server is not installed (scripts/setup.sh installs it)');
    else console.log('skip: the banners: redis-server is not installed');
    return;
  }
  let redis, second;
  try {
    redis = await startRedis();
    // stories15M's width with a 4,096-token context: a prompt of about 3,600 tokens takes
    // seconds to compute, so the drain it holds open outlasts the page's next poll.
    const cfg = {
      threads: 1,
      admin_key_sha256: ADMIN_SHA,
      drain_timeout_ms: 300000,
      redis: {url: `redis://127.0.0.1:${redis.port}`, timeout_ms: 200},
      tiers: {interactive: {priority: 0, weight: 1, ttft_slo_ms: 600000, tpot_slo_ms: 600000}},
      tenants: [{name: 'bob', key_sha256: BOB_SHA, tiers: ['interactive'],
        default_tier: 'interactive', rpm: 600}],
    };
    writeFileSync(join(tmp, 'fleet.json'), JSON.stringify(cfg));
    second = await startSluice(join(tmp, 'fleet.json'), 'synthetic:stories15M-4k');
    const base2 = `http://127.0.0.1:${second.port}`;
    const send = (prompt, maxTokens) => fetch(`${base2}/v1/completions`, {
      method: 'POST',
      headers: {Authorization: `Bearer ${BOB}`, 'Content-Type': 'application/json'},
      body: JSON.stringify({prompt, max_tokens: maxTokens, ignore_eos: true}),
    }).then(async (r) => { await r.arrayBuffer(); return r.status; });

    const page = await context.newPage();
    page.on('pageerror', (e) => problems.push(`page error (banners): ${e.message}`));
    await page.goto(`${base2}/dashboard`);
    await page.fill('#key', ADMIN);
    await page.click('button[type=submit]');
    check(await send('Once upon a time', 2) === 200, 'the fleet sluice serves bob through Redis');
    await page.waitForFunction(() => Number(document.body.dataset.polls) >= 2);
    check(await page.evaluate(() => document.getElementById('banner').hidden),
      'no banner while Redis answers', await bannerText(page, /./));

    redis.proc.kill('SIGKILL');
    await exited(redis.proc);
    // The next decision finds Redis gone and is taken on the replica's local share.
    check(await send('Once upon a time', 2) === 200, 'bob is served on the local share');
    const lost = await bannerText(page, /^Redis lost/);
    check(/^Redis lost/.test(lost), 'the banner says Redis is lost', lost);

    // A long prompt in flight, then SIGTERM: the server drains until it is done.
    const longPrompt = Array.from({length: 1300}, (_, i) => `w${i % 50}`).join(' ');
    const inFlight = send(longPrompt, 1).catch(() => 0);
    await page.waitForFunction(() => {
      const dd = document.querySelector('[data-tier="interactive"] dd[data-k="running"]');
      const q = document.querySelector('[data-tier="interactive"] dd[data-k="queued"]');
      return (dd && Number(dd.textContent) > 0) || (q && Number(q.textContent) > 0);
    });
    second.proc.kill('SIGTERM');
    const drain = await bannerText(page, /^Drain/);
    check(/^Drain(ing|ed):/.test(drain), 'the banner says the server drains', drain);
    check(await inFlight === 200, 'the prompt in flight was finished by the drain');
    await exited(second.proc);
    const after = await bannerText(page, /^Drained:/);
    check(/^Drained:/.test(after), 'once the server has gone, the banner says it drained', after);
    await page.close();
  } catch (e) {
    fail(`the banners stopped: ${e.stack || e}`);
    if (second) console.log(second.log().split('\n').slice(-20).join('\n'));
  } finally {
    if (second && second.proc.exitCode === null) second.proc.kill('SIGKILL');
    if (redis && redis.proc.exitCode === null) redis.proc.kill('SIGKILL');
  }
}

// ---- the browser ----

const profile = mkdtempSync(join(tmpdir(), 'sluice-chromium-'));
let context;
const problems = [];
try {
  context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--no-first-run'],
    viewport: {width: 1280, height: 900},
  });
  const page = context.pages()[0] || await context.newPage();
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    // The wrong key's 401 is logged as a failed load; anything else (a CSP violation says
    // "Refused to ...") is a problem.
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource'))
      problems.push(`console error: ${m.text()}`);
  });
  page.setDefaultTimeout(30000);

  const resp = await page.goto(`${base}/dashboard`);
  const headers = resp.headers();
  check(resp.status() === 200, 'GET /dashboard answers 200 without a key', resp.status());
  check(/script-src 'self'/.test(headers['content-security-policy'] || '') &&
    !/unsafe-inline/.test(headers['content-security-policy']),
  'the page has a Content-Security-Policy without inline script',
  headers['content-security-policy']);
  check(headers['x-content-type-options'] === 'nosniff', 'the page is served nosniff');

  // A wrong key is refused in the form, and nothing else is shown.
  await page.fill('#key', 'not-the-admin-key');
  await page.click('button[type=submit]');
  await page.waitForFunction(() => document.getElementById('login-error').textContent !== '' &&
    !document.getElementById('login').hidden);
  check(await page.evaluate(() => document.getElementById('main').hidden),
    'a wrong key brings the login form back with its error');

  await page.fill('#key', ADMIN);
  await page.click('button[type=submit]');
  check(!page.url().includes(ADMIN) && !page.url().includes('key='),
    'the key is not in the URL', page.url());
  await page.waitForFunction(() => Number(document.body.dataset.polls) >= 2 &&
    document.querySelector('[data-tier="interactive"]') &&
    document.querySelector('[data-tier="batch"]'));
  check(await page.evaluate(() => localStorage.length === 0 && sessionStorage.length === 0 &&
    document.cookie === ''), 'the key is in no storage and no cookie');

  // Each tier, with its figures; then the same figures again once they have changed.
  const FIGS = ['ttft_p50', 'ttft_p99', 'tpot_p50', 'tpot_p99', 'admitted_rate', 'running',
    'queued', 'attainment_1m'];
  const readTier = ([tier, figs]) => {
    const card = document.querySelector(`[data-tier="${tier}"]`);
    const o = {};
    for (const k of figs) o[k] = card.querySelector(`dd[data-k="${k}"]`).textContent;
    return o;
  };
  for (const tier of ['interactive', 'batch']) {
    // Figures are there once a request of the tier has finished (its windows have a latency).
    await page.waitForFunction(([t]) => {
      const dd = document.querySelector(`[data-tier="${t}"] dd[data-k="ttft_p50"]`);
      return dd && /\d/.test(dd.textContent);
    }, [tier]);
    const first = await page.evaluate(readTier, [tier, FIGS]);
    check(/\d/.test(first.ttft_p99) && /\d/.test(first.tpot_p50) && /%/.test(first.attainment_1m),
      `tier ${tier} shows TTFT, TPOT and attainment`, JSON.stringify(first));
    const moved = await page.waitForFunction(([t, figs, before]) => {
      const card = document.querySelector(`[data-tier="${t}"]`);
      return figs.some((k) => card.querySelector(`dd[data-k="${k}"]`).textContent !== before[k]);
    }, [tier, FIGS, first]).then(() => true, () => false);
    const second = await page.evaluate(readTier, [tier, FIGS]);
    check(moved, `tier ${tier}'s figures change between two reads while load runs`,
      `${JSON.stringify(first)} then ${JSON.stringify(second)}`);
    const lines = await page.evaluate((t) =>
      document.querySelectorAll(`[data-tier="${t}"] svg polyline`).length, tier);
    check(lines >= 4, `tier ${tier}'s charts draw lines`, lines);
  }

  // The model replica: KV, batch, step and busy figures, with numbers.
  const model = await page.evaluate(() => {
    const card = document.querySelector('[data-model]');
    if (!card) return null;
    const o = {};
    for (const dd of card.querySelectorAll('dd[data-k]')) o[dd.dataset.k] = dd.textContent;
    return o;
  });
  check(model && /\d+ \/ \d+/.test(model.kv) && /\d/.test(model.batch) && /%/.test(model.busy) &&
    /\d/.test(model.step), 'the model replica shows KV blocks, batch, step time and busy ratio',
  JSON.stringify(model));
  const byTier = await page.evaluate(() => {
    const p = document.querySelector('[data-model] p[data-k="tiers"]');
    return p ? p.textContent : null;
  });
  check(byTier && /interactive \d+ running/.test(byTier) && /batch \d+ running/.test(byTier),
    'the model replica shows each tier\'s running and queued', byTier);

  // A refusal burst: the rpm-2 tenant sends 20 requests at once; most get 429.
  const burst = await Promise.all(Array.from({length: 20}, () => complete(CAROL, 2)));
  const refused = burst.filter((s) => s === 429).length;
  check(refused >= 18, 'the burst is refused by the tenant\'s rpm (429)', `${refused} of 20`);
  const shown = await page.waitForFunction(() => {
    const s = document.querySelector(
      '[data-tier="interactive"] .decisions [data-series="rejected: tenant_requests"]');
    const dd = document.querySelector('[data-tier="interactive"] dd[data-k="refused_5m"]');
    return s && Number(s.dataset.peak) > 0 && dd && Number(dd.textContent) >= 18;
  }).then(() => true, () => false);
  const legend = await page.evaluate(() => [...document.querySelectorAll(
    '[data-tier="interactive"] .decisions .legend span')].map((s) => s.textContent));
  check(shown, 'the refusals show in the interactive tier\'s decisions chart under ' +
    'tenant_requests and in its refused figure', JSON.stringify(legend));

  // Tenant names: text, not markup; nothing in them ran.
  await page.waitForFunction(([a, b]) => {
    const names = [...document.querySelectorAll('#by-tokens tbody tr td:first-child')]
      .map((td) => td.textContent);
    return names.includes(a) && names.includes(b);
  }, [SCRIPT_NAME, IMG_NAME]).catch(() => {});
  const names = await page.evaluate(() => [...document.querySelectorAll(
    '#by-tokens tbody tr td:first-child')].map((td) => td.textContent));
  check(names.includes(SCRIPT_NAME) && names.includes(IMG_NAME),
    'the tenants named with markup are listed with their names as text', JSON.stringify(names));
  const injected = await page.evaluate(() => ({
    pwned: typeof window.__pwned,
    scripts: [...document.scripts].map((s) => s.getAttribute('src')),
    imgs: document.images.length,
  }));
  check(injected.pwned === 'undefined' && injected.imgs === 0 &&
    injected.scripts.length === 1 && injected.scripts[0] === '/dashboard/app.js',
  'nothing a tenant named ran: window.__pwned is undefined, no element was made of a name',
  JSON.stringify(injected));
  const budget = await page.evaluate((n) => {
    const tr = [...document.querySelectorAll('#by-cost tbody tr')]
      .find((r) => r.firstChild.textContent === n);
    return tr ? tr.lastChild.textContent : null;
  }, SCRIPT_NAME);
  check(budget !== null && /%/.test(budget), 'the tenant with a budget shows the share used',
    budget);

  // SLUICE_DASHBOARD_POLLS=N: the screenshot waits for N polls (for one with minutes of lines,
  // such as docs/dashboard.png's); by default it is taken as soon as the checks are done.
  const want = Number(process.env.SLUICE_DASHBOARD_POLLS || 0);
  if (want > 0) {
    await page.waitForFunction((n) => Number(document.body.dataset.polls) >= n, want,
      {timeout: want * 3000});
  }
  const polls = await page.evaluate(() => [document.body.dataset.polls,
    document.body.dataset.interval]);
  console.log(`info: ${polls[0]} polls, the latest ${polls[1]} ms after the one before`);
  await page.screenshot({path: join(outDir, 'dashboard.png'), fullPage: true});
  ok(`screenshot ${join(outDir, 'dashboard.png')}`);

  // A phone: one column, nothing wider than the screen.
  await page.setViewportSize({width: 390, height: 844});
  await page.waitForFunction(() => document.documentElement.scrollWidth <= window.innerWidth)
    .catch(() => {});
  const widths = await page.evaluate(() => [document.documentElement.scrollWidth,
    window.innerWidth]);
  check(widths[0] <= widths[1], 'on a 390 px wide phone nothing overflows sideways',
    widths.join(' > '));
  await page.screenshot({path: join(outDir, 'dashboard-phone.png'), fullPage: false});

  await banners(context);

  check(problems.length === 0, 'no script error and no CSP violation in the page',
    problems.join('; '));

} catch (e) {
  fail(`the browser run stopped: ${e.stack || e}`);
} finally {
  loading = false;
  if (context) await context.close().catch(() => {});
  await Promise.all(load);
  server.kill('SIGTERM');
  await exited(server);
  log = first.log();
  rmSync(profile, {recursive: true, force: true});
  rmSync(tmp, {recursive: true, force: true});
}
console.log(`load: answers by status ${JSON.stringify(answered)}`);
if (failed)
  console.log(log.split('\n').filter((l) => !l.includes(' access ')).slice(-30).join('\n'));
console.log(`dashboard: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
