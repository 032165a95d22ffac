"""The PyTorch side of bench_gpt_throughput: the same GPT-2-style decoder as cleave's
built-in `gpt` (models/gpt.h: pre-norm blocks, causal attention, tanh-GELU MLP, GPT-2's
Conv1D weights [in, out]), trained with torch.optim.AdamW on next-token cross-entropy,
one thread, on random token ids (throughput does not depend on their values).
   gpt_reference.py SEQUENCES STEPS BATCH CONTEXT LAYERS HEADS DIM VOCAB
prints: tokens/s mean-loss"""
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
n, steps, batch, t, layers, heads, dim, vocab = map(int, sys.argv[1:9])


class Conv1D(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cin, cout) * 0.02)
        self.bias = nn.Parameter(torch.zeros(cout))

    def forward(self, x):
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(
            *x.shape[:-1], self.weight.shape[1])


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.attn_proj = Conv1D(dim, 3 * dim), Conv1D(dim, dim)
        self.c_fc, self.mlp_proj = Conv1D(dim, 4 * dim), Conv1D(4 * dim, dim)
        self.register_buffer("mask", torch.full((t, t), float("-inf")).triu(1), persistent=False)

    def forward(self, x):
        b, tt, d = x.shape
        hd = d // heads
        qkv = self.c_attn(self.ln_1(x)).view(b, tt, 3, heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax((q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd)) + self.mask[:tt, :tt], -1)
        x = x + self.attn_proj((att @ v).transpose(1, 2).reshape(b, tt, d))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(t, dim)
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Parameter(torch.randn(vocab, dim) * 0.02)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.head.t()


torch.manual_seed(0)
data = torch.randint(0, vocab, (n, t + 1))
model = Gpt()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
model.train()
done, total, start = 0, 0.0, time.perf_counter()
while done < steps:
    perm = torch.randperm(n)
    xs, ys = data[perm, :-1], data[perm, 1:]
    for b in range(0, n, batch):
        if done == steps:
            break
        logits = model(xs[b:b + batch])
        loss = F.cross_entropy(logits.reshape(-1, vocab), ys[b:b + batch].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()
        done += 1
elapsed = time.perf_counter() - start
print(f"{steps * batch * t / elapsed:.1f} {total / steps:.4f}")
