"""Suite ``attention``: jax_ops.dot_product_attention vs jax.nn (cuDNN, XLA) and torch SDPA (flash, cuDNN).

Cases: B=1, H=32, D=128 (and D=64), GQA H=32/K=8, N = 512 ... 16384, causal and not, fp16/bf16, forward and
forward+backward; decode (T = 1 new token, S = 8192 / 32768 cached keys, GQA 32/8, forward only, with the K/V
read rate ``kv_GBps``). FLOPs: non-causal forward 4·B·H·T·S·D, causal forward 2·B·H·T·S·D; backward 2.5x forward
(so fwd+bwd = 3.5x forward). Each row: time, TFLOP/s, ratio to cuDNN, compiled temp memory, and the max-abs / relative
L2 error of the forward output against an fp32 reference (the XLA path in fp32, skipped when too large).
Our rows are skipped with a note when the build has no CUDA attention target (on CPU the CPU twin runs);
XLA rows whose temp memory would exceed ~20 GiB are skipped.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_ops import _ffi, attention
from jax_ops._src.attention.heuristics import FWD_TARGET
from jax_ops.bench.harness import compiled_temp_bytes, rel_l2, time_loop

XLA_TEMP_LIMIT = 20 * 2**30


def _cases(quick: bool, on_gpu: bool):
    if not on_gpu:  # tiny sizes: the CPU twin and XLA on the host (checks the suite runs)
        return [
            dict(H=4, K=4, D=32, N=n, causal=c, dtype=jnp.float16) for n in (64, 128) for c in (False, True)
        ]
    if quick:  # the headline cases only (bf16, D=128), so a GPU check stays within a few minutes
        cases = [
            dict(H=32, K=32, D=128, N=n, causal=c, dtype=jnp.bfloat16)
            for c in (True, False)
            for n in (1024, 4096, 8192)
        ]
        cases.append(dict(H=32, K=8, D=128, N=4096, causal=True, dtype=jnp.bfloat16))
        cases.append(dict(H=32, K=32, D=64, N=4096, causal=True, dtype=jnp.bfloat16))
        cases.append(_decode_case(32768))
        return cases
    lengths = [512, 1024, 2048, 4096, 8192, 16384]
    cases = []
    for dtype in (jnp.float16, jnp.bfloat16):
        for causal in (False, True):
            for n in lengths:
                cases.append(dict(H=32, K=32, D=128, N=n, causal=causal, dtype=dtype))
    for n in lengths[:4]:
        cases.append(dict(H=32, K=32, D=64, N=n, causal=True, dtype=jnp.bfloat16))
        cases.append(dict(H=32, K=8, D=128, N=n, causal=True, dtype=jnp.bfloat16))
    cases += [_decode_case(s) for s in (8192, 32768)]
    return cases


def _decode_case(s: int) -> dict:
    """One new token (T = 1) against S cached keys, GQA 32/8: memory-bound (the split-KV path); forward only,
    with GB/s of K/V read."""
    return dict(H=32, K=8, D=128, N=s, T=1, causal=False, dtype=jnp.bfloat16, fwd_only=True)


def _case_name(c) -> str:
    shape = f"N={c['N']}" if c.get("T", c["N"]) == c["N"] else f"T={c['T']} S={c['N']}"
    causal = "causal" if c["causal"] else "full"
    return f"{shape} H={c['H']}/{c['K']} D={c['D']} {causal} {jnp.dtype(c['dtype']).name}"


def _flops(c, bwd: bool) -> float:
    fwd = (2 if c["causal"] else 4) * c["H"] * c.get("T", c["N"]) * c["N"] * c["D"]
    return fwd * (3.5 if bwd else 1.0)


def _torch_fns(c):
    """torch SDPA with the flash and cuDNN backends, or {} when torch (CUDA) is missing."""
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}
    dt = torch.float16 if c["dtype"] == jnp.float16 else torch.bfloat16
    q = torch.randn(1, c["H"], c["N"], c["D"], device="cuda", dtype=dt)
    k = torch.randn(1, c["K"], c["N"], c["D"], device="cuda", dtype=dt)
    fns = {}
    for name, backend in (
        ("torch_flash", SDPBackend.FLASH_ATTENTION),
        ("torch_cudnn", SDPBackend.CUDNN_ATTENTION),
    ):

        def run(backend=backend):
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, k, is_causal=c["causal"], enable_gqa=c["K"] != c["H"]
                )

        fns[name] = (run, torch)
    return fns


def _time_torch(run, torch) -> float:
    import statistics
    import time

    run()
    torch.cuda.synchronize()
    reps = 20
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            run()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / reps)
    return statistics.median(times)


def _make_fn(causal: bool, implementation: str, bwd: bool):
    """The timed function: forward, or forward+backward (grads of q, k, v)."""

    def fwd(q, k, v):
        if implementation == "cudnn":
            return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
        return attention.dot_product_attention(q, k, v, is_causal=causal, implementation=implementation)

    if not bwd:
        return fwd
    return jax.grad(lambda q, k, v: jnp.sum(fwd(q, k, v).astype(jnp.float32)), (0, 1, 2))


def _make_step(fn, bwd: bool):
    def step(carry, k, v):
        out = fn(carry, k, v)
        out = out[0] if bwd else out
        return carry + (out * 1e-6).astype(carry.dtype)  # tiny dependency: XLA cannot hoist the call

    return step


def run(ctx) -> list[dict]:
    on_gpu = jax.default_backend() == "gpu"
    have_ours = (not on_gpu) or FWD_TARGET in _ffi.target_names("CUDA")
    cases = [c for c in _cases(ctx.quick, on_gpu) if ctx.selected(_case_name(c))]
    impls = ["jax_ops", "cudnn", "xla"] if on_gpu else ["jax_ops", "xla"]
    rows = []
    progress = ctx.progress(sum(1 if c.get("fwd_only") else 2 for c in cases), "attention", rows)
    for c in cases:
        H, K, D, N, dt = c["H"], c["K"], c["D"], c["N"], c["dtype"]
        T = c.get("T", N)
        keys = jax.random.split(jax.random.key(N), 3)
        q = jax.random.normal(keys[0], (1, T, H, D), jnp.float32).astype(dt)
        k = jax.random.normal(keys[1], (1, N, K, D), jnp.float32).astype(dt)
        v = jax.random.normal(keys[2], (1, N, K, D), jnp.float32).astype(dt)
        name = _case_name(c)
        kv_bytes = 2 * N * K * D * jnp.dtype(dt).itemsize
        ref = None
        if (H * T * N * 4) * 3 < XLA_TEMP_LIMIT:
            ref = jax.jit(_make_fn(c["causal"], "xla", False))(*(x.astype(jnp.float32) for x in (q, k, v)))
        for bwd in (False, True) if not c.get("fwd_only") else (False,):
            mode = "fwd+bwd" if bwd else "fwd"
            times: dict[str, float | None] = {}
            for impl in impls:
                row = {"case": name, "mode": mode, "impl": impl, "time_us": None}
                implementation = {"jax_ops": "ffi", "cudnn": "cudnn", "xla": "xla"}[impl]

                fn = _make_fn(c["causal"], implementation, bwd)

                if impl == "jax_ops" and not have_ours:
                    row["note"] = "no CUDA attention target in this build (built without CUDA)"
                    rows.append(row)
                    continue
                if impl == "xla" and ctx.quick and N > 4096:
                    row["note"] = "skipped in --quick (the XLA target is measured at N = 4096)"
                    rows.append(row)
                    continue
                temp = compiled_temp_bytes(fn, q, k, v)
                if impl == "xla" and (temp is None or temp > XLA_TEMP_LIMIT):
                    row["note"] = f"skipped: XLA temp memory {temp and temp / 2**30:.1f} GiB > 20 GiB"
                    rows.append(row)
                    continue
                try:
                    t = time_loop(_make_step(fn, bwd), q, k, v)
                except Exception as e:  # noqa: BLE001 - e.g. cuDNN rejecting a shape
                    row["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
                    rows.append(row)
                    continue
                times[impl] = t
                row.update(time_us=t * 1e6, TFLOPs=_flops(c, bwd) / t / 1e12, temp_MiB=(temp or 0) / 2**20)
                if c.get("fwd_only"):
                    row["kv_GBps"] = kv_bytes / t / 1e9
                if not bwd and ref is not None:
                    out = jax.jit(fn)(q, k, v)
                    row["max_abs_err"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)))
                    row["rel_l2_err"] = rel_l2(out, ref)
                rows.append(row)
            for name_t, (run_t, torch) in (_torch_fns(c) if T == N else {}).items():
                row = {"case": name, "mode": mode, "impl": name_t, "time_us": None}
                if bwd:
                    row["note"] = "fwd only"
                else:
                    try:
                        t = _time_torch(run_t, torch)
                        times[name_t] = t
                        row.update(time_us=t * 1e6, TFLOPs=_flops(c, False) / t / 1e12)
                    except Exception as e:  # noqa: BLE001
                        row["note"] = f"failed: {type(e).__name__}"
                rows.append(row)
            for row in rows:
                if row["case"] == name and row["mode"] == mode and row.get("time_us") and "cudnn" in times:
                    row["vs_cudnn"] = times["cudnn"] / (row["time_us"] / 1e6)
            progress.step(f"{name} {mode}")
    if not any(r["impl"].startswith("torch") for r in rows):
        rows.append(
            {"case": "-", "impl": "torch", "time_us": None, "note": "torch (CUDA) not importable: skipped"}
        )
    return rows


__all__ = ["run"]
