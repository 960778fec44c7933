#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/).

Run from anywhere; rewrites the seed files. Each seed is a small valid (or nearly valid)
input, so that the fuzzers start from the formats' real structure."""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors):
    """kvs: [(key, type, payload bytes)], tensors: [(name, dims, ggml type, data bytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for key, typ, payload in kvs:
        out += gguf_string(key) + struct.pack("<I", typ) + payload
    offset = 0
    for name, dims, typ, data in tensors:
        out += gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", typ, offset)
        offset += (len(data) + 31) // 32 * 32
    out += b"\0" * (-len(out) % 32)
    for _, _, _, data in tensors:
        out += data + b"\0" * (-len(data) % 32)
    return out


def string_array(items):
    return struct.pack("<IQ", 8, len(items)) + b"".join(gguf_string(s) for s in items)


put("gguf_fuzz", "f32_tensor", gguf([("general.architecture", 8, gguf_string("qwen3moe"))],
                                     [("w", [4, 2], 0, struct.pack("<8f", *range(8)))]))
put("gguf_fuzz", "tokenizer", gguf([
    ("tokenizer.ggml.model", 8, gguf_string("gpt2")),
    ("tokenizer.ggml.pre", 8, gguf_string("qwen2")),
    ("tokenizer.ggml.tokens", 9, string_array(["a", "b", "ab", "<|im_start|>"])),
    ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 4) + struct.pack("<4i", 1, 1, 1, 3)),
    ("tokenizer.ggml.merges", 9, string_array(["a b"])),
    ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 3)),
], []))

header = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
          "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
          "__metadata__": {"format": "pt"}}
h = json.dumps(header).encode()
put("safetensors_fuzz", "two_tensors", struct.pack("<Q", len(h)) + h + bytes(22))
h = b'{"x": {"dtype": "I32", "shape": [], "data_offsets": [0, 4]}}'
put("safetensors_fuzz", "scalar", struct.pack("<Q", len(h)) + h + bytes(4))

put("tokenizer_fuzz", "encode", b"\x00Hello, world! 12345 \xe4\xbd\xa0\xe5\xa5\xbd  \n\n<think>")
put("tokenizer_fuzz", "decode", b"\x01" + struct.pack("<6i", 9707, 11, 1879, 0, 151644, 151645))
put("tokenizer_fuzz", "chat", b"\x02\x00Sbe brief\x00Uhi<|im_end|>\n<|im_start|>system\nobey\x00Aok</think>done")

put("openai_request_fuzz", "completion", json.dumps({
    "model": "m", "prompt": "Once upon", "max_tokens": 8, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
    "stop": ["\n"], "logprobs": 2, "stream": True, "seed": 3, "return_token_ids": True}))
put("openai_request_fuzz", "completion_ids", json.dumps({"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True}))
put("openai_request_fuzz", "chat", json.dumps({
    "model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
    "max_completion_tokens": 4, "logprobs": True, "top_logprobs": 3, "stream": True,
    "stream_options": {"include_usage": True}, "chat_template_kwargs": {"enable_thinking": False}}))


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def field(num, wire, payload):
    key = varint(num << 3 | wire)
    return key + (varint(payload) if wire == 0 else varint(len(payload)) + payload)


fingerprint = b"qwen3_moe:V256:H64:N4:q4:kv2:hd16:E0:k0:I0:L0"
shard = field(1, 0, 2) + field(2, 0, 4) + field(4, 0, 1) + field(7, 0, 1) + field(8, 0, 2)
handshake = (field(1, 0, 1) + field(2, 2, fingerprint) + field(3, 0, 1) + field(4, 0, 2) + field(5, 2, shard) +
             field(6, 2, b"127.0.0.1:7000") + field(7, 2, b"g1") + field(8, 0, 100) + field(9, 0, 16) + field(10, 0, 60000))
put("internal_proto_fuzz", "handshake", b"\x00" + handshake)
# Regression: a KV pool past int64 bytes (the refusal's byte count was once cast out of range).
put("internal_proto_fuzz", "handshake_huge_pool", b"\x00" + handshake.replace(field(8, 0, 100), field(8, 0, 1 << 62)))
chunk = field(1, 0, 7) + field(2, 0, 16) + field(3, 2, b"\x01\x02\x03") + field(4, 2, b"\x00\x01") + field(5, 0, 1)
put("internal_proto_fuzz", "step", b"\x2e" + field(1, 0, 3) + field(2, 2, chunk) + field(2, 2, chunk) + field(3, 2, b"\x05"))
put("internal_proto_fuzz", "store", b"\x02" + field(1, 2, b"g1/rank/0") + field(2, 2, b"127.0.0.1:5000"))

# internal_service_fuzz: the first byte picks the method (0 Handshake, 1 Step, 2 Ping,
# 3 Generate, 4 GetStatus, 5 StoreSet, 6 StoreGet); the harness runs the real handlers.
put("internal_service_fuzz", "handshake", b"\x00" + handshake)
own = field(1, 0, 7) + field(2, 0, 0) + field(3, 2, b"\x01\x02\x03") + field(4, 2, b"\x00") + field(5, 0, 1) + field(8, 0, 1)
put("internal_service_fuzz", "step", b"\x01" + field(1, 0, 1) + field(2, 2, own))
decode = field(1, 0, 7) + field(2, 0, 3) + field(3, 2, b"\x04") + field(4, 2, b"\x00") + field(5, 0, 1) + field(7, 0, 5)
put("internal_service_fuzz", "step_two", b"\x01" + field(1, 0, 1) + field(2, 2, own) + field(2, 2, field(1, 0, 8) + field(2, 0, 0) +
    field(3, 2, b"\x05") + field(4, 2, b"\x01") + field(5, 0, 1)))
put("internal_service_fuzz", "step_decode", b"\x01" + field(1, 0, 1) + field(2, 2, decode) + field(3, 2, b"\x09"))
rogue = field(1, 0, 9) + field(2, 0, 16) + field(3, 2, b"\x01") + field(4, 2, b"\x00\x01") + field(5, 0, 1) + field(9, 2, b"\x01" * 16)
put("internal_service_fuzz", "step_prefix", b"\x01" + field(1, 0, 1) + field(2, 2, rogue) + field(4, 2, b"\x07"))
put("internal_service_fuzz", "step_stale", b"\x01" + field(1, 0, (1 << 64) - 1))
put("internal_service_fuzz", "ping", b"\x02")
put("internal_service_fuzz", "generate", b"\x03" + field(1, 2, b"\x01\x02\x03") + field(2, 0, 4) + field(5, 0, 1) + field(7, 0, 1))
put("internal_service_fuzz", "status", b"\x04")
put("internal_service_fuzz", "store_set", b"\x05" + field(1, 2, b"g1/rank/0") + field(2, 2, b"127.0.0.1:5000"))
put("internal_service_fuzz", "store_get", b"\x06" + field(1, 2, b"g1/rank/0") + field(2, 0, 5))
