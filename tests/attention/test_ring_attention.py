"""Ring (context-parallel) attention on 8 fake CPU devices: forward, residual and gradients equal the single-device
op on the whole sequence (float64 reference), for both layouts, several mesh shapes and both per-block paths (the
CPU twin "ffi" and the jnp "xla"); the compiled program communicates by collective-permute only."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import qkv
from helpers import rel_err
from jax.sharding import Mesh

from jax_ops import attention

IMPLS = ["ffi", "xla"]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    mesh: tuple  # (axis names, sizes); the sequence axis is "seq"
    B: int
    T: int
    S: int
    N: int
    K: int
    D: int = 16
    layout: str = "contiguous"
    kw: tuple = ()  # static keywords of dot_product_attention
    q_lengths: tuple | None = None
    kv_lengths: tuple | None = None
    batch_axis: str | None = None
    head_axis: str | None = None


CASES = [
    Case("full", (("seq",), (4,)), B=2, T=32, S=32, N=4, K=4),
    Case(
        "causal_gqa_lengths",
        (("seq",), (4,)),
        2,
        32,
        32,
        4,
        2,
        q_lengths=(32, 19),
        kv_lengths=(13, 32),
        kw=(("is_causal", True),),
    ),  # fmt: skip
    Case(
        "zigzag_causal_gqa",
        (("seq",), (4,)),
        3,
        32,
        32,
        4,
        2,
        layout="zigzag",
        kv_lengths=(32, 21, 0),
        q_lengths=(27, 32, 32),
        kw=(("is_causal", True),),
    ),  # fmt: skip
    Case("window", (("seq",), (4,)), 1, 32, 32, 2, 1, kw=(("local_window_size", (5, 3)),)),
    Case(
        "causal_window_8",
        (("seq",), (8,)),
        1,
        48,
        48,
        2,
        2,
        kw=(("is_causal", True), ("local_window_size", (9, None))),
    ),
    Case("cross_lengths", (("seq",), (4,)), 2, 16, 40, 4, 2, kv_lengths=(40, 7)),
    Case("zigzag_cross_lengths", (("seq",), (4,)), 2, 16, 40, 4, 2, layout="zigzag", kv_lengths=(40, 7)),
    Case(
        "batch_x_seq",
        (("data", "seq"), (2, 4)),
        2,
        32,
        32,
        4,
        2,
        batch_axis="data",
        kw=(("is_causal", True),),
    ),
    Case(
        "batch_head_seq_zigzag",
        (("data", "model", "seq"), (2, 2, 2)),
        2,
        16,
        16,
        4,
        2,
        layout="zigzag",
        batch_axis="data",
        head_axis="model",
        kw=(("is_causal", True),),
    ),  # fmt: skip
]


def _mesh(case: Case) -> Mesh:
    names, sizes = case.mesh
    return Mesh(np.array(jax.devices()[: int(np.prod(sizes))]).reshape(sizes), names)


def _inputs(case: Case):
    q, k, v = qkv(case.B, case.T, case.S, case.N, case.K, case.D, seed=sum(map(ord, case.name)))
    lengths = {}
    if case.q_lengths is not None:
        lengths["query_seq_lengths"] = jnp.asarray(case.q_lengths, jnp.int32)
    if case.kv_lengths is not None:
        lengths["key_value_seq_lengths"] = jnp.asarray(case.kv_lengths, jnp.int32)
    return q, k, v, lengths


def _ring_fn(case: Case, impl: str, **extra):
    """The ring op on natural-order arrays (zigzag: permuted in and back out here, as a user does once)."""
    mesh = _mesh(case)
    shards = dict(zip(*case.mesh))["seq"]
    kw = dict(case.kw, implementation=impl, **extra)

    def f(q, k, v, lengths):
        if case.layout == "zigzag":
            q_order, kv_order = attention.zigzag_order(case.T, shards), attention.zigzag_order(case.S, shards)
            q, k, v = q[:, q_order], k[:, kv_order], v[:, kv_order]
        out = attention.ring_attention(
            q, k, v, mesh=mesh, seq_axis="seq", batch_axis=case.batch_axis, head_axis=case.head_axis,
            layout=case.layout, **lengths, **kw,
        )  # fmt: skip
        if case.layout != "zigzag":
            return out
        inv = np.argsort(attention.zigzag_order(case.T, shards))
        return tuple(x[:, inv] for x in out) if isinstance(out, tuple) else out[:, inv]

    return f


def _reference(case: Case, q, k, v, lengths, **extra):
    """The single-device op on the whole sequence in float64."""
    f64 = [x.astype(jnp.float64) for x in (q, k, v)]
    return attention.dot_product_attention(*f64, **lengths, **dict(case.kw), implementation="xla", **extra)


def _loss(o):
    return jnp.sum(jnp.sin(o) * jnp.arange(o.shape[-1], dtype=o.dtype))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_single_device(case, impl, x64):
    q, k, v, lengths = _inputs(case)
    ring = _ring_fn(case, impl)
    out = jax.jit(ring)(q, k, v, lengths)
    ref = _reference(case, q, k, v, lengths)
    assert out.dtype == q.dtype
    assert rel_err(out, ref) < 2e-6
    grads = jax.jit(jax.grad(lambda q, k, v: _loss(ring(q, k, v, lengths)), (0, 1, 2)))(q, k, v)
    grads_ref = jax.grad(lambda q, k, v: _loss(_reference(case, q, k, v, lengths)), (0, 1, 2))(
        *(x.astype(jnp.float64) for x in (q, k, v))
    )
    for name, g, g_ref in zip("qkv", grads, grads_ref):
        assert g.dtype == q.dtype, name
        assert rel_err(g, g_ref) < 5e-6, name


def test_residual_and_empty_rows():
    """The returned log-sum-exp equals the whole-sequence one; rows with no key (kv length 0, padded queries)
    are 0 with -inf residual and zero, finite gradients."""
    case = CASES[2]
    q, k, v, lengths = _inputs(case)
    out, lse = jax.jit(_ring_fn(case, "ffi", return_residual=True))(q, k, v, lengths)
    ref, ref_lse = attention.dot_product_attention(
        q, k, v, **lengths, **dict(case.kw), implementation="xla", return_residual=True
    )
    np.testing.assert_allclose(out, ref, atol=2e-6)
    live = np.isfinite(np.asarray(ref_lse))
    # batch 2 has no keys; batch 0's rows >= 27 are padding
    assert not live[2].any() and not live[0, 27:].any()
    np.testing.assert_array_equal(np.isfinite(np.asarray(lse)), live)
    np.testing.assert_allclose(np.asarray(lse)[live], np.asarray(ref_lse)[live], rtol=1e-6, atol=1e-6)
    assert not np.asarray(out)[2].any() and not np.asarray(out)[0, 27:].any()
    dq, dk = jax.jit(jax.grad(lambda q, k: _loss(_ring_fn(case, "ffi")(q, k, v, lengths)), (0, 1)))(q, k)
    assert np.all(np.isfinite(dq)) and np.all(np.isfinite(dk))
    assert not np.asarray(dq)[2].any() and not np.asarray(dk)[2].any()


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_only_collective_permutes(layout):
    """Forward and backward compile to collective-permutes (K/V out in each, dK/dV home) and no other
    collective."""
    case = dataclasses.replace(CASES[0], layout=layout, kw=(("is_causal", True),))
    q, k, v, lengths = _inputs(case)
    mesh = _mesh(case)

    def step(q, k, v, do):
        f = lambda q, k, v: attention.ring_attention(  # noqa: E731
            q, k, v, mesh=mesh, seq_axis="seq", layout=layout, is_causal=True, implementation="ffi"
        )
        o, vjp = jax.vjp(f, q, k, v)
        return o, vjp(do)

    hlo = jax.jit(step).lower(q, k, v, q).compile().as_text()
    shards = mesh.shape["seq"]
    # K and V: P - 1 steps in the forward and P - 1 in the backward (not merged with the forward's: the backward
    # rotates the other way); dK and dV: P steps home.
    permutes = hlo.count(" collective-permute(") + hlo.count(" collective-permute-start(")
    assert permutes == 2 * (shards - 1) * 2 + 2 * shards, permutes
    for other in ("all-gather", "all-reduce", "all-to-all", "reduce-scatter"):
        assert other not in hlo, other


def test_inside_users_shard_map_with_vma_checks():
    """ring_attention_shard in a hand-written shard_map (check_vma on), forward and grads."""
    case = CASES[1]
    q, k, v, lengths = _inputs(case)
    mesh = _mesh(case)
    spec = jax.sharding.PartitionSpec(None, "seq", None, None)

    def local(q, k, v, kvl):
        return attention.ring_attention_shard(
            q, k, v, axis_name="seq", is_causal=True, key_value_seq_lengths=kvl, implementation="ffi"
        )

    f = jax.shard_map(
        local, mesh=mesh, in_specs=(spec, spec, spec, jax.sharding.PartitionSpec()), out_specs=spec
    )
    kvl = lengths["key_value_seq_lengths"]
    ref_kw = dict(is_causal=True, key_value_seq_lengths=kvl, implementation="xla")
    np.testing.assert_allclose(
        jax.jit(f)(q, k, v, kvl), attention.dot_product_attention(q, k, v, **ref_kw), atol=2e-6
    )
    g = jax.jit(jax.grad(lambda q, k, v: _loss(f(q, k, v, kvl)), (0, 1, 2)))(q, k, v)
    g_ref = jax.grad(lambda q, k, v: _loss(attention.dot_product_attention(q, k, v, **ref_kw)), (0, 1, 2))(
        q, k, v
    )
    for a, b in zip(g, g_ref):
        assert rel_err(a, b) < 1e-5


def test_zigzag_order():
    order = attention.zigzag_order(8, 2)
    np.testing.assert_array_equal(order, [0, 1, 6, 7, 2, 3, 4, 5])
    np.testing.assert_array_equal(np.sort(attention.zigzag_order(48, 4)), np.arange(48))
    with pytest.raises(ValueError, match="multiple of 2"):
        attention.zigzag_order(10, 4)


@pytest.mark.parametrize(
    "kw, shapes, match",
    [
        (dict(is_causal=True), (32, 40), "equal query and key blocks"),
        (dict(local_window_size=4), (32, 40), "equal query and key blocks"),
        (dict(layout="zigzag", local_window_size=4), (32, 32), "needs layout='contiguous'"),
        (dict(layout="zigzag"), (36, 36), "even number of rows"),
        (dict(layout="diagonal"), (32, 32), "layout must be one of"),
        (dict(implementation="cuda"), (32, 32), "implementation"),
        (dict(bias=jnp.zeros((1, 2, 32, 32))), (32, 32), "takes no bias"),
        (dict(mask=jnp.ones((1, 1, 32, 32), bool)), (32, 32), "takes no mask"),
    ],
)
def test_errors(kw, shapes, match):
    mesh = Mesh(np.array(jax.devices()[:4]), ("seq",))
    q, k, v = qkv(1, shapes[0], shapes[1], 2, 2, 8)
    with pytest.raises(ValueError, match=match):
        attention.ring_attention(q, k, v, mesh=mesh, seq_axis="seq", **kw)


def test_backward_fallback_warns(monkeypatch, x64):
    """A block backward the kernel cannot run (as a GPU head dim without a backward kernel) runs the blocked jnp
    backward with a one-time warning naming the reason, and the gradients stay right."""
    from jax_ops import _checks
    from jax_ops._src.attention import heuristics

    reason = "the CUDA attention backward supports head dims (64, 128), not 16"
    monkeypatch.setattr(heuristics, "bwd_unsupported_reason", lambda *a: reason)
    monkeypatch.setattr(_checks, "_warned", set())
    case = CASES[0]
    q, k, v, lengths = _inputs(case)
    ring = _ring_fn(case, "ffi")
    with pytest.warns(UserWarning, match="ring_attention: the CUDA attention backward supports head dims"):
        dq = jax.jit(jax.grad(lambda q: _loss(ring(q, k, v, lengths))))(q)
    dq_ref = jax.grad(lambda q: _loss(_reference(case, q, k, v, lengths)))(q)
    assert rel_err(dq, dq_ref) < 5e-6
