# PyTorch's own optimizers, clipping, label smoothing and learning-rate schedulers on the
# inputs tests/models/optim_test.cc gives cleave, for it to compare against.
#   train OUT_MODEL OUT_WEIGHTS OPTIMIZER LR MOMENTUM NESTEROV WEIGHT_DECAY CLIP SMOOTHING STEPS
#     saves the initial model (TorchScript) and writes the weights after STEPS full-batch
#     steps on the data below, one number per line
#   schedule OUT KIND LR ROUNDS WARMUP STEP_ROUNDS GAMMA LR_MIN
#     writes the learning rate of rounds 1..ROUNDS
import math
import sys

import torch
import torch.nn as nn

N, FEATURES, CLASSES = 32, 20, 3


def data():
    x = torch.tensor([[math.sin(0.37 * i + 1.3 * j) for j in range(FEATURES)] for i in range(N)],
                     dtype=torch.float32)
    y = torch.tensor([i % CLASSES for i in range(N)])
    return x, y


def train(out_model, out_weights, optimizer, lr, momentum, nesterov, wd, clip, smoothing, steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, CLASSES))
    torch.jit.script(model).save(out_model)
    params = list(model.parameters())
    if optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    elif optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr, weight_decay=wd)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    x, y = data()
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y, label_smoothing=smoothing)
        loss.backward()
        if clip > 0:
            nn.utils.clip_grad_norm_(params, clip)
        opt.step()
    with open(out_weights, "w") as f:
        for p in params:
            for v in p.detach().flatten().tolist():
                f.write(repr(v) + "\n")


def schedule(out, kind, lr, rounds, warmup, step_rounds, gamma, lr_min):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    after = []
    if kind == "step":
        after = [torch.optim.lr_scheduler.StepLR(opt, step_rounds, gamma)]
    elif kind == "cosine":
        after = [torch.optim.lr_scheduler.CosineAnnealingLR(opt, rounds - warmup, lr_min)]
    else:
        after = [torch.optim.lr_scheduler.ConstantLR(opt, 1.0, 1)]
    sched = after[0]
    if warmup > 0:
        warm = torch.optim.lr_scheduler.LinearLR(opt, 1.0 / warmup, 1.0, warmup - 1)
        sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, after[0]], [warmup])
    with open(out, "w") as f:
        for _ in range(rounds):
            f.write(repr(opt.param_groups[0]["lr"]) + "\n")
            opt.step()
            sched.step()


if __name__ == "__main__":
    a = sys.argv
    if a[1] == "train":
        train(a[2], a[3], a[4], float(a[5]), float(a[6]), a[7] == "1", float(a[8]), float(a[9]),
              float(a[10]), int(a[11]))
    else:
        schedule(a[2], a[3], float(a[4]), int(a[5]), int(a[6]), int(a[7]), float(a[8]), float(a[9]))
