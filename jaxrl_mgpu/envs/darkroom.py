"""Dark Room (Laskin et al. 2022, "In-context RL with Algorithm Distillation").

A square grid the agent walks on from the centre cell. The goal cell is the task: it lives in
`EnvParams`, so a batch of tasks is a `vmap` over params. The room is dark: the observation is
only the agent's (x, y) position, so the goal must be found by exploring and remembered across
episodes, which is what an in-context learner has to do.

- `DarkRoom`: 9x9, reward 1 on every step the agent spends on the goal, 20 steps an episode.
- `DarkRoomHard`: 17x17, reward 1 only the first time the goal is reached in an episode; the
  episode then goes on (never terminated) until its 50 steps are up. Fixed-length episodes keep
  a learning history of M steps exactly M / 50 episodes, the same layout as `DarkRoom`, and 50
  steps reach every cell of the larger room from the centre (the farthest is 16 steps away).

Both rooms only truncate (`state.time >= max_steps_in_episode`); `terminated` is always False.
Actions: 0 +y, 1 -y, 2 +x, 3 -x, 4 no-op; a move into a wall leaves the agent in place.

`make("DarkRoom")` (default params) uses a fixed goal: the first train goal (seed 0) in
(x, y) order, so a single-task trainer has one well-defined room to solve.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import environment, spaces

from jaxrl_mgpu.envs.registry import EnvError, register

MOVES = jnp.array([[0, 1], [0, -1], [1, 0], [-1, 0], [0, 0]], jnp.int32)  # (dx, dy) per action
SPLITS = ("train", "test")


@struct.dataclass
class EnvState(environment.EnvState):
    pos: jax.Array       # int32 [2]: (x, y)
    reached: jax.Array   # bool: the goal was reached this episode (DarkRoomHard pays once)
    time: int


@struct.dataclass
class EnvParams(environment.EnvParams):
    # int32 [2]: the goal cell (x, y). No usable default: rooms build params with `params_for`.
    goal: jax.Array = struct.field(default_factory=lambda: jnp.zeros(2, jnp.int32))
    max_steps_in_episode: int = 20


class DarkRoom(environment.Environment[EnvState, EnvParams]):
    """9x9 Dark Room: reward 1 on every step on the goal; 20-step episodes, never terminated."""

    size = 9
    episode_len = 20
    reward_once = False   # DarkRoomHard: reward only the first time the goal is reached

    @property
    def default_params(self) -> EnvParams:
        return self.params_for(goals(self.name, "train", 0)[0])

    def params_for(self, goal: Any) -> EnvParams:
        """Params for one goal `[2]`, or for a batch `[N, 2]`: then every leaf has a leading
        N axis, so `jax.vmap(env.step)` / `env.reset` map over params with `in_axes=0`."""
        goal = jnp.asarray(goal, jnp.int32)
        return EnvParams(goal=goal, max_steps_in_episode=jnp.full(goal.shape[:-1], self.episode_len, jnp.int32))

    def step_env(self, key: jax.Array, state: EnvState, action: int | jax.Array,
                 params: EnvParams) -> tuple[jax.Array, EnvState, jax.Array, jax.Array, dict]:
        pos = jnp.clip(state.pos + MOVES[action], 0, self.size - 1)
        at_goal = jnp.all(pos == params.goal)
        paid = jnp.logical_and(self.reward_once, state.reached)
        reward = jnp.logical_and(at_goal, jnp.logical_not(paid)).astype(jnp.float32)
        state = EnvState(pos=pos, reached=jnp.logical_or(state.reached, at_goal), time=state.time + 1)
        return self.get_obs(state), state, reward, self.is_terminal(state, params), {}

    def reset_env(self, key: jax.Array, params: EnvParams) -> tuple[jax.Array, EnvState]:
        centre = jnp.full((2,), self.size // 2, jnp.int32)
        state = EnvState(pos=centre, reached=jnp.array(False), time=jnp.int32(0))
        return self.get_obs(state), state

    def get_obs(self, state: EnvState, params=None, key=None) -> jax.Array:
        return state.pos.astype(jnp.float32)

    def is_terminated(self, state: EnvState, params: EnvParams) -> jax.Array:
        return jnp.array(False)

    @property
    def name(self) -> str:
        return "DarkRoom"

    @property
    def num_actions(self) -> int:
        return len(MOVES)

    def action_space(self, params: EnvParams | None = None) -> spaces.Discrete:
        return spaces.Discrete(len(MOVES))

    def observation_space(self, params: EnvParams | None = None) -> spaces.Box:
        return spaces.Box(0.0, float(self.size - 1), (2,), jnp.float32)

    def state_space(self, params: EnvParams | None = None) -> spaces.Dict:
        return spaces.Dict({"pos": spaces.Box(0, self.size - 1, (2,), jnp.int32),
                            "reached": spaces.Discrete(2),
                            "time": spaces.Discrete(self.episode_len + 1)})


class DarkRoomHard(DarkRoom):
    """17x17 Dark Room: reward 1 only the first time the goal is reached; 50-step episodes."""

    size = 17
    episode_len = 50
    reward_once = True

    @property
    def name(self) -> str:
        return "DarkRoomHard"


ROOMS = {"DarkRoom": DarkRoom, "DarkRoomHard": DarkRoomHard}


def goals(env_name: str, split: str, seed: int = 0) -> np.ndarray:
    """The goal cells `[n, 2]` (int32 (x, y), sorted) of one split. Every cell is a goal; a
    seeded permutation holds out round(10%) of them as "test" (8 of 81 for DarkRoom, 29 of 289
    for DarkRoomHard), so train and test are disjoint and together cover the room."""
    if env_name not in ROOMS:
        raise EnvError(f"--env {env_name!r} has no goals; choose from: {', '.join(ROOMS)}")
    if split not in SPLITS:
        raise EnvError(f"--split {split!r} is not a split; choose from: {', '.join(SPLITS)}")
    size = ROOMS[env_name].size
    cells = np.stack(np.meshgrid(np.arange(size), np.arange(size), indexing="ij"), -1).reshape(-1, 2)
    order = np.random.default_rng(seed).permutation(len(cells))
    num_test = round(len(cells) / 10)
    chosen = order[:num_test] if split == "test" else order[num_test:]
    return cells[np.sort(chosen)].astype(np.int32)


def _factory(room: type[DarkRoom]):
    def make():
        env = room()
        return env, env.default_params
    return make


for _name, _room in ROOMS.items():
    register(_name, _factory(_room))
