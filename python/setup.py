"""pip install ./python (offline: pip install --no-build-isolation ./python).

Building the package builds its native module (cleave/_cleave*.so, a pybind11 binding of
the C++ client and coordinator) and cleave-server from the checkout this folder is in,
with CMake, for the Python that runs pip: scripts/install-deps.sh installs what is
missing first (Debian's packages; as root, or with sudo), then the checkout's `build/`
folder is configured and the two targets built (`make python` does the same by hand).
Set CLEAVE_BUILD_DIR to build elsewhere, CLEAVE_SKIP_DEPS=1 to skip the install step.
"""

import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

here = os.path.dirname(os.path.abspath(__file__))
checkout = os.path.dirname(here)


class BuildNative(build_py):
    """Builds the native module and cleave-server with CMake before the package's files
    are collected, and records where cleave-server is (cleave/_build_info.py)."""

    def run(self):
        if not os.path.exists(os.path.join(checkout, "CMakeLists.txt")):
            raise SystemExit(f"{checkout} is not a cleave checkout: pip install ./python from one")
        build = os.environ.get("CLEAVE_BUILD_DIR", os.path.join(checkout, "build"))
        if os.environ.get("CLEAVE_SKIP_DEPS") != "1":
            subprocess.check_call([os.path.join(checkout, "scripts", "install-deps.sh"), "--no-test-tools"])
        subprocess.check_call(["cmake", "-S", checkout, "-B", build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                               # a virtualenv's python is a link: the interpreter it runs stays
                               f"-DPython3_EXECUTABLE={os.path.realpath(sys.executable)}"])
        subprocess.check_call(["cmake", "--build", build, "--target", "_cleave", "cleave-server"])
        with open(os.path.join(here, "cleave", "_build_info.py"), "w", encoding="utf-8") as f:
            f.write('"""Written by setup.py: where the build that made this package put its binaries."""\n')
            f.write(f"BIN = {os.path.join(build, 'bin')!r}\n")
        super().run()


class NativeDistribution(Distribution):
    """A package with a native module: its wheel is tagged for this platform and Python."""

    def has_ext_modules(self):
        return True


setup(
    name="cleave",
    version="0.1.0",
    description="cleave for Python: Flower-shaped clients on cleave's C++ federated-learning engine",
    packages=["cleave"],
    package_data={"cleave": ["_cleave*.so"]},
    python_requires=">=3.9",
    install_requires=["numpy"],
    cmdclass={"build_py": BuildNative},
    distclass=NativeDistribution,
)
