"""Lazy Triton compilation: kernels are plain functions here, compiled (or interpreted) on first launch.

Why not ``@triton.jit`` at import: ``import mmspec.kernels`` must not need Triton, and Triton decides at
decoration time whether a function is compiled or interpreted (``TRITON_INTERPRET``). Tests set that
variable long after something (torch, transformers) imported Triton, so its own library functions
(``tl.max``, ``tl.sum``, ``tl.zeros``) may already be compiled-mode objects, which the interpreter cannot
call. :func:`kernel` therefore picks the mode per launch (the interpreter for CPU tensors or under
``TRITON_INTERPRET=1``) and, while interpreting, lets compiled-mode library functions run as the plain
Python they wrap, which is what they are in interpreter mode.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from .dispatch import interpreting

_lock = threading.Lock()


class _Kernel:
    """``kernel(fn)[grid](*args, **meta)``: like ``triton.jit(fn)[grid](...)``, compiled or interpreted."""

    def __init__(self, fn):
        self.fn = fn
        self._compiled = None
        self._interpreted = None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            on_cpu = any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args)
            if on_cpu or interpreting():
                if self._interpreted is None:
                    from triton.runtime.interpreter import InterpretedFunction

                    self._interpreted = InterpretedFunction(self.fn)
                with _library_callable():
                    return self._interpreted[grid](*args, **kwargs)
            if self._compiled is None:
                import triton

                self._compiled = triton.jit(self.fn)
            return self._compiled[grid](*args, **kwargs)

        return launch


def kernel(fn) -> _Kernel:
    """Wrap a Triton kernel written as a plain function (``tl`` in its globals, constexpr annotations)."""
    return _Kernel(fn)


@contextlib.contextmanager
def _library_callable():
    """While interpreting, let compiled-mode ``JITFunction``s (Triton's own ``tl.max``, ...) be called.

    In interpreter mode Triton builds them as ``InterpretedFunction``s, whose call patches the language for
    the function and runs its rewritten Python; this does the same for functions built before the mode
    was known, and undoes its language patch after each call (``InterpretedFunction`` leaves it in place,
    which would break compiling kernels later in the same process). Restored on exit; a lock keeps two
    interpreted launches from interleaving the patch.
    """
    from triton.runtime.interpreter import InterpretedFunction, _patch_lang
    from triton.runtime.jit import JITFunction

    cache: dict = {}

    def call(self, *args, **kwargs):
        fn = cache.get(self.fn)
        if fn is None:
            fn = cache[self.fn] = InterpretedFunction(self.fn).rewrite()
        scope = _patch_lang(self.fn)
        try:
            return fn(*args, **kwargs)
        finally:
            if scope is not None:
                scope.restore()

    with _lock:
        original = JITFunction.__call__
        JITFunction.__call__ = call
        try:
            yield
        finally:
            JITFunction.__call__ = original
