"""A client written as Flower's PyTorch quickstart writes one (flwr 1.x): a NumPyClient
subclass whose fit returns the example count, started by start_numpy_client or by
start_client with to_client(), weights through flwr.common's conversions. Two changes
make it a cleave client, marked below: the import, and insecure=True on the start lines
(Flower's start functions default to plaintext; cleave's to TLS). Fashion-MNIST stands
in for CIFAR-10 (no download here), and the model is LeNet-5 as cleave's lenet5."""

from collections import OrderedDict
import gzip

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import cleave as fl  # CHANGED: was `import flwr as fl`

DEVICE = torch.device("cpu")
FMNIST = "/usr/share/datasets/fashion-mnist"


class Net(nn.Module):
    def __init__(self) -> None:
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 4 * 4)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def train(net, trainloader, epochs):
    """Train the model on the training set."""
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            criterion(net(images.to(DEVICE)), labels.to(DEVICE)).backward()
            optimizer.step()


def test(net, testloader):
    """Validate the model on the test set."""
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images.to(DEVICE))
            loss += criterion(outputs, labels.to(DEVICE)).item()
            correct += (torch.max(outputs.data, 1)[1] == labels).sum().item()
    return loss / len(testloader.dataset), correct / len(testloader.dataset)


def load_data(partition, examples):
    """Partition `partition` of Fashion-MNIST: `examples` training images, a tenth as many
    test images (standardised as cleave's fmnist source does, so the server's own
    evaluation sees what this model trains on)."""
    def read(split, start, count):
        with gzip.open(f"{FMNIST}/{split}-images-idx3-ubyte.gz") as f:
            x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)[start:start + count]
        with gzip.open(f"{FMNIST}/{split}-labels-idx1-ubyte.gz") as f:
            y = np.frombuffer(f.read(), np.uint8, offset=8)[start:start + count]
        x = (x.astype(np.float32) / 255.0 - 0.2860) / 0.3530
        return TensorDataset(torch.from_numpy(x), torch.from_numpy(y.astype(np.int64)))

    return (DataLoader(read("train", partition * examples, examples), batch_size=32, shuffle=True),
            DataLoader(read("t10k", partition * examples // 10, examples // 10)))


class FlowerClient(fl.client.NumPyClient):
    def __init__(self, net, trainloader, testloader):
        self.net, self.trainloader, self.testloader = net, trainloader, testloader

    def get_parameters(self, config):
        return [val.cpu().numpy() for _, val in self.net.state_dict().items()]

    def set_parameters(self, parameters):
        # Through Flower's wire form and back, as strategies see parameters.
        parameters = fl.common.parameters_to_ndarrays(fl.common.ndarrays_to_parameters(parameters))
        params_dict = zip(self.net.state_dict().keys(), parameters)
        state_dict = OrderedDict({k: torch.tensor(v) for k, v in params_dict})
        self.net.load_state_dict(state_dict, strict=True)

    def fit(self, parameters, config):
        self.set_parameters(parameters)
        train(self.net, self.trainloader, epochs=1)
        return self.get_parameters(config={}), len(self.trainloader.dataset), {}

    def evaluate(self, parameters, config):
        self.set_parameters(parameters)
        loss, accuracy = test(self.net, self.testloader)
        return float(loss), len(self.testloader.dataset), {"accuracy": float(accuracy)}


def main(server_address, partition, examples, numpy_client=True):
    torch.manual_seed(partition)
    trainloader, testloader = load_data(partition, examples)
    client = FlowerClient(Net().to(DEVICE), trainloader, testloader)
    if numpy_client:  # CHANGED below: insecure=True
        return fl.client.start_numpy_client(server_address=server_address, client=client, insecure=True)
    return fl.client.start_client(server_address=server_address, client=client.to_client(), insecure=True)
