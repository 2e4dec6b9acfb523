// XLA FFI handlers for the Hopper MX GEMM (jax_mxfp8/kernels/sm90/mx_gemm.py).
//
//   jax_mxfp8_mx_gemm       (a, b, sa, sb) -> c
//   jax_mxfp8_mx_gemm_bias  (a, b, sa, sb, bias) -> c
//     attribute of both (and of the _into test hooks): kernel (string) = the registry variant name, e.g.
//     "mx_gemm_e4m3_e4m3_bf16", "mx_gemm_e4m3_e4m3_bf16_n128" (the 128x128 tiling), "mx_gemm_e5m2_e4m3_f32_bias",
//     "mx_gemm_e4m3_e4m3_bf16_t1". The variant fixes
//     the operand and output dtypes and whether it adds a bias; the handler checks the buffers against it.
//
//   jax_mxfp8_mx_gemm_mx[_bias][_pre]  (a, b, sa, sb[, bias]) -> (q, s[, pre])
//     the quantize epilogue (kernels/sm90/mx_gemm_epilogue.py, op "mx_gemm_mx"), attribute kernel e.g.
//     "mx_gemm_mx_e4m3_e4m3_bias_gelu_pre"; q (G, M, N) f8e4m3fn, s (G, M, N/32) u8, pre (G, M, N) bf16.
//   jax_mxfp8_mx_gemm_mx[_bias]_pre_col  (a, b, sa, sb[, bias]) -> (q, s, pre, qc, sc)
//     store_col variants: also the column orientation, qc (G, N, Mp) f8e4m3fn and sc (G, Mp/128, N) f32
//     (gemm_operands' "col" form of the quantized value, Mp = M rounded up to 128); M a multiple of 32.
//     Test hooks jax_mxfp8_mx_gemm_mx[_bias]_pre_col_into: the five results passed in as operands too.
//
// Operands (docs/interfaces.md: the aligned form, from the quantize kernels' gemm_operands):
//   a  (G, M, Kp) f8e4m3fn / f8e5m2     b  (G, N, Kp) f8e4m3fn / f8e5m2     (K-major)
//   sa (G, Kp/128, M) f32               sb (G, Kp/128, N) f32                bias (N,) f32
//   c  (G, M, N) bf16 / f32             c = sum_kt sa * sb * (a_kt . b_kt) (+ bias)
// Kp is a positive multiple of 128; M and N are multiples of 16 (not necessarily of the tile). Every
// failure is returned as an ffi::Error; the handler only enqueues work on XLA's stream (CUDA-graph
// compatible). G, M or N = 0: nothing to do.
#include <string>
#include <string_view>

#include "common.h"

namespace jmx {
namespace {

constexpr std::string_view kOp = "mx_gemm";
constexpr int64_t kKTile = 128;  // registry GEMM_K_TILE
constexpr int64_t kAlign = 16;   // registry GEMM_ALIGN
constexpr std::string_view kMxOp = "mx_gemm_mx";  // registry MXGemmEpilogueConfig.op
constexpr int64_t kBlock = 32;  // MX block size of the quantize epilogue

ffi::Error Dims(const ffi::AnyBuffer& b, const char* what, size_t rank, int64_t* out) {
  return jmx::Dims(b, kOp, what, rank, out);
}
ffi::Error Want(bool ok, const std::string& msg) { return jmx::Want(ok, kOp, msg); }

std::string Shape3(int64_t a, int64_t b, int64_t c) {
  return "(" + std::to_string(a) + ", " + std::to_string(b) + ", " + std::to_string(c) + ")";
}

// Checks a, b, sa, sb and bias against the variant and each other; fills t (a, b, sa, sb, [bias]),
// *n_tensors and the sizes gmn = (G, M, N).
ffi::Error CheckOperands(const KernelEntry* entry, bool bias_target, const char* target,
                         const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& sa,
                         const ffi::AnyBuffer& sb, const ffi::AnyBuffer* bias, TensorView* t, int* n_tensors,
                         int64_t* gmn) {
  const bool has_bias = Param(entry, "has_bias") == 1;
  JMX_RETURN_IF_ERROR(Want(has_bias == bias_target, "kernel '" + std::string(entry->name) +
                                                        (has_bias ? "' adds a bias (use " : "' adds no bias (use ") +
                                                        target + (has_bias ? "_bias)" : ")")));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "a_dtype", a.element_type(), "a"));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "b_dtype", b.element_type(), "b"));
  int64_t ad[3], bd[3], sad[3], sbd[3];
  JMX_RETURN_IF_ERROR(Dims(a, "a", 3, ad));
  JMX_RETURN_IF_ERROR(Dims(b, "b", 3, bd));
  JMX_RETURN_IF_ERROR(Dims(sa, "sa", 3, sad));
  JMX_RETURN_IF_ERROR(Dims(sb, "sb", 3, sbd));
  const int64_t g = ad[0], m = ad[1], kp = ad[2], n = bd[1], kt = kp / kKTile;
  JMX_RETURN_IF_ERROR(Want(kp > 0 && kp % kKTile == 0,
                           "a is " + Shape3(g, m, kp) + ": Kp must be a positive multiple of 128"));
  JMX_RETURN_IF_ERROR(Want(bd[0] == g && bd[2] == kp, "b is " + Shape3(bd[0], bd[1], bd[2]) + ", expected (" +
                                                          std::to_string(g) + ", N, " + std::to_string(kp) + ")"));
  JMX_RETURN_IF_ERROR(Want(m % kAlign == 0 && n % kAlign == 0, "M = " + std::to_string(m) + " and N = " +
                                                                   std::to_string(n) + " must be multiples of 16"));
  JMX_RETURN_IF_ERROR(Want(sad[0] == g && sad[1] == kt && sad[2] == m,
                           "sa is " + Shape3(sad[0], sad[1], sad[2]) + ", expected " + Shape3(g, kt, m)));
  JMX_RETURN_IF_ERROR(Want(sbd[0] == g && sbd[1] == kt && sbd[2] == n,
                           "sb is " + Shape3(sbd[0], sbd[1], sbd[2]) + ", expected " + Shape3(g, kt, n)));
  JMX_RETURN_IF_ERROR(Want(sa.element_type() == ffi::DataType::F32 && sb.element_type() == ffi::DataType::F32,
                           "sa and sb must be f32"));
  if (bias != nullptr) {
    int64_t biasd[1];
    JMX_RETURN_IF_ERROR(Dims(*bias, "bias", 1, biasd));
    JMX_RETURN_IF_ERROR(Want(bias->element_type() == ffi::DataType::F32 && biasd[0] == n,
                             "bias must be f32 (N,) with N = " + std::to_string(n)));
  }
  gmn[0] = g, gmn[1] = m, gmn[2] = n;
  if (g == 0 || m == 0 || n == 0) return ffi::Error::Success();
  int i = 0;
  JMX_RETURN_IF_ERROR(As2D(a, "a", &t[i++]));
  JMX_RETURN_IF_ERROR(As2D(b, "b", &t[i++]));
  JMX_RETURN_IF_ERROR(As2D(sa, "sa", &t[i++]));
  JMX_RETURN_IF_ERROR(As2D(sb, "sb", &t[i++]));
  if (bias != nullptr) {
    void* data = bias->untyped_data();
    JMX_RETURN_IF_ERROR(Want(reinterpret_cast<uintptr_t>(data) % 16 == 0, "bias must be 16-byte aligned"));
    t[i++] = TensorView{data, 1, static_cast<int32_t>(n)};
  }
  *n_tensors = i;
  return ffi::Error::Success();
}

// One result buffer of shape (G, M, cols) and dtype `want`, appended to t when the call is not empty.
ffi::Error CheckResult(ffi::Result<ffi::AnyBuffer>& r, const char* what, ffi::DataType want, const int64_t* gmn,
                       int64_t cols, TensorView* t, int* n_tensors) {
  int64_t d[3];
  JMX_RETURN_IF_ERROR(jmx::Dims(*r, kOp, what, 3, d));
  JMX_RETURN_IF_ERROR(Want(d[0] == gmn[0] && d[1] == gmn[1] && d[2] == cols,
                           std::string(what) + " is " + Shape3(d[0], d[1], d[2]) + ", expected " +
                               Shape3(gmn[0], gmn[1], cols)));
  JMX_RETURN_IF_ERROR(Want(r->element_type() == want, std::string(what) + " has dtype " +
                                                          DTypeName(r->element_type()) + ", expected " +
                                                          DTypeName(want)));
  if (gmn[0] == 0 || gmn[1] == 0 || gmn[2] == 0) return ffi::Error::Success();
  return As2D(r, what, &t[(*n_tensors)++]);
}

bool Empty(const int64_t* gmn) { return gmn[0] == 0 || gmn[1] == 0 || gmn[2] == 0; }

ffi::Error Run(cudaStream_t stream, int32_t device, std::string_view kernel, const ffi::AnyBuffer& a,
               const ffi::AnyBuffer& b, const ffi::AnyBuffer& sa, const ffi::AnyBuffer& sb,
               const ffi::AnyBuffer* bias, ffi::Result<ffi::AnyBuffer>& c) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOp, kernel, &entry));
  JMX_RETURN_IF_ERROR(ExpectDType(entry, "out_dtype", c->element_type(), "c"));
  TensorView t[6];
  int n = 0;
  int64_t gmn[3];
  JMX_RETURN_IF_ERROR(CheckOperands(entry, bias != nullptr, "jax_mxfp8_mx_gemm", a, b, sa, sb, bias, t, &n, gmn));
  JMX_RETURN_IF_ERROR(CheckResult(c, "c", c->element_type(), gmn, gmn[2], t, &n));
  if (Empty(gmn)) return ffi::Error::Success();
  return Launch(entry, device, t, n, stream);
}

// The quantize epilogue (kernels/sm90/mx_gemm_epilogue.py, op "mx_gemm_mx"): q (G, M, N) f8e4m3fn and
// s (G, M, N/32) u8 = quantize(acc (+ bias) (-> gelu)) along N; pre (G, M, N) bf16 = acc (+ bias) when the
// variant has store_pre. N must be a multiple of 32.
ffi::Error RunMx(cudaStream_t stream, int32_t device, std::string_view kernel, const ffi::AnyBuffer& a,
                 const ffi::AnyBuffer& b, const ffi::AnyBuffer& sa, const ffi::AnyBuffer& sb,
                 const ffi::AnyBuffer* bias, ffi::Result<ffi::AnyBuffer>& q, ffi::Result<ffi::AnyBuffer>& s,
                 ffi::Result<ffi::AnyBuffer>* pre, ffi::Result<ffi::AnyBuffer>* qc = nullptr,
                 ffi::Result<ffi::AnyBuffer>* sc = nullptr) {
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kMxOp, kernel, &entry));
  const bool store_pre = Param(entry, "store_pre") == 1;
  JMX_RETURN_IF_ERROR(Want(store_pre == (pre != nullptr),
                           "kernel '" + std::string(entry->name) +
                               (store_pre ? "' writes the pre-activation (use jax_mxfp8_mx_gemm_mx[_bias]_pre)"
                                          : "' writes no pre-activation (use jax_mxfp8_mx_gemm_mx[_bias])")));
  const bool store_col = Param(entry, "store_col") == 1;
  JMX_RETURN_IF_ERROR(Want(store_col == (qc != nullptr),
                           "kernel '" + std::string(entry->name) +
                               (store_col ? "' writes the column orientation (use jax_mxfp8_mx_gemm_mx[_bias]_pre_col)"
                                          : "' writes no column orientation (use a target without _col)")));
  TensorView t[10];
  int n = 0;
  int64_t gmn[3];
  JMX_RETURN_IF_ERROR(CheckOperands(entry, bias != nullptr, "jax_mxfp8_mx_gemm_mx", a, b, sa, sb, bias, t, &n, gmn));
  JMX_RETURN_IF_ERROR(Want(gmn[2] % kBlock == 0, "N = " + std::to_string(gmn[2]) +
                                                     " must be a multiple of 32 (MX blocks along N)"));
  JMX_RETURN_IF_ERROR(CheckResult(q, "q", ffi::DataType::F8E4M3FN, gmn, gmn[2], t, &n));
  JMX_RETURN_IF_ERROR(CheckResult(s, "s", ffi::DataType::U8, gmn, gmn[2] / kBlock, t, &n));
  if (pre != nullptr) JMX_RETURN_IF_ERROR(CheckResult(*pre, "pre", ffi::DataType::BF16, gmn, gmn[2], t, &n));
  if (qc != nullptr) {
    const int64_t mp = (gmn[1] + 127) / 128 * 128;
    JMX_RETURN_IF_ERROR(Want(gmn[1] % kBlock == 0, "M = " + std::to_string(gmn[1]) +
                                                       " must be a multiple of 32 (the column blocks along M)"));
    // qc (G, N, Mp) and sc (G, Mp/128, N): CheckResult's (G, rows, cols) with rows = N, Mp/128
    const int64_t qdims[3] = {gmn[0], gmn[2], mp}, sdims[3] = {gmn[0], mp / 128, gmn[2]};
    JMX_RETURN_IF_ERROR(CheckResult(*qc, "qc", ffi::DataType::F8E4M3FN, qdims, mp, t, &n));
    JMX_RETURN_IF_ERROR(CheckResult(*sc, "sc", ffi::DataType::F32, sdims, gmn[2], t, &n));
  }
  if (Empty(gmn)) return ffi::Error::Success();
  return Launch(entry, device, t, n, stream);
}

ffi::Error MxGemmMxPreColImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                              ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::Result<ffi::AnyBuffer> q,
                              ffi::Result<ffi::AnyBuffer> s, ffi::Result<ffi::AnyBuffer> pre,
                              ffi::Result<ffi::AnyBuffer> qc, ffi::Result<ffi::AnyBuffer> sc,
                              std::string_view kernel) {
  return RunMx(stream, device, kernel, a, b, sa, sb, nullptr, q, s, &pre, &qc, &sc);
}

ffi::Error MxGemmMxBiasPreColImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                                  ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::AnyBuffer bias,
                                  ffi::Result<ffi::AnyBuffer> q, ffi::Result<ffi::AnyBuffer> s,
                                  ffi::Result<ffi::AnyBuffer> pre, ffi::Result<ffi::AnyBuffer> qc,
                                  ffi::Result<ffi::AnyBuffer> sc, std::string_view kernel) {
  return RunMx(stream, device, kernel, a, b, sa, sb, &bias, q, s, &pre, &qc, &sc);
}

ffi::Error MxGemmMxImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer sa,
                        ffi::AnyBuffer sb, ffi::Result<ffi::AnyBuffer> q, ffi::Result<ffi::AnyBuffer> s,
                        std::string_view kernel) {
  return RunMx(stream, device, kernel, a, b, sa, sb, nullptr, q, s, nullptr);
}

ffi::Error MxGemmMxBiasImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                            ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> q,
                            ffi::Result<ffi::AnyBuffer> s, std::string_view kernel) {
  return RunMx(stream, device, kernel, a, b, sa, sb, &bias, q, s, nullptr);
}

ffi::Error MxGemmMxPreImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                           ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::Result<ffi::AnyBuffer> q,
                           ffi::Result<ffi::AnyBuffer> s, ffi::Result<ffi::AnyBuffer> pre, std::string_view kernel) {
  return RunMx(stream, device, kernel, a, b, sa, sb, nullptr, q, s, &pre);
}

ffi::Error MxGemmMxBiasPreImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                               ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::AnyBuffer bias,
                               ffi::Result<ffi::AnyBuffer> q, ffi::Result<ffi::AnyBuffer> s,
                               ffi::Result<ffi::AnyBuffer> pre, std::string_view kernel) {
  return RunMx(stream, device, kernel, a, b, sa, sb, &bias, q, s, &pre);
}

// Test hooks of the column variants: (q, s, pre, qc, sc) passed in as five more operands (aliased).
ffi::Error MxGemmMxPreColIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                                  ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::AnyBuffer, ffi::AnyBuffer,
                                  ffi::AnyBuffer, ffi::AnyBuffer, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer> q,
                                  ffi::Result<ffi::AnyBuffer> s, ffi::Result<ffi::AnyBuffer> pre,
                                  ffi::Result<ffi::AnyBuffer> qc, ffi::Result<ffi::AnyBuffer> sc,
                                  std::string_view kernel) {
  return RunMx(stream, device, kernel, a, b, sa, sb, nullptr, q, s, &pre, &qc, &sc);
}

ffi::Error MxGemmMxBiasPreColIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                                      ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::AnyBuffer bias, ffi::AnyBuffer,
                                      ffi::AnyBuffer, ffi::AnyBuffer, ffi::AnyBuffer, ffi::AnyBuffer,
                                      ffi::Result<ffi::AnyBuffer> q, ffi::Result<ffi::AnyBuffer> s,
                                      ffi::Result<ffi::AnyBuffer> pre, ffi::Result<ffi::AnyBuffer> qc,
                                      ffi::Result<ffi::AnyBuffer> sc, std::string_view kernel) {
  return RunMx(stream, device, kernel, a, b, sa, sb, &bias, q, s, &pre, &qc, &sc);
}

ffi::Error MxGemmImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b, ffi::AnyBuffer sa,
                      ffi::AnyBuffer sb, ffi::Result<ffi::AnyBuffer> c, std::string_view kernel) {
  return Run(stream, device, kernel, a, b, sa, sb, nullptr, c);
}

ffi::Error MxGemmBiasImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                          ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> c,
                          std::string_view kernel) {
  return Run(stream, device, kernel, a, b, sa, sb, &bias, c);
}

// Test hooks: c passed in as one more operand (XLA aliases it to the result), so that a test can fill it
// with NaN first and check that the kernel writes every element.
ffi::Error MxGemmIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                          ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer> c,
                          std::string_view kernel) {
  return Run(stream, device, kernel, a, b, sa, sb, nullptr, c);
}

ffi::Error MxGemmBiasIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer a, ffi::AnyBuffer b,
                              ffi::AnyBuffer sa, ffi::AnyBuffer sb, ffi::AnyBuffer bias, ffi::AnyBuffer,
                              ffi::Result<ffi::AnyBuffer> c, std::string_view kernel) {
  return Run(stream, device, kernel, a, b, sa, sb, &bias, c);
}

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm, jmx::MxGemmImpl,
                              (jmx::BindBuffers<4, 1>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_bias, jmx::MxGemmBiasImpl,
                              (jmx::BindBuffers<5, 1>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_bias);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_into, jmx::MxGemmIntoImpl,
                              (jmx::BindBuffers<5, 1>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_bias_into, jmx::MxGemmBiasIntoImpl,
                              (jmx::BindBuffers<6, 1>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_bias_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_mx, jmx::MxGemmMxImpl,
                              (jmx::BindBuffers<4, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_mx);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_mx_bias, jmx::MxGemmMxBiasImpl,
                              (jmx::BindBuffers<5, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_mx_bias);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_mx_pre, jmx::MxGemmMxPreImpl,
                              (jmx::BindBuffers<4, 3>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_mx_pre);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_mx_bias_pre, jmx::MxGemmMxBiasPreImpl,
                              (jmx::BindBuffers<5, 3>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_mx_bias_pre);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_mx_pre_col, jmx::MxGemmMxPreColImpl,
                              (jmx::BindBuffers<4, 5>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_mx_pre_col);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_mx_bias_pre_col, jmx::MxGemmMxBiasPreColImpl,
                              (jmx::BindBuffers<5, 5>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_mx_bias_pre_col);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_mx_pre_col_into, jmx::MxGemmMxPreColIntoImpl,
                              (jmx::BindBuffers<9, 5>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_mx_pre_col_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_mx_gemm_mx_bias_pre_col_into, jmx::MxGemmMxBiasPreColIntoImpl,
                              (jmx::BindBuffers<10, 5>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_mx_gemm_mx_bias_pre_col_into);

#pragma GCC visibility pop
