"""The attention family (fused scaled dot-product attention): see jax_ops.attention and docs/attention.md."""
