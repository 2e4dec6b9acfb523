// XLA FFI handler for the Hopper MXFP8 attention backward (jax_mxfp8/kernels/sm90/attention_bwd.py).
//
//   jax_mxfp8_attention_bwd  (q, k, v, do, lse, delta, lens) -> (dq, dk, dv, dq_sem)
//     attributes: kernel (string) = the registry variant name, e.g. "attention_bwd_h128_causal" (it fixes
//     causal masking, head_dim, dq_accum and deterministic; H checked against the buffers'); scale (f32) =
//     tau; dq_scale_log2 (s32) = e of dq_accum "fp16" (dq holds dQ * 2^e; 0..15), 0 for "fp32".
//   jax_mxfp8_attention_bwd_fp8  (q, k, v8, do, lse, delta, lens, q8, k8, do8, qs, ks, vs, dos) -> the same:
//     the sdp_fp8 variants (S^T and dP^T on FP8 wgmma; V only in dP^T, so no bfloat16 v): FP8 copies of q, k,
//     v, do with one exponent per 32 rows and their row factors, qs, dos (B, N, Tp / 32), ks, vs (B, K, Sp / 32).
//   jax_mxfp8_attention_bwd_packed  (q, k, v8, do, lse, delta, seqs, work, q8, k8, do8, qs, ks, vs, dos) -> the
//     same: the packed variants (sdp_fp8, B = 1 holding every sequence of the aligned packed layout).
//   jax_mxfp8_attention_bwd_into, _fp8_into, _packed_into  the same with dq, dk, dv, dq_sem passed in as four
//     more operands (aliased to the results): the test hooks that NaN-poison the outputs.
//
// Operands (docs/interfaces.md; Tp, Sp multiples of 128, H 64 or 128, N a multiple of K):
//   q, do (B, N, Tp, H) bf16   k, v (B, K, Sp, H) bf16   lse, delta (B, N, Tp) f32   lens (2, B) s32
//   (packed variants: seqs (4, S) s32, per sequence its first query tile, first KV tile (128-row tiles),
//   query length, KV length, the forward's table; work (2, Sp / 128) s32, per key tile in order (its
//   sequence, key tile in it), (-1, 0) for a tile in no sequence)
//   dq (B, N, Tp, H) f32 (f16 for dq_accum "fp16")   dk, dv (B, K, Sp, H) f32   dq_sem (B, N, Tp / 32) s32
//   broadcast_q variants (fp32, not deterministic): q and dq (1, N, Tp, H), dq the sum over the B batch rows
// dq is accumulated with atomics (or, deterministic, ordered adds): the handler zero-fills it first
// (cudaMemsetAsync on XLA's stream); the kernel writes every element of dk and dv. dq_sem holds the
// deterministic variants' per-query-tile counters (zero-filled for them; untouched by the others, which
// take neither it nor the second scalar tau 2^e: kernels/sm90/attention_bwd_dq.py). Every failure is returned as an ffi::Error; the
// handler only enqueues work on XLA's stream (CUDA-graph compatible).
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>

#include "common.h"

namespace jmx {
namespace {

constexpr std::string_view kOp = "attention_bwd";

ffi::Error Dims(const ffi::AnyBuffer& b, const char* what, size_t rank, int64_t* out) {
  return jmx::Dims(b, kOp, what, rank, out);
}
ffi::Error Want(bool ok, const std::string& msg) { return jmx::Want(ok, kOp, msg); }

// A (heads, length * H) view of a (B, heads, length, H) buffer: the kernel's 2-D operand layout.
ffi::Error HeadRows(void* data, int64_t heads, int64_t length, int64_t h, const char* what, TensorView* out) {
  JMX_RETURN_IF_ERROR(Want(heads <= INT32_MAX && length * h <= INT32_MAX,
                           std::string(what) + " is too large for 32-bit indexing"));
  JMX_RETURN_IF_ERROR(Want(reinterpret_cast<uintptr_t>(data) % 16 == 0, std::string(what) + " is not 16-byte aligned"));
  *out = TensorView{data, static_cast<int32_t>(heads), static_cast<int32_t>(length * h)};
  return ffi::Error::Success();
}

// The sdp_fp8 variants' FP8 operands (registry AttentionBwdConfig.sdp_fp8): copies of q, k, v, do (same
// shapes, float8_e4m3fn; v8 replaces the bfloat16 v, which those variants do not read) and their row factors
// qs, dos (B, N, Tp / 32), ks, vs (B, K, Sp / 32) f32.
struct Fp8Operands {
  const ffi::AnyBuffer* data[4];    // q8, k8, v8, do8
  const ffi::AnyBuffer* factor[4];  // qs, ks, vs, dos
};

// Checks the FP8 copies against their bfloat16 counterparts' shapes (qd: q's, kd: k's, b the batch) and
// writes them and their factors to t[0..7].
ffi::Error Fp8Tensors(const Fp8Operands& f, const int64_t* qd, const int64_t* kd, int64_t b, TensorView* t) {
  static const char* kData[4] = {"q8", "k8", "v8", "do8"};
  static const char* kFactor[4] = {"qs", "ks", "vs", "dos"};
  for (int i = 0; i < 4; ++i) {
    const bool query = i == 0 || i == 3;
    const int64_t heads = b * (query ? qd[1] : kd[1]), length = query ? qd[2] : kd[2], h = qd[3];
    int64_t d[4], s[3];
    JMX_RETURN_IF_ERROR(Dims(*f.data[i], kData[i], 4, d));
    JMX_RETURN_IF_ERROR(Dims(*f.factor[i], kFactor[i], 3, s));
    JMX_RETURN_IF_ERROR(Want(f.data[i]->element_type() == ffi::DataType::F8E4M3FN,
                             std::string(kData[i]) + " must be float8_e4m3fn"));
    JMX_RETURN_IF_ERROR(Want(f.factor[i]->element_type() == ffi::DataType::F32, std::string(kFactor[i]) + " must be f32"));
    JMX_RETURN_IF_ERROR(Want(d[0] * d[1] == heads && d[0] == b && d[2] == length && d[3] == h,
                             std::string(kData[i]) + " must have the shape of its bfloat16 operand"));
    JMX_RETURN_IF_ERROR(Want(s[0] == b && s[0] * s[1] == heads && s[2] * 32 == length,
                             std::string(kFactor[i]) + " must be (B, heads, L / 32)"));
    JMX_RETURN_IF_ERROR(HeadRows(f.data[i]->untyped_data(), heads, length, h, kData[i], &t[i]));
    JMX_RETURN_IF_ERROR(As2D(*f.factor[i], kFactor[i], &t[4 + i]));
  }
  return ffi::Error::Success();
}

ffi::Error AttentionBwdRun(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                           ffi::AnyBuffer d_o, ffi::AnyBuffer lse, ffi::AnyBuffer delta, ffi::AnyBuffer lens,
                           ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                           ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dq_sem,
                           std::string_view kernel, float scale, int32_t dq_scale_log2, const Fp8Operands* fp8,
                           const ffi::AnyBuffer* work) {
  int64_t qd[4], kd[4], vd[4], od[4], ld[3], dd[3], gq[4], gk[4], gv[4], gs[3];
  JMX_RETURN_IF_ERROR(Dims(q, "q", 4, qd));
  JMX_RETURN_IF_ERROR(Dims(k, "k", 4, kd));
  JMX_RETURN_IF_ERROR(Dims(v, "v", 4, vd));
  JMX_RETURN_IF_ERROR(Dims(d_o, "do", 4, od));
  JMX_RETURN_IF_ERROR(Dims(lse, "lse", 3, ld));
  JMX_RETURN_IF_ERROR(Dims(delta, "delta", 3, dd));
  JMX_RETURN_IF_ERROR(jmx::Dims(*dq, kOp, "dq", 4, gq));
  JMX_RETURN_IF_ERROR(jmx::Dims(*dk, kOp, "dk", 4, gk));
  JMX_RETURN_IF_ERROR(jmx::Dims(*dv, kOp, "dv", 4, gv));
  JMX_RETURN_IF_ERROR(jmx::Dims(*dq_sem, kOp, "dq_sem", 3, gs));
  const KernelEntry* entry = nullptr;
  JMX_RETURN_IF_ERROR(FindKernel(device, kOp, kernel, &entry));
  // broadcast_q variants: q (1, N, Tp, H) is one query sequence for all B batch rows of k, v, do, lse and
  // delta; dq (1, N, Tp, H) takes every batch row's dQ (the kernel's float32 reductions into batch 0)
  const bool broadcast_q = Param(entry, "broadcast_q") == 1;
  JMX_RETURN_IF_ERROR(Want(!broadcast_q || qd[0] == 1, "a broadcast_q variant takes q of batch 1"));
  const int64_t b = broadcast_q ? kd[0] : qd[0], n = qd[1], tp = qd[2], h = qd[3], nk = kd[1], sp = kd[2];
  const int64_t q_rows = broadcast_q ? 1 : b;
  // (sdp_fp8: v is v8, float8_e4m3fn, checked with the other FP8 operands; dv_f16: do is f16, dO 2^-shift)
  const bool dv_f16 = Param(entry, "dv_f16") == 1;
  JMX_RETURN_IF_ERROR(Want(q.element_type() == ffi::DataType::BF16 && k.element_type() == ffi::DataType::BF16 &&
                               (fp8 != nullptr || v.element_type() == ffi::DataType::BF16),
                           fp8 != nullptr ? "q and k must be bf16" : "q, k and v must be bf16"));
  const ffi::DataType do_type = dv_f16 ? ffi::DataType::F16 : ffi::DataType::BF16;
  JMX_RETURN_IF_ERROR(Want(d_o.element_type() == do_type, "kernel '" + std::string(entry->name) + "' needs do " +
                                                              DTypeName(do_type) + ", got " +
                                                              DTypeName(d_o.element_type())));
  JMX_RETURN_IF_ERROR(Want(lse.element_type() == ffi::DataType::F32 && delta.element_type() == ffi::DataType::F32,
                           "lse and delta must be f32"));
  JMX_RETURN_IF_ERROR(Want(lens.element_type() == ffi::DataType::S32, "lens must be s32"));
  JMX_RETURN_IF_ERROR(Want(dk->element_type() == ffi::DataType::F32 && dv->element_type() == ffi::DataType::F32,
                           "dk and dv must be f32"));
  JMX_RETURN_IF_ERROR(Want(dq_sem->element_type() == ffi::DataType::S32, "dq_sem must be s32"));
  JMX_RETURN_IF_ERROR(Want(gs[0] == b && gs[1] == n && gs[2] * 32 == tp, "dq_sem must be (B, N, Tp / 32)"));
  JMX_RETURN_IF_ERROR(Want(h == 64 || h == 128, "head_dim must be 64 or 128, got " + std::to_string(h)));
  JMX_RETURN_IF_ERROR(Want(tp % 128 == 0 && sp % 128 == 0, "padded lengths must be multiples of 128"));
  JMX_RETURN_IF_ERROR(Want(kd[0] == b && kd[3] == h && nk > 0 && n % nk == 0, "k must be (B, K, Sp, H) with K | N"));
  for (int i = 0; i < 4; ++i) {
    JMX_RETURN_IF_ERROR(Want(vd[i] == kd[i] && gk[i] == kd[i] && gv[i] == kd[i], "v, dk and dv must match k's shape"));
    const int64_t want = i == 0 ? b : qd[i];  // q's shape with k's batch
    JMX_RETURN_IF_ERROR(Want(od[i] == want, "do must match q's shape (B, N, Tp, H)"));
    JMX_RETURN_IF_ERROR(Want(gq[i] == (i == 0 ? q_rows : qd[i]), "dq must be (B, N, Tp, H) (broadcast_q: q's shape)"));
  }
  for (int i = 0; i < 3; ++i) {
    const int64_t want = i == 0 ? b : qd[i];
    JMX_RETURN_IF_ERROR(Want(ld[i] == want && dd[i] == want, "lse and delta must be (B, N, Tp)"));
  }
  int64_t lens_dims[2], work_dims[2];
  JMX_RETURN_IF_ERROR(Dims(lens, work != nullptr ? "seqs" : "lens", 2, lens_dims));
  // packed variants: one batch row of aligned packed sequences, the seqs table and the key tiles' work list
  const bool packed = Param(entry, "packed") == 1;
  JMX_RETURN_IF_ERROR(Want(packed == (work != nullptr),
                           "kernel '" + std::string(entry->name) +
                               (packed ? "' is a packed variant: call jax_mxfp8_attention_bwd_packed"
                                       : "' is not a packed variant: call jax_mxfp8_attention_bwd(_fp8)")));
  if (packed) {
    JMX_RETURN_IF_ERROR(Dims(*work, "work", 2, work_dims));
    JMX_RETURN_IF_ERROR(Want(work->element_type() == ffi::DataType::S32, "work must be s32"));
    JMX_RETURN_IF_ERROR(Want(b == 1, "a packed variant takes B = 1"));
    JMX_RETURN_IF_ERROR(Want(lens_dims[0] == 4 && lens_dims[1] > 0, "seqs must be (4, S) with S >= 1"));
    JMX_RETURN_IF_ERROR(Want(work_dims[0] == 2 && work_dims[1] * 128 == sp, "work must be (2, Sp / 128)"));
  } else {
    JMX_RETURN_IF_ERROR(Want(lens_dims[0] == 2 && lens_dims[1] == b, "lens must be (2, B)"));
  }

  const bool sdp_fp8 = Param(entry, "sdp_fp8") == 1;
  JMX_RETURN_IF_ERROR(Want(sdp_fp8 == (fp8 != nullptr),
                           "kernel '" + std::string(entry->name) +
                               (sdp_fp8 ? "' takes the FP8 operands: call jax_mxfp8_attention_bwd_fp8"
                                        : "' takes no FP8 operands: call jax_mxfp8_attention_bwd")));
  const int64_t kh = Param(entry, "head_dim");
  JMX_RETURN_IF_ERROR(Want(kh == h, "kernel '" + std::string(entry->name) + "' has head_dim " + std::to_string(kh) +
                                        ", the buffers have H = " + std::to_string(h)));

  // dQ modes (registry AttentionBwdConfig.dq_mode): dq_accum "fp16" (code 1) and / or deterministic
  const bool fp16 = Param(entry, "dq_accum") == 1;
  const bool ordered = Param(entry, "deterministic") == 1;
  JMX_RETURN_IF_ERROR(
      Want(!broadcast_q || (!fp16 && !ordered), "broadcast_q variants take dq_accum fp32, not deterministic"));
  const ffi::DataType dq_type = fp16 ? ffi::DataType::F16 : ffi::DataType::F32;
  JMX_RETURN_IF_ERROR(Want(dq->element_type() == dq_type, "kernel '" + std::string(entry->name) + "' needs dq " +
                                                              DTypeName(dq_type) + ", got " +
                                                              DTypeName(dq->element_type())));
  JMX_RETURN_IF_ERROR(Want(fp16 ? (0 <= dq_scale_log2 && dq_scale_log2 <= 15) : dq_scale_log2 == 0,
                           "dq_scale_log2 must be in [0, 15] for dq_accum fp16 and 0 for fp32, got " +
                               std::to_string(dq_scale_log2)));
  const size_t dq_bytes = static_cast<size_t>(q_rows * n * tp * h) * (fp16 ? 2 : sizeof(float));
  if (dq_bytes > 0) {
    cudaError_t err = cudaMemsetAsync(dq->untyped_data(), 0, dq_bytes, stream);
    JMX_RETURN_IF_ERROR(Want(err == cudaSuccess, std::string("zero-filling dq failed: ") + cudaGetErrorString(err)));
  }
  const size_t sem_bytes = static_cast<size_t>(b * n * (tp / 32)) * sizeof(int32_t);
  if (ordered && sem_bytes > 0) {
    cudaError_t err = cudaMemsetAsync(dq_sem->untyped_data(), 0, sem_bytes, stream);
    JMX_RETURN_IF_ERROR(Want(err == cudaSuccess, std::string("zero-filling dq_sem failed: ") + cudaGetErrorString(err)));
  }
  if (b == 0 || n == 0 || tp == 0 || sp == 0) return ffi::Error::Success();
  JMX_RETURN_IF_ERROR(Want(b * nk <= 65535, "grid too large (B*K must be <= 65535)"));

  TensorView t[11];
  JMX_RETURN_IF_ERROR(HeadRows(q.untyped_data(), q_rows * n, tp, h, "q", &t[0]));
  JMX_RETURN_IF_ERROR(HeadRows(k.untyped_data(), b * nk, sp, h, "k", &t[1]));
  JMX_RETURN_IF_ERROR(HeadRows(v.untyped_data(), b * nk, sp, h, "v", &t[2]));
  JMX_RETURN_IF_ERROR(HeadRows(d_o.untyped_data(), b * n, tp, h, "do", &t[3]));
  JMX_RETURN_IF_ERROR(As2D(lse, "lse", &t[4]));
  JMX_RETURN_IF_ERROR(As2D(delta, "delta", &t[5]));
  JMX_RETURN_IF_ERROR(As2D(lens, "lens", &t[6]));
  JMX_RETURN_IF_ERROR(HeadRows(dq->untyped_data(), q_rows * n, tp, h, "dq", &t[7]));
  JMX_RETURN_IF_ERROR(HeadRows(dk->untyped_data(), b * nk, sp, h, "dk", &t[8]));
  JMX_RETURN_IF_ERROR(HeadRows(dv->untyped_data(), b * nk, sp, h, "dv", &t[9]));
  if (!fp16 && !ordered) {
    const float scalars[1] = {scale};
    if (packed) {  // the kernel's launch_packed: q, k, do, lse, delta, seqs, work, dq, dk, dv, the FP8 operands
      TensorView f[18] = {t[0], t[1], t[3], t[4], t[5], t[6], {}, t[7], t[8], t[9]};
      JMX_RETURN_IF_ERROR(As2D(*work, "work", &f[6]));
      JMX_RETURN_IF_ERROR(Fp8Tensors(*fp8, qd, kd, b, &f[10]));
      return Launch(entry, device, f, 18, stream, scalars, 1);
    }
    if (sdp_fp8) {  // the kernel's launch_fp8: q, k, do, lse, delta, lens, dq, dk, dv, the FP8 operands
      TensorView f[17] = {t[0], t[1], t[3], t[4], t[5], t[6], t[7], t[8], t[9]};
      JMX_RETURN_IF_ERROR(Fp8Tensors(*fp8, qd, kd, b, &f[9]));
      return Launch(entry, device, f, 17, stream, scalars, 1);
    }
    return Launch(entry, device, t, 10, stream, scalars, 1);
  }
  JMX_RETURN_IF_ERROR(As2D(*dq_sem, "dq_sem", &t[10]));
  const float scalars[2] = {scale, std::ldexp(scale, dq_scale_log2)};  // tau, tau 2^e
  return Launch(entry, device, t, 11, stream, scalars, 2);
}

ffi::Error AttentionBwdImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                            ffi::AnyBuffer d_o, ffi::AnyBuffer lse, ffi::AnyBuffer delta, ffi::AnyBuffer lens,
                            ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                            ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dq_sem,
                            std::string_view kernel, float scale, int32_t dq_scale_log2) {
  return AttentionBwdRun(stream, device, q, k, v, d_o, lse, delta, lens, dq, dk, dv, dq_sem, kernel, scale,
                         dq_scale_log2, nullptr, nullptr);
}

// The sdp_fp8 variants: the same operands with v8 (float8_e4m3fn) in v's place, then q8, k8, do8, qs, ks, vs, dos.
ffi::Error AttentionBwdFp8Impl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k,
                               ffi::AnyBuffer v8, ffi::AnyBuffer d_o, ffi::AnyBuffer lse, ffi::AnyBuffer delta,
                               ffi::AnyBuffer lens, ffi::AnyBuffer q8, ffi::AnyBuffer k8, ffi::AnyBuffer do8,
                               ffi::AnyBuffer qs, ffi::AnyBuffer ks, ffi::AnyBuffer vs, ffi::AnyBuffer dos,
                               ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                               ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dq_sem,
                               std::string_view kernel, float scale, int32_t dq_scale_log2) {
  const Fp8Operands fp8{{&q8, &k8, &v8, &do8}, {&qs, &ks, &vs, &dos}};
  return AttentionBwdRun(stream, device, q, k, v8, d_o, lse, delta, lens, dq, dk, dv, dq_sem, kernel, scale,
                         dq_scale_log2, &fp8, nullptr);
}

// The packed variants: the sdp_fp8 operands with seqs and work in lens' place.
ffi::Error AttentionBwdPackedImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                  ffi::AnyBuffer v8, ffi::AnyBuffer d_o, ffi::AnyBuffer lse, ffi::AnyBuffer delta,
                                  ffi::AnyBuffer seqs, ffi::AnyBuffer work, ffi::AnyBuffer q8, ffi::AnyBuffer k8,
                                  ffi::AnyBuffer do8, ffi::AnyBuffer qs, ffi::AnyBuffer ks, ffi::AnyBuffer vs,
                                  ffi::AnyBuffer dos, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                  ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dq_sem,
                                  std::string_view kernel, float scale, int32_t dq_scale_log2) {
  const Fp8Operands fp8{{&q8, &k8, &v8, &do8}, {&qs, &ks, &vs, &dos}};
  return AttentionBwdRun(stream, device, q, k, v8, d_o, lse, delta, seqs, dq, dk, dv, dq_sem, kernel, scale,
                         dq_scale_log2, &fp8, &work);
}

// Test hook: the same launch with dq, dk, dv passed in as well (aliased to the results).
ffi::Error AttentionBwdIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                ffi::AnyBuffer v, ffi::AnyBuffer d_o, ffi::AnyBuffer lse, ffi::AnyBuffer delta,
                                ffi::AnyBuffer lens, ffi::AnyBuffer, ffi::AnyBuffer, ffi::AnyBuffer, ffi::AnyBuffer,
                                ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dq_sem,
                                std::string_view kernel, float scale, int32_t dq_scale_log2) {
  return AttentionBwdRun(stream, device, q, k, v, d_o, lse, delta, lens, dq, dk, dv, dq_sem, kernel, scale,
                         dq_scale_log2, nullptr, nullptr);
}

// Test hook of the sdp_fp8 variants: jax_mxfp8_attention_bwd_fp8's operands, then dq, dk, dv, dq_sem (aliased).
ffi::Error AttentionBwdFp8IntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                   ffi::AnyBuffer v8, ffi::AnyBuffer d_o, ffi::AnyBuffer lse, ffi::AnyBuffer delta,
                                   ffi::AnyBuffer lens, ffi::AnyBuffer q8, ffi::AnyBuffer k8, ffi::AnyBuffer do8,
                                   ffi::AnyBuffer qs, ffi::AnyBuffer ks, ffi::AnyBuffer vs, ffi::AnyBuffer dos,
                                   ffi::AnyBuffer, ffi::AnyBuffer, ffi::AnyBuffer, ffi::AnyBuffer,
                                   ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                   ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dq_sem,
                                   std::string_view kernel, float scale, int32_t dq_scale_log2) {
  return AttentionBwdFp8Impl(stream, device, q, k, v8, d_o, lse, delta, lens, q8, k8, do8, qs, ks, vs, dos, dq, dk, dv,
                             dq_sem, kernel, scale, dq_scale_log2);
}

// Test hook of the packed variants: jax_mxfp8_attention_bwd_packed's operands, then dq, dk, dv, dq_sem (aliased).
ffi::Error AttentionBwdPackedIntoImpl(cudaStream_t stream, int32_t device, ffi::AnyBuffer q, ffi::AnyBuffer k,
                                      ffi::AnyBuffer v8, ffi::AnyBuffer d_o, ffi::AnyBuffer lse, ffi::AnyBuffer delta,
                                      ffi::AnyBuffer seqs, ffi::AnyBuffer work, ffi::AnyBuffer q8, ffi::AnyBuffer k8,
                                      ffi::AnyBuffer do8, ffi::AnyBuffer qs, ffi::AnyBuffer ks, ffi::AnyBuffer vs,
                                      ffi::AnyBuffer dos, ffi::AnyBuffer, ffi::AnyBuffer, ffi::AnyBuffer,
                                      ffi::AnyBuffer, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                                      ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> dq_sem,
                                      std::string_view kernel, float scale, int32_t dq_scale_log2) {
  return AttentionBwdPackedImpl(stream, device, q, k, v8, d_o, lse, delta, seqs, work, q8, k8, do8, qs, ks, vs, dos,
                                dq, dk, dv, dq_sem, kernel, scale, dq_scale_log2);
}

}  // namespace
}  // namespace jmx

namespace ffi = xla::ffi;

#pragma GCC visibility push(default)

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_bwd, jmx::AttentionBwdImpl,
                              (jmx::BindBuffers<7, 4>()
                                   .Attr<std::string_view>("kernel")
                                   .Attr<float>("scale")
                                   .Attr<int32_t>("dq_scale_log2")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_bwd);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_bwd_fp8, jmx::AttentionBwdFp8Impl,
                              (jmx::BindBuffers<14, 4>()
                                   .Attr<std::string_view>("kernel")
                                   .Attr<float>("scale")
                                   .Attr<int32_t>("dq_scale_log2")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_bwd_fp8);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_bwd_packed, jmx::AttentionBwdPackedImpl,
                              (jmx::BindBuffers<15, 4>()
                                   .Attr<std::string_view>("kernel")
                                   .Attr<float>("scale")
                                   .Attr<int32_t>("dq_scale_log2")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_bwd_packed);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_bwd_into, jmx::AttentionBwdIntoImpl,
                              (jmx::BindBuffers<11, 4>()
                                   .Attr<std::string_view>("kernel")
                                   .Attr<float>("scale")
                                   .Attr<int32_t>("dq_scale_log2")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_bwd_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_bwd_fp8_into, jmx::AttentionBwdFp8IntoImpl,
                              (jmx::BindBuffers<18, 4>()
                                   .Attr<std::string_view>("kernel")
                                   .Attr<float>("scale")
                                   .Attr<int32_t>("dq_scale_log2")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_bwd_fp8_into);

XLA_FFI_DEFINE_HANDLER_SYMBOL(jax_mxfp8_attention_bwd_packed_into, jmx::AttentionBwdPackedIntoImpl,
                              (jmx::BindBuffers<19, 4>()
                                   .Attr<std::string_view>("kernel")
                                   .Attr<float>("scale")
                                   .Attr<int32_t>("dq_scale_log2")),
                              {ffi::Traits::kCmdBufferCompatible});
JMX_REGISTER_FFI_TARGET(jax_mxfp8_attention_bwd_packed_into);

#pragma GCC visibility pop
