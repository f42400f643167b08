// Column-slab Aᵀu kernels instantiated for values of type float (accumulating in float).
#include "sparse/slab_spmv_kernels_impl.cuh"

JAX_OPS_INSTANTIATE_SLAB_SPMV(float, float)
