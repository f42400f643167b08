// CSR SpMV/SpMM kernels instantiated for values of type __half (accumulating in float).
#include "sparse/spmm_kernels_impl.cuh"

JAX_OPS_INSTANTIATE_CSR_SPMM(__half, float)
