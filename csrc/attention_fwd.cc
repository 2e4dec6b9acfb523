// XLA FFI handler for the Hopper MXFP8 attention forward (jax_mxfp8/kernels/sm90/attention_fwd.py).
//
//   jax_mxfp8_attention_fwd         (q, k, vt, qs, ks, vs, vi, lens) -> (o, lse)
//   jax_mxfp8_attention_fwd_packed  (q, k, vt, qs, ks, vs, vi, seqs, work) -> (o, lse)   packed sequences, B = 1
//     attribute of both (and of the _into test hooks): kernel (string) = the registry variant name, e.g.
//     "attention_fwd_h128_causal", "attention_fwd_h64_pblock_packed", "attention_fwd_h128_t2". The variant
//     fixes causal masking, the P scale and its rounding, and the tuning; the handler checks its head_dim
//     against the buffers' H and its packed flag against the target.
//
// Operands come from the producer pass (jax_mxfp8/primitives/attention_fwd.py, `prepare`):
//   q  (B, N, Tp, H) f8e4m3fn     k (B, K, Sp, H) f8e4m3fn     vt (B, K, H, Sp) f8e4m3fn
//   qs (B, N, Tp/32) f32          ks (B, K, Sp/32) f32         vs, vi (B, K, Sp/128 * H/32) f32
//   lens (2, B) s32 (query lengths, KV lengths)
//   o  (B, Tp, N, H) bf16         lse (B, N, Tp) f32   (o in the caller's sequence-major layout)
// Tp and Sp are multiples of 128, H is 64 or 128 and N a multiple of K. A broadcast_q variant
// (broadcast_query_attention) takes q (1, N, Tp, H) and qs (1, N, Tp/32): one query sequence for all B rows.
// Every failure is returned as an ffi::Error; the handler only enqueues work on XLA's stream (CUDA-graph compatible).
#include <string>
#include <string_view>
#include <utility>

#include "common.h"

namespace jmx {
namespace {

constexpr std::string_view kOp = "attention_fwd";

// common.h's checks, bound to this op's name for the error messages
ffi::Error Dims(const ffi::AnyBuffer& b, const char* what, size_t rank, int64_t* out) {
  return jmx::Dims(b, kOp, what, rank, out);
}
ffi::Error Want(bool ok, const std::string& msg) { return jmx::Want(ok, kOp, msg); }

// Shapes shared by the dense and packed calls (the packed call has B = 1).
struct FwdShape {
  int64_t b, n, tp, h, nk, sp;
};

// Checks q, k, vt, the scale factors and the outputs, and views them as 2-D tensors in `t` (order q, k, vt,
// qs, ks, vs, vi, o, lse). The kernel derives B, N, K, Tp and Sp from these views: all are checked.
ffi::Error CheckOperands(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& vt,
                         const ffi::AnyBuffer& qs, const ffi::AnyBuffer& ks, const ffi::AnyBuffer& vs,
                         const ffi::AnyBuffer& vi, ffi::Result<ffi::AnyBuffer>& o,
                         ffi::Result<ffi::AnyBuffer>& lse, FwdShape* shape, TensorView* t, bool broadcast_q = false) {
  int64_t qd[4], kd[4], vd[4];
  JMX_RETURN_IF_ERROR(Dims(q, "q", 4, qd));
  JMX_RETURN_IF_ERROR(Dims(k, "k", 4, kd));
  JMX_RETURN_IF_ERROR(Dims(vt, "vt", 4, vd));
  // broadcast_q: q holds one batch row that every one of k's B rows attends with
  JMX_RETURN_IF_ERROR(Want(!broadcast_q || qd[0] == 1, "a broadcast_q variant takes q of batch 1"));
  const int64_t b = broadcast_q ? kd[0] : qd[0], n = qd[1], tp = qd[2], h = qd[3], nk = kd[1], sp = kd[2];
  const int64_t q_rows = broadcast_q ? 1 : b;
  *shape = FwdShape{b, n, tp, h, nk, sp};
  JMX_RETURN_IF_ERROR(Want(q.element_type() == ffi::DataType::F8E4M3FN && k.element_type() == ffi::DataType::F8E4M3FN &&
                               vt.element_type() == ffi::DataType::F8E4M3FN,
                           "q, k and vt must be f8e4m3fn"));
  JMX_RETURN_IF_ERROR(Want(h == 64 || h == 128, "head_dim must be 64 or 128, got " + std::to_string(h)));
  JMX_RETURN_IF_ERROR(Want(tp % 128 == 0 && sp % 128 == 0, "padded lengths must be multiples of 128"));
  JMX_RETURN_IF_ERROR(Want(kd[0] == b && kd[3] == h && nk > 0 && n % nk == 0, "k must be (B, K, Sp, H) with K | N"));
  JMX_RETURN_IF_ERROR(Want(vd[0] == b && vd[1] == nk && vd[2] == h && vd[3] == sp, "vt must be (B, K, H, Sp)"));
  JMX_RETURN_IF_ERROR(Want(o->element_type() == ffi::DataType::BF16 && lse->element_type() == ffi::DataType::F32,
                           "o must be bf16 and lse f32"));
  for (auto* s : {&qs, &ks, &vs, &vi}) {
    JMX_RETURN_IF_ERROR(Want(s->element_type() == ffi::DataType::F32, "scale factors must be f32"));
  }
  if (b == 0 || n == 0 || tp == 0) return ffi::Error::Success();
  JMX_RETURN_IF_ERROR(As2D(q, "q", &t[0]));
  JMX_RETURN_IF_ERROR(As2D(k, "k", &t[1]));
  JMX_RETURN_IF_ERROR(As2D(vt, "vt", &t[2]));
  JMX_RETURN_IF_ERROR(As2D(qs, "qs", &t[3]));
  JMX_RETURN_IF_ERROR(As2D(ks, "ks", &t[4]));
  JMX_RETURN_IF_ERROR(As2D(vs, "vs", &t[5]));
  JMX_RETURN_IF_ERROR(As2D(vi, "vi", &t[6]));
  JMX_RETURN_IF_ERROR(As2D(o, "o", &t[7]));
  JMX_RETURN_IF_ERROR(As2D(lse, "lse", &t[8]));
  JMX_RETURN_IF_ERROR(
      Want(t[3].rows == q_rows * n && t[3].cols == tp / 32, "qs must be (B, N, Tp/32) (B = 1 for broadcast_q)"));
  JMX_RETURN_IF_ERROR(Want(t[4].rows == b * nk && t[4].cols == sp / 32, "ks must be (B, K, Sp/32)"));
  JMX_RETURN_IF_ERROR(Want(t[5].rows == b * nk && t[5].cols == sp / 128 * (h / 32), "vs must be (B, K, Sp/128*H/32)"));
  JMX_RETURN_IF_ERROR(Want(t[6].rows == t[5].rows && t[6].cols == t[5].cols, "vi must match vs"));
  JMX_RETURN_IF_ERROR(Want(t[7].rows == b * n * tp && t[7].cols == h, "o must be (B, Tp, N, H)"));
  JMX_RETURN_IF_ERROR(Want(t[8].rows == b * n && t[8].cols == tp, "lse must be (B, N, Tp)"));
  JMX_RETURN_IF_ERROR(Want(b * n <= 65535, "grid too large (B*N must be <= 65535)"));
  return ffi::Error::Success();
}

// The variant named by the `kernel` attribute, checked against the target (packed or not) and the buffers'
// head_dim.
ffi::Error FindVariant(int32_t device, std::string_view kernel, int64_t packed, const FwdShape& shape,
                       const KernelEntry** entry) {
  JMX_RETURN_IF_ERROR(FindKernel(device, kOp, kernel, entry));
  const int64_t h = Param(*entry, "head_dim");
  JMX_RETURN_IF_ERROR(Want(h == shape.h, "kernel '" + std::string((*entry)->name) + "' has head_dim " +
                                             std::to_string(h) + ", the buffers have H = " + std::to_string(shape.h)));
  return Want(Param(*entry, "packed") == packed,
              "kernel '" + std::string((*entry)->name) +
                  (packed ? "' is not a packed-sequence variant (use jax_mxfp8_attention_fwd)"
                          : "' is a packed-sequence variant (use jax_mxfp8_attention_fwd_packed)"));
}

// The launch's tensor list: the seven operands, then the int32 tables, then o and lse.
ffi::Error LaunchFwd(cudaStream_t stream, int32_t device, const KernelEntry* entry, const TensorView* ops,
                     const TensorView* tables, int n_tables) {
  TensorView t[11];
  for (int i = 0; i < 7; ++i) t[i] = ops[i];
  for (int i = 0; i < n_tables; ++i) t[7 + i] = tables[i];
  t[7 + n_tables] = ops[7];
  t[8 + n_tables] = ops[8];
  return Launch(entry, device, t, 9 + n_tables, stream);
}

ffi::Error AttentionFwdImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer vt,
                            ffi::AnyBuffer qs, ffi::AnyBuffer ks, ffi::AnyBuffer vs, ffi::AnyBuffer vi,
                            ffi::AnyBuffer lens, ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse,
                            std::string_view kernel) {
  FwdShape shape;
  TensorView t[9];
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOp, kernel, &entry));
  const bool broadcast_q = Param(entry, "broadcast_q") == 1;
  JMX_RETURN_IF_ERROR(CheckOperands(q, k, vt, qs, ks, vs, vi, o, lse, &shape, t, broadcast_q));
  JMX_RETURN_IF_ERROR(FindVariant(device, kernel, 0, shape, &entry));
  JMX_RETURN_IF_ERROR(Want(lens.element_type() == ffi::DataType::S32, "lens must be s32"));
  if (shape.b == 0 || shape.n == 0 || shape.tp == 0) return ffi::Error::Success();
  TensorView lens2d;
  JMX_RETURN_IF_ERROR(As2D(lens, "lens", &lens2d));
  JMX_RETURN_IF_ERROR(Want(lens2d.rows == 2 && lens2d.cols == shape.b, "lens must be (2, B)"));
  return LaunchFwd(stream, device, entry, t, &lens2d, 1);
}

// Packed sequences: B = 1; seqs (4, S) s32 = (first query tile, first KV tile, query length, KV length) of
// each sequence; work (2, W) s32 = (sequence or -1, query tile in it), one CTA per item and head.
ffi::Error AttentionFwdPackedImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                  ffi::AnyBuffer vt, ffi::AnyBuffer qs, ffi::AnyBuffer ks, ffi::AnyBuffer vs,
                                  ffi::AnyBuffer vi, ffi::AnyBuffer seqs, ffi::AnyBuffer work,
                                  ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse,
                                  std::string_view kernel) {
  FwdShape shape;
  TensorView t[9];
  JMX_RETURN_IF_ERROR(CheckOperands(q, k, vt, qs, ks, vs, vi, o, lse, &shape, t));
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindVariant(device, kernel, 1, shape, &entry));
  JMX_RETURN_IF_ERROR(Want(shape.b == 1, "packed operands have one batch row"));
  JMX_RETURN_IF_ERROR(Want(seqs.element_type() == ffi::DataType::S32 && work.element_type() == ffi::DataType::S32,
                           "seqs and work must be s32"));
  TensorView tables[2];
  JMX_RETURN_IF_ERROR(As2D(seqs, "seqs", &tables[0]));
  JMX_RETURN_IF_ERROR(As2D(work, "work", &tables[1]));
  JMX_RETURN_IF_ERROR(Want(tables[0].rows == 4 && tables[0].cols > 0, "seqs must be (4, S) with S >= 1"));
  JMX_RETURN_IF_ERROR(Want(tables[1].rows == 2, "work must be (2, W)"));
  if (shape.n == 0 || shape.tp == 0 || tables[1].cols == 0) return ffi::Error::Success();
  return LaunchFwd(stream, device, entry, t, tables, 2);
}

// Test hooks: the same launches with o and lse passed in as well (XLA aliases them to the results), so a
// test can fill them with NaN first and check that the kernel writes every element.
ffi::Error AttentionFwdIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                ffi::AnyBuffer vt, ffi::AnyBuffer qs, ffi::AnyBuffer ks, ffi::AnyBuffer vs,
                                ffi::AnyBuffer vi, ffi::AnyBuffer lens, ffi::AnyBuffer, ffi::AnyBuffer,
                                ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse,
                                std::string_view kernel) {
  return AttentionFwdImpl(stream, device, q, k, vt, qs, ks, vs, vi, lens, o, lse, kernel);
}

ffi::Error AttentionFwdPackedIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                      ffi::AnyBuffer vt, ffi::AnyBuffer qs, ffi::AnyBuffer ks, ffi::AnyBuffer vs,
                                      ffi::AnyBuffer vi, ffi::AnyBuffer seqs, ffi::AnyBuffer work, ffi::AnyBuffer,
                                      ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer> o,
                                      ffi::Result<ffi::AnyBuffer> lse, std::string_view kernel) {
  return AttentionFwdPackedImpl(stream, device, q, k, vt, qs, ks, vs, vi, seqs, work, o, lse, kernel);
}

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

// Operands of every target: q, k, vt, qs, ks, vs, vi, lens (dense) or seqs + work (packed); the _into test
// hooks take o and lse as two more operands, aliased to the results. Attribute: the variant name.
XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_fwd, jmx::AttentionFwdImpl,
                              (jmx::BindBuffers<8, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_fwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_fwd_into, jmx::AttentionFwdIntoImpl,
                              (jmx::BindBuffers<10, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_fwd_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_fwd_packed, jmx::AttentionFwdPackedImpl,
                              (jmx::BindBuffers<9, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_fwd_packed);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_fwd_packed_into, jmx::AttentionFwdPackedIntoImpl,
                              (jmx::BindBuffers<11, 2>().Attr<std::string_view>("kernel")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_fwd_packed_into);

#pragma GCC visibility pop
