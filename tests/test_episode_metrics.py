"""An environment's episode metrics (envs.episode_metrics): `info` entries it names in
`episode_metrics`, read at the step that ends an episode, averaged over the episodes that
end in a log row and logged as `env/NAME`, over all devices, by PPO and DQN; and the
one-line errors for a metric the step does not give."""

import json

import jax
import jax.numpy as jnp
import pytest
from flax import struct
from gymnax.environments import environment

from jaxrl_mgpu import envs, evaluate
from helpers import run, tensorboard_scalars
from test_truncation import ConstantReward

FILLER = 1000.0  # what the metrics read at steps that end no episode: counted, it shows


@struct.dataclass
class CountdownState(environment.EnvState):
    length: jax.Array  # this episode's length, drawn at its reset


class Countdown(ConstantReward):
    """Episodes of a random length, 2 to 6 steps, that end as terminations. Its info gives the
    length at the step that ends an episode (FILLER elsewhere) and a constant 7, so
    `env/length` must equal the logged `episode_length` and `env/seven` must be 7. (Its spaces
    are ConstantReward's.)"""

    episode_metrics = ("length", "seven")

    @property
    def default_params(self) -> environment.EnvParams:
        return environment.EnvParams(max_steps_in_episode=100)

    def step_env(self, key, state, action, params):
        state = state.replace(time=state.time + 1)
        done = state.time >= state.length
        info = {"length": jnp.where(done, state.length, FILLER).astype(jnp.float32), "seven": jnp.float32(7.0)}
        return jnp.zeros(1), state, jnp.float32(1.0), done, info

    def reset_env(self, key, params):
        return jnp.zeros(1), CountdownState(time=0, length=jax.random.randint(key, (), 2, 7))


class Undeclared(Countdown):
    episode_metrics = ("lives",)


class NotPerStep(Countdown):
    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = super().step_env(key, state, action, params)
        return obs, state, reward, done, {**info, "length": jnp.zeros(3)}


for _name, _cls in (("Countdown-test", Countdown), ("Undeclared-test", Undeclared), ("NotPerStep-test", NotPerStep)):
    envs.register(_name, lambda cls=_cls: (cls(), cls().default_params), {})


SMALL = ["--num-envs", "16", "--num-steps", "8", "--total-timesteps", str(16 * 8 * 6), "--log-every", "2",
         "--checkpoint-every", "0"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_episode_metrics_are_the_mean_over_the_episodes_that_ended(tmp_path, capsys, algo):
    extra = ["--learning-starts", "256", "--buffer-size", "1024"] if algo == "dqn" else []
    assert run("--algo", algo, "--env", "Countdown-test", "--devices", "4", *SMALL, *extra, "--eval-every", "2",
               "--eval-episodes", "8", "--run-dir", str(tmp_path)) == 0
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    logged = [r for r in rows if r.get("episodes")]
    assert len(logged) == 3
    for r in logged:
        assert r["env/length"] == pytest.approx(r["episode_length"], rel=1e-6)
        assert r["env/seven"] == pytest.approx(7.0)
    assert [v for _, v in tensorboard_scalars(tmp_path)["env/seven"]] == pytest.approx([7.0] * 3)
    # evaluation: the first episode of each evaluation environment, in training's rows and `evaluate`'s line
    evals = [r for r in rows if "eval/episode_return" in r]
    assert evals and all(r["eval/env/seven"] == pytest.approx(7.0) and 2 <= r["eval/env/length"] <= 6 for r in evals)
    capsys.readouterr()
    assert evaluate.main(["--run-dir", str(tmp_path), "--episodes", "8"]) in (0, None)
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["env/seven"] == pytest.approx(7.0) and line["episodes"] == 8
    assert line["env/length"] == pytest.approx(line["mean_return"])  # reward 1 a step: the return is the length


@pytest.mark.slow
def test_an_environment_without_episode_metrics_logs_none(tmp_path):
    assert run("--env", "CartPole-v1", *SMALL, "--run-dir", str(tmp_path)) == 0
    assert not [k for line in open(tmp_path / "metrics.jsonl") for k in json.loads(line) if k.startswith("env/")]


@pytest.mark.parametrize("name, message", [
    ("Undeclared-test", "Undeclared: episode metric 'lives' is not in its step's info, which holds "
                        "final_observation, length, seven, terminated, truncated"),
    ("NotPerStep-test", "NotPerStep: episode metric 'length' must be one number per environment step; its "
                        "shape is (3,)"),
])
def test_a_metric_the_step_does_not_give_is_one_line(tmp_path, capsys, name, message):
    assert run("--env", name, *SMALL, "--run-dir", str(tmp_path / "run")) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {message}"]
    assert not (tmp_path / "run").exists()
