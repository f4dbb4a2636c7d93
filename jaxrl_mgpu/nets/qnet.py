"""Q-network for value-based algorithms (DQN): the shared observation torso + an MLP head with
one output per action."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from jaxrl_mgpu.nets.mlp import MLP, Torso


class QNetwork(nn.Module):
    """`__call__(obs) -> q` of shape [..., num_actions] for observations of rank `obs_ndim`
    (a conv layer is added to the torso for [H, W, C] images such as MinAtar's)."""
    num_actions: int
    obs_ndim: int
    hidden_size: int = 64
    num_layers: int = 2
    activation: str = "relu"
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, obs):
        x = Torso(self.obs_ndim, self.dtype)(obs)
        hidden = [self.hidden_size] * self.num_layers
        return MLP(hidden, self.num_actions, 1.0, self.activation, self.dtype)(x).astype(jnp.float32)
