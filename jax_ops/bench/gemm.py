"""GEMM + epilogue suite: jax_ops.linear / gated_linear against the same expression in jnp under jit (XLA →
cuBLASLt) and, when importable, tokamax's fused gated_linear_unit (../shared/peers).

Each timed step feeds its whole output back as the loop carry (its first element, times zero, is added to the
input), so nothing the kernel writes can be dropped and both sides pay the same tiny elementwise pass.
Large shapes report TFLOP/s; decode shapes (M <= 64) TB/s of weight reads. Large shapes are also timed forward +
backward (``mode`` "fwd+bwd": the gradients w.r.t. x and every weight, bias and residual; dx feeds the carry and
every other gradient is consumed through a scalar; counted as 3x the forward FLOPs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

import jax_ops
from jax_ops.bench.harness import import_peers, rel_l2, time_loop

# (M, N, K): LLM projections and decode steps (M tokens, weights K x N).
LARGE = [(8192, 8192, 8192), (4096, 11008, 4096), (4096, 4096, 11008), (16384, 4096, 4096)]
DECODE = [(m, n, k) for m in (1, 4, 16, 64, 128) for n, k in ((4096, 4096), (11008, 4096), (14336, 8192))]
KINDS = ("plain", "bias_gelu", "bias_gelu_res", "swiglu")


def _cases(quick: bool):
    large = LARGE[:2] if quick else LARGE
    decode = [c for c in DECODE if c[0] in (1, 16)] if quick else DECODE
    for dtype in (jnp.bfloat16,) if quick else (jnp.bfloat16, jnp.float16):
        for m, n, k in large + decode:
            for kind in KINDS:
                yield {"M": m, "N": n, "K": k, "kind": kind, "dtype": dtype}


def _name(c) -> str:
    return f"{c['kind']} M{c['M']} N{c['N']} K{c['K']} {jnp.dtype(c['dtype']).name}"


def _fns(kind: str):
    """(jax_ops fn, jnp fn), each f(x, *weights) -> [M, N]."""
    if kind == "plain":
        return (lambda x, w: jax_ops.linear(x, w, implementation="ffi"), lambda x, w: x @ w)
    if kind == "bias_gelu":
        return (
            lambda x, w, b: jax_ops.linear(x, w, b, activation="gelu", implementation="ffi"),
            lambda x, w, b: jax.nn.gelu(x @ w + b.astype(x.dtype), approximate=False),
        )
    if kind == "bias_gelu_res":
        return (
            lambda x, w, b, r: jax_ops.linear(x, w, b, activation="gelu", residual=r, implementation="ffi"),
            lambda x, w, b, r: jax.nn.gelu(x @ w + b.astype(x.dtype), approximate=False) + r,
        )
    return (
        lambda x, wg, wu: jax_ops.gated_linear(x, wg, wu, implementation="ffi"),
        lambda x, wg, wu: jax.nn.silu(x @ wg) * (x @ wu),
    )


def _operands(c):
    m, n, k, dt = c["M"], c["N"], c["K"], c["dtype"]
    keys = jax.random.split(jax.random.key(m * 7 + n), 5)
    x = jax.random.normal(keys[0], (m, k), jnp.float32).astype(dt)
    w = (jax.random.normal(keys[1], (k, n), jnp.float32) / k**0.5).astype(dt)
    if c["kind"] == "plain":
        return x, (w,)
    if c["kind"] == "swiglu":
        return x, (w, (jax.random.normal(keys[2], (k, n), jnp.float32) / k**0.5).astype(dt))
    b = jax.random.normal(keys[3], (n,), jnp.float32)
    if c["kind"] == "bias_gelu":
        return x, (w, b)
    return x, (w, b, jax.random.normal(keys[4], (m, n), jnp.float32).astype(dt))


def _step(fn):
    def step(out, x, *weights):
        x = x + (out[0, 0] * 0).astype(x.dtype)
        return fn(x, *weights)

    return step


def _grad_step(fn):
    """Forward + backward of sum(fn): every gradient consumed (dx through the carry, the others as scalars)."""

    def step(x, *weights):
        argnums = tuple(range(1 + len(weights)))
        dx, *others = jax.grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32)), argnums)(x, *weights)
        return x + (1e-6 * (dx + sum(jnp.mean(g.astype(jnp.float32)) for g in others))).astype(x.dtype)

    return step


def _tokamax_glu():
    peers = import_peers()
    if peers is None:
        return None
    try:
        return peers.tokamax_glu("mosaic", fused=True)
    except Exception:  # noqa: BLE001 - every peer is optional
        return None


def run(ctx) -> list[dict]:
    on_gpu = jax.default_backend() == "gpu"
    rows: list[dict] = []
    cases = [c for c in _cases(ctx.quick) if ctx.selected(_name(c))]
    if not on_gpu:  # the CPU twin is a correctness twin: time a small shape only
        cases = [{"M": 256, "N": 256, "K": 256, "kind": k, "dtype": jnp.float32} for k in KINDS]
    glu = _tokamax_glu() if on_gpu else None
    progress = ctx.progress(len(cases), "gemm", rows)
    for c in cases:
        name, m, n, k = _name(c), c["M"], c["N"], c["K"]
        x, weights = _operands(c)
        ours, ref_fn = _fns(c["kind"])
        flops = 2 * m * n * k * (2 if c["kind"] == "swiglu" else 1)
        weight_bytes = (2 if c["kind"] == "swiglu" else 1) * k * n * jnp.dtype(c["dtype"]).itemsize
        ref = jax.jit(ref_fn)(x.astype(jnp.float32), *(w.astype(jnp.float32) for w in weights))
        impls = {"jax_ops": ours, "xla": ref_fn}
        if glu is not None and c["kind"] == "swiglu":
            impls["tokamax"] = glu  # f(x, w [K, 2, N])
        times = {}
        for impl, fn in impls.items():
            row = {"case": name, "impl": impl, "time_us": None}
            # tokamax takes the fused [K, 2, N] weight, built once outside the timed step.
            operands = (jnp.stack(weights, axis=1),) if impl == "tokamax" else weights
            try:
                out = jax.jit(fn)(x, *operands)
                t = time_loop(_step(fn), out, x, *operands)
            except Exception as e:  # noqa: BLE001 - e.g. a peer refusing a shape
                row["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:90]}"
                rows.append(row)
                continue
            times[impl] = t
            row.update(mode="fwd", time_us=t * 1e6, TFLOPs=flops / t / 1e12, rel_l2_err=rel_l2(out, ref))
            if m <= 128:
                row["weights_TBps"] = weight_bytes / t / 1e12
            rows.append(row)
        if m > 128:  # forward + backward of the large shapes (the tokamax GLU's backward is XLA's: not timed)
            for impl in ("jax_ops", "xla"):
                row = {"case": name, "impl": impl, "mode": "fwd+bwd", "time_us": None}
                try:
                    t = time_loop(_grad_step(impls[impl]), x, *weights)
                except Exception as e:  # noqa: BLE001
                    row["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:90]}"
                    rows.append(row)
                    continue
                times[impl + " fwd+bwd"] = t
                row.update(time_us=t * 1e6, TFLOPs=3 * flops / t / 1e12)
                rows.append(row)
        for row in rows:
            key = "xla" + (" fwd+bwd" if row.get("mode") == "fwd+bwd" else "")
            if row["case"] == name and row.get("time_us") and key in times:
                row["vs_xla"] = times[key] / (row["time_us"] / 1e6)
        progress.step(name)
    return rows


# --tune: the dtypes and epilogues whose classes have a candidate besides "auto" (tuning.py's "plain" and "lt").
TUNE_DTYPES = (jnp.bfloat16, jnp.float16, jnp.float8_e4m3fn, jnp.float32, "tf32", jnp.float64)
TUNE_CANDIDATES = ("auto", "cublaslt")


def _tune_cases(quick: bool):
    shapes = (LARGE[:2] + [c for c in DECODE if c[0] in (1, 16, 64)]) if quick else LARGE + DECODE
    for dtype in TUNE_DTYPES:
        kinds = ("plain", "bias_gelu_tanh") if dtype in (jnp.bfloat16, jnp.float16) else ("plain",)
        for m, n, k in shapes:
            for kind in kinds:
                yield {"M": m, "N": n, "K": k, "kind": kind, "dtype": dtype}


def _tune_fn(c):
    """(f(x, w), x, w, tuning class key) of one --tune case: linear(x [M, K], w) as a user calls it (fp8 weights
    stored [N, K], per-tensor scales; "tf32" = float32 with precision="tensorfloat32")."""
    from jax_ops._src.gemm import tuning
    from jax_ops._src.gemm.validation import Config

    m, n, k, dtype = c["M"], c["N"], c["K"], c["dtype"]
    tf32 = dtype == "tf32"
    dt = jnp.float32 if tf32 else dtype
    fp8 = jnp.dtype(dt).itemsize == 1
    keys = jax.random.split(jax.random.key(m * 7 + n), 3)
    x = jax.random.normal(keys[0], (m, k), jnp.float32).astype(dt)
    w = (jax.random.normal(keys[1], (n, k) if fp8 else (k, n), jnp.float32) / k**0.5).astype(dt)
    bias = jax.random.normal(keys[2], (n,), jnp.float32) if c["kind"] != "plain" else None
    act = "gelu_tanh" if c["kind"] != "plain" else None
    kw = dict(activation=act, implementation="ffi")
    if fp8:
        one = jnp.ones((), jnp.float32)
        kw.update(a_scale=one, b_scale=one, out_dtype=jnp.bfloat16, transpose_b=True)
    if tf32:
        kw["precision"] = "tensorfloat32"

    def fn(x, w):
        return jax_ops.gemm(x, w, bias=bias, **kw)

    cfg = Config(out_dtype=jnp.dtype(kw.get("out_dtype", dt)), activation=act or "identity", tf32=tf32)
    key = tuning.class_key(cfg, dt, m, n * k * jnp.dtype(dt).itemsize, bias is not None, False)
    return fn, x, w, key


def tune(ctx) -> list[dict]:
    """``--tune``: every candidate plan of each case, forced through the plan knob and timed like ``run``; per
    class the fastest plan against "auto" (tuning.best_plans) goes into the dispatch table file."""
    from jax_ops import gemm_ops
    from jax_ops._src import dispatch
    from jax_ops._src.gemm import tuning

    if jax.default_backend() != "gpu":
        raise SystemExit("--tune times the CUDA plans: it needs a GPU")
    device = dispatch.first_gpu()
    arch = tuning.arch_key(dispatch.compute_capability(device))
    cases = [c for c in _tune_cases(ctx.quick) if ctx.selected(_tune_name(c))]
    rows: list[dict] = []
    times: dict[str, dict[str, list[float]]] = {}
    progress = ctx.progress(len(cases), "gemm --tune", rows)
    for c in cases:
        fn, x, w, key = _tune_fn(c)
        per_plan = times.setdefault(key, {})
        for plan in TUNE_CANDIDATES:
            row = {"case": _tune_name(c), "impl": plan, "class": key, "time_us": None}
            rows.append(row)
            try:
                with gemm_ops.overrides(plan=plan):  # trace-time knob: both jits trace inside it
                    out = jax.jit(fn)(x, w)
                    t = time_loop(_step(fn), out, x, w)
            except Exception as e:  # noqa: BLE001 - a plan refusing the case: not a candidate of its class
                row["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:90]}"
                per_plan[plan] = []  # a plan that fails one shape of a class is out of that class
                continue
            if per_plan.get(plan) != []:
                per_plan.setdefault(plan, []).append(t)
            row["time_us"] = t * 1e6
        progress.step(_tune_name(c))
    chosen = tuning.best_plans(times)
    path = tuning.write_table(arch, chosen, device.device_kind)
    for row in rows:
        row["chosen"] = chosen.get(row["class"], "auto")
    print(f"gemm --tune: {len(chosen)} classes for {arch} written to {path}", flush=True)
    return rows


def _tune_name(c) -> str:
    dtype = c["dtype"] if isinstance(c["dtype"], str) else jnp.dtype(c["dtype"]).name
    return f"tune {c['kind']} M{c['M']} N{c['N']} K{c['K']} {dtype}"


__all__ = ["run", "tune"]
