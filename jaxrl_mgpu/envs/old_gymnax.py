"""The older 5-value gymnax step, `(obs, state, reward, done, info)`, as this project's
environment API: Craftax behind `--env craftax:TASK`.

Such a step says only `done`. `OldGymnaxEnv` splits it: the suite's own end test
(`is_terminal(state, params)`) with its time limit moved out of reach says whether the state
is an absorbing end (`terminated`: a Craftax death, lava, the final boss beaten); an end that
is not one was the time limit (`truncated`: the learners bootstrap from its observation). A
death on the last step is a death. The time limit is `params.max_steps_in_episode` (Craftax's
`max_timesteps`, which the adapter passes on to the suite as that field), and gymnax's `step`
resets an ended episode and keeps the observation it ended on in `info["final_observation"]`.
The suite's info (Craftax: its achievements, score and discount) is passed on; Craftax's
achievements (100 where the episode that ends at this step unlocked one, else 0) and, in
Classic, its score (their geometric mean with an offset of 1) are its episode metrics, logged
per log row as `env/Achievements/NAME` (the percentage of episodes that unlocked it) and
`env/score`, as the Craftax baselines log them.

Observations are the suite's, in float32: Craftax's symbolic ones a vector (1,345 for Classic,
8,268 for Craftax), its pixel ones an [H, W, 3] image the policy's conv torso reads.

The suite's package is imported inside the function that builds its environments, so only a
run that uses it needs the `craftax` extra.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from jaxrl_mgpu.envs.registry import INT32_MAX, Suite, register_suite

# What craftax 1.6.1's `make_craftax_env_from_name` builds without auto-reset (this adapter
# resets episodes itself); its "-AutoReset-v1" names are the same tasks.
CRAFTAX_TASKS = ("Craftax-Classic-Symbolic-v1", "Craftax-Classic-Pixels-v1", "Craftax-Symbolic-v1", "Craftax-Pixels-v1")


@struct.dataclass
class Params(environment.EnvParams):
    suite: Any = None   # the environment's own params (Craftax's EnvParams)


class OldGymnaxEnv(environment.Environment):
    """A gymnax Environment over one with the 5-value step and no auto-reset, whose params hold
    its time limit in the field `limit_field` and whose `is_terminal(state, params)` includes
    that limit."""

    # Craftax's reset draws a whole world, far costlier than a step: only the ended episodes reset
    # (envs/vec.step_resetting_ended), instead of a reset computed in every step under vmap.
    heavy_reset = True
    # A batch of Craftax steps is many kernels and milliseconds on a GPU: PPO's rollout loop is
    # not unrolled for it (algos/ppo.rollout_unroll), since each unrolled copy compiles the step
    # and its resets again for no measurable gain.
    heavy_step = True

    def __init__(self, name: str, env: Any, params: Params, limit_field: str, episode_metrics: tuple[str, ...],
                 make_drawing: Callable[[], Callable[[Any], jax.Array]]):
        self._name, self.suite_env, self._params, self._limit_field = name, env, params, limit_field
        self.episode_metrics = episode_metrics  # envs.episode_metrics: info entries reported per episode
        self._make_drawing = make_drawing       # () -> (state -> RGB image): the suite's renderer, built on use

    def render_rgb(self, state: Any, params: Params | None = None) -> np.ndarray:
        """One state drawn by the suite's renderer (evaluate --video), each pixel doubled."""
        image = np.clip(np.asarray(self._drawing(state)), 0, 255).astype(np.uint8)
        return image.repeat(2, axis=0).repeat(2, axis=1)

    @functools.cached_property
    def _drawing(self) -> Callable[[Any], jax.Array]:
        # Craftax's first drawing processes its textures and says so on stdout, where evaluate
        # prints its JSON line: its words go to stderr.
        with contextlib.redirect_stdout(sys.stderr):
            return jax.jit(self._make_drawing())

    def _suite_params(self, params: Params, limit: Any) -> Any:
        return params.suite.replace(**{self._limit_field: limit})

    @property
    def default_params(self) -> Params:
        return self._params

    def reset_env(self, key: jax.Array, params: Params) -> tuple[jax.Array, Any]:
        obs, state = self.suite_env.reset(key, self._suite_params(params, params.max_steps_in_episode))
        return jnp.asarray(obs, jnp.float32), state

    def step_env(self, key: jax.Array, state: Any, action: jax.Array,
                 params: Params) -> tuple[jax.Array, Any, jax.Array, jax.Array, dict]:
        obs, state, reward, _, info = self.suite_env.step(
            key, state, action, self._suite_params(params, params.max_steps_in_episode))
        reward = jnp.asarray(reward, jnp.float32)
        return jnp.asarray(obs, jnp.float32), state, reward, self.is_terminated(state, params), info

    def is_terminated(self, state: Any, params: Params) -> jax.Array:
        """An end of the suite's own other than its time limit."""
        return self.suite_env.is_terminal(state, self._suite_params(params, INT32_MAX))

    def is_truncated(self, state: Any, params: Params) -> jax.Array:
        done = self.suite_env.is_terminal(state, self._suite_params(params, params.max_steps_in_episode))
        return done & ~self.is_terminated(state, params)

    @property
    def name(self) -> str:
        return self._name

    @property
    def num_actions(self) -> int:
        return int(self.suite_env.num_actions)

    def action_space(self, params: Params | None = None) -> spaces.Discrete:
        return spaces.Discrete(self.num_actions)

    def observation_space(self, params: Params | None = None) -> spaces.Box:
        space = self.suite_env.observation_space(self._params.suite)
        return spaces.Box(space.low, space.high, tuple(space.shape), jnp.float32)


def _craftax_refuse(task: str) -> str | None:
    if task.endswith("-AutoReset-v1") and task.replace("-AutoReset", "") in CRAFTAX_TASKS:
        return f"every task resets its episodes here: use craftax:{task.replace('-AutoReset', '')}"
    return None


def make_craftax(task: str) -> tuple[OldGymnaxEnv, Params]:
    from craftax.craftax_env import make_craftax_env_from_name
    classic = task.startswith("Craftax-Classic")
    if classic:
        from craftax.craftax_classic.constants import Achievement
    else:
        from craftax.craftax.constants import Achievement
    env = make_craftax_env_from_name(task, auto_reset=False)

    def make_drawing():  # Craftax's own pixel renderer, at its image observations' block size (16 pixels)
        if classic:
            from craftax.craftax_classic.constants import BLOCK_PIXEL_SIZE_IMG
            from craftax.craftax_classic.renderer import make_craftax_pixel_renderer
        else:
            from craftax.craftax.constants import BLOCK_PIXEL_SIZE_IMG
            from craftax.craftax.renderer import make_craftax_pixel_renderer
        return make_craftax_pixel_renderer(BLOCK_PIXEL_SIZE_IMG)

    suite_params = env.default_params
    params = Params(max_steps_in_episode=int(suite_params.max_timesteps), suite=suite_params)
    # the names its step's info gives them (Classic's compute_score, Craftax's log_achievements_to_info)
    metrics = tuple(f"Achievements/{a.name.lower()}" for a in Achievement) + (("score",) if classic else ())
    return OldGymnaxEnv(f"craftax:{task}", env, params, "max_timesteps", metrics, make_drawing), params


register_suite("craftax", Suite(tasks=lambda: list(CRAFTAX_TASKS), make=make_craftax, extra="craftax",
                                requires=("craftax",), refuse=_craftax_refuse))
