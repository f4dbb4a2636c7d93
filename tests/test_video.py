"""`evaluate --video`: one episode of a trained policy drawn into a GIF (or an MP4 where
imageio-ffmpeg is installed). The file decodes, has one frame per state (the state before the
first step and after each: L + 1 for an L-step episode; ceil(L / k) + 1 with --video-stride k),
shows the episode the evaluation plays first, and bad input is one line, exit 2, no file."""

import json
import math
import shutil

import imageio.v3 as iio
import numpy as np
import pytest

from jaxrl_mgpu import envs, evaluate
from jaxrl_mgpu.tools import pictures, video
from jaxrl_mgpu.envs import tag

from helpers import run

# 8 environments x 16 steps on one device (the fewest programs to compile): an update is 128
# env steps; 2 updates.
TINY = ["--devices", "1", "--num-envs", "8", "--num-steps", "16", "--num-minibatches", "2", "--hidden-size", "16",
        "--total-timesteps", str(128 * 2)]
GRID = ["--env", "TagGridworld-v0", "--env-args", "num_taggers=2,grid_length=5,episode_length=20"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny trained runs: CartPole (gymnax's visualizer), DarkRoom with two seeds (the
    project's drawing; a many-run directory), the Tag gridworld (multi-agent)."""
    root = tmp_path_factory.mktemp("runs")
    made = {"cartpole": root / "cartpole", "darkroom": root / "darkroom", "grid": root / "grid"}
    assert run(*TINY, "--run-dir", str(made["cartpole"])) == 0
    assert run("--devices", "1", "--num-envs", "8", "--num-steps", "20", "--num-minibatches", "2", "--hidden-size", "16",
               "--total-timesteps", str(160 * 2), "--env", "DarkRoom", "--num-seeds", "2",
               "--run-dir", str(made["darkroom"])) == 0
    assert run(*TINY, *GRID, "--run-dir", str(made["grid"])) == 0
    return made


def record(capsys, run_dir, path, *argv) -> dict:
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(run_dir), "--video", str(path), *map(str, argv)]) == 0
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["video"] == str(path)
    return line


def decoded(path) -> np.ndarray:
    return iio.imread(path, index=None)


def evaluated_first_episode(capsys, run_dir, *argv) -> dict:
    """`evaluate --episodes 1`: the first line (for a Tag game: trained taggers and runners)."""
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(run_dir), "--episodes", "1", "--devices", "1", *argv]) == 0
    return json.loads(capsys.readouterr().out.splitlines()[0])


@pytest.mark.slow
def test_cartpole_gif_shows_the_evaluated_episode(runs, tmp_path, capsys):
    path = tmp_path / "cartpole.gif"
    line = record(capsys, runs["cartpole"], path)
    frames = decoded(path)
    length = line["episode_length"]
    assert 1 <= length < 500
    assert frames.shape == (length + 1, 416, 608, 3) and line["frames"] == length + 1  # gymnasium 400 x 600, a header
    assert frames.std() > 0 and not np.array_equal(frames[0], frames[-1])
    # the episode is the evaluation's first: the same return
    assert line["return"] == pytest.approx(evaluated_first_episode(capsys, runs["cartpole"])["mean_return"])
    assert line["return"] == length   # CartPole pays 1 a step

    strided = tmp_path / "strided.gif"
    line = record(capsys, runs["cartpole"], strided, "--video-stride", 4, "--greedy", "--episodes", 1)  # one, as --video
    expected = math.ceil(line["episode_length"] / 4) + 1
    assert line["frames"] == expected and line["stride"] == 4 and decoded(strided).shape[0] == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cartpole.gif", "strided.gif"]   # no temporary left


@pytest.mark.slow
def test_an_episode_recorded_in_chunks_is_the_same_episode(runs, tmp_path, capsys, monkeypatch):
    whole = record(capsys, runs["cartpole"], tmp_path / "whole.gif", "--video-stride", 3)
    monkeypatch.setattr(video, "RECORD_CHUNK", 4)   # chunk boundaries that are not the stride's
    chunked = record(capsys, runs["cartpole"], tmp_path / "chunked.gif", "--video-stride", 3)
    assert whole["episode_length"] > 2 * 4 and chunked == {**whole, "video": str(tmp_path / "chunked.gif")}
    np.testing.assert_array_equal(decoded(tmp_path / "whole.gif"), decoded(tmp_path / "chunked.gif"))


@pytest.mark.slow
def test_darkroom_gif_of_a_many_run_directory(runs, tmp_path, capsys):
    first = record(capsys, runs["darkroom"], tmp_path / "run0.gif")
    second = record(capsys, runs["darkroom"], tmp_path / "run1.gif", "--run", 1)
    assert (first["run"], first["seed"], second["run"], second["seed"]) == (0, 0, 1, 1)
    for line, name in ((first, "run0.gif"), (second, "run1.gif")):
        frames = decoded(tmp_path / name)
        assert line["episode_length"] == 20 and frames.shape[0] == line["frames"] == 21
        assert frames.shape[1] % 16 == 0 and frames.shape[2] % 16 == 0
        assert len({f.tobytes() for f in frames}) == 21   # every step its own frame (the step number)


@pytest.mark.slow
@pytest.mark.skipif(not video._installed("imageio_ffmpeg"), reason="an .mp4 needs imageio-ffmpeg")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")   # imageio-ffmpeg reads through a subprocess
def test_darkroom_mp4(runs, tmp_path, capsys):
    line = record(capsys, runs["darkroom"], tmp_path / "room.mp4", "--greedy")
    assert decoded(tmp_path / "room.mp4").shape[0] == line["frames"] == 21


@pytest.mark.slow
def test_tag_gridworld_gif_shows_the_evaluated_game(runs, tmp_path, capsys):
    path = tmp_path / "tag.gif"
    line = record(capsys, runs["grid"], path)
    frames = decoded(path)
    assert 1 <= line["episode_length"] <= 20 and frames.shape[0] == line["frames"] == line["episode_length"] + 1
    assert line["tags"] in (0, 1) and {"taggers/return", "runners/return"} <= line.keys()
    assert line["return"] == pytest.approx(evaluated_first_episode(capsys, runs["grid"])["mean_return"], rel=1e-5)


def colour_present(frame: np.ndarray, colour) -> bool:
    return bool(np.all(frame == np.asarray(colour, np.uint8), axis=-1).any())


def test_tag_drawings_colour_the_teams_and_mark_a_tagged_runner():
    grid, grid_params = envs.make("TagGridworld-v0", "num_taggers=2,grid_length=4")
    # step 0: the runner in its corner; step 1: a tagger on its cell, the runner out of the game
    states = tag.GridState(pos=np.array([[[2, 2], [2, 2], [0, 0]], [[1, 1], [0, 0], [0, 0]]], np.int32),
                           active=np.array([[True, True, True], [True, True, False]]),
                           tags=np.array([0, 1], np.int32), time=np.array([0, 1], np.int32))
    two_states = video.Episode(states, [0, 1], np.zeros((1, 3)), 1, True)
    frames, _ = video.frames("TagGridworld-v0", grid, grid_params, two_states)
    assert frames.shape[0] == 2
    tagger, runner = pictures.TEAM_COLOURS[tag.TAGGER], pictures.TEAM_COLOURS[tag.RUNNER]
    assert colour_present(frames[0], tagger) and colour_present(frames[0], runner)
    assert not colour_present(frames[0], pictures.TAGGED)
    assert colour_present(frames[1], tagger) and colour_present(frames[1], pictures.TAGGED)
    assert not colour_present(frames[1], runner)

    cont, cont_params = envs.make("TagContinuous-v0", "num_taggers=1,num_runners=2")
    states = tag.ContinuousState(pos=np.array([[[1.0, 1.0], [5.0, 5.0], [9.0, 9.0]]] * 2, np.float32),
                                 speed=np.zeros((2, 3), np.float32), direction=np.zeros((2, 3), np.float32),
                                 acceleration=np.zeros((2, 3), np.float32),
                                 active=np.array([[True, True, True], [True, False, True]]),
                                 tags=np.array([0, 1], np.int32), time=np.array([0, 1], np.int32))
    two_states = video.Episode(states, [0, 1], np.zeros((1, 3)), 1, True)
    frames, _ = video.frames("TagContinuous-v0", cont, cont_params, two_states)
    assert colour_present(frames[0], runner) and not colour_present(frames[0], pictures.TAGGED)
    assert colour_present(frames[1], runner) and colour_present(frames[1], pictures.TAGGED)


def one_error_line(capsys, argv) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        evaluate.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.slow
def test_bad_video_requests_are_one_line_and_write_nothing(runs, tmp_path, capsys, monkeypatch):
    cartpole = ["--run-dir", str(runs["cartpole"])]
    existing = tmp_path / "existing.gif"
    existing.write_bytes(b"mine")
    (tmp_path / "afile").write_text("")
    cases = [
        (["--video", str(tmp_path / "out.avi")], "must end in .gif or .mp4"),
        (["--video", str(existing)], "the file exists"),
        (["--video", str(tmp_path / "missing" / "out.gif")], "is not a directory"),
        (["--video", str(tmp_path / "afile" / "out.gif")], "is not a directory"),
        (["--video", str(tmp_path / "out.gif"), "--video-stride", "0"], "--video-stride must be at least 1"),
        (["--video-stride", "2"], "--video-stride applies only with --video"),
        (["--video", str(tmp_path / "out.gif"), "--episodes", "4"], "--video records one episode"),
        (["--video", str(tmp_path / "out.gif"), "--run", "1"], "the run directory holds one run"),
    ]
    for argv, words in cases:
        assert words in one_error_line(capsys, cartpole + argv)

    # an environment with no renderer: the CartPole run, its config saying DeepSea
    deep_sea = tmp_path / "deep_sea"
    shutil.copytree(runs["cartpole"], deep_sea)
    config = json.loads((deep_sea / "config.json").read_text())
    (deep_sea / "config.json").write_text(json.dumps({**config, "env": "DeepSea-bsuite"}))
    words = "--env DeepSea-bsuite has no renderer"
    assert words in one_error_line(capsys, ["--run-dir", str(deep_sea), "--video", str(tmp_path / "out.gif")])

    monkeypatch.setattr(video, "iio", None)
    assert 'needs imageio (the video extra): pip install -e ".[video]"' in one_error_line(
        capsys, cartpole + ["--video", str(tmp_path / "out.gif")])
    monkeypatch.undo()
    monkeypatch.setattr(video, "_installed", lambda module: module not in ("imageio_ffmpeg", "pygame"))
    assert "an .mp4 needs imageio-ffmpeg" in one_error_line(capsys, cartpole + ["--video", str(tmp_path / "out.mp4")])
    assert "gymnasium draws CartPole-v1 with pygame" in one_error_line(
        capsys, cartpole + ["--video", str(tmp_path / "out.gif")])

    assert existing.read_bytes() == b"mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "deep_sea", "existing.gif"]


def test_picked_steps():
    assert video.picked_steps(10, 1) == list(range(11))
    assert video.picked_steps(10, 4) == [0, 4, 8, 10]
    assert video.picked_steps(8, 4) == [0, 4, 8]
    for length in range(1, 30):
        for stride in range(1, 7):
            assert len(video.picked_steps(length, stride)) == math.ceil(length / stride) + 1
