// One instantiation per file so the build parallelises.
#include "attention/attention_bwd_impl.cuh"

namespace jax_ops::attention {
JAX_OPS_INSTANTIATE_ATTENTION_BWD(__half, 96)
}  // namespace jax_ops::attention
