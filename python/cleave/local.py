"""A federation on this machine: cleave-server and Python clients as processes."""

import json
import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
import time


def _server_binary():
    """cleave-server: $CLEAVE_BIN/cleave-server, the checkout's build/bin, the build that
    pip ran (cleave/_build_info.py), or PATH."""
    candidates = []
    if os.environ.get("CLEAVE_BIN"):
        candidates.append(os.path.join(os.environ["CLEAVE_BIN"], "cleave-server"))
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "..", "..", "build", "bin", "cleave-server"))
    try:
        from ._build_info import BIN
        candidates.append(os.path.join(BIN, "cleave-server"))
    except ImportError:  # imported from the checkout: no pip build
        pass
    for c in candidates:
        if os.access(c, os.X_OK):
            return os.path.abspath(c)
    found = shutil.which("cleave-server")
    if found:
        return found
    raise FileNotFoundError("cleave-server not found: build it (make) or set CLEAVE_BIN to its folder")


def _run_client(make_client, index, address, num_examples, queue):
    from .client import start_client  # in the child: its own gRPC
    try:
        if not isinstance(address, str):  # a queue: the in-process server's, once it listens
            address = address.get(timeout=120)
        client, examples = make_client(index), num_examples(index) if callable(num_examples) else num_examples
        result = start_client(server=address, client=client, num_examples=examples, insecure=True,
                              name=f"client-{index}", give_up_after_s=60)
        queue.put((index, result, None))
    except BaseException as e:  # reported to the parent, which raises
        queue.put((index, None, f"{type(e).__name__}: {e}"))


def run_local(config, clients, num_clients, num_examples, run_dir=None, timeout_s=3600, strategy=None):
    """Runs the job ``config`` (a YAML file's path, or its text) with ``num_clients``
    Python clients, each ``clients(index)`` (a NumPyClient-shaped object) in a process of
    its own, against a cleave-server on loopback (plaintext), as ``cleave local`` does
    with C++ clients; with ``strategy``, against the coordinator in this process
    (:func:`cleave.start_server`) deciding with it. ``num_examples`` is each client's
    example count (or a function of its index). Returns the run's rounds
    (:func:`read_metrics`); raises RuntimeError with the server's log when the run fails,
    or at once when this process has run a cleave client or server already (forking it
    would copy gRPC's threads' locks, not the threads)."""
    from . import _cleave
    if _cleave.grpc_started():
        raise RuntimeError("run_local forks its clients, and this process has run a cleave client or server "
                           "(gRPC's threads do not survive a fork): call it from a fresh process")
    run_dir = os.path.abspath(run_dir or tempfile.mkdtemp(prefix="cleave-run-"))
    os.makedirs(run_dir, exist_ok=True)
    if "\n" not in config and not os.path.isfile(config):
        raise FileNotFoundError(f"run_local: no job config at {config!r} (a path, or YAML text of several lines)")
    if "\n" in config:
        path = os.path.join(run_dir, "job.yaml")
        with open(path, "w", encoding="utf-8") as f:
            f.write(config)
        config = path
    if strategy is not None:
        return _run_local_in_process(config, strategy, clients, num_clients, num_examples, run_dir)
    log_path = os.path.join(run_dir, "server.out")
    with open(log_path, "w", encoding="utf-8") as log:
        server = subprocess.Popen([_server_binary(), "--config", config, "--listen", "127.0.0.1:0", "--insecure",
                                   "--run-dir", run_dir], stdout=log, stderr=subprocess.STDOUT)
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None and time.monotonic() < deadline and server.poll() is None:
            with open(log_path, encoding="utf-8") as f:
                m = re.search(r"listening on port (\d+)", f.read())
            port = m and m.group(1)
            time.sleep(0.05)
        if port is None:
            raise RuntimeError("cleave-server did not start:\n" + open(log_path, encoding="utf-8").read())
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_run_client, args=(clients, i, f"127.0.0.1:{port}", num_examples, queue))
                 for i in range(num_clients)]
        for p in procs:
            p.start()
        code = server.wait(timeout=timeout_s)
        errors = []
        for _ in procs:
            index, _, error = queue.get(timeout=120)
            if error:
                errors.append(f"client-{index}: {error}")
        for p in procs:
            p.join(timeout=60)
        if code != 0:
            raise RuntimeError(f"cleave-server exited with {code}:\n" + open(log_path, encoding="utf-8").read()[-4000:])
        if errors:
            raise RuntimeError("clients failed: " + "; ".join(errors))
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return read_metrics(run_dir)


def _run_local_in_process(config, strategy, clients, num_clients, num_examples, run_dir):
    """run_local with the coordinator in this process: the clients are forked first (no
    gRPC in this process yet) and told the port once the server listens."""
    from .server import start_server
    ctx = multiprocessing.get_context("fork")
    queue, ports = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=_run_client, args=(clients, i, ports, num_examples, queue)) for i in range(num_clients)]
    for p in procs:
        p.start()
    try:
        start_server(config, strategy=strategy, listen="127.0.0.1:0", run_dir=run_dir, insecure=True,
                     on_listen=lambda port: [ports.put(f"127.0.0.1:{port}") for _ in procs])
        errors = []
        for _ in procs:
            index, _, error = queue.get(timeout=120)
            if error:
                errors.append(f"client-{index}: {error}")
        if errors:
            raise RuntimeError("clients failed: " + "; ".join(errors))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return read_metrics(run_dir)


def read_metrics(run_dir, pandas=False):
    """A run's rounds (its metrics.jsonl) as a list of dicts, one per round; with
    ``pandas=True`` a DataFrame (pandas is optional)."""
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if pandas:
        import pandas as pd  # optional
        return pd.DataFrame(rows)
    return rows
