// The CPU kernels of a decode step besides its attention (cpu_attention.cpp; speedrun.kernels builds both), each one
// pass in fp32 over fp32 or bf16 tensors:
// - rotary_cache: a decode step's rotary on its query and key heads, and the write of its keys and values into the
//   layer's cache, where PyTorch runs about 15 small ops (139 us a layer at 64 rows of SmolLM2).
// - rms_norm, add_rms_norm, silu_mul: a Llama's RMSNorm (after its residual add, the output in the dtype the next
//   product takes) and its SwiGLU's silu(gate) * up, where PyTorch runs 7-9 and 2 ops (silu_mul runs PyTorch's two
//   where the build has no AVX512: its loop was slower there).
// - cdf_search: a draw's inverse CDF, the same index as searchsorted(exp(logprobs).cumsum(-1), u * total) (the sums in
//   fp64 one term after another, as PyTorch's cumsum takes them) without writing the CDF, 8 rows side by side.
// - llama_blocks: a Llama's blocks over one decode step, the kernels above and oneDNN's packed products called from
//   here in the order LlamaBlock runs them from Python (the same bits), without the Python between them.
// A thread computes whole rows (or (row, head) pairs), so results do not depend on the thread count.
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/silu.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <string_view>
#include <tuple>
#include <vector>

#include "cpu_kernels.h"

namespace {
using namespace speedrun_kernels;

// RMSNorm of rows [begin, end) of x [R, C] with weight w [C] (fp32), into y of type U; the mean square in fp32. With
// r (the residual branch's output): of x + r instead, the sum rounded to x's type and written to s, as PyTorch's add
template <typename T, typename R, typename U>
void rms_range(const T* __restrict x, const R* __restrict r, T* __restrict s, const float* __restrict w,
               U* __restrict y, int64_t C, float eps, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const T* xr = x + i * C;
    if (r != nullptr) {
      for (int64_t c = 0; c < C; ++c) store(s + i * C + c, to_float(xr[c]) + to_float(r[i * C + c]));
      xr = s + i * C;
    }
    float ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += to_float(xr[c]) * to_float(xr[c]);
    const float inv = 1.f / std::sqrt(ss / C + eps);
    for (int64_t c = 0; c < C; ++c) store(y + i * C + c, to_float(xr[c]) * inv * w[c]);
  }
}

template <typename T, typename R, typename U>
void rms_rows(const at::Tensor& x, const at::Tensor* r, at::Tensor& s, const at::Tensor& w, at::Tensor& y, float eps) {
  const int64_t C = x.size(-1), rows = x.numel() / C;
  const T* xp = raw<T>(x);
  const R* rp = r ? raw<R>(*r) : nullptr;
  T* sp = r ? raw<T>(s) : nullptr;
  const float* wp = w.data_ptr<float>();
  U* yp = raw<U>(y);
  at::parallel_for(0, rows, 16, [=](int64_t begin, int64_t end) { rms_range(xp, rp, sp, wp, yp, C, eps, begin, end); });
}

at::Tensor rms_out(const at::Tensor& x, const at::Tensor& weight, std::optional<at::ScalarType> dtype) {
  TORCH_CHECK(x.dim() > 0 && x.size(-1) > 0, "rms_norm: rows of at least one value");
  TORCH_CHECK(x.is_contiguous() && weight.is_contiguous() && x.device().is_cpu(), "rms_norm: contiguous CPU tensors");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.dim() == 1 && x.size(-1) == weight.size(0),
              "rms_norm: an fp32 weight as wide as x's last dimension");
  const at::ScalarType out = dtype.value_or(x.scalar_type());
  TORCH_CHECK((x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
              (out == at::kFloat || out == at::kBFloat16), "rms_norm: x and the output fp32 or bf16");
  return at::empty(x.sizes(), x.options().dtype(out));
}

template <typename R>
void rms_dispatch(const at::Tensor& x, const at::Tensor* r, at::Tensor& s, const at::Tensor& w, at::Tensor& y,
                  double eps) {
  const float e = static_cast<float>(eps);
  if (x.scalar_type() == at::kFloat) {
    if (y.scalar_type() == at::kFloat) rms_rows<float, R, float>(x, r, s, w, y, e);
    else rms_rows<float, R, uint16_t>(x, r, s, w, y, e);
  } else {
    if (y.scalar_type() == at::kFloat) rms_rows<uint16_t, R, float>(x, r, s, w, y, e);
    else rms_rows<uint16_t, R, uint16_t>(x, r, s, w, y, e);
  }
}

// x's RMSNorm, in dtype (else x's)
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, std::optional<at::ScalarType> dtype) {
  at::Tensor y = rms_out(x, weight, dtype), none;
  rms_dispatch<float>(x, nullptr, none, weight, y, eps);
  return y;
}

// (x + r in x's dtype, its RMSNorm in dtype, else x's): a residual add and the next norm in one pass
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight,
                                                double eps, std::optional<at::ScalarType> dtype) {
  at::Tensor y = rms_out(x, weight, dtype), s = at::empty_like(x);
  TORCH_CHECK(r.sizes() == x.sizes() && r.is_contiguous() && r.device().is_cpu() &&
              (r.scalar_type() == at::kFloat || r.scalar_type() == at::kBFloat16),
              "add_rms_norm: the residual branch a contiguous fp32 or bf16 CPU tensor of x's shape");
  if (r.scalar_type() == at::kFloat) rms_dispatch<float>(x, &r, s, weight, y, eps);
  else rms_dispatch<uint16_t>(x, &r, s, weight, y, eps);
  return {s, y};
}

// one head's rotary (speedrun.model.apply_rotary: the first half times cos plus the second times sin, the second
// times cos minus the first times sin) in fp32, rounded once
template <typename T>
inline void rotate(const T* __restrict x, const T* __restrict c, const T* __restrict sn, T* __restrict y,
                   int64_t half) {
  for (int64_t d = 0; d < half; ++d) {
    const float x1 = to_float(x[d]), x2 = to_float(x[d + half]), cd = to_float(c[d]), sd = to_float(sn[d]);
    store(y + d, x1 * cd + x2 * sd);
    store(y + d + half, x2 * cd - x1 * sd);
  }
}

template <typename T>
void rotary_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                 const at::Tensor& sin, const at::Tensor& kc, const at::Tensor& vc, int64_t pos, at::Tensor& qr) {
  const int64_t B = q.size(0), half = cos.size(-1), D = 2 * half, H = q.size(-1) / D, Hkv = kc.size(1);
  const int64_t W = kc.size(2), cs_stride = cos.size(0) == 1 ? 0 : half;
  const T *qp = raw<T>(q), *kp = raw<T>(k), *vp = raw<T>(v), *cp = raw<T>(cos), *sp = raw<T>(sin);
  T *kcp = raw<T>(kc), *vcp = raw<T>(vc), *qrp = raw<T>(qr);
  const int64_t qs = q.stride(0), ks = k.stride(0), vs = v.stride(0);
  at::parallel_for(0, B, 8, [=](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const T *c = cp + b * cs_stride, *sn = sp + b * cs_stride;
      for (int64_t h = 0; h < H; ++h) rotate(qp + b * qs + h * D, c, sn, qrp + (b * H + h) * D, half);
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t at_col = ((b * Hkv + h) * W + pos) * D;
        rotate(kp + b * ks + h * D, c, sn, kcp + at_col, half);
        std::memcpy(vcp + at_col, vp + b * vs + h * D, D * sizeof(T));
      }
    }
  });
}

// q [B, 1, H * D], k and v [B, 1, Hkv * D] (a decode step's projections: each row's values contiguous, the rows at
// any stride, as views of one packed product are); cos, sin [B or 1, D / 2]; k_cache, v_cache [B, Hkv, W, D] (a
// layer's). Writes k rotated and v into the caches' column pos; returns q rotated, [B, H, D].
at::Tensor rotary_cache(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cos,
                        const at::Tensor& sin, const at::Tensor& k_cache, const at::Tensor& v_cache, int64_t pos) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3 && q.size(1) == 1 && k.sizes() == v.sizes() &&
              cos.dim() == 2 && cos.sizes() == sin.sizes() && k_cache.dim() == 4 && k_cache.sizes() == v_cache.sizes(),
              "rotary_cache: q [B, 1, H * D], k and v [B, 1, Hkv * D], cos and sin [B or 1, D / 2], caches "
              "[B, Hkv, W, D]");
  const int64_t B = q.size(0), D = 2 * cos.size(-1), Hkv = k_cache.size(1);
  TORCH_CHECK(D > 0 && k.size(0) == B && k_cache.size(0) == B && (cos.size(0) == 1 || cos.size(0) == B) &&
              k_cache.size(3) == D && q.size(2) % D == 0 && k.size(2) == Hkv * D,
              "rotary_cache: q, k, v, cos, sin and the caches disagree on rows, heads or head width");
  TORCH_CHECK(pos >= 0 && pos < k_cache.size(2), "rotary_cache: column ", pos, " outside the caches' ",
              k_cache.size(2));
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1 && cos.is_contiguous() && sin.is_contiguous() &&
              k_cache.is_contiguous() && v_cache.is_contiguous(),
              "rotary_cache: each row of q, k, v contiguous; cos, sin and the caches contiguous");
  const at::ScalarType t = q.scalar_type();
  for (const at::Tensor* x : {&k, &v, &cos, &sin, &k_cache, &v_cache})
    TORCH_CHECK(x->scalar_type() == t && x->device().is_cpu(), "rotary_cache: CPU tensors of one dtype");
  TORCH_CHECK(t == at::kFloat || t == at::kBFloat16, "rotary_cache: fp32 or bf16");
  at::Tensor qr = at::empty({B, q.size(2) / D, D}, q.options());
  if (t == at::kFloat) rotary_rows<float>(q, k, v, cos, sin, k_cache, v_cache, pos, qr);
  else rotary_rows<uint16_t>(q, k, v, cos, sin, k_cache, v_cache, pos, qr);
  return qr;
}

#if defined(__AVX512F__)
// silu(gate) * up of rows [begin, end) (F values each; gate's and up's rows at their own strides), in their dtype,
// rounded once
template <typename T>
void silu_mul_range(const T* g, const T* u, T* y, int64_t F, int64_t gs, int64_t us, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const T *gr = g + i * gs, *ur = u + i * us;
    T* yr = y + i * F;
    int64_t c = 0;
    for (; c + 16 <= F; c += 16) {
      const __m512 a = load16(gr + c);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), a));
      store16(yr + c, _mm512_mul_ps(_mm512_div_ps(a, _mm512_add_ps(e, _mm512_set1_ps(1.f))), load16(ur + c)));
    }
    for (; c < F; ++c) store(yr + c, to_float(gr[c]) / (1.f + exp_clamped(-to_float(gr[c]))) * to_float(ur[c]));
  }
}
#endif

// gate, up [..., F] (each row's values contiguous, the rows at any one stride: views of one packed product will do)
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.dim() > 0 && gate.size(-1) > 0 && gate.sizes() == up.sizes() && gate.device().is_cpu() &&
              up.device().is_cpu() &&
              gate.scalar_type() == up.scalar_type(), "silu_mul: gate and up CPU tensors of one shape and dtype");
  TORCH_CHECK(gate.scalar_type() == at::kFloat || gate.scalar_type() == at::kBFloat16, "silu_mul: fp32 or bf16");
#if !defined(__AVX512F__)
  // built for AVX2 a loop of its own took 2-3x PyTorch's two ops (docs/LOG.md, 2026-12-03)
  return at::mul(at::silu(gate), up);
#else
  const int64_t F = gate.size(-1);
  auto rows = [F](const at::Tensor& x) {  // [R, F] with unit stride along F (a view where one exists)
    at::Tensor r = x.reshape({-1, F});
    return r.stride(1) == 1 ? r : r.contiguous();
  };
  const at::Tensor g = rows(gate), u = rows(up);
  at::Tensor y = at::empty(gate.sizes(), gate.options());
  const int64_t R = g.size(0), gs = g.stride(0), us = u.stride(0), grain = std::max<int64_t>(1, 4096 / F);
  if (gate.scalar_type() == at::kFloat) {
    const float *gp = raw<float>(g), *up_ = raw<float>(u);
    float* yp = raw<float>(y);
    at::parallel_for(0, R, grain, [=](int64_t b, int64_t e) { silu_mul_range(gp, up_, yp, F, gs, us, b, e); });
  } else {
    const uint16_t *gp = raw<uint16_t>(g), *up_ = raw<uint16_t>(u);
    uint16_t* yp = raw<uint16_t>(y);
    at::parallel_for(0, R, grain, [=](int64_t b, int64_t e) { silu_mul_range(gp, up_, yp, F, gs, us, b, e); });
  }
  return y;
#endif
}

// one row's draw at target (u x the row's total): the first index whose partial sum, rounded to fp32, exceeds it
// (V - 1 where none does); the sums in fp64 one term after another from `sum` after `from` terms
inline int64_t walk(const float* p, int64_t from, int64_t V, double sum, float target) {
  for (int64_t i = from; i < V; ++i) {
    sum += p[i];
    if (static_cast<float>(sum) > target) return i;
  }
  return V - 1;
}

inline int64_t draw_row(const float* p, int64_t V, float u) {
  double total = 0;
  for (int64_t i = 0; i < V; ++i) total += p[i];
  return walk(p, 0, V, 0.0, u * static_cast<float>(total));
}

#if defined(__AVX512F__)
// 8 rows' fp64 partial sums side by side, 8 terms at a time (an 8 x 8 transpose gives each term its lane): each
// row's chain of additions in its own order, so the sums are the scalar loop's; every 8th kept in marks [V / 8, 8]
void draw_8_rows(const float* p, int64_t V, const float* u, int64_t* out, double* marks) {
  __m512d acc = _mm512_setzero_pd();
  const int64_t blocks = V / 8;
  for (int64_t b = 0; b < blocks; ++b) {
    __m256 r[8], t[8];
    for (int j = 0; j < 8; ++j) r[j] = _mm256_loadu_ps(p + j * V + 8 * b);
    for (int j = 0; j < 8; j += 2)
      t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]), t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    for (int j = 0; j < 8; j += 4) {
      r[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44), r[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
      r[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44), r[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
    }
    for (int j = 0; j < 4; ++j)  // column j and j + 4: lane i of r[j] was term j of row i
      t[j] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x20), t[j + 4] = _mm256_permute2f128_ps(r[j], r[j + 4], 0x31);
    for (int j = 0; j < 8; ++j) acc = _mm512_add_pd(acc, _mm512_cvtps_pd(t[j]));
    _mm512_storeu_pd(marks + 8 * b, acc);
  }
  for (int j = 0; j < 8; ++j) {
    const float* row = p + j * V;
    double total = blocks ? marks[8 * (blocks - 1) + j] : 0.0;
    for (int64_t i = 8 * blocks; i < V; ++i) total += row[i];
    const float target = u[j] * static_cast<float>(total);
    int64_t lo = 0, hi = blocks;  // the first block whose last partial sum exceeds the target (blocks: none does)
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (static_cast<float>(marks[8 * mid + j]) > target) hi = mid;
      else lo = mid + 1;
    }
    out[j] = walk(row, 8 * lo, V, lo ? marks[8 * (lo - 1) + j] : 0.0, target);
  }
}
#endif

// probs [N, V] fp32 (a row's exp(log-probs)), u [N] fp32 in [0, 1) -> [N] int64: each row's draw, the index
// searchsorted(probs.cumsum(-1), u[:, None] * cdf[:, -1:], right=True) gives, clamped to V - 1
at::Tensor cdf_search(const at::Tensor& probs, const at::Tensor& u) {
  TORCH_CHECK(probs.dim() == 2 && u.dim() == 1 && u.size(0) == probs.size(0) && probs.size(1) > 0,
              "cdf_search: probs [N, V], u [N]");
  TORCH_CHECK(probs.scalar_type() == at::kFloat && u.scalar_type() == at::kFloat && probs.is_contiguous() &&
              u.is_contiguous() && probs.device().is_cpu() && u.device().is_cpu(),
              "cdf_search: contiguous fp32 CPU tensors");
  const int64_t N = probs.size(0), V = probs.size(1);
  at::Tensor out = at::empty({N}, probs.options().dtype(at::kLong));
  const float *pp = probs.data_ptr<float>(), *up = u.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
#if defined(__AVX512F__)
  at::parallel_for(0, N / 8, 1, [=](int64_t begin, int64_t end) {
    std::vector<double> marks(V);
    for (int64_t g = begin; g < end; ++g) draw_8_rows(pp + 8 * g * V, V, up + 8 * g, op + 8 * g, marks.data());
  });
  for (int64_t n = N / 8 * 8; n < N; ++n) op[n] = draw_row(pp + n * V, V, up[n]);
#else
  at::parallel_for(0, N, 1, [=](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) op[n] = draw_row(pp + n * V, V, up[n]);
  });
#endif
  return out;
}

// oneDNN's product of x with a weight packed for it (speedrun.packed: torch.ops.mkldnn._linear_pointwise, no bias)
at::Tensor packed_product(const at::Tensor& x, const at::Tensor& w) {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("mkldnn::_linear_pointwise", "").typed<
      at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, std::string_view,
                 c10::List<std::optional<at::Scalar>>, std::optional<std::string_view>)>();
  return op.call(x, w, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), std::string_view(""));
}

// x [B, 1, C] (the residual stream) through a Llama's blocks at one decode step: the kernels and products
// LlamaBlock's decode runs (speedrun.llama), in its order, on the same inputs. weights, six a block: its attention
// norm's weight (fp32), its packed query/key/value and output products, its MLP norm's weight, its packed gate/up and
// down products; caches [L, B, Hkv, W, D]; valid [B, W]; cos, sin [B or 1, D / 2]; dtype: the products' (the norms
// write it). Writes each block's keys and values at column pos; returns x after the last block.
at::Tensor llama_blocks(const at::Tensor& x, at::TensorList weights, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& valid, const at::Tensor& cos, const at::Tensor& sin,
                        int64_t pos, const std::optional<at::Tensor>& source, int64_t shared, int64_t n_head,
                        double eps, double scale, at::ScalarType dtype) {
  TORCH_CHECK(x.dim() == 3 && x.size(1) == 1 && k_cache.dim() == 5 && v_cache.sizes() == k_cache.sizes() &&
              static_cast<int64_t>(weights.size()) == 6 * k_cache.size(0) && n_head % k_cache.size(2) == 0,
              "llama_blocks: x [B, 1, C], caches [L, B, Hkv, W, D], six weights a block, Hkv dividing the heads");
  const int64_t B = x.size(0), Hkv = k_cache.size(2), D = k_cache.size(4);
  auto product = [dtype](const at::Tensor& in, const at::Tensor& w) {
    TORCH_CHECK(in.scalar_type() == dtype, "llama_blocks: a product's input not in the products' dtype");
    return packed_product(in, w);
  };
  at::Tensor s = x;
  for (int64_t l = 0; l < k_cache.size(0); ++l) {
    const at::Tensor* w = weights.data() + 6 * l;
    const std::vector<at::Tensor> qkv =
        product(rms_norm(s, w[0], eps, dtype), w[1]).split_with_sizes({n_head * D, Hkv * D, Hkv * D}, -1);
    const at::Tensor kc = k_cache.select(0, l), vc = v_cache.select(0, l);
    const at::Tensor q = rotary_cache(qkv[0], qkv[1], qkv[2], cos, sin, kc, vc, pos);
    const at::Tensor y = decode_attention(q.reshape({B, Hkv, n_head / Hkv, D}), kc, vc, valid, scale, source, shared);
    auto [sum, h] = add_rms_norm(s, product(y.reshape({B, 1, n_head * D}), w[2]), w[3], eps, dtype);
    const at::Tensor gate_up = product(h, w[4]);
    const int64_t F = gate_up.size(-1) / 2;
    s = at::add(sum, product(silu_mul(gate_up.narrow(-1, 0, F), gate_up.narrow(-1, F, F)), w[5]));
  }
  return s;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(speedrun_kernels, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, ScalarType? dtype=None) -> Tensor", &rms_norm);
  m.def("add_rms_norm(Tensor x, Tensor r, Tensor weight, float eps, ScalarType? dtype=None) -> (Tensor, Tensor)",
        &add_rms_norm);
  m.def("rotary_cache(Tensor q, Tensor k, Tensor v, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "int pos) -> Tensor", &rotary_cache);
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor", &silu_mul);
  m.def("cdf_search(Tensor probs, Tensor u) -> Tensor", &cdf_search);
  m.def("llama_blocks(Tensor x, Tensor[] weights, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor valid, Tensor cos, "
        "Tensor sin, int pos, Tensor? source, int shared, int n_head, float eps, float scale, ScalarType dtype) -> "
        "Tensor", &llama_blocks);
}
