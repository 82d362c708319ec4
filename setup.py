"""Builds p3kv and its C++ core (the _p3 extension) with `pip install .` or `pip install -e .`."""

import glob
import os

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

# Compile the core's sources in parallel (NPY_NUM_BUILD_JOBS overrides the count).
ParallelCompile("NPY_NUM_BUILD_JOBS", default=0).install()

HERE = os.path.dirname(os.path.abspath(__file__))

core = Pybind11Extension(
    "p3kv._p3",
    sorted(glob.glob("cpp/src/*.cc")) + sorted(glob.glob("cpp/mxnet/*.cc")) + sorted(glob.glob("cpp/python/*.cc")),
    # The bindings see the public API (cpp/include/p3) and the MXNet bridge; the core's internal headers sit
    # next to its sources (cpp/src), found from there.
    include_dirs=[os.path.join(HERE, "cpp", "include"), os.path.join(HERE, "cpp", "mxnet"),
                  os.path.join(HERE, "cpp", "python")],
    cxx_std=17,
    # -O3: the aggregation and optimizer loops vectorise (element-wise, no FMA on baseline x86-64: same bits).
    extra_compile_args=["-O3", "-Wall", "-Wextra"],
    extra_link_args=["-pthread"],
    # dl: the engine bridge finds libmxnet's C API at run time; crypto: HMAC for the connection handshake.
    libraries=["dl", "crypto"],
)

setup(ext_modules=[core], cmdclass={"build_ext": build_ext})
