"""Builds vrepl's Cython extensions (vrepl/_core). Metadata lives in pyproject.toml."""
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

CORE = "vrepl/_core"
# Optimise the hot paths; VREPL_DEBUG_BUILD=1 builds with symbols and no optimisation.
debug = os.environ.get("VREPL_DEBUG_BUILD") == "1"
compile_args = ["-O0", "-g"] if debug else ["-O3"]


def core_extension(name: str, with_crc: bool = True) -> Extension:
    sources = [f"{CORE}/{name}.pyx"]
    if with_crc:
        sources.append(f"{CORE}/csrc/crc32c_impl.c")
    return Extension(
        f"vrepl._core.{name}",
        sources,
        include_dirs=[CORE, f"{CORE}/csrc", numpy.get_include()],
        extra_compile_args=compile_args,
    )


setup(
    ext_modules=cythonize(
        [core_extension("crc32c"), core_extension("frame"), core_extension("record"), core_extension("framebuf"), core_extension("window", with_crc=False), core_extension("wire"),
         core_extension("rows", with_crc=False), core_extension("memcols", with_crc=False)],
        compiler_directives={"language_level": "3", "embedsignature": True},
        include_path=["."],
    ),
)
