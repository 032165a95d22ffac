"""Quickstart: a PyTorch CNN on Fashion-MNIST with a Flower-shaped client.

The client class below is written against Flower's documented NumPyClient API
(get_parameters / fit / evaluate, weights as lists of NumPy arrays); only the last line,
cleave.start_client, is cleave's. Run a server with model lenet5 (the same layers as
Net), e.g. deploy/examples/python-quickstart.yaml, then one process per client:

    cleave-server --config deploy/examples/python-quickstart.yaml --insecure &
    PYTHONPATH=python /usr/bin/python3 python/examples/quickstart_pytorch.py --server 127.0.0.1:7070 --partition 0
"""

import argparse
import gzip
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

try:  # Flower's base class when Flower is installed; cleave's, of the same shape, when not
    from flwr.client import NumPyClient
except ImportError:
    from cleave import NumPyClient

FMNIST = "/usr/share/datasets/fashion-mnist"


class Net(nn.Module):
    """LeNet-5 as cleave's model lenet5 builds it (same tensors, same order)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def load_fmnist(split, start, count):
    """`count` images (N, 1, 28, 28) and labels of Fashion-MNIST's `split` ("train" or
    "t10k") from index `start`, standardised as cleave's fmnist source does (the
    training set's mean 0.2860 and deviation 0.3530), so that the server's evaluation and
    C++ clients see the inputs this model trains on."""
    with gzip.open(f"{FMNIST}/{split}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{FMNIST}/{split}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    x = torch.from_numpy((images[start:start + count].astype(np.float32) / 255.0 - 0.2860) / 0.3530)
    y = torch.from_numpy(labels[start:start + count].astype(np.int64))
    return torch.utils.data.TensorDataset(x, y)


def train(net, loader, epochs, lr):
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    total = 0.0
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(y)
    return total / (epochs * len(loader.dataset))


def test(net, loader):
    net.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            out = net(x)
            loss += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
    return loss / len(loader.dataset), correct / len(loader.dataset)


def get_weights(net):
    return [val.cpu().numpy() for _, val in net.state_dict().items()]


def set_weights(net, parameters):
    params_dict = zip(net.state_dict().keys(), parameters)
    net.load_state_dict(OrderedDict({k: torch.tensor(v) for k, v in params_dict}), strict=True)


class FlowerClient(NumPyClient):
    def __init__(self, net, trainloader, valloader, local_epochs=1, lr=0.05):
        self.net, self.trainloader, self.valloader = net, trainloader, valloader
        self.local_epochs, self.lr = local_epochs, lr

    def get_parameters(self, config):
        return get_weights(self.net)

    def fit(self, parameters, config):
        set_weights(self.net, parameters)
        train_loss = train(self.net, self.trainloader, config.get("local_epochs", self.local_epochs),
                           config.get("lr", self.lr))
        return get_weights(self.net), len(self.trainloader.dataset), {"train_loss": train_loss}

    def evaluate(self, parameters, config):
        set_weights(self.net, parameters)
        loss, accuracy = test(self.net, self.valloader)
        return loss, len(self.valloader.dataset), {"accuracy": accuracy}


def client_fn(partition, examples=2000, batch_size=32):
    """Client `partition`'s model and data: `examples` training images of its own and
    a tenth as many held out."""
    torch.manual_seed(partition)
    train_set = load_fmnist("train", partition * examples, examples)
    val_set = load_fmnist("t10k", partition * examples // 10, examples // 10)
    return FlowerClient(Net(), torch.utils.data.DataLoader(train_set, batch_size=batch_size, shuffle=True),
                        torch.utils.data.DataLoader(val_set, batch_size=256))


if __name__ == "__main__":
    import cleave

    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default="127.0.0.1:7070")
    parser.add_argument("--partition", type=int, default=0)
    parser.add_argument("--examples", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cleave.start_client(server=args.server, client=client_fn(args.partition, args.examples).to_client(),
                        num_examples=args.examples, insecure=True, name=f"python-{args.partition}")
