"""Build script: maps the top-level folders onto the ``graphfeed.*`` namespace.

``graphfeed`` itself is an implicit namespace package; each top-level folder is one
subpackage (``server/`` -> ``graphfeed.server``).  The native op library in
``cuda_ext/`` is built here as well (see ``cuda_ext/build.py``); when it cannot be
built the package still installs and falls back to the pure-torch sampler.
"""
import importlib.util
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent
# Every top-level folder with an __init__.py is one graphfeed.* subpackage (core, proto, transport,
# client, server, cli, bench, testing, cuda_ext).
TOP_LEVEL = tuple(sorted(init.parent.name for init in ROOT.glob("*/__init__.py")))


def namespace_packages():
    package_dir, packages = {}, []
    for top in TOP_LEVEL:
        for init in sorted((ROOT / top).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT)
            name = ".".join(("graphfeed",) + rel.parts)
            packages.append(name)
            package_dir[name] = rel.as_posix()
    return packages, package_dir


def native_extension() -> dict:
    """The optional native op library (cuda_ext/build.py decides what to compile)."""
    spec = importlib.util.spec_from_file_location("_graphfeed_native_build", ROOT / "cuda_ext" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.setup_kwargs(ROOT)


packages, package_dir = namespace_packages()
setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"graphfeed.proto": ["*.proto"], "graphfeed.cuda_ext": ["csrc/**/*"]},
    **native_extension(),
)
