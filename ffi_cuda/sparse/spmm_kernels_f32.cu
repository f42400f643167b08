// CSR SpMV/SpMM kernels instantiated for values of type float (accumulating in float).
#include "sparse/spmm_kernels_impl.cuh"

JAX_OPS_INSTANTIATE_CSR_SPMM(float, float)
