"""The second half of a pre-norm transformer block in Pallas: the attention output's projection
and residual, then y = r + W2 gelu(W1 LN(r) + b1) + b2 with r = x + attn Wo + bo.

In-context RL trains short, narrow transformers on very many tokens (d_model D = 128, hidden
H = 4D = 512, N = 4096 x 80 = 327,680 tokens a minibatch, bf16). XLA runs this half-block as
Dense(D -> D), residual add, LayerNorm, Dense(D -> H), GELU, Dense(H -> D), residual add, and
materialises the [N, H] intermediates (335 MB each in bf16) in HBM: the pre-activation and the
activation in the forward pass, and again the activation, its gradient and the pre-activation
gradient in the backward pass; and the projection's output and the residual sum ([N, D]) each
take a trip through HBM between kernels. With K = D = 128 the matmuls are cheap and those round
trips dominate the step. Here the forward pass keeps the H-wide intermediates on chip: HBM sees
only x, attn, r, LN(r) and y ([N, D]) and the weights. The backward pass recomputes them once
and writes one H-wide array, dh (the pre-activation gradient), which the rows kernel turns into
dx without recomputing anything; HBM sees dy, dr and d attn ([N, D]) besides, and small fp32
partial sums.

What they give inside the transformer's training step, against XLA running the flax modules:
experiments/RESULTS.md.

    finish_block(x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2, *, block_rows=64,
                 block_hidden=64, num_warps=4, num_stages=2, weights_block_rows=128,
                 weights_num_warps=8, row_groups=16, rows_block_hidden=128,
                 interpret=False) -> y

x and attn [..., D] in the compute dtype (bf16 / fp16 on GPU, fp32 for tests); every parameter
float32 (wo [D, D], bo [D], ln_scale, ln_bias [D], w1 [D, H], b1 [H], w2 [H, D], b2 [D]); y like
x. The result is that of flax's `x + nn.Dense(D, dtype=cd)(attn)` followed by
`nn.LayerNorm(dtype=cd, param_dtype=f32)` (epsilon 1e-6, fp32 statistics) ->
`nn.Dense(H, dtype=cd)` -> `nn.gelu` (tanh form) -> `nn.Dense(D, dtype=cd)` -> `r + ...`, except
that inside a kernel everything is fp32 and rounded to the compute dtype only where flax feeds a
matmul (r, the LN output, the GELU output) and at the end, so low-precision results agree with
flax to that dtype's rounding. Gradients (custom VJP): dx and d attn like x, float32 for every
parameter.

Three kernels, each a Pallas `pallas_call` lowered to Triton on NVIDIA GPUs (`interpret=True`
runs the same bodies through XLA, which is how the CPU tests run them):

1. forward, one program per block of `block_rows` rows: r = x + attn @ wo + bo, LN(r) in fp32,
   then for each of the H / block_hidden hidden chunks h = xn @ w1[:, c] + b1[c],
   a = gelu(h), acc += a @ w2[c, :]; writes y = r + acc + b2 and, when differentiated, r and
   xn = LN(r) in the compute dtype (kernel 2 would otherwise redo the LayerNorm once per hidden
   chunk; the forward pass stores nothing H-wide: the backward pass recomputes h, which is
   cheaper).
2. backward over weights, grid (row groups, hidden chunks): a program owns one hidden chunk c
   and loops over the blocks of `weights_block_rows` rows of its group, reading xn and
   recomputing h, a, da = dy @ w2[c, :]^T and dh = da * gelu'(h); it accumulates in fp32
   registers dw1[:, c] += xn^T @ dh, dw2[c, :] += a^T @ dy and db1[c] += sum(dh) (partials
   [groups, ...], summed by the wrapper: deterministic, no atomics), and writes dh [N, H] in
   the compute dtype (335 MB at the sizes above, freed once kernel 3 has read it).
3. backward over rows, one program per row block: dxn = dh @ w1^T (hidden chunks of
   `rows_block_hidden`, pipelined), then the LayerNorm backward gives dr = dy + LN'(dxn), which
   is also dx; per-program partial sums of d ln_scale, d ln_bias, db2 and dbo = sum(dr), one
   [programs, 4, D] fp32 array.
   It reads dh from kernel 2 rather than recomputing h and da (three matmuls and the GELU per
   chunk instead of one matmul): one H-wide read costs less than that recomputation.
   The projection's matmul gradients d attn = dr @ wo^T and dwo = attn^T @ dr are left to XLA.

Triton needs every loaded or computed array to have a power-of-2 number of elements and dot
operands of at least 16 x 16, hence the checks on D, H and the block sizes. N is arbitrary: the
last row block is partly out of range and handled with masked loads (masked rows read as zero)
and masked stores; zero rows of dy contribute nothing to any gradient sum.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxrl_mgpu.nets.pallas_util import (dot, layer_norm, layer_norm_backward, layer_norm_reference, partial_sum,
                                         ptx_approx, row_block, row_mask, standardize, whole)

GELU_C = math.sqrt(2.0 / math.pi)  # gelu(h) = h * (1 + tanh(GELU_C * (h + GELU_A * h^3))) / 2
GELU_A = 0.044715


class _Config(NamedTuple):
    """Static kernel settings (hashable: the custom VJP takes it as a non-differentiable arg)."""
    block_rows: int          # rows per program, forward and backward-over-rows kernels
    block_hidden: int        # hidden chunk, all kernels
    num_warps: int           # forward and backward-over-rows kernels
    num_stages: int          # all kernels
    weights_block_rows: int  # rows per loop step of the weight-gradient kernel
    weights_num_warps: int
    row_groups: int
    rows_block_hidden: int   # hidden chunk of the backward-over-rows kernel
    fast_gelu: bool          # tanh.approx.f32 (GPU, bf16 only); see _gelu_cdf
    interpret: bool


# ------------------------------------------------------------------------------------------
# Pieces shared by the kernel bodies. They work on values already loaded into registers.

def _gelu_cdf(h, fast):
    """The tanh-form GELU gate (1 + tanh(u)) / 2.

    At these widths the GELU and its slope cost CUDA-core time comparable to the matmuls, so
    with `fast` (bf16 on GPU, where the gate's 2^-11 error is far below the rounding of the bf16
    activation it feeds) tanh is one hardware approximation. Otherwise it is written as the
    identical sigmoid(2u), exact to fp32 rounding: one exp and one division, and accurate where
    the gate is tiny (no 1 + tanh cancellation); exp overflows to inf for very negative h,
    giving a gate of exactly 0."""
    u = GELU_C * (h + GELU_A * h * h * h)
    if fast:
        return 0.5 + 0.5 * ptx_approx("tanh.approx.f32", u)  # relative error ~2^-11
    return 1.0 / (1.0 + jnp.exp(-2.0 * u))


def _gelu_slope(h, cdf):
    """d gelu / dh = cdf + h * d cdf / dh, where d cdf / dh = 2 cdf (1 - cdf) du/dh
    (1 - tanh(u)^2 = 4 cdf (1 - cdf)): no second transcendental."""
    du_dh = GELU_C * (1.0 + 3.0 * GELU_A * h * h)
    return cdf + 2.0 * h * cdf * (1.0 - cdf) * du_dh


def _load_rows(ref, rows, dtype=jnp.float32):
    """A row block of a [R, D] ref; rows past the end read as 0."""
    return plgpu.load(ref, mask=rows, other=0).astype(dtype)


def _chunk(c, block_hidden):
    """Hidden chunk number c (traced) as a slice. The chunk loops are lax.fori_loops rather than
    unrolled Python loops so that Triton software-pipelines them (num_stages): the next chunk's
    weights stream in from L2 while this chunk's matmuls run."""
    return pl.ds(pl.multiple_of(c * block_hidden, block_hidden), block_hidden)


# ------------------------------------------------------------------------------------------
# Kernel 1: forward.

def _forward_kernel(x_ref, attn_ref, wo_ref, bo_ref, scale_ref, bias_ref, w1_ref, b1_ref, w2_ref, b2_ref,
                    y_ref, *saved_refs, n_rows, block_hidden, fast_gelu):
    block_rows, d_model = x_ref.shape
    cd = w1_ref.dtype  # the compute dtype: the wrapper cast the weights to it
    rows = row_mask(pl.program_id(0) * block_rows, block_rows, n_rows)
    # The residual stream after attention, rounded where flax's Dense and add would round it.
    # Kept in the compute dtype across the loop (half the registers of fp32).
    r = (_load_rows(x_ref, rows) + dot(_load_rows(attn_ref, rows, cd), wo_ref[...])
         + bo_ref[...].astype(jnp.float32)[None, :]).astype(cd)
    xn = layer_norm(r.astype(jnp.float32), scale_ref, bias_ref, cd)
    if saved_refs:  # r for kernel 2; xn for kernel 3, which would otherwise redo it per chunk
        r_ref, xn_ref = saved_refs
        plgpu.store(r_ref, r, mask=rows)
        plgpu.store(xn_ref, xn, mask=rows)

    def add_chunk(c, acc):
        chunk = _chunk(c, block_hidden)
        h = dot(xn, w1_ref[:, chunk]) + b1_ref[chunk].astype(jnp.float32)[None, :]
        a = (h * _gelu_cdf(h, fast_gelu)).astype(cd)
        return acc + dot(a, w2_ref[chunk, :])

    acc = jax.lax.fori_loop(0, w1_ref.shape[1] // block_hidden, add_chunk,
                            jnp.zeros((block_rows, d_model), jnp.float32))
    y = r.astype(jnp.float32) + acc + b2_ref[...].astype(jnp.float32)[None, :]
    plgpu.store(y_ref, y.astype(y_ref.dtype), mask=rows)


# ------------------------------------------------------------------------------------------
# Kernel 2: backward over weights (dw1, db1, dw2 for one hidden chunk and one row group; dh).

def _backward_weights_kernel(xn_ref, w1_ref, b1_ref, w2_ref, dy_ref, dw1_ref, db1_ref, dw2_ref, dh_ref, *,
                             n_rows, block_rows, blocks_per_group, fast_gelu):
    # xn_ref (LN(r), which the forward kernel saved), dy_ref, dh_ref: the whole [N, D] / [N, H]
    # arrays; w1_ref [D, BH], b1_ref [BH], w2_ref [BH, D]: this program's hidden chunk.
    d_model, block_hidden = w1_ref.shape
    cd = w1_ref.dtype
    w1_chunk = w1_ref[...]
    b1_chunk = b1_ref[...].astype(jnp.float32)[None, :]
    w2_chunk = w2_ref[...]
    first_block = pl.program_id(0) * blocks_per_group
    chunk = _chunk(pl.program_id(1), block_hidden)  # outside the loop: the interpreter wants it so

    def accumulate(i, carry):
        dw1, db1, dw2 = carry
        first_row = (first_block + i) * block_rows
        rows = row_mask(first_row, block_rows, n_rows)
        block = pl.ds(first_row, block_rows)
        xn = _load_rows(xn_ref.at[block, :], rows, cd)
        h = dot(xn, w1_chunk) + b1_chunk
        cdf = _gelu_cdf(h, fast_gelu)
        a = (h * cdf).astype(cd)
        dy = _load_rows(dy_ref.at[block, :], rows, cd)  # zero on masked rows: no contribution
        dh = dot(dy, w2_chunk, trans_b=True) * _gelu_slope(h, cdf)
        dh_cd = dh.astype(cd)
        plgpu.store(dh_ref.at[block, chunk], dh_cd, mask=rows)
        dw1 += dot(xn, dh_cd, trans_a=True)
        dw2 += dot(a, dy, trans_a=True)
        return dw1, db1 + jnp.sum(dh, axis=0), dw2

    zeros = (jnp.zeros((d_model, block_hidden), jnp.float32),
             jnp.zeros((block_hidden,), jnp.float32),
             jnp.zeros((block_hidden, d_model), jnp.float32))
    dw1, db1, dw2 = jax.lax.fori_loop(0, blocks_per_group, accumulate, zeros)
    dw1_ref[...] = dw1
    db1_ref[...] = db1
    dw2_ref[...] = dw2


# ------------------------------------------------------------------------------------------
# Kernel 3: backward over rows (dx and the LayerNorm, b2 and bo gradients, from dh).

def _backward_rows_kernel(r_ref, scale_ref, w1_ref, dh_ref, dy_ref, dr_ref, sums_ref, *, n_rows, block_hidden):
    block_rows, d_model = r_ref.shape
    rows = row_mask(pl.program_id(0) * block_rows, block_rows, n_rows)

    def add_chunk(c, dxn):
        chunk = _chunk(c, block_hidden)
        dh = plgpu.load(dh_ref.at[:, chunk], mask=rows, other=0)  # rows past N were never written
        return dxn + dot(dh, w1_ref[:, chunk], trans_b=True)

    dxn = jax.lax.fori_loop(0, w1_ref.shape[1] // block_hidden, add_chunk,
                            jnp.zeros((block_rows, d_model), jnp.float32))
    # The LayerNorm's statistics from r (read anyway for them; xn alone would not give rstd).
    xhat, rstd = standardize(_load_rows(r_ref, rows))
    dy = _load_rows(dy_ref, rows)  # zero on masked rows, so they add nothing below
    dr = dy + layer_norm_backward(dxn, xhat, rstd, scale_ref[...][None, :])
    plgpu.store(dr_ref, dr.astype(dr_ref.dtype), mask=rows)
    # Partial sums [d ln_scale, d ln_bias, db2, dbo] in one output, so XLA adds them up in one
    # pass (one array for the partial sums, not one per sum: fewer buffers and launches); dbo
    # here rather than in XLA, which would read dr once more for it.
    sums_ref[0, :] = jnp.sum(dxn * xhat, axis=0)
    sums_ref[1, :] = jnp.sum(dxn, axis=0)
    sums_ref[2, :] = jnp.sum(dy, axis=0)
    sums_ref[3, :] = jnp.sum(dr, axis=0)


# ------------------------------------------------------------------------------------------
# Wrappers.

def _compiler_params(cfg: _Config, num_warps):
    return plgpu.CompilerParams(num_warps=num_warps, num_stages=cfg.num_stages)


def _in_compute_dtype(cd, *dense_params):
    """Dense weights and biases in the compute dtype, as nn.Dense(dtype=cd) uses them. Cast once
    here, outside the kernels, so every program reads half the bytes (bf16)."""
    return tuple(p.astype(cd) for p in dense_params)


def _forward(cfg: _Config, x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2, save=False):
    """y, and with save also r and LN(r) in the compute dtype (for kernels 2 and 3)."""
    n_rows, d_model = x.shape
    hidden = w1.shape[1]
    br = cfg.block_rows
    wo, bo, w1, b1, w2, b2 = _in_compute_dtype(x.dtype, wo, bo, w1, b1, w2, b2)
    rows = row_block(br, d_model)
    vector = whole((d_model,))
    kernel = functools.partial(_forward_kernel, n_rows=n_rows, block_hidden=cfg.block_hidden,
                               fast_gelu=cfg.fast_gelu)
    return pl.pallas_call(
        kernel, grid=(pl.cdiv(n_rows, br),),
        in_specs=[rows, rows, whole((d_model, d_model)), vector, vector, vector,
                  whole((d_model, hidden)), whole((hidden,)), whole((hidden, d_model)), vector],
        out_specs=[rows] * (1 + 2 * save),
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype)] * (1 + 2 * save),
        compiler_params=_compiler_params(cfg, cfg.num_warps), interpret=cfg.interpret,
        name="finish_block_forward")(x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2)


def _backward_rows(cfg: _Config, r, ln_scale, w1, dh, dy):
    """dr (= dx) and the sums [d ln_scale, d ln_bias, db2, dbo] (kernel 3) from dh."""
    n_rows, d_model = r.shape
    hidden = w1.shape[1]
    br = cfg.block_rows
    n_blocks = pl.cdiv(n_rows, br)
    rows = row_block(br, d_model)
    kernel = functools.partial(_backward_rows_kernel, n_rows=n_rows,
                               block_hidden=min(cfg.rows_block_hidden, hidden))
    dr, partials = pl.pallas_call(
        kernel, grid=(n_blocks,),
        in_specs=[rows, whole((d_model,)), whole((d_model, hidden)), row_block(br, hidden), rows],
        out_specs=[rows, partial_sum(4, d_model)],
        out_shape=[jax.ShapeDtypeStruct(r.shape, r.dtype), jax.ShapeDtypeStruct((n_blocks, 4, d_model), jnp.float32)],
        compiler_params=_compiler_params(cfg, cfg.num_warps), interpret=cfg.interpret,
        name="finish_block_backward_rows")(r, ln_scale, w1, dh, dy)
    return dr, partials.sum(0)


def _group_layout(n_rows, block_rows, row_groups):
    """(groups, row blocks per group) with no group left empty."""
    n_blocks = pl.cdiv(n_rows, block_rows)
    blocks_per_group = pl.cdiv(n_blocks, min(row_groups, n_blocks))
    return pl.cdiv(n_blocks, blocks_per_group), blocks_per_group


def _backward_weights(cfg: _Config, xn, w1, b1, w2, dy):
    """dw1, db1, dw2 and dh [N, H] in the compute dtype (kernel 2) from xn = LN(r)."""
    n_rows, d_model = xn.shape
    hidden = w1.shape[1]
    bh = cfg.block_hidden
    groups, blocks_per_group = _group_layout(n_rows, cfg.weights_block_rows, cfg.row_groups)
    kernel = functools.partial(_backward_weights_kernel, n_rows=n_rows,
                               block_rows=cfg.weights_block_rows,
                               blocks_per_group=blocks_per_group, fast_gelu=cfg.fast_gelu)
    dw1, db1, dw2, dh = pl.pallas_call(
        kernel, grid=(groups, hidden // bh),
        in_specs=[whole(xn.shape),
                  pl.BlockSpec((d_model, bh), lambda g, c: (0, c)),
                  pl.BlockSpec((bh,), lambda g, c: (c,)),
                  pl.BlockSpec((bh, d_model), lambda g, c: (c, 0)),
                  whole(xn.shape)],
        out_specs=[pl.BlockSpec((None, d_model, bh), lambda g, c: (g, 0, c)),
                   pl.BlockSpec((None, bh), lambda g, c: (g, c)),
                   pl.BlockSpec((None, bh, d_model), lambda g, c: (g, c, 0)),
                   whole((n_rows, hidden))],  # each program writes its chunk of its rows
        out_shape=[jax.ShapeDtypeStruct((groups, d_model, hidden), jnp.float32),
                   jax.ShapeDtypeStruct((groups, hidden), jnp.float32),
                   jax.ShapeDtypeStruct((groups, hidden, d_model), jnp.float32),
                   jax.ShapeDtypeStruct((n_rows, hidden), xn.dtype)],
        compiler_params=_compiler_params(cfg, cfg.weights_num_warps), interpret=cfg.interpret,
        name="finish_block_backward_weights")(xn, w1, b1, w2, dy)
    return dw1.sum(0), db1.sum(0), dw2.sum(0), dh


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _finish_block(cfg: _Config, x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2):
    return _forward(cfg, x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2)[0]


def _finish_block_fwd(cfg, x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2):
    # Residuals are r, LN(r), attn and the weights: the backward pass recomputes everything
    # H-wide (kernel 2, once).
    y, r, xn = _forward(cfg, x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2, save=True)
    return y, (r, xn, attn, wo, ln_scale, w1, b1, w2)


def _finish_block_bwd(cfg, residuals, dy):
    r, xn, attn, wo, ln_scale, w1, b1, w2 = residuals
    wo_cd, w1_cd, b1_cd, w2_cd = _in_compute_dtype(r.dtype, wo, w1, b1, w2)
    dy = dy.astype(r.dtype)
    dw1, db1, dw2, dh = _backward_weights(cfg, xn, w1_cd, b1_cd, w2_cd, dy)
    dr, (dscale, dbias, db2, dbo) = _backward_rows(cfg, r, ln_scale, w1_cd, dh, dy)
    # The projection's matmul gradients stay with XLA (cuBLAS): d attn = dr @ wo^T inside the
    # rows kernel is slower than cuBLAS's matmul of it.
    dattn = jnp.dot(dr, wo_cd.T)
    dwo = dot(attn, dr, trans_a=True)
    # r = x + attn wo + bo: the residual stream's gradient dx is dr itself.
    return dr, dattn, dwo, dbo, dscale, dbias, dw1, db1, dw2, db2


_finish_block.defvjp(_finish_block_fwd, _finish_block_bwd)


def _is_power_of_2(n):
    return n >= 1 and n & (n - 1) == 0


MAX_D_MODEL = 128  # wider rows overflow a GPU's shared memory


def supported(d_model: int, hidden: int) -> bool:
    """Shapes the kernels take. Wider models are matmul-bound, where XLA does well anyway."""
    return (16 <= d_model <= MAX_D_MODEL and _is_power_of_2(d_model) and hidden >= 16
            and _is_power_of_2(hidden))


def _check(x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2, cfg: _Config):
    d_model = x.shape[-1]
    hidden = w1.shape[-1]
    expected = {"attn": x.shape, "wo": (d_model, d_model), "bo": (d_model,), "ln_scale": (d_model,),
                "ln_bias": (d_model,), "w1": (d_model, hidden), "b1": (hidden,),
                "w2": (hidden, d_model), "b2": (d_model,)}
    given = {"attn": attn, "wo": wo, "bo": bo, "ln_scale": ln_scale, "ln_bias": ln_bias, "w1": w1,
             "b1": b1, "w2": w2, "b2": b2}
    for name, shape in expected.items():
        if given[name].shape != shape:
            raise ValueError(f"finish_block: {name} has shape {given[name].shape}, expected "
                             f"{shape} (x {x.shape}, w1 {w1.shape})")
    if not jnp.issubdtype(x.dtype, jnp.floating) or attn.dtype != x.dtype:
        raise ValueError(f"finish_block: x and attn must share a floating dtype, got {x.dtype} "
                         f"and {attn.dtype}")
    if d_model > MAX_D_MODEL:
        raise ValueError(f"finish_block: d_model {d_model} is wider than the kernels take ({MAX_D_MODEL})")
    for name, size in (("d_model", d_model), ("hidden", hidden), ("block_rows", cfg.block_rows),
                       ("block_hidden", cfg.block_hidden),
                       ("weights_block_rows", cfg.weights_block_rows),
                       ("rows_block_hidden", cfg.rows_block_hidden)):
        if size < 16 or not _is_power_of_2(size):
            raise ValueError(f"finish_block: {name} must be a power of 2 >= 16, got {size}")
    if cfg.block_hidden > hidden:
        raise ValueError(f"finish_block: block_hidden {cfg.block_hidden} exceeds hidden {hidden}")
    for name, count in (("row_groups", cfg.row_groups), ("num_warps", cfg.num_warps),
                        ("weights_num_warps", cfg.weights_num_warps),
                        ("num_stages", cfg.num_stages)):
        if count < 1:
            raise ValueError(f"finish_block: {name} must be >= 1, got {count}")


def finish_block(x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2, *, block_rows: int = 64,
                 block_hidden: int = 64, num_warps: int = 4, num_stages: int = 2,
                 weights_block_rows: int = 128, weights_num_warps: int = 8,
                 row_groups: int = 16, rows_block_hidden: int = 128, interpret: bool = False):
    """y = r + gelu(LN(r) @ w1 + b1) @ w2 + b2 with r = x + attn @ wo + bo, over the last axis
    of x and attn; see the module docstring.

    block_rows x block_hidden: the tile of the forward kernel (powers of 2, >= 16); num_warps:
    its Triton warps per program. The backward-over-rows kernel takes block_rows and num_warps
    too, with hidden chunks of rows_block_hidden (at most H: it only reads dh, so wider chunks
    than the forward's pay). The weight-gradient kernel keeps two fp32 [D, block_hidden]
    accumulators in registers for its whole loop, so it has its own rows per step and warps
    (weights_block_rows, weights_num_warps) and row_groups, its programs along the rows (each
    loops over its share of the row blocks): row_groups x H / block_hidden programs, each
    writing fp32 partials. num_stages: Triton software-pipelining depth of every kernel's loop.
    Defaults: tuned at D = 128, bf16, for a GPU of at least 128 SMs. For the weight-gradient
    kernel that is 128 rows a step on two warpgroups (8 warps) and 16 x H / block_hidden = 128
    programs, one an SM (its accumulators fill the registers; fewer groups leave SMs idle, 256
    rows overflow shared memory; 64 rows on 4 warps, two programs an SM, is slower). The forward
    and rows kernels stay on 4 warps (8 is slower), and the forward's 128-wide hidden chunks
    overflow shared memory."""
    fast_gelu = not interpret and x.dtype == jnp.bfloat16
    cfg = _Config(int(block_rows), int(block_hidden), int(num_warps), int(num_stages),
                  int(weights_block_rows), int(weights_num_warps), int(row_groups),
                  int(rows_block_hidden), bool(fast_gelu), bool(interpret))
    _check(x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2, cfg)
    rows = (int(np.prod(x.shape[:-1])), x.shape[-1])
    y = _finish_block(cfg, x.reshape(rows), attn.reshape(rows), wo, bo, ln_scale, ln_bias,
                      w1, b1, w2, b2)
    return y.reshape(x.shape)


def reference(x, attn, wo, bo, ln_scale, ln_bias, w1, b1, w2, b2):
    """The same function in plain jnp, step for step as the flax modules compute it (Dense layers
    in the compute dtype x.dtype, LayerNorm with fp32 statistics). For tests and benchmarks."""
    cd = x.dtype
    r = x + (jnp.dot(attn.astype(cd), wo.astype(cd)) + bo.astype(cd))
    xn = layer_norm_reference(r, ln_scale, ln_bias)
    h = jnp.dot(xn, w1.astype(cd)) + b1.astype(cd)
    return r + (jnp.dot(jax.nn.gelu(h, approximate=True), w2.astype(cd)) + b2.astype(cd))
