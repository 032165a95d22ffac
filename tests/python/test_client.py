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

    def __init__(self, job, insecure=True):  # insecure=False: the job's tls section
        self.dir = tempfile.mkdtemp(prefix="cleave-pytest-")
        config = os.path.join(self.dir, "job.yaml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(job)
        self.log = os.path.join(self.dir, "server.out")
        with open(self.log, "w", encoding="utf-8") as out:
            self.proc = subprocess.Popen([cleave.local._server_binary(), "--config", config]
                                         + (["--insecure"] if insecure else [])
                                         + ["--listen", "127.0.0.1:0", "--run-dir", os.path.join(self.dir, "run")],
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


def in_threads(n, run):
    """run(i) for i < n, each in a thread of this process (the clients release the GIL
    while not in Python); their results, or the exceptions they raised."""
    results = [None] * n

    def one(i):
        try:
            results[i] = run(i)
        except Exception as e:  # the test reports it
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return results


def run_clients(address, clients, examples, tls=None):
    """Runs each client through start_client in a thread; with `tls` (a `cleave certs`
    folder) over mutual TLS with its certificates."""

    def run(i):
        name = f"py-{i}"
        how = {"insecure": True} if tls is None else {
            "ca": f"{tls}/ca.crt", "cert": f"{tls}/clients/{name}.crt", "key": f"{tls}/clients/{name}.key"}
        return cleave.start_client(server=address, client=clients[i], num_examples=examples, name=name,
                                   give_up_after_s=60, **how)

    return in_threads(len(clients), run)


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


class FlowerCodeTest(unittest.TestCase):
    """Flower's quickstart client (flower_quickstart.py), its import and start line changed."""

    def test_runs_unchanged_and_learns_weighting_by_the_count_fit_returns(self):
        import flower_quickstart
        torch.set_num_threads(1)
        server = Server(JOB.format(name="py-flower", rounds=3, clients=2, quorum=1.0))
        results = in_threads(2, lambda i: flower_quickstart.main(server.address, i, [1000, 500][i], numpy_client=i == 0))
        code, rows = server.wait()
        self.assertEqual(code, 0, server.output()[-3000:])
        for r in results:
            self.assertIsInstance(r, dict, r)
            self.assertEqual(r["tasks_failed"], 0)
        training = [r for r in rows if not r.get("evaluation_only")]
        self.assertEqual(len(training), 3)
        # No count is declared: round 1 knows none, and every update weighs 1; from then on
        # each weighs what its fit returned (under the cap of 3x the median of 1000 and 500).
        self.assertEqual([r["examples"] for r in training], [2, 1500, 1500])
        self.assertGreater(training[-1]["test_accuracy"], 0.4, "0.1 at the start")
        self.assertEqual(training[-1]["client_eval"]["clients"], 2)
        self.assertEqual(training[-1]["client_eval"]["examples"], 150)

    def test_common_conversions_round_trip_as_flowers(self):
        arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7], dtype=np.int64)]
        p = cleave.common.ndarrays_to_parameters(arrays)
        self.assertEqual(p.tensor_type, "numpy.ndarray")
        self.assertTrue(p.tensors[0].startswith(b"\x93NUMPY"))  # NumPy's .npy format, as Flower writes
        back = cleave.common.parameters_to_ndarrays(p)
        for a, b in zip(arrays, back):
            np.testing.assert_array_equal(a, b)
            self.assertEqual(a.dtype, b.dtype)

    def test_get_properties_answers_with_the_devices_profile(self):
        import flower_quickstart
        props = flower_quickstart.FlowerClient(None, None, None).get_properties({})
        self.assertEqual(props["cpu_cores"], os.cpu_count())
        self.assertEqual(props["platform"], "linux")
        self.assertGreater(props["memory_bytes"], 0)

    def test_a_declared_count_must_be_positive(self):
        with self.assertRaisesRegex(ValueError, "num_examples must be positive"):
            cleave.start_client(server="127.0.0.1:1", client=Offset(0.1, 10), num_examples=0, insecure=True)


class MixedTest(unittest.TestCase):
    def test_python_and_cpp_clients_train_one_model(self):
        torch.set_num_threads(1)
        server = Server(JOB.format(name="py-mixed", rounds=3, clients=2, quorum=1.0))
        cpp = subprocess.Popen([os.path.join(os.path.dirname(cleave.local._server_binary()), "cleave-client"),
                                "--server", server.address, "--insecure", "--name", "cpp-0",
                                "--data", "fmnist:/usr/share/datasets/fashion-mnist,limit=1000"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        results = run_clients(server.address, [qs.client_fn(1, 1000)], 1000)
        code, rows = server.wait()
        self.assertEqual(cpp.wait(timeout=60), 0)
        self.assertEqual(code, 0, server.output()[-3000:])
        self.assertEqual(results[0]["tasks_failed"], 0, results)
        training = [r for r in rows if not r.get("evaluation_only")]
        self.assertEqual([r["participants"] for r in training], [2, 2, 2])
        self.assertGreater(training[-1]["test_accuracy"], 0.55, "0.1 at the start")


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


class WireTest(unittest.TestCase):
    """What the C++ client does on the wire, a Python client does: mutual TLS and secure
    aggregation; distributed DP; an update codec with error feedback."""

    def run_plain(self, job, n):
        """`n` quickstart clients of 300 examples in plaintext, all of whose tasks succeed;
        the run's training rounds."""
        torch.set_num_threads(1)
        server = Server(job)
        results = run_clients(server.address, [qs.client_fn(i, 300) for i in range(n)], 300)
        code, rows = server.wait()
        self.assertEqual(code, 0, server.output()[-3000:])
        self.assertTrue(all(isinstance(r, dict) and r["tasks_failed"] == 0 for r in results), results)
        return [r for r in rows if not r.get("evaluation_only")]

    def test_mutual_tls_and_secure_aggregation(self):
        torch.set_num_threads(1)
        job = JOB.format(name="py-secure", rounds=3, clients=3, quorum=1.0) + """
tls: {cert: "FED/server.crt", key: "FED/server.key", ca: "FED/ca.crt", mutual: true}
secure_aggregation: {k: 2, t: 2, clip: 1.0, bits: 16}
"""
        cli = os.path.join(os.path.dirname(cleave.local._server_binary()), "cleave")
        fed = os.path.join(tempfile.mkdtemp(prefix="cleave-pytest-"), "fed")
        subprocess.run([cli, "certs", "init", fed], check=True, capture_output=True)
        for i in range(3):
            subprocess.run([cli, "certs", "issue", fed, f"py-{i}"], check=True, capture_output=True)
        server = Server(job.replace("FED", fed), insecure=False)
        with self.assertRaisesRegex(ValueError, "insecure=True"):
            cleave.start_client(server=server.address, client=qs.client_fn(0, 10), num_examples=10)
        results = run_clients(server.address, [qs.client_fn(i, 300) for i in range(3)], 300, tls=fed)
        code, rows = server.wait()
        self.assertEqual(code, 0, server.output()[-3000:])
        self.assertTrue(all(isinstance(r, dict) and r["tasks_failed"] == 0 for r in results), results)
        training = [r for r in rows if not r.get("evaluation_only")]
        self.assertEqual([r["participants"] for r in training], [3, 3, 3])
        self.assertIn("secure aggregation: unmasked the sum of 3 updates", server.output())
        accuracy = [r["test_accuracy"] for r in training]
        self.assertGreater(accuracy[-1], max(0.3, accuracy[0]), accuracy)

    def test_distributed_dp_noise_under_secure_aggregation(self):
        # Each Python client's update is clipped and takes its share of the noise in C++
        # before masking; the server accounts the privacy spent.
        training = self.run_plain(JOB.format(name="py-dp", rounds=2, clients=3, quorum=1.0) + (
            "secure_aggregation: {k: 2, t: 2, clip: 1.0, bits: 16}\n"
            "dp: {noise: distributed, noise_multiplier: 0.5, clip: 0.5}\n"), 3)
        self.assertEqual([r["participants"] for r in training], [3, 3])
        self.assertGreater(training[-1]["epsilon"], training[0]["epsilon"], training)

    def test_an_update_codec_with_error_feedback(self):
        training = self.run_plain(
            JOB.format(name="py-topk", rounds=2, clients=2, quorum=1.0) + "compression: {update: \"topk:0.1\"}\n", 2)
        # top-k 10 %: index and value per kept entry, about a fifth of float32's bytes
        dense = 2 * 4 * sum(p.numel() for p in qs.Net().parameters())
        self.assertLess(training[0]["update_bytes"], dense / 3, training[0])


class Offset(cleave.NumPyClient):
    """Trains nothing: returns the global model plus its own offset, and keeps what it got."""

    def __init__(self, offset, examples):
        self.offset, self.examples, self.seen, self.sent = offset, examples, [], {}

    def fit(self, parameters, config):
        # The global model's own values, lent read-only (not copies).
        assert not any(p.flags.writeable for p in parameters)
        self.seen.append((config["server_round"], config["lr"], [p.copy() for p in parameters]))
        self.sent[config["server_round"]] = [p + np.float32(self.offset) for p in parameters]
        return self.sent[config["server_round"]], self.examples, {"loss": self.offset}

    def evaluate(self, parameters, config):
        return 1.0 + self.offset, 10, {"accuracy": 0.5}


class Median(cleave.Strategy):
    """The element-wise median of the clients' models, with a learning rate per round."""

    def __init__(self):
        self.calls = []

    def configure_fit(self, server_round, clients):
        return [(c, {"lr": 0.25 * server_round}) for c in clients]

    def aggregate_fit(self, server_round, results, failures):
        self.calls.append((server_round, sorted(r.num_examples for _, r in results), len(failures)))
        per_tensor = zip(*[r.parameters for _, r in results])
        return [np.median(np.stack(ps), axis=0).astype(np.float32) for ps in per_tensor], {"clients": len(results)}

    def aggregate_evaluate(self, server_round, results, failures):
        return 42.0, {"accuracy": 0.75}

    def evaluate(self, server_round, parameters):
        return float(sum(np.abs(p).sum() for p in parameters)), {"tensors": len(parameters)}


class StrategyRuns(unittest.TestCase):
    """Runs a strategy in Python on the C++ coordinator in this process."""

    def run_server(self, strategy, clients, rounds=2, run_dir=None):
        run_dir = run_dir or tempfile.mkdtemp(prefix="cleave-pytest-")
        threads = []

        def serve(port):  # the clients, once the server listens
            for i, c in enumerate(clients):
                threads.append(threading.Thread(target=cleave.start_client, kwargs=dict(
                    server=f"127.0.0.1:{port}", client=c, num_examples=c.examples, insecure=True, name=f"py-{i}",
                    give_up_after_s=30)))
                threads[-1].start()

        try:
            committed = cleave.start_server(JOB.format(name="py-strategy", rounds=rounds, clients=len(clients),
                                                       quorum=1.0), strategy=strategy, insecure=True,
                                            run_dir=run_dir, on_listen=serve)
        finally:
            for t in threads:
                t.join(timeout=60)
        return committed, cleave.read_metrics(run_dir)


class StrategyTest(StrategyRuns):
    """A strategy in Python on the C++ coordinator in this process."""

    def test_the_strategy_decides_and_the_coordinator_does_the_rest(self):
        clients = [Offset(0.1, 100), Offset(0.2, 200), Offset(0.9, 300)]
        strategy = Median()
        committed, rows = self.run_server(strategy, clients)
        self.assertEqual(committed, 2)
        self.assertEqual(strategy.calls, [(1, [100, 200, 300], 0), (2, [100, 200, 300], 0)])
        for c in clients:
            self.assertEqual([(r, lr) for r, lr, _ in c.seen], [(1, 0.25), (2, 0.5)])
            # Round 2's model is exactly the median client's round-1 model.
            for got, median in zip(c.seen[1][2], clients[1].sent[1]):
                np.testing.assert_array_equal(got, median)
        training = [r for r in rows if not r.get("evaluation_only")]
        self.assertEqual(training[0]["fit_clients"], 3)
        self.assertEqual(training[0]["evaluate_tensors"], 10)
        self.assertGreater(training[0]["evaluate_loss"], 0)
        self.assertEqual(training[1]["client_eval"]["loss"], 42.0)
        self.assertEqual(training[1]["client_eval"]["accuracy"], 0.75)
        # This process now runs gRPC's threads: run_local, which forks, refuses.
        with self.assertRaisesRegex(RuntimeError, "fresh process"):
            cleave.run_local("run: {rounds: 1}\n", clients=lambda i: None, num_clients=1, num_examples=1)

    def test_configure_evaluate_chooses_who_evaluates_and_with_what(self):
        class Evaluated(Offset):
            def evaluate(self, parameters, config):
                self.configs = getattr(self, "configs", []) + [dict(config)]
                return 1.0 + self.offset, 10, {"accuracy": 0.5, "f1_macro": 0.25}

        class Picky(Median):
            def configure_evaluate(self, server_round, clients):
                self.asked = getattr(self, "asked", []) + [sorted(clients)]
                return [(min(clients), {"threshold": 0.5, "tag": f"round {server_round}"})]

            def aggregate_evaluate(self, server_round, results, failures):
                self.metrics = [r.metrics for _, r in results]
                return None, {"accuracy": 0.75}

        clients, strategy = [Evaluated(0.1, 100), Evaluated(0.2, 100)], Picky()
        committed, rows = self.run_server(strategy, clients, rounds=2)
        self.assertEqual(committed, 2)
        self.assertEqual(len(strategy.asked), 2)
        training = [r for r in rows if not r.get("evaluation_only")]
        self.assertEqual([r["client_eval"]["clients"] for r in training], [1, 1])
        # One client measured the model before each round with the strategy's config; the
        # other only in the final evaluation (which configure_evaluate does not shape).
        tagged = sorted(c["tag"] for client in clients for c in getattr(client, "configs", []) if "tag" in c)
        self.assertEqual(tagged, ["round 1", "round 2"])
        self.assertTrue(all(c.get("threshold", 0.5) == 0.5 for client in clients for c in client.configs))
        # A metric of the client's own reaches the strategy and the round's figures.
        self.assertEqual(strategy.metrics[0]["f1_macro"], 0.25)
        self.assertEqual(rows[-1]["client_eval"]["f1_macro"], 0.25)

    def test_a_strategy_that_raises_ends_the_run_with_its_error(self):
        class Broken(cleave.Strategy):
            def aggregate_fit(self, server_round, results, failures):
                raise KeyError("no such rule")

        with self.assertRaisesRegex(RuntimeError, "no such rule"):
            self.run_server(Broken(), [Offset(0.1, 100), Offset(0.2, 100)], rounds=1)


class Momentum(Median):
    """The median, moved on by server-side momentum the strategy keeps (state())."""

    def __init__(self, fail_in_round=None):
        super().__init__()
        self.velocity, self.rounds, self.loaded, self.fail_in_round = None, 0, None, fail_in_round

    def aggregate_fit(self, server_round, results, failures):
        if server_round == self.fail_in_round:
            raise RuntimeError("the machine went down")
        median, metrics = super().aggregate_fit(server_round, results, failures)
        self.rounds += 1
        self.velocity = [0.5 * v + m for v, m in zip(self.velocity or [0 * m for m in median], median)]
        return median, metrics

    def state(self):
        return {"rounds": self.rounds, **{f"v{i}": v for i, v in enumerate(self.velocity or [])}}

    def load_state(self, state):
        self.loaded = {k: v.copy() for k, v in state.items()}
        self.rounds = int(state["rounds"][0])
        self.velocity = [state[f"v{i}"] for i in range(len(state) - 1)] or None


class StrategyStateTest(StrategyRuns):
    """A Python strategy's own state is checkpointed, and a resumed run restores it."""

    def test_a_resumed_run_continues_the_strategy(self):
        run_dir = tempfile.mkdtemp(prefix="cleave-pytest-")
        first = Momentum(fail_in_round=2)
        with self.assertRaisesRegex(RuntimeError, "the machine went down"):
            self.run_server(first, [Offset(0.1, 100), Offset(0.2, 100)], rounds=2, run_dir=run_dir)
        self.assertEqual(first.rounds, 1)
        resumed = Momentum()
        committed, _ = self.run_server(resumed, [Offset(0.1, 100), Offset(0.2, 100)], rounds=2, run_dir=run_dir)
        self.assertEqual(committed, 2)
        # load_state got round 1's state, as state() gave it then (float32).
        self.assertEqual(resumed.loaded["rounds"].tolist(), [1.0])
        for got, want in zip([resumed.loaded[f"v{i}"] for i in range(len(first.velocity))], first.velocity):
            np.testing.assert_array_equal(got, np.asarray(want, dtype=np.float32))
        self.assertEqual(resumed.rounds, 2)
        self.assertEqual(resumed.calls, [(2, [100, 100], 0)])

    def test_state_and_load_state_go_together(self):
        class Half(Median):
            def state(self):
                return {}

        with self.assertRaisesRegex(RuntimeError, "state\\(\\) and load_state\\(\\) go together"):
            self.run_server(Half(), [Offset(0.1, 100)], rounds=1)


class HostileStrategyTest(StrategyRuns):
    """What a strategy returns is checked like anything else from outside the coordinator."""

    def test_settings_a_device_cannot_train_with_end_the_run_naming_them(self):
        for name, chosen in [("zero batch", lambda cs: [(c, {"batch_size": 0}) for c in cs]),
                             ("nan lr", lambda cs: [(c, {"lr": float("nan")}) for c in cs]),
                             ("twice", lambda cs: [cs[0], cs[0]]),
                             ("none", lambda cs: [])]:
            with self.subTest(name):
                class Chooser(Median):
                    def configure_fit(self, server_round, clients):
                        return chosen(clients)

                strategy = Chooser()
                committed, _ = self.run_server(strategy, [Offset(0.1, 100), Offset(0.2, 100)], rounds=1)
                self.assertEqual(committed, 0)
                self.assertEqual(strategy.calls, [])  # no round was trained

    def test_figures_that_are_not_finite_or_in_range_are_refused(self):
        class BadEvaluation(Median):
            def aggregate_evaluate(self, server_round, results, failures):
                return float("nan"), {"accuracy": 5.0}

        _, rows = self.run_server(BadEvaluation(), [Offset(0.1, 100), Offset(0.2, 100)], rounds=2)
        for row in rows:  # the built-in summary stands
            self.assertEqual(row["client_eval"]["accuracy"], 0.5)
            self.assertEqual(row["client_eval"]["loss"], 1.15)

        class BadServerEvaluation(Median):
            def evaluate(self, server_round, parameters):
                return float("nan"), {}

        with self.assertRaisesRegex(RuntimeError, "evaluate's loss is nan"):
            self.run_server(BadServerEvaluation(), [Offset(0.1, 100), Offset(0.2, 100)], rounds=1)

    def test_client_options_are_checked(self):
        with self.assertRaisesRegex(ValueError, "give_up_after_s"):
            cleave.start_client(server="127.0.0.1:1", client=Offset(0.1, 10), num_examples=10, insecure=True,
                                give_up_after_s=float("nan"))


class SplitClientTest(unittest.TestCase):
    """The device's part of a split LeNet-5 as a torch.nn.Module."""

    @staticmethod
    def head():  # cleave's lenet5 stages 0 and 1 (the part before split.cut 2)
        return torch.nn.Sequential(torch.nn.Conv2d(1, 6, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                   torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2))

    def run_split(self, mode, heads, examples=1000, rounds=2, quorum=1.0):
        torch.set_num_threads(1)
        server = Server(JOB.format(name="py-split", rounds=rounds, clients=len(heads), quorum=quorum)
                        + f"split: {{mode: {mode}, cut: 2}}\n")

        def run(i):
            data = qs.load_fmnist("train", i * examples, examples)
            loader = torch.utils.data.DataLoader(data, batch_size=32, shuffle=True)
            return cleave.start_split_client(
                server=server.address, module=heads[i], batches=lambda config: loader, num_examples=examples,
                optimizer=torch.optim.SGD(heads[i].parameters(), lr=0.05, momentum=0.9), insecure=True,
                name=f"py-{i}", give_up_after_s=60)

        results = in_threads(len(heads), run)
        code, rows = server.wait()
        return code, rows, results, server

    def test_sfl_v2_and_sl_learn_with_modules_as_the_devices_parts(self):
        for mode in ("sfl-v2", "sl"):
            code, rows, results, server = self.run_split(mode, [self.head(), self.head()])
            self.assertEqual(code, 0, server.output()[-3000:])
            self.assertTrue(all(isinstance(r, dict) and r["tasks_failed"] == 0 for r in results), results)
            training = [r for r in rows if not r.get("evaluation_only")]
            self.assertEqual([r["participants"] for r in training], [2, 2], mode)
            # Each device's activations at the cut, [B, 16, 4, 4] float32, crossed the stream.
            self.assertGreaterEqual(training[-1]["activation_bytes_up"], 2 * 1000 * 16 * 4 * 4 * 4)
            self.assertGreater(training[-1]["test_accuracy"], 0.5, f"{mode}: 0.1 at the start")

    def test_a_module_of_the_wrong_cut_fails_its_tasks(self):
        wrong = torch.nn.Sequential(torch.nn.Conv2d(1, 6, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        code, rows, results, server = self.run_split("sfl-v2", [self.head(), wrong], examples=200, rounds=2,
                                                     quorum=0.5)
        self.assertEqual(code, 0, server.output()[-3000:])
        self.assertEqual(results[1]["tasks_failed"], 2, results)
        self.assertIn("begin raised ValueError: the server's part has 4 tensors; the module has 2", server.output())


class RunLocalTest(unittest.TestCase):
    """run_local forks its clients: in a process of its own, as ctest runs each class."""

    def setUp(self):
        if cleave._cleave.grpc_started():
            self.skipTest("this process ran a client or server already; run this class alone")

    def test_a_federation_of_processes(self):
        rows = cleave.run_local(JOB.format(name="py-local", rounds=1, clients=2, quorum=1.0),
                                clients=lambda i: qs.client_fn(i, 300), num_clients=2, num_examples=300)
        training = [r for r in rows if not r.get("evaluation_only")]
        self.assertEqual(len(training), 1)
        self.assertEqual(training[0]["participants"], 2)

    def test_processes_against_a_python_strategy_in_this_process(self):
        strategy = Median()
        rows = cleave.run_local(JOB.format(name="py-local-median", rounds=2, clients=3, quorum=1.0),
                                clients=lambda i: Offset(0.1 * (i + 1), 100), num_clients=3, num_examples=100,
                                strategy=strategy)
        self.assertEqual([c[0] for c in strategy.calls], [1, 2])
        training = [r for r in rows if not r.get("evaluation_only")]
        self.assertEqual([r["fit_clients"] for r in training], [3, 3])


if __name__ == "__main__":
    unittest.main()
