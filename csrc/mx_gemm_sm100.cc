// XLA FFI handlers for the Blackwell MX GEMM (jax_mxfp8/kernels/sm100/mx_gemm.py, registry op "mx_gemm_sm100",
// cubins for sm_100f: compute capability 10.0 and 10.3). NOT RUN ON HARDWARE by this project.
//
//   jax_mxfp8_mx_gemm_sm100[_bias]         (a, b, sa, sb[, bias]) -> c                     epilogue "plain"
//   jax_mxfp8_mx_gemm_sm100_row[_bias]     (a, b, sa, sb[, bias]) -> (c, q, s)             "row", store_pre
//   jax_mxfp8_mx_gemm_sm100_rowcol[_bias]  (a, b, sa, sb[, bias]) -> (c, q, s, qc, sc)     "rowcol", store_pre
//   <target>_into: the results passed in as operands too (aliased): the NaN-poisoning test hooks.
//   attribute of every target: kernel (string) = the registry variant name, e.g.
//   "mx_gemm_sm100_2cta_e4m3_e4m3_bf16_bias", "mx_gemm_sm100_2cta_e4m3_e4m3_mxrowcol_bias_gelu_prebf16". The
//   variant fixes the dtypes, the epilogue, the bias and the activation; the handler checks the buffers
//   against it.
//
// Buffers (docs/interfaces.md "Blackwell MX GEMM"; Mt, Nt, Kt = ceil(M, N, K / 128)):
//   a  (G, M, K) f8e4m3fn, K-major            b  (G, N, K) f8e4m3fn, K-major        K a positive multiple of 32
//   sa (G, Mt, Kt, 512) u8                    sb (G, Nt, Kt, 512) u8                E8M0, 128x4 blocked layout
//   bias (N,) f32
//   c  (G, M, N) the variant's out_dtype      y = acc (+ bias) rounded once (the pre-activation of row/rowcol)
//   q  (G, M, N) f8e4m3fn, s (G, Mt, Nt, 512) u8     quantize(act(y)) in blocks of 32 along N, scales blocked
//   qc (G, N, M) f8e4m3fn, sc (G, Nt, Mt, 512) u8    quantize(act(y)) in blocks of 32 along M, transposed
// N is a multiple of 32; M too for rowcol. The persistent grid is one CTA per SM of the device (its SM count
// is passed at launch). Every failure is returned as an ffi::Error; the handler only enqueues the kernel on
// XLA's stream (CUDA-graph compatible). G, M or N = 0: nothing to do.
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "common.h"

namespace jmx {
namespace {

constexpr std::string_view kOp = "mx_gemm_sm100";  // registry MXGemmSm100Config.op
constexpr int64_t kBlock = 32;
constexpr int64_t kTile = 128;       // rows (and K / N elements) per 128x4 scale tile
constexpr int64_t kTileBytes = 512;  // bytes per 128x4 scale tile
constexpr int64_t kInt32Max = 2147483647;

// The epilogue codes of registry EPILOGUE_CODE.
enum Epilogue : int { kPlain = 0, kRow = 1, kCol = 2, kRowCol = 3 };

ffi::Error Want(bool ok, const std::string& msg) { return jmx::Want(ok, kOp, msg); }

int64_t Tiles(int64_t x) { return (x + kTile - 1) / kTile; }

std::string Shape(const int64_t* d, int n) {
  std::string out = "(";
  for (int i = 0; i < n; ++i) out += (i ? ", " : "") + std::to_string(d[i]);
  return out + ")";
}

ffi::AnyBuffer::Dimensions DimsOf(const ffi::AnyBuffer& b) { return b.dimensions(); }
ffi::AnyBuffer::Dimensions DimsOf(ffi::Result<ffi::AnyBuffer>& b) { return b->dimensions(); }
ffi::DataType TypeOf(const ffi::AnyBuffer& b) { return b.element_type(); }
ffi::DataType TypeOf(ffi::Result<ffi::AnyBuffer>& b) { return b->element_type(); }

// Checks a buffer's dtype and exact shape; appends its 3-D view to t when the call is not empty.
template <typename Buffer>
ffi::Error Check(Buffer& buffer, ffi::DataType want, const char* what, std::initializer_list<int64_t> shape,
                 bool empty, TensorView* t, int* n) {
  const auto dims = DimsOf(buffer);
  int64_t want_dims[4] = {};
  int rank = 0;
  for (int64_t d : shape) want_dims[rank++] = d;
  bool same = static_cast<int>(dims.size()) == rank;
  for (int i = 0; same && i < rank; ++i) same = dims[i] == want_dims[i];
  if (!same) {
    int64_t got[8] = {};
    const int got_rank = static_cast<int>(dims.size() < 8 ? dims.size() : 8);
    for (int i = 0; i < got_rank; ++i) got[i] = dims[i];
    return Want(false, std::string(what) + " is " + Shape(got, got_rank) + ", expected " + Shape(want_dims, rank));
  }
  JMX_RETURN_IF_ERROR(Want(TypeOf(buffer) == want, std::string(what) + " has dtype " + DTypeName(TypeOf(buffer)) +
                                                       ", expected " + DTypeName(want)));
  if (empty) return ffi::Error::Success();
  return As3D(buffer, what, &t[(*n)++]);
}

ffi::DataType DTypeOfCode(int64_t code) {
  switch (code) {
    case kBF16:
      return ffi::DataType::BF16;
    case kF32:
      return ffi::DataType::F32;
    case kE4M3:
      return ffi::DataType::F8E4M3FN;
    case kE5M2:
      return ffi::DataType::F8E5M2;
    default:
      return ffi::DataType::INVALID;
  }
}

// One call of any target: `epilogue` and `bias` are what the target binds; results in the kernel's order
// (c, q, s, qc, sc), those of the target's epilogue only.
ffi::Error Run(cudaStream_t stream, int32_t device, std::string_view kernel, Epilogue epilogue,
               const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& sa, const ffi::AnyBuffer& sb,
               const ffi::AnyBuffer* bias, ffi::Result<ffi::AnyBuffer>* results, int n_results) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOp, kernel, &entry));
  const std::string name = entry->name;
  const bool has_bias = Param(entry, "has_bias") == 1;
  JMX_RETURN_IF_ERROR(Want(has_bias == (bias != nullptr),
                           "kernel '" + name + (has_bias ? "' adds a bias (use a _bias target)"
                                                         : "' adds no bias (use a target without _bias)")));
  const int64_t variant_epilogue = Param(entry, "epilogue");
  JMX_RETURN_IF_ERROR(Want(variant_epilogue == epilogue,
                           "kernel '" + name + "' has epilogue code " + std::to_string(variant_epilogue) +
                               ", this target runs code " + std::to_string(epilogue) +
                               " (0 plain: jax_mxfp8_mx_gemm_sm100, 1 row: _row, 3 rowcol: _rowcol)"));
  JMX_RETURN_IF_ERROR(Want(epilogue == kPlain || Param(entry, "store_pre") == 1,
                           "kernel '" + name + "' writes no pre-activation; the _row / _rowcol targets take c"));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "a_dtype", a.element_type(), "a"));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "b_dtype", b.element_type(), "b"));
  int64_t ad[3], bd[3];
  JMX_RETURN_IF_ERROR(Dims(a, kOp, "a", 3, ad));
  JMX_RETURN_IF_ERROR(Dims(b, kOp, "b", 3, bd));
  const int64_t g = ad[0], m = ad[1], k = ad[2], n = bd[1];
  JMX_RETURN_IF_ERROR(Want(bd[0] == g && bd[2] == k, "b is " + Shape(bd, 3) + ", expected (" + std::to_string(g) +
                                                         ", N, " + std::to_string(k) + ") (a is " + Shape(ad, 3) + ")"));
  JMX_RETURN_IF_ERROR(Want(k > 0 && k % kBlock == 0, "K = " + std::to_string(k) + " must be a positive multiple of 32"));
  JMX_RETURN_IF_ERROR(Want(n % kBlock == 0, "N = " + std::to_string(n) + " must be a multiple of 32"));
  JMX_RETURN_IF_ERROR(Want(epilogue != kRowCol || m % kBlock == 0,
                           "M = " + std::to_string(m) + " must be a multiple of 32 (the column blocks along M)"));
  JMX_RETURN_IF_ERROR(Want(g * m * k <= kInt32Max && g * n * k <= kInt32Max && g * m * n <= kInt32Max,
                           "operands or outputs of 2^31 elements or more (the kernel's 32-bit offsets)"));
  const bool empty = g == 0 || m == 0 || n == 0;
  TensorView t[10];
  int nt = 0;
  if (!empty) {
    JMX_RETURN_IF_ERROR(As3D(a, "a", &t[nt++]));
    JMX_RETURN_IF_ERROR(As3D(b, "b", &t[nt++]));
  }
  const ffi::DataType u8 = ffi::DataType::U8, e4m3 = ffi::DataType::F8E4M3FN;
  JMX_RETURN_IF_ERROR(Check(sa, u8, "sa", {g, Tiles(m), Tiles(k), kTileBytes}, empty, t, &nt));
  JMX_RETURN_IF_ERROR(Check(sb, u8, "sb", {g, Tiles(n), Tiles(k), kTileBytes}, empty, t, &nt));
  if (bias != nullptr) {
    int64_t biasd[1];
    JMX_RETURN_IF_ERROR(Dims(*bias, kOp, "bias", 1, biasd));
    JMX_RETURN_IF_ERROR(Want(bias->element_type() == ffi::DataType::F32 && biasd[0] == n,
                             "bias must be f32 (N,) with N = " + std::to_string(n)));
    void* data = bias->untyped_data();
    JMX_RETURN_IF_ERROR(Want(reinterpret_cast<uintptr_t>(data) % 16 == 0, "bias must be 16-byte aligned"));
    if (!empty) t[nt++] = TensorView{data, 1, static_cast<int32_t>(n), 1};
  }
  const ffi::DataType out = DTypeOfCode(Param(entry, "out_dtype"));
  JMX_RETURN_IF_ERROR(Want(n_results == (epilogue == kPlain ? 1 : epilogue == kRow ? 3 : 5),
                           "internal: the target's result count does not match its epilogue"));
  auto& c = results[0];
  JMX_RETURN_IF_ERROR(Check(c, out, "c", {g, m, n}, empty, t, &nt));
  if (epilogue == kRow || epilogue == kRowCol) {
    JMX_RETURN_IF_ERROR(Check(results[1], e4m3, "q", {g, m, n}, empty, t, &nt));
    JMX_RETURN_IF_ERROR(
        Check(results[2], u8, "s", {g, Tiles(m), Tiles(n), kTileBytes}, empty, t, &nt));
  }
  if (epilogue == kRowCol) {
    JMX_RETURN_IF_ERROR(Check(results[3], e4m3, "qc", {g, n, m}, empty, t, &nt));
    JMX_RETURN_IF_ERROR(
        Check(results[4], u8, "sc", {g, Tiles(n), Tiles(m), kTileBytes}, empty, t, &nt));
  }
  if (empty) return ffi::Error::Success();
  int32_t sms = 0;
  JMX_RETURN_IF_ERROR(DeviceSMs(device, &sms));
  return Launch(entry, device, t, nt, stream, nullptr, 0, &sms, 1);
}

// One target: kEpi's results, a bias operand or not, the results passed in again (kInto, the test hooks: XLA
// aliases them to the results, so only the first 4 or 5 operands are read).
template <Epilogue kEpi, bool kBias, bool kInto>
ffi::Error Handle(cudaStream_t stream, int32_t device, ffi::RemainingArgs args, ffi::RemainingRets rets,
                  std::string_view kernel) {
  constexpr size_t kRets = kEpi == kPlain ? 1 : kEpi == kRow ? 3 : 5;
  constexpr size_t kIn = kBias ? 5 : 4;
  if (args.size() != kIn + (kInto ? kRets : 0) || rets.size() != kRets) {
    return Want(false, "the target takes " + std::to_string(kIn + (kInto ? kRets : 0)) + " operands and " +
                           std::to_string(kRets) + " results, got " + std::to_string(args.size()) + " and " +
                           std::to_string(rets.size()));
  }
  std::vector<ffi::AnyBuffer> in;
  for (size_t i = 0; i < kIn; ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    in.push_back(*buffer);
  }
  std::vector<ffi::Result<ffi::AnyBuffer>> out;
  for (size_t i = 0; i < kRets; ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return buffer.error();
    out.push_back(*buffer);
  }
  return Run(stream, device, kernel, kEpi, in[0], in[1], in[2], in[3], kBias ? &in[4] : nullptr, out.data(),
             static_cast<int>(kRets));
}

auto Binding() {
  return ffi::Ffi::Bind()
      .Ctx<ffi::PlatformStream<cudaStream_t>>()
      .Ctx<ffi::DeviceOrdinal>()
      .RemainingArgs()
      .RemainingRets()
      .Attr<std::string_view>("kernel");
}

constexpr auto kPlainTarget = &Handle<kPlain, false, false>;
constexpr auto kPlainBiasTarget = &Handle<kPlain, true, false>;
constexpr auto kRowTarget = &Handle<kRow, false, false>;
constexpr auto kRowBiasTarget = &Handle<kRow, true, false>;
constexpr auto kRowColTarget = &Handle<kRowCol, false, false>;
constexpr auto kRowColBiasTarget = &Handle<kRowCol, true, false>;
constexpr auto kPlainInto = &Handle<kPlain, false, true>;
constexpr auto kPlainBiasInto = &Handle<kPlain, true, true>;
constexpr auto kRowInto = &Handle<kRow, false, true>;
constexpr auto kRowBiasInto = &Handle<kRow, true, true>;
constexpr auto kRowColInto = &Handle<kRowCol, false, true>;
constexpr auto kRowColBiasInto = &Handle<kRowCol, true, true>;

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100, jmx::kPlainTarget, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_bias, jmx::kPlainBiasTarget, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_bias);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_row, jmx::kRowTarget, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_row);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_row_bias, jmx::kRowBiasTarget, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_row_bias);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_rowcol, jmx::kRowColTarget, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_rowcol);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_rowcol_bias, jmx::kRowColBiasTarget, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_rowcol_bias);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_into, jmx::kPlainInto, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_bias_into, jmx::kPlainBiasInto, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_bias_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_row_into, jmx::kRowInto, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_row_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_row_bias_into, jmx::kRowBiasInto, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_row_bias_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_rowcol_into, jmx::kRowColInto, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_rowcol_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_sm100_rowcol_bias_into, jmx::kRowColBiasInto, jmx::Binding(), {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_sm100_rowcol_bias_into);

#pragma GCC visibility pop
