// --lsmr-block (spmv_bench): where one iteration of LSMR's 16-RHS block solve goes (issue 4: 16 RHS <= 4x one).
// Included by spmv_bench.cu after its matrix generators, timing and split/segment helpers, which it reuses.
//
// The block solve (jax_ops/lsmr_solver.py, CSRPair operator) holds its vectors as [k, n] / [k, m] (k = 16) and calls
// jax.vmap(pair.matvec_axpby)(V, U, -c): the sparse custom_vmap rule (_fold_batch/_unfold_batch) transposes V to
// [n, 16] and U (y) to [m, 16], runs ONE FFI SpMM  out[m, 16] = alpha * (A @ B) + beta * y  with y aliased to out
// (input_output_aliases {6: 0}) and B/y/out row-major, then transposes out back to [16, m]. Aᵀu likewise on CSR(Aᵀ).
// So per iteration: 2 SpMMs on row-major [K, 16] operands (what is timed here, in place like the alias), 6
// transposes (unless XLA fuses them into neighbours) and ~9 plain vector passes.
//
// Per matrix (LSMR's 8kv-like 306136x6177 and 11kv-like 936063x23394, exactly 18 / 21 random columns per row as
// jax_ops/bench/lsmr.py _build; ba-like = BundleAdjustment(500000, 2000, 200000), 1M x 618k) and op (A V on
// CSR(A), Aᵀ U on CSR(Aᵀ)), N = 16:
//   * "library": the plan jax_ops.sparse picks today (choose_algorithm; segmented runs the vector path for N > 1;
//     spmm_takes_split: < 2^16 lanes of G * S and rows averaging >= 512 -> split chunk 256), LaunchCsrSpmm
//     with 16-byte vectors (the library's slots kernel, G = 4, VEC = 4, S = SlotsFor(nnz / m));
//   * the group kernel (the library's 16-byte kernel before the slots kernel: G = 4, VEC = 4) and other G / VEC
//     (VEC 1: G 16, 32; VEC 4: G 8) over all rows;
//   * forced split (long rows cut into units) at chunk 32 .. 512: on ba-like's Aᵀ this splits only the ~18k camera
//     rows (the segmented-like variant the brief asks for);
//   * "slots S": a bench-only kernel, 4*S lanes per row = S slots of 4 column lanes (float4), slot s takes entries
//     s, s+S, ... (4 in flight), slots summed by a fixed xor tree (deterministic); over all rows, and "hybrid":
//     slots S=8 on the leading long-row segments (segment table G >= 16) + the library group kernel on the rest;
//   * [N, M] layout ("T"): y/out read/written as [16, M] (what LSMR holds) by the slots kernel: the cost of
//     dropping the two output-side transposes;
//   * cuSPARSE cusparseSpMM (CSR; ALG_DEFAULT, CSR_ALG1/2/3; row-major and column-major B/C = [16, K] / [16, M]),
//     scalar alpha = 1, beta = -0.5, C in place.
// Checks: ours against a float64 reference with out poisoned (NaN) and a separate y; cuSPARSE with C prefilled by y
// (an unwritten C fails the check). Bytes: nnz*8 + (M+1)*4 + K*N*4 + 2*M*N*4 (y read + out write); "gath" is the
// L2->SM gather volume nnz*N*4.
// Then the dense vector work of one block iteration at k = 16 on [16, m] and [16, n] (scale 1r1w, norm 1r,
// h-update 2r1w, hbar/x-update 3r2w, transposes [16,L]<->[L,16]) and a per-problem model of the iteration.
#pragma once

namespace lsmr_block {

constexpr int kN = 16;

// ------------------------------------------------------------------------------------------- bench-only kernels
// 4*S lanes per row (S slots x 4 column lanes, float4 each: N = 16), rows [r0, r1). kT: y/out are [N, M].
template <int S, bool kT>
__global__ void __launch_bounds__(256) SlotsKernel(SpmmArgs<float, float> a, int64_t r0, int64_t r1) {
  constexpr int L = 4 * S;
  const int lane = threadIdx.x & (L - 1), slot = lane >> 2, cl = lane & 3;
  const unsigned mask = L == 32 ? 0xffffffffu : ((1u << L) - 1u) << ((threadIdx.x & 31u) & ~unsigned(L - 1));
  const int64_t team = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / L;
  const int64_t teams = static_cast<int64_t>(gridDim.x) * blockDim.x / L;
  const uint32_t k = static_cast<uint32_t>(a.k);
  const float4* b4 = reinterpret_cast<const float4*>(a.b);
  for (int64_t r = r0 + team; r < r1; r += teams) {
    int64_t s, e;
    RowRange(a, r, &s, &e);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    auto fma = [&](int c, float v) {
      if (static_cast<uint32_t>(c) < k) {
        const float4 bv = __ldg(b4 + static_cast<int64_t>(c) * (kN / 4) + cl);
        acc[0] += v * bv.x, acc[1] += v * bv.y, acc[2] += v * bv.z, acc[3] += v * bv.w;
      }
    };
    int64_t p = s + slot;
    for (; p + 3 * S < e; p += 4 * S) {
      int c[4];
      float v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) c[j] = __ldg(a.indices + p + j * S), v[j] = __ldg(a.values + p + j * S);
#pragma unroll
      for (int j = 0; j < 4; ++j) fma(c[j], v[j]);
    }
    for (; p < e; p += S) fma(__ldg(a.indices + p), __ldg(a.values + p));
#pragma unroll
    for (int off = 4; off < L; off <<= 1)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[i] += __shfl_xor_sync(mask, acc[i], off, L);
    if (slot != 0) continue;
    const int col0 = cl * 4;
    if constexpr (kT) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float o = __ldg(a.alpha + col0 + i) * acc[i];
        if (a.y != nullptr) o += __ldg(a.beta + col0 + i) * a.y[(col0 + i) * a.m + r];
        a.out[(col0 + i) * a.m + r] = o;
      }
    } else {
      float4 yv = make_float4(0.f, 0.f, 0.f, 0.f);
      if (a.y != nullptr) yv = *reinterpret_cast<const float4*>(a.y + r * kN + col0);
      const float* al = a.alpha + col0;
      const float* be = a.beta + col0;
      const bool hy = a.y != nullptr;
      float4 o;
      o.x = al[0] * acc[0] + (hy ? be[0] * yv.x : 0.f), o.y = al[1] * acc[1] + (hy ? be[1] * yv.y : 0.f);
      o.z = al[2] * acc[2] + (hy ? be[2] * yv.z : 0.f), o.w = al[3] * acc[3] + (hy ? be[3] * yv.w : 0.f);
      *reinterpret_cast<float4*>(a.out + r * kN + col0) = o;
    }
  }
}

template <int S, bool kT>
static void LaunchSlots(const SpmmArgs<float, float>& a, int64_t r0, int64_t r1, int sms) {
  if (r1 <= r0) return;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(int64_t{sms} * 64, ((r1 - r0) * 4 * S + 255) / 256));
  SlotsKernel<S, kT><<<static_cast<unsigned>(blocks), 256>>>(a, r0, r1);
}

// Dense vector passes over [16, L] (row-major; L = m or n): grid (x, 16), blockIdx.y is the row of the block.
#define LSMR_BLOCK_ROW_LOOP(i) \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < L; i += int64_t{gridDim.x} * blockDim.x)
__global__ void VScale(const float* __restrict__ x, const float* __restrict__ s, float* __restrict__ y, int64_t L) {
  const int64_t o = blockIdx.y * L;
  const float c = __ldg(s + blockIdx.y);
  LSMR_BLOCK_ROW_LOOP(i) y[o + i] = x[o + i] * c;
}
__global__ void VAxpy(const float* __restrict__ v, const float* __restrict__ h, const float* __restrict__ s,
                      float* __restrict__ out, int64_t L) {  // h <- v + c h (2 reads, 1 write)
  const int64_t o = blockIdx.y * L;
  const float c = __ldg(s + blockIdx.y);
  LSMR_BLOCK_ROW_LOOP(i) out[o + i] = v[o + i] + c * h[o + i];
}
__global__ void VHbarX(const float* __restrict__ h, const float* __restrict__ hb, const float* __restrict__ x,
                       const float* __restrict__ s, float* __restrict__ hb_out, float* __restrict__ x_out,
                       int64_t L) {  // 3 reads, 2 writes
  const int64_t o = blockIdx.y * L;
  const float ch = __ldg(s + blockIdx.y), cx = __ldg(s + kN + blockIdx.y);
  LSMR_BLOCK_ROW_LOOP(i) {
    const float nb = h[o + i] - ch * hb[o + i];
    hb_out[o + i] = nb, x_out[o + i] = x[o + i] + cx * nb;
  }
}
#undef LSMR_BLOCK_ROW_LOOP
__global__ void VNormPartial(const float* __restrict__ x, float* __restrict__ part, int64_t L) {
  __shared__ float red[256];
  const int row = blockIdx.y;
  float s = 0.f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < L; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[row * L + i];
    s += v * v;
  }
  red[threadIdx.x] = s;
  __syncthreads();
  for (int w = 128; w > 0; w >>= 1) {
    if (threadIdx.x < w) red[threadIdx.x] += red[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) part[row * gridDim.x + blockIdx.x] = red[0];
}
__global__ void VNormFinal(const float* __restrict__ part, float* __restrict__ out, int parts) {
  if (threadIdx.x >= kN) return;
  float s = 0.f;
  for (int i = 0; i < parts; ++i) s += part[threadIdx.x * parts + i];
  out[threadIdx.x] = sqrtf(s);
}
// [16, L] -> [L, 16] (kToRows) or [L, 16] -> [16, L], 256 columns per CTA through shared memory.
template <bool kToRows>
__global__ void VTranspose(const float* __restrict__ in, float* __restrict__ out, int64_t L) {
  __shared__ float t[kN][257];
  for (int64_t l0 = blockIdx.x * int64_t{256}; l0 < L; l0 += int64_t{gridDim.x} * 256) {
    const int64_t w = L - l0 < 256 ? L - l0 : 256;
    if constexpr (kToRows) {
      for (int r = 0; r < kN; ++r)
        if (threadIdx.x < w) t[r][threadIdx.x] = in[r * L + l0 + threadIdx.x];
      __syncthreads();
      for (int j = 0; j < kN; ++j) {
        const int q = j * 256 + threadIdx.x;
        if (q / kN < w) out[(l0 + q / kN) * kN + q % kN] = t[q % kN][q / kN];
      }
    } else {
      for (int j = 0; j < kN; ++j) {
        const int q = j * 256 + threadIdx.x;
        if (q / kN < w) t[q % kN][q / kN] = in[(l0 + q / kN) * kN + q % kN];
      }
      __syncthreads();
      for (int r = 0; r < kN; ++r)
        if (threadIdx.x < w) out[r * L + l0 + threadIdx.x] = t[r][threadIdx.x];
    }
    __syncthreads();
  }
}

// ------------------------------------------------------------------------------------------------ host side
// LSMR bench's LSQ pattern (jax_ops/bench/lsmr.py _build): exactly `per_row` uniform random columns per row.
static Csr LsmrLsq(int64_t m, int64_t k, int per_row, const char* name) {
  Rng rng(11);
  return FromLens(name, m, k, std::vector<int64_t>(m, per_row), rng, true);
}

// float64 out[M, N] = A @ B for row-major B [K, N].
static std::vector<double> RefN(const Csr& a, const std::vector<float>& b) {
  std::vector<double> out(a.m * kN, 0.0);
  for (int64_t r = 0; r < a.m; ++r) {
    double s[kN] = {};
    for (int32_t p = a.indptr[r]; p < a.indptr[r + 1]; ++p) {
      const int32_t c = a.indices[p];
      if (c < 0 || c >= a.k) continue;
      const double v = a.values[p];
      for (int j = 0; j < kN; ++j) s[j] += v * b[c * kN + j];
    }
    for (int j = 0; j < kN; ++j) out[r * kN + j] = s[j];
  }
  return out;
}

struct BlockCase {
  const Csr* h = nullptr;
  DevCsr d;
  float *b = nullptr, *bt = nullptr, *y = nullptr, *yt = nullptr, *out = nullptr, *alpha = nullptr, *beta = nullptr;
  float* ws = nullptr;
  int32_t *long_rows = nullptr, *long_ptr = nullptr;
  std::vector<float> hy;       // row-major y [M, N]
  std::vector<double> ref;     // alpha[j] * (A B)[r, j] + beta[j] * y[r, j], row-major
  std::vector<double> ref_cs;  // 1 * (A B) - 0.5 * y (cuSPARSE's scalar alpha/beta)
  double bytes = 0, gather = 0;
  int sms = 0;
};

static void ToDev(float** p, const std::vector<float>& h) {
  CHECK(cudaMalloc(p, std::max<size_t>(1, h.size()) * 4));
  CHECK(cudaMemcpy(*p, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
}

static void Setup(BlockCase& c, const Csr& h, int sms) {
  c.h = &h, c.sms = sms, c.d = Upload(h);
  Rng rng(99);
  std::vector<float> hb(h.k * kN), hbt(h.k * kN), hyt(h.m * kN), al(kN), be(kN);
  c.hy.resize(h.m * kN);
  for (auto& v : hb) v = static_cast<float>(rng.uniform() * 2 - 1);
  for (auto& v : c.hy) v = static_cast<float>(rng.uniform() * 2 - 1);
  for (int64_t i = 0; i < h.k; ++i)
    for (int j = 0; j < kN; ++j) hbt[j * h.k + i] = hb[i * kN + j];
  for (int64_t i = 0; i < h.m; ++i)
    for (int j = 0; j < kN; ++j) hyt[j * h.m + i] = c.hy[i * kN + j];
  for (int j = 0; j < kN; ++j) al[j] = 1.0f + 0.01f * j, be[j] = -0.5f;
  ToDev(&c.b, hb), ToDev(&c.bt, hbt), ToDev(&c.y, c.hy), ToDev(&c.yt, hyt), ToDev(&c.alpha, al), ToDev(&c.beta, be);
  CHECK(cudaMalloc(&c.out, h.m * kN * 4));
  const std::vector<double> ab = RefN(h, hb);
  c.ref.resize(ab.size()), c.ref_cs.resize(ab.size());
  for (int64_t i = 0; i < h.m; ++i)
    for (int j = 0; j < kN; ++j) {
      const int64_t q = i * kN + j;
      c.ref[q] = double(al[j]) * ab[q] + double(be[j]) * c.hy[q];
      c.ref_cs[q] = ab[q] - 0.5 * c.hy[q];
    }
  c.bytes = double(h.nnz()) * 8 + double(h.m + 1) * 4 + double(h.k) * kN * 4 + 2.0 * h.m * kN * 4;
  c.gather = double(h.nnz()) * kN * 4;
}

static void SetLists(BlockCase& c, int64_t chunk, int64_t* num_long, int64_t* units) {
  cudaFree(c.long_rows), cudaFree(c.long_ptr), cudaFree(c.ws);
  std::vector<int32_t> rows, ptr;
  LongLists(*c.h, chunk, &rows, &ptr);
  *num_long = static_cast<int64_t>(rows.size()), *units = ptr.back();
  CHECK(cudaMalloc(&c.long_rows, std::max<size_t>(1, rows.size()) * 4));
  CHECK(cudaMalloc(&c.long_ptr, ptr.size() * 4));
  CHECK(cudaMalloc(&c.ws, std::max<int64_t>(1, *units * kN) * 4));
  if (!rows.empty()) CHECK(cudaMemcpy(c.long_rows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(c.long_ptr, ptr.data(), ptr.size() * 4, cudaMemcpyHostToDevice));
}

static void FreeBlock(BlockCase& c) {
  for (float* p : {c.b, c.bt, c.y, c.yt, c.out, c.alpha, c.beta, c.ws}) cudaFree(p);
  cudaFree(c.long_rows), cudaFree(c.long_ptr);
  Free(c.d);
}

// SpmmArgs for N = 16 on this case; `yl`/`outl` select the layout's buffers.
static SpmmArgs<float, float> Args(const BlockCase& c, bool transposed_layout) {
  SpmmArgs<float, float> a;
  a.indptr = c.d.indptr, a.indices = c.d.indices, a.values = c.d.values, a.b = c.b;
  a.alpha = c.alpha, a.beta = c.beta, a.y = transposed_layout ? c.yt : c.y, a.out = c.out, a.ws = c.ws;
  a.long_rows = c.long_rows, a.long_ptr = c.long_ptr;
  a.m = c.d.m, a.k = c.d.k, a.n = kN, a.nnz = c.d.nnz;
  return a;
}

// Compare c.out (layout: row-major [M, N] or [N, M]) with `ref` (row-major).
static double Err(const BlockCase& c, const std::vector<double>& ref, bool transposed_layout) {
  const int64_t m = c.h->m;
  std::vector<float> out(m * kN);
  CHECK(cudaMemcpy(out.data(), c.out, m * kN * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int j = 0; j < kN; ++j) {
      const float o = transposed_layout ? out[j * m + i] : out[i * kN + j];
      if (!std::isfinite(o)) return INFINITY;
      const double r = ref[i * kN + j];
      num += (o - r) * (o - r), den += r * r;
    }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct BRes {
  std::string plan;
  double us = 0, err = 0;
  bool ok = false;
};

static FILE* g_bcsv = nullptr;

static void PrintB(const BlockCase& c, const BRes& r, double lib_us) {
  std::printf("  %-44s %9.1f us %6.0f GB/s %6.0f gath %5.2fx lib  err %.1e%s\n", r.plan.c_str(), r.us,
              c.bytes / (r.us * 1e-6) / 1e9, c.gather / (r.us * 1e-6) / 1e9, lib_us > 0 ? lib_us / r.us : 0.0, r.err,
              r.ok ? "" : "  FAIL");
}

// Ours: verify with out poisoned (y separate, per-column alpha, beta -0.5), then time in place (y = out, as the FFI
// alias does). `launch(args)` runs the candidate on the given args.
static BRes MeasureOurs(BlockCase& c, const std::string& plan, bool tl,
                        const std::function<void(const SpmmArgs<float, float>&)>& launch) {
  BRes r;
  r.plan = plan;
  SpmmArgs<float, float> a = Args(c, tl);
  CHECK(cudaMemset(c.out, 0xFF, c.h->m * kN * 4));
  launch(a);
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  r.err = Err(c, c.ref, tl);
  r.ok = r.err < 1e-5;
  a.y = c.out;  // in place: y aliased to out
  CHECK(cudaMemcpy(c.out, tl ? c.yt : c.y, c.h->m * kN * 4, cudaMemcpyDeviceToDevice));
  r.us = MedianUs([&] { launch(a); }, c.bytes > 1e8 ? 20 : 100);
  return r;
}

static BRes CusparseSpmm(BlockCase& c, cusparseHandle_t h, cusparseSpMMAlg_t alg, bool col_major, const char* name) {
  BRes r;
  r.plan = std::string(name) + (col_major ? " col-major [16,K]" : " row-major [K,16]");
  const int64_t m = c.h->m, k = c.h->k;
  cusparseSpMatDescr_t A;
  cusparseDnMatDescr_t B, C;
  CHECK_SP(cusparseCreateCsr(&A, m, k, c.d.nnz, c.d.indptr, c.d.indices, c.d.values, CUSPARSE_INDEX_32I,
                             CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
  const cusparseOrder_t ord = col_major ? CUSPARSE_ORDER_COL : CUSPARSE_ORDER_ROW;
  CHECK_SP(cusparseCreateDnMat(&B, k, kN, col_major ? k : kN, col_major ? c.bt : c.b, CUDA_R_32F, ord));
  CHECK_SP(cusparseCreateDnMat(&C, m, kN, col_major ? m : kN, c.out, CUDA_R_32F, ord));
  const float one = 1.0f, mhalf = -0.5f;
  const auto nt = CUSPARSE_OPERATION_NON_TRANSPOSE;
  size_t wsb = 0;
  void* buf = nullptr;
  if (cusparseSpMM_bufferSize(h, nt, nt, &one, A, B, &mhalf, C, CUDA_R_32F, alg, &wsb) != CUSPARSE_STATUS_SUCCESS) {
    r.plan += " (unsupported)";
  } else {
    CHECK(cudaMalloc(&buf, std::max<size_t>(wsb, 16)));
    cusparseSpMM_preprocess(h, nt, nt, &one, A, B, &mhalf, C, CUDA_R_32F, alg, buf);  // where it applies
    CHECK(cudaMemcpy(c.out, col_major ? c.yt : c.y, m * kN * 4, cudaMemcpyDeviceToDevice));
    const cusparseStatus_t st = cusparseSpMM(h, nt, nt, &one, A, B, &mhalf, C, CUDA_R_32F, alg, buf);
    CHECK(cudaDeviceSynchronize());
    if (st != CUSPARSE_STATUS_SUCCESS) {
      r.plan += " (unsupported)";
    } else {
      r.err = Err(c, c.ref_cs, col_major);
      r.ok = r.err < 1e-5;
      r.us = MedianUs([&] { CHECK_SP(cusparseSpMM(h, nt, nt, &one, A, B, &mhalf, C, CUDA_R_32F, alg, buf)); },
                      c.bytes > 1e8 ? 20 : 100);
    }
  }
  cudaFree(buf);
  cusparseDestroySpMat(A), cusparseDestroyDnMat(B), cusparseDestroyDnMat(C);
  return r;
}

// First row after the leading segments of the 4096-row table (spmv_bench Segments, the library's table) whose G is
// >= 16: the long-row class at the top of ba-like's CSR(Aᵀ) (camera rows); 0 when the first segment is short.
static int64_t LongPrefixRows(const Csr& h) {
  std::vector<int32_t> table, ptr;
  Segments(h, 4096, 1.0, &table, &ptr);
  int64_t end = 0;
  for (size_t s = 0; s + 2 < table.size() && table[s + 2] >= 16; s += 3) end = table[s + 1];
  return end;
}

struct OpRow {
  std::string mat, op, lib_plan, best_plan, cusp_plan;
  double lib = 0, best = 0, cusp = 0, best_t = 0;  // best_t: best candidate writing the [N, M] layout
  std::string best_t_plan;
};
static std::vector<OpRow> g_ops;

template <int G, int VEC>
static void GroupLaunch(const SpmmArgs<float, float>& a, int sms) {
  const int64_t tiles = (a.n + int64_t{G} * VEC - 1) / (int64_t{G} * VEC);
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(int64_t{sms} * 64, (a.m * tiles * G + 255) / 256));
  SpmmGroupKernel<float, float, G, VEC><<<static_cast<unsigned>(blocks), 256>>>(a, false);
}

static void OpCase(const Csr& h, const char* op, cusparseHandle_t handle, int sms) {
  BlockCase c;
  Setup(c, h, sms);
  const Profile p = ProfileOf(h);
  const int64_t r_long = LongPrefixRows(h);
  std::printf(
      "\n== %s  %s N=16: M=%lld K=%lld nnz=%lld avg=%.1f p95=%.0f max=%lld long-prefix rows=%lld, %.1f MB, "
      "gather %.0f MB\n",
      h.name.c_str(), op, (long long)h.m, (long long)h.k, (long long)h.nnz(), p.avg, p.p95, (long long)p.max,
      (long long)r_long, c.bytes / 1e6, c.gather / 1e6);
  OpRow row;
  row.mat = h.name, row.op = op;
  std::vector<BRes> all;
  auto ours = [&](const std::string& nm, bool tl, const std::function<void(const SpmmArgs<float, float>&)>& f) {
    all.push_back(MeasureOurs(c, nm, tl, f));
    PrintB(c, all.back(), row.lib);
    return all.back();
  };
  // -- the library's plan today (jax_ops.sparse: choose_algorithm, then spmm_takes_split for N > 1)
  {
    const bool long_rows = p.max > std::max(2048.0, 32 * p.avg);
    const int64_t g = 4, tiles = 1;  // N = 16, VEC = 4: G = nextpow2(16 / 4)
    const int64_t nnz = h.nnz();
    const int64_t units_max = nnz / 256 + nnz / 257;
    const int64_t slots = SlotsFor(static_cast<double>(nnz) / h.m, g);  // the 16-byte path's lanes per row / g
    const bool takes = !long_rows && nnz >= 512 * h.m && units_max * kN * 4 <= (int64_t{1} << 28) &&
                       h.m * g * slots * tiles < (int64_t{1} << 16);
    int64_t nl = 0, un = 0;
    std::string nm;
    if (long_rows || takes) {
      SetLists(c, 256, &nl, &un);
      nm = std::string("library: split chunk=256") + (takes ? " (spmm_takes_split)" : "");
    } else {
      nm = "library: slots S=" + std::to_string(slots) + " (vector path)";
    }
    const BRes lib = ours(nm, false, [&](const SpmmArgs<float, float>& a0) {
      SpmmArgs<float, float> a = a0;
      if (long_rows || takes) a.algorithm = kSplit, a.chunk = 256, a.num_long = nl, a.units = un;
      CHECK((LaunchCsrSpmm<float, float>(nullptr, a, true, sms)));
    });
    row.lib = lib.ok ? lib.us : 0, row.lib_plan = nm;
  }
  // -- group kernel (the library's 16-byte kernel before the slots kernel: G = 4, VEC = 4) and other G / VEC
  ours("group G=4 VEC=4 (previous library kernel)", false,
       [&](const SpmmArgs<float, float>& a) { GroupLaunch<4, 4>(a, sms); });
  ours("group G=8 VEC=4", false, [&](const SpmmArgs<float, float>& a) { GroupLaunch<8, 4>(a, sms); });
  ours("group G=16 VEC=1", false, [&](const SpmmArgs<float, float>& a) { GroupLaunch<16, 1>(a, sms); });
  ours("group G=32 VEC=1", false, [&](const SpmmArgs<float, float>& a) { GroupLaunch<32, 1>(a, sms); });
  // -- forced split (rows longer than the chunk cut into units)
  for (int64_t chunk : {32, 64, 128, 256, 512}) {
    if (p.max <= chunk) continue;
    int64_t nl = 0, un = 0;
    SetLists(c, chunk, &nl, &un);
    char nm[96];
    std::snprintf(nm, sizeof nm, "split chunk=%lld (%lld long rows, %lld units)", (long long)chunk, (long long)nl,
                  (long long)un);
    ours(nm, false, [&](const SpmmArgs<float, float>& a0) {
      SpmmArgs<float, float> a = a0;
      a.algorithm = kSplit, a.chunk = chunk, a.num_long = nl, a.units = un;
      CHECK((LaunchCsrSpmm<float, float>(nullptr, a, true, sms)));
    });
  }
  // -- slots kernel over all rows, both layouts
  ours("slots S=1 (4 lanes/row)", false,
       [&](const SpmmArgs<float, float>& a) { LaunchSlots<1, false>(a, 0, a.m, sms); });
  ours("slots S=1 T (y/out [16,M])", true,
       [&](const SpmmArgs<float, float>& a) { LaunchSlots<1, true>(a, 0, a.m, sms); });
  if (p.avg >= 32) {
    ours("slots S=2", false, [&](const SpmmArgs<float, float>& a) { LaunchSlots<2, false>(a, 0, a.m, sms); });
    ours("slots S=4", false, [&](const SpmmArgs<float, float>& a) { LaunchSlots<4, false>(a, 0, a.m, sms); });
    ours("slots S=8", false, [&](const SpmmArgs<float, float>& a) { LaunchSlots<8, false>(a, 0, a.m, sms); });
    ours("slots S=8 T", true, [&](const SpmmArgs<float, float>& a) { LaunchSlots<8, true>(a, 0, a.m, sms); });
  }
  // -- hybrid (segmented-like): slots on the long prefix, the library group kernel / slots S=1 on the rest
  if (r_long > 0 && r_long < h.m) {
    for (int s8 : {4, 8}) {
      ours("hybrid slots S=" + std::to_string(s8) + " rows<" + std::to_string(r_long) + " + group G=4 rest", false,
           [&](const SpmmArgs<float, float>& a) {
             if (s8 == 4)
               LaunchSlots<4, false>(a, 0, r_long, sms);
             else
               LaunchSlots<8, false>(a, 0, r_long, sms);
             SpmmArgs<float, float> b = a;
             b.indptr += r_long, b.out += r_long * kN, b.y += r_long * kN, b.m = a.m - r_long;
             CHECK((LaunchCsrSpmm<float, float>(nullptr, b, true, sms)));
           });
    }
    ours("hybrid T slots S=8 long + S=1 rest", true, [&](const SpmmArgs<float, float>& a) {
      LaunchSlots<8, true>(a, 0, r_long, sms);
      LaunchSlots<1, true>(a, r_long, a.m, sms);
    });
  }
  row.best = 1e30;
  row.best_t = 1e30;
  for (size_t i = 0; i < all.size(); ++i) {
    const bool tl = all[i].plan.find(" T") != std::string::npos;
    if (!all[i].ok) continue;
    if (all[i].us < row.best) row.best = all[i].us, row.best_plan = all[i].plan;
    if (tl && all[i].us < row.best_t) row.best_t = all[i].us, row.best_t_plan = all[i].plan;
  }
  // -- cuSPARSE anchor
  row.cusp = 1e30;
  const std::pair<cusparseSpMMAlg_t, const char*> algs[] = {{CUSPARSE_SPMM_ALG_DEFAULT, "cuSPARSE SpMM default"},
                                                            {CUSPARSE_SPMM_CSR_ALG1, "cuSPARSE SpMM CSR_ALG1"},
                                                            {CUSPARSE_SPMM_CSR_ALG2, "cuSPARSE SpMM CSR_ALG2"},
                                                            {CUSPARSE_SPMM_CSR_ALG3, "cuSPARSE SpMM CSR_ALG3"}};
  for (const auto& [alg, nm] : algs)
    for (bool col : {false, true}) {
      const BRes r = CusparseSpmm(c, handle, alg, col, nm);
      if (r.us > 0)
        PrintB(c, r, row.lib);
      else
        std::printf("  %s\n", r.plan.c_str());
      if (r.ok && r.us < row.cusp) row.cusp = r.us, row.cusp_plan = r.plan;
      all.push_back(r);
    }
  if (g_bcsv)
    for (auto& r : all)
      std::fprintf(g_bcsv, "%s,%s,%s,%.2f,%.1f,%.3e,%d\n", h.name.c_str(), op, r.plan.c_str(), r.us,
                   r.us > 0 ? c.bytes / (r.us * 1e-6) / 1e9 : 0.0, r.err, int(r.ok));
  g_ops.push_back(row);
  FreeBlock(c);
}

// Dense vector passes at k = 16 over [16, L]; returns {scale, norm, axpy(2r1w), hbar_x(3r2w), T to rows, T back}.
struct VecTimes {
  double scale = 0, norm = 0, axpy = 0, hbarx = 0, t_rows = 0, t_back = 0;
  bool ok = false;
};

static VecTimes VectorPasses(int64_t L, int sms) {
  VecTimes t;
  const int64_t e = kN * L;
  float *x, *y, *z, *w, *v, *c, *part, *nrm;
  for (float** p : {&x, &y, &z, &w, &v}) CHECK(cudaMalloc(p, e * 4));
  CHECK(cudaMalloc(&c, 2 * kN * 4));
  const int parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(8 * sms / kN, (L + 255) / 256)));
  CHECK(cudaMalloc(&part, kN * parts * 4));
  CHECK(cudaMalloc(&nrm, kN * 4));
  std::vector<float> hx(e), hc(2 * kN, 0.5f);
  Rng rng(5);
  for (auto& q : hx) q = static_cast<float>(rng.uniform() * 2 - 1);
  CHECK(cudaMemcpy(x, hx.data(), e * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(c, hc.data(), 2 * kN * 4, cudaMemcpyHostToDevice));
  for (float* p : {y, z, w, v}) CHECK(cudaMemcpy(p, x, e * 4, cudaMemcpyDeviceToDevice));
  const dim3 grid(static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(int64_t{sms}, (L + 255) / 256))), kN);
  const unsigned tgrid = static_cast<unsigned>(std::min<int64_t>(int64_t{sms} * 16, (L + 255) / 256));
  const int reps = e * 4 > 1e7 ? 50 : 200;
  t.scale = MedianUs([&] { VScale<<<grid, 256>>>(x, c, y, L); }, reps);
  t.norm = MedianUs(
      [&] {
        VNormPartial<<<dim3(parts, kN), 256>>>(x, part, L);
        VNormFinal<<<1, 32>>>(part, nrm, parts);
      },
      reps);
  t.axpy = MedianUs([&] { VAxpy<<<grid, 256>>>(x, y, c, z, L); }, reps);
  t.hbarx = MedianUs([&] { VHbarX<<<grid, 256>>>(x, y, z, c, w, v, L); }, reps);
  t.t_rows = MedianUs([&] { VTranspose<true><<<tgrid, 256>>>(x, y, L); }, reps);
  t.t_back = MedianUs([&] { VTranspose<false><<<tgrid, 256>>>(y, z, L); }, reps);
  // checks: the round trip is the identity, the norms match float64
  std::vector<float> hz(e), hy(e), hn(kN);
  CHECK(cudaMemcpy(hz.data(), z, e * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hy.data(), y, e * 4, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hn.data(), nrm, kN * 4, cudaMemcpyDeviceToHost));
  t.ok = hz == hx;
  for (int64_t i = 0; i < L && t.ok; i += std::max<int64_t>(1, L / 997))
    for (int j = 0; j < kN; ++j) t.ok = t.ok && hy[i * kN + j] == hx[j * L + i];
  for (int j = 0; j < kN; ++j) {
    double s = 0;
    for (int64_t i = 0; i < L; ++i) s += double(hx[j * L + i]) * hx[j * L + i];
    t.ok = t.ok && std::fabs(hn[j] - std::sqrt(s)) <= 1e-4 * std::sqrt(s);
  }
  for (float* p : {x, y, z, w, v, c, part, nrm}) cudaFree(p);
  return t;
}

struct Problem {
  const char* name;
  std::function<Csr()> gen;
  double one_us, ratio;  // docs/lsmr.md 2026-12-01: single-solve us/iter and the 16-RHS / 1 time ratio
};

static int Run(int sms, const char* csv) {
  if (csv) {
    g_bcsv = std::fopen(csv, "w");
    if (g_bcsv) std::fprintf(g_bcsv, "matrix,op,plan,us,GBps,err,ok\n");
  }
  cusparseHandle_t handle;
  CHECK_SP(cusparseCreate(&handle));
  const Problem probs[] = {
      {"8kv-like", [] { return LsmrLsq(306136, 6177, 18, "8kv-like 306136x6177"); }, 66.1, 3.73},
      {"11kv-like", [] { return LsmrLsq(936063, 23394, 21, "11kv-like 936063x23394"); }, 158.6, 4.07},
      {"ba-like", [] { return BundleAdjustment(500000, 2000, 200000, "ba-like 1Mx618k"); }, 136.5, 4.70},
  };
  struct PRow {
    std::string name;
    VecTimes vm, vn;
    double one_us, ratio;
    int64_t m, n;
  };
  std::vector<PRow> prow;
  int fails = 0;
  for (const auto& pr : probs) {
    const Csr a = pr.gen();
    const Csr t = Transpose(a);
    OpCase(a, "AV", handle, sms);
    OpCase(t, "ATU", handle, sms);
    PRow r{pr.name, VectorPasses(a.m, sms), VectorPasses(a.k, sms), pr.one_us, pr.ratio, a.m, a.k};
    std::printf(
        "\n-- %s vector passes at k=16 (us): [16,m=%lld] scale %.1f norm %.1f axpy %.1f hbarx %.1f T->rows %.1f "
        "T->back %.1f | [16,n=%lld] scale %.1f norm %.1f axpy %.1f hbarx %.1f T->rows %.1f T->back %.1f%s\n",
        pr.name, (long long)a.m, r.vm.scale, r.vm.norm, r.vm.axpy, r.vm.hbarx, r.vm.t_rows, r.vm.t_back, (long long)a.k,
        r.vn.scale, r.vn.norm, r.vn.axpy, r.vn.hbarx, r.vn.t_rows, r.vn.t_back,
        r.vm.ok && r.vn.ok ? "" : "  FAIL (vector pass check)");
    std::printf("   scale GB/s: m %.0f, n %.0f\n", 2.0 * kN * a.m * 4 / (r.vm.scale * 1e-6) / 1e9,
                2.0 * kN * a.k * 4 / (r.vn.scale * 1e-6) / 1e9);
    fails += !(r.vm.ok && r.vn.ok);
    prow.push_back(r);
  }
  cusparseDestroy(handle);
  for (auto& o : g_ops) fails += o.lib == 0;

  std::printf(
      "\n--lsmr-block summary: SpMM N=16 (us; in place; x = library / candidate)\n%-24s %-4s %8s %8s %5s %8s "
      "%5s %8s %5s  %s | %s | %s\n",
      "matrix", "op", "library", "best", "x", "best[N,M]", "x", "cuSPARSE", "x", "best plan", "best [16,M] plan",
      "cuSPARSE plan");
  for (auto& o : g_ops)
    std::printf("%-24s %-4s %8.1f %8.1f %5.2f %8.1f %5.2f %8.1f %5.2f  %s | %s | %s\n", o.mat.c_str(), o.op.c_str(),
                o.lib, o.best, o.lib / o.best, o.best_t, o.lib / o.best_t, o.cusp, o.lib / o.cusp, o.best_plan.c_str(),
                o.best_t_plan.c_str(), o.cusp_plan.c_str());
  // Iteration model: 2 SpMMs + vector passes. Today (vmap fold): 3 transposes on each side (m: U as y [T->rows],
  // u as B of Aᵀ [T->rows], out back [T->back]; n: V as B, v as y [T->rows], out back [T->back]) plus norm + scale
  // on each side and hbar/x (3r2w), h (2r1w), ||x|| on the n side. "no-T": vectors kept [L, 16] (no transposes).
  std::printf(
      "\n--lsmr-block iteration model (us per iteration, k=16). vec: vector passes with the vmap fold's 6 "
      "transposes; noT: none (vectors kept [L,16]); est: doc residual + SpMMs + vec for: today's plans, the "
      "best row-major plans, the best plans writing y/out as [16,M] (2 of the 3 transposes per side gone), "
      "the best row-major plans with vectors kept [L,16] (no transposes)\n%-10s %7s %7s %8s %8s %8s %8s "
      "%8s %8s %8s %8s %6s %6s %6s\n",
      "problem", "vec", "vec noT", "SpMM lib", "SpMM bst", "doc x16", "resid", "est bst", "est T", "est noT", "target",
      "r@bst", "r@T", "r@noT");
  for (size_t i = 0; i < prow.size(); ++i) {
    const PRow& r = prow[i];
    const OpRow& av = g_ops[2 * i];
    const OpRow& atu = g_ops[2 * i + 1];
    const double tm = 2 * r.vm.t_rows + r.vm.t_back, tn = 2 * r.vn.t_rows + r.vn.t_back;
    const double vnot = r.vm.norm + r.vm.scale + r.vn.norm + r.vn.scale + r.vn.hbarx + r.vn.axpy + r.vn.norm;
    const double vec = vnot + tm + tn;
    const double lib = av.lib + atu.lib, best = av.best + atu.best;
    const double best_t = std::min(av.best_t, av.best) + std::min(atu.best_t, atu.best);
    const double doc = r.one_us * r.ratio, target = 4 * r.one_us;
    const double resid = doc - (lib + vec);  // launches, scalar work, copies: not modelled, carried as measured
    const double e_b = resid + best + vec, e_t = resid + best_t + vnot + r.vm.t_rows + r.vn.t_rows,
                 e_n = resid + best + vnot;
    std::printf("%-10s %7.1f %7.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f %6.2f %6.2f %6.2f\n", r.name.c_str(),
                vec, vnot, lib, best, doc, resid, e_b, e_t, e_n, target, e_b / r.one_us, e_t / r.one_us,
                e_n / r.one_us);
  }
  std::printf(
      "(doc x16 = docs/lsmr.md 2026-12-01 one-solve us/iter x the 16/1 ratio; resid = doc x16 - (SpMM lib + "
      "vec), negative when XLA fuses the transposes away; r@ = estimated 16/1 ratio; target = 4 x one)\n");
  if (g_bcsv) std::fclose(g_bcsv);
  return fails ? 1 : 0;
}

}  // namespace lsmr_block
