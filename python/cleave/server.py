"""The C++ coordinator in this process, with a strategy written in Python."""

from . import _cleave


class Strategy:
    """The decisions a Python strategy may take; define any of them (others are the job's
    built-in strategy's, ``strategy.name``). Shaped after Flower's ``Strategy``:

    - ``configure_fit(server_round, clients)``: ``clients`` are the available clients'
      session ids; return the ids to train this round, or ``(id, config)`` pairs whose
      ``config`` overrides the job's ``lr``, ``local_epochs``, ``local_steps``,
      ``batch_size``, ``momentum``, ``weight_decay`` or ``proximal_mu`` for that client;
      None keeps the built-in choice.
    - ``aggregate_fit(server_round, results, failures)``: ``results`` are ``(name,
      fit_res)`` pairs, ``fit_res.parameters`` the client's trained tensors (float32 NumPy
      arrays, the model's order), ``fit_res.num_examples`` its weight and
      ``fit_res.metrics`` its ``train_loss``; ``failures`` one exception per failed task.
      Return ``(parameters, metrics)``: the new global model (None: keep it) and numbers
      recorded in the round's metrics as ``fit_<name>``.
    - ``configure_evaluate(server_round, clients)``: ``clients`` are the round's training
      clients' session ids; return those that measure the global model before they
      train (their ``evaluate``), or ``(id, config)`` pairs whose ``config`` (numbers,
      strings, lists of them) is added to that client's evaluate config; None: all.
    - ``aggregate_evaluate(server_round, results, failures)``: ``results`` are ``(name,
      evaluate_res)`` pairs with ``loss``, ``num_examples`` and ``metrics`` (with
      ``accuracy``); return ``(loss, metrics)``, the round's federated evaluation.
    - ``evaluate(server_round, parameters)``: the server's own measure of each new model;
      return ``(loss, metrics)`` (recorded as ``evaluate_loss``, ``evaluate_<name>``) or None.
    - ``state()`` and ``load_state(state)``, together: what the strategy keeps between
      rounds (server-side momentum, ...) as ``{name: array of numbers}`` (kept as float32).
      It is saved with every checkpoint, so a resumed run calls ``load_state`` with the
      state of the round it resumes from; and taken before each round, so that a round
      that fails is undone in it too.

    The coordinator calls them from its round thread; everything else (sessions, uploads,
    checks, codecs, secure aggregation) runs in C++ without the GIL.
    """

    def configure_fit(self, server_round, clients):
        return None

    def aggregate_fit(self, server_round, results, failures):
        raise NotImplementedError

    def aggregate_evaluate(self, server_round, results, failures):
        raise NotImplementedError

    def evaluate(self, server_round, parameters):
        return None


def start_server(config, strategy=None, listen="127.0.0.1:0", run_dir=None, insecure=False, on_listen=None):
    """Runs the job ``config`` (a YAML file's path, or its text) on the C++ coordinator in
    this process until the run ends, with ``strategy`` (a :class:`Strategy`-shaped
    object; None: the job's). ``listen`` is ``HOST:PORT`` (port 0 picks one);
    ``on_listen(port)`` is called once it serves. TLS comes from the job's ``tls``
    section; ``insecure=True`` serves plaintext without it. Returns the number of rounds
    committed; raises RuntimeError when the run fails (a strategy's exception included)."""
    if strategy is not None and not callable(getattr(strategy, "aggregate_fit", None)):
        raise TypeError("the strategy has no aggregate_fit(server_round, results, failures)")
    options = {"listen": listen, "run_dir": run_dir, "insecure": bool(insecure)}
    return _cleave.run_server(config, options, strategy, on_listen)
