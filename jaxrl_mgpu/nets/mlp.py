"""Feedforward actor-critic: separate actor and critic MLPs over a shared observation torso."""

from __future__ import annotations

from typing import NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def dense(features: int, scale: float = np.sqrt(2), dtype=jnp.float32) -> nn.Dense:
    # Orthogonal init with these scales is what makes small PPO networks train reliably.
    return nn.Dense(features, kernel_init=nn.initializers.orthogonal(scale),
                    bias_init=nn.initializers.zeros, dtype=dtype)


ATARI_FRAME = (84, 84)


class Torso(nn.Module):
    """Flattens vector observations; a 3x3 conv layer first for image ([H, W, C]) ones (MinAtar's),
    and the Nature DQN's three conv layers (Mnih et al. 2015) for stacked 84 x 84 frames of bytes
    ([frames, 84, 84], values 0..255: Atari's), scaled to [0, 1]."""
    obs_ndim: int
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, obs):
        if self.obs_ndim == 3 and obs.shape[-2:] == ATARI_FRAME:
            return NatureConv(self.dtype)(obs)
        x = obs.astype(self.dtype)
        if self.obs_ndim == 3:
            x = nn.relu(nn.Conv(16, (3, 3), dtype=self.dtype)(x))
        return x.reshape(x.shape[: x.ndim - self.obs_ndim] + (-1,))


class NatureConv(nn.Module):
    """[..., frames, H, W] uint8 -> the flattened features of the Nature DQN's convolutions
    (32 8x8 filters at stride 4, 64 4x4 at 2, 64 3x3 at 1, ReLU); its 512-wide dense layer is
    the first hidden layer of the MLP heads that follow (--hidden-size 512)."""
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, frames):
        lead = frames.shape[:-3]
        x = jnp.moveaxis(frames.reshape((-1,) + frames.shape[-3:]), 1, -1).astype(self.dtype) / 255.0
        for features, size, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(nn.Conv(features, (size, size), (stride, stride), padding="VALID", dtype=self.dtype,
                                kernel_init=nn.initializers.orthogonal(np.sqrt(2)),
                                bias_init=nn.initializers.zeros)(x))
        return x.reshape(lead + (-1,))


class MLP(nn.Module):
    hidden: Sequence[int]
    out: int
    out_scale: float
    activation: str = "tanh"
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        act = getattr(nn, self.activation)
        for h in self.hidden:
            x = act(dense(h, dtype=self.dtype)(x))
        return dense(self.out, self.out_scale, dtype=self.dtype)(x)


class ActorCritic(nn.Module):
    """`__call__(obs) -> (pi, value)` for a batch of observations of rank `obs_ndim`. pi is the
    actor MLP's `num_outputs` outputs [..., num_outputs] (logits; a tanh-squashed normal's
    location and raw scale), or with `learned_log_std` the (mean, log_std) of a diagonal
    Gaussian over `num_outputs` dimensions, each [..., num_outputs]: the mean from the actor
    MLP, the log-std one learned vector for every state (as PureJaxRL's and CleanRL's continuous
    PPO). The actor and the critic have hidden layers of their own widths (Brax's Ant: 4 x 32
    and 5 x 256)."""
    num_outputs: int
    obs_ndim: int
    actor_hidden: Sequence[int] = (64, 64)
    critic_hidden: Sequence[int] = (64, 64)
    activation: str = "tanh"
    learned_log_std: bool = False
    dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.torso = Torso(self.obs_ndim, self.dtype)
        self.actor = MLP(tuple(self.actor_hidden), self.num_outputs, 0.01, self.activation, self.dtype)
        self.critic = MLP(tuple(self.critic_hidden), 1, 1.0, self.activation, self.dtype)
        if self.learned_log_std:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.num_outputs,))

    def pi(self, x):
        out = self.actor(x).astype(jnp.float32)
        return (out, jnp.broadcast_to(self.log_std, out.shape)) if self.learned_log_std else out

    def __call__(self, obs):
        x = self.torso(obs)
        return self.pi(x), self.critic(x)[..., 0].astype(jnp.float32)

    def act(self, obs, final_obs):
        """pi and value of `obs`, and the value of `final_obs`, in the launches of one forward
        pass: the torso and critic run on [obs; final_obs], the actor on obs only."""
        n = obs.shape[0]
        x = self.torso(jnp.concatenate([obs, final_obs]))
        values = self.critic(x)[..., 0].astype(jnp.float32)
        return self.pi(x[:n]), values[:n], values[n:]


class Critic(nn.Module):
    """Q(s, a): an MLP over the observation and the action, with layer normalisation after each
    hidden layer where `layer_norm` (which keeps large-batch, high-update-ratio critics stable:
    FastTD3, SimbaV2); `outputs` values (1, or a categorical critic's atoms' logits)."""
    hidden: Sequence[int]
    outputs: int = 1
    layer_norm: bool = True
    activation: str = "relu"
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, obs, action):
        act = getattr(nn, self.activation)
        x = jnp.concatenate([obs.reshape(obs.shape[:1] + (-1,)), action], -1).astype(self.dtype)
        for h in self.hidden:
            x = dense(h, dtype=self.dtype)(x)
            x = act(nn.LayerNorm(dtype=self.dtype)(x) if self.layer_norm else x)
        return dense(self.outputs, 1.0, dtype=self.dtype)(x).astype(jnp.float32)



class Critics(NamedTuple):
    """Two critics with parameters of their own (a leading axis of 2), applied in one batched
    call: clipped double Q. Each is initialised on its own, never vmapped: a vmapped orthogonal
    initialiser is a batched QR, which XLA's CPU runtime can deadlock on under pmap."""
    critic: Critic

    def init(self, key, obs, action):
        return jax.tree.map(lambda *x: jnp.stack(x), *(self.critic.init(k, obs, action)
                                                       for k in jax.random.split(key, 2)))

    def apply(self, params, obs, action):
        return jax.vmap(lambda p: self.critic.apply(p, obs, action))(params)
