# `pip install .`: the Python module `tandem` (python/tandem + the native _tandem extension),
# built through the project's CMake into build/pip-pyXY (reused by later installs; the
# TANDEM_PIP_BUILD_DIR environment variable moves it) for the Python running pip. Needs what
# `make` needs (scripts/bootstrap.sh: a compiler, CMake, Ninja, pybind11-dev, ...). Without
# internet: `pip install --no-build-isolation .` (setuptools from Debian's python3-setuptools).
import os
import pathlib
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        out = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        tag = f"pip-py{sys.version_info[0]}{sys.version_info[1]}"
        build = pathlib.Path(os.environ.get("TANDEM_PIP_BUILD_DIR", ROOT / "build" / tag))
        if not (build / "CMakeCache.txt").exists():
            subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build), "-G", "Ninja",
                                   "-DCMAKE_BUILD_TYPE=Release",
                                   f"-DPython_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", str(build), "--target", "_tandem", "-j",
                               str(os.cpu_count() or 2)])
        built = sorted((build / "python" / "tandem").glob("_tandem*.so"))
        if not built:
            raise RuntimeError(f"the CMake build in {build} made no _tandem module "
                               f"(is pybind11-dev installed?)")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[0], out)


setup(
    name="tandem",
    version="0.1.0",
    description="tandem: the CPU MoE operator as a kernel library, and the engine, from Python",
    packages=["tandem"],
    package_dir={"": "python"},
    ext_modules=[CMakeExtension("tandem._tandem")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.9",
    install_requires=["torch"],
)
