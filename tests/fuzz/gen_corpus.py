#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

Every seed is small and made here: hand-written requests, configurations and tokenizer files,
and tiny model files (GGUF, safetensors, llama2.c) of made-up weights. No file is copied from
../shared/models. The output is committed; run this again after changing it:

    python3 tests/fuzz/gen_corpus.py
"""
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(ROOT, "corpus")
SPACE = "\u2581"


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def weights(n, seed):
    """n made-up float32 values in about [-0.5, 0.5)."""
    return [((i * 2654435761 + seed) % 1000) / 1000.0 - 0.5 for i in range(n)]


def f32(vals):
    return struct.pack("<%df" % len(vals), *vals)


def f16(vals):
    return struct.pack("<%de" % len(vals), *vals)


def bf16(vals):
    return b"".join(struct.pack("<f", v)[2:] for v in vals)


def q8_0(vals):
    """GGML Q8_0: blocks of 32 values, an fp16 scale then 32 int8."""
    out = b""
    for b in range(0, len(vals), 32):
        blk = vals[b:b + 32]
        amax = max(abs(v) for v in blk)
        d = amax / 127 if amax else 0.0
        out += struct.pack("<e", d)
        out += bytes((round(v / d) if d else 0) & 0xFF for v in blk)
    return out


# ---------------------------------------------------------------------------------------------
# HTTP


def req(method, path, headers=(), body=None, version="1.1"):
    h = "%s %s HTTP/%s\r\nHost: 127.0.0.1\r\n" % (method, path, version)
    for k, v in headers:
        h += "%s: %s\r\n" % (k, v)
    if body is not None:
        h += "Content-Type: application/json\r\nContent-Length: %d\r\n" % len(body.encode())
    return h + "\r\n" + (body or "")


def chunked(method, path, pieces, headers=()):
    h = "%s %s HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n" % (method, path)
    for k, v in headers:
        h += "%s: %s\r\n" % (k, v)
    h += "\r\n"
    for i, p in enumerate(pieces):
        h += "%x%s\r\n%s\r\n" % (len(p.encode()), ";ext=%d" % i if i % 2 else "", p)
    return h + "0\r\nX-Trailer: t\r\n\r\n"


COMPLETION = json.dumps({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0.7,
                         "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7,
                         "stop": ["\n", "The end"], "stream": False, "n": 1,
                         "service_tier": "flex", "user": "u1", "model": "synthetic:tiny"})
STREAM = json.dumps({"prompt": "Hi", "max_tokens": 2, "stream": True,
                     "stream_options": {"include_usage": True}})
CHAT = json.dumps({"messages": [
    {"role": "system", "content": "Be brief."},
    {"role": "developer", "content": [{"type": "text", "text": "Plain text."}]},
    {"role": "user", "content": "Hello \u00e9"},
    {"role": "assistant", "content": None, "tool_calls": []},
    {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
    "max_completion_tokens": 3, "max_tokens": 5, "response_format": {"type": "text"},
    "tools": [], "stream": True})
ALICE = ("Authorization", "Bearer sk-fuzz-alice-0123456789abcdef")
ADMIN = ("Authorization", "Bearer sk-fuzz-admin-0123456789abcdef")


def http_requests():
    return {
        "get": req("GET", "/v1/models?x=1"),
        "post": req("POST", "/v1/completions", body=COMPLETION),
        "chat_stream": req("POST", "/v1/chat/completions", [ALICE], body=CHAT),
        "chunked": chunked("POST", "/v1/completions", ['{"pro', 'mpt":"hi",', '"max_tokens":2}']),
        "pipelined": req("GET", "/healthz") + req("HEAD", "/readyz") +
        req("POST", "/v1/completions", [("Connection", "keep-alive")], body=STREAM),
        "expect": req("POST", "/v1/completions", [("Expect", "100-continue")], body=COMPLETION),
        "http10": req("GET", "/healthz", [("Connection", "Keep-Alive")], version="1.0"),
        "close": req("GET", "/metrics", [("Connection", "close")]) + req("GET", "/healthz"),
        "upgrade": req("GET", "/", [("Connection", "Upgrade"), ("Upgrade", "websocket")]),
        "tier": req("POST", "/v1/completions", [ALICE, ("x-sluice-tier", "batch")], body=STREAM),
        "admin": req("GET", "/admin/config", [ADMIN]),
        "bad_method": req("DELETE", "/v1/completions"),
        "bad_json": req("POST", "/v1/chat/completions", body='{"messages": [1, '),
        "big_header": req("GET", "/", [("X-Big", "a" * 1100)]),
        "lf_only": "GET /healthz HTTP/1.1\nHost: a\n\n",
        "models_id": req("GET", "/v1/models/synthetic:tiny") + req("GET", "/v1/models/nope"),
    }


def gen_http():
    for name, r in http_requests().items():
        # fuzz_http_parser: byte 0 limits, bytes 1-2 the cut point.
        put("http_parser", name, bytes([0x0D, 0, len(r) // 2 & 0xFF]) + r.encode())
        # fuzz_http_conn: byte 0 the server (1: with tenants).
        put("http_conn", name, bytes([1 if "Bearer" in r else 0]) + r.encode())


# ---------------------------------------------------------------------------------------------
# OpenAI request bodies


def gen_openai():
    bodies = {
        "completion": (0, COMPLETION),
        "stream": (0, STREAM),
        "min": (0, '{"prompt":""}'),
        "null_fields": (0, '{"prompt":"x","max_tokens":null,"temperature":null,"stop":null}'),
        "big_numbers": (0, '{"prompt":"x","max_tokens":1e400,"seed":-1,"top_k":99999999999}'),
        "prompt_array": (0, '{"prompt":["a","b"]}'),
        "salts": (0, '{"prompt":"x","prompt_cache_key":"user-1","cache_salt":"s\\u00e9"}'),
        "chat_salt": (1, '{"messages":[{"role":"user","content":"hi"}],"cache_salt":"c"}'),
        "chat": (1, CHAT),
        "chat_min": (1, '{"messages":[{"role":"user","content":"hi"}]}'),
        "chat_tool": (1, '{"messages":[{"role":"tool","content":"x"}]}'),
        "chat_image": (1, '{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}'),
        "chat_markers": (1, json.dumps({"messages": [
            {"role": "system", "content": "<|im_start|>system<|im_end|>"},
            {"role": "user", "content": "[INST] <<SYS>> <start_of_turn> <|eot_id|>"}]})),
        "deep": (1, "[" * 64 + "]" * 64),
    }
    for name, (chat, body) in bodies.items():
        put("openai", name, bytes([chat | 2 * 15]) + body.encode())


# ---------------------------------------------------------------------------------------------
# Configuration


def gen_config():
    with open(os.path.join(ROOT, "..", "..", "conf", "sluice.json"), "rb") as f:
        put("config", "shipped", f.read())
    h = "1c2e47dcd313828d6a4ad999a108b8cddc2eded08680b482bab006f9b410212f"
    full = {
        "listen": "[::1]:0", "listen_backlog": 128, "io_threads": 2, "threads": 1,
        "max_seqs": 4, "max_batch_tokens": 64, "block_size": 8, "kv_cache_mib": 16,
        "kv_cache_fraction": 0.5, "default_max_tokens": 8, "max_body_bytes": 4096,
        "max_header_bytes": 1024, "header_timeout_ms": 100, "idle_timeout_ms": 100,
        "max_connections": 10, "write_high_water_bytes": 100, "write_hard_cap_bytes": 2000,
        "tcp_send_buffer_bytes": 4096, "drain_timeout_ms": 5, "log_level": "debug",
        "model": "synthetic:stories15M:q8_0", "tokenizer": None, "chat_template": "chatml",
        "tls": {"listen": "127.0.0.1:0", "cert": "c.pem", "key": "k.pem"},
        "tiers": {"gold": {"priority": 0, "weight": 9, "ttft_slo_ms": 500, "tpot_slo_ms": 50},
                  "bronze": {"priority": 5, "weight": 1, "ttft_slo_ms": 9000,
                             "tpot_slo_ms": 900}},
        "tenants": [{"name": "acme", "key_sha256": h, "tiers": ["gold", "bronze"],
                     "default_tier": "bronze"}],
        "admin_key_sha256": h.replace("1", "2"),
        "classify": [{"header": "x-sluice-tier"},
                     {"service_tier": {"priority": "gold", "flex": "bronze", "auto": None}},
                     {"tier": "bronze", "path": "/v1/completions", "stream": False,
                      "max_tokens_above": 100},
                     {"tenant_default": True}],
    }
    put("config", "full", json.dumps(full, indent=1))
    put("config", "tiers_only", '{"tiers": {"a": {"priority": 1, "weight": 1, '
        '"ttft_slo_ms": 1, "tpot_slo_ms": 1}}}')
    put("config", "empty", "{}")
    put("config", "comments", '{"// x": 1, "tls": null, "admin_key_sha256": null}')


# ---------------------------------------------------------------------------------------------
# Tokenizers


TEXTS = [
    "Once upon a time, there was a little girl.",
    "  leading spaces and trailing  ",
    "caf\u00e9 \u00fcber na\u00efve \u2014 \u20ac5 \u2026",
    "emoji \U0001F600 and \u2581 literal",
    "<s> <|im_start|> hello ab aba",
    "",
]


def gen_tokenizers():
    for i, t in enumerate(TEXTS):
        b = t.encode()
        put("tok_spm", "text_synth_%d" % i, bytes([0, 0]) + b)
        put("tok_spm", "text_small_%d" % i, bytes([1, 3]) + b"ab " + b)
        put("tok_hf", "text_%d" % i, bytes([1]) + b)
    put("tok_spm", "ids_synth", bytes([2, 2]) + b"e!" + bytes(range(0, 200)))
    put("tok_spm", "ids_small", bytes([3, 0]) + bytes([3, 1, 0xC3 + 3, 1, 0xA9 + 3, 1] * 8))
    put("tok_spm", "invalid_utf8", bytes([0, 0]) + b"a\xc3(b\xe2\x82\xf0\x9f\x98")
    put("tok_hf", "ids", bytes([2]) + bytes(range(0, 255)))
    put("tok_hf", "invalid_utf8", bytes([1]) + b"hello \xff\xfe")

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in [0x00, 0x0A, 0x20, 0x41, 0xC3, 0xA9, 0xE2, 0x96, 0x81, 0xF0, 0x9F, 0x98]:
        vocab["<0x%02X>" % b] = len(vocab)
    for w in [SPACE, "a", "b", SPACE + "a", "ab", SPACE + "ab", "\u00e9"]:
        vocab[w] = len(vocab)
    tj = {
        "version": "1.0",
        "added_tokens": [
            {"id": 0, "content": "<unk>", "special": True, "normalized": False},
            {"id": 1, "content": "<s>", "special": True, "normalized": False},
            {"id": 2, "content": "</s>", "special": True, "normalized": False},
            {"id": 30, "content": "<|im_start|>", "special": True, "normalized": False},
            {"id": 31, "content": SPACE + "hello", "special": False, "normalized": True}],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SPACE},
            {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
                  "merges": [SPACE + " a", "a b", [SPACE + "a", "b"]]},
    }
    put("tok_hf", "tokenizer_json", bytes([0]) + json.dumps(tj).encode())
    tj["model"]["byte_fallback"] = False
    tj["model"]["ignore_merges"] = True
    tj["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    put("tok_hf", "tokenizer_json_plain", bytes([3]) + json.dumps(tj).encode())
    return tj


# ---------------------------------------------------------------------------------------------
# Model files

GT_U32, GT_I32, GT_F32, GT_STRING, GT_ARRAY = 4, 5, 6, 8, 9
GGML = {"f32": (0, f32), "f16": (1, f16), "q8_0": (8, q8_0), "bf16": (30, bf16)}


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(shape, wtype, chat_template=None, tied=True):
    dim, hid, layers, heads, kvh, ctx = shape
    hs = dim // heads
    kv = hs * kvh
    pieces = ["<unk>", "<s>", "</s>", "<0x41>", "<0xC3>", "<0xA9>", SPACE, "a", "b", SPACE + "a",
              "ab", "\u00e9"]
    vocab = len(pieces)
    meta = [
        ("general.architecture", GT_STRING, gguf_str("llama")),
        ("general.alignment", GT_U32, struct.pack("<I", 32)),
        ("llama.context_length", GT_U32, struct.pack("<I", ctx)),
        ("llama.embedding_length", GT_U32, struct.pack("<I", dim)),
        ("llama.feed_forward_length", GT_U32, struct.pack("<I", hid)),
        ("llama.block_count", GT_U32, struct.pack("<I", layers)),
        ("llama.attention.head_count", GT_U32, struct.pack("<I", heads)),
        ("llama.attention.head_count_kv", GT_U32, struct.pack("<I", kvh)),
        ("llama.attention.layer_norm_rms_epsilon", GT_F32, struct.pack("<f", 1e-5)),
        ("llama.rope.freq_base", GT_F32, struct.pack("<f", 10000.0)),
        ("llama.rope.dimension_count", GT_U32, struct.pack("<I", hs)),
        ("llama.vocab_size", GT_U32, struct.pack("<I", vocab)),
        ("tokenizer.ggml.model", GT_STRING, gguf_str("llama")),
        ("tokenizer.ggml.tokens", GT_ARRAY,
         struct.pack("<IQ", GT_STRING, vocab) + b"".join(gguf_str(p) for p in pieces)),
        ("tokenizer.ggml.scores", GT_ARRAY,
         struct.pack("<IQ", GT_F32, vocab) + f32([-float(i) for i in range(vocab)])),
        ("tokenizer.ggml.token_type", GT_ARRAY,
         struct.pack("<IQ", GT_I32, vocab) +
         struct.pack("<%di" % vocab, *([2, 3, 3, 6, 6, 6] + [1] * (vocab - 6)))),
        ("tokenizer.ggml.bos_token_id", GT_U32, struct.pack("<I", 1)),
        ("tokenizer.ggml.eos_token_id", GT_U32, struct.pack("<I", 2)),
        ("tokenizer.ggml.unknown_token_id", GT_U32, struct.pack("<I", 0)),
    ]
    if chat_template:
        meta.append(("tokenizer.chat_template", GT_STRING, gguf_str(chat_template)))
    tensors = [("token_embd.weight", wtype, (dim, vocab)),
               ("output_norm.weight", "f32", (dim,))]
    if not tied:
        tensors.append(("output.weight", wtype, (dim, vocab)))
    for l in range(layers):
        tensors += [
            ("blk.%d.attn_norm.weight" % l, "f32", (dim,)),
            ("blk.%d.ffn_norm.weight" % l, "f32", (dim,)),
            ("blk.%d.attn_q.weight" % l, wtype, (dim, dim)),
            ("blk.%d.attn_k.weight" % l, wtype, (dim, kv)),
            ("blk.%d.attn_v.weight" % l, wtype, (dim, kv)),
            ("blk.%d.attn_output.weight" % l, wtype, (dim, dim)),
            ("blk.%d.ffn_gate.weight" % l, wtype, (dim, hid)),
            ("blk.%d.ffn_down.weight" % l, wtype, (hid, dim)),
            ("blk.%d.ffn_up.weight" % l, wtype, (dim, hid)),
        ]
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, t, v in meta:
        out += gguf_str(k) + struct.pack("<I", t) + v
    data = b""
    infos = b""
    for i, (name, t, ne) in enumerate(tensors):
        n = 1
        for d in ne:
            n *= d
        code, pack = GGML[t]
        blob = pack(weights(n, i))
        data += b"\0" * (-len(data) % 32)
        infos += gguf_str(name) + struct.pack("<I", len(ne)) + \
            struct.pack("<%dQ" % len(ne), *ne) + struct.pack("<IQ", code, len(data))
        data += blob
    out += infos
    out += b"\0" * (-len(out) % 32)
    return out + data


def safetensors(shape, dtype, tied):
    dim, hid, layers, heads, kvh, vocab = shape
    kv = dim // heads * kvh
    pack = {"F32": f32, "F16": f16, "BF16": bf16}[dtype]
    names = [("model.embed_tokens.weight", [vocab, dim]), ("model.norm.weight", [dim])]
    if not tied:
        names.append(("lm_head.weight", [vocab, dim]))
    for l in range(layers):
        p = "model.layers.%d." % l
        names += [(p + "input_layernorm.weight", [dim]),
                  (p + "post_attention_layernorm.weight", [dim]),
                  (p + "self_attn.q_proj.weight", [dim, dim]),
                  (p + "self_attn.k_proj.weight", [kv, dim]),
                  (p + "self_attn.v_proj.weight", [kv, dim]),
                  (p + "self_attn.o_proj.weight", [dim, dim]),
                  (p + "mlp.gate_proj.weight", [hid, dim]),
                  (p + "mlp.down_proj.weight", [dim, hid]),
                  (p + "mlp.up_proj.weight", [hid, dim])]
    header, body = {}, b""
    if tied:
        header["__metadata__"] = {"format": "pt", "lm_head.weight": "model.embed_tokens.weight"}
    for i, (name, sh) in enumerate(names):
        n = 1
        for d in sh:
            n *= d
        blob = pack(weights(n, i))
        header[name] = {"dtype": dtype, "shape": sh, "data_offsets": [len(body), len(body) + len(blob)]}
        body += blob
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + body


def llama2c(dim, hid, layers, heads, kvh, vocab, ctx, shared):
    hs = dim // heads
    kv = hs * kvh
    n = vocab * dim + layers * dim + layers * dim * dim + 2 * layers * kv * dim + \
        layers * dim * dim + layers * dim + 3 * layers * hid * dim + dim + ctx * hs
    if not shared:
        n += vocab * dim
    head = struct.pack("<7i", dim, hid, layers, heads, kvh, vocab if shared else -vocab, ctx)
    return head + f32(weights(n, 3))


def tokenizer_bin(vocab):
    pieces = [b"<unk>", b"\n<s>\n", b"\n</s>\n"] + [b"<0x%02X>" % b for b in range(256)]
    extra = [b" ", b"a", b"b", b" a", b"ab", b" ab", "\u00e9".encode(), b"ba", b"aba"]
    pieces += extra[:vocab - len(pieces)]
    while len(pieces) < vocab:
        pieces.append(b"#%d" % len(pieces))
    out = struct.pack("<i", max(len(p) for p in pieces))
    for i, p in enumerate(pieces):
        out += struct.pack("<fi", -float(i), len(p)) + p
    return out


def gen_models(tj):
    put("gguf", "tiny_f32", gguf((8, 16, 1, 2, 1, 16), "f32",
                                 chat_template="{{ '<|im_start|>' + message['role'] }}"))
    put("gguf", "tiny_f16_untied", gguf((8, 8, 2, 2, 2, 8), "f16", tied=False))
    put("gguf", "q8_0", gguf((32, 32, 1, 4, 2, 8), "q8_0"))
    put("gguf", "bf16", gguf((8, 16, 1, 2, 1, 8), "bf16"))
    # fuzz_safetensors: byte 0 picks the shape (bit 0) and tied embeddings (bit 1).
    put("safetensors", "shape0_f32", b"\0" + safetensors((8, 16, 1, 2, 1, 8), "F32", False))
    put("safetensors", "shape0_tied_bf16", b"\2" + safetensors((8, 16, 1, 2, 1, 8), "BF16", True))
    put("safetensors", "shape1_f16", b"\1" + safetensors((8, 8, 2, 2, 2, 4), "F16", False))
    sep = b"\n==tokenizer.bin==\n"
    put("llama2c", "shared", llama2c(4, 8, 1, 2, 1, 264, 8, True) + sep + tokenizer_bin(264))
    put("llama2c", "separate_gqa",
        llama2c(4, 4, 1, 2, 1, 259, 4, False) + sep + tokenizer_bin(259))
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "intermediate_size": 16,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
           "vocab_size": 300, "max_position_embeddings": 16, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "tie_word_embeddings": True, "bos_token_id": 1,
           "eos_token_id": [2, 299], "hidden_act": "silu", "head_dim": 4,
           "rope_scaling": None, "attention_bias": False}
    sep1, sep2 = "\n==tokenizer_config.json==\n", "\n==generation_config.json==\n"
    put("hf_folder", "config_only", json.dumps(cfg))
    put("hf_folder", "chat_string",
        json.dumps(cfg) + sep1 + json.dumps({"chat_template": "{{ '<|im_start|>' }}",
                                             "model_max_length": 1000000000000000019884624838656})
        + sep2 + json.dumps({"eos_token_id": 3}))
    put("hf_folder", "chat_list",
        json.dumps(cfg) + sep1 + json.dumps({"chat_template": [
            {"name": "tool_use", "template": "x"},
            {"name": "default", "template": "<start_of_turn>user"}]}))


def gen_redis():
    """Replies of the fleet's scripts (RESP2), whole and broken; byte 0: buckets - 1."""
    def ints(*v):
        return "*%d\r\n" % len(v) + "".join(":%d\r\n" % x for x in v)
    put("redis_reply", "admitted-3", b"\x02\x05" + ints(1, 1795750000000000, 9, 6000000, 40,
                                                       2400000000, 940, 216000000).encode())
    put("redis_reply", "refused-2", b"\x02\x03" + ints(0, 1795750000000000, 2, 1000, 0,
                                                        60000000).encode())
    put("redis_reply", "never-1", b"\x00\x01" + ints(0, 1795750000000000, 1, -1, 5, 0).encode())
    put("redis_reply", "noscript", b"\x00\x04-NOSCRIPT No matching script.\r\n")
    put("redis_reply", "nested", b"\x01\x02*2\r\n:1\r\n*1\r\n$3\r\nabc\r\n")
    put("redis_reply", "two", b"\x00\x07" + (ints(1, 5, 0, 0) + "+OK\r\n").encode())

    def bulk(x):
        return "$%d\r\n%s\r\n" % (len(x), x)
    fields = ["acme\tm\tbatch\tcost", "10350", "acme\tm\tbatch\trequests", "2",
              "acme\tm\tbatch\tcolour", "x"]
    page = ("*5\r\n:123456\r\n:1795759200\r\n*%d\r\n" % len(fields) +
            "".join(bulk(f) for f in fields) + ":1795762800\r\n*0\r\n")
    put("redis_reply", "usage-page", b"\x00\x09" + page.encode())


def gen_usage():
    """Lines of the usage journal (usage/journal.c): records, hourly totals, a torn end."""
    line = ('{"tenant":"acme","model":"m","tier":"batch","hour":1795759200,"requests":1,'
            '"prompt_tokens":5,"cached_tokens":0,"completion_tokens":16,"device_ns":812000,'
            '"cost":10350}')
    put("usage_journal", "one", (line + "\n").encode())
    put("usage_journal", "torn", (line + "\n" + line[:40]).encode())
    put("usage_journal", "mixed", (line + "\nnot json\n\n" + line.replace("acme", "a\\u00e9")
                                   + "\n").encode())


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    gen_http()
    gen_openai()
    gen_config()
    gen_redis()
    gen_usage()
    tj = gen_tokenizers()
    gen_models(tj)


if __name__ == "__main__":
    main()
