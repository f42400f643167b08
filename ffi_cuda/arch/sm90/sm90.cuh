// Every Hopper (sm_90a) primitive, namespace jax_ops::sm90 (the sm_80+ ones they build on: arch/sm80/).
#pragma once

#include "arch/sm90/barrier.cuh"
#include "arch/sm90/cluster.cuh"
#include "arch/sm90/mbarrier.cuh"
#include "arch/sm90/target.cuh"
#include "arch/sm90/tma.cuh"
#include "arch/sm90/warpgroup.cuh"
#include "arch/sm90/wgmma.cuh"
