"""GEMM with a fused epilogue: ``gemm``, the layer ``linear`` and the gated MLP projection ``gated_linear``.

``gemm(a, b, *, bias, c, alpha, beta, activation, residual, out_dtype, transpose_a, transpose_b, precision, a_scale,
b_scale, implementation)`` = ``act(alpha * op(a) @ op(b) + beta * c + bias) + residual`` rounded once to
``out_dtype``, with jnp.matmul's batch broadcasting; bf16/f16 (fp32 accumulate), f32 (exact fp32 unless
``precision`` allows TF32), f64, float8 e4m3fn/e5m2 and int8 (with dequantisation scales).
``gated_linear(x, w_gate, w_up=None, activation="silu")`` = ``act(x @ w_gate) * (x @ w_up)`` in one kernel, also
for tokamax's packed ``[K, 2, N]`` weight. All three work under jit, vmap, grad (custom_vjp, float types) and
sharding (batch, M and N, and K split with a reduction of f32 partials before the epilogue;
``custom_partitioning``), and take ``implementation=None | "ffi" | "xla"``. ``k_sharded_gemm`` is ``gemm`` inside a
``jax.shard_map`` whose axis splits K (psum / psum_scatter, then the epilogue).

``ACTIVATIONS`` names the epilogue's activations; ``overrides(plan=...)`` forces a CUDA kernel (tests). The
public functions are re-exported as ``jax_ops.gemm``, ``jax_ops.linear`` and ``jax_ops.gated_linear`` (this module
is not called ``jax_ops.gemm`` so that name stays the function). docs/gemm.md has the dtype table and the knobs.
"""

from jax_ops._src.gemm.activations import ACTIVATIONS
from jax_ops._src.gemm.api import gated_linear, gemm, k_sharded_gemm, linear
from jax_ops._src.gemm.config import overrides

__all__ = ["ACTIVATIONS", "gated_linear", "gemm", "k_sharded_gemm", "linear", "overrides"]
