"""`python -m jaxrl_mgpu.bench` at toy sizes: one JSON line per measurement, the table, the
baseline, traces with --profile, the transformer step's MFU, and bad input."""

import json

import pytest

from jaxrl_mgpu.tools import bench


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_throughput_rows_baseline_and_profile(tmp_path, capsys):
    out_file = tmp_path / "rows.jsonl"
    assert bench.main(["--envs-per-device", "4", "--devices", "1", "2", "--num-steps", "4", "--updates", "1",
                       "--repeats", "1", "--baseline", "--out", str(out_file), "--profile", str(tmp_path / "prof")]) == 0
    rows = json_lines(capsys.readouterr().out)
    assert [(r["impl"], r["devices"], r["num_envs"]) for r in rows] == [
        ("jaxrl_mgpu", 1, 4), ("reference_ppo", 1, 4), ("jaxrl_mgpu", 2, 8)]
    assert all(r["env_steps_per_s"] > 0 and r["envs_per_device"] == 4 for r in rows)
    assert json_lines(out_file.read_text()) == rows
    traces = sorted(p.name for p in (tmp_path / "prof").iterdir())
    assert traces == ["jaxrl_mgpu-1dev-4envs", "jaxrl_mgpu-2dev-8envs", "reference_ppo-4envs"]
    assert all(list((tmp_path / "prof" / t).rglob("*.xplane.pb")) for t in traces)


@pytest.mark.slow
def test_the_issue_and_readme_form_with_env_and_num_envs(capsys):
    """`--env` is a training flag passed through, not an abbreviation of --envs-per-device."""
    assert bench.main(["--algo", "ppo", "--env", "CartPole-v1", "--num-envs", "8", "--num-steps", "4",
                       "--devices", "2", "--updates", "1", "--repeats", "1"]) == 0
    (row,) = json_lines(capsys.readouterr().out)
    assert (row["env"], row["num_envs"], row["devices"]) == ("CartPole-v1", 8, 2)


@pytest.mark.slow
def test_transformer_step_reports_mfu(capsys):
    assert bench.main(["--transformer-step", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
                       "--context-len", "8", "--batch", "2", "--precisions", "fp32", "--repeats", "1",
                       "--steps-per-timing", "3"]) == 0
    out = capsys.readouterr().out
    (row,) = json_lines(out)
    assert row["tokens_per_s"] > 0 and 0 < row["mfu"] and row["batch"] == 2 and "MFU" in out
    assert row["steps_per_timing"] == 3
    # The ceiling before and after the row; the MFU is against their median.
    ceilings = row["matmul_ceilings_tflops"]
    assert len(ceilings) == 2 and row["matmul_ceiling_tflops"] == pytest.approx(sum(ceilings) / 2)
    assert row["mfu"] == pytest.approx(row["tflops"] / row["matmul_ceiling_tflops"])
    assert "median of 2 measurements" in out


@pytest.mark.slow
def test_transformer_step_times_fp32_with_xla_kernels(capsys):
    """fp32 is the speed-up's reference: one row with XLA's attention and MLP, even when only
    fused kernels (bf16/fp16) are asked for."""
    assert bench.main(["--transformer-step", "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
                       "--context-len", "8", "--batch", "2", "--precisions", "fp32", "--attention", "cudnn",
                       "pallas", "--mlp", "pallas", "--repeats", "1", "--steps-per-timing", "1"]) == 0
    (row,) = json_lines(capsys.readouterr().out)
    assert (row["precision"], row["attention"], row["mlp"]) == ("fp32", "xla", "xla")


def test_transformer_table_speedup_column():
    """The vs-fp32 column: the ratio to the same model's fp32 row, "-" where none was timed."""
    row = dict(d_model=16, n_layers=1, n_heads=2, context_len=8, batch=2, attention="xla", mlp="xla",
               tflops=1.0, mfu=0.1, device_kind="cpu")
    fp32, bf16 = dict(row, precision="fp32", tokens_per_s=100.0), dict(row, precision="bf16", tokens_per_s=250.0)
    assert bench.transformer_table([fp32, bf16], [10.0]).splitlines()[-1].split()[-1] == "2.50"
    last = bench.transformer_table([bf16], [10.0]).splitlines()[-1]
    assert last.split()[-1] == "-" and "nan" not in last


def test_bad_steps_per_timing_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--transformer-step", "--steps-per-timing", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--steps-per-timing" in err[0]


def test_bad_precision_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--transformer-step", "--precisions", "bf8"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "--precisions" in err[-1] and "bf8" in err[-1]


def test_bad_device_count_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--devices", "99", "--num-steps", "4"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--devices" in err[0]
