// Drives a running sluice with the official Anthropic Node SDK: a message, the same message
// streamed (its whole event sequence), a stop sequence, a system prompt, a bad request, a wrong
// key and a 429. Usage: node anthropic.mjs BASE_URL KEY TIGHT_KEY, where KEY is a tenant's
// without limits and TIGHT_KEY one whose rpm is 1 (tests/integration/test_sdk.c configures both).
// Exits 0 when every check passes; otherwise prints what differed and exits 1.
import Anthropic from '@anthropic-ai/sdk';

const [baseURL, key, tightKey] = process.argv.slice(2);
if (!baseURL || !key || !tightKey) {
  console.error('usage: node anthropic.mjs BASE_URL KEY TIGHT_KEY (e.g. http://127.0.0.1:8080)');
  process.exit(2);
}

// No retries: a failure must show, not be retried away.
const options = { baseURL, maxRetries: 0, timeout: 60_000 };
const client = new Anthropic({ ...options, apiKey: key });

class Mismatch extends Error {}

function check(cond, what, got) {
  if (!cond) {
    const detail = got === undefined ? '' : `: got ${JSON.stringify(got)}`;
    throw new Mismatch(`${what}${detail}`);
  }
}

const model = 'synthetic';
const ask = {
  model, max_tokens: 12, temperature: 0,
  messages: [{ role: 'user', content: 'Once upon a time' }],
};

function checkMessage(m, maxTokens, where) {
  check(m.type === 'message' && m.role === 'assistant', `${where}: a message from the assistant`,
    { type: m.type, role: m.role });
  check(typeof m.id === 'string' && m.id.startsWith('msg_'), `${where}: id msg_…`, m.id);
  check(Array.isArray(m.content) && m.content.length === 1 && m.content[0].type === 'text',
    `${where}: one text block`, m.content);
  check(['end_turn', 'max_tokens', 'stop_sequence'].includes(m.stop_reason),
    `${where}: stop_reason`, m.stop_reason);
  check(Number.isInteger(m.usage?.input_tokens) && m.usage.input_tokens > 0,
    `${where}: usage.input_tokens > 0`, m.usage);
  check(Number.isInteger(m.usage?.output_tokens) && m.usage.output_tokens <= maxTokens,
    `${where}: usage.output_tokens <= ${maxTokens}`, m.usage);
}

async function expectError(promise, cls, status, type, where) {
  try {
    await promise;
  } catch (e) {
    check(e instanceof cls, `${where}: raises ${cls.name}`, e?.constructor?.name);
    check(e.status === status, `${where}: status ${status}`, e.status);
    check(e.error?.type === 'error' && e.error?.error?.type === type,
      `${where}: error type ${type}`, e.error);
    return e;
  }
  throw new Mismatch(`${where}: no error raised`);
}

const checks = {
  async message() {
    const m = await client.messages.create(ask);
    checkMessage(m, 12, 'message');
    return m.content[0].text;
  },

  async streamed(greedy) {
    const stream = await client.messages.create({ ...ask, stream: true });
    const types = [];
    let text = '', usage, stopReason;
    for await (const ev of stream) {
      types.push(ev.type);
      if (ev.type === 'content_block_delta') {
        check(ev.delta.type === 'text_delta', 'deltas are text_delta', ev.delta);
        text += ev.delta.text;
      } else if (ev.type === 'message_delta') {
        usage = ev.usage;
        stopReason = ev.delta.stop_reason;
      } else if (ev.type === 'message_start') {
        check(ev.message.usage.input_tokens > 0, 'message_start carries input_tokens',
          ev.message.usage);
      }
    }
    const inner = types.slice(2, -2);
    check(types[0] === 'message_start' && types[1] === 'content_block_start' &&
      types.at(-2) === 'message_delta' && types.at(-1) === 'message_stop' &&
      inner.at(-1) === 'content_block_stop' &&
      inner.slice(0, -1).every((t) => t === 'content_block_delta'),
      'the event sequence', types);
    check(text === greedy, 'the streamed text equals the whole message\'s', { text, greedy });
    check(Number.isInteger(usage?.output_tokens) && usage.output_tokens > 0,
      'message_delta carries output_tokens', usage);
    check(['end_turn', 'max_tokens'].includes(stopReason), 'message_delta stop_reason',
      stopReason);
    // The SDK's own helper assembles the same message from the events.
    const final = await client.messages.stream(ask).finalMessage();
    checkMessage(final, 12, 'stream helper');
    check(final.content[0].text === greedy, 'the stream helper\'s text', final.content[0].text);
  },

  async stopSequence(greedy) {
    // A piece of the greedy answer (not at its start) as the stop sequence: the answer stops
    // before its first occurrence and names it.
    const stop = [...greedy].slice(2, 4).join('');
    const m = await client.messages.create({ ...ask, stop_sequences: [stop] });
    checkMessage(m, 12, 'stop sequence');
    check(m.stop_reason === 'stop_sequence' && m.stop_sequence === stop,
      'stop_reason stop_sequence names it', { stop_reason: m.stop_reason, stop_sequence: m.stop_sequence });
    check(m.content[0].text === greedy.slice(0, greedy.indexOf(stop)),
      'the text before the stop sequence', { text: m.content[0].text, stop });
  },

  async systemPrompt() {
    const m = await client.messages.create({
      ...ask, system: 'You tell short stories.', top_k: 40, top_p: 0.9,
    });
    checkMessage(m, 12, 'system');
    const plain = await client.messages.create(ask);
    check(m.usage.input_tokens > plain.usage.input_tokens,
      'the system prompt is part of the input', { with: m.usage, without: plain.usage });
  },

  async badRequest() {
    await expectError(client.messages.create({ ...ask, messages: [] }),
      Anthropic.BadRequestError, 400, 'invalid_request_error', 'no messages');
    const { max_tokens: _, ...noMax } = ask;
    await expectError(client.messages.create(noMax), Anthropic.BadRequestError, 400,
      'invalid_request_error', 'no max_tokens');
  },

  async wrongKey() {
    const other = new Anthropic({ ...options, apiKey: 'sk-not-a-tenant-0123456789' });
    await expectError(other.messages.create(ask), Anthropic.AuthenticationError, 401,
      'authentication_error', 'wrong key');
  },

  async rateLimited() {
    const tight = new Anthropic({ ...options, apiKey: tightKey });
    await tight.messages.create(ask);
    const e = await expectError(tight.messages.create(ask), Anthropic.RateLimitError, 429,
      'rate_limit_error', 'the second request within a minute');
    const retry = Number(e.headers?.get?.('retry-after') ?? e.headers?.['retry-after']);
    check(retry >= 1, 'retry-after says when', retry);
  },
};

let failed = 0;
let greedy = '';
for (const [name, fn] of Object.entries(checks)) {
  try {
    const r = await fn(greedy);
    if (name === 'message') greedy = r;
    console.log(`ok   ${name}`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e instanceof Mismatch ? e.message : e?.stack ?? e}`);
  }
}
console.log(`@anthropic-ai/sdk ${Anthropic.VERSION ?? ''}: ${Object.keys(checks).length - failed} ` +
  `of ${Object.keys(checks).length} checks passed`);
process.exit(failed ? 1 : 0);
