"""LayerNorm, QKV projection, rotary embedding and causal windowed attention of short sequences:
the first half of a pre-norm transformer block, up to the output projection, in Pallas (Triton).

In-context RL trains narrow transformers on short windows (Algorithm Distillation: d_model 128,
80 tokens, 4 heads of 32). There XLA runs the first half of a block as a LayerNorm (two passes
over x), the QKV matmul, a separate pass to add its bias, and attention, and cuDNN's flash
attention, built to stream long sequences through 64 x 64 tiles, runs far below the memory
traffic its inputs need; the backward pass adds the bias gradient's pass over dqkv and several
LayerNorm passes. Here, three kernels:

1. forward, one program per (sequence, head): loads the sequence's x, normalises it, projects
   the head's q, k and v (matmuls against that head's columns of w, in registers), rotates q
   and k (RoPE), computes the masked scores and their softmax (in base 2: the score scale
   times log2(e) is folded into q, so each score costs one ex2 instruction, in bf16 / fp16 half
   of one), and writes the
   head's o in the [B, L, H, Dh] layout the output projection reads, and the softmax's
   log2-sum-exp2; the head-0 program also writes x normalised (for the backward pass). Nothing
   QKV-wide reaches HBM.
2. backward, one program per (head, two sequences; one when B is odd), which it takes in turn
   in a software-pipelined loop: recomputes q, k, v from x normalised and P from the log2-sum-exp2, takes the
   softmax's row sums of P dP as dO . O (FlashAttention's trick), and writes the gradient of the
   head's raw projection, dqkv [B, L, 3, H, Dh] (for the weight gradient, one XLA matmul
   x_norm^T @ dqkv, and for kernel 3).
3. input gradient, one program per block of rows: dx = LayerNorm backward of dqkv @ w^T plus the
   residual stream's gradient (see `attend`: x is returned, so that gradient arrives here
   instead of in a separate XLA pass); the LayerNorm's and the bias' gradients as fp32 partial
   sums.

A sequence is cut into power-of-2 row blocks (80 tokens: 64 + 16) rather than padded to one
power-of-2 tile, and only block pairs with an allowed score are computed (causality drops the
pairs above the diagonal, a short window the far ones).

    attend(x, ln_scale, ln_bias, w, b, cos, sin, seg, valid, window, n_heads, warps=WARPS,
           interpret=False, max_block=MAX_BLOCK) -> (o [B, L, H, Dh], x)

x [B, L, D] (compute dtype); ln_scale, ln_bias [D], w [D, 3 D], b [3 D] float32, as flax's
`nn.LayerNorm(dtype=cd)` and `nn.Dense(3 D, dtype=cd)` hold them (the Dense output read as
[..., 3, H, Dh]: q, k, v). seg [B, L] int (episode of each token) and valid [B, L] bool may be
None (no such mask). `cos`/`sin` [L, Dh / 2] are the rotary tables of positions 0..L-1.

Masking, as in `TransformerActorCritic.__call__` with no cache: a query i sees key j when
j <= i, i - j < window, key j is valid, and both are in the same segment (episode); and always
itself.

Pallas lowers this to Triton on NVIDIA GPUs; elsewhere (CPU tests) `interpret=True` runs the
same kernel bodies through XLA. Measurements: experiments/RESULTS.md.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxrl_mgpu.nets.pallas_util import (dot, index, layer_norm, layer_norm_backward, layer_norm_reference,
                                         partial_sum, ptx_approx, row_block, row_mask, standardize)

MAX_LEN = 128  # longest sequence: its keys' gradients stay in registers across the query blocks
               # (longer, they spill to local memory and the kernel falls behind cuDNN's)
MAX_D_MODEL = 128  # a program holds the sequence's normalised x [L, D] in registers
MASKED = -0.7 * float(np.finfo(np.float32).max)
WARPS = (4, 4, 4)  # warps per program of the forward, backward and input-gradient kernels
INPUT_ROWS = 64  # rows per program of the input-gradient kernel
INPUT_STAGES = 2  # its pipeline depth over q, k, v (unrolled or 3 deep: slower)
MAX_BLOCK = 64  # rows per query / key block
LOG2E = float(np.log2(np.e))
# Sequences per backward program, a loop that Triton software-pipelines: the next sequence's
# loads are under way while this one's matmuls run. Two beat one and four; the forward pass
# is not looped (the same loop there is slower).
BACKWARD_SEQUENCES = 2
BACKWARD_STAGES = 2  # that loop's pipeline depth (1 and 3: slower)


def supported(seq_len: int, head_dim: int, d_model: int) -> bool:
    return (seq_len <= MAX_LEN and head_dim % 32 == 0 and head_dim <= 128 and 16 <= d_model <= MAX_D_MODEL
            and d_model & (d_model - 1) == 0)


def _blocks(seq_len: int, max_block: int = MAX_BLOCK) -> tuple[tuple[int, int], ...]:
    """Static (start, rows) blocks that cover tokens 0..seq_len-1. Triton wants power-of-2 tiles
    of at least 16 rows; cut into such blocks, largest first, rather than padded to one
    power-of-2 tile, an 80-token window computes 64^2 + 16 * 64 + 16^2 = 5,376 scores instead of
    16,384 (causality drops every block pair above the diagonal). The attention alone gains
    from it at 128 tokens (64 + 64 rows) rather than at 80, and the blocks of 64 rows suit the
    projection matmuls of the fused kernels. A tail is rounded up to a power of 2 where that
    pads fewer than 16 rows."""
    blocks, start = [], 0
    while start < seq_len:
        left = seq_len - start
        up = max(16, pl.next_power_of_2(left))
        size = up if up - left < 16 and up <= max_block else min(max_block, 1 << (left.bit_length() - 1))
        blocks.append((start, size))
        start += size
    return tuple(blocks)


def _tile(seq_len: int, max_block: int = MAX_BLOCK) -> int:
    """Rows of the block of the [B, L, ...] arrays a program is handed (a power of 2, as Pallas
    wants): enough for every query block; rows past L are masked."""
    start, size = _blocks(seq_len, max_block)[-1]
    return pl.next_power_of_2(start + size)


def _pairs(blocks, window):
    """(query block, key block) index pairs that hold any allowed score: causal, so key blocks
    up to the query block's own, and none whose every key is `window` or more steps back."""
    return tuple((qi, ki) for qi, (qs, _) in enumerate(blocks) for ki, (ks, kn) in enumerate(blocks)
                 if ki <= qi and qs - (ks + kn - 1) < window)


def _row_block(ref, start, size, seq_len, index_rest):
    """ref[start:start + size, *index_rest] and the mask of its rows before seq_len (None when
    they all are), shaped to broadcast against it."""
    block = ref.at[(pl.ds(start, size),) + index_rest]
    if start + size <= seq_len:
        return block, None
    rows = start + jnp.arange(size) < seq_len
    return block, rows.reshape((size,) + (1,) * (len(block.shape) - 1))


def _load(ref, start, size, seq_len, index_rest=(), other=0, dtype=None):
    """Rows start..start+size-1 of a ref (leading axis); rows at or past seq_len read as `other`."""
    block, mask = _row_block(ref, start, size, seq_len, index_rest)
    x = plgpu.load(block) if mask is None else plgpu.load(block, mask=mask, other=other)
    return x if dtype is None else x.astype(dtype)


def _store(ref, start, value, seq_len, index_rest=()):
    block, mask = _row_block(ref, start, value.shape[0], seq_len, index_rest)
    plgpu.store(block, value, mask=mask)


class _Rows:
    """One block of rows of a program's sequence: x normalised (compute dtype), the rotary
    tables (fp32) and the mask inputs."""

    def __init__(self, xn, refs, start, size, seq_len):
        cos_ref, sin_ref, seg_ref, valid_ref = refs
        self.start, self.size, self.xn = start, size, xn
        load = functools.partial(_load, start=start, size=size, seq_len=seq_len)
        self.cos = load(cos_ref, dtype=jnp.float32)
        self.sin = load(sin_ref, dtype=jnp.float32)
        self.seg = None if seg_ref is None else load(seg_ref, other=-1)
        self.valid = None if valid_ref is None else load(valid_ref) != 0

    def unrotate(self, r1, r2):
        """Gradient wrt the rotated halves -> wrt the raw ones (the rotation's transpose)."""
        return r1 * self.cos + r2 * self.sin, r2 * self.cos - r1 * self.sin


def _exp2(x, fast, dtype):
    """2^x (x <= 0 here: scores less their row's maximum or log2-sum-exp2), fp32. The softmax
    runs in base 2 (log2(e) folded into q with the score scale), so on GPUs (`fast`) a score
    costs one special-function op, ex2.approx.f32 (relative error ~2^-22), and with a 16-bit
    compute dtype half of one: ex2.approx.f16x2 takes two scores rounded to fp16. That error
    (under 6e-4 absolute) is under a third of the rounding of P to bf16 for the P V matmul (up
    to 2e-3), so halving the special-function work loses nothing that the P V matmul keeps."""
    if not fast:
        return jnp.exp2(x)
    return ptx_approx("ex2.approx.f16x2" if jnp.dtype(dtype).itemsize == 2 else "ex2.approx.f32", x)


def _halves(head_dim):
    half = head_dim // 2
    return slice(None, half), slice(half, None)


def _project(r: _Rows, w_ref, b_ref, dtype, q_scale):
    """The program's head's rotated q (times q_scale) and k (two [rows, Dh/2] halves each) and v
    of a row block, in the compute dtype: x_norm @ w[:, part] + b[part] (w_ref [D, 3, Dh],
    b_ref [3, Dh])."""
    def part(p, cols):
        return dot(r.xn, w_ref[:, index(p), cols]) + b_ref[index(p), cols].astype(jnp.float32)[None, :]

    rotated = []
    for p, scale in ((0, q_scale), (1, 1.0)):
        x1, x2 = (part(p, cols) for cols in _halves(w_ref.shape[-1]))
        rotated.append((((x1 * r.cos - x2 * r.sin) * scale).astype(dtype),
                        ((x2 * r.cos + x1 * r.sin) * scale).astype(dtype)))
    return rotated[0], rotated[1], part(2, slice(None)).astype(dtype)


def _scores(qr: _Rows, q, kr: _Rows, k, *, seq_len, window):
    """Masked scores [q rows, k rows] fp32 of one block pair (q carries the scale). Which
    conditions a pair needs is known statically: only diagonal blocks need causality, only
    far-apart ones the window."""
    s = dot(q[0], k[0], trans_b=True) + dot(q[1], k[1], trans_b=True)
    i = qr.start + jnp.arange(qr.size)[:, None]
    j = kr.start + jnp.arange(kr.size)[None, :]
    conds = []
    if kr.start + kr.size - 1 > qr.start:
        conds.append(j <= i)
    if qr.start + qr.size - 1 - kr.start >= window:
        conds.append(i - j < window)
    if kr.start + kr.size > seq_len:
        conds.append(j < seq_len)
    if qr.seg is not None:
        conds.append(qr.seg[:, None] == kr.seg[None, :])
    if kr.valid is not None:
        conds.append(kr.valid[None, :])
    if not conds:
        return s
    allowed = functools.reduce(jnp.logical_and, conds)
    if qr.start == kr.start:
        allowed |= i == j  # a token always sees itself (keeps rows of padding tokens finite)
    return jnp.where(allowed, s, MASKED)


def _mask_refs(rest, masks):
    seg_ref = rest[0] if masks[0] else None
    valid_ref = rest[int(masks[0])] if masks[1] else None
    return seg_ref, valid_ref, rest[sum(masks):]


def _sequence(xn_of, cos_ref, sin_ref, seg_ref, valid_ref, *, seq_len, max_block):
    """The program's sequence in row blocks; xn_of(start, size) gives a block's normalised x."""
    refs = (cos_ref, sin_ref, seg_ref, valid_ref)
    return [_Rows(xn_of(start, size), refs, start, size, seq_len) for start, size in _blocks(seq_len, max_block)]


def _forward_kernel(x_ref, scale_ref, bias_ref, w_ref, b_ref, cos_ref, sin_ref, *rest, seq_len,
                    window, scale, masks, max_block, fast, head):
    """Program (sequence, head): LN, the head's projection, RoPE, attention; o [T, Dh] and the
    log2-sum-exp2 [T]; the head-0 program also writes x normalised [T, D]."""
    seg_ref, valid_ref, (o_ref, lse_ref, xn_ref) = _mask_refs(rest, masks)
    dtype = o_ref.dtype

    def normalise(start, size):
        return layer_norm(_load(x_ref, start, size, seq_len, dtype=jnp.float32), scale_ref, bias_ref, dtype)

    rows = _sequence(normalise, cos_ref, sin_ref, seg_ref, valid_ref, seq_len=seq_len, max_block=max_block)

    @pl.when(head == 0)  # the head-0 program
    def _():
        for r in rows:
            _store(xn_ref, r.start, r.xn, seq_len)

    pairs = _pairs([(r.start, r.size) for r in rows], window)
    qkv = [_project(r, w_ref, b_ref, dtype, scale * LOG2E) for r in rows]  # scores in base 2
    for qi, r in enumerate(rows):
        keys = [ki for q, ki in pairs if q == qi]
        scores = [_scores(r, qkv[qi][0], rows[ki], qkv[ki][1], seq_len=seq_len, window=window) for ki in keys]
        m = functools.reduce(jnp.maximum, [jnp.max(s, axis=1) for s in scores])[:, None]
        probs = [_exp2(s - m, fast, dtype) for s in scores]
        total = sum(jnp.sum(p, axis=1) for p in probs)[:, None]
        # Normalised after P @ V: [rows, Dh] divisions instead of [rows, keys].
        o = sum(dot(p.astype(dtype), qkv[ki][2]) for p, ki in zip(probs, keys)) / total
        _store(o_ref, r.start, o.astype(dtype), seq_len)
        # log2-sum-exp2 per row: the backward pass rebuilds P without the reductions.
        lse_ref[pl.ds(r.start, r.size)] = (m + jnp.log2(total))[:, 0]


def _backward_kernel(xn_ref, w_ref, b_ref, cos_ref, sin_ref, *rest, seq_len, window, scale, masks,
                     max_block, fast, head):
    """Program (sequence, head) (_call loops it over the program's sequences): recomputes the
    head's q, k, v from x normalised and P from the log2-sum-exp2; reads o for the row sums;
    writes the gradient of the head's raw projection, dqkv [T, 3, Dh]."""
    del head  # only the forward kernel needs it
    seg_ref, valid_ref, (lse_ref, do_ref, o_ref, dqkv_ref) = _mask_refs(rest, masks)
    dtype = dqkv_ref.dtype
    rows = _sequence(lambda start, size: _load(xn_ref, start, size, seq_len), cos_ref, sin_ref,
                     seg_ref, valid_ref, seq_len=seq_len, max_block=max_block)
    pairs = _pairs([(r.start, r.size) for r in rows], window)
    head_dim = w_ref.shape[-1]
    half = head_dim // 2
    zeros = lambda r, n: jnp.zeros((r.size, n), jnp.float32)
    # q carries scale * log2(e) (scores in base 2, as in the forward pass); the gradients wrt
    # the natural-log scores, dS, then give dq = scale * dS k and dk = scale * dS^T q, i.e.
    # dS^T q_carried / log2(e); those factors are applied once per block, not once per score.
    qkv = [_project(r, w_ref, b_ref, dtype, scale * LOG2E) for r in rows]
    # Gradients wrt the rotated q and k halves and v; the keys' accumulate over query blocks.
    dk = [[zeros(r, half)] * 2 for r in rows]
    dv = [zeros(r, head_dim) for r in rows]
    for qi, r in enumerate(rows):
        key_ids = [ki for q, ki in pairs if q == qi]
        do = _load(do_ref, r.start, r.size, seq_len)  # padding rows read 0: they add nothing
        lse = lse_ref[pl.ds(r.start, r.size)][:, None]
        # sum_j P_ij dP_ij = dO_i . O_i: [rows, Dh] work instead of [rows, keys].
        delta = jnp.sum(do.astype(jnp.float32) * _load(o_ref, r.start, r.size, seq_len, dtype=jnp.float32),
                        axis=1)[:, None]
        dq = [zeros(r, half)] * 2
        for ki in key_ids:
            p = _exp2(_scores(r, qkv[qi][0], rows[ki], qkv[ki][1], seq_len=seq_len, window=window) - lse, fast,
                      dtype)
            ds = (p * (dot(do, qkv[ki][2], trans_b=True) - delta)).astype(dtype)
            dq = [dq[c] + dot(ds, qkv[ki][1][c]) for c in (0, 1)]
            dk[ki] = [dk[ki][c] + dot(ds, qkv[qi][0][c], trans_a=True) for c in (0, 1)]
            dv[ki] = dv[ki] + dot(p.astype(dtype), do, trans_a=True)
        _store_unrotated(dqkv_ref, 0, r, [g * scale for g in dq], seq_len)
    for r, d, g in zip(rows, dk, dv):
        _store_unrotated(dqkv_ref, 1, r, [g / LOG2E for g in d], seq_len)
        _store(dqkv_ref, r.start, g.astype(dtype), seq_len, (index(2),))


def _store_unrotated(dqkv_ref, part, r: _Rows, grad, seq_len):
    """The gradient wrt rotated q or k halves, stored as the gradient wrt the raw projection."""
    for cols, g in zip(_halves(dqkv_ref.shape[-1]), r.unrotate(*grad)):
        _store(dqkv_ref, r.start, g.astype(dqkv_ref.dtype), seq_len, (index(part), cols))


def _input_backward_kernel(x_ref, scale_ref, w_ref, dqkv_ref, dres_ref, dx_ref, sums_ref, *, n_rows):
    """Program (block of rows of the flattened [N, ...] arrays): dxn = dqkv @ w^T, then the
    LayerNorm backward plus the residual stream's gradient, dx; partial sums of the LayerNorm's
    and the projection bias' gradients, in one output [d ln_scale, d ln_bias, db_q, db_k, db_v]
    (XLA adds them up in one pass)."""
    block_rows, d_model = x_ref.shape
    rows = row_mask(pl.program_id(0) * block_rows, block_rows, n_rows)

    # A loop over q, k and v rather than three unrolled steps, so that Triton pipelines it
    # (INPUT_STAGES): the next part of dqkv is on its way while this one's matmul runs.
    def add_part(p, dxn):
        g = plgpu.load(dqkv_ref.at[:, p, :], mask=rows, other=0)  # [rows, D]
        sums_ref[2 + p, :] = jnp.sum(g.astype(jnp.float32), axis=0)
        return dxn + dot(g, w_ref[:, p, :], trans_b=True)

    dxn = jax.lax.fori_loop(0, 3, add_part, jnp.zeros((block_rows, d_model), jnp.float32))
    xhat, rstd = standardize(plgpu.load(x_ref, mask=rows, other=0).astype(jnp.float32))
    dres = plgpu.load(dres_ref, mask=rows, other=0).astype(jnp.float32)
    dx = dres + layer_norm_backward(dxn, xhat, rstd, scale_ref[...][None, :])
    plgpu.store(dx_ref, dx.astype(dx_ref.dtype), mask=rows)
    sums_ref[0, :] = jnp.sum(dxn * xhat, axis=0)
    sums_ref[1, :] = jnp.sum(dxn, axis=0)


class _SequenceRef:
    """Sequence s of a ref that holds a program's several sequences [S, ...], for the kernel
    bodies, which are written for one. Every access becomes one indexer on the whole ref:
    Pallas's Triton lowering takes no chain of them (ref.at[s].at[...])."""

    def __init__(self, ref, s):
        self.ref, self.s = ref, s
        self.shape, self.dtype = ref.shape[1:], ref.dtype

    def _full(self, idx):
        return (self.s,) + (idx if isinstance(idx, tuple) else (idx,))

    @property
    def at(self):  # self.at[idx] is ref.at[s, idx], as ref.at[idx] gives views
        return _SequenceViews(self)

    def __getitem__(self, idx):
        return self.ref[self._full(idx)]

    def __setitem__(self, idx, value):
        self.ref[self._full(idx)] = value


class _SequenceViews:
    def __init__(self, seq: _SequenceRef):
        self._seq = seq

    def __getitem__(self, idx):
        return self._seq.ref.at[self._seq._full(idx)]


def _call(kernel, spec, leading, cos, sin, seg, valid, trailing, out_shape, out_specs, *, seq_len, n_heads,
          window, num_warps, num_stages, max_block, interpret):
    """Grid (head, block of spec.seqs sequences): the first grid axis varies fastest in launch
    order, so the programs of a sequence's heads run side by side and its x (or x normalised)
    comes from L2 for all but the first (sequence-major, every head would re-read it from
    HBM). A program with several sequences runs the kernel body on each in turn, a loop
    pipelined num_stages deep. leading / trailing: (array, BlockSpec) inputs before the rotary
    tables and after the masks; spec: the _Specs they come from."""
    T = _tile(seq_len, max_block)
    half = cos.shape[-1]
    tables = [(t, pl.BlockSpec((T, half), lambda h, b: (0, 0))) for t in (cos, sin)]
    masks = [(m.astype(jnp.int32), spec.per_sequence((T,), lambda h, b: (b, 0)))
             for m in (seg, valid) if m is not None]
    inputs = list(leading) + tables + masks + list(trailing)
    outs = out_specs if isinstance(out_specs, list) else [out_specs]
    looped = [spec.is_per_sequence(s) for s in [s for _, s in inputs] + outs]
    kernel_body = functools.partial(kernel, seq_len=seq_len, window=window, scale=1.0 / np.sqrt(2 * half),
                                    masks=(seg is not None, valid is not None), max_block=max_block,
                                    fast=not interpret)

    def body(*refs):
        head = pl.program_id(0)  # read outside the loop: the interpreter finds none inside it
        if spec.seqs == 1:
            return kernel_body(*refs, head=head)

        def one_sequence(s, carry):
            kernel_body(*[_SequenceRef(r, s) if per_seq else r for r, per_seq in zip(refs, looped)], head=head)
            return carry
        jax.lax.fori_loop(0, spec.seqs, one_sequence, 0)

    return pl.pallas_call(
        body, grid=(n_heads, leading[0][0].shape[0] // spec.seqs), in_specs=[s for _, s in inputs],
        out_specs=out_specs, out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret, name=kernel.__name__.strip("_"))(*[a for a, _ in inputs])


class _Specs:
    """BlockSpecs of grid (head h, block b of `seqs` sequences) for the arrays of one call."""

    def __init__(self, seq_len, d_model, head_dim, max_block, seqs):
        T, D, Dh = _tile(seq_len, max_block), d_model, head_dim
        self.seqs, self._per_sequence = seqs, []
        self.rows = self.per_sequence((T, D), lambda h, b: (b, 0, 0))                   # [B, L, D]
        self.vector = pl.BlockSpec((D,), lambda h, b: (0,))                             # [D]
        self.w = pl.BlockSpec((D, 3, None, Dh), lambda h, b: (0, 0, h, 0))              # [D, 3, H, Dh]
        self.b = pl.BlockSpec((3, None, Dh), lambda h, b: (0, h, 0))                    # [3, H, Dh]
        self.head = self.per_sequence((T, None, Dh), lambda h, b: (b, 0, h, 0))         # [B, L, H, Dh]
        self.lse = self.per_sequence((None, T), lambda h, b: (b, h, 0))                 # [B, H, T]
        self.qkv = self.per_sequence((T, 3, None, Dh), lambda h, b: (b, 0, 0, h, 0))    # [B, L, 3, H, Dh]

    def per_sequence(self, block, index_map):
        """A spec over [B, ...] arrays: the program's sequences (squeezed when it has one)."""
        spec = pl.BlockSpec((None if self.seqs == 1 else self.seqs,) + block, index_map)
        self._per_sequence.append(spec)
        return spec

    def is_per_sequence(self, spec):
        return any(spec is s for s in self._per_sequence)


def _in_compute_dtype(x, w, b, n_heads):
    """w, b as nn.Dense(dtype=x.dtype) uses them, shaped [D, 3, H, Dh] and [3, H, Dh]; cast once,
    outside the kernels, so every program reads half the bytes (bf16)."""
    D = w.shape[0]
    return w.astype(x.dtype).reshape(D, 3, n_heads, -1), b.astype(x.dtype).reshape(3, n_heads, -1)


def _forward(x, ln_scale, ln_bias, w, b, cos, sin, seg, valid, window, n_heads, warps, interpret,
             max_block):
    """o [B, L, H, Dh], the softmax's log2-sum-exp2 [B, H, tile] fp32 (rows past L: padding) and
    x normalised [B, L, D]."""
    B, L, D = x.shape
    if w.shape != (D, 3 * D) or b.shape != (3 * D,) or ln_scale.shape != (D,) or ln_bias.shape != (D,):
        raise ValueError(f"fused attention: x {x.shape} needs ln_scale, ln_bias [{D}], w [{D}, {3 * D}] "
                         f"and b [{3 * D}], got {ln_scale.shape}, {ln_bias.shape}, {w.shape}, {b.shape}")
    Dh = D // n_heads
    if not supported(L, Dh, D) or Dh * n_heads != D:
        raise ValueError(f"fused attention needs sequences <= {MAX_LEN}, d_model a power of 2 from 16 to "
                         f"{MAX_D_MODEL} and a head dim that is a multiple of 32 up to 128, got length "
                         f"{L}, d_model {D}, head dim {D / n_heads:g}")
    w4, b3 = _in_compute_dtype(x, w, b, n_heads)
    spec = _Specs(L, D, Dh, max_block, seqs=1)
    return _call(_forward_kernel, spec, [(x, spec.rows), (ln_scale, spec.vector), (ln_bias, spec.vector),
                                   (w4, spec.w), (b3, spec.b)], cos, sin, seg, valid, [],
                 [jax.ShapeDtypeStruct((B, L, n_heads, Dh), x.dtype),
                  jax.ShapeDtypeStruct((B, n_heads, _tile(L, max_block)), jnp.float32),
                  jax.ShapeDtypeStruct(x.shape, x.dtype)],
                 [spec.head, spec.lse, spec.rows], seq_len=L, n_heads=n_heads, window=window,
                 num_warps=warps[0], num_stages=1, max_block=max_block, interpret=interpret)


def _input_backward(x, ln_scale, w, dqkv, dres, *, block_rows, num_warps, interpret):
    """dx and the LayerNorm's and projection bias' gradients from dqkv and the residual stream's
    gradient dres (_input_backward_kernel); w [D, 3, D] in the compute dtype."""
    B, L, D = x.shape
    n = B * L
    blocks = pl.cdiv(n, block_rows)
    rows = functools.partial(row_block, block_rows)
    dx, partials = pl.pallas_call(
        functools.partial(_input_backward_kernel, n_rows=n), grid=(blocks,),
        in_specs=[rows(D), pl.BlockSpec((D,), lambda i: (0,)),
                  pl.BlockSpec((D, 3, D), lambda i: (0, 0, 0)), rows(3, D), rows(D)],
        out_specs=[rows(D), partial_sum(5, D)],
        out_shape=[jax.ShapeDtypeStruct((n, D), x.dtype), jax.ShapeDtypeStruct((blocks, 5, D), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=INPUT_STAGES),
        interpret=interpret, name="input_backward_kernel",
    )(x.reshape(n, D), ln_scale, w, dqkv.reshape(n, 3, D),
      dres.astype(x.dtype).reshape(n, D))
    sums = partials.sum(0)
    return dx.reshape(x.shape), sums[0], sums[1], sums[2:].reshape(3 * D)


@functools.partial(jax.custom_vjp, nondiff_argnums=(9, 10, 11, 12, 13))
def attend(x, ln_scale, ln_bias, w, b, cos, sin, seg, valid, window: int, n_heads: int,
           warps: tuple[int, int, int] = WARPS, interpret: bool = False, max_block: int = MAX_BLOCK):
    """LayerNorm -> QKV projection -> RoPE -> masked softmax attention: returns (o, x). x comes
    back unchanged so that the caller continues the residual stream with it: its gradient then
    arrives here and the input-gradient kernel adds it to dx (no separate pass over [N, D]).
    See the module docstring. `warps`: warps per program of the forward, backward and
    input-gradient kernels; `max_block`: the largest query / key block (a power of 2, >= 16)."""
    return _forward(x, ln_scale, ln_bias, w, b, cos, sin, seg, valid, window, n_heads, warps,
                    interpret, max_block)[0], x


def _attend_fwd(x, ln_scale, ln_bias, w, b, cos, sin, seg, valid, window, n_heads, warps, interpret,
                max_block):
    o, lse, xn = _forward(x, ln_scale, ln_bias, w, b, cos, sin, seg, valid, window, n_heads, warps,
                          interpret, max_block)
    return (o, x), (x, ln_scale, w, b, cos, sin, seg, valid, o, lse, xn)


def _attend_bwd(window, n_heads, warps, interpret, max_block, residuals, cotangents):
    do, dres = cotangents
    x, ln_scale, w, b, cos, sin, seg, valid, o, lse, xn = residuals
    B, L, D = x.shape
    w4, b3 = _in_compute_dtype(x, w, b, n_heads)
    # As many sequences a program as BACKWARD_SEQUENCES and B allow (B odd: one).
    seqs = int(np.gcd(B, BACKWARD_SEQUENCES))
    spec = _Specs(L, D, D // n_heads, max_block, seqs)
    dqkv = _call(_backward_kernel, spec, [(xn, spec.rows), (w4, spec.w), (b3, spec.b)], cos, sin, seg, valid,
                 [(lse, spec.lse), (do.astype(x.dtype), spec.head), (o, spec.head)],
                 jax.ShapeDtypeStruct((B, L, 3, n_heads, D // n_heads), x.dtype), spec.qkv,
                 seq_len=L, n_heads=n_heads, window=window, num_warps=warps[1],
                 num_stages=1 if seqs == 1 else BACKWARD_STAGES, max_block=max_block, interpret=interpret)
    dx, dscale, dbias, db = _input_backward(x, ln_scale, w4.reshape(D, 3, D), dqkv, dres,
                                            block_rows=INPUT_ROWS, num_warps=warps[2], interpret=interpret)
    # The projection's weight gradient: one matmul over every token, fp32 out.
    dw = jax.lax.dot_general(xn.reshape(B * L, D), dqkv.reshape(B * L, 3 * D), (((0,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)
    # The tables are constants of the position (no gradient); masks are not differentiable.
    zero = lambda m: None if m is None else np.zeros(m.shape, jax.dtypes.float0)
    return (dx, dscale, dbias, dw, db, jnp.zeros_like(cos), jnp.zeros_like(sin), zero(seg), zero(valid))


attend.defvjp(_attend_fwd, _attend_bwd)


def reference(x, ln_scale, ln_bias, w, b, n_heads):
    """The projection the kernels fuse, as flax's modules compute it: [B, L, D] -> qkv [B, L, 3, H, Dh]
    (unrotated; attention as in TransformerActorCritic follows). For tests."""
    cd = x.dtype
    qkv = jnp.dot(layer_norm_reference(x, ln_scale, ln_bias), w.astype(cd)) + b.astype(cd)
    return qkv.reshape(x.shape[:2] + (3, n_heads, -1))
