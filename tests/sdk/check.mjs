// Drives a running sluice with the official OpenAI Node SDK: completions and chat, streaming and
// not, a prompt of token ids with echo, vLLM's ignore_eos and min_tokens, and a bad request. Usage: node check.mjs http://127.0.0.1:PORT/v1
// Exits 0 when every check passes; otherwise prints what differed and exits 1. Runs on Node 18
// (Debian 12's nodejs, which scripts/setup.sh installs) and later.
import OpenAI from 'openai';
import { VERSION } from 'openai/version';

const baseURL = process.argv[2];
if (!baseURL) {
  console.error('usage: node check.mjs BASE_URL (e.g. http://127.0.0.1:8080/v1)');
  process.exit(2);
}

// No retries: a failure must show, not be retried away. The key is unused by sluice.
const client = new OpenAI({ baseURL, apiKey: 'sk-sluice-test', maxRetries: 0, timeout: 60_000 });

class Mismatch extends Error {}

function check(cond, what, got) {
  if (!cond) {
    const detail = got === undefined ? '' : `: got ${JSON.stringify(got)}`;
    throw new Mismatch(`${what}${detail}`);
  }
}

function checkUsage(usage, maxTokens, where) {
  check(usage && typeof usage === 'object', `${where}: usage is an object`, usage);
  check(Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens > 0,
    `${where}: usage.prompt_tokens > 0`, usage);
  check(Number.isInteger(usage.completion_tokens) && usage.completion_tokens <= maxTokens,
    `${where}: usage.completion_tokens <= ${maxTokens}`, usage);
  check(usage.total_tokens === usage.prompt_tokens + usage.completion_tokens,
    `${where}: usage.total_tokens is the sum`, usage);
}

function checkFinish(f, where) {
  check(f === 'stop' || f === 'length', `${where}: finish_reason is stop or length`, f);
}

// Checks common to every streamed chunk: one id, created and model for the whole stream.
function sameIdentity(chunks, object, where) {
  check(chunks.length > 0, `${where}: at least one chunk`);
  const { id, created, model } = chunks[0];
  for (const c of chunks) {
    check(c.object === object, `${where}: object is ${object}`, c.object);
    check(c.id === id && c.created === created && c.model === model,
      `${where}: the same id, created and model in every chunk`,
      { id: c.id, created: c.created, model: c.model });
  }
}

const model = (await client.models.list()).data[0]?.id;
const messages = [
  { role: 'system', content: 'You tell short stories.' },
  { role: 'user', content: 'Once upon a time' },
];

const checks = {
  async completions() {
    const r = await client.completions.create({
      model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0,
    });
    check(r.object === 'text_completion', 'object', r.object);
    check(typeof r.id === 'string' && r.id.length > 0, 'id', r.id);
    check(r.model === model, 'model', r.model);
    check(r.choices.length === 1, 'one choice', r.choices.length);
    check(typeof r.choices[0].text === 'string', 'choices[0].text is a string', r.choices[0]);
    checkFinish(r.choices[0].finish_reason, 'completion');
    checkUsage(r.usage, 12, 'completion');
    return r.choices[0].text;
  },

  async completionsStreaming(greedyText) {
    const stream = await client.completions.create({
      model, prompt: 'Once upon a time', max_tokens: 12, temperature: 0, stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    sameIdentity(chunks, 'text_completion', 'completion stream');
    const last = chunks.at(-1);
    check(last.choices.length === 0, 'the last chunk has no choices (usage)', last);
    checkUsage(last.usage, 12, 'completion stream');
    const body = chunks.slice(0, -1);
    for (const c of body) check(c.choices.length === 1, 'one choice per chunk', c);
    const text = body.map((c) => c.choices[0].text).join('');
    check(text === greedyText, 'streamed greedy text equals the non-streamed text',
      { streamed: text, whole: greedyText });
    body.slice(0, -1).forEach((c) => check(c.choices[0].finish_reason === null,
      'finish_reason is null before the end', c.choices[0].finish_reason));
    checkFinish(body.at(-1).choices[0].finish_reason, 'completion stream');
  },

  async chat() {
    const r = await client.chat.completions.create({
      model, messages, max_completion_tokens: 16, temperature: 0.8, seed: 42,
    });
    check(r.object === 'chat.completion', 'object', r.object);
    check(r.id.startsWith('chatcmpl-'), 'id starts with chatcmpl-', r.id);
    check(r.model === model, 'model', r.model);
    check(r.choices.length === 1, 'one choice', r.choices.length);
    const m = r.choices[0].message;
    check(m.role === 'assistant', 'message.role', m.role);
    check(typeof m.content === 'string', 'message.content is a string', m.content);
    checkFinish(r.choices[0].finish_reason, 'chat');
    checkUsage(r.usage, 16, 'chat');
    return m.content;
  },

  async chatStreaming(sameSeedText) {
    const stream = await client.chat.completions.create({
      model, messages, max_completion_tokens: 16, temperature: 0.8, seed: 42, stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    sameIdentity(chunks, 'chat.completion.chunk', 'chat stream');
    const first = chunks[0].choices[0];
    check(first?.delta?.role === 'assistant', 'the first delta has role assistant', first);
    const usageChunk = chunks.at(-1);
    check(usageChunk.choices.length === 0, 'the last chunk has empty choices', usageChunk);
    checkUsage(usageChunk.usage, 16, 'chat stream');
    const body = chunks.slice(0, -1);
    body.forEach((c, i) => {
      check(c.choices.length === 1, 'one choice per chunk', c);
      check(c.usage === null, 'usage is null in every other chunk', c.usage);
      if (i > 0) check(c.choices[0].delta.role === undefined, 'only the first delta has a role', c);
    });
    const finishing = body.at(-1).choices[0];
    checkFinish(finishing.finish_reason, 'chat stream');
    body.slice(0, -1).forEach((c) => check(c.choices[0].finish_reason === null,
      'finish_reason is null before the last chunk', c.choices[0]));
    const text = body.map((c) => c.choices[0].delta.content ?? '').join('');
    check(text === sameSeedText, 'streamed text equals the non-streamed text for the same seed',
      { streamed: text, whole: sameSeedText });
  },

  // A prompt of token ids (the SDK's number[] prompt), plain and echoed.
  async promptIds() {
    const ask = { model, prompt: [1, 300, 301], max_tokens: 6, temperature: 0 };
    const plain = await client.completions.create(ask);
    check(plain.usage.prompt_tokens === 3, 'the ids are the prompt, no BOS added', plain.usage);
    checkUsage(plain.usage, 6, 'ids prompt');
    const echoed = await client.completions.create({ ...ask, echo: true });
    const p = plain.choices[0].text, e = echoed.choices[0].text;
    check(e.length > p.length && e.endsWith(p), 'echo puts the prompt before the same completion',
      { plain: p, echoed: e });
  },

  // vLLM's fields, as load generators send them: a bias makes EOS the greedy choice, and
  // ignore_eos with min_tokens still gives every token asked for.
  async ignoreEos() {
    const ask = { model, prompt: 'Once upon a time', max_tokens: 20, temperature: 0,
      logit_bias: { 2: 100 } };
    const stopped = await client.completions.create(ask);
    check(stopped.choices[0].finish_reason === 'stop' && stopped.usage.completion_tokens === 1,
      'EOS ends the completion at once', stopped.usage);
    const full = await client.completions.create({ ...ask, ignore_eos: true, min_tokens: 20 });
    check(full.choices[0].finish_reason === 'length' && full.usage.completion_tokens === 20,
      'ignore_eos generates max_tokens', full.usage);
  },

  // n choices: one message per index, and a stream whose chunks each carry one index, the
  // per-index text the same as the whole answer's for the same seed.
  async choices() {
    const ask = {
      model, messages, max_completion_tokens: 8, temperature: 1, seed: 9, n: 2, ignore_eos: true,
    };
    const r = await client.chat.completions.create(ask);
    check(r.choices.length === 2, 'two choices', r.choices.length);
    r.choices.forEach((c, i) => check(c.index === i, 'choices in index order', c.index));
    check(r.usage.completion_tokens === 16, 'usage sums the choices', r.usage);
    const stream = await client.chat.completions.create({
      ...ask, stream: true, stream_options: { include_usage: true },
    });
    const text = ['', ''];
    let usage;
    for await (const c of stream) {
      if (c.choices.length === 0) { usage = c.usage; continue; }
      check(c.choices.length === 1, 'one choice per chunk', c);
      text[c.choices[0].index] += c.choices[0].delta.content ?? '';
    }
    r.choices.forEach((c, i) => check(text[i] === c.message.content,
      'each streamed choice equals the whole answer\'s', { i, streamed: text[i], whole: c.message.content }));
    check(usage?.completion_tokens === 16, 'the streamed usage sums the choices', usage);
    // An array of prompts (the SDK's string[] prompt): one choice each, in order.
    const batch = await client.completions.create({
      model, prompt: ['Once upon a time', [1, 300, 301]], max_tokens: 4, temperature: 0,
      ignore_eos: true,
    });
    check(batch.choices.length === 2 && batch.choices.every((c, i) => c.index === i),
      'one choice per prompt, in order', batch.choices);
    check(batch.usage.completion_tokens === 8, 'usage sums the prompts\' choices', batch.usage);
  },

  async badRequest() {
    try {
      await client.chat.completions.create({ model, messages, n: 129 });
    } catch (e) {
      check(e instanceof OpenAI.BadRequestError, 'n=129 raises BadRequestError', e?.constructor?.name);
      check(e.status === 400, 'status 400', e.status);
      check(e.param === 'n', 'error.param names n', e.param);
      check(e.type === 'invalid_request_error', 'error.type', e.type);
      return;
    }
    throw new Mismatch('n=129 was accepted');
  },
};

let failed = 0;
async function run(name, ...args) {
  try {
    const out = await checks[name](...args);
    console.log(`ok   ${name}`);
    return out;
  } catch (e) {
    failed++;
    const kind = e instanceof Mismatch ? 'mismatch' : `${e?.constructor?.name ?? 'error'}`;
    console.log(`FAIL ${name}: ${kind}: ${e?.message ?? e}`);
    if (!(e instanceof Mismatch) && e?.stack) console.log(e.stack);
    return undefined;
  }
}

check(typeof model === 'string', 'GET /models lists the served model', model);
console.log(`sluice at ${baseURL} serves ${model}; openai SDK ${VERSION}`);
const greedy = await run('completions');
if (greedy !== undefined) await run('completionsStreaming', greedy);
const chatText = await run('chat');
if (chatText !== undefined) await run('chatStreaming', chatText);
await run('promptIds');
await run('ignoreEos');
await run('choices');
await run('badRequest');
console.log(failed ? `${failed} check(s) failed` : 'all checks passed');
// Exit explicitly: idle keep-alive sockets must not hold the process open.
process.exit(failed ? 1 : 0);
