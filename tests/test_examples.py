"""The examples run (tiny sizes, CPU) and do what they claim."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "extra",
    [
        ["--compare"],  # GQA (4 heads / 2 kv heads), SwiGLU, RMSNorm, Adam, against jax.nn
        ["--mlp", "gelu", "--norm", "layer", "--kv-heads", "1", "--dtype", "bfloat16"],  # MQA, bf16
    ],
    ids=["gqa-swiglu-compare", "mqa-gelu-layernorm-bf16"],
)
def test_transformer_block_learns(extra):
    example = _load("transformer_block")
    argv = ["--steps", "15", "--seq", "8", "--batch", "4", "--dim", "32", "--heads", "4", "--layers", "1"]
    results = example.main(argv + extra)
    for name, r in results.items():
        losses = r["losses"]
        assert len(losses) == 15
        # main() already asserts last < first; the rule is learnable, so it falls well below the start.
        assert losses[-1] < 0.5 * losses[0], (name, losses)
    if "--compare" in extra:
        (ours, theirs) = results.values()
        # Same initial parameters and batches, attention equal to rounding: the curves coincide.
        assert abs(ours["losses"][-1] - theirs["losses"][-1]) <= 1e-3 * max(1.0, theirs["losses"][-1])


def test_lsmr_tomography_matches_scipy():
    example = _load("lsmr_tomography")
    out = example.main(["--size", "24"])
    (istop, itn, err, res), (istop_s, itn_s, _, res_s) = out["ours"], out["scipy"]
    assert istop == istop_s and abs(itn - itn_s) <= max(1, 0.02 * itn_s)  # float32: itn within 2 %
    assert abs(res - res_s) <= 1e-4 * res_s + 1e-6
    assert err < 0.5  # a reconstruction, not noise


def test_paged_decode_matches_contiguous(capsys):
    """Four requests (two sharing a prompt prefix) served from the paged cache give the contiguous jnp run's
    greedy tokens and logits; the shared half-full page was copied on write."""
    example = _load("paged_decode")
    result = example.main(["--steps", "6"])
    assert result["generated"].shape == (7, 4)
    assert not result["mismatches"] and result["ties"] == 0  # float32 on the CPU: no near-ties expected
    assert result["logits_err_max"] <= 1e-4 and result["cow_copies"] == 1
    assert result["tokens_per_s"] > 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


README = EXAMPLES.parent / "README.md"


def _readme_snippets() -> list[str]:
    text = README.read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


@pytest.mark.parametrize("index", range(4), ids=["attention", "sparse", "lsmr", "gemm"])
def test_readme_snippet_runs(index, capsys):
    """The README's per-family snippets run as written (CPU; the default implementation)."""
    snippets = _readme_snippets()
    assert len(snippets) == 4
    exec(compile(snippets[index], f"README.md snippet {index}", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.strip()
    if index == 0:
        assert float(printed.split()[-1]) < 1e-4  # attention matches jax.nn
    if index == 1:
        assert printed.startswith("True")  # CSRPair.matvec == sparse.matmul
    if index == 3:
        assert printed.split()[-1] == "bfloat16"  # linear / gated_linear keep the input dtype


@pytest.mark.parametrize(
    "extra",
    [
        [],  # zigzag layout, GQA (4 heads / 2 kv heads), the default paths (XLA on the CPU), jax_ops.linear
        # contiguous layout, the CPU twin per block pair, MQA, XLA's GEMMs
        ["--layout", "contiguous", "--implementation", "ffi", "--kv-heads", "1", "--gemm", "xla"],
    ],
    ids=["zigzag-gqa", "contiguous-mqa-ffi"],
)
def test_long_context_training_matches_single_device(extra, capsys):
    """The step with the sequence sharded over the 8 fake devices (ring attention) has the single-device step's
    loss and gradients at every step, and SGD lowers the loss."""
    example = _load("long_context_training")
    argv = ["--steps", "3", "--seq", "128", "--batch", "2", "--dim", "32", "--heads", "4"]
    result = example.main(argv + extra)
    assert result["devices"] == 8
    assert result["loss_diff_max"] <= 1e-5 and result["grad_rel_diff_max"] <= 1e-5
    assert result["losses"][-1] < result["losses"][0]
    assert capsys.readouterr().out.rstrip().endswith("PASS")


def test_distributed_lsmr_matches_single_device(capsys):
    """The solve with A's rows over the 8 fake devices gives the single-device solve (float64: same istop and itn,
    x to rounding), for a row count that needs padding."""
    example = _load("distributed_lsmr")
    result = example.main(["--rows", "3001", "--cols", "200", "--damp", "0.1"])
    assert result["devices"] == 8
    assert result["sharded"][:2] == result["single"][:2] and result["x_diff"] <= 1e-10
    assert capsys.readouterr().out.rstrip().endswith("PASS")
