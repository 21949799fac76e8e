// The CUDA statistics kernel (workbench/trace/stats/cuda.py loads this file as text and hands
// it to mx.fast.cuda_kernel): one launch reduces k op outputs of one float dtype T, block row
// j (blockIdx.y) output j, each read once where it lies (through its strides when it is not
// row-contiguous, 16 bytes a load when it is).  Each thread folds its elements into max / min
// over the finite non-fill elements, their sum and sum of squares, and the counts of zeros,
// mask fill, NaN, +Inf and -Inf; the blocks fold into output j's 12-word slot with atomics:
// float64 sum and sum of squares (words 0-3), the max and the negated min as order-preserving
// uint32 keys (4, 5; 0: no value), zeros, fill, NaN, +Inf, -Inf (6-10), padding (11).
//
// Template: T (the outputs' dtype) and FK (which lowest finite value is mask fill: 0 float32,
// 1 float16, 2 bfloat16).  cuda.py defines, ahead of this text, from the host's dtype facts
// (workbench/dtypes.py): WB_FILL_F32, WB_FILL_F16, WB_FILL_BF16 (each dtype's lowest finite
// value), WB_TH_F16 and WB_TH_WIDE (the fast path's thresholds, below).
//
// The file holds two parts, the header (helpers) and the body (the kernel's statements, with
// @CASES@: the switch picking input j, written for k inputs), split at the line
// "// ---- body ----".

#define WB_INF __int_as_float(0x7f800000)
#define WB_FMAX 3.402823466e+38f

struct WbAcc {
  float hi, lo;
  double s, ss;
  unsigned int zeros, fill, nans, pinf, ninf;
};

__device__ __forceinline__ void wb_add(WbAcc& a, const float v, const float fv) {
  a.zeros += (v == 0.0f);
  if (fabsf(v) <= WB_FMAX && v != fv) {
    a.hi = fmaxf(a.hi, v); a.lo = fminf(a.lo, v);
    const double d = (double)v;
    a.s += d; a.ss += d * d;
  } else if (v != v) { a.nans++; }
  else if (v == WB_INF) { a.pinf++; }
  else if (v == -WB_INF) { a.ninf++; }
  else { a.fill++; }
}

// th: below it every value is finite, not fill, and safe to sum in float32 over 8 elements
// (WB_TH_WIDE where the fill is float32's or bfloat16's lowest value, past it; WB_TH_F16,
// float16's largest finite value, for float16, whose fill is its negation: its largest
// finite values take the element path, counted there)
template <typename T, int V>
__device__ __forceinline__ void wb_vec(WbAcc& a, const uint4 w, const float fv, const float th) {
  const T* e = reinterpret_cast<const T*>(&w);
  float f[V];
  float s = 0.0f, ss = 0.0f;
  bool odd = false;
#pragma unroll
  for (int q = 0; q < V; ++q) {
    f[q] = static_cast<float>(e[q]);
    odd |= !(fabsf(f[q]) < th);
  }
  if (odd) {
#pragma unroll
    for (int q = 0; q < V; ++q) { wb_add(a, f[q], fv); }
    return;
  }
#pragma unroll
  for (int q = 0; q < V; ++q) {
    a.zeros += (f[q] == 0.0f);
    a.hi = fmaxf(a.hi, f[q]); a.lo = fminf(a.lo, f[q]);
    s += f[q]; ss += f[q] * f[q];
  }
  a.s += (double)s; a.ss += (double)ss;
}

__device__ __forceinline__ unsigned int wb_key(const float v) {
  const unsigned int b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// ---- body ----
  const int j = blockIdx.y;
  const T* x = in0;
  const int32_t* shp = in0_shape.data();
  const int64_t* str = in0_strides.data();
  int nd = in0_ndim;
  switch (j) {
@CASES@
  }
  const float fv = FK == 0 ? WB_FILL_F32 : (FK == 1 ? WB_FILL_F16 : WB_FILL_BF16);
  const float th = FK == 1 ? WB_TH_F16 : WB_TH_WIDE;
  WbAcc a;
  a.hi = -WB_INF; a.lo = WB_INF; a.s = 0.0; a.ss = 0.0;
  a.zeros = 0; a.fill = 0; a.nans = 0; a.pinf = 0; a.ninf = 0;
  bool rc = true;
  long long n = 1, expect = 1;
  for (int d = nd - 1; d >= 0; --d) {
    if (shp[d] != 1 && str[d] != expect) { rc = false; }
    expect *= shp[d];
    n *= shp[d];
  }
  const long long tid = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const long long step = (long long)gridDim.x * blockDim.x;
  if (!rc) {
    for (long long i = tid; i < n; i += step) {
      long long loc = 0, r = i;
      for (int d = nd - 1; d >= 0; --d) { loc += (r % shp[d]) * str[d]; r /= shp[d]; }
      wb_add(a, static_cast<float>(x[loc]), fv);
    }
  } else {
    long long head = 0;
    if ((reinterpret_cast<unsigned long long>(x) & 15ull) == 0) {
      constexpr int V = 16 / sizeof(T);
      const uint4* xv = reinterpret_cast<const uint4*>(x);
      const long long nv = n / V;
      long long t = tid;
      for (; t + 3 * step < nv; t += 4 * step) {  // four 16-byte loads in flight
        const uint4 w0 = __ldg(xv + t);
        const uint4 w1 = __ldg(xv + t + step);
        const uint4 w2 = __ldg(xv + t + 2 * step);
        const uint4 w3 = __ldg(xv + t + 3 * step);
        wb_vec<T, V>(a, w0, fv, th); wb_vec<T, V>(a, w1, fv, th);
        wb_vec<T, V>(a, w2, fv, th); wb_vec<T, V>(a, w3, fv, th);
      }
      for (; t < nv; t += step) { wb_vec<T, V>(a, __ldg(xv + t), fv, th); }
      head = nv * V;
    }
    for (long long i = head + tid; i < n; i += step) { wb_add(a, static_cast<float>(x[i]), fv); }
  }
  for (int off = 16; off > 0; off >>= 1) {
    a.hi = fmaxf(a.hi, __shfl_down_sync(0xffffffffu, a.hi, off));
    a.lo = fminf(a.lo, __shfl_down_sync(0xffffffffu, a.lo, off));
    a.s += __shfl_down_sync(0xffffffffu, a.s, off);
    a.ss += __shfl_down_sync(0xffffffffu, a.ss, off);
    a.zeros += __shfl_down_sync(0xffffffffu, a.zeros, off);
    a.fill += __shfl_down_sync(0xffffffffu, a.fill, off);
    a.nans += __shfl_down_sync(0xffffffffu, a.nans, off);
    a.pinf += __shfl_down_sync(0xffffffffu, a.pinf, off);
    a.ninf += __shfl_down_sync(0xffffffffu, a.ninf, off);
  }
  __shared__ WbAcc sh[32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) { sh[w] = a; }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int nw = (blockDim.x + 31) >> 5;
    for (int k = 1; k < nw; ++k) {
      const WbAcc& b = sh[k];
      a.hi = fmaxf(a.hi, b.hi); a.lo = fminf(a.lo, b.lo); a.s += b.s; a.ss += b.ss;
      a.zeros += b.zeros; a.fill += b.fill; a.nans += b.nans; a.pinf += b.pinf; a.ninf += b.ninf;
    }
    unsigned int* o = out + (long long)j * 12;
    atomicAdd(reinterpret_cast<double*>(o), a.s);
    atomicAdd(reinterpret_cast<double*>(o) + 1, a.ss);
    if (a.hi >= a.lo) {
      atomicMax(o + 4, wb_key(a.hi));
      atomicMax(o + 5, wb_key(-a.lo));
    }
    if (a.zeros) { atomicAdd(o + 6, a.zeros); }
    if (a.fill) { atomicAdd(o + 7, a.fill); }
    if (a.nans) { atomicAdd(o + 8, a.nans); }
    if (a.pinf) { atomicAdd(o + 9, a.pinf); }
    if (a.ninf) { atomicAdd(o + 10, a.ninf); }
  }
