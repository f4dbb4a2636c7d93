"""Atari 2600 games (`--env atari:Breakout`) simulated on the host's CPU cores by ale-py's
threaded C++ vector environment (`ale_py.vector_env.AtariVectorEnv`), stepped from inside the
compiled training step: the policy acts on the devices, and each device's batch of games steps
on the host through `jax.experimental.io_callback`. With `pipeline` (on by default) a batch is
two halves, each its own vector environment (`parts`): PPO's and DQN's rollouts step them in turns
(vec.scan_halves), one half's games stepping on the host (`send_batch` ... `recv_batch`) while
the device infers the other half's actions; everything else steps both at once (`step_batch`).

Preprocessing is the vector environment's own, the one published numbers use (the same frames
as gymnasium's `AtariPreprocessing` + `FrameStackObservation(padding_type="zero")`, frame for
frame: tests/test_atari.py): 84 x 84 grey frames, max-pooled over the last two of every 4
frames the action repeats (frame skip), 4 frames stacked (a new episode's stack is padded with
zeros), up to 30 no-op frames at every start, FIRE pressed at a start where the game needs it,
and a time limit of 108,000 frames (27,000 steps) that is a truncation (the learners bootstrap
from the frame it ended on). `--env-args` sets `frame_skip`, `frame_stack`, `noop_max`,
`sticky` (the probability that the previous action repeats, 0.25 in ALE's v5 games; 0 here, as
CleanRL's and DI-engine's Atari runs), `max_frames`, `episodic_life`, `clip_rewards`, `fire_reset`,
`threads` (the C++ threads of each batch, shared by its halves; 0: ale-py's choice) and `pipeline`.

Rewards: learning sees them clipped to their sign (`clip_rewards`), logs and evaluation count
the game's own score (`info["game_score"]`). With `episodic_life` (on by default) a lost life ends
the learners' episode (`terminated`: no bootstrap) while the game goes on; the logged episode
(return, length, evaluation) is the whole game, to game over or the time limit.

Where the state lives, and what follows:
- The games' state is in C++ on the host, out of JAX's reach: a checkpoint keeps everything
  else (parameters, optimizer, the observation the policy acts on), and a resumed run starts
  new games (seeded from the resumed step's keys, so two resumes from one checkpoint agree), so
  it continues from the checkpoint exactly except that its episodes restart.
- Games are keyed by global environment index: environment i is seeded from its own index and
  steps by its own actions, whichever device's batch it is in, so 1 and 8 devices play the same
  games. The C++ threads only step independent games in parallel: thread scheduling does not
  change a number.
- When a game ends, the vector environment resets it in the NEXT step (ale-py's only mode for
  batches): the frame the game ended on is the first observation of the next episode, the
  action taken on it is ignored and its reward is 0. A logged episode is one step longer than
  the game's.
- Each run's games belong to it: `--num-seeds` runs on a device have their own.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import re
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from gymnax.environments import spaces
from jax.experimental import io_callback

from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.envs.registry import COUNT, FLAG, Arg, Suite, register_suite

FRAMES_PER_EPISODE = 108_000  # the usual time limit: 30 minutes of play at 60 frames a second


@struct.dataclass
class State:
    token: jax.Array   # [E] int32, the same for all of a batch: which host games are this run's
    ids: jax.Array     # [E] int32: the environments' global indices (the host finds a batch's games by them)
    lives: jax.Array   # [E] int32: lives left (a loss ends the learners' episode with episodic_life)


@struct.dataclass
class Params:
    max_steps_in_episode: int = struct.field(pytree_node=False, default=FRAMES_PER_EPISODE // 4)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the host's vector environments are made with (`--env-args`)."""
    game: str                 # the ROM's id: space_invaders
    frame_skip: int = 4
    frame_stack: int = 4
    noop_max: int = 30
    sticky: float = 0.0
    max_frames: int = FRAMES_PER_EPISODE
    episodic_life: bool = True
    clip_rewards: bool = True
    fire_reset: bool = True   # press FIRE at a start where the game needs it (Breakout's ball)
    threads: int = 0          # C++ threads per batch (0: ale-py's choice)
    pipeline: bool = True     # a batch as two halves, each simulating while the other's actions are inferred


def rom_ids() -> list[str]:
    from ale_py import roms
    return sorted(roms.get_all_rom_ids())


def task_name(rom: str) -> str:
    """space_invaders -> SpaceInvaders (the names `--env atari:` takes, as gymnasium's ALE/...-v5)."""
    return "".join(part.capitalize() for part in rom.split("_"))


def rom_of(task: str) -> str:
    """SpaceInvaders (or space_invaders) -> space_invaders."""
    return task if "_" in task or task.islower() else re.sub(r"(?<!^)(?=[A-Z])", "_", task).lower()


# -- the host side: one vector environment per (run, part of a batch of global indices) ------

def parts(settings: "Settings", n: int) -> list[slice]:
    """The parts of a batch of n games that step as one vector environment each: the whole
    batch, or (`pipeline`, n >= 2) its two halves, which the rollouts step in turns
    (vec.scan_halves: one half simulates while the other's actions are inferred)."""
    return list(vec.halves(n)) if settings.pipeline and n >= 2 else [slice(0, n)]


def part_threads(settings: "Settings") -> int:
    """The C++ threads of each part's vector environment: the batch's, shared by its halves
    (which simulate at the same time, but for the inference between them)."""
    return max(1, settings.threads // 2) if settings.pipeline and settings.threads else settings.threads


class Simulators:
    """The host's vector environments, made on first use: a part's games are found by its run's
    token and its first global index and size, so each device (and each run on it) steps its
    own, from the thread XLA calls back on. `step` steps a whole batch (its parts at once);
    `send` and `recv` one part, in two calls, with the device free between them."""

    def __init__(self):
        self._made: dict[tuple, Any] = {}
        self._restarted: dict[tuple, tuple] = {}  # a part begun anew in `send`, until its `recv`
        self._lock = threading.Lock()

    def _make(self, settings: Settings, num_envs: int):
        _quiet_ale()
        from ale_py.vector_env import AtariVectorEnv
        return AtariVectorEnv(
            settings.game, num_envs, frameskip=settings.frame_skip, stack_num=settings.frame_stack,
            noop_max=settings.noop_max, repeat_action_probability=settings.sticky,
            max_num_frames_per_episode=settings.max_frames, episodic_life=False, reward_clipping=False,
            img_height=84, img_width=84, grayscale=True, maxpool=True, use_fire_reset=settings.fire_reset,
            num_threads=part_threads(settings))

    @staticmethod
    def _key(settings: Settings, token, ids) -> tuple:
        return settings, int(token[0]), int(ids[0]), len(ids)

    def _reset_part(self, settings: Settings, token, ids, seeds):
        key = self._key(settings, token, ids)
        with self._lock:
            old = self._made.pop(key, None)
        if old is not None:
            old.close()
        envs = self._make(settings, len(ids))
        obs, info = envs.reset(seed=np.asarray(seeds, np.int64))
        with self._lock:
            self._made[key] = envs
        return obs, info["lives"].astype(np.int32)

    def reset(self, settings: Settings, token, ids, seeds):
        """New games for the batch (seeded one by one), replacing any it had: one vector
        environment per part, the batch's threads shared among them."""
        made = [self._reset_part(settings, token[s], ids[s], seeds[s]) for s in parts(settings, len(ids))]
        return tuple(np.concatenate(columns) for columns in zip(*made))

    def send(self, settings: Settings, token, ids, seeds, actions):
        """One part's actions to its games, which step on the host's threads until `recv`; a
        part this process has no games for (a resumed run) gets new ones, seeded with `seeds`.
        Returns a ticket, which the part's `recv` (and whatever must wait for this call) takes."""
        key = self._key(settings, token, ids)
        with self._lock:
            envs = self._made.get(key)
        if envs is None:
            restarted = self._reset_part(settings, token, ids, seeds)
            with self._lock:
                self._restarted[key] = restarted
        else:
            envs.send(np.asarray(actions, np.int32))
        return np.int32(0)

    def recv(self, settings: Settings, token, ids, *tickets):
        """The part's step that `send` began: its games' frames, score, ends and lives, and
        which were begun anew."""
        key = self._key(settings, token, ids)
        n = len(ids)
        with self._lock:
            restarted, envs = self._restarted.pop(key, None), self._made.get(key)
        if restarted is not None:
            obs, lives = restarted
            return (obs, np.zeros(n, np.int32), np.zeros(n, bool), np.zeros(n, bool), lives, np.ones(n, bool))
        obs, reward, terminated, truncated, info = envs.recv()
        return (obs, reward.astype(np.int32), terminated.astype(bool), truncated.astype(bool),
                info["lives"].astype(np.int32), np.zeros(n, bool))

    def step(self, settings: Settings, token, ids, seeds, actions):
        """The batch's games one step on, all its parts at once."""
        cut = parts(settings, len(ids))
        for s in cut:
            self.send(settings, token[s], ids[s], seeds[s], actions[s])
        stepped = [self.recv(settings, token[s], ids[s]) for s in cut]
        return tuple(np.concatenate(columns) for columns in zip(*stepped))

    def close(self):
        with self._lock:
            made, self._made, self._restarted = self._made, {}, {}
        for envs in made.values():
            envs.close()


SIMULATORS = Simulators()
atexit.register(SIMULATORS.close)  # before the interpreter tears down ale-py's bindings


# -- the JAX side ---------------------------------------------------------------------------

def _seeds(keys: jax.Array) -> jax.Array:
    return jax.vmap(lambda k: jax.random.randint(k, (), 0, 2**31 - 1, jnp.int32))(keys)


class AtariEnv:
    """A batch of Atari games as the project steps environments: `reset_batch` and `step_batch`
    take and return this device's whole batch (envs.vec), whose games run on the host."""
    host_batched = True
    heavy_step = True  # a host round trip per step: PPO's rollout loop is not unrolled
    # a game's emulator, screens and frame stack: ale-py 0.12.1's resident memory per game of a
    # 256-game vector environment, measured (1.6 MiB), with a margin
    host_bytes_per_env = int(1.75 * 2**20)

    def __init__(self, settings: Settings, num_actions: int):
        self.settings, self.num_actions = settings, num_actions
        self.name = f"atari:{task_name(settings.game)}"
        self.obs_shape = (settings.frame_stack, 84, 84)

    @property
    def threads(self) -> int:
        """The C++ threads each device's batch steps on (0: ale-py's choice; autoscale/host.py
        sets them from the host's cores)."""
        return self.settings.threads

    @property
    def default_params(self) -> Params:
        return Params(max_steps_in_episode=-(-self.settings.max_frames // self.settings.frame_skip))

    def observation_space(self, params) -> spaces.Box:
        return spaces.Box(0, 255, self.obs_shape, jnp.uint8)

    def action_space(self, params) -> spaces.Discrete:
        return spaces.Discrete(self.num_actions)

    render_fps = 15.0  # 60 frames a second, a step every 4 of them

    def render_rgb(self, obs, params) -> np.ndarray:
        """A video's frame (tools/video.py): the observation's newest 84 x 84 grey frame, as the
        agent sees it, drawn 3 times larger in RGB."""
        frame = np.repeat(np.repeat(np.asarray(obs)[-1], 3, axis=0), 3, axis=1)
        return np.repeat(frame[..., None], 3, axis=-1).astype(np.uint8)

    def _shapes(self, n: int) -> tuple:
        return (jax.ShapeDtypeStruct((n,) + self.obs_shape, jnp.uint8), jax.ShapeDtypeStruct((n,), jnp.int32))

    def reset_batch(self, key: jax.Array, keys: jax.Array, ids: jax.Array, params) -> tuple[jax.Array, State]:
        """New games for the environments of global indices `ids`, each seeded from its key;
        `key` (the same for every device) names the run's games."""
        token = jnp.broadcast_to(jax.random.randint(key, (), 0, 2**31 - 1, jnp.int32), ids.shape)
        obs, lives = io_callback(functools.partial(SIMULATORS.reset, self.settings), self._shapes(ids.shape[0]),
                                 token, ids, _seeds(keys))
        return obs, State(token, ids, lives)

    @property
    def pipelined(self) -> bool:
        """Whether a batch's games are two halves (`parts`), stepped by `send_batch` and
        `recv_batch` one half at a time (vec.scan_halves)."""
        return self.settings.pipeline

    def _stepped(self, state: State, stepped: tuple):
        """gymnax's `step` for a batch, from what the host returned (the info holds the score,
        where the logged episode ends, and which games were started anew for a resumed run)."""
        obs, score, game_over, time_up, lives, restarted = stepped
        score = score.astype(jnp.float32)
        reward = jnp.sign(score) if self.settings.clip_rewards else score
        lost_life = (lives < state.lives) & ~restarted
        terminated = game_over | (self.settings.episodic_life & lost_life)
        info = {"final_observation": obs, "game_score": score, "episode_end": game_over | time_up,
                "restarted": restarted, "lives": lives}
        return obs, State(state.token, state.ids, lives), reward, terminated, time_up & ~game_over, info

    def _stepped_shapes(self, n: int) -> tuple:
        flags = jax.ShapeDtypeStruct((n,), jnp.bool_)
        obs_shape, int_shape = self._shapes(n)
        return obs_shape, int_shape, flags, flags, int_shape, flags

    def step_batch(self, keys: jax.Array, state: State, action: jax.Array, params):
        """One step of the batch's games (all its parts at once, in one call to the host)."""
        return self._stepped(state, io_callback(
            functools.partial(SIMULATORS.step, self.settings), self._stepped_shapes(state.ids.shape[0]),
            state.token, state.ids, _seeds(keys), action.astype(jnp.int32)))

    def send_batch(self, keys: jax.Array, state: State, action: jax.Array, params) -> jax.Array:
        """A step's first half, for one part of a batch (`parts`; `state` is the part's): the
        actions go to its games, which step on the host while the device goes on. Returns the
        ticket `recv_batch` takes."""
        return io_callback(functools.partial(SIMULATORS.send, self.settings), jax.ShapeDtypeStruct((), jnp.int32),
                           state.token, state.ids, _seeds(keys), action.astype(jnp.int32))

    def recv_batch(self, state: State, ticket: jax.Array, params, *after: jax.Array):
        """The step `send_batch` began (its `ticket`), as `step_batch` returns it, once the
        tickets `after` (other parts' sends) are in: the device waits here until the part's
        games are done."""
        return self._stepped(state, io_callback(
            functools.partial(SIMULATORS.recv, self.settings), self._stepped_shapes(state.ids.shape[0]),
            state.token, state.ids, ticket, *after))


ARGS = {"frame_skip": COUNT, "frame_stack": COUNT, "noop_max": Arg(int, at_least=0),
        "sticky": Arg(float, at_least=0, at_most=1), "max_frames": COUNT, "episodic_life": FLAG,
        "clip_rewards": FLAG, "fire_reset": FLAG, "threads": Arg(int, at_least=0), "pipeline": FLAG}


def make_atari(task: str, **args) -> tuple[AtariEnv, Params]:
    settings = Settings(rom_of(task), **args)
    num_actions = _num_actions(settings.game)
    env = AtariEnv(settings, num_actions)
    return env, env.default_params


@functools.cache
def _quiet_ale() -> None:
    """ALE's banner and ROM notes off, before its first interface is made (they would print
    from C++ above a bad input's one line)."""
    import ale_py
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


@functools.cache
def _num_actions(rom: str) -> int:
    import ale_py
    from ale_py import roms
    _quiet_ale()
    ale = ale_py.ALEInterface()
    ale.loadROM(roms.get_rom_path(rom))
    return len(ale.getMinimalActionSet())


def _tasks() -> list[str]:
    return [task_name(rom) for rom in rom_ids()]


register_suite("atari", Suite(tasks=_tasks, make=make_atari, extra="atari", requires=("ale_py",), args=ARGS))
