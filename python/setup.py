"""Dependencies of sglang-hybrid that need a path (the rest of the metadata is in pyproject.toml).

``pip install ./python`` from a checkout must find our kernel package, which is not on
PyPI: it is required by path (``sgl-hybrid-kernel @ file://<checkout>/sgl-kernel``), and the
``[cpu]`` extra brings the CPU ``sgl_kernel`` stand-in the same way. Building wheels to
publish elsewhere: set ``SGLANG_HYBRID_PLAIN_REQUIREMENTS=1`` to require them by name.
"""

import os
import pathlib

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent
KERNEL = HERE.parent / "sgl-kernel"
SHIM = KERNEL / "cpu_shim"
SGLANG_VERSION = "0.5.23"  # the pin (sglang_hybrid.anchors.PINNED_SGLANG)


def _local(name: str, path: pathlib.Path) -> str:
    if os.environ.get("SGLANG_HYBRID_PLAIN_REQUIREMENTS") != "1" and (path / "pyproject.toml").is_file():
        return f"{name} @ {path.as_uri()}"
    return name


setup(
    install_requires=[
        f"sglang=={SGLANG_VERSION}",
        _local("sgl-hybrid-kernel", KERNEL),
        "aiohttp",
        "numpy",
        "requests",
        "safetensors",
        "tokenizers",
        "tqdm",
    ],
    extras_require={
        "cpu": [_local("sgl-hybrid-cpu-shim", SHIM)],
        "test": ["pytest", "pytest-xdist", "filelock", "fla-core==0.6.0"],
    },
)
