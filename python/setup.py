"""Builds hmla._C with the project's CMake (the kernel libraries and python/src/hmla_torch.cpp)
against the torch of the running interpreter, then installs it with the hmla package."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent.parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        try:
            import torch
        except ImportError:
            sys.exit("hmla: torch is not importable by this build; install torch first and build with "
                     "`pip install --no-build-isolation ./python`")
        build = Path(self.build_temp).resolve() / "cmake"
        out = build / "python"
        args = [f"-DPython3_EXECUTABLE={sys.executable}", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
                f"-DHMLA_PYTHON_OUT={out}", "-DCMAKE_BUILD_TYPE=Release", "-DHMLA_APP=OFF", "-DHMLA_TESTS=OFF",
                "-DHMLA_EMU=OFF", "-DHMLA_MPI=OFF"]
        if shutil.which("ninja"):
            args += ["-G", "Ninja"]
        subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build)] + args, check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "hmla_torch_ext", "-j", str(os.cpu_count() or 2)],
                       check=True)
        built = next((out / "hmla").glob("_C*"))
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, dest)


setup(ext_modules=[Extension("hmla._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
