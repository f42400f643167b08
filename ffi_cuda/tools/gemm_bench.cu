// Standalone check + timing of the CUDA GEMM plans (no Python): the library's kernels (gemm_simt.cu, gemm_skinny.cu,
// gemm_sm90.cu) and the cublaslt plan (gemm_cublaslt.cu), linked from ffi_cuda/gemm/sources.cmake's list, driven
// through the handler's own body (gemm/dispatch.h RunGemm: MakeProblem, FoldBatch, ChoosePlan, launch) on XLA FFI
// buffer views of device memory, against an fp64 host reference.
// Built by ffi_cuda/tools/CMakeLists.txt (-DJAX_OPS_TOOLS=ON) into <build>/bin/gemm_bench.
// Usage: gemm_bench [small|time|skinny|sm90|cublaslt|all]
//   small: every plan on small odd shapes (M 1/17/64/129, N 17/256/1000, K 0/1/17/64/1000), gated and not,
//          transposes, batch broadcast, bias/c/residual/scales/preact, every dtype the plan takes; the skinny kernel
//          also with every cluster split (deterministic: two runs bit-equal), unaligned operands and batch folding.
//          Outputs are poisoned (NaN) first. Prints one line per group and every failure; exit status 1 on any
//          failure (this is what compute-sanitizer memcheck / racecheck run in .ci/gpu).
//   time:  CUDA-event timings: decode shapes (M 1/16/64 x K 4096 x N 4096/11008, plain and gated, weights rotated
//          through more than 4x the L2) in us and TB/s of weight reads next to the copy bandwidth, every skinny split;
//          the SIMT kernel on f32/f64/bf16 cubes; the sm90 and cublaslt plans on large plain and bias+GELU shapes
//          where they run.
//          Every timed configuration is also checked on sampled elements against fp64.
//   skinny / sm90 [i] / cublaslt [i]: that plan's part of time alone (only its i-th shape when given).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/dtype_traits.h"
#include "gemm/dispatch.h"
#include "gemm/epilogue.h"
#include "gemm/heuristics.h"
#include "gemm/kernels.h"
#include "gemm/skinny.h"
#include "tools/bench_check.h"

using namespace jax_ops::gemm;
using DT = xla::ffi::DataType;

namespace {

int g_sms = 0, g_cc_major = 0;
// The cublaslt plan's workspace (what ffi.py allocates: tuning.CUBLASLT_WORKSPACE_BYTES), shared by every call.
void* g_workspace = nullptr;
constexpr uint64_t kWorkspaceBytes = (uint64_t{32} << 20) + (uint64_t{128} << 10);
size_t g_l2_bytes = 0;

// ---------------------------------------------------------------------------------------- host element codec
int ElemBytes(DT dt) {
  switch (dt) {
    case DT::F16:
    case DT::BF16:
      return 2;
    case DT::F32:
      return 4;
    case DT::F64:
      return 8;
    default:
      return 1;  // fp8, int8
  }
}

const char* Name(DT dt) { return DTypeName(dt); }

// Stores v rounded to dt at dst; returns the stored value exactly.
double Encode(DT dt, double v, uint8_t* dst) {
  switch (dt) {
    case DT::F16: {
      const uint16_t h = jax_ops::FloatToHalf(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      return jax_ops::HalfToFloat(h);
    }
    case DT::BF16: {
      const uint16_t h = jax_ops::FloatToBf16(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      return jax_ops::Bf16ToFloat(h);
    }
    case DT::F32: {
      const float f = static_cast<float>(v);
      std::memcpy(dst, &f, 4);
      return f;
    }
    case DT::F64:
      std::memcpy(dst, &v, 8);
      return v;
    case DT::F8E4M3FN: {
      const __nv_fp8_e4m3 x(static_cast<float>(v));
      std::memcpy(dst, &x.__x, 1);
      return static_cast<float>(x);
    }
    case DT::F8E5M2: {
      const __nv_fp8_e5m2 x(static_cast<float>(v));
      std::memcpy(dst, &x.__x, 1);
      return static_cast<float>(x);
    }
    default: {  // S8
      const int8_t i = static_cast<int8_t>(std::lrint(std::clamp(v, -127.0, 127.0)));
      std::memcpy(dst, &i, 1);
      return i;
    }
  }
}

double Decode(DT dt, const uint8_t* src) {
  switch (dt) {
    case DT::F16: {
      uint16_t h;
      std::memcpy(&h, src, 2);
      return jax_ops::HalfToFloat(h);
    }
    case DT::BF16: {
      uint16_t h;
      std::memcpy(&h, src, 2);
      return jax_ops::Bf16ToFloat(h);
    }
    case DT::F32: {
      float f;
      std::memcpy(&f, src, 4);
      return f;
    }
    case DT::F64: {
      double d;
      std::memcpy(&d, src, 8);
      return d;
    }
    case DT::F8E4M3FN: {
      __nv_fp8_e4m3 x;
      std::memcpy(&x.__x, src, 1);
      return static_cast<float>(x);
    }
    case DT::F8E5M2: {
      __nv_fp8_e5m2 x;
      std::memcpy(&x.__x, src, 1);
      return static_cast<float>(x);
    }
    default: {
      int8_t i;
      std::memcpy(&i, src, 1);
      return i;
    }
  }
}

// A host tensor (stored bytes and their exact values) with its device copy; `misalign` elements of offset make the
// device pointer unaligned on purpose.
struct Tensor {
  DT dt = DT::F32;
  int64_t n = 0;
  std::vector<uint8_t> bytes;
  std::vector<double> vals;
  uint8_t* dev_alloc = nullptr;
  void* dev = nullptr;

  Tensor() = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor() {
    if (dev_alloc) cudaFree(dev_alloc);
  }
  // Random values in [lo, hi) (int8: integers in [-100, 100]) rounded to dt, copied to the device.
  void Random(DT type, int64_t count, std::mt19937& rng, double lo, double hi, int misalign = 0) {
    dt = type;
    n = count;
    bytes.assign(static_cast<size_t>(n) * ElemBytes(dt), 0);
    vals.resize(n);
    std::uniform_real_distribution<double> u(lo, hi);
    for (int64_t i = 0; i < n; ++i) {
      const double v = dt == DT::S8 ? std::round(u(rng) * 100.0) : u(rng);
      vals[i] = Encode(dt, v, &bytes[static_cast<size_t>(i) * ElemBytes(dt)]);
    }
    Upload(misalign);
  }
  void Upload(int misalign = 0) {
    const size_t off = static_cast<size_t>(misalign) * ElemBytes(dt);
    CHECK(cudaMalloc(&dev_alloc, bytes.size() + off + 16));
    dev = dev_alloc + off;
    if (!bytes.empty()) CHECK(cudaMemcpy(dev, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
  }
  // An output: poisoned with all-ones bytes (NaN in every float dtype).
  void Poisoned(DT type, int64_t count) {
    dt = type;
    n = count;
    bytes.assign(static_cast<size_t>(n) * ElemBytes(dt), 0xff);
    vals.assign(n, NAN);
    Upload();
  }
  void Download() {
    if (!bytes.empty()) CHECK(cudaMemcpy(bytes.data(), dev, bytes.size(), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i) vals[i] = Decode(dt, &bytes[static_cast<size_t>(i) * ElemBytes(dt)]);
  }
};

// ---------------------------------------------------------------------------------------- cases
struct Case {
  Plan plan = Plan::kSimt;
  DT a = DT::F32, b = DT::F32, out = DT::F32;
  int64_t batch = 1, batch_b = 1, m = 1, n = 1, k = 1;
  bool ta = false, tb = false;
  Gated gated = Gated::kNone;
  Activation act = Activation::kIdentity;
  bool bias = false, c = false, residual = false, preact = false;
  int a_scale = 0, b_scale = 0;  // 0 none, 1 per tensor, 2 per row (a) / per column (b)
  double alpha = 1.0, beta = 0.0;
  int misalign_a = 0, misalign_b = 0;  // elements of deliberate pointer offset
  int split = 0;                       // skinny cluster split (0: the rule's)
  bool expect_refusal = false;         // ChoosePlan must refuse the forced plan
  bool twice = false;                  // run twice, outputs must be bit-equal (determinism)
};

const char* PlanName(Plan p) { return kPlanNames[static_cast<int>(p)]; }

std::string Describe(const Case& c) {
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "%s %s x %s -> %s B=%lld Bb=%lld M=%lld N=%lld K=%lld ta=%d tb=%d gated=%d act=%s bias=%d c=%d res=%d "
                "pre=%d as=%d bs=%d alpha=%g beta=%g mis=%d/%d split=%d",
                PlanName(c.plan), Name(c.a), Name(c.b), Name(c.out), (long long)c.batch, (long long)c.batch_b,
                (long long)c.m, (long long)c.n, (long long)c.k, c.ta, c.tb, static_cast<int>(c.gated),
                kActivationNames[static_cast<int>(c.act)], c.bias, c.c, c.residual, c.preact, c.a_scale, c.b_scale,
                c.alpha, c.beta, c.misalign_a, c.misalign_b, c.split);
  return buf;
}

// Tolerance on |got - ref| / (|ref| + rms(ref)): one rounding of the output after fp32 / fp64 sums; fp8 tensor-core
// sums keep fewer mantissa bits on Hopper (about 14), so an fp8 product into f32 gets 2e-3.
double Tolerance(DT in, DT out) {
  if (IsFp8(in) && out == DT::F32) return 2e-3;
  switch (out) {
    case DT::F64:
      return 1e-10;
    case DT::F32:
      return 1e-4;
    case DT::F16:
      return 2e-3;
    default:
      return 1e-2;  // bf16
  }
}

struct Operands {
  Tensor a, b, b_up, bias, c, residual, a_scale, b_scale, out, preact;
};

// An XLA FFI buffer view of device memory (what XLA hands the handler); an absent operand has shape [0].
struct FfiView {
  std::vector<int64_t> dims;
  XLA_FFI_Buffer buf{};
  FfiView(DT dt, void* data, std::vector<int64_t> shape) : dims(std::move(shape)) {
    buf.struct_size = XLA_FFI_Buffer_STRUCT_SIZE;
    buf.dtype = static_cast<XLA_FFI_DataType>(dt);
    buf.data = data;
    buf.rank = static_cast<int64_t>(dims.size());
    buf.dims = dims.data();
  }
  FfiView(const FfiView&) = delete;
  FfiView& operator=(const FfiView&) = delete;
  xla::ffi::AnyBuffer any() const { return xla::ffi::AnyBuffer(&buf); }
};

// A device operand: dtype and pointer (nullptr: absent).
struct Dev {
  DT dt = DT::F32;
  void* p = nullptr;
};
Dev DevOf(const Tensor& t) { return {t.dt, t.n ? t.dev : nullptr}; }

// The case's operands as the handler's arguments, in params.h's shapes (the optional ones as the case asks).
struct FfiCall {
  FfiView a, b, b_up, bias, c, residual, a_scale, b_scale, out, preact;
  FfiView workspace{DT::U8, g_workspace, {static_cast<int64_t>(kWorkspaceBytes)}};
  static std::vector<int64_t> If(bool present, std::vector<int64_t> shape) {
    return present ? shape : std::vector<int64_t>{0};
  }
  FfiCall(const Case& cs, Dev a_, Dev b_, Dev up_, Dev bias_, Dev c_, Dev res_, Dev as_, Dev bs_, Dev out_, Dev pre_)
      : a(a_.dt, a_.p, cs.ta ? std::vector<int64_t>{cs.batch, cs.k, cs.m} : std::vector<int64_t>{cs.batch, cs.m, cs.k}),
        b(b_.dt, b_.p,
          cs.tb ? std::vector<int64_t>{cs.batch_b, cs.n, cs.k}
                : std::vector<int64_t>{cs.batch_b, cs.k, cs.gated == Gated::kPacked ? 2 * cs.n : cs.n}),
        b_up(up_.dt, up_.p, If(cs.gated == Gated::kSeparate, b.dims)),
        bias(bias_.dt, bias_.p, If(cs.bias, {cs.gated == Gated::kNone ? cs.n : 2 * cs.n})),
        c(c_.dt, c_.p, If(cs.c, {cs.batch, cs.m, cs.n})),
        residual(res_.dt, res_.p, If(cs.residual, {cs.batch, cs.m, cs.n})),
        a_scale(as_.dt, as_.p,
                {cs.a_scale == 0   ? 0
                 : cs.a_scale == 1 ? 1
                                   : cs.m}),
        b_scale(bs_.dt, bs_.p,
                {cs.b_scale == 0            ? 0
                 : cs.b_scale == 1          ? 1
                 : cs.gated == Gated::kNone ? cs.n
                                            : 2 * cs.n}),
        out(out_.dt, out_.p, {cs.batch, cs.m, cs.n}),
        preact(pre_.dt, pre_.p, If(cs.preact, {cs.batch, cs.m, cs.gated == Gated::kNone ? cs.n : 2 * cs.n})) {}
  FfiCall(const Case& cs, const Operands& o)
      : FfiCall(cs, DevOf(o.a), DevOf(o.b), DevOf(o.b_up), DevOf(o.bias), DevOf(o.c), DevOf(o.residual),
                DevOf(o.a_scale), DevOf(o.b_scale), DevOf(o.out), DevOf(o.preact)) {}

  template <typename Fn>
  auto Call(const Case& cs, Fn&& fn) const {  // fn(the handler's arguments after the stream)
    return fn(a.any(), b.any(), b_up.any(), bias.any(), c.any(), residual.any(), a_scale.any(), b_scale.any(), cs.alpha,
              cs.beta, static_cast<int64_t>(cs.act), static_cast<int64_t>(cs.gated), cs.ta, cs.tb, cs.preact, false,
              static_cast<int64_t>(cs.plan), out.any(), preact.any());
  }
  // The checked problem's KernelArgs (exits on a contract violation: a harness bug).
  KernelArgs Args(const Case& cs) const {
    Problem p;
    const xla::ffi::Error e = Call(cs, [&](auto&&... x) { return MakeProblem(x..., &p); });
    if (!e.success()) jax_ops::tools::CheckFailed("contract", e.message(), __FILE__, __LINE__);
    KernelArgs args = MakeKernelArgs(p, a.any(), b.any(), b_up.any(), bias.any(), c.any(), residual.any(),
                                     a_scale.any(), b_scale.any(), out.any(), preact.any());
    args.workspace = g_workspace;
    args.workspace_bytes = kWorkspaceBytes;
    return args;
  }
};

void MakeOperands(const Case& c, Operands* o, std::mt19937& rng) {
  const int64_t cols = c.gated == Gated::kPacked ? 2 * c.n : c.n;
  const int64_t gate_cols = c.gated == Gated::kNone ? c.n : 2 * c.n;
  const int64_t mn = c.batch * c.m * c.n;
  o->a.Random(c.a, c.batch * c.m * c.k, rng, -1, 1, c.misalign_a);
  o->b.Random(c.b, c.batch_b * c.k * cols, rng, -1, 1, c.misalign_b);
  if (c.gated == Gated::kSeparate) o->b_up.Random(c.b, c.batch_b * c.k * cols, rng, -1, 1, c.misalign_b);
  const DT bias_dt = c.a == DT::F64 ? DT::F64 : DT::F32;  // params.h: f64 bias for an f64 GEMM
  if (c.bias) o->bias.Random(bias_dt, gate_cols, rng, -1, 1);
  if (c.c) o->c.Random(c.out, mn, rng, -1, 1);
  if (c.residual) o->residual.Random(c.out, mn, rng, -1, 1);
  // int8 operands are integers up to 100: scales near 1/100 keep a gated product inside float16's range.
  const double scale_unit = c.a == DT::S8 ? 0.01 : 1.0;
  if (c.a_scale) o->a_scale.Random(DT::F32, c.a_scale == 1 ? 1 : c.m, rng, 0.5 * scale_unit, 1.5 * scale_unit);
  if (c.b_scale) o->b_scale.Random(DT::F32, c.b_scale == 1 ? 1 : gate_cols, rng, 0.5 * scale_unit, 1.5 * scale_unit);
  o->out.Poisoned(c.out, mn);
  if (c.preact) o->preact.Poisoned(c.out, c.batch * c.m * (c.gated == Gated::kNone ? c.n : 2 * c.n));
}

// fp64 reference of params.h's formula for out and preact.
void Reference(const Case& c, const Operands& o, std::vector<double>* out, std::vector<double>* pre) {
  const int64_t B = c.batch, M = c.m, N = c.n, K = c.k;
  const int64_t cols = c.gated == Gated::kPacked ? 2 * N : N;
  // op(a) as [B][M][K] and op(b) (and b_up) as [Bb][cols][K], so the dot products run over contiguous K.
  std::vector<double> A(B * M * K), Bt(c.batch_b * cols * K), Ut;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) A[(b * M + m) * K + k] = o.a.vals[b * M * K + (c.ta ? k * M + m : m * K + k)];
  auto transpose_b = [&](const Tensor& t, std::vector<double>* dst) {
    dst->resize(c.batch_b * cols * K);
    for (int64_t b = 0; b < c.batch_b; ++b)
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t k = 0; k < K; ++k)
          (*dst)[(b * cols + j) * K + k] = t.vals[b * cols * K + (c.tb ? j * K + k : k * cols + j)];
  };
  transpose_b(o.b, &Bt);
  if (c.gated == Gated::kSeparate) transpose_b(o.b_up, &Ut);
  auto dot = [&](const std::vector<double>& w, int64_t b, int64_t m, int64_t j) {
    const double* x = &A[(b * M + m) * K];
    const double* y = &w[((c.batch_b == 1 ? 0 : b) * cols + j) * K];
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += x[k] * y[k];
    return s;
  };
  auto scale = [&](int64_t m, int64_t j) {
    double s = 1;
    if (c.a_scale) s *= o.a_scale.vals[c.a_scale == 1 ? 0 : m];
    if (c.b_scale) s *= o.b_scale.vals[c.b_scale == 1 ? 0 : j];
    return s;
  };
  out->assign(B * M * N, 0);
  pre->assign(c.preact ? B * M * (c.gated == Gated::kNone ? N : 2 * N) : 0, 0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t i = (b * M + m) * N + n;
        const double res = c.residual ? o.residual.vals[i] : 0.0;
        double zg = c.alpha * dot(Bt, b, m, n) * scale(m, n) + (c.bias ? o.bias.vals[n] : 0.0);
        if (c.gated == Gated::kNone) {
          if (c.c && c.beta != 0.0) zg += c.beta * o.c.vals[i];
          (*out)[i] = Activate<double>(c.act, zg) + res;
          if (c.preact) (*pre)[i] = zg;
          continue;
        }
        const double up = c.gated == Gated::kSeparate ? dot(Ut, b, m, n) : dot(Bt, b, m, N + n);
        const double zu = c.alpha * up * scale(m, N + n) + (c.bias ? o.bias.vals[N + n] : 0.0);
        (*out)[i] = Activate<double>(c.act, zg) * zu + res;
        if (c.preact) {
          (*pre)[(b * M + m) * 2 * N + n] = zg;
          (*pre)[(b * M + m) * 2 * N + N + n] = zu;
        }
      }
}

// max over elements of |got - ref| / (|ref| + rms(ref)); a non-finite output where the reference is finite is +inf.
double MaxError(const std::vector<double>& got, const std::vector<double>& ref) {
  double ss = 0;
  for (double r : ref) ss += r * r;
  const double rms = ref.empty() ? 0 : std::sqrt(ss / ref.size());
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    worst = std::max(worst, std::abs(got[i] - ref[i]) / (std::abs(ref[i]) + rms + 1e-300));
  }
  return worst;
}

// One kernel launched directly (timing): the skinny kernel with cluster split `split` (0: the rule's).
cudaError_t LaunchDirect(Plan plan, const KernelArgs& p, int split) {
  if (plan == Plan::kSkinny) return LaunchSkinnyWithSplit(p, g_sms, split, nullptr, nullptr);
  if (plan == Plan::kCublasLt) return RunCublasLt(p, nullptr).success() ? cudaSuccess : cudaErrorUnknown;
  return LaunchPlan(plan, p, g_sms, nullptr);
}

// The handler's body (dispatch.h RunGemm); with a forced skinny split, the same steps ending in LaunchSkinnyWithSplit.
xla::ffi::Error RunLikeHandler(const Case& c, const FfiCall& f) {
  if (c.split == 0)
    return f.Call(c, [&](auto&&... x) { return RunGemm(x..., f.workspace.any(), g_cc_major, g_sms, nullptr); });
  KernelArgs ka = f.Args(c);
  FoldBatch(&ka);
  Plan chosen = Plan::kSimt;
  JAX_OPS_RETURN_IF_ERROR(ChoosePlan(ka, c.plan, g_cc_major, &chosen));
  JAX_OPS_RETURN_IF_CUDA_ERROR(LaunchSkinnyWithSplit(ka, g_sms, c.split, nullptr, nullptr));
  return xla::ffi::Error::Success();
}

// The case itself must satisfy the contract (a harness bug otherwise, never counted as a plan's refusal).
xla::ffi::Error CheckContract(const Case& c, const FfiCall& f) {
  Problem p;
  return f.Call(c, [&](auto&&... x) { return MakeProblem(x..., &p); });
}

bool IsRefusal(const xla::ffi::Error& e) { return e.errc() == xla::ffi::ErrorCode::kInvalidArgument; }

struct Group {
  int cases = 0, refused = 0, skipped = 0, fails = 0;
  double max_err = 0, tol = 0;
};
std::map<std::string, Group> g_groups;
int g_fail_lines = 0;

void Fail(const Case& c, const std::string& why) {
  if (g_fail_lines++ < 60) std::printf("FAIL %s: %s\n", Describe(c).c_str(), why.c_str());
}

// Runs one case as the handler would; false on a failure.
bool RunCase(const Case& c, const std::string& group, std::mt19937& rng) {
  Group& g = g_groups[group];
  ++g.cases;
  g.tol = Tolerance(c.a, c.out);
  Operands o;
  MakeOperands(c, &o, rng);
  const FfiCall call(c, o);
  const xla::ffi::Error contract = CheckContract(c, call);
  if (!contract.success()) {
    ++g.fails;
    Fail(c, "harness case breaks the contract: " + contract.message());
    return false;
  }
  const xla::ffi::Error run = RunLikeHandler(c, call);
  if (c.expect_refusal) {
    if (!IsRefusal(run)) {
      ++g.fails;
      Fail(c, "the forced plan did not refuse a problem it cannot run: " + (run.success() ? "ran" : run.message()));
      return false;
    }
    if (g.refused++ == 0) std::printf("      refused as expected: %s\n", run.message().c_str());
    return true;
  }
  if (IsRefusal(run) && (c.plan == Plan::kSm90 || c.plan == Plan::kCublasLt)) {  // their own support sets: counted
    ++g.skipped;
    return true;
  }
  const cudaError_t sync = run.success() ? cudaDeviceSynchronize() : cudaSuccess;
  if (!run.success() || sync != cudaSuccess) {
    ++g.fails;
    Fail(c, run.success() ? std::string("kernel: ") + cudaGetErrorString(sync) : run.message());
    if (sync != cudaSuccess || !IsRefusal(run)) std::exit(1);  // a CUDA error may be sticky: end the run here
    return false;
  }
  o.out.Download();
  if (c.preact) o.preact.Download();
  std::vector<double> ref_out, ref_pre;
  Reference(c, o, &ref_out, &ref_pre);
  double e = MaxError(o.out.vals, ref_out);
  if (c.preact) e = std::max(e, MaxError(o.preact.vals, ref_pre));
  bool ok = e <= g.tol;
  if (c.twice) {  // deterministic: a second run writes the same bits
    const std::vector<uint8_t> first = o.out.bytes, first_pre = o.preact.bytes;
    CHECK(cudaMemset(o.out.dev, 0xff, o.out.bytes.size()));
    if (c.preact) CHECK(cudaMemset(o.preact.dev, 0xff, o.preact.bytes.size()));
    const xla::ffi::Error again = RunLikeHandler(c, call);
    if (!again.success()) Fail(c, "second run: " + again.message());
    CHECK(cudaDeviceSynchronize());
    o.out.Download();
    if (c.preact) o.preact.Download();
    if (o.out.bytes != first || (c.preact && o.preact.bytes != first_pre)) {
      ok = false;
      Fail(c, "second run differs bitwise");
    }
  }
  g.max_err = std::max(g.max_err, e);
  if (!ok) {
    ++g.fails;
    if (e > g.tol) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "error %.3e > tol %.1e", e, g.tol);
      Fail(c, buf);
    }
  }
  return ok;
}

// ---------------------------------------------------------------------------------------- the small suite
struct Types {
  DT a, b, out;
};

// The (a, b, out) dtypes each plan takes (params.h): the first is the plan's main type, swept over every shape.
std::vector<Types> PlanTypes(Plan plan) {
  const DT e4 = DT::F8E4M3FN, e5 = DT::F8E5M2, f16 = DT::F16, bf16 = DT::BF16, f32 = DT::F32;
  if (plan == Plan::kSkinny)
    return {{bf16, bf16, bf16}, {f16, f16, f16}, {bf16, bf16, f32}, {f16, f16, f32},
            {e4, e4, bf16},     {e4, e5, f16},   {e5, e4, f32},     {e5, e5, bf16}};
  std::vector<Types> t = {
      {plan == Plan::kSimt ? f32 : bf16, plan == Plan::kSimt ? f32 : bf16, plan == Plan::kSimt ? f32 : bf16},
      {f16, f16, f16},
      {f16, f16, f32},
      {bf16, bf16, f32}};
  if (plan == Plan::kSimt) t.push_back({bf16, bf16, bf16});
  if (plan == Plan::kSimt || plan == Plan::kCublasLt) t.push_back({DT::F64, DT::F64, DT::F64});
  if (plan == Plan::kCublasLt) t.push_back({f32, f32, f32});
  for (DT x : {e4, e5})
    for (DT y : {e4, e5})
      for (DT o : {f16, bf16, f32}) t.push_back({x, y, o});
  for (DT o : {f16, bf16, f32}) t.push_back({DT::S8, DT::S8, o});
  return t;
}

// Whether ChoosePlan must accept the forced plan (the skinny kernel's support set restated from heuristics.h's
// documentation, so the harness checks the rule rather than repeating it). sm90: not known here (skips counted).
bool SkinnyTakes(const Case& c) {
  const bool half = c.a == DT::F16 || c.a == DT::BF16;
  const bool fp8 = IsFp8(c.a) && IsFp8(c.b);
  const bool folds = c.batch_b == 1 && !c.ta && c.a_scale != 2;
  const int64_t rows = folds ? c.batch * c.m : c.m;
  const bool types = fp8 || (half && c.b == c.a && (c.out == c.a || c.out == DT::F32));
  return types && !c.tb && rows <= (fp8 ? 16 : 64);
}

// Epilogue / layout options from a running variant number, spread so that every option meets every plan.
void Vary(Case* c, int v, bool allow_tb) {
  c->ta = v % 2;
  c->tb = allow_tb && (v / 2) % 2;
  const int gated = v % 3;
  c->gated = gated == 0 ? Gated::kNone : gated == 1 ? Gated::kSeparate : Gated::kPacked;
  if (c->gated == Gated::kPacked && c->tb) c->gated = Gated::kSeparate;  // a packed weight is never transposed
  c->act = static_cast<Activation>(v % kNumActivations);
  c->bias = v % 4 != 3;
  c->residual = v % 2 == 0;
  c->preact = v % 3 != 2;
  c->a_scale = (v / 3) % 3;
  c->b_scale = (v / 5) % 3;
  if (c->a == DT::S8) c->a_scale = std::max(c->a_scale, 1), c->b_scale = std::max(c->b_scale, 1);  // int8 needs both
  c->c = c->gated == Gated::kNone && v % 4 == 1;
  c->beta = c->c ? 0.5 : 0.0;
  c->alpha = v % 7 == 3 ? 0.75 : 1.0;
  const int batch = v % 5;  // 0-2: one batch; 3: B = 2 sharing b; 4: B = 2 with its own b
  c->batch = batch >= 3 ? 2 : 1;
  c->batch_b = batch == 4 ? 2 : 1;
}

bool RunSmall() {
  std::mt19937 rng(2024);
  bool ok = true;
  int v = 0;
  const int64_t Ms[] = {1, 17, 64, 129}, Ns[] = {17, 256, 1000}, Ks[] = {1, 17, 64, 1000};
  std::vector<Plan> plans = {Plan::kSimt, Plan::kSkinny, Plan::kSm90, Plan::kCublasLt};
  for (Plan plan : plans) {
    const bool skinny = plan == Plan::kSkinny;
    const std::vector<Types> types = PlanTypes(plan);
    auto run = [&](Case c, const char* phase) {
      c.plan = plan;
      if (skinny && !SkinnyTakes(c)) c.expect_refusal = true;
      std::string group =
          std::string(PlanName(plan)) + " " + phase + " " + Name(c.a) + "x" + Name(c.b) + "->" + Name(c.out);
      ok &= RunCase(c, group, rng);
    };
    // Every shape of the grid with the plan's main dtype; K = 1000 with N = 1000 and M = 129 once (the largest).
    for (int64_t m : Ms)
      for (int64_t n : Ns)
        for (int64_t k : Ks) {
          Case c;
          c.a = types[0].a, c.b = types[0].b, c.out = types[0].out;
          c.m = m, c.n = n, c.k = k;
          Vary(&c, v++, !skinny);
          if (m * n * k > 20000000) c.batch = c.batch_b = 1;
          run(c, "shapes");
        }
    // Every layout x gated x activation combination at a ragged mid shape.
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < (skinny ? 1 : 2); ++tb)
        for (int gated = 0; gated < 3; ++gated)
          for (int act = 0; act < kNumActivations; ++act) {
            if (gated == 2 && tb) continue;
            Case c;
            c.a = types[0].a, c.b = types[0].b, c.out = types[0].out;
            c.m = 17, c.n = 100, c.k = 72;
            Vary(&c, v++, !skinny);
            c.ta = ta, c.tb = tb, c.act = static_cast<Activation>(act);
            c.gated = static_cast<Gated>(gated);
            c.c = c.gated == Gated::kNone && act % 2 == 0;
            c.beta = c.c ? -0.5 : 0.0;
            run(c, "features");
          }
    // Every other dtype on a few shapes (K = 0: the epilogue of zeros).
    // (K = 1000 with every shape is the main dtype's sweep; these stay small for the sanitizer's sake.)
    const int64_t shapes[][3] = {{1, 17, 17},    {17, 256, 64}, {64, 1000, 17}, {129, 17, 333},
                                 {1, 1000, 300}, {33, 256, 1},  {5, 40, 0}};
    for (size_t ti = 1; ti < types.size(); ++ti)
      for (const auto& s : shapes) {
        Case c;
        c.a = types[ti].a, c.b = types[ti].b, c.out = types[ti].out;
        c.m = s[0], c.n = s[1], c.k = s[2];
        Vary(&c, v++, !skinny);
        run(c, "dtypes");
      }
    if (!skinny) continue;
    // Skinny: every cluster split (bit-equal reruns), plain and gated, M in each token-tile instantiation.
    for (int split : {1, 2, 4, 8})
      for (int64_t m : {1, 16, 32, 64, -1, -16})  // negative: fp8 (e4m3 weights, e5m2 tokens) with |m| rows
        for (int gated = 0; gated < 3; ++gated) {
          Case c;
          c.a = c.b = c.out = DT::BF16;
          if (m < 0) c.a = DT::F8E5M2, c.b = DT::F8E4M3FN, m = -m;
          c.m = m, c.n = 200, c.k = 2050;
          Vary(&c, v++, false);
          c.batch = c.batch_b = 1;
          c.ta = false;
          c.gated = static_cast<Gated>(gated);
          c.c = false, c.beta = 0;
          c.split = split;
          c.twice = true;
          run(c, "splits");
        }
    // Unaligned operands (scalar load paths): pointers off by one element, odd N / K.
    for (int mis = 0; mis < 8; ++mis) {
      Case c;
      c.a = c.b = c.out = DT::F16;
      if (mis >= 4) c.a = c.b = DT::F8E4M3FN;  // fp8: 16-byte rows need N % 16 == 0, 8-byte tokens K % 8 == 0
      c.m = 9, c.n = mis % 4 < 2 ? 256 : 203, c.k = mis % 2 ? 333 : 256;
      Vary(&c, v++, false);
      c.ta = false, c.batch = c.batch_b = 1;
      c.misalign_a = mis & 1, c.misalign_b = mis % 4 != 0;
      run(c, "unaligned");
    }
    // Batch folding: B = 3 sharing b folds into M = 3 * 20 (skinny); per-row a_scale or B = 3 with its own b do not.
    for (int variant = 0; variant < 3; ++variant) {
      Case c;
      c.a = c.b = c.out = DT::BF16;
      c.m = 20, c.n = 300, c.k = 130;
      Vary(&c, v++, false);
      c.ta = false;
      c.batch = 3;
      c.batch_b = variant == 2 ? 3 : 1;
      c.a_scale = variant == 1 ? 2 : 0;
      run(c, "batches");
    }
  }
  // The auto rule on a few shapes of every kind.
  for (int64_t m : {1, 64, 65, 300}) {
    for (DT dt : {DT::BF16, DT::F32, DT::F8E4M3FN}) {
      Case c;
      c.a = c.b = dt;
      c.out = dt == DT::F8E4M3FN ? DT::BF16 : dt;
      c.m = m, c.n = 384, c.k = 256;
      Vary(&c, v++, true);
      c.plan = Plan::kAuto;
      ok &= RunCase(c, std::string("auto ") + Name(dt), rng);
    }
  }
  for (const auto& [name, g] : g_groups)
    std::printf(
        "small %-40s %4d cases (%d refused as expected, %d not taken by the plan): max err %.2e (tol %.0e) %s\n",
        name.c_str(), g.cases, g.refused, g.skipped, g.max_err, g.tol, g.fails ? "FAIL" : "OK");
  return ok;
}

// ---------------------------------------------------------------------------------------- timing
template <typename T>
__global__ void FillKernel(T* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed * 2246822519u ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (h & 0xffffff) * (2.f / 16777216.f) - 1.f;  // [-1, 1)
    if constexpr (std::is_same_v<T, int8_t>)
      x[i] = static_cast<int8_t>(u * 100.f);
    else
      x[i] = static_cast<T>(u);
  }
}

void Fill(DT dt, void* x, int64_t n, uint32_t seed) {
  const int blocks = 1024, threads = 256;
  switch (dt) {
    case DT::F16:
      FillKernel<<<blocks, threads>>>(static_cast<__half*>(x), n, seed);
      break;
    case DT::BF16:
      FillKernel<<<blocks, threads>>>(static_cast<__nv_bfloat16*>(x), n, seed);
      break;
    case DT::F32:
      FillKernel<<<blocks, threads>>>(static_cast<float*>(x), n, seed);
      break;
    case DT::F64:
      FillKernel<<<blocks, threads>>>(static_cast<double*>(x), n, seed);
      break;
    case DT::F8E4M3FN:
      FillKernel<<<blocks, threads>>>(static_cast<__nv_fp8_e4m3*>(x), n, seed);
      break;
    case DT::F8E5M2:
      FillKernel<<<blocks, threads>>>(static_cast<__nv_fp8_e5m2*>(x), n, seed);
      break;
    default:
      FillKernel<<<blocks, threads>>>(static_cast<int8_t*>(x), n, seed);
  }
  CHECK(cudaGetLastError());
}

std::vector<double> DownloadValues(DT dt, const void* x, int64_t n) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * ElemBytes(dt));
  CHECK(cudaMemcpy(bytes.data(), x, bytes.size(), cudaMemcpyDeviceToHost));
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = Decode(dt, &bytes[static_cast<size_t>(i) * ElemBytes(dt)]);
  return v;
}

template <typename F>
double MedianUs(F&& launch, int inner) {
  return 1e3 * jax_ops::tools::Median(jax_ops::tools::RoundTimesMs(launch, 3, 7, inner));
}

// Copy bandwidth (read + write bytes per second of a device-to-device copy of `bytes`), in TB/s.
double CopyTbps(size_t bytes) {
  void *x, *y;
  CHECK(cudaMalloc(&x, bytes));
  CHECK(cudaMalloc(&y, bytes));
  const double us = MedianUs([&](int) { CHECK(cudaMemcpyAsync(y, x, bytes, cudaMemcpyDeviceToDevice)); }, 10);
  CHECK(cudaFree(x));
  CHECK(cudaFree(y));
  return 2.0 * bytes / us / 1e6;
}

// A timed problem: inputs filled on the device; the weights (and up weights) in `copies` rotating buffers so that
// repeated launches read them from DRAM, not L2.
struct Timed {
  Case c;
  int copies = 1;
  std::vector<void*> b, b_up;
  void *a = nullptr, *bias = nullptr, *residual = nullptr, *out = nullptr;
  int64_t b_elems = 0;
  KernelArgs args;

  explicit Timed(const Case& cs, size_t rotate_bytes) : c(cs) {
    const int64_t cols = c.gated == Gated::kPacked ? 2 * c.n : c.n;
    b_elems = c.batch_b * c.k * cols;
    const size_t wbytes = static_cast<size_t>(b_elems) * ElemBytes(c.b) * (c.gated == Gated::kSeparate ? 2 : 1);
    copies = static_cast<int>(std::max<size_t>(1, (rotate_bytes + wbytes - 1) / wbytes));
    CHECK(cudaMalloc(&a, static_cast<size_t>(c.batch * c.m * c.k) * ElemBytes(c.a)));
    Fill(c.a, a, c.batch * c.m * c.k, 1);
    for (int i = 0; i < copies; ++i) {
      b.push_back(nullptr);
      CHECK(cudaMalloc(&b.back(), static_cast<size_t>(b_elems) * ElemBytes(c.b)));
      Fill(c.b, b.back(), b_elems, 2 + i);
      if (c.gated == Gated::kSeparate) {
        b_up.push_back(nullptr);
        CHECK(cudaMalloc(&b_up.back(), static_cast<size_t>(b_elems) * ElemBytes(c.b)));
        Fill(c.b, b_up.back(), b_elems, 1000 + i);
      }
    }
    const int64_t gate_cols = c.gated == Gated::kNone ? c.n : 2 * c.n;
    if (c.bias) {
      CHECK(cudaMalloc(&bias, gate_cols * 4));
      Fill(DT::F32, bias, gate_cols, 3);
    }
    if (c.residual) {
      CHECK(cudaMalloc(&residual, static_cast<size_t>(c.batch * c.m * c.n) * ElemBytes(c.out)));
      Fill(c.out, residual, c.batch * c.m * c.n, 4);
    }
    CHECK(cudaMalloc(&out, static_cast<size_t>(c.batch * c.m * c.n) * ElemBytes(c.out)));
    const FfiCall call(c, {c.a, a}, {c.b, b[0]}, {c.b, c.gated == Gated::kSeparate ? b_up[0] : nullptr},
                       {DT::F32, bias}, {}, {c.out, residual}, {}, {}, {c.out, out}, {});
    args = call.Args(c);
    Select(0);
  }
  ~Timed() {
    for (void* x : b) cudaFree(x);
    for (void* x : b_up) cudaFree(x);
    for (void* x : {a, bias, residual, out})
      if (x) cudaFree(x);
  }
  void Select(int i) {
    args.b = b[i % copies];
    args.b_up = c.gated == Gated::kSeparate ? b_up[i % copies] : nullptr;
  }
  double WeightBytes() const {
    return static_cast<double>(b_elems) * ElemBytes(c.b) * (c.gated == Gated::kSeparate ? 2 : 1);
  }

  // Max normalised error of `samples` output elements (weights copy 0) against fp64, after one launch.
  double SampledError(Plan plan, int split, int samples = 48) {
    Select(0);
    CHECK(cudaMemset(out, 0xff, static_cast<size_t>(c.batch * c.m * c.n) * ElemBytes(c.out)));
    CHECK(LaunchDirect(plan, args, split));
    CHECK(cudaDeviceSynchronize());
    const std::vector<double> A = DownloadValues(c.a, a, c.batch * c.m * c.k);
    const std::vector<double> W = DownloadValues(c.b, b[0], b_elems);
    const std::vector<double> U = c.gated == Gated::kSeparate ? DownloadValues(c.b, b_up[0], b_elems) : W;
    const int64_t gate_cols = c.gated == Gated::kNone ? c.n : 2 * c.n;
    const std::vector<double> bias_v = c.bias ? DownloadValues(DT::F32, bias, gate_cols) : std::vector<double>();
    const std::vector<double> res =
        c.residual ? DownloadValues(c.out, residual, c.batch * c.m * c.n) : std::vector<double>();
    const std::vector<double> got = DownloadValues(c.out, out, c.batch * c.m * c.n);
    const int64_t cols = c.gated == Gated::kPacked ? 2 * c.n : c.n;
    std::mt19937 rng(5);
    std::vector<double> ref, val;
    for (int s = 0; s < samples; ++s) {
      const int64_t bb = rng() % c.batch, m = s < 4 ? (s % 2 ? c.m - 1 : 0) : rng() % c.m;
      const int64_t n = s < 4 ? (s / 2 ? c.n - 1 : 0) : rng() % c.n;
      auto dot = [&](const std::vector<double>& w, int64_t j) {
        double acc = 0;
        const int64_t wb = c.batch_b == 1 ? 0 : bb;
        for (int64_t k = 0; k < c.k; ++k) {
          const double x = A[bb * c.m * c.k + (c.ta ? k * c.m + m : m * c.k + k)];
          acc += x * w[wb * c.k * cols + (c.tb ? j * c.k + k : k * cols + j)];
        }
        return acc;
      };
      const int64_t i = (bb * c.m + m) * c.n + n;
      const double r = c.residual ? res[i] : 0.0;
      const double zg = dot(W, n) + (c.bias ? bias_v[n] : 0.0);
      double y = Activate<double>(c.act, zg) + r;
      if (c.gated != Gated::kNone) {
        const double zu =
            (c.gated == Gated::kSeparate ? dot(U, n) : dot(W, c.n + n)) + (c.bias ? bias_v[c.n + n] : 0.0);
        y = Activate<double>(c.act, zg) * zu + r;
      }
      ref.push_back(y);
      val.push_back(got[i]);
    }
    return MaxError(val, ref);
  }
};

bool g_time_ok = true;

void CheckSampled(const char* what, double err, const Case& c) {
  if (err > Tolerance(c.a, c.out)) {
    std::printf("FAIL %s: sampled error %.3e > %.0e\n", what, err, Tolerance(c.a, c.out));
    g_time_ok = false;
  }
}

void TimeSkinny(double copy_tbps) {
  const size_t rotate = 4 * std::max<size_t>(g_l2_bytes, 50u << 20);
  std::printf("skinny (weights rotated over %zu MB; copy bandwidth %.2f TB/s):\n", rotate >> 20, copy_tbps);
  struct Shape {
    int64_t m, n, k;
    Gated gated;
    DT dt = DT::BF16;
  };
  const Shape shapes[] = {{1, 4096, 4096, Gated::kNone},
                          {16, 4096, 4096, Gated::kNone},
                          {64, 4096, 4096, Gated::kNone},
                          {1, 11008, 4096, Gated::kNone},
                          {16, 11008, 4096, Gated::kNone},
                          {64, 11008, 4096, Gated::kNone},
                          {4, 14336, 8192, Gated::kNone},
                          {1, 4096, 4096, Gated::kSeparate},
                          {16, 4096, 4096, Gated::kSeparate},
                          {1, 11008, 4096, Gated::kSeparate},
                          {16, 11008, 4096, Gated::kSeparate},
                          {16, 11008, 4096, Gated::kPacked},
                          {64, 11008, 4096, Gated::kSeparate},
                          {16, 14336, 4096, Gated::kSeparate},
                          {1, 11008, 4096, Gated::kNone, DT::F8E4M3FN},
                          {16, 11008, 4096, Gated::kNone, DT::F8E4M3FN},
                          {16, 11008, 4096, Gated::kSeparate, DT::F8E4M3FN}};
  for (const Shape& s : shapes) {
    Case c;
    c.plan = Plan::kSkinny;
    c.a = c.b = s.dt;
    c.out = DT::BF16;
    c.m = s.m, c.n = s.n, c.k = s.k, c.gated = s.gated;
    c.act = s.gated == Gated::kNone ? Activation::kIdentity : Activation::kSilu;
    Timed t(c, rotate);
    int rule_split = 0;
    CHECK(LaunchSkinnyWithSplit(t.args, g_sms, 0, nullptr, &rule_split));
    std::printf("  %-13s M=%-3lld N=%-5lld K=%-5lld %-8s weights %6.1f MB:", Name(s.dt), (long long)s.m, (long long)s.n,
                (long long)s.k,
                s.gated == Gated::kNone       ? "plain"
                : s.gated == Gated::kSeparate ? "swiglu"
                                              : "packed",
                t.WeightBytes() / 1e6);
    // The rule's split, then every split this device runs, on `timed`'s weights.
    auto sweep = [&](Timed& timed, bool report_bandwidth) {
      for (int split : {0, 1, 2, 4, 8}) {
        if (split && LaunchSkinnyWithSplit(timed.args, g_sms, split, nullptr, nullptr) != cudaSuccess) {
          cudaGetLastError();
          continue;
        }
        const double us = MedianUs(
            [&](int i) {
              timed.Select(i);
              CHECK(LaunchSkinnyWithSplit(timed.args, g_sms, split, nullptr, nullptr));
            },
            20);
        const double tbps = timed.WeightBytes() / us / 1e6;
        if (split == 0 && report_bandwidth)
          std::printf(" rule S=%d %7.1f us %5.2f TB/s (%3.0f%% of copy) |", rule_split, us, tbps,
                      100 * tbps / copy_tbps);
        else if (split == 0)
          std::printf(" rule %.1f us", us);
        else
          std::printf(" S=%d %.1f", split, us);
      }
    };
    sweep(t, true);
    // One weight copy, read again every launch: L2-resident where it fits (what a jit loop over one layer sees).
    Timed hot(c, 0);
    std::printf(" | one copy:");
    sweep(hot, false);
    const double err = t.SampledError(Plan::kSkinny, 0);
    std::printf(" | err %.1e\n", err);
    CheckSampled("skinny timing case", err, c);
  }
}

void TimeTiled(Plan plan, int only = -1) {  // only: run just the shape of this index
  struct Shape {
    DT dt;
    int64_t m, n, k;
    bool bias_gelu;
  };
  const std::vector<Shape> simt = {{DT::F32, 4096, 4096, 4096, false},
                                   {DT::F32, 4096, 4096, 4096, true},
                                   {DT::F64, 2048, 2048, 2048, false},
                                   {DT::BF16, 4096, 4096, 4096, false},
                                   {DT::F32, 129, 1000, 4096, false}};
  const std::vector<Shape> sm90 = {{DT::BF16, 8192, 8192, 64, false},  // one K block per tile: the per-tile cost
                                   {DT::BF16, 8192, 8192, 8192, false},    {DT::BF16, 4096, 11008, 4096, false},
                                   {DT::BF16, 4096, 11008, 4096, true},    {DT::BF16, 16384, 4096, 4096, false},
                                   {DT::F8E4M3FN, 8192, 8192, 8192, false}};
  const std::vector<Shape>& shapes = plan == Plan::kSimt ? simt : sm90;  // cublaslt: the sm90 shapes, side by side
  std::printf("%s:\n", PlanName(plan));
  for (size_t index = 0; index < shapes.size(); ++index) {
    if (only >= 0 && static_cast<size_t>(only) != index) continue;
    const Shape& s = shapes[index];
    Case c;
    c.plan = plan;
    c.a = c.b = s.dt;
    c.out = s.dt == DT::F8E4M3FN ? DT::BF16 : s.dt;
    c.m = s.m, c.n = s.n, c.k = s.k;
    c.tb = IsFp8(s.dt);  // 8-bit operands are read K-major by both tiled plans: the weight stored [N, K]
    c.bias = s.bias_gelu;
    c.act = s.bias_gelu ? Activation::kGelu : Activation::kIdentity;
    Timed t(c, 0);
    Plan chosen;
    if (!ChoosePlan(t.args, plan, g_cc_major, &chosen).success()) {
      std::printf("  %s M=%lld N=%lld K=%lld: not supported by this plan/build\n", Name(s.dt), (long long)s.m,
                  (long long)s.n, (long long)s.k);
      continue;
    }
    const double us = MedianUs([&](int) { CHECK(LaunchDirect(plan, t.args, 0)); }, 5);
    const double err = t.SampledError(plan, 0);
    std::printf("  %-13s M=%-5lld N=%-5lld K=%-5lld %-9s %9.1f us %7.1f TFLOP/s | err %.1e\n", Name(s.dt),
                (long long)s.m, (long long)s.n, (long long)s.k, s.bias_gelu ? "bias+gelu" : "plain", us,
                2.0 * s.m * s.n * s.k / us / 1e6, err);
    CheckSampled("tiled timing case", err, c);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout kill
  const char* mode = argc > 1 ? argv[1] : "all";
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  g_sms = prop.multiProcessorCount;
  g_cc_major = prop.major;
  g_l2_bytes = prop.l2CacheSize;
  CHECK(cudaMalloc(&g_workspace, kWorkspaceBytes));
  std::printf("device %s: %d SMs, sm_%d%d, L2 %zu MB\n", prop.name, g_sms, prop.major, prop.minor, g_l2_bytes >> 20);
  bool ok = true;
  const bool all = !std::strcmp(mode, "all");
  if (all || !std::strcmp(mode, "small")) ok &= RunSmall();
  if (all || !std::strcmp(mode, "time")) {
    const double copy = CopyTbps(size_t{1} << 30);
    TimeSkinny(copy);
    TimeTiled(Plan::kSimt);
    TimeTiled(Plan::kSm90);
    TimeTiled(Plan::kCublasLt);
    ok &= g_time_ok;
  }
  if (!std::strcmp(mode, "skinny")) {
    TimeSkinny(CopyTbps(size_t{1} << 30));
    ok &= g_time_ok;
  }
  const int only = argc > 2 ? std::atoi(argv[2]) : -1;
  if (!std::strcmp(mode, "sm90")) TimeTiled(Plan::kSm90, only);
  if (!std::strcmp(mode, "cublaslt")) TimeTiled(Plan::kCublasLt, only);
  if (!all && std::strcmp(mode, "small") && std::strcmp(mode, "time") && std::strcmp(mode, "skinny") &&
      std::strcmp(mode, "sm90") && std::strcmp(mode, "cublaslt")) {
    std::printf("usage: gemm_bench [small|time|skinny|sm90|cublaslt|all]\n");
    return 2;
  }
  std::printf("%s\n", ok ? "ALL OK" : "FAILURES");
  return ok ? 0 : 1;
}
