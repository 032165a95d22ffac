"""Random return values from every method of a Python strategy (cleave.Strategy), drawn
from a seeded generator: wrong types, NaN and infinities, huge and negative numbers,
unknown and repeated clients, ragged arrays, nested garbage. Each draw runs a short
federation on the coordinator in this process, and must end as a run (committed or
completed early) or a RuntimeError naming what was wrong, never a crash; nothing that
is not a finite number may reach the run's metrics.

    /usr/bin/python3 tests/python/fuzz_strategy.py [--seconds S] [--seed N]

ctest runs it for a few seconds (python.FuzzStrategy); `make fuzz` for a minute."""

import argparse
import math
import os
import random
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_client as tc  # noqa: E402

import cleave  # noqa: E402


def garbage(rng, depth=0):
    """A value of any shape a careless strategy might return (nested at most 3 deep)."""
    makers = [lambda: None, lambda: float("nan"), lambda: float("inf"), lambda: -float("inf"),
              lambda: 10 ** rng.randrange(30), lambda: -rng.randrange(5), lambda: "text", lambda: b"\xff\x00",
              lambda: np.full((rng.randrange(3),), np.nan)]
    if depth < 3:
        makers += [lambda: [garbage(rng, depth + 1) for _ in range(rng.randrange(3))],
                   lambda: {garbage_key(rng): garbage(rng, depth + 1) for _ in range(rng.randrange(3))},
                   lambda: (garbage(rng, depth + 1),) * rng.randrange(4)]
    return rng.choice(makers)()


def garbage_key(rng):
    return rng.choice(["lr", "batch_size", "local_epochs", "local_steps", "momentum", "accuracy", "", "x" * 300,
                       "threshold", "\u00e9"])


def settings(rng):
    """A configure_fit / configure_evaluate config: plausible keys, implausible values."""
    return {garbage_key(rng): rng.choice([garbage(rng), 0, -1, 1, 0.5, 2 ** 40]) for _ in range(rng.randrange(3))}


def choice_of_clients(rng, clients):
    return rng.choice([None, [], clients, [clients[0]] * 2, ["c404"], [(c, settings(rng)) for c in clients],
                       [(clients[0], "not a dict")], 42, garbage(rng)])


class Hostile(tc.Median):
    def __init__(self, rng):
        super().__init__()
        self.rng, self.said = rng, []

    def __getattribute__(self, name):  # every answer logged, to show what a failure followed
        attr = object.__getattribute__(self, name)
        if name not in ("configure_fit", "configure_evaluate", "aggregate_fit", "aggregate_evaluate", "evaluate",
                        "state"):
            return attr

        def logged(*args):
            value = attr(*args)
            object.__getattribute__(self, "said").append(f"{name} -> {value!r:.200}")
            return value
        return logged

    def configure_fit(self, server_round, clients):
        return choice_of_clients(self.rng, clients) if self.rng.random() < 0.5 else None

    def configure_evaluate(self, server_round, clients):
        return choice_of_clients(self.rng, clients) if self.rng.random() < 0.5 else None

    def aggregate_fit(self, server_round, results, failures):
        rng = self.rng
        if rng.random() < 0.4:
            return super().aggregate_fit(server_round, results, failures)
        params = [r.parameters for _, r in results][0]
        return rng.choice([None, (None, {}), ([], {}), (params[:-1], {}), ([p * np.nan for p in params], {}),
                           ([p.astype(np.float64) for p in params], {}), (params, {"x": garbage(rng)}),
                           ("params", {}), garbage(rng), (params, garbage(rng))])

    def aggregate_evaluate(self, server_round, results, failures):
        return self.rng.choice([(garbage(self.rng), {"accuracy": garbage(self.rng)}), None, garbage(self.rng),
                                (1.0, {garbage_key(self.rng): garbage(self.rng)}), (1.0,)])

    def evaluate(self, server_round, parameters):
        return self.rng.choice([None, (garbage(self.rng), {}), (1.0, garbage(self.rng)), garbage(self.rng)])

    def state(self):
        return self.rng.choice([{}, {"a": garbage(self.rng)}, {1: 2}, garbage(self.rng), {"v": [[1], [2, 3]]}])

    def load_state(self, state):
        pass


def finite_numbers_only(value, where="row"):
    if isinstance(value, float):
        assert math.isfinite(value), f"{where} is {value}"
    elif isinstance(value, dict):
        for k, v in value.items():
            finite_numbers_only(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            finite_numbers_only(v, f"{where}[{i}]")


def run_once(rng):
    strategy = Hostile(rng)
    clients = [tc.Offset(0.1, 100), tc.Offset(0.2, 100)]
    run_dir = tempfile.mkdtemp(prefix="cleave-fuzz-")
    threads = []

    def client(port, i, c):  # a run refused at once may end before its clients reach it
        try:
            cleave.start_client(server=f"127.0.0.1:{port}", client=c, num_examples=c.examples, insecure=True,
                                name=f"py-{i}", give_up_after_s=3)
        except RuntimeError:
            pass

    def serve(port):
        for i, c in enumerate(clients):
            threads.append(threading.Thread(target=client, args=(port, i, c)))
            threads[-1].start()

    outcome = "completed"
    try:
        cleave.start_server(tc.JOB.format(name="py-fuzz", rounds=2, clients=2, quorum=1.0), strategy=strategy,
                            insecure=True, run_dir=run_dir, on_listen=serve)
    except (RuntimeError, ValueError) as e:
        outcome = f"refused: {str(e)[:80]}"
    except BaseException:
        print("fuzz_strategy: the strategy said, last first:\n  " + "\n  ".join(reversed(strategy.said[-8:])))
        raise
    for t in threads:
        t.join(timeout=60)
    if os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        for row in cleave.read_metrics(run_dir):
            finite_numbers_only(row)
    return outcome


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    end, runs, outcomes = time.monotonic() + args.seconds, 0, {}
    while time.monotonic() < end:
        kind = run_once(rng).split(":")[0]
        outcomes[kind] = outcomes.get(kind, 0) + 1
        runs += 1
    print(f"fuzz_strategy: {runs} runs in {args.seconds:g} s, seed {args.seed}: {outcomes}")


if __name__ == "__main__":
    main()
