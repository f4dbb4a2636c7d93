"""tracking.py: --track mlflow against a real MLflow server (started here, SQLite behind it), and
--track wandb offline, read back from W&B's own run file; a resume continues the same tracked
run, many runs are one group, and a tracker that is down or dies never costs the training."""

import glob
import json
import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import evaluate, tracking

from helpers import one_error_line, rows, run, wait_until

SMALL = ["--num-envs", "8", "--num-steps", "16", "--hidden-size", "16", "--total-timesteps", str(8 * 16 * 8),
         "--log-every", "2", "--checkpoint-every", "2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: Path) -> tuple[subprocess.Popen, str]:
    """`mlflow server` on a free localhost port, with a SQLite store and artifacts under `root`."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                               f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            assert server.poll() is None, "mlflow server exited"
            return False
    wait_until(up, timeout=180)
    return server, uri


def stop_server(server: subprocess.Popen) -> None:
    os.killpg(server.pid, 9)
    server.wait()


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    pytest.importorskip("mlflow")
    server, uri = start_server(tmp_path_factory.mktemp("mlflow"))
    yield uri
    stop_server(server)


def client(uri):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def numeric_series(run_dir: Path, identity=()) -> dict[str, list[tuple[int, float]]]:
    """metrics.jsonl as {metric: [(env steps, value), ...]} (what a tracked run must hold)."""
    series: dict = {}
    for row in rows(run_dir):
        for key, value in row.items():
            if key != "env_steps" and key not in identity and isinstance(value, (int, float)):
                series.setdefault(key, []).append((row["env_steps"], float(value)))
    return series


def run_parameters(run_dir: Path) -> dict[str, str]:
    """config.json as MLflow parameters: the run's options (not one invocation's, such as
    --resume, nor where a resume counted from), as strings."""
    skip = set(config_lib.per_invocation()) | {"resumed_update", "resumed_steps"}
    return {k: v if isinstance(v, str) else json.dumps(v)
            for k, v in json.loads((run_dir / "config.json").read_text()).items() if k not in skip}


# -- MLflow ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_mlflow_gets_every_row_the_config_and_the_files_and_a_resume_continues_its_run(mlflow_uri, tmp_path):
    run_dir = tmp_path / "run"
    flags = [*SMALL, "--track", "mlflow", "--track-uri", mlflow_uri, "--track-experiment", "resume-test",
             "--run-dir", str(run_dir)]
    assert run(*flags, "--stop-at-update", "4") == 0
    first = json.loads((run_dir / "tracking.json").read_text())["mlflow"]["runs"]
    assert run(*flags, "--resume") == 0
    state = json.loads((run_dir / "tracking.json").read_text())["mlflow"]
    assert state["runs"] == first and len(first) == 1  # the same tracked run, continued
    mlflow = client(mlflow_uri)
    experiment = mlflow.get_experiment_by_name("resume-test")
    assert len(mlflow.search_runs([experiment.experiment_id])) == 1
    tracked = mlflow.get_run(first[0])
    assert tracked.info.status == "FINISHED"
    for key, expected in numeric_series(run_dir).items():  # every series, at the same steps, once each
        history = sorted((m.step, m.value) for m in mlflow.get_metric_history(first[0], key))
        assert history == pytest.approx(expected), key
    assert tracked.data.params == run_parameters(run_dir)
    assert tracked.data.tags["devices"] == "8" and tracked.data.tags["hosts"] == "1" and "commit" in tracked.data.tags
    assert "summary.json" in [a.path for a in mlflow.list_artifacts(first[0])]
    # a video of the trained policy, added to the same tracked run when asked
    assert evaluate.main(["--run-dir", str(run_dir), "--video", str(tmp_path / "episode.gif"), "--track"]) == 0
    assert "episode.gif" in [a.path for a in mlflow.list_artifacts(first[0])]


@pytest.mark.slow
def test_mlflow_many_runs_are_one_tracked_run_each_in_one_group(mlflow_uri, tmp_path):
    run_dir = tmp_path / "seeds"
    assert run(*SMALL, "--num-seeds", "3", "--track", "mlflow", "--track-uri", mlflow_uri, "--track-experiment",
               "seeds-test", "--run-dir", str(run_dir)) == 0
    mlflow = client(mlflow_uri)
    ids = json.loads((run_dir / "tracking.json").read_text())["mlflow"]["runs"]
    tracked = [mlflow.get_run(i) for i in ids]
    assert len(tracked) == 3 and {r.data.tags["group"] for r in tracked} == {"seeds"}
    assert [r.data.params["seed"] for r in tracked] == ["0", "1", "2"]
    lines = rows(run_dir)
    for i, r in enumerate(tracked):
        own = [(line["env_steps"], line["episode_return"]) for line in lines if line["run"] == i
               and line.get("episode_return") is not None]
        history = sorted((m.step, m.value) for m in mlflow.get_metric_history(r.info.run_id, "episode_return"))
        assert history == pytest.approx(own)


@pytest.mark.slow
def test_a_tracker_that_dies_mid_run_costs_one_warning_line_and_nothing_else(tmp_path):
    pytest.importorskip("mlflow")
    server, uri = start_server(tmp_path / "server")
    run_dir = tmp_path / "run"
    # (MLflow's own variables, as its users set them: one try per request, so the failure shows at once)
    env = {**os.environ, "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=1"}
    trainer = subprocess.Popen([sys.executable, "-m", "jaxrl_mgpu.train", *SMALL[:-6], "--total-timesteps",
                                str(8 * 16 * 4000), "--log-every", "8", "--checkpoint-every", "0", "--track", "mlflow",
                                "--track-uri", uri, "--run-dir", str(run_dir)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: (run_dir / "tracking.json").exists()
                   and json.loads((run_dir / "tracking.json").read_text())["mlflow"]["step"] > 0, timeout=300)
    finally:
        stop_server(server)
    out, err = trainer.communicate(timeout=600)
    assert trainer.returncode == 0, out + err
    assert [r["update"] for r in rows(run_dir)] == list(range(8, 4001, 8))  # metrics.jsonl whole
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "--track mlflow failed" in warnings[0], err


# -- W&B, offline ---------------------------------------------------------------------------------

def wandb_records(run_dir: Path, kind: str) -> dict[str, list]:
    """Each offline W&B run's records of one kind ("history", "config", "run"), {run id: [record
    field, ...]}, read from its run-<id>.wandb files (W&B's record log: LevelDB's log format of
    W&B's own protobuf Records)."""
    from wandb.proto import wandb_internal_pb2
    out: dict = {}
    for path in sorted(glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))):
        data, pos, pending, block = Path(path).read_bytes(), 7, b"", 32768  # after W&B's 7-byte header
        records = []
        while pos + 7 <= len(data):
            if block - pos % block < 7:  # a block's tail too short for a header is padding
                pos += block - pos % block
                continue
            _, length, piece = struct.unpack("<IHB", data[pos:pos + 7])
            if piece == 0 and length == 0:
                break
            chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
            pending = chunk if piece in (1, 2) else pending + chunk
            if piece in (1, 4):  # a whole record, or a record's last piece
                records.append(pending)
        for raw in records:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(raw)
            if record.WhichOneof("record_type") == kind:
                out.setdefault(Path(path).stem.removeprefix("run-"), []).append(getattr(record, kind))
    return out


def wandb_history(run_dir: Path) -> dict[str, list[dict]]:
    """Each offline W&B run's history rows, {run id: [row, ...]}."""
    return {run: [{item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in h.item}
                  for h in records] for run, records in wandb_records(run_dir, "history").items()}


def wandb_config(run_dir: Path) -> dict[str, dict]:
    """Each offline W&B run's config, {run id: {name: value}}: its run record's, with later
    config records over it (W&B's own keys left out)."""
    out: dict = {}
    for kind in ("run", "config"):
        for run, records in wandb_records(run_dir, kind).items():
            for record in records:
                config = record.config if kind == "run" else record
                out.setdefault(run, {}).update({item.key: json.loads(item.value_json) for item in config.update
                                                if not item.key.startswith("_")})
    return out


@pytest.mark.slow
def test_wandb_offline_gets_every_row_and_a_resume_continues_its_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    run_dir = tmp_path / "run"
    flags = [*SMALL, "--track", "wandb", "--run-dir", str(run_dir)]
    assert run(*flags, "--stop-at-update", "4") == 0
    assert run(*flags, "--resume") == 0
    ids = json.loads((run_dir / "tracking.json").read_text())["wandb"]["runs"]
    history = wandb_history(run_dir)
    assert list(history) == ids  # the resume logged into the same run
    steps = {}
    for row in history[ids[0]]:
        steps[row["_step"]] = row
    for key, expected in numeric_series(run_dir).items():
        assert [(s, steps[s][key]) for s, _ in expected] == pytest.approx(expected), key
    assert sorted(steps) == [r["env_steps"] for r in rows(run_dir)]
    saved = json.loads((run_dir / "config.json").read_text())
    assert {k: v for k, v in wandb_config(run_dir)[ids[0]].items()} == {
        k: v for k, v in saved.items() if k in tracking.parameters(saved)}
    assert glob.glob(str(run_dir / "wandb" / "offline-run-*" / "files" / "summary.json"))
    # many runs: one W&B run each, in one group, each with its own seed
    seeds = tmp_path / "seeds"
    assert run(*SMALL, "--num-seeds", "3", "--track", "wandb", "--run-dir", str(seeds)) == 0
    ids = json.loads((seeds / "tracking.json").read_text())["wandb"]["runs"]
    assert len(ids) == 3 and {r.run_group for runs in wandb_records(seeds, "run").values() for r in runs} == {"seeds"}
    assert [wandb_config(seeds)[i]["seed"] for i in ids] == [0, 1, 2]
    assert all(len(wandb_history(seeds)[i]) == 4 for i in ids)


# -- bad input: one line, exit 2, nothing written ----------------------------------------------------

def test_a_tracker_whose_extra_is_missing_names_its_pip_install(tmp_path, capsys, monkeypatch):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else
                        real(name, *a))
    assert run(*SMALL, "--track", "mlflow", "--run-dir", str(tmp_path / "run")) == 2
    assert 'pip install -e ".[mlflow]"' in one_error_line(capsys) and not (tmp_path / "run").exists()


def test_an_unreachable_mlflow_server_is_one_line_and_nothing_written(tmp_path, capsys):
    pytest.importorskip("mlflow")
    uri = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    assert run(*SMALL, "--track", "mlflow", "--track-uri", uri, "--run-dir", str(tmp_path / "run")) == 2
    assert f"the tracking server {uri} cannot be reached" in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_wandb_online_without_credentials_says_to_log_in_or_go_offline(tmp_path, capsys, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("NETRC", str(tmp_path / "none"))
    assert run(*SMALL, "--track", "wandb", "--run-dir", str(tmp_path / "run")) == 2
    line = one_error_line(capsys)
    assert "wandb login" in line and "WANDB_MODE=offline" in line and not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["tensorboard", "wandb,wandb", ""])
def test_an_unknown_tracker_is_one_line(value, tmp_path, capsys):
    assert run(*SMALL, "--track", value, "--run-dir", str(tmp_path / "run")) == 2
    assert "--track" in one_error_line(capsys) and not (tmp_path / "run").exists()


def test_a_tracker_option_without_track_is_refused(tmp_path, capsys):
    assert run(*SMALL, "--track-project", "x", "--run-dir", str(tmp_path / "run")) == 2
    assert "--track-project" in one_error_line(capsys)


@pytest.mark.slow
def test_warn_on_failure_trains_without_the_tracker(tmp_path, capsys):
    pytest.importorskip("mlflow")
    uri = f"http://127.0.0.1:{free_port()}"
    assert run(*SMALL, "--track", "mlflow", "--track-uri", uri, "--track-on-failure", "warn",
               "--run-dir", str(tmp_path / "run")) == 0
    err = capsys.readouterr().err
    assert "warning: --track mlflow: the tracking server" in err and "training without it" in err
    assert len(rows(tmp_path / "run")) == 4 and not (tmp_path / "run" / "tracking.json").exists()
