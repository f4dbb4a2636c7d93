"""Probe: is Pallas's Mosaic GPU lowering (TMA + wgmma, explicit shared memory, warp
specialisation) a way past the Triton kernels' latency bound (experiments/RESULTS.md, "Fused
kernels", sessions 8-9)? Not used by the package.

- `mlp_core`: the core of the fused MLP forward, y = r + gelu(xn @ w1 + b1) @ w2 + b2 at the AD
  size (N = 4096 x 80 rows, D = 128, H = 512, bf16): one warpgroup per 64-row block, the block's
  rows copied to shared memory by TMA, the hidden dimension streamed in chunks (w1[:, c],
  w2[c, :], b1[c]) by `emit_pipeline`, GELU applied in registers on the first wgmma's
  accumulator and fed as the register operand of the second; variants below.
- `mlp_core_ws`: the same, warp-specialised: a memory warpgroup streams the weight chunks for
  2 compute warpgroups of 64 rows each.
- `mlp_full`: all of `fused_mlp`'s forward kernel (the attention output's projection and
  residual, LayerNorm, the MLP), timed against that Triton kernel on the same inputs.
Each is checked against XLA, on the GPU and, with --interpret, through jax's GPU interpreter on
the CPU (small N).

    python experiments/gpu/mosaic_mlp.py             # on an H100 / H200
    python experiments/gpu/mosaic_mlp.py --interpret  # CPU: the GPU interpreter, small N
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import time

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

GELU_C, GELU_A = math.sqrt(2.0 / math.pi), 0.044715


def gelu(h):
    return 0.5 * h * (1.0 + jnp.tanh(GELU_C * (h + GELU_A * h * h * h)))


def reference(xn, r, w1, b1, w2, b2):
    cd = xn.dtype
    a = gelu((jnp.dot(xn, w1.astype(cd), preferred_element_type=jnp.float32) + b1).astype(jnp.float32))
    y = jnp.dot(a.astype(cd), w2.astype(cd), preferred_element_type=jnp.float32) + b2
    return (r.astype(jnp.float32) + y).astype(cd)


def _tiled(cols):
    """wgmma's shared-memory operand layout for bf16 rows of `cols` elements: (8 x 64) tiles
    swizzled over 128 bytes, or narrower for 32-wide blocks."""
    elems = min(64, cols)
    return plgpu.TilingTransform((8, elems)), plgpu.SwizzleTransform(2 * elems)


def _columns(ref, interpret):
    """A [cols] vector laid out to broadcast over the rows of a wgmma accumulator (the GPU
    interpreter has neither layouts nor plgpu.load)."""
    return ref[...] if interpret else plgpu.load(ref, (), layout=plgpu.Layout.WGMMA.reduce(0))


def _interpret_kwargs(interpret):
    if not interpret:
        return {}
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams  # not exported in jax 0.10
    return {"interpret": InterpretGPUParams()}


def _sizes(x, w1, rows, block_hidden):
    """N, D, H of a call, checked against the row block and hidden chunk sizes."""
    (n, d), hidden = x.shape, w1.shape[1]
    if n % rows or hidden % block_hidden:
        raise ValueError(f"N {n} and H {hidden} must be multiples of {rows} and {block_hidden}")
    return n, d, hidden


def mlp_core(xn, r, w1, b1, w2, b2, *, block_rows=64, block_hidden=64, stages=2, a_in_smem=False,
             approx=False, lean=False, parts=1, interpret=False):
    """y [N, D] = r + gelu(xn @ w1 + b1) @ w2 + b2; xn, r, w1 [D, H], w2 [H, D] bf16; b1, b2 fp32.
    a_in_smem: the GELU output goes through shared memory to the second wgmma instead of being
    its register operand (the GPU interpreter supports only the former). approx: tanh etc. as
    the hardware's approximations. lean: r is copied in after the hidden loop, into xn's buffer,
    and y leaves from there (less shared memory a CTA, so more CTAs an SM). parts: slices of a
    pipeline step's hidden block whose matmuls overlap the other slices' GELU (see chunk)."""
    n, d, hidden = _sizes(xn, w1, block_rows, block_hidden)
    dtype, tiled = xn.dtype, _tiled(d)
    columns = functools.partial(_columns, interpret=interpret)

    def body(xn_g, r_g, w1_g, b1_g, w2_g, b2_g, y_g):
        rows = pl.ds(lax.axis_index("rows") * block_rows, block_rows)

        def scoped(xn_s, r_s, b2_s, a_s, barriers):
            pl.run_scoped(functools.partial(compute, xn_s, xn_s if lean else r_s, b2_s, a_s, barriers),
                          plgpu.ACC((block_rows, d), jnp.float32))

        def compute(xn_s, r_s, b2_s, a_s, barriers, y_acc):
            plgpu.copy_gmem_to_smem(xn_g.at[rows], xn_s, barriers.at[0])
            if not lean:
                plgpu.copy_gmem_to_smem(r_g.at[rows], r_s, barriers.at[1])
            plgpu.copy_gmem_to_smem(b2_g, b2_s, barriers.at[2])
            plgpu.barrier_wait(barriers.at[0])

            def chunk(_, w1_s, b1_s, w2_s):
                # The step's hidden block in `parts` slices: every slice's first matmul is
                # issued up front, so that the tensor cores work on the next slice (and on the
                # previous slice's second matmul) while this one's GELU runs.
                sub = block_hidden // parts
                cols = [pl.ds(j * sub, sub) for j in range(parts)]

                def issue(*h_accs):
                    for h_acc, c in zip(h_accs, cols):
                        plgpu.wgmma(h_acc, xn_s, w1_s.at[:, c])
                    for j, (h_acc, c) in enumerate(zip(h_accs, cols)):
                        # wgmmas complete in issue order: this slice's first matmul is done when
                        # at most the later slices' ones and the last second matmul are pending.
                        pending = parts - 1 - j + (j > 0)
                        h = plgpu.wgmma_accumulator_load(h_acc, wait_n=pending)
                        b1 = columns(b1_s.at[c])
                        a = gelu(h + lax.broadcast_in_dim(b1, h.shape, [1])).astype(dtype)
                        if a_in_smem:
                            a_s[j] = a
                            plgpu.commit_smem()
                            a = a_s.at[j]
                        plgpu.wgmma(y_acc, a, w2_s.at[c])
                    plgpu.wgmma_wait(0)  # w1_s and w2_s go back to the pipeline after this step
                pl.run_scoped(issue, *[plgpu.ACC((block_rows, sub), jnp.float32)] * parts)

            plgpu.emit_pipeline(
                chunk, grid=(hidden // block_hidden,), max_concurrent_steps=stages,
                in_specs=[plgpu.BlockSpec((d, block_hidden), lambda c: (0, c),
                                          transforms=_tiled(block_hidden // parts)),
                          plgpu.BlockSpec((block_hidden,), lambda c: (c,)),
                          plgpu.BlockSpec((block_hidden, d), lambda c: (c, 0), transforms=tiled)],
            )(w1_g, b1_g, w2_g)
            if lean:  # every wgmma reading xn_s has completed (wgmma_wait(0) in each step)
                plgpu.copy_gmem_to_smem(r_g.at[rows], r_s, barriers.at[1])
            plgpu.barrier_wait(barriers.at[1])
            plgpu.barrier_wait(barriers.at[2])
            b2 = columns(b2_s)
            y = y_acc[...] + lax.broadcast_in_dim(b2, (block_rows, d), [1]) + r_s[...].astype(jnp.float32)
            r_s[...] = y.astype(dtype)  # r's buffer is free: stage y there for the TMA store
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(r_s, y_g.at[rows])
            plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(scoped,
                      plgpu.SMEM((block_rows, d), dtype, transforms=tiled),
                      None if lean else plgpu.SMEM((block_rows, d), dtype, transforms=tiled),
                      plgpu.SMEM((d,), jnp.float32),
                      plgpu.SMEM((parts, block_rows, block_hidden // parts), dtype,
                                 transforms=_tiled(block_hidden // parts)) if a_in_smem else None,
                      plgpu.Barrier(num_barriers=3))

    kwargs = _interpret_kwargs(interpret)
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((n, d), dtype), grid=(n // block_rows,),
                        grid_names=("rows",), compiler_params=plgpu.CompilerParams(approx_math=approx),
                        **kwargs)(xn, r, w1, b1, w2, b2)


def mlp_core_ws(xn, r, w1, b1, w2, b2, *, wgs=2, block_hidden=64, stages=2, a_in_smem=False,
                approx=False, lean=False, interpret=False):
    """As mlp_core, warp-specialised: a CTA takes 64 x `wgs` rows, one compute warpgroup per 64,
    and a memory warpgroup streams the weight chunks that all of them read (once per CTA instead
    of once per 64 rows)."""
    rows_per_cta = 64 * wgs
    n, d, hidden = _sizes(xn, w1, rows_per_cta, block_hidden)
    dtype, tiled = xn.dtype, _tiled(d)
    columns = functools.partial(_columns, interpret=interpret)

    def body(xn_g, r_g, w1_g, b1_g, w2_g, b2_g, y_g):
        def scoped(xn_s, r_s, b2_s, a_s, barriers):
            r_s = xn_s if lean else r_s

            def chunk(_, w1_s, b1_s, w2_s, y_acc):
                wg = lax.axis_index("wg")

                def first(h_acc):
                    plgpu.wgmma(h_acc, xn_s.at[wg], w1_s)
                    return h_acc[...]
                h = pl.run_scoped(first, plgpu.ACC((64, block_hidden), jnp.float32))
                b1 = columns(b1_s)
                a = gelu(h + lax.broadcast_in_dim(b1, h.shape, [1])).astype(dtype)
                if a_in_smem:
                    a_s[wg] = a
                    plgpu.commit_smem()
                    a = a_s.at[wg]
                plgpu.wgmma(y_acc, a, w2_s)
                plgpu.wgmma_wait(0)
                return y_acc

            def compute_context(run_pipeline):
                wg = lax.axis_index("wg")
                rows = pl.ds(lax.axis_index("rows") * rows_per_cta + wg * 64, 64)
                plgpu.copy_gmem_to_smem(xn_g.at[rows], xn_s.at[wg], barriers.at[3 * wg])
                if not lean:
                    plgpu.copy_gmem_to_smem(r_g.at[rows], r_s.at[wg], barriers.at[3 * wg + 1])
                plgpu.copy_gmem_to_smem(b2_g, b2_s.at[wg], barriers.at[3 * wg + 2])
                plgpu.barrier_wait(barriers.at[3 * wg])

                def with_acc(y_acc):
                    run_pipeline(y_acc)
                    if lean:
                        plgpu.copy_gmem_to_smem(r_g.at[rows], r_s.at[wg], barriers.at[3 * wg + 1])
                    plgpu.barrier_wait(barriers.at[3 * wg + 1])
                    plgpu.barrier_wait(barriers.at[3 * wg + 2])
                    b2 = columns(b2_s.at[wg])
                    y = y_acc[...] + lax.broadcast_in_dim(b2, (64, d), [1]) + r_s[wg].astype(jnp.float32)
                    r_s[wg] = y.astype(dtype)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(r_s.at[wg], y_g.at[rows])
                    plgpu.wait_smem_to_gmem(0)
                pl.run_scoped(with_acc, plgpu.ACC((64, d), jnp.float32))

            plgpu.emit_pipeline_warp_specialized(
                chunk, grid=(hidden // block_hidden,), max_concurrent_steps=stages, memory_registers=40,
                wg_axis="wg", num_compute_wgs=wgs, compute_context=compute_context,
                in_specs=[plgpu.BlockSpec((d, block_hidden), lambda c: (0, c), transforms=_tiled(block_hidden)),
                          plgpu.BlockSpec((block_hidden,), lambda c: (c,)),
                          plgpu.BlockSpec((block_hidden, d), lambda c: (c, 0), transforms=tiled)],
            )(w1_g, b1_g, w2_g)

        pl.run_scoped(scoped,
                      plgpu.SMEM((wgs, 64, d), dtype, transforms=tiled),
                      None if lean else plgpu.SMEM((wgs, 64, d), dtype, transforms=tiled),
                      plgpu.SMEM((wgs, d), jnp.float32),
                      plgpu.SMEM((wgs, 64, block_hidden), dtype, transforms=_tiled(block_hidden))
                      if a_in_smem else None,
                      plgpu.Barrier(num_barriers=3 * wgs),
                      collective_axes="wg")

    kwargs = _interpret_kwargs(interpret)
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((n, d), dtype), grid=(n // rows_per_cta,),
                        grid_names=("rows",), num_threads=wgs + 1, thread_name="wg",
                        compiler_params=plgpu.CompilerParams(approx_math=approx), **kwargs)(xn, r, w1, b1, w2, b2)


def reference_full(x, attn, wo, bo, scale, bias, w1, b1, w2, b2):
    """What fused_mlp.finish_block computes: r = x + attn @ wo + bo (rounded), xn = LN(r), then
    reference(xn, r, ...)."""
    from jaxrl_mgpu.nets.pallas_util import layer_norm_reference
    cd = x.dtype
    r = (x.astype(jnp.float32) + jnp.dot(attn, wo.astype(cd), preferred_element_type=jnp.float32) + bo).astype(cd)
    return reference(layer_norm_reference(r, scale, bias), r, w1, b1, w2, b2)


def mlp_full(x, attn, wo, bo, scale, bias, w1, b1, w2, b2, *, block_hidden=64, stages=1, interpret=False):
    """The whole fused MLP forward of fused_mlp (kernel 1, y only): the projection and residual
    r = x + attn @ wo + bo, LayerNorm in registers (fp32 statistics over each row of the wgmma
    layout), then the hidden loop of mlp_core with x normalised as the first matmul's
    shared-memory operand. One warpgroup per 64 rows; x's buffer holds x normalised once r is
    formed, attn's holds r for the epilogue and then y for the store. (The GPU interpreter's
    wgmma takes shared-memory operands only: there the GELU output goes through a buffer.)"""
    n, d, hidden = _sizes(x, w1, 64, block_hidden)
    dtype, tiled = x.dtype, _tiled(d)

    columns = functools.partial(_columns, interpret=interpret)

    def wide(ref, shape):  # a [D] vector broadcast over the rows of a [64, D] wgmma array
        return lax.broadcast_in_dim(columns(ref), shape, [1])

    def body(x_g, attn_g, wo_g, bo_g, scale_g, bias_g, w1_g, b1_g, w2_g, b2_g, y_g):
        rows = pl.ds(lax.axis_index("rows") * 64, 64)

        def scoped(x_s, attn_s, wo_s, vec_s, a_s, barriers):
            plgpu.copy_gmem_to_smem(x_g.at[rows], x_s, barriers.at[0])
            plgpu.copy_gmem_to_smem(attn_g.at[rows], attn_s, barriers.at[1])
            plgpu.copy_gmem_to_smem(wo_g, wo_s, barriers.at[2])
            for i, v in enumerate((bo_g, scale_g, bias_g, b2_g)):
                plgpu.copy_gmem_to_smem(v, vec_s.at[i], barriers.at[3 + i])
            for i in range(7):
                plgpu.barrier_wait(barriers.at[i])

            def projection(acc):
                plgpu.wgmma(acc, attn_s, wo_s)
                return acc[...]
            proj = pl.run_scoped(projection, plgpu.ACC((64, d), jnp.float32))
            r = (x_s[...].astype(jnp.float32) + proj + wide(vec_s.at[0], (64, d))).astype(dtype)
            attn_s[...] = r  # attn is spent (the wgmma above has completed)
            r32 = r.astype(jnp.float32)
            mean = r32.sum(axis=1) / d
            centred = r32 - lax.broadcast_in_dim(mean, (64, d), [0])
            var = (centred * centred).sum(axis=1) / d
            rstd = lax.rsqrt(var + 1e-6)
            xn = centred * lax.broadcast_in_dim(rstd, (64, d), [0]) * wide(vec_s.at[1], (64, d)) \
                + wide(vec_s.at[2], (64, d))
            x_s[...] = xn.astype(dtype)
            plgpu.commit_smem()

            def hidden_loop(y_acc):
                def chunk(_, w1_s, b1_s, w2_s):
                    def first(h_acc):
                        plgpu.wgmma(h_acc, x_s, w1_s)
                        return h_acc[...]
                    h = pl.run_scoped(first, plgpu.ACC((64, block_hidden), jnp.float32))
                    a = gelu(h + lax.broadcast_in_dim(columns(b1_s), h.shape, [1])).astype(dtype)
                    if interpret:
                        a_s[...] = a
                        a = a_s
                    plgpu.wgmma(y_acc, a, w2_s)
                    plgpu.wgmma_wait(0)

                plgpu.emit_pipeline(
                    chunk, grid=(hidden // block_hidden,), max_concurrent_steps=stages,
                    in_specs=[plgpu.BlockSpec((d, block_hidden), lambda c: (0, c), transforms=_tiled(block_hidden)),
                              plgpu.BlockSpec((block_hidden,), lambda c: (c,)),
                              plgpu.BlockSpec((block_hidden, d), lambda c: (c, 0), transforms=tiled)],
                )(w1_g, b1_g, w2_g)
                y = y_acc[...] + wide(vec_s.at[3], (64, d)) + attn_s[...].astype(jnp.float32)
                attn_s[...] = y.astype(dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(attn_s, y_g.at[rows])
                plgpu.wait_smem_to_gmem(0)
            pl.run_scoped(hidden_loop, plgpu.ACC((64, d), jnp.float32))

        pl.run_scoped(scoped,
                      plgpu.SMEM((64, d), dtype, transforms=tiled),
                      plgpu.SMEM((64, d), dtype, transforms=tiled),
                      plgpu.SMEM((d, d), dtype, transforms=tiled),
                      plgpu.SMEM((4, d), jnp.float32),
                      plgpu.SMEM((64, block_hidden), dtype, transforms=_tiled(block_hidden)) if interpret else None,
                      plgpu.Barrier(num_barriers=7))

    kwargs = _interpret_kwargs(interpret)
    cd = lambda w: w.astype(dtype)
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((n, d), dtype), grid=(n // 64,), grid_names=("rows",),
                        compiler_params=plgpu.CompilerParams(approx_math=not interpret), **kwargs)(
        x, attn, cd(wo), bo, scale, bias, cd(w1), b1, cd(w2), b2)


def timed(f, *args, repeats=10, inner=10):
    jax.block_until_ready(f(*args))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(inner):
            out = f(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - t) / inner)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--interpret", action="store_true")
    p.add_argument("--rows", type=int, default=4096 * 80)
    p.add_argument("--configs", nargs="*", default=["64,64,2,0", "64,64,2,0,1,1", "64,64,1,0,1,1", "ws2,64,2,0,1,1",
                                                     "ws2,64,3,0,1,1", "ws2,64,4,0,1,1", "ws2,128,2,0,1,1",
                                                     "ws2,64,2,0,1,0"],
                   help="block_rows (or wsK: warp-specialised, K compute warpgroups),block_hidden,stages,a_in_smem"
                        "[,approx,lean,parts] (parts: mlp_core only)")
    p.add_argument("--full-stages", type=int, nargs="*", default=[1, 2])
    args = p.parse_args()
    n = 256 if args.interpret else args.rows
    d, hidden = 128, 512
    k = jax.random.split(jax.random.PRNGKey(0), 6)
    xn = jax.random.normal(k[0], (n, d), jnp.bfloat16)
    r = jax.random.normal(k[1], (n, d), jnp.bfloat16)
    w1 = (jax.random.normal(k[2], (d, hidden)) / math.sqrt(d)).astype(jnp.bfloat16)
    w2 = (jax.random.normal(k[3], (hidden, d)) / math.sqrt(hidden)).astype(jnp.bfloat16)
    b1 = 0.1 * jax.random.normal(k[4], (hidden,))
    b2 = 0.1 * jax.random.normal(k[5], (d,))
    want = jax.jit(reference)(xn, r, w1, b1, w2, b2)
    flops = 2 * 2 * n * d * hidden
    results = {"xla": timed(jax.jit(reference), xn, r, w1, b1, w2, b2)} if not args.interpret else {}
    for config in args.configs:
        first, bh, st, smem, *extra = config.split(",")
        common = dict(block_hidden=int(bh), stages=int(st), a_in_smem=bool(int(smem)) or args.interpret,
                      interpret=args.interpret)
        defaults = ["0", "0", "1"]
        approx, lean, parts = (int(v) for v in extra + defaults[len(extra):])
        if first.startswith("ws"):
            f = jax.jit(functools.partial(mlp_core_ws, wgs=int(first[2:]), approx=bool(approx), lean=bool(lean),
                                          **common))
        else:
            f = jax.jit(functools.partial(mlp_core, block_rows=int(first), approx=bool(approx), lean=bool(lean),
                                          parts=parts, **common))
        try:
            got = f(xn, r, w1, b1, w2, b2)
        except Exception as e:  # a probe: report the config's failure and go on
            print(f"mosaic {config}: failed: {type(e).__name__}: {str(e)[:400]}")
            continue
        err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
        print(f"mosaic {config}: max |err| vs XLA {err:.3g}")
        if not args.interpret:
            results[f"mosaic {config}"] = timed(f, xn, r, w1, b1, w2, b2)
    # The whole forward (projection, residual, LayerNorm, MLP) against the Triton kernel.
    from jaxrl_mgpu.nets import fused_mlp
    x = jax.random.normal(k[0], (n, d), jnp.bfloat16)
    wo, bo = jax.random.normal(k[1], (d, d)) / math.sqrt(d), 0.1 * jax.random.normal(k[2], (d,))
    scale, bias = 1.0 + 0.1 * jax.random.normal(k[3], (d,)), 0.1 * jax.random.normal(k[4], (d,))
    full = (x, r, wo, bo, scale, bias, w1.astype(jnp.float32), b1, w2.astype(jnp.float32), b2)
    want = jax.jit(reference_full)(*full)
    for stages in args.full_stages:
        f = jax.jit(functools.partial(mlp_full, stages=stages, interpret=args.interpret))
        try:
            got = f(*full)
        except Exception as e:
            print(f"mosaic full forward, {stages} stage(s): failed: {type(e).__name__}: {str(e)[:400]}")
            continue
        err = float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
        print(f"mosaic full forward, {stages} stage(s): max |err| vs XLA {err:.3g}")
        if not args.interpret:
            results[f"mosaic full forward, {stages} stage(s)"] = timed(f, *full)
    if not args.interpret:
        triton = jax.jit(fused_mlp.finish_block)
        err = float(jnp.max(jnp.abs(triton(*full).astype(jnp.float32) - want.astype(jnp.float32))))
        print(f"triton full forward: max |err| vs XLA {err:.3g}")
        results["triton full forward"] = timed(triton, *full)
        results["xla full forward"] = timed(jax.jit(reference_full), *full)
        for name, seconds in results.items():
            print(f"{name:45s} {seconds * 1e6:8.1f} us  {flops / seconds / 1e12:6.1f} TFLOP/s (MLP matmuls)")

if __name__ == "__main__":
    main()
