"""The output end of the transformer in Pallas: the final LayerNorm and the actor and critic
heads, out = float32(LN(x)) @ w + b, with w = [actor kernel | critic kernel] [D, A + 1].

At the Algorithm Distillation size (d_model 128, 327,680 tokens a step, bf16) XLA spends a
few percent of the training step here: the heads are float32 layers on a bf16 residual stream,
so the LayerNorm's output is materialised once more as float32 [N, D] for the two head matmuls,
and the backward pass writes the float32 [N, D] gradient of that copy, then runs the LayerNorm
backward over it in two passes. The heads are only A + 1 columns wide, so all of this is memory
traffic. Here one kernel each way reads x once: forward writes only the [N, A + 1] outputs;
backward reads x and d out and writes dx, with the parameter gradients as per-program float32
partial sums (added up by the wrapper: deterministic, no atomics).

    heads(x, ln_scale, ln_bias, w, b, *, block_rows=64, num_warps=4, interpret=False) -> out

x [..., D] in the compute dtype; ln_scale, ln_bias [D], w [D, K], b [K] float32; out [..., K]
float32. The same function as flax's `nn.LayerNorm(dtype=x.dtype, param_dtype=f32)` ->
`.astype(f32)` -> `nn.Dense(K, dtype=f32)`, the LayerNorm's output rounded to x's dtype as flax
rounds it. The head matmuls take float32 operands at the default precision, TF32 on a GPU's
tensor cores, as XLA runs the flax heads by default. Pallas lowers the kernels to Triton on NVIDIA GPUs; `interpret=True` runs the same bodies
through XLA (the CPU tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxrl_mgpu.nets.pallas_util import (dot, layer_norm, layer_norm_backward, layer_norm_reference, partial_sum,
                                         row_block, row_mask, standardize, whole)

MAX_D_MODEL = 128  # a program holds a [block_rows, D] float32 tile per value in registers
MAX_OUTPUTS = 128


def supported(d_model: int, outputs: int) -> bool:
    return 16 <= d_model <= MAX_D_MODEL and d_model & (d_model - 1) == 0 and 1 <= outputs <= MAX_OUTPUTS


def _padded(outputs: int) -> int:
    """Columns the kernels compute: a power of 2 >= 16 (Triton's smallest dot operand)."""
    return max(16, pl.next_power_of_2(outputs))


def _forward_kernel(x_ref, scale_ref, bias_ref, w_ref, b_ref, out_ref, *, n_rows):
    rows = row_mask(pl.program_id(0) * x_ref.shape[0], x_ref.shape[0], n_rows)
    x = plgpu.load(x_ref, mask=rows, other=0).astype(jnp.float32)
    xn = layer_norm(x, scale_ref, bias_ref, x_ref.dtype).astype(jnp.float32)
    out = dot(xn, w_ref[...]) + b_ref[...][None, :]
    plgpu.store(out_ref, out, mask=rows)


def _backward_kernel(x_ref, scale_ref, bias_ref, w_ref, dout_ref, dx_ref, dscale_ref, dbias_ref, dw_ref,
                     db_ref, *, n_rows):
    rows = row_mask(pl.program_id(0) * x_ref.shape[0], x_ref.shape[0], n_rows)
    xhat, rstd = standardize(plgpu.load(x_ref, mask=rows, other=0).astype(jnp.float32))
    scale = scale_ref[...][None, :]
    xn = (xhat * scale + bias_ref[...][None, :]).astype(x_ref.dtype).astype(jnp.float32)
    dout = plgpu.load(dout_ref, mask=rows, other=0)  # zero on masked rows: they add nothing
    dxn = dot(dout, w_ref[...], trans_b=True)
    plgpu.store(dx_ref, layer_norm_backward(dxn, xhat, rstd, scale).astype(dx_ref.dtype), mask=rows)
    dw_ref[...] = dot(xn, dout, trans_a=True)
    db_ref[...] = jnp.sum(dout, axis=0)
    dscale_ref[...] = jnp.sum(dxn * xhat, axis=0)
    dbias_ref[...] = jnp.sum(dxn, axis=0)


def _forward(cfg, x, ln_scale, ln_bias, w, b):
    block_rows, num_warps, interpret = cfg
    (n, d), k = x.shape, w.shape[1]
    row = functools.partial(row_block, block_rows)
    return pl.pallas_call(
        functools.partial(_forward_kernel, n_rows=n), grid=(pl.cdiv(n, block_rows),),
        in_specs=[row(d), whole((d,)), whole((d,)), whole((d, k)), whole((k,))], out_specs=row(k),
        out_shape=jax.ShapeDtypeStruct((n, k), jnp.float32),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret, name="heads_forward")(x, ln_scale, ln_bias, w, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _heads(cfg, x, ln_scale, ln_bias, w, b):
    return _forward(cfg, x, ln_scale, ln_bias, w, b)


def _heads_fwd(cfg, x, ln_scale, ln_bias, w, b):
    return _forward(cfg, x, ln_scale, ln_bias, w, b), (x, ln_scale, ln_bias, w)


def _heads_bwd(cfg, residuals, dout):
    block_rows, num_warps, interpret = cfg
    x, ln_scale, ln_bias, w = residuals
    (n, d), k = x.shape, w.shape[1]
    blocks = pl.cdiv(n, block_rows)
    row = functools.partial(row_block, block_rows)
    out = lambda *shape: jax.ShapeDtypeStruct((blocks,) + shape, jnp.float32)
    dx, dscale, dbias, dw, db = pl.pallas_call(
        functools.partial(_backward_kernel, n_rows=n), grid=(blocks,),
        in_specs=[row(d), whole((d,)), whole((d,)), whole((d, k)), row(k)],
        out_specs=[row(d), partial_sum(d), partial_sum(d), partial_sum(d, k), partial_sum(k)],
        out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype), out(d), out(d), out(d, k), out(k)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
        interpret=interpret, name="heads_backward")(x, ln_scale, ln_bias, w, dout)
    return dx, dscale.sum(0), dbias.sum(0), dw.sum(0), db.sum(0)


_heads.defvjp(_heads_fwd, _heads_bwd)


def heads(x, ln_scale, ln_bias, w, b, *, block_rows: int = 64, num_warps: int = 4, interpret: bool = False):
    """float32(LN(x)) @ w + b over the last axis of x; see the module docstring."""
    d, k = x.shape[-1], w.shape[-1]
    if ln_scale.shape != (d,) or ln_bias.shape != (d,) or w.shape != (d, k) or b.shape != (k,):
        raise ValueError(f"heads: x [..., {d}] needs ln_scale, ln_bias [{d}], w [{d}, K] and b [K], got "
                         f"{ln_scale.shape}, {ln_bias.shape}, {w.shape}, {b.shape}")
    if not supported(d, k):
        raise ValueError(f"heads: needs d_model a power of 2 from 16 to {MAX_D_MODEL} and at most "
                         f"{MAX_OUTPUTS} outputs, got d_model {d}, {k} outputs")
    if block_rows < 16 or block_rows & (block_rows - 1):
        raise ValueError(f"heads: block_rows must be a power of 2 >= 16, got {block_rows}")
    kp = _padded(k)  # zero columns past k: their outputs are dropped, so their gradients are 0
    w = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, kp - k)))
    b = jnp.pad(b.astype(jnp.float32), (0, kp - k))
    out = _heads((int(block_rows), int(num_warps), bool(interpret)), x.reshape(-1, d),
                 ln_scale.astype(jnp.float32), ln_bias.astype(jnp.float32), w, b)
    return out[:, :k].reshape(x.shape[:-1] + (k,))


def reference(x, ln_scale, ln_bias, w, b):
    """The same function as flax's modules compute it (for tests and benchmarks)."""
    xn = layer_norm_reference(x, ln_scale, ln_bias).astype(jnp.float32)
    return jnp.dot(xn, w) + b
