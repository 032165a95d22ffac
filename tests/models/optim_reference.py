# PyTorch's own optimizers, clipping, label smoothing and learning-rate schedulers on the
# inputs tests/models/optim_test.cc gives cleave, for it to compare against.
#   train OUT_MODEL OUT_WEIGHTS OPTIMIZER LR MOMENTUM NESTEROV WEIGHT_DECAY CLIP SMOOTHING STEPS
#         LOSS CLASSES
#     saves the initial model (TorchScript) and writes the weights after STEPS full-batch
#     steps on the data below, one number per line, then the trained model's metrics on
#     that data (scikit-learn's), "name value" per line, to OUT_WEIGHTS.metrics. LOSS
#     ts_focal or ts_huber: a scripted loss, saved to OUT_MODEL.loss.pt
#   schedule OUT KIND LR ROUNDS WARMUP STEP_ROUNDS GAMMA LR_MIN
#     writes the learning rate of rounds 1..ROUNDS
import math
import sys

import torch
import torch.nn as nn

from sklearn import metrics

N, FEATURES = 32, 20


def data(classes):
    """x[i][j] = sin(0.37 i + 1.3 j); labels i mod classes (bce: mod 2); targets 3 sin(0.5 i)."""
    x = torch.tensor([[math.sin(0.37 * i + 1.3 * j) for j in range(FEATURES)] for i in range(N)],
                     dtype=torch.float32)
    y = torch.tensor([i % max(classes, 2) for i in range(N)])
    t = torch.tensor([3 * math.sin(0.5 * i) for i in range(N)], dtype=torch.float32)
    return x, y, t


class FocalLoss(nn.Module):
    """Lin et al.'s focal loss (gamma 2) on class labels."""

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logp = torch.log_softmax(output, 1).gather(1, target.unsqueeze(1)).squeeze(1)
        return (-((1 - logp.exp()) ** 2) * logp).mean()


class HuberLoss(nn.Module):
    """Huber's loss (delta 1) on regression targets."""

    def forward(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.huber_loss(output.reshape(-1), target)


SCRIPTED = {"ts_focal": FocalLoss, "ts_huber": HuberLoss}


def loss_of(loss, out, y, t, smoothing):
    f = nn.functional
    if loss == "ts_focal":
        return FocalLoss()(out, y)
    if loss == "ts_huber":
        return HuberLoss()(out, t)
    if loss == "bce":
        return f.binary_cross_entropy_with_logits(out.reshape(-1), y.float())
    if loss == "mse":
        return f.mse_loss(out.reshape(-1), t)
    if loss == "mae":
        return f.l1_loss(out.reshape(-1), t)
    return f.cross_entropy(out, y, label_smoothing=smoothing)


def metrics_of(loss, out, y, t):
    if loss in ("mse", "mae", "ts_huber"):
        pred = out.reshape(-1).numpy()
        return {"mae": metrics.mean_absolute_error(t.numpy(), pred),
                "rmse": math.sqrt(metrics.mean_squared_error(t.numpy(), pred))}
    if loss == "bce":
        pred = (out.reshape(-1) > 0).long().numpy()
        return {"accuracy": metrics.accuracy_score(y.numpy(), pred),
                "precision": metrics.precision_score(y.numpy(), pred, zero_division=0),
                "recall": metrics.recall_score(y.numpy(), pred, zero_division=0),
                "f1": metrics.f1_score(y.numpy(), pred, zero_division=0)}
    classes = out.shape[1]
    result = {"accuracy": metrics.accuracy_score(y.numpy(), out.argmax(1).numpy())}
    if classes >= 5:
        result["top5_accuracy"] = metrics.top_k_accuracy_score(y.numpy(), out.numpy(), k=5,
                                                              labels=list(range(classes)))
    return result


def train(out_model, out_weights, optimizer, lr, momentum, nesterov, wd, clip, smoothing, steps,
          loss, classes):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, classes))
    torch.jit.script(model).save(out_model)
    if loss in SCRIPTED:
        torch.jit.script(SCRIPTED[loss]()).save(out_model + ".loss.pt")
    params = list(model.parameters())
    if optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    elif optimizer == "adam":
        opt = torch.optim.Adam(params, lr=lr, weight_decay=wd)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    x, y, t = data(classes)
    for _ in range(steps):
        opt.zero_grad()
        loss_of(loss, model(x), y, t, smoothing).backward()
        if clip > 0:
            nn.utils.clip_grad_norm_(params, clip)
        opt.step()
    with open(out_weights, "w") as f:
        for p in params:
            for v in p.detach().flatten().tolist():
                f.write(repr(v) + "\n")
    with torch.no_grad():
        out = model(x)
        found = metrics_of(loss, out, y, t)
        found["loss"] = loss_of(loss, out, y, t, 0.0).item()
    with open(out_weights + ".metrics", "w") as f:
        for k, v in found.items():
            f.write("%s %r\n" % (k, float(v)))


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
              float(a[10]), int(a[11]), a[12], int(a[13]))
    else:
        schedule(a[2], a[3], float(a[4]), int(a[5]), int(a[6]), int(a[7]), float(a[8]), float(a[9]))
