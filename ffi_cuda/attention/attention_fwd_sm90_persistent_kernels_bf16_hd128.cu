// One instantiation per file so the build parallelises: the persistent variant (Sm90FwdUsePersistent).
#include "attention/attention_fwd_sm90_impl.cuh"

namespace jax_ops::attention {
JAX_OPS_INSTANTIATE_ATTENTION_FWD_SM90(__nv_bfloat16, 128, true)
}  // namespace jax_ops::attention
