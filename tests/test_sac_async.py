"""SAC and TD3 as `--mode learn` and `--mode collect` (algos/sac_async.py over replay_async.py):
the learner runs --mode both's gradient steps on the transitions collectors write, and a
learner fed by one collector learns Pendulum."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_trees_close, resolved, spawn_train, wait_until
from jaxrl_mgpu import config as config_lib
from jaxrl_mgpu import parallel
from jaxrl_mgpu.algos.sac import sac
from jaxrl_mgpu.algos.sac import asynchronous as sac_async
from jaxrl_mgpu.algos.replay import Transitions, ring_sample

SMALL = dict(env="Pendulum-v1", num_envs=8, num_steps=2, updates_per_step=2.0, replay_batch_size=32,
             buffer_size=512, learning_starts=64, hidden_size=16)


def config(**overrides):
    cfg = dict(SMALL, **overrides)
    return config_lib.validate(config_lib.build(cfg))


@pytest.mark.slow
@pytest.mark.parametrize("algo, critic, normalize", [("sac", "plain", False), ("td3", "categorical", True)])
def test_a_learner_iteration_is_mode_boths_gradient_steps_on_its_ring(algo, critic, normalize):
    """--mode learn's iteration starts from --mode both's initial learned state and takes --mode
    both's update's gradient steps (sac.make's learn_steps: the critics, the delayed actor, the
    targets, SAC's temperature) on batches of its ring, its key split as its own; a ring of
    float action vectors, inserted in blocks, gives them back as inserted."""
    cfg = config(algo=algo, critic=critic, v_min=-20.0, v_max=20.0, num_atoms=11, normalize_obs=normalize,
                 mode="learn", run_dir="unused")
    par = parallel.setup("pmap", 1)
    run = resolved(cfg, par)
    split, learner = run.split, sac_async.algorithm(run)
    both = sac.make(dataclasses.replace(cfg, mode="both"), run.env, run.env_params, split)
    rng = np.random.default_rng(0)
    n = split.replay.per_device
    block = Transitions(rng.normal(size=(n, 3)).astype(np.float32), rng.uniform(-1, 1, (n, 1)).astype(np.float32),
                        rng.normal(size=n).astype(np.float32), rng.choice([0.0, 0.99], n).astype(np.float32),
                        rng.normal(size=(n, 3)).astype(np.float32))
    key = jax.random.PRNGKey(3)
    ring = learner.parts.insert(learner.parts.init_replay(par.replicate(np.asarray(key))),
                                par.shard(jax.tree.map(lambda x: x[None], block)))
    got_ring = par.first(ring)
    assert got_ring.action.dtype == jnp.float32 and got_ring.action.shape == (n, 1)
    np.testing.assert_array_equal(got_ring.action, block.action)
    state = learner.parts.init(par.replicate(np.asarray(key)))
    state, losses = learner.parts.learn(state, ring)
    got = par.first(state)

    # --mode both, by hand: its init, then its gradient steps on the same ring's batches
    def reference(key, ring):
        start = both.init(key)
        k, learn_key, stats_key = jax.random.split(start.key, 3)
        params = start.params
        if normalize:
            from jaxrl_mgpu.nets import obs_norm
            seen = ring_sample(ring, jax.random.fold_in(stats_key, 0), split.minibatch.per_device).obs
            params = {**params, obs_norm.OBS_STATS: obs_norm.update(params[obs_norm.OBS_STATS], seen)}
        start = start._replace(params=params, key=k, replay=(), envs=())
        return both.learn_steps(start, lambda kk: ring_sample(ring, kk, split.minibatch.per_device), learn_key)

    want, want_losses = par.first(par.map(reference)(par.replicate(np.asarray(key)), ring))
    for name in sac_async.LearnerState._fields:
        assert_trees_close(getattr(got, name), getattr(want, name))
    assert_trees_close(par.first(losses), want_losses)
    assert int(got.grad_steps) == 4
    moved = jax.tree.map(lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(), got.critic,
                         par.first(learner.parts.init(par.replicate(np.asarray(key)))).critic)
    assert max(jax.tree.leaves(moved)) > 1e-6


def test_the_collectors_follow_the_actors_params_and_act_uniformly_until_learning_starts():
    cfg = config(algo="td3", mode="collect", run_dir="unused")
    template = sac_async.ACTING.template(resolved(cfg))
    assert set(template) == {"params"}
    assert sac_async.ACTING.explore(cfg, 63) == 1.0 and sac_async.ACTING.explore(cfg, 64) == 0.0
    assert "uniform" in sac_async.ACTING.describe(1.0)


@pytest.mark.slow
def test_a_learner_fed_by_a_collector_learns_pendulum_and_resumes(tmp_path):
    """One learner, one collector (both on 1 CPU device), --samples-per-insert 8: the collectors'
    episodes reach a mean return a learner that does not learn cannot (random play: about -1,200)
    within 250 iterations; stopped at iteration 100, the learner resumes from its checkpoint."""
    run_dir = tmp_path / "run"
    common = ["--config", "pendulum-sac", "--devices", "1", "--samples-per-insert", "8", "--shard-steps", "32",
              "--log-every", "25", "--checkpoint-every", "50", "--run-dir", str(run_dir)]
    learner = spawn_train([*common, "--mode", "learn", "--stop-at-update", "100"])
    wait_until(lambda: (run_dir / "checkpoints").is_dir())
    collector = spawn_train([*common, "--mode", "collect", "--collector-id", "c1"])
    out, _ = learner.communicate(timeout=300)
    assert learner.returncode == 0, out
    learner = spawn_train([*common, "--mode", "learn", "--resume"])
    out, _ = learner.communicate(timeout=300)
    assert learner.returncode == 0, out
    collector_out, _ = collector.communicate(timeout=60)  # stops by itself when the learner is done
    assert collector.returncode == 0, collector_out
    assert "uniform random actions" in collector_out and "the policy's actions" in collector_out
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["update"] == 250 and [r["update"] for r in rows].count(100) == 1
    assert rows[-1]["grad_steps"] == 250 * 32
    returns = [r["episode_return"] for r in rows if r["episode_return"] is not None]
    assert max(returns[-4:]) > -600, returns
    # the summary's final return is the last one logged (the learner's rows carry the collectors' episodes)
    assert json.loads((run_dir / "summary.json").read_text())["final_return"] == pytest.approx(returns[-1])
    assert "env steps received/s" in out
