// One instantiation per file so the build parallelises.
#include "attention/attention_fwd_sm90_impl.cuh"

namespace jax_ops::attention {
JAX_OPS_INSTANTIATE_ATTENTION_FWD_SM90(__half, 128, false)
}  // namespace jax_ops::attention
