// CSR SpMV/SpMM kernels instantiated for values of type __nv_bfloat16 (accumulating in float).
#include "sparse/spmm_kernels_impl.cuh"

JAX_OPS_INSTANTIATE_CSR_SPMM(__nv_bfloat16, float)
