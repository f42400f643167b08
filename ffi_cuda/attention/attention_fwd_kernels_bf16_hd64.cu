// One instantiation per file so the build parallelises.
#include "attention/attention_fwd_impl.cuh"

namespace jax_ops::attention {
JAX_OPS_INSTANTIATE_ATTENTION_FWD(__nv_bfloat16, 64)
}  // namespace jax_ops::attention
