"""Suite ``attention``: jax_ops.dot_product_attention vs jax.nn (cuDNN, XLA), torch SDPA (flash, cuDNN) and,
when importable (../shared/peers on PYTHONPATH), tokamax's Mosaic GPU kernel and FlashAttention-3 (dew).

Cases: B=1, H=32, D=128 (and D=64), GQA H=32/K=8, N = 512 ... 16384, causal and not, fp16/bf16, forward and
forward+backward; masked cases at B=4, T=S=4096, H=16, D=128 (a key-padding mask [B,1,1,S], the same padding
as ``key_value_seq_lengths``, a shared [1,1,T,S] mask, a [1,H,T,S] bias); decode (T = 1 new token, GQA 32/8,
forward only, with the K/V read rate ``kv_GBps``) at B = 1, 4, 16, 64 and S = 1k ... 32k. FLOPs: non-causal
forward 4·B·H·T·S·D, causal forward 2·B·H·T·S·D (masked cases counted as non-causal); backward 2.5x forward (so
fwd+bwd = 3.5x forward). The fwd+bwd step consumes every gradient (q, k, v and the bias). Each row: time,
TFLOP/s, ratio to cuDNN, compiled temp memory, and the max-abs / relative L2 error of the forward output against
an fp32 reference (the XLA path in fp32, skipped when too large). Our rows are skipped with a note when the build
has no CUDA attention target (on CPU the CPU twin runs); XLA rows whose temp memory would exceed ~20 GiB are
skipped; a peer that refuses a case gets a row with its reason.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops import _ffi, attention
from jax_ops._src.attention.heuristics import FWD_TARGET
from jax_ops.bench.harness import compiled_temp_bytes, import_peers, rel_l2, time_loop

XLA_TEMP_LIMIT = 20 * 2**30


def _cases(quick: bool, on_gpu: bool):
    if not on_gpu:  # tiny sizes: the CPU twin and XLA on the host (checks the suite runs; float32, which
        # jax.nn's XLA path takes on the CPU)
        return [
            dict(H=4, K=4, D=32, N=n, causal=c, dtype=jnp.float32) for n in (64, 128) for c in (False, True)
        ]
    if quick:  # the headline cases only (bf16, D=128), so a GPU check stays within a few minutes
        cases = [
            dict(H=32, K=32, D=128, N=n, causal=c, dtype=jnp.bfloat16)
            for c in (True, False)
            for n in (1024, 4096, 8192)
        ]
        cases.append(dict(H=32, K=8, D=128, N=4096, causal=True, dtype=jnp.bfloat16))
        cases.append(dict(H=32, K=32, D=64, N=4096, causal=True, dtype=jnp.bfloat16))
        cases += [_decode_case(s, b) for b in (1, 64) for s in (4096, 32768)]
        cases += [_masked_case(kind) for kind in MASKED_KINDS]
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
    cases += [_decode_case(s, b) for b in (1, 4, 16, 64) for s in (1024, 4096, 16384, 32768)]
    cases += [_masked_case(kind) for kind in MASKED_KINDS]
    return cases


def _decode_case(s: int, b: int = 1) -> dict:
    """One new token (T = 1) per request against S cached keys, GQA 32/8: memory-bound (the split-KV path);
    forward only, with GB/s of K/V read."""
    return dict(B=b, H=32, K=8, D=128, N=s, T=1, causal=False, dtype=jnp.bfloat16, fwd_only=True)


# Masked cases: "keys" a key-padding mask [B,1,1,S] (request b keeps its first S - b·S/8 keys), "lengths" the
# same padding as key_value_seq_lengths, "shared" a [1,1,T,S] random mask, "bias" a [1,H,T,S] additive bias.
MASKED_KINDS = ("keys", "lengths", "shared", "bias")


def _masked_case(kind: str) -> dict:
    return dict(B=4, H=16, K=16, D=128, N=4096, causal=False, dtype=jnp.bfloat16, masked=kind)


def _case_name(c) -> str:
    shape = f"N={c['N']}" if c.get("T", c["N"]) == c["N"] else f"T={c['T']} S={c['N']}"
    causal = "causal" if c["causal"] else "full"
    batch = f"B={c['B']} " if c.get("B", 1) != 1 else ""
    masked = f" {c['masked']}-masked" if c.get("masked") else ""
    return f"{batch}{shape} H={c['H']}/{c['K']} D={c['D']} {causal}{masked} {jnp.dtype(c['dtype']).name}"


def _flops(c, bwd: bool) -> float:
    fwd = (2 if c["causal"] else 4) * c.get("B", 1) * c["H"] * c.get("T", c["N"]) * c["N"] * c["D"]
    return fwd * (3.5 if bwd else 1.0)


def _extras(c, dtype):
    """(bias, mask, key_value_seq_lengths) of a case (None where it has none)."""
    kind, B, S, T = c.get("masked"), c.get("B", 1), c["N"], c.get("T", c["N"])
    lengths = np.asarray([S - b * S // 8 for b in range(B)], np.int32)
    if kind == "keys":
        return None, jnp.asarray(np.arange(S)[None, None, None, :] < lengths[:, None, None, None]), None
    if kind == "lengths":
        return None, None, jnp.asarray(lengths)
    if kind == "shared":
        return None, jnp.asarray(np.random.default_rng(0).random((1, 1, T, S)) < 0.9), None
    if kind == "bias":
        return jax.random.normal(jax.random.key(5), (1, c["H"], T, S), jnp.float32).astype(dtype), None, None
    return None, None, None


def _peer_fns(c) -> dict:
    """{name: f(q, k, v, bias, mask, kv_lengths)} of the peers that import (GPU only): tokamax's Mosaic GPU
    kernel and FlashAttention-3 (no bias or mask)."""
    fns = {}
    peers = import_peers()
    if peers is None:
        return fns
    try:
        tokamax = peers._tokamax()[0]

        def tk(q, k, v, bias, mask, kvl):
            return tokamax.dot_product_attention(
                q, k, v, bias=bias, mask=mask, is_causal=c["causal"], key_value_seq_lengths=kvl,
                implementation="mosaic",
            )  # fmt: skip

        fns["tokamax_mosaic"] = tk
        fa3 = peers.dew_fa3_attention(c["causal"])

        def dew(q, k, v, bias, mask, kvl):
            if bias is not None or mask is not None or kvl is not None:
                raise ValueError("FA3's FFI targets take no bias, mask or kv lengths")
            return fa3(q, k, v)

        fns["fa3"] = dew
    except Exception:  # noqa: BLE001 - every peer is optional
        pass
    return fns


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


def _make_fn(causal: bool, implementation, bwd: bool, bias=None, kvl=None):
    """The timed function f(q, k, v, bias, mask): forward, or forward+backward (grads of q, k, v and the bias).
    The mask is an operand, not a constant XLA would fold at compile time. ``implementation``: "cudnn" (jax.nn),
    "ffi" / "xla" (jax_ops), or a peer's f(q, k, v, bias, mask, kvl)."""

    def fwd(q, k, v, bias, mask):
        if callable(implementation):
            return implementation(q, k, v, bias, mask, kvl)
        kw = dict(is_causal=causal, key_value_seq_lengths=kvl)
        if implementation == "cudnn":
            return jax.nn.dot_product_attention(q, k, v, bias, mask, implementation="cudnn", **kw)
        return attention.dot_product_attention(q, k, v, bias, mask, implementation=implementation, **kw)

    if not bwd:
        return fwd
    argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
    return jax.grad(
        lambda q, k, v, bias, mask: jnp.sum(fwd(q, k, v, bias, mask).astype(jnp.float32)), argnums
    )


def _make_step(fn, bwd: bool):
    def step(carry, k, v, bias, mask):
        out = fn(carry, k, v, bias, mask)
        if bwd:  # dq feeds the carry; every other gradient is consumed through a scalar (none is dead code)
            dq, *others = out
            out = dq + sum(jnp.mean(g.astype(jnp.float32)) for g in others).astype(dq.dtype)
        return carry + (out * 1e-6).astype(carry.dtype)  # tiny dependency: XLA cannot hoist the call

    return step


def run(ctx) -> list[dict]:
    on_gpu = jax.default_backend() == "gpu"
    have_ours = (not on_gpu) or FWD_TARGET in _ffi.target_names("CUDA")
    cases = [c for c in _cases(ctx.quick, on_gpu) if ctx.selected(_case_name(c))]
    rows = []
    progress = ctx.progress(sum(1 if c.get("fwd_only") else 2 for c in cases), "attention", rows)
    any_peer = False
    for c in cases:
        B, H, K, D, N, dt = c.get("B", 1), c["H"], c["K"], c["D"], c["N"], c["dtype"]
        T = c.get("T", N)
        keys = jax.random.split(jax.random.key(N), 3)
        q = jax.random.normal(keys[0], (B, T, H, D), jnp.float32).astype(dt)
        k = jax.random.normal(keys[1], (B, N, K, D), jnp.float32).astype(dt)
        v = jax.random.normal(keys[2], (B, N, K, D), jnp.float32).astype(dt)
        bias, mask, kvl = _extras(c, dt)
        name = _case_name(c)
        kv_bytes = 2 * B * N * K * D * jnp.dtype(dt).itemsize
        # the fp32 reference: jax_ops' jnp path (dense, or in blocks when large), the same semantics
        f32 = [x.astype(jnp.float32) if x is not None else None for x in (q, k, v, bias)]
        ref = jax.jit(_make_fn(c["causal"], "xla", False, f32[3], kvl))(*f32, mask)
        # (row name, implementation): ours, jax.nn's cuDNN and XLA paths, the peers that import (GPU)
        impls = [("jax_ops", "ffi"), ("cudnn", "cudnn"), ("xla", _jax_nn_xla(c["causal"]))]
        impls = impls if on_gpu else [impls[0], impls[2]]
        peers = _peer_fns(c) if on_gpu else {}
        any_peer = any_peer or bool(peers)
        impls += list(peers.items())
        for bwd in (False, True) if not c.get("fwd_only") else (False,):
            mode = "fwd+bwd" if bwd else "fwd"
            times: dict[str, float | None] = {}
            for impl, implementation in impls:
                row = {"case": name, "mode": mode, "impl": impl, "time_us": None}
                fn = _make_fn(c["causal"], implementation, bwd, bias, kvl)
                if impl == "jax_ops" and not have_ours:
                    row["note"] = "no CUDA attention target in this build (built without CUDA)"
                    rows.append(row)
                    continue
                if impl == "xla" and ctx.quick and N > 4096:
                    row["note"] = "skipped in --quick (the XLA target is measured at N = 4096)"
                    rows.append(row)
                    continue
                temp = compiled_temp_bytes(fn, q, k, v, bias, mask)
                if impl == "xla" and (temp is None or temp > XLA_TEMP_LIMIT):
                    held = "unknown" if temp is None else f"{temp / 2**30:.1f} GiB"
                    row["note"] = f"skipped: XLA temp memory {held} > 20 GiB (or it did not compile)"
                    rows.append(row)
                    continue
                try:
                    t = time_loop(_make_step(fn, bwd), q, k, v, bias, mask)
                except Exception as e:  # noqa: BLE001 - e.g. cuDNN or a peer refusing a shape
                    row["note"] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
                    rows.append(row)
                    continue
                times[impl] = t
                row.update(time_us=t * 1e6, TFLOPs=_flops(c, bwd) / t / 1e12, temp_MiB=(temp or 0) / 2**20)
                if c.get("fwd_only"):
                    row["kv_GBps"] = kv_bytes / t / 1e9
                if not bwd:
                    out = jax.jit(fn)(q, k, v, bias, mask)
                    row["max_abs_err"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)))
                    row["rel_l2_err"] = rel_l2(out, ref)
                rows.append(row)
            for name_t, (run_t, torch) in (_torch_fns(c) if T == N and not c.get("masked") else {}).items():
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
    if on_gpu and not any_peer:
        rows.append(
            {"case": "-", "impl": "peers", "time_us": None,
             "note": "tokamax / FA3 not importable (PYTHONPATH=<peers>:<peers>/site): skipped"}
        )  # fmt: skip
    return rows


def _jax_nn_xla(causal: bool):
    """jax.nn's XLA path (what a jax.nn user runs without cuDNN), as a peer-style f(q, k, v, bias, mask, kvl)."""

    def f(q, k, v, bias, mask, kvl):
        return jax.nn.dot_product_attention(
            q, k, v, bias, mask, is_causal=causal, key_value_seq_lengths=kvl, implementation="xla"
        )

    return f


__all__ = ["run"]
