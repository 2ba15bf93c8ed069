/* Shared by every kernel file. Activations are stored as store_t: float, or half when the
 * backend was built with HALF_STORAGE (fp16 storage, fp32 arithmetic: vload_half and
 * vstore_half need no cl_khr_fp16). Offsets are in elements. */
#ifdef HALF_STORAGE
typedef half store_t;
#define LD(p, i) vload_half((i), (p))
#define LD16(p, i) vload_half16(0, (p) + (i))
#define ST(p, i, v) vstore_half((v), (i), (p))
#else
typedef float store_t;
#define LD(p, i) ((p)[i])
#define LD16(p, i) vload16(0, (p) + (i))
#define ST(p, i, v) ((p)[i] = (v))
#endif

/* activationType of MNN's BinaryOp / relu flags of a Convolution */
static inline float activate(float v, int act) {
    return act == 1 ? fmax(v, 0.0f) : act == 2 ? clamp(v, 0.0f, 6.0f) : v;
}

static inline float silu(float x) { return x / (1.0f + exp(-x)); }

static inline float sum16(float16 v) {
    float8 a = v.lo + v.hi;
    float4 b = a.lo + a.hi;
    return b.x + b.y + b.z + b.w;
}
