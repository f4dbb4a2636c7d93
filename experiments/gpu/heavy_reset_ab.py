"""Env steps/s of a batch of environments with gymnax's reset in every step (vmap of its
`step`) and with `heavy_reset` (envs/vec.step_resetting_ended: only the ended environments
reset), same keys, same random actions; says whether both gave the same rewards (they can
differ by the rounding of two differently compiled programs: Craftax's world generation is
sensitive to it, tests/test_heavy_reset.py checks the exact case).

    python experiments/gpu/heavy_reset_ab.py craftax:Craftax-Classic-Symbolic-v1 xminigrid:MiniGrid-EmptyRandom-8x8 --envs 1024
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp

from jaxrl_mgpu import envs
from jaxrl_mgpu.envs import vec


def rollout_fn(env, params, num_envs: int, steps: int):
    ids = jnp.arange(num_envs)
    actions = env.action_space(params).n

    def rollout(key):
        batch = vec.reset(env, params, key, ids)

        def one(batch, t):
            step_key = jax.random.fold_in(key, t)
            batch, out = vec.step(env, params, batch, jax.random.randint(step_key, (num_envs,), 0, actions),
                                  vec.env_keys(step_key, ids))
            return batch, (out.reward, out.done_length > 0)
        return jax.lax.scan(one, batch, jnp.arange(steps))[1]
    return jax.jit(rollout)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("names", nargs="+")
    p.add_argument("--envs", type=int, default=1024)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    for name in args.names:
        env, params = envs.make(name)
        results = {}
        for heavy in (False, True):
            type(env).heavy_reset = heavy  # the class attribute vec.step reads
            fn = rollout_fn(env, params, args.envs, args.steps)
            t = time.perf_counter()
            out = jax.block_until_ready(fn(jax.random.PRNGKey(0)))
            compile_s = time.perf_counter() - t
            t = time.perf_counter()
            for r in range(args.repeats):
                out = fn(jax.random.PRNGKey(r + 1))
            jax.block_until_ready(out)
            rate = args.envs * args.steps * args.repeats / (time.perf_counter() - t)
            results[heavy] = out
            print(json.dumps({"env": name, "heavy_reset": heavy, "envs": args.envs, "env_steps_per_s": round(rate),
                              "first_call_s": round(compile_s, 1), "ended_per_step": float(out[1].sum(1).mean()),
                              "device": jax.devices()[0].device_kind}), flush=True)
        same = bool((results[False][0] == results[True][0]).all())
        print(json.dumps({"env": name, "same_rewards": same}), flush=True)


if __name__ == "__main__":
    main()
