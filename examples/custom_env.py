"""A user's own environment, trained with every feature of jaxrl_mgpu.

A corridor: walk right to its end (reward 1, terminated); 50 steps at most (truncated). The
environment is written against gymnax's `Environment` (jittable `step_env` / `reset_env`), and
registered under a name with its arguments' ranges. `--env MODULE:NAME` imports the module,
which registers NAME (a run's config keeps the name, so --resume and evaluate import it again);
from the repository's root:

    python -m jaxrl_mgpu.train --env examples.custom_env:Corridor-v0 --env-args size=8 --num-envs 16 \
        --num-steps 32 --total-timesteps 40960 --run-dir runs/corridor   # all local devices
    python -m jaxrl_mgpu.train --run-dir runs/corridor --resume --total-timesteps 81920
    python -m jaxrl_mgpu.train --env examples.custom_env:Corridor-v0 --num-seeds 3 --num-envs 16 --num-steps 32 \
        --total-timesteps 20480 --run-dir runs/corridor-seeds          # 3 runs in one program
    python -m jaxrl_mgpu.evaluate --run-dir runs/corridor --episodes 32 --greedy
    python -m jaxrl_mgpu.evaluate --run-dir runs/corridor --video corridor.gif   # its render_rgb

An installed package would instead name it under the entry-point group `jaxrl_mgpu.envs`
(`Corridor-v0 = "my_pkg.envs:make_corridor"`), and `--env Corridor-v0` would find it.
"""
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from jaxrl_mgpu import envs


@struct.dataclass
class State(environment.EnvState):      # gymnax's EnvState holds `time`, the step count
    position: jax.Array


@struct.dataclass
class Params(environment.EnvParams):    # gymnax's EnvParams holds max_steps_in_episode
    size: int = 10


class Corridor(environment.Environment):
    @property
    def default_params(self) -> Params:
        return Params(max_steps_in_episode=50)

    def step_env(self, key, state, action, params):
        position = jnp.clip(state.position + 2 * action - 1, 0, params.size - 1)  # 0: left, 1: right
        state = State(time=state.time + 1, position=position)
        at_end = position == params.size - 1
        return self.get_obs(state, params), state, at_end.astype(jnp.float32), at_end, {}

    def reset_env(self, key, params):
        state = State(time=0, position=jnp.int32(0))
        return self.get_obs(state, params), state

    def get_obs(self, state, params):
        return jnp.array([state.position / params.size], jnp.float32)

    @property
    def num_actions(self) -> int:
        return 2

    def action_space(self, params):
        return spaces.Discrete(2)

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (1,), jnp.float32)

    def render_rgb(self, state, params):   # optional: one state as an RGB image, for evaluate --video
        cells = np.full((1, params.size, 3), 230, np.uint8)
        cells[0, -1] = (44, 160, 44)                 # the end, green
        cells[0, int(state.position)] = (31, 119, 180)  # the walker, blue
        return cells.repeat(32, axis=0).repeat(32, axis=1)


def make_corridor(size: int = 10):
    env = Corridor()
    return env, env.default_params.replace(size=size)


# --env-args size=N, checked before anything is built (an Arg per keyword the factory takes)
envs.register("Corridor-v0", make_corridor, {"size": envs.Arg(int, at_least=2)})
