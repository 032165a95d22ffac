"""cleave for Python: bring PyTorch training code to a cleave federation.

A client is any object with Flower's NumPyClient shape (``get_parameters``, ``fit``,
``evaluate``); :func:`start_client` runs it on cleave's C++ client, which does the
whole protocol (TLS and mutual TLS, codecs with error feedback, secure aggregation,
client-side DP, heartbeats, reconnects). :func:`run_local` runs a federation of them on
this machine, and :func:`read_metrics` reads a run's rounds; :func:`start_server` runs
the C++ coordinator in this process with a :class:`Strategy` written in Python.
Code written against Flower runs with ``import cleave as fl``: ``fl.client.NumPyClient``,
``fl.client.start_client`` / ``start_numpy_client`` and ``fl.common``'s conversions are
here under Flower's names. docs/python.md has the rest ("Coming from Flower").
"""

from . import client, common
from .client import NumPyClient, start_client, start_numpy_client, start_split_client, copied_bytes
from .local import run_local, read_metrics
from .server import Strategy, start_server

__all__ = ["NumPyClient", "start_client", "start_numpy_client", "start_split_client", "copied_bytes", "run_local",
           "read_metrics", "Strategy", "start_server", "client", "common"]
