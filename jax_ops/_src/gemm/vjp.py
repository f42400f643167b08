"""The differentiable op: ``custom_vjp`` over the kernel.

The forward saves the pre-activation z through ``write_preact`` (the same kernel writes out and z; recomputing z
would cost the backward a third GEMM). The backward forms dz = g * act'(z) (gated: dz_gate = g * z_up * act'(z_gate),
dz_up = g * act(z_gate)) elementwise, then runs its GEMMs through this same op with transpose flags (no transposed
copies): d op(a) = alpha * dz @ op(b)^T, d op(b) = alpha * op(a)^T @ dz (a shared weight's batch folds into the
contraction), d bias = sum dz, dc = beta * dz, d residual = g. For separate gated weights the two dx products
accumulate through the epilogue's c (beta = 1, f32); a packed weight's stay one GEMM over [dz_gate | dz_up].
Float8 / int8 GEMMs have no gradient (TypeError when differentiated)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src.gemm.activations import ACTIVATIONS
from jax_ops._src.gemm.batching import gemm_op
from jax_ops._src.gemm.ffi import absent, dims
from jax_ops._src.gemm.validation import F32, F64, Config, kind
from jax_ops._src.vma import vary_like


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def gemm_pair(cfg: Config, *operands):
    """(a, b, b_up, bias, c, residual, a_scale, b_scale) -> (out, preact); preact has 0 elements unless
    cfg.write_preact. Inside shard_map both vary where the operands do."""
    return vary_like(gemm_op(cfg)(*operands), operands)


def gemm_vjp(cfg: Config, *operands):
    """The op's output alone."""
    return gemm_pair(cfg, *operands)[0]


def _saves_preact(cfg: Config) -> bool:
    return cfg.activation != "identity" or cfg.gated != "none"


def _fwd(cfg: Config, *operands):
    saves = cfg.write_preact or _saves_preact(cfg)
    # through gemm_pair itself, so that a second derivative sees z as a differentiable value
    out, preact = gemm_pair(dataclasses.replace(cfg, write_preact=saves), *operands)
    # typed like the primal's (varying inside shard_map where the operands vary)
    returned = preact if cfg.write_preact else vary_like((jnp.zeros((0,), cfg.out_dtype),), operands)[0]
    return (out, returned), (operands, preact if saves else None)


def _matmul(cfg: Config, x, y, tx: bool, ty: bool, out_dtype, *, c=None, sum_batch=False):
    """alpha * op(x) @ op(y) (+ c) through the op itself (so higher derivatives work too); ``sum_batch`` sums
    over the batch as well ([1, M, N]: Config.sum_batch)."""
    mm = Config(
        out_dtype=np.dtype(out_dtype),
        transpose_a=tx,
        transpose_b=ty,
        alpha=cfg.alpha,
        beta=0.0 if c is None else 1.0,
        tf32=cfg.tf32,
        plan=cfg.plan,
        sum_batch=sum_batch,
    )
    e = absent()
    return gemm_vjp(mm, x, y, e, e, e if c is None else c, e, e, e)


def _sum_batch_bwd(cfg: Config, res, cts):
    """Gradients of out = alpha * sum_b x_b^T @ y_b (x [B, K, M], y [B, K, N], out [1, M, N]): dx_b = alpha *
    y_b @ g^T, dy_b = alpha * x_b @ g, each one GEMM with g as a shared weight."""
    (x, y, *absent_operands), _ = res
    g, _ = cts
    g = g.astype(x.dtype)
    mm = functools.partial(_matmul, cfg)
    dx, dy = mm(y, g, False, True, x.dtype), mm(x, g, False, False, y.dtype)
    grads = (dx, dy, *(jnp.zeros_like(z) for z in absent_operands))
    operands = (x, y, *absent_operands)
    return vary_like(grads, (*operands, g), targets=operands)


def _bwd(cfg: Config, res, cts):
    if cfg.sum_batch:
        return _sum_batch_bwd(cfg, res, cts)
    (a, b, b_up, bias, c, residual, a_scale, b_scale), preact = res
    g, g_preact = cts
    k = kind(a.dtype)
    if k not in ("half", "f32", "f64"):
        raise TypeError(
            f"jax_ops.gemm has no gradient for {a.dtype} inputs (float16/bfloat16/float32/float64 only)"
        )
    B, M, N, K = dims(cfg, a, b)
    Bb = b.shape[0]
    ta, tb = cfg.transpose_a, cfg.transpose_b
    dt = a.dtype
    acc = F64 if k == "f64" else F32
    act = ACTIVATIONS[cfg.activation]
    g_acc = g.astype(acc)
    if cfg.gated == "none":
        dzs = [g_acc if preact is None else g_acc * act.grad(preact.astype(acc))]
    else:
        z_gate, z_up = preact[:, :, 0].astype(acc), preact[:, :, 1].astype(acc)
        dzs = [g_acc * z_up * act.grad(z_gate), g_acc * act.fn(z_gate)]
    if cfg.write_preact:  # z was an output too: its cotangent adds to dz
        gp = g_preact.astype(acc)
        dzs = [dzs[0] + gp] if cfg.gated == "none" else [dzs[0] + gp[:, :, 0], dzs[1] + gp[:, :, 1]]
    ops = [d.astype(dt) for d in dzs]  # the backward GEMMs' operands, in the input dtype
    mm = functools.partial(_matmul, cfg)

    # d a, in a's stored layout
    if cfg.gated == "packed":
        dz_cat = jnp.stack(ops, axis=2).reshape(B, M, 2 * N)
        da = mm(dz_cat, b.reshape(Bb, K, 2 * N), False, True, dt)
    elif cfg.gated == "separate":
        first = mm(ops[0], b, False, True, acc)
        da = mm(ops[1], b_up, False, True, acc, c=first).astype(dt)
    elif not ta:
        da = mm(ops[0], b, False, not tb, dt)
    elif Bb == B:
        da = mm(b, ops[0], tb, True, dt)  # op(b) @ dz^T = d op(a)^T
    else:  # a transposed, batched, weights shared: [B, M, K] then one transposed copy
        da = jnp.swapaxes(mm(ops[0], b, False, not tb, dt), 1, 2)

    # d b (and d b_up), in b's stored layout
    def weight_grad(dz):
        if Bb == B:
            return mm(dz, a, True, ta, dt) if tb else mm(a, dz, not ta, False, dt)
        if not ta:  # shared weight: the batch is contracted too (one GEMM of B*M rows per shard)
            return (
                mm(dz, a, True, False, dt, sum_batch=True)
                if tb
                else mm(a, dz, True, False, dt, sum_batch=True)
            )
        per_batch = mm(dz, a, True, True, acc) if tb else mm(a, dz, False, False, acc)
        return per_batch.sum(axis=0, keepdims=True).astype(dt)

    if cfg.gated == "packed":
        db, db_up = weight_grad(dz_cat).reshape(b.shape), jnp.zeros_like(b_up)
    elif cfg.gated == "separate":
        db, db_up = weight_grad(ops[0]), weight_grad(ops[1])
    else:
        db, db_up = weight_grad(ops[0]), jnp.zeros_like(b_up)

    dbias = jnp.zeros_like(bias)
    if bias.shape != (0,):
        dbias = jnp.stack([d.sum(axis=(0, 1)) for d in dzs]).reshape(bias.shape).astype(bias.dtype)
    dc = (cfg.beta * dzs[0]).astype(c.dtype) if c.shape != (0,) else jnp.zeros_like(c)
    dres = g.astype(residual.dtype) if residual.shape != (0,) else jnp.zeros_like(residual)
    grads = (da, db, db_up, dbias, dc, dres, jnp.zeros_like(a_scale), jnp.zeros_like(b_scale))
    operands = (a, b, b_up, bias, c, residual, a_scale, b_scale)
    # inside shard_map: a replicated operand's gradient is the sum of the shards' partial gradients
    return vary_like(grads, (*operands, g), targets=operands)


gemm_pair.defvjp(_fwd, _bwd)
