// CPU twin of jax_ops_gemm (contract in params.h): a blocked GEMM whose operands are decoded into packed panels of
// the accumulator type (f32, f64, or wrapping 32-bit integers for int8), each kTileN-column strip of the output
// accumulated over K in k order, then the shared epilogue of epilogue.h applied once per element.
// Single-threaded; written for contract tests, not for speed. The `plan` attribute selects CUDA kernels only: this
// twin has one kernel and runs every plan.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/dtype_traits.h"
#include "gemm/bindings.h"
#include "gemm/epilogue.h"
#include "gemm/params.h"

namespace jax_ops::gemm {
namespace {

using ffi::DataType;

constexpr int64_t kTileN = 64;    // output columns per strip (the packed B panel's width)
constexpr int64_t kBlockK = 256;  // K per packed panel
constexpr int64_t kBlockM = 64;   // rows of op(a) per packed block
constexpr int64_t kRows = 4;      // rows the micro-kernel updates together (kBlockM is a multiple)

// ---------------------------------------------------------------- element decoding (bit-exact)
// e5m2 is the top byte of an IEEE half.
inline float E5m2ToFloat(uint8_t v) { return HalfToFloat(static_cast<uint16_t>(v) << 8); }

// f32 rounded to TF32 (10 mantissa bits, nearest even), as a TF32 tensor-core operand.
inline float RoundToTf32(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return f;  // inf / NaN unchanged
  u += 0xfffu + ((u >> 13) & 1u);
  return BitsToFloat(u & ~0x1fffu);
}

// One dtype's storage type and its value in the accumulator domain.
struct F16Src {
  using T = uint16_t;
  static float Get(T v) { return HalfToFloat(v); }
};
struct Bf16Src {
  using T = uint16_t;
  static float Get(T v) { return Bf16ToFloat(v); }
};
struct F32Src {
  using T = float;
  static float Get(T v) { return v; }
};
struct Tf32Src {
  using T = float;
  static float Get(T v) { return RoundToTf32(v); }
};
struct F64Src {
  using T = double;
  static double Get(T v) { return v; }
};
struct E4m3Src {
  using T = uint8_t;
  static float Get(T v) { return E4m3fnToFloat(v); }
};
struct E5m2Src {
  using T = uint8_t;
  static float Get(T v) { return E5m2ToFloat(v); }
};
struct S8Src {
  using T = int8_t;
  static uint32_t Get(T v) { return static_cast<uint32_t>(static_cast<int32_t>(v)); }
};

// Decodes `count` elements base[start + i * stride] into dst[i].
template <typename Acc>
using RunDecoder = void (*)(const void* base, int64_t start, int64_t stride, int64_t count, Acc* dst);

template <typename Acc, typename Src>
void DecodeRun(const void* base, int64_t start, int64_t stride, int64_t count, Acc* dst) {
  const auto* src = static_cast<const typename Src::T*>(base) + start;
  for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<Acc>(Src::Get(src[i * stride]));
}

// The decoder of an operand dtype into Acc (float: 16-bit, f32, fp8; double: f64; uint32_t: int8).
template <typename Acc>
RunDecoder<Acc> DecoderFor(DataType dt, bool tf32);
template <>
RunDecoder<float> DecoderFor<float>(DataType dt, bool tf32) {
  switch (dt) {
    case DataType::F16:
      return DecodeRun<float, F16Src>;
    case DataType::BF16:
      return DecodeRun<float, Bf16Src>;
    case DataType::F32:
      return tf32 ? DecodeRun<float, Tf32Src> : DecodeRun<float, F32Src>;
    case DataType::F8E4M3FN:
      return DecodeRun<float, E4m3Src>;
    case DataType::F8E5M2:
      return DecodeRun<float, E5m2Src>;
    default:
      return nullptr;
  }
}
template <>
RunDecoder<double> DecoderFor<double>(DataType dt, bool) {
  return dt == DataType::F64 ? DecodeRun<double, F64Src> : nullptr;
}
template <>
RunDecoder<uint32_t> DecoderFor<uint32_t>(DataType dt, bool) {
  return dt == DataType::S8 ? DecodeRun<uint32_t, S8Src> : nullptr;
}

// ---------------------------------------------------------------- packing and the micro-kernel
// A strided matrix view: element (r, c) at data[offset + r * row_stride + c * col_stride]; one stride is 1.
template <typename Acc>
struct MatrixView {
  const void* data;
  int64_t offset, row_stride, col_stride;
  RunDecoder<Acc> decode;
};

// dst[r * ld + c] = view(r0 + r, c0 + c) for r < rows, c < cols; zero up to pad_rows x ld.
template <typename Acc>
void Pack(const MatrixView<Acc>& v, int64_t r0, int64_t rows, int64_t c0, int64_t cols, int64_t pad_rows, int64_t ld,
          Acc* dst, std::vector<Acc>& run) {
  std::fill(dst, dst + pad_rows * ld, Acc(0));
  const int64_t base = v.offset + r0 * v.row_stride + c0 * v.col_stride;
  if (v.col_stride == 1) {
    for (int64_t r = 0; r < rows; ++r) v.decode(v.data, base + r * v.row_stride, 1, cols, dst + r * ld);
    return;
  }
  run.resize(rows);  // column-contiguous storage: decode a column, scatter it
  for (int64_t c = 0; c < cols; ++c) {
    v.decode(v.data, base + c * v.col_stride, 1, rows, run.data());
    for (int64_t r = 0; r < rows; ++r) dst[r * ld + c] = run[r];
  }
}

// acc[i, :] += ap[i, :kc] @ bp[:kc, :] for i < rows (a multiple of kRows); ap rows are kBlockK apart, bp and acc
// rows kTileN apart. Each accumulator sums its products in k order.
template <typename Acc>
void MultiplyBlock(const Acc* __restrict ap, const Acc* __restrict bp, int64_t rows, int64_t kc, Acc* __restrict acc) {
  for (int64_t i = 0; i < rows; i += kRows) {
    Acc* __restrict c0 = acc + i * kTileN;
    Acc* __restrict c1 = c0 + kTileN;
    Acc* __restrict c2 = c1 + kTileN;
    Acc* __restrict c3 = c2 + kTileN;
    const Acc* a0 = ap + i * kBlockK;
    for (int64_t kk = 0; kk < kc; ++kk) {
      const Acc* __restrict b = bp + kk * kTileN;
      const Acc x0 = a0[kk], x1 = a0[kBlockK + kk], x2 = a0[2 * kBlockK + kk], x3 = a0[3 * kBlockK + kk];
      for (int64_t j = 0; j < kTileN; ++j) {
        c0[j] += x0 * b[j];
        c1[j] += x1 * b[j];
        c2[j] += x2 * b[j];
        c3[j] += x3 * b[j];
      }
    }
  }
}

// ---------------------------------------------------------------- epilogue operands
// E: the epilogue's arithmetic type (double for an f64 GEMM, else float).
template <typename E>
E LoadValue(const void* p, int64_t i, DataType dt) {
  switch (dt) {
    case DataType::F16:
      return static_cast<E>(HalfToFloat(static_cast<const uint16_t*>(p)[i]));
    case DataType::BF16:
      return static_cast<E>(Bf16ToFloat(static_cast<const uint16_t*>(p)[i]));
    case DataType::F64:
      return static_cast<E>(static_cast<const double*>(p)[i]);
    default:  // F32 (MakeProblem admits nothing else here)
      return static_cast<E>(static_cast<const float*>(p)[i]);
  }
}

template <typename E>
void StoreValue(void* p, int64_t i, DataType dt, E v) {
  switch (dt) {
    case DataType::F16:
      static_cast<uint16_t*>(p)[i] = FloatToHalf(static_cast<float>(v));
      break;
    case DataType::BF16:
      static_cast<uint16_t*>(p)[i] = FloatToBf16(static_cast<float>(v));
      break;
    case DataType::F64:
      static_cast<double*>(p)[i] = static_cast<double>(v);
      break;
    default:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
  }
}

template <typename E, typename Acc>
E FromAccumulator(Acc v) {
  if constexpr (std::is_same_v<Acc, uint32_t>) {
    return static_cast<E>(static_cast<int32_t>(v));  // int8 products accumulate modulo 2^32, as int32
  } else {
    return static_cast<E>(v);
  }
}

struct Buffers {
  const void *a, *b, *b_up, *bias, *c, *residual;
  const float *a_scale, *b_scale;
  DataType bias_dtype;
  void *out, *preact;
};

// Writes out (and preact) for rows [0, M), columns [n0, n0 + nc) of batch `bi` from the strip accumulators.
template <typename E, typename Acc>
void Epilogue(const Problem& p, const Buffers& buf, int64_t bi, int64_t n0, int64_t nc, const Acc* acc_gate,
              const Acc* acc_up) {
  const bool gated = p.gated != Gated::kNone;
  const E alpha = static_cast<E>(p.alpha), beta = static_cast<E>(p.has_c ? p.beta : 0.0);
  const int64_t n = p.n, preact_cols = p.preact_cols();
  const DataType ot = p.out_dtype;
  for (int64_t m = 0; m < p.m; ++m) {
    const E a_scale = p.a_scale_len ? static_cast<E>(buf.a_scale[p.a_scale_len == 1 ? 0 : m]) : E(1);
    const int64_t row = (bi * p.m + m) * n;
    const int64_t preact_row = (bi * p.m + m) * preact_cols;
    for (int64_t j = 0; j < nc; ++j) {
      const int64_t col = n0 + j, idx = row + col;
      auto scalars = [&](int64_t bias_col) {
        EpilogueScalars<E> s;
        const E b_scale = p.b_scale_len ? static_cast<E>(buf.b_scale[p.b_scale_len == 1 ? 0 : bias_col]) : E(1);
        s.scale = a_scale * b_scale;
        if (p.has_bias) s.bias = LoadValue<E>(buf.bias, bias_col, buf.bias_dtype);
        return s;
      };
      EpilogueScalars<E> s = scalars(col);
      if (beta != E(0)) s.c = LoadValue<E>(buf.c, idx, ot);
      const E residual = p.has_residual ? LoadValue<E>(buf.residual, idx, ot) : E(0);
      const E z = PreActivation(FromAccumulator<E>(acc_gate[m * kTileN + j]), alpha, beta, s);
      E y;
      if (gated) {
        const E z_up = PreActivation(FromAccumulator<E>(acc_up[m * kTileN + j]), alpha, E(0), scalars(n + col));
        y = GatedOutput(p.activation, z, z_up, residual);
        if (p.write_preact) StoreValue<E>(buf.preact, preact_row + n + col, ot, z_up);
      } else {
        y = Output(p.activation, z, residual);
      }
      if (p.write_preact) StoreValue<E>(buf.preact, preact_row + col, ot, z);
      StoreValue<E>(buf.out, idx, ot, y);
    }
  }
}

// ---------------------------------------------------------------- the driver
template <typename Acc>
ffi::Error Run(const Problem& p, const Buffers& buf) {
  using E = std::conditional_t<std::is_same_v<Acc, double>, double, float>;
  const RunDecoder<Acc> decode_a = DecoderFor<Acc>(p.a_dtype, p.tf32);
  const RunDecoder<Acc> decode_b = DecoderFor<Acc>(p.b_dtype, p.tf32);
  JAX_OPS_CHECK_ARG(decode_a != nullptr && decode_b != nullptr,
                    "no CPU decoder for " << DTypeName(p.a_dtype) << " x " << DTypeName(p.b_dtype));
  const bool gated = p.gated != Gated::kNone;
  const int64_t m_pad = (p.m + kRows - 1) / kRows * kRows;
  std::vector<Acc> acc_gate(m_pad * kTileN), acc_up(gated ? m_pad * kTileN : 0);
  std::vector<Acc> a_panel(kBlockM * kBlockK), b_gate(kBlockK * kTileN), b_up(gated ? kBlockK * kTileN : 0);
  std::vector<Acc> run;
  const int64_t ldb = p.ldb();
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    // op(a)[m, k] and op(b)[k, col] of this batch as strided views of the row-major storage.
    const MatrixView<Acc> a{buf.a, bi * p.a_batch_stride(), p.transpose_a ? 1 : p.k, p.transpose_a ? p.m : 1, decode_a};
    const int64_t b_offset = (p.batch_b == 1 ? 0 : bi) * p.b_batch_stride();
    const MatrixView<Acc> gate{buf.b, b_offset, p.transpose_b ? 1 : ldb, p.transpose_b ? ldb : 1, decode_b};
    // The up projection: b_up's columns (separate) or b's columns [N, 2N) (packed).
    const MatrixView<Acc> up{p.gated == Gated::kSeparate ? buf.b_up : buf.b,
                             b_offset + (p.gated == Gated::kPacked ? p.n : 0), gate.row_stride, gate.col_stride,
                             decode_b};
    for (int64_t n0 = 0; n0 < p.n; n0 += kTileN) {
      const int64_t nc = std::min(kTileN, p.n - n0);
      std::fill(acc_gate.begin(), acc_gate.end(), Acc(0));
      std::fill(acc_up.begin(), acc_up.end(), Acc(0));
      for (int64_t k0 = 0; k0 < p.k; k0 += kBlockK) {
        const int64_t kc = std::min(kBlockK, p.k - k0);
        Pack(gate, k0, kc, n0, nc, kc, kTileN, b_gate.data(), run);
        if (gated) Pack(up, k0, kc, n0, nc, kc, kTileN, b_up.data(), run);
        for (int64_t m0 = 0; m0 < p.m; m0 += kBlockM) {
          const int64_t mc = std::min(kBlockM, p.m - m0);
          const int64_t mc_pad = (mc + kRows - 1) / kRows * kRows;
          Pack(a, m0, mc, k0, kc, mc_pad, kBlockK, a_panel.data(), run);
          MultiplyBlock(a_panel.data(), b_gate.data(), mc_pad, kc, acc_gate.data() + m0 * kTileN);
          if (gated) MultiplyBlock(a_panel.data(), b_up.data(), mc_pad, kc, acc_up.data() + m0 * kTileN);
        }
      }
      Epilogue<E>(p, buf, bi, n0, nc, acc_gate.data(), acc_up.data());
    }
  }
  return ffi::Error::Success();
}

ffi::Error GemmCpu(JAX_OPS_GEMM_HANDLER_PARAMS) {
  Problem p;
  JAX_OPS_RETURN_IF_ERROR(MakeProblem(a, b, b_up, bias, c, residual, a_scale, b_scale, alpha, beta, activation, gated,
                                      transpose_a, transpose_b, write_preact, tf32, plan, *out, *preact, &p));
  JAX_OPS_RETURN_IF_ERROR(CheckWorkspace(*workspace));  // the cublaslt plan's scratch: the twin needs none
  const Buffers buf{a.untyped_data(),
                    b.untyped_data(),
                    b_up.untyped_data(),
                    bias.untyped_data(),
                    c.untyped_data(),
                    residual.untyped_data(),
                    static_cast<const float*>(a_scale.untyped_data()),
                    static_cast<const float*>(b_scale.untyped_data()),
                    bias.element_type(),
                    out->untyped_data(),
                    preact->untyped_data()};
  switch (p.a_dtype) {
    case DataType::F64:
      return Run<double>(p, buf);
    case DataType::S8:
      return Run<uint32_t>(p, buf);
    default:
      return Run<float>(p, buf);
  }
}

}  // namespace
}  // namespace jax_ops::gemm

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsGemmCpu, jax_ops::gemm::GemmCpu, JAX_OPS_GEMM_BINDING(xla::ffi::Ffi::Bind()));
