"""Builds the compiled index helper `data_tools._helpers` from data_tools/helpers.cpp, and installs
`ernie_mtl_zlib.pth` beside the packages.

Everything else about the package lives in pyproject.toml. The build fails loudly (never
`optional=True`): a missing compiler or missing Python headers is reported with what to install.

Why the .pth: Paddle 2.6.2 exports its own zlib symbols; when Python's `zlib` module is loaded after
`import paddle`, decompression crashes (SIGSEGV in inflateReset2, e.g. `import paddle` then `import
paddlenlp`). ernie_mtl's entry points import zlib first, but a user's script (a PALM head starts with
`import paddle`) would not. A .pth file in site-packages runs at interpreter start-up, before any script,
so the order of a script's imports no longer matters. The wheel carries it at its root (build_py); an
editable install (`pip install -e .`, PEP 660) gets it added to the editable wheel (editable_wheel).
"""
import base64
import hashlib
import os
import shutil
import sysconfig
import zipfile
from pathlib import Path

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup
from setuptools.command.build_py import build_py

ZLIB_PTH = "ernie_mtl_zlib.pth"
ZLIB_PTH_TEXT = ("# ernie-mtl: load Python's zlib at start-up, before anything imports paddle (paddle 2.6.2 exports "
                 "clashing zlib symbols: setup.py)\nimport zlib\n")


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


class BuildPy(build_py):
    """The packages, and ernie_mtl_zlib.pth at the root of the build (the wheel's root: site-packages)."""

    def run(self):
        super().run()
        target = Path(self.build_lib) / ZLIB_PTH
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(ZLIB_PTH_TEXT, encoding="utf-8")

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib) / ZLIB_PTH)]


def add_to_wheel(wheel: Path, name: str, data: bytes) -> None:
    """Add file `name` at the root of `wheel`, listed in its RECORD (so pip installs and uninstalls it)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            content = src.read(item.filename)
            if item.filename == name:
                continue
            if item.filename.endswith(".dist-info/RECORD"):
                lines = [line for line in content.decode().splitlines() if not line.startswith(name + ",")]
                lines.insert(0, f"{name},sha256={digest},{len(data)}")
                content = ("\n".join(lines) + "\n").encode()
            dst.writestr(item, content)
        dst.writestr(name, data)
    tmp.replace(wheel)


cmdclass = {"build_ext": None, "build_py": BuildPy}
try:  # setuptools >= 64 (pyproject.toml requires it): PEP 660 editable installs
    from setuptools.command.editable_wheel import editable_wheel

    class EditableWheel(editable_wheel):
        """The editable wheel with ernie_mtl_zlib.pth added at its root."""

        def run(self):
            started = {p: p.stat().st_mtime for p in Path(self.dist_dir).glob("*.whl")} if self.dist_dir else {}
            super().run()
            built = [p for p in Path(self.dist_dir).glob("*.whl") if started.get(p) != p.stat().st_mtime]
            if not built:
                raise SystemExit(f"error: the editable wheel was not found in {self.dist_dir}; cannot add {ZLIB_PTH}")
            for wheel in built:
                add_to_wheel(wheel, ZLIB_PTH, ZLIB_PTH_TEXT.encode())

    cmdclass["editable_wheel"] = EditableWheel
except ImportError:
    pass


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
    cmdclass={**cmdclass, "build_ext": BuildExt},
)
