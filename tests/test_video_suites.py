"""`evaluate --video` for other suites' tasks and a user's own environment: each adapter's
`render_rgb` draws a state as an RGB image, the recorded episode is the one evaluation plays
first, and a drawing that is not an image, or MuJoCo without OpenGL, is one line."""

import ctypes.util
import json
import math

import imageio.v3 as iio
import jax
import numpy as np
import pytest

from jaxrl_mgpu import envs, evaluate
from jaxrl_mgpu.tools import video
from jaxrl_mgpu.cli import UserError

from helpers import run

pytestmark = pytest.mark.slow

SUITE_MODULE = {"brax": "brax", "dmc": "mujoco_playground", "craftax": "craftax", "jumanji": "jumanji",
                "navix": "navix", "xminigrid": "xminigrid"}
TASKS = ["brax:inverted_pendulum", "dmc:CartpoleBalance", "craftax:Craftax-Classic-Symbolic-v1", "jumanji:Snake-v1",
         "navix:Navix-Empty-5x5-v0", "xminigrid:MiniGrid-Empty-5x5"]
# MuJoCo (Brax, Playground) draws through OpenGL; headless, through EGL (conftest sets MUJOCO_GL)
NO_EGL = ctypes.util.find_library("EGL") is None


def needs(task):
    suite = task.split(":")[0]
    pytest.importorskip(SUITE_MODULE[suite])
    if suite in ("brax", "dmc") and NO_EGL:
        pytest.skip("MuJoCo draws through EGL here, and libEGL is not installed (Debian: libegl1 libgl1-mesa-dri)")


@pytest.mark.parametrize("task", TASKS)
def test_each_suite_draws_its_states(task):
    needs(task)
    env, params = envs.make(task)
    _, state = env.reset(jax.random.PRNGKey(0), params)
    first = env.render_rgb(state, params)
    assert first.dtype == np.uint8 and first.ndim == 3 and first.shape[-1] == 3 and first.std() > 0
    assert min(first.shape[:2]) >= 64 and getattr(env, "render_fps", video.RENDER_FPS) > 0
    step = jax.jit(env.step_env)
    keys = jax.random.split(jax.random.PRNGKey(1), 8)
    later = state
    for k in keys:   # a few moves: the drawing follows the state
        _, later, _, _, _ = step(k, later, env.action_space(params).sample(k), params)
    drawn = env.render_rgb(later, params)
    assert drawn.shape == first.shape and not np.array_equal(drawn, first)
    np.testing.assert_array_equal(env.render_rgb(state, params), first)   # the same state, the same picture


def record(capsys, run_dir, path, *argv) -> dict:
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(run_dir), "--video", str(path), *map(str, argv)]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def first_evaluated_return(capsys, run_dir) -> float:
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(run_dir), "--episodes", "1", "--devices", "1"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["mean_return"]


def test_a_brax_video_is_the_episode_evaluation_plays_first(tmp_path, capsys):
    """The adapter records with its step without the reset (step_env), which must be the
    transition its step takes."""
    needs("brax:inverted_pendulum")
    run_dir = tmp_path / "run"
    assert run("--env", "brax:inverted_pendulum", "--devices", "1", "--num-envs", "8", "--num-steps", "16",
               "--num-minibatches", "2", "--hidden-size", "16", "--total-timesteps", str(128),
               "--run-dir", str(run_dir)) == 0
    line = record(capsys, run_dir, tmp_path / "episode.gif", "--video-stride", 3)
    frames = iio.imread(tmp_path / "episode.gif", index=None)
    assert frames.shape[0] == line["frames"] == math.ceil(line["episode_length"] / 3) + 1
    assert frames.shape[1] % 16 == 0 and frames.shape[2] % 16 == 0 and frames.std() > 0
    assert line["return"] == pytest.approx(first_evaluated_return(capsys, run_dir), rel=1e-5)


def test_a_drawing_that_is_not_an_image_is_one_line():
    class Drawn:
        def __init__(self, image):
            self.image = image

        def render_rgb(self, state, params):
            return self.image

    episode = video.Episode(np.zeros((2, 1)), [0, 1], np.zeros(1), 1, True)
    frames, fps = video.frames("Mine-v0", Drawn(np.zeros((20, 30, 3), np.uint8)), None, episode)
    assert frames.shape == (2, 48, 32, 3) and fps == video.RENDER_FPS   # a header above, sides of 16
    for image, words in ((np.zeros((20, 30, 3)), "a float64 array of shape (20, 30, 3)"),
                         (np.zeros((20, 30), np.uint8), "shape (20, 30)")):
        with pytest.raises(UserError, match="must give uint8 \\[height, width, 3\\]") as e:
            video.frames("Mine-v0", Drawn(image), None, episode)
        assert words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="no renderer"):
        video.check_env("Mine-v0", object())
    video.check_env("Mine-v0", Drawn(None))


def test_mujoco_without_opengl_is_one_line(monkeypatch):
    pytest.importorskip("brax")
    import mujoco
    env, _ = envs.make("brax:inverted_pendulum", "episode_length=1000")
    env.__dict__.pop("_renderer", None)

    def no_gl(*args, **kwargs):
        raise mujoco.FatalError("gladLoadGL error")

    monkeypatch.setattr(mujoco, "Renderer", no_gl)
    with pytest.raises(UserError, match="MuJoCo could not open an OpenGL context") as e:
        env._renderer
    assert "gladLoadGL error" in str(e.value) and "MUJOCO_GL=osmesa" in str(e.value) and "\n" not in str(e.value)
