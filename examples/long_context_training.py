"""Long-context training with the sequence sharded over every device (``jax_ops.attention.ring_attention``).

One pre-norm transformer block (token + position embedding -> RMSNorm -> q/k/v projections -> causal grouped-query
ring attention -> output projection -> residual -> RMSNorm -> GELU MLP -> residual -> logits), next-token
cross-entropy, ``jax.grad`` and a plain SGD update under ``jax.jit``. The batch ``[B, seq]`` is sharded along the
sequence over a 1-D mesh of all ``jax.devices()`` (``NamedSharding``); the parameters are replicated. The
projections run through ``jax_ops.linear`` (``--gemm xla``: ``x @ w``) and partition with the sequence.

Zigzag layout (the default ``--layout``): the batch is permuted once with ``zigzag_order`` (tokens, targets and
position ids alike), so every position-wise layer runs unchanged and the loss, a mean over positions, is the same
number; only attention needs the global positions, and ``ring_attention(layout="zigzag")`` knows which ones each
shard holds. The data follow a rule that needs no long context (next token = token + 1 mod vocab, from a random
first token): the point is the sharding and the check.

Every step is checked against the same step on one device with ``jax_ops.dot_product_attention`` on the
unpermuted sequence (same parameters, same batch): both losses and the largest gradient difference are printed,
and the run fails when they differ by more than rounding.

    python examples/long_context_training.py      # CPU: 8 fake devices (set below unless XLA_FLAGS says), seconds
    python examples/long_context_training.py --seq 32768 --dim 1024 --heads 8 --kv-heads 8 --dtype bfloat16
                                                  # a multi-GPU machine: every GPU holds seq / devices positions
"""

from __future__ import annotations

import importlib.util
import os

_GPU_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin")


def _runs_on_cpu() -> bool:
    """Before jax is imported: JAX_PLATFORMS asks for the CPU first, or no CUDA plugin is installed."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms:
        return platforms.split(",")[0] == "cpu"
    return not any(importlib.util.find_spec(name) for name in _GPU_PLUGINS)


# The flag only takes effect before jax is imported; a device count already in XLA_FLAGS (tests' conftest) wins.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "") and _runs_on_cpu():
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import functools  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_ops  # noqa: E402
from jax_ops import attention as attn  # noqa: E402

# Largest relative gradient difference (max |Δg| / max |g| over each leaf) allowed against the single-device step.
GRAD_TOL = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 64
    seq: int = 1024
    dim: int = 64
    heads: int = 4
    kv_heads: int = 2
    dtype: str = "float32"
    gemm: str = "jax_ops"  # projections and MLP through jax_ops.linear, or "xla" (x @ w)
    implementation: str | None = None  # the attention kernels' (None: the platform's default)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


# ---------------------------------------------------------------------------------------------------- model


def init_params(cfg: Config, key: jax.Array) -> dict:
    """float32 parameters of the embeddings, one attention + MLP block and the output projection."""

    def dense(k, fan_in, shape):
        return jax.random.normal(k, shape, jnp.float32) / math.sqrt(fan_in)

    d, n, kv, h = cfg.dim, cfg.heads, cfg.kv_heads, cfg.head_dim
    k = jax.random.split(key, 9)
    return {
        "tok_emb": jax.random.normal(k[0], (cfg.vocab, d), jnp.float32),
        "pos_emb": 0.1 * jax.random.normal(k[1], (cfg.seq, d), jnp.float32),
        "norm1": jnp.ones((d,), jnp.float32),
        "wq": dense(k[2], d, (d, n * h)),
        "wk": dense(k[3], d, (d, kv * h)),
        "wv": dense(k[4], d, (d, kv * h)),
        "wo": dense(k[5], n * h, (n * h, d)) / math.sqrt(2),  # two residual branches
        "norm2": jnp.ones((d,), jnp.float32),
        "w_in": dense(k[6], d, (d, 4 * d)),
        "w_out": dense(k[7], 4 * d, (4 * d, d)) / math.sqrt(2),
        "norm_f": jnp.ones((d,), jnp.float32),
        "unembed": dense(k[8], d, (d, cfg.vocab)),
    }


def _rms_norm(scale: jax.Array, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6) * scale).astype(x.dtype)


def _dense(cfg: Config, x: jax.Array, w: jax.Array, activation: str | None = None) -> jax.Array:
    w = w.astype(x.dtype)
    if cfg.gemm == "jax_ops":
        return jax_ops.linear(x, w, activation=activation)
    return jax.nn.gelu(x @ w) if activation == "gelu_tanh" else x @ w


AttentionFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def loss_fn(cfg: Config, attention: AttentionFn, params: dict, inputs, targets, positions) -> jax.Array:
    """Mean next-token cross-entropy (float32) of ``inputs [B, T]`` against ``targets [B, T]``; ``positions [T]``
    are the rows' global positions (a permutation of 0..T-1 in the zigzag layout)."""
    dt = jnp.dtype(cfg.dtype)
    b, t = inputs.shape
    x = (params["tok_emb"][inputs] + params["pos_emb"][positions]).astype(dt)
    y = _rms_norm(params["norm1"], x)
    q = _dense(cfg, y, params["wq"]).reshape(b, t, cfg.heads, cfg.head_dim)  # BTNH
    k = _dense(cfg, y, params["wk"]).reshape(b, t, cfg.kv_heads, cfg.head_dim)
    v = _dense(cfg, y, params["wv"]).reshape(b, t, cfg.kv_heads, cfg.head_dim)
    x = x + _dense(cfg, attention(q, k, v).reshape(b, t, cfg.dim), params["wo"])
    x = x + _dense(
        cfg, _dense(cfg, _rms_norm(params["norm2"], x), params["w_in"], "gelu_tanh"), params["w_out"]
    )
    logits = (_rms_norm(params["norm_f"], x) @ params["unembed"].astype(dt)).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def ring(cfg: Config, mesh: Mesh, layout: str) -> AttentionFn:
    """Causal attention with T and S sharded over the mesh's "seq" axis: K/V blocks rotate around the ring."""

    def attention(q, k, v):
        return attn.ring_attention(
            q,
            k,
            v,
            mesh=mesh,
            seq_axis="seq",
            layout=layout,
            is_causal=True,
            implementation=cfg.implementation,
        )

    return attention


def single_device(cfg: Config) -> AttentionFn:
    def attention(q, k, v):
        return jax_ops.dot_product_attention(q, k, v, is_causal=True, implementation=cfg.implementation)

    return attention


def make_step(cfg: Config, attention: AttentionFn, lr: float, **jit_kwargs):
    """(params, inputs, targets, positions) -> (updated params, loss, grads): one SGD step, jitted."""

    def step(params, inputs, targets, positions):
        loss, grads = jax.value_and_grad(functools.partial(loss_fn, cfg, attention))(
            params, inputs, targets, positions
        )
        params = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)
        return params, loss, grads

    return jax.jit(step, **jit_kwargs)


# ------------------------------------------------------------------------------------------------- data


def batch(cfg: Config, batch_size: int, key: jax.Array) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) [B, seq] int32: a random first token, then each token is the previous one + 1 (mod vocab)."""
    start = np.asarray(jax.random.randint(key, (batch_size, 1), 0, cfg.vocab))
    tokens = (start + np.arange(cfg.seq + 1)[None, :]) % cfg.vocab
    return tokens[:, :-1].astype(np.int32), tokens[:, 1:].astype(np.int32)


# ------------------------------------------------------------------------------------------------- main


def _grad_difference(grads, grads_ref) -> tuple[float, float]:
    """(max |Δg| over every leaf, max over leaves of max |Δg| / max |g_ref|)."""
    abs_max, rel_max = 0.0, 0.0
    for g, g_ref in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_ref)):
        diff = float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(g_ref, np.float64))))
        abs_max = max(abs_max, diff)
        rel_max = max(rel_max, diff / max(float(np.max(np.abs(np.asarray(g_ref, np.float64)))), 1e-30))
    return abs_max, rel_max


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument(
        "--seq", type=int, default=1024, help="global sequence length (a multiple of 2 x devices for zigzag)"
    )
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA); default heads // 2")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument(
        "--dtype", choices=list(GRAD_TOL), default="float32", help="activations (params: float32)"
    )
    ap.add_argument("--layout", choices=["zigzag", "contiguous"], default="zigzag")
    ap.add_argument(
        "--implementation", choices=["ffi", "xla"], default=None, help="attention; default: platform's"
    )
    ap.add_argument("--gemm", choices=["jax_ops", "xla"], default="jax_ops", help="projections and MLP")
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    devices = jax.devices()
    shards = len(devices)
    kv_heads = args.kv_heads if args.kv_heads is not None else max(1, args.heads // 2)
    if args.dim % args.heads or args.heads % kv_heads:
        ap.error(
            f"--dim ({args.dim}) must be a multiple of --heads ({args.heads}), and --heads of --kv-heads"
        )
    # The sequence is cut into equal chunks: one per device, two in the zigzag layout.
    chunks = 2 * shards if args.layout == "zigzag" else shards
    if args.seq % chunks:
        ap.error(
            f"--seq ({args.seq}) must be a multiple of {chunks} ({shards} devices, {args.layout} layout)"
        )
    cfg = Config(
        vocab=args.vocab, seq=args.seq, dim=args.dim, heads=args.heads, kv_heads=kv_heads, dtype=args.dtype,
        gemm=args.gemm, implementation=args.implementation,
    )  # fmt: skip
    print(
        f"{shards} {devices[0].platform} devices: seq {cfg.seq} ({cfg.seq // shards} positions per device, "
        f"{args.layout} layout), batch {args.batch}, dim {cfg.dim}, {cfg.heads} heads / {cfg.kv_heads} kv heads "
        f"of {cfg.head_dim}, {cfg.dtype}, SGD lr {args.lr:g}"
    )

    mesh = Mesh(np.asarray(devices), ("seq",))
    replicated = NamedSharding(mesh, P())
    by_seq = NamedSharding(mesh, P(None, "seq"))
    ring_step = make_step(
        cfg, ring(cfg, mesh, args.layout), args.lr, out_shardings=(replicated, replicated, replicated)
    )
    single_step = make_step(cfg, single_device(cfg), args.lr)
    # Rows in the order the shards hold them: permuted once here, so the model sees no difference.
    order = attn.zigzag_order(cfg.seq, shards) if args.layout == "zigzag" else np.arange(cfg.seq)
    positions = jax.device_put(order.astype(np.int32), NamedSharding(mesh, P("seq")))

    key_params, key_data = jax.random.split(jax.random.key(args.seed))
    params = jax.device_put(init_params(cfg, key_params), replicated)
    one_device = devices[0]
    tol = GRAD_TOL[cfg.dtype]
    losses, losses_ref, loss_diffs, grad_diffs, times = [], [], [], [], []
    print(
        f"step  {'loss (ring)':>12}  {'loss (1 dev)':>12}  {'|Δ loss|':>9}  {'max |Δ grad|':>12}  {'rel':>8}"
    )
    for i, key in enumerate(jax.random.split(key_data, args.steps)):
        inputs, targets = batch(cfg, args.batch, key)
        t0 = time.perf_counter()
        new_params, loss, grads = ring_step(
            params,
            jax.device_put(inputs[:, order], by_seq),
            jax.device_put(targets[:, order], by_seq),
            positions,
        )
        loss = float(loss)  # blocks on the step
        times.append(time.perf_counter() - t0)
        # The same step on one device, natural order, from the same parameters.
        _, loss_ref, grads_ref = single_step(
            jax.device_put(params, one_device),
            *jax.device_put((inputs, targets, np.arange(cfg.seq, dtype=np.int32)), one_device),
        )
        grad_abs, grad_rel = _grad_difference(grads, grads_ref)
        losses.append(loss)
        losses_ref.append(float(loss_ref))
        loss_diffs.append(abs(loss - float(loss_ref)))
        grad_diffs.append(grad_rel)
        print(
            f"{i:4d}  {loss:12.6f}  {float(loss_ref):12.6f}  {loss_diffs[-1]:9.2e}  {grad_abs:12.3e}  {grad_rel:8.1e}"
        )
        params = new_params

    steady = times[1:] or times
    print(
        f"ring step: {statistics.median(steady) * 1e3:.1f} ms (first step incl. compile {times[0]:.2f} s); "
        f"max |Δ loss| {max(loss_diffs):.2e}, max relative |Δ grad| {max(grad_diffs):.1e} (tolerance {tol:g})"
    )
    assert max(grad_diffs) <= tol, f"gradients differ from the single-device step by {max(grad_diffs):.1e}"
    assert max(loss_diffs) <= tol * max(1.0, max(losses_ref)), f"losses differ by {max(loss_diffs):.2e}"
    print("PASS")
    return {
        "losses": losses,
        "losses_single_device": losses_ref,
        "loss_diff_max": max(loss_diffs),
        "grad_rel_diff_max": max(grad_diffs),
        "devices": shards,
    }


if __name__ == "__main__":
    main()
