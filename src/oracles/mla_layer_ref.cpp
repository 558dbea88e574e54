// The mha form from the definitions: q = q_b(rmsnorm(q_a x)) (or q_proj x); kv_a x = [c ; k_pe],
// c RMSNorm'd; per head k_h = [W_kb_h c ; rope(k_pe)], v_h = W_vb_h c; attention over A(t) with the
// sink; y = o_proj o. The backward walks the same steps in reverse with the textbook formulas.
#include "mla_layer_ref.h"

#include <cmath>

#include "attn_dense_ref.h"

namespace hmla::ref {

namespace {

template <class T>
using Vec = std::vector<T>;

// y [n, out] = x [n, in] W^T, W [out, in].
template <class T>
Vec<T> linear(const Vec<T>& x, const Vec<T>& W, int64_t n, int64_t in, int64_t out) {
  Vec<T> y(n * out, T(0));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      T acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * W[o * in + i];
      y[r * out + o] = acc;
    }
  return y;
}

// dW = dy^T x; returns dx = dy W.
template <class T>
Vec<T> linear_bwd(const Vec<T>& dy, const Vec<T>& x, const Vec<T>& W, int64_t n, int64_t in, int64_t out, Vec<T>& dW) {
  dW.assign(out * in, T(0));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) {
      T acc = 0;
      for (int64_t r = 0; r < n; ++r) acc += dy[r * out + o] * x[r * in + i];
      dW[o * in + i] = acc;
    }
  Vec<T> dx(n * in, T(0));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < in; ++i) {
      T acc = 0;
      for (int64_t o = 0; o < out; ++o) acc += dy[r * out + o] * W[o * in + i];
      dx[r * in + i] = acc;
    }
  return dx;
}

// Columns [c0, c0 + D) of rows of width ld.
template <class T>
Vec<T> cols(const Vec<T>& x, int64_t n, int64_t ld, int64_t c0, int64_t D) {
  Vec<T> y(n * D);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < D; ++c) y[r * D + c] = x[r * ld + c0 + c];
  return y;
}

template <class T>
T rstd_of(const T* x, int64_t D, T eps) {
  T ss = 0;
  for (int64_t c = 0; c < D; ++c) ss += x[c] * x[c];
  return T(1) / std::sqrt(ss / T(D) + eps);
}

template <class T>
Vec<T> rmsnorm(const Vec<T>& x, const Vec<T>& w, int64_t n, int64_t D, T eps) {
  Vec<T> y(n * D);
  for (int64_t r = 0; r < n; ++r) {
    const T rs = rstd_of(&x[r * D], D, eps);
    for (int64_t c = 0; c < D; ++c) y[r * D + c] = x[r * D + c] * rs * w[c];
  }
  return y;
}

// y = xhat w, xhat = x rstd: dw = sum_rows dy xhat; dx = rstd (dy w - xhat mean(dy w xhat)).
template <class T>
Vec<T> rmsnorm_bwd(const Vec<T>& dy, const Vec<T>& x, const Vec<T>& w, int64_t n, int64_t D, T eps, Vec<T>& dw) {
  dw.assign(D, T(0));
  Vec<T> dx(n * D);
  for (int64_t r = 0; r < n; ++r) {
    const T rs = rstd_of(&x[r * D], D, eps);
    T dot = 0;
    for (int64_t c = 0; c < D; ++c) {
      dw[c] += dy[r * D + c] * x[r * D + c] * rs;
      dot += dy[r * D + c] * w[c] * x[r * D + c] * rs;
    }
    dot /= T(D);
    for (int64_t c = 0; c < D; ++c) dx[r * D + c] = rs * (dy[r * D + c] * w[c] - x[r * D + c] * rs * dot);
  }
  return dx;
}

// Rotates channels [c0, c0 + Dr) of each of `heads` groups of width hw in rows of width ld, row r
// at position r % s; sign -1 rotates back (the transpose: RoPE's backward).
template <class T>
void rope(Vec<T>& x, int64_t n, int64_t s, int64_t ld, int64_t heads, int64_t hw, int64_t c0, int64_t Dr,
          const Vec<T>& cos, const Vec<T>& sin, T sign) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < Dr / 2; ++i) {
        T* p = &x[r * ld + h * hw + c0 + 2 * i];
        const T c = cos[(r % s) * (Dr / 2) + i], sn = sign * sin[(r % s) * (Dr / 2) + i];
        const T a = p[0], b = p[1];
        p[0] = a * c - b * sn;
        p[1] = b * c + a * sn;
      }
}

}  // namespace

template <class T>
MlaRefResult<T> mla_layer_ref(const MlaDims& d, const MlaRefWeights<T>& w, const Vec<T>& x, const Vec<T>& cos,
                              const Vec<T>& sin, const std::vector<int32_t>& doc_start, T scale, T eps,
                              const Vec<T>& dy) {
  const int64_t N = d.b * d.s, Dqk = d.Dn + d.Dr, Wa = d.Rkv + d.Dr, Wkv = d.Dn + d.Dv;
  // q [N, H, Dqk], its last Dr channels per head rotated.
  Vec<T> qa, cq, q;
  if (d.Rq > 0) {
    qa = linear(x, w.q_a_proj, N, d.hid, d.Rq);
    cq = rmsnorm(qa, w.q_a_layernorm, N, d.Rq, eps);
    q = linear(cq, w.q_b_proj, N, d.Rq, d.H * Dqk);
  } else {
    q = linear(x, w.q_proj, N, d.hid, d.H * Dqk);
  }
  rope(q, N, d.s, d.H * Dqk, d.H, Dqk, d.Dn, d.Dr, cos, sin, T(1));
  // The shared latent c [N, Rkv] and rope key k_pe [N, Dr]; per-head keys and values.
  const Vec<T> kva = linear(x, w.kv_a_proj_with_mqa, N, d.hid, Wa), kva_c = cols(kva, N, Wa, 0, d.Rkv);
  const Vec<T> c = rmsnorm(kva_c, w.kv_a_layernorm, N, d.Rkv, eps);
  Vec<T> kpe = cols(kva, N, Wa, d.Rkv, d.Dr);
  rope(kpe, N, d.s, d.Dr, 1, d.Dr, 0, d.Dr, cos, sin, T(1));
  const Vec<T> kv = linear(c, w.kv_b_proj, N, d.Rkv, d.H * Wkv);
  Vec<T> k(N * d.H * Dqk), v(N * d.H * d.Dv);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t h = 0; h < d.H; ++h) {
      for (int64_t i = 0; i < d.Dn; ++i) k[(r * d.H + h) * Dqk + i] = kv[r * d.H * Wkv + h * Wkv + i];
      for (int64_t i = 0; i < d.Dr; ++i) k[(r * d.H + h) * Dqk + d.Dn + i] = kpe[r * d.Dr + i];
      for (int64_t i = 0; i < d.Dv; ++i) v[(r * d.H + h) * d.Dv + i] = kv[r * d.H * Wkv + h * Wkv + d.Dn + i];
    }
  const AttnDims ad{d.b, d.s, d.H, d.H, Dqk, d.Dv};
  const Vec<T> o = attn_dense_ref<T>(ad, q, k, v, doc_start, w.softmax_offset, scale, {}).out;
  MlaRefResult<T> r;
  r.y = linear(o, w.o_proj, N, d.H * d.Dv, d.hid);
  if (dy.empty()) return r;

  const Vec<T> dO = linear_bwd(dy, o, w.o_proj, N, d.H * d.Dv, d.hid, r.dw.o_proj);
  AttnRefResult<T> ga = attn_dense_ref<T>(ad, q, k, v, doc_start, w.softmax_offset, scale, dO);
  r.dw.softmax_offset = ga.dsink;
  Vec<T> dkv(N * d.H * Wkv), dkpe(N * d.Dr, T(0));
  for (int64_t row = 0; row < N; ++row)
    for (int64_t h = 0; h < d.H; ++h) {
      for (int64_t i = 0; i < d.Dn; ++i) dkv[row * d.H * Wkv + h * Wkv + i] = ga.dk[(row * d.H + h) * Dqk + i];
      for (int64_t i = 0; i < d.Dv; ++i) dkv[row * d.H * Wkv + h * Wkv + d.Dn + i] = ga.dv[(row * d.H + h) * d.Dv + i];
      for (int64_t i = 0; i < d.Dr; ++i) dkpe[row * d.Dr + i] += ga.dk[(row * d.H + h) * Dqk + d.Dn + i];
    }
  const Vec<T> dc = linear_bwd(dkv, c, w.kv_b_proj, N, d.Rkv, d.H * Wkv, r.dw.kv_b_proj);
  rope(dkpe, N, d.s, d.Dr, 1, d.Dr, 0, d.Dr, cos, sin, T(-1));
  const Vec<T> dkva_c = rmsnorm_bwd(dc, kva_c, w.kv_a_layernorm, N, d.Rkv, eps, r.dw.kv_a_layernorm);
  Vec<T> dkva(N * Wa);
  for (int64_t row = 0; row < N; ++row) {
    for (int64_t i = 0; i < d.Rkv; ++i) dkva[row * Wa + i] = dkva_c[row * d.Rkv + i];
    for (int64_t i = 0; i < d.Dr; ++i) dkva[row * Wa + d.Rkv + i] = dkpe[row * d.Dr + i];
  }
  r.dx = linear_bwd(dkva, x, w.kv_a_proj_with_mqa, N, d.hid, Wa, r.dw.kv_a_proj_with_mqa);
  Vec<T> dq = ga.dq;
  rope(dq, N, d.s, d.H * Dqk, d.H, Dqk, d.Dn, d.Dr, cos, sin, T(-1));
  Vec<T> dxq;
  if (d.Rq > 0) {
    const Vec<T> dcq = linear_bwd(dq, cq, w.q_b_proj, N, d.Rq, d.H * Dqk, r.dw.q_b_proj);
    const Vec<T> dqa = rmsnorm_bwd(dcq, qa, w.q_a_layernorm, N, d.Rq, eps, r.dw.q_a_layernorm);
    dxq = linear_bwd(dqa, x, w.q_a_proj, N, d.hid, d.Rq, r.dw.q_a_proj);
  } else {
    dxq = linear_bwd(dq, x, w.q_proj, N, d.hid, d.H * Dqk, r.dw.q_proj);
  }
  for (size_t i = 0; i < r.dx.size(); ++i) r.dx[i] += dxq[i];
  return r;
}

#define HMLA_MLA_REF(T)                                                                                         \
  template MlaRefResult<T> mla_layer_ref<T>(const MlaDims&, const MlaRefWeights<T>&, const std::vector<T>&,     \
                                            const std::vector<T>&, const std::vector<T>&,                       \
                                            const std::vector<int32_t>&, T, T, const std::vector<T>&);
HMLA_MLA_REF(double)
HMLA_MLA_REF(float)

}  // namespace hmla::ref
