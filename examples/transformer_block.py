"""A small pre-norm transformer trained for a few steps with ``jax_ops.dot_product_attention``.

Plain JAX (no Flax, no optax): token + position embedding -> [norm -> causal multi-head self-attention (BTNH
layout, grouped-query when ``--kv-heads`` < ``--heads``) -> residual -> norm -> MLP -> residual] x layers -> norm ->
logits, cross-entropy on random sequences that follow a learnable rule (next token = (token + 1) % vocab, from a
random first token), trained by a hand-written Adam (or SGD) step under ``jax.jit``.

    python examples/transformer_block.py                      # CPU-sized defaults, a few seconds
    python examples/transformer_block.py --compare            # also the same step with jax.nn attention
    python examples/transformer_block.py --dtype bfloat16 --seq 2048 --dim 1024 --heads 8 --kv-heads 8 \\
        --layers 4 --batch 4 --compare                        # GPU-sized (jax.nn side: cuDNN)

The projections and the MLP run through ``jax_ops.linear`` / ``jax_ops.gated_linear`` (``--gemm xla``: the plain
``x @ w`` expressions). ``--compare`` trains a second copy from the same initial parameters on the same batches with
``jax.nn.dot_product_attention`` (``implementation=None`` on the CPU, ``"cudnn"`` on a GPU for float16/bfloat16)
and XLA's GEMMs, and prints ms/step for both and both loss curves. Parameters and optimizer state are float32; ``--dtype`` sets
the activations' dtype (attention, matmuls); the loss is computed in float32.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import jax_ops


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 64
    seq: int = 32
    dim: int = 64
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    mlp: str = "swiglu"  # or "gelu"
    norm: str = "rms"  # or "layer"
    dtype: str = "float32"
    gemm: str = "jax_ops"  # projections and MLP through jax_ops.linear / gated_linear, or "xla" (x @ w)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def hidden(self) -> int:
        return 4 * self.dim if self.mlp == "gelu" else (8 * self.dim) // 3


# ---------------------------------------------------------------------------------------------------- model


def init_params(cfg: Config, key: jax.Array) -> dict:
    """float32 parameters: embeddings, per-layer attention/MLP weights and norms, the output projection."""

    def dense(k, fan_in, shape, gain=1.0):
        return gain * jax.random.normal(k, shape, jnp.float32) / math.sqrt(fan_in)

    def norm_params():
        p = {"scale": jnp.ones((cfg.dim,), jnp.float32)}
        if cfg.norm == "layer":
            p["bias"] = jnp.zeros((cfg.dim,), jnp.float32)
        return p

    d, h, n, kv, f = cfg.dim, cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.hidden
    out_gain = 1.0 / math.sqrt(2 * cfg.layers)  # residual branches summed over layers
    keys = jax.random.split(key, 3 + cfg.layers)
    layers = []
    for lk in keys[3:]:
        k = jax.random.split(lk, 7)
        mlp = (
            {
                "w_gate": dense(k[4], d, (d, f)),
                "w_up": dense(k[5], d, (d, f)),
                "w_down": dense(k[6], f, (f, d), out_gain),
            }
            if cfg.mlp == "swiglu"
            else {
                "w_in": dense(k[4], d, (d, f)),
                "b_in": jnp.zeros((f,), jnp.float32),
                "w_out": dense(k[6], f, (f, d), out_gain),
                "b_out": jnp.zeros((d,), jnp.float32),
            }
        )
        layers.append(
            {
                "norm1": norm_params(),
                "wq": dense(k[0], d, (d, n * h)),
                "wk": dense(k[1], d, (d, kv * h)),
                "wv": dense(k[2], d, (d, kv * h)),
                "wo": dense(k[3], n * h, (n * h, d), out_gain),
                "norm2": norm_params(),
                "mlp": mlp,
            }
        )
    return {
        "tok_emb": jax.random.normal(keys[0], (cfg.vocab, d), jnp.float32),
        "pos_emb": 0.1 * jax.random.normal(keys[1], (cfg.seq, d), jnp.float32),
        "layers": layers,
        "norm_f": norm_params(),
        "unembed": dense(keys[2], d, (d, cfg.vocab)),
    }


def _norm(cfg: Config, p: dict, x: jax.Array) -> jax.Array:
    """RMSNorm or LayerNorm, statistics in float32, output in x's dtype."""
    x32 = x.astype(jnp.float32)
    if cfg.norm == "layer":
        x32 = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6) * p["scale"]
    if "bias" in p:
        y = y + p["bias"]
    return y.astype(x.dtype)


def _dense(cfg: Config, x: jax.Array, w: jax.Array, bias=None, activation: str | None = None) -> jax.Array:
    """act(x @ w + bias) in x's dtype: jax_ops.linear (one kernel) or the jnp expression (--gemm xla)."""
    w = w.astype(x.dtype)
    if cfg.gemm == "jax_ops":
        return jax_ops.linear(x, w, bias, activation=activation)
    y = x @ w if bias is None else x @ w + bias.astype(x.dtype)
    return jax.nn.gelu(y) if activation == "gelu_tanh" else y


def _mlp(cfg: Config, p: dict, x: jax.Array) -> jax.Array:
    dt = x.dtype
    if cfg.mlp == "swiglu":
        if cfg.gemm == "jax_ops":
            hdn = jax_ops.gated_linear(x, p["w_gate"].astype(dt), p["w_up"].astype(dt))
        else:
            hdn = jax.nn.silu(x @ p["w_gate"].astype(dt)) * (x @ p["w_up"].astype(dt))
        return _dense(cfg, hdn, p["w_down"])
    hdn = _dense(cfg, x, p["w_in"], p["b_in"], activation="gelu_tanh")
    return _dense(cfg, hdn, p["w_out"], p["b_out"])


AttentionFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def forward(cfg: Config, attention: AttentionFn, params: dict, tokens: jax.Array) -> jax.Array:
    """tokens [B, T] int32 -> logits [B, T, vocab] float32."""
    dt = jnp.dtype(cfg.dtype)
    b, t = tokens.shape
    x = (params["tok_emb"][tokens] + params["pos_emb"][:t]).astype(dt)
    for p in params["layers"]:
        y = _norm(cfg, p["norm1"], x)
        q = _dense(cfg, y, p["wq"]).reshape(b, t, cfg.heads, cfg.head_dim)  # BTNH
        k = _dense(cfg, y, p["wk"]).reshape(b, t, cfg.kv_heads, cfg.head_dim)  # BSKH
        v = _dense(cfg, y, p["wv"]).reshape(b, t, cfg.kv_heads, cfg.head_dim)
        o = attention(q, k, v).reshape(b, t, cfg.heads * cfg.head_dim)
        x = x + _dense(cfg, o, p["wo"])
        x = x + _mlp(cfg, p["mlp"], _norm(cfg, p["norm2"], x))
    x = _norm(cfg, params["norm_f"], x)
    return (x @ params["unembed"].astype(dt)).astype(jnp.float32)


def loss_fn(cfg: Config, attention: AttentionFn, params: dict, tokens: jax.Array) -> jax.Array:
    """Mean next-token cross-entropy (float32)."""
    logits = forward(cfg, attention, params, tokens[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.mean(nll)


# -------------------------------------------------------------------------------------------- attention


def ours(q, k, v):
    return jax_ops.dot_product_attention(q, k, v, is_causal=True)


def jax_nn_implementation(dtype: str) -> str | None:
    """What the comparison uses: cuDNN on a GPU for half precision, else jax.nn's default (XLA)."""
    if jax.default_backend() == "gpu" and dtype in ("float16", "bfloat16"):
        return "cudnn"
    return None


def jax_nn(implementation: str | None) -> AttentionFn:
    def attention(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)

    return attention


# -------------------------------------------------------------------------------------------- optimizer


def adam_init(params: dict) -> dict:
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    return {"m": zeros, "v": zeros, "t": jnp.zeros((), jnp.int32)}


def adam_update(params, grads, state, lr, b1=0.9, b2=0.98, eps=1e-8):
    t = state["t"] + 1
    m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    c1 = 1 - b1 ** t.astype(jnp.float32)
    c2 = 1 - b2 ** t.astype(jnp.float32)
    params = jax.tree_util.tree_map(
        lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps), params, m, v
    )
    return params, {"m": m, "v": v, "t": t}


def sgd_update(params, grads, state, lr):
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), state


def make_train_step(cfg: Config, attention: AttentionFn, optimizer: str, lr: float):
    update = adam_update if optimizer == "adam" else sgd_update

    @jax.jit
    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(functools.partial(loss_fn, cfg, attention))(params, tokens)
        params, opt_state = update(params, grads, opt_state, lr)
        return params, opt_state, loss

    return step


# ------------------------------------------------------------------------------------------------- data


def batch(cfg: Config, batch_size: int, key: jax.Array) -> jax.Array:
    """[B, seq + 1] int32: a random first token, then each token is the previous one + 1 (mod vocab)."""
    start = jax.random.randint(key, (batch_size, 1), 0, cfg.vocab)
    return (start + jnp.arange(cfg.seq + 1)[None, :]) % cfg.vocab


# ------------------------------------------------------------------------------------------------- main


def train(cfg, attention, params, batches, optimizer, lr):
    """Trains from ``params``; returns (losses, seconds per step after the first call, compile+first seconds)."""
    step = make_train_step(cfg, attention, optimizer, lr)
    opt_state = adam_init(params) if optimizer == "adam" else {}
    losses, times = [], []
    for tokens in batches:
        t0 = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, tokens)
        losses.append(float(loss))  # blocks on the step
        times.append(time.perf_counter() - t0)
    steady = times[1:] or times
    return losses, statistics.median(steady), times[0]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=None, help="key/value heads (GQA); default heads // 2")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--mlp", choices=["swiglu", "gelu"], default="swiglu")
    ap.add_argument("--norm", choices=["rms", "layer"], default="rms")
    ap.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    ap.add_argument("--lr", type=float, default=None, help="default 3e-3 (adam) or 0.3 (sgd)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gemm", choices=["jax_ops", "xla"], default="jax_ops", help="projections and MLP")
    ap.add_argument(
        "--compare", action="store_true", help="also train with jax.nn.dot_product_attention and XLA's GEMMs"
    )
    args = ap.parse_args(argv)

    kv_heads = args.kv_heads if args.kv_heads is not None else max(1, args.heads // 2)
    if args.dim % args.heads or args.heads % kv_heads:
        ap.error(
            f"--dim ({args.dim}) must be a multiple of --heads ({args.heads}), and --heads of --kv-heads"
        )
    if args.steps < 2:
        ap.error("--steps must be >= 2 (the loss is compared between the first and the last step)")
    cfg = Config(
        vocab=args.vocab, seq=args.seq, dim=args.dim, heads=args.heads, kv_heads=kv_heads, layers=args.layers,
        mlp=args.mlp, norm=args.norm, dtype=args.dtype, gemm=args.gemm,
    )  # fmt: skip
    lr = args.lr if args.lr is not None else (3e-3 if args.optimizer == "adam" else 0.3)
    key_params, key_data = jax.random.split(jax.random.key(args.seed))
    params = init_params(cfg, key_params)
    batches = [batch(cfg, args.batch, k) for k in jax.random.split(key_data, args.steps)]
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(params))
    print(
        f"{jax.default_backend()}: {cfg.layers} layers, dim {cfg.dim}, {cfg.heads} heads / {cfg.kv_heads} kv "
        f"heads of {cfg.head_dim}, {cfg.mlp}, {cfg.norm}norm, {cfg.dtype}, batch {args.batch} x seq {cfg.seq}, "
        f"{n_params / 1e6:.2f}M params, {args.optimizer} lr {lr:g}"
    )

    runs = {"jax_ops": (ours, cfg)}
    if args.compare:
        impl = jax_nn_implementation(cfg.dtype)
        runs[f"jax.nn ({impl or 'default'}) + XLA"] = (jax_nn(impl), dataclasses.replace(cfg, gemm="xla"))
    results = {}
    for name, (attention, run_cfg) in runs.items():
        losses, sec, first = train(run_cfg, attention, params, batches, args.optimizer, lr)
        results[name] = {"losses": losses, "ms_per_step": sec * 1e3, "first_step_s": first}
        print(f"{name:>22}: {sec * 1e3:8.2f} ms/step (first step incl. compile {first:.2f} s)")

    every = max(1, args.steps // 10)
    shown = sorted(set(range(0, args.steps, every)) | {args.steps - 1})
    print("step  " + "  ".join(f"{name:>22}" for name in results))
    for i in shown:
        print(f"{i:4d}  " + "  ".join(f"{r['losses'][i]:22.4f}" for r in results.values()))
    for name, r in results.items():
        start, end = r["losses"][0], r["losses"][-1]
        print(f"{name}: loss {start:.4f} -> {end:.4f}")
        assert end < start, f"{name}: the loss did not decrease ({start:.4f} -> {end:.4f})"
    if args.compare:
        (a, ra), (b, rb) = results.items()
        print(f"{a} / {b} time per step: {ra['ms_per_step'] / rb['ms_per_step']:.2f}x")
    return results


if __name__ == "__main__":
    main()
