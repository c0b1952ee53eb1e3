#!/usr/bin/env python3
"""Writes the example traces of `sluice simulate` (bench/traces/README.md says what each is).

Deterministic: a fixed seed per trace, Python's own Mersenne Twister, so running it again gives
the same files. The capacities are the simulator's (stories15M CPU cost model, conf/sluice.json's
limits), measured by running a backlog of each shape to its end; tests/sched/test_sim.c measures
them the same way.
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))

# Requests per second the simulated machine sustains for each shape alone.
CAP_BATCH = 4.19        # prompts 256-1024 tokens, outputs 64-256
CAP_INTERACTIVE = 20.10  # prompts 32-256 tokens, outputs 16-128

BATCH = ("batch", 256, 1024, 64, 256)
INTERACTIVE = ("interactive", 32, 256, 16, 128)


def poisson(rng, out, start, end, rate, shape, tenant):
    tier, p_lo, p_hi, o_lo, o_hi = shape
    t = start + rng.expovariate(rate)
    while t < end:
        out.append({"arrival": round(t, 4), "tier": tier, "tenant": tenant,
                    "prompt_tokens": rng.randint(p_lo, p_hi),
                    "output_tokens": rng.randint(o_lo, o_hi)})
        t += rng.expovariate(rate)


def write(name, reqs):
    reqs.sort(key=lambda r: r["arrival"])
    with open(os.path.join(HERE, name), "w") as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")


def main():
    # Batch at 3x its capacity plus interactive at 30 % of its capacity, for 60 s.
    rng = random.Random(1)
    reqs = []
    poisson(rng, reqs, 0, 60, 3 * CAP_BATCH, BATCH, "bulk-co")
    poisson(rng, reqs, 0, 60, 0.3 * CAP_INTERACTIVE, INTERACTIVE, "chat-co")
    write("flood.jsonl", reqs)

    # Within capacity: each tier at 40 % of its own capacity, for 60 s.
    rng = random.Random(2)
    reqs = []
    poisson(rng, reqs, 0, 60, 0.4 * CAP_BATCH, BATCH, "bulk-co")
    poisson(rng, reqs, 0, 60, 0.4 * CAP_INTERACTIVE, INTERACTIVE, "chat-co")
    write("steady.jsonl", reqs)

    # 16 interactive streams decoding; at 2 s a 4,096-token prompt arrives.
    reqs = [{"arrival": round(0.01 * i, 4), "tier": "interactive", "tenant": "chat-co",
             "prompt_tokens": 64, "output_tokens": 600} for i in range(16)]
    reqs.append({"arrival": 2.0, "tier": "interactive", "tenant": "chat-co",
                 "prompt_tokens": 4096, "output_tokens": 16})
    write("long_prompt.jsonl", reqs)

    # Mixed lengths, mostly short answers and a long tail, at 40 requests/s for 30 s (more than
    # the machine serves): compare with --static-batching.
    rng = random.Random(3)
    reqs = []
    poisson(rng, reqs, 0, 30, 32, ("batch", 8, 128, 4, 32), "bulk-co")
    poisson(rng, reqs, 0, 30, 8, ("batch", 8, 128, 128, 512), "bulk-co")
    write("mixed_lengths.jsonl", reqs)

    # Noisy neighbour inside one tier: bulk-co floods batch with long prompts at 2x capacity,
    # chat-co sends short ones at 1 request/s in the same tier, for 60 s.
    rng = random.Random(4)
    reqs = []
    poisson(rng, reqs, 0, 60, 2 * CAP_BATCH, BATCH, "bulk-co")
    poisson(rng, reqs, 0, 60, 1.0, ("batch", 32, 96, 16, 32), "chat-co")
    write("noisy.jsonl", reqs)

    # Chat with a shared system prompt: 16 users of chat-co in a closed-loop-like pattern (one
    # question every 2-4 s each), each request a 1,000-token system prompt then a 50-token
    # question, 32-token answers, for 30 s. With the prefix cache on, every request after the
    # first finds the system prompt's full blocks.
    rng = random.Random(5)
    reqs = []
    for u in range(16):
        t = rng.uniform(0, 2)
        while t < 30:
            reqs.append({"arrival": round(t, 4), "tier": "interactive", "tenant": "chat-co",
                         "prompt_tokens": 1050, "output_tokens": 32,
                         "prefix": "system", "prefix_tokens": 1000})
            t += rng.uniform(2, 4)
    write("shared_prefix.jsonl", reqs)


if __name__ == "__main__":
    main()
