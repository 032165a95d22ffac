"""Flower-shaped clients on cleave's C++ client."""

from . import _cleave


class NumPyClient:
    """The shape of Flower's ``NumPyClient``: subclass it (or write any class with
    these methods) and pass an instance to :func:`start_client`.

    ``parameters`` are the global model's tensors as float32 NumPy arrays, in the
    model's order; ``config`` holds the round (``server_round``) and the job's training
    settings (``local_epochs``, ``batch_size``, ``lr``, ...).
    """

    def get_properties(self, config):
        """The device's profile, as it declares it when joining (``hostname``,
        ``cpu_cores``, ``memory_bytes``, ``platform``); override to say more."""
        return _cleave.device_profile()

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


def _options(who, *, server, server_address, insecure, ca, cert, key, token, token_file, name, num_examples,
             give_up_after_s):
    """The native client's options from a start function's arguments, checked."""
    address = server or server_address
    if not address:
        raise ValueError(f"{who} needs server='HOST:PORT'")
    if token_file:
        with open(token_file, encoding="utf-8") as f:
            token = f.read().strip()
    if not insecure and not ca:
        raise ValueError("no CA to verify the server with (ca=...); plaintext needs insecure=True")
    if num_examples is not None and int(num_examples) <= 0:
        raise ValueError("num_examples must be positive (or left out: each round's count is what fit returns)")
    return {"server": address, "insecure": bool(insecure), "ca": ca, "cert": cert, "key": key, "token": token,
            "name": name, "num_examples": 0 if num_examples is None else int(num_examples),
            "give_up_after_s": float(give_up_after_s)}


def _implements(client, name):
    """Whether the client has its own `name` (not NumPyClient's placeholder)."""
    method = getattr(type(client), name, None)
    return callable(method) and method is not getattr(NumPyClient, name)


def start_client(*, client, num_examples=None, server=None, server_address=None, insecure=False, ca=None,
                 cert=None, key=None, token=None, token_file=None, name=None, give_up_after_s=600.0):
    """Runs ``client`` in the federation at ``server`` ("HOST:PORT"; Flower's
    ``server_address`` is accepted too) until the server ends the run.

    Each training task calls ``client.fit`` with the global model; what it returns is
    uploaded as that round's update (read in place, not copied: float32 arrays or CPU
    torch tensors in C order). When the client implements ``evaluate``, it first measures
    the global model (federated evaluation) and runs the final evaluation.
    ``num_examples``, when given, is declared when joining: the server weights and caps
    this client's updates by it. Without it (Flower's way), each round's weight is the
    count ``fit`` returns, capped as a declared count is (docs/python.md); secure
    aggregation, which fixes weights before training, needs it declared. TLS: ``ca`` (the federation CA's PEM file), ``cert`` and ``key`` for
    mutual TLS; or ``insecure=True`` for plaintext, as ``cleave-client --insecure``.
    A ``fit`` that raises, or returns arrays of the wrong shape or dtype or not finite,
    fails that task (the error in this client's log and the server's) and the client
    goes on with the next round. Returns the client's counts (tasks completed, failed,
    bytes); raises RuntimeError when the run cannot go on (refused, unreachable).
    """
    if not callable(getattr(client, "fit", None)):
        raise TypeError("the client has no fit(parameters, config)")
    options = _options("start_client", server=server, server_address=server_address, insecure=insecure, ca=ca,
                       cert=cert, key=key, token=token, token_file=token_file, name=name or "python-client",
                       num_examples=num_examples, give_up_after_s=give_up_after_s)
    evaluate = client.evaluate if _implements(client, "evaluate") else None
    return _cleave.run_client(options, client.fit, evaluate)


def start_numpy_client(*, client, server_address=None, server=None, **options):
    """Flower's older name for :func:`start_client` with a NumPyClient: the same."""
    return start_client(client=client, server=server, server_address=server_address, **options)


def copied_bytes():
    """Bytes of trained parameters copied on their way from Python to the upload since
    the process started: 0 unless some ``fit`` returned a non-contiguous array."""
    return _cleave.copied_bytes()


class _SplitRunner:
    """The device's stages of a split model in PyTorch, driven by the C++ client."""

    def __init__(self, module, optimizer, batches, examples):
        self.module, self.optimizer, self.batches, self.examples = module, optimizer, batches, examples
        self.config, self.it, self.acts = {}, None, {}

    def begin(self, parameters, config):
        import torch
        tensors = list(self.module.state_dict().values())
        if len(parameters) != len(tensors):
            raise ValueError(f"the server's part has {len(parameters)} tensors; the module has {len(tensors)}")
        with torch.no_grad():
            for i, (t, v) in enumerate(zip(tensors, parameters)):
                if tuple(t.shape) != tuple(v.shape):
                    raise ValueError(f"the part's tensor {i} is {tuple(v.shape)}; the module's is {tuple(t.shape)}")
                t.copy_(torch.from_numpy(v))
        self.config, self.it, self.acts = config, None, {}
        self.module.train()
        return self.examples

    def forward(self, seq):
        if self.it is None:
            self.it = iter(self.batches(self.config))
        try:
            x, y = next(self.it)
        except StopIteration:
            self.it = None
            return None
        act = self.module(x)
        self.acts[seq] = act
        return act.detach().contiguous().numpy(), y.numpy() if hasattr(y, "numpy") else y

    def backward(self, seq, grad):
        import torch
        act = self.acts.pop(seq)
        self.optimizer.zero_grad()
        act.backward(torch.from_numpy(grad))
        self.optimizer.step()

    def parameters(self):
        return [t.detach().cpu().contiguous().numpy() for t in self.module.state_dict().values()]


def start_split_client(*, module, optimizer, batches, num_examples, server=None, server_address=None,
                       insecure=False, ca=None, cert=None, key=None, token=None, token_file=None, name=None,
                       give_up_after_s=600.0):
    """Runs the device's part of a split model, ``module`` (a ``torch.nn.Module``: the
    model's stages before the job's ``split.cut``, with their tensors in the model's order
    and shapes), in split learning (``sl``, ``sfl-v1`` or ``sfl-v2``) until the server
    ends the run. Each task loads the part the server sends into ``module``, then for
    each batch of ``batches(config)`` (an iterable of ``(inputs, labels)`` tensors for one
    local epoch) sends ``module(inputs)`` and the labels through the C++ client's split
    stream (its codecs, activation noise and window), back-propagates the gradient that
    returns and steps ``optimizer``; the trained part is uploaded. Connection arguments
    as :func:`start_client`.
    """
    options = _options("start_split_client", server=server, server_address=server_address, insecure=insecure,
                       ca=ca, cert=cert, key=key, token=token, token_file=token_file,
                       name=name or "python-split-client", num_examples=num_examples,
                       give_up_after_s=give_up_after_s)
    return _cleave.run_client(options, None, None, _SplitRunner(module, optimizer, batches, int(num_examples)))
