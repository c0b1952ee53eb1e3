#!/usr/bin/env python3
"""bench/scenarios/peer.sh's helper: reads what each side wrote and prints the tables.

  peer.py gguf FILE              weight bytes a decode step reads, and the tensor types
  peer.py llama-bench FILE       llama-bench -o json: best pp and tg tok/s, model type, commit
  peer.py batched FILE           llama-batched-bench jsonl lines: best speed_tg per pl
  peer.py get FILE KEY[.KEY...]  one member of a JSON object
  peer.py served FILE            sluice-bench --json: out tok/s, TTFT p50, TPOT p50, tokens/req
  peer.py render TSV             the markdown tables of peer.sh's results file

Standard library only (no numpy): the scenario must run on a bare Debian.
"""
import json
import struct
import sys

# Bytes per block and values per block of the GGML types a llama file may hold (ggml.h's
# enum ggml_type numbers).
GGML_TYPES = {
    0: ("F32", 4, 1),
    1: ("F16", 2, 1),
    2: ("Q4_0", 18, 32),
    3: ("Q4_1", 20, 32),
    6: ("Q5_0", 22, 32),
    7: ("Q5_1", 24, 32),
    8: ("Q8_0", 34, 32),
    10: ("Q2_K", 84, 256),
    11: ("Q3_K", 110, 256),
    12: ("Q4_K", 144, 256),
    13: ("Q5_K", 176, 256),
    14: ("Q6_K", 210, 256),
    15: ("Q8_K", 292, 256),
    30: ("BF16", 2, 1),
}
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


class Reader:
    def __init__(self, f):
        self.f = f

    def take(self, n):
        b = self.f.read(n)
        if len(b) != n:
            raise SystemExit("peer.py: truncated GGUF file")
        return b

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def string(self):
        return self.take(self.u64()).decode("utf-8", "replace")

    def skip(self, t):
        if t == 8:
            self.take(self.u64())
        elif t == 9:
            at, n = self.u32(), self.u64()
            if at in FIXED:
                self.take(FIXED[at] * n)
            else:
                for _ in range(n):
                    self.skip(at)
        elif t in FIXED:
            self.take(FIXED[t])
        else:
            raise SystemExit("peer.py: unknown GGUF value type %d" % t)


def gguf(path):
    """Bytes of the weights a decode step reads, as engine-bench counts weight_bytes_per_step:
    every matrix but the token embedding (one row of it is read), which counts only when it is
    also the classifier (no output.weight); norms are not counted."""
    with open(path, "rb") as f:
        r = Reader(f)
        if r.take(4) != b"GGUF":
            raise SystemExit("peer.py: %s is not a GGUF file" % path)
        r.u32()
        n_t, n_kv = r.u64(), r.u64()
        for _ in range(n_kv):
            r.string()
            r.skip(r.u32())
        tensors = []
        for _ in range(n_t):
            name = r.string()
            ne = [r.u64() for _ in range(r.u32())]
            t = r.u32()
            r.u64()
            tensors.append((name, ne, t))
    names = {n for n, _, _ in tensors}
    total, types = 0, {}
    for name, ne, t in tensors:
        tname, bsize, bvals = GGML_TYPES.get(t, ("type%d" % t, 0, 1))
        types[tname] = types.get(tname, 0) + 1
        if len(ne) < 2 or (name == "token_embd.weight" and "output.weight" in names):
            continue
        elems = 1
        for d in ne:
            elems *= d
        total += elems // bvals * bsize
    desc = ", ".join("%s %d" % kv for kv in sorted(types.items(), key=lambda kv: -kv[1]))
    print("%d\t%s" % (total, desc))


def llama_bench(path):
    pp = tg = 0.0
    mtype = commit = "?"
    for t in json.load(open(path)):
        best = max(t.get("samples_ts") or [t.get("avg_ts", 0)])
        if t.get("n_prompt", 0) > 0 and t.get("n_gen", 0) == 0:
            pp = max(pp, best)
        elif t.get("n_gen", 0) > 0 and t.get("n_prompt", 0) == 0:
            tg = max(tg, best)
        mtype, commit = t.get("model_type", mtype), t.get("build_commit", commit)
    print("%.2f\t%.2f\t%s\t%s" % (pp, tg, mtype, commit))


def batched(path):
    best = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            d = json.loads(line)
            best[d["pl"]] = max(best.get(d["pl"], 0.0), d["speed_tg"])
    print("\t".join("%d:%.2f" % (pl, v) for pl, v in sorted(best.items())))


def get(path, key):
    v = json.load(open(path))
    for k in key.split("."):
        v = v[k]
    print(v)


def served(path):
    d = json.load(open(path))
    done = d.get("completed", 0)
    per = d.get("total_output_tokens", 0) / done if done else 0
    print("%.2f\t%.1f\t%.2f\t%d\t%.1f\t%d" % (d.get("output_throughput", 0),
          d.get("median_ttft_ms", 0), d.get("median_tpot_ms", 0), done, per,
          d.get("failed", 0)))


ENGINE_ROWS = [
    ("decode_1", "decode batch 1, tok/s", True),
    ("decode_1_floor", "decode batch 1 / bandwidth floor", False),
    ("decode_16", "decode batch 16, tok/s", True),
    ("prefill_512", "prefill 512, tok/s", True),
]
SERVED_ROWS = [
    ("out_tok_s", "output tok/s", True),
    ("ttft_p50", "TTFT p50, ms", True),
    ("tpot_p50", "TPOT p50, ms", True),
    ("tok_per_req", "output tokens/request", False),
    ("completed", "requests completed", False),
]


def fmt(v):
    try:
        x = float(v)
    except ValueError:
        return v
    if x >= 100:
        return "%.0f" % x
    if x >= 10:
        return "%.1f" % x
    return "%.2f" % x


def render(path):
    """Rows: model, round, part (engine, served, note), users (- for engine), key, side
    (sluice, llama), value (a number, or FAIL: why)."""
    models, data, notes, fails = [], {}, {}, {}
    for line in open(path):
        if not line.strip():
            continue
        m, rnd, part, users, key, side, val = line.rstrip("\n").split("\t", 6)
        if m not in models:
            models.append(m)
        if part == "note":
            notes.setdefault(m, []).append(val if rnd == "0" else "round %s: %s" % (rnd, val))
            continue
        if val.startswith("FAIL"):
            fails.setdefault((m, side, val[5:].strip()), set()).add(rnd)
            val = "failed"
        data[(m, part, rnd, users, key, side)] = val
    for m in models:
        print("\n### %s\n" % m)
        for n in notes.get(m, []):
            print("- %s" % n)
        for part, table in (("engine", ENGINE_ROWS), ("served", SERVED_ROWS)):
            groups = sorted({(int(k[2]), k[3]) for k in data if k[0] == m and k[1] == part},
                            key=lambda g: (g[0], int(g[1]) if g[1].isdigit() else 0))
            if not groups:
                continue
            print("\n| round | %sfigure | sluice | llama.cpp | sluice / llama.cpp |"
                  % ("users | " if part == "served" else ""))
            print("|---|%s---|---:|---:|---:|" % ("---:|" if part == "served" else ""))
            for rnd, users in groups:
                for key, label, ratio in table:
                    s = data.get((m, part, str(rnd), users, key, "sluice"))
                    l = data.get((m, part, str(rnd), users, key, "llama"))
                    if s is None and l is None:
                        continue
                    r = ""
                    if ratio:
                        try:
                            r = "%.2f" % (float(s) / float(l))
                        except (TypeError, ValueError, ZeroDivisionError):
                            r = "–"
                    u = "%s | " % users if part == "served" else ""
                    print("| %d | %s%s | %s | %s | %s |" % (rnd, u, label, fmt(s or "–"),
                                                        fmt(l or "–"), r))
    if fails:
        print("\nFailed (the other side's figures stand alone):\n")
        for (m, side, why), rounds in fails.items():
            print("- %s, %s, round %s: %s" % (m, side, ", ".join(sorted(rounds, key=int)), why))


def main():
    a = sys.argv[1:]
    cmds = {"gguf": gguf, "llama-bench": llama_bench, "batched": batched, "get": get,
            "served": served, "render": render}
    if not a or a[0] not in cmds:
        raise SystemExit(__doc__)
    cmds[a[0]](*a[1:])


if __name__ == "__main__":
    main()
