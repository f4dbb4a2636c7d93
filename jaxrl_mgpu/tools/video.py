"""Watching a trained policy: one episode, recorded on one device and drawn on the host into a
GIF or an MP4 (`python -m jaxrl_mgpu.evaluate --video FILE`).

- `record` plays environment 0 of the evaluation's episodes with the same key
  (`episodes.make_episodes`, an algorithm's own Evaluation (algos/base.py): the same reset and step keys, the same action
  noise), so its return is what `evaluate --episodes 1` reports, in compiled chunks of
  `lax.scan` until the episode ends. It steps with `env.step_env`, the transition without the
  auto-reset, so the state where the episode ends (a pole down, a runner tagged) is kept to be
  drawn. It keeps only the states the video draws: the state before the first step and the
  state after each step (an episode of L steps gives L + 1 frames), or with `stride` k states
  0, k, 2k, ... and the last one: ceil(L / k) + 1 frames.
- `frames` draws the states: classic control through gymnasium's renderer (as gymnax's
  visualizer does), gymnax's own visualizer where the environment has one (MinAtar, Catch,
  Pong, the mazes, ...), the
  project's own pictures for DarkRoom and both Tag games (tools/pictures.py), and otherwise the environment's own
  `render_rgb(state, params) -> uint8 [H, W, 3]` (every suite's adapter has one: MuJoCo's
  renderer for Brax and Playground, Craftax's textures, Navix's sprites, XLand-MiniGrid's and
  Jumanji's drawings; an environment of the user's may define one). An environment whose batch
  steps on the host (Atari) is played through envs.vec as evaluation plays it, and its
  observations are what is kept and drawn. Every frame shows its step number (a GIF writer
  merges identical frames, which would lose steps).
- `write` writes a temporary file beside the target and renames it, so no half-written video
  is left behind.

The optional dependencies are the `video` extra (`pip install -e ".[video]"`): imageio and
pillow (GIF), imageio-ffmpeg (MP4), pygame (gymnasium draws classic control with it).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import gymnax
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_mgpu import envs as envs_lib
from jaxrl_mgpu.cli import ConfigError, UserError
from jaxrl_mgpu.envs import vec
from jaxrl_mgpu.nets import actor_critic
from jaxrl_mgpu.tools import pictures

try:  # the `video` extra
    import imageio.v3 as iio
except ImportError:
    iio = None

SUFFIXES = (".gif", ".mp4")
INSTALL = 'pip install -e ".[video]"'

# What gymnax.visualize.Visualizer draws (gymnax 1.0.1 names them inside its methods). The first
# five it draws through gymnasium's classic-control renderer, which needs pygame.
CLASSIC_CONTROL = ("Acrobot-v1", "CartPole-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0")
GYMNAX_DRAWN = CLASSIC_CONTROL + ("Catch-bsuite", "Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar",
                                  "Seaquest-MinAtar", "SpaceInvaders-MinAtar", "Pong-misc", "PointRobot-misc",
                                  "MetaMaze-misc", "FourRooms-misc")
# Project environments whose states are a gymnax environment's, drawn by its visualizer.
DRAWN_AS = {"CartPole-NoVel-v1": "CartPole-v1"}
CLASSIC_CONTROL_FPS = 20.0   # gymnax's visualizer's for these (50 ms a frame)
GYMNAX_DPI = 80   # gymnax's 6 x 5 inch figure: 480 x 400 pixels, a multiple of 16 (MP4 blocks)
RECORD_CHUNK = 512   # steps of the recorded episode per compiled call (`record`)
RENDER_FPS = 10      # frames per second of a video drawn by `env.render_rgb`, unless env.render_fps says


class Episode(NamedTuple):
    """One recorded episode, on the host."""
    states: Any            # env states at `steps` (leading axis: one per kept step)
    steps: list[int]       # the step numbers of those states: 0 (before the first step), stride, ..., L
    rewards: np.ndarray    # [L] (multi-agent: [L, agents]), every step's
    length: int            # L
    ended: bool            # False: no episode end within max_steps_in_episode (the video stops there)


# -- checks, before anything is loaded or written ---------------------------------------------

def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def check_output(path: str) -> None:
    """A ConfigError (one line) unless `path` is a new .gif or .mp4 file in a writable
    directory and the packages that write it are installed."""
    target = Path(path)
    if target.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"--video {path}: the file must end in .gif or .mp4")
    if iio is None:
        raise ConfigError(f"--video needs imageio (the video extra): {INSTALL}")
    if target.suffix.lower() == ".mp4" and not _installed("imageio_ffmpeg"):
        raise ConfigError(f"--video {path}: an .mp4 needs imageio-ffmpeg (the video extra): {INSTALL}; "
                          f"or write a .gif")
    if target.exists() or target.is_symlink():
        raise ConfigError(f"--video {path}: the file exists; remove it or choose another name")
    parent = target.parent
    if not parent.is_dir():
        raise ConfigError(f"--video {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--video {path}: cannot write in {parent}")


def headless() -> None:
    """Draw without a display; called before any environment is built. gymnasium's
    classic-control renderer starts pygame: no window, no sound device. MuJoCo (Brax,
    Playground) picks its OpenGL platform when it is first imported: EGL renders without a
    display (on a GPU, or on the CPU through Mesa). A user's own setting wins."""
    for var, value in (("SDL_VIDEODRIVER", "dummy"), ("SDL_AUDIODRIVER", "dummy"), ("PYGAME_HIDE_SUPPORT_PROMPT", "1"),
                       ("MUJOCO_GL", "egl")):
        os.environ.setdefault(var, value)


def drawable() -> list[str]:
    return sorted(pictures.DRAWN) + sorted(DRAWN_AS) + list(GYMNAX_DRAWN)


def check_env(env_name: str, env) -> None:
    """A ConfigError (one line) unless `env_name` (`env`) can be drawn here."""
    if env_name not in pictures.DRAWN and env_name not in DRAWN_AS and env_name not in GYMNAX_DRAWN and \
            envs_lib.traits(env).render_rgb is None:
        raise ConfigError(f"--video: --env {env_name} has no renderer; these can be drawn: {', '.join(drawable())}, "
                          f"every SUITE:TASK, and an environment of your own that has a method render_rgb(state, "
                          f"params) -> uint8 [height, width, 3]")
    if DRAWN_AS.get(env_name, env_name) in CLASSIC_CONTROL and not _installed("pygame"):
        raise ConfigError(f"--video: gymnasium draws {env_name} with pygame (the video extra): {INSTALL}")


# -- recording ---------------------------------------------------------------------------------

def _chooser(policy, env, env_params, greedy: bool, evaluation=None):
    """`(pi, noise keys) -> (action, what the env takes)`, chosen as evaluation chooses them
    (`evaluation`: the algorithm's own, algos.base.Evaluation, where it has one)."""
    if evaluation is not None:
        return evaluation.choose(greedy)
    dist = actor_critic.dist_of(policy, env, env_params)

    def choose(pi, keys):
        action = dist.mode(pi) if greedy else dist.sample(pi, dist.noise(keys))
        return action, dist.to_env(action)
    return choose


def record(policy, env, env_params, params, key, greedy: bool, stride: int = 1, evaluation=None) -> Episode:
    """One episode of `policy` (an actor-critic Policy, nets/actor_critic.py) with `params`:
    environment 0 of the evaluation episodes of `key`, on the default device. It is played in
    compiled chunks of RECORD_CHUNK steps until the episode ends, and of its states only those
    a video of `stride` draws are kept (`is_picked`): long episodes of large states (full
    Craftax's) fit in memory only so."""
    choose = _chooser(policy, env, env_params, greedy, evaluation)
    max_steps = int(env_params.max_steps_in_episode)
    chunk = min(RECORD_CHUNK, max_steps)
    ids = jnp.zeros(1, jnp.int32)   # a batch of one environment, global index 0
    if envs_lib.traits(env).host_batched:
        return _recorded(_host_batched_player(policy, env, env_params, choose, ids, chunk), params, key, max_steps,
                         stride)

    @jax.jit
    def start(key):
        obs, first = jax.vmap(env.reset, (0, None))(vec.env_keys(key, ids), env_params)
        return first, (first, obs.astype(jnp.float32), policy.init_memory(1))

    @jax.jit
    def play(params, key, carry, t0):
        def step(carry, t):
            state, obs, memory = carry
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t + 1), ids))
            pi, _, _, memory = policy.act(params, memory, obs, obs)
            action, env_action = choose(pi, keys[:, 0])
            # env.step splits its key into a transition half and a reset half; the transition
            # half alone gives the same step, without the auto-reset.
            transition_keys = jax.vmap(lambda k: jax.random.split(k)[0])(keys[:, 1])
            obs, state, reward, terminated, _ = jax.vmap(env.step_env, (0, 0, 0, None))(
                transition_keys, state, env_action, env_params)
            done = terminated | jax.vmap(env.is_truncated, (0, None))(state, env_params)
            reward = reward.astype(jnp.float32)
            memory = policy.remember(memory, action, reward, done)
            return (state, obs.astype(jnp.float32), memory), (state, reward, done)

        carry, (states, rewards, dones) = jax.lax.scan(step, carry, t0 + jnp.arange(chunk))
        return carry, states, rewards[:, 0], dones[:, 0]

    return _recorded((start, play), params, key, max_steps, stride)


def _host_batched_player(policy, env, env_params, choose, ids, chunk: int):
    """`record`'s start and play for an environment whose batch steps on the host (Atari): it
    steps through envs.vec as evaluation does, and what is kept and drawn of each step is its
    observation (the environment's state is on the host); the rewards are the game's score."""
    @jax.jit
    def start(key):
        batch = vec.reset(env, env_params, key, ids)
        return batch.obs, (batch, policy.init_memory(1))

    @jax.jit
    def play(params, key, carry, t0):
        def step(carry, t):
            batch, memory = carry
            keys = jax.vmap(jax.random.split)(vec.env_keys(jax.random.fold_in(key, t + 1), ids))
            pi, _, _, memory = policy.act(params, memory, batch.obs, batch.obs)
            action, env_action = choose(pi, keys[:, 0])
            batch, out = vec.step(env, env_params, batch, env_action, keys[:, 1])
            done = out.done_length > 0
            memory = policy.remember(memory, action, out.reward, done)
            return (batch, memory), (batch.obs, out.info.get("game_score", out.reward), done)

        carry, (frames, rewards, dones) = jax.lax.scan(step, carry, t0 + jnp.arange(chunk))
        return carry, frames, rewards[:, 0], dones[:, 0]

    return start, play


def _recorded(player, params, key, max_steps: int, stride: int) -> Episode:
    """Plays `player` (start(key), play(params, key, carry, t0)) in chunks until the episode
    ends, keeping the states (or observations) a video of `stride` draws."""
    start, play = player
    chunk = min(RECORD_CHUNK, max_steps)
    first, carry = start(key)
    kept, steps, rewards = [jax.tree.map(np.asarray, first)], [0], []   # kept: states [k, ...] per chunk
    length = None
    for t0 in range(0, max_steps, chunk):   # steps t0 + 1 .. t0 + chunk follow this call's states
        carry, states, chunk_rewards, dones = play(params, key, carry, t0)
        dones = np.asarray(dones)[:max_steps - t0]
        rewards.append(np.asarray(chunk_rewards)[:len(dones)])
        if dones.any():
            length = t0 + int(np.argmax(dones)) + 1
        last = t0 + len(dones) if length is None else length
        end = max_steps if length is None else length   # the episode's last step, or the recording's
        picked = [t for t in range(t0 + 1, last + 1) if is_picked(t, stride, end)]
        if picked:
            rows = jnp.asarray([t - t0 - 1 for t in picked])
            kept.append(jax.tree.map(lambda s: np.asarray(s[rows, 0]), states))
            steps.extend(picked)
        if length is not None:
            break
    ended = length is not None
    length = max_steps if length is None else length
    states = jax.tree.map(lambda *s: np.concatenate(s), *kept)
    return Episode(states, steps, np.concatenate(rewards)[:length], length, ended)


def summary(env, episode: Episode) -> dict:
    """The episode's numbers: its length and return (multi-agent: the mean over agents, as
    evaluation reports it, and per team the mean of its agents; tags)."""
    returns = episode.rewards.sum(0)
    out = {"episode_length": episode.length, "return": float(np.mean(returns))}
    if not episode.ended:
        out["ended"] = False
    if envs_lib.is_multi_agent(env):
        for name, (a, b) in env.teams.items():
            out[f"{name}/return"] = float(returns[a:b].mean())
        out["tags"] = int(np.asarray(episode.states.tags)[-1])
    return out


# -- drawing -----------------------------------------------------------------------------------

def is_picked(t: int, stride: int, last: int) -> bool:
    """Whether a video of `stride` draws the state at step `t` of an episode whose last step is
    `last`: states 0, stride, 2 stride, ... and the last."""
    return t % stride == 0 or t == last


def picked_steps(length: int, stride: int) -> list[int]:
    """The steps drawn of an episode of L steps: ceil(L / stride) + 1 of them."""
    return [t for t in range(length + 1) if is_picked(t, stride, length)]


def _kept_state(episode: Episode, k: int) -> Any:
    """The k-th kept state (the state at step `episode.steps[k]`)."""
    return jax.tree.map(lambda x: x[k], episode.states)


def frames(env_name: str, env, env_params, episode: Episode) -> tuple[np.ndarray, float]:
    """`(frames uint8 [F, H, W, 3], frames per second)` of the episode's kept states."""
    if env_name in pictures.DRAWN:
        draw, fps = pictures.DRAWN[env_name]
        return np.stack([pictures.with_header(draw(env, env_params, episode.states, k), t)
                         for k, t in enumerate(episode.steps)]), fps
    drawn_as = DRAWN_AS.get(env_name, env_name)
    if drawn_as in CLASSIC_CONTROL:
        return _classic_control_frames(drawn_as, env_params, episode)
    if drawn_as in GYMNAX_DRAWN:
        return _gymnax_frames(env_name, env_params, episode)
    return _rendered_frames(env_name, env, env_params, episode)


def _rendered_frames(env_name: str, env, env_params, episode: Episode) -> tuple[np.ndarray, float]:
    """The environment's own drawing: its render_rgb(state, params) (envs.Traits), one state at a time."""
    out = []
    for k, t in enumerate(episode.steps):
        image = np.asarray(envs_lib.traits(env).render_rgb(_kept_state(episode, k), env_params))
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3 or (out and image.shape != out[0].shape):
            raise UserError(f"--video: {env_name}'s render_rgb gave a {image.dtype} array of shape {image.shape}"
                            f"{f' after {out[0].shape}' if out else ''}; it must give uint8 [height, width, 3], the "
                            f"same shape for every state")
        out.append(image)
    return np.stack([pictures.with_header(image, t) for image, t in zip(out, episode.steps)]), float(
        envs_lib.traits(env).render_fps or RENDER_FPS)


def _classic_control_frames(gym_name: str, env_params, episode: Episode) -> tuple[np.ndarray, float]:
    """Gymnasium's own drawing of a classic-control task, as gymnax's visualizer takes it
    (gymnax.visualize.vis_gym: the parameters and each state copied into gymnasium's env), but
    with one renderer for the whole episode and no matplotlib figure: the visualizer makes and
    closes one (and pygame with it) for every frame and draws each through a figure."""
    import gymnasium as gym
    from gymnax.visualize import vis_gym

    renderer = gym.make(gym_name, render_mode="rgb_array")
    out = []
    try:
        renderer.reset(seed=0)
        drawn = renderer.unwrapped
        vis_gym.set_gym_params(drawn, gym_name, env_params)
        for k, t in enumerate(episode.steps):
            state = _kept_state(episode, k)
            drawn.state = vis_gym.get_gym_state(state, gym_name)
            if gym_name == "Pendulum-v1":  # its drawing shows the last torque
                drawn.last_u = np.asarray(state.last_u, np.float64)
            out.append(pictures.with_header(np.asarray(renderer.render()), t))
    finally:
        renderer.close()
    return np.stack(out), CLASSIC_CONTROL_FPS


def _gymnax_frames(env_name: str, env_params, episode: Episode) -> tuple[np.ndarray, float]:
    # Imported here, not at the top: pyplot, seaborn and gymnasium cost every evaluation's
    # start-up seconds, and only a video draws with them.
    import matplotlib
    matplotlib.use("Agg")  # frames only, no display
    import matplotlib.pyplot as plt
    from gymnax.visualize import Visualizer

    drawn_env, _ = gymnax.make(DRAWN_AS.get(env_name, env_name))
    returns = np.concatenate([[0.0], np.cumsum(episode.rewards)])
    steps = episode.steps
    vis = Visualizer(drawn_env, env_params, [_kept_state(episode, k) for k in range(len(steps))])
    vis.fig.set_dpi(GYMNAX_DPI)
    out = []
    try:
        vis.init()
        for k, t in enumerate(steps):
            vis.update(k)
            vis.ax.set_title(f"{env_name}   step {t}   return {returns[t]:.2f}", fontsize=12)
            vis.fig.canvas.draw()
            out.append(np.asarray(vis.fig.canvas.buffer_rgba())[..., :3].copy())
    finally:
        plt.close(vis.fig)
    return np.stack(out), 1000.0 / vis.interval


# -- writing -----------------------------------------------------------------------------------

def write(path: str, frames_: np.ndarray, fps: float) -> None:
    """`frames_` into `path` (.gif, or .mp4 through imageio-ffmpeg), by way of a temporary file
    in the same directory renamed at the end: an interrupted write leaves no partial video."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix, dir=target.parent)
    os.close(fd)
    try:
        if target.suffix.lower() == ".gif":
            # A GIF holds 256 colours a frame: Pillow's fast octree quantizer, several times faster
            # than its median cut (what imageio asks for) and as good on drawings of few colours.
            # loop=0: play on repeat.
            from PIL import Image
            images = [Image.fromarray(frame).quantize(method=Image.Quantize.FASTOCTREE) for frame in frames_]
            images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:],
                           duration=round(1000.0 / fps), loop=0)
        else:
            with warnings.catch_warnings():
                # imageio-ffmpeg runs ffmpeg in a subprocess; JAX warns at every fork of its
                # multithreaded process, but subprocess execs ffmpeg in the child at once.
                warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
                iio.imwrite(tmp, frames_, extension=".mp4", plugin="FFMPEG", fps=fps)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)   # a new file's usual mode (mkstemp's is private)
        if target.exists():
            raise UserError(f"--video {path}: the file appeared while the video was written; not replacing it")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
