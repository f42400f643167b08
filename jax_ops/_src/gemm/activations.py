"""The activations of the GEMM epilogue: one table of jnp functions (the reference and the backward use it); the
kernels' ids come from the native list (``constants()["gemm_activations"]``, params.h's kActivationNames).

To add one: a formula in ffi_cuda/gemm/epilogue.h (``Activate``), its name in params.h's list, and a row here; the
derivative defaults to the forward-mode derivative of the jnp function.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jax_ops import _ffi


@dataclasses.dataclass(frozen=True)
class Activation:
    fn: Callable  # elementwise act(z), in z's dtype
    derivative: Callable | None = None  # elementwise act'(z); None: jvp of fn

    def grad(self, z):
        if self.derivative is not None:
            return self.derivative(z)
        return jax.jvp(self.fn, (z,), (jnp.ones_like(z),))[1]


ACTIVATIONS: dict[str, Activation] = {
    "identity": Activation(lambda z: z, lambda z: jnp.ones_like(z)),
    "relu": Activation(jax.nn.relu),
    "gelu_tanh": Activation(lambda z: jax.nn.gelu(z, approximate=True)),
    "gelu": Activation(lambda z: jax.nn.gelu(z, approximate=False)),
    "silu": Activation(jax.nn.silu),
}


def canonical(activation: str | None) -> str:
    """The table name of ``activation`` (None means identity); ValueError naming the choices otherwise."""
    name = "identity" if activation is None else activation
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise ValueError(f"activation must be None or one of {sorted(ACTIVATIONS)}, got {activation!r}")
    return name


def activation_id(name: str) -> int:
    """The kernel's id of ``name`` (its index in the native list)."""
    names = _ffi.constants()["gemm_activations"]
    if name not in names:
        raise ValueError(f"activation {name!r} has no kernel formula (native list: {names})")
    return names.index(name)
