"""Scale-out on real GPUs (every CUDA device of the machine, rounded down to a power of two): ring attention,
row-sharded LSMR, row-sharded SpMV/SpMM and the K-sharded GEMM against the same op on one device. The CPU suite
checks the same ops on 8 fake devices; these check them through NCCL and the CUDA kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_ops
from jax_ops import attention, sparse
from jax_ops.lsmr_solver import row_sharded

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_multi]


def _mesh(axis: str) -> Mesh:
    gpus = jax.devices("cuda")
    count = 1 << (len(gpus).bit_length() - 1)
    return Mesh(np.array(gpus[:count]), (axis,))


def _rel(x, ref) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(x - ref) / max(np.linalg.norm(ref), 1e-30))


def test_ring_attention_matches_one_gpu():
    mesh = _mesh("seq")
    shards = mesh.size
    B, T, N, K, D = 1, 1024 * shards, 8, 2, 128
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (B, T, N, D), jnp.bfloat16)
    k = jax.random.normal(keys[1], (B, T, K, D), jnp.bfloat16)
    v = jax.random.normal(keys[2], (B, T, K, D), jnp.bfloat16)
    g = jax.random.normal(keys[3], (B, T, N, D), jnp.float32)
    order = attention.zigzag_order(T, shards)
    inverse = np.argsort(order)

    def ring_loss(q, k, v):
        o = attention.ring_attention(
            q[:, order], k[:, order], v[:, order], mesh=mesh, seq_axis="seq", layout="zigzag", is_causal=True
        )
        return jnp.sum(o[:, inverse].astype(jnp.float32) * g), o[:, inverse]

    def one_loss(q, k, v):
        o = jax_ops.dot_product_attention(q, k, v, is_causal=True)
        return jnp.sum(o.astype(jnp.float32) * g), o

    (_, o_ring), d_ring = jax.jit(jax.value_and_grad(ring_loss, (0, 1, 2), has_aux=True))(q, k, v)
    (_, o_one), d_one = jax.jit(jax.value_and_grad(one_loss, (0, 1, 2), has_aux=True))(q, k, v)
    assert _rel(o_ring, o_one) < 1e-2
    for name, a, b in zip("qkv", d_ring, d_one):
        assert _rel(a, b) < 2e-2, name


def test_row_sharded_lsmr_matches_one_gpu():
    mesh = _mesh("rows")
    rng = np.random.default_rng(1)
    m, n = 1000 * mesh.size + 3, 400  # rows that do not divide: zero-padded
    A = sp.random(m, n, density=0.02, format="csr", random_state=rng, dtype=np.float32) + sp.eye(
        m, n, dtype=np.float32, format="csr"
    )
    b = rng.standard_normal(m).astype(np.float32)
    one = jax_ops.lsmr(jax_ops.sparse.CSRPair.from_matrix(A), jnp.asarray(b), atol=1e-6, btol=1e-6)
    sharded = jax_ops.lsmr(row_sharded(A, mesh, "rows"), jnp.asarray(b), atol=1e-6, btol=1e-6)
    assert int(sharded.istop) == int(one.istop)
    assert abs(int(sharded.itn) - int(one.itn)) <= 1
    assert _rel(sharded.x, one.x) < 1e-3


@pytest.mark.parametrize("columns", [1, 32])
def test_row_sharded_spmm_matches_scipy(columns):
    mesh = _mesh("rows")
    rng = np.random.default_rng(2)
    M = sp.random(20_000, 5_000, density=1e-3, format="csr", random_state=rng, dtype=np.float32)
    A = sparse.row_sharded(M, mesh, "rows")
    x = rng.standard_normal((5_000, columns)).astype(np.float32)
    u = rng.standard_normal((20_000, columns)).astype(np.float32)
    y = A.unpad_rows(jax.jit(lambda A, x: A @ x)(A, jnp.asarray(x)))
    z = jax.jit(lambda A, u: A.T @ A.pad_rows(u))(A, jnp.asarray(u))
    assert _rel(y, M @ x) < 1e-5
    assert _rel(z, M.T @ u) < 1e-5


def test_k_sharded_gemm_matches_one_gpu():
    mesh = _mesh("k")
    rng = np.random.default_rng(3)
    M, N, K = 1024, 2048, 1024 * mesh.size
    a = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal((K, N)) / np.sqrt(K), jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(N), jnp.float32)
    f = jax.jit(
        lambda a, b, bias: jax_ops.gemm(a, b, bias=bias, activation="gelu"),
        out_shardings=NamedSharding(mesh, P(None, "k")),
    )
    y = f(
        jax.device_put(a, NamedSharding(mesh, P(None, "k"))),
        jax.device_put(b, NamedSharding(mesh, P("k"))),
        bias,
    )
    ref = jax.nn.gelu(jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32)) + bias, approximate=False)
    assert _rel(y, ref) < 1e-2
