// One instantiation per file so the build parallelises.
#include "attention/attention_bwd_sm90_impl.cuh"

namespace jax_ops::attention {
JAX_OPS_INSTANTIATE_ATTENTION_BWD_SM90(__half, 64)
}  // namespace jax_ops::attention
