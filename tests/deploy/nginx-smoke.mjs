// Talks to sluice through nginx running deploy/nginx/sluice.conf (tests/deploy/check.sh starts
// both on loopback): a streamed completion arrives whole as server-sent events, the tenant key
// reaches sluice both as Authorization: Bearer and as x-api-key, a request without one gets
// sluice's 401, and /metrics is refused at the balancer.
//
// usage: node tests/deploy/nginx-smoke.mjs http://127.0.0.1:NGINX_PORT KEY
const [base, key] = process.argv.slice(2);
if (!base || !key) {
  console.error("usage: node nginx-smoke.mjs BASE_URL KEY");
  process.exit(2);
}
let failed = 0;
const check = (cond, what) => {
  console.log(`${cond ? "ok" : "FAIL"}: nginx: ${what}`);
  if (!cond) failed++;
};
const body = JSON.stringify({ prompt: "Once upon a time", max_tokens: 12, stream: true });
const post = (headers) =>
  fetch(`${base}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", ...headers },
    body,
  });

try {
  const r = await post({ authorization: `Bearer ${key}` });
  const text = await r.text();
  check(r.status === 200, `a streamed completion with Authorization: Bearer is 200 (${r.status})`);
  check((r.headers.get("content-type") ?? "").startsWith("text/event-stream"),
    `it is text/event-stream (${r.headers.get("content-type")})`);
  check(r.headers.get("content-length") === null, "it has no Content-Length (streamed, not buffered whole)");
  const events = text.split("\n\n").filter((e) => e.startsWith("data: "));
  check(events.length >= 3 && events[events.length - 1] === "data: [DONE]",
    `${events.length} SSE events ending with data: [DONE]`);
  check(events.slice(0, -1).every((e) => JSON.parse(e.slice(6)).object === "text_completion"),
    "every event but the last is a text_completion chunk");

  const x = await post({ "x-api-key": key });
  await x.text();
  check(x.status === 200, `the same with x-api-key is 200 (${x.status})`);

  const n = await post({});
  await n.text();
  check(n.status === 401, `without a key sluice answers 401 through nginx (${n.status})`);

  const m = await fetch(`${base}/metrics`);
  await m.text();
  check(m.status === 403, `/metrics is refused at the balancer (${m.status})`);
} catch (e) {
  check(false, `request failed: ${e.message}`);
}
process.exit(failed ? 1 : 0);
