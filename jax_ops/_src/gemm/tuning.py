"""The GEMM's static dispatch table: which CUDA plan runs a problem of each (arch, problem class), where the rules
of ffi_cuda/gemm/heuristics.h ("auto") are not the fastest. ``python -m jax_ops.bench gemm --tune`` times every
plan that can run the bench's shapes and rewrites ``dispatch_table.json`` (beside this module); a call never
benchmarks. A class absent from the table runs "auto".

A problem class is ``dtype|rows|weights|epilogue`` (``class_key``): the input dtype (``float32+tf32`` when TF32
is allowed), the rows of op(a) after a shared weight folds the batch in (bucketed at 16, 64, 256), the weight's
bytes against the GPU's L2 (``w<=l2`` / ``w>l2``), and the epilogue: ``plain`` (identity, no bias, no residual,
not gated), ``lt`` (what cuBLASLt's own epilogues express: bias, relu, tanh-GELU, beta·c) or ``fused`` (the rest:
only our kernels run it). The cublaslt plan is taken only where ``cublaslt_refusal`` is None: the mirror of
``CublasLtRefusal`` in ffi_cuda/gemm/gemm_cublaslt.cu (the GPU suite checks that the two agree).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jax_ops._src.gemm.validation import Config

TABLE_PATH = Path(__file__).with_name("dispatch_table.json")
ROW_BUCKETS = (16, 64, 256)  # rows <= 16: decode; <= 64: the skinny kernel's reach; <= 256: one or two tiles
L2_BYTES = 50 << 20  # H100 / H200: a weight above it streams from HBM on every call
# cuBLASLt's scratch (NVIDIA's figure for Hopper), plus room for a rounded bias of up to 64k columns.
CUBLASLT_WORKSPACE_BYTES = (32 << 20) + (128 << 10)
FP8 = ("float8_e4m3fn", "float8_e5m2")


def arch_key(compute_capability: tuple[int, int] | None) -> str:
    if compute_capability is None:
        return "unknown"
    major, minor = compute_capability
    return f"sm{major}{minor}"


def epilogue_class(cfg: Config, has_bias: bool, has_residual: bool) -> str:
    if cfg.gated == "none" and not has_residual:
        if cfg.activation == "identity" and not has_bias:
            return "plain"
        if cfg.activation in ("identity", "relu", "gelu_tanh"):
            return "lt"
    return "fused"


def class_key(cfg: Config, a_dtype, rows: int, weight_bytes: int, has_bias: bool, has_residual: bool) -> str:
    dtype = np.dtype(a_dtype).name + ("+tf32" if cfg.tf32 else "")
    bucket = next((f"m<={r}" for r in ROW_BUCKETS if rows <= r), f"m>{ROW_BUCKETS[-1]}")
    weights = "w<=l2" if weight_bytes <= L2_BYTES else "w>l2"
    return f"{dtype}|{bucket}|{weights}|{epilogue_class(cfg, has_bias, has_residual)}"


def cublaslt_refusal(cfg: Config, a_dtype, b_dtype, out_dtype, N: int, K: int, operands) -> str | None:
    """Why the cublaslt plan cannot run this call (None: it can), for the contract's operands (bias, c,
    residual, a_scale, b_scale given or None) after ffi.py's layout changes (an 8-bit b is made [N, K])."""
    bias, _, residual, a_scale, b_scale = operands
    a_name, b_name = np.dtype(a_dtype).name, np.dtype(b_dtype).name
    if K == 0:
        return "cuBLASLt needs K > 0"
    if cfg.gated != "none":
        return "cuBLASLt has no gated epilogue"
    if residual is not None:
        return "cuBLASLt adds no residual after the activation"
    if cfg.activation not in ("identity", "relu", "gelu_tanh"):
        return "cuBLASLt's epilogues apply relu or tanh-GELU only"
    if cfg.write_preact and cfg.activation == "relu":
        return "cuBLASLt keeps a relu's sign bits, not its pre-activation"
    if cfg.write_preact and cfg.activation == "gelu_tanh" and N % 8:
        return "cuBLASLt writes a GELU pre-activation only with N divisible by 8"
    if a_name in FP8 and b_name in FP8:
        if a_name == b_name == "float8_e5m2":
            return "cuBLASLt has no e5m2 x e5m2 GEMM"
        if cfg.transpose_a or not cfg.transpose_b:
            return "cuBLASLt's fp8 GEMM reads both operands K-major (a [M, K], b [N, K] with transpose_b)"
        if a_scale.size > 1 or b_scale.size > 1:
            return "cuBLASLt's fp8 GEMM takes per-tensor scales only"
        if K % 16 or N % 16:
            return "cuBLASLt's fp8 GEMM needs K and N divisible by 16"
        if bias is not None and np.dtype(out_dtype) == np.float32:
            return "cuBLASLt's fp8 GEMM into float32 takes no float32 bias"
        return None
    if b_name != a_name or a_name not in ("float16", "bfloat16", "float32", "float64"):
        return "cuBLASLt runs float16, bfloat16, float32, float64 and fp8 GEMMs here (not int8)"
    if a_scale is not None or b_scale is not None:
        return "cuBLASLt takes scales for fp8 GEMMs only"
    if a_name in ("float32", "float64") and (
        cfg.activation != "identity" or bias is not None or cfg.write_preact
    ):
        return "the cublaslt plan runs float32 / float64 GEMMs without bias or activation"
    return None


def _load(path: Path = TABLE_PATH) -> dict[str, dict[str, str]]:
    """{arch: {class key: plan}}; the file's "note" entry says where it came from."""
    table = json.loads(path.read_text()) if path.exists() else {}
    return {arch: dict(entries) for arch, entries in table.get("plans", {}).items()}


TABLE: dict[str, dict[str, str]] = _load()


def lookup(arch: str, key: str) -> str:
    """The table's plan for a problem class on an arch ("auto" when it has none)."""
    return TABLE.get(arch, {}).get(key, "auto")


def best_plans(times: dict[str, dict[str, list[float]]], margin: float = 0.03) -> dict[str, str]:
    """Per class, the plan to record from ``times[class][plan]`` = seconds of the class's shapes (one per shape,
    in the same order for every plan; a plan that failed a shape has no list): the plan with the smallest geometric
    mean time relative to "auto" over the shapes every candidate ran, when it beats "auto" by more than
    ``margin``; classes where "auto" stays are left out."""
    chosen = {}
    for key, per_plan in sorted(times.items()):
        auto = per_plan.get("auto")
        if not auto:
            continue
        ratios = {
            plan: float(np.exp(np.mean(np.log(np.asarray(t) / np.asarray(auto)))))
            for plan, t in per_plan.items()
            if plan != "auto" and t and len(t) == len(auto)
        }
        if ratios:
            plan, ratio = min(ratios.items(), key=lambda kv: kv[1])
            if ratio < 1 - margin:
                chosen[key] = plan
    return chosen


def write_table(arch: str, entries: dict[str, str], device: str, path: Path = TABLE_PATH) -> Path:
    """Rewrites the table file with ``arch``'s entries replaced (the other archs' kept)."""
    TABLE[arch] = dict(sorted(entries.items()))
    note = dict(json.loads(path.read_text()).get("tuned_on", {})) if path.exists() else {}
    note[arch] = device
    data = {
        "note": "generated by `python -m jax_ops.bench gemm --tune` (jax_ops/_src/gemm/tuning.py); do not edit",
        "tuned_on": dict(sorted(note.items())),
        "plans": {k: TABLE[k] for k in sorted(TABLE)},
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
