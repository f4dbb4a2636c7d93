"""Causal, pre-norm, decoder-only transformer actor-critic for in-context RL (AMAGO / AD style).

One token per environment step, built from the observation, the PREVIOUS action (one-hot) and the
PREVIOUS reward, both zeroed at an episode start, plus an is-first flag. Every layer attends
causally to at most the last `context_len` tokens (itself and `context_len - 1` earlier ones),
and by default only to tokens of its own episode; `context_across_episodes=True` lets the window
cross episode boundaries (meta-RL / Algorithm Distillation).

Two paths, one set of parameters (`model.init(key, None, obs, prev_action, prev_reward, is_first)`):

    model.init_cache(B)                                  -> KVCache     (plain arrays, batch-first)
    model.apply(params, cache, obs, prev_action, prev_reward, is_first, valid=None)
        learner: inputs [B, L, ...]              -> logits [B, L, A] f32, values [B, L] f32, KVCache
    model.apply(params, cache, obs, prev_action, prev_reward, is_first, method=model.step)
        actor:   inputs [B, ...] (one step)      -> logits [B, A] f32,    values [B] f32,    KVCache

The contract (tested): `__call__(cache, xs)` equals scanning `step` over xs starting from `cache`
(outputs and the returned cache). `cache=None` means "no earlier context" (same as
`init_cache(B)`, but cheaper: no prefix keys, and lets a fused kernel use causal/window masks).

What the actor saw, and what a learner must store to recompute it exactly
-------------------------------------------------------------------------
Attention is windowed PER LAYER (as in Mistral): layer l of token t reads layer l-1 of tokens
t-C+1..t, so the output at t depends on raw tokens up to n_layers * (C - 1) steps back (C =
context_len). The acting path caches every layer's keys/values of the last C tokens, which is
what makes a step cost one token's projections plus attention over C cached entries. Hence the
last C-1 RAW tokens are not enough to recompute a multi-layer actor; two exact ways:

  1. (cheap, recommended) Keep the actor's `KVCache` from the start of the rollout (per env:
     n_layers x C x 2 x d_model entries in the compute dtype, plus `valid` [C] and `pos`) and the
     T rollout inputs (obs, prev_action, prev_reward, is_first). Then
         logits, values, _ = model.apply(params, cache0, obs, prev_action, prev_reward, is_first)
     with the rollout inputs batch-first [E, T, ...] reproduces every rollout step's logits and
     value under the rollout's params. The prefix keys/values are inputs, not functions of the
     params, so no gradient flows into them (Transformer-XL style memory); after the first
     gradient step they are those of the rollout's params, the T rollout tokens are fully
     recomputed. Slice the cache with the minibatch's env indices (`jax.tree.map(lambda x:
     x[idx], cache0)`): every leaf is batch-first.
  2. (exact with gradients through the history, costlier) Keep the raw inputs of the last
     n_layers * (C - 1) steps before the rollout; call with `cache=None` on history + rollout,
     marking not-yet-existing history steps (before training started) with `valid=False`, and
     drop the first n_layers * (C - 1) outputs.

Position encoding: rotary (RoPE) on queries and keys, at the token's absolute step index `pos`,
with phases computed in exact integer arithmetic modulo 2**16 (each frequency is quantized to an
integer number of turns per 2**16 steps). Attention scores then depend only on the distance
between tokens (< C <= 2**16, so unambiguous), the phase of a given step is bit-identical
whether computed one step at a time (acting) or over a sequence (learner), it does not lose
precision after millions of steps (a float `pos * freq` would), and it needs no bias tensor, so
it does not get in the way of a fused attention kernel. A learned embedding of the step since
the episode start clipped to C-1 would also be exact, but saturates: in episodes longer than
~2C every token in the window gets the same embedding. The is-first flag in the token tells the
model where an episode starts (what matters with `context_across_episodes`).

Masks and the fused (cuDNN) attention path
------------------------------------------
`jax.nn.dot_product_attention(implementation=None)` currently always lowers to XLA (jax 0.10);
set `attn_implementation="cudnn"` to ask for cuDNN flash attention (bf16/fp16 only, head dim a
multiple of 8 and <= 256 on Hopper; it raises if unsupported). Structural masks cuDNN runs
natively, skipping masked tiles: `is_causal` (CAUSAL), `local_window_size=(C-1, 0)` with causal
(sliding window), `query_seq_lengths`/`key_value_seq_lengths` (padding). A boolean `mask` does
NOT block cuDNN, but jax turns it into an additive bias [B, 1, T, S] that the kernel reads
(memory O(B T S), no tile skipping, and training with a bias needs even T and S). The per-token
episode mask (default mode), per-token validity, and prefix-cache masks have no structural form
in `jax.nn.dot_product_attention` (cuDNN's packed-segment offsets are not exposed), so they go
through `mask`. This module passes `is_causal` + `local_window_size` whenever keys and queries
are the same sequence (`cache=None`), in addition to any mask (redundant for XLA, lets cuDNN skip
tiles); with `context_across_episodes=True`, `cache=None` and `valid=None` no mask is passed at
all, the fully fused case. With a prefix cache the keys are [ring buffer; new tokens], the ring
is not in time order and XLA's causal mask is top-left aligned, so only `mask` is used.
`attn_implementation="cudnn"` compiles to cuDNN fused attention, forward and backward, for
every form above (cache None or a prefix, either episode mode) and for `step`, and agrees with
XLA up to low-precision rounding.

Our own kernels (Pallas -> Triton; on other backends the Pallas interpreter runs them, for tests)
-------------------------------------------------------------------------------------------
`attn_implementation="pallas"`: where keys and queries are the same sequence (`cache=None`, the
AD learner), the first half of every block up to the output projection (LayerNorm 1, the QKV
projection, RoPE, every mask above and attention) runs in fused kernels that read x and write
the attention output (fused_attention.py; sequences up to 128 tokens, d_model a power of 2 up to
128); with a prefix cache and in `step` attention stays with XLA. `mlp_implementation="pallas"`:
the output projection -> residual -> LayerNorm 2 -> MLP -> residual, the second half of every
block, in fused kernels that keep the 4 x d_model activations on chip (the backward pass writes
only their gradient, once; fused_mlp.py; d_model a power of 2 up to 128), and the final LayerNorm with the actor and critic heads in one kernel each
way (fused_heads.py; up to 127 actions, else XLA), in every path. Both are for bf16/fp16 and
change no parameter. Measurements: experiments/RESULTS.md.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu.nets import fused_attention, fused_heads, fused_mlp, pallas_util
from jaxrl_mgpu.nets.mlp import Torso

ROPE_PERIOD = 2 ** 16  # RoPE phases are exact integers modulo this many steps


class KVCache(NamedTuple):
    """Acting state of a batch of environments; every leaf is batch-first.

    k, v:  n_layers arrays [B, C, H, Dh] (compute dtype), a ring buffer: the token with absolute
           index p lives in slot p % C. Keys are stored already rotated (RoPE).
    valid: [B, C] bool, the slot holds a token the next token may attend to (written, not
           padding, and, unless context_across_episodes, of the current episode). The ring holds
           exactly the last C tokens, so the window needs no bookkeeping of its own.
    pos:   [B] int32, tokens written so far, modulo C * 2**16 (which keeps both the ring slot
           and the RoPE phase consistent); the next token's index.
    """
    k: tuple
    v: tuple
    valid: jax.Array
    pos: jax.Array


def _rope_turns(head_dim: int, base: float = 10000.0) -> np.ndarray:
    """Standard RoPE frequencies base**(-2i/Dh) rad/step, quantized to whole turns per period."""
    freqs = base ** (-np.arange(0, head_dim, 2) / head_dim)
    return np.maximum(1, np.round(freqs * ROPE_PERIOD / (2 * np.pi))).astype(np.int32)


def rope_tables(pos: jax.Array, head_dim: int, dtype) -> tuple[jax.Array, jax.Array]:
    """cos, sin [..., Dh / 2] of the rotary phases of the absolute step indices pos (int32)."""
    turns = _rope_turns(head_dim)
    # (pos % 2**16) * turns < 2**16 * 10431 < 2**31: exact in int32, so identical on both paths.
    phase = ((pos % ROPE_PERIOD)[..., None] * turns) % ROPE_PERIOD
    angle = phase.astype(jnp.float32) * np.float32(2 * np.pi / ROPE_PERIOD)
    return jnp.cos(angle).astype(dtype), jnp.sin(angle).astype(dtype)


def rope(x: jax.Array, pos: jax.Array) -> jax.Array:
    """Rotate x [B, L, H, Dh] by the phases of the absolute step indices pos [B, L] (int32)."""
    # The rotation itself in x's dtype: in bf16 an fp32 round trip of q and k costs two more
    # passes over them per layer (forward and backward) and buys nothing the bf16 matmuls keep.
    cos, sin = (t[:, :, None, :] for t in rope_tables(pos, x.shape[-1], x.dtype))
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class Block(nn.Module):
    """Pre-norm block, split in two so the caller can put any key/value source in between:
    `qkv` (LN -> fused QKV Dense -> heads -> RoPE) and `finish` (out-proj + residual, LN -> MLP
    (4x, gelu) -> residual)."""
    d_model: int
    n_heads: int
    n_layers: int
    dtype: Any
    mlp_implementation: str | None = None

    def setup(self):
        dense = functools.partial(nn.Dense, dtype=self.dtype, param_dtype=jnp.float32,
                                  kernel_init=nn.initializers.normal(0.02))
        # GPT-2: residual projections scaled down with depth so the residual stream stays O(1).
        resid = nn.initializers.normal(0.02 / np.sqrt(2 * self.n_layers))
        self.ln1 = nn.LayerNorm(dtype=self.dtype, param_dtype=jnp.float32)
        self.qkv_proj = dense(3 * self.d_model)
        self.out_proj = dense(self.d_model, kernel_init=resid)
        self.ln2 = nn.LayerNorm(dtype=self.dtype, param_dtype=jnp.float32)
        self.fc = dense(4 * self.d_model)
        self.fc_out = dense(self.d_model, kernel_init=resid)

    def project(self, x):
        """Unrotated queries, keys and values [B, L, 3, H, Dh] (the fused kernel's input)."""
        B, L, _ = x.shape
        return self.qkv_proj(self.ln1(x)).reshape(B, L, 3, self.n_heads, -1)

    def qkv(self, x, pos):
        qkv = self.project(x)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [B, L, H, Dh] each
        return rope(q, pos), rope(k, pos), v

    def fused_attention(self, x, cos, sin, seg, valid, window):
        """LN 1 -> QKV projection -> RoPE -> attention in fused_attention.py's kernels, with this
        block's parameters (read from the submodules, which init creates the usual way). Returns
        (attention output, x): continue the residual stream with the x returned."""
        ln, proj = (m.variables["params"] for m in (self.ln1, self.qkv_proj))
        return fused_attention.attend(x, ln["scale"], ln["bias"], proj["kernel"], proj["bias"], cos, sin,
                                      seg, valid, window, self.n_heads, interpret=pallas_util.interpret())

    def finish(self, x, attn):
        attn = attn.reshape(x.shape)
        if self.mlp_implementation == "pallas" and not self.is_initializing():
            # The same parameters, read from the submodules (init creates them the usual way).
            out, ln, fc, fc_out = (m.variables["params"] for m in (self.out_proj, self.ln2, self.fc, self.fc_out))
            return fused_mlp.finish_block(x, attn, out["kernel"], out["bias"], ln["scale"], ln["bias"],
                                          fc["kernel"], fc["bias"], fc_out["kernel"], fc_out["bias"],
                                          interpret=pallas_util.interpret())
        x = x + self.out_proj(attn)
        return x + self.fc_out(nn.gelu(self.fc(self.ln2(x))))


class TransformerActorCritic(nn.Module):
    """See the module docstring. Inputs: obs (rank `obs_ndim` per step: vectors are used as they
    are, images [H, W, C] go through the conv `Torso`), prev_action int, prev_reward float,
    is_first bool (this step starts an episode; prev_action/prev_reward are then ignored)."""
    num_actions: int
    obs_ndim: int = 1
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    context_len: int = 64
    context_across_episodes: bool = False
    dtype: Any = jnp.float32            # compute dtype; params are float32
    attn_implementation: str | None = None  # None (XLA today), "cudnn", or "pallas" (fused_attention.py)
    mlp_implementation: str | None = None   # None (XLA) or "pallas" (fused_mlp.py)

    def setup(self):
        head_dim, rem = divmod(self.d_model, self.n_heads)
        assert rem == 0 and head_dim % 2 == 0, "d_model / n_heads must be an even integer"
        if self.attn_implementation not in (None, "cudnn", "pallas"):
            raise ValueError(f"attn_implementation must be None, 'cudnn' or 'pallas', got {self.attn_implementation!r}")
        if self.mlp_implementation not in (None, "pallas"):
            raise ValueError(f"mlp_implementation must be None or 'pallas', got {self.mlp_implementation!r}")
        # The widths here; the sequence length is checked when the kernel is called.
        if self.attn_implementation == "pallas" and not fused_attention.supported(1, head_dim, self.d_model):
            raise ValueError(f"attn_implementation='pallas' needs d_model a power of 2 from 16 to "
                             f"{fused_attention.MAX_D_MODEL} and a head dim that is a multiple of 32 "
                             f"up to 128, got d_model {self.d_model}, head dim {head_dim}")
        if self.mlp_implementation == "pallas" and not fused_mlp.supported(self.d_model, 4 * self.d_model):
            raise ValueError(f"mlp_implementation='pallas' needs d_model a power of 2 from 16 to "
                             f"{fused_mlp.MAX_D_MODEL}, got {self.d_model}")
        assert 1 <= self.context_len <= 2 ** 14, "context_len * 2**16 must fit in int32"
        self.torso = Torso(self.obs_ndim, self.dtype)
        self.embed = nn.Dense(self.d_model, dtype=self.dtype, param_dtype=jnp.float32)
        self.blocks = [Block(self.d_model, self.n_heads, self.n_layers, self.dtype, self.mlp_implementation)
                       for _ in range(self.n_layers)]
        self.ln_f = nn.LayerNorm(dtype=self.dtype, param_dtype=jnp.float32)
        # Heads in float32 (tiny); orthogonal scales as in the MLP actor-critic.
        self.actor = nn.Dense(self.num_actions, kernel_init=nn.initializers.orthogonal(0.01),
                              dtype=jnp.float32, param_dtype=jnp.float32)
        self.critic = nn.Dense(1, kernel_init=nn.initializers.orthogonal(1.0),
                               dtype=jnp.float32, param_dtype=jnp.float32)

    # ----------------------------------------------------------------------------------------
    def init_cache(self, batch_size: int) -> KVCache:
        """An empty cache: no earlier context. Usable on the unbound module."""
        head_dim = self.d_model // self.n_heads
        zeros = jnp.zeros((batch_size, self.context_len, self.n_heads, head_dim), self.dtype)
        return KVCache(k=(zeros,) * self.n_layers, v=(zeros,) * self.n_layers,
                       valid=jnp.zeros((batch_size, self.context_len), bool),
                       pos=jnp.zeros((batch_size,), jnp.int32))

    def _token_features(self, obs, prev_action, prev_reward, is_first):
        """[..., obs features + num_actions + 2]: what a token is built from."""
        keep = ~is_first
        return jnp.concatenate([self.torso(obs),
                                jax.nn.one_hot(jnp.where(keep, prev_action, -1), self.num_actions, dtype=self.dtype),
                                jnp.where(keep, prev_reward, 0).astype(self.dtype)[..., None],
                                is_first.astype(self.dtype)[..., None]], axis=-1)

    def _tokens(self, obs, prev_action, prev_reward, is_first):
        feats = self._token_features(obs, prev_action, prev_reward, is_first)
        if self.is_initializing():
            return self.embed(feats)  # creates its kernel and bias
        # The Dense's bias rides in its matmul, as one more row of the kernel against a column of
        # ones: XLA would otherwise add it, and sum its gradient, in passes of their own over
        # [B, L, d_model].
        params = self.embed.variables["params"]
        w = jnp.concatenate([params["kernel"], params["bias"][None]], axis=0).astype(self.dtype)
        return jnp.dot(jnp.concatenate([feats, jnp.ones(feats.shape[:-1] + (1,), self.dtype)], axis=-1), w)

    def _heads(self, x):
        if (self.mlp_implementation == "pallas" and fused_heads.supported(self.d_model, self.num_actions + 1)
                and not self.is_initializing()):
            # Final LayerNorm + both heads in one kernel each way (fused_heads.py): x is read
            # once, and no float32 copy of the LayerNorm's output goes through HBM.
            ln, actor, critic = (m.variables["params"] for m in (self.ln_f, self.actor, self.critic))
            w = jnp.concatenate([actor["kernel"], critic["kernel"]], axis=1)
            b = jnp.concatenate([actor["bias"], critic["bias"]])
            out = fused_heads.heads(x, ln["scale"], ln["bias"], w, b, interpret=pallas_util.interpret())
            return out[..., :-1], out[..., -1]
        x = self.ln_f(x).astype(jnp.float32)
        return self.actor(x), self.critic(x)[..., 0]

    def _attend(self, q, k, v, mask, **structure):
        # "pallas" is fused_attention.py, which only takes the cache-free learner path (in
        # __call__); here (a prefix cache, or acting) that choice means XLA.
        implementation = None if self.attn_implementation == "pallas" else self.attn_implementation
        return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=implementation, **structure)

    # ----------------------------------------------------------------------------------------
    def __call__(self, cache: KVCache | None, obs, prev_action, prev_reward, is_first, valid=None):
        """Learner path over sequences [B, L, ...]; `cache` holds up to C-1 earlier tokens per
        layer (or None). `valid` [B, L] bool (default all True) marks padding tokens: nobody
        attends to them and their own outputs are meaningless.
        Returns logits [B, L, A] f32, values [B, L] f32, and the cache after the L tokens."""
        C, across = self.context_len, self.context_across_episodes
        is_first = is_first.astype(bool)
        B, L = is_first.shape
        tok_valid = jnp.ones((B, L), bool) if valid is None else valid.astype(bool)
        t0 = jnp.zeros((B,), jnp.int32) if cache is None else cache.pos
        i = jnp.arange(L)
        pos = t0[:, None] + i[None, :]                   # absolute step index of each token
        seg = jnp.cumsum(is_first, axis=1)               # episode within the sequence; 0 = cache's

        # Among the new tokens: causal, within the window, valid keys, same episode.
        window = (i[:, None] >= i[None, :]) & (i[:, None] - i[None, :] < C)
        mask = window[None] & tok_valid[:, None, :]
        if not across:
            mask &= seg[:, :, None] == seg[:, None, :]
        mask |= jnp.eye(L, dtype=bool)                   # itself, so padding rows stay finite
        structure = {}
        if cache is None:
            structure = dict(is_causal=True, local_window_size=(C - 1, 0))
            if across and valid is None:
                mask = None                              # purely structural: fully fused on cuDNN
        else:
            # Ring slot s holds absolute token t0-1-((t0-1-s) % C); its distance to query i:
            s = jnp.arange(C)
            age = i[None, :, None] + 1 + (t0[:, None, None] - 1 - s[None, None, :]) % C
            prefix = cache.valid[:, None, :] & (age < C)
            if not across:
                prefix &= (seg == 0)[:, :, None]         # no episode start since the cache
            mask = jnp.concatenate([prefix, mask], axis=-1)  # keys: [ring; new]
        mask = None if mask is None else mask[:, None]   # [B, 1, L, S]: shared by the heads

        x = self._tokens(obs, prev_action, prev_reward, is_first)
        ks, vs = [], []
        fused = self.attn_implementation == "pallas" and cache is None and not self.is_initializing()
        if fused:  # the rotary tables of positions 0..L-1, shared by every layer's kernel
            cos, sin = rope_tables(i, self.d_model // self.n_heads, x.dtype)
        for layer, block in enumerate(self.blocks):
            if fused:   # LN 1 through attention in one kernel per pass; see fused_attention.py
                qkv = block.project(x)  # for the returned cache only (else dead code)
                attn, x = block.fused_attention(x, cos, sin, None if across else seg, valid, C)
                ks.append(rope(qkv[:, :, 1], pos))
                vs.append(qkv[:, :, 2])
                x = block.finish(x, attn)
                continue
            q, k, v = block.qkv(x, pos)
            ks.append(k)
            vs.append(v)
            if cache is not None:
                k = jnp.concatenate([cache.k[layer], k], axis=1)
                v = jnp.concatenate([cache.v[layer], v], axis=1)
            x = block.finish(x, self._attend(q, k, v, mask, **structure))
        logits, values = self._heads(x)

        # The cache after these tokens: the last min(L, C) of them written into the ring.
        if cache is None:
            cache = self.init_cache(B)
        n = min(L, C)
        slots = (pos[:, L - n:]) % C
        rows = jnp.arange(B)[:, None]
        new_valid, old_valid = tok_valid[:, L - n:], cache.valid
        if not across:
            new_valid &= seg[:, L - n:] == seg[:, -1:]
            old_valid &= (seg[:, -1] == 0)[:, None]
        new_cache = KVCache(
            k=tuple(ck.at[rows, slots].set(k[:, L - n:]) for ck, k in zip(cache.k, ks)),
            v=tuple(cv.at[rows, slots].set(v[:, L - n:]) for cv, v in zip(cache.v, vs)),
            valid=old_valid.at[rows, slots].set(new_valid),
            pos=(t0 + L) % (C * ROPE_PERIOD))
        return logits, values, new_cache

    def step(self, cache: KVCache, obs, prev_action, prev_reward, is_first):
        """Acting path, one step of B environments: inputs [B, ...] -> logits [B, A] f32,
        value [B] f32, new cache. Cost: one token's projections + attention over C entries."""
        C, across = self.context_len, self.context_across_episodes
        is_first = is_first.astype(bool)
        B = is_first.shape[0]
        rows = jnp.arange(B)
        slot = cache.pos % C                             # overwrites the token C steps back
        valid = cache.valid if across else cache.valid & ~is_first[:, None]
        valid = valid.at[rows, slot].set(True)
        mask = valid[:, None, None, :]                   # [B, 1, 1, C]

        x = self._tokens(obs[:, None], prev_action[:, None], prev_reward[:, None], is_first[:, None])
        ks, vs = [], []
        for layer, block in enumerate(self.blocks):
            q, k, v = block.qkv(x, cache.pos[:, None])
            k = cache.k[layer].at[rows, slot].set(k[:, 0])
            v = cache.v[layer].at[rows, slot].set(v[:, 0])
            ks.append(k)
            vs.append(v)
            x = block.finish(x, self._attend(q, k, v, mask))
        logits, value = self._heads(x[:, 0])
        return logits, value, KVCache(tuple(ks), tuple(vs), valid, (cache.pos + 1) % (C * ROPE_PERIOD))

    def peek(self, cache: KVCache, obs, prev_action, prev_reward, is_first):
        """`step`'s logits and value for one more token, WITHOUT writing it into the cache (and
        without copying the cache): for extra queries such as the value of a pre-reset
        observation. Attention is written out by hand: one query over the C-1 newest cached
        tokens plus itself."""
        C, across = self.context_len, self.context_across_episodes
        is_first = is_first.astype(bool)
        rows = jnp.arange(is_first.shape[0])
        valid = cache.valid if across else cache.valid & ~is_first[:, None]
        valid = valid.at[rows, cache.pos % C].set(False)  # the token C steps back: out of the window
        x = self._tokens(obs[:, None], prev_action[:, None], prev_reward[:, None], is_first[:, None])
        for layer, block in enumerate(self.blocks):
            q, k, v = block.qkv(x, cache.pos[:, None])                      # [B, 1, H, Dh]
            scale = 1.0 / np.sqrt(q.shape[-1])
            s_ring = jnp.einsum("bqhd,bkhd->bhqk", q, cache.k[layer]).astype(jnp.float32) * scale
            s_self = jnp.einsum("bqhd,bqhd->bhq", q, k).astype(jnp.float32)[..., None] * scale
            s_ring = jnp.where(valid[:, None, None, :], s_ring, -jnp.inf)
            p = jax.nn.softmax(jnp.concatenate([s_ring, s_self], axis=-1), axis=-1).astype(self.dtype)
            attn = (jnp.einsum("bhqk,bkhd->bqhd", p[..., :C], cache.v[layer])
                    + jnp.einsum("bhq,bqhd->bqhd", p[..., C], v))
            x = block.finish(x, attn)
        return self._heads(x[:, 0])
