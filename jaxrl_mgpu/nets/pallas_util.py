"""Small pieces the Pallas (Triton) kernels of fused_attention.py, fused_mlp.py and fused_heads.py share."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu


def dot(a, b, trans_a=False, trans_b=False):
    """a @ b (either operand transposed) with fp32 accumulation, as Triton's tl.dot does it.
    (`pl.dot` is gone from jax 0.12; a dot_general lowers to the same tl.dot.)"""
    dims = (((0 if trans_a else 1,), (1 if trans_b else 0,)), ((), ()))
    return jax.lax.dot_general(a, b, dims, preferred_element_type=jnp.float32)


def ptx_approx(instruction: str, x):
    """One PTX approximation instruction per element of fp32 x, e.g. "tanh.approx.f32" or
    "ex2.approx.f32": a single special-function-unit op, where the Triton lowering of jnp.tanh /
    jnp.exp2 calls libdevice's accurate (several-instruction) versions. A packed half-precision
    instruction ("ex2.approx.f16x2") takes two elements, rounded to fp16, per op; the result
    comes back in fp32. GPU only."""
    packed = instruction.endswith(".f16x2")
    dtype = jnp.float16 if packed else jnp.float32
    [y] = plgpu.elementwise_inline_asm(
        f"{instruction} $0, $1;", args=[x.astype(dtype)], constraints="=r,r", pack=2 if packed else 1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(x.shape, dtype)])
    return y.astype(jnp.float32)


def index(i: int):
    """An integer index into a ref, as a traced scalar: the interpreter (CPU tests) rejects a
    Python int there."""
    return jnp.int32(i)


def interpret() -> bool:
    """Whether to run the kernels through the Pallas interpreter: everywhere but on GPUs, where
    they compile to Triton (the interpreter is how the CPU tests run them)."""
    return jax.default_backend() != "gpu"


def row_mask(first_row, block_rows, n_rows):
    """[block_rows, 1] bool: which rows of the block starting at `first_row` exist (the last
    block of an [N, ...] array is partly out of range)."""
    return (first_row + jnp.arange(block_rows) < n_rows)[:, None]


def whole(shape):
    """A BlockSpec that hands every program (of any grid) the whole array."""
    return pl.BlockSpec(shape, lambda *_: (0,) * len(shape))


def row_block(block_rows, *shape):
    """A BlockSpec over a 1-D grid of row blocks: program i gets rows i * block_rows onwards of
    an [N, *shape] array."""
    return pl.BlockSpec((block_rows,) + shape, lambda i: (i,) + (0,) * len(shape))


def partial_sum(*shape):
    """A BlockSpec over a 1-D grid: program i writes entry i of a [programs, *shape] array of
    per-program partial sums (the wrapper adds them up: deterministic, no atomics)."""
    return pl.BlockSpec((None,) + shape, lambda i: (i,) + (0,) * len(shape))


LN_EPSILON = 1e-6  # flax nn.LayerNorm's default


def standardize(x):
    """LayerNorm without scale and bias, as flax computes it: x [R, D] fp32 -> (xhat, rstd [R, 1]).

    flax takes the variance as E[x^2] - E[x]^2 clipped at 0 (its `use_fast_variance`); a
    zero row (masked) gives xhat = 0 and a finite rstd."""
    inv_d = 1.0 / x.shape[1]
    mean = jnp.sum(x, axis=1)[:, None] * inv_d
    mean_sq = jnp.sum(x * x, axis=1)[:, None] * inv_d
    rstd = jax.lax.rsqrt(jnp.maximum(mean_sq - mean * mean, 0.0) + LN_EPSILON)
    return (x - mean) * rstd, rstd


def layer_norm(x, scale_ref, bias_ref, dtype):
    """flax's LayerNorm of a row block inside a kernel: x [R, D] fp32 and the [D] scale / bias refs
    -> LN(x) in `dtype` (the compute dtype, as it feeds a matmul)."""
    xhat, _ = standardize(x)
    return (xhat * scale_ref[...][None, :] + bias_ref[...][None, :]).astype(dtype)


def layer_norm_reference(x, scale, bias):
    """flax's nn.LayerNorm(dtype=x.dtype) in plain jnp (fp32 statistics, the fast variance), the
    result in x's dtype: the kernels' references build on it (tests, benchmarks)."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.maximum((x32 * x32).mean(-1, keepdims=True) - mean * mean, 0.0)
    return ((x - mean) * (jax.lax.rsqrt(var + LN_EPSILON) * scale) + bias).astype(x.dtype)


def layer_norm_backward(dxn, xhat, rstd, scale):
    """Gradient wrt x [R, D] of xn = xhat * scale + bias, given dxn (fp32): with g = dxn * scale,
    dx = rstd * (g - mean(g) - xhat * mean(g * xhat))."""
    g = dxn * scale
    inv_d = 1.0 / g.shape[1]
    g_mean = jnp.sum(g, axis=1)[:, None] * inv_d
    gx_mean = jnp.sum(g * xhat, axis=1)[:, None] * inv_d
    return rstd * (g - g_mean - xhat * gx_mean)
