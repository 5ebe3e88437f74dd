"""Imports put off until they are used: `import stagec.isa`, `stagec --help` and `stagec disasm`
load neither torch nor JAX.

`lazy_attributes` gives a package the names of its modules, each imported on first use (PEP 562);
`after_import` runs a function on a module once something imports it (JAX's pytree registration
of a class, without importing JAX for it).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping
from types import ModuleType


def lazy_attributes(package: str, homes: Mapping[str, str]):
    """(__getattr__, __dir__) for the package `package`, whose names in `homes` (name -> the module
    that defines it) are imported from there on first use and then kept."""
    module = sys.modules[package]

    def __getattr__(name: str):
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(module)) | set(homes))

    return __getattr__, __dir__


def after_import(name: str, hook: Callable[[ModuleType], None]) -> None:
    """hook(module) once the top-level module `name` is imported: now if it is, else right after
    whoever imports it first has run it."""
    if name in sys.modules:
        hook(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, hook))


class _AfterImport:
    """A meta path finder: finds `name` as the other finders do, with a loader that calls `hook`
    after running it.  (Not an importlib.abc class: importing importlib.abc takes longer than the
    rest of `import stagec`.)"""

    def __init__(self, name: str, hook: Callable[[ModuleType], None]):
        self.name, self.hook = name, hook

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenCall(spec.loader, self.hook)
        return spec


class _ThenCall:
    """A loader: `loader`'s, then `hook` on the module."""

    def __init__(self, loader, hook: Callable[[ModuleType], None]):
        self.loader, self.hook = loader, hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = module.__spec__.loader = self.loader   # the module keeps its own loader
        self.loader.exec_module(module)
        self.hook(module)
