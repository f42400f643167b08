// CSR SpMV/SpMM kernels instantiated for values of type double (accumulating in double).
#include "sparse/spmm_kernels_impl.cuh"

JAX_OPS_INSTANTIATE_CSR_SPMM(double, double)
