// Column-slab Aᵀu kernels instantiated for values of type double (accumulating in double).
#include "sparse/slab_spmv_kernels_impl.cuh"

JAX_OPS_INSTANTIATE_SLAB_SPMV(double, double)
