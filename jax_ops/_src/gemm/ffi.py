"""The raw FFI call of ``jax_ops_gemm`` (contract: ffi_cuda/gemm/params.h): the op's layout (validation.Call) to
the contract's (a packed gated weight [Bb, K, 2, N] -> [Bb, K, 2N], gated bias/b_scale [2, N] -> [2N]), the
0-element buffers of absent operands, the plan (the knob's, else the dispatch table's: tuning.py) with the
cublaslt plan's workspace, and whether this platform has the kernel."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jax_ops import _ffi
from jax_ops._src import dispatch
from jax_ops._src.gemm import tuning
from jax_ops._src.gemm.validation import Config

TARGET = "jax_ops_gemm"


def absent() -> jax.Array:
    """The contract's absent optional operand: a 0-element array."""
    return jnp.zeros((0,), jnp.float32)


def fill(operands) -> tuple:
    return tuple(absent() if x is None else x for x in operands)


def dims(cfg: Config, a, b) -> tuple[int, int, int, int]:
    """(B, M, N, K) of the op's operands."""
    B = a.shape[0]
    M, K = (a.shape[2], a.shape[1]) if cfg.transpose_a else (a.shape[1], a.shape[2])
    N = b.shape[3] if cfg.gated == "packed" else (b.shape[1] if cfg.transpose_b else b.shape[2])
    return B, M, N, K


def _given(x):
    return None if x.shape == (0,) else x


def table_arch() -> str | None:
    """The dispatch table's arch key of the GPU traced calls run on (None off GPUs: the CPU twin has one kernel)."""
    if dispatch.platform() != "gpu":
        return None
    return tuning.arch_key(dispatch.compute_capability(dispatch.first_gpu()))


def resolve_plan(cfg: Config, a, b, bias, c, residual, a_scale, b_scale) -> str:
    """The plan this call runs with: the knob's when forced, else on a GPU the dispatch table's for the problem's
    class (tuning.py) where that plan can run it, else "auto" (heuristics.h's rules)."""
    arch = table_arch()
    if cfg.plan != "auto" or arch is None:
        return cfg.plan
    B, M, N, K = dims(cfg, a, b)
    rows = B * M if b.shape[0] == 1 and not cfg.transpose_a else M
    weight_bytes = K * N * (1 if cfg.gated == "none" else 2) * jnp.dtype(b.dtype).itemsize
    given = tuple(map(_given, (bias, c, residual, a_scale, b_scale)))
    key = tuning.class_key(cfg, a.dtype, rows, weight_bytes, given[0] is not None, given[2] is not None)
    plan = tuning.lookup(arch, key)
    if plan == "cublaslt":
        eight_bit = jnp.dtype(a.dtype).itemsize == 1  # ffi.py hands cuBLASLt an 8-bit b as [N, K]
        lt_cfg = dataclasses.replace(cfg, transpose_b=cfg.transpose_b or eight_bit)
        if tuning.cublaslt_refusal(lt_cfg, a.dtype, b.dtype, cfg.out_dtype, N, K, given) is not None:
            return "auto"
    return plan


def gemm_ffi(cfg: Config, a, b, b_up, bias, c, residual, a_scale, b_scale):
    """``(out [B, M, N], preact)``: preact is [B, M, N] (gated [B, M, 2, N]) with write_preact, else 0 elements.

    Shared weights (Bb = 1, a not transposed) fold the batch into M here, per shard: one GEMM of B*M rows; a
    ``sum_batch`` call folds its batch into the contraction (a [B, K, M] -> [1, B*K, M], b likewise)."""
    if cfg.sum_batch:
        a, b = a.reshape(1, -1, a.shape[2]), b.reshape(1, -1, b.shape[2])
        cfg = dataclasses.replace(cfg, sum_batch=False)
    B, M, N, _ = dims(cfg, a, b)
    gated = cfg.gated != "none"
    cfg = dataclasses.replace(cfg, plan=resolve_plan(cfg, a, b, bias, c, residual, a_scale, b_scale))
    lt = cfg.plan == "cublaslt"  # cuBLASLt reads a transposed a as it is, and an 8-bit b only as [N, K]
    if cfg.transpose_a and jnp.dtype(a.dtype).itemsize <= 2 and not lt:
        # The Hopper kernel reads A K-major only (a transposed A would run the SIMT kernel, ~10x slower): one
        # transposed copy per call. The backward's weight gradient op(a)^T @ dz is the call that takes this.
        a = jnp.swapaxes(a, 1, 2)
        cfg = dataclasses.replace(cfg, transpose_a=False)
    if b.shape[0] == 1 and not cfg.transpose_a:
        batch, rows = 1, B * M
        a = a.reshape(1, rows, a.shape[2])
        c, residual = (x.reshape(1, rows, N) if x.ndim == 3 else x for x in (c, residual))
        a_scale = (
            jnp.broadcast_to(a_scale.reshape(-1, M), (B, M)).reshape(rows) if a_scale.size > 1 else a_scale
        )
    else:
        batch, rows = B, M
        a_scale = a_scale.reshape(-1)  # [1, M] (B = 1) -> [M]
    if (
        (rows > _ffi.constants()["gemm_skinny_max_m_fp8"] or lt)
        and jnp.dtype(a.dtype).itemsize == 1
        and not cfg.transpose_b
        and cfg.gated != "packed"
    ):
        # 8-bit wgmma reads B K-major only: the Hopper kernel gets b as [Bb, N, K] (one transpose per call; weights
        # stored as [N, K] with transpose_b=True avoid it). Decode-sized M keeps [K, N] for the skinny kernel.
        b = jnp.swapaxes(b, 1, 2)
        b_up = jnp.swapaxes(b_up, 1, 2) if cfg.gated == "separate" else b_up
        cfg = dataclasses.replace(cfg, transpose_b=True)
    if cfg.gated == "packed":
        b = b.reshape(b.shape[0], b.shape[1], 2 * N)
    if gated:
        bias, b_scale = bias.reshape(-1), b_scale.reshape(-1)
    preact_shape = ((batch, rows, 2 * N) if gated else (batch, rows, N)) if cfg.write_preact else (0,)
    workspace = tuning.CUBLASLT_WORKSPACE_BYTES if lt and table_arch() is not None else 0
    shapes = (
        jax.ShapeDtypeStruct((batch, rows, N), cfg.out_dtype),
        jax.ShapeDtypeStruct(preact_shape, cfg.out_dtype),
        jax.ShapeDtypeStruct((workspace,), jnp.uint8),
    )
    out, preact, _ = _ffi.ffi_call(
        TARGET, shapes, a, b, b_up, bias, c, residual, a_scale, b_scale, **cfg.attrs()
    )
    out = out.reshape(B, M, N)
    if cfg.write_preact:
        preact = preact.reshape(B, M, 2, N) if gated else preact.reshape(B, M, N)
    return out, preact


def unsupported_reason() -> str | None:
    """Why ``implementation="ffi"`` cannot run on this platform (None when it can)."""
    if dispatch.platform() == "gpu" and TARGET not in _ffi.target_names("CUDA"):
        return "this jax_ops build has no CUDA GEMM kernels"
    return None
