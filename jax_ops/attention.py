"""Fused scaled dot-product attention with the API of ``jax.nn.dot_product_attention``.

``dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None, implementation=None,
return_residual=False)``

Layouts (as jax.nn): ``query [B,T,N,H]`` or ``[T,N,H]``; ``key``/``value [B,S,K,H]`` or ``[S,K,H]`` with ``N`` a
multiple of ``K`` (MHA, GQA, MQA); ``bias``/``mask`` of rank <= 4 broadcastable to ``[B,N,T,S]`` (each dim 1 or
full); ``mask`` is bool (True = attend); seq lengths are integer ``[B]``. Causal masking is top-left aligned as in
jax.nn (query ``t`` sees keys ``s <= t``, also when ``T != S``); ``local_window_size=(left, right)`` keeps keys
``t - left <= s <= t + right`` (an int means ``(w, w)``; ``None`` inside the tuple means unbounded on that side).

Differences from jax.nn's XLA path (documented in docs/attention.md): a query row with no allowed key returns
zeros (and ``-inf`` residual, zero gradients) instead of a uniform average of ``value``; the softmax, both matmuls
and all accumulations are fp32 for f16/bf16 inputs (jax.nn rounds the probabilities to the input dtype).

``implementation``: ``None`` picks the fastest correct path for the platform: on a GPU the CUDA kernel when it
supports the inputs (otherwise the reference, ``jax_ops.reference.dot_product_attention``, with a one-time warning
naming the reason), on the CPU the XLA reference (faster than the single-threaded CPU twin: docs/attention.md);
``"ffi"`` forces our kernel (the CPU twin on the CPU) and raises on unsupported inputs; ``"xla"`` forces the
reference; ``"cudnn"`` calls ``jax.nn.dot_product_attention(..., implementation="cudnn")`` unchanged. The CPU twin supports float16, bfloat16, float32 and head dims 1..256; the
CUDA kernels float16/bfloat16 and head dims 32, 64, 96, 128, 256 (others fall back with a warning).

Split-KV: when the grid of the forward kernel would be small (decode, ``T`` small, few heads) and nothing ties a
key to its absolute position (no causal/window, bias or mask), the keys are split into ``kv_splits`` equal chunks
folded into the batch (a reshape, no copy of K/V), one kernel call computes every chunk's output and log-sum-exp,
and the chunks are merged with their log-sum-exp weights in fp32. With GQA and few query rows (decode), the query
heads of a group are packed into the rows of one head first (``packs_gqa``), so K/V are read once per group.

Autodiff: ``custom_vjp``; the forward saves O and the fp32 log-sum-exp, the backward target recomputes P.
``bias`` gets a gradient (reduced over its broadcast dims inside the kernel). ``vmap`` folds the mapped axis into
the batch (``custom_vmap``, never a sequential loop). Sharding: batch and head dims partition without gathers
via ``custom_partitioning`` (Shardy rule; the head dim shards over kv heads, so the shard count must divide
``K``); :func:`shard_map_attention` is the explicit ``jax.shard_map`` path. A sharded sequence (context
parallelism) runs :func:`ring_attention` (K/V blocks rotate over the sequence axis, merged by log-sum-exp;
:func:`ring_attention_shard` inside your own ``shard_map``; :func:`zigzag_order` for causal load balance).

Knobs (tests, experiments): ``with jax_ops.attention.overrides(kv_splits=4, portable=True, ...)``; see
docs/attention.md for the list and their environment variables. This module only re-exports; the code is in
``jax_ops/_src/attention/``.
"""

from jax_ops._src.attention.api import IMPLEMENTATIONS, dot_product_attention, shard_map_attention
from jax_ops._src.attention.config import overrides
from jax_ops._src.attention.heuristics import unsupported_reason
from jax_ops._src.attention.ring import ring_attention, ring_attention_shard, zigzag_order

__all__ = [
    "IMPLEMENTATIONS",
    "dot_product_attention",
    "overrides",
    "ring_attention",
    "ring_attention_shard",
    "shard_map_attention",
    "unsupported_reason",
    "zigzag_order",
]
