"""The attention case suite shared by the backends' test files (CPU twin "ffi", XLA reference "xla", CUDA)."""

import jax
import jax.numpy as jnp

# Relative L2 bounds against an fp32 reference (looser than helpers.TOL for float32: the kernels' online softmax).
TOL = {jnp.float32: 2e-5, jnp.float16: 2e-3, jnp.bfloat16: 1e-2}

# The forward cases: B, T, S, N, K, D.
SHAPES = [
    (2, 17, 17, 4, 4, 32),  # MHA, T == S
    (1, 1, 100, 4, 2, 64),  # one query row, GQA
    (2, 100, 17, 6, 2, 16),  # T > S, GQA
    (1, 17, 200, 8, 1, 32),  # MQA, T < S
    (2, 33, 65, 3, 3, 8),  # tails of the 64-key tile
]


def shape_id(s) -> str:
    return "B{}T{}S{}N{}K{}D{}".format(*s)


def qkv(B, T, S, N, K, D, dtype=jnp.float32, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(ks[0], (B, T, N, D), jnp.float32)
    k = jax.random.normal(ks[1], (B, S, K, D), jnp.float32)
    v = jax.random.normal(ks[2], (B, S, K, D), jnp.float32)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)
