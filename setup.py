"""Builds the compiled index helper `data_tools._helpers` from data_tools/helpers.cpp.

Everything else about the package lives in pyproject.toml. The build fails loudly (never
`optional=True`): a missing compiler or missing Python headers is reported with what to install.
"""
import os
import shutil
import sysconfig

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup


class BuildExt(build_ext):
    def build_extensions(self):
        compiler = self.compiler.compiler_cxx[0] if getattr(self.compiler, "compiler_cxx", None) else "c++"
        if shutil.which(compiler) is None:
            raise SystemExit(
                f"error: building data_tools/helpers.cpp needs a C++17 compiler, but '{compiler}' "
                "was not found on PATH. Install one (Debian/Ubuntu: apt-get install g++) and run "
                "the install again.")
        include = sysconfig.get_paths()["include"]
        if not os.path.exists(os.path.join(include, "Python.h")):
            raise SystemExit(
                f"error: building data_tools/helpers.cpp needs the Python development headers, but "
                f"{include}/Python.h is missing. Install them (Debian/Ubuntu: apt-get install "
                "python3-dev) and run the install again.")
        super().build_extensions()


setup(
    ext_modules=[
        Pybind11Extension(
            "data_tools._helpers",
            ["data_tools/helpers.cpp"],
            cxx_std=17,
            # -ffp-contract=off: no fused multiply-add, so blending's float comparisons round
            # exactly as the NumPy reference does (an FMA could flip ties between datasets)
            extra_compile_args=["-O3", "-ffp-contract=off"],
        )
    ],
    cmdclass={"build_ext": BuildExt},
)
