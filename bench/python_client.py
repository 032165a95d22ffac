#!/usr/bin/env python3
"""A Python client's round time against the C++ client's, side by side in one run.

The same federation twice (one client, LeNet-5, the first N Fashion-MNIST training
images, batch 32, one local epoch per round, one LibTorch/PyTorch thread): once with
cleave-client (C++ training), once with the Flower-shaped PyTorch client of
python/examples/quickstart_pytorch.py through cleave.start_client. Prints each run's
mean round wall time (rounds 2.., the first warms up), their ratio, the same for the
time each round spent outside training (the client's protocol: fetch, upload, and for
Python the crossing into fit and back), and the bytes of trained parameters the Python
client's uploads copied between Python and C++.

    PYTHONPATH=python /usr/bin/python3 bench/python_client.py [ROUNDS] [EXAMPLES]
"""

import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ.get("CLEAVE_BIN", os.path.join(HERE, "..", "build", "bin"))
sys.path.insert(0, os.path.join(HERE, "..", "python", "examples"))

JOB = """
run: {{name: bench-python, rounds: {rounds}, seed: 3}}
model: {{name: lenet5}}
data: {{test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 1000}}
clients: {{min: 1, quorum: 1.0, round_deadline_s: 600}}
train: {{local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}}
"""


def start_server(rounds):
    run = tempfile.mkdtemp(prefix="cleave-bench-")
    with open(f"{run}/job.yaml", "w", encoding="utf-8") as f:
        f.write(JOB.format(rounds=rounds))
    log = open(f"{run}/server.out", "w", encoding="utf-8")
    proc = subprocess.Popen([f"{BIN}/cleave-server", "--config", f"{run}/job.yaml", "--insecure", "--listen",
                             "127.0.0.1:0", "--run-dir", f"{run}/run", "--torch-threads", "1"],
                            stdout=log, stderr=subprocess.STDOUT)
    while True:
        m = re.search(r"listening on port (\d+)", open(f"{run}/server.out", encoding="utf-8").read())
        if m:
            return proc, run, f"127.0.0.1:{m.group(1)}"
        if proc.poll() is not None:
            raise RuntimeError(open(f"{run}/server.out", encoding="utf-8").read())
        time.sleep(0.05)


def round_seconds(run):
    import cleave
    rows = [r for r in cleave.read_metrics(f"{run}/run") if not r.get("evaluation_only")]
    walls = [r["wall_s"] for r in rows[1:]]
    return sum(walls) / len(walls), rows[-1]["test_accuracy"]


def mean_after_first(values):
    return sum(values[1:]) / len(values[1:])


def python_client(address, examples):
    import torch
    import cleave
    import quickstart_pytorch as qs
    torch.set_num_threads(1)
    client = qs.client_fn(0, examples)
    fit_seconds = []

    class Timed(qs.FlowerClient):  # no evaluate: the C++ client runs no federated evaluation either
        evaluate = cleave.NumPyClient.evaluate

        def fit(self, parameters, config):
            start = time.perf_counter()
            out = super().fit(parameters, config)
            fit_seconds.append(time.perf_counter() - start)
            return out

    timed = Timed(client.net, client.trainloader, None)
    result = cleave.start_client(server=address, client=timed, num_examples=examples, insecure=True)
    return result, cleave.copied_bytes(), mean_after_first(fit_seconds)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    examples = int(sys.argv[2]) if len(sys.argv) > 2 else 6000
    proc, run, address = start_server(rounds)
    log = subprocess.run([f"{BIN}/cleave-client", "--server", address, "--insecure", "--torch-threads", "1",
                          "--data", f"fmnist:/usr/share/datasets/fashion-mnist,limit={examples}"],
                         check=True, capture_output=True, text=True)
    proc.wait()
    cpp, cpp_acc = round_seconds(run)
    cpp_train = mean_after_first([float(s) for s in re.findall(r"trained \d+ examples in ([0-9.]+)s", log.stdout + log.stderr)])
    proc, run, address = start_server(rounds)
    result, copied, py_fit = python_client(address, examples)
    proc.wait()
    py, py_acc = round_seconds(run)
    print(f"{examples} examples, {rounds} rounds (means of rounds 2-{rounds})")
    print(f"C++ client     {cpp:.3f} s/round, {cpp_train:.3f} s training, {cpp - cpp_train:.3f} s else "
          f"(accuracy {cpp_acc:.4f})")
    print(f"Python client  {py:.3f} s/round, {py_fit:.3f} s in fit,      {py - py_fit:.3f} s else "
          f"(accuracy {py_acc:.4f}; {result['tasks_completed']} tasks)")
    print(f"ratio Python / C++: round {py / cpp:.3f}, outside training {(py - py_fit) / (cpp - cpp_train):.3f}")
    print(f"trained-parameter bytes copied between Python and C++: {copied}")


if __name__ == "__main__":
    main()
