"""Flower-shaped clients on cleave's C++ client."""

from . import _cleave


class NumPyClient:
    """The shape of Flower's ``NumPyClient``: subclass it (or write any class with
    these methods) and pass an instance to :func:`start_client`.

    ``parameters`` are the global model's tensors as float32 NumPy arrays, in the
    model's order; ``config`` holds the round (``server_round``) and the job's training
    settings (``local_epochs``, ``batch_size``, ``lr``, ...).
    """

    def get_parameters(self, config):
        raise NotImplementedError

    def fit(self, parameters, config):
        """Trains from ``parameters``; returns ``(parameters, num_examples, metrics)``."""
        raise NotImplementedError

    def evaluate(self, parameters, config):
        """Measures ``parameters``; returns ``(loss, num_examples, metrics)``."""
        raise NotImplementedError

    def to_client(self):
        """Flower's conversion, kept so that Flower code runs unchanged: the client itself."""
        return self


def _implements(client, name):
    method = getattr(type(client), name, None)
    return callable(method) and method is not getattr(NumPyClient, name)


def start_client(*, client, num_examples, server=None, server_address=None, insecure=False, ca=None,
                 cert=None, key=None, token=None, token_file=None, name=None, give_up_after_s=600.0):
    """Runs ``client`` in the federation at ``server`` ("HOST:PORT"; Flower's
    ``server_address`` is accepted too) until the server ends the run.

    Each training task calls ``client.fit`` with the global model; what it returns is
    uploaded as that round's update (read in place, not copied: float32 arrays or CPU
    torch tensors in C order). When the client implements ``evaluate``, it first measures
    the global model (federated evaluation) and runs the final evaluation.
    ``num_examples`` is declared when joining: the server weights and caps this client's
    updates by it. TLS: ``ca`` (the federation CA's PEM file), ``cert`` and ``key`` for
    mutual TLS; or ``insecure=True`` for plaintext, as ``cleave-client --insecure``.
    A ``fit`` that raises, or returns arrays of the wrong shape or dtype or not finite,
    fails that task (the error in this client's log and the server's) and the client
    goes on with the next round. Returns the client's counts (tasks completed, failed,
    bytes); raises RuntimeError when the run cannot go on (refused, unreachable).
    """
    address = server or server_address
    if not address:
        raise ValueError("start_client needs server='HOST:PORT'")
    if not _implements(client, "fit") and not callable(getattr(client, "fit", None)):
        raise TypeError("the client has no fit(parameters, config)")
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
    if not insecure and not ca:
        raise ValueError("no CA to verify the server with (ca=...); plaintext needs insecure=True")
    evaluate = client.evaluate if _implements(client, "evaluate") or (
        not isinstance(client, NumPyClient) and callable(getattr(client, "evaluate", None))) else None
    options = {
        "server": address,
        "insecure": bool(insecure),
        "ca": ca,
        "cert": cert,
        "key": key,
        "token": token,
        "name": name or "python-client",
        "num_examples": int(num_examples),
        "give_up_after_s": float(give_up_after_s),
    }
    return _cleave.run_client(options, client.fit, evaluate)


def copied_bytes():
    """Bytes of trained parameters copied on their way from Python to the upload since
    the process started: 0 unless some ``fit`` returned a non-contiguous array."""
    return _cleave.copied_bytes()
