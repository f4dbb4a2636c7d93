"""The data-parallel gradient step every algorithm shares.

    grads of one device's batch (in `grad_accum` micro-batches)  ->  lax.pmean over AXIS
    -> (fp16: unscale, skip the step if not finite, adapt the loss scale)  ->  optax update

Params and optimizer state stay float32 whatever `--precision` says; the networks compute in
the chosen dtype (`nets.compute_dtype`), and losses and metrics are float32.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxrl_mgpu.parallel import all_mean


class LossScale(NamedTuple):
    """Dynamic loss scaling for fp16 (a no-op for fp32 and bf16, whose range needs none)."""
    scale: jax.Array        # the loss is multiplied by this before differentiation
    good_steps: jax.Array   # finite steps since the scale last changed

    @staticmethod
    def init(precision: str) -> "LossScale":
        return LossScale(jnp.float32(2.0 ** 15 if precision == "fp16" else 1.0), jnp.int32(0))


GROWTH_INTERVAL = 2000  # finite steps before the fp16 loss scale doubles


def accumulated_grads(loss_fn: Callable, params, batch, grad_accum: int, scale: jax.Array | None = None):
    """Mean gradient and stats of `loss_fn(params, micro_batch) -> (loss, stats)` over
    `grad_accum` equal micro-batches of `batch` (leading axis split), so a batch K times larger
    than fits in memory gives the same gradient as one big batch. `scale` (fp16 loss scaling)
    multiplies the loss before differentiation."""
    def scaled(p, b):
        loss, stats = loss_fn(p, b)
        return loss * scale, stats

    grad_fn = jax.grad(loss_fn if scale is None else scaled, has_aux=True)
    if grad_accum == 1:
        return grad_fn(params, batch)
    micro = jax.tree.map(lambda x: x.reshape((grad_accum, -1) + x.shape[1:]), batch)

    def add(total, b):
        grads, stats = grad_fn(params, b)
        return jax.tree.map(jnp.add, total, (grads, stats)), None

    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro)))
    total, _ = jax.lax.scan(add, zeros, micro)
    return jax.tree.map(lambda x: x / grad_accum, total)


def step(loss_fn: Callable, tx: optax.GradientTransformation, params, opt_state, loss_scale: LossScale,
         batch, grad_accum: int = 1, precision: str = "fp32"):
    """One optimizer step on this device's `batch`, with gradients averaged over all devices.
    Returns params, opt_state, loss_scale and the stats (averaged over devices, with
    `skipped` = 1.0 where an fp16 step overflowed and was skipped)."""
    scale = loss_scale.scale if precision == "fp16" else None
    grads, stats = accumulated_grads(loss_fn, params, batch, grad_accum, scale)
    grads, stats = all_mean((grads, stats))  # the all-reduce: one collective for all leaves
    if scale is not None:
        grads = jax.tree.map(lambda g: g / scale, grads)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    if precision != "fp16":
        return new_params, new_opt_state, loss_scale, stats
    # fp16: an overflow (identical on every device after the pmean) skips the step and halves
    # the scale; a long run of finite steps doubles it.
    finite = jnp.all(jnp.array([jnp.isfinite(g).all() for g in jax.tree.leaves(grads)]))
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
    grown = loss_scale.good_steps + 1 >= GROWTH_INTERVAL
    scale = jnp.where(finite, jnp.where(grown, loss_scale.scale * 2, loss_scale.scale),
                      jnp.maximum(loss_scale.scale / 2, 1.0))
    good = jnp.where(finite & ~grown, loss_scale.good_steps + 1, 0)
    stats = jax.tree.map(lambda s: jnp.where(finite, s, 0.0), stats)
    stats = {**stats, "fp16/skipped": 1.0 - finite.astype(jnp.float32), "fp16/loss_scale": scale}
    return keep(new_params, params), keep(new_opt_state, opt_state), LossScale(scale, good), stats


def steps(loss_fn: Callable, tx: optax.GradientTransformation, carry, minibatches, grad_accum: int = 1,
          precision: str = "fp32"):
    """`step` on each minibatch in turn (a `lax.scan` over the leading axis of `minibatches`);
    `carry` is (params, opt_state, loss_scale). Returns the carry and the stacked stats."""
    def one(carry, batch):
        params, opt_state, loss_scale, stats = step(loss_fn, tx, *carry, batch, grad_accum, precision)
        return (params, opt_state, loss_scale), stats

    return jax.lax.scan(one, carry, minibatches)


def adam(cfg, total_steps: int) -> optax.GradientTransformation:
    """Adam (AdamW with --weight-decay) with global-norm clipping and, with `--anneal-lr`, a
    linear decay to 0."""
    lr: Any = optax.linear_schedule(cfg.lr, 0.0, total_steps) if cfg.anneal_lr else cfg.lr
    # eps=1e-5 (not 1e-8) keeps Adam's first steps stable on near-zero gradients.
    # optax.flatten: the update runs on all parameters as one float32 vector. Per leaf, XLA
    # launches a few small kernels for each of the dozens of leaves (norm, moments, update),
    # a noticeable share of a small transformer's step.
    step = (optax.adamw(lr, eps=1e-5, weight_decay=cfg.weight_decay) if cfg.weight_decay else
            optax.adam(lr, eps=1e-5))
    return optax.flatten(optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), step))
