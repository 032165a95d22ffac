"""The PyTorch side of bench_train_throughput: the same LeNet-5 loop, one thread.
   train_reference.py N EPOCHS BATCH [eval]: with `eval`, EPOCHS passes of evaluation
   (no_grad, loss and accuracy) in batches of BATCH instead of training."""
import sys, time, gzip, struct
import torch
import torch.nn as nn

torch.set_num_threads(1)
n, epochs, batch = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
with gzip.open("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz") as f:
    f.read(16)
    x = torch.frombuffer(bytearray(f.read(n * 784)), dtype=torch.uint8).view(n, 1, 28, 28)
with gzip.open("/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz") as f:
    f.read(8)
    y = torch.frombuffer(bytearray(f.read(n)), dtype=torch.uint8).long()
x = (x.float() / 255 - 0.2860) / 0.3530
torch.manual_seed(0)
model = nn.Sequential(
    nn.Sequential(nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2)),
    nn.Sequential(nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2)),
    nn.Sequential(nn.Flatten(), nn.Linear(256, 120), nn.ReLU()),
    nn.Sequential(nn.Linear(120, 84), nn.ReLU()),
    nn.Sequential(nn.Linear(84, 10)))
if len(sys.argv) > 4 and sys.argv[4] == "eval":
    model.eval()
    start = time.perf_counter()
    with torch.no_grad():
        for _ in range(epochs):
            total, correct = 0.0, 0
            for b in range(0, n, batch):
                out = model(x[b:b + batch])
                total += nn.functional.cross_entropy(out, y[b:b + batch], reduction="sum").item()
                correct += (out.argmax(1) == y[b:b + batch]).sum().item()
    elapsed = time.perf_counter() - start
    print(f"{n * epochs / elapsed:.1f} {total / n:.4f}")
    sys.exit(0)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-5)
model.train()
start = time.perf_counter()
for _ in range(epochs):
    perm = torch.randperm(n)
    total = 0.0
    for b in range(0, n, batch):
        idx = perm[b:b + batch]
        xb, yb = x.index_select(0, idx), y.index_select(0, idx)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        total += loss.item() * idx.numel()
        loss.backward()
        opt.step()
elapsed = time.perf_counter() - start
print(f"{n * epochs / elapsed:.1f} {total / n:.4f}")
