"""Partially observed variants of gymnax environments: memory tasks for recurrent/transformer
policies. `CartPole-NoVel-v1` shows only the cart position and pole angle; the velocities must
be inferred from the history, which a feedforward policy cannot do."""

from __future__ import annotations

import jax.numpy as jnp
from gymnax.environments import spaces
from gymnax.environments.classic_control.cartpole import CartPole

from jaxrl_mgpu.envs.registry import register


class CartPoleNoVelocity(CartPole):
    def get_obs(self, state, params=None, key=None):
        return jnp.array([state.x, state.theta])

    def observation_space(self, params) -> spaces.Box:
        high = jnp.array([params.x_threshold * 2, params.theta_threshold_radians * 2])
        return spaces.Box(-high, high, (2,), dtype=jnp.float32)

    @property
    def name(self) -> str:
        return "CartPole-NoVel-v1"


def _make():
    env = CartPoleNoVelocity()
    return env, env.default_params


register("CartPole-NoVel-v1", _make)
