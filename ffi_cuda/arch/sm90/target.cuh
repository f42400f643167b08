// JAX_OPS_SM90: 1 in the device pass for sm_90a (the arch-specific features wgmma, setmaxnreg, TMA and clusters
// need), 0 elsewhere. The sm90 primitives compile to empty bodies when it is 0; launchers never select those
// kernels on other targets.
#pragma once

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define JAX_OPS_SM90 1
#else
#define JAX_OPS_SM90 0
#endif
