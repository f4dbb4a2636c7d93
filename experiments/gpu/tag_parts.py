"""Where the continuous Tag game's training time goes on one GPU, and what the candidates for
the nearest-neighbour search and the compute precision buy (issue 29):

    python3 experiments/gpu/tag_parts.py AGENTS GAMES STEPS [--nearest top_k argmin] [--updates ...]

For each nearest-neighbour search: the game's steps alone (uniform-random actions, no policy),
then whole training updates (rollout + learning) of the tag-continuous preset for each
`--updates` entry (none: `--updates` alone) `EPOCHSxMINIBATCHES:PRECISION` (1x1 is the one gradient step of WarpDrive's
A2C trainer). One JSON line per measurement; agent steps count every agent of every game step.
The search is swapped by patching TagContinuous._nearest in this process only.
"""

import argparse
import dataclasses
import json
import time

import jax
import jax.numpy as jnp

from jaxrl_mgpu import plan as plan_lib
from jaxrl_mgpu import chunks, config as config_lib, envs, parallel
from jaxrl_mgpu.envs import tag

SEARCH = tag.TagContinuous._nearest  # the package's: K read-only argmin passes


def nearest_top_k(self, state):
    """The same K nearest (nearest first, lowest index on ties) by lax.top_k of the negated
    [N, N] distances."""
    d2 = jnp.sum((state.pos[:, None, :] - state.pos[None, :, :]) ** 2, axis=-1)
    hidden = jnp.eye(self.num_agents, dtype=bool) | jnp.logical_not(state.active)[None, :]
    neg, seen = jax.lax.top_k(jnp.where(hidden, -jnp.inf, -d2), self.num_other_agents_observed)
    return seen, (jnp.isfinite(neg) & state.active[:, None]).astype(jnp.float32)


def nearest_rewrite(self, state):
    """The same by K passes of argmin over the [N, N] distances, each pass rewriting the
    distances to hide the agent it found."""
    n = self.num_agents
    d2 = jnp.sum((state.pos[:, None, :] - state.pos[None, :, :]) ** 2, axis=-1)
    hidden = jnp.eye(n, dtype=bool) | jnp.logical_not(state.active)[None, :]
    d2 = jnp.where(hidden, jnp.inf, d2)
    cols = jnp.arange(n)[None, :]
    seen, found = [], []
    for _ in range(self.num_other_agents_observed):
        i = jnp.argmin(d2, axis=-1)
        found.append(jnp.min(d2, axis=-1))
        seen.append(i)
        d2 = jnp.where(cols == i[:, None], jnp.inf, d2)
    shown = jnp.isfinite(jnp.stack(found, -1)) & state.active[:, None]
    return jnp.stack(seen, -1), shown.astype(jnp.float32)


NEAREST = {"argmin": SEARCH, "top_k": nearest_top_k, "rewrite": nearest_rewrite}


def timed(fn, arg, repeats=3):
    arg = jax.block_until_ready(fn(arg))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        arg = jax.block_until_ready(fn(arg))
        times.append(time.perf_counter() - t)
    return min(times), arg


def main():
    p = argparse.ArgumentParser()
    p.add_argument("agents", type=int, choices=[110, 1000])
    p.add_argument("games", type=int)
    p.add_argument("steps", type=int)
    p.add_argument("--nearest", nargs="+", default=list(NEAREST), choices=list(NEAREST))
    p.add_argument("--updates", nargs="*", default=["4x4:fp32", "1x1:fp32", "4x4:bf16", "1x1:bf16"])
    a = p.parse_args()
    sizes = [] if a.agents == 110 else ["--env-args", "num_taggers=100,num_runners=900,grid_length=60.0,"
                                        "episode_length=500,use_full_observation=false,num_other_agents_observed=10,"
                                        "num_acceleration_levels=20,num_turn_levels=20,max_acceleration=0.1,"
                                        "min_acceleration=-0.1,max_turn=2.356,min_turn=-2.356,max_speed=1.0,"
                                        "tag_reward_for_tagger=10.0,tag_penalty_for_runner=-10.0,"
                                        "end_of_game_reward_for_runner=1.0,tagging_distance=0.02"]
    base = config_lib.from_args(["--config", "tag-continuous", *sizes])
    base = dataclasses.replace(base, num_envs=a.games, num_steps=a.steps)
    row0 = {"card": jax.devices()[0].device_kind, "agents": a.agents, "games": a.games, "steps": a.steps}
    for name in a.nearest:
        tag.TagContinuous._nearest = NEAREST[name]
        env, env_params = envs.make(base.env, base.env_args)
        agent_steps = a.games * a.steps * env.num_agents

        @jax.jit
        def env_only(key):
            keys = jax.random.split(key, a.games)
            _, st = jax.vmap(env.reset, (0, None))(keys, env_params)

            def one(st, k):
                act = jax.random.randint(k, (a.games, env.num_agents), 0, env.num_actions)
                o, st, r, *_ = jax.vmap(env.step, (0, 0, 0, None))(jax.random.split(k, a.games), st, act, env_params)
                return st, r.sum() + o.sum()
            return jax.random.fold_in(key, jax.lax.scan(one, st, jax.random.split(key, a.steps))[1].sum().astype(jnp.int32))

        s, _ = timed(env_only, jax.random.PRNGKey(0))
        print(json.dumps({**row0, "nearest": name, "part": "env only", "s": round(s, 4),
                          "agent_steps_per_s": agent_steps / s}), flush=True)
        for spec in a.updates:
            shape, precision = spec.split(":")
            epochs, minibatches = map(int, shape.split("x"))
            cfg = config_lib.validate(dataclasses.replace(base, update_epochs=epochs, num_minibatches=minibatches,
                                                          precision=precision))
            par = parallel.setup("pmap", 1)
            trainer = chunks.Trainer(plan_lib.on_devices(cfg, par))
            state = trainer.init_state()
            chunk = trainer.chunk_fn(1, state)
            s, _ = timed(lambda st: chunk(st)[0], state)
            print(json.dumps({**row0, "nearest": name, "part": f"update {spec}", "s": round(s, 4),
                              "agent_steps_per_s": agent_steps / s}), flush=True)


if __name__ == "__main__":
    main()
