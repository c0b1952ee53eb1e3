#!/usr/bin/env python3
"""The GPU check's "served" step: sluice on the CUDA device serves each real tiny model, and its
greedy completions equal the goldens of ../shared/models, as a plain response, as a stream, and
with every prompt of a file in flight at once (one batch on the device).

usage: served.py SLUICE MODELS_DIR RESULT_JSON
SL_GPU_LD_PATH is the library path sluice runs with (this interpreter runs without it).
Exits 1 when any check fails; RESULT_JSON holds what each model passed."""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SLUICE, MODELS, RESULT = sys.argv[1], sys.argv[2], sys.argv[3]
# "cpu" tries the script where there is no device (the on-device check then fails, as it should).
DEVICE = os.environ.get("SL_GPU_DEVICE", "cuda")

# (name, model, tokenizer or None, golden file)
CASES = [
    ("stories260K.bin", "stories260K.bin", "tok512.bin", "stories260K.json"),
    ("stories260K.gguf", "stories260K.gguf", None, "stories260K.json"),
    ("tinystories-656K hf", "tinystories-656K/hf", None, "tinystories-656K.json"),
]


def start(model, tokenizer, log_path):
    conf = {"model": model, "tokenizer": tokenizer, "device": DEVICE, "log_level": "info",
            "max_seqs": 16, "max_batch_tokens": 512}
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(conf, f)
    f.close()
    env = dict(os.environ, LD_LIBRARY_PATH=os.environ.get("SL_GPU_LD_PATH", ""))
    log = open(log_path, "w")
    p = subprocess.Popen([SLUICE, "--config", f.name, "--listen", "127.0.0.1:0"], stderr=log,
                         env=env)
    for _ in range(600):
        text = open(log_path).read()
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        if m:
            return p, int(m.group(1)), text
        if p.poll() is not None:
            break
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("sluice did not start:\n" + open(log_path).read())


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def complete(port, prompt, n):
    j = json.loads(post(port, {"prompt": prompt, "max_tokens": n, "temperature": 0.0}))
    c = j["choices"][0]
    return c["text"], c["finish_reason"], j["usage"]["completion_tokens"]


def stream(port, prompt, n):
    raw = post(port, {"prompt": prompt, "max_tokens": n, "temperature": 0.0, "stream": True})
    text, done = "", False
    for line in raw.split("\n"):
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            done = True
            continue
        for c in json.loads(data).get("choices", []):
            text += c.get("text", "")
    return text, done


def check_model(name, model, tokenizer, golden, port_log):
    cases = json.load(open(os.path.join(MODELS, "golden", golden)))
    res = {"model": name, "cases": len(cases), "plain": 0, "stream": 0, "concurrent": 0,
           "on_cuda": False, "failures": []}
    p, port, log = start(os.path.join(MODELS, model),
                         os.path.join(MODELS, tokenizer) if tokenizer else None, port_log)
    try:
        res["on_cuda"] = bool(re.search(r"cuda:\d+: weights", log))
        if not res["on_cuda"]:
            res["failures"].append("the log has no 'cuda:N: weights' line: not on the device")
        wants = []
        for c in cases:
            prompt, text = c["prompt"], c["text"]
            want = text[len(prompt):-1] if text.endswith("\n") else text[len(prompt):]
            wants.append((prompt, want, c["n_generated"]))
        for prompt, want, n in wants:
            got, finish, used = complete(port, prompt, n)
            if got == want and finish == "length" and used == n:
                res["plain"] += 1
            else:
                res["failures"].append(f"plain {prompt!r}: got {got!r} ({finish}, {used} tokens),"
                                       f" want {want!r}")
            got, done = stream(port, prompt, n)
            if got == want and done:
                res["stream"] += 1
            else:
                res["failures"].append(f"stream {prompt!r}: got {got!r} (done {done}),"
                                       f" want {want!r}")
        # Every prompt at once, each three times: the device runs them as one batch.
        out = {}

        def one(i, prompt, n):
            try:
                out[i] = complete(port, prompt, n)[0]
            except Exception as e:  # noqa: BLE001 - recorded as a failure below
                out[i] = f"error: {e}"

        jobs = [(3 * k + r, w) for k, w in enumerate(wants) for r in range(3)]
        ts = [threading.Thread(target=one, args=(i, w[0], w[2])) for i, w in jobs]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for i, w in jobs:
            if out.get(i) == w[1]:
                res["concurrent"] += 1
            else:
                res["failures"].append(f"concurrent {w[0]!r}: got {out.get(i)!r}, want {w[1]!r}")
        res["concurrent_requests"] = len(jobs)
    finally:
        p.terminate()
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
    return res


def main():
    results, ok = [], True
    for i, (name, model, tok, golden) in enumerate(CASES):
        if not os.path.exists(os.path.join(MODELS, model)):
            print(f"served: {name}: {MODELS}/{model} not in the bundle, skipped")
            continue
        try:
            r = check_model(name, model, tok, golden, f"sluice-served-{i}.log")
        except Exception as e:  # noqa: BLE001 - the step reports it and goes on
            r = {"model": name, "error": str(e)}
        good = ("error" not in r and r["on_cuda"] and r["plain"] == r["cases"]
                and r["stream"] == r["cases"] and r["concurrent"] == r["concurrent_requests"])
        r["ok"] = good
        ok = ok and good
        results.append(r)
        summary = r.get("error") or (f"{r['plain']}/{r['cases']} plain, {r['stream']}/{r['cases']}"
                                     f" streamed, {r['concurrent']}/{r['concurrent_requests']}"
                                     " concurrent equal the golden")
        print(f"served: {name}: {'ok' if good else 'FAILED'}: {summary}")
        for f in r.get("failures", [])[:6]:
            print(f"  {f}")
    json.dump({"ok": ok and bool(results), "models": results}, open(RESULT, "w"), indent=1)
    sys.exit(0 if ok and results else 1)


main()
