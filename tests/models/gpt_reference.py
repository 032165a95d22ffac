# GPT-2's forward pass written from its definition with PyTorch's functional ops, for
# tests/models/gpt_test.cc: reads a GPT-2-layout safetensors file (parsed here with the
# json module, not with cleave's reader), runs token ids through it and writes the
# logits (float32, [B, T, vocab], raw) and the mean next-token cross-entropy (text).
# Usage: /usr/bin/python3 gpt_reference.py MODEL.safetensors TOKENS.i64 B T HEADS OUT
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F


def load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        begin, end = info["data_offsets"]
        t = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32)
        tensors[name.removeprefix("transformer.")] = t.reshape(info["shape"])
    return tensors


def forward(w, ids, heads):
    batch, t = ids.shape
    dim = w["wte.weight"].shape[1]
    hd = dim // heads
    x = w["wte.weight"][ids] + w["wpe.weight"][:t]
    mask = torch.tril(torch.ones(t, t, dtype=torch.bool))
    layers = sum(1 for k in w if k.endswith(".ln_1.weight"))
    for i in range(layers):
        p = f"h.{i}."
        h = F.layer_norm(x, (dim,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        qkv = h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (z.reshape(batch, t, heads, hd).transpose(1, 2) for z in qkv.split(dim, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(batch, t, dim)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (dim,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
        h = F.gelu(h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (dim,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    return x @ w.get("lm_head.weight", w["wte.weight"]).t()  # GPT-2 ties the head to wte


if __name__ == "__main__":
    path, tokens, batch, t, heads, out = sys.argv[1:7]
    batch, t, heads = int(batch), int(t), int(heads)
    with open(tokens, "rb") as f:
        ids = torch.frombuffer(bytearray(f.read()), dtype=torch.int64).reshape(batch, t)
    with torch.no_grad():
        logits = forward(load(path), ids, heads)
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[2]), ids[:, 1:].reshape(-1))
    with open(out, "wb") as f:
        f.write(logits.contiguous().numpy().tobytes())
    with open(out + ".loss", "w") as f:
        f.write(repr(loss.item()))
