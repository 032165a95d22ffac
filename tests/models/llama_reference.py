# The Llama family as Hugging Face's transformers defines it (modeling_llama.py,
# modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py: RMSNorm, rotate-half RoPE with
# the llama3 and linear scalings, grouped-query attention, Qwen3's per-head q/k norm,
# Mistral's sliding window, SwiGLU), written here with PyTorch's functional ops in float64
# for tests/models/llama_test.cc. It also writes the random tiny folders the test loads
# (config.json and safetensors, F32 or BF16, one file or shards with an index), parsing and
# writing safetensors with the json and struct modules, not with cleave's code.
#   make DIR FAMILY DTYPE SHARDS SEED      a random folder of FAMILY (llama, mistral,
#                                          qwen2, qwen3, bytes), DTYPE F32 or BF16
#   forward DIR TOKENS.i64 B T OUT         float64 logits [B, T, vocab], raw
#   generate DIR PROMPT_LEN TOKENS SEED    greedy generation in float32 with a key/value
#                                          cache (PyTorch eager, one thread), timed;
#                                          prints "TOKENS_PER_S id id ..."
# Either takes several jobs, one after another on the command line (torch loads once).
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

CONFIGS = {
    # Llama 3.1's rope scaling, grouped-query attention, an untied head.
    "llama": dict(model_type="llama", vocab_size=97, hidden_size=48, intermediate_size=80,
                  num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                  max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=500000.0,
                  rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=8192),
                  tie_word_embeddings=False, attention_bias=False, hidden_act="silu"),
    # Multi-query attention and a sliding window shorter than the sequence.
    "mistral": dict(model_type="mistral", vocab_size=101, hidden_size=32, intermediate_size=64,
                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                    max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                    sliding_window=5, tie_word_embeddings=False, hidden_act="silu"),
    # q/k/v biases and a head tied to the embedding.
    "qwen2": dict(model_type="qwen2", vocab_size=89, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True, use_sliding_window=False, hidden_act="silu"),
    # Per-head q/k RMSNorm and a head_dim that is not hidden_size / heads.
    "qwen3": dict(model_type="qwen3", vocab_size=83, hidden_size=32, intermediate_size=48,
                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                  max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  rope_scaling=dict(rope_type="linear", factor=2.0),
                  tie_word_embeddings=False, attention_bias=False, hidden_act="silu"),
    # A small Llama over bytes (the byte tokenizer's 256 ids), initialised as transformers
    # does (std 0.02), for federations that train it (tests/integration/split_test.cc).
    "bytes": dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False, hidden_act="silu"),
    # The same with its head tied to the embedding (as SmolLM2's and Qwen's small models).
    "bytes-tied": dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                       tie_word_embeddings=True, hidden_act="silu"),
    # SmolLM2-135M's shape (random weights, transformers' initialisation), for
    # bench/llama_generate.cc.
    "smol": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                 num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                 max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                 tie_word_embeddings=True, hidden_act="silu"),
    # SmolLM2's blocks, six of them, over bytes: bench/qlora.cc fine-tunes it.
    "smol6": dict(model_type="llama", vocab_size=256, hidden_size=576, intermediate_size=1536,
                  num_hidden_layers=6, num_attention_heads=9, num_key_value_heads=3,
                  max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                  tie_word_embeddings=True, hidden_act="silu"),
}


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def random_weights(c, seed):
    g = torch.Generator().manual_seed(seed)
    d, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    h, kv, hd = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    w = {}

    trained = c["vocab_size"] in (256, 49152)  # "bytes", "smol": transformers' initialisation

    def normal(*shape, std=0.2):
        return torch.randn(*shape, generator=g) * (0.02 if trained else std)

    def gain(n):
        return torch.ones(n) if trained else 1 + normal(n, std=0.1)

    w["model.embed_tokens.weight"] = normal(v, d)
    qkv_bias = c["model_type"] == "qwen2" or c.get("attention_bias", False)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = gain(d)
        w[p + "self_attn.q_proj.weight"] = normal(h * hd, d)
        w[p + "self_attn.k_proj.weight"] = normal(kv * hd, d)
        w[p + "self_attn.v_proj.weight"] = normal(kv * hd, d)
        w[p + "self_attn.o_proj.weight"] = normal(d, h * hd)
        if qkv_bias:
            for n, size in (("q", h * hd), ("k", kv * hd), ("v", kv * hd)):
                w[p + f"self_attn.{n}_proj.bias"] = normal(size)
        if c["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = gain(hd)
            w[p + "self_attn.k_norm.weight"] = gain(hd)
        w[p + "post_attention_layernorm.weight"] = gain(d)
        w[p + "mlp.gate_proj.weight"] = normal(f, d)
        w[p + "mlp.up_proj.weight"] = normal(f, d)
        w[p + "mlp.down_proj.weight"] = normal(d, f)
    w["model.norm.weight"] = gain(d)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(v, d)
    return w


def write_safetensors(path, tensors, dtype):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        if dtype == "BF16":
            raw = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            raw = t.to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def make(folder, family, dtype, shards, seed):
    c = CONFIGS[family]
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    w = random_weights(c, seed)
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), w, dtype)
        return
    names = list(w)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: w[n] for n in names[s::shards]}
        write_safetensors(os.path.join(folder, file), part, dtype)
        weight_map.update({n: file for n in part})
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        dtype = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}[info["dtype"]]
        out[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(info["shape"]).double()
    return out


def load(folder):
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    index = os.path.join(folder, "model.safetensors.index.json")
    w = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    for file in files:
        w.update(read_safetensors(os.path.join(folder, file)))
    return c, w


def inv_freq(c):
    hd = head_dim(c)
    inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    r = c.get("rope_scaling") or {}
    kind = r.get("rope_type", r.get("type", "default"))
    if kind == "linear":
        return inv / r["factor"]
    if kind == "llama3":  # transformers' _compute_llama3_parameters
        factor, low, high = r["factor"], r["low_freq_factor"], r["high_freq_factor"]
        old = r["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        llama = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * llama / factor + smooth * llama
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, llama)
    return inv


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward(c, w, ids):
    b, t = ids.shape
    h, kv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c), c["rms_norm_eps"]
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq(c))
    emb = torch.cat((freqs, freqs), dim=-1)
    dtype = w["model.embed_tokens.weight"].dtype  # float64 for logits, float32 to train
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = j <= i
    window = c.get("sliding_window") if c["model_type"] == "mistral" else None
    if window:
        allowed &= j > i - window  # modeling_mistral: kv_idx > q_idx - sliding_window
    x = w["model.embed_tokens.weight"][ids]
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."

        def proj(z, name):
            y = z @ w[p + name + ".weight"].t()
            return y + w[p + name + ".bias"] if p + name + ".bias" in w else y

        y = rms(x, w[p + "input_layernorm.weight"], eps)
        q = proj(y, "self_attn.q_proj").view(b, t, h, hd)
        k = proj(y, "self_attn.k_proj").view(b, t, kv, hd)
        v = proj(y, "self_attn.v_proj").view(b, t, kv, hd).transpose(1, 2)
        if c["model_type"] == "qwen3":
            q = rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = h // kv  # repeat_kv
        k = k[:, :, None].expand(b, kv, rep, t, hd).reshape(b, h, t, hd)
        v = v[:, :, None].expand(b, kv, rep, t, hd).reshape(b, h, t, hd)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, h * hd)
        x = x + proj(y, "self_attn.o_proj")
        y = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        y = proj(F.silu(proj(y, "mlp.gate_proj")) * proj(y, "mlp.up_proj"), "mlp.down_proj")
        x = x + y
    x = rms(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.t()


def generate(c, w, prompt, new_tokens):
    """Greedy decoding with a key/value cache, as transformers' generate does."""
    h, kv, hd, eps = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c), c["rms_norm_eps"]
    inv = inv_freq(c).float()
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings") else w["lm_head.weight"]
    cache = [None] * c["num_hidden_layers"]
    ids, out = list(prompt), []
    feed, past = torch.tensor([ids]), 0
    for _ in range(new_tokens):
        t = feed.shape[1]
        freqs = torch.outer(torch.arange(past, past + t, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = w["model.embed_tokens.weight"][feed]
        for layer in range(c["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            y = rms(x, w[p + "input_layernorm.weight"], eps)
            q = (y @ w[p + "self_attn.q_proj.weight"].t()).view(1, t, h, hd).transpose(1, 2)
            k = (y @ w[p + "self_attn.k_proj.weight"].t()).view(1, t, kv, hd).transpose(1, 2)
            v = (y @ w[p + "self_attn.v_proj.weight"].t()).view(1, t, kv, hd).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if cache[layer] is not None:
                k = torch.cat((cache[layer][0], k), dim=2)
                v = torch.cat((cache[layer][1], v), dim=2)
            cache[layer] = (k, v)
            rep = h // kv
            kr = k[:, :, None].expand(1, kv, rep, past + t, hd).reshape(1, h, past + t, hd)
            vr = v[:, :, None].expand(1, kv, rep, past + t, hd).reshape(1, h, past + t, hd)
            att = (q @ kr.transpose(-2, -1)) / math.sqrt(hd)
            if t > 1:
                mask = torch.ones(t, past + t, dtype=torch.bool).tril(diagonal=past)
                att = att.masked_fill(~mask, float("-inf"))
            y = (att.softmax(dim=-1) @ vr).transpose(1, 2).reshape(1, t, h * hd)
            x = x + y @ w[p + "self_attn.o_proj.weight"].t()
            y = rms(x, w[p + "post_attention_layernorm.weight"], eps)
            gate, up = y @ w[p + "mlp.gate_proj.weight"].t(), y @ w[p + "mlp.up_proj.weight"].t()
            x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].t()
        logits = rms(x[:, -1], w["model.norm.weight"], eps) @ head.t()
        nxt = int(logits.argmax(dim=-1))
        ids.append(nxt)
        out.append(nxt)
        past += t
        feed = torch.tensor([[nxt]])
    return out


def run_forward(folder, tokens, b, t, out):
    with open(tokens, "rb") as f:
        ids = torch.frombuffer(bytearray(f.read()), dtype=torch.int64).reshape(b, t)
    config, weights = load(folder)
    with torch.no_grad():
        logits = forward(config, weights, ids)
    with open(out, "wb") as f:
        f.write(logits.contiguous().numpy().tobytes())


if __name__ == "__main__":
    if sys.argv[1] == "generate":
        import time
        torch.set_num_threads(1)
        folder, prompt_len, new_tokens, seed = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        config, weights = load(folder)
        weights = {k: v.float() for k, v in weights.items()}
        prompt = torch.randint(0, config["vocab_size"], (prompt_len,), generator=torch.Generator().manual_seed(seed)).tolist()
        with torch.no_grad():
            generate(config, weights, prompt, 2)  # warm-up
            start = time.perf_counter()
            out = generate(config, weights, prompt, new_tokens)
            seconds = time.perf_counter() - start
        print(new_tokens / seconds, " ".join(map(str, prompt)), "|", " ".join(map(str, out)))
        sys.exit(0)
    if sys.argv[1] == "train":
        # Full fine-tuning in float32, PyTorch eager, for bench/llama_train.cc: AdamW (lr
        # 1e-3, no weight decay) on random sequences; prints tokens/s over STEPS steps
        # after one warm-up step.
        import time
        folder, batch, t, steps, threads = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
        torch.set_num_threads(threads)
        config, weights = load(folder)
        w = {k: v.float().requires_grad_(True) for k, v in weights.items()}
        opt = torch.optim.AdamW(list(w.values()), lr=1e-3, weight_decay=0.0)
        data = torch.randint(0, config["vocab_size"], (steps + 1, batch, t + 1), generator=torch.Generator().manual_seed(1))

        def step(ids):
            logits = forward(config, w, ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss.item()

        step(data[0])
        start = time.perf_counter()
        for s in range(1, steps + 1):
            step(data[s])
        print(batch * t * steps / (time.perf_counter() - start))
        sys.exit(0)
    args = sys.argv[2:]
    for i in range(0, len(args), 5):
        a, b, c, d, e = args[i:i + 5]
        if sys.argv[1] == "make":
            make(a, b, c, int(d), int(e))
        else:
            run_forward(a, b, int(c), int(d), e)
