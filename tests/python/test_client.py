"""The Python package against a real cleave-server: a Flower-shaped PyTorch client
learns, its uploads are read without a copy, a bad fit fails its task and the client goes
on, and run_local runs a federation of processes. Run by ctest (tests/CMakeLists.txt)."""

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "examples"))

import cleave  # noqa: E402
import quickstart_pytorch as qs  # noqa: E402

JOB = """
run: {{name: {name}, rounds: {rounds}, seed: 3}}
model: {{name: lenet5}}
data: {{test: "fmnist:/usr/share/datasets/fashion-mnist", test_limit: 1000}}
clients: {{min: {clients}, quorum: {quorum}, round_deadline_s: 120}}
train: {{local_epochs: 1, batch_size: 32, lr: 0.05, momentum: 0.9}}
server: {{heartbeat_s: 0.5, client_timeout_s: 30}}
"""


class Server:
    """cleave-server on a loopback port of its own, plaintext, in a temporary run dir."""

    def __init__(self, job):
        self.dir = tempfile.mkdtemp(prefix="cleave-pytest-")
        config = os.path.join(self.dir, "job.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(job)
        self.log = os.path.join(self.dir, "server.out")
        with open(self.log, "w", encoding="utf-8") as out:
            self.proc = subprocess.Popen([cleave.local._server_binary(), "--config", config, "--insecure",
                                          "--listen", "127.0.0.1:0", "--run-dir", os.path.join(self.dir, "run")],
                                         stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"listening on port (\d+)", self.output())
            if m:
                self.address = f"127.0.0.1:{m.group(1)}"
                return
            time.sleep(0.05)
        raise RuntimeError("no server:\n" + self.output())

    def output(self):
        with open(self.log, encoding="utf-8") as f:
            return f.read()

    def wait(self):
        code = self.proc.wait(timeout=300)
        return code, cleave.read_metrics(os.path.join(self.dir, "run"))


def run_clients(address, clients, examples):
    """Runs each client in a thread of this process (start_client releases the GIL)."""
    results = [None] * len(clients)

    def run(i):
        try:
            results[i] = cleave.start_client(server=address, client=clients[i], num_examples=examples,
                                             insecure=True, name=f"py-{i}", give_up_after_s=60)
        except Exception as e:  # the test reports it
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


class FlowerShapedClientTest(unittest.TestCase):
    def test_learns_and_its_uploads_are_read_in_place(self):
        torch.set_num_threads(1)
        server = Server(JOB.format(name="py-learns", rounds=3, clients=2, quorum=1.0))
        before = cleave.copied_bytes()
        results = run_clients(server.address, [qs.client_fn(i, 1000).to_client() for i in range(2)], 1000)
        code, rows = server.wait()
        self.assertEqual(code, 0, server.output()[-3000:])
        for r in results:
            self.assertIsInstance(r, dict, r)
            self.assertEqual(r["tasks_failed"], 0)
            self.assertGreaterEqual(r["tasks_completed"], 3)
        training = [r for r in rows if not r.get("evaluation_only")]
        self.assertEqual(len(training), 3)
        self.assertTrue(all(r["participants"] == 2 for r in training), training)
        # The server evaluates with its own (C++) LeNet-5: the Python model is the same one.
        self.assertGreater(training[-1]["test_accuracy"], 0.55, "0.1 at the start")
        # Federated evaluation: the clients' evaluate measured the model before each round.
        self.assertEqual(training[-1]["client_eval"]["clients"], 2)
        # float32 arrays in C order were read where they were: nothing copied.
        self.assertEqual(cleave.copied_bytes(), before)


class Misbehaving(qs.FlowerClient):
    """A client whose fit goes wrong in its first four rounds, each a different way."""

    def fit(self, parameters, config):
        params, n, metrics = super().fit(parameters, config)
        r = config["server_round"]
        if r == 1:
            raise ValueError("boom in round 1")
        if r == 2:
            return [p.astype(np.float64) for p in params], n, metrics
        if r == 3:
            return params[:-1] + [np.zeros(3, np.float32)], n, metrics
        if r == 4:
            params[0] = params[0].copy()
            params[0].flat[0] = np.nan
            return params, n, metrics
        # A Fortran-ordered array is accepted, made contiguous once (and counted).
        return [np.asfortranarray(p) for p in params], n, metrics


class BadFitTest(unittest.TestCase):
    def test_fails_the_task_with_the_python_error_and_goes_on(self):
        torch.set_num_threads(1)
        server = Server(JOB.format(name="py-bad", rounds=5, clients=2, quorum=0.5))
        before = cleave.copied_bytes()
        good, bad = qs.client_fn(0, 300), Misbehaving(*_parts(qs.client_fn(1, 300)))
        results = run_clients(server.address, [good, bad], 300)
        code, rows = server.wait()
        self.assertEqual(code, 0, server.output()[-3000:])
        self.assertEqual(results[1]["tasks_failed"], 4, results)
        self.assertGreaterEqual(results[1]["tasks_completed"], 1, results)
        training = [r for r in rows if not r.get("evaluation_only")]
        self.assertEqual([r["participants"] for r in training], [1, 1, 1, 1, 2])
        log = server.output()
        for why in ["fit raised ValueError: boom in round 1", "parameter 0 is float64", "[3]", "finite"]:
            self.assertIn(why, log)
        self.assertGreater(cleave.copied_bytes(), before, "the Fortran-ordered arrays were copied")


def _parts(client):
    return client.net, client.trainloader, client.valloader


class RunLocalTest(unittest.TestCase):
    def test_a_federation_of_processes(self):
        rows = cleave.run_local(JOB.format(name="py-local", rounds=1, clients=2, quorum=1.0),
                                clients=lambda i: qs.client_fn(i, 300), num_clients=2, num_examples=300)
        training = [r for r in rows if not r.get("evaluation_only")]
        self.assertEqual(len(training), 1)
        self.assertEqual(training[0]["participants"], 2)


if __name__ == "__main__":
    unittest.main()
