"""pip install ./python (offline: pip install --no-build-isolation ./python), after
`make python` has built the native module into python/cleave/ (docs/python.md)."""

import glob
import os

from setuptools import setup

here = os.path.dirname(os.path.abspath(__file__))
if not glob.glob(os.path.join(here, "cleave", "_cleave*.so")):
    raise SystemExit("python/cleave has no native module: run `make python` in the checkout first")

setup(
    name="cleave",
    version="0.1.0",
    description="cleave for Python: Flower-shaped clients on cleave's C++ federated-learning engine",
    packages=["cleave"],
    package_data={"cleave": ["_cleave*.so"]},
    python_requires=">=3.9",
    install_requires=["numpy"],
)
