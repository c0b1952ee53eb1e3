#!/usr/bin/env python3
"""The GPU check's figures: gathers what run.sh's steps wrote into one JSON object.

usage: report.py WORK_DIR COMMIT > gpu-check.json
       report.py --table gpu-check.json      (a short table of the figures)
A step that failed or did not run leaves its part null; nothing here needs a GPU."""
import csv
import json
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def last_json_line(path):
    try:
        lines = [ln for ln in open(path) if ln.startswith("{")]
    except OSError:
        return None
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def criterion(path):
    """Counts of a criterion --json report, the tests --filter left out not counted (criterion
    reports them as skipped with its generic message, where a test's own skip says why)."""
    j = load(path)
    if j is None:
        return None
    out = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "skips": []}
    for s in j.get("test_suites", []):
        for t in s.get("tests", []):
            msgs = t.get("messages") or []
            line = f"{s['name']}/{t['name']}: {'; '.join(msgs)[:300]}"
            if t.get("status") == "PASSED":
                out["passed"] += 1
            elif t.get("status") == "SKIPPED":
                if msgs != ["The test was skipped."]:
                    out["skipped"] += 1
                    out["skips"].append(line)
            else:
                out["failed"] += 1
                out["failures"].append(line)
    return out


SERVE_KEYS = ("completed", "failed", "duration", "request_throughput", "output_throughput",
              "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p99_itl_ms",
              "p50_e2el_ms", "p99_e2el_ms", "max_concurrent_requests")


def engine(path, ceilings):
    e = load(path)
    if e is None:
        return None
    # The run's own ceilings (measured beside it) are in e; the info step's are the cross-check.
    bw = e.get("hbm_copy_gbs")
    wb = e.get("weight_bytes_per_step")
    d1 = (e.get("decode_tok_s") or {}).get("1")
    if bw and wb and d1:
        e["decode_1_weight_gbs"] = round(d1 * wb / 1e9, 1)
        e["decode_1_vs_copy_bw"] = round(d1 * wb / 1e9 / bw, 3)
    gemm = e.get("bf16_gemm_tflops")
    fl = e.get("flops_per_prefill_token")
    if gemm and fl and e.get("prefill_tok_s"):
        e["prefill_tflops"] = round(e["prefill_tok_s"] * fl / 1e12, 1)
        e["prefill_vs_gemm"] = round(e["prefill_tok_s"] * fl / 1e12 / gemm, 3)
    return e


def gather(work, commit):
    steps = {}
    try:
        for row in csv.DictReader(open(os.path.join(work, "steps.tsv")), delimiter="\t"):
            steps[row["step"]] = {"rc": row["rc"], "seconds": float(row["seconds"])}
    except OSError:
        pass
    ceilings = load(os.path.join(work, "ceilings.json"))
    serve = {}
    for users in (1, 16, 64, 256):
        j = load(os.path.join(work, f"serve-{users}.json"))
        if j:
            serve[str(users)] = {k: j.get(k) for k in SERVE_KEYS}
    return {
        "commit": commit,
        "steps": steps,
        "device": ceilings,
        "tests": {"kernels": criterion(os.path.join(work, "tests-kernels.json")),
                  "worker": criterion(os.path.join(work, "tests-worker.json"))},
        "served": load(os.path.join(work, "served.json")),
        "engine_llama_1b": engine(os.path.join(work, "engine-llama-1b.json"), ceilings),
        "serve_llama_1b": serve or None,
        "flood": last_json_line(os.path.join(work, "flood.txt")),
        "engine_llama_8b": engine(os.path.join(work, "engine-llama-8b.json"), ceilings),
        "profile_llama_1b": load(os.path.join(work, "profile-llama-1b.json")),
        "base": {
            "engine_llama_1b": engine(os.path.join(work, "base-engine-llama-1b.json"), ceilings),
            "profile_llama_1b": load(os.path.join(work, "base-profile-llama-1b.json")),
            "engine_llama_8b": engine(os.path.join(work, "base-engine-llama-8b.json"), ceilings),
        },
    }


def table(path):
    r = load(path) or {}
    d = r.get("device") or {}
    print(f"device: {d.get('name')} ({d.get('sm_count')} SMs, {d.get('memory_gib')} GiB); copy "
          f"{d.get('hbm_copy_gbs')} GB/s, bf16 GEMM {d.get('bf16_gemm_tflops')} TFLOP/s")
    for name, s in (r.get("steps") or {}).items():
        print(f"  step {name:9s} rc {s['rc']:>7s}  {s['seconds']:6.1f} s")
    for k, t in (r.get("tests") or {}).items():
        if t:
            print(f"tests {k}: {t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped")
            for f in t["failures"][:8]:
                print(f"  FAIL {f}")
    s = r.get("served")
    if s:
        print(f"served: {'ok' if s.get('ok') else 'FAILED'}")
    base = r.get("base") or {}
    for key, e in (("engine_llama_1b", r.get("engine_llama_1b")),
                   ("base engine_llama_1b", base.get("engine_llama_1b")),
                   ("engine_llama_8b", r.get("engine_llama_8b")),
                   ("base engine_llama_8b", base.get("engine_llama_8b"))):
        if e:
            print(f"{key}: decode tok/s {e.get('decode_tok_s')}, prefill {e.get('prefill_tok_s')} "
                  f"tok/s; decode_1 vs copy {e.get('decode_1_vs_copy_bw')}, prefill vs GEMM "
                  f"{e.get('prefill_vs_gemm')}")
    for users, v in (r.get("serve_llama_1b") or {}).items():
        print(f"serve {users:>3s} users: {v['output_throughput']:.0f} out tok/s, TTFT p50/p99 "
              f"{v['p50_ttft_ms']:.1f}/{v['p99_ttft_ms']:.1f} ms, TPOT p50/p99 "
              f"{v['p50_tpot_ms']:.2f}/{v['p99_tpot_ms']:.2f} ms")
    for key, p in (("profile", r.get("profile_llama_1b")),
                   ("base profile", base.get("profile_llama_1b"))):
        for label, v in ((p or {}).get("profile") or {}).items():
            top = sorted(v["kinds"].items(), key=lambda kv: -kv[1]["ms"])[:4]
            print(f"{key} {label}: {v['step_ms']:.3f} ms/step; "
                  + ", ".join(f"{k} {x['ms']:.3f}" for k, x in top))
    if r.get("flood"):
        print(f"flood: {json.dumps(r['flood'])}")


if __name__ == "__main__":
    if sys.argv[1] == "--table":
        table(sys.argv[2])
    else:
        json.dump(gather(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None), sys.stdout,
                  indent=1)
        print()
