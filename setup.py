"""Builds the compiled alignment core (cython_ext/) into vllm_hetero_spec._alignment."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("vllm_hetero_spec._alignment", ["cython_ext/alignment.pyx"], extra_compile_args=["-O3"])],
        compiler_directives={"language_level": 3},
    )
)
