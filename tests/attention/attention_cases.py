"""The attention case suite shared by the backends' test files (CPU twin "ffi", XLA reference "xla", CUDA)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

# Relative L2 bounds against an fp32 reference (looser than helpers.TOL for float32: the kernels' online softmax).
TOL = {jnp.float32: 2e-5, jnp.float16: 2e-3, jnp.bfloat16: 1e-2}

# The forward cases: B, T, S, N, K, D.
SHAPES = [
    (2, 17, 17, 4, 4, 32),  # MHA, T == S
    (1, 1, 100, 4, 2, 64),  # one query row, GQA
    (2, 100, 17, 6, 2, 16),  # T > S, GQA
    (1, 17, 200, 8, 1, 32),  # MQA, T < S
    (2, 33, 65, 3, 3, 8),  # tails of the 64-key tile
]


def shape_id(s) -> str:
    return "B{}T{}S{}N{}K{}D{}".format(*s)


def qkv(B, T, S, N, K, D, dtype=jnp.float32, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(ks[0], (B, T, N, D), jnp.float32)
    k = jax.random.normal(ks[1], (B, S, K, D), jnp.float32)
    v = jax.random.normal(ks[2], (B, S, K, D), jnp.float32)
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


# ---------------------------------------------------------------------------------- non-finite inputs (causal)
# Each case puts one NaN or Inf into q, k, v or bias of a causal call (docs/attention.md, "NaN and Inf").
# hit: rows whose o and lse must be NaN (a NaN or +Inf logit, or a NaN value, among their allowed keys);
# keep: rows that must equal the same call on `expected` (the clean inputs, plus a mask where the case drops a
# key); rows in neither are unspecified (the value row of a key they do not attend, which 0 * NaN may carry).
NONFINITE_CASES = [
    "q_nan",  # NaN in one query row: that row only
    "q_nan_empty_row",  # NaN in a query row that the mask leaves without keys: still 0
    "q_nan_padded_row",  # NaN in a padded query row (t >= query_seq_lengths): still 0
    "k_posinf",  # +Inf in a key (positive q there): NaN in every row that attends it
    "k_neginf",  # -Inf in a key (positive q there): the key drops out, as a masked one
    "k_nan_masked",  # NaN in a key that the mask hides from every row: nothing
    "v_nan",  # NaN in a value row: NaN in every row that attends it
    "bias_nan",  # NaN bias on an allowed key: that row
    "bias_posinf",  # +Inf bias on an allowed key: that row
    "bias_nan_masked",  # NaN bias above the causal diagonal: nothing
]


@dataclasses.dataclass
class NonFinite:
    case: str  # the NONFINITE_CASES name
    args: dict  # q, k, v, bias, mask, q_seqlen of the call (the last three None when unused)
    expected: dict  # the same for the call whose output the `keep` rows must equal
    hit: np.ndarray  # [B, T, N] bool: rows whose o must hold a NaN (and whose dq must be non-finite)
    keep: np.ndarray  # [B, T, N] bool: rows whose o must equal the expected call's
    lse_hit: np.ndarray  # [B, T, N] bool: rows whose lse must be NaN (a value row does not reach lse)
    empty: np.ndarray  # [B, T, N] bool: rows with no allowed key (o = 0; dq = 0 in the query cases)


def nonfinite_case(case, B, T, S, N, K, D, dtype=jnp.float32, seed=0) -> NonFinite:
    """One of NONFINITE_CASES (T <= S) in ``dtype`` (bias float32); call with ``is_causal=True``."""
    b0, kh0, d0 = B - 1, K - 1, D // 3
    s0, t0 = S // 3, (2 * T) // 3  # t0 >= s0: row t0 attends key s0 (T <= S)
    n0 = kh0 * (N // K)  # the first query head of kv group kh0
    group = slice(kh0 * (N // K), (kh0 + 1) * (N // K))
    q, k, v = (np.array(x, np.float32) for x in qkv(B, T, S, N, K, D, seed=seed))
    bias = mask = q_seqlen = None
    if case.startswith("bias"):
        bias = np.array(jax.random.normal(jax.random.key(seed + 1), (B, N, T, S)), np.float32)
    if case in ("k_posinf", "k_neginf"):
        q[..., d0] = np.abs(q[..., d0]) + 0.1  # q . k = +-Inf exactly where k holds the Inf
    if case in ("k_nan_masked", "q_nan_empty_row", "k_neginf"):
        mask = np.ones((B, N, T, S), bool)
    if case == "k_nan_masked":
        mask[b0, :, :, s0] = False
    if case == "q_nan_empty_row":
        mask[b0, n0, t0, :] = False
    if case == "q_nan_padded_row":
        q_seqlen = np.array([T] * (B - 1) + [t0], np.int32)  # rows t >= t0 of batch b0 are padding
    expected = dict(
        q=q.copy(),
        k=k.copy(),
        v=v.copy(),
        bias=None if bias is None else bias.copy(),
        mask=mask,
        q_seqlen=q_seqlen,
    )
    if case == "k_neginf":
        expected["mask"] = mask.copy()
        expected["mask"][b0, group, :, s0] = False
        mask = None
    hit = np.zeros((B, T, N), bool)
    keep = np.ones((B, T, N), bool)
    empty = np.zeros((B, T, N), bool)
    if case.startswith("q_nan"):
        q[b0, t0, n0, d0] = np.nan
        hit[b0, t0, n0] = case == "q_nan"
        empty[b0, t0, n0] = case == "q_nan_empty_row"
        empty[b0, t0:] = case == "q_nan_padded_row"
    elif case in ("k_posinf", "k_neginf", "k_nan_masked"):
        k[b0, s0, kh0, d0] = {"k_posinf": np.inf, "k_neginf": -np.inf, "k_nan_masked": np.nan}[case]
        hit[b0, s0:, group] = case == "k_posinf"
    elif case == "v_nan":
        v[b0, s0, kh0, d0] = np.nan
        hit[b0, s0:, group] = True
        keep[b0, :, group] = False  # rows t < s0 of the group: unspecified
    elif case in ("bias_nan", "bias_posinf"):
        bias[b0, n0, t0, s0] = np.nan if case == "bias_nan" else np.inf
        hit[b0, t0, n0] = True
    elif case == "bias_nan_masked":
        bias[b0, n0, s0, t0] = np.nan  # key t0 > query s0: above the diagonal
    keep &= ~hit
    lse_hit = hit if case != "v_nan" else np.zeros_like(hit)

    def cast(d):
        return {
            name: None if x is None else jnp.asarray(x, dtype if name in ("q", "k", "v") else x.dtype)
            for name, x in d.items()
        }

    args = dict(q=q, k=k, v=v, bias=bias, mask=mask, q_seqlen=q_seqlen)
    return NonFinite(case, cast(args), cast(expected), hit, keep, lse_hit, empty)


def assert_nonfinite_outputs(c: NonFinite, out, lse, ref, ref_lse, atol):
    """The forward rule of a NonFinite case: o of `hit` rows holds a NaN, `keep` rows match the expected call
    (`ref`, `ref_lse`: its output and residual, [B, T, N, D] / [B, T, N]); lse is NaN on `lse_hit` rows and
    matches elsewhere (keep rows and value-only hits)."""
    out, lse = np.asarray(out, np.float32), np.asarray(lse, np.float32)
    ref, ref_lse = np.asarray(ref, np.float32), np.asarray(ref_lse, np.float32)
    assert np.isnan(out).any(-1)[c.hit].all(), "a non-finite input that a row reads did not reach its output"
    assert np.isnan(lse[c.lse_hit]).all()
    assert np.all(out[c.empty] == 0) and np.all(lse[c.empty] == -np.inf)
    np.testing.assert_allclose(out[c.keep], ref[c.keep], atol=atol, rtol=atol)
    lse_keep = c.keep | (c.hit & ~c.lse_hit)
    np.testing.assert_allclose(lse[lse_keep], ref_lse[lse_keep], atol=atol, rtol=atol)


def assert_nonfinite_grads(c: NonFinite, grads):
    """The gradient rule of a NonFinite case on [dq, dk, dv(, dbias)] (numpy float32)."""
    case = c.case
    dq = grads[0]
    assert (~np.isfinite(dq)).any(-1)[c.hit].all(), "a row with a NaN output has a finite dq"
    if case.startswith("q_nan"):  # dq[t] = dS[t] K reads no other row's q: finite wherever the output is
        assert np.isfinite(dq[~c.hit]).all()
        assert np.all(dq[c.empty] == 0)
    if case in ("bias_nan", "bias_posinf"):
        dbias = grads[3]
        assert (~np.isfinite(dbias)).any(-1).transpose(0, 2, 1)[c.hit].all()
