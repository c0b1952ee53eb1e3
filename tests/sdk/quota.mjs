// The official OpenAI Node SDK against a tenant whose money budget is spent: it must raise its
// quota error (a RateLimitError, status 429, code and type insufficient_quota) at once, without
// retrying, although it is left its default of two retries: sluice says x-should-retry: false.
// The caller counts the requests the server saw. Usage: node quota.mjs BASE_URL KEY
import OpenAI from 'openai';

const [baseURL, apiKey] = process.argv.slice(2);
if (!baseURL || !apiKey) {
  console.error('usage: node quota.mjs BASE_URL KEY');
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey, timeout: 60_000 }); // maxRetries: the default (2)
try {
  await client.completions.create({ model: 'synthetic:tiny', prompt: 'Once upon a time', max_tokens: 16 });
  console.log('FAIL: the request passed a spent budget');
  process.exit(1);
} catch (e) {
  const h = e.headers;
  const retry = typeof h?.get === 'function' ? h.get('x-should-retry') : h?.['x-should-retry'];
  const ok = e instanceof OpenAI.RateLimitError && e.status === 429 &&
    e.code === 'insufficient_quota' && e.type === 'insufficient_quota' &&
    retry === 'false';
  console.log(`${ok ? 'ok' : 'FAIL'}: ${e.constructor.name} status ${e.status} code ${e.code} ` +
    `type ${e.type} x-should-retry ${retry}: ${e.message}`);
  process.exit(ok ? 0 : 1);
}
